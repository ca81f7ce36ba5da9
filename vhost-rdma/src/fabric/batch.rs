//! A sender's batch ([`Batch`]): the time its port read, the frames it
//! staged per receive queue and the wake-ups it owes them; what one sent
//! frame becomes for a receiver ([`Adapted`]); and what the switch did with
//! a frame ([`Ingress`]).

use super::RxQueue;
use crate::frame::Frame;
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering::*};
use std::time::Instant;

/// What a receiver gets for one sent frame: usually the frame itself, or
/// the segments of a TSO frame it cannot take whole.
#[derive(Debug)]
pub enum Adapted {
    One(Frame),
    Many(Vec<Frame>),
}

impl Adapted {
    /// How many frames.
    pub fn len(&self) -> usize {
        match self {
            Adapted::One(_) => 1,
            Adapted::Many(v) => v.len(),
        }
    }

    /// Whether there is none (an empty segment list).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The frames, mutably (to stamp the hash report).
    pub fn frames_mut(&mut self) -> &mut [Frame] {
        match self {
            Adapted::One(f) => std::slice::from_mut(f),
            Adapted::Many(v) => v,
        }
    }

    /// Returns the buffers to the pool (the frames were dropped).
    pub(super) fn recycle(self) {
        match self {
            Adapted::One(f) => crate::buffers::give(f.data),
            Adapted::Many(v) => v.into_iter().for_each(|f| crate::buffers::give(f.data)),
        }
    }
}

/// Frames a [`Batch`] stages for one receive queue before it pushes them
/// under one lock: enough that the lock and the shared count cost little
/// per frame, few enough that the receiver is not kept waiting long (and
/// that the drop bound's allowance per sender, see [`RxQueue`], stays small).
pub const STAGE_FRAMES: usize = 32;

/// Staging lists most kept per thread for its next batches.
const SPARE_LISTS: usize = 16;

thread_local! {
    /// Staging lists of this thread's ended batches: a TX worker makes a
    /// batch per pass, and its lists would otherwise be allocated anew each
    /// time.
    static SPARE: RefCell<Vec<Vec<Adapted>>> = const { RefCell::new(Vec::new()) };
}

/// An empty staging list, with room for [`STAGE_FRAMES`] frames.
fn spare_list() -> Vec<Adapted> {
    SPARE
        .try_with(|s| s.borrow_mut().pop())
        .ok()
        .flatten()
        .unwrap_or_else(|| Vec::with_capacity(STAGE_FRAMES))
}

/// Keeps an emptied staging list for the thread's next batch (a bounded
/// number of them; the rest are freed).
fn keep_list(mut list: Vec<Adapted>) {
    if list.capacity() == 0 {
        return;
    }
    list.clear();
    let _ = SPARE.try_with(move |s| {
        let mut s = s.borrow_mut();
        if s.len() < SPARE_LISTS {
            s.push(list);
        }
    });
}

/// What a batch holds for one receive queue it sent to.
#[derive(Debug)]
struct Staged<'a> {
    q: &'a RxQueue,
    /// The receiving port's: staged frames for a guest that left meanwhile
    /// are not pushed (they would wait for its next connection).
    connected: &'a AtomicBool,
    /// Frames sent after the batch's first one for the queue, in order, not
    /// pushed yet (each item a sent frame: its segments go all or none).
    items: Vec<Adapted>,
    /// How many frames `items` holds.
    frames: usize,
    /// The queue was woken in this batch (at the first frame queued).
    woken: bool,
    /// Frames were queued in this batch (at once or by a push of staged
    /// ones): the flush must wake the queue even if it pushes nothing more.
    queued: bool,
}

impl Staged<'_> {
    /// Pushes the staged frames (at `now`); returns how many were queued.
    fn push(&mut self, now: Instant) -> usize {
        self.frames = 0;
        if self.connected.load(Relaxed) {
            let n = self.q.push_staged(&mut self.items, now);
            self.queued |= n > 0;
            n
        } else {
            self.items.drain(..).for_each(Adapted::recycle);
            0
        }
    }
}

/// One batch of frames a port hands the fabric (a TX pass): the time the
/// port read, which the fabric and its stages use (they read no clock), and
/// the receive queues the batch went to, woken once when the batch ends (or
/// before its sender pauses) rather than once per frame: a burst of 64
/// frames costs the receiving worker one wake-up.
///
/// The batch also pushes to each receive queue once per [`STAGE_FRAMES`]
/// frames rather than once per frame: its first frame for a queue is pushed
/// (and the queue woken) at once, so that the receiver starts while the
/// rest is copied (a TCP stream's latency); later ones are staged here, in
/// order, and pushed under one lock when [`STAGE_FRAMES`] are staged, at
/// [`flush`](Self::flush) and when the batch is dropped. With the fabric's
/// early wake off (one CPU, [`Fabric::set_early_wake`]) the first frame is
/// staged too and the queue is woken only by the flush. Congestion checks
/// count the staged frames ([`congested`](Self::congested)).
#[derive(Debug)]
pub struct Batch<'a> {
    now: Instant,
    /// The queues the batch sent to since it was last flushed are the first
    /// `live`; those after are spare (flushed, their lists kept for reuse).
    staged: Vec<Staged<'a>>,
    live: usize,
}

impl<'a> Batch<'a> {
    /// A batch handed over at `now`.
    pub fn new(now: Instant) -> Self {
        Batch {
            now,
            staged: Vec::new(),
            live: 0,
        }
    }

    /// The batch's time.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// Frames this batch has staged for `q` and not pushed yet.
    pub fn staged(&self, q: &RxQueue) -> usize {
        self.staged[..self.live]
            .iter()
            .find(|s| std::ptr::eq(s.q, q))
            .map_or(0, |s| s.frames)
    }

    /// Whether the batch's sender should wait for `q` (see
    /// [`RxQueue::congested`]), counting the frames it has staged for `q`
    /// as queued.
    pub fn congested(&self, q: &RxQueue) -> bool {
        q.congested_with(self.staged(q), self.now)
    }

    /// Queues the frames one sent frame became for `q`, whose port's
    /// connection flag is `connected`: the batch's first for `q` at once,
    /// later ones staged. Returns how many frames were queued or staged
    /// (a staged frame the push later drops is counted in `rx_drops` then).
    pub(super) fn queue(
        &mut self,
        q: &'a RxQueue,
        connected: &'a AtomicBool,
        frames: Adapted,
        early_wake: bool,
    ) -> usize {
        let n = frames.len();
        if n == 0 {
            return 0;
        }
        let now = self.now;
        let Some(s) = self.staged[..self.live]
            .iter()
            .position(|s| std::ptr::eq(s.q, q))
            .and_then(|i| self.staged.get_mut(i))
        else {
            if early_wake {
                // The batch's first frame for this receiver wakes it at
                // once, so it starts while the rest is copied (a TCP
                // stream's latency); the rest are covered by one more wake
                // when the batch ends.
                let queued = q.push_quiet(frames, self.now);
                if queued > 0 {
                    q.notify();
                }
                self.open(q, connected, queued > 0);
                return queued;
            }
            // One CPU: the receiver could not run beside us anyway; staged
            // like the rest, woken when the batch ends.
            self.open(q, connected, false);
            return self.queue(q, connected, frames, false);
        };
        if s.items.capacity() == 0 {
            s.items = spare_list();
        }
        s.items.push(frames);
        s.frames += n;
        if s.frames >= STAGE_FRAMES && s.push(now) > 0 && !s.woken && early_wake {
            s.q.notify();
            s.woken = true;
        }
        n
    }

    /// Starts staging for `q` (a spare entry if there is one).
    fn open(&mut self, q: &'a RxQueue, connected: &'a AtomicBool, woken: bool) {
        match self.staged.get_mut(self.live) {
            Some(s) => {
                s.q = q;
                s.connected = connected;
                s.frames = 0;
                s.woken = woken;
                s.queued = woken;
            }
            None => self.staged.push(Staged {
                q,
                connected,
                items: Vec::new(),
                frames: 0,
                woken,
                queued: woken,
            }),
        }
        self.live += 1;
    }

    /// Pushes every staged frame and wakes every queue the batch queued to.
    /// A sender calls this before it pauses: the receiver must drain what
    /// it sent.
    pub fn flush(&mut self) {
        let now = self.now;
        for s in &mut self.staged[..self.live] {
            s.push(now);
            // (`notify` costs nothing when a wake is already on its way.)
            if s.queued {
                s.q.notify();
            }
        }
        self.live = 0;
    }
}

impl Drop for Batch<'_> {
    fn drop(&mut self) {
        self.flush();
        for s in self.staged.drain(..) {
            keep_list(s.items);
        }
    }
}

/// What [`Fabric::ingress`] did with a frame.
#[derive(Debug)]
pub enum Ingress<'a> {
    /// Switched: this many copies were queued or staged in the batch.
    Forwarded(usize),
    /// Its receiver is full but alive: the frame comes back untouched (no
    /// stage saw it), for the sender to pause on the queue.
    Congested(&'a RxQueue, Frame),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::testing::*;

    /// One sender's frames reach the receiver in the order sent, across
    /// the pushes at the staging bound and a flush in the middle (a pause).
    #[test]
    fn staged_frames_keep_their_order() {
        let f = a_and_b(1024);
        let q = &f.ports[1].rx_queues()[0];
        let sent: Vec<Frame> = (0..100).map(to_b).collect();
        let mut b = Batch::new(Instant::now());
        for (t, fr) in sent.iter().cloned().enumerate() {
            if t == 50 {
                b.flush();
                assert_eq!((q.len(), b.staged(q)), (50, 0));
            }
            assert!(
                matches!(f.ingress(0, fr, &mut b), Ingress::Forwarded(1)),
                "frame {t}"
            );
        }
        // After the flush: the first at once, then 32 at a time; 17 staged.
        assert_eq!((q.len(), b.staged(q)), (83, 17));
        b.flush();
        assert_eq!(at_b(&f), sent);
    }

    /// A sender pauses exactly at the limit though most of its frames are
    /// still staged (the queue alone looks far from full), and loses none:
    /// with no headroom at all, a frame past the limit would be dropped.
    #[test]
    fn back_pressure_counts_staged_frames() {
        let f = a_and_b(40);
        let q = &f.ports[1].rx_queues()[0];
        q.set_headroom(0);
        let mut b = Batch::new(Instant::now());
        let mut paused_at = None;
        for t in 0..100 {
            match f.ingress(0, to_b(t), &mut b) {
                Ingress::Forwarded(n) => assert_eq!(n, 1, "frame {t}"),
                Ingress::Congested(c, fr) => {
                    assert!(std::ptr::eq(c, q));
                    assert!(b.congested(c));
                    crate::buffers::give(fr.data);
                    paused_at = Some(t);
                    break;
                }
            }
        }
        assert_eq!(paused_at, Some(40));
        // The first frame and one push of 32; 7 staged.
        assert_eq!((q.len(), b.staged(q)), (33, 7));
        assert!(!q.congested(b.now()));
        b.flush();
        assert_eq!(q.len(), 40);
        assert!(q.congested(b.now()));
        assert_eq!(q.counters.snapshot().rx_drops, 0);
        assert_eq!(at_b(&f), (0..40).map(to_b).collect::<Vec<_>>());
    }

    /// Without the early wake (one CPU), nothing is pushed and no one is
    /// woken until the batch ends (or 32 frames are staged: pushed, still
    /// not woken); then everything arrives in order with one wake.
    #[test]
    fn without_early_wake_the_receiver_is_woken_once_at_the_end() {
        let f = a_and_b(1024);
        f.set_early_wake(false);
        let q = &f.ports[1].rx_queues()[0];
        let mut b = Batch::new(Instant::now());
        send_a_to_b(&f, &mut b, 0..10);
        assert_eq!((q.len(), b.staged(q)), (0, 10));
        send_a_to_b(&f, &mut b, 10..40);
        assert_eq!((q.len(), b.staged(q)), (32, 8));
        assert!(q.wake.read().is_err(), "woken before the batch ended");
        b.flush();
        assert_eq!(q.wake.read().ok(), Some(1));
        assert_eq!(at_b(&f), (0..40).map(to_b).collect::<Vec<_>>());
        // A pass of exactly 64: both pushes at the bound, nothing left
        // staged at the end, and still one wake.
        q.disarm();
        let mut b = Batch::new(Instant::now());
        send_a_to_b(&f, &mut b, 0..64);
        assert_eq!((q.len(), b.staged(q)), (64, 0));
        assert!(q.wake.read().is_err(), "woken before the batch ended");
        drop(b);
        assert_eq!(q.wake.read().ok(), Some(1), "not woken for a pass of 64");
        assert_eq!(at_b(&f).len(), 64);
    }

    /// A batch dropped without a flush pushes what it staged.
    #[test]
    fn a_dropped_batch_delivers_its_staged_frames() {
        let f = a_and_b(1024);
        let q = &f.ports[1].rx_queues()[0];
        {
            let mut b = Batch::new(Instant::now());
            send_a_to_b(&f, &mut b, 0..10);
            assert_eq!((q.len(), b.staged(q)), (1, 9), "staged, not pushed yet");
        }
        assert_eq!(at_b(&f), (0..10).map(to_b).collect::<Vec<_>>());
        assert_eq!(q.counters.snapshot().rx_drops, 0);
    }
}

//! The receive queue of one queue pair of a port ([`RxQueue`]): the frames
//! waiting for its RX buffers, its two bounds (back-pressure and drops), its
//! wake-up of the port's worker, the senders paused on it, and its
//! stuck-guest watch.

use super::batch::Adapted;
use crate::config::STUCK_GUEST_MS;
use crate::frame::{ms_at, Frame};
use crate::stats::{QueueCounters, StuckGuest};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// A receiver whose frames have waited this long for an RX buffer counts as
/// stalled: senders stop waiting for it and drop instead.
pub const STALL_MS: u64 = 500;

/// What waits for one queue pair's RX buffers.
#[derive(Debug, Default)]
struct Pending {
    frames: VecDeque<Frame>,
}

/// Frames waiting for RX buffers of one queue pair of a port.
///
/// A sender pushes here once per batch per queue, not once per frame: its
/// [`Batch`] pushes its first frame for the queue at once and stages the
/// rest, pushed [`STAGE_FRAMES`] at a time under one lock and one count
/// update (the lock and the count are cache lines shared with the receiving
/// worker on another core: taken per frame, their atomics cost about 9% of
/// the daemon's CPU at 1.3 M frames/s).
///
/// Two bounds: senders that honour back-pressure pause at `limit`
/// (`rx-queue-frames`), counting what they have staged for the queue;
/// frames are dropped only past `hard_limit`, which adds, for every thread
/// that may have checked for room just before another took it (each port's
/// TX workers, virtual hosts, the fault timer), what it may hold unseen by
/// the others: the frames it has staged, up to [`STAGE_FRAMES`] (and no
/// more than `limit`). A slow receiver that keeps reading therefore never
/// loses a frame, and memory stays bounded.
#[derive(Debug)]
pub struct RxQueue {
    pending: Mutex<Pending>,
    /// Frames the worker took and may still put back (one, or a batch);
    /// only the worker changes it.
    in_hand: AtomicUsize,
    /// Frames queued plus those in the worker's hand: what senders' checks
    /// read, without the lock. Frames in the hand count as queued: without
    /// them a sender that checks between the take and the put-back sees
    /// room that is not there, and its frame is dropped. One counter, so a
    /// frame moving between queue and hand never makes room appear.
    occupied: AtomicUsize,
    limit: usize,
    hard_limit: AtomicUsize,
    /// Wakes the port's worker thread for this queue pair.
    pub wake: EventFd,
    wake_armed: AtomicBool,
    /// The guest enabled this RX vring (set by the worker).
    pub enabled: AtomicBool,
    pub counters: QueueCounters,
    /// Since when (`frame::ms_at`) frames wait here with no RX buffer; 0 = not.
    starved_since_ms: AtomicU64,
    /// `counters.rx_drops` when the wait began (the stuck report's count).
    starved_drops: AtomicU64,
    /// A wait of `stuck_ms` or more: reported stuck (logged once).
    stuck_reported: AtomicBool,
    /// Times this queue's guest was reported stuck.
    stuck_reports: AtomicU64,
    /// `[limits] stuck-guest-ms`.
    stuck_ms: AtomicU64,
    /// The port's name and this queue pair's number, for the stuck report.
    port: Arc<str>,
    qp: usize,
    queues: usize,
    /// Senders paused because this queue was full (back-pressure), woken
    /// when it drains to half.
    waiters: Mutex<Vec<Arc<EventFd>>>,
}

impl RxQueue {
    /// Queue pair `qp` of `queues` of port `port`, pausing senders at `limit`.
    pub(super) fn new(limit: usize, port: &str, qp: usize, queues: usize) -> std::io::Result<Self> {
        Ok(RxQueue {
            pending: Mutex::new(Pending::default()),
            in_hand: AtomicUsize::new(0),
            occupied: AtomicUsize::new(0),
            limit,
            hard_limit: AtomicUsize::new(limit),
            wake: EventFd::new(EFD_NONBLOCK)?,
            wake_armed: AtomicBool::new(false),
            enabled: AtomicBool::new(false),
            counters: QueueCounters::default(),
            starved_since_ms: AtomicU64::new(0),
            starved_drops: AtomicU64::new(0),
            stuck_reported: AtomicBool::new(false),
            stuck_reports: AtomicU64::new(0),
            stuck_ms: AtomicU64::new(STUCK_GUEST_MS),
            port: port.into(),
            qp,
            queues,
            waiters: Mutex::new(Vec::new()),
        })
    }

    /// The bound at which senders pause (`rx-queue-frames`).
    pub(super) fn limit(&self) -> usize {
        self.limit
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets the drop bound to `limit + headroom` (see the type's doc).
    pub(super) fn set_headroom(&self, headroom: usize) {
        self.hard_limit
            .store(self.limit.saturating_add(headroom), Relaxed);
    }

    fn occupancy(&self) -> usize {
        self.occupied.load(Acquire)
    }

    /// `n` frames left for good (delivered, dropped, cleared).
    fn gone(&self, n: usize) {
        if n > 0 {
            // Saturating: a reset (`clear`) racing with the worker must not
            // wrap the count into "full forever".
            let _ = self
                .occupied
                .fetch_update(AcqRel, Acquire, |o| Some(o.saturating_sub(n)));
        }
    }

    /// Queues the frames one sent frame became (segments of a TSO frame go
    /// together: all or none); drops them (counted) when the queue is past its
    /// drop bound. Returns how many were queued. The worker is not woken:
    /// the caller does, once per batch ([`Batch`]).
    /// A drop is the moment a stuck guest is noticed ([`watch`](Self::watch), at `now`).
    pub(super) fn push_quiet(&self, frames: Adapted, now: Instant) -> usize {
        let n = frames.len();
        let mut p = self.lock();
        if self.occupancy() >= self.hard_limit.load(Relaxed) {
            drop(p);
            QueueCounters::add(&self.counters.rx_drops, n as u64);
            frames.recycle();
            self.watch(now);
            return 0;
        }
        match frames {
            Adapted::One(f) => p.frames.push_back(f),
            Adapted::Many(v) => p.frames.extend(v),
        }
        self.occupied.fetch_add(n, AcqRel);
        n
    }

    /// Queues a sender's staged frames, in order, with one lock and one
    /// count update; leaves `items` empty (its capacity kept for the next
    /// ones). Each item is treated as [`push_quiet`](Self::push_quiet)
    /// would: queued whole while the queue is short of its drop bound, else
    /// dropped whole (a TSO frame's segments, all or none) and counted.
    /// Returns how many frames were queued; the worker is not woken. A drop
    /// looks for a stuck guest at `now`, as in `push_quiet`.
    pub(super) fn push_staged(&self, items: &mut Vec<Adapted>, now: Instant) -> usize {
        if items.is_empty() {
            return 0;
        }
        let hard = self.hard_limit.load(Relaxed);
        let mut p = self.lock();
        // Only this push adds while the lock is held (the worker may take
        // some away meanwhile: then this count is high, never low), so once
        // an item finds no room none after it does: the frames queued are a
        // prefix.
        let mut occupied = self.occupancy();
        let fit = items
            .iter()
            .take_while(|a| {
                let room = occupied < hard;
                occupied = occupied.saturating_add(a.len());
                room
            })
            .count();
        let mut queued = 0;
        for a in items.drain(..fit) {
            queued += a.len();
            match a {
                Adapted::One(f) => p.frames.push_back(f),
                Adapted::Many(v) => p.frames.extend(v),
            }
        }
        // Under the lock, as in `push_quiet`: the worker must not count
        // these frames gone before they were counted in.
        self.occupied.fetch_add(queued, AcqRel);
        drop(p);
        if !items.is_empty() {
            let dropped: usize = items.iter().map(Adapted::len).sum();
            QueueCounters::add(&self.counters.rx_drops, dropped as u64);
            items.drain(..).for_each(Adapted::recycle);
            self.watch(now);
        }
        queued
    }

    /// Wakes the worker unless a wake is already on its way.
    pub fn notify(&self) {
        if !self.wake_armed.swap(true, AcqRel) {
            let _ = self.wake.write(1);
        }
    }

    /// Called by the worker before draining, so that a later push wakes it again.
    pub fn disarm(&self) {
        let _ = self.wake.read();
        self.wake_armed.store(false, Release);
    }

    /// Takes the next frame (the worker's; only its worker calls this). The
    /// frame counts as queued until the worker's next `pop` or `unpop`.
    pub fn pop(&self) -> Option<Frame> {
        let mut p = self.lock();
        let f = p.frames.pop_front();
        // The frame popped before this one was delivered.
        let before = self.in_hand.swap(usize::from(f.is_some()), Relaxed);
        self.gone(before);
        f
    }

    /// Takes up to `max` frames into `hand` with one lock (the worker's;
    /// `hand` must be empty). They count as queued until the worker's
    /// [`put_back`](Self::put_back) at the end of its pass (or its next take).
    pub fn take_batch(&self, hand: &mut VecDeque<Frame>, max: usize) {
        let mut p = self.lock();
        let n = p.frames.len().min(max);
        hand.extend(p.frames.drain(..n));
        let before = self.in_hand.swap(n, Relaxed);
        self.gone(before);
    }

    /// The worker returns the frames of its batch it could not deliver;
    /// they go first next time.
    pub fn put_back(&self, hand: &mut VecDeque<Frame>) {
        // Frames of the hand neither delivered nor put back were dropped by
        // the pass (counted there).
        let held = self.in_hand.swap(0, Relaxed);
        if hand.len() > held {
            // A reset cleared the count of the hand meanwhile.
            self.occupied.fetch_add(hand.len() - held, AcqRel);
        } else {
            self.gone(held - hand.len());
        }
        if hand.is_empty() {
            return;
        }
        let mut p = self.lock();
        while let Some(f) = hand.pop_back() {
            p.frames.push_front(f);
        }
    }

    /// Whether a sender should wait for this queue instead of dropping: it is
    /// full, and its guest has not been out of RX buffers for longer than
    /// [`STALL_MS`] (a guest that stopped reading only loses its own frames).
    pub fn congested(&self, now: Instant) -> bool {
        self.congested_with(0, now)
    }

    /// [`congested`](Self::congested) for a sender that has `staged` frames
    /// for this queue not pushed yet: they count as queued, so that the
    /// sender pauses at the limit as if it had pushed each frame at once.
    pub(super) fn congested_with(&self, staged: usize, now: Instant) -> bool {
        if self.occupancy().saturating_add(staged) < self.limit {
            return false;
        }
        let since = self.starved_since_ms.load(Relaxed);
        since == 0 || ms_at(now).saturating_sub(since) < STALL_MS
    }

    /// The worker found frames pending but no RX buffer (at `now`): the
    /// wait begins, or, if it began `[limits] stuck-guest-ms` ago or more,
    /// the guest is reported stuck ([`watch`](Self::watch)).
    pub fn mark_starved(&self, now: Instant) {
        // Only the queue's worker marks starved and fed: no race between them.
        if self.starved_since_ms.load(Relaxed) == 0 {
            self.starved_drops
                .store(self.counters.rx_drops.load(Relaxed), Relaxed);
            self.starved_since_ms.store(ms_at(now).max(1), Relaxed);
        } else {
            self.watch(now);
        }
    }

    /// The worker delivered a frame: the guest is reading. Ends a stuck
    /// report (logged once).
    pub fn mark_fed(&self) {
        self.starved_since_ms.store(0, Relaxed);
        if self.stuck_reported.load(Relaxed) && self.stuck_reported.swap(false, AcqRel) {
            tracing::warn!(
                port = %self.port,
                qp = self.qp,
                "guest on port {} takes frames again; {} dropped while it did not",
                self.port,
                self.stuck_dropped()
            );
        }
    }

    /// Drops since the current wait began.
    fn stuck_dropped(&self) -> u64 {
        self.counters
            .rx_drops
            .load(Relaxed)
            .saturating_sub(self.starved_drops.load(Relaxed))
    }

    /// Sets `[limits] stuck-guest-ms` (the fabric does, from its limits).
    pub(crate) fn set_stuck_ms(&self, ms: u64) {
        self.stuck_ms.store(ms.max(1), Relaxed);
    }

    /// The guest's stall at `now` (a time in `frame::ms_at` milliseconds),
    /// if frames have waited for RX buffers for `[limits] stuck-guest-ms`
    /// or more. Reads only.
    pub fn stuck_at(&self, now_ms: u64) -> Option<StuckGuest> {
        let since = self.starved_since_ms.load(Relaxed);
        if since == 0 {
            return None;
        }
        let for_ms = now_ms.saturating_sub(since);
        (for_ms >= self.stuck_ms.load(Relaxed)).then(|| StuckGuest {
            queue: self.qp,
            for_ms,
            dropped: self.stuck_dropped(),
        })
    }

    /// [`stuck_at`](Self::stuck_at) `now`, reporting a new stall once in
    /// the log (a warning). Called on the events that show one: a drop, a
    /// worker's pass that found no buffer, a status request.
    pub fn watch(&self, now: Instant) -> Option<StuckGuest> {
        let s = self.stuck_at(ms_at(now))?;
        if !self.stuck_reported.load(Relaxed) && !self.stuck_reported.swap(true, AcqRel) {
            self.stuck_reports.fetch_add(1, Relaxed);
            tracing::warn!(
                port = %self.port,
                qp = self.qp,
                "{} (no RX buffer posted; [limits] stuck-guest-ms = {})",
                s.describe(&self.port, self.queues),
                self.stuck_ms.load(Relaxed)
            );
        }
        Some(s)
    }

    /// Times this queue's guest was reported stuck.
    pub fn stuck_reports(&self) -> u64 {
        self.stuck_reports.load(Relaxed)
    }

    /// Registers a paused sender's resume eventfd.
    pub fn add_waiter(&self, w: &Arc<EventFd>) {
        let mut ws = self.waiters.lock().unwrap_or_else(|e| e.into_inner());
        if !ws.iter().any(|x| Arc::ptr_eq(x, w)) {
            ws.push(w.clone());
        }
    }

    /// Wakes paused senders once the queue has drained to half (called by the
    /// worker after a batch).
    pub fn wake_waiters(&self) {
        if self.occupancy() > self.limit / 2 {
            return;
        }
        let ws = std::mem::take(&mut *self.waiters.lock().unwrap_or_else(|e| e.into_inner()));
        for w in ws {
            let _ = w.write(1);
        }
    }

    /// The worker puts back the frame it popped, which found no RX buffer.
    pub fn unpop(&self, f: Frame) {
        let mut p = self.lock();
        p.frames.push_front(f);
        self.in_hand.store(0, Relaxed);
    }

    /// Takes over a frame another queue pair's worker could not deliver (its
    /// ring was disabled): it goes first, whatever the bound.
    pub fn take_over(&self, f: Frame) {
        let mut p = self.lock();
        p.frames.push_front(f);
        self.occupied.fetch_add(1, AcqRel);
    }

    /// Drops everything pending (guest gone); returns how many. A stuck
    /// report ends with it (silently: the disconnection is logged).
    pub fn clear(&self) -> usize {
        self.starved_since_ms.store(0, Relaxed);
        self.stuck_reported.store(false, Relaxed);
        let mut p = self.lock();
        let n = p.frames.len();
        p.frames.clear();
        let held = self.in_hand.swap(0, Relaxed);
        self.gone(n + held);
        n
    }

    /// Frames waiting (not counting one in the worker's hand).
    pub fn len(&self) -> usize {
        self.lock().frames.len()
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::testing::frame;

    /// The race behind a lost frame: the worker pops the head of a full
    /// queue, finds no RX buffer and puts it back. In between the queue
    /// looked one short of full, a sender saw room, did not pause, and its
    /// frame was dropped once the head was back. A frame in the worker's hand
    /// now counts as queued.
    #[test]
    fn a_frame_in_the_workers_hand_still_counts() {
        let q = RxQueue::new(4, "t", 0, 1).unwrap();
        for t in 0..4 {
            assert_eq!(q.push_quiet(Adapted::One(frame(t)), Instant::now()), 1);
        }
        assert!(q.congested(Instant::now()));
        let head = q.pop().unwrap();
        assert!(
            q.congested(Instant::now()),
            "a popped frame left room that is not there"
        );
        q.unpop(head);
        assert!(q.congested(Instant::now()));
        // Delivered (the next pop): now there is room.
        let _delivered = q.pop();
        let _next = q.pop();
        assert_eq!(q.len(), 2);
        assert!(!q.congested(Instant::now()));
    }

    /// Senders that checked for room just before another filled the queue
    /// get their frame in (headroom); past it frames drop, counted; the
    /// segments of one frame go all or none.
    #[test]
    fn headroom_for_racing_senders_then_counted_drops() {
        let q = RxQueue::new(4, "t", 0, 1).unwrap();
        q.set_headroom(2);
        for t in 0..6 {
            assert_eq!(
                q.push_quiet(Adapted::One(frame(t)), Instant::now()),
                1,
                "frame {t}"
            );
        }
        assert_eq!(q.push_quiet(Adapted::One(frame(6)), Instant::now()), 0);
        assert_eq!(q.counters.snapshot().rx_drops, 1);
        while q.pop().is_some() {}
        let segments: Vec<Frame> = (0..10).map(frame).collect();
        assert_eq!(
            q.push_quiet(Adapted::Many(segments), Instant::now()),
            10,
            "segments of one frame go together"
        );
        assert_eq!(
            q.push_quiet(Adapted::Many(vec![frame(11), frame(12)]), Instant::now()),
            0
        );
        assert_eq!(q.counters.snapshot().rx_drops, 3);
    }

    /// The stuck-guest watch, with the time as an input: not before the
    /// threshold, then with the drops since the wait began, reported once,
    /// cleared when the guest takes a frame, and never for a queue whose
    /// frames find buffers.
    #[test]
    fn a_stuck_guest_is_watched_by_time_given() {
        let q = RxQueue::new(4, "p1", 0, 1).unwrap();
        q.set_stuck_ms(30_000);
        let t0 = Instant::now();
        let at = |ms: u64| t0 + std::time::Duration::from_millis(ms);
        let base = ms_at(t0).max(1);
        assert_eq!(q.stuck_at(base + 60_000), None, "nothing waits");
        QueueCounters::add(&q.counters.rx_drops, 5); // before the wait: not its
        q.mark_starved(t0);
        assert_eq!(q.stuck_at(base + 29_999), None);
        QueueCounters::add(&q.counters.rx_drops, 74_519);
        q.mark_starved(at(10_000)); // the wait goes on from t0
        let s = q.stuck_at(base + 30_000).expect("stuck at the threshold");
        assert_eq!((s.queue, s.for_ms, s.dropped), (0, 30_000, 74_519));
        assert_eq!(
            s.describe("p1", 1),
            "guest on port p1 has taken no frames for 30 s; 74519 dropped"
        );
        assert_eq!(
            StuckGuest {
                queue: 2,
                for_ms: 250,
                dropped: 0
            }
            .describe("p1", 4),
            "guest on port p1 has taken no frames on queue 2 for 250 ms; 0 dropped"
        );
        assert_eq!(q.stuck_reports(), 0, "stuck_at only reads");
        assert!(q.watch(at(29_000)).is_none());
        assert_eq!(q.stuck_reports(), 0);
        // Drops and worker passes past the threshold: one report.
        assert!(q.push_quiet(Adapted::One(frame(1)), at(31_000)) == 1);
        q.mark_starved(at(32_000));
        assert!(q.watch(at(33_000)).is_some());
        assert_eq!(q.stuck_reports(), 1);
        q.mark_fed();
        assert_eq!(q.stuck_at(base + 90_000), None, "cleared");
        // A second stall is a second report; a disconnection ends it.
        q.mark_starved(at(100_000));
        assert!(q.watch(at(130_000)).is_some());
        assert_eq!(q.stuck_reports(), 2);
        q.clear();
        assert!(q.watch(at(200_000)).is_none());
    }

    /// A staged push takes, in order, what fits below the drop bound
    /// (checked before each sent frame, as one push each would) and drops
    /// the rest, counted; a TSO frame's segments go all or none.
    #[test]
    fn a_staged_push_keeps_order_and_drops_what_does_not_fit() {
        let q = RxQueue::new(4, "t", 0, 1).unwrap();
        assert_eq!(q.push_quiet(Adapted::One(frame(0)), Instant::now()), 1);
        let mut items = vec![
            Adapted::One(frame(1)),
            Adapted::One(frame(2)),
            Adapted::Many(vec![frame(3), frame(4)]),
            Adapted::One(frame(5)),
            Adapted::Many(vec![frame(6), frame(7)]),
        ];
        assert_eq!(q.push_staged(&mut items, Instant::now()), 4);
        assert!(items.is_empty());
        assert_eq!(q.counters.snapshot().rx_drops, 3);
        let got: Vec<Frame> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(got, (0..5).map(frame).collect::<Vec<_>>());
    }
}

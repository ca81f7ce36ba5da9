//! The fabric: an L2 learning switch between ports, with a bounded pending
//! queue per destination queue pair. It knows nothing of virtio rings or
//! port kinds; ports hand it frames and it hands frames to ports' pending
//! queues.
//!
//! Like the engines it reads no clock and starts no thread: a port hands
//! frames in a [`Batch`] carrying the time the port read, the stages
//! (`stages`: capture, checker, faults) get that time, and the fault timer
//! thread passes its own. Its only system calls are the wake-ups it owes a
//! receiving worker at the end of a batch (an eventfd write).

use crate::config::STUCK_GUEST_MS;
use crate::config::{MacAddr, PortConfig};
use crate::frame::ms_at;
use crate::frame::Dir;
pub use crate::frame::{flow_hash, Frame, FrameView, LazyView};
use crate::offload;
use crate::stages::{Passed, Stage};
pub use crate::stats::StuckGuest;
use crate::stats::{LogLimiter, PortStats, QueueCounters};
use crate::virtio_net::{bit, NetHdr};
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Instant;
use virtio_bindings::bindings::virtio_net::*;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use vmm_sys_util::timerfd::TimerFd;

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
    fn new(limit: usize, port: &str, qp: usize, queues: usize) -> std::io::Result<Self> {
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

    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets the drop bound to `limit + headroom` (see the type's doc).
    fn set_headroom(&self, headroom: usize) {
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
    fn push_quiet(&self, frames: Adapted, now: Instant) -> usize {
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
    fn push_staged(&self, items: &mut Vec<Adapted>, now: Instant) -> usize {
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
    fn congested_with(&self, staged: usize, now: Instant) -> bool {
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
    fn recycle(self) {
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
    fn queue(
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

/// Where a frame goes, looked up once per frame.
enum Route {
    /// To one port, to the queue pair steering chose.
    Unicast(usize, crate::steering::Steer),
    /// To every other port.
    Flood,
    /// Back to its own port: nowhere.
    Nowhere,
}

/// Multiplicative hashing of MAC addresses, keyed per process: the MAC
/// table is looked up twice per frame and SipHash showed in profiles; the
/// random key keeps a guest from choosing colliding addresses (the table
/// is also bounded by `[limits] mac-table`).
#[derive(Clone, Copy, Debug)]
pub struct MacHashKey(u64);

impl Default for MacHashKey {
    fn default() -> Self {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u8(0);
        MacHashKey(h.finish() | 1)
    }
}

impl std::hash::BuildHasher for MacHashKey {
    type Hasher = MacHasher;
    fn build_hasher(&self) -> MacHasher {
        MacHasher(self.0)
    }
}

/// The hasher of [`MacHashKey`].
#[derive(Debug)]
pub struct MacHasher(u64);

impl std::hash::Hasher for MacHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn finish(&self) -> u64 {
        // Fold the high half in: the table indexes by the low bits.
        let m = u128::from(self.0) * 0xa076_1d64_78bd_642f;
        (m as u64) ^ ((m >> 64) as u64)
    }
}

type MacTable = HashMap<[u8; 6], usize, MacHashKey>;

/// What the switch needs to know of a port beyond its configuration: each
/// kind of port (`crate::ports`) describes itself with one, so the switch
/// treats every port alike and a new kind needs no change here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortProfile {
    /// The port's `form` in `ctl status` (`pci`, `testdev`, `host`, `gve`,
    /// `erdma`, `vxlan`, `tap`).
    pub form: &'static str,
    /// The fabric learns the source MACs of the port's frames and the IPv4
    /// neighbours its ARP announces. Off for an RDMA function, which sends
    /// with its netdev port's MAC: that port owns the MAC in the table.
    pub learns: bool,
    /// The port's frames to MAC 00:00:00:00:00:00 go to their destination
    /// IPv4's MAC from the neighbour table (an RDMA function whose QP's
    /// address vector has no MAC); unresolved ones are dropped and counted.
    pub zero_mac_by_ip: bool,
    /// The port is attached from the start and for good, with one pending
    /// queue whatever its queue count: behind it is a device model, a
    /// virtual host or a wire that takes frames itself (and steers them to
    /// its own queues), not a guest that connects and sets up rings.
    pub always_attached: bool,
    /// The port is the RDMA function of the port of this name (its guest's
    /// netdev, same MAC): RoCEv2 frames to that port come here.
    pub rdma_function_of: Option<String>,
}

impl Default for PortProfile {
    /// A port like a vhost-user guest's: learned from, attached while a
    /// guest is connected.
    fn default() -> Self {
        PortProfile {
            form: "pci",
            learns: true,
            zero_mac_by_ip: false,
            always_attached: false,
            rdma_function_of: None,
        }
    }
}

/// State of one port shared by the fabric and the port's own threads (a
/// vhost-user backend, a device pump, a host or an uplink); it outlives
/// guest connections.
#[derive(Debug)]
pub struct PortShared {
    pub index: usize,
    pub cfg: PortConfig,
    /// How the switch treats this port (given by its kind).
    pub profile: PortProfile,
    pub connected: AtomicBool,
    pub connections: AtomicU64,
    /// Virtio features acked by the connected guest.
    pub features: AtomicU64,
    /// Queue pairs the guest uses (control queue MQ command; all in the pci form).
    pub active_qps: AtomicU16,
    /// The MAC the guest set through the control queue (test-device form).
    pub mac: Mutex<MacAddr>,
    pub rxq: Vec<RxQueue>,
    pub ctrl_errors: AtomicU64,
    pub log: LogLimiter,
    /// Per queue pair: wakes the TX side after back-pressure.
    pub tx_resume: Vec<Arc<EventFd>>,
    /// Per queue pair: retries a paused TX side in case its receiver stalls.
    pub tx_timer: Vec<Mutex<TimerFd>>,
    /// Times this port's TX paused for a full receiver.
    pub tx_pauses: AtomicU64,
    /// vhost-user connections ended by a refused or malformed request.
    pub protocol_errors: AtomicU64,
    /// Flow rules, RSS and hash reporting (`steering`).
    pub steering: crate::steering::PortSteering,
    /// The port whose profile names this one in `rdma_function_of` (an
    /// erdma function paired with this virtio-net port): RoCEv2 frames to
    /// this port's MAC go there.
    pub rdma_companion: OnceLock<usize>,
    /// The source MAC this port last learned and the MAC table's generation
    /// then, plus one (0: none); `Fabric::learn_from`'s shortcut.
    pub learned: AtomicU64,
}

impl PortShared {
    /// Creates the shared state of a port from its configuration and the
    /// profile its kind gives it.
    pub fn new(index: usize, cfg: PortConfig, profile: PortProfile) -> std::io::Result<Self> {
        // An always-attached port has one pending queue; `cfg.queue_pairs`
        // stays the device's own queue count (its RSS and rules pick among
        // them).
        let qps = if profile.always_attached {
            1
        } else {
            usize::from(cfg.queue_pairs.max(1))
        };
        let rxq: Vec<RxQueue> = (0..qps)
            .map(|q| RxQueue::new(cfg.rx_queue_frames.max(1), &cfg.name, q, qps))
            .collect::<Result<_, _>>()?;
        let tx_resume = (0..qps)
            .map(|_| EventFd::new(EFD_NONBLOCK).map(Arc::new))
            .collect::<Result<_, _>>()?;
        let tx_timer = (0..qps)
            .map(|_| TimerFd::new().map(Mutex::new))
            .collect::<Result<_, _>>()?;
        let steering = crate::steering::PortSteering::new(qps as u16, &cfg.flow_rules)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        if profile.always_attached {
            rxq[0].enabled.store(true, Relaxed);
        }
        Ok(PortShared {
            steering,
            index,
            mac: Mutex::new(cfg.mac),
            active_qps: AtomicU16::new(qps as u16),
            cfg,
            connected: AtomicBool::new(profile.always_attached),
            profile,
            connections: AtomicU64::new(0),
            features: AtomicU64::new(0),
            rxq,
            ctrl_errors: AtomicU64::new(0),
            log: LogLimiter::default(),
            tx_resume,
            tx_timer,
            tx_pauses: AtomicU64::new(0),
            protocol_errors: AtomicU64::new(0),
            rdma_companion: OnceLock::new(),
            learned: AtomicU64::new(0),
        })
    }

    fn has(&self, f: u32) -> bool {
        self.features.load(Relaxed) & bit(f) != 0
    }

    /// The frames a receiver gets for `f`: the frame itself, its offloads
    /// finished in place (checksum) or its TSO segments, as the receiver's
    /// negotiated features require.
    pub fn adapt(&self, mut f: Frame) -> Result<Adapted, offload::OffloadError> {
        let h = f.hdr;
        if h.gso_kind() != VIRTIO_NET_HDR_GSO_NONE as u8 {
            let ok = match u32::from(h.gso_kind()) {
                VIRTIO_NET_HDR_GSO_TCPV4 => self.has(VIRTIO_NET_F_GUEST_TSO4),
                VIRTIO_NET_HDR_GSO_TCPV6 => self.has(VIRTIO_NET_F_GUEST_TSO6),
                _ => false,
            } && (!h.gso_ecn() || self.has(VIRTIO_NET_F_GUEST_ECN))
                && self.has(VIRTIO_NET_F_GUEST_CSUM);
            if ok {
                return Ok(Adapted::One(f));
            }
            let segs = offload::segment_tcp(&f.data, &h)?;
            crate::buffers::give(f.data);
            return Ok(Adapted::Many(
                segs.into_iter()
                    .map(|data| Frame {
                        hdr: NetHdr::default(),
                        data,
                    })
                    .collect(),
            ));
        }
        if h.needs_csum() && !self.has(VIRTIO_NET_F_GUEST_CSUM) {
            offload::finish_csum(&mut f.data, h.csum_start, h.csum_offset)?;
            f.hdr = NetHdr::default();
            return Ok(Adapted::One(f));
        }
        if !self.has(VIRTIO_NET_F_GUEST_CSUM) {
            f.hdr = NetHdr::default();
        }
        Ok(Adapted::One(f))
    }

    /// Chooses the RX queue pair for a frame (`None`: a flow rule drops
    /// it): flow rules, then RSS when the guest configured it, else a flow
    /// hash over the enabled, active queue pairs, so one flow stays on one
    /// queue. Also gives the hash for the RX header.
    pub fn steer(&self, data: &[u8]) -> crate::steering::Steer {
        self.steer_view(&crate::frame::view(data))
    }

    /// [`steer`](Self::steer) for a frame parsed already.
    pub fn steer_view(&self, v: &FrameView) -> crate::steering::Steer {
        let active = usize::from(self.active_qps.load(Relaxed));
        self.steering.steer_view(v, active, |q| {
            self.rxq.get(q).is_some_and(|r| r.enabled.load(Relaxed))
        })
    }

    /// [`steer`](Self::steer), parsing `data` only if steering reads it.
    fn steer_lazy(&self, data: &[u8], v: &LazyView) -> crate::steering::Steer {
        let active = usize::from(self.active_qps.load(Relaxed));
        let enabled = |q: usize| self.rxq.get(q).is_some_and(|r| r.enabled.load(Relaxed));
        if self.steering.reads_frame(active) {
            self.steering.steer_view(v.get(data), active, enabled)
        } else {
            self.steering
                .steer_view(&FrameView::default(), active, enabled)
        }
    }

    /// The port's guest stall at `now`, if any receive queue's frames have
    /// waited `[limits] stuck-guest-ms` or more with no RX buffer (the
    /// longest such wait); a new one is logged once ([`RxQueue::watch`]).
    pub fn stuck(&self, now: Instant) -> Option<StuckGuest> {
        self.rxq
            .iter()
            .filter_map(|q| q.watch(now))
            .max_by_key(|s| s.for_ms)
    }

    /// [`stats`](Self::stats) with the stuck report at `now` ([`stuck`](Self::stuck)).
    pub fn stats_at(&self, now: Instant) -> PortStats {
        let mut s = self.stats();
        s.stuck = self.stuck(now).map(|g| {
            let text = g.describe(&self.cfg.name, self.rxq.len());
            crate::stats::StuckReport { guest: g, text }
        });
        s
    }

    /// Counter snapshot (without the stuck report, which needs the time:
    /// [`stats_at`](Self::stats_at)).
    pub fn stats(&self) -> PortStats {
        let mut s = PortStats {
            name: self.cfg.name.clone(),
            socket: self.cfg.socket.display().to_string(),
            mac: self.mac.lock().map(|m| m.to_string()).unwrap_or_default(),
            form: self.profile.form.into(),
            connected: self.connected.load(Relaxed),
            connections: self.connections.load(Relaxed),
            features: self.features.load(Relaxed),
            queue_pairs: self.cfg.queue_pairs,
            active_queue_pairs: self.active_qps.load(Relaxed),
            ctrl_errors: self.ctrl_errors.load(Relaxed),
            tx_pauses: self.tx_pauses.load(Relaxed),
            protocol_errors: self.protocol_errors.load(Relaxed),
            queues: self.rxq.iter().map(|q| q.counters.snapshot()).collect(),
            stuck_reports: self.rxq.iter().map(RxQueue::stuck_reports).sum(),
            ..Default::default()
        };
        s.sum_queues();
        s
    }
}

/// A request named a port the daemon does not have.
#[derive(Debug, thiserror::Error)]
#[error("no port named {0:?}")]
pub struct NoSuchPort(pub String);

/// The L2 switch.
#[derive(Debug)]
pub struct Fabric {
    pub ports: Vec<Arc<PortShared>>,
    macs: RwLock<MacTable>,
    /// Bumped on every change of `macs` (see `learn_from`).
    macs_gen: AtomicU64,
    /// Source MACs not learned because the table was full.
    pub mac_table_full: AtomicU64,
    /// IPv4 neighbours from ARP: where an erdma function's frames to MAC
    /// zero go (`neighbors`).
    pub neighbors: crate::neighbors::NeighborTable,
    /// erdma frames to MAC zero whose destination IPv4 no ARP announced
    /// (dropped).
    pub rdma_unresolved: AtomicU64,
    /// Control connections refused at `limits.control_connections`.
    pub control_refused: AtomicU64,
    /// Flow rules refused at `limits.flow_rules`.
    pub flow_rules_refused: AtomicU64,
    /// Table bounds (`[limits]`).
    pub limits: crate::config::Limits,
    /// Fault injection rules and link states (`faults`).
    pub faults: crate::faults::Faults,
    /// pcapng capture point (`capture`).
    pub capture: crate::capture::Capture,
    /// Live protocol checker (`checker`), fed at ingress before faults.
    pub checker: crate::checker::FabricChecker,
    /// Whether a batch wakes a receiver at its first frame for it as well
    /// as when it ends: worth it only when the receiver's worker can run
    /// beside the sender. Confined to one CPU (`--cpu-affinity 3`, a 1-CPU
    /// host), the early wake would only preempt the sender and cost a
    /// second wake-up per batch (`set_early_wake`).
    early_wake: AtomicBool,
}

impl Fabric {
    /// A fabric over the given ports, with default [`Limits`](crate::config::Limits).
    pub fn new(ports: Vec<Arc<PortShared>>) -> Self {
        Self::with_limits(ports, crate::config::Limits::default())
    }

    /// Sets whether receivers are woken at a batch's first frame for them
    /// as well as at its end (on by default; the server turns it off when
    /// the process may use one CPU only).
    pub fn set_early_wake(&self, on: bool) {
        self.early_wake.store(on, Relaxed);
    }

    /// A fabric over the given ports with the given table bounds.
    pub fn with_limits(ports: Vec<Arc<PortShared>>, limits: crate::config::Limits) -> Self {
        let faults = crate::faults::Faults::new(ports.iter().map(|p| p.cfg.name.clone()).collect());
        faults.set_max_rules(limits.fault_rules);
        let capture = crate::capture::Capture::default();
        capture.set_max_bytes(limits.capture_max_bytes);
        // Threads that may pass a queue's room check just before another
        // fills it: every TX worker and virtual host, and the fault timer.
        // Each may hold, unseen by the others, the frames its batch staged
        // for the queue: fewer than `STAGE_FRAMES` and the one it checks,
        // and, for one that honours back-pressure, no more than the limit
        // (its check counts them).
        let senders: usize = ports
            .iter()
            .map(|p| usize::from(p.cfg.queue_pairs.max(1)))
            .sum::<usize>()
            + 1;
        for q in ports.iter().flat_map(|p| p.rxq.iter()) {
            q.set_headroom(senders.saturating_mul(STAGE_FRAMES.min(q.limit)));
            q.set_stuck_ms(limits.stuck_guest_ms);
        }
        // An RDMA function and its guest's virtio-net port share a MAC.
        for r in &ports {
            let Some(nd) = r.profile.rdma_function_of.as_deref() else {
                continue;
            };
            if let Some(n) = ports.iter().find(|p| p.cfg.name == nd) {
                let _ = n.rdma_companion.set(r.index);
            }
        }
        Fabric {
            faults,
            capture,
            checker: crate::checker::FabricChecker::default(),
            ports,
            macs: RwLock::new(MacTable::default()),
            macs_gen: AtomicU64::new(0),
            mac_table_full: AtomicU64::new(0),
            neighbors: crate::neighbors::NeighborTable::new(limits.mac_table),
            rdma_unresolved: AtomicU64::new(0),
            control_refused: AtomicU64::new(0),
            flow_rules_refused: AtomicU64::new(0),
            early_wake: AtomicBool::new(true),
            limits,
        }
    }

    /// Starts the thread that releases delayed and reordered frames (the
    /// server does; without it such rules drop what they would hold).
    pub fn start_fault_timer(self: &Arc<Self>) -> std::io::Result<std::thread::JoinHandle<()>> {
        let me = self.clone();
        self.faults.timer_started();
        std::thread::Builder::new()
            .name("fault-timer".into())
            .spawn(move || me.faults.run_timer(|r, now| me.resume(r, now)))
    }

    /// Ends the fault timer thread.
    pub fn stop_fault_timer(&self) {
        self.faults.stop_timer();
    }

    /// A frame a fault rule held comes back.
    fn resume(&self, r: crate::faults::Released, now: Instant) {
        let (port, dir) = (r.port, r.dir);
        let mut wakes = Batch::new(now);
        for f in self.faults.apply_after_at(r, now) {
            let v = LazyView::default();
            match dir {
                Dir::Egress => {
                    self.deliver_now(port, f, &v, None, false, &mut wakes);
                }
                _ => {
                    self.switch(port, f, &v, &mut wakes);
                }
            }
        }
    }

    /// The port named `name`.
    pub fn port_by_name(&self, name: &str) -> Result<&PortShared, NoSuchPort> {
        self.ports
            .iter()
            .find(|p| p.cfg.name == name)
            .map(|p| &**p)
            .ok_or_else(|| NoSuchPort(name.to_string()))
    }

    /// Forgets what was learned on a port (its guest went away).
    pub fn forget_port(&self, port: usize) {
        if let Ok(mut m) = self.macs.write() {
            m.retain(|_, p| *p != port);
            self.macs_gen.fetch_add(1, Release);
        }
    }

    /// Learns `src` on `port`; false when the table is full.
    fn learn(&self, src: [u8; 6], port: usize) -> bool {
        if src[0] & 1 != 0 {
            return false;
        }
        if let Ok(m) = self.macs.read() {
            if m.get(&src) == Some(&port) {
                return true;
            }
        }
        if let Ok(mut m) = self.macs.write() {
            if m.len() >= self.limits.mac_table && !m.contains_key(&src) {
                self.mac_table_full.fetch_add(1, Relaxed);
                if let Some(p) = self.ports.get(port) {
                    crate::guest_warn!(p.log, port = %p.cfg.name,
                        "MAC table full ([limits] mac-table = {}): {} not learned, its frames flood",
                        self.limits.mac_table, crate::config::MacAddr(src));
                }
                return false;
            }
            m.insert(src, port);
            self.macs_gen.fetch_add(1, Release);
        }
        true
    }

    /// The receive queue of port `p` a frame steered by `s` would wait for,
    /// if it is congested (back-pressure) for a sender with batch `b`
    /// (counting the frames `b` has staged for it) at the batch's time.
    fn congested(&self, p: usize, s: &crate::steering::Steer, b: &Batch<'_>) -> Option<&RxQueue> {
        let q = self.ports.get(p)?.rxq.get(s.queue?)?;
        b.congested(q).then_some(q)
    }

    /// Where a frame from `src` goes now (MAC table, an erdma function's
    /// RoCEv2, steering): looked up once and used by both the congestion
    /// check and delivery.
    fn route(&self, src: usize, data: &[u8], v: &LazyView) -> Route {
        let Some(dst) = data.get(0..6) else {
            return Route::Nowhere;
        };
        if dst[0] & 1 != 0 {
            return Route::Flood;
        }
        let mut d = [0u8; 6];
        d.copy_from_slice(dst);
        let known = self.macs.read().ok().and_then(|m| m.get(&d).copied());
        match known.map(|p| self.rdma_target(p, data, v)) {
            None => Route::Flood,
            Some(p) if p == src => Route::Nowhere,
            Some(p) => match self.ports.get(p) {
                Some(port) if port.connected.load(Relaxed) => {
                    Route::Unicast(p, port.steer_lazy(data, v))
                }
                _ => Route::Nowhere,
            },
        }
    }

    /// Switches a frame a port sent on port `src` at `now`, on its own.
    /// Returns how many copies were queued (receivers are woken before
    /// returning).
    pub fn forward(&self, src: usize, frame: Frame, now: Instant) -> usize {
        self.forward_in(src, frame, &mut Batch::new(now))
    }

    /// Switches a frame a port sent on port `src` as one of `batch` (no
    /// back-pressure: for ports that cannot leave a frame where it was).
    /// Returns how many copies were queued or staged in `batch` (see
    /// [`Batch`]); staged ones are pushed, and receivers woken, at the
    /// latest when the batch ends.
    pub fn forward_in<'a>(&'a self, src: usize, frame: Frame, batch: &mut Batch<'a>) -> usize {
        match self.ingress_inner(src, frame, batch, false) {
            Ingress::Forwarded(n) => n,
            Ingress::Congested(..) => 0,
        }
    }

    /// Switches a frame a guest sent on port `src`, as one of a batch:
    /// receivers are recorded and frames staged in `wakes` (the caller
    /// flushes it once per batch, and before it pauses), and a frame whose
    /// receiver is congested, counting what `wakes` staged for it, comes
    /// back untouched.
    pub fn ingress<'a>(&'a self, src: usize, frame: Frame, wakes: &mut Batch<'a>) -> Ingress<'a> {
        self.ingress_inner(src, frame, wakes, true)
    }

    fn ingress_inner<'a>(
        &'a self,
        src: usize,
        mut frame: Frame,
        wakes: &mut Batch<'a>,
        back_pressure: bool,
    ) -> Ingress<'a> {
        if frame.data.len() < 14 {
            return Ingress::Forwarded(0);
        }
        let Some(sp) = self.ports.get(src) else {
            return Ingress::Forwarded(0);
        };
        // delivered by IP when the QP's address vector has no MAC
        if sp.profile.zero_mac_by_ip && !self.neighbors.fill_zero_dmac(&mut frame.data) {
            self.rdma_unresolved.fetch_add(1, Relaxed);
            crate::guest_warn!(sp.log, port = %sp.cfg.name,
                "RDMA frame to MAC 00:00:00:00:00:00 and an IPv4 address no ARP on the fabric announced: dropped");
            return Ingress::Forwarded(0);
        }
        if sp.profile.learns && !self.faults.active() {
            // (With faults on, `switch` learns from what passes them.) An
            // erdma function does not learn: it sends with its netdev's MAC,
            // the netdev port owns the MAC in the table, RoCEv2 goes to the
            // function.
            self.learn_from(src, &frame.data);
        }
        // Parsed at most once, when routing, steering or faults first ask.
        let v = LazyView::default();
        let route = self.route(src, &frame.data, &v);
        if back_pressure {
            if let Route::Unicast(p, s) = &route {
                if let Some(q) = self.congested(*p, s, wakes) {
                    return Ingress::Congested(q, frame);
                }
            }
        }
        if sp.profile.learns {
            self.neighbors.observe(&frame.data);
        }
        match crate::stages::run(
            &self.ingress_stages(),
            src,
            &sp.cfg.name,
            Dir::Ingress,
            wakes.now,
            frame,
            &v,
        ) {
            // No stage took it: as routed above.
            Passed::Same(f) => Ingress::Forwarded(self.send(src, f, &v, route, wakes)),
            // Changed, held, dropped or multiplied (faults): routed afresh.
            Passed::Changed(frames) => Ingress::Forwarded(
                frames
                    .into_iter()
                    .map(|(f, fv)| self.switch(src, f, &LazyView::of(fv), wakes))
                    .sum(),
            ),
        }
    }

    /// The stages at ingress, in order: the capture records what the port
    /// sent, the checker judges it, then faults act.
    fn ingress_stages(&self) -> [&dyn Stage; 3] {
        [&self.capture, &self.checker, &self.faults]
    }

    /// The stages at egress, in order: faults act on what the receiver would
    /// get, the capture records what it gets (faults first: `deliver_now`
    /// skips them for a frame they held and released).
    fn egress_stages(&self) -> [&dyn Stage; 2] {
        [&self.faults, &self.capture]
    }

    /// Where a frame for port `p` goes: its erdma function for RoCEv2, else `p`.
    fn rdma_target(&self, p: usize, data: &[u8], v: &LazyView) -> usize {
        match self.ports.get(p).and_then(|x| x.rdma_companion.get()) {
            Some(&r) if crate::frame::is_rocev2_view(v.get(data)) => r,
            _ => p,
        }
    }

    /// Learns a frame's source MAC on `src`. A port sends from one MAC
    /// nearly always: when the table has not changed since this port last
    /// learned this MAC, the table is not even read.
    fn learn_from(&self, src: usize, data: &[u8]) {
        let mut smac = [0u8; 6];
        smac.copy_from_slice(&data[6..12]);
        let Some(p) = self.ports.get(src) else {
            return;
        };
        if smac[0] & 1 != 0 {
            return; // never learned
        }
        // Read before the table is: a change racing with us leaves a stale
        // generation here, and the next frame looks again.
        let gen = self.macs_gen.load(Acquire) & 0xffff;
        let mut m = [0u8; 8];
        m[..6].copy_from_slice(&smac);
        let tag = (u64::from_be_bytes(m) | gen).wrapping_add(1);
        if p.learned.load(Relaxed) == tag {
            return;
        }
        if self.learn(smac, src) {
            p.learned.store(tag, Relaxed);
        }
    }

    /// Switches a frame past ingress faults (a rule may have changed it, or
    /// held it while the table changed: routed afresh).
    fn switch<'a>(
        &'a self,
        src: usize,
        frame: Frame,
        v: &LazyView,
        wakes: &mut Batch<'a>,
    ) -> usize {
        if frame.data.len() < 14 {
            return 0;
        }
        if self.ports.get(src).is_some_and(|p| p.profile.learns) {
            self.learn_from(src, &frame.data);
        }
        let route = self.route(src, &frame.data, v);
        self.send(src, frame, v, route, wakes)
    }

    fn send<'a>(
        &'a self,
        src: usize,
        frame: Frame,
        v: &LazyView,
        route: Route,
        wakes: &mut Batch<'a>,
    ) -> usize {
        match route {
            Route::Nowhere => {
                crate::buffers::give(frame.data);
                0
            }
            Route::Unicast(p, s) => self.deliver(p, frame, v, Some(s), wakes),
            Route::Flood => {
                // A copy for every other port but the last, which gets the frame.
                let mut n = 0;
                let mut last = None;
                for p in (0..self.ports.len()).filter(|&p| p != src) {
                    if let Some(prev) = last.replace(p) {
                        n += self.deliver(prev, frame.clone(), v, None, wakes);
                    }
                }
                match last {
                    Some(p) => n + self.deliver(p, frame, v, None, wakes),
                    None => n,
                }
            }
        }
    }

    fn deliver<'a>(
        &'a self,
        port: usize,
        frame: Frame,
        v: &LazyView,
        steer: Option<crate::steering::Steer>,
        wakes: &mut Batch<'a>,
    ) -> usize {
        self.deliver_now(port, frame, v, steer, true, wakes)
    }

    /// Queues a frame for a port: chooses its queue (`steer`: the choice
    /// made when the frame was routed; None: now), finishes its offloads for
    /// the receiver, runs the egress stages (faults only if `with_faults`:
    /// not for a frame they held and released) and queues what passes in
    /// `wakes` (at once or staged, see [`Batch`]).
    fn deliver_now<'a>(
        &'a self,
        port: usize,
        frame: Frame,
        v: &LazyView,
        steer: Option<crate::steering::Steer>,
        with_faults: bool,
        wakes: &mut Batch<'a>,
    ) -> usize {
        let Some(dst) = self.ports.get(port) else {
            return 0;
        };
        if !dst.connected.load(Relaxed) {
            return 0;
        }
        let s = steer.unwrap_or_else(|| dst.steer_lazy(&frame.data, v));
        let report = dst.has(VIRTIO_NET_F_HASH_REPORT);
        if with_faults {
            // (A released frame was counted when it first came by.)
            dst.steering.record(&s, report && s.hash_report != 0);
        }
        let Some(r) = s.queue.and_then(|q| dst.rxq.get(q)) else {
            crate::buffers::give(frame.data);
            return 0;
        };
        let mut frames = match dst.adapt(frame) {
            Ok(f) => f,
            Err(e) => {
                // Validated at TX already; this would be our own bug. Count it.
                let q = &dst.rxq[0];
                QueueCounters::add(&q.counters.rx_drops, 1);
                crate::guest_warn!(dst.log, port = %dst.cfg.name, "cannot finish offloads of frame: {e}");
                return 0;
            }
        };
        if report {
            for f in frames.frames_mut() {
                f.hdr.hash_value = s.hash_value;
                f.hdr.hash_report = s.hash_report;
            }
        }
        let all = self.egress_stages();
        // A frame the faults held and released skips them.
        let stages = &all[usize::from(!with_faults)..];
        if stages.iter().any(|s| s.active()) {
            frames = match self.egress(stages, dst, frames, wakes.now) {
                Some(f) => f,
                None => return 0,
            };
        }
        wakes.queue(r, &dst.connected, frames, self.early_wake.load(Relaxed))
    }

    /// Runs a receiver's frames (one, or a TSO frame's segments) through the
    /// egress stages; None when nothing is left.
    fn egress(
        &self,
        stages: &[&dyn Stage],
        dst: &PortShared,
        frames: Adapted,
        now: Instant,
    ) -> Option<Adapted> {
        let list = match frames {
            Adapted::One(f) => vec![f],
            Adapted::Many(v) => v,
        };
        let mut out = Vec::with_capacity(list.len());
        for f in list {
            // The offloads may have changed the frame: parsed afresh if a
            // stage asks.
            let v = LazyView::default();
            match crate::stages::run(stages, dst.index, &dst.cfg.name, Dir::Egress, now, f, &v) {
                Passed::Same(f) => out.push(f),
                Passed::Changed(fs) => out.extend(fs.into_iter().map(|(f, _)| f)),
            }
        }
        match out.len() {
            0 => None,
            1 => out.pop().map(Adapted::One),
            _ => Some(Adapted::Many(out)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(tag: u8) -> Frame {
        Frame {
            hdr: NetHdr::default(),
            data: vec![tag; 64],
        }
    }

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

    const MAC_A: [u8; 6] = [2, 0, 0, 0, 0, 0xa];
    const MAC_B: [u8; 6] = [2, 0, 0, 0, 0, 0xb];

    /// Ports A (0) and B (1), with `limit` frames per receive queue, the
    /// switch knowing B's MAC (A's frames to it are unicast: back-pressure
    /// applies).
    fn a_and_b(limit: usize) -> Fabric {
        let port = |i: usize, name: &str| {
            let mut cfg = PortConfig::new(name, "");
            cfg.rx_queue_frames = limit;
            let p = PortShared::new(i, cfg, PortProfile::default()).unwrap();
            p.connected.store(true, Relaxed);
            p.rxq[0].enabled.store(true, Relaxed);
            Arc::new(p)
        };
        let f = Fabric::new(vec![port(0, "a"), port(1, "b")]);
        assert_eq!(f.forward(1, arp(MAC_B, [10, 0, 0, 2]), Instant::now()), 1);
        assert_eq!(f.ports[0].rxq[0].clear(), 1);
        f
    }

    /// A's frame number `t` to B.
    fn to_b(t: u16) -> Frame {
        udp(MAC_B, MAC_A, [10, 0, 0, 2], 1000 + t)
    }

    /// Sends frames `ts` from A to B in batch `b`; each must be forwarded.
    fn send_a_to_b<'a>(f: &'a Fabric, b: &mut Batch<'a>, ts: std::ops::Range<u16>) {
        for t in ts {
            assert!(
                matches!(f.ingress(0, to_b(t), b), Ingress::Forwarded(1)),
                "frame {t}"
            );
        }
    }

    /// What waits in B's queue, in order.
    fn at_b(f: &Fabric) -> Vec<Frame> {
        std::iter::from_fn(|| f.ports[1].rxq[0].pop()).collect()
    }

    /// One sender's frames reach the receiver in the order sent, across
    /// the pushes at the staging bound and a flush in the middle (a pause).
    #[test]
    fn staged_frames_keep_their_order() {
        let f = a_and_b(1024);
        let q = &f.ports[1].rxq[0];
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
        let q = &f.ports[1].rxq[0];
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
        let q = &f.ports[1].rxq[0];
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
        let q = &f.ports[1].rxq[0];
        {
            let mut b = Batch::new(Instant::now());
            send_a_to_b(&f, &mut b, 0..10);
            assert_eq!((q.len(), b.staged(q)), (1, 9), "staged, not pushed yet");
        }
        assert_eq!(at_b(&f), (0..10).map(to_b).collect::<Vec<_>>());
        assert_eq!(q.counters.snapshot().rx_drops, 0);
    }

    fn arp(mac: [u8; 6], ip: [u8; 4]) -> Frame {
        let mut f = vec![0xff; 6];
        f.extend_from_slice(&mac);
        f.extend_from_slice(&[0x08, 0x06, 0, 1, 8, 0, 6, 4, 0, 1]);
        f.extend_from_slice(&mac);
        f.extend_from_slice(&ip);
        f.extend_from_slice(&[0; 6]);
        f.extend_from_slice(&[10, 0, 0, 9]);
        Frame {
            hdr: NetHdr::default(),
            data: f,
        }
    }

    /// An IPv4 UDP frame to `dport` (4791: RoCEv2).
    fn udp(dst: [u8; 6], src: [u8; 6], dst_ip: [u8; 4], dport: u16) -> Frame {
        let mut f = dst.to_vec();
        f.extend_from_slice(&src);
        f.extend_from_slice(&[0x08, 0x00, 0x45, 0, 0, 36, 0, 0, 0, 0, 64, 17, 0, 0]);
        f.extend_from_slice(&[10, 0, 0, 1]);
        f.extend_from_slice(&dst_ip);
        f.extend_from_slice(&[0x12, 0x34]);
        f.extend_from_slice(&dport.to_be_bytes());
        f.extend_from_slice(&[0, 16, 0, 0]);
        f.extend_from_slice(&[0; 8]);
        Frame {
            hdr: NetHdr::default(),
            data: f,
        }
    }

    /// The switch acts on a port's profile alone, whatever its kind: an
    /// RDMA function is not learned from, RoCEv2 to its netdev port's MAC
    /// goes to it, and its frames to MAC zero go by the neighbour table
    /// (unresolved ones are dropped and counted).
    #[test]
    fn profiles_drive_learning_rdma_pairing_and_mac_zero() {
        let port = |i: usize, name: &str, profile: PortProfile| {
            let p = PortShared::new(i, PortConfig::new(name, ""), profile).unwrap();
            p.connected.store(true, Relaxed);
            p.rxq[0].enabled.store(true, Relaxed);
            Arc::new(p)
        };
        let function = PortProfile {
            form: "rdma",
            learns: false,
            zero_mac_by_ip: true,
            always_attached: true,
            rdma_function_of: Some("vm".into()),
        };
        let f = Fabric::new(vec![
            port(0, "vm", PortProfile::default()),
            port(1, "peer", PortProfile::default()),
            port(2, "fn", function),
        ]);
        let (vm, peer) = ([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
        let queued = |p: usize| f.ports[p].rxq[0].clear();
        assert_eq!(f.forward(0, arp(vm, [10, 0, 0, 1]), Instant::now()), 2);
        assert_eq!(f.forward(1, arp(peer, [10, 0, 0, 2]), Instant::now()), 2);
        for p in 0..3 {
            queued(p);
        }
        // The function sends with its netdev's MAC, which stays the netdev's.
        assert_eq!(
            f.forward(2, udp(peer, vm, [10, 0, 0, 2], 9), Instant::now()),
            1
        );
        assert_eq!(queued(1), 1);
        assert_eq!(
            f.forward(1, udp(vm, peer, [10, 0, 0, 1], 9), Instant::now()),
            1
        );
        assert_eq!((queued(0), queued(2)), (1, 0));
        // RoCEv2 to the netdev's MAC goes to the function.
        assert_eq!(
            f.forward(1, udp(vm, peer, [10, 0, 0, 1], 4791), Instant::now()),
            1
        );
        assert_eq!((queued(0), queued(2)), (0, 1));
        // MAC zero: delivered by destination IPv4, or dropped and counted.
        assert_eq!(
            f.forward(2, udp([0; 6], vm, [10, 0, 0, 2], 4791), Instant::now()),
            1
        );
        assert_eq!(queued(1), 1);
        assert_eq!(
            f.forward(2, udp([0; 6], vm, [10, 0, 0, 7], 4791), Instant::now()),
            0
        );
        assert_eq!(f.rdma_unresolved.load(Relaxed), 1);
        // Another port's frame to MAC zero is switched like any unknown MAC.
        assert_eq!(
            f.forward(1, udp([0; 6], peer, [10, 0, 0, 1], 4791), Instant::now()),
            2
        );
        assert_eq!(f.rdma_unresolved.load(Relaxed), 1);
    }
}

//! The pump of a device port: the thread that hands the frames the fabric
//! queued for the port to the device model, runs the model's timers and
//! ends TX pauses.
//!
//! Each pass reads the clock once and uses that time for everything: the
//! burst, the timers, the starved mark and the next wait. It takes up to
//! [`BURST`] pending frames with one lock and hands them to the device in
//! one burst ([`RxBurst`], under one hold of the device lock), so that the
//! device may coalesce them (gve's HW-GRO) and interrupts and frames it
//! produces go out once.
//!
//! A device receive queue without buffers (`RxRefusal::NoBuffers`) stalls
//! only itself: its frames are held here, per device queue ([`RxHold`]),
//! in order, and offered again first at every pass (at least every
//! [`STARVED_RETRY`] while any are held: the `vfio_user` crate tells of no
//! doorbell); frames for the other queues go on. At most
//! `rx-held-frames` frames are held per queue. A frame past that bound for
//! a queue whose driver is still refilling it (it took a held frame, or
//! began holding, less than [`STALL_MS`] ago) is not taken: the pass stops
//! there and leaves it and the frames behind it in the port's fabric queue,
//! whose bound pauses the senders (`rx-queue-frames`), as for a virtio-net
//! guest slow to post buffers; a lossless switch does not drop TCP segments
//! a guest would take a millisecond later. A queue stalled longer (a devmem
//! application that keeps its buffers) gets its frames past the bound
//! dropped, counted, and the others go on.
//!
//! Every call into the model runs under a panic guard: a panicking model
//! is reset (`PciDevice::reset`), the panic logged (the first one as an
//! error, the rest counted and rate-limited) and counted in `ctl status`,
//! the frames it held dropped, and the pump goes on.

use crate::fabric::{Frame, PortShared, STALL_MS};
use crate::frame::FrameView;
use crate::stats::QueueCounters;
use crate::virtio_net::NetHdr;
use pci_model::RxRefusal;
use std::collections::VecDeque;
use std::os::fd::AsRawFd;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use vfio_user_server::RxBurst;
use virtio_bindings::bindings::virtio_net::VIRTIO_NET_HDR_GSO_NONE;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};

/// How long the pump waits before offering held frames again to a device
/// whose driver had no receive buffer posted for them.
pub const STARVED_RETRY: Duration = Duration::from_millis(1);

/// Pending frames taken and handed to the device per pass.
pub const BURST: usize = 64;

/// Passes in a row that poll a deadline already due without sleeping;
/// then the pump sleeps a millisecond.
const DUE_AT_ONCE: u32 = 8;

/// Device receive queues the pump tells apart; a higher queue number
/// shares the last one's held frames (gve has at most 16 queues here).
pub const MAX_HELD_QUEUES: usize = 256;

/// What the pump needs of a served device.
pub(crate) trait Pumped: Send + Sync {
    /// A burst of frames at `now` under one hold of the device lock.
    fn receive_burst(&self, now: Instant, f: &mut dyn FnMut(&mut dyn RxBurst));
    /// `PciDevice::poll` at `now`.
    fn poll_at(&self, now: Instant);
    /// When the model wants `poll` for its timers (`now`: due at once).
    fn next_deadline(&self, now: Instant) -> Option<Instant>;
    /// `PciDevice::reset` alone (after a panic).
    fn reset(&self);
    /// The sink paused the model's TX.
    fn tx_paused(&self) -> bool;
    /// Ends the TX pause.
    fn resume_tx(&self);
    /// The server was stopped.
    fn is_stopped(&self) -> bool;
}

impl<D: pci_model::PciDevice + Send + 'static> Pumped for vfio_user_server::DeviceHandle<D> {
    fn receive_burst(&self, now: Instant, f: &mut dyn FnMut(&mut dyn RxBurst)) {
        vfio_user_server::DeviceHandle::receive_burst(self, now, f)
    }
    fn poll_at(&self, now: Instant) {
        vfio_user_server::DeviceHandle::poll_at(self, now)
    }
    fn next_deadline(&self, now: Instant) -> Option<Instant> {
        vfio_user_server::DeviceHandle::next_deadline(self, now)
    }
    fn reset(&self) {
        self.reset_device()
    }
    fn tx_paused(&self) -> bool {
        vfio_user_server::DeviceHandle::tx_paused(self)
    }
    fn resume_tx(&self) {
        vfio_user_server::DeviceHandle::resume_tx(self)
    }
    fn is_stopped(&self) -> bool {
        vfio_user_server::DeviceHandle::is_stopped(self)
    }
}

/// The pump's counters, shared with the control socket.
#[derive(Debug, Default)]
pub struct PumpStats {
    /// Frames held now.
    pub held_frames: AtomicU64,
    /// Device queues holding frames now.
    pub held_queues: AtomicU64,
    /// Frames dropped because their queue held `rx-held-frames` already.
    pub held_drops: AtomicU64,
    /// Model panics caught (each reset the device).
    pub panics: AtomicU64,
    /// The last panic: where, and its message.
    pub last_panic: Mutex<Option<String>>,
}

/// `ctl status` of a device port's pump.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PumpStatus {
    /// Frames held now for device receive queues that had no buffer.
    pub held_frames: u64,
    /// Device receive queues holding frames now.
    pub held_queues: u64,
    /// Most frames held per device queue (`rx-held-frames`).
    pub held_limit: u64,
    /// Frames dropped because their queue held that many already.
    pub held_drops: u64,
    /// Panics of the device model the pump caught (the device was reset
    /// each time).
    pub panics: u64,
    /// The last one: where, and its message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_panic: Option<String>,
}

impl PumpStats {
    /// A snapshot; `limit` is the port's `rx-held-frames`.
    pub fn status(&self, limit: usize) -> PumpStatus {
        PumpStatus {
            held_frames: self.held_frames.load(Relaxed),
            held_queues: self.held_queues.load(Relaxed),
            held_limit: limit as u64,
            held_drops: self.held_drops.load(Relaxed),
            panics: self.panics.load(Relaxed),
            last_panic: self
                .last_panic
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        }
    }
}

/// What one pass did with frames.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// Frames the device took.
    pub delivered: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Frames the device refused for good (not ready, dropped by it).
    pub refused: u64,
    /// Frames dropped because their queue held the most it may.
    pub held_drops: u64,
}

/// Frames held for device receive queues that had no buffer, per queue, in
/// order, at most `limit` per queue (sans IO: the pump hands it the device
/// of one burst).
#[derive(Debug)]
pub struct RxHold {
    queues: Vec<VecDeque<Frame>>,
    /// Per queue: when its held frames last moved (the first was held, or
    /// the device took one); `None` while it holds none.
    moved: Vec<Option<Instant>>,
    limit: usize,
    held: usize,
}

impl RxHold {
    /// Holds at most `limit` frames per device queue.
    pub fn new(limit: usize) -> Self {
        RxHold {
            queues: Vec::new(),
            moved: Vec::new(),
            limit,
            held: 0,
        }
    }

    /// Frames held.
    pub fn len(&self) -> usize {
        self.held
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.held == 0
    }

    /// Device queues holding frames.
    pub fn queues_holding(&self) -> usize {
        self.queues.iter().filter(|q| !q.is_empty()).count()
    }

    /// Offers the held frames again at `now`, oldest first per queue; a
    /// queue stops at its first frame still refused for lack of buffers.
    /// A held frame keeps the view it was first offered with: no retry
    /// parses it.
    pub fn retry(&mut self, dev: &mut dyn RxBurst, now: Instant, out: &mut Outcome) {
        for (q, moved) in self.queues.iter_mut().zip(&mut self.moved) {
            while let Some(f) = q.front_mut() {
                let view = f.view();
                match hand_over(dev, f, &view) {
                    Err(RxRefusal::NoBuffers) => break,
                    Err(RxRefusal::Unsegmented) => {
                        // Held whole, now wanted as segments: they take
                        // its place, in order.
                        let Some(f) = q.pop_front() else { break };
                        self.held -= 1;
                        match segments(f) {
                            Some(segs) => {
                                self.held += segs.len();
                                segs.into_iter().rev().for_each(|s| q.push_front(s));
                            }
                            None => out.refused += 1,
                        }
                    }
                    r => {
                        if let Some(f) = q.pop_front() {
                            self.held -= 1;
                            *moved = Some(now);
                            Self::done(r, f, out);
                        }
                    }
                }
            }
            if q.is_empty() {
                *moved = None;
            }
        }
    }

    /// Offers a new frame at `now`: behind its queue's held frames if it
    /// has any, else to the device; a frame refused for lack of buffers is
    /// held. The device gets the frame's view: the fabric's, when it parsed
    /// the frame on its way, else parsed here, once (and kept with the
    /// frame while it is held).
    ///
    /// The fabric leaves a device port that takes them (gve) its frames'
    /// offloads: a checksum left to finish is finished here; a TSO frame is
    /// offered whole ([`RxBurst::receive_tso`]) and, if the device wants
    /// it cut, its segments are offered in its place.
    ///
    /// Back-pressure: a frame its queue has no room to hold, while that
    /// queue's held frames moved less than [`STALL_MS`] ago, is handed back,
    /// not dropped: the caller keeps it (with what follows of a TSO frame's
    /// segments: the returned frames, in order), and the frames after it,
    /// for later. Past that (or with a limit of 0) it is dropped, counted.
    pub fn offer(
        &mut self,
        dev: &mut dyn RxBurst,
        mut f: Frame,
        now: Instant,
        out: &mut Outcome,
    ) -> Vec<Frame> {
        if !is_tso(&f) && f.hdr.needs_csum() {
            let (start, offset) = (f.hdr.csum_start, f.hdr.csum_offset);
            if crate::offload::finish_csum(&mut f.data, start, offset).is_err() {
                out.refused += 1;
                crate::buffers::give(f.data);
                return Vec::new();
            }
            f.hdr = NetHdr::default();
        }
        let view = f.view();
        if self.held > 0 {
            let q = dev.rx_queue(&f.data, &view).min(MAX_HELD_QUEUES - 1);
            if self.queues.get(q).is_some_and(|h| !h.is_empty()) {
                return self.hold(q, f, now, out).into_iter().collect();
            }
        }
        match hand_over(dev, &f, &view) {
            Err(RxRefusal::NoBuffers) => {
                let q = dev.rx_queue(&f.data, &view).min(MAX_HELD_QUEUES - 1);
                self.hold(q, f, now, out).into_iter().collect()
            }
            Err(RxRefusal::Unsegmented) => {
                let Some(segs) = segments(f) else {
                    out.refused += 1;
                    return Vec::new();
                };
                let mut segs = VecDeque::from(segs);
                while let Some(s) = segs.pop_front() {
                    let back = self.offer(dev, s, now, out);
                    if !back.is_empty() {
                        return back.into_iter().chain(segs).collect();
                    }
                }
                Vec::new()
            }
            r => {
                Self::done(r, f, out);
                Vec::new()
            }
        }
    }

    /// Whether queue `q`'s held frames moved less than [`STALL_MS`] before
    /// `now` (its driver is refilling it).
    fn refilling(&self, q: usize, now: Instant) -> bool {
        self.moved
            .get(q)
            .copied()
            .flatten()
            .is_some_and(|t| now.saturating_duration_since(t) < Duration::from_millis(STALL_MS))
    }

    fn hold(&mut self, q: usize, f: Frame, now: Instant, out: &mut Outcome) -> Option<Frame> {
        if self.queues.len() <= q {
            self.queues.resize_with(q + 1, VecDeque::new);
            self.moved.resize(q + 1, None);
        }
        if self.queues[q].len() >= self.limit {
            if self.refilling(q, now) {
                return Some(f);
            }
            out.held_drops += 1;
            crate::buffers::give(f.data);
            return None;
        }
        if self.queues[q].is_empty() {
            self.moved[q] = Some(now);
        }
        self.queues[q].push_back(f);
        self.held += 1;
        None
    }

    fn done(r: Result<(), RxRefusal>, f: Frame, out: &mut Outcome) {
        match r {
            Ok(()) => {
                out.delivered += 1;
                out.bytes += f.data.len() as u64;
            }
            Err(_) => out.refused += 1,
        }
        crate::buffers::give(f.data);
    }

    /// Drops everything held (the device was reset); returns how many.
    pub fn clear(&mut self) -> usize {
        let n = self.held;
        for q in &mut self.queues {
            q.drain(..).for_each(|f| crate::buffers::give(f.data));
        }
        self.moved.iter_mut().for_each(|m| *m = None);
        self.held = 0;
        n
    }
}

/// Whether `f` is a TSO frame (its segments still to cut).
fn is_tso(f: &Frame) -> bool {
    f.hdr.gso_kind() != VIRTIO_NET_HDR_GSO_NONE as u8
}

/// Offers `f` (with its `view`) to the device: a TSO frame whole, as one.
fn hand_over(dev: &mut dyn RxBurst, f: &Frame, view: &FrameView) -> Result<(), RxRefusal> {
    if is_tso(f) {
        dev.receive_tso(&f.data, view, f.hdr.gso_size)
    } else {
        dev.receive(&f.data, view)
    }
}

/// The segments of TSO frame `f` (`None` if it is not a well-formed one:
/// the sender's port validated it, so only a bug gets here).
fn segments(f: Frame) -> Option<Vec<Frame>> {
    let segs = crate::offload::segment_tcp(&f.data, &f.hdr).ok();
    crate::buffers::give(f.data);
    Some(
        segs?
            .into_iter()
            .map(|data| Frame::new(NetHdr::default(), data))
            .collect(),
    )
}

/// Epoll ids.
const WAKE: u64 = 1;
const RESUME: u64 = 2;
const STALL: u64 = 3;

/// The pump of one device port, until `stop` (or the server stops).
pub(crate) struct Pump<'a> {
    port: &'a PortShared,
    dev: &'a dyn Pumped,
    stats: &'a PumpStats,
    hold: RxHold,
    hand: VecDeque<Frame>,
    /// The last pass left frames in the fabric queue for a refilling
    /// device queue that held all it may (back-pressure): the next pass
    /// waits for the retry, not at once.
    backed_up: bool,
}

impl<'a> Pump<'a> {
    pub(crate) fn new(port: &'a PortShared, dev: &'a dyn Pumped, stats: &'a PumpStats) -> Self {
        Pump {
            hold: RxHold::new(port.cfg().rx_held_frames()),
            hand: VecDeque::with_capacity(BURST),
            backed_up: false,
            port,
            dev,
            stats,
        }
    }

    /// Runs until `stop` is set or the server stops.
    pub(crate) fn run(&mut self, stop: &AtomicBool) {
        let name = &self.port.cfg().name;
        let Ok(epoll) = Epoll::new() else {
            tracing::warn!(port = %name, "cannot create epoll: device port stopped");
            return;
        };
        let Some(rxq) = self.port.rx_queues().first() else {
            return;
        };
        let mut fds = vec![(rxq.wake.as_raw_fd(), WAKE)];
        if let Some(r) = self.port.tx_resume().first() {
            fds.push((r.as_raw_fd(), RESUME));
        }
        let timer = self.port.tx_timers().first();
        if let Some(t) = timer {
            fds.push((
                t.lock().unwrap_or_else(|e| e.into_inner()).as_raw_fd(),
                STALL,
            ));
        }
        for (fd, id) in fds {
            if epoll
                .ctl(ControlOperation::Add, fd, EpollEvent::new(EventSet::IN, id))
                .is_err()
            {
                tracing::warn!(port = %name, "cannot watch the pump's events: device port stopped");
                return;
            }
        }
        let mut events = [EpollEvent::default(); 3];
        let mut resume = false;
        let mut due_streak = 0;
        while !stop.load(SeqCst) && !self.dev.is_stopped() {
            // The pass's one clock read.
            let now = Instant::now();
            if resume {
                resume = false;
                self.resume_tx(now);
            }
            self.pass(now);
            // Sleep until frames come, the device's next timer, a TX
            // resume, or (frames held) the next retry; at most a second, to
            // notice a stop. (From the pass's time: up to a pass late.)
            let mut wait = Duration::from_secs(1);
            if !self.hold.is_empty() {
                wait = wait.min(STARVED_RETRY);
            }
            let dev = self.dev;
            if let Some(at) = self
                .guarded("next_deadline", || dev.next_deadline(now))
                .flatten()
            {
                wait = wait.min(at.saturating_duration_since(now));
            }
            let ms = if !rxq.is_empty() && !self.backed_up {
                0 // more than one burst was waiting
            } else {
                // Rounded up: a timer due in 0.4 ms must not make a busy
                // loop. A deadline already due (a model with work left
                // over, gve's TX past its budget) is polled again at once,
                // but at most DUE_AT_ONCE times in a row: a model whose
                // deadline stays in the past must not spin a core.
                let ms = wait.as_micros().div_ceil(1000).min(1000) as i32;
                due_streak = if ms == 0 { due_streak + 1 } else { 0 };
                if due_streak > DUE_AT_ONCE {
                    due_streak = 0;
                    1
                } else {
                    ms
                }
            };
            let n = epoll.wait(ms, &mut events).unwrap_or(0);
            for e in &events[..n] {
                match e.data() {
                    RESUME => {
                        if let Some(r) = self.port.tx_resume().first() {
                            let _ = r.read();
                        }
                        resume = true;
                    }
                    STALL => {
                        if let Some(t) = timer {
                            // Disarm (and consume the expiry) without blocking.
                            let _ = t
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .reset(Duration::ZERO, None);
                        }
                        resume = true;
                    }
                    _ => {}
                }
            }
        }
    }

    /// Ends a TX pause: the receivers drained (or stalled); the model does
    /// the TX work it left.
    fn resume_tx(&mut self, now: Instant) {
        let dev = self.dev;
        if dev.tx_paused() {
            dev.resume_tx();
            self.guarded("poll", || dev.poll_at(now));
        }
    }

    /// One pass at `now`: the held frames and up to [`BURST`] pending ones
    /// in one burst (whose closing poll runs the device's timers), or the
    /// timers alone when there is nothing to hand over.
    fn pass(&mut self, now: Instant) {
        let Some(rxq) = self.port.rx_queues().first() else {
            return;
        };
        rxq.disarm();
        self.backed_up = false;
        rxq.take_batch(&mut self.hand, BURST);
        if self.hand.is_empty() && self.hold.is_empty() {
            rxq.put_back(&mut self.hand);
            // Nothing to hand over: the device's timers alone, if due (a
            // burst's poll runs them otherwise).
            let dev = self.dev;
            let due = self
                .guarded("next_deadline", || dev.next_deadline(now))
                .flatten()
                .is_some_and(|at| at <= now);
            if due {
                self.guarded("poll", || dev.poll_at(now));
            }
            rxq.wake_waiters();
            return;
        }
        let mut out = Outcome::default();
        let offered = (self.hand.len() + self.hold.len()) as u64;
        let (hold, hand, dev) = (&mut self.hold, &mut self.hand, self.dev);
        let mut backed_up = false;
        let r = catch_unwind(AssertUnwindSafe(|| {
            dev.receive_burst(now, &mut |b| {
                hold.retry(b, now, &mut out);
                while let Some(f) = hand.pop_front() {
                    let back = hold.offer(b, f, now, &mut out);
                    if !back.is_empty() {
                        // back-pressure: it and the rest go back, in order
                        back.into_iter().rev().for_each(|f| hand.push_front(f));
                        backed_up = true;
                        break;
                    }
                }
            })
        }));
        self.backed_up = backed_up;
        if let Err(p) = r {
            // The frame the model panicked on, and those of the burst not
            // offered yet, go with the reset (the held ones too, counted
            // by `panicked`).
            let left = (self.hold.len() + self.hand.len()) as u64;
            let done = out.delivered + out.refused + out.held_drops;
            out.refused += offered.saturating_sub(done + left) + self.hand.len() as u64;
            self.hand
                .drain(..)
                .for_each(|f| crate::buffers::give(f.data));
            self.panicked("receive", p);
        }
        rxq.put_back(&mut self.hand);
        // Before this pass's drops are counted: a wait that begins now
        // counts them as its own (the stuck-guest report's `dropped`).
        if out.delivered > 0 {
            rxq.mark_fed();
        } else if !self.hold.is_empty() {
            rxq.mark_starved(now);
        }
        let c = &rxq.counters;
        QueueCounters::add(&c.rx_frames, out.delivered);
        QueueCounters::add(&c.rx_bytes, out.bytes);
        QueueCounters::add(&c.rx_drops, out.refused + out.held_drops);
        self.stats.held_drops.fetch_add(out.held_drops, Relaxed);
        self.stats
            .held_frames
            .store(self.hold.len() as u64, Relaxed);
        self.stats
            .held_queues
            .store(self.hold.queues_holding() as u64, Relaxed);
        rxq.wake_waiters();
    }

    /// Runs one model call under the panic guard; `None` if it panicked
    /// (the device is reset then).
    fn guarded<R>(&mut self, what: &'static str, f: impl FnOnce() -> R) -> Option<R> {
        match catch_unwind(AssertUnwindSafe(f)) {
            Ok(r) => Some(r),
            Err(p) => {
                self.panicked(what, p);
                None
            }
        }
    }

    /// The model panicked in `what`: log it (the first as an error),
    /// count it, reset the device and drop the frames held for it.
    fn panicked(&mut self, what: &'static str, p: Box<dyn std::any::Any + Send>) {
        let msg = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "(no message)".into());
        // The reset is a model call too: a model that panics there as well
        // is left as it is (counted once more). Before the count, so that
        // whoever sees the count sees the device reset.
        let dev = self.dev;
        let reset_panicked = catch_unwind(AssertUnwindSafe(|| dev.reset())).is_err();
        *self
            .stats
            .last_panic
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(format!("{what}: {msg}"));
        let n = self
            .stats
            .panics
            .fetch_add(1 + u64::from(reset_panicked), Relaxed)
            + 1;
        let name = &self.port.cfg().name;
        if n == 1 {
            tracing::error!(port = %name, "device model panicked in {what}: {msg}; device reset, the port goes on (further panics are counted in ctl status)");
        } else {
            crate::guest_warn!(self.port.log(), port = %name, "device model panicked again in {what} ({n} so far): {msg}; device reset");
        }
        let dropped = self.hold.clear();
        if let Some(q) = self.port.rx_queues().first() {
            QueueCounters::add(&q.counters.rx_drops, dropped as u64);
        }
        // What paused TX belonged to the model before its reset.
        self.dev.resume_tx();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device of `queues` queues, each with a number of free buffers;
    /// a frame's queue is its first byte.
    struct Fake {
        buffers: Vec<usize>,
        got: Vec<(usize, u8)>,
    }

    impl RxBurst for Fake {
        fn receive(&mut self, frame: &[u8], _: &pci_model::ParsedFrame) -> Result<(), RxRefusal> {
            let q = usize::from(frame[0]);
            match self.buffers.get_mut(q) {
                None => Err(RxRefusal::Dropped),
                Some(0) => Err(RxRefusal::NoBuffers),
                Some(n) => {
                    *n -= 1;
                    self.got.push((q, frame[1]));
                    Ok(())
                }
            }
        }
        fn receive_tso(
            &mut self,
            _: &[u8],
            _: &pci_model::ParsedFrame,
            _: u16,
        ) -> Result<(), RxRefusal> {
            Err(RxRefusal::Unsegmented)
        }
        fn rx_queue(&self, frame: &[u8], _view: &pci_model::ParsedFrame) -> usize {
            usize::from(frame[0])
        }
    }

    /// A one-queue device with `buffers` free buffers that takes TSO frames
    /// whole when `whole`, and keeps every frame it took.
    struct Tso {
        buffers: usize,
        whole: bool,
        got: Vec<Vec<u8>>,
    }

    impl Tso {
        fn take(&mut self, frame: &[u8]) -> Result<(), RxRefusal> {
            if self.buffers == 0 {
                return Err(RxRefusal::NoBuffers);
            }
            self.buffers -= 1;
            self.got.push(frame.to_vec());
            Ok(())
        }
    }

    impl RxBurst for Tso {
        fn receive(&mut self, frame: &[u8], _: &pci_model::ParsedFrame) -> Result<(), RxRefusal> {
            self.take(frame)
        }
        fn receive_tso(
            &mut self,
            frame: &[u8],
            _: &pci_model::ParsedFrame,
            _: u16,
        ) -> Result<(), RxRefusal> {
            if !self.whole {
                return Err(RxRefusal::Unsegmented);
            }
            self.take(frame)
        }
        fn rx_queue(&self, _: &[u8], _: &pci_model::ParsedFrame) -> usize {
            0
        }
    }

    /// Ethernet + IPv4 + TCP with `payload` bytes, as a virtio-net guest
    /// hands over a TSO frame of `mss`-byte segments (checksum left to
    /// finish).
    fn tso_frame(payload: usize, mss: u16) -> Frame {
        let mut d = vec![0u8; 14 + 20 + 20 + payload];
        d[12] = 0x08;
        d[14] = 0x45;
        d[16..18].copy_from_slice(&((40 + payload) as u16).to_be_bytes());
        d[22] = 64;
        d[23] = 6;
        d[26..34].copy_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
        d[38..42].copy_from_slice(&1000u32.to_be_bytes());
        d[46] = 5 << 4;
        d[47] = 0x10;
        let hdr = NetHdr {
            flags: virtio_bindings::bindings::virtio_net::VIRTIO_NET_HDR_F_NEEDS_CSUM as u8,
            gso_type: virtio_bindings::bindings::virtio_net::VIRTIO_NET_HDR_GSO_TCPV4 as u8,
            hdr_len: 54,
            gso_size: mss,
            csum_start: 34,
            csum_offset: 16,
            ..Default::default()
        };
        Frame::new(hdr, d)
    }

    /// The TCP sequence numbers of frames.
    fn seqs(frames: &[Vec<u8>]) -> Vec<u32> {
        frames
            .iter()
            .map(|f| u32::from_be_bytes([f[38], f[39], f[40], f[41]]))
            .collect()
    }

    /// A TSO frame goes to the device whole when it takes it so; else its
    /// segments go in its place, in order, each held or handed back like
    /// any frame; a TSO frame held whole and then wanted cut is replaced
    /// by its segments in the queue. A checksum left to finish is finished
    /// before the device sees the frame.
    #[test]
    fn tso_frames_go_whole_or_as_their_segments_in_order() {
        let t0 = Instant::now();
        let mut out = Outcome::default();
        let mut dev = Tso {
            buffers: 10,
            whole: true,
            got: vec![],
        };
        let mut hold = RxHold::new(8);
        assert!(hold
            .offer(&mut dev, tso_frame(300, 100), t0, &mut out)
            .is_empty());
        assert_eq!(dev.got.len(), 1, "whole");
        assert_eq!(dev.got[0].len(), 354);
        // Cut: two segments fit, the third waits for a buffer.
        let mut dev = Tso {
            buffers: 2,
            whole: false,
            got: vec![],
        };
        assert!(hold
            .offer(&mut dev, tso_frame(300, 100), t0, &mut out)
            .is_empty());
        assert_eq!(seqs(&dev.got), [1000, 1100]);
        assert_eq!(hold.len(), 1);
        dev.buffers = 5;
        hold.retry(&mut dev, t0, &mut out);
        assert_eq!(seqs(&dev.got), [1000, 1100, 1200]);
        assert!(dev.got.iter().all(|s| s.len() == 154));
        // Held whole (no buffers), then cut at the retry.
        let mut dev = Tso {
            buffers: 0,
            whole: true,
            got: vec![],
        };
        assert!(hold
            .offer(&mut dev, tso_frame(250, 100), t0, &mut out)
            .is_empty());
        assert_eq!(hold.len(), 1);
        (dev.buffers, dev.whole) = (1, false);
        hold.retry(&mut dev, t0, &mut out);
        assert_eq!(seqs(&dev.got), [1000]);
        assert_eq!(hold.len(), 2, "the other two segments held in its place");
        dev.buffers = 5;
        hold.retry(&mut dev, t0, &mut out);
        assert_eq!(seqs(&dev.got), [1000, 1100, 1200]);
        assert_eq!(dev.got[2].len(), 104);
        assert!(hold.is_empty());
        // A frame with its checksum to finish (not TSO).
        let mut plain = tso_frame(40, 100);
        plain.hdr.gso_type = 0;
        let mut want = plain.data.clone();
        crate::offload::finish_csum(&mut want, 34, 16).unwrap();
        assert_ne!(want, plain.data);
        dev.got.clear();
        assert!(hold.offer(&mut dev, plain, t0, &mut out).is_empty());
        assert_eq!(dev.got, [want]);
    }

    fn f(q: u8, tag: u8) -> Frame {
        Frame::new(Default::default(), vec![q, tag])
    }

    /// Past the refill window: a queue's held frames moved longer ago
    /// than [`STALL_MS`].
    fn stale(t: Instant) -> Instant {
        t + Duration::from_millis(STALL_MS)
    }

    /// A frame the device refused for lack of buffers is held with the
    /// view it was offered with: its retries parse it no more.
    #[test]
    fn a_held_frame_keeps_its_view() {
        let mut dev = Fake {
            buffers: vec![0],
            got: Vec::new(),
        };
        let mut h = RxHold::new(4);
        let mut out = Outcome::default();
        let t0 = Instant::now();
        assert!(h.offer(&mut dev, f(0, 1), t0, &mut out).is_empty());
        assert_eq!(h.len(), 1);
        assert!(h.queues[0][0].view.is_some());
    }

    /// Queue 1 has no buffers: its frames are held, in order, at most the
    /// limit (once it has not moved for STALL_MS, the rest dropped,
    /// counted); queue 0's frames all go through. Buffers come back: the
    /// held ones go first, then the new ones.
    #[test]
    fn a_queue_without_buffers_holds_only_its_frames() {
        let mut dev = Fake {
            buffers: vec![100, 0],
            got: vec![],
        };
        let mut hold = RxHold::new(4);
        let mut out = Outcome::default();
        let t0 = Instant::now();
        for t in 0..10 {
            let now = if t < 4 { t0 } else { stale(t0) };
            assert!(hold.offer(&mut dev, f(0, t), now, &mut out).is_empty());
            assert!(hold.offer(&mut dev, f(1, t), now, &mut out).is_empty());
            assert!(hold.len() <= 4, "held past the bound");
        }
        assert_eq!(dev.got, (0..10).map(|t| (0, t)).collect::<Vec<_>>());
        assert_eq!((hold.len(), hold.queues_holding()), (4, 1));
        assert_eq!(
            out,
            Outcome {
                delivered: 10,
                bytes: 20,
                refused: 0,
                held_drops: 6
            }
        );
        // A retry with still no buffers changes nothing.
        dev.got.clear();
        hold.retry(&mut dev, t0, &mut out);
        assert!(dev.got.is_empty());
        // Three buffers: the three oldest held frames go; a new frame for
        // queue 1 waits behind the fourth, one for queue 0 passes.
        dev.buffers[1] = 3;
        hold.retry(&mut dev, t0, &mut out);
        assert!(hold.offer(&mut dev, f(1, 50), t0, &mut out).is_empty());
        assert!(hold.offer(&mut dev, f(0, 51), t0, &mut out).is_empty());
        assert_eq!(dev.got, [(1, 0), (1, 1), (1, 2), (0, 51)]);
        assert_eq!(hold.len(), 2);
        // Enough buffers: the rest in order.
        dev.buffers[1] = 10;
        dev.got.clear();
        hold.retry(&mut dev, t0, &mut out);
        assert!(hold.offer(&mut dev, f(1, 52), t0, &mut out).is_empty());
        assert_eq!(dev.got, [(1, 3), (1, 50), (1, 52)]);
        assert!(hold.is_empty());
        assert_eq!(hold.queues_holding(), 0);
    }

    /// A frame for a queue with held frames never overtakes them, even
    /// when the device would take it (a smaller frame fitting the buffers
    /// left); frames the device drops are counted, not held.
    #[test]
    fn order_per_queue_and_refusals() {
        let mut dev = Fake {
            buffers: vec![0, 5],
            got: vec![],
        };
        let mut hold = RxHold::new(8);
        let mut out = Outcome::default();
        let t0 = Instant::now();
        assert!(hold.offer(&mut dev, f(0, 1), t0, &mut out).is_empty());
        dev.buffers[0] = 1; // room appears before the next frame
        assert!(hold.offer(&mut dev, f(0, 2), t0, &mut out).is_empty());
        assert!(dev.got.is_empty(), "frame 2 overtook frame 1");
        assert!(hold.offer(&mut dev, f(9, 3), t0, &mut out).is_empty());
        assert_eq!((out.refused, hold.len()), (1, 2));
        hold.retry(&mut dev, t0, &mut out);
        assert_eq!(dev.got, [(0, 1)]);
        assert_eq!(hold.clear(), 1);
        assert!(hold.is_empty());
    }

    /// A queue that holds all it may while its driver refills it (its held
    /// frames moved less than STALL_MS ago) hands a new frame back instead
    /// of dropping it; once it has not moved for STALL_MS, the frame is
    /// dropped. With a limit of 0 nothing is held and every such frame
    /// dropped at once.
    #[test]
    fn a_full_queue_still_refilling_pushes_back() {
        let mut dev = Fake {
            buffers: vec![0],
            got: vec![],
        };
        let mut hold = RxHold::new(2);
        let mut out = Outcome::default();
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        for t in 0..2 {
            assert!(hold.offer(&mut dev, f(0, t), t0, &mut out).is_empty());
        }
        let back = hold.offer(&mut dev, f(0, 2), t0 + ms(STALL_MS - 1), &mut out);
        let back: Vec<u8> = back.iter().map(|f| f.data[1]).collect();
        assert_eq!(back, [2], "not handed back");
        assert_eq!((out.held_drops, hold.len()), (0, 2));
        // The driver posts a buffer at t1: a held frame moves, and the
        // window starts again from there.
        dev.buffers[0] = 1;
        let t1 = t0 + ms(400);
        hold.retry(&mut dev, t1, &mut out);
        assert_eq!(dev.got, [(0, 0)]);
        assert!(hold.offer(&mut dev, f(0, 2), t1, &mut out).is_empty());
        assert_eq!(hold.len(), 2);
        assert!(!hold
            .offer(&mut dev, f(0, 3), t1 + ms(STALL_MS - 1), &mut out)
            .is_empty());
        assert_eq!(out.held_drops, 0);
        // Stalled: dropped, counted.
        assert!(hold
            .offer(&mut dev, f(0, 3), stale(t1), &mut out)
            .is_empty());
        assert_eq!((out.held_drops, hold.len()), (1, 2));
        // Emptied, then held again: a fresh window.
        dev.buffers[0] = 2;
        hold.retry(&mut dev, stale(t1), &mut out);
        assert!(hold.is_empty());
        let t2 = stale(stale(t1));
        for t in 4..6 {
            assert!(hold.offer(&mut dev, f(0, t), t2, &mut out).is_empty());
        }
        assert!(!hold.offer(&mut dev, f(0, 6), t2, &mut out).is_empty());
        // A limit of 0: dropped at once.
        let mut none = RxHold::new(0);
        assert!(none.offer(&mut dev, f(0, 9), t0, &mut out).is_empty());
        assert_eq!(out.held_drops, 2);
        assert!(none.is_empty());
    }

    /// The pump itself, on a vfio-user device handle (no client) whose
    /// model is a test double, beside a peer port.
    mod with_a_device {
        use super::super::*;
        use crate::fabric::{Fabric, PortProfile, PortShared};
        use crate::ports::device::sink::DeviceSink;
        use crate::ports::PortDriver;
        use pci_model::{BarInfo, DeviceIo, MsixInfo, PciDevice, PciIdentity};
        use std::sync::atomic::AtomicBool;
        use std::sync::{Arc, Mutex, MutexGuard};
        use std::thread::JoinHandle;
        use vfio_user_server::{DeviceHandle, Limits, VfioUserServer};

        const PEER: [u8; 6] = [2, 0, 0, 0, 0, 0x10];
        const DEV: [u8; 6] = [2, 0, 0, 0, 0, 0x20];
        /// A frame whose third payload byte is this makes `receive` panic.
        const BOOM: u8 = 0xee;

        #[derive(Default)]
        struct State {
            /// Queues with no buffer posted.
            starved: [bool; 4],
            /// (queue, tag) of the frames taken, in order.
            got: Vec<(usize, u8)>,
            resets: u32,
            /// `next_timeout` says now; `poll` panics then if `poll_panics`.
            timer: bool,
            poll_panics: bool,
            /// Frames the driver queued for TX; each poll sends up to 8 (and
            /// asks for another poll while some are left).
            tx_pending: u8,
            tx_sent: u8,
            /// Polls that found TX paused with frames waiting.
            saw_pause: u32,
            /// The last poll was paused.
            paused: bool,
        }

        /// The test double: a frame's queue is its first payload byte, its
        /// tag the second.
        struct Double(Arc<Mutex<State>>);

        impl Double {
            fn s(&self) -> MutexGuard<'_, State> {
                self.0.lock().unwrap_or_else(|e| e.into_inner())
            }
        }

        impl PciDevice for Double {
            fn identity(&self) -> PciIdentity {
                PciIdentity {
                    vendor_id: 0x1b36,
                    device_id: 0x00f3,
                    subsystem_vendor_id: 0,
                    subsystem_id: 0,
                    class_code: 0x020000,
                    revision: 0,
                }
            }
            fn bars(&self) -> Vec<BarInfo> {
                crate::ports::device::test_bars()
            }
            fn msix(&self) -> Option<MsixInfo> {
                None
            }
            fn bar_read(&mut self, _: u8, _: u64, d: &mut [u8], _: &mut DeviceIo<'_>) {
                d.fill(0);
            }
            fn bar_write(&mut self, _: u8, _: u64, _: &[u8], _: &mut DeviceIo<'_>) {}
            fn poll(&mut self, io: &mut DeviceIo<'_>) {
                let mut s = self.s();
                if s.timer && s.poll_panics {
                    drop(s);
                    panic!("poll on purpose");
                }
                s.timer = false;
                s.paused = io.tx_paused;
                if io.tx_paused {
                    if s.tx_pending > 0 {
                        s.saw_pause += 1;
                    }
                    return;
                }
                for _ in 0..s.tx_pending.min(8) {
                    let mut f = PEER.to_vec();
                    f.extend_from_slice(&DEV);
                    f.extend_from_slice(&[0x88, 0xb5, 0, s.tx_sent]);
                    io.tx.push(f);
                    s.tx_sent += 1;
                    s.tx_pending -= 1;
                }
            }
            fn receive(
                &mut self,
                f: &[u8],
                _view: &pci_model::ParsedFrame,
                _: &mut DeviceIo<'_>,
            ) -> Result<(), RxRefusal> {
                let (q, tag) = (usize::from(f[14]), f[15]);
                if f[16] == BOOM {
                    panic!("receive on purpose");
                }
                let mut s = self.s();
                if s.starved[q] {
                    return Err(RxRefusal::NoBuffers);
                }
                s.got.push((q, tag));
                Ok(())
            }
            fn rx_queue(&self, f: &[u8], _: &pci_model::ParsedFrame) -> usize {
                usize::from(f[14])
            }
            /// Now, for its timer, or for TX left over by its budget of 8
            /// a poll (not while paused: the pump resumes it).
            fn next_timeout(&self, now: Instant) -> Option<Instant> {
                let s = self.s();
                (s.timer || (s.tx_pending > 0 && !s.paused)).then_some(now)
            }
            fn reset(&mut self) {
                let mut s = self.s();
                s.resets += 1;
                s.timer = false;
            }
        }

        /// A peer port (0) and a device port (1) whose pump runs.
        struct Rig {
            fabric: Arc<Fabric>,
            dev: Arc<PortShared>,
            handle: DeviceHandle<Double>,
            state: Arc<Mutex<State>>,
            stats: Arc<PumpStats>,
            stop: Arc<AtomicBool>,
            pump: Option<JoinHandle<()>>,
        }

        impl Rig {
            fn new(peer_limit: usize, held: usize) -> Rig {
                let mut pc = crate::config::PortConfig::new("peer", "");
                pc.rx_queue_frames = peer_limit;
                let peer = PortShared::new(0, pc, PortProfile::default()).unwrap();
                peer.connect();
                peer.rx_queues()[0].enabled.store(true, SeqCst);
                let dc = crate::config::PortConfig {
                    spec: crate::config::PortSpec::Gve(crate::config::GveSpec {
                        rx_held_frames: held,
                        ..Default::default()
                    }),
                    ..crate::config::PortConfig::new("dev", "")
                };
                let profile = crate::ports::device::DeviceDriver.profile(&dc);
                let dev = Arc::new(PortShared::new(1, dc, profile).unwrap());
                let fabric = Arc::new(Fabric::new(vec![Arc::new(peer), dev.clone()]));
                // A listener nobody connects to: the handle is all we use.
                let path = std::env::temp_dir().join(format!(
                    "vr-pump-{}-{:?}.sock",
                    std::process::id(),
                    std::thread::current().id()
                ));
                let _ = std::fs::remove_file(&path);
                let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
                let _ = std::fs::remove_file(&path);
                let state = Arc::new(Mutex::new(State::default()));
                let sink = DeviceSink {
                    fabric: fabric.clone(),
                    port: dev.clone(),
                };
                let server = VfioUserServer::from_listener_with_sink(
                    listener,
                    Double(state.clone()),
                    sink,
                    Limits::default(),
                )
                .unwrap();
                let handle = server.handle();
                let p = dev.clone();
                handle.on_earlier_deadline(move || {
                    let _ = p.rx_queues()[0].wake.write(1);
                });
                let stats = Arc::new(PumpStats::default());
                let stop = Arc::new(AtomicBool::new(false));
                let (p, h, st, s) = (dev.clone(), handle.clone(), stats.clone(), stop.clone());
                let pump = std::thread::spawn(move || Pump::new(&p, &h, &st).run(&s));
                Rig {
                    fabric,
                    dev,
                    handle,
                    state,
                    stats,
                    stop,
                    pump: Some(pump),
                }
            }

            fn s(&self) -> MutexGuard<'_, State> {
                self.state.lock().unwrap_or_else(|e| e.into_inner())
            }

            /// The peer sends a frame for device queue `q` (broadcast: it
            /// floods to the device port).
            fn send(&self, q: u8, tag: u8, third: u8) {
                let mut f = vec![0xff; 6];
                f.extend_from_slice(&PEER);
                f.extend_from_slice(&[0x88, 0xb5, q, tag, third]);
                f.resize(60, 0);
                let frame = Frame::new(Default::default(), f);
                assert_eq!(self.fabric.forward(0, frame, Instant::now()), 1);
            }

            /// Waits (generously) until `cond` holds.
            fn until(&self, what: &str, cond: impl Fn(&Rig) -> bool) {
                let end = Instant::now() + Duration::from_secs(20);
                while !cond(self) {
                    assert!(Instant::now() < end, "never: {what}");
                    std::thread::sleep(Duration::from_millis(1));
                }
            }

            fn got(&self) -> Vec<(usize, u8)> {
                self.s().got.clone()
            }
        }

        impl Drop for Rig {
            fn drop(&mut self) {
                self.stop.store(true, SeqCst);
                let _ = self.dev.rx_queues()[0].wake.write(1);
                if let Some(t) = self.pump.take() {
                    let _ = t.join();
                }
            }
        }

        /// Issue 24, part 4, point 2: device queue 1 has no buffer; frames
        /// for queue 0 keep flowing, queue 1's wait (at most the bound,
        /// the rest dropped and counted) and go first, in order, once
        /// buffers come.
        #[test]
        fn a_queue_out_of_buffers_stalls_only_itself() {
            let rig = Rig::new(1024, 4);
            rig.s().starved[1] = true;
            for t in 0..10 {
                rig.send(1, t, 0);
                rig.send(0, t, 0);
            }
            rig.until("queue 0's frames through, queue 1's held or dropped", |r| {
                r.got().len() == 10
                    && r.stats.held_frames.load(SeqCst) + r.stats.held_drops.load(SeqCst) == 10
            });
            assert_eq!(rig.got(), (0..10).map(|t| (0, t)).collect::<Vec<_>>());
            assert_eq!(
                rig.stats.held_frames.load(SeqCst),
                4,
                "held beyond the bound"
            );
            assert_eq!(rig.stats.held_queues.load(SeqCst), 1);
            assert_eq!(rig.stats.held_drops.load(SeqCst), 6);
            assert_eq!(rig.dev.rx_queues()[0].counters.snapshot().rx_drops, 6);
            // Buffers posted: the four oldest go (the pump retries by
            // itself), then new frames for queue 1 follow them.
            rig.s().starved[1] = false;
            rig.until("the held frames delivered", |r| r.got().len() == 14);
            rig.send(1, 10, 0);
            rig.until("a new frame for queue 1", |r| r.got().len() == 15);
            let q1: Vec<u8> = rig.got()[10..].iter().map(|&(_, t)| t).collect();
            assert_eq!(q1, [0, 1, 2, 3, 10], "queue 1 out of order");
            assert_eq!(rig.stats.held_frames.load(SeqCst), 0);
        }

        /// A device queue that runs out of buffers for a moment (a guest
        /// slow to refill) loses nothing: past its held bound, the frames
        /// stay in the port's fabric queue (whose bound pauses senders)
        /// and all go, in order, once buffers come.
        #[test]
        fn a_queue_refilled_in_time_loses_nothing() {
            let rig = Rig::new(1024, 4);
            rig.s().starved[1] = true;
            for t in 0..10 {
                rig.send(1, t, 0);
            }
            let q = &rig.dev.rx_queues()[0];
            rig.until("4 held, 6 left in the fabric queue", |r| {
                r.stats.held_frames.load(SeqCst) == 4 && q.len() == 6
            });
            assert_eq!(rig.stats.held_drops.load(SeqCst), 0, "dropped");
            rig.s().starved[1] = false;
            rig.until("all delivered", |r| r.got().len() == 10);
            assert_eq!(rig.got(), (0..10).map(|t| (1, t)).collect::<Vec<_>>());
            assert_eq!(rig.stats.held_drops.load(SeqCst), 0);
            assert_eq!(q.counters.snapshot().rx_drops, 0);
            assert!(q.is_empty());
        }

        /// Issue 25, item 4: a device whose driver posts no receive buffer
        /// while frames wait for it is reported stuck by the pump's own
        /// retries (no status request needed), once, with the frames
        /// dropped meanwhile; the report clears when it takes frames again.
        #[test]
        fn a_device_that_takes_no_frames_is_named() {
            let rig = Rig::new(1024, 4);
            rig.dev.rx_queues()[0].set_stuck_ms(50);
            rig.s().starved[0] = true;
            for t in 0..10 {
                rig.send(0, t, 0);
            }
            rig.until("the stall reported by the pump", |r| {
                r.dev.rx_queues()[0].stuck_reports() == 1
            });
            // Past STALL_MS without a buffer: the frames past the bound go.
            rig.until("the frames past the bound dropped", |r| {
                r.stats.held_drops.load(SeqCst) == 6
            });
            let s = rig.dev.stuck(Instant::now()).expect("stuck");
            assert!(s.for_ms >= 50, "{s:?}");
            assert_eq!(s.dropped, 6, "{s:?}: 4 held, 6 dropped");
            let text = rig
                .dev
                .stats_at(Instant::now())
                .stuck
                .expect("in the status")
                .text;
            assert!(
                text.starts_with("guest on port dev has taken no frames for ")
                    && text.ends_with("; 6 dropped"),
                "{text}"
            );
            std::thread::sleep(Duration::from_millis(20));
            assert_eq!(rig.dev.rx_queues()[0].stuck_reports(), 1, "reported once");
            rig.s().starved[0] = false;
            rig.until("the held frames delivered", |r| r.got().len() == 4);
            rig.until("the report cleared", |r| {
                r.dev.stuck(Instant::now()).is_none()
            });
            assert_eq!(rig.dev.stats().stuck_reports, 1);
        }

        /// Issue 24, part 4, point 4: a model that panics in `receive` or
        /// on its timer is reset, the panic counted (and kept for `ctl
        /// status`), and the pump goes on.
        #[test]
        fn a_panicking_device_is_reset_and_the_port_goes_on() {
            let rig = Rig::new(1024, 4);
            rig.send(0, 1, 0);
            rig.until("a first frame", |r| r.got().len() == 1);
            rig.send(0, 2, BOOM);
            // The pass that panicked is over once the frame is counted.
            rig.until("the panic caught", |r| {
                r.dev.rx_queues()[0].counters.snapshot().rx_drops == 1
            });
            assert_eq!(rig.stats.panics.load(SeqCst), 1);
            assert_eq!(rig.s().resets, 1, "device not reset");
            let c = rig.dev.rx_queues()[0].counters.snapshot();
            assert_eq!(
                (c.rx_frames, c.rx_drops),
                (1, 1),
                "the frame it panicked on"
            );
            let last = rig.stats.status(4).last_panic.unwrap_or_default();
            assert!(last.contains("receive on purpose"), "{last}");
            rig.send(0, 3, 0);
            rig.until("a frame after the panic", |r| r.got().len() == 2);
            // On the timer path: due now, the poll panics.
            {
                let mut s = rig.s();
                s.timer = true;
                s.poll_panics = true;
            }
            rig.dev.rx_queues()[0].notify();
            rig.until("the timer's panic caught", |r| {
                r.stats.panics.load(SeqCst) == 2
            });
            assert_eq!(rig.s().resets, 2);
            assert!(rig
                .stats
                .status(4)
                .last_panic
                .unwrap()
                .contains("poll on purpose"));
            rig.send(0, 4, 0);
            rig.until("a frame after the second panic", |r| r.got().len() == 3);
            assert_eq!(rig.got(), [(0, 1), (0, 3), (0, 4)]);
            assert_eq!(rig.stats.panics.load(SeqCst), 2, "panicked again");
        }

        /// A doorbell whose TX work goes past the model's budget for one
        /// poll: the model asks for another poll at once (`next_timeout`),
        /// which wakes the pump, and the rest goes out with no further
        /// doorbell.
        #[test]
        fn tx_left_past_a_budget_goes_on_without_another_doorbell() {
            let rig = Rig::new(1024, 4);
            rig.send(0, 0, 0);
            rig.until("the peer's first frame", |r| r.got().len() == 1);
            rig.s().tx_pending = 30;
            rig.handle.poll(); // the doorbell, on this thread: 8 frames
            let q = &rig.fabric.ports[0].rx_queues()[0];
            rig.until("the rest sent by the pump", |_| q.len() == 30);
            let got: Vec<u8> = std::iter::from_fn(|| q.pop()).map(|f| f.data[15]).collect();
            assert_eq!(got, (0..30).collect::<Vec<u8>>());
        }

        /// Issue 24, part 4, point 1: a device's frames go into the fabric
        /// a call at a time with the virtio-net ports' back-pressure: a
        /// full receiver pauses the device's TX (counted), the model is
        /// told, and the receiver's drain resumes it; nothing is lost.
        #[test]
        fn device_tx_pauses_on_a_full_receiver_and_resumes_on_its_drain() {
            let rig = Rig::new(16, 4);
            // The switch learns the peer's MAC (its frame floods to the
            // device); the device's frames to it are then unicast.
            rig.send(0, 0, 0);
            rig.until("the peer's first frame", |r| r.got().len() == 1);
            let q = &rig.fabric.ports[0].rx_queues()[0];
            rig.s().tx_pending = 40;
            // Doorbells: 8 frames a poll (the pump polls too, for what is
            // left); the third call finds the peer full. (A call already
            // under way may pause it once more; the stall timer may resume
            // the device after STALL_MS: what follows holds either way.)
            for _ in 0..3 {
                rig.handle.poll();
            }
            assert!(
                rig.dev.stats().tx_pauses >= 1,
                "not paused at a full receiver"
            );
            assert!(q.len() >= 24, "the paused call's frames were not forwarded");
            rig.handle.poll();
            assert!(rig.s().saw_pause >= 1, "the model was not told");
            // Each drain wakes the pump, which resumes the device: it sends
            // the rest by itself, no more doorbells.
            let mut got: Vec<u8> = Vec::new();
            while got.len() < 40 {
                while let Some(f) = q.pop() {
                    got.push(f.data[15]);
                }
                q.wake_waiters();
                if got.len() < 40 {
                    rig.until("TX resumed", |_| !q.is_empty());
                }
            }
            assert_eq!(got, (0..40).collect::<Vec<u8>>(), "lost or reordered");
            assert_eq!(q.counters.snapshot().rx_drops, 0);
            let c = rig.dev.rx_queues()[0].counters.snapshot();
            assert_eq!(c.tx_frames, 40);
        }
    }
}

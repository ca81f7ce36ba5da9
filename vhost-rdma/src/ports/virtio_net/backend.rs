//! A port: the vhost-user backend of one virtio-net device. It turns TX
//! descriptor chains into frames for the fabric, and frames from the fabric
//! into RX buffers. One instance lives for one guest connection.
//!
//! Threads: one vring worker per queue pair (RX `2i`, TX `2i+1`); worker 0
//! also serves the control queue in the test-device form. Every worker sleeps
//! in epoll on its kick eventfds and on its pending-queue wake eventfd.

use crate::config::{DeviceForm, MacAddr};
use crate::fabric::{Batch, Fabric, Frame, Ingress, PortShared, RxQueue};
use crate::guest_warn;
use crate::ports::virtio_net::chain::{self, ChainLog, RxSource, TxStep};
use crate::ports::virtio_net::offloads::rx_offloads;
use crate::stats::QueueCounters;
use crate::virtio_net::*;
use std::io;
use std::sync::atomic::{fence, AtomicBool, Ordering, Ordering::*};
use std::sync::{Arc, Mutex, RwLock};
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::{VhostUserBackend, VringRwLock, VringT};
use virtio_bindings::bindings::virtio_net::*;
use virtio_queue::{DescriptorChain, QueueOwnedT, QueueT};
use vm_memory::{
    Bytes, GuestAddress, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryLoadGuard,
    GuestMemoryMmap,
};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};

type Mem = GuestMemoryAtomic<GuestMemoryMmap>;
type MemGuard = GuestMemoryLoadGuard<GuestMemoryMmap>;

/// Largest virtqueue the device accepts.
pub const MAX_QUEUE_SIZE: usize = 1024;

pub use crate::ports::virtio_net::chain::ChainError;

/// One vhost-user connection's backend for a port.
pub struct PortBackend {
    shared: Arc<PortShared>,
    fabric: Arc<Fabric>,
    mem: RwLock<Option<Mem>>,
    event_idx: AtomicBool,
    exits: Vec<(EventConsumer, EventNotifier)>,
    /// Acked features (per connection; also published in `shared`).
    acked: Mutex<u64>,
}

impl PortBackend {
    /// A fresh backend for a new connection to the port.
    pub fn new(shared: Arc<PortShared>, fabric: Arc<Fabric>) -> io::Result<Self> {
        let threads = usize::from(shared.cfg().queue_pairs);
        let exits = (0..threads)
            .map(|_| new_event_consumer_and_notifier(EventFlag::NONBLOCK))
            .collect::<Result<Vec<_>, _>>()?;
        // A new guest starts without RSS / hash configuration.
        shared.steering().reset_guest_config();
        Ok(PortBackend {
            shared,
            fabric,
            mem: RwLock::new(None),
            event_idx: AtomicBool::new(false),
            exits,
            acked: Mutex::new(0),
        })
    }

    fn qps(&self) -> usize {
        usize::from(self.shared.cfg().queue_pairs)
    }

    fn owns_device(&self) -> bool {
        self.shared.cfg().form() == DeviceForm::TestDevice
    }

    /// The epoll id of worker `thread`'s pending-queue wake eventfd.
    pub fn wake_event_id(&self, _thread: usize) -> u64 {
        // Vring events use thread-local indices, but the library reserves ids
        // up to the port's total queue count (which is its own exit/enable
        // event), so ours start above that.
        self.num_queues() as u64 + 1
    }

    /// Makes every worker thread leave its loop.
    pub fn signal_exit(&self) {
        for (_, n) in &self.exits {
            let _ = n.notify();
        }
    }

    fn memory(&self) -> Option<MemGuard> {
        self.mem.read().ok()?.as_ref().map(|m| m.memory())
    }

    fn has(&self, f: u32) -> bool {
        *self.acked.lock().unwrap_or_else(|e| e.into_inner()) & bit(f) != 0
    }

    /// The virtio-net header length of this connection (20 bytes with
    /// HASH_REPORT, else 12), on TX and RX alike.
    fn hdr_len(&self) -> usize {
        net_hdr_len(*self.acked.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn counters(&self, qp: usize) -> &QueueCounters {
        &self.shared.rx_queues()[qp.min(self.shared.rx_queues().len() - 1)].counters
    }

    /// Drains the TX vring of queue pair `qp` into the fabric.
    fn process_tx(&self, qp: usize, vring: &VringRwLock) {
        let Some(mem) = self.memory() else { return };
        let c = self.counters(qp);
        let event_idx = self.event_idx.load(Relaxed);
        let mut vr = vring.get_mut();
        // A resume or stall-timer event may come after the front end disabled
        // the ring (SET_VRING_ENABLE 0 / GET_VRING_BASE): leave it alone then.
        if !vr.is_enabled() || !vr.get_queue().ready() {
            return;
        }
        // Receivers are woken once per pass, not once per frame; the clock
        // is read once per pass, here at the edge.
        let mut wakes = Batch::new(std::time::Instant::now());
        let used_before = vr.get_queue().next_used();
        // (frames, bytes) forwarded in this pass.
        let mut sent = (0u64, 0u64);
        loop {
            if event_idx {
                let _ = vr.disable_notification();
            }
            let acked = *self.acked.lock().unwrap_or_else(|e| e.into_inner());
            let drained = chain::drain_tx(&*mem, vr.get_queue_mut(), acked, |head, r| {
                match r {
                    Ok(f) => {
                        let len = f.data.len() as u64;
                        // Back-pressure: leave the chain in the ring while
                        // its receiver is full but alive; its drain (or the
                        // stall timer) resumes us. Forwarded at once
                        // otherwise, so the next frame's congestion check
                        // sees this one queued (or staged in `wakes`).
                        let f = match self.fabric.ingress(self.shared.index(), f, &mut wakes) {
                            Ingress::Forwarded(_) => None,
                            Ingress::Congested(q, f) => {
                                // Register first, then look again: a drain
                                // between the two cannot be missed.
                                q.add_waiter(&self.shared.tx_resume()[qp]);
                                // Counting what this pass staged for it.
                                if wakes.congested(q) {
                                    // The receiver must drain what we queued
                                    // (the flush pushes what we staged).
                                    wakes.flush();
                                    crate::buffers::give(f.data);
                                    self.arm_tx_timer(qp);
                                    self.shared.count_tx_pause();
                                    tracing::trace!(port = %self.shared.cfg().name, qp, "tx paused");
                                    return TxStep::Pause;
                                }
                                Some(f)
                            }
                        };
                        if let Some(f) = f {
                            // In this pass's batch: behind what it staged
                            // for the same receiver, in order.
                            self.fabric.forward_in(self.shared.index(), f, &mut wakes);
                        }
                        // Added to the counters once per pass.
                        sent.0 += 1;
                        sent.1 += len;
                    }
                    Err(e) => {
                        QueueCounters::add(&c.tx_errors, 1);
                        guest_warn!(self.shared.log(), port = %self.shared.cfg().name, qp, "TX chain {head} refused: {e}");
                    }
                }
                TxStep::Done
            });
            let drained = match drained {
                Ok(d) => d,
                Err(e) => {
                    QueueCounters::add(&c.tx_errors, 1);
                    QueueCounters::add(&c.tx_frames, sent.0);
                    QueueCounters::add(&c.tx_bytes, sent.1);
                    guest_warn!(self.shared.log(), port = %self.shared.cfg().name, qp, "TX ring unusable: {e}");
                    return;
                }
            };
            let used = drained.used.iter().map(|&h| (h, 0));
            if let Err(e) = chain::publish_used(&mem, vr.get_queue_mut(), used) {
                QueueCounters::add(&c.tx_errors, 1);
                QueueCounters::add(&c.tx_frames, sent.0);
                QueueCounters::add(&c.tx_bytes, sent.1);
                guest_warn!(self.shared.log(), port = %self.shared.cfg().name, qp, "TX used ring unusable: {e}");
                return;
            }
            if !event_idx || drained.paused {
                break;
            }
            match vr.enable_notification() {
                Ok(true) => continue,
                _ => break,
            }
        }
        QueueCounters::add(&c.tx_frames, sent.0);
        QueueCounters::add(&c.tx_bytes, sent.1);
        if chain::needs_interrupt(&mem, vr.get_queue(), used_before) {
            let _ = vr.signal_used_queue();
        }
    }

    fn arm_tx_timer(&self, qp: usize) {
        if let Some(t) = self.shared.tx_timers().get(qp) {
            let mut t = t.lock().unwrap_or_else(|e| e.into_inner());
            let _ = t.reset(
                std::time::Duration::from_millis(crate::fabric::STALL_MS),
                None,
            );
        }
    }

    /// The epoll id of worker `thread`'s TX resume eventfd.
    pub fn resume_event_id(&self, thread: usize) -> u64 {
        self.wake_event_id(thread) + 1
    }

    /// The epoll id of worker `thread`'s TX stall timer.
    pub fn timer_event_id(&self, thread: usize) -> u64 {
        self.wake_event_id(thread) + 2
    }

    /// Moves pending frames of queue pair `qp` into its RX vring.
    fn process_rx(&self, qp: usize, vring: &VringRwLock) {
        let Some(rxq) = self.shared.rx_queues().get(qp) else {
            return;
        };
        rxq.disarm();
        let Some(mem) = self.memory() else { return };
        let mut vr = vring.get_mut();
        if !vr.is_enabled() || !vr.get_queue().ready() {
            rxq.enabled.store(false, Relaxed);
            if qp != 0 {
                // Frames steered here before the guest shrank its queue
                // pairs go to queue pair 0.
                while let Some(f) = rxq.pop() {
                    if let Some(q0) = self.shared.rx_queues().first() {
                        q0.take_over(f);
                    }
                }
                if let Some(q0) = self.shared.rx_queues().first() {
                    let _ = q0.wake.write(1);
                }
            }
            return;
        }
        rxq.enabled.store(true, Relaxed);
        let mrg = self.has(VIRTIO_NET_F_MRG_RXBUF);
        let hl = self.hdr_len();
        let event_idx = self.event_idx.load(Relaxed);
        let c = &rxq.counters;
        let used_before = vr.get_queue().next_used();
        let mut hand = std::collections::VecDeque::new();
        loop {
            let Ok(seen) = vr.get_queue().avail_idx(&*mem, Ordering::Acquire) else {
                return;
            };
            let ctx = ChainLog {
                counters: c,
                log: self.shared.log(),
                port: &self.shared.cfg().name,
                qp,
            };
            let mut src = PendingSource {
                q: rxq,
                hand: std::mem::take(&mut hand),
                fed: false,
            };
            let filled = chain::fill_rx(&*mem, vr.get_queue_mut(), &mut src, hl, mrg, ctx);
            hand = src.finish();
            let (used, starved) = match filled {
                Ok(f) => (f.used, f.starved),
                Err(e) => {
                    QueueCounters::add(&c.rx_errors, 1);
                    guest_warn!(self.shared.log(), port = %self.shared.cfg().name, qp, "RX ring unusable: {e}");
                    return;
                }
            };
            if let Err(e) = chain::publish_used(&mem, vr.get_queue_mut(), used.iter().copied()) {
                QueueCounters::add(&c.rx_errors, 1);
                guest_warn!(self.shared.log(), port = %self.shared.cfg().name, qp, "RX used ring unusable: {e}");
                return;
            }
            if !starved || !event_idx {
                break;
            }
            // Out of buffers: ask the driver to kick when it adds a buffer
            // beyond those we saw. (virtio-queue's enable_notification would
            // publish next_avail, which after a rewind lies behind buffers
            // already seen: the driver would never kick and we would spin.)
            if !arm_avail_event(&mem, vr.get_queue(), seen.0) {
                break;
            }
            fence(Ordering::SeqCst);
            match vr.get_queue().avail_idx(&*mem, Ordering::Acquire) {
                Ok(now) if now != seen => continue,
                _ => break,
            }
        }
        if chain::needs_interrupt(&mem, vr.get_queue(), used_before) {
            let _ = vr.signal_used_queue();
        }
        drop(vr);
        tracing::trace!(port = %self.shared.cfg().name, qp, pending = rxq.len(), "rx batch done");
        rxq.wake_waiters();
    }

    /// Serves the control queue (test-device form).
    fn process_ctrl(&self, vring: &VringRwLock) {
        let Some(mem) = self.memory() else { return };
        let event_idx = self.event_idx.load(Relaxed);
        let mut vr = vring.get_mut();
        loop {
            if event_idx {
                let _ = vr.disable_notification();
            }
            let mut used = Vec::new();
            {
                let q = vr.get_queue_mut();
                let Ok(iter) = q.iter(mem.clone()) else {
                    return;
                };
                for chain in iter {
                    let head = chain.head_index();
                    let (ok, ack) = self.ctrl_command(&mem, chain);
                    if !ok {
                        self.shared.count_ctrl_error();
                    }
                    let n = match ack {
                        Some(addr) => {
                            let v = if ok { VIRTIO_NET_OK } else { VIRTIO_NET_ERR } as u8;
                            u32::from(mem.write_slice(&[v], addr).is_ok())
                        }
                        None => 0,
                    };
                    used.push((head, n));
                }
            }
            for (h, n) in used {
                let _ = vr.add_used(h, n);
            }
            // With EVENT_IDX the driver kicks only when it passes the
            // avail_event we publish here; without re-arming we would miss
            // its next command.
            if !event_idx || !matches!(vr.enable_notification(), Ok(true)) {
                break;
            }
        }
        if vr.needs_notification().unwrap_or(true) {
            let _ = vr.signal_used_queue();
        }
    }

    /// Executes one control command; returns (success, ack address).
    fn ctrl_command(
        &self,
        mem: &MemGuard,
        chain: DescriptorChain<MemGuard>,
    ) -> (bool, Option<GuestAddress>) {
        let (cmd, ack) = chain::read_ctrl_chain(mem, chain);
        let cmd = match cmd {
            Ok(c) => c,
            Err(e) => {
                guest_warn!(self.shared.log(), port = %self.shared.cfg().name, "control command refused: {e}");
                return (false, ack);
            }
        };
        let r = self.ctrl_execute(&cmd);
        tracing::debug!(port = %self.shared.cfg().name, cmd = ?&cmd[..cmd.len().min(16)], ok = r.is_ok(), ack = ?ack, "control command");
        if let Err(e) = &r {
            guest_warn!(self.shared.log(), port = %self.shared.cfg().name, "control command refused: {e}");
        }
        (r.is_ok(), ack)
    }

    fn ctrl_execute(&self, cmd: &[u8]) -> Result<(), ChainError> {
        if cmd.len() < 2 {
            return Err(ChainError::Ctrl("shorter than class and command"));
        }
        let (class, code, data) = (u32::from(cmd[0]), u32::from(cmd[1]), &cmd[2..]);
        match (class, code) {
            (VIRTIO_NET_CTRL_RX, _) if code <= VIRTIO_NET_CTRL_RX_NOBCAST => Ok(()),
            (VIRTIO_NET_CTRL_MAC, VIRTIO_NET_CTRL_MAC_TABLE_SET) => Ok(()),
            (VIRTIO_NET_CTRL_MAC, VIRTIO_NET_CTRL_MAC_ADDR_SET) => {
                let m: [u8; 6] = data
                    .get(..6)
                    .and_then(|m| m.try_into().ok())
                    .ok_or(ChainError::Ctrl("short MAC"))?;
                if m[0] & 1 != 0 {
                    return Err(ChainError::Ctrl("multicast MAC"));
                }
                self.shared.set_mac(MacAddr(m));
                Ok(())
            }
            (VIRTIO_NET_CTRL_VLAN, _) => Ok(()),
            (VIRTIO_NET_CTRL_ANNOUNCE, VIRTIO_NET_CTRL_ANNOUNCE_ACK) => Ok(()),
            (VIRTIO_NET_CTRL_MQ, VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET) => {
                let n = data
                    .get(..2)
                    .map(|b| u16::from_le_bytes([b[0], b[1]]))
                    .ok_or(ChainError::Ctrl("short MQ"))?;
                if n == 0 || usize::from(n) > self.qps() {
                    return Err(ChainError::Ctrl("queue pairs out of range"));
                }
                self.shared.set_active_qps(n);
                Ok(())
            }
            (VIRTIO_NET_CTRL_MQ, VIRTIO_NET_CTRL_MQ_RSS_CONFIG) => {
                if !self.has(VIRTIO_NET_F_RSS) {
                    return Err(ChainError::Ctrl("RSS_CONFIG without VIRTIO_NET_F_RSS"));
                }
                let r = self
                    .shared
                    .steering()
                    .set_rss_from_guest(data, self.qps() as u16);
                match r {
                    Ok(max_tx_vq) => {
                        // The device takes its queue pair count from max_tx_vq.
                        self.shared.set_active_qps(max_tx_vq);
                        tracing::info!(port = %self.shared.cfg().name, max_tx_vq, "RSS configured by the guest");
                        Ok(())
                    }
                    Err(e) => {
                        guest_warn!(self.shared.log(), port = %self.shared.cfg().name, "{e}");
                        Err(ChainError::Ctrl("bad RSS_CONFIG"))
                    }
                }
            }
            (VIRTIO_NET_CTRL_MQ, VIRTIO_NET_CTRL_MQ_HASH_CONFIG) => {
                if !self.has(VIRTIO_NET_F_HASH_REPORT) {
                    return Err(ChainError::Ctrl(
                        "HASH_CONFIG without VIRTIO_NET_F_HASH_REPORT",
                    ));
                }
                self.shared
                    .steering()
                    .set_hash_from_guest(data)
                    .map_err(|e| {
                        guest_warn!(self.shared.log(), port = %self.shared.cfg().name, "{e}");
                        ChainError::Ctrl("bad HASH_CONFIG")
                    })
            }
            (VIRTIO_NET_CTRL_GUEST_OFFLOADS, VIRTIO_NET_CTRL_GUEST_OFFLOADS_SET) => {
                let v = data
                    .get(..8)
                    .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])));
                let v = v.ok_or(ChainError::Ctrl("short offloads"))?;
                let mask = bit(VIRTIO_NET_F_GUEST_CSUM)
                    | bit(VIRTIO_NET_F_GUEST_TSO4)
                    | bit(VIRTIO_NET_F_GUEST_TSO6)
                    | bit(VIRTIO_NET_F_GUEST_ECN);
                let mut acked = self.acked.lock().unwrap_or_else(|e| e.into_inner());
                if v & !mask != 0 || v & !*acked != 0 {
                    return Err(ChainError::Ctrl("offloads not negotiated"));
                }
                *acked = (*acked & !mask) | v;
                self.shared.set_features(*acked, rx_offloads(*acked));
                Ok(())
            }
            _ => Err(ChainError::Ctrl("unsupported class/command")),
        }
    }
}

/// With EVENT_IDX, publishes `avail_event = idx`: the driver kicks once it
/// makes buffers available past `idx`.
fn arm_avail_event(mem: &MemGuard, q: &virtio_queue::Queue, idx: u16) -> bool {
    let at = q.used_ring() + 4 + 8 * u64::from(q.size());
    mem.store(idx.to_le(), GuestAddress(at), Ordering::Release)
        .is_ok()
}

/// The port's pending queue as the frame source of an RX pass: frames are
/// taken a batch at a time (one lock per batch), and what the ring had no
/// room for goes back, first in line, when the pass ends.
struct PendingSource<'a> {
    q: &'a RxQueue,
    hand: std::collections::VecDeque<Frame>,
    /// A frame reached the guest in this pass.
    fed: bool,
}

impl PendingSource<'_> {
    /// Frames taken per lock.
    const BATCH: usize = 64;

    /// Returns undelivered frames to the queue; gives back the (empty)
    /// batch storage for the next pass.
    fn finish(mut self) -> std::collections::VecDeque<Frame> {
        if self.fed {
            self.q.mark_fed();
        }
        self.q.put_back(&mut self.hand);
        self.hand
    }
}

impl RxSource for PendingSource<'_> {
    fn pop(&mut self) -> Option<Frame> {
        if self.hand.is_empty() {
            self.q.take_batch(&mut self.hand, Self::BATCH);
        }
        self.hand.pop_front()
    }
    fn unpop(&mut self, f: Frame) {
        self.hand.push_front(f)
    }
    fn starved(&mut self) {
        self.q.mark_starved(std::time::Instant::now())
    }
    fn fed(&mut self) {
        // Counted when the pass ends (`finish`): the hand's frames not put
        // back were delivered or dropped.
        self.fed = true;
    }
}

impl VhostUserBackend for PortBackend {
    type Bitmap = ();
    type Vring = VringRwLock;

    fn num_queues(&self) -> usize {
        self.qps() * 2 + usize::from(self.owns_device())
    }

    fn max_queue_size(&self) -> usize {
        MAX_QUEUE_SIZE
    }

    fn features(&self) -> u64 {
        let mut f = BASE_FEATURES | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
        if self.owns_device() {
            f |= OWNED_DEVICE_FEATURES;
            if self.qps() > 1 {
                f |= bit(VIRTIO_NET_F_MQ);
            }
        } else if self.qps() > 1 {
            f |= bit(VIRTIO_NET_F_MQ);
        }
        f
    }

    fn acked_features(&self, features: u64) {
        tracing::debug!(port = %self.shared.cfg().name, features = format_args!("{features:#x}"), "features acked");
        *self.acked.lock().unwrap_or_else(|e| e.into_inner()) = features;
        self.shared.set_features(features, rx_offloads(features));
        if !self.owns_device() {
            self.shared.set_active_qps(self.shared.cfg().queue_pairs);
        }
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        let mut p = VhostUserProtocolFeatures::MQ | VhostUserProtocolFeatures::REPLY_ACK;
        if self.owns_device() {
            p |= VhostUserProtocolFeatures::CONFIG;
        }
        p
    }

    fn reset_device(&self) {
        self.shared.steering().reset_guest_config();
        for q in self.shared.rx_queues() {
            q.clear();
            // See serve_port: usable until the worker finds it disabled.
            q.enabled.store(true, Relaxed);
        }
        self.shared.set_active_qps(if self.owns_device() {
            1
        } else {
            self.shared.cfg().queue_pairs
        });
    }

    fn set_event_idx(&self, enabled: bool) {
        self.event_idx.store(enabled, Relaxed);
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        let mac = self.shared.mac().0;
        // `ctl link down` shows here (no config-change interrupt is sent:
        // the guest sees it when it next reads the status).
        let link_up = self.fabric.faults.link_up(self.shared.index());
        let cfg = config_space(mac, link_up, self.shared.cfg().queue_pairs, 1500);
        let start = (offset as usize).min(cfg.len());
        let end = start.saturating_add(size as usize).min(cfg.len());
        let mut v = cfg[start..end].to_vec();
        v.resize(size.min(4096) as usize, 0);
        v
    }

    fn update_memory(&self, mem: Mem) -> io::Result<()> {
        if let Ok(mut m) = self.mem.write() {
            *m = Some(mem);
        }
        Ok(())
    }

    fn queues_per_thread(&self) -> Vec<u64> {
        let mut v: Vec<u64> = (0..self.qps()).map(|i| 0b11u64 << (2 * i)).collect();
        if self.owns_device() {
            v[0] |= 1u64 << (2 * self.qps());
        }
        v
    }

    fn exit_event(&self, thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        let (c, n) = self.exits.get(thread_index)?;
        Some((c.try_clone().ok()?, n.try_clone().ok()?))
    }

    fn handle_event(
        &self,
        device_event: u16,
        _evset: EventSet,
        vrings: &[VringRwLock],
        thread_id: usize,
    ) -> io::Result<()> {
        // Never return an error for guest-caused trouble: the library would
        // end this worker thread.
        let qp = thread_id;
        let wake = self.wake_event_id(thread_id);
        tracing::trace!(port = %self.shared.cfg().name, device_event, thread_id, "event");
        match u64::from(device_event) {
            0 => {
                if let Some(v) = vrings.first() {
                    self.process_rx(qp, v);
                }
            }
            1 => {
                if let Some(v) = vrings.get(1) {
                    self.process_tx(qp, v);
                    // TX may have freed nothing here, but a guest that sends
                    // usually also has RX work waiting.
                }
            }
            2 if thread_id == 0 && self.owns_device() => {
                if let Some(v) = vrings.get(2) {
                    self.process_ctrl(v);
                }
            }
            e if e == wake => {
                if let Some(v) = vrings.first() {
                    self.process_rx(qp, v);
                }
            }
            e if e == self.resume_event_id(thread_id) || e == self.timer_event_id(thread_id) => {
                if let Some(r) = self.shared.tx_resume().get(qp) {
                    let _ = r.read();
                }
                if e == self.timer_event_id(thread_id) {
                    if let Some(t) = self.shared.tx_timers().get(qp) {
                        // Disarm (and consume an expiry) without blocking.
                        let _ = t
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .reset(std::time::Duration::ZERO, None);
                    }
                }
                if let Some(v) = vrings.get(1) {
                    self.process_tx(qp, v);
                }
            }
            _ => {}
        }
        Ok(())
    }
}

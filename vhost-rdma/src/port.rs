//! A port: the vhost-user backend of one virtio-net device. It turns TX
//! descriptor chains into frames for the fabric, and frames from the fabric
//! into RX buffers. One instance lives for one guest connection.
//!
//! Threads: one vring worker per queue pair (RX `2i`, TX `2i+1`); worker 0
//! also serves the control queue in the test-device form. Every worker sleeps
//! in epoll on its kick eventfds and on its pending-queue wake eventfd.

use crate::config::{DeviceForm, MacAddr};
use crate::fabric::{Fabric, Frame, PortShared};
use crate::guest_warn;
use crate::offload;
use crate::stats::QueueCounters;
use crate::virtio_net::*;
use std::io;
use std::sync::atomic::{fence, AtomicBool, Ordering, Ordering::*};
use std::sync::{Arc, Mutex, RwLock};
use thiserror::Error;
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::{VhostUserBackend, VringRwLock, VringT};
use virtio_bindings::bindings::virtio_net::*;
use virtio_queue::desc::split::Descriptor;
use virtio_queue::{DescriptorChain, QueueOwnedT, QueueT};
use vm_memory::{
    Address, Bytes, GuestAddress, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryLoadGuard,
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

/// What is wrong with a descriptor chain a guest posted.
#[derive(Debug, Error)]
pub enum ChainError {
    #[error("descriptor chain is empty or its indirect table is invalid")]
    Empty,
    #[error(
        "descriptor chain is cut short (loop, next index out of range, or unreadable descriptor)"
    )]
    Broken,
    #[error("device-writable descriptor in a TX chain")]
    WritableInTx,
    #[error("buffer of {addr:#x}+{len} is outside guest memory")]
    OutOfMemory { addr: u64, len: u32 },
    #[error("TX chain of {0}+ bytes exceeds the largest frame")]
    TooLong(usize),
    #[error("TX chain of {0} bytes is shorter than header plus Ethernet header")]
    TooShort(usize),
    #[error("offload request refused: {0}")]
    Offload(#[from] offload::OffloadError),
    #[error("offload used without negotiating it: {0}")]
    NotNegotiated(&'static str),
    #[error("control message: {0}")]
    Ctrl(&'static str),
}

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
        let threads = usize::from(shared.cfg.queue_pairs);
        let exits = (0..threads)
            .map(|_| new_event_consumer_and_notifier(EventFlag::NONBLOCK))
            .collect::<Result<Vec<_>, _>>()?;
        // A new guest starts without RSS / hash configuration.
        shared.steering.reset_guest_config();
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
        usize::from(self.shared.cfg.queue_pairs)
    }

    fn owns_device(&self) -> bool {
        self.shared.cfg.form == DeviceForm::TestDevice
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
        &self.shared.rxq[qp.min(self.shared.rxq.len() - 1)].counters
    }

    /// Reads a TX chain into a frame.
    fn read_tx_chain(
        &self,
        mem: &MemGuard,
        chain: DescriptorChain<MemGuard>,
    ) -> Result<Frame, ChainError> {
        let hl = self.hdr_len();
        let mut buf: Vec<u8> = Vec::with_capacity(2048);
        let mut last: Option<Descriptor> = None;
        for desc in chain {
            if desc.is_write_only() {
                return Err(ChainError::WritableInTx);
            }
            let len = desc.len() as usize;
            let start = buf.len();
            if start + len > hl + MAX_FRAME_LEN {
                return Err(ChainError::TooLong(start + len));
            }
            buf.resize(start + len, 0);
            mem.read_slice(&mut buf[start..], desc.addr())
                .map_err(|_| ChainError::OutOfMemory {
                    addr: desc.addr().0,
                    len: desc.len(),
                })?;
            last = Some(desc);
        }
        match last {
            None => return Err(ChainError::Empty),
            Some(d) if d.has_next() => return Err(ChainError::Broken),
            _ => {}
        }
        if buf.len() < hl + MIN_FRAME_LEN {
            return Err(ChainError::TooShort(buf.len()));
        }
        let mut h = [0u8; NET_HDR_LEN];
        h.copy_from_slice(&buf[..NET_HDR_LEN]);
        // The hash fields of a TX header carry nothing for the device.
        let hdr = NetHdr::parse(&h);
        buf.drain(..hl);
        if hdr.needs_csum() && !self.has(VIRTIO_NET_F_CSUM) {
            return Err(ChainError::NotNegotiated(
                "NEEDS_CSUM without VIRTIO_NET_F_CSUM",
            ));
        }
        match u32::from(hdr.gso_kind()) {
            VIRTIO_NET_HDR_GSO_TCPV4 if !self.has(VIRTIO_NET_F_HOST_TSO4) => {
                return Err(ChainError::NotNegotiated("TCPv4 GSO without HOST_TSO4"))
            }
            VIRTIO_NET_HDR_GSO_TCPV6 if !self.has(VIRTIO_NET_F_HOST_TSO6) => {
                return Err(ChainError::NotNegotiated("TCPv6 GSO without HOST_TSO6"))
            }
            _ => {}
        }
        if hdr.gso_kind() == VIRTIO_NET_HDR_GSO_NONE as u8
            && buf.len() > MAX_FRAME_LEN - 65535 + 9216
        {
            // Without GSO a frame must fit a jumbo MTU.
            return Err(ChainError::TooLong(buf.len()));
        }
        offload::validate(&buf, &hdr)?;
        Ok(Frame { hdr, data: buf })
    }

    /// Drains the TX vring of queue pair `qp` into the fabric.
    fn process_tx(&self, qp: usize, vring: &VringRwLock) {
        let Some(mem) = self.memory() else { return };
        let c = self.counters(qp);
        let event_idx = self.event_idx.load(Relaxed);
        let mut paused = false;
        let mut vr = vring.get_mut();
        loop {
            if event_idx {
                let _ = vr.disable_notification();
            }
            let mut used = Vec::new();
            {
                let q = vr.get_queue_mut();
                let iter = match q.iter(mem.clone()) {
                    Ok(it) => it,
                    Err(e) => {
                        QueueCounters::add(&c.tx_errors, 1);
                        guest_warn!(self.shared.log, port = %self.shared.cfg.name, qp, "TX ring unusable: {e}");
                        return;
                    }
                };
                let mut iter = iter;
                while let Some(chain) = iter.next() {
                    let head = chain.head_index();
                    match self.read_tx_chain(&mem, chain) {
                        Ok(f) => {
                            // Back-pressure: leave the chain in the ring while
                            // its receiver is full but alive; its drain (or
                            // the stall timer) resumes us.
                            if let Some(q) = self.fabric.congested_queue(self.shared.index, &f.data)
                            {
                                // Register first, then look again: a drain
                                // between the two cannot be missed.
                                q.add_waiter(&self.shared.tx_resume[qp]);
                                if q.congested() {
                                    iter.go_to_previous_position();
                                    self.arm_tx_timer(qp);
                                    self.shared.tx_pauses.fetch_add(1, Relaxed);
                                    tracing::trace!(port = %self.shared.cfg.name, qp, "tx paused");
                                    paused = true;
                                    break;
                                }
                            }
                            // Forward at once, so the next frame's congestion
                            // check sees this one queued.
                            QueueCounters::add(&c.tx_frames, 1);
                            QueueCounters::add(&c.tx_bytes, f.data.len() as u64);
                            self.fabric.forward(self.shared.index, f);
                        }
                        Err(e) => {
                            QueueCounters::add(&c.tx_errors, 1);
                            guest_warn!(self.shared.log, port = %self.shared.cfg.name, qp, "TX chain {head} refused: {e}");
                        }
                    }
                    used.push(head);
                }
            }
            for head in used {
                let _ = vr.add_used(head, 0);
            }
            if !event_idx || paused {
                break;
            }
            match vr.enable_notification() {
                Ok(true) => continue,
                _ => break,
            }
        }
        if vr.needs_notification().unwrap_or(true) {
            let _ = vr.signal_used_queue();
        }
    }

    fn arm_tx_timer(&self, qp: usize) {
        if let Some(t) = self.shared.tx_timer.get(qp) {
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
        let Some(rxq) = self.shared.rxq.get(qp) else {
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
                    if let Some(q0) = self.shared.rxq.first() {
                        q0.unpop(f);
                    }
                }
                if let Some(q0) = self.shared.rxq.first() {
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
        let mut signal = false;
        loop {
            let mut used: Vec<(u16, u32)> = Vec::new();
            let mut starved = false;
            let ring_size = vr.get_queue().size();
            let Ok(seen) = vr.get_queue().avail_idx(&*mem, Ordering::Acquire) else {
                return;
            };
            {
                let q = vr.get_queue_mut();
                let mut iter = match q.iter(mem.clone()) {
                    Ok(it) => it,
                    Err(e) => {
                        QueueCounters::add(&c.rx_errors, 1);
                        guest_warn!(self.shared.log, port = %self.shared.cfg.name, qp, "RX ring unusable: {e}");
                        return;
                    }
                };
                'frames: while let Some(frame) = rxq.pop() {
                    let hb = frame.hdr.to_hash_bytes(1);
                    let hdr = &hb[..hl];
                    let total = hl + frame.data.len();
                    let mut off = 0usize;
                    let mut chains: Vec<RxChain> = Vec::new();
                    while off < total {
                        let Some(chain) = iter.next() else {
                            for _ in 0..chains.len() {
                                iter.go_to_previous_position();
                            }
                            if chains.len() >= usize::from(ring_size) {
                                // Even the whole ring cannot hold it.
                                QueueCounters::add(&c.rx_drops, 1);
                                guest_warn!(self.shared.log, port = %self.shared.cfg.name, qp, "{total}-byte frame does not fit the whole RX ring: dropped");
                                continue 'frames;
                            }
                            rxq.unpop(frame);
                            rxq.mark_starved();
                            starved = true;
                            break 'frames;
                        };
                        let head = chain.head_index();
                        let descs = writable_descs(&chain).and_then(|d| {
                            if d.iter().any(|x| x.1 > 0) {
                                Ok(d)
                            } else {
                                Err(ChainError::Empty)
                            }
                        });
                        let descs = match descs {
                            Ok(d) => d,
                            Err(e) => {
                                QueueCounters::add(&c.rx_errors, 1);
                                guest_warn!(self.shared.log, port = %self.shared.cfg.name, qp, "RX chain {head} refused: {e}");
                                used.push((head, 0));
                                if !chains.is_empty() {
                                    // The frame's earlier buffers cannot be
                                    // given back behind this one: return them
                                    // empty and drop the frame.
                                    used.extend(chains.drain(..).map(|c| (c.head, 0)));
                                    QueueCounters::add(&c.rx_drops, 1);
                                    continue 'frames;
                                }
                                continue;
                            }
                        };
                        let cap: u64 = descs.iter().map(|d| u64::from(d.1)).sum();
                        if !mrg && cap < total as u64 {
                            // Without mergeable buffers a frame must fit one chain.
                            iter.go_to_previous_position();
                            for _ in 0..chains.len() {
                                iter.go_to_previous_position();
                            }
                            QueueCounters::add(&c.rx_drops, 1);
                            guest_warn!(self.shared.log, port = %self.shared.cfg.name, qp, "RX buffer of {cap} bytes too small for a {total}-byte frame: dropped");
                            continue 'frames;
                        }
                        match write_chain(&mem, &descs, hdr, &frame.data, off) {
                            Ok(n) => {
                                off += n;
                                chains.push(RxChain {
                                    head,
                                    len: n as u32,
                                    descs,
                                });
                            }
                            Err(e) => {
                                QueueCounters::add(&c.rx_errors, 1);
                                guest_warn!(self.shared.log, port = %self.shared.cfg.name, qp, "RX chain {head} refused: {e}");
                                used.push((head, 0));
                            }
                        }
                    }
                    if chains.len() > 1 {
                        // num_buffers sits at header offset 10 in the first chain.
                        let nb = (chains.len() as u16).to_le_bytes();
                        let _ = write_at(&mem, &chains[0].descs, 10, &nb);
                    }
                    QueueCounters::add(&c.rx_frames, 1);
                    QueueCounters::add(&c.rx_bytes, frame.data.len() as u64);
                    rxq.mark_fed();
                    used.extend(chains.into_iter().map(|c| (c.head, c.len)));
                }
            }
            signal |= !used.is_empty();
            for (h, n) in used {
                let _ = vr.add_used(h, n);
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
        if signal && vr.needs_notification().unwrap_or(true) {
            let _ = vr.signal_used_queue();
        }
        drop(vr);
        tracing::trace!(port = %self.shared.cfg.name, qp, pending = rxq.len(), "rx batch done");
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
                        self.shared.ctrl_errors.fetch_add(1, Relaxed);
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
        let mut cmd = Vec::new();
        let mut ack = None;
        for d in chain {
            if d.is_write_only() {
                if ack.is_none() && d.len() >= 1 {
                    ack = Some(d.addr());
                }
                continue;
            }
            let start = cmd.len();
            if start + d.len() as usize > 4096 {
                return (false, ack);
            }
            cmd.resize(start + d.len() as usize, 0);
            if mem.read_slice(&mut cmd[start..], d.addr()).is_err() {
                return (false, ack);
            }
        }
        let r = self.ctrl_execute(&cmd);
        tracing::debug!(port = %self.shared.cfg.name, cmd = ?&cmd[..cmd.len().min(16)], ok = r.is_ok(), ack = ?ack, "control command");
        if let Err(e) = &r {
            guest_warn!(self.shared.log, port = %self.shared.cfg.name, "control command refused: {e}");
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
                if let Ok(mut cur) = self.shared.mac.lock() {
                    *cur = MacAddr(m);
                }
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
                self.shared.active_qps.store(n, Relaxed);
                Ok(())
            }
            (VIRTIO_NET_CTRL_MQ, VIRTIO_NET_CTRL_MQ_RSS_CONFIG) => {
                if !self.has(VIRTIO_NET_F_RSS) {
                    return Err(ChainError::Ctrl("RSS_CONFIG without VIRTIO_NET_F_RSS"));
                }
                let r = self
                    .shared
                    .steering
                    .set_rss_from_guest(data, self.qps() as u16);
                match r {
                    Ok(max_tx_vq) => {
                        // The device takes its queue pair count from max_tx_vq.
                        self.shared.active_qps.store(max_tx_vq, Relaxed);
                        tracing::info!(port = %self.shared.cfg.name, max_tx_vq, "RSS configured by the guest");
                        Ok(())
                    }
                    Err(e) => {
                        guest_warn!(self.shared.log, port = %self.shared.cfg.name, "{e}");
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
                self.shared.steering.set_hash_from_guest(data).map_err(|e| {
                    guest_warn!(self.shared.log, port = %self.shared.cfg.name, "{e}");
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
                self.shared.features.store(*acked, Relaxed);
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

/// An RX chain a frame went into: its head, the bytes written, and its
/// writable buffers (to patch `num_buffers` afterwards).
struct RxChain {
    head: u16,
    len: u32,
    descs: Vec<(GuestAddress, u32)>,
}

/// The writable descriptors of an RX chain, checked to be a complete chain.
fn writable_descs(
    chain: &DescriptorChain<MemGuard>,
) -> Result<Vec<(GuestAddress, u32)>, ChainError> {
    let mut out = Vec::new();
    let mut last = None;
    for d in chain.clone() {
        if d.is_write_only() {
            out.push((d.addr(), d.len()));
        }
        last = Some(d);
    }
    match last {
        None => Err(ChainError::Empty),
        Some(d) if d.has_next() => Err(ChainError::Broken),
        _ if out.is_empty() => Err(ChainError::Empty),
        _ => Ok(out),
    }
}

/// Writes the logical stream `hdr ++ data`, from offset `off`, into the
/// buffers; returns how many bytes went in.
fn write_chain(
    mem: &MemGuard,
    descs: &[(GuestAddress, u32)],
    hdr: &[u8],
    data: &[u8],
    mut off: usize,
) -> Result<usize, ChainError> {
    let total = hdr.len() + data.len();
    let mut written = 0;
    for &(addr, len) in descs {
        let mut pos = 0usize;
        while pos < len as usize && off < total {
            let (src, at) = if off < hdr.len() {
                (hdr, off)
            } else {
                (data, off - hdr.len())
            };
            let n = (len as usize - pos).min(src.len() - at);
            let a = addr
                .checked_add(pos as u64)
                .ok_or(ChainError::OutOfMemory { addr: addr.0, len })?;
            mem.write_slice(&src[at..at + n], a)
                .map_err(|_| ChainError::OutOfMemory { addr: addr.0, len })?;
            pos += n;
            off += n;
            written += n;
        }
        if off >= total {
            break;
        }
    }
    Ok(written)
}

/// Writes `bytes` at logical offset `at` of a chain's writable buffers.
fn write_at(
    mem: &MemGuard,
    descs: &[(GuestAddress, u32)],
    mut at: usize,
    bytes: &[u8],
) -> Result<(), ChainError> {
    let mut i = 0;
    for &(addr, len) in descs {
        if at >= len as usize {
            at -= len as usize;
            continue;
        }
        while i < bytes.len() && at < len as usize {
            mem.write_slice(&bytes[i..i + 1], GuestAddress(addr.0 + at as u64))
                .map_err(|_| ChainError::OutOfMemory { addr: addr.0, len })?;
            i += 1;
            at += 1;
        }
        at = 0;
        if i == bytes.len() {
            return Ok(());
        }
    }
    Ok(())
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
        tracing::debug!(port = %self.shared.cfg.name, features = format_args!("{features:#x}"), "features acked");
        *self.acked.lock().unwrap_or_else(|e| e.into_inner()) = features;
        self.shared.features.store(features, Relaxed);
        if !self.owns_device() {
            self.shared
                .active_qps
                .store(self.shared.cfg.queue_pairs, Relaxed);
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
        self.shared.steering.reset_guest_config();
        for q in &self.shared.rxq {
            q.clear();
            // See serve_port: usable until the worker finds it disabled.
            q.enabled.store(true, Relaxed);
        }
        self.shared.active_qps.store(
            if self.owns_device() {
                1
            } else {
                self.shared.cfg.queue_pairs
            },
            Relaxed,
        );
    }

    fn set_event_idx(&self, enabled: bool) {
        self.event_idx.store(enabled, Relaxed);
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        let mac = self
            .shared
            .mac
            .lock()
            .map(|m| m.0)
            .unwrap_or(self.shared.cfg.mac.0);
        // `ctl link down` shows here (no config-change interrupt is sent:
        // the guest sees it when it next reads the status).
        let link_up = self.fabric.faults.link_up(self.shared.index);
        let cfg = config_space(mac, link_up, self.shared.cfg.queue_pairs, 1500);
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
        tracing::trace!(port = %self.shared.cfg.name, device_event, thread_id, "event");
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
                if let Some(r) = self.shared.tx_resume.get(qp) {
                    let _ = r.read();
                }
                if e == self.timer_event_id(thread_id) {
                    if let Some(t) = self.shared.tx_timer.get(qp) {
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

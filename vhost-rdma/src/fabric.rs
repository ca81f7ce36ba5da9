//! The fabric: an L2 learning switch between ports, with a bounded pending
//! queue per destination queue pair. It knows nothing of virtio rings; ports
//! hand it frames and it hands frames to ports' pending queues.

use crate::config::{DeviceForm, MacAddr, PortConfig, PortKind};
pub use crate::frame::{flow_hash, now_ms, Frame};
use crate::offload;
use crate::stats::{LogLimiter, PortStats, QueueCounters};
use crate::virtio_net::{bit, NetHdr};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use virtio_bindings::bindings::virtio_net::*;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use vmm_sys_util::timerfd::TimerFd;

/// A receiver whose frames have waited this long for an RX buffer counts as
/// stalled: senders stop waiting for it and drop instead.
pub const STALL_MS: u64 = 500;

/// What waits for one queue pair's RX buffers, and the frame its worker
/// holds while it looks for a buffer.
#[derive(Debug, Default)]
struct Pending {
    frames: VecDeque<Frame>,
    /// 1 while the worker holds a popped frame it may still put back. It
    /// counts as queued: without it a sender that checks between the pop and
    /// the put-back sees room that is not there, and its frame is dropped.
    in_hand: usize,
}

impl Pending {
    fn occupancy(&self) -> usize {
        self.frames.len() + self.in_hand
    }
}

/// Frames waiting for RX buffers of one queue pair of a port.
///
/// Two bounds: senders that honour back-pressure pause at `limit`
/// (`rx-queue-frames`); frames are dropped only past `hard_limit`, which adds
/// one frame for every thread that may have checked for room just before
/// another took it (each port's TX workers, virtual hosts, the fault timer).
/// A slow receiver that keeps reading therefore never loses a frame, and
/// memory stays bounded.
#[derive(Debug)]
pub struct RxQueue {
    pending: Mutex<Pending>,
    limit: usize,
    hard_limit: AtomicUsize,
    /// Wakes the port's worker thread for this queue pair.
    pub wake: EventFd,
    wake_armed: AtomicBool,
    /// The guest enabled this RX vring (set by the worker).
    pub enabled: AtomicBool,
    pub counters: QueueCounters,
    /// Since when (`now_ms`) frames wait here with no RX buffer; 0 = not.
    starved_since_ms: AtomicU64,
    /// Senders paused because this queue was full (back-pressure), woken
    /// when it drains to half.
    waiters: Mutex<Vec<Arc<EventFd>>>,
}

impl RxQueue {
    fn new(limit: usize) -> std::io::Result<Self> {
        Ok(RxQueue {
            pending: Mutex::new(Pending::default()),
            limit,
            hard_limit: AtomicUsize::new(limit),
            wake: EventFd::new(EFD_NONBLOCK)?,
            wake_armed: AtomicBool::new(false),
            enabled: AtomicBool::new(false),
            counters: QueueCounters::default(),
            starved_since_ms: AtomicU64::new(0),
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

    /// Queues the frames one sent frame became (segments of a TSO frame go
    /// together: all or none); drops them (counted) when the queue is past its
    /// drop bound. Returns how many were queued.
    fn push_all(&self, frames: Vec<Frame>) -> usize {
        let n = frames.len();
        if n == 0 {
            return 0;
        }
        {
            let mut p = self.lock();
            if p.occupancy() >= self.hard_limit.load(Relaxed) {
                QueueCounters::add(&self.counters.rx_drops, n as u64);
                return 0;
            }
            p.frames.extend(frames);
        }
        if !self.wake_armed.swap(true, AcqRel) {
            let _ = self.wake.write(1);
        }
        n
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
        p.in_hand = usize::from(f.is_some());
        f
    }

    /// Whether a sender should wait for this queue instead of dropping: it is
    /// full, and its guest has not been out of RX buffers for longer than
    /// [`STALL_MS`] (a guest that stopped reading only loses its own frames).
    pub fn congested(&self) -> bool {
        if self.lock().occupancy() < self.limit {
            return false;
        }
        let since = self.starved_since_ms.load(Relaxed);
        since == 0 || now_ms().saturating_sub(since) < STALL_MS
    }

    /// The worker found frames pending but no RX buffer.
    pub fn mark_starved(&self) {
        let _ = self
            .starved_since_ms
            .compare_exchange(0, now_ms().max(1), Relaxed, Relaxed);
    }

    /// The worker delivered a frame: the guest is reading.
    pub fn mark_fed(&self) {
        self.starved_since_ms.store(0, Relaxed);
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
        if self.lock().occupancy() > self.limit / 2 {
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
        p.in_hand = 0;
    }

    /// Takes over a frame another queue pair's worker could not deliver (its
    /// ring was disabled): it goes first, whatever the bound.
    pub fn take_over(&self, f: Frame) {
        self.lock().frames.push_front(f);
    }

    /// Drops everything pending (guest gone); returns how many.
    pub fn clear(&self) -> usize {
        let mut p = self.lock();
        let n = p.frames.len();
        p.frames.clear();
        p.in_hand = 0;
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

/// State of one port shared by the fabric and the port's vhost-user backend;
/// it outlives guest connections.
#[derive(Debug)]
pub struct PortShared {
    pub index: usize,
    pub cfg: PortConfig,
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
    /// This port is a virtual host's attachment (`hosts`), not a vhost-user socket.
    pub is_host: bool,
    /// The `kind=erdma` port paired with this virtio-net port: RoCEv2
    /// frames to this port's MAC go there.
    pub rdma_companion: OnceLock<usize>,
}

impl PortShared {
    /// Creates the shared state of a port from its configuration.
    pub fn new(index: usize, cfg: PortConfig) -> std::io::Result<Self> {
        let qps = usize::from(cfg.queue_pairs.max(1));
        let rxq = (0..qps)
            .map(|_| RxQueue::new(cfg.rx_queue_frames.max(1)))
            .collect::<Result<_, _>>()?;
        let tx_resume = (0..qps)
            .map(|_| EventFd::new(EFD_NONBLOCK).map(Arc::new))
            .collect::<Result<_, _>>()?;
        let tx_timer = (0..qps)
            .map(|_| TimerFd::new().map(Mutex::new))
            .collect::<Result<_, _>>()?;
        let steering = crate::steering::PortSteering::new(qps as u16, &cfg.flow_rules)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        Ok(PortShared {
            steering,
            index,
            mac: Mutex::new(cfg.mac),
            active_qps: AtomicU16::new(qps as u16),
            cfg,
            connected: AtomicBool::new(false),
            connections: AtomicU64::new(0),
            features: AtomicU64::new(0),
            rxq,
            ctrl_errors: AtomicU64::new(0),
            log: LogLimiter::default(),
            tx_resume,
            tx_timer,
            tx_pauses: AtomicU64::new(0),
            protocol_errors: AtomicU64::new(0),
            is_host: false,
            rdma_companion: OnceLock::new(),
        })
    }

    /// The attachment of a virtual host: one always-connected queue pair
    /// whose "guest" is the host thread.
    pub fn new_host(index: usize, name: &str, mac: MacAddr) -> std::io::Result<Self> {
        let mut cfg = PortConfig::new(name, "");
        cfg.mac = mac;
        let mut p = PortShared::new(index, cfg)?;
        p.is_host = true;
        p.connected = AtomicBool::new(true);
        p.rxq[0].enabled.store(true, Relaxed);
        Ok(p)
    }

    /// The attachment of an emulated PCI device (`kind=gve`): one pending
    /// queue towards the device (which steers to its own queues), always
    /// attached; the device refuses what it cannot take yet.
    pub fn new_device(index: usize, cfg: &PortConfig) -> std::io::Result<Self> {
        let mut one = cfg.clone();
        one.queue_pairs = 1;
        let mut p = PortShared::new(index, one)?;
        // The device's own queue count (its RSS and rules pick among them).
        p.cfg.queue_pairs = cfg.queue_pairs;
        p.connected.store(true, Relaxed);
        p.rxq[0].enabled.store(true, Relaxed);
        Ok(p)
    }

    fn has(&self, f: u32) -> bool {
        self.features.load(Relaxed) & bit(f) != 0
    }

    /// Turns a frame into what this port's guest accepts: passes offloaded
    /// frames through when the guest negotiated the matching feature, and
    /// finishes them in software otherwise.
    pub fn adapt(&self, f: &Frame) -> Result<Vec<Frame>, offload::OffloadError> {
        let h = f.hdr;
        if h.gso_kind() != VIRTIO_NET_HDR_GSO_NONE as u8 {
            let ok = match u32::from(h.gso_kind()) {
                VIRTIO_NET_HDR_GSO_TCPV4 => self.has(VIRTIO_NET_F_GUEST_TSO4),
                VIRTIO_NET_HDR_GSO_TCPV6 => self.has(VIRTIO_NET_F_GUEST_TSO6),
                _ => false,
            } && (!h.gso_ecn() || self.has(VIRTIO_NET_F_GUEST_ECN))
                && self.has(VIRTIO_NET_F_GUEST_CSUM);
            if ok {
                return Ok(vec![f.clone()]);
            }
            let segs = offload::segment_tcp(&f.data, &h)?;
            return Ok(segs
                .into_iter()
                .map(|data| Frame {
                    hdr: NetHdr::default(),
                    data,
                })
                .collect());
        }
        if h.needs_csum() && !self.has(VIRTIO_NET_F_GUEST_CSUM) {
            let mut data = f.data.clone();
            offload::finish_csum(&mut data, h.csum_start, h.csum_offset)?;
            return Ok(vec![Frame {
                hdr: NetHdr::default(),
                data,
            }]);
        }
        let mut out = f.clone();
        if !self.has(VIRTIO_NET_F_GUEST_CSUM) {
            out.hdr = NetHdr::default();
        }
        Ok(vec![out])
    }

    /// Chooses the RX queue pair for a frame (`None`: a flow rule drops
    /// it): flow rules, then RSS when the guest configured it, else a flow
    /// hash over the enabled, active queue pairs, so one flow stays on one
    /// queue. Also gives the hash for the RX header.
    pub fn steer(&self, data: &[u8]) -> crate::steering::Steer {
        let active = usize::from(self.active_qps.load(Relaxed));
        self.steering.steer(data, active, |q| {
            self.rxq.get(q).is_some_and(|r| r.enabled.load(Relaxed))
        })
    }

    /// Counter snapshot.
    pub fn stats(&self) -> PortStats {
        let mut s = PortStats {
            name: self.cfg.name.clone(),
            socket: self.cfg.socket.display().to_string(),
            mac: self.mac.lock().map(|m| m.to_string()).unwrap_or_default(),
            form: match self.cfg.form {
                _ if self.is_host => "host".into(),
                _ if self.cfg.kind == PortKind::Gve => "gve".into(),
                _ if self.cfg.kind == PortKind::Erdma => "erdma".into(),
                _ if self.cfg.kind == PortKind::Vxlan => "vxlan".into(),
                _ if self.cfg.kind == PortKind::Tap => "tap".into(),
                DeviceForm::VirtioNetPci => "pci".into(),
                DeviceForm::TestDevice => "testdev".into(),
            },
            connected: self.connected.load(Relaxed),
            connections: self.connections.load(Relaxed),
            features: self.features.load(Relaxed),
            queue_pairs: self.cfg.queue_pairs,
            active_queue_pairs: self.active_qps.load(Relaxed),
            ctrl_errors: self.ctrl_errors.load(Relaxed),
            tx_pauses: self.tx_pauses.load(Relaxed),
            protocol_errors: self.protocol_errors.load(Relaxed),
            queues: self.rxq.iter().map(|q| q.counters.snapshot()).collect(),
            ..Default::default()
        };
        s.sum_queues();
        s
    }
}

/// The L2 switch.
#[derive(Debug)]
pub struct Fabric {
    pub ports: Vec<Arc<PortShared>>,
    macs: RwLock<HashMap<[u8; 6], usize>>,
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
}

impl Fabric {
    /// A fabric over the given ports, with default [`Limits`](crate::config::Limits).
    pub fn new(ports: Vec<Arc<PortShared>>) -> Self {
        Self::with_limits(ports, crate::config::Limits::default())
    }

    /// A fabric over the given ports with the given table bounds.
    pub fn with_limits(ports: Vec<Arc<PortShared>>, limits: crate::config::Limits) -> Self {
        let faults = crate::faults::Faults::new(ports.iter().map(|p| p.cfg.name.clone()).collect());
        faults.set_max_rules(limits.fault_rules);
        let capture = crate::capture::Capture::default();
        capture.set_max_bytes(limits.capture_max_bytes);
        // Threads that may pass a queue's room check just before another
        // fills it: every TX worker and virtual host, and the fault timer.
        let senders: usize = ports
            .iter()
            .map(|p| usize::from(p.cfg.queue_pairs.max(1)))
            .sum::<usize>()
            + 1;
        for q in ports.iter().flat_map(|p| p.rxq.iter()) {
            q.set_headroom(senders);
        }
        // An erdma function and its guest's virtio-net port share a MAC.
        for r in ports.iter().filter(|p| p.cfg.kind == PortKind::Erdma) {
            let nd = r.cfg.netdev.as_deref();
            if let Some(n) = ports.iter().find(|p| Some(p.cfg.name.as_str()) == nd) {
                let _ = n.rdma_companion.set(r.index);
            }
        }
        Fabric {
            faults,
            capture,
            checker: crate::checker::FabricChecker::default(),
            ports,
            macs: RwLock::new(HashMap::new()),
            mac_table_full: AtomicU64::new(0),
            neighbors: crate::neighbors::NeighborTable::new(limits.mac_table),
            rdma_unresolved: AtomicU64::new(0),
            control_refused: AtomicU64::new(0),
            flow_rules_refused: AtomicU64::new(0),
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
            .spawn(move || me.faults.run_timer(|r| me.resume(r)))
    }

    /// Ends the fault timer thread.
    pub fn stop_fault_timer(&self) {
        self.faults.stop_timer();
    }

    /// A frame a fault rule held comes back.
    fn resume(&self, r: crate::faults::Released) {
        let (port, dir) = (r.port, r.dir);
        for f in self.faults.apply_after(r) {
            match dir {
                crate::frame::Dir::Egress => {
                    self.deliver_now(port, &f);
                }
                _ => {
                    self.switch(port, f);
                }
            }
        }
    }

    /// The port named `name`.
    pub fn port_by_name(&self, name: &str) -> Result<&PortShared, String> {
        self.ports
            .iter()
            .find(|p| p.cfg.name == name)
            .map(|p| &**p)
            .ok_or_else(|| format!("no port named {name:?}"))
    }

    /// Forgets what was learned on a port (its guest went away).
    pub fn forget_port(&self, port: usize) {
        if let Ok(mut m) = self.macs.write() {
            m.retain(|_, p| *p != port);
        }
    }

    fn learn(&self, src: [u8; 6], port: usize) {
        if src[0] & 1 != 0 {
            return;
        }
        if let Ok(m) = self.macs.read() {
            if m.get(&src) == Some(&port) {
                return;
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
                return;
            }
            m.insert(src, port);
        }
    }

    /// The receive queue a unicast frame from `src` would wait for, if that
    /// queue is congested (back-pressure). Flooded frames never wait.
    pub fn congested_queue(&self, src: usize, data: &[u8]) -> Option<&RxQueue> {
        let dst: [u8; 6] = data.get(0..6)?.try_into().ok()?;
        if dst[0] & 1 != 0 {
            return None;
        }
        let p = self.macs.read().ok()?.get(&dst).copied()?;
        let p = self.rdma_target(p, data);
        let port = self.ports.get(p).filter(|_| p != src)?;
        if !port.connected.load(Relaxed) {
            return None;
        }
        let q = port.rxq.get(port.steer(data).queue?)?;
        q.congested().then_some(q)
    }

    /// Switches a frame a guest sent on port `src`. Returns how many copies
    /// were queued.
    pub fn forward(&self, src: usize, mut frame: Frame) -> usize {
        if frame.data.len() < 14 {
            return 0;
        }
        if self
            .ports
            .get(src)
            .is_some_and(|p| p.cfg.kind == PortKind::Erdma)
        {
            // delivered by IP when the QP's address vector has no MAC
            if !self.neighbors.fill_zero_dmac(&mut frame.data) {
                self.rdma_unresolved.fetch_add(1, Relaxed);
                if let Some(p) = self.ports.get(src) {
                    crate::guest_warn!(p.log, port = %p.cfg.name,
                        "RDMA frame to MAC 00:00:00:00:00:00 and an IPv4 address no ARP on the fabric announced: dropped");
                }
                return 0;
            }
        } else {
            self.neighbors.observe(&frame.data);
        }
        self.capture
            .record(src, crate::frame::Dir::Ingress, &frame.data);
        // The checker sees what the guest sent, before any fault acts.
        if let Some(p) = self.ports.get(src) {
            self.checker.observe(&p.cfg.name, &frame.data);
        }
        if self.faults.active() {
            return self
                .faults
                .apply(src, crate::frame::Dir::Ingress, frame)
                .into_iter()
                .map(|f| self.switch(src, f))
                .sum();
        }
        self.switch(src, frame)
    }

    /// Where a frame for port `p` goes: its erdma function for RoCEv2, else `p`.
    fn rdma_target(&self, p: usize, data: &[u8]) -> usize {
        match self.ports.get(p).and_then(|x| x.rdma_companion.get()) {
            Some(&r) if crate::frame::is_rocev2(data) => r,
            _ => p,
        }
    }

    /// Switches a frame past ingress faults.
    fn switch(&self, src: usize, frame: Frame) -> usize {
        let mut dst = [0u8; 6];
        dst.copy_from_slice(&frame.data[0..6]);
        let mut smac = [0u8; 6];
        smac.copy_from_slice(&frame.data[6..12]);
        // An erdma function sends with its netdev's MAC: the netdev port
        // owns the MAC in the table, RoCEv2 goes to the function (below).
        if self
            .ports
            .get(src)
            .is_some_and(|p| p.cfg.kind != PortKind::Erdma)
        {
            self.learn(smac, src);
        }
        let known = if dst[0] & 1 == 0 {
            self.macs.read().ok().and_then(|m| m.get(&dst).copied())
        } else {
            None
        };
        let known = known.map(|p| self.rdma_target(p, &frame.data));
        match known {
            Some(p) if p == src => 0,
            Some(p) => self.deliver(p, &frame),
            None => (0..self.ports.len())
                .filter(|&p| p != src)
                .map(|p| self.deliver(p, &frame))
                .sum(),
        }
    }

    fn deliver(&self, port: usize, frame: &Frame) -> usize {
        if self.faults.active() {
            if !self
                .ports
                .get(port)
                .is_some_and(|p| p.connected.load(Relaxed))
            {
                return 0;
            }
            return self
                .faults
                .apply(port, crate::frame::Dir::Egress, frame.clone())
                .iter()
                .map(|f| self.deliver_now(port, f))
                .sum();
        }
        self.deliver_now(port, frame)
    }

    /// Queues a frame for a port past egress faults.
    fn deliver_now(&self, port: usize, frame: &Frame) -> usize {
        let Some(dst) = self.ports.get(port) else {
            return 0;
        };
        if !dst.connected.load(Relaxed) {
            return 0;
        }
        let s = dst.steer(&frame.data);
        let report = dst.has(VIRTIO_NET_F_HASH_REPORT);
        dst.steering.record(&s, report && s.hash_report != 0);
        let Some(q) = s.queue else {
            return 0;
        };
        let frames = match dst.adapt(frame) {
            Ok(f) => f,
            Err(e) => {
                // Validated at TX already; this would be our own bug. Count it.
                let q = &dst.rxq[0];
                QueueCounters::add(&q.counters.rx_drops, 1);
                crate::guest_warn!(dst.log, port = %dst.cfg.name, "cannot finish offloads of frame: {e}");
                return 0;
            }
        };
        let Some(r) = dst.rxq.get(q) else {
            return 0;
        };
        let mut frames = frames;
        for f in &mut frames {
            if report {
                f.hdr.hash_value = s.hash_value;
                f.hdr.hash_report = s.hash_report;
            }
            self.capture
                .record(port, crate::frame::Dir::Egress, &f.data);
        }
        r.push_all(frames)
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
        let q = RxQueue::new(4).unwrap();
        for t in 0..4 {
            assert_eq!(q.push_all(vec![frame(t)]), 1);
        }
        assert!(q.congested());
        let head = q.pop().unwrap();
        assert!(q.congested(), "a popped frame left room that is not there");
        q.unpop(head);
        assert!(q.congested());
        // Delivered (the next pop): now there is room.
        let _delivered = q.pop();
        let _next = q.pop();
        assert_eq!(q.len(), 2);
        assert!(!q.congested());
    }

    /// Senders that checked for room just before another filled the queue
    /// get their frame in (headroom); past it frames drop, counted; the
    /// segments of one frame go all or none.
    #[test]
    fn headroom_for_racing_senders_then_counted_drops() {
        let q = RxQueue::new(4).unwrap();
        q.set_headroom(2);
        for t in 0..6 {
            assert_eq!(q.push_all(vec![frame(t)]), 1, "frame {t}");
        }
        assert_eq!(q.push_all(vec![frame(6)]), 0);
        assert_eq!(q.counters.snapshot().rx_drops, 1);
        while q.pop().is_some() {}
        let segments: Vec<Frame> = (0..10).map(frame).collect();
        assert_eq!(
            q.push_all(segments),
            10,
            "segments of one frame go together"
        );
        assert_eq!(q.push_all(vec![frame(11), frame(12)]), 0);
        assert_eq!(q.counters.snapshot().rx_drops, 3);
    }
}

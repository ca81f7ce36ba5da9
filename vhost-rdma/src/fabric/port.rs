//! A port as the switch sees it: [`PortShared`], the state the fabric and
//! the port's own threads share, and [`PortProfile`], what its kind tells
//! the switch.

use super::RxOffloads;
use super::RxQueue;
use crate::config::{MacAddr, PortConfig};
use crate::frame::{FrameView, LazyView};
use crate::stats::{LogLimiter, PortStats, StuckGuest};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, AtomicU8, Ordering::*};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use vmm_sys_util::timerfd::TimerFd;

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
    /// What receives the port's frames reads their headers (a device model,
    /// a virtual host): the fabric hands it the view it parsed with each
    /// frame, so the frame is not parsed again. A guest's virtio-net port
    /// or an uplink only moves bytes: its frames go without.
    pub reads_headers: bool,
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
            reads_headers: false,
        }
    }
}

/// State of one port shared by the fabric and the port's own threads (a
/// vhost-user backend, a device pump, a host or an uplink); it outlives
/// guest connections. Its fields are private: the port's threads and the
/// control socket use the methods below.
#[derive(Debug)]
pub struct PortShared {
    index: usize,
    cfg: PortConfig,
    /// How the switch treats this port (given by its kind).
    profile: PortProfile,
    /// A guest is attached (always, for an always-attached port). The
    /// fabric's batches hold a reference to it (`Batch`), hence `pub(super)`.
    pub(super) connected: AtomicBool,
    connections: AtomicU64,
    /// Features the connected guest negotiated (a virtio-net port's; 0 for
    /// the others), shown in `ctl status`: the switch does not read them.
    features: AtomicU64,
    /// The offloads the receiver takes as they are ([`RxOffloads`] bits),
    /// which its port sets (with `features`); read per delivered frame.
    rx_offloads: AtomicU8,
    /// Queue pairs the guest uses (control queue MQ command; all in the pci form).
    active_qps: AtomicU16,
    /// The MAC the guest set through the control queue (test-device form).
    mac: Mutex<MacAddr>,
    rxq: Vec<RxQueue>,
    ctrl_errors: AtomicU64,
    log: LogLimiter,
    /// Per queue pair: wakes the TX side after back-pressure.
    tx_resume: Vec<Arc<EventFd>>,
    /// Per queue pair: retries a paused TX side in case its receiver stalls.
    tx_timer: Vec<Mutex<TimerFd>>,
    /// Times this port's TX paused for a full receiver.
    tx_pauses: AtomicU64,
    /// vhost-user connections ended by a refused or malformed request.
    protocol_errors: AtomicU64,
    /// Flow rules, RSS and hash reporting (`steering`).
    steering: crate::steering::PortSteering,
    /// The port whose profile names this one in `rdma_function_of` (an
    /// erdma function paired with this virtio-net port): RoCEv2 frames to
    /// this port's MAC go there. The switch's own (set when it is built).
    pub(super) rdma_companion: OnceLock<usize>,
    /// The source MAC this port last learned and the MAC table's generation
    /// then, plus one (0: none); `Fabric::learn_from`'s shortcut, the
    /// switch's own.
    pub(super) learned: AtomicU64,
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
            rx_offloads: AtomicU8::new(RxOffloads::NONE.bits()),
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

    /// The port's place in the fabric (`Fabric::ports`).
    pub fn index(&self) -> usize {
        self.index
    }

    /// The port's configuration.
    pub fn cfg(&self) -> &PortConfig {
        &self.cfg
    }

    /// How the switch treats this port.
    pub fn profile(&self) -> &PortProfile {
        &self.profile
    }

    /// Whether a guest is attached (always, for an always-attached port).
    pub fn is_connected(&self) -> bool {
        self.connected.load(Relaxed)
    }

    /// A guest connected; returns its connection's number (from 1).
    pub fn connect(&self) -> u64 {
        self.connected.store(true, SeqCst);
        self.connections.fetch_add(1, SeqCst) + 1
    }

    /// The guest went away (its frames are the caller's to clear).
    pub fn disconnect(&self) {
        self.connected.store(false, SeqCst);
    }

    /// Features the connected guest negotiated (0 if none, or not a
    /// virtio-net port).
    pub fn features(&self) -> u64 {
        self.features.load(Relaxed)
    }

    /// The guest negotiated `features`, which let its receiver take `rx` as
    /// they are (the port's kind translates: `ports::virtio_net`).
    pub fn set_features(&self, features: u64, rx: RxOffloads) {
        self.features.store(features, Relaxed);
        self.rx_offloads.store(rx.bits(), Relaxed);
    }

    /// The offloads the port's receiver takes as they are.
    pub fn rx_offloads(&self) -> RxOffloads {
        RxOffloads::from_bits(self.rx_offloads.load(Relaxed))
    }

    /// Queue pairs the guest uses.
    pub fn active_qps(&self) -> u16 {
        self.active_qps.load(Relaxed)
    }

    /// Sets the queue pairs the guest uses (its MQ or RSS command, a reset).
    pub fn set_active_qps(&self, n: u16) {
        self.active_qps.store(n, Relaxed);
    }

    /// The port's MAC (the guest may set it through its control queue).
    pub fn mac(&self) -> MacAddr {
        self.mac
            .lock()
            .map(|m| *m)
            .unwrap_or_else(|e| *e.into_inner())
    }

    /// The guest set the port's MAC.
    pub fn set_mac(&self, mac: MacAddr) {
        if let Ok(mut m) = self.mac.lock() {
            *m = mac;
        }
    }

    /// The port's receive queues, one per queue pair (one for an
    /// always-attached port).
    pub fn rx_queues(&self) -> &[RxQueue] {
        &self.rxq
    }

    /// Per queue pair: the eventfd that wakes the TX side after back-pressure.
    pub fn tx_resume(&self) -> &[Arc<EventFd>] {
        &self.tx_resume
    }

    /// Per queue pair: the timer that retries a paused TX side in case its
    /// receiver stalls.
    pub fn tx_timers(&self) -> &[Mutex<TimerFd>] {
        &self.tx_timer
    }

    /// The port's limiter of warnings a guest can cause (`guest_warn!`).
    pub fn log(&self) -> &LogLimiter {
        &self.log
    }

    /// Flow rules, RSS and hash reporting.
    pub fn steering(&self) -> &crate::steering::PortSteering {
        &self.steering
    }

    /// Counts a refused control-queue command.
    pub fn count_ctrl_error(&self) {
        self.ctrl_errors.fetch_add(1, Relaxed);
    }

    /// Counts a pause of the port's TX for a full receiver.
    pub fn count_tx_pause(&self) {
        self.tx_pauses.fetch_add(1, Relaxed);
    }

    /// Counts a vhost-user connection ended by a refused or malformed request.
    pub fn count_protocol_error(&self) {
        self.protocol_errors.fetch_add(1, SeqCst);
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
    pub(super) fn steer_lazy(&self, data: &[u8], v: &LazyView) -> crate::steering::Steer {
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
            mac: self.mac().to_string(),
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

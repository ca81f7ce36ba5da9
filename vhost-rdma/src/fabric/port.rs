//! A port as the switch sees it: [`PortShared`], the state the fabric and
//! the port's own threads share, and [`PortProfile`], what its kind tells
//! the switch.

use super::batch::Adapted;
use super::RxQueue;
use crate::config::{MacAddr, PortConfig};
use crate::frame::{Frame, FrameView, LazyView};
use crate::offload;
use crate::stats::{LogLimiter, PortStats, StuckGuest};
use crate::virtio_net::{bit, NetHdr};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering::*};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;
use virtio_bindings::bindings::virtio_net::*;
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

    pub(super) fn has(&self, f: u32) -> bool {
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

//! `virtual-host`: a sans-IO host on the fabric that unmodified RDMA tools in
//! a guest can talk to.
//!
//! Ethernet frames go in ([`VirtualHost::handle_frame`]), frames come out
//! ([`VirtualHost::poll_transmit`]), time is passed in, and the caller asks
//! when to call back ([`VirtualHost::poll_timeout`]). Inside:
//!
//! * ARP, ICMP echo and TCP come from smoltcp (an [`smoltcp::iface::Interface`]
//!   over an in-memory device);
//! * RoCEv2 (UDP 4791) bypasses smoltcp and goes to roce-model RC queue pairs
//!   ([`rdma::RdmaDevice`]), with the ICRC checked and sealed here;
//! * services ([`service`]) speak the RDMA tools' application protocols on top
//!   (`ibv_rc_pingpong` and perftest's `ib_{write,send,read,atomic}_bw`,
//!   each as server and as client).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod endpoint;
pub mod iwarp;
pub mod perftest;
pub mod perftest_cm;
pub mod pingpong;
pub mod rdma;
pub mod rping;
pub mod service;
pub mod spec;

use smoltcp::iface::{Config, Interface, SocketSet};
use smoltcp::phy::{Device, DeviceCapabilities, Medium};
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpCidr, Ipv4Address};
use std::collections::VecDeque;
use std::fmt;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

pub use rdma::RdmaDevice;
pub use service::{ServiceKind, ServiceSpec, ServiceStatus};

/// Frames waiting to leave a host; more are dropped (counted).
const TX_QUEUE_LIMIT: usize = 4096;
/// Events kept for the caller; older ones are dropped first.
const EVENT_LIMIT: usize = 256;
/// Largest Ethernet frame (no FCS) the host sends or accepts.
pub const MAX_FRAME: usize = 1514;
/// A half-open TCP connection (SYN received, our SYN+ACK never acknowledged)
/// is reset after this long: a service listens on one socket, and a spoofed
/// SYN must not hold it forever.
pub const SYN_RECEIVED_TIMEOUT: Duration = Duration::from_secs(5);

/// Per-host resource limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostLimits {
    /// Queue pairs at once.
    pub max_qps: usize,
    /// Memory regions at once.
    pub max_mrs: usize,
    /// Bytes registered at once.
    pub max_mr_bytes: usize,
    /// TCP sockets at once (each service holds one or two).
    pub max_tcp_sockets: usize,
    /// Services at once.
    pub max_services: usize,
}

impl Default for HostLimits {
    fn default() -> Self {
        HostLimits {
            max_qps: 64,
            max_mrs: 128,
            max_mr_bytes: 64 << 20,
            max_tcp_sockets: 32,
            max_services: 16,
        }
    }
}

/// What a virtual host is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostConfig {
    /// Name (for logs and status).
    pub name: String,
    /// MAC address (unicast).
    pub mac: [u8; 6],
    /// IPv4 address.
    pub ipv4: Ipv4Addr,
    /// Prefix length of the on-link subnet.
    pub prefix_len: u8,
    /// Resource limits.
    pub limits: HostLimits,
    /// Seed for keys, QP numbers, PSNs and TCP sequence numbers.
    pub seed: u64,
}

/// Errors of host operations.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HostError {
    /// A per-host resource limit was reached.
    #[error("limit reached: at most {limit} {what} per virtual host")]
    Limit {
        /// Which resource.
        what: &'static str,
        /// The limit.
        limit: usize,
    },
    /// Bad configuration or service parameters.
    #[error("invalid {0}")]
    Invalid(String),
    /// The RDMA engine refused an operation.
    #[error("rdma: {0}")]
    Rdma(String),
    /// No such queue pair.
    #[error("no queue pair {0:#x}")]
    NoSuchQp(u32),
    /// A TCP operation failed.
    #[error("tcp: {0}")]
    Tcp(String),
    /// No such service.
    #[error("no service {0}")]
    NoSuchService(u32),
}

/// Counters of one host.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostCounters {
    /// Frames handed to the host.
    pub rx_frames: u64,
    /// Frames the host sent.
    pub tx_frames: u64,
    /// Frames not for this host's MAC (ignored).
    pub rx_not_for_us: u64,
    /// Frames longer than [`MAX_FRAME`] or shorter than an Ethernet header.
    pub rx_bad_length: u64,
    /// RoCE packets accepted by a QP.
    pub roce_rx: u64,
    /// RoCE packets sent.
    pub roce_tx: u64,
    /// RoCE frames that failed to parse.
    pub roce_malformed: u64,
    /// RoCE frames with a bad ICRC.
    pub roce_icrc_errors: u64,
    /// RoCE frames for no QP of ours (or from the wrong address).
    pub roce_no_qp: u64,
    /// RoCE packets the QP engine refused, or could not be framed.
    pub roce_dropped: u64,
    /// RoCE packets dropped for want of the peer's MAC.
    pub roce_tx_no_neighbor: u64,
    /// ARP requests the RoCE side sent.
    pub arp_requests_sent: u64,
    /// Frames dropped because the transmit queue was full.
    pub tx_queue_drops: u64,
    /// Events dropped because nobody read them.
    pub events_dropped: u64,
    /// Half-open TCP connections reset after [`SYN_RECEIVED_TIMEOUT`].
    pub tcp_half_open_reset: u64,
}

/// Something a service reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostEvent {
    /// The service.
    pub service: u32,
    /// What happened.
    pub kind: EventKind,
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventKind {
    /// A session with a peer began (TCP exchange done, QP connected).
    SessionStarted {
        /// The peer.
        peer: Ipv4Addr,
        /// Our QP number.
        qpn: u32,
        /// The peer's QP number.
        remote_qpn: u32,
    },
    /// A session completed every iteration.
    SessionFinished {
        /// The peer.
        peer: Ipv4Addr,
        /// Iterations completed (both directions).
        iterations: u32,
        /// Received messages whose content was checked and matched.
        verified: u32,
        /// Wall time of the RDMA phase.
        elapsed: Duration,
    },
    /// A session failed.
    SessionFailed {
        /// The peer, when known.
        peer: Option<Ipv4Addr>,
        /// Why.
        reason: String,
    },
}

impl fmt::Display for HostEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            EventKind::SessionStarted {
                peer,
                qpn,
                remote_qpn,
            } => write!(
                f,
                "service {}: session with {peer} started (qpn {qpn:#x}, remote qpn {remote_qpn:#x})",
                self.service
            ),
            EventKind::SessionFinished {
                peer,
                iterations,
                verified,
                elapsed,
            } => write!(
                f,
                "service {}: session with {peer} finished: {iterations} iterations, {verified} messages verified, {:.3} s",
                self.service,
                elapsed.as_secs_f64()
            ),
            EventKind::SessionFailed { peer, reason } => match peer {
                Some(p) => write!(f, "service {}: session with {p} failed: {reason}", self.service),
                None => write!(f, "service {}: failed: {reason}", self.service),
            },
        }
    }
}

/// A snapshot of a host for status displays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostStatus {
    /// Name.
    pub name: String,
    /// MAC.
    pub mac: [u8; 6],
    /// IPv4 address.
    pub ipv4: Ipv4Addr,
    /// Prefix length.
    pub prefix_len: u8,
    /// Counters.
    pub counters: HostCounters,
    /// Queue pairs in use.
    pub qps: usize,
    /// Memory regions in use.
    pub mrs: usize,
    /// TCP sockets in use.
    pub tcp_sockets: usize,
    /// Services.
    pub services: Vec<ServiceStatus>,
}

/// The in-memory device smoltcp reads and writes.
#[derive(Default)]
struct FrameQueue {
    rx: VecDeque<Vec<u8>>,
    tx: VecDeque<Vec<u8>>,
    tx_drops: u64,
}

struct RxTok(Vec<u8>);
struct TxTok<'a>(&'a mut FrameQueue);

impl smoltcp::phy::RxToken for RxTok {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(&self.0)
    }
}

impl smoltcp::phy::TxToken for TxTok<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut buf = vec![0u8; len];
        let r = f(&mut buf);
        if self.0.tx.len() < TX_QUEUE_LIMIT {
            self.0.tx.push_back(buf);
        } else {
            self.0.tx_drops += 1;
        }
        r
    }
}

impl Device for FrameQueue {
    type RxToken<'a> = RxTok;
    type TxToken<'a> = TxTok<'a>;

    fn receive(
        &mut self,
        _timestamp: smoltcp::time::Instant,
    ) -> Option<(Self::RxToken<'_>, Self::TxToken<'_>)> {
        let f = self.rx.pop_front()?;
        Some((RxTok(f), TxTok(self)))
    }

    fn transmit(&mut self, _timestamp: smoltcp::time::Instant) -> Option<Self::TxToken<'_>> {
        Some(TxTok(self))
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut c = DeviceCapabilities::default();
        c.medium = Medium::Ethernet;
        c.max_transmission_unit = MAX_FRAME;
        c
    }
}

/// The parts a service works with.
pub struct ServiceCtx<'a> {
    /// smoltcp interface (for `connect`).
    pub iface: &'a mut Interface,
    /// TCP sockets.
    pub sockets: &'a mut SocketSet<'static>,
    /// The RDMA device.
    pub rdma: &'a mut RdmaDevice,
    /// The host's address.
    pub ip: Ipv4Addr,
    /// The current time.
    pub now: Instant,
    /// Where services report.
    pub events: &'a mut Vec<HostEvent>,
    /// Per-host limits.
    pub limits: HostLimits,
    /// Random source.
    pub rng: &'a mut Rng,
}

impl ServiceCtx<'_> {
    /// A new TCP socket, within the host's limit.
    pub fn new_tcp_socket(&mut self) -> Result<smoltcp::iface::SocketHandle, HostError> {
        self.new_tcp_socket_sized(4096)
    }

    /// A new TCP socket with `buf` bytes of receive and of send buffer and
    /// no delayed ACKs, for bulk transfers: with a small window, every
    /// window waits out smoltcp's 10 ms ACK delay.
    pub fn new_bulk_tcp_socket(
        &mut self,
        buf: usize,
    ) -> Result<smoltcp::iface::SocketHandle, HostError> {
        let h = self.new_tcp_socket_sized(buf)?;
        self.sockets
            .get_mut::<smoltcp::socket::tcp::Socket>(h)
            .set_ack_delay(None);
        Ok(h)
    }

    fn new_tcp_socket_sized(
        &mut self,
        buf: usize,
    ) -> Result<smoltcp::iface::SocketHandle, HostError> {
        if self.sockets.iter().count() >= self.limits.max_tcp_sockets {
            return Err(HostError::Limit {
                what: "TCP sockets",
                limit: self.limits.max_tcp_sockets,
            });
        }
        let s = smoltcp::socket::tcp::Socket::new(
            smoltcp::socket::tcp::SocketBuffer::new(vec![0u8; buf]),
            smoltcp::socket::tcp::SocketBuffer::new(vec![0u8; buf]),
        );
        Ok(self.sockets.add(s))
    }
}

/// A small xorshift generator (PSNs, ports); not for secrets.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// Seeded generator (a zero seed is replaced).
    pub fn new(seed: u64) -> Self {
        Rng(seed | 1)
    }
    /// Next value.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
}

/// A virtual host.
pub struct VirtualHost {
    cfg: HostConfig,
    base: Instant,
    iface: Interface,
    sockets: SocketSet<'static>,
    dev: FrameQueue,
    rdma: RdmaDevice,
    services: Vec<service::Service>,
    next_service: u32,
    events: VecDeque<HostEvent>,
    counters: HostCounters,
    rng: Rng,
    /// TCP sockets seen in SYN-RECEIVED, and since when.
    half_open: Vec<(smoltcp::iface::SocketHandle, Instant)>,
}

impl VirtualHost {
    /// Creates a host; `now` starts its clock.
    pub fn new(cfg: HostConfig, now: Instant) -> Result<Self, HostError> {
        if cfg.mac[0] & 1 != 0 || cfg.mac == [0; 6] {
            return Err(HostError::Invalid(format!(
                "MAC {:02x?} (must be unicast)",
                cfg.mac
            )));
        }
        if cfg.prefix_len == 0 || cfg.prefix_len > 32 {
            return Err(HostError::Invalid(format!(
                "prefix length {} (1..=32)",
                cfg.prefix_len
            )));
        }
        if cfg.ipv4.is_unspecified() || cfg.ipv4.is_multicast() || cfg.ipv4.is_broadcast() {
            return Err(HostError::Invalid(format!("address {}", cfg.ipv4)));
        }
        let mut dev = FrameQueue::default();
        let mut icfg = Config::new(HardwareAddress::Ethernet(EthernetAddress(cfg.mac)));
        icfg.random_seed = cfg.seed;
        let mut iface = Interface::new(icfg, &mut dev, smoltcp::time::Instant::ZERO);
        let o = cfg.ipv4.octets();
        iface.update_ip_addrs(|a| {
            let _ = a.push(IpCidr::new(
                Ipv4Address::new(o[0], o[1], o[2], o[3]).into(),
                cfg.prefix_len,
            ));
        });
        let rdma = RdmaDevice::new(cfg.mac, cfg.ipv4, cfg.limits, cfg.seed);
        Ok(VirtualHost {
            rng: Rng::new(cfg.seed ^ 0x9e37_79b9_7f4a_7c15),
            base: now,
            iface,
            sockets: SocketSet::new(Vec::new()),
            dev,
            rdma,
            services: Vec::new(),
            next_service: 1,
            events: VecDeque::new(),
            counters: HostCounters::default(),
            half_open: Vec::new(),
            cfg,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &HostConfig {
        &self.cfg
    }

    /// The RDMA device (queue pairs, memory regions).
    pub fn rdma(&self) -> &RdmaDevice {
        &self.rdma
    }

    /// The RDMA device, to create QPs and MRs by hand (tests, hostile-peer
    /// checks); frames its QPs produce leave through [`VirtualHost::poll_transmit`]
    /// after the next `handle_frame` / `handle_timeout`.
    pub fn rdma_mut(&mut self) -> &mut RdmaDevice {
        &mut self.rdma
    }

    fn stime(&self, now: Instant) -> smoltcp::time::Instant {
        smoltcp::time::Instant::from_micros(
            now.saturating_duration_since(self.base).as_micros() as i64
        )
    }

    /// Starts a service; returns its id.
    pub fn start_service(&mut self, spec: ServiceSpec, now: Instant) -> Result<u32, HostError> {
        if self.services.len() >= self.cfg.limits.max_services {
            return Err(HostError::Limit {
                what: "services",
                limit: self.cfg.limits.max_services,
            });
        }
        spec.validate()?;
        let id = self.next_service;
        self.next_service += 1;
        let mut events = Vec::new();
        let svc = service::Service::start(id, spec, &mut self.service_ctx(now, &mut events))?;
        self.services.push(svc);
        self.push_events(events);
        self.process(now);
        Ok(id)
    }

    /// Stops and removes a service.
    pub fn stop_service(&mut self, id: u32, now: Instant) -> Result<(), HostError> {
        let i = self
            .services
            .iter()
            .position(|s| s.id() == id)
            .ok_or(HostError::NoSuchService(id))?;
        let mut s = self.services.remove(i);
        s.teardown(&mut self.sockets, &mut self.rdma, now);
        self.process(now);
        Ok(())
    }

    /// Feeds one Ethernet frame (no FCS) from the fabric, parsing it
    /// (`wire::parse`): for a caller without its view;
    /// [`VirtualHost::handle_parsed`] takes the view the fabric made.
    pub fn handle_frame(&mut self, frame: &[u8], now: Instant) {
        self.handle_parsed(frame, None, now)
    }

    /// Feeds one Ethernet frame (no FCS) from the fabric with its view
    /// (`wire::parse(frame)`), when the fabric parsed it on its way: then
    /// the host reads the headers from it and parses nothing again. None:
    /// parsed here, once, if the frame is for this host.
    pub fn handle_parsed(&mut self, frame: &[u8], view: Option<&wire::ParsedFrame>, now: Instant) {
        self.counters.rx_frames += 1;
        if frame.len() < 14 || frame.len() > MAX_FRAME + 4 {
            self.counters.rx_bad_length += 1;
            return;
        }
        let dst = &frame[0..6];
        if dst != self.cfg.mac && dst[0] & 1 == 0 {
            self.counters.rx_not_for_us += 1;
            return;
        }
        let view = match view {
            Some(v) => *v,
            None => wire::parse(frame),
        };
        // Tagged frames are smoltcp's (the engines take untagged RoCEv2).
        let untagged = view.l2.is_some_and(|l2| l2.vlan.is_none());
        match view.l3 {
            None if untagged && view.ethertype() == Some(wire::ethernet::ETHERTYPE_ARP) => {
                // ARP: remember the sender for RoCE; smoltcp answers.
                if let Some(arp) = wire::arp::Arp::parse_frame(frame) {
                    let ip = Ipv4Addr::from(arp.sender_ip);
                    if self.on_link(ip) {
                        self.rdma.neighbors.learn(ip, arp.sender_mac);
                    }
                }
            }
            Some(wire::parse::L3::V4(ip4)) if untagged && dst == self.cfg.mac => {
                if let Some(l2) = view.l2.filter(|_| self.on_link(ip4.src)) {
                    self.rdma.neighbors.learn(ip4.src, l2.src);
                }
                if view.is_rocev2() {
                    // RoCEv2: the RDMA engines.
                    self.rdma
                        .handle_frame(frame, &view, now, &mut self.counters);
                    self.process(now);
                    return;
                }
            }
            _ => {}
        }
        self.dev.rx.push_back(frame.to_vec());
        self.process(now);
    }

    fn on_link(&self, ip: Ipv4Addr) -> bool {
        let mask = u32::MAX << (32 - u32::from(self.cfg.prefix_len));
        u32::from(ip) & mask == u32::from(self.cfg.ipv4) & mask && ip != self.cfg.ipv4
    }

    /// Runs timers due at `now` (call at [`VirtualHost::poll_timeout`]).
    pub fn handle_timeout(&mut self, now: Instant) {
        self.rdma.handle_timeout(now);
        self.process(now);
    }

    /// When to call [`VirtualHost::handle_timeout`] next.
    pub fn poll_timeout(&mut self, now: Instant) -> Option<Instant> {
        let st = self.stime(now);
        let tcp = self
            .iface
            .poll_at(st, &self.sockets)
            .map(|t| self.base + Duration::from_micros(t.total_micros().max(0) as u64));
        let svc = self.services.iter().filter_map(|s| s.poll_timeout()).min();
        let half_open = self
            .half_open
            .iter()
            .map(|h| h.1 + SYN_RECEIVED_TIMEOUT)
            .min();
        [tcp, self.rdma.poll_timeout(), svc, half_open]
            .into_iter()
            .flatten()
            .min()
    }

    /// The next frame to put on the fabric.
    pub fn poll_transmit(&mut self) -> Option<Vec<u8>> {
        let f = self.dev.tx.pop_front()?;
        self.counters.tx_frames += 1;
        Some(f)
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<HostEvent> {
        self.events.pop_front()
    }

    fn push_events(&mut self, evs: Vec<HostEvent>) {
        for e in evs {
            if self.events.len() >= EVENT_LIMIT {
                self.events.pop_front();
                self.counters.events_dropped += 1;
            }
            self.events.push_back(e);
        }
    }

    /// Resets TCP connections stuck in SYN-RECEIVED for
    /// [`SYN_RECEIVED_TIMEOUT`] (the services listen again on a closed socket).
    fn expire_half_open(&mut self, now: Instant) {
        use smoltcp::socket::{tcp, AnySocket};
        let mut still = Vec::new();
        for (h, s) in self.sockets.iter_mut() {
            let Some(t) = tcp::Socket::downcast_mut(s) else {
                continue;
            };
            if t.state() != tcp::State::SynReceived {
                continue;
            }
            let since = self
                .half_open
                .iter()
                .find(|e| e.0 == h)
                .map_or(now, |e| e.1);
            if now.saturating_duration_since(since) >= SYN_RECEIVED_TIMEOUT {
                t.abort();
                self.counters.tcp_half_open_reset += 1;
            } else {
                still.push((h, since));
            }
        }
        self.half_open = still;
    }

    /// What a service sees of the host at `now`; its events go to `events`.
    fn service_ctx<'a>(
        &'a mut self,
        now: Instant,
        events: &'a mut Vec<HostEvent>,
    ) -> ServiceCtx<'a> {
        ServiceCtx {
            iface: &mut self.iface,
            sockets: &mut self.sockets,
            rdma: &mut self.rdma,
            ip: self.cfg.ipv4,
            now,
            events,
            limits: self.cfg.limits,
            rng: &mut self.rng,
        }
    }

    /// Runs smoltcp, the services and the QPs until nothing moves.
    fn process(&mut self, now: Instant) {
        let st = self.stime(now);
        self.expire_half_open(now);
        // Each round either consumes input or produces output; the bound only
        // guards against a bug turning into a hang.
        for _ in 0..64 {
            self.iface.poll(st, &mut self.dev, &mut self.sockets);
            let mut events = Vec::new();
            let mut moved = false;
            // The services step outside `self` so that they can share its
            // sockets and RDMA device through one context.
            let mut services = std::mem::take(&mut self.services);
            let mut ctx = self.service_ctx(now, &mut events);
            for s in &mut services {
                moved |= s.step(&mut ctx);
            }
            self.services = services;
            self.push_events(events);
            moved |= self
                .rdma
                .transmit(now, &mut self.dev.tx, TX_QUEUE_LIMIT, &mut self.counters);
            if !moved {
                break;
            }
        }
        self.iface.poll(st, &mut self.dev, &mut self.sockets);
        self.counters.tx_queue_drops = self.dev.tx_drops;
    }

    /// Status snapshot.
    pub fn status(&self) -> HostStatus {
        HostStatus {
            name: self.cfg.name.clone(),
            mac: self.cfg.mac,
            ipv4: self.cfg.ipv4,
            prefix_len: self.cfg.prefix_len,
            counters: self.counters,
            qps: self.rdma.qp_count(),
            mrs: self.rdma.mr_count(),
            tcp_sockets: self.sockets.iter().count(),
            services: self.services.iter().map(|s| s.status()).collect(),
        }
    }

    /// Counters.
    pub fn counters(&self) -> HostCounters {
        self.counters
    }
}

impl VirtualHost {
    /// Counters of the GSI agent (QP1) and of the IB CM behind it.
    pub fn cm_counters(&self) -> (rdma::GsiCounters, ib_cm::CmCounters) {
        (self.rdma.gsi_counters(), self.rdma.cm_counters())
    }

    /// iWARP counters summed over the running services.
    pub fn iwarp_counters(&self) -> iwarp::IwarpCounters {
        let mut c = iwarp::IwarpCounters::default();
        for s in &self.services {
            c.add(&s.iwarp_counters());
        }
        c
    }
}

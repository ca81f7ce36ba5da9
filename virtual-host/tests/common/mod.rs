//! Helpers shared by the virtual-host test suites: host addresses, a host
//! factory, a frame pump between two nodes with virtual time, session event
//! lookups, and a smoltcp frame-queue device for raw TCP peers.
#![allow(dead_code)]

use smoltcp::iface::{Config, Interface, SocketHandle, SocketSet};
use smoltcp::phy::{Device, DeviceCapabilities, Medium, RxToken, TxToken};
use smoltcp::socket::tcp;
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpAddress, IpCidr};
use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};
use virtual_host::{EventKind, HostConfig, HostEvent, HostLimits, VirtualHost};

pub const MAC_A: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0a];
pub const MAC_B: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0b];
pub const IP_A: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 10);
pub const IP_B: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 11);

/// The configuration of a host on a /24.
pub fn host_config(
    name: &str,
    mac: [u8; 6],
    ip: Ipv4Addr,
    limits: HostLimits,
    seed: u64,
) -> HostConfig {
    HostConfig {
        name: name.into(),
        mac,
        ipv4: ip,
        prefix_len: 24,
        limits,
        seed,
    }
}

/// A host on a /24 with `limits`, seeded with `seed`.
pub fn limited_host(
    name: &str,
    mac: [u8; 6],
    ip: Ipv4Addr,
    limits: HostLimits,
    seed: u64,
    now: Instant,
) -> VirtualHost {
    VirtualHost::new(host_config(name, mac, ip, limits, seed), now).unwrap()
}

/// A host with default limits on a /24, seeded from its MAC.
pub fn host(name: &str, mac: [u8; 6], ip: Ipv4Addr, now: Instant) -> VirtualHost {
    let seed = u64::from(mac[5]) * 0x1234_5678_9abc;
    limited_host(name, mac, ip, HostLimits::default(), seed, now)
}

/// Every frame the host has queued.
pub fn drain(h: &mut VirtualHost) -> Vec<Vec<u8>> {
    std::iter::from_fn(|| h.poll_transmit()).collect()
}

/// Something that exchanges Ethernet frames.
pub trait Node {
    fn tx(&mut self) -> Vec<Vec<u8>>;
    fn rx(&mut self, f: &[u8], now: Instant);
    fn timeout(&mut self, now: Instant) -> Option<Instant>;
    fn tick(&mut self, now: Instant);
    fn events(&mut self) -> Vec<HostEvent>;
}

impl Node for VirtualHost {
    fn tx(&mut self) -> Vec<Vec<u8>> {
        drain(self)
    }
    fn rx(&mut self, f: &[u8], now: Instant) {
        self.handle_frame(f, now)
    }
    fn timeout(&mut self, now: Instant) -> Option<Instant> {
        self.poll_timeout(now)
    }
    fn tick(&mut self, now: Instant) {
        self.handle_timeout(now)
    }
    fn events(&mut self) -> Vec<HostEvent> {
        std::iter::from_fn(|| self.poll_event()).collect()
    }
}

/// An IPv4 TCP frame.
pub fn is_tcp(f: &[u8]) -> bool {
    f.len() > 34 && f[12..14] == [0x08, 0x00] && f[23] == 6
}

/// A RoCEv2 frame (UDP destination port 4791).
pub fn is_roce(f: &[u8]) -> bool {
    f.len() > 40 && f[36..38] == [0x12, 0xb7]
}

/// Moves frames between two nodes, dropping every `drop_every`th frame
/// (counting all frames) when it is `droppable`, advancing virtual time when
/// both are quiet, until `done` or `limit`. Returns the events of both.
pub fn run(
    a: &mut dyn Node,
    b: &mut dyn Node,
    now: &mut Instant,
    limit: Duration,
    drop_every: usize,
    droppable: fn(&[u8]) -> bool,
    mut done: impl FnMut(&[HostEvent], &[HostEvent]) -> bool,
) -> (Vec<HostEvent>, Vec<HostEvent>) {
    let end = *now + limit;
    let (mut ea, mut eb) = (Vec::new(), Vec::new());
    let mut n = 0usize;
    while *now < end {
        let a_sent = forward(a, b, *now, &mut n, drop_every, droppable);
        let b_sent = forward(b, a, *now, &mut n, drop_every, droppable);
        let moved = a_sent || b_sent;
        ea.extend(a.events());
        eb.extend(b.events());
        if done(&ea, &eb) {
            break;
        }
        if !moved {
            let next = [a.timeout(*now), b.timeout(*now)]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(*now + Duration::from_millis(100));
            *now = next.max(*now + Duration::from_micros(1));
            a.tick(*now);
            b.tick(*now);
        }
    }
    (ea, eb)
}

/// Moves every frame `from` has queued to `to`, but for every `drop_every`th
/// frame (counting in `n`) that is `droppable`. Whether `from` sent any.
fn forward(
    from: &mut dyn Node,
    to: &mut dyn Node,
    now: Instant,
    n: &mut usize,
    drop_every: usize,
    droppable: fn(&[u8]) -> bool,
) -> bool {
    let frames = from.tx();
    for f in &frames {
        *n += 1;
        if drop_every > 0 && n.is_multiple_of(drop_every) && droppable(f) {
            continue;
        }
        to.rx(f, now);
    }
    !frames.is_empty()
}

/// [`run`] without loss and without a stop condition: `limit` of traffic
/// and timers (connections closing, sessions timing out).
pub fn run_idle(
    a: &mut dyn Node,
    b: &mut dyn Node,
    now: &mut Instant,
    limit: Duration,
    droppable: fn(&[u8]) -> bool,
) {
    run(a, b, now, limit, 0, droppable, |_, _| false);
}

/// [`run`] until both sessions finish or either fails; asserts that
/// neither failed and returns the server's (`a`) and client's (`b`) events.
pub fn run_to_finish(
    a: &mut dyn Node,
    b: &mut dyn Node,
    now: &mut Instant,
    limit: Duration,
    drop_every: usize,
    droppable: fn(&[u8]) -> bool,
) -> (Vec<HostEvent>, Vec<HostEvent>) {
    let (ea, eb) = run(
        a,
        b,
        now,
        limit,
        drop_every,
        droppable,
        both_finished_or_failed,
    );
    assert_eq!(failed(&ea), None, "server events {ea:?}");
    assert_eq!(failed(&eb), None, "client events {eb:?}");
    (ea, eb)
}

/// `(iterations, verified)` of the first finished session.
pub fn finished(ev: &[HostEvent]) -> Option<(u32, u32)> {
    ev.iter().find_map(|e| match e.kind {
        EventKind::SessionFinished {
            iterations,
            verified,
            ..
        } => Some((iterations, verified)),
        _ => None,
    })
}

/// The reason of the first failed session.
pub fn failed(ev: &[HostEvent]) -> Option<String> {
    ev.iter().find_map(|e| match &e.kind {
        EventKind::SessionFailed { reason, .. } => Some(reason.clone()),
        _ => None,
    })
}

/// Both sessions finished, or either failed.
pub fn both_finished_or_failed(ea: &[HostEvent], eb: &[HostEvent]) -> bool {
    (finished(ea).is_some() && finished(eb).is_some())
        || failed(ea).is_some()
        || failed(eb).is_some()
}

/// A `done` for [`run`]: both sessions finished, or the client (`b`) failed.
pub fn both_finished_or_client_failed(ea: &[HostEvent], eb: &[HostEvent]) -> bool {
    finished(ea).is_some() && finished(eb).is_some() || failed(eb).is_some()
}

/// A smoltcp Ethernet device over two frame queues the test moves by hand.
#[derive(Default)]
pub struct Frames {
    /// Frames for smoltcp to receive.
    pub rx: VecDeque<Vec<u8>>,
    /// Frames smoltcp sent.
    pub tx: VecDeque<Vec<u8>>,
}

pub struct RxTok(Vec<u8>);
pub struct TxTok<'a>(&'a mut VecDeque<Vec<u8>>);

impl RxToken for RxTok {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(&self.0)
    }
}

impl TxToken for TxTok<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut b = vec![0u8; len];
        let r = f(&mut b);
        self.0.push_back(b);
        r
    }
}

impl Device for Frames {
    type RxToken<'a> = RxTok;
    type TxToken<'a> = TxTok<'a>;
    fn receive(
        &mut self,
        _t: smoltcp::time::Instant,
    ) -> Option<(Self::RxToken<'_>, Self::TxToken<'_>)> {
        let f = self.rx.pop_front()?;
        Some((RxTok(f), TxTok(&mut self.tx)))
    }
    fn transmit(&mut self, _t: smoltcp::time::Instant) -> Option<Self::TxToken<'_>> {
        Some(TxTok(&mut self.tx))
    }
    fn capabilities(&self) -> DeviceCapabilities {
        let mut c = DeviceCapabilities::default();
        c.medium = Medium::Ethernet;
        c.max_transmission_unit = 1514;
        c
    }
}

/// Starts the server spec on `a` and the client spec on `b`. With `client_first` the client
/// starts alone and the link runs for 3 s (only `droppable` frames counted,
/// nothing dropped) before the server starts; `while_alone` then checks
/// what the client-only phase left behind.
pub fn start_server_and_client(
    a: &mut VirtualHost,
    b: &mut VirtualHost,
    now: &mut Instant,
    (srv, cli): (virtual_host::ServiceSpec, virtual_host::ServiceSpec),
    client_first: bool,
    droppable: fn(&[u8]) -> bool,
    while_alone: impl FnOnce(&VirtualHost, &VirtualHost),
) {
    if client_first {
        b.start_service(cli, *now).unwrap();
        run(a, b, now, Duration::from_secs(3), 0, droppable, |_, _| {
            false
        });
        while_alone(a, b);
        a.start_service(srv, *now).unwrap();
    } else {
        a.start_service(srv, *now).unwrap();
        b.start_service(cli, *now).unwrap();
    }
}

/// Hosts A and B and their clock, for a server on A and a client on B.
pub struct Pair {
    pub now: Instant,
    pub a: VirtualHost,
    pub b: VirtualHost,
}

impl Pair {
    /// Fresh hosts A and B.
    pub fn new() -> Self {
        let now = Instant::now();
        let a = host("a", MAC_A, IP_A, now);
        let b = host("b", MAC_B, IP_B, now);
        Pair { now, a, b }
    }

    /// Starts the server spec on A and the client spec on B as
    /// [`start_server_and_client`] does.
    pub fn start(
        &mut self,
        specs: (virtual_host::ServiceSpec, virtual_host::ServiceSpec),
        client_first: bool,
        droppable: fn(&[u8]) -> bool,
        while_alone: impl FnOnce(&VirtualHost, &VirtualHost),
    ) {
        let (a, b, now) = (&mut self.a, &mut self.b, &mut self.now);
        start_server_and_client(a, b, now, specs, client_first, droppable, while_alone);
    }

    /// [`run_to_finish`] between A (server) and B (client).
    pub fn run_to_finish(
        &mut self,
        limit: Duration,
        drop_every: usize,
        droppable: fn(&[u8]) -> bool,
    ) -> (Vec<HostEvent>, Vec<HostEvent>) {
        let (a, b, now) = (&mut self.a, &mut self.b, &mut self.now);
        run_to_finish(a, b, now, limit, drop_every, droppable)
    }
}

impl Default for Pair {
    fn default() -> Self {
        Self::new()
    }
}

/// A `while_alone` for [`start_server_and_client`] that checks nothing.
pub fn nothing_to_check(_: &VirtualHost, _: &VirtualHost) {}

/// Asserts that the first service of `h`, a client, waits for its server.
pub fn assert_waiting_for_server(h: &VirtualHost) {
    let st = h.status().services[0].state.clone();
    assert!(
        st == "waiting-for-server" || st == "connecting",
        "client state {st}"
    );
}

/// Asserts that the IB CM of `h` rejected REQs for a service nobody listens on.
pub fn assert_rejected_unknown_service(h: &VirtualHost) {
    assert!(
        h.cm_counters().1.unknown_service >= 1,
        "{:?}",
        h.cm_counters()
    );
}

/// The address of a scripted TCP peer ([`TcpClient`]).
pub const MAC_P: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0c];
pub const IP_P: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 12);

/// A smoltcp interface at `MAC_P` with one TCP socket (8 KiB buffers),
/// its clock starting at `base`.
pub struct TcpClient {
    pub base: Instant,
    pub iface: Interface,
    pub dev: Frames,
    pub sockets: SocketSet<'static>,
    pub sock: SocketHandle,
}

impl TcpClient {
    pub fn new(base: Instant, ip: Ipv4Addr) -> Self {
        let mut dev = Frames::default();
        let cfg = Config::new(HardwareAddress::Ethernet(EthernetAddress(MAC_P)));
        let mut iface = Interface::new(cfg, &mut dev, smoltcp::time::Instant::ZERO);
        iface.update_ip_addrs(|a| {
            let _ = a.push(IpCidr::new(IpAddress::Ipv4(ip), 24));
        });
        let mut sockets = SocketSet::new(Vec::new());
        let sock = sockets.add(tcp::Socket::new(
            tcp::SocketBuffer::new(vec![0; 8192]),
            tcp::SocketBuffer::new(vec![0; 8192]),
        ));
        TcpClient {
            base,
            iface,
            dev,
            sockets,
            sock,
        }
    }

    /// Connects the socket to host A's `port` from `local_port`.
    pub fn connect(&mut self, port: u16, local_port: u16) {
        let cx = self.iface.context();
        self.sockets
            .get_mut::<tcp::Socket>(self.sock)
            .connect(cx, (IpAddress::Ipv4(IP_A), port), local_port)
            .unwrap();
    }

    pub fn sock(&mut self) -> &mut tcp::Socket<'static> {
        self.sockets.get_mut::<tcp::Socket>(self.sock)
    }

    fn st(&self, now: Instant) -> smoltcp::time::Instant {
        smoltcp::time::Instant::from_micros(now.duration_since(self.base).as_micros() as i64)
    }

    /// One smoltcp poll at `now`.
    pub fn poll(&mut self, now: Instant) {
        let st = self.st(now);
        self.iface.poll(st, &mut self.dev, &mut self.sockets);
    }

    /// When smoltcp wants to be polled next.
    pub fn poll_at(&mut self, now: Instant) -> Option<Instant> {
        let st = self.st(now);
        self.iface
            .poll_at(st, &self.sockets)
            .map(|t| self.base + Duration::from_micros(t.total_micros().max(0) as u64))
    }
}

/// A test peer scripted over a [`TcpClient`]: frames go through the
/// client's device, and `step` runs the script at each frame and timer.
pub trait TcpScript {
    fn client(&mut self) -> &mut TcpClient;
    fn step(&mut self, now: Instant);
}

impl<T: TcpScript> Node for T {
    fn tx(&mut self) -> Vec<Vec<u8>> {
        self.client().dev.tx.drain(..).collect()
    }
    fn rx(&mut self, f: &[u8], now: Instant) {
        self.client().dev.rx.push_back(f.to_vec());
        self.step(now);
    }
    fn timeout(&mut self, now: Instant) -> Option<Instant> {
        self.client().poll_at(now)
    }
    fn tick(&mut self, now: Instant) {
        self.step(now);
    }
    fn events(&mut self) -> Vec<HostEvent> {
        Vec::new()
    }
}

/// A client spec for `kind` against host A, running `iters` iterations.
pub fn client_spec(kind: virtual_host::ServiceKind, iters: u32) -> virtual_host::ServiceSpec {
    let mut cli = virtual_host::ServiceSpec::new(kind);
    cli.peer = Some(IP_A);
    cli.iters = iters;
    cli
}

/// A client spec for perftest `kind` against host A's `port`, running
/// `iters` iterations of at most 4 KiB (the tools' 64 KiB default runs in
/// the guest tests; small messages keep the debug-build tests short).
pub fn perftest_client_spec(
    kind: virtual_host::ServiceKind,
    port: u16,
    iters: u32,
) -> virtual_host::ServiceSpec {
    let mut cli = client_spec(kind, iters);
    cli.port = port;
    cli.size = cli.size.min(4096);
    cli
}

/// A tool-like pingpong client against host A (it echoes what the server
/// sends, so the server verifies), running `iters` iterations.
pub fn echo_client_spec(iters: u32) -> virtual_host::ServiceSpec {
    let mut cli = client_spec(virtual_host::ServiceKind::PingpongClient, iters);
    cli.echo = true;
    cli
}

/// Starts `cli` on a fresh host B and runs it against `a` without loss
/// until `done` or `limit`; returns the events of both.
pub fn run_client(
    a: &mut VirtualHost,
    now: &mut Instant,
    cli: virtual_host::ServiceSpec,
    limit: Duration,
    droppable: fn(&[u8]) -> bool,
    done: impl FnMut(&[HostEvent], &[HostEvent]) -> bool,
) -> (Vec<HostEvent>, Vec<HostEvent>) {
    let mut b = host("b", MAC_B, IP_B, *now);
    b.start_service(cli, *now).unwrap();
    run(a, &mut b, now, limit, 0, droppable, done)
}

/// A `done` for [`run`]: the client (`b`) finished or failed.
pub fn client_ended(_: &[HostEvent], eb: &[HostEvent]) -> bool {
    finished(eb).is_some() || failed(eb).is_some()
}

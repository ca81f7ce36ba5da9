//! What a service is: its kind (tool and role) and parameters, as the
//! daemon's config file, control socket and CLI give them, and the helpers
//! every tool's client and server sides share. The tool engines depend on this module;
//! `service` (the dispatcher over the engines) does too.

use crate::endpoint::RoceEndpoint;
use crate::{EventKind, HostError, HostEvent, ServiceCtx};
use roce_model::QpCaps;
use smoltcp::iface::{SocketHandle, SocketSet};
use smoltcp::socket::tcp::{Socket, State};
use smoltcp::wire::IpAddress;
use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;
use std::time::Duration;

/// rping's default port.
pub const RPING_DEFAULT_PORT: u16 = 7174;
/// rping's default buffer size.
pub const RPING_DEFAULT_SIZE: u32 = 64;
/// ucmatose's default port.
pub const UCMATOSE_PORT: u16 = 7471;
/// ucmatose's default message size.
pub const UCMATOSE_SIZE: u32 = 100;

/// Which protocol and role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceKind {
    /// `ibv_rc_pingpong` server: listens, serves one client after another.
    PingpongServer,
    /// `ibv_rc_pingpong` client towards `peer`: one session.
    PingpongClient,
    /// `rping -s` over iWARP: listens, serves one client after another.
    RpingServer,
    /// `rping -c` over iWARP towards `peer`: one session of `iters` pings.
    RpingClient,
    /// `ucmatose` server over iWARP (port 7471).
    UcmatoseServer,
    /// `ucmatose -s PEER` client over iWARP.
    UcmatoseClient,
    /// `rping -s` over RoCE (rxe): IB CM on QP1, then an RC QP.
    RpingServerRoce,
    /// `rping -c` over RoCE towards `peer`.
    RpingClientRoce,
    /// `ucmatose` server over RoCE.
    UcmatoseServerRoce,
    /// `ucmatose -s PEER` client over RoCE.
    UcmatoseClientRoce,
    /// perftest `ib_write_bw` server (RC, TCP exchange with a GID).
    WriteBwServer,
    /// perftest `ib_send_bw` server (RC, TCP exchange with a GID).
    SendBwServer,
    /// perftest `ib_read_bw` server (RC, TCP exchange with a GID).
    ReadBwServer,
    /// perftest `ib_atomic_bw` server (RC, TCP exchange with a GID).
    AtomicBwServer,
    /// perftest `ib_write_bw` client towards the tool's server.
    WriteBwClient,
    /// perftest `ib_send_bw` client towards the tool's server.
    SendBwClient,
    /// perftest `ib_read_bw` client towards the tool's server.
    ReadBwClient,
    /// perftest `ib_atomic_bw` client towards the tool's server.
    AtomicBwClient,
}

impl ServiceKind {
    /// Every kind, for help texts.
    pub const ALL: [ServiceKind; 18] = [
        ServiceKind::PingpongServer,
        ServiceKind::PingpongClient,
        ServiceKind::WriteBwServer,
        ServiceKind::SendBwServer,
        ServiceKind::ReadBwServer,
        ServiceKind::AtomicBwServer,
        ServiceKind::WriteBwClient,
        ServiceKind::SendBwClient,
        ServiceKind::ReadBwClient,
        ServiceKind::AtomicBwClient,
        ServiceKind::RpingServer,
        ServiceKind::RpingClient,
        ServiceKind::UcmatoseServer,
        ServiceKind::UcmatoseClient,
        ServiceKind::RpingServerRoce,
        ServiceKind::RpingClientRoce,
        ServiceKind::UcmatoseServerRoce,
        ServiceKind::UcmatoseClientRoce,
    ];

    /// Whether the kind connects out (needs a peer).
    pub fn is_client(self) -> bool {
        matches!(
            self,
            ServiceKind::PingpongClient
                | ServiceKind::WriteBwClient
                | ServiceKind::SendBwClient
                | ServiceKind::ReadBwClient
                | ServiceKind::AtomicBwClient
                | ServiceKind::RpingClient
                | ServiceKind::UcmatoseClient
                | ServiceKind::RpingClientRoce
                | ServiceKind::UcmatoseClientRoce
        )
    }

    /// Whether the kind is one of perftest's bandwidth tests (the kinds
    /// that also run over rdma_cm).
    pub fn is_perftest_bw(self) -> bool {
        matches!(
            self,
            ServiceKind::WriteBwServer
                | ServiceKind::SendBwServer
                | ServiceKind::ReadBwServer
                | ServiceKind::AtomicBwServer
                | ServiceKind::WriteBwClient
                | ServiceKind::SendBwClient
                | ServiceKind::ReadBwClient
                | ServiceKind::AtomicBwClient
        )
    }
}

impl fmt::Display for ServiceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ServiceKind::PingpongServer => "pingpong-server",
            ServiceKind::PingpongClient => "pingpong-client",
            ServiceKind::RpingServer => "rping-server",
            ServiceKind::RpingClient => "rping-client",
            ServiceKind::UcmatoseServer => "ucmatose-server",
            ServiceKind::UcmatoseClient => "ucmatose-client",
            ServiceKind::RpingServerRoce => "rping-server-roce",
            ServiceKind::RpingClientRoce => "rping-client-roce",
            ServiceKind::UcmatoseServerRoce => "ucmatose-server-roce",
            ServiceKind::UcmatoseClientRoce => "ucmatose-client-roce",
            ServiceKind::WriteBwServer => "write-bw-server",
            ServiceKind::SendBwServer => "send-bw-server",
            ServiceKind::ReadBwServer => "read-bw-server",
            ServiceKind::AtomicBwServer => "atomic-bw-server",
            ServiceKind::WriteBwClient => "write-bw-client",
            ServiceKind::SendBwClient => "send-bw-client",
            ServiceKind::ReadBwClient => "read-bw-client",
            ServiceKind::AtomicBwClient => "atomic-bw-client",
        })
    }
}

impl FromStr for ServiceKind {
    type Err = HostError;
    fn from_str(s: &str) -> Result<Self, HostError> {
        ServiceKind::ALL
            .into_iter()
            .find(|k| k.to_string() == s)
            .ok_or_else(|| {
                let known: Vec<String> = ServiceKind::ALL.iter().map(|k| k.to_string()).collect();
                HostError::Invalid(format!(
                    "service {s:?}: known services are {}",
                    known.join(", ")
                ))
            })
    }
}

/// A service and its parameters (defaults = the tool's defaults).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceSpec {
    /// Protocol and role.
    pub kind: ServiceKind,
    /// The guest to connect to (client kinds).
    pub peer: Option<Ipv4Addr>,
    /// TCP port of the exchange (`-p`, 18515).
    pub port: u16,
    /// Message size (`-s`, 4096).
    pub size: u32,
    /// Iterations (`-n`, 1000).
    pub iters: u32,
    /// Receives posted at a time (`-r`, 500).
    pub rx_depth: u32,
    /// Path MTU in bytes (`-m`, 1024).
    pub mtu: u32,
    /// How long a client keeps trying to reach a server that is not up yet.
    pub connect_timeout: Duration,
    /// Behave exactly like the tool: send from the buffer we receive into
    /// (so we echo the peer) and check nothing. Lets two hosts test each
    /// other; off by default, where we send patterns and check the echo.
    pub echo: bool,
    /// iWARP services: ask for MPA CRC (siw `mpa_crc_required`); a peer
    /// asking for it gets it either way.
    pub mpa_crc: bool,
    /// perftest services: the tool runs with `-R` (rdma_cm; over iWARP, a
    /// siw guest, unless `roce`) instead of its TCP exchange.
    pub rdma_cm: bool,
    /// perftest `-R` services: rdma_cm over RoCE (an rxe guest; IB CM on
    /// QP1, RC QPs) instead of iWARP. Needs `rdma_cm`.
    pub roce: bool,
}

/// Largest message a service accepts (memory per session is twice this).
pub const MAX_MESSAGE: u32 = 1 << 20;
/// Most receives a service posts at a time.
pub const MAX_RX_DEPTH: u32 = 4096;

impl ServiceSpec {
    /// A spec with the tool's defaults.
    pub fn new(kind: ServiceKind) -> Self {
        if kind == ServiceKind::AtomicBwClient {
            // ib_atomic_bw's operations are 8 bytes.
            return ServiceSpec {
                size: 8,
                ..ServiceSpec::new(ServiceKind::WriteBwClient)
            }
            .with_kind(kind);
        }
        if kind.is_perftest_bw() {
            // perftest's defaults: 64 KiB messages, 5000 iterations, 512
            // receives.
            return ServiceSpec {
                size: 65536,
                iters: 5000,
                rx_depth: 512,
                ..ServiceSpec::new(ServiceKind::PingpongServer)
            }
            .with_kind(kind);
        }
        let (port, size, iters) = match kind {
            ServiceKind::RpingServer
            | ServiceKind::RpingClient
            | ServiceKind::RpingServerRoce
            | ServiceKind::RpingClientRoce => (RPING_DEFAULT_PORT, RPING_DEFAULT_SIZE, 10),
            ServiceKind::UcmatoseServer
            | ServiceKind::UcmatoseClient
            | ServiceKind::UcmatoseServerRoce
            | ServiceKind::UcmatoseClientRoce => (UCMATOSE_PORT, UCMATOSE_SIZE, 10),
            _ => (18515, 4096, 1000),
        };
        ServiceSpec {
            kind,
            peer: None,
            port,
            size,
            iters,
            rx_depth: 500,
            mtu: 1024,
            connect_timeout: Duration::from_secs(120),
            echo: false,
            mpa_crc: false,
            rdma_cm: false,
            roce: false,
        }
    }

    fn with_kind(mut self, kind: ServiceKind) -> Self {
        self.kind = kind;
        self
    }

    /// Checks ranges.
    pub fn validate(&self) -> Result<(), HostError> {
        let bad = |m: String| Err(HostError::Invalid(m));
        if self.kind.is_client() && self.peer.is_none() {
            return bad(format!("{}: needs a peer address", self.kind));
        }
        if self.port == 0 {
            return bad("port 0".into());
        }
        if self.size == 0 || self.size > MAX_MESSAGE {
            return bad(format!("size {} (1..={MAX_MESSAGE})", self.size));
        }
        if self.iters == 0 {
            return bad("iters 0".into());
        }
        if self.rx_depth < 2 || self.rx_depth > MAX_RX_DEPTH {
            return bad(format!("rx-depth {} (2..={MAX_RX_DEPTH})", self.rx_depth));
        }
        if !matches!(self.mtu, 256 | 512 | 1024 | 2048 | 4096) {
            return bad(format!("mtu {} (256, 512, 1024, 2048 or 4096)", self.mtu));
        }
        let atomic = matches!(
            self.kind,
            ServiceKind::AtomicBwServer | ServiceKind::AtomicBwClient
        );
        if self.rdma_cm && !self.kind.is_perftest_bw() {
            return bad(format!(
                "{}: rdma-cm is for the write/send/read/atomic-bw services",
                self.kind
            ));
        }
        if self.rdma_cm && atomic && !self.roce {
            return bad(format!(
                "{}: rdma-cm over iWARP has no atomics (give roce too)",
                self.kind
            ));
        }
        if self.roce && !self.rdma_cm {
            return bad(format!("{}: roce needs rdma-cm", self.kind));
        }
        Ok(())
    }
}

/// Status of one service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceStatus {
    /// Id.
    pub id: u32,
    /// Kind.
    pub kind: ServiceKind,
    /// Peer (clients) or current peer (servers).
    pub peer: Option<Ipv4Addr>,
    /// TCP port.
    pub port: u16,
    /// State word (listening, connecting, running, done, failed).
    pub state: String,
    /// Sessions that completed every iteration.
    pub sessions_ok: u64,
    /// Sessions that failed.
    pub sessions_failed: u64,
    /// Iterations of the last finished session.
    pub last_iterations: u32,
    /// Verified messages of the last finished session.
    pub last_verified: u32,
    /// Last failure.
    pub last_error: Option<String>,
    /// The running session's sends and receives completed so far.
    pub progress: (u32, u32),
}

/// What every service counts of its sessions, the same way: the common part
/// of its [`ServiceStatus`], kept together with the host events that go with
/// each count.
#[derive(Debug, Default)]
pub(crate) struct SessionTally {
    ok: u64,
    failed: u64,
    /// Iterations of the last finished session.
    pub(crate) last_iterations: u32,
    /// Verified messages of the last finished session.
    pub(crate) last_verified: u32,
    /// The last failure (a session's, or the socket's when it cannot listen).
    pub(crate) last_error: Option<String>,
}

impl SessionTally {
    /// Whether any session completed every iteration.
    pub(crate) fn any_ok(&self) -> bool {
        self.ok > 0
    }

    /// The state word of a service that has stopped: `done` once a session
    /// completed, `failed` otherwise.
    pub(crate) fn stopped_state(&self) -> &'static str {
        if self.any_ok() {
            "done"
        } else {
            "failed"
        }
    }

    /// Counts a session that completed every iteration and tells the host.
    pub(crate) fn finished(
        &mut self,
        ctx: &mut ServiceCtx<'_>,
        service: u32,
        peer: Ipv4Addr,
        iterations: u32,
        verified: u32,
        elapsed: Duration,
    ) {
        self.ok += 1;
        self.last_iterations = iterations;
        self.last_verified = verified;
        ctx.events.push(HostEvent {
            service,
            kind: EventKind::SessionFinished {
                peer,
                iterations,
                verified,
                elapsed,
            },
        });
    }

    /// Counts a failed session and tells the host.
    pub(crate) fn failed(
        &mut self,
        ctx: &mut ServiceCtx<'_>,
        service: u32,
        peer: Option<Ipv4Addr>,
        reason: String,
    ) {
        self.failed += 1;
        self.last_error = Some(reason.clone());
        ctx.events.push(HostEvent {
            service,
            kind: EventKind::SessionFailed { peer, reason },
        });
    }

    /// The status of service `id` running `spec`: its (current) `peer`,
    /// its `state` word and the running session's `progress`, with this
    /// tally.
    pub(crate) fn status(
        &self,
        id: u32,
        spec: &ServiceSpec,
        peer: Option<Ipv4Addr>,
        state: &str,
        progress: (u32, u32),
    ) -> ServiceStatus {
        ServiceStatus {
            id,
            kind: spec.kind,
            peer,
            port: spec.port,
            state: state.to_string(),
            sessions_ok: self.ok,
            sessions_failed: self.failed,
            last_iterations: self.last_iterations,
            last_verified: self.last_verified,
            last_error: self.last_error.clone(),
            progress,
        }
    }
}

/// Tells the host that `service` started a session with `peer` on its QP
/// `qpn`, connected to the peer's `remote_qpn`.
pub(crate) fn session_started(
    ctx: &mut ServiceCtx<'_>,
    service: u32,
    peer: Ipv4Addr,
    qpn: u32,
    remote_qpn: u32,
) {
    ctx.events.push(HostEvent {
        service,
        kind: EventKind::SessionStarted {
            peer,
            qpn,
            remote_qpn,
        },
    });
}

/// A server's turn at its TCP socket `sock`: keeps it listening on `port`
/// (why it cannot goes to `last_error`); whether a client has connected
/// (the socket is past the handshake, in whatever state).
pub(crate) fn client_connected(
    sock: &mut Socket,
    port: u16,
    last_error: &mut Option<String>,
) -> bool {
    match sock.state() {
        State::Closed => {
            if let Err(e) = sock.listen(port) {
                *last_error = Some(format!("listen: {e}"));
            }
            false
        }
        State::Listen | State::SynReceived => false,
        _ => true,
    }
}

/// [`client_connected`] for a server that takes only established
/// connections: the IPv4 peer of one; a connection in any other state is
/// aborted.
pub(crate) fn accepted_peer(
    sock: &mut Socket,
    port: u16,
    last_error: &mut Option<String>,
) -> Option<Ipv4Addr> {
    if !client_connected(sock, port, last_error) {
        return None;
    }
    if sock.state() == State::Established {
        if let Some(IpAddress::Ipv4(peer)) = sock.remote_endpoint().map(|e| e.addr) {
            return Some(peer);
        }
    }
    sock.abort();
    None
}

/// A closing connection's turn: reads and drops whatever the peer still
/// sends, and closes our side once the peer has closed its own.
pub(crate) fn drain_and_close(sock: &mut Socket) {
    let mut buf = [0u8; 512];
    while sock.can_recv() {
        if !matches!(sock.recv_slice(&mut buf), Ok(n) if n > 0) {
            break;
        }
    }
    if sock.state() == State::CloseWait {
        sock.close();
    }
}

/// The peer a client service connects to, and its TCP socket.
pub(crate) fn client_target(
    spec: &ServiceSpec,
    sock: Option<SocketHandle>,
) -> Result<(Ipv4Addr, SocketHandle), HostError> {
    let peer = spec
        .peer
        .ok_or_else(|| HostError::Invalid("client without peer".into()))?;
    let sock = sock.ok_or_else(|| HostError::Tcp("no socket".into()))?;
    Ok((peer, sock))
}

/// Starts connecting `sock` to `peer:port` from a random ephemeral port.
/// Aborts the TCP sockets of a service and gives them back to the set.
pub(crate) fn abort_sockets(
    sockets: &mut SocketSet<'static>,
    handles: impl IntoIterator<Item = SocketHandle>,
) {
    for h in handles {
        sockets.get_mut::<Socket>(h).abort();
        sockets.remove(h);
    }
}

/// Puts `sock` in LISTEN on `port`.
pub(crate) fn tcp_listen(
    ctx: &mut ServiceCtx<'_>,
    sock: SocketHandle,
    port: u16,
) -> Result<(), HostError> {
    ctx.sockets
        .get_mut::<Socket>(sock)
        .listen(port)
        .map_err(|e| HostError::Tcp(format!("listen on {port}: {e}")))
}

pub(crate) fn tcp_connect(
    ctx: &mut ServiceCtx<'_>,
    sock: SocketHandle,
    peer: Ipv4Addr,
    port: u16,
) -> Result<(), HostError> {
    let local_port = 49152 + (ctx.rng.next_u64() % 16384) as u16;
    ctx.sockets
        .get_mut::<Socket>(sock)
        .connect(
            ctx.iface.context(),
            (IpAddress::Ipv4(peer), port),
            local_port,
        )
        .map_err(|e| HostError::Tcp(format!("connect to {peer}: {e}")))
}

/// The RoCE counterpart of [`tcp_connect`]: a QP with `caps` and the
/// rdma_cm REQ to the client service's peer at its port, from a random
/// ephemeral source port and with a random starting PSN. Returns the peer
/// with the endpoint.
pub(crate) fn roce_connect(
    ctx: &mut ServiceCtx<'_>,
    owner: u32,
    spec: &ServiceSpec,
    caps: QpCaps,
    rd_atomic: u8,
    ack_timeout: u8,
) -> Result<(Ipv4Addr, RoceEndpoint), HostError> {
    let peer = spec
        .peer
        .ok_or_else(|| HostError::Invalid("a client service needs a peer".into()))?;
    // rdma_cm picks an ephemeral port for the active side's ID.
    let src_port = 0x8000 | (ctx.rng.next_u64() as u16 & 0x7fff);
    let psn = ctx.rng.next_u64() as u32;
    let ep = RoceEndpoint::connect(
        ctx.rdma,
        owner,
        peer,
        spec.port,
        src_port,
        caps,
        rd_atomic,
        psn,
        spec.mtu,
        ack_timeout,
        ctx.now,
    )?;
    Ok((peer, ep))
}

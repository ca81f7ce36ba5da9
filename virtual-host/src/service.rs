//! Services: state machines speaking an RDMA tool's application protocol on
//! top of the host's TCP sockets and RC queue pairs.

use crate::perftest::{PerftestClient, PerftestServer, Verb};
use crate::perftest_cm::PerftestCm;
use crate::pingpong::{Pingpong, Role};
use crate::rping::Rping;
use crate::{HostError, RdmaDevice, ServiceCtx};
use smoltcp::iface::{SocketHandle, SocketSet};
use smoltcp::socket::tcp::Socket;
use smoltcp::wire::IpAddress;
use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;
use std::time::{Duration, Instant};

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
        if matches!(
            kind,
            ServiceKind::WriteBwServer
                | ServiceKind::SendBwServer
                | ServiceKind::ReadBwServer
                | ServiceKind::AtomicBwServer
                | ServiceKind::WriteBwClient
                | ServiceKind::SendBwClient
                | ServiceKind::ReadBwClient
        ) {
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
        use crate::rping::{DEFAULT_PORT, DEFAULT_SIZE, UCMATOSE_PORT, UCMATOSE_SIZE};
        let (port, size, iters) = match kind {
            ServiceKind::RpingServer
            | ServiceKind::RpingClient
            | ServiceKind::RpingServerRoce
            | ServiceKind::RpingClientRoce => (DEFAULT_PORT, DEFAULT_SIZE, 10),
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
        if self.rdma_cm
            && !atomic
            && !matches!(
                self.kind,
                ServiceKind::WriteBwServer
                    | ServiceKind::SendBwServer
                    | ServiceKind::ReadBwServer
                    | ServiceKind::WriteBwClient
                    | ServiceKind::SendBwClient
                    | ServiceKind::ReadBwClient
            )
        {
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

// A handful of services per host: the size difference does not matter.
#[allow(clippy::large_enum_variant)]
enum Inner {
    Pingpong(Pingpong),
    Perftest(PerftestServer),
    PerftestClient(PerftestClient),
    Rping(Rping),
    PerftestCm(PerftestCm),
}

/// A running service.
pub struct Service {
    id: u32,
    inner: Inner,
}

impl Service {
    pub(crate) fn start(
        id: u32,
        spec: ServiceSpec,
        ctx: &mut ServiceCtx<'_>,
    ) -> Result<Self, HostError> {
        let inner = match spec.kind {
            ServiceKind::WriteBwServer
            | ServiceKind::SendBwServer
            | ServiceKind::ReadBwServer
            | ServiceKind::WriteBwClient
            | ServiceKind::SendBwClient
            | ServiceKind::ReadBwClient
            | ServiceKind::AtomicBwServer
            | ServiceKind::AtomicBwClient
                if spec.rdma_cm =>
            {
                use crate::perftest_cm::Role as R;
                let (verb, role) = match spec.kind {
                    ServiceKind::WriteBwServer => (Verb::Write, R::Server),
                    ServiceKind::SendBwServer => (Verb::Send, R::Server),
                    ServiceKind::ReadBwServer => (Verb::Read, R::Server),
                    ServiceKind::AtomicBwServer => (Verb::Atomic, R::Server),
                    ServiceKind::WriteBwClient => (Verb::Write, R::Client),
                    ServiceKind::SendBwClient => (Verb::Send, R::Client),
                    ServiceKind::AtomicBwClient => (Verb::Atomic, R::Client),
                    _ => (Verb::Read, R::Client),
                };
                Inner::PerftestCm(PerftestCm::start(id, verb, role, spec, ctx)?)
            }
            ServiceKind::PingpongServer => {
                Inner::Pingpong(Pingpong::start(id, Role::Server, spec, ctx)?)
            }
            ServiceKind::PingpongClient => {
                Inner::Pingpong(Pingpong::start(id, Role::Client, spec, ctx)?)
            }
            ServiceKind::RpingServer
            | ServiceKind::RpingClient
            | ServiceKind::UcmatoseServer
            | ServiceKind::UcmatoseClient
            | ServiceKind::RpingServerRoce
            | ServiceKind::RpingClientRoce
            | ServiceKind::UcmatoseServerRoce
            | ServiceKind::UcmatoseClientRoce => {
                use crate::endpoint::TransportKind as T;
                use crate::rping::{Proto, Role as R};
                let (proto, role, transport) = match spec.kind {
                    ServiceKind::RpingServer => (Proto::Rping, R::Server, T::Iwarp),
                    ServiceKind::RpingClient => (Proto::Rping, R::Client, T::Iwarp),
                    ServiceKind::UcmatoseServer => (Proto::Ucmatose, R::Server, T::Iwarp),
                    ServiceKind::UcmatoseClient => (Proto::Ucmatose, R::Client, T::Iwarp),
                    ServiceKind::RpingServerRoce => (Proto::Rping, R::Server, T::Roce),
                    ServiceKind::RpingClientRoce => (Proto::Rping, R::Client, T::Roce),
                    ServiceKind::UcmatoseServerRoce => (Proto::Ucmatose, R::Server, T::Roce),
                    _ => (Proto::Ucmatose, R::Client, T::Roce),
                };
                Inner::Rping(Rping::start(id, proto, role, transport, spec, ctx)?)
            }
            ServiceKind::WriteBwServer => {
                Inner::Perftest(PerftestServer::start(id, Verb::Write, spec, ctx)?)
            }
            ServiceKind::SendBwServer => {
                Inner::Perftest(PerftestServer::start(id, Verb::Send, spec, ctx)?)
            }
            ServiceKind::ReadBwServer => {
                Inner::Perftest(PerftestServer::start(id, Verb::Read, spec, ctx)?)
            }
            ServiceKind::AtomicBwServer => {
                Inner::Perftest(PerftestServer::start(id, Verb::Atomic, spec, ctx)?)
            }
            ServiceKind::WriteBwClient => {
                Inner::PerftestClient(PerftestClient::start(id, Verb::Write, spec, ctx)?)
            }
            ServiceKind::SendBwClient => {
                Inner::PerftestClient(PerftestClient::start(id, Verb::Send, spec, ctx)?)
            }
            ServiceKind::ReadBwClient => {
                Inner::PerftestClient(PerftestClient::start(id, Verb::Read, spec, ctx)?)
            }
            ServiceKind::AtomicBwClient => {
                Inner::PerftestClient(PerftestClient::start(id, Verb::Atomic, spec, ctx)?)
            }
        };
        Ok(Service { id, inner })
    }

    /// Id.
    pub fn id(&self) -> u32 {
        self.id
    }

    pub(crate) fn step(&mut self, ctx: &mut ServiceCtx<'_>) -> bool {
        match &mut self.inner {
            Inner::Pingpong(p) => p.step(ctx),
            Inner::Rping(r) => r.step(ctx),
            Inner::Perftest(w) => w.step(ctx),
            Inner::PerftestClient(c) => c.step(ctx),
            Inner::PerftestCm(c) => c.step(ctx),
        }
    }

    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        match &self.inner {
            Inner::Pingpong(p) => p.poll_timeout(),
            Inner::Rping(r) => r.poll_timeout(),
            Inner::Perftest(w) => w.poll_timeout(),
            Inner::PerftestClient(c) => c.poll_timeout(),
            Inner::PerftestCm(c) => c.poll_timeout(),
        }
    }

    pub(crate) fn teardown(
        &mut self,
        sockets: &mut SocketSet<'static>,
        rdma: &mut RdmaDevice,
        now: Instant,
    ) {
        match &mut self.inner {
            Inner::Pingpong(p) => p.teardown(sockets, rdma),
            Inner::Rping(r) => r.teardown(sockets, rdma, now),
            Inner::Perftest(w) => w.teardown(sockets, rdma),
            Inner::PerftestClient(c) => c.teardown(sockets, rdma),
            Inner::PerftestCm(c) => c.teardown(sockets, rdma, now),
        }
    }

    pub(crate) fn status(&self) -> ServiceStatus {
        match &self.inner {
            Inner::Pingpong(p) => p.status(self.id),
            Inner::Perftest(w) => w.status(self.id),
            Inner::PerftestClient(c) => c.status(self.id),
            Inner::Rping(r) => r.status(self.id),
            Inner::PerftestCm(c) => c.status(self.id),
        }
    }

    /// iWARP counters (zero for RoCE services).
    pub fn iwarp_counters(&self) -> crate::iwarp::IwarpCounters {
        match &self.inner {
            Inner::Rping(r) => r.counters(),
            Inner::PerftestCm(c) => c.counters(),
            _ => Default::default(),
        }
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

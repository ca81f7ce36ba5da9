//! Services: state machines speaking an RDMA tool's application protocol on
//! top of the host's TCP sockets and RC queue pairs.

use crate::perftest::{PerftestClient, PerftestServer, Verb};
use crate::perftest_cm::PerftestCm;
use crate::pingpong::{Pingpong, Role};
use crate::rping::Rping;
pub use crate::spec::{ServiceKind, ServiceSpec, ServiceStatus, MAX_MESSAGE, MAX_RX_DEPTH};
use crate::{HostError, RdmaDevice, ServiceCtx};
use smoltcp::iface::SocketSet;
use std::time::Instant;

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
            kind if spec.rdma_cm && kind.is_perftest_bw() => {
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

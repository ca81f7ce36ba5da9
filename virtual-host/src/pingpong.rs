//! `ibv_rc_pingpong` (rdma-core libibverbs/examples) in both roles.
//!
//! Protocol as the tool speaks it:
//! * TCP to port 18515; the client sends its destination as the text
//!   `LID:QPN:PSN:GID` (`%04x:%06x:%06x:` + 32 hex digits of the raw GID)
//!   plus a NUL, 52 bytes; the server connects its QP, answers with its own
//!   52 bytes, and the client writes `"done"` plus a NUL and closes.
//! * Both sides post `rx_depth` receives of `size` bytes before the
//!   exchange; the client posts the first SEND. Each side sends `iters`
//!   messages and receives `iters`: a side posts its next SEND only when both
//!   its previous SEND and a receive have completed.
//! * QP: path MTU 1024, `max_dest_rd_atomic` 1, `min_rnr_timer` 12,
//!   timeout 14, `retry_cnt` 7, `rnr_retry` 7, `max_rd_atomic` 1, no remote access.
//!
//! The tool sends and receives in one buffer, so what it sends is what it
//! last received. Our side sends a distinct pattern each iteration and
//! checks that every message from the tool (after its first, which is the
//! tool's initial fill) echoes our previous one.

use crate::spec::{
    abort_sockets, client_connected, client_target, session_started, tcp_connect, tcp_listen,
    ServiceSpec, SessionTally,
};
use crate::{HostError, RdmaDevice, ServiceCtx, ServiceStatus};
use roce_model::{Access, Mtu, QpAttr, QpCaps, RecvWr, SendOp, SendWr, Sge, WcStatus};
use smoltcp::iface::{SocketHandle, SocketSet};
use smoltcp::socket::tcp::{Socket, State};
use smoltcp::wire::IpAddress;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

/// Length of the exchange message, NUL included.
pub const MSG_LEN: usize = 52;
const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;
/// A session with no completion for this long fails (the peer went away;
/// with `retry_cnt` 7 the QP itself would retry forever).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Client reconnect interval while the server is not up.
const RETRY_INTERVAL: Duration = Duration::from_secs(1);
/// A TCP exchange that does not finish in this time is abandoned.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(20);

/// Which side we play.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Waits for the tool run as client.
    Server,
    /// Connects to the tool run as server.
    Client,
}

/// A side's destination as exchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dest {
    /// LID (0 on RoCE).
    pub lid: u16,
    /// QP number.
    pub qpn: u32,
    /// First PSN.
    pub psn: u32,
    /// GID, raw bytes.
    pub gid: [u8; 16],
}

impl Dest {
    /// The 52-byte wire form.
    pub fn encode(&self) -> [u8; MSG_LEN] {
        let mut s = format!(
            "{:04x}:{:06x}:{:06x}:",
            self.lid,
            self.qpn & 0xff_ffff,
            self.psn & 0xff_ffff
        );
        for b in self.gid {
            s.push_str(&format!("{b:02x}"));
        }
        let mut out = [0u8; MSG_LEN];
        let n = s.len().min(MSG_LEN - 1);
        out[..n].copy_from_slice(&s.as_bytes()[..n]);
        out
    }

    /// Parses the wire form (text up to the first NUL).
    pub fn decode(msg: &[u8]) -> Result<Dest, HostError> {
        let end = msg.iter().position(|&b| b == 0).unwrap_or(msg.len());
        let text = std::str::from_utf8(&msg[..end])
            .map_err(|_| HostError::Invalid("destination message is not text".into()))?;
        let bad = || HostError::Invalid(format!("destination message {text:?}"));
        let mut parts = text.split(':');
        let mut hex = |max: u32| -> Result<u32, HostError> {
            let p = parts.next().ok_or_else(bad)?;
            let v = u32::from_str_radix(p, 16).map_err(|_| bad())?;
            if v > max {
                return Err(bad());
            }
            Ok(v)
        };
        let lid = hex(0xffff)? as u16;
        let qpn = hex(0xff_ffff)?;
        let psn = hex(0xff_ffff)?;
        let g = parts.next().ok_or_else(bad)?;
        if parts.next().is_some() || g.len() != 32 {
            return Err(bad());
        }
        let mut gid = [0u8; 16];
        for (i, b) in gid.iter_mut().enumerate() {
            *b = u8::from_str_radix(&g[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(Dest { lid, qpn, psn, gid })
    }

    /// The IPv4 address of an IPv4-mapped GID.
    pub fn ipv4(&self) -> Option<Ipv4Addr> {
        let g = self.gid;
        (g[..10] == [0; 10] && g[10] == 0xff && g[11] == 0xff)
            .then(|| Ipv4Addr::new(g[12], g[13], g[14], g[15]))
    }
}

/// The IPv4-mapped GID of an address (what rxe shows for an IPv4 netdev address).
pub fn gid_of(ip: Ipv4Addr) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&ip.octets());
    g
}

/// The bytes we send in iteration `k`.
fn pattern(seed: u8, k: u32, size: usize) -> Vec<u8> {
    let base = seed.wrapping_add((k as u8).wrapping_mul(31));
    (0..size)
        .map(|j| {
            base.wrapping_add((j as u8).wrapping_mul(7))
                .wrapping_add((j >> 8) as u8)
        })
        .collect()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Server: waiting for a client's 52 bytes.
    Listening,
    /// Client: TCP connecting / exchanging.
    Connecting,
    /// Client: waiting to retry the connection.
    RetryWait,
    /// RDMA ping-pong.
    Running,
    /// Client: finished (ok or failed).
    Done,
}

struct Session {
    peer: Ipv4Addr,
    qpn: u32,
    lkey: u32,
    my_psn: u32,
    remote: Option<Dest>,
    scnt: u32,
    rcnt: u32,
    routs: u32,
    pending: u64,
    last_sent: Option<u32>,
    verified: u32,
    seed: u8,
    started: Instant,
    last_progress: Instant,
    sent_msg: bool,
}

/// One `ibv_rc_pingpong` service.
pub struct Pingpong {
    id: u32,
    role: Role,
    spec: ServiceSpec,
    sock: Option<SocketHandle>,
    phase: Phase,
    session: Option<Session>,
    retry_at: Option<Instant>,
    exchange_deadline: Option<Instant>,
    connect_deadline: Instant,
    tally: SessionTally,
}

impl Pingpong {
    pub(crate) fn start(
        id: u32,
        role: Role,
        spec: ServiceSpec,
        ctx: &mut ServiceCtx<'_>,
    ) -> Result<Self, HostError> {
        let sock = ctx.new_tcp_socket()?;
        let mut p = Pingpong {
            id,
            role,
            connect_deadline: ctx.now + spec.connect_timeout,
            spec,
            sock: Some(sock),
            phase: Phase::Listening,
            session: None,
            retry_at: None,
            exchange_deadline: None,
            tally: SessionTally::default(),
        };
        match role {
            Role::Server => {
                tcp_listen(ctx, sock, p.spec.port)?;
            }
            Role::Client => {
                if let Err(e) = p.connect(ctx) {
                    ctx.sockets.remove(sock);
                    return Err(e);
                }
            }
        }
        Ok(p)
    }

    fn connect(&mut self, ctx: &mut ServiceCtx<'_>) -> Result<(), HostError> {
        let (peer, sock) = client_target(&self.spec, self.sock)?;
        // The tool posts its receives before the exchange; so do we.
        let s = new_session(ctx, &self.spec, peer)?;
        if let Err(e) = tcp_connect(ctx, sock, peer, self.spec.port) {
            free_session(ctx.rdma, &s);
            return Err(e);
        }
        self.session = Some(s);
        self.phase = Phase::Connecting;
        self.exchange_deadline = Some(ctx.now + EXCHANGE_TIMEOUT);
        Ok(())
    }

    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        let idle = self
            .session
            .as_ref()
            .filter(|_| self.phase == Phase::Running)
            .map(|s| s.last_progress + IDLE_TIMEOUT);
        [self.retry_at, idle, self.exchange_deadline]
            .into_iter()
            .flatten()
            .min()
    }

    pub(crate) fn teardown(&mut self, sockets: &mut SocketSet<'static>, rdma: &mut RdmaDevice) {
        if let Some(s) = self.session.take() {
            free_session(rdma, &s);
        }
        abort_sockets(sockets, self.sock.take());
        self.phase = Phase::Done;
    }

    pub(crate) fn status(&self, id: u32) -> ServiceStatus {
        let state = match self.phase {
            Phase::Listening => "listening",
            Phase::Connecting => "connecting",
            Phase::RetryWait => "waiting-for-server",
            Phase::Running => "running",
            Phase::Done => self.tally.stopped_state(),
        };
        let peer = self.session.as_ref().map(|s| s.peer).or(self.spec.peer);
        self.tally
            .status(id, &self.spec, peer, state, self.progress_mark())
    }

    /// Client: drops the attempt and tries again in a second, until the
    /// connect deadline.
    fn retry_later(&mut self, ctx: &mut ServiceCtx<'_>) {
        if let Some(s) = self.session.take() {
            free_session(ctx.rdma, &s);
        }
        if let Some(h) = self.sock {
            ctx.sockets.get_mut::<Socket>(h).abort();
        }
        self.exchange_deadline = None;
        if ctx.now + RETRY_INTERVAL < self.connect_deadline {
            self.retry_at = Some(ctx.now + RETRY_INTERVAL);
            self.phase = Phase::RetryWait;
        } else {
            self.fail(ctx, "could not reach the server".into());
        }
    }

    /// Ends the current session with an error.
    fn fail(&mut self, ctx: &mut ServiceCtx<'_>, reason: String) {
        let peer = self.session.as_ref().map(|s| s.peer).or(self.spec.peer);
        if let Some(s) = self.session.take() {
            free_session(ctx.rdma, &s);
        }
        self.tally.failed(ctx, self.id, peer, reason);
        self.exchange_deadline = None;
        self.end_session(ctx);
    }

    /// Back to listening (server) or done (client).
    fn end_session(&mut self, ctx: &mut ServiceCtx<'_>) {
        self.exchange_deadline = None;
        match self.role {
            Role::Server => {
                if let Some(h) = self.sock {
                    let sock = ctx.sockets.get_mut::<Socket>(h);
                    if sock.state() != State::Listen {
                        sock.abort();
                    }
                }
                self.phase = Phase::Listening;
            }
            Role::Client => self.phase = Phase::Done,
        }
    }

    /// Runs the state machine; returns whether anything changed.
    pub(crate) fn step(&mut self, ctx: &mut ServiceCtx<'_>) -> bool {
        let before = (self.phase, self.progress_mark());
        if self
            .exchange_deadline
            .is_some_and(|d| ctx.now >= d && self.phase != Phase::Running)
        {
            if self.phase == Phase::Connecting {
                // No answer at all (the guest is still booting): try again.
                self.retry_later(ctx);
            } else {
                self.fail(ctx, "TCP exchange timed out".into());
            }
        }
        match self.phase {
            Phase::Listening => self.step_listen(ctx),
            Phase::Connecting => self.step_connect(ctx),
            Phase::RetryWait => {
                if self.retry_at.is_some_and(|t| ctx.now >= t) {
                    self.retry_at = None;
                    if let Err(e) = self.connect(ctx) {
                        self.fail(ctx, e.to_string());
                    }
                }
            }
            Phase::Running => {
                self.drain_tcp(ctx);
                self.step_run(ctx);
            }
            Phase::Done => {}
        }
        before != (self.phase, self.progress_mark())
    }

    fn progress_mark(&self) -> (u32, u32) {
        self.session.as_ref().map_or((0, 0), |s| (s.scnt, s.rcnt))
    }

    fn step_listen(&mut self, ctx: &mut ServiceCtx<'_>) {
        let Some(h) = self.sock else { return };
        let sock = ctx.sockets.get_mut::<Socket>(h);
        if !client_connected(sock, self.spec.port, &mut self.tally.last_error) {
            return;
        }
        if self.exchange_deadline.is_none() {
            self.exchange_deadline = Some(ctx.now + EXCHANGE_TIMEOUT);
        }
        if sock.recv_queue() < MSG_LEN {
            if !sock.may_recv() {
                // The client went away before sending its destination.
                sock.abort();
                self.exchange_deadline = None;
            }
            return;
        }
        let mut msg = [0u8; MSG_LEN];
        let n = sock.recv_slice(&mut msg).unwrap_or(0);
        let peer = match sock.remote_endpoint().map(|e| e.addr) {
            Some(IpAddress::Ipv4(a)) => a,
            _ => {
                sock.abort();
                return;
            }
        };
        if n != MSG_LEN {
            sock.abort();
            return;
        }
        let remote = match Dest::decode(&msg) {
            Ok(d) => d,
            Err(e) => {
                self.session = None;
                self.spec.peer = None;
                self.tally.failed(ctx, self.id, Some(peer), e.to_string());
                self.end_session(ctx);
                return;
            }
        };
        // rxe addresses the path by the GID; prefer it over the TCP peer.
        let path = remote.ipv4().unwrap_or(peer);
        let mut s = match new_session(ctx, &self.spec, path) {
            Ok(s) => s,
            Err(e) => {
                self.fail(ctx, e.to_string());
                return;
            }
        };
        if let Err(e) = connect_qp(ctx.rdma, &self.spec, &s, &remote) {
            free_session(ctx.rdma, &s);
            self.fail(ctx, e.to_string());
            return;
        }
        s.remote = Some(remote);
        let mine = Dest {
            lid: 0,
            qpn: s.qpn,
            psn: s.my_psn,
            gid: gid_of(ctx.ip),
        };
        let sock = ctx.sockets.get_mut::<Socket>(h);
        if sock.send_slice(&mine.encode()) != Ok(MSG_LEN) {
            free_session(ctx.rdma, &s);
            self.fail(ctx, "cannot send our destination".into());
            return;
        }
        s.started = ctx.now;
        s.last_progress = ctx.now;
        session_started(ctx, self.id, path, s.qpn, remote.qpn);
        self.session = Some(s);
        self.phase = Phase::Running;
        self.exchange_deadline = None;
    }

    fn step_connect(&mut self, ctx: &mut ServiceCtx<'_>) {
        let (Some(h), Some(s)) = (self.sock, self.session.as_mut()) else {
            return;
        };
        let sock = ctx.sockets.get_mut::<Socket>(h);
        match sock.state() {
            State::Closed | State::TimeWait => {
                // Refused (the tool is not listening yet) or reset: retry.
                self.retry_later(ctx);
                return;
            }
            State::SynSent | State::SynReceived => return,
            _ => {}
        }
        if !s.sent_msg {
            let mine = Dest {
                lid: 0,
                qpn: s.qpn,
                psn: s.my_psn,
                gid: gid_of(ctx.ip),
            };
            if sock.send_slice(&mine.encode()) != Ok(MSG_LEN) {
                self.fail(ctx, "cannot send our destination".into());
                return;
            }
            s.sent_msg = true;
        }
        if sock.recv_queue() < MSG_LEN {
            if !sock.may_recv() {
                self.fail(ctx, "server closed before sending its destination".into());
            }
            return;
        }
        let mut msg = [0u8; MSG_LEN];
        if sock.recv_slice(&mut msg) != Ok(MSG_LEN) {
            self.fail(ctx, "short destination message".into());
            return;
        }
        let _ = sock.send_slice(b"done\0");
        sock.close();
        let remote = match Dest::decode(&msg) {
            Ok(d) => d,
            Err(e) => {
                self.fail(ctx, e.to_string());
                return;
            }
        };
        let Some(s) = self.session.as_mut() else {
            return;
        };
        if let Err(e) = connect_qp(ctx.rdma, &self.spec, s, &remote) {
            self.fail(ctx, e.to_string());
            return;
        }
        s.remote = Some(remote);
        s.started = ctx.now;
        s.last_progress = ctx.now;
        let (peer, qpn) = (s.peer, s.qpn);
        if let Err(e) = post_send(ctx.rdma, &self.spec, s) {
            self.fail(ctx, e.to_string());
            return;
        }
        s.pending = RECV_WRID | SEND_WRID;
        session_started(ctx, self.id, peer, qpn, remote.qpn);
        self.phase = Phase::Running;
        self.exchange_deadline = None;
    }

    /// Reads and ignores the tool's `"done"`; closes when it does.
    fn drain_tcp(&mut self, ctx: &mut ServiceCtx<'_>) {
        let Some(h) = self.sock else { return };
        let sock = ctx.sockets.get_mut::<Socket>(h);
        let mut buf = [0u8; 64];
        while sock.can_recv() {
            match sock.recv_slice(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        if sock.state() == State::CloseWait {
            sock.close();
        }
    }

    fn step_run(&mut self, ctx: &mut ServiceCtx<'_>) {
        let Some(s) = self.session.as_mut() else {
            self.end_session(ctx);
            return;
        };
        let size = self.spec.size as usize;
        let mut error = None;
        while let Some(c) = ctx.rdma.poll_completion(s.qpn) {
            s.last_progress = ctx.now;
            if c.status != WcStatus::Success {
                error = Some(format!(
                    "completion status {:?} for wr_id {}",
                    c.status, c.wr_id
                ));
                break;
            }
            match c.wr_id {
                SEND_WRID => s.scnt += 1,
                RECV_WRID => {
                    if let Some(k) = s.last_sent.filter(|_| !self.spec.echo) {
                        let want = pattern(s.seed, k, size);
                        let got = ctx.rdma.read(s.lkey, 0, size).unwrap_or_default();
                        if c.byte_len as usize != size || got != want {
                            error = Some(format!(
                                "message {} from the peer ({} bytes) does not echo our message {k}",
                                s.rcnt, c.byte_len
                            ));
                            break;
                        }
                        s.verified += 1;
                    }
                    s.routs = s.routs.saturating_sub(1);
                    if s.routs <= 1 {
                        while s.routs < self.spec.rx_depth {
                            if let Err(e) = post_recv(ctx.rdma, size, s) {
                                error = Some(e.to_string());
                                break;
                            }
                            s.routs += 1;
                        }
                    }
                    s.rcnt += 1;
                }
                other => {
                    error = Some(format!("completion for unknown wr_id {other}"));
                    break;
                }
            }
            s.pending &= !c.wr_id;
            if s.scnt < self.spec.iters && s.pending == 0 {
                if let Err(e) = post_send(ctx.rdma, &self.spec, s) {
                    error = Some(e.to_string());
                    break;
                }
                s.pending = RECV_WRID | SEND_WRID;
            }
        }
        if let Some(e) = error {
            self.fail(ctx, e);
            return;
        }
        if s.scnt >= self.spec.iters && s.rcnt >= self.spec.iters {
            let (peer, iterations, verified) = (s.peer, s.rcnt, s.verified);
            let elapsed = ctx.now.saturating_duration_since(s.started);
            if let Some(s) = self.session.take() {
                ctx.rdma.retire_qp(s.qpn, ctx.now);
                ctx.rdma.deregister_mr(s.lkey);
            }
            self.tally
                .finished(ctx, self.id, peer, iterations, verified, elapsed);
            self.end_session(ctx);
            return;
        }
        if ctx.now.saturating_duration_since(s.last_progress) >= IDLE_TIMEOUT {
            let msg = format!(
                "no completion for {} s ({} sent, {} received)",
                IDLE_TIMEOUT.as_secs(),
                s.scnt,
                s.rcnt
            );
            self.fail(ctx, msg);
        }
    }
}

fn new_session(
    ctx: &mut ServiceCtx<'_>,
    spec: &ServiceSpec,
    peer: Ipv4Addr,
) -> Result<Session, HostError> {
    let size = spec.size as usize;
    let lkey = ctx.rdma.register_mr(2 * size)?;
    let caps = QpCaps {
        max_send_wr: 4,
        max_recv_wr: spec.rx_depth as usize + 1,
        max_sge: 1,
        ..QpCaps::default()
    };
    let qpn = match ctx.rdma.create_qp(peer, caps) {
        Ok(q) => q,
        Err(e) => {
            ctx.rdma.deregister_mr(lkey);
            return Err(e);
        }
    };
    let r = ctx.rng.next_u64();
    // The tool's initial fill.
    ctx.rdma.write(lkey, 0, &vec![0x7b; size])?;
    let mut s = Session {
        peer,
        qpn,
        lkey,
        my_psn: (r & 0xff_ffff) as u32,
        remote: None,
        scnt: 0,
        rcnt: 0,
        routs: 0,
        pending: RECV_WRID,
        last_sent: None,
        verified: 0,
        seed: (r >> 32) as u8,
        started: ctx.now,
        last_progress: ctx.now,
        sent_msg: false,
    };
    for _ in 0..spec.rx_depth {
        if let Err(e) = post_recv(ctx.rdma, size, &s) {
            free_session(ctx.rdma, &s);
            return Err(e);
        }
        s.routs += 1;
    }
    Ok(s)
}

fn free_session(rdma: &mut RdmaDevice, s: &Session) {
    rdma.destroy_qp(s.qpn);
    rdma.deregister_mr(s.lkey);
}

fn post_recv(rdma: &mut RdmaDevice, size: usize, s: &Session) -> Result<(), HostError> {
    rdma.post_recv(
        s.qpn,
        RecvWr::new(RECV_WRID, vec![Sge::new(0, size as u32, s.lkey)]),
    )
}

fn post_send(rdma: &mut RdmaDevice, spec: &ServiceSpec, s: &mut Session) -> Result<(), HostError> {
    let size = spec.size as usize;
    let k = s.last_sent.map_or(0, |k| k + 1);
    // Echo mode sends the receive area, as the tool does.
    let at = if spec.echo { 0 } else { size as u64 };
    if !spec.echo {
        rdma.write(s.lkey, at, &pattern(s.seed, k, size))?;
    }
    rdma.post_send(
        s.qpn,
        SendWr::new(
            SEND_WRID,
            SendOp::Send,
            vec![Sge::new(at, spec.size, s.lkey)],
        ),
    )?;
    s.last_sent = Some(k);
    Ok(())
}

fn connect_qp(
    rdma: &mut RdmaDevice,
    spec: &ServiceSpec,
    s: &Session,
    remote: &Dest,
) -> Result<(), HostError> {
    let pmtu = match spec.mtu {
        256 => Mtu::Mtu256,
        512 => Mtu::Mtu512,
        2048 => Mtu::Mtu2048,
        4096 => Mtu::Mtu4096,
        _ => Mtu::Mtu1024,
    };
    rdma.connect_qp(
        s.qpn,
        &QpAttr {
            pmtu,
            sq_psn: s.my_psn,
            rq_psn: remote.psn,
            dest_qpn: remote.qpn,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            access: Access::NONE,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dest_round_trips_in_the_tools_format() {
        let d = Dest {
            lid: 0,
            qpn: 0x11,
            psn: 0xabcdef,
            gid: gid_of(Ipv4Addr::new(10, 77, 0, 1)),
        };
        let m = d.encode();
        assert_eq!(
            &m[..51],
            b"0000:000011:abcdef:00000000000000000000ffff0a4d0001"
        );
        assert_eq!(m[51], 0);
        assert_eq!(Dest::decode(&m).unwrap(), d);
        assert_eq!(d.ipv4(), Some(Ipv4Addr::new(10, 77, 0, 1)));
    }

    #[test]
    fn bad_dest_messages_are_refused() {
        for bad in [
            &b"zzzz:000011:abcdef:00000000000000000000ffff0a4d0001\0"[..],
            b"0000:1000000:abcdef:00000000000000000000ffff0a4d0001",
            b"0000:000011:abcdef:0000",
            b"0000:000011",
            b"\xff\xfe",
            b"",
        ] {
            assert!(Dest::decode(bad).is_err(), "{bad:?}");
        }
    }
}

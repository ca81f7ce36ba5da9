//! perftest servers (`ib_write_bw`, `ib_send_bw`, `ib_read_bw`,
//! `ib_atomic_bw`) over the tools' TCP side channel.
//!
//! perftest's exchange (perftest_communication.c, version 6.24 as in Debian
//! trixie's perftest 25.01) is a strict alternation: for every item the
//! client writes N bytes and the server, having read exactly N, writes N
//! bytes back (the tool reads with one `read()` and insists on N). For a
//! half-duplex `ib_write_bw` over RC with a GID the items are:
//!
//! | # | bytes | content |
//! |---|---|---|
//! | 0 | 16 | version string (`"6.24"`, NUL padded) |
//! | 1 | 4 | cycle buffer (page size), big-endian |
//! | 2 | 4 | cache line size, big-endian |
//! | 3 | 2 | path MTU enum as text (`"3"` = 1024) |
//! | 4–6 | 108 | keys: `%04x:%04x:%06x:%06x:%08x:%016llx:` LID, out_reads, QPN, PSN, rkey, vaddr, 16 × `%02x:` GID bytes, `%08x:` SRQN, NUL; three times (exchange, print, after RTR) |
//! | – | | the client WRITEs into our buffer |
//! | 7 | 108 | keys again (the client finished) |
//! | 8–12 | 8 each | reports: size, iterations, peak BW, average BW, message rate |
//! | 13 | 108 | keys (close) |
//!
//! We answer as a 6.24 server would, with a buffer of `2 × max(size, 4096)`
//! bytes open for remote writes. The tool does not check written data, so
//! neither do we; the session reports the WRITE messages the QP accepted.

use crate::pingpong::gid_of;
use crate::spec::{
    abort_sockets, client_target, session_started, tcp_connect, tcp_listen, ServiceSpec,
    SessionTally,
};
use crate::{HostError, RdmaDevice, ServiceCtx, ServiceStatus};
use roce_model::{Access, Mtu, QpAttr, QpCaps, RecvWr, SendOp, SendWr, Sge, WcStatus};
use smoltcp::iface::{SocketHandle, SocketSet};
use smoltcp::socket::tcp::{Socket, State};
use smoltcp::wire::IpAddress;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

/// Length of a key message with a GID.
pub const KEY_MSG_LEN: usize = 108;
/// The version we claim.
const VERSION: &[u8] = b"6.24";
/// Our cycle buffer (page size) and cache line.
pub(crate) const CYCLE_BUFFER: u32 = 4096;
const CACHE_LINE: u32 = 64;

/// Our part of items 0 to 2, which every perftest exchange (TCP or rdma_cm,
/// either side) opens with: the version, the cycle buffer and the cache line.
pub(crate) fn opening_item(step: usize) -> Vec<u8> {
    match step {
        0 => {
            let mut v = vec![0u8; 16];
            v[..VERSION.len()].copy_from_slice(VERSION);
            v
        }
        1 => CYCLE_BUFFER.to_be_bytes().to_vec(),
        _ => CACHE_LINE.to_be_bytes().to_vec(),
    }
}

/// A peer whose perftest is older than 5.70 (its version text).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("perftest version {0:?} (need >= 5.70)")]
pub struct OldPeerVersion(pub String);

/// Checks the peer's item 0, its version: one older than 5.70 is refused
/// with its text.
pub(crate) fn check_peer_version(msg: &[u8]) -> Result<(), OldPeerVersion> {
    let v: String = msg
        .iter()
        .take_while(|&&b| b != 0)
        .map(|&b| char::from(b))
        .collect();
    let ver: f64 = v.trim().parse().unwrap_or(0.0);
    if ver < 5.70 {
        return Err(OldPeerVersion(v));
    }
    Ok(())
}
/// The items every exchange starts with, by size: version, cycle buffer,
/// cache line, MTU, then four key messages.
const OPENING_SCRIPT: [usize; 8] = [
    16,
    4,
    4,
    2,
    KEY_MSG_LEN,
    KEY_MSG_LEN,
    KEY_MSG_LEN,
    KEY_MSG_LEN,
];
/// The `ib_write_bw` exchange items' sizes, in order.
const WRITE_SCRIPT: [usize; 14] = script(&[8, 8, 8, 8, 8, KEY_MSG_LEN]);
/// The `ib_send_bw` items: three key exchanges (exchange, after connect,
/// print), one after the server posted its receives, then the client's
/// SENDs, then one at close.
const SEND_SCRIPT: [usize; 9] = script(&[KEY_MSG_LEN]);

/// A whole exchange's item sizes: [`OPENING_SCRIPT`], then `rest`.
const fn script<const N: usize>(rest: &[usize]) -> [usize; N] {
    assert!(N == OPENING_SCRIPT.len() + rest.len());
    let mut items = [0; N];
    let mut i = 0;
    while i < N {
        items[i] = if i < OPENING_SCRIPT.len() {
            OPENING_SCRIPT[i]
        } else {
            rest[i - OPENING_SCRIPT.len()]
        };
        i += 1;
    }
    items
}
/// Item after which the client's keys are known.
const FIRST_KEYS: usize = 4;
/// A session with no exchange progress for this long fails.
const STALL_TIMEOUT: Duration = Duration::from_secs(60);

/// A side's keys as perftest prints them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keys {
    /// LID.
    pub lid: u16,
    /// Outstanding reads.
    pub out_reads: u32,
    /// QP number.
    pub qpn: u32,
    /// PSN.
    pub psn: u32,
    /// rkey of the buffer.
    pub rkey: u32,
    /// Address of the buffer.
    pub vaddr: u64,
    /// GID.
    pub gid: [u8; 16],
    /// SRQ number.
    pub srqn: u32,
}

impl Keys {
    /// The keys of the host at `ip` before its QP and buffer exist (filled
    /// in as the exchange reaches them).
    fn initial(ip: Ipv4Addr) -> Self {
        Keys {
            lid: 0,
            out_reads: 16,
            qpn: 0,
            psn: 0,
            rkey: 0,
            vaddr: 0,
            gid: gid_of(ip),
            srqn: 0,
        }
    }

    /// The 108-byte wire form.
    pub fn encode(&self) -> [u8; KEY_MSG_LEN] {
        let mut s = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
            self.lid,
            self.out_reads & 0xffff,
            self.qpn & 0xff_ffff,
            self.psn & 0xff_ffff,
            self.rkey,
            self.vaddr
        );
        for b in self.gid {
            s.push_str(&format!("{b:02x}:"));
        }
        s.push_str(&format!("{:08x}:", self.srqn));
        let mut out = [0u8; KEY_MSG_LEN];
        let n = s.len().min(KEY_MSG_LEN - 1);
        out[..n].copy_from_slice(&s.as_bytes()[..n]);
        out
    }

    /// Parses the wire form.
    pub fn decode(msg: &[u8]) -> Result<Keys, HostError> {
        let end = msg.iter().position(|&b| b == 0).unwrap_or(msg.len());
        let text = std::str::from_utf8(&msg[..end])
            .map_err(|_| HostError::Invalid("perftest keys are not text".into()))?;
        let bad = || HostError::Invalid(format!("perftest keys {text:?}"));
        let f: Vec<&str> = text.split(':').collect();
        if f.len() < 23 {
            return Err(bad());
        }
        let hex = |s: &str| u64::from_str_radix(s, 16).map_err(|_| bad());
        let mut gid = [0u8; 16];
        for (i, b) in gid.iter_mut().enumerate() {
            *b = u8::try_from(hex(f[6 + i])?).map_err(|_| bad())?;
        }
        let lim = |v: u64, max: u64| if v > max { Err(bad()) } else { Ok(v) };
        Ok(Keys {
            lid: lim(hex(f[0])?, 0xffff)? as u16,
            out_reads: lim(hex(f[1])?, 0xffff)? as u32,
            qpn: lim(hex(f[2])?, 0xff_ffff)? as u32,
            psn: lim(hex(f[3])?, 0xff_ffff)? as u32,
            rkey: lim(hex(f[4])?, 0xffff_ffff)? as u32,
            vaddr: hex(f[5])?,
            gid,
            srqn: lim(hex(f[22])?, 0xffff_ffff)? as u32,
        })
    }
}

struct Session {
    peer: Ipv4Addr,
    qpn: Option<u32>,
    lkey: Option<u32>,
    keys: Keys,
    mtu: Mtu,
    step: usize,
    started: Instant,
    last_progress: Instant,
}

/// Why a perftest session (server or client) failed: the side channel
/// broke or stalled, or the QP reported an error. The service keeps the
/// text (`last_error`, the `SessionFailed` event).
#[derive(Debug, thiserror::Error)]
pub(crate) enum PerftestError {
    /// The client's TCP connection went before the exchange's end.
    #[error("client closed at exchange item {0}")]
    ClientClosed(usize),
    /// The server's TCP connection went before the exchange's end.
    #[error("server closed at exchange item {0}")]
    ServerClosed(usize),
    /// No item for [`STALL_TIMEOUT`].
    #[error("exchange stalled at item {0}")]
    Stalled(usize),
    /// The item was in the socket but did not come out whole.
    #[error("short read")]
    ShortRead,
    /// Our item did not fit into the socket's send buffer.
    #[error("cannot send")]
    CannotSend,
    /// Client: the server did not listen within the connect timeout.
    #[error("could not reach the server")]
    Unreachable,
    /// Client: the operations are due but there is no QP.
    #[error("no QP")]
    NoQp,
    /// Server, SEND test: a receive completed with an error.
    #[error("receive {received} completed with {status:?}")]
    ReceiveStatus {
        /// Receives completed before it.
        received: u64,
        /// Its status.
        status: WcStatus,
    },
    /// Client: an operation completed with an error.
    #[error("operation {wr_id} completed with {status:?}")]
    OperationStatus {
        /// The operation's work request id (its number).
        wr_id: u64,
        /// Its status.
        status: WcStatus,
    },
    /// Client: operations outstanding and none completed for
    /// [`STALL_TIMEOUT`].
    #[error("no completion for {} s ({completed} of {iters} done)", STALL_TIMEOUT.as_secs())]
    NoCompletion {
        /// Operations completed.
        completed: u32,
        /// Operations the run has.
        iters: u32,
    },
    /// The host refused (QP, memory, socket) or an item was invalid.
    #[error(transparent)]
    Host(#[from] HostError),
}

/// Which perftest test the server serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    /// `ib_write_bw`: the client WRITEs into our buffer.
    Write,
    /// `ib_send_bw`: the client SENDs into our posted receives.
    Send,
    /// `ib_read_bw`: the client READs our buffer.
    Read,
    /// `ib_atomic_bw`: the client runs atomics on our buffer.
    Atomic,
}

/// The perftest server service.
pub struct PerftestServer {
    id: u32,
    verb: Verb,
    spec: ServiceSpec,
    /// Receives completed in the current session (SEND test).
    received: u64,
    sock: Option<SocketHandle>,
    session: Option<Session>,
    tally: SessionTally,
    /// Since when the last session's connection is closing; a peer that
    /// never finishes the close is cut after [`STALL_TIMEOUT`].
    closing_since: Option<Instant>,
}

impl PerftestServer {
    fn script(&self) -> &'static [usize] {
        match self.verb {
            // ib_read_bw and ib_atomic_bw servers wait like ib_write_bw's.
            Verb::Write | Verb::Read | Verb::Atomic => &WRITE_SCRIPT,
            Verb::Send => &SEND_SCRIPT,
        }
    }

    pub(crate) fn start(
        id: u32,
        verb: Verb,
        spec: ServiceSpec,
        ctx: &mut ServiceCtx<'_>,
    ) -> Result<Self, HostError> {
        let sock = ctx.new_tcp_socket()?;
        tcp_listen(ctx, sock, spec.port)?;
        Ok(PerftestServer {
            id,
            verb,
            received: 0,
            closing_since: None,
            spec,
            sock: Some(sock),
            session: None,
            tally: SessionTally::default(),
        })
    }

    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        self.session
            .as_ref()
            .map(|s| s.last_progress + STALL_TIMEOUT)
            .or(self.closing_since.map(|t| t + STALL_TIMEOUT))
    }

    pub(crate) fn teardown(&mut self, sockets: &mut SocketSet<'static>, rdma: &mut RdmaDevice) {
        if let Some(s) = self.session.take() {
            free(rdma, &s);
        }
        abort_sockets(sockets, self.sock.take());
    }

    pub(crate) fn status(&self, id: u32) -> ServiceStatus {
        let state = if self.session.is_some() {
            "running"
        } else {
            "listening"
        };
        let peer = self.session.as_ref().map(|s| s.peer);
        let progress = self.session.as_ref().map_or((0, 0), |s| (s.step as u32, 0));
        self.tally.status(id, &self.spec, peer, state, progress)
    }

    fn end(&mut self, ctx: &mut ServiceCtx<'_>, result: Result<u32, PerftestError>) {
        let Some(s) = self.session.take() else { return };
        free(ctx.rdma, &s);
        let failed = result.is_err();
        match result {
            Ok(n) => {
                let elapsed = ctx.now.saturating_duration_since(s.started);
                self.tally.finished(ctx, self.id, s.peer, n, 0, elapsed);
            }
            Err(e) => self.tally.failed(ctx, self.id, Some(s.peer), e.to_string()),
        }
        if let Some(h) = self.sock {
            let sock = ctx.sockets.get_mut::<Socket>(h);
            if failed {
                sock.abort();
            } else if sock.state() != State::Listen {
                sock.close();
            }
        }
        self.closing_since = Some(ctx.now);
    }

    /// SEND test: counts and reposts receives.
    fn poll_receives(&mut self, ctx: &mut ServiceCtx<'_>) -> Result<bool, PerftestError> {
        let Some((qpn, lkey)) = self.session.as_ref().and_then(|s| Some((s.qpn?, s.lkey?))) else {
            return Ok(false);
        };
        let mut any = false;
        while let Some(c) = ctx.rdma.poll_completion(qpn) {
            any = true;
            if c.status != WcStatus::Success {
                return Err(PerftestError::ReceiveStatus {
                    received: self.received,
                    status: c.status,
                });
            }
            if c.is_recv() {
                self.received += 1;
                post_recv(ctx.rdma, qpn, lkey, self.spec.size)?;
            }
        }
        if any {
            if let Some(s) = self.session.as_mut() {
                s.last_progress = ctx.now;
            }
        }
        Ok(any)
    }

    /// Runs the exchange; returns whether anything changed.
    pub(crate) fn step(&mut self, ctx: &mut ServiceCtx<'_>) -> bool {
        let Some(h) = self.sock else { return false };
        let before = self.session.as_ref().map(|s| s.step);
        let polled = match self.poll_receives(ctx) {
            Ok(any) => any,
            Err(e) => {
                self.end(ctx, Err(e));
                return true;
            }
        };
        let state = ctx.sockets.get_mut::<Socket>(h).state();
        if self.session.is_none() {
            match state {
                State::Closed => {
                    self.closing_since = None;
                    let _ = ctx.sockets.get_mut::<Socket>(h).listen(self.spec.port);
                    return false;
                }
                State::Listen | State::SynReceived => {}
                State::Established if self.closing_since.is_none() => {}
                _ => {
                    // Still closing the last session's connection.
                    if self
                        .closing_since
                        .is_some_and(|t| ctx.now.saturating_duration_since(t) >= STALL_TIMEOUT)
                    {
                        ctx.sockets.get_mut::<Socket>(h).abort();
                    }
                    return false;
                }
            }
            match state {
                State::Established => {
                    let peer = match ctx.sockets.get_mut::<Socket>(h).remote_endpoint() {
                        Some(e) => match e.addr {
                            IpAddress::Ipv4(a) => a,
                        },
                        None => return false,
                    };
                    self.received = 0;
                    self.session = Some(Session {
                        peer,
                        qpn: None,
                        lkey: None,
                        keys: Keys::initial(ctx.ip),
                        mtu: Mtu::Mtu1024,
                        step: 0,
                        started: ctx.now,
                        last_progress: ctx.now,
                    });
                }
                _ => return false,
            }
        }
        let script = self.script();
        while let Some(s) = self.session.as_mut() {
            if s.step >= script.len() {
                let n = s
                    .qpn
                    .and_then(|q| ctx.rdma.qp_stats(q))
                    .map_or(0, |st| st.messages_received as u32);
                self.end(ctx, Ok(n));
                break;
            }
            let want = script[s.step];
            let sock = ctx.sockets.get_mut::<Socket>(h);
            if sock.recv_queue() < want {
                if !sock.may_recv() {
                    let e = PerftestError::ClientClosed(s.step);
                    self.end(ctx, Err(e));
                } else if ctx.now.saturating_duration_since(s.last_progress) >= STALL_TIMEOUT {
                    let e = PerftestError::Stalled(s.step);
                    self.end(ctx, Err(e));
                }
                break;
            }
            let mut msg = vec![0u8; want];
            if sock.recv_slice(&mut msg) != Ok(want) {
                self.end(ctx, Err(PerftestError::ShortRead));
                break;
            }
            let reply = match self.answer(ctx, &msg) {
                Ok(r) => r,
                Err(e) => {
                    self.end(ctx, Err(e.into()));
                    break;
                }
            };
            let sock = ctx.sockets.get_mut::<Socket>(h);
            if sock.send_slice(&reply) != Ok(reply.len()) {
                self.end(ctx, Err(PerftestError::CannotSend));
                break;
            }
            if let Some(s) = self.session.as_mut() {
                s.step += 1;
                s.last_progress = ctx.now;
            }
        }
        polled || before != self.session.as_ref().map(|s| s.step)
    }

    /// Our answer to item `step`, whose client part is `msg`.
    fn answer(&mut self, ctx: &mut ServiceCtx<'_>, msg: &[u8]) -> Result<Vec<u8>, HostError> {
        let spec_size = self.spec.size;
        let iters = self.spec.iters;
        let s = self
            .session
            .as_mut()
            .ok_or_else(|| HostError::Invalid("no session".into()))?;
        Ok(match s.step {
            0..=2 => opening_item(s.step),
            3 => {
                // The client takes the smaller MTU; we offer 1024.
                s.mtu = negotiated_mtu(msg);
                vec![b'0' + s.mtu as u8, 0]
            }
            FIRST_KEYS => {
                let remote = Keys::decode(msg)?;
                let path = {
                    let g = remote.gid;
                    if g[..10] == [0; 10] && g[10] == 0xff && g[11] == 0xff {
                        Ipv4Addr::new(g[12], g[13], g[14], g[15])
                    } else {
                        s.peer
                    }
                };
                let len = 2 * (spec_size.max(CYCLE_BUFFER) as usize);
                let lkey = ctx.rdma.register_mr_access(len, Access::ALL)?;
                s.lkey = Some(lkey);
                let rx_depth = match self.verb {
                    Verb::Send => self.spec.rx_depth as usize,
                    _ => 0,
                };
                let qpn = ctx.rdma.create_qp(
                    path,
                    QpCaps {
                        max_send_wr: 4,
                        max_recv_wr: rx_depth + 1,
                        max_sge: 1,
                        ..QpCaps::default()
                    },
                )?;
                s.qpn = Some(qpn);
                // The tool's server posts its receives before the last
                // handshake; ours are ready from the start.
                for _ in 0..rx_depth {
                    post_recv(ctx.rdma, qpn, lkey, spec_size)?;
                }
                let psn = (ctx.rng.next_u64() & 0xff_ffff) as u32;
                ctx.rdma.connect_qp(
                    qpn,
                    &QpAttr {
                        pmtu: s.mtu,
                        sq_psn: psn,
                        rq_psn: remote.psn,
                        dest_qpn: remote.qpn,
                        timeout: 14,
                        retry_cnt: 7,
                        rnr_retry: 7,
                        min_rnr_timer: 12,
                        max_rd_atomic: 16,
                        max_dest_rd_atomic: 16,
                        access: match self.verb {
                            Verb::Write => Access::REMOTE_WRITE,
                            Verb::Send => Access::NONE,
                            Verb::Read => Access::REMOTE_READ,
                            Verb::Atomic => Access::REMOTE_ATOMIC,
                        },
                    },
                )?;
                s.keys.qpn = qpn;
                s.keys.psn = psn;
                s.keys.rkey = lkey;
                s.keys.vaddr = 0;
                session_started(ctx, self.id, path, qpn, remote.qpn);
                s.keys.encode().to_vec()
            }
            _ if msg.len() == KEY_MSG_LEN => s.keys.encode().to_vec(),
            8 => u64::from(spec_size).to_be_bytes().to_vec(),
            9 => u64::from(iters).to_be_bytes().to_vec(),
            _ => vec![0u8; msg.len()],
        })
    }
}

fn post_recv(rdma: &mut RdmaDevice, qpn: u32, lkey: u32, size: u32) -> Result<(), HostError> {
    rdma.post_recv(qpn, RecvWr::new(1, vec![Sge::new(0, size, lkey)]))
}

fn free(rdma: &mut RdmaDevice, s: &Session) {
    if let Some(q) = s.qpn {
        rdma.destroy_qp(q);
    }
    if let Some(k) = s.lkey {
        rdma.deregister_mr(k);
    }
}

/// The MTU both sides use after the peer sent its MTU code `msg` (ASCII
/// digits, NUL-terminated): the smaller of the peer's and 1024 (frames of the
/// fabric are at most 1514 bytes). An unreadable code counts as 1024.
fn negotiated_mtu(msg: &[u8]) -> Mtu {
    let theirs = msg
        .iter()
        .take_while(|&&b| b != 0)
        .map(|&b| char::from(b))
        .collect::<String>()
        .parse::<u8>()
        .ok()
        .and_then(Mtu::from_code)
        .unwrap_or(Mtu::Mtu1024);
    if theirs.bytes() < 1024 {
        theirs
    } else {
        Mtu::Mtu1024
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The session errors' text is what `last_error` and the
    /// `SessionFailed` event show: the wording of the strings it replaced.
    #[test]
    fn session_errors_read_as_before() {
        let e = |e: PerftestError| e.to_string();
        assert_eq!(
            e(PerftestError::ClientClosed(3)),
            "client closed at exchange item 3"
        );
        assert_eq!(
            e(PerftestError::NoCompletion {
                completed: 5,
                iters: 9
            }),
            "no completion for 60 s (5 of 9 done)"
        );
        assert_eq!(
            e(PerftestError::Host(HostError::Invalid("no session".into()))),
            "invalid no session"
        );
        assert_eq!(e(PerftestError::NoQp), "no QP");
    }

    #[test]
    fn keys_round_trip_in_perftests_format() {
        let k = Keys {
            lid: 0,
            out_reads: 0x10,
            qpn: 0x11,
            psn: 0xabcdef,
            rkey: 0x1234_5678,
            vaddr: 0x5555_0000_1000,
            gid: gid_of(Ipv4Addr::new(10, 77, 0, 1)),
            srqn: 0,
        };
        let m = k.encode();
        let text = std::str::from_utf8(&m[..107]).unwrap();
        assert_eq!(
            text,
            "0000:0010:000011:abcdef:12345678:0000555500001000:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:4d:00:01:00000000:"
        );
        assert_eq!(m[107], 0);
        assert_eq!(Keys::decode(&m).unwrap(), k);
        assert!(Keys::decode(b"0000:0010:zz").is_err());
        assert!(Keys::decode(&[0xff; 108]).is_err());
    }
}

/// Client retry interval while the tool's server is not up.
const RETRY_INTERVAL: Duration = Duration::from_secs(1);
/// A connection attempt without an answer is retried after this long.
const CONNECT_ATTEMPT: Duration = Duration::from_secs(20);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ClientPhase {
    Connecting,
    RetryWait,
    Exchange,
    Running,
    Done,
}

/// The perftest client service: runs one test against the tool's server
/// in a guest (`ib_write_bw -p PORT` etc. without a server name).
pub struct PerftestClient {
    id: u32,
    verb: Verb,
    spec: ServiceSpec,
    sock: Option<SocketHandle>,
    phase: ClientPhase,
    step: usize,
    sent: bool,
    qpn: Option<u32>,
    lkey: Option<u32>,
    keys: Keys,
    remote: Option<Keys>,
    mtu: Mtu,
    posted: u32,
    completed: u32,
    started: Instant,
    /// When the first operation was posted, and how long all took.
    run_started: Option<Instant>,
    run_elapsed: Duration,
    last_progress: Instant,
    retry_at: Option<Instant>,
    connect_deadline: Instant,
    tally: SessionTally,
}

impl PerftestClient {
    fn script(&self) -> &'static [usize] {
        match self.verb {
            Verb::Write | Verb::Read | Verb::Atomic => &WRITE_SCRIPT,
            Verb::Send => &SEND_SCRIPT,
        }
    }

    /// The item before which the client runs its operations.
    fn run_before(&self) -> usize {
        match self.verb {
            Verb::Write | Verb::Read | Verb::Atomic => 7,
            Verb::Send => 8,
        }
    }

    /// Operations in flight at most. READs go one at a time: a TCG guest
    /// can pause longer than the ACK timeout in the middle of a train of
    /// 64 response packets, and with several READs outstanding each
    /// go-back-N retry makes the tool's responder replay all of them (seen
    /// as a retransmission storm that starved a 200-READ run).
    fn depth(&self) -> u32 {
        match self.verb {
            Verb::Read => 1,
            Verb::Atomic => self.remote.map_or(1, |r| r.out_reads.clamp(1, 16)),
            Verb::Write | Verb::Send => 64,
        }
    }

    pub(crate) fn start(
        id: u32,
        verb: Verb,
        spec: ServiceSpec,
        ctx: &mut ServiceCtx<'_>,
    ) -> Result<Self, HostError> {
        let sock = ctx.new_tcp_socket()?;
        let mut c = PerftestClient {
            id,
            verb,
            connect_deadline: ctx.now + spec.connect_timeout,
            spec,
            sock: Some(sock),
            phase: ClientPhase::RetryWait,
            step: 0,
            sent: false,
            qpn: None,
            lkey: None,
            keys: Keys::initial(ctx.ip),
            remote: None,
            mtu: Mtu::Mtu1024,
            posted: 0,
            completed: 0,
            started: ctx.now,
            run_started: None,
            run_elapsed: Duration::ZERO,
            last_progress: ctx.now,
            retry_at: Some(ctx.now),
            tally: SessionTally::default(),
        };
        if let Err(e) = c.connect(ctx) {
            ctx.sockets.remove(sock);
            return Err(e);
        }
        Ok(c)
    }

    fn connect(&mut self, ctx: &mut ServiceCtx<'_>) -> Result<(), HostError> {
        let (peer, h) = client_target(&self.spec, self.sock)?;
        tcp_connect(ctx, h, peer, self.spec.port)?;
        self.phase = ClientPhase::Connecting;
        self.step = 0;
        self.sent = false;
        self.retry_at = None;
        self.last_progress = ctx.now;
        Ok(())
    }

    fn free(&mut self, rdma: &mut RdmaDevice, now: Instant) {
        if let Some(q) = self.qpn.take() {
            rdma.retire_qp(q, now);
        }
        if let Some(k) = self.lkey.take() {
            rdma.deregister_mr(k);
        }
        self.remote = None;
    }

    fn retry_later(&mut self, ctx: &mut ServiceCtx<'_>) {
        self.free(ctx.rdma, ctx.now);
        if let Some(h) = self.sock {
            ctx.sockets.get_mut::<Socket>(h).abort();
        }
        if ctx.now + RETRY_INTERVAL < self.connect_deadline {
            self.retry_at = Some(ctx.now + RETRY_INTERVAL);
            self.phase = ClientPhase::RetryWait;
        } else {
            self.finish(ctx, Err(PerftestError::Unreachable));
        }
    }

    fn finish(&mut self, ctx: &mut ServiceCtx<'_>, result: Result<u32, PerftestError>) {
        self.free(ctx.rdma, ctx.now);
        if let Some(h) = self.sock {
            ctx.sockets.get_mut::<Socket>(h).close();
        }
        self.phase = ClientPhase::Done;
        let peer = self.spec.peer;
        match result {
            Ok(n) => {
                let peer = peer.unwrap_or(Ipv4Addr::UNSPECIFIED);
                let elapsed = ctx.now.saturating_duration_since(self.started);
                self.tally.finished(ctx, self.id, peer, n, 0, elapsed);
            }
            Err(e) => self.tally.failed(ctx, self.id, peer, e.to_string()),
        }
    }

    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        match self.phase {
            ClientPhase::RetryWait => self.retry_at,
            ClientPhase::Connecting => Some(self.last_progress + CONNECT_ATTEMPT),
            ClientPhase::Exchange | ClientPhase::Running => {
                Some(self.last_progress + STALL_TIMEOUT)
            }
            ClientPhase::Done => None,
        }
    }

    pub(crate) fn teardown(&mut self, sockets: &mut SocketSet<'static>, rdma: &mut RdmaDevice) {
        if let Some(q) = self.qpn.take() {
            rdma.destroy_qp(q);
        }
        if let Some(k) = self.lkey.take() {
            rdma.deregister_mr(k);
        }
        abort_sockets(sockets, self.sock.take());
        self.phase = ClientPhase::Done;
    }

    pub(crate) fn status(&self, id: u32) -> ServiceStatus {
        let state = match self.phase {
            ClientPhase::Connecting => "connecting",
            ClientPhase::RetryWait => "waiting-for-server",
            ClientPhase::Exchange => "exchanging",
            ClientPhase::Running => "running",
            ClientPhase::Done => self.tally.stopped_state(),
        };
        let progress = (self.posted, self.completed);
        self.tally
            .status(id, &self.spec, self.spec.peer, state, progress)
    }

    /// Our part of item `step`.
    fn our_item(&mut self, ctx: &mut ServiceCtx<'_>) -> Result<Vec<u8>, HostError> {
        let len = self.script()[self.step];
        Ok(match self.step {
            0..=2 => opening_item(self.step),
            3 => vec![b'0' + Mtu::Mtu1024 as u8, 0],
            FIRST_KEYS => {
                let peer = self
                    .spec
                    .peer
                    .ok_or_else(|| HostError::Invalid("no peer".into()))?;
                let size = (self.spec.size.max(CYCLE_BUFFER) as usize) * 2;
                let lkey = ctx.rdma.register_mr_access(size, Access::ALL)?;
                self.lkey = Some(lkey);
                let qpn = ctx.rdma.create_qp(
                    peer,
                    QpCaps {
                        max_send_wr: 65,
                        max_recv_wr: 1,
                        max_sge: 1,
                        ..QpCaps::default()
                    },
                )?;
                self.qpn = Some(qpn);
                self.keys.qpn = qpn;
                self.keys.psn = (ctx.rng.next_u64() & 0xff_ffff) as u32;
                self.keys.rkey = lkey;
                self.keys.encode().to_vec()
            }
            _ if len == KEY_MSG_LEN => self.keys.encode().to_vec(),
            8 => u64::from(self.spec.size).to_be_bytes().to_vec(),
            9 => u64::from(self.completed).to_be_bytes().to_vec(),
            // Our measurement, for the tool's server to print: peak and
            // average MiB/s, then Mpps (doubles, big-endian).
            10..=12 => {
                let secs = self.run_elapsed.as_secs_f64().max(1e-9);
                let n = f64::from(self.completed);
                let v = if self.step == 12 {
                    n / secs / 1e6
                } else {
                    n * f64::from(self.spec.size) / secs / f64::from(1u32 << 20)
                };
                v.to_bits().to_be_bytes().to_vec()
            }
            _ => vec![0u8; len],
        })
    }

    /// The server's part of item `step`.
    fn their_item(&mut self, ctx: &mut ServiceCtx<'_>, msg: &[u8]) -> Result<(), HostError> {
        match self.step {
            0 => check_peer_version(msg).map_err(|v| HostError::Invalid(format!("server {v}")))?,
            3 => {
                self.mtu = negotiated_mtu(msg);
            }
            FIRST_KEYS => {
                let remote = Keys::decode(msg)?;
                let qpn = self.qpn.ok_or_else(|| HostError::Invalid("no QP".into()))?;
                ctx.rdma.connect_qp(
                    qpn,
                    &QpAttr {
                        pmtu: self.mtu,
                        sq_psn: self.keys.psn,
                        rq_psn: remote.psn,
                        dest_qpn: remote.qpn,
                        // 0.5 s rather than the tools' 67 ms: the peer is often a TCG
                        // guest on a busy machine.
                        timeout: 17,
                        retry_cnt: 7,
                        rnr_retry: 7,
                        min_rnr_timer: 12,
                        max_rd_atomic: remote.out_reads.clamp(1, 16) as u8,
                        max_dest_rd_atomic: 16,
                        access: Access::NONE,
                    },
                )?;
                self.remote = Some(remote);
                session_started(
                    ctx,
                    self.id,
                    self.spec.peer.unwrap_or(Ipv4Addr::UNSPECIFIED),
                    qpn,
                    remote.qpn,
                );
            }
            _ => {}
        }
        Ok(())
    }

    fn post_ops(&mut self, ctx: &mut ServiceCtx<'_>) -> Result<(), HostError> {
        let (Some(qpn), Some(lkey), Some(r)) = (self.qpn, self.lkey, self.remote) else {
            return Err(HostError::Invalid("no QP".into()));
        };
        let depth = self.depth();
        while self.posted < self.spec.iters && self.posted - self.completed < depth {
            let (op, len) = match self.verb {
                Verb::Send => (SendOp::Send, self.spec.size),
                Verb::Write => (
                    SendOp::RdmaWrite {
                        remote_addr: r.vaddr,
                        rkey: r.rkey,
                    },
                    self.spec.size,
                ),
                Verb::Read => (
                    SendOp::RdmaRead {
                        remote_addr: r.vaddr,
                        rkey: r.rkey,
                    },
                    self.spec.size,
                ),
                Verb::Atomic => (
                    SendOp::AtomicFetchAndAdd {
                        remote_addr: r.vaddr,
                        rkey: r.rkey,
                        add: 1,
                    },
                    8,
                ),
            };
            ctx.rdma.post_send(
                qpn,
                SendWr::new(u64::from(self.posted), op, vec![Sge::new(0, len, lkey)]),
            )?;
            self.posted += 1;
        }
        Ok(())
    }

    /// Runs the state machine; returns whether anything changed.
    pub(crate) fn step(&mut self, ctx: &mut ServiceCtx<'_>) -> bool {
        let before = (self.phase, self.step, self.sent, self.completed);
        if let Err(e) = self.step_inner(ctx) {
            self.finish(ctx, Err(e));
        }
        before != (self.phase, self.step, self.sent, self.completed)
    }

    fn step_inner(&mut self, ctx: &mut ServiceCtx<'_>) -> Result<(), PerftestError> {
        let Some(h) = self.sock else { return Ok(()) };
        match self.phase {
            ClientPhase::Done => return Ok(()),
            ClientPhase::RetryWait => {
                if self.retry_at.is_some_and(|t| ctx.now >= t) {
                    self.connect(ctx)?;
                }
                return Ok(());
            }
            ClientPhase::Connecting => match ctx.sockets.get_mut::<Socket>(h).state() {
                State::Closed | State::TimeWait => {
                    self.retry_later(ctx);
                    return Ok(());
                }
                State::SynSent | State::SynReceived => {
                    if ctx.now.saturating_duration_since(self.last_progress) >= CONNECT_ATTEMPT {
                        self.retry_later(ctx);
                    }
                    return Ok(());
                }
                _ => {
                    self.phase = ClientPhase::Exchange;
                    self.started = ctx.now;
                    self.last_progress = ctx.now;
                }
            },
            ClientPhase::Running => {
                let qpn = self.qpn.ok_or(PerftestError::NoQp)?;
                while let Some(c) = ctx.rdma.poll_completion(qpn) {
                    if c.status != WcStatus::Success {
                        return Err(PerftestError::OperationStatus {
                            wr_id: c.wr_id,
                            status: c.status,
                        });
                    }
                    self.completed += 1;
                    self.last_progress = ctx.now;
                }
                if self.completed >= self.spec.iters {
                    self.phase = ClientPhase::Exchange;
                    self.run_elapsed = self
                        .run_started
                        .map_or(Duration::ZERO, |t| ctx.now.saturating_duration_since(t));
                } else {
                    self.post_ops(ctx)?;
                    if ctx.now.saturating_duration_since(self.last_progress) >= STALL_TIMEOUT {
                        return Err(PerftestError::NoCompletion {
                            completed: self.completed,
                            iters: self.spec.iters,
                        });
                    }
                    return Ok(());
                }
            }
            ClientPhase::Exchange => {}
        }
        // The exchange: our item, then the server's, strictly alternating.
        loop {
            if self.step >= self.script().len() {
                let n = self.completed;
                self.finish(ctx, Ok(n));
                return Ok(());
            }
            if self.step == self.run_before() && self.posted == 0 {
                self.phase = ClientPhase::Running;
                self.run_started = Some(ctx.now);
                self.post_ops(ctx)?;
                return Ok(());
            }
            let want = self.script()[self.step];
            if !self.sent {
                let item = self.our_item(ctx)?;
                let sock = ctx.sockets.get_mut::<Socket>(h);
                if sock.send_slice(&item) != Ok(item.len()) {
                    return Err(PerftestError::CannotSend);
                }
                self.sent = true;
            }
            let sock = ctx.sockets.get_mut::<Socket>(h);
            if sock.recv_queue() < want {
                if !sock.may_recv() {
                    return Err(PerftestError::ServerClosed(self.step));
                }
                if ctx.now.saturating_duration_since(self.last_progress) >= STALL_TIMEOUT {
                    return Err(PerftestError::Stalled(self.step));
                }
                return Ok(());
            }
            let mut msg = vec![0u8; want];
            if sock.recv_slice(&mut msg) != Ok(want) {
                return Err(PerftestError::ShortRead);
            }
            self.their_item(ctx, &msg)?;
            self.step += 1;
            self.sent = false;
            self.last_progress = ctx.now;
        }
    }
}

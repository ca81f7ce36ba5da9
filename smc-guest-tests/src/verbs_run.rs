//! The `verbs` test: one RC QP per side, connected by exchanging QP info over
//! TCP (RoCE: `ibv_modify_qp` to RTR/RTS with the peer's QPN/PSN/GID; iWARP:
//! rdma_cm on TCP port + 1), then the tests in order. The client is the
//! requester of every operation; the server prepares its buffer (and RECVs)
//! per test, says `Ready`, and after the client's `Done` verifies what landed
//! (data, immediates, atomic word). Both sides exchange verdicts, so both
//! print the same status per test.

use crate::pattern::{splitmix64, Way};
use crate::verbs::*;
use crate::verbs_cm::{self as cm, Channel, CmId};
use crate::verbs_ib::{Cq, CqWaitError, Device, Mr, Op, Qp, RoceConnect};
use anyhow::{anyhow, bail, Context as _, Result};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

/// Which side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VerbsRole {
    /// Passive side / responder.
    Server,
    /// Active side / requester.
    Client,
}

/// Everything a run needs.
#[derive(Clone, Debug)]
pub struct VerbsArgs {
    /// Side.
    pub role: VerbsRole,
    /// RDMA device (`rxe0`, `siw0`).
    pub dev: String,
    /// RoCE GID index (default: the IPv4-mapped RoCE v2 GID).
    pub gid_index: Option<u32>,
    /// Server: bind address; client: server address.
    pub addr: Ipv4Addr,
    /// TCP port of the QP-info exchange; rdma_cm (iWARP) uses port + 1.
    pub port: u16,
    /// Client: the run's config (unused on the server).
    pub cfg: Option<VerbsConfig>,
    /// Server: options that must match the client's config.
    pub expect: ExpectedConfig,
    /// Client: keep retrying the TCP connect this long.
    pub connect_timeout: Duration,
    /// Server: wait this long for the client (0 = forever).
    pub accept_timeout: Option<Duration>,
    /// Per-test limit for completions, data and the peer's messages.
    pub op_timeout: Duration,
    /// sysfs root (tests point it at a fake tree).
    pub sysfs: String,
    /// Testing aid (client): spoil the last request of these tests (flipped
    /// data byte, wrong immediate, shifted READ address, wrong compare,
    /// wrong addend), which the checks must report as FAIL.
    pub corrupt: Vec<VerbsTest>,
}

/// Why a test failed on this side: a request the device refused or
/// completed wrongly, or what landed differs from what must have (the
/// [`CheckError`]s). Its text becomes this side's [`Verdict`] and the
/// result line's reason.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TestFailure {
    /// A completion, data or an atomic's result is wrong.
    #[error(transparent)]
    Check(#[from] CheckError),
    /// Server, READ: the buffer the client reads changed.
    #[error("READ source changed: {0}")]
    ReadSourceChanged(CheckError),
    /// Posting request `n` failed.
    #[error("request {n}: {error:#}")]
    Post {
        /// The request.
        n: u32,
        /// The provider's refusal.
        error: anyhow::Error,
    },
    /// Posting an atomic failed.
    #[error("{0:#}")]
    PostAtomic(anyhow::Error),
    /// Server: posting receive `n` failed.
    #[error("posting receive {n}: {error:#}")]
    PostReceive {
        /// The receive.
        n: u32,
        /// The provider's refusal.
        error: anyhow::Error,
    },
    /// Client: the requests' completions did not all come.
    #[error("{error} ({done} of {n} requests completed)")]
    Requests {
        /// Why the wait ended.
        error: CqWaitError,
        /// Requests completed.
        done: u32,
        /// Requests posted in all.
        n: u32,
    },
    /// Client: an atomic's completion did not come.
    #[error("atomic {wr_id}: {error}")]
    Atomic {
        /// The atomic's work request id.
        wr_id: u64,
        /// Why the wait ended.
        error: CqWaitError,
    },
    /// Server: the receives' completions did not all come.
    #[error("receives: {0}")]
    Receives(CqWaitError),
    /// A request or atomic completed with an error status.
    #[error(
        "{what} {wr_id} completed with status {status} ({}), vendor_err {vendor_err:#x}",
        wc_status_name(*status)
    )]
    Status {
        /// `request` or `atomic`.
        what: &'static str,
        /// Its work request id.
        wr_id: u64,
        /// `ibv_wc_status`.
        status: u32,
        /// The provider's `vendor_err`.
        vendor_err: u32,
    },
    /// A request or atomic completed with another opcode than posted.
    #[error("{what} {wr_id}: completion opcode {got} but expected {want}")]
    Opcode {
        /// `request` or `atomic`.
        what: &'static str,
        /// Its work request id.
        wr_id: u64,
        /// The completion's `ibv_wc_opcode`.
        got: u32,
        /// The one the request produces.
        want: u32,
    },
    /// Server: a receive completed twice or was never posted.
    #[error("receive completion with unexpected wr_id {0}")]
    RecvWrId(u64),
    /// Server: the atomic word after the client's run is not the chain's
    /// end.
    #[error(
        "atomic word after {n} {test}: {got:#018x}, expected {want:#018x} (initial {initial:#018x})"
    )]
    AtomicWord {
        /// The atomics run.
        n: u32,
        /// The test.
        test: VerbsTest,
        /// The word found.
        got: u64,
        /// The word expected.
        want: u64,
        /// The word before the run.
        initial: u64,
    },
    /// Completions this side never asked for.
    #[error("unexpected completion(s): {0:?}")]
    Unexpected(Vec<Completion>),
    /// Polling for stray completions failed.
    #[error("{0:#}")]
    Poll(anyhow::Error),
    /// Client, iWARP: the provider accepted an opcode the skip says it
    /// refuses.
    #[error(
        "{device} accepted ibv_post_send({op}), so this tool's iWARP skip is wrong: \
         the device does support it; the QP state is now unknown"
    )]
    SkipPremiseWrong {
        /// The device.
        device: String,
        /// The opcode (`IBV_WR_ATOMIC_CMP_AND_SWP`, ...).
        op: &'static str,
    },
}

/// Per-side resources after setup.
struct Side<'a> {
    dev: &'a Device,
    cq: &'a Cq<'a>,
    qp: &'a Qp<'a>,
    mr: &'a Mr<'a>,
    cfg: &'a VerbsConfig,
    peer: QpInfo,
    ctl: &'a mut TcpStream,
    op_timeout: Duration,
    corrupt: &'a [VerbsTest],
}

impl Side<'_> {
    /// Whether request `i` of `t` is the one to spoil (`--inject-corruption`).
    fn spoil(&self, t: VerbsTest, i: u32) -> bool {
        self.corrupt.contains(&t) && i + 1 == self.cfg.iters
    }
}

fn log(role: VerbsRole, msg: impl AsRef<str>) {
    eprintln!(
        "[verbs {}] {}",
        if role == VerbsRole::Server {
            "server"
        } else {
            "client"
        },
        msg.as_ref()
    );
}

fn random_psn() -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    (splitmix64(t ^ (u64::from(std::process::id()) << 32)) & 0xff_ffff) as u32
}

/// Runs one side. `Err` = setup failure (no test ran); otherwise one result
/// per requested test.
pub fn run(a: &VerbsArgs) -> Result<Vec<TestResult>> {
    let dev = Device::open(&a.dev)?;
    let caps = Caps {
        iwarp: dev.iwarp,
        atomics: dev.atomics(),
    };
    log(
        a.role,
        format!(
            "device {} transport={} atomic_cap={} active_mtu={} max_qp_rd_atom={} max_qp_init_rd_atom={}",
            dev.name,
            if dev.iwarp { "iwarp" } else { "ib/roce" },
            dev.attr.atomic_cap,
            dev.port.active_mtu,
            dev.attr.max_qp_rd_atom,
            dev.attr.max_qp_init_rd_atom
        ),
    );
    // RoCE: the GID to address the peer with
    let gid = if dev.iwarp {
        None
    } else {
        let port_dir = Path::new(&a.sysfs).join(format!("class/infiniband/{}/ports/1", a.dev));
        let g = select_roce_gid(&port_dir, a.gid_index).map_err(|e| anyhow!("{}: {e}", a.dev))?;
        let q = dev.gid(g.index)?;
        if q != g.gid {
            bail!(
                "{}: GID index {} is {} in sysfs but {} from ibv_query_gid",
                a.dev,
                g.index,
                std::net::Ipv6Addr::from(g.gid),
                std::net::Ipv6Addr::from(q)
            );
        }
        log(
            a.role,
            format!(
                "RoCE v2 GID index {}: {}",
                g.index,
                std::net::Ipv6Addr::from(g.gid)
            ),
        );
        Some(g)
    };
    let rd_atomic = |attr: i32| attr.clamp(1, 8) as u8;
    let init_depth = rd_atomic(dev.attr.max_qp_init_rd_atom);
    let resp_depth = rd_atomic(dev.attr.max_qp_rd_atom);

    // control connection + config
    let cm_ch = if dev.iwarp {
        Some(Channel::new()?)
    } else {
        None
    };
    let mut cm_listen: Option<CmId<'_>> = None;
    let (mut ctl, cfg, client_hello) = match a.role {
        VerbsRole::Server => {
            if let Some(ch) = &cm_ch {
                let id = ch.create_id()?;
                id.listen(SocketAddrV4::new(a.addr, a.port.wrapping_add(1)))?;
                log(
                    a.role,
                    format!("rdma_cm listening on {}:{}", a.addr, a.port.wrapping_add(1)),
                );
                cm_listen = Some(id);
            }
            let l = TcpListener::bind(SocketAddrV4::new(a.addr, a.port))
                .with_context(|| format!("listen on {}:{}", a.addr, a.port))?;
            log(a.role, format!("listening on {}", l.local_addr()?));
            let mut s = accept_within(&l, a.accept_timeout)?;
            s.set_read_timeout(Some(a.op_timeout + Duration::from_secs(30)))?;
            let mut b = [0u8; HELLO_LEN];
            std::io::Read::read_exact(&mut s, &mut b).context("reading the client's hello")?;
            let h = match Hello::decode(&b) {
                Ok(h) => h,
                Err(e) => {
                    let _ = Ctl::Refuse(e.to_string()).write_to(&mut s);
                    bail!("client hello: {e}");
                }
            };
            let mut refuse = a.expect.check(&h.cfg).err().map(|e| e.to_string());
            if h.qp.caps.iwarp != caps.iwarp {
                refuse = Some(format!(
                    "transport mismatch: the client's device is {}, the server's {} is {}",
                    if h.qp.caps.iwarp { "iWARP" } else { "IB/RoCE" },
                    a.dev,
                    if caps.iwarp { "iWARP" } else { "IB/RoCE" }
                ));
            }
            if let Some(r) = refuse {
                let _ = Ctl::Refuse(r.clone()).write_to(&mut s);
                bail!("{r}");
            }
            (s, h.cfg.clone(), Some(h.qp))
        }
        VerbsRole::Client => {
            let cfg = a
                .cfg
                .clone()
                .ok_or_else(|| anyhow!("client needs a config"))?;
            let s = connect_retry(SocketAddrV4::new(a.addr, a.port), a.connect_timeout)?;
            s.set_read_timeout(Some(a.op_timeout + Duration::from_secs(30)))?;
            (s, cfg, None)
        }
    };
    ctl.set_nodelay(true)?;
    cfg.validate()?;
    let layout = cfg.layout();

    let pd = dev.alloc_pd()?;
    let send_depth = cfg.iters.clamp(2, 32);
    let cq = dev.create_cq((send_depth + cfg.iters + 8) as i32)?;
    let mr = pd.register(layout.len as usize, caps.atomics)?;
    let qp = pd.create_rc_qp(&cq, send_depth, cfg.iters)?;
    qp.to_init(caps.atomics, dev.iwarp)?;
    let psn = random_psn();
    let me = QpInfo {
        qpn: qp.qpn(),
        psn,
        lid: dev.port.lid,
        mtu: dev.port.active_mtu as u8,
        gid: gid.map(|g| g.gid).unwrap_or_default(),
        addr: mr.addr(),
        len: mr.len() as u64,
        rkey: mr.rkey(),
        caps,
    };

    // exchange QP info
    let peer = match a.role {
        VerbsRole::Server => {
            Ctl::Accept(me).write_to(&mut ctl)?;
            client_hello.expect("server has the hello")
        }
        VerbsRole::Client => {
            std::io::Write::write_all(
                &mut ctl,
                &Hello {
                    cfg: cfg.clone(),
                    qp: me,
                }
                .encode(),
            )?;
            match Ctl::read_from(&mut ctl).context("waiting for the server's QP info")? {
                Ctl::Accept(q) => q,
                Ctl::Refuse(r) => bail!("server refused: {r}"),
                other => bail!("unexpected message from the server: {other:?}"),
            }
        }
    };
    if peer.len < layout.len {
        bail!(
            "peer buffer of {} bytes is smaller than the layout's {}",
            peer.len,
            layout.len
        );
    }
    log(
        a.role,
        format!(
            "local qpn {:#x} psn {:#x}; peer qpn {:#x} psn {:#x} gid {} rkey {:#x} addr {:#x}",
            me.qpn,
            me.psn,
            peer.qpn,
            peer.psn,
            std::net::Ipv6Addr::from(peer.gid),
            peer.rkey,
            peer.addr
        ),
    );

    // connect the QPs
    let deadline = Instant::now() + a.op_timeout;
    let mut _cm_conn: Option<CmId<'_>> = None;
    match (&cm_ch, a.role) {
        (None, _) => {
            let g = gid.expect("RoCE has a GID");
            qp.connect_roce(&RoceConnect {
                dest_qpn: peer.qpn,
                rq_psn: peer.psn,
                sq_psn: me.psn,
                dgid: peer.gid,
                sgid_index: g.index as u8,
                mtu: u32::from(me.mtu.min(peer.mtu)),
                max_dest_rd_atomic: resp_depth,
                max_rd_atomic: init_depth,
            })?;
        }
        (Some(ch), VerbsRole::Server) => {
            let ev = ch.expect(cm::EV_CONNECT_REQUEST, deadline)?;
            let mut id = CmId::from_request(ch, &ev)?;
            check_cm_device(&id, &a.dev)?;
            id.accept(qp.qpn(), resp_depth.min(init_depth))?;
            ch.expect(cm::EV_ESTABLISHED, deadline)?;
            _cm_conn = Some(id);
        }
        (Some(ch), VerbsRole::Client) => {
            let mut id = ch.create_id()?;
            id.resolve(
                ch,
                SocketAddrV4::new(a.addr, a.port.wrapping_add(1)),
                deadline,
            )?;
            check_cm_device(&id, &a.dev)?;
            id.connect(qp.qpn(), resp_depth.min(init_depth))?;
            ch.expect(cm::EV_ESTABLISHED, deadline)?;
            _cm_conn = Some(id);
        }
    }
    // Both sides connected before the first request: on siw a message that
    // arrives while the server is still inside siw_accept() can be lost (see
    // ci/README.md), so the client waits for the server's word.
    Ctl::Connected.write_to(&mut ctl)?;
    match Ctl::read_from(&mut ctl).context("waiting for the peer's connected message")? {
        Ctl::Connected => {}
        other => bail!("unexpected message from the peer: {other:?}"),
    }
    log(a.role, "QP connected");

    let mut side = Side {
        dev: &dev,
        cq: &cq,
        qp: &qp,
        mr: &mr,
        cfg: &cfg,
        peer,
        ctl: &mut ctl,
        op_timeout: a.op_timeout,
        corrupt: &a.corrupt,
    };
    let mut results = Vec::new();
    let mut broken = None::<String>;
    for &t in &cfg.tests {
        let r = if let Some(why) = skip_reason(t, caps, peer.caps) {
            let mut status = Status::Skip(why);
            // evidence for an iWARP skip: the provider must refuse the opcode
            if a.role == VerbsRole::Client && caps.iwarp && broken.is_none() {
                match probe_unsupported(&side, t, layout) {
                    Ok(note) => {
                        if let Status::Skip(w) = &mut status {
                            w.push_str(&format!(" (checked: {note})"));
                        }
                    }
                    Err(e) => {
                        broken = Some(e.to_string());
                        status = Status::Fail(e.to_string());
                    }
                }
            }
            TestResult {
                test: t,
                status,
                bytes: 0,
                ops: 0,
                secs: 0.0,
            }
        } else if let Some(b) = &broken {
            // the control connection is gone: nothing more can be judged
            TestResult {
                test: t,
                status: Status::Fail(format!("not run: {b}")),
                bytes: 0,
                ops: 0,
                secs: 0.0,
            }
        } else {
            let r = match a.role {
                VerbsRole::Client => client_test(&mut side, t, layout),
                VerbsRole::Server => server_test(&mut side, t, layout),
            };
            match r {
                Ok(r) => r,
                Err(e) => {
                    broken = Some(format!("control connection: {e:#}"));
                    TestResult {
                        test: t,
                        status: Status::Fail(format!("{e:#}")),
                        bytes: 0,
                        ops: 0,
                        secs: 0.0,
                    }
                }
            }
        };
        results.push(r);
    }
    // the QP (declared before the cm ids) outlives them: ids disconnect first
    drop(_cm_conn);
    drop(cm_listen);
    Ok(results)
}

/// Posts the request a skipped iWARP test would use and expects the provider
/// to refuse it (libsiw fails unsupported opcodes with EINVAL before the
/// request becomes valid in the send queue, so the QP is unaffected).
/// `Err` if it was accepted: the skip's premise is wrong.
fn probe_unsupported(s: &Side<'_>, t: VerbsTest, l: Layout) -> Result<String, TestFailure> {
    let (remote, rkey) = (s.peer.addr + l.atomic_off, s.peer.rkey);
    let (op, name) = match t {
        VerbsTest::SendImm => (Op::Send { imm: Some(1) }, "IBV_WR_SEND_WITH_IMM"),
        VerbsTest::WriteImm => (
            Op::Write {
                remote,
                rkey,
                imm: Some(1),
            },
            "IBV_WR_RDMA_WRITE_WITH_IMM",
        ),
        VerbsTest::Cas => (
            Op::Cas {
                remote,
                rkey,
                compare: 0,
                swap: 0,
            },
            "IBV_WR_ATOMIC_CMP_AND_SWP",
        ),
        VerbsTest::Faa => (
            Op::Faa {
                remote,
                rkey,
                add: 0,
            },
            "IBV_WR_ATOMIC_FETCH_AND_ADD",
        ),
        _ => return Ok("not probed".into()),
    };
    match s.qp.post_send(s.mr, l.atomic_off as usize, 8, u64::MAX, op) {
        Err(e) => {
            let errno = e
                .root_cause()
                .downcast_ref::<std::io::Error>()
                .and_then(|e| e.raw_os_error())
                .map(|n| std::io::Error::from_raw_os_error(n).to_string())
                .unwrap_or_else(|| e.to_string());
            Ok(format!(
                "ibv_post_send({name}) on {} fails: {errno}",
                s.dev.name
            ))
        }
        Ok(()) => Err(TestFailure::SkipPremiseWrong {
            device: s.dev.name.clone(),
            op: name,
        }),
    }
}

fn check_cm_device(id: &CmId<'_>, want: &str) -> Result<()> {
    match id.device_name() {
        Some(d) if d == want => Ok(()),
        Some(d) => bail!(
            "rdma_cm bound the connection to device {d}, not {want} (both on the same netdev?)"
        ),
        None => bail!("rdma_cm did not bind the connection to a device"),
    }
}

fn accept_within(l: &TcpListener, limit: Option<Duration>) -> Result<TcpStream> {
    let Some(limit) = limit else {
        return Ok(l.accept()?.0);
    };
    l.set_nonblocking(true)?;
    let end = Instant::now() + limit;
    loop {
        match l.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)?;
                return Ok(s);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= end {
                    bail!("no client within {} s", limit.as_secs());
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

fn connect_retry(to: SocketAddrV4, limit: Duration) -> Result<TcpStream> {
    let end = Instant::now() + limit;
    loop {
        match TcpStream::connect_timeout(&to.into(), Duration::from_secs(5)) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() < end => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(300));
            }
            Err(e) => return Err(e).with_context(|| format!("connect to {to}")),
        }
    }
}

fn expect_ctl(ctl: &mut TcpStream, what: &str, f: impl Fn(&Ctl) -> bool) -> Result<Ctl> {
    let m = Ctl::read_from(ctl).with_context(|| format!("waiting for {what}"))?;
    if !f(&m) {
        bail!("expected {what}, got {m:?}");
    }
    Ok(m)
}

fn peer_done(ctl: &mut TcpStream, t: VerbsTest) -> Result<Verdict> {
    match expect_ctl(
        ctl,
        &format!("the peer's verdict on {t}"),
        |m| matches!(m, Ctl::Done(x, _) if *x == t),
    )? {
        Ctl::Done(_, v) => Ok(v),
        _ => unreachable!(),
    }
}

/// Posts `n` requests through a window of the send queue depth; checks each
/// completion's status and opcode.
fn run_window(
    s: &Side<'_>,
    n: u32,
    want_opcode: u32,
    mut post: impl FnMut(u32) -> Result<()>,
) -> Result<(), TestFailure> {
    let depth = s.cfg.iters.clamp(2, 32);
    let deadline = Instant::now() + s.op_timeout;
    let (mut posted, mut done) = (0u32, 0u32);
    while done < n {
        while posted < n && posted - done < depth {
            post(posted).map_err(|error| TestFailure::Post { n: posted, error })?;
            posted += 1;
        }
        let got =
            s.cq.wait(1, deadline)
                .map_err(|(_, error)| TestFailure::Requests { error, done, n })?;
        for c in got {
            if let Some((status, vendor_err)) = c.error {
                return Err(TestFailure::Status {
                    what: "request",
                    wr_id: c.wr_id,
                    status,
                    vendor_err,
                });
            }
            if c.opcode != want_opcode {
                return Err(TestFailure::Opcode {
                    what: "request",
                    wr_id: c.wr_id,
                    got: c.opcode,
                    want: want_opcode,
                });
            }
            done += 1;
        }
    }
    Ok(())
}

fn client_test(s: &mut Side<'_>, t: VerbsTest, l: Layout) -> Result<TestResult> {
    expect_ctl(s.ctl, &format!("the server's Ready for {t}"), |m| {
        *m == Ctl::Ready(t)
    })?;
    let (n, size, seed) = (s.cfg.iters, s.cfg.size, s.cfg.seed);
    let (raddr, rkey) = (s.peer.addr, s.peer.rkey);
    let t0 = Instant::now();
    let mut ops = u64::from(n);
    let mut bytes = u64::from(n) * u64::from(size);
    let local: Result<(), TestFailure> = match t {
        VerbsTest::Send | VerbsTest::SendImm | VerbsTest::Write | VerbsTest::WriteImm => {
            let mut buf = vec![0u8; size as usize];
            for i in 0..n {
                msg_pattern(seed, t, i, Way::ClientToServer).fill(0, &mut buf);
                if s.spoil(t, i) && !t.has_imm() {
                    buf[size as usize / 2] ^= 0x01;
                }
                s.mr.write(l.slot_range(i).start, &buf);
            }
            let spoil_imm = |i| u32::from(t.has_imm() && s.spoil(t, i));
            let imm = |i| t.has_imm().then(|| imm_value(seed, t, i) ^ spoil_imm(i));
            let (mr, qp) = (s.mr, s.qp);
            let want = if matches!(t, VerbsTest::Send | VerbsTest::SendImm) {
                0
            } else {
                1
            };
            run_window(s, n, want, |i| {
                let op = match t {
                    VerbsTest::Send | VerbsTest::SendImm => Op::Send { imm: imm(i) },
                    _ => Op::Write {
                        remote: raddr + l.slot_range(i).start as u64,
                        rkey,
                        imm: imm(i),
                    },
                };
                qp.post_send(mr, l.slot_range(i).start, size as usize, u64::from(i), op)
            })
        }
        VerbsTest::Read => {
            s.mr.clear();
            let (mr, qp) = (s.mr, s.qp);
            let spoil_read = |i| s.spoil(t, i);
            run_window(s, n, 2, |i| {
                let r = l.slot_range(i);
                qp.post_send(
                    mr,
                    r.start,
                    size as usize,
                    u64::from(i),
                    Op::Read {
                        remote: raddr + r.start as u64 + u64::from(spoil_read(i)),
                        rkey,
                    },
                )
            })
            .and_then(|()| {
                (0..n)
                    .try_for_each(|i| check_slot(seed, t, i, &s.mr.read(l.slot_range(i))))
                    .map_err(TestFailure::from)
            })
        }
        VerbsTest::Cas | VerbsTest::Faa => {
            let target = raddr + l.atomic_off;
            let off = l.atomic_off as usize;
            let one = |op: Op, wr: u64, want_op: u32| -> Result<u64, TestFailure> {
                s.mr.write_u64(off, 0x5a5a_5a5a_5a5a_5a5a);
                s.qp.post_send(s.mr, off, 8, wr, op)
                    .map_err(TestFailure::PostAtomic)?;
                let c =
                    s.cq.wait(1, Instant::now() + s.op_timeout)
                        .map_err(|(_, error)| TestFailure::Atomic { wr_id: wr, error })?;
                if let Some((status, vendor_err)) = c[0].error {
                    return Err(TestFailure::Status {
                        what: "atomic",
                        wr_id: wr,
                        status,
                        vendor_err,
                    });
                }
                if c[0].opcode != want_op {
                    return Err(TestFailure::Opcode {
                        what: "atomic",
                        wr_id: wr,
                        got: c[0].opcode,
                        want: want_op,
                    });
                }
                Ok(s.mr.read_u64(off))
            };
            let mut r = Ok(());
            if t == VerbsTest::Cas {
                ops = 2 * u64::from(n);
                for i in 0..n {
                    // matching compare: swaps, returns the old value
                    let cur = cas_value(seed, i);
                    let compare = cur ^ u64::from(s.spoil(t, i));
                    let got = one(
                        Op::Cas {
                            remote: target,
                            rkey,
                            compare,
                            swap: cas_value(seed, i + 1),
                        },
                        2 * u64::from(i),
                        3,
                    );
                    if let Err(e) = got.and_then(|g| {
                        check_atomic_old("cas (matching)", i, g, cur).map_err(TestFailure::from)
                    }) {
                        r = Err(e);
                        break;
                    }
                    // stale compare: must not swap, returns the current value
                    let got = one(
                        Op::Cas {
                            remote: target,
                            rkey,
                            compare: cur,
                            swap: cas_poison(seed, i),
                        },
                        2 * u64::from(i) + 1,
                        3,
                    );
                    if let Err(e) = got.and_then(|g| {
                        check_atomic_old("cas (stale compare)", i, g, cas_value(seed, i + 1))
                            .map_err(TestFailure::from)
                    }) {
                        r = Err(e);
                        break;
                    }
                }
            } else {
                for i in 0..n {
                    let add = faa_addend(seed, i).wrapping_add(u64::from(s.spoil(t, i)));
                    let got = one(
                        Op::Faa {
                            remote: target,
                            rkey,
                            add,
                        },
                        u64::from(i),
                        4,
                    );
                    if let Err(e) = got.and_then(|g| {
                        check_atomic_old("faa", i, g, faa_before(seed, i))
                            .map_err(TestFailure::from)
                    }) {
                        r = Err(e);
                        break;
                    }
                }
            }
            bytes = 8 * ops;
            r
        }
    };
    let secs = t0.elapsed().as_secs_f64();
    let local = Verdict::from(&local);
    Ctl::Done(t, local.clone()).write_to(s.ctl)?;
    let peer = peer_done(s.ctl, t)?;
    Ok(TestResult {
        test: t,
        status: combine(local, peer),
        bytes,
        ops,
        secs,
    })
}

fn server_test(s: &mut Side<'_>, t: VerbsTest, l: Layout) -> Result<TestResult> {
    let (n, size, seed) = (s.cfg.iters, s.cfg.size, s.cfg.seed);
    let off = l.atomic_off as usize;
    // prepare the buffer
    s.mr.clear();
    match t {
        VerbsTest::Read => {
            let mut buf = vec![0u8; size as usize];
            for i in 0..n {
                msg_pattern(seed, t, i, Way::ServerToClient).fill(0, &mut buf);
                s.mr.write(l.slot_range(i).start, &buf);
            }
        }
        VerbsTest::Cas | VerbsTest::Faa => s.mr.write_u64(off, atomic_initial(seed, t)),
        _ => {}
    }
    let mut prep = Ok(());
    if t.uses_recv() {
        for i in 0..n {
            if let Err(e) =
                s.qp.post_recv(s.mr, l.slot_range(i).start, size as usize, u64::from(i))
            {
                prep = Err(TestFailure::PostReceive { n: i, error: e });
                break;
            }
        }
    }
    Ctl::Ready(t).write_to(s.ctl)?;
    let t0 = Instant::now();
    let client = peer_done(s.ctl, t)?;
    // the client's requests are complete (or failed): what landed here?
    let grace = if client.passed() {
        s.op_timeout
    } else {
        Duration::from_secs(2)
    };
    let deadline = Instant::now() + grace;
    let local: Result<(), TestFailure> = prep.and_then(|()| match t {
        VerbsTest::Send | VerbsTest::SendImm | VerbsTest::WriteImm => {
            let got = match s.cq.wait(n as usize, deadline) {
                Ok(v) => v,
                Err((v, e)) => {
                    // judge what did arrive first: a wrong completion is the better reason
                    for c in &v {
                        check_recv(seed, t, size, c)?;
                    }
                    return Err(TestFailure::Receives(e));
                }
            };
            let mut seen = vec![false; n as usize];
            for c in &got {
                check_recv(seed, t, size, c)?;
                let i = c.wr_id as usize;
                if i >= seen.len() || std::mem::replace(&mut seen[i], true) {
                    return Err(TestFailure::RecvWrId(c.wr_id));
                }
            }
            (0..n)
                .try_for_each(|i| check_slot(seed, t, i, &s.mr.read(l.slot_range(i))))
                .map_err(TestFailure::from)
        }
        VerbsTest::Write => {
            // iWARP completes a WRITE once it is handed to TCP, so the data
            // may still be on its way when the client's Done arrives: recheck
            // for a while (an RC RoCE WRITE completes only once acknowledged,
            // i.e. placed, so one check is the verdict there)
            let settle = Instant::now()
                + if s.dev.iwarp {
                    Duration::from_secs(10)
                } else {
                    Duration::ZERO
                };
            loop {
                let r =
                    (0..n).try_for_each(|i| check_slot(seed, t, i, &s.mr.read(l.slot_range(i))));
                if r.is_ok() || Instant::now() >= settle.min(deadline) {
                    break r.map_err(TestFailure::from);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        VerbsTest::Read => (0..n)
            .try_for_each(|i| check_slot(seed, t, i, &s.mr.read(l.slot_range(i))))
            .map_err(TestFailure::ReadSourceChanged),
        VerbsTest::Cas | VerbsTest::Faa => {
            let want = atomic_final(seed, t, n);
            let got = s.mr.read_u64(off);
            if got == want {
                Ok(())
            } else {
                Err(TestFailure::AtomicWord {
                    n,
                    test: t,
                    got,
                    want,
                    initial: atomic_initial(seed, t),
                })
            }
        }
    });
    // nothing else may have completed on this side
    let local = local.and_then(|()| match s.cq.poll(4) {
        Ok(v) if v.is_empty() => Ok(()),
        Ok(v) => Err(TestFailure::Unexpected(v)),
        Err(e) => Err(TestFailure::Poll(e)),
    });
    let secs = t0.elapsed().as_secs_f64();
    let local = Verdict::from(&local);
    Ctl::Done(t, local.clone()).write_to(s.ctl)?;
    let ops = if t == VerbsTest::Cas {
        2 * u64::from(n)
    } else {
        u64::from(n)
    };
    Ok(TestResult {
        test: t,
        status: combine(local, client),
        bytes: if t.is_atomic() {
            8 * ops
        } else {
            ops * u64::from(size)
        },
        ops,
        secs,
    })
}

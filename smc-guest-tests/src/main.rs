//! `smc-guest-tests`: command-line front end. See README.md.

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use smc_guest_tests::size::parse_size;
use smc_guest_tests::smcnl::{normalize_ueid, SmcNl};
use smc_guest_tests::sock::{parse_ip, Proto};
use smc_guest_tests::stream::{self, CloseOrder, Direction, ExpectMode, Role, StreamConfig};
use std::net::IpAddr;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "smc-guest-tests",
    version,
    about = "SMC-R / TCP guest tests for vhost-rdma"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Data-verified stream test (run `server` in one guest, `client` in the other).
    Stream(StreamArgs),
    /// SMC configuration through the SMC_GEN_NETLINK family.
    Smc {
        #[command(subcommand)]
        cmd: SmcCmd,
    },
    /// Per-queue packet counters of an interface (netdev netlink qstats):
    /// one line per queue, `rx|tx QUEUE packets N bytes N`.
    Qstats {
        #[arg(long, default_value = "eth0")]
        dev: String,
    },
    /// RC verbs tests (libibverbs; iWARP connects through rdma_cm): SEND, SEND
    /// with immediate, RDMA WRITE (+imm), RDMA READ, atomic CAS / fetch-add,
    /// data verified. Run `server` in one guest, `client` in the other.
    Verbs(VerbsCli),
    /// Sender for the kernel's devmem TCP RX test (`ncdevmem -l ... -v M`):
    /// sends the byte pattern ncdevmem validates (`yes` of 0x01..0x06 for M = 7).
    DevmemSend(DevmemSendArgs),
    /// Receiver of devmem TCP RX (the kernel's uAPI, as `ncdevmem -l`):
    /// binds a udmabuf to an RX queue, accepts one connection, validates
    /// every byte against devmem-send's pattern, returns frags in batches;
    /// ends with a `DEVMEM-RESULT` line. The NIC setup (header split, RSS,
    /// flow rule) is the caller's: see smc-guest-tests/README.md.
    /// `--ordinary`: the same receiver on plain TCP, no dmabuf (any NIC).
    DevmemRecv(DevmemRecvArgs),
}

#[derive(Args, Debug)]
struct DevmemRecvArgs {
    /// Listen on IP:PORT (IPv6 as [ADDR]:PORT); the flow rule steers this
    /// flow to --queue.
    #[arg(long)]
    listen: std::net::SocketAddr,
    /// Interface whose RX queue gets the dmabuf.
    #[arg(long, default_value = "eth0")]
    dev: String,
    /// RX queue to bind (default: the last one, as ncdevmem).
    #[arg(long)]
    queue: Option<u32>,
    /// Bytes the stream must have (suffixes K M G); EOF before is a short
    /// read. Default: whatever arrives before EOF.
    #[arg(long, value_parser = parse_size)]
    bytes: Option<u64>,
    /// The sender's --pattern-mod (ncdevmem's -v): byte k is (k+1) % M, 0 meaning '\n'.
    #[arg(long, default_value_t = 7, value_parser = clap::value_parser!(u8).range(2..))]
    pattern_mod: u8,
    /// udmabuf size, a multiple of the page size (default: 16000 pages, as
    /// ncdevmem; the udmabuf module's size_limit_mb is 64 on 6.12, unlimited on 7.3).
    #[arg(long, value_parser = parse_size)]
    dmabuf_size: Option<u64>,
    /// recvmsg iov size: the most bytes one call returns.
    #[arg(long, default_value = "1M", value_parser = parse_size)]
    recv_size: u64,
    /// Give up if nobody connects within this many seconds (0: wait forever).
    #[arg(long, default_value = "0", value_parser = parse_secs)]
    accept_timeout: f64,
    /// SO_RCVTIMEO on the connection (0: none).
    #[arg(long, default_value = "120", value_parser = parse_secs)]
    io_timeout: f64,
    /// Accept (and validate) data that arrives as ordinary TCP, not in the
    /// dmabuf (by default that is a flow steering error, as for ncdevmem).
    #[arg(long)]
    allow_ordinary: bool,
    /// No devmem at all: no udmabuf, no bind-rx, plain recvmsg (no
    /// MSG_SOCK_DEVMEM), any NIC; the same validation, report and rate, so
    /// ordinary TCP is measured by the same receiver (--dev is not used).
    #[arg(long, conflicts_with_all = ["queue", "dmabuf_size", "allow_ordinary"])]
    ordinary: bool,
}

#[derive(Args, Debug)]
struct DevmemSendArgs {
    /// The ncdevmem server, IP:PORT (IPv6 as [ADDR]:PORT).
    #[arg(long)]
    to: std::net::SocketAddr,
    /// Bind the socket to this local IP:PORT first (ncdevmem -c installs a
    /// 5-tuple flow rule whose source port is the server port).
    #[arg(long)]
    bind: Option<std::net::SocketAddr>,
    /// Payload bytes (suffixes K M G).
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    bytes: u64,
    /// ncdevmem's -v value: byte k is (k+1) % M, 0 meaning '\n'.
    #[arg(long, default_value_t = 7, value_parser = clap::value_parser!(u8).range(2..))]
    pattern_mod: u8,
    /// write() size (rounded down to whole pattern periods).
    #[arg(long, default_value = "64K", value_parser = parse_size)]
    msg_size: u64,
    /// Keep retrying refused connects for this many seconds (the server
    /// configures the NIC before it listens).
    #[arg(long, default_value = "120", value_parser = parse_secs)]
    connect_timeout: f64,
    /// SO_SNDTIMEO / SO_RCVTIMEO on the connection (0: none).
    #[arg(long, default_value = "120", value_parser = parse_secs)]
    io_timeout: f64,
    /// Do not wait for the receiver to close after the half-close.
    #[arg(long)]
    no_wait_close: bool,
}

#[derive(Args, Debug)]
struct VerbsCli {
    /// server (responder; adopts the client's tests/size/iters/seed) or client (requester).
    #[arg(value_enum)]
    role: Role,
    /// RDMA device, e.g. rxe0 or siw0.
    #[arg(long)]
    dev: String,
    /// RoCE GID index (default: the IPv4-mapped RoCE v2 GID from sysfs).
    #[arg(long)]
    gid_index: Option<u32>,
    /// Server: IPv4 address to bind (default 0.0.0.0).
    #[arg(long)]
    addr: Option<String>,
    /// Client: the server's IPv4 address.
    #[arg(long)]
    peer: Option<String>,
    /// TCP port of the QP info exchange; iWARP's rdma_cm uses PORT+1.
    #[arg(long, default_value_t = 18650)]
    port: u16,
    /// Comma list of send,send_imm,write,write_imm,read,cas,faa or all (client default: all).
    #[arg(long)]
    tests: Option<String>,
    /// Bytes per SEND / WRITE / READ message (suffixes K, M; default 64K).
    #[arg(long, value_parser = parse_size)]
    size: Option<u64>,
    /// Messages (atomics: operations) per test (default 8).
    #[arg(long)]
    iters: Option<u32>,
    /// Pattern seed (default 1).
    #[arg(long)]
    seed: Option<u64>,
    /// Client: keep retrying the TCP connect for this many seconds.
    #[arg(long, default_value = "120", value_parser = parse_secs)]
    connect_timeout: f64,
    /// Server: give up if no client comes within this many seconds (0: wait forever).
    #[arg(long, default_value = "0", value_parser = parse_secs)]
    accept_timeout: f64,
    /// Per test: seconds to wait for completions, data and the peer.
    #[arg(long, default_value = "60", value_parser = parse_secs)]
    op_timeout: f64,
    /// Testing aid (client): spoil the last request of these tests (comma list); they must FAIL.
    #[arg(long, hide = true)]
    inject_corruption: Option<String>,
}

impl VerbsCli {
    /// The runner's arguments (everything checked that can be without a device).
    fn to_args(&self) -> Result<verbs_args::VerbsArgsLite> {
        use smc_guest_tests::verbs::{parse_tests, ExpectedConfig, VerbsConfig, MAX_SIZE};
        let ipv4 = |s: &str, what: &str| -> Result<std::net::Ipv4Addr> {
            s.parse().map_err(|_| {
                anyhow::anyhow!(
                    "{what} {s:?}: not an IPv4 address (RoCEv2 GIDs here are IPv4-mapped)"
                )
            })
        };
        let size = match self.size {
            Some(v) if v == 0 || v > u64::from(MAX_SIZE) => {
                bail!("--size must be 1 byte .. {} MiB", MAX_SIZE >> 20)
            }
            v => v.map(|v| v as u32),
        };
        let tests = self.tests.as_deref().map(parse_tests).transpose()?;
        match self.role {
            Role::Client => {
                if self.addr.is_some() {
                    bail!(
                        "verbs client: use --peer SERVER_IP (--addr is the server's bind address)"
                    );
                }
                let peer = self
                    .peer
                    .as_deref()
                    .ok_or_else(|| anyhow::anyhow!("verbs client needs --peer SERVER_IP"))?;
                let cfg = VerbsConfig {
                    tests: tests.unwrap_or_else(|| smc_guest_tests::verbs::VerbsTest::ALL.to_vec()),
                    size: size.unwrap_or(64 << 10),
                    iters: self.iters.unwrap_or(8),
                    seed: self.seed.unwrap_or(1),
                };
                cfg.validate()?;
                Ok(verbs_args::VerbsArgsLite {
                    server: false,
                    addr: ipv4(peer, "--peer")?,
                    cfg: Some(cfg),
                    expect: ExpectedConfig::default(),
                })
            }
            Role::Server => {
                if self.peer.is_some() {
                    bail!("verbs server: --peer is for the client (the server takes the client's QP info)");
                }
                Ok(verbs_args::VerbsArgsLite {
                    server: true,
                    addr: ipv4(self.addr.as_deref().unwrap_or("0.0.0.0"), "--addr")?,
                    cfg: None,
                    expect: ExpectedConfig {
                        tests,
                        size,
                        iters: self.iters,
                        seed: self.seed,
                    },
                })
            }
        }
    }
}

/// The device-independent half of the verbs arguments (so the CLI checks
/// build and test without the `verbs` feature).
mod verbs_args {
    use smc_guest_tests::verbs::{ExpectedConfig, VerbsConfig};
    #[derive(Debug)]
    #[cfg_attr(not(feature = "verbs"), allow(dead_code))]
    pub struct VerbsArgsLite {
        pub server: bool,
        pub addr: std::net::Ipv4Addr,
        pub cfg: Option<VerbsConfig>,
        pub expect: ExpectedConfig,
    }
}

#[derive(Subcommand)]
enum SmcCmd {
    /// User EID table (SMCv2 needs the same UEID on both peers on x86/arm64).
    Ueid {
        #[command(subcommand)]
        cmd: UeidCmd,
    },
    /// List RDMA devices SMC-R can use.
    Devices {
        /// Fail unless at least one device has an active port.
        #[arg(long)]
        require_smcr: bool,
    },
    /// SMC system info (version, release, SMC-Rv2 capability).
    Info,
}

#[derive(Subcommand)]
enum UeidCmd {
    /// Add a user EID (upper-cased, blank-padded to 32).
    Add { eid: String },
    /// Remove a user EID.
    Del { eid: String },
    /// List user EIDs.
    List,
    /// Remove all user EIDs.
    Flush,
}

fn parse_secs(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("{s:?}: {e}"))?;
    if !(v.is_finite() && v >= 0.0) {
        return Err(format!("{s:?}: must be a non-negative number of seconds"));
    }
    Ok(v)
}

#[derive(Args)]
struct StreamArgs {
    /// server or client.
    #[arg(value_enum)]
    role: Role,
    /// Transport: tcp, or smc (AF_SMC; fails on TCP fallback unless --allow-fallback).
    #[arg(long, value_enum, default_value = "tcp")]
    proto: Proto,
    /// Server: address to bind (default 0.0.0.0); client: server address (required).
    #[arg(long)]
    addr: Option<String>,
    /// TCP port.
    #[arg(long, default_value_t = 7777)]
    port: u16,
    /// Bytes per connection and direction (suffixes K, M, G, T: binary).
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    bytes: u64,
    /// Parallel connections.
    #[arg(long, default_value_t = 1)]
    conns: u32,
    /// Pattern seed (must match on both sides).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write chunk size.
    #[arg(long, default_value = "128K", value_parser = parse_size)]
    msg_size: u64,
    /// Data direction.
    #[arg(long, value_enum, default_value = "c2s")]
    direction: Direction,
    /// Which side half-closes first.
    #[arg(long, value_enum, default_value = "client-first")]
    close_order: CloseOrder,
    /// Client: keep retrying connect for this many seconds (the server guest may boot later).
    #[arg(long, default_value = "60", value_parser = parse_secs)]
    connect_timeout: f64,
    /// Socket read/write timeout in seconds (0: none).
    #[arg(long, default_value = "120", value_parser = parse_secs)]
    io_timeout: f64,
    /// Server: fail a round if connections do not arrive within this many seconds (0: wait forever).
    #[arg(long, default_value = "0", value_parser = parse_secs)]
    accept_timeout: f64,
    /// Server: serve one round of --conns connections, then exit with its status.
    #[arg(long, conflicts_with = "rounds")]
    once: bool,
    /// Server: number of rounds before exiting (0: forever, the default without --once).
    #[arg(long)]
    rounds: Option<u32>,
    /// smc: report a TCP fallback instead of failing on it.
    #[arg(long)]
    allow_fallback: bool,
    /// smc: required mode (any = SMC-R or SMC-D).
    #[arg(long, value_enum, default_value = "any")]
    expect_mode: ExpectMode,
    /// Print one JSON object on stdout (human lines go to stderr).
    #[arg(long)]
    json: bool,
    /// Testing aid: flip one bit at this offset of connection 0's sent data.
    #[arg(long, hide = true)]
    inject_corruption: Option<u64>,
}

fn secs_opt(v: f64) -> Option<Duration> {
    (v > 0.0).then(|| Duration::from_secs_f64(v))
}

fn run_stream(a: StreamArgs) -> Result<ExitCode> {
    if a.conns == 0 {
        bail!("--conns must be at least 1");
    }
    if a.msg_size == 0 || a.msg_size > (256 << 20) {
        bail!("--msg-size must be between 1 byte and 256M");
    }
    let addr: IpAddr = match (&a.addr, a.role) {
        (Some(s), _) => parse_ip(s)?,
        (None, Role::Server) => IpAddr::from([0, 0, 0, 0]),
        (None, Role::Client) => bail!("stream client needs --addr SERVER_IP"),
    };
    let cfg = StreamConfig {
        proto: a.proto,
        addr,
        port: a.port,
        bytes: a.bytes,
        conns: a.conns,
        seed: a.seed,
        msg_size: a.msg_size as usize,
        direction: a.direction,
        close_order: a.close_order,
        connect_timeout: Duration::from_secs_f64(a.connect_timeout),
        io_timeout: secs_opt(a.io_timeout),
        accept_timeout: secs_opt(a.accept_timeout),
        allow_fallback: a.allow_fallback,
        expect_mode: a.expect_mode,
        corrupt_at: a.inject_corruption,
    };
    let human = |line: &str| {
        if a.json {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    };
    let emit = |r: &stream::RunReport| {
        for l in r.conn_lines() {
            human(&l);
        }
        human(&r.summary_line());
        if a.json {
            eprintln!("{}", r.result_line());
            println!("{}", r.to_json());
        } else {
            println!("{}", r.result_line());
        }
    };
    match a.role {
        Role::Client => {
            let r = stream::run_client(&cfg);
            emit(&r);
            Ok(if r.ok() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Role::Server => {
            let l = stream::bind_server(&cfg).with_context(|| {
                format!("listen on {}:{} ({})", cfg.addr, cfg.port, cfg.proto.name())
            })?;
            let rounds = if a.once { 1 } else { a.rounds.unwrap_or(0) };
            human(&format!(
                "listening on {} proto={} conns={} bytes={} direction={} rounds={}",
                l.local_addr(),
                cfg.proto.name(),
                cfg.conns,
                cfg.bytes,
                a.direction_name(),
                if rounds == 0 {
                    "forever".to_string()
                } else {
                    rounds.to_string()
                }
            ));
            let mut all_ok = true;
            let mut n = 0u32;
            loop {
                let r = stream::serve_round(&l, &cfg);
                emit(&r);
                all_ok &= r.ok();
                n += 1;
                if rounds != 0 && n >= rounds {
                    break;
                }
            }
            Ok(if all_ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
    }
}

impl StreamArgs {
    fn direction_name(&self) -> &'static str {
        match self.direction {
            Direction::C2s => "c2s",
            Direction::S2c => "s2c",
            Direction::Both => "both",
        }
    }
}

fn run_smc(cmd: SmcCmd) -> Result<ExitCode> {
    // Reject a malformed EID before touching netlink, with the kernel's rules.
    if let SmcCmd::Ueid {
        cmd: UeidCmd::Add { eid } | UeidCmd::Del { eid },
    } = &cmd
    {
        normalize_ueid(eid)?;
    }
    let mut nl = SmcNl::open()?;
    match cmd {
        SmcCmd::Ueid { cmd } => match cmd {
            UeidCmd::Add { eid } => {
                nl.ueid_add(&eid)?;
                println!("added UEID {}", eid.to_ascii_uppercase());
            }
            UeidCmd::Del { eid } => {
                nl.ueid_del(&eid)?;
                println!("removed UEID {}", eid.to_ascii_uppercase());
            }
            UeidCmd::Flush => {
                nl.ueid_flush()?;
                println!("flushed UEID table");
            }
            UeidCmd::List => {
                let l = nl.ueid_list()?;
                if l.is_empty() {
                    println!("(no user EIDs)");
                }
                for e in l {
                    println!("{e}");
                }
            }
        },
        SmcCmd::Info => {
            let i = nl.sys_info()?;
            let o = |v: Option<u8>| v.map(|x| x.to_string()).unwrap_or_else(|| "-".into());
            println!(
                "smc version={} release={} smcr_v2={} ism_v2={} host={} seid={}",
                o(i.version),
                o(i.release),
                o(i.is_smcr_v2),
                o(i.is_ism_v2),
                i.local_host.as_deref().unwrap_or("-").trim(),
                i.seid.as_deref().unwrap_or("-").trim()
            );
        }
        SmcCmd::Devices { require_smcr } => {
            let devs = nl.smcr_devices()?;
            for d in &devs {
                println!(
                    "smcr-device {} pci={} critical={} usable={}",
                    d.ib_name,
                    d.pci_id.as_deref().unwrap_or("-"),
                    u8::from(d.is_critical),
                    u8::from(d.usable())
                );
                for p in &d.ports {
                    println!(
                        "  port {} valid={} active={} netdev={} (ifindex {}) pnetid={} links={}",
                        p.port,
                        u8::from(p.valid),
                        u8::from(p.active),
                        p.netdev.as_deref().unwrap_or("-"),
                        p.netdev_ifindex,
                        if p.pnetid.is_empty() { "-" } else { &p.pnetid },
                        p.link_count
                    );
                }
            }
            let usable = devs.iter().filter(|d| d.usable()).count();
            println!("SMCR-DEVICES total={} usable={}", devs.len(), usable);
            if require_smcr && usable == 0 {
                if devs.is_empty() {
                    bail!(
                        "no RDMA device is registered with SMC-R: add one, e.g. \
                         `rdma link add rxe0 type rxe netdev eth0` (siw does not count: \
                         SMC-R only uses IB/RoCE devices, node type IB_CA)"
                    );
                }
                bail!(
                    "{} RDMA device(s) known to SMC-R but none has an active port: \
                     is the underlying netdev up (ip link set eth0 up)?",
                    devs.len()
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn run_qstats(dev: &str) -> anyhow::Result<ExitCode> {
    let name = std::ffi::CString::new(dev)?;
    // SAFETY: a valid NUL-terminated string.
    let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if ifindex == 0 {
        bail!("no interface {dev}");
    }
    let qs = smc_guest_tests::qstats::queue_stats(ifindex)
        .map_err(|e| anyhow::anyhow!("netdev qstats-get for {dev}: {e}"))?;
    if qs.is_empty() {
        bail!("{dev} reports no per-queue statistics");
    }
    for q in qs {
        println!(
            "{} {} packets {} bytes {}",
            if q.rx { "rx" } else { "tx" },
            q.queue,
            q.packets,
            q.bytes
        );
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(feature = "verbs")]
fn run_verbs(v: VerbsCli) -> Result<ExitCode> {
    use smc_guest_tests::verbs::Status;
    use smc_guest_tests::verbs_run::{run, VerbsArgs, VerbsRole};
    let lite = v.to_args()?;
    let args = VerbsArgs {
        role: if lite.server {
            VerbsRole::Server
        } else {
            VerbsRole::Client
        },
        dev: v.dev.clone(),
        gid_index: v.gid_index,
        addr: lite.addr,
        port: v.port,
        cfg: lite.cfg,
        expect: lite.expect,
        connect_timeout: Duration::from_secs_f64(v.connect_timeout),
        accept_timeout: secs_opt(v.accept_timeout),
        op_timeout: Duration::from_secs_f64(v.op_timeout.max(1.0)),
        sysfs: "/sys".into(),
        corrupt: match &v.inject_corruption {
            None => Vec::new(),
            Some(t) => smc_guest_tests::verbs::parse_tests(t)?,
        },
    };
    let role = if lite.server { "server" } else { "client" };
    let results = run(&args)?;
    let (mut pass, mut fail, mut skip) = (0, 0, 0);
    for r in &results {
        match r.status {
            Status::Pass => pass += 1,
            Status::Fail(_) => fail += 1,
            Status::Skip(_) => {
                skip += 1;
                eprintln!(
                    "*** SKIPPED verbs {}: {} ***",
                    r.test,
                    match &r.status {
                        Status::Skip(w) => w.as_str(),
                        _ => "",
                    }
                );
            }
        }
        println!("{}", r.line(role, &v.dev));
    }
    println!(
        "VERBS-SUMMARY role={role} dev={} pass={pass} fail={fail} skip={skip}",
        v.dev
    );
    Ok(if fail == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

#[cfg(not(feature = "verbs"))]
fn run_verbs(v: VerbsCli) -> Result<ExitCode> {
    v.to_args()?;
    bail!("this smc-guest-tests was built without the `verbs` feature (libibverbs)")
}

fn run_devmem_send(a: DevmemSendArgs) -> Result<ExitCode> {
    use smc_guest_tests::devmem_send::{run, SendConfig};
    if a.msg_size == 0 || a.msg_size > 64 << 20 {
        bail!("--msg-size must be 1 byte .. 64 MiB");
    }
    let cfg = SendConfig {
        to: a.to,
        bind: a.bind,
        bytes: a.bytes,
        modulus: a.pattern_mod,
        msg_size: a.msg_size as usize,
        connect_timeout: Duration::from_secs_f64(a.connect_timeout),
        io_timeout: Duration::from_secs_f64(a.io_timeout),
        wait_close: !a.no_wait_close,
    };
    let r = run(&cfg).with_context(|| format!("devmem-send to {}", a.to))?;
    let mbps = |secs: f64| {
        if secs > 0.0 {
            r.sent as f64 * 8.0 / secs / 1e6
        } else {
            0.0
        }
    };
    let close = r
        .close_secs
        .map(|c| format!(" closed_by_peer_after={c:.2}s ({:.1} Mbit/s)", mbps(c)))
        .unwrap_or_default();
    println!(
        "DEVMEM-SEND to={} local={} bytes={} pattern_mod={} attempts={} connect={:.2}s send={:.2}s ({:.1} Mbit/s){close} received_back={}",
        a.to,
        r.local.map(|l| l.to_string()).unwrap_or_else(|| "?".into()),
        r.sent,
        a.pattern_mod,
        r.attempts,
        r.connect_secs,
        r.send_secs,
        mbps(r.send_secs),
        r.received_back
    );
    Ok(ExitCode::SUCCESS)
}

fn run_devmem_recv(a: DevmemRecvArgs) -> Result<ExitCode> {
    use smc_guest_tests::devmem_recv::{run, RecvConfig};
    if a.recv_size == 0 || a.recv_size > 64 << 20 {
        bail!("--recv-size must be 1 byte .. 64 MiB");
    }
    let dmabuf_size = a
        .dmabuf_size
        .map(usize::try_from)
        .transpose()
        .context("--dmabuf-size")?;
    let cfg = RecvConfig {
        ifname: a.dev.clone(),
        queue: a.queue,
        listen: a.listen,
        bytes: a.bytes,
        modulus: a.pattern_mod,
        dmabuf_size,
        recv_size: a.recv_size as usize,
        accept_timeout: secs_opt(a.accept_timeout),
        io_timeout: secs_opt(a.io_timeout),
        allow_ordinary: a.allow_ordinary,
        ordinary: a.ordinary,
    };
    let r =
        run(&cfg, |l| println!("{l}")).with_context(|| format!("devmem-recv on {}", a.listen))?;
    println!(
        "devmem-recv: {} bytes from {} in {:.3} s = {:.1} MiB/s, cpu {:.3} s ({:.3} s/GiB): {} dmabuf frags, {} linear bytes, {} SO_DEVMEM_DONTNEED calls -> PASS",
        r.counters.bytes,
        r.peer.map(|p| p.to_string()).unwrap_or_else(|| "?".into()),
        r.secs,
        r.mibps(),
        r.cpu_secs,
        r.cpu_s_per_gib(),
        r.counters.frags,
        r.counters.linear_bytes,
        r.counters.dontneed_calls
    );
    println!("{}", r.result_line());
    Ok(ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Stream(a) => run_stream(a),
        Cmd::Smc { cmd } => run_smc(cmd),
        Cmd::Qstats { dev } => run_qstats(&dev),
        Cmd::Verbs(v) => run_verbs(v),
        Cmd::DevmemSend(a) => run_devmem_send(a),
        Cmd::DevmemRecv(a) => run_devmem_recv(a),
    };
    match r {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use smc_guest_tests::verbs::VerbsTest;

    fn verbs(args: &[&str]) -> Result<verbs_args::VerbsArgsLite> {
        let mut v = vec!["smc-guest-tests", "verbs"];
        v.extend_from_slice(args);
        match Cli::try_parse_from(v)?.cmd {
            Cmd::Verbs(v) => v.to_args(),
            _ => unreachable!(),
        }
    }

    #[test]
    fn verbs_client_cli() {
        let a = verbs(&[
            "client",
            "--dev",
            "rxe0",
            "--peer",
            "10.77.0.1",
            "--tests",
            "write,cas",
            "--size",
            "4K",
            "--iters",
            "3",
        ])
        .unwrap();
        assert!(!a.server);
        assert_eq!(a.addr, std::net::Ipv4Addr::new(10, 77, 0, 1));
        let c = a.cfg.unwrap();
        assert_eq!(
            (c.tests, c.size, c.iters, c.seed),
            (vec![VerbsTest::Write, VerbsTest::Cas], 4096, 3, 1)
        );
        // defaults: every test, 64K x 8
        let c = verbs(&["client", "--dev", "siw0", "--peer", "10.0.0.2"])
            .unwrap()
            .cfg
            .unwrap();
        assert_eq!((c.tests.len(), c.size, c.iters), (7, 65536, 8));
        // errors
        assert!(verbs(&["client", "--dev", "rxe0"])
            .unwrap_err()
            .to_string()
            .contains("--peer"));
        assert!(verbs(&["client", "--dev", "rxe0", "--peer", "fe80::1"])
            .unwrap_err()
            .to_string()
            .contains("IPv4"));
        assert!(
            verbs(&["client", "--dev", "rxe0", "--peer", "10.0.0.1", "--tests", "bogus"]).is_err()
        );
        assert!(verbs(&["client", "--dev", "rxe0", "--peer", "10.0.0.1", "--iters", "0"]).is_err());
        assert!(verbs(&["client", "--dev", "rxe0", "--peer", "10.0.0.1", "--size", "0"]).is_err());
        assert!(verbs(&[
            "client", "--dev", "rxe0", "--peer", "10.0.0.1", "--size", "16M", "--iters", "1000"
        ])
        .is_err());
        assert!(
            verbs(&["client", "--dev", "rxe0", "--peer", "10.0.0.1", "--addr", "10.0.0.2"])
                .is_err()
        );
        assert!(
            verbs(&["client", "--peer", "10.0.0.1"]).is_err(),
            "--dev is required"
        );
    }

    #[test]
    fn devmem_send_cli() {
        let p = |args: &[&str]| {
            let mut v = vec!["smc-guest-tests", "devmem-send"];
            v.extend_from_slice(args);
            Cli::try_parse_from(v).map(|c| match c.cmd {
                Cmd::DevmemSend(a) => a,
                _ => unreachable!(),
            })
        };
        let a = p(&["--to", "10.77.0.1:5201", "--bind", "10.77.0.2:5201"]).unwrap();
        assert_eq!(a.to.to_string(), "10.77.0.1:5201");
        assert_eq!(a.bind.unwrap().port(), 5201);
        assert_eq!(
            (a.bytes, a.pattern_mod, a.msg_size),
            (64 << 20, 7, 64 << 10)
        );
        assert!(!a.no_wait_close);
        let a = p(&[
            "--to",
            "[fd77::1]:5202",
            "--bytes",
            "1",
            "--pattern-mod",
            "8",
        ])
        .unwrap();
        assert!(a.to.is_ipv6() && a.bind.is_none());
        assert_eq!((a.bytes, a.pattern_mod), (1, 8));
        assert!(p(&["--bytes", "1M"]).is_err(), "--to is required");
        assert!(p(&["--to", "10.77.0.1"]).is_err(), "needs a port");
        assert!(p(&["--to", "10.77.0.1:1", "--pattern-mod", "1"]).is_err());
        assert!(p(&["--to", "10.77.0.1:1", "--pattern-mod", "256"]).is_err());
    }

    #[test]
    fn devmem_recv_cli() {
        let p = |args: &[&str]| {
            let mut v = vec!["smc-guest-tests", "devmem-recv"];
            v.extend_from_slice(args);
            Cli::try_parse_from(v).map(|c| match c.cmd {
                Cmd::DevmemRecv(a) => a,
                _ => unreachable!(),
            })
        };
        let a = p(&["--listen", "10.77.0.1:5302"]).unwrap();
        assert_eq!(a.listen.to_string(), "10.77.0.1:5302");
        assert_eq!((a.dev.as_str(), a.queue, a.bytes), ("eth0", None, None));
        assert_eq!(
            (a.pattern_mod, a.recv_size, a.dmabuf_size),
            (7, 1 << 20, None)
        );
        assert!(!a.allow_ordinary);
        let a = p(&[
            "--listen",
            "[fd77::1]:5302",
            "--dev",
            "eth1",
            "--queue",
            "3",
            "--bytes",
            "128M",
            "--dmabuf-size",
            "8M",
            "--pattern-mod",
            "8",
            "--allow-ordinary",
        ])
        .unwrap();
        assert!(a.listen.is_ipv6());
        assert_eq!(
            (a.queue, a.bytes, a.dmabuf_size),
            (Some(3), Some(128 << 20), Some(8 << 20))
        );
        assert_eq!(a.pattern_mod, 8);
        assert!(a.allow_ordinary && !a.ordinary);
        let a = p(&["--listen", "10.77.0.1:5304", "--ordinary"]).unwrap();
        assert!(a.ordinary && !a.allow_ordinary);
        for extra in [
            &["--queue", "1"][..],
            &["--dmabuf-size", "8M"],
            &["--allow-ordinary"],
        ] {
            let mut v = vec!["--listen", "10.77.0.1:5304", "--ordinary"];
            v.extend_from_slice(extra);
            assert!(p(&v).is_err(), "--ordinary with {extra:?}");
        }
        assert!(p(&[]).is_err(), "--listen is required");
        assert!(p(&["--listen", "10.77.0.1"]).is_err(), "needs a port");
        assert!(p(&["--listen", "10.77.0.1:1", "--pattern-mod", "1"]).is_err());
    }

    #[test]
    fn verbs_server_cli() {
        let a = verbs(&["server", "--dev", "rxe0", "--port", "9000"]).unwrap();
        assert!(a.server && a.cfg.is_none());
        assert_eq!(a.addr, std::net::Ipv4Addr::UNSPECIFIED);
        assert_eq!(a.expect, Default::default());
        let a = verbs(&[
            "server",
            "--dev",
            "rxe0",
            "--addr",
            "10.77.0.1",
            "--tests",
            "send",
            "--iters",
            "2",
        ])
        .unwrap();
        assert_eq!(a.addr, std::net::Ipv4Addr::new(10, 77, 0, 1));
        assert_eq!(a.expect.tests, Some(vec![VerbsTest::Send]));
        assert_eq!((a.expect.iters, a.expect.size), (Some(2), None));
        assert!(verbs(&["server", "--dev", "rxe0", "--peer", "10.0.0.1"]).is_err());
    }
}

//! The fabric benchmark, two parts in one run:
//!
//! 1. In-process: two `TestGuest`s (the test harness's strict driver) on two
//!    ports of a `Server` running in this process; A sends bursts, B receives
//!    and re-posts buffers, one burst at a time: at 64 B and 1500 B, and
//!    64 KiB TSO frames to a receiver that takes them whole (GUEST_TSO4,
//!    mergeable 4 KiB buffers), its line `fabric-bench-tso frame_bytes=N
//!    fps=N`.
//! 2. Switch against switch, each a separate process: the real
//!    `vhost-rdma serve` daemon, and `dpdk-testpmd` (Debian's DPDK) with two
//!    `net_vhost` ports in io forwarding mode. Both are driven by the same
//!    in-process vhost-user frontend as part 1, with its lean driver
//!    (`tests/common/fast_guest.rs`), with the same bursts of the same frames, at 64 B then 1500 B. Each switch is
//!    given the machine's last CPU (testpmd's forwarding lcore with `-l`,
//!    the daemon with `--cpu-affinity`); the frontend, which plays the
//!    guests, runs on CPU 0. The daemon also runs a second time unpinned
//!    (its default), reported beside. Per size, after priming (a burst must
//!    arrive unchanged) and a warm-up, the switches take turns for a few
//!    rounds (testpmd is frozen with SIGSTOP while the daemon is measured, so
//!    its polling core does not steal the daemon's CPU; load from elsewhere
//!    hits all alike):
//!    - saturation: bursts as fast as the switch takes them;
//!    - paced: both switches offered the same load, the goal rate of issue
//!      13 (1 M frames/s at 64 B, 10 Gbit/s at 1500 B), the frontend
//!      sleeping between bursts.
//!
//!    The switch's CPU time (user + system of the whole process, every
//!    thread, `/proc/PID/stat`) is read around each timed round and divided
//!    by the frames forwarded. testpmd's forwarding core polls even when it
//!    has nothing to do; that time is in its figure, as it is in the
//!    machine's bill: at saturation it is never idle, at the paced load it
//!    is idle between bursts.
//!
//! The output ends with one line per frame size:
//! `fabric-bench size=64 ours_fps=N dpdk_fps=N ours_cpu_ns=N dpdk_cpu_ns=N`:
//! `*_fps` the most each switch forwarded (saturation), `*_cpu_ns` the CPU
//! per frame at the paced load (at saturation if the paced rounds are off).
//! Above them, `fabric-bench-saturated` and `fabric-bench-paced` lines give
//! both measurements whole, with the unpinned daemon's figures. `NA` for a
//! switch that is missing or failed, loudly said above.
//!
//! Run: `cargo bench -p vhost-rdma --bench fabric` (`-- --quick` or
//! `VHOST_RDMA_BENCH_QUICK=1` for short runs). `ci/bench-fabric-dpdk.sh`
//! installs DPDK and runs it. Knobs: `VHOST_RDMA_BENCH_SECS` (seconds per
//! switch, size and load, default 3), `VHOST_RDMA_BENCH_ROUNDS` (default 3),
//! `VHOST_RDMA_BENCH_WINDOW` (frames in flight, default 192),
//! `VHOST_RDMA_BENCH_QSIZE` (ring size, default 256),
//! `VHOST_RDMA_BENCH_PACED=0` (no paced rounds),
//! `VHOST_RDMA_BENCH_UNPINNED=0` (no unpinned daemon), `DPDK_TESTPMD`
//! (path), `VHOST_RDMA_BIN` (daemon binary), `VHOST_RDMA_BENCH_PERF=DIR`
//! (record `perf record -g` of each switch's timed loop into DIR).

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "fabric/switches.rs"]
mod switches;

use common::fast_guest::{self, drive, prime, FastGuest};
use common::guest::GSO_TCPV4;
use common::packet::{pattern, tagged_frame, tso_frame, Flow, TCP_ACK};
use common::{feat, Layout, RxFrame, TempDir, TestFabric, TestGuest, TxOpts, ARRIVE};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use switches::Switch;

const BURST: usize = 64;
const SIZES: [usize; 2] = [64, 1500];

/// The paced load per frame size: issue 13's goal rates, 1 M frames/s at
/// 64 B and 10 Gbit/s of frames above that (833,333 frames/s at 1500 B).
/// Both switches carry this same offered load, so a switch that polls pays
/// for its idle time between bursts, as it does on a real machine.
fn goal_fps(len: usize) -> f64 {
    if len <= 64 {
        1e6
    } else {
        10e9 / (len as f64 * 8.0)
    }
}

/// Part 1: the in-process measurement (TestGuest harness, one burst in flight).
fn in_process(len: usize, min_time: Duration) -> (u64, f64) {
    let fab = TestFabric::start(2, 1);
    let (mut a, mut b) = fab.sender_receiver(0, 1);
    let (ma, mb) = (fab.mac(0), fab.mac(1));
    let frames: Vec<Vec<u8>> = (0..BURST)
        .map(|i| tagged_frame(mb, ma, i as u64, len))
        .collect();
    let rx = (BURST, 2048);
    bursts(
        &fab,
        (&mut a, &mut b),
        &frames,
        &TxOpts::default(),
        rx,
        min_time,
        |_| {},
    )
}

/// TSO frames in flight in part 1's TSO row: 17 receive buffers of 4 KiB
/// each, within the harness's 256-entry ring.
const TSO_BURST: usize = 8;
/// The TSO row's TCP payload per frame: the most a 64 KiB IPv4 frame takes.
const TSO_PAYLOAD: usize = 65535 - 20 - 20;

/// Part 1's TSO row: 64 KiB TSO frames (as a Linux guest's virtio-net hands
/// them over, chained in 17 descriptors) to a receiver that negotiated
/// GUEST_TSO4 and mergeable buffers, so the fabric forwards them whole;
/// the receiver checks each one's payload.
fn in_process_tso(min_time: Duration) -> (u64, f64) {
    let fab = TestFabric::start(2, 1);
    let mut a = fab.connect(0, feat::ALL & !feat::MQ);
    let mut b = fab.connect(1, feat::ALL & !feat::MQ);
    assert!(
        b.has(feat::GUEST_TSO4 | feat::MRG_RXBUF),
        "receiver takes TSO frames"
    );
    let rx = (TSO_BURST * (12 + 14 + 65535usize).div_ceil(4096), 4096);
    b.post_rx(0, rx.0, rx.1);
    let flow = Flow::v4(fab.mac(0), fab.mac(1), 40000, 5001);
    let payload = pattern(TSO_PAYLOAD, 5);
    let (frame, hdr) = tso_frame(&flow, 1, TCP_ACK, &payload, 1448);
    let frames = vec![frame; TSO_BURST];
    let opts = TxOpts {
        hdr,
        layout: Layout::Chained(17),
    };
    let headers = frames[0].len() - TSO_PAYLOAD;
    bursts(&fab, (&mut a, &mut b), &frames, &opts, rx, min_time, |r| {
        assert_eq!(r.hdr.gso_type, GSO_TCPV4, "forwarded whole");
        assert!(r.data[headers..] == payload[..], "payload changed");
    })
}

/// Part 1's loop: A sends `frames` as one burst, B takes them all (each
/// checked by `check`) and posts `rx` (count, size) buffers again, until
/// `min_time` has passed. Returns the frames moved and the seconds.
fn bursts(
    fab: &TestFabric,
    (a, b): (&mut TestGuest, &mut TestGuest),
    frames: &[Vec<u8>],
    opts: &TxOpts,
    rx: (usize, u32),
    min_time: Duration,
    check: impl Fn(&RxFrame),
) -> (u64, f64) {
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < min_time {
        a.send_burst(0, frames, opts);
        let got = b.recv_n(0, frames.len(), ARRIVE);
        assert_eq!(got.len(), frames.len(), "frames lost in the benchmark");
        got.iter().for_each(&check);
        n += got.len() as u64;
        b.post_rx(0, rx.0, rx.1);
        a.wait_tx(0, ARRIVE);
    }
    let secs = start.elapsed().as_secs_f64();
    let s = fab.stats(1);
    assert_eq!(s.totals.rx_drops, 0, "drops during the benchmark");
    (n, secs)
}

struct Cfg {
    secs: Duration,
    rounds: usize,
    warmup: Duration,
    window: usize,
    qsize: u16,
    perf: Option<PathBuf>,
    /// Also measure both switches at the same paced load ([`goal_fps`]).
    paced: bool,
}

/// One switch with its two guests: port 0 sends, port 1 receives.
struct Side {
    tag: &'static str,
    /// Paused (SIGSTOP) while the other side is measured: testpmd polls.
    pauses: bool,
    a: FastGuest,
    b: FastGuest,
    negotiated: String,
    threads: usize,
    rows: Vec<Row>,
    // Declared last: the guests disconnect before the switch stops.
    sw: Switch,
    _dir: TempDir,
}

/// One (switch, frame size, offered load): the sums over the rounds.
struct Row {
    size: usize,
    /// The paced load in frames/s; None: as fast as the switch goes.
    offered: Option<f64>,
    frames: u64,
    secs: f64,
    switch_cpu_ns: u64,
    frontend_cpu_ns: u64,
    sleeps: u64,
    max_sleep: Duration,
    kicks: u64,
    /// Context switches of the switch's threads.
    ctx_switches: u64,
    round_fps: Vec<f64>,
}

impl Row {
    fn fps(&self) -> f64 {
        self.frames as f64 / self.secs
    }
    fn gbps(&self) -> f64 {
        self.fps() * self.size as f64 * 8.0 / 1e9
    }
    fn cpu_per_frame(&self) -> f64 {
        self.switch_cpu_ns as f64 / self.frames as f64
    }
    fn offered_label(&self) -> String {
        match self.offered {
            None => "saturation".to_string(),
            Some(r) => format!("paced {:.0} k frames/s", r / 1e3),
        }
    }
}

impl Side {
    /// Starts the switch in a fresh directory and connects the receiver
    /// (port 1), then the sender (port 0).
    fn start(
        tag: &'static str,
        pauses: bool,
        start: impl FnOnce(&Path) -> anyhow::Result<Switch>,
        cfg: &Cfg,
    ) -> anyhow::Result<Side> {
        let dir = TempDir::new(tag);
        let sw = start(dir.path())?;
        let connect = |i: usize| {
            FastGuest::connect(&sw.sockets[i], fast_guest::WANT, cfg.qsize).map_err(|e| {
                anyhow::anyhow!(
                    "{e:#}\n--- {} output (tail) ---\n{}",
                    sw.name,
                    sw.log_tail(20)
                )
            })
        };
        let b = connect(1)?;
        let a = connect(0)?;
        let negotiated = format!(
            "offered {:#x}, negotiated {}",
            a.offered,
            feat::names(a.features)
        );
        let side = Side {
            tag,
            pauses,
            a,
            b,
            negotiated,
            threads: 0,
            rows: Vec::new(),
            sw,
            _dir: dir,
        };
        side.pause();
        Ok(side)
    }

    /// The row of frame size `len` at load `offered`.
    fn row(&self, len: usize, offered: Option<f64>) -> Option<&Row> {
        self.rows
            .iter()
            .find(|r| r.size == len && r.offered == offered)
    }

    fn pause(&self) {
        if self.pauses {
            self.sw.pause();
        }
    }

    fn resume(&self) {
        if self.pauses {
            self.sw.resume();
        }
    }

    /// CPU the switch burns with no traffic at all, in cores, over `t`.
    fn idle_cores(&self, t: Duration) -> anyhow::Result<f64> {
        self.resume();
        std::thread::sleep(Duration::from_millis(100));
        let c0 = self.sw.cpu_ns()?;
        let t0 = Instant::now();
        std::thread::sleep(t);
        let c1 = self.sw.cpu_ns()?;
        let secs = t0.elapsed().as_secs_f64();
        self.pause();
        Ok((c1 - c0) as f64 / 1e9 / secs)
    }

    fn fail(&self, e: anyhow::Error) -> anyhow::Error {
        anyhow::anyhow!(
            "{e:#}\n--- {} output (tail) ---\n{}",
            self.sw.name,
            self.sw.log_tail(20)
        )
    }

    /// Loads `len`-byte frames, checks that they go through unchanged, warms up.
    fn prepare(&mut self, len: usize, cfg: &Cfg) -> anyhow::Result<()> {
        let (dst, src) = self.sw.macs;
        let frames: Vec<Vec<u8>> = (0..BURST)
            .map(|i| tagged_frame(dst, src, i as u64, len))
            .collect();
        self.resume();
        self.a.set_frames(&frames);
        let r = prime(&mut self.a, &mut self.b, &frames, Duration::from_secs(10)).and_then(|_| {
            drive(
                &mut self.a,
                &mut self.b,
                BURST,
                cfg.window,
                cfg.warmup,
                ARRIVE,
                None,
            )
        });
        self.pause();
        r.map(|_| ()).map_err(|e| self.fail(e))
    }

    /// One timed round at `len` bytes (paced at `rate` frames/s, or as fast
    /// as the switch goes), added to that row.
    fn round(
        &mut self,
        len: usize,
        rate: Option<f64>,
        secs: Duration,
        cfg: &Cfg,
    ) -> anyhow::Result<()> {
        let me = std::process::id();
        self.resume();
        let tag = match rate {
            None => format!("{}-{len}", self.tag),
            Some(r) => format!("{}-{len}-paced{r:.0}", self.tag),
        };
        let perf = perf_start(cfg, self.sw.pid(), &tag);
        let x0 = switches::ctx_switches(self.sw.pid());
        let c0 = self.sw.cpu_ns()?;
        let f0 = switches::cpu_ns(me)?;
        let run = drive(
            &mut self.a,
            &mut self.b,
            BURST,
            cfg.window,
            secs,
            ARRIVE,
            rate,
        );
        let c1 = self.sw.cpu_ns()?;
        let f1 = switches::cpu_ns(me)?;
        let x1 = switches::ctx_switches(self.sw.pid());
        self.threads = switches::threads(self.sw.pid());
        perf_stop(perf);
        self.pause();
        let run = run.map_err(|e| self.fail(e))?;
        if self
            .rows
            .last()
            .is_none_or(|r| r.size != len || r.offered != rate)
        {
            self.rows.push(Row {
                size: len,
                offered: rate,
                frames: 0,
                secs: 0.0,
                switch_cpu_ns: 0,
                frontend_cpu_ns: 0,
                sleeps: 0,
                max_sleep: Duration::ZERO,
                kicks: 0,
                ctx_switches: 0,
                round_fps: Vec::new(),
            });
        }
        let Some(r) = self.rows.last_mut() else {
            anyhow::bail!("no row for {len} B");
        };
        r.frames += run.frames;
        r.secs += run.secs;
        r.switch_cpu_ns += c1 - c0;
        r.frontend_cpu_ns += f1 - f0;
        r.sleeps += run.sleeps;
        r.max_sleep = r.max_sleep.max(run.max_sleep);
        r.kicks += run.kicks;
        r.ctx_switches += x1.saturating_sub(x0);
        r.round_fps.push(run.frames as f64 / run.secs);
        Ok(())
    }
}

/// `perf record` of process `pid` during a timed round, when asked for.
fn perf_start(cfg: &Cfg, pid: u32, tag: &str) -> Option<std::process::Child> {
    let dir = cfg.perf.as_ref()?;
    let _ = std::fs::create_dir_all(dir);
    let mut i = 0;
    let out = loop {
        let p = dir.join(format!("{tag}.{i}.perf.data"));
        if !p.exists() {
            break p;
        }
        i += 1;
    };
    let p = std::process::Command::new("perf")
        .args([
            "record",
            "-q",
            "-g",
            "-F",
            "10000",
            "-p",
            &pid.to_string(),
            "-o",
        ])
        .arg(out)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| eprintln!("perf record: {e}"))
        .ok();
    // Give perf time to attach to every thread before the round starts.
    std::thread::sleep(Duration::from_millis(500));
    p
}

fn perf_stop(p: Option<std::process::Child>) {
    if let Some(mut p) = p {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(p.id() as libc::pid_t, libc::SIGINT) };
        let _ = p.wait();
    }
}

fn daemon_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("VHOST_RDMA_BIN") {
        return PathBuf::from(p);
    }
    PathBuf::from(env!("CARGO_BIN_EXE_vhost-rdma"))
}

fn skipped(why: &str) {
    println!();
    println!("############################################################");
    println!("SKIPPED: {why}");
    println!("############################################################");
    println!();
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick")
        || std::env::var_os("VHOST_RDMA_BENCH_QUICK").is_some();
    let env_num = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<f64>().ok());
    let secs = env_num("VHOST_RDMA_BENCH_SECS").unwrap_or(if quick { 0.5 } else { 3.0 });
    let cfg = Cfg {
        secs: Duration::from_secs_f64(secs),
        rounds: env_num("VHOST_RDMA_BENCH_ROUNDS")
            .map_or(if quick { 1 } else { 3 }, |r| (r as usize).max(1)),
        warmup: Duration::from_secs_f64((secs / 10.0).clamp(0.05, 0.3)),
        window: env_num("VHOST_RDMA_BENCH_WINDOW").map_or(192, |w| w as usize),
        qsize: env_num("VHOST_RDMA_BENCH_QSIZE").map_or(256, |q| q as u16),
        perf: std::env::var_os("VHOST_RDMA_BENCH_PERF").map(PathBuf::from),
        paced: std::env::var("VHOST_RDMA_BENCH_PACED").map_or(true, |v| v != "0"),
    };
    // Paced bursts are tens of microseconds apart: the default 50 us timer
    // slack would bunch them.
    // SAFETY: prctl(PR_SET_TIMERSLACK) takes an integer and touches no memory.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
    assert!(
        cfg.window >= BURST && cfg.window <= cfg.qsize as usize,
        "window must be in BURST..=QSIZE"
    );

    println!("# fabric benchmark");
    println!();
    println!("machine: {}", switches::machine());
    println!();

    // ---- part 1 ----
    println!("## In-process (TestGuest harness, Server in the bench process, one burst of {BURST} in flight)");
    println!();
    println!("| frame size | frames | seconds | frames/s | Gbit/s |");
    println!("|---:|---:|---:|---:|---:|");
    for len in SIZES {
        let (n, secs) = in_process(len, cfg.secs);
        let fps = n as f64 / secs;
        println!(
            "| {len} B | {n} | {secs:.2} | {fps:.0} | {:.2} |",
            fps * len as f64 * 8.0 / 1e9
        );
    }
    let (n, secs) = in_process_tso(cfg.secs);
    let fps = n as f64 / secs;
    let len = TSO_PAYLOAD + 54;
    println!(
        "| {len} B TSO, {TSO_BURST} in flight | {n} | {secs:.2} | {fps:.0} | {:.2} |",
        fps * len as f64 * 8.0 / 1e9
    );
    println!("fabric-bench-tso frame_bytes={len} fps={fps:.0}");
    println!();

    // ---- part 2 ----
    println!(
        "## vhost-rdma serve vs dpdk-testpmd (separate processes, same frontend, same bursts)"
    );
    println!();
    let bin = daemon_bin();
    let cpu = switches::forwarding_cpu();
    println!(
        "ours: {} serve --cpu-affinity {cpu} --port a=SOCK0,mac=52:54:00:13:00:0a --port b=SOCK1,mac=52:54:00:13:00:0b --control CTL",
        bin.display()
    );
    let start_ours = |tag: &'static str, pin: Option<usize>| match Side::start(
        tag,
        false,
        |d| switches::start_daemon(&bin, d, pin),
        &cfg,
    ) {
        Ok(s) => s,
        Err(e) => {
            println!("FAILED: vhost-rdma serve ({tag}): {e:#}");
            std::process::exit(1);
        }
    };
    // Given the CPU testpmd's forwarding lcore polls on, as testpmd is
    // given it with -l; and, unless VHOST_RDMA_BENCH_UNPINNED=0, the same
    // daemon left to the scheduler (its default).
    let mut ours = start_ours("ours", Some(cpu));
    let mut unpinned = std::env::var("VHOST_RDMA_BENCH_UNPINNED")
        .map_or(true, |v| v != "0")
        .then(|| {
            println!("ours-unpinned: the same without --cpu-affinity");
            start_ours("ours-unpinned", None)
        });
    let mut dpdk = match switches::find_testpmd() {
        None => {
            skipped("dpdk-testpmd not installed (apt-get install dpdk dpdk-dev; Debian 12 ships dpdk-testpmd in dpdk-dev)");
            None
        }
        Some(tp) => {
            let args = switches::testpmd_args(Path::new("SOCK0"), Path::new("SOCK1"));
            println!(
                "dpdk: {} {} (Debian DPDK {})",
                tp.display(),
                args.join(" "),
                switches::dpdk_version()
            );
            match Side::start("dpdk", true, |d| switches::start_testpmd(&tp, d), &cfg) {
                Ok(s) => Some(s),
                Err(e) => {
                    skipped(&format!("dpdk-testpmd failed: {e:#}"));
                    None
                }
            }
        }
    };
    // The frontend plays the guests: on a CPU of their own, as vCPUs would
    // be, away from the CPU the switches are given (children started above
    // keep the whole machine: only this thread is pinned).
    let frontend_cpu = (cpu > 0).then_some(0);
    if let Some(c) = frontend_cpu {
        // SAFETY: a zeroed cpu_set_t is a valid empty set; c < CPU_SETSIZE;
        // sched_setaffinity(0) applies to this thread only.
        let ok = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(c, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
        };
        println!(
            "frontend pinned to CPU {c}: {}",
            if ok {
                "yes"
            } else {
                "no (sched_setaffinity failed)"
            }
        );
    }
    println!(
        "frontend: tests/common/fast_guest.rs, bursts of {BURST} frames, at most {} in flight, rings of {}, asked {}",
        cfg.window,
        cfg.qsize,
        feat::names(fast_guest::WANT),
    );
    println!(
        "method: per frame size, {} alternating round(s) of {:.2} s per switch (the other switch frozen with SIGSTOP), after priming and a {:.2} s warm-up",
        cfg.rounds,
        cfg.secs.as_secs_f64() / cfg.rounds as f64,
        cfg.warmup.as_secs_f64()
    );
    if cfg.paced {
        let loads: Vec<String> = SIZES
            .iter()
            .map(|&l| format!("{:.0} frames/s at {l} B", goal_fps(l)))
            .collect();
        println!(
            "paced: then the same rounds with both switches offered the same load ({}): a burst goes when due, the frontend sleeps between bursts; CPU per frame counts what each switch spends while idle between bursts",
            loads.join(", ")
        );
    }
    let round = cfg.secs / cfg.rounds as u32;
    for len in SIZES {
        for o in std::iter::once(&mut ours).chain(unpinned.as_mut()) {
            if let Err(e) = o.prepare(len, &cfg) {
                println!("FAILED: vhost-rdma serve ({}), {len} B: {e:#}", o.tag);
                std::process::exit(1);
            }
        }
        if let Some(d) = &mut dpdk {
            if let Err(e) = d.prepare(len, &cfg) {
                skipped(&format!("dpdk-testpmd failed at {len} B: {e:#}"));
                dpdk = None;
            }
        }
        // As fast as each goes, then both at the same paced load.
        let loads = [None]
            .into_iter()
            .chain(cfg.paced.then(|| Some(goal_fps(len))));
        for rate in loads {
            for _ in 0..cfg.rounds {
                for o in std::iter::once(&mut ours).chain(unpinned.as_mut()) {
                    if let Err(e) = o.round(len, rate, round, &cfg) {
                        println!("FAILED: vhost-rdma serve ({}), {len} B: {e:#}", o.tag);
                        std::process::exit(1);
                    }
                }
                if let Some(d) = &mut dpdk {
                    if let Err(e) = d.round(len, rate, round, &cfg) {
                        skipped(&format!("dpdk-testpmd failed at {len} B: {e:#}"));
                        dpdk = None;
                    }
                }
            }
        }
    }
    let idle_t = Duration::from_secs_f64((cfg.secs.as_secs_f64() / 3.0).clamp(0.2, 1.0));
    let idle: Vec<String> = std::iter::once(&ours)
        .chain(unpinned.as_ref())
        .chain(dpdk.as_ref())
        .map(|s| match s.idle_cores(idle_t) {
            Ok(c) => format!("{} {c:.2} cores", s.tag),
            Err(e) => format!("{} ? ({e:#})", s.tag),
        })
        .collect();
    println!(
        "idle (no traffic, {:.1} s): {}",
        idle_t.as_secs_f64(),
        idle.join(", ")
    );
    println!("ours features: {}", ours.negotiated);
    if let Some(d) = &dpdk {
        println!("dpdk features: {}", d.negotiated);
    }
    println!();
    let sides: Vec<&Side> = std::iter::once(&ours)
        .chain(unpinned.as_ref())
        .chain(dpdk.as_ref())
        .collect();
    println!("| frame size | offered load | side | frames | seconds | frames/s | Gbit/s | switch CPU ns/frame | switch CPU (cores) | frontend CPU ns/frame |");
    println!("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|");
    for len in SIZES {
        for offered in [None, Some(goal_fps(len))] {
            for s in &sides {
                let Some(r) = s.row(len, offered) else {
                    continue;
                };
                println!(
                    "| {} B | {} | {} | {} | {:.2} | {:.0} | {:.2} | {:.0} | {:.2} | {:.0} |",
                    r.size,
                    r.offered_label(),
                    s.tag,
                    r.frames,
                    r.secs,
                    r.fps(),
                    r.gbps(),
                    r.cpu_per_frame(),
                    r.switch_cpu_ns as f64 / 1e9 / r.secs,
                    r.frontend_cpu_ns as f64 / r.frames as f64
                );
            }
        }
    }
    println!();
    for s in &sides {
        for r in &s.rows {
            let fps: Vec<String> = r.round_fps.iter().map(|f| format!("{f:.0}")).collect();
            println!(
                "{} {} B, {}: rounds {} frames/s; switch ({} threads) {:.4} context switches per frame; frontend slept {} times (longest {:.1} ms), {:.4} kicks per frame",
                s.tag,
                r.size,
                r.offered_label(),
                fps.join(" / "),
                s.threads,
                r.ctx_switches as f64 / r.frames as f64,
                r.sleeps,
                r.max_sleep.as_secs_f64() * 1e3,
                r.kicks as f64 / r.frames as f64
            );
        }
    }
    println!();
    // The figures of one row of each side, or NA for a side that failed.
    let figures = |len: usize, offered: Option<f64>| {
        let fmt = |r: Option<&Row>| match r {
            Some(r) => (
                format!("{:.0}", r.fps()),
                format!("{:.0}", r.cpu_per_frame()),
            ),
            None => ("NA".to_string(), "NA".to_string()),
        };
        let (ofps, ocpu) = fmt(ours.row(len, offered));
        let (dfps, dcpu) = fmt(dpdk.as_ref().and_then(|d| d.row(len, offered)));
        (ofps, dfps, ocpu, dcpu)
    };
    let free = |len: usize, offered: Option<f64>| match unpinned.as_ref() {
        Some(u) => match u.row(len, offered) {
            Some(r) => format!(
                " unpinned_fps={:.0} unpinned_cpu_ns={:.0}",
                r.fps(),
                r.cpu_per_frame()
            ),
            None => " unpinned_fps=NA unpinned_cpu_ns=NA".to_string(),
        },
        None => String::new(),
    };
    // Saturation first: what each switch costs per frame when it is never idle.
    for len in SIZES {
        let (ofps, dfps, ocpu, dcpu) = figures(len, None);
        println!(
            "fabric-bench-saturated size={len} ours_fps={ofps} dpdk_fps={dfps} ours_cpu_ns={ocpu} dpdk_cpu_ns={dcpu}{}",
            free(len, None)
        );
    }
    if cfg.paced {
        for len in SIZES {
            let (ofps, dfps, ocpu, dcpu) = figures(len, Some(goal_fps(len)));
            println!(
                "fabric-bench-paced size={len} offered_fps={:.0} ours_fps={ofps} dpdk_fps={dfps} ours_cpu_ns={ocpu} dpdk_cpu_ns={dcpu}{}",
                goal_fps(len),
                free(len, Some(goal_fps(len)))
            );
        }
    }
    // The summary lines: each switch's highest frame rate (saturation), and
    // CPU per frame at the goal load, testpmd's idle polling counted (at
    // saturation when the paced rounds are off).
    for len in SIZES {
        let (ofps, dfps, _, _) = figures(len, None);
        let load = cfg.paced.then(|| goal_fps(len));
        let (_, _, ocpu, dcpu) = figures(len, load);
        println!(
            "fabric-bench size={len} ours_fps={ofps} dpdk_fps={dfps} ours_cpu_ns={ocpu} dpdk_cpu_ns={dcpu}"
        );
    }
}

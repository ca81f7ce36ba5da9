//! The fabric benchmark, two parts in one run:
//!
//! 1. In-process: two `TestGuest`s (the test harness's strict driver) on two
//!    ports of a `Server` running in this process; A sends bursts, B receives
//!    and re-posts buffers, one burst at a time.
//! 2. Switch against switch, each a separate process: the real
//!    `vhost-rdma serve` daemon, and `dpdk-testpmd` (Debian's DPDK) with two
//!    `net_vhost` ports in io forwarding mode. Both are driven by the same
//!    lean in-process vhost-user frontend (`fabric/frontend.rs`) with the
//!    same bursts of the same frames, at 64 B then 1500 B. Per size, after
//!    priming (a burst must arrive unchanged) and a warm-up, the two switches
//!    take turns for a few rounds (the one not measured is frozen with
//!    SIGSTOP, so testpmd's polling core does not steal the CPU from the
//!    daemon, and load from elsewhere on the machine hits both alike). The
//!    switch's CPU time (user + system of the whole process, every thread,
//!    `/proc/PID/stat`) is read around each timed round and divided by the
//!    frames forwarded. testpmd's forwarding core polls even when it has
//!    nothing to do; that time is in its figure, as it is in the machine's
//!    bill.
//!
//! The output ends with one line per frame size:
//! `fabric-bench size=64 ours_fps=N dpdk_fps=N ours_cpu_ns=N dpdk_cpu_ns=N`
//! (`NA` for DPDK when dpdk-testpmd is missing or failed, loudly said above).
//!
//! Run: `cargo bench -p vhost-rdma --bench fabric` (`-- --quick` or
//! `VHOST_RDMA_BENCH_QUICK=1` for short runs). `ci/bench-fabric-dpdk.sh`
//! installs DPDK and runs it. Knobs: `VHOST_RDMA_BENCH_SECS` (seconds per
//! switch and size, default 3), `VHOST_RDMA_BENCH_ROUNDS` (default 3),
//! `VHOST_RDMA_BENCH_WINDOW` (frames in flight, default 192),
//! `VHOST_RDMA_BENCH_QSIZE` (ring size, default 256), `DPDK_TESTPMD` (path),
//! `VHOST_RDMA_BIN` (daemon binary), `VHOST_RDMA_BENCH_PERF=DIR` (record
//! `perf record -g` of each switch's timed loop into DIR).

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "fabric/frontend.rs"]
mod frontend;
#[path = "fabric/switches.rs"]
mod switches;

use common::packet::tagged_frame;
use common::{feat as tfeat, TempDir, TestFabric, TxOpts, ARRIVE};
use frontend::{drive, feat, prime, Guest};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use switches::Switch;

const BURST: usize = 64;
const SIZES: [usize; 2] = [64, 1500];

/// Part 1: the in-process measurement (TestGuest harness, one burst in flight).
fn in_process(len: usize, min_time: Duration) -> (u64, f64) {
    let fab = TestFabric::start(2, 1);
    let features = tfeat::ALL & !tfeat::MQ;
    let mut a = fab.connect(0, features);
    let mut b = fab.connect(1, features);
    let (ma, mb) = (fab.mac(0), fab.mac(1));
    b.post_rx(0, 256, 2048);
    a.post_rx(0, 8, 2048);
    let frames: Vec<Vec<u8>> = (0..BURST)
        .map(|i| tagged_frame(mb, ma, i as u64, len))
        .collect();
    let opts = TxOpts::default();
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < min_time {
        a.send_burst(0, &frames, &opts);
        let got = b.recv_n(0, BURST, ARRIVE);
        assert_eq!(got.len(), BURST, "frames lost in the benchmark");
        n += got.len() as u64;
        b.post_rx(0, BURST, 2048);
        a.wait_tx(0, ARRIVE);
    }
    let secs = start.elapsed().as_secs_f64();
    let s = fab.stats(1);
    assert_eq!(s.rx_drops, 0, "drops during the benchmark");
    (n, secs)
}

struct Cfg {
    secs: Duration,
    rounds: usize,
    warmup: Duration,
    window: usize,
    qsize: u16,
    perf: Option<PathBuf>,
}

/// One switch with its two guests: port 0 sends, port 1 receives.
struct Side {
    tag: &'static str,
    /// Paused (SIGSTOP) while the other side is measured: testpmd polls.
    pauses: bool,
    a: Guest,
    b: Guest,
    negotiated: String,
    threads: usize,
    rows: Vec<Row>,
    // Declared last: the guests disconnect before the switch stops.
    sw: Switch,
    _dir: TempDir,
}

/// One (switch, frame size): the sums over the rounds.
struct Row {
    size: usize,
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
            Guest::connect(&sw.sockets[i], feat::WANT, cfg.qsize).map_err(|e| {
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
            )
        });
        self.pause();
        r.map(|_| ()).map_err(|e| self.fail(e))
    }

    /// One timed round at `len` bytes, added to this size's row.
    fn round(&mut self, len: usize, secs: Duration, cfg: &Cfg) -> anyhow::Result<()> {
        let me = std::process::id();
        self.resume();
        let perf = perf_start(cfg, self.sw.pid(), &format!("{}-{len}", self.tag));
        let x0 = switches::ctx_switches(self.sw.pid());
        let c0 = self.sw.cpu_ns()?;
        let f0 = switches::cpu_ns(me)?;
        let run = drive(&mut self.a, &mut self.b, BURST, cfg.window, secs, ARRIVE);
        let c1 = self.sw.cpu_ns()?;
        let f1 = switches::cpu_ns(me)?;
        let x1 = switches::ctx_switches(self.sw.pid());
        self.threads = switches::threads(self.sw.pid());
        perf_stop(perf);
        self.pause();
        let run = run.map_err(|e| self.fail(e))?;
        if self.rows.last().is_none_or(|r| r.size != len) {
            self.rows.push(Row {
                size: len,
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
        let r = self.rows.last_mut().unwrap();
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
    };
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
    println!();

    // ---- part 2 ----
    println!(
        "## vhost-rdma serve vs dpdk-testpmd (separate processes, same frontend, same bursts)"
    );
    println!();
    let bin = daemon_bin();
    println!(
        "ours: {} serve --port a=SOCK0,mac=52:54:00:13:00:0a --port b=SOCK1,mac=52:54:00:13:00:0b --control CTL",
        bin.display()
    );
    let mut ours = match Side::start("ours", false, |d| switches::start_daemon(&bin, d), &cfg) {
        Ok(s) => s,
        Err(e) => {
            println!("FAILED: vhost-rdma serve: {e:#}");
            std::process::exit(1);
        }
    };
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
    println!(
        "frontend: benches/fabric/frontend.rs, bursts of {BURST} frames, at most {} in flight, rings of {}, asked {}",
        cfg.window,
        cfg.qsize,
        feat::names(feat::WANT),
    );
    println!(
        "method: per frame size, {} alternating round(s) of {:.2} s per switch (the other switch frozen with SIGSTOP), after priming and a {:.2} s warm-up",
        cfg.rounds,
        cfg.secs.as_secs_f64() / cfg.rounds as f64,
        cfg.warmup.as_secs_f64()
    );
    let round = cfg.secs / cfg.rounds as u32;
    for len in SIZES {
        if let Err(e) = ours.prepare(len, &cfg) {
            println!("FAILED: vhost-rdma serve, {len} B: {e:#}");
            std::process::exit(1);
        }
        if let Some(d) = &mut dpdk {
            if let Err(e) = d.prepare(len, &cfg) {
                skipped(&format!("dpdk-testpmd failed at {len} B: {e:#}"));
                dpdk = None;
            }
        }
        for _ in 0..cfg.rounds {
            if let Err(e) = ours.round(len, round, &cfg) {
                println!("FAILED: vhost-rdma serve, {len} B: {e:#}");
                std::process::exit(1);
            }
            if let Some(d) = &mut dpdk {
                if let Err(e) = d.round(len, round, &cfg) {
                    skipped(&format!("dpdk-testpmd failed at {len} B: {e:#}"));
                    dpdk = None;
                }
            }
        }
    }
    let idle_t = Duration::from_secs_f64((cfg.secs.as_secs_f64() / 3.0).clamp(0.2, 1.0));
    let idle: Vec<String> = std::iter::once(&ours)
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
    let sides: Vec<&Side> = std::iter::once(&ours).chain(dpdk.as_ref()).collect();
    println!("| frame size | side | frames | seconds | frames/s | Gbit/s | switch CPU ns/frame | switch CPU (cores) | frontend CPU ns/frame |");
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|");
    for len in SIZES {
        for s in &sides {
            let r = s.rows.iter().find(|r| r.size == len).unwrap();
            println!(
                "| {} B | {} | {} | {:.2} | {:.0} | {:.2} | {:.0} | {:.2} | {:.0} |",
                r.size,
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
    println!();
    for s in &sides {
        for r in &s.rows {
            let fps: Vec<String> = r.round_fps.iter().map(|f| format!("{f:.0}")).collect();
            println!(
                "{} {} B: rounds {} frames/s; switch ({} threads) {:.4} context switches per frame; frontend slept {} times (longest {:.1} ms), {:.4} kicks per frame",
                s.tag,
                r.size,
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
    for len in SIZES {
        let o = ours.rows.iter().find(|r| r.size == len).unwrap();
        let (dfps, dcpu) = match dpdk
            .as_ref()
            .and_then(|d| d.rows.iter().find(|r| r.size == len))
        {
            Some(d) => (
                format!("{:.0}", d.fps()),
                format!("{:.0}", d.cpu_per_frame()),
            ),
            None => ("NA".into(), "NA".into()),
        };
        println!(
            "fabric-bench size={len} ours_fps={:.0} dpdk_fps={dfps} ours_cpu_ns={:.0} dpdk_cpu_ns={dcpu}",
            o.fps(),
            o.cpu_per_frame()
        );
    }
}

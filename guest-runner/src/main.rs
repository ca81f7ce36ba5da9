//! `guest-runner`: `boot` (scripts/run-guests), `kernel-check PATH`, `soak` (scripts/soak.sh),
//! `matrix` (ci/matrix.sh) and the matrix's helpers, `demo` (scripts/demo.sh).

use clap::{Parser, Subcommand};
use guest_runner::{boot, kernel, options, soak};

/// The host side of vhost-rdma's guest tests.
#[derive(Parser)]
#[command(name = "guest-runner", version)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Boot N QEMU guests (vr-init protocol), each running one command, wired to vhost-user sockets
    /// (the vhost-rdma daemon), vfio-user sockets or QEMU's own `-netdev stream` link, and return
    /// the combined result.
    #[command(infer_long_args = true, after_help = BOOT_HELP)]
    Boot(Box<options::BootOptions>),
    /// Check a guest kernel image: print its version, or exit 2 with the reason it is unusable.
    /// Warns (stderr) for each required option not built in when its configuration is beside it
    /// (`config`, or the `.config` of the tree of TREE/arch/x86/boot/bzImage).
    KernelCheck {
        /// the bzImage
        path: String,
    },
    /// The soak (issue 8): one daemon, four Linux 7.3 guests, N minutes of verified SMC-R / rxe /
    /// siw transfers under 0.5 % drop + 1 % reorder on the RoCE path, the daemon's own memory
    /// judged against a post-warm-up baseline. Results (summary.md/.json/.svg, rss.csv, logs) in
    /// ci/results/soak-DATE/ unless --results. Exit 0 only if every transfer passed, the daemon
    /// stayed up and its own memory stayed within the tolerance.
    Soak(Box<soak::SoakOptions>),
    /// The guest test matrix (ci/matrix.sh): kernel x cells (guest-runner/src/cells.rs), two
    /// guests per cell through the vhost-rdma daemon. Ends with "N passed, M failed, K skipped"
    /// (tests); exit 1 if any failed. `--dry-run` lists the cells.
    #[command(
        after_help = "Results: ci/results/DATE/ (results.json, results.md, logs of failed cells)."
    )]
    Matrix(Box<guest_runner::matrix::MatrixOptions>),
    /// The demo (scripts/demo.sh): builds what it needs, starts the daemon (erdma, gVNIC, a
    /// virtual host) and two Linux 7.3 guests, and runs eight steps (iWARP and RoCE rping, SMC-R
    /// v2, ibv_rc_pingpong, TCP through the gVNIC with header split, the daemon's view, the
    /// capture through tshark), each judged from verified output, then a table of their times.
    /// Exit 0 when no step failed.
    Demo(Box<guest_runner::demo::DemoOptions>),
    /// Guest-to-guest TCP (iperf3, 1 and 4 streams) through the daemon and through QEMU's own
    /// `-netdev stream` link, as one table with the ratio; then the in-process fabric benchmark
    /// (scripts/bench-fabric.sh). Exit 0 when every path and the cargo bench passed.
    BenchFabric(Box<guest_runner::bench_fabric::BenchFabricOptions>),
    /// ib_write_bw, then an SMC-Rv2 stream, between two guests over emulated erdma functions
    /// versus over their own rxe, with guest and daemon CPU per GiB (ci/bench-erdma.sh). Exit 0
    /// when every transfer passed.
    BenchErdma(Box<guest_runner::bench_erdma::BenchErdmaOptions>),
    /// ib_write_bw from a guest over rxe to the other guest and to a virtual host, with the
    /// guests' CPU per GiB, after the in-process RC engine benchmark (ci/bench-vhost.sh). Exit 0
    /// when both runs and the host's session passed.
    BenchVhost(Box<guest_runner::bench_vhost::BenchVhostOptions>),
    /// TCP receive through the emulated gVNIC versus through virtio-net in the same guests, and
    /// devmem TCP versus ordinary receive, with the guests' and the daemon's CPU (ci/bench-gve.sh).
    /// Exit 0 when every transfer was validated.
    BenchGve(Box<guest_runner::bench_gve::BenchGveOptions>),
    /// SMC-R against TCP between two guests on the daemon (ci/bench-smc.sh): throughput, the
    /// tool's and the whole guest's CPU per GiB, per connection count; table in
    /// RESULTS/bench.md. Exit 0 when every stream passed.
    BenchSmc(Box<guest_runner::bench_smc::BenchSmcOptions>),
    /// Why a matrix cell's guest stopped making progress: its QEMU's CPU use and the daemon's
    /// counters of its ports over --window seconds, where its CPU is (RIP samples and a stack
    /// scan through its QEMU monitor, symbolized with its kallsyms); saves the checker's flows
    /// view as DIR/stuck-flows.json; prints one line.
    StuckDiagnosis(guest_runner::stuck::StuckOptions),
    /// The broker of the fault cells and the gve cell: answers the guests' `ctl` requests (DIR/NAME.job/ctl-req.N,
    /// one argument per line) by running `vhost-rdma ctl` against DIR/ctl.sock (device-fault,
    /// link, trace and status only), the answer in ctl-rep.N; until SIGTERM.
    CtlBroker(guest_runner::ctl_broker::BrokerOptions),
    /// The smcr-failover cell's host side: once the SMC-R stream runs, take the busier server port
    /// (a or a1) down, up again --up-after s later (or when stopped), and write the
    /// failover-evidence row (JSON) to --out.
    FailoverDriver(guest_runner::failover::FailoverOptions),
    /// The rss cell's host side: follows guest a's steps through files in its job dir, compares
    /// its view with `DAEMON ctl rss|flow-rule --json` and prints CHECK-OK / CHECK-FAIL lines.
    /// Exit status 0 only if every check passed and every step was seen.
    RssHost {
        /// the vhost-rdma binary
        daemon: std::path::PathBuf,
        /// the daemon's control socket
        ctl_sock: std::path::PathBuf,
        /// guest a's job dir
        job_a: std::path::PathBuf,
        /// guest b's job dir
        job_b: std::path::PathBuf,
        /// the test flows: {"key": K, "flows": [[PROTO, PORT]...], "move_sport": PORT}
        flows_json: std::path::PathBuf,
        /// seconds to wait for each step
        #[arg(long, default_value_t = 900)]
        step_timeout: u64,
    },
}

const BOOT_HELP: &str = "\
Guest protocol (scripts/guest/vr-init in the image):
  kernel cmdline  root=/dev/vda ro init=/sbin/vr-init console=ttyS0
                  vr.name=NAME vr.ip=ADDR/PREFIX [vr.ip1=...]
  9p tag `job`    (rw)  -> /job, the guest runs `sh /job/run.sh`, output also in /job/out.log
  9p tag `vrbin`  (ro)  -> /opt/vr (PATH has /opt/vr/bin)
  console lines   VR-BOOTED name=NAME ... VR-RESULT name=NAME rc=N, then poweroff -f

Examples:
  run-guests --image DIR --net stream \\
      --guest a,ip=10.77.0.1/24,cmd=a.sh --guest b,ip=10.77.0.2/24,cmd=b.sh
  run-guests --image DIR --net vhost-user --queues 2 \\
      --guest a,ip=10.77.0.1/24,sock=/tmp/a.sock,cmd=a.sh \\
      --guest b,ip=10.77.0.2/24,sock=/tmp/b.sock,cmd=b.sh

Exit status: 0 only if every guest reported rc=0; 1 if some guest failed;
2 on a usage or setup error; 130 when stopped by SIGINT, SIGTERM or SIGHUP.";

fn main() -> anyhow::Result<()> {
    let code = match Cli::parse().cmd {
        Cmd::Boot(o) => boot::run(*o),
        Cmd::Soak(o) => soak::run(*o),
        Cmd::StuckDiagnosis(o) => guest_runner::stuck::run(&o),
        Cmd::CtlBroker(o) => guest_runner::ctl_broker::run(&o),
        Cmd::FailoverDriver(o) => guest_runner::failover::run(&o),
        Cmd::Matrix(o) => guest_runner::matrix::run(*o),
        Cmd::BenchSmc(o) => guest_runner::bench_smc::run(*o),
        Cmd::Demo(o) => guest_runner::demo::run(*o),
        Cmd::BenchFabric(o) => guest_runner::bench_fabric::run(*o),
        Cmd::BenchErdma(o) => guest_runner::bench_erdma::run(*o),
        Cmd::BenchVhost(o) => guest_runner::bench_vhost::run(*o),
        Cmd::BenchGve(o) => guest_runner::bench_gve::run(*o),
        Cmd::RssHost {
            daemon,
            ctl_sock,
            job_a,
            job_b,
            flows_json,
            step_timeout,
        } => {
            let ok = guest_results::rss_host::run(guest_results::rss_host::Setup {
                daemon,
                ctl: ctl_sock,
                job_a,
                job_b,
                flows: flows_json,
                step_timeout: std::time::Duration::from_secs(step_timeout),
            });
            i32::from(!ok)
        }
        Cmd::KernelCheck { path } => match kernel::check_bzimage(&path) {
            Ok(v) => {
                println!("{v}");
                for w in kernel::warnings_for(&path) {
                    eprintln!("warning: {w}");
                }
                0
            }
            Err(e) => {
                eprintln!("error: {e}");
                2
            }
        },
    };
    std::process::exit(code);
}

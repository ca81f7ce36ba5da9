//! `guest-runner matrix` (ci/matrix.sh): the guest RDMA / SMC-R / NIC test
//! matrix. Cells ([`crate::cells`]) = guest kernel x {rxe, siw, smcr,
//! smc-noueid, lossy, erdma, gVNIC, upstream, fault} cells. Every cell
//! starts its own vhost-rdma daemon, boots two guests, A (server,
//! 10.77.0.1) and B (client, 10.77.0.2), and runs the cell's tests inside
//! them (guest side: ci/guest/ci-lib.sh); [`cell`] runs one, guest-results
//! judges the rows. Cells run one after the other (never more than two
//! guests at a time), except that `--jobs 2` runs the cells that mostly
//! wait for driver timeouts in a second matrix process beside them.
//!
//! A run writes results.json (one record per cell, read by `guest-results
//! report`), results.md, the logs of failed cells, and with `--junit` a
//! JUnit file; it ends with "N passed, M failed, K skipped" and exits 1
//! when a test failed.

pub mod cell;
pub mod select;
pub mod uplinks;
pub mod vxlan;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use guest_results::pyjson::Json;
use guest_results::report::{self, CellOrder};

use crate::boot::{check_signal, install_signal_handlers};
use crate::cells::{self, cell_order, Cell, TestRow, EXTRA_CELLS, KERNELS};
use crate::setup;
use select::{cell_key, select_cells, side_lane_args, KernelCell, Selection, WAITING_CELLS};

/// The matrix's options (`ci/matrix.sh --help`).
#[derive(clap::Args, Debug, Clone)]
pub struct MatrixOptions {
    /// guest kernel(s): 7.3, 6.12 or all; or the PATH of a bzImage to bring your own kernel
    /// (drivers built in; its version's series picks the cells' root disk: docs/guest-tests.md,
    /// "Bring your own kernel")
    #[arg(long, default_value = "all", value_name = "SERIES|PATH")]
    pub kernel: String,
    /// guest kernel command-line additions (run-guests --append)
    #[arg(long, default_value = "", value_name = "ARGS")]
    pub append: String,
    /// comma list of cells or KERNEL/CELL (default: all cells; `--dry-run` lists them)
    #[arg(long, default_value = "")]
    pub cells: String,
    /// CI tier (the README's test command runs it): 19 cells of 7.3, from
    /// the fabric forms to the upstream suites and the fault cells;
    /// `--quick --dry-run` lists them
    #[arg(long)]
    pub quick: bool,
    /// guest image dir for 7.3 (default: scripts/build-guest-image.sh)
    #[arg(long = "image-7.3")]
    pub image_7_3: Option<String>,
    /// guest image dir for 6.12 (default: scripts/build-guest-image.sh)
    #[arg(long = "image-6.12")]
    pub image_6_12: Option<String>,
    /// QEMU 11.1 (default: scripts/setup-qemu.sh)
    #[arg(long)]
    pub qemu: Option<String>,
    /// accelerator
    #[arg(long, default_value = "auto", value_parser = ["auto", "kvm", "tcg"])]
    pub accel: String,
    /// guest link: vhost-user = through the vhost-rdma daemon; stream = QEMU's own virtio-net +
    /// -netdev stream, no daemon (to check whether a failure involves the daemon)
    #[arg(long, default_value = "vhost-user", value_parser = ["vhost-user", "stream"])]
    pub net: String,
    /// do not run cargo build
    #[arg(long)]
    pub no_build: bool,
    /// cargo profile of the daemon and guest binaries
    #[arg(long, default_value = "release")]
    pub profile: String,
    /// per guest seconds, boot to result (default: per cell)
    #[arg(long, default_value_t = 0)]
    pub timeout: u32,
    /// results dir (default ci/results/DATE)
    #[arg(long)]
    pub results: Option<PathBuf>,
    /// keep the logs of passed cells too
    #[arg(long)]
    pub keep_logs: bool,
    /// list the cells and exit
    #[arg(long)]
    pub dry_run: bool,
    /// echo all guest output
    #[arg(long, short = 'v')]
    pub verbose: bool,
    /// smcr cell: bytes per connection and direction
    #[arg(long, default_value = "64M", value_parser = size_arg)]
    pub smc_bytes: String,
    /// smcr cell: bytes of the one-connection s2c stream (default 256M; 32M with --quick)
    #[arg(long, value_parser = size_arg)]
    pub smc_big_bytes: Option<String>,
    /// smcr cell: bytes per connection and direction of the 64-connection stream
    #[arg(long, default_value = "256K", value_parser = size_arg)]
    pub smc_many_bytes: String,
    /// perftest -n (500 x 64 KiB)
    #[arg(long, default_value_t = 500)]
    pub perftest_iters: u32,
    /// smc-guest-tests verbs --size: bytes per SEND/WRITE/READ (61441 = 15 pages + 1 byte)
    #[arg(long, default_value_t = 61441)]
    pub verbs_size: u32,
    /// smc-guest-tests verbs --iters
    #[arg(long, default_value_t = 8)]
    pub verbs_iters: u32,
    /// guest: seconds per RDMA tool run
    #[arg(long, default_value_t = 180)]
    pub tool_timeout: u32,
    /// siw: ib_read_bw -o N (0 = perftest's default 128, which fails, see ci/README.md)
    #[arg(long, default_value_t = 16)]
    pub siw_read_outs: u32,
    /// siw cell: kprobes on siw connection management + tcp reset/retransmit tracepoints in the
    /// guests, failures echoed in the console (CI-DIAG), full trace in /job/siw-trace.ROLE.log
    #[arg(long, default_value = "1", value_parser = ["0", "1"])]
    pub siw_trace: String,
    /// do not capture the fabric in the rxe/siw/smcr cells (their tshark test is then SKIPPED)
    #[arg(long = "no-capture", action = clap::ArgAction::SetFalse)]
    pub capture: bool,
    /// capture truncation length (0 = whole frames: truncated FPDUs and LLC messages can make
    /// tshark report frames as malformed)
    #[arg(long, default_value_t = 0)]
    pub capture_snaplen: u32,
    /// stop a cell's capture after this many records
    #[arg(long, default_value_t = 100_000)]
    pub capture_max_records: u64,
    /// rerun a cell at most N times when every failure is a recognised flake: a guest-kernel
    /// siw race (siw cells) or perftest failing to calibrate its clock on a loaded host (0 =
    /// never); earlier attempts are reported
    #[arg(long, default_value_t = 2)]
    pub siw_reruns: usize,
    /// siw cells: the daemon holds TCP data behind an MPA Reply this long (`mpa-settle` fault
    /// action), a workaround for the guest kernel's siw connection-setup races (default 300;
    /// 0 = off, to see the races; the siw-conn cell runs without it unless this is given)
    #[arg(long)]
    pub siw_settle_ms: Option<u64>,
    /// siw-conn cell: rounds
    #[arg(long, default_value_t = 5)]
    pub siw_conn_rounds: u32,
    /// siw: also run ibv_rc_pingpong (expected to fail) as evidence for its SKIP
    #[arg(long)]
    pub try_unsupported: bool,
    /// run only the cells whose index in the selection's stable order is I-1 modulo N (shards
    /// 1/N .. N/N together run every cell once; merge them with --combine)
    #[arg(long, value_name = "I/N")]
    pub shard: Option<String>,
    /// write one Markdown table (--combine-out) from these runs' results.json (e.g. the shards
    /// of one run) and exit; its tables are those one run of all the cells gives
    #[arg(long, num_args = 1.., value_name = "RESULTS_DIR")]
    pub combine: Vec<PathBuf>,
    /// where --combine writes (default ci/RESULTS.md)
    #[arg(long)]
    pub combine_out: Option<PathBuf>,
    /// also write the results as JUnit XML (one case per test)
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// 2: the cells that mostly wait for driver timeouts (gve-faults, erdma-faults) run beside
    /// the others, in a second matrix process (1: one cell at a time)
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=2))]
    pub jobs: u8,
}

fn size_arg(s: &str) -> Result<String, String> {
    let digits = s.trim_end_matches(['K', 'M', 'G', 'k', 'm', 'g']);
    let one_suffix = s.len() - digits.len() <= 1;
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) && one_suffix {
        Ok(s.into())
    } else {
        Err("a number with an optional K/M/G suffix".into())
    }
}

/// What every cell of a run shares.
#[derive(Clone)]
pub struct Run {
    /// The options.
    pub o: MatrixOptions,
    /// The checkout.
    pub root: PathBuf,
    /// The results dir.
    pub resdir: PathBuf,
    /// The cell table (siw-conn's rows from `--siw-conn-rounds`).
    pub cells: BTreeMap<String, Cell>,
    /// The guests' `CI_*` variables from the options.
    pub job_env: Vec<(String, String)>,
    /// The vhost-rdma binary.
    pub daemon_bin: PathBuf,
    /// What the guests see in /opt/vr.
    pub vrbin: PathBuf,
    /// QEMU.
    pub qemu: String,
    /// The guest image dir of the kernel being run.
    pub image: String,
    /// A bring-your-own kernel (`--kernel PATH`).
    pub kernel_image: Option<String>,
    /// Its version string.
    pub kernel_version: Option<String>,
}

/// `[matrix] MSG` on stderr.
pub fn say(msg: impl std::fmt::Display) {
    eprintln!("[matrix] {msg}");
}

/// A JSON string.
pub fn s(v: &str) -> Json {
    Json::Str(v.into())
}

/// A JSON object, keys in the given order.
pub fn obj(kv: Vec<(&str, Json)>) -> Json {
    Json::Object(kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}

/// A FAIL record for a cell that did not run.
fn failed_record(kernel: &str, name: &str, cell: &Cell, why: &str) -> Json {
    println!("FAIL {kernel}/{name}: {why}");
    obj(vec![
        ("kernel", s(kernel)),
        ("cell", s(name)),
        ("what", s(&cell.what)),
        ("status", s("FAIL")),
        ("wall_s", Json::Int(0)),
        ("boot_s", Json::Object(vec![])),
        ("guest_kernel", Json::Object(vec![])),
        ("problems", Json::Array(vec![s(why)])),
        ("logs", Json::Null),
        ("tests", Json::Array(cell::fail_rows(cell, why))),
    ])
}

/// The cell table with siw-conn's rows for `rounds` rounds.
fn cell_table(rounds: u32) -> BTreeMap<String, Cell> {
    let mut m = cells::cells();
    if let Some(c) = m.get_mut("siw-conn") {
        let both = cells::BOTH.to_vec();
        c.tests = vec![TestRow("link-add-siw".into(), both.clone())];
        for r in 1..=rounds {
            for t in ["ucmatose", "ib_read_bw"] {
                c.tests.push(TestRow(format!("{t}-{r}"), both.clone()));
            }
        }
    }
    m
}

/// --kernel is a series (7.3, 6.12, all) or a bring-your-own bzImage PATH:
/// for a path, `(path, version, series)` once the image is checked and its
/// series is one the matrix knows.
fn resolve_kernel(arg: &str) -> Result<Option<(String, String, String)>, String> {
    if KERNELS.contains(&arg) || arg == "all" {
        return Ok(None);
    }
    if !arg.contains('/') && !Path::new(arg).exists() {
        return Err(format!(
            "--kernel {arg:?}: a kernel series ({}, all) or the path of a bzImage (bring your own kernel)",
            KERNELS.join(", ")
        ));
    }
    let version = crate::kernel::check_bzimage(arg).map_err(|e| format!("--kernel: {e}"))?;
    let series: String = {
        let mut parts = version.split('.');
        match (parts.next(), parts.next()) {
            (Some(a), Some(b)) => {
                let minor: String = b.chars().take_while(char::is_ascii_digit).collect();
                format!("{a}.{minor}")
            }
            _ => String::new(),
        }
    };
    if !KERNELS.contains(&series.as_str()) {
        return Err(format!(
            "--kernel {arg}: Linux {version} is of series {series}; the matrix's cells know {} \
             (the series picks the root disk and the expectations)",
            KERNELS.join(", ")
        ));
    }
    let abs = crate::paths::abspath(arg);
    Ok(Some((abs, version, series)))
}

/// Runs the matrix; the exit status (0 all passed, 1 a test failed, 2 a
/// usage error).
pub fn run(mut o: MatrixOptions) -> i32 {
    install_signal_handlers();
    let root = setup::repo_root();
    if !o.combine.is_empty() {
        let out = o
            .combine_out
            .clone()
            .unwrap_or_else(|| root.join("ci/RESULTS.md"));
        return combine_runs(&o.combine, &out);
    }
    let smc_big = o
        .smc_big_bytes
        .clone()
        .unwrap_or_else(|| if o.quick { "32M" } else { "256M" }.into());
    o.smc_big_bytes = Some(smc_big.clone());
    let try_unsupported =
        o.try_unsupported || std::env::var_os("CI_TRY_UNSUPPORTED").is_some_and(|v| !v.is_empty());
    let job_env: Vec<(String, String)> = [
        ("CI_SMC_BYTES", o.smc_bytes.clone()),
        ("CI_SMC_BIG_BYTES", smc_big.clone()),
        ("CI_SMC_MANY_BYTES", o.smc_many_bytes.clone()),
        ("CI_PERFTEST_ITERS", o.perftest_iters.to_string()),
        ("CI_VERBS_SIZE", o.verbs_size.to_string()),
        ("CI_VERBS_ITERS", o.verbs_iters.to_string()),
        ("CI_TOOL_TIMEOUT", o.tool_timeout.to_string()),
        ("CI_SIW_READ_OUTS", o.siw_read_outs.to_string()),
        ("CI_SIW_TRACE", o.siw_trace.clone()),
        ("CI_SIW_CONN_ROUNDS", o.siw_conn_rounds.to_string()),
        (
            "CI_TRY_UNSUPPORTED",
            if try_unsupported { "1" } else { "" }.into(),
        ),
        // upstream-nic: only these files (e.g. "gro.py hw/gro_hw.py"), for a quick check
        (
            "CI_NIC_FILES",
            std::env::var("CI_NIC_FILES").unwrap_or_default(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let table = cell_table(o.siw_conn_rounds);
    let byo = match resolve_kernel(&o.kernel) {
        Ok(b) => b,
        Err(e) => return usage(&e.to_string()),
    };
    if let Some((_, _, series)) = &byo {
        o.kernel = series.clone();
    }
    let known: Vec<&str> = table.keys().map(String::as_str).collect();
    let sel = select_cells(
        &Selection {
            quick: o.quick,
            kernel: &o.kernel,
            cells: &o.cells,
            byo_kernel: byo.as_ref().map(|(_, _, s)| s.as_str()),
            shard: o.shard.as_deref(),
        },
        &known,
    );
    let sel = match sel {
        Ok(s) => s,
        Err(e) => return usage(&e),
    };
    if let Some((path, version, _)) = &byo {
        say(format!("guest kernel (--kernel): {path}, Linux {version}"));
    }
    if o.dry_run {
        for (k, c) in &sel {
            println!("{k}/{c}: {}", table[c].what);
        }
        return 0;
    }
    let date = setup::date_stamp();
    let resdir = o
        .results
        .clone()
        .map(|p| PathBuf::from(crate::paths::abspath(&p.display().to_string())))
        .unwrap_or_else(|| root.join("ci/results").join(&date));
    let _ = std::fs::create_dir_all(resdir.join("logs"));
    let work = match crate::paths::mkdtemp("vr-matrix.") {
        Ok(w) => PathBuf::from(w),
        Err(e) => return usage(&format!("cannot make a work dir: {e}")),
    };
    say(format!(
        "results: {}; work dir: {}",
        resdir.display(),
        work.display()
    ));
    let names: Vec<String> = sel.iter().map(|(k, c)| format!("{k}/{c}")).collect();
    say(format!("cells: {}", names.join(" ")));

    let tdir = setup::target_dir(&root, &o.profile);
    let daemon_bin = tdir.join("vhost-rdma");
    let mut run = Run {
        o: o.clone(),
        root: root.clone(),
        resdir: resdir.clone(),
        cells: table,
        job_env,
        daemon_bin,
        vrbin: work.join("vrbin"),
        qemu: String::new(),
        image: String::new(),
        kernel_image: byo.as_ref().map(|(p, _, _)| p.clone()),
        kernel_version: byo.as_ref().map(|(_, v, _)| v.clone()),
    };
    let mut results: Vec<Json> = Vec::new();
    match prepare(&mut run, &sel, &work) {
        Err(why) => {
            for (k, c) in &sel {
                results.push(failed_record(k, c, &run.cells[c], &why.to_string()));
            }
        }
        Ok(()) => results = run_kernels(&mut run, &sel, &work),
    }
    finish(&run, &date, results, &work)
}

fn usage(e: &str) -> i32 {
    eprintln!("ci/matrix.sh: error: {e}");
    2
}

/// Builds the binaries, finds QEMU and fills the guests' /opt/vr; why it
/// could not.
pub fn prepare(run: &mut Run, sel: &[KernelCell], work: &Path) -> anyhow::Result<()> {
    let o = &run.o;
    let tdir = setup::target_dir(&run.root, &o.profile);
    if !o.no_build {
        say(format!(
            "cargo build --profile {} -p vhost-rdma -p smc-guest-tests",
            o.profile
        ));
        let log = work.join("build.log");
        if !setup::build_binaries(&run.root, &o.profile, Some(&log)) {
            let _ = std::fs::copy(&log, run.resdir.join("logs/build.log"));
            anyhow::bail!("cargo build failed (logs/build.log)");
        }
    }
    let sgt = tdir.join("smc-guest-tests");
    for b in [&run.daemon_bin, &sgt] {
        if crate::paths::which(&b.display().to_string()).is_none() {
            return Err(anyhow::anyhow!("missing binary {}", b.display()));
        }
    }
    run.qemu = match &o.qemu {
        Some(q) => q.clone(),
        None => {
            say("QEMU 11.1: scripts/setup-qemu.sh");
            setup::last_line(
                &mut Command::new(run.root.join("scripts/setup-qemu.sh")),
                &work.join("qemu.log"),
            )
            .filter(|q| crate::paths::which(q).is_some())
            .ok_or_else(|| anyhow::anyhow!("scripts/setup-qemu.sh failed"))?
        }
    };
    let vr = &run.vrbin;
    for d in ["bin", "ci"] {
        std::fs::create_dir_all(vr.join(d))?;
    }
    setup::copy(&sgt, &vr.join("bin/smc-guest-tests"))?;
    for f in ["ci-lib.sh", "bench.sh"] {
        setup::copy(&run.root.join("ci/guest").join(f), &vr.join("ci").join(f))?;
    }
    setup::copy(
        &run.root.join("scripts/guest/rdma-lib.sh"),
        &vr.join("ci/rdma-lib.sh"),
    )?;
    setup::copy_tree(&run.root.join("ci/guest/repro"), &vr.join("ci/repro"))?;
    // tools built from the guest kernel's own source: its devmem TCP tool
    // and its NIC selftests
    let wanted = |f: &dyn Fn(&Cell) -> bool| sel.iter().any(|(_, c)| f(&run.cells[c]));
    if wanted(&|c| c.readme_gve) {
        if let Some(dir) = provision(
            run,
            work,
            "build-ncdevmem.sh",
            "the gve cell's devmem rows will fail",
        ) {
            setup::copy(&dir.join("ncdevmem"), &vr.join("bin/ncdevmem"))?;
        }
    }
    if wanted(&|c| c.upstream == Some(cells::Upstream::Nic)) {
        let why = "the upstream-nic cells will report no results";
        if let Some(dir) = provision(run, work, "build-nic-selftests.sh", why) {
            setup::copy_tree(&dir.join("src"), &vr.join("nic-selftests"))?;
        }
    }
    Ok(())
}

/// Runs `scripts/SCRIPT` (its log in the work dir): the directory it
/// prints last, or `None` after saying that it failed and what that means.
fn provision(run: &Run, work: &Path, script: &str, consequence: &str) -> Option<PathBuf> {
    let log = work.join(script.replace(".sh", ".log"));
    let dir = setup::last_line(
        &mut Command::new(run.root.join("scripts").join(script)),
        &log,
    );
    if dir.is_none() {
        say(format!("scripts/{script} failed: {consequence}"));
    }
    dir.map(PathBuf::from)
}

/// Runs the selected cells kernel by kernel (the side lane beside them with
/// `--jobs 2`); their records in the run's order.
fn run_kernels(run: &mut Run, sel: &[KernelCell], work: &Path) -> Vec<Json> {
    let mut results = Vec::new();
    let mut side: Option<SideLane> = None;
    let mut interrupted = false;
    for k in KERNELS {
        let mut kc: Vec<KernelCell> = sel.iter().filter(|(x, _)| x == k).cloned().collect();
        if kc.is_empty() {
            continue;
        }
        let given = if k == "7.3" {
            &run.o.image_7_3
        } else {
            &run.o.image_6_12
        };
        let img = given.clone().or_else(|| {
            say(format!(
                "guest image {k}: scripts/build-guest-image.sh --kernel {k} (a first build compiles the kernel: ~6 min on 2 cores)"
            ));
            setup::last_line(
                Command::new(run.root.join("scripts/build-guest-image.sh")).args(["--kernel", k]),
                &work.join(format!("image-{k}.log")),
            )
        });
        let Some(img) = img.filter(|i| {
            Path::new(i).join("bzImage").is_file() && Path::new(i).join("rootfs.ext4").is_file()
        }) else {
            for (k, c) in &kc {
                results.push(failed_record(
                    k,
                    c,
                    &run.cells[c],
                    &format!("no guest image for kernel {k}"),
                ));
            }
            continue;
        };
        say(format!("image {k}: {img}"));
        run.image = img.clone();
        let waiting: Vec<KernelCell> = kc
            .iter()
            .filter(|(_, c)| WAITING_CELLS.contains(&c.as_str()))
            .cloned()
            .collect();
        if run.o.jobs > 1 && side.is_none() && !waiting.is_empty() && waiting.len() < kc.len() {
            side = SideLane::start(run, &waiting, &[(k.to_string(), img)]);
            if side.is_some() {
                kc.retain(|x| !waiting.contains(x));
            }
        }
        for (k, c) in &kc {
            let res = if check_signal().is_err() {
                Err(cell::Interrupted)
            } else {
                cell::run_cell_with_reruns(run, k, c, work)
            };
            match res {
                Ok(r) => results.push(r),
                Err(cell::Interrupted) => {
                    interrupted = true;
                    results.push(failed_record(k, c, &run.cells[c], "interrupted"));
                    break;
                }
            }
        }
        if interrupted {
            break;
        }
    }
    if let Some(side) = side {
        if interrupted {
            side.stop();
        }
        say("waiting for the side lane");
        results.extend(side.results(run));
        results
            .sort_by_key(|r| cell_key(&(r.at("kernel").str().into(), r.at("cell").str().into())));
    }
    results
}

/// `--jobs 2`: the waiting cells in a second matrix process beside this
/// one; its lines are echoed with a "[side]" prefix and its cells' records
/// merged.
struct SideLane {
    cells: Vec<KernelCell>,
    dir: PathBuf,
    child: std::process::Child,
    echo: Vec<std::thread::JoinHandle<()>>,
}

impl SideLane {
    fn start(run: &Run, cells: &[KernelCell], images: &[(String, String)]) -> Option<SideLane> {
        use std::os::unix::process::CommandExt;
        let dir = run.resdir.join("side-lane");
        let argv: Vec<String> = std::env::args().skip(2).collect();
        let smc_big = run.o.smc_big_bytes.clone().unwrap_or_default();
        let args = side_lane_args(
            &argv,
            cells,
            &dir.display().to_string(),
            &run.qemu,
            images,
            &smc_big,
        );
        let names: Vec<String> = cells.iter().map(|(k, c)| format!("{k}/{c}")).collect();
        say(format!(
            "beside the other cells (--jobs 2): {}",
            names.join(" ")
        ));
        let me = std::env::current_exe().ok()?;
        let mut child = Command::new(me)
            .arg("matrix")
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .map_err(|e| say(format!("cannot start the side lane: {e}")))
            .ok()?;
        let mut echo = Vec::new();
        if let Some(out) = child.stdout.take() {
            echo.push(std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    println!("[side] {line}");
                }
            }));
        }
        if let Some(err) = child.stderr.take() {
            echo.push(std::thread::spawn(move || {
                for line in BufReader::new(err).lines().map_while(Result::ok) {
                    println!("[side] {line}");
                }
            }));
        }
        Some(SideLane {
            cells: cells.to_vec(),
            dir,
            child,
            echo,
        })
    }

    fn stop(&self) {
        // SAFETY: a plain killpg(2) of the lane's own process group.
        unsafe {
            libc::killpg(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
    }

    /// Waits for the lane; its cells' records (a FAIL record per cell it
    /// did not report).
    fn results(mut self, run: &Run) -> Vec<Json> {
        let code = loop {
            match self.child.try_wait() {
                Ok(Some(st)) => break st.code().unwrap_or(-1),
                Ok(None) => {
                    if check_signal().is_err() {
                        self.stop();
                    }
                    std::thread::sleep(std::time::Duration::from_millis(200));
                }
                Err(_) => break -1,
            }
        };
        for t in self.echo.drain(..) {
            let _ = t.join();
        }
        let got: Vec<Json> = std::fs::read_to_string(self.dir.join("results.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<Json>(&t).ok())
            .map(|j| j.at("cells").items().to_vec())
            .unwrap_or_default();
        self.cells
            .iter()
            .map(|(k, c)| {
                let rec = got
                    .iter()
                    .find(|r| r.at("kernel").str() == k && r.at("cell").str() == c);
                match rec {
                    None => {
                        let why = format!(
                            "the side lane (--jobs 2) exited {code} without a result for it"
                        );
                        failed_record(k, c, &run.cells[c], &why)
                    }
                    Some(r) => match r.get("logs").map(Json::str).filter(|l| !l.is_empty()) {
                        Some(l) => cell::with_key(r.clone(), "logs", s(&format!("side-lane/{l}"))),
                        None => r.clone(),
                    },
                }
            })
            .collect()
    }
}

/// Writes results.json, results.md and the JUnit file, prints the summary;
/// the exit status.
fn finish(run: &Run, date: &str, results: Vec<Json>, work: &Path) -> i32 {
    let (pass, fail, skip) = report::count_tests(&results);
    let mut summary = format!("{pass} passed, {fail} failed, {skip} skipped");
    let reruns: usize = results.iter().map(|r| r.at("reruns").items().len()).sum();
    if reruns > 0 {
        summary += &format!(" ({reruns} cell rerun(s) after a known flake, listed in results.md)");
    }
    let cells_failed: Vec<String> = results
        .iter()
        .filter(|r| r.at("status").str() == "FAIL")
        .map(|r| format!("{}/{}", r.at("kernel").str(), r.at("cell").str()))
        .collect();
    let commit = Command::new("git")
        .arg("-C")
        .arg(&run.root)
        .args(["describe", "--always", "--dirty"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|_| "?".into());
    let qv = if run.qemu.is_empty() {
        String::new()
    } else {
        crate::qemu::qemu_version(&run.qemu)
            .map(|(_, line)| line)
            .unwrap_or_default()
    };
    let accel = results
        .iter()
        .find_map(|r| r.get("accel").filter(|a| a.truthy()).cloned())
        .unwrap_or_else(|| s(&run.o.accel));
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let argv: Vec<String> = std::env::args().skip(2).collect();
    let opt = |v: &Option<String>| v.as_deref().map_or(Json::Null, s);
    let meta = obj(vec![
        ("date", s(date)),
        ("host", s(host.trim())),
        ("commit", s(&commit)),
        ("qemu_version", s(&qv)),
        ("accel", accel),
        (
            "command",
            s(&std::iter::once("ci/matrix.sh".to_string())
                .chain(argv)
                .collect::<Vec<_>>()
                .join(" ")),
        ),
        ("summary", s(&summary)),
        ("kernel_image", opt(&run.kernel_image)),
        ("kernel_version", opt(&run.kernel_version)),
        (
            "cells_failed",
            Json::Array(cells_failed.iter().map(|c| s(c)).collect()),
        ),
    ]);
    let doc = obj(vec![
        ("meta", meta.clone()),
        ("cells", Json::Array(results.clone())),
    ]);
    let rj = run.resdir.join("results.json");
    if let Err(e) = serde_json::to_string_pretty(&doc)
        .map_err(|e| e.to_string())
        .and_then(|t| std::fs::write(&rj, t).map_err(|e| e.to_string()))
    {
        say(format!("writing {}: {e}", rj.display()));
    }
    let md = run.resdir.join("results.md");
    if let Err(e) = std::fs::write(&md, report::markdown(&results, &meta)) {
        say(format!("writing {}: {e}", md.display()));
    }
    if let Some(path) = &run.o.junit {
        write_junit(&rj, path);
    }
    let _ = std::fs::remove_dir_all(work);
    println!("\n== matrix summary");
    for r in &results {
        let (pass, fail, skip) = report::count_tests(std::slice::from_ref(r));
        println!(
            "{} {}/{}: {pass}/{fail}/{skip} pass/fail/skip, wall {}s",
            r.at("status").str(),
            r.at("kernel").str(),
            r.at("cell").str(),
            r.at("wall_s")
        );
    }
    println!("results: {}", md.display());
    if !cells_failed.is_empty() {
        println!(
            "logs of failed cells: {}",
            run.resdir.join("logs").display()
        );
    }
    println!("{summary}");
    i32::from(fail > 0)
}

/// `--junit`: one testsuite per cell (matrix.KERNEL/CELL), one testcase per
/// test, from the run's results.json.
fn write_junit(results_json: &Path, path: &Path) {
    use guest_results::junit;
    let cells: Vec<serde_json::Value> = std::fs::read_to_string(results_json)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v.get("cells").and_then(|c| c.as_array()).cloned())
        .unwrap_or_default();
    let cases = junit::matrix_cases(&cells);
    let (root, n) = junit::document(&cases, "ci/matrix.sh", Vec::new());
    match std::fs::write(path, root.to_document()) {
        Ok(()) => say(format!(
            "junit: {}: {} cases ({} passed, {} failed, {} skipped)",
            path.display(),
            n.total(),
            n.passed,
            n.failed,
            n.skipped
        )),
        Err(e) => say(format!("junit: writing {} failed: {e}", path.display())),
    }
}

/// `--combine`: one table from several runs' results.json (a later run's
/// cell replaces an earlier run's same kernel/cell), e.g. the shards of one
/// run; the Cells and Tests tables are the ones a single run of all those
/// cells gives, and a "Source runs" section names every run and the cells
/// taken from it. Exit 1 when a test failed.
fn combine_runs(paths: &[PathBuf], out: &Path) -> i32 {
    let runs = match paths
        .iter()
        .map(|p| report::load_run(p))
        .collect::<Result<Vec<_>, _>>()
    {
        Ok(r) => r,
        Err(e) => return usage(&e.to_string()),
    };
    let order = CellOrder {
        kernels: KERNELS.iter().map(|k| k.to_string()).collect(),
        cells: cell_order()
            .into_iter()
            .chain(EXTRA_CELLS)
            .map(String::from)
            .collect(),
    };
    let date = crate::paths::local_time();
    let date = date.rsplit_once(':').map_or(date.as_str(), |(hm, _)| hm);
    let c = report::combine(&runs, &order, date);
    println!("{}", c.summary);
    if let Err(e) = std::fs::write(out, &c.markdown) {
        return usage(&format!("writing {}: {e}", out.display()));
    }
    i32::from(c.failed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cells::Role;

    /// siw-conn's rows follow --siw-conn-rounds.
    #[test]
    fn siw_conn_has_a_row_pair_per_round() {
        let t = cell_table(2);
        let names: Vec<&str> = t["siw-conn"].test_names().collect();
        assert_eq!(
            names,
            [
                "link-add-siw",
                "ucmatose-1",
                "ib_read_bw-1",
                "ucmatose-2",
                "ib_read_bw-2"
            ]
        );
        assert_eq!(t["siw-conn"].tests[1].1, [Role::Server, Role::Client]);
    }

    #[test]
    fn sizes_take_one_suffix() {
        for ok in ["64M", "256K", "1G", "12345"] {
            assert!(size_arg(ok).is_ok(), "{ok}");
        }
        for bad in ["", "M", "64MB", "6.4M", "-1"] {
            assert!(size_arg(bad).is_err(), "{bad}");
        }
    }

    /// A bzImage's version picks the series; another series' cells, a
    /// series the matrix does not know, or a file that is no bzImage are
    /// refused with the reason.
    #[test]
    fn a_bring_your_own_kernel_picks_its_series() {
        let dir = crate::paths::tests::TempDir::new();
        let img = dir.path("bzImage");
        crate::kernel::tests::fake_bzimage(Path::new(&img), "7.3.9-mydriver (dev@box) #3");
        let (path, version, series) = resolve_kernel(&img).unwrap().unwrap();
        assert_eq!((path.as_str(), series.as_str()), (img.as_str(), "7.3"));
        assert!(version.starts_with("7.3.9-mydriver"), "{version}");
        let table = cells::cells();
        let known: Vec<&str> = table.keys().map(String::as_str).collect();
        let sel = |cells: &str| {
            let s = Selection {
                quick: false,
                kernel: "7.3",
                cells,
                byo_kernel: Some("7.3"),
                shard: None,
            };
            select_cells(&s, &known)
        };
        assert_eq!(sel("rxe,smcr").unwrap().len(), 2);
        let e = sel("6.12/rxe").unwrap_err();
        assert!(e.contains("is a 7.3 kernel; it cannot run 6.12/rxe"), "{e}");
        let old = dir.path("bz5");
        crate::kernel::tests::fake_bzimage(Path::new(&old), "5.10.0 #1");
        assert!(resolve_kernel(&old).unwrap_err().contains("series 5.10"));
        let text = dir.path("notes.txt");
        std::fs::write(&text, "not a kernel\n".repeat(100)).unwrap();
        let e = resolve_kernel(&text).unwrap_err();
        assert!(e.contains("is not a bzImage"), "{e}");
    }

    /// A series passes as it is; what is neither a series nor a path is
    /// refused with the choices; a file that is not a kernel is refused.
    #[test]
    fn kernel_is_a_series_or_an_image() {
        assert_eq!(resolve_kernel("7.3"), Ok(None));
        assert_eq!(resolve_kernel("all"), Ok(None));
        let e = resolve_kernel("5.4").unwrap_err();
        assert!(e.contains("a kernel series (7.3, 6.12, all)"), "{e}");
        let e = resolve_kernel("/nonexistent/bzImage").unwrap_err();
        assert!(e.starts_with("--kernel: "), "{e}");
    }
}

//! What the guest benches share (`bench-smc`, `bench-erdma`, `bench-vhost`,
//! `bench-gve`, `bench-fabric`): their options, their cells run through the
//! matrix's machinery (`matrix::prepare`, `run_cell`, with the matrix's
//! options built as if given on its command line), the guests' `CI-BENCH`
//! rows and the table each publishes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::Parser;

use crate::cells::{Cell, KERNELS};
use crate::matrix::{self, MatrixOptions, Run};
use crate::setup::{self, GuestSetup};

/// The options every guest bench takes.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// guest kernel series
    #[arg(long, default_value = "7.3", value_parser = KERNELS)]
    pub kernel: String,
    /// image, QEMU, accelerator, build
    #[command(flatten)]
    pub setup: GuestSetup,
    /// cargo profile
    #[arg(long, default_value = "release")]
    pub profile: String,
    /// per guest seconds, boot to result (default: the bench's own)
    #[arg(long)]
    pub timeout: Option<u32>,
    /// results dir (default ci/results/BENCH-DATE)
    #[arg(long)]
    pub results: Option<PathBuf>,
    /// echo all guest output
    #[arg(long, short = 'v')]
    pub verbose: bool,
}

/// The matrix's options as if given on its command line.
#[derive(Parser)]
struct AsMatrix {
    #[command(flatten)]
    o: MatrixOptions,
}

/// A run of `cells` for bench `tool` (its results and work dirs are named
/// after it), built, provisioned and with its guest image: the run and its
/// work dir (the caller removes it). Logs are kept in the results dir's
/// `logs/KERNEL-CELL/`.
pub fn prepare(
    tool: &str,
    a: &BenchArgs,
    timeout: u32,
    cells: BTreeMap<String, Cell>,
    job_env: Vec<(String, String)>,
) -> anyhow::Result<(Run, PathBuf)> {
    let root = setup::repo_root();
    let resdir = a
        .results
        .as_ref()
        .map(|p| PathBuf::from(crate::paths::abspath(&p.display().to_string())))
        .unwrap_or_else(|| {
            root.join("ci/results")
                .join(format!("{tool}-{}", setup::date_stamp()))
        });
    let _ = std::fs::create_dir_all(&resdir);
    let work = crate::paths::mkdtemp(&format!("vr-{tool}."))
        .map(PathBuf::from)
        .map_err(|e| anyhow::anyhow!("cannot make a work dir: {e}"))?;
    let timeout = a.timeout.unwrap_or(timeout);
    let mut args = vec![tool.to_string(), "--keep-logs".into()];
    args.extend(["--accel".into(), a.setup.accel.clone()]);
    args.extend(["--timeout".into(), timeout.to_string()]);
    args.extend(["--profile".into(), a.profile.clone()]);
    if a.setup.no_build {
        args.push("--no-build".into());
    }
    if a.verbose {
        args.push("--verbose".into());
    }
    if let Some(q) = &a.setup.qemu {
        args.extend(["--qemu".into(), q.clone()]);
    }
    let sel: Vec<(String, String)> = cells
        .keys()
        .map(|c| (a.kernel.clone(), c.clone()))
        .collect();
    let mut run = Run {
        o: AsMatrix::parse_from(args).o,
        root: root.clone(),
        resdir,
        cells,
        job_env,
        daemon_bin: setup::target_dir(&root, &a.profile).join("vhost-rdma"),
        vrbin: work.join("vrbin"),
        qemu: String::new(),
        image: String::new(),
        kernel_image: None,
        kernel_version: None,
    };
    matrix::prepare(&mut run, &sel, &work)?;
    let image = a.setup.image.clone().or_else(|| {
        setup::last_line(
            std::process::Command::new(root.join("scripts/build-guest-image.sh"))
                .args(["--kernel", &a.kernel]),
            &work.join("image.log"),
        )
    });
    run.image = image
        .filter(|i| Path::new(i).join("bzImage").is_file())
        .ok_or_else(|| anyhow::anyhow!("no guest image for kernel {}", a.kernel))?;
    Ok((run, work))
}

/// One `CI-BENCH key=value ...` line of a guest.
pub type BenchRow = BTreeMap<String, String>;

/// One guest's `CI-BENCH` lines as key/value maps (a later key of a line
/// replaces an earlier one).
pub fn parse_bench(text: &str) -> Vec<BenchRow> {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("CI-BENCH "))
        .map(|rest| {
            rest.split_whitespace()
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
        .collect()
}

/// Both guests' `CI-BENCH` rows of a kept cell's logs.
pub fn guest_rows(logs: &Path) -> Vec<BenchRow> {
    ["a", "b"]
        .iter()
        .flat_map(|g| {
            let text = std::fs::read(logs.join(format!("{g}.job/out.log"))).unwrap_or_default();
            parse_bench(&String::from_utf8_lossy(&text))
        })
        .collect()
}

/// The bench's table: RESULTS/bench.md, stdout, and a chart beside it
/// (bench.svg; a failed plot never fails the bench).
pub fn publish(run: &Run, text: &str, title: &str) {
    let md = run.resdir.join("bench.md");
    let _ = std::fs::write(&md, format!("{text}\n"));
    println!("\n{text}\n");
    let _ = std::process::Command::new(run.root.join("scripts/guest-results"))
        .arg("plot")
        .arg(&md)
        .arg(run.resdir.join("bench.svg"))
        .args(["--title", title])
        .status();
}

/// A bench's setup error (exit 2).
pub fn fail(script: &str, why: impl std::fmt::Display) -> i32 {
    eprintln!("{script}: error: {why}");
    2
}

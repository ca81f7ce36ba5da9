//! What the guest benches share (`bench-smc`, `bench-fabric`): their cells
//! run through the matrix's machinery (`matrix::prepare`, `run_cell`), with
//! the matrix's options built as if given on its command line.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::Parser;

use crate::cells::Cell;
use crate::matrix::{self, MatrixOptions, Run};
use crate::setup::{self, GuestSetup};

/// How a bench boots its guests.
pub struct BenchSetup<'a> {
    /// The bench's name (`bench-smc`): its results dir and work dir.
    pub tool: &'a str,
    /// The guest kernel series.
    pub kernel: &'a str,
    /// Image, QEMU, accelerator, build.
    pub setup: &'a GuestSetup,
    /// The cargo profile.
    pub profile: &'a str,
    /// Seconds per guest, boot to result.
    pub timeout: u32,
    /// Echo all guest output.
    pub verbose: bool,
    /// The results dir (default ci/results/TOOL-DATE).
    pub results: Option<&'a Path>,
}

/// The matrix's options as if given on its command line.
#[derive(Parser)]
struct AsMatrix {
    #[command(flatten)]
    o: MatrixOptions,
}

/// A run of `cells` built, provisioned and with its guest image: the run
/// and its work dir (the caller removes it). Logs are kept in the results
/// dir's `logs/KERNEL-CELL/`.
pub fn prepare(
    b: &BenchSetup,
    cells: BTreeMap<String, Cell>,
    job_env: Vec<(String, String)>,
) -> Result<(Run, PathBuf), String> {
    let root = setup::repo_root();
    let resdir = b
        .results
        .map(|p| PathBuf::from(crate::paths::abspath(&p.display().to_string())))
        .unwrap_or_else(|| {
            root.join("ci/results")
                .join(format!("{}-{}", b.tool, setup::date_stamp()))
        });
    let _ = std::fs::create_dir_all(&resdir);
    let work = crate::paths::mkdtemp(&format!("vr-{}.", b.tool))
        .map(PathBuf::from)
        .map_err(|_| "cannot make a work dir".to_string())?;
    let mut args = vec![b.tool.to_string(), "--keep-logs".into()];
    args.extend(["--accel".into(), b.setup.accel.clone()]);
    args.extend(["--timeout".into(), b.timeout.to_string()]);
    args.extend(["--profile".into(), b.profile.to_string()]);
    if b.setup.no_build {
        args.push("--no-build".into());
    }
    if b.verbose {
        args.push("--verbose".into());
    }
    if let Some(q) = &b.setup.qemu {
        args.extend(["--qemu".into(), q.clone()]);
    }
    let sel: Vec<(String, String)> = cells
        .keys()
        .map(|c| (b.kernel.to_string(), c.clone()))
        .collect();
    let mut run = Run {
        o: AsMatrix::parse_from(args).o,
        root: root.clone(),
        resdir,
        cells,
        job_env,
        daemon_bin: setup::target_dir(&root, b.profile).join("vhost-rdma"),
        vrbin: work.join("vrbin"),
        qemu: String::new(),
        image: String::new(),
        kernel_image: None,
        kernel_version: None,
    };
    matrix::prepare(&mut run, &sel, &work)?;
    let image = b.setup.image.clone().or_else(|| {
        setup::last_line(
            std::process::Command::new(root.join("scripts/build-guest-image.sh"))
                .args(["--kernel", b.kernel]),
            &work.join("image.log"),
        )
    });
    run.image = image
        .filter(|i| Path::new(i).join("bzImage").is_file())
        .ok_or_else(|| format!("no guest image for kernel {}", b.kernel))?;
    Ok((run, work))
}

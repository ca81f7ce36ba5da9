//! What a guest run prepares on the host before it boots anything: the
//! checkout it works in, the daemon and guest binaries (cargo), QEMU and
//! the guest images (the provisioning scripts, which print the path they
//! made as their last line).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where a run's guests come from, as the soak and the SMC bench take it
/// on their command lines.
#[derive(clap::Args, Debug, Clone)]
pub struct GuestSetup {
    /// guest image dir (default: scripts/build-guest-image.sh for the run's kernel)
    #[arg(long)]
    pub image: Option<String>,
    /// QEMU 11.1 (default: scripts/setup-qemu.sh)
    #[arg(long)]
    pub qemu: Option<String>,
    /// accelerator
    #[arg(long, default_value = "auto", value_parser = ["auto", "kvm", "tcg"])]
    pub accel: String,
    /// use the binaries as they are (no cargo build)
    #[arg(long)]
    pub no_build: bool,
}

/// The checkout: `VHOST_RDMA_ROOT` (the scripts' shim sets it), else where
/// this crate was built from.
pub fn repo_root() -> PathBuf {
    std::env::var_os("VHOST_RDMA_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
}

/// cargo's output directory for `profile` (`CARGO_TARGET_DIR`, default
/// ROOT/target).
pub fn target_dir(root: &Path, profile: &str) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"))
        .join(profile)
}

/// `YYYY-MM-DD_HHMMSS` (local time), for a results directory's name.
pub fn date_stamp() -> String {
    crate::paths::local_time()
        .replace(' ', "_")
        .replace(':', "")
}

/// `cargo build --profile PROFILE -p vhost-rdma -p smc-guest-tests` in
/// `root` (`debug` is cargo's `dev` profile, built into target/debug), its
/// output to `log` (`None`: to ours); whether it succeeded.
pub fn build_binaries(root: &Path, profile: &str, log: Option<&Path>) -> bool {
    let mut cmd = Command::new("cargo");
    let cargo_profile = if profile == "debug" { "dev" } else { profile };
    cmd.args(["build", "--profile", cargo_profile])
        .args(["-p", "vhost-rdma", "-p", "smc-guest-tests"])
        .current_dir(root);
    if let Some(log) = log {
        let Ok(out) = std::fs::File::create(log) else {
            return false;
        };
        let Ok(err) = out.try_clone() else {
            return false;
        };
        cmd.stdout(out).stderr(err);
    }
    cmd.status().is_ok_and(|s| s.success())
}

/// Runs a provisioning script: its stderr goes to `log` and, indented, to
/// our stderr (a first image build takes minutes: the user sees it go);
/// returns the last non-empty line it printed on stdout, `None` when it
/// failed.
pub fn last_line(cmd: &mut Command, log: &Path) -> Option<String> {
    let mut logf = std::fs::File::create(log).ok()?;
    let mut child = crate::qemu::spawn_piped(cmd)?;
    let stderr = child.stderr.take()?;
    let echo = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = writeln!(logf, "{line}");
            eprintln!("    {line}");
        }
    });
    let mut last = None;
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            let line = line.trim();
            if !line.is_empty() {
                last = Some(line.to_string());
            }
        }
    }
    let ok = child.wait().is_ok_and(|s| s.success());
    let _ = echo.join();
    last.filter(|_| ok)
}

/// Copies `from` to `to`; the error names both.
pub fn copy(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::copy(from, to)
        .map(drop)
        .map_err(|e| anyhow::anyhow!("{} -> {}: {e}", from.display(), to.display()))
}

/// Copies the tree `from` into `to` (created), symlinks as symlinks.
pub fn copy_tree(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(to).map_err(|e| anyhow::anyhow!("{}: {e}", to.display()))?;
    let entries =
        std::fs::read_dir(from).map_err(|e| anyhow::anyhow!("{}: {e}", from.display()))?;
    for e in entries {
        let e = e.map_err(|e| anyhow::anyhow!("{}: {e}", from.display()))?;
        let (src, dst) = (e.path(), to.join(e.file_name()));
        let ft = e
            .file_type()
            .map_err(|e| anyhow::anyhow!("{}: {e}", src.display()))?;
        if ft.is_symlink() {
            let target =
                std::fs::read_link(&src).map_err(|e| anyhow::anyhow!("{}: {e}", src.display()))?;
            let _ = std::fs::remove_file(&dst);
            std::os::unix::fs::symlink(target, &dst)
                .map_err(|e| anyhow::anyhow!("{}: {e}", dst.display()))?;
        } else if ft.is_dir() {
            copy_tree(&src, &dst)?;
        } else {
            copy(&src, &dst)?;
        }
    }
    Ok(())
}

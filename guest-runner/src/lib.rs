//! guest-runner: the host side of vhost-rdma's guest tests.
//!
//! `guest-runner boot` (scripts/run-guests) boots N QEMU guests, each
//! running one job script, wired to the daemon's vhost-user or vfio-user
//! sockets or to QEMU's own `-netdev stream` links, and returns the combined
//! result; `guest-runner kernel-check PATH` checks a bring-your-own guest
//! kernel image; `guest-runner soak` (scripts/soak.sh) runs the soak: one
//! daemon, four guests, N minutes, the daemon's memory judged;
//! `guest-runner matrix` (ci/matrix.sh) runs the guest test matrix;
//! `guest-runner demo` (scripts/demo.sh) runs the demo.
//!
//! The guest protocol (scripts/guest/vr-init in the image):
//!
//! - kernel command line `root=/dev/vda ro init=/sbin/vr-init console=ttyS0
//!   vr.name=NAME vr.ip=ADDR/PREFIX [vr.ip1=...]`;
//! - 9p tag `job` (rw) is `/job`: the guest runs `sh /job/run.sh`, its
//!   output also in `/job/out.log`; 9p tag `vrbin` (ro) is `/opt/vr`;
//! - console lines `VR-BOOTED name=NAME` ... `VR-RESULT name=NAME rc=N`
//!   ([`console`]), then `poweroff -f`.
//!
//! Modules: [`spec`] (`--guest` options), [`qemu`] (QEMU command lines),
//! [`console`] (the markers), [`kernel`] (image checks), [`options`] (the
//! command line), [`boot`] (the run), [`daemon`] (the vhost-rdma daemon as
//! the tests run it), [`setup`] (binaries, QEMU, images), [`soak`] (the
//! soak), [`cells`] (the guest test matrix's cells), [`matrix`] (its run), [`stuck`] (why a matrix guest stopped), [`ctl_broker`]
//! (the fault cells' `ctl` requests), [`failover`] (the failover cell's
//! link changes and evidence), [`demo`] (the demo's steps and verdicts).

pub mod bench;
pub mod bench_erdma;
pub mod bench_fabric;
pub mod bench_gve;
pub mod bench_smc;
pub mod bench_vhost;
pub mod boot;
pub mod cells;
pub mod console;
pub mod ctl_broker;
pub mod daemon;
pub mod demo;
pub mod failover;
pub mod kernel;
pub mod matrix;
pub mod options;
pub mod paths;
pub mod qemu;
pub mod setup;
pub mod soak;
pub mod spec;
pub mod stuck;
pub mod virtual_hosts;

pub use boot::run;
pub use options::BootOptions;

/// Why a run stops before its guests' verdicts; every kind exits 2 except
/// [`Error::Interrupted`] (130).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A usage or setup problem; nothing to summarise.
    #[error("{0}")]
    Usage(String),
    /// A setup problem once guests may be running: they are stopped and
    /// summarised.
    #[error("{0}")]
    Setup(String),
    /// SIGINT, SIGTERM or SIGHUP (its name).
    #[error("interrupted by {0}")]
    Interrupted(&'static str),
}

/// Prints `run-guests: MSG` on stderr: the prefix callers grep for.
pub fn log(msg: impl std::fmt::Display) {
    eprintln!("run-guests: {msg}");
}

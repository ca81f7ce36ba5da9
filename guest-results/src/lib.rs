//! The results side of vhost-rdma's guest harness (issue 26): parses what the
//! guests logged and judges it. `guest-runner` boots the guests; this crate
//! reads their logs and asks a running daemon through `vhost-rdma ctl`, so it
//! needs no QEMU and no root.
//!
//! - [`upstream`]: the upstream suites (rdma-core's pyverbs `tests/`, the
//!   kernel's NIC selftests) against `ci/upstream/*.expect`.
//! - [`cell`]: one matrix cell's upstream verdict in one call (what
//!   `ci/matrix.py`'s `upstream_rows()` asks `guest-results upstream` for).
//! - [`daemon_cpu`]: the daemon's CPU per GiB in the guest benches
//!   (`guest-results daemon-cpu sample|bursts`).
//! - [`plot`]: SVG charts of the bench and soak tables (`guest-results plot`).
//! - [`rss_host`]: the host side of scripts/e2e-rss.sh (`guest-results rss-host`).
//! - [`demo_view`]: the facts scripts/demo.sh reads from the daemon's replies
//!   (`guest-results demo-view`).

pub mod cell;
pub mod daemon_cpu;
pub mod demo_view;
pub mod plot;
mod pytext;
pub mod rss_host;
mod run_cmd;
pub mod upstream;

pub use pytext::fnmatch;

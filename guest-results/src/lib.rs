//! The results side of vhost-rdma's guest harness (issue 26): parses what the
//! guests logged and judges it. `guest-runner` boots the guests; this crate
//! reads their logs and asks a running daemon through `vhost-rdma ctl`, so it
//! needs no QEMU and no root.
//!
//! - [`upstream`]: the upstream suites (rdma-core's pyverbs `tests/`, the
//!   kernel's NIC selftests) against `ci/upstream/*.expect`.
//! - [`cell`]: one matrix cell's upstream verdict in one call (the
//!   matrix's upstream rows; by hand `guest-results upstream`).
//! - [`faults`]: the device-fault cells' case verdicts, driver table and
//!   trace row.
//! - [`flakes`]: a failed cell that failed only by known flakes is rerun.
//! - [`guestlog`]: a matrix cell's rows from its guests' out.log.
//! - [`hostrows`]: host rows from what the daemon reported (checker-clean,
//!   loss-evidence).
//! - [`junit`]: JUnit XML from test logs and matrix results (`guest-results
//!   junit`, scripts/test.sh --junit and ci/matrix.sh --junit), written
//!   with [`xml`].
//! - [`tshark`]: the host row "tshark" (`guest-results tshark`).
//! - [`report`]: a matrix run's results.md and the report of several runs
//!   (`guest-results report`), from results.json read by [`pyjson`].
//! - [`daemon_cpu`]: the daemon's CPU per GiB in the guest benches
//!   (`guest-results daemon-cpu sample|bursts`).
//! - [`plot`]: SVG charts of the bench and soak tables (`guest-results plot`).
//! - [`rss_host`]: the host side of the matrix's rss cell (`guest-runner rss-host`).
//! - [`demo_view`]: the facts the demo (`guest-runner demo`) reads from the
//!   daemon's replies.

pub mod cell;
pub mod daemon_cpu;
pub mod demo_view;
pub mod faults;
pub mod flakes;
pub mod guestlog;
pub mod hostrows;
pub mod junit;
pub mod plot;
pub mod pyjson;
mod pytext;
pub mod report;
pub mod rss_host;
mod run_cmd;
pub mod tshark;
pub mod upstream;
pub mod xml;

pub use pytext::fnmatch;

//! The results side of vhost-rdma's guest harness (issue 26): parses what the
//! guests logged and judges it. `guest-runner` boots the guests; this crate
//! only reads their logs, so it needs no QEMU, no daemon and no root.
//!
//! - [`upstream`]: the upstream suites (rdma-core's pyverbs `tests/`, the
//!   kernel's NIC selftests) against `ci/upstream/*.expect`.
//! - [`cell`]: one matrix cell's upstream verdict in one call (what
//!   `ci/matrix.py`'s `upstream_rows()` asks `guest-results upstream` for).
//! - [`faults`]: the device-fault cells' case verdicts, driver table and
//!   trace row (`guest-results faults`, `guest-results trace`).
//! - [`flakes`]: a failed cell that failed only by known flakes is rerun
//!   (`guest-results flakes`).
//! - [`guestlog`]: a matrix cell's rows from its guests' out.log
//!   (`guest-results guests`).
//! - [`hostrows`]: host rows from what the daemon reported
//!   (`guest-results checker-clean`, `guest-results loss-evidence`).
//! - [`junit`]: JUnit XML from test logs and matrix results (`guest-results
//!   junit`, scripts/test.sh --junit and ci/matrix.sh --junit), written
//!   with [`xml`].
//! - [`tshark`]: the host row "tshark" (`guest-results tshark`).
//! - [`report`]: a matrix run's results.md and the report of several runs
//!   (`guest-results report`), from results.json read by [`pyjson`].

pub mod cell;
pub mod faults;
pub mod flakes;
pub mod guestlog;
pub mod hostrows;
pub mod junit;
pub mod pyjson;
mod pytext;
pub mod report;
pub mod tshark;
pub mod upstream;
pub mod xml;

pub use pytext::fnmatch;

//! The `ctl` side of the binary: clap arguments and the printing of replies.
//! Only the binary prints; the library answers with data.

pub mod bench;
pub mod check_capture;
pub mod checker;
pub mod faults;
pub mod steering;

// The match fields of `ctl faults add` and `ctl flow-rule add` are the
// library's `MatchSpec` itself (a `clap::Args`), as the control socket and
// config files take them.
pub use vhost_rdma::match_spec::{parse_u32_any, parse_u8_any};

//! Guest-side test tools for vhost-rdma: a data-verified TCP/SMC stream test
//! with SMC fallback detection, and SMC generic netlink helpers (user EIDs,
//! SMC-R devices). Runs inside unmodified Linux guests; needs only glibc.

pub mod codes;
pub mod diag;
pub mod netlink;
pub mod pattern;
pub mod qstats;
pub mod size;
pub mod smcnl;
pub mod sock;
pub mod stream;

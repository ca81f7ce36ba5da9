//! Guest-side test tools for vhost-rdma: a data-verified TCP/SMC stream test
//! with SMC fallback detection, SMC generic netlink helpers (user EIDs,
//! SMC-R devices), and data-verified RDMA verbs tests (feature `verbs`:
//! libibverbs + librdmacm). Runs inside unmodified Linux guests.

pub mod codes;
pub mod devmem_recv;
pub mod devmem_send;
pub mod diag;
pub mod netlink;
pub mod pattern;
pub mod qstats;
pub mod size;
pub mod smcnl;
pub mod sock;
pub mod stream;
pub mod verbs;
#[cfg(feature = "verbs")]
pub mod verbs_cm;
#[cfg(feature = "verbs")]
pub mod verbs_ib;
#[cfg(feature = "verbs")]
pub mod verbs_run;

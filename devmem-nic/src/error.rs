//! Error type for configuration and buffer-management calls.
//!
//! Receiving a frame never returns an error: malformed frames are classified
//! as best as possible and resource shortages become counted drops.

use thiserror::Error;

/// Errors returned by configuration, rule and buffer-pool operations.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum NicError {
    /// The NIC needs at least one receive queue.
    #[error("the NIC needs at least one receive queue")]
    NoQueues,
    /// A queue index is not below the number of queues.
    #[error("queue {queue} does not exist (the NIC has {num_queues} queues)")]
    NoSuchQueue {
        /// The offending queue index.
        queue: u16,
        /// Number of receive queues of the NIC.
        num_queues: u16,
    },
    /// The RSS key is longer than the device's `rss_max_key_size`.
    #[error("RSS key of {len} bytes exceeds the maximum of {max} bytes")]
    KeyTooLong {
        /// Length supplied.
        len: usize,
        /// Maximum accepted (virtio `rss_max_key_size`).
        max: usize,
    },
    /// The RSS indirection table length is zero, not a power of two, or too long.
    #[error("indirection table length {len} is invalid (must be a power of two in 1..={max})")]
    BadIndirectionTable {
        /// Length supplied.
        len: usize,
        /// Maximum accepted (virtio `rss_max_indirection_table_length`).
        max: usize,
    },
    /// The hash-types bitmap contains bits this model does not know.
    #[error("unsupported hash type bits {0:#x}")]
    UnsupportedHashTypes(u32),
    /// A virtio control-queue structure is shorter than its fields say.
    #[error("truncated virtio structure: need {need} bytes, have {have}")]
    Truncated {
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// The flow-rule table already holds `max` rules.
    #[error("flow rule table is full ({max} rules)")]
    RuleTableFull {
        /// Configured maximum rule count.
        max: usize,
    },
    /// A rule with this id is already installed.
    #[error("flow rule id {0} already exists")]
    DuplicateRule(u32),
    /// No rule with this id is installed.
    #[error("no flow rule with id {0}")]
    NoSuchRule(u32),
    /// A buffer size of zero was configured.
    #[error("buffer size must be non-zero")]
    ZeroBufferSize,
    /// The buffer id is already posted (free) in this pool.
    #[error("buffer {0} is already posted")]
    AlreadyPosted(u32),
    /// The buffer id is held by a placed frame and has not been recycled.
    #[error("buffer {0} is in use (placed, not yet recycled)")]
    InUse(u32),
    /// `recycle` was called for a buffer that is not held.
    #[error("buffer {0} is not in use")]
    NotInUse(u32),
}

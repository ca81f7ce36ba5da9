//! Work requests, completions and queue-pair errors.

use thiserror::Error;

use crate::error::CodecError;
use crate::mr::MemError;

/// A scatter/gather element: `length` bytes at `addr` in the region `lkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sge {
    /// Virtual address (inside the region).
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the region.
    pub lkey: u32,
}

impl Sge {
    /// Shorthand constructor.
    pub const fn new(addr: u64, length: u32, lkey: u32) -> Sge {
        Sge { addr, length, lkey }
    }
}

/// The operation of a send work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SendOp {
    /// SEND.
    Send,
    /// SEND with immediate data.
    SendWithImm {
        /// Immediate data (opaque, big-endian on the wire).
        imm: u32,
    },
    /// SEND with invalidate: the responder invalidates `rkey` on delivery.
    SendWithInv {
        /// Remote key to invalidate.
        rkey: u32,
    },
    /// RDMA WRITE.
    RdmaWrite {
        /// Remote virtual address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// RDMA WRITE with immediate (consumes a receive WQE at the peer).
    RdmaWriteWithImm {
        /// Remote virtual address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Immediate data.
        imm: u32,
    },
    /// RDMA READ into the local SGEs.
    RdmaRead {
        /// Remote virtual address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// 64-bit compare and swap; the original value lands in the local SGE.
    AtomicCmpAndSwp {
        /// Remote virtual address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Compare value.
        compare: u64,
        /// Swap value.
        swap: u64,
    },
    /// 64-bit fetch and add; the original value lands in the local SGE.
    AtomicFetchAndAdd {
        /// Remote virtual address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Addend.
        add: u64,
    },
}

impl SendOp {
    /// RDMA READ or an atomic (uses an rd_atomic credit, response carries data).
    pub const fn is_read_or_atomic(&self) -> bool {
        matches!(
            self,
            SendOp::RdmaRead { .. }
                | SendOp::AtomicCmpAndSwp { .. }
                | SendOp::AtomicFetchAndAdd { .. }
        )
    }
    /// An atomic.
    pub const fn is_atomic(&self) -> bool {
        matches!(
            self,
            SendOp::AtomicCmpAndSwp { .. } | SendOp::AtomicFetchAndAdd { .. }
        )
    }
    /// The completion opcode.
    pub const fn wc_opcode(&self) -> WcOpcode {
        match self {
            SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. } => {
                WcOpcode::Send
            }
            SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. } => WcOpcode::RdmaWrite,
            SendOp::RdmaRead { .. } => WcOpcode::RdmaRead,
            SendOp::AtomicCmpAndSwp { .. } => WcOpcode::CompSwap,
            SendOp::AtomicFetchAndAdd { .. } => WcOpcode::FetchAdd,
        }
    }
}

/// A send work request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendWr {
    /// Caller's id, returned in the completion.
    pub wr_id: u64,
    /// Operation.
    pub op: SendOp,
    /// Local buffers: the gather list for SEND/WRITE, the scatter list for
    /// READ, the 8-byte result buffer for atomics.
    pub sg_list: Vec<Sge>,
    /// Generate a completion on success (errors always complete).
    pub signaled: bool,
    /// Set the solicited-event bit on the last packet (SEND, WRITE_WITH_IMM).
    pub solicited: bool,
    /// Inline payload (`IBV_SEND_INLINE`): the bytes were copied at post
    /// time and are sent instead of the gather list (SEND and WRITE only;
    /// at most [`crate::QpCaps::max_inline_data`]).
    pub inline_data: Vec<u8>,
}

impl SendWr {
    /// A signaled, unsolicited work request.
    pub fn new(wr_id: u64, op: SendOp, sg_list: Vec<Sge>) -> SendWr {
        SendWr {
            wr_id,
            op,
            sg_list,
            signaled: true,
            solicited: false,
            inline_data: Vec::new(),
        }
    }
    /// An inline SEND or WRITE: `data` is the payload, no gather list.
    pub fn inline(wr_id: u64, op: SendOp, data: Vec<u8>) -> SendWr {
        SendWr {
            inline_data: data,
            ..SendWr::new(wr_id, op, Vec::new())
        }
    }
    /// Builder-style `signaled`.
    pub fn signaled(mut self, v: bool) -> SendWr {
        self.signaled = v;
        self
    }
    /// Builder-style `solicited`.
    pub fn solicited(mut self, v: bool) -> SendWr {
        self.solicited = v;
        self
    }
}

/// A receive work request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvWr {
    /// Caller's id, returned in the completion.
    pub wr_id: u64,
    /// Scatter list.
    pub sg_list: Vec<Sge>,
}

impl RecvWr {
    /// Shorthand constructor.
    pub fn new(wr_id: u64, sg_list: Vec<Sge>) -> RecvWr {
        RecvWr { wr_id, sg_list }
    }
}

/// Completion status (`ib_wc_status` numbering).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum WcStatus {
    /// IB_WC_SUCCESS.
    Success = 0,
    /// IB_WC_LOC_LEN_ERR: message longer than the receive buffer.
    LocLenErr = 1,
    /// IB_WC_LOC_QP_OP_ERR.
    LocQpOpErr = 2,
    /// IB_WC_LOC_PROT_ERR: a local SGE failed its key / bounds / rights check.
    LocProtErr = 4,
    /// IB_WC_WR_FLUSH_ERR: flushed because the QP entered ERROR.
    WrFlushErr = 5,
    /// IB_WC_BAD_RESP_ERR: unexpected or malformed response.
    BadRespErr = 7,
    /// IB_WC_REM_INV_REQ_ERR: NAK invalid request.
    RemInvReqErr = 9,
    /// IB_WC_REM_ACCESS_ERR: NAK remote access error.
    RemAccessErr = 10,
    /// IB_WC_REM_OP_ERR: NAK remote operational error.
    RemOpErr = 11,
    /// IB_WC_RETRY_EXC_ERR: transport retries exhausted.
    RetryExcErr = 12,
    /// IB_WC_RNR_RETRY_EXC_ERR: RNR retries exhausted.
    RnrRetryExcErr = 13,
}

/// Completion opcode (`ib_wc_opcode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    /// SEND (any variant).
    Send,
    /// RDMA WRITE (any variant).
    RdmaWrite,
    /// RDMA READ.
    RdmaRead,
    /// Compare and swap.
    CompSwap,
    /// Fetch and add.
    FetchAdd,
    /// A received SEND.
    Recv,
    /// A received RDMA WRITE with immediate.
    RecvRdmaWithImm,
}

/// A completion queue entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The work request's id.
    pub wr_id: u64,
    /// Status.
    pub status: WcStatus,
    /// Opcode.
    pub opcode: WcOpcode,
    /// Bytes transferred (received bytes for RECV, write length for
    /// RECV_RDMA_WITH_IMM, read length for READ, 8 for atomics).
    pub byte_len: u32,
    /// Immediate data (SEND_WITH_IMM / WRITE_WITH_IMM receives).
    pub imm: Option<u32>,
    /// Key invalidated by a SEND_WITH_INV receive.
    pub invalidated_rkey: Option<u32>,
    /// Local QP number.
    pub qp_num: u32,
}

impl Completion {
    /// Is this a receive-side completion?
    pub fn is_recv(&self) -> bool {
        matches!(self.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm)
    }
}

/// Errors returned synchronously by the queue-pair API.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum QpError {
    /// The operation is not allowed in the QP's current state.
    #[error("operation not allowed in state {0:?}")]
    BadState(super::QpState),
    /// Illegal state transition.
    #[error("illegal transition {from:?} -> {to:?}")]
    BadTransition {
        /// Current state.
        from: super::QpState,
        /// Requested state.
        to: super::QpState,
    },
    /// An attribute is out of range.
    #[error("invalid attribute: {0}")]
    InvalidAttr(&'static str),
    /// The work request is malformed.
    #[error("invalid work request: {0}")]
    InvalidWr(&'static str),
    /// The send queue (including unpolled completions) is full.
    #[error("send queue full ({0} entries)")]
    SendQueueFull(usize),
    /// The receive queue (including unpolled completions) is full.
    #[error("receive queue full ({0} entries)")]
    RecvQueueFull(usize),
    /// The QP uses a shared receive queue; post there.
    #[error("QP is attached to an SRQ")]
    HasSrq,
    /// An incoming packet could not be parsed.
    #[error("malformed packet: {0}")]
    Codec(#[from] CodecError),
    /// An incoming packet was dropped (not for this QP, wrong state, ...).
    #[error("packet dropped: {0}")]
    Dropped(&'static str),
    /// Memory error surfaced synchronously.
    #[error(transparent)]
    Mem(#[from] MemError),
}

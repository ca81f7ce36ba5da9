//! Queue pairs, address vectors and the QP state numbering of the RoCEv2
//! flavour (`erdma_verbs.h`).

use std::collections::VecDeque;

use crate::mr::PagedBuf;
use crate::regs::le;

/// QP states (`enum erdma_qps_rocev2`).
pub mod qps {
    /// Reset.
    pub const RESET: u8 = 0;
    /// Init.
    pub const INIT: u8 = 1;
    /// Ready to receive.
    pub const RTR: u8 = 2;
    /// Ready to send.
    pub const RTS: u8 = 3;
    /// Send queue drain.
    pub const SQD: u8 = 4;
    /// Send queue error.
    pub const SQE: u8 = 5;
    /// Error.
    pub const ERROR: u8 = 6;
}

/// `MODIFY_QP` attribute mask bits (`enum erdma_qpa_mask_rocev2`).
pub mod qpa {
    /// State.
    pub const STATE: u32 = 1;
    /// Q_Key.
    pub const QKEY: u32 = 2;
    /// Address vector.
    pub const AV: u32 = 4;
    /// SQ PSN.
    pub const SQ_PSN: u32 = 8;
    /// RQ PSN.
    pub const RQ_PSN: u32 = 16;
    /// Destination QPN.
    pub const DST_QPN: u32 = 32;
}

/// QP types (`enum erdma_qp_type`).
pub mod qpt {
    /// Reliable connected.
    pub const RC: u8 = 0;
    /// Unreliable datagram (also the GSI QP1).
    pub const UD: u8 = 1;
}

/// An address vector (`struct erdma_av_cfg`, 36 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Av {
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Network type: 0 IPv4, 1 IPv6.
    pub ntype: u8,
    /// Traffic class (IPv4 TOS).
    pub traffic_class: u8,
    /// Hop limit (IPv4 TTL).
    pub hop_limit: u8,
    /// Service level.
    pub sl: u8,
    /// UDP source port.
    pub udp_sport: u16,
    /// Source GID index.
    pub sgid_index: u16,
    /// Destination MAC.
    pub dmac: [u8; 6],
    /// Destination GID (IPv4-mapped for IPv4).
    pub dgid: [u8; 16],
}

impl Av {
    /// Parses the 36-byte `erdma_av_cfg` at `off`.
    pub fn parse(b: &[u8], off: usize) -> Av {
        let cfg0 = le::u32_at(b, off);
        Av {
            flow_label: cfg0 & 0xf_ffff,
            ntype: ((cfg0 >> 20) & 1) as u8,
            traffic_class: b.get(off + 4).copied().unwrap_or(0),
            hop_limit: b.get(off + 5).copied().unwrap_or(0),
            sl: b.get(off + 6).copied().unwrap_or(0),
            udp_sport: le::u16_at(b, off + 8),
            sgid_index: le::u16_at(b, off + 10),
            dmac: le::bytes_at::<6>(b, off + 12),
            dgid: le::bytes_at::<16>(b, off + 20),
        }
    }

    /// The IPv4 address of an IPv4-mapped destination GID.
    pub fn dst_ipv4(&self) -> Option<[u8; 4]> {
        ipv4_of_gid(&self.dgid)
    }
}

/// The IPv4 address of an IPv4-mapped GID (`::ffff:a.b.c.d`).
pub fn ipv4_of_gid(g: &[u8; 16]) -> Option<[u8; 4]> {
    if g[..10].iter().all(|&b| b == 0) && g[10] == 0xff && g[11] == 0xff {
        Some([g[12], g[13], g[14], g[15]])
    } else {
        None
    }
}

/// A send WQE handed to the RC engine, awaiting its completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inflight {
    /// Engine work-request id.
    pub wr_id: u64,
    /// Index of the SQE's first WQEBB.
    pub sq_idx: u16,
    /// erdma opcode (for the CQE).
    pub opcode: u8,
    /// Completion requested.
    pub signaled: bool,
    /// Local key to invalidate after success (READ_WITH_INV).
    pub invalidate: Option<u32>,
}

/// A receive WQE handed to the RC engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvSlot {
    /// Engine work-request id.
    pub wr_id: u64,
    /// RQE index.
    pub rq_idx: u16,
}

/// One queue pair.
pub struct Qp {
    /// QPN.
    pub qpn: u32,
    /// PD number.
    pub pd: u32,
    /// [`qpt`].
    pub qp_type: u8,
    /// Send queue ring.
    pub sq: PagedBuf,
    /// SQ depth in WQEBBs (power of two).
    pub sq_depth: u32,
    /// Receive queue ring.
    pub rq: PagedBuf,
    /// RQ depth in RQEs (power of two).
    pub rq_depth: u32,
    /// Send CQN.
    pub scqn: u32,
    /// Receive CQN.
    pub rcqn: u32,
    /// SQ doorbell record address.
    pub sq_dbrec: u64,
    /// RQ doorbell record address.
    pub rq_dbrec: u64,
    /// [`qps`].
    pub state: u8,
    /// Q_Key.
    pub qkey: u32,
    /// Destination QPN.
    pub dst_qpn: u32,
    /// Initial send PSN.
    pub sq_psn: u32,
    /// Initial receive PSN.
    pub rq_psn: u32,
    /// Address vector (RC).
    pub av: Option<Av>,
    /// SQ producer index (WQEBBs) from the last doorbell.
    pub sq_pi: u16,
    /// SQ consumer index.
    pub sq_ci: u16,
    /// RQ producer index from the last doorbell.
    pub rq_pi: u16,
    /// RQ consumer index (RQEs taken).
    pub rq_ci: u16,
    /// Next UD PSN.
    pub ud_psn: u32,
    /// RC engine (created at CREATE_QP for RC QPs).
    pub engine: Option<roce_model::QueuePair>,
    /// Send WQEs inside the engine.
    pub inflight: VecDeque<Inflight>,
    /// Receive WQEs inside the engine.
    pub recvs: VecDeque<RecvSlot>,
    /// The SQ hit an error completion: stop until the QP is reset/flushed.
    pub sq_stopped: bool,
    /// A local operation or fenced WQE waits for the engine to drain.
    pub sq_wait_drain: bool,
}

impl std::fmt::Debug for Qp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qp")
            .field("qpn", &self.qpn)
            .field("type", &self.qp_type)
            .field("state", &self.state)
            .field("sq_pi", &self.sq_pi)
            .field("sq_ci", &self.sq_ci)
            .field("rq_pi", &self.rq_pi)
            .field("rq_ci", &self.rq_ci)
            .finish()
    }
}

impl Qp {
    /// Entries posted on the SQ (WQEBBs) or, with `rq`, the RQ (RQEs) and
    /// not yet taken; `None` when the producer index of the last doorbell
    /// is beyond the ring (a bad doorbell: stale or hostile).
    pub fn posted(&self, rq: bool) -> Option<u16> {
        if rq {
            crate::regs::ring_outstanding(self.rq_pi, self.rq_ci, self.rq_depth)
        } else {
            crate::regs::ring_outstanding(self.sq_pi, self.sq_ci, self.sq_depth)
        }
    }

    /// A new QP in RESET.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        qpn: u32,
        pd: u32,
        qp_type: u8,
        sq: PagedBuf,
        sq_depth: u32,
        rq: PagedBuf,
        rq_depth: u32,
        scqn: u32,
        rcqn: u32,
        sq_dbrec: u64,
        rq_dbrec: u64,
    ) -> Qp {
        Qp {
            qpn,
            pd,
            qp_type,
            sq,
            sq_depth,
            rq,
            rq_depth,
            scqn,
            rcqn,
            sq_dbrec,
            rq_dbrec,
            state: qps::RESET,
            qkey: 0,
            dst_qpn: 0,
            sq_psn: 0,
            rq_psn: 0,
            av: None,
            sq_pi: 0,
            sq_ci: 0,
            rq_pi: 0,
            rq_ci: 0,
            ud_psn: 0,
            engine: None,
            inflight: VecDeque::new(),
            recvs: VecDeque::new(),
            sq_stopped: false,
            sq_wait_drain: false,
        }
    }

    /// Work requests this QP has inside its engine.
    pub fn engine_work(&self) -> usize {
        self.inflight.len() + self.recvs.len()
    }

    /// Forgets the work handed to the engine (QP reset or destroyed: the
    /// engine goes with it or is reset too).
    pub fn drop_engine_work(&mut self) {
        self.inflight.clear();
        self.recvs.clear();
    }

    /// Is this a datagram QP (UD or GSI)?
    pub fn is_ud(&self) -> bool {
        self.qp_type == qpt::UD
    }
}

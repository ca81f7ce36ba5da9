//! Sans-IO InfiniBand Communication Manager (IBA vol. 1 ch. 12) for RC
//! connections, as Linux's `ib_cm` and `rdma_cm` use it over the GSI QP
//! (QP1) — on RoCE, what an rxe guest's rping/ucmatose send and expect.
//!
//! * `msg`: the MAD header and REQ, MRA, REJ, REP, RTU, DREQ, DREP
//!   (`CmMad::parse` / `encode`, bounds-checked, no panics).
//! * `cma`: rdma_cm's private-data header and service IDs.
//! * `manager`: `CmManager`, the passive and active state machines with
//!   retries, limits and counters. No I/O, no clocks: time is passed in.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod cma;
pub mod error;
pub mod manager;
pub mod msg;

pub use cma::{service_id, service_port, CmaHeader, RDMA_PS_TCP};
pub use error::CmError;
pub use manager::{
    CmConfig, CmCounters, CmEvent, CmFailure, CmManager, ConnId, ConnectParams, LocalQp,
    OutgoingMad, RemoteQp,
};
pub use msg::{
    cm_timeout, ipv4_mapped_gid, reject_reason, AttrId, CmMad, CmMessage, Drep, Dreq, Mra,
    PathInfo, Rej, Rep, Req, Rtu, GSI_QKEY, MAD_LEN,
};

//! Device configuration: what the device reports in its registers and
//! `QUERY_DEVICE`, its table limits, and the transport parameters erdma
//! never passes (it has no path MTU, timeout or retry attributes in
//! `MODIFY_QP`).

/// Settable device parameters. [`ErdmaConfig::new`] gives the documented
/// defaults for a given MAC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErdmaConfig {
    /// MAC of the paired virtio-net port. The driver binds the IB device to
    /// the netdev whose permanent address equals this, so it must match.
    pub mac: [u8; 6],
    /// `VERSION` register (non-zero, else the driver refuses the function).
    /// Default 1.
    pub version: u32,
    /// Firmware version reported by `QUERY_FW_INFO`. Default 0x0001_0000.
    pub fw_version: u32,
    /// QP blocks of 1024 QPs (`QBLOCK` capability): the driver's QPN space is
    /// `1024 * qblocks`, MR and CQ spaces twice that. Default 1.
    pub qblocks: u16,
    /// Most live QPs (table bound, <= `1024 * qblocks - 1`). Default 1023.
    pub max_live_qps: usize,
    /// Most live CQs. Default 2047.
    pub max_live_cqs: usize,
    /// Most live MRs. Default 2048.
    pub max_live_mrs: usize,
    /// log2 of the largest CQ (`MAX_CQE`). Default 16 (65536 CQEs).
    pub max_cqe_log2: u8,
    /// log2 of the largest RQ (`MAX_RECV_WR`). Default 13 (8192).
    pub max_recv_wr_log2: u8,
    /// log2 of the AH table (`MAX_AH`). Default 12 (4096).
    pub max_ah_log2: u8,
    /// log2 of the largest MR (`MAX_MR_SIZE`). Default 32 (4 GiB).
    pub max_mr_size_log2: u8,
    /// log2 of the GID table (`MAX_GID`). Default 4 (16 GIDs).
    pub max_gid_log2: u8,
    /// log2 of memory windows (`MAX_MW`). Default 0 (none implemented).
    pub max_mw_log2: u8,
    /// Most MTT entries of one MR or queue (`ERDMA_MR_MAX_MTT_CNT`). Default
    /// 524288.
    pub max_mtt_entries: u32,
    /// Report `ATOMIC` capability. Default true.
    pub cap_atomic: bool,
    /// Report `MTT_VA` (the driver may then build 1..3-level scattered MTTs
    /// for user MRs). Default true.
    pub cap_mtt_va: bool,
    /// Report `EXTEND_DB` (per-context doorbell pages from `ALLOC_DB`; without
    /// it userspace needs CAP_SYS_RAWIO). Default true.
    pub cap_extend_db: bool,
    /// Key of the local DMA MR (`DMA_LOCAL_KEY`): SGEs with it carry guest
    /// physical addresses. Default 0xffff_ff00 (outside the driver's stag
    /// space).
    pub local_dma_key: u32,
    /// Default congestion-control algorithm index reported (`DEFAULT_CC`).
    /// Default 1 (CUBIC; unused by this model).
    pub default_cc: u8,
    /// Most CEQs the driver may create (<= 31). Default 31.
    pub max_ceqs: u8,
    /// Most `ALLOC_DB` allocations live. Default 256.
    pub max_db_allocs: usize,
    /// Path MTU used when `CONF_MTU` has not been seen, in bytes. Default
    /// 1024. `CONF_MTU` (the netdev MTU) replaces it with the largest IB MTU
    /// (256..4096) whose RoCEv2 packet fits.
    pub default_path_mtu: u32,
    /// ACK timeout exponent (4.096 us * 2^n) for RC QPs. Default 16 (~268
    /// ms): a TCG guest on a busy host can leave an ACK unanswered for
    /// 100 ms and more, and with 7 retries at ~67 ms a stalled peer errors
    /// the QP out (an SMC-R link down) in half a second.
    pub ack_timeout: u8,
    /// Transport retry count (7 = infinite, as rxe counts it). Default 7.
    pub retry_cnt: u8,
    /// RNR retry count (7 = infinite). Default 7.
    pub rnr_retry: u8,
    /// Responder minimum RNR NAK timer code. Default 12 (0.64 ms).
    pub min_rnr_timer: u8,
    /// Initiator / responder read-atomic depth. Default 16.
    pub max_rd_atomic: u8,
    /// Most SQ WQEBBs / RQEs / commands handled per doorbelled queue in one
    /// `poll` (keeps one `poll` bounded). Default 256.
    pub poll_budget: usize,
    /// Largest frame accepted or sent (Ethernet, no FCS). Default 9018.
    pub max_frame: usize,
    /// IPv4 TTL when the AV hop limit is 0. Default 64.
    pub default_ttl: u8,
    /// Largest path MTU in bytes the RC engines use, whatever the netdev
    /// MTU allows (256, 512, 1024, 2048 or 4096). Default 4096.
    pub max_path_mtu: u32,
    /// Most work requests (send and receive) the RC engines of this device
    /// hold at once: the daemon's memory for a device's RC work. Payload
    /// is never held (it moves between guest memory and frames), so a work
    /// request is its bookkeeping, about 250 bytes with its SGEs or inline
    /// bytes: the default 65536 bounds it near 16 MiB. Past it, SQEs and
    /// RQEs wait in the driver's rings until completions free room (the
    /// device slows down, as hardware whose on-chip queues are full does);
    /// each wait counts in `engine_wr_stalls`.
    pub max_engine_wrs: usize,
    /// Most work requests of one direction (SQ or RQ) one QP's engine holds.
    /// Default 4096.
    pub max_wrs_per_qp: usize,
    /// Most frames one `poll` (or one received frame) may produce; the rest
    /// wait in the engines and the device asks to be polled again at once.
    /// Bounds what a poll allocates for frames: default 1024 (at most 9 MiB
    /// of 9018-byte frames).
    pub max_tx_frames_per_poll: usize,
}

impl ErdmaConfig {
    /// The defaults above for a device paired with `mac`.
    pub fn new(mac: [u8; 6]) -> Self {
        ErdmaConfig {
            mac,
            version: 1,
            fw_version: 0x0001_0000,
            qblocks: 1,
            max_live_qps: 1023,
            max_live_cqs: 2047,
            max_live_mrs: 2048,
            max_cqe_log2: 16,
            max_recv_wr_log2: 13,
            max_ah_log2: 12,
            max_mr_size_log2: 32,
            max_gid_log2: 4,
            max_mw_log2: 0,
            max_mtt_entries: 524_288,
            cap_atomic: true,
            cap_mtt_va: true,
            cap_extend_db: true,
            local_dma_key: 0xffff_ff00,
            default_cc: 1,
            max_ceqs: 31,
            max_db_allocs: 256,
            default_path_mtu: 1024,
            ack_timeout: 16,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 16,
            poll_budget: 256,
            max_frame: 9018,
            default_ttl: 64,
            max_path_mtu: 4096,
            max_engine_wrs: 65_536,
            max_wrs_per_qp: 4096,
            max_tx_frames_per_poll: 1024,
        }
    }

    /// QPN space (`1024 * qblocks`).
    pub fn qpn_space(&self) -> u32 {
        1024 * u32::from(self.qblocks.max(1))
    }
}

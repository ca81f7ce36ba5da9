//! Device counters: every error a hostile or buggy driver can provoke is
//! counted here instead of panicking.

/// Counters of one device (monotonic, reset only by [`crate::ErdmaDevice::new`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Counters {
    /// Device resets (CTRL reset bit or function-level reset).
    pub resets: u64,
    /// INIT handshakes that succeeded.
    pub inits: u64,
    /// INIT handshakes refused (bad CMDQ/EQ registers).
    pub init_failures: u64,
    /// BAR reads outside any register.
    pub bad_bar_reads: u64,
    /// BAR writes outside any register or doorbell, or of a bad size.
    pub bad_bar_writes: u64,
    /// COMMON-submodule commands completed with status 0.
    pub cmd_common_ok: u64,
    /// COMMON-submodule commands failed.
    pub cmd_common_failed: u64,
    /// RDMA-submodule commands completed with status 0.
    pub cmd_rdma_ok: u64,
    /// RDMA-submodule commands failed.
    pub cmd_rdma_failed: u64,
    /// Commands with an unknown submodule or opcode.
    pub cmd_unknown: u64,
    /// Commands whose arguments were refused (range, state, limits).
    pub cmd_malformed: u64,
    /// Commands refused because a table is full.
    pub cmd_limit_hit: u64,
    /// Command-queue doorbells.
    pub cmdq_doorbells: u64,
    /// Doorbells rung (SQ, RQ, CQ, EQ).
    pub doorbells: u64,
    /// Doorbells naming no object, in no doorbell space, before INIT, or
    /// with a producer index the ring cannot hold (more than the ring
    /// ahead; for the CMDQ also off a command boundary).
    pub bad_doorbells: u64,
    /// Guest-memory accesses refused by `Dma`.
    pub dma_errors: u64,
    /// EQEs written.
    pub eqes_written: u64,
    /// EQEs dropped because the EQ was full or missing.
    pub eq_overflows: u64,
    /// CQEs written (work completions, not command completions).
    pub cqes_written: u64,
    /// Error CQEs written (a status other than success or flush).
    pub error_cqes: u64,
    /// CQEs written while the CQ looked full (stale consumer index).
    pub cq_overruns: u64,
    /// CQEs lost because the CQ was missing or unreachable.
    pub cqes_dropped: u64,
    /// Command completions written to the CMDQ CQ.
    pub cmd_cqes_written: u64,
    /// MSI-X interrupts raised.
    pub irqs: u64,
    /// Send WQEs consumed.
    pub wqes_executed: u64,
    /// Send WQEs that failed to parse or validate.
    pub bad_wqes: u64,
    /// Receive WQEs consumed.
    pub rqes_consumed: u64,
    /// WQEs completed with FLUSH_ERR.
    pub wqes_flushed: u64,
    /// Asynchronous events written to the AEQ.
    pub async_events: u64,
    /// Frames sent.
    pub tx_frames: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
    /// Frames that could not be built or sent (no source GID, AV of mixed
    /// IPv4/IPv6 GIDs, larger than `max_frame`).
    pub tx_errors: u64,
    /// Frames received and taken.
    pub rx_frames: u64,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Frames dropped because the port was down (`port-down` device
    /// fault or `ctl link down`), sent or received.
    #[serde(default)]
    pub port_down_drops: u64,
    /// Received frames dropped, all reasons (the `rx_drop_*` counters
    /// name them).
    pub rx_dropped: u64,
    /// Dropped: not a RoCEv2 frame, or larger than `max_frame`.
    pub rx_drop_not_roce: u64,
    /// Dropped: unicast to another MAC, or a GRH (RoCEv1) frame.
    pub rx_drop_wrong_dest: u64,
    /// Dropped: bad ICRC.
    pub rx_drop_bad_icrc: u64,
    /// Dropped: destination QP unknown.
    pub rx_drop_unknown_qp: u64,
    /// Dropped: transport (RC / UD) does not match the QP's.
    pub rx_drop_wrong_transport: u64,
    /// Dropped by the QP's RC engine (state, PSN, key or length checks).
    pub rx_drop_refused_by_qp: u64,
    /// Dropped by a UD QP (no receive posted, bad Q_Key, DMA error).
    pub rx_drop_ud: u64,
    /// QPs live.
    pub qps_live: u64,
    /// CQs live.
    pub cqs_live: u64,
    /// MRs live.
    pub mrs_live: u64,
    /// CEQs live.
    pub ceqs_live: u64,
    /// AHs live.
    pub ahs_live: u64,
    /// GIDs set.
    pub gids_live: u64,
    /// Extended-doorbell allocations live.
    pub db_allocs_live: u64,
    /// Fast-register (REG_MR) WQEs executed.
    pub fast_regs: u64,
    /// Local invalidations executed.
    pub local_invs: u64,
    /// RC recovery, summed over every QP the device has run (live and
    /// destroyed): go-back-N rewinds of the requester.
    pub rc_retries: u64,
    /// RC retransmit-timer expiries with work outstanding.
    pub rc_timeouts: u64,
    /// RC PSN-sequence-error NAKs sent (a gap seen by the responder).
    pub rc_seq_naks_sent: u64,
    /// RC duplicate requests received (the peer retransmitted).
    pub rc_duplicates: u64,
    /// Times an SQE or RQE was left in the driver's ring because the RC
    /// engines held their budget of work requests
    /// (`ErdmaConfig::max_engine_wrs`, `max_wrs_per_qp`).
    pub engine_wr_stalls: u64,
    /// Work requests the RC engines hold now.
    pub engine_wrs_live: u64,
    /// Frames looped back inside the function (to a QP of its own).
    pub loopback_frames: u64,
    /// Looped-back frames dropped because the loopback queue was full.
    pub loopback_drops: u64,
}

impl Counters {
    /// Adds the recovery counters of one RC engine.
    pub(crate) fn add_rc(&mut self, s: &roce_model::QpStats) {
        self.rc_retries += s.retries;
        self.rc_timeouts += s.timeouts;
        self.rc_seq_naks_sent += s.seq_naks_sent;
        self.rc_duplicates += s.duplicates;
    }
}

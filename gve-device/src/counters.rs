//! Device counters and the status snapshot for the daemon's `ctl status`.
//! Counters survive resets (they describe the device's life, not the
//! driver's session); everything else in [`Status`] is current state.

/// Per-TX-queue counters (indexed by queue id, kept across destroy/reset).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TxQueueCounters {
    /// Frames sent to the fabric (TSO segments count one each).
    pub packets: u64,
    /// Bytes of those frames.
    pub bytes: u64,
    /// TSO packets segmented.
    pub tso_packets: u64,
    /// Packets completed but not sent (bad descriptors, DMA errors, bad TSO).
    pub drops: u64,
}

/// Per-RX-queue counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RxQueueCounters {
    /// Frames delivered (each segment of a coalesced frame counts).
    pub packets: u64,
    /// Bytes written for those frames.
    pub bytes: u64,
    /// Frames delivered with headers in the header buffer (each segment of
    /// a coalesced frame counts; its headers are written once).
    pub hsplit_packets: u64,
    /// Header bytes written to header buffers.
    pub header_bytes: u64,
    /// Bytes written to data buffers.
    pub payload_bytes: u64,
    /// Frames refused for lack of posted buffers.
    pub no_buffers: u64,
    /// Frames dropped on this queue (DMA errors, `rx-error` and
    /// `rx-bad-buf-id` faults).
    pub drops: u64,
    /// Frames for this queue dropped for being longer than the MTU allows
    /// (`RX_DROPS_PACKET_OVER_MRU` in the NIC stats report).
    #[serde(default)]
    pub oversize: u64,
    /// Frames delivered with a checksum error bit, found or injected
    /// (`RX_DROPS_INVALID_CHECKSUM`: the stack drops them).
    #[serde(default)]
    pub csum_errors: u64,
}

/// All counters. Plain `u64`s, saturating where guest input could wrap them.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Counters {
    /// Admin commands that completed with `PASSED`.
    pub admin_ok: u64,
    /// Admin commands that completed with an error status.
    pub admin_failed: u64,
    /// Admin commands with an unknown opcode (also in `admin_failed`).
    pub admin_unknown_opcode: u64,
    /// Admin doorbells ignored (no queue set up, producer count out of range).
    pub admin_bad_doorbell: u64,
    /// Guest memory accesses refused by [`pci_model::Dma`].
    pub dma_errors: u64,
    /// Doorbell writes to a queue/block that does not exist, or with an index
    /// outside the ring.
    pub bad_doorbells: u64,
    /// BAR accesses outside any register, or with a width the register does
    /// not have.
    pub bad_register_accesses: u64,
    /// Malformed TX descriptors (unknown dtype, misplaced context, bad TSO).
    pub bad_tx_descriptors: u64,
    /// Device resets (driver-requested and function-level).
    pub resets: u64,
    /// Interrupts raised.
    pub irqs_raised: u64,
    /// Events that arrived while their notify block was masked (fired later).
    pub irqs_deferred: u64,
    /// Frames delivered on any RX queue (each segment of a coalesced frame
    /// counts).
    pub rx_packets: u64,
    /// Bytes written to RX buffers (a coalesced frame's headers once).
    pub rx_bytes: u64,
    /// Coalesced frames written (HW-GRO: two segments or more, `rsc` set).
    #[serde(default)]
    pub rx_rsc_packets: u64,
    /// Segments in those frames.
    #[serde(default)]
    pub rx_rsc_segments: u64,
    /// Of `rx_rsc_packets`: TSO frames from the fabric placed whole
    /// (`PciDevice::receive_tso`), never cut into segments.
    #[serde(default)]
    pub rx_tso_whole: u64,
    /// Frames dropped on receive (no queue, oversize, runt, DMA error).
    pub rx_drops: u64,
    /// Of `rx_drops`: the target queue was not created.
    pub rx_no_queue: u64,
    /// Of `rx_drops`: frames longer than the MTU allows (or shorter than an
    /// Ethernet header), or needing more than 64 buffers.
    pub rx_oversize: u64,
    /// Frames refused because the target queue had no buffers.
    pub rx_no_buffers: u64,
    /// Frames steered by a flow rule.
    pub flow_rule_hits: u64,
    /// Frames steered by the RSS indirection table.
    pub rss_steered: u64,
    /// CONFIGURE_RSS tables equal to the default spread over the existing
    /// RX queues, taken as the default (which follows the queue count).
    #[serde(default)]
    pub rss_default_tables: u64,
    /// Frames with a wrong IPv4 header or L4 checksum (still delivered,
    /// flagged).
    pub rx_csum_errors: u64,
    /// Frames sent on any TX queue.
    pub tx_packets: u64,
    /// Bytes sent on any TX queue.
    pub tx_bytes: u64,
    /// TX packets completed without sending.
    pub tx_drops: u64,
    /// Of `tx_drops`: a frame longer than the device MTU allows (Ethernet
    /// header + one VLAN tag if present + MTU), or a TSO packet whose MSS
    /// makes segments that long.
    #[serde(default)]
    pub tx_oversize: u64,
    /// Of `tx_drops`: packets a `tx-miss` fault (reinject=no) dropped.
    #[serde(default)]
    pub tx_miss_dropped: u64,
    /// Device faults that fired (the driver bench's rules).
    #[serde(default)]
    pub faults_fired: u64,
    /// Admin commands a fault left without completion (`adminq-timeout`).
    #[serde(default)]
    pub admin_timeouts: u64,
    /// NIC stats reports written into the driver's stats region.
    #[serde(default)]
    pub nic_stats_written: u64,
    /// Per TX queue.
    pub tx_queues: Vec<TxQueueCounters>,
    /// Per RX queue.
    pub rx_queues: Vec<RxQueueCounters>,
}

impl Counters {
    /// Counters for `max_tx` TX and `max_rx` RX queues.
    pub fn new(max_tx: u32, max_rx: u32) -> Self {
        Counters {
            tx_queues: vec![TxQueueCounters::default(); max_tx as usize],
            rx_queues: vec![RxQueueCounters::default(); max_rx as usize],
            ..Default::default()
        }
    }
}

/// Adds one, saturating (counters never wrap or panic).
pub(crate) fn inc(c: &mut u64) {
    *c = c.saturating_add(1);
}

/// Adds `n`, saturating.
pub(crate) fn add(c: &mut u64, n: u64) {
    *c = c.saturating_add(n);
}

/// One TX queue, as created by the driver.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TxQueueStatus {
    /// Queue id.
    pub id: u32,
    /// Descriptor ring size.
    pub ring_size: u32,
    /// Next descriptor the device reads.
    pub head: u32,
    /// Tail from the last doorbell.
    pub tail: u32,
    /// Notify block.
    pub ntfy_id: u32,
    /// BAR2 word of its doorbell.
    pub db_index: u32,
}

/// One RX queue, as created by the driver.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RxQueueStatus {
    /// Queue id.
    pub id: u32,
    /// Buffer queue size.
    pub buf_ring_size: u32,
    /// Completion queue size.
    pub compl_ring_size: u32,
    /// Buffers posted and not yet used.
    pub buffers_available: u32,
    /// Data buffer size.
    pub packet_buffer_size: u32,
    /// Header buffer size (0: header split off).
    pub header_buffer_size: u32,
    /// HW-GRO requested (`enable_rsc`): the device coalesces TCP segments.
    pub rsc: bool,
    /// Notify block.
    pub ntfy_id: u32,
    /// BAR2 word of its doorbell.
    pub db_index: u32,
}

/// RSS state.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RssStatus {
    /// `GVE_RSS_HASH_*` bits enabled.
    pub hash_types: u16,
    /// The Toeplitz key.
    pub key: Vec<u8>,
    /// The indirection table (the device default spreads over created queues
    /// until the driver sets one that differs from it).
    pub indirection_table: Vec<u32>,
    /// True while a table the driver set (other than the default) is in
    /// effect.
    pub table_configured: bool,
}

/// One installed flow rule.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FlowRuleStatus {
    /// Rule location (priority: lower first).
    pub location: u32,
    /// Human-readable match.
    pub description: String,
    /// Target RX queue.
    pub queue: u16,
    /// Frames it steered.
    pub hits: u64,
}

/// A snapshot of the device for `ctl status`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Status {
    /// `device_status` register.
    pub device_status: u32,
    /// Version string the driver wrote.
    pub driver_version: String,
    /// Admin queue set up.
    pub adminq_ready: bool,
    /// Admin commands executed since the last reset.
    pub adminq_event_counter: u32,
    /// `CONFIGURE_DEVICE_RESOURCES` done.
    pub resources_configured: bool,
    /// Notify blocks configured.
    pub notify_blocks: u32,
    /// Current MTU.
    pub mtu: u16,
    /// TX queues.
    pub tx_queues: Vec<TxQueueStatus>,
    /// RX queues.
    pub rx_queues: Vec<RxQueueStatus>,
    /// RSS.
    pub rss: RssStatus,
    /// Flow rules, in location order.
    pub flow_rules: Vec<FlowRuleStatus>,
    /// The last admin command that failed: opcode and reason.
    pub last_admin_error: Option<(u32, String)>,
    /// Counters.
    pub counters: Counters,
}

//! BAR0 register file (`struct gve_registers` in `gve_register.h`), all
//! big endian.

/// `device_status` (read): `GVE_DEVICE_STATUS_*` bits.
pub const DEVICE_STATUS: u64 = 0x00;
/// `driver_status` (write): `GVE_DRIVER_STATUS_*` bits.
pub const DRIVER_STATUS: u64 = 0x04;
/// `max_tx_queues` (read).
pub const MAX_TX_QUEUES: u64 = 0x08;
/// `max_rx_queues` (read).
pub const MAX_RX_QUEUES: u64 = 0x0c;
/// `adminq_pfn` (read/write; revision 0 drivers only).
pub const ADMINQ_PFN: u64 = 0x10;
/// `adminq_doorbell` (write): the driver's free-running producer count.
pub const ADMINQ_DOORBELL: u64 = 0x14;
/// `adminq_event_counter` (read): commands executed, free running.
pub const ADMINQ_EVENT_COUNTER: u64 = 0x18;
/// `driver_version` (write, one byte at a time, ends with `'\n'`).
pub const DRIVER_VERSION: u64 = 0x1f;
/// `adminq_base_address_hi` (write).
pub const ADMINQ_BASE_HI: u64 = 0x20;
/// `adminq_base_address_lo` (write).
pub const ADMINQ_BASE_LO: u64 = 0x24;
/// `adminq_length` (write, 16 bits): ring size in bytes.
pub const ADMINQ_LENGTH: u64 = 0x28;
/// One past the last register byte.
pub const REGS_END: u64 = 0x2a;

/// `GVE_DEVICE_STATUS_*`.
pub mod device_status {
    /// The device asks the driver to reset it.
    pub const RESET: u32 = 1 << 1;
    /// Link up.
    pub const LINK: u32 = 1 << 2;
    /// The device asks the driver to refresh its stats report.
    pub const REPORT_STATS: u32 = 1 << 3;
    /// The reset the driver asked for is done (polled by
    /// `gve_adminq_release`).
    pub const DEVICE_IS_RESET: u32 = 1 << 4;
}

/// `GVE_DRIVER_STATUS_*`.
pub mod driver_status {
    /// The driver has set up the admin queue.
    pub const RUN: u32 = 1 << 0;
    /// The driver releases the admin queue: reset the device.
    pub const RESET: u32 = 1 << 1;
}

/// Longest driver version string kept (the driver writes
/// `"GVE-" GVE_VERSION "\n"`); more bytes are dropped.
pub const MAX_VERSION_LEN: usize = 128;

/// The driver's name of the BAR0 register at `offset` (the field of
/// `struct gve_registers`), for the device trace.
pub fn name(offset: u64) -> Option<&'static str> {
    Some(match offset {
        DEVICE_STATUS => "device_status",
        DRIVER_STATUS => "driver_status",
        MAX_TX_QUEUES => "max_tx_queues",
        MAX_RX_QUEUES => "max_rx_queues",
        ADMINQ_PFN => "adminq_pfn",
        ADMINQ_DOORBELL => "adminq_doorbell",
        ADMINQ_EVENT_COUNTER => "adminq_event_counter",
        DRIVER_VERSION => "driver_version",
        ADMINQ_BASE_HI => "adminq_base_address_hi",
        ADMINQ_BASE_LO => "adminq_base_address_lo",
        ADMINQ_LENGTH => "adminq_length",
        _ => return None,
    })
}

//! The admin queue's opcodes and statuses (`gve_adminq.h`) and the
//! driver's names for them: shared by the admin queue, the device faults
//! that match commands and the trace.

/// `enum gve_adminq_opcodes` (plus the extended inner opcode).
pub mod opcode {
    /// Device descriptor and options.
    pub const DESCRIBE_DEVICE: u32 = 0x1;
    /// Counter array and interrupt doorbells.
    pub const CONFIGURE_DEVICE_RESOURCES: u32 = 0x2;
    /// QPL registration (not offered).
    pub const REGISTER_PAGE_LIST: u32 = 0x3;
    /// QPL unregistration (not offered).
    pub const UNREGISTER_PAGE_LIST: u32 = 0x4;
    /// Create a TX queue.
    pub const CREATE_TX_QUEUE: u32 = 0x5;
    /// Create an RX queue.
    pub const CREATE_RX_QUEUE: u32 = 0x6;
    /// Destroy a TX queue.
    pub const DESTROY_TX_QUEUE: u32 = 0x7;
    /// Destroy an RX queue.
    pub const DESTROY_RX_QUEUE: u32 = 0x8;
    /// Undo CONFIGURE_DEVICE_RESOURCES.
    pub const DECONFIGURE_DEVICE_RESOURCES: u32 = 0x9;
    /// Set RSS key / table / hash types.
    pub const CONFIGURE_RSS: u32 = 0xa;
    /// Set a driver parameter (MTU).
    pub const SET_DRIVER_PARAMETER: u32 = 0xb;
    /// Attach / detach the stats report.
    pub const REPORT_STATS: u32 = 0xc;
    /// Write the link speed.
    pub const REPORT_LINK_SPEED: u32 = 0xd;
    /// Write the packet type map.
    pub const GET_PTYPE_MAP: u32 = 0xe;
    /// Driver info (answered after checking it is readable).
    pub const VERIFY_DRIVER_COMPATIBILITY: u32 = 0xf;
    /// Read flow rules / ids / counts.
    pub const QUERY_FLOW_RULES: u32 = 0x10;
    /// Write the NIC clock (offered with `GveConfig::nic_timestamp`).
    pub const REPORT_NIC_TIMESTAMP: u32 = 0x11;
    /// Read the RSS configuration.
    pub const QUERY_RSS: u32 = 0x12;
    /// A command longer than 56 bytes, in separate memory.
    pub const EXTENDED_COMMAND: u32 = 0xff;
    /// Extended inner opcode: add / delete / reset flow rules.
    pub const CONFIGURE_FLOW_RULE: u32 = 0x101;
}

/// `enum gve_adminq_statuses`.
pub mod status {
    /// Not written yet.
    pub const UNSET: u32 = 0;
    /// Success.
    pub const PASSED: u32 = 1;
    /// Already exists (`-EINVAL` in the driver).
    pub const ALREADY_EXISTS: u32 = 0xffff_fff1;
    /// Wrong state (`-EAGAIN`).
    pub const FAILED_PRECONDITION: u32 = 0xffff_fff5;
    /// Bad field (`-EINVAL`).
    pub const INVALID_ARGUMENT: u32 = 0xffff_fff7;
    /// No such object (`-EINVAL`).
    pub const NOT_FOUND: u32 = 0xffff_fff8;
    /// Index out of range (`-EINVAL`).
    pub const OUT_OF_RANGE: u32 = 0xffff_fff9;
    /// Not supported (`-EOPNOTSUPP`, tolerated where optional).
    pub const UNIMPLEMENTED: u32 = 0xffff_fffe;
}

/// `enum gve_adminq_statuses` names (without `GVE_ADMINQ_COMMAND_` and
/// `ERROR_`).
pub(crate) const STATUSES: &[(&str, u32)] = &[
    ("UNSET", status::UNSET),
    ("PASSED", status::PASSED),
    ("ABORTED", 0xffff_fff0),
    ("ALREADY_EXISTS", status::ALREADY_EXISTS),
    ("CANCELLED", 0xffff_fff2),
    ("DATALOSS", 0xffff_fff3),
    ("DEADLINE_EXCEEDED", 0xffff_fff4),
    ("FAILED_PRECONDITION", status::FAILED_PRECONDITION),
    ("INTERNAL_ERROR", 0xffff_fff6),
    ("INVALID_ARGUMENT", status::INVALID_ARGUMENT),
    ("NOT_FOUND", status::NOT_FOUND),
    ("OUT_OF_RANGE", status::OUT_OF_RANGE),
    ("PERMISSION_DENIED", 0xffff_fffa),
    ("UNAUTHENTICATED", 0xffff_fffb),
    ("RESOURCE_EXHAUSTED", 0xffff_fffc),
    ("UNAVAILABLE", 0xffff_fffd),
    ("UNIMPLEMENTED", status::UNIMPLEMENTED),
    ("UNKNOWN_ERROR", 0xffff_ffff),
];

/// The driver's name of an admin opcode (`GVE_ADMINQ_CREATE_TX_QUEUE`), for
/// the trace.
pub fn opcode_name(op: u32) -> Option<&'static str> {
    const FULL: &[&str] = &[
        "GVE_ADMINQ_DESCRIBE_DEVICE",
        "GVE_ADMINQ_CONFIGURE_DEVICE_RESOURCES",
        "GVE_ADMINQ_REGISTER_PAGE_LIST",
        "GVE_ADMINQ_UNREGISTER_PAGE_LIST",
        "GVE_ADMINQ_CREATE_TX_QUEUE",
        "GVE_ADMINQ_CREATE_RX_QUEUE",
        "GVE_ADMINQ_DESTROY_TX_QUEUE",
        "GVE_ADMINQ_DESTROY_RX_QUEUE",
        "GVE_ADMINQ_DECONFIGURE_DEVICE_RESOURCES",
        "GVE_ADMINQ_CONFIGURE_RSS",
        "GVE_ADMINQ_SET_DRIVER_PARAMETER",
        "GVE_ADMINQ_REPORT_STATS",
        "GVE_ADMINQ_REPORT_LINK_SPEED",
        "GVE_ADMINQ_GET_PTYPE_MAP",
        "GVE_ADMINQ_VERIFY_DRIVER_COMPATIBILITY",
        "GVE_ADMINQ_QUERY_FLOW_RULES",
        "GVE_ADMINQ_REPORT_NIC_TIMESTAMP",
        "GVE_ADMINQ_QUERY_RSS",
    ];
    match op {
        opcode::EXTENDED_COMMAND => Some("GVE_ADMINQ_EXTENDED_COMMAND"),
        opcode::CONFIGURE_FLOW_RULE => Some("GVE_ADMINQ_CONFIGURE_FLOW_RULE"),
        1..=0x12 => FULL.get(op as usize - 1).copied(),
        _ => None,
    }
}

/// The driver's name of an admin status (`PASSED`, `DEADLINE_EXCEEDED`),
/// for the trace.
pub fn status_name(st: u32) -> &'static str {
    STATUSES
        .iter()
        .find(|(_, v)| *v == st)
        .map_or("?", |(n, _)| n)
}

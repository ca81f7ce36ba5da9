//! Device faults for the driver bench (`ctl device-fault`): what a real
//! gVNIC does when something goes wrong, on demand, so that the driver's
//! error paths run. `README.md` ("Device faults") is the spec; each kind
//! names the driver function that handles it.
//!
//! The rules live in a [`FaultRules`] table of [`GveFault`]s. The hooks in
//! the admin queue, TX and RX paths ask it at the one place each kind may
//! strike; with no rule at all a hook costs one `is_empty` test.

use pci_model::fault::{
    parse_number, FaultError, FaultKindInfo, FaultRules, FaultSpec, ValueError,
};

use crate::adminq_codes::{opcode, STATUSES};

/// `GVE_FLOW_RULE_CFG_ADD`, `_DEL`, `_RESET`: the `opcode` of a
/// CONFIGURE_FLOW_RULE command.
pub mod flow_cfg {
    /// Add a rule.
    pub const ADD: u16 = 0;
    /// Delete a rule.
    pub const DEL: u16 = 1;
    /// Delete every rule.
    pub const RESET: u16 = 2;
}

/// Which admin commands a rule matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpMatch {
    /// Every command.
    Any,
    /// The opcode, or the inner opcode of an EXTENDED_COMMAND.
    Op(u32),
    /// CONFIGURE_FLOW_RULE with this `GVE_FLOW_RULE_CFG_*` operation
    /// (`ADD_FLOW_RULE`: what `gve_adminq_add_flow_rule` sends).
    FlowRule(u16),
}

/// An admin command as the fault hooks see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdminCmd {
    /// The opcode in the ring.
    pub opcode: u32,
    /// The inner opcode of an EXTENDED_COMMAND.
    pub inner: Option<u32>,
    /// The operation of a CONFIGURE_FLOW_RULE (read from guest memory).
    pub flow_op: Option<u16>,
}

impl OpMatch {
    /// Does the rule match this command?
    pub fn matches(self, c: &AdminCmd) -> bool {
        match self {
            OpMatch::Any => true,
            OpMatch::Op(op) => c.opcode == op || c.inner == Some(op),
            OpMatch::FlowRule(f) => {
                c.inner == Some(opcode::CONFIGURE_FLOW_RULE) && c.flow_op == Some(f)
            }
        }
    }
}

/// Which checksum error bits `rx-bad-csum` sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CsumErr {
    /// `csum_l4_err`.
    L4,
    /// `csum_ip_err` (the driver looks at it for IPv4 only).
    Ip,
    /// Both.
    Both,
}

/// A fault kind with its parsed parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GveFault {
    /// `reset-request`: DEVICE_STATUS reset bit + management interrupt.
    ResetRequest,
    /// `link-down`.
    LinkDown,
    /// `link-up`.
    LinkUp,
    /// `adminq-status`: the next matching command completes with `status`
    /// without being executed.
    AdminqStatus {
        /// Commands it matches.
        op: OpMatch,
        /// The status written.
        status: u32,
    },
    /// `adminq-timeout`: the next matching command never completes; the
    /// admin queue stays stuck until the driver resets the device.
    AdminqTimeout {
        /// Commands it matches.
        op: OpMatch,
    },
    /// `tx-miss`: the next packet gets a miss completion, then a
    /// reinjection completion (`reinject`) or nothing.
    TxMiss {
        /// The TX queue (`None`: any).
        queue: Option<u32>,
        /// Send the packet and reinject its completion.
        reinject: bool,
    },
    /// `tx-stall`: the queue completes nothing while the rule exists.
    TxStall {
        /// The TX queue (`None`: all).
        queue: Option<u32>,
    },
    /// `rx-error`: the next frame's completion has `rx_error`.
    RxError {
        /// The RX queue (`None`: any).
        queue: Option<u32>,
    },
    /// `rx-bad-csum`: the next frame's completion has checksum error bits.
    RxBadCsum {
        /// The RX queue (`None`: any).
        queue: Option<u32>,
        /// Which bits.
        bits: CsumErr,
    },
    /// `rx-bad-buf-id`: the next frame's completion has a `buf_id` the
    /// driver never posted.
    RxBadBufId {
        /// The RX queue (`None`: any).
        queue: Option<u32>,
    },
}

/// What an RX fault does to one frame (the hook's answer to `rx_dqo`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RxFault {
    /// One completion with `rx_error` and `end_of_packet`; the frame is
    /// dropped.
    Error,
    /// The frame's completions say `l3_l4_processed` with these error bits.
    BadCsum(CsumErr),
    /// One completion with [`BAD_BUF_ID`]; the frame is dropped and the
    /// buffer it used is never returned.
    BadBufId,
}

/// `GVE_CAP1(gve_driver_capability_alt_miss_compl)` in
/// `driver_capability_flags[0]`: the driver takes a miss as a packet
/// completion with `GVE_ALT_MISS_COMPL_BIT` in the tag.
pub const CAP_ALT_MISS_COMPL: u64 = 1 << 4;

/// The `buf_id` `rx-bad-buf-id` writes: above any `num_buf_states` the
/// driver allocates (a buffer queue holds at most 4096 entries and the QPL
/// mode's states are bounded by `S16_MAX`).
pub const BAD_BUF_ID: u16 = 0xffff;

const QUEUE: &str = "queue=N (default: any queue)";
const OPCODE: &str = "opcode=NAME|N (GVE_ADMINQ_* name, with or without the prefix, \
CONFIGURE_FLOW_RULE, ADD_FLOW_RULE, DEL_FLOW_RULE, RESET_FLOW_RULE; default: any)";

/// The kinds, for `ctl device-fault kinds`.
pub const KINDS: &[FaultKindInfo] = &[
    FaultKindInfo {
        name: "reset-request",
        params: &[],
        doc: "sets GVE_DEVICE_STATUS_RESET_MASK and raises the management interrupt \
(gve_service_task -> gve_handle_reset)",
    },
    FaultKindInfo {
        name: "link-down",
        params: &[],
        doc: "clears the link bit of device_status and raises the management interrupt \
(gve_handle_link_status: carrier off); clearing the rule brings the link back",
    },
    FaultKindInfo {
        name: "link-up",
        params: &[],
        doc: "sets the link bit of device_status and raises the management interrupt",
    },
    FaultKindInfo {
        name: "adminq-status",
        params: &[
            OPCODE,
            "status=NAME|N (GVE_ADMINQ_COMMAND_ERROR_* name, with or without the prefix)",
        ],
        doc: "the next matching admin command completes with that status, not executed \
(gve_adminq_parse_err)",
    },
    FaultKindInfo {
        name: "adminq-timeout",
        params: &[OPCODE],
        doc: "the next matching admin command never completes: the event counter stops \
before it until the driver resets the device (gve_adminq_kick_and_wait: -ENOTRECOVERABLE)",
    },
    FaultKindInfo {
        name: "tx-miss",
        params: &[QUEUE, "reinject=yes|no (default yes)"],
        doc: "the next TX packet gets a miss completion, then a reinjection completion \
(yes, packet sent) or none (no, packet dropped: the driver's 1 s reclaim timeout)",
    },
    FaultKindInfo {
        name: "tx-stall",
        params: &[QUEUE],
        doc: "lasting: the TX queue sends and completes nothing until the rule is cleared \
(netdev watchdog -> gve_tx_timeout)",
    },
    FaultKindInfo {
        name: "rx-error",
        params: &[QUEUE],
        doc: "the next frame on the queue gets one completion with rx_error and is dropped \
(gve_rx_dqo: rx_desc_err_dropped_pkt)",
    },
    FaultKindInfo {
        name: "rx-bad-csum",
        params: &[QUEUE, "bits=l4|ip|both (default l4)"],
        doc: "the next frame on the queue is delivered with l3_l4_processed and checksum \
error bits (gve_rx_skb_csum: CHECKSUM_NONE)",
    },
    FaultKindInfo {
        name: "rx-bad-buf-id",
        params: &[QUEUE],
        doc: "the next frame on the queue gets one completion with buf_id 0xffff and is \
dropped (gve_rx_dqo: \"Invalid RX buffer_id\")",
    },
];

/// `enum gve_adminq_opcodes` names (without `GVE_ADMINQ_`).
const OPCODES: &[(&str, u32)] = &[
    ("DESCRIBE_DEVICE", opcode::DESCRIBE_DEVICE),
    (
        "CONFIGURE_DEVICE_RESOURCES",
        opcode::CONFIGURE_DEVICE_RESOURCES,
    ),
    ("REGISTER_PAGE_LIST", opcode::REGISTER_PAGE_LIST),
    ("UNREGISTER_PAGE_LIST", opcode::UNREGISTER_PAGE_LIST),
    ("CREATE_TX_QUEUE", opcode::CREATE_TX_QUEUE),
    ("CREATE_RX_QUEUE", opcode::CREATE_RX_QUEUE),
    ("DESTROY_TX_QUEUE", opcode::DESTROY_TX_QUEUE),
    ("DESTROY_RX_QUEUE", opcode::DESTROY_RX_QUEUE),
    (
        "DECONFIGURE_DEVICE_RESOURCES",
        opcode::DECONFIGURE_DEVICE_RESOURCES,
    ),
    ("CONFIGURE_RSS", opcode::CONFIGURE_RSS),
    ("SET_DRIVER_PARAMETER", opcode::SET_DRIVER_PARAMETER),
    ("REPORT_STATS", opcode::REPORT_STATS),
    ("REPORT_LINK_SPEED", opcode::REPORT_LINK_SPEED),
    ("GET_PTYPE_MAP", opcode::GET_PTYPE_MAP),
    (
        "VERIFY_DRIVER_COMPATIBILITY",
        opcode::VERIFY_DRIVER_COMPATIBILITY,
    ),
    ("QUERY_FLOW_RULES", opcode::QUERY_FLOW_RULES),
    ("REPORT_NIC_TIMESTAMP", opcode::REPORT_NIC_TIMESTAMP),
    ("QUERY_RSS", opcode::QUERY_RSS),
    ("EXTENDED_COMMAND", opcode::EXTENDED_COMMAND),
    ("CONFIGURE_FLOW_RULE", opcode::CONFIGURE_FLOW_RULE),
];

fn strip<'a>(s: &'a str, prefixes: &[&str]) -> &'a str {
    let mut s = s;
    for p in prefixes {
        if s.len() >= p.len() && s[..p.len()].eq_ignore_ascii_case(p) {
            s = &s[p.len()..];
        }
    }
    s
}

fn parse_opcode(s: &str) -> Result<OpMatch, ValueError> {
    if let Ok(n) = parse_number(s) {
        return u32::try_from(n)
            .map(OpMatch::Op)
            .map_err(|_| ValueError::expected("an opcode below 2^32"));
    }
    let name = strip(s, &["GVE_ADMINQ_"]);
    for (n, f) in [
        ("ADD_FLOW_RULE", flow_cfg::ADD),
        ("DEL_FLOW_RULE", flow_cfg::DEL),
        ("RESET_FLOW_RULE", flow_cfg::RESET),
    ] {
        if name.eq_ignore_ascii_case(n) {
            return Ok(OpMatch::FlowRule(f));
        }
    }
    let flow = strip(s, &["GVE_FLOW_RULE_CFG_"]);
    if flow.len() != s.len() {
        for (n, f) in [
            ("ADD", flow_cfg::ADD),
            ("DEL", flow_cfg::DEL),
            ("RESET", flow_cfg::RESET),
        ] {
            if flow.eq_ignore_ascii_case(n) {
                return Ok(OpMatch::FlowRule(f));
            }
        }
    }
    OPCODES
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|&(_, v)| OpMatch::Op(v))
        .ok_or_else(|| {
            ValueError::expected(format!(
                "an admin opcode: a number or one of {}, ADD_FLOW_RULE, DEL_FLOW_RULE, \
RESET_FLOW_RULE",
                OPCODES
                    .iter()
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })
}

fn parse_status(s: &str) -> Result<u32, ValueError> {
    if let Ok(n) = parse_number(s) {
        return u32::try_from(n).map_err(|_| ValueError::expected("a status below 2^32"));
    }
    let name = strip(s, &["GVE_ADMINQ_COMMAND_", "ERROR_"]);
    STATUSES
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|&(_, v)| v)
        .ok_or_else(|| {
            ValueError::expected(format!(
                "an admin status: a number or one of {}",
                STATUSES
                    .iter()
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })
}

fn parse_queue(s: &str) -> Result<u32, ValueError> {
    parse_number(s).and_then(|n| u32::try_from(n).map_err(|_| ValueError::expected("a queue id")))
}

fn parse_yes_no(s: &str) -> Result<bool, ValueError> {
    match s.to_ascii_lowercase().as_str() {
        "yes" | "y" | "true" | "1" => Ok(true),
        "no" | "n" | "false" | "0" => Ok(false),
        _ => Err(ValueError::expected("yes or no")),
    }
}

fn parse_bits(s: &str) -> Result<CsumErr, ValueError> {
    match s.to_ascii_lowercase().as_str() {
        "l4" => Ok(CsumErr::L4),
        "ip" => Ok(CsumErr::Ip),
        "both" => Ok(CsumErr::Both),
        _ => Err(ValueError::expected("l4, ip or both")),
    }
}

impl GveFault {
    /// Parses and checks a rule's kind and parameters.
    pub fn parse(spec: &FaultSpec) -> Result<GveFault, FaultError> {
        let kind = spec.kind.to_ascii_lowercase();
        let Some(info) = KINDS.iter().find(|k| k.name == kind) else {
            return Err(FaultError::UnknownKind {
                kind: spec.kind.clone(),
                known: KINDS.iter().map(|k| k.name).collect::<Vec<_>>().join(", "),
            });
        };
        spec.check_params(info.params)?;
        let queue = || spec.get("queue", parse_queue);
        let op = || Ok::<_, FaultError>(spec.get("opcode", parse_opcode)?.unwrap_or(OpMatch::Any));
        Ok(match info.name {
            "reset-request" => GveFault::ResetRequest,
            "link-down" => GveFault::LinkDown,
            "link-up" => GveFault::LinkUp,
            "adminq-status" => GveFault::AdminqStatus {
                op: op()?,
                status: spec.require("status", parse_status)?,
            },
            "adminq-timeout" => GveFault::AdminqTimeout { op: op()? },
            "tx-miss" => GveFault::TxMiss {
                queue: queue()?,
                reinject: spec.get("reinject", parse_yes_no)?.unwrap_or(true),
            },
            "tx-stall" => GveFault::TxStall { queue: queue()? },
            "rx-error" => GveFault::RxError { queue: queue()? },
            "rx-bad-csum" => GveFault::RxBadCsum {
                queue: queue()?,
                bits: spec.get("bits", parse_bits)?.unwrap_or(CsumErr::L4),
            },
            _ => GveFault::RxBadBufId { queue: queue()? },
        })
    }

    /// Acts in `add_fault` (no condition to wait for).
    pub fn immediate(&self) -> bool {
        matches!(
            self,
            GveFault::ResetRequest | GveFault::LinkDown | GveFault::LinkUp
        )
    }
}

fn on(q: Option<u32>, id: u32) -> bool {
    q.is_none_or(|q| q == id)
}

/// The device's rules and the state lasting faults left.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// The rules.
    pub rules: FaultRules<GveFault>,
    /// The rule that took the link down (clearing it brings the link up).
    pub link_down_by: Option<u32>,
    /// An admin command timed out: the event counter stays before it until
    /// the driver resets the device.
    pub adminq_stuck: bool,
}

impl Faults {
    /// The admin hook: a status to complete `c` with, or `None` (the
    /// command runs), or `Some(None)`: it never completes.
    pub fn admin(&mut self, c: &AdminCmd) -> Option<(u32, Option<u32>)> {
        if self.rules.is_empty() {
            return None;
        }
        let r = self.rules.fire(|k| match k {
            GveFault::AdminqStatus { op, .. } | GveFault::AdminqTimeout { op } => op.matches(c),
            _ => false,
        })?;
        match r.kind {
            GveFault::AdminqStatus { status, .. } => Some((r.id, Some(status))),
            _ => Some((r.id, None)),
        }
    }

    /// The TX hook for one packet of queue `q`: `Some((rule, reinject))`
    /// for a miss.
    pub fn tx_miss(&mut self, q: u32) -> Option<(u32, bool)> {
        if self.rules.is_empty() {
            return None;
        }
        let r = self.rules.fire(|k| match *k {
            GveFault::TxMiss { queue, .. } => on(queue, q),
            _ => false,
        })?;
        match r.kind {
            GveFault::TxMiss { reinject, .. } => Some((r.id, reinject)),
            _ => None,
        }
    }

    /// Does a rule stall TX queue `q`?
    pub fn tx_stalled(&self, q: u32) -> bool {
        !self.rules.is_empty()
            && self
                .rules
                .iter()
                .any(|r| matches!(r.kind, GveFault::TxStall { queue } if on(queue, q)))
    }

    /// Counts a stall hit (the first time a stalled queue had work), for
    /// `ctl status`; the rule id when it counted.
    pub fn tx_stall_hit(&mut self, q: u32) -> Option<u32> {
        self.rules
            .fire(|k| matches!(*k, GveFault::TxStall { queue } if on(queue, q)))
            .map(|r| r.id)
    }

    /// The RX hook for one frame on queue `q`.
    pub fn rx(&mut self, q: u32) -> Option<(u32, RxFault)> {
        if self.rules.is_empty() {
            return None;
        }
        let r = self.rules.fire(|k| match *k {
            GveFault::RxError { queue }
            | GveFault::RxBadCsum { queue, .. }
            | GveFault::RxBadBufId { queue } => on(queue, q),
            _ => false,
        })?;
        let f = match r.kind {
            GveFault::RxError { .. } => RxFault::Error,
            GveFault::RxBadCsum { bits, .. } => RxFault::BadCsum(bits),
            _ => RxFault::BadBufId,
        };
        Some((r.id, f))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adminq_codes::{opcode_name, status_name};

    #[test]
    fn names_parse_with_or_without_prefix() {
        assert_eq!(
            parse_opcode("gve_adminq_create_tx_queue"),
            Ok(OpMatch::Op(5))
        );
        assert_eq!(parse_opcode("ADD_FLOW_RULE"), Ok(OpMatch::FlowRule(0)));
        assert_eq!(
            parse_opcode("GVE_FLOW_RULE_CFG_DEL"),
            Ok(OpMatch::FlowRule(1))
        );
        assert_eq!(parse_opcode("0x101"), Ok(OpMatch::Op(0x101)));
        assert!(parse_opcode("FROB").is_err());
        assert_eq!(parse_status("DEADLINE_EXCEEDED"), Ok(0xffff_fff4));
        assert_eq!(
            parse_status("GVE_ADMINQ_COMMAND_ERROR_RESOURCE_EXHAUSTED"),
            Ok(0xffff_fffc)
        );
        assert_eq!(parse_status("passed"), Ok(1));
        assert_eq!(opcode_name(5), Some("GVE_ADMINQ_CREATE_TX_QUEUE"));
        assert_eq!(opcode_name(0x13), None);
        assert_eq!(status_name(0xffff_fff7), "INVALID_ARGUMENT");
    }

    #[test]
    fn specs_are_checked() {
        let s = FaultSpec::new("tx-miss")
            .param("queue", 2)
            .param("reinject", "no");
        assert_eq!(
            GveFault::parse(&s),
            Ok(GveFault::TxMiss {
                queue: Some(2),
                reinject: false
            })
        );
        let s = FaultSpec::new("adminq-status").param("opcode", "CONFIGURE_RSS");
        assert!(matches!(
            GveFault::parse(&s),
            Err(FaultError::MissingParam {
                param: "status",
                ..
            })
        ));
        let s = FaultSpec::new("rx-error").param("qp", 1);
        assert!(matches!(
            GveFault::parse(&s),
            Err(FaultError::UnknownParam { .. })
        ));
        assert!(matches!(
            GveFault::parse(&FaultSpec::new("cqe-status")),
            Err(FaultError::UnknownKind { .. })
        ));
        let s = FaultSpec::new("RX-BAD-CSUM").param("bits", "both");
        assert_eq!(
            GveFault::parse(&s),
            Ok(GveFault::RxBadCsum {
                queue: None,
                bits: CsumErr::Both
            })
        );
    }
}

//! Device faults for the driver bench (`ctl device-fault`): the erdma
//! conditions the happy path never produces, each as the real device would
//! show it to the 7.3 `erdma` driver (see README "Device faults").
//!
//! Rules live in a [`FaultRules`] table of typed [`ErdmaFault`]s; the hooks
//! (`fault_hooks.rs`) in the command queue, the data path and the CQ writer
//! ask it only when it is not empty, so a device without rules pays one
//! branch.

use pci_model::fault::{parse_number, FaultRules, ValueError};
use pci_model::{FaultError, FaultKindInfo, FaultSpec};

use crate::names;

/// A command the rule matches: submodule and opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmdOpcode {
    /// `CMDQ_SUBMOD_RDMA` (0) or `CMDQ_SUBMOD_COMMON` (1).
    pub submod: u8,
    /// The opcode in that submodule.
    pub opcode: u8,
}

/// One erdma fault kind with its parsed parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErdmaFault {
    /// The matching command (any when `None`) is taken off the command
    /// queue and never completed: no CQE, nothing executed.
    CmdqTimeout {
        /// The command matched.
        cmd: Option<CmdOpcode>,
    },
    /// The matching command is not executed and completes with `status`.
    CmdStatus {
        /// The command matched.
        cmd: Option<CmdOpcode>,
        /// The CQE syndrome (non-zero).
        status: u8,
    },
    /// An AEQ entry written when the rule is added (immediate).
    Aeq {
        /// `ERDMA_AE_TYPE_*`.
        event: u8,
        /// `event_data0`: the QPN or CQN.
        data0: u32,
        /// Also move the QP to ERROR (its work completes flushed).
        error: bool,
    },
    /// The next matching successful CQE carries `status`; an RC QP then
    /// goes to ERROR, as after a real error completion.
    CqeStatus {
        /// `ERDMA_WC_*` (non-zero).
        status: u8,
        /// Only CQEs of this QP.
        qpn: Option<u32>,
        /// Only CQEs of this `ERDMA_OP_*` opcode.
        opcode: Option<u8>,
    },
    /// Lasting: the QP's SQ is not executed until the rule is cleared.
    QpStall {
        /// The QP.
        qpn: u32,
    },
    /// The port goes down (immediate; lasting until port-up, `ctl link
    /// up` or clearing the rule).
    PortDown,
    /// The port comes back up (immediate).
    PortUp,
}

/// The kinds, for `ctl device-fault kinds`.
pub const FAULT_KINDS: &[FaultKindInfo] = &[
    FaultKindInfo {
        name: "cmdq-timeout",
        params: &["opcode=CMDQ_OPCODE_* name or number (RDMA submodule; common:N for COMMON); absent: any command"],
        doc: "the matching command is taken and never completed (no CQE): the driver's ERDMA_CMDQ_TIMEOUT_MS path",
    },
    FaultKindInfo {
        name: "cmd-status",
        params: &[
            "opcode=CMDQ_OPCODE_* name or number (as cmdq-timeout); absent: any command",
            "status=non-zero CQE syndrome 1..255",
        ],
        doc: "the matching command is not executed and completes with that status",
    },
    FaultKindInfo {
        name: "aeq",
        params: &[
            "event=ERDMA_AE_TYPE_* name (QP_FATAL, QP_ERQ_ERR, ACC_ERR, CQ_ERR, OTHER_ERROR) or number",
            "qpn=the QP (event_data0)",
            "cqn=the CQ (event_data0; for CQ_ERR)",
            "error=yes|no: also move the QP to ERROR (default no)",
        ],
        doc: "an AEQ entry now, with the interrupt",
    },
    FaultKindInfo {
        name: "cqe-status",
        params: &[
            "status=ERDMA_WC_* name or number 1..255",
            "qpn=only this QP's CQEs",
            "opcode=only CQEs of this ERDMA_OP_* name or number",
        ],
        doc: "the next matching successful CQE gets that status; an RC QP goes to ERROR",
    },
    FaultKindInfo {
        name: "qp-stall",
        params: &["qpn=the QP"],
        doc: "lasting: the QP's SQ is not executed until the rule is cleared",
    },
    FaultKindInfo {
        name: "port-down",
        params: &[],
        doc: "the port goes down: no frame leaves or enters the device until port-up (the 7.3 driver learns port state only from its netdev)",
    },
    FaultKindInfo {
        name: "port-up",
        params: &[],
        doc: "the port comes back up",
    },
];

impl ErdmaFault {
    /// The kind's name (`cqe-status`).
    pub fn name(&self) -> &'static str {
        match self {
            ErdmaFault::CmdqTimeout { .. } => "cmdq-timeout",
            ErdmaFault::CmdStatus { .. } => "cmd-status",
            ErdmaFault::Aeq { .. } => "aeq",
            ErdmaFault::CqeStatus { .. } => "cqe-status",
            ErdmaFault::QpStall { .. } => "qp-stall",
            ErdmaFault::PortDown => "port-down",
            ErdmaFault::PortUp => "port-up",
        }
    }
}

fn takes(kind: &str) -> &'static [&'static str] {
    FAULT_KINDS
        .iter()
        .find(|k| k.name == kind)
        .map_or(&[], |k| k.params)
}

fn u8_value(s: &str) -> Result<u8, ValueError> {
    let n = parse_number(s)?;
    u8::try_from(n).map_err(|_| ValueError::expected("a number 0..=255"))
}

fn u32_value(s: &str) -> Result<u32, ValueError> {
    let n = parse_number(s)?;
    u32::try_from(n).map_err(|_| ValueError::expected("a number below 2^32"))
}

/// A command opcode: a `CMDQ_OPCODE_*` name (with or without the prefix,
/// any case), a number (RDMA submodule), or `common:N` / `rdma:N`.
pub fn parse_cmd_opcode(s: &str) -> Result<CmdOpcode, ValueError> {
    let why = || {
        ValueError::expected(format!(
            "a CMDQ_OPCODE_* name ({}) or a number (RDMA submodule; common:N for COMMON)",
            names::CMD_OPCODES
                .iter()
                .map(|(_, _, n)| n.trim_start_matches("CMDQ_OPCODE_"))
                .collect::<Vec<_>>()
                .join(", ")
        ))
    };
    let lower = s.to_ascii_lowercase();
    let (submod, num) = if let Some(n) = lower.strip_prefix("common:") {
        (1, n)
    } else if let Some(n) = lower.strip_prefix("rdma:") {
        (0, n)
    } else {
        (0, lower.as_str())
    };
    if let Ok(n) = parse_number(num) {
        let opcode = u8::try_from(n).map_err(|_| why())?;
        return Ok(CmdOpcode { submod, opcode });
    }
    names::lookup(
        s,
        &["CMDQ_OPCODE_"],
        names::CMD_OPCODES.iter().map(|(m, o, n)| (*n, (*m, *o))),
    )
    .map(|(submod, opcode)| CmdOpcode { submod, opcode })
    .ok_or_else(why)
}

fn named_u8(
    s: &str,
    prefixes: &[&str],
    table: &'static [(u8, &'static str)],
    what: &str,
) -> Result<u8, ValueError> {
    if let Ok(n) = parse_number(s) {
        return u8::try_from(n)
            .map_err(|_| ValueError::expected(format!("{what} or a number 0..=255")));
    }
    names::lookup(s, prefixes, table.iter().map(|(v, n)| (*n, *v))).ok_or_else(|| {
        ValueError::expected(format!(
            "{what} ({}) or a number",
            table
                .iter()
                .map(|(_, n)| {
                    let mut t = *n;
                    for p in prefixes {
                        t = t.trim_start_matches(p);
                    }
                    t
                })
                .collect::<Vec<_>>()
                .join(", ")
        ))
    })
}

fn yes_no(s: &str) -> Result<bool, ValueError> {
    match s.to_ascii_lowercase().as_str() {
        "yes" | "true" | "1" | "on" => Ok(true),
        "no" | "false" | "0" | "off" => Ok(false),
        _ => Err(ValueError::expected("yes or no")),
    }
}

impl ErdmaFault {
    /// Parses and checks a rule's kind and parameters.
    pub fn parse(spec: &FaultSpec) -> Result<ErdmaFault, FaultError> {
        let kind = spec.kind.to_ascii_lowercase();
        let Some(info) = FAULT_KINDS.iter().find(|k| k.name == kind) else {
            return Err(FaultError::UnknownKind {
                kind: spec.kind.clone(),
                known: FAULT_KINDS
                    .iter()
                    .map(|k| k.name)
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        };
        spec.check_params(takes(info.name))?;
        // A value that parses but does not fit the kind or the other
        // parameters.
        let bad = |param: &str, why: &'static str| FaultError::BadValue {
            kind: spec.kind.clone(),
            param: param.to_owned(),
            value: spec.params.get(param).cloned().unwrap_or_default(),
            why: ValueError::expected(why),
        };
        Ok(match info.name {
            "cmdq-timeout" => ErdmaFault::CmdqTimeout {
                cmd: spec.get("opcode", parse_cmd_opcode)?,
            },
            "cmd-status" => {
                let status = spec.require("status", u8_value)?;
                if status == 0 {
                    return Err(bad("status", "a non-zero status (0 is success)"));
                }
                ErdmaFault::CmdStatus {
                    cmd: spec.get("opcode", parse_cmd_opcode)?,
                    status,
                }
            }
            "aeq" => {
                let event = spec.require("event", |s| {
                    named_u8(
                        s,
                        &["ERDMA_AE_TYPE_"],
                        names::AE_TYPES,
                        "an ERDMA_AE_TYPE_* name",
                    )
                })?;
                let qpn = spec.get("qpn", u32_value)?;
                let cqn = spec.get("cqn", u32_value)?;
                let data0 = match (qpn, cqn) {
                    (Some(q), None) => q,
                    (None, Some(c)) => c,
                    (Some(_), Some(_)) => return Err(bad("cqn", "qpn= or cqn=, not both")),
                    (None, None) => {
                        return Err(FaultError::MissingParam {
                            kind: spec.kind.clone(),
                            param: if event == crate::eq::ae_type::CQ_ERR {
                                "cqn"
                            } else {
                                "qpn"
                            },
                        })
                    }
                };
                let error = spec.get("error", yes_no)?.unwrap_or(false);
                if error && qpn.is_none() {
                    return Err(bad("error", "error=yes needs qpn="));
                }
                ErdmaFault::Aeq {
                    event,
                    data0,
                    error,
                }
            }
            "cqe-status" => {
                let status = spec.require("status", |s| {
                    named_u8(s, &["ERDMA_WC_"], names::WC_STATUS, "an ERDMA_WC_* name")
                })?;
                if status == 0 {
                    return Err(bad("status", "an error status (SUCCESS changes nothing)"));
                }
                ErdmaFault::CqeStatus {
                    status,
                    qpn: spec.get("qpn", u32_value)?,
                    opcode: spec.get("opcode", |s| {
                        named_u8(s, &["ERDMA_OP_"], names::OPCODES, "an ERDMA_OP_* name")
                    })?,
                }
            }
            "qp-stall" => ErdmaFault::QpStall {
                qpn: spec.require("qpn", u32_value)?,
            },
            "port-down" => ErdmaFault::PortDown,
            _ => ErdmaFault::PortUp,
        })
    }
}

/// The device's fault state.
#[derive(Debug, Default)]
pub(crate) struct Faults {
    /// The rules.
    pub(crate) rules: FaultRules<ErdmaFault>,
    /// The port is down: by a rule (`Some(Some(id))`) or by `set_link`
    /// (`Some(None)`).
    pub(crate) port_down: Option<Option<u32>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ctl` prints these messages: the value's parser says what it accepts,
    /// the rule's kind and parameter come from the spec.
    #[test]
    fn bad_values_say_what_is_accepted() {
        let e = |s: FaultSpec| ErdmaFault::parse(&s).unwrap_err().to_string();
        assert_eq!(
            e(FaultSpec::new("cmd-status").param("status", "0x100")),
            "device fault cmd-status: status=\"0x100\": a number 0..=255"
        );
        assert_eq!(
            e(FaultSpec::new("cmd-status").param("status", 0)),
            "device fault cmd-status: status=\"0\": a non-zero status (0 is success)"
        );
        assert_eq!(
            e(FaultSpec::new("aeq")
                .param("event", 1)
                .param("qpn", 1)
                .param("error", "maybe")),
            "device fault aeq: error=\"maybe\": yes or no"
        );
        let opcode = e(FaultSpec::new("cmdq-timeout").param("opcode", "frob"));
        assert!(
            opcode.starts_with(
                "device fault cmdq-timeout: opcode=\"frob\": a CMDQ_OPCODE_* name (QUERY_DEVICE, CREATE_QP"
            ),
            "{opcode}"
        );
        assert_eq!(
            parse_cmd_opcode("common:7"),
            Ok(CmdOpcode {
                submod: 1,
                opcode: 7
            })
        );
    }
}

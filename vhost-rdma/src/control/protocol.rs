//! The wire types of the control protocol: [`Request`], [`Reply`] and its
//! [`ReplyBody`]. Shared by the daemon and by clients
//! (`vhost-rdma ctl`, the tests); the module documentation of
//! [`crate::control`] describes the protocol.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Why a request line was not understood (before any handler saw it).
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// Not JSON, or not one of the [`Request`] kinds and their fields.
    #[error("bad request: {0}")]
    Bad(#[from] serde_json::Error),
}

/// A control request: one JSON object per line, its kind in `"cmd"`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "kebab-case")]
pub enum Request {
    /// Ports and counters.
    Status,
    /// Adds a flow rule to a port (`steering`).
    FlowRuleAdd {
        port: String,
        rule: crate::steering::FlowRuleSpec,
    },
    /// A port's flow rules.
    FlowRuleList { port: String },
    /// Removes a flow rule.
    FlowRuleDel { port: String, id: u32 },
    /// A port's RSS state and steering counters, and where the model sends
    /// the given flows (`SRC:SPORT-DST:DPORT/tcp|udp`).
    Rss {
        port: String,
        #[serde(default)]
        predict: Vec<String>,
        #[serde(default)]
        clear_flows: bool,
    },
    /// Adds a fault rule (`faults`).
    FaultAdd { rule: Box<crate::faults::FaultSpec> },
    /// Fault rules with counters, and link states.
    FaultList,
    /// Removes a fault rule.
    FaultDel { id: u32 },
    /// Sets a port's link down or up.
    Link { port: String, up: bool },
    /// Starts a pcapng capture of one port or of all.
    CaptureStart {
        file: PathBuf,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        port: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        snaplen: Option<u32>,
    },
    /// Stops the capture.
    CaptureStop,
    /// The running (or last) capture.
    CaptureStatus,
    /// Connections the protocol checker has seen, with their state.
    Flows,
    /// The checker's findings; `clear` forgets them after replying.
    Findings {
        #[serde(default)]
        clear: bool,
    },
    /// Checker settings and counters; `enabled` turns it on or off.
    Checker {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        enabled: Option<bool>,
    },
    /// Virtual hosts with their services and recent events.
    Hosts,
    /// Starts a service on a virtual host (e.g. a client towards a guest).
    HostStart {
        host: String,
        service: crate::config::ServiceRequest,
    },
    /// Stops a virtual host's service.
    HostStop { host: String, id: u32 },
}

impl Request {
    /// Parses one request line.
    pub fn parse(line: &str) -> Result<Request, RequestError> {
        Ok(serde_json::from_str::<Request>(line)?)
    }
}

/// A control reply: `ok`, `error` when refused, and the body's fields (at
/// the top level of the object, as the protocol always had them).
#[derive(Debug, Serialize, Deserialize)]
pub struct Reply {
    /// Whether the request was carried out.
    pub ok: bool,
    /// Why not (only when `ok` is false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What the request asked for; none for a bare acknowledgement or a
    /// refusal.
    #[serde(flatten)]
    pub body: Option<ReplyBody>,
}

/// The answer of a reply, one variant per kind. Serialized without a tag: the
/// variant's fields are the reply's top-level keys (`status`, `rules` and
/// `rule_id`, ...), so the JSON is what scripts have always parsed.
/// Deserialization tries the variants in order, so a variant comes before
/// any other whose fields are a subset of its own (`RuleAdded` before
/// `Rules`).
#[derive(Debug, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ReplyBody {
    /// `status`: ports and counters.
    Status {
        /// The status.
        status: Status,
    },
    /// `rss`: a port's RSS state, counters and predictions.
    Rss {
        /// The port's RSS status.
        rss: crate::steering::RssStatus,
    },
    /// `flow-rule-add`: the port's rules and the new rule's id.
    RuleAdded {
        /// The port's rules.
        rules: Vec<crate::steering::RuleInfo>,
        /// The new rule's id.
        rule_id: u32,
    },
    /// `flow-rule-list`, `flow-rule-del`: the port's rules.
    Rules {
        /// The port's rules.
        rules: Vec<crate::steering::RuleInfo>,
    },
    /// `fault-add`: the fault rules and link states, and the new rule's id.
    FaultAdded {
        /// Fault rules and link states.
        faults: crate::faults::FaultsStatus,
        /// The new rule's id.
        fault_id: u32,
    },
    /// `fault-list`, `fault-del`, `link`: fault rules and link states.
    Faults {
        /// Fault rules and link states.
        faults: crate::faults::FaultsStatus,
    },
    /// `capture-start`, `capture-stop`, `capture-status`.
    Capture {
        /// The running, stopped or last capture.
        capture: crate::capture::CaptureStatus,
    },
    /// `flows`: the checker's connections and its counters.
    Flows {
        /// Connections with their state.
        flows: wire_checker::FlowsView,
        /// Checker settings and counters.
        checker: crate::checker::CheckerStatus,
    },
    /// `findings`: the checker's findings and its counters.
    Findings {
        /// The findings.
        findings: crate::checker::FindingsReply,
        /// Checker settings and counters.
        checker: crate::checker::CheckerStatus,
    },
    /// `checker`: checker settings and counters.
    Checker {
        /// Checker settings and counters.
        checker: crate::checker::CheckerStatus,
    },
    /// `hosts`: the virtual hosts.
    Hosts {
        /// Each host with its services and recent events.
        hosts: Vec<crate::hosts::HostStats>,
    },
    /// `host-start`: the new service's id.
    ServiceStarted {
        /// The service's id (for `host-stop`).
        service_id: u32,
    },
}

impl Reply {
    /// A reply to a request carried out.
    pub fn ok(body: Option<ReplyBody>) -> Reply {
        Reply {
            ok: true,
            error: None,
            body,
        }
    }

    /// A refusal saying why.
    pub fn refused(error: impl std::fmt::Display) -> Reply {
        Reply {
            ok: false,
            error: Some(error.to_string()),
            body: None,
        }
    }

    /// The `status` of a `status` reply.
    pub fn into_status(self) -> Option<Status> {
        match self.body? {
            ReplyBody::Status { status } => Some(status),
            _ => None,
        }
    }

    /// The `rss` of an `rss` reply.
    pub fn into_rss(self) -> Option<crate::steering::RssStatus> {
        match self.body? {
            ReplyBody::Rss { rss } => Some(rss),
            _ => None,
        }
    }

    /// The `rules` of a flow rule reply.
    pub fn into_rules(self) -> Option<Vec<crate::steering::RuleInfo>> {
        match self.body? {
            ReplyBody::RuleAdded { rules, .. } | ReplyBody::Rules { rules } => Some(rules),
            _ => None,
        }
    }

    /// The `rule_id` of a `flow-rule-add` reply.
    pub fn rule_id(&self) -> Option<u32> {
        match self.body {
            Some(ReplyBody::RuleAdded { rule_id, .. }) => Some(rule_id),
            _ => None,
        }
    }

    /// The `faults` of a fault or link reply.
    pub fn into_faults(self) -> Option<crate::faults::FaultsStatus> {
        match self.body? {
            ReplyBody::FaultAdded { faults, .. } | ReplyBody::Faults { faults } => Some(faults),
            _ => None,
        }
    }

    /// The `fault_id` of a `fault-add` reply.
    pub fn fault_id(&self) -> Option<u32> {
        match self.body {
            Some(ReplyBody::FaultAdded { fault_id, .. }) => Some(fault_id),
            _ => None,
        }
    }

    /// The `capture` of a capture reply.
    pub fn into_capture(self) -> Option<crate::capture::CaptureStatus> {
        match self.body? {
            ReplyBody::Capture { capture } => Some(capture),
            _ => None,
        }
    }

    /// The `flows` of a `flows` reply.
    pub fn into_flows(self) -> Option<wire_checker::FlowsView> {
        match self.body? {
            ReplyBody::Flows { flows, .. } => Some(flows),
            _ => None,
        }
    }

    /// The `findings` of a `findings` reply.
    pub fn into_findings(self) -> Option<crate::checker::FindingsReply> {
        match self.body? {
            ReplyBody::Findings { findings, .. } => Some(findings),
            _ => None,
        }
    }

    /// The `checker` of a `flows`, `findings` or `checker` reply.
    pub fn into_checker(self) -> Option<crate::checker::CheckerStatus> {
        match self.body? {
            ReplyBody::Flows { checker, .. }
            | ReplyBody::Findings { checker, .. }
            | ReplyBody::Checker { checker } => Some(checker),
            _ => None,
        }
    }

    /// The `hosts` of a `hosts` reply.
    pub fn into_hosts(self) -> Option<Vec<crate::hosts::HostStats>> {
        match self.body? {
            ReplyBody::Hosts { hosts } => Some(hosts),
            _ => None,
        }
    }

    /// The `service_id` of a `host-start` reply.
    pub fn service_id(&self) -> Option<u32> {
        match self.body {
            Some(ReplyBody::ServiceStarted { service_id }) => Some(service_id),
            _ => None,
        }
    }
}

/// Reply to `status`.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Status {
    pub ports: Vec<crate::PortStats>,
    pub mac_table_full: u64,
    /// erdma frames to MAC zero whose IPv4 destination no ARP announced.
    #[serde(default)]
    pub rdma_unresolved: u64,
    /// Control connections refused at `[limits] control-connections`.
    #[serde(default)]
    pub control_refused: u64,
    /// Fault rules refused at `[limits] fault-rules`.
    #[serde(default)]
    pub fault_rules_refused: u64,
    /// Flow rules refused at `[limits] flow-rules`.
    #[serde(default)]
    pub flow_rules_refused: u64,
    /// Protocol checker counters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checker: Option<crate::checker::CheckerStatus>,
    /// Virtual hosts.
    #[serde(default)]
    pub hosts: Vec<crate::hosts::HostStats>,
    /// Ports that are emulated PCI devices (`kind=gve`).
    #[serde(default)]
    pub devices: Vec<crate::device_port::DeviceStatus>,
    /// Uplink ports (`kind=vxlan`, `kind=tap`): settings and counters.
    #[serde(default)]
    pub uplinks: Vec<crate::uplink::UplinkStatus>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::CaptureStatus;
    use crate::checker::{CheckerStatus, FindingsReply};
    use crate::faults::FaultsStatus;
    use crate::hosts::HostStats;
    use crate::steering::{RssStatus, RuleInfo};

    /// The reply as it was before its body became an enum, attributes and
    /// field order as they were: the reference for the wire shape.
    #[derive(Default, Serialize)]
    struct OldReply {
        ok: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        status: Option<Status>,
        #[serde(skip_serializing_if = "Option::is_none")]
        rss: Option<RssStatus>,
        #[serde(skip_serializing_if = "Option::is_none")]
        rules: Option<Vec<RuleInfo>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        rule_id: Option<u32>,
        #[serde(skip_serializing_if = "Option::is_none")]
        faults: Option<FaultsStatus>,
        #[serde(skip_serializing_if = "Option::is_none")]
        fault_id: Option<u32>,
        #[serde(skip_serializing_if = "Option::is_none")]
        capture: Option<CaptureStatus>,
        #[serde(skip_serializing_if = "Option::is_none")]
        flows: Option<wire_checker::FlowsView>,
        #[serde(skip_serializing_if = "Option::is_none")]
        findings: Option<FindingsReply>,
        #[serde(skip_serializing_if = "Option::is_none")]
        checker: Option<CheckerStatus>,
        #[serde(skip_serializing_if = "Option::is_none")]
        hosts: Option<Vec<HostStats>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        service_id: Option<u32>,
    }

    fn status() -> Status {
        Status {
            ports: vec![crate::PortStats {
                name: "a".into(),
                ..Default::default()
            }],
            mac_table_full: 7,
            checker: Some(checker()),
            ..Default::default()
        }
    }

    fn rules() -> Vec<RuleInfo> {
        vec![RuleInfo {
            id: 3,
            hits: 5,
            ..Default::default()
        }]
    }

    fn faults() -> FaultsStatus {
        FaultsStatus {
            delayed: 2,
            ..Default::default()
        }
    }

    fn checker() -> CheckerStatus {
        CheckerStatus {
            enabled: true,
            ..Default::default()
        }
    }

    fn capture() -> CaptureStatus {
        CaptureStatus {
            running: true,
            records: 4,
            ..Default::default()
        }
    }

    fn hosts() -> Vec<HostStats> {
        vec![HostStats {
            name: "h".into(),
            ..Default::default()
        }]
    }

    /// Every kind of reply, as the daemon builds it now and as the old
    /// struct had it.
    fn pairs() -> Vec<(Reply, OldReply)> {
        let ok = || OldReply {
            ok: true,
            ..Default::default()
        };
        let body = |b| Reply::ok(Some(b));
        vec![
            (Reply::ok(None), ok()),
            (
                Reply::refused("no virtual host named \"x\""),
                OldReply {
                    error: Some("no virtual host named \"x\"".into()),
                    ..Default::default()
                },
            ),
            (
                body(ReplyBody::Status { status: status() }),
                OldReply {
                    status: Some(status()),
                    ..ok()
                },
            ),
            (
                body(ReplyBody::Rss {
                    rss: RssStatus {
                        port: "a".into(),
                        ..Default::default()
                    },
                }),
                OldReply {
                    rss: Some(RssStatus {
                        port: "a".into(),
                        ..Default::default()
                    }),
                    ..ok()
                },
            ),
            (
                body(ReplyBody::RuleAdded {
                    rules: rules(),
                    rule_id: 3,
                }),
                OldReply {
                    rules: Some(rules()),
                    rule_id: Some(3),
                    ..ok()
                },
            ),
            (
                body(ReplyBody::Rules { rules: rules() }),
                OldReply {
                    rules: Some(rules()),
                    ..ok()
                },
            ),
            (
                body(ReplyBody::FaultAdded {
                    faults: faults(),
                    fault_id: 9,
                }),
                OldReply {
                    faults: Some(faults()),
                    fault_id: Some(9),
                    ..ok()
                },
            ),
            (
                body(ReplyBody::Faults { faults: faults() }),
                OldReply {
                    faults: Some(faults()),
                    ..ok()
                },
            ),
            (
                body(ReplyBody::Capture { capture: capture() }),
                OldReply {
                    capture: Some(capture()),
                    ..ok()
                },
            ),
            (
                body(ReplyBody::Flows {
                    flows: Default::default(),
                    checker: checker(),
                }),
                OldReply {
                    flows: Some(Default::default()),
                    checker: Some(checker()),
                    ..ok()
                },
            ),
            (
                body(ReplyBody::Findings {
                    findings: FindingsReply {
                        total: 2,
                        ..Default::default()
                    },
                    checker: checker(),
                }),
                OldReply {
                    findings: Some(FindingsReply {
                        total: 2,
                        ..Default::default()
                    }),
                    checker: Some(checker()),
                    ..ok()
                },
            ),
            (
                body(ReplyBody::Checker { checker: checker() }),
                OldReply {
                    checker: Some(checker()),
                    ..ok()
                },
            ),
            (
                body(ReplyBody::Hosts { hosts: hosts() }),
                OldReply {
                    hosts: Some(hosts()),
                    ..ok()
                },
            ),
            (
                body(ReplyBody::ServiceStarted { service_id: 2 }),
                OldReply {
                    service_id: Some(2),
                    ..ok()
                },
            ),
        ]
    }

    /// Each reply is, byte for byte, what the old struct sent, and reads back
    /// as the same reply (the right variant: re-sending it gives the same
    /// bytes).
    #[test]
    fn replies_keep_the_old_wire_shape_and_round_trip() {
        for (new, old) in pairs() {
            let sent = serde_json::to_string(&new).unwrap();
            assert_eq!(sent, serde_json::to_string(&old).unwrap());
            let back: Reply = serde_json::from_str(&sent).unwrap();
            assert_eq!(serde_json::to_string(&back).unwrap(), sent, "{back:?}");
        }
    }

    #[test]
    fn exact_json_of_some_replies() {
        let json = |r: &Reply| serde_json::to_string(r).unwrap();
        assert_eq!(json(&Reply::ok(None)), r#"{"ok":true}"#);
        assert_eq!(
            json(&Reply::refused("no capture runs")),
            r#"{"ok":false,"error":"no capture runs"}"#
        );
        assert_eq!(
            json(&Reply::ok(Some(ReplyBody::RuleAdded {
                rules: vec![],
                rule_id: 3
            }))),
            r#"{"ok":true,"rules":[],"rule_id":3}"#
        );
        assert_eq!(
            json(&Reply::ok(Some(ReplyBody::ServiceStarted {
                service_id: 2
            }))),
            r#"{"ok":true,"service_id":2}"#
        );
    }

    /// Replies as older daemons wrote them (and as scripts know them) read
    /// as the right variant; accessors find each field.
    #[test]
    fn old_replies_parse() {
        let r: Reply = serde_json::from_str(r#"{"ok":true,"rules":[],"rule_id":3}"#).unwrap();
        assert!(matches!(
            r.body,
            Some(ReplyBody::RuleAdded { rule_id: 3, .. })
        ));
        assert_eq!(r.rule_id(), Some(3));
        assert_eq!(r.into_rules(), Some(vec![]));
        let r: Reply = serde_json::from_str(r#"{"ok":true,"rules":[]}"#).unwrap();
        assert!(matches!(r.body, Some(ReplyBody::Rules { .. })));
        assert_eq!(r.rule_id(), None);
        let r: Reply = serde_json::from_str(r#"{"ok":true,"service_id":2}"#).unwrap();
        assert_eq!(r.service_id(), Some(2));
        let r: Reply = serde_json::from_str(r#"{"ok":true}"#).unwrap();
        assert!(r.ok && r.body.is_none());
        let r: Reply = serde_json::from_str(r#"{"ok":false,"error":"nope"}"#).unwrap();
        assert!(!r.ok && r.body.is_none());
        assert_eq!(r.error.as_deref(), Some("nope"));
        let old_status = serde_json::to_string(&OldReply {
            ok: true,
            status: Some(status()),
            ..Default::default()
        })
        .unwrap();
        let r: Reply = serde_json::from_str(&old_status).unwrap();
        let st = r.into_status().unwrap();
        assert_eq!((st.ports[0].name.as_str(), st.mac_table_full), ("a", 7));
        assert!(st.checker.unwrap().enabled);
        let old_flows = serde_json::to_string(&OldReply {
            ok: true,
            flows: Some(Default::default()),
            checker: Some(checker()),
            ..Default::default()
        })
        .unwrap();
        let r: Reply = serde_json::from_str(&old_flows).unwrap();
        assert!(matches!(r.body, Some(ReplyBody::Flows { .. })));
        assert!(r.into_checker().unwrap().enabled);
    }

    /// A malformed request is refused in the words it always was.
    #[test]
    fn bad_requests_keep_their_message() {
        for line in ["", "nope", r#"{"cmd":"nope"}"#, r#"{"cmd":"fault-del"}"#] {
            let e = Request::parse(line).unwrap_err();
            let serde = serde_json::from_str::<Request>(line).unwrap_err();
            assert_eq!(e.to_string(), format!("bad request: {serde}"));
        }
        assert!(matches!(
            Request::parse(r#"{"cmd":"fault-del","id":4}"#),
            Ok(Request::FaultDel { id: 4 })
        ));
    }
}

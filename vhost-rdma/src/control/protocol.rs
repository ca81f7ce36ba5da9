//! The wire types of the control protocol: [`Request`], [`Reply`] and its
//! [`ReplyBody`], and the version rule. Shared by the daemon and by clients
//! (`vhost-rdma ctl`, the tests); the module documentation of
//! [`crate::control`] describes the protocol.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The control protocol version this daemon speaks. Every reply carries it;
/// a request may name the version it speaks (absent: 1), and one this
/// daemon does not speak is refused rather than half-understood.
pub const PROTOCOL_VERSION: u32 = 1;

/// The lowest protocol version this daemon speaks.
pub const MIN_PROTOCOL_VERSION: u32 = 1;

/// The versions spoken, as the refusal of another version words them.
fn spoken_versions() -> String {
    if MIN_PROTOCOL_VERSION == PROTOCOL_VERSION {
        format!("version {PROTOCOL_VERSION} only")
    } else {
        format!("versions {MIN_PROTOCOL_VERSION} to {PROTOCOL_VERSION}")
    }
}

/// A request or reply without `"version"` is of version 1 (what every
/// client and daemon spoke before the field existed).
fn first_version() -> u32 {
    1
}

/// Why a request line was not understood (before any handler saw it).
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// Not JSON, or not one of the [`Request`] kinds and their fields.
    #[error("bad request: {0}")]
    Bad(#[from] serde_json::Error),
    /// The client speaks a protocol version this daemon does not.
    #[error(
        "control protocol version {0} is not spoken by this daemon (it speaks {versions}); use the vhost-rdma ctl of the daemon's release",
        versions = spoken_versions()
    )]
    Version(u32),
}

/// A control request: one JSON object per line, its kind in `"cmd"`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "kebab-case")]
pub enum Request {
    /// Ports and counters.
    Status,
    /// Adds a flow rule to a port (`steering`).
    FlowRuleAdd {
        /// The port's name.
        port: String,
        /// The rule.
        rule: crate::steering::FlowRuleSpec,
    },
    /// A port's flow rules.
    FlowRuleList {
        /// The port's name.
        port: String,
    },
    /// Removes a flow rule.
    FlowRuleDel {
        /// The port's name.
        port: String,
        /// The rule's id.
        id: u32,
    },
    /// A port's RSS state and steering counters, and where the model sends
    /// the given flows (`SRC:SPORT-DST:DPORT/tcp|udp`).
    Rss {
        /// The port's name.
        port: String,
        /// Flows to predict the queue of.
        #[serde(default)]
        predict: Vec<String>,
        /// Forget the flows seen so far first (the reply lists none).
        #[serde(default)]
        clear_flows: bool,
    },
    /// Adds a fault rule (`faults`).
    FaultAdd {
        /// The rule.
        rule: Box<crate::faults::FaultSpec>,
    },
    /// Fault rules with counters, and link states.
    FaultList,
    /// Removes a fault rule.
    FaultDel {
        /// The rule's id.
        id: u32,
    },
    /// Sets a port's link down or up.
    Link {
        /// The port's name.
        port: String,
        /// Up (true) or down.
        up: bool,
    },
    /// Starts a pcapng capture of one port or of all.
    CaptureStart {
        /// A new file in the capture directory.
        file: PathBuf,
        /// Only this port (default: all).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        port: Option<String>,
        /// Bytes kept of each frame (default: all).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        snaplen: Option<u32>,
    },
    /// Stops the capture.
    CaptureStop,
    /// The running (or last) capture.
    CaptureStatus,
    /// Connections the protocol checker has seen, with their state.
    Flows,
    /// The checker's findings.
    Findings {
        /// Forget them after replying.
        #[serde(default)]
        clear: bool,
    },
    /// Checker settings and counters.
    Checker {
        /// Turns the checker on or off (default: leave it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        enabled: Option<bool>,
    },
    /// Virtual hosts with their services and recent events.
    Hosts,
    /// Starts a service on a virtual host (e.g. a client towards a guest).
    HostStart {
        /// The host's name.
        host: String,
        /// The service.
        service: crate::config::ServiceRequest,
    },
    /// Stops a virtual host's service.
    HostStop {
        /// The host's name.
        host: String,
        /// The service's id.
        id: u32,
    },
    /// Adds a device fault rule to a device port (the driver bench).
    DeviceFaultAdd {
        /// The rule (its port inside).
        rule: Box<crate::ports::device::bench::DeviceFaultSpec>,
    },
    /// Every device port's fault rules with their counters.
    DeviceFaultList,
    /// Removes device fault rules: one (`id`) or all, of one port or of
    /// every device port.
    DeviceFaultClear {
        /// Only this port (default: every device port; with `id`, the one
        /// holding it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        port: Option<String>,
        /// Only this rule (default: all).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<u32>,
    },
    /// The fault kinds a device port offers.
    DeviceFaultKinds {
        /// The port's name.
        port: String,
    },
    /// Starts a device port's trace (into the in-memory ring, and a new
    /// file in the capture directory if given).
    TraceStart {
        /// The port's name.
        port: String,
        /// A plain file name, created in the capture directory.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        file: Option<PathBuf>,
    },
    /// Stops a device port's trace.
    TraceStop {
        /// The port's name.
        port: String,
    },
    /// A device port's trace status and the lines its ring holds.
    TraceShow {
        /// The port's name.
        port: String,
    },
    /// Streams a device port's trace: after the reply line (`trace`), the
    /// connection carries trace lines, one per line, until the client
    /// closes it. Only as a connection's first request.
    TraceFollow {
        /// The port's name.
        port: String,
    },
}

impl Request {
    /// Parses one request line. The `"version"` field (absent: 1) is checked
    /// first: a newer client's request may use kinds or fields this daemon
    /// does not know, and "not this version" is the useful answer.
    pub fn parse(line: &str) -> Result<Request, RequestError> {
        /// The version field alone (the request's other fields ignored).
        #[derive(Deserialize)]
        struct Versioned {
            #[serde(default = "first_version")]
            version: u32,
        }
        let versioned = serde_json::from_str::<Versioned>(line);
        if let Ok(Versioned { version }) = versioned {
            if !(MIN_PROTOCOL_VERSION..=PROTOCOL_VERSION).contains(&version) {
                return Err(RequestError::Version(version));
            }
        }
        // A malformed line gets the request's own error, as it always did;
        // a well-formed request with a malformed version gets the version's.
        let req = serde_json::from_str::<Request>(line)?;
        versioned?;
        Ok(req)
    }
}

/// A request line as `vhost-rdma ctl` sends it: the request's fields and
/// the version the client speaks.
#[derive(Serialize)]
pub struct VersionedRequest<'a> {
    /// The request (its fields at the top level of the object).
    #[serde(flatten)]
    pub request: &'a Request,
    /// The client's [`PROTOCOL_VERSION`].
    pub version: u32,
}

/// A control reply: `ok`, `error` when refused, the body's fields (at the
/// top level of the object, as the protocol always had them) and `version`.
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
    /// The daemon's [`PROTOCOL_VERSION`] (absent from the replies of daemons
    /// from before versions: 1).
    #[serde(default = "first_version")]
    pub version: u32,
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
        hosts: Vec<crate::ports::host::HostStats>,
    },
    /// `host-start`: the new service's id.
    ServiceStarted {
        /// The service's id (for `host-stop`).
        service_id: u32,
    },
    /// `device-fault-add`: every device port's rules and the new rule's id.
    DeviceFaultAdded {
        /// Each device port's rules with their counters.
        device_faults: Vec<crate::ports::device::bench::DevicePortFaults>,
        /// The new rule's id (on its port).
        device_fault_id: u32,
    },
    /// `device-fault-list`, `device-fault-clear`: every device port's rules.
    DeviceFaults {
        /// Each device port's rules with their counters.
        device_faults: Vec<crate::ports::device::bench::DevicePortFaults>,
    },
    /// `device-fault-kinds`: the kinds a device offers.
    DeviceFaultKinds {
        /// The kinds with their parameters.
        fault_kinds: Vec<crate::ports::device::bench::DeviceFaultKind>,
    },
    /// `trace-show`: the trace's status and the ring's lines.
    TraceShown {
        /// The trace's status.
        trace: crate::ports::device::trace::TraceStatus,
        /// The lines the ring holds, oldest first.
        trace_lines: Vec<String>,
    },
    /// `trace-start`, `trace-stop`, `trace-follow`: the trace's status.
    Trace {
        /// The trace's status.
        trace: crate::ports::device::trace::TraceStatus,
    },
}

impl Reply {
    /// A reply to a request carried out.
    pub fn ok(body: Option<ReplyBody>) -> Reply {
        Reply {
            ok: true,
            error: None,
            body,
            version: PROTOCOL_VERSION,
        }
    }

    /// A refusal saying why.
    pub fn refused(error: impl std::fmt::Display) -> Reply {
        Reply {
            ok: false,
            error: Some(error.to_string()),
            body: None,
            version: PROTOCOL_VERSION,
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
    pub fn into_hosts(self) -> Option<Vec<crate::ports::host::HostStats>> {
        match self.body? {
            ReplyBody::Hosts { hosts } => Some(hosts),
            _ => None,
        }
    }

    /// The `device_faults` of a device fault reply.
    pub fn into_device_faults(self) -> Option<Vec<crate::ports::device::bench::DevicePortFaults>> {
        match self.body? {
            ReplyBody::DeviceFaultAdded { device_faults, .. }
            | ReplyBody::DeviceFaults { device_faults } => Some(device_faults),
            _ => None,
        }
    }

    /// The `device_fault_id` of a `device-fault-add` reply.
    pub fn device_fault_id(&self) -> Option<u32> {
        match self.body {
            Some(ReplyBody::DeviceFaultAdded {
                device_fault_id, ..
            }) => Some(device_fault_id),
            _ => None,
        }
    }

    /// The `trace` of a trace reply.
    pub fn into_trace(self) -> Option<crate::ports::device::trace::TraceStatus> {
        match self.body? {
            ReplyBody::Trace { trace } | ReplyBody::TraceShown { trace, .. } => Some(trace),
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
    /// Every port with its counters.
    pub ports: Vec<crate::PortStats>,
    /// Source MACs not learned because the MAC table was full.
    pub mac_table_full: u64,
    /// erdma frames to MAC zero whose IPv4 destination no ARP announced.
    #[serde(default)]
    pub rdma_unresolved: u64,
    /// Control connections refused at `[limits] control-connections`.
    #[serde(default)]
    pub control_refused: u64,
    /// Control requests refused for a protocol version this daemon does not
    /// speak.
    #[serde(default)]
    pub control_version_refused: u64,
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
    pub hosts: Vec<crate::ports::host::HostStats>,
    /// Ports that are emulated PCI devices (`kind=gve`).
    #[serde(default)]
    pub devices: Vec<crate::ports::device::DeviceStatus>,
    /// Uplink ports (`kind=vxlan`, `kind=tap`): settings and counters.
    #[serde(default)]
    pub uplinks: Vec<crate::ports::uplink::UplinkStatus>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::CaptureStatus;
    use crate::checker::{CheckerStatus, FindingsReply};
    use crate::faults::FaultsStatus;
    use crate::ports::host::HostStats;
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
        /// Not in the old struct: the one key the protocol version adds,
        /// last. `None` gives the old bytes exactly.
        #[serde(skip_serializing_if = "Option::is_none")]
        version: Option<u32>,
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

    /// Each reply is, byte for byte, what the old struct sent plus
    /// `"version":1` at the end, and reads back as the same reply (the right
    /// variant: re-sending it gives the same bytes). The old bytes, without
    /// the version, read as the same reply too.
    #[test]
    fn replies_keep_the_old_wire_shape_and_round_trip() {
        for (new, old) in pairs() {
            let sent = serde_json::to_string(&new).unwrap();
            let old_bytes = serde_json::to_string(&old).unwrap();
            let versioned = OldReply {
                version: Some(1),
                ..old
            };
            assert_eq!(sent, serde_json::to_string(&versioned).unwrap());
            for line in [&sent, &old_bytes] {
                let back: Reply = serde_json::from_str(line).unwrap();
                assert_eq!(back.version, 1);
                assert_eq!(serde_json::to_string(&back).unwrap(), sent, "{back:?}");
            }
        }
    }

    #[test]
    fn exact_json_of_some_replies() {
        let json = |r: &Reply| serde_json::to_string(r).unwrap();
        assert_eq!(json(&Reply::ok(None)), r#"{"ok":true,"version":1}"#);
        assert_eq!(
            json(&Reply::refused("no capture runs")),
            r#"{"ok":false,"error":"no capture runs","version":1}"#
        );
        assert_eq!(
            json(&Reply::ok(Some(ReplyBody::RuleAdded {
                rules: vec![],
                rule_id: 3
            }))),
            r#"{"ok":true,"rules":[],"rule_id":3,"version":1}"#
        );
        assert_eq!(
            json(&Reply::ok(Some(ReplyBody::ServiceStarted {
                service_id: 2
            }))),
            r#"{"ok":true,"service_id":2,"version":1}"#
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

    /// Requests name their version or not (1); a version this daemon does
    /// not speak is refused with the versions it does, before the request
    /// itself is looked at.
    #[test]
    fn request_versions() {
        for line in [
            r#"{"cmd":"status"}"#,
            r#"{"cmd":"status","version":1}"#,
            r#"{"version":1,"cmd":"fault-del","id":4}"#,
        ] {
            assert!(Request::parse(line).is_ok(), "{line}");
        }
        for (line, v) in [
            (r#"{"cmd":"status","version":2}"#, 2),
            (r#"{"cmd":"from-the-future","version":7}"#, 7),
            (r#"{"cmd":"status","version":0}"#, 0),
        ] {
            let e = Request::parse(line).unwrap_err();
            assert!(matches!(e, RequestError::Version(x) if x == v), "{e:?}");
            assert_eq!(
                e.to_string(),
                format!(
                    "control protocol version {v} is not spoken by this daemon (it speaks version 1 only); use the vhost-rdma ctl of the daemon's release"
                )
            );
        }
        let e = Request::parse(r#"{"cmd":"status","version":"1"}"#).unwrap_err();
        assert!(matches!(e, RequestError::Bad(_)), "{e:?}");
        assert!(e
            .to_string()
            .starts_with("bad request: invalid type: string"));
    }

    /// What the client sends: the request's fields, then the version; a
    /// daemon from before versions reads it as the bare request.
    #[test]
    fn versioned_requests() {
        let req = Request::FaultDel { id: 4 };
        let line = serde_json::to_string(&VersionedRequest {
            request: &req,
            version: PROTOCOL_VERSION,
        })
        .unwrap();
        assert_eq!(line, r#"{"cmd":"fault-del","id":4,"version":1}"#);
        assert!(matches!(
            serde_json::from_str::<Request>(&line),
            Ok(Request::FaultDel { id: 4 })
        ));
        let line = serde_json::to_string(&VersionedRequest {
            request: &Request::Status,
            version: PROTOCOL_VERSION,
        })
        .unwrap();
        assert_eq!(line, r#"{"cmd":"status","version":1}"#);
        assert!(matches!(
            serde_json::from_str::<Request>(&line),
            Ok(Request::Status)
        ));
    }
}

//! The wire types of the control protocol, shared by the daemon and its
//! clients (`vhost-rdma ctl`, the tests).

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// A control request.
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

/// A control reply.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Reply {
    pub ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss: Option<crate::steering::RssStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rules: Option<Vec<crate::steering::RuleInfo>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule_id: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub faults: Option<crate::faults::FaultsStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault_id: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capture: Option<crate::capture::CaptureStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flows: Option<wire_checker::FlowsView>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub findings: Option<crate::checker::FindingsReply>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checker: Option<crate::checker::CheckerStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hosts: Option<Vec<crate::hosts::HostStats>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_id: Option<u32>,
}

/// Reply to `status`.
#[derive(Debug, Serialize, Deserialize)]
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

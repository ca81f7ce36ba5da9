//! Multiqueue steering of a port (issue 7): flow rules, RSS and hash
//! reporting, decided by the `devmem-nic` receive model.
//!
//! * The guest configures RSS (`VIRTIO_NET_CTRL_MQ_RSS_CONFIG`) or hash
//!   reporting only (`VIRTIO_NET_CTRL_MQ_HASH_CONFIG`) over the control queue
//!   (test-device form); the host adds flow rules through the control socket
//!   or the config file (`[[port.flow-rule]]`).
//! * For every frame towards the port the fabric asks [`PortSteering::steer`]
//!   (or [`PortSteering::steer_view`] with the frame's parsed view):
//!   flow rules first (a `drop` rule drops, counted), then RSS (Toeplitz
//!   hash, indirection table), else the fabric's FNV flow hash as before.
//!   The hash value and report go into the 20-byte RX header when the guest
//!   negotiated VIRTIO_NET_F_HASH_REPORT.
//! * With nothing configured the data path takes no lock.

use crate::frame::{flow_hash_view, view, FrameView};
use crate::match_spec::{MatchError, MatchSpec};
use devmem_nic::{
    Action, FlowRule, HashConfig, Nic, NicConfig, NicError, Reason, RssConfig, RssLimits,
};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, RwLock};
use thiserror::Error;
use wire::l4::L4Proto;

/// Flow rules per port.
pub const MAX_RULES: usize = 256;
/// Flows remembered per port for `ctl rss` (later ones are only counted).
pub const MAX_FLOWS: usize = 256;

fn is_false(b: &bool) -> bool {
    !*b
}

/// A flow rule as the control socket and the config file spell it. Every
/// given field must match; `queue` or `drop` says what happens.
///
/// Unknown keys are refused (as `deny_unknown_fields` would, which serde
/// does not support next to `flatten`): see [`FLOW_RULE_FIELDS`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(remote = "Self", rename_all = "kebab-case")]
pub struct FlowRuleSpec {
    /// Rule id (unique per port); chosen by the daemon when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<u32>,
    /// Lower numbers are tried first; ties in insertion order.
    #[serde(default)]
    pub priority: u32,
    /// The L2-L4 match (the same fields as a fault rule's).
    // Deserialized next to the others by `strict_rule_serde!` below.
    #[serde(flatten, skip_deserializing)]
    pub fields: MatchSpec,
    /// Deliver to this queue pair (0-based).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<u16>,
    /// Drop matching frames (counted).
    #[serde(default, skip_serializing_if = "is_false")]
    pub drop: bool,
}

/// Every key of a [`FlowRuleSpec`], in order: the list the "unknown field"
/// error names.
pub const FLOW_RULE_FIELDS: &[&str] =
    &crate::match_spec::rule_fields::<12>(&["id", "priority"], &["queue", "drop"]);

crate::match_spec::strict_rule_serde!(FlowRuleSpec, FLOW_RULE_FIELDS);

/// Why a flow rule, an RSS configuration or a `--predict` flow is refused.
/// The messages are what the control socket, the config check and the
/// guest log show.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum SteeringError {
    /// A match field does not parse.
    #[error(transparent)]
    Match(#[from] MatchError),
    /// Neither or both of `queue` and `drop`.
    #[error("give exactly one of queue and drop")]
    Action,
    /// The NIC model refused a rule (queue, id, table size).
    #[error(transparent)]
    Nic(#[from] NicError),
    /// The guest's `VIRTIO_NET_CTRL_MQ_RSS_CONFIG` payload.
    #[error("RSS_CONFIG: {0}")]
    RssConfig(NicError),
    /// `max_tx_vq` outside the port's queue pairs.
    #[error("RSS_CONFIG: max_tx_vq {max_tx_vq} not in 1..={queue_pairs}")]
    MaxTxVq {
        /// What the guest asked for.
        max_tx_vq: u16,
        /// Queue pairs of the port.
        queue_pairs: u16,
    },
    /// The guest's `VIRTIO_NET_CTRL_MQ_HASH_CONFIG` payload.
    #[error("HASH_CONFIG: {0}")]
    HashConfig(NicError),
    /// A `--predict` flow that is not `SRC:SPORT-DST:DPORT/tcp|udp`.
    #[error("flow {0:?}: expected SRC:SPORT-DST:DPORT/tcp|udp")]
    FlowSyntax(String),
    /// A `--predict` flow with one IPv4 and one IPv6 end.
    #[error("flow {0:?}: mixes IPv4 and IPv6")]
    FlowFamilies(String),
}

/// The control socket's handlers still answer with `String` errors.
impl From<SteeringError> for String {
    fn from(e: SteeringError) -> String {
        e.to_string()
    }
}

impl FlowRuleSpec {
    /// The devmem-nic rule (queue numbers are checked against the port by
    /// the model).
    pub fn to_rule(&self, id: u32) -> Result<FlowRule, SteeringError> {
        let action = match (self.queue, self.drop) {
            (Some(q), false) => Action::Queue(q),
            (None, true) => Action::Drop,
            _ => return Err(SteeringError::Action),
        };
        Ok(FlowRule {
            id,
            priority: self.priority,
            matcher: self.fields.compile()?,
            action,
        })
    }

    /// One-line description, e.g. `proto tcp dst-port 5201 -> queue 3`.
    pub fn describe(&self) -> String {
        let v = self.fields.describe();
        let m = if v.is_empty() {
            "any".to_string()
        } else {
            v.join(" ")
        };
        let a = match (self.queue, self.drop) {
            (Some(q), _) => format!("queue {q}"),
            _ => "drop".to_string(),
        };
        format!("{m} -> {a}")
    }
}

/// The 5-tuple of a frame (ports 0 for IP without TCP/UDP).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct FlowKey {
    src: IpAddr,
    sport: u16,
    dst: IpAddr,
    dport: u16,
    proto: u8,
}

impl std::fmt::Display for FlowKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = match self.proto {
            6 => "tcp".to_string(),
            17 => "udp".to_string(),
            n => format!("ip{n}"),
        };
        write!(
            f,
            "{}-{}/{p}",
            SocketAddr::new(self.src, self.sport),
            SocketAddr::new(self.dst, self.dport)
        )
    }
}

/// How a queue was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum How {
    /// A flow rule (its id).
    Rule(u32),
    /// RSS: indirection-table bucket.
    Rss(usize),
    /// RSS on, no hash type applied: the unclassified queue.
    Unclassified,
    /// No rule, no RSS: the fabric's FNV flow hash.
    FlowHash,
}

impl std::fmt::Display for How {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            How::Rule(id) => write!(f, "rule {id}"),
            How::Rss(b) => write!(f, "rss bucket {b}"),
            How::Unclassified => write!(f, "rss unclassified"),
            How::FlowHash => write!(f, "flow hash"),
        }
    }
}

/// The steering decision for one frame towards a port.
#[derive(Clone, Copy, Debug)]
pub struct Steer {
    /// The queue pair, or `None`: a rule dropped the frame.
    pub queue: Option<usize>,
    pub how: How,
    /// For the RX header (`VIRTIO_NET_HASH_REPORT_NONE` = 0: no hash).
    pub hash_value: u32,
    pub hash_report: u16,
    key: Option<FlowKey>,
}

/// Steering counters of one queue pair.
#[derive(Debug, Default)]
pub struct SteerCounters {
    pub rss: AtomicU64,
    pub rule: AtomicU64,
    pub unclassified: AtomicU64,
    pub flow_hash: AtomicU64,
    /// Frames queued with a hash report for a guest that negotiated it.
    pub hash_reported: AtomicU64,
}

/// One flow seen towards the port (the last decision for it).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowInfo {
    /// `SRC:SPORT-DST:DPORT/PROTO`.
    pub flow: String,
    /// Queue pair, or `None` when dropped by a rule.
    pub queue: Option<u16>,
    pub how: String,
    pub hash_value: u32,
    pub hash_report: u16,
    pub frames: u64,
    /// Frames of the flow that carried the hash in a 20-byte RX header.
    pub hash_reported: u64,
}

#[derive(Debug)]
struct State {
    nic: Nic,
    specs: Vec<FlowRuleSpec>,
    hits: HashMap<u32, AtomicU64>,
    next_id: u32,
    max_tx_vq: u16,
    rss_configs: u64,
    hash_configs: u64,
    /// The last HASH_CONFIG (what reports use while RSS is off).
    hash_only: Option<HashConfig>,
}

/// Steering state of a port (lives as long as the port; the guest's RSS
/// configuration is reset with the device, the host's rules stay).
#[derive(Debug)]
pub struct PortSteering {
    state: RwLock<State>,
    /// Rules, RSS or hash configuration present (else the lock-free path).
    active: AtomicBool,
    /// Frames dropped by a `drop` rule.
    pub rule_drops: AtomicU64,
    pub queues: Vec<SteerCounters>,
    flows: Mutex<HashMap<FlowKey, FlowInfo>>,
    flows_untracked: AtomicU64,
}

fn lock_err<T>(e: std::sync::PoisonError<T>) -> T {
    e.into_inner()
}

impl PortSteering {
    /// Steering for a port with `queue_pairs` queue pairs and the configured
    /// rules.
    pub fn new(queue_pairs: u16, rules: &[FlowRuleSpec]) -> Result<Self, SteeringError> {
        let qps = queue_pairs.max(1);
        let nic = Nic::new(NicConfig {
            num_queues: qps,
            max_rules: MAX_RULES,
            rss_limits: RssLimits {
                max_key_size: usize::from(crate::virtio_net::RSS_MAX_KEY_SIZE),
                max_indirection_table_len: usize::from(
                    crate::virtio_net::RSS_MAX_INDIRECTION_TABLE_LEN,
                ),
                supported_hash_types: crate::virtio_net::RSS_SUPPORTED_HASH_TYPES,
            },
            ..NicConfig::default()
        })?;
        let s = PortSteering {
            state: RwLock::new(State {
                nic,
                specs: Vec::new(),
                hits: HashMap::new(),
                next_id: 1,
                max_tx_vq: 0,
                rss_configs: 0,
                hash_configs: 0,
                hash_only: None,
            }),
            active: AtomicBool::new(false),
            rule_drops: AtomicU64::new(0),
            queues: (0..qps).map(|_| SteerCounters::default()).collect(),
            flows: Mutex::new(HashMap::new()),
            flows_untracked: AtomicU64::new(0),
        };
        for r in rules {
            s.add_rule(r.clone())?;
        }
        Ok(s)
    }

    fn update_active(&self, st: &State) {
        let on = st.nic.rss().is_some() || !st.nic.rules().is_empty() || st.hash_configs > 0;
        self.active.store(on, Relaxed);
    }

    /// Adds a rule; returns its id.
    pub fn add_rule(&self, mut spec: FlowRuleSpec) -> Result<u32, SteeringError> {
        let mut st = self.state.write().unwrap_or_else(lock_err);
        let id = spec.id.unwrap_or(st.next_id);
        let rule = spec.to_rule(id)?;
        st.nic.add_rule(rule)?;
        spec.id = Some(id);
        st.specs.push(spec);
        st.hits.insert(id, AtomicU64::new(0));
        st.next_id = st.next_id.max(id.saturating_add(1));
        self.update_active(&st);
        Ok(id)
    }

    /// Removes a rule.
    pub fn del_rule(&self, id: u32) -> Result<(), SteeringError> {
        let mut st = self.state.write().unwrap_or_else(lock_err);
        st.nic.remove_rule(id)?;
        st.specs.retain(|s| s.id != Some(id));
        st.hits.remove(&id);
        self.update_active(&st);
        Ok(())
    }

    /// Rules in evaluation order with their hit counts.
    pub fn rules(&self) -> Vec<RuleInfo> {
        let st = self.state.read().unwrap_or_else(lock_err);
        st.nic
            .rules()
            .iter()
            .filter_map(|r| {
                let spec = st.specs.iter().find(|s| s.id == Some(r.id))?.clone();
                Some(RuleInfo {
                    id: r.id,
                    hits: st.hits.get(&r.id).map(|h| h.load(Relaxed)).unwrap_or(0),
                    description: spec.describe(),
                    rule: spec,
                })
            })
            .collect()
    }

    /// `VIRTIO_NET_CTRL_MQ_RSS_CONFIG` from the guest: parses, checks (table
    /// length and entries, key size, hash types, `max_tx_vq` in
    /// `1..=queue_pairs`) and applies. Returns `max_tx_vq`.
    pub fn set_rss_from_guest(
        &self,
        payload: &[u8],
        queue_pairs: u16,
    ) -> Result<u16, SteeringError> {
        let (cfg, max_tx_vq) =
            RssConfig::from_virtio_bytes(payload).map_err(SteeringError::RssConfig)?;
        if max_tx_vq == 0 || max_tx_vq > queue_pairs {
            return Err(SteeringError::MaxTxVq {
                max_tx_vq,
                queue_pairs,
            });
        }
        let mut st = self.state.write().unwrap_or_else(lock_err);
        st.nic
            .set_rss(Some(cfg))
            .map_err(SteeringError::RssConfig)?;
        st.max_tx_vq = max_tx_vq;
        st.rss_configs += 1;
        self.update_active(&st);
        Ok(max_tx_vq)
    }

    /// `VIRTIO_NET_CTRL_MQ_HASH_CONFIG` from the guest (hash reporting
    /// without RSS).
    pub fn set_hash_from_guest(&self, payload: &[u8]) -> Result<(), SteeringError> {
        let h = HashConfig::from_virtio_bytes(payload).map_err(SteeringError::HashConfig)?;
        let mut st = self.state.write().unwrap_or_else(lock_err);
        st.nic
            .set_hash_config(Some(h.clone()))
            .map_err(SteeringError::HashConfig)?;
        st.hash_only = Some(h);
        st.hash_configs += 1;
        self.update_active(&st);
        Ok(())
    }

    /// Device reset / new connection: forget what the guest configured.
    pub fn reset_guest_config(&self) {
        let mut st = self.state.write().unwrap_or_else(lock_err);
        let _ = st.nic.set_rss(None);
        let _ = st.nic.set_hash_config(None);
        st.max_tx_vq = 0;
        st.hash_configs = 0;
        st.hash_only = None;
        self.update_active(&st);
    }

    /// Whether RSS is configured.
    pub fn rss_on(&self) -> bool {
        self.state
            .read()
            .map(|s| s.nic.rss().is_some())
            .unwrap_or(false)
    }

    /// Chooses the queue pair for a frame: rules, then RSS, else the FNV flow
    /// hash over the `active` queue pairs; a queue the guest has not enabled
    /// falls back to 0. No side effects. Parses `data`;
    /// [`steer_view`](Self::steer_view) reads a view parsed already.
    pub fn steer(&self, data: &[u8], active: usize, enabled: impl Fn(usize) -> bool) -> Steer {
        self.steer_view(&view(data), active, enabled)
    }

    /// [`steer`](Self::steer) for a frame parsed already: rules, RSS and the
    /// flow hash all read `v`.
    /// Whether [`steer_view`](Self::steer_view) would read the frame at
    /// all: only for flow rules, RSS or a flow hash over several queues. A
    /// caller may skip parsing otherwise (any view gives queue 0).
    pub fn reads_frame(&self, active: usize) -> bool {
        self.active.load(Relaxed) || active.clamp(1, self.queues.len().max(1)) > 1
    }

    pub fn steer_view(
        &self,
        v: &FrameView,
        active: usize,
        enabled: impl Fn(usize) -> bool,
    ) -> Steer {
        let n = self.queues.len();
        let mut s = Steer {
            queue: Some(0),
            how: How::FlowHash,
            hash_value: 0,
            hash_report: 0,
            key: None,
        };
        let mut want = None;
        if self.active.load(Relaxed) {
            s.key = flow_key(v);
            let d = self
                .state
                .read()
                .unwrap_or_else(lock_err)
                .nic
                .classify_parsed(v);
            s.hash_value = d.hash_value;
            s.hash_report = d.hash_report.code();
            s.how = match d.reason {
                Reason::Rule { id } => How::Rule(id),
                Reason::Rss { bucket, .. } => How::Rss(bucket),
                Reason::Unclassified => How::Unclassified,
                Reason::Default => How::FlowHash,
            };
            if s.how != How::FlowHash {
                match d.queue {
                    None => {
                        s.queue = None;
                        return s;
                    }
                    Some(q) => want = Some(usize::from(q)),
                }
            }
        }
        let q = want.unwrap_or_else(|| {
            let active = active.clamp(1, n);
            if active == 1 {
                0
            } else {
                flow_hash_view(v) as usize % active
            }
        });
        s.queue = Some(if q < n && (q == 0 || enabled(q)) {
            q
        } else {
            0
        });
        s
    }

    /// Counts a decision the fabric acted on (`hash_reported`: the frame
    /// goes out with the hash in its header).
    pub fn record(&self, s: &Steer, hash_reported: bool) {
        let Some(q) = s.queue else {
            self.rule_drops.fetch_add(1, Relaxed);
            self.count_rule(s);
            self.track(s, false);
            return;
        };
        if let Some(c) = self.queues.get(q) {
            let ctr = match s.how {
                How::Rule(_) => &c.rule,
                How::Rss(_) => &c.rss,
                How::Unclassified => &c.unclassified,
                How::FlowHash => &c.flow_hash,
            };
            ctr.fetch_add(1, Relaxed);
            if hash_reported {
                c.hash_reported.fetch_add(1, Relaxed);
            }
        }
        self.count_rule(s);
        self.track(s, hash_reported);
    }

    fn count_rule(&self, s: &Steer) {
        if let How::Rule(id) = s.how {
            if let Some(h) = self.state.read().unwrap_or_else(lock_err).hits.get(&id) {
                h.fetch_add(1, Relaxed);
            }
        }
    }

    fn track(&self, s: &Steer, hash_reported: bool) {
        let Some(k) = s.key else { return };
        let mut flows = self.flows.lock().unwrap_or_else(lock_err);
        if !flows.contains_key(&k) && flows.len() >= MAX_FLOWS {
            self.flows_untracked.fetch_add(1, Relaxed);
            return;
        }
        let f = flows.entry(k).or_insert_with(|| FlowInfo {
            flow: k.to_string(),
            ..FlowInfo::default()
        });
        f.queue = s.queue.map(|q| q as u16);
        f.how = s.how.to_string();
        f.hash_value = s.hash_value;
        f.hash_report = s.hash_report;
        f.frames += 1;
        f.hash_reported += u64::from(hash_reported);
    }

    /// Forgets the remembered flows (`ctl rss --clear-flows`).
    pub fn clear_flows(&self) {
        self.flows.lock().unwrap_or_else(lock_err).clear();
        self.flows_untracked.store(0, Relaxed);
    }
}

fn flow_key(v: &FrameView) -> Option<FlowKey> {
    let (src, dst, proto) = (v.src_ip()?, v.dst_ip()?, v.ip_protocol()?);
    let (sport, dport, proto) = match v.l4 {
        Some(l4) => (
            l4.src_port,
            l4.dst_port,
            match l4.proto {
                L4Proto::Tcp => 6,
                L4Proto::Udp => 17,
            },
        ),
        None => (0, 0, proto),
    };
    Some(FlowKey {
        src,
        sport,
        dst,
        dport,
        proto,
    })
}

/// Name of a `VIRTIO_NET_HASH_REPORT_*` code.
pub fn report_name(code: u16) -> &'static str {
    match code {
        0 => "none",
        1 => "ipv4",
        2 => "tcpv4",
        3 => "udpv4",
        4 => "ipv6",
        5 => "tcpv6",
        6 => "udpv6",
        7 => "ipv6-ex",
        8 => "tcpv6-ex",
        9 => "udpv6-ex",
        _ => "?",
    }
}

/// Names of the `VIRTIO_NET_RSS_HASH_TYPE_*` bits set in `t`.
pub fn hash_type_names(t: u32) -> Vec<String> {
    const N: [&str; 9] = [
        "ipv4", "tcpv4", "udpv4", "ipv6", "tcpv6", "udpv6", "ip-ex", "tcp-ex", "udp-ex",
    ];
    (0..9)
        .filter(|b| t & (1 << b) != 0)
        .map(|b| N[b].to_string())
        .collect()
}

/// A rule as listed by `flow-rule list`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleInfo {
    pub id: u32,
    pub hits: u64,
    pub description: String,
    pub rule: FlowRuleSpec,
}

/// Steering counters of one queue pair, with its RX counters.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueSteerStats {
    pub queue: u16,
    pub rx_frames: u64,
    pub rx_drops: u64,
    pub rss: u64,
    pub rule: u64,
    pub unclassified: u64,
    pub flow_hash: u64,
    pub hash_reported: u64,
}

/// Where the model sends a flow (`ctl rss --predict`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prediction {
    pub flow: String,
    /// Queue pair, or `None` when a rule drops it.
    pub queue: Option<u16>,
    pub how: String,
    pub hash_value: u32,
    pub hash_report: u16,
    pub hash_report_name: String,
}

/// Reply to `rss`: the port's RSS state and counters.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RssStatus {
    pub port: String,
    pub connected: bool,
    pub rss_negotiated: bool,
    pub hash_report_negotiated: bool,
    /// `rss` (RSS_CONFIG received), `hash-only` (HASH_CONFIG), or `off`.
    pub mode: String,
    pub hash_types: u32,
    pub hash_type_names: Vec<String>,
    /// Key in hex.
    pub key: String,
    pub indirection_table: Vec<u16>,
    pub unclassified_queue: u16,
    pub max_tx_vq: u16,
    pub active_queue_pairs: u16,
    pub rss_configs: u64,
    pub rules: usize,
    pub rule_drops: u64,
    pub queues: Vec<QueueSteerStats>,
    pub flows: Vec<FlowInfo>,
    pub flows_untracked: u64,
    pub predictions: Vec<Prediction>,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Parses `SRC:SPORT-DST:DPORT/tcp|udp` (IPv6 as `[ADDR]:PORT`).
pub fn parse_flow(s: &str) -> Result<(SocketAddr, SocketAddr, bool), SteeringError> {
    let bad = || SteeringError::FlowSyntax(s.to_string());
    let (addrs, proto) = s.rsplit_once('/').ok_or_else(bad)?;
    let tcp = match proto.to_ascii_lowercase().as_str() {
        "tcp" => true,
        "udp" => false,
        _ => return Err(bad()),
    };
    let (a, b) = addrs.split_once('-').ok_or_else(bad)?;
    let a: SocketAddr = a.parse().map_err(|_| bad())?;
    let b: SocketAddr = b.parse().map_err(|_| bad())?;
    if a.is_ipv4() != b.is_ipv4() {
        return Err(SteeringError::FlowFamilies(s.to_string()));
    }
    Ok((a, b, tcp))
}

/// The model's decision for a flow towards `port`, as the data path would
/// take it now.
pub fn predict(flow: &str, steer: impl Fn(&[u8]) -> Steer) -> Result<Prediction, SteeringError> {
    use wire::builder::FrameBuilder;
    let (a, b, tcp) = parse_flow(flow)?;
    let fb = if tcp {
        FrameBuilder::tcp(a.ip(), a.port(), b.ip(), b.port())
    } else {
        FrameBuilder::udp(a.ip(), a.port(), b.ip(), b.port())
    };
    let s = steer(&fb.build(&[0u8; 16]));
    Ok(Prediction {
        flow: flow.to_string(),
        queue: s.queue.map(|q| q as u16),
        how: s.how.to_string(),
        hash_value: s.hash_value,
        hash_report: s.hash_report,
        hash_report_name: report_name(s.hash_report).to_string(),
    })
}

/// What the RSS status shows of the port itself (the steering state is the
/// port's [`PortSteering`]).
#[derive(Debug, Clone)]
pub struct PortView<'a> {
    /// Port name.
    pub name: &'a str,
    /// A guest is connected.
    pub connected: bool,
    /// Virtio features the guest acked.
    pub features: u64,
    /// Queue pairs in use.
    pub active_queue_pairs: u16,
    /// Per queue pair: RX frames and RX drops.
    pub rx: Vec<(u64, u64)>,
}

/// The RSS status of a port.
pub fn status(st_: &PortSteering, port: PortView<'_>) -> RssStatus {
    use virtio_bindings::bindings::virtio_net::{VIRTIO_NET_F_HASH_REPORT, VIRTIO_NET_F_RSS};
    let feats = port.features;
    let st = st_.state.read().unwrap_or_else(lock_err);
    let rss = st.nic.rss().cloned();
    let mode = if rss.is_some() {
        "rss"
    } else if st.hash_configs > 0 {
        "hash-only"
    } else {
        "off"
    };
    let hash = rss
        .as_ref()
        .map(|r| r.hash.clone())
        .or_else(|| st.hash_only.clone())
        .unwrap_or_default();
    let hash_types = if mode == "off" { 0 } else { hash.hash_types };
    let mut flows: Vec<FlowInfo> = st_
        .flows
        .lock()
        .unwrap_or_else(lock_err)
        .values()
        .cloned()
        .collect();
    flows.sort_by(|a, b| a.flow.cmp(&b.flow));
    RssStatus {
        port: port.name.to_string(),
        connected: port.connected,
        rss_negotiated: feats & (1u64 << VIRTIO_NET_F_RSS) != 0,
        hash_report_negotiated: feats & (1u64 << VIRTIO_NET_F_HASH_REPORT) != 0,
        mode: mode.into(),
        hash_types,
        hash_type_names: hash_type_names(hash_types),
        key: if mode == "off" {
            String::new()
        } else {
            hex(&hash.key)
        },
        indirection_table: rss
            .as_ref()
            .map(|r| r.indirection_table.clone())
            .unwrap_or_default(),
        unclassified_queue: rss.as_ref().map(|r| r.unclassified_queue).unwrap_or(0),
        max_tx_vq: st.max_tx_vq,
        active_queue_pairs: port.active_queue_pairs,
        rss_configs: st.rss_configs,
        rules: st.nic.rules().len(),
        rule_drops: st_.rule_drops.load(Relaxed),
        queues: st_
            .queues
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let (rx_frames, rx_drops) = port.rx.get(i).copied().unwrap_or((0, 0));
                QueueSteerStats {
                    queue: i as u16,
                    rx_frames,
                    rx_drops,
                    rss: c.rss.load(Relaxed),
                    rule: c.rule.load(Relaxed),
                    unclassified: c.unclassified.load(Relaxed),
                    flow_hash: c.flow_hash.load(Relaxed),
                    hash_reported: c.hash_reported.load(Relaxed),
                }
            })
            .collect(),
        flows,
        flows_untracked: st_.flows_untracked.load(Relaxed),
        predictions: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_specs_convert_and_refuse_nonsense() {
        let s = FlowRuleSpec {
            fields: MatchSpec {
                dst_ip: Some("10.0.0.0/8".into()),
                proto: Some("tcp".into()),
                dst_port: Some(5201),
                ..MatchSpec::default()
            },
            queue: Some(3),
            ..FlowRuleSpec::default()
        };
        let r = s.to_rule(7).unwrap();
        assert_eq!(r.id, 7);
        assert_eq!(r.action, Action::Queue(3));
        assert_eq!(r.matcher.ip_proto, Some(6));
        assert_eq!(
            s.describe(),
            "proto tcp dst-ip 10.0.0.0/8 dst-port 5201 -> queue 3"
        );
        for bad in [
            FlowRuleSpec::default(),
            FlowRuleSpec {
                queue: Some(1),
                drop: true,
                ..FlowRuleSpec::default()
            },
            FlowRuleSpec {
                fields: MatchSpec {
                    dst_ip: Some("10.0.0.1/33".into()),
                    ..MatchSpec::default()
                },
                drop: true,
                ..FlowRuleSpec::default()
            },
            FlowRuleSpec {
                fields: MatchSpec {
                    proto: Some("sctpx".into()),
                    ..MatchSpec::default()
                },
                drop: true,
                ..FlowRuleSpec::default()
            },
            FlowRuleSpec {
                fields: MatchSpec {
                    src_mac: Some("zz".into()),
                    ..MatchSpec::default()
                },
                drop: true,
                ..FlowRuleSpec::default()
            },
        ] {
            assert!(bad.to_rule(1).is_err(), "{bad:?}");
        }
        let st = PortSteering::new(2, &[]).unwrap();
        assert!(st
            .add_rule(FlowRuleSpec {
                queue: Some(2),
                ..FlowRuleSpec::default()
            })
            .is_err());
        assert_eq!(
            st.add_rule(FlowRuleSpec {
                drop: true,
                ..FlowRuleSpec::default()
            }),
            Ok(1)
        );
        assert!(st
            .add_rule(FlowRuleSpec {
                id: Some(1),
                drop: true,
                ..FlowRuleSpec::default()
            })
            .is_err());
        assert!(st.del_rule(1).is_ok());
        assert!(st.del_rule(1).is_err());
    }

    #[test]
    fn rule_spelling_is_unchanged_and_unknown_keys_are_refused() {
        let json = r#"{"id":4,"priority":2,"src-mac":"02:00:00:00:00:01","dst-mac":"02:00:00:00:00:02","ethertype":2048,"src-ip":"10.0.0.1","dst-ip":"10.0.0.0/8","proto":"udp","src-port":1,"dst-port":4791,"queue":1,"drop":true}"#;
        let r: FlowRuleSpec = serde_json::from_str(json).unwrap();
        assert_eq!(r.fields.dst_port, Some(4791));
        assert_eq!(
            (r.id, r.priority, r.queue, r.drop),
            (Some(4), 2, Some(1), true)
        );
        assert_eq!(serde_json::to_string(&r).unwrap(), json);
        // The error names every field, as deny_unknown_fields did.
        crate::match_spec::assert_fields_list_every_key(json, FLOW_RULE_FIELDS, "FLOW_RULE_FIELDS");
        let e = serde_json::from_str::<FlowRuleSpec>(r#"{"dst-prot":80,"drop":true}"#)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(
                "unknown field `dst-prot`, expected one of `id`, `priority`, `src-mac`, \
                 `dst-mac`, `ethertype`, `src-ip`, `dst-ip`, `proto`, `src-port`, \
                 `dst-port`, `queue`, `drop`"
            ),
            "{e}"
        );
        assert!(
            e.ends_with(" at line 1 column 27"),
            "the position is kept: {e}"
        );
        let e = toml::from_str::<FlowRuleSpec>("queue = 1\nqpn = 3\n").unwrap_err();
        assert!(e.to_string().contains("unknown field `qpn`"), "{e}");
        let t: FlowRuleSpec =
            toml::from_str("dst-port = 5201\nproto = \"tcp\"\nqueue = 2\n").unwrap();
        assert_eq!(t.describe(), "proto tcp dst-port 5201 -> queue 2");
        // A bad value inside the match still names the type.
        let e = serde_json::from_str::<FlowRuleSpec>(r#"{"dst-port":"x"}"#).unwrap_err();
        assert!(e.to_string().contains("expected u16"), "{e}");
    }

    #[test]
    fn steer_view_is_steer() {
        use wire::builder::FrameBuilder;
        let st = PortSteering::new(4, &[]).unwrap();
        let f = FrameBuilder::tcp(
            "10.0.0.1".parse().unwrap(),
            1000,
            "10.0.0.2".parse().unwrap(),
            5201,
        )
        .build(b"x");
        let q = |s: Steer| (s.queue, s.how, s.hash_value, s.hash_report);
        let all = |_| true;
        assert_eq!(q(st.steer(&f, 4, all)), q(st.steer_view(&view(&f), 4, all)));
        st.add_rule(FlowRuleSpec {
            fields: MatchSpec {
                dst_port: Some(5201),
                ..MatchSpec::default()
            },
            queue: Some(3),
            ..FlowRuleSpec::default()
        })
        .unwrap();
        let s = st.steer_view(&view(&f), 4, all);
        assert_eq!((s.queue, s.how), (Some(3), How::Rule(1)));
        assert_eq!(q(st.steer(&f, 4, all)), q(s));
    }

    #[test]
    fn hostile_rss_payloads_are_refused_without_panic() {
        let st = PortSteering::new(4, &[]).unwrap();
        let mut rng = 0x1234_5678u32;
        for len in 0..400usize {
            let mut b = vec![0u8; len];
            for x in &mut b {
                rng ^= rng << 13;
                rng ^= rng >> 17;
                rng ^= rng << 5;
                *x = rng as u8;
            }
            let _ = st.set_rss_from_guest(&b, 4);
            let _ = st.set_hash_from_guest(&b);
        }
        // A table entry beyond the queues, a mask that is not 2^n-1, a long key.
        let mk = |mask: u16, entry: u16, key_len: u8, max_tx: u16| {
            let mut b = Vec::new();
            b.extend_from_slice(&7u32.to_le_bytes());
            b.extend_from_slice(&mask.to_le_bytes());
            b.extend_from_slice(&0u16.to_le_bytes());
            for _ in 0..=mask {
                b.extend_from_slice(&entry.to_le_bytes());
            }
            b.extend_from_slice(&max_tx.to_le_bytes());
            b.push(key_len);
            b.extend(std::iter::repeat_n(0x6d, usize::from(key_len)));
            b
        };
        st.reset_guest_config();
        assert!(st.set_rss_from_guest(&mk(127, 4, 40, 4), 4).is_err());
        assert!(st.set_rss_from_guest(&mk(126, 1, 40, 4), 4).is_err());
        assert!(st.set_rss_from_guest(&mk(127, 1, 41, 4), 4).is_err());
        assert!(st.set_rss_from_guest(&mk(127, 1, 40, 5), 4).is_err());
        assert!(st.set_rss_from_guest(&mk(127, 1, 40, 0), 4).is_err());
        assert!(!st.rss_on());
        assert_eq!(st.set_rss_from_guest(&mk(127, 3, 40, 4), 4), Ok(4));
        assert!(st.rss_on());
    }

    #[test]
    fn flows_parse() {
        let (a, b, tcp) = parse_flow("10.0.0.2:5201-10.0.0.1:40001/tcp").unwrap();
        assert!(tcp);
        assert_eq!(a.port(), 5201);
        assert_eq!(b.to_string(), "10.0.0.1:40001");
        assert!(parse_flow("[fe80::1]:1-[fe80::2]:2/udp").is_ok());
        assert!(parse_flow("10.0.0.2:1-[fe80::2]:2/udp").is_err());
        assert!(parse_flow("10.0.0.2:1/udp").is_err());
        assert!(parse_flow("10.0.0.2:1-10.0.0.3:2/sctp").is_err());
    }
}

//! Daemon configuration: the `--port` flag syntax and the TOML file.

mod error;
mod port;
mod raw;

pub(crate) use error::invalid;
pub use error::ConfigError;
pub use port::{ErdmaSpec, GveSpec, PortConfig, PortSpec, TapSpec, VirtioNetSpec};

use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;
use virtual_host::ServiceSpec;

/// An Ethernet MAC address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct MacAddr(pub [u8; 6]);

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

impl FromStr for MacAddr {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        let parts: Vec<&str> = s.split(':').collect();
        if parts.len() != 6 {
            invalid!("MAC address {s:?} must have six colon-separated hex bytes");
        }
        let mut m = [0u8; 6];
        for (i, p) in parts.iter().enumerate() {
            m[i] = u8::from_str_radix(p, 16)
                .map_err(|e| ConfigError::Invalid(format!("bad byte {p:?} in MAC {s:?}: {e}")))?;
        }
        if m[0] & 1 != 0 {
            invalid!("MAC address {s} is a multicast address");
        }
        Ok(MacAddr(m))
    }
}

/// Deserializes a value of a type that parses from a string.
fn from_string<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: FromStr<Err = ConfigError>,
{
    String::deserialize(d)?
        .parse()
        .map_err(serde::de::Error::custom)
}

impl<'de> Deserialize<'de> for MacAddr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        from_string(d)
    }
}

impl<'de> Deserialize<'de> for DeviceForm {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        from_string(d)
    }
}

impl MacAddr {
    /// A stable locally administered MAC derived from a port name (52:54:00 is
    /// QEMU's prefix; guests treat it as ordinary).
    pub fn from_name(name: &str) -> Self {
        let mut h: u32 = 0x811c_9dc5;
        for b in name.bytes() {
            h ^= u32::from(b);
            h = h.wrapping_mul(0x0100_0193);
        }
        let b = h.to_be_bytes();
        MacAddr([0x52, 0x54, 0x00, b[1], b[2], b[3]])
    }
}

/// How QEMU presents the device to the guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DeviceForm {
    /// `virtio-net-pci` + `-netdev vhost-user`: QEMU owns config space and control queue.
    #[default]
    VirtioNetPci,
    /// `vhost-user-test-device-pci,virtio-id=1`: the daemon owns config space and control queue.
    TestDevice,
}

impl FromStr for DeviceForm {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        match s {
            "pci" | "virtio-net-pci" => Ok(DeviceForm::VirtioNetPci),
            "testdev" | "test-device" | "vhost-user-test-device-pci" => Ok(DeviceForm::TestDevice),
            _ => invalid!("unknown device form {s:?}: use pci or testdev"),
        }
    }
}

/// What a port presents to its guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PortKind {
    /// A vhost-user virtio-net device (in the `form` given).
    #[default]
    VirtioNet,
    /// An emulated Google gVNIC (gve, DQO RDA) served over vfio-user
    /// (`-device vfio-user-pci`): header split, flow rules, RSS, devmem RX.
    Gve,
    /// An emulated Elastic RDMA function (erdma, RoCEv2) over vfio-user,
    /// paired with the guest's virtio-net port `netdev=` (same MAC): its
    /// RC queue pairs run in the daemon.
    Erdma,
    /// An uplink to remote VTEPs: VXLAN (RFC 7348) over UDP ([`crate::vxlan`]).
    Vxlan,
    /// An uplink to a host TAP device ([`crate::ports::uplink`]).
    Tap,
}

impl PortKind {
    /// The kind's name as `kind=` and `ctl` spell it.
    pub fn name(self) -> &'static str {
        match self {
            PortKind::VirtioNet => "virtio-net",
            PortKind::Gve => "gve",
            PortKind::Erdma => "erdma",
            PortKind::Vxlan => "vxlan",
            PortKind::Tap => "tap",
        }
    }

    /// Queues a port of this kind has when `queues=` is not given: for
    /// `gve`, [`DEFAULT_GVE_QUEUES`] so devmem TCP runs out of the box; one
    /// for the others.
    pub fn default_queues(self) -> u16 {
        match self {
            PortKind::Gve => DEFAULT_GVE_QUEUES,
            _ => 1,
        }
    }

    /// Whether the port's far end is outside the host's guests (`vxlan`,
    /// `tap`): it has no socket, only its [`PortSpec`] settings.
    pub fn is_uplink(self) -> bool {
        matches!(self, PortKind::Vxlan | PortKind::Tap)
    }
}

impl FromStr for PortKind {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        match s {
            "virtio-net" | "vhost-user" => Ok(PortKind::VirtioNet),
            "gve" => Ok(PortKind::Gve),
            "erdma" => Ok(PortKind::Erdma),
            "vxlan" => Ok(PortKind::Vxlan),
            "tap" => Ok(PortKind::Tap),
            _ => invalid!("unknown port kind {s:?}: use virtio-net, gve, erdma, vxlan or tap"),
        }
    }
}

/// Default bound of each queue pair's pending queue (frames).
pub const DEFAULT_RX_QUEUE_FRAMES: usize = 1024;
/// Default bound of the frames a device port holds per device receive
/// queue that has no buffer posted (`rx-held-frames`).
pub const DEFAULT_RX_HELD_FRAMES: usize = 256;
/// Largest `rx-held-frames`.
pub const MAX_RX_HELD_FRAMES: usize = 1 << 16;
/// Default of a `kind=gve` port's `queues=` (its most TX and RX queues).
/// devmem TCP reserves receive queues out of the device's: `ncdevmem` (the
/// kernel selftest) takes the last one for the dmabuf, steers the rest of
/// the traffic away from it with RSS, and stops with "number of device
/// queues is too low" below two. The gve driver brings up every queue the
/// device offers (`gve_set_num_queues`, no `default_num_queues`), so two
/// is also what the guest has.
pub const DEFAULT_GVE_QUEUES: u16 = 2;
/// Most queue pairs a port may have (virtio-net allows 0x8000; QEMU and our
/// one-thread-per-queue-pair design want far fewer).
pub const MAX_QUEUE_PAIRS: u16 = 16;

/// Default of `[limits] stuck-guest-ms`: a guest whose frames have waited
/// this long with no RX buffer posted is reported as stuck (once in the
/// log, and in `ctl status` while it lasts).
pub const STUCK_GUEST_MS: u64 = 30_000;

/// The largest `gro-hold-us`: 100 ms (a flow held longer would stall its
/// sender's window for as long).
pub const MAX_GRO_HOLD_US: u32 = 100_000;

/// A gVNIC's MTU unless `mtu=` says otherwise: the fabric's Ethernet MTU.
pub const DEFAULT_GVE_MTU: u16 = 1500;
/// The largest gVNIC MTU a port takes (gve-device's limit: 9216-byte frames
/// and more exceed what one of its receive buffers describes).
pub const MAX_GVE_MTU: u16 = 9216;

/// RC queue-pair settings of an erdma function that its driver never
/// passes (erdma's MODIFY_QP carries no timeout, retry count or path MTU);
/// `None` keeps erdma-device's documented default.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RcSettings {
    /// ACK timeout exponent: 4.096 us * 2^n (default 16, about 268 ms).
    pub ack_timeout: Option<u8>,
    /// Transport retries before a QP errors out (default 7 = infinite, as
    /// rxe counts it).
    pub retry_cnt: Option<u8>,
    /// RNR retries, 7 = infinite (default 7).
    pub rnr_retry: Option<u8>,
    /// Minimum RNR NAK timer code (default 12, 0.64 ms).
    pub min_rnr_timer: Option<u8>,
    /// Largest path MTU in bytes: 256, 512, 1024, 2048 or 4096 (default
    /// 4096; the netdev MTU may allow less).
    pub path_mtu: Option<u32>,
    /// Most work requests the function's RC engines hold at once, the
    /// daemon's memory for its RC work (default 65536, about 16 MiB; past
    /// it work waits in the driver's rings).
    pub engine_wrs: Option<u32>,
    /// Most work requests one QP's engine holds per direction (default
    /// 4096).
    pub qp_wrs: Option<u32>,
}

impl RcSettings {
    /// Range checks.
    fn validate(&self) -> Result<(), ConfigError> {
        let small = |key: &str, v: Option<u8>, max: u8| -> Result<(), ConfigError> {
            match v {
                Some(n) if n > max => invalid!("{key}={n}: at most {max}"),
                _ => Ok(()),
            }
        };
        small("ack-timeout", self.ack_timeout, 31)?;
        small("retry-cnt", self.retry_cnt, 7)?;
        small("rnr-retry", self.rnr_retry, 7)?;
        small("min-rnr-timer", self.min_rnr_timer, 31)?;
        if let Some(n) = self.path_mtu {
            if ![256, 512, 1024, 2048, 4096].contains(&n) {
                invalid!("path-mtu={n}: one of 256, 512, 1024, 2048, 4096");
            }
        }
        for (key, v, max) in [
            ("engine-wrs", self.engine_wrs, 1 << 20),
            ("qp-wrs", self.qp_wrs, 32_768),
        ] {
            if let Some(n) = v {
                if n == 0 || n > max {
                    invalid!("{key}={n}: 1 to {max}");
                }
            }
        }
        Ok(())
    }

    /// Whether any setting is given.
    pub fn is_set(&self) -> bool {
        *self != RcSettings::default()
    }
}

/// A port or host name (`what`) must be non-empty ASCII letters, digits,
/// '-' or '_'.
fn check_name(what: &str, name: &str) -> Result<(), ConfigError> {
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        invalid!("{what} name {name:?} must be non-empty ASCII letters, digits, '-' or '_'");
    }
    Ok(())
}

/// Bounds on the tables guests and control clients can grow (`[limits]` in
/// the configuration file). Reaching one gives a clear error (control
/// replies) or a rate-limited warning (data path), and a counter.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default, rename_all = "kebab-case")]
pub struct Limits {
    /// Entries of the fabric's MAC learning table (all ports together);
    /// source MACs beyond it are not learned (their frames still flood),
    /// counted in `mac_table_full`. Default 4096.
    pub mac_table: usize,
    /// Control-socket connections served at once; more get an error reply,
    /// counted in `control_refused`. Default 16.
    pub control_connections: usize,
    /// Fault rules installed at once; more are refused, counted in
    /// `fault_rules_refused`. Default 64.
    pub fault_rules: usize,
    /// Flow-steering rules per port; more are refused, counted in
    /// `flow_rules_refused`. Default 256 (also the most allowed).
    pub flow_rules: usize,
    /// Largest capture file in bytes; later records are dropped, counted in
    /// the capture status's `limited`. Default 1 GiB.
    pub capture_max_bytes: u64,
    /// Milliseconds a guest may leave frames waiting with no RX buffer
    /// posted before it is reported stuck (a warning, once, and `stuck` in
    /// `ctl status`). Default 30000.
    pub stuck_guest_ms: u64,
    /// Largest device trace file in bytes (`ctl trace start --file`); later
    /// lines are not written, counted in the trace status's `limited`.
    /// Default 64 MiB.
    pub trace_max_bytes: u64,
}

/// Largest value of each [`Limits`] field.
pub const LIMITS_MAX: Limits = Limits {
    mac_table: 1 << 20,
    control_connections: 1024,
    fault_rules: 4096,
    flow_rules: crate::steering::MAX_RULES,
    capture_max_bytes: 1 << 40,
    stuck_guest_ms: 86_400_000,
    trace_max_bytes: 1 << 40,
};

impl Default for Limits {
    fn default() -> Self {
        Limits {
            mac_table: 4096,
            control_connections: 16,
            fault_rules: crate::faults::MAX_FAULT_RULES,
            flow_rules: crate::steering::MAX_RULES,
            capture_max_bytes: crate::capture::DEFAULT_MAX_BYTES,
            stuck_guest_ms: STUCK_GUEST_MS,
            trace_max_bytes: DEFAULT_TRACE_MAX_BYTES,
        }
    }
}

impl Limits {
    /// Checks every limit is between 1 and its [`LIMITS_MAX`] value.
    pub fn check(&self) -> Result<(), ConfigError> {
        for (name, v, max) in [
            ("mac-table", self.mac_table, LIMITS_MAX.mac_table),
            (
                "control-connections",
                self.control_connections,
                LIMITS_MAX.control_connections,
            ),
            ("fault-rules", self.fault_rules, LIMITS_MAX.fault_rules),
            ("flow-rules", self.flow_rules, LIMITS_MAX.flow_rules),
        ] {
            if v == 0 || v > max {
                invalid!("[limits] {name} = {v} must be between 1 and {max}");
            }
        }
        // At least the file header of a 16-port capture.
        let (v, max) = (self.capture_max_bytes, LIMITS_MAX.capture_max_bytes);
        if !(4096..=max).contains(&v) {
            invalid!("[limits] capture-max-bytes = {v} must be between 4096 and {max}");
        }
        let (v, max) = (self.stuck_guest_ms, LIMITS_MAX.stuck_guest_ms);
        if !(1..=max).contains(&v) {
            invalid!("[limits] stuck-guest-ms = {v} must be between 1 and {max}");
        }
        let (v, max) = (self.trace_max_bytes, LIMITS_MAX.trace_max_bytes);
        if !(1..=max).contains(&v) {
            invalid!("[limits] trace-max-bytes = {v} must be between 1 and {max}");
        }
        Ok(())
    }
}

/// A virtual host on the fabric (`virtual-host` crate): an endpoint with a
/// MAC and an IPv4 address running RDMA tool services.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostSpec {
    pub name: String,
    pub mac: MacAddr,
    pub ipv4: std::net::Ipv4Addr,
    pub prefix_len: u8,
    pub limits: virtual_host::HostLimits,
    /// Services started with the host.
    pub services: Vec<virtual_host::ServiceSpec>,
}

impl HostSpec {
    /// A host with defaults for everything but name and address.
    pub fn new(name: &str, ipv4: std::net::Ipv4Addr, prefix_len: u8) -> Self {
        HostSpec {
            name: name.to_string(),
            mac: MacAddr::from_name(&format!("host-{name}")),
            ipv4,
            prefix_len,
            limits: virtual_host::HostLimits::default(),
            services: Vec::new(),
        }
    }

    fn check(&self) -> Result<(), ConfigError> {
        check_name("host", &self.name)?;
        if self.prefix_len == 0 || self.prefix_len > 32 {
            invalid!("host {}: prefix length must be 1..=32", self.name);
        }
        if self.ipv4.is_unspecified() || self.ipv4.is_multicast() || self.ipv4.is_broadcast() {
            invalid!("host {}: {} is not a unicast address", self.name, self.ipv4);
        }
        for s in &self.services {
            s.validate()
                .map_err(|e| ConfigError::Invalid(format!("host {}: {e}", self.name)))?;
        }
        Ok(())
    }
}

/// `IP/PREFIX`.
fn parse_cidr(s: &str) -> Result<(std::net::Ipv4Addr, u8), ConfigError> {
    let Some((ip, len)) = s.split_once('/') else {
        invalid!("address {s:?} must be IPv4/PREFIX, e.g. 10.77.0.10/24");
    };
    let ip = ip
        .parse()
        .map_err(|e| ConfigError::Invalid(format!("bad IPv4 address {ip:?}: {e}")))?;
    let len = len
        .parse()
        .map_err(|e| ConfigError::Invalid(format!("bad prefix length {len:?}: {e}")))?;
    Ok((ip, len))
}

/// `KIND` or `KIND@PEER` (a client towards PEER).
fn parse_service(s: &str) -> Result<virtual_host::ServiceSpec, ConfigError> {
    let (kind, peer) = match s.split_once('@') {
        Some((k, p)) => (k, Some(p)),
        None => (s, None),
    };
    let kind: virtual_host::ServiceKind = kind
        .parse()
        .map_err(|e| ConfigError::Invalid(format!("{e}")))?;
    let mut spec = virtual_host::ServiceSpec::new(kind);
    if let Some(p) = peer {
        spec.peer = Some(
            p.parse()
                .map_err(|e| ConfigError::Invalid(format!("bad peer {p:?}: {e}")))?,
        );
    }
    Ok(spec)
}

impl FromStr for HostSpec {
    type Err = ConfigError;
    /// `NAME=IP/PREFIX[,mac=MAC][,service=KIND[@PEER]]...[,max-qps=N][,max-mrs=N][,max-tcp=N]`
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        parse_host_flag(s).map_err(|e| ConfigError::flag("host", s, e))
    }
}

fn parse_host_flag(s: &str) -> Result<HostSpec, ConfigError> {
    let mut parts = s.split(',');
    let head = parts.next().unwrap_or_default();
    let Some((name, addr)) = head.split_once('=') else {
        return Err(ConfigError::Syntax(
            "expected NAME=IP/PREFIX[,mac=MAC][,service=KIND[@PEER]]".into(),
        ));
    };
    let (ip, len) = parse_cidr(addr)?;
    let mut h = HostSpec::new(name, ip, len);
    let number = |k: &str, v: &str| -> Result<usize, ConfigError> {
        v.parse().map_err(|e: std::num::ParseIntError| {
            ConfigError::value(k, v, ConfigError::Invalid(e.to_string()))
        })
    };
    for kv in parts {
        let Some((k, v)) = kv.split_once('=') else {
            return Err(ConfigError::Syntax(format!(
                "option {kv:?} is not key=value"
            )));
        };
        match k {
            "mac" => h.mac = v.parse()?,
            "service" => h.services.push(parse_service(v)?),
            "max-qps" => h.limits.max_qps = number(k, v)?,
            "max-mrs" => h.limits.max_mrs = number(k, v)?,
            "max-tcp" => h.limits.max_tcp_sockets = number(k, v)?,
            _ => {
                return Err(ConfigError::UnknownKey {
                    key: k.to_string(),
                    accepted: "mac, service, max-qps, max-mrs, max-tcp".into(),
                })
            }
        }
    }
    h.check()?;
    Ok(h)
}

/// A device fault rule as `ctl device-fault add` and `[[device-fault]]`
/// give it.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct DeviceFaultSpec {
    /// The device port (`kind=gve` or `kind=erdma`).
    pub port: String,
    /// The fault kind (`ctl device-fault kinds --port P` lists them).
    pub kind: String,
    /// The kind's parameters (`queue=0`, `opcode=CREATE_QP`); in a config
    /// file a table whose values are strings, integers or booleans.
    #[serde(
        default,
        deserialize_with = "params_any",
        skip_serializing_if = "std::collections::BTreeMap::is_empty"
    )]
    pub params: std::collections::BTreeMap<String, String>,
    /// Fires at most this many times (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// Fires with this probability when its condition is met (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prob: Option<f64>,
    /// PRNG seed (default: the rule id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Rule id on its port (default: one more than the highest there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<u32>,
}

/// Parameter values of a config file: strings, integers or booleans, all
/// passed to the model as text.
fn params_any<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<std::collections::BTreeMap<String, String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Value {
        Str(String),
        Int(i64),
        Bool(bool),
    }
    let m = std::collections::BTreeMap::<String, Value>::deserialize(d)?;
    Ok(m.into_iter()
        .map(|(k, v)| {
            let v = match v {
                Value::Str(s) => s,
                Value::Int(i) => i.to_string(),
                Value::Bool(b) => if b { "yes" } else { "no" }.to_string(),
            };
            (k, v)
        })
        .collect())
}

impl DeviceFaultSpec {
    /// The model's view of the rule.
    pub fn to_model(&self) -> pci_model::FaultSpec {
        pci_model::FaultSpec {
            kind: self.kind.clone(),
            params: self.params.clone(),
            count: self.count,
            prob: self.prob,
            seed: self.seed,
        }
    }

    /// `kind key=value ...` as a log line shows it.
    pub fn describe(&self) -> String {
        let mut s = self.kind.clone();
        for (k, v) in &self.params {
            s.push_str(&format!(" {k}={v}"));
        }
        s
    }
}

/// Why the `KEY=VALUE` words of `ctl device-fault add` were refused (before
/// the model sees them; the model checks the keys and values).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceFaultParamError {
    /// A word without `=`.
    #[error("{0:?} is not KEY=VALUE")]
    NotKeyValue(String),
    /// A word starting with `=`.
    #[error("{0:?} has no key")]
    NoKey(String),
    /// The same key twice (which one counts would be a guess).
    #[error("parameter {0} given twice")]
    Twice(String),
}

/// Parses `KEY=VALUE` words (`ctl device-fault add ... queue=0`).
pub fn parse_device_fault_params(
    words: &[String],
) -> Result<std::collections::BTreeMap<String, String>, DeviceFaultParamError> {
    let mut m = std::collections::BTreeMap::new();
    for w in words {
        let Some((k, v)) = w.split_once('=') else {
            return Err(DeviceFaultParamError::NotKeyValue(w.clone()));
        };
        if k.is_empty() {
            return Err(DeviceFaultParamError::NoKey(w.clone()));
        }
        if m.insert(k.to_string(), v.to_string()).is_some() {
            return Err(DeviceFaultParamError::Twice(k.to_string()));
        }
    }
    Ok(m)
}

/// Default of `[limits] trace-max-bytes`: the largest device trace file.
pub const DEFAULT_TRACE_MAX_BYTES: u64 = 64 << 20;

/// Whole daemon configuration.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DaemonConfig {
    pub ports: Vec<PortConfig>,
    /// Virtual hosts (`--host`, `[[host]]`).
    pub hosts: Vec<HostSpec>,
    /// The control socket (`--control`, `control`, `$VHOST_RDMA_CONTROL`,
    /// else the daemon's own in the runtime directory); None: no control
    /// socket.
    pub control: Option<PathBuf>,
    /// Where to listen for `ctl` instead when another process serves
    /// `control` (the daemon's own socket, when `control` came from
    /// `$VHOST_RDMA_CONTROL`, a path several daemons may share). None: a
    /// served `control` stops the daemon from starting.
    pub control_fallback: Option<PathBuf>,
    /// Where `ctl capture start` may create files (`--capture-dir`,
    /// `capture-dir`); default [`crate::capture::default_capture_dir`].
    pub capture_dir: Option<PathBuf>,
    /// Fault rules installed at start (`[[fault]]`).
    pub faults: Vec<crate::faults::FaultSpec>,
    /// Device fault rules installed on device ports at start
    /// (`[[device-fault]]`).
    pub device_faults: Vec<DeviceFaultSpec>,
    /// Table bounds (`[limits]`).
    pub limits: Limits,
    /// The protocol checker (`[checker]`).
    pub checker: crate::checker::CheckerSettings,
    /// Owner, group and mode of every port socket the daemon binds
    /// (`--socket-user`, `--socket-group`, `--socket-mode`).
    pub socket_perms: crate::socket_path::SocketPerms,
    /// The CPUs the daemon's threads run on (`--cpu-affinity`,
    /// `cpu-affinity`); None: wherever the scheduler puts them.
    pub cpu_affinity: Option<crate::affinity::CpuList>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(rename_all = "kebab-case")]
struct FileConfig {
    control: Option<PathBuf>,
    capture_dir: Option<PathBuf>,
    #[serde(default, rename = "port")]
    ports: Vec<PortConfig>,
    #[serde(default, rename = "fault")]
    faults: Vec<crate::faults::FaultSpec>,
    #[serde(default, rename = "device-fault")]
    device_faults: Vec<DeviceFaultSpec>,
    #[serde(default)]
    limits: Limits,
    #[serde(default)]
    checker: crate::checker::CheckerSettings,
    #[serde(default, rename = "host")]
    hosts: Vec<FileHost>,
    cpu_affinity: Option<crate::affinity::CpuList>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct FileHost {
    name: String,
    address: String,
    mac: Option<String>,
    max_qps: Option<usize>,
    max_mrs: Option<usize>,
    max_tcp_sockets: Option<usize>,
    #[serde(default)]
    service: Vec<ServiceRequest>,
}

impl DaemonConfig {
    /// Parses the TOML configuration file format (see the README).
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let f: FileConfig = toml::from_str(text)?;
        let mut cfg = DaemonConfig {
            control: f.control,
            control_fallback: None,
            capture_dir: f.capture_dir,
            ports: f.ports,
            hosts: Vec::new(),
            faults: f.faults,
            device_faults: f.device_faults,
            limits: f.limits,
            checker: f.checker,
            socket_perms: Default::default(),
            cpu_affinity: f.cpu_affinity,
        };
        cfg.limits.check()?;
        cfg.checker.check()?;
        for fh in f.hosts {
            let (ip, len) = parse_cidr(&fh.address).map_err(|e| ConfigError::Host {
                host: fh.name.clone(),
                err: Box::new(e),
            })?;
            let mut h = HostSpec::new(&fh.name, ip, len);
            if let Some(m) = fh.mac {
                h.mac = m.parse()?;
            }
            if let Some(v) = fh.max_qps {
                h.limits.max_qps = v;
            }
            if let Some(v) = fh.max_mrs {
                h.limits.max_mrs = v;
            }
            if let Some(v) = fh.max_tcp_sockets {
                h.limits.max_tcp_sockets = v;
            }
            for fs in &fh.service {
                // not validated here; the host validates it on start
                let spec = fs
                    .unvalidated_spec()
                    .map_err(|e| ConfigError::Invalid(format!("host {}: {e}", fh.name)))?;
                h.services.push(spec);
            }
            h.check()?;
            cfg.hosts.push(h);
        }
        Ok(cfg)
    }

    /// Reads and parses a TOML file.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|err| ConfigError::Read {
            path: path.to_path_buf(),
            err,
        })?;
        Self::from_toml(&text).map_err(|err| ConfigError::File {
            path: path.to_path_buf(),
            err: Box::new(err),
        })
    }

    /// Gives the ports the listening sockets systemd passed (socket
    /// activation): a descriptor named (`FileDescriptorName=`) like a port
    /// goes to that port; the others go, in order, to the virtio-net ports
    /// still without one, in the order they were configured. With no ports
    /// configured, each descriptor becomes a port named after it (or
    /// `net0`, `net1`, ... when its name is not a valid port name).
    pub fn adopt_listen_fds(
        &mut self,
        fds: &[crate::activation::ListenFd],
    ) -> Result<(), ConfigError> {
        if self.ports.is_empty() {
            for (i, l) in fds.iter().enumerate() {
                let name = l
                    .name
                    .clone()
                    .filter(|n| {
                        check_name("port", n).is_ok() && !self.ports.iter().any(|p| &p.name == n)
                    })
                    .unwrap_or_else(|| format!("net{i}"));
                self.ports.push(PortConfig::from_fd(&name, l.fd));
            }
            return Ok(());
        }
        let mut unnamed = Vec::new();
        for l in fds {
            match self
                .ports
                .iter_mut()
                .find(|p| l.name.as_deref() == Some(p.name.as_str()))
            {
                Some(p) => p.listen_fd = Some(l.fd),
                None => unnamed.push(l.fd),
            }
        }
        let mut free = self
            .ports
            .iter_mut()
            .filter(|p| p.kind() == PortKind::VirtioNet && p.listen_fd.is_none());
        for fd in unnamed {
            let Some(p) = free.next() else {
                invalid!(
                    "socket activation passed more sockets ({}) than there are virtio-net ports to serve them",
                    fds.len()
                );
            };
            p.listen_fd = Some(fd);
        }
        for p in self.ports.iter_mut().filter(|p| p.listen_fd.is_some()) {
            if let Some(fd) = p.listen_fd {
                p.socket = crate::socket_path::display_path(fd);
            }
        }
        Ok(())
    }

    /// Checks names, sockets and MACs are unique and at least one port exists.
    /// Gives each `kind=erdma` port the MAC of its `netdev=` port (the
    /// driver binds to the netdev whose permanent MAC is the function's).
    pub fn pair_rdma_ports(&mut self) -> Result<(), ConfigError> {
        let macs: Vec<(String, PortKind, MacAddr)> = self
            .ports
            .iter()
            .map(|p| (p.name.clone(), p.kind(), p.mac))
            .collect();
        for p in self.ports.iter_mut() {
            let PortSpec::Erdma(ErdmaSpec { netdev: nd, .. }) = &p.spec else {
                continue;
            };
            if nd.is_empty() {
                invalid!(
                    "port {}: kind=erdma needs netdev=PORT (the guest's virtio-net port)",
                    p.name
                );
            }
            match macs.iter().find(|(n, _, _)| n == nd) {
                Some((_, PortKind::VirtioNet, mac)) => p.mac = *mac,
                Some(_) => invalid!("port {}: netdev={nd} is not a virtio-net port", p.name),
                None => invalid!("port {}: netdev={nd}: no such port", p.name),
            }
        }
        Ok(())
    }

    /// Checks the configuration as a whole (names, sockets, MACs, limits).
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.checker.check()?;
        if self.ports.is_empty() {
            invalid!("no ports configured: give at least one --port NAME=SOCKET_PATH");
        }
        self.limits.check()?;
        for d in &self.device_faults {
            let Some(p) = self.ports.iter().find(|p| p.name == d.port) else {
                invalid!("[[device-fault]] {}: no port named {:?}", d.kind, d.port);
            };
            if !matches!(p.kind(), PortKind::Gve | PortKind::Erdma) {
                invalid!(
                    "[[device-fault]] {}: port {} is a {} port: device faults need kind=gve or kind=erdma",
                    d.kind,
                    p.name,
                    p.kind().name()
                );
            }
        }
        for p in &self.ports {
            if p.flow_rules.len() > self.limits.flow_rules {
                invalid!(
                    "port {}: {} flow rules configured, [limits] flow-rules is {}",
                    p.name,
                    p.flow_rules.len(),
                    self.limits.flow_rules
                );
            }
        }
        for (i, h) in self.hosts.iter().enumerate() {
            h.check()?;
            for p in &self.ports {
                if p.name == h.name {
                    invalid!("a port and a host are both named {}", h.name);
                }
                if p.mac == h.mac {
                    invalid!(
                        "port {} and host {} have the same MAC {}",
                        p.name,
                        h.name,
                        h.mac
                    );
                }
            }
            for o in &self.hosts[i + 1..] {
                if o.name == h.name {
                    invalid!("two hosts are named {}", h.name);
                }
                if o.mac == h.mac {
                    invalid!(
                        "hosts {} and {} have the same MAC {}",
                        h.name,
                        o.name,
                        h.mac
                    );
                }
                if o.ipv4 == h.ipv4 {
                    invalid!(
                        "hosts {} and {} have the same address {}",
                        h.name,
                        o.name,
                        h.ipv4
                    );
                }
            }
        }
        for (i, a) in self.ports.iter().enumerate() {
            a.check()?;
            if a.listen_fd.is_some() && a.kind() != PortKind::VirtioNet {
                // The vfio-user server stops by shutting its listener down,
                // which would also break the caller's copy of the socket.
                invalid!(
                    "port {}: only virtio-net ports can use an inherited socket (--fd, socket activation)",
                    a.name
                );
            }
            for b in &self.ports[i + 1..] {
                if a.listen_fd.is_some() && a.listen_fd == b.listen_fd {
                    invalid!("ports {} and {} use the same descriptor", a.name, b.name);
                }
                if a.name == b.name {
                    invalid!("two ports are named {}", a.name);
                }
                match (&a.spec, &b.spec) {
                    (PortSpec::Vxlan(x), PortSpec::Vxlan(y)) if x.local == y.local => {
                        invalid!(
                            "ports {} and {} both bind local={}",
                            a.name,
                            b.name,
                            x.local
                        )
                    }
                    (
                        PortSpec::Tap(TapSpec { ifname: x }),
                        PortSpec::Tap(TapSpec { ifname: y }),
                    ) if x == y => {
                        invalid!("ports {} and {} both use TAP device {x}", a.name, b.name)
                    }
                    _ => {}
                }
                if a.socket == b.socket && !a.kind().is_uplink() {
                    invalid!(
                        "ports {} and {} use the same socket {}",
                        a.name,
                        b.name,
                        a.socket.display()
                    );
                }
                let paired = |x: &PortConfig, y: &PortConfig| x.netdev() == Some(y.name.as_str());
                if a.mac == b.mac && !paired(a, b) && !paired(b, a) {
                    invalid!(
                        "ports {} and {} have the same MAC {}",
                        a.name,
                        b.name,
                        a.mac
                    );
                }
            }
        }
        Ok(())
    }
}

/// A virtual-host service as the config file (`[[host.service]]`), the
/// control socket and `ctl host NAME start` give it (unset = the tool's
/// default); [`ServiceRequest::spec`] turns it into the engine's
/// `virtual_host::ServiceSpec`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ServiceRequest {
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<std::net::Ipv4Addr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iters: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_depth: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect_timeout_secs: Option<u64>,
    /// iWARP services: ask for MPA CRC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mpa_crc: Option<bool>,
    /// perftest services: the tool runs with `-R` (rdma_cm; iWARP unless
    /// `roce`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdma_cm: Option<bool>,
    /// perftest `-R` services: rdma_cm over RoCE (an rxe guest) instead of
    /// iWARP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roce: Option<bool>,
    /// Behave like the tool (echo, no checks): for host-to-host tests.
    #[serde(default)]
    pub echo: bool,
}

impl ServiceRequest {
    /// The service spec, validated.
    pub fn spec(&self) -> Result<ServiceSpec, virtual_host::HostError> {
        let s = self.unvalidated_spec()?;
        s.validate()?;
        Ok(s)
    }

    /// The service spec: the kind parsed, the given parameters applied.
    pub(crate) fn unvalidated_spec(&self) -> Result<ServiceSpec, virtual_host::HostError> {
        let kind: virtual_host::ServiceKind = self.kind.parse()?;
        let mut s = ServiceSpec::new(kind);
        s.peer = self.peer;
        if let Some(v) = self.port {
            s.port = v;
        }
        if let Some(v) = self.size {
            s.size = v;
        }
        if let Some(v) = self.iters {
            s.iters = v;
        }
        if let Some(v) = self.rx_depth {
            s.rx_depth = v;
        }
        if let Some(v) = self.mtu {
            s.mtu = v;
        }
        if let Some(v) = self.connect_timeout_secs {
            s.connect_timeout = Duration::from_secs(v);
        }
        if let Some(v) = self.mpa_crc {
            s.mpa_crc = v;
        }
        if let Some(v) = self.rdma_cm {
            s.rdma_cm = v;
        }
        if let Some(v) = self.roce {
            s.roce = v;
        }
        s.echo = self.echo;
        Ok(s)
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn cpu_affinity_is_a_cpu_list_string() {
        let f = DaemonConfig::from_toml("cpu-affinity = \"2-3,0\"\n").unwrap();
        assert_eq!(
            f.cpu_affinity.as_ref().map(|c| c.cpus().to_vec()),
            Some(vec![0, 2, 3])
        );
        assert_eq!(DaemonConfig::from_toml("").unwrap().cpu_affinity, None);
        let err = DaemonConfig::from_toml("cpu-affinity = \"1-\"\n").unwrap_err();
        assert!(format!("{err:#}").contains("not a CPU list"), "{err:#}");
        assert!(DaemonConfig::from_toml("cpu-affinity = 1\n").is_err());
    }

    #[test]
    fn erdma_ports_take_rc_settings_and_others_refuse_them() {
        let p: PortConfig =
            "r=/tmp/r.sock,kind=erdma,netdev=a,ack-timeout=12,retry-cnt=3,rnr-retry=6,min-rnr-timer=1,path-mtu=2048,engine-wrs=512,qp-wrs=64"
                .parse()
                .unwrap();
        let rc = |p: &PortConfig| match &p.spec {
            PortSpec::Erdma(e) => e.rc.clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            rc(&p),
            RcSettings {
                ack_timeout: Some(12),
                retry_cnt: Some(3),
                rnr_retry: Some(6),
                min_rnr_timer: Some(1),
                path_mtu: Some(2048),
                engine_wrs: Some(512),
                qp_wrs: Some(64),
            }
        );
        for bad in [
            "r=/tmp/r.sock,kind=erdma,netdev=a,retry-cnt=8",
            "r=/tmp/r.sock,kind=erdma,netdev=a,path-mtu=1500",
            "r=/tmp/r.sock,kind=erdma,netdev=a,ack-timeout=x",
            "r=/tmp/r.sock,kind=erdma,netdev=a,engine-wrs=0",
            "r=/tmp/r.sock,kind=erdma,netdev=a,qp-wrs=32769",
            "a=/tmp/a.sock,retry-cnt=3",
            "a=/tmp/a.sock,engine-wrs=8",
        ] {
            assert!(bad.parse::<PortConfig>().is_err(), "{bad} accepted");
        }
        let f = DaemonConfig::from_toml(
            "[[port]]\nname = \"a\"\nsocket = \"/tmp/a.sock\"\n\
             [[port]]\nname = \"r\"\nsocket = \"/tmp/r.sock\"\nkind = \"erdma\"\nnetdev = \"a\"\n\
             [port.rc]\nretry-cnt = 2\npath-mtu = 1024\nengine-wrs = 1024\n",
        )
        .unwrap();
        assert_eq!(rc(&f.ports[1]).engine_wrs, Some(1024));
        assert_eq!(rc(&f.ports[1]).retry_cnt, Some(2));
        assert_eq!(rc(&f.ports[1]).path_mtu, Some(1024));
        let err = DaemonConfig::from_toml(
            "[[port]]\nname = \"a\"\nsocket = \"/tmp/a.sock\"\n\
             [[port]]\nname = \"r\"\nsocket = \"/tmp/r.sock\"\nkind = \"erdma\"\nnetdev = \"a\"\n\
             [port.rc]\nrnr-retry = 9\n",
        )
        .unwrap_err();
        assert!(format!("{err:#}").contains("rnr-retry=9"), "{err:#}");
    }
    use super::*;

    #[test]
    fn port_flag_parses_all_options() {
        let p: PortConfig = "a=/tmp/a.sock,mac=52:54:00:00:00:0a,queues=2,form=testdev"
            .parse()
            .unwrap();
        assert_eq!(p.name, "a");
        assert_eq!(p.socket, PathBuf::from("/tmp/a.sock"));
        assert_eq!(p.mac.to_string(), "52:54:00:00:00:0a");
        assert_eq!(p.queue_pairs, 2);
        assert_eq!(p.form(), DeviceForm::TestDevice);
    }

    #[test]
    fn bad_port_flags_give_clear_errors() {
        for bad in [
            "a",
            "a=",
            "a=/s,queues=0",
            "a=/s,queues=99",
            "a=/s,mac=01:00:00:00:00:00",
            "a=/s,foo=1",
            "a=/s,mac=zz",
        ] {
            assert!(bad.parse::<PortConfig>().is_err(), "{bad} should fail");
        }
    }

    #[test]
    fn toml_matches_flags() {
        let c = DaemonConfig::from_toml(
            "control = \"/tmp/c.sock\"\n[[port]]\nname = \"a\"\nsocket = \"/tmp/a.sock\"\nqueues = 2\nform = \"testdev\"\nmac = \"52:54:00:00:00:0a\"\n",
        )
        .unwrap();
        let p: PortConfig = "a=/tmp/a.sock,mac=52:54:00:00:00:0a,queues=2,form=testdev"
            .parse()
            .unwrap();
        assert_eq!(c.ports, vec![p]);
        assert!(DaemonConfig::from_toml("[[port]]\nname=\"a\"\nsocket=\"/x\"\nbogus=1\n").is_err());
    }

    #[test]
    fn toml_flow_rules() {
        let c = DaemonConfig::from_toml(
            "[[port]]\nname = \"a\"\nsocket = \"/tmp/a.sock\"\nqueues = 4\n\
             [[port.flow-rule]]\nproto = \"tcp\"\ndst-port = 5201\nqueue = 3\n\
             [[port.flow-rule]]\nid = 9\nsrc-ip = \"10.0.0.0/8\"\ndrop = true\npriority = 1\n",
        )
        .unwrap();
        let r = &c.ports[0].flow_rules;
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].queue, Some(3));
        assert_eq!(r[1].id, Some(9));
        assert!(r[1].drop);
        for bad in [
            "queue = 4\n",                       // beyond the port's queues
            "queue = 1\ndrop = true\n",          // both actions
            "dst-ip = \"1.2.3\"\ndrop = true\n", // bad address
            "bogus = 1\ndrop = true\n",          // unknown key
        ] {
            let t = format!(
                "[[port]]\nname = \"a\"\nsocket = \"/tmp/a.sock\"\nqueues = 4\n[[port.flow-rule]]\n{bad}"
            );
            assert!(DaemonConfig::from_toml(&t).is_err(), "{bad}");
        }
    }

    #[test]
    fn limits_section() {
        let c = DaemonConfig::from_toml(
            "[limits]\nmac-table = 10\ncontrol-connections = 2\nfault-rules = 3\nflow-rules = 4\n\
             stuck-guest-ms = 500\ntrace-max-bytes = 5000\n\
             [[port]]\nname = \"a\"\nsocket = \"/tmp/a.sock\"\n",
        )
        .unwrap();
        assert_eq!(
            c.limits,
            Limits {
                mac_table: 10,
                control_connections: 2,
                fault_rules: 3,
                flow_rules: 4,
                capture_max_bytes: crate::capture::DEFAULT_MAX_BYTES,
                stuck_guest_ms: 500,
                trace_max_bytes: 5000,
            }
        );
        let d =
            DaemonConfig::from_toml("[[port]]\nname = \"a\"\nsocket = \"/tmp/a.sock\"\n").unwrap();
        assert_eq!(d.limits, Limits::default());
        for (bad, text) in [
            ("mac-table = 0", "mac-table = 0 must be between 1 and"),
            (
                "flow-rules = 257",
                "flow-rules = 257 must be between 1 and 256",
            ),
            (
                "stuck-guest-ms = 0",
                "stuck-guest-ms = 0 must be between 1 and",
            ),
            ("bogus = 1", "unknown field"),
            (
                "trace-max-bytes = 0",
                "trace-max-bytes = 0 must be between 1 and",
            ),
        ] {
            let e = DaemonConfig::from_toml(&format!("[limits]\n{bad}\n")).unwrap_err();
            assert!(format!("{e:#}").contains(text), "{bad}: {e:#}");
        }
    }

    #[test]
    fn toml_checker_section() {
        let c = DaemonConfig::from_toml(
            "[checker]\nenabled = false\nmax-flows = 16\nmax-findings = 8\n",
        )
        .unwrap();
        assert!(!c.checker.enabled);
        assert_eq!((c.checker.max_flows, c.checker.max_findings), (16, 8));
        assert!(
            DaemonConfig::from_toml("").unwrap().checker.enabled,
            "on by default"
        );
        for bad in ["max-flows = 0", "max-findings = 1000000", "bogus = 1"] {
            assert!(
                DaemonConfig::from_toml(&format!("[checker]\n{bad}\n")).is_err(),
                "{bad}"
            );
        }
        // The limits are refused with their own typed error.
        let e = DaemonConfig::from_toml("[checker]\nmax-flows = 0\n").unwrap_err();
        assert!(
            matches!(
                e,
                ConfigError::Checker(crate::checker::CheckerLimitError::MaxFlows)
            ),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "checker max-flows must be between 1 and 65536"
        );
    }

    #[test]
    fn host_flag_and_toml_agree() {
        let h: HostSpec =
            "vh=10.77.0.10/24,mac=52:54:00:00:01:0a,service=pingpong-server,service=pingpong-client@10.77.0.1,max-qps=8"
                .parse()
                .unwrap();
        assert_eq!(h.ipv4, std::net::Ipv4Addr::new(10, 77, 0, 10));
        assert_eq!(h.prefix_len, 24);
        assert_eq!(h.limits.max_qps, 8);
        assert_eq!(h.services.len(), 2);
        assert_eq!(
            h.services[1].peer,
            Some(std::net::Ipv4Addr::new(10, 77, 0, 1))
        );
        let c = DaemonConfig::from_toml(
            "[[host]]\nname = \"vh\"\naddress = \"10.77.0.10/24\"\nmac = \"52:54:00:00:01:0a\"\nmax-qps = 8\n\
             [[host.service]]\nkind = \"pingpong-server\"\n\
             [[host.service]]\nkind = \"pingpong-client\"\npeer = \"10.77.0.1\"\n",
        )
        .unwrap();
        assert_eq!(c.hosts, vec![h]);
        for bad in [
            "vh",
            "vh=10.77.0.10",
            "vh=10.77.0.10/33",
            "vh=10.77.0.300/24",
            "vh=10.77.0.10/24,service=nope",
            "vh=10.77.0.10/24,service=pingpong-client",
            "vh=10.77.0.10/24,bogus=1",
            "v h=10.77.0.10/24",
        ] {
            assert!(bad.parse::<HostSpec>().is_err(), "{bad} should fail");
        }
    }

    #[test]
    fn rdma_cm_and_mpa_crc_reach_the_service_spec() {
        let c = DaemonConfig::from_toml(
            "[[host]]\nname = \"vh\"\naddress = \"10.77.0.10/24\"\n\
             [[host.service]]\nkind = \"send-bw-server\"\nrdma-cm = true\nmpa-crc = true\nport = 18522\n",
        )
        .unwrap();
        let s = &c.hosts[0].services[0];
        assert!(s.rdma_cm && s.mpa_crc);
        assert_eq!(s.port, 18522);
        // rdma-cm is for the perftest services only.
        let e = DaemonConfig::from_toml(
            "[[host]]\nname = \"vh\"\naddress = \"10.77.0.10/24\"\n\
             [[host.service]]\nkind = \"rping-server\"\nrdma-cm = true\n",
        )
        .unwrap_err();
        assert!(format!("{e:#}").contains("rdma-cm"), "{e:#}");
    }

    #[test]
    fn roce_reaches_the_service_spec_and_needs_rdma_cm() {
        let c = DaemonConfig::from_toml(
            "[[host]]\nname = \"vh\"\naddress = \"10.77.0.10/24\"\n\
             [[host.service]]\nkind = \"read-bw-server\"\nrdma-cm = true\nroce = true\n",
        )
        .unwrap();
        let s = &c.hosts[0].services[0];
        assert!(s.rdma_cm && s.roce);
        let e = DaemonConfig::from_toml(
            "[[host]]\nname = \"vh\"\naddress = \"10.77.0.10/24\"\n\
             [[host.service]]\nkind = \"read-bw-server\"\nroce = true\n",
        )
        .unwrap_err();
        assert!(format!("{e:#}").contains("rdma-cm"), "{e:#}");
    }

    #[test]
    fn activation_fds_go_to_named_ports_then_in_order() {
        use crate::activation::ListenFd;
        let fd = |fd, name: Option<&str>| ListenFd {
            fd,
            name: name.map(str::to_string),
        };
        let mut cfg = DaemonConfig {
            ports: vec![
                "a=/tmp/a.sock".parse().unwrap(),
                "b=/tmp/b.sock".parse().unwrap(),
                "c=/tmp/c.sock".parse().unwrap(),
            ],
            ..DaemonConfig::default()
        };
        cfg.adopt_listen_fds(&[fd(3, Some("vhost-rdma.socket")), fd(4, Some("b"))])
            .unwrap();
        let got: Vec<_> = cfg.ports.iter().map(|p| p.listen_fd).collect();
        assert_eq!(got, vec![Some(3), Some(4), None]);
        assert_eq!(cfg.ports[2].socket, PathBuf::from("/tmp/c.sock"));
        // More sockets than ports.
        let mut one = DaemonConfig {
            ports: vec!["a=/tmp/a.sock".parse().unwrap()],
            ..DaemonConfig::default()
        };
        assert!(one.adopt_listen_fds(&[fd(3, None), fd(4, None)]).is_err());
        // No ports: one per socket, named after it when the name is valid.
        let mut none = DaemonConfig::default();
        none.adopt_listen_fds(&[fd(3, Some("guest1")), fd(4, Some("x.socket"))])
            .unwrap();
        let names: Vec<_> = none.ports.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, vec!["guest1", "net1"]);
        // Two ports on one descriptor are refused.
        let mut dup = none.clone();
        dup.ports[1].listen_fd = Some(3);
        assert!(dup.validate().is_err());
    }

    #[test]
    fn uplink_flags_and_toml_agree() {
        let v: PortConfig =
            "up,kind=vxlan,local=127.0.0.1:4789,remote=127.0.0.2:4789,remote=127.0.0.3:4800,vni=42,mtu=9000,df=set"
                .parse()
                .unwrap();
        assert_eq!(v.kind(), PortKind::Vxlan);
        assert!(v.socket.as_os_str().is_empty());
        let PortSpec::Vxlan(x) = &v.spec else {
            panic!("{v:?}")
        };
        assert_eq!(x.vni, 42);
        assert_eq!(x.underlay_mtu, 9000);
        assert_eq!(x.df, crate::vxlan::DontFragment::Set);
        assert_eq!(x.remotes.len(), 2);
        assert_eq!(x.remotes[1], "127.0.0.3:4800".parse().unwrap());
        let c = DaemonConfig::from_toml(
            "[[port]]\nname = \"up\"\nkind = \"vxlan\"\nlocal = \"127.0.0.1:4789\"\n\
             remote = [\"127.0.0.2:4789\", \"127.0.0.3:4800\"]\nvni = 42\nmtu = 9000\ndf = \"set\"\n\
             [[port]]\nname = \"t\"\nkind = \"tap\"\nifname = \"vr-tap0\"\n",
        )
        .unwrap();
        let t: PortConfig = "t,kind=tap,ifname=vr-tap0".parse().unwrap();
        assert_eq!(c.ports, vec![v, t]);
        // Defaults: VNI 1, underlay MTU 1500, fragmentation allowed (as a
        // Linux vxlan netdev's `df unset`).
        let d: PortConfig = "up,kind=vxlan,local=0.0.0.0:4789,remote=10.0.0.2:4789"
            .parse()
            .unwrap();
        let PortSpec::Vxlan(x) = &d.spec else {
            panic!()
        };
        assert_eq!(
            (x.vni, x.underlay_mtu, x.df),
            (1, 1500, crate::vxlan::DontFragment::Unset)
        );
        let u: PortConfig = "up,kind=vxlan,local=0.0.0.0:4789,remote=10.0.0.2:4789,df=unset"
            .parse()
            .unwrap();
        assert_eq!(u, d);
        for (bad, why) in [
            ("up,kind=vxlan", "needs local"),
            ("up,kind=vxlan,local=127.0.0.1:4789", "remote"),
            (
                "up,kind=vxlan,local=127.0.0.1,remote=127.0.0.2:4789",
                "IP:PORT",
            ),
            (
                "up,kind=vxlan,local=127.0.0.1:1,remote=127.0.0.2:1,vni=16777216",
                "24-bit",
            ),
            (
                "up,kind=vxlan,local=127.0.0.1:1,remote=127.0.0.2:1,ifname=x",
                "kind=tap",
            ),
            (
                "up=/tmp/s,kind=vxlan,local=127.0.0.1:1,remote=127.0.0.2:1",
                "no socket",
            ),
            ("t,kind=tap", "ifname"),
            ("t,kind=tap,ifname=waytoolongname16", "15"),
            ("t,kind=tap,ifname=a/b", "'/'"),
            ("t,kind=tap,ifname=x,vni=3", "kind=vxlan"),
            (
                "t,kind=tap,ifname=x,df=set",
                "df is a setting of kind=vxlan ports",
            ),
            (
                "up,kind=vxlan,local=127.0.0.1:1,remote=127.0.0.2:1,df=inherit",
                "df=inherit: df= must be set",
            ),
            ("a=/s,ifname=x", "ifname is a setting of kind=tap ports"),
            (
                "a=/s,local=1.2.3.4:5",
                "local is a setting of kind=vxlan ports",
            ),
            ("a,mac=52:54:00:00:00:01", "expected NAME=SOCKET_PATH"),
        ] {
            let e = bad.parse::<PortConfig>().unwrap_err();
            assert!(format!("{e:#}").contains(why), "{bad}: {e:#}");
        }
        let two = DaemonConfig {
            ports: vec![
                "a,kind=tap,ifname=x".parse().unwrap(),
                "b,kind=tap,ifname=x".parse().unwrap(),
            ],
            ..DaemonConfig::default()
        };
        assert!(format!("{:#}", two.validate().unwrap_err()).contains("both use TAP"));
        let ok = DaemonConfig {
            ports: vec![
                "a,kind=tap,ifname=x".parse().unwrap(),
                "b,kind=tap,ifname=y".parse().unwrap(),
            ],
            ..DaemonConfig::default()
        };
        ok.validate().expect("two uplinks without sockets are fine");
    }

    #[test]
    fn duplicates_are_refused() {
        let a: PortConfig = "a=/tmp/a.sock".parse().unwrap();
        let mut b: PortConfig = "b=/tmp/a.sock".parse().unwrap();
        let cfg = DaemonConfig {
            ports: vec![a.clone(), b.clone()],
            hosts: Vec::new(),
            ..DaemonConfig::default()
        };
        assert!(cfg.validate().is_err());
        b.socket = "/tmp/b.sock".into();
        assert!(DaemonConfig {
            ports: vec![a, b],
            hosts: Vec::new(),
            ..DaemonConfig::default()
        }
        .validate()
        .is_ok());
    }

    /// Every TOML example of the docs parses (and means what it says).
    #[test]
    fn doc_toml_examples_parse() {
        for (doc, text) in [
            (
                "docs/config-file.md",
                include_str!("../../docs/config-file.md"),
            ),
            ("docs/uplinks.md", include_str!("../../docs/uplinks.md")),
        ] {
            let mut n = 0;
            for block in text.split("```toml\n").skip(1) {
                let block = block.split("```").next().unwrap();
                if let Err(e) = DaemonConfig::from_toml(block) {
                    panic!("{doc}: example {n}: {e}\n{block}");
                }
                n += 1;
            }
            assert!(n > 0, "{doc} has no TOML example");
        }
    }

    /// `--port` and `[[port]]` take the same keys, with the same checks and
    /// messages: a key of another kind names the kinds that take it, an
    /// unknown key lists what the port's kind takes.
    #[test]
    fn flag_and_file_share_one_model() {
        let toml_port = |body: &str| DaemonConfig::from_toml(&format!("[[port]]\n{body}"));
        for (flag, file) in [
            (
                "g=/tmp/g.sock,kind=gve,queues=3,mtu=4000,gro-hold-us=5,nic-timestamp=on,rx-held-frames=7",
                "name = \"g\"\nsocket = \"/tmp/g.sock\"\nkind = \"gve\"\nqueues = 3\nmtu = 4000\n\
                 gro-hold-us = 5\nnic-timestamp = true\nrx-held-frames = 7\n",
            ),
            (
                "r=/tmp/r.sock,kind=erdma,netdev=a,retry-cnt=2,rx-held-frames=0",
                "name = \"r\"\nsocket = \"/tmp/r.sock\"\nkind = \"erdma\"\nnetdev = \"a\"\n\
                 rx-held-frames = 0\n[port.rc]\nretry-cnt = 2\n",
            ),
            (
                "a=/tmp/a.sock,kind=vhost-user,form=test-device,mac=52:54:00:00:00:0a,rx-queue-frames=64",
                "name = \"a\"\nsocket = \"/tmp/a.sock\"\nkind = \"vhost-user\"\nform = \"test-device\"\n\
                 mac = \"52:54:00:00:00:0a\"\nrx-queue-frames = 64\n",
            ),
        ] {
            let p: PortConfig = flag.parse().unwrap();
            assert_eq!(toml_port(file).unwrap().ports, vec![p], "{flag}");
        }
        let g: PortConfig = "g=/tmp/g.sock,kind=gve,mtu=4000".parse().unwrap();
        assert_eq!(
            g.spec,
            PortSpec::Gve(GveSpec {
                mtu: Some(4000),
                ..GveSpec::default()
            })
        );
        for (flag, file, why) in [
            (
                "v=/tmp/v.sock,netdev=a",
                "name = \"v\"\nsocket = \"/tmp/v.sock\"\nnetdev = \"a\"\n",
                "netdev is a setting of kind=erdma ports",
            ),
            (
                "g=/tmp/g.sock,kind=gve,form=testdev",
                "name = \"g\"\nsocket = \"/tmp/g.sock\"\nkind = \"gve\"\nform = \"testdev\"\n",
                "form is a setting of kind=virtio-net ports",
            ),
            (
                "r=/tmp/r.sock,kind=erdma,netdev=a,queues=2",
                "name = \"r\"\nsocket = \"/tmp/r.sock\"\nkind = \"erdma\"\nnetdev = \"a\"\nqueues = 2\n",
                "queues is a setting of kind=virtio-net and kind=gve ports",
            ),
            (
                "v=/tmp/v.sock,mtu=9000",
                "name = \"v\"\nsocket = \"/tmp/v.sock\"\nmtu = 9000\n",
                "mtu is a setting of kind=gve and kind=vxlan ports",
            ),
            (
                "v=/tmp/v.sock,bogus=1",
                "name = \"v\"\nsocket = \"/tmp/v.sock\"\nbogus = 1\n",
                "unknown option \"bogus\" (a kind=virtio-net port takes mac, queues, rx-queue-frames, ",
            ),
            (
                "g=/tmp/g.sock,kind=gve,queues=x",
                "name = \"g\"\nsocket = \"/tmp/g.sock\"\nkind = \"gve\"\nqueues = \"x\"\n",
                "queues=x: ",
            ),
            (
                "g=/tmp/g.sock,kind=gve,mtu=67",
                "name = \"g\"\nsocket = \"/tmp/g.sock\"\nkind = \"gve\"\nmtu = 67\n",
                "mtu=67: a gVNIC's MTU is 68..=9216",
            ),
        ] {
            let e = flag.parse::<PortConfig>().unwrap_err().to_string();
            assert!(e.contains(why), "{flag}: {e}");
            assert!(e.starts_with(&format!("--port {flag:?}: ")), "{e}");
            let e = toml_port(file).unwrap_err().to_string();
            assert!(e.contains(why), "{file}: {e}");
            assert!(e.contains("port "), "names the port: {e}");
        }
        // The command line's own spelling: remote= repeated, RC keys flat.
        let e = "a=/tmp/a.sock,queues=2,queues=3"
            .parse::<PortConfig>()
            .unwrap_err();
        assert!(e.to_string().contains("queues given twice"), "{e}");
        let e = "a=/tmp/a.sock,retry-cnt=3"
            .parse::<PortConfig>()
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("retry-cnt is a setting of kind=erdma ports"),
            "{e}"
        );
        let e = DaemonConfig::from_toml(
            "[[port]]\nname = \"a\"\nsocket = \"/tmp/a.sock\"\n[port.rc]\nretry-cnt = 3\n",
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("rc is a setting of kind=erdma ports"),
            "{e}"
        );
    }
}

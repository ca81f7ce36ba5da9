//! One port's settings: [`PortConfig`] (what every kind has) and
//! [`PortSpec`] (one variant per kind, holding what only that kind
//! takes), deserialized by serde alike from a `--port` flag's
//! `key=value` list and from a TOML `[[port]]` table.

use super::raw::{fields_of, Raw};
use super::{
    check_name, invalid, ConfigError, DeviceForm, MacAddr, PortKind, RcSettings,
    DEFAULT_RX_HELD_FRAMES, DEFAULT_RX_QUEUE_FRAMES, MAX_GRO_HOLD_US, MAX_GVE_MTU, MAX_QUEUE_PAIRS,
    MAX_RX_HELD_FRAMES,
};
use serde::Deserialize;
use std::path::PathBuf;
use std::str::FromStr;

/// One port: its name, socket and the settings every kind has, and in
/// [`PortSpec`] what its kind alone takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortConfig {
    pub name: String,
    /// The socket path (empty for uplinks, which have none).
    pub socket: PathBuf,
    pub mac: MacAddr,
    /// `queues=`: virtio-net queue pairs, or a gVNIC's most TX and RX
    /// queues; 1 for the other kinds.
    pub queue_pairs: u16,
    /// Bound of the per-queue-pair pending queue towards the guest.
    pub rx_queue_frames: usize,
    /// Flow steering rules installed at start (`[[port.flow-rule]]`).
    pub flow_rules: Vec<crate::steering::FlowRuleSpec>,
    /// An inherited, already listening socket to serve instead of binding
    /// `socket` (`--fd`, systemd socket activation); `socket` then only
    /// names it in logs and status.
    pub listen_fd: Option<i32>,
    /// What the port presents (`kind=`) and that kind's own settings.
    pub spec: PortSpec,
}

/// What a port presents, with the settings of that kind alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PortSpec {
    /// A vhost-user virtio-net device (`kind=virtio-net`, the default).
    VirtioNet(VirtioNetSpec),
    /// An emulated Google gVNIC over vfio-user (`kind=gve`).
    Gve(GveSpec),
    /// An emulated Elastic RDMA function over vfio-user (`kind=erdma`).
    Erdma(ErdmaSpec),
    /// An uplink to remote VTEPs: VXLAN over UDP (`kind=vxlan`).
    Vxlan(crate::vxlan::VxlanConfig),
    /// An uplink to a host TAP device (`kind=tap`).
    Tap(TapSpec),
}

/// `kind=virtio-net` settings.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct VirtioNetSpec {
    /// How QEMU presents the device (`form=`).
    pub form: DeviceForm,
}

/// `kind=gve` settings.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct GveSpec {
    /// The device descriptor's MTU (`mtu=`), 68..=[`MAX_GVE_MTU`]. The
    /// gve driver takes it as the interface's maximum and initial MTU, as
    /// a real gVNIC's VPC MTU; `None`: [`super::DEFAULT_GVE_MTU`].
    pub mtu: Option<u16>,
    /// How long HW-GRO holds a flow for its next segment, in microseconds
    /// of device time (`gro-hold-us=`); `None`: the device's default
    /// (`gve_device::rsc::DEFAULT_HOLD`, 1 ms).
    pub gro_hold_us: Option<u32>,
    /// Offer NIC timestamps (`nic-timestamp=on`): the driver registers a
    /// PTP clock and RX hardware timestamps work.
    pub nic_timestamp: bool,
    /// Most frames held for one device receive queue that has no buffer
    /// posted (0: none, they are dropped).
    pub rx_held_frames: usize,
}

impl Default for GveSpec {
    fn default() -> Self {
        GveSpec {
            mtu: None,
            gro_hold_us: None,
            nic_timestamp: false,
            rx_held_frames: DEFAULT_RX_HELD_FRAMES,
        }
    }
}

/// `kind=erdma` settings.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct ErdmaSpec {
    /// The virtio-net port of the same guest (`netdev=`, required): its
    /// MAC is the function's; RoCEv2 frames to that MAC come here, the
    /// rest go there.
    pub netdev: String,
    /// RC settings the erdma driver never passes (`[port.rc]`; on the
    /// command line as keys of their own: `retry-cnt=3`).
    pub rc: RcSettings,
    /// Most frames held for the device's receive queue while it has no
    /// buffer posted (0: none, they are dropped).
    pub rx_held_frames: usize,
}

impl Default for ErdmaSpec {
    fn default() -> Self {
        ErdmaSpec {
            netdev: String::new(),
            rc: RcSettings::default(),
            rx_held_frames: DEFAULT_RX_HELD_FRAMES,
        }
    }
}

impl ErdmaSpec {
    /// An erdma function paired with virtio-net port `netdev`.
    pub fn new(netdev: &str) -> Self {
        ErdmaSpec {
            netdev: netdev.to_string(),
            ..ErdmaSpec::default()
        }
    }
}

/// `kind=tap` settings.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct TapSpec {
    /// The TAP interface (at most 15 bytes; created when missing).
    pub ifname: String,
}

/// `kind=vxlan` settings as written; [`VxlanSpec::build`] checks them
/// into a [`crate::vxlan::VxlanConfig`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct VxlanSpec {
    local: Option<String>,
    #[serde(default)]
    remote: Vec<String>,
    vni: Option<u32>,
    mtu: Option<u32>,
    /// `set` or `unset`.
    df: Option<String>,
}

impl VxlanSpec {
    fn build(self) -> Result<crate::vxlan::VxlanConfig, ConfigError> {
        let addr = |what: &str, v: &str| -> Result<std::net::SocketAddr, ConfigError> {
            v.parse().map_err(|e: std::net::AddrParseError| {
                ConfigError::Invalid(format!(
                    "{what}={v:?} must be IP:PORT (IPv6: [IP]:PORT): {e}"
                ))
            })
        };
        let Some(local) = self.local else {
            invalid!("kind=vxlan needs local=IP:PORT (e.g. local=0.0.0.0:4789) and remote=IP:PORT");
        };
        Ok(crate::vxlan::VxlanConfig {
            local: addr("local", &local)?,
            remotes: self
                .remote
                .iter()
                .map(|r| addr("remote", r))
                .collect::<Result<_, _>>()?,
            vni: self.vni.unwrap_or(crate::vxlan::DEFAULT_VNI),
            underlay_mtu: self.mtu.unwrap_or(crate::vxlan::DEFAULT_UNDERLAY_MTU),
            df: match &self.df {
                Some(v) => v.parse().map_err(|e: crate::vxlan::ConfigError| {
                    ConfigError::value("df", v, e.into())
                })?,
                None => crate::vxlan::DontFragment::default(),
            },
        })
    }
}

/// The settings every kind takes, as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct CommonSpec {
    name: String,
    socket: Option<PathBuf>,
    mac: Option<MacAddr>,
    queues: Option<u16>,
    rx_queue_frames: Option<usize>,
    #[serde(default)]
    flow_rule: Vec<crate::steering::FlowRuleSpec>,
}

/// The kinds that take `queues=`.
const QUEUE_KINDS: [PortKind; 2] = [PortKind::VirtioNet, PortKind::Gve];

const ALL_KINDS: [PortKind; 5] = [
    PortKind::VirtioNet,
    PortKind::Gve,
    PortKind::Erdma,
    PortKind::Vxlan,
    PortKind::Tap,
];

/// The keys of a kind's own settings.
fn kind_fields(kind: PortKind) -> &'static [&'static str] {
    match kind {
        PortKind::VirtioNet => fields_of::<VirtioNetSpec>(),
        PortKind::Gve => fields_of::<GveSpec>(),
        PortKind::Erdma => fields_of::<ErdmaSpec>(),
        PortKind::Vxlan => fields_of::<VxlanSpec>(),
        PortKind::Tap => fields_of::<TapSpec>(),
    }
}

/// Whether a port of `kind` takes `key` (in the file's spelling; the
/// command line's RC keys count as erdma's).
fn takes(kind: PortKind, key: &str, flat_rc: bool) -> bool {
    if key == "queues" {
        return QUEUE_KINDS.contains(&kind);
    }
    fields_of::<CommonSpec>().contains(&key)
        || kind_fields(kind).contains(&key)
        || (flat_rc && kind == PortKind::Erdma && fields_of::<RcSettings>().contains(&key))
}

/// `kind=a`, `kind=a and kind=b`, `kind=a, kind=b and kind=c`.
fn kind_list(kinds: &[PortKind]) -> String {
    let names: Vec<String> = kinds.iter().map(|k| format!("kind={}", k.name())).collect();
    match names.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
        None => String::new(),
    }
}

/// Where `key` does not belong on a port of `kind`: which kinds take it,
/// or which keys this one takes.
fn misplaced(kind: PortKind, key: &str, flat_rc: bool) -> ConfigError {
    let others: Vec<PortKind> = ALL_KINDS
        .into_iter()
        .filter(|k| takes(*k, key, flat_rc))
        .collect();
    if !others.is_empty() {
        return ConfigError::WrongKind {
            key: key.to_string(),
            kinds: kind_list(&others),
        };
    }
    let mut accepted: Vec<&str> = fields_of::<CommonSpec>()
        .iter()
        .copied()
        // The command line gives name and socket first, and no flow rules.
        .filter(|k| !(["name", "socket"].contains(k) || flat_rc && *k == "flow-rule"))
        .filter(|k| takes(kind, k, flat_rc))
        .collect();
    accepted.push("kind");
    accepted.extend(
        kind_fields(kind)
            .iter()
            .copied()
            .filter(|k| !flat_rc || *k != "rc"),
    );
    if flat_rc && kind == PortKind::Erdma {
        accepted.extend(fields_of::<RcSettings>());
    }
    ConfigError::UnknownKey {
        key: key.to_string(),
        accepted: format!("a kind={} port takes {}", kind.name(), accepted.join(", ")),
    }
}

/// Deserializes `T` from `entries` (a table).
fn from_map<T: for<'de> Deserialize<'de>>(entries: Vec<(String, Raw)>) -> Result<T, ConfigError> {
    T::deserialize(Raw::Map(entries))
}

impl PortConfig {
    /// A virtio-net port with defaults for everything but name and socket
    /// (one queue pair, the `pci` form).
    pub fn new(name: &str, socket: impl Into<PathBuf>) -> Self {
        PortConfig {
            name: name.to_string(),
            socket: socket.into(),
            mac: MacAddr::from_name(name),
            queue_pairs: 1,
            rx_queue_frames: DEFAULT_RX_QUEUE_FRAMES,
            flow_rules: Vec::new(),
            listen_fd: None,
            spec: PortSpec::VirtioNet(VirtioNetSpec::default()),
        }
    }

    /// A port of the kind `spec` gives, with that kind's default queues.
    pub fn with_spec(name: &str, socket: impl Into<PathBuf>, spec: PortSpec) -> Self {
        PortConfig {
            queue_pairs: spec.kind().default_queues(),
            spec,
            ..PortConfig::new(name, socket)
        }
    }

    /// A virtio-net port in the test-device form (the daemon serves the
    /// config space and control queue).
    pub fn testdev(name: &str, socket: impl Into<PathBuf>) -> Self {
        Self::with_spec(
            name,
            socket,
            PortSpec::VirtioNet(VirtioNetSpec {
                form: DeviceForm::TestDevice,
            }),
        )
    }

    /// A `kind=gve` port with the default settings (two queues).
    pub fn gve(name: &str, socket: impl Into<PathBuf>) -> Self {
        Self::with_spec(name, socket, PortSpec::Gve(GveSpec::default()))
    }

    /// A `kind=erdma` function paired with virtio-net port `netdev`.
    pub fn erdma(name: &str, socket: impl Into<PathBuf>, netdev: &str) -> Self {
        Self::with_spec(name, socket, PortSpec::Erdma(ErdmaSpec::new(netdev)))
    }

    /// A port served on the inherited listening socket `fd`.
    pub fn from_fd(name: &str, fd: i32) -> Self {
        PortConfig {
            listen_fd: Some(fd),
            ..PortConfig::new(name, crate::socket_path::display_path(fd))
        }
    }

    /// What the port presents.
    pub fn kind(&self) -> PortKind {
        self.spec.kind()
    }

    /// A virtio-net port's device form; `pci` for other kinds.
    pub fn form(&self) -> DeviceForm {
        match &self.spec {
            PortSpec::VirtioNet(v) => v.form,
            _ => DeviceForm::VirtioNetPci,
        }
    }

    /// A `kind=erdma` port's `netdev=`.
    pub fn netdev(&self) -> Option<&str> {
        match &self.spec {
            PortSpec::Erdma(e) => Some(&e.netdev),
            _ => None,
        }
    }

    /// A device port's bound of frames held per receive queue without
    /// buffers (`rx-held-frames`); the default for other kinds.
    pub fn rx_held_frames(&self) -> usize {
        match &self.spec {
            PortSpec::Gve(g) => g.rx_held_frames,
            PortSpec::Erdma(e) => e.rx_held_frames,
            _ => DEFAULT_RX_HELD_FRAMES,
        }
    }

    /// The port's listening socket: the inherited one, else `socket` bound
    /// (with `perms`).
    pub fn listen(
        &self,
        perms: &crate::socket_path::SocketPerms,
    ) -> Result<
        (
            std::os::unix::net::UnixListener,
            crate::socket_path::OwnedSocket,
        ),
        crate::socket_path::BindError,
    > {
        match self.listen_fd {
            Some(fd) => crate::socket_path::adopt(fd),
            None => crate::socket_path::bind_with(&self.socket, perms),
        }
    }

    /// The one path from written settings to a port: `entries` are a
    /// `[[port]]` table's, or a `--port` flag's (`flat_rc`: the RC
    /// settings as keys of their own).
    pub(crate) fn from_entries(
        entries: Vec<(String, Raw)>,
        flat_rc: bool,
    ) -> Result<Self, ConfigError> {
        let kind = match entries.iter().find(|(k, _)| k == "kind") {
            None => PortKind::default(),
            Some((_, v)) => match v.as_str() {
                Some(s) => s.parse().map_err(|e| ConfigError::value("kind", s, e))?,
                None => invalid!("kind = {v}: expected a string"),
            },
        };
        let mut common = Vec::new();
        let mut own = Vec::new();
        let mut rc = Vec::new();
        for (k, v) in entries {
            if k == "kind" {
                continue;
            }
            if !takes(kind, &k, flat_rc) {
                return Err(misplaced(kind, &k, flat_rc));
            }
            if fields_of::<CommonSpec>().contains(&k.as_str()) {
                common.push((k, v));
            } else if flat_rc && fields_of::<RcSettings>().contains(&k.as_str()) {
                rc.push((k, v));
            } else {
                own.push((k, v));
            }
        }
        if !rc.is_empty() {
            own.push(("rc".into(), Raw::Map(rc)));
        }
        let c: CommonSpec = from_map(common)?;
        let spec = match kind {
            PortKind::VirtioNet => PortSpec::VirtioNet(from_map(own)?),
            PortKind::Gve => PortSpec::Gve(from_map(own)?),
            PortKind::Erdma => PortSpec::Erdma(from_map(own)?),
            PortKind::Vxlan => PortSpec::Vxlan(from_map::<VxlanSpec>(own)?.build()?),
            PortKind::Tap => PortSpec::Tap(from_map(own)?),
        };
        let p = PortConfig {
            mac: c.mac.unwrap_or_else(|| MacAddr::from_name(&c.name)),
            queue_pairs: c.queues.unwrap_or_else(|| kind.default_queues()),
            rx_queue_frames: c.rx_queue_frames.unwrap_or(DEFAULT_RX_QUEUE_FRAMES),
            flow_rules: c.flow_rule,
            listen_fd: None,
            socket: c.socket.unwrap_or_default(),
            name: c.name,
            spec,
        };
        p.check_settings()?;
        Ok(p)
    }

    /// Checks the port's settings (for ports built in code too).
    pub fn check(&self) -> Result<(), ConfigError> {
        self.check_settings()
            .map_err(|e| ConfigError::port(&self.name, e))
    }

    fn check_settings(&self) -> Result<(), ConfigError> {
        check_name("port", &self.name)?;
        let uplink = self.kind().is_uplink();
        if uplink != self.socket.as_os_str().is_empty() {
            if uplink {
                invalid!(
                    "an uplink (kind=vxlan, kind=tap) has no socket: write --port NAME,kind=..."
                )
            }
            invalid!("needs a socket path: --port NAME=SOCKET_PATH")
        }
        if self.queue_pairs == 0 || self.queue_pairs > MAX_QUEUE_PAIRS {
            invalid!(
                "queues={} must be between 1 and {MAX_QUEUE_PAIRS}",
                self.queue_pairs
            );
        }
        if self.rx_queue_frames == 0 || self.rx_queue_frames > 1 << 20 {
            invalid!("rx-queue-frames must be between 1 and 1048576");
        }
        let held = |n: usize| -> Result<(), ConfigError> {
            if n > MAX_RX_HELD_FRAMES {
                invalid!("rx-held-frames must be between 0 and {MAX_RX_HELD_FRAMES}");
            }
            Ok(())
        };
        match &self.spec {
            PortSpec::VirtioNet(_) => {}
            PortSpec::Gve(g) => {
                held(g.rx_held_frames)?;
                if let Some(m) = g.mtu {
                    if !(68..=MAX_GVE_MTU).contains(&m) {
                        invalid!("mtu={m}: a gVNIC's MTU is 68..={MAX_GVE_MTU}");
                    }
                }
                if let Some(u) = g.gro_hold_us {
                    if u > MAX_GRO_HOLD_US {
                        invalid!("gro-hold-us={u}: at most {MAX_GRO_HOLD_US} (100 ms)");
                    }
                }
            }
            PortSpec::Erdma(e) => {
                held(e.rx_held_frames)?;
                if e.netdev.is_empty() {
                    invalid!("kind=erdma needs netdev=PORT (the guest's virtio-net port)");
                }
                e.rc.validate()?;
            }
            PortSpec::Vxlan(v) => v
                .check()
                .map_err(|e| ConfigError::Invalid(format!("kind=vxlan: {e}")))?,
            PortSpec::Tap(TapSpec { ifname }) => {
                if ifname.is_empty() {
                    invalid!("kind=tap needs ifname=IF");
                }
                // IFNAMSIZ is 16 with the NUL; '/' and whitespace are
                // refused by the kernel anyway, say so first.
                if ifname.len() > 15 || ifname.bytes().any(|b| b == b'/' || b <= b' ' || b > b'~') {
                    invalid!("ifname={ifname:?} must be 1 to 15 printable bytes without '/'");
                }
            }
        }
        if !self.flow_rules.is_empty() {
            crate::steering::PortSteering::new(self.queue_pairs, &self.flow_rules)
                .map_err(|e| ConfigError::Invalid(format!("flow rule: {e}")))?;
        }
        Ok(())
    }
}

impl PortSpec {
    /// A virtio-net port in `form`.
    pub fn virtio_net(form: DeviceForm) -> Self {
        PortSpec::VirtioNet(VirtioNetSpec { form })
    }

    /// The kind of port this is.
    pub fn kind(&self) -> PortKind {
        match self {
            PortSpec::VirtioNet(_) => PortKind::VirtioNet,
            PortSpec::Gve(_) => PortKind::Gve,
            PortSpec::Erdma(_) => PortKind::Erdma,
            PortSpec::Vxlan(_) => PortKind::Vxlan,
            PortSpec::Tap(_) => PortKind::Tap,
        }
    }
}

impl FromStr for PortConfig {
    type Err = ConfigError;
    /// `NAME=SOCKET[,key=value...]`, or an uplink: `NAME,kind=vxlan,...`
    /// or `NAME,kind=tap,ifname=IF`: the keys of a `[[port]]` table, with
    /// an erdma port's `[port.rc]` keys given as keys of their own and
    /// `remote=` repeated for several.
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        parse_flag(s).map_err(|e| ConfigError::flag("port", s, e))
    }
}

fn parse_flag(s: &str) -> Result<PortConfig, ConfigError> {
    let mut parts = s.split(',');
    let head = parts.next().unwrap_or_default();
    // Uplinks have no socket: their head is the bare name.
    let (name, sock) = match head.split_once('=') {
        Some((_, "")) => return Err(ConfigError::Syntax("empty socket path".into())),
        Some((n, sock)) => (n, Some(sock)),
        None if s.contains(",kind=vxlan") || s.contains(",kind=tap") => (head, None),
        None => {
            return Err(ConfigError::Syntax(
                "expected NAME=SOCKET_PATH[,mac=MAC][,queues=N][,form=pci|testdev] \
                 or NAME,kind=vxlan,local=IP:PORT,remote=IP:PORT or NAME,kind=tap,ifname=IF"
                    .into(),
            ))
        }
    };
    let mut entries = vec![("name".to_string(), Raw::Text(name.to_string()))];
    if let Some(sock) = sock {
        entries.push(("socket".into(), Raw::Text(sock.to_string())));
    }
    for kv in parts {
        let Some((k, v)) = kv.split_once('=') else {
            return Err(ConfigError::Syntax(format!(
                "option {kv:?} is not key=value"
            )));
        };
        if ["name", "socket", "flow-rule", "rc"].contains(&k) {
            return Err(misplaced_flag_key(k));
        }
        match entries.iter_mut().find(|(key, _)| key == k) {
            None => entries.push((k.to_string(), Raw::Text(v.to_string()))),
            Some((_, Raw::Seq(vs))) => vs.push(Raw::Text(v.to_string())),
            Some((_, first)) if k == "remote" => {
                *first = Raw::Seq(vec![first.clone(), Raw::Text(v.to_string())]);
            }
            Some(_) => {
                return Err(ConfigError::Syntax(format!("option {k} given twice")));
            }
        }
    }
    PortConfig::from_entries(entries, true)
}

/// Keys of a `[[port]]` table that `--port` spells otherwise or not at all.
fn misplaced_flag_key(k: &str) -> ConfigError {
    ConfigError::Syntax(match k {
        "name" | "socket" => format!("{k}= is not an option: write NAME=SOCKET_PATH first"),
        "rc" => "rc= is not an option: give the RC settings as keys (retry-cnt=3)".into(),
        _ => format!("{k} is only in the config file ([[port.{k}]])"),
    })
}

impl<'de> Deserialize<'de> for PortConfig {
    /// A `[[port]]` table.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let Raw::Map(entries) = Raw::deserialize(d)? else {
            return Err(serde::de::Error::custom("a port is a table"));
        };
        let name = entries
            .iter()
            .find(|(k, _)| k == "name")
            .and_then(|(_, v)| v.as_str())
            .map(str::to_string);
        PortConfig::from_entries(entries, false).map_err(|e| {
            serde::de::Error::custom(match name {
                Some(n) => ConfigError::port(&n, e),
                None => e,
            })
        })
    }
}

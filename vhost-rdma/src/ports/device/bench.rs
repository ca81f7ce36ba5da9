//! The driver bench's control of a device port (issue 25): device fault
//! rules ([`DeviceFaultSpec`], `ctl device-fault`, `[[device-fault]]`) and
//! their counters, as the daemon and the control protocol carry them. The
//! models (`gve-device`, `erdma-device`) own the rules and what each kind
//! does; the daemon names the port, picks the id and passes the rest on.

use serde::{Deserialize, Serialize};

pub use crate::config::{
    parse_device_fault_params as parse_params, DeviceFaultParamError, DeviceFaultSpec,
};

/// A device fault rule with its counters (`ctl device-fault list`, `ctl
/// status`): the model's own status, carried as is.
pub use pci_model::FaultStatus as DeviceFaultRule;

/// One device port's fault rules.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DevicePortFaults {
    /// The port.
    pub port: String,
    /// Its device kind (`gve`, `erdma`).
    pub kind: String,
    /// Its rules, in order.
    pub rules: Vec<DeviceFaultRule>,
}

/// A fault kind a device offers (`ctl device-fault kinds`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceFaultKind {
    /// The kind's name.
    pub name: String,
    /// Its parameters, `name=meaning` each.
    pub params: Vec<String>,
    /// What it does.
    pub doc: String,
}

impl From<&pci_model::FaultKindInfo> for DeviceFaultKind {
    fn from(k: &pci_model::FaultKindInfo) -> Self {
        DeviceFaultKind {
            name: k.name.into(),
            params: k.params.iter().map(|p| p.to_string()).collect(),
            doc: k.doc.into(),
        }
    }
}

/// Why a device fault, link or trace request was refused.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The port exists but is not an emulated device.
    #[error("port {port} is a {kind} port: {what} need kind=gve or kind=erdma")]
    NotADevice {
        /// The port.
        port: String,
        /// Its kind (`virtio-net`, `vxlan`, ...).
        kind: &'static str,
        /// What was asked for (`device faults`, `device traces`).
        what: &'static str,
    },
    /// The model refused the rule or the removal.
    #[error("port {port}: {source}")]
    Model {
        /// The port.
        port: String,
        /// The model's reason.
        source: pci_model::FaultError,
    },
    /// A rule id without a port, held by several ports.
    #[error("device fault rule {id} exists on ports {ports}: give --port")]
    AmbiguousId {
        /// The id.
        id: u32,
        /// The ports holding it, comma-separated.
        ports: String,
    },
    /// A rule id without a port, held by none.
    #[error("no device fault rule {0} on any device port")]
    NoSuchRule(u32),
    /// No port has the id space left.
    #[error("port {0}: no free device fault rule id")]
    NoFreeId(String),
    /// The model panicked on the request (it was reset by the pump's
    /// guard on its next call; the request had no effect to rely on).
    #[error("port {0}: the device model panicked on this request")]
    Panicked(String),
    /// The trace could not start or stop.
    #[error(transparent)]
    Trace(#[from] super::trace::TraceError),
}

/// The name `ctl` uses for a port kind.
pub fn kind_name(k: crate::config::PortKind) -> &'static str {
    k.name()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_parse_from_words_and_tables() {
        let p = parse_params(&["queue=0".into(), "opcode=CREATE_QP".into()]).unwrap();
        assert_eq!(p["queue"], "0");
        assert_eq!(p["opcode"], "CREATE_QP");
        let e = |w: &[&str]| {
            parse_params(&w.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap_err()
                .to_string()
        };
        assert_eq!(e(&["queue"]), "\"queue\" is not KEY=VALUE");
        assert_eq!(e(&["=1"]), "\"=1\" has no key");
        assert_eq!(e(&["a=1", "a=2"]), "parameter a given twice");
        let s: DeviceFaultSpec = toml::from_str(
            "port = \"g\"\nkind = \"tx-miss\"\nparams = { queue = 1, reinject = false, x = \"y\" }\ncount = 3\n",
        )
        .unwrap();
        assert_eq!(s.params["queue"], "1");
        assert_eq!(s.params["reinject"], "no");
        assert_eq!(s.params["x"], "y");
        assert_eq!(s.count, Some(3));
        assert_eq!(s.describe(), "tx-miss queue=1 reinject=no x=y");
        assert!(
            toml::from_str::<DeviceFaultSpec>("port = \"g\"\nkind = \"k\"\nbogus = 1\n").is_err()
        );
    }
}

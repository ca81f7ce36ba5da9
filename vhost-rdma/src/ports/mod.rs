//! The kinds of port the fabric joins. Each is the far end of a
//! [`PortShared`]: the switch sees only that and the [`PortProfile`] the
//! kind gives it, and the server starts and stops every port through
//! [`PortDriver`] and [`RunningPort`], so a new kind is a module here and a
//! line in [`driver`], with no change to the switch or the server.
//!
//! - [`virtio_net`]: vhost-user virtio-net devices of guests (`kind=virtio-net`);
//! - [`device`]: emulated PCI devices over vfio-user (`kind=gve`, `kind=erdma`);
//! - [`uplink`]: the way out of the host (`kind=vxlan`, `kind=tap`);
//! - [`host`]: virtual hosts (`--host`), ports whose far end is a thread.
//!   They are configured apart from `--port` and the control socket drives
//!   their services, so the server starts them itself; their attachment to
//!   the switch is a port like any other ([`host::HostHandle::attachment`]).

pub mod device;
pub mod host;
pub mod uplink;
pub mod virtio_net;

use crate::config::{PortConfig, PortKind};
use crate::fabric::{Fabric, PortProfile, PortShared};
use crate::socket_path::SocketPerms;
use std::sync::Arc;

/// What starting a port may use besides its own [`PortShared`].
pub struct StartContext<'a> {
    /// The switch the port hands its frames to.
    pub fabric: &'a Arc<Fabric>,
    /// Owner, group and mode of the sockets ports listen on.
    pub socket_perms: &'a SocketPerms,
}

/// A kind of port (one or more `--port kind=` values).
pub trait PortDriver: Sync {
    /// How the switch treats a port of this kind with this configuration.
    fn profile(&self, cfg: &PortConfig) -> PortProfile;

    /// Starts serving the port (its sockets and threads); `port` is already
    /// in the fabric. Dropping what it returns stops the port.
    fn start(
        &self,
        port: Arc<PortShared>,
        ctx: &StartContext<'_>,
    ) -> anyhow::Result<Box<dyn RunningPort>>;
}

/// A started port.
pub trait RunningPort: Send {
    /// What the control socket shows of the port beyond its counters.
    fn status(&self) -> PortStatus {
        PortStatus::CountersOnly
    }

    /// Stops the port's threads and removes its socket. Safe to call more
    /// than once (it is also what dropping the port does).
    fn shutdown(&mut self);
}

/// A running port's part in `ctl status`. The reply's shape is the control
/// protocol's (a `devices` list and an `uplinks` list), hence one variant
/// per list rather than a free-form value.
pub enum PortStatus {
    /// Nothing beyond the port's counters (virtio-net ports).
    CountersOnly,
    /// An entry of `devices`.
    Device(device::DeviceEntry),
    /// An entry of `uplinks`.
    Uplink(uplink::UplinkEntry),
}

/// The kind behind a `kind=` value: the one place that maps configuration
/// to code.
pub fn driver(kind: PortKind) -> &'static dyn PortDriver {
    match kind {
        PortKind::VirtioNet => &virtio_net::VirtioNetDriver,
        PortKind::Gve | PortKind::Erdma => &device::DeviceDriver,
        PortKind::Vxlan | PortKind::Tap => &uplink::UplinkDriver,
    }
}

/// The shared state of the port at `index` of the fabric, with the profile
/// its kind gives it.
pub fn attach(index: usize, cfg: &PortConfig) -> std::io::Result<PortShared> {
    PortShared::new(index, cfg.clone(), driver(cfg.kind()).profile(cfg))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ctl status` shows the same form per kind as before the kinds became
    /// drivers, and only an erdma function is an RDMA function.
    #[test]
    fn each_kind_keeps_its_form_and_behaviour() {
        use crate::config::{ErdmaSpec, PortSpec, TapSpec};
        let vxlan = crate::vxlan::VxlanConfig {
            local: "127.0.0.1:4789".parse().unwrap(),
            remotes: vec!["127.0.0.2:4789".parse().unwrap()],
            vni: 1,
            underlay_mtu: 1500,
            df: Default::default(),
        };
        let mut seen = Vec::new();
        for spec in [
            PortSpec::VirtioNet(Default::default()),
            PortSpec::Gve(Default::default()),
            PortSpec::Erdma(ErdmaSpec::new("vm")),
            PortSpec::Vxlan(vxlan),
            PortSpec::Tap(TapSpec { ifname: "t".into() }),
        ] {
            let kind = spec.kind();
            let cfg = PortConfig::with_spec("p", "/x", spec);
            let p = driver(kind).profile(&cfg);
            let erdma = kind == PortKind::Erdma;
            assert_eq!(p.learns, !erdma, "{kind:?}");
            assert_eq!(p.zero_mac_by_ip, erdma, "{kind:?}");
            assert_eq!(p.rdma_function_of.is_some(), erdma, "{kind:?}");
            assert_eq!(p.always_attached, kind != PortKind::VirtioNet, "{kind:?}");
            seen.push(p.form);
        }
        assert_eq!(seen, ["pci", "gve", "erdma", "vxlan", "tap"]);
        let cfg = PortConfig::testdev("p", "/x");
        assert_eq!(driver(cfg.kind()).profile(&cfg).form, "testdev");
    }
}

//! The kinds of port the fabric joins. Each is the far end of a
//! [`PortShared`](crate::fabric::PortShared): the switch sees only that and
//! the [`PortProfile`](crate::fabric::PortProfile) the kind gives it, so a
//! kind's knowledge stays in its module here.
//!
//! - [`virtio_net`]: vhost-user virtio-net devices of guests (`kind=virtio-net`);
//! - [`device`]: emulated PCI devices over vfio-user (`kind=gve`, `kind=erdma`);
//! - [`uplink`]: the way out of the host (`kind=vxlan`, `kind=tap`);
//! - [`host`]: virtual hosts (`--host`), ports whose far end is a thread.

pub mod device;
pub mod host;
pub mod uplink;
pub mod virtio_net;

//! vhost-rdma daemon library: the fabric (an L2 learning switch), the ports
//! it joins (`ports`: vhost-user virtio-net devices, emulated PCI devices
//! over vfio-user, uplinks, virtual hosts), and the server that runs them.
//!
//! The data path is event-driven: each queue pair has a worker thread that
//! sleeps in epoll on the guest's kick eventfds and on a wake eventfd the
//! fabric writes when frames are queued for it.

pub mod activation;
pub mod affinity;
pub mod buffers;
pub mod capture;
pub mod checker;
pub mod config;
pub mod control;
pub mod fabric;
pub mod faults;
pub mod frame;
pub mod match_spec;
pub mod mpa_settle;
pub mod neighbors;
pub mod offload;
pub mod ports;
pub mod server;
pub mod socket_path;
pub mod stages;
pub mod stats;
pub mod steering;
pub mod virtio_net;
pub mod vxlan;

pub use config::{DaemonConfig, DeviceForm, HostSpec, MacAddr, PortConfig};
pub use server::Server;
pub use stats::{PortStats, QueueStats};

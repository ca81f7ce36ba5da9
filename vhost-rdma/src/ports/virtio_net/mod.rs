//! vhost-user virtio-net ports: a guest's virtio-net device whose backend
//! is this daemon. [`chain`] walks the guest's descriptor chains,
//! [`backend`] is the `VhostUserBackend` of one guest connection, and
//! [`proxy`] relays the vhost-user messages in front of it.

pub mod backend;
pub mod chain;
pub mod proxy;

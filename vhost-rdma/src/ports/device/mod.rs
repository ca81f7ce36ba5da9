//! Ports whose guest-facing side is an emulated PCI device served over
//! vfio-user (`kind=gve`, `kind=erdma`). The device models (`gve-device`,
//! `erdma-device`) are sans-IO; this module is their edge in the daemon:
//! the vfio-user server thread (BAR accesses, DMA, interrupts) and a pump
//! thread ([`pump`]) that hands the frames the fabric queued for the port
//! to the device.
//!
//! Frames the device sends go into the fabric from whichever thread made
//! the model call (the vfio-user thread on a doorbell, the pump otherwise),
//! one batch per call, with back-pressure ([`sink`]). Frames towards the
//! device wait in the port's pending queue (with the fabric's
//! back-pressure) until the pump hands them over, a burst at a time; a
//! device queue without receive buffers holds only its own frames.

pub mod bench;
#[cfg(test)]
mod bench_tests;
mod pump;
mod sink;
pub mod trace;

pub use pump::{PumpStatus, BURST, MAX_HELD_QUEUES, STARVED_RETRY};

/// The BARs of the tests' device doubles (pump and bench tests): one 4 KiB
/// 32-bit BAR 0.
#[cfg(test)]
fn test_bars() -> Vec<pci_model::BarInfo> {
    vec![pci_model::BarInfo {
        index: 0,
        size: 0x1000,
        is_64bit: false,
        prefetchable: false,
    }]
}

use crate::config::{GveSpec, PortConfig, PortKind, PortSpec, RcSettings};
use crate::fabric::{Fabric, PortShared};
use bench::{BenchError, DeviceFaultKind, DeviceFaultRule, DeviceFaultSpec, DevicePortFaults};
use erdma_device::{ErdmaConfig, ErdmaDevice};
use gve_device::{GveConfig, GveDevice};
use pci_model::PciDevice;
use pump::{PumpStats, Pumped};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::thread::JoinHandle;
use trace::{PortTrace, TraceStatus};
use vfio_user_server::{DeviceHandle, Limits, VfioUserServer};

/// The device ports of a daemon, for the control socket.
pub type Devices = Arc<Vec<DeviceEntry>>;

/// What the daemon does with a served device, whatever its model: what the
/// pump needs, and stopping and describing it.
trait Served: Pumped {
    fn stop(&self);
    fn dma_regions(&self) -> usize;
    fn detail(&self) -> DeviceDetail;
    /// The pump's view of it.
    fn pumped(&self) -> &dyn Pumped;
    fn add_fault(&self, id: u32, spec: &pci_model::FaultSpec) -> Result<(), pci_model::FaultError>;
    fn clear_faults(&self, id: Option<u32>) -> Result<(), pci_model::FaultError>;
    fn faults(&self) -> Vec<pci_model::FaultStatus>;
    fn fault_kinds(&self) -> &'static [pci_model::FaultKindInfo];
    fn set_link(&self, up: bool) -> bool;
    fn set_trace(&self, sink: Option<Arc<dyn vfio_user_server::TraceSink>>);
}

/// The model-specific part of a device port's status.
trait Describe {
    fn detail(&self) -> DeviceDetail;
}

impl Describe for GveDevice {
    fn detail(&self) -> DeviceDetail {
        DeviceDetail::Gve(Box::new(self.status()))
    }
}

impl Describe for ErdmaDevice {
    fn detail(&self) -> DeviceDetail {
        DeviceDetail::Erdma(Box::new(ErdmaStatus {
            status_register: self.status(),
            path_mtu: self.path_mtu(),
            counters: self.counters(),
            last_rx_refusal: self.last_rx_refusal(),
            last_error_completion: self.last_error_completion().map(str::to_owned),
        }))
    }
}

impl<D: PciDevice + Describe + Send + 'static> Served for DeviceHandle<D> {
    fn pumped(&self) -> &dyn Pumped {
        self
    }
    fn stop(&self) {
        DeviceHandle::stop(self)
    }
    fn dma_regions(&self) -> usize {
        DeviceHandle::dma_regions(self)
    }
    fn detail(&self) -> DeviceDetail {
        self.with_device(|d| d.detail())
    }
    fn add_fault(&self, id: u32, spec: &pci_model::FaultSpec) -> Result<(), pci_model::FaultError> {
        DeviceHandle::add_fault(self, id, spec)
    }
    fn clear_faults(&self, id: Option<u32>) -> Result<(), pci_model::FaultError> {
        DeviceHandle::clear_faults(self, id)
    }
    fn faults(&self) -> Vec<pci_model::FaultStatus> {
        DeviceHandle::faults(self)
    }
    fn fault_kinds(&self) -> &'static [pci_model::FaultKindInfo] {
        DeviceHandle::fault_kinds(self)
    }
    fn set_link(&self, up: bool) -> bool {
        DeviceHandle::set_link(self, up)
    }
    fn set_trace(&self, sink: Option<Arc<dyn vfio_user_server::TraceSink>>) {
        DeviceHandle::set_trace(self, sink)
    }
}

/// A device port as the control socket sees it.
#[derive(Clone)]
pub struct DeviceEntry {
    /// Port name.
    pub port: String,
    handle: Arc<dyn Served>,
    pump: Arc<PumpStats>,
    held_limit: usize,
    trace: Arc<PortTrace>,
}

impl DeviceEntry {
    /// The device kind (`gve`, `erdma`).
    pub fn kind(&self) -> &'static str {
        match self.handle.detail() {
            DeviceDetail::Gve(_) => "gve",
            DeviceDetail::Erdma(_) => "erdma",
        }
    }

    /// Runs a model call from the control side under a panic guard: a
    /// panicking model is reset (as the pump does) and the request refused.
    fn guarded<R>(&self, f: impl FnOnce(&dyn Served) -> R) -> Result<R, BenchError> {
        catch_unwind(AssertUnwindSafe(|| f(&*self.handle))).map_err(|_| {
            tracing::error!(port = %self.port, "device model panicked on a control request; device reset");
            self.handle.pumped().reset();
            BenchError::Panicked(self.port.clone())
        })
    }

    /// Adds a device fault rule (its id: `spec.id`, else one more than the
    /// highest on the port); returns the id.
    pub fn add_fault(&self, spec: &DeviceFaultSpec) -> Result<u32, BenchError> {
        let id = match spec.id {
            Some(id) => id,
            None => self
                .handle
                .faults()
                .iter()
                .map(|r| r.id)
                .max()
                .map_or(Some(1), |m| m.checked_add(1))
                .ok_or_else(|| BenchError::NoFreeId(self.port.clone()))?,
        };
        let model = spec.to_model();
        self.guarded(|h| h.add_fault(id, &model))?
            .map_err(|source| BenchError::Model {
                port: self.port.clone(),
                source,
            })?;
        Ok(id)
    }

    /// Removes rule `id` (all: `None`), undoing its lasting effect.
    pub fn clear_faults(&self, id: Option<u32>) -> Result<(), BenchError> {
        self.guarded(|h| h.clear_faults(id))?
            .map_err(|source| BenchError::Model {
                port: self.port.clone(),
                source,
            })
    }

    /// Whether the port holds rule `id`.
    pub fn has_fault(&self, id: u32) -> bool {
        self.handle.faults().iter().any(|r| r.id == id)
    }

    /// The port's rules with their counters.
    pub fn faults(&self) -> DevicePortFaults {
        DevicePortFaults {
            port: self.port.clone(),
            kind: self.kind().into(),
            rules: self.rules(),
        }
    }

    fn rules(&self) -> Vec<DeviceFaultRule> {
        self.handle.faults()
    }

    /// The fault kinds the device offers.
    pub fn fault_kinds(&self) -> Vec<DeviceFaultKind> {
        self.handle.fault_kinds().iter().map(Into::into).collect()
    }

    /// Shows the link state to the driver (`ctl link`); false if the
    /// device has no link status.
    pub fn set_link(&self, up: bool) -> Result<bool, BenchError> {
        self.guarded(|h| h.set_link(up))
    }

    /// The device was stopped (the daemon shuts down).
    pub fn stopped(&self) -> bool {
        self.handle.pumped().is_stopped()
    }

    /// The port's device trace.
    pub fn trace(&self) -> &PortTrace {
        &self.trace
    }

    /// The port's status for `ctl status`.
    pub fn status(&self) -> DeviceStatus {
        let detail = self.handle.detail();
        DeviceStatus {
            port: self.port.clone(),
            kind: match detail {
                DeviceDetail::Gve(_) => "gve",
                DeviceDetail::Erdma(_) => "erdma",
            }
            .into(),
            dma_regions: self.handle.dma_regions(),
            pump: self.pump.status(self.held_limit),
            faults: self.rules(),
            trace: self.trace.status(),
            detail,
        }
    }
}

/// `ctl status` of a device port: the model's view and how much guest
/// memory QEMU mapped.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct DeviceStatus {
    /// Port name.
    pub port: String,
    /// Device kind (`gve`, `erdma`).
    pub kind: String,
    /// DMA regions QEMU mapped (0: no guest attached).
    pub dma_regions: usize,
    /// The pump: frames held for device queues without buffers, model
    /// panics caught.
    #[serde(default)]
    pub pump: PumpStatus,
    /// Device fault rules with their counters (`ctl device-fault`).
    #[serde(default)]
    pub faults: Vec<DeviceFaultRule>,
    /// The device trace (`ctl trace`).
    #[serde(default)]
    pub trace: TraceStatus,
    /// The model's own status.
    #[serde(flatten)]
    pub detail: DeviceDetail,
}

/// A device model's status.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceDetail {
    /// gVNIC: queues, header split, RSS, flow rules, counters.
    Gve(Box<gve_device::Status>),
    /// erdma: handshake state, path MTU, counters.
    Erdma(Box<ErdmaStatus>),
}

/// What `ctl status` shows of an erdma function.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ErdmaStatus {
    /// The device STATUS register.
    pub status_register: u32,
    /// Path MTU (from CONF_MTU) its RC QPs use.
    pub path_mtu: u32,
    /// Counters.
    pub counters: erdma_device::Counters,
    /// Why a QP refused the last frame it refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_rx_refusal: Option<String>,
    /// The last error completion (QP, opcode, status, and the RC engine's
    /// reason when it came from there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error_completion: Option<String>,
}

/// A running device port.
pub struct DevicePort {
    port: Arc<PortShared>,
    handle: Arc<dyn Served>,
    pump_stats: Arc<PumpStats>,
    trace: Arc<PortTrace>,
    socket: crate::socket_path::OwnedSocket,
    stop: Arc<AtomicBool>,
    server: Option<JoinHandle<()>>,
    pump: Option<JoinHandle<()>>,
}

fn gve_config(cfg: &PortConfig, g: &GveSpec) -> GveConfig {
    GveConfig {
        mac: cfg.mac.0,
        max_tx_queues: u32::from(cfg.queue_pairs),
        max_rx_queues: u32::from(cfg.queue_pairs),
        mtu: g.mtu.unwrap_or(crate::config::DEFAULT_GVE_MTU),
        rsc_hold: g.gro_hold_us.map_or(gve_device::rsc::DEFAULT_HOLD, |us| {
            std::time::Duration::from_micros(u64::from(us))
        }),
        nic_timestamp: g.nic_timestamp,
        ..GveConfig::default()
    }
}

/// The erdma model's configuration: its MAC and the port's RC settings.
fn erdma_config(cfg: &PortConfig, rc: &RcSettings) -> ErdmaConfig {
    let mut c = ErdmaConfig::new(cfg.mac.0);
    c.ack_timeout = rc.ack_timeout.unwrap_or(c.ack_timeout);
    c.retry_cnt = rc.retry_cnt.unwrap_or(c.retry_cnt);
    c.rnr_retry = rc.rnr_retry.unwrap_or(c.rnr_retry);
    c.min_rnr_timer = rc.min_rnr_timer.unwrap_or(c.min_rnr_timer);
    c.max_path_mtu = rc.path_mtu.unwrap_or(c.max_path_mtu);
    c.max_engine_wrs = rc.engine_wrs.map_or(c.max_engine_wrs, |n| n as usize);
    c.max_wrs_per_qp = rc.qp_wrs.map_or(c.max_wrs_per_qp, |n| n as usize);
    c
}

/// The port kind of emulated PCI devices (`kind=gve`, `kind=erdma`).
pub struct DeviceDriver;

impl crate::ports::PortDriver for DeviceDriver {
    /// Always attached with one pending queue (the device refuses what it
    /// cannot take yet and steers to its own queues). An erdma function is
    /// its netdev port's RDMA function: it sends with that port's MAC, so it
    /// is not learned from, and its frames to MAC zero go by destination
    /// IPv4.
    fn profile(&self, cfg: &PortConfig) -> crate::fabric::PortProfile {
        let erdma = cfg.kind() == PortKind::Erdma;
        crate::fabric::PortProfile {
            form: if erdma { "erdma" } else { "gve" },
            learns: !erdma,
            zero_mac_by_ip: erdma,
            always_attached: true,
            reads_headers: true,
            rdma_function_of: if erdma {
                cfg.netdev().map(str::to_string)
            } else {
                None
            },
        }
    }

    fn start(
        &self,
        port: Arc<PortShared>,
        ctx: &crate::ports::StartContext<'_>,
    ) -> anyhow::Result<Box<dyn crate::ports::RunningPort>> {
        let p = DevicePort::start(port, ctx.fabric.clone(), ctx.socket_perms)?;
        Ok(Box::new(p))
    }
}

impl crate::ports::RunningPort for DevicePort {
    fn status(&self) -> crate::ports::PortStatus {
        crate::ports::PortStatus::Device(self.entry())
    }

    fn shutdown(&mut self) {
        DevicePort::shutdown(self);
    }
}

impl DevicePort {
    /// Listens on the port's socket and serves the device its kind names
    /// (gve or erdma) on it.
    /// The socket gets `perms` (owner, group, mode).
    pub fn start(
        port: Arc<PortShared>,
        fabric: Arc<Fabric>,
        perms: &crate::socket_path::SocketPerms,
    ) -> anyhow::Result<DevicePort> {
        use anyhow::Context;
        let name = port.cfg().name.clone();
        let (listener, socket) = crate::socket_path::bind_with(&port.cfg().socket, perms)
            .with_context(|| format!("port {name}: cannot listen"))?;
        let sink = sink::DeviceSink {
            fabric: fabric.clone(),
            port: port.clone(),
        };
        let vfio_err = |e| anyhow::anyhow!("port {name}: vfio-user: {e}");
        let (handle, run): (Arc<dyn Served>, Box<dyn FnOnce() + Send>) = match &port.cfg().spec {
            PortSpec::Erdma(e) => {
                let dev = ErdmaDevice::new(erdma_config(port.cfg(), &e.rc));
                let server =
                    VfioUserServer::from_listener_with_sink(listener, dev, sink, Limits::default())
                        .map_err(vfio_err)?;
                (
                    served(server.handle(), &port),
                    Box::new(move || log_end(server.run())),
                )
            }
            PortSpec::Gve(g) => {
                // TSO frames reach the device whole, checksums unfinished:
                // its HW-GRO places a TSO frame as the coalesced packet its
                // segments would make, else the pump cuts it (`pump.rs`).
                use crate::fabric::RxOffloads;
                port.set_features(0, RxOffloads::CSUM | RxOffloads::TSO4 | RxOffloads::TSO6);
                let dev = GveDevice::new(gve_config(port.cfg(), g));
                let server =
                    VfioUserServer::from_listener_with_sink(listener, dev, sink, Limits::default())
                        .map_err(vfio_err)?;
                (
                    served(server.handle(), &port),
                    Box::new(move || log_end(server.run())),
                )
            }
            _ => anyhow::bail!(
                "port {name}: kind={} is not an emulated PCI device",
                port.cfg().kind().name()
            ),
        };
        let stop = Arc::new(AtomicBool::new(false));
        let server_thread = std::thread::Builder::new()
            .name(format!("vfio-{name}"))
            .spawn(run)
            .context("spawning the vfio-user thread")?;
        let pump_stats = Arc::new(PumpStats::default());
        let (h, s, p, st) = (
            handle.clone(),
            stop.clone(),
            port.clone(),
            pump_stats.clone(),
        );
        let pump = std::thread::Builder::new()
            .name(format!("pump-{name}"))
            .spawn(move || pump::Pump::new(&p, h.pumped(), &st).run(&s))
            .context("spawning the device pump")?;
        tracing::info!(port = %name, socket = %port.cfg().socket.display(), kind = ?port.cfg().kind(), "device listening (vfio-user)");
        let trace = Arc::new(port_trace(&name, &handle));
        Ok(DevicePort {
            port,
            handle,
            pump_stats,
            trace,
            socket,
            stop,
            server: Some(server_thread),
            pump: Some(pump),
        })
    }

    /// What the control socket needs of this port.
    pub fn entry(&self) -> DeviceEntry {
        DeviceEntry {
            port: self.port.cfg().name.clone(),
            handle: self.handle.clone(),
            pump: self.pump_stats.clone(),
            held_limit: self.port.cfg().rx_held_frames(),
            trace: self.trace.clone(),
        }
    }

    /// Stops both threads and removes the socket.
    pub fn shutdown(&mut self) {
        self.stop.store(true, SeqCst);
        // A running trace's file is flushed and closed.
        let _ = self.trace.stop();
        self.handle.stop();
        // Wake the pump from its wait.
        let _ = self.port.rx_queues()[0].wake.write(1);
        for t in [self.pump.take(), self.server.take()].into_iter().flatten() {
            let _ = t.join();
        }
        self.socket.remove();
    }
}

/// The daemon's handle of a served device. A model call on the vfio-user
/// thread that brings the model's next deadline forward (a timer armed, TX
/// left over past gve's budget) wakes the pump, which may be asleep until
/// the deadline it saw last.
fn served<D: PciDevice + Describe + Send + 'static>(
    h: DeviceHandle<D>,
    port: &Arc<PortShared>,
) -> Arc<dyn Served> {
    let p = port.clone();
    h.on_earlier_deadline(move || {
        if let Some(q) = p.rx_queues().first() {
            let _ = q.wake.write(1);
        }
    });
    Arc::new(h)
}

/// The trace of a served device: it switches the device's tracing.
fn port_trace(name: &str, handle: &Arc<dyn Served>) -> PortTrace {
    let h = handle.clone();
    PortTrace::new(name, Box::new(move |sink| h.set_trace(sink)))
}

fn log_end(r: Result<(), vfio_user_server::Error>) {
    if let Err(e) = r {
        tracing::warn!("vfio-user server ended: {e}");
    }
}

impl Drop for DevicePort {
    fn drop(&mut self) {
        self.shutdown();
    }
}

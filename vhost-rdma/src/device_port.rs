//! Ports whose guest-facing side is an emulated PCI device served over
//! vfio-user (`kind=gve`). The device model (`gve-device`) is sans-IO; this
//! module is its edge in the daemon: the vfio-user server thread (BAR
//! accesses, DMA, interrupts) and a pump thread that hands the frames the
//! fabric queued for the port to the device.
//!
//! Frames the device sends go straight into the fabric from the vfio-user
//! thread. Frames towards the device wait in the port's pending queue (with
//! the fabric's back-pressure) until the device takes them; when the driver
//! has posted no receive buffer, the pump retries every millisecond until it
//! has (the `vfio_user` crate tells us of no doorbell), and only then.

use crate::config::PortConfig;
use crate::fabric::{Fabric, PortShared};
use crate::frame::Frame;
use crate::stats::QueueCounters;
use crate::virtio_net::NetHdr;
use gve_device::{GveConfig, GveDevice};
use pci_model::RxRefusal;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use vfio_user_server::{DeviceHandle, Limits, VfioUserServer};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};

/// How long the pump waits before offering a frame again to a device whose
/// driver had no receive buffer posted.
const STARVED_RETRY: Duration = Duration::from_millis(1);

/// The device ports of a daemon, for the control socket.
pub type Devices = Arc<Vec<DeviceEntry>>;

/// A device port as the control socket sees it.
#[derive(Clone)]
pub struct DeviceEntry {
    /// Port name.
    pub port: String,
    handle: DeviceHandle<GveDevice>,
}

impl DeviceEntry {
    /// The port's status for `ctl status`.
    pub fn status(&self) -> DeviceStatus {
        DeviceStatus {
            port: self.port.clone(),
            kind: "gve".into(),
            dma_regions: self.handle.dma_regions(),
            gve: self.handle.with_device(|d| d.status()),
        }
    }
}

/// `ctl status` of a device port: the model's view (queues, header split,
/// RSS, flow rules, counters) and how much guest memory QEMU mapped.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct DeviceStatus {
    /// Port name.
    pub port: String,
    /// Device kind (`gve`).
    pub kind: String,
    /// DMA regions QEMU mapped (0: no guest attached).
    pub dma_regions: usize,
    /// The gve model's status.
    pub gve: gve_device::Status,
}

/// A running device port.
pub struct DevicePort {
    port: Arc<PortShared>,
    handle: DeviceHandle<GveDevice>,
    socket: crate::socket_path::OwnedSocket,
    stop: Arc<AtomicBool>,
    server: Option<JoinHandle<()>>,
    pump: Option<JoinHandle<()>>,
}

fn gve_config(cfg: &PortConfig) -> GveConfig {
    GveConfig {
        mac: cfg.mac.0,
        max_tx_queues: u32::from(cfg.queue_pairs),
        max_rx_queues: u32::from(cfg.queue_pairs),
        ..GveConfig::default()
    }
}

impl DevicePort {
    /// Listens on the port's socket and serves a gve device on it.
    pub fn start(port: Arc<PortShared>, fabric: Arc<Fabric>) -> anyhow::Result<DevicePort> {
        use anyhow::Context;
        let name = port.cfg.name.clone();
        let (listener, socket) = crate::socket_path::bind(&port.cfg.socket)
            .with_context(|| format!("port {name}: cannot listen"))?;
        let device = GveDevice::new(gve_config(&port.cfg));
        let (f, index) = (fabric.clone(), port.index);
        let sink = move |data: Vec<u8>| {
            if let Some(p) = f.ports.get(index) {
                let c = &p.rxq[0].counters;
                QueueCounters::add(&c.tx_frames, 1);
                QueueCounters::add(&c.tx_bytes, data.len() as u64);
            }
            f.forward(
                index,
                Frame {
                    hdr: NetHdr::default(),
                    data,
                },
            );
        };
        let server = VfioUserServer::from_listener(listener, device, sink, Limits::default())
            .map_err(|e| anyhow::anyhow!("port {name}: vfio-user: {e}"))?;
        let handle = server.handle();
        let stop = Arc::new(AtomicBool::new(false));
        let server_thread = std::thread::Builder::new()
            .name(format!("vfio-{name}"))
            .spawn(move || {
                if let Err(e) = server.run() {
                    tracing::warn!("vfio-user server ended: {e}");
                }
            })
            .context("spawning the vfio-user thread")?;
        let (h, s, p) = (handle.clone(), stop.clone(), port.clone());
        let pump = std::thread::Builder::new()
            .name(format!("pump-{name}"))
            .spawn(move || pump(&p, &h, &s))
            .context("spawning the device pump")?;
        tracing::info!(port = %name, socket = %port.cfg.socket.display(), "gve device listening (vfio-user)");
        Ok(DevicePort {
            port,
            handle,
            socket,
            stop,
            server: Some(server_thread),
            pump: Some(pump),
        })
    }

    /// What the control socket needs of this port.
    pub fn entry(&self) -> DeviceEntry {
        DeviceEntry {
            port: self.port.cfg.name.clone(),
            handle: self.handle.clone(),
        }
    }

    /// Stops both threads and removes the socket.
    pub fn shutdown(&mut self) {
        self.stop.store(true, SeqCst);
        self.handle.stop();
        // Wake the pump from its wait.
        let _ = self.port.rxq[0].wake.write(1);
        for t in [self.pump.take(), self.server.take()].into_iter().flatten() {
            let _ = t.join();
        }
        self.socket.remove();
    }
}

impl Drop for DevicePort {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Hands pending frames to the device; runs the device's timers.
fn pump(port: &PortShared, dev: &DeviceHandle<GveDevice>, stop: &AtomicBool) {
    let Ok(epoll) = Epoll::new() else {
        tracing::warn!(port = %port.cfg.name, "cannot create epoll: device port stopped");
        return;
    };
    let rxq = &port.rxq[0];
    if epoll
        .ctl(
            ControlOperation::Add,
            rxq.wake.as_raw_fd(),
            EpollEvent::new(EventSet::IN, 1),
        )
        .is_err()
    {
        return;
    }
    let mut events = [EpollEvent::default(); 2];
    while !stop.load(SeqCst) && !dev.is_stopped() {
        rxq.disarm();
        let mut starved = false;
        while let Some(f) = rxq.pop() {
            match dev.receive(&f.data) {
                Ok(()) => {
                    QueueCounters::add(&rxq.counters.rx_frames, 1);
                    QueueCounters::add(&rxq.counters.rx_bytes, f.data.len() as u64);
                    rxq.mark_fed();
                }
                Err(RxRefusal::NoBuffers) => {
                    rxq.unpop(f);
                    rxq.mark_starved();
                    starved = true;
                    break;
                }
                Err(RxRefusal::NotReady | RxRefusal::Dropped) => {
                    QueueCounters::add(&rxq.counters.rx_drops, 1);
                }
            }
        }
        rxq.wake_waiters();
        // Sleep until frames come, the device's next timer, or (starved) the
        // next retry; at most a second, to notice a stop.
        let mut wait = Duration::from_secs(1);
        if starved {
            wait = wait.min(STARVED_RETRY);
        }
        if let Some(at) = dev.next_deadline() {
            wait = wait.min(at.saturating_duration_since(Instant::now()));
        }
        let ms = wait.as_millis().clamp(if starved { 1 } else { 0 }, 1000) as i32;
        let _ = epoll.wait(ms, &mut events);
        if dev.next_deadline().is_some_and(|at| at <= Instant::now()) {
            dev.poll();
        }
    }
}

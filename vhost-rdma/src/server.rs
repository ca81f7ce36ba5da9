//! The running daemon: the fabric, every port started through its kind's
//! [`PortDriver`](crate::ports::PortDriver), the virtual hosts, the fault
//! timer and the control socket.

use crate::config::DaemonConfig;
use crate::control::ControlServer;
use crate::fabric::Fabric;
use crate::ports::host::HostHandle;
use crate::ports::{PortStatus, RunningPort, StartContext};
use crate::stats::PortStats;
use anyhow::Context;
use std::sync::Arc;
use std::thread::JoinHandle;

/// A running daemon.
pub struct Server {
    fabric: Arc<Fabric>,
    /// The `--port` ports, in configuration order.
    ports: Vec<Box<dyn RunningPort>>,
    control: Option<ControlServer>,
    fault_timer: Option<JoinHandle<()>>,
    hosts: Arc<Vec<Arc<HostHandle>>>,
}

impl Server {
    /// Creates every port's socket and starts serving; returns once all
    /// sockets listen.
    pub fn start(mut cfg: DaemonConfig) -> anyhow::Result<Server> {
        cfg.pair_rdma_ports()?;
        cfg.validate()?;
        let shared = cfg
            .ports
            .iter()
            .enumerate()
            .map(|(i, p)| crate::ports::attach(i, p).map(Arc::new))
            .collect::<Result<Vec<_>, _>>()
            .context("creating port state")?;
        // Virtual hosts attach to the switch as ports after the guests' ports.
        let host_ports = cfg
            .hosts
            .iter()
            .enumerate()
            .map(|(i, h)| HostHandle::attachment(shared.len() + i, h).map(Arc::new))
            .collect::<Result<Vec<_>, _>>()
            .context("creating host state")?;
        let mut all = shared.clone();
        all.extend(host_ports.iter().cloned());
        let fabric = Arc::new(Fabric::with_limits(all, cfg.limits.clone()));
        // Confined to one CPU (--cpu-affinity, a 1-CPU host), a receiver's
        // worker cannot run beside its sender: an early wake would only
        // preempt the sender.
        if let Ok(cpus) = crate::affinity::CpuList::allowed() {
            fabric.set_early_wake(cpus.cpus().len() > 1);
        }
        fabric.checker.configure(cfg.checker);
        if let Some(dir) = &cfg.capture_dir {
            fabric.capture.set_dir(dir.clone());
        }
        for spec in &cfg.faults {
            fabric
                .faults
                .add(spec.clone())
                .map_err(|e| anyhow::anyhow!("fault rule for port {}: {e}", spec.port))?;
        }
        let fault_timer = Some(
            fabric
                .start_fault_timer()
                .context("spawning the fault timer")?,
        );
        let ctx = StartContext {
            fabric: &fabric,
            socket_perms: &cfg.socket_perms,
        };
        let mut ports = Vec::new();
        for port in shared {
            // (On an error, dropping `ports` stops those already started.)
            ports.push(crate::ports::driver(port.cfg().kind()).start(port, &ctx)?);
        }
        let mut hosts = Vec::new();
        for (spec, port) in cfg.hosts.iter().zip(host_ports) {
            match HostHandle::start(spec, port, fabric.clone()) {
                Ok(h) => hosts.push(h),
                Err(e) => {
                    for h in &hosts {
                        h.shutdown();
                    }
                    return Err(e);
                }
            }
        }
        // Device fault rules, on the started device ports (validate()
        // checked each names one).
        for spec in &cfg.device_faults {
            let entry = ports.iter().find_map(|p| match p.status() {
                PortStatus::Device(d) if d.port == spec.port => Some(d),
                _ => None,
            });
            if let Some(d) = entry {
                let id = d
                    .add_fault(spec)
                    .map_err(|e| anyhow::anyhow!("[[device-fault]] {}: {e}", spec.kind))?;
                tracing::info!(port = %spec.port, id, rule = %spec.describe(), "device fault rule added");
            }
        }
        let mut server = Server {
            fabric,
            ports,
            control: None,
            fault_timer,
            hosts: Arc::new(hosts),
        };
        if let Some(path) = &cfg.control {
            let fabric = server.fabric.clone();
            let (mut devices, mut uplinks) = (Vec::new(), Vec::new());
            for p in &server.ports {
                match p.status() {
                    PortStatus::CountersOnly => {}
                    PortStatus::Device(d) => devices.push(d),
                    PortStatus::Uplink(u) => uplinks.push(u),
                }
            }
            let (devices, uplinks) = (Arc::new(devices), Arc::new(uplinks));
            let bound = crate::control::bind_control_socket(path, cfg.control_fallback.as_deref())?;
            server.control = Some(ControlServer::start(
                bound,
                fabric,
                server.hosts.clone(),
                devices,
                uplinks,
            )?);
        }
        Ok(server)
    }

    /// Snapshot of every port's counters.
    pub fn stats(&self) -> Vec<PortStats> {
        self.fabric.ports.iter().map(|p| p.stats()).collect()
    }

    /// The virtual hosts.
    pub fn hosts(&self) -> &[Arc<HostHandle>] {
        &self.hosts
    }

    /// The fabric (for in-process observers and tests).
    pub fn fabric(&self) -> &Arc<Fabric> {
        &self.fabric
    }

    /// Stops serving, disconnects guests and removes the sockets.
    pub fn shutdown(mut self) -> anyhow::Result<()> {
        self.stop_all();
        Ok(())
    }

    fn stop_all(&mut self) {
        if let Some(c) = self.control.take() {
            c.stop();
        }
        for h in self.hosts.iter() {
            h.shutdown();
        }
        for mut p in self.ports.drain(..) {
            p.shutdown();
        }
        if self.fabric.capture.active() {
            let _ = self.fabric.capture.stop();
        }
        self.fabric.stop_fault_timer();
        if let Some(t) = self.fault_timer.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop_all();
    }
}

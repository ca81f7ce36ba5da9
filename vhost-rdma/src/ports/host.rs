//! Virtual hosts on the fabric (`virtual-host` crate): each is a port of
//! the switch whose far end is a thread running a [`VirtualHost`] instead of
//! a guest. The thread sleeps in epoll on the port's wake eventfd (frames
//! queued for it) and a command eventfd, with the host's next timer as the
//! epoll timeout; nothing busy-polls.

use crate::config::HostSpec;
pub use crate::config::ServiceRequest;
use crate::fabric::{Fabric, Frame, PortShared};
use crate::stats::QueueCounters;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tracing::{info, warn};
use virtual_host::{HostConfig, HostError, HostEvent, ServiceSpec, VirtualHost};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// Recent events kept per host for `status`.
const EVENT_HISTORY: usize = 32;
/// Commands waiting for a host thread; more are refused.
const COMMAND_LIMIT: usize = 64;
/// How long a control request waits for the host thread.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);

/// Status of one service (control socket form).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceStats {
    pub id: u32,
    pub kind: String,
    pub peer: Option<String>,
    pub port: u16,
    pub state: String,
    pub sessions_ok: u64,
    pub sessions_failed: u64,
    pub last_iterations: u32,
    pub last_verified: u32,
    pub last_error: Option<String>,
    /// The running session's completed sends and receives.
    #[serde(default)]
    pub sent: u32,
    #[serde(default)]
    pub received: u32,
}

/// Status of one virtual host (control socket form).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostStats {
    pub name: String,
    pub mac: String,
    pub address: String,
    pub rx_frames: u64,
    pub tx_frames: u64,
    pub roce_rx: u64,
    pub roce_tx: u64,
    pub roce_icrc_errors: u64,
    pub roce_malformed: u64,
    pub roce_no_qp: u64,
    pub roce_dropped: u64,
    /// Half-open TCP connections reset (spoofed SYNs, `virtual_host::SYN_RECEIVED_TIMEOUT`).
    #[serde(default)]
    pub tcp_half_open_reset: u64,
    pub qps: usize,
    pub mrs: usize,
    pub tcp_sockets: usize,
    pub services: Vec<ServiceStats>,
    /// The most recent service events, oldest first.
    pub events: Vec<String>,
    /// iWARP connections and errors of the running services.
    #[serde(default)]
    pub iwarp: IwarpStats,
    /// IB CM over RoCE (GSI QP1) of the host.
    #[serde(default)]
    pub cm: CmStats,
}

/// GSI agent and IB CM counters of a host (rdma_cm over RoCE).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct CmStats {
    pub mads_rx: u64,
    pub mads_tx: u64,
    pub bad_mads: u64,
    pub bad_qkey: u64,
    pub established: u64,
    pub unknown_service: u64,
    pub limit_rejects: u64,
    pub rejects_sent: u64,
    pub rejects_received: u64,
    pub retransmits: u64,
    pub timeouts: u64,
}

/// iWARP counters of a host (summed over its running services): the
/// virtual host's own, carried as is.
pub use virtual_host::iwarp::IwarpCounters as IwarpStats;

enum Command {
    Status(mpsc::Sender<HostStats>),
    Start(ServiceSpec, mpsc::Sender<Result<u32, HostError>>),
    Stop(u32, mpsc::Sender<Result<(), HostError>>),
}

/// Why a command to a virtual host's thread failed.
#[derive(Debug, thiserror::Error)]
pub enum HostCommandError {
    /// The host's command queue is full (its thread is stuck or flooded).
    #[error("host {0}: too many pending commands")]
    Busy(String),
    /// The host's thread did not answer in time.
    #[error("host {0}: no answer")]
    NoAnswer(String),
    /// The host refused (e.g. a service limit or bad service parameters).
    #[error(transparent)]
    Refused(#[from] HostError),
}

/// A running virtual host.
pub struct HostHandle {
    pub name: String,
    pub port: Arc<PortShared>,
    commands: Mutex<VecDeque<Command>>,
    wake: EventFd,
    stop: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl HostHandle {
    /// The host's attachment to the fabric: a port with one pending queue,
    /// always attached (its "guest" is the host thread), shown as `host`.
    pub fn attachment(index: usize, spec: &HostSpec) -> std::io::Result<PortShared> {
        let mut cfg = crate::config::PortConfig::new(&spec.name, "");
        cfg.mac = spec.mac;
        let profile = crate::fabric::PortProfile {
            form: "host",
            always_attached: true,
            reads_headers: true,
            ..Default::default()
        };
        PortShared::new(index, cfg, profile)
    }

    /// Creates the host and starts its thread and configured services.
    pub fn start(
        spec: &HostSpec,
        port: Arc<PortShared>,
        fabric: Arc<Fabric>,
    ) -> anyhow::Result<Arc<HostHandle>> {
        let now = Instant::now();
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
            ^ (port.index() as u64) << 48;
        let mut host = VirtualHost::new(
            HostConfig {
                name: spec.name.clone(),
                mac: spec.mac.0,
                ipv4: spec.ipv4,
                prefix_len: spec.prefix_len,
                limits: spec.limits,
                seed,
            },
            now,
        )
        .map_err(|e| anyhow::anyhow!("host {}: {e}", spec.name))?;
        for s in &spec.services {
            let id = host
                .start_service(s.clone(), now)
                .map_err(|e| anyhow::anyhow!("host {}: service {}: {e}", spec.name, s.kind))?;
            info!(host = %spec.name, service = id, kind = %s.kind, "service started");
        }
        let h = Arc::new(HostHandle {
            name: spec.name.clone(),
            port,
            commands: Mutex::new(VecDeque::new()),
            wake: EventFd::new(EFD_NONBLOCK)?,
            stop: AtomicBool::new(false),
            thread: Mutex::new(None),
        });
        let me = h.clone();
        let t = std::thread::Builder::new()
            .name(format!("host-{}", spec.name))
            .spawn(move || {
                if let Err(e) = me.run(host, &fabric) {
                    warn!(host = %me.name, "host thread ended: {e}");
                }
            })?;
        *h.thread.lock().unwrap_or_else(|e| e.into_inner()) = Some(t);
        info!(host = %spec.name, address = %format!("{}/{}", spec.ipv4, spec.prefix_len), mac = %spec.mac, "virtual host ready");
        Ok(h)
    }

    fn command(&self, c: Command) -> Result<(), HostCommandError> {
        {
            let mut q = self.commands.lock().unwrap_or_else(|e| e.into_inner());
            if q.len() >= COMMAND_LIMIT {
                return Err(HostCommandError::Busy(self.name.clone()));
            }
            q.push_back(c);
        }
        let _ = self.wake.write(1);
        Ok(())
    }

    /// Status snapshot (from the host thread).
    pub fn status(&self) -> Result<HostStats, HostCommandError> {
        let (tx, rx) = mpsc::channel();
        self.command(Command::Status(tx))?;
        rx.recv_timeout(COMMAND_TIMEOUT)
            .map_err(|_| HostCommandError::NoAnswer(self.name.clone()))
    }

    /// Starts a service; returns its id.
    pub fn start_service(&self, spec: ServiceSpec) -> Result<u32, HostCommandError> {
        let (tx, rx) = mpsc::channel();
        self.command(Command::Start(spec, tx))?;
        Ok(rx
            .recv_timeout(COMMAND_TIMEOUT)
            .map_err(|_| HostCommandError::NoAnswer(self.name.clone()))??)
    }

    /// Stops a service.
    pub fn stop_service(&self, id: u32) -> Result<(), HostCommandError> {
        let (tx, rx) = mpsc::channel();
        self.command(Command::Stop(id, tx))?;
        Ok(rx
            .recv_timeout(COMMAND_TIMEOUT)
            .map_err(|_| HostCommandError::NoAnswer(self.name.clone()))??)
    }

    /// Ends the thread.
    pub fn shutdown(&self) {
        self.stop.store(true, SeqCst);
        let _ = self.wake.write(1);
        let t = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = t {
            let _ = t.join();
        }
    }

    fn run(&self, mut host: VirtualHost, fabric: &Fabric) -> std::io::Result<()> {
        const FRAMES: u64 = 1;
        const COMMANDS: u64 = 2;
        let epoll = Epoll::new()?;
        let rxq = &self.port.rx_queues()[0];
        epoll.ctl(
            ControlOperation::Add,
            rxq.wake.as_raw_fd(),
            EpollEvent::new(EventSet::IN, FRAMES),
        )?;
        epoll.ctl(
            ControlOperation::Add,
            self.wake.as_raw_fd(),
            EpollEvent::new(EventSet::IN, COMMANDS),
        )?;
        let mut events = [EpollEvent::default(); 4];
        let mut history: VecDeque<String> = VecDeque::new();
        let mut outbox = Vec::new();
        while !self.stop.load(SeqCst) {
            let now = Instant::now();
            rxq.disarm();
            while let Some(f) = rxq.pop() {
                QueueCounters::add(&rxq.counters.rx_frames, 1);
                QueueCounters::add(&rxq.counters.rx_bytes, f.data.len() as u64);
                // The fabric's view when it parsed the frame; else the
                // host parses it (once) if the frame is for it.
                host.handle_parsed(&f.data, f.view.as_deref(), now);
                // Keep the switch moving while a burst is consumed.
                self.flush(&mut host, fabric, &mut outbox);
            }
            // Guest TX sides paused on this queue (back-pressure) resume.
            rxq.mark_fed();
            rxq.wake_waiters();
            let _ = self.wake.read();
            let cmds: Vec<Command> = self
                .commands
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .drain(..)
                .collect();
            for c in cmds {
                match c {
                    Command::Status(tx) => {
                        let _ = tx.send(stats(&host, &history));
                    }
                    Command::Start(spec, tx) => {
                        let kind = spec.kind;
                        let r = host.start_service(spec, now);
                        if let Ok(id) = r {
                            info!(host = %self.name, service = id, %kind, "service started");
                        }
                        let _ = tx.send(r);
                    }
                    Command::Stop(id, tx) => {
                        let _ = tx.send(host.stop_service(id, now));
                    }
                }
            }
            if host.poll_timeout(now).is_some_and(|t| t <= now) {
                host.handle_timeout(now);
            }
            self.flush(&mut host, fabric, &mut outbox);
            while let Some(e) = host.poll_event() {
                log_event(&self.name, &e);
                if history.len() >= EVENT_HISTORY {
                    history.pop_front();
                }
                history.push_back(e.to_string());
            }
            let timeout_ms = match host.poll_timeout(Instant::now()) {
                None => -1,
                Some(t) => {
                    let d = t.saturating_duration_since(Instant::now());
                    // Round up so that we wake at or after the deadline.
                    (d.as_micros().div_ceil(1000)).min(60_000) as i32
                }
            };
            if !rxq.is_empty() {
                continue;
            }
            match epoll.wait(timeout_ms, &mut events) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn flush(&self, host: &mut VirtualHost, fabric: &Fabric, outbox: &mut Vec<Vec<u8>>) {
        outbox.extend(std::iter::from_fn(|| host.poll_transmit()));
        let c = &self.port.rx_queues()[0].counters;
        // One batch per flush: receivers are woken once, after it.
        let mut batch = crate::fabric::Batch::new(Instant::now());
        for data in outbox.drain(..) {
            QueueCounters::add(&c.tx_frames, 1);
            QueueCounters::add(&c.tx_bytes, data.len() as u64);
            fabric.forward_in(
                self.port.index(),
                Frame::new(Default::default(), data),
                &mut batch,
            );
        }
    }
}

fn log_event(name: &str, e: &HostEvent) {
    match e.kind {
        virtual_host::EventKind::SessionFailed { .. } => warn!(host = %name, "{e}"),
        _ => info!(host = %name, "{e}"),
    }
}

fn stats(host: &VirtualHost, history: &VecDeque<String>) -> HostStats {
    let s = host.status();
    let c = s.counters;
    let m = s.mac;
    HostStats {
        name: s.name,
        mac: format!(
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        ),
        address: format!("{}/{}", s.ipv4, s.prefix_len),
        rx_frames: c.rx_frames,
        tx_frames: c.tx_frames,
        roce_rx: c.roce_rx,
        roce_tx: c.roce_tx,
        roce_icrc_errors: c.roce_icrc_errors,
        roce_malformed: c.roce_malformed,
        roce_no_qp: c.roce_no_qp,
        roce_dropped: c.roce_dropped,
        tcp_half_open_reset: c.tcp_half_open_reset,
        qps: s.qps,
        mrs: s.mrs,
        tcp_sockets: s.tcp_sockets,
        services: s
            .services
            .into_iter()
            .map(|v| ServiceStats {
                id: v.id,
                kind: v.kind.to_string(),
                peer: v.peer.map(|p| p.to_string()),
                port: v.port,
                state: v.state,
                sessions_ok: v.sessions_ok,
                sessions_failed: v.sessions_failed,
                last_iterations: v.last_iterations,
                last_verified: v.last_verified,
                last_error: v.last_error,
                sent: v.progress.0,
                received: v.progress.1,
            })
            .collect(),
        events: history.iter().cloned().collect(),
        iwarp: host.iwarp_counters(),
        cm: {
            let (g, c) = host.cm_counters();
            CmStats {
                mads_rx: g.mads_rx,
                mads_tx: g.mads_tx,
                bad_mads: g.bad_mads,
                bad_qkey: g.bad_qkey,
                established: c.established,
                unknown_service: c.unknown_service,
                limit_rejects: c.limit_rejects,
                rejects_sent: c.rejects_sent,
                rejects_received: c.rejects_received,
                retransmits: c.retransmits,
                timeouts: c.timeouts,
            }
        },
    }
}

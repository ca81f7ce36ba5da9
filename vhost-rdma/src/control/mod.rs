//! The control socket: one JSON request per line, one JSON reply per line.
//! `{"cmd":"status"}` returns every port's counters.

pub mod handlers;
mod protocol;

pub use protocol::{Reply, Request, Status};

use crate::fabric::Fabric;
use anyhow::Context;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Longest request line accepted.
const MAX_REQUEST: usize = 64 * 1024;

/// The control socket server thread.
pub struct ControlServer {
    socket: crate::socket_path::OwnedSocket,
    listener: UnixListener,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ControlServer {
    /// Listens on `path` (replacing a stale socket, never a live one).
    pub fn start(
        path: &Path,
        fabric: Arc<Fabric>,
        hosts: Hosts,
        devices: crate::device_port::Devices,
        uplinks: crate::uplink::Uplinks,
    ) -> anyhow::Result<Self> {
        // The socket is as powerful as the daemon's user: owner-only.
        let (l, socket) =
            crate::socket_path::bind_with_mode(path, Some(0o600)).context("control socket")?;
        let listener = l.try_clone().context("control socket")?;
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let active = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let thread = std::thread::Builder::new()
            .name("control".into())
            .spawn(move || {
                for conn in l.incoming() {
                    if s.load(SeqCst) {
                        break;
                    }
                    let Ok(mut c) = conn else { continue };
                    let max = fabric.limits.control_connections;
                    if active.fetch_add(1, SeqCst) >= max {
                        active.fetch_sub(1, SeqCst);
                        fabric.control_refused.fetch_add(1, SeqCst);
                        let reply = Reply {
                            ok: false,
                            error: Some(format!(
                                "too many control connections (at most {max}, [limits] control-connections)"
                            )),
                            ..Reply::default()
                        };
                        if let Ok(mut out) = serde_json::to_string(&reply) {
                            out.push('\n');
                            let _ = c.write_all(out.as_bytes());
                        }
                        continue;
                    }
                    let (f, a, h, d, u) = (
                        fabric.clone(),
                        active.clone(),
                        hosts.clone(),
                        devices.clone(),
                        uplinks.clone(),
                    );
                    let spawned = std::thread::Builder::new()
                        .name("control-conn".into())
                        .spawn(move || {
                            serve(c, &f, &h, &d, &u);
                            a.fetch_sub(1, SeqCst);
                        });
                    if spawned.is_err() {
                        active.fetch_sub(1, SeqCst);
                    }
                }
            })?;
        Ok(ControlServer {
            socket,
            listener,
            stop,
            thread: Some(thread),
        })
    }

    /// Stops and removes the socket.
    pub fn stop(mut self) {
        self.stop.store(true, SeqCst);
        crate::socket_path::unblock_accept(&self.listener);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.socket.remove();
    }
}

/// The daemon's virtual hosts, shared with the control threads.
pub type Hosts = Arc<Vec<Arc<crate::hosts::HostHandle>>>;

fn host_reply(hosts: &Hosts, req: &Request) -> Reply {
    let err = |e: String| Reply {
        ok: false,
        error: Some(e),
        ..Reply::default()
    };
    let find = |name: &str| {
        hosts
            .iter()
            .find(|h| h.name == name)
            .ok_or_else(|| format!("no virtual host named {name:?}"))
    };
    match req {
        Request::Hosts => match hosts.iter().map(|h| h.status()).collect() {
            Ok(v) => Reply {
                ok: true,
                hosts: Some(v),
                ..Reply::default()
            },
            Err(e) => err(e.to_string()),
        },
        Request::HostStart { host, service } => {
            let started = find(host).and_then(|h| {
                let spec = service.spec().map_err(|e| e.to_string())?;
                h.start_service(spec).map_err(|e| e.to_string())
            });
            match started {
                Ok(id) => Reply {
                    ok: true,
                    service_id: Some(id),
                    ..Reply::default()
                },
                Err(e) => err(e),
            }
        }
        Request::HostStop { host, id } => {
            match find(host).and_then(|h| h.stop_service(*id).map_err(|e| e.to_string())) {
                Ok(()) => Reply {
                    ok: true,
                    ..Reply::default()
                },
                Err(e) => err(e),
            }
        }
        _ => err("not a host request".into()),
    }
}

fn serve(
    c: UnixStream,
    fabric: &Fabric,
    hosts: &Hosts,
    devices: &crate::device_port::Devices,
    uplinks: &crate::uplink::Uplinks,
) {
    let _ = c.set_read_timeout(Some(Duration::from_secs(30)));
    let Ok(mut w) = c.try_clone() else { return };
    let mut r = BufReader::new(c);
    let mut line = String::new();
    loop {
        line.clear();
        match (&mut r).take(MAX_REQUEST as u64).read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let reply = match serde_json::from_str::<Request>(line.trim()) {
            Ok(Request::Status) => Reply {
                ok: true,
                error: None,
                status: Some(Status {
                    ports: fabric.ports.iter().map(|p| p.stats()).collect(),
                    mac_table_full: fabric
                        .mac_table_full
                        .load(std::sync::atomic::Ordering::Relaxed),
                    rdma_unresolved: fabric
                        .rdma_unresolved
                        .load(std::sync::atomic::Ordering::Relaxed),
                    control_refused: fabric
                        .control_refused
                        .load(std::sync::atomic::Ordering::Relaxed),
                    fault_rules_refused: fabric
                        .faults
                        .refused_at_limit
                        .load(std::sync::atomic::Ordering::Relaxed),
                    flow_rules_refused: fabric
                        .flow_rules_refused
                        .load(std::sync::atomic::Ordering::Relaxed),
                    checker: Some(fabric.checker.status()),
                    hosts: hosts.iter().filter_map(|h| h.status().ok()).collect(),
                    devices: devices.iter().map(|d| d.status()).collect(),
                    uplinks: uplinks.iter().map(|u| u.status()).collect(),
                }),
                ..Reply::default()
            },
            Ok(
                req @ (Request::FaultAdd { .. }
                | Request::FaultList
                | Request::FaultDel { .. }
                | Request::Link { .. }
                | Request::CaptureStart { .. }
                | Request::CaptureStop
                | Request::CaptureStatus),
            ) => handlers::faults::handle(fabric, &req),
            Ok(req @ (Request::Flows | Request::Findings { .. } | Request::Checker { .. })) => {
                handlers::checker::handle(fabric, &req)
            }
            Ok(req @ (Request::Hosts | Request::HostStart { .. } | Request::HostStop { .. })) => {
                host_reply(hosts, &req)
            }
            Ok(req) => handlers::steering::handle(fabric, &req),
            Err(e) => Reply {
                ok: false,
                error: Some(format!("bad request: {e}")),
                ..Reply::default()
            },
        };
        let Ok(mut out) = serde_json::to_string(&reply) else {
            return;
        };
        out.push('\n');
        if w.write_all(out.as_bytes()).is_err() {
            return;
        }
    }
}

/// Sends one request and returns the reply (client side of `vhost-rdma ctl`).
pub fn request(path: &Path, req: &Request) -> anyhow::Result<Reply> {
    let mut c = UnixStream::connect(path)
        .with_context(|| format!("connecting to control socket {}", path.display()))?;
    c.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut s = serde_json::to_string(req)?;
    s.push('\n');
    c.write_all(s.as_bytes())?;
    let mut line = String::new();
    BufReader::new(c).read_line(&mut line)?;
    serde_json::from_str(&line).context("parsing control reply")
}

//! vhost-user virtio-net ports (`kind=virtio-net`): a guest's virtio-net
//! device whose backend is this daemon. [`chain`] walks the guest's
//! descriptor chains, [`backend`] is the `VhostUserBackend` of one guest
//! connection, and [`proxy`] relays the vhost-user messages in front of it.
//! This module is the port's listener: one thread per port accepting guest
//! connections one after another for as long as the daemon runs, with a
//! fresh backend for each.

pub mod backend;
pub mod chain;
pub mod offloads;
pub mod proxy;

use crate::config::{DeviceForm, PortConfig};
use crate::fabric::{Fabric, PortProfile, PortShared};
use crate::ports::{PortDriver, RunningPort, StartContext};
use anyhow::Context;
use backend::PortBackend;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixListener;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::*};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;
use tracing::{info, warn};
use vhost::vhost_user::Listener;
use vhost_user_backend::VhostUserDaemon;
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// The port kind of vhost-user virtio-net devices.
pub struct VirtioNetDriver;

impl PortDriver for VirtioNetDriver {
    /// Learned from, attached while a guest is connected; `ctl status`
    /// shows its form.
    fn profile(&self, cfg: &PortConfig) -> PortProfile {
        PortProfile {
            form: match cfg.form() {
                DeviceForm::VirtioNetPci => "pci",
                DeviceForm::TestDevice => "testdev",
            },
            ..Default::default()
        }
    }

    fn start(
        &self,
        port: Arc<PortShared>,
        ctx: &StartContext<'_>,
    ) -> anyhow::Result<Box<dyn RunningPort>> {
        Ok(Box::new(VirtioNetPort::start(port, ctx)?))
    }
}

/// A listening virtio-net port.
struct VirtioNetPort {
    socket: crate::socket_path::OwnedSocket,
    /// Written at shutdown to end the port thread's wait for a connection.
    /// Not shutdown(2) on the listener: an inherited listener (`--fd`,
    /// systemd) is shared with its creator, which must still be able to
    /// listen on it after we exit.
    wake: EventFd,
    private_dir: PathBuf,
    thread: Option<JoinHandle<()>>,
    /// The connected front end's socket, to cut it at shutdown.
    conn: Arc<Mutex<Option<UnixStream>>>,
    /// Tells the port thread to accept no more connections.
    stop: Arc<AtomicBool>,
}

impl VirtioNetPort {
    /// Listens on the port's socket and starts its thread.
    fn start(port: Arc<PortShared>, ctx: &StartContext<'_>) -> anyhow::Result<VirtioNetPort> {
        let (public, sock) = port
            .cfg()
            .listen(ctx.socket_perms)
            .with_context(|| format!("port {}: cannot listen", port.cfg().name))?;
        let wake = EventFd::new(EFD_NONBLOCK)
            .with_context(|| format!("port {}: wake eventfd", port.cfg().name))?;
        let wake_handle = wake
            .try_clone()
            .with_context(|| format!("port {}: wake eventfd", port.cfg().name))?;
        // The backend listens on a private socket; a relay joins the two
        // (see `proxy`).
        let private_dir = std::env::temp_dir().join(format!(
            "vhost-rdma-{}-{}-{}",
            std::process::id(),
            port.index(),
            nonce()
        ));
        std::fs::create_dir_all(&private_dir)
            .with_context(|| format!("creating {}", private_dir.display()))?;
        let _ = std::fs::set_permissions(
            &private_dir,
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        );
        let private = private_dir.join("backend.sock");
        let listener = Listener::new(&private, true).map_err(|e| {
            anyhow::anyhow!(
                "port {}: cannot listen on {}: {e}",
                port.cfg().name,
                private.display()
            )
        })?;
        let conn = Arc::new(Mutex::new(None));
        let stop = Arc::new(AtomicBool::new(false));
        let (f, s, c) = (ctx.fabric.clone(), stop.clone(), conn.clone());
        let thread = std::thread::Builder::new()
            .name(format!("port-{}", port.cfg().name))
            .spawn(move || {
                let public = Public {
                    listener: public,
                    wake,
                };
                serve_port(port, f, public, listener, private, s, c)
            })
            .context("spawning port thread")?;
        Ok(VirtioNetPort {
            socket: sock,
            wake: wake_handle,
            private_dir,
            thread: Some(thread),
            conn,
            stop,
        })
    }
}

impl RunningPort for VirtioNetPort {
    fn shutdown(&mut self) {
        self.stop.store(true, SeqCst);
        if let Some(c) = self
            .conn
            .lock()
            .ok()
            .and_then(|c| c.as_ref().and_then(|s| s.try_clone().ok()))
        {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
        // Wake the wait for a connection without going through the
        // socket's path: whatever happened to it, shutdown is prompt.
        let _ = self.wake.write(1);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.socket.remove();
        let _ = std::fs::remove_dir_all(&self.private_dir);
    }
}

impl Drop for VirtioNetPort {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Unique within the process (several servers may run in one, as in the
/// tests: the sub-second clock alone once gave two of them one directory).
fn nonce() -> u64 {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u64)
        .unwrap_or(0);
    (n << 32) | t
}

/// A port's public socket and the eventfd that ends the wait on it.
struct Public {
    listener: UnixListener,
    wake: EventFd,
}

impl Public {
    /// Waits until a connection can be accepted (true) or `wake` is
    /// written (false).
    fn wait(&self) -> std::io::Result<bool> {
        wait_readable(&self.listener, &self.wake)
    }
}

fn wait_readable(l: &UnixListener, wake: &EventFd) -> std::io::Result<bool> {
    let mut fds = [
        libc::pollfd {
            fd: l.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: wake.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    loop {
        // SAFETY: `fds` is a valid array of two pollfds for the call.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if r >= 0 {
            break;
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok(fds[1].revents == 0)
}

fn serve_port(
    port: Arc<PortShared>,
    fabric: Arc<Fabric>,
    public: Public,
    mut listener: Listener,
    private: PathBuf,
    stop: Arc<AtomicBool>,
    conn: Arc<Mutex<Option<UnixStream>>>,
) {
    let name = port.cfg().name.clone();
    info!(port = %name, socket = %port.cfg().socket.display(), "listening");
    while !stop.load(SeqCst) {
        match public.wait() {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) => {
                warn!(port = %name, "waiting for a connection: {e}");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        }
        let front = match public.listener.accept() {
            Ok((s, _)) => s,
            Err(_) if stop.load(SeqCst) => break,
            Err(e) => {
                warn!(port = %name, "accept failed: {e}");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        if stop.load(SeqCst) {
            break;
        }
        let backend = match PortBackend::new(port.clone(), fabric.clone()) {
            Ok(b) => Arc::new(b),
            Err(e) => {
                warn!(port = %name, "cannot create backend: {e}");
                continue;
            }
        };
        let mem = GuestMemoryAtomic::new(GuestMemoryMmap::new());
        let mut daemon =
            match VhostUserDaemon::new(format!("vhost-rdma-{name}"), backend.clone(), mem) {
                Ok(d) => d,
                Err(e) => {
                    warn!(port = %name, "cannot create vhost-user daemon: {e}");
                    continue;
                }
            };
        for (t, h) in daemon.get_epoll_handlers().iter().enumerate() {
            if let Some(q) = port.rx_queues().get(t) {
                if let Err(e) =
                    h.register_listener(q.wake.as_raw_fd(), EventSet::IN, backend.wake_event_id(t))
                {
                    warn!(port = %name, "cannot register wake event: {e}");
                }
            }
            if let Some(r) = port.tx_resume().get(t) {
                if let Err(e) =
                    h.register_listener(r.as_raw_fd(), EventSet::IN, backend.resume_event_id(t))
                {
                    warn!(port = %name, "cannot register TX resume event: {e}");
                }
            }
            if let Some(tm) = port.tx_timers().get(t) {
                let fd = tm.lock().map(|t| t.as_raw_fd()).unwrap_or(-1);
                if let Err(e) = h.register_listener(fd, EventSet::IN, backend.timer_event_id(t)) {
                    warn!(port = %name, "cannot register TX timer: {e}");
                }
            }
        }
        // The connection is queued in the private listener's backlog, so
        // start() below accepts it at once.
        let back = match UnixStream::connect(&private) {
            Ok(b) => b,
            Err(e) => {
                warn!(port = %name, "cannot reach backend socket: {e}");
                backend.signal_exit();
                continue;
            }
        };
        if let Err(e) = daemon.start(&mut listener) {
            warn!(port = %name, "backend accept failed: {e}");
            backend.signal_exit();
            continue;
        }
        if let Ok(mut c) = conn.lock() {
            *c = front.try_clone().ok();
        }
        if stop.load(SeqCst) {
            let _ = front.shutdown(std::net::Shutdown::Both);
        }
        // Assume every RX queue usable until its worker finds the vring
        // disabled (it then hands the frames to queue pair 0); waiting for
        // the enable event instead races with the first frames.
        for q in port.rx_queues() {
            q.enabled.store(true, SeqCst);
        }
        let n = port.connect();
        info!(port = %name, connection = n, "guest connected");
        let relay_name = name.clone();
        let relay = std::thread::Builder::new()
            .name(format!("vu-{name}"))
            .spawn(move || proxy::relay(front, back, &relay_name));
        let result = daemon.wait();
        if let Ok(Ok(Err(e))) = relay.map(|t| t.join()) {
            info!(port = %name, "front-end connection: {e}");
        }
        port.disconnect();
        if let Ok(mut c) = conn.lock() {
            *c = None;
        }
        fabric.forget_port(port.index());
        let dropped: usize = port.rx_queues().iter().map(|q| q.clear()).sum();
        match result {
            Ok(()) => info!(port = %name, dropped_pending = dropped, "guest disconnected"),
            Err(vhost_user_backend::Error::HandleRequest(
                vhost::vhost_user::Error::Disconnected | vhost::vhost_user::Error::PartialMessage,
            )) => info!(port = %name, dropped_pending = dropped, "guest disconnected"),
            Err(e) => {
                port.count_protocol_error();
                info!(port = %name, dropped_pending = dropped, "guest connection ended: {e}")
            }
        }
        backend.signal_exit();
        drop(daemon);
        for q in port.rx_queues() {
            q.enabled.store(false, SeqCst);
        }
        port.set_features(0, crate::fabric::RxOffloads::NONE);
    }
    info!(port = %name, "stopped");
}

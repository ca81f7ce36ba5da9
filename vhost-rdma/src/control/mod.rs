//! The control socket and its protocol.
//!
//! **Transport.** A Unix stream socket, owner-only (mode 0600). The client
//! writes one JSON object per line and reads one JSON reply line for each;
//! a connection may carry many requests. A request line is at most 64 KiB
//! (a longer one is not understood); a connection silent for 30 s is
//! closed; one beyond `[limits] control-connections` gets a refusal and is
//! closed.
//!
//! **Requests** ([`Request`]) name their kind in `"cmd"` (kebab-case), the
//! kind's fields beside it: `status`; `flow-rule-add`, `flow-rule-list`,
//! `flow-rule-del`, `rss` (steering); `fault-add`, `fault-list`,
//! `fault-del`, `link` (faults); `capture-start`, `capture-stop`,
//! `capture-status`; `flows`, `findings`, `checker` (protocol checker);
//! `hosts`, `host-start`, `host-stop` (virtual hosts); `device-fault-add`,
//! `device-fault-list`, `device-fault-clear`, `device-fault-kinds`,
//! `trace-start`, `trace-stop`, `trace-show`, `trace-follow` (the driver
//! bench: device ports). `trace-follow`, as a connection's first request,
//! turns the connection into a stream: the reply line, then one trace line
//! per record until the client closes it. For example
//! `{"cmd":"flow-rule-del","port":"a","id":3}`.
//!
//! **Replies** ([`Reply`]) are `{"ok":true, <body>, "version":1}` or
//! `{"ok":false,"error":"why","version":1}`. The body ([`ReplyBody`]) is
//! one kind of answer whose fields sit at the top level: `status`, `rss`,
//! `rules` (and `rule_id` after an add), `faults` (and `fault_id` after an
//! add), `capture`, `flows` or `findings` (each with `checker`), `checker`,
//! `hosts`, `service_id`, `device_faults` (and `device_fault_id` after an
//! add), `fault_kinds`, `trace` (and `trace_lines` for `trace-show`); none
//! for a bare acknowledgement (`host-stop`).
//!
//! **Versions.** Every reply carries the daemon's [`PROTOCOL_VERSION`]
//! (1). A request may carry `"version"`, the version its client speaks
//! (absent: 1); one outside [`MIN_PROTOCOL_VERSION`]..=[`PROTOCOL_VERSION`]
//! is refused, whatever else it says, with an error naming the versions
//! spoken, and counted in `status.control_version_refused`. A change that
//! existing clients would misread (a key renamed or removed, a meaning
//! changed) raises the version; new request kinds and new reply keys do
//! not.
//!
//! **Code.** The wire types (`protocol.rs`, re-exported here) are shared
//! with clients; [`request`] is `vhost-rdma ctl`'s side. The server parses a
//! line, dispatches it to one of the [`handlers`] (one per feature), which
//! answers from the engines, and writes the reply. The engines know nothing
//! of this protocol.

pub mod discovery;
pub mod handlers;
mod protocol;

pub use protocol::{
    Reply, ReplyBody, Request, RequestError, Status, VersionedRequest, MIN_PROTOCOL_VERSION,
    PROTOCOL_VERSION,
};

use crate::fabric::Fabric;
use anyhow::Context as _;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
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
    /// Serves `ctl` on `bound`, a socket from [`bind_control_socket`].
    pub fn start(
        bound: (UnixListener, crate::socket_path::OwnedSocket),
        fabric: Arc<Fabric>,
        hosts: Hosts,
        devices: crate::ports::device::Devices,
        uplinks: crate::ports::uplink::Uplinks,
    ) -> anyhow::Result<Self> {
        let (l, socket) = bound;
        tracing::info!(socket = %socket.path().display(), "control socket listening");
        let listener = l.try_clone().context("control socket")?;
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let active = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let ctx = Arc::new(Context {
            fabric,
            hosts,
            devices,
            uplinks,
            version_refused: AtomicU64::new(0),
        });
        let thread = std::thread::Builder::new()
            .name("control".into())
            .spawn(move || {
                for conn in l.incoming() {
                    if s.load(SeqCst) {
                        break;
                    }
                    let Ok(mut c) = conn else { continue };
                    let max = ctx.fabric.limits.control_connections;
                    if active.fetch_add(1, SeqCst) >= max {
                        active.fetch_sub(1, SeqCst);
                        ctx.fabric.control_refused.fetch_add(1, SeqCst);
                        let reply = Reply::refused(format_args!(
                            "too many control connections (at most {max}, [limits] control-connections)"
                        ));
                        if let Ok(mut out) = serde_json::to_string(&reply) {
                            out.push('\n');
                            let _ = c.write_all(out.as_bytes());
                        }
                        continue;
                    }
                    let (ctx, a) = (ctx.clone(), active.clone());
                    let spawned = std::thread::Builder::new()
                        .name("control-conn".into())
                        .spawn(move || {
                            serve(c, &ctx);
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

/// Binds the control socket at `path` (replacing a stale socket, never a
/// live one), owner-only. When another process serves `path` and there is
/// a `fallback`, binds that instead, with a warning: the daemon still gets
/// a control socket, which `ctl --pid` finds.
pub fn bind_control_socket(
    path: &Path,
    fallback: Option<&Path>,
) -> anyhow::Result<(UnixListener, crate::socket_path::OwnedSocket)> {
    use crate::socket_path::{bind_with_mode, BindError};
    // The socket is as powerful as the daemon's user: owner-only.
    const MODE: Option<u32> = Some(0o600);
    match (bind_with_mode(path, MODE), fallback) {
        (Err(BindError::InUse(_)), Some(fallback)) => {
            tracing::warn!(
                served = %path.display(),
                socket = %fallback.display(),
                "another process serves the shared control socket; this daemon listens on its own instead (`vhost-rdma ctl --pid {}`)",
                std::process::id()
            );
            bind_with_mode(fallback, MODE).context("control socket")
        }
        (r, _) => r.context("control socket"),
    }
}

/// The daemon's virtual hosts, shared with the control threads.
pub type Hosts = Arc<Vec<Arc<crate::ports::host::HostHandle>>>;

/// What the control threads serve: the fabric and the daemon's parts beside
/// the switch, shared by every connection.
pub struct Context {
    /// The switch and its engines.
    pub fabric: Arc<Fabric>,
    /// The virtual hosts.
    pub hosts: Hosts,
    /// The emulated PCI device ports.
    pub devices: crate::ports::device::Devices,
    /// The uplink ports.
    pub uplinks: crate::ports::uplink::Uplinks,
    /// Requests refused for their protocol version (`status`:
    /// `control_version_refused`).
    pub version_refused: AtomicU64,
}

/// Answers one request line: parse, hand to the feature's handler, wrap its
/// answer (or the refusal) in a reply.
fn answer(ctx: &Context, line: &str) -> Reply {
    let req = match Request::parse(line) {
        Ok(req) => req,
        Err(e) => {
            if let RequestError::Version(_) = e {
                ctx.version_refused.fetch_add(1, Relaxed);
            }
            return Reply::refused(e);
        }
    };
    match dispatch(ctx, &req) {
        Ok(body) => Reply::ok(body),
        Err(e) => Reply::refused(e),
    }
}

/// Routes a request to its feature's handler. Exhaustive, so a new request
/// kind cannot be forgotten here.
fn dispatch(ctx: &Context, req: &Request) -> handlers::Answer {
    use Request as R;
    match req {
        R::Status => handlers::status::handle(ctx),
        R::FlowRuleAdd { .. } | R::FlowRuleList { .. } | R::FlowRuleDel { .. } | R::Rss { .. } => {
            handlers::steering::handle(&ctx.fabric, req)
        }
        R::FaultAdd { .. } | R::FaultList | R::FaultDel { .. } => {
            handlers::faults::handle(&ctx.fabric, req)
        }
        // The fabric's link, and the device's when the port is one.
        R::Link { .. } => handlers::device_faults::link(ctx, req),
        R::DeviceFaultAdd { .. }
        | R::DeviceFaultList
        | R::DeviceFaultClear { .. }
        | R::DeviceFaultKinds { .. } => handlers::device_faults::handle(ctx, req),
        R::TraceStart { .. } | R::TraceStop { .. } | R::TraceShow { .. } => {
            handlers::trace::handle(ctx, req)
        }
        // Served by `serve` itself (it streams); here only when it came
        // after another request.
        R::TraceFollow { .. } => Err(handlers::HandlerError::FollowNotFirst),
        R::CaptureStart { .. } | R::CaptureStop | R::CaptureStatus => {
            handlers::capture::handle(&ctx.fabric, req)
        }
        R::Flows | R::Findings { .. } | R::Checker { .. } => {
            handlers::checker::handle(&ctx.fabric, req)
        }
        R::Hosts | R::HostStart { .. } | R::HostStop { .. } => {
            handlers::hosts::handle(&ctx.hosts, req)
        }
    }
}

/// Serves one connection: a reply line for each request line, until the
/// client closes, goes quiet for 30 s or sends an over-long line.
fn serve(c: UnixStream, ctx: &Context) {
    let _ = c.set_read_timeout(Some(Duration::from_secs(30)));
    let Ok(mut w) = c.try_clone() else { return };
    let mut r = BufReader::new(c);
    let mut line = String::new();
    let mut first = true;
    loop {
        line.clear();
        match (&mut r).take(MAX_REQUEST as u64).read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if std::mem::take(&mut first) {
            if let Ok(Request::TraceFollow { port }) = Request::parse(line.trim()) {
                handlers::trace::follow(ctx, &port, r.get_ref(), &mut w);
                return;
            }
        }
        let reply = answer(ctx, line.trim());
        let Ok(mut out) = serde_json::to_string(&reply) else {
            return;
        };
        out.push('\n');
        if w.write_all(out.as_bytes()).is_err() {
            return;
        }
    }
}

/// Follows a device port's trace (client side of `vhost-rdma ctl trace
/// --follow`): sends `trace-follow`, then hands each trace line to `line`
/// until the daemon closes the connection or `line` answers false. A
/// refusal is returned as an error.
pub fn follow_trace(
    path: &Path,
    port: &str,
    mut line: impl FnMut(&str) -> bool,
) -> anyhow::Result<()> {
    let mut c = UnixStream::connect(path)
        .with_context(|| format!("connecting to control socket {}", path.display()))?;
    let mut s = serde_json::to_string(&VersionedRequest {
        request: &Request::TraceFollow {
            port: port.to_string(),
        },
        version: PROTOCOL_VERSION,
    })?;
    s.push('\n');
    c.write_all(s.as_bytes())?;
    let mut r = BufReader::new(c);
    let mut first = String::new();
    r.read_line(&mut first)?;
    let reply: Reply = serde_json::from_str(&first).context("parsing control reply")?;
    if !reply.ok {
        anyhow::bail!("daemon refused: {}", reply.error.unwrap_or_default());
    }
    let mut l = String::new();
    loop {
        l.clear();
        if r.read_line(&mut l)? == 0 {
            return Ok(());
        }
        if !line(l.trim_end_matches('\n')) {
            return Ok(());
        }
    }
}

/// Sends one request and returns the reply (client side of `vhost-rdma ctl`).
pub fn request(path: &Path, req: &Request) -> anyhow::Result<Reply> {
    request_within(path, req, Duration::from_secs(10))
}

/// [`request`], waiting at most `timeout` for the reply.
pub fn request_within(path: &Path, req: &Request, timeout: Duration) -> anyhow::Result<Reply> {
    let mut c = UnixStream::connect(path)
        .with_context(|| format!("connecting to control socket {}", path.display()))?;
    c.set_read_timeout(Some(timeout))?;
    // Naming our version lets a daemon that does not speak it say so
    // instead of misreading the request.
    let mut s = serde_json::to_string(&VersionedRequest {
        request: req,
        version: PROTOCOL_VERSION,
    })?;
    s.push('\n');
    c.write_all(s.as_bytes())?;
    let mut line = String::new();
    BufReader::new(c).read_line(&mut line)?;
    serde_json::from_str(&line).context("parsing control reply")
}

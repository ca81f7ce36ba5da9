//! Device trace requests (the driver bench): start, stop, show, follow.

use super::device_faults::device;
use super::{Answer, HandlerError};
use crate::control::{Context, Reply, ReplyBody, Request};
use crate::ports::device::trace::TraceError;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::mpsc::RecvTimeoutError;
use std::time::Duration;

const WHAT: &str = "device traces";

/// Serves `trace-start`, `trace-stop` and `trace-show`.
pub fn handle(ctx: &Context, req: &Request) -> Answer {
    let body = match req {
        Request::TraceStart { port, file } => {
            let d = device(ctx, port, WHAT)?;
            let open = || match file {
                None => Ok(None),
                Some(f) => {
                    if !f.is_relative() {
                        return Err(TraceError::NotRelative(f.clone()));
                    }
                    let dir = ctx
                        .fabric
                        .capture
                        .given_dir()
                        .ok_or(TraceError::NoCaptureDir)?;
                    Ok(Some(crate::capture::open_new_capture_file(&dir, f)?))
                }
            };
            let trace = d
                .trace()
                .start(open, ctx.fabric.limits.trace_max_bytes)
                .map_err(crate::ports::device::bench::BenchError::from)?;
            tracing::info!(port = %port, file = ?trace.file, "device trace started");
            ReplyBody::Trace { trace }
        }
        Request::TraceStop { port } => {
            let trace = device(ctx, port, WHAT)?
                .trace()
                .stop()
                .map_err(crate::ports::device::bench::BenchError::from)?;
            tracing::info!(port = %port, records = trace.records, "device trace stopped");
            ReplyBody::Trace { trace }
        }
        Request::TraceShow { port } => {
            let t = device(ctx, port, WHAT)?.trace();
            ReplyBody::TraceShown {
                trace_lines: t.lines(),
                trace: t.status(),
            }
        }
        _ => return Err(HandlerError::Misrouted("trace")),
    };
    Ok(Some(body))
}

fn send(w: &mut UnixStream, reply: &Reply) -> bool {
    let Ok(mut out) = serde_json::to_string(reply) else {
        return false;
    };
    out.push('\n');
    w.write_all(out.as_bytes()).is_ok()
}

/// Whether the client closed its end (a non-blocking peek reads EOF).
fn client_gone(c: &UnixStream) -> bool {
    let mut b = [0u8; 1];
    // SAFETY: recv into a valid one-byte buffer on a descriptor we hold.
    let n = unsafe {
        libc::recv(
            c.as_raw_fd(),
            b.as_mut_ptr().cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    n == 0
        || (n < 0 && {
            let e = std::io::Error::last_os_error().raw_os_error();
            e != Some(libc::EAGAIN) && e != Some(libc::EWOULDBLOCK) && e != Some(libc::EINTR)
        })
}

/// Serves `trace-follow` on its connection: the reply line (refusal or the
/// trace's status), then the ring's lines and every new one, until the
/// client closes the connection or the port stops. The device never waits
/// for this client: lines it has no room for are dropped, counted
/// (`follower_dropped`).
pub fn follow(ctx: &Context, port: &str, conn: &UnixStream, w: &mut UnixStream) {
    let d = match device(ctx, port, WHAT) {
        Ok(d) => d,
        Err(e) => {
            send(w, &Reply::refused(e));
            return;
        }
    };
    let t = d.trace();
    let f = t.follow();
    tracing::info!(port = %port, "device trace follower connected");
    if !send(w, &Reply::ok(Some(ReplyBody::Trace { trace: t.status() }))) {
        return;
    }
    let _ = w.set_write_timeout(Some(Duration::from_secs(5)));
    let mut out = String::new();
    for l in &f.backlog {
        out.push_str(l);
        out.push('\n');
    }
    if !out.is_empty() && w.write_all(out.as_bytes()).is_err() {
        return;
    }
    loop {
        match f.rx.recv_timeout(Duration::from_millis(500)) {
            Ok(l) => {
                let mut out = l;
                out.push('\n');
                // What else is queued goes in the same write.
                for more in f.rx.try_iter().take(256) {
                    out.push_str(&more);
                    out.push('\n');
                }
                if w.write_all(out.as_bytes()).is_err() {
                    break;
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                if client_gone(conn) || d.stopped() {
                    break;
                }
            }
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    tracing::info!(port = %port, "device trace follower gone");
}

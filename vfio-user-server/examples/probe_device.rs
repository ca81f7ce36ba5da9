//! Serves the probe device (`vfio_user_server::probe`) on a vfio-user
//! socket, for checking a QEMU setup:
//!
//! ```text
//! cargo run -p vfio-user-server --example probe_device -- /tmp/probe.sock [SECONDS]
//! qemu-system-x86_64 ... -device '{"driver":"vfio-user-pci","socket":{"type":"unix","path":"/tmp/probe.sock"}}'
//! ```
//!
//! Logs the vfio-user traffic (`RUST_LOG=debug` for every message), prints
//! the counters when they change, and stops after SECONDS if given.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use vfio_user_server::probe::ProbeDevice;

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let mut args = std::env::args().skip(1);
    let Some(path) = args.next().map(PathBuf::from) else {
        eprintln!("usage: probe_device SOCKET [SECONDS]");
        std::process::exit(2);
    };
    let seconds: Option<u64> = args.next().and_then(|s| s.parse().ok());
    let (handle, thread) = vfio_user_server::serve(&path, ProbeDevice::new(), |frame| {
        tracing::info!(len = frame.len(), "probe device sent a frame");
    })
    .unwrap_or_else(|e| {
        eprintln!("probe_device: {e}");
        std::process::exit(1);
    });
    tracing::info!("serving the probe device on {}", path.display());
    let end = seconds.map(|s| Instant::now() + Duration::from_secs(s));
    let mut last = handle.stats();
    loop {
        if end.is_some_and(|e| Instant::now() >= e) || thread.is_finished() {
            break;
        }
        // the daemon's timer duty: poll at the device's deadline
        if handle
            .next_deadline(Instant::now())
            .is_some_and(|d| d <= Instant::now())
        {
            handle.poll();
        }
        let s = handle.stats();
        if s != last {
            tracing::info!(?s, "stats");
            last = s;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    handle.stop();
    match thread.join() {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::error!("server: {e}"),
        Err(_) => tracing::error!("server thread panicked"),
    }
    tracing::info!(stats = ?handle.stats(), "stopped");
}

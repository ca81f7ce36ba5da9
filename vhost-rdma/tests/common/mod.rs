//! Shared test harness: the in-process vhost-user frontend ([`frontend`])
//! with its two virtio-net drivers, the strict [`guest::TestGuest`] and the
//! lean [`fast_guest::FastGuest`] of the fabric bench, packet
//! builders/checkers ([`packet`]) and a helper that runs a daemon with N
//! ports in a temp dir ([`TestFabric`]). The benches include it with
//! `#[path]`.
#![allow(dead_code)]

pub mod fast_guest;
pub mod frontend;
pub mod guest;
pub mod packet;

#[allow(unused_imports)]
pub use frontend::feat;
#[allow(unused_imports)]
pub use guest::{GuestOpts, Layout, NetHdr, RawDesc, RxFrame, TestGuest, TxOpts};

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use vhost_rdma::config::HostSpec;
use vhost_rdma::{DaemonConfig, MacAddr, PortConfig, PortStats, Server};

/// The virtual hosts the daemon behind control socket `ctl` lists.
pub fn virtual_hosts(ctl: &Path) -> Vec<vhost_rdma::ports::host::HostStats> {
    vhost_rdma::control::request(ctl, &vhost_rdma::control::Request::Hosts)
        .unwrap()
        .into_hosts()
        .unwrap()
}

/// Time allowed for something that must happen.
pub const ARRIVE: Duration = Duration::from_secs(5);
/// Time we wait to conclude that something does not happen.
pub const QUIET: Duration = Duration::from_millis(300);

/// A unique temporary directory, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "vhr-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The MAC of port `i` in a [`TestFabric`].
pub fn port_mac(i: usize) -> [u8; 6] {
    packet::mac(0x10 + i as u8)
}

/// A daemon with N ports, each with a socket in its own temp dir.
pub struct TestFabric {
    pub server: Option<Server>,
    pub ports: Vec<PortConfig>,
    dir: TempDir,
}

impl TestFabric {
    pub fn port_config(dir: &Path, i: usize, queue_pairs: u16) -> PortConfig {
        PortConfig {
            name: format!("p{i}"),
            socket: dir.join(format!("p{i}.sock")),
            mac: MacAddr(port_mac(i)),
            queue_pairs,
            rx_queue_frames: 256,
            flow_rules: Vec::new(),
            ..PortConfig::new("", "")
        }
    }

    /// `n` ports with `queue_pairs` each, VirtioNetPci form.
    pub fn start(n: usize, queue_pairs: u16) -> TestFabric {
        Self::start_with(n, |i, dir| Self::port_config(dir, i, queue_pairs))
    }

    /// `n` ports built by `f(index, dir)`.
    pub fn start_with(n: usize, f: impl Fn(usize, &Path) -> PortConfig) -> TestFabric {
        Self::start_full(n, f, false)
    }

    /// Like [`start_with`](Self::start_with), optionally with a control
    /// socket at [`control_socket`](Self::control_socket).
    pub fn start_full(
        n: usize,
        f: impl Fn(usize, &Path) -> PortConfig,
        control: bool,
    ) -> TestFabric {
        Self::start_limits(n, f, control, vhost_rdma::config::Limits::default())
    }

    /// Like [`start_full`](Self::start_full), with the given `[limits]`.
    pub fn start_limits(
        n: usize,
        f: impl Fn(usize, &Path) -> PortConfig,
        control: bool,
        limits: vhost_rdma::config::Limits,
    ) -> TestFabric {
        Self::start_config(n, f, Vec::new(), control, limits)
    }

    /// Like [`start_full`](Self::start_full), with the virtual `hosts`.
    pub fn start_hosts(
        n: usize,
        f: impl Fn(usize, &Path) -> PortConfig,
        hosts: Vec<HostSpec>,
        control: bool,
    ) -> TestFabric {
        Self::start_config(n, f, hosts, control, vhost_rdma::config::Limits::default())
    }

    fn start_config(
        n: usize,
        f: impl Fn(usize, &Path) -> PortConfig,
        hosts: Vec<HostSpec>,
        control: bool,
        limits: vhost_rdma::config::Limits,
    ) -> TestFabric {
        init_logging();
        let dir = TempDir::new("fabric");
        let ports: Vec<PortConfig> = (0..n).map(|i| f(i, dir.path())).collect();
        let server = Server::start(DaemonConfig {
            ports: ports.clone(),
            hosts,
            control: control.then(|| dir.path().join("ctl.sock")),
            capture_dir: Some(dir.path().to_path_buf()),
            limits,
            ..DaemonConfig::default()
        })
        .expect("Server::start");
        for p in &ports {
            assert!(
                p.socket.exists(),
                "Server::start returned but {} does not exist",
                p.socket.display()
            );
        }
        TestFabric {
            server: Some(server),
            ports,
            dir,
        }
    }

    pub fn socket(&self, i: usize) -> &Path {
        &self.ports[i].socket
    }

    pub fn mac(&self, i: usize) -> [u8; 6] {
        self.ports[i].mac.0
    }

    /// Two ports of one queue pair (with a control socket if `control`), a
    /// guest taking every feature on each, 128 RX buffers posted on both.
    pub fn pair(control: bool) -> (TestFabric, TestGuest, TestGuest) {
        let fab = Self::start_full(2, |i, d| Self::port_config(d, i, 1), control);
        let mut a = fab.connect(0, feat::ALL);
        let mut b = fab.connect(1, feat::ALL);
        a.post_rx(0, 128, 2048);
        b.post_rx(0, 128, 2048);
        (fab, a, b)
    }

    /// A single-queue guest with every feature on ports `from` and `to`,
    /// for throughput runs: `to` gets a full ring of 2 KiB RX buffers,
    /// `from` a few (it only hears the odd frame back).
    pub fn sender_receiver(&self, from: usize, to: usize) -> (TestGuest, TestGuest) {
        let features = feat::ALL & !feat::MQ;
        let mut a = self.connect(from, features);
        let mut b = self.connect(to, features);
        b.post_rx(0, 256, 2048);
        a.post_rx(0, 8, 2048);
        (a, b)
    }

    /// Connects a guest to port `i`, with as many queue pairs as the port has.
    pub fn connect(&self, i: usize, features: u64) -> TestGuest {
        TestGuest::connect(self.socket(i), self.ports[i].queue_pairs, features)
            .unwrap_or_else(|e| panic!("connecting to port {i}: {e:#}"))
    }

    pub fn stats(&self, i: usize) -> PortStats {
        let name = &self.ports[i].name;
        let all = self.server.as_ref().unwrap().stats();
        all.iter()
            .find(|s| &s.name == name)
            .cloned()
            .unwrap_or_else(|| panic!("no stats for port {name}: {all:?}"))
    }

    /// Polls the stats of port `i` until `pred` holds; returns the last snapshot
    /// and whether `pred` held.
    pub fn wait_stats(
        &self,
        i: usize,
        timeout: Duration,
        pred: impl Fn(&PortStats) -> bool,
    ) -> (PortStats, bool) {
        let deadline = Instant::now() + timeout;
        loop {
            let s = self.stats(i);
            if pred(&s) {
                return (s, true);
            }
            if Instant::now() >= deadline {
                return (s, false);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn shutdown(&mut self) {
        if let Some(s) = self.server.take() {
            s.shutdown().expect("Server::shutdown");
        }
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The control socket (with [`start_full`](Self::start_full)`(.., true)`).
    pub fn control_socket(&self) -> PathBuf {
        self.dir.path().join("ctl.sock")
    }
}

impl Drop for TestFabric {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            let _ = s.shutdown();
        }
    }
}

/// A daemon with one guest port (`p0` in `dir`, one queue pair), the
/// virtual `hosts` and a control socket; returns it, the port and the
/// control socket.
pub fn serve_hosts(dir: &Path, hosts: Vec<HostSpec>) -> (Server, PortConfig, PathBuf) {
    let port = TestFabric::port_config(dir, 0, 1);
    let ctl = dir.join("ctl.sock");
    let server = Server::start(DaemonConfig {
        ports: vec![port.clone()],
        hosts,
        control: Some(ctl.clone()),
        ..DaemonConfig::default()
    })
    .expect("Server::start");
    (server, port, ctl)
}

/// The daemon's binary, without the caller's control socket or colour
/// settings.
pub fn daemon_cmd() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_vhost-rdma"));
    c.env_remove("VHOST_RDMA_CONTROL").env_remove("NO_COLOR");
    c
}

/// Runs `vhost-rdma ctl ARGS` against the control socket `dir/ctl.sock`.
pub fn ctl(dir: &Path, args: &[&str]) -> Output {
    daemon_cmd()
        .arg("ctl")
        .args(args)
        .env("VHOST_RDMA_CONTROL", dir.join("ctl.sock"))
        .output()
        .unwrap()
}

/// `RUST_LOG=debug cargo test` shows the daemon's logs.
pub fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// Sends SIGTERM to `child` and waits up to `within` for it to exit.
/// Returns how long it took, or None if it was still running (it is then
/// killed and reaped).
pub fn terminate(child: &mut Child, within: Duration) -> Option<Duration> {
    let t0 = Instant::now();
    if child.try_wait().unwrap().is_some() {
        return Some(Duration::ZERO);
    }
    // SAFETY: sending SIGTERM to our own child, not yet reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    while t0.elapsed() < within {
        if child.try_wait().unwrap().is_some() {
            return Some(t0.elapsed());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// Polls `f` until it returns true or `timeout` passes.
pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

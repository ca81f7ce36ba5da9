//! The `uplinks` cell's lab network, in network namespaces (root only):
//! the daemon runs in `D` with a virtual host vh (10.77.0.10), the server
//! guest's port and two uplinks:
//!
//! - `up`, `kind=vxlan` VNI 42, to a Linux vxlan netdev in `V` (over the
//!   veth underlay 10.99.0.1 <-> 10.99.0.2), bridged there to client A
//!   (10.77.0.21, namespace `A`);
//! - `tap`, `kind=tap`, enslaved to a Linux bridge in `D` with a veth to
//!   client B (10.77.0.22, namespace `B`).
//!
//! A is reachable only through the VXLAN uplink, B only through the TAP.
//! Before the guest boots, the host rows: `vxlan-ping`, `tap-ping` (A and
//! B ping vh), `tcp` (verified streams A <-> B across both uplinks), `mtu`
//! (1500-byte DF pings: the daemon's and Linux's outer packets fragmented
//! on the 1500-byte underlay and reassembled, nothing oversized) and
//! `capture` (the underlay decodes as VXLAN VNI 42, a daemon capture of
//! `up` as ICMP). While it runs, each client pings the guest and streams
//! to it, the host's half of rows `guest-vxlan-*` and `guest-tap-*`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use guest_results::guestlog::{stream_passed, stream_result};
use guest_results::pyjson::Json;

use crate::daemon;

use super::cell::row;
use super::vxlan::{delta, ip_counters, run};

use crate::cells::{
    UPLINK_PEER_A as PEER_A, UPLINK_PEER_B as PEER_B, UPLINK_STREAM_BYTES as STREAM_BYTES,
};

const GUEST_IP: &str = "10.77.0.1";
const VH: &str = "10.77.0.10";

/// One path of the guest's: its name, the client's namespace and address,
/// the port of the client's server (guest -> client) and of the guest's
/// (client -> guest).
struct PeerPath {
    name: &'static str,
    ns: String,
    peer: &'static str,
    out_port: u16,
    in_port: u16,
}

/// What a client did towards the guest while it ran.
pub struct PeerHalf {
    name: &'static str,
    ping: (bool, String),
    to_guest: (bool, String),
    from_guest: (bool, String),
}

/// The namespaces and the host's helpers of one `uplinks` cell.
pub struct Uplinks {
    ns_d: String,
    ns_v: String,
    ns_a: String,
    ns_b: String,
    tap: String,
    sgt: PathBuf,
    helpers: Vec<JoinHandle<PeerHalf>>,
    stop: Arc<AtomicBool>,
    halves: Vec<PeerHalf>,
    bytes_before: Vec<(String, i128, i128)>,
    bytes_after: Vec<(String, i128, i128)>,
}

/// A child's output once it ends; once `stop` is set it gets 10 s more,
/// then it is killed (the guest it waits for is gone).
fn wait_or_stop(child: std::io::Result<Child>, stop: &AtomicBool) -> String {
    let mut child = match child {
        Ok(c) => c,
        Err(e) => return e.to_string(),
    };
    let mut since = None;
    loop {
        if !matches!(child.try_wait(), Ok(None)) {
            break;
        }
        if stop.load(Ordering::Relaxed) {
            let t = *since.get_or_insert_with(Instant::now);
            if t.elapsed() > Duration::from_secs(10) {
                let _ = child.kill();
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    wait_output(Ok(child))
}

fn ip(args: &[&str]) -> anyhow::Result<String> {
    run(Command::new("ip").args(args))
}

fn in_ns(ns: &str, args: &[&str]) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns]).args(args);
    c
}

/// `ping` from `ns`: passed (the reply count the first ARP may cost
/// allowed for), and its summary line.
fn ping(ns: &str, target: &str, extra: &[&str]) -> (bool, String) {
    let mut args = vec!["ping", "-c", "5", "-i", "0.2", "-W", "2"];
    args.extend(extra);
    args.push(target);
    let o = in_ns(ns, &args).output();
    let text = o
        .as_ref()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_else(|e| e.to_string());
    let summary: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("transmitted") || l.starts_with("rtt"))
        .collect();
    let ok = o.is_ok_and(|o| o.status.success());
    (ok, summary.join("; "))
}

/// The last `STREAM-RESULT` line of smc-guest-tests' output, and whether
/// it says every byte passed verification.
fn stream_verdict(out: &str) -> (bool, String) {
    let line = stream_result(out).unwrap_or("no STREAM-RESULT");
    (stream_passed(line), line.to_string())
}

fn wait_output(child: std::io::Result<Child>) -> String {
    match child.and_then(|c| c.wait_with_output()) {
        Ok(o) => {
            String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
        }
        Err(e) => e.to_string(),
    }
}

fn stream_cmd(sgt: &Path, ns: &str, server: bool, addr: &str, port: u16, wait_s: u32) -> Command {
    let (role, wait) = if server {
        ("server", "--accept-timeout")
    } else {
        ("client", "--connect-timeout")
    };
    let mut c = in_ns(ns, &[]);
    c.arg(sgt)
        .args(["stream", role, "--proto", "tcp", "--addr", addr]);
    c.args([
        "--port",
        &port.to_string(),
        "--bytes",
        &STREAM_BYTES.to_string(),
    ]);
    c.args([
        "--seed",
        "17",
        wait,
        &wait_s.to_string(),
        "--io-timeout",
        "300",
    ]);
    if server {
        c.arg("--once");
    }
    c.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// A verified stream from `from` to the server in `to` at `addr:port`:
/// both ends' verdicts.
fn stream(sgt: &Path, from: &str, to: &str, addr: &str, port: u16) -> (bool, String) {
    let server = stream_cmd(sgt, to, true, addr, port, 60).spawn();
    std::thread::sleep(Duration::from_millis(500));
    let client = wait_output(stream_cmd(sgt, from, false, addr, port, 60).spawn());
    let server = wait_output(server);
    let (c, s) = (stream_verdict(&client), stream_verdict(&server));
    (c.0 && s.0, format!("sender: {}; receiver: {}", c.1, s.1))
}

impl Uplinks {
    /// The namespaces and links; an error says why they cannot be made
    /// (the cell's rows then fail, or skip without root).
    pub fn new(cell_dir: &Path, sgt: &Path) -> anyhow::Result<Uplinks> {
        let tag = format!("{}", std::process::id() % 100_000);
        let ns = |x: &str| format!("vru-{x}-{tag}");
        let u = Uplinks {
            ns_d: ns("d"),
            ns_v: ns("v"),
            ns_a: ns("a"),
            ns_b: ns("b"),
            tap: format!("vrtap{tag}"),
            sgt: sgt.to_path_buf(),
            helpers: Vec::new(),
            stop: Arc::new(AtomicBool::new(false)),
            halves: Vec::new(),
            bytes_before: Vec::new(),
            bytes_after: Vec::new(),
        };
        u.setup().inspect_err(|e| {
            let _ = std::fs::write(cell_dir.join("uplinks-setup.log"), e.to_string());
        })?;
        Ok(u)
    }

    fn setup(&self) -> anyhow::Result<()> {
        let (d, v, a, b) = (&self.ns_d, &self.ns_v, &self.ns_a, &self.ns_b);
        for n in [d, v, a, b] {
            ip(&["netns", "add", n])?;
            ip(&["-n", n, "link", "set", "lo", "up"])?;
        }
        // the underlay: daemon 10.99.0.1 <-> vtep 10.99.0.2
        ip(&[
            "link", "add", "uD", "netns", d, "type", "veth", "peer", "name", "uV", "netns", v,
        ])?;
        ip(&["-n", d, "addr", "add", "10.99.0.1/24", "dev", "uD"])?;
        ip(&["-n", v, "addr", "add", "10.99.0.2/24", "dev", "uV"])?;
        ip(&["-n", d, "link", "set", "uD", "up"])?;
        ip(&["-n", v, "link", "set", "uV", "up"])?;
        // Linux's VTEP, bridged to A. No `dev uV`: bound to a device, Linux
        // caps the netdev's MTU at the device's less 50, and the mtu row
        // raises it to 1500 (df unset: Linux fragments the outer packets).
        ip(&[
            "-n",
            v,
            "link",
            "add",
            "vx42",
            "type",
            "vxlan",
            "id",
            "42",
            "dstport",
            "4789",
            "local",
            "10.99.0.2",
            "remote",
            "10.99.0.1",
        ])?;
        ip(&["-n", v, "link", "add", "brV", "type", "bridge"])?;
        ip(&[
            "link", "add", "vA", "netns", v, "type", "veth", "peer", "name", "eth0", "netns", a,
        ])?;
        ip(&["-n", v, "link", "set", "vx42", "master", "brV"])?;
        ip(&["-n", v, "link", "set", "vA", "master", "brV"])?;
        for l in ["vx42", "vA", "brV"] {
            ip(&["-n", v, "link", "set", l, "up"])?;
        }
        // A veth leaves the TCP/UDP checksum to "hardware"; across the
        // vxlan netdev it would reach the daemon unfinished. A real NIC
        // would finish it: so does A's.
        run(&mut in_ns(a, &["ethtool", "-K", "eth0", "tx", "off"]))?;
        ip(&["-n", d, "link", "add", "brT", "type", "bridge"])?;
        ip(&[
            "link", "add", "tD", "netns", d, "type", "veth", "peer", "name", "eth0", "netns", b,
        ])?;
        ip(&["-n", d, "link", "set", "tD", "master", "brT"])?;
        ip(&["-n", d, "link", "set", "tD", "up"])?;
        ip(&["-n", d, "link", "set", "brT", "up"])?;
        for (n, addr) in [(a, PEER_A), (b, PEER_B)] {
            ip(&["-n", n, "link", "set", "eth0", "mtu", "1450"])?;
            ip(&["-n", n, "addr", "add", &format!("{addr}/24"), "dev", "eth0"])?;
            ip(&["-n", n, "link", "set", "eth0", "up"])?;
        }
        Ok(())
    }

    /// The namespace the daemon runs in.
    pub fn daemon_netns(&self) -> &str {
        &self.ns_d
    }

    /// The daemon's extra arguments: both uplinks and vh.
    pub fn daemon_args(&self) -> Vec<String> {
        [
            "--port",
            "up,kind=vxlan,local=10.99.0.1:4789,remote=10.99.0.2:4789,vni=42",
            "--port",
            &format!("tap,kind=tap,ifname={}", self.tap),
            "--host",
            &format!("vh={VH}/24"),
        ]
        .iter()
        .map(|x| x.to_string())
        .collect()
    }

    /// Once the daemon runs: its TAP joins bridge brT.
    pub fn attach_tap(&self) -> anyhow::Result<()> {
        ip(&["-n", &self.ns_d, "link", "set", &self.tap, "master", "brT"])?;
        ip(&["-n", &self.ns_d, "link", "set", &self.tap, "up"]).map(|_| ())
    }

    /// The host rows, run before the guest boots.
    pub fn host_rows(&self, bin: &Path, d: &Path) -> Vec<Json> {
        let verdict = |ok: bool| if ok { "PASS" } else { "FAIL" };
        let mut rows = Vec::new();
        for (name, ns) in [("vxlan-ping", &self.ns_a), ("tap-ping", &self.ns_b)] {
            let (ok, sum) = ping(ns, VH, &[]);
            rows.push(row(name, verdict(ok), &format!("{VH} from {ns}: {sum}")));
        }
        let (ok, sum) = ping(&self.ns_a, PEER_B, &[]);
        let ab = stream(&self.sgt, &self.ns_a, &self.ns_b, PEER_B, 5001);
        let ba = stream(&self.sgt, &self.ns_b, &self.ns_a, PEER_A, 5002);
        rows.push(row(
            "tcp",
            verdict(ok && ab.0 && ba.0),
            &format!("A pings B: {sum}; A -> B {}; B -> A {}", ab.1, ba.1),
        ));
        rows.push(self.mtu_row(bin, d));
        rows.push(self.capture_row(bin, d));
        rows
    }

    fn snmp(&self, ns: &str) -> Vec<(String, i64)> {
        ip_counters(&run(&mut in_ns(ns, &["cat", "/proc/net/snmp"])).unwrap_or_default())
    }

    fn mtu_row(&self, bin: &Path, d: &Path) -> Json {
        let counter = |k: &str| {
            uplink_status(bin, d)
                .map(|u| match u.at("vxlan").at("counters").at(k) {
                    Json::Int(n) => *n,
                    _ => 0,
                })
                .unwrap_or(0)
        };
        let (over0, big0) = (counter("tx_over_mtu"), counter("tx_oversized"));
        let (d0, v0) = (self.snmp(&self.ns_d), self.snmp(&self.ns_v));
        let set_mtu = |mtu: &str| {
            let _ = ip(&["-n", &self.ns_a, "link", "set", "eth0", "mtu", mtu]);
            let _ = ip(&["-n", &self.ns_b, "link", "set", "eth0", "mtu", mtu]);
            let _ = ip(&["-n", &self.ns_v, "link", "set", "vx42", "mtu", mtu]);
        };
        set_mtu("1500");
        let (ok, sum) = ping(&self.ns_b, PEER_A, &["-M", "do", "-s", "1472"]);
        set_mtu("1450");
        let (over, big) = (
            counter("tx_over_mtu") - over0,
            counter("tx_oversized") - big0,
        );
        let (d1, v1) = (self.snmp(&self.ns_d), self.snmp(&self.ns_v));
        let (dfrag, dreasm) = (delta(&d0, &d1, "FragOKs"), delta(&d0, &d1, "ReasmOKs"));
        let (vfrag, vreasm) = (delta(&v0, &v1, "FragOKs"), delta(&v0, &v1, "ReasmOKs"));
        let pass =
            ok && over >= 3 && big == 0 && dfrag >= 3 && vreasm >= 3 && vfrag >= 3 && dreasm >= 3;
        row(
            "mtu",
            if pass { "PASS" } else { "FAIL" },
            &format!(
                "1472-byte DF pings B -> A through the VXLAN uplink (df=unset) and Linux vxlan: \
                 {sum}; tx_over_mtu +{over}, tx_oversized +{big}; daemon FragOKs +{dfrag}, \
                 ReasmOKs +{dreasm}; vtep FragOKs +{vfrag}, ReasmOKs +{vreasm}"
            ),
        )
    }

    fn capture_row(&self, bin: &Path, d: &Path) -> Json {
        if crate::paths::which("tshark").is_none() {
            return row(
                "capture",
                "SKIP",
                "no tshark (scripts/install-deps.sh installs it)",
            );
        }
        let under = d.join("underlay.pcapng");
        let up = d.join("up.pcapng");
        let live = in_ns(
            &self.ns_v,
            &["tshark", "-q", "-i", "uV", "-f", "udp port 4789", "-w"],
        )
        .arg(&under)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
        std::thread::sleep(Duration::from_secs(2));
        let ctl = |args: &[&str]| {
            daemon::ctl(bin, &d.join("ctl.sock"), args, Duration::from_secs(20)).code == 0
        };
        let started = ctl(&[
            "capture",
            "start",
            "--port",
            "up",
            "--file",
            &up.display().to_string(),
        ]);
        ping(&self.ns_a, VH, &[]);
        std::thread::sleep(Duration::from_secs(1));
        ctl(&["capture", "stop"]);
        if let Ok(mut c) = live {
            super::cell::sigterm(c.id());
            let _ = c.wait();
        }
        let count = |file: &Path, filter: &str| {
            run(Command::new("tshark")
                .arg("-r")
                .arg(file)
                .args(["-Y", filter]))
            .map_or(0, |o| o.lines().count())
        };
        let vx = count(&under, "vxlan.vni == 42 && icmp");
        let inner = count(&up, "icmp");
        row(
            "capture",
            if started && vx >= 6 && inner >= 6 {
                "PASS"
            } else {
                "FAIL"
            },
            &format!(
                "underlay: {vx} VXLAN VNI 42 ICMP packets decoded; the daemon's capture of port \
                 up: {inner} ICMP frames (want >= 6 each)"
            ),
        )
    }

    /// Starts the clients' halves of the guest rows: a stream server in
    /// each client's namespace (guest -> client), then, once the guest
    /// answers, its ping and a stream to the guest's server.
    pub fn start_peers(&mut self, bin: &Path, d: &Path, wait_s: u32) {
        self.bytes_before = port_bytes(bin, d);
        for p in self.paths() {
            let sgt = self.sgt.clone();
            let stop = self.stop.clone();
            self.helpers.push(std::thread::spawn(move || {
                let server = stream_cmd(&sgt, &p.ns, true, p.peer, p.out_port, wait_s).spawn();
                let t0 = Instant::now();
                while t0.elapsed() < Duration::from_secs(u64::from(wait_s))
                    && !stop.load(Ordering::Relaxed)
                {
                    let o = in_ns(&p.ns, &["ping", "-c", "1", "-W", "2", GUEST_IP]).output();
                    if o.is_ok_and(|o| o.status.success()) {
                        break;
                    }
                    std::thread::sleep(Duration::from_secs(1));
                }
                let ping = ping(&p.ns, GUEST_IP, &[]);
                let client = stream_cmd(&sgt, &p.ns, false, GUEST_IP, p.in_port, 300).spawn();
                let to_guest = stream_verdict(&wait_or_stop(client, &stop));
                let from_guest = stream_verdict(&wait_or_stop(server, &stop));
                PeerHalf {
                    name: p.name,
                    ping,
                    to_guest,
                    from_guest,
                }
            }));
        }
    }

    fn paths(&self) -> [PeerPath; 2] {
        [
            PeerPath {
                name: "vxlan",
                ns: self.ns_a.clone(),
                peer: PEER_A,
                out_port: 5311,
                in_port: 5321,
            },
            PeerPath {
                name: "tap",
                ns: self.ns_b.clone(),
                peer: PEER_B,
                out_port: 5312,
                in_port: 5322,
            },
        ]
    }

    /// After the guest: the clients' halves (those still waiting for it
    /// are stopped) and the uplinks' byte counts, while the daemon runs.
    pub fn finish_peers(&mut self, bin: &Path, d: &Path) {
        self.stop.store(true, Ordering::Relaxed);
        self.halves = self
            .helpers
            .drain(..)
            .filter_map(|h| h.join().ok())
            .collect();
        self.bytes_after = port_bytes(bin, d);
    }

    /// The guest rows with the clients' halves: pings both ways, streams
    /// verified at both ends, and each stream across its own uplink.
    pub fn guest_rows(&self, tests: Vec<Json>) -> Vec<Json> {
        let (after, halves) = (&self.bytes_after, &self.halves);
        let moved = |port: &str| {
            let find = |v: &[(String, i128, i128)]| {
                v.iter()
                    .find(|x| x.0 == port)
                    .map_or((0, 0), |x| (x.1, x.2))
            };
            let (b, a) = (find(&self.bytes_before), find(after));
            (a.0 - b.0, a.1 - b.1)
        };
        tests
            .into_iter()
            .map(|t| {
                let name = t.at("test").str().to_string();
                let Some(h) = halves
                    .iter()
                    .find(|h| name.starts_with(&format!("guest-{}-", h.name)))
                else {
                    return t;
                };
                let port = if h.name == "vxlan" { "up" } else { "tap" };
                if name.ends_with("-ping") {
                    let note = format!("the client pings the guest: {}", h.ping.1);
                    return super::cell::with_host_half(t, h.ping.0, &note);
                }
                let (from_wire, to_wire) = moved(port);
                let n = i128::from(STREAM_BYTES);
                let ok = h.to_guest.0 && h.from_guest.0 && from_wire >= n && to_wire >= n;
                let note = format!(
                    "the client's sender: {}; its receiver: {}; uplink {port}: {} MiB from the \
                     wire, {} MiB to it",
                    h.to_guest.1,
                    h.from_guest.1,
                    from_wire >> 20,
                    to_wire >> 20
                );
                super::cell::with_host_half(t, ok, &note)
            })
            .collect()
    }
}

/// `ctl status`'s entry for uplink `up`.
fn uplink_status(bin: &Path, d: &Path) -> Option<Json> {
    let st = daemon::ctl_json::<Json>(
        bin,
        &d.join("ctl.sock"),
        &["status"],
        Duration::from_secs(20),
    )?;
    st.at("uplinks")
        .items()
        .iter()
        .find(|u| u.at("port").str() == "up")
        .cloned()
}

/// Each port's bytes into the fabric and out of it (`ctl status`).
fn port_bytes(bin: &Path, d: &Path) -> Vec<(String, i128, i128)> {
    let Some(st) = daemon::ctl_json::<Json>(
        bin,
        &d.join("ctl.sock"),
        &["status"],
        Duration::from_secs(20),
    ) else {
        return Vec::new();
    };
    let n = |j: &Json| match j {
        Json::Int(n) => *n,
        _ => 0,
    };
    st.at("ports")
        .items()
        .iter()
        .map(|p| {
            (
                p.at("name").str().to_string(),
                n(p.at("tx_bytes")),
                n(p.at("rx_bytes")),
            )
        })
        .collect()
}

impl Drop for Uplinks {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for h in self.helpers.drain(..) {
            let _ = h.join();
        }
        for n in [&self.ns_d, &self.ns_v, &self.ns_a, &self.ns_b] {
            let _ = ip(&["netns", "del", n]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_passes_only_when_verified() {
        let good = "x\nSTREAM-RESULT role=client verified=1 status=pass mibps=3\n";
        assert!(stream_verdict(good).0);
        assert!(!stream_verdict("STREAM-RESULT verified=0 status=pass\n").0);
        assert!(!stream_verdict("nothing\n").0);
    }
}

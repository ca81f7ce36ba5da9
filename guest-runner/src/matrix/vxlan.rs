//! The underlay of the `vxlan` cells: two daemons that share nothing but a
//! `kind=vxlan` uplink each (default settings, VNI 77, UDP on loopback
//! between 127.0.0.1 and 127.0.0.2). Daemon A serves the server guest,
//! daemon B the client. Run as root, both daemons live in a network
//! namespace of their own whose loopback MTU is 1500, so every full-size
//! guest frame (1550 bytes once encapsulated) really crosses as two IP
//! fragments; otherwise they share the host's loopback (MTU 65536).
//!
//! The host's row `uplink-mtu` comes from here: both uplinks sent frames
//! beyond their `mtu=` (`tx_over_mtu`), dropped none as oversized, had no
//! send error, and in the namespace the outer packets were fragmented and
//! reassembled (`/proc/net/snmp`).

use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use guest_results::pyjson::Json;

use crate::daemon::{self, Daemon};

use super::cell::row;

/// The VXLAN network identifier both uplinks use.
pub const VNI: u32 = 77;

/// The underlay's MTU when the runner may make a namespace.
const UNDERLAY_MTU: u32 = 1500;

/// The two daemons' underlay: its namespace (if any), each side's UDP port.
pub struct Underlay {
    netns: Option<String>,
    port_a: u16,
    port_b: u16,
    snmp_before: Vec<(String, i64)>,
    daemon_b: Option<Daemon>,
}

/// A UDP port free on `addr` now (the daemon binds it a moment later).
fn free_udp_port(addr: &str) -> anyhow::Result<u16> {
    UdpSocket::bind((addr, 0))
        .and_then(|s| s.local_addr())
        .map(|a| a.port())
        .map_err(|e| anyhow::anyhow!("no free UDP port on {addr}: {e}"))
}

/// `cmd`'s stdout, or an error naming it and its stderr (`ip` and the
/// like: a minute is plenty).
pub(super) fn run(cmd: &mut Command) -> anyhow::Result<String> {
    crate::qemu::checked(cmd, Duration::from_secs(60))
}

/// Counter `k` of `after` less that of `before` (IPv4 counters by name; a
/// missing one counts 0).
pub(super) fn delta(before: &[(String, i64)], after: &[(String, i64)], k: &str) -> i64 {
    let get = |v: &[(String, i64)]| v.iter().find(|(n, _)| n == k).map_or(0, |x| x.1);
    get(after) - get(before)
}

/// The IPv4 counters of `/proc/net/snmp` (`Ip:` lines), by name.
pub fn ip_counters(snmp: &str) -> Vec<(String, i64)> {
    let ip: Vec<Vec<&str>> = snmp
        .lines()
        .filter_map(|l| l.strip_prefix("Ip:"))
        .map(|l| l.split_whitespace().collect())
        .collect();
    match ip.as_slice() {
        [names, values, ..] => names
            .iter()
            .zip(values)
            .filter_map(|(n, v)| Some((n.to_string(), v.parse().ok()?)))
            .collect(),
        _ => Vec::new(),
    }
}

impl Underlay {
    /// Ports for both uplinks and, as root, the namespace.
    pub fn new(cell_dir: &Path) -> anyhow::Result<Underlay> {
        let netns = if crate::paths::is_root() {
            let ns = format!("vrx-{}-{}", std::process::id(), short_hash(cell_dir));
            run(Command::new("ip").args(["netns", "add", &ns]))?;
            let mtu = UNDERLAY_MTU.to_string();
            let up = run(Command::new("ip").args(["-n", &ns, "link", "set", "lo", "mtu", &mtu]))
                .and_then(|_| run(Command::new("ip").args(["-n", &ns, "link", "set", "lo", "up"])));
            if let Err(e) = up {
                let _ = run(Command::new("ip").args(["netns", "del", &ns]));
                return Err(e);
            }
            Some(ns)
        } else {
            None
        };
        let mut u = Underlay {
            netns,
            port_a: 0,
            port_b: 0,
            snmp_before: Vec::new(),
            daemon_b: None,
        };
        // in a new namespace every port is free; on the host's loopback ask
        (u.port_a, u.port_b) = if u.netns.is_some() {
            (4789, 4790)
        } else {
            (free_udp_port("127.0.0.1")?, free_udp_port("127.0.0.2")?)
        };
        u.snmp_before = u.snmp();
        Ok(u)
    }

    /// The namespace the daemons run in.
    pub fn netns(&self) -> Option<&str> {
        self.netns.as_deref()
    }

    /// What the detail of the cell's record says of the underlay.
    pub fn describe(&self) -> String {
        match &self.netns {
            Some(ns) => format!("namespace {ns}, loopback MTU {UNDERLAY_MTU}"),
            None => "the host's loopback (not root: no namespace)".into(),
        }
    }

    /// The `--port` argument of daemon A's (`a`) or B's uplink.
    pub fn uplink_arg(&self, a: bool) -> String {
        let (la, lp, ra, rp) = if a {
            ("127.0.0.1", self.port_a, "127.0.0.2", self.port_b)
        } else {
            ("127.0.0.2", self.port_b, "127.0.0.1", self.port_a)
        };
        format!("up,kind=vxlan,local={la}:{lp},remote={ra}:{rp},vni={VNI}")
    }

    fn snmp(&self) -> Vec<(String, i64)> {
        let text = match &self.netns {
            Some(ns) => {
                run(Command::new("ip").args(["netns", "exec", ns, "cat", "/proc/net/snmp"]))
                    .unwrap_or_default()
            }
            None => std::fs::read_to_string("/proc/net/snmp").unwrap_or_default(),
        };
        ip_counters(&text)
    }

    /// Starts daemon B (the client's port `b` on socket `sock`, its uplink,
    /// control socket `ctl-b.sock` in `d`).
    pub fn start_b(
        &mut self,
        bin: &Path,
        d: &Path,
        port_b: &str,
        sock: PathBuf,
    ) -> anyhow::Result<()> {
        let args = vec![
            "--port".to_string(),
            port_b.to_string(),
            "--port".into(),
            self.uplink_arg(false),
            "--control".into(),
            d.join("ctl-b.sock").display().to_string(),
        ];
        self.daemon_b = Some(Daemon::start(
            self.netns(),
            bin,
            &args,
            &d.join("ctl-b.sock"),
            &[sock],
            &d.join("daemon-b.log"),
        )?);
        Ok(())
    }

    /// Row `uplink-mtu`, judged from both daemons' status (A's control
    /// socket `ctl.sock`, B's `ctl-b.sock`) and the underlay's counters;
    /// then daemon B stops. Problems (B died, panicked) go to `problems`.
    pub fn finish(&mut self, bin: &Path, d: &Path, problems: &mut Vec<String>) -> Json {
        let t = Duration::from_secs(20);
        let a = daemon::ctl_json::<Json>(bin, &d.join("ctl.sock"), &["status"], t);
        let b = daemon::ctl_json::<Json>(bin, &d.join("ctl-b.sock"), &["status"], t);
        if let Some(mut dm) = self.daemon_b.take() {
            if dm.panicked() {
                problems.push("daemon B panicked".into());
            }
            if let Some(p) = dm.stop(Duration::from_secs(10)) {
                problems.push(format!("daemon B: {p}"));
            }
        }
        let after = self.snmp();
        let delta = |k: &str| delta(&self.snmp_before, &after, k);
        let (Some(a), Some(b)) = (a, b) else {
            return row("uplink-mtu", "FAIL", "no status from one of the daemons");
        };
        judge_uplink_mtu(&a, &b, self.netns.is_some(), &delta, &self.describe())
    }
}

impl Drop for Underlay {
    fn drop(&mut self) {
        if let Some(mut dm) = self.daemon_b.take() {
            dm.stop(Duration::from_secs(10));
        }
        if let Some(ns) = &self.netns {
            let _ = run(Command::new("ip").args(["netns", "del", ns]));
        }
    }
}

/// The `uplink-mtu` verdict from daemon A's and B's `ctl --json status`
/// and the underlay's IP counter deltas (`fragmented`: the underlay's MTU
/// is below a full frame's outer packet, so fragments must show).
pub fn judge_uplink_mtu(
    a: &Json,
    b: &Json,
    fragmented: bool,
    delta: &dyn Fn(&str) -> i64,
    underlay: &str,
) -> Json {
    let counters = |s: &Json| -> Option<(Json, Json)> {
        let u = s
            .at("uplinks")
            .items()
            .iter()
            .find(|u| u.at("port").str() == "up")?
            .at("vxlan");
        Some((u.at("counters").clone(), u.at("df").clone()))
    };
    let (Some((ca, dfa)), Some((cb, dfb))) = (counters(a), counters(b)) else {
        return row("uplink-mtu", "FAIL", "a daemon's status has no uplink `up`");
    };
    let n = |c: &Json, k: &str| match c.at(k) {
        Json::Int(v) => *v,
        _ => -1,
    };
    let bad: i128 = ["tx_oversized", "rx_oversized", "tx_send_errors"]
        .iter()
        .map(|k| n(&ca, k).max(0) + n(&cb, k).max(0))
        .sum();
    let (frag, reasm) = (delta("FragOKs"), delta("ReasmOKs"));
    let detail = format!(
        "df {dfa}/{dfb}; frames beyond mtu= sent: A {}, B {}; dropped as oversized or not sent: {bad}; \
         underlay ({underlay}): FragOKs +{frag}, FragCreates +{}, ReasmReqds +{}, ReasmOKs \
         +{reasm}, ReasmFails +{}",
        n(&ca, "tx_over_mtu"),
        n(&cb, "tx_over_mtu"),
        delta("FragCreates"),
        delta("ReasmReqds"),
        delta("ReasmFails")
    );
    let ok = n(&ca, "tx_over_mtu") > 0
        && n(&cb, "tx_over_mtu") > 0
        && bad == 0
        && (!fragmented || (frag > 0 && reasm > 0));
    row("uplink-mtu", if ok { "PASS" } else { "FAIL" }, &detail)
}

fn short_hash(p: &Path) -> u32 {
    p.to_string_lossy()
        .bytes()
        .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)))
        % 100_000
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(over: i64, oversized: i64) -> Json {
        serde_json::from_str(&format!(
            r#"{{"uplinks": [{{"port": "up", "vxlan": {{"df": "unset", "counters":
                {{"tx_over_mtu": {over}, "tx_oversized": {oversized}, "rx_oversized": 0,
                  "tx_send_errors": 0}}}}}}]}}"#
        ))
        .expect("json")
    }

    #[test]
    fn snmp_ip_counters_parse() {
        let text = "Ip: Forwarding DefaultTTL FragOKs\nIp: 1 64 7\nIcmp: InMsgs\nIcmp: 3\n";
        assert_eq!(
            ip_counters(text),
            vec![
                ("Forwarding".into(), 1),
                ("DefaultTTL".into(), 64),
                ("FragOKs".into(), 7)
            ]
        );
    }

    #[test]
    fn uplink_mtu_needs_big_frames_no_drops_and_fragments() {
        let frags = |k: &str| if k == "FragCreates" { 20 } else { 10 };
        let none = |_: &str| 0;
        let pass = |r: Json| r.at("status").str() == "PASS";
        let (a, b0, b3, bad) = (status(5, 0), status(0, 0), status(3, 0), status(5, 1));
        type Delta<'a> = &'a dyn Fn(&str) -> i64;
        let cases: [(&Json, &Json, bool, Delta, bool); 6] = [
            (&a, &b3, true, &frags, true),
            (&a, &b0, true, &frags, false),
            (&bad, &b3, true, &frags, false),
            (&a, &b3, true, &none, false),
            (&a, &b3, false, &none, true),
            (&Json::Null, &b3, false, &none, false),
        ];
        for (i, (x, y, fragmented, delta, want)) in cases.into_iter().enumerate() {
            assert_eq!(
                pass(judge_uplink_mtu(x, y, fragmented, delta, "u")),
                want,
                "case {i}"
            );
        }
    }
}

//! The `smcr-failover` cell's host side (`guest-runner failover-driver`):
//! once the SMC-R stream runs (at least 500 frames a second through the
//! server guest's two ports, `a` and `a1`, for 3 s), it takes the busier
//! port down and, `--up-after` seconds later (or when stopped), up again;
//! then it writes the cell's `failover-evidence` row. A port goes down as a
//! pulled cable does: the daemon drops every frame to and from it (`ctl
//! link down`) and the guest's NIC loses its carrier (QEMU's `set_link`
//! through the guest's monitor), so the guest's RDMA device reports its
//! port down and SMC-R moves the link group's connections at once, as it
//! would on hardware; without the carrier change only SMC-R's TEST_LINK
//! timeout notices, and the 7.3 guests then lose their cursors (ci/README.md,
//! "smcr-failover").
//!
//! The row passes when, while the port was down, frames to or from it were
//! dropped, at least 1000 frames went through the other port, and the
//! checker's flows view shows an SMC-R link (a RoCE QP connection carrying
//! LLC/CDC) that avoids the downed port carrying CDC messages (the
//! stream's cursor updates).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};

/// Where the cell's daemon is, and where the row goes.
#[derive(Debug, Clone, clap::Args)]
pub struct FailoverOptions {
    /// the cell's work dir (ctl.sock)
    #[arg(long)]
    pub dir: PathBuf,
    /// the vhost-rdma binary (for `ctl`)
    #[arg(long)]
    pub daemon: PathBuf,
    /// seconds the port stays down
    #[arg(long, default_value_t = 30)]
    pub up_after: u64,
    /// the evidence row (JSON) is written here
    #[arg(long)]
    pub out: PathBuf,
}

/// One SMC-R link in the flows view: its daemon ports and messages.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SmcLink {
    /// Daemon ports its halves crossed, sorted.
    pub ports: Vec<String>,
    /// CDC messages (both halves).
    pub cdc: i64,
    /// LLC messages (both halves).
    pub llc: i64,
    /// The last LLC message types seen, sorted.
    pub last_llc: Vec<String>,
}

/// What the driver saw, for the row.
#[derive(Debug, Default)]
pub struct Seen {
    /// What it did, in order.
    pub log: Vec<String>,
    /// The port taken down, and the other one.
    pub down_port: Option<(String, String)>,
    /// Frames per port when it went down and when it came up.
    pub at_down: BTreeMap<String, i64>,
    /// The same when it came up.
    pub at_up: BTreeMap<String, i64>,
    /// SMC-R links when it went down.
    pub links_down: BTreeMap<String, SmcLink>,
    /// SMC-R links before it came up.
    pub links_up: BTreeMap<String, SmcLink>,
    /// Frames the link fault dropped to or from the port while down.
    pub drops_at_up: Option<i64>,
}

struct Ctl<'a>(&'a FailoverOptions);

impl Ctl<'_> {
    fn json(&self, args: &[&str]) -> Option<Value> {
        let sock = self.0.dir.join("ctl.sock");
        crate::daemon::ctl_json(&self.0.daemon, &sock, args, Duration::from_secs(20))
    }

    /// Frames in and out per port.
    fn frames(&self) -> Option<BTreeMap<String, i64>> {
        let st = self.json(&["status"])?;
        Some(
            st["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| {
                    let n = |k: &str| p.get(k).and_then(Value::as_i64).unwrap_or(0);
                    Some((
                        p["name"].as_str()?.to_string(),
                        n("tx_frames") + n("rx_frames"),
                    ))
                })
                .collect(),
        )
    }

    /// The flows view's RoCE connections that carry SMC-R.
    fn smc_links(&self) -> BTreeMap<String, SmcLink> {
        let fl = self.json(&["flows"]).unwrap_or(Value::Null);
        smc_links(&fl)
    }
}

/// The RoCE QP connections of a flows view (`ctl --json flows`) that
/// carry SMC-R (a half with `smc` facts), by connection.
pub fn smc_links(flows: &Value) -> BTreeMap<String, SmcLink> {
    let mut out = BTreeMap::new();
    for f in flows["roce"].as_array().into_iter().flatten() {
        let halves: Vec<&Value> = f["halves"].as_array().into_iter().flatten().collect();
        let smc: Vec<&Value> = halves
            .iter()
            .copied()
            .filter(|h| {
                h.get("smc")
                    .and_then(Value::as_object)
                    .is_some_and(|o| !o.is_empty())
            })
            .collect();
        if smc.is_empty() {
            continue;
        }
        let sum = |k: &str| -> i64 {
            smc.iter()
                .map(|h| h["smc"].get(k).and_then(Value::as_i64).unwrap_or(0))
                .sum()
        };
        let mut ports: Vec<String> = halves
            .iter()
            .map(|h| h["port"].as_str().unwrap_or("?").to_string())
            .collect();
        ports.sort();
        ports.dedup();
        let mut last: Vec<String> = smc
            .iter()
            .map(|h| h["smc"]["last_llc"].as_str().unwrap_or("-").to_string())
            .map(|s| if s.is_empty() { "-".into() } else { s })
            .collect();
        last.sort();
        last.dedup();
        out.insert(
            f["connection"].as_str().unwrap_or("?").to_string(),
            SmcLink {
                ports,
                cdc: sum("cdc_messages"),
                llc: sum("llc_messages"),
                last_llc: last,
            },
        );
    }
    out
}

/// Runs the driver until it brought the port up again (or, stopped
/// before the stream was seen, at once) and writes the row; exit 0.
pub fn run(o: &FailoverOptions) -> i32 {
    crate::boot::install_signal_handlers();
    let seen = drive(o);
    let row = evidence(&seen);
    if let Err(e) = std::fs::write(&o.out, row.to_string()) {
        eprintln!("failover-driver: {}: {e}", o.out.display());
        return 2;
    }
    0
}

/// Sleeps `secs` seconds unless a signal comes first; whether it did.
fn stopped_within(secs: u64) -> bool {
    for _ in 0..secs * 10 {
        if crate::boot::check_signal().is_err() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    crate::boot::check_signal().is_err()
}

fn drive(o: &FailoverOptions) -> Seen {
    let ctl = Ctl(o);
    let mut seen = Seen::default();
    let mut prev = ctl.frames();
    let mut busy = 0;
    let sides = ["a", "a1"];
    while !stopped_within(1) {
        let cur = ctl.frames();
        let (Some(c), Some(p)) = (&cur, &prev) else {
            prev = cur;
            continue;
        };
        let delta: Vec<i64> = sides
            .iter()
            .map(|s| c.get(*s).copied().unwrap_or(0) - p.get(*s).copied().unwrap_or(0))
            .collect();
        let c = c.clone();
        prev = cur;
        busy = if delta.iter().sum::<i64>() >= 500 {
            busy + 1
        } else {
            0
        };
        if busy >= 3 {
            // The busier port (the first on a tie).
            let i = usize::from(delta[1] > delta[0]);
            let (down, other) = (sides[i].to_string(), sides[1 - i].to_string());
            seen.at_down = c;
            seen.links_down = ctl.smc_links();
            let ok = ctl.json(&["link", "down", "--port", &down]).is_some();
            seen.log.push(format!(
                "per-second frames {{'a': {}, 'a1': {}}}: link down --port {down} ({}); {}",
                delta[0],
                delta[1],
                if ok { "ok" } else { "ctl failed" },
                set_carrier(&o.dir, &down, false)
            ));
            seen.down_port = Some((down, other));
            break;
        }
    }
    let Some((down, _)) = seen.down_port.clone() else {
        return seen;
    };
    // Stopped early or not, the port comes up again and the view is read
    // while the daemon runs.
    let _ = stopped_within(o.up_after);
    seen.at_up = ctl.frames().unwrap_or_default();
    seen.links_up = ctl.smc_links();
    let fl = ctl.json(&["faults", "list"]).unwrap_or(Value::Null);
    let fl = match fl.get("faults") {
        Some(f) if !f.is_null() => f.clone(),
        _ => fl,
    };
    seen.drops_at_up = fl["links"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|x| x["port"].as_str() == Some(&down))
        .map(|x| x["drops"].as_i64().unwrap_or(0));
    let ok = ctl.json(&["link", "up", "--port", &down]).is_some();
    seen.log.push(format!(
        "link up --port {down} after {} s ({}); {}",
        o.up_after,
        if ok { "ok" } else { "ctl failed" },
        set_carrier(&o.dir, &down, true)
    ));
    seen
}

/// The guest NIC behind daemon port `port` (`a` is guest a's first NIC,
/// QEMU netdev `n0`; `a1` its second, `n1`): its monitor socket and netdev.
pub fn guest_nic(dir: &std::path::Path, port: &str) -> (PathBuf, String) {
    let guest: String = port.chars().take_while(char::is_ascii_alphabetic).collect();
    let nic = port[guest.len()..].parse::<u32>().unwrap_or(0);
    (dir.join(format!("{guest}.mon")), format!("n{nic}"))
}

/// Sets the carrier of the guest NIC behind `port` through its QEMU
/// monitor; what happened, for the evidence row.
fn set_carrier(dir: &std::path::Path, port: &str, up: bool) -> String {
    let (mon, netdev) = guest_nic(dir, port);
    let state = if up { "on" } else { "off" };
    match crate::stuck::hmp(&mon, &format!("set_link {netdev} {state}")) {
        Ok(out) if out.is_empty() => format!("guest carrier {netdev} {state} (ok)"),
        Ok(out) => format!("guest carrier {netdev} {state}: {out}"),
        Err(e) => format!("guest carrier {netdev} {state} failed: {e}"),
    }
}

/// The `failover-evidence` row of what was seen.
pub fn evidence(s: &Seen) -> Value {
    let row = |status: &str, detail: String| json!({"test": "failover-evidence", "status": status, "secs": 0, "bw": "", "detail": detail});
    let Some((down, other)) = &s.down_port else {
        return row(
            "FAIL",
            "the SMC-R stream's traffic was never seen (>= 500 frames/s for 3 s): no link taken \
             down"
                .into(),
        );
    };
    let drops = s.drops_at_up.unwrap_or(0);
    let moved =
        s.at_up.get(other).copied().unwrap_or(0) - s.at_down.get(other).copied().unwrap_or(0);
    let mut views = Vec::new();
    let mut switched = false;
    for (conn, v) in &s.links_up {
        let b = s.links_down.get(conn).cloned().unwrap_or_default();
        let (dcdc, dllc) = (v.cdc - b.cdc, v.llc - b.llc);
        views.push(format!(
            "{conn} ports {}: CDC +{dcdc} LLC +{dllc} (last LLC {})",
            v.ports.join("/"),
            v.last_llc.join(",")
        ));
        switched |= !v.ports.contains(down) && dcdc > 0;
    }
    let views = if views.is_empty() {
        "no SMC-R link seen".to_string()
    } else {
        views.join("; ")
    };
    let detail = format!(
        "{}; while down: {drops} frames dropped to/from {down}, {moved} frames through {other}; \
         flows view while down: {views}",
        s.log.join("; ")
    );
    let pass = drops > 0 && moved >= 1000 && switched;
    row(if pass { "PASS" } else { "FAIL" }, detail)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(ports: &[&str], cdc: i64) -> SmcLink {
        SmcLink {
            ports: ports.iter().map(|p| p.to_string()).collect(),
            cdc,
            llc: 2,
            last_llc: vec!["CONFIRM_LINK".into()],
        }
    }

    /// The row passes only with drops on the downed port, traffic through
    /// the other one and CDC on a link that avoids the downed port.
    #[test]
    fn the_row_needs_drops_traffic_and_a_switched_link() {
        assert_eq!(evidence(&Seen::default())["status"], "FAIL");
        let mut s = Seen {
            log: vec!["per-second frames {'a': 900, 'a1': 3}: link down --port a (ok)".into()],
            down_port: Some(("a".into(), "a1".into())),
            at_down: [("a1".to_string(), 100)].into(),
            at_up: [("a1".to_string(), 5100)].into(),
            links_down: [("q1".to_string(), link(&["a", "b"], 10))].into(),
            links_up: [
                ("q1".to_string(), link(&["a", "b"], 10)),
                ("q2".to_string(), link(&["a1", "b1"], 40)),
            ]
            .into(),
            drops_at_up: Some(12),
        };
        let r = evidence(&s);
        assert_eq!(r["status"], "PASS", "{r}");
        let d = r["detail"].as_str().unwrap_or_default();
        assert!(d.contains("while down: 12 frames dropped to/from a, 5000 frames through a1"));
        assert!(
            d.contains("q2 ports a1/b1: CDC +40 LLC +2 (last LLC CONFIRM_LINK)"),
            "{d}"
        );
        s.links_up.remove("q2");
        assert_eq!(evidence(&s)["status"], "FAIL", "no link carried the stream");
    }

    #[test]
    fn smc_links_are_the_roce_connections_with_smc_halves() {
        let fl = json!({"roce": [
            {"connection": "q1", "halves": [
                {"port": "b", "smc": {"cdc_messages": 3, "llc_messages": 1, "last_llc": "ADD_LINK"}},
                {"port": "a", "smc": {"cdc_messages": 4, "llc_messages": 0, "last_llc": null}}]},
            {"connection": "q2", "halves": [{"port": "a1"}]}]});
        let l = smc_links(&fl);
        assert_eq!(l.len(), 1);
        assert_eq!(
            l["q1"],
            SmcLink {
                ports: vec!["a".into(), "b".into()],
                cdc: 7,
                llc: 1,
                last_llc: vec!["-".into(), "ADD_LINK".into()],
            }
        );
    }

    /// A daemon port names its guest and the guest's QEMU netdev.
    #[test]
    fn a_port_names_its_guest_nic() {
        let d = std::path::Path::new("/w");
        assert_eq!(guest_nic(d, "a"), (PathBuf::from("/w/a.mon"), "n0".into()));
        assert_eq!(guest_nic(d, "a1"), (PathBuf::from("/w/a.mon"), "n1".into()));
        assert_eq!(guest_nic(d, "b1"), (PathBuf::from("/w/b.mon"), "n1".into()));
    }
}

//! The virtual hosts of the matrix's one-guest cells (`vhost-rxe`,
//! `vhost-erdma`, `vhost-siw`, built in `cells.rs`): the daemon's hosts
//! (virtual-host crate, docs/virtual-hosts.md), every tool in both roles.
//!
//! A cell declares its hosts' services once ([`Service`]); from that table
//! come the daemon's `[[host]]` config ([`VirtualHosts::config_toml`]: the
//! host's servers, and its clients towards the guest's servers, which retry
//! until the guest's tool listens) and the host's half of each row's
//! verdict ([`VirtualHosts::judge`]): the guest judges its tool's output,
//! the host its own session (finished, none failed, every iteration
//! counted and verified). A tool's exit status alone proves little
//! (`rping` exits 0 without ever connecting).

use guest_results::pyjson::Json;
use serde::Serialize;
use serde_json::{json, Value};

/// The guest of a virtual-host cell (the matrix's server guest `a`).
const GUEST: &str = "10.77.0.1";
/// Host `vh`, the guest's peer (`PEER`).
pub const VH: &str = "10.77.0.10";
/// Host `vh2` (`CI_VHOST2`): a host runs at most 16 services.
pub const VH2: &str = "10.77.0.20";
/// pingpong iterations.
pub const PINGPONG_ITERS: u64 = 1000;
/// perftest iterations.
pub const BW_ITERS: u64 = 200;
/// rping and ucmatose iterations.
pub const COUNT: u64 = 10;

/// One service of a virtual host and what its last session must show.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Service {
    /// `vh` or `vh2`.
    pub host: &'static str,
    /// The service kind (`pingpong-server`, `write-bw-client`, ...).
    pub kind: String,
    /// Its options, the config file's keys (`port` always among them).
    pub opts: Vec<(&'static str, Value)>,
    /// The guest row whose other half this session is.
    pub row: String,
    /// Iterations the last session must count.
    pub iters: u64,
    /// Messages it must have verified (pingpong, rping, ucmatose).
    pub verified: Option<u64>,
}

impl Service {
    fn port(&self) -> i128 {
        self.opts
            .iter()
            .find(|(k, _)| *k == "port")
            .and_then(|(_, v)| v.as_i64())
            .map_or(-1, i128::from)
    }

    fn opt(&self, key: &str) -> bool {
        self.opts
            .iter()
            .any(|(k, v)| *k == key && *v == json!(true))
    }

    /// iWARP connections with MPA CRC its session makes: perftest -R has
    /// two (control and data), rping one.
    fn crc_connections(&self) -> u64 {
        match (self.opt("mpa-crc"), self.kind.contains("-bw-")) {
            (false, _) => 0,
            (true, true) => 2,
            (true, false) => 1,
        }
    }
}

/// A cell's virtual hosts: `vh` (the guest's `PEER`) and `vh2`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VirtualHosts {
    /// Every service, in the order the config lists them.
    pub services: Vec<Service>,
}

impl VirtualHosts {
    /// The daemon's `[[host]]` tables: servers listen at once, clients
    /// (towards the guest at 10.77.0.1) retry for `connect_secs`.
    pub fn config_toml(&self, connect_secs: u32) -> String {
        let mut out = String::new();
        for (name, addr) in [("vh", VH), ("vh2", VH2)] {
            out += &format!("[[host]]\nname = \"{name}\"\naddress = \"{addr}/24\"\n");
            for s in self.services.iter().filter(|s| s.host == name) {
                out += &format!("[[host.service]]\nkind = \"{}\"\n", s.kind);
                if s.kind.contains("-client") {
                    out += &format!("peer = \"{GUEST}\"\nconnect-timeout-secs = {connect_secs}\n");
                }
                for (k, v) in &s.opts {
                    out += &format!("{k} = {v}\n");
                }
            }
            out += "\n";
        }
        out
    }

    /// The host's half of row `row`: why its session fails it (empty: it
    /// passes) and what it counted. `hosts` is `ctl --json hosts`.
    pub fn judge(&self, row: &str, hosts: &Json) -> Option<(Vec<String>, String)> {
        let svc = self.services.iter().find(|s| s.row == row)?;
        let found = hosts
            .items()
            .iter()
            .filter(|h| h.at("name").str() == svc.host)
            .flat_map(|h| h.at("services").items())
            .find(|s| s.at("kind").str() == svc.kind && int(s.at("port")) == svc.port());
        let who = format!("host {} {}:{}", svc.host, svc.kind, svc.port());
        let Some(st) = found else {
            return Some((vec![format!("{who}: not in `ctl hosts`")], String::new()));
        };
        let (ok, bad) = (int(st.at("sessions_ok")), int(st.at("sessions_failed")));
        let (it, ver) = (int(st.at("last_iterations")), int(st.at("last_verified")));
        let err = match st.at("last_error") {
            Json::Str(e) => format!(" ({e})"),
            _ => String::new(),
        };
        let mut why = Vec::new();
        if ok < 1 || bad != 0 {
            why.push(format!("{who}: {ok} finished, {bad} failed sessions{err}"));
        }
        if it < i128::from(svc.iters) {
            why.push(format!("{who}: {it} iterations, want {}", svc.iters));
        }
        if let Some(v) = svc.verified.filter(|v| ver < i128::from(*v)) {
            why.push(format!("{who}: {ver} verified, want {v}"));
        }
        let seen = match svc.verified {
            Some(_) => format!("{who}: {it} iterations, {ver} verified"),
            None => format!("{who}: {it} iterations"),
        };
        Some((why, seen))
    }

    /// The `mpa-crc-negotiated` host row: the host's iWARP connections with
    /// MPA CRC are exactly those of the services that ask for it (nothing
    /// else does: the 7.3 guest's siw cannot require CRC).
    pub fn crc_row(&self, hosts: &Json) -> (bool, String) {
        let want: u64 = self.services.iter().map(Service::crc_connections).sum();
        let got: i128 = hosts
            .items()
            .iter()
            .map(|h| int(h.at("iwarp").at("connected-crc")))
            .sum();
        (
            got == i128::from(want),
            format!("{got} of the hosts' iWARP connections ran with MPA CRC, want {want} (the -crc rows)"),
        )
    }
}

fn int(v: &Json) -> i128 {
    match v {
        Json::Int(n) => *n,
        _ => -1,
    }
}

/// A tool in both roles: the host's server (on `hosts[0]`, port
/// `ports[0]`) against the guest's client, and the host's client (on
/// `hosts[1]`) towards the guest's server on `ports[1]`. `kind` and `row`
/// hold `{}`: the service's role in the kind, the guest's in the row.
fn both(
    hosts: [&'static str; 2],
    kind: &str,
    row: &str,
    ports: [u64; 2],
    opts: &[(&'static str, Value)],
    iters: u64,
    verified: [Option<u64>; 2],
) -> [Service; 2] {
    let one = |i: usize, me: &str, guest: &str| {
        let mut o = vec![("port", json!(ports[i]))];
        o.extend(opts.iter().cloned());
        Service {
            host: hosts[i],
            kind: kind.replace("{}", me),
            opts: o,
            row: row.replace("{}", guest),
            iters,
            verified: verified[i],
        }
    };
    [one(0, "server", "client"), one(1, "client", "server")]
}

/// The hosts of a RoCEv2 guest (rxe or the erdma function): pingpong,
/// perftest over TCP and over rdma_cm (`-R`), rping and ucmatose over the
/// IB CM, each tool as client and as server.
pub fn roce_hosts() -> VirtualHosts {
    let it = ("iters", json!(BW_ITERS));
    let mut s = Vec::new();
    s.extend(both(
        ["vh", "vh"],
        "pingpong-{}",
        "pingpong-guest-{}",
        [18515, 18516],
        &[("iters", json!(PINGPONG_ITERS))],
        PINGPONG_ITERS,
        [Some(PINGPONG_ITERS - 1), Some(PINGPONG_ITERS)],
    ));
    for (i, v) in (0..).zip(["write", "send", "read", "atomic"]) {
        s.extend(both(
            ["vh", "vh"],
            &format!("{v}-bw-{{}}"),
            &format!("{v}-bw-guest-{{}}"),
            [18517 + i, 18521 + i],
            std::slice::from_ref(&it),
            BW_ITERS,
            [None, None],
        ));
        // ib_atomic_bw's operations are 8-byte FETCH AND ADDs
        let size = json!(if v == "atomic" { 8 } else { 65536 });
        let cm = [
            ("rdma-cm", json!(true)),
            ("roce", json!(true)),
            ("size", size),
            it.clone(),
        ];
        s.extend(both(
            ["vh2", "vh2"],
            &format!("{v}-bw-{{}}"),
            &format!("{v}-bw-R-guest-{{}}"),
            [18531 + i, 18541 + i],
            &cm,
            BW_ITERS,
            [None, None],
        ));
    }
    for (tool, port) in [("rping", 7174), ("ucmatose", 7471)] {
        s.extend(both(
            ["vh", "vh"],
            &format!("{tool}-{{}}-roce"),
            &format!("{tool}-guest-{{}}"),
            [port, port],
            &[("iters", json!(COUNT))],
            COUNT,
            [Some(COUNT); 2],
        ));
    }
    VirtualHosts { services: s }
}

/// The hosts of an iWARP (siw) guest: rping -V and ucmatose, perftest -R,
/// each as client and as server, with MPA CRC off and asked for by the host.
pub fn iwarp_hosts() -> VirtualHosts {
    let mut s = Vec::new();
    for (crc, sfx, rping_port) in [(false, "", 7174), (true, "-crc", 7175)] {
        let c = ("mpa-crc", json!(crc));
        let rp = [("size", json!(64)), ("iters", json!(COUNT)), c.clone()];
        s.extend(both(
            ["vh", "vh"],
            "rping-{}",
            &format!("rping-guest-{{}}{sfx}"),
            [rping_port; 2],
            &rp,
            COUNT,
            [Some(COUNT); 2],
        ));
        let bw = [
            ("rdma-cm", json!(true)),
            ("size", json!(65536)),
            ("iters", json!(BW_ITERS)),
            c,
        ];
        for (i, v) in (0..).zip(["write", "send", "read"]) {
            let off = i + if crc { 10 } else { 0 };
            s.extend(both(
                ["vh", "vh2"],
                &format!("{v}-bw-{{}}"),
                &format!("{v}-bw-R-guest-{{}}{sfx}"),
                [18521 + off, 18541 + off],
                &bw,
                BW_ITERS,
                [None, None],
            ));
        }
    }
    s.extend(both(
        ["vh", "vh"],
        "ucmatose-{}",
        "ucmatose-guest-{}",
        [7471, 7471],
        &[("iters", json!(COUNT))],
        COUNT,
        [Some(COUNT); 2],
    ));
    VirtualHosts { services: s }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every service judges a distinct row, no host runs more than the 16
    /// services a virtual host allows, and every config line is a key the
    /// daemon knows.
    #[test]
    fn the_tables_fit_the_hosts() {
        // clients: pingpong, 8 perftest and the IB CM's rping and ucmatose;
        // over iWARP 6 perftest, 2 rping and ucmatose
        for (vh, clients) in [(roce_hosts(), 11), (iwarp_hosts(), 9)] {
            let mut rows: Vec<_> = vh.services.iter().map(|s| &s.row).collect();
            rows.sort();
            rows.dedup();
            assert_eq!(rows.len(), vh.services.len());
            for h in ["vh", "vh2"] {
                assert!(vh.services.iter().filter(|s| s.host == h).count() <= 16);
            }
            let toml = vh.config_toml(900);
            assert_eq!(toml.matches("[[host]]").count(), 2);
            assert_eq!(toml.matches("peer = \"10.77.0.1\"").count(), clients);
        }
    }

    /// A session that verified too few fails its row, naming the host and
    /// the counts; a missing service fails too.
    #[test]
    fn the_host_judges_its_session() {
        let vh = roce_hosts();
        let hosts = serde_json::from_str::<Json>(
            r#"[{"name": "vh", "services": [{"kind": "pingpong-server", "port": 18515,
                "sessions_ok": 1, "sessions_failed": 0, "last_iterations": 1000,
                "last_verified": 998, "last_error": null}]}]"#,
        )
        .expect("json");
        let (why, _) = vh
            .judge("pingpong-guest-client", &hosts)
            .expect("a service");
        assert_eq!(
            why,
            ["host vh pingpong-server:18515: 998 verified, want 999"]
        );
        let (why, _) = vh
            .judge("pingpong-guest-server", &hosts)
            .expect("a service");
        assert!(why[0].contains("not in `ctl hosts`"));
        assert!(vh.judge("link-add-rxe", &hosts).is_none());
    }

    /// The CRC row counts two connections per perftest -R session and one
    /// per rping session.
    #[test]
    fn crc_connections_are_counted_per_service() {
        let vh = iwarp_hosts();
        let hosts =
            serde_json::from_str::<Json>(r#"[{"name": "vh", "iwarp": {"connected-crc": 14}}]"#)
                .expect("json");
        assert!(vh.crc_row(&hosts).0);
    }
}

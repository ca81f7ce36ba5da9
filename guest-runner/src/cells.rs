//! The guest test matrix's cells (ci/matrix.sh): what each cell runs, on
//! which devices, with which faults and time limits, and which test rows
//! each guest role must report.
//!
//! A cell pairs two guests, the server (guest `a`, 10.77.0.1) and the
//! client (guest `b`, 10.77.0.2), on one vhost-rdma daemon; the guests run
//! the cell's `call` from `ci/guest/ci-lib.sh`. Some rows are judged on the
//! host (role [`Role::Host`]): the capture's dissection, the protocol
//! checker's findings, the fault rules' evidence, device traces.
//!
//! The table is data: [`cells`] builds it, derived cells (lossy, erdma,
//! fault cells) from their bases, as a newcomer would describe them ("the
//! rxe cell with 2 % drop and 5 % reorder"), so that a change to a base
//! reaches its variants.

use guest_results::faults::FaultCase;
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;

use crate::virtual_hosts::{self, VirtualHosts};

/// Guest kernel series the matrix knows, in run order.
pub const KERNELS: [&str; 2] = ["7.3", "6.12"];

/// Who reports a test row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Guest `a`.
    Server,
    /// Guest `b`.
    Client,
    /// The matrix itself, after the guests.
    Host,
}

/// Both guests.
pub const BOTH: &[Role] = &[Role::Server, Role::Client];
/// The server guest only.
pub const SERVER: &[Role] = &[Role::Server];
const HOST: &[Role] = &[Role::Host];

/// An RDMA or NIC device of one role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    /// The daemon's emulated erdma function, paired with the guest's
    /// virtio-net port.
    Erdma,
    /// The guest's own rdma_rxe on eth0.
    Rxe,
    /// The daemon's emulated gVNIC.
    Gve,
    /// The guest's virtio-net port.
    Virtio,
}

/// A device per role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PerRole {
    /// Guest `a`'s.
    pub server: Device,
    /// Guest `b`'s.
    pub client: Device,
}

impl PerRole {
    /// `role`'s device (the host has none: the server's).
    pub fn of(&self, role: Role) -> Device {
        match role {
            Role::Client => self.client,
            _ => self.server,
        }
    }
}

const ERDMA_BOTH: PerRole = PerRole {
    server: Device::Erdma,
    client: Device::Erdma,
};
const ERDMA_RXE: PerRole = PerRole {
    server: Device::Erdma,
    client: Device::Rxe,
};
const GVE_VIRTIO: PerRole = PerRole {
    server: Device::Gve,
    client: Device::Virtio,
};

/// One test row: its name and the roles that must report it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TestRow(pub String, pub Vec<Role>);

fn row(name: &str, roles: &[Role]) -> TestRow {
    TestRow(name.to_string(), roles.to_vec())
}

/// Which upstream suite a cell runs, judged case by case against
/// `ci/upstream/SUITE-DEVICE.expect`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Upstream {
    /// rdma-core's `tests/`.
    #[serde(rename = "rdma-core")]
    RdmaCore,
    /// The kernel's NIC driver selftests.
    #[serde(rename = "nic")]
    Nic,
}

/// One cell of the matrix.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Cell {
    /// One line for the report and `--dry-run`.
    pub what: String,
    /// The guests' job: a `ci-lib.sh` function call.
    pub call: String,
    /// The rows, in report order.
    pub tests: Vec<TestRow>,
    /// Seconds per guest, boot to result.
    pub timeout: u32,
    /// The daemon records the fabric (a `tshark` host row judges it).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub capture: bool,
    /// The daemon's fault rules (`[[fault]]` tables), as JSON objects.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub faults: Vec<Value>,
    /// `CI_*` variables for the guests.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// RDMA devices per role (erdma cells).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rdma: Option<PerRole>,
    /// NICs per role (gVNIC cells).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nic: Option<PerRole>,
    /// Virtio-net NICs per guest (2: a second port on the same subnet).
    #[serde(skip_serializing_if = "is_one")]
    pub nics: u32,
    /// The gVNIC's queues.
    #[serde(skip_serializing_if = "is_four")]
    pub gve_queues: u32,
    /// Extra `kind=erdma` port options.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub erdma_opts: String,
    /// The gVNICs' port options instead of the matrix's (`kind=gve,...`
    /// without the socket and MAC; the bench's defaults).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub gve_opts: String,
    /// The guests may ask the host to run `vhost-rdma ctl` (fault cells).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub ctl_broker: bool,
    /// The upstream suite the cell runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream: Option<Upstream>,
    /// The protocol checker must report nothing (host row `checker-clean`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub checker_clean: bool,
    /// The host takes the busy link down mid-stream (`smcr-failover`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub failover: bool,
    /// The host checks the server's RSS steps (`guest-runner rss-host`,
    /// host row `rss-host`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub rss_host: bool,
    /// The server's gVNIC is the README's `--port g=...,kind=gve` line as
    /// written (a new user's defaults), and the guests get `ncdevmem`; the
    /// host checks the device's side of the rows (`gve_device_rows`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub readme_gve: bool,
    /// vCPUs of the server guest.
    #[serde(skip_serializing_if = "is_one")]
    pub server_smp: u32,
    /// Only the server guest boots; its peer is a virtual host.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub one_guest: bool,
    /// The virtio-net ports' QEMU form: `pci` (virtio-net-pci with
    /// `-netdev vhost-user`) or `testdev` (vhost-user-test-device-pci: the
    /// daemon owns the device, config space and control queue).
    #[serde(skip_serializing_if = "is_pci")]
    pub form: &'static str,
    /// Queue pairs per virtio-net port.
    #[serde(skip_serializing_if = "is_one")]
    pub queues: u32,
    /// The guests run under the host's own QEMU (`scripts/setup-qemu.sh
    /// --system`, Debian bookworm's 7.2), not QEMU 11.1.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub stock_qemu: bool,
    /// The daemon's virtual hosts, their services and what each session
    /// must show (the `vhost-*` cells).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub virtual_hosts: Option<VirtualHosts>,
    /// The guests are on two daemons joined only by VXLAN uplinks
    /// (`matrix::vxlan`; host row `uplink-mtu`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub vxlan_pair: bool,
    /// The daemon runs in a lab of network namespaces with a VXLAN and a
    /// TAP uplink to Linux clients (`matrix::uplinks`; needs root).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub uplinks: bool,
    /// The host samples the daemon's CPU and sent bytes every 0.5 s into
    /// `daemon-cpu.log` (guest-results' `daemon_cpu`; the benches).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub daemon_cpu: bool,
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

fn is_pci(form: &&str) -> bool {
    *form == "pci"
}

fn is_four(n: &u32) -> bool {
    *n == 4
}

impl Cell {
    /// A cell with no devices, faults, capture or host helpers.
    pub fn new(what: &str, call: &str, tests: Vec<TestRow>, timeout: u32) -> Cell {
        Cell {
            what: what.to_string(),
            call: call.to_string(),
            tests,
            timeout,
            capture: false,
            faults: Vec::new(),
            env: BTreeMap::new(),
            rdma: None,
            nic: None,
            nics: 1,
            gve_queues: 4,
            erdma_opts: String::new(),
            gve_opts: String::new(),
            ctl_broker: false,
            upstream: None,
            checker_clean: false,
            failover: false,
            rss_host: false,
            readme_gve: false,
            server_smp: 1,
            one_guest: false,
            form: "pci",
            queues: 1,
            stock_qemu: false,
            virtual_hosts: None,
            vxlan_pair: false,
            uplinks: false,
            daemon_cpu: false,
        }
    }

    /// The guests that boot.
    pub fn roles(&self) -> &'static [Role] {
        if self.one_guest {
            SERVER
        } else {
            BOTH
        }
    }

    /// The cell without the rows named in `names`.
    fn without(mut self, names: &[&str]) -> Cell {
        self.tests.retain(|t| !names.contains(&t.0.as_str()));
        self
    }

    /// The cell with `rows` appended.
    fn with(mut self, rows: &[(&str, &[Role])]) -> Cell {
        self.tests.extend(rows.iter().map(|(n, r)| row(n, r)));
        self
    }

    /// The cell with `vars` added to its guests' environment.
    fn env(mut self, vars: &[(&str, &str)]) -> Cell {
        for (k, v) in vars {
            self.env.insert(k.to_string(), v.to_string());
        }
        self
    }

    /// The row names, in order.
    pub fn test_names(&self) -> impl Iterator<Item = &str> {
        self.tests.iter().map(|t| t.0.as_str())
    }
}

/// The tools of the verbs cells (rxe, siw, erdma): the perftest and
/// librdmacm tools, then smc-guest-tests' verbs, one row per verb.
fn verbs_tests() -> Vec<&'static str> {
    let mut t = vec![
        "ibv_rc_pingpong",
        "rping",
        "ib_send_bw",
        "ib_write_bw",
        "ib_read_bw",
        "ucmatose",
    ];
    t.extend([
        "verbs-send",
        "verbs-send_imm",
        "verbs-write",
        "verbs-write_imm",
        "verbs-read",
        "verbs-cas",
        "verbs-faa",
        "verbs-corrupt",
    ]);
    t
}

/// The protocols a capture cell's `tshark` row expects to decode.
pub fn capture_protos(cell: &str) -> &'static [&'static str] {
    match cell.split('-').next() {
        Some("rxe") => &["infiniband"],
        Some("siw") => &["iwarp_mpa", "iwarp_ddp_rdmap"],
        Some("smcr") => &["smc", "infiniband"],
        Some("vxlan") => &["infiniband"],
        _ => &[],
    }
}

/// The `uplinks` cell's client A, behind Linux VXLAN (`matrix::uplinks`).
pub const UPLINK_PEER_A: &str = "10.77.0.21";
/// The `uplinks` cell's client B, behind the TAP uplink.
pub const UPLINK_PEER_B: &str = "10.77.0.22";
/// The bytes of each of the `uplinks` cell's streams, host and guest.
pub const UPLINK_STREAM_BYTES: u64 = 64 << 20;

/// The cells whose guests are on two daemons joined only by VXLAN uplinks
/// (`matrix::vxlan`): `vxlan` (ping, siw rping, verified TCP) or, with
/// `rdma`, `vxlan-rdma` (rxe pingpong, SMC-Rv2 both ways, pingpong under
/// loss and reordering on the uplink, the capture).
fn vxlan(rdma: bool) -> Cell {
    const BASE: &str = "two daemons joined only by their default `kind=vxlan` uplinks (VNI 77, \
                        loopback underlay; as root a namespace whose loopback MTU is 1500, so \
                        full-size frames cross as IP fragments), one guest on each at MTU 1500";
    let mut c = if rdma {
        let mut c = Cell::new(
            &format!(
                "{BASE}: rxe ibv_rc_pingpong -c; SMC-Rv2 64 MiB each way, verified, smc_mode=smcr; \
                 ibv_rc_pingpong -c while daemon A's uplink drops 2 % and reorders 5 % of RoCEv2; \
                 the capture decodes as RoCE"
            ),
            "cell_vxlan rdma",
            vec![
                row("link-add-rxe", BOTH),
                row("smc-ueid", BOTH),
                row("smc-devices", BOTH),
                row("ibv_rc_pingpong", BOTH),
                row("smc-c2s", BOTH),
                row("smc-s2c", BOTH),
                row("faults-rc", BOTH),
                row("loss-evidence", HOST),
                row("tshark", HOST),
            ],
            1500,
        );
        c.capture = true;
        c.ctl_broker = true;
        c
    } else {
        let mut c = Cell::new(
            &format!(
                "{BASE}: ping; siw rping -V, 50 pings of 4 KiB; 64 MiB of TCP, every byte verified"
            ),
            "cell_vxlan basic",
            vec![
                row("ping", &[Role::Client]),
                row("link-add-siw", BOTH),
                row("rping-siw", BOTH),
                row("tcp-stream", BOTH),
            ],
            1200,
        )
        .env(&[("CI_VXLAN_BYTES", "64M")]);
        // the siw cells' workaround: without it the 7.3 siw_accept() race
        // left the server's QP deaf to the first FPDU
        c.faults = vec![json!({"port": "a", "dir": "both", "proto": "tcp",
                               "action": "mpa-settle", "delay-ms": 300})];
        // the TCP stream's full-size frames: RoCE's (rxe MTU 1024) all fit
        c.tests.push(row("uplink-mtu", HOST));
        c
    };
    c.vxlan_pair = true;
    c
}

/// The lossy cells' rules: on each of `ports`, 2 % drop and 5 % reorder
/// (window 4, 20 ms) of the frames matching `matcher`, into the port.
fn lossy_faults(matcher: &Value, ports: &[&str]) -> Vec<Value> {
    let mut rules = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let mut drop = matcher.clone();
        let mut reorder = matcher.clone();
        let fields = [
            (
                &mut drop,
                json!({"port": port, "dir": "ingress", "action": "drop", "prob": 0.02,
                       "seed": 101 + i}),
            ),
            (
                &mut reorder,
                json!({"port": port, "dir": "ingress", "action": "reorder", "prob": 0.05,
                       "window": 4, "hold-ms": 20, "seed": 201 + i}),
            ),
        ];
        for (rule, add) in fields {
            if let (Some(r), Some(a)) = (rule.as_object_mut(), add.as_object()) {
                r.extend(a.clone());
            }
        }
        rules.extend([drop, reorder]);
    }
    rules
}

/// The daemon port of a role's erdma function (`ar`, `br`).
pub fn erdma_port(role: Role) -> &'static str {
    match role {
        Role::Client => "br",
        _ => "ar",
    }
}

/// The daemon port of a role's gVNIC (`ag`, `bg`).
pub fn gve_port(role: Role) -> &'static str {
    match role {
        Role::Client => "bg",
        _ => "ag",
    }
}

/// The device set-up rows of a cell whose roles use `rdma`: `erdma-up`
/// for erdma functions, `link-add-DEV` for the guest's own devices.
fn device_rows(rdma: PerRole) -> Vec<TestRow> {
    let mut out: Vec<TestRow> = Vec::new();
    for role in [Role::Server, Role::Client] {
        let name = match rdma.of(role) {
            Device::Erdma => "erdma-up".to_string(),
            d => format!("link-add-{}", d.name()),
        };
        match out.iter_mut().find(|t| t.0 == name) {
            Some(t) => t.1.push(role),
            None => out.push(TestRow(name, vec![role])),
        }
    }
    out
}

impl Device {
    /// The name the guests' `CI_RDMA` / `CI_NIC` and the expectations
    /// files use.
    pub fn name(self) -> &'static str {
        match self {
            Device::Erdma => "erdma",
            Device::Rxe => "rxe",
            Device::Gve => "gve",
            Device::Virtio => "virtio",
        }
    }
}

/// Cell `base` on the devices `rdma`: its `link-add-*` rows replaced by
/// the devices' set-up rows, no capture.
fn with_devices(base: &Cell, rdma: PerRole, what: &str) -> Cell {
    let mut c = base.clone();
    let mut tests = device_rows(rdma);
    tests.extend(
        base.tests
            .iter()
            .filter(|t| !t.0.starts_with("link-add-") && t.0 != "tshark")
            .cloned(),
    );
    c.tests = tests;
    c.rdma = Some(rdma);
    c.capture = false;
    c.what = what.to_string();
    c
}

/// A cell of one guest (the server role) against the daemon's virtual
/// hosts: a row per service (its host half judged from `ctl hosts`),
/// `first_row` (the device's set-up) and the host rows `extra`.
fn one_guest(what: &str, call: &str, first_row: &str, hosts: VirtualHosts, extra: &[&str]) -> Cell {
    let names = std::iter::once(first_row)
        .chain(hosts.services.iter().map(|s| s.row.as_str()))
        .chain(extra.iter().copied());
    let mut rows: Vec<TestRow> = Vec::new();
    for n in names {
        if !rows.iter().any(|r| r.0 == n) {
            let role = if extra.contains(&n) {
                Role::Host
            } else {
                Role::Server
            };
            rows.push(TestRow(n.to_string(), vec![role]));
        }
    }
    let mut c = Cell::new(what, call, rows, 1800).env(&[
        ("CI_TOOL_TIMEOUT", "600"),
        ("CI_VHOST2", virtual_hosts::VH2),
    ]);
    c.one_guest = true;
    c.virtual_hosts = Some(hosts);
    c
}

/// RoCEv2 (rxe or the erdma function) against virtual hosts.
fn vhost_roce(dev: Device) -> Cell {
    use virtual_hosts::{BW_ITERS, COUNT, PINGPONG_ITERS};
    let (name, first) = match dev {
        Device::Erdma => (
            "one guest's erdma function (erdma_0: both RC ends run by the daemon)",
            "erdma-up",
        ),
        _ => ("one guest's rdma_rxe on eth0", "link-add-rxe"),
    };
    let mut c = one_guest(
        &format!(
            "{name} against virtual hosts: ibv_rc_pingpong ({PINGPONG_ITERS}), \
             ib_write/send/read/atomic_bw ({BW_ITERS}, TCP exchange and -R over the IB CM), \
             rping -V and ucmatose over the IB CM ({COUNT}); each tool as client and as server; \
             each row also needs the host's session finished with every iteration verified"
        ),
        &format!("cell_vhost {}", dev.name()),
        first,
        virtual_hosts::roce_hosts(),
        &[],
    );
    c.rdma = Some(PerRole {
        server: dev,
        client: dev,
    });
    c
}

/// siw (iWARP) against virtual hosts.
fn vhost_iwarp() -> Cell {
    one_guest(
        "one guest's siw (iWARP) against virtual hosts (smoltcp TCP, the siw crate's engine): \
         rping -V, ucmatose, ib_write/send/read_bw -R; each tool as client and as server, with MPA \
         CRC off and asked for by the host; each row also needs the host's session finished with \
         every iteration verified",
        "cell_vhost siw",
        "link-add-siw",
        virtual_hosts::iwarp_hosts(),
        &["mpa-crc-negotiated"],
    )
}

/// The rss cell's Toeplitz key (`ethtool -X hkey`).
const RSS_KEY: &str = "5a:7f:10:35:ce:e3:84:59:72:17:28:cd:e6:bb:5c:71:0a:2f:c0:e5:be:53:74:09:\
                       22:c7:98:bd:56:6b:0c:21:fa:9f:b0:55:6e:03:24:f9";

/// The rss cell's `flows.json` for `guest-runner rss-host`, from the
/// cell's environment: {"key", "flows": [[PROTO, PORT]...], "move_sport"}.
pub fn rss_flows(cell: &Cell) -> Value {
    let var = |k: &str| cell.env.get(k).map_or("", String::as_str);
    let ports = |proto: &str, k: &str| -> Vec<Value> {
        var(k)
            .split_whitespace()
            .filter_map(|p| p.parse::<u16>().ok())
            .map(|p| json!([proto, p]))
            .collect()
    };
    let mut flows = ports("tcp", "CI_RSS_TCP_PORTS");
    flows.extend(ports("udp", "CI_RSS_UDP_PORTS"));
    json!({
        "key": var("CI_RSS_KEY"),
        "flows": flows,
        "move_sport": var("CI_RSS_MOVE_PORT").parse::<u16>().unwrap_or(0),
    })
}

/// Seconds added to a cell's time limit under loss.
const LOSSY_EXTRA_S: u32 = 900;

/// The lossy variant of verbs or SMC-R cell `base`.
fn lossy(base: &Cell, name: &str, matcher: Value, path: &str) -> Cell {
    let mut c = base.clone().without(&["tshark", "smc-64conns"]);
    c.capture = false;
    c.what = format!(
        "{name} cell with 2 % drop + 5 % reorder (window 4) on the {path} path, both directions"
    );
    c.faults = lossy_faults(&matcher, &["a", "b"]);
    c.timeout += LOSSY_EXTRA_S;
    c = c
        .with(&[("loss-evidence", HOST)])
        .env(&[("CI_PERFTEST_ITERS", "100"), ("CI_TOOL_TIMEOUT", "420")]);
    if name == "smcr" {
        c = c.env(&[
            ("CI_SMC_BYTES", "16M"),
            ("CI_SMC_BIG_BYTES", "32M"),
            ("CI_SMC_SKIP_MANY", "1"),
            ("CI_SMC_STREAM_CONNS", "1"),
            ("CI_STREAM_TIMEOUT", "900"),
        ]);
    }
    c
}

/// The matrix's cells by name.
pub fn cells() -> BTreeMap<String, Cell> {
    let mut m: BTreeMap<String, Cell> = BTreeMap::new();
    let verbs = |dev: &str| -> Vec<TestRow> {
        let mut t = vec![row(&format!("link-add-{dev}"), BOTH)];
        t.extend(verbs_tests().into_iter().map(|n| row(n, BOTH)));
        t
    };
    let mut rxe = Cell::new(
        "rdma_rxe (RoCEv2) on eth0 in both guests; ibv_rc_pingpong (-g RoCEv2 GID), rping -V, \
         ib_send/write/read_bw (-x GID index, TCP out-of-band), ucmatose; smc-guest-tests verbs \
         (ibverbs): SEND, SEND+imm, WRITE(+imm), READ, CAS, FAA, data verified",
        "cell_verbs rxe",
        verbs("rxe"),
        1500,
    );
    let mut siw = Cell::new(
        "siw (iWARP) on eth0 in both guests; rping -V, ib_send/write/read_bw -R (rdma_cm; read \
         with -o 16), ucmatose; ibv_rc_pingpong SKIPPED (no rdma_cm mode, iWARP needs iw_cm); \
         smc-guest-tests verbs (ibverbs QP connected via rdma_cm): SEND, WRITE, READ verified; imm \
         and atomics SKIPPED (iWARP has none)",
        "cell_verbs siw",
        verbs("siw"),
        1500,
    );
    let mut smcr = Cell::new(
        "SMC-Rv2 over rxe: UEID on both, smc devices --require-smcr, stream --proto smc: 1 B x 1 \
         conn c2s; 256 KiB x 64 conns both ways, server closes first; 64 MiB x 4 conns both ways; \
         256 MiB x 1 conn s2c, server closes first; every byte verified, no fallback \
         (smc_mode=smcr)",
        "cell_smcr",
        [
            "link-add-rxe",
            "smc-ueid",
            "smc-devices",
            "smc-1byte",
            "smc-64conns",
            "smc-stream",
            "smc-big-s2c",
        ]
        .into_iter()
        .map(|n| row(n, BOTH))
        .collect(),
        1800,
    );
    // Captures (issue 6): the whole fabric, decoded by tshark on the host.
    for c in [&mut rxe, &mut siw, &mut smcr] {
        c.capture = true;
        c.tests.push(row("tshark", HOST));
    }
    let noueid = Cell::new(
        "negative: stream --proto smc with a UEID on one side only must FAIL on both sides naming \
         the decline code: server-only UEID -> 0x03030008 NOUEID (client: PEERDECL + peer \
         diagnosis); client-only UEID -> 0x03030007 NOSMCD2DEV (or 0x03030008/0x03030000)",
        "cell_smc_noueid",
        vec![
            row("link-add-rxe", BOTH),
            row("smc-ueid", SERVER),
            row("smc-devices", BOTH),
            row("smc-noueid-client", BOTH),
            row("smc-ueid-swap", BOTH),
            row("smc-noueid-server", BOTH),
        ],
        900,
    );
    let roce = json!({"proto": "udp", "dst-port": 4791});
    // ibv_rc_pingpong's exit races under loss on any RC device (it struck
    // rxe-lossy once, 2026-11-29: ci/README.md, erdma cells).
    let rxe_lossy = lossy(&rxe, "rxe", roce.clone(), "RoCEv2 (UDP 4791)").env(&[(
        "CI_SKIP_PINGPONG",
        "under loss its exit races: a lost last ACK leaves one side retransmitting to a QP the \
         other side destroyed (ci/README.md, erdma cells)",
    )]);
    let smcr_lossy = lossy(&smcr, "smcr", roce.clone(), "RoCEv2 (UDP 4791)");
    let siw_lossy = lossy(&siw, "siw", json!({"proto": "tcp"}), "TCP (iWARP)");
    let mut failover = Cell::new(
        "SMC-Rv2 link failover: two NICs per guest (rxe0/eth0, rxe1/eth1, four daemon ports), the \
         link group gets a second link; net.smc.smcr_testlink_time 5 s; mid-stream the host takes \
         the busy link's port down (`ctl link down`, and its guest NIC's carrier) for 30 s; the 512 MiB stream must complete \
         verified as SMC-R, carried by the other link while the first is down (flows view)",
        "cell_smcr_failover",
        vec![
            row("link-add-rxe", BOTH),
            row("smc-ueid", BOTH),
            row("smc-devices", BOTH),
            row("smc-two-devices", BOTH),
            row("smc-failover-stream", BOTH),
            row("failover-evidence", HOST),
        ],
        1500,
    );
    failover.nics = 2;
    failover.failover = true;
    failover.capture = true;
    let siw_conn = Cell::new(
        "siw connection-setup stress (diagnostics): N rounds of ucmatose and ib_read_bw -R \
         (default -o), siw kprobe trace; --siw-conn-rounds N",
        "cell_siw_conn",
        vec![row("link-add-siw", BOTH)],
        2400,
    );
    let mut erdma = with_devices(
        &rxe,
        ERDMA_BOTH,
        "erdma functions (RC QPs run by the daemon) in both guests: ibv_rc_pingpong, rping -V, \
         ib_send/write/read_bw, ucmatose; smc-guest-tests verbs: SEND, SEND+imm, WRITE(+imm), \
         READ, CAS, FAA",
    );
    erdma.call = "cell_verbs erdma".into();
    // two QPs of the server's function through its own loopback
    let loopback: &[(&str, &[Role])] =
        &[("loopback-pingpong", SERVER), ("loopback-write-bw", SERVER)];
    erdma = erdma.with(loopback);
    let mut erdma_rxe = with_devices(
        &rxe,
        ERDMA_RXE,
        "erdma function (server) against rdma_rxe (client): the same tools as the rxe cell",
    );
    erdma_rxe.call = "cell_verbs \"$CI_RDMA\"".into();
    erdma_rxe = erdma_rxe.with(loopback);
    // Clean runs: the protocol checker must report nothing.
    let mut erdma_smcr = with_devices(
        &smcr,
        ERDMA_BOTH,
        "SMC-Rv2 between two erdma functions: UEID on both; 1 B; 256 KiB x 64 conns; 64 MiB x 4 \
         conns both ways; 256 MiB s2c; every byte verified, smc_mode=smcr; no checker finding",
    )
    .with(&[("checker-clean", HOST)]);
    erdma_smcr.checker_clean = true;
    let mut erdma_rxe_smcr = with_devices(
        &smcr,
        ERDMA_RXE,
        "SMC-Rv2 between an erdma function (server) and rdma_rxe (client), as erdma-smcr",
    )
    .with(&[("checker-clean", HOST)]);
    erdma_rxe_smcr.checker_clean = true;
    let erdma_ports = [erdma_port(Role::Server), erdma_port(Role::Client)];
    let mut erdma_smcr_lossy = erdma_smcr
        .clone()
        .without(&["checker-clean", "smc-64conns"])
        .with(&[("loss-evidence", HOST)]);
    erdma_smcr_lossy.checker_clean = false;
    erdma_smcr_lossy.what = "erdma-smcr with 2 % drop + 5 % reorder (window 4) on both erdma \
                             ports (RoCEv2, UDP 4791), both directions: 1 B; 64 MiB x 4 conns \
                             both ways; 64 MiB s2c"
        .into();
    erdma_smcr_lossy.faults = lossy_faults(&roce, &erdma_ports);
    erdma_smcr_lossy.timeout += LOSSY_EXTRA_S;
    // The loss-free cell's streams (the daemon's RC engine recovers fast
    // enough); no 64-connection round, as in smcr-lossy.
    erdma_smcr_lossy.env = smcr_lossy.env.clone();
    erdma_smcr_lossy = erdma_smcr_lossy.env(&[
        ("CI_SMC_BYTES", "64M"),
        ("CI_SMC_STREAM_CONNS", "4"),
        ("CI_SMC_BIG_BYTES", "64M"),
    ]);
    let mut erdma_lossy = erdma.clone().with(&[("loss-evidence", HOST)]);
    erdma_lossy.what = "erdma cell with 2 % drop + 5 % reorder (window 4) on both erdma ports \
                        (RoCEv2, UDP 4791), both directions"
        .into();
    erdma_lossy.faults = lossy_faults(&roce, &erdma_ports);
    erdma_lossy.timeout += LOSSY_EXTRA_S;
    // rxe-lossy's environment, with its ibv_rc_pingpong skipped.
    erdma_lossy.env = rxe_lossy.env.clone();
    let mut upstream_rdma = Cell::new(
        "rdma-core's tests/ (pyverbs, unmodified, the guest's rdma-core) on erdma_0 (server guest) \
         and on rxe0 (client guest, baseline); one row per case, judged against \
         ci/upstream/rdma-core-*.expect",
        "cell_upstream_rdma",
        device_rows(ERDMA_RXE),
        3000,
    )
    .with(&[("rdma-core-suite", BOTH), ("repro-query-qp-uninit", BOTH)]);
    upstream_rdma.rdma = Some(ERDMA_RXE);
    upstream_rdma.upstream = Some(Upstream::RdmaCore);
    let mut upstream_nic = Cell::new(
        "the kernel's NIC selftests (drivers/net/*.py, drivers/net/hw/*.py of the guest kernel's \
         source, unmodified) with NETIF = the emulated gVNIC (server guest) and virtio-net (client \
         guest, baseline), remote = eth1 in a netns; one row per case, judged against \
         ci/upstream/nic-*.expect",
        "cell_upstream_nic",
        vec![
            row("nic-setup", BOTH),
            row("nic-suite", BOTH),
            row("repro-gve-qstats-oops", SERVER),
        ],
        5400,
    )
    .env(&[("CI_NIC_FILE_TIMEOUT", "300")]);
    upstream_nic.nics = 2;
    upstream_nic.nic = Some(GVE_VIRTIO);
    upstream_nic.upstream = Some(Upstream::Nic);
    let mut smcr_lossy_4 = smcr_lossy.clone().env(&[
        ("CI_SMC_STREAM_CONNS", "4"),
        // a short stream timeout: the stuck-guest watch acts after (this
        // + 600) s of silence
        ("CI_STREAM_TIMEOUT", "240"),
    ]);
    smcr_lossy_4.what = "diagnostics: smcr-lossy with the stream on 4 parallel connections both \
                         ways (the client guest stops under loss on 7.3, see ci/README.md)"
        .into();
    for (name, c) in [
        ("rxe", rxe),
        ("siw", siw),
        ("smcr", smcr),
        ("smc-noueid", noueid),
        ("rxe-lossy", rxe_lossy),
        ("smcr-lossy", smcr_lossy),
        ("siw-lossy", siw_lossy),
        ("smcr-failover", failover),
        ("siw-conn", siw_conn),
        ("erdma", erdma),
        ("erdma-rxe", erdma_rxe),
        ("erdma-smcr", erdma_smcr),
        ("erdma-rxe-smcr", erdma_rxe_smcr),
        ("erdma-smcr-lossy", erdma_smcr_lossy),
        ("erdma-lossy", erdma_lossy),
        ("upstream-rdma", upstream_rdma),
        ("upstream-nic", upstream_nic),
        ("smcr-lossy-4conns", smcr_lossy_4),
    ] {
        m.insert(name.to_string(), c);
    }
    let mut gve_faults = fault_cell(
        "device faults on the server's emulated gVNIC (one RX/TX queue, 10.78.0.1, peer 10.78.0.2 on \
         the client's virtio eth0): link-down/up, reset-request, adminq-status, adminq-timeout, \
         tx-miss (reinjected and timed out), tx-stall, rx-error, rx-bad-csum, rx-bad-buf-id; each: \
         arm through `ctl device-fault`, evidence in the guest (dmesg, ethtool -S, carrier), clear, \
         verified TCP both ways; trace of the probe",
        "cell_gve_faults",
        "gve-faults",
        &[("gve-setup", BOTH), ("gve-baseline", BOTH)],
        &[("gve-nic-stats", SERVER), ("device-trace", HOST)],
    );
    gve_faults.nic = Some(GVE_VIRTIO);
    gve_faults.gve_queues = 1;
    let mut erdma_faults = fault_cell(
        "device faults on the server's erdma function (erdma_0): cqe-status, qp-stall, aeq (QP, \
         CQ), port-down/up, cmd-status, cmdq-timeout (last: the 7.3 driver never recovers from \
         it); each: arm through `ctl device-fault` when the QP exists, evidence in the guest \
         (ibv_rc_pingpong's status, async events, port state, dmesg), clear, rping -V; trace of \
         one RC QP's life",
        "cell_erdma_faults",
        "erdma-faults",
        &[("erdma-up", BOTH), ("erdma-baseline", BOTH)],
        &[("device-trace", HOST)],
    );
    erdma_faults.rdma = Some(ERDMA_BOTH);
    // A finite transport retry count: with the default 7 the daemon's RC
    // engine retries for ever (7 = infinite, as rxe), so a QP on a downed
    // port would never complete RETRY_EXC_ERR.
    erdma_faults.erdma_opts = "retry-cnt=6".into();
    m.insert("gve-faults".into(), gve_faults);
    m.insert("erdma-faults".into(), erdma_faults);
    for (name, form, queues, conns, stock_qemu) in [
        ("fabric-pci-1q", "pci", 1, 1, false),
        ("fabric-pci-2q", "pci", 2, 4, false),
        ("fabric-testdev-1q", "testdev", 1, 1, false),
        ("fabric-qemu7", "pci", 1, 1, true),
    ] {
        let qemu = if stock_qemu {
            "the host's QEMU 7.2 (Debian bookworm)"
        } else {
            "QEMU 11.1"
        };
        let dev = if form == "pci" {
            "virtio-net-pci + -netdev vhost-user"
        } else {
            "vhost-user-test-device-pci (the daemon owns the virtio-net device)"
        };
        let mut rows = vec![row("tcp-stream", BOTH)];
        if queues > 1 {
            rows.insert(0, row("channels", BOTH));
        }
        let mut c = Cell::new(
            &format!(
                "the switch: {qemu}, {dev}, {queues} queue pair(s); ping, then 256 MiB of TCP \
                 on each of {conns} connection(s), every byte verified"
            ),
            "cell_fabric",
            rows,
            900,
        )
        .env(&[
            ("CI_QUEUES", &queues.to_string()),
            ("CI_FABRIC_CONNS", &conns.to_string()),
            ("CI_FABRIC_BYTES", "256M"),
        ]);
        c.form = form;
        c.queues = queues;
        c.stock_qemu = stock_qemu;
        m.insert(name.into(), c);
    }
    let mut rss = Cell::new(
        "multiqueue steering, RSS and hash report: 4 queue pairs, the test-device form; the \
         server's `ethtool -x/-X` (default, equal 2, equal 4 with a key) and per-queue counters \
         of 6 TCP and 6 UDP flows against the daemon's table, key, model predictions, hash \
         values and hash reports; then a steer rule moves a flow, a drop rule eats RSTs",
        "cell_rss",
        vec![
            row("rss-steps", SERVER),
            row("iperf3-server", &[Role::Client]),
            row("rss-host", HOST),
        ],
        1500,
    )
    .env(&[
        ("CI_RSS_KEY", RSS_KEY),
        // picked so that with the key and `equal 4` the model sends them to all 4 queues
        ("CI_RSS_TCP_PORTS", "41001 41004 41016 41020 41002 41017"),
        ("CI_RSS_UDP_PORTS", "42001 42004 42008 42012 42002 42009"),
        ("CI_RSS_MOVE_PORT", "41100"),
    ]);
    rss.form = "testdev";
    rss.queues = 4;
    rss.rss_host = true;
    m.insert("rss".into(), rss);
    let mut gve = Cell::new(
        "the emulated gVNIC as a new user starts it (the README's `kind=gve` port line, its \
         defaults) on the server (2 vCPUs), against the client's virtio-net: probe (DQO RDA), \
         channels, 256 MiB verified TCP each way, header split, RSS, an ntuple rule steering a \
         flow to queue 1, devmem TCP with the kernel's ncdevmem (self-check, 64 MiB validated \
         into a udmabuf, plain TCP after it, refused with header split off); the device's own \
         counters and tables checked too",
        "cell_gve",
        vec![
            row("readme-port", HOST),
            row("gve-setup", BOTH),
            row("probe", SERVER),
            row("channels", SERVER),
            row("tcp-gve-tx", BOTH),
            row("tcp-gve-rx", BOTH),
            row("header-split", SERVER),
            row("rss", SERVER),
            row("ntuple-flow", BOTH),
            row("ntuple", SERVER),
            row("devmem-selfcheck", SERVER),
            row("devmem-rx", BOTH),
            row("devmem-after", BOTH),
            row("devmem-hds-off", SERVER),
        ],
        1500,
    )
    .env(&[("CI_GVE_BYTES", "256M")]);
    gve.nic = Some(GVE_VIRTIO);
    gve.readme_gve = true;
    gve.server_smp = 2;
    gve.ctl_broker = true;
    m.insert("gve".into(), gve);
    let mut uplinks = Cell::new(
        "the uplinks in a lab of network namespaces (root): the daemon's VXLAN uplink to a Linux \
         vxlan netdev bridged to client A, its TAP uplink on a Linux bridge with client B; A and B \
         ping vh and stream 64 MiB to each other, verified; 1500-byte DF pings cross as \
         fragmented outer packets; the underlay decodes as VXLAN; one guest (MTU 1450) pings A \
         and B, is pinged by them, and streams 64 MiB each way with each, verified at both ends",
        "cell_uplink",
        vec![
            row("vxlan-ping", HOST),
            row("tap-ping", HOST),
            row("tcp", HOST),
            row("mtu", HOST),
            row("capture", HOST),
            row("guest-vxlan-ping", SERVER),
            row("guest-vxlan-tcp", SERVER),
            row("guest-tap-ping", SERVER),
            row("guest-tap-tcp", SERVER),
        ],
        1200,
    )
    .env(&[
        ("CI_UPLINK_A", UPLINK_PEER_A),
        ("CI_UPLINK_B", UPLINK_PEER_B),
        (
            "CI_UPLINK_BYTES",
            &format!("{}M", UPLINK_STREAM_BYTES >> 20),
        ),
    ]);
    uplinks.one_guest = true;
    uplinks.uplinks = true;
    m.insert("uplinks".into(), uplinks);
    m.insert("vxlan".into(), vxlan(false));
    m.insert("vxlan-rdma".into(), vxlan(true));
    m.insert("vhost-rxe".into(), vhost_roce(Device::Rxe));
    m.insert("vhost-erdma".into(), vhost_roce(Device::Erdma));
    m.insert("vhost-siw".into(), vhost_iwarp());
    for mode in ["shared", "exclusive"] {
        let exclusive = mode == "exclusive";
        let what = format!(
            "`rdma system set netns {mode}`; the server guest moves eth0 into a namespace{}; \
             erdma_0 visible {}; ibv_rc_pingpong, rping -V, ib_write_bw run inside it against the \
             client",
            if exclusive {
                " and erdma_0 with it (rdma dev set ... netns)"
            } else {
                ""
            },
            if exclusive {
                "only there"
            } else {
                "in both namespaces"
            }
        );
        let mut c = Cell::new(
            &what,
            &format!("cell_netns {mode}"),
            vec![
                row("rdma-netns-mode", SERVER),
                row("erdma-up", BOTH),
                row("rdma-netns-visible", SERVER),
                row("ibv_rc_pingpong", BOTH),
                row("rping", BOTH),
                row("ib_write_bw", BOTH),
            ],
            1200,
        );
        c.rdma = Some(ERDMA_BOTH);
        m.insert(format!("erdma-netns-{mode}"), c);
    }
    m
}

fn case(name: &str, kind: &str, driver: &str, expect: &[&str], recovers: bool) -> FaultCase {
    FaultCase {
        case: name.to_string(),
        kind: kind.to_string(),
        driver: driver.to_string(),
        expect: expect.iter().map(|e| e.to_string()).collect(),
        recovers,
        no_hits: None,
    }
}

/// The `gve-faults` cell's cases, in run order: the fault kind, the 7.3 driver code
/// that runs, the evidence the server's row must show, and whether traffic
/// comes back once the rule is cleared.
pub fn gve_faults_cases() -> Vec<FaultCase> {
    vec![
        case("link-down", "link-down", "gve_main.c: gve_mgmnt_intr -> gve_service_task -> gve_handle_link_status (netif_carrier_off)", &["carrier_during=0", "Device link is down"], true),
        case("link-up", "link-up", "gve_main.c: gve_service_task -> gve_handle_link_status (netif_carrier_on); the port was taken down first with `ctl link --port ag down`", &["carrier_ctl_down=0", "carrier_during=1", "Device link is up"], true),
        case("reset-request", "reset-request", "gve_main.c: gve_service_task -> gve_handle_status -> gve_handle_reset -> gve_reset(priv, false) (turndown, gve_adminq_release, gve_init_priv, gve_open)", &["Device requested reset", "Performing reset", "reset_cnt \\+[1-9]"], true),
        case("adminq-status", "adminq-status", "gve_adminq.c: gve_adminq_kick_and_wait -> gve_adminq_parse_err (-ETIME) -> gve_adminq_configure_flow_rule -> gve_reset(priv, true)", &["AQ command failed with status -12", "Timeout to configure the flow rule", "Performing reset"], true),
        case("rx-error", "rx-error", "gve_rx_dqo.c: gve_rx_poll_dqo -> gve_rx_dqo (compl_desc->rx_error: buffer recycled, -EINVAL)", &["rx_desc_err_dropped_pkt \\+[1-9]"], true),
        case("rx-bad-csum", "rx-bad-csum", "gve_rx_dqo.c: gve_rx_complete_skb -> gve_rx_skb_csum (csum_l4_err: CHECKSUM_NONE, the stack checks the checksum itself)", &["rx_desc_err_dropped_pkt \\+0", "rx_drops_invalid_checksum\\[0\\] \\+[1-9]"], true),
        case("rx-bad-buf-id", "rx-bad-buf-id", "gve_rx_dqo.c: gve_rx_dqo (buffer_id >= num_buf_states or not allocated: -EINVAL)", &["RX buffer_id", "rx_desc_err_dropped_pkt \\+[1-9]"], true),
        case("tx-miss-reinject", "tx-miss", "gve_tx_dqo.c: gve_clean_tx_done_dqo -> gve_handle_miss_completion, then gve_handle_packet_completion(is_reinjection)", &["tx_dropped \\+0"], true),
        case("tx-miss-timeout", "tx-miss", "gve_tx_dqo.c: gve_handle_miss_completion, then remove_miss_completions after GVE_REINJECT_COMPL_TIMEOUT (1 s): skb freed as dropped", &["No reinjection completion was received", "tx_dropped \\+[1-9]"], true),
        case("tx-stall", "tx-stall", "net/sched dev_watchdog -> gve_main.c: gve_tx_timeout (gve_tx_timeout_try_q_kick, else gve_schedule_reset)", &["Timeout on tx queue, 0", "tx_timeouts \\+[1-9]"], true),
        case("adminq-timeout", "adminq-timeout", "gve_adminq.c: gve_adminq_wait_for_cmd (100 x 20 ms) -> gve_adminq_kick_and_wait (-ENOTRECOVERABLE) -> gve_main.c: gve_destroy_rings -> gve_queues_stop -> gve_reset_and_teardown + gve_reset_recovery", &["AQ commands timed out, need to reset AQ"], true),
    ]
}

/// The `erdma-faults` cell's cases, in run order: the fault kind, the 7.3 driver code
/// that runs, the evidence the server's row must show, and whether traffic
/// comes back once the rule is cleared.
pub fn erdma_faults_cases() -> Vec<FaultCase> {
    vec![
        case("cqe-status", "cqe-status", "rdma-core providers/erdma (user CQ, polled in libibverbs: the kernel's erdma_poll_one_cqe serves kernel consumers only); ibv_rc_pingpong prints the ibv_wc_status", &["Failed status transport retry counter exceeded \\(12\\)"], true),
        case("qp-stall", "qp-stall", "none in the guest: the SQ doorbell is rung from user space (rdma-core providers/erdma); the stalled QP simply gets no completion until the rule is cleared", &["stalled=yes", "completed_after_clear=yes"], true),
        case("aeq-qp", "aeq", "erdma_main.c: erdma_comm_irq_handler -> erdma_eq.c: erdma_aeq_event_handler (every type but CQ_ERR becomes IB_EVENT_QP_FATAL) -> uverbs async event of the QP's owner", &["IBV_EVENT_QP_FATAL"], true),
        case("aeq-cq", "aeq", "erdma_eq.c: erdma_aeq_event_handler (CQ_ERR: erdma_cq_get_by_cqn -> IB_EVENT_CQ_ERR) -> uverbs async event of the CQ's owner", &["IBV_EVENT_CQ_ERR"], true),
        case("port-down", "port-down", "none: erdma_verbs.c: erdma_port_event() is never called in 7.3; erdma_query_port reports ib_get_curr_port_state() of the paired netdev, which stays up; the RC QP retries until RETRY_EXC_ERR (rdma-core providers/erdma)", &["port_during=PORT_ACTIVE", "Failed status transport retry counter exceeded \\(12\\)"], true),
        case("port-up", "port-up", "none (as port-down): the device port was taken down by a port-down rule; port-up lets the QP's frames through again", &["after_port_up=pass"], true),
        case("cmd-status", "cmd-status", "erdma_cmdq.c: erdma_post_cmd_wait (comp_status != 0: -EIO) -> erdma_verbs.c: erdma_create_qp", &["Couldn't create QP"], true),
        case("cmdq-timeout", "cmdq-timeout", "erdma_cmdq.c: erdma_wait_cmd_completion (15 s, ERDMA_CMD_STATUS_TIMEOUT) -> erdma_post_cmd_wait sets ERDMA_CMDQ_STATE_TIMEOUT_BIT and clears OK: every later command returns -ENODEV", &["Couldn't create QP", "failed to destroy CQ \\d+: -19"], false),
    ]
}
/// The fault cases of fault cell `cell` (empty for other cells).
pub fn fault_cases(cell: &str) -> Vec<FaultCase> {
    match cell {
        "gve-faults" => gve_faults_cases(),
        "erdma-faults" => erdma_faults_cases(),
        _ => Vec::new(),
    }
}

/// The device traces a fault cell keeps: file -> names that must appear
/// in it. The gVNIC's probe is traced from the daemon's start; the erdma
/// RC QP's life around one ibv_rc_pingpong.
pub fn fault_traces(cell: &str) -> &'static [(&'static str, &'static [&'static str])] {
    match cell {
        "gve-faults" => &[(
            "trace-gve-probe.txt",
            &[
                "DESCRIBE_DEVICE",
                "CONFIGURE_DEVICE_RESOURCES",
                "CREATE_TX_QUEUE",
                "CREATE_RX_QUEUE",
            ],
        )],
        "erdma-faults" => &[(
            "trace-erdma-rc-qp.txt",
            &["CREATE_QP", "MODIFY_QP", "DESTROY_QP"],
        )],
        _ => &[],
    }
}

/// A fault cell: `setup` rows, a `fault-CASE` row from the server per
/// case, then `tail` rows.
fn fault_cell(
    what: &str,
    call: &str,
    cell: &str,
    setup: &[(&str, &[Role])],
    tail: &[(&str, &[Role])],
) -> Cell {
    let mut c = Cell::new(what, call, Vec::new(), 1800).with(setup);
    for fc in fault_cases(cell) {
        c.tests.push(row(&format!("fault-{}", fc.case), SERVER));
    }
    c = c.with(tail);
    c.ctl_broker = true;
    c
}

/// The lossy cells (and the failover cell): 7.3 only unless named with a
/// kernel or `--kernel` is given.
pub const LOSSY_CELLS: [&str; 5] = [
    "rxe-lossy",
    "smcr-lossy",
    "siw-lossy",
    "smcr-failover",
    "smcr-lossy-4conns",
];

/// The erdma and upstream cells: 7.3 only (erdma's RoCEv2 mode is newer
/// than 6.12).
pub const ERDMA_CELLS: [&str; 14] = [
    "gve",
    "erdma",
    "vhost-erdma",
    "erdma-rxe",
    "erdma-smcr",
    "erdma-rxe-smcr",
    "erdma-netns-shared",
    "erdma-netns-exclusive",
    "erdma-lossy",
    "erdma-smcr-lossy",
    "upstream-rdma",
    "upstream-nic",
    "gve-faults",
    "erdma-faults",
];

/// Cells run when none are named, in run order: the loss-free cells, the
/// lossy ones (not the diagnostic one), the erdma and upstream cells.
pub fn cell_order() -> Vec<&'static str> {
    let lossy = LOSSY_CELLS.iter().filter(|c| !EXTRA_CELLS.contains(c));
    [
        "fabric-pci-1q",
        "fabric-pci-2q",
        "fabric-testdev-1q",
        "fabric-qemu7",
        "rss",
        "rxe",
        "siw",
        "smcr",
        "smc-noueid",
        "vhost-rxe",
        "vhost-siw",
        "uplinks",
        "vxlan",
        "vxlan-rdma",
    ]
    .iter()
    .chain(lossy)
    .chain(&ERDMA_CELLS)
    .copied()
    .collect()
}

/// Diagnostic cells, run only when named.
pub const EXTRA_CELLS: [&str; 2] = ["siw-conn", "smcr-lossy-4conns"];

#[cfg(test)]
mod tests {
    use super::*;

    /// Every cell of the run order exists, and every cell has rows.
    #[test]
    fn the_table_is_whole() {
        let m = cells();
        for c in cell_order().iter().chain(&EXTRA_CELLS) {
            let cell = m.get(*c).unwrap_or_else(|| panic!("no cell {c}"));
            assert!(!cell.tests.is_empty(), "{c}");
        }
    }

    /// A derived cell follows its base: the lossy rxe cell is the rxe
    /// cell's rows without the capture, plus the loss evidence.
    #[test]
    fn derived_cells_follow_their_bases() {
        let m = cells();
        let rxe: Vec<_> = m["rxe"].test_names().filter(|t| *t != "tshark").collect();
        let lossy: Vec<_> = m["rxe-lossy"].test_names().collect();
        assert_eq!(lossy[..lossy.len() - 1], rxe[..]);
        assert_eq!(lossy.last(), Some(&"loss-evidence"));
        assert_eq!(m["rxe-lossy"].faults.len(), 4);
        for c in ["rxe-lossy", "erdma-lossy"] {
            assert!(m[c].env.contains_key("CI_SKIP_PINGPONG"), "{c}");
        }
        assert_eq!(m["erdma-lossy"].faults[0]["port"], "ar");
        assert_eq!(m["erdma"].tests[0], row("erdma-up", BOTH));
        assert_eq!(
            m["erdma-rxe"].tests[..2],
            [
                row("erdma-up", SERVER),
                row("link-add-rxe", &[Role::Client])
            ]
        );
    }

    /// Each fault case is a server row of its cell, and its evidence
    /// patterns compile.
    #[test]
    fn fault_cases_are_server_rows_with_valid_patterns() {
        let m = cells();
        for cell in ["gve-faults", "erdma-faults"] {
            let cases = fault_cases(cell);
            assert!(!cases.is_empty());
            for c in cases {
                let name = format!("fault-{}", c.case);
                assert!(
                    m[cell].tests.contains(&TestRow(name, SERVER.to_vec())),
                    "{}",
                    c.case
                );
                for e in &c.expect {
                    assert!(regex::Regex::new(e).is_ok(), "{}: {e}", c.case);
                }
            }
            assert!(!fault_traces(cell).is_empty());
        }
    }
}

//! The driver bench (issue 25) on the real daemon: `[[device-fault]]` in a
//! config file, a gve port's device trace through the control socket (a
//! vfio-user client's register reads and DMA mappings in the file), and the
//! `ctl device-fault` / `ctl trace` command lines. The fault kinds
//! themselves are gve-device's and erdma-device's tests; the control
//! protocol's round trip on a fake model is in the library's tests.

mod common;

use common::{ctl, daemon_cmd};

use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};
use vhost_rdma::control::{request, Request};
use vhost_rdma::{DaemonConfig, PortConfig, Server};

fn gve_and_virtio(dir: &Path) -> Vec<PortConfig> {
    let mut g = PortConfig::gve("g", dir.join("g.sock"));
    g.queue_pairs = 1;
    vec![g, PortConfig::new("v", dir.join("v.sock"))]
}

#[test]
fn device_fault_tables_in_a_config_file() {
    let cfg = DaemonConfig::from_toml(
        "[[port]]\nname = \"g\"\nsocket = \"/tmp/g.sock\"\nkind = \"gve\"\n\
         [[port]]\nname = \"v\"\nsocket = \"/tmp/v.sock\"\n\
         [[device-fault]]\nport = \"g\"\nkind = \"tx-stall\"\nparams = { queue = 1 }\n\
         [[device-fault]]\nport = \"g\"\nkind = \"adminq-status\"\nparams = { opcode = \"ADD_FLOW_RULE\", status = \"DEADLINE_EXCEEDED\" }\ncount = 2\nprob = 0.5\nseed = 9\nid = 7\n",
    )
    .unwrap();
    assert_eq!(cfg.device_faults.len(), 2);
    let (a, b) = (&cfg.device_faults[0], &cfg.device_faults[1]);
    assert_eq!((a.port.as_str(), a.kind.as_str()), ("g", "tx-stall"));
    assert_eq!(a.params["queue"], "1");
    assert_eq!((a.count, a.id), (None, None));
    assert_eq!(b.params["opcode"], "ADD_FLOW_RULE");
    assert_eq!(b.params["status"], "DEADLINE_EXCEEDED");
    assert_eq!(
        (b.count, b.prob, b.seed, b.id),
        (Some(2), Some(0.5), Some(9), Some(7))
    );
    cfg.validate().unwrap();
    // A table naming a virtio-net port, or no port, is refused with why.
    let mut bad = cfg.clone();
    bad.device_faults[0].port = "v".into();
    assert_eq!(
        bad.validate().unwrap_err().to_string(),
        "[[device-fault]] tx-stall: port v is a virtio-net port: device faults need kind=gve or kind=erdma"
    );
    bad.device_faults[0].port = "nope".into();
    assert_eq!(
        bad.validate().unwrap_err().to_string(),
        "[[device-fault]] tx-stall: no port named \"nope\""
    );
    let e = DaemonConfig::from_toml("[[device-fault]]\nport = \"g\"\nkind = \"x\"\nbogus = 1\n")
        .unwrap_err();
    assert!(format!("{e:#}").contains("unknown field `bogus`"), "{e:#}");
}

/// A rule the model refuses stops the daemon from starting, with the
/// model's reason (the device fault kinds are the model's).
#[test]
fn a_device_fault_the_model_refuses_stops_the_start() {
    let dir = common::TempDir::new("bench-refuse");
    let mut cfg = DaemonConfig {
        ports: gve_and_virtio(dir.path()),
        ..DaemonConfig::default()
    };
    cfg.device_faults
        .push(vhost_rdma::ports::device::bench::DeviceFaultSpec {
            port: "g".into(),
            kind: "no-such-kind".into(),
            ..Default::default()
        });
    let e = Server::start(cfg)
        .err()
        .expect("started with a refused rule");
    let e = format!("{e:#}");
    assert!(
        e.starts_with("[[device-fault]] no-such-kind: port g: "),
        "{e}"
    );
    assert!(!dir.path().join("g.sock").exists(), "socket left behind");
}

#[test]
fn a_gve_trace_file_has_register_reads_and_dma() {
    let dir = common::TempDir::new("bench-trace");
    let ctl = dir.path().join("ctl.sock");
    let server = Server::start(DaemonConfig {
        ports: gve_and_virtio(dir.path()),
        control: Some(ctl.clone()),
        capture_dir: Some(dir.path().join("cap")),
        ..DaemonConfig::default()
    })
    .unwrap();
    let r = request(
        &ctl,
        &Request::TraceStart {
            port: "g".into(),
            file: Some("g.trace".into()),
        },
    )
    .unwrap();
    assert!(r.ok, "{:?}", r.error);
    let mut c = vfio_user::Client::new(&dir.path().join("g.sock")).unwrap();
    let mut b = [0u8; 4];
    c.region_read(0, 0, &mut b).unwrap();
    let ram = memfd(1 << 20);
    c.dma_map(0, 0x1_0000_0000, 1 << 20, ram.as_raw_fd())
        .unwrap();
    let r = request(&ctl, &Request::TraceStop { port: "g".into() }).unwrap();
    let st = r.into_trace().unwrap();
    let text = std::fs::read_to_string(dir.path().join("cap/g.trace")).unwrap();
    assert_eq!(st.written, text.lines().count() as u64, "{text}");
    let kind = |l: &str, k: &str| l.split_whitespace().nth(2) == Some(k);
    assert!(
        text.lines()
            .any(|l| kind(l, "rd") && l.contains("bar0+0x0 ")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| kind(l, "dma") && l.contains("map iova=0x100000000 size=0x100000")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| kind(l, "rd") && l.contains("bar0+0x0 device_status = 0x00000004")),
        "the gVNIC names its registers as the driver does, and its big-endian \
         device_status (link up) reads as the driver's ioread32be sees it: {text}"
    );
    assert!(text.lines().all(|l| l.starts_with("g ")), "{text}");
    drop(c);
    server.shutdown().unwrap();
}

/// A `[[device-fault]]` rule the model takes is installed at start and
/// listed with its counters; `ctl link` on a gve port reaches the device
/// (its `device_status` link bit), and a link-down rule's clear brings it
/// back.
#[test]
fn config_rules_and_link_reach_the_gve_model() {
    let dir = common::TempDir::new("bench-link");
    let ctl = dir.path().join("ctl.sock");
    let mut cfg = DaemonConfig {
        ports: gve_and_virtio(dir.path()),
        control: Some(ctl.clone()),
        ..DaemonConfig::default()
    };
    cfg.device_faults
        .push(vhost_rdma::ports::device::bench::DeviceFaultSpec {
            port: "g".into(),
            kind: "rx-bad-csum".into(),
            params: [("queue".to_string(), "1".to_string())].into(),
            count: Some(3),
            ..Default::default()
        });
    let server = Server::start(cfg).unwrap();
    let r = request(&ctl, &Request::DeviceFaultList).unwrap();
    let ports = r.into_device_faults().unwrap();
    let g = ports.iter().find(|p| p.port == "g").unwrap();
    assert_eq!(g.rules.len(), 1, "{ports:?}");
    let rule = &g.rules[0];
    assert_eq!(
        (rule.kind.as_str(), rule.params.as_str()),
        ("rx-bad-csum", "queue=1")
    );
    assert_eq!((rule.count, rule.hits, rule.spent), (3, 0, false));
    let link_bit = |ctl: &Path| {
        let st = request(ctl, &Request::Status)
            .unwrap()
            .into_status()
            .unwrap();
        let dev = st.devices.iter().find(|d| d.port == "g").unwrap();
        match &dev.detail {
            vhost_rdma::ports::device::DeviceDetail::Gve(s) => {
                s.device_status & gve_device::regs::device_status::LINK != 0
            }
            _ => panic!("not a gve"),
        }
    };
    assert!(link_bit(&ctl), "link up at start");
    let r = request(
        &ctl,
        &Request::Link {
            port: "g".into(),
            up: false,
        },
    )
    .unwrap();
    assert!(r.ok, "{:?}", r.error);
    assert!(!link_bit(&ctl), "ctl link down reached the device");
    let r = request(
        &ctl,
        &Request::Link {
            port: "g".into(),
            up: true,
        },
    )
    .unwrap();
    assert!(r.ok, "{:?}", r.error);
    assert!(link_bit(&ctl), "ctl link up reached the device");
    server.shutdown().unwrap();
}

fn memfd(size: u64) -> std::fs::File {
    // SAFETY: plain syscall with a valid NUL-terminated name.
    let fd = unsafe { libc::memfd_create(c"bench".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: fd is a fresh descriptor we own.
    let f = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    f.set_len(size).unwrap();
    f
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn ctl_device_fault_and_trace_command_lines() {
    let dir = common::TempDir::new("bench-cli");
    let d = dir.path();
    let mut child = daemon_cmd()
        .arg("serve")
        .arg("--port")
        .arg(format!("g={},kind=gve", d.join("g.sock").display()))
        .arg("--port")
        .arg(format!("v={}", d.join("v.sock").display()))
        .arg("--control")
        .arg(d.join("ctl.sock"))
        .arg("--capture-dir")
        .arg(d.join("cap"))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !ctl(d, &["status"]).status.success() {
        assert!(t0.elapsed() < Duration::from_secs(20), "daemon not up");
        std::thread::sleep(Duration::from_millis(50));
    }
    let o = ctl(d, &["device-fault", "list"]);
    let (out, _) = text(&o);
    assert!(o.status.success());
    assert!(out.contains("port g (gve):"), "{out}");
    assert!(out.contains("no device fault rules"), "{out}");
    let o = ctl(
        d,
        &["device-fault", "add", "--port", "v", "--kind", "link-down"],
    );
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        err.trim(),
        "vhost-rdma: error: daemon refused: port v is a virtio-net port: device faults need kind=gve or kind=erdma"
    );
    let o = ctl(
        d,
        &["device-fault", "add", "--port", "g", "--kind", "x", "queue"],
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o).1.contains("\"queue\" is not KEY=VALUE"),
        "{:?}",
        text(&o)
    );
    let o = ctl(d, &["--json", "device-fault", "list"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["device_faults"][0]["port"], "g");
    // A trace into a file, never over it again, then status and show.
    let o = ctl(d, &["trace", "start", "--port", "g", "--file", "t.log"]);
    assert!(o.status.success(), "{:?}", text(&o));
    assert!(text(&o).0.contains("trace: running into"), "{:?}", text(&o));
    let mut c = vfio_user::Client::new(&d.join("g.sock")).unwrap();
    let mut b = [0u8; 4];
    c.region_read(0, 0, &mut b).unwrap();
    let o = ctl(d, &["status"]);
    assert!(text(&o).0.contains("trace: running"), "{:?}", text(&o));
    let o = ctl(d, &["trace", "stop", "--port", "g"]);
    assert!(o.status.success(), "{:?}", text(&o));
    let o = ctl(d, &["trace", "show", "--port", "g"]);
    assert!(
        text(&o)
            .0
            .lines()
            .any(|l| l.starts_with("g ") && l.contains("bar0+0x0")),
        "{:?}",
        text(&o)
    );
    let o = ctl(d, &["trace", "start", "--port", "g", "--file", "t.log"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).1.contains("exists"), "{:?}", text(&o));
    let o = ctl(d, &["trace", "start", "--port", "g", "--file", "/etc/x"]);
    assert!(
        text(&o).1.contains("a trace file is a plain name"),
        "{:?}",
        text(&o)
    );
    let o = ctl(d, &["trace"]);
    assert_eq!(o.status.code(), Some(1));
    drop(c);
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
}

//! Device ports: the daemon serves an emulated gVNIC (`kind=gve`) or erdma
//! function (`kind=erdma`) over vfio-user on the port's socket, next to
//! vhost-user ports, and shuts them down cleanly.

mod common;

use vhost_rdma::config::{PortKind, PortSpec};
use vhost_rdma::{DaemonConfig, PortConfig, Server};

const CONFIG_REGION: u32 = 7; // VFIO_PCI_CONFIG_REGION_INDEX

#[test]
fn gve_port_answers_vfio_user_beside_a_virtio_port() {
    let dir = common::TempDir::new("gve-port");
    let gve = PortConfig::gve("g", dir.path().join("g.sock"));
    assert_eq!(gve.queue_pairs, 2);
    let virtio = PortConfig::new("v", dir.path().join("v.sock"));
    let ctl = dir.path().join("ctl.sock");
    let server = Server::start(DaemonConfig {
        ports: vec![gve, virtio],
        control: Some(ctl.clone()),
        ..DaemonConfig::default()
    })
    .unwrap();
    let mut c = vfio_user::Client::new(&dir.path().join("g.sock")).unwrap();
    let mut id = [0u8; 4];
    c.region_read(CONFIG_REGION, 0, &mut id).unwrap();
    assert_eq!(u32::from_le_bytes(id), 0x0042_1ae0, "gVNIC vendor/device");
    let mut class = [0u8; 4];
    c.region_read(CONFIG_REGION, 8, &mut class).unwrap();
    assert_eq!(
        u32::from_le_bytes(class) >> 8,
        0x020000,
        "Ethernet controller"
    );
    // ctl status shows the device: no driver yet, two queues at most.
    let r = vhost_rdma::control::request(&ctl, &vhost_rdma::control::Request::Status).unwrap();
    let st = r.into_status().unwrap();
    assert_eq!(st.devices.len(), 1);
    assert_eq!(
        (st.devices[0].port.as_str(), st.devices[0].kind.as_str()),
        ("g", "gve")
    );
    let vhost_rdma::ports::device::DeviceDetail::Gve(g) = &st.devices[0].detail else {
        panic!("not a gve status: {:?}", st.devices[0]);
    };
    assert_eq!(g.counters.rx_queues.len(), 2);
    assert!(g.rx_queues.is_empty(), "no queue before a driver");
    // The pump's part: nothing held, no panic, the configured bound.
    let pump = &st.devices[0].pump;
    assert_eq!(
        (
            pump.held_frames,
            pump.held_drops,
            pump.panics,
            pump.held_limit
        ),
        (0, 0, 0, 256)
    );
    let stats = server.stats();
    assert_eq!(stats[0].form, "gve");
    assert_eq!(stats[1].form, "pci");
    drop(c);
    server.shutdown().unwrap();
    assert!(
        !dir.path().join("g.sock").exists(),
        "gve socket left behind"
    );
}

#[test]
fn gve_kind_parses_from_flags_and_file() {
    let p: PortConfig = "g=/tmp/g.sock,kind=gve,queues=4".parse().unwrap();
    assert_eq!((p.kind(), p.queue_pairs), (PortKind::Gve, 4));
    let cfg = DaemonConfig::from_toml(
        "[[port]]\nname = \"g\"\nsocket = \"/tmp/g.sock\"\nkind = \"gve\"\n",
    )
    .unwrap();
    assert_eq!(cfg.ports[0].kind(), PortKind::Gve);
    let e = "g=/tmp/g.sock,kind=nic".parse::<PortConfig>().unwrap_err();
    assert!(format!("{e:#}").contains("unknown port kind"), "{e:#}");
}

/// A gve port's own settings.
fn gve(p: &PortConfig) -> &vhost_rdma::config::GveSpec {
    match &p.spec {
        PortSpec::Gve(g) => g,
        other => panic!("not a gve port: {other:?}"),
    }
}

/// The gve port line of the top-level README, as a new user copies it.
fn readme_gve_port() -> String {
    let readme = include_str!("../../README.md");
    readme
        .split_whitespace()
        .find(|w| w.contains(",kind=gve") && w.contains("g.sock"))
        .expect("README.md shows a --port ...,kind=gve line")
        .to_string()
}

/// A gve port without `queues=` (the README's line) has the documented
/// default of two queues, the least `ncdevmem` runs with ("number of
/// device queues is too low" below two): in its configuration, from the
/// file, and in the `max_tx_queues`/`max_rx_queues` registers the guest's
/// driver sizes its netdev from. An explicit `queues=` still wins, before
/// or after `kind=`, and virtio-net keeps one queue pair.
#[test]
fn gve_port_defaults_to_the_queues_devmem_needs() {
    use vhost_rdma::config::DEFAULT_GVE_QUEUES;
    assert_eq!(DEFAULT_GVE_QUEUES, 2, "docs/ports.md documents 2");

    let line = readme_gve_port();
    assert!(!line.contains("queues="), "README's gve line: {line}");
    let dir = common::TempDir::new("gve-default");
    let spec = line.replace("/run/vhost-rdma/", &format!("{}/", dir.path().display()));
    let p: PortConfig = spec.parse().unwrap();
    assert_eq!(
        (p.kind(), p.queue_pairs),
        (PortKind::Gve, DEFAULT_GVE_QUEUES)
    );

    let file = DaemonConfig::from_toml(
        "[[port]]\nname = \"g\"\nsocket = \"/tmp/g.sock\"\nkind = \"gve\"\n",
    )
    .unwrap();
    assert_eq!(file.ports[0].queue_pairs, DEFAULT_GVE_QUEUES);
    for explicit in [
        "g=/tmp/g.sock,kind=gve,queues=1",
        "g=/tmp/g.sock,queues=1,kind=gve",
    ] {
        let p: PortConfig = explicit.parse().unwrap();
        assert_eq!(p.queue_pairs, 1, "{explicit}");
    }
    let v: PortConfig = "v=/tmp/v.sock".parse().unwrap();
    assert_eq!(v.queue_pairs, 1, "virtio-net keeps one queue pair");

    // The device the guest sees: BAR0's max_tx_queues (0x08) and
    // max_rx_queues (0x0C), big endian.
    let server = Server::start(DaemonConfig {
        ports: vec![p],
        ..DaemonConfig::default()
    })
    .unwrap();
    let mut c = vfio_user::Client::new(&dir.path().join("g.sock")).unwrap();
    let mut reg = |off: u64| {
        let mut b = [0u8; 4];
        c.region_read(0, off, &mut b).unwrap();
        u32::from_be_bytes(b)
    };
    assert_eq!(
        (reg(0x08), reg(0x0C)),
        (2, 2),
        "max_tx_queues, max_rx_queues"
    );
    drop(c);
    server.shutdown().unwrap();
}

/// `rx-held-frames` bounds what a device port holds per device queue: a
/// setting of device ports, from the flag and the file, range-checked.
#[test]
fn rx_held_frames_is_a_device_port_setting() {
    let p: PortConfig = "g=/tmp/g.sock,kind=gve,rx-held-frames=32".parse().unwrap();
    assert_eq!(p.rx_held_frames(), 32);
    let p: PortConfig = "g=/tmp/g.sock,kind=gve".parse().unwrap();
    assert_eq!(
        p.rx_held_frames(),
        vhost_rdma::config::DEFAULT_RX_HELD_FRAMES
    );
    let cfg = DaemonConfig::from_toml(
        "[[port]]\nname = \"r\"\nsocket = \"/tmp/r.sock\"\nkind = \"erdma\"\nnetdev = \"a\"\nrx-held-frames = 0\n",
    )
    .unwrap();
    assert_eq!(cfg.ports[0].rx_held_frames(), 0);
    let e = "v=/tmp/v.sock,rx-held-frames=8"
        .parse::<PortConfig>()
        .unwrap_err();
    assert!(
        format!("{e:#}").contains("kind=gve and kind=erdma"),
        "{e:#}"
    );
    let e = "g=/tmp/g.sock,kind=gve,rx-held-frames=70000"
        .parse::<PortConfig>()
        .unwrap_err();
    assert!(format!("{e:#}").contains("between 0 and 65536"), "{e:#}");
}

#[test]
fn erdma_port_pairs_with_its_netdev() {
    let dir = common::TempDir::new("erdma-port");
    let a = PortConfig::new("a", dir.path().join("a.sock"));
    let r = PortConfig::erdma("r", dir.path().join("r.sock"), "");
    // Without netdev= it cannot know its MAC.
    let e = Server::start(DaemonConfig {
        ports: vec![a.clone(), r.clone()],
        ..DaemonConfig::default()
    })
    .err()
    .expect("erdma without netdev accepted");
    assert!(format!("{e:#}").contains("netdev"), "{e:#}");
    let r = PortConfig::erdma("r", dir.path().join("r.sock"), "a");
    let server = Server::start(DaemonConfig {
        ports: vec![a, r],
        ..DaemonConfig::default()
    })
    .unwrap();
    let st = server.stats();
    assert_eq!(st[1].form, "erdma");
    assert_eq!(st[1].mac, st[0].mac, "the function takes its netdev's MAC");
    let mut c = vfio_user::Client::new(&dir.path().join("r.sock")).unwrap();
    let mut id = [0u8; 4];
    c.region_read(CONFIG_REGION, 0, &mut id).unwrap();
    assert_eq!(u32::from_le_bytes(id), 0x107f_1ded, "erdma vendor/device");
    drop(c);
    server.shutdown().unwrap();
}

/// A hostile driver on a gve port (garbage BAR writes: register values,
/// admin queue and doorbells pointing anywhere, resets) while two
/// virtio-net guests exchange frames: they lose nothing, the daemon does
/// not panic, and the device counts what it refused.
#[test]
fn hostile_gve_driver_leaves_other_ports_alone() {
    use common::packet::tagged_frame;
    use common::{feat, TestFabric, TxOpts, ARRIVE};
    let fab = TestFabric::start_full(
        3,
        |i, dir| {
            let mut p = TestFabric::port_config(dir, i, 1);
            if i == 2 {
                p.spec = PortSpec::Gve(Default::default());
            }
            p
        },
        true,
    );
    let mut a = fab.connect(0, feat::ALL);
    let mut b = fab.connect(1, feat::ALL);
    let sock = fab.socket(2).to_path_buf();
    const WRITES: u64 = 3000;
    let attacker = std::thread::spawn(move || {
        let mut c = vfio_user::Client::new(&sock).unwrap();
        // xorshift: reproducible garbage
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut done = 0u64;
        for _ in 0..WRITES {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let bar = [0u32, 2][(x & 1) as usize];
            let off = ((x >> 8) % 0x1000) & !3;
            let v = (x >> 16) as u32;
            if c.region_write(bar, off, &v.to_le_bytes()).is_ok() {
                done += 1;
            }
        }
        done
    });
    // A sends to B in rounds for as long as the attack lasts (at least 10).
    let (ma, mb) = (fab.mac(0), fab.mac(1));
    let mut rounds = 0u64;
    while rounds < 10 || !attacker.is_finished() {
        let frames: Vec<Vec<u8>> = (0..20)
            .map(|t| tagged_frame(mb, ma, rounds * 20 + t, 600))
            .collect();
        b.post_rx(0, 20, 2048);
        a.send_burst(0, &frames, &TxOpts::default());
        let got = b.recv_n(0, 20, ARRIVE);
        assert_eq!(
            got.len(),
            20,
            "B lost frames in round {rounds} of the attack"
        );
        for (i, r) in got.iter().enumerate() {
            assert!(
                r.data == frames[i],
                "round {rounds}: frame {i} corrupted or out of order"
            );
        }
        a.reap_tx(0);
        rounds += 1;
    }
    let writes = attacker.join().unwrap();
    assert_eq!(
        writes, WRITES,
        "the daemon stopped taking the attacker's writes"
    );
    let r =
        vhost_rdma::control::request(&fab.control_socket(), &vhost_rdma::control::Request::Status)
            .unwrap();
    let st = r.into_status().unwrap();
    let vhost_rdma::ports::device::DeviceDetail::Gve(g) = &st.devices[0].detail else {
        panic!("no gve status");
    };
    let c = &g.counters;
    assert!(
        c.bad_register_accesses + c.bad_doorbells + c.admin_bad_doorbell + c.resets > 0,
        "the device counted nothing of {writes} garbage writes: {c:?}"
    );
}

/// `mtu=` on a gve port is its device descriptor's MTU (the driver's
/// maximum and initial MTU), from the flag and the file, range-checked;
/// on virtio-net ports `mtu=` stays an error (it is an uplink key there).
#[test]
fn gve_mtu_is_a_gve_port_setting() {
    use vhost_rdma::config::{DEFAULT_GVE_MTU, MAX_GVE_MTU};
    let p: PortConfig = "g=/tmp/g.sock,mtu=9000,kind=gve".parse().unwrap();
    assert_eq!(gve(&p).mtu, Some(9000));
    let p: PortConfig = "g=/tmp/g.sock,kind=gve".parse().unwrap();
    assert_eq!(gve(&p).mtu, None);
    assert_eq!(DEFAULT_GVE_MTU, 1500, "docs/ports.md documents 1500");
    let cfg = DaemonConfig::from_toml(
        "[[port]]\nname = \"g\"\nsocket = \"/tmp/g.sock\"\nkind = \"gve\"\nmtu = 4096\n",
    )
    .unwrap();
    assert_eq!(gve(&cfg.ports[0]).mtu, Some(4096));
    for bad in [
        "g=/tmp/g.sock,kind=gve,mtu=67",
        "g=/tmp/g.sock,kind=gve,mtu=9217",
    ] {
        let e = bad.parse::<PortConfig>().unwrap_err();
        assert!(
            format!("{e:#}").contains(&format!("68..={MAX_GVE_MTU}")),
            "{bad}: {e:#}"
        );
    }
    assert!("v=/tmp/v.sock,mtu=9000".parse::<PortConfig>().is_err());
}

/// `gro-hold-us=` on a gve port is its HW-GRO hold time, from the flag and
/// the file, range-checked, and refused on other kinds.
#[test]
fn gro_hold_is_a_gve_port_setting() {
    let p: PortConfig = "g=/tmp/g.sock,kind=gve,gro-hold-us=10000".parse().unwrap();
    assert_eq!(gve(&p).gro_hold_us, Some(10000));
    let p: PortConfig = "g=/tmp/g.sock,kind=gve".parse().unwrap();
    assert_eq!(gve(&p).gro_hold_us, None);
    let cfg = DaemonConfig::from_toml(
        "[[port]]\nname = \"g\"\nsocket = \"/tmp/g.sock\"\nkind = \"gve\"\ngro-hold-us = 0\n",
    )
    .unwrap();
    assert_eq!(gve(&cfg.ports[0]).gro_hold_us, Some(0));
    let e = "g=/tmp/g.sock,kind=gve,gro-hold-us=100001"
        .parse::<PortConfig>()
        .unwrap_err();
    assert!(format!("{e:#}").contains("at most 100000"), "{e:#}");
    let e = "v=/tmp/v.sock,gro-hold-us=5"
        .parse::<PortConfig>()
        .unwrap_err();
    assert!(format!("{e:#}").contains("kind=gve"), "{e:#}");
}

/// `nic-timestamp=on` on a gve port offers the NIC clock; off by default,
/// from the flag and the file, refused on other kinds.
#[test]
fn nic_timestamp_is_a_gve_port_setting() {
    let p: PortConfig = "g=/tmp/g.sock,kind=gve,nic-timestamp=on".parse().unwrap();
    assert!(gve(&p).nic_timestamp);
    let p: PortConfig = "g=/tmp/g.sock,kind=gve".parse().unwrap();
    assert!(!gve(&p).nic_timestamp);
    let cfg = DaemonConfig::from_toml(
        "[[port]]\nname = \"g\"\nsocket = \"/tmp/g.sock\"\nkind = \"gve\"\nnic-timestamp = true\n",
    )
    .unwrap();
    assert!(gve(&cfg.ports[0]).nic_timestamp);
    let e = "g=/tmp/g.sock,kind=gve,nic-timestamp=maybe"
        .parse::<PortConfig>()
        .unwrap_err();
    assert!(format!("{e:#}").contains("on or off"), "{e:#}");
    let e = "v=/tmp/v.sock,nic-timestamp=on"
        .parse::<PortConfig>()
        .unwrap_err();
    assert!(format!("{e:#}").contains("kind=gve"), "{e:#}");
}

//! Probe and control path, as `gve_probe` / `gve_init_priv` /
//! `gve_setup_device_resources` drive it.

mod common;

use common::*;
use gve_device::adminq::{opcode, status};
use gve_device::{layout, regs, GveConfig};
use pci_model::PciDevice;

#[test]
fn pci_identity_bars_and_msix() {
    let g = Guest::new(GveConfig::default());
    let id = g.dev.identity();
    assert_eq!((id.vendor_id, id.device_id), (0x1ae0, 0x0042));
    assert_eq!((id.class_code, id.revision), (0x020000, 1));
    let bars = g.dev.bars();
    assert_eq!(
        bars.iter().map(|b| b.index).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    assert!(bars.iter().all(|b| !b.is_64bit));
    let m = g.dev.msix().unwrap();
    // 4 TX + 4 RX notify blocks + management.
    assert_eq!(m.vectors, 9);
    assert_eq!(m.table_bar, 1);
}

#[test]
fn probe_sequence() {
    let mut g = Guest::new(GveConfig::default());
    // Link is up before the driver looks.
    assert_ne!(
        g.reg_r32(regs::DEVICE_STATUS) & regs::device_status::LINK,
        0
    );
    g.probe();
    let d = g.described.clone();
    assert_eq!(d.mtu, 1500);
    assert_eq!(d.mac, [0x42, 0x01, 0x0a, 0x00, 0x00, 0x02]);
    assert_eq!((d.tx_ring, d.rx_ring), (512, 512));
    assert!(d.counters > 0);
    assert_eq!(d.buffer_sizes, Some((4096, 128)));
    assert_eq!(d.max_flow_rules, Some(64));
    assert_eq!(d.rss, Some((40, 128)));
    assert_eq!(d.modify_ring, Some([4096, 4096, 64, 64]));
    // One distinct interrupt doorbell per notify block.
    assert_eq!(g.num_ntfy, 8);
    let mut dbs = g.irq_db.clone();
    dbs.sort();
    dbs.dedup();
    assert_eq!(dbs.len(), 8);
    // The ptype map knows IPv4/TCP.
    let ptypes: Vec<(u8, u8)> = g.ptype_map.chunks(2).map(|c| (c[0], c[1])).collect();
    assert!(ptypes.contains(&(2, 2)) && ptypes.contains(&(3, 3)));
    let s = g.dev.status();
    assert_eq!(s.driver_version, "GVE-1.0.0");
    assert!(s.resources_configured && s.adminq_ready);
    assert_eq!(s.notify_blocks, 8);
    assert_eq!(s.counters.admin_failed, 0);
    assert_eq!(s.counters.admin_ok, u64::from(g.prod));
}

#[test]
fn probe_without_rss_option_configures_rss() {
    let mut g = Guest::new(GveConfig {
        rss_option: false,
        ..Default::default()
    });
    g.probe();
    assert!(g.described.rss.is_none());
    let s = g.dev.status();
    assert!(s.rss.table_configured);
    assert_eq!(s.rss.key[0], 11);
    assert_eq!(s.rss.hash_types, 0x00d2);
}

#[test]
fn query_rss_matches_driver_layout() {
    let mut g = Guest::new(GveConfig::default());
    g.probe();
    g.open(2, 64, 2048, true);
    let buf = g.alloc(4096, 64);
    let st = g.adminq_cmd(cmd(
        opcode::QUERY_RSS,
        &[&4096u64.to_be_bytes()[..], &buf.to_be_bytes()].concat(),
    ));
    assert_eq!(st, status::PASSED);
    let b = g.read(buf, 8 + 40 + 512);
    // gve_adminq_process_rss_query: total_length must be exact.
    assert_eq!(be32(&b, 0), 8 + 40 + 128 * 4);
    assert_eq!(b[6], 1, "ETH_RSS_HASH_TOP");
    // The default table spreads over the two created queues.
    let lut: Vec<u32> = (0..128).map(|i| be32(&b, 48 + 4 * i)).collect();
    assert!(lut.iter().all(|&q| q < 2) && lut.contains(&1));
    // ethtool -X writes a table; query returns it.
    let table: Vec<u32> = (0..128).map(|i| u32::from(i % 3 == 0)).collect();
    assert_eq!(g.configure_rss(None, Some(&table), 0), status::PASSED);
    g.adminq_cmd(cmd(
        opcode::QUERY_RSS,
        &[&4096u64.to_be_bytes()[..], &buf.to_be_bytes()].concat(),
    ));
    let b = g.read(buf, 8 + 40 + 512);
    let lut: Vec<u32> = (0..128).map(|i| be32(&b, 48 + 4 * i)).collect();
    assert_eq!(lut, table);
}

#[test]
fn optional_commands() {
    let mut g = Guest::new(GveConfig::default());
    g.probe();
    // REPORT_LINK_SPEED writes BE64 Mbps.
    let a = g.alloc(8, 8);
    assert_eq!(
        g.adminq_cmd(cmd(opcode::REPORT_LINK_SPEED, &a.to_be_bytes())),
        status::PASSED
    );
    assert_eq!(g.read(a, 8), 100_000u64.to_be_bytes());
    // SET_DRIVER_PARAMETER MTU.
    let mtu = |v: u64| {
        cmd(
            opcode::SET_DRIVER_PARAMETER,
            &[&1u32.to_be_bytes()[..], &[0; 4], &v.to_be_bytes()].concat(),
        )
    };
    assert_eq!(g.adminq_cmd(mtu(1400)), status::PASSED);
    assert_eq!(g.dev.status().mtu, 1400);
    assert_eq!(g.adminq_cmd(mtu(9000)), status::INVALID_ARGUMENT);
    // QPL and NIC timestamps are not offered.
    assert_eq!(
        g.adminq_cmd(cmd(opcode::REGISTER_PAGE_LIST, &[])),
        status::UNIMPLEMENTED
    );
    assert_eq!(
        g.adminq_cmd(cmd(opcode::REPORT_NIC_TIMESTAMP, &[])),
        status::UNIMPLEMENTED
    );
    // Teardown: detach stats, deconfigure.
    assert_eq!(
        g.adminq_cmd(cmd(opcode::REPORT_STATS, &[0; 24])),
        status::PASSED
    );
    assert_eq!(
        g.adminq_cmd(cmd(opcode::DECONFIGURE_DEVICE_RESOURCES, &[])),
        status::PASSED
    );
    assert!(!g.dev.status().resources_configured);
    assert_eq!(
        g.adminq_cmd(cmd(opcode::DECONFIGURE_DEVICE_RESOURCES, &[])),
        status::FAILED_PRECONDITION
    );
}

#[test]
fn driver_reset_handshake_and_reprobe() {
    let mut g = Guest::new(GveConfig::default());
    g.probe();
    g.open(2, 64, 2048, true);
    // gve_adminq_release: RESET, poll DEVICE_IS_RESET.
    g.reg_w32(regs::DRIVER_STATUS, regs::driver_status::RESET);
    let st = g.reg_r32(regs::DEVICE_STATUS);
    assert_ne!(st & regs::device_status::DEVICE_IS_RESET, 0);
    assert_eq!(g.reg_r32(regs::ADMINQ_EVENT_COUNTER), 0);
    let s = g.dev.status();
    assert!(s.tx_queues.is_empty() && s.rx_queues.is_empty() && !s.resources_configured);
    assert_eq!(s.counters.resets, 1);
    assert!(s.counters.admin_ok > 0, "counters survive reset");
    // gve_reset_recovery: set up again from scratch.
    let mut g2 = Guest {
        tx: Vec::new(),
        rx: Vec::new(),
        ..g
    };
    g2.probe();
    assert_eq!(
        g2.reg_r32(regs::DEVICE_STATUS) & regs::device_status::DEVICE_IS_RESET,
        0
    );
    g2.open(2, 64, 2048, true);
    assert_eq!(g2.dev.status().rx_queues.len(), 2);
}

#[test]
fn legacy_pfn_register() {
    let mut g = Guest::new(GveConfig::default());
    let aq = g.alloc(4096, 4096);
    g.reg_w32(regs::ADMINQ_PFN, (aq >> 12) as u32);
    assert_eq!(g.reg_r32(regs::ADMINQ_PFN), (aq >> 12) as u32);
    g.adminq = aq;
    g.describe();
    g.reg_w32(regs::ADMINQ_PFN, 0);
    assert_eq!(g.reg_r32(regs::ADMINQ_PFN), 0);
    assert_eq!(g.dev.status().counters.resets, 1);
}

#[test]
fn registers_read_at_any_width() {
    let mut g = Guest::new(GveConfig::default());
    let b = g.bar_read(layout::BAR_REGS, regs::MAX_TX_QUEUES, 8);
    assert_eq!(b, [0, 0, 0, 4, 0, 0, 0, 4]);
    let b = g.bar_read(layout::BAR_REGS, regs::MAX_RX_QUEUES + 3, 1);
    assert_eq!(b, [4]);
}

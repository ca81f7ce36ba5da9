//! Control plane: PCI identity, probe handshake, command queue, EQs, CQs,
//! QPs, MRs, GIDs, AHs, doorbell pages.

mod common;

use common::*;
use erdma_device::regs::{self, off};
use pci_model::config::ConfigSpace;
use pci_model::PciDevice;

const MAC: [u8; 6] = [0x02, 0x11, 0x22, 0x33, 0x44, 0x55];

#[test]
fn pci_identity_bars_and_msix() {
    let d = Driver::new(MAC);
    let id = d.dev.identity();
    assert_eq!((id.vendor_id, id.device_id), (0x1ded, 0x107f));
    let bars = d.dev.bars();
    // pci_select_bars(IORESOURCE_MEM) must be exactly BIT(0) | BIT(2).
    let mask: u32 = bars.iter().map(|b| 1u32 << b.index).sum();
    assert_eq!(mask, 0b101);
    let m = d.dev.msix().unwrap();
    assert_eq!(m.vectors, 32);
    assert_eq!(m.table_bar, 2);
    let cs = ConfigSpace::new(id, &bars, Some(m));
    let _ = cs;
}

#[test]
fn probe_handshake_registers() {
    let mut d = Driver::new(MAC);
    assert_eq!(d.read32(off::VERSION), 1);
    assert_eq!(d.read32(off::DEV_PROTO), 1);
    assert_eq!(d.read32(off::DEV_ST), 0);
    // MAC as erdma_ib_device_add reads it (u64_to_ether_addr).
    let mac =
        u64::from(d.read32(off::NETDEV_MAC_L)) | (u64::from(d.read32(off::NETDEV_MAC_H)) << 32);
    let got: Vec<u8> = (0..6).map(|i| (mac >> (40 - 8 * i)) as u8).collect();
    assert_eq!(got, MAC);
    // INIT before the queues are programmed is refused.
    d.write32(off::DEV_CTRL, regs::CTRL_INIT);
    assert_eq!(d.read32(off::DEV_ST) & regs::ST_INIT_DONE, 0);
    assert_eq!(d.dev.counters().init_failures, 1);
    let (cap0, cap1) = d.probe(4);
    assert_eq!(d.dev.counters().inits, 1);
    // Capabilities as erdma_dev_attrs_init decodes them.
    let max_qp = 1024 * ((cap1 >> 16) & 0xfff);
    assert_eq!(max_qp, 1024);
    assert_eq!(1u64 << ((cap0 >> 40) & 0xff), 65536); // max_cqe
    assert_eq!(1u64 << ((cap0 >> 48) & 0xf), 16); // max_gid
    assert_eq!(1u64 << ((cap0 >> 16) & 0xff), 8192); // max_recv_wr
    assert_eq!(1u64 << (cap0 & 0xff), 1 << 32); // max_mr_size
    let flags = (cap0 >> 24) as u8;
    assert_ne!(flags & 0x80, 0, "atomic");
    assert_ne!(flags & 0x08, 0, "extend db");
    assert_eq!((cap1 >> 32) as u32, 0xffff_ff00, "local dma key");
    // 4 CEQs + one interrupt per event-mode command on vector 0.
    let c = d.dev.counters();
    assert_eq!(c.ceqs_live, 4);
    assert!(c.cmd_common_ok >= 6, "{c:?}");
    assert_eq!(c.cmd_rdma_ok, 1);
    assert_eq!(c.cmd_common_failed + c.cmd_rdma_failed, 0);
    // The doorbell-record and depth registers read back.
    assert_eq!(d.read32(off::CMDQ_DEPTH), CMDQ_DEPTH);
    assert_eq!(d.read32(off::AEQ_DEPTH), AEQ_DEPTH);
}

#[test]
fn reset_then_reprobe() {
    let mut d = Driver::new(MAC);
    d.probe(2);
    assert_eq!(d.create_cq(1, 64, 1).status, 0);
    // erdma_hw_reset
    d.write32(off::DEV_CTRL, regs::CTRL_RESET);
    assert_eq!(d.read32(off::DEV_ST), regs::ST_RESET_DONE);
    let c = d.dev.counters();
    assert_eq!((c.cqs_live, c.ceqs_live), (0, 0));
    // A fresh probe works after reset.
    let mut d2 = Driver::new(MAC);
    std::mem::swap(&mut d.dev, &mut d2.dev);
    d2.probe(1);
    assert_eq!(d2.dev.counters().ceqs_live, 1);
}

#[test]
fn cmdq_poll_and_event_modes_and_wrap() {
    let mut d = Driver::new(MAC);
    d.probe(1);
    // 300 commands: the 512-WQEBB SQ (128 commands) and the CQ wrap twice,
    // owner bits flip, each completion raises vector 0.
    for _ in 0..300 {
        let c = d.cmd(1, 2, &[0u8; 8]);
        assert_eq!(c.status, 0);
        assert_eq!(c.r0 as u32, 0x0001_0000);
    }
    let c = d.dev.counters();
    assert!(c.irqs >= 300);
    assert_eq!(c.eq_overflows, 0);
}

#[test]
fn unknown_and_malformed_commands_fail() {
    let mut d = Driver::new(MAC);
    d.probe(1);
    assert_ne!(d.cmd(0, 0x7e, &[0u8; 8]).status, 0);
    assert_ne!(d.cmd(1, 0x33, &[0u8; 8]).status, 0);
    assert_ne!(d.cmd(3, 0, &[0u8; 8]).status, 0);
    // CONF_MTU 0, CREATE_EQ as AEQ type, eqn 0, duplicate eqn.
    assert_ne!(d.cmd(1, 3, &[0u8; 12]).status, 0);
    let mut req = [0u8; 32];
    req[8..16].copy_from_slice(&0x20_0000u64.to_le_bytes());
    req[17] = 9;
    req[19] = 0;
    assert_ne!(d.cmd(1, 0, &req).status, 0);
    req[19] = 1;
    req[17] = 0;
    assert_ne!(d.cmd(1, 0, &req).status, 0);
    req[17] = 1;
    assert_ne!(d.cmd(1, 0, &req).status, 0, "CEQ 1 exists");
    let c = d.dev.counters();
    assert_eq!(c.cmd_unknown, 3);
    assert!(c.cmd_malformed >= 4);
    // The queue still works.
    assert_eq!(d.cmd(1, 2, &[0u8; 8]).status, 0);
}

#[test]
fn conf_mtu_sets_path_mtu_and_get_stats() {
    let mut d = Driver::new(MAC);
    d.probe(1);
    assert_eq!(d.dev.path_mtu(), 1024);
    let mut req = [0u8; 12];
    req[8..12].copy_from_slice(&1500u32.to_le_bytes());
    assert_eq!(d.cmd(1, 3, &req).status, 0);
    assert_eq!(d.dev.path_mtu(), 1024);
    req[8..12].copy_from_slice(&9000u32.to_le_bytes());
    assert_eq!(d.cmd(1, 3, &req).status, 0);
    assert_eq!(d.dev.path_mtu(), 4096);
    // GET_STATS into a 256-byte DMA buffer.
    let buf = d.alloc(256, 256);
    let mut q = [0u8; 28];
    q[16..24].copy_from_slice(&buf.to_le_bytes());
    q[24..28].copy_from_slice(&256u32.to_le_bytes());
    assert_eq!(d.cmd(1, 4, &q).status, 0);
    let r = d.mem_read(buf, 4);
    assert_eq!(u16::from_le_bytes([r[0], r[1]]), 0x5566);
    // Too short a target, or outside memory.
    q[24..28].copy_from_slice(&16u32.to_le_bytes());
    assert_ne!(d.cmd(1, 4, &q).status, 0);
    q[16..24].copy_from_slice(&0xdead_0000_0000u64.to_le_bytes());
    q[24..28].copy_from_slice(&256u32.to_le_bytes());
    assert_ne!(d.cmd(1, 4, &q).status, 0);
    assert!(d.dev.counters().dma_errors >= 1);
}

#[test]
fn cq_qp_lifecycle_and_limits() {
    let mut d = Driver::new(MAC);
    d.probe(2);
    assert_eq!(d.create_cq(1, 256, 1).status, 0);
    assert_eq!(d.create_cq(2, 256, 2).status, 0);
    assert_ne!(d.create_cq(2, 256, 2).status, 0, "duplicate CQN");
    assert_ne!(d.create_cq(0, 256, 1).status, 0, "CQN 0");
    assert_ne!(d.create_cq(5000, 256, 1).status, 0, "CQN out of range");
    assert_ne!(d.create_cq(3, 256, 7).status, 0, "no such CEQ");
    let (c, qp) = d.create_qp(2, false, 1, 64, 64);
    assert_eq!(c.status, 0);
    let qp = qp.unwrap();
    assert_eq!(d.dev.qp_state(2), Some(0));
    assert_ne!(
        d.create_qp(2, false, 1, 64, 64).0.status,
        0,
        "duplicate QPN"
    );
    assert_ne!(
        d.create_qp(1024, false, 1, 64, 64).0.status,
        0,
        "QPN out of range"
    );
    assert_ne!(d.create_qp(3, false, 99, 64, 64).0.status, 0, "no such CQ");
    // QUERY_QP: state RESET.
    let mut q = [0u8; 12];
    q[8..12].copy_from_slice(&2u32.to_le_bytes());
    let r = d.cmd(0, 17, &q);
    assert_eq!(r.status, 0);
    assert_eq!((r.r0 >> 48) & 0xff, 0);
    // CQ 1 is busy while the QP lives.
    let mut dq = [0u8; 12];
    dq[8..12].copy_from_slice(&1u32.to_le_bytes());
    assert_ne!(d.cmd(0, 5, &dq).status, 0);
    let mut dqp = [0u8; 12];
    dqp[8..12].copy_from_slice(&qp.qpn.to_le_bytes());
    assert_eq!(d.cmd(0, 2, &dqp).status, 0);
    assert_ne!(d.cmd(0, 2, &dqp).status, 0, "destroy twice");
    assert_eq!(d.cmd(0, 5, &dq).status, 0);
    assert_eq!(d.dev.counters().cqs_live, 1);
    assert_eq!(d.dev.counters().qps_live, 0);
}

#[test]
fn qp_table_limit_is_an_error_not_growth() {
    let mut cfg = erdma_device::ErdmaConfig::new(MAC);
    cfg.max_live_qps = 4;
    let mut d = Driver::with_config(cfg);
    d.probe(1);
    assert_eq!(d.create_cq(1, 64, 1).status, 0);
    for qpn in 2..6 {
        assert_eq!(d.create_qp(qpn, false, 1, 8, 8).0.status, 0);
    }
    assert_ne!(d.create_qp(6, false, 1, 8, 8).0.status, 0);
    assert_eq!(d.dev.counters().cmd_limit_hit, 1);
}

#[test]
fn modify_qp_to_rts_with_rocev2_av_and_query() {
    let mut d = Driver::new(MAC);
    d.probe(1);
    assert_eq!(d.set_gid(0, v4_gid([10, 0, 0, 1])).status, 0);
    assert_eq!(d.dev.gid(0).unwrap().ntype, 0);
    assert_eq!(d.create_cq(1, 64, 1).status, 0);
    let (_, qp) = d.create_qp(2, false, 1, 64, 64);
    let qp = qp.unwrap();
    let av = AvSpec {
        flow_label: 0x12345,
        tclass: 0x10,
        hop_limit: 64,
        sl: 0,
        udp_sport: 0xc123,
        sgid_index: 0,
        dmac: [0x02, 0, 0, 0, 0, 2],
        dgid: v4_gid([10, 0, 0, 2]),
    };
    // RESET -> RTR is illegal.
    assert_ne!(d.modify_qp(qp.qpn, 2, 1, None, 0, 0, 0, 0).status, 0);
    assert_eq!(d.modify_qp(qp.qpn, 1, 1, None, 0, 0, 0, 0).status, 0);
    // RTR needs an AV for RC.
    assert_ne!(d.modify_qp(qp.qpn, 2, 1, None, 0, 0, 0, 0).status, 0);
    assert_eq!(
        d.modify_qp(qp.qpn, 2, 1 | 4 | 16 | 32, Some(&av), 0x33, 0, 0, 0x200)
            .status,
        0
    );
    assert_eq!(
        d.modify_qp(qp.qpn, 3, 1 | 8, None, 0, 0, 0x100, 0).status,
        0
    );
    assert_eq!(d.dev.qp_state(2), Some(3));
    let mut q = [0u8; 12];
    q[8..12].copy_from_slice(&2u32.to_le_bytes());
    let r = d.cmd(0, 17, &q);
    assert_eq!(r.r0 & 0xff_ffff, 0x100, "sq psn");
    assert_eq!((r.r0 >> 24) & 0xff_ffff, 0x200, "rq psn");
    assert_eq!((r.r0 >> 48) & 0xff, 3, "RTS");
    // An AV naming a GID index past the table is refused.
    let mut bad = av;
    bad.sgid_index = 99;
    assert_ne!(d.modify_qp(qp.qpn, 3, 4, Some(&bad), 0, 0, 0, 0).status, 0);
    // Unknown attribute bits are refused.
    assert_ne!(d.modify_qp(qp.qpn, 3, 0x100, None, 0, 0, 0, 0).status, 0);
}

#[test]
fn gids_and_ahs() {
    let mut d = Driver::new(MAC);
    d.probe(1);
    assert_eq!(d.set_gid(3, v4_gid([192, 168, 1, 5])).status, 0);
    let mut g6 = [0u8; 16];
    g6[0] = 0xfe;
    g6[1] = 0x80;
    g6[15] = 1;
    assert_eq!(d.set_gid(4, g6).status, 0);
    assert_eq!(d.dev.gid(4).unwrap().ntype, 1);
    assert_ne!(d.set_gid(16, g6).status, 0, "past the table");
    // delete
    let mut del = [0u8; 28];
    del[8..12].copy_from_slice(&(3u32 | (1 << 31)).to_le_bytes());
    assert_eq!(d.cmd(0, 14, &del).status, 0);
    assert!(d.dev.gid(3).is_none());
    // CREATE_AH / DESTROY_AH
    let mut ah = [0u8; 52];
    ah[8..12].copy_from_slice(&1u32.to_le_bytes());
    ah[12..16].copy_from_slice(&7u32.to_le_bytes());
    assert_eq!(d.cmd(0, 15, &ah).status, 0);
    assert_ne!(d.cmd(0, 15, &ah).status, 0, "duplicate AHN");
    ah[12..16].copy_from_slice(&(1u32 << 20).to_le_bytes());
    assert_ne!(d.cmd(0, 15, &ah).status, 0, "AHN out of range");
    ah[12..16].copy_from_slice(&7u32.to_le_bytes());
    assert_eq!(d.cmd(0, 16, &ah).status, 0);
    assert_ne!(d.cmd(0, 16, &ah).status, 0);
    assert_eq!(d.dev.counters().ahs_live, 0);
}

#[test]
fn reg_mr_levels_and_dereg() {
    let mut d = Driver::new(MAC);
    d.probe(1);
    let pages: Vec<u64> = (0..3).map(|_| d.alloc(4096, 4096)).collect();
    // Level 0: three inline pages.
    assert_eq!(
        d.reg_mr(0x100, 1, 0x7000_0000, 3 * 4096, &pages, 0x1e, false)
            .status,
        0
    );
    // Level 1: eight pages in an MTT buffer.
    let pages8: Vec<u64> = (0..8).map(|_| d.alloc(4096, 4096)).collect();
    assert_eq!(
        d.reg_mr(0x200, 1, 0x8000_0000, 8 * 4096, &pages8, 0x1e, false)
            .status,
        0
    );
    // Same MPT index again.
    assert_ne!(d.reg_mr(0x200, 1, 0, 4096, &pages[..1], 0, false).status, 0);
    // Length beyond the pages given.
    assert_ne!(d.reg_mr(0x300, 1, 0, 5 * 4096, &pages, 0, false).status, 0);
    // DMA MR (type 2, valid bit clear, as erdma_get_dma_mr sends it).
    let mut req = [0u8; 64];
    let cfg0 = 4u32; // mpt 4, key 0, valid 0
    let cfg1 = (1u32 << 12) | (2 << 6) | (0x1e << 1);
    req[8..12].copy_from_slice(&cfg0.to_le_bytes());
    req[12..16].copy_from_slice(&cfg1.to_le_bytes());
    assert_eq!(d.cmd(0, 8, &req).status, 0);
    assert_eq!(d.dev.counters().mrs_live, 3);
    let mut dr = [0u8; 12];
    dr[8..12].copy_from_slice(&2u32.to_le_bytes()); // mpt 2 (stag 0x200)
    assert_eq!(d.cmd(0, 9, &dr).status, 0);
    assert_ne!(d.cmd(0, 9, &dr).status, 0);
    assert_eq!(d.dev.counters().mrs_live, 2);
}

#[test]
fn reg_mr_level2_scattered_mtt() {
    let mut d = Driver::new(MAC);
    d.probe(1);
    // 600 pages: a level-1 table of two 4 KiB pages, pointed to by a level-2 page.
    let data = d.alloc(600 * 4096, 4096);
    let l1a = d.alloc(4096, 4096);
    let l1b = d.alloc(4096, 4096);
    let top = d.alloc(4096, 4096);
    for i in 0..600u64 {
        let t = if i < 512 {
            l1a + 8 * i
        } else {
            l1b + 8 * (i - 512)
        };
        d.mem_write(t, &(data + 4096 * i).to_le_bytes());
    }
    d.mem_write(top, &l1a.to_le_bytes());
    d.mem_write(top + 8, &l1b.to_le_bytes());
    let mut req = [0u8; 64];
    let cfg0 = (1u32 << 31) | (1 << 28) | 5; // valid, version 1, mpt 5
    let cfg1 = (1u32 << 12) | (0x1e << 1);
    let cfg2 = (12u32 << 27) | (2 << 20) | 600; // level 2, MTT page 4K
    req[8..12].copy_from_slice(&cfg0.to_le_bytes());
    req[12..16].copy_from_slice(&cfg1.to_le_bytes());
    req[16..24].copy_from_slice(&0x4000_0000u64.to_le_bytes());
    req[24..28].copy_from_slice(&(600u32 * 4096).to_le_bytes());
    req[28..32].copy_from_slice(&cfg2.to_le_bytes());
    req[32..40].copy_from_slice(&top.to_le_bytes());
    assert_eq!(d.cmd(0, 8, &req).status, 0);
}

#[test]
fn alloc_free_db_pages_and_user_doorbells() {
    let mut d = Driver::new(MAC);
    d.probe(1);
    let mut req = [0u8; 32];
    req[8..12].copy_from_slice(&7u32.to_le_bytes());
    let r = d.cmd(1, 8, &req);
    assert_eq!(r.status, 0);
    let sdb = (r.r0 & 0xffff) as u16;
    let rdb = (r.r0 >> 48) as u16;
    let cdb = ((r.r0 >> 32) & 0xffff) as u16;
    assert!(u64::from(sdb) << 12 >= regs::DB_POOL_START);
    assert_ne!(rdb, cdb);
    // A user CQ doorbell on the page the driver maps as its CQ page
    // (the RDB field, alloc_db_resources swaps them) reaches CQ 1.
    assert_eq!(d.create_cq(1, 64, 1).status, 0);
    let before = d.dev.counters().bad_doorbells;
    let v = (1u64 << 32) | (1 << 31);
    d.write64((u64::from(rdb) << 12) + 8, v);
    assert_eq!(d.dev.counters().bad_doorbells, before);
    // FREE_DB with the same triple.
    let mut f = [0u8; 32];
    f[8..12].copy_from_slice(&7u32.to_le_bytes());
    f[12..14].copy_from_slice(&rdb.to_le_bytes());
    f[14..16].copy_from_slice(&sdb.to_le_bytes());
    f[18..20].copy_from_slice(&cdb.to_le_bytes());
    assert_eq!(d.cmd(1, 9, &f).status, 0);
    assert_ne!(d.cmd(1, 9, &f).status, 0);
    // The page is no doorbell any more.
    d.write64((u64::from(rdb) << 12) + 8, v);
    assert_eq!(d.dev.counters().bad_doorbells, before + 1);
}

#[test]
fn split_64bit_doorbell_writes_are_joined() {
    let mut d = Driver::new(MAC);
    d.probe(1);
    // A cmdq doorbell written as two dwords (low then high).
    let mut slot = [0u8; 128];
    let pi = d.sq_pi.wrapping_add(4);
    let hdr = (1u64 << 24) | (2u64 << 16) | u64::from(pi) | (3u64 << 52);
    slot[..8].copy_from_slice(&hdr.to_le_bytes());
    let a = d.sq.addr + u64::from(u32::from(d.sq_pi) & (d.sq.depth - 1)) * 32;
    d.mem_write(a, &slot);
    d.sq_pi = pi;
    d.write32(off::CMDQ_SQDB, u32::from(pi));
    d.write32(off::CMDQ_SQDB + 4, 0);
    d.poll();
    assert!(d.irqs.contains(&0));
}

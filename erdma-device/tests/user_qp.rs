//! Userspace-style objects (rdma-core providers/erdma): extended doorbell
//! pages, QP/CQ rings described by page lists (MTT level 0 with several
//! entries, level 1), doorbells at per-QP/CQ offsets, QP fatal events.

mod common;

use common::*;
use erdma_device::wqe::op;
use roce_model::RoceFrame;

const MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0d];

struct Ctx {
    sdb: u64,
    rdb: u64,
    cdb: u64,
}

/// alloc_db_resources with its RDB/CDB swap.
fn alloc_ctx(d: &mut Driver) -> Ctx {
    let mut req = [0u8; 32];
    req[8..12].copy_from_slice(&7u32.to_le_bytes());
    let r = d.cmd(1, 8, &req);
    assert_eq!(r.status, 0);
    let sdb_off = r.r0 & 0xffff;
    let rdb_off = r.r0 >> 48;
    let cdb_off = (r.r0 >> 32) & 0xffff;
    Ctx {
        sdb: sdb_off << 12,
        cdb: rdb_off << 12,
        rdb: cdb_off << 12,
    }
}

/// A user CQ of `depth` entries on one 4 KiB page (MTT level 0).
fn user_cq(d: &mut Driver, cqn: u32, depth: u32) {
    let page = d.alloc(4096, 4096);
    let dbrec = d.alloc(8, 8);
    let mut req = [0u8; 40];
    let cfg0 = cqn | (depth.trailing_zeros() << 24); // page size 4K
    let cfg1: u32 = 1 | (1 << 16) | (1 << 11); // eqn 1, cnt 1, level 0, ext db
    req[8..12].copy_from_slice(&cfg0.to_le_bytes());
    req[12..16].copy_from_slice(&(page as u32).to_le_bytes());
    req[16..20].copy_from_slice(&((page >> 32) as u32).to_le_bytes());
    req[20..24].copy_from_slice(&cfg1.to_le_bytes());
    req[24..32].copy_from_slice(&dbrec.to_le_bytes());
    assert_eq!(d.cmd(0, 4, &req).status, 0);
    d.cqs.insert(
        cqn,
        Ring {
            addr: page,
            depth,
            ci: 0,
            dbrec,
        },
    );
}

/// A user QP: SQ on `sq_pages` (level 0, up to 4 pages) or an MTT (level 1).
fn user_qp(
    d: &mut Driver,
    qpn: u32,
    cqn: u32,
    sq_pages: &[u64],
    sq_level1: bool,
    rq_page: u64,
) -> u8 {
    let sq_size = (sq_pages.len() as u32 * 4096) / 32;
    let mut req = [0u8; 120];
    req[8..12].copy_from_slice(&(qpn | (sq_size.trailing_zeros() << 20)).to_le_bytes());
    req[12..16].copy_from_slice(&(1u32 | (6 << 20)).to_le_bytes()); // 64 RQEs
    req[16..20].copy_from_slice(&cqn.to_le_bytes()); // page size 4K
    req[20..24].copy_from_slice(&cqn.to_le_bytes());
    let n = sq_pages.len() as u32;
    if sq_level1 {
        let tbl = d.alloc(8 * u64::from(n), 64);
        for (i, p) in sq_pages.iter().enumerate() {
            d.mem_write(tbl + 8 * i as u64, &p.to_le_bytes());
        }
        req[24..32].copy_from_slice(&tbl.to_le_bytes());
        req[40..44].copy_from_slice(&((n << 1) | 1).to_le_bytes());
    } else {
        req[24..32].copy_from_slice(&sq_pages[0].to_le_bytes());
        for (i, p) in sq_pages.iter().skip(1).enumerate() {
            req[64 + 8 * i..72 + 8 * i].copy_from_slice(&p.to_le_bytes());
        }
        req[40..44].copy_from_slice(&(n << 1).to_le_bytes());
    }
    req[32..40].copy_from_slice(&rq_page.to_le_bytes());
    req[44..48].copy_from_slice(&(1u32 << 1).to_le_bytes());
    let dbrec = d.alloc(16, 64);
    req[48..56].copy_from_slice(&dbrec.to_le_bytes());
    req[56..64].copy_from_slice(&(dbrec + 8).to_le_bytes());
    d.cmd(0, 1, &req).status
}

fn to_rts(d: &mut Driver, qpn: u32) {
    let av = AvSpec {
        flow_label: 0,
        tclass: 0,
        hop_limit: 64,
        sl: 0,
        udp_sport: 0xd000,
        sgid_index: 0,
        dmac: [2, 0, 0, 0, 0, 1],
        dgid: v4_gid([10, 0, 0, 1]),
    };
    assert_eq!(d.modify_qp(qpn, 1, 1, None, 0, 0, 0, 0).status, 0);
    assert_eq!(
        d.modify_qp(qpn, 2, 1 | 4 | 32, Some(&av), 77, 0, 0, 0)
            .status,
        0
    );
    assert_eq!(d.modify_qp(qpn, 3, 1, None, 0, 0, 0, 0).status, 0);
}

/// Writes a zero-length SEND of `cnt` WQEBBs at WQEBB `idx` of a paged SQ.
fn put_send(d: &mut Driver, pages: &[u64], qpn: u32, idx: u16, cnt: u16, ce: bool) {
    let mut s = [0u8; 32];
    let hdr = sqe_hdr(op::SEND, 0, ce, false)
        | (u64::from(qpn) << 32)
        | (u64::from(cnt - 1) << 52)
        | u64::from(idx + cnt);
    s[..8].copy_from_slice(&hdr.to_le_bytes());
    let off = u64::from(idx) * 32;
    d.mem_write(pages[(off / 4096) as usize] + off % 4096, &s);
}

#[test]
fn user_qp_on_scattered_pages_with_extended_doorbells() {
    let mut d = Driver::new(MAC);
    d.probe(1);
    assert_eq!(d.set_gid(0, v4_gid([10, 0, 0, 5])).status, 0);
    let ctx = alloc_ctx(&mut d);
    user_cq(&mut d, 3, 128);
    // Two non-adjacent SQ pages (256 WQEBBs), level 0.
    let p0 = d.alloc(4096, 4096);
    let _gap = d.alloc(4096, 4096);
    let p1 = d.alloc(4096, 4096);
    let rq = d.alloc(4096, 4096);
    assert_eq!(user_qp(&mut d, 9, 3, &[p0, p1], false, rq), 0);
    to_rts(&mut d, 9);
    // 70 SENDs of two WQEBBs each: the last six live in the second page.
    for i in 0..70u16 {
        put_send(&mut d, &[p0, p1], 9, 2 * i, 2, i == 69);
    }
    let v = (9u64 << 32) | 140;
    d.write64(ctx.sdb + (9 & 31) * 128, v);
    for _ in 0..4 {
        d.poll();
    }
    assert_eq!(d.tx.len(), 70);
    let last = RoceFrame::parse(&d.tx[69]).unwrap();
    assert_eq!(last.packet.bth.dest_qp, 77);
    assert_eq!(last.packet.bth.psn, 69);
    assert_eq!(d.dev.counters().wqes_executed, 70);
    // The CQE arrives after the peer ACKs; flush instead: move to ERROR.
    // A receive posted through the user RQ doorbell page is flushed.
    let mut rqe = [0u8; 32];
    rqe[0..2].copy_from_slice(&1u16.to_le_bytes());
    rqe[4..8].copy_from_slice(&9u32.to_le_bytes());
    d.mem_write(rq, &rqe);
    d.write64(
        ctx.rdb + (9 & 127) * 32,
        u64::from_le_bytes(rqe[..8].try_into().unwrap()),
    );
    assert_eq!(d.modify_qp(9, 6, 1, None, 0, 0, 0, 0).status, 0);
    d.poll();
    let mut n = 0;
    let mut max_sq_idx = 0;
    while let Some(wc) = d.poll_cq(3) {
        assert_eq!(wc.syndrome, 15);
        if wc.qtype == 0 {
            max_sq_idx = max_sq_idx.max(wc.qe_idx);
        }
        n += 1;
    }
    assert_eq!(n, 71, "70 in-flight SENDs and one receive flushed");
    assert_eq!(max_sq_idx, 138);
    // CQ doorbell through the user CQ page arms CQ 3 (no bad doorbells).
    let before = d.dev.counters().bad_doorbells;
    d.write64(ctx.cdb + (3 & 511) * 8, (3u64 << 32) | (1 << 31) | 71);
    assert_eq!(d.dev.counters().bad_doorbells, before);
}

#[test]
fn user_qp_level1_mtt_and_qp_fatal_on_unreachable_page() {
    let mut d = Driver::new(MAC);
    d.probe(1);
    assert_eq!(d.set_gid(0, v4_gid([10, 0, 0, 5])).status, 0);
    let ctx = alloc_ctx(&mut d);
    user_cq(&mut d, 3, 128);
    let rq = d.alloc(4096, 4096);
    // Level-1 SQ of four pages; the third page is outside guest memory
    // (first and last pages are fine, so CREATE_QP's probe accepts it).
    let pages = [
        d.alloc(4096, 4096),
        d.alloc(4096, 4096),
        0x6000_0000_0000,
        d.alloc(4096, 4096),
    ];
    assert_eq!(user_qp(&mut d, 10, 3, &pages, true, rq), 0);
    to_rts(&mut d, 10);
    for i in 0..256u16 {
        put_send(&mut d, &pages, 10, i, 1, false);
    }
    d.write64(ctx.sdb + (10 & 31) * 128, (10u64 << 32) | 300);
    for _ in 0..4 {
        d.poll();
    }
    // The 256 SENDs of pages 0 and 1 were taken, then the unreachable page
    // stops the QP with a fatal event.
    assert_eq!(d.dev.counters().wqes_executed, 256);
    assert_eq!(d.dev.counters().bad_wqes, 0);
    let aes = d.drain_aeq();
    assert!(aes.contains(&(0, 10)), "QP_FATAL for QP 10: {aes:?}");
    assert_eq!(d.dev.qp_state(10), Some(6));
    assert!(d.dev.counters().dma_errors >= 1);
}

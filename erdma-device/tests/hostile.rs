//! Hostile drivers: bad addresses, out-of-range objects, floods, garbage.
//! Everything must end in an error status or counter, never a panic.

mod common;

use common::*;
use erdma_device::regs::{self, off};
use erdma_device::wqe::op;
use pci_model::PciDevice;

const MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0c];

fn ready() -> Driver {
    let mut d = Driver::new(MAC);
    d.probe(2);
    assert_eq!(d.set_gid(0, v4_gid([10, 0, 0, 9])).status, 0);
    assert_eq!(d.create_cq(1, 64, 1).status, 0);
    d
}

#[test]
fn reg_mr_with_bad_mtt_addresses() {
    let mut d = ready();
    let before = d.dev.counters().dma_errors;
    // Level 0 with a page outside guest memory.
    assert_ne!(
        d.reg_mr(0x100, 1, 0, 4096, &[0xdead_0000_0000], 0x1e, false)
            .status,
        0
    );
    // Level 1 whose MTT buffer is outside guest memory.
    let mut req = [0u8; 64];
    req[8..12].copy_from_slice(&((1u32 << 31) | 2).to_le_bytes());
    req[12..16].copy_from_slice(&(1u32 << 12).to_le_bytes());
    req[24..28].copy_from_slice(&(64u32 * 4096).to_le_bytes());
    req[28..32].copy_from_slice(&((12u32 << 27) | (1 << 20) | 64).to_le_bytes());
    req[32..40].copy_from_slice(&0xffff_ffff_ffff_f000u64.to_le_bytes());
    assert_ne!(d.cmd(0, 8, &req).status, 0);
    // Level 1 table straddling the end of memory.
    let end = MEM_BASE + MEM_SIZE as u64 - 16;
    req[32..40].copy_from_slice(&end.to_le_bytes());
    assert_ne!(d.cmd(0, 8, &req).status, 0);
    // Level 3 with more top entries than a page, level 4, MTT count too big.
    let mut r2 = req;
    r2[28..32].copy_from_slice(&((12u32 << 27) | (3 << 20) | 0xf_ffff).to_le_bytes());
    assert_ne!(d.cmd(0, 8, &r2).status, 0);
    // Page size 2^3.
    r2[28..32].copy_from_slice(&((3u32 << 27) | 1).to_le_bytes());
    assert_ne!(d.cmd(0, 8, &r2).status, 0);
    // MPT index past the table.
    assert_ne!(
        d.reg_mr(0x0fff_ff00, 1, 0, 4096, &[MEM_BASE], 0x1e, false)
            .status,
        0
    );
    let c = d.dev.counters();
    assert!(c.dma_errors >= before + 3, "{c:?}");
    assert_eq!(c.mrs_live, 0);
}

#[test]
fn mr_past_memory_fails_at_use_with_error_cqe() {
    let mut d = ready();
    // A level-1 MR whose second page is outside guest memory: registration
    // only probes the table, so the bad page is found when a WQE uses it.
    let good = d.alloc(4096, 4096);
    assert_eq!(
        d.reg_mr(
            0x100,
            1,
            0x1000_0000,
            2 * 4096,
            &[good, 0x7fff_0000_0000],
            0x1e,
            true
        )
        .status,
        0
    );
    let mut qp = rts_qp(&mut d);
    let mut s = vec![0u8; 32];
    s[..8].copy_from_slice(&sqe_hdr(op::SEND, 1, true, false).to_le_bytes());
    s[12..16].copy_from_slice(&8192u32.to_le_bytes());
    s[16..24].copy_from_slice(&0x1000_0000u64.to_le_bytes());
    s[24..28].copy_from_slice(&8192u32.to_le_bytes());
    s[28..32].copy_from_slice(&0x100u32.to_le_bytes());
    d.post_sqe(&mut qp, s);
    // A WQE past the MR end, with an unknown key, and with the wrong key byte.
    for (len, key) in [(9000u32, 0x100u32), (8, 0x900), (8, 0x1ff)] {
        let mut s = vec![0u8; 32];
        s[..8].copy_from_slice(&sqe_hdr(op::SEND, 1, true, false).to_le_bytes());
        s[16..24].copy_from_slice(&0x1000_0000u64.to_le_bytes());
        s[24..28].copy_from_slice(&len.to_le_bytes());
        s[28..32].copy_from_slice(&key.to_le_bytes());
        d.post_sqe(&mut qp, s);
    }
    d.poll();
    let wc = d.poll_cq(1).unwrap();
    assert_eq!(wc.syndrome, 11, "address violation");
    // The QP is in error: the rest is flushed.
    for _ in 0..3 {
        assert_eq!(d.poll_cq(1).unwrap().syndrome, 15);
    }
    // Payload is read from guest memory packet by packet, as hardware does:
    // what the first page held may have gone out (path MTU 1024: 4 packets),
    // nothing after the bad page and nothing of the later WQEs.
    assert!(d.tx.len() <= 4, "{} frames sent", d.tx.len());
    assert!(d.dev.counters().dma_errors >= 1);
    assert_eq!(d.dev.qp_state(2), Some(6));
}

/// The address vector of the peer these tests' QP 2 talks to (QPN 3 at
/// 10.0.0.1).
fn peer_av() -> AvSpec {
    AvSpec {
        flow_label: 0,
        tclass: 0,
        hop_limit: 64,
        sl: 0,
        udp_sport: 1,
        sgid_index: 0,
        dmac: [2, 0, 0, 0, 0, 1],
        dgid: v4_gid([10, 0, 0, 1]),
    }
}

/// QP 2 (PD 1, CQ 1) in RTS towards 10.0.0.1.
fn rts_qp(d: &mut Driver) -> KQp {
    rts_qp_with_sq(d, 64)
}

/// [`rts_qp`] with an SQ of `sq` WQEBBs.
fn rts_qp_with_sq(d: &mut Driver, sq: u32) -> KQp {
    let (_, qp) = d.create_qp(2, false, 1, sq, 64);
    let qp = qp.unwrap();
    let av = peer_av();
    assert_eq!(d.modify_qp(2, 1, 1, None, 0, 0, 0, 0).status, 0);
    assert_eq!(
        d.modify_qp(2, 2, 1 | 4 | 32, Some(&av), 3, 0, 0, 0).status,
        0
    );
    assert_eq!(d.modify_qp(2, 3, 1, None, 0, 0, 0, 0).status, 0);
    qp
}

/// A SEND of `len` bytes gathered from `[va, va + len)` through `lkey`.
fn send_from(d: &mut Driver, qp: &mut KQp, va: u64, len: u32, lkey: u32) {
    let mut s = vec![0u8; 32];
    s[..8].copy_from_slice(&sqe_hdr(op::SEND, 1, true, false).to_le_bytes());
    s[12..16].copy_from_slice(&len.to_le_bytes());
    s[16..24].copy_from_slice(&va.to_le_bytes());
    s[24..28].copy_from_slice(&len.to_le_bytes());
    s[28..32].copy_from_slice(&lkey.to_le_bytes());
    d.post_sqe(qp, s);
    d.poll();
}

/// Issue 24 (2): REG_MR took a range wrapping past 2^64, and a WQE reading
/// through it overflowed in `MemRegion::for_each_piece` (a panic with
/// overflow checks, as here in the debug test profile).
#[test]
fn reg_mr_range_wrapping_past_2_64_is_refused() {
    let mut d = ready();
    let mut qp = rts_qp(&mut d);
    let pages = [d.alloc(4096, 4096), d.alloc(4096, 4096)];
    let va = u64::MAX - 4095; // last page of the address space
    let reg = d.reg_mr(0x100, 1, va, 8192, &pages, 0x1e, false).status;
    // The access comes first: before the fix it panicked right here.
    send_from(&mut d, &mut qp, va, 8192, 0x100);
    assert_eq!(reg, 1, "REG_MR of a wrapping range: INVALID");
    let wc = d.poll_cq(1).expect("a completion for the SEND");
    assert_eq!(wc.syndrome, 10, "no such MR: send stag invalid");
    assert!(d.tx.is_empty());
    assert_eq!(d.dev.counters().mrs_live, 0);
}

/// The same range set by a fast-register WQE (an FRMR, erdma_map_mr_sg):
/// the MR allows no access, and using it is an error completion, not an
/// overflow.
#[test]
fn fast_registered_mr_wrapping_past_2_64_allows_no_access() {
    let mut d = ready();
    let mut qp = rts_qp(&mut d);
    // erdma_ib_alloc_mr: an invalid FRMR with an MTT buffer.
    let mtt = d.alloc(8 * 8, 64);
    let mut req = [0u8; 64];
    req[8..12].copy_from_slice(&0x30u32.to_le_bytes());
    let cfg1 = (1u32 << 12) | (1 << 6) | (0x1e << 1);
    req[12..16].copy_from_slice(&cfg1.to_le_bytes());
    req[28..32].copy_from_slice(&((12u32 << 27) | (1 << 20) | 8).to_le_bytes());
    req[32..40].copy_from_slice(&mtt.to_le_bytes());
    assert_eq!(d.cmd(0, 8, &req).status, 0);
    let pages = [d.alloc(4096, 4096), d.alloc(4096, 4096)];
    let va = u64::MAX - 4095;
    let mut s = vec![0u8; 64];
    s[..8].copy_from_slice(&sqe_hdr(op::REG_MR, 0, true, false).to_le_bytes());
    s[8..16].copy_from_slice(&va.to_le_bytes());
    s[16..20].copy_from_slice(&8192u32.to_le_bytes());
    s[20..24].copy_from_slice(&0x3007u32.to_le_bytes());
    s[24..28].copy_from_slice(&((0x1eu32 << 1) | (2 << 12)).to_le_bytes());
    s[32..40].copy_from_slice(&pages[0].to_le_bytes());
    s[40..48].copy_from_slice(&pages[1].to_le_bytes());
    d.post_sqe(&mut qp, s);
    d.poll();
    let _ = d.poll_cq(1).expect("fast-register completion");
    send_from(&mut d, &mut qp, va, 8192, 0x3007);
    let wc = d.poll_cq(1).expect("a completion for the SEND");
    assert_ne!(wc.syndrome, 0, "no access through a wrapping MR");
    assert!(d.tx.is_empty());
}

#[test]
fn out_of_range_qpn_cqn_in_doorbells() {
    let mut d = ready();
    let before = d.dev.counters().bad_doorbells;
    // SQ doorbell for a QP that does not exist, RQ likewise, CQ likewise.
    d.write64(regs::SDB_SHARED_PAGE_INDEX << 12, (999u64 << 32) | 5);
    d.write64(regs::RQDB_SPACE, (0xfffffu64 << 32) | 1);
    d.write64(regs::CQDB_SPACE, (0xff_ffffu64 << 32) | (1 << 31));
    // EQ doorbell of a CEQ never created; doorbell in the registers page.
    d.write64(off::CEQ_DB_BASE + 8 * 30, 1 << 31);
    d.write64(0x800, 1);
    d.poll();
    let c = d.dev.counters();
    assert_eq!(c.bad_doorbells, before + 4);
    assert!(c.bad_bar_writes >= 1);
}

#[test]
fn sq_producer_index_beyond_ring_is_refused() {
    let mut d = ready();
    let (_, qp) = d.create_qp(2, false, 1, 16, 16);
    let qp = qp.unwrap();
    assert_eq!(d.modify_qp(2, 1, 1, None, 0, 0, 0, 0).status, 0);
    let before = d.dev.counters().bad_doorbells;
    d.write64(
        regs::SDB_SHARED_PAGE_INDEX << 12,
        (u64::from(qp.qpn) << 32) | 1000,
    );
    d.write64(regs::RQDB_SPACE, (u64::from(qp.qpn) << 32) | 1000);
    d.poll();
    d.poll();
    let c = d.dev.counters();
    assert_eq!(c.bad_doorbells, before + 2);
    assert_eq!(c.wqes_executed, 0);
}

/// Issue 24 (1): a CMDQ SQ doorbell whose PI cuts a command, is more than
/// the ring ahead, or lies behind the CI used to replay stale commands for
/// ever (the CI, stepping 4 WQEBBs at a time, never landed on the PI) and
/// kept `poll` asking to run: one register write spun the port's pump.
#[test]
fn cmdq_doorbell_off_boundary_or_beyond_ring_is_refused() {
    let mut d = ready();
    // A well-formed QUERY_FW_INFO at the driver's PI, as erdma_post_cmd
    // writes it; only the doorbells below are wrong.
    let write_cmd = |d: &mut Driver, wqebbs: u64| {
        let start = d.sq_pi;
        let hdr = (1u64 << 24)
            | (2u64 << 16)
            | u64::from(start.wrapping_add(4))
            | (7u64 << 32)
            | ((wqebbs - 1) << 52);
        let mut slot = [0u8; 128];
        slot[..8].copy_from_slice(&hdr.to_le_bytes());
        let a = d.sq.addr + u64::from(u32::from(start) & (d.sq.depth - 1)) * 32;
        d.mem_write(a, &slot);
    };
    let pi = d.sq_pi;
    let bad_pis = [
        (4, pi.wrapping_add(1)),                     // mid-command
        (4, pi.wrapping_add(6)),                     // one command and a half
        (4, pi.wrapping_add(CMDQ_DEPTH as u16 + 4)), // more than the ring ahead
        (4, pi.wrapping_sub(4)),                     // behind the CI
        (8, pi.wrapping_add(4)),                     // the header claims 8 WQEBBs
    ];
    for (wqebbs, bad_pi) in bad_pis {
        write_cmd(&mut d, wqebbs);
        let before = d.dev.counters();
        d.write64(off::CMDQ_SQDB, u64::from(bad_pi));
        d.poll();
        // The device does not ask to be polled again at once (the spin)...
        let t = d.dev.next_timeout(d.now);
        assert!(
            t.is_none_or(|t| t > d.now),
            "PI {bad_pi}: next_timeout {t:?}"
        );
        // ... nothing stale (or half a command) was executed or completed...
        let c = d.dev.counters();
        assert_eq!(c.cmd_cqes_written, before.cmd_cqes_written, "PI {bad_pi}");
        assert_eq!(c.cmd_common_ok, before.cmd_common_ok, "PI {bad_pi}");
        assert_eq!(c.cmd_rdma_ok, before.cmd_rdma_ok, "PI {bad_pi}");
        // ... and the doorbell was counted as bad.
        assert_eq!(c.bad_doorbells, before.bad_doorbells + 1, "PI {bad_pi}");
        for _ in 0..3 {
            d.poll();
        }
        assert_eq!(d.dev.counters(), c, "PI {bad_pi}: nothing replayed");
    }
    // The queue goes on from where the device stopped: the driver's next
    // well-formed command (written over the refused one) completes.
    let fw = d.cmd(1, 2, &[0u8; 8]);
    assert_eq!(fw.status, 0);
    assert_ne!(fw.r0 as u32, 0);
}

#[test]
fn doorbell_flood_and_garbage_sqes() {
    let mut d = ready();
    let mut qp = rts_qp_with_sq(&mut d, 256);
    // Garbage in the SQ ring, then 10000 doorbells.
    let mut x = 0x1234_5678_9abc_def0u64;
    for i in 0..256u64 {
        let mut bb = [0u8; 32];
        for c in bb.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            c.copy_from_slice(&x.to_le_bytes());
        }
        d.mem_write(qp.sq.addr + 32 * i, &bb);
    }
    for i in 0..10_000u32 {
        qp.sq_pi = (i % 200) as u16;
        d.kick_sq(&qp);
        if i % 1000 == 0 {
            d.poll();
        }
    }
    for _ in 0..10 {
        d.poll();
    }
    let c = d.dev.counters();
    assert!(c.doorbells >= 10_000);
    assert!(c.bad_wqes >= 1, "{c:?}");
    // The CQ got an error CQE then flushes; the device is still alive.
    assert!(d.poll_cq(1).is_some());
    assert_eq!(d.cmd(1, 2, &[0u8; 8]).status, 0);
}

#[test]
fn garbage_command_queue() {
    let mut d = ready();
    // Fill the whole CMDQ SQ with garbage and ring with every index.
    let mut x = 0xfeed_beefu64;
    for i in 0..u64::from(CMDQ_DEPTH) {
        let mut bb = [0u8; 32];
        for c in bb.chunks_mut(8) {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            c.copy_from_slice(&x.to_le_bytes());
        }
        d.mem_write(d.sq.addr + 32 * i, &bb);
    }
    for pi in (0..2048u64).step_by(7) {
        d.write64(off::CMDQ_SQDB, pi);
        d.poll();
    }
    let c = d.dev.counters();
    assert!(c.cmd_unknown + c.cmd_malformed + c.cmd_rdma_failed + c.cmd_common_failed > 0);
}

#[test]
fn random_bar_writes_and_reads_never_panic() {
    let mut d = ready();
    let mut x = 42u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for _ in 0..20_000 {
        let r = next();
        let offset = match r % 4 {
            0 => r >> 40 & 0x3ff,
            1 => (r >> 20) % regs::FUNC_BAR_SIZE,
            2 => 0x1000 * ((r >> 8) % 1024) + (r >> 30 & 0xff8),
            _ => r >> 3,
        };
        let len = [1usize, 2, 4, 8, 3, 16][(r >> 60) as usize % 6];
        let data = next().to_le_bytes();
        let buf = &data[..len.min(8)];
        if r & 1 == 0 {
            d.with_io(|dev, io| dev.bar_write((r >> 58) as u8 & 3, offset, buf, io));
        } else {
            let mut out = vec![0u8; len];
            d.with_io(|dev, io| dev.bar_read((r >> 58) as u8 & 3, offset, &mut out, io));
        }
        if r % 64 == 0 {
            d.poll();
        }
        if r % 997 == 0 {
            let f: Vec<u8> = (0..(r % 200) as usize).map(|_| next() as u8).collect();
            let _ = d.receive(&f);
        }
    }
    let _ = d.dev.next_timeout(d.now);
}

#[test]
fn eq_overflow_is_counted() {
    let mut d = ready();
    // Never consume the CEQ: arm CQ 1 and complete flushes repeatedly.
    let (_, qp) = d.create_qp(2, false, 1, 1024, 64);
    let mut qp = qp.unwrap();
    assert_eq!(d.modify_qp(2, 6, 1, None, 0, 0, 0, 0).status, 0);
    for i in 0..(CEQ_DEPTH + 20) {
        // Re-arm with the current CI so every CQE fires a CEQE.
        let cq = d.cqs[&1];
        let v = (1u64 << 32) | (1 << 31) | u64::from(cq.ci);
        d.write64(regs::CQDB_SPACE, v);
        d.post_sqe(&mut qp, {
            let mut s = vec![0u8; 32];
            s[..8].copy_from_slice(&sqe_hdr(op::SEND, 0, true, false).to_le_bytes());
            s
        });
        d.poll();
        let _ = d.poll_cq(1);
        let _ = i;
    }
    assert!(d.dev.counters().eq_overflows >= 1, "{:?}", d.dev.counters());
}

/// Issue 24 (3): an AEQ (or CEQ) of 65536 entries was accepted, and the
/// EQ's 16-bit occupancy (the driver's CI is a u16) never reached its
/// depth: it was never full, so the device overwrote unconsumed EQEs. Such
/// depths are refused now: INIT fails (INIT_DONE clear, `init_failures`),
/// CREATE_EQ answers INVALID.
#[test]
fn eq_depths_a_u16_ci_cannot_track_are_refused() {
    let mut d = ready();
    // CREATE_EQ of 2^16 entries for CEQ 3: invalid; 2^15 is fine.
    let ring = d.alloc(16 << 16, 4096);
    let mut req = [0u8; 32];
    req[8..16].copy_from_slice(&ring.to_le_bytes());
    req[16] = 3;
    req[17] = 3;
    req[18] = 16;
    req[19] = 1;
    assert_eq!(d.cmd(1, 0, &req).status, 1, "CEQ of 2^16 entries");
    req[18] = 15;
    assert_eq!(d.cmd(1, 0, &req).status, 0, "CEQ of 2^15 entries");
    // Re-probe with an AEQ of 65536 entries (the register is 32-bit; the
    // driver writes 4096): INIT is refused.
    let aeq = d.alloc(16 << 16, 4096);
    d.write32(off::DEV_CTRL, regs::CTRL_RESET);
    d.write32(off::AEQ_ADDR_H, (aeq >> 32) as u32);
    d.write32(off::AEQ_ADDR_L, aeq as u32);
    d.write32(off::AEQ_DEPTH, 1 << 16);
    let failures = d.dev.counters().init_failures;
    d.write32(off::DEV_CTRL, regs::CTRL_INIT);
    assert_eq!(d.read32(off::DEV_ST) & regs::ST_INIT_DONE, 0);
    assert_eq!(d.dev.counters().init_failures, failures + 1);
    // The deepest ring a u16 CI can track is accepted.
    d.write32(off::AEQ_DEPTH, 1 << 15);
    d.write32(off::DEV_CTRL, regs::CTRL_INIT);
    assert_ne!(d.read32(off::DEV_ST) & regs::ST_INIT_DONE, 0);
}

#[test]
fn create_qp_with_unreachable_or_short_ring_fails() {
    let mut d = ready();
    let (_, qp) = d.create_qp(2, false, 1, 16, 16);
    let qp = qp.unwrap();
    assert_eq!(d.modify_qp(2, 1, 1, None, 0, 0, 0, 0).status, 0);
    let av = peer_av();
    assert_eq!(
        d.modify_qp(2, 2, 1 | 4 | 32, Some(&av), 3, 0, 0, 0).status,
        0
    );
    assert_eq!(d.modify_qp(2, 3, 1, None, 0, 0, 0, 0).status, 0);
    // A user QP whose ring page is outside memory cannot be created...
    let mut req = [0u8; 120];
    req[8..12].copy_from_slice(&(9u32 | (4 << 20)).to_le_bytes());
    req[12..16].copy_from_slice(&(1u32 | (4 << 20)).to_le_bytes());
    req[16..20].copy_from_slice(&1u32.to_le_bytes());
    req[20..24].copy_from_slice(&1u32.to_le_bytes());
    req[24..32].copy_from_slice(&0x7777_0000_0000u64.to_le_bytes());
    req[32..40].copy_from_slice(&MEM_BASE.to_le_bytes());
    req[40..44].copy_from_slice(&2u32.to_le_bytes());
    req[44..48].copy_from_slice(&2u32.to_le_bytes());
    assert_ne!(d.cmd(0, 1, &req).status, 0);
    // ... and a kernel QP that lies about its depth (ring past the 1 MiB
    // page it declares) is refused too.
    req[8..12].copy_from_slice(&(9u32 | (15 << 20)).to_le_bytes());
    req[24..32].copy_from_slice(&MEM_BASE.to_le_bytes());
    req[16..20].copy_from_slice(&1u32.to_le_bytes());
    assert_ne!(d.cmd(0, 1, &req).status, 0);
    let _ = qp;
    assert!(d.drain_aeq().is_empty());
}

// The gve tests' xorshift generator, shared rather than copied.
#[path = "../../gve-device/tests/common/xorshift.rs"]
mod xorshift;
use xorshift::Rng;

impl Rng {
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

#[test]
fn random_commands_wqes_and_frames_never_panic() {
    use roce_model::{Bth, ExtHeaders, FrameBuilder, NetParams, Opcode, PacketBuilder};
    let seeds: u64 = std::env::var("FUZZ_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    for seed in 1..=seeds {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ seed);
        let mut d = ready();
        let buf = d.alloc(4 * 4096, 4096);
        let pages: Vec<u64> = (0..4).map(|i| buf + 4096 * i).collect();
        assert_eq!(
            d.reg_mr(0x100, 1, 0x7000_0000, 4 * 4096, &pages, 0x1f, false)
                .status,
            0
        );
        let (_, qp) = d.create_qp(2, false, 1, 256, 64);
        let mut qp = qp.unwrap();
        let av = peer_av();
        assert_eq!(d.modify_qp(2, 1, 1, None, 0, 0, 0, 0).status, 0);
        assert_eq!(
            d.modify_qp(2, 2, 1 | 4 | 32, Some(&av), 3, 0, 0, 0).status,
            0
        );
        assert_eq!(d.modify_qp(2, 3, 1, None, 0, 0, 0, 0).status, 0);
        for _ in 0..64 {
            d.post_recv(
                &mut qp,
                0x7000_0000 + (rng.next() % 0x3000),
                (rng.next() % 4096) as u32,
                0x100,
            );
        }
        for i in 0..3000u32 {
            match rng.next() % 4 {
                0 => {
                    let sub = rng.next() % 2;
                    let ops = [0u64, 1, 2, 3, 4, 5, 6, 8, 9, 14, 15, 16, 17];
                    let opc = ops[(rng.next() % ops.len() as u64) as usize];
                    let mut body = rng.bytes(128);
                    // Keep some object numbers plausible.
                    // (Destroying QP 2 / CQ 1 / MR 1 would end the run early.)
                    let destroy = sub == 0 && matches!(opc, 2 | 5 | 9);
                    if rng.next() % 2 == 0 && !destroy {
                        body[8..12].copy_from_slice(&(rng.next() as u32 % 8).to_le_bytes());
                    }
                    let _ = d.try_cmd(sub, opc, &body);
                }
                1 => {
                    let n = 32 * (1 + (rng.next() % 4) as usize);
                    let mut s = rng.bytes(n);
                    let opc = rng.next() % 19;
                    let hdr = (u64::from_le_bytes(s[..8].try_into().unwrap())
                        & !(0x1f << 27)
                        & !(7 << 52)
                        & !(0xfffff << 32)
                        & !0xffff)
                        | (opc << 27);
                    s[..8].copy_from_slice(&hdr.to_le_bytes());
                    if rng.next() % 2 == 0 {
                        // Plausible SGE.
                        s[16..24]
                            .copy_from_slice(&(0x7000_0000 + rng.next() % 0x4000).to_le_bytes());
                        s[24..28].copy_from_slice(&((rng.next() % 5000) as u32).to_le_bytes());
                        s[28..32].copy_from_slice(&0x100u32.to_le_bytes());
                    }
                    if d.dev.qp_state(2) == Some(6) {
                        // Recover so that the engine keeps being exercised.
                        let _ = d.modify_qp(2, 0, 1, None, 0, 0, 0, 0);
                        qp.sq_pi = 0;
                        qp.rq_pi = 0;
                        let _ = d.modify_qp(2, 1, 1, None, 0, 0, 0, 0);
                        let _ = d.modify_qp(2, 2, 1 | 4 | 32, Some(&av), 3, 0, 0, 0);
                        let _ = d.modify_qp(2, 3, 1, None, 0, 0, 0, 0);
                        for _ in 0..8 {
                            d.post_recv(&mut qp, 0x7000_0000, 4096, 0x100);
                        }
                    }
                    d.post_sqe(&mut qp, s);
                }
                2 => {
                    let op = Opcode::ALL[(rng.next() % Opcode::ALL.len() as u64) as usize];
                    let raw = rng.bytes(64);
                    let Ok((mut ext, _)) = ExtHeaders::parse(op.info().headers, &raw) else {
                        continue;
                    };
                    if let Some(r) = ext.reth.as_mut() {
                        if rng.next() % 2 == 0 {
                            r.rkey = 0x100;
                            r.va = 0x7000_0000 + rng.next() % 0x5000;
                            r.len %= 0x3000;
                        }
                    }
                    if let Some(a) = ext.atomic_eth.as_mut() {
                        if rng.next() % 2 == 0 {
                            a.rkey = 0x100;
                            a.va = (0x7000_0000 + rng.next() % 0x4000) & !7;
                        }
                    }
                    let plen = (rng.next() % 300) as usize;
                    let payload = rng.bytes(plen);
                    let qpn = [1u32, 2, 2, 2, 3, rng.next() as u32 & 0xff_ffff]
                        [(rng.next() % 6) as usize];
                    let pkt = PacketBuilder {
                        bth: Bth::new(op, qpn, (rng.next() % 8) as u32),
                        ext,
                        payload: &payload,
                    };
                    let fb = FrameBuilder {
                        dst_mac: MAC,
                        src_mac: [2, 0, 0, 0, 0, 1],
                        vlan_tci: None,
                        net: NetParams::Ipv4 {
                            src: [10, 0, 0, 1],
                            dst: [10, 0, 0, 9],
                            tos: 0,
                            ttl: 64,
                            ident: 0,
                            udp_src_port: 1,
                        },
                    };
                    if let Ok(mut f) = fb.build(&pkt) {
                        if rng.next() % 8 == 0 {
                            let at = (rng.next() as usize) % f.len();
                            f[at] ^= 1 << (rng.next() % 8);
                        }
                        let _ = d.receive(&f);
                    }
                }
                _ => {
                    d.now += std::time::Duration::from_millis(rng.next() % 200);
                    d.poll();
                    d.tx.clear();
                    while d.poll_cq(1).is_some() {}
                }
            }
            if i % 500 == 0 {
                let _ = d.drain_aeq();
            }
        }
        let c = d.dev.counters();
        if seed == 1 {
            eprintln!("{c:?}");
        }
        // The run reached the engine and the command handlers.
        assert!(
            c.wqes_executed > 0 && c.rx_frames > 0 && c.cmd_rdma_failed > 0,
            "{c:?}"
        );
        assert!(c.rqes_consumed > 0, "{c:?}");
    }
}

/// An SQE whose header claims more WQEBBs than the doorbell posted (the
/// rest of it would be stale ring contents) is refused with the doorbell,
/// as the command queue refuses a PI inside a command: nothing is sent, no
/// CQE, the doorbell counted, and the SQ does not ask to run again.
#[test]
fn sqe_longer_than_its_doorbell_is_refused() {
    let mut d = ready();
    let mut qp = rts_qp(&mut d);
    let buf = d.alloc(4096, 4096);
    assert_eq!(
        d.reg_mr(0x100, 1, 0x1000_0000, 4096, &[buf], 0x1e, false)
            .status,
        0
    );
    let before = d.dev.counters().bad_doorbells;
    // A SEND header saying 4 WQEBBs (count - 1 = 3 in bits 54:52) ...
    let mut s = vec![0u8; 32];
    let hdr = sqe_hdr(op::SEND, 1, true, false) | (3u64 << 52) | (u64::from(qp.qpn) << 32) | 1;
    s[..8].copy_from_slice(&hdr.to_le_bytes());
    s[12..16].copy_from_slice(&8u32.to_le_bytes());
    s[16..24].copy_from_slice(&0x1000_0000u64.to_le_bytes());
    s[24..28].copy_from_slice(&8u32.to_le_bytes());
    s[28..32].copy_from_slice(&0x100u32.to_le_bytes());
    d.mem_write(qp.sq.addr, &s);
    // ... rung with a producer index one WQEBB ahead.
    qp.sq_pi = 1;
    d.kick_sq(&qp);
    d.poll();
    assert_eq!(d.dev.counters().bad_doorbells, before + 1);
    assert!(d.tx.is_empty(), "nothing sent");
    assert!(d.poll_cq(1).is_none(), "no completion");
    let now = d.now;
    assert_ne!(
        d.dev.next_timeout(d.now),
        Some(now),
        "no work left asking to run"
    );
    assert_eq!(d.dev.counters().wqes_executed, 0);
}

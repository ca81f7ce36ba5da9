//! Two devices with one RC QP each, back to back: the setup shared by the
//! data-path tests, the bounds tests and the data-path bench.

use super::*;
use erdma_device::wqe::op;

pub const MAC_A: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0a];
pub const MAC_B: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0b];
pub const IP_A: [u8; 4] = [10, 0, 0, 1];
pub const IP_B: [u8; 4] = [10, 0, 0, 2];
/// The MR every side registers, over its whole buffer at [`VA`].
pub const STAG: u32 = 0x100;
/// Virtual address of that MR.
pub const VA: u64 = 0x7000_0000;

/// One end: its driver, its QP and the guest address of its MR's buffer.
pub struct Side {
    pub d: Driver,
    pub qp: KQp,
    pub buf: u64,
}

pub fn av_to(mac: [u8; 6], ip: [u8; 4]) -> AvSpec {
    AvSpec {
        flow_label: 0,
        tclass: 0,
        hop_limit: 64,
        sl: 0,
        udp_sport: 0xc001,
        sgid_index: 0,
        dmac: mac,
        dgid: v4_gid(ip),
    }
}

/// Probes `d`, sets GID 0 to `ip`, creates CQ 1 and QP `qpn` with
/// `(cq, sq, rq)` depths, and registers `pages` 4 KiB pages as [`STAG`] at
/// [`VA`] with every right (level 1 past four pages).
pub fn side(
    mut d: Driver,
    ip: [u8; 4],
    ud: bool,
    qpn: u32,
    depths: (u32, u32, u32),
    pages: u64,
) -> Side {
    let (cq, sq, rq) = depths;
    d.probe(2);
    assert_eq!(d.set_gid(0, v4_gid(ip)).status, 0);
    assert_eq!(d.create_cq(1, cq, 1).status, 0);
    let (c, qp) = d.create_qp(qpn, ud, 1, sq, rq);
    assert_eq!(c.status, 0);
    let buf = d.alloc(pages * 4096, 4096);
    let list: Vec<u64> = (0..pages).map(|i| buf + 4096 * i).collect();
    assert_eq!(
        d.reg_mr(STAG, 1, VA, pages * 4096, &list, 0x1f, false)
            .status,
        0
    );
    Side {
        d,
        qp: qp.expect("QP"),
        buf,
    }
}

/// Takes both QPs to RTS towards each other (A is `MAC_A`/`IP_A`), PSNs 500.
pub fn connect(a: &mut Side, b: &mut Side) {
    let (qa, qb) = (a.qp.qpn, b.qp.qpn);
    connect_qps(&mut a.d, &a.qp, MAC_B, IP_B, qb);
    connect_qps(&mut b.d, &b.qp, MAC_A, IP_A, qa);
}

/// Takes `qp` of `d` to RTS towards `peer_qpn` at `mac`/`ip`, PSNs 500.
pub fn connect_qps(d: &mut Driver, qp: &KQp, mac: [u8; 6], ip: [u8; 4], peer_qpn: u32) {
    let av = av_to(mac, ip);
    let q = qp.qpn;
    assert_eq!(d.modify_qp(q, 1, 1, None, 0, 0, 0, 0).status, 0);
    assert_eq!(
        d.modify_qp(q, 2, 1 | 4 | 16 | 32, Some(&av), peer_qpn, 0, 0, 500)
            .status,
        0
    );
    assert_eq!(d.modify_qp(q, 3, 1 | 8, None, 0, 0, 500, 0).status, 0);
}

/// A SEND-family SQE with one SGE.
pub fn send_sqe(opcode: u8, len: u32, addr: u64, key: u32, imm: u32) -> Vec<u8> {
    let mut s = vec![0u8; 32];
    s[..8].copy_from_slice(&sqe_hdr(opcode, 1, true, false).to_le_bytes());
    s[8..12].copy_from_slice(&imm.to_be_bytes());
    s[12..16].copy_from_slice(&len.to_le_bytes());
    s[16..24].copy_from_slice(&addr.to_le_bytes());
    s[24..28].copy_from_slice(&len.to_le_bytes());
    s[28..32].copy_from_slice(&key.to_le_bytes());
    s
}

/// A WRITE-family SQE from `[laddr, +len)` (key [`STAG`]) to `remote`/`rkey`.
pub fn write_sqe(opcode: u8, len: u32, laddr: u64, remote: u64, rkey: u32, imm: u32) -> Vec<u8> {
    let mut s = vec![0u8; 48];
    s[..8].copy_from_slice(&sqe_hdr(opcode, 1, true, false).to_le_bytes());
    s[8..12].copy_from_slice(&imm.to_be_bytes());
    s[12..16].copy_from_slice(&len.to_le_bytes());
    s[16..20].copy_from_slice(&rkey.to_le_bytes());
    s[20..24].copy_from_slice(&(remote as u32).to_le_bytes());
    s[24..28].copy_from_slice(&((remote >> 32) as u32).to_le_bytes());
    s[32..40].copy_from_slice(&laddr.to_le_bytes());
    s[40..44].copy_from_slice(&len.to_le_bytes());
    s[44..48].copy_from_slice(&STAG.to_le_bytes());
    s
}

/// A READ SQE of `len` bytes from `remote`/`rkey` into `laddr` (key [`STAG`]).
pub fn read_sqe(len: u32, laddr: u64, remote: u64, rkey: u32) -> Vec<u8> {
    let mut r = vec![0u8; 64];
    r[..8].copy_from_slice(&sqe_hdr(op::READ, 1, true, false).to_le_bytes());
    r[12..16].copy_from_slice(&len.to_le_bytes());
    r[16..20].copy_from_slice(&STAG.to_le_bytes());
    r[20..24].copy_from_slice(&(laddr as u32).to_le_bytes());
    r[24..28].copy_from_slice(&((laddr >> 32) as u32).to_le_bytes());
    r[32..40].copy_from_slice(&remote.to_le_bytes());
    r[40..44].copy_from_slice(&len.to_le_bytes());
    r[44..48].copy_from_slice(&rkey.to_le_bytes());
    r
}

/// One exchange: A's frames to B, then B's (answers included) to A;
/// returns the frames moved.
pub fn exchange(a: &mut Side, b: &mut Side) -> usize {
    a.d.poll();
    let fa = std::mem::take(&mut a.d.tx);
    for f in &fa {
        let _ = b.d.receive(f);
    }
    b.d.poll();
    let fb = std::mem::take(&mut b.d.tx);
    for f in &fb {
        let _ = a.d.receive(f);
    }
    fa.len() + fb.len()
}

/// Two [`side`]s with 4 MR pages, CQ 256, SQ 256, RQ 64 (A's QP 2, B's QP 3),
/// connected.
pub fn pair() -> (Side, Side) {
    let mut a = side(Driver::new(MAC_A), IP_A, false, 2, (256, 256, 64), 4);
    let mut b = side(Driver::new(MAC_B), IP_B, false, 3, (256, 256, 64), 4);
    connect(&mut a, &mut b);
    (a, b)
}

/// B posts a 64-byte receive at [`VA`] (and polls), then A posts an 8-byte
/// SEND from [`VA`] (not yet polled).
pub fn recv_then_send(a: &mut Side, b: &mut Side) {
    b.d.post_recv(&mut b.qp, VA, 64, STAG);
    b.d.poll();
    a.d.post_sqe(&mut a.qp, send_sqe(op::SEND, 8, VA, STAG, 0));
}

/// Moves frames between the two sides until both are quiet; returns the
/// frames moved.
pub fn shuttle(a: &mut Side, b: &mut Side) -> usize {
    let mut n = 0;
    for _ in 0..100 {
        a.d.poll();
        b.d.poll();
        let fa: Vec<_> = a.d.tx.drain(..).collect();
        let fb: Vec<_> = b.d.tx.drain(..).collect();
        if fa.is_empty() && fb.is_empty() {
            break;
        }
        for f in fa {
            n += 1;
            let _ = b.d.receive(&f);
        }
        for f in fb {
            n += 1;
            let _ = a.d.receive(&f);
        }
    }
    n
}

/// Takes UD QP 1 (GSI) of `d` to RTS with Q_Key 0x8001_0000.
pub fn gsi_to_rts(d: &mut Driver) {
    assert_eq!(
        d.modify_qp(1, 1, 1 | 2, None, 0, 0x8001_0000, 0, 0).status,
        0
    );
    assert_eq!(d.modify_qp(1, 2, 1, None, 0, 0, 0, 0).status, 0);
    assert_eq!(d.modify_qp(1, 3, 1 | 8, None, 0, 0, 0, 0).status, 0);
}

/// Creates AH 5 on `d` towards `MAC_B`/`IP_B`.
pub fn ah_5_to_b(d: &mut Driver) {
    let mut ah = [0u8; 52];
    ah[8..12].copy_from_slice(&1u32.to_le_bytes());
    ah[12..16].copy_from_slice(&5u32.to_le_bytes());
    av_to(MAC_B, IP_B).write(&mut ah[16..52]);
    assert_eq!(d.cmd(0, 15, &ah).status, 0);
}

/// A UD SEND SQE of `len` bytes at [`VA`] through AH 5 to QP 1, Q_Key
/// 0x8001_0000.
pub fn ud_send_sqe(len: u32) -> Vec<u8> {
    let mut s = vec![0u8; 48];
    s[..8].copy_from_slice(&sqe_hdr(op::SEND, 1, true, false).to_le_bytes());
    s[12..16].copy_from_slice(&len.to_le_bytes());
    s[16..20].copy_from_slice(&0x8001_0000u32.to_le_bytes());
    s[20..24].copy_from_slice(&1u32.to_le_bytes());
    s[24..28].copy_from_slice(&5u32.to_le_bytes());
    s[32..40].copy_from_slice(&VA.to_le_bytes());
    s[40..44].copy_from_slice(&len.to_le_bytes());
    s[44..48].copy_from_slice(&STAG.to_le_bytes());
    s
}

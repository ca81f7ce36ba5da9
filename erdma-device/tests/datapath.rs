//! Data path: RC SEND between two model devices through roce-model's
//! engine, UD (GSI) datagrams, flushes, CQ arming and CEQ interrupts.

mod common;

use common::rc::*;
use common::*;
use erdma_device::wqe::op;
use roce_model::{Opcode, RoceFrame};

/// A side as these tests use it: 4 MR pages, CQ 256, SQ 256, RQ 64.
fn side(mac: [u8; 6], ip: [u8; 4], ud: bool, qpn: u32) -> Side {
    rc::side(Driver::new(mac), ip, ud, qpn, (256, 256, 64), 4)
}

#[test]
fn rc_send_between_two_devices() {
    let (mut a, mut b) = pair();
    // B posts a receive at va 0x7000_1000 (second page of its MR).
    let (bqp, bq) = (&mut b.qp, &mut b.d);
    bq.post_recv(bqp, 0x7000_1000, 4096, STAG);
    bq.poll();
    // B arms its CQ: the receive completion must raise CEQ 1 / vector 1.
    bq.arm_cq(1, false);
    // A sends 100 bytes from va 0x7000_0010 with immediate data.
    let msg: Vec<u8> = (0..100u8).collect();
    a.d.mem_write(a.buf + 0x10, &msg);
    let sqe = send_sqe(op::SEND_WITH_IMM, 100, 0x7000_0010, STAG, 0xdead_beef);
    a.d.post_sqe(&mut a.qp, sqe);
    a.d.poll();
    assert_eq!(a.d.tx.len(), 1, "one SEND frame");
    let frame = a.d.tx.remove(0);
    let f = RoceFrame::parse(&frame).unwrap();
    f.verify_icrc().unwrap();
    assert_eq!(f.eth.dst, MAC_B);
    assert_eq!(f.eth.src, MAC_A);
    assert_eq!(f.packet.bth.opcode, Opcode::RcSendOnlyImm);
    assert_eq!(f.packet.bth.dest_qp, 3);
    assert_eq!(f.packet.bth.psn, 500);
    assert_eq!(f.packet.payload, &msg[..]);
    match f.net {
        roce_model::NetLayer::Ipv4 { ip, udp, .. } => {
            assert_eq!(ip.src, IP_A);
            assert_eq!(ip.dst, IP_B);
            assert_eq!(udp.src_port, 0xc001);
            assert_eq!(udp.dst_port, 4791);
        }
        _ => panic!("not IPv4"),
    }
    // Deliver to B: data lands, CQE written, ACK goes back.
    b.d.irqs.clear();
    b.d.receive(&frame).unwrap();
    assert_eq!(b.d.mem_read(b.buf + 0x1000, 100), msg);
    let wc = b.d.poll_cq(1).expect("recv CQE");
    assert_eq!(wc.syndrome, 0);
    assert_eq!(wc.qtype, 1);
    assert_eq!(wc.opcode, op::RSP_SEND_IMM);
    assert_eq!(wc.size, 100);
    assert_eq!(wc.qpn, 3);
    assert_eq!(wc.qe_idx, 0);
    // The driver turns the le32 field into wc.ex.imm_data = cpu_to_be32(v).
    assert_eq!(wc.imm, 0xdead_beef);
    assert!(b.d.irqs.contains(&1), "CEQ 1 interrupt: {:?}", b.d.irqs);
    assert!(b.d.eq_valid(&b.d.ceqs[0].clone()));
    assert_eq!(b.d.tx.len(), 1, "ACK");
    let ack = b.d.tx.remove(0);
    let f = RoceFrame::parse(&ack).unwrap();
    assert_eq!(f.packet.bth.opcode, Opcode::RcAcknowledge);
    // A gets the ACK: send CQE.
    a.d.receive(&ack).unwrap();
    let wc = a.d.poll_cq(1).expect("send CQE");
    assert_eq!(wc.syndrome, 0);
    assert_eq!(wc.qtype, 0);
    assert_eq!(wc.opcode, op::SEND_WITH_IMM);
    assert_eq!(wc.qe_idx, 0);
    assert_eq!(a.d.next_timeout_after_idle(), None);
}

#[test]
fn rc_send_inline_and_local_dma_key_multi_sge() {
    let (mut a, mut b) = pair();
    b.d.post_recv(&mut b.qp, 0x7000_0000, 8192, STAG);
    b.d.poll();
    // Inline SEND of 20 bytes.
    let mut s = vec![0u8; 64];
    s[..8].copy_from_slice(&sqe_hdr(op::SEND, 20, true, true).to_le_bytes());
    s[12..16].copy_from_slice(&20u32.to_le_bytes());
    s[16..36].copy_from_slice(b"inline-data-20-bytes");
    a.d.post_sqe(&mut a.qp, s);
    // Two SGEs with the local DMA key (guest-physical addresses).
    let p1 = a.d.alloc(64, 64);
    let p2 = a.d.alloc(64, 64);
    a.d.mem_write(p1, b"hello ");
    a.d.mem_write(p2, b"world");
    let mut s = vec![0u8; 48];
    s[..8].copy_from_slice(&sqe_hdr(op::SEND, 2, true, false).to_le_bytes());
    s[12..16].copy_from_slice(&11u32.to_le_bytes());
    for (i, (p, l)) in [(p1, 6u32), (p2, 5)].iter().enumerate() {
        let o = 16 + 16 * i;
        s[o..o + 8].copy_from_slice(&p.to_le_bytes());
        s[o + 8..o + 12].copy_from_slice(&l.to_le_bytes());
        s[o + 12..o + 16].copy_from_slice(&0xffff_ff00u32.to_le_bytes());
    }
    a.d.post_sqe(&mut a.qp, s);
    a.d.poll();
    assert_eq!(a.d.tx.len(), 2);
    let f1 = a.d.tx[0].clone();
    let f2 = a.d.tx[1].clone();
    assert_eq!(
        RoceFrame::parse(&f1).unwrap().packet.payload,
        b"inline-data-20-bytes"
    );
    assert_eq!(
        RoceFrame::parse(&f2).unwrap().packet.payload,
        b"hello world"
    );
    b.d.receive(&f1).unwrap();
    assert_eq!(b.d.mem_read(b.buf, 20), b"inline-data-20-bytes");
}

#[test]
fn rc_write_and_read_requests_go_out() {
    let (mut a, mut b) = pair();
    // WRITE 64 bytes to rkey 0x4242 at 0x9000.
    let mut s = vec![0u8; 48];
    s[..8].copy_from_slice(&sqe_hdr(op::WRITE, 1, true, false).to_le_bytes());
    s[12..16].copy_from_slice(&64u32.to_le_bytes());
    s[16..20].copy_from_slice(&0x4242u32.to_le_bytes());
    s[20..24].copy_from_slice(&0x9000u32.to_le_bytes());
    s[32..40].copy_from_slice(&0x7000_0000u64.to_le_bytes());
    s[40..44].copy_from_slice(&64u32.to_le_bytes());
    s[44..48].copy_from_slice(&STAG.to_le_bytes());
    a.d.post_sqe(&mut a.qp, s);
    // READ 128 bytes into local 0x7000_2000 from remote 0xa000 / rkey 0x4343.
    let mut r = vec![0u8; 64];
    r[..8].copy_from_slice(&sqe_hdr(op::READ, 1, true, false).to_le_bytes());
    r[12..16].copy_from_slice(&128u32.to_le_bytes());
    r[16..20].copy_from_slice(&STAG.to_le_bytes());
    r[20..24].copy_from_slice(&0x7000_2000u32.to_le_bytes());
    r[32..40].copy_from_slice(&0xa000u64.to_le_bytes());
    r[40..44].copy_from_slice(&128u32.to_le_bytes());
    r[44..48].copy_from_slice(&0x4343u32.to_le_bytes());
    a.d.post_sqe(&mut a.qp, r);
    a.d.poll();
    assert_eq!(a.d.tx.len(), 2);
    let w = RoceFrame::parse(&a.d.tx[0]).unwrap();
    assert_eq!(w.packet.bth.opcode, Opcode::RcWriteOnly);
    let reth = w.packet.ext.reth.unwrap();
    assert_eq!((reth.va, reth.rkey, reth.len), (0x9000, 0x4242, 64));
    let rd = RoceFrame::parse(&a.d.tx[1]).unwrap();
    assert_eq!(rd.packet.bth.opcode, Opcode::RcReadRequest);
    let reth = rd.packet.ext.reth.unwrap();
    assert_eq!((reth.va, reth.rkey, reth.len), (0xa000, 0x4343, 128));
    // The peer refuses the unknown rkey: A completes the WRITE with a
    // remote access error and flushes the READ.
    let wf = a.d.tx[0].clone();
    let _ = b.d.receive(&wf);
    let nak = b.d.tx.pop().expect("NAK");
    a.d.receive(&nak).unwrap();
    let wc = a.d.poll_cq(1).unwrap();
    assert_eq!(wc.opcode, op::WRITE);
    assert_ne!(wc.syndrome, 0);
    let wc = a.d.poll_cq(1).unwrap();
    assert_eq!(wc.opcode, op::READ);
    assert_eq!(wc.syndrome, 15, "flushed");
    assert_eq!(a.d.dev.qp_state(2), Some(6));
}

#[test]
fn flush_in_error_state() {
    let (mut a, _b) = pair();
    assert_eq!(a.d.modify_qp(2, 6, 1, None, 0, 0, 0, 0).status, 0);
    a.d.post_sqe(&mut a.qp, send_sqe(op::SEND, 8, 0x7000_0000, STAG, 0));
    // Unsignaled too: flushed WQEs always complete.
    let mut s = send_sqe(op::SEND, 8, 0x7000_0000, STAG, 0);
    s[2] &= !(1 << 6); // clear CE (bit 22)
    a.d.post_sqe(&mut a.qp, s);
    a.d.post_recv(&mut a.qp, 0x7000_0000, 64, STAG);
    a.d.poll();
    let mut got = Vec::new();
    while let Some(wc) = a.d.poll_cq(1) {
        got.push((wc.qtype, wc.syndrome, wc.qe_idx));
    }
    assert_eq!(got, vec![(0, 15, 0), (0, 15, 1), (1, 15, 0)]);
    assert!(a.d.tx.is_empty());
    // REFLUSH with the driver's producer indices is accepted.
    let mut req = [0u8; 20];
    req[8..12].copy_from_slice(&2u32.to_le_bytes());
    req[12..16].copy_from_slice(&2u32.to_le_bytes());
    req[16..20].copy_from_slice(&1u32.to_le_bytes());
    assert_eq!(a.d.cmd(0, 6, &req).status, 0);
    // Back to RESET and up again.
    assert_eq!(a.d.modify_qp(2, 0, 1, None, 0, 0, 0, 0).status, 0);
    assert_eq!(a.d.dev.qp_state(2), Some(0));
}

#[test]
fn ud_gsi_datagram_with_ah() {
    let mut a = side(MAC_A, IP_A, true, 1);
    let mut b = side(MAC_B, IP_B, true, 1);
    for s in [&mut a, &mut b] {
        gsi_to_rts(&mut s.d);
    }
    // AH 5 on A towards B.
    ah_5_to_b(&mut a.d);
    b.d.post_recv(&mut b.qp, 0x7000_0000, 512, STAG);
    b.d.poll();
    let mad: Vec<u8> = (0..=255u8).collect();
    a.d.mem_write(a.buf, &mad);
    a.d.post_sqe(&mut a.qp, ud_send_sqe(256));
    a.d.poll();
    let wc = a.d.poll_cq(1).expect("UD send CQE");
    assert_eq!((wc.syndrome, wc.opcode), (0, op::SEND));
    let frame = a.d.tx.pop().expect("UD frame");
    let f = RoceFrame::parse(&frame).unwrap();
    f.verify_icrc().unwrap();
    assert_eq!(f.packet.bth.opcode, Opcode::UdSendOnly);
    assert_eq!(f.packet.ext.deth.unwrap().src_qp, 1);
    b.d.receive(&frame).unwrap();
    let wc = b.d.poll_cq(1).expect("UD recv CQE");
    assert_eq!(wc.syndrome, 0);
    assert_eq!(wc.size, 40 + 256);
    assert_eq!(wc.ud_info & 0xf_ffff, 1, "source QP");
    assert_eq!(wc.ud_info >> 31, 0, "IPv4");
    let got = b.d.mem_read(b.buf, 296);
    assert_eq!(got[20], 0x45, "IPv4 header at offset 20 of the GRH area");
    assert_eq!(&got[20 + 12..20 + 16], &IP_A);
    assert_eq!(&got[40..], &mad[..]);
    // A wrong Q_Key is dropped; no receive WQE left is back-pressure.
    assert!(b.d.receive(&frame).is_err());
}

trait Idle {
    fn next_timeout_after_idle(&self) -> Option<std::time::Instant>;
}

impl Idle for Driver {
    fn next_timeout_after_idle(&self) -> Option<std::time::Instant> {
        use pci_model::PciDevice;
        self.dev.next_timeout(self.now)
    }
}

#[test]
fn rc_write_read_atomics_into_guest_mrs() {
    // 1500-byte netdev MTU on both: path MTU 1024, so 3000 bytes is 3 packets.
    let (mut a, mut b) = connected_pair_on_1500_mtu();
    // WRITE 3000 bytes across a page boundary of B's MR (va 0x7000_0f00..).
    let data: Vec<u8> = (0..3000u32).map(|i| (i * 7) as u8).collect();
    a.d.mem_write(a.buf, &data);
    let w = write_sqe(op::WRITE, 3000, 0x7000_0000, 0x7000_0f00, STAG, 0);
    a.d.post_sqe(&mut a.qp, w);
    assert!(shuttle(&mut a, &mut b) >= 4);
    assert_eq!(b.d.mem_read(b.buf + 0xf00, 3000), data);
    let wc = a.d.poll_cq(1).expect("WRITE CQE");
    assert_eq!((wc.opcode, wc.syndrome), (op::WRITE, 0));
    // READ it back into A's third page.
    b.d.mem_write(b.buf + 0x2000, b"remote bytes for READ");
    let r = read_sqe(21, 0x7000_2000, 0x7000_2000, STAG);
    a.d.post_sqe(&mut a.qp, r);
    shuttle(&mut a, &mut b);
    let wc = a.d.poll_cq(1).expect("READ CQE");
    assert_eq!((wc.opcode, wc.syndrome), (op::READ, 0));
    assert_eq!(a.d.mem_read(a.buf + 0x2000, 21), b"remote bytes for READ");
    // FETCH_AND_ADD then CMP_AND_SWP on B's 8 bytes at 0x7000_3000.
    b.d.mem_write(b.buf + 0x3000, &100u64.to_le_bytes());
    let mut s = vec![0u8; 64];
    s[..8].copy_from_slice(&sqe_hdr(op::ATOMIC_FAA, 1, true, false).to_le_bytes());
    s[16..24].copy_from_slice(&5u64.to_le_bytes());
    s[32..40].copy_from_slice(&0x7000_3000u64.to_le_bytes());
    s[44..48].copy_from_slice(&STAG.to_le_bytes());
    s[48..56].copy_from_slice(&0x7000_3800u64.to_le_bytes());
    s[56..60].copy_from_slice(&8u32.to_le_bytes());
    s[60..64].copy_from_slice(&STAG.to_le_bytes());
    a.d.post_sqe(&mut a.qp, s.clone());
    shuttle(&mut a, &mut b);
    let wc = a.d.poll_cq(1).expect("FAA CQE");
    assert_eq!((wc.opcode, wc.syndrome), (op::ATOMIC_FAA, 0));
    assert_eq!(a.d.mem_u64(a.buf + 0x3800), 100);
    assert_eq!(b.d.mem_u64(b.buf + 0x3000), 105);
    s[..8].copy_from_slice(&sqe_hdr(op::ATOMIC_CAS, 1, true, false).to_le_bytes());
    s[16..24].copy_from_slice(&7u64.to_le_bytes()); // swap
    s[24..32].copy_from_slice(&105u64.to_le_bytes()); // compare
    a.d.post_sqe(&mut a.qp, s);
    shuttle(&mut a, &mut b);
    assert_eq!(a.d.poll_cq(1).unwrap().syndrome, 0);
    assert_eq!(b.d.mem_u64(b.buf + 0x3000), 7);
    // WRITE_WITH_IMM consumes a receive at B.
    b.d.post_recv(&mut b.qp, 0x7000_0000, 0, STAG);
    let w = write_sqe(
        op::WRITE_WITH_IMM,
        16,
        0x7000_0000,
        0x7000_0100,
        STAG,
        0x1234,
    );
    a.d.post_sqe(&mut a.qp, w);
    shuttle(&mut a, &mut b);
    let wc = b.d.poll_cq(1).expect("WRITE_WITH_IMM recv CQE");
    assert_eq!(
        (wc.opcode, wc.syndrome, wc.imm, wc.size),
        (op::RECV_IMM, 0, 0x1234, 16)
    );
    // A WRITE outside B's MR is a remote access error at A.
    let w = write_sqe(op::WRITE, 16, 0x7000_0000, 0x7000_4000, STAG, 0);
    a.d.post_sqe(&mut a.qp, w);
    shuttle(&mut a, &mut b);
    let _ = a.d.poll_cq(1).unwrap(); // WRITE_WITH_IMM send side
    let wc = a.d.poll_cq(1).expect("error CQE");
    assert_ne!(wc.syndrome, 0);
    assert_eq!(a.d.dev.qp_state(2), Some(6));
}

#[test]
fn send_with_invalidate_invalidates_the_guest_mr() {
    let (mut a, mut b) = pair();
    // A second MR at B (stag 0x200) to be invalidated.
    let p = b.d.alloc(4096, 4096);
    assert_eq!(
        b.d.reg_mr(0x200, 1, 0x9000_0000, 4096, &[p], 0x1e, false)
            .status,
        0
    );
    b.d.post_recv(&mut b.qp, 0x7000_0000, 64, STAG);
    let mut s = send_sqe(op::SEND_WITH_INV, 4, 0x7000_0000, STAG, 0);
    s[8..12].copy_from_slice(&0x200u32.to_le_bytes());
    a.d.post_sqe(&mut a.qp, s);
    shuttle(&mut a, &mut b);
    let wc = b.d.poll_cq(1).expect("recv CQE");
    assert_eq!((wc.opcode, wc.syndrome), (op::RECV_INV, 0));
    assert_eq!(
        wc.imm.swap_bytes(),
        0x200,
        "inv_rkey is big-endian in the CQE"
    );
    // A WRITE to the invalidated MR now fails.
    let w = write_sqe(op::WRITE, 8, 0x7000_0000, 0x9000_0000, 0x200, 0);
    a.d.post_sqe(&mut a.qp, w);
    shuttle(&mut a, &mut b);
    let _ = a.d.poll_cq(1);
    assert_ne!(a.d.poll_cq(1).expect("WRITE CQE").syndrome, 0);
}

#[test]
fn lost_frame_is_retransmitted_on_timeout() {
    let (mut a, mut b) = pair();
    recv_then_send(&mut a, &mut b);
    a.d.poll();
    assert_eq!(a.d.tx.len(), 1);
    a.d.tx.clear(); // lost
    let t = a.d.next_timeout_after_idle().expect("retransmit timer");
    assert!(t > a.d.now);
    a.d.now = t;
    a.d.poll();
    assert_eq!(a.d.tx.len(), 1, "retransmitted");
    shuttle(&mut a, &mut b);
    assert_eq!(a.d.poll_cq(1).unwrap().syndrome, 0);
    assert_eq!(b.d.poll_cq(1).unwrap().syndrome, 0);
}

#[test]
fn fast_register_and_local_invalidate_wqes() {
    let (mut a, mut b) = pair();
    // FRMR at B: erdma_ib_alloc_mr registers it invalid with an MTT buffer.
    let mtt = b.d.alloc(8 * 8, 64);
    let mut req = [0u8; 64];
    let cfg0 = 0x30u32; // mpt 0x30, key 0, not valid
    let cfg1 = (1u32 << 12) | (1 << 6) | (0x1e << 1);
    let cfg2 = (12u32 << 27) | (1 << 20) | 8;
    req[8..12].copy_from_slice(&cfg0.to_le_bytes());
    req[12..16].copy_from_slice(&cfg1.to_le_bytes());
    req[28..32].copy_from_slice(&cfg2.to_le_bytes());
    req[32..40].copy_from_slice(&mtt.to_le_bytes());
    assert_eq!(b.d.cmd(0, 8, &req).status, 0);
    // B posts REG_MR with two inline pages, new key byte 0x07.
    let pages = [b.d.alloc(4096, 4096), b.d.alloc(4096, 4096)];
    let mut s = vec![0u8; 64];
    s[..8].copy_from_slice(&sqe_hdr(op::REG_MR, 0, true, false).to_le_bytes());
    s[8..16].copy_from_slice(&0x5000_0800u64.to_le_bytes());
    s[16..20].copy_from_slice(&4096u32.to_le_bytes());
    s[20..24].copy_from_slice(&0x3007u32.to_le_bytes());
    let attrs = (0x1eu32 << 1) | (2 << 12);
    s[24..28].copy_from_slice(&attrs.to_le_bytes());
    s[32..40].copy_from_slice(&pages[0].to_le_bytes());
    s[40..48].copy_from_slice(&pages[1].to_le_bytes());
    b.d.post_sqe(&mut b.qp, s);
    b.d.poll();
    let wc = b.d.poll_cq(1).expect("REG_MR CQE");
    assert_eq!((wc.opcode, wc.syndrome), (op::REG_MR, 0));
    // A writes through the new rkey across the two pages.
    let data: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
    a.d.mem_write(a.buf, &data);
    a.d.post_sqe(
        &mut a.qp,
        write_sqe(op::WRITE, 4096, 0x7000_0000, 0x5000_0800, 0x3007, 0),
    );
    shuttle(&mut a, &mut b);
    assert_eq!(a.d.poll_cq(1).unwrap().syndrome, 0);
    assert_eq!(b.d.mem_read(pages[0] + 0x800, 0x800), &data[..0x800]);
    assert_eq!(b.d.mem_read(pages[1], 0x800), &data[0x800..]);
    // LOCAL_INV at B, then the same WRITE fails.
    let mut s = vec![0u8; 32];
    s[..8].copy_from_slice(&sqe_hdr(op::LOCAL_INV, 0, true, false).to_le_bytes());
    s[20..24].copy_from_slice(&0x3007u32.to_le_bytes());
    b.d.post_sqe(&mut b.qp, s);
    b.d.poll();
    assert_eq!(b.d.poll_cq(1).unwrap().opcode, op::LOCAL_INV);
    a.d.post_sqe(
        &mut a.qp,
        write_sqe(op::WRITE, 16, 0x7000_0000, 0x5000_0800, 0x3007, 0),
    );
    shuttle(&mut a, &mut b);
    assert_ne!(a.d.poll_cq(1).unwrap().syndrome, 0);
}

#[test]
fn local_invalidate_waits_for_earlier_rc_work() {
    let (mut a, mut b) = pair();
    recv_then_send(&mut a, &mut b);
    let mut s = vec![0u8; 32];
    s[..8].copy_from_slice(&sqe_hdr(op::LOCAL_INV, 0, true, false).to_le_bytes());
    s[20..24].copy_from_slice(&STAG.to_le_bytes());
    a.d.post_sqe(&mut a.qp, s);
    a.d.poll();
    // The SEND is unacknowledged: no CQE yet, the invalidate waits.
    assert!(a.d.poll_cq(1).is_none());
    shuttle(&mut a, &mut b);
    let first = a.d.poll_cq(1).unwrap();
    let second = a.d.poll_cq(1).unwrap();
    assert_eq!((first.opcode, first.qe_idx), (op::SEND, 0));
    assert_eq!(
        (second.opcode, second.qe_idx, second.syndrome),
        (op::LOCAL_INV, 1, 0)
    );
}

#[test]
fn rc_send_over_ipv6_gids() {
    let g = |last: u8| {
        let mut g = [0u8; 16];
        g[0] = 0xfd;
        g[15] = last;
        g
    };
    let mut a = side(MAC_A, IP_A, false, 2);
    let mut b = side(MAC_B, IP_B, false, 3);
    assert_eq!(a.d.set_gid(1, g(1)).status, 0);
    assert_eq!(b.d.set_gid(1, g(2)).status, 0);
    for (s, peer, mac, dg) in [(&mut a, 3, MAC_B, g(2)), (&mut b, 2, MAC_A, g(1))] {
        let mut av = av_to(mac, IP_A);
        av.dgid = dg;
        av.sgid_index = 1;
        av.flow_label = 0x5555;
        let q = s.qp.qpn;
        assert_eq!(s.d.modify_qp(q, 1, 1, None, 0, 0, 0, 0).status, 0);
        assert_eq!(
            s.d.modify_qp(q, 2, 1 | 4 | 32, Some(&av), peer, 0, 0, 0)
                .status,
            0
        );
        assert_eq!(s.d.modify_qp(q, 3, 1, None, 0, 0, 0, 0).status, 0);
    }
    b.d.post_recv(&mut b.qp, 0x7000_0000, 64, STAG);
    a.d.mem_write(a.buf, b"over v6!");
    a.d.post_sqe(&mut a.qp, send_sqe(op::SEND, 8, 0x7000_0000, STAG, 0));
    a.d.poll();
    let f = RoceFrame::parse(&a.d.tx[0]).unwrap();
    f.verify_icrc().unwrap();
    match f.net {
        roce_model::NetLayer::Ipv6 { ip, .. } => {
            assert_eq!(ip.dst, g(2));
            assert_eq!(ip.flow_label, 0x5555);
        }
        _ => panic!("not IPv6"),
    }
    shuttle(&mut a, &mut b);
    assert_eq!(b.d.mem_read(b.buf, 8), b"over v6!");
    assert_eq!(a.d.poll_cq(1).unwrap().syndrome, 0);
}

#[test]
fn sq_cqes_stay_in_order_when_a_later_wqe_fails() {
    let (mut a, mut b) = pair();
    // SEND (inside the engine, unacknowledged), then a SEND with a bad key.
    a.d.post_sqe(&mut a.qp, send_sqe(op::SEND, 8, 0x7000_0000, STAG, 0));
    a.d.post_sqe(&mut a.qp, send_sqe(op::SEND, 8, 0x7000_0000, 0xbad00, 0));
    a.d.poll();
    let first = a.d.poll_cq(1).unwrap();
    let second = a.d.poll_cq(1).unwrap();
    assert_eq!((first.qe_idx, first.syndrome), (0, 15));
    assert_eq!((second.qe_idx, second.syndrome), (1, 10));
    let _ = &mut b;
}

#[test]
fn write_through_a_level2_mtt_lands_in_the_right_pages() {
    let (mut a, mut b) = pair();
    // B: a 600-page MR (level-1 table of two pages under a level-2 page),
    // data pages allocated in reverse order so that translation matters.
    let data: Vec<u64> = (0..600).map(|_| b.d.alloc(4096, 4096)).rev().collect();
    let l1a = b.d.alloc(4096, 4096);
    let l1b = b.d.alloc(4096, 4096);
    let top = b.d.alloc(4096, 4096);
    for (i, p) in data.iter().enumerate() {
        let t = if i < 512 {
            l1a + 8 * i as u64
        } else {
            l1b + 8 * (i as u64 - 512)
        };
        b.d.mem_write(t, &p.to_le_bytes());
    }
    b.d.mem_write(top, &l1a.to_le_bytes());
    b.d.mem_write(top + 8, &l1b.to_le_bytes());
    let va = 0x4000_0000u64;
    let mut req = [0u8; 64];
    let cfg0 = (1u32 << 31) | (1 << 28) | (0x9a << 20) | 5; // valid, v1, key 0x9a, mpt 5
    let cfg1 = (1u32 << 12) | (0x1f << 1);
    let cfg2 = (12u32 << 27) | (2 << 20) | 600;
    req[8..12].copy_from_slice(&cfg0.to_le_bytes());
    req[12..16].copy_from_slice(&cfg1.to_le_bytes());
    req[16..24].copy_from_slice(&va.to_le_bytes());
    req[24..28].copy_from_slice(&(600u32 * 4096).to_le_bytes());
    req[28..32].copy_from_slice(&cfg2.to_le_bytes());
    req[32..40].copy_from_slice(&top.to_le_bytes());
    assert_eq!(b.d.cmd(0, 8, &req).status, 0);
    let rkey = 0x59a;
    // A writes 64 bytes straddling pages 511/512 (the two level-1 pages).
    let msg: Vec<u8> = (0..64u8).map(|i| i ^ 0x5a).collect();
    a.d.mem_write(a.buf, &msg);
    let at = va + 512 * 4096 - 32;
    a.d.post_sqe(
        &mut a.qp,
        write_sqe(op::WRITE, 64, 0x7000_0000, at, rkey, 0),
    );
    shuttle(&mut a, &mut b);
    assert_eq!(a.d.poll_cq(1).unwrap().syndrome, 0);
    assert_eq!(b.d.mem_read(data[511] + 4096 - 32, 32), &msg[..32]);
    assert_eq!(b.d.mem_read(data[512], 32), &msg[32..]);
    // And reads back through the same translation.
    a.d.post_sqe(&mut a.qp, read_sqe(64, 0x7000_1000, at, rkey));
    shuttle(&mut a, &mut b);
    assert_eq!(a.d.poll_cq(1).unwrap().syndrome, 0);
    assert_eq!(a.d.mem_read(a.buf + 0x1000, 64), msg);
}

/// Two connected RC sides whose netdev MTU is 1500 (path MTU 1024: a
/// 3000-byte message is 3 packets).
fn connected_pair_on_1500_mtu() -> (Side, Side) {
    let mut a = side(MAC_A, IP_A, false, 2);
    let mut b = side(MAC_B, IP_B, false, 3);
    for s in [&mut a, &mut b] {
        let mut req = [0u8; 12];
        req[8..12].copy_from_slice(&1500u32.to_le_bytes());
        assert_eq!(s.d.cmd(1, 3, &req).status, 0);
    }
    connect(&mut a, &mut b);
    (a, b)
}

/// Shuttles frames, letting A's retransmit timer fire, until both are quiet.
fn settle_with_retransmits(a: &mut Side, b: &mut Side) {
    shuttle(a, b);
    for _ in 0..20 {
        if let Some(t) = a.d.next_timeout_after_idle() {
            a.d.now = a.d.now.max(t);
        }
        shuttle(a, b);
    }
}

/// Hands `to` every frame but the `lost`-th.
fn deliver_all_but(frames: &[Vec<u8>], lost: usize, to: &mut Side) {
    for (i, f) in frames.iter().enumerate() {
        if i != lost {
            let _ = to.d.receive(f);
        }
    }
}

/// The middle packet of a 3-packet WRITE is lost and the next WRITE's first
/// packet arrives ahead of sequence (2 % loss under SMC-R met this): the
/// responder must keep the first WRITE's region, so the go-back-N
/// retransmission completes both WRITEs with the data in place.
#[test]
fn write_after_a_lost_middle_packet_keeps_the_write_in_progress() {
    let (mut a, mut b) = connected_pair_on_1500_mtu();
    let first: Vec<u8> = (0..3000u32).map(|i| (i * 7) as u8).collect();
    let second: Vec<u8> = (0..3000u32).map(|i| (i * 13 + 1) as u8).collect();
    a.d.mem_write(a.buf, &first);
    a.d.mem_write(a.buf + 0x1000, &second);
    a.d.post_sqe(
        &mut a.qp,
        write_sqe(op::WRITE, 3000, 0x7000_0000, 0x7000_2000, STAG, 0),
    );
    a.d.post_sqe(
        &mut a.qp,
        write_sqe(op::WRITE, 3000, 0x7000_1000, 0x7000_3000, STAG, 0),
    );
    a.d.poll();
    let frames: Vec<_> = a.d.tx.drain(..).collect();
    assert!(
        frames.len() >= 4,
        "both WRITEs went out ({} frames)",
        frames.len()
    );
    // FIRST of WRITE 1 arrives, its MIDDLE is lost, the rest arrive
    // (LAST of WRITE 1 and FIRST of WRITE 2 out of sequence).
    deliver_all_but(&frames, 1, &mut b);
    settle_with_retransmits(&mut a, &mut b);
    let w1 = a.d.poll_cq(1).expect("WRITE 1 CQE");
    let w2 = a.d.poll_cq(1).expect("WRITE 2 CQE");
    assert_eq!((w1.opcode, w1.syndrome), (op::WRITE, 0));
    assert_eq!((w2.opcode, w2.syndrome), (op::WRITE, 0));
    assert_eq!(b.d.mem_read(b.buf + 0x2000, 3000), first);
    assert_eq!(b.d.mem_read(b.buf + 0x3000, 3000), second);
    assert_eq!(b.d.dev.counters().error_cqes, 0);
}

/// Three outstanding READs of the same remote buffer (as `ib_read_bw`
/// posts them); a response packet of the first is lost, so the requester
/// retries that READ from the middle. The responder must replay the first
/// READ's snapshot (matched by PSN, not by address, which all three share).
#[test]
fn retried_read_among_reads_of_the_same_buffer_replays_its_own_snapshot() {
    let (mut a, mut b) = connected_pair_on_1500_mtu();
    let remote: Vec<u8> = (0..3000u32).map(|i| (i * 11 + 3) as u8).collect();
    b.d.mem_write(b.buf + 0x2000, &remote);
    for i in 0..3u64 {
        let r = read_sqe(3000, 0x7000_0000 + i * 0x1000, 0x7000_2000, STAG);
        a.d.post_sqe(&mut a.qp, r);
    }
    a.d.poll();
    for f in a.d.tx.drain(..).collect::<Vec<_>>() {
        let _ = b.d.receive(&f);
    }
    b.d.poll();
    let responses: Vec<_> = b.d.tx.drain(..).collect();
    assert!(
        responses.len() >= 9,
        "3 x 3 response packets, got {}",
        responses.len()
    );
    // the first READ's middle response is lost
    deliver_all_but(&responses, 1, &mut a);
    settle_with_retransmits(&mut a, &mut b);
    for i in 0..3u64 {
        let wc = a.d.poll_cq(1).expect("READ CQE");
        assert_eq!((wc.opcode, wc.syndrome), (op::READ, 0), "READ {i}");
        assert_eq!(
            a.d.mem_read(a.buf + i * 0x1000, 3000),
            remote,
            "READ {i} data"
        );
    }
    assert_eq!(a.d.dev.counters().error_cqes, 0);
}

/// Two QPs of one function talking to each other (rdma-core's tests do
/// this): the frames never leave the function (the fabric would not return
/// them to the port they came from); the device loops them back inside, as
/// an RDMA NIC does, whatever MAC the address vector names.
#[test]
fn qps_of_one_function_reach_each_other_through_loopback() {
    let mut a = side(MAC_A, IP_A, false, 2);
    let (c, q3) = a.d.create_qp(3, false, 1, 256, 64);
    assert_eq!(c.status, 0);
    let mut q3 = q3.unwrap();
    let q2 = a.qp.clone();
    // SMC-R style: no MAC in the AV of QP 2; QP 3's names the function's own.
    let mut av2 = av_to([0; 6], IP_A);
    av2.dmac = [0; 6];
    let av3 = av_to(MAC_A, IP_A);
    for (q, peer, av) in [(2u32, 3u32, av2), (3, 2, av3)] {
        assert_eq!(a.d.modify_qp(q, 1, 1, None, 0, 0, 0, 0).status, 0);
        assert_eq!(
            a.d.modify_qp(q, 2, 1 | 4 | 16 | 32, Some(&av), peer, 0, 0, 7)
                .status,
            0
        );
        assert_eq!(a.d.modify_qp(q, 3, 1 | 8, None, 0, 0, 7, 0).status, 0);
    }
    let data: Vec<u8> = (0..3000u32).map(|i| (i * 13) as u8).collect();
    a.d.mem_write(a.buf, &data);
    // QP 2 WRITEs into the second half of the MR; QP 3 SENDs back.
    a.d.post_recv(&mut a.qp, VA + 0x3000, 64, STAG);
    let mut q2 = q2;
    a.d.post_sqe(
        &mut q2,
        write_sqe(op::WRITE, 3000, VA, VA + 0x2000, STAG, 0),
    );
    a.d.mem_write(a.buf + 0x1000, b"back at you");
    a.d.post_sqe(&mut q3, send_sqe(op::SEND, 11, VA + 0x1000, STAG, 0));
    let mut cqes = Vec::new();
    for _ in 0..50 {
        a.d.poll();
        assert!(a.d.tx.is_empty(), "nothing leaves the function");
        while let Some(wc) = a.d.poll_cq(1) {
            cqes.push(wc);
        }
        if cqes.len() == 3 {
            break;
        }
    }
    assert_eq!(cqes.len(), 3, "{cqes:?}");
    assert!(cqes.iter().all(|w| w.syndrome == 0), "{cqes:?}");
    assert_eq!(a.d.mem_read(a.buf + 0x2000, 3000), data);
    assert_eq!(a.d.mem_read(a.buf + 0x3000, 11), b"back at you");
    assert!(a.d.dev.counters().loopback_frames >= 4);
}

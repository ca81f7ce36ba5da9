//! The emulated erdma (`erdma-device`) driven through the vfio-user edge
//! with no VM: `vfio_user::Client` in this process → UNIX socket →
//! `VfioUserServer` serving `ErdmaDevice`. Guest RAM is a memfd the test
//! `DMA_MAP`s and also maps itself, so it builds the command queue, event
//! queues, CQs, SQ/RQ rings and buffers in "guest memory" as the Linux
//! erdma driver does, while every register access and doorbell is a
//! vfio-user region access, interrupts arrive on eventfds and all device
//! DMA goes through the edge's `DmaTable`. Frames the device sends land in
//! the server's sink; frames from the "fabric" enter with
//! `DeviceHandle::receive` (the daemon's path).
//!
//! The layouts used here are the ones `erdma-device/README.md` documents
//! (learnt from `drivers/infiniband/hw/erdma`); they are written out again
//! on purpose rather than shared with the model-level test driver, so
//! this driver (`common/erdma.rs`) is a second, independent reading of
//! that specification.

mod common;

use common::erdma::*;
use common::TestServer;
use erdma_device::cmdq::{common_op, rdma_op, status, submod};
use erdma_device::qp::{qpa, qps};
use erdma_device::regs::{self, off};
use erdma_device::wqe::op;
use erdma_device::{Counters, ErdmaConfig, ErdmaDevice};
use vfio_bindings::bindings::vfio::VFIO_PCI_MSIX_IRQ_INDEX;
use vfio_user_server::Limits;

/// The driver on `s`, its guest RAM mapped (one DMA region).
fn connect(s: &TestServer<ErdmaDevice>) -> Driver {
    let d = Driver::connect(s.client());
    assert_eq!(s.handle.dma_regions(), 1);
    d
}

fn start(mac: [u8; 6]) -> TestServer<ErdmaDevice> {
    TestServer::start(ErdmaDevice::new(ErdmaConfig::new(mac)), Limits::default())
}

fn counters(s: &TestServer<ErdmaDevice>) -> Counters {
    s.handle.with_device(|d| d.counters())
}

/// The headers of a RoCEv2 (IPv4) frame, read field by field.
#[derive(Debug)]
struct Rocev2<'a> {
    dst: [u8; 6],
    src: [u8; 6],
    ethertype: u16,
    ip_src: [u8; 4],
    ip_dst: [u8; 4],
    ttl: u8,
    ip_checksum_ok: bool,
    udp_sport: u16,
    udp_dport: u16,
    opcode: u8,
    dest_qp: u32,
    ack_req: bool,
    psn: u32,
    /// After the BTH (and any extension header), before pad and ICRC.
    rest: &'a [u8],
}

fn parse_rocev2(f: &[u8]) -> Rocev2<'_> {
    assert!(f.len() >= 14 + 20 + 8 + 12 + 4, "frame too short");
    let ip = &f[14..34];
    assert_eq!(ip[0], 0x45, "IPv4, no options");
    assert_eq!(ip[9], 17, "UDP");
    assert_eq!(
        usize::from(u16::from_be_bytes([ip[2], ip[3]])),
        f.len() - 14,
        "IPv4 total length"
    );
    let sum: u32 = ip
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    let folded = (sum & 0xffff) + (sum >> 16);
    let udp = &f[34..42];
    assert_eq!(
        usize::from(u16::from_be_bytes([udp[4], udp[5]])),
        f.len() - 34,
        "UDP length"
    );
    let bth = &f[42..54];
    let pad = usize::from((bth[1] >> 4) & 3);
    Rocev2 {
        dst: f[0..6].try_into().unwrap(),
        src: f[6..12].try_into().unwrap(),
        ethertype: u16::from_be_bytes([f[12], f[13]]),
        ip_src: ip[12..16].try_into().unwrap(),
        ip_dst: ip[16..20].try_into().unwrap(),
        ttl: ip[8],
        ip_checksum_ok: folded == 0xffff,
        udp_sport: u16::from_be_bytes([udp[0], udp[1]]),
        udp_dport: u16::from_be_bytes([udp[2], udp[3]]),
        opcode: bth[0],
        dest_qp: be32(bth, 4) & 0xff_ffff,
        ack_req: bth[8] & 0x80 != 0,
        psn: be32(bth, 8) & 0xff_ffff,
        rest: &f[54..f.len() - 4 - pad],
    }
}

/// IB BTH opcodes (RC).
const BTH_RC_SEND_ONLY: u8 = 0x04;
const BTH_RC_ACK: u8 = 0x11;

/// Nothing panicked: the server thread runs and no connection was dropped.
fn server_alive(s: &TestServer<ErdmaDevice>) {
    let st = s.handle.stats();
    assert_eq!((st.protocol_panics, st.protocol_errors), (0, 0), "{st:?}");
    assert!(!s.thread.as_ref().unwrap().is_finished());
}

#[test]
fn probe_handshake_and_cmdq_over_vfio_user() {
    let s = start(MAC_A);
    let cfg = ErdmaConfig::new(MAC_A);

    // What lspci and erdma_probe see: IDs, BAR 0 + BAR 2 (64-bit), MSI-X.
    let mut c = s.client();
    let mut cs = [0u8; 64];
    c.region_read(CONFIG, 0, &mut cs).unwrap();
    assert_eq!(u16::from_le_bytes([cs[0], cs[1]]), regs::VENDOR_ID);
    assert_eq!(u16::from_le_bytes([cs[2], cs[3]]), regs::DEVICE_ID);
    assert_eq!(c.region(0).unwrap().size, regs::FUNC_BAR_SIZE);
    assert_eq!(c.region(1).unwrap().size, 0, "upper half of 64-bit BAR 0");
    assert_eq!(c.region(2).unwrap().size, regs::MSIX_BAR_SIZE);
    assert_eq!(cs[0x10] & 0x6, 0x4, "BAR 0 is 64-bit memory");
    let msix = c.get_irq_info(VFIO_PCI_MSIX_IRQ_INDEX).unwrap();
    assert_eq!(msix.count, u32::from(regs::NUM_MSIX_VEC));
    drop(c);
    s.wait_for("first client gone", |st| st.connections == 1);

    let mut d = connect(&s);
    // erdma_probe_dev's reads.
    assert_eq!(d.r32(off::VERSION), cfg.version);
    assert_eq!(d.r32(off::DEV_PROTO), regs::PROTO_ROCEV2);
    assert_eq!(d.r32(off::DEV_ST), 0);
    assert_eq!(d.mac(), MAC_A, "NETDEV_MAC_H/L");
    // INIT before the queues are programmed is refused (counted).
    d.w32(off::DEV_CTRL, regs::CTRL_INIT);
    assert_eq!(d.r32(off::DEV_ST) & regs::ST_INIT_DONE, 0);
    assert_eq!(counters(&s).init_failures, 1);

    d.init_queues();
    // The registers read back, both halves of the >4 GiB addresses.
    assert_eq!(d.r32(off::CMDQ_SQ_ADDR_H), (d.cmd_sq.addr >> 32) as u32);
    assert_eq!(d.r32(off::CMDQ_SQ_ADDR_L), d.cmd_sq.addr as u32);
    assert_eq!(d.r32(off::CMDQ_EQ_ADDR_H), 1);
    assert_eq!(d.r32(off::CMDQ_DEPTH), CMDQ_DEPTH);
    assert_eq!(d.r32(off::AEQ_DEPTH), AEQ_DEPTH);
    assert_eq!(counters(&s).inits, 1);

    // Poll mode: CREATE_EQ completions are found by polling the CQ, with
    // no EQE and no interrupt.
    d.create_ceqs();
    assert_eq!(d.irqs(0), 0, "no interrupt in poll mode");
    let mut eq = d.cmd_eq;
    assert!(d.consume_eqes(&mut eq).is_empty());
    assert_eq!(counters(&s).ceqs_live, u64::from(NCEQS));

    // Event mode.
    d.enter_event_mode();
    let q = d.query_device();
    assert_eq!(q.status, status::OK);
    assert_eq!(q.irqs, 1, "one vector-0 interrupt per completion");
    assert_eq!(d.cmd_eq.ci, 1, "one CMDQ EQE");
    // cap0/cap1 as erdma_dev_attrs_init decodes them, against the defaults.
    let (c0, c1) = (q.r0, q.r1);
    assert_eq!((c0 >> 48) & 0xf, u64::from(cfg.max_gid_log2), "max GID");
    assert_eq!((c0 >> 40) & 0xff, u64::from(cfg.max_cqe_log2), "max CQE");
    assert_eq!(
        (c0 >> 24) & 0xff,
        0x80 | 0x20 | 0x08,
        "ATOMIC|MTT_VA|EXT_DB"
    );
    assert_eq!((c0 >> 16) & 0xff, u64::from(cfg.max_recv_wr_log2));
    assert_eq!((c0 >> 8) & 0xff, u64::from(cfg.max_ah_log2));
    assert_eq!(c0 & 0xff, u64::from(cfg.max_mr_size_log2));
    assert_eq!((c1 >> 32) as u32, cfg.local_dma_key, "local DMA lkey");
    assert_eq!((c1 >> 28) & 0xf, u64::from(cfg.default_cc));
    assert_eq!((c1 >> 16) & 0xfff, u64::from(cfg.qblocks), "max_qp = 1024");
    assert_eq!(c1 & 0xff, u64::from(cfg.max_mw_log2));
    assert_eq!(q.r1 & 0x0000_0000_0000_ff00, 0, "reserved bits clear");

    let fw = d.cmd(submod::COMMON, common_op::QUERY_FW_INFO, &[]);
    assert_eq!(fw.status, status::OK);
    assert_eq!(fw.r0 as u32, cfg.fw_version);
    assert_eq!(fw.irqs, 1);

    // 520 more commands: the SQ (128 commands) wraps four times, the CQ
    // (512 CQEs) and the EQ (128 EQEs) wrap, so owner bits flip; each
    // completion raises vector 0 exactly once.
    for i in 0..520 {
        let c = d.cmd(submod::COMMON, common_op::QUERY_FW_INFO, &[]);
        assert_eq!(
            (c.status, c.r0 as u32, c.irqs),
            (0, cfg.fw_version, 1),
            "{i}"
        );
    }
    assert!(d.cmd_cq.ci > CMDQ_DEPTH && d.cmd_eq.ci > 4 * CMDQ_EQ_DEPTH);
    let q2 = d.query_device();
    assert_eq!((q2.r0, q2.r1), (q.r0, q.r1));

    let c = counters(&s);
    assert_eq!(c.cmd_common_ok, u64::from(NCEQS) + 521);
    assert_eq!(c.cmd_rdma_ok, 2);
    assert_eq!(c.cmd_common_failed + c.cmd_rdma_failed, 0);
    assert_eq!(c.cmd_cqes_written, u64::from(NCEQS) + 523);
    assert_eq!(c.irqs, 523, "event mode only");
    assert_eq!((c.eq_overflows, c.dma_errors), (0, 0));
    let st = s.handle.stats();
    assert_eq!(st.irqs_fired, 523, "every interrupt reached its eventfd");
    assert_eq!((st.irqs_pending, st.dma_refused), (0, 0));
    assert!(d.canary_intact());
    server_alive(&s);
}

#[test]
fn qp_lifecycle_through_the_command_queue() {
    let s = start(MAC_A);
    let mut d = connect(&s);
    d.probe();
    assert_eq!(d.set_gid(0, IP_A), status::OK);
    assert_eq!(d.create_cq(1, 256, 1), status::OK, "CREATE_CQ");
    assert_eq!(d.create_cq(1, 256, 1), status::BAD_OBJECT, "CQN taken");
    assert_eq!(d.create_cq(2, 256, 9), status::INVALID, "no CEQ 9");
    let qp = d.create_qp(2, 1, 256, 64);
    assert_eq!(counters(&s).qps_live, 1);

    // RESET, with the PSNs the QP was created with (0).
    assert_eq!(d.query_qp(2), (status::OK, 0, 0, qps::RESET));
    // RESET → RTS skips states: refused, nothing changes.
    assert_eq!(
        d.modify_qp(2, qps::RTS, qpa::STATE, None, 0),
        status::BAD_STATE
    );
    // RTR without an address vector cannot work for RC.
    assert_eq!(d.modify_qp(2, qps::INIT, TO_INIT, None, 0), status::OK);
    assert_eq!(d.query_qp(2).3, qps::INIT);
    assert_eq!(
        d.modify_qp(2, qps::RTR, qpa::STATE, None, 0),
        status::BAD_STATE
    );
    // RTR with a RoCEv2 AV, destination QPN and RQ PSN.
    let av = Av::to(MAC_B, IP_B);
    assert_eq!(d.modify_qp(2, qps::RTR, TO_RTR, Some(&av), 3), status::OK);
    let (st, _, rq_psn, state) = d.query_qp(2);
    assert_eq!((st, rq_psn, state), (status::OK, PSN, qps::RTR));
    assert_eq!(d.modify_qp(2, qps::RTS, TO_RTS, None, 0), status::OK);
    assert_eq!(d.query_qp(2), (status::OK, PSN, PSN, qps::RTS));
    assert_eq!(s.handle.with_device(|dev| dev.qp_state(2)), Some(qps::RTS));
    // A state past ERROR and an attribute bit that does not exist.
    assert_eq!(d.modify_qp(2, 9, qpa::STATE, None, 0), status::INVALID);
    assert_eq!(d.modify_qp(2, qps::RTS, 0x40, None, 0), status::INVALID);

    // Teardown in the driver's order; the CQ is busy while the QP lives.
    assert_eq!(d.destroy(rdma_op::DESTROY_CQ, 1), status::BAD_STATE);
    assert_eq!(d.destroy(rdma_op::DESTROY_QP, qp.qpn), status::OK);
    assert_eq!(d.destroy(rdma_op::DESTROY_QP, qp.qpn), status::BAD_OBJECT);
    assert_eq!(d.query_qp(2).0, status::BAD_OBJECT);
    assert_eq!(d.destroy(rdma_op::DESTROY_CQ, 1), status::OK);
    assert_eq!(d.destroy(rdma_op::DESTROY_CQ, 1), status::BAD_OBJECT);

    let c = counters(&s);
    assert_eq!((c.qps_live, c.cqs_live), (0, 0));
    // Failed: CQN taken, no CEQ, RESET→RTS, RTR w/o AV, state 9, mask,
    // destroy busy CQ, destroy twice, query gone, destroy CQ twice.
    assert_eq!(c.cmd_rdma_failed, 10);
    assert_eq!(c.cmd_malformed, 10);
    assert_eq!(c.dma_errors, 0);
    assert!(d.canary_intact());
    server_alive(&s);
}

/// A probed device with GID 0, CQ 1 on CEQ 1 (armed), and RC QP `qpn`
/// in RTS towards `peer`.
fn rc_side(s: &TestServer<ErdmaDevice>, ip: [u8; 4], qpn: u32, peer: (Av, u32)) -> (Driver, Qp) {
    let mut d = connect(s);
    d.probe();
    assert_eq!(d.set_gid(0, ip), status::OK);
    assert_eq!(d.create_cq(1, 256, 1), status::OK);
    let qp = d.create_qp(qpn, 1, 256, 64);
    d.qp_to_rts(qpn, &peer.0, peer.1);
    d.arm_cq(1);
    (d, qp)
}

#[test]
fn rc_send_between_two_served_devices() {
    // Two devices, each behind its own server; the test is the fabric,
    // carrying frames from one sink to the other's DeviceHandle::receive.
    let sa = start(MAC_A);
    let sb = start(MAC_B);
    let (mut a, mut qa) = rc_side(&sa, IP_A, 2, (Av::to(MAC_B, IP_B), 3));
    let (mut b, mut qb) = rc_side(&sb, IP_B, 3, (Av::to(MAC_A, IP_A), 2));
    assert_eq!((a.irqs(1), b.irqs(1)), (0, 0), "armed CQs, nothing yet");

    // B posts a receive with the local DMA key (a guest-physical buffer).
    let rbuf = b.alloc(4096, 4096);
    let key = b.local_dma_key;
    b.post_recv(&mut qb, rbuf, 4096, key);
    assert!(sb.frames.lock().unwrap().is_empty());

    // A registers an MR over one page and sends 100 bytes from it.
    let page = a.alloc(4096, 4096);
    const VA: u64 = 0x7000_0000;
    const STAG: u32 = 0x100;
    assert_eq!(a.reg_mr(STAG, VA, 4096, &[page], None), status::OK);
    let msg: Vec<u8> = (0..100u8).map(|i| i.wrapping_mul(7) ^ 0x5a).collect();
    a.write(page + 0x10, &msg);
    a.post_send(&mut qa, send_sqe(100, VA + 0x10, STAG));

    // The SQ doorbell's region write ran the SQ: one frame in A's sink.
    let frames = std::mem::take(&mut *sa.frames.lock().unwrap());
    assert_eq!(frames.len(), 1, "one RoCEv2 frame");
    let send = frames[0].clone();
    let f = parse_rocev2(&send);
    assert_eq!((f.dst, f.src, f.ethertype), (MAC_B, MAC_A, 0x0800));
    assert_eq!((f.ip_src, f.ip_dst, f.ttl), (IP_A, IP_B, 64));
    assert!(f.ip_checksum_ok, "IPv4 header checksum");
    assert_eq!((f.udp_sport, f.udp_dport), (0xc001, 4791));
    assert_eq!(f.opcode, BTH_RC_SEND_ONLY);
    assert_eq!((f.dest_qp, f.psn), (3, PSN));
    assert!(f.ack_req, "last packet of a message asks for an ACK");
    assert_eq!(f.rest, &msg[..], "payload");
    assert!(a.poll_cq(1).is_none(), "no send CQE before the ACK");

    // B takes it (its ICRC check passes), places the data, completes the
    // receive with a CQE + CEQ 1 interrupt, and answers with an ACK.
    sb.handle.receive(&send).unwrap();
    assert_eq!(b.read(rbuf, 100), msg);
    assert_eq!(b.read(rbuf + 100, 4), [0; 4], "nothing past the message");
    assert_eq!(b.irqs(1), 1, "CQ 1 → CEQ 1 → vector 1");
    assert_eq!(b.ceq_events(1), vec![1], "CEQE names CQ 1");
    let wc = b.poll_cq(1).expect("receive CQE");
    assert_eq!(
        wc,
        Wc {
            opcode: op::RECEIVE,
            qtype: 1,
            syndrome: 0,
            qe_idx: 0,
            qpn: 3,
            imm: 0,
            size: 100,
            ud_info: 0,
        }
    );
    assert!(b.poll_cq(1).is_none());
    let acks = std::mem::take(&mut *sb.frames.lock().unwrap());
    assert_eq!(acks.len(), 1, "one ACK");
    let ack = acks[0].clone();
    let f = parse_rocev2(&ack);
    assert_eq!((f.dst, f.src), (MAC_A, MAC_B));
    assert_eq!((f.ip_src, f.ip_dst, f.udp_dport), (IP_B, IP_A, 4791));
    assert_eq!((f.opcode, f.dest_qp, f.psn), (BTH_RC_ACK, 2, PSN));
    assert_eq!(f.rest.len(), 4, "AETH");
    assert_eq!(f.rest[0] >> 5, 0, "AETH syndrome: ACK");

    // The ACK completes A's SEND: CQE on CQ 1 and vector 1.
    sa.handle.receive(&ack).unwrap();
    assert_eq!(a.irqs(1), 1);
    assert_eq!(a.ceq_events(1), vec![1]);
    let wc = a.poll_cq(1).expect("send CQE");
    assert_eq!(
        (wc.opcode, wc.qtype, wc.syndrome, wc.qe_idx, wc.qpn),
        (op::SEND, 0, 0, 0, 2)
    );
    // The driver advances its SQ CI by the WQEBB count of the SQE at qe_idx.
    let hdr = le64(&a.read(qa.sq.addr, 8), 0);
    assert_eq!((hdr >> 52) & 7, 0, "one WQEBB");
    assert!(a.poll_cq(1).is_none());
    assert!(sa.frames.lock().unwrap().is_empty(), "nothing more to send");

    let (ca, cb) = (counters(&sa), counters(&sb));
    assert_eq!((ca.tx_frames, ca.rx_frames, ca.cqes_written), (1, 1, 1));
    assert_eq!((cb.tx_frames, cb.rx_frames, cb.cqes_written), (1, 1, 1));
    assert_eq!(
        (ca.rx_dropped, cb.rx_dropped, cb.rx_drop_bad_icrc),
        (0, 0, 0)
    );
    assert_eq!((ca.wqes_executed, cb.rqes_consumed), (1, 1));
    assert_eq!((ca.dma_errors, cb.dma_errors), (0, 0));
    assert_eq!(
        (sa.handle.stats().frames_out, sb.handle.stats().frames_out),
        (1, 1)
    );
    assert_eq!(a.query_qp(2), (status::OK, PSN + 1, PSN, qps::RTS));
    assert_eq!(b.query_qp(3), (status::OK, PSN, PSN + 1, qps::RTS));
    assert!(a.canary_intact() && b.canary_intact());
    server_alive(&sa);
    server_alive(&sb);
}

/// QEMU sends BAR writes as posted writes (`VFIO_USER_F_NO_REPLY`): the
/// server runs them and answers nothing, and a later read is answered
/// after them, so the client's own request/reply pairs stay matched.
#[test]
fn posted_doorbells_run_the_sq_and_send_no_reply() {
    let sa = start(MAC_A);
    let (mut a, mut qa) = rc_side(&sa, IP_A, 2, (Av::to(MAC_B, IP_B), 3));
    a.post_doorbells(&sa.path);
    let page = a.alloc(4096, 4096);
    const VA: u64 = 0x7000_0000;
    const STAG: u32 = 0x100;
    assert_eq!(a.reg_mr(STAG, VA, 4096, &[page], None), status::OK);
    for _ in 0..8 {
        a.post_send(&mut qa, send_sqe(100, VA, STAG));
    }
    // A command (its doorbell posted too, then a register read): answered
    // after the eight posted SQ doorbells; its reply is the only one.
    assert_eq!(a.query_qp(2).0, status::OK);
    assert_eq!(counters(&sa).wqes_executed, 8);
    assert_eq!(
        sa.frames.lock().unwrap().len(),
        8,
        "eight SENDs on the wire"
    );
    let mut posted = a.posted.as_ref().unwrap();
    posted.set_nonblocking(true).unwrap();
    let mut b = [0u8; 1];
    assert_eq!(
        std::io::Read::read(&mut posted, &mut b).map_err(|e| e.kind()),
        Err(std::io::ErrorKind::WouldBlock),
        "no reply to a posted write"
    );
    server_alive(&sa);
}

#[test]
fn hostile_doorbells_and_commands_get_errors_and_counters() {
    let s = start(MAC_A);
    let mut d = connect(&s);
    // Doorbells before INIT name nothing.
    d.w64(regs::SDB_SHARED_PAGE_INDEX << 12, (2 << 32) | 1);
    d.w64(off::CMDQ_SQDB, 4);
    assert_eq!(counters(&s).bad_doorbells, 2);

    d.probe();
    assert_eq!(d.set_gid(0, IP_A), status::OK);
    assert_eq!(d.create_cq(1, 64, 1), status::OK);
    let qp = d.create_qp(2, 1, 16, 16);
    assert_eq!(d.modify_qp(2, qps::INIT, TO_INIT, None, 0), status::OK);

    // Doorbells naming objects that do not exist or are out of range.
    let before = counters(&s);
    let sdb = regs::SDB_SHARED_PAGE_INDEX << 12;
    d.w64(sdb, (999 << 32) | 1); // QPN in range, no such QP
    d.w64(sdb, (0xf_ffff << 32) | 1); // QPN past the QPN space
    d.w64(regs::RQDB_SPACE, (0xf_ffff << 32) | 1);
    d.w64(regs::CQDB_SPACE, (0xff_ffff << 32) | (1 << 31)); // CQN past
    d.w64(regs::CQDB_SPACE, (7 << 32) | (1 << 31)); // CQ 7 never made
    d.w64(off::CEQ_DB_BASE + 8 * 30, 1 << 31); // CEQ 30 never made
                                               // Producer indices far past the rings of a live QP.
    d.w64(sdb, (u64::from(qp.qpn) << 32) | 1000);
    d.w64(regs::RQDB_SPACE, (u64::from(qp.qpn) << 32) | 1000);
    // Writes that are no register: the registers page, a 2-byte doorbell,
    // a misaligned 8-byte doorbell, a lone high half of a 64-bit register.
    d.w32(0x800, 1);
    d.c.region_write(BAR0, sdb, &[1, 0]).unwrap();
    d.w64(sdb + 4, 1);
    d.w32(off::CMDQ_SQDB + 4, 0);
    let c = counters(&s);
    assert_eq!(c.bad_doorbells, before.bad_doorbells + 8, "{c:?}");
    assert_eq!(c.bad_bar_writes, before.bad_bar_writes + 4, "{c:?}");
    assert_eq!(c.wqes_executed + c.rqes_consumed, 0);
    assert!(d.poll_cq(1).is_none(), "no CQE for a bogus doorbell");
    assert_eq!(d.irqs(1), 0);

    // Commands the device does not know: UNSUPPORTED, counted.
    let unknown = d.cmd(submod::RDMA, 0x7e, &[]);
    assert_eq!(unknown.status, status::UNSUPPORTED);
    assert_eq!((unknown.r0, unknown.r1), (0, 0));
    assert_eq!(d.cmd(submod::COMMON, 0x33, &[]).status, status::UNSUPPORTED);
    assert_eq!(d.cmd(3, 0, &[]).status, status::UNSUPPORTED, "submodule 3");
    // Known commands with arguments out of range: INVALID / BAD_OBJECT.
    let mut req = [0u8; 12];
    put32(&mut req, 8, 1 << 20); // QPN past the space, in DESTROY_QP
    assert_eq!(d.rdma(rdma_op::DESTROY_QP, &req), status::BAD_OBJECT);
    assert_eq!(
        d.modify_qp(0xf_ffff, qps::INIT, TO_INIT, None, 0),
        status::BAD_OBJECT
    );
    let r = d.ring(16, 32);
    assert_eq!(d.create_qp_at(1024, 1, r, r), status::INVALID, "QPN 1024");
    assert_eq!(d.create_qp_at(3, 77, r, r), status::INVALID, "no CQ 77");
    assert_eq!(d.create_cq(5000, 64, 1), status::INVALID, "CQN past");
    let c2 = counters(&s);
    assert_eq!(c2.cmd_unknown, c.cmd_unknown + 3);
    assert_eq!(c2.cmd_malformed, c.cmd_malformed + 5);
    assert_eq!(c2.qps_live, 1);

    // The queue and the QP still work.
    assert_eq!(d.query_device().status, status::OK);
    assert_eq!(d.query_qp(2), (status::OK, 0, 0, qps::INIT));
    assert!(d.canary_intact());
    server_alive(&s);
}

#[test]
fn hostile_addresses_stay_inside_guest_memory() {
    let s = start(MAC_A);
    let mut d = connect(&s);
    d.probe();
    assert_eq!(d.set_gid(0, IP_A), status::OK);
    assert_eq!(d.create_cq(1, 64, 1), status::OK);
    let refused = || s.handle.stats().dma_refused;
    let dma_errors = || counters(&s).dma_errors;
    assert_eq!((refused(), dma_errors()), (0, 0));

    // Rings outside the DMA mapping: past its end, in unmapped space below
    // it, straddling its end (the last element is outside).
    assert_eq!(d.create_cq_at(2, 64, 1, IOVA + RAM), status::DMA_ERROR);
    let ok = d.ring(64, 32);
    let past = Ring {
        addr: IOVA + RAM,
        ..ok
    };
    let below = Ring { addr: 0x1000, ..ok };
    let straddle = Ring {
        addr: IOVA + RAM - 4096,
        depth: 256, // 8 KiB from 4 KiB before the end
        ..ok
    };
    assert_eq!(d.create_qp_at(2, 1, past, ok), status::DMA_ERROR, "SQ past");
    assert_eq!(
        d.create_qp_at(2, 1, ok, below),
        status::DMA_ERROR,
        "RQ below"
    );
    assert_eq!(
        d.create_qp_at(2, 1, straddle, ok),
        status::DMA_ERROR,
        "SQ straddles"
    );
    let c = counters(&s);
    assert_eq!((c.qps_live, c.cqs_live), (0, 1));
    assert_eq!(c.dma_errors, 4);

    // REG_MR whose pages or MTT lie outside guest memory.
    let page = d.alloc(4096, 4096);
    assert_eq!(
        d.reg_mr(0x100, 0, 4096, &[IOVA + RAM], None),
        status::DMA_ERROR,
        "level-0 page past memory"
    );
    assert_eq!(
        d.reg_mr(0x200, 0, 8192, &[0, 0], Some(IOVA + RAM)),
        status::DMA_ERROR,
        "level-1 MTT past memory"
    );
    assert_eq!(
        d.reg_mr(0x300, 0, 8192, &[0, 0], Some(IOVA + RAM - 8)),
        status::DMA_ERROR,
        "level-1 MTT straddling the end of memory"
    );
    // GET_STATS into a target past memory.
    let mut req = [0u8; 28];
    put64(&mut req, 16, IOVA + RAM - 8);
    put32(&mut req, 24, 256);
    let st = d.cmd(submod::COMMON, common_op::GET_STATS, &req).status;
    assert_eq!(st, status::DMA_ERROR);
    assert_eq!(counters(&s).mrs_live, 0);

    // A level-1 MR whose second page is past memory registers (REG_MR
    // reads the table, not the pages it names)...
    let table = d.alloc(16, 4096);
    d.write(table, &page.to_le_bytes());
    d.write(table + 8, &(IOVA + RAM).to_le_bytes());
    const VA: u64 = 0x1000_0000;
    assert_eq!(d.reg_mr(0x400, VA, 8192, &[0, 0], Some(table)), status::OK);
    // ...and a SEND reaching into that page fails with an error CQE
    // (local address violation) and puts the QP in ERROR, which flushes the
    // SEND posted after it. Payload is read packet by packet, as hardware
    // does: what the first page holds may have gone out (path MTU 1024: 4
    // packets), nothing from the page past memory.
    let mut qp = d.create_qp(2, 1, 64, 64);
    d.qp_to_rts(2, &Av::to(MAC_B, IP_B), 3);
    d.arm_cq(1);
    let before = refused();
    d.post_send(&mut qp, send_sqe(8192, VA, 0x400));
    d.post_send(&mut qp, send_sqe(8, VA, 0x400));
    assert!(refused() > before, "the edge refused the read past memory");
    let sent = s.frames.lock().unwrap().len();
    assert!(sent <= 4, "{sent} frames sent");
    let wc = d.poll_cq(1).expect("error CQE");
    assert_eq!(
        (wc.opcode, wc.qtype, wc.qpn, wc.qe_idx),
        (op::SEND, 0, 2, 0)
    );
    assert_eq!(wc.syndrome, 11, "send address violation");
    let wc = d.poll_cq(1).expect("flush CQE");
    assert_eq!((wc.syndrome, wc.qe_idx), (15, 1), "flushed");
    assert!(d.poll_cq(1).is_none());
    assert_eq!(d.irqs(1), 1, "CQ interrupt for the error completion");
    assert_eq!(d.query_qp(2).3, qps::ERROR);

    // Every refused access was counted on both sides of the edge, and the
    // bytes right after guest RAM were never written.
    let c = counters(&s);
    assert!(c.dma_errors >= 9, "{c:?}");
    assert!(refused() >= c.dma_errors, "{:?}", s.handle.stats());
    assert!(d.canary_intact(), "no write outside guest memory");
    assert_eq!(d.query_device().status, status::OK);
    server_alive(&s);
}

#[test]
fn doorbell_flood_over_garbage_sqes_keeps_the_server_up() {
    let s = start(MAC_A);
    let mut d = connect(&s);
    let caps = d.probe();
    assert_eq!(d.set_gid(0, IP_A), status::OK);
    assert_eq!(d.create_cq(1, 64, 1), status::OK);
    let qp = d.create_qp(2, 1, 256, 64);
    d.qp_to_rts(2, &Av::to(MAC_B, IP_B), 3);
    d.arm_cq(1);

    // The whole SQ ring is garbage (xorshift, fixed seed).
    let mut x = 0x1234_5678_9abc_def0u64;
    let mut garbage = vec![0u8; 256 * 32];
    for q in garbage.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        q.copy_from_slice(&x.to_le_bytes());
    }
    d.write(qp.sq.addr, &garbage);

    // 10 000 doorbells: SQ doorbells with wandering producer indices, and
    // every tenth one for a QP that does not exist.
    let before = counters(&s);
    let sdb = regs::SDB_SHARED_PAGE_INDEX << 12;
    for i in 0..10_000u64 {
        let v = if i % 10 == 9 {
            (500 << 32) | i
        } else {
            (u64::from(qp.qpn) << 32) | (i * 37 % 200)
        };
        d.w64(sdb, v);
    }
    let c = counters(&s);
    assert_eq!(c.doorbells, before.doorbells + 10_000, "each one counted");
    assert!(c.bad_doorbells >= before.bad_doorbells + 1000, "{c:?}");
    assert!(c.bad_wqes >= 1, "garbage SQEs refused: {c:?}");
    assert_eq!(d.query_qp(2).3, qps::ERROR, "a bad SQE errors the QP");
    // The CQ holds what the driver needs to recover: one error completion
    // for the first garbage SQE, then a FLUSH completion for every SQE the
    // wandering doorbells exposed after it, all naming QP 2.
    let wcs: Vec<Wc> = std::iter::from_fn(|| d.poll_cq(1)).collect();
    assert_eq!(wcs.len() as u64, c.cqes_written, "{c:?}");
    assert_eq!(c.cq_overruns, 0);
    assert!(![0, 15].contains(&wcs[0].syndrome), "{:?}", wcs[0]);
    assert!(wcs[1..].iter().all(|w| w.syndrome == 15), "{wcs:?}");
    assert!(wcs.iter().all(|w| (w.qpn, w.qtype) == (2, 0)));
    assert_eq!(c.wqes_flushed, wcs.len() as u64 - 1);
    assert_eq!(d.aeq_events().len() as u64, c.async_events);

    // Still the same device behind a working queue.
    let q = d.query_device();
    assert_eq!((q.status, q.r0, q.r1), (status::OK, caps.r0, caps.r1));
    assert!(d.canary_intact());
    server_alive(&s);
}

//! Device faults (the driver bench) and the device trace, without a VM: a
//! driver stand-in meets each fault kind as the 7.3 driver would.

mod common;

use common::rc::*;
use common::*;
use erdma_device::qp::qps;
use erdma_device::wqe::op;
use pci_model::{FaultError, FaultSpec, PciDevice, TraceKind};

fn side(mac: [u8; 6], ip: [u8; 4], qpn: u32) -> Side {
    rc::side(Driver::new(mac), ip, false, qpn, (256, 256, 64), 4)
}

fn add(d: &mut Driver, id: u32, spec: &FaultSpec) -> Result<(), FaultError> {
    d.with_io(|dev, io| dev.add_fault(id, spec, io))
}

fn clear(d: &mut Driver, id: Option<u32>) {
    d.with_io(|dev, io| dev.clear_faults(id, io)).unwrap();
}

fn hits(d: &Driver, id: u32) -> u64 {
    d.dev
        .faults()
        .iter()
        .find(|f| f.id == id)
        .map_or(u64::MAX, |f| f.hits)
}

fn query_qp(d: &mut Driver, qpn: u32) -> u64 {
    let mut req = [0u8; 16];
    req[8..12].copy_from_slice(&qpn.to_le_bytes());
    let c = d.cmd(0, 17, &req);
    assert_eq!(c.status, 0);
    c.r0
}

#[test]
fn kinds_parameters_and_refusals() {
    let mut d = Driver::new(MAC_A);
    d.probe(1);
    let kinds: Vec<&str> = d.dev.fault_kinds().iter().map(|k| k.name).collect();
    assert_eq!(
        kinds,
        [
            "cmdq-timeout",
            "cmd-status",
            "aeq",
            "cqe-status",
            "qp-stall",
            "port-down",
            "port-up"
        ]
    );
    let bad = [
        FaultSpec::new("nope"),
        FaultSpec::new("cmd-status").param("status", 0),
        FaultSpec::new("cmd-status"),
        FaultSpec::new("cmd-status")
            .param("status", 1)
            .param("opcode", "BOGUS"),
        FaultSpec::new("cmdq-timeout").param("qpn", 1),
        FaultSpec::new("aeq").param("event", "QP_FATAL"),
        FaultSpec::new("aeq").param("event", "NOPE").param("qpn", 1),
        FaultSpec::new("aeq")
            .param("event", 0)
            .param("qpn", 1)
            .param("cqn", 1),
        FaultSpec::new("cqe-status").param("status", "SUCCESS"),
        FaultSpec::new("cqe-status").param("status", "NOT_A_STATUS"),
        FaultSpec::new("qp-stall"),
        FaultSpec::new("port-down").param("x", 1),
    ];
    for (i, s) in bad.iter().enumerate() {
        assert!(add(&mut d, i as u32, s).is_err(), "{s:?} accepted");
    }
    assert!(d.dev.faults().is_empty());
    // Names in any case, with or without the prefix; numbers; common:N.
    let good = [
        FaultSpec::new("cmd-status")
            .param("opcode", "cmdq_opcode_create_qp")
            .param("status", "0x42"),
        FaultSpec::new("cmdq-timeout").param("opcode", "common:3"),
        FaultSpec::new("cqe-status")
            .param("status", "ERDMA_WC_RETRY_EXC_ERR")
            .param("opcode", "send")
            .param("qpn", 7),
        // Past the enum: the drivers map it to GENERAL_ERR.
        FaultSpec::new("cqe-status").param("status", 200),
    ];
    for (i, s) in good.iter().enumerate() {
        add(&mut d, 100 + i as u32, s).unwrap_or_else(|e| panic!("{s:?}: {e}"));
    }
    assert!(add(
        &mut d,
        200,
        &FaultSpec::new("cqe-status").param("status", 300)
    )
    .is_err());
    assert_eq!(
        add(&mut d, 100, &good[0]),
        Err(FaultError::DuplicateId(100))
    );
    let st = d.dev.faults();
    assert_eq!(st.len(), 4);
    assert!(st.iter().all(|f| f.hits == 0 && f.matched == 0));
    clear(&mut d, None);
    assert!(d.dev.faults().is_empty());
}

/// cmdq-timeout: the command gets no completion and is not executed; the
/// device goes on with the next command (the 7.3 driver sends none: it
/// clears ERDMA_CMDQ_STATE_OK_BIT after ERDMA_CMDQ_TIMEOUT_MS).
#[test]
fn cmdq_timeout_drops_the_matching_command() {
    let mut d = Driver::new(MAC_A);
    d.probe(1);
    add(
        &mut d,
        1,
        &FaultSpec::new("cmdq-timeout").param("opcode", "CREATE_CQ"),
    )
    .unwrap();
    // A command of another opcode is not matched.
    assert_eq!(d.set_gid(0, v4_gid(IP_A)).status, 0);
    let before = d.dev.counters().cmd_cqes_written;
    let buf = d.alloc(64 * 32, 4096);
    let mut req = [0u8; 40];
    req[8..12].copy_from_slice(&(5u32 | (6 << 24)).to_le_bytes());
    req[12..16].copy_from_slice(&(buf as u32).to_le_bytes());
    req[16..20].copy_from_slice(&((buf >> 32) as u32).to_le_bytes());
    req[20..24].copy_from_slice(&((1u32 << 16) | 1).to_le_bytes());
    assert!(d.try_cmd(0, 4, &req).is_none(), "no completion");
    assert_eq!(d.dev.counters().cmd_cqes_written, before);
    assert_eq!(hits(&d, 1), 1);
    // Not executed: the same CQN can be created now (count spent).
    assert_eq!(d.create_cq(5, 64, 1).status, 0);
    assert_eq!(d.dev.counters().cqs_live, 1);
}

#[test]
fn cmd_status_fails_the_command_without_running_it() {
    let mut d = Driver::new(MAC_A);
    d.probe(1);
    assert_eq!(d.create_cq(1, 64, 1).status, 0);
    let mut spec = FaultSpec::new("cmd-status")
        .param("opcode", "CREATE_QP")
        .param("status", 0x42);
    spec.count = Some(2);
    add(&mut d, 3, &spec).unwrap();
    let (c, _) = d.create_qp(2, false, 1, 64, 64);
    assert_eq!(c.status, 0x42);
    assert_eq!(d.dev.qp_state(2), None, "not executed");
    let (c, _) = d.create_qp(2, false, 1, 64, 64);
    assert_eq!(c.status, 0x42);
    let (c, _) = d.create_qp(2, false, 1, 64, 64);
    assert_eq!(c.status, 0, "count spent");
    assert_eq!(d.dev.qp_state(2), Some(qps::RESET));
    let st = &d.dev.faults()[0];
    assert!(st.spent && st.hits == 2, "{st:?}");
}

/// aeq: the entry the driver's erdma_aeq_event_handler reads (type in
/// 23:16, event_data0), with the interrupt on vector 0.
#[test]
fn aeq_writes_the_event_now() {
    let (mut a, _b) = pair();
    let d = &mut a.d;
    d.irqs.clear();
    add(
        d,
        1,
        &FaultSpec::new("aeq")
            .param("event", "ACC_ERR_EVENT")
            .param("qpn", 2),
    )
    .unwrap();
    assert!(d.irqs.contains(&0), "{:?}", d.irqs);
    add(
        d,
        2,
        &FaultSpec::new("aeq")
            .param("event", "cq_err")
            .param("cqn", 1),
    )
    .unwrap();
    assert_eq!(d.drain_aeq(), vec![(2, 2), (3, 1)]);
    assert_eq!(d.dev.qp_state(2), Some(qps::RTS), "event only");
    assert_eq!((hits(d, 1), hits(d, 2)), (1, 1));
    // error=yes: the QP goes to ERROR too.
    add(
        d,
        3,
        &FaultSpec::new("aeq")
            .param("event", "QP_FATAL")
            .param("qpn", 2)
            .param("error", "yes"),
    )
    .unwrap();
    assert_eq!(d.drain_aeq(), vec![(0, 2)]);
    assert_eq!(d.dev.qp_state(2), Some(qps::ERROR));
}

/// cqe-status: the matching CQE carries the status (ERDMA_WC_RETRY_EXC_ERR
/// -> IB_WC_RETRY_EXC_ERR in both drivers); the QP then flushes.
#[test]
fn cqe_status_on_the_chosen_qp_and_opcode() {
    let (mut a, mut b) = pair();
    add(
        &mut a.d,
        1,
        &FaultSpec::new("cqe-status")
            .param("status", "RETRY_EXC_ERR")
            .param("qpn", 2)
            .param("opcode", "SEND"),
    )
    .unwrap();
    // On B (no rule) the receive completes normally.
    b.d.post_recv(&mut b.qp, 0x7000_0000, 64, STAG);
    b.d.post_recv(&mut b.qp, 0x7000_0100, 64, STAG);
    b.d.poll();
    a.d.post_sqe(&mut a.qp, send_sqe(op::SEND, 8, 0x7000_0000, STAG, 0));
    shuttle(&mut a, &mut b);
    let w1 = a.d.poll_cq(1).expect("first send CQE");
    assert_eq!((w1.opcode, w1.syndrome), (op::SEND, 16));
    assert_eq!(a.d.dev.qp_state(2), Some(qps::ERROR));
    a.d.post_sqe(&mut a.qp, send_sqe(op::SEND, 8, 0x7000_0000, STAG, 0));
    a.d.poll();
    let w2 = a.d.poll_cq(1).expect("second send CQE");
    assert_eq!(w2.syndrome, 15, "flushed after the error");
    assert_eq!(b.d.poll_cq(1).unwrap().syndrome, 0);
    assert_eq!(hits(&a.d, 1), 1);
}

/// qp-stall: the SQ is not executed until the rule is cleared.
#[test]
fn qp_stall_holds_the_sq_until_cleared() {
    let (mut a, mut b) = pair();
    add(&mut a.d, 9, &FaultSpec::new("qp-stall").param("qpn", 2)).unwrap();
    recv_then_send(&mut a, &mut b);
    for _ in 0..3 {
        a.d.poll();
    }
    assert!(a.d.tx.is_empty(), "stalled");
    assert_eq!(a.d.dev.counters().wqes_executed, 0);
    let st = a.d.dev.faults();
    assert_eq!(
        (st[0].hits, st[0].matched),
        (1, 1),
        "held work counted once: {st:?}"
    );
    clear(&mut a.d, Some(9));
    shuttle(&mut a, &mut b);
    assert_eq!(a.d.poll_cq(1).unwrap().syndrome, 0);
    assert_eq!(b.d.poll_cq(1).unwrap().syndrome, 0);
}

/// port-down: nothing leaves or enters until the port is up again; RC then
/// retransmits and completes.
#[test]
fn port_down_and_up() {
    let (mut a, mut b) = pair();
    add(&mut a.d, 1, &FaultSpec::new("port-down")).unwrap();
    recv_then_send(&mut a, &mut b);
    a.d.poll();
    assert!(a.d.tx.is_empty(), "nothing sent while down");
    assert!(a.d.dev.counters().port_down_drops >= 1);
    // Nothing is taken either (refused before it is even parsed).
    let c0 = a.d.dev.counters();
    assert!(a.d.receive(&[0u8; 60]).is_err());
    let c1 = a.d.dev.counters();
    assert_eq!(c1.port_down_drops, c0.port_down_drops + 1);
    assert_eq!(c1.rx_drop_not_roce, c0.rx_drop_not_roce);
    // Clearing the rule brings the port up: the retransmit goes out.
    clear(&mut a.d, Some(1));
    a.d.now += std::time::Duration::from_secs(5);
    shuttle(&mut a, &mut b);
    assert_eq!(a.d.poll_cq(1).unwrap().syndrome, 0);
    assert_eq!(b.d.poll_cq(1).unwrap().syndrome, 0);
    // set_link does the same; a port-up rule undoes it.
    assert!(a.d.with_io(|dev, io| dev.set_link(false, io)));
    a.d.post_sqe(&mut a.qp, send_sqe(op::SEND, 8, 0x7000_0000, STAG, 0));
    a.d.poll();
    assert!(a.d.tx.is_empty());
    add(&mut a.d, 2, &FaultSpec::new("port-up")).unwrap();
    a.d.now += std::time::Duration::from_secs(5);
    a.d.poll();
    assert_eq!(a.d.tx.len(), 1, "up again");
}

/// QUERY_QP reports sq_draining (bit 56) in SQD while SQ work is inside
/// the engine.
#[test]
fn query_qp_reports_sq_draining() {
    let (mut a, mut b) = pair();
    recv_then_send(&mut a, &mut b);
    a.d.poll();
    assert_eq!(a.d.tx.len(), 1);
    assert_eq!(a.d.modify_qp(2, qps::SQD, 1, None, 0, 0, 0, 0).status, 0);
    let r0 = query_qp(&mut a.d, 2);
    assert_eq!((r0 >> 48) & 0xff, u64::from(qps::SQD));
    assert_eq!(r0 >> 56 & 1, 1, "draining: {r0:#x}");
    shuttle(&mut a, &mut b);
    assert_eq!(query_qp(&mut a.d, 2) >> 56 & 1, 0, "drained");
}

/// The trace: commands with their fields and status, doorbells, CQEs,
/// AEQEs and faults, decoded with the driver's names; nothing when off.
#[test]
fn trace_decodes_commands_doorbells_completions_and_faults() {
    let mut a = side(MAC_A, IP_A, 2);
    assert!(a.d.trace.is_empty(), "no trace unless asked");
    let mut b = side(MAC_B, IP_B, 3);
    a.d.tracing = true;
    connect(&mut a, &mut b);
    recv_then_send(&mut a, &mut b);
    shuttle(&mut a, &mut b);
    add(
        &mut a.d,
        4,
        &FaultSpec::new("aeq")
            .param("event", "QP_FATAL")
            .param("qpn", 2),
    )
    .unwrap();
    let text: Vec<String> =
        a.d.trace
            .iter()
            .map(|r| format!("{} {}", r.kind, r.text))
            .collect();
    let has = |kind: TraceKind, s: &str| {
        a.d.trace
            .iter()
            .any(|r| r.kind == kind && r.text.contains(s))
    };
    assert!(
        has(TraceKind::Command, "CMDQ_OPCODE_MODIFY_QP qpn=2 state=3"),
        "{text:#?}"
    );
    assert!(has(TraceKind::Command, "-> status 0"), "{text:#?}");
    assert!(has(TraceKind::Doorbell, "CMDQ SQ pi="), "{text:#?}");
    assert!(has(TraceKind::Doorbell, "SQ qpn=2 pi=1"), "{text:#?}");
    assert!(
        has(TraceKind::Completion, "cqn=1 qpn=2 SQ SEND idx=0"),
        "{text:#?}"
    );
    assert!(has(TraceKind::Completion, "status=SUCCESS"), "{text:#?}");
    assert!(
        has(TraceKind::Fault, "rule 4 aeq QP_FATAL_EVENT"),
        "{text:#?}"
    );
    assert!(
        has(TraceKind::Event, "AEQE QP_FATAL_EVENT data0=2"),
        "{text:#?}"
    );
    // Register names for the edge's records.
    assert_eq!(
        a.d.dev.register_name(0, 0x14),
        Some("ERDMA_REGS_DEV_ST_REG")
    );
    assert_eq!(a.d.dev.register_name(0, 0x204), Some("ERDMA_CMDQ_SQDB_REG"));
    assert_eq!(a.d.dev.register_name(0, 0x58), None);
    assert_eq!(a.d.dev.register_name(2, 0x2000), Some("MSI-X PBA"));
    assert!(b.d.trace.is_empty());
}

/// cqe-status on a UD QP: that datagram's CQE carries the status, the QP
/// keeps its state and the next send succeeds.
#[test]
fn cqe_status_on_a_ud_qp_leaves_it_running() {
    let mut a = rc::side(Driver::new(MAC_A), IP_A, true, 1, (256, 256, 64), 4);
    gsi_to_rts(&mut a.d);
    ah_5_to_b(&mut a.d);
    add(
        &mut a.d,
        1,
        &FaultSpec::new("cqe-status")
            .param("status", "SEND_WQE_FORMAT_ERR")
            .param("qpn", 1),
    )
    .unwrap();
    let s = ud_send_sqe(64);
    for want in [8, 0] {
        a.d.post_sqe(&mut a.qp, s.clone());
        a.d.poll();
        let wc = a.d.poll_cq(1).expect("UD send CQE");
        assert_eq!((wc.opcode, wc.syndrome), (op::SEND, want));
        assert_eq!(a.d.dev.qp_state(1), Some(qps::RTS));
    }
}

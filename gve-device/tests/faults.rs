//! Device faults (the driver bench), the NIC stats report, register names
//! and the device trace, against the test driver of `common` (what the
//! gve 7.3 driver reads and expects in each case is in README.md).

mod common;

use std::time::Duration;

use common::*;
use gve_device::adminq::{opcode, status};
use gve_device::stats;
use gve_device::tx_dqo::{
    ALT_MISS_COMPL_BIT, COMPL_DESC, COMPL_MISS, COMPL_PKT, COMPL_REINJECTION,
};
use gve_device::{layout, regs, GveConfig};
use pci_model::fault::{FaultError, FaultSpec};
use pci_model::{PciDevice, RxRefusal, TraceKind};

const A: [u8; 4] = [10, 0, 0, 1];
const B: [u8; 4] = [10, 0, 0, 2];
const DEADLINE_EXCEEDED: u32 = 0xffff_fff4;

fn up(nq: u32) -> Guest {
    let mut g = Guest::new(GveConfig::default());
    g.probe();
    g.open(nq, 64, 2048, true);
    g.irqs.clear();
    g
}

fn mgmt_vector(g: &Guest) -> u16 {
    // ntfy_blk_msix_base_idx 0: the management vector follows the blocks.
    g.num_ntfy as u16
}

fn frame(sport: u16) -> Vec<u8> {
    tcp4(A, B, sport, 80, 1, 0x18, b"payload bytes")
}

/// A frame of `sport` that RSS sends to queue `q`.
fn frame_for(g: &Guest, q: usize) -> Vec<u8> {
    (1000..3000)
        .map(frame)
        .find(|f| g.rx_queue(f) == q)
        .expect("some flow hashes to the queue")
}

fn mtu_cmd(mtu: u64) -> [u8; 64] {
    cmd(
        opcode::SET_DRIVER_PARAMETER,
        &[&1u32.to_be_bytes()[..], &[0; 4], &mtu.to_be_bytes()].concat(),
    )
}

#[test]
fn kinds_are_listed_and_specs_checked() {
    let mut g = up(1);
    let names: Vec<_> = g.dev.fault_kinds().iter().map(|k| k.name).collect();
    for k in [
        "reset-request",
        "link-down",
        "link-up",
        "adminq-status",
        "adminq-timeout",
        "tx-miss",
        "tx-stall",
        "rx-error",
        "rx-bad-csum",
        "rx-bad-buf-id",
    ] {
        assert!(names.contains(&k), "{k} missing from {names:?}");
    }
    assert!(matches!(
        g.add_fault(1, &FaultSpec::new("qp-stall")),
        Err(FaultError::UnknownKind { .. })
    ));
    assert!(matches!(
        g.add_fault(1, &FaultSpec::new("adminq-status").param("status", "NOPE")),
        Err(FaultError::BadValue { .. })
    ));
    g.add_fault(1, &FaultSpec::new("rx-error").param("queue", 0))
        .unwrap();
    assert_eq!(
        g.add_fault(1, &FaultSpec::new("rx-error")),
        Err(FaultError::DuplicateId(1))
    );
    assert_eq!(g.dev.faults().len(), 1, "a refused rule is not listed");
    assert_eq!(g.clear_faults(Some(7)), Err(FaultError::NoSuchRule(7)));
    g.clear_faults(None).unwrap();
    assert!(g.dev.faults().is_empty());
}

#[test]
fn reset_request_sets_the_status_bit_and_raises_the_management_vector() {
    let mut g = up(1);
    g.add_fault(1, &FaultSpec::new("reset-request")).unwrap();
    assert_eq!(g.irqs, vec![mgmt_vector(&g)]);
    let st = g.reg_r32(regs::DEVICE_STATUS);
    assert_ne!(st & regs::device_status::RESET, 0, "{st:#x}");
    assert_ne!(st & regs::device_status::LINK, 0, "link stays up");
    let f = &g.dev.faults()[0];
    assert_eq!((f.hits, f.spent), (1, true));
    // gve_reset -> gve_adminq_release: the device resets, the bit goes.
    g.reg_w32(regs::DRIVER_STATUS, regs::driver_status::RESET);
    let st = g.reg_r32(regs::DEVICE_STATUS);
    assert_eq!(st & regs::device_status::RESET, 0);
    assert_ne!(st & regs::device_status::DEVICE_IS_RESET, 0);
}

#[test]
fn link_down_rule_until_cleared_and_ctl_link() {
    let mut g = up(1);
    let f = frame(1000);
    g.add_fault(3, &FaultSpec::new("link-down")).unwrap();
    assert_eq!(g.irqs, vec![mgmt_vector(&g)]);
    assert_eq!(
        g.reg_r32(regs::DEVICE_STATUS) & regs::device_status::LINK,
        0
    );
    assert_eq!(
        g.receive(&f),
        Err(RxRefusal::NotReady),
        "no frames on a down link"
    );
    // Clearing the rule that took the link down brings it back.
    g.clear_faults(Some(3)).unwrap();
    assert_eq!(g.irqs.len(), 2);
    assert_ne!(
        g.reg_r32(regs::DEVICE_STATUS) & regs::device_status::LINK,
        0
    );
    assert_eq!(g.receive(&f), Ok(()));
    // `ctl link` goes the same way; a rule cleared after it changes nothing.
    assert!(g.set_link(false));
    assert_eq!(
        g.reg_r32(regs::DEVICE_STATUS) & regs::device_status::LINK,
        0
    );
    g.add_fault(4, &FaultSpec::new("link-up")).unwrap();
    assert_ne!(
        g.reg_r32(regs::DEVICE_STATUS) & regs::device_status::LINK,
        0
    );
    g.add_fault(5, &FaultSpec::new("link-down")).unwrap();
    assert!(g.set_link(false));
    g.clear_faults(Some(5)).unwrap();
    assert_eq!(
        g.reg_r32(regs::DEVICE_STATUS) & regs::device_status::LINK,
        0,
        "ctl link took the link over from the rule"
    );
    // A function-level reset keeps the port's link as it is.
    g.dev.reset();
    assert_eq!(
        g.reg_r32(regs::DEVICE_STATUS) & regs::device_status::LINK,
        0
    );
}

#[test]
fn adminq_status_fails_the_matching_command_unexecuted() {
    let mut g = up(1);
    g.add_fault(
        1,
        &FaultSpec::new("adminq-status")
            .param("opcode", "ADD_FLOW_RULE")
            .param("status", "DEADLINE_EXCEEDED"),
    )
    .unwrap();
    g.add_fault(
        2,
        &FaultSpec::new("adminq-status")
            .param("opcode", "gve_adminq_set_driver_parameter")
            .param("status", "0xfffffffc"),
    )
    .unwrap();
    // Another command, and the flow-rule DEL, do not match rule 1.
    assert_eq!(flow_rule_cmd(&mut g, 1, 3, B, None, 0), status::NOT_FOUND);
    assert_eq!(flow_rule_cmd(&mut g, 0, 3, B, None, 0), DEADLINE_EXCEEDED);
    assert!(g.dev.status().flow_rules.is_empty(), "not executed");
    assert_eq!(
        flow_rule_cmd(&mut g, 0, 3, B, None, 0),
        status::PASSED,
        "count 1: spent"
    );
    assert_eq!(g.dev.status().flow_rules.len(), 1);
    assert_eq!(g.adminq_cmd(mtu_cmd(1400)), 0xffff_fffc);
    assert_eq!(g.dev.status().mtu, 1500, "the MTU did not change");
    let st = g.dev.faults();
    assert_eq!((st[0].hits, st[1].hits), (1, 1));
    assert_eq!(g.dev.counters().faults_fired, 2);
}

#[test]
fn adminq_timeout_stops_the_event_counter_until_reset() {
    let mut g = up(1);
    g.add_fault(
        1,
        &FaultSpec::new("adminq-timeout").param("opcode", "SET_DRIVER_PARAMETER"),
    )
    .unwrap();
    // gve_adminq_kick_and_wait over three commands: the second never
    // completes, the third is not run.
    let first = g.prod;
    let cmds = [
        cmd(opcode::REPORT_LINK_SPEED, &g.alloc(8, 8).to_be_bytes()),
        mtu_cmd(1400),
        cmd(opcode::DESTROY_TX_QUEUE, &0u32.to_be_bytes()),
    ];
    for c in &cmds {
        let slot = u64::from(g.prod % 64);
        let at = g.adminq + slot * 64;
        g.write(at, c);
        g.prod += 1;
    }
    let prod = g.prod;
    g.reg_w32(regs::ADMINQ_DOORBELL, prod);
    assert_eq!(g.reg_r32(regs::ADMINQ_EVENT_COUNTER), first + 1);
    let st = |g: &Guest, i: u32| be32(&g.read(g.adminq + u64::from(i % 64) * 64, 8), 4);
    assert_eq!(st(&g, first), status::PASSED);
    assert_eq!(st(&g, first + 1), status::UNSET, "no completion");
    assert_eq!(st(&g, first + 2), status::UNSET, "not run");
    assert_eq!(g.dev.status().mtu, 1500);
    assert_eq!(
        g.dev.status().tx_queues.len(),
        1,
        "DESTROY_TX_QUEUE not run"
    );
    // Another doorbell does not unstick it.
    g.reg_w32(regs::ADMINQ_DOORBELL, prod);
    assert_eq!(g.reg_r32(regs::ADMINQ_EVENT_COUNTER), first + 1);
    assert_eq!(g.dev.counters().admin_timeouts, 1);
    // gve_reset: release the admin queue (the device resets), set it up
    // again: commands run.
    g.reg_w32(regs::DRIVER_STATUS, regs::driver_status::RESET);
    assert_ne!(
        g.reg_r32(regs::DEVICE_STATUS) & regs::device_status::DEVICE_IS_RESET,
        0
    );
    assert_eq!(g.reg_r32(regs::ADMINQ_EVENT_COUNTER), 0);
    g.adminq_setup();
    assert_eq!(g.adminq_cmd(mtu_cmd(1400)), status::PASSED);
    assert_eq!(g.dev.status().mtu, 1400);
}

#[test]
fn tx_miss_with_and_without_reinjection() {
    let mut g = up(1);
    let f = frame(1000);
    g.add_fault(
        1,
        &FaultSpec::new("tx-miss")
            .param("queue", 0)
            .param("reinject", "yes"),
    )
    .unwrap();
    g.send(0, &[&f], None, false, 7, true);
    let c = g.tx_completions(0);
    let types: Vec<_> = c.iter().map(|&(t, v, _)| (t, v)).collect();
    assert_eq!(types[0], (COMPL_MISS, 7), "{c:?}");
    assert_eq!(types[1].0, COMPL_DESC);
    assert_eq!(types[2], (COMPL_REINJECTION, 7));
    assert_eq!(g.wire.len(), 1, "a reinjected packet is sent");
    // reinject=no: a miss, no reinjection, nothing sent.
    g.add_fault(2, &FaultSpec::new("tx-miss").param("reinject", "no"))
        .unwrap();
    g.send(0, &[&f], None, false, 8, true);
    let c = g.tx_completions(0);
    assert_eq!((c[0].0, c[0].1), (COMPL_MISS, 8), "{c:?}");
    assert!(c
        .iter()
        .all(|&(t, _, _)| t != COMPL_REINJECTION && t != COMPL_PKT));
    assert_eq!(g.wire.len(), 1, "dropped");
    assert_eq!(g.dev.counters().tx_miss_dropped, 1);
    // Rules spent: the next packet completes normally.
    g.send(0, &[&f], None, false, 9, true);
    assert_eq!(g.tx_completions(0)[0], (COMPL_PKT, 9, 0));
    assert_eq!(g.wire.len(), 2);
}

#[test]
fn tx_miss_uses_the_alternate_form_when_the_driver_has_the_capability() {
    let mut g = up(1);
    // gve_verify_driver_compatibility with GVE_DRIVER_CAPABILITY_FLAGS1
    // (alt_miss_compl is bit 4).
    let info = g.alloc(304, 64);
    let mut b = vec![1u8, 1, 0, 0];
    b.extend_from_slice(&[0; 12]);
    b.extend_from_slice(&0x7bu64.to_be_bytes());
    g.write(info, &b);
    let st = g.adminq_cmd(cmd(
        opcode::VERIFY_DRIVER_COMPATIBILITY,
        &[&304u64.to_be_bytes()[..], &info.to_be_bytes()].concat(),
    ));
    assert_eq!(st, status::PASSED);
    g.add_fault(1, &FaultSpec::new("tx-miss")).unwrap();
    g.send(0, &[&frame(1)], None, false, 5, true);
    let c = g.tx_completions(0);
    assert_eq!(
        (c[0].0, c[0].1),
        (COMPL_PKT, 5 | ALT_MISS_COMPL_BIT),
        "{c:?}"
    );
    assert_eq!(c.last().map(|c| (c.0, c.1)), Some((COMPL_REINJECTION, 5)));
}

#[test]
fn tx_stall_holds_the_queue_until_cleared() {
    let mut g = up(2);
    g.add_fault(1, &FaultSpec::new("tx-stall").param("queue", 1))
        .unwrap();
    let f = frame(1000);
    g.send(1, &[&f], None, false, 1, true);
    g.send(1, &[&f], None, false, 2, true);
    assert!(g.tx_completions(1).is_empty(), "stalled: no completion");
    assert!(g.wire.is_empty());
    assert_eq!(
        g.dev.next_timeout(g.now),
        None,
        "a stalled queue asks for no poll"
    );
    g.send(0, &[&f], None, false, 3, true);
    assert_eq!(g.tx_completions(0)[0], (COMPL_PKT, 3, 0), "queue 0 runs");
    let st = &g.dev.faults()[0];
    assert_eq!(st.hits, 1);
    // Still stalled after the count is spent: it lasts until cleared.
    g.poll();
    assert!(g.tx_completions(1).is_empty());
    g.clear_faults(Some(1)).unwrap();
    let tags: Vec<_> = g
        .tx_completions(1)
        .into_iter()
        .filter(|c| c.0 == COMPL_PKT)
        .map(|c| c.1)
        .collect();
    assert_eq!(tags, vec![1, 2]);
    assert_eq!(g.wire.len(), 3);
}

#[test]
fn rx_error_one_completion_and_the_frame_dropped() {
    let mut g = up(1);
    g.add_fault(1, &FaultSpec::new("rx-error").param("queue", 0))
        .unwrap();
    let avail = g.dev.status().rx_queues[0].buffers_available;
    g.receive(&frame(1000)).unwrap();
    let c = g.rx_completions(0);
    assert_eq!(c.len(), 1);
    assert!(c[0].rx_error && c[0].eop, "{c:?}");
    assert_eq!(c[0].buf_id, 0, "the buffer it used, returned to the driver");
    assert_eq!(g.dev.status().rx_queues[0].buffers_available, avail - 1);
    assert_eq!(g.dev.counters().rx_queues[0].drops, 1);
    // The next frame is normal.
    g.receive(&frame(1000)).unwrap();
    let c = g.rx_completions(0);
    assert!(!c[0].rx_error && c.last().unwrap().eop);
}

#[test]
fn rx_error_on_another_queue_does_not_fire() {
    let mut g = up(2);
    g.add_fault(1, &FaultSpec::new("rx-error").param("queue", 1))
        .unwrap();
    let f = frame_for(&g, 0);
    g.receive(&f).unwrap();
    assert!(!g.rx_completions(0)[0].rx_error);
    assert_eq!(g.dev.faults()[0].hits, 0);
    let f = frame_for(&g, 1);
    g.receive(&f).unwrap();
    assert!(g.rx_completions(1)[0].rx_error);
}

#[test]
fn rx_bad_csum_sets_the_error_bits_and_delivers() {
    let mut g = up(1);
    g.add_fault(1, &FaultSpec::new("rx-bad-csum")).unwrap();
    let f = frame(1000);
    g.receive(&f).unwrap();
    let c = g.rx_completions(0);
    assert!(
        c[0].l3_l4_processed && c[0].csum_l4_err && !c[0].csum_ip_err,
        "{c:?}"
    );
    assert!(!c[0].rx_error);
    assert_eq!(g.assemble(0, &c), f, "the frame itself is intact");
    g.add_fault(2, &FaultSpec::new("rx-bad-csum").param("bits", "both"))
        .unwrap();
    g.receive(&f).unwrap();
    let c = g.rx_completions(0);
    assert!(c[0].csum_l4_err && c[0].csum_ip_err);
    assert_eq!(g.dev.counters().rx_queues[0].csum_errors, 2);
    g.receive(&f).unwrap();
    let c = g.rx_completions(0);
    assert!(c[0].l3_l4_processed && !c[0].csum_l4_err && !c[0].csum_ip_err);
}

#[test]
fn rx_bad_buf_id_writes_an_id_never_posted() {
    let mut g = up(1);
    let mut spec = FaultSpec::new("rx-bad-buf-id");
    spec.count = Some(2);
    g.add_fault(1, &spec).unwrap();
    for _ in 0..3 {
        g.receive(&frame(1000)).unwrap();
    }
    let c = g.rx_completions(0);
    let ids: Vec<_> = c.iter().map(|c| c.buf_id).collect();
    assert_eq!(&ids[..2], &[0xffff, 0xffff], "{c:?}");
    assert!(c[0].eop && c[1].eop);
    assert_eq!(ids[2], 2, "the third frame uses the third buffer posted");
    assert_eq!(g.dev.faults()[0].hits, 2);
}

#[test]
fn nic_stats_report_at_the_end_of_the_region() {
    let mut g = up(2);
    // gve_alloc_stats_report: (6 + 0) * max_tx + (2 + 4) * max_rx entries.
    let (mt, mr) = (
        u64::from(g.dev.config().max_tx_queues),
        u64::from(g.dev.config().max_rx_queues),
    );
    let entries = 6 * mt + 6 * mr;
    let len = 8 + 16 * entries;
    let region = g.alloc(len, 64);
    let st = g.adminq_cmd(cmd(
        opcode::REPORT_STATS,
        &[
            &len.to_be_bytes()[..],
            &region.to_be_bytes(),
            &20000u64.to_be_bytes(),
        ]
        .concat(),
    ));
    assert_eq!(st, status::PASSED);
    // Make the counters move: an oversize frame, a bad checksum and an
    // rx-error on queue 1, buffers exhausted on queue 0.
    let mut big = frame_for(&g, 1);
    big.resize(1600, 0);
    assert_eq!(g.receive(&big), Err(RxRefusal::Dropped));
    g.add_fault(1, &FaultSpec::new("rx-error").param("queue", 1))
        .unwrap();
    g.add_fault(2, &FaultSpec::new("rx-bad-csum").param("queue", 1))
        .unwrap();
    let f1 = frame_for(&g, 1);
    g.receive(&f1).unwrap();
    g.receive(&f1).unwrap();
    let f0 = frame_for(&g, 0);
    while g.receive(&f0).is_ok() {}
    g.advance(Duration::from_secs(1));
    g.run_timers();
    let base = (entries - 4 * 2) as usize;
    let rd = |i: usize| {
        let b = g.read(region + 8 + 16 * i as u64, 16);
        (
            be32(&b, 0),
            be32(&b, 4),
            u64::from_be_bytes(b[8..16].try_into().unwrap()),
        )
    };
    let names = [
        stats::RX_QUEUE_DROP_CNT,
        stats::RX_NO_BUFFERS_POSTED,
        stats::RX_DROPS_PACKET_OVER_MRU,
        stats::RX_DROPS_INVALID_CHECKSUM,
    ];
    let q0: Vec<_> = (0..4).map(|j| rd(base + j)).collect();
    let q1: Vec<_> = (0..4).map(|j| rd(base + 4 + j)).collect();
    for (j, n) in names.iter().enumerate() {
        assert_eq!((q0[j].0, q0[j].1), (*n, 0), "{q0:?}");
        assert_eq!((q1[j].0, q1[j].1), (*n, 1), "{q1:?}");
    }
    assert_eq!(q0[1].2, 1, "queue 0: one frame refused for lack of buffers");
    assert_eq!(
        (q1[0].2, q1[2].2, q1[3].2),
        (1, 1, 1),
        "queue 1: rx-error drop, oversize, checksum"
    );
    assert_eq!(rd(base - 1), (0, 0, 0), "the driver's part is left alone");
    assert_eq!(
        g.read(region, 8),
        vec![0; 8],
        "written_count is the driver's"
    );
    // Nothing changed since: no timer, no write.
    assert_eq!(g.dev.next_timeout(g.now), None);
    let n = g.dev.counters().nic_stats_written;
    g.advance(Duration::from_secs(5));
    g.poll();
    assert_eq!(g.dev.counters().nic_stats_written, n);
}

#[test]
fn register_names_are_the_drivers() {
    let g = up(1);
    assert_eq!(
        g.dev.register_name(layout::BAR_REGS, regs::DEVICE_STATUS),
        Some("device_status")
    );
    assert_eq!(
        g.dev
            .register_name(layout::BAR_REGS, regs::ADMINQ_EVENT_COUNTER),
        Some("adminq_event_counter")
    );
    assert_eq!(
        g.dev.register_name(layout::BAR_REGS, regs::ADMINQ_LENGTH),
        Some("adminq_length")
    );
    assert_eq!(g.dev.register_name(layout::BAR_REGS, 0x1c), None);
    let tx_db = u64::from(g.tx[0].db) * 4;
    assert_eq!(
        g.dev.register_name(layout::BAR_DOORBELLS, tx_db),
        Some("tx_doorbell")
    );
}

#[test]
fn trace_decodes_commands_doorbells_and_faults() {
    let mut g = Guest::new(GveConfig::default());
    g.tracing = true;
    g.probe();
    g.open(1, 64, 2048, true);
    let text: Vec<String> = g
        .trace
        .iter()
        .map(|r| format!("{} {}", r.kind, r.text))
        .collect();
    let has =
        |kind: TraceKind, s: &str| g.trace.iter().any(|r| r.kind == kind && r.text.contains(s));
    assert!(
        has(
            TraceKind::Command,
            "GVE_ADMINQ_CREATE_TX_QUEUE queue_id=0 ntfy_id=0 tx_ring_size=64"
        ),
        "{text:#?}"
    );
    assert!(has(TraceKind::Command, "-> PASSED"));
    assert!(has(TraceKind::Completion, "adminq_event_counter="));
    assert!(has(TraceKind::Doorbell, "adminq_doorbell prod_cnt="));
    assert!(has(TraceKind::Doorbell, "rx queue=0 buf_tail="));
    g.trace.clear();
    g.add_fault(
        9,
        &FaultSpec::new("adminq-status")
            .param("opcode", "CONFIGURE_RSS")
            .param("status", "UNAVAILABLE"),
    )
    .unwrap();
    g.configure_rss(None, None, 0);
    assert!(has_in(&g, TraceKind::Fault, "adminq-status rule 9"));
    assert!(has_in(
        &g,
        TraceKind::Command,
        "GVE_ADMINQ_CONFIGURE_RSS hash_types=0x0"
    ));
    assert!(has_in(&g, TraceKind::Command, "-> UNAVAILABLE"));
    // Untraced: nothing recorded.
    g.tracing = false;
    g.trace.clear();
    g.send(0, &[&frame(1)], None, false, 1, true);
    assert!(g.trace.is_empty());
}

fn has_in(g: &Guest, kind: TraceKind, s: &str) -> bool {
    g.trace.iter().any(|r| r.kind == kind && r.text.contains(s))
}

//! Memory a hostile driver can make the device hold: payload is never
//! staged (large SENDs, WRITEs, READs and receives move between guest memory
//! and frames), the work requests the RC engines hold are bounded per QP and
//! per device with back-pressure into the driver's rings, and one poll makes
//! a bounded number of frames.
//!
//! The RSS test is alone in this file's first test and measures the whole
//! process, so the file's other tests run after it (`--test-threads` does
//! not matter: they take a lock the RSS test holds).

mod common;

use std::sync::Mutex;
use std::time::Duration;

use common::rc::*;
use common::*;
use erdma_device::wqe::op;
use erdma_device::ErdmaConfig;
use pci_model::PciDevice;

/// Serializes the tests of this file: the RSS test must not see another
/// test's allocations.
static SERIAL: Mutex<()> = Mutex::new(());

/// Two connected sides with `buf_len` bytes of MR each (guest memory sized
/// to hold it).
fn pair(cfg_a: ErdmaConfig, cfg_b: ErdmaConfig, buf_len: u64) -> (Side, Side) {
    let mem = buf_len as usize + (8 << 20);
    let depths = (1024, 64, 64);
    let pages = buf_len / 4096;
    let mut a = rc::side(
        Driver::with_memory(cfg_a, mem),
        IP_A,
        false,
        2,
        depths,
        pages,
    );
    let mut b = rc::side(
        Driver::with_memory(cfg_b, mem),
        IP_B,
        false,
        3,
        depths,
        pages,
    );
    connect(&mut a, &mut b);
    (a, b)
}

/// One exchange of frames, then `ms` of time for both devices.
fn round(a: &mut Side, b: &mut Side, ms: u64) -> usize {
    let n = exchange(a, b);
    a.d.now += Duration::from_millis(ms);
    b.d.now += Duration::from_millis(ms);
    n
}

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .expect("resident pages");
    pages * 4096
}

/// 24 SENDs of 16 MiB from one 16 MiB buffer to a peer that never posts a
/// receive (it answers RNR for ever), then 24 READs of 16 MiB from it, then
/// 24 receives of 16 MiB that the SENDs flow into: the device used to stage
/// each message (384 MiB for the SENDs alone); now its memory stays flat.
#[test]
fn large_sends_and_reads_take_no_daemon_memory() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    const LEN: u64 = 16 << 20;
    let (mut a, mut b) = pair(ErdmaConfig::new(MAC_A), ErdmaConfig::new(MAC_B), LEN);
    // Both 16 MiB buffers committed now, so that guest memory is not what
    // grows below.
    let pattern: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8).collect();
    a.d.mem_write(a.buf, &pattern);
    b.d.mem_write(b.buf, &pattern);
    drop(pattern);
    let before = rss_bytes();
    for _ in 0..24 {
        a.d.post_sqe(&mut a.qp, send_sqe(op::SEND, LEN as u32, VA, STAG, 0));
    }
    let mut frames = 0;
    for _ in 0..40 {
        frames += round(&mut a, &mut b, 2);
    }
    let after_sends = rss_bytes();
    assert!(frames > 40, "the SENDs were tried ({frames} frames)");
    assert!(
        b.d.dev.counters().rc_retries > 0 || a.d.dev.counters().rc_retries > 0,
        "RNR retries happened"
    );
    let grew = after_sends.saturating_sub(before);
    assert!(
        grew < 16 << 20,
        "24 x 16 MiB SENDs grew the process by {} MiB",
        grew >> 20
    );
    // READs from B's buffer into A's (a second QP pair would do as well;
    // the first QP's SQ is behind its SENDs, so use B -> A).
    for _ in 0..24 {
        b.d.post_sqe(&mut b.qp, read_sqe(LEN as u32, VA, VA, STAG));
    }
    for _ in 0..40 {
        round(&mut a, &mut b, 2);
    }
    let grew = rss_bytes().saturating_sub(before);
    assert!(
        grew < 16 << 20,
        "24 x 16 MiB READs grew the process by {} MiB",
        grew >> 20
    );
    // Receives of 16 MiB each: the SENDs now land in B's buffer.
    let rx_before = b.d.dev.counters().rx_bytes;
    for _ in 0..24 {
        b.d.post_recv(&mut b.qp, VA, LEN as u32, STAG);
    }
    for _ in 0..40 {
        round(&mut a, &mut b, 2);
    }
    let moved = b.d.dev.counters().rx_bytes - rx_before;
    assert!(moved > 4 << 20, "SEND payload flowed ({moved} bytes)");
    let grew = rss_bytes().saturating_sub(before);
    assert!(
        grew < 16 << 20,
        "receiving into 24 x 16 MiB buffers grew the process by {} MiB",
        grew >> 20
    );
    assert!(a.d.dev.counters().engine_wrs_live <= 64 + 64);
}

/// Sixteen QPs, each posting 24 SENDs to a peer without receives, on a
/// device whose engines may hold 40 work requests (4 per QP direction): the
/// device-wide bound holds whatever the QPs do, and every QP completes all
/// its SENDs once the peers post receives.
#[test]
fn many_qps_share_the_device_bound() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut cfg = ErdmaConfig::new(MAC_A);
    cfg.max_engine_wrs = 40;
    cfg.max_wrs_per_qp = 4;
    let (mut a, mut b) = pair(cfg, ErdmaConfig::new(MAC_B), 1 << 20);
    a.d.mem_write(a.buf, b"many-qps");
    let mut qps = vec![(a.qp.clone(), b.qp.clone())];
    for i in 0..15u32 {
        let (qa, qb) = (10 + 2 * i, 11 + 2 * i);
        let (_, x) = a.d.create_qp(qa, false, 1, 64, 64);
        let (_, y) = b.d.create_qp(qb, false, 1, 64, 64);
        let (x, y) = (x.expect("QP"), y.expect("QP"));
        connect_qps(&mut a.d, &x, MAC_B, IP_B, qb);
        connect_qps(&mut b.d, &y, MAC_A, IP_A, qa);
        qps.push((x, y));
    }
    for (x, _) in &mut qps {
        for _ in 0..24 {
            a.d.post_sqe(x, send_sqe(op::SEND, 8, VA, STAG, 0));
        }
    }
    for _ in 0..20 {
        round(&mut a, &mut b, 1);
        let live = a.d.dev.counters().engine_wrs_live;
        assert!(live <= 40, "the engines hold {live}");
    }
    let stalls = a.d.dev.counters().engine_wr_stalls;
    assert!(stalls > 0, "the device bound was hit");
    for (_, y) in &mut qps {
        for i in 0..24 {
            b.d.post_recv(y, VA + 64 * i, 64, STAG);
        }
    }
    let mut done = 0;
    for _ in 0..2000 {
        round(&mut a, &mut b, 1);
        while let Some(wc) = a.d.poll_cq(1) {
            assert_eq!(wc.syndrome, 0, "{wc:?}");
            done += 1;
        }
        if done == 16 * 24 {
            break;
        }
    }
    assert_eq!(done, 16 * 24, "every SEND of every QP completed");
    assert_eq!(a.d.dev.counters().engine_wrs_live, 0);
}

/// A device whose engines may hold 6 work requests (4 per QP direction):
/// the driver posts 24 SENDs to a peer with no receives; the engines never
/// hold more than the budget, the rest waits in the SQ (counted), and once
/// the peer posts receives every SEND completes, in order, nothing lost.
#[test]
fn engine_work_is_bounded_and_back_pressured() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut cfg = ErdmaConfig::new(MAC_A);
    cfg.max_engine_wrs = 6;
    cfg.max_wrs_per_qp = 4;
    let (mut a, mut b) = pair(cfg, ErdmaConfig::new(MAC_B), 1 << 20);
    a.d.mem_write(a.buf, b"bounded!");
    for _ in 0..24 {
        a.d.post_sqe(&mut a.qp, send_sqe(op::SEND, 8, VA, STAG, 0));
    }
    for _ in 0..10 {
        round(&mut a, &mut b, 1);
        let c = a.d.dev.counters();
        assert!(c.engine_wrs_live <= 4, "engine holds {}", c.engine_wrs_live);
    }
    assert!(a.d.dev.counters().engine_wr_stalls > 0, "stalls counted");
    assert!(
        a.d.poll_cq(1).is_none(),
        "nothing completed without receives"
    );
    for i in 0..24 {
        b.d.post_recv(&mut b.qp, VA + 64 * i, 64, STAG);
    }
    let mut done = Vec::new();
    for _ in 0..400 {
        round(&mut a, &mut b, 1);
        while let Some(wc) = a.d.poll_cq(1) {
            assert_eq!(wc.syndrome, 0);
            done.push(wc.qe_idx);
        }
        if done.len() == 24 {
            break;
        }
    }
    assert_eq!(done, (0..24).collect::<Vec<u32>>(), "every SEND, in order");
    for i in 0..24u64 {
        assert_eq!(b.d.mem_read(b.buf + 64 * i, 8), b"bounded!");
    }
    assert_eq!(a.d.dev.counters().engine_wrs_live, 0);
}

/// One poll makes at most `max_tx_frames_per_poll` frames; the device asks
/// to be polled again at once while RC frames wait, and the whole message
/// arrives.
#[test]
fn frames_per_poll_are_bounded() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut cfg = ErdmaConfig::new(MAC_A);
    cfg.max_tx_frames_per_poll = 8;
    let (mut a, mut b) = pair(cfg, ErdmaConfig::new(MAC_B), 1 << 20);
    let data: Vec<u8> = (0..(256u32 << 10)).map(|i| (i % 241) as u8).collect();
    a.d.mem_write(a.buf, &data);
    a.d.post_sqe(
        &mut a.qp,
        write_sqe(op::WRITE, data.len() as u32, VA, VA + (512 << 10), STAG, 0),
    );
    a.d.poll();
    assert_eq!(a.d.tx.len(), 8, "the first poll stops at its budget");
    let now = a.d.now;
    assert_eq!(
        a.d.dev.next_timeout(a.d.now),
        Some(now),
        "more to send: poll again now"
    );
    let mut max_per_call = 0;
    let mut to_b = std::mem::take(&mut a.d.tx);
    for _ in 0..2000 {
        for f in std::mem::take(&mut to_b) {
            let _ = b.d.receive(&f);
        }
        for f in std::mem::take(&mut b.d.tx) {
            let _ = a.d.receive(&f);
            max_per_call = max_per_call.max(a.d.tx.len());
            to_b.append(&mut a.d.tx);
        }
        a.d.poll();
        max_per_call = max_per_call.max(a.d.tx.len());
        to_b.append(&mut a.d.tx);
        if let Some(wc) = a.d.poll_cq(1) {
            assert_eq!(wc.syndrome, 0);
            break;
        }
    }
    assert!(max_per_call <= 8, "frames made by one call: {max_per_call}");
    assert_eq!(b.d.mem_read(b.buf + (512 << 10), data.len()), data);
}

/// While the edge's receivers are full (`DeviceIo::tx_paused`) the device
/// makes no frame and does not ask to be polled at once (the edge polls
/// again when the pause ends); then the WRITE goes out whole.
#[test]
fn a_paused_edge_gets_no_frames_until_it_polls_again() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (mut a, mut b) = pair(ErdmaConfig::new(MAC_A), ErdmaConfig::new(MAC_B), 1 << 20);
    let data: Vec<u8> = (0..(64u32 << 10)).map(|i| (i % 239) as u8).collect();
    a.d.mem_write(a.buf, &data);
    a.d.post_sqe(
        &mut a.qp,
        write_sqe(op::WRITE, data.len() as u32, VA, VA + (512 << 10), STAG, 0),
    );
    a.d.with_io(|dev, io| {
        io.tx_paused = true;
        dev.poll(io);
        assert!(io.tx.is_empty(), "no frame while paused");
    });
    let now = a.d.now;
    assert_ne!(
        a.d.dev.next_timeout(a.d.now),
        Some(now),
        "no poll asked for while paused"
    );
    let mut done = false;
    for _ in 0..200 {
        round(&mut a, &mut b, 1);
        if let Some(wc) = a.d.poll_cq(1) {
            assert_eq!(wc.syndrome, 0);
            done = true;
            break;
        }
    }
    assert!(done, "the WRITE completed once the edge polled unpaused");
    assert_eq!(b.d.mem_read(b.buf + (512 << 10), data.len()), data);
}

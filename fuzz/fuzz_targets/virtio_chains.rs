//! vhost-rdma descriptor-chain walking (`vhost_rdma::ports::virtio_net::chain`): the daemon's
//! real TX drain (`drain_tx` -> `read_tx_chain`), RX fill (`fill_rx`, with
//! and without mergeable buffers) and control-command read
//! (`read_ctrl_chain`) over guest memory and a split virtqueue built from the
//! fuzz input: random descriptor tables, flags, next indices, indirect
//! tables, lengths (0 and huge), avail ring contents and ring addresses.
//!
//! Input layout (short inputs are zero-padded):
//!   0      queue size: 1 << (b % 11); with bit 7 the raw byte (mostly invalid)
//!   1      bits: 0 EVENT_IDX, 1 MRG_RXBUF, 2 HASH_REPORT, 3 CSUM, 4 HOST_TSO4,
//!          5 HOST_TSO6, 6 take ring addresses from the input, 7 pause TX
//!   2..4   next_avail (u16 LE)
//!   4      TX pause after this many chains (with bit 1.7)
//!   5..8   RX frame lengths, each * 64 (0 -> 65535+18, the largest frame)
//!   8..32  desc/avail/used ring addresses (u64 LE each, with bit 1.6)
//!   32..   guest memory: region 0 (64 KiB at GPA 0; desc table at 0, avail
//!          ring at 0x1000, used ring at 0x2000 by default), then region 1
//!          (16 KiB at GPA 0x20000, after a 64 KiB hole).
//!
//! Invariants: nothing panics; a head >= queue size is refused as
//! `BadHead` and never returned in the used ring; every head returned is
//! < queue size; an
//! accepted TX frame is between 14 bytes and the largest frame; a TX pass
//! that paused resumes at the chain it paused on; every RX frame is either
//! delivered, dropped (counted) or left pending for lack of buffers; a
//! control command is at most `MAX_CTRL_LEN` bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::collections::VecDeque;
use vhost_rdma::fabric::Frame;
use vhost_rdma::ports::virtio_net::chain::{
    self, ChainError, ChainLog, RxSource, TxStep, MAX_CTRL_LEN,
};
use vhost_rdma::stats::{LogLimiter, QueueCounters};
use vhost_rdma::virtio_net::{NetHdr, MAX_FRAME_LEN, MIN_FRAME_LEN};
use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

const R0: u64 = 0;
const R0_LEN: usize = 0x1_0000;
const R1: u64 = 0x2_0000;
const R1_LEN: usize = 0x4000;

struct Pending(VecDeque<Frame>);

impl RxSource for Pending {
    fn pop(&mut self) -> Option<Frame> {
        self.0.pop_front()
    }
    fn unpop(&mut self, f: Frame) {
        self.0.push_front(f)
    }
}

fn queue(size: u16, desc: u64, avail: u64, used: u64, next: u16, event_idx: bool) -> Option<Queue> {
    let mut q = Queue::new(1024).ok()?;
    q.try_set_size(size).ok()?;
    q.try_set_desc_table_address(GuestAddress(desc)).ok()?;
    q.try_set_avail_ring_address(GuestAddress(avail)).ok()?;
    q.try_set_used_ring_address(GuestAddress(used)).ok()?;
    q.set_next_avail(next);
    q.set_next_used(next);
    q.set_event_idx(event_idx);
    q.set_ready(true);
    Some(q)
}

fuzz_target!(|data: &[u8]| {
    let mut head = [0u8; 32];
    let n = data.len().min(32);
    head[..n].copy_from_slice(&data[..n]);
    let body = data.get(32..).unwrap_or(&[]);

    let size = if head[0] & 0x80 != 0 {
        u16::from(head[0] & 0x7f)
    } else {
        1u16 << (head[0] % 11)
    };
    let bits = head[1];
    let event_idx = bits & 1 != 0;
    let mrg = bits & 2 != 0;
    let mut acked = 0u64;
    for (b, f) in [(2, 57), (3, 0), (4, 11), (5, 12)] {
        if bits & (1 << b) != 0 {
            acked |= 1u64 << f;
        }
    }
    let hl = vhost_rdma::virtio_net::net_hdr_len(acked);
    let next = u16::from_le_bytes([head[2], head[3]]);
    let u64_at = |i: usize| u64::from_le_bytes(head[i..i + 8].try_into().unwrap());
    let (desc, avail, used) = if bits & 0x40 != 0 {
        (u64_at(8), u64_at(16), u64_at(24))
    } else {
        (R0, R0 + 0x1000, R0 + 0x2000)
    };

    let mem = GuestMemoryMmap::<()>::from_ranges(&[
        (GuestAddress(R0), R0_LEN),
        (GuestAddress(R1), R1_LEN),
    ])
    .unwrap();
    let (m0, m1) = body.split_at(body.len().min(R0_LEN));
    mem.write_slice(m0, GuestAddress(R0)).unwrap();
    mem.write_slice(&m1[..m1.len().min(R1_LEN)], GuestAddress(R1))
        .unwrap();

    let Some(mut q) = queue(size, desc, avail, used, next, event_idx) else {
        return;
    };

    // ---- TX ----
    let pause_after = (bits & 0x80 != 0).then_some(usize::from(head[4]));
    let mut seen = 0usize;
    let mut paused_at = None;
    let drained = chain::drain_tx(&mem, &mut q, acked, |h, r| {
        if h >= size {
            assert!(
                matches!(r, Err(ChainError::BadHead { .. })),
                "head {h} >= queue size {size} not refused as such: {r:?}"
            );
        }
        if let Ok(f) = &r {
            assert!(
                f.data.len() >= MIN_FRAME_LEN,
                "accepted a {}-byte frame",
                f.data.len()
            );
            assert!(
                f.data.len() <= MAX_FRAME_LEN,
                "accepted a {}-byte frame",
                f.data.len()
            );
        }
        if pause_after == Some(seen) {
            paused_at = Some(h);
            return TxStep::Pause;
        }
        seen += 1;
        TxStep::Done
    });
    if let Ok(d) = &drained {
        assert!(d.used.len() <= seen);
        assert!(
            d.used.iter().all(|&h| h < size),
            "used head outside the ring"
        );
        assert_eq!(d.paused, paused_at.is_some());
        if let Some(h) = paused_at {
            // Nothing changed in memory: the next pass starts at the same chain.
            let mut first = None;
            let _ = chain::drain_tx(&mem, &mut q, acked, |h2, _| {
                first.get_or_insert(h2);
                TxStep::Pause
            });
            assert_eq!(first, Some(h), "paused TX pass did not resume at its chain");
        }
        for &h in &d.used {
            let _ = q.add_used(&mem, h, 0);
        }
    }

    // ---- RX, over the same rings (the guest may post any chain anywhere) ----
    let Some(mut q) = queue(size, desc, avail, used, next, event_idx) else {
        return;
    };
    let frames: Vec<Frame> = head[5..8]
        .iter()
        .enumerate()
        .map(|(i, &b)| {
            let len = if b == 0 {
                MAX_FRAME_LEN
            } else {
                usize::from(b) * 64
            };
            Frame::new(NetHdr::default(), vec![0x40 + i as u8; len])
        })
        .collect();
    let nframes = frames.len() as u64;
    let mut src = Pending(frames.into());
    let counters = QueueCounters::default();
    let log = LogLimiter::default();
    let ctx = ChainLog {
        counters: &counters,
        log: &log,
        port: "fuzz",
        qp: 0,
    };
    if let Ok(fill) = chain::fill_rx(&mem, &mut q, &mut src, hl, mrg, ctx) {
        let s = counters.snapshot();
        assert_eq!(fill.delivered, s.rx_frames);
        assert_eq!(
            s.rx_frames + s.rx_drops + src.0.len() as u64,
            nframes,
            "RX frames lost without a count"
        );
        assert_eq!(fill.starved, !src.0.is_empty());
        for &(h, len) in &fill.used {
            assert!(h < size, "RX head {h} >= queue size {size}");
            assert!(len as usize <= hl + MAX_FRAME_LEN);
            let _ = q.add_used(&mem, h, len);
        }
    }

    // ---- control queue ----
    let Some(mut q) = queue(size, desc, avail, used, next, event_idx) else {
        return;
    };
    if let Ok(iter) = q.iter(&mem) {
        for c in iter {
            let (cmd, _ack) = chain::read_ctrl_chain(&mem, c);
            if let Ok(cmd) = cmd {
                assert!(cmd.len() <= MAX_CTRL_LEN);
            }
        }
    }
});

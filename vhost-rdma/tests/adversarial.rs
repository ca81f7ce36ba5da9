//! Hostile guests against the daemon, in-process (`TestGuest` frontends):
//! random descriptor chains and queue sizes, descriptors just outside guest
//! memory, memory tables replaced mid-traffic, resets and disabled vrings
//! mid-flight, huge and zero lengths, vhost-user requests out of order.
//!
//! Every test checks that the refusals were counted and that the daemon
//! still serves other ports: a second pair of guests exchanges frames that
//! are verified byte for byte.

mod common;

use std::time::{Duration, Instant};

use common::frontend::{DESC_F_INDIRECT, DESC_F_NEXT, DESC_F_WRITE, GPA_BASE, GUARD};
use common::packet::{frame_tag, tagged_frame, BROADCAST};
use common::{feat, GuestOpts, RawDesc, TestFabric, TestGuest, TxOpts, ARRIVE, QUIET};
use vhost::vhost_user::VhostUserFrontend;
use vhost::{VhostBackend, VringConfigData};

/// A guest whose kicks never depend on the device's avail_event (a hostile
/// or disabled ring leaves that stale; see the tests).
const NO_EVENT_IDX: u64 = feat::ALL & !feat::MQ & !feat::EVENT_IDX;

/// xorshift64*: a seeded, reproducible RNG (the seed is printed on failure).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn pick<T: Copy>(&mut self, v: &[T]) -> T {
        v[self.below(v.len() as u64) as usize]
    }
}

/// Sends a tagged frame from `src` to `dst` and waits for it at `dst`,
/// ignoring anything else that arrives (an attacker's floods); re-posts the
/// RX buffers it used. Panics if the frame is lost or corrupted.
fn one_way(src: &mut TestGuest, dst: &mut TestGuest, macs: ([u8; 6], [u8; 6]), tag: u64) {
    let f = tagged_frame(macs.1, macs.0, tag, 300);
    src.send(0, &f, &TxOpts::default());
    let deadline = Instant::now() + ARRIVE;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let got = dst.recv_from(&[0], 64, left.min(Duration::from_millis(200)));
        dst.post_rx(0, got.len(), 2048);
        for r in &got {
            if frame_tag(&r.data) == Some(tag) && r.data[6..12] == macs.0 {
                assert!(r.data == f, "frame {tag} corrupted");
                assert!(src.wait_tx(0, ARRIVE), "TX of frame {tag} never returned");
                return;
            }
        }
        assert!(Instant::now() < deadline, "frame {tag} lost");
    }
}

/// Receives up to `n` frames sent by `mac` (re-posting the buffers used),
/// ignoring frames from elsewhere.
fn recv_from_mac(g: &mut TestGuest, mac: [u8; 6], n: usize) -> Vec<common::RxFrame> {
    let deadline = Instant::now() + ARRIVE;
    let mut out = Vec::new();
    while out.len() < n && Instant::now() < deadline {
        let left = deadline.saturating_duration_since(Instant::now());
        let got = g.recv_n(0, n - out.len(), left);
        g.post_rx(0, got.len(), 2048);
        out.extend(got.into_iter().filter(|r| r.data[6..12] == mac));
    }
    out
}

/// A pair of well-behaved guests on ports `i` and `j`.
struct Pair {
    a: TestGuest,
    b: TestGuest,
    macs: ([u8; 6], [u8; 6]),
    tag: u64,
}

impl Pair {
    fn connect(fab: &TestFabric, i: usize, j: usize) -> Pair {
        Self::connect_with(fab, i, j, feat::ALL)
    }

    fn connect_with(fab: &TestFabric, i: usize, j: usize, features: u64) -> Pair {
        let mut a = fab.connect(i, features);
        let mut b = fab.connect(j, features);
        a.post_rx(0, 128, 2048);
        b.post_rx(0, 128, 2048);
        Pair {
            a,
            b,
            macs: (fab.mac(i), fab.mac(j)),
            tag: 1,
        }
    }

    /// Exchanges `n` verified frames each way.
    fn exchange(&mut self, n: usize) {
        for _ in 0..n {
            self.tag += 1;
            one_way(&mut self.a, &mut self.b, self.macs, self.tag);
            self.tag += 1;
            let back = (self.macs.1, self.macs.0);
            one_way(&mut self.b, &mut self.a, back, self.tag);
        }
    }
}

fn wait_counter(
    fab: &TestFabric,
    port: usize,
    what: &str,
    f: impl Fn(&vhost_rdma::PortStats) -> u64,
    above: u64,
) {
    let (s, ok) = fab.wait_stats(port, ARRIVE, |s| f(s) > above);
    assert!(ok, "port {port}: {what} did not grow above {above}: {s:?}");
}

#[test]
fn random_chains_on_random_queue_sizes_are_refused_and_other_ports_keep_working() {
    let seed = std::env::var("ADVERSARIAL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_f00d_u64);
    println!("seed {seed:#x} (set ADVERSARIAL_SEED to replay)");
    let mut rng = Rng(seed | 1);
    let fab = TestFabric::start(3, 1);
    let mut pair = Pair::connect(&fab, 1, 2);
    pair.exchange(1);
    for size in [1u16, 2, 4, 8, 16, 64, 256, 1024] {
        let mut opts = GuestOpts::new(1, NO_EVENT_IDX);
        opts.queue_size = size;
        let mut evil = TestGuest::connect_with(fab.socket(0), opts)
            .unwrap_or_else(|e| panic!("queue size {size}: {e:#}"));
        let (lo, hi) = (GPA_BASE, evil.mem_end());
        let buf = evil.raw_buffer(&[0u8; 4096]);
        let before = fab.stats(0);
        for round in 0..40 {
            let addrs = [
                buf,
                buf + 12,
                lo,
                lo - 1,
                lo - GUARD as u64,
                hi - 1,
                hi,
                hi + GUARD as u64,
                u64::MAX - 7,
                0,
                rng.next(),
            ];
            let lens = [
                0u32,
                1,
                12,
                14,
                60,
                1514,
                4096,
                65535,
                65536 + 30,
                u32::MAX,
                rng.next() as u32,
            ];
            for q in [TestGuest::tx_index(0), TestGuest::rx_index(0)] {
                let n = 1 + rng.below(u64::from(size).min(8)) as usize;
                let descs: Vec<(u16, u64, u32, u16, u16)> = (0..n)
                    .map(|_| {
                        (
                            rng.below(u64::from(size)) as u16,
                            rng.pick(&addrs),
                            rng.pick(&lens),
                            rng.below(8) as u16 & (DESC_F_NEXT | DESC_F_WRITE | DESC_F_INDIRECT),
                            rng.below(u64::from(size) + 2) as u16,
                        )
                    })
                    .collect();
                let heads: Vec<u16> = (0..1 + rng.below(4))
                    .map(|_| {
                        if rng.below(8) == 0 {
                            rng.next() as u16
                        } else {
                            rng.below(u64::from(size)) as u16
                        }
                    })
                    .collect();
                evil.chaos_publish(q, &descs, &heads);
            }
            if round % 10 == 9 {
                // Broadcasts make the daemon walk the attacker's RX chains too.
                pair.tag += 1;
                let f = tagged_frame(BROADCAST, pair.macs.0, pair.tag, 200);
                pair.a.send(0, &f, &TxOpts::default());
                pair.exchange(1);
            }
        }
        pair.exchange(2);
        wait_counter(
            &fab,
            0,
            "tx_errors",
            |s| s.totals.tx_errors,
            before.totals.tx_errors,
        );
        for q in [TestGuest::tx_index(0), TestGuest::rx_index(0)] {
            for (id, len) in evil.chaos_used(q) {
                assert!(
                    id < u32::from(size),
                    "queue size {size}: device returned head {id}"
                );
                if q == TestGuest::tx_index(0) {
                    assert_eq!(len, 0, "TX used entries carry no length");
                }
            }
        }
        drop(evil);
    }
    let s = fab.stats(0);
    println!("attacker port: {s:?}");
    assert!(s.totals.tx_errors > 0 && s.totals.rx_errors > 0, "{s:?}");
    // The attacker's port serves a well-behaved guest again.
    drop(pair);
    let mut again = Pair::connect(&fab, 0, 1);
    again.exchange(2);
}

/// Found by the `virtio_chains` fuzz target: an avail ring entry naming a
/// head beyond the ring. The daemon refuses it (counted) and never puts it
/// in the used ring.
#[test]
fn head_outside_the_ring_is_refused() {
    let fab = TestFabric::start(3, 1);
    let mut pair = Pair::connect(&fab, 1, 2);
    let mut evil = fab.connect(0, NO_EVENT_IDX);
    let size = evil.queue_size(1);
    let before = fab.stats(0);
    evil.chaos_publish(TestGuest::tx_index(0), &[], &[7176, size, u16::MAX]);
    wait_counter(
        &fab,
        0,
        "tx_errors",
        |s| s.totals.tx_errors,
        before.totals.tx_errors + 2,
    );
    evil.chaos_publish(TestGuest::rx_index(0), &[], &[7176, size]);
    pair.tag += 1;
    let f = tagged_frame(BROADCAST, pair.macs.0, pair.tag, 200);
    pair.a.send(0, &f, &TxOpts::default());
    wait_counter(
        &fab,
        0,
        "rx_errors",
        |s| s.totals.rx_errors,
        before.totals.rx_errors + 1,
    );
    pair.exchange(2);
    for q in [TestGuest::tx_index(0), TestGuest::rx_index(0)] {
        let used = evil.chaos_used(q);
        assert!(used.iter().all(|&(id, _)| id < u32::from(size)), "{used:?}");
    }
}

/// Whether `/proc/self/maps` shows a PROT_NONE mapping ending at `start`
/// and another beginning at `end`.
fn guarded(start: u64, end: u64) -> (bool, bool) {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let mut before = false;
    let mut after = false;
    for l in maps.lines() {
        let mut it = l.split_whitespace();
        let (Some(range), Some(perms)) = (it.next(), it.next()) else {
            continue;
        };
        let Some((a, b)) = range.split_once('-') else {
            continue;
        };
        let (a, b) = (
            u64::from_str_radix(a, 16).unwrap(),
            u64::from_str_radix(b, 16).unwrap(),
        );
        if perms.starts_with("---") {
            before |= b == start;
            after |= a == end;
        }
    }
    (before, after)
}

#[test]
fn descriptors_just_outside_guest_memory_are_refused() {
    let fab = TestFabric::start(3, 1);
    let mut pair = Pair::connect(&fab, 1, 2);
    let mut evil = fab.connect(0, NO_EVENT_IDX);
    // The frontend's own mapping of guest memory sits between PROT_NONE guard
    // pages: a stray frontend access faults instead of hitting a neighbour.
    let (lo, hi) = (GPA_BASE, evil.mem_end());
    let (host_lo, host_hi) = evil.host_range();
    assert_eq!(
        guarded(host_lo, host_hi),
        (true, true),
        "guard pages missing around {host_lo:#x}..{host_hi:#x}"
    );
    let hdr = evil.raw_buffer(&[0u8; 12]);
    let tx_cases: [(u64, u32); 6] = [
        (lo - 1, 60),              // starts one byte before guest memory
        (lo - GUARD as u64, 4096), // wholly below
        (hi - 1, 2),               // straddles the end by one byte
        (hi - 30, 60),             // straddles the end
        (hi, 60),                  // starts right after
        (hi + GUARD as u64, 60),   // beyond
    ];
    for (i, &(addr, len)) in tx_cases.iter().enumerate() {
        let before = fab.stats(0).totals.tx_errors;
        evil.send_raw(
            0,
            &[
                RawDesc {
                    addr: hdr,
                    len: 12,
                    flags: DESC_F_NEXT,
                    next: Some(1),
                },
                RawDesc {
                    addr,
                    len,
                    flags: 0,
                    next: None,
                },
            ],
        );
        wait_counter(
            &fab,
            0,
            &format!("tx_errors (case {i}: {addr:#x}+{len})"),
            |s| s.totals.tx_errors,
            before,
        );
        assert!(
            evil.wait_tx(0, ARRIVE),
            "case {i}: refused chain not returned"
        );
        pair.exchange(1);
    }
    // RX buffers just outside guest memory: the frame cannot be written there.
    let rx_cases: [(u64, u32); 3] = [(hi - 1, 2048), (hi, 2048), (lo - 64, 2048)];
    for (i, &(addr, len)) in rx_cases.iter().enumerate() {
        let before = fab.stats(0);
        evil.chaos_publish(
            TestGuest::rx_index(0),
            &[(200 + i as u16, addr, len, DESC_F_WRITE, 0)],
            &[200 + i as u16],
        );
        pair.tag += 1;
        let f = tagged_frame(BROADCAST, pair.macs.0, pair.tag, 200);
        pair.a.send(0, &f, &TxOpts::default());
        wait_counter(
            &fab,
            0,
            &format!("rx_errors (RX case {i})"),
            |s| s.totals.rx_errors,
            before.totals.rx_errors,
        );
        assert_eq!(
            fab.stats(0).totals.rx_frames,
            before.totals.rx_frames,
            "RX case {i}: a frame went outside guest memory"
        );
        pair.exchange(1);
    }
    // Huge and zero lengths.
    let before = fab.stats(0);
    evil.chaos_publish(
        TestGuest::rx_index(0),
        &[
            (210, hdr, 0, DESC_F_WRITE, 0),
            (211, hdr, u32::MAX, DESC_F_WRITE, 0),
        ],
        &[210, 211],
    );
    pair.tag += 1;
    let f = tagged_frame(BROADCAST, pair.macs.0, pair.tag, 200);
    pair.a.send(0, &f, &TxOpts::default());
    // The zero-length chain is refused; the huge one is used for the bytes
    // the frame needs, which lie in guest memory.
    wait_counter(
        &fab,
        0,
        "rx_errors (zero length)",
        |s| s.totals.rx_errors,
        before.totals.rx_errors,
    );
    pair.exchange(2);
}

#[test]
fn memory_table_replaced_mid_traffic() {
    let fab = TestFabric::start(4, 1);
    let mut other = Pair::connect(&fab, 2, 3);
    let mut p = Pair::connect_with(&fab, 0, 1, NO_EVENT_IDX);
    let (ma, mb) = p.macs;
    // Same memory at a new host address, with and without an extra region,
    // while frames are in flight: nothing may be lost or corrupted.
    for round in 0..20u64 {
        let frames: Vec<Vec<u8>> = (0..16)
            .map(|i| tagged_frame(mb, ma, 1000 * round + i, 600))
            .collect();
        p.a.send_burst(0, &frames, &TxOpts::default());
        p.a.replace_mem_table(true, round % 2 == 0).unwrap();
        let got = recv_from_mac(&mut p.b, ma, frames.len());
        assert_eq!(
            got.len(),
            frames.len(),
            "round {round}: frames lost across SET_MEM_TABLE"
        );
        for (g, f) in got.iter().zip(&frames) {
            assert!(
                g.data == *f,
                "round {round}: frame corrupted across SET_MEM_TABLE"
            );
        }
        assert!(p.a.wait_tx(0, ARRIVE));
    }
    // A table without the rings: the port refuses its rings (counted) ...
    let before = fab.stats(0);
    p.a.replace_mem_table(false, true).unwrap();
    let frames: Vec<Vec<u8>> = (0..4)
        .map(|i| tagged_frame(mb, ma, 90_000 + i, 600))
        .collect();
    p.a.send_burst(0, &frames, &TxOpts::default());
    wait_counter(
        &fab,
        0,
        "tx_errors (rings outside the table)",
        |s| s.totals.tx_errors,
        before.totals.tx_errors,
    );
    assert!(
        p.b.drain_all(QUIET).is_empty(),
        "frames read from outside the memory table"
    );
    other.exchange(2);
    // ... and works again once the table holds them.
    p.a.replace_mem_table(true, false).unwrap();
    let more = tagged_frame(mb, ma, 90_100, 600);
    p.a.send(0, &more, &TxOpts::default());
    // (Other ports' first frames are flooded here too: keep A's.)
    let got = recv_from_mac(&mut p.b, ma, 5);
    assert_eq!(
        got.len(),
        5,
        "port did not recover after the table was restored"
    );
    let tags: Vec<Option<u64>> = got.iter().map(|g| frame_tag(&g.data)).collect();
    assert!(
        got.iter()
            .zip(frames.iter().chain([&more]))
            .all(|(g, f)| g.data == *f),
        "frames after the restore: tags {tags:?}, lens {:?}",
        got.iter().map(|g| g.data.len()).collect::<Vec<_>>()
    );
    assert!(p.a.wait_tx(0, ARRIVE));
}

#[test]
fn stop_reset_and_disable_mid_flight() {
    let fab = TestFabric::start(4, 1);
    let mut other = Pair::connect(&fab, 2, 3);
    let (ma, mb) = (fab.mac(0), fab.mac(1));
    let mut b = fab.connect(1, feat::ALL);
    b.post_rx(0, 256, 2048);
    let burst = |tag: u64| -> Vec<Vec<u8>> {
        (0..64)
            .map(|i| tagged_frame(mb, ma, tag + i, 1400))
            .collect()
    };

    // GET_VRING_BASE (stop) with a burst in flight, then the guest goes away.
    let mut a = fab.connect(0, feat::ALL);
    a.send_burst(0, &burst(0), &TxOpts::default());
    a.stop().unwrap();
    drop(a);
    other.exchange(2);

    // RESET_OWNER with a burst in flight.
    let mut a = fab.connect(0, feat::ALL);
    a.send_burst(0, &burst(1000), &TxOpts::default());
    a.frontend().reset_owner().unwrap();
    drop(a);
    other.exchange(2);

    // SET_VRING_ENABLE 0 on TX: nothing more is sent until it is enabled again.
    let _ = b.drain_all(QUIET);
    b.post_rx(0, 256 - b.rx_posted(0), 2048);
    let mut a = fab.connect(0, NO_EVENT_IDX);
    a.post_rx(0, 16, 2048);
    let tx = TestGuest::tx_index(0);
    a.frontend().set_vring_enable(tx, false).unwrap();
    let frames = burst(2000);
    a.send_burst(0, &frames[..8], &TxOpts::default());
    assert!(
        b.drain_all(QUIET).is_empty(),
        "a disabled TX ring was processed"
    );
    other.exchange(1);
    a.frontend().set_vring_enable(tx, true).unwrap();
    a.send_burst(0, &frames[8..16], &TxOpts::default());
    let got = b.recv_n(0, 16, ARRIVE);
    assert_eq!(got.len(), 16, "frames lost across SET_VRING_ENABLE 0/1");
    assert!(
        got.iter().zip(&frames).all(|(g, f)| g.data == *f),
        "frames reordered or corrupted"
    );
    // SET_VRING_ENABLE 0 on RX: frames for the port wait (or drop, counted).
    let rx = TestGuest::rx_index(0);
    a.frontend().set_vring_enable(rx, false).unwrap();
    b.send_burst(
        0,
        &burst(3000)[..4]
            .iter()
            .map(|f| {
                let mut f = f.clone();
                f[..6].copy_from_slice(&ma);
                f[6..12].copy_from_slice(&mb);
                f
            })
            .collect::<Vec<_>>(),
        &TxOpts::default(),
    );
    assert!(
        a.drain_all(QUIET).is_empty(),
        "a disabled RX ring was filled"
    );
    other.exchange(1);
    drop(a);
    // The port takes a fresh guest afterwards.
    drop(b);
    let mut again = Pair::connect(&fab, 0, 1);
    again.exchange(2);
    assert_eq!(fab.stats(0).protocol_errors, 0, "{:?}", fab.stats(0));
}

#[test]
fn vhost_user_requests_out_of_order_are_refused_and_counted() {
    let fab = TestFabric::start(4, 1);
    let mut other = Pair::connect(&fab, 2, 3);
    let sock = fab.socket(0).to_path_buf();
    let mut errors = 0;
    let mut expect_refusal =
        |what: &str, f: &dyn Fn(&mut vhost::vhost_user::Frontend) -> Result<(), vhost::Error>| {
            let mut fe = vhost::vhost_user::Frontend::connect(&sock, 3).unwrap();
            fe.set_owner().unwrap();
            let r = f(&mut fe).and_then(|_| fe.get_features().map(|_| ()));
            assert!(r.is_err(), "{what}: accepted");
            drop(fe);
            errors += 1;
            let (s, ok) = fab.wait_stats(0, ARRIVE, |s| s.protocol_errors >= errors);
            assert!(ok, "{what}: protocol_errors not counted: {s:?}");
        };
    expect_refusal("features not offered", &|fe| {
        let offered = fe.get_features()?;
        fe.set_features(offered | (1 << 41))
    });
    expect_refusal("queue size above the maximum", &|fe| {
        fe.set_vring_num(0, 4096)
    });
    expect_refusal("queue index out of range", &|fe| fe.set_vring_num(2, 256));
    expect_refusal("ring addresses before any memory table", &|fe| {
        fe.set_vring_num(0, 256)?;
        let cfg = VringConfigData {
            queue_max_size: 256,
            queue_size: 256,
            flags: 0,
            desc_table_addr: 0x1000,
            used_ring_addr: 0x2000,
            avail_ring_addr: 0x3000,
            log_addr: None,
        };
        fe.set_vring_addr(0, &cfg)
    });
    other.exchange(1);

    // Vring set-up before SET_FEATURES, and SET_FEATURES twice (with a
    // different set the second time) are legal orders: the port must work.
    let mut g = fab.connect(0, feat::ALL);
    let f = g.features;
    g.frontend().set_features(f & !feat::EVENT_IDX).unwrap();
    g.frontend().set_features(f).unwrap();
    let mut b = fab.connect(1, feat::ALL);
    b.post_rx(0, 8, 2048);
    g.post_rx(0, 8, 2048);
    one_way(&mut g, &mut b, (fab.mac(0), fab.mac(1)), 77);
    other.exchange(1);
    assert_eq!(fab.stats(0).protocol_errors, errors, "{:?}", fab.stats(0));
}

//! Self-test of the `TestGuest` ring driver against a tiny echo backend built on
//! `vhost-user-backend` (TX of queue pair N comes back on RX of queue pair N,
//! header included). This checks the harness without the daemon under test.

mod common;

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::packet::{mac, tagged_frame};
use common::{feat, Layout, NetHdr, TempDir, TestGuest, TxOpts, ARRIVE};
use vhost::vhost_user::message::VhostUserProtocolFeatures;
use vhost::vhost_user::Listener;
use vhost_user_backend::{VhostUserBackendMut, VhostUserDaemon, VringRwLock, VringT};
use virtio_queue::{DescriptorChain, QueueT};
use vm_memory::{
    Bytes, GuestAddress, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryLoadGuard,
    GuestMemoryMmap,
};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};

type Mem = GuestMemoryAtomic<GuestMemoryMmap>;
/// A popped RX chain: head index and its writable buffers.
type RxChain = (u16, Vec<(GuestAddress, u32)>);

#[derive(Default)]
struct Counters {
    tx_errors: AtomicU64,
    rx_drops: AtomicU64,
    echoed: AtomicU64,
}

struct Echo {
    qps: usize,
    event_idx: bool,
    acked: u64,
    mem: Option<Mem>,
    pending: Vec<VecDeque<Vec<u8>>>,
    stash: Vec<VecDeque<RxChain>>,
    counters: Arc<Counters>,
}

impl Echo {
    fn new(qps: usize, counters: Arc<Counters>) -> Echo {
        Echo {
            qps,
            event_idx: false,
            acked: 0,
            mem: None,
            pending: vec![VecDeque::new(); qps],
            stash: vec![VecDeque::new(); qps],
            counters,
        }
    }

    fn read_tx(
        mem: &GuestMemoryMmap,
        chain: DescriptorChain<GuestMemoryLoadGuard<GuestMemoryMmap>>,
    ) -> Option<Vec<u8>> {
        let mut bytes = Vec::new();
        let mut n = 0;
        let mut ended = false;
        let mut ch = chain.clone();
        for d in &mut ch {
            n += 1;
            if n > 64 || d.is_write_only() || d.len() > (1 << 20) {
                return None;
            }
            let mut b = vec![0u8; d.len() as usize];
            mem.read_slice(&mut b, d.addr()).ok()?;
            bytes.extend_from_slice(&b);
            ended = !d.has_next();
        }
        if !ended || bytes.len() < NetHdr::LEN {
            return None;
        }
        bytes[10] = 0;
        bytes[11] = 0;
        Some(bytes)
    }

    fn process_tx(&mut self, qp: usize, vrings: &[VringRwLock]) {
        let tx = &vrings[2 * qp + 1];
        let mem = self.mem.as_ref().unwrap().memory();
        loop {
            if self.event_idx {
                tx.disable_notification().unwrap();
            }
            loop {
                let chain = tx
                    .get_mut()
                    .get_queue_mut()
                    .pop_descriptor_chain(mem.clone());
                let Some(chain) = chain else { break };
                let head = chain.head_index();
                match Self::read_tx(&mem, chain) {
                    Some(b) => self.pending[qp].push_back(b),
                    None => {
                        self.counters.tx_errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
                tx.add_used(head, 0).unwrap();
            }
            if !self.event_idx || !tx.enable_notification().unwrap() {
                break;
            }
        }
        if tx.needs_notification().unwrap() {
            tx.signal_used_queue().unwrap();
        }
        while self.pending[qp].len() > 64 {
            self.pending[qp].pop_front();
            self.counters.rx_drops.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn deliver(&mut self, qp: usize, vrings: &[VringRwLock]) {
        let rx = &vrings[2 * qp];
        let mem = self.mem.as_ref().unwrap().memory();
        loop {
            if self.event_idx {
                rx.disable_notification().unwrap();
            }
            loop {
                let chain = rx
                    .get_mut()
                    .get_queue_mut()
                    .pop_descriptor_chain(mem.clone());
                let Some(chain) = chain else { break };
                let head = chain.head_index();
                let bufs = chain
                    .writable()
                    .map(|d| (d.addr(), d.len()))
                    .collect::<Vec<_>>();
                self.stash[qp].push_back((head, bufs));
            }
            if !self.event_idx || !rx.enable_notification().unwrap() {
                break;
            }
        }
        let mrg = self.acked & feat::MRG_RXBUF != 0;
        let cap = |b: &Vec<(GuestAddress, u32)>| b.iter().map(|x| x.1 as usize).sum::<usize>();
        let mut used_any = false;
        while let Some(frame) = self.pending[qp].front() {
            let stash = &mut self.stash[qp];
            let mut need = frame.len();
            let mut take = 0;
            for c in stash.iter() {
                take += 1;
                let c = cap(&c.1);
                if c >= need {
                    need = 0;
                    break;
                }
                need -= c;
                if !mrg {
                    break;
                }
            }
            if stash.is_empty() {
                break;
            }
            if need > 0 {
                if mrg {
                    break; // wait for more buffers
                }
                // Too small a buffer without mergeable buffers: drop the frame.
                self.pending[qp].pop_front();
                self.counters.rx_drops.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let mut bytes = self.pending[qp].pop_front().unwrap();
            if mrg {
                bytes[10..12].copy_from_slice(&(take as u16).to_le_bytes());
            } else {
                bytes[10..12].copy_from_slice(&1u16.to_le_bytes());
            }
            let mut off = 0;
            for _ in 0..take {
                let (head, bufs) = self.stash[qp].pop_front().unwrap();
                let mut written = 0u32;
                for (a, l) in bufs {
                    let n = (l as usize).min(bytes.len() - off);
                    mem.write_slice(&bytes[off..off + n], a).unwrap();
                    off += n;
                    written += n as u32;
                }
                rx.add_used(head, written).unwrap();
                used_any = true;
            }
            self.counters.echoed.fetch_add(1, Ordering::Relaxed);
        }
        if used_any && rx.needs_notification().unwrap() {
            rx.signal_used_queue().unwrap();
        }
    }
}

impl VhostUserBackendMut for Echo {
    type Bitmap = ();
    type Vring = VringRwLock;

    fn num_queues(&self) -> usize {
        2 * self.qps
    }
    fn max_queue_size(&self) -> usize {
        1024
    }
    fn features(&self) -> u64 {
        feat::DAEMON_OFFERS
    }
    fn acked_features(&mut self, features: u64) {
        self.acked = features;
    }
    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::CONFIG
            | VhostUserProtocolFeatures::REPLY_ACK
    }
    fn set_event_idx(&mut self, enabled: bool) {
        self.event_idx = enabled;
    }
    fn update_memory(&mut self, mem: Mem) -> std::io::Result<()> {
        self.mem = Some(mem);
        for q in self.pending.iter_mut() {
            q.clear();
        }
        for s in self.stash.iter_mut() {
            s.clear();
        }
        Ok(())
    }
    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        Some(new_event_consumer_and_notifier(EventFlag::NONBLOCK).unwrap())
    }
    fn handle_event(
        &mut self,
        device_event: u16,
        _evset: EventSet,
        vrings: &[VringRwLock],
        _thread_id: usize,
    ) -> std::io::Result<()> {
        let q = device_event as usize;
        if q >= 2 * self.qps {
            return Ok(());
        }
        let qp = q / 2;
        if q % 2 == 1 {
            self.process_tx(qp, vrings);
        }
        self.deliver(qp, vrings);
        Ok(())
    }
}

struct EchoServer {
    _dir: TempDir,
    path: PathBuf,
    counters: Arc<Counters>,
}

fn echo_server(qps: usize) -> EchoServer {
    common::init_logging();
    let dir = TempDir::new("echo");
    let path = dir.path().join("echo.sock");
    let counters = Arc::new(Counters::default());
    let mut listener = Listener::new(&path, true).unwrap();
    let c = counters.clone();
    // A fresh daemon per connection: the vhost-user-backend handler keeps
    // per-connection state (owner, features) that a reconnect must not see.
    std::thread::spawn(move || loop {
        let backend = Arc::new(Mutex::new(Echo::new(qps, c.clone())));
        let mut daemon = VhostUserDaemon::new(
            "echo".into(),
            backend,
            GuestMemoryAtomic::new(GuestMemoryMmap::new()),
        )
        .unwrap();
        if daemon.start(&mut listener).is_err() {
            return;
        }
        let _ = daemon.wait();
    });
    EchoServer {
        _dir: dir,
        path,
        counters,
    }
}

fn echo_guest(path: &Path, qps: u16, features: u64) -> TestGuest {
    TestGuest::connect(path, qps, features).expect("connect to echo backend")
}

fn frame(tag: u64, len: usize) -> Vec<u8> {
    tagged_frame(mac(2), mac(1), tag, len)
}

#[test]
fn negotiation_against_echo() {
    let s = echo_server(1);
    let g = echo_guest(&s.path, 1, feat::ALL);
    assert_eq!(g.offered, feat::DAEMON_OFFERS);
    assert_eq!(g.features, feat::ALL);
    assert_eq!(g.queue_num, Some(2));
    assert!(g.protocol.contains(VhostUserProtocolFeatures::REPLY_ACK));
}

#[test]
fn layouts_roundtrip() {
    let s = echo_server(1);
    for features in [feat::ALL, feat::MINIMAL | feat::INDIRECT_DESC] {
        let mut g = echo_guest(&s.path, 1, features);
        g.post_rx(0, 64, 2048);
        let layouts = [
            Layout::Single,
            Layout::HdrSeparate,
            Layout::Chained(3),
            Layout::Chained(40),
            Layout::Pieces(vec![5, 7, 100]),
            Layout::Indirect(1),
            Layout::Indirect(6),
        ];
        for (i, l) in layouts.iter().enumerate() {
            let f = frame(i as u64, 60 + 97 * i);
            let hdr = NetHdr {
                flags: 0,
                gso_type: 0,
                hdr_len: 0,
                gso_size: 0,
                csum_start: 0,
                csum_offset: i as u16,
                num_buffers: 0,
            };
            g.send(
                0,
                &f,
                &TxOpts {
                    hdr,
                    layout: l.clone(),
                },
            );
            let r = g
                .recv(0, ARRIVE)
                .unwrap_or_else(|| panic!("{l:?}: nothing came back"));
            assert_eq!(r.data, f, "{l:?}");
            assert_eq!(r.hdr.csum_offset, i as u16, "{l:?}");
            assert_eq!(r.hdr.num_buffers, 1);
            assert_eq!(r.buffers, 1);
            assert!(g.wait_tx(0, ARRIVE));
        }
        g.check_idle().unwrap();
    }
}

#[test]
fn mergeable_rx_and_multi_descriptor_rx_chains() {
    let s = echo_server(1);
    let mut g = echo_guest(&s.path, 1, feat::ALL);
    g.post_rx(0, 32, 1024);
    let f = frame(7, 9000);
    g.send(0, &f, &TxOpts::layout(Layout::Chained(5)));
    let r = g.recv(0, ARRIVE).expect("merged frame");
    assert_eq!(r.buffers, 9);
    assert_eq!(r.hdr.num_buffers, 9);
    assert_eq!(r.used_lens[..8], [1024; 8]);
    assert_eq!(r.data, f);
    drop(g);

    // Non-mergeable guest with multi-descriptor and indirect RX chains (header split).
    let mut g = echo_guest(&s.path, 1, feat::MINIMAL | feat::INDIRECT_DESC);
    g.post_rx_chains(0, 4, &[6, 100, 2000], false);
    g.post_rx_chains(0, 4, &[6, 100, 2000], true);
    for i in 0..8 {
        let f = frame(100 + i, 1500);
        g.send(0, &f, &TxOpts::default());
        let r = g.recv(0, ARRIVE).expect("frame");
        assert_eq!(r.data, f);
        assert_eq!(r.used_lens, vec![12 + 1500]);
    }
}

#[test]
fn many_frames_wrap_the_rings_with_and_without_event_idx() {
    let s = echo_server(1);
    for features in [feat::ALL, feat::ALL & !feat::EVENT_IDX] {
        let mut g = echo_guest(&s.path, 1, features);
        let mut got = 0u64;
        for round in 0..10u64 {
            g.post_rx(0, 60, 2048);
            let frames: Vec<Vec<u8>> = (0..60).map(|i| frame(round * 100 + i, 200)).collect();
            g.send_burst(0, &frames, &TxOpts::default());
            let rs = g.recv_n(0, 60, ARRIVE);
            assert_eq!(rs.len(), 60, "round {round}");
            for (r, f) in rs.iter().zip(&frames) {
                assert_eq!(&r.data, f);
            }
            got += rs.len() as u64;
        }
        assert_eq!(got, 600);
        let (kicks, _, _) = g.notify_counts(TestGuest::tx_index(0));
        // (Frames the guest found without waiting leave their call unread.)
        let calls = g.collect_calls(TestGuest::rx_index(0));
        assert!(kicks > 0 && calls > 0, "tx kicks {kicks}, rx calls {calls}");
        g.check_idle().unwrap();
    }
}

#[test]
fn two_queue_pairs() {
    let s = echo_server(2);
    let mut g = echo_guest(&s.path, 2, feat::ALL);
    assert_eq!(g.queue_num, Some(4));
    for qp in 0..2 {
        g.post_rx(qp, 8, 2048);
    }
    for qp in 0..2u16 {
        let f = frame(qp as u64, 300);
        g.send(qp, &f, &TxOpts::default());
        let r = g.recv(qp, ARRIVE).expect("frame");
        assert_eq!(r.qp, qp);
        assert_eq!(r.data, f);
    }
}

#[test]
fn malformed_chains_are_returned_and_counted() {
    let s = echo_server(1);
    let mut g = echo_guest(&s.path, 1, feat::ALL);
    g.post_rx(0, 8, 2048);
    let f = frame(1, 100);
    g.send_bad_addr(0);
    g.send_straddling(0);
    g.send_loop(0, &f);
    g.send_huge_len(0);
    g.send_short_hdr(0);
    g.send_write_only(0, &f);
    g.send_nested_indirect(0, &f);
    g.send_indirect_loop(0, &f);
    assert!(g.wait_tx(0, ARRIVE), "malformed chains not returned");
    assert_eq!(s.counters.tx_errors.load(Ordering::Relaxed), 8);
    g.send(0, &f, &TxOpts::default());
    assert_eq!(g.recv(0, ARRIVE).expect("valid frame after errors").data, f);
}

#[test]
fn stop_disconnect_reconnect() {
    let s = echo_server(1);
    let mut g = echo_guest(&s.path, 1, feat::ALL);
    g.post_rx(0, 8, 2048);
    for i in 0..5 {
        g.send(0, &frame(i, 100), &TxOpts::default());
    }
    assert_eq!(g.recv_n(0, 5, ARRIVE).len(), 5);
    let bases = g.stop().unwrap();
    assert_eq!(bases, vec![8, 5]);
    drop(g);
    std::thread::sleep(Duration::from_millis(50));
    let mut g = echo_guest(&s.path, 1, feat::ALL);
    g.post_rx(0, 8, 2048);
    let f = frame(99, 100);
    g.send(0, &f, &TxOpts::default());
    assert_eq!(g.recv(0, ARRIVE).expect("after reconnect").data, f);
    assert!(s.counters.echoed.load(Ordering::Relaxed) >= 6);
}

#[test]
fn full_rx_ring_drops_in_echo() {
    let s = echo_server(1);
    let mut g = echo_guest(&s.path, 1, feat::ALL & !feat::MRG_RXBUF);
    g.post_rx(0, 4, 256); // too small for 1000-byte frames: dropped
    g.post_rx(0, 4, 2048);
    for i in 0..3 {
        g.send(0, &frame(i, 1000), &TxOpts::default());
    }
    let got = g.recv_n(0, 3, Duration::from_millis(500));
    assert!(got.is_empty(), "small buffers first: nothing fits");
    assert_eq!(s.counters.rx_drops.load(Ordering::Relaxed), 3);
}

#[test]
fn packet_helpers_are_not_vacuous() {
    use common::packet::*;
    // RFC 1071-style IPv4 header example (checksum 0xb861).
    let mut h = [
        0x45u8, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8, 0x00,
        0x01, 0xc0, 0xa8, 0x00, 0xc7,
    ];
    assert_eq!(inet_csum(&h), 0xb861);
    h[10] = 0xb8;
    h[11] = 0x61;
    assert_eq!(inet_csum(&h), 0);
    for v6 in [false, true] {
        let flow = if v6 {
            Flow::v6(mac(1), mac(2), 1, 2)
        } else {
            Flow::v4(mac(1), mac(2), 1, 2)
        };
        for len in [0, 1, 2, 1001] {
            let (full, _) = tcp_frame(&flow, 5, TCP_ACK, &pattern(len, 3), L4Csum::Full);
            let (part, hdr) = tcp_frame(&flow, 5, TCP_ACK, &pattern(len, 3), L4Csum::Partial);
            assert!(parse(&full).unwrap().l4_csum_ok);
            assert!(!parse(&part).unwrap().l4_csum_ok);
            assert_eq!(complete_csum(&part, &hdr), full);
            let mut bad = full.clone();
            let last = bad.len() - 1;
            bad[last] ^= 1;
            if len > 0 {
                assert!(
                    !parse(&bad).unwrap().l4_csum_ok,
                    "a flipped bit goes unnoticed"
                );
            }
            let (u, _) = udp_frame(&flow, &pattern(len, 4), L4Csum::Full);
            assert!(parse(&u).unwrap().l4_csum_ok);
        }
    }
}

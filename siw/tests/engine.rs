//! Two engines in memory: connection setup, WRITE / READ / SEND with data
//! verification (CRC off and on), Terminate paths.

use std::time::{Duration, Instant};

use siw::ddp::{ddp_ecode, llp_ecode, rdmap_ecode, rdmap_etype, Header, Layer, Opcode};
use siw::mpa::{self, Deframer, FrameKind, MpaFrame};
use siw::{
    Access, Completion, Config, ConnError, Connection, Event, MpaConfig, Sge, TermError, WcOpcode,
    WcStatus, WorkRequest,
};

struct Pair {
    a: Connection,
    b: Connection,
    ea: Vec<Event>,
    eb: Vec<Event>,
    /// Split every transfer into pieces of at most this many bytes.
    seg: usize,
}

fn cfg(crc: bool, fpdu: usize) -> Config {
    Config {
        mpa: MpaConfig {
            crc_required: crc,
            ..MpaConfig::default()
        },
        max_fpdu_len: fpdu,
        ..Config::default()
    }
}

impl Pair {
    fn new(ca: Config, cb: Config) -> Self {
        let now = Instant::now();
        Pair {
            a: Connection::initiator(ca, b"hello from a", now).unwrap(),
            b: Connection::responder(cb, now),
            ea: vec![],
            eb: vec![],
            seg: usize::MAX,
        }
    }

    /// Moves bytes both ways until nothing moves, collecting events.
    fn pump(&mut self) {
        self.pump_with(|_| {});
    }

    fn pump_with(&mut self, mut tamper_a_to_b: impl FnMut(&mut Vec<u8>)) {
        loop {
            let mut moved = false;
            if let Some(mut bytes) = self.a.poll_transmit() {
                tamper_a_to_b(&mut bytes);
                for c in bytes.chunks(self.seg) {
                    self.b.handle_bytes(c);
                }
                moved = true;
            }
            if let Some(bytes) = self.b.poll_transmit() {
                for c in bytes.chunks(self.seg) {
                    self.a.handle_bytes(c);
                }
                moved = true;
            }
            while let Some(e) = self.a.poll_event() {
                self.ea.push(e);
                moved = true;
            }
            while let Some(e) = self.b.poll_event() {
                if let Event::ConnectRequest { .. } = e {
                    self.b.accept(b"hello from b").unwrap();
                }
                self.eb.push(e);
                moved = true;
            }
            if !moved {
                break;
            }
        }
    }

    fn connect(ca: Config, cb: Config) -> Self {
        let mut p = Pair::new(ca, cb);
        p.pump();
        assert!(p.a.is_connected(), "a: {:?}", p.ea);
        assert!(p.b.is_connected(), "b: {:?}", p.eb);
        p
    }
}

fn sge(stag: u32, addr: u64, len: u32) -> Sge {
    Sge { stag, addr, len }
}

fn write(local: Sge, remote_stag: u32, remote_addr: u64) -> WorkRequest {
    WorkRequest::Write {
        local,
        remote_stag,
        remote_addr,
    }
}

fn read(local: Sge, remote_stag: u32, remote_addr: u64) -> WorkRequest {
    WorkRequest::Read {
        local,
        remote_stag,
        remote_addr,
    }
}

/// A plain Send: not solicited, invalidating nothing.
fn send(local: Sge) -> WorkRequest {
    WorkRequest::Send {
        local,
        solicited: false,
        invalidate: None,
    }
}

fn completions(ev: &[Event]) -> Vec<Completion> {
    ev.iter()
        .filter_map(|e| match e {
            Event::Completion(c) => Some(*c),
            _ => None,
        })
        .collect()
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn connect_exchanges_private_data() {
    for crc in [false, true] {
        let p = Pair::connect(cfg(crc, 1460), cfg(false, 1460));
        assert!(
            matches!(&p.ea[0], Event::Connected { private_data, negotiated }
            if private_data == b"hello from b" && negotiated.crc == crc && negotiated.enhanced)
        );
        assert!(
            matches!(&p.eb[0], Event::ConnectRequest { private_data, .. } if private_data == b"hello from a")
        );
        assert!(matches!(&p.eb[1], Event::Connected { .. }));
    }
}

fn data_transfer(crc: bool, fpdu: usize, seg: usize) {
    let mut p = Pair::connect(cfg(crc, fpdu), cfg(false, fpdu));
    p.seg = seg;
    const N: usize = 100_000;
    // b exposes a write target and a read source.
    let b_sink =
        p.b.register_mr(vec![0; N], Access::REMOTE_WRITE | Access::LOCAL_WRITE);
    let b_src = p.b.register_mr(pattern(N, 7), Access::REMOTE_READ);
    let b_recv = p.b.register_mr(vec![0; N], Access::LOCAL_WRITE);
    // a has a source and a read sink.
    let a_src = p.a.register_mr(pattern(N, 3), Access::NONE);
    let a_sink = p.a.register_mr(vec![0; N], Access::LOCAL_WRITE);

    p.b.post_recv(100, sge(b_recv, 0, N as u32)).unwrap();
    let local = sge(a_src, 0, N as u32);
    p.a.post_send(1, write(local, b_sink, 0)).unwrap();
    p.a.post_send(2, read(sge(a_sink, 0, N as u32), b_src, 0))
        .unwrap();
    p.a.post_send(
        3,
        WorkRequest::Send {
            local: sge(a_src, 10, 5000),
            solicited: true,
            invalidate: None,
        },
    )
    .unwrap();
    p.pump();

    let ca = completions(&p.ea);
    assert_eq!(ca.len(), 3, "{:?}", p.ea);
    assert_eq!(
        ca.iter()
            .map(|c| (c.wr_id, c.opcode, c.status))
            .collect::<Vec<_>>(),
        vec![
            (1, WcOpcode::Write, WcStatus::Success),
            (2, WcOpcode::Read, WcStatus::Success),
            (3, WcOpcode::Send, WcStatus::Success)
        ]
    );
    let cb = completions(&p.eb);
    assert_eq!(cb.len(), 1);
    assert_eq!(cb[0].wr_id, 100);
    assert_eq!(cb[0].byte_len, 5000);
    assert!(cb[0].solicited);
    assert_eq!(p.b.mem().data(b_sink).unwrap(), &pattern(N, 3)[..]);
    assert_eq!(p.a.mem().data(a_sink).unwrap(), &pattern(N, 7)[..]);
    assert_eq!(
        &p.b.mem().data(b_recv).unwrap()[..5000],
        &pattern(N, 3)[10..5010]
    );
    // b counts what a's tagged operations did to its memory (one WRITE
    // message in many segments, one READ request); a saw none from b.
    let ops = p.b.peer_ops();
    assert_eq!(
        (
            ops.writes,
            ops.write_bytes,
            ops.read_requests,
            ops.read_bytes
        ),
        (1, N as u64, 1, N as u64)
    );
    assert_eq!(p.a.peer_ops(), siw::PeerOps::default());
}

#[test]
fn write_read_send_crc_off() {
    data_transfer(false, 1460, usize::MAX);
}

#[test]
fn write_read_send_crc_on() {
    data_transfer(true, 1460, usize::MAX);
}

#[test]
fn write_read_send_tiny_fpdus_and_segments() {
    data_transfer(true, 64, 7);
    data_transfer(false, 97, 1);
}

#[test]
fn write_read_send_jumbo_fpdus() {
    data_transfer(true, 65535, 1000);
}

#[test]
fn corrupted_crc_terminates_with_llp_crc_error() {
    let mut p = Pair::connect(cfg(true, 1460), cfg(true, 1460));
    let b_sink = p.b.register_mr(vec![0; 4096], Access::REMOTE_WRITE);
    let a_src = p.a.register_mr(pattern(4096, 1), Access::NONE);
    p.a.post_send(9, write(sge(a_src, 0, 4096), b_sink, 0))
        .unwrap();
    let mut done = false;
    p.pump_with(|bytes| {
        if !done && bytes.len() > 100 {
            bytes[50] ^= 0x01;
            done = true;
        }
    });
    let crc = TermError::llp(llp_ecode::RECEIVED_CRC);
    assert!(
        p.eb.contains(&Event::Error(ConnError::LocalTerminate(crc))),
        "{:?}",
        p.eb
    );
    assert!(p
        .ea
        .iter()
        .any(|e| matches!(e, Event::Error(ConnError::RemoteTerminate(t)) if t.error == crc)));
    assert!(matches!(p.ea.last(), Some(Event::Closed)));
    assert!(matches!(p.eb.last(), Some(Event::Closed)));
    assert!(p.a.is_finished() && p.b.is_finished());
}

/// Runs one WR from a against b and returns the Terminate error both sides saw.
fn expect_terminate(setup: impl FnOnce(&mut Pair) -> WorkRequest) -> TermError {
    let mut p = Pair::connect(cfg(false, 1460), cfg(false, 1460));
    let wr = setup(&mut p);
    p.a.post_send(77, wr).unwrap();
    p.pump();
    let local =
        p.eb.iter()
            .find_map(|e| match e {
                Event::Error(ConnError::LocalTerminate(t)) => Some(*t),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no terminate at b: {:?}", p.eb));
    let remote =
        p.ea.iter()
            .find_map(|e| match e {
                Event::Error(ConnError::RemoteTerminate(t)) => Some(t.clone()),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no terminate at a: {:?}", p.ea));
    assert_eq!(local, remote.error);
    // The offending header is copied back.
    assert!(remote.offending_header().is_some());
    // Sends and Writes complete locally once transmitted (as in siw); a
    // Read whose response never came is flushed.
    let ca = completions(&p.ea);
    assert!(ca
        .iter()
        .all(|c| c.opcode != WcOpcode::Read || c.status == WcStatus::Flushed));
    assert!(ca.iter().any(|c| c.wr_id == 77));
    local
}

#[test]
fn write_without_remote_write_right() {
    let t = expect_terminate(|p| {
        let sink =
            p.b.register_mr(vec![0; 64], Access::LOCAL_WRITE | Access::REMOTE_READ);
        let src = p.a.register_mr(vec![1; 64], Access::NONE);
        write(sge(src, 0, 64), sink, 0)
    });
    // siw: DDP has no access-rights code; "invalid STag" is used.
    assert_eq!(t, TermError::ddp_tagged(ddp_ecode::T_INVALID_STAG));
    assert_eq!(t.layer, Layer::Ddp);
}

#[test]
fn write_out_of_bounds() {
    let t = expect_terminate(|p| {
        let sink = p.b.register_mr(vec![0; 64], Access::REMOTE_WRITE);
        let src = p.a.register_mr(vec![1; 64], Access::NONE);
        write(sge(src, 0, 64), sink, 32)
    });
    assert_eq!(t, TermError::ddp_tagged(ddp_ecode::T_BASE_BOUNDS));
}

#[test]
fn read_without_remote_read_right() {
    let t = expect_terminate(|p| {
        let src = p.b.register_mr(vec![0; 64], Access::REMOTE_WRITE);
        let sink = p.a.register_mr(vec![1; 64], Access::LOCAL_WRITE);
        read(sge(sink, 0, 64), src, 0)
    });
    assert_eq!(
        t,
        TermError::rdmap(rdmap_etype::REMOTE_PROTECTION, rdmap_ecode::ACCESS_RIGHTS)
    );
}

#[test]
fn read_from_unknown_stag() {
    let t = expect_terminate(|p| {
        let sink = p.a.register_mr(vec![1; 64], Access::LOCAL_WRITE);
        read(sge(sink, 0, 64), 0xdead_be01, 0)
    });
    assert_eq!(
        t,
        TermError::rdmap(rdmap_etype::REMOTE_PROTECTION, rdmap_ecode::INVALID_STAG)
    );
}

#[test]
fn send_without_receive_buffer() {
    let t = expect_terminate(|p| {
        let src = p.a.register_mr(vec![1; 64], Access::NONE);
        send(sge(src, 0, 64))
    });
    assert_eq!(t, TermError::ddp_untagged(ddp_ecode::UT_INVALID_MSN_NOBUF));
}

#[test]
fn send_longer_than_receive_buffer() {
    let t = expect_terminate(|p| {
        let r = p.b.register_mr(vec![0; 16], Access::LOCAL_WRITE);
        p.b.post_recv(5, sge(r, 0, 16)).unwrap();
        let src = p.a.register_mr(vec![1; 64], Access::NONE);
        send(sge(src, 0, 64))
    });
    assert_eq!(t, TermError::ddp_untagged(ddp_ecode::UT_MSG_TOOLONG));
}

#[test]
fn send_with_invalidate_then_write_is_refused() {
    let mut p = Pair::connect(cfg(false, 1460), cfg(false, 1460));
    let target = p.b.register_mr(
        vec![0; 64],
        Access::REMOTE_WRITE | Access::REMOTE_INVALIDATE,
    );
    let r = p.b.register_mr(vec![0; 16], Access::LOCAL_WRITE);
    p.b.post_recv(5, sge(r, 0, 16)).unwrap();
    let src = p.a.register_mr(vec![1; 64], Access::NONE);
    p.a.post_send(
        1,
        WorkRequest::Send {
            local: sge(src, 0, 0),
            solicited: false,
            invalidate: Some(target),
        },
    )
    .unwrap();
    p.pump();
    let cb = completions(&p.eb);
    assert_eq!(cb[0].invalidated, Some(target));
    assert_eq!(cb[0].byte_len, 0);
    assert!(!p.b.mem().is_valid(target));
    p.a.post_send(2, write(sge(src, 0, 8), target, 0)).unwrap();
    p.pump();
    assert!(p.eb.contains(&Event::Error(ConnError::LocalTerminate(
        TermError::ddp_tagged(ddp_ecode::T_INVALID_STAG)
    ))));
}

#[test]
fn outstanding_reads_respect_ord() {
    let mut ca = cfg(false, 1460);
    ca.mpa.ord = 2;
    let mut p = Pair::connect(ca, cfg(false, 1460));
    assert_eq!(p.a.negotiated().unwrap().ord, 2);
    let src = p.b.register_mr(pattern(1000, 9), Access::REMOTE_READ);
    let sink = p.a.register_mr(vec![0; 10_000], Access::LOCAL_WRITE);
    for i in 0..10u64 {
        p.a.post_send(i, read(sge(sink, i * 1000, 1000), src, 0))
            .unwrap();
    }
    // Without answers only ORD read requests leave.
    let bytes = p.a.poll_transmit().unwrap();
    let mut d = Deframer::new(false, 65535);
    d.push(&bytes);
    let mut n = 0;
    while let Some(u) = d.next_ulpdu().unwrap() {
        assert_eq!(Header::decode(u).unwrap().0.opcode, Opcode::ReadRequest);
        n += 1;
    }
    assert_eq!(n, 2);
    for c in bytes.chunks(100) {
        p.b.handle_bytes(c);
    }
    p.pump();
    let ca = completions(&p.ea);
    assert_eq!(ca.len(), 10);
    assert!(ca
        .iter()
        .enumerate()
        .all(|(i, c)| c.wr_id == i as u64 && c.status == WcStatus::Success));
    for i in 0..10 {
        assert_eq!(
            &p.a.mem().data(sink).unwrap()[i * 1000..(i + 1) * 1000],
            &pattern(1000, 9)[..]
        );
    }
}

#[test]
fn reject_with_private_data() {
    let now = Instant::now();
    let mut a = Connection::initiator(Config::default(), b"please", now).unwrap();
    let mut b = Connection::responder(Config::default(), now);
    b.handle_bytes(&a.poll_transmit().unwrap());
    assert!(matches!(b.poll_event(), Some(Event::ConnectRequest { .. })));
    b.reject(b"go away").unwrap();
    let rep = b.poll_transmit().unwrap();
    let (f, _) = MpaFrame::parse(&rep).unwrap().unwrap();
    assert!(f.reject && f.kind == FrameKind::Reply);
    a.handle_bytes(&rep);
    assert_eq!(
        a.poll_event(),
        Some(Event::Rejected {
            private_data: b"go away".to_vec()
        })
    );
    assert!(matches!(
        a.poll_event(),
        Some(Event::Error(ConnError::Negotiation(_)))
    ));
    assert_eq!(a.poll_event(), Some(Event::Closed));
    assert!(a.is_finished());
}

#[test]
fn markers_are_refused_with_reject_reply() {
    let mut req = mpa::initiator_request(&MpaConfig::default(), b"m");
    req.markers = true;
    let mut b = Connection::responder(Config::default(), Instant::now());
    b.handle_bytes(&req.to_bytes().unwrap());
    let (rep, _) = MpaFrame::parse(&b.poll_transmit().unwrap())
        .unwrap()
        .unwrap();
    assert!(rep.reject);
    assert!(!rep.markers);
    assert!(matches!(
        b.poll_event(),
        Some(Event::Error(ConnError::Negotiation(_)))
    ));
    assert!(b.is_finished());
}

#[test]
fn peer_to_peer_rtr_gates_responder() {
    for read_only in [false, true] {
        let mut ca = cfg(true, 1460);
        ca.mpa.peer_to_peer = true;
        let now = Instant::now();
        let mut a = Connection::initiator(ca, b"", now).unwrap();
        if read_only {
            // Offer only READ RTR by hand-crafting a Request.
            let _ = a.poll_transmit();
        }
        let mut b = Connection::responder(cfg(false, 1460), now);
        if read_only {
            let mut req = mpa::initiator_request(&MpaConfig::default(), b"");
            let io = req.ird_ord.as_mut().unwrap();
            io.peer_to_peer = true;
            io.read_rtr = true;
            b.handle_bytes(&req.to_bytes().unwrap());
            assert!(
                matches!(b.poll_event(), Some(Event::ConnectRequest { negotiated, .. })
                if negotiated.rtr == Some(siw::Rtr::Read))
            );
            continue;
        }
        b.handle_bytes(&a.poll_transmit().unwrap());
        assert!(matches!(b.poll_event(), Some(Event::ConnectRequest { .. })));
        b.accept(b"").unwrap();
        // b has a Send queued but must stay silent until the RTR arrives.
        let r = b.register_mr(vec![5; 8], Access::NONE);
        b.post_send(1, send(sge(r, 0, 8))).unwrap();
        let reply = b.poll_transmit().unwrap();
        assert_eq!(reply.len(), mpa::RR_HEADER_LEN + 4);
        let ar = a.register_mr(vec![0; 8], Access::LOCAL_WRITE);
        a.post_recv(1, sge(ar, 0, 8)).unwrap();
        a.handle_bytes(&reply);
        let rtr = a.poll_transmit().unwrap();
        // A zero-length RDMA Write with CRC.
        assert_eq!(rtr.len(), mpa::fpdu_len(14));
        let mut d = Deframer::new(true, 65535);
        d.push(&rtr);
        let (h, p) = Header::decode(d.next_ulpdu().unwrap().unwrap()).unwrap();
        assert_eq!((h.opcode, h.last, p.len()), (Opcode::Write, true, 0));
        b.handle_bytes(&rtr);
        let send = b.poll_transmit().unwrap();
        a.handle_bytes(&send);
        while let Some(e) = a.poll_event() {
            if let Event::Completion(c) = e {
                assert_eq!((c.wr_id, c.byte_len, c.status), (1, 8, WcStatus::Success));
            }
        }
        assert_eq!(a.mem().data(ar).unwrap(), &[5; 8]);
    }
}

#[test]
fn setup_timeout() {
    let now = Instant::now();
    let c = Config {
        setup_timeout: Some(Duration::from_secs(1)),
        ..Config::default()
    };
    let mut a = Connection::initiator(c, b"", now).unwrap();
    let _ = a.poll_transmit();
    assert_eq!(a.poll_timeout(), Some(now + Duration::from_secs(1)));
    a.handle_timeout(now + Duration::from_millis(500));
    assert!(a.poll_event().is_none());
    a.handle_timeout(now + Duration::from_secs(2));
    assert_eq!(a.poll_event(), Some(Event::Error(ConnError::Timeout)));
    assert_eq!(a.poll_event(), Some(Event::Closed));
}

#[test]
fn eof_mid_transfer_is_stream_lost_and_flushes() {
    let mut p = Pair::connect(cfg(false, 1460), cfg(false, 1460));
    let sink = p.a.register_mr(vec![0; 1 << 20], Access::LOCAL_WRITE);
    let src = p.b.register_mr(vec![0; 1 << 20], Access::REMOTE_READ);
    p.a.post_send(1, read(sge(sink, 0, 1 << 20), src, 0))
        .unwrap();
    let req = p.a.poll_transmit().unwrap();
    p.b.handle_bytes(&req);
    let part = p.b.poll_transmit().unwrap();
    p.a.handle_bytes(&part[..part.len() / 2]);
    p.a.handle_eof();
    let ev: Vec<_> = std::iter::from_fn(|| p.a.poll_event()).collect();
    assert!(matches!(ev[0], Event::Error(ConnError::StreamLost(_))));
    assert_eq!(completions(&ev)[0].status, WcStatus::Flushed);
    assert_eq!(ev.last(), Some(&Event::Closed));
}

#[test]
fn corrupted_length_field_is_bounded() {
    let mut c = cfg(false, 1460);
    c.max_rx_ulpdu = 2000;
    let mut p = Pair::connect(cfg(false, 1460), c);
    p.b.handle_bytes(&[0xff, 0xff, 0, 0]);
    let ev: Vec<_> = std::iter::from_fn(|| p.b.poll_event()).collect();
    assert!(matches!(ev[0], Event::Error(ConnError::LocalTerminate(t)) if t.layer == Layer::Ddp));
    // The Terminate still goes out.
    assert!(p.b.poll_transmit().is_some());
}

#[test]
fn read_requests_beyond_ird_terminate() {
    let mut ca = cfg(false, 1460);
    ca.mpa.ord = 1;
    let mut cb = cfg(false, 1460);
    cb.mpa.ird = 1;
    let mut p = Pair::connect(ca, cb);
    assert_eq!(p.b.negotiated().unwrap().ird, 1);
    let src = p.b.register_mr(vec![0; 64], Access::REMOTE_READ);
    // A misbehaving peer sends two Read Requests back to back.
    let mut bytes = Vec::new();
    for msn in 1..=2 {
        let mut u = Vec::new();
        Header::untagged(Opcode::ReadRequest, true, 0, 1, msn, 0).encode(&mut u);
        siw::ddp::ReadRequest {
            sink_stag: 5,
            sink_to: 0,
            size: 64,
            src_stag: src,
            src_to: 0,
        }
        .encode(&mut u);
        mpa::write_fpdu(&mut bytes, &u, &[], false);
    }
    p.b.handle_bytes(&bytes);
    let ev: Vec<_> = std::iter::from_fn(|| p.b.poll_event()).collect();
    assert_eq!(
        ev[0],
        Event::Error(ConnError::LocalTerminate(TermError::rdmap(
            rdmap_etype::REMOTE_OPERATION,
            rdmap_ecode::CATASTROPHIC_STREAM
        )))
    );
}

#[test]
fn msn_out_of_range_terminates() {
    let mut p = Pair::connect(cfg(false, 1460), cfg(false, 1460));
    let r = p.b.register_mr(vec![0; 16], Access::LOCAL_WRITE);
    p.b.post_recv(1, sge(r, 0, 16)).unwrap();
    let mut u = Vec::new();
    Header::untagged(Opcode::Send, true, 0, 0, 7, 0).encode(&mut u);
    let mut bytes = Vec::new();
    mpa::write_fpdu(&mut bytes, &u, b"x", false);
    p.b.handle_bytes(&bytes);
    assert_eq!(
        p.b.poll_event(),
        Some(Event::Error(ConnError::LocalTerminate(
            TermError::ddp_untagged(ddp_ecode::UT_INVALID_MSN_RANGE)
        )))
    );
}

//! The siw connection engine (`Connection::handle_bytes`) fed arbitrary bytes.
//!
//! Mode A (first byte even): raw bytes into a fresh responder (MPA request
//! parsing, accept, then FPDUs), in arbitrary segments.
//! Mode B (first byte odd): a connected initiator/responder pair (real MPA
//! handshake in memory); the fuzz input is a list of ULPDUs that the harness
//! frames as valid FPDUs (length, pad, CRC if negotiated) and feeds to the
//! responder, optionally patching tagged headers with a registered STag, so
//! DDP/RDMAP placement, Read responses, Send/Receive matching and Terminate
//! handling are reached.
//!
//! Invariants: no panic; completions never outnumber posted work requests;
//! the engine's output drains to the peer without panicking the peer; the
//! engine's own output is always well framed (the peer's deframer
//! accepts it).
#![no_main]

use std::time::Instant;

use libfuzzer_sys::fuzz_target;
use siw::mpa::{self, Deframer};
use siw::{Access, Config, Connection, Event, Sge, WorkRequest};

fn drain(c: &mut Connection, completions: &mut u64) {
    while let Some(e) = c.poll_event() {
        match e {
            Event::ConnectRequest { .. } => {
                let _ = c.accept(b"fuzz");
            }
            Event::Completion(_) => *completions += 1,
            _ => {}
        }
    }
}

fn check_framing(bytes: &[u8], crc: bool) {
    let mut d = Deframer::new(crc, 65535);
    d.push(bytes);
    while let Some(_u) = d.next_ulpdu().expect("engine output is well framed") {}
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, data)) = data.split_first() else {
        return;
    };
    let now = Instant::now();
    let mut comps = 0u64;
    if mode & 1 == 0 {
        let mut b = Connection::responder(Config::default(), now);
        let seg = usize::from(mode >> 1) + 1;
        for c in data.chunks(seg) {
            b.handle_bytes(c);
            drain(&mut b, &mut comps);
            while b.poll_transmit().is_some() {}
        }
        b.handle_eof();
        drain(&mut b, &mut comps);
        assert_eq!(comps, 0, "completions without posted work");
        return;
    }

    let crc = mode & 2 != 0;
    let cfg = Config {
        mpa: siw::MpaConfig {
            crc_required: crc,
            ..Default::default()
        },
        ..Config::default()
    };
    let mut a = Connection::initiator(cfg.clone(), b"a", now).expect("initiator");
    let mut b = Connection::responder(cfg, now);
    let (mut ca, mut cb) = (0u64, 0u64);
    for _ in 0..16 {
        let mut moved = false;
        while let Some(x) = a.poll_transmit() {
            b.handle_bytes(&x);
            moved = true;
        }
        while let Some(x) = b.poll_transmit() {
            a.handle_bytes(&x);
            moved = true;
        }
        drain(&mut a, &mut ca);
        drain(&mut b, &mut cb);
        if !moved {
            break;
        }
    }
    assert!(a.is_connected() && b.is_connected(), "handshake");
    let crc = b.negotiated().expect("negotiated").crc;

    // Responder resources: a region for tagged access and posted receives.
    let stag = b.register_mr(vec![0u8; 4096], Access::ALL);
    let mut posted = 0u64;
    for i in 0..4u64 {
        if b.post_recv(
            i,
            Sge {
                stag,
                addr: i * 1024,
                len: 1024,
            },
        )
        .is_ok()
        {
            posted += 1;
        }
    }
    if mode & 4 != 0 {
        let a_stag = a.register_mr(vec![7u8; 2048], Access::ALL);
        let _ = b.post_send(
            100,
            WorkRequest::Read {
                local: Sge {
                    stag,
                    addr: 0,
                    len: 512,
                },
                remote_stag: a_stag,
                remote_addr: 0,
            },
        );
        posted += 1;
    }

    // The fuzz input: [len u8][flags u8][ulpdu bytes] ...
    let mut rest = data;
    let mut stream = Vec::new();
    while rest.len() >= 2 {
        let len = usize::from(rest[0]).min(rest.len() - 2);
        let flags = rest[1];
        let mut u = rest[2..2 + len].to_vec();
        rest = &rest[2 + len..];
        if flags & 1 != 0 && u.len() >= 6 {
            u[2..6].copy_from_slice(&stag.to_be_bytes());
        }
        if flags & 2 != 0 && u.len() >= 2 {
            // Valid DDP/RDMAP versions, keep T/L/opcode.
            u[1] = (u[1] & 0x0f) | 0x40;
            u[0] = (u[0] & 0xc0) | 0x01;
        }
        mpa::write_fpdu(&mut stream, &[], &u, crc);
    }
    let seg = usize::from(mode >> 3) * 7 + 1;
    for c in stream.chunks(seg) {
        b.handle_bytes(c);
        drain(&mut b, &mut cb);
    }
    // Whatever the responder answers goes back to the initiator.
    let mut out = Vec::new();
    while let Some(x) = b.poll_transmit() {
        out.extend_from_slice(&x);
    }
    check_framing(&out, crc);
    a.handle_bytes(&out);
    drain(&mut a, &mut ca);
    drain(&mut b, &mut cb);
    assert!(cb <= posted, "{cb} completions for {posted} posted WRs");
    assert_eq!(ca, 0, "initiator completed work it never posted");
});

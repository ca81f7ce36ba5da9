//! The protocol checker (`wire-checker`) on arbitrary frame sequences:
//! raw Ethernet frames, RoCEv2 frames with arbitrary bytes after the UDP
//! header, and TCP segments with arbitrary sequence numbers and payloads
//! (seeded with MPA keys and CLC eyecatchers) between two endpoints.
//!
//! Invariants: no panic; the findings ring, the flow table and the
//! counters stay within the configured bounds.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wire_checker::{Checker, CheckerConfig};

const IPS: [[u8; 4]; 3] = [[10, 0, 0, 1], [10, 0, 0, 2], [10, 0, 0, 3]];

fn eth_ipv4(proto: u8, src: [u8; 4], dst: [u8; 4], l4: &[u8]) -> Vec<u8> {
    let mut f = vec![2, 0, 0, 0, 0, dst[3], 2, 0, 0, 0, 0, src[3], 0x08, 0x00];
    let total = (20 + l4.len()).min(65535) as u16;
    f.extend_from_slice(&[
        0x45,
        0,
        (total >> 8) as u8,
        total as u8,
        0,
        0,
        0x40,
        0,
        64,
        proto,
        0,
        0,
    ]);
    f.extend_from_slice(&src);
    f.extend_from_slice(&dst);
    f.extend_from_slice(l4);
    f
}

fuzz_target!(|data: &[u8]| {
    let cfg = CheckerConfig {
        max_flows: 4,
        max_findings: 8,
        max_stream_buffer: 4096,
        // Small: retransmissions reach past it, the ring trims.
        retransmit_window: 64,
    };
    let mut c = Checker::new(cfg);
    let mut rest = data;
    let mut n = 0u64;
    while rest.len() >= 4 {
        let (kind, a, len) = (
            rest[0],
            rest[1],
            usize::from(u16::from_be_bytes([rest[2], rest[3]])),
        );
        rest = &rest[4..];
        let body = &rest[..len.min(rest.len())];
        rest = &rest[body.len()..];
        let (src, dst) = (
            IPS[usize::from(a & 3) % 3],
            IPS[usize::from((a >> 2) & 3) % 3],
        );
        let frame = match kind % 4 {
            0 => body.to_vec(),
            1 => {
                let mut udp = vec![0xc0, a, 0x12, 0xb7];
                let ul = (8 + body.len()).min(65535) as u16;
                udp.extend_from_slice(&ul.to_be_bytes());
                udp.extend_from_slice(&[0, 0]);
                udp.extend_from_slice(body);
                eth_ipv4(17, src, dst, &udp)
            }
            k => {
                let seq = body
                    .get(..4)
                    .map_or(0, |s| u32::from_be_bytes([s[0], s[1], s[2], s[3]]));
                let payload = body.get(4..).unwrap_or_default();
                let (sp, dp) = if a & 0x10 != 0 {
                    (4000u16, 5000u16)
                } else {
                    (5000, 4000)
                };
                let mut tcp = Vec::new();
                tcp.extend_from_slice(&sp.to_be_bytes());
                tcp.extend_from_slice(&dp.to_be_bytes());
                tcp.extend_from_slice(&seq.to_be_bytes());
                tcp.extend_from_slice(&[
                    0,
                    0,
                    0,
                    0,
                    0x50,
                    if k == 3 { 0x19 } else { 0x18 },
                    0xff,
                    0xff,
                    0,
                    0,
                    0,
                    0,
                ]);
                if a & 0x20 != 0 {
                    tcp.extend_from_slice(b"MPA ID Req Frame");
                } else if a & 0x40 != 0 {
                    tcp.extend_from_slice(&[0xe2, 0xd4, 0xc3, 0xd9]);
                }
                tcp.extend_from_slice(payload);
                eth_ipv4(6, src, dst, &tcp)
            }
        };
        c.observe(n, "p0", &frame);
        n += 1;
    }
    assert!(c.findings().len() <= cfg.max_findings);
    let f = c.flows();
    let halves: usize = f.roce.iter().map(|x| x.halves.len()).sum();
    assert!(halves <= 2 * cfg.max_flows);
    assert!(f.iwarp.len() + f.smc.len() <= cfg.max_flows);
    let s = c.stats();
    assert_eq!(s.frames, n);
    assert!(s.findings >= c.findings().len() as u64);
});

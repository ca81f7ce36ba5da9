//! Shared helpers for the integration tests.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use devmem_nic::{BufferId, Nic, NicConfig, Placement, QueueConfig};

pub fn v4(a: [u8; 4]) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(a))
}

pub fn v6(s: &str) -> IpAddr {
    IpAddr::V6(s.parse::<Ipv6Addr>().unwrap())
}

/// Deterministic xorshift64* generator.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// The devmem validation pattern: 1, 2, ..., 6, '\n', repeating (`-v 7`).
pub fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| match i % 7 {
            6 => b'\n',
            k => k as u8 + 1,
        })
        .collect()
}

/// A NIC with `queues` queues, each posted with `headers` header buffers
/// (ids 0..) and `payloads` payload buffers (ids 1000..).
pub fn nic_with_buffers(queues: u16, qc: QueueConfig, headers: u32, payloads: u32) -> Nic {
    let mut nic = Nic::new(NicConfig {
        num_queues: queues,
        queue: qc,
        ..NicConfig::default()
    })
    .unwrap();
    for q in 0..queues {
        for id in 0..headers {
            nic.post_header(q, id).unwrap();
        }
        for id in 0..payloads {
            nic.post_payload(q, 1000 + id).unwrap();
        }
    }
    nic
}

/// Simulated device memory: what each buffer holds after placement.
#[derive(Default)]
pub struct Memory {
    pub header: HashMap<BufferId, Vec<u8>>,
    pub payload: HashMap<BufferId, Vec<u8>>,
}

impl Memory {
    /// Copies a placement into the simulated buffers, asserting buffer
    /// sizes and that no live buffer is overwritten.
    pub fn write(&mut self, frame: &[u8], p: &Placement, header_size: usize, payload_size: usize) {
        if let Some(h) = &p.header {
            assert!(h.frame_range.len() <= header_size);
            let old = self
                .header
                .insert(h.buffer, frame[h.frame_range.clone()].to_vec());
            assert!(
                old.is_none(),
                "header buffer {} overwritten while held",
                h.buffer
            );
        }
        for s in &p.payload {
            assert!(s.frame_range.len() <= payload_size);
            assert!(!s.frame_range.is_empty(), "empty payload segment");
            let old = self
                .payload
                .insert(s.buffer, frame[s.frame_range.clone()].to_vec());
            assert!(
                old.is_none(),
                "payload buffer {} overwritten while held",
                s.buffer
            );
        }
    }

    /// Frees the buffers of a placement in the simulated memory.
    pub fn release(&mut self, p: &Placement) {
        if let Some(h) = &p.header {
            self.header.remove(&h.buffer);
        }
        for s in &p.payload {
            self.payload.remove(&s.buffer);
        }
    }

    /// Reads back header bytes and payload bytes of a placement.
    pub fn read(&self, p: &Placement) -> (Vec<u8>, Vec<u8>) {
        let h = p
            .header
            .as_ref()
            .map(|h| self.header[&h.buffer].clone())
            .unwrap_or_default();
        let mut d = Vec::new();
        for s in &p.payload {
            d.extend_from_slice(&self.payload[&s.buffer]);
        }
        (h, d)
    }
}

/// Asserts that the segments of a placement cover `0..len` exactly once, in order.
pub fn assert_covers(p: &Placement, len: usize) {
    let mut at = 0;
    for s in p.segments() {
        assert_eq!(s.frame_range.start, at, "gap or overlap in {p:?}");
        at = s.frame_range.end;
    }
    assert_eq!(at, len, "placement does not cover the frame: {p:?}");
}

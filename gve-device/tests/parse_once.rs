//! The device reads a received frame's headers from the view the edge
//! hands with it (`PciDevice::receive(frame, view, io)`,
//! `rx_queue(frame, view)`): steering, RSS, the completion's packet type
//! and checksums, header split and HW-GRO parse nothing again. Counted
//! with `wire::parse_calls()` (feature `parse-count`); its own test binary,
//! so that no other test's parses are counted.

mod common;

use common::*;
use gve_device::GveConfig;
use pci_model::{DeviceIo, PciDevice};

const A: [u8; 4] = [10, 0, 0, 1];
const B: [u8; 4] = [10, 0, 0, 2];

#[test]
fn receive_and_rx_queue_parse_nothing_again() {
    let mut g = Guest::new(GveConfig::default());
    g.probe();
    // Two queues (RSS reads the view), header split, HW-GRO on.
    g.open(2, 64, 2048, true);
    let frames: Vec<Vec<u8>> = (0..16u16)
        .map(|i| tcp4(A, B, 40000 + i, 5201, 1, 0x18, &[i as u8; 300]))
        .collect();
    let views: Vec<_> = frames.iter().map(|f| wire::parse(f)).collect();
    let before = wire::parse_calls();
    for (f, v) in frames.iter().zip(&views) {
        let q = g.dev.rx_queue(f, v);
        assert!(q < 2, "steered to queue {q}");
        let mem = g.mem.clone();
        let mut io = DeviceIo::new(&mem, g.now);
        g.dev.begin_rx_burst();
        g.dev.receive(f, v, &mut io).expect("taken");
        g.dev.end_rx_burst(&mut io);
    }
    // Before the view was passed, the device parsed every frame in
    // `receive` and again in `rx_queue`: 32 here.
    assert_eq!(wire::parse_calls() - before, 0);
    let packets: u64 = (0..2)
        .map(|q| g.dev.status().counters.rx_queues[q].packets)
        .sum();
    assert_eq!(packets, 16, "every frame written to a queue");
}

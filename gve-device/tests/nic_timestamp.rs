//! NIC timestamps (`GveConfig::nic_timestamp`, `gve_ptp.c`): the option
//! the driver takes, REPORT_NIC_TIMESTAMP writing the device clock, and RX
//! completions carrying its low 32 bits with the valid bit; off by default
//! (the command then fails as unimplemented, as before).

mod common;

use std::time::Duration;

use common::*;
use gve_device::adminq::{opcode, status};
use gve_device::GveConfig;

fn up(ts: bool) -> Guest {
    let mut g = Guest::new(GveConfig {
        nic_timestamp: ts,
        ..GveConfig::default()
    });
    g.probe();
    g.open(1, 64, 2048, false);
    g
}

fn report(g: &mut Guest) -> (u32, Vec<u8>) {
    let addr = g.alloc(40, 8);
    g.write(addr, &[0xee; 40]);
    let st = g.adminq_cmd(cmd(
        opcode::REPORT_NIC_TIMESTAMP,
        &[&40u64.to_be_bytes()[..], &addr.to_be_bytes()].concat(),
    ));
    (st, g.read(addr, 40))
}

#[test]
fn the_nic_clock_is_offered_read_and_stamped_on_receive() {
    let mut g = up(true);
    assert!(g.described.nic_timestamp, "option and DQO_RDA bit 8");
    g.advance(Duration::from_millis(1500));
    let (st, r) = report(&mut g);
    assert_eq!(st, status::PASSED);
    let clock = u64::from_be_bytes(r[..8].try_into().unwrap());
    assert!(clock >= 1_500_000_000, "the device's time in ns: {clock}");
    assert_eq!(&r[8..], &[0; 32], "reserved words zeroed");
    g.advance(Duration::from_millis(3));
    let f = tcp4([10, 0, 0, 1], [10, 0, 0, 2], 1, 2, 0, 0x18, b"stamped");
    g.receive(&f).unwrap();
    let c = g.rx_completions(0);
    let ts = c[0].ts.expect("valid timestamp");
    // The driver extends it from its last read (gve_rx_get_hwtstamp).
    let diff = ts.wrapping_sub(clock as u32) as i32;
    assert!(
        (3_000_000..4_000_000).contains(&diff),
        "{diff} ns after the read"
    );
}

#[test]
fn without_the_option_there_is_no_clock() {
    let mut g = up(false);
    assert!(!g.described.nic_timestamp);
    let (st, r) = report(&mut g);
    assert_eq!(st, status::UNIMPLEMENTED);
    assert_eq!(r, vec![0xee; 40], "nothing written");
    let f = tcp4([10, 0, 0, 1], [10, 0, 0, 2], 1, 2, 0, 0x18, b"plain");
    g.receive(&f).unwrap();
    assert_eq!(g.rx_completions(0)[0].ts, None);
}

//! The emulated erdma function under a hostile driver (as `erdma_device`:
//! registers, command queue, doorbells, WQEs, frames, time, resets) mixed
//! with device-fault rules the bench adds and clears at random (every erdma
//! kind, valid and invalid parameters, counts, probabilities), `set_link`,
//! and the device trace switched on and off.
//! Invariants: no panic; at most `MAX_DEVICE_FAULT_RULES` rules; a rule
//! never fires more often than its count.
#![no_main]

use std::time::Duration;

use erdma_device::{ErdmaConfig, ErdmaDevice};
use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use pci_model::fault::MAX_DEVICE_FAULT_RULES;
use pci_model::{DeviceIo, FaultSpec, PciDevice};

// The device targets' hostile driver: its steps, shared.
#[path = "pci_driver.rs"]
mod pci_driver;

use pci_driver::MEM;

const KEYS: &[&str] = &["opcode", "status", "event", "qpn", "cqn", "error", "queue"];
const VALUES: &[&str] = &[
    "CREATE_QP",
    "cmdq_opcode_modify_qp",
    "common:3",
    "rdma:17",
    "QP_FATAL",
    "cq_err",
    "ACC_ERR_EVENT",
    "RETRY_EXC_ERR",
    "ERDMA_WC_RECV_RIGHT_VIOLATION_ERR",
    "send",
    "RECEIVE",
    "yes",
    "no",
    "0x10",
    "zz",
    "",
];

/// A rule of one of the device's kinds or of an unknown one.
fn spec(dev: &ErdmaDevice, u: &mut Unstructured<'_>) -> Result<FaultSpec> {
    let kinds: Vec<&str> = dev.fault_kinds().iter().map(|k| k.name).collect();
    let kind = u.choose_index(kinds.len() + 1)?;
    let mut s = FaultSpec::new(kinds.get(kind).copied().unwrap_or("bogus"));
    for _ in 0..u.int_in_range(0u8..=3)? {
        let key = *u.choose(KEYS)?;
        let value = if u.arbitrary()? {
            u.choose(VALUES)?.to_string()
        } else {
            u.int_in_range(0u32..=20)?.to_string()
        };
        s = s.param(key, value);
    }
    if u.arbitrary()? {
        s.count = Some(u.int_in_range(0u64..=4)?);
    }
    if u.arbitrary()? {
        s.prob = Some(f64::from(u.int_in_range(0u8..=12)?) / 10.0);
    }
    if u.arbitrary()? {
        s.seed = Some(u.arbitrary()?);
    }
    Ok(s)
}

fn drive(dev: &mut ErdmaDevice, u: &mut Unstructured<'_>) -> Result<()> {
    let mem = pci_driver::guest_memory(u, 0, MEM)?;
    let bars = pci_driver::bar_list(dev);
    // The harness is the edge: it reads the clock once per input.
    let mut now = std::time::Instant::now();
    let mut steps = 0;
    while !u.is_empty() && steps < 4096 {
        steps += 1;
        let mut io = DeviceIo::new(&mem, now);
        io.tx_paused = u.arbitrary()?;
        io.tracing = u.arbitrary()?;
        match u.int_in_range(0u8..=12)? {
            0..=3 => {
                // Registers and doorbells, mostly in the doorbell-free
                // first page where the command queue lives.
                let (bar, size) = *u.choose(&bars)?;
                let off = if u.arbitrary()? {
                    u.int_in_range(0u64..=0x3ff)?
                } else {
                    u.int_in_range(0..=size + 16)?
                } & !3;
                let v: u64 = u.arbitrary()?;
                let b = v.to_le_bytes();
                let wide: bool = u.arbitrary()?;
                dev.bar_write(bar, off, if wide { &b[..] } else { &b[..4] }, &mut io);
                dev.poll(&mut io);
            }
            4 => {
                pci_driver::write_memory(&mem, u, 128)?;
            }
            5 => {
                let n = u.int_in_range(0usize..=1500)?.min(u.len());
                let f = u.bytes(n)?;
                let _ = dev.receive(f, &wire::parse(f), &mut io);
            }
            6 => {
                now += Duration::from_millis(u.int_in_range(0u64..=5000)?);
                let mut io = DeviceIo::new(&mem, now);
                dev.poll(&mut io);
            }
            7 => dev.reset(),
            8 | 9 => {
                let id = u.int_in_range(0u32..=15)?;
                let s = spec(dev, u)?;
                let _ = dev.add_fault(id, &s, &mut io);
            }
            10 => pci_driver::clear_faults(dev, u, &mut io, 15)?,
            11 => pci_driver::set_link(dev, u, &mut io)?,
            _ => {
                let mut b = [0u8; 8];
                let (bar, size) = *u.choose(&bars)?;
                let off = u.int_in_range(0..=size + 16)?;
                let _ = dev.register_name(bar, off);
                dev.bar_read(bar, off, &mut b[..4], &mut io);
                dev.poll(&mut io);
            }
        }
        for r in &io.trace {
            let _ = r.to_string();
        }
        let rules = dev.faults();
        assert!(rules.len() <= MAX_DEVICE_FAULT_RULES);
        for r in rules {
            assert!(r.hits <= r.count && r.hits <= r.matched, "{r:?}");
        }
    }
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let mut dev = ErdmaDevice::new(ErdmaConfig::new([0x52, 0x54, 0, 0, 0, 2]));
    let _ = drive(&mut dev, &mut Unstructured::new(data));
});

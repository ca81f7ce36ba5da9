//! The emulated gVNIC (`gve-device`) with device fault rules (the driver
//! bench) added and cleared at random while a hostile driver works it:
//! register and doorbell writes, admin commands of every opcode with
//! fuzzer payloads, a canned bring-up (admin queue, resources, one TX and
//! one RX queue, the stats report) so the datapath hooks are reached, guest
//! memory writes, frames, time steps, resets, `set_link`. Fault kinds and
//! parameters come from the device's own list with values from a pool
//! (valid and not). Invariant: no panic; every guest access inside the
//! memory; the rules listed never exceed the device limit.
#![no_main]

use std::time::Duration;

use gve_device::{layout, regs, GveConfig, GveDevice};
use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use pci_model::fault::{FaultSpec, MAX_DEVICE_FAULT_RULES};
use pci_model::{DeviceIo, Dma, PciDevice, VecMemory};

// The device targets' hostile driver: its steps, shared.
#[path = "pci_driver.rs"]
mod pci_driver;

/// The admin queue: the last 4 KiB page (base 0 means "not set up").
const ADMINQ: u64 = 0xf000;
const IRQ_DBS: u64 = 0x1000;
const RES: u64 = 0x1400;
const TX_RING: u64 = 0x2000;
const TX_COMPL: u64 = 0x2400;
const RX_COMPL: u64 = 0x3000;
const RX_BUFS: u64 = 0x3800;
const STATS: u64 = 0x8000;
const STATS_LEN: u64 = 8 + 16 * 48;

const VALUES: &[&str] = &[
    "0",
    "1",
    "2",
    "0x3",
    "200",
    "CREATE_TX_QUEUE",
    "gve_adminq_create_rx_queue",
    "ADD_FLOW_RULE",
    "DEL_FLOW_RULE",
    "CONFIGURE_RSS",
    "REPORT_STATS",
    "EXTENDED_COMMAND",
    "0x101",
    "DEADLINE_EXCEEDED",
    "UNSET",
    "PASSED",
    "0xffffffff",
    "yes",
    "no",
    "l4",
    "ip",
    "both",
    "",
    "zz",
    "0x1ffffffff",
];

fn adminq_cmd(dev: &mut GveDevice, mem: &VecMemory, io: &mut DeviceIo<'_>, c: &[u8; 64]) {
    let mut ec = [0u8; 4];
    dev.bar_read(layout::BAR_REGS, regs::ADMINQ_EVENT_COUNTER, &mut ec, io);
    let prod = u32::from_be_bytes(ec);
    let _ = mem.write(ADMINQ + u64::from(prod % 64) * 64, c);
    dev.bar_write(
        layout::BAR_REGS,
        regs::ADMINQ_DOORBELL,
        &prod.wrapping_add(1).to_be_bytes(),
        io,
    );
    dev.poll(io);
}

fn cmd(op: u32, payload: &[u8]) -> [u8; 64] {
    let mut c = [0u8; 64];
    c[0..4].copy_from_slice(&op.to_be_bytes());
    let n = payload.len().min(56);
    c[8..8 + n].copy_from_slice(&payload[..n]);
    c
}

fn bring_up(dev: &mut GveDevice, mem: &VecMemory, io: &mut DeviceIo<'_>, hbs: u16) {
    dev.bar_write(
        layout::BAR_REGS,
        regs::ADMINQ_LENGTH,
        &4096u16.to_be_bytes(),
        io,
    );
    dev.bar_write(layout::BAR_REGS, regs::ADMINQ_BASE_HI, &[0; 4], io);
    dev.bar_write(
        layout::BAR_REGS,
        regs::ADMINQ_BASE_LO,
        &(ADMINQ as u32).to_be_bytes(),
        io,
    );
    dev.bar_write(
        layout::BAR_REGS,
        regs::DRIVER_STATUS,
        &regs::driver_status::RUN.to_be_bytes(),
        io,
    );
    let mut p = Vec::new();
    p.extend_from_slice(&0u64.to_be_bytes());
    p.extend_from_slice(&IRQ_DBS.to_be_bytes());
    p.extend_from_slice(&64u32.to_be_bytes());
    p.extend_from_slice(&4u32.to_be_bytes());
    p.extend_from_slice(&64u32.to_be_bytes());
    p.extend_from_slice(&0u32.to_be_bytes());
    p.push(3);
    adminq_cmd(dev, mem, io, &cmd(0x2, &p));
    let mut p = Vec::new();
    p.extend_from_slice(&0u32.to_be_bytes());
    p.extend_from_slice(&0u32.to_be_bytes());
    p.extend_from_slice(&RES.to_be_bytes());
    p.extend_from_slice(&TX_RING.to_be_bytes());
    p.extend_from_slice(&u32::MAX.to_be_bytes());
    p.extend_from_slice(&0u32.to_be_bytes());
    p.extend_from_slice(&TX_COMPL.to_be_bytes());
    p.extend_from_slice(&64u16.to_be_bytes());
    p.extend_from_slice(&64u16.to_be_bytes());
    adminq_cmd(dev, mem, io, &cmd(0x5, &p));
    let mut p = Vec::new();
    p.extend_from_slice(&0u32.to_be_bytes());
    p.extend_from_slice(&0u32.to_be_bytes());
    p.extend_from_slice(&0u32.to_be_bytes());
    p.extend_from_slice(&1u32.to_be_bytes());
    p.extend_from_slice(&(RES + 64).to_be_bytes());
    p.extend_from_slice(&RX_COMPL.to_be_bytes());
    p.extend_from_slice(&RX_BUFS.to_be_bytes());
    p.extend_from_slice(&u32::MAX.to_be_bytes());
    p.extend_from_slice(&64u16.to_be_bytes());
    p.extend_from_slice(&2048u16.to_be_bytes());
    p.extend_from_slice(&64u16.to_be_bytes());
    p.push(1);
    p.push(0);
    p.extend_from_slice(&hbs.to_be_bytes());
    adminq_cmd(dev, mem, io, &cmd(0x6, &p));
    let mut p = Vec::new();
    p.extend_from_slice(&STATS_LEN.to_be_bytes());
    p.extend_from_slice(&STATS.to_be_bytes());
    p.extend_from_slice(&20000u64.to_be_bytes());
    adminq_cmd(dev, mem, io, &cmd(0xc, &p));
}

fn fault_spec(dev: &GveDevice, u: &mut Unstructured<'_>) -> Result<FaultSpec> {
    let kinds = dev.fault_kinds();
    let k = u.choose(kinds)?;
    let mut spec = FaultSpec::new(if u.ratio(1, 16)? { "nope" } else { k.name });
    for p in k.params {
        if u.arbitrary()? {
            let name = p.split('=').next().unwrap_or(p);
            spec = spec.param(name, u.choose(VALUES)?);
        }
    }
    if u.ratio(1, 16)? {
        spec = spec.param("bogus", 1);
    }
    spec.count = if u.arbitrary()? {
        Some(u.int_in_range(0u64..=4)?)
    } else {
        None
    };
    spec.prob = if u.ratio(1, 4)? {
        Some(*u.choose(&[0.0, 0.5, 1.0, 1.5, f64::NAN])?)
    } else {
        None
    };
    spec.seed = u.arbitrary()?;
    Ok(spec)
}

fn drive(u: &mut Unstructured<'_>) -> Result<()> {
    let mut dev = GveDevice::new(GveConfig::default());
    let mem = pci_driver::guest_memory(u, 0x4000, 4096)?;
    let bars = pci_driver::bar_list(&dev);
    // The harness is the edge: it reads the clock once per input.
    let mut now = std::time::Instant::now();
    let mut steps = 0;
    while !u.is_empty() && steps < 4096 {
        steps += 1;
        let mut io = DeviceIo::new(&mem, now);
        io.tx_paused = u.ratio(1, 8)?;
        io.tracing = u.arbitrary()?;
        match u.int_in_range(0u8..=13)? {
            0 | 1 => {
                let (bar, size) = *u.choose(&bars)?;
                let off = u.int_in_range(0..=size.saturating_sub(1) + 16)? & !3;
                let v: u32 = u.arbitrary()?;
                dev.bar_write(bar, off, &v.to_le_bytes(), &mut io);
                dev.poll(&mut io);
            }
            2 => {
                pci_driver::write_memory(&mem, u, 64)?;
            }
            3 => pci_driver::frames(&mut dev, u, &mut io, 4, false)?,
            4 => {
                now += Duration::from_millis(u.int_in_range(0u64..=3000)?);
                let mut io = DeviceIo::new(&mem, now);
                dev.poll(&mut io);
            }
            5 => dev.reset(),
            6 | 7 => {
                let id = u.int_in_range(0u32..=80)?;
                let spec = fault_spec(&dev, u)?;
                let _ = dev.add_fault(id, &spec, &mut io);
            }
            8 => pci_driver::clear_faults(&mut dev, u, &mut io, 80)?,
            9 => pci_driver::set_link(&mut dev, u, &mut io)?,
            10 => {
                let hbs = *u.choose(&[0u16, 128, 2000])?;
                bring_up(&mut dev, &mem, &mut io, hbs);
            }
            11 => {
                // A TX or RX tail doorbell of queue 0 or 1.
                let rx: bool = u.arbitrary()?;
                let q = u.int_in_range(0u64..=1)?;
                let word = if rx { 384 } else { 256 } + q;
                let tail = u.int_in_range(0u32..=70)?;
                dev.bar_write(
                    layout::BAR_DOORBELLS,
                    word * 4,
                    &tail.to_le_bytes(),
                    &mut io,
                );
                dev.poll(&mut io);
            }
            12 => {
                let op = *u.choose(&[
                    0x1u32, 0x2, 0x5, 0x6, 0x7, 0x8, 0x9, 0xa, 0xb, 0xc, 0xd, 0xe, 0xf, 0x10, 0x12,
                    0xff, 0x77,
                ])?;
                let n = u.int_in_range(0usize..=56)?.min(u.len());
                let payload = u.bytes(n)?.to_vec();
                adminq_cmd(&mut dev, &mem, &mut io, &cmd(op, &payload));
            }
            _ => {
                let _ = dev.next_timeout(now);
                dev.poll(&mut io);
            }
        }
        assert!(dev.faults().len() <= MAX_DEVICE_FAULT_RULES);
        for b in 0..3u8 {
            let _ = dev.register_name(b, u64::from(steps as u32 % 64));
        }
    }
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let _ = drive(&mut Unstructured::new(data));
});

//! A hostile driver for `pci_model::PciDevice` models, shared by the device
//! fuzz targets: the input fills a small guest memory and then scripts BAR
//! reads and writes (any BAR, offset, width), polls, frames from the fabric
//! (alone or in bursts, which a device may coalesce), TX pauses, time steps
//! and resets. Registers, rings, commands and descriptors thus
//! come from the fuzzer. Invariant: no panic, whatever the order; every
//! guest access stays inside the memory (VecMemory refuses the rest).

// Each target that includes this file uses a part of it.
#![allow(dead_code)]

use libfuzzer_sys::arbitrary::{Result, Unstructured};
use pci_model::{DeviceIo, PciDevice, VecMemory};
use std::time::Duration;

/// Guest memory size: small, so random addresses often land inside.
pub const MEM: usize = 64 * 1024;

pub fn drive<D: PciDevice>(dev: &mut D, u: &mut Unstructured<'_>) -> Result<()> {
    let mem = guest_memory(u, 0, MEM)?;
    let bars = bar_list(dev);
    // The harness is the edge: it reads the clock once per input.
    let mut now = std::time::Instant::now();
    let mut steps = 0;
    while !u.is_empty() && steps < 4096 {
        steps += 1;
        let mut io = DeviceIo::new(&mem, now);
        io.tx_paused = u.arbitrary()?;
        match u.int_in_range(0u8..=9)? {
            0..=3 => {
                // a register write somewhere in a BAR (mostly in range)
                let (bar, size) = *u.choose(&bars)?;
                let off = u.int_in_range(0..=size.saturating_sub(1).max(0) + 16)? & !3;
                let wide: bool = u.arbitrary()?;
                let v: u64 = u.arbitrary()?;
                let b = v.to_le_bytes();
                dev.bar_write(bar, off, if wide { &b[..] } else { &b[..4] }, &mut io);
                dev.poll(&mut io);
            }
            4 => {
                let (bar, size) = *u.choose(&bars)?;
                let off = u.int_in_range(0..=size.saturating_sub(1) + 16)?;
                let mut b = [0u8; 8];
                let w = *u.choose(&[1usize, 2, 4, 8])?;
                dev.bar_read(bar, off, &mut b[..w], &mut io);
            }
            5 => {
                // the driver writes guest memory (rings, commands, buffers)
                write_memory(&mem, u, 64)?;
            }
            6 => {
                // One frame, or a burst the device may coalesce (and must
                // have written out at its end).
                frames(dev, u, &mut io, 8, true)?;
            }
            7 => {
                now += Duration::from_millis(u.int_in_range(0u64..=5000)?);
                let mut io = DeviceIo::new(&mem, now);
                dev.poll(&mut io);
            }
            8 => dev.reset(),
            _ => {
                let _ = dev.next_timeout(now);
                dev.poll(&mut io);
            }
        }
    }
    Ok(())
}

// The steps the fault targets (`erdma_faults`, `gve_device_faults`) take
// as well, each consuming the input exactly as before they were shared.

/// Guest memory of [`MEM`] bytes, the input's first up to `max` bytes at `at`.
pub fn guest_memory(u: &mut Unstructured<'_>, at: usize, max: usize) -> Result<VecMemory> {
    let mem = VecMemory::new(0, MEM);
    let n = u.int_in_range(0usize..=max.min(u.len()))?;
    let init = u.bytes(n)?;
    mem.bytes.lock().unwrap()[at..at + init.len()].copy_from_slice(init);
    Ok(mem)
}

/// Each BAR's index and size.
pub fn bar_list<D: PciDevice>(dev: &D) -> Vec<(u8, u64)> {
    dev.bars().iter().map(|b| (b.index, b.size)).collect()
}

/// The driver writes up to `max` input bytes somewhere in guest memory
/// (rings, commands, buffers).
pub fn write_memory(mem: &VecMemory, u: &mut Unstructured<'_>, max: usize) -> Result<()> {
    let at = u.int_in_range(0..=MEM - 1)?;
    let n = u.int_in_range(0usize..=max)?.min(MEM - at).min(u.len());
    let b = u.bytes(n)?;
    mem.bytes.lock().unwrap()[at..at + b.len()].copy_from_slice(b);
    Ok(())
}

/// One frame, or a burst of up to `max_burst` the device may coalesce (and
/// must have written out at its end), each offered as it is or, a quarter
/// of them, as a TSO frame (`receive_tso`); with `ask_queue`, the edge also asks
/// each frame's RX queue (one parse, the same view to both).
pub fn frames<D: PciDevice>(
    dev: &mut D,
    u: &mut Unstructured<'_>,
    io: &mut DeviceIo<'_>,
    max_burst: usize,
    ask_queue: bool,
) -> Result<()> {
    let burst: bool = u.arbitrary()?;
    let frames = if burst {
        u.int_in_range(1usize..=max_burst)?
    } else {
        1
    };
    if burst {
        dev.begin_rx_burst();
    }
    for _ in 0..frames {
        let n = u.int_in_range(0usize..=2000)?.min(u.len());
        let f = u.bytes(n)?;
        let view = wire::parse(f);
        if ask_queue {
            let _ = dev.rx_queue(f, &view);
        }
        // Now and then as a TSO frame of an arbitrary MSS (what the daemon
        // hands a gve port whole).
        if u.ratio(1u8, 4)? {
            let mss: u16 = u.arbitrary()?;
            let _ = dev.receive_tso(f, &view, mss, io);
        } else {
            let _ = dev.receive(f, &view, io);
        }
    }
    if burst {
        dev.end_rx_burst(io);
    }
    Ok(())
}

/// Clears fault rule 0..=`max_id`, or all.
pub fn clear_faults<D: PciDevice>(
    dev: &mut D,
    u: &mut Unstructured<'_>,
    io: &mut DeviceIo<'_>,
    max_id: u32,
) -> Result<()> {
    let id = if u.arbitrary()? {
        Some(u.int_in_range(0u32..=max_id)?)
    } else {
        None
    };
    let _ = dev.clear_faults(id, io);
    Ok(())
}

/// The edge's `ctl link`, up or down.
pub fn set_link<D: PciDevice>(
    dev: &mut D,
    u: &mut Unstructured<'_>,
    io: &mut DeviceIo<'_>,
) -> Result<()> {
    let up: bool = u.arbitrary()?;
    let _ = dev.set_link(up, io);
    Ok(())
}

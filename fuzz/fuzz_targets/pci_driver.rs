//! A hostile driver for `pci_model::PciDevice` models, shared by the device
//! fuzz targets: the input fills a small guest memory and then scripts BAR
//! reads and writes (any BAR, offset, width), polls, frames from the fabric
//! (alone or in bursts, which a device may coalesce), TX pauses, time steps
//! and resets. Registers, rings, commands and descriptors thus
//! come from the fuzzer. Invariant: no panic, whatever the order; every
//! guest access stays inside the memory (VecMemory refuses the rest).

use libfuzzer_sys::arbitrary::{Result, Unstructured};
use pci_model::{DeviceIo, PciDevice, VecMemory};
use std::time::Duration;

/// Guest memory size: small, so random addresses often land inside.
pub const MEM: usize = 64 * 1024;

pub fn drive<D: PciDevice>(dev: &mut D, u: &mut Unstructured<'_>) -> Result<()> {
    let mem = VecMemory::new(0, MEM);
    {
        let n = u.int_in_range(0usize..=MEM.min(u.len()))?;
        let init = u.bytes(n)?;
        mem.bytes.lock().unwrap()[..init.len()].copy_from_slice(init);
    }
    let bars: Vec<(u8, u64)> = dev.bars().iter().map(|b| (b.index, b.size)).collect();
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
                let at = u.int_in_range(0..=MEM - 1)?;
                let n = u.int_in_range(0usize..=64)?.min(MEM - at).min(u.len());
                let b = u.bytes(n)?;
                mem.bytes.lock().unwrap()[at..at + b.len()].copy_from_slice(b);
            }
            6 => {
                // One frame, or a burst the device may coalesce (and must
                // have written out at its end).
                let burst: bool = u.arbitrary()?;
                let frames = if burst { u.int_in_range(1usize..=8)? } else { 1 };
                if burst {
                    dev.begin_rx_burst();
                }
                for _ in 0..frames {
                    let n = u.int_in_range(0usize..=2000)?.min(u.len());
                    let f = u.bytes(n)?;
                    // The edge parses once and hands the same view to both.
                    let view = wire::parse(f);
                    let _ = dev.rx_queue(f, &view);
                    let _ = dev.receive(f, &view, &mut io);
                }
                if burst {
                    dev.end_rx_burst(&mut io);
                }
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

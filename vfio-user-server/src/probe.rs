//! A tiny diagnostic device for tests and for checking a QEMU setup: it
//! DMA-writes a byte pattern into guest memory, sends guest memory out as a
//! frame, DMA-writes received frames into a guest buffer, and raises MSI-X
//! vectors, all driven by BAR0 registers.
//!
//! BAR0 (4 KiB, 32-bit) registers, little-endian `u32`:
//!
//! | offset | name        | access | meaning                                    |
//! |--------|-------------|--------|--------------------------------------------|
//! | 0x00   | `MAGIC`     | R      | [`MAGIC`]                                  |
//! | 0x04   | `STATUS`    | R      | bit 0: last command done; bit 1: DMA error |
//! | 0x08   | `ADDR_LO`   | RW     | guest address of the buffer, low half      |
//! | 0x0c   | `ADDR_HI`   | RW     | high half                                  |
//! | 0x10   | `LEN`       | RW     | buffer length (at most [`MAX_LEN`])        |
//! | 0x14   | `PATTERN`   | RW     | fill byte (low 8 bits)                     |
//! | 0x18   | `VECTOR`    | RW     | MSI-X vector raised on completion          |
//! | 0x1c   | `DOORBELL`  | W      | [`CMD_FILL`], [`CMD_SEND`], [`CMD_RX_ARM`], [`CMD_TIMER`] |
//! | 0x20   | `DMA_ERRORS`| R      | DMA errors seen                            |
//! | 0x24   | `RX_FRAMES` | R      | frames written into the receive buffer    |
//! | 0x28   | `SCRATCH`   | RW     | plain storage                              |
//! | 0x2c   | `RESETS`    | R      | resets seen (survives reset)               |
//! | 0x30   | `TIMER_US`  | RW     | delay for [`CMD_TIMER`]                    |
//! | 0x34   | `TIMER_HITS`| R      | timer expiries                             |
//!
//! BAR2 (16 KiB, 64-bit) holds the MSI-X table (offset 0) and PBA (0x2000)
//! of [`VECTORS`] vectors.

use std::time::{Duration, Instant};

use pci_model::{BarInfo, DeviceIo, MsixInfo, PciDevice, PciIdentity, RxRefusal};

/// Value of the `MAGIC` register ("PROB").
pub const MAGIC: u32 = 0x424f_5250;
/// Largest buffer a command handles.
pub const MAX_LEN: u32 = 4096;
/// MSI-X vectors.
pub const VECTORS: u16 = 4;
/// Vendor ID (Red Hat / QEMU's range).
pub const VENDOR_ID: u16 = 0x1b36;
/// Device ID (unassigned in QEMU's list; no driver binds it).
pub const DEVICE_ID: u16 = 0x00f0;

/// Register offsets in BAR0.
pub mod reg {
    /// Magic.
    pub const MAGIC: u64 = 0x00;
    /// Status.
    pub const STATUS: u64 = 0x04;
    /// Buffer address, low half.
    pub const ADDR_LO: u64 = 0x08;
    /// Buffer address, high half.
    pub const ADDR_HI: u64 = 0x0c;
    /// Buffer length.
    pub const LEN: u64 = 0x10;
    /// Fill byte.
    pub const PATTERN: u64 = 0x14;
    /// Completion vector.
    pub const VECTOR: u64 = 0x18;
    /// Doorbell.
    pub const DOORBELL: u64 = 0x1c;
    /// DMA error count.
    pub const DMA_ERRORS: u64 = 0x20;
    /// Received frame count.
    pub const RX_FRAMES: u64 = 0x24;
    /// Scratch.
    pub const SCRATCH: u64 = 0x28;
    /// Reset count.
    pub const RESETS: u64 = 0x2c;
    /// Timer delay in microseconds.
    pub const TIMER_US: u64 = 0x30;
    /// Timer expiries.
    pub const TIMER_HITS: u64 = 0x34;
}

/// Doorbell: fill the buffer with the pattern byte, then raise the vector.
pub const CMD_FILL: u32 = 1;
/// Doorbell: send the buffer as a frame, then raise the vector.
pub const CMD_SEND: u32 = 2;
/// Doorbell: the buffer receives the next frame (then the vector).
pub const CMD_RX_ARM: u32 = 3;
/// Doorbell: raise the vector after `TIMER_US`.
pub const CMD_TIMER: u32 = 4;

/// The probe device.
#[derive(Debug, Default, Clone)]
pub struct ProbeDevice {
    status: u32,
    addr: u64,
    len: u32,
    pattern: u32,
    vector: u32,
    pending: Option<u32>,
    dma_errors: u32,
    rx_frames: u32,
    scratch: u32,
    resets: u32,
    rx_armed: bool,
    timer_us: u32,
    timer_at: Option<Instant>,
    timer_hits: u32,
    /// Out-of-range or odd-sized BAR accesses.
    pub bad_accesses: u64,
}

impl ProbeDevice {
    /// A device in its reset state.
    pub fn new() -> Self {
        Self::default()
    }

    fn buffer(&self) -> (u64, usize) {
        (self.addr, self.len.min(MAX_LEN) as usize)
    }

    fn raise(&self, io: &mut DeviceIo<'_>) {
        io.irqs.push(self.vector as u16);
    }
}

impl PciDevice for ProbeDevice {
    fn identity(&self) -> PciIdentity {
        PciIdentity {
            vendor_id: VENDOR_ID,
            device_id: DEVICE_ID,
            subsystem_vendor_id: VENDOR_ID,
            subsystem_id: 0x0001,
            class_code: 0xff0000,
            revision: 1,
        }
    }

    fn bars(&self) -> Vec<BarInfo> {
        vec![
            BarInfo {
                index: 0,
                size: 0x1000,
                is_64bit: false,
                prefetchable: false,
            },
            BarInfo {
                index: 2,
                size: 0x4000,
                is_64bit: true,
                prefetchable: false,
            },
        ]
    }

    fn msix(&self) -> Option<MsixInfo> {
        Some(MsixInfo {
            vectors: VECTORS,
            table_bar: 2,
            table_offset: 0,
            pba_bar: 2,
            pba_offset: 0x2000,
        })
    }

    fn bar_read(&mut self, bar: u8, offset: u64, data: &mut [u8], _io: &mut DeviceIo<'_>) {
        data.fill(0);
        if bar != 0 || data.len() != 4 {
            self.bad_accesses = self.bad_accesses.wrapping_add(1);
            return;
        }
        let v = match offset {
            reg::MAGIC => MAGIC,
            reg::STATUS => self.status,
            reg::ADDR_LO => self.addr as u32,
            reg::ADDR_HI => (self.addr >> 32) as u32,
            reg::LEN => self.len,
            reg::PATTERN => self.pattern,
            reg::VECTOR => self.vector,
            reg::DMA_ERRORS => self.dma_errors,
            reg::RX_FRAMES => self.rx_frames,
            reg::SCRATCH => self.scratch,
            reg::RESETS => self.resets,
            reg::TIMER_US => self.timer_us,
            reg::TIMER_HITS => self.timer_hits,
            _ => {
                self.bad_accesses = self.bad_accesses.wrapping_add(1);
                0
            }
        };
        data.copy_from_slice(&v.to_le_bytes());
    }

    fn bar_write(&mut self, bar: u8, offset: u64, data: &[u8], _io: &mut DeviceIo<'_>) {
        let Ok(b) = <[u8; 4]>::try_from(data) else {
            self.bad_accesses = self.bad_accesses.wrapping_add(1);
            return;
        };
        if bar != 0 {
            self.bad_accesses = self.bad_accesses.wrapping_add(1);
            return;
        }
        let v = u32::from_le_bytes(b);
        match offset {
            reg::ADDR_LO => self.addr = (self.addr & !0xffff_ffff) | u64::from(v),
            reg::ADDR_HI => self.addr = (self.addr & 0xffff_ffff) | (u64::from(v) << 32),
            reg::LEN => self.len = v,
            reg::PATTERN => self.pattern = v,
            reg::VECTOR => self.vector = v,
            reg::DOORBELL => self.pending = Some(v),
            reg::SCRATCH => self.scratch = v,
            reg::TIMER_US => self.timer_us = v,
            _ => self.bad_accesses = self.bad_accesses.wrapping_add(1),
        }
    }

    fn poll(&mut self, io: &mut DeviceIo<'_>) {
        if let Some(at) = self.timer_at {
            if io.now >= at {
                self.timer_at = None;
                self.timer_hits = self.timer_hits.wrapping_add(1);
                self.raise(io);
            }
        }
        let Some(cmd) = self.pending.take() else {
            return;
        };
        self.status = 0;
        let (addr, len) = self.buffer();
        match cmd {
            CMD_FILL => {
                let buf = vec![self.pattern as u8; len];
                if io.dma.write(addr, &buf).is_err() {
                    self.dma_errors = self.dma_errors.wrapping_add(1);
                    self.status = 2;
                    return;
                }
                self.status = 1;
                self.raise(io);
            }
            CMD_SEND => {
                let mut buf = vec![0u8; len];
                if io.dma.read(addr, &mut buf).is_err() {
                    self.dma_errors = self.dma_errors.wrapping_add(1);
                    self.status = 2;
                    return;
                }
                io.tx.push(buf);
                self.status = 1;
                self.raise(io);
            }
            CMD_RX_ARM => self.rx_armed = true,
            CMD_TIMER => {
                self.timer_at = io
                    .now
                    .checked_add(Duration::from_micros(u64::from(self.timer_us)));
            }
            _ => self.bad_accesses = self.bad_accesses.wrapping_add(1),
        }
    }

    fn receive(
        &mut self,
        frame: &[u8],
        _view: &pci_model::ParsedFrame,
        io: &mut DeviceIo<'_>,
    ) -> Result<(), RxRefusal> {
        if !self.rx_armed {
            return Err(RxRefusal::NoBuffers);
        }
        let (addr, len) = self.buffer();
        if frame.len() > len {
            return Err(RxRefusal::Dropped);
        }
        if io.dma.write(addr, frame).is_err() {
            self.dma_errors = self.dma_errors.wrapping_add(1);
            return Err(RxRefusal::Dropped);
        }
        self.rx_armed = false;
        self.rx_frames = self.rx_frames.wrapping_add(1);
        self.raise(io);
        Ok(())
    }

    fn next_timeout(&self, _now: Instant) -> Option<Instant> {
        self.timer_at
    }

    fn reset(&mut self) {
        let resets = self.resets.wrapping_add(1);
        *self = ProbeDevice {
            resets,
            bad_accesses: self.bad_accesses,
            ..Default::default()
        };
    }

    fn register_name(&self, bar: u8, offset: u64) -> Option<&'static str> {
        if bar != 0 {
            return None;
        }
        Some(match offset {
            reg::MAGIC => "MAGIC",
            reg::STATUS => "STATUS",
            reg::ADDR_LO => "ADDR_LO",
            reg::ADDR_HI => "ADDR_HI",
            reg::LEN => "LEN",
            reg::PATTERN => "PATTERN",
            reg::VECTOR => "VECTOR",
            reg::DOORBELL => "DOORBELL",
            reg::DMA_ERRORS => "DMA_ERRORS",
            reg::RX_FRAMES => "RX_FRAMES",
            reg::SCRATCH => "SCRATCH",
            reg::RESETS => "RESETS",
            reg::TIMER_US => "TIMER_US",
            reg::TIMER_HITS => "TIMER_HITS",
            _ => return None,
        })
    }
}

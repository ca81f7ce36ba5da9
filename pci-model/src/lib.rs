//! `pci-model`: the sans-IO contract between an emulated PCI device and the
//! edge that serves it to a guest (the daemon's vfio-user server, or a test).
//!
//! A device model ([`PciDevice`]) owns its registers and rings. It never
//! opens a socket, maps memory or reads a clock: the edge hands it BAR
//! accesses, guest-memory access ([`Dma`]), frames from the fabric, and the
//! time; the model answers with interrupts to raise and frames to send,
//! collected in [`DeviceIo`]. The PCI configuration space itself (IDs, BARs,
//! the MSI-X capability) is built by the edge from [`PciIdentity`],
//! [`BarInfo`] and [`MsixInfo`] with [`config::ConfigSpace`].
//!
//! A frame from the fabric comes with its parsed view ([`ParsedFrame`],
//! `wire::parse`'s result), which the edge has already (the fabric parsed
//! the frame to route it) or makes once: a model reads the L2-L4 headers
//! from the view and never parses the bytes again, so that each frame is
//! parsed once on its way from sender to receiver.
//!
//! Hostile drivers are the norm: every guest address goes through [`Dma`],
//! whose implementations bound-check against the memory the guest gave;
//! a model turns a [`DmaError`] into its own error counter, never a panic.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod config;
pub mod fault;
pub mod trace;

pub use fault::{FaultError, FaultKindInfo, FaultSpec, FaultStatus, ValueError};
pub use trace::{TraceKind, TraceRecord};
/// The parsed view of a frame the edge hands with it (see the crate
/// documentation).
pub use wire::ParsedFrame;

use std::time::{Duration, Instant};

/// A guest-physical access outside the memory the guest gave the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("DMA of {len} bytes at guest address {addr:#x} is outside guest memory")]
pub struct DmaError {
    /// First guest-physical address of the access.
    pub addr: u64,
    /// Length of the access in bytes.
    pub len: usize,
}

/// Guest memory as the device sees it (bus addresses = guest-physical, no
/// IOMMU). Implementations refuse any access not wholly inside a region the
/// guest mapped.
pub trait Dma {
    /// Reads `buf.len()` bytes at `addr`.
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), DmaError>;
    /// Writes `data` at `addr`.
    fn write(&self, addr: u64, data: &[u8]) -> Result<(), DmaError>;

    /// Reads a little-endian `u64` at `addr`.
    fn read_u64_le(&self, addr: u64) -> Result<u64, DmaError> {
        let mut b = [0u8; 8];
        self.read(addr, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }
    /// Reads a little-endian `u32` at `addr`.
    fn read_u32_le(&self, addr: u64) -> Result<u32, DmaError> {
        let mut b = [0u8; 4];
        self.read(addr, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }
}

/// Guest memory backed by one `Vec`, at guest-physical `base`: for tests and
/// fuzzing of device models.
#[derive(Debug, Clone)]
pub struct VecMemory {
    /// Guest-physical address of `bytes[0]`.
    pub base: u64,
    /// The memory.
    pub bytes: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
}

impl VecMemory {
    /// `size` zeroed bytes at guest-physical `base`.
    pub fn new(base: u64, size: usize) -> Self {
        VecMemory {
            base,
            bytes: std::sync::Arc::new(std::sync::Mutex::new(vec![0; size])),
        }
    }

    fn range(
        &self,
        addr: u64,
        len: usize,
        size: usize,
    ) -> Result<std::ops::Range<usize>, DmaError> {
        let err = DmaError { addr, len };
        let start = addr.checked_sub(self.base).ok_or(err)?;
        let start = usize::try_from(start).map_err(|_| err)?;
        let end = start.checked_add(len).ok_or(err)?;
        if end > size {
            return Err(err);
        }
        Ok(start..end)
    }
}

impl Dma for VecMemory {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), DmaError> {
        let m = self.bytes.lock().unwrap_or_else(|e| e.into_inner());
        let r = self.range(addr, buf.len(), m.len())?;
        buf.copy_from_slice(&m[r]);
        Ok(())
    }
    fn write(&self, addr: u64, data: &[u8]) -> Result<(), DmaError> {
        let mut m = self.bytes.lock().unwrap_or_else(|e| e.into_inner());
        let r = self.range(addr, data.len(), m.len())?;
        m[r].copy_from_slice(data);
        Ok(())
    }
}

/// What the device identifies as in its configuration space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PciIdentity {
    /// Vendor ID.
    pub vendor_id: u16,
    /// Device ID.
    pub device_id: u16,
    /// Subsystem vendor ID.
    pub subsystem_vendor_id: u16,
    /// Subsystem ID.
    pub subsystem_id: u16,
    /// Class code, programming interface in the low byte (e.g. `0x020000`).
    pub class_code: u32,
    /// Revision ID.
    pub revision: u8,
}

/// One memory BAR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BarInfo {
    /// BAR number, 0..=5 (a 64-bit BAR takes `index` and `index + 1`).
    pub index: u8,
    /// Size in bytes, a power of two of at least 16.
    pub size: u64,
    /// A 64-bit memory BAR.
    pub is_64bit: bool,
    /// Prefetchable.
    pub prefetchable: bool,
}

/// Where the MSI-X table and pending-bit array live. The edge serves them
/// (QEMU's vfio client emulates the table itself and hands the device one
/// eventfd per vector); the model only raises vectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MsixInfo {
    /// Number of vectors.
    pub vectors: u16,
    /// BAR of the table.
    pub table_bar: u8,
    /// Offset of the table in that BAR.
    pub table_offset: u32,
    /// BAR of the pending-bit array.
    pub pba_bar: u8,
    /// Offset of the pending-bit array in that BAR.
    pub pba_offset: u32,
}

/// A frame the device sends to the fabric (a complete Ethernet frame:
/// offloads already finished by the model).
pub type Frame = Vec<u8>;

/// What a model call may do besides changing the model: guest memory,
/// interrupts to raise, frames to send, and the time.
pub struct DeviceIo<'a> {
    /// Guest memory.
    pub dma: &'a dyn Dma,
    /// The time of this call, read by the edge (models never read a clock).
    pub now: Instant,
    /// The edge's epoch (its start; fixed for the device's life): device
    /// time, for what a device shows as a clock (NIC timestamps, trace
    /// records), is [`DeviceIo::device_time`]. [`DeviceIo::new`] sets it to
    /// `now`.
    pub epoch: Instant,
    /// MSI-X vectors to raise after the call, in order (duplicates allowed;
    /// the edge may coalesce).
    pub irqs: Vec<u16>,
    /// Frames to send into the fabric, in order.
    pub tx: Vec<Frame>,
    /// The edge cannot take more frames now (a receiver it forwards to is
    /// full: back-pressure). A model should leave TX work where the driver
    /// put it (descriptors in its ring) until a call without it; the edge
    /// calls [`PciDevice::poll`] when the pause ends. A model that ignores
    /// it still works: the edge forwards what it gets and drops, counted,
    /// what its receivers have no room for.
    pub tx_paused: bool,
    /// A device trace runs: the model records what it decodes with
    /// [`DeviceIo::trace`] (set by the edge).
    pub tracing: bool,
    /// The records of this call, in order (the edge takes them after it).
    pub trace: Vec<TraceRecord>,
}

impl<'a> DeviceIo<'a> {
    /// An empty batch over `dma` at time `now` (also the epoch; an edge
    /// with an earlier one sets [`DeviceIo::epoch`]).
    pub fn new(dma: &'a dyn Dma, now: Instant) -> Self {
        DeviceIo {
            dma,
            now,
            epoch: now,
            irqs: Vec::new(),
            tx: Vec::new(),
            tx_paused: false,
            tracing: false,
            trace: Vec::new(),
        }
    }

    /// Time since the edge's epoch: the device's clock.
    pub fn device_time(&self) -> Duration {
        self.now.saturating_duration_since(self.epoch)
    }

    /// Records `text()` when a trace runs (the closure is not called
    /// otherwise, so formatting costs nothing untraced).
    pub fn trace(&mut self, kind: TraceKind, text: impl FnOnce() -> String) {
        if self.tracing {
            self.trace.push(TraceRecord {
                at: self.device_time(),
                kind,
                text: text(),
            });
        }
    }
}

/// Why a frame from the fabric was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RxRefusal {
    /// No posted buffer on the queue it steers to: the edge may keep the
    /// frame and offer it again after the driver posts buffers (back-pressure).
    #[error("no receive buffer posted")]
    NoBuffers,
    /// The device is not up (reset, queues not created, link down): dropped.
    #[error("device not ready")]
    NotReady,
    /// The model dropped it (steering rule, bad frame, too large): counted
    /// by the model.
    #[error("dropped by the device")]
    Dropped,
    /// A TCP segmentation frame ([`PciDevice::receive_tso`]) the device
    /// does not take whole now: the edge cuts it into its segments and
    /// offers each as a frame. Nothing was placed.
    #[error("to be offered as segments")]
    Unsegmented,
}

/// An emulated PCI device, sans IO.
pub trait PciDevice {
    /// IDs and class.
    fn identity(&self) -> PciIdentity;
    /// The memory BARs.
    fn bars(&self) -> Vec<BarInfo>;
    /// The MSI-X capability, if any.
    fn msix(&self) -> Option<MsixInfo>;
    /// A driver read of `data.len()` bytes (1, 2, 4 or 8) at `offset` in
    /// BAR `bar`. Out-of-range reads give zeros and are counted.
    fn bar_read(&mut self, bar: u8, offset: u64, data: &mut [u8], io: &mut DeviceIo<'_>);
    /// A driver write at `offset` in BAR `bar`. Doorbells should only note
    /// work; [`PciDevice::poll`] does it, so that a burst of doorbells costs
    /// one pass.
    fn bar_write(&mut self, bar: u8, offset: u64, data: &[u8], io: &mut DeviceIo<'_>);
    /// Does the work doorbells asked for (the edge calls it after a batch of
    /// BAR accesses, after frames arrive, and at [`PciDevice::next_timeout`]).
    fn poll(&mut self, io: &mut DeviceIo<'_>);
    /// A frame from the fabric for this device, with its parsed view
    /// (`wire::parse(frame)`, which the edge had or made once: the model
    /// reads the headers from it rather than parsing `frame` again).
    fn receive(
        &mut self,
        frame: &[u8],
        view: &ParsedFrame,
        io: &mut DeviceIo<'_>,
    ) -> Result<(), RxRefusal>;
    /// A TCP segmentation frame from the fabric: one TCP packet over IPv4
    /// or IPv6 whose payload a receiver would get cut into `mss`-byte
    /// segments (a virtio-net guest's TSO frame; its TCP checksum is left
    /// partial, its IP lengths may not be trusted), with its parsed view.
    /// A device with receive-side coalescing may place it as one coalesced
    /// packet, as it would place its segments coalesced, and skip cutting
    /// it up and joining it again. Only an edge that was told the device
    /// takes such frames offers them. The default, and a device that
    /// cannot take this one whole, answers [`RxRefusal::Unsegmented`]
    /// having changed nothing: the edge then offers the segments.
    fn receive_tso(
        &mut self,
        frame: &[u8],
        view: &ParsedFrame,
        mss: u16,
        io: &mut DeviceIo<'_>,
    ) -> Result<(), RxRefusal> {
        let _ = (frame, view, mss, io);
        Err(RxRefusal::Unsegmented)
    }
    /// When `poll` wants to run again without a doorbell (timers), if
    /// ever; `now` (the edge's time) for work that is due at once.
    fn next_timeout(&self, now: Instant) -> Option<Instant> {
        let _ = now;
        None
    }
    /// The receive queue `frame` would go to now (the device's steering:
    /// flow rules, RSS), without taking it or changing any state. An edge
    /// that keeps frames a queue refused with [`RxRefusal::NoBuffers`] uses
    /// it to keep the frames for that queue in order behind them while
    /// frames for other queues go on. `view` is the frame's parsed view,
    /// the same the edge passes to [`PciDevice::receive`]. A device with
    /// one receive queue (the default) answers 0.
    fn rx_queue(&self, frame: &[u8], view: &ParsedFrame) -> usize {
        let _ = (frame, view);
        0
    }
    /// The frames [`PciDevice::receive`] gets until
    /// [`PciDevice::end_rx_burst`] arrived back to back: the device may
    /// hold a frame it took (`Ok`) to coalesce it with the next ones
    /// (receive-side coalescing, HW-GRO). A device that holds frames past
    /// the burst (its coalescing timer) says by when with
    /// [`PciDevice::next_timeout`], and its `poll` then writes them out.
    fn begin_rx_burst(&mut self) {}
    /// Ends a burst: what the device held and has no timer for is written
    /// out now. The edge calls it after the burst's last frame, in the
    /// same call into the model.
    fn end_rx_burst(&mut self, io: &mut DeviceIo<'_>) {
        let _ = io;
    }
    /// Function-level reset (the edge's VFIO reset, or the guest's).
    fn reset(&mut self);

    /// The driver's name for the register at `offset` in BAR `bar`
    /// (`DEVICE_STATUS`, `CMDQ_DB`), for the device trace.
    fn register_name(&self, bar: u8, offset: u64) -> Option<&'static str> {
        let _ = (bar, offset);
        None
    }

    /// The register at `offset` in BAR `bar` is big endian (the driver uses
    /// `ioread32be`/`iowrite32be` on it): the trace prints its value so.
    fn register_big_endian(&self, bar: u8, offset: u64) -> bool {
        let _ = (bar, offset);
        false
    }

    /// The device fault kinds the model can inject (the driver bench).
    fn fault_kinds(&self) -> &'static [FaultKindInfo] {
        &[]
    }
    /// Adds device fault rule `id`. A fault that acts at once (a reset
    /// request, link down, an async event) acts in this call, with `io`;
    /// the others wait for their condition.
    fn add_fault(
        &mut self,
        id: u32,
        spec: &FaultSpec,
        io: &mut DeviceIo<'_>,
    ) -> Result<(), FaultError> {
        let _ = (id, spec, io);
        Err(FaultError::Unsupported)
    }
    /// Removes rule `id` (or all, `None`) and undoes its lasting effect (a
    /// stalled queue runs again; a link taken down by a rule comes back up).
    fn clear_faults(&mut self, id: Option<u32>, io: &mut DeviceIo<'_>) -> Result<(), FaultError> {
        let _ = (id, io);
        Err(FaultError::Unsupported)
    }
    /// The rules with their counters, in order.
    fn faults(&self) -> Vec<FaultStatus> {
        Vec::new()
    }
    /// The port's link (the fabric's `ctl link`): a device with a link
    /// status shows it to the driver (status register, event, interrupt)
    /// and answers true; a device without one answers false.
    fn set_link(&mut self, up: bool, io: &mut DeviceIo<'_>) -> bool {
        let _ = (up, io);
        false
    }
}

//! `vfio-user-server`: serves an emulated PCI device model
//! ([`pci_model::PciDevice`]) to QEMU over vfio-user, with rust-vmm's
//! [`vfio_user`] crate doing the wire protocol.
//!
//! * [`VfioUserServer`] owns the listening socket and, in [`VfioUserServer::run`],
//!   serves one QEMU connection after another (a new connection after QEMU
//!   exits gets a reset device and no DMA mappings) until stopped.
//! * [`DeviceHandle`] is the daemon's side: it delivers frames from the
//!   fabric ([`DeviceHandle::receive`]), runs timers
//!   ([`DeviceHandle::next_deadline`] → [`DeviceHandle::poll`]) and stops
//!   the server ([`DeviceHandle::stop`]). Frames the model sends go to the
//!   sink given at construction ([`FrameSink`]: a closure taking one frame,
//!   or a type taking each call's frames at once that may answer
//!   [`SinkState::Full`] to pause the model's TX). A burst of frames goes
//!   in under one lock with [`DeviceHandle::receive_burst`].
//! * The driver bench: [`DeviceHandle::add_fault`],
//!   [`DeviceHandle::clear_faults`], [`DeviceHandle::faults`] and
//!   [`DeviceHandle::set_link`] call the model's fault and link methods
//!   under the device lock (what they raise goes out as after any call);
//!   [`DeviceHandle::set_trace`] starts the device trace into a
//!   [`TraceSink`]: the model's records plus the edge's own (register reads
//!   and writes with their names, MSI-X vectors raised, DMA map/unmap,
//!   resets). Untraced, each call reads one atomic.
//! * [`DmaTable`] is the [`pci_model::Dma`] over the guest memory QEMU maps
//!   with `DMA_MAP`: bounded, bounds-checked, unmapped only while no device
//!   call runs.
//!
//! The device, its configuration space, DMA table and interrupt state live
//! behind one mutex shared by the vfio-user thread and the daemon's
//! threads; every model call runs under it.

#![warn(missing_docs)]

mod backend;
pub mod dma;
mod irq;
pub mod probe;
mod server;
mod stop;

use std::sync::atomic::{AtomicU64, Ordering};

pub use dma::{DmaTable, MapError, DEFAULT_MAX_DMA_REGIONS};
pub use pci_model::{TraceKind, TraceRecord};
pub use server::{serve, DeviceHandle, RxBurst, VfioUserServer};
pub use stop::process_sockets;

use pci_model::Frame;

/// Whether a [`FrameSink`] can take more frames now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SinkState {
    /// Go on.
    Ready,
    /// A receiver behind the sink is full: model calls get
    /// [`pci_model::DeviceIo::tx_paused`] until [`DeviceHandle::resume_tx`].
    Full,
}

/// Where the frames a device sends go. Called without the device lock
/// held, once per model call that produced frames, in the model's order;
/// it must not call back into a [`DeviceHandle`] of the same device
/// (queue the frames instead).
pub trait FrameSink: Send {
    /// The frames one model call produced, in order.
    fn send(&mut self, frames: Vec<Frame>) -> SinkState;
}

/// A closure taking one frame at a time never fills up.
impl<F: FnMut(Frame) + Send> FrameSink for F {
    fn send(&mut self, frames: Vec<Frame>) -> SinkState {
        frames.into_iter().for_each(self);
        SinkState::Ready
    }
}

/// Where the device trace goes ([`DeviceHandle::set_trace`]).
///
/// Called with the device lock held (so records keep the device's order),
/// from the vfio-user thread and the daemon's: it must never block (queue
/// into something bounded, drop and count what does not fit) and must not
/// call back into a [`DeviceHandle`] of the same device.
pub trait TraceSink: Send + Sync {
    /// The records of one model call (the model's, then the interrupts it
    /// raised) or one edge event, in order; never empty.
    fn records(&self, records: Vec<pci_model::TraceRecord>);
}

/// Why the server could not be set up or stopped serving.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The socket path exists already (a stale socket must be removed by
    /// the caller, who knows no other server uses it).
    #[error("socket path {0} exists")]
    SocketExists(std::path::PathBuf),
    /// Binding or duplicating the listening socket failed.
    #[error("listening socket: {0}")]
    Socket(#[source] std::io::Error),
    /// The device declares something this server cannot serve.
    #[error("device not servable: {0}")]
    Device(&'static str),
    /// Spawning the server thread failed.
    #[error("spawning server thread: {0}")]
    Spawn(#[source] std::io::Error),
}

/// Bounds on what a client may make the server hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most DMA mappings held at once; more are refused.
    pub max_dma_regions: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_dma_regions: DEFAULT_MAX_DMA_REGIONS,
        }
    }
}

/// Counters, all monotonic (see [`DeviceHandle::stats`]).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) connections: AtomicU64,
    pub(crate) protocol_errors: AtomicU64,
    pub(crate) protocol_panics: AtomicU64,
    pub(crate) accept_errors: AtomicU64,
    pub(crate) dma_maps: AtomicU64,
    pub(crate) dma_maps_refused: AtomicU64,
    pub(crate) dma_unmaps: AtomicU64,
    pub(crate) dma_unmaps_refused: AtomicU64,
    pub(crate) bad_region_access: AtomicU64,
    pub(crate) set_irqs_refused: AtomicU64,
    pub(crate) irqs_fired: AtomicU64,
    pub(crate) irqs_pending: AtomicU64,
    pub(crate) irq_signal_errors: AtomicU64,
    pub(crate) bad_vector: AtomicU64,
    pub(crate) resets: AtomicU64,
    pub(crate) frames_out: AtomicU64,
}

impl Counters {
    pub(crate) fn inc(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// A snapshot of the server's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Client connections that ended (each one: device reset, DMA dropped).
    pub connections: u64,
    /// Connections ended by a protocol error the `vfio_user` crate returned.
    pub protocol_errors: u64,
    /// Connections ended by a panic inside the `vfio_user` crate on a
    /// malformed message (caught; the server goes on).
    pub protocol_panics: u64,
    /// `accept` failures.
    pub accept_errors: u64,
    /// `DMA_MAP`s taken.
    pub dma_maps: u64,
    /// `DMA_MAP`s refused (bad range, overlap, too many, bad fd).
    pub dma_maps_refused: u64,
    /// `DMA_UNMAP`s taken.
    pub dma_unmaps: u64,
    /// `DMA_UNMAP`s refused.
    pub dma_unmaps_refused: u64,
    /// Device accesses to guest memory refused (unmapped, read-only, bus
    /// mastering off), summed over all connections.
    pub dma_refused: u64,
    /// Region reads/writes refused here (absent BAR/ROM/VGA, offset past
    /// the region, size not 1/2/4/8 in a BAR). Region indices past the 9
    /// declared are refused by the `vfio_user` crate itself, uncounted.
    pub bad_region_access: u64,
    /// `SET_IRQS` refused.
    pub set_irqs_refused: u64,
    /// Interrupts signalled on an eventfd.
    pub irqs_fired: u64,
    /// Interrupts left pending (no eventfd, or masked).
    pub irqs_pending: u64,
    /// Failed eventfd writes.
    pub irq_signal_errors: u64,
    /// Vectors the model raised that do not exist.
    pub bad_vector: u64,
    /// Device resets (client `DEVICE_RESET` and disconnects).
    pub resets: u64,
    /// Frames handed to the sink.
    pub frames_out: u64,
}

impl Counters {
    pub(crate) fn snapshot(&self, dma_refused_now: u64) -> Stats {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Stats {
            connections: g(&self.connections),
            protocol_errors: g(&self.protocol_errors),
            protocol_panics: g(&self.protocol_panics),
            accept_errors: g(&self.accept_errors),
            dma_maps: g(&self.dma_maps),
            dma_maps_refused: g(&self.dma_maps_refused),
            dma_unmaps: g(&self.dma_unmaps),
            dma_unmaps_refused: g(&self.dma_unmaps_refused),
            dma_refused: dma_refused_now,
            bad_region_access: g(&self.bad_region_access),
            set_irqs_refused: g(&self.set_irqs_refused),
            irqs_fired: g(&self.irqs_fired),
            irqs_pending: g(&self.irqs_pending),
            irq_signal_errors: g(&self.irq_signal_errors),
            bad_vector: g(&self.bad_vector),
            resets: g(&self.resets),
            frames_out: g(&self.frames_out),
        }
    }
}

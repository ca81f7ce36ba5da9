//! The state shared by the vfio-user thread and the daemon, and the
//! [`vfio_user::ServerBackend`] adapter that maps vfio-user regions and
//! interrupts onto a [`PciDevice`].
//!
//! Region layout (vfio-pci's): 0..=5 the BARs, 6 the (absent) option ROM,
//! 7 the configuration space, 8 the (absent) VGA window. Interrupt indices:
//! 0 INTx (none: the interrupt pin is 0), 1 MSI (none), 2 MSI-X (the
//! model's vectors), 3 ERR and 4 REQ (one eventfd each).

use std::fs::File;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use pci_model::config::{ConfigSpace, CONFIG_SIZE};
use pci_model::{BarInfo, DeviceIo, MsixInfo, PciDevice, PciIdentity, TraceKind, TraceRecord};
use vfio_bindings::bindings::vfio::{
    vfio_region_info, VFIO_IRQ_INFO_AUTOMASKED, VFIO_IRQ_INFO_EVENTFD, VFIO_IRQ_INFO_MASKABLE,
    VFIO_PCI_CONFIG_REGION_INDEX, VFIO_PCI_ERR_IRQ_INDEX, VFIO_PCI_INTX_IRQ_INDEX,
    VFIO_PCI_MSIX_IRQ_INDEX, VFIO_PCI_MSI_IRQ_INDEX, VFIO_PCI_REQ_IRQ_INDEX,
    VFIO_REGION_INFO_FLAG_READ, VFIO_REGION_INFO_FLAG_WRITE,
};
use vfio_user::{DmaMapFlags, DmaUnmapFlags, IrqInfo, ServerBackend, ServerRegion};

use crate::dma::{DmaTable, GatedDma};
use crate::irq::Msix;
use crate::{Counters, Limits};

/// Number of vfio-pci regions declared (BAR0..5, ROM, config, VGA).
pub(crate) const NUM_REGIONS: u32 = 9;

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn einval() -> std::io::Error {
    std::io::Error::from_raw_os_error(libc::EINVAL)
}

/// What the model declared at construction (its identity, BARs, MSI-X).
#[derive(Clone)]
pub(crate) struct Layout {
    pub(crate) id: PciIdentity,
    pub(crate) bars: Vec<BarInfo>,
    pub(crate) msix: Option<MsixInfo>,
}

impl Layout {
    pub(crate) fn of(device: &dyn PciDevice) -> Result<Self, crate::Error> {
        let l = Layout {
            id: device.identity(),
            bars: device.bars(),
            msix: device.msix(),
        };
        let config = l.config();
        if let Some(m) = l.msix {
            let fits = |bar: u8, off: u32, len: u64| {
                bar < 6 && u64::from(off).saturating_add(len) <= config.bar_size(bar)
            };
            if m.vectors == 0 || m.vectors > 2048 {
                return Err(crate::Error::Device("MSI-X vector count not in 1..=2048"));
            }
            if !fits(m.table_bar, m.table_offset, u64::from(m.vectors) * 16)
                || !fits(
                    m.pba_bar,
                    m.pba_offset,
                    u64::from(m.vectors).div_ceil(64) * 8,
                )
            {
                return Err(crate::Error::Device("MSI-X table or PBA outside its BAR"));
            }
        }
        Ok(l)
    }

    pub(crate) fn config(&self) -> ConfigSpace {
        ConfigSpace::new(self.id, &self.bars, self.msix)
    }

    pub(crate) fn regions(&self) -> Vec<ServerRegion> {
        let config = self.config();
        (0..NUM_REGIONS)
            .map(|i| {
                let size = if i < 6 {
                    config.bar_size(i as u8)
                } else if i == VFIO_PCI_CONFIG_REGION_INDEX {
                    CONFIG_SIZE as u64
                } else {
                    0
                };
                let flags = if size > 0 {
                    VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE
                } else {
                    0
                };
                ServerRegion {
                    region_info: vfio_region_info {
                        argsz: std::mem::size_of::<vfio_region_info>() as u32,
                        flags,
                        index: i,
                        cap_offset: 0,
                        size,
                        offset: 0,
                    },
                    sparse_areas: Vec::new(),
                    mmap_fd: None,
                }
            })
            .collect()
    }

    pub(crate) fn irqs(&self) -> Vec<IrqInfo> {
        let info = |index: u32, flags: u32, count: u32| IrqInfo {
            index,
            flags,
            count,
        };
        vec![
            info(
                VFIO_PCI_INTX_IRQ_INDEX,
                VFIO_IRQ_INFO_EVENTFD | VFIO_IRQ_INFO_MASKABLE | VFIO_IRQ_INFO_AUTOMASKED,
                0,
            ),
            info(VFIO_PCI_MSI_IRQ_INDEX, VFIO_IRQ_INFO_EVENTFD, 0),
            // No NORESIZE: vectors can be set one at a time, so QEMU adds
            // them without disabling MSI-X.
            info(
                VFIO_PCI_MSIX_IRQ_INDEX,
                VFIO_IRQ_INFO_EVENTFD,
                self.msix.map_or(0, |m| u32::from(m.vectors)),
            ),
            // One eventfd each, held but never signalled except REQ on
            // DeviceHandle::request_unplug (declaring ERR also spares QEMU's
            // "Could not enable error recovery" warning).
            info(VFIO_PCI_ERR_IRQ_INDEX, VFIO_IRQ_INFO_EVENTFD, 1),
            info(VFIO_PCI_REQ_IRQ_INDEX, VFIO_IRQ_INFO_EVENTFD, 1),
        ]
    }
}

/// Everything the device lock protects.
pub(crate) struct State<D> {
    pub(crate) device: D,
    pub(crate) config: ConfigSpace,
    pub(crate) dma: DmaTable,
    pub(crate) msix: Msix,
}

/// The frame sink, behind its own lock so that frames leave in the order
/// the model produced them without holding the device lock while sending.
pub(crate) type Sink = Box<dyn crate::FrameSink>;

/// Shared by the server thread and every [`crate::DeviceHandle`].
pub(crate) struct Shared<D> {
    pub(crate) state: Mutex<State<D>>,
    pub(crate) sink: Mutex<Sink>,
    pub(crate) counters: Counters,
    pub(crate) epoch: Instant,
    pub(crate) layout: Layout,
    pub(crate) stop: std::sync::atomic::AtomicBool,
    pub(crate) stopper: crate::stop::Stopper,
    /// The sink said it is full ([`crate::SinkState::Full`]): model calls
    /// get [`DeviceIo::tx_paused`] until [`crate::DeviceHandle::resume_tx`].
    pub(crate) tx_paused: std::sync::atomic::AtomicBool,
    /// The model's `next_timeout` after the last call, in nanoseconds since
    /// `epoch` (`u64::MAX`: none); kept once a wake is registered.
    pub(crate) deadline_ns: std::sync::atomic::AtomicU64,
    /// Called when a model call made that deadline earlier
    /// ([`crate::DeviceHandle::on_earlier_deadline`]).
    pub(crate) on_earlier_deadline: std::sync::OnceLock<Box<dyn Fn() + Send + Sync>>,
    /// A device trace runs ([`crate::DeviceHandle::set_trace`]): the one
    /// atomic an untraced call reads.
    pub(crate) tracing: std::sync::atomic::AtomicBool,
    /// Where the trace goes while `tracing`. Locked after `state` (never
    /// the other way round).
    pub(crate) trace_sink: Mutex<Option<Arc<dyn crate::TraceSink>>>,
}

impl<D: PciDevice> Shared<D> {
    pub(crate) fn new(
        device: D,
        sink: Sink,
        limits: Limits,
        layout: Layout,
        stopper: crate::stop::Stopper,
    ) -> Self {
        Shared {
            state: Mutex::new(State {
                device,
                config: layout.config(),
                dma: DmaTable::new(limits.max_dma_regions),
                msix: Msix::new(layout.msix),
            }),
            sink: Mutex::new(sink),
            counters: Counters::default(),
            epoch: Instant::now(),
            layout,
            stop: std::sync::atomic::AtomicBool::new(false),
            stopper,
            tx_paused: std::sync::atomic::AtomicBool::new(false),
            deadline_ns: std::sync::atomic::AtomicU64::new(u64::MAX),
            on_earlier_deadline: std::sync::OnceLock::new(),
            tracing: std::sync::atomic::AtomicBool::new(false),
            trace_sink: Mutex::new(None),
        }
    }

    /// Whether a trace runs (one relaxed atomic load).
    pub(crate) fn tracing(&self) -> bool {
        self.tracing.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Hands `records` to the trace sink, if one is set. Called with the
    /// device lock held, so that records keep the device's order.
    pub(crate) fn deliver_trace(&self, records: Vec<TraceRecord>) {
        if records.is_empty() {
            return;
        }
        if let Some(sink) = lock(&self.trace_sink).as_ref() {
            sink.records(records);
        }
    }

    /// Records an edge event (DMA map/unmap, reset) when a trace runs;
    /// `text` is only called then. Call it with the device lock held.
    pub(crate) fn trace_edge(&self, kind: TraceKind, text: impl FnOnce() -> String) {
        if self.tracing() {
            self.deliver_trace(vec![TraceRecord {
                at: self.epoch.elapsed(),
                kind,
                text: text(),
            }]);
        }
    }

    /// Runs `f` on the model with a fresh [`DeviceIo`], then raises the
    /// interrupts and sends the frames it produced. For the daemon's calls
    /// ([`crate::DeviceHandle`]): the daemon reads the next deadline itself.
    pub(crate) fn with_io<R>(&self, f: impl FnOnce(&mut D, &mut DeviceIo<'_>) -> R) -> R {
        self.with_io_at(Instant::now(), false, f)
    }

    /// [`Shared::with_io`] for a BAR access on the vfio-user thread: a
    /// deadline it brings forward is reported
    /// ([`crate::DeviceHandle::on_earlier_deadline`]).
    pub(crate) fn with_io_bar<R>(&self, f: impl FnOnce(&mut D, &mut DeviceIo<'_>) -> R) -> R {
        self.with_io_at(Instant::now(), true, f)
    }

    /// [`Shared::with_io`] at `now` (the caller read the clock); `report`
    /// an earlier deadline (see `with_io_bar`).
    pub(crate) fn with_io_at<R>(
        &self,
        now: Instant,
        report: bool,
        f: impl FnOnce(&mut D, &mut DeviceIo<'_>) -> R,
    ) -> R {
        use std::sync::atomic::Ordering;
        let mut st = lock(&self.state);
        let State {
            device,
            config,
            dma,
            msix,
        } = &mut *st;
        let gated = GatedDma {
            table: dma,
            bus_master: config.bus_master(),
        };
        let mut io = DeviceIo::new(&gated, now);
        io.epoch = self.epoch;
        io.tx_paused = self.tx_paused.load(Ordering::Acquire);
        io.tracing = self.tracing();
        let r = f(device, &mut io);
        // Whoever runs the model's timers sleeps until the deadline it saw
        // last: tell it when a BAR access brought the deadline forward (a
        // timer armed, work left for another poll). Its own calls only
        // update what it saw (it looks at the deadline after them).
        let wake = self.on_earlier_deadline.get();
        let earlier = wake.is_some() && {
            let deadline = device.next_timeout(now).map_or(u64::MAX, |d| {
                let since = d.saturating_duration_since(self.epoch);
                u64::try_from(since.as_nanos()).unwrap_or(u64::MAX - 1)
            });
            deadline < self.deadline_ns.swap(deadline, Ordering::AcqRel)
        };
        let at = io.device_time();
        let DeviceIo {
            irqs,
            tx,
            tracing,
            mut trace,
            ..
        } = io;
        for v in irqs {
            if tracing {
                trace.push(TraceRecord {
                    at,
                    kind: TraceKind::Irq,
                    text: format!("msi-x vector {v}"),
                });
            }
            msix.fire(v, &self.counters);
        }
        if tracing {
            self.deliver_trace(trace);
        }
        if let (true, true, Some(wake)) = (report, earlier, wake) {
            wake();
        }
        if tx.is_empty() {
            return r;
        }
        // Take the sink before letting go of the device, so that frames
        // from concurrent calls keep the model's order.
        let mut sink = lock(&self.sink);
        drop(st);
        self.counters
            .frames_out
            .fetch_add(tx.len() as u64, Ordering::Relaxed);
        if sink.send(tx) == crate::SinkState::Full {
            self.tx_paused.store(true, Ordering::Release);
        }
        r
    }

    fn reset_locked(&self, st: &mut State<D>, why: &str) {
        self.trace_edge(TraceKind::Reset, || format!("device reset ({why})"));
        st.device.reset();
        st.config = self.layout.config();
        st.msix.reset();
        Counters::inc(&self.counters.resets);
    }

    /// Client gone: reset the device, drop its DMA mappings and eventfds.
    pub(crate) fn disconnected(&self) {
        let mut st = lock(&self.state);
        self.reset_locked(&mut st, "client disconnected");
        st.dma.clear();
        st.msix.disconnect();
        Counters::inc(&self.counters.connections);
    }

    fn bad_access(&self) -> std::io::Error {
        Counters::inc(&self.counters.bad_region_access);
        einval()
    }

    /// Checks a BAR access: the BAR exists, the access is 1, 2, 4 or 8
    /// bytes and inside it.
    fn check_bar(&self, config: &ConfigSpace, bar: u32, offset: u64, len: usize) -> bool {
        let size = config.bar_size(bar as u8);
        size > 0
            && matches!(len, 1 | 2 | 4 | 8)
            && offset
                .checked_add(len as u64)
                .is_some_and(|end| end <= size)
    }
}

/// The trace text of a register access: `bar0+0x10 DEVICE_STATUS = 0x00000001`
/// (the value little-endian, as many hex digits as the access is wide).
pub(crate) fn register_text(
    bar: u8,
    offset: u64,
    name: Option<&str>,
    big_endian: bool,
    data: &[u8],
) -> String {
    let n = data.len().min(8);
    let value = data[..n].iter().enumerate().fold(0u64, |v, (i, &b)| {
        if big_endian {
            (v << 8) | u64::from(b)
        } else {
            v | (u64::from(b) << (8 * i))
        }
    });
    let width = n * 2;
    match name {
        Some(name) => format!("bar{bar}+{offset:#x} {name} = {value:#0w$x}", w = width + 2),
        None => format!("bar{bar}+{offset:#x} = {value:#0w$x}", w = width + 2),
    }
}

/// The per-connection [`ServerBackend`].
pub(crate) struct Backend<D> {
    pub(crate) shared: Arc<Shared<D>>,
}

impl<D: PciDevice> ServerBackend for Backend<D> {
    fn region_read(&mut self, region: u32, offset: u64, data: &mut [u8]) -> std::io::Result<()> {
        let s = &*self.shared;
        if region == VFIO_PCI_CONFIG_REGION_INDEX {
            let st = lock(&s.state);
            if offset
                .checked_add(data.len() as u64)
                .is_none_or(|end| end > CONFIG_SIZE as u64)
            {
                return Err(s.bad_access());
            }
            st.config.read(offset, data);
            return Ok(());
        }
        if region >= 6 {
            return Err(s.bad_access());
        }
        {
            let st = lock(&s.state);
            if !s.check_bar(&st.config, region, offset, data.len()) {
                drop(st);
                return Err(s.bad_access());
            }
            if st.msix.read(region as u8, offset, data) {
                return Ok(());
            }
        }
        s.with_io_bar(|dev, io| {
            dev.bar_read(region as u8, offset, data, io);
            if io.tracing {
                let name = dev.register_name(region as u8, offset);
                let be = dev.register_big_endian(region as u8, offset);
                io.trace(TraceKind::RegRead, || {
                    register_text(region as u8, offset, name, be, data)
                });
            }
        });
        Ok(())
    }

    fn region_write(&mut self, region: u32, offset: u64, data: &[u8]) -> std::io::Result<()> {
        let s = &*self.shared;
        if region == VFIO_PCI_CONFIG_REGION_INDEX {
            let mut st = lock(&s.state);
            if offset
                .checked_add(data.len() as u64)
                .is_none_or(|end| end > CONFIG_SIZE as u64)
            {
                drop(st);
                return Err(s.bad_access());
            }
            st.config.write(offset, data);
            return Ok(());
        }
        if region >= 6 {
            return Err(s.bad_access());
        }
        {
            let mut st = lock(&s.state);
            if !s.check_bar(&st.config, region, offset, data.len()) {
                drop(st);
                return Err(s.bad_access());
            }
            if st.msix.write(region as u8, offset, data) {
                return Ok(());
            }
        }
        s.with_io_bar(|dev, io| {
            if io.tracing {
                let name = dev.register_name(region as u8, offset);
                let be = dev.register_big_endian(region as u8, offset);
                io.trace(TraceKind::RegWrite, || {
                    register_text(region as u8, offset, name, be, data)
                });
            }
            dev.bar_write(region as u8, offset, data, io);
            dev.poll(io);
        });
        Ok(())
    }

    fn dma_map(
        &mut self,
        flags: DmaMapFlags,
        offset: u64,
        address: u64,
        size: u64,
        fd: Option<File>,
    ) -> std::io::Result<()> {
        let s = &*self.shared;
        let mut st = lock(&s.state);
        let r = st.dma.map(
            flags.contains(DmaMapFlags::READ),
            flags.contains(DmaMapFlags::WRITE),
            offset,
            address,
            size,
            fd,
        );
        match r {
            Ok(()) => {
                s.trace_edge(TraceKind::Dma, || {
                    format!(
                        "map iova={address:#x} size={size:#x}{}{}",
                        if flags.contains(DmaMapFlags::READ) {
                            " r"
                        } else {
                            ""
                        },
                        if flags.contains(DmaMapFlags::WRITE) {
                            " w"
                        } else {
                            ""
                        },
                    )
                });
                Counters::inc(&s.counters.dma_maps);
                tracing::debug!(iova = address, size, offset, ?flags, "DMA map");
                Ok(())
            }
            Err(e) => {
                s.trace_edge(TraceKind::Dma, || {
                    format!("map iova={address:#x} size={size:#x} refused: {e}")
                });
                Counters::inc(&s.counters.dma_maps_refused);
                tracing::warn!(iova = address, size, offset, "DMA map refused: {e}");
                Err(std::io::Error::from_raw_os_error(e.errno()))
            }
        }
    }

    fn dma_unmap(&mut self, flags: DmaUnmapFlags, address: u64, size: u64) -> std::io::Result<()> {
        let s = &*self.shared;
        let mut st = lock(&s.state);
        let r = if flags.contains(DmaUnmapFlags::GET_DIRTY_PAGE_INFO) {
            Err(crate::MapError::UnsupportedFlags(flags.bits()))
        } else {
            st.dma
                .unmap(address, size, flags.contains(DmaUnmapFlags::UNMAP_ALL))
        };
        match r {
            Ok(n) => {
                s.trace_edge(TraceKind::Dma, || {
                    format!("unmap iova={address:#x} size={size:#x} regions={n}")
                });
                Counters::inc(&s.counters.dma_unmaps);
                tracing::debug!(iova = address, size, removed = n, "DMA unmap");
                Ok(())
            }
            Err(e) => {
                s.trace_edge(TraceKind::Dma, || {
                    format!("unmap iova={address:#x} size={size:#x} refused: {e}")
                });
                Counters::inc(&s.counters.dma_unmaps_refused);
                tracing::warn!(iova = address, size, "DMA unmap refused: {e}");
                Err(std::io::Error::from_raw_os_error(e.errno()))
            }
        }
    }

    fn reset(&mut self) -> std::io::Result<()> {
        let s = &*self.shared;
        let mut st = lock(&s.state);
        s.reset_locked(&mut st, "client DEVICE_RESET");
        tracing::debug!("device reset");
        Ok(())
    }

    fn set_irqs(
        &mut self,
        index: u32,
        flags: u32,
        start: u32,
        count: u32,
        fds: Vec<File>,
    ) -> std::io::Result<()> {
        let s = &*self.shared;
        let mut st = lock(&s.state);
        let r = st
            .msix
            .set_irqs(index, flags, start, count, fds, &s.counters);
        if let Err(e) = &r {
            Counters::inc(&s.counters.set_irqs_refused);
            tracing::warn!(index, flags, start, count, "SET_IRQS refused: {e}");
        } else {
            tracing::debug!(index, flags, start, count, "SET_IRQS");
        }
        r
    }
}

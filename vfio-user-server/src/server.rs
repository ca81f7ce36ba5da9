//! The listening socket, the connection loop and the daemon's handle.

use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pci_model::{
    DeviceIo, FaultError, FaultKindInfo, FaultSpec, FaultStatus, Frame, ParsedFrame, PciDevice,
    RxRefusal, TraceKind,
};

use crate::backend::{lock, Backend, Layout, Shared};
use crate::stop::Stopper;
use crate::{Counters, Error, FrameSink, Limits, Stats};

/// Serves one [`PciDevice`] over vfio-user on a UNIX socket.
pub struct VfioUserServer<D> {
    server: vfio_user::Server,
    shared: Arc<Shared<D>>,
    remove_path: Option<PathBuf>,
}

/// The daemon's side of a served device: frames in, timers, counters, stop.
/// Cheap to clone; usable from any thread.
pub struct DeviceHandle<D> {
    shared: Arc<Shared<D>>,
}

impl<D> Clone for DeviceHandle<D> {
    fn clone(&self) -> Self {
        DeviceHandle {
            shared: self.shared.clone(),
        }
    }
}

impl<D: PciDevice + Send + 'static> VfioUserServer<D> {
    /// Binds a new socket at `path` (which must not exist) for `device`.
    /// Frames the model sends are passed to `sink`, in order, without the
    /// device lock held; `sink` must not call back into a [`DeviceHandle`]
    /// of the same device (queue the frame instead).
    pub fn bind(
        path: &Path,
        device: D,
        sink: impl FnMut(Frame) + Send + 'static,
        limits: Limits,
    ) -> Result<Self, Error> {
        if path.exists() {
            return Err(Error::SocketExists(path.to_path_buf()));
        }
        let listener = UnixListener::bind(path).map_err(Error::Socket)?;
        let mut s = Self::from_listener(listener, device, sink, limits)?;
        s.remove_path = Some(path.to_path_buf());
        Ok(s)
    }

    /// Like [`VfioUserServer::bind`] on a listener the caller bound (or
    /// inherited). The socket file is left alone on drop. If the listener
    /// has no path name, [`DeviceHandle::stop`] cannot interrupt a live
    /// connection (only a blocked `accept`).
    pub fn from_listener(
        listener: UnixListener,
        device: D,
        sink: impl FnMut(Frame) + Send + 'static,
        limits: Limits,
    ) -> Result<Self, Error> {
        Self::from_listener_with_sink(listener, device, sink, limits)
    }

    /// [`VfioUserServer::from_listener`] with a [`FrameSink`] that takes
    /// each model call's frames at once (and may pause the model's TX).
    pub fn from_listener_with_sink(
        listener: UnixListener,
        device: D,
        sink: impl FrameSink + 'static,
        limits: Limits,
    ) -> Result<Self, Error> {
        let layout = Layout::of(&device)?;
        let path = listener
            .local_addr()
            .ok()
            .and_then(|a| a.as_pathname().map(Path::to_path_buf));
        let dup = OwnedFd::from(listener.try_clone().map_err(Error::Socket)?);
        let stopper = Stopper {
            listener: UnixStream::from(dup),
            path,
        };
        let server = vfio_user::Server::from_owned_fd(
            OwnedFd::from(listener),
            true,
            layout.irqs(),
            layout.regions(),
        );
        let shared = Arc::new(Shared::new(device, Box::new(sink), limits, layout, stopper));
        Ok(VfioUserServer {
            server,
            shared,
            remove_path: None,
        })
    }

    /// A handle for the daemon.
    pub fn handle(&self) -> DeviceHandle<D> {
        DeviceHandle {
            shared: self.shared.clone(),
        }
    }

    /// Serves clients one at a time until [`DeviceHandle::stop`]. When a
    /// client goes away (QEMU exits, a protocol error, a malformed message
    /// that makes the `vfio_user` crate panic), the device is reset, its
    /// DMA mappings and eventfds are dropped, and the next client is
    /// accepted. Consumes the server: the socket file (if [`bind`] made
    /// it) is removed when it returns.
    ///
    /// [`bind`]: VfioUserServer::bind
    pub fn run(self) -> Result<(), Error> {
        let s = &*self.shared;
        let mut backend = Backend {
            shared: self.shared.clone(),
        };
        while !s.stop.load(Ordering::Acquire) {
            let r = panic::catch_unwind(AssertUnwindSafe(|| self.server.run(&mut backend)));
            let stopping = s.stop.load(Ordering::Acquire);
            match r {
                Ok(Ok(())) => {
                    tracing::info!("vfio-user client disconnected");
                    s.disconnected();
                }
                Ok(Err(vfio_user::Error::SocketAccept(e))) => {
                    if !stopping {
                        Counters::inc(&s.counters.accept_errors);
                        tracing::warn!("vfio-user accept: {e}");
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
                Ok(Err(e)) => {
                    if !stopping {
                        Counters::inc(&s.counters.protocol_errors);
                        tracing::warn!("vfio-user connection ended: {e}");
                    }
                    s.disconnected();
                }
                Err(_) => {
                    Counters::inc(&s.counters.protocol_panics);
                    tracing::warn!(
                        "vfio_user crate panicked on a client message; connection dropped"
                    );
                    s.disconnected();
                }
            }
        }
        tracing::info!("vfio-user server stopped");
        Ok(())
    }
}

impl<D> Drop for VfioUserServer<D> {
    fn drop(&mut self) {
        if let Some(p) = &self.remove_path {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Binds `path` for `device` with default [`Limits`] and runs the server on
/// a thread of its own. The thread ends (with the socket file removed)
/// after [`DeviceHandle::stop`].
#[allow(clippy::type_complexity)]
pub fn serve<D: PciDevice + Send + 'static>(
    path: &Path,
    device: D,
    sink: impl FnMut(Frame) + Send + 'static,
) -> Result<(DeviceHandle<D>, JoinHandle<Result<(), Error>>), Error> {
    let server = VfioUserServer::bind(path, device, sink, Limits::default())?;
    let handle = server.handle();
    let thread = std::thread::Builder::new()
        .name("vfio-user".into())
        .spawn(move || server.run())
        .map_err(Error::Spawn)?;
    Ok((handle, thread))
}

impl<D: PciDevice> DeviceHandle<D> {
    /// A frame from the fabric, parsed here once (`wire::parse`): for a
    /// caller that has no view of it (tests, tools);
    /// [`DeviceHandle::receive_parsed`] takes the one it has.
    pub fn receive(&self, frame: &[u8]) -> Result<(), RxRefusal> {
        self.receive_parsed(frame, &wire::parse(frame))
    }

    /// A frame from the fabric with its parsed view:
    /// [`PciDevice::receive`] then [`PciDevice::poll`]; interrupts and
    /// frames it produces go out.
    pub fn receive_parsed(&self, frame: &[u8], view: &ParsedFrame) -> Result<(), RxRefusal> {
        self.shared.with_io(|dev, io| {
            let r = dev.receive(frame, view, io);
            dev.poll(io);
            r
        })
    }

    /// Runs [`PciDevice::poll`] (call it at [`DeviceHandle::next_deadline`]).
    pub fn poll(&self) {
        self.shared.with_io(|dev, io| dev.poll(io));
    }

    /// [`DeviceHandle::poll`] at `now`, a time the caller read.
    pub fn poll_at(&self, now: Instant) {
        self.shared.with_io_at(now, false, |dev, io| dev.poll(io));
    }

    /// Hands the device a burst of frames under one hold of its lock, at
    /// `now` (a time the caller read: no clock is read here):
    /// [`PciDevice::begin_rx_burst`], then `f` offers frames through the
    /// [`RxBurst`], then [`PciDevice::end_rx_burst`] writes out what the
    /// model held and [`PciDevice::poll`] runs once. Interrupts and frames
    /// the calls produced go out afterwards. BAR accesses from the
    /// vfio-user thread wait for the burst, so keep it short (tens of
    /// frames).
    pub fn receive_burst<R>(&self, now: Instant, f: impl FnOnce(&mut dyn RxBurst) -> R) -> R {
        self.shared.with_io_at(now, false, |dev, io| {
            dev.begin_rx_burst();
            let r = f(&mut Burst {
                dev: &mut *dev,
                io: &mut *io,
            });
            dev.end_rx_burst(io);
            dev.poll(io);
            r
        })
    }

    /// [`PciDevice::reset`] under the device lock: the daemon's recovery
    /// after the model panicked. Unlike a client's reset, the configuration
    /// space, MSI-X state and DMA mappings stay as the client set them (the
    /// guest's driver finds a reset device and resets it in turn); counted
    /// in [`Stats::resets`].
    pub fn reset_device(&self) {
        let mut st = lock(&self.shared.state);
        self.shared
            .trace_edge(TraceKind::Reset, || "device reset (daemon recovery)".into());
        st.device.reset();
        drop(st);
        Counters::inc(&self.shared.counters.resets);
    }

    /// Calls `wake` (on the vfio-user thread, under the device lock: it
    /// must only signal, e.g. write an eventfd) whenever a BAR access
    /// brings [`PciDevice::next_timeout`] forward: whoever runs the timers
    /// can sleep until the deadline it saw and still poll in time for one a
    /// doorbell armed meanwhile. The handle's own calls never call it (their
    /// caller looks at the deadline after them). Set once; later calls are
    /// ignored.
    pub fn on_earlier_deadline(&self, wake: impl Fn() + Send + Sync + 'static) {
        let _ = self.shared.on_earlier_deadline.set(Box::new(wake));
    }

    /// When [`DeviceHandle::poll`] should next run for timers, if ever.
    pub fn next_deadline(&self, now: Instant) -> Option<Instant> {
        lock(&self.shared.state).device.next_timeout(now)
    }

    /// [`PciDevice::add_fault`]: adds device fault rule `id` (the driver
    /// bench). A fault that acts at once raises its interrupt now.
    pub fn add_fault(&self, id: u32, spec: &FaultSpec) -> Result<(), FaultError> {
        self.shared.with_io(|dev, io| dev.add_fault(id, spec, io))
    }

    /// [`PciDevice::clear_faults`]: removes rule `id` (all: `None`) and
    /// undoes its lasting effect.
    pub fn clear_faults(&self, id: Option<u32>) -> Result<(), FaultError> {
        self.shared.with_io(|dev, io| dev.clear_faults(id, io))
    }

    /// [`PciDevice::faults`]: the rules with their counters.
    pub fn faults(&self) -> Vec<FaultStatus> {
        lock(&self.shared.state).device.faults()
    }

    /// [`PciDevice::fault_kinds`].
    pub fn fault_kinds(&self) -> &'static [FaultKindInfo] {
        lock(&self.shared.state).device.fault_kinds()
    }

    /// [`PciDevice::set_link`]: shows the link state to the driver; false
    /// if the device has no link status.
    pub fn set_link(&self, up: bool) -> bool {
        self.shared.with_io(|dev, io| dev.set_link(up, io))
    }

    /// Runs `f` on the model under the device lock (inspection, tests).
    /// `f` must not call back into a handle of the same device (deadlock).
    pub fn with_device<R>(&self, f: impl FnOnce(&mut D) -> R) -> R {
        f(&mut lock(&self.shared.state).device)
    }
}

impl<D> DeviceHandle<D> {
    /// Whether the sink answered [`crate::SinkState::Full`] since the last
    /// [`DeviceHandle::resume_tx`]: model calls get
    /// [`DeviceIo::tx_paused`].
    pub fn tx_paused(&self) -> bool {
        self.shared.tx_paused.load(Ordering::Acquire)
    }

    /// Ends a TX pause (the receivers drained, or waited long enough); the
    /// caller then polls the device so that it does the TX work it left.
    pub fn resume_tx(&self) {
        self.shared.tx_paused.store(false, Ordering::Release);
    }

    /// Starts the device trace into `sink` (replacing the one set), or
    /// stops it (`None`). While it runs every model call gets
    /// [`DeviceIo::tracing`], and the edge adds its own records: register
    /// reads and writes (named with [`PciDevice::register_name`], value in
    /// hex), MSI-X vectors raised, DMA map/unmap, resets.
    pub fn set_trace(&self, sink: Option<std::sync::Arc<dyn crate::TraceSink>>) {
        let mut s = lock(&self.shared.trace_sink);
        self.shared.tracing.store(sink.is_some(), Ordering::Relaxed);
        *s = sink;
    }

    /// Whether a device trace runs.
    pub fn is_tracing(&self) -> bool {
        self.shared.tracing.load(Ordering::Relaxed)
    }

    /// Number of DMA mappings the current client holds.
    pub fn dma_regions(&self) -> usize {
        lock(&self.shared.state).dma.len()
    }

    /// The counters.
    pub fn stats(&self) -> Stats {
        let refused = lock(&self.shared.state).dma.refused();
        self.shared.counters.snapshot(refused)
    }

    /// Stops the server: [`VfioUserServer::run`] returns once the blocked
    /// `accept` or the live connection (shut down under QEMU's feet: QEMU
    /// keeps running with a dead device; call
    /// [`DeviceHandle::request_unplug`] first for a graceful exit) ends.
    /// The server cannot be restarted afterwards.
    pub fn stop(&self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.stopper.stop();
    }

    /// Asks the client to release the device (vfio's REQ interrupt: QEMU
    /// answers by hot-unplugging it, which the guest must accept). Returns
    /// false if the client registered no REQ eventfd.
    pub fn request_unplug(&self) -> bool {
        lock(&self.shared.state).msix.request(&self.shared.counters)
    }

    /// Whether [`DeviceHandle::stop`] was called.
    pub fn is_stopped(&self) -> bool {
        self.shared.stop.load(Ordering::Acquire)
    }
}

/// The frames of one burst into a device, under one hold of its lock (see
/// [`DeviceHandle::receive_burst`]).
pub trait RxBurst {
    /// [`PciDevice::receive`] (without the poll: that runs once at the
    /// end), with the frame's parsed view.
    fn receive(&mut self, frame: &[u8], view: &ParsedFrame) -> Result<(), RxRefusal>;
    /// [`PciDevice::receive_tso`], as [`RxBurst::receive`].
    fn receive_tso(&mut self, frame: &[u8], view: &ParsedFrame, mss: u16) -> Result<(), RxRefusal>;
    /// [`PciDevice::rx_queue`]: where `frame` would go (`view`: the one
    /// [`RxBurst::receive`] gets).
    fn rx_queue(&self, frame: &[u8], view: &ParsedFrame) -> usize;
}

struct Burst<'a, 'io, D> {
    dev: &'a mut D,
    io: &'a mut DeviceIo<'io>,
}

impl<D: PciDevice> RxBurst for Burst<'_, '_, D> {
    fn receive(&mut self, frame: &[u8], view: &ParsedFrame) -> Result<(), RxRefusal> {
        self.dev.receive(frame, view, self.io)
    }
    fn receive_tso(&mut self, frame: &[u8], view: &ParsedFrame, mss: u16) -> Result<(), RxRefusal> {
        self.dev.receive_tso(frame, view, mss, self.io)
    }
    fn rx_queue(&self, frame: &[u8], view: &ParsedFrame) -> usize {
        self.dev.rx_queue(frame, view)
    }
}

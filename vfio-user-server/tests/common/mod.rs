//! Helpers for the integration tests: a server thread on a temp socket,
//! memfds, eventfds, and a raw vfio-user client for malformed messages.
#![allow(dead_code)]

pub mod erdma;

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pci_model::{Frame, PciDevice};

/// The PCI basics of a test double, inside its `impl PciDevice`: identity
/// (vendor 0x1b36, `device_id`, class `class_code`), one 4 KiB 32-bit BAR 0,
/// no MSI-X, BAR reads of zero.
#[allow(unused_macros)]
macro_rules! stub_pci_basics {
    ($device_id:expr, $class_code:expr) => {
        fn identity(&self) -> pci_model::PciIdentity {
            pci_model::PciIdentity {
                vendor_id: 0x1b36,
                device_id: $device_id,
                subsystem_vendor_id: 0,
                subsystem_id: 0,
                class_code: $class_code,
                revision: 0,
            }
        }
        fn bars(&self) -> Vec<pci_model::BarInfo> {
            vec![pci_model::BarInfo {
                index: 0,
                size: 0x1000,
                is_64bit: false,
                prefetchable: false,
            }]
        }
        fn msix(&self) -> Option<pci_model::MsixInfo> {
            None
        }
        fn bar_read(&mut self, _: u8, _: u64, data: &mut [u8], _: &mut pci_model::DeviceIo<'_>) {
            data.fill(0);
        }
    };
}
#[allow(unused_imports)]
pub(crate) use stub_pci_basics;
use vfio_user_server::{DeviceHandle, Error, Limits, VfioUserServer};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

pub const VFIO_USER_VERSION: u16 = 1;
pub const VFIO_USER_DMA_MAP: u16 = 2;
pub const VFIO_USER_DMA_UNMAP: u16 = 3;
pub const VFIO_USER_REGION_READ: u16 = 9;
pub const VFIO_USER_REGION_WRITE: u16 = 10;
pub const FLAG_ERROR: u32 = 1 << 5;

pub struct TestServer<D> {
    pub dir: tempfile::TempDir,
    pub path: PathBuf,
    pub handle: DeviceHandle<D>,
    pub thread: Option<JoinHandle<Result<(), Error>>>,
    pub frames: Arc<Mutex<Vec<Frame>>>,
}

impl<D: PciDevice + Send + 'static> TestServer<D> {
    pub fn start(device: D, limits: Limits) -> Self {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "warn".into()),
            )
            .with_test_writer()
            .try_init();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dev.sock");
        let frames = Arc::new(Mutex::new(Vec::new()));
        let f = frames.clone();
        let server =
            VfioUserServer::bind(&path, device, move |fr| f.lock().unwrap().push(fr), limits)
                .unwrap();
        let handle = server.handle();
        let thread = std::thread::spawn(move || server.run());
        TestServer {
            dir,
            path,
            handle,
            thread: Some(thread),
            frames,
        }
    }

    pub fn client(&self) -> vfio_user::Client {
        vfio_user::Client::new(&self.path).unwrap()
    }

    pub fn raw(&self) -> RawClient {
        RawClient {
            stream: UnixStream::connect(&self.path).unwrap(),
            id: 0,
        }
    }

    /// Stops the server and checks that its thread ends cleanly.
    pub fn stop(&mut self) {
        self.handle.stop();
        let t = self.thread.take().unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !t.is_finished() {
            assert!(Instant::now() < deadline, "server thread did not stop");
            std::thread::sleep(Duration::from_millis(10));
        }
        t.join().unwrap().unwrap();
    }

    /// Waits until `cond` holds on the stats (the server thread notices a
    /// disconnect asynchronously).
    pub fn wait_for(&self, what: &str, cond: impl Fn(&vfio_user_server::Stats) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let s = self.handle.stats();
            if cond(&s) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}: {s:?}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl<D> Drop for TestServer<D> {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            self.handle.stop();
            let _ = t.join();
        }
    }
}

/// A memfd of `size` bytes standing in for guest RAM.
pub fn memfd(size: u64) -> File {
    // SAFETY: plain syscall with a valid NUL-terminated name.
    let fd = unsafe { libc::memfd_create(c"guest-ram".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: fd is a fresh descriptor we own.
    let f = unsafe { File::from_raw_fd(fd) };
    f.set_len(size).unwrap();
    f
}

pub fn read_mem(f: &File, off: u64, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    f.read_exact_at(&mut b, off).unwrap();
    b
}

/// A non-blocking eventfd.
pub fn eventfd() -> File {
    // SAFETY: plain syscall.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: fd is a fresh descriptor we own.
    unsafe { File::from_raw_fd(fd) }
}

/// Reads and resets an eventfd's counter (0 if not signalled).
pub fn take_events(f: &File) -> u64 {
    let mut b = [0u8; 8];
    match (&*f).read(&mut b) {
        Ok(8) => u64::from_ne_bytes(b),
        _ => 0,
    }
}

pub fn read32(c: &mut vfio_user::Client, region: u32, off: u64) -> u32 {
    let mut b = [0u8; 4];
    c.region_read(region, off, &mut b).unwrap();
    u32::from_le_bytes(b)
}

pub fn write32(c: &mut vfio_user::Client, region: u32, off: u64, v: u32) {
    c.region_write(region, off, &v.to_le_bytes()).unwrap();
}

/// Bus mastering + memory space on, as a driver does before DMA.
pub fn enable_bus_master(c: &mut vfio_user::Client) {
    c.region_write(7, 0x04, &0x0006u16.to_le_bytes()).unwrap();
}

/// What QEMU and the PCI core do for a driver that uses `vectors` MSI-X
/// vectors: MSI-X enabled in the capability (found by walking the
/// capability list), then one eventfd and one `SET_IRQS` per vector. The
/// eventfds, in vector order.
pub fn msix_eventfds(c: &mut vfio_user::Client, vectors: u32) -> Vec<File> {
    let mut cfg = [0u8; 256];
    c.region_read(7, 0, &mut cfg).unwrap();
    let mut at = usize::from(cfg[0x34]);
    while at != 0 && cfg[at] != 0x11 {
        at = usize::from(cfg[at + 1]);
    }
    assert_ne!(at, 0, "no MSI-X capability");
    let ctl = u16::from_le_bytes([cfg[at + 2], cfg[at + 3]]) | 0x8000;
    c.region_write(7, at as u64 + 2, &ctl.to_le_bytes())
        .unwrap();
    (0..vectors)
        .map(|v| {
            let ev = eventfd();
            set_vector(c, v, &ev);
            ev
        })
        .collect()
}

/// `SET_IRQS`: MSI-X vector `v` signals eventfd `fd`.
pub fn set_vector(c: &mut vfio_user::Client, v: u32, fd: &File) {
    use vfio_bindings::bindings::vfio::{
        VFIO_IRQ_SET_ACTION_TRIGGER, VFIO_IRQ_SET_DATA_EVENTFD, VFIO_PCI_MSIX_IRQ_INDEX,
    };
    c.set_irqs(
        VFIO_PCI_MSIX_IRQ_INDEX,
        VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER,
        v,
        1,
        &[fd.as_raw_fd()],
    )
    .unwrap();
}

/// `VFIO_USER_F_NO_REPLY`: the server sends nothing back.
pub const FLAG_NO_REPLY: u32 = 1 << 4;

/// A second handle on the socket a `vfio_user::Client` opened to `path`:
/// the one descriptor of this process whose peer is `path`. Used to send
/// what that client cannot, posted writes ([`posted_write`]).
pub fn client_socket(path: &std::path::Path) -> UnixStream {
    let mut found: Vec<UnixStream> = vfio_user_server::process_sockets()
        .filter(|s| {
            s.peer_addr()
                .ok()
                .and_then(|a| a.as_pathname().map(|p| p == path))
                == Some(true)
        })
        .collect();
    assert_eq!(found.len(), 1, "one client socket to {}", path.display());
    found.pop().unwrap()
}

/// A posted region write, as QEMU sends BAR writes (`VFIO_USER_F_NO_REPLY`:
/// the client goes on without waiting; a later read is answered only after
/// it, as PCIe orders a read behind posted writes).
pub fn posted_write(s: &mut UnixStream, region: u32, offset: u64, data: &[u8]) {
    let p = region_access(region, offset, data.len() as u32, data);
    let msg = message(
        0,
        VFIO_USER_REGION_WRITE,
        FLAG_NO_REPLY,
        16 + p.len() as u32,
        &p,
    );
    s.write_all(&msg).unwrap();
}

/// A message: the 16-byte header (`id`, `cmd`, `size`, `flags`, error 0)
/// and `payload`.
fn message(id: u16, cmd: u16, flags: u32, size: u32, payload: &[u8]) -> Vec<u8> {
    let mut msg = Vec::with_capacity(16 + payload.len());
    msg.extend_from_slice(&id.to_le_bytes());
    msg.extend_from_slice(&cmd.to_le_bytes());
    msg.extend_from_slice(&size.to_le_bytes());
    msg.extend_from_slice(&flags.to_le_bytes());
    msg.extend_from_slice(&0u32.to_le_bytes());
    msg.extend_from_slice(payload);
    msg
}

/// A region access's payload: offset, region, count, then `data` (empty
/// for a read).
fn region_access(region: u32, offset: u64, count: u32, data: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(16 + data.len());
    p.extend_from_slice(&offset.to_le_bytes());
    p.extend_from_slice(&region.to_le_bytes());
    p.extend_from_slice(&count.to_le_bytes());
    p.extend_from_slice(data);
    p
}

/// A vfio-user client speaking raw messages, for what `vfio_user::Client`
/// cannot send (or cannot survive the reply of).
pub struct RawClient {
    pub stream: UnixStream,
    id: u16,
}

pub struct Reply {
    pub flags: u32,
    pub error: u32,
    pub payload: Vec<u8>,
}

impl Reply {
    pub fn is_error(&self) -> bool {
        self.flags & FLAG_ERROR != 0
    }
}

impl RawClient {
    pub fn send(&mut self, cmd: u16, size: u32, payload: &[u8], fds: &[RawFd]) {
        let msg = message(self.id, cmd, 0, size, payload);
        self.id = self.id.wrapping_add(1);
        if fds.is_empty() {
            self.stream.write_all(&msg).unwrap();
        } else {
            self.stream.send_with_fds(&[&msg[..]], fds).unwrap();
        }
    }

    pub fn recv(&mut self) -> Reply {
        let mut h = [0u8; 16];
        self.stream.read_exact(&mut h).unwrap();
        let size = u32::from_le_bytes(h[4..8].try_into().unwrap());
        let flags = u32::from_le_bytes(h[8..12].try_into().unwrap());
        let error = u32::from_le_bytes(h[12..16].try_into().unwrap());
        let mut payload = vec![0u8; (size as usize).saturating_sub(16)];
        self.stream.read_exact(&mut payload).unwrap();
        Reply {
            flags,
            error,
            payload,
        }
    }

    pub fn call(&mut self, cmd: u16, payload: &[u8], fds: &[RawFd]) -> Reply {
        self.send(cmd, 16 + payload.len() as u32, payload, fds);
        self.recv()
    }

    pub fn dma_map(
        &mut self,
        flags: u32,
        offset: u64,
        iova: u64,
        size: u64,
        fd: Option<&File>,
    ) -> Reply {
        let mut p = Vec::new();
        p.extend_from_slice(&32u32.to_le_bytes());
        p.extend_from_slice(&flags.to_le_bytes());
        p.extend_from_slice(&offset.to_le_bytes());
        p.extend_from_slice(&iova.to_le_bytes());
        p.extend_from_slice(&size.to_le_bytes());
        let fds: Vec<RawFd> = fd.iter().map(|f| f.as_raw_fd()).collect();
        self.call(VFIO_USER_DMA_MAP, &p, &fds)
    }

    pub fn dma_unmap(&mut self, flags: u32, iova: u64, size: u64) -> Reply {
        let mut p = Vec::new();
        p.extend_from_slice(&24u32.to_le_bytes());
        p.extend_from_slice(&flags.to_le_bytes());
        p.extend_from_slice(&iova.to_le_bytes());
        p.extend_from_slice(&size.to_le_bytes());
        self.call(VFIO_USER_DMA_UNMAP, &p, &[])
    }

    pub fn region_read(&mut self, region: u32, offset: u64, count: u32) -> Reply {
        let p = region_access(region, offset, count, &[]);
        self.call(VFIO_USER_REGION_READ, &p, &[])
    }

    pub fn region_write(&mut self, region: u32, offset: u64, data: &[u8]) -> Reply {
        let p = region_access(region, offset, data.len() as u32, data);
        self.call(VFIO_USER_REGION_WRITE, &p, &[])
    }
}

/// The test's own view of guest RAM: a shared mmap of the memfd it hands
/// the server with `DMA_MAP`, addressed by IOVA as a driver would.
pub struct MappedMem {
    ptr: *mut u8,
    len: usize,
    base: u64,
}

impl MappedMem {
    /// Maps all of `f` (`MAP_SHARED`, read/write), seen at IOVA `base`.
    pub fn new(f: &File, base: u64) -> Self {
        let len = f.metadata().unwrap().len() as usize;
        // SAFETY: a fresh shared mapping of a file we hold; the kernel picks
        // the address.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        assert_ne!(ptr, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
        MappedMem {
            ptr: ptr.cast(),
            len,
            base,
        }
    }

    fn offset(&self, iova: u64, n: usize) -> usize {
        let off = iova
            .checked_sub(self.base)
            .expect("address below guest RAM") as usize;
        assert!(off + n <= self.len, "address past guest RAM");
        off
    }

    pub fn read(&self, iova: u64, n: usize) -> Vec<u8> {
        let off = self.offset(iova, n);
        let mut b = vec![0u8; n];
        // SAFETY: `off + n` is inside the mapping (checked above); the
        // server writes only while the test waits for its reply.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(off), b.as_mut_ptr(), n) };
        b
    }

    pub fn write(&self, iova: u64, data: &[u8]) {
        let off = self.offset(iova, data.len());
        // SAFETY: as in `read`.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(off), data.len()) };
    }

    /// A driver's `dma_alloc_coherent`: the next `size` bytes at `align`
    /// from the bump pointer `next`, zeroed; panics past `end`.
    pub fn alloc_zeroed(&self, next: &mut u64, end: u64, size: u64, align: u64) -> u64 {
        let a = next.div_ceil(align) * align;
        *next = a + size;
        assert!(*next <= end, "guest memory exhausted");
        self.write(a, &vec![0; size as usize]);
        a
    }
}

impl Drop for MappedMem {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `new` mapped.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

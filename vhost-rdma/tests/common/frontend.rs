//! The one in-process vhost-user frontend of the tests and benches: what QEMU
//! does for a virtio-net device (connect, feature and protocol-feature
//! negotiation, a memfd as guest memory passed with `SET_MEM_TABLE`, vring
//! setup in QEMU's order) and the driver half of a split virtqueue
//! ([`SplitRing`]: descriptor writes, avail publishing with kick suppression,
//! used reads, call arming).
//!
//! Two drivers sit on it, differing only in how they use their buffers:
//! - [`TestGuest`](super::guest::TestGuest), strict and allocating per frame:
//!   the integration tests, the `attack` bench and part 1 of the `fabric`
//!   bench;
//! - [`FastGuest`](super::fast_guest::FastGuest), one fixed buffer per ring
//!   slot and nothing allocated per frame: part 2 of the `fabric` bench,
//!   which drives the daemon and `dpdk-testpmd` alike.
//!
//! Guest memory is mapped in this process between PROT_NONE guard pages
//! ([`GuardedMap`]); guest physical addresses start at [`GPA_BASE`]; ring
//! addresses are given to the backend as our own virtual addresses (as QEMU
//! does).

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::path::Path;
use std::sync::atomic::{fence, AtomicU16, Ordering};

use anyhow::{ensure, Context};
use vhost::vhost_user::message::{VhostUserHeaderFlag, VhostUserProtocolFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vm_memory::{GuestAddress, GuestMemoryMmap, GuestRegionMmap, MmapRegion};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// Virtio-net and transport feature bits.
pub mod feat {
    pub const CSUM: u64 = 1 << 0;
    pub const GUEST_CSUM: u64 = 1 << 1;
    pub const MAC: u64 = 1 << 5;
    pub const GUEST_TSO4: u64 = 1 << 7;
    pub const GUEST_TSO6: u64 = 1 << 8;
    pub const GUEST_ECN: u64 = 1 << 9;
    pub const GUEST_UFO: u64 = 1 << 10;
    pub const HOST_TSO4: u64 = 1 << 11;
    pub const HOST_TSO6: u64 = 1 << 12;
    pub const HOST_UFO: u64 = 1 << 14;
    pub const MRG_RXBUF: u64 = 1 << 15;
    pub const STATUS: u64 = 1 << 16;
    pub const CTRL_VQ: u64 = 1 << 17;
    pub const MQ: u64 = 1 << 22;
    pub const INDIRECT_DESC: u64 = 1 << 28;
    pub const EVENT_IDX: u64 = 1 << 29;
    pub const PROTOCOL_FEATURES: u64 = 1 << 30;
    pub const VERSION_1: u64 = 1 << 32;
    pub const HASH_REPORT: u64 = 1 << 57;
    pub const RSS: u64 = 1 << 60;

    /// What the daemon is specified to offer on every port.
    pub const DAEMON_OFFERS: u64 = VERSION_1
        | MAC
        | STATUS
        | MRG_RXBUF
        | MQ
        | EVENT_IDX
        | INDIRECT_DESC
        | CSUM
        | GUEST_CSUM
        | HOST_TSO4
        | HOST_TSO6
        | GUEST_TSO4
        | GUEST_TSO6
        | PROTOCOL_FEATURES;

    /// Everything a Linux guest would take.
    pub const ALL: u64 = DAEMON_OFFERS;
    /// A minimal guest: no offloads, no mergeable buffers, no event index.
    pub const MINIMAL: u64 = VERSION_1 | MAC | STATUS | MQ;
    /// Receive offloads (the receiver may get partial checksums and GSO frames).
    pub const GUEST_OFFLOADS: u64 = GUEST_CSUM | GUEST_TSO4 | GUEST_TSO6;
    /// Transmit offloads (the sender may hand NEEDS_CSUM and GSO frames).
    pub const HOST_OFFLOADS: u64 = CSUM | HOST_TSO4 | HOST_TSO6;

    /// Names of the bits in `f` (those above), for reports.
    pub fn names(f: u64) -> String {
        const NAMES: [(u64, &str); 20] = [
            (VERSION_1, "VERSION_1"),
            (MRG_RXBUF, "MRG_RXBUF"),
            (EVENT_IDX, "EVENT_IDX"),
            (MAC, "MAC"),
            (STATUS, "STATUS"),
            (PROTOCOL_FEATURES, "PROTOCOL_FEATURES"),
            (MQ, "MQ"),
            (CTRL_VQ, "CTRL_VQ"),
            (INDIRECT_DESC, "INDIRECT_DESC"),
            (CSUM, "CSUM"),
            (GUEST_CSUM, "GUEST_CSUM"),
            (HOST_TSO4, "HOST_TSO4"),
            (HOST_TSO6, "HOST_TSO6"),
            (HOST_UFO, "HOST_UFO"),
            (GUEST_TSO4, "GUEST_TSO4"),
            (GUEST_TSO6, "GUEST_TSO6"),
            (GUEST_ECN, "GUEST_ECN"),
            (GUEST_UFO, "GUEST_UFO"),
            (HASH_REPORT, "HASH_REPORT"),
            (RSS, "RSS"),
        ];
        let v: Vec<&str> = NAMES
            .iter()
            .filter(|(bit, _)| f & bit != 0)
            .map(|&(_, name)| name)
            .collect();
        v.join("|")
    }
}

pub const DESC_F_NEXT: u16 = 1;
pub const DESC_F_WRITE: u16 = 2;
pub const DESC_F_INDIRECT: u16 = 4;
const USED_F_NO_NOTIFY: u16 = 1;
const AVAIL_F_NO_INTERRUPT: u16 = 1;

/// Guest physical address of the start of guest memory.
pub const GPA_BASE: u64 = 0x10_0000;
/// Size of each guard area.
pub const GUARD: usize = 4096;
const PAGE: u64 = 4096;

/// A memfd of `size` bytes: guest memory the backend can map too.
pub fn memfd(size: usize) -> anyhow::Result<File> {
    // SAFETY: the name is a valid NUL-terminated string; we check the result.
    let fd = unsafe { libc::memfd_create(c"vhost-rdma-test-guest".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("memfd_create");
    }
    // SAFETY: fd is a freshly created descriptor that nothing else owns.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(size as u64)?;
    Ok(file)
}

/// A shared mapping of a memfd with a PROT_NONE guard page on each side, so
/// that a frontend access just outside guest memory faults instead of
/// touching a neighbouring mapping.
pub struct GuardedMap {
    /// Start of the usable (read-write) part.
    pub base: usize,
    pub size: usize,
    reservation: usize,
    reservation_len: usize,
}

impl GuardedMap {
    pub fn new(file: &File, size: usize) -> anyhow::Result<GuardedMap> {
        let reservation_len = size + 2 * GUARD;
        // SAFETY: a fresh anonymous PROT_NONE reservation; nothing aliases it.
        let r = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                reservation_len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if r == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error()).context("reserving guarded mapping");
        }
        let base = r as usize + GUARD;
        // SAFETY: maps the memfd over the middle of our own reservation.
        let m = unsafe {
            libc::mmap(
                base as *mut libc::c_void,
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                file.as_raw_fd(),
                0,
            )
        };
        if m == libc::MAP_FAILED {
            let e = std::io::Error::last_os_error();
            // SAFETY: unmapping the reservation made above.
            unsafe { libc::munmap(r, reservation_len) };
            return Err(e).context("mapping guest memory between guard pages");
        }
        Ok(GuardedMap {
            base,
            size,
            reservation: r as usize,
            reservation_len,
        })
    }

    /// A `GuestMemoryMmap` over this mapping at `gpa` (it does not own the
    /// mapping: `self` must outlive it).
    pub fn guest_memory(&self, gpa: GuestAddress) -> anyhow::Result<GuestMemoryMmap> {
        // SAFETY: base..base+size is a live read-write shared mapping that we
        // unmap only when its owner (which owns both) is dropped.
        let region = unsafe {
            MmapRegion::build_raw(
                self.base as *mut u8,
                self.size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
            )
        }
        .context("wrapping the guarded mapping")?;
        let r = GuestRegionMmap::new(region, gpa).context("guest region overflows")?;
        GuestMemoryMmap::from_regions(vec![r]).context("guest memory")
    }
}

impl Drop for GuardedMap {
    fn drop(&mut self) {
        // SAFETY: the reservation (and the memfd mapped inside it) is ours.
        unsafe { libc::munmap(self.reservation as *mut libc::c_void, self.reservation_len) };
    }
}

/// The SET_MEM_TABLE entry of `size` bytes of `file` mapped at `hva`, seen by
/// the guest at `gpa`.
pub fn region_info(gpa: u64, size: usize, hva: u64, file: &File) -> VhostUserMemoryRegionInfo {
    VhostUserMemoryRegionInfo {
        guest_phys_addr: gpa,
        memory_size: size as u64,
        userspace_addr: hva,
        mmap_offset: 0,
        mmap_handle: file.as_raw_fd(),
    }
}

/// Guest memory: a memfd, our guarded mapping of it at [`GPA_BASE`], and a
/// bump allocator (with free lists per size) over it.
pub struct GuestRam {
    pub file: File,
    pub map: GuardedMap,
    next: u64,
    free: HashMap<u64, Vec<u64>>,
}

impl GuestRam {
    pub fn new(size: usize) -> anyhow::Result<GuestRam> {
        let file = memfd(size)?;
        let map = GuardedMap::new(&file, size)?;
        Ok(GuestRam {
            file,
            map,
            next: GPA_BASE,
            free: HashMap::new(),
        })
    }

    pub fn size(&self) -> u64 {
        self.map.size as u64
    }

    /// One past the last guest physical address.
    pub fn end(&self) -> u64 {
        GPA_BASE + self.size()
    }

    /// Our virtual address of `gpa`.
    pub fn hva(&self, gpa: u64) -> u64 {
        gpa - GPA_BASE + self.map.base as u64
    }

    /// Pointer to `gpa`, which must lie inside guest memory.
    pub fn ptr(&self, gpa: u64) -> *mut u8 {
        debug_assert!((GPA_BASE..self.end()).contains(&gpa));
        self.hva(gpa) as *mut u8
    }

    /// The SET_MEM_TABLE entry of this memory.
    pub fn region(&self) -> VhostUserMemoryRegionInfo {
        region_info(GPA_BASE, self.map.size, self.map.base as u64, &self.file)
    }

    /// `size` bytes aligned to `align` (small allocations are recycled).
    pub fn alloc(&mut self, size: u64, align: u64) -> u64 {
        let size = size.max(1).next_multiple_of(64);
        if align <= 64 {
            if let Some(a) = self.free.get_mut(&size).and_then(|v| v.pop()) {
                return a;
            }
        }
        let a = self.next.next_multiple_of(align);
        assert!(
            a + size <= self.end(),
            "test guest memory exhausted (allocating {size} bytes); raise GuestOpts::mem_size"
        );
        self.next = a + size;
        a
    }

    pub fn free(&mut self, addr: u64, size: u64) {
        let size = size.max(1).next_multiple_of(64);
        self.free.entry(size).or_default().push(addr);
    }
}

/// Whether a driver that moved its index from `old` to `new` must notify a
/// device that asked to hear at `event` (virtio's `vring_need_event`).
pub fn need_event(event: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}

/// One split virtqueue, driver side: the three parts in guest memory (read
/// and written through our mapping), the driver's indexes and the two
/// eventfds. Bookkeeping of what is in flight is the driver's above it.
pub struct SplitRing {
    /// The queue's index on the device.
    pub index: usize,
    pub size: u16,
    /// Guest physical addresses of the descriptor table, avail and used rings.
    pub desc: u64,
    pub avail: u64,
    pub used: u64,
    // Our mapping of the same: the owner of the GuestRam keeps it mapped for
    // as long as the ring lives.
    desc_p: *mut u8,
    avail_p: *mut u8,
    used_p: *mut u8,
    pub avail_idx: u16,
    pub last_used: u16,
    event_idx: bool,
    pub kick: EventFd,
    pub call: EventFd,
    /// Kicks sent, and publishes the device let us skip the kick of.
    pub kicks: u64,
    pub suppressed_kicks: u64,
}

// SAFETY: the pointers only address guest memory owned by the ring's owner,
// which moves between threads together with the ring; nothing else in this
// process touches that memory.
unsafe impl Send for SplitRing {}

impl SplitRing {
    /// Lays out queue `index` with `size` entries in `ram`, both indexes at
    /// `base`, and hands it to the backend (SET_VRING_NUM, _BASE, _ADDR,
    /// _KICK, _CALL). `event_idx`: EVENT_IDX was negotiated.
    pub fn start(
        fe: &mut Frontend,
        ram: &mut GuestRam,
        index: usize,
        size: u16,
        base: u16,
        event_idx: bool,
    ) -> anyhow::Result<SplitRing> {
        let n = size as u64;
        let desc = ram.alloc(16 * n, PAGE);
        let avail = ram.alloc(6 + 2 * n, PAGE);
        let used = ram.alloc(6 + 8 * n, PAGE);
        let kick = EventFd::new(EFD_NONBLOCK)?;
        let call = EventFd::new(EFD_NONBLOCK)?;
        let ring = SplitRing {
            index,
            size,
            desc,
            avail,
            used,
            desc_p: ram.ptr(desc),
            avail_p: ram.ptr(avail),
            used_p: ram.ptr(used),
            avail_idx: base,
            last_used: base,
            event_idx,
            kick,
            call,
            kicks: 0,
            suppressed_kicks: 0,
        };
        ring.u16_at(ring.avail_p, 2)
            .store(base.to_le(), Ordering::Relaxed);
        ring.u16_at(ring.used_p, 2)
            .store(base.to_le(), Ordering::Relaxed);
        fe.set_vring_num(index, size).context("SET_VRING_NUM")?;
        fe.set_vring_base(index, base).context("SET_VRING_BASE")?;
        fe.set_vring_addr(
            index,
            &VringConfigData {
                queue_max_size: size,
                queue_size: size,
                flags: 0,
                desc_table_addr: ram.hva(desc),
                used_ring_addr: ram.hva(used),
                avail_ring_addr: ram.hva(avail),
                log_addr: None,
            },
        )
        .context("SET_VRING_ADDR")?;
        fe.set_vring_kick(index, &ring.kick)
            .context("SET_VRING_KICK")?;
        fe.set_vring_call(index, &ring.call)
            .context("SET_VRING_CALL")?;
        Ok(ring)
    }

    /// The 16-bit ring field `off` bytes into the part at `p`.
    fn u16_at(&self, p: *mut u8, off: usize) -> &AtomicU16 {
        // SAFETY: callers pass 2-byte aligned offsets inside one ring part,
        // which lies in the live mapping (see the pointer fields).
        unsafe { &*(p.add(off) as *const AtomicU16) }
    }

    /// Writes descriptor `i` (taken modulo the size: a hostile driver may
    /// name any slot).
    pub fn write_desc(&self, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let i = (i % self.size) as usize;
        // SAFETY: i < size and the table has `size` 16-byte entries.
        unsafe {
            let d = self.desc_p.add(16 * i);
            (d as *mut u64).write_volatile(addr.to_le());
            (d.add(8) as *mut u32).write_volatile(len.to_le());
            (d.add(12) as *mut u16).write_volatile(flags.to_le());
            (d.add(14) as *mut u16).write_volatile(next.to_le());
        }
    }

    /// Puts `head` in the next avail slot (not yet visible to the device).
    pub fn push(&mut self, head: u16) {
        let slot = (self.avail_idx % self.size) as usize;
        // SAFETY: slot < size; the avail ring has `size` entries after 4 bytes.
        unsafe { (self.avail_p.add(4 + 2 * slot) as *mut u16).write_volatile(head.to_le()) };
        self.avail_idx = self.avail_idx.wrapping_add(1);
    }

    /// Makes the entries pushed since the index was `old` visible and kicks
    /// if the device asks for it (`avail_event`, or no
    /// `VRING_USED_F_NO_NOTIFY`). Returns whether it kicked.
    pub fn publish(&mut self, old: u16) -> bool {
        self.u16_at(self.avail_p, 2)
            .store(self.avail_idx.to_le(), Ordering::Release);
        // The index store must be visible before we read whether to kick,
        // or a device going to sleep could miss it.
        fence(Ordering::SeqCst);
        let kick = if self.event_idx {
            // avail_event lives after the used ring's entries.
            let ev = self
                .u16_at(self.used_p, 4 + 8 * self.size as usize)
                .load(Ordering::Acquire);
            need_event(u16::from_le(ev), self.avail_idx, old)
        } else {
            let flags = self.u16_at(self.used_p, 0).load(Ordering::Acquire);
            u16::from_le(flags) & USED_F_NO_NOTIFY == 0
        };
        if kick {
            self.kick.write(1).expect("kick eventfd");
            self.kicks += 1;
        } else {
            self.suppressed_kicks += 1;
        }
        kick
    }

    /// The device's used index.
    pub fn used_idx(&self) -> u16 {
        u16::from_le(self.u16_at(self.used_p, 2).load(Ordering::Acquire))
    }

    /// Used entries published and not yet popped (may exceed the size on a
    /// misbehaving device: callers check).
    pub fn pending(&self) -> u16 {
        self.used_idx().wrapping_sub(self.last_used)
    }

    /// The next used element `(id, len)`, unchecked; the caller saw
    /// `pending() > 0`.
    pub fn pop(&mut self) -> (u32, u32) {
        let slot = (self.last_used % self.size) as usize;
        // SAFETY: slot < size; used entries are 8 bytes after a 4-byte header.
        let (id, len) = unsafe {
            let e = self.used_p.add(4 + 8 * slot);
            (
                u32::from_le((e as *const u32).read_volatile()),
                u32::from_le((e.add(4) as *const u32).read_volatile()),
            )
        };
        self.last_used = self.last_used.wrapping_add(1);
        (id, len)
    }

    /// Asks for a call once `after` (>= 1) more used entries are published:
    /// `used_event` with EVENT_IDX, else clears `VRING_AVAIL_F_NO_INTERRUPT`.
    pub fn arm(&self, after: u16) {
        if self.event_idx {
            let ev = self.last_used.wrapping_add(after.max(1) - 1);
            self.u16_at(self.avail_p, 4 + 2 * self.size as usize)
                .store(ev.to_le(), Ordering::Release);
        } else {
            self.u16_at(self.avail_p, 0).store(0, Ordering::Release);
        }
        // Armed before the caller re-checks the used index, so that an entry
        // published in between either is seen or is signalled.
        fence(Ordering::SeqCst);
    }

    /// No calls wanted (best effort: EVENT_IDX has no "never").
    pub fn disarm(&self) {
        if !self.event_idx {
            self.u16_at(self.avail_p, 0)
                .store(AVAIL_F_NO_INTERRUPT.to_le(), Ordering::Release);
        }
    }
}

/// What a driver asks of the backend when it connects.
pub struct Want {
    /// Queues it sets up (the frontend offers the backend one more slot).
    pub queues: usize,
    /// Virtio features; the negotiated set is `offered & features` (plus
    /// PROTOCOL_FEATURES when offered).
    pub features: u64,
    /// Protocol features, when the backend offers PROTOCOL_FEATURES.
    pub protocol: VhostUserProtocolFeatures,
    pub mem_size: usize,
}

/// A negotiated vhost-user connection with its guest memory, rings not yet
/// set up.
pub struct Connection {
    pub fe: Frontend,
    pub offered: u64,
    pub features: u64,
    pub protocol: VhostUserProtocolFeatures,
    /// GET_QUEUE_NUM's answer, when MQ was negotiated.
    pub queue_num: Option<u64>,
    pub ram: GuestRam,
}

impl Connection {
    /// Connects to `path` and does what QEMU does before starting the rings:
    /// SET_OWNER, features, protocol features (REPLY_ACK makes every later
    /// message synchronous), GET_QUEUE_NUM with MQ, SET_MEM_TABLE.
    pub fn open(path: &Path, want: &Want) -> anyhow::Result<Connection> {
        let mut fe = Frontend::connect(path, want.queues as u64 + 1)
            .with_context(|| format!("connecting to {}", path.display()))?;
        fe.set_owner().context("SET_OWNER")?;
        let offered = fe.get_features().context("GET_FEATURES")?;
        let mut protocol = VhostUserProtocolFeatures::empty();
        let mut queue_num = None;
        if offered & feat::PROTOCOL_FEATURES != 0 {
            let avail = fe
                .get_protocol_features()
                .context("GET_PROTOCOL_FEATURES")?;
            protocol = avail & want.protocol;
            fe.set_protocol_features(protocol)
                .context("SET_PROTOCOL_FEATURES")?;
            if protocol.contains(VhostUserProtocolFeatures::REPLY_ACK) {
                fe.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
            }
            if protocol.contains(VhostUserProtocolFeatures::MQ) {
                let n = fe.get_queue_num().context("GET_QUEUE_NUM")?;
                ensure!(
                    n as usize >= want.queues,
                    "backend has {n} queues, the guest wants {}",
                    want.queues
                );
                queue_num = Some(n);
            }
        }
        let features = offered & (want.features | feat::PROTOCOL_FEATURES);
        fe.set_features(features).context("SET_FEATURES")?;
        let ram = GuestRam::new(want.mem_size)?;
        fe.set_mem_table(&[ram.region()]).context("SET_MEM_TABLE")?;
        Ok(Connection {
            fe,
            offered,
            features,
            protocol,
            queue_num,
            ram,
        })
    }

    /// Sets up queue `index` (see [`SplitRing::start`]).
    pub fn start_ring(&mut self, index: usize, size: u16, base: u16) -> anyhow::Result<SplitRing> {
        let event_idx = self.features & feat::EVENT_IDX != 0;
        SplitRing::start(&mut self.fe, &mut self.ram, index, size, base, event_idx)
            .with_context(|| format!("starting vring {index}"))
    }

    /// Enables queues `0..n` (only with PROTOCOL_FEATURES: without it they
    /// start enabled).
    pub fn enable(&mut self, n: usize) -> anyhow::Result<()> {
        if self.features & feat::PROTOCOL_FEATURES != 0 {
            for i in 0..n {
                self.fe
                    .set_vring_enable(i, true)
                    .with_context(|| format!("SET_VRING_ENABLE {i}"))?;
            }
        }
        Ok(())
    }
}

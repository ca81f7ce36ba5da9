//! A lean vhost-user virtio-net frontend for the switch comparison: the same
//! control path as the test harness's `TestGuest` (QEMU's message order over
//! the `vhost` crate's `Frontend`, memfd guest memory), but a data path that
//! costs the frontend as little as possible so that the switch, not the
//! driver, sets the pace:
//!
//! - every descriptor slot owns one fixed 2 KiB buffer, written once: sending
//!   a frame is one avail-ring entry, receiving one is a used-ring read and a
//!   re-post of the same slot;
//! - kicks follow `avail_event` (EVENT_IDX) or `VRING_USED_F_NO_NOTIFY`;
//!   calls are asked for only before sleeping, with `used_event` set to wake
//!   us after a burst rather than after every frame (like Linux NAPI);
//! - the driver sleeps in `poll(2)` on the call eventfds, never spins.
//!
//! Nothing here is specific to one backend: the daemon and `dpdk-testpmd`'s
//! `net_vhost` ports are driven by exactly this code.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::path::Path;
use std::sync::atomic::{fence, AtomicU16, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use vhost::vhost_user::message::{VhostUserHeaderFlag, VhostUserProtocolFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// Virtio feature bits the benchmark cares about.
pub mod feat {
    pub const MAC: u64 = 1 << 5;
    pub const MRG_RXBUF: u64 = 1 << 15;
    pub const STATUS: u64 = 1 << 16;
    pub const EVENT_IDX: u64 = 1 << 29;
    pub const PROTOCOL_FEATURES: u64 = 1 << 30;
    pub const VERSION_1: u64 = 1 << 32;

    /// What the benchmark guest asks for (intersected with the offer): no
    /// offloads, no indirect descriptors, one queue pair.
    pub const WANT: u64 = VERSION_1 | MRG_RXBUF | EVENT_IDX | MAC | STATUS;

    /// Names of the bits above, for the report.
    pub fn names(f: u64) -> String {
        let mut v = Vec::new();
        for (bit, name) in [
            (VERSION_1, "VERSION_1"),
            (MRG_RXBUF, "MRG_RXBUF"),
            (EVENT_IDX, "EVENT_IDX"),
            (MAC, "MAC"),
            (STATUS, "STATUS"),
            (PROTOCOL_FEATURES, "PROTOCOL_FEATURES"),
        ] {
            if f & bit != 0 {
                v.push(name);
            }
        }
        v.join("|")
    }
}

/// `struct virtio_net_hdr_mrg_rxbuf` (VERSION_1 layout is always 12 bytes).
pub const HDR_LEN: usize = 12;
/// Size of every buffer (one frame up to 2036 bytes per descriptor).
pub const BUF_SIZE: usize = 2048;
/// Guest physical address of the start of guest memory.
const GPA_BASE: u64 = 0x10_0000;
const DESC_F_WRITE: u16 = 2;
const USED_F_NO_NOTIFY: u16 = 1;
const AVAIL_F_NO_INTERRUPT: u16 = 1;
const PAGE: usize = 4096;

fn need_event(event: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}

/// A shared mapping of a memfd: the guest's memory.
struct Mem {
    file: File,
    base: *mut u8,
    size: usize,
}

impl Mem {
    fn new(size: usize) -> Result<Mem> {
        // SAFETY: valid NUL-terminated name; the result is checked.
        let fd =
            unsafe { libc::memfd_create(c"vhost-rdma-bench-guest".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error()).context("memfd_create");
        }
        // SAFETY: fd is fresh and owned by nothing else.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(size as u64)?;
        // SAFETY: a fresh shared mapping of our own memfd.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error()).context("mmap guest memory");
        }
        Ok(Mem {
            file,
            base: p as *mut u8,
            size,
        })
    }
    fn hva(&self, off: usize) -> u64 {
        self.base as u64 + off as u64
    }
    fn gpa(off: usize) -> u64 {
        GPA_BASE + off as u64
    }
    /// Pointer at offset `off` (inside the mapping by construction).
    fn at(&self, off: usize) -> *mut u8 {
        debug_assert!(off < self.size);
        // SAFETY: callers only pass offsets of the layout below, all < size.
        unsafe { self.base.add(off) }
    }
}

impl Drop for Mem {
    fn drop(&mut self) {
        // SAFETY: unmapping our own mapping; nothing refers to it any more.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.size) };
    }
}

/// One split virtqueue, driver side.
struct Ring {
    desc: *mut u8,
    avail: *mut u8,
    used: *mut u8,
    size: u16,
    avail_idx: u16,
    last_used: u16,
    event_idx: bool,
    kick: EventFd,
    call: EventFd,
    kicks: u64,
}

impl Ring {
    fn write_desc(&self, i: u16, addr: u64, len: u32, flags: u16) {
        // SAFETY: i < size, the table has `size` 16-byte entries.
        unsafe {
            let d = self.desc.add(16 * i as usize);
            (d as *mut u64).write_volatile(addr.to_le());
            (d.add(8) as *mut u32).write_volatile(len.to_le());
            (d.add(12) as *mut u16).write_volatile(flags.to_le());
            (d.add(14) as *mut u16).write_volatile(0);
        }
    }
    fn u16_at(p: *mut u8) -> &'static AtomicU16 {
        // SAFETY: 2-byte aligned ring fields inside the live mapping, which
        // outlives every use (the Ring is dropped with its Guest).
        unsafe { &*(p as *const AtomicU16) }
    }
    /// Puts `head` in the next avail slot (not yet visible to the device).
    fn push(&mut self, head: u16) {
        let slot = (self.avail_idx % self.size) as usize;
        // SAFETY: slot < size; the avail ring has `size` entries after 4 bytes.
        unsafe { (self.avail.add(4 + 2 * slot) as *mut u16).write_volatile(head.to_le()) };
        self.avail_idx = self.avail_idx.wrapping_add(1);
    }
    /// Makes the pushed entries visible (from `old`) and kicks if the device asks.
    fn publish(&mut self, old: u16) {
        if old == self.avail_idx {
            return;
        }
        Self::u16_at(unsafe { self.avail.add(2) }).store(self.avail_idx.to_le(), Ordering::Release);
        fence(Ordering::SeqCst);
        let kick = if self.event_idx {
            // avail_event lives after the used ring's entries.
            let ev = Self::u16_at(unsafe { self.used.add(4 + 8 * self.size as usize) })
                .load(Ordering::Acquire);
            need_event(u16::from_le(ev), self.avail_idx, old)
        } else {
            let flags = Self::u16_at(self.used).load(Ordering::Acquire);
            u16::from_le(flags) & USED_F_NO_NOTIFY == 0
        };
        if kick {
            self.kick.write(1).expect("kick eventfd");
            self.kicks += 1;
        }
    }
    fn used_idx(&self) -> u16 {
        u16::from_le(Self::u16_at(unsafe { self.used.add(2) }).load(Ordering::Acquire))
    }
    fn pending(&self) -> u16 {
        self.used_idx().wrapping_sub(self.last_used)
    }
    /// The next used element (id, len); the caller checked `pending() > 0`.
    fn pop(&mut self) -> (u32, u32) {
        let slot = (self.last_used % self.size) as usize;
        // SAFETY: slot < size; used entries are 8 bytes after a 4-byte header.
        let (id, len) = unsafe {
            let e = self.used.add(4 + 8 * slot);
            (
                u32::from_le((e as *const u32).read_volatile()),
                u32::from_le((e.add(4) as *const u32).read_volatile()),
            )
        };
        self.last_used = self.last_used.wrapping_add(1);
        (id, len)
    }
    /// Asks for a call once `after` (>= 1) more used entries are published.
    fn arm(&self, after: u16) {
        if self.event_idx {
            let ev = self.last_used.wrapping_add(after.max(1) - 1);
            Self::u16_at(unsafe { self.avail.add(4 + 2 * self.size as usize) })
                .store(ev.to_le(), Ordering::Release);
        } else {
            Self::u16_at(self.avail).store(0, Ordering::Release);
        }
        fence(Ordering::SeqCst);
    }
    /// No calls wanted (best effort: EVENT_IDX has no "never").
    fn disarm(&self) {
        if !self.event_idx {
            Self::u16_at(self.avail).store(AVAIL_F_NO_INTERRUPT.to_le(), Ordering::Release);
        }
    }
}

/// One guest on one vhost-user virtio-net port: queue 0 receives, queue 1
/// transmits.
pub struct Guest {
    fe: Frontend,
    rx: Ring,
    tx: Ring,
    tx_free: Vec<u16>,
    tx_buf: usize,
    rx_buf: usize,
    frame_len: usize,
    pub offered: u64,
    pub features: u64,
    // Declared last: the mapping must outlive the rings pointing into it.
    mem: Mem,
}

impl Guest {
    /// Connects to a vhost-user backend at `path`, negotiates
    /// `offered & want`, maps guest memory and starts both queues with
    /// `queue_size` entries; every RX slot is posted.
    pub fn connect(path: &Path, want: u64, queue_size: u16) -> Result<Guest> {
        ensure!(
            queue_size.is_power_of_two() && queue_size <= 1024,
            "queue size {queue_size}"
        );
        let mut fe = Frontend::connect(path, 3)
            .with_context(|| format!("connecting to {}", path.display()))?;
        fe.set_owner().context("SET_OWNER")?;
        let offered = fe.get_features().context("GET_FEATURES")?;
        if offered & feat::PROTOCOL_FEATURES != 0 {
            let avail = fe
                .get_protocol_features()
                .context("GET_PROTOCOL_FEATURES")?;
            let protocol = avail & VhostUserProtocolFeatures::REPLY_ACK;
            fe.set_protocol_features(protocol)
                .context("SET_PROTOCOL_FEATURES")?;
            if protocol.contains(VhostUserProtocolFeatures::REPLY_ACK) {
                fe.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
            }
        }
        let features = offered & (want | feat::PROTOCOL_FEATURES);
        ensure!(
            features & feat::VERSION_1 != 0,
            "backend at {} does not offer VERSION_1 (offer {offered:#x})",
            path.display()
        );
        fe.set_features(features).context("SET_FEATURES")?;

        // Layout: per queue desc | avail | used, page aligned; then the RX
        // buffers, then the TX buffers.
        let n = queue_size as usize;
        let ring_bytes = |b: usize| b.next_multiple_of(PAGE);
        let per_queue = ring_bytes(16 * n) + ring_bytes(6 + 2 * n) + ring_bytes(6 + 8 * n);
        let rx_buf = 2 * per_queue;
        let tx_buf = rx_buf + n * BUF_SIZE;
        let size = (tx_buf + n * BUF_SIZE).next_multiple_of(2 << 20);
        let mem = Mem::new(size)?;
        fe.set_mem_table(&[VhostUserMemoryRegionInfo {
            guest_phys_addr: GPA_BASE,
            memory_size: size as u64,
            userspace_addr: mem.hva(0),
            mmap_offset: 0,
            mmap_handle: mem.file.as_raw_fd(),
        }])
        .context("SET_MEM_TABLE")?;

        let event_idx = features & feat::EVENT_IDX != 0;
        let mut rings = Vec::new();
        for q in 0..2usize {
            let desc = q * per_queue;
            let avail = desc + ring_bytes(16 * n);
            let used = avail + ring_bytes(6 + 2 * n);
            fe.set_vring_num(q, queue_size).context("SET_VRING_NUM")?;
            fe.set_vring_base(q, 0).context("SET_VRING_BASE")?;
            fe.set_vring_addr(
                q,
                &VringConfigData {
                    queue_max_size: queue_size,
                    queue_size,
                    flags: 0,
                    desc_table_addr: mem.hva(desc),
                    used_ring_addr: mem.hva(used),
                    avail_ring_addr: mem.hva(avail),
                    log_addr: None,
                },
            )
            .context("SET_VRING_ADDR")?;
            let kick = EventFd::new(EFD_NONBLOCK)?;
            let call = EventFd::new(EFD_NONBLOCK)?;
            fe.set_vring_kick(q, &kick).context("SET_VRING_KICK")?;
            fe.set_vring_call(q, &call).context("SET_VRING_CALL")?;
            rings.push(Ring {
                desc: mem.at(desc),
                avail: mem.at(avail),
                used: mem.at(used),
                size: queue_size,
                avail_idx: 0,
                last_used: 0,
                event_idx,
                kick,
                call,
                kicks: 0,
            });
        }
        let tx = rings.pop().unwrap();
        let rx = rings.pop().unwrap();
        let mut g = Guest {
            fe,
            rx,
            tx,
            tx_free: (0..queue_size).rev().collect(),
            tx_buf,
            rx_buf,
            frame_len: 0,
            offered,
            features,
            mem,
        };
        // Every RX slot owns RX buffer `slot`, posted for good.
        let old = g.rx.avail_idx;
        for i in 0..queue_size {
            let a = Mem::gpa(g.rx_buf + i as usize * BUF_SIZE);
            g.rx.write_desc(i, a, BUF_SIZE as u32, DESC_F_WRITE);
            g.rx.push(i);
        }
        g.rx.disarm();
        g.tx.disarm();
        g.rx.publish(old);
        if features & feat::PROTOCOL_FEATURES != 0 {
            for q in 0..2 {
                g.fe.set_vring_enable(q, true).context("SET_VRING_ENABLE")?;
            }
        }
        Ok(g)
    }

    pub fn queue_size(&self) -> usize {
        self.tx.size as usize
    }

    /// Writes `frames` (all of one length) into the TX buffers, slot `i`
    /// getting `frames[i % frames.len()]`. Every TX chain must be back.
    pub fn set_frames(&mut self, frames: &[Vec<u8>]) {
        assert_eq!(
            self.tx_free.len(),
            self.queue_size(),
            "TX chains still in flight"
        );
        let len = frames[0].len();
        assert!(frames.iter().all(|f| f.len() == len) && HDR_LEN + len <= BUF_SIZE);
        for i in 0..self.tx.size {
            let off = self.tx_buf + i as usize * BUF_SIZE;
            let f = &frames[i as usize % frames.len()];
            // SAFETY: off + BUF_SIZE is inside the mapping (layout above).
            unsafe {
                std::ptr::write_bytes(self.mem.at(off), 0, HDR_LEN);
                std::ptr::copy_nonoverlapping(f.as_ptr(), self.mem.at(off + HDR_LEN), len);
            }
            self.tx
                .write_desc(i, Mem::gpa(off), (HDR_LEN + len) as u32, 0);
        }
        self.frame_len = len;
    }

    pub fn tx_free(&self) -> usize {
        self.tx_free.len()
    }

    /// Queues `n` frames (n <= tx_free) with one avail index update.
    pub fn send(&mut self, n: usize) {
        let old = self.tx.avail_idx;
        for _ in 0..n {
            let s = self.tx_free.pop().expect("no free TX slot");
            self.tx.push(s);
        }
        self.tx.publish(old);
    }

    /// Takes back the TX chains the device returned; returns how many.
    pub fn reap_tx(&mut self) -> Result<usize> {
        let n = self.tx.pending();
        ensure!(n <= self.tx.size, "TX used index ran {n} ahead");
        for _ in 0..n {
            let (id, _) = self.tx.pop();
            ensure!(id < self.tx.size as u32, "TX used id {id} out of range");
            self.tx_free.push(id as u16);
        }
        Ok(n as usize)
    }

    /// Receives what arrived: checks each used length against the frame
    /// length given to the sender (`expect`, header included), hands the
    /// frame to `look` if given, re-posts the slots. Returns how many.
    pub fn recv(&mut self, expect: usize, mut look: Option<&mut Look>) -> Result<usize> {
        let n = self.rx.pending();
        if n == 0 {
            return Ok(0);
        }
        ensure!(n <= self.rx.size, "RX used index ran {n} ahead");
        let old = self.rx.avail_idx;
        for _ in 0..n {
            let (id, len) = self.rx.pop();
            ensure!(id < self.rx.size as u32, "RX used id {id} out of range");
            ensure!(
                len as usize == HDR_LEN + expect,
                "RX frame of {len} bytes (header included), expected {}",
                HDR_LEN + expect
            );
            if let Some(f) = look.as_mut() {
                let off = self.rx_buf + id as usize * BUF_SIZE;
                // SAFETY: the buffer is ours again (the device returned it).
                let b = unsafe { std::slice::from_raw_parts(self.mem.at(off), len as usize) };
                f(&b[HDR_LEN..]);
            }
            self.rx.push(id as u16);
        }
        self.rx.publish(old);
        Ok(n as usize)
    }
}

/// What [`Guest::recv`] hands every received frame to.
pub type Look<'a> = dyn FnMut(&[u8]) + 'a;

/// Which queues a sleeping driver waits for, and after how many used entries.
pub struct Wake<'a> {
    pub guest: &'a Guest,
    pub tx_after: Option<u16>,
    pub rx_after: Option<u16>,
}

/// Arms the wanted calls, re-checks, and sleeps in ppoll(2) until one of them
/// is signalled or `timeout` passes (nanosecond resolution: a paced sender
/// sleeps for tens of microseconds). Returns false on timeout.
pub fn sleep(wakes: &[Wake], timeout: Duration) -> bool {
    let mut fds: Vec<libc::pollfd> = Vec::with_capacity(4);
    let mut ready = false;
    for w in wakes {
        let g = w.guest;
        for (ring, after) in [(&g.tx, w.tx_after), (&g.rx, w.rx_after)] {
            if let Some(k) = after {
                ring.arm(k);
                ready |= ring.pending() >= k.max(1);
                fds.push(libc::pollfd {
                    fd: ring.call.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                });
            }
        }
    }
    let woke = ready || {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let ts = libc::timespec {
                tv_sec: left.as_secs().min(i32::MAX as u64) as libc::time_t,
                tv_nsec: libc::c_long::from(left.subsec_nanos() as i32),
            };
            // SAFETY: fds is a valid pollfd array and ts a valid timespec for
            // the duration of the call; no signal mask is given.
            let r = unsafe {
                libc::ppoll(
                    fds.as_mut_ptr(),
                    fds.len() as libc::nfds_t,
                    &ts,
                    std::ptr::null(),
                )
            };
            if r < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            break r > 0;
        }
    };
    for f in &fds {
        drain(f.fd);
    }
    for w in wakes {
        w.guest.tx.disarm();
        w.guest.rx.disarm();
    }
    woke
}

fn drain(fd: RawFd) {
    let mut v = 0u64;
    // SAFETY: reading 8 bytes from a non-blocking eventfd into a u64.
    unsafe { libc::read(fd, &mut v as *mut u64 as *mut libc::c_void, 8) };
}

/// Result of one driven run.
#[derive(Clone, Copy, Debug)]
pub struct Run {
    pub frames: u64,
    pub secs: f64,
    /// Times the driver slept in poll(2), and the longest sleep.
    pub sleeps: u64,
    pub max_sleep: Duration,
    /// Kicks the sender sent (the rest were suppressed by the switch).
    pub kicks: u64,
}

/// Sends bursts of `burst` frames from `a` to `b` for `duration`, keeping
/// at most `window` frames between "sent" and "received" (so that the
/// receiver always has a posted buffer for every frame in flight), then
/// drains. With `rate` (frames/s), a burst goes only when it is due: the
/// offered load is that rate, and the driver sleeps between bursts; without
/// it, bursts go as fast as the switch takes them. Fails if the switch stops
/// returning chains or frames for `stall` (a frame lost, say).
pub fn drive(
    a: &mut Guest,
    b: &mut Guest,
    burst: usize,
    window: usize,
    duration: Duration,
    stall: Duration,
    rate: Option<f64>,
) -> Result<Run> {
    let len = a.frame_len;
    assert!(len > 0, "set_frames first");
    assert!(burst <= window && window <= b.queue_size() && burst <= a.queue_size());
    let start = Instant::now();
    let deadline = start + duration;
    let (mut sent, mut got) = (0u64, 0u64);
    let mut sending = true;
    let (mut sleeps, mut max_sleep) = (0u64, Duration::ZERO);
    let kicks0 = a.tx.kicks;
    loop {
        a.reap_tx()?;
        if sending && Instant::now() >= deadline {
            sending = false;
        }
        let mut progress = false;
        // When the next burst is due (paced runs); None: now.
        let mut next_due: Option<Instant> = None;
        if sending {
            while a.tx_free() >= burst && (sent - got) as usize + burst <= window {
                if let Some(r) = rate {
                    let due = start + Duration::from_secs_f64((sent + burst as u64) as f64 / r);
                    if due > Instant::now() {
                        next_due = Some(due);
                        break;
                    }
                }
                a.send(burst);
                sent += burst as u64;
                progress = true;
            }
        }
        let r = b.recv(len, None)? as u64;
        got += r;
        progress |= r > 0;
        if !sending && got == sent {
            break;
        }
        if progress {
            continue;
        }
        // Nothing to do: wait for frames (a burst's worth, or what is left)
        // and, if sending is held up by TX slots, for returned chains.
        let in_flight = (sent - got) as usize;
        let rx_after = (in_flight > 0).then(|| in_flight.min(burst) as u16);
        let tx_after = (sending && a.tx_free() < burst).then(|| (burst - a.tx_free()) as u16);
        let timeout = match next_due {
            Some(due) => due.saturating_duration_since(Instant::now()).min(stall),
            None if rx_after.is_none() && tx_after.is_none() => continue,
            None => stall,
        };
        let t = Instant::now();
        let woke = sleep(
            &[
                Wake {
                    guest: a,
                    tx_after,
                    rx_after: None,
                },
                Wake {
                    guest: b,
                    tx_after: None,
                    rx_after,
                },
            ],
            timeout,
        );
        sleeps += 1;
        max_sleep = max_sleep.max(t.elapsed());
        // (A paced wait that ran out is the pace, not a stall.)
        if !woke && next_due.is_none() && a.tx.pending() == 0 && b.rx.pending() == 0 {
            bail!(
                "stalled for {stall:?}: sent {sent}, received {got}, {} TX chains out",
                a.queue_size() - a.tx_free()
            );
        }
    }
    // Every TX chain back, so the next run may rewrite the buffers.
    let t = Instant::now();
    while a.tx_free() < a.queue_size() {
        a.reap_tx()?;
        if a.tx_free() < a.queue_size() {
            let need = (a.queue_size() - a.tx_free()) as u16;
            let w = Wake {
                guest: a,
                tx_after: Some(need),
                rx_after: None,
            };
            if !sleep(&[w], stall) && t.elapsed() > stall {
                bail!("{} TX chains never returned", a.queue_size() - a.tx_free());
            }
        }
    }
    Ok(Run {
        frames: got,
        secs: start.elapsed().as_secs_f64(),
        sleeps,
        max_sleep,
        kicks: a.tx.kicks - kicks0,
    })
}

/// Waits until the switch forwards: sends single bursts until one arrives
/// whole (a backend may still be bringing its ports up and drop the first
/// ones), checks every frame of it against `frames`, then lets the pipe go
/// quiet. Returns how many attempts it took.
pub fn prime(a: &mut Guest, b: &mut Guest, frames: &[Vec<u8>], timeout: Duration) -> Result<usize> {
    let len = a.frame_len;
    let burst = frames.len().min(a.tx_free());
    let deadline = Instant::now() + timeout;
    let mut attempt = 0;
    loop {
        attempt += 1;
        a.reap_tx()?;
        let n = burst.min(a.tx_free());
        a.send(n);
        let mut good = 0usize;
        let mut bad = 0usize;
        let t = Instant::now() + Duration::from_millis(500);
        while good + bad < n && Instant::now() < t {
            let mut look = |d: &[u8]| {
                if frames.iter().any(|f| f.as_slice() == d) {
                    good += 1;
                } else {
                    bad += 1;
                }
            };
            if b.recv(len, Some(&mut look))? == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        ensure!(bad == 0, "{bad} frames arrived altered");
        if good == n {
            break;
        }
        if Instant::now() >= deadline {
            bail!(
                "no whole burst went through in {timeout:?} ({attempt} attempts, last {good}/{n})"
            );
        }
    }
    // Quiesce: all TX chains back, nothing more arriving.
    let t = Instant::now() + Duration::from_secs(5);
    while a.tx_free() < a.queue_size() && Instant::now() < t {
        a.reap_tx()?;
        std::thread::sleep(Duration::from_millis(1));
    }
    ensure!(
        a.tx_free() == a.queue_size(),
        "TX chains not returned after priming"
    );
    std::thread::sleep(Duration::from_millis(50));
    b.recv(len, None)?;
    Ok(attempt)
}

//! `TestGuest`: a strict virtio-net guest driver on the shared in-process
//! vhost-user frontend ([`super::frontend`]), playing the part of QEMU and
//! the guest kernel in the integration tests.
//!
//! Every chain gets buffers from a per-guest allocator, so that tests can
//! send any layout (split headers, chains, indirect tables, raw and hostile
//! descriptors) and receive into any chain shape.
//!
//! The driver is strict on purpose: it follows the notification rules
//! (`VRING_USED_F_NO_NOTIFY`, `avail_event`/`used_event` with EVENT_IDX), waits
//! for used buffers only through the call eventfd, and panics with a diagnostic
//! when the device returns an unknown head, a used length larger than the
//! buffer, or publishes used entries without signalling.

use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use vhost::vhost_user::message::{VhostUserConfigFlags, VhostUserProtocolFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::VhostBackend;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::frontend::{
    feat, memfd, region_info, Connection, GuardedMap, SplitRing, Want, DESC_F_INDIRECT,
    DESC_F_NEXT, DESC_F_WRITE, GPA_BASE,
};

pub const HDR_F_NEEDS_CSUM: u8 = 1;
pub const HDR_F_DATA_VALID: u8 = 2;
pub const GSO_NONE: u8 = 0;
pub const GSO_TCPV4: u8 = 1;
pub const GSO_UDP: u8 = 3;
pub const GSO_TCPV6: u8 = 4;
pub const GSO_ECN: u8 = 0x80;

/// `struct virtio_net_hdr_mrg_rxbuf` (12 bytes, little endian, VERSION_1 layout).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetHdr {
    pub flags: u8,
    pub gso_type: u8,
    pub hdr_len: u16,
    pub gso_size: u16,
    pub csum_start: u16,
    pub csum_offset: u16,
    pub num_buffers: u16,
}

impl NetHdr {
    pub const LEN: usize = 12;

    pub fn needs_csum(csum_start: u16, csum_offset: u16) -> NetHdr {
        NetHdr {
            flags: HDR_F_NEEDS_CSUM,
            csum_start,
            csum_offset,
            ..NetHdr::default()
        }
    }

    pub fn to_bytes(self) -> [u8; 12] {
        let mut b = [0u8; 12];
        b[0] = self.flags;
        b[1] = self.gso_type;
        b[2..4].copy_from_slice(&self.hdr_len.to_le_bytes());
        b[4..6].copy_from_slice(&self.gso_size.to_le_bytes());
        b[6..8].copy_from_slice(&self.csum_start.to_le_bytes());
        b[8..10].copy_from_slice(&self.csum_offset.to_le_bytes());
        b[10..12].copy_from_slice(&self.num_buffers.to_le_bytes());
        b
    }

    pub fn from_bytes(b: &[u8]) -> NetHdr {
        let u = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        NetHdr {
            flags: b[0],
            gso_type: b[1],
            hdr_len: u(2),
            gso_size: u(4),
            csum_start: u(6),
            csum_offset: u(8),
            num_buffers: u(10),
        }
    }
}

/// How a TX chain is laid out in descriptors. The byte stream is always the
/// 12-byte header followed by the frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Layout {
    /// One descriptor with header and frame.
    Single,
    /// Header alone in the first descriptor, frame in the second (what Linux
    /// does without ANY_LAYOUT tricks).
    HdrSeparate,
    /// The byte stream split into `n` roughly equal descriptors (the header may
    /// be cut in the middle when pieces are small).
    Chained(usize),
    /// Explicit piece sizes; the last piece takes the rest.
    Pieces(Vec<usize>),
    /// One INDIRECT descriptor pointing at a table of `n` descriptors.
    Indirect(usize),
}

#[derive(Clone, Debug)]
pub struct TxOpts {
    pub hdr: NetHdr,
    pub layout: Layout,
}

impl Default for TxOpts {
    fn default() -> Self {
        TxOpts {
            hdr: NetHdr::default(),
            layout: Layout::Single,
        }
    }
}

impl TxOpts {
    pub fn layout(layout: Layout) -> TxOpts {
        TxOpts {
            layout,
            ..TxOpts::default()
        }
    }
    pub fn hdr(hdr: NetHdr) -> TxOpts {
        TxOpts {
            hdr,
            ..TxOpts::default()
        }
    }
}

/// One received frame.
#[derive(Clone, Debug)]
pub struct RxFrame {
    pub qp: u16,
    pub hdr: NetHdr,
    pub data: Vec<u8>,
    /// How many used entries (buffers) the frame took.
    pub buffers: usize,
    /// Used length of each buffer, as reported by the device.
    pub used_lens: Vec<u32>,
    /// `hash_value`, `hash_report` of a 20-byte header (HASH_REPORT
    /// negotiated), else None.
    pub hash: Option<(u32, u16)>,
}

/// A raw descriptor for malformed-input tests; `next` is an index into the
/// slice given to [`TestGuest::send_raw`].
#[derive(Clone, Copy, Debug)]
pub struct RawDesc {
    pub addr: u64,
    pub len: u32,
    pub flags: u16,
    pub next: Option<usize>,
}

/// Connection parameters of a test guest.
#[derive(Clone, Debug)]
pub struct GuestOpts {
    pub queue_pairs: u16,
    /// Features the driver wants; the negotiated set is `offered & features`.
    pub features: u64,
    pub queue_size: u16,
    pub mem_size: usize,
    /// Also set up the control queue (index 2N; TestDevice form only).
    pub ctrl_queue: bool,
    /// Request REPLY_ACK (makes every set_* synchronous).
    pub reply_ack: bool,
    /// Initial avail/used index of every ring (SET_VRING_BASE plus the used
    /// index in memory), e.g. 65530 to test 16-bit index wrap-around.
    pub initial_idx: u16,
}

impl GuestOpts {
    pub fn new(queue_pairs: u16, features: u64) -> GuestOpts {
        GuestOpts {
            queue_pairs,
            features,
            queue_size: 256,
            mem_size: 32 << 20,
            ctrl_queue: false,
            reply_ack: true,
            initial_idx: 0,
        }
    }
}

#[derive(Default)]
struct Inflight {
    descs: Vec<u16>,
    /// (gpa, len) of the buffers in chain order (writable ones for RX).
    bufs: Vec<(u64, u32)>,
    /// Allocations to give back when the chain is used.
    allocs: Vec<(u64, u64)>,
    capacity: u64,
}

struct Partial {
    hdr: NetHdr,
    hash: Option<(u32, u16)>,
    data: Vec<u8>,
    remaining: u16,
    buffers: usize,
    used_lens: Vec<u32>,
}

/// A queue: the ring and what the driver keeps about it.
struct Vq {
    ring: SplitRing,
    /// Descriptor slots not in any chain.
    free: Vec<u16>,
    /// The chains the device holds, by head.
    inflight: HashMap<u16, Inflight>,
    /// A frame whose merged buffers are not all used yet (RX).
    partial: Option<Partial>,
    /// Calls the driver has read from the call eventfd.
    calls: u64,
}

/// A guest driving one vhost-user virtio-net port.
pub struct TestGuest {
    /// `conn.ram` through vm-memory, for the buffers (rings are written
    /// through [`SplitRing`]).
    mem: GuestMemoryMmap,
    queues: Vec<Vq>,
    /// Further mappings of guest memory made by
    /// [`replace_mem_table`](Self::replace_mem_table), unmapped on drop.
    maps: Vec<GuardedMap>,
    pub offered: u64,
    pub features: u64,
    pub protocol: VhostUserProtocolFeatures,
    pub queue_num: Option<u64>,
    pub queue_pairs: u16,
    // Declared last: the mapping of guest memory outlives the views above.
    conn: Connection,
}

impl TestGuest {
    /// Connects with 256-entry queues and 32 MiB of guest memory.
    pub fn connect(path: &Path, queue_pairs: u16, features: u64) -> anyhow::Result<TestGuest> {
        Self::connect_with(path, GuestOpts::new(queue_pairs, features))
    }

    /// Connects, negotiates, maps memory and starts every queue, in QEMU's order.
    pub fn connect_with(path: &Path, opts: GuestOpts) -> anyhow::Result<TestGuest> {
        let nq = 2 * opts.queue_pairs as usize + usize::from(opts.ctrl_queue);
        let mut protocol = VhostUserProtocolFeatures::MQ | VhostUserProtocolFeatures::CONFIG;
        if opts.reply_ack {
            protocol |= VhostUserProtocolFeatures::REPLY_ACK;
        }
        let mut conn = Connection::open(
            path,
            &Want {
                queues: nq,
                features: opts.features,
                protocol,
                mem_size: opts.mem_size,
            },
        )?;
        let mem = conn.ram.map.guest_memory(GuestAddress(GPA_BASE))?;
        let mut queues = Vec::with_capacity(nq);
        for i in 0..nq {
            let ring = conn.start_ring(i, opts.queue_size, opts.initial_idx)?;
            queues.push(Vq {
                free: (0..ring.size).rev().collect(),
                ring,
                inflight: HashMap::new(),
                partial: None,
                calls: 0,
            });
        }
        conn.enable(nq)?;
        Ok(TestGuest {
            mem,
            queues,
            maps: Vec::new(),
            offered: conn.offered,
            features: conn.features,
            protocol: conn.protocol,
            queue_num: conn.queue_num,
            queue_pairs: opts.queue_pairs,
            conn,
        })
    }

    // ---- accessors ---------------------------------------------------------

    /// The virtio-net header length: 20 with HASH_REPORT, else 12.
    pub fn hdr_len(&self) -> usize {
        if self.features & feat::HASH_REPORT != 0 {
            20
        } else {
            NetHdr::LEN
        }
    }

    pub fn has(&self, f: u64) -> bool {
        self.features & f == f
    }
    pub fn frontend(&mut self) -> &mut Frontend {
        &mut self.conn.fe
    }
    /// Our host address range of guest memory (between guard pages).
    pub fn host_range(&self) -> (u64, u64) {
        let m = &self.conn.ram.map;
        (m.base as u64, (m.base + m.size) as u64)
    }
    pub fn mem_end(&self) -> u64 {
        self.conn.ram.end()
    }
    pub fn rx_index(qp: u16) -> usize {
        2 * qp as usize
    }
    pub fn tx_index(qp: u16) -> usize {
        2 * qp as usize + 1
    }
    /// (kicks sent, kicks suppressed by the device, calls received) of a queue.
    /// Counts a call the device signalled while the guest was not waiting
    /// (a guest that always found its frames already there never reads its
    /// call eventfd); returns the updated count of calls.
    pub fn collect_calls(&mut self, queue: usize) -> u64 {
        let q = &mut self.queues[queue];
        if q.ring.call.read().is_ok() {
            q.calls += 1;
        }
        q.calls
    }
    pub fn notify_counts(&self, queue: usize) -> (u64, u64, u64) {
        let q = &self.queues[queue];
        (q.ring.kicks, q.ring.suppressed_kicks, q.calls)
    }
    /// RX buffers posted on `qp` and not yet returned.
    pub fn rx_posted(&self, qp: u16) -> usize {
        self.queues[Self::rx_index(qp)].inflight.len()
    }
    /// TX chains of `qp` not yet returned by the device.
    pub fn tx_outstanding(&self, qp: u16) -> usize {
        self.queues[Self::tx_index(qp)].inflight.len()
    }

    /// Collects the TX chains the device has returned so far (no waiting);
    /// returns how many.
    pub fn reap_tx(&mut self, qp: u16) -> usize {
        self.reap(Self::tx_index(qp))
    }

    /// Reads `len` bytes of device config space (CONFIG protocol feature).
    pub fn read_config(&mut self, offset: u32, len: u32) -> anyhow::Result<Vec<u8>> {
        let buf = vec![0u8; len as usize];
        let (_, data) =
            self.conn
                .fe
                .get_config(offset, len, VhostUserConfigFlags::empty(), &buf)?;
        Ok(data)
    }

    /// Sends GET_VRING_BASE for every queue (what QEMU does when the guest
    /// stops) and returns the backend's next avail index for each.
    pub fn stop(&mut self) -> anyhow::Result<Vec<u32>> {
        let mut v = Vec::new();
        for i in 0..self.queues.len() {
            v.push(
                self.conn
                    .fe
                    .get_vring_base(i)
                    .with_context(|| format!("GET_VRING_BASE {i}"))?,
            );
        }
        Ok(v)
    }

    /// Our avail index of a queue (what GET_VRING_BASE should report once the
    /// device consumed everything).
    pub fn avail_idx(&self, queue: usize) -> u16 {
        self.queues[queue].ring.avail_idx
    }

    /// How many used entries of a queue the driver consumed so far (mod 2^16).
    pub fn used_seen(&self, queue: usize) -> u16 {
        self.queues[queue].ring.last_used
    }

    // ---- ring mechanics ----------------------------------------------------

    fn write_desc(&self, q: usize, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        self.queues[q].ring.write_desc(i, addr, len, flags, next);
    }

    fn write_table_desc(&self, table: u64, i: usize, addr: u64, len: u32, flags: u16, next: u16) {
        let mut d = [0u8; 16];
        d[0..8].copy_from_slice(&addr.to_le_bytes());
        d[8..12].copy_from_slice(&len.to_le_bytes());
        d[12..14].copy_from_slice(&flags.to_le_bytes());
        d[14..16].copy_from_slice(&next.to_le_bytes());
        self.mem
            .write_slice(&d, GuestAddress(table + 16 * i as u64))
            .unwrap();
    }

    fn take_descs(&mut self, q: usize, n: usize, timeout: Duration) -> Vec<u16> {
        if self.queues[q].free.len() < n {
            // Reclaim completed chains (only meaningful on TX queues).
            let deadline = Instant::now() + timeout;
            while self.queues[q].free.len() < n {
                self.reap(q);
                if self.queues[q].free.len() >= n {
                    break;
                }
                assert!(
                    self.wait_queues(&[q], deadline),
                    "queue {q}: no free descriptors and the device returns none ({} in flight)",
                    self.queues[q].inflight.len()
                );
            }
        }
        let vq = &mut self.queues[q];
        (0..n).map(|_| vq.free.pop().unwrap()).collect()
    }

    /// Publishes heads in the avail ring and kicks if the device wants it.
    fn publish(&mut self, q: usize, heads: &[u16]) {
        let ring = &mut self.queues[q].ring;
        let old = ring.avail_idx;
        for &h in heads {
            ring.push(h);
        }
        ring.publish(old);
    }

    fn has_used(&self, q: usize) -> bool {
        self.queues[q].ring.pending() != 0
    }

    /// Pops one used element and returns the chain's bookkeeping.
    fn pop_used(&mut self, q: usize) -> Option<(u32, Inflight)> {
        let vq = &mut self.queues[q];
        let ring = &mut vq.ring;
        let outstanding = ring.pending();
        if outstanding == 0 {
            return None;
        }
        assert!(
            outstanding <= ring.size,
            "queue {}: device moved used idx from {} to {} (more than the ring size {})",
            ring.index,
            ring.last_used,
            ring.used_idx(),
            ring.size
        );
        let (id, len) = ring.pop();
        assert!(
            id < ring.size as u32,
            "queue {}: device returned head {id} >= ring size {}",
            ring.index,
            ring.size
        );
        let Some(infl) = vq.inflight.remove(&(id as u16)) else {
            panic!(
                "queue {}: device returned head {id}, which is not in flight (double completion?)",
                ring.index
            );
        };
        vq.free.extend(infl.descs.iter().copied());
        for &(a, s) in &infl.allocs {
            self.conn.ram.free(a, s);
        }
        Some((len, infl))
    }

    /// Before sleeping: ask for an interrupt on the next used entry.
    fn arm(&self, q: usize) {
        self.queues[q].ring.arm(1);
    }

    /// Waits until one of `qs` has used entries; only the call eventfds wake us.
    /// Returns false at the deadline. Panics if used entries appeared without a
    /// call (a notification bug in the device).
    fn wait_queues(&mut self, qs: &[usize], deadline: Instant) -> bool {
        loop {
            for &q in qs {
                self.arm(q);
            }
            if qs.iter().any(|&q| self.has_used(q)) {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            let ms = (deadline - now).as_millis().clamp(1, i32::MAX as u128) as i32;
            let r = self.poll_calls(qs, ms);
            if r < 0 {
                continue;
            }
            if r == 0 {
                // Deadline passed without a call. A device may publish used
                // entries a moment before it signals (it finishes its batch
                // first), so give a late call a grace period before calling
                // it a notification bug.
                let late: Vec<usize> = qs.iter().copied().filter(|&q| self.has_used(q)).collect();
                if !late.is_empty() && self.poll_calls(&late, 2000) > 0 {
                    return true;
                }
                assert!(
                    late.is_empty(),
                    "queues {late:?}: device published used entries but never signalled the \
                     call eventfd (used_event/NO_INTERRUPT handling?)"
                );
                return false;
            }
        }
    }

    /// Polls the call eventfds of `qs` for up to `ms` and counts the calls
    /// that came; returns poll(2)'s result (< 0: interrupted).
    fn poll_calls(&mut self, qs: &[usize], ms: i32) -> i32 {
        let mut fds: Vec<libc::pollfd> = qs
            .iter()
            .map(|&q| libc::pollfd {
                fd: self.queues[q].ring.call.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: fds is a valid array of pollfd for the duration of the call.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            assert_eq!(e.kind(), std::io::ErrorKind::Interrupted, "poll: {e}");
        }
        for (f, &q) in fds.iter().zip(qs) {
            if f.revents & libc::POLLIN != 0 && self.queues[q].ring.call.read().is_ok() {
                self.queues[q].calls += 1;
            }
        }
        r
    }

    /// Returns completed chains of any queue to the free lists (TX).
    fn reap(&mut self, q: usize) -> usize {
        let mut n = 0;
        while self.pop_used(q).is_some() {
            n += 1;
        }
        n
    }

    // ---- TX ----------------------------------------------------------------

    fn pieces(total: usize, layout: &Layout, hl: usize) -> Vec<usize> {
        let split = |n: usize| {
            let n = n.clamp(1, total.max(1));
            let base = total / n;
            let mut v = vec![base; n];
            *v.last_mut().unwrap() += total - base * n;
            v
        };
        match layout {
            Layout::Single => vec![total],
            Layout::HdrSeparate => vec![hl, total - hl],
            Layout::Chained(n) | Layout::Indirect(n) => split(*n),
            Layout::Pieces(p) => {
                let mut v = Vec::new();
                let mut left = total;
                for &s in p {
                    if left == 0 {
                        break;
                    }
                    let s = s.min(left);
                    v.push(s);
                    left -= s;
                }
                if left > 0 {
                    if v.len() == p.len() && !v.is_empty() {
                        *v.last_mut().unwrap() += left;
                    } else {
                        v.push(left);
                    }
                }
                v
            }
        }
    }

    /// Queues one frame for transmission on `qp` (header from `opts.hdr`).
    pub fn send(&mut self, qp: u16, frame: &[u8], opts: &TxOpts) {
        let head = self.prepare_tx(qp, frame, opts);
        self.publish(Self::tx_index(qp), &[head]);
    }

    /// Queues several frames and publishes them with one avail index update.
    pub fn send_burst(&mut self, qp: u16, frames: &[Vec<u8>], opts: &TxOpts) {
        let heads: Vec<u16> = frames
            .iter()
            .map(|f| self.prepare_tx(qp, f, opts))
            .collect();
        self.publish(Self::tx_index(qp), &heads);
    }

    fn prepare_tx(&mut self, qp: u16, frame: &[u8], opts: &TxOpts) -> u16 {
        let q = Self::tx_index(qp);
        self.reap(q);
        let mut bytes = opts.hdr.to_bytes().to_vec();
        // struct virtio_net_hdr_v1_hash: hash fields are zero on TX.
        bytes.resize(self.hdr_len(), 0);
        bytes.extend_from_slice(frame);
        let pieces = Self::pieces(bytes.len(), &opts.layout, self.hdr_len());
        let mut infl = Inflight::default();
        let mut bufs = Vec::new();
        let mut off = 0;
        for &p in &pieces {
            let a = self.conn.ram.alloc(p as u64, 64);
            self.mem
                .write_slice(&bytes[off..off + p], GuestAddress(a))
                .unwrap();
            infl.allocs.push((a, p as u64));
            bufs.push((a, p as u32));
            off += p;
        }
        infl.capacity = bytes.len() as u64;
        let timeout = Duration::from_secs(5);
        if let Layout::Indirect(_) = opts.layout {
            let n = bufs.len();
            let table = self.conn.ram.alloc(16 * n as u64, 64);
            infl.allocs.push((table, 16 * n as u64));
            for (i, &(a, l)) in bufs.iter().enumerate() {
                let (flags, next) = if i + 1 < n {
                    (DESC_F_NEXT, i as u16 + 1)
                } else {
                    (0, 0)
                };
                self.write_table_desc(table, i, a, l, flags, next);
            }
            let d = self.take_descs(q, 1, timeout);
            self.write_desc(q, d[0], table, 16 * n as u32, DESC_F_INDIRECT, 0);
            infl.descs = d;
        } else {
            let d = self.take_descs(q, bufs.len(), timeout);
            for (i, &(a, l)) in bufs.iter().enumerate() {
                let (flags, next) = if i + 1 < d.len() {
                    (DESC_F_NEXT, d[i + 1])
                } else {
                    (0, 0)
                };
                self.write_desc(q, d[i], a, l, flags, next);
            }
            infl.descs = d;
        }
        infl.bufs = bufs;
        let head = infl.descs[0];
        self.queues[q].inflight.insert(head, infl);
        head
    }

    /// Waits until the device returned every TX chain of `qp`. Returns false on timeout.
    pub fn wait_tx(&mut self, qp: u16, timeout: Duration) -> bool {
        let q = Self::tx_index(qp);
        let deadline = Instant::now() + timeout;
        loop {
            self.reap(q);
            if self.queues[q].inflight.is_empty() {
                return true;
            }
            if !self.wait_queues(&[q], deadline) {
                self.reap(q);
                return self.queues[q].inflight.is_empty();
            }
        }
    }

    /// Allocates guest memory holding `bytes`, for raw descriptors. Leaked.
    pub fn raw_buffer(&mut self, bytes: &[u8]) -> u64 {
        let a = self.conn.ram.alloc(bytes.len() as u64, 64);
        self.mem.write_slice(bytes, GuestAddress(a)).unwrap();
        a
    }

    /// Writes a raw indirect table into guest memory; returns its address and
    /// byte length. `next` fields are used as given.
    pub fn raw_table(&mut self, descs: &[RawDesc]) -> (u64, u32) {
        let len = 16 * descs.len() as u64;
        let table = self.conn.ram.alloc(len, 64);
        for (i, d) in descs.iter().enumerate() {
            self.write_table_desc(table, i, d.addr, d.len, d.flags, d.next.unwrap_or(0) as u16);
        }
        (table, len as u32)
    }

    /// Publishes an arbitrary chain on queue `queue` starting at `descs[0]`;
    /// `next` indices refer to positions in `descs` and are remapped to the
    /// descriptor slots used. Returns the head.
    pub fn send_raw_on(&mut self, queue: usize, descs: &[RawDesc]) -> u16 {
        self.reap(queue);
        let slots = self.take_descs(queue, descs.len(), Duration::from_secs(5));
        for (i, d) in descs.iter().enumerate() {
            let next = d.next.map(|n| slots[n]).unwrap_or(0);
            self.write_desc(queue, slots[i], d.addr, d.len, d.flags, next);
        }
        let head = slots[0];
        self.queues[queue].inflight.insert(
            head,
            Inflight {
                descs: slots,
                ..Inflight::default()
            },
        );
        self.publish(queue, &[head]);
        head
    }

    pub fn send_raw(&mut self, qp: u16, descs: &[RawDesc]) -> u16 {
        self.send_raw_on(Self::tx_index(qp), descs)
    }

    fn hdr_desc(&mut self) -> RawDesc {
        let a = self.raw_buffer(&NetHdr::default().to_bytes());
        RawDesc {
            addr: a,
            len: NetHdr::LEN as u32,
            flags: DESC_F_NEXT,
            next: Some(1),
        }
    }

    /// Header descriptor, then a data descriptor whose address lies beyond guest memory.
    pub fn send_bad_addr(&mut self, qp: u16) -> u16 {
        let h = self.hdr_desc();
        let far = self.mem_end() + (256 << 20);
        self.send_raw(
            qp,
            &[
                h,
                RawDesc {
                    addr: far,
                    len: 100,
                    flags: 0,
                    next: None,
                },
            ],
        )
    }

    /// Data descriptor that starts inside guest memory and runs past its end.
    pub fn send_straddling(&mut self, qp: u16) -> u16 {
        let h = self.hdr_desc();
        let a = self.mem_end() - 64;
        self.send_raw(
            qp,
            &[
                h,
                RawDesc {
                    addr: a,
                    len: 4096,
                    flags: 0,
                    next: None,
                },
            ],
        )
    }

    /// Two descriptors pointing at each other.
    pub fn send_loop(&mut self, qp: u16, frame: &[u8]) -> u16 {
        let mut h = self.hdr_desc();
        let a = self.raw_buffer(frame);
        h.next = Some(1);
        self.send_raw(
            qp,
            &[
                h,
                RawDesc {
                    addr: a,
                    len: frame.len() as u32,
                    flags: DESC_F_NEXT,
                    next: Some(0),
                },
            ],
        )
    }

    /// A single descriptor of length 0xffff_ffff.
    pub fn send_huge_len(&mut self, qp: u16) -> u16 {
        let a = self.raw_buffer(&NetHdr::default().to_bytes());
        self.send_raw(
            qp,
            &[RawDesc {
                addr: a,
                len: u32::MAX,
                flags: 0,
                next: None,
            }],
        )
    }

    /// A chain shorter than the 12-byte header.
    pub fn send_short_hdr(&mut self, qp: u16) -> u16 {
        let a = self.raw_buffer(&[0u8; 6]);
        self.send_raw(
            qp,
            &[RawDesc {
                addr: a,
                len: 6,
                flags: 0,
                next: None,
            }],
        )
    }

    /// A device-writable descriptor on the TX queue.
    pub fn send_write_only(&mut self, qp: u16, frame: &[u8]) -> u16 {
        let mut bytes = NetHdr::default().to_bytes().to_vec();
        bytes.extend_from_slice(frame);
        let a = self.raw_buffer(&bytes);
        self.send_raw(
            qp,
            &[RawDesc {
                addr: a,
                len: bytes.len() as u32,
                flags: DESC_F_WRITE,
                next: None,
            }],
        )
    }

    /// An indirect table whose entry is itself INDIRECT (forbidden by the spec).
    pub fn send_nested_indirect(&mut self, qp: u16, frame: &[u8]) -> u16 {
        let mut bytes = NetHdr::default().to_bytes().to_vec();
        bytes.extend_from_slice(frame);
        let a = self.raw_buffer(&bytes);
        let (inner, inner_len) = self.raw_table(&[RawDesc {
            addr: a,
            len: bytes.len() as u32,
            flags: 0,
            next: None,
        }]);
        let (outer, outer_len) = self.raw_table(&[RawDesc {
            addr: inner,
            len: inner_len,
            flags: DESC_F_INDIRECT,
            next: None,
        }]);
        self.send_raw(
            qp,
            &[RawDesc {
                addr: outer,
                len: outer_len,
                flags: DESC_F_INDIRECT,
                next: None,
            }],
        )
    }

    /// An indirect table whose entries loop.
    pub fn send_indirect_loop(&mut self, qp: u16, frame: &[u8]) -> u16 {
        let h = self.raw_buffer(&NetHdr::default().to_bytes());
        let a = self.raw_buffer(frame);
        let (t, tl) = self.raw_table(&[
            RawDesc {
                addr: h,
                len: NetHdr::LEN as u32,
                flags: DESC_F_NEXT,
                next: Some(1),
            },
            RawDesc {
                addr: a,
                len: frame.len() as u32,
                flags: DESC_F_NEXT,
                next: Some(0),
            },
        ]);
        self.send_raw(
            qp,
            &[RawDesc {
                addr: t,
                len: tl,
                flags: DESC_F_INDIRECT,
                next: None,
            }],
        )
    }

    // ---- hostile driver ------------------------------------------------------

    /// Writes raw descriptors `(slot, addr, len, flags, next)` into the table
    /// of `queue` and publishes `heads` (any values, even >= the ring size)
    /// without the driver's bookkeeping: after this the queue belongs to the
    /// attacker, use [`chaos_used`](Self::chaos_used) to read it.
    pub fn chaos_publish(
        &mut self,
        queue: usize,
        descs: &[(u16, u64, u32, u16, u16)],
        heads: &[u16],
    ) {
        for &(slot, addr, len, flags, next) in descs {
            // (write_desc takes the slot modulo the ring size.)
            self.write_desc(queue, slot, addr, len, flags, next);
        }
        self.queues[queue].inflight.clear();
        self.publish(queue, heads);
    }

    /// Used entries `(id, len)` the device published since the last call,
    /// without checking them against chains in flight.
    pub fn chaos_used(&mut self, queue: usize) -> Vec<(u32, u32)> {
        let ring = &mut self.queues[queue].ring;
        let out = (0..ring.pending()).map(|_| ring.pop()).collect();
        let _ = ring.call.read();
        out
    }

    /// Waits up to `timeout` for the device to signal `queue` (its call
    /// eventfd); returns whether it did.
    pub fn chaos_wait(&mut self, queue: usize, timeout: Duration) -> bool {
        let mut fd = libc::pollfd {
            fd: self.queues[queue].ring.call.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().clamp(0, i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd for the duration of the call.
        let r = unsafe { libc::poll(&mut fd, 1, ms) };
        r > 0
    }

    /// The ring size of `queue`.
    pub fn queue_size(&self, queue: usize) -> u16 {
        self.queues[queue].ring.size
    }

    /// Sends SET_MEM_TABLE again with guest memory mapped at a new host
    /// address (same memfd, so same contents), plus an extra 1 MiB region
    /// beyond guest memory when `extra`, and without guest memory itself
    /// when `!main` (the rings then lie outside the table).
    pub fn replace_mem_table(&mut self, main: bool, extra: bool) -> anyhow::Result<()> {
        let mut regions = Vec::new();
        if main {
            let ram = &self.conn.ram;
            let m = GuardedMap::new(&ram.file, ram.map.size)?;
            regions.push(region_info(
                GPA_BASE,
                ram.map.size,
                m.base as u64,
                &ram.file,
            ));
            self.maps.push(m);
        }
        let extra_file;
        if extra {
            let size = 1 << 20;
            extra_file = memfd(size)?;
            let m = GuardedMap::new(&extra_file, size)?;
            regions.push(region_info(
                self.mem_end() + (16 << 20),
                size,
                m.base as u64,
                &extra_file,
            ));
            self.maps.push(m);
        }
        self.conn
            .fe
            .set_mem_table(&regions)
            .context("SET_MEM_TABLE")?;
        Ok(())
    }

    // ---- control queue (TestDevice form) -----------------------------------

    /// Sends a control command (`class`, `cmd`, `data`) on the control queue
    /// (index 2N) and returns the device's ack byte (0 = VIRTIO_NET_OK), or
    /// None if the device did not answer within `timeout`.
    pub fn ctrl(&mut self, class: u8, cmd: u8, data: &[u8], timeout: Duration) -> Option<u8> {
        let q = 2 * self.queue_pairs as usize;
        assert!(
            q < self.queues.len(),
            "guest connected without the control queue"
        );
        let mut bytes = vec![class, cmd];
        bytes.extend_from_slice(data);
        let a = self.raw_buffer(&bytes);
        let ack = self.raw_buffer(&[0xee]);
        self.send_raw_on(
            q,
            &[
                RawDesc {
                    addr: a,
                    len: bytes.len() as u32,
                    flags: DESC_F_NEXT,
                    next: Some(1),
                },
                RawDesc {
                    addr: ack,
                    len: 1,
                    flags: DESC_F_WRITE,
                    next: None,
                },
            ],
        );
        let deadline = Instant::now() + timeout;
        loop {
            if let Some((len, _)) = self.pop_used(q) {
                assert_eq!(len, 1, "control queue: used len {len} for a 1-byte ack");
                let mut b = [0u8];
                self.mem.read_slice(&mut b, GuestAddress(ack)).unwrap();
                return Some(b[0]);
            }
            if !self.wait_queues(&[q], deadline) {
                return None;
            }
        }
    }

    // ---- RX ----------------------------------------------------------------

    /// Posts `count` single-descriptor receive buffers of `buf_size` bytes.
    pub fn post_rx(&mut self, qp: u16, count: usize, buf_size: u32) {
        self.post_rx_chains(qp, count, &[buf_size], false);
    }

    /// Posts `count` receive chains made of descriptors of the given sizes,
    /// optionally through an indirect table.
    pub fn post_rx_chains(&mut self, qp: u16, count: usize, sizes: &[u32], indirect: bool) {
        let q = Self::rx_index(qp);
        let mut heads = Vec::with_capacity(count);
        for _ in 0..count {
            let mut infl = Inflight::default();
            for &s in sizes {
                let a = self.conn.ram.alloc(s as u64, 64);
                // Poison, so that bytes the device did not write are visible.
                self.mem
                    .write_slice(&vec![0xa5u8; s as usize], GuestAddress(a))
                    .unwrap();
                infl.allocs.push((a, s as u64));
                infl.bufs.push((a, s));
                infl.capacity += s as u64;
            }
            let n = sizes.len();
            if indirect {
                let table = self.conn.ram.alloc(16 * n as u64, 64);
                infl.allocs.push((table, 16 * n as u64));
                for (i, &(a, l)) in infl.bufs.iter().enumerate() {
                    let (flags, next) = if i + 1 < n {
                        (DESC_F_WRITE | DESC_F_NEXT, i as u16 + 1)
                    } else {
                        (DESC_F_WRITE, 0)
                    };
                    self.write_table_desc(table, i, a, l, flags, next);
                }
                let d = self.take_descs(q, 1, Duration::ZERO);
                self.write_desc(q, d[0], table, 16 * n as u32, DESC_F_INDIRECT, 0);
                infl.descs = d;
            } else {
                let d = self.take_descs(q, n, Duration::ZERO);
                for (i, &(a, l)) in infl.bufs.iter().enumerate() {
                    let (flags, next) = if i + 1 < n {
                        (DESC_F_WRITE | DESC_F_NEXT, d[i + 1])
                    } else {
                        (DESC_F_WRITE, 0)
                    };
                    self.write_desc(q, d[i], a, l, flags, next);
                }
                infl.descs = d;
            }
            let head = infl.descs[0];
            self.queues[q].inflight.insert(head, infl);
            heads.push(head);
        }
        self.publish(q, &heads);
    }

    fn read_chain(&self, q: usize, infl: &Inflight, len: u32) -> Vec<u8> {
        assert!(
            len as u64 <= infl.capacity,
            "queue {q}: device reported used len {len} for a chain of {} bytes",
            infl.capacity
        );
        let mut out = Vec::with_capacity(len as usize);
        let mut left = len as usize;
        for &(a, l) in &infl.bufs {
            if left == 0 {
                break;
            }
            let n = left.min(l as usize);
            let mut b = vec![0u8; n];
            self.mem.read_slice(&mut b, GuestAddress(a)).unwrap();
            out.extend_from_slice(&b);
            left -= n;
        }
        out
    }

    /// Pops one complete frame if the used ring holds one (merging buffers).
    fn try_frame(&mut self, qp: u16) -> Option<RxFrame> {
        let q = Self::rx_index(qp);
        let mrg = self.features & feat::MRG_RXBUF != 0;
        if self.queues[q].partial.is_none() {
            let (len, infl) = self.pop_used(q)?;
            let bytes = self.read_chain(q, &infl, len);
            let hl = self.hdr_len();
            assert!(
                bytes.len() >= hl,
                "rx queue {q}: used len {len} is shorter than the {hl}-byte virtio-net header"
            );
            let hdr = NetHdr::from_bytes(&bytes[..NetHdr::LEN]);
            let hash = (hl > NetHdr::LEN).then(|| {
                let b = &bytes[NetHdr::LEN..hl];
                (
                    u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
                    u16::from_le_bytes([b[4], b[5]]),
                )
            });
            let n = if mrg { hdr.num_buffers } else { 1 };
            assert!(
                n >= 1,
                "rx queue {q}: num_buffers = 0 with MRG_RXBUF negotiated"
            );
            self.queues[q].partial = Some(Partial {
                hdr,
                hash,
                data: bytes[hl..].to_vec(),
                remaining: n - 1,
                buffers: 1,
                used_lens: vec![len],
            });
        }
        while self.queues[q].partial.as_ref().unwrap().remaining > 0 {
            let (len, infl) = self.pop_used(q)?;
            let bytes = self.read_chain(q, &infl, len);
            let p = self.queues[q].partial.as_mut().unwrap();
            p.data.extend_from_slice(&bytes);
            p.remaining -= 1;
            p.buffers += 1;
            p.used_lens.push(len);
        }
        let p = self.queues[q].partial.take().unwrap();
        Some(RxFrame {
            qp,
            hash: p.hash,
            hdr: p.hdr,
            data: p.data,
            buffers: p.buffers,
            used_lens: p.used_lens,
        })
    }

    /// Receives up to `max` frames from any of `qps`, waiting at most `timeout`
    /// for them; returns what arrived.
    pub fn recv_from(&mut self, qps: &[u16], max: usize, timeout: Duration) -> Vec<RxFrame> {
        let deadline = Instant::now() + timeout;
        let qs: Vec<usize> = qps.iter().map(|&qp| Self::rx_index(qp)).collect();
        let mut out = Vec::new();
        loop {
            let mut progress = true;
            while progress && out.len() < max {
                progress = false;
                for &qp in qps {
                    if out.len() < max {
                        if let Some(f) = self.try_frame(qp) {
                            out.push(f);
                            progress = true;
                        }
                    }
                }
            }
            if out.len() >= max || !self.wait_queues(&qs, deadline) {
                return out;
            }
        }
    }

    /// Receives exactly up to `n` frames on `qp` (fewer on timeout).
    pub fn recv_n(&mut self, qp: u16, n: usize, timeout: Duration) -> Vec<RxFrame> {
        self.recv_from(&[qp], n, timeout)
    }

    /// Receives one frame on `qp`.
    pub fn recv(&mut self, qp: u16, timeout: Duration) -> Option<RxFrame> {
        self.recv_n(qp, 1, timeout).pop()
    }

    /// Receives one frame on any queue pair.
    pub fn recv_any(&mut self, timeout: Duration) -> Option<RxFrame> {
        let qps: Vec<u16> = (0..self.queue_pairs).collect();
        self.recv_from(&qps, 1, timeout).pop()
    }

    /// Waits `wait` and returns every frame that shows up on any queue pair
    /// (for "must not arrive" checks).
    pub fn drain_all(&mut self, wait: Duration) -> Vec<RxFrame> {
        let qps: Vec<u16> = (0..self.queue_pairs).collect();
        self.recv_from(&qps, usize::MAX, wait)
    }

    /// Returns an error describing unexpected state, for use at the end of tests.
    pub fn check_idle(&mut self) -> anyhow::Result<()> {
        for qp in 0..self.queue_pairs {
            let q = Self::tx_index(qp);
            self.reap(q);
            if !self.queues[q].inflight.is_empty() {
                bail!(
                    "tx queue {q}: {} chains never returned",
                    self.queues[q].inflight.len()
                );
            }
        }
        Ok(())
    }
}

//! Descriptor-chain walking of the data path, over a plain
//! [`GuestMemoryMmap`] and a [`virtio_queue::Queue`]: reading TX chains into
//! frames, writing frames into RX chains, reading control commands.
//!
//! This is everything the daemon does with guest-posted descriptors; it needs
//! no vhost-user connection, so the fuzz target `virtio_chains` and the port
//! worker (`backend`) run the same code. All guest memory access goes
//! through vm-memory's checked `read_slice`/`write_slice`, which refuse any
//! range not wholly inside one registered region.

use crate::frame::Frame;
use crate::offload;
use crate::stats::{LogLimiter, QueueCounters};
use crate::virtio_net::*;
use std::ops::Deref;
use thiserror::Error;
use virtio_bindings::bindings::virtio_net::*;
use virtio_queue::desc::split::Descriptor;
use virtio_queue::{DescriptorChain, Queue, QueueOwnedT};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryMmap};

/// Longest control command the device reads.
pub const MAX_CTRL_LEN: usize = 4096;

/// What is wrong with a descriptor chain a guest posted.
#[derive(Debug, Error)]
pub enum ChainError {
    #[error("descriptor chain is empty or its indirect table is invalid")]
    Empty,
    #[error("available ring names head {head}, outside the {size}-entry ring")]
    BadHead { head: u16, size: u16 },
    #[error(
        "descriptor chain is cut short (loop, next index out of range, or unreadable descriptor)"
    )]
    Broken,
    #[error("device-writable descriptor in a TX chain")]
    WritableInTx,
    #[error("buffer of {addr:#x}+{len} is outside guest memory")]
    OutOfMemory { addr: u64, len: u32 },
    #[error("TX chain of {0}+ bytes exceeds the largest frame")]
    TooLong(usize),
    #[error("TX chain of {0} bytes is shorter than header plus Ethernet header")]
    TooShort(usize),
    #[error("offload request refused: {0}")]
    Offload(#[from] offload::OffloadError),
    #[error("offload used without negotiating it: {0}")]
    NotNegotiated(&'static str),
    #[error("control message: {0}")]
    Ctrl(&'static str),
}

/// Where a chain-walking pass reports refusals: the queue's counters and the
/// port's rate-limited log.
#[derive(Clone, Copy)]
pub struct ChainLog<'a> {
    pub counters: &'a QueueCounters,
    pub log: &'a LogLimiter,
    pub port: &'a str,
    pub qp: usize,
}

/// Reads a TX chain into a frame, for a connection that acked `acked`.
pub fn read_tx_chain<M>(
    mem: &GuestMemoryMmap,
    chain: DescriptorChain<M>,
    acked: u64,
) -> Result<Frame, ChainError>
where
    M: Deref<Target = GuestMemoryMmap>,
{
    let has = |f: u32| acked & bit(f) != 0;
    let hl = net_hdr_len(acked);
    // The header goes into `h`, the frame into a recycled buffer: no
    // allocation and no shifting of the frame past its header.
    let mut h = [0u8; NET_HDR_HASH_LEN];
    let mut got_hdr = 0usize;
    let mut buf = crate::buffers::take();
    // Bytes of the frame read so far (`buf` may be longer: stale bytes).
    let mut got = 0usize;
    let mut last: Option<Descriptor> = None;
    let refuse = |buf: Vec<u8>, e: ChainError| {
        crate::buffers::give(buf);
        Err(e)
    };
    for desc in chain {
        if desc.is_write_only() {
            return refuse(buf, ChainError::WritableInTx);
        }
        let len = desc.len() as usize;
        let total = got_hdr + got;
        if total + len > hl + MAX_FRAME_LEN {
            return refuse(buf, ChainError::TooLong(total + len));
        }
        let oom = ChainError::OutOfMemory {
            addr: desc.addr().0,
            len: desc.len(),
        };
        let to_hdr = len.min(hl - got_hdr);
        if to_hdr > 0
            && mem
                .read_slice(&mut h[got_hdr..got_hdr + to_hdr], desc.addr())
                .is_err()
        {
            return refuse(buf, oom);
        }
        got_hdr += to_hdr;
        if len > to_hdr {
            let Some(at) = desc.addr().checked_add(to_hdr as u64) else {
                return refuse(buf, oom);
            };
            let start = got;
            got += len - to_hdr;
            // A frame past the small buffer (TSO) moves to a big one
            // before it grows: no reallocation, and a recycled big buffer
            // is not zeroed again.
            if got > buf.capacity() && buf.capacity() < crate::buffers::BIG_CAP {
                let mut big = crate::buffers::take_big();
                if big.len() < start {
                    big.resize(start, 0);
                }
                big[..start].copy_from_slice(&buf[..start]);
                crate::buffers::give(std::mem::replace(&mut buf, big));
            }
            // A recycled buffer is already initialised up to its length:
            // only growth past it is zeroed.
            if buf.len() < got {
                buf.resize(got, 0);
            }
            if mem.read_slice(&mut buf[start..got], at).is_err() {
                return refuse(buf, oom);
            }
        }
        last = Some(desc);
    }
    match last {
        None => return refuse(buf, ChainError::Empty),
        Some(d) if d.has_next() => return refuse(buf, ChainError::Broken),
        _ => {}
    }
    buf.truncate(got);
    if got_hdr + buf.len() < hl + MIN_FRAME_LEN {
        let n = got_hdr + buf.len();
        return refuse(buf, ChainError::TooShort(n));
    }
    // The hash fields of a TX header carry nothing for the device.
    let mut fixed = [0u8; NET_HDR_LEN];
    fixed.copy_from_slice(&h[..NET_HDR_LEN]);
    let hdr = NetHdr::parse(&fixed);
    if hdr.needs_csum() && !has(VIRTIO_NET_F_CSUM) {
        return Err(ChainError::NotNegotiated(
            "NEEDS_CSUM without VIRTIO_NET_F_CSUM",
        ));
    }
    match u32::from(hdr.gso_kind()) {
        VIRTIO_NET_HDR_GSO_TCPV4 if !has(VIRTIO_NET_F_HOST_TSO4) => {
            return Err(ChainError::NotNegotiated("TCPv4 GSO without HOST_TSO4"))
        }
        VIRTIO_NET_HDR_GSO_TCPV6 if !has(VIRTIO_NET_F_HOST_TSO6) => {
            return Err(ChainError::NotNegotiated("TCPv6 GSO without HOST_TSO6"))
        }
        _ => {}
    }
    if hdr.gso_kind() == VIRTIO_NET_HDR_GSO_NONE as u8 && buf.len() > MAX_FRAME_LEN - 65535 + 9216 {
        // Without GSO a frame must fit a jumbo MTU.
        return Err(ChainError::TooLong(buf.len()));
    }
    offload::validate(&buf, &hdr)?;
    Ok(Frame::new(hdr, buf))
}

/// What the caller of [`drain_tx`] did with one chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxStep {
    /// Consumed (forwarded or refused): return the chain to the guest.
    Done,
    /// Leave this chain in the ring and stop (back-pressure).
    Pause,
}

/// The outcome of a [`drain_tx`] pass.
#[derive(Debug, Default)]
pub struct TxDrain {
    /// Heads to put in the used ring (length 0), in order.
    pub used: Vec<u16>,
    /// The pass stopped on [`TxStep::Pause`].
    pub paused: bool,
}

/// Walks every available TX chain of `queue`, hands each (as a frame or as
/// the reason it was refused) to `each`, and collects the heads to return.
pub fn drain_tx<M>(
    mem: M,
    queue: &mut Queue,
    acked: u64,
    mut each: impl FnMut(u16, Result<Frame, ChainError>) -> TxStep,
) -> Result<TxDrain, virtio_queue::Error>
where
    M: Deref<Target = GuestMemoryMmap> + Clone,
{
    use virtio_queue::QueueT;
    let size = queue.size();
    let mut out = TxDrain::default();
    let mut iter = queue.iter(mem.clone())?;
    while let Some(chain) = iter.next() {
        let head = chain.head_index();
        let r = if head >= size {
            Err(ChainError::BadHead { head, size })
        } else {
            read_tx_chain(&mem, chain, acked)
        };
        if each(head, r) == TxStep::Pause {
            iter.go_to_previous_position();
            out.paused = true;
            break;
        }
        // A head outside the ring has no used slot to return it in.
        if head < size {
            out.used.push(head);
        }
    }
    Ok(out)
}

/// Frames waiting for RX buffers, as seen by [`fill_rx`].
pub trait RxSource {
    /// The next frame to deliver.
    fn pop(&mut self) -> Option<Frame>;
    /// Puts back a frame that found no buffer (it is delivered first next time).
    fn unpop(&mut self, f: Frame);
    /// Frames wait but the guest posted no buffer.
    fn starved(&mut self) {}
    /// A frame was delivered.
    fn fed(&mut self) {}
}

/// The outcome of a [`fill_rx`] pass.
#[derive(Debug, Default)]
pub struct RxFill {
    /// (head, bytes written) to put in the used ring, in order.
    pub used: Vec<(u16, u32)>,
    /// Frames were left waiting for want of buffers.
    pub starved: bool,
    /// Frames written into the ring.
    pub delivered: u64,
}

/// An RX chain a frame went into: its head, the bytes written, and where its
/// writable buffers sit in the pass's descriptor list (to patch
/// `num_buffers` afterwards).
struct RxChain {
    head: u16,
    len: u32,
    descs: std::ops::Range<usize>,
}

/// Writes frames from `src` into the available RX chains of `queue`, with a
/// `hl`-byte virtio-net header, merging buffers when `mrg` (MRG_RXBUF).
/// Refused chains are returned empty and counted in `ctx.counters.rx_errors`;
/// frames that cannot fit are dropped and counted in `rx_drops`.
pub fn fill_rx<M>(
    mem: M,
    queue: &mut Queue,
    src: &mut dyn RxSource,
    hl: usize,
    mrg: bool,
    ctx: ChainLog<'_>,
) -> Result<RxFill, virtio_queue::Error>
where
    M: Deref<Target = GuestMemoryMmap> + Clone,
{
    use virtio_queue::QueueT;
    let c = ctx.counters;
    let (port, qp) = (ctx.port, ctx.qp);
    let ring_size = queue.size();
    let mut out = RxFill::default();
    let mut iter = queue.iter(mem.clone())?;
    // Reused for every frame of the pass: nothing is allocated per frame.
    let mut chains: Vec<RxChain> = Vec::new();
    let mut all_descs: Vec<(GuestAddress, u32)> = Vec::new();
    // Added to the counters once per pass.
    let mut delivered_bytes = 0u64;
    'frames: while let Some(frame) = src.pop() {
        let hb = frame.hdr.to_hash_bytes(1);
        let hdr = &hb[..hl.min(hb.len())];
        let total = hdr.len() + frame.data.len();
        let mut off = 0usize;
        chains.clear();
        all_descs.clear();
        while off < total {
            let Some(chain) = iter.next() else {
                for _ in 0..chains.len() {
                    iter.go_to_previous_position();
                }
                if chains.len() >= usize::from(ring_size) {
                    // Even the whole ring cannot hold it.
                    QueueCounters::add(&c.rx_drops, 1);
                    crate::guest_warn!(ctx.log, port = %port, qp, "{total}-byte frame does not fit the whole RX ring: dropped");
                    continue 'frames;
                }
                src.unpop(frame);
                src.starved();
                out.starved = true;
                break 'frames;
            };
            let head = chain.head_index();
            let first = all_descs.len();
            let descs = if head >= ring_size {
                Err(ChainError::BadHead {
                    head,
                    size: ring_size,
                })
            } else {
                writable_descs(&chain, &mut all_descs).and_then(|()| {
                    if all_descs[first..].iter().any(|x| x.1 > 0) {
                        Ok(first..all_descs.len())
                    } else {
                        Err(ChainError::Empty)
                    }
                })
            };
            let descs = match descs {
                Ok(d) => d,
                Err(e) => {
                    all_descs.truncate(first);
                    QueueCounters::add(&c.rx_errors, 1);
                    crate::guest_warn!(ctx.log, port = %port, qp, "RX chain {head} refused: {e}");
                    if head < ring_size {
                        out.used.push((head, 0));
                    }
                    if !chains.is_empty() {
                        // The frame's earlier buffers cannot be given back
                        // behind this one: return them empty and drop the frame.
                        out.used.extend(chains.drain(..).map(|c| (c.head, 0)));
                        QueueCounters::add(&c.rx_drops, 1);
                        continue 'frames;
                    }
                    continue;
                }
            };
            let cap: u64 = all_descs[descs.clone()]
                .iter()
                .map(|d| u64::from(d.1))
                .sum();
            if !mrg && cap < total as u64 {
                // Without mergeable buffers a frame must fit one chain.
                iter.go_to_previous_position();
                for _ in 0..chains.len() {
                    iter.go_to_previous_position();
                }
                QueueCounters::add(&c.rx_drops, 1);
                crate::guest_warn!(ctx.log, port = %port, qp, "RX buffer of {cap} bytes too small for a {total}-byte frame: dropped");
                continue 'frames;
            }
            match write_chain(&mem, &all_descs[descs.clone()], hdr, &frame.data, off) {
                Ok(n) => {
                    off += n;
                    chains.push(RxChain {
                        head,
                        len: n as u32,
                        descs,
                    });
                }
                Err(e) => {
                    QueueCounters::add(&c.rx_errors, 1);
                    crate::guest_warn!(ctx.log, port = %port, qp, "RX chain {head} refused: {e}");
                    out.used.push((head, 0));
                }
            }
        }
        if chains.len() > 1 {
            // num_buffers sits at header offset 10 in the first chain.
            let nb = (chains.len() as u16).to_le_bytes();
            let _ = write_at(&mem, &all_descs[chains[0].descs.clone()], 10, &nb);
        }
        src.fed();
        out.delivered += 1;
        delivered_bytes += frame.data.len() as u64;
        out.used.extend(chains.iter().map(|c| (c.head, c.len)));
        crate::buffers::give(frame.data);
    }
    QueueCounters::add(&c.rx_frames, out.delivered);
    QueueCounters::add(&c.rx_bytes, delivered_bytes);
    Ok(out)
}

/// Appends the writable descriptors of an RX chain to `out`, checking it is
/// a complete chain (on error `out` may hold some of them: the caller
/// truncates).
fn writable_descs<M>(
    chain: &DescriptorChain<M>,
    out: &mut Vec<(GuestAddress, u32)>,
) -> Result<(), ChainError>
where
    M: Deref<Target = GuestMemoryMmap> + Clone,
{
    let first = out.len();
    let mut last = None;
    for d in chain.clone() {
        if d.is_write_only() {
            out.push((d.addr(), d.len()));
        }
        last = Some(d);
    }
    match last {
        None => Err(ChainError::Empty),
        Some(d) if d.has_next() => Err(ChainError::Broken),
        _ if out.len() == first => Err(ChainError::Empty),
        _ => Ok(()),
    }
}

/// Writes the logical stream `hdr ++ data`, from offset `off`, into the
/// buffers; returns how many bytes went in.
fn write_chain(
    mem: &GuestMemoryMmap,
    descs: &[(GuestAddress, u32)],
    hdr: &[u8],
    data: &[u8],
    mut off: usize,
) -> Result<usize, ChainError> {
    let total = hdr.len() + data.len();
    let mut written = 0;
    for &(addr, len) in descs {
        let mut pos = 0usize;
        while pos < len as usize && off < total {
            let (src, at) = if off < hdr.len() {
                (hdr, off)
            } else {
                (data, off - hdr.len())
            };
            let n = (len as usize - pos).min(src.len() - at);
            let a = addr
                .checked_add(pos as u64)
                .ok_or(ChainError::OutOfMemory { addr: addr.0, len })?;
            mem.write_slice(&src[at..at + n], a)
                .map_err(|_| ChainError::OutOfMemory { addr: addr.0, len })?;
            pos += n;
            off += n;
            written += n;
        }
        if off >= total {
            break;
        }
    }
    Ok(written)
}

/// Writes `bytes` at logical offset `at` of a chain's writable buffers.
fn write_at(
    mem: &GuestMemoryMmap,
    descs: &[(GuestAddress, u32)],
    mut at: usize,
    bytes: &[u8],
) -> Result<(), ChainError> {
    let mut i = 0;
    for &(addr, len) in descs {
        if at >= len as usize {
            at -= len as usize;
            continue;
        }
        while i < bytes.len() && at < len as usize {
            let a = addr
                .checked_add(at as u64)
                .ok_or(ChainError::OutOfMemory { addr: addr.0, len })?;
            mem.write_slice(&bytes[i..i + 1], a)
                .map_err(|_| ChainError::OutOfMemory { addr: addr.0, len })?;
            i += 1;
            at += 1;
        }
        at = 0;
        if i == bytes.len() {
            return Ok(());
        }
    }
    Ok(())
}

/// Returns chains to the driver: writes their used elements (`(head,
/// bytes written)`, heads already checked to be inside the ring) and then
/// the used index once, where virtio-queue's `add_used` writes the index
/// (and looks up guest memory again) per chain.
pub fn publish_used(
    mem: &GuestMemoryMmap,
    queue: &mut Queue,
    used: impl IntoIterator<Item = (u16, u32)>,
) -> Result<(), ChainError> {
    use virtio_queue::QueueT;
    let size = queue.size();
    let ring = GuestAddress(queue.used_ring());
    let oom = |a: GuestAddress| ChainError::OutOfMemory { addr: a.0, len: 8 };
    let start = queue.next_used();
    let mut next = start;
    // Elements gathered for one write: up to 64, never across the ring's end.
    let mut elems = [0u8; 8 * 64];
    let mut n = 0usize;
    let mut first_slot = next % size;
    let flush = |elems: &[u8], slot: u16| -> Result<(), ChainError> {
        let at = ring.checked_add(4 + 8 * u64::from(slot)).ok_or(oom(ring))?;
        mem.write_slice(elems, at).map_err(|_| oom(at))
    };
    for (head, len) in used {
        elems[8 * n..8 * n + 4].copy_from_slice(&u32::from(head).to_le_bytes());
        elems[8 * n + 4..8 * n + 8].copy_from_slice(&len.to_le_bytes());
        n += 1;
        next = next.wrapping_add(1);
        if n == 64 || next.is_multiple_of(size) {
            flush(&elems[..8 * n], first_slot)?;
            n = 0;
            first_slot = next % size;
        }
    }
    if n > 0 {
        flush(&elems[..8 * n], first_slot)?;
    }
    if next == start {
        return Ok(());
    }
    let idx = ring.checked_add(2).ok_or(oom(ring))?;
    mem.store(next.to_le(), idx, std::sync::atomic::Ordering::Release)
        .map_err(|_| oom(idx))?;
    queue.set_next_used(next);
    Ok(())
}

/// Whether the driver wants an interrupt for the chains returned since the
/// used index was `old` (VIRTIO 1.2 2.7.10: with EVENT_IDX only when the
/// index passed its `used_event`; without it always, as virtio-queue).
pub fn needs_interrupt(mem: &GuestMemoryMmap, queue: &Queue, old: u16) -> bool {
    use virtio_queue::QueueT;
    let new = queue.next_used();
    if new == old {
        return false;
    }
    if !queue.event_idx_enabled() {
        return true;
    }
    // Our used-index write before the driver's used_event read.
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    let at = queue.avail_ring() + 4 + 2 * u64::from(queue.size());
    let Ok(event) = mem.load::<u16>(GuestAddress(at), std::sync::atomic::Ordering::Relaxed) else {
        return true;
    };
    let event = u16::from_le(event);
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}

/// Reads a control-queue chain: the command bytes (device-readable
/// descriptors, at most [`MAX_CTRL_LEN`]) and the address of the first
/// writable byte for the ack.
pub fn read_ctrl_chain<M>(
    mem: &GuestMemoryMmap,
    chain: DescriptorChain<M>,
) -> (Result<Vec<u8>, ChainError>, Option<GuestAddress>)
where
    M: Deref<Target = GuestMemoryMmap>,
{
    let mut cmd = Vec::new();
    let mut ack = None;
    for d in chain {
        if d.is_write_only() {
            if ack.is_none() && d.len() >= 1 {
                ack = Some(d.addr());
            }
            continue;
        }
        let start = cmd.len();
        if start + d.len() as usize > MAX_CTRL_LEN {
            return (Err(ChainError::Ctrl("command too long")), ack);
        }
        cmd.resize(start + d.len() as usize, 0);
        if mem.read_slice(&mut cmd[start..], d.addr()).is_err() {
            return (
                Err(ChainError::OutOfMemory {
                    addr: d.addr().0,
                    len: d.len(),
                }),
                ack,
            );
        }
    }
    (Ok(cmd), ack)
}

#[cfg(test)]
mod tests {
    use super::*;
    use virtio_queue::desc::RawDescriptor;
    use virtio_queue::mock::MockSplitQueue;

    /// Reads `frame` written after a zero header as one TX chain: the
    /// header in its own descriptor, the frame in 4 KiB pieces.
    fn read(mem: &GuestMemoryMmap, frame: &[u8]) -> Frame {
        let q = MockSplitQueue::new(mem, 64);
        let at = 0x10_0000u64;
        mem.write_slice(&[0u8; NET_HDR_LEN], GuestAddress(at))
            .unwrap();
        let mut descs = vec![RawDescriptor::from(Descriptor::new(
            at,
            NET_HDR_LEN as u32,
            0,
            0,
        ))];
        for (i, piece) in frame.chunks(4096).enumerate() {
            let a = at + 0x1000 * (i as u64 + 1);
            mem.write_slice(piece, GuestAddress(a)).unwrap();
            descs.push(RawDescriptor::from(Descriptor::new(
                a,
                piece.len() as u32,
                0,
                0,
            )));
        }
        let chain = q.build_desc_chain(&descs).unwrap();
        read_tx_chain(mem, chain, 0).unwrap()
    }

    #[test]
    fn a_frame_past_the_small_buffer_is_read_into_a_recycled_big_one() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x20_0000)]).unwrap();
        let jumbo: Vec<u8> = (0..9000u32).map(|i| (i % 251) as u8).collect();
        let f = read(&mem, &jumbo);
        assert_eq!(f.data, jumbo);
        assert_eq!(
            f.data.capacity(),
            crate::buffers::BIG_CAP,
            "no reallocation"
        );
        let p = f.data.as_ptr();
        crate::buffers::give(f.data);
        // The next one reuses it, and a shorter frame is not left with the
        // last one's bytes.
        let shorter: Vec<u8> = (0..5000u32).map(|i| (i % 13) as u8).collect();
        let g = read(&mem, &shorter);
        assert_eq!(g.data.as_ptr(), p, "the big buffer is recycled");
        assert_eq!(g.data, shorter);
        crate::buffers::give(g.data);
        // An MTU-sized frame stays in a small buffer.
        let small = read(&mem, &jumbo[..1514]);
        assert_eq!(small.data, &jumbo[..1514]);
        assert_eq!(small.data.capacity(), crate::buffers::BUF_CAP);
    }
}

//! DQO RX queues (`gve_rx_dqo.c`, `gve_desc_dqo.h`).
//!
//! The driver posts 32-byte buffer descriptors (`buf_id`, `buf_addr`,
//! `header_buf_addr`) on the buffer queue and rings the doorbell with the
//! new tail. For every buffer it uses, the device writes one 32-byte
//! completion (the driver advances its buffer-queue head once per
//! completion). A frame longer than one buffer spans several buffers, and
//! completions; only the last has `end_of_packet`. With header split the
//! first completion has `split_header`, `header_len` = bytes written to the
//! header buffer, and `packet_len` = payload bytes in the data buffer (0 is
//! allowed: the driver then frees the data buffer); continuation completions
//! have neither.

use pci_model::{Dma, RxRefusal};

use crate::counters::{add, inc, Counters};
use crate::faults::{CsumErr, RxFault, BAD_BUF_ID};

/// Completion descriptor size.
pub const COMPL_LEN: u64 = 32;
/// Buffer descriptor size.
pub const DESC_LEN: u64 = 32;
/// Largest `packet_len` (14 bits).
pub const MAX_BUF_LEN: u32 = (1 << 14) - 1;
/// Largest `header_len` (10 bits).
pub const MAX_HDR_LEN: u32 = (1 << 10) - 1;
/// `GVE_DQO_RX_HWTSTAMP_VALID` in `ts_sub_nsecs_low`.
const HWTSTAMP_VALID: u8 = 0x1;
/// Most buffers one frame may use.
pub const MAX_BUFS_PER_FRAME: usize = 64;

/// Per-frame facts for the completion.
#[derive(Debug, Clone, Copy, Default)]
pub struct RxMeta {
    /// Packet type (index into the ptype map).
    pub ptype: u16,
    /// RSS hash (0 if none).
    pub hash: u32,
    /// `l3_l4_processed`.
    pub l3_l4_processed: bool,
    /// `csum_ip_err`.
    pub csum_ip_err: bool,
    /// `csum_l4_err`.
    pub csum_l4_err: bool,
    /// `ipv6_ex_add`.
    pub ipv6_ex_add: bool,
    /// The NIC clock's low 32 bits when the frame arrived (`ts`, with
    /// `GVE_DQO_RX_HWTSTAMP_VALID` in `ts_sub_nsecs_low`), when the device
    /// offers NIC timestamps.
    pub ts: Option<u32>,
}

/// A coalesced frame (HW-GRO, `rsc.rs`): what its completions say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rsc {
    /// `rsc_seg_len`: the segments' payload size (the skb's `gso_size`).
    pub seg_len: u16,
    /// Frames from the fabric it is made of.
    pub segments: u32,
}

/// How a frame is laid out in the buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Split {
    /// No header split on this queue: the whole frame in data buffers.
    #[default]
    Off,
    /// `frame[..n]` goes to the header buffer, the rest to data buffers.
    At(usize),
    /// Header split is on but the frame cannot be split (headers larger than
    /// the header buffer: `header_buffer_overflow`, or not TCP/UDP and too
    /// big for the header buffer): all in data buffers, `split_header` with
    /// `header_len` 0 (the driver counts it "unsplit").
    Unsplit {
        /// Headers did not fit.
        overflow: bool,
    },
}

/// One RX queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RxQueue {
    /// Queue id.
    pub id: u32,
    /// Completion ring.
    pub compl_ring: u64,
    /// Completion ring entries (power of two).
    pub compl_size: u32,
    /// Buffer ring.
    pub buf_ring: u64,
    /// Buffer ring entries (power of two).
    pub buf_size: u32,
    /// Data buffer size.
    pub packet_buffer_size: u32,
    /// Header buffer size (0: no header split).
    pub header_buffer_size: u32,
    /// `enable_rsc` (HW-GRO): in-order TCP segments of a flow arriving in
    /// one burst are coalesced (`rsc.rs`).
    pub rsc: bool,
    /// Notify block.
    pub ntfy: u32,
    /// Next buffer to use.
    pub buf_head: u32,
    /// Tail from the last doorbell.
    pub buf_tail: u32,
    /// Next completion slot.
    pub compl_tail: u32,
    /// Generation bit of the current pass.
    pub compl_gen: bool,
}

impl RxQueue {
    /// Buffers posted and not used.
    pub fn available(&self) -> u32 {
        self.buf_tail.wrapping_sub(self.buf_head) & (self.buf_size - 1)
    }

    /// The frame can be placed now: it needs at most
    /// [`MAX_BUFS_PER_FRAME`] buffers and that many are posted (an RX fault
    /// is decided only then, so that a refused frame does not spend it).
    pub fn fits(&self, len: usize, split: Split) -> bool {
        let need = self.buffers_needed(len, split);
        need <= MAX_BUFS_PER_FRAME && need <= self.available() as usize
    }

    /// How many buffers a frame needs.
    pub fn buffers_needed(&self, len: usize, split: Split) -> usize {
        let data = match split {
            Split::At(n) => len - n,
            _ => len,
        };
        let per = self.packet_buffer_size as usize;
        data.div_ceil(per).max(1)
    }

    /// Places `frame` into the next buffers and writes completions (with
    /// `rsc` set and `rsc_seg_len` when `rsc` says it is a coalesced frame).
    /// On `Err` nothing was consumed (except after a DMA error, which
    /// drops).
    ///
    /// `fault` (the RX device faults, decided by the caller once
    /// [`RxQueue::fits`] holds): [`RxFault::Error`] and
    /// [`RxFault::BadBufId`] consume one buffer, write nothing into it and
    /// one completion (`rx_error`, or `buf_id` [`BAD_BUF_ID`]) with
    /// `end_of_packet`, and drop the frame; [`RxFault::BadCsum`] delivers
    /// it with `l3_l4_processed` and the checksum error bits.
    #[allow(clippy::too_many_arguments)]
    pub fn place(
        &mut self,
        dma: &dyn Dma,
        frame: &[u8],
        split: Split,
        meta: &RxMeta,
        rsc: Option<Rsc>,
        fault: Option<RxFault>,
        c: &mut Counters,
    ) -> Result<(), RxRefusal> {
        let qi = self.id as usize;
        let need = self.buffers_needed(frame.len(), split);
        if need > MAX_BUFS_PER_FRAME {
            inc(&mut c.rx_drops);
            inc(&mut c.rx_oversize);
            return Err(RxRefusal::Dropped);
        }
        if (self.available() as usize) < need {
            inc(&mut c.rx_no_buffers);
            if let Some(q) = c.rx_queues.get_mut(qi) {
                inc(&mut q.no_buffers);
            }
            return Err(RxRefusal::NoBuffers);
        }
        // Read every descriptor first so that an unreadable one refuses the
        // frame before anything is consumed.
        let mut bufs = Vec::with_capacity(need);
        for i in 0..need as u32 {
            let idx = (self.buf_head + i) & (self.buf_size - 1);
            let mut d = [0u8; 32];
            let addr = self.buf_ring.checked_add(u64::from(idx) * DESC_LEN);
            if addr.is_none_or(|a| dma.read(a, &mut d).is_err()) {
                inc(&mut c.dma_errors);
                inc(&mut c.rx_drops);
                if let Some(q) = c.rx_queues.get_mut(qi) {
                    inc(&mut q.drops);
                }
                return Err(RxRefusal::Dropped);
            }
            let le64 = |o: usize| {
                let mut b = [0u8; 8];
                b.copy_from_slice(&d[o..o + 8]);
                u64::from_le_bytes(b)
            };
            bufs.push((u16::from_le_bytes([d[0], d[1]]), le64(8), le64(16)));
        }
        if let Some(f @ (RxFault::Error | RxFault::BadBufId)) = fault {
            self.buf_head = (self.buf_head + 1) & (self.buf_size - 1);
            let mut cd = [0u8; 32];
            cd[0] = 1; // rxdid
            let buf_id = if f == RxFault::Error {
                cd[1] = 1 << 2; // rx_error
                bufs[0].0
            } else {
                BAD_BUF_ID
            };
            cd[2..4].copy_from_slice(&(meta.ptype & 0x3ff).to_le_bytes());
            cd[8] = 1 | (1 << 1); // descriptor_done, end_of_packet
            cd[12..14].copy_from_slice(&buf_id.to_le_bytes());
            self.write_completion(dma, &mut cd, 0, c);
            inc(&mut c.rx_drops);
            if let Some(q) = c.rx_queues.get_mut(qi) {
                inc(&mut q.drops);
            }
            return Ok(());
        }
        let bad_csum;
        let meta = match fault {
            Some(RxFault::BadCsum(bits)) => {
                bad_csum = RxMeta {
                    l3_l4_processed: true,
                    csum_ip_err: meta.csum_ip_err || bits != CsumErr::L4,
                    csum_l4_err: meta.csum_l4_err || bits != CsumErr::Ip,
                    ..*meta
                };
                &bad_csum
            }
            _ => meta,
        };
        if meta.csum_ip_err || meta.csum_l4_err {
            if let Some(q) = c.rx_queues.get_mut(qi) {
                inc(&mut q.csum_errors);
            }
        }
        let (hdr, data) = match split {
            Split::At(n) => frame.split_at(n),
            _ => (&frame[..0], frame),
        };
        let per = self.packet_buffer_size as usize;
        let mut chunks: Vec<&[u8]> = data.chunks(per).collect();
        if chunks.is_empty() {
            chunks.push(&data[..0]);
        }
        let n = chunks.len();
        let mut hsplit = false;
        for (i, (chunk, &(buf_id, addr, hdr_addr))) in chunks.iter().zip(&bufs).enumerate() {
            self.buf_head = (self.buf_head + 1) & (self.buf_size - 1);
            // An empty chunk (all of a small frame went to the header buffer)
            // touches no guest memory.
            let mut dma_ok = chunk.is_empty() || dma.write(addr, chunk).is_ok();
            let mut split_header = false;
            let mut hbo = false;
            let mut header_len = 0u16;
            if i == 0 {
                match split {
                    Split::Off => {}
                    Split::At(_) => {
                        split_header = true;
                        header_len = hdr.len() as u16;
                        dma_ok &= dma.write(hdr_addr, hdr).is_ok();
                        hsplit = true;
                    }
                    Split::Unsplit { overflow } => {
                        split_header = true;
                        hbo = overflow;
                    }
                }
            }
            let eop = i + 1 == n || !dma_ok;
            let mut cd = [0u8; 32];
            cd[0] = 1; // rxdid
            cd[1] = if meta.ipv6_ex_add { 1 << 1 } else { 0 } | if dma_ok { 0 } else { 1 << 2 };
            cd[2..4].copy_from_slice(&(meta.ptype & 0x3ff).to_le_bytes());
            let plen = chunk.len() as u16 & 0x3fff;
            cd[6..8].copy_from_slice(
                &((header_len & 0x3ff)
                    | if rsc.is_some() { 1 << 10 } else { 0 }
                    | if split_header { 1 << 11 } else { 0 })
                .to_le_bytes(),
            );
            cd[8] = 1 // descriptor_done
                | if eop { 1 << 1 } else { 0 }
                | if hbo { 1 << 2 } else { 0 }
                | if meta.l3_l4_processed { 1 << 3 } else { 0 }
                | if meta.csum_ip_err { 1 << 4 } else { 0 }
                | if meta.csum_l4_err { 1 << 5 } else { 0 };
            cd[12..14].copy_from_slice(&buf_id.to_le_bytes());
            // The driver reads `rsc` and `rsc_seg_len` from the
            // end_of_packet completion; like the other per-packet fields
            // they are on every completion of the frame.
            if let Some(r) = rsc {
                cd[14..16].copy_from_slice(&r.seg_len.to_le_bytes());
            }
            cd[16..20].copy_from_slice(&meta.hash.to_le_bytes());
            if let Some(ts) = meta.ts {
                cd[11] = HWTSTAMP_VALID;
                cd[28..32].copy_from_slice(&ts.to_le_bytes());
            }
            self.write_completion(dma, &mut cd, plen, c);
            if !dma_ok {
                inc(&mut c.dma_errors);
                inc(&mut c.rx_drops);
                if let Some(q) = c.rx_queues.get_mut(qi) {
                    inc(&mut q.drops);
                }
                // The driver drops the packet on rx_error; what is left of
                // the frame is not delivered.
                return Ok(());
            }
        }
        // Frames from the fabric: each segment of a coalesced one.
        let frames = rsc.map_or(1, |r| u64::from(r.segments));
        add(&mut c.rx_packets, frames);
        add(&mut c.rx_bytes, frame.len() as u64);
        if let Some(r) = rsc {
            inc(&mut c.rx_rsc_packets);
            add(&mut c.rx_rsc_segments, u64::from(r.segments));
        }
        if let Some(q) = c.rx_queues.get_mut(qi) {
            add(&mut q.packets, frames);
            add(&mut q.bytes, frame.len() as u64);
            add(&mut q.payload_bytes, data.len() as u64);
            if hsplit {
                add(&mut q.hsplit_packets, frames);
                add(&mut q.header_bytes, hdr.len() as u64);
            }
        }
        Ok(())
    }

    /// Writes a completion with the stale generation, then the word with
    /// `packet_len` and the new generation, so the driver never sees a
    /// half-written entry as valid.
    fn write_completion(&mut self, dma: &dyn Dma, cd: &mut [u8; 32], plen: u16, c: &mut Counters) {
        let gen = |g: bool| if g { 1u16 << 14 } else { 0 };
        cd[4..6].copy_from_slice(&(plen | gen(!self.compl_gen)).to_le_bytes());
        let word = plen | gen(self.compl_gen);
        let ok = match self
            .compl_ring
            .checked_add(u64::from(self.compl_tail) * COMPL_LEN)
        {
            Some(a) => {
                dma.write(a, cd).is_ok()
                    && dma.write(a.wrapping_add(4), &word.to_le_bytes()).is_ok()
            }
            None => false,
        };
        if !ok {
            inc(&mut c.dma_errors);
        }
        self.compl_tail = (self.compl_tail + 1) & (self.compl_size - 1);
        if self.compl_tail == 0 {
            self.compl_gen = !self.compl_gen;
        }
    }
}

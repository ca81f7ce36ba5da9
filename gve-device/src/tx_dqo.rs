//! DQO TX queues (`gve_tx_dqo.c`, `gve_desc_dqo.h`).
//!
//! The driver writes 16-byte descriptors and rings the queue's doorbell with
//! the new tail. A packet is: an optional TSO context descriptor (dtype 5),
//! a general context descriptor (dtype 4, metadata the model ignores), then
//! packet descriptors (dtype 0xc) up to the one with `end_of_packet`. The
//! device answers on the completion ring with 8-byte descriptors: a packet
//! completion carrying the packet's `compl_tag` (the driver frees the skb),
//! and a descriptor completion carrying `tx_head` = index after a descriptor
//! that had `report_event` (the driver's only view of the ring head:
//! `gve_has_tx_slots_available` reads it). Generation bit: the driver starts
//! expecting 1 (zeroed ring, `cur_gen_bit` 0) and flips on each wrap.

use pci_model::Dma;

use crate::counters::{add, inc, Counters};
use crate::offload;

/// `GVE_TX_PKT_DESC_DTYPE_DQO`.
pub const DTYPE_PKT: u8 = 0xc;
/// `GVE_TX_TSO_CTX_DESC_DTYPE_DQO`.
pub const DTYPE_TSO_CTX: u8 = 0x5;
/// `GVE_TX_GENERAL_CTX_DESC_DTYPE_DQO`.
pub const DTYPE_GENERAL_CTX: u8 = 0x4;
/// `GVE_COMPL_TYPE_DQO_PKT`.
pub const COMPL_PKT: u16 = 0x2;
/// `GVE_COMPL_TYPE_DQO_DESC`.
pub const COMPL_DESC: u16 = 0x4;
/// `GVE_COMPL_TYPE_DQO_MISS`: the packet took the miss path (`tx-miss`).
pub const COMPL_MISS: u16 = 0x1;
/// `GVE_COMPL_TYPE_DQO_REINJECTION`: a missed packet was sent after all.
pub const COMPL_REINJECTION: u16 = 0x3;
/// `GVE_ALT_MISS_COMPL_BIT`: with the driver's `alt_miss_compl`
/// capability, a miss is a packet completion with this bit in the tag.
pub const ALT_MISS_COMPL_BIT: u16 = 1 << 15;
/// Largest packet the device gathers: `GVE_DQO_TX_MAX` of TSO payload plus
/// the largest header. Bigger packets are completed and dropped.
pub const MAX_GATHER: usize = 0x3ffff + offload::MAX_TSO_HDR as usize;

/// One TX queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxQueue {
    /// Queue id.
    pub id: u32,
    /// Descriptor ring (16-byte entries).
    pub ring: u64,
    /// Ring entries (power of two).
    pub ring_size: u32,
    /// Completion ring (8-byte entries).
    pub compl_ring: u64,
    /// Completion ring entries (power of two).
    pub compl_size: u32,
    /// Notify block.
    pub ntfy: u32,
    /// Next descriptor to read.
    pub head: u32,
    /// Tail from the last doorbell.
    pub tail: u32,
    /// Next completion slot.
    pub compl_tail: u32,
    /// Generation bit for the current pass over the completion ring.
    pub compl_gen: bool,
}

struct Tso {
    total_len: u32,
    mss: u32,
    header_len: u32,
}

/// What processing a queue produced.
#[derive(Debug, Default)]
pub struct TxResult {
    /// Frames to send.
    pub frames: Vec<Vec<u8>>,
    /// Their bytes.
    pub bytes: usize,
    /// Completions were written (raise the notify block).
    pub completed: bool,
    /// Stopped at the byte budget with descriptors left before the tail.
    pub more: bool,
}

impl TxQueue {
    /// A queue from CREATE_TX_QUEUE.
    pub fn new(
        id: u32,
        ring: u64,
        ring_size: u32,
        compl_ring: u64,
        compl_size: u32,
        ntfy: u32,
    ) -> Self {
        TxQueue {
            id,
            ring,
            ring_size,
            compl_ring,
            compl_size,
            ntfy,
            head: 0,
            tail: 0,
            compl_tail: 0,
            compl_gen: true,
        }
    }

    fn mask(&self) -> u32 {
        self.ring_size - 1
    }

    fn read_desc(&self, dma: &dyn Dma, idx: u32) -> Option<[u8; 16]> {
        let addr = self.ring.checked_add(u64::from(idx) * 16)?;
        let mut d = [0u8; 16];
        dma.read(addr, &mut d).ok()?;
        Some(d)
    }

    /// Writes one completion: first with the stale generation (so a
    /// half-written entry never looks valid), then the word holding the
    /// new generation bit.
    fn complete(&mut self, dma: &dyn Dma, ty: u16, value: u16, c: &mut Counters) {
        let word0 = (self.id as u16 & 0x7ff) | (ty << 11);
        let gen = if self.compl_gen { 1u16 << 15 } else { 0 };
        let stale = if self.compl_gen { 0 } else { 1u16 << 15 };
        let mut d = [0u8; 8];
        d[0..2].copy_from_slice(&(word0 | stale).to_le_bytes());
        d[2..4].copy_from_slice(&value.to_le_bytes());
        let Some(addr) = self.compl_ring.checked_add(u64::from(self.compl_tail) * 8) else {
            inc(&mut c.dma_errors);
            return;
        };
        let ok =
            dma.write(addr, &d).is_ok() && dma.write(addr, &(word0 | gen).to_le_bytes()).is_ok();
        if !ok {
            inc(&mut c.dma_errors);
        }
        self.compl_tail = (self.compl_tail + 1) & (self.compl_size - 1);
        if self.compl_tail == 0 {
            self.compl_gen = !self.compl_gen;
        }
    }

    /// Processes the complete packets between head and tail until their
    /// frames reach `budget` bytes (the packet that reaches it is sent
    /// whole); what is left stays in the ring (`more`). `mtu` is the
    /// device's (the descriptor's): no frame longer than it allows leaves.
    ///
    /// `miss` is asked once per good packet (the `tx-miss` fault): `Some`
    /// gives it a miss completion (a packet completion with
    /// [`ALT_MISS_COMPL_BIT`] when `alt_miss`), then, if `Some(true)`, sends
    /// it and writes a reinjection completion; `Some(false)` drops it.
    pub fn process(
        &mut self,
        dma: &dyn Dma,
        mtu: u16,
        c: &mut Counters,
        budget: usize,
        alt_miss: bool,
        miss: &mut dyn FnMut() -> Option<bool>,
    ) -> TxResult {
        let mut res = TxResult::default();
        let qi = self.id as usize;
        while self.head != self.tail {
            if res.bytes >= budget {
                res.more = true;
                break;
            }
            // Find the end of the packet without consuming anything: a
            // packet whose end is not yet behind the tail waits.
            let mut idx = self.head;
            let mut descs = Vec::new();
            let mut complete = false;
            while idx != self.tail {
                let Some(d) = self.read_desc(dma, idx) else {
                    inc(&mut c.dma_errors);
                    // The ring itself is unreadable: nothing can be
                    // completed. Stop here; a later doorbell may retry.
                    return res;
                };
                descs.push((idx, d));
                idx = (idx + 1) & self.mask();
                if d[8] & 0x1f == DTYPE_PKT && d[8] & 0x20 != 0 {
                    complete = true;
                    break;
                }
            }
            if !complete {
                break;
            }
            self.head = idx;
            let (frames, tag, report_heads, ok) = self.gather(dma, &descs, mtu, c);
            let missed = if ok { miss() } else { None };
            if missed == Some(false) {
                // The miss path dropped it: no reinjection comes, the
                // driver frees the packet after its timeout.
                inc(&mut c.tx_drops);
                inc(&mut c.tx_miss_dropped);
                if let Some(q) = c.tx_queues.get_mut(qi) {
                    inc(&mut q.drops);
                }
            } else if ok {
                for f in frames {
                    add(&mut c.tx_bytes, f.len() as u64);
                    inc(&mut c.tx_packets);
                    if let Some(q) = c.tx_queues.get_mut(qi) {
                        add(&mut q.bytes, f.len() as u64);
                        inc(&mut q.packets);
                    }
                    res.bytes += f.len();
                    res.frames.push(f);
                }
            } else {
                inc(&mut c.tx_drops);
                if let Some(q) = c.tx_queues.get_mut(qi) {
                    inc(&mut q.drops);
                }
            }
            // Always complete the packet, even a dropped one: otherwise the
            // driver's pending-packet slot (the tag) leaks.
            match missed {
                None => self.complete(dma, COMPL_PKT, tag, c),
                Some(_) if alt_miss => self.complete(dma, COMPL_PKT, tag | ALT_MISS_COMPL_BIT, c),
                Some(_) => self.complete(dma, COMPL_MISS, tag, c),
            }
            for h in report_heads {
                self.complete(dma, COMPL_DESC, h as u16, c);
            }
            if missed == Some(true) {
                self.complete(dma, COMPL_REINJECTION, tag, c);
            }
            res.completed = true;
        }
        res
    }

    /// Gathers one packet's buffers and finishes offloads. Returns the
    /// frames, the completion tag, the `tx_head` values to report, and
    /// whether the packet is good.
    fn gather(
        &self,
        dma: &dyn Dma,
        descs: &[(u32, [u8; 16])],
        mtu: u16,
        c: &mut Counters,
    ) -> (Vec<Vec<u8>>, u16, Vec<u32>, bool) {
        let mut tso: Option<Tso> = None;
        let mut csum = false;
        let mut tag = 0u16;
        let mut heads = Vec::new();
        let mut ok = true;
        let mut pkt: Vec<u8> = Vec::new();
        let mut seen_data = false;
        for &(idx, d) in descs {
            match d[8] & 0x1f {
                DTYPE_TSO_CTX if !seen_data => {
                    let v = u32::from_le_bytes([d[0], d[1], d[2], d[3]]);
                    let mss = u32::from(u16::from_le_bytes([d[4], d[5]]) & 0x3fff);
                    if d[8] & 0x20 != 0 {
                        tso = Some(Tso {
                            total_len: v & 0xff_ffff,
                            mss,
                            header_len: u32::from(d[6]),
                        });
                    }
                }
                DTYPE_GENERAL_CTX if !seen_data => {}
                DTYPE_PKT => {
                    seen_data = true;
                    let addr = u64::from_le_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]]);
                    csum |= d[8] & 0x40 != 0;
                    if d[8] & 0x80 != 0 {
                        heads.push((idx + 1) & self.mask());
                    }
                    tag = u16::from_le_bytes([d[12], d[13]]);
                    let len = usize::from(u16::from_le_bytes([d[14], d[15]]) & 0x3fff);
                    if !ok {
                        continue;
                    }
                    if pkt.len() + len > MAX_GATHER {
                        inc(&mut c.bad_tx_descriptors);
                        ok = false;
                        continue;
                    }
                    let at = pkt.len();
                    pkt.resize(at + len, 0);
                    // A zero-length buffer (an empty linear part) is not read.
                    if len != 0 && dma.read(addr, &mut pkt[at..]).is_err() {
                        inc(&mut c.dma_errors);
                        ok = false;
                    }
                }
                _ => {
                    inc(&mut c.bad_tx_descriptors);
                    ok = false;
                }
            }
        }
        if !ok {
            return (Vec::new(), tag, heads, false);
        }
        let max_frame = offload::max_frame_len(&pkt, mtu);
        if let Some(t) = tso {
            // The first segment is the largest: the headers and one MSS (or
            // all the payload, if less). An MSS the MTU cannot carry would
            // put frames on the wire no receiver takes.
            let largest = t.header_len.saturating_add(t.mss.min(t.total_len)) as usize;
            if largest > max_frame {
                inc(&mut c.tx_oversize);
                return (Vec::new(), tag, heads, false);
            }
            match offload::segment(&pkt, t.header_len, t.mss, t.total_len) {
                Ok(frames) => {
                    if let Some(q) = c.tx_queues.get_mut(self.id as usize) {
                        inc(&mut q.tso_packets);
                    }
                    (frames, tag, heads, true)
                }
                Err(_) => {
                    inc(&mut c.bad_tx_descriptors);
                    (Vec::new(), tag, heads, false)
                }
            }
        } else {
            // A packet without TSO is one frame: it must fit the MTU as it
            // is (MAX_GATHER only bounds what TSO may split).
            if pkt.len() > max_frame {
                inc(&mut c.tx_oversize);
                return (Vec::new(), tag, heads, false);
            }
            if csum {
                // No TCP/UDP header: nothing the device can finish (the stack
                // only offloads TCP/UDP checksums to this device); send as is.
                wire::checksum::fill_l4(&mut pkt);
            }
            (vec![pkt], tag, heads, true)
        }
    }
}

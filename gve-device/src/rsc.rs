//! Receive-side coalescing (HW-GRO) for RX queues created with
//! `enable_rsc` (`gve_adminq_get_create_rx_queue_cmd` sets it when the
//! netdev has `NETIF_F_GRO_HW`, on by default in DQO).
//!
//! What the driver expects (`gve_rx_dqo.c`): it builds one skb from the
//! completions up to `end_of_packet`, the header buffer (with header split)
//! followed by the data buffers; when the `end_of_packet` completion has
//! `rsc`, `gve_rx_complete_rsc` marks the skb GSO (`SKB_GSO_TCPV4`/`V6`
//! from the packet type, `gso_size = rsc_seg_len`) and hands it to GRO. It
//! fixes nothing in the headers, so the device writes one valid TCP packet:
//! the first segment's headers with the IP length of the whole, a fresh
//! IPv4 header checksum and TCP checksum, PSH if the last segment had it;
//! then every segment's payload in order.
//!
//! Which segments merge (the rules of Linux's software GRO,
//! `tcp_gro_receive`, so the result is what the stack would have built):
//! TCP over IPv4 without options or IPv6 without extension headers, not a
//! fragment, checksums good, no bytes past the IP datagram, a payload;
//! flags exactly ACK or ACK|PSH; TCP options only NOP, EOL and the
//! timestamp. A segment continues a chain when everything but the IP
//! length, IPv4 id and the checksums equals the chain's first segment
//! (Ethernet header, addresses, TOS/traffic class, TTL, ports, ACK number,
//! window, options byte for byte), its sequence number is the next
//! expected, and its payload is no longer than the first one's (`mss`). A
//! shorter segment or one with PSH ends the chain.
//!
//! Bounds: a chain holds at most `GveConfig::rsc_max_bytes` bytes (and what
//! the IP length field can say), at most [`crate::rx_dqo::MAX_BUFS_PER_FRAME`]
//! buffers, and never more buffers than the queue has posted; a chain is
//! only built inside one burst of frames from the edge and written out at
//! its end (`PciDevice::end_rx_burst`) or earlier: frames are never held
//! across edge calls.

use devmem_nic::parse::{L4Proto, ParsedFrame, L3};

use crate::rx_dqo::{RxMeta, Split};

/// TCP flags (byte 13 of the header).
const ACK: u8 = 0x10;
const PSH: u8 = 0x08;

/// Most bytes a coalesced frame may have by default (64 KiB).
pub const DEFAULT_MAX_BYTES: u32 = 64 * 1024;

/// What a segment that may be coalesced looks like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// Offset of the IP header.
    pub l3_offset: usize,
    /// IPv6 (else IPv4 without options).
    pub v6: bool,
    /// Offset of the TCP header.
    pub l4_offset: usize,
    /// Offset one past the TCP header (options included).
    pub header_end: usize,
    /// TCP payload bytes.
    pub payload: usize,
    /// Sequence number.
    pub seq: u32,
    /// PSH: the segment ends a chain.
    pub psh: bool,
}

/// The segment facts of `frame` if it may be coalesced at all (see the
/// module doc), else `None`.
pub fn segment(frame: &[u8], p: &ParsedFrame, meta: &RxMeta) -> Option<Segment> {
    if !meta.l3_l4_processed || meta.csum_ip_err || meta.csum_l4_err || meta.ipv6_ex_add {
        return None;
    }
    let l4 = p.l4.filter(|l4| l4.proto == L4Proto::Tcp)?;
    let v6 = match p.l3? {
        L3::V4(ip) if ip.header_len == 20 && !ip.fragment => false,
        L3::V6(ip) if !ip.has_ext_headers && !ip.fragment && ip.header_len == 40 => true,
        _ => return None,
    };
    let header_end = p.l4_offset.checked_add(l4.header_len)?;
    // Trailing bytes (Ethernet padding) would end up inside the payload.
    if p.l3_end != frame.len() || header_end >= frame.len() {
        return None;
    }
    let tcp = frame.get(p.l4_offset..header_end)?;
    let flags = tcp[13];
    if flags & !PSH != ACK {
        return None;
    }
    if !options_ok(&tcp[20..]) {
        return None;
    }
    Some(Segment {
        l3_offset: p.l3_offset,
        v6,
        l4_offset: p.l4_offset,
        header_end,
        payload: frame.len() - header_end,
        seq: u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]),
        psh: flags & PSH != 0,
    })
}

/// TCP options GRO lets through: NOP, EOL (then only padding) and the
/// timestamp (kind 8, length 10).
fn options_ok(mut o: &[u8]) -> bool {
    while let Some(&kind) = o.first() {
        match kind {
            0 => return o.iter().all(|&b| b == 0),
            1 => o = &o[1..],
            8 if o.get(1) == Some(&10) && o.len() >= 10 => o = &o[10..],
            _ => return false,
        }
    }
    true
}

/// Segments being coalesced on one RX queue: the first one's headers and
/// every payload so far, in `buf` (its capacity is kept for the next chain).
#[derive(Debug, Clone, Default)]
pub struct Chain {
    /// The coalesced frame so far (empty: no chain).
    pub buf: Vec<u8>,
    /// The first segment's facts.
    pub first: Option<Segment>,
    /// The first segment's payload length: no later one may be longer.
    pub mss: usize,
    /// Sequence number the next segment must have.
    pub next_seq: u32,
    /// Segments in the chain.
    pub segments: u32,
    /// The last segment had PSH.
    pub psh: bool,
    /// Completion facts (the first segment's; all were verified good).
    pub meta: RxMeta,
    /// How the frame is laid out in the queue's buffers.
    pub split: Split,
}

impl Chain {
    /// Whether a chain is open.
    pub fn is_open(&self) -> bool {
        self.segments > 0
    }

    /// Opens a chain with `frame` (a [`segment`]), keeping at most
    /// `max_bytes` of capacity.
    pub fn start(&mut self, frame: &[u8], seg: Segment, meta: RxMeta, split: Split, max: usize) {
        self.buf.clear();
        if self.buf.capacity() < max {
            // Reserved once per queue: the chain never grows past it.
            self.buf.reserve_exact(max);
        }
        self.buf.extend_from_slice(frame);
        self.first = Some(seg);
        self.mss = seg.payload;
        self.next_seq = seg.seq.wrapping_add(seg.payload as u32);
        self.segments = 1;
        self.psh = seg.psh;
        self.meta = meta;
        self.split = split;
    }

    /// Whether `frame` (a [`segment`] `seg`) continues the chain: same flow
    /// and headers, the next sequence number, no longer than the first.
    pub fn continues(&self, frame: &[u8], seg: &Segment) -> bool {
        let Some(f) = self.first else {
            return false;
        };
        if !self.is_open()
            || self.psh
            || seg.seq != self.next_seq
            || seg.payload > self.mss
            || (f.l3_offset, f.v6, f.l4_offset, f.header_end)
                != (seg.l3_offset, seg.v6, seg.l4_offset, seg.header_end)
        {
            return false;
        }
        let (a, b) = (&self.buf[..f.header_end], &frame[..seg.header_end]);
        let same = |r: std::ops::Range<usize>| a[r.clone()] == b[r];
        let (l3, t, end) = (f.l3_offset, f.l4_offset, f.header_end);
        // Everything but the IP length (and the IPv4 id and header
        // checksum), the TCP sequence number, flags byte (PSH) and checksum.
        let ip_same = if f.v6 {
            same(0..l3 + 4) && same(l3 + 6..t)
        } else {
            same(0..l3 + 2) && same(l3 + 6..l3 + 10) && same(l3 + 12..t)
        };
        ip_same
            && same(t..t + 4)
            && same(t + 8..t + 13)
            && same(t + 14..t + 16)
            && same(t + 18..end)
    }

    /// Appends a segment that [`continues`](Self::continues) the chain.
    pub fn append(&mut self, frame: &[u8], seg: &Segment) {
        self.buf.extend_from_slice(&frame[seg.header_end..]);
        self.next_seq = seg.seq.wrapping_add(seg.payload as u32);
        self.segments += 1;
        self.psh = seg.psh;
    }

    /// Whether the chain is complete: a segment shorter than the first, or
    /// one with PSH, ends it (GRO flushes there too).
    pub fn closed(&self, last: &Segment) -> bool {
        last.psh || last.payload < self.mss
    }

    /// Makes `buf` one valid packet: IP length of the whole, IPv4 header
    /// checksum, PSH if the last segment had it, TCP checksum. Nothing to
    /// do for a chain of one segment (its frame is as it came).
    pub fn finish(&mut self) {
        let Some(f) = self.first else {
            return;
        };
        if self.segments < 2 {
            return;
        }
        crate::offload::fix_ip_len(&mut self.buf);
        if !f.v6 {
            crate::offload::fill_ipv4_checksum(&mut self.buf[f.l3_offset..f.l3_offset + 20]);
        }
        if self.psh {
            self.buf[f.l4_offset + 13] |= PSH;
        }
        crate::offload::fill_l4_checksum(&mut self.buf);
    }

    /// Closes the chain (its buffer's capacity stays).
    pub fn clear(&mut self) {
        self.buf.clear();
        self.first = None;
        self.segments = 0;
        self.psh = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_gro_accepts() {
        assert!(options_ok(&[]));
        assert!(options_ok(&[1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2]));
        assert!(options_ok(&[0, 0, 0, 0]));
        assert!(!options_ok(&[0, 1, 0, 0]), "bytes after EOL");
        assert!(!options_ok(&[2, 4, 5, 0xb4]), "MSS");
        assert!(!options_ok(&[5, 10, 0, 0, 0, 0, 0, 0, 0, 0]), "SACK");
        assert!(!options_ok(&[8, 10, 0, 0]), "cut timestamp");
    }
}

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
//! IPv4 header checksum and TCP checksum, PSH/FIN if a merged segment had
//! them; then every segment's payload in order.
//!
//! Which segments merge: those Linux's software GRO merges
//! (`inet_gro_receive`, `ipv6_gro_receive`, `tcp_gro_receive`,
//! `inet_gro_flush`), so the result is what the stack would have built,
//! as `tools/testing/selftests/net/lib/gro.c` checks it:
//!
//! - TCP over IPv4 without options (`0x45`) or over IPv6 with no extension
//!   headers but hop-by-hop and destination options, not a fragment,
//!   checksums good, with a payload (Ethernet padding after the IP
//!   datagram is left out). Not TCP inside IPIP/IPv6-in-IPv6: the driver
//!   can only mark plain `SKB_GSO_TCPV4`/`V6`, and the stack cannot
//!   resegment a tunnelled packet marked so (`ipip_gso_segment` wants
//!   `SKB_GSO_IPXIP4`), e.g. when it forwards it.
//! - A chain starts with a segment without URG, PSH, RST, SYN or FIN.
//! - A segment continues it when everything but the IP length, IPv4 id and
//!   header checksum, TCP sequence number, PSH/FIN and TCP checksum equals
//!   the first segment's (Ethernet header, addresses, TOS/traffic class
//!   and flow label, TTL/hop limit, DF, extension headers, ports, ACK
//!   number, the other flags (CWR too), window, urgent pointer, options
//!   byte for byte); its sequence number is the next expected; its payload
//!   is no longer than the first one's (`mss`); and its IPv4 id follows
//!   the chain's rule, fixed at the second segment: equal to the first
//!   one's (fixed id) or the first one's plus its index (incrementing).
//! - A shorter segment, PSH or FIN ends the chain.
//!
//! Flows: a queue keeps up to [`MAX_FLOWS`] chains open at once, one per
//! TCP flow, as Linux's GRO keeps several flows per NAPI context (8 hash
//! buckets of up to `MAX_GRO_SKBS` = 8), so flows interleaved on one queue
//! (A1 B1 A2 B2, `gro.c --test capacity`) are merged each on its own. A
//! new flow when all are in use writes out the oldest chain. Segments of
//! one flow stay in order; flows may pass each other, as with GRO. A frame
//! that cannot be coalesced writes out every chain of its queue first.
//!
//! Bounds: a chain holds at most `GveConfig::rsc_max_bytes` bytes (and what
//! the IP length field can say), at most [`crate::rx_dqo::MAX_BUFS_PER_FRAME`]
//! buffers; the chains of a queue together never need more buffers than
//! the queue has posted (so the bytes held are bounded by what the driver
//! posted); each waits at most `GveConfig::rsc_hold` for its next segment
//! (the device asks for a poll then, `PciDevice::next_timeout`).

use std::time::{Duration, Instant};

use wire::parse::{L4Proto, ParsedFrame, L3};

use crate::rx_dqo::{RxMeta, Split};

/// TCP flags (byte 13 of the header).
const FIN: u8 = 0x01;
const SYN: u8 = 0x02;
const RST: u8 = 0x04;
const PSH: u8 = 0x08;
const URG: u8 = 0x20;

/// Most bytes a coalesced frame may have by default: more than any IP
/// length field can say (Ethernet with a VLAN tag, an IPv6 header and a
/// 65535-byte payload), so the IP length is the bound, as with GRO's
/// default `gro_max_size` (a packet of IP length under 64 KiB).
pub const DEFAULT_MAX_BYTES: u32 = 18 + 40 + 0xffff;

/// How long a chain waits for its next segment by default. Segments of a
/// stream arrive from the fabric in separate edge calls (one per batch
/// the sender's NIC handed over), so a chain must outlive the call; real
/// HW-GRO engines hold a flow for a timer too (tens of microseconds on
/// hardware, more for emulated guests whose packets come slower). Only
/// segments without PSH wait: a sender's last segment of a write (PSH)
/// closes its chain at once.
pub const DEFAULT_HOLD: Duration = Duration::from_millis(1);

/// Chains one RX queue keeps open at once (Linux GRO: 8 buckets x
/// `MAX_GRO_SKBS` 8 per NAPI context).
pub const MAX_FLOWS: usize = 64;

/// Closed chains' buffers a queue keeps for reuse.
const SPARE_BUFFERS: usize = 4;

/// IPv6 extension headers GRO walks (`INET6_PROTO_GSO_EXTHDR`, and
/// hop-by-hop): hop-by-hop and destination options. (Routing headers are
/// left out: they change the checksum's pseudo-header destination.)
const V6_EXT_HBH: u8 = 0;
const V6_EXT_DSTOPTS: u8 = 60;

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
    /// Offset one past the IP datagram (what follows is padding).
    pub l3_end: usize,
    /// TCP payload bytes.
    pub payload: usize,
    /// Sequence number.
    pub seq: u32,
    /// IPv4 identification (0 for IPv6).
    pub ip_id: u16,
    /// The TCP flags byte.
    pub flags: u8,
}

impl Segment {
    /// PSH or FIN: the segment ends a chain (and never starts one).
    pub fn ends_chain(&self) -> bool {
        self.flags & (PSH | FIN) != 0
    }
}

/// The segment facts of `frame` if it may be coalesced at all (see the
/// module doc), else `None`.
pub fn segment(frame: &[u8], p: &ParsedFrame, meta: &RxMeta) -> Option<Segment> {
    if !meta.l3_l4_processed || meta.csum_ip_err || meta.csum_l4_err {
        return None;
    }
    let l4 = p.l4.filter(|l4| l4.proto == L4Proto::Tcp)?;
    let (v6, ip_id) = match p.l3? {
        L3::V4(ip) if ip.header_len == 20 && !ip.fragment && ip.protocol == 6 => {
            let id = frame.get(p.l3_offset + 4..p.l3_offset + 6)?;
            (false, u16::from_be_bytes([id[0], id[1]]))
        }
        L3::V6(ip)
            if !ip.fragment
                && !ip.ext_truncated
                && ip.protocol == 6
                && v6_exts_ok(frame, p.l3_offset, p.l4_offset) =>
        {
            (true, 0)
        }
        _ => return None,
    };
    let header_end = p.l4_offset.checked_add(l4.header_len)?;
    if p.l3_end > frame.len() || header_end >= p.l3_end {
        return None;
    }
    let tcp = frame.get(p.l4_offset..header_end)?;
    let flags = tcp[13];
    if flags & (URG | RST | SYN) != 0 {
        return None;
    }
    Some(Segment {
        l3_offset: p.l3_offset,
        v6,
        l4_offset: p.l4_offset,
        header_end,
        l3_end: p.l3_end,
        payload: p.l3_end - header_end,
        seq: u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]),
        ip_id,
        flags,
    })
}

/// Whether the IPv6 header at `l3` reaches TCP at `l4` through hop-by-hop
/// and destination options headers only (or none).
fn v6_exts_ok(frame: &[u8], l3: usize, l4: usize) -> bool {
    let Some(&first) = frame.get(l3 + 6) else {
        return false;
    };
    let (mut next, mut pos) = (first, l3 + 40);
    while pos < l4 {
        if next != V6_EXT_HBH && next != V6_EXT_DSTOPTS {
            return false;
        }
        let (Some(&n), Some(&len)) = (frame.get(pos), frame.get(pos + 1)) else {
            return false;
        };
        next = n;
        pos += (usize::from(len) + 1) * 8;
    }
    pos == l4 && next == 6
}

/// The chain's IPv4 id rule, decided by its second segment
/// (`inet_gro_flush`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IdRule {
    /// One segment so far: not decided.
    #[default]
    Open,
    /// Every segment has the first one's id.
    Fixed,
    /// Segment `i` has the first one's id plus `i`.
    Incrementing,
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
    /// PSH/FIN bits of the segments merged (set in the written header).
    pub end_flags: u8,
    /// IPv4 id rule.
    pub id_rule: IdRule,
    /// When the chain is written out unless a segment comes first (`None`:
    /// closed, or a hold too long for the clock, written at the next poll).
    pub deadline: Option<Instant>,
    /// Completion facts (the first segment's; all were verified good).
    pub meta: RxMeta,
    /// How the frame is laid out in the queue's buffers.
    pub split: Split,
    /// Buffers the chain needs as it stands (counted in its queue's
    /// [`Flows::held_buffers`]).
    pub buffers: usize,
}

impl Chain {
    /// Whether a chain is open.
    pub fn is_open(&self) -> bool {
        self.segments > 0
    }

    /// Opens a chain with `frame` (a [`segment`] that does not
    /// [end a chain](Segment::ends_chain)), keeping at most `max` bytes of
    /// capacity; it is written out by `deadline` at the latest.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        &mut self,
        frame: &[u8],
        seg: Segment,
        meta: RxMeta,
        split: Split,
        max: usize,
        deadline: Option<Instant>,
    ) {
        self.buf.clear();
        // The chain grows as segments join (never past `max`).
        let _ = max;
        self.buf.extend_from_slice(frame);
        self.first = Some(seg);
        self.mss = seg.payload;
        self.next_seq = seg.seq.wrapping_add(seg.payload as u32);
        self.segments = 1;
        self.end_flags = 0;
        self.id_rule = IdRule::Open;
        self.deadline = deadline;
        self.meta = meta;
        self.split = split;
    }

    /// Opens a chain holding a whole TSO frame (a [`segment`] whose
    /// payload is over `mss`), as if its `mss`-byte segments had joined
    /// one by one: the segment count they make and the PSH/FIN of the
    /// last. It is written out at once.
    pub fn start_tso(
        &mut self,
        frame: &[u8],
        seg: Segment,
        meta: RxMeta,
        split: Split,
        mss: usize,
    ) {
        self.start(frame, seg, meta, split, frame.len(), None);
        let mss = mss.max(1);
        self.mss = mss;
        self.segments = u32::try_from(seg.payload.div_ceil(mss)).unwrap_or(u32::MAX);
        self.end_flags = seg.flags & (PSH | FIN);
    }

    /// The id rule the chain has after `seg` joins it, if its IPv4 id
    /// allows it to (always for IPv6).
    fn id_rule_with(&self, f: &Segment, seg: &Segment) -> Option<IdRule> {
        if f.v6 {
            return Some(self.id_rule);
        }
        let offset = seg.ip_id.wrapping_sub(f.ip_id);
        let rule = match self.id_rule {
            IdRule::Open if offset == 0 => IdRule::Fixed,
            IdRule::Open => IdRule::Incrementing,
            r => r,
        };
        let want = match rule {
            IdRule::Fixed => 0,
            _ => self.segments as u16,
        };
        (offset == want).then_some(rule)
    }

    /// Whether `seg` (of `frame`) belongs to the chain's flow: the same
    /// IP version and header offsets, addresses and ports.
    pub fn same_flow(&self, frame: &[u8], seg: &Segment) -> bool {
        let Some(f) = self.first else {
            return false;
        };
        if !self.is_open()
            || (f.l3_offset, f.v6, f.l4_offset) != (seg.l3_offset, seg.v6, seg.l4_offset)
        {
            return false;
        }
        let addrs = if f.v6 {
            f.l3_offset + 8..f.l3_offset + 40
        } else {
            f.l3_offset + 12..f.l3_offset + 20
        };
        let ports = f.l4_offset..f.l4_offset + 4;
        self.buf.get(addrs.clone()) == frame.get(addrs)
            && self.buf.get(ports.clone()) == frame.get(ports)
    }

    /// Whether `frame` (a [`segment`] `seg`) continues the chain: same flow
    /// and headers, the next sequence number, no longer than the first,
    /// the chain's IPv4 id rule.
    pub fn continues(&self, frame: &[u8], seg: &Segment) -> bool {
        let Some(f) = self.first else {
            return false;
        };
        if !self.is_open()
            || self.end_flags != 0
            || seg.seq != self.next_seq
            || seg.payload > self.mss
            || (f.l3_offset, f.v6, f.l4_offset, f.header_end)
                != (seg.l3_offset, seg.v6, seg.l4_offset, seg.header_end)
            || (f.flags ^ seg.flags) & !(PSH | FIN) != 0
            || self.id_rule_with(&f, seg).is_none()
        {
            return false;
        }
        let (a, b) = (&self.buf[..f.header_end], &frame[..seg.header_end]);
        let same = |r: std::ops::Range<usize>| a[r.clone()] == b[r];
        let (l3, t, end) = (f.l3_offset, f.l4_offset, f.header_end);
        // Everything but the IP length (and the IPv4 id and header
        // checksum), the TCP sequence number, flags byte (compared above)
        // and checksum.
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

    /// Appends a segment that [`continues`](Self::continues) the chain
    /// (its payload, without any Ethernet padding).
    pub fn append(&mut self, frame: &[u8], seg: &Segment) {
        if let (1, Some(f)) = (self.segments, self.first) {
            // The first frame's padding (if any) must not end up between
            // payloads.
            self.buf.truncate(f.l3_end);
            self.id_rule = self.id_rule_with(&f, seg).unwrap_or(IdRule::Fixed);
        }
        self.buf
            .extend_from_slice(&frame[seg.header_end..seg.l3_end]);
        self.next_seq = seg.seq.wrapping_add(seg.payload as u32);
        self.segments += 1;
        self.end_flags |= seg.flags & (PSH | FIN);
    }

    /// Whether the chain is complete: a segment shorter than the first, or
    /// one with PSH or FIN, ends it (GRO flushes there too).
    pub fn closed(&self, last: &Segment) -> bool {
        last.ends_chain() || last.payload < self.mss
    }

    /// Makes `buf` one valid packet: IP length of the whole, IPv4 header
    /// checksum, PSH/FIN if a merged segment had them, TCP checksum.
    /// Nothing to do for a chain of one segment (its frame is as it came).
    pub fn finish(&mut self) {
        let Some(f) = self.first else {
            return;
        };
        if self.segments < 2 {
            return;
        }
        wire::ip::fix_ip_len(&mut self.buf);
        if !f.v6 {
            wire::checksum::fill_ipv4_header(&mut self.buf[f.l3_offset..f.l3_offset + 20]);
        }
        self.buf[f.l4_offset + 13] |= self.end_flags;
        wire::checksum::fill_l4(&mut self.buf);
    }

    /// Closes the chain (its buffer's capacity stays).
    pub fn clear(&mut self) {
        self.buf.clear();
        self.first = None;
        self.segments = 0;
        self.end_flags = 0;
        self.id_rule = IdRule::Open;
        self.buffers = 0;
    }
}

/// The open chains of one RX queue, oldest first, and spare buffers.
#[derive(Debug, Clone, Default)]
pub struct Flows {
    open: Vec<Chain>,
    spare: Vec<Chain>,
}

impl Flows {
    /// Open chains.
    pub fn len(&self) -> usize {
        self.open.len()
    }

    /// No chain open.
    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    /// Buffers the open chains need together.
    pub fn held_buffers(&self) -> usize {
        self.open.iter().map(|c| c.buffers).sum()
    }

    /// The open chain of `seg`'s flow.
    pub fn find(&self, frame: &[u8], seg: &Segment) -> Option<usize> {
        self.open.iter().position(|c| c.same_flow(frame, seg))
    }

    /// Open chain `i` (oldest first).
    pub fn get_mut(&mut self, i: usize) -> Option<&mut Chain> {
        self.open.get_mut(i)
    }

    /// The earliest deadline of an open chain.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.open.iter().filter_map(|c| c.deadline).min()
    }

    /// The index of the first open chain due at `now`.
    pub fn first_due(&self, now: Instant) -> Option<usize> {
        self.open
            .iter()
            .position(|c| c.deadline.is_none_or(|d| d <= now))
    }

    /// A closed chain to start a flow in (a spare buffer when there is one).
    pub fn vacant(&mut self) -> Chain {
        self.spare.pop().unwrap_or_default()
    }

    /// Adds a chain that was [started](Chain::start); the caller made room
    /// ([`MAX_FLOWS`]).
    pub fn open(&mut self, chain: Chain) {
        self.open.push(chain);
    }

    /// Takes open chain `i` out (to write it out), keeping the order of
    /// the others.
    pub fn take(&mut self, i: usize) -> Option<Chain> {
        (i < self.open.len()).then(|| self.open.remove(i))
    }

    /// Gives back a chain that was written out, keeping its buffer if few
    /// are spare.
    pub fn recycle(&mut self, mut chain: Chain) {
        chain.clear();
        if self.spare.len() < SPARE_BUFFERS {
            self.spare.push(chain);
        }
    }

    /// Drops every chain (a reset; queues destroyed).
    pub fn clear(&mut self) {
        self.open.clear();
    }
}

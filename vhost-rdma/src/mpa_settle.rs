//! The `mpa-settle` fault action: a documented workaround for two races in
//! Linux siw's connection setup (ci/README.md), not a fault.
//!
//! An FPDU that reaches a Linux siw endpoint right behind the MPA Reply is
//! either never read (`siw_accept()` hooks the QP to the socket only after
//! sending the Reply) or fails the connect (`siw_recv_mpa_rr()` treats bytes
//! after the Reply as -EPROTO). After an MPA Reply passes on a TCP
//! connection, this holds that connection's data segments (both ways) until
//! `delay` after the Reply.
//!
//! Order matters beyond the connection: perftest `-R`, for one, ends an
//! exchange on one connection and at once connects another; a SYN that
//! overtook the held data would reach a peer not yet listening (RST). So while
//! anything is held between two IP hosts, every TCP segment between them
//! queues behind it (FIFO for the host pair, both directions), and a queue is
//! released front first as far as each segment's own settle time allows.

use crate::frame::{view, Dir, Frame, FrameView};
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};
use wire::parse::{L4Proto, L3};

/// Host pairs tracked at once (beyond: a new pair is not held, counted).
pub const MAX_SETTLE_PAIRS: usize = 4096;
/// Settling connections tracked per host pair.
pub const MAX_SETTLE_CONNS_PER_PAIR: usize = 256;
/// The key of an MPA Reply (RFC 5044 section 7.1).
const MPA_REPLY_KEY: &[u8; 16] = b"MPA ID Rep Frame";

/// What the rule needs to know about a TCP segment.
#[derive(Debug, PartialEq, Eq)]
pub struct Segment {
    /// Both IP addresses, ordered (the same for both directions).
    pub pair: Vec<u8>,
    /// Both endpoints (address + port), ordered.
    pub conn: Vec<u8>,
    /// Payload, FIN or RST: must wait during the settle time.
    pub carries: bool,
    /// The payload starts with an MPA Reply.
    pub mpa_reply: bool,
}

/// Parses an Ethernet frame as a TCP segment (IPv4 or IPv6); `None` otherwise.
pub fn tcp_segment(data: &[u8]) -> Option<Segment> {
    tcp_segment_view(&view(data), data)
}

/// [`tcp_segment`] with `p`, the parsed view of `data`.
pub fn tcp_segment_view(p: &FrameView, data: &[u8]) -> Option<Segment> {
    let l4 = p.l4.filter(|l| l.proto == L4Proto::Tcp)?;
    let o = p.l3_offset;
    let (src, dst) = match p.l3? {
        L3::V4(_) => (data.get(o + 12..o + 16)?, data.get(o + 16..o + 20)?),
        L3::V6(_) => (data.get(o + 8..o + 24)?, data.get(o + 24..o + 40)?),
    };
    let pair = if src <= dst {
        [src, dst].concat()
    } else {
        [dst, src].concat()
    };
    let a = [src, &l4.src_port.to_be_bytes()[..]].concat();
    let b = [dst, &l4.dst_port.to_be_bytes()[..]].concat();
    let conn = if a <= b { [a, b] } else { [b, a] }.concat();
    let flags = *data.get(p.l4_offset + 13)?;
    let start = p.l4_header_end()?;
    let payload = data.get(start..p.l3_end.max(start)).unwrap_or(&[]);
    Some(Segment {
        pair,
        conn,
        carries: !payload.is_empty() || flags & 0x05 != 0,
        mpa_reply: payload.starts_with(MPA_REPLY_KEY),
    })
}

#[derive(Debug)]
struct Held {
    dir: Dir,
    frame: Frame,
    /// Not before this (its connection's settle end, or when it queued).
    ready_at: Instant,
}

#[derive(Debug, Default)]
struct Pair {
    /// Connection -> end of its settle time.
    settling: HashMap<Vec<u8>, Instant>,
    held: VecDeque<Held>,
}

/// What [`SettleState::offer`] decided.
#[derive(Debug)]
pub enum Offer {
    /// Deliver now.
    Pass(Frame),
    /// Queued; when `Some`, the caller schedules a release of `pair` then
    /// (the queue was empty before).
    Held(Option<(Vec<u8>, Instant)>),
    /// Could not be tracked (a bound was reached): deliver now, count it.
    Untracked(Frame),
}

/// Per-rule state of `mpa-settle`.
#[derive(Debug, Default)]
pub struct SettleState {
    pairs: HashMap<Vec<u8>, Pair>,
}

impl SettleState {
    /// Frames held now.
    pub fn held(&self) -> usize {
        self.pairs.values().map(|p| p.held.len()).sum()
    }

    /// Offers a matched frame. `may_hold` is asked before anything is held
    /// (the caller's bound on held frames); when it says no, the frame is
    /// dropped (`Held(None)` without queuing is never returned then: the
    /// caller counts the drop).
    pub fn offer(
        &mut self,
        dir: Dir,
        frame: Frame,
        now: Instant,
        delay: Duration,
        may_hold: impl FnOnce() -> bool,
    ) -> Result<Offer, Frame> {
        let v = view(&frame.data);
        self.offer_view(dir, frame, &v, now, delay, may_hold)
    }

    /// [`offer`](Self::offer) with `v`, the parsed view of `frame.data`.
    pub fn offer_view(
        &mut self,
        dir: Dir,
        frame: Frame,
        v: &FrameView,
        now: Instant,
        delay: Duration,
        may_hold: impl FnOnce() -> bool,
    ) -> Result<Offer, Frame> {
        let Some(seg) = tcp_segment_view(v, &frame.data) else {
            return Ok(Offer::Pass(frame));
        };
        if seg.mpa_reply && !self.pairs.contains_key(&seg.pair) {
            if self.pairs.len() >= MAX_SETTLE_PAIRS {
                self.pairs
                    .retain(|_, p| !p.held.is_empty() || p.settling.values().any(|&t| t > now));
            }
            if self.pairs.len() >= MAX_SETTLE_PAIRS {
                return Ok(Offer::Untracked(frame));
            }
            self.pairs.insert(seg.pair.clone(), Pair::default());
        }
        let Some(p) = self.pairs.get_mut(&seg.pair) else {
            return Ok(Offer::Pass(frame));
        };
        let mut untracked = false;
        if seg.mpa_reply {
            if p.settling.len() >= MAX_SETTLE_CONNS_PER_PAIR {
                p.settling.retain(|_, &mut t| t > now);
            }
            if p.settling.len() < MAX_SETTLE_CONNS_PER_PAIR || p.settling.contains_key(&seg.conn) {
                let until = now + delay;
                let t = p.settling.entry(seg.conn.clone()).or_insert(until);
                *t = (*t).max(until);
            } else {
                untracked = true;
            }
        }
        let settle_end = p
            .settling
            .get(&seg.conn)
            .copied()
            .filter(|&t| t > now && seg.carries && !seg.mpa_reply);
        if p.held.is_empty() && settle_end.is_none() {
            return Ok(if untracked {
                Offer::Untracked(frame)
            } else {
                Offer::Pass(frame)
            });
        }
        if !may_hold() {
            return Err(frame);
        }
        let ready_at = settle_end.unwrap_or(now);
        let first = p.held.is_empty();
        p.held.push_back(Held {
            dir,
            frame,
            ready_at,
        });
        Ok(Offer::Held(first.then_some((seg.pair, ready_at))))
    }

    /// Takes the front of `pair`'s queue that is ready at `now`, in order;
    /// and when something stays held, when to look again.
    pub fn release(&mut self, pair: &[u8], now: Instant) -> (Vec<(Dir, Frame)>, Option<Instant>) {
        let Some(p) = self.pairs.get_mut(pair) else {
            return (Vec::new(), None);
        };
        let mut out = Vec::new();
        while p.held.front().is_some_and(|h| h.ready_at <= now) {
            if let Some(h) = p.held.pop_front() {
                out.push((h.dir, h.frame));
            }
        }
        let next = p.held.front().map(|h| h.ready_at);
        if next.is_none() {
            p.settling.retain(|_, &mut t| t > now);
            if p.settling.is_empty() {
                self.pairs.remove(pair);
            }
        }
        (out, next)
    }

    /// Takes everything held (the rule is deleted).
    pub fn drain(&mut self) -> Vec<(Dir, Frame)> {
        self.pairs
            .drain()
            .flat_map(|(_, p)| p.held.into_iter().map(|h| (h.dir, h.frame)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ethernet + IPv4 + 20-byte TCP header + payload (checksums not needed).
    fn seg(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16, flags: u8, data: &[u8]) -> Frame {
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&0x0800u16.to_be_bytes());
        let total = 20 + 20 + data.len();
        let mut ip = vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 6, 0, 0];
        ip[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        ip.extend_from_slice(&src);
        ip.extend_from_slice(&dst);
        f.extend_from_slice(&ip);
        let mut tcp = vec![0u8; 20];
        tcp[0..2].copy_from_slice(&sport.to_be_bytes());
        tcp[2..4].copy_from_slice(&dport.to_be_bytes());
        tcp[12] = 5 << 4;
        tcp[13] = flags;
        f.extend_from_slice(&tcp);
        f.extend_from_slice(data);
        Frame {
            data: f,
            ..Frame::default()
        }
    }

    const A: [u8; 4] = [10, 0, 0, 1];
    const B: [u8; 4] = [10, 0, 0, 2];
    const D: Duration = Duration::from_millis(300);

    fn reply() -> Vec<u8> {
        let mut r = MPA_REPLY_KEY.to_vec();
        r.extend_from_slice(&[0x40, 0, 0, 0]);
        r
    }

    #[test]
    fn parses_tcp_segments_and_keys_both_directions_alike() {
        let x = tcp_segment(&seg(A, B, 1, 2, 0x18, &reply()).data).unwrap();
        let y = tcp_segment(&seg(B, A, 2, 1, 0x10, &[]).data).unwrap();
        assert!(x.mpa_reply && x.carries && !y.mpa_reply && !y.carries);
        assert_eq!((x.pair, x.conn), (y.pair, y.conn));
        assert!(
            tcp_segment(&seg(A, B, 1, 2, 0x01, &[]).data)
                .unwrap()
                .carries,
            "FIN"
        );
        assert!(tcp_segment(&[0u8; 10]).is_none());
        let mut udp = seg(A, B, 1, 2, 0, &[1, 2]);
        udp.data[14 + 9] = 17;
        assert!(tcp_segment(&udp.data).is_none());
    }

    #[test]
    fn later_connections_keep_their_own_settle_time_behind_the_queue() {
        let mut s = SettleState::default();
        let t0 = Instant::now();
        let pass = |o: Result<Offer, Frame>| matches!(o, Ok(Offer::Pass(_)));
        assert!(pass(s.offer(
            Dir::Egress,
            seg(B, A, 7, 1, 0x18, &reply()),
            t0,
            D,
            || true
        )));
        let held = s.offer(Dir::Ingress, seg(A, B, 1, 7, 0x18, &[1]), t0, D, || true);
        let Ok(Offer::Held(Some((pair, at)))) = held else {
            panic!("first data not held: {held:?}")
        };
        assert_eq!(at, t0 + D);
        // A second connection's Reply 100 ms later (queued behind, for order)
        // and its data (held until its own settle end).
        let t1 = t0 + Duration::from_millis(100);
        let r2 = s.offer(Dir::Egress, seg(B, A, 8, 2, 0x18, &reply()), t1, D, || true);
        assert!(matches!(r2, Ok(Offer::Held(None))), "{r2:?}");
        let d2 = s.offer(Dir::Ingress, seg(A, B, 2, 8, 0x18, &[2]), t1, D, || true);
        assert!(matches!(d2, Ok(Offer::Held(None))));
        assert_eq!(s.held(), 3);
        // At t0 + D: the first data and the second Reply, not the second data.
        let (out, next) = s.release(&pair, t0 + D);
        assert_eq!(out.len(), 2);
        assert_eq!(next, Some(t1 + D));
        let (out, next) = s.release(&pair, t1 + D);
        assert_eq!((out.len(), next), (1, None));
        assert_eq!(s.held(), 0);
        // Settled and empty: the pair is forgotten, data passes.
        assert!(pass(s.offer(
            Dir::Ingress,
            seg(A, B, 2, 8, 0x18, &[3]),
            t1 + D,
            D,
            || true
        )));
        assert!(s.pairs.is_empty());
    }

    #[test]
    fn bounds_hold() {
        let mut s = SettleState::default();
        let t0 = Instant::now();
        for i in 0..MAX_SETTLE_PAIRS as u32 {
            let ip = (0x0a00_0000 + i).to_be_bytes();
            let o = s.offer(Dir::Egress, seg(ip, B, 7, 1, 0x18, &reply()), t0, D, || {
                true
            });
            assert!(matches!(o, Ok(Offer::Pass(_))));
        }
        // All still settling: a new pair is not tracked.
        let o = s.offer(
            Dir::Egress,
            seg([11, 0, 0, 1], B, 7, 1, 0x18, &reply()),
            t0,
            D,
            || true,
        );
        assert!(matches!(o, Ok(Offer::Untracked(_))), "{o:?}");
        // Once they settled, room is made again.
        let o = s.offer(
            Dir::Egress,
            seg([11, 0, 0, 1], B, 7, 1, 0x18, &reply()),
            t0 + D,
            D,
            || true,
        );
        assert!(matches!(o, Ok(Offer::Pass(_))));
        assert_eq!(s.pairs.len(), 1);
        // The caller's bound on held frames: refused frames come back.
        let o = s.offer(
            Dir::Ingress,
            seg(B, [11, 0, 0, 1], 1, 7, 0x18, &[1]),
            t0 + D,
            D,
            || false,
        );
        assert!(o.is_err());
    }
}

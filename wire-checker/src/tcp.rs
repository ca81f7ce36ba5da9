//! TCP connections carrying iWARP (MPA) or SMC CLC, with bounded
//! per-direction reassembly.
//!
//! A connection is followed from the first segment whose payload starts
//! with an MPA Request key or a CLC eyecatcher; its sender is direction 0.
//! The reverse direction is followed from its first payload segment. The
//! tap sees what senders emit, so bytes arrive in order except for TCP
//! retransmissions, whose already-seen bytes are skipped (and counted). A
//! segment beyond the next expected byte means the tap lost the stream: the
//! direction is marked unparsed with a `stream-unparsed` finding, as it is
//! when more than `max_stream_buffer` bytes would have to be held.
//!
//! Bytes seen again are compared with their first sighting as long as it
//! is among the direction's last `retransmit_window` bytes (kept in a ring
//! that grows with the stream up to that size): a sender that changes data
//! it already handed to TCP, or a copy of a segment recorded on a second
//! port (a capture records a frame at its sender's port and at its
//! receiver's) that differs from the first, is a `retransmit-differs`
//! finding. Older bytes seen again are counted as unchecked.

use crate::iwarp::{IwarpConn, IwarpConnView};
use crate::net::{Addr, TcpSegment, EYECATCHER_SMCD, EYECATCHER_SMCR};
use crate::smc::{ClcSession, ClcState, ClcStep, SmcLinks, SmcView};
use crate::{CheckerConfig, CheckerStats, Ctx, Findings, Protocol, Rule};
use std::collections::{HashMap, VecDeque};

type Endpoint = (Addr, u16);

#[derive(Debug)]
enum Kind {
    Iwarp(Box<IwarpConn>),
    Clc {
        session: ClcSession,
        bufs: [Vec<u8>; 2],
    },
}

#[derive(Debug, Default)]
struct Dir {
    next: Option<u32>,
    unparsed: bool,
    /// Bytes taken in order (the stream offset of the next byte).
    taken: u64,
    /// Bytes seen again (retransmitted, or recorded on another port).
    retransmitted: u64,
    /// Of those, bytes older than the window, not compared.
    unchecked: u64,
    /// Sightings whose bytes differed from the first; only the first is
    /// a finding (a changed segment is often seen again many times).
    differs: u64,
    recent: Recent,
}

/// Port names in a direction's ring: runs of (first stream offset, port),
/// at most this many kept.
const PORT_RUNS: usize = 16;

/// The last bytes taken in a TCP direction, with the ports that carried
/// them first (bounded by `retransmit_window` and [`PORT_RUNS`]).
#[derive(Debug, Default)]
struct Recent {
    bytes: VecDeque<u8>,
    ports: VecDeque<(u64, String)>,
}

/// The first difference between bytes seen again and their first sighting.
struct Difference {
    at: u64,
    now: u8,
    first: u8,
    first_port: Option<String>,
}

impl Recent {
    /// Appends the bytes at stream offsets `end - data.len() .. end`, taken
    /// from `port`; keeps the last `window`.
    fn take(&mut self, end: u64, data: &[u8], port: &str, window: usize) {
        if window == 0 || data.is_empty() {
            return;
        }
        let keep = &data[data.len().saturating_sub(window)..];
        let start = end - keep.len() as u64;
        let over = (self.bytes.len() + keep.len()).saturating_sub(window);
        self.bytes.drain(..over);
        self.bytes.extend(keep);
        if self.ports.back().is_none_or(|(_, p)| p != port) {
            if self.ports.len() >= PORT_RUNS {
                self.ports.pop_front();
            }
            self.ports.push_back((start, port.to_string()));
        }
        // Runs wholly before the window go (the one the window starts in stays).
        let base = end - self.bytes.len() as u64;
        while self.ports.len() > 1 && self.ports[1].0 <= base {
            self.ports.pop_front();
        }
    }

    /// Compares `data`, seen again at stream offset `at` (all before `end`,
    /// the next offset to take), with the bytes kept: the number of bytes
    /// compared and the first difference.
    fn compare(&self, end: u64, at: u64, data: &[u8]) -> (usize, Option<Difference>) {
        let base = end - self.bytes.len() as u64;
        let from = at.max(base);
        let upto = (at + data.len() as u64).min(end);
        if from >= upto {
            return (0, None);
        }
        let n = (upto - from) as usize;
        let (k0, d0) = ((from - base) as usize, (from - at) as usize);
        let diff = (0..n)
            .find(|&i| self.bytes[k0 + i] != data[d0 + i])
            .map(|i| {
                let x = from + i as u64;
                Difference {
                    at: x,
                    now: data[d0 + i],
                    first: self.bytes[k0 + i],
                    first_port: self
                        .ports
                        .iter()
                        .rev()
                        .find(|(s, _)| *s <= x)
                        .map(|(_, p)| p.clone()),
                }
            });
        (n, diff)
    }
}

#[derive(Debug)]
struct Conn {
    id: u64,
    client: Endpoint,
    server: Endpoint,
    last_ts: u64,
    dirs: [Dir; 2],
    kind: Kind,
}

impl Conn {
    fn name(&self) -> String {
        let tag = match self.kind {
            Kind::Iwarp(_) => "iwarp",
            Kind::Clc { .. } => "smc",
        };
        format!(
            "{tag}#{} {} <-> {}",
            self.id,
            ep(self.client),
            ep(self.server)
        )
    }

    fn dir_name(&self, d: usize) -> String {
        let (a, b) = if d == 0 {
            (self.client, self.server)
        } else {
            (self.server, self.client)
        };
        format!("{} -> {}", ep(a), ep(b))
    }
}

fn ep((a, p): Endpoint) -> String {
    match a {
        Addr::V6(_) => format!("[{a}]:{p}"),
        _ => format!("{a}:{p}"),
    }
}

fn key(a: Endpoint, b: Endpoint) -> (Endpoint, Endpoint) {
    if a <= b {
        (a, b)
    } else {
        (b, a)
    }
}

/// All followed TCP connections.
#[derive(Debug)]
pub(crate) struct TcpTable {
    cfg: CheckerConfig,
    conns: HashMap<(Endpoint, Endpoint), Conn>,
    next_id: u64,
    evicted: u64,
    /// Address pairs that negotiated SMC-R (read by the RoCE side).
    pub(crate) smc_links: SmcLinks,
}

impl TcpTable {
    pub(crate) fn new(cfg: CheckerConfig) -> Self {
        TcpTable {
            cfg,
            conns: HashMap::new(),
            next_id: 1,
            evicted: 0,
            smc_links: SmcLinks::default(),
        }
    }

    pub(crate) fn evicted(&self) -> u64 {
        self.evicted
    }

    pub(crate) fn tracks_any(&self) -> bool {
        !self.conns.is_empty()
    }

    pub(crate) fn on_segment(
        &mut self,
        ctx: Ctx<'_>,
        seg: &TcpSegment<'_>,
        findings: &mut Findings,
        stats: &mut CheckerStats,
    ) {
        let (src, dst) = ((seg.src, seg.sport), (seg.dst, seg.dport));
        let k = key(src, dst);
        if !self.conns.contains_key(&k) {
            let p = seg.payload;
            let kind = if p.starts_with(b"MPA ID Req Frame") {
                Kind::Iwarp(Box::new(IwarpConn::new()))
            } else if p.starts_with(&EYECATCHER_SMCR) || p.starts_with(&EYECATCHER_SMCD) {
                Kind::Clc {
                    session: ClcSession::default(),
                    bufs: [Vec::new(), Vec::new()],
                }
            } else {
                return;
            };
            if self.conns.len() >= self.cfg.max_flows.max(1) {
                if let Some(old) = self
                    .conns
                    .iter()
                    .min_by_key(|(_, c)| c.last_ts)
                    .map(|(k, _)| *k)
                {
                    self.conns.remove(&old);
                    self.evicted += 1;
                }
            }
            self.conns.insert(
                k,
                Conn {
                    id: self.next_id,
                    client: src,
                    server: dst,
                    last_ts: ctx.ts_ns,
                    dirs: [Dir::default(), Dir::default()],
                    kind,
                },
            );
            self.next_id += 1;
        }
        let Some(c) = self.conns.get_mut(&k) else {
            return;
        };
        c.last_ts = ctx.ts_ns;
        let d = usize::from(src != c.client);
        let max_buf = self.cfg.max_stream_buffer;
        let window = self.cfg.retransmit_window;
        let mut pending: Vec<(Rule, u64, String)> = Vec::new();
        let dir = &mut c.dirs[d];
        if dir.unparsed || seg.payload.is_empty() {
            return;
        }
        let next = *dir.next.get_or_insert(seg.seq);
        let off = seg.seq.wrapping_sub(next) as i32;
        let data = if off > 0 {
            dir.unparsed = true;
            pending.push((
                Rule::StreamUnparsed,
                dir.taken,
                format!("{off} bytes of the stream never seen by the tap; not parsed from here"),
            ));
            &[][..]
        } else {
            let skip = off.unsigned_abs() as usize;
            let again = skip.min(seg.payload.len());
            dir.retransmitted += again as u64;
            // Seen again: stream offsets taken - skip .. (before taken).
            let at = dir.taken.saturating_sub(skip as u64);
            let lost = (skip as u64).saturating_sub(dir.taken) as usize;
            let old = seg.payload.get(lost.min(again)..again).unwrap_or(&[]);
            let (n, diff) = dir.recent.compare(dir.taken, at, old);
            dir.unchecked += (again - n) as u64;
            if diff.is_some() {
                dir.differs += 1;
            }
            if let Some(x) = diff.filter(|_| dir.differs == 1) {
                let first = x
                    .first_port
                    .map(|p| format!(" (first on port {p})"))
                    .unwrap_or_default();
                pending.push((
                    Rule::RetransmitDiffers,
                    x.at,
                    format!(
                        "TCP seq {:#010x}: {again} bytes seen again differ from their first sighting{first} at stream byte {}: {:#04x}, first {:#04x} (later differences in this direction not reported)",
                        seg.seq, x.at, x.now, x.first
                    ),
                ));
            }
            if skip >= seg.payload.len() {
                &[][..]
            } else {
                &seg.payload[skip..]
            }
        };
        if !data.is_empty() {
            dir.next = Some(next.wrapping_add(data.len() as u32));
            dir.taken += data.len() as u64;
            dir.recent.take(dir.taken, data, ctx.port, window);
        }
        let taken_before = dir.taken - data.len() as u64;
        let mut confirmed = false;
        if !data.is_empty() {
            match &mut c.kind {
                Kind::Iwarp(iw) => {
                    if iw.buffered(d) + data.len() > max_buf {
                        iw.kill(d);
                        pending.push((
                            Rule::StreamUnparsed,
                            taken_before,
                            format!("more than {max_buf} bytes would have to be buffered; not parsed from here"),
                        ));
                    } else {
                        iw.feed(d, data, &mut pending);
                    }
                    if iw.dead(d) {
                        c.dirs[d].unparsed = true;
                    }
                }
                Kind::Clc { session, bufs } => {
                    let buf = &mut bufs[d];
                    // Offset of buf[0] in the stream.
                    let base = taken_before - buf.len() as u64;
                    if buf.len() + data.len() > max_buf {
                        c.dirs[d].unparsed = true;
                        pending.push((
                            Rule::StreamUnparsed,
                            taken_before,
                            "CLC message longer than the buffer; not parsed from here".into(),
                        ));
                    } else if matches!(
                        session.state,
                        ClcState::Confirmed | ClcState::Declined | ClcState::Broken
                    ) {
                        // Handshake over: SMC moved to RDMA, or TCP fallback data.
                    } else {
                        buf.extend_from_slice(data);
                        let mut used = 0;
                        loop {
                            match session.step(&buf[used..], d == 0) {
                                ClcStep::NeedMore => break,
                                ClcStep::Message(n) => {
                                    used += n;
                                    if session.state == ClcState::Confirmed && !session.smcd {
                                        confirmed = true;
                                    }
                                    if matches!(
                                        session.state,
                                        ClcState::Confirmed | ClcState::Declined
                                    ) {
                                        break;
                                    }
                                }
                                ClcStep::Broken(rule, detail) => {
                                    pending.push((rule, base + used as u64, detail));
                                    session.state = ClcState::Broken;
                                    break;
                                }
                            }
                        }
                        buf.drain(..used);
                        if matches!(
                            session.state,
                            ClcState::Confirmed | ClcState::Declined | ClcState::Broken
                        ) {
                            bufs[0] = Vec::new();
                            bufs[1] = Vec::new();
                        }
                    }
                }
            }
        }
        if confirmed {
            self.smc_links.add_pair(c.client.0, c.server.0);
        }
        if pending.is_empty() {
            return;
        }
        let protocol = match c.kind {
            Kind::Iwarp(_) => Protocol::Iwarp,
            Kind::Clc { .. } => Protocol::SmcClc,
        };
        let (connection, direction) = (c.name(), c.dir_name(d));
        for (rule, seq, detail) in pending {
            if rule == Rule::StreamUnparsed {
                stats.streams_unparsed += 1;
            }
            let mut f = ctx.finding(protocol, &connection, &direction, rule, detail);
            f.seq = Some(seq);
            findings.push(stats, f);
        }
    }

    pub(crate) fn iwarp_view(&self) -> Vec<IwarpConnView> {
        let mut v: Vec<_> = self
            .conns
            .values()
            .filter_map(|c| match &c.kind {
                Kind::Iwarp(iw) => {
                    let mut v = iw.view(c.name(), [c.dir_name(0), c.dir_name(1)]);
                    for (dv, d) in v.dirs.iter_mut().zip(&c.dirs) {
                        dv.retransmitted = d.retransmitted;
                        dv.retransmit_unchecked = d.unchecked;
                        dv.retransmit_differs = d.differs;
                    }
                    Some((c.id, v))
                }
                _ => None,
            })
            .collect();
        v.sort_by_key(|(id, _)| *id);
        v.into_iter().map(|(_, x)| x).collect()
    }

    pub(crate) fn smc_view(&self) -> Vec<SmcView> {
        let mut v: Vec<_> = self
            .conns
            .values()
            .filter_map(|c| match &c.kind {
                Kind::Clc { session, .. } => Some((c.id, session.view(c.name()))),
                _ => None,
            })
            .collect();
        v.sort_by_key(|(id, _)| *id);
        v.into_iter().map(|(_, x)| x).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::Recent;

    #[test]
    fn recent_keeps_the_window_and_the_ports_that_carried_it() {
        let mut r = Recent::default();
        r.take(4, b"abcd", "p0", 6);
        r.take(8, b"efgh", "p1", 6);
        assert_eq!(r.bytes.iter().copied().collect::<Vec<_>>(), b"cdefgh");
        // The p0 run still covers stream bytes 2-3.
        assert_eq!(r.ports.len(), 2);
        let (n, d) = r.compare(8, 0, b"abcdXfgh");
        assert_eq!(n, 6, "bytes 0-1 left the window");
        let d = d.unwrap();
        assert_eq!((d.at, d.now, d.first), (4, b'X', b'e'));
        assert_eq!(d.first_port.as_deref(), Some("p1"));
        let (_, d) = r.compare(8, 2, b"C");
        assert_eq!(d.unwrap().first_port.as_deref(), Some("p0"));
        // A take larger than the window keeps its tail only; old runs go.
        r.take(18, b"0123456789", "p2", 6);
        assert_eq!(r.bytes.iter().copied().collect::<Vec<_>>(), b"456789");
        assert_eq!(r.ports.len(), 1);
        let (n, d) = r.compare(18, 12, b"456789");
        assert_eq!(n, 6);
        assert!(d.is_none());
    }

    #[test]
    fn recent_port_runs_are_bounded() {
        let mut r = Recent::default();
        for i in 0..100u64 {
            r.take(i + 1, b"x", if i % 2 == 0 { "a" } else { "b" }, 1000);
        }
        assert_eq!(r.bytes.len(), 100);
        assert_eq!(r.ports.len(), super::PORT_RUNS);
        // Bytes older than the oldest run: compared, their port unknown.
        let (n, d) = r.compare(100, 0, b"y");
        assert_eq!(n, 1);
        assert_eq!(d.unwrap().first_port, None);
    }
}

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

use crate::iwarp::{IwarpConn, IwarpConnView};
use crate::net::{Addr, TcpSegment, EYECATCHER_SMCD, EYECATCHER_SMCR};
use crate::smc::{ClcSession, ClcState, ClcStep, SmcLinks, SmcView};
use crate::{CheckerConfig, CheckerStats, Ctx, Findings, Protocol, Rule};
use std::collections::HashMap;

type Endpoint = (Addr, u16);

#[derive(Debug)]
enum Kind {
    Iwarp(Box<IwarpConn>),
    Clc {
        session: ClcSession,
        bufs: [Vec<u8>; 2],
    },
}

#[derive(Debug, Default, Clone, Copy)]
struct Dir {
    next: Option<u32>,
    unparsed: bool,
    /// Bytes taken in order (the stream offset of the next byte).
    taken: u64,
    retransmitted: u64,
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
                    dirs: [Dir::default(); 2],
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
            if skip >= seg.payload.len() {
                dir.retransmitted += seg.payload.len() as u64;
                return;
            }
            dir.retransmitted += skip as u64;
            &seg.payload[skip..]
        };
        if !data.is_empty() {
            dir.next = Some(next.wrapping_add(data.len() as u32));
            dir.taken += data.len() as u64;
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
                Kind::Iwarp(iw) => Some((c.id, iw.view(c.name(), [c.dir_name(0), c.dir_name(1)]))),
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

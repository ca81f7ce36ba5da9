//! RoCEv2 connections and their rules.
//!
//! **Flow keys.** A *half* is one direction of a queue-pair connection,
//! keyed by (source address, destination address, destination QPN). It
//! carries two PSN spaces: the requests of the source's send queue, and the
//! responses (ACK, NAK, read responses, atomic ACKs) the source sends for
//! the peer's requests. A *connection* pairs half A->B (QPN y) with half
//! B->A (QPN x). BTH carries no source QPN, so halves are paired by their
//! responses: the first response on an unpaired half B->A is matched to the
//! unpaired halves A->B whose request window (first PSN seen .. next PSN)
//! contains the response PSN; exactly one match pairs them, otherwise the
//! half stays unpaired and is tried again on later responses. Until a half
//! is paired, rules that need the peer (ACK range, read-response range) are
//! not applied.
//!
//! **PSN rules** (PROTOCOLS.md 1.6, `roce_model::psn`). A request whose PSN
//! equals the next expected PSN is new; one before it is a retransmission
//! (counted, not reported: rxe retransmits go-back-N from the NAK PSN or on
//! timeout); one after it is a `psn-gap` finding, after which the checker
//! resynchronises on the new PSN. An RDMA READ request consumes
//! `ceil(len/PMTU)` PSNs; while the PMTU is not known yet (it is learnt
//! from FIRST/MIDDLE payload sizes on either half) the next request may
//! land anywhere in the range the possible PMTUs allow.
//!
//! **Frames with a bad ICRC** are reported (`icrc`) and then still examined:
//! the checker taps frames as their sender emitted them, so a bad ICRC is a
//! sender bug, not line noise, and the headers are the sender's.

use crate::net::{roce_parts, Addr};
use crate::smc::{add_link_gid, SmcHalf, SmcHalfView, SmcLinks};
use crate::{CheckerStats, Ctx, Findings, Protocol, Rule};
use roce_model::{
    AethSyndrome, IbFrame, NakCode, NetLayer, OpKind, Opcode, Position, Psn, RoceFrame, RocePacket,
    Transport,
};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, VecDeque};

/// Read/atomic requests remembered per half (responder resources in rxe
/// are at most 128; the newest 64 are enough to check replays).
const READS_KEPT: usize = 64;
/// A request PSN this far from the expected one (either way) is taken as a
/// new connection reusing the QPN (RDMA CM picks a random start PSN), not
/// as a gap or a retransmission.
pub const RESTART_DISTANCE: u32 = 1 << 20;
/// Valid path MTUs.
const PMTUS: [u32; 5] = [256, 512, 1024, 2048, 4096];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct HalfKey {
    src: Addr,
    dst: Addr,
    dqpn: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Msg {
    /// Joined mid-stream: the next packet's position is not judged.
    Unknown,
    Idle,
    In {
        kind: OpKind,
        /// RETH length of a WRITE and bytes so far.
        reth_len: Option<u32>,
        bytes: u64,
    },
}

#[derive(Debug, Clone, Copy)]
struct ReadReq {
    first: Psn,
    len: u32,
    atomic: bool,
    done: bool,
}

#[derive(Debug, Clone, Copy)]
struct ReadResp {
    next: Psn,
    /// The read request this response sequence started at (its first PSN).
    from_first: Option<(Psn, u32)>,
    bytes: u64,
}

#[derive(Debug)]
struct Half {
    key: HalfKey,
    id: u64,
    transport: Transport,
    port: String,
    peer: Option<usize>,
    last_ts: u64,
    packets: u64,
    bytes: u64,
    icrc_errors: u64,
    // Requests of the source's send queue.
    first_req: Option<Psn>,
    req_next: Option<Psn>,
    req_slack: u32,
    msg: Msg,
    pmtu: Option<u32>,
    requests: u64,
    messages: u64,
    retransmits: u64,
    restarts: u64,
    reads: VecDeque<ReadReq>,
    // Responses to the peer's requests.
    last_ack: Option<Psn>,
    msn: Option<u32>,
    acks: u64,
    dup_acks: u64,
    naks_seq: u64,
    naks_rnr: u64,
    naks_other: u64,
    read_responses: u64,
    rresp: Option<ReadResp>,
    pair_tries: u32,
    smc: Option<SmcHalf>,
}

impl Half {
    fn new(key: HalfKey, id: u64, transport: Transport, port: &str, ts: u64) -> Self {
        Half {
            key,
            id,
            transport,
            port: port.to_string(),
            peer: None,
            last_ts: ts,
            packets: 0,
            bytes: 0,
            icrc_errors: 0,
            first_req: None,
            req_next: None,
            req_slack: 0,
            msg: Msg::Unknown,
            pmtu: None,
            requests: 0,
            messages: 0,
            retransmits: 0,
            restarts: 0,
            reads: VecDeque::new(),
            last_ack: None,
            msn: None,
            acks: 0,
            dup_acks: 0,
            naks_seq: 0,
            naks_rnr: 0,
            naks_other: 0,
            read_responses: 0,
            rresp: None,
            pair_tries: 0,
            smc: None,
        }
    }

    /// Whether `psn` lies in the request window seen so far.
    fn in_window(&self, psn: Psn) -> bool {
        match (self.first_req, self.req_next) {
            (Some(first), Some(next)) => {
                !psn.is_before(first) && psn.is_before(next.add(self.req_slack))
            }
            _ => false,
        }
    }
}

/// One direction of a RoCE connection as [`crate::Checker::flows`] shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoceHalfView {
    /// `SRC -> DST qpN`.
    pub direction: String,
    /// Port the half was seen on.
    pub port: String,
    /// Destination QPN of this direction.
    pub dst_qpn: u32,
    /// Packets and bytes (BTH to ICRC).
    pub packets: u64,
    /// Bytes (BTH to ICRC).
    pub bytes: u64,
    /// Request packets (new and retransmitted).
    pub requests: u64,
    /// Messages completed (LAST/ONLY request packets).
    pub messages: u64,
    /// Request packets seen again (PSN before the next expected).
    pub retransmits: u64,
    /// Times the request PSN jumped by more than [`RESTART_DISTANCE`]: a
    /// new connection on the same QPN; the state started afresh.
    pub restarts: u64,
    /// Next request PSN expected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_psn: Option<u32>,
    /// Path MTU learnt from FIRST/MIDDLE payloads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pmtu: Option<u32>,
    /// READ and atomic requests not yet answered past their last PSN.
    pub outstanding_reads: usize,
    /// ACKs sent for the peer's requests.
    pub acks: u64,
    /// ACKs not after the previous one (duplicate-request answers).
    pub dup_acks: u64,
    /// NAK PSN sequence error.
    pub naks_seq: u64,
    /// RNR NAKs.
    pub naks_rnr: u64,
    /// Other NAKs (invalid request, access, operational).
    pub naks_other: u64,
    /// Read response packets.
    pub read_responses: u64,
    /// Last ACK PSN.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_ack_psn: Option<u32>,
    /// Last AETH MSN.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub msn: Option<u32>,
    /// Packets with a bad ICRC.
    pub icrc_errors: u64,
    /// SMC-R LLC/CDC state when this half carries an SMC-R link.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub smc: Option<SmcHalfView>,
}

/// A RoCE connection (one or two halves).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoceConnView {
    /// Connection id (as in findings: `roce#ID`).
    pub id: u64,
    /// `rc`, `uc`, `ud` or `cnp`.
    pub transport: String,
    /// `roce#ID A/qpX <-> B/qpY`.
    pub connection: String,
    /// Whether both halves were paired.
    pub paired: bool,
    /// Its directions.
    pub halves: Vec<RoceHalfView>,
}

/// Table of RoCE halves.
#[derive(Debug)]
pub(crate) struct RoceTable {
    halves: Vec<Option<Half>>,
    free: Vec<usize>,
    index: HashMap<HalfKey, usize>,
    max_halves: usize,
    next_id: u64,
    pub(crate) evicted: u64,
}

fn qpn(q: u32) -> String {
    format!("qp{q:#x}")
}

fn transport_name(t: Transport) -> &'static str {
    match t {
        Transport::Rc => "rc",
        Transport::Uc => "uc",
        Transport::Rd => "rd",
        Transport::Ud => "ud",
        Transport::Cnp => "cnp",
    }
}

/// A finding waiting for names.
type Pending = (Rule, Option<u32>, String);

impl RoceTable {
    pub(crate) fn new(max_flows: usize) -> Self {
        RoceTable {
            halves: Vec::new(),
            free: Vec::new(),
            index: HashMap::new(),
            max_halves: max_flows.max(1).saturating_mul(2),
            next_id: 1,
            evicted: 0,
        }
    }

    fn get(&self, i: usize) -> Option<&Half> {
        self.halves.get(i).and_then(Option::as_ref)
    }

    fn get_mut(&mut self, i: usize) -> Option<&mut Half> {
        self.halves.get_mut(i).and_then(Option::as_mut)
    }

    fn connection_name(&self, i: usize) -> String {
        let Some(h) = self.get(i) else {
            return String::new();
        };
        let peer_q = h
            .peer
            .and_then(|p| self.get(p))
            .map_or("qp?".to_string(), |p| qpn(p.key.dqpn));
        // Name the connection the same way from both halves: lower address first.
        let (a, qa, b, qb) = (h.key.src, peer_q, h.key.dst, qpn(h.key.dqpn));
        if a <= b {
            format!("roce#{} {a}/{qa} <-> {b}/{qb}", h.id)
        } else {
            format!("roce#{} {b}/{qb} <-> {a}/{qa}", h.id)
        }
    }

    fn direction(key: &HalfKey) -> String {
        format!("{} -> {} {}", key.src, key.dst, qpn(key.dqpn))
    }

    fn report(
        &self,
        ctx: Ctx<'_>,
        i: usize,
        pending: Vec<Pending>,
        findings: &mut Findings,
        stats: &mut CheckerStats,
    ) {
        if pending.is_empty() {
            return;
        }
        let Some(h) = self.get(i) else { return };
        let (connection, direction) = (self.connection_name(i), Self::direction(&h.key));
        let protocol = if h.smc.is_some() {
            Protocol::SmcR
        } else {
            Protocol::Roce
        };
        for (rule, psn, detail) in pending {
            let protocol = match rule {
                Rule::LlcMessage | Rule::CdcCursor | Rule::CdcSeqno => protocol,
                _ => Protocol::Roce,
            };
            let mut f = ctx.finding(protocol, &connection, &direction, rule, detail);
            // SMC-R's CDC rules name a CDC sequence number, not a PSN.
            if matches!(rule, Rule::CdcCursor | Rule::CdcSeqno) {
                f.seq = psn.map(u64::from);
            } else {
                f.psn = psn;
            }
            findings.push(stats, f);
        }
    }

    /// The half for `key`, created (evicting the least recently seen when
    /// full) if new.
    fn half(&mut self, ctx: Ctx<'_>, key: HalfKey, t: Transport) -> usize {
        if let Some(&i) = self.index.get(&key) {
            return i;
        }
        if self.index.len() >= self.max_halves {
            let oldest = self
                .halves
                .iter()
                .enumerate()
                .filter_map(|(i, h)| h.as_ref().map(|h| (h.last_ts, i)))
                .min()
                .map(|(_, i)| i);
            if let Some(o) = oldest {
                self.remove(o);
                self.evicted += 1;
            }
        }
        let h = Half::new(key, self.next_id, t, ctx.port, ctx.ts_ns);
        self.next_id += 1;
        let i = match self.free.pop() {
            Some(i) => {
                self.halves[i] = Some(h);
                i
            }
            None => {
                self.halves.push(Some(h));
                self.halves.len() - 1
            }
        };
        self.index.insert(key, i);
        i
    }

    fn remove(&mut self, i: usize) {
        if let Some(h) = self.halves.get_mut(i).and_then(Option::take) {
            self.index.remove(&h.key);
            self.free.push(i);
            if let Some(p) = h.peer.and_then(|p| self.get_mut(p)) {
                p.peer = None;
            }
        }
    }

    pub(crate) fn on_frame(
        &mut self,
        ctx: Ctx<'_>,
        frame: &[u8],
        findings: &mut Findings,
        stats: &mut CheckerStats,
        smc: &mut SmcLinks,
    ) {
        match RoceFrame::parse(frame) {
            Ok(f) => {
                let (src, dst) = match f.net {
                    NetLayer::Ipv4 { ip, .. } => (Addr::V4(ip.src), Addr::V4(ip.dst)),
                    NetLayer::Ipv6 { ip, .. } => (Addr::V6(ip.src), Addr::V6(ip.dst)),
                    NetLayer::Grh { grh, .. } => (Addr::V6(grh.src), Addr::V6(grh.dst)),
                };
                let icrc = f.verify_icrc().err().map(|e| e.to_string());
                let is_smc = smc.contains(src, dst);
                if is_smc && icrc.is_none() && matches!(f.packet.bth.opcode, Opcode::RcSendOnly) {
                    if let Some(gid) = add_link_gid(f.packet.payload) {
                        smc.on_add_link(src, dst, gid);
                    }
                }
                self.packet(ctx, src, dst, &f.packet, icrc, is_smc, findings, stats);
            }
            Err(e) => {
                if let Some((src, dst, bth)) = roce_parts(frame) {
                    self.malformed(ctx, src, dst, bth, &e.to_string(), findings, stats);
                }
            }
        }
    }

    pub(crate) fn on_ib(
        &mut self,
        ctx: Ctx<'_>,
        packet: &[u8],
        findings: &mut Findings,
        stats: &mut CheckerStats,
    ) {
        match IbFrame::parse(packet) {
            Ok(f) => {
                let (src, dst) = (Addr::Lid(f.lrh.slid), Addr::Lid(f.lrh.dlid));
                let icrc = f.verify_icrc().err().map(|e| e.to_string());
                self.packet(ctx, src, dst, &f.packet, icrc, false, findings, stats);
            }
            Err(e) => {
                let (src, dst) = match packet.get(2..8) {
                    Some(b) => (
                        Addr::Lid(u16::from_be_bytes([b[4], b[5]])),
                        Addr::Lid(u16::from_be_bytes([b[0], b[1]])),
                    ),
                    None => (Addr::Lid(0), Addr::Lid(0)),
                };
                let bth = packet.get(8..).unwrap_or_default();
                self.malformed(ctx, src, dst, bth, &e.to_string(), findings, stats);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn malformed(
        &mut self,
        ctx: Ctx<'_>,
        src: Addr,
        dst: Addr,
        bth: &[u8],
        err: &str,
        findings: &mut Findings,
        stats: &mut CheckerStats,
    ) {
        let be24 = |o: usize| {
            bth.get(o..o + 3)
                .map(|b| u32::from_be_bytes([0, b[0], b[1], b[2]]))
        };
        let (dqpn, psn) = (be24(5).unwrap_or(0), be24(9));
        let key = HalfKey { src, dst, dqpn };
        let detail = format!(
            "opcode {:#04x}: {err}",
            bth.first().copied().unwrap_or_default()
        );
        match self.index.get(&key) {
            Some(&i) => self.report(
                ctx,
                i,
                vec![(Rule::Malformed, psn, detail)],
                findings,
                stats,
            ),
            None => {
                let connection = format!("roce {src} -> {dst}");
                let direction = Self::direction(&key);
                let mut f = ctx.finding(
                    Protocol::Roce,
                    &connection,
                    &direction,
                    Rule::Malformed,
                    detail,
                );
                f.psn = psn;
                findings.push(stats, f);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn packet(
        &mut self,
        ctx: Ctx<'_>,
        src: Addr,
        dst: Addr,
        p: &RocePacket<'_>,
        icrc_err: Option<String>,
        is_smc: bool,
        findings: &mut Findings,
        stats: &mut CheckerStats,
    ) {
        let t = p.bth.opcode.transport();
        let key = HalfKey {
            src,
            dst,
            dqpn: p.bth.dest_qp,
        };
        let i = self.half(ctx, key, t);
        let psn = Psn::new(p.bth.psn);
        let mut pending: Vec<Pending> = Vec::new();
        {
            let Some(h) = self.get_mut(i) else { return };
            h.last_ts = ctx.ts_ns;
            h.packets += 1;
            h.bytes += p.raw.len() as u64;
            if let Some(e) = icrc_err {
                h.icrc_errors += 1;
                pending.push((
                    Rule::Icrc,
                    Some(psn.value()),
                    format!("{}: {e}", p.info().name),
                ));
            }
        }
        let info = p.info();
        match t {
            Transport::Cnp | Transport::Rd => {}
            Transport::Ud => {
                if p.payload.len() > 4096 {
                    pending.push((
                        Rule::PayloadLength,
                        Some(psn.value()),
                        format!("{} payload {} exceeds 4096", info.name, p.payload.len()),
                    ));
                }
            }
            Transport::Rc | Transport::Uc => {
                if info.is_request() {
                    self.request(i, p, is_smc, &mut pending);
                } else if info.is_response() {
                    self.response(i, p, &mut pending);
                }
            }
        }
        self.report(ctx, i, pending, findings, stats);
    }

    /// PMTU of the connection of half `i` (either half may have learnt it).
    fn pmtu(&self, i: usize) -> Option<u32> {
        let h = self.get(i)?;
        h.pmtu
            .or_else(|| h.peer.and_then(|p| self.get(p)).and_then(|p| p.pmtu))
    }

    fn set_pmtu(&mut self, i: usize, m: u32) {
        let peer = self.get_mut(i).and_then(|h| {
            h.pmtu = Some(m);
            h.peer
        });
        if let Some(p) = peer.and_then(|p| self.get_mut(p)) {
            p.pmtu = Some(m);
        }
    }

    /// Payload length rules for FIRST/MIDDLE (= PMTU) and LAST/ONLY
    /// (<= PMTU); learns the PMTU.
    fn check_len(
        &mut self,
        i: usize,
        name: &str,
        pos: Position,
        len: usize,
        psn: Psn,
        pending: &mut Vec<Pending>,
    ) {
        let pmtu = self.pmtu(i);
        let len32 = len as u32;
        match pos {
            Position::First | Position::Middle => {
                if !PMTUS.contains(&len32) {
                    pending.push((
                        Rule::PayloadLength,
                        Some(psn.value()),
                        format!("{name} carries {len} bytes, not a path MTU (256..4096)"),
                    ));
                } else if let Some(m) = pmtu.filter(|&m| m != len32) {
                    pending.push((
                        Rule::PayloadLength,
                        Some(psn.value()),
                        format!("{name} carries {len} bytes, path MTU is {m}"),
                    ));
                } else if pmtu.is_none() {
                    self.set_pmtu(i, len32);
                }
            }
            Position::Last | Position::Only => {
                let max = pmtu.unwrap_or(4096);
                if len32 > max {
                    pending.push((
                        Rule::PayloadLength,
                        Some(psn.value()),
                        format!("{name} carries {len} bytes, more than the path MTU {max}"),
                    ));
                }
            }
        }
    }

    /// Half `i` starts a new incarnation of its connection: forget its
    /// request state, and unpair it (the peer's response state goes too).
    fn restart(&mut self, i: usize) {
        let peer = self.get_mut(i).and_then(|h| {
            h.restarts += 1;
            h.first_req = None;
            h.req_next = None;
            h.req_slack = 0;
            h.msg = Msg::Unknown;
            h.pmtu = None;
            h.reads.clear();
            h.pair_tries = 0;
            h.peer.take()
        });
        if let Some(p) = peer.and_then(|p| self.get_mut(p)) {
            p.peer = None;
            p.pair_tries = 0;
            p.last_ack = None;
            p.msn = None;
            p.rresp = None;
        }
    }

    fn request(&mut self, i: usize, p: &RocePacket<'_>, is_smc: bool, pending: &mut Vec<Pending>) {
        let info = p.info();
        let psn = Psn::new(p.bth.psn);
        let far = self
            .get(i)
            .and_then(|h| h.req_next)
            .is_some_and(|n| psn.diff(n).unsigned_abs() > RESTART_DISTANCE);
        if far {
            self.restart(i);
        }
        let pmtu = self.pmtu(i);
        let Some(h) = self.get_mut(i) else { return };
        h.requests += 1;
        if h.first_req.is_none() {
            h.first_req = Some(psn);
        }
        let new = match h.req_next {
            None => true,
            Some(next) => {
                let d = psn.diff(next);
                if d < 0 {
                    h.retransmits += 1;
                    false
                } else {
                    if d as u32 > h.req_slack {
                        pending.push((
                            Rule::PsnGap,
                            Some(psn.value()),
                            format!(
                                "{} with PSN {psn}, expected {next}: {} PSN(s) skipped",
                                info.name,
                                d as u32 - h.req_slack
                            ),
                        ));
                    }
                    true
                }
            }
        };
        // Remember READ / atomic requests, also retransmitted ones (the
        // responder replays their responses).
        let is_read = info.kind == OpKind::ReadRequest;
        let is_atomic = info.kind == OpKind::Atomic;
        if is_read || is_atomic {
            let len = if is_read {
                p.ext.reth.map_or(0, |r| r.len)
            } else {
                8
            };
            if let Some(r) = h.reads.iter_mut().find(|r| r.first == psn) {
                r.len = len;
                r.done = false;
            } else {
                if h.reads.len() >= READS_KEPT {
                    h.reads.pop_front();
                }
                h.reads.push_back(ReadReq {
                    first: psn,
                    len,
                    atomic: is_atomic,
                    done: false,
                });
            }
        }
        if !new {
            return;
        }
        // Opcode sequencing (responder check_op_seq), new packets only.
        let pos = info.position;
        let seq_err = match h.msg {
            Msg::Unknown => None,
            Msg::Idle => matches!(pos, Position::Middle | Position::Last)
                .then(|| format!("{} without a FIRST", info.name)),
            Msg::In { kind, .. } => (!(info.kind == kind
                && matches!(pos, Position::Middle | Position::Last)))
            .then(|| {
                format!(
                    "{} inside an unfinished {} message",
                    info.name,
                    if kind == OpKind::Send {
                        "SEND"
                    } else {
                        "RDMA WRITE"
                    }
                )
            }),
        };
        let broken = seq_err.is_some();
        if let Some(s) = seq_err {
            pending.push((Rule::OpcodeSequence, Some(psn.value()), s));
        }
        let len = p.payload.len();
        // WRITE totals against the RETH length.
        let mut write_total: Option<(u64, u32)> = None;
        h.msg = match pos {
            Position::First => Msg::In {
                kind: info.kind,
                reth_len: p.ext.reth.map(|r| r.len),
                bytes: len as u64,
            },
            Position::Middle => match h.msg {
                Msg::In {
                    kind,
                    reth_len,
                    bytes,
                } if kind == info.kind => Msg::In {
                    kind,
                    reth_len,
                    bytes: bytes + len as u64,
                },
                _ => Msg::In {
                    kind: info.kind,
                    reth_len: None,
                    bytes: len as u64,
                },
            },
            Position::Last | Position::Only => {
                if info.kind == OpKind::Write {
                    let (reth, before) = match (pos, h.msg) {
                        (Position::Only, _) => (p.ext.reth.map(|r| r.len), 0),
                        (
                            _,
                            Msg::In {
                                kind: OpKind::Write,
                                reth_len,
                                bytes,
                            },
                        ) => (reth_len, bytes),
                        _ => (None, 0),
                    };
                    if let Some(r) = reth {
                        write_total = Some((before + len as u64, r));
                    }
                }
                Msg::Idle
            }
        };
        if broken {
            // Judge the packets after a sequence error afresh, not as a cascade.
            h.msg = Msg::Unknown;
        }
        if let Some(r) = p.ext.reth.filter(|r| r.len > 1 << 31) {
            pending.push((
                Rule::PayloadLength,
                Some(psn.value()),
                format!("{} RETH length {} exceeds 2^31", info.name, r.len),
            ));
        }
        if let Some((got, want)) = write_total.filter(|&(g, w)| g != u64::from(w)) {
            pending.push((
                Rule::PayloadLength,
                Some(psn.value()),
                format!("RDMA WRITE message carried {got} bytes, RETH length {want}"),
            ));
        }
        // PSNs this packet consumes.
        let (consumed, slack) = if is_read {
            let rlen = u64::from(p.ext.reth.map_or(0, |r| r.len));
            match pmtu {
                Some(m) => (Psn::packets_for(rlen, m), 0),
                None => {
                    let lo = Psn::packets_for(rlen, 4096);
                    (lo, Psn::packets_for(rlen, 256) - lo)
                }
            }
        } else {
            (1, 0)
        };
        h.req_next = Some(psn.add(consumed));
        h.req_slack = slack;
        if pos.ends() {
            h.messages += 1;
        }
        if is_smc && matches!(p.bth.opcode, Opcode::RcSendOnly) {
            h.smc
                .get_or_insert_with(SmcHalf::default)
                .on_send(p.payload, pending);
        }
        if matches!(info.kind, OpKind::Send | OpKind::Write) {
            self.check_len(i, info.name, pos, len, psn, pending);
        }
    }

    /// Pairs response half `i` with the one unpaired reverse half whose
    /// request window holds `psn`.
    fn try_pair(&mut self, i: usize, psn: Psn) {
        let Some(h) = self.get_mut(i) else { return };
        h.pair_tries += 1;
        // Try the first responses, then only now and then: a half whose
        // requester is never seen must not cost a table scan per packet.
        if h.pair_tries > 16 && h.pair_tries % 256 != 0 {
            return;
        }
        let key = h.key;
        let mut found = None;
        for (j, c) in self.halves.iter().enumerate() {
            let Some(c) = c else { continue };
            if j == i || c.peer.is_some() || c.key.src != key.dst || c.key.dst != key.src {
                continue;
            }
            if c.in_window(psn) {
                if found.is_some() {
                    return; // ambiguous
                }
                found = Some(j);
            }
        }
        let Some(j) = found else { return };
        let id = {
            let (a, b) = (self.get(i).map(|h| h.id), self.get(j).map(|h| h.id));
            a.min(b).unwrap_or(0)
        };
        let pm = self.get(i).and_then(|h| h.pmtu);
        if let Some(c) = self.get_mut(j) {
            c.peer = Some(i);
            c.id = id;
            c.pmtu = c.pmtu.or(pm);
        }
        let pm = self.get(j).and_then(|h| h.pmtu);
        if let Some(h) = self.get_mut(i) {
            h.peer = Some(j);
            h.id = id;
            h.pmtu = h.pmtu.or(pm);
        }
    }

    fn response(&mut self, i: usize, p: &RocePacket<'_>, pending: &mut Vec<Pending>) {
        let info = p.info();
        let psn = Psn::new(p.bth.psn);
        if self.get(i).is_some_and(|h| h.peer.is_none()) {
            self.try_pair(i, psn);
        }
        let pmtu = self.pmtu(i);
        let Some(peer) = self.get(i).and_then(|h| h.peer) else {
            // Unpaired: count only.
            self.count_response(i, p, pending);
            return;
        };
        // What the requester (the peer half) has sent.
        let (limit, reads, peer_pmtu_reads) = match self.get(peer) {
            Some(r) => (
                r.req_next.map(|n| n.add(r.req_slack)),
                r.reads.clone(),
                r.pmtu.or(pmtu),
            ),
            None => (None, VecDeque::new(), pmtu),
        };
        let first_seen = self.get(peer).and_then(|r| r.first_req);
        let before_watch = first_seen.is_some_and(|f| psn.is_before(f));
        match info.kind {
            OpKind::Ack | OpKind::AtomicAck => {
                if let Some(l) = limit.filter(|l| !psn.is_before(*l) && !before_watch) {
                    pending.push((
                        Rule::AckPsnRange,
                        Some(psn.value()),
                        format!(
                            "{} for PSN {psn}, the requester's next PSN is {l}: never sent",
                            info.name
                        ),
                    ));
                }
            }
            OpKind::ReadResponse => {
                let pkts = |r: &ReadReq| {
                    if r.atomic {
                        1
                    } else {
                        Psn::packets_for(u64::from(r.len), peer_pmtu_reads.unwrap_or(256))
                    }
                };
                let hit = reads
                    .iter()
                    .rev()
                    .find(|r| {
                        !r.atomic && !psn.is_before(r.first) && psn.is_before(r.first.add(pkts(r)))
                    })
                    .copied();
                if hit.is_none() && !before_watch && first_seen.is_some() {
                    pending.push((
                        Rule::ReadResponseRange,
                        Some(psn.value()),
                        format!(
                            "{} PSN {psn} is outside every outstanding RDMA READ request",
                            info.name
                        ),
                    ));
                }
                // Sequencing and totals.
                let pos = info.position;
                let len = p.payload.len();
                let Some(h) = self.get_mut(i) else { return };
                match pos {
                    Position::First | Position::Only => {
                        let from_first = hit.filter(|r| r.first == psn).map(|r| (r.first, r.len));
                        h.rresp = Some(ReadResp {
                            next: psn.next(),
                            from_first,
                            bytes: len as u64,
                        });
                    }
                    Position::Middle | Position::Last => match h.rresp.as_mut() {
                        Some(r) if r.next == psn => {
                            r.next = psn.next();
                            r.bytes += len as u64;
                        }
                        _ => {
                            pending.push((
                                Rule::OpcodeSequence,
                                Some(psn.value()),
                                format!("{} without a matching read response FIRST", info.name),
                            ));
                            h.rresp = None;
                        }
                    },
                }
                if pos.ends() {
                    if let Some(ReadResp {
                        from_first: Some((_, want)),
                        bytes,
                        ..
                    }) = h.rresp.take()
                    {
                        if bytes != u64::from(want) {
                            pending.push((
                                Rule::PayloadLength,
                                Some(psn.value()),
                                format!("RDMA READ response carried {bytes} bytes, the request asked for {want}"),
                            ));
                        }
                    }
                }
                self.check_len(i, info.name, pos, len, psn, pending);
            }
            _ => {}
        }
        self.count_response(i, p, pending);
        // Retire reads and atomics answered past their last PSN.
        if matches!(info.kind, OpKind::Ack | OpKind::AtomicAck) || info.position.ends() {
            let m = self.pmtu(i);
            if let Some(r) = self.get_mut(peer) {
                for rr in r.reads.iter_mut() {
                    let n = if rr.atomic {
                        1
                    } else {
                        Psn::packets_for(u64::from(rr.len), m.unwrap_or(256))
                    };
                    if !psn.is_before(rr.first.add(n - 1)) {
                        rr.done = true;
                    }
                }
            }
        }
    }

    /// ACK/NAK/MSN counters and the MSN rule.
    fn count_response(&mut self, i: usize, p: &RocePacket<'_>, pending: &mut Vec<Pending>) {
        let info = p.info();
        let psn = Psn::new(p.bth.psn);
        let Some(h) = self.get_mut(i) else { return };
        if info.kind == OpKind::ReadResponse {
            h.read_responses += 1;
        }
        let Some(aeth) = p.ext.aeth else { return };
        match aeth.syndrome {
            AethSyndrome::Ack { .. } => {
                if info.kind == OpKind::Ack {
                    h.acks += 1;
                    if h.last_ack.is_some_and(|l| !psn.is_after(l)) {
                        h.dup_acks += 1;
                    }
                }
                if h.last_ack.is_none_or(|l| psn.is_after(l)) {
                    h.last_ack = Some(psn);
                }
            }
            AethSyndrome::RnrNak { .. } => h.naks_rnr += 1,
            AethSyndrome::Nak {
                code: NakCode::PsnSequenceError,
            } => h.naks_seq += 1,
            _ => h.naks_other += 1,
        }
        if let Some(m) = h.msn {
            if Psn::new(aeth.msn).is_before(Psn::new(m)) {
                pending.push((
                    Rule::MsnBackwards,
                    Some(psn.value()),
                    format!("{} MSN {} after MSN {m}", info.name, aeth.msn),
                ));
                return;
            }
        }
        h.msn = Some(aeth.msn);
    }

    pub(crate) fn view(&self) -> Vec<RoceConnView> {
        let mut out = Vec::new();
        for (i, h) in self.halves.iter().enumerate() {
            let Some(h) = h else { continue };
            if h.peer.is_some_and(|p| p < i) {
                continue; // listed with its peer
            }
            let mut halves = vec![self.half_view(h)];
            if let Some(p) = h.peer.and_then(|p| self.get(p)) {
                halves.push(self.half_view(p));
            }
            out.push(RoceConnView {
                id: h.id,
                transport: transport_name(h.transport).into(),
                connection: self.connection_name(i),
                paired: h.peer.is_some(),
                halves,
            });
        }
        out.sort_by_key(|c| c.id);
        out
    }

    fn half_view(&self, h: &Half) -> RoceHalfView {
        RoceHalfView {
            direction: Self::direction(&h.key),
            port: h.port.clone(),
            dst_qpn: h.key.dqpn,
            packets: h.packets,
            bytes: h.bytes,
            requests: h.requests,
            messages: h.messages,
            retransmits: h.retransmits,
            restarts: h.restarts,
            next_psn: h.req_next.map(Psn::value),
            pmtu: h.pmtu,
            outstanding_reads: h.reads.iter().filter(|r| !r.done).count(),
            acks: h.acks,
            dup_acks: h.dup_acks,
            naks_seq: h.naks_seq,
            naks_rnr: h.naks_rnr,
            naks_other: h.naks_other,
            read_responses: h.read_responses,
            last_ack_psn: h.last_ack.map(Psn::value),
            msn: h.msn,
            icrc_errors: h.icrc_errors,
            smc: h.smc.as_ref().map(SmcHalf::view),
        }
    }
}

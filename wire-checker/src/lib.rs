//! `wire-checker`: a passive, sans-IO protocol checker for the traffic on a
//! virtual fabric.
//!
//! Feed it Ethernet frames with [`Checker::observe`] (a timestamp, the name
//! of the port the frame was seen on, the frame bytes); it keeps a bounded
//! table of connections ([`Checker::flows`]) and a bounded ring of
//! [`Finding`]s ([`Checker::findings`]), each naming the connection, the
//! direction, the PSN or stream offset and the [`Rule`] broken.
//!
//! * RoCEv2 ([`roce`]): ICRC, opcode sequencing, PSN gaps, ACK/NAK
//!   consistency, read-response ranges, payload length rules; retransmissions,
//!   duplicate ACKs, NAKs and RNR NAKs are *counted*, not reported.
//! * iWARP ([`iwarp`]): MPA Request/Reply, FPDU framing and CRC (when
//!   negotiated) over the reassembled TCP byte stream, DDP/RDMAP header
//!   validity, MSN/MO/TO continuity, Terminate decoding.
//! * SMC-R ([`smc`]): CLC handshake decode (eyecatchers, lengths, versions,
//!   order, decline codes), LLC messages and CDC cursor monotonicity on the
//!   link's RoCE SENDs.
//!
//! Parsing uses `roce-model`'s codec (frames, BTH and extension headers,
//! ICRC, PSN arithmetic) and `siw`'s MPA/DDP/RDMAP codec. Nothing here does
//! I/O or reads a clock; all state is bounded by [`CheckerConfig`].

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod iwarp;
pub mod net;
pub mod roce;
pub mod smc;
pub mod tcp;

use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::fmt;

pub use net::{classify, Addr, Interest};

/// Limits of the checker's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", default, deny_unknown_fields)]
pub struct CheckerConfig {
    /// RoCE connections, iWARP connections and SMC-R CLC sessions tracked
    /// (each kind separately); the least recently seen is evicted.
    pub max_flows: usize,
    /// Findings kept; the oldest is dropped (and counted) when full.
    pub max_findings: usize,
    /// Bytes buffered per TCP direction while reassembling MPA or CLC; a
    /// stream that needs more is marked unparsed.
    pub max_stream_buffer: usize,
    /// Bytes of each followed TCP direction kept (the most recent ones) to
    /// compare bytes seen again against: a retransmission, or the same
    /// segment recorded on a second port. Older bytes seen again are
    /// counted unchecked. Grows with the stream up to this size; 0 turns
    /// the `retransmit-differs` rule off.
    pub retransmit_window: usize,
}

impl Default for CheckerConfig {
    fn default() -> Self {
        CheckerConfig {
            max_flows: 1024,
            max_findings: 1024,
            max_stream_buffer: 256 * 1024,
            retransmit_window: 16 * 1024,
        }
    }
}

/// The rule a finding reports as broken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Rule {
    /// RoCE: the ICRC does not match the packet as emitted.
    Icrc,
    /// RoCE: the packet does not parse (bad opcode, pad, lengths, TVer).
    Malformed,
    /// RoCE: a request PSN skips ahead of the next expected PSN.
    PsnGap,
    /// RoCE: opcode out of sequence (MIDDLE/LAST without FIRST, a new
    /// message inside another, read response MIDDLE/LAST out of place).
    OpcodeSequence,
    /// RoCE: payload length rule (FIRST/MIDDLE = PMTU, LAST/ONLY <= PMTU,
    /// WRITE or READ total = RETH length, RETH length <= 2^31).
    PayloadLength,
    /// RoCE: an ACK, NAK or atomic ACK names a PSN the requester never sent.
    AckPsnRange,
    /// RoCE: the AETH MSN went backwards.
    MsnBackwards,
    /// RoCE: a read response PSN outside every outstanding read request.
    ReadResponseRange,
    /// iWARP: the MPA Request/Reply frame is invalid or unexpected.
    MpaHandshake,
    /// iWARP: FPDU CRC mismatch (CRC negotiated).
    MpaCrc,
    /// iWARP: FPDU framing (ULPDU length) broken.
    MpaFraming,
    /// iWARP: DDP/RDMAP control word or header invalid.
    DdpHeader,
    /// iWARP: untagged queue number does not match the RDMAP opcode.
    DdpQueue,
    /// iWARP: untagged MSN out of sequence.
    DdpMsn,
    /// iWARP: message offset (MO) or tagged offset (TO) discontinuity.
    DdpOffset,
    /// iWARP: a read response does not match the outstanding read request.
    IwarpReadResponse,
    /// iWARP: a Terminate was sent (decoded layer/type/code in the detail).
    IwarpTerminate,
    /// SMC: CLC header invalid (eyecatcher, type, length, version).
    ClcHeader,
    /// SMC: CLC trailer does not repeat the eyecatcher.
    ClcTrailer,
    /// SMC: CLC messages out of order.
    ClcSequence,
    /// SMC-R: LLC message with unknown type or wrong length.
    LlcMessage,
    /// SMC-R: a CDC producer or consumer cursor moved backwards.
    CdcCursor,
    /// SMC-R: a CDC sequence number went backwards.
    CdcSeqno,
    /// TCP: the tap lost the byte stream (gap) or it outgrew the buffer;
    /// the rest of this direction is not parsed.
    StreamUnparsed,
    /// TCP: bytes seen again (a retransmission, or the same segment on
    /// another port) differ from their first sighting.
    RetransmitDiffers,
}

impl Rule {
    /// The rule's stable kebab-case name.
    pub fn name(self) -> &'static str {
        match self {
            Rule::Icrc => "icrc",
            Rule::Malformed => "malformed",
            Rule::PsnGap => "psn-gap",
            Rule::OpcodeSequence => "opcode-sequence",
            Rule::PayloadLength => "payload-length",
            Rule::AckPsnRange => "ack-psn-range",
            Rule::MsnBackwards => "msn-backwards",
            Rule::ReadResponseRange => "read-response-range",
            Rule::MpaHandshake => "mpa-handshake",
            Rule::MpaCrc => "mpa-crc",
            Rule::MpaFraming => "mpa-framing",
            Rule::DdpHeader => "ddp-header",
            Rule::DdpQueue => "ddp-queue",
            Rule::DdpMsn => "ddp-msn",
            Rule::DdpOffset => "ddp-offset",
            Rule::IwarpReadResponse => "iwarp-read-response",
            Rule::IwarpTerminate => "iwarp-terminate",
            Rule::ClcHeader => "clc-header",
            Rule::ClcTrailer => "clc-trailer",
            Rule::ClcSequence => "clc-sequence",
            Rule::LlcMessage => "llc-message",
            Rule::CdcCursor => "cdc-cursor",
            Rule::CdcSeqno => "cdc-seqno",
            Rule::StreamUnparsed => "stream-unparsed",
            Rule::RetransmitDiffers => "retransmit-differs",
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Protocol family of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Protocol {
    /// RoCEv2 (UDP 4791), or RoCEv1 / native IB fed by tests.
    Roce,
    /// iWARP over TCP (MPA).
    Iwarp,
    /// SMC CLC over TCP.
    SmcClc,
    /// SMC-R LLC/CDC over a RoCE link.
    SmcR,
}

/// One rule violation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    /// Timestamp given to [`Checker::observe`] (ns).
    pub ts_ns: u64,
    /// The port the offending frame was seen on.
    pub port: String,
    /// Protocol the rule belongs to.
    pub protocol: Protocol,
    /// The connection, e.g. `roce#1 10.0.0.1/qp0x11 <-> 10.0.0.2/qp0x12`.
    pub connection: String,
    /// The direction, e.g. `10.0.0.1 -> 10.0.0.2 qp0x12`.
    pub direction: String,
    /// RoCE PSN of the offending packet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub psn: Option<u32>,
    /// TCP stream offset (iWARP, CLC) or CDC sequence number (SMC-R).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    /// The rule broken.
    pub rule: Rule,
    /// What exactly was seen.
    pub detail: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] {} {}", self.rule, self.connection, self.direction)?;
        if let Some(p) = self.psn {
            write!(f, " psn {p:#08x}")?;
        }
        if let Some(s) = self.seq {
            write!(f, " seq {s}")?;
        }
        write!(f, " (port {}): {}", self.port, self.detail)
    }
}

/// Counters of the checker itself.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckerStats {
    /// Frames given to [`Checker::observe`].
    pub frames: u64,
    /// RoCE packets examined.
    pub roce_packets: u64,
    /// TCP segments examined for iWARP or SMC CLC.
    pub tcp_segments: u64,
    /// Findings ever reported.
    pub findings: u64,
    /// Findings dropped from the ring because it was full.
    pub findings_dropped: u64,
    /// Connections evicted because the table was full.
    pub flows_evicted: u64,
    /// TCP directions marked unparsed.
    pub streams_unparsed: u64,
    /// SMC-R links learnt from an LLC ADD_LINK exchange (a link group's
    /// further links; the first is learnt from CLC).
    #[serde(default)]
    pub smc_links_from_add_link: u64,
}

/// The flow table as [`Checker::flows`] shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowsView {
    /// RoCE queue-pair connections.
    pub roce: Vec<roce::RoceConnView>,
    /// iWARP connections.
    pub iwarp: Vec<iwarp::IwarpConnView>,
    /// SMC CLC sessions and the SMC-R links they set up.
    pub smc: Vec<smc::SmcView>,
}

/// Where findings go; bounded.
#[derive(Debug)]
pub(crate) struct Findings {
    ring: VecDeque<Finding>,
    max: usize,
}

impl Findings {
    pub(crate) fn push(&mut self, stats: &mut CheckerStats, f: Finding) {
        stats.findings += 1;
        if self.max == 0 {
            stats.findings_dropped += 1;
            return;
        }
        if self.ring.len() >= self.max {
            self.ring.pop_front();
            stats.findings_dropped += 1;
        }
        self.ring.push_back(f);
    }
}

/// What every protocol handler gets with a frame.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ctx<'a> {
    pub ts_ns: u64,
    pub port: &'a str,
}

impl Ctx<'_> {
    /// A finding of `rule` on this frame, with no PSN or stream offset.
    pub(crate) fn finding(
        &self,
        protocol: Protocol,
        connection: &str,
        direction: &str,
        rule: Rule,
        detail: String,
    ) -> Finding {
        Finding {
            ts_ns: self.ts_ns,
            port: self.port.to_string(),
            protocol,
            connection: connection.to_string(),
            direction: direction.to_string(),
            psn: None,
            seq: None,
            rule,
            detail,
        }
    }
}

/// The checker: flow tables for each protocol, findings and counters.
#[derive(Debug)]
pub struct Checker {
    cfg: CheckerConfig,
    stats: CheckerStats,
    findings: Findings,
    roce: roce::RoceTable,
    tcp: tcp::TcpTable,
}

impl Default for Checker {
    fn default() -> Self {
        Self::new(CheckerConfig::default())
    }
}

impl Checker {
    /// A checker with the given limits.
    pub fn new(cfg: CheckerConfig) -> Self {
        Checker {
            cfg,
            stats: CheckerStats::default(),
            findings: Findings {
                ring: VecDeque::new(),
                max: cfg.max_findings,
            },
            roce: roce::RoceTable::new(cfg.max_flows),
            tcp: tcp::TcpTable::new(cfg),
        }
    }

    /// The limits in force.
    pub fn config(&self) -> CheckerConfig {
        self.cfg
    }

    /// Examines one Ethernet frame (no FCS) as it was emitted by its sender,
    /// seen on `port` at `ts_ns`. Frames that are neither RoCEv2 nor TCP are
    /// ignored after a few byte reads.
    pub fn observe(&mut self, ts_ns: u64, port: &str, frame: &[u8]) {
        self.stats.frames += 1;
        let ctx = Ctx { ts_ns, port };
        match net::classify(frame) {
            Interest::Roce => {
                self.stats.roce_packets += 1;
                self.roce.on_frame(
                    ctx,
                    frame,
                    &mut self.findings,
                    &mut self.stats,
                    &mut self.tcp.smc_links,
                );
            }
            Interest::TcpSessionStart | Interest::Tcp => {
                if let Some(seg) = net::TcpSegment::parse(frame) {
                    self.stats.tcp_segments += 1;
                    self.tcp
                        .on_segment(ctx, &seg, &mut self.findings, &mut self.stats);
                }
            }
            Interest::None => {}
        }
    }

    /// Examines a native InfiniBand packet (LRH first, as in ERF captures);
    /// addresses are the LIDs. For offline checks of IB captures.
    pub fn observe_ib(&mut self, ts_ns: u64, port: &str, packet: &[u8]) {
        self.stats.frames += 1;
        self.stats.roce_packets += 1;
        let ctx = Ctx { ts_ns, port };
        self.roce
            .on_ib(ctx, packet, &mut self.findings, &mut self.stats);
    }

    /// Whether any TCP connection is being followed: when false, a caller
    /// may skip TCP frames that are not [`Interest::TcpSessionStart`].
    pub fn tracks_tcp(&self) -> bool {
        self.tcp.tracks_any()
    }

    /// Counters.
    pub fn stats(&self) -> CheckerStats {
        let mut s = self.stats.clone();
        s.flows_evicted = self.roce.evicted + self.tcp.evicted();
        s.smc_links_from_add_link = self.tcp.smc_links.learnt_from_add_link;
        s
    }

    /// The findings kept, oldest first.
    pub fn findings(&self) -> Vec<Finding> {
        self.findings.ring.iter().cloned().collect()
    }

    /// Forgets the findings kept (counters stay).
    pub fn clear_findings(&mut self) {
        self.findings.ring.clear();
    }

    /// The connections seen, with their state.
    pub fn flows(&self) -> FlowsView {
        FlowsView {
            roce: self.roce.view(),
            iwarp: self.tcp.iwarp_view(),
            smc: self.tcp.smc_view(),
        }
    }

    /// Forgets all flows and findings (counters stay).
    pub fn reset(&mut self) {
        self.roce = roce::RoceTable::new(self.cfg.max_flows);
        self.tcp = tcp::TcpTable::new(self.cfg);
        self.findings.ring.clear();
    }
}

//! iWARP over a reassembled TCP byte stream (PROTOCOLS.md section 2).
//!
//! The initiator's direction must open with an MPA Request, the other with
//! an MPA Reply (`siw::mpa::MpaFrame::parse`). CRC is in use when either
//! side set the C flag (siw's rule); markers are not supported (as in siw):
//! a connection that asks for them is reported and no longer parsed.
//! FPDUs are cut and CRC-checked by `siw::mpa::Deframer`; a CRC or length
//! error loses the framing for good (no markers to resynchronise on), so
//! the direction stops being parsed after the finding. Each ULPDU is
//! decoded with `siw::ddp::Header::decode` and checked for: the queue
//! number fitting the RDMAP opcode (Send 0, Read Request 1, Terminate 2),
//! untagged MSN (starting at 1 per queue, +1 per message) and MO
//! continuity, tagged STag/TO continuity within a message, and read
//! responses matching the peer's oldest outstanding Read Request (sink
//! STag, sink TO, size). Terminates are decoded and reported.

use crate::Rule;
use serde::{Deserialize, Serialize};
use siw::ddp::{DdpHdr, Header, Opcode, ReadRequest, Terminate};
use siw::mpa::{fpdu_len, Deframer, FrameError, FrameKind, MpaFrame};
use std::collections::VecDeque;

/// Read Requests remembered per direction (siw's ORD/IRD limit).
const READS_KEPT: usize = 128;

/// A finding before it gets its names: rule, stream offset, detail.
pub(crate) type Pending = (Rule, u64, String);

#[derive(Debug)]
enum Stage {
    /// Waiting for the MPA Request/Reply frame.
    Handshake,
    /// Frame seen; waiting for the other side's to know about CRC.
    Waiting,
    /// Cutting FPDUs.
    Fpdu(Deframer),
    /// No longer parsed.
    Dead,
}

#[derive(Debug, Default)]
struct DdpState {
    next_msn: [u32; 3],
    untagged: [Option<(u32, u32)>; 3],
    tagged: Option<(u32, u64, Opcode)>,
    /// Read Requests this direction sent, with bytes answered so far.
    reads: VecDeque<(ReadRequest, u64)>,
    fpdus: u64,
    messages: u64,
    terminate: Option<String>,
}

#[derive(Debug)]
struct Dir {
    stage: Stage,
    pre: Vec<u8>,
    offset: u64,
    st: DdpState,
}

impl Dir {
    fn new() -> Self {
        Dir {
            stage: Stage::Handshake,
            pre: Vec::new(),
            offset: 0,
            st: DdpState {
                next_msn: [1; 3],
                ..DdpState::default()
            },
        }
    }
}

/// One iWARP connection's protocol state (direction 0 = MPA initiator).
#[derive(Debug)]
pub(crate) struct IwarpConn {
    req: Option<MpaFrame>,
    rep: Option<MpaFrame>,
    dirs: [Dir; 2],
}

/// One direction of an iWARP connection in `flows`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IwarpDirView {
    /// `SRC:PORT -> DST:PORT`.
    pub direction: String,
    /// Stream bytes parsed.
    pub stream_offset: u64,
    /// FPDUs decoded.
    pub fpdus: u64,
    /// Messages completed (L bit).
    pub messages: u64,
    /// Next MSN expected on the Send, Read Request and Terminate queues.
    pub next_msn: [u32; 3],
    /// Read Requests not yet fully answered.
    pub outstanding_reads: usize,
    /// Whether this direction is still parsed.
    pub parsed: bool,
    /// A Terminate this direction sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminate: Option<String>,
    /// TCP bytes seen again: retransmitted, or the same segment recorded
    /// on another port.
    #[serde(default)]
    pub retransmitted: u64,
    /// Of those, bytes older than the checker's `retransmit_window`, not
    /// compared with their first sighting.
    #[serde(default)]
    pub retransmit_unchecked: u64,
    /// Sightings whose bytes differed from the first (the first of them is
    /// a `retransmit-differs` finding).
    #[serde(default)]
    pub retransmit_differs: u64,
}

/// An iWARP connection in `flows`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IwarpConnView {
    /// `iwarp#ID A:P <-> B:Q`.
    pub connection: String,
    /// `mpa-request`, `established`, `rejected`.
    pub state: String,
    /// MPA revision of the Request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<u8>,
    /// CRC negotiated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crc: Option<bool>,
    /// Initiator -> responder, then responder -> initiator.
    pub dirs: Vec<IwarpDirView>,
}

fn term_text(t: &Terminate) -> String {
    format!(
        "layer {:?} etype {:#x} ecode {:#04x}{}",
        t.error.layer,
        t.error.etype,
        t.error.ecode,
        t.offending_header()
            .map(|h| format!(", offending {:?}", h.opcode))
            .unwrap_or_default()
    )
}

impl IwarpConn {
    pub(crate) fn new() -> Self {
        IwarpConn {
            req: None,
            rep: None,
            dirs: [Dir::new(), Dir::new()],
        }
    }

    fn crc(&self) -> Option<bool> {
        Some(self.req.as_ref()?.crc || self.rep.as_ref()?.crc)
    }

    /// Bytes of direction `d` held for parsing.
    pub(crate) fn buffered(&self, d: usize) -> usize {
        let dir = &self.dirs[d];
        dir.pre.len()
            + match &dir.stage {
                Stage::Fpdu(f) => f.buffered(),
                _ => 0,
            }
    }

    /// Whether direction `d` is no longer parsed.
    pub(crate) fn dead(&self, d: usize) -> bool {
        matches!(self.dirs[d].stage, Stage::Dead)
    }

    /// Stops parsing direction `d`.
    pub(crate) fn kill(&mut self, d: usize) {
        self.dirs[d].stage = Stage::Dead;
        self.dirs[d].pre = Vec::new();
    }

    /// Takes in-order stream bytes of direction `d`.
    pub(crate) fn feed(&mut self, d: usize, data: &[u8], out: &mut Vec<Pending>) {
        let dir = &mut self.dirs[d];
        match &mut dir.stage {
            Stage::Dead => return,
            Stage::Fpdu(f) => f.push(data),
            _ => dir.pre.extend_from_slice(data),
        }
        self.handshake(d, out);
        self.drain(d, out);
        // A Reply may unblock the initiator's early FPDUs.
        self.drain(1 - d, out);
    }

    fn handshake(&mut self, d: usize, out: &mut Vec<Pending>) {
        if !matches!(self.dirs[d].stage, Stage::Handshake) {
            return;
        }
        let parsed = MpaFrame::parse(&self.dirs[d].pre);
        let offset = self.dirs[d].offset;
        let (f, n) = match parsed {
            Ok(None) => return,
            Ok(Some(x)) => x,
            Err(e) => {
                out.push((Rule::MpaHandshake, offset, format!("MPA frame: {e}")));
                self.kill(d);
                return;
            }
        };
        let want = if d == 0 {
            FrameKind::Request
        } else {
            FrameKind::Reply
        };
        if f.kind != want {
            out.push((
                Rule::MpaHandshake,
                offset,
                format!("MPA {:?} where a {want:?} was due", f.kind),
            ));
            self.kill(d);
            return;
        }
        if f.markers {
            out.push((
                Rule::MpaHandshake,
                offset,
                "MPA markers requested (siw refuses them); FPDUs not parsed".into(),
            ));
            self.kill(d);
            return;
        }
        let reject = f.reject;
        let dir = &mut self.dirs[d];
        dir.pre.drain(..n);
        dir.offset += n as u64;
        dir.stage = Stage::Waiting;
        if d == 0 {
            self.req = Some(f);
        } else {
            self.rep = Some(f);
        }
        if reject {
            // Rejected: no FPDUs follow.
            self.kill(0);
            self.kill(1);
        }
    }

    fn drain(&mut self, d: usize, out: &mut Vec<Pending>) {
        if matches!(self.dirs[d].stage, Stage::Waiting) {
            let Some(crc) = self.crc() else { return };
            let mut f = Deframer::new(crc, u16::MAX as usize);
            let dir = &mut self.dirs[d];
            f.push(&dir.pre);
            dir.pre = Vec::new();
            dir.stage = Stage::Fpdu(f);
        }
        let (a, b) = self.dirs.split_at_mut(1);
        let (this, other) = if d == 0 {
            (&mut a[0], &mut b[0])
        } else {
            (&mut b[0], &mut a[0])
        };
        let Stage::Fpdu(f) = &mut this.stage else {
            return;
        };
        let mut failed = false;
        loop {
            match f.next_ulpdu() {
                Ok(Some(u)) => {
                    let at = this.offset;
                    this.offset += fpdu_len(u.len()) as u64;
                    ulpdu(&mut this.st, &mut other.st, u, at, out);
                }
                Ok(None) => break,
                Err(e) => {
                    let rule = match e {
                        FrameError::Crc { .. } => Rule::MpaCrc,
                        FrameError::TooLong { .. } => Rule::MpaFraming,
                    };
                    out.push((
                        rule,
                        this.offset,
                        format!("{e}; the rest of this direction is not parsed"),
                    ));
                    failed = true;
                    break;
                }
            }
        }
        if failed {
            self.kill(d);
        }
    }

    pub(crate) fn view(&self, connection: String, dirs: [String; 2]) -> IwarpConnView {
        let state = match (&self.req, &self.rep) {
            (_, Some(r)) if r.reject => "rejected",
            (Some(_), Some(_)) => "established",
            (Some(_), None) => "mpa-request",
            _ => "start",
        };
        IwarpConnView {
            connection,
            state: state.into(),
            revision: self.req.as_ref().map(|r| r.revision),
            crc: self.crc(),
            dirs: self
                .dirs
                .iter()
                .zip(dirs)
                .map(|(d, name)| IwarpDirView {
                    direction: name,
                    stream_offset: d.offset,
                    fpdus: d.st.fpdus,
                    messages: d.st.messages,
                    next_msn: d.st.next_msn,
                    outstanding_reads: d.st.reads.len(),
                    parsed: !matches!(d.stage, Stage::Dead),
                    terminate: d.st.terminate.clone(),
                    ..IwarpDirView::default()
                })
                .collect(),
        }
    }
}

/// Checks one ULPDU of a direction (`other` is the reverse direction, whose
/// Read Requests this one answers).
fn ulpdu(st: &mut DdpState, other: &mut DdpState, u: &[u8], at: u64, out: &mut Vec<Pending>) {
    let (h, rest) = match Header::decode(u) {
        Ok(x) => x,
        Err(te) => {
            out.push((
                Rule::DdpHeader,
                at,
                format!(
                    "DDP/RDMAP header {:02x?}: layer {:?} etype {:#x} ecode {:#04x}",
                    &u[..u.len().min(2)],
                    te.layer,
                    te.etype,
                    te.ecode
                ),
            ));
            return;
        }
    };
    st.fpdus += 1;
    match h.ddp {
        DdpHdr::Untagged { qn, msn, mo, .. } => {
            let want = match h.opcode {
                Opcode::ReadRequest => 1,
                Opcode::Terminate => 2,
                _ => 0,
            };
            if qn != want {
                out.push((
                    Rule::DdpQueue,
                    at,
                    format!("{:?} on queue {qn}, must be queue {want}", h.opcode),
                ));
                return;
            }
            let q = qn as usize;
            match st.untagged[q] {
                Some((m, next_mo)) => {
                    if msn != m {
                        out.push((
                            Rule::DdpMsn,
                            at,
                            format!(
                                "{:?} segment with MSN {msn} inside message MSN {m}",
                                h.opcode
                            ),
                        ));
                    } else if mo != next_mo {
                        out.push((
                            Rule::DdpOffset,
                            at,
                            format!(
                                "{:?} MSN {msn} segment at MO {mo}, expected {next_mo}",
                                h.opcode
                            ),
                        ));
                    }
                }
                None => {
                    if msn != st.next_msn[q] {
                        out.push((
                            Rule::DdpMsn,
                            at,
                            format!(
                                "{:?} on queue {q} with MSN {msn}, expected {}",
                                h.opcode, st.next_msn[q]
                            ),
                        ));
                    }
                    if mo != 0 {
                        out.push((
                            Rule::DdpOffset,
                            at,
                            format!("{:?} MSN {msn} starts at MO {mo}, not 0", h.opcode),
                        ));
                    }
                }
            }
            if h.last {
                st.next_msn[q] = msn.wrapping_add(1);
                st.untagged[q] = None;
                st.messages += 1;
            } else {
                st.untagged[q] = Some((msn, mo.wrapping_add(rest.len() as u32)));
            }
            match h.opcode {
                Opcode::ReadRequest => match ReadRequest::decode(rest) {
                    Some(r) => {
                        if st.reads.len() >= READS_KEPT {
                            st.reads.pop_front();
                        }
                        st.reads.push_back((r, 0));
                    }
                    None => out.push((
                        Rule::DdpHeader,
                        at,
                        format!("Read Request body of {} bytes, need 28", rest.len()),
                    )),
                },
                Opcode::Terminate => match Terminate::decode(rest) {
                    Some(t) => {
                        let text = term_text(&t);
                        out.push((Rule::IwarpTerminate, at, format!("Terminate: {text}")));
                        st.terminate = Some(text);
                    }
                    None => out.push((
                        Rule::DdpHeader,
                        at,
                        "Terminate shorter than its 4-byte control field".into(),
                    )),
                },
                _ => {}
            }
        }
        DdpHdr::Tagged { stag, to } => {
            let len = rest.len() as u64;
            match st.tagged {
                Some((s, next_to, op)) if s != stag || to != next_to || op != h.opcode => {
                    out.push((
                        Rule::DdpOffset,
                        at,
                        format!(
                            "{:?} segment STag {stag:#x} TO {to:#x} inside {op:?} STag {s:#x} at TO {next_to:#x}",
                            h.opcode
                        ),
                    ));
                }
                Some(_) => {}
                None if h.opcode == Opcode::ReadResponse => match other.reads.front() {
                    Some((r, 0)) if r.sink_stag == stag && r.sink_to == to => {}
                    Some((r, _)) => out.push((
                        Rule::IwarpReadResponse,
                        at,
                        format!(
                            "Read Response to STag {stag:#x} TO {to:#x}, the oldest Read Request sinks to STag {:#x} TO {:#x}",
                            r.sink_stag, r.sink_to
                        ),
                    )),
                    None => out.push((
                        Rule::IwarpReadResponse,
                        at,
                        format!("Read Response to STag {stag:#x} with no outstanding Read Request"),
                    )),
                },
                None => {}
            }
            if h.opcode == Opcode::ReadResponse {
                if let Some((r, got)) = other.reads.front_mut() {
                    *got += len;
                    if h.last {
                        if *got != u64::from(r.size) {
                            out.push((
                                Rule::IwarpReadResponse,
                                at,
                                format!(
                                    "Read Response carried {got} bytes, the Read Request asked for {}",
                                    r.size
                                ),
                            ));
                        }
                        other.reads.pop_front();
                    }
                }
            }
            if h.last {
                st.tagged = None;
                st.messages += 1;
            } else {
                st.tagged = Some((stag, to.wrapping_add(len), h.opcode));
            }
        }
    }
}

//! SMC: the CLC handshake over TCP, and LLC / CDC messages on the SMC-R
//! link's RoCE queue pairs (PROTOCOLS.md section 3, Linux `net/smc`).
//!
//! **CLC.** A TCP direction whose first payload starts with the `SMCR` or
//! `SMCD` eyecatcher is decoded as CLC messages: eyecatcher, type 1..=4,
//! version 1..=2, a length that fits the type, the trailer repeating the
//! eyecatcher, and the order Proposal (client) -> Accept (server) ->
//! Confirm (client), with a Decline allowed from either side at any point.
//! Decline diagnosis codes are decoded into the session state (a decline
//! is a legitimate outcome, not a finding). After Confirm or Decline the TCP
//! connection is no longer parsed.
//!
//! **LLC / CDC.** Once a CLC Accept/Confirm was seen between two addresses,
//! RC SEND ONLY payloads between them are decoded as LLC messages (44 bytes
//! in v1; type 0x01..0x09, v2 types 0x21..0x29) and CDC messages (type
//! 0xFE, 44 bytes): unknown types or wrong lengths are `llc-message`
//! findings, and per connection (alert token) a producer or consumer
//! cursor moving backwards is `cdc-cursor`, a sequence number going
//! backwards `cdc-seqno`. A link group's further links are learnt from the
//! LLC ADD_LINK request and response on a known link (each names its
//! sender's GID for the new link) and decoded the same way, so `flows` shows
//! which link carries a connection's CDC messages, e.g. after a failover.

use crate::net::{Addr, EYECATCHER_SMCD, EYECATCHER_SMCR};
use crate::Rule;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// CDC connections (alert tokens) remembered per half.
const CDC_CONNS_KEPT: usize = 256;
/// Address pairs with SMC-R remembered.
const LINKS_KEPT: usize = 1024;
/// Longest CLC message accepted (v2 proposals with 8 UEIDs and prefixes
/// stay well below this).
pub(crate) const MAX_CLC_LEN: usize = 4096;

/// LLC ADD_LINK messages waiting for the peer's answer (request and
/// response each carry their sender's GID for the new link).
const ADD_LINKS_PENDING: usize = 64;

/// Address pairs between which SMC-R runs: learnt from a CLC handshake that
/// chose SMC-R, and from LLC ADD_LINK exchanges on a known link (the link
/// group's further links, e.g. over a second RoCE device).
#[derive(Debug, Default)]
pub(crate) struct SmcLinks {
    pairs: VecDeque<(Addr, Addr)>,
    /// (link the ADD_LINK rode on as (from, to), the sender's GID address).
    add_links: VecDeque<((Addr, Addr), Addr)>,
    /// Links learnt from ADD_LINK (for `status`).
    pub(crate) learnt_from_add_link: u64,
}

/// The GID an LLC ADD_LINK message (v1 type 0x02, v2 0x22) announces for
/// its sender's end of the new link: bytes 12..28 after the 4-byte LLC
/// header, the 6-byte MAC and 2 reserved bytes (Linux `smc_llc_msg_add_link`).
/// An IPv4-mapped GID (RoCEv2 over IPv4) gives the IPv4 address.
pub(crate) fn add_link_gid(m: &[u8]) -> Option<Addr> {
    if !matches!(m.first(), Some(0x02 | 0x22)) {
        return None;
    }
    let gid: [u8; 16] = m.get(12..28)?.try_into().ok()?;
    if gid[..10].iter().all(|&b| b == 0) && gid[10] == 0xff && gid[11] == 0xff {
        Some(Addr::V4([gid[12], gid[13], gid[14], gid[15]]))
    } else {
        Some(Addr::V6(gid))
    }
}

impl SmcLinks {
    /// An ADD_LINK `from` -> `to` on a known SMC-R link announcing `gid` for
    /// the sender's end of a new link. Once both ends have announced theirs,
    /// the new link's pair is followed like the first.
    pub(crate) fn on_add_link(&mut self, from: Addr, to: Addr, gid: Addr) {
        let answered = self
            .add_links
            .iter()
            .position(|&((f, t), _)| f == to && t == from);
        if let Some((_, peer_gid)) = answered.and_then(|i| self.add_links.remove(i)) {
            if !self.contains(gid, peer_gid) {
                self.learnt_from_add_link += 1;
            }
            self.add_pair(gid, peer_gid);
            return;
        }
        // a repeated request replaces the older one
        self.add_links
            .retain(|&((f, t), _)| !(f == from && t == to));
        if self.add_links.len() >= ADD_LINKS_PENDING {
            self.add_links.pop_front();
        }
        self.add_links.push_back(((from, to), gid));
    }

    pub(crate) fn add_pair(&mut self, a: Addr, b: Addr) {
        let p = if a <= b { (a, b) } else { (b, a) };
        if self.pairs.contains(&p) {
            return;
        }
        if self.pairs.len() >= LINKS_KEPT {
            self.pairs.pop_front();
        }
        self.pairs.push_back(p);
    }

    pub(crate) fn contains(&self, a: Addr, b: Addr) -> bool {
        if self.pairs.is_empty() {
            return false;
        }
        let p = if a <= b { (a, b) } else { (b, a) };
        self.pairs.contains(&p)
    }
}

#[derive(Debug, Clone, Copy)]
struct CdcConn {
    token: u32,
    seqno: u16,
    prod: (u16, u32),
    cons: (u16, u32),
}

/// LLC/CDC state of one RoCE half of an SMC-R link.
#[derive(Debug, Default)]
pub(crate) struct SmcHalf {
    llc: u64,
    cdc: u64,
    last_llc: Option<&'static str>,
    conns: VecDeque<CdcConn>,
}

/// SMC-R state of a RoCE half in `flows`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SmcHalfView {
    /// LLC messages.
    pub llc_messages: u64,
    /// CDC messages.
    pub cdc_messages: u64,
    /// Type of the last LLC message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_llc: Option<String>,
    /// Per SMC connection: the last cursors.
    pub cursors: Vec<CdcCursorView>,
}

/// The last CDC cursors of one SMC connection (alert token).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CdcCursorView {
    /// Alert token.
    pub token: u32,
    /// Last CDC sequence number.
    pub seqno: u16,
    /// Producer cursor (wrap, count).
    pub producer: (u16, u32),
    /// Consumer cursor (wrap, count).
    pub consumer: (u16, u32),
}

fn llc_name(t: u8) -> Option<&'static str> {
    Some(match t {
        0x01 => "CONFIRM_LINK",
        0x02 => "ADD_LINK",
        0x03 => "ADD_LINK_CONT",
        0x04 => "DELETE_LINK",
        0x05 => "REQ_ADD_LINK",
        0x06 => "CONFIRM_RKEY",
        0x07 => "TEST_LINK",
        0x08 => "CONFIRM_RKEY_CONT",
        0x09 => "DELETE_RKEY",
        0x21 => "CONFIRM_LINK_V2",
        0x22 => "ADD_LINK_V2",
        0x24 => "DELETE_LINK_V2",
        0x25 => "REQ_ADD_LINK_V2",
        0x26 => "CONFIRM_RKEY_V2",
        0x27 => "TEST_LINK_V2",
        0x29 => "DELETE_RKEY_V2",
        _ => return None,
    })
}

/// `a` before `b` for a (wrap, count) cursor: wraps compared on the 16-bit
/// circle.
fn cursor_before(a: (u16, u32), b: (u16, u32)) -> bool {
    let d = a.0.wrapping_sub(b.0) as i16;
    d < 0 || (d == 0 && a.1 < b.1)
}

impl SmcHalf {
    /// Decodes one RC SEND ONLY payload of the link.
    pub(crate) fn on_send(&mut self, m: &[u8], pending: &mut Vec<(Rule, Option<u32>, String)>) {
        let Some(&t) = m.first() else {
            pending.push((Rule::LlcMessage, None, "empty SEND on an SMC-R link".into()));
            return;
        };
        if t == 0xfe {
            self.cdc(m, pending);
            return;
        }
        let Some(name) = llc_name(t) else {
            pending.push((
                Rule::LlcMessage,
                None,
                format!("unknown LLC type {t:#04x} ({} bytes)", m.len()),
            ));
            return;
        };
        self.llc += 1;
        self.last_llc = Some(name);
        if t < 0x20 {
            // v1: 44 bytes, length byte 44.
            if m.len() != 44 || m.get(1) != Some(&44) {
                pending.push((
                    Rule::LlcMessage,
                    None,
                    format!(
                        "{name}: v1 LLC message must be 44 bytes with length 44, got {} bytes, length {}",
                        m.len(),
                        m.get(1).copied().unwrap_or_default()
                    ),
                ));
            }
        } else if m.len() < 44 {
            pending.push((
                Rule::LlcMessage,
                None,
                format!(
                    "{name}: v2 LLC message of {} bytes, shorter than 44",
                    m.len()
                ),
            ));
        }
    }

    fn cdc(&mut self, m: &[u8], pending: &mut Vec<(Rule, Option<u32>, String)>) {
        if m.len() < 44 || m[1] != 44 {
            pending.push((
                Rule::LlcMessage,
                None,
                format!(
                    "CDC message of {} bytes with length {}, must be 44",
                    m.len(),
                    m.get(1).copied().unwrap_or_default()
                ),
            ));
            return;
        }
        self.cdc += 1;
        let be16 = |o: usize| u16::from_be_bytes([m[o], m[o + 1]]);
        let be32 = |o: usize| u32::from_be_bytes([m[o], m[o + 1], m[o + 2], m[o + 3]]);
        let (seqno, token) = (be16(2), be32(4));
        let prod = (be16(10), be32(12));
        let cons = (be16(18), be32(20));
        let Some(c) = self.conns.iter_mut().find(|c| c.token == token) else {
            if self.conns.len() >= CDC_CONNS_KEPT {
                self.conns.pop_front();
            }
            self.conns.push_back(CdcConn {
                token,
                seqno,
                prod,
                cons,
            });
            return;
        };
        if (seqno.wrapping_sub(c.seqno) as i16) < 0 {
            pending.push((
                Rule::CdcSeqno,
                Some(u32::from(seqno)),
                format!("token {token:#x}: CDC seqno {seqno} after {}", c.seqno),
            ));
        } else {
            c.seqno = seqno;
        }
        for (what, new, old) in [
            ("producer", prod, &mut c.prod),
            ("consumer", cons, &mut c.cons),
        ] {
            if cursor_before(new, *old) {
                pending.push((
                    Rule::CdcCursor,
                    Some(u32::from(seqno)),
                    format!(
                        "token {token:#x}: {what} cursor moved back from {}:{} to {}:{}",
                        old.0, old.1, new.0, new.1
                    ),
                ));
            } else {
                *old = new;
            }
        }
    }

    pub(crate) fn view(&self) -> SmcHalfView {
        SmcHalfView {
            llc_messages: self.llc,
            cdc_messages: self.cdc,
            last_llc: self.last_llc.map(str::to_string),
            cursors: self
                .conns
                .iter()
                .map(|c| CdcCursorView {
                    token: c.token,
                    seqno: c.seqno,
                    producer: c.prod,
                    consumer: c.cons,
                })
                .collect(),
        }
    }
}

// ---------------------------------------------------------------------------
// CLC
// ---------------------------------------------------------------------------

/// CLC message types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClcType {
    /// 1.
    Proposal,
    /// 2.
    Accept,
    /// 3.
    Confirm,
    /// 4.
    Decline,
}

impl ClcType {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => ClcType::Proposal,
            2 => ClcType::Accept,
            3 => ClcType::Confirm,
            4 => ClcType::Decline,
            _ => return None,
        })
    }

    /// Shortest message of this type (v1 layouts, trailer included).
    fn min_len(self) -> usize {
        match self {
            ClcType::Proposal => 8 + 32 + 4,
            ClcType::Accept | ClcType::Confirm => 68,
            ClcType::Decline => 28,
        }
    }
}

/// A name for a decline diagnosis code (`SMC_CLC_DECL_*`), when known.
pub fn decline_name(code: u32) -> &'static str {
    match code {
        0x0101_0000 => "MEM",
        0x0201_0000 => "TIMEOUT_CL",
        0x0202_0000 => "TIMEOUT_AL",
        0x0300_0000 => "CNFERR",
        0x0301_0000 => "PEERNOSMC",
        0x0302_0000 => "IPSEC",
        0x0303_0000 => "NOSMCDEV",
        0x0303_0001 => "NOSMCDDEV",
        0x0303_0002 => "NOSMCRDEV",
        0x0303_0003 => "NOISM2SUPP",
        0x0303_0004 => "NOV2EXT",
        0x0303_0005 => "NOV2DEXT",
        0x0303_0006 => "NOSEID",
        0x0303_0007 => "NOSMCD2DEV",
        0x0303_0008 => "NOUEID",
        0x0303_0009 => "RELEASEERR",
        0x0303_000a => "MAXCONNERR",
        0x0303_000b => "MAXLINKERR",
        0x0304_0000 => "MODEUNSUPP",
        0x0305_0000 => "RMBE_EC",
        0x0306_0000 => "OPTUNSUPP",
        0x0307_0000 => "DIFFPREFIX",
        0x0308_0000 => "GETVLANERR",
        0x0309_0000 => "ISMVLANERR",
        0x030a_0000 => "NOACTLINK",
        0x030b_0000 => "NOSRVLINK",
        0x030c_0000 => "VERSMISMAT",
        0x030d_0000 => "MAX_DMB",
        0x030e_0000 => "NOROUTE",
        0x030f_0000 => "NOINDIRECT",
        0x0400_0000 => "SYNCERR",
        0x0500_0000 => "PEERDECL",
        0x0999_0000 => "INTERR",
        0x0999_0001 => "ERR_RTOK",
        0x0999_0002 => "ERR_RDYLNK",
        0x0999_0003 => "ERR_REGBUF",
        _ => "unknown",
    }
}

/// Progress of a CLC handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClcState {
    /// Nothing decoded yet.
    Start,
    /// The client proposed.
    Proposed,
    /// The server accepted.
    Accepted,
    /// The client confirmed: SMC is in use.
    Confirmed,
    /// Someone declined: the connection falls back to TCP.
    Declined,
    /// A rule was broken; no longer parsed.
    Broken,
}

/// One CLC session as `flows` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SmcView {
    /// `smc#ID CLIENT:PORT <-> SERVER:PORT`.
    pub connection: String,
    /// `SMC-R` or `SMC-D`.
    pub kind: String,
    /// Handshake progress.
    pub state: ClcState,
    /// CLC version of the last message.
    pub version: u8,
    /// Server QPN (Accept, SMC-R).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_qpn: Option<u32>,
    /// Client QPN (Confirm, SMC-R).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_qpn: Option<u32>,
    /// First contact (new link group).
    pub first_contact: bool,
    /// Decline diagnosis and its name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decline: Option<String>,
    /// Messages decoded.
    pub messages: u64,
}

/// CLC session state shared by both directions.
#[derive(Debug)]
pub(crate) struct ClcSession {
    pub(crate) state: ClcState,
    pub(crate) smcd: bool,
    pub(crate) version: u8,
    pub(crate) server_qpn: Option<u32>,
    pub(crate) client_qpn: Option<u32>,
    pub(crate) first_contact: bool,
    pub(crate) decline: Option<u32>,
    pub(crate) messages: u64,
}

impl Default for ClcSession {
    fn default() -> Self {
        ClcSession {
            state: ClcState::Start,
            smcd: false,
            version: 0,
            server_qpn: None,
            client_qpn: None,
            first_contact: false,
            decline: None,
            messages: 0,
        }
    }
}

/// Result of decoding at the start of a CLC byte buffer.
pub(crate) enum ClcStep {
    /// More bytes needed.
    NeedMore,
    /// One message of this many bytes was decoded.
    Message(usize),
    /// A rule was broken; stop parsing.
    Broken(Rule, String),
}

impl ClcSession {
    /// Decodes the next message of the direction `from_client` at the start
    /// of `buf`.
    pub(crate) fn step(&mut self, buf: &[u8], from_client: bool) -> ClcStep {
        let Some(h) = buf.get(..8) else {
            return ClcStep::NeedMore;
        };
        let eye = [h[0], h[1], h[2], h[3]];
        if eye != EYECATCHER_SMCR && eye != EYECATCHER_SMCD {
            return ClcStep::Broken(
                Rule::ClcHeader,
                format!("eyecatcher {:02x?} is neither SMCR nor SMCD", eye),
            );
        }
        let Some(t) = ClcType::from_u8(h[4]) else {
            return ClcStep::Broken(Rule::ClcHeader, format!("unknown CLC type {}", h[4]));
        };
        let len = usize::from(u16::from_be_bytes([h[5], h[6]]));
        let version = h[7] >> 4;
        if !(1..=2).contains(&version) {
            return ClcStep::Broken(Rule::ClcHeader, format!("CLC {t:?} with version {version}"));
        }
        if len < t.min_len() || len > MAX_CLC_LEN {
            return ClcStep::Broken(
                Rule::ClcHeader,
                format!(
                    "CLC {t:?} length {len} outside {}..={MAX_CLC_LEN}",
                    t.min_len()
                ),
            );
        }
        let Some(m) = buf.get(..len) else {
            return ClcStep::NeedMore;
        };
        if m[len - 4..] != eye {
            return ClcStep::Broken(
                Rule::ClcTrailer,
                format!(
                    "CLC {t:?} trailer {:02x?} does not repeat the eyecatcher",
                    &m[len - 4..]
                ),
            );
        }
        self.messages += 1;
        self.version = version;
        self.smcd = eye == EYECATCHER_SMCD;
        let expected = matches!(
            (self.state, t, from_client),
            (_, ClcType::Decline, _)
                | (ClcState::Start, ClcType::Proposal, true)
                | (ClcState::Proposed, ClcType::Accept, false)
                | (ClcState::Accepted, ClcType::Confirm, true)
        );
        if !expected {
            return ClcStep::Broken(
                Rule::ClcSequence,
                format!(
                    "CLC {t:?} from the {} while the handshake is {:?}",
                    if from_client { "client" } else { "server" },
                    self.state
                ),
            );
        }
        let be24 = |o: usize| u32::from_be_bytes([0, m[o], m[o + 1], m[o + 2]]);
        self.state = match t {
            ClcType::Proposal => ClcState::Proposed,
            ClcType::Accept => {
                self.first_contact = h[7] & 0x08 != 0;
                if !self.smcd {
                    self.server_qpn = Some(be24(38));
                }
                ClcState::Accepted
            }
            ClcType::Confirm => {
                if !self.smcd {
                    self.client_qpn = Some(be24(38));
                }
                ClcState::Confirmed
            }
            ClcType::Decline => {
                self.decline = Some(u32::from_be_bytes([m[16], m[17], m[18], m[19]]));
                ClcState::Declined
            }
        };
        ClcStep::Message(len)
    }

    pub(crate) fn view(&self, connection: String) -> SmcView {
        SmcView {
            connection,
            kind: if self.smcd { "SMC-D" } else { "SMC-R" }.into(),
            state: self.state,
            version: self.version,
            server_qpn: self.server_qpn,
            client_qpn: self.client_qpn,
            first_contact: self.first_contact,
            decline: self
                .decline
                .map(|c| format!("{c:#010x} {}", decline_name(c))),
            messages: self.messages,
        }
    }
}

//! BTH opcodes and the per-opcode info table (which extension headers follow,
//! payload rules, request/response, message boundaries).
//!
//! The table follows IBA chapter 9 as implemented by Linux rxe (`rxe_opcode.c`),
//! including the IBA 1.5 FLUSH and ATOMIC_WRITE opcodes.

use crate::error::CodecError;

/// Transport service, from the top 3 bits of the opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Reliable Connected (`000`).
    Rc,
    /// Unreliable Connected (`001`).
    Uc,
    /// Reliable Datagram (`010`, not supported by this codec).
    Rd,
    /// Unreliable Datagram (`011`).
    Ud,
    /// Congestion Notification Packet (0x81, RoCEv2 annex).
    Cnp,
}

/// What kind of operation an opcode belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// SEND (all variants).
    Send,
    /// RDMA WRITE (all variants).
    Write,
    /// RDMA READ request.
    ReadRequest,
    /// RDMA READ response (FIRST/MIDDLE/LAST/ONLY).
    ReadResponse,
    /// ACKNOWLEDGE.
    Ack,
    /// ATOMIC ACKNOWLEDGE.
    AtomicAck,
    /// COMPARE_SWAP / FETCH_ADD.
    Atomic,
    /// FLUSH (IBA 1.5).
    Flush,
    /// ATOMIC_WRITE (IBA 1.5).
    AtomicWrite,
    /// Congestion notification.
    Cnp,
}

/// Position of a packet inside its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Position {
    /// FIRST packet of a multi-packet message.
    First,
    /// MIDDLE packet.
    Middle,
    /// LAST packet.
    Last,
    /// Single-packet message (ONLY, ACK, READ request, atomics, ...).
    Only,
}

impl Position {
    /// Does this packet start a message?
    pub const fn starts(self) -> bool {
        matches!(self, Position::First | Position::Only)
    }
    /// Does this packet end a message?
    pub const fn ends(self) -> bool {
        matches!(self, Position::Last | Position::Only)
    }
}

/// Payload length rule of an opcode. The codec enforces [`PayloadRule::Empty`]
/// and [`PayloadRule::Exact`]; the PMTU-dependent rules need the connection's
/// PMTU and are checked by [`PayloadRule::check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PayloadRule {
    /// No payload at all (ACK, READ request, atomics, FLUSH).
    Empty,
    /// Exactly PMTU bytes (FIRST and MIDDLE packets).
    Pmtu,
    /// 1..=PMTU bytes (LAST packets).
    Last,
    /// 0..=PMTU bytes (ONLY packets).
    UpToPmtu,
    /// A fixed size independent of PMTU (ATOMIC_WRITE: 8, CNP: 16 reserved bytes).
    Exact(usize),
}

impl PayloadRule {
    /// Is `len` a legal payload length under this rule for a path MTU of `pmtu` bytes?
    pub const fn check(self, len: usize, pmtu: usize) -> bool {
        match self {
            PayloadRule::Empty => len == 0,
            PayloadRule::Pmtu => len == pmtu,
            PayloadRule::Last => len >= 1 && len <= pmtu,
            PayloadRule::UpToPmtu => len <= pmtu,
            PayloadRule::Exact(n) => len == n,
        }
    }

    /// The length the codec itself enforces, if any (no PMTU needed).
    pub const fn fixed_len(self) -> Option<usize> {
        match self {
            PayloadRule::Empty => Some(0),
            PayloadRule::Exact(n) => Some(n),
            _ => None,
        }
    }
}

/// A set of extension headers (bit set). Iteration order is wire order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct HeaderSet(u16);

impl HeaderSet {
    /// No extension headers.
    pub const NONE: HeaderSet = HeaderSet(0);
    /// Datagram ETH (UD).
    pub const DETH: HeaderSet = HeaderSet(1 << 0);
    /// Flush ETH.
    pub const FETH: HeaderSet = HeaderSet(1 << 1);
    /// RDMA ETH.
    pub const RETH: HeaderSet = HeaderSet(1 << 2);
    /// Atomic ETH.
    pub const ATOMIC_ETH: HeaderSet = HeaderSet(1 << 3);
    /// Immediate data.
    pub const IMM_DT: HeaderSet = HeaderSet(1 << 4);
    /// Invalidate ETH.
    pub const IETH: HeaderSet = HeaderSet(1 << 5);
    /// ACK ETH.
    pub const AETH: HeaderSet = HeaderSet(1 << 6);
    /// Atomic ACK ETH.
    pub const ATOMIC_ACK_ETH: HeaderSet = HeaderSet(1 << 7);

    /// Wire order of all headers with their sizes and names.
    pub const ORDER: [(HeaderSet, usize, &'static str); 8] = [
        (HeaderSet::DETH, 8, "DETH"),
        (HeaderSet::FETH, 4, "FETH"),
        (HeaderSet::RETH, 16, "RETH"),
        (HeaderSet::ATOMIC_ETH, 28, "AtomicETH"),
        (HeaderSet::IMM_DT, 4, "ImmDt"),
        (HeaderSet::IETH, 4, "IETH"),
        (HeaderSet::AETH, 4, "AETH"),
        (HeaderSet::ATOMIC_ACK_ETH, 8, "AtomicAckETH"),
    ];

    /// Union of two sets.
    pub const fn with(self, other: HeaderSet) -> HeaderSet {
        HeaderSet(self.0 | other.0)
    }
    /// Does the set contain all of `other`?
    pub const fn contains(self, other: HeaderSet) -> bool {
        self.0 & other.0 == other.0
    }
    /// Raw bits.
    pub const fn bits(self) -> u16 {
        self.0
    }
    /// Total size in bytes of the headers in the set.
    pub const fn len(self) -> usize {
        let mut total = 0;
        let mut i = 0;
        while i < Self::ORDER.len() {
            if self.0 & Self::ORDER[i].0 .0 != 0 {
                total += Self::ORDER[i].1;
            }
            i += 1;
        }
        total
    }
    /// Is the set empty?
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

/// Static facts about one opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpcodeInfo {
    /// IBA name, e.g. `"RC_SEND_ONLY"`.
    pub name: &'static str,
    /// Extension headers that follow the BTH, in wire order.
    pub headers: HeaderSet,
    /// Payload length rule.
    pub payload: PayloadRule,
    /// Operation kind.
    pub kind: OpKind,
    /// Position in the message.
    pub position: Position,
}

impl OpcodeInfo {
    /// Sent by a requester (SEND, WRITE, READ request, atomics, FLUSH, ATOMIC_WRITE).
    pub const fn is_request(&self) -> bool {
        matches!(
            self.kind,
            OpKind::Send
                | OpKind::Write
                | OpKind::ReadRequest
                | OpKind::Atomic
                | OpKind::Flush
                | OpKind::AtomicWrite
        )
    }
    /// Sent by a responder (READ responses, ACK, ATOMIC ACK).
    pub const fn is_response(&self) -> bool {
        matches!(
            self.kind,
            OpKind::ReadResponse | OpKind::Ack | OpKind::AtomicAck
        )
    }
    /// Starts a message (FIRST or ONLY).
    pub const fn starts_message(&self) -> bool {
        self.position.starts()
    }
    /// Ends a message (LAST or ONLY).
    pub const fn ends_message(&self) -> bool {
        self.position.ends()
    }
    /// Length of the extension headers after the BTH.
    pub const fn ext_len(&self) -> usize {
        self.headers.len()
    }
}

macro_rules! opcodes {
    ($( $(#[$doc:meta])* $var:ident = $val:literal, $name:literal, [$($h:ident),*], $pl:expr, $kind:ident, $pos:ident; )*) => {
        /// A BTH opcode supported by this codec.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u8)]
        pub enum Opcode {
            $( $(#[$doc])* $var = $val, )*
        }

        impl Opcode {
            /// Every supported opcode, in numeric order.
            pub const ALL: &'static [Opcode] = &[$(Opcode::$var),*];

            /// Decode a raw opcode byte.
            pub const fn from_u8(v: u8) -> Option<Opcode> {
                match v {
                    $( $val => Some(Opcode::$var), )*
                    _ => None,
                }
            }

            /// Static information for this opcode.
            pub const fn info(self) -> OpcodeInfo {
                match self {
                    $( Opcode::$var => OpcodeInfo {
                        name: $name,
                        headers: HeaderSet::NONE $(.with(HeaderSet::$h))*,
                        payload: $pl,
                        kind: OpKind::$kind,
                        position: Position::$pos,
                    }, )*
                }
            }
        }
    };
}

use PayloadRule::{Empty, Exact, Last as PLast, Pmtu, UpToPmtu};

opcodes! {
    /// RC SEND FIRST.
    RcSendFirst = 0x00, "RC_SEND_FIRST", [], Pmtu, Send, First;
    /// RC SEND MIDDLE.
    RcSendMiddle = 0x01, "RC_SEND_MIDDLE", [], Pmtu, Send, Middle;
    /// RC SEND LAST.
    RcSendLast = 0x02, "RC_SEND_LAST", [], PLast, Send, Last;
    /// RC SEND LAST with immediate.
    RcSendLastImm = 0x03, "RC_SEND_LAST_WITH_IMMEDIATE", [IMM_DT], PLast, Send, Last;
    /// RC SEND ONLY.
    RcSendOnly = 0x04, "RC_SEND_ONLY", [], UpToPmtu, Send, Only;
    /// RC SEND ONLY with immediate.
    RcSendOnlyImm = 0x05, "RC_SEND_ONLY_WITH_IMMEDIATE", [IMM_DT], UpToPmtu, Send, Only;
    /// RC RDMA WRITE FIRST.
    RcWriteFirst = 0x06, "RC_RDMA_WRITE_FIRST", [RETH], Pmtu, Write, First;
    /// RC RDMA WRITE MIDDLE.
    RcWriteMiddle = 0x07, "RC_RDMA_WRITE_MIDDLE", [], Pmtu, Write, Middle;
    /// RC RDMA WRITE LAST.
    RcWriteLast = 0x08, "RC_RDMA_WRITE_LAST", [], PLast, Write, Last;
    /// RC RDMA WRITE LAST with immediate.
    RcWriteLastImm = 0x09, "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE", [IMM_DT], PLast, Write, Last;
    /// RC RDMA WRITE ONLY.
    RcWriteOnly = 0x0a, "RC_RDMA_WRITE_ONLY", [RETH], UpToPmtu, Write, Only;
    /// RC RDMA WRITE ONLY with immediate.
    RcWriteOnlyImm = 0x0b, "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", [RETH, IMM_DT], UpToPmtu, Write, Only;
    /// RC RDMA READ request.
    RcReadRequest = 0x0c, "RC_RDMA_READ_REQUEST", [RETH], Empty, ReadRequest, Only;
    /// RC RDMA READ response FIRST.
    RcReadResponseFirst = 0x0d, "RC_RDMA_READ_RESPONSE_FIRST", [AETH], Pmtu, ReadResponse, First;
    /// RC RDMA READ response MIDDLE (no AETH).
    RcReadResponseMiddle = 0x0e, "RC_RDMA_READ_RESPONSE_MIDDLE", [], Pmtu, ReadResponse, Middle;
    /// RC RDMA READ response LAST.
    RcReadResponseLast = 0x0f, "RC_RDMA_READ_RESPONSE_LAST", [AETH], PLast, ReadResponse, Last;
    /// RC RDMA READ response ONLY.
    RcReadResponseOnly = 0x10, "RC_RDMA_READ_RESPONSE_ONLY", [AETH], UpToPmtu, ReadResponse, Only;
    /// RC ACKNOWLEDGE.
    RcAcknowledge = 0x11, "RC_ACKNOWLEDGE", [AETH], Empty, Ack, Only;
    /// RC ATOMIC ACKNOWLEDGE.
    RcAtomicAcknowledge = 0x12, "RC_ATOMIC_ACKNOWLEDGE", [AETH, ATOMIC_ACK_ETH], Empty, AtomicAck, Only;
    /// RC COMPARE SWAP.
    RcCompareSwap = 0x13, "RC_COMPARE_SWAP", [ATOMIC_ETH], Empty, Atomic, Only;
    /// RC FETCH ADD.
    RcFetchAdd = 0x14, "RC_FETCH_ADD", [ATOMIC_ETH], Empty, Atomic, Only;
    /// RC SEND LAST with invalidate.
    RcSendLastInv = 0x16, "RC_SEND_LAST_WITH_INVALIDATE", [IETH], PLast, Send, Last;
    /// RC SEND ONLY with invalidate.
    RcSendOnlyInv = 0x17, "RC_SEND_ONLY_WITH_INVALIDATE", [IETH], UpToPmtu, Send, Only;
    /// RC FLUSH (IBA 1.5): FETH then RETH.
    RcFlush = 0x1c, "RC_FLUSH", [FETH, RETH], Empty, Flush, Only;
    /// RC ATOMIC WRITE (IBA 1.5): RETH and an 8-byte payload.
    RcAtomicWrite = 0x1d, "RC_ATOMIC_WRITE", [RETH], Exact(8), AtomicWrite, Only;
    /// UC SEND FIRST.
    UcSendFirst = 0x20, "UC_SEND_FIRST", [], Pmtu, Send, First;
    /// UC SEND MIDDLE.
    UcSendMiddle = 0x21, "UC_SEND_MIDDLE", [], Pmtu, Send, Middle;
    /// UC SEND LAST.
    UcSendLast = 0x22, "UC_SEND_LAST", [], PLast, Send, Last;
    /// UC SEND LAST with immediate.
    UcSendLastImm = 0x23, "UC_SEND_LAST_WITH_IMMEDIATE", [IMM_DT], PLast, Send, Last;
    /// UC SEND ONLY.
    UcSendOnly = 0x24, "UC_SEND_ONLY", [], UpToPmtu, Send, Only;
    /// UC SEND ONLY with immediate.
    UcSendOnlyImm = 0x25, "UC_SEND_ONLY_WITH_IMMEDIATE", [IMM_DT], UpToPmtu, Send, Only;
    /// UC RDMA WRITE FIRST.
    UcWriteFirst = 0x26, "UC_RDMA_WRITE_FIRST", [RETH], Pmtu, Write, First;
    /// UC RDMA WRITE MIDDLE.
    UcWriteMiddle = 0x27, "UC_RDMA_WRITE_MIDDLE", [], Pmtu, Write, Middle;
    /// UC RDMA WRITE LAST.
    UcWriteLast = 0x28, "UC_RDMA_WRITE_LAST", [], PLast, Write, Last;
    /// UC RDMA WRITE LAST with immediate.
    UcWriteLastImm = 0x29, "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE", [IMM_DT], PLast, Write, Last;
    /// UC RDMA WRITE ONLY.
    UcWriteOnly = 0x2a, "UC_RDMA_WRITE_ONLY", [RETH], UpToPmtu, Write, Only;
    /// UC RDMA WRITE ONLY with immediate.
    UcWriteOnlyImm = 0x2b, "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", [RETH, IMM_DT], UpToPmtu, Write, Only;
    /// UD SEND ONLY (DETH).
    UdSendOnly = 0x64, "UD_SEND_ONLY", [DETH], UpToPmtu, Send, Only;
    /// UD SEND ONLY with immediate (DETH, ImmDt).
    UdSendOnlyImm = 0x65, "UD_SEND_ONLY_WITH_IMMEDIATE", [DETH, IMM_DT], UpToPmtu, Send, Only;
    /// RoCEv2 Congestion Notification Packet: BTH, 16 reserved bytes (carried as payload), ICRC.
    Cnp = 0x81, "CNP", [], Exact(16), Cnp, Only;
}

impl Opcode {
    /// Raw opcode byte.
    pub const fn as_u8(self) -> u8 {
        self as u8
    }

    /// Transport service of this opcode.
    pub const fn transport(self) -> Transport {
        if matches!(self, Opcode::Cnp) {
            return Transport::Cnp;
        }
        match (self as u8) >> 5 {
            0 => Transport::Rc,
            1 => Transport::Uc,
            2 => Transport::Rd,
            _ => Transport::Ud,
        }
    }
}

impl TryFrom<u8> for Opcode {
    type Error = CodecError;
    fn try_from(v: u8) -> Result<Self, CodecError> {
        Opcode::from_u8(v).ok_or(CodecError::BadOpcode(v))
    }
}

impl From<Opcode> for u8 {
    fn from(op: Opcode) -> u8 {
        op as u8
    }
}

impl core::fmt::Display for Opcode {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.info().name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_all_bytes() {
        let mut n = 0;
        for v in 0..=255u8 {
            if let Some(op) = Opcode::from_u8(v) {
                assert_eq!(op.as_u8(), v);
                n += 1;
            }
        }
        assert_eq!(n, Opcode::ALL.len());
        assert_eq!(n, 25 + 12 + 2 + 1);
    }

    #[test]
    fn table_facts() {
        assert_eq!(Opcode::RcReadResponseMiddle.info().headers, HeaderSet::NONE);
        assert_eq!(Opcode::RcWriteOnlyImm.info().ext_len(), 20);
        assert_eq!(Opcode::RcAtomicAcknowledge.info().ext_len(), 12);
        assert_eq!(Opcode::RcFlush.info().ext_len(), 20);
        assert_eq!(Opcode::UdSendOnlyImm.info().ext_len(), 12);
        assert_eq!(Opcode::RcCompareSwap.info().ext_len(), 28);
        assert!(Opcode::RcReadRequest.info().is_request());
        assert!(Opcode::RcReadResponseFirst.info().is_response());
        assert!(!Opcode::Cnp.info().is_request() && !Opcode::Cnp.info().is_response());
        assert!(Opcode::RcSendFirst.info().starts_message());
        assert!(!Opcode::RcSendFirst.info().ends_message());
        assert_eq!(Opcode::UcWriteOnly.transport(), Transport::Uc);
        assert_eq!(Opcode::UdSendOnly.transport(), Transport::Ud);
        assert_eq!(Opcode::Cnp.transport(), Transport::Cnp);
        assert!(PayloadRule::Last.check(1, 256) && !PayloadRule::Last.check(0, 256));
        assert!(PayloadRule::Pmtu.check(1024, 1024) && !PayloadRule::Pmtu.check(1020, 1024));
        // UC has only SEND and WRITE: every UC opcode mirrors an RC one.
        for op in Opcode::ALL
            .iter()
            .filter(|o| o.transport() == Transport::Uc)
        {
            let rc = Opcode::from_u8(op.as_u8() & 0x1f).unwrap();
            assert_eq!(rc.info().headers, op.info().headers);
            assert_eq!(rc.info().payload, op.info().payload);
        }
    }
}

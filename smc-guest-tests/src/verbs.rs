//! Device-independent parts of the `verbs` test: the test list, the TCP wire
//! format (QP info, hello, control messages), the expected data / immediate /
//! atomic values and their checks, and RoCEv2 GID selection from sysfs.
//!
//! Everything here runs without an RDMA device (unit tests on the host); the
//! verbs calls themselves live in `verbs_ib`, `verbs_cm` and `verbs_run`.

use crate::pattern::{splitmix64, Pattern, Way};
use std::fmt;
use std::io::{self, Read, Write};
use std::net::Ipv4Addr;
use std::path::Path;

/// One verbs test. The discriminant is the wire id (bit in the hello mask).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum VerbsTest {
    /// RC SEND -> RECV, data verified on the receiver.
    Send = 0,
    /// SEND with immediate: data and immediate value verified.
    SendImm = 1,
    /// RDMA WRITE into the peer's buffer, verified there.
    Write = 2,
    /// RDMA WRITE with immediate: the immediate consumes a RECV on the peer.
    WriteImm = 3,
    /// RDMA READ of the peer's buffer, verified locally.
    Read = 4,
    /// Atomic compare-and-swap (a matching and a non-matching compare per iteration).
    Cas = 5,
    /// Atomic fetch-and-add.
    Faa = 6,
}

impl VerbsTest {
    /// Every test, in run order.
    pub const ALL: [VerbsTest; 7] = [
        VerbsTest::Send,
        VerbsTest::SendImm,
        VerbsTest::Write,
        VerbsTest::WriteImm,
        VerbsTest::Read,
        VerbsTest::Cas,
        VerbsTest::Faa,
    ];

    /// Name used on the command line and in result lines.
    pub fn name(self) -> &'static str {
        match self {
            VerbsTest::Send => "send",
            VerbsTest::SendImm => "send_imm",
            VerbsTest::Write => "write",
            VerbsTest::WriteImm => "write_imm",
            VerbsTest::Read => "read",
            VerbsTest::Cas => "cas",
            VerbsTest::Faa => "faa",
        }
    }

    /// Wire id.
    pub fn id(self) -> u8 {
        self as u8
    }

    /// Test with wire id `id`.
    pub fn from_id(id: u8) -> Option<Self> {
        Self::ALL.get(usize::from(id)).copied()
    }

    /// Atomic tests move 8 bytes per operation, not `--size`.
    pub fn is_atomic(self) -> bool {
        matches!(self, VerbsTest::Cas | VerbsTest::Faa)
    }

    /// Tests whose requests consume a RECV on the server.
    pub fn uses_recv(self) -> bool {
        matches!(
            self,
            VerbsTest::Send | VerbsTest::SendImm | VerbsTest::WriteImm
        )
    }

    /// Tests carrying an immediate value.
    pub fn has_imm(self) -> bool {
        matches!(self, VerbsTest::SendImm | VerbsTest::WriteImm)
    }
}

impl fmt::Display for VerbsTest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Parses `send,write,...` or `all` into a sorted, de-duplicated list.
pub fn parse_tests(s: &str) -> Result<Vec<VerbsTest>, String> {
    let mut v = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if part.eq_ignore_ascii_case("all") {
            v.extend(VerbsTest::ALL);
            continue;
        }
        let t = VerbsTest::ALL
            .iter()
            .copied()
            .find(|t| t.name().eq_ignore_ascii_case(part) || t.name().replace('_', "-") == part)
            .ok_or_else(|| {
                format!(
                    "unknown verbs test {part:?} (have: all, {})",
                    VerbsTest::ALL.map(|t| t.name()).join(", ")
                )
            })?;
        v.push(t);
    }
    if v.is_empty() {
        return Err("no verbs test given".into());
    }
    v.sort();
    v.dedup();
    Ok(v)
}

fn tests_mask(tests: &[VerbsTest]) -> u16 {
    tests.iter().fold(0, |m, t| m | (1 << t.id()))
}

fn tests_from_mask(mask: u16) -> Result<Vec<VerbsTest>, String> {
    let known = tests_mask(&VerbsTest::ALL);
    if mask & !known != 0 || mask == 0 {
        return Err(format!("bad test mask {mask:#06x}"));
    }
    Ok(VerbsTest::ALL
        .into_iter()
        .filter(|t| mask & (1 << t.id()) != 0)
        .collect())
}

/// Largest `--size`.
pub const MAX_SIZE: u32 = 16 << 20;
/// Largest `--iters`.
pub const MAX_ITERS: u32 = 1024;
/// Largest `--size` x `--iters` (the registered buffer).
pub const MAX_TOTAL: u64 = 256 << 20;

/// What the client asks for; the server adopts it (and checks it against its
/// own options, if it was given any).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerbsConfig {
    /// Tests in run order.
    pub tests: Vec<VerbsTest>,
    /// Bytes per message (SEND / WRITE / READ).
    pub size: u32,
    /// Messages (or atomic operations) per test.
    pub iters: u32,
    /// Pattern seed.
    pub seed: u64,
}

impl VerbsConfig {
    /// Checks the limits.
    pub fn validate(&self) -> Result<(), String> {
        if self.tests.is_empty() {
            return Err("no verbs test given".into());
        }
        if self.size == 0 || self.size > MAX_SIZE {
            return Err(format!("--size must be 1 byte .. {MAX_SIZE}"));
        }
        if self.iters == 0 || self.iters > MAX_ITERS {
            return Err(format!("--iters must be 1 .. {MAX_ITERS}"));
        }
        if u64::from(self.size) * u64::from(self.iters) > MAX_TOTAL {
            return Err(format!(
                "--size x --iters must be at most {} MiB",
                MAX_TOTAL >> 20
            ));
        }
        Ok(())
    }

    /// The buffer layout both sides use.
    pub fn layout(&self) -> Layout {
        let data = u64::from(self.size) * u64::from(self.iters);
        let atomic_off = data.div_ceil(64) * 64;
        Layout {
            slot: u64::from(self.size),
            atomic_off,
            len: atomic_off + 64,
        }
    }
}

/// What a server was told on its command line: each given option must match
/// the client's config (the server otherwise adopts the client's).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExpectedConfig {
    /// `--tests`.
    pub tests: Option<Vec<VerbsTest>>,
    /// `--size`.
    pub size: Option<u32>,
    /// `--iters`.
    pub iters: Option<u32>,
    /// `--seed`.
    pub seed: Option<u64>,
}

impl ExpectedConfig {
    /// Names every given option that differs from `c`.
    pub fn check(&self, c: &VerbsConfig) -> Result<(), String> {
        let mut bad = Vec::new();
        if let Some(t) = &self.tests {
            if *t != c.tests {
                let names =
                    |v: &[VerbsTest]| v.iter().map(|t| t.name()).collect::<Vec<_>>().join(",");
                bad.push(format!(
                    "tests {} (client) vs {} (server)",
                    names(&c.tests),
                    names(t)
                ));
            }
        }
        let mut num = |what: &str, mine: Option<u64>, theirs: u64| {
            if let Some(m) = mine {
                if m != theirs {
                    bad.push(format!("{what} {theirs} (client) vs {m} (server)"));
                }
            }
        };
        num("size", self.size.map(u64::from), u64::from(c.size));
        num("iters", self.iters.map(u64::from), u64::from(c.iters));
        num("seed", self.seed, c.seed);
        if bad.is_empty() {
            Ok(())
        } else {
            Err(format!("config mismatch: {}", bad.join("; ")))
        }
    }
}

/// Registered buffer layout: `iters` message slots of `size` bytes, then a
/// 64-byte aligned area for the atomic target (server) / atomic results
/// (client).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Bytes per message slot.
    pub slot: u64,
    /// Offset of the atomic word (8-byte aligned).
    pub atomic_off: u64,
    /// Total buffer length.
    pub len: u64,
}

impl Layout {
    /// Byte range of message slot `i`.
    pub fn slot_range(&self, i: u32) -> std::ops::Range<usize> {
        let s = (self.slot * u64::from(i)) as usize;
        s..s + self.slot as usize
    }
}

// ---------------------------------------------------------------------------
// expected values

/// The data pattern of message `iter` of `test` (per-message key, offset 0).
pub fn msg_pattern(seed: u64, test: VerbsTest, iter: u32, way: Way) -> Pattern {
    Pattern::new(seed, (u32::from(test.id()) << 16) | (iter & 0xffff), way)
}

/// The direction data flows in a test: READ moves server data to the client.
pub fn data_way(test: VerbsTest) -> Way {
    if test == VerbsTest::Read {
        Way::ServerToClient
    } else {
        Way::ClientToServer
    }
}

/// Immediate value (host order) of message `iter` of `test`.
pub fn imm_value(seed: u64, test: VerbsTest, iter: u32) -> u32 {
    (splitmix64(seed ^ (u64::from(test.id()) << 40) ^ u64::from(iter)) >> 16) as u32
}

/// Compare-and-swap chain: the server's word starts at `cas_value(seed, 0)`;
/// iteration `i` swaps `cas_value(i)` for `cas_value(i + 1)` and then tries a
/// stale compare (`cas_value(i)` again) that must not swap.
pub fn cas_value(seed: u64, i: u32) -> u64 {
    splitmix64(seed ^ 0xC0A5_0000_0000 ^ u64::from(i))
}

/// Value the stale compare of iteration `i` tries to store (must never land).
pub fn cas_poison(seed: u64, i: u32) -> u64 {
    !cas_value(seed, i + 1)
}

/// Fetch-and-add: initial word.
pub fn faa_initial(seed: u64) -> u64 {
    splitmix64(seed ^ 0xFAA0_0000_0000)
}

/// Fetch-and-add: the addend of iteration `i`.
pub fn faa_addend(seed: u64, i: u32) -> u64 {
    splitmix64(seed ^ 0xADD0_0000_0000 ^ u64::from(i))
}

/// Fetch-and-add: the value the word holds before iteration `i` (= what the
/// atomic of iteration `i` returns); `i = iters` gives the final value.
pub fn faa_before(seed: u64, i: u32) -> u64 {
    (0..i).fold(faa_initial(seed), |v, j| {
        v.wrapping_add(faa_addend(seed, j))
    })
}

/// The server's atomic word after a complete run of `test` with `iters`.
pub fn atomic_final(seed: u64, test: VerbsTest, iters: u32) -> u64 {
    match test {
        VerbsTest::Cas => cas_value(seed, iters),
        _ => faa_before(seed, iters),
    }
}

/// The server's atomic word before `test`.
pub fn atomic_initial(seed: u64, test: VerbsTest) -> u64 {
    match test {
        VerbsTest::Cas => cas_value(seed, 0),
        _ => faa_initial(seed),
    }
}

/// A work completion reduced to what the checks look at (so they can be
/// tested without a device).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// `wr_id` of the work request.
    pub wr_id: u64,
    /// `None` = IBV_WC_SUCCESS, else (status, vendor_err).
    pub error: Option<(u32, u32)>,
    /// Work completion opcode (`ibv_wc_opcode`).
    pub opcode: u32,
    /// `byte_len`.
    pub byte_len: u32,
    /// Immediate value (host order) if `IBV_WC_WITH_IMM`.
    pub imm: Option<u32>,
}

/// `IBV_WC_RECV`.
pub const WC_RECV: u32 = 128;
/// `IBV_WC_RECV_RDMA_WITH_IMM`.
pub const WC_RECV_RDMA_WITH_IMM: u32 = 129;

/// Checks a receive completion of `test` message `iter` (wr_id = iter):
/// status, opcode, length and immediate. The data is checked separately.
pub fn check_recv(seed: u64, test: VerbsTest, size: u32, c: &Completion) -> Result<(), String> {
    let iter = c.wr_id as u32;
    if let Some((st, ve)) = c.error {
        return Err(format!(
            "receive {iter}: completion status {st} ({}), vendor_err {ve:#x}",
            wc_status_name(st)
        ));
    }
    let (want_op, want_len) = match test {
        VerbsTest::WriteImm => (WC_RECV_RDMA_WITH_IMM, size),
        _ => (WC_RECV, size),
    };
    if c.opcode != want_op {
        return Err(format!(
            "receive {iter}: opcode {} but expected {want_op}",
            c.opcode
        ));
    }
    // RDMA WRITE with immediate: byte_len is the write's length on rxe;
    // the IB spec leaves it to the responder, so only SENDs are held to it.
    if test != VerbsTest::WriteImm && c.byte_len != want_len {
        return Err(format!(
            "receive {iter}: byte_len {} but {want_len} sent",
            c.byte_len
        ));
    }
    match (test.has_imm(), c.imm) {
        (true, None) => Err(format!(
            "receive {iter}: no immediate (IBV_WC_WITH_IMM clear)"
        )),
        (true, Some(v)) => {
            let want = imm_value(seed, test, iter);
            if v == want {
                Ok(())
            } else {
                Err(format!(
                    "receive {iter}: immediate {v:#010x}, expected {want:#010x}"
                ))
            }
        }
        (false, Some(v)) => Err(format!("receive {iter}: unexpected immediate {v:#010x}")),
        (false, None) => Ok(()),
    }
}

/// Checks message slot data against its pattern; the error names the first
/// wrong byte.
pub fn check_slot(seed: u64, test: VerbsTest, iter: u32, data: &[u8]) -> Result<(), String> {
    match msg_pattern(seed, test, iter, data_way(test)).verify(0, data) {
        None => Ok(()),
        Some(off) => Err(format!(
            "message {iter}: byte {off} of {} is {:#04x}, expected {:#04x}",
            data.len(),
            data[off as usize],
            msg_pattern(seed, test, iter, data_way(test)).byte_at(off)
        )),
    }
}

/// Checks what an atomic returned (the old value).
pub fn check_atomic_old(what: &str, iter: u32, got: u64, want: u64) -> Result<(), String> {
    if got == want {
        Ok(())
    } else {
        Err(format!(
            "{what} {iter}: returned old value {got:#018x}, expected {want:#018x}"
        ))
    }
}

/// Name of an `ibv_wc_status`.
pub fn wc_status_name(st: u32) -> &'static str {
    const NAMES: [&str; 23] = [
        "SUCCESS",
        "LOC_LEN_ERR",
        "LOC_QP_OP_ERR",
        "LOC_EEC_OP_ERR",
        "LOC_PROT_ERR",
        "WR_FLUSH_ERR",
        "MW_BIND_ERR",
        "BAD_RESP_ERR",
        "LOC_ACCESS_ERR",
        "REM_INV_REQ_ERR",
        "REM_ACCESS_ERR",
        "REM_OP_ERR",
        "RETRY_EXC_ERR",
        "RNR_RETRY_EXC_ERR",
        "LOC_RDD_VIOL_ERR",
        "REM_INV_RD_REQ_ERR",
        "REM_ABORT_ERR",
        "INV_EECN_ERR",
        "INV_EEC_STATE_ERR",
        "FATAL_ERR",
        "RESP_TIMEOUT_ERR",
        "GENERAL_ERR",
        "TM_ERR",
    ];
    NAMES.get(st as usize).copied().unwrap_or("?")
}

// ---------------------------------------------------------------------------
// capabilities and skips

/// What one side's device can do (sent in its QP info).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Caps {
    /// iWARP transport (siw): connected through rdma_cm.
    pub iwarp: bool,
    /// The device supports atomics (`atomic_cap` != NONE).
    pub atomics: bool,
}

/// Why `test` cannot run between these two devices, if it cannot. Both sides
/// compute the same answer from both sides' caps.
pub fn skip_reason(test: VerbsTest, local: Caps, remote: Caps) -> Option<String> {
    let iwarp = local.iwarp || remote.iwarp;
    match test {
        VerbsTest::SendImm | VerbsTest::WriteImm if iwarp => Some(format!(
            "iWARP has no immediate data: RDMAP (RFC 5040) has no {} with immediate and siw/libsiw reject \
             IBV_WR_{}_WITH_IMM",
            if test == VerbsTest::SendImm { "SEND" } else { "RDMA WRITE" },
            if test == VerbsTest::SendImm { "SEND" } else { "RDMA_WRITE" },
        )),
        VerbsTest::Cas | VerbsTest::Faa if iwarp => Some(
            "iWARP has no atomics: RDMAP (RFC 5040) has none, siw reports atomic_cap NONE and libsiw rejects \
             IBV_WR_ATOMIC_*"
                .into(),
        ),
        VerbsTest::Cas | VerbsTest::Faa if !(local.atomics && remote.atomics) => Some(format!(
            "{} device reports atomic_cap NONE",
            if local.atomics { "the peer's" } else { "this" }
        )),
        _ => None,
    }
}

// ---------------------------------------------------------------------------
// wire format (all integers big-endian)

/// A QP's connection info, exchanged over TCP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpInfo {
    /// QP number (24 bits).
    pub qpn: u32,
    /// Initial packet sequence number of its send queue (24 bits).
    pub psn: u32,
    /// Port LID (0 on RoCE / iWARP).
    pub lid: u16,
    /// Port active MTU as `ibv_mtu` (1 = 256 .. 5 = 4096).
    pub mtu: u8,
    /// Source GID (RoCEv2: `::ffff:a.b.c.d`).
    pub gid: [u8; 16],
    /// Registered buffer address.
    pub addr: u64,
    /// Registered buffer length.
    pub len: u64,
    /// Remote key of the buffer.
    pub rkey: u32,
    /// Device capabilities.
    pub caps: Caps,
}

const QP_MAGIC: &[u8; 4] = b"VRQP";
const HELLO_MAGIC: &[u8; 4] = b"VRVH";
const WIRE_VERSION: u16 = 1;
/// Encoded size of [`QpInfo`].
pub const QP_INFO_LEN: usize = 56;

impl QpInfo {
    /// Fixed-size encoding.
    pub fn encode(&self) -> [u8; QP_INFO_LEN] {
        let mut b = [0u8; QP_INFO_LEN];
        b[0..4].copy_from_slice(QP_MAGIC);
        b[4..6].copy_from_slice(&WIRE_VERSION.to_be_bytes());
        b[6] = u8::from(self.caps.iwarp) | (u8::from(self.caps.atomics) << 1);
        b[7] = self.mtu;
        b[8..12].copy_from_slice(&self.qpn.to_be_bytes());
        b[12..16].copy_from_slice(&self.psn.to_be_bytes());
        b[16..18].copy_from_slice(&self.lid.to_be_bytes());
        b[20..36].copy_from_slice(&self.gid);
        b[36..44].copy_from_slice(&self.addr.to_be_bytes());
        b[44..52].copy_from_slice(&self.len.to_be_bytes());
        b[52..56].copy_from_slice(&self.rkey.to_be_bytes());
        b
    }

    /// Decodes and validates (hostile peer: every field checked).
    pub fn decode(b: &[u8]) -> Result<Self, String> {
        if b.len() != QP_INFO_LEN {
            return Err(format!(
                "QP info: {} bytes, expected {QP_INFO_LEN}",
                b.len()
            ));
        }
        if &b[0..4] != QP_MAGIC {
            return Err("QP info: bad magic (not a verbs peer?)".into());
        }
        let ver = u16::from_be_bytes([b[4], b[5]]);
        if ver != WIRE_VERSION {
            return Err(format!("QP info: version {ver}, expected {WIRE_VERSION}"));
        }
        if b[6] & !3 != 0 {
            return Err(format!("QP info: unknown capability bits {:#04x}", b[6]));
        }
        let be32 = |o: usize| u32::from_be_bytes(b[o..o + 4].try_into().unwrap());
        let be64 = |o: usize| u64::from_be_bytes(b[o..o + 8].try_into().unwrap());
        let q = QpInfo {
            caps: Caps {
                iwarp: b[6] & 1 != 0,
                atomics: b[6] & 2 != 0,
            },
            mtu: b[7],
            qpn: be32(8),
            psn: be32(12),
            lid: u16::from_be_bytes([b[16], b[17]]),
            gid: b[20..36].try_into().unwrap(),
            addr: be64(36),
            len: be64(44),
            rkey: be32(52),
        };
        if q.qpn == 0 || q.qpn > 0xff_ffff {
            return Err(format!("QP info: bad QP number {:#x}", q.qpn));
        }
        if q.psn > 0xff_ffff {
            return Err(format!("QP info: PSN {:#x} has more than 24 bits", q.psn));
        }
        if !(1..=5).contains(&q.mtu) {
            return Err(format!("QP info: bad MTU enum {}", q.mtu));
        }
        if q.addr.checked_add(q.len).is_none() {
            return Err("QP info: buffer address + length overflows".into());
        }
        Ok(q)
    }
}

/// Client -> server: config + the client's QP info.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    /// The run's configuration.
    pub cfg: VerbsConfig,
    /// The client's QP.
    pub qp: QpInfo,
}

/// Encoded size of [`Hello`].
pub const HELLO_LEN: usize = 24 + QP_INFO_LEN;

impl Hello {
    /// Fixed-size encoding.
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[0..4].copy_from_slice(HELLO_MAGIC);
        b[4..6].copy_from_slice(&WIRE_VERSION.to_be_bytes());
        b[6..8].copy_from_slice(&tests_mask(&self.cfg.tests).to_be_bytes());
        b[8..12].copy_from_slice(&self.cfg.size.to_be_bytes());
        b[12..16].copy_from_slice(&self.cfg.iters.to_be_bytes());
        b[16..24].copy_from_slice(&self.cfg.seed.to_be_bytes());
        b[24..].copy_from_slice(&self.qp.encode());
        b
    }

    /// Decodes and validates.
    pub fn decode(b: &[u8]) -> Result<Self, String> {
        if b.len() != HELLO_LEN {
            return Err(format!("hello: {} bytes, expected {HELLO_LEN}", b.len()));
        }
        if &b[0..4] != HELLO_MAGIC {
            return Err("hello: bad magic (not a verbs client?)".into());
        }
        let ver = u16::from_be_bytes([b[4], b[5]]);
        if ver != WIRE_VERSION {
            return Err(format!("hello: version {ver}, expected {WIRE_VERSION}"));
        }
        let cfg = VerbsConfig {
            tests: tests_from_mask(u16::from_be_bytes([b[6], b[7]]))?,
            size: u32::from_be_bytes(b[8..12].try_into().unwrap()),
            iters: u32::from_be_bytes(b[12..16].try_into().unwrap()),
            seed: u64::from_be_bytes(b[16..24].try_into().unwrap()),
        };
        cfg.validate().map_err(|e| format!("hello: {e}"))?;
        let qp = QpInfo::decode(&b[24..])?;
        if qp.len < cfg.layout().len {
            return Err(format!(
                "hello: client buffer of {} bytes is smaller than the layout's {}",
                qp.len,
                cfg.layout().len
            ));
        }
        Ok(Hello { cfg, qp })
    }
}

/// Control messages after the hello.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ctl {
    /// Server -> client: the server's answer to the hello.
    Accept(QpInfo),
    /// Server -> client: the hello was refused.
    Refuse(String),
    /// The QP is connected on this side (RTS / ESTABLISHED).
    Connected,
    /// Server -> client: buffers prepared (and RECVs posted) for a test.
    Ready(VerbsTest),
    /// This side's verdict on a test (`Err` = failure reason).
    Done(VerbsTest, Result<(), String>),
}

/// Longest reason string carried on the wire.
pub const MAX_REASON: usize = 2048;

impl Ctl {
    /// Encoding: kind u8, test u8, flag u8, 0, payload length u32, payload.
    pub fn encode(&self) -> Vec<u8> {
        let (kind, test, flag, payload): (u8, u8, u8, Vec<u8>) = match self {
            Ctl::Accept(q) => (1, 0, 0, q.encode().to_vec()),
            Ctl::Refuse(r) => (2, 0, 0, clip(r).into_bytes()),
            Ctl::Connected => (3, 0, 0, Vec::new()),
            Ctl::Ready(t) => (4, t.id(), 0, Vec::new()),
            Ctl::Done(t, Ok(())) => (5, t.id(), 1, Vec::new()),
            Ctl::Done(t, Err(r)) => (5, t.id(), 0, clip(r).into_bytes()),
        };
        let mut b = vec![kind, test, flag, 0];
        b.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        b.extend_from_slice(&payload);
        b
    }

    /// Reads one message (bounded: a payload over [`MAX_REASON`] is an error).
    pub fn read_from(r: &mut impl Read) -> io::Result<Ctl> {
        let mut h = [0u8; 8];
        r.read_exact(&mut h)?;
        let len = u32::from_be_bytes(h[4..8].try_into().unwrap()) as usize;
        let bad = |m: String| io::Error::new(io::ErrorKind::InvalidData, m);
        if len > MAX_REASON.max(QP_INFO_LEN) {
            return Err(bad(format!("control message of {len} bytes")));
        }
        let mut p = vec![0u8; len];
        r.read_exact(&mut p)?;
        let test =
            || VerbsTest::from_id(h[1]).ok_or_else(|| bad(format!("unknown test id {}", h[1])));
        let text = |p: Vec<u8>| String::from_utf8_lossy(&p).into_owned();
        Ok(match h[0] {
            1 => Ctl::Accept(QpInfo::decode(&p).map_err(bad)?),
            2 => Ctl::Refuse(text(p)),
            3 => Ctl::Connected,
            4 => Ctl::Ready(test()?),
            5 if h[2] == 1 => Ctl::Done(test()?, Ok(())),
            5 => Ctl::Done(test()?, Err(text(p))),
            k => return Err(bad(format!("unknown control message kind {k}"))),
        })
    }

    /// Writes one message.
    pub fn write_to(&self, w: &mut impl Write) -> io::Result<()> {
        w.write_all(&self.encode())?;
        w.flush()
    }
}

fn clip(s: &str) -> String {
    if s.len() <= MAX_REASON {
        return s.to_string();
    }
    let mut end = MAX_REASON;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

// ---------------------------------------------------------------------------
// GID selection (RoCE)

/// The GID a RoCE QP uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GidChoice {
    /// Index in the port's GID table.
    pub index: u32,
    /// The GID.
    pub gid: [u8; 16],
    /// The IPv4 address of an IPv4-mapped GID.
    pub ipv4: Option<Ipv4Addr>,
}

/// Parses a sysfs GID (`fe80:0000:0000:0000:5054:00ff:fe77:010a`).
pub fn parse_sysfs_gid(s: &str) -> Option<[u8; 16]> {
    let groups: Vec<&str> = s.trim().split(':').collect();
    if groups.len() != 8 {
        return None;
    }
    let mut g = [0u8; 16];
    for (i, grp) in groups.iter().enumerate() {
        if grp.len() != 4 {
            return None;
        }
        let v = u16::from_str_radix(grp, 16).ok()?;
        g[2 * i..2 * i + 2].copy_from_slice(&v.to_be_bytes());
    }
    Some(g)
}

/// The IPv4 address of an IPv4-mapped GID (`::ffff:a.b.c.d`).
pub fn gid_ipv4(g: &[u8; 16]) -> Option<Ipv4Addr> {
    (g[..10].iter().all(|&b| b == 0) && g[10] == 0xff && g[11] == 0xff)
        .then(|| Ipv4Addr::new(g[12], g[13], g[14], g[15]))
}

/// Picks the GID from `<sysfs>/class/infiniband/<dev>/ports/<port>` (`port_dir`):
/// with `want = Some(i)` that index, which must hold a RoCE v2 GID; without,
/// the lowest-index RoCE v2 GID that is IPv4-mapped (what rxe over an IPv4
/// netdev needs), else the lowest RoCE v2 GID at all.
pub fn select_roce_gid(port_dir: &Path, want: Option<u32>) -> Result<GidChoice, String> {
    let gids = port_dir.join("gids");
    let types = port_dir.join("gid_attrs").join("types");
    let rd = std::fs::read_dir(&gids).map_err(|e| format!("{}: {e}", gids.display()))?;
    let mut table: Vec<(u32, [u8; 16], String)> = Vec::new();
    for ent in rd.flatten() {
        let Some(idx) = ent.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(text) = std::fs::read_to_string(ent.path()) else {
            continue;
        };
        let Some(gid) = parse_sysfs_gid(&text) else {
            continue;
        };
        if gid == [0u8; 16] {
            continue; // empty slot
        }
        // reading the type of an empty slot fails with EINVAL; of a used one it
        // is "IB/RoCE v1" or "RoCE v2"
        let ty = std::fs::read_to_string(types.join(idx.to_string()))
            .map(|t| t.trim().to_string())
            .unwrap_or_default();
        table.push((idx, gid, ty));
    }
    table.sort_by_key(|e| e.0);
    let is_v2 = |ty: &str| ty.eq_ignore_ascii_case("RoCE v2");
    let listing = || {
        if table.is_empty() {
            "no GIDs".to_string()
        } else {
            table
                .iter()
                .map(|(i, g, t)| {
                    format!(
                        "{i}: {} ({})",
                        std::net::Ipv6Addr::from(*g),
                        if t.is_empty() { "?" } else { t }
                    )
                })
                .collect::<Vec<_>>()
                .join(", ")
        }
    };
    let pick = match want {
        Some(i) => {
            let e = table.iter().find(|e| e.0 == i).ok_or_else(|| {
                format!(
                    "GID index {i} is empty on {} (have {})",
                    port_dir.display(),
                    listing()
                )
            })?;
            if !is_v2(&e.2) {
                return Err(format!(
                    "GID index {i} on {} is {:?}, not RoCE v2 (have {})",
                    port_dir.display(),
                    e.2,
                    listing()
                ));
            }
            e
        }
        None => table
            .iter()
            .find(|e| is_v2(&e.2) && gid_ipv4(&e.1).is_some())
            .or_else(|| table.iter().find(|e| is_v2(&e.2)))
            .ok_or_else(|| {
                format!(
                    "no RoCE v2 GID on {} (have {}): is the netdev up with an IPv4 address?",
                    port_dir.display(),
                    listing()
                )
            })?,
    };
    Ok(GidChoice {
        index: pick.0,
        gid: pick.1,
        ipv4: gid_ipv4(&pick.1),
    })
}

// ---------------------------------------------------------------------------
// results

/// Outcome of one test on this side (already combined with the peer's verdict).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status {
    /// Passed on both sides.
    Pass,
    /// Failed (reason).
    Fail(String),
    /// Not run (reason).
    Skip(String),
}

/// One `VERBS-RESULT` line.
#[derive(Clone, Debug)]
pub struct TestResult {
    /// The test.
    pub test: VerbsTest,
    /// Its outcome.
    pub status: Status,
    /// Payload bytes moved (atomics: 8 per operation).
    pub bytes: u64,
    /// Operations.
    pub ops: u64,
    /// Seconds from posting the first request to the last completion / check.
    pub secs: f64,
}

impl TestResult {
    /// `VERBS-RESULT role=.. dev=.. test=.. status=PASS|FAIL|SKIP ops=.. bytes=.. secs=.. mibps=.. reason=".."`.
    pub fn line(&self, role: &str, dev: &str) -> String {
        let (st, reason) = match &self.status {
            Status::Pass => ("PASS", String::new()),
            Status::Fail(r) => ("FAIL", r.clone()),
            Status::Skip(r) => ("SKIP", r.clone()),
        };
        let mibps = if self.secs > 0.0 {
            self.bytes as f64 / self.secs / 1048576.0
        } else {
            0.0
        };
        format!(
            "VERBS-RESULT role={role} dev={dev} test={} status={st} ops={} bytes={} secs={:.3} mibps={:.2} reason=\"{}\"",
            self.test,
            self.ops,
            self.bytes,
            self.secs,
            mibps,
            reason.replace(['"', '\n'], "'")
        )
    }
}

/// Combines this side's verdict with the peer's.
pub fn combine(local: Result<(), String>, peer: Result<(), String>) -> Status {
    match (local, peer) {
        (Ok(()), Ok(())) => Status::Pass,
        (Err(l), Ok(())) => Status::Fail(format!("local: {l}")),
        (Ok(()), Err(p)) => Status::Fail(format!("peer: {p}")),
        (Err(l), Err(p)) => Status::Fail(format!("local: {l}; peer: {p}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qp() -> QpInfo {
        QpInfo {
            qpn: 0x11,
            psn: 0xab_cdef,
            lid: 0,
            mtu: 3,
            gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 77, 0, 1],
            addr: 0x7f00_1234_5000,
            len: 4096 + 64,
            rkey: 0xdead_beef,
            caps: Caps {
                iwarp: false,
                atomics: true,
            },
        }
    }

    #[test]
    fn parse_test_lists() {
        assert_eq!(parse_tests("all").unwrap(), VerbsTest::ALL.to_vec());
        assert_eq!(
            parse_tests("write, send,send").unwrap(),
            vec![VerbsTest::Send, VerbsTest::Write]
        );
        assert_eq!(
            parse_tests("send-imm,FAA").unwrap(),
            vec![VerbsTest::SendImm, VerbsTest::Faa]
        );
        assert!(parse_tests("").is_err());
        let e = parse_tests("send,atomic").unwrap_err();
        assert!(e.contains("atomic") && e.contains("cas"), "{e}");
        for t in VerbsTest::ALL {
            assert_eq!(VerbsTest::from_id(t.id()), Some(t));
        }
        assert_eq!(VerbsTest::from_id(7), None);
    }

    #[test]
    fn qp_info_round_trip_and_rejects() {
        let q = qp();
        let b = q.encode();
        assert_eq!(QpInfo::decode(&b).unwrap(), q);
        let mut iw = q;
        iw.caps = Caps {
            iwarp: true,
            atomics: false,
        };
        assert_eq!(QpInfo::decode(&iw.encode()).unwrap(), iw);
        assert!(QpInfo::decode(&b[..55]).is_err());
        let mut bad = b;
        bad[0] = b'X';
        assert!(QpInfo::decode(&bad).unwrap_err().contains("magic"));
        let mut bad = b;
        bad[8..12].copy_from_slice(&0x0100_0000u32.to_be_bytes());
        assert!(QpInfo::decode(&bad).unwrap_err().contains("QP number"));
        let mut bad = b;
        bad[12..16].copy_from_slice(&0x0100_0000u32.to_be_bytes());
        assert!(QpInfo::decode(&bad).unwrap_err().contains("PSN"));
        let mut bad = b;
        bad[7] = 6;
        assert!(QpInfo::decode(&bad).unwrap_err().contains("MTU"));
        let mut bad = b;
        bad[6] = 4;
        assert!(QpInfo::decode(&bad).unwrap_err().contains("capability"));
        let mut bad = b;
        bad[36..44].copy_from_slice(&u64::MAX.to_be_bytes());
        assert!(QpInfo::decode(&bad).unwrap_err().contains("overflows"));
    }

    #[test]
    fn hello_round_trip_and_limits() {
        let cfg = VerbsConfig {
            tests: vec![VerbsTest::Send, VerbsTest::Read, VerbsTest::Faa],
            size: 4000,
            iters: 1,
            seed: 0x1234_5678_9abc,
        };
        let h = Hello { cfg, qp: qp() };
        assert_eq!(Hello::decode(&h.encode()).unwrap(), h);
        // a client buffer too small for the layout
        let mut small = h.clone();
        small.qp.len = 100;
        assert!(Hello::decode(&small.encode())
            .unwrap_err()
            .contains("smaller"));
        // limits are enforced on decode too
        let mut b = h.encode();
        b[8..12].copy_from_slice(&0u32.to_be_bytes());
        assert!(Hello::decode(&b).unwrap_err().contains("--size"));
        let mut b = h.encode();
        b[12..16].copy_from_slice(&(MAX_ITERS + 1).to_be_bytes());
        assert!(Hello::decode(&b).unwrap_err().contains("--iters"));
        let mut b = h.encode();
        b[6..8].copy_from_slice(&0x0100u16.to_be_bytes());
        assert!(Hello::decode(&b).unwrap_err().contains("mask"));
        let mut b = h.encode();
        b[6..8].copy_from_slice(&0u16.to_be_bytes());
        assert!(Hello::decode(&b).is_err());
    }

    #[test]
    fn ctl_round_trip_and_bounds() {
        let msgs = [
            Ctl::Accept(qp()),
            Ctl::Refuse("no such test".into()),
            Ctl::Connected,
            Ctl::Ready(VerbsTest::WriteImm),
            Ctl::Done(VerbsTest::Cas, Ok(())),
            Ctl::Done(VerbsTest::Read, Err("byte 3 is 0x00".into())),
        ];
        let mut buf = Vec::new();
        for m in &msgs {
            m.write_to(&mut buf).unwrap();
        }
        let mut r = &buf[..];
        for m in &msgs {
            assert_eq!(&Ctl::read_from(&mut r).unwrap(), m);
        }
        assert!(r.is_empty());
        // a huge reason is clipped on encode
        let long = Ctl::Done(VerbsTest::Send, Err("é".repeat(MAX_REASON)));
        let Ctl::Done(_, Err(got)) = Ctl::read_from(&mut &long.encode()[..]).unwrap() else {
            panic!()
        };
        assert!(got.len() <= MAX_REASON && got.starts_with('é'));
        // a hostile length is refused before allocating
        let mut h = vec![5, 0, 0, 0];
        h.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(Ctl::read_from(&mut &h[..]).is_err());
        assert!(Ctl::read_from(&mut &[9u8, 0, 0, 0, 0, 0, 0, 0][..]).is_err());
        assert!(Ctl::read_from(&mut &[4u8, 42, 0, 0, 0, 0, 0, 0][..]).is_err());
        // truncated
        assert!(Ctl::read_from(&mut &Ctl::Accept(qp()).encode()[..20]).is_err());
    }

    #[test]
    fn server_expectations() {
        let c = VerbsConfig {
            tests: vec![VerbsTest::Send, VerbsTest::Cas],
            size: 4096,
            iters: 8,
            seed: 1,
        };
        assert_eq!(ExpectedConfig::default().check(&c), Ok(()));
        let e = ExpectedConfig {
            tests: Some(vec![VerbsTest::Send, VerbsTest::Cas]),
            size: Some(4096),
            ..Default::default()
        };
        assert_eq!(e.check(&c), Ok(()));
        let e = ExpectedConfig {
            tests: Some(vec![VerbsTest::Send]),
            iters: Some(9),
            seed: Some(1),
            ..Default::default()
        };
        let err = e.check(&c).unwrap_err();
        assert!(
            err.contains("tests send,cas (client) vs send (server)"),
            "{err}"
        );
        assert!(err.contains("iters 8 (client) vs 9 (server)"), "{err}");
        assert!(!err.contains("seed"), "{err}");
    }

    #[test]
    fn layout_is_aligned() {
        for (size, iters) in [(1, 1), (4095, 3), (65536, 8), (7, 1024)] {
            let cfg = VerbsConfig {
                tests: vec![VerbsTest::Send],
                size,
                iters,
                seed: 1,
            };
            let l = cfg.layout();
            assert_eq!(l.atomic_off % 64, 0);
            assert!(l.atomic_off >= u64::from(size) * u64::from(iters));
            assert_eq!(l.len, l.atomic_off + 64);
            assert_eq!(
                l.slot_range(iters - 1).end as u64,
                u64::from(size) * u64::from(iters)
            );
        }
        let too_big = VerbsConfig {
            tests: vec![VerbsTest::Send],
            size: MAX_SIZE,
            iters: 17,
            seed: 1,
        };
        assert!(too_big.validate().is_err());
    }

    #[test]
    fn recv_checks() {
        let seed = 9;
        let ok = Completion {
            wr_id: 2,
            error: None,
            opcode: WC_RECV,
            byte_len: 100,
            imm: None,
        };
        assert_eq!(check_recv(seed, VerbsTest::Send, 100, &ok), Ok(()));
        assert!(check_recv(seed, VerbsTest::Send, 101, &ok)
            .unwrap_err()
            .contains("byte_len"));
        // SEND with immediate: the value must match this iteration's
        let imm = Completion {
            imm: Some(imm_value(seed, VerbsTest::SendImm, 2)),
            ..ok
        };
        assert_eq!(check_recv(seed, VerbsTest::SendImm, 100, &imm), Ok(()));
        assert!(check_recv(seed, VerbsTest::SendImm, 100, &ok)
            .unwrap_err()
            .contains("no immediate"));
        let wrong = Completion {
            imm: Some(imm_value(seed, VerbsTest::SendImm, 3)),
            ..ok
        };
        assert!(check_recv(seed, VerbsTest::SendImm, 100, &wrong)
            .unwrap_err()
            .contains("immediate"));
        assert!(check_recv(seed, VerbsTest::Send, 100, &imm)
            .unwrap_err()
            .contains("unexpected immediate"));
        // WRITE with immediate: opcode RECV_RDMA_WITH_IMM
        let wi = Completion {
            opcode: WC_RECV_RDMA_WITH_IMM,
            imm: Some(imm_value(seed, VerbsTest::WriteImm, 2)),
            ..ok
        };
        assert_eq!(check_recv(seed, VerbsTest::WriteImm, 100, &wi), Ok(()));
        assert!(check_recv(seed, VerbsTest::WriteImm, 100, &imm)
            .unwrap_err()
            .contains("opcode"));
        let err = Completion {
            error: Some((5, 0x12)),
            ..ok
        };
        assert!(check_recv(seed, VerbsTest::Send, 100, &err)
            .unwrap_err()
            .contains("WR_FLUSH_ERR"));
        // immediates differ per test, iteration and seed
        assert_ne!(
            imm_value(seed, VerbsTest::SendImm, 0),
            imm_value(seed, VerbsTest::WriteImm, 0)
        );
        assert_ne!(
            imm_value(1, VerbsTest::SendImm, 0),
            imm_value(2, VerbsTest::SendImm, 0)
        );
    }

    #[test]
    fn slot_data_checks() {
        let seed = 4;
        let mut buf = vec![0u8; 1000];
        msg_pattern(seed, VerbsTest::Write, 5, Way::ClientToServer).fill(0, &mut buf);
        assert_eq!(check_slot(seed, VerbsTest::Write, 5, &buf), Ok(()));
        // another iteration's or test's data is detected
        assert!(check_slot(seed, VerbsTest::Write, 6, &buf).is_err());
        assert!(check_slot(seed, VerbsTest::Send, 5, &buf).is_err());
        // READ flows the other way
        assert!(check_slot(seed, VerbsTest::Read, 5, &buf).is_err());
        buf[777] ^= 0x10;
        let e = check_slot(seed, VerbsTest::Write, 5, &buf).unwrap_err();
        assert!(e.contains("byte 777 of 1000"), "{e}");
        // an all-zero buffer (data never arrived) fails
        assert!(check_slot(seed, VerbsTest::Write, 0, &[0u8; 64]).is_err());
    }

    #[test]
    fn atomic_expectations() {
        let seed = 77;
        // CAS chain: every step's swap value is the next compare value; the
        // stale compare's poison differs from the value in memory
        for i in 0..10 {
            assert_ne!(cas_value(seed, i), cas_value(seed, i + 1));
            assert_ne!(cas_poison(seed, i), cas_value(seed, i + 1));
        }
        assert_eq!(atomic_initial(seed, VerbsTest::Cas), cas_value(seed, 0));
        assert_eq!(atomic_final(seed, VerbsTest::Cas, 3), cas_value(seed, 3));
        // FAA: simulate the responder
        let mut word = atomic_initial(seed, VerbsTest::Faa);
        for i in 0..50 {
            assert_eq!(
                check_atomic_old("faa", i, word, faa_before(seed, i)),
                Ok(())
            );
            word = word.wrapping_add(faa_addend(seed, i));
        }
        assert_eq!(word, atomic_final(seed, VerbsTest::Faa, 50));
        assert!(check_atomic_old("faa", 1, word, word ^ 1)
            .unwrap_err()
            .contains("expected"));
    }

    #[test]
    fn skips() {
        let roce = Caps {
            iwarp: false,
            atomics: true,
        };
        let siw = Caps {
            iwarp: true,
            atomics: false,
        };
        let noatom = Caps {
            iwarp: false,
            atomics: false,
        };
        for t in VerbsTest::ALL {
            assert_eq!(skip_reason(t, roce, roce), None);
        }
        for t in [VerbsTest::Send, VerbsTest::Write, VerbsTest::Read] {
            assert_eq!(skip_reason(t, siw, siw), None);
        }
        for t in [
            VerbsTest::SendImm,
            VerbsTest::WriteImm,
            VerbsTest::Cas,
            VerbsTest::Faa,
        ] {
            let r = skip_reason(t, siw, siw).unwrap();
            assert!(r.starts_with("iWARP has no"), "{r}");
            // symmetric: the same reason on both sides
            assert_eq!(skip_reason(t, siw, roce), skip_reason(t, roce, siw));
        }
        assert!(skip_reason(VerbsTest::Cas, roce, noatom)
            .unwrap()
            .contains("peer"));
        assert!(skip_reason(VerbsTest::Faa, noatom, roce)
            .unwrap()
            .contains("this"));
        assert_eq!(skip_reason(VerbsTest::SendImm, noatom, roce), None);
    }

    fn fake_port(gids: &[(u32, &str, &str)]) -> tempdir::Dir {
        let d = tempdir::Dir::new();
        std::fs::create_dir_all(d.0.join("gids")).unwrap();
        std::fs::create_dir_all(d.0.join("gid_attrs/types")).unwrap();
        for (i, g, t) in gids {
            std::fs::write(d.0.join("gids").join(i.to_string()), format!("{g}\n")).unwrap();
            if !t.is_empty() {
                std::fs::write(
                    d.0.join("gid_attrs/types").join(i.to_string()),
                    format!("{t}\n"),
                )
                .unwrap();
            }
        }
        d
    }

    mod tempdir {
        /// A scratch directory removed on drop.
        pub struct Dir(pub std::path::PathBuf);
        impl Dir {
            pub fn new() -> Self {
                use std::sync::atomic::{AtomicU32, Ordering};
                static N: AtomicU32 = AtomicU32::new(0);
                let p = std::env::temp_dir().join(format!(
                    "sgt-verbs-{}-{}",
                    std::process::id(),
                    N.fetch_add(1, Ordering::Relaxed)
                ));
                std::fs::create_dir_all(&p).unwrap();
                Dir(p)
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    const Z: &str = "0000:0000:0000:0000:0000:0000:0000:0000";
    const LL: &str = "fe80:0000:0000:0000:5054:00ff:fe77:010a";
    const V4: &str = "0000:0000:0000:0000:0000:ffff:0a4d:0001";

    #[test]
    fn gid_selection_rxe_like() {
        // rxe on an IPv4 netdev: 0/1 link-local v1/v2, 2/3 IPv4-mapped v1/v2
        let d = fake_port(&[
            (0, LL, "IB/RoCE v1"),
            (1, LL, "RoCE v2"),
            (2, V4, "IB/RoCE v1"),
            (3, V4, "RoCE v2"),
            (4, Z, ""),
        ]);
        let c = select_roce_gid(&d.0, None).unwrap();
        assert_eq!(c.index, 3);
        assert_eq!(c.ipv4, Some(Ipv4Addr::new(10, 77, 0, 1)));
        assert_eq!(c.gid, parse_sysfs_gid(V4).unwrap());
        // an explicit v2 index is honoured, a v1 one refused, an empty one too
        assert_eq!(select_roce_gid(&d.0, Some(1)).unwrap().index, 1);
        let e = select_roce_gid(&d.0, Some(2)).unwrap_err();
        assert!(
            e.contains("not RoCE v2") && e.contains("3: ::ffff:10.77.0.1"),
            "{e}"
        );
        assert!(select_roce_gid(&d.0, Some(4))
            .unwrap_err()
            .contains("empty"));
        assert!(select_roce_gid(&d.0, Some(9))
            .unwrap_err()
            .contains("empty"));
    }

    #[test]
    fn gid_selection_fallbacks() {
        // no IPv4 address yet: the link-local v2 GID
        let d = fake_port(&[(0, LL, "IB/RoCE v1"), (1, LL, "RoCE v2")]);
        let c = select_roce_gid(&d.0, None).unwrap();
        assert_eq!((c.index, c.ipv4), (1, None));
        // only v1 GIDs: a clear error listing the table
        let d = fake_port(&[(0, LL, "IB/RoCE v1"), (1, Z, "")]);
        let e = select_roce_gid(&d.0, None).unwrap_err();
        assert!(
            e.contains("no RoCE v2 GID") && e.contains("0: fe80::5054:ff:fe77:10a"),
            "{e}"
        );
        // nothing at all
        let d = fake_port(&[]);
        assert!(select_roce_gid(&d.0, None).unwrap_err().contains("no GIDs"));
        // missing directory
        assert!(select_roce_gid(Path::new("/nonexistent/port"), None).is_err());
    }

    #[test]
    fn sysfs_gid_parsing() {
        assert_eq!(
            parse_sysfs_gid(V4).map(|g| gid_ipv4(&g)),
            Some(Some(Ipv4Addr::new(10, 77, 0, 1)))
        );
        assert_eq!(parse_sysfs_gid(LL).map(|g| gid_ipv4(&g)), Some(None));
        assert_eq!(parse_sysfs_gid("fe80::1"), None);
        assert_eq!(
            parse_sysfs_gid("zzzz:0000:0000:0000:0000:0000:0000:0000"),
            None
        );
    }

    #[test]
    fn result_lines() {
        let r = TestResult {
            test: VerbsTest::WriteImm,
            status: combine(Ok(()), Err("imm \"x\"".into())),
            bytes: 1 << 20,
            ops: 16,
            secs: 0.5,
        };
        let l = r.line("client", "rxe0");
        assert!(l.starts_with("VERBS-RESULT role=client dev=rxe0 test=write_imm status=FAIL ops=16 bytes=1048576 secs=0.500 mibps=2.00 reason=\"peer: imm 'x'\""), "{l}");
        assert_eq!(combine(Ok(()), Ok(())), Status::Pass);
        let Status::Fail(both) = combine(Err("a".into()), Err("b".into())) else {
            panic!()
        };
        assert_eq!(both, "local: a; peer: b");
    }
}

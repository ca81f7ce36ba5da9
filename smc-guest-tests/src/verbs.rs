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
use std::path::{Path, PathBuf};

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

/// Why a run's configuration is refused: an unknown test name, a limit
/// exceeded, or (server) a client whose config differs from the server's
/// options. The texts name the command-line options, as the user gives
/// them there.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A name in `--tests` that is no test.
    #[error(
        "unknown verbs test {0:?} (have: all, {have})",
        have = VerbsTest::ALL.map(|t| t.name()).join(", ")
    )]
    UnknownTest(String),
    /// An empty test list.
    #[error("no verbs test given")]
    NoTests,
    /// `--size` 0 or above [`MAX_SIZE`].
    #[error("--size must be 1 byte .. {MAX_SIZE}")]
    Size,
    /// `--iters` 0 or above [`MAX_ITERS`].
    #[error("--iters must be 1 .. {MAX_ITERS}")]
    Iters,
    /// The buffer `--size` x `--iters` above [`MAX_TOTAL`].
    #[error("--size x --iters must be at most {} MiB", MAX_TOTAL >> 20)]
    Total,
    /// Server: the client's config differs from the options given; one
    /// `what client (client) vs server (server)` per option.
    #[error("config mismatch: {}", .0.join("; "))]
    Mismatch(Vec<String>),
}

/// Parses `send,write,...` or `all` into a sorted, de-duplicated list.
pub fn parse_tests(s: &str) -> Result<Vec<VerbsTest>, ConfigError> {
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
            .ok_or_else(|| ConfigError::UnknownTest(part.to_string()))?;
        v.push(t);
    }
    if v.is_empty() {
        return Err(ConfigError::NoTests);
    }
    v.sort();
    v.dedup();
    Ok(v)
}

fn tests_mask(tests: &[VerbsTest]) -> u16 {
    tests.iter().fold(0, |m, t| m | (1 << t.id()))
}

fn tests_from_mask(mask: u16) -> Result<Vec<VerbsTest>, WireError> {
    let known = tests_mask(&VerbsTest::ALL);
    if mask & !known != 0 || mask == 0 {
        return Err(WireError::TestMask(mask));
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
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.tests.is_empty() {
            return Err(ConfigError::NoTests);
        }
        if self.size == 0 || self.size > MAX_SIZE {
            return Err(ConfigError::Size);
        }
        if self.iters == 0 || self.iters > MAX_ITERS {
            return Err(ConfigError::Iters);
        }
        if u64::from(self.size) * u64::from(self.iters) > MAX_TOTAL {
            return Err(ConfigError::Total);
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
    pub fn check(&self, c: &VerbsConfig) -> Result<(), ConfigError> {
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
            Err(ConfigError::Mismatch(bad))
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

/// What a check found wrong in a completion, in data or in an atomic's
/// result: the first difference from what the peer must have sent, with
/// the message it belongs to.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CheckError {
    /// A receive completed with an error status.
    #[error(
        "receive {iter}: completion status {status} ({}), vendor_err {vendor_err:#x}",
        wc_status_name(*status)
    )]
    RecvStatus {
        /// The message (the receive's `wr_id`).
        iter: u32,
        /// `ibv_wc_status`.
        status: u32,
        /// The provider's `vendor_err`.
        vendor_err: u32,
    },
    /// A receive completed with the wrong opcode.
    #[error("receive {iter}: opcode {got} but expected {want}")]
    RecvOpcode {
        /// The message.
        iter: u32,
        /// The completion's `ibv_wc_opcode`.
        got: u32,
        /// The one the test produces.
        want: u32,
    },
    /// A SEND's receive with another length than was sent.
    #[error("receive {iter}: byte_len {got} but {want} sent")]
    RecvLen {
        /// The message.
        iter: u32,
        /// The completion's `byte_len`.
        got: u32,
        /// The size sent.
        want: u32,
    },
    /// A test with immediates, a receive without one.
    #[error("receive {iter}: no immediate (IBV_WC_WITH_IMM clear)")]
    NoImm {
        /// The message.
        iter: u32,
    },
    /// An immediate other than this message's.
    #[error("receive {iter}: immediate {got:#010x}, expected {want:#010x}")]
    WrongImm {
        /// The message.
        iter: u32,
        /// The immediate received.
        got: u32,
        /// The one sent.
        want: u32,
    },
    /// A test without immediates, a receive with one.
    #[error("receive {iter}: unexpected immediate {got:#010x}")]
    UnexpectedImm {
        /// The message.
        iter: u32,
        /// The immediate received.
        got: u32,
    },
    /// A message slot whose data differs from its pattern.
    #[error("message {iter}: byte {offset} of {len} is {got:#04x}, expected {want:#04x}")]
    Data {
        /// The message.
        iter: u32,
        /// The first wrong byte.
        offset: u64,
        /// The slot's length.
        len: usize,
        /// The byte found.
        got: u8,
        /// The pattern's byte.
        want: u8,
    },
    /// An atomic returned another old value than the chain predicts.
    #[error("{what} {iter}: returned old value {got:#018x}, expected {want:#018x}")]
    AtomicOld {
        /// Which atomic (`faa`, `cas (matching)`, ...).
        what: String,
        /// The iteration.
        iter: u32,
        /// The old value returned.
        got: u64,
        /// The value the word held.
        want: u64,
    },
}

/// Checks a receive completion of `test` message `iter` (wr_id = iter):
/// status, opcode, length and immediate. The data is checked separately.
pub fn check_recv(seed: u64, test: VerbsTest, size: u32, c: &Completion) -> Result<(), CheckError> {
    let iter = c.wr_id as u32;
    if let Some((status, vendor_err)) = c.error {
        return Err(CheckError::RecvStatus {
            iter,
            status,
            vendor_err,
        });
    }
    let (want_op, want_len) = match test {
        VerbsTest::WriteImm => (WC_RECV_RDMA_WITH_IMM, size),
        _ => (WC_RECV, size),
    };
    if c.opcode != want_op {
        return Err(CheckError::RecvOpcode {
            iter,
            got: c.opcode,
            want: want_op,
        });
    }
    // RDMA WRITE with immediate: byte_len is the write's length on rxe;
    // the IB spec leaves it to the responder, so only SENDs are held to it.
    if test != VerbsTest::WriteImm && c.byte_len != want_len {
        return Err(CheckError::RecvLen {
            iter,
            got: c.byte_len,
            want: want_len,
        });
    }
    match (test.has_imm(), c.imm) {
        (true, None) => Err(CheckError::NoImm { iter }),
        (true, Some(got)) => {
            let want = imm_value(seed, test, iter);
            if got == want {
                Ok(())
            } else {
                Err(CheckError::WrongImm { iter, got, want })
            }
        }
        (false, Some(got)) => Err(CheckError::UnexpectedImm { iter, got }),
        (false, None) => Ok(()),
    }
}

/// Checks message slot data against its pattern; the error names the first
/// wrong byte.
pub fn check_slot(seed: u64, test: VerbsTest, iter: u32, data: &[u8]) -> Result<(), CheckError> {
    let pattern = msg_pattern(seed, test, iter, data_way(test));
    match pattern.verify(0, data) {
        None => Ok(()),
        Some(offset) => Err(CheckError::Data {
            iter,
            offset,
            len: data.len(),
            got: data[offset as usize],
            want: pattern.byte_at(offset),
        }),
    }
}

/// Checks what an atomic returned (the old value).
pub fn check_atomic_old(what: &str, iter: u32, got: u64, want: u64) -> Result<(), CheckError> {
    if got == want {
        Ok(())
    } else {
        Err(CheckError::AtomicOld {
            what: what.to_string(),
            iter,
            got,
            want,
        })
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

/// Why a QP info or a hello from the peer is refused (a hostile or
/// mismatched peer: every field is checked).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// A QP info of the wrong size.
    #[error("QP info: {0} bytes, expected {QP_INFO_LEN}")]
    QpInfoLen(usize),
    /// Not our QP info magic.
    #[error("QP info: bad magic (not a verbs peer?)")]
    QpInfoMagic,
    /// Another wire version.
    #[error("QP info: version {0}, expected {WIRE_VERSION}")]
    QpInfoVersion(u16),
    /// Capability bits this version does not define.
    #[error("QP info: unknown capability bits {0:#04x}")]
    Caps(u8),
    /// QP number 0 or wider than 24 bits.
    #[error("QP info: bad QP number {0:#x}")]
    Qpn(u32),
    /// PSN wider than 24 bits.
    #[error("QP info: PSN {0:#x} has more than 24 bits")]
    Psn(u32),
    /// An `ibv_mtu` outside 1..=5.
    #[error("QP info: bad MTU enum {0}")]
    Mtu(u8),
    /// A buffer that wraps the address space.
    #[error("QP info: buffer address + length overflows")]
    BufferOverflows,
    /// A hello of the wrong size.
    #[error("hello: {0} bytes, expected {HELLO_LEN}")]
    HelloLen(usize),
    /// Not our hello magic.
    #[error("hello: bad magic (not a verbs client?)")]
    HelloMagic,
    /// Another wire version.
    #[error("hello: version {0}, expected {WIRE_VERSION}")]
    HelloVersion(u16),
    /// A test mask naming no test or unknown ones.
    #[error("bad test mask {0:#06x}")]
    TestMask(u16),
    /// The client's config breaks a limit.
    #[error("hello: {0}")]
    HelloConfig(ConfigError),
    /// The client's buffer cannot hold the config's layout.
    #[error("hello: client buffer of {len} bytes is smaller than the layout's {need}")]
    SmallBuffer {
        /// The client's buffer length.
        len: u64,
        /// The layout's length.
        need: u64,
    },
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
    pub fn decode(b: &[u8]) -> Result<Self, WireError> {
        if b.len() != QP_INFO_LEN {
            return Err(WireError::QpInfoLen(b.len()));
        }
        if &b[0..4] != QP_MAGIC {
            return Err(WireError::QpInfoMagic);
        }
        let ver = u16::from_be_bytes([b[4], b[5]]);
        if ver != WIRE_VERSION {
            return Err(WireError::QpInfoVersion(ver));
        }
        if b[6] & !3 != 0 {
            return Err(WireError::Caps(b[6]));
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
            return Err(WireError::Qpn(q.qpn));
        }
        if q.psn > 0xff_ffff {
            return Err(WireError::Psn(q.psn));
        }
        if !(1..=5).contains(&q.mtu) {
            return Err(WireError::Mtu(q.mtu));
        }
        if q.addr.checked_add(q.len).is_none() {
            return Err(WireError::BufferOverflows);
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
    pub fn decode(b: &[u8]) -> Result<Self, WireError> {
        if b.len() != HELLO_LEN {
            return Err(WireError::HelloLen(b.len()));
        }
        if &b[0..4] != HELLO_MAGIC {
            return Err(WireError::HelloMagic);
        }
        let ver = u16::from_be_bytes([b[4], b[5]]);
        if ver != WIRE_VERSION {
            return Err(WireError::HelloVersion(ver));
        }
        let cfg = VerbsConfig {
            tests: tests_from_mask(u16::from_be_bytes([b[6], b[7]]))?,
            size: u32::from_be_bytes(b[8..12].try_into().unwrap()),
            iters: u32::from_be_bytes(b[12..16].try_into().unwrap()),
            seed: u64::from_be_bytes(b[16..24].try_into().unwrap()),
        };
        cfg.validate().map_err(WireError::HelloConfig)?;
        let qp = QpInfo::decode(&b[24..])?;
        if qp.len < cfg.layout().len {
            return Err(WireError::SmallBuffer {
                len: qp.len,
                need: cfg.layout().len,
            });
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
    /// This side's verdict on a test.
    Done(VerbsTest, Verdict),
}

/// One side's verdict on a test, as [`Ctl::Done`] carries it: on the wire a
/// failure is its reason's text (the peer's checks are not ours to type).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Everything this side checked was right.
    Pass,
    /// Failed, with the reason.
    Fail(String),
}

impl Verdict {
    /// The test passed on that side.
    pub fn passed(&self) -> bool {
        *self == Verdict::Pass
    }
}

impl<E: fmt::Display> From<&Result<(), E>> for Verdict {
    /// This side's checks, reduced to what the peer is told.
    fn from(r: &Result<(), E>) -> Self {
        match r {
            Ok(()) => Verdict::Pass,
            Err(e) => Verdict::Fail(e.to_string()),
        }
    }
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
            Ctl::Done(t, Verdict::Pass) => (5, t.id(), 1, Vec::new()),
            Ctl::Done(t, Verdict::Fail(r)) => (5, t.id(), 0, clip(r).into_bytes()),
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
        let bad_qp = |e: WireError| io::Error::new(io::ErrorKind::InvalidData, e);
        if len > MAX_REASON.max(QP_INFO_LEN) {
            return Err(bad(format!("control message of {len} bytes")));
        }
        let mut p = vec![0u8; len];
        r.read_exact(&mut p)?;
        let test =
            || VerbsTest::from_id(h[1]).ok_or_else(|| bad(format!("unknown test id {}", h[1])));
        let text = |p: Vec<u8>| String::from_utf8_lossy(&p).into_owned();
        Ok(match h[0] {
            1 => Ctl::Accept(QpInfo::decode(&p).map_err(bad_qp)?),
            2 => Ctl::Refuse(text(p)),
            3 => Ctl::Connected,
            4 => Ctl::Ready(test()?),
            5 if h[2] == 1 => Ctl::Done(test()?, Verdict::Pass),
            5 => Ctl::Done(test()?, Verdict::Fail(text(p))),
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

/// Why no usable RoCE v2 GID was found on a port. The GID table is listed
/// (`index: gid (type)`, or `no GIDs`) so the user sees what there is.
#[derive(Debug, thiserror::Error)]
pub enum GidError {
    /// The port's `gids` directory cannot be read (no such device or port).
    #[error("{}: {error}", .dir.display())]
    ReadDir {
        /// `<port>/gids`.
        dir: PathBuf,
        /// Why.
        error: io::Error,
    },
    /// The GID index asked for holds no GID.
    #[error("GID index {index} is empty on {} (have {table})", .port_dir.display())]
    Empty {
        /// The index asked for.
        index: u32,
        /// The port's sysfs directory.
        port_dir: PathBuf,
        /// The port's GIDs.
        table: String,
    },
    /// The GID index asked for is not a RoCE v2 GID.
    #[error(
        "GID index {index} on {} is {gid_type:?}, not RoCE v2 (have {table})",
        .port_dir.display()
    )]
    NotRoceV2 {
        /// The index asked for.
        index: u32,
        /// The port's sysfs directory.
        port_dir: PathBuf,
        /// Its type as sysfs says it.
        gid_type: String,
        /// The port's GIDs.
        table: String,
    },
    /// No index asked for, and no RoCE v2 GID at all.
    #[error(
        "no RoCE v2 GID on {} (have {table}): is the netdev up with an IPv4 address?",
        .port_dir.display()
    )]
    NoRoceV2 {
        /// The port's sysfs directory.
        port_dir: PathBuf,
        /// The port's GIDs.
        table: String,
    },
}

/// Picks the GID from `<sysfs>/class/infiniband/<dev>/ports/<port>` (`port_dir`):
/// with `want = Some(i)` that index, which must hold a RoCE v2 GID; without,
/// the lowest-index RoCE v2 GID that is IPv4-mapped (what rxe over an IPv4
/// netdev needs), else the lowest RoCE v2 GID at all.
pub fn select_roce_gid(port_dir: &Path, want: Option<u32>) -> Result<GidChoice, GidError> {
    let gids = port_dir.join("gids");
    let types = port_dir.join("gid_attrs").join("types");
    let rd = std::fs::read_dir(&gids).map_err(|error| GidError::ReadDir {
        dir: gids.clone(),
        error,
    })?;
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
            let e = table
                .iter()
                .find(|e| e.0 == i)
                .ok_or_else(|| GidError::Empty {
                    index: i,
                    port_dir: port_dir.to_path_buf(),
                    table: listing(),
                })?;
            if !is_v2(&e.2) {
                return Err(GidError::NotRoceV2 {
                    index: i,
                    port_dir: port_dir.to_path_buf(),
                    gid_type: e.2.clone(),
                    table: listing(),
                });
            }
            e
        }
        None => table
            .iter()
            .find(|e| is_v2(&e.2) && gid_ipv4(&e.1).is_some())
            .or_else(|| table.iter().find(|e| is_v2(&e.2)))
            .ok_or_else(|| GidError::NoRoceV2 {
                port_dir: port_dir.to_path_buf(),
                table: listing(),
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
pub fn combine(local: Verdict, peer: Verdict) -> Status {
    match (local, peer) {
        (Verdict::Pass, Verdict::Pass) => Status::Pass,
        (Verdict::Fail(l), Verdict::Pass) => Status::Fail(format!("local: {l}")),
        (Verdict::Pass, Verdict::Fail(p)) => Status::Fail(format!("peer: {p}")),
        (Verdict::Fail(l), Verdict::Fail(p)) => Status::Fail(format!("local: {l}; peer: {p}")),
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
        assert_eq!(
            parse_tests("send,atomic").unwrap_err().to_string(),
            "unknown verbs test \"atomic\" (have: all, send, send_imm, write, write_imm, read, cas, faa)"
        );
        assert_eq!(
            parse_tests(" , ").unwrap_err().to_string(),
            "no verbs test given"
        );
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
        assert!(QpInfo::decode(&bad)
            .unwrap_err()
            .to_string()
            .contains("magic"));
        let mut bad = b;
        bad[8..12].copy_from_slice(&0x0100_0000u32.to_be_bytes());
        assert!(QpInfo::decode(&bad)
            .unwrap_err()
            .to_string()
            .contains("QP number"));
        let mut bad = b;
        bad[12..16].copy_from_slice(&0x0100_0000u32.to_be_bytes());
        assert!(QpInfo::decode(&bad)
            .unwrap_err()
            .to_string()
            .contains("PSN"));
        let mut bad = b;
        bad[7] = 6;
        assert!(QpInfo::decode(&bad)
            .unwrap_err()
            .to_string()
            .contains("MTU"));
        let mut bad = b;
        bad[6] = 4;
        assert!(QpInfo::decode(&bad)
            .unwrap_err()
            .to_string()
            .contains("capability"));
        let mut bad = b;
        bad[36..44].copy_from_slice(&u64::MAX.to_be_bytes());
        assert!(QpInfo::decode(&bad)
            .unwrap_err()
            .to_string()
            .contains("overflows"));
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
            .to_string()
            .contains("smaller"));
        // limits are enforced on decode too
        let mut b = h.encode();
        b[8..12].copy_from_slice(&0u32.to_be_bytes());
        assert_eq!(
            Hello::decode(&b).unwrap_err().to_string(),
            "hello: --size must be 1 byte .. 16777216"
        );
        let mut b = h.encode();
        b[12..16].copy_from_slice(&(MAX_ITERS + 1).to_be_bytes());
        assert!(Hello::decode(&b)
            .unwrap_err()
            .to_string()
            .contains("--iters"));
        let mut b = h.encode();
        b[6..8].copy_from_slice(&0x0100u16.to_be_bytes());
        assert_eq!(
            Hello::decode(&b).unwrap_err().to_string(),
            "bad test mask 0x0100"
        );
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
            Ctl::Done(VerbsTest::Cas, Verdict::Pass),
            Ctl::Done(VerbsTest::Read, Verdict::Fail("byte 3 is 0x00".into())),
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
        let long = Ctl::Done(VerbsTest::Send, Verdict::Fail("é".repeat(MAX_REASON)));
        let Ctl::Done(_, Verdict::Fail(got)) = Ctl::read_from(&mut &long.encode()[..]).unwrap()
        else {
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
        let err = e.check(&c).unwrap_err().to_string();
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
            .to_string()
            .contains("byte_len"));
        // SEND with immediate: the value must match this iteration's
        let imm = Completion {
            imm: Some(imm_value(seed, VerbsTest::SendImm, 2)),
            ..ok
        };
        assert_eq!(check_recv(seed, VerbsTest::SendImm, 100, &imm), Ok(()));
        assert!(check_recv(seed, VerbsTest::SendImm, 100, &ok)
            .unwrap_err()
            .to_string()
            .contains("no immediate"));
        let wrong = Completion {
            imm: Some(imm_value(seed, VerbsTest::SendImm, 3)),
            ..ok
        };
        assert!(check_recv(seed, VerbsTest::SendImm, 100, &wrong)
            .unwrap_err()
            .to_string()
            .contains("immediate"));
        assert!(check_recv(seed, VerbsTest::Send, 100, &imm)
            .unwrap_err()
            .to_string()
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
            .to_string()
            .contains("opcode"));
        let err = Completion {
            error: Some((5, 0x12)),
            ..ok
        };
        assert!(check_recv(seed, VerbsTest::Send, 100, &err)
            .unwrap_err()
            .to_string()
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
        let e = check_slot(seed, VerbsTest::Write, 5, &buf)
            .unwrap_err()
            .to_string();
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
            .to_string()
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
        let e = select_roce_gid(&d.0, Some(2)).unwrap_err().to_string();
        assert!(
            e.contains("not RoCE v2") && e.contains("3: ::ffff:10.77.0.1"),
            "{e}"
        );
        assert!(select_roce_gid(&d.0, Some(4))
            .unwrap_err()
            .to_string()
            .contains("empty"));
        assert!(select_roce_gid(&d.0, Some(9))
            .unwrap_err()
            .to_string()
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
        let e = select_roce_gid(&d.0, None).unwrap_err().to_string();
        assert!(
            e.contains("no RoCE v2 GID") && e.contains("0: fe80::5054:ff:fe77:10a"),
            "{e}"
        );
        // nothing at all
        let d = fake_port(&[]);
        assert!(select_roce_gid(&d.0, None)
            .unwrap_err()
            .to_string()
            .contains("no GIDs"));
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
            status: combine(Verdict::Pass, Verdict::Fail("imm \"x\"".into())),
            bytes: 1 << 20,
            ops: 16,
            secs: 0.5,
        };
        let l = r.line("client", "rxe0");
        assert!(l.starts_with("VERBS-RESULT role=client dev=rxe0 test=write_imm status=FAIL ops=16 bytes=1048576 secs=0.500 mibps=2.00 reason=\"peer: imm 'x'\""), "{l}");
        assert_eq!(combine(Verdict::Pass, Verdict::Pass), Status::Pass);
        assert_eq!(
            Verdict::from(&check_atomic_old("faa", 2, 1, 3)),
            Verdict::Fail(
                "faa 2: returned old value 0x0000000000000001, expected 0x0000000000000003".into()
            )
        );
        assert!(Verdict::from(&Ok::<(), CheckError>(())).passed());
        let Status::Fail(both) = combine(Verdict::Fail("a".into()), Verdict::Fail("b".into()))
        else {
            panic!()
        };
        assert_eq!(both, "local: a; peer: b");
    }
}

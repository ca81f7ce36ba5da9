//! Fault injection (issue 6): rules that drop, duplicate, reorder, delay,
//! corrupt or rate-limit frames of one port and direction, and link down/up.
//!
//! * *Ingress* is what a guest sent (applied before switching), *egress*
//!   what goes towards a guest (applied per destination port, before its
//!   pending queue).
//! * Rules of a port run in insertion order; a frame leaving one rule (also a
//!   delayed or reordered one, when it is released) goes through the rules
//!   after it.
//! * Every random decision comes from the rule's own PRNG (splitmix64 seeded
//!   with `seed`, default the rule id): the same seed and the same frame
//!   sequence give the same decisions.
//! * Held frames (delay, reorder) live in one bounded timer queue served by
//!   one thread (`Fabric::start_fault_timer`); beyond the bound they are
//!   dropped and counted (`overflow`).
//! * With no rule and every link up the data path reads one atomic.
//! * `mpa-settle` is not a fault but a documented workaround for Linux siw:
//!   it holds the TCP data that follows an MPA Reply for `delay-ms`, in
//!   order, so that guest kernels with siw's connection-setup races
//!   (ci/README.md) are not hit by data arriving right behind the Reply.

pub use crate::frame::Dir;
use crate::frame::{view, Frame, FrameView};
use crate::match_spec::{MatchError, MatchSpec};
use pci_model::fault::FaultRng;
use roce_model::Opcode;
use serde::{Deserialize, Serialize};
use std::cmp::Ordering as CmpOrdering;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::{Duration, Instant};
use thiserror::Error;

/// Fault rules in the whole daemon.
pub const MAX_FAULT_RULES: usize = 64;
/// Frames held (delayed or waiting for reordering) per port.
pub const MAX_HELD_PER_PORT: usize = 4096;
/// Largest reorder window.
pub const MAX_WINDOW: usize = 1024;
/// Largest delay or jitter.
pub const MAX_DELAY_MS: u64 = 60_000;

/// Why a fault rule (or a link request) is refused. The messages are what
/// the control socket and the config check show.
#[derive(Clone, Debug, PartialEq, Error)]
pub enum FaultError {
    /// A match field does not parse.
    #[error(transparent)]
    Match(#[from] MatchError),
    /// Not an action name.
    #[error("action {0:?}: use drop, dup, reorder, delay, corrupt, rate, link-down or mpa-settle")]
    Action(String),
    /// Not an opcode number or name.
    #[error("opcode {0:?}: a number or a name such as RC_SEND_ONLY")]
    Opcode(String),
    /// A PSN that is not a 24-bit number.
    #[error("PSN {0:?}: a number up to 16777215")]
    Psn(String),
    /// A QPN above 24 bits.
    #[error("qpn is 24 bits")]
    Qpn,
    /// `prob` outside 0..=1.
    #[error("prob {0} is not in 0..=1")]
    Prob(f64),
    /// `every = 0`.
    #[error("every must be at least 1")]
    EveryZero,
    /// Both `prob` and `every`.
    #[error("give at most one of prob and every")]
    ProbAndEvery,
    /// Options of another action.
    #[error("{options} does not apply to action {action}")]
    NotForAction {
        /// The kinds of option that do not apply.
        options: &'static str,
        /// The rule's action.
        action: FaultAction,
    },
    /// `copies` outside 1..=16.
    #[error("copies must be 1..=16")]
    Copies,
    /// `window` outside 2..=MAX_WINDOW.
    #[error("window must be 2..={MAX_WINDOW}")]
    Window,
    /// `hold-ms` above MAX_DELAY_MS.
    #[error("hold-ms above {MAX_DELAY_MS}")]
    HoldMs,
    /// `delay` without `delay-ms`.
    #[error("delay needs delay-ms")]
    DelayMissing,
    /// `delay-ms` or `jitter-ms` above MAX_DELAY_MS.
    #[error("delay-ms and jitter-ms are at most {MAX_DELAY_MS}")]
    DelayTooLong,
    /// Both `offset` and `icrc`.
    #[error("give at most one of offset and icrc")]
    OffsetAndIcrc,
    /// `xor = 0`.
    #[error("xor 0 changes nothing")]
    XorZero,
    /// `mpa-settle` with `jitter-ms`, `prob` or `every`.
    #[error("mpa-settle takes none of jitter-ms, prob and every")]
    SettleOptions,
    /// `mpa-settle` without a `delay-ms` in range.
    #[error("mpa-settle needs delay-ms 1..={MAX_DELAY_MS}")]
    SettleDelay,
    /// `rate` with `prob` or `every`.
    #[error("rate takes neither prob nor every")]
    RateOptions,
    /// `rate` without exactly one positive `fps` or `bps`.
    #[error("rate needs exactly one of fps and bps, above 0")]
    RateNeeds,
    /// `burst` below 1.
    #[error("burst must be at least 1")]
    Burst,
    /// No port of that name.
    #[error("no port named {0:?}")]
    NoPort(String),
    /// At the rule limit.
    #[error("too many fault rules (at most {max}, [limits] fault-rules); delete some first")]
    TooMany {
        /// The limit.
        max: usize,
    },
    /// Rule id 0.
    #[error("rule id 0 is reserved")]
    IdZero,
    /// A rule with that id is installed.
    #[error("fault rule {0} exists already")]
    Exists(u32),
    /// No rule with that id.
    #[error("no fault rule {0}")]
    NoRule(u32),
}

/// What a rule does to the frames it selects.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultAction {
    #[default]
    Drop,
    /// Deliver `copies` extra copies (default 1).
    Dup,
    /// Hold `window` frames (default 4) and release them shuffled; a partial
    /// window is released after `hold-ms` (default 100).
    Reorder,
    /// Deliver after `delay-ms` plus a uniform 0..=`jitter-ms`.
    Delay,
    /// XOR `xor` (default 0xff) into the byte at `offset`, into the ICRC
    /// (`icrc = true`, RoCEv2 frames), or into a random byte.
    Corrupt,
    /// Token bucket: `fps` frames/s or `bps` bytes/s, `burst` deep; the
    /// excess is dropped.
    Rate,
    /// Drop everything matched, as a cut link would.
    LinkDown,
    /// Not a fault: after an MPA Reply passes on a TCP connection, hold that
    /// connection's later data segments (both ways, in order) until
    /// `delay-ms` after the Reply. Works around Linux siw's connection-setup
    /// races (data right behind the Reply is lost or fails the connect).
    MpaSettle,
}

impl FaultAction {
    /// Every action, for help texts and completions.
    pub const ALL: [FaultAction; 8] = [
        FaultAction::Drop,
        FaultAction::Dup,
        FaultAction::Reorder,
        FaultAction::Delay,
        FaultAction::Corrupt,
        FaultAction::Rate,
        FaultAction::LinkDown,
        FaultAction::MpaSettle,
    ];

    /// One line on what the action does and which options it takes.
    pub fn summary(self) -> &'static str {
        match self {
            FaultAction::Drop => "drop the frame",
            FaultAction::Dup => "deliver --copies extra copies (default 1)",
            FaultAction::Reorder => {
                "release --window frames (default 4) shuffled, a partial window after --hold-ms"
            }
            FaultAction::Delay => "deliver after --delay-ms plus up to --jitter-ms",
            FaultAction::Corrupt => "XOR --xor into the byte at --offset, the ICRC (--icrc) or a random byte",
            FaultAction::Rate => "token bucket of --fps or --bps, --burst deep; the excess is dropped",
            FaultAction::LinkDown => "drop everything matched, as a cut link would",
            FaultAction::MpaSettle => {
                "not a fault: hold a TCP connection's data until --delay-ms after its MPA Reply (siw workaround)"
            }
        }
    }

    /// Other spellings [`FromStr`](std::str::FromStr) accepts.
    pub fn aliases(self) -> &'static [&'static str] {
        match self {
            FaultAction::Dup => &["duplicate"],
            FaultAction::Rate => &["rate-limit"],
            _ => &[],
        }
    }
}

impl std::str::FromStr for FaultAction {
    type Err = FaultError;
    fn from_str(s: &str) -> Result<Self, FaultError> {
        Ok(match s {
            "drop" => FaultAction::Drop,
            "dup" | "duplicate" => FaultAction::Dup,
            "reorder" => FaultAction::Reorder,
            "delay" => FaultAction::Delay,
            "corrupt" => FaultAction::Corrupt,
            "rate" | "rate-limit" => FaultAction::Rate,
            "link-down" => FaultAction::LinkDown,
            "mpa-settle" => FaultAction::MpaSettle,
            _ => return Err(FaultError::Action(s.to_string())),
        })
    }
}

impl std::fmt::Display for FaultAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FaultAction::Drop => "drop",
            FaultAction::Dup => "dup",
            FaultAction::Reorder => "reorder",
            FaultAction::Delay => "delay",
            FaultAction::Corrupt => "corrupt",
            FaultAction::Rate => "rate",
            FaultAction::LinkDown => "link-down",
            FaultAction::MpaSettle => "mpa-settle",
        })
    }
}

/// A fault rule as the control socket and the config file (`[[fault]]`)
/// spell it. Every given match field must match.
///
/// Unknown keys are refused (as `deny_unknown_fields` would, which serde
/// does not support next to `flatten`): see [`FAULT_FIELDS`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(remote = "Self", rename_all = "kebab-case")]
pub struct FaultSpec {
    /// Rule id (unique); chosen by the daemon when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<u32>,
    pub port: String,
    #[serde(default)]
    pub dir: Dir,
    /// The L2-L4 match (the same fields as a flow rule's).
    // Deserialized next to the others by `strict_rule_serde!` below.
    #[serde(flatten, skip_deserializing)]
    pub fields: MatchSpec,
    /// RoCEv2 BTH opcode: a number or a name (`RC_SEND_ONLY`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub opcode: Option<String>,
    /// RoCEv2 destination QP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qpn: Option<u32>,
    /// RoCEv2 PSN `N` or `LO-HI` (inclusive; LO > HI wraps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub psn: Option<String>,
    pub action: FaultAction,
    /// Act on a matched frame with this probability.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prob: Option<f64>,
    /// Act on every Nth matched frame (the Nth, 2Nth, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// dup: extra copies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copies: Option<u32>,
    /// reorder: frames per shuffled batch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<usize>,
    /// reorder: longest hold of a partial batch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter_ms: Option<u64>,
    /// corrupt: byte offset in the Ethernet frame.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<usize>,
    /// corrupt: the RoCEv2 ICRC.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub icrc: bool,
    /// corrupt: value XORed in (default 0xff).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xor: Option<u8>,
    /// rate: frames per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fps: Option<f64>,
    /// rate: bytes per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bps: Option<f64>,
    /// rate: bucket depth (frames or bytes; default one second's worth).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<f64>,
}

/// Every key of a [`FaultSpec`], in order: the list the "unknown field"
/// error names.
pub const FAULT_FIELDS: &[&str] = &crate::match_spec::rule_fields::<29>(
    &["id", "port", "dir"],
    &[
        "opcode",
        "qpn",
        "psn",
        "action",
        "prob",
        "every",
        "seed",
        "copies",
        "window",
        "hold-ms",
        "delay-ms",
        "jitter-ms",
        "offset",
        "icrc",
        "xor",
        "fps",
        "bps",
        "burst",
    ],
);

crate::match_spec::strict_rule_serde!(FaultSpec, FAULT_FIELDS);

fn parse_opcode(s: &str) -> Result<u8, FaultError> {
    let n = match s.strip_prefix("0x") {
        Some(h) => u8::from_str_radix(h, 16).ok(),
        None => s.parse::<u8>().ok(),
    };
    if let Some(n) = n {
        return Ok(n);
    }
    let want = s.to_ascii_uppercase().replace('-', "_");
    Opcode::ALL
        .iter()
        .find(|o| o.info().name == want)
        .map(|o| o.as_u8())
        .ok_or_else(|| FaultError::Opcode(s.to_string()))
}

fn parse_psn(s: &str) -> Result<(u32, u32), FaultError> {
    let num = |x: &str| {
        x.trim()
            .parse::<u32>()
            .ok()
            .filter(|&v| v <= 0xff_ffff)
            .ok_or_else(|| FaultError::Psn(x.to_string()))
    };
    match s.split_once('-') {
        Some((a, b)) => Ok((num(a)?, num(b)?)),
        None => {
            let v = num(s)?;
            Ok((v, v))
        }
    }
}

impl FaultSpec {
    fn check(&self) -> Result<(), FaultError> {
        use FaultAction::*;
        if let Some(p) = self.prob {
            if !(0.0..=1.0).contains(&p) {
                return Err(FaultError::Prob(p));
            }
        }
        if self.every == Some(0) {
            return Err(FaultError::EveryZero);
        }
        if self.prob.is_some() && self.every.is_some() {
            return Err(FaultError::ProbAndEvery);
        }
        let only = |ok: &[Option<()>], options: &'static str| -> Result<(), FaultError> {
            if ok.iter().any(|o| o.is_some()) {
                Err(FaultError::NotForAction {
                    options,
                    action: self.action,
                })
            } else {
                Ok(())
            }
        };
        let c = self.copies.map(|_| ());
        let w = self.window.or(self.hold_ms.map(|x| x as usize)).map(|_| ());
        let d = self.delay_ms.or(self.jitter_ms).map(|_| ());
        let x = self
            .offset
            .map(|_| ())
            .or(self.icrc.then_some(()))
            .or(self.xor.map(|_| ()));
        let r = self.fps.or(self.bps).or(self.burst).map(|_| ());
        match self.action {
            Drop | LinkDown => only(&[c, w, d, x, r], "copies/window/delay/corrupt/rate options")?,
            Dup => {
                only(&[w, d, x, r], "window/delay/corrupt/rate options")?;
                if !(1..=16).contains(&self.copies.unwrap_or(1)) {
                    return Err(FaultError::Copies);
                }
            }
            Reorder => {
                only(&[c, d, x, r], "copies/delay/corrupt/rate options")?;
                let win = self.window.unwrap_or(4);
                if !(2..=MAX_WINDOW).contains(&win) {
                    return Err(FaultError::Window);
                }
                if self.hold_ms.unwrap_or(0) > MAX_DELAY_MS {
                    return Err(FaultError::HoldMs);
                }
            }
            Delay => {
                only(&[c, w, x, r], "copies/window/corrupt/rate options")?;
                if self.delay_ms.is_none() {
                    return Err(FaultError::DelayMissing);
                }
                if self.delay_ms.unwrap_or(0) > MAX_DELAY_MS
                    || self.jitter_ms.unwrap_or(0) > MAX_DELAY_MS
                {
                    return Err(FaultError::DelayTooLong);
                }
            }
            Corrupt => {
                only(&[c, w, d, r], "copies/window/delay/rate options")?;
                if self.icrc && self.offset.is_some() {
                    return Err(FaultError::OffsetAndIcrc);
                }
                if self.xor == Some(0) {
                    return Err(FaultError::XorZero);
                }
            }
            MpaSettle => {
                only(&[c, w, x, r], "copies/window/corrupt/rate options")?;
                if self.jitter_ms.is_some() || self.prob.is_some() || self.every.is_some() {
                    return Err(FaultError::SettleOptions);
                }
                match self.delay_ms {
                    Some(1..=MAX_DELAY_MS) => {}
                    _ => return Err(FaultError::SettleDelay),
                }
            }
            Rate => {
                only(&[c, w, d, x], "copies/window/delay/corrupt options")?;
                if self.prob.is_some() || self.every.is_some() {
                    return Err(FaultError::RateOptions);
                }
                match (self.fps, self.bps) {
                    (Some(v), None) | (None, Some(v)) if v > 0.0 && v.is_finite() => {}
                    _ => return Err(FaultError::RateNeeds),
                }
                if self.burst.is_some_and(|b| !(b >= 1.0 && b.is_finite())) {
                    return Err(FaultError::Burst);
                }
            }
        }
        Ok(())
    }

    /// One-line description, e.g. `p0 egress proto udp every 2 -> drop`.
    pub fn describe(&self) -> String {
        let mut v = vec![
            self.port.clone(),
            format!("{:?}", self.dir).to_ascii_lowercase(),
        ];
        v.extend(self.fields.describe());
        let mut f = |k: &str, x: Option<String>| {
            if let Some(x) = x {
                v.push(format!("{k} {x}"));
            }
        };
        f("opcode", self.opcode.clone());
        f("qpn", self.qpn.map(|q| q.to_string()));
        f("psn", self.psn.clone());
        f("prob", self.prob.map(|p| p.to_string()));
        f("every", self.every.map(|p| p.to_string()));
        let mut a = self.action.to_string();
        let mut g = |k: &str, x: Option<String>| {
            if let Some(x) = x {
                a.push_str(&format!(" {k} {x}"));
            }
        };
        g("copies", self.copies.map(|x| x.to_string()));
        g("window", self.window.map(|x| x.to_string()));
        g("hold-ms", self.hold_ms.map(|x| x.to_string()));
        g("delay-ms", self.delay_ms.map(|x| x.to_string()));
        g("jitter-ms", self.jitter_ms.map(|x| x.to_string()));
        g("offset", self.offset.map(|x| x.to_string()));
        g("icrc", self.icrc.then(String::new));
        g("xor", self.xor.map(|x| format!("{x:#04x}")));
        g("fps", self.fps.map(|x| x.to_string()));
        g("bps", self.bps.map(|x| x.to_string()));
        g("burst", self.burst.map(|x| x.to_string()));
        format!("{} -> {}", v.join(" "), a.trim_end())
    }
}

/// Compiled match of a rule: the shared L2-L4 matcher plus the RoCEv2
/// fields only faults match on.
#[derive(Debug)]
struct Matcher {
    /// `None`: no L2-L4 field given (matches every frame).
    flow: Option<devmem_nic::FlowMatch>,
    opcode: Option<u8>,
    qpn: Option<u32>,
    psn: Option<(u32, u32)>,
}

impl Matcher {
    fn new(s: &FaultSpec) -> Result<Self, FaultError> {
        let qpn = s.qpn;
        if qpn.is_some_and(|q| q > 0xff_ffff) {
            return Err(FaultError::Qpn);
        }
        let flow = s.fields.compile()?;
        Ok(Matcher {
            flow: (!s.fields.is_empty()).then_some(flow),
            opcode: s.opcode.as_deref().map(parse_opcode).transpose()?,
            qpn,
            psn: s.psn.as_deref().map(parse_psn).transpose()?,
        })
    }

    fn roce(&self) -> bool {
        self.opcode.is_some() || self.qpn.is_some() || self.psn.is_some()
    }

    /// Whether `data` matches, parsing it into `v` only if a field needs
    /// reading and no view is there yet.
    fn matches(&self, data: &[u8], v: &mut Option<FrameView>) -> bool {
        if self.flow.is_none() && !self.roce() {
            return true;
        }
        self.matches_view(v.get_or_insert_with(|| view(data)))
    }

    fn matches_view(&self, v: &FrameView) -> bool {
        if let Some(m) = &self.flow {
            if !m.matches(v) {
                return false;
            }
        }
        if !self.roce() {
            return true;
        }
        // A BTH whose opcode roce-model does not know matches no RoCE field
        // (as when the BTH was parsed with roce-model here).
        let Some(bth) = v
            .bth
            .filter(|b| v.is_rocev2() && Opcode::try_from(b.opcode).is_ok())
        else {
            return false;
        };
        if self.opcode.is_some_and(|o| o != bth.opcode) {
            return false;
        }
        if self.qpn.is_some_and(|q| q != bth.dest_qp) {
            return false;
        }
        if let Some((lo, hi)) = self.psn {
            let ok = if lo <= hi {
                (lo..=hi).contains(&bth.psn)
            } else {
                bth.psn >= lo || bth.psn <= hi
            };
            if !ok {
                return false;
            }
        }
        true
    }
}

/// Offset of the ICRC of a RoCEv2 frame. Parses `data`;
/// [`icrc_offset_view`] reads a view parsed already.
pub fn icrc_offset(data: &[u8]) -> Option<usize> {
    icrc_offset_view(&view(data), data)
}

/// [`icrc_offset`] with `v`, the view of `data`.
pub fn icrc_offset_view(v: &FrameView, data: &[u8]) -> Option<usize> {
    roce_model::RoceFrame::parse(data).ok()?;
    (v.is_rocev2() && v.l3_end >= 4).then(|| v.l3_end - roce_model::ICRC_LEN)
}

#[derive(Debug)]
struct RuleState {
    rng: FaultRng,
    matched: u64,
    held: Vec<(Dir, Frame)>,
    batch: u64,
    tokens: f64,
    refilled: Instant,
    /// `mpa-settle`: what is held behind MPA Replies, per host pair.
    settle: crate::mpa_settle::SettleState,
}

/// One installed rule.
#[derive(Debug)]
struct Rule {
    id: u32,
    port: usize,
    spec: FaultSpec,
    matcher: Matcher,
    state: Mutex<RuleState>,
    matched: AtomicU64,
    acted: AtomicU64,
    overflow: AtomicU64,
}

/// A rule and its counters (`faults list`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FaultInfo {
    pub id: u32,
    pub seed: u64,
    pub description: String,
    pub rule: FaultSpec,
    /// Frames that matched.
    pub matched: u64,
    /// Frames acted on (dropped, duplicated, held, corrupted, rate-dropped).
    pub acted: u64,
    /// Frames dropped because the port's held-frame bound was reached.
    pub overflow: u64,
    /// Frames held for reordering now.
    pub held: usize,
}

/// A port's link state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkInfo {
    pub port: String,
    pub up: bool,
    /// Frames dropped to or from the port while its link was down.
    pub drops: u64,
}

/// Reply to `faults list` and friends.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FaultsStatus {
    pub rules: Vec<FaultInfo>,
    pub links: Vec<LinkInfo>,
    /// Frames waiting in the timer queue (delayed, or reordered and released).
    pub delayed: usize,
}

#[derive(Debug)]
struct Link {
    down: AtomicBool,
    drops: AtomicU64,
}

/// Something the timer does when due.
#[derive(Debug)]
enum Job {
    /// Hand `frame` on at `port`/`dir`, through the rules after `after`.
    Release {
        port: usize,
        dir: Dir,
        after: u32,
        frame: Frame,
        /// Counted in `held` (a delayed frame).
        counted: bool,
    },
    /// Release what a reorder rule holds if its batch is still `batch`.
    Flush { rule: u32, batch: u64 },
    /// Release what an `mpa-settle` rule holds for host pair `pair`.
    Settle { rule: u32, pair: Vec<u8> },
}

#[derive(Debug)]
struct Timed {
    due: Instant,
    seq: u64,
    job: Job,
}

impl PartialEq for Timed {
    fn eq(&self, o: &Self) -> bool {
        self.due == o.due && self.seq == o.seq
    }
}
impl Eq for Timed {}
impl PartialOrd for Timed {
    fn partial_cmp(&self, o: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(o))
    }
}
impl Ord for Timed {
    /// Reversed: the earliest is the greatest (max-heap).
    fn cmp(&self, o: &Self) -> CmpOrdering {
        o.due.cmp(&self.due).then(o.seq.cmp(&self.seq))
    }
}

#[derive(Debug, Default)]
struct TimerQ {
    heap: BinaryHeap<Timed>,
    seq: u64,
}

/// A frame the timer hands back to the fabric.
#[derive(Debug)]
pub struct Released {
    pub port: usize,
    pub dir: Dir,
    /// Continue with the rules after this one.
    pub after: u32,
    pub frame: Frame,
}

/// The fault rules and link states of a fabric.
#[derive(Debug)]
pub struct Faults {
    names: Vec<String>,
    active: AtomicBool,
    rules: RwLock<Vec<Arc<Rule>>>,
    links: Vec<Link>,
    timer: Mutex<TimerQ>,
    timer_cv: Condvar,
    /// Frames held per port (timer queue and reorder batches).
    held: Vec<AtomicUsize>,
    timer_running: AtomicBool,
    stop: AtomicBool,
    /// Most rules installed at once (`[limits] fault-rules`).
    max_rules: AtomicUsize,
    /// Rules refused at `max_rules`.
    pub refused_at_limit: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Faults {
    /// No rules, every link up, for the ports with these names (in fabric
    /// order).
    pub fn new(names: Vec<String>) -> Self {
        let ports = &names;
        Faults {
            names: names.clone(),
            active: AtomicBool::new(false),
            rules: RwLock::new(Vec::new()),
            links: ports
                .iter()
                .map(|_| Link {
                    down: AtomicBool::new(false),
                    drops: AtomicU64::new(0),
                })
                .collect(),
            timer: Mutex::new(TimerQ::default()),
            timer_cv: Condvar::new(),
            held: ports.iter().map(|_| AtomicUsize::new(0)).collect(),
            timer_running: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            max_rules: AtomicUsize::new(MAX_FAULT_RULES),
            refused_at_limit: AtomicU64::new(0),
        }
    }

    /// Sets the most rules installed at once (`[limits] fault-rules`).
    pub fn set_max_rules(&self, n: usize) {
        self.max_rules.store(n.max(1), Relaxed);
    }

    /// Whether anything is configured (else the fabric skips [`apply_view`](Self::apply_view)).
    pub fn active(&self) -> bool {
        self.active.load(Relaxed)
    }

    fn update_active(&self, rules: &[Arc<Rule>]) {
        let on = !rules.is_empty() || self.links.iter().any(|l| l.down.load(Relaxed));
        self.active.store(on, Relaxed);
    }

    fn port_index(&self, name: &str) -> Result<usize, FaultError> {
        self.names
            .iter()
            .position(|n| n == name)
            .ok_or_else(|| FaultError::NoPort(name.to_string()))
    }

    /// Adds a rule; returns its id.
    pub fn add(&self, mut spec: FaultSpec) -> Result<u32, FaultError> {
        let port = self.port_index(&spec.port)?;
        spec.check()?;
        let matcher = Matcher::new(&spec)?;
        let mut rules = self.rules.write().unwrap_or_else(|e| e.into_inner());
        let max = self.max_rules.load(Relaxed);
        if rules.len() >= max {
            self.refused_at_limit.fetch_add(1, Relaxed);
            return Err(FaultError::TooMany { max });
        }
        let id = match spec.id {
            Some(0) => return Err(FaultError::IdZero),
            Some(id) if rules.iter().any(|r| r.id == id) => return Err(FaultError::Exists(id)),
            Some(id) => id,
            None => rules.iter().map(|r| r.id).max().unwrap_or(0) + 1,
        };
        spec.id = Some(id);
        let seed = spec.seed.unwrap_or(u64::from(id));
        let burst = spec
            .burst
            .unwrap_or_else(|| spec.fps.or(spec.bps).unwrap_or(1.0).max(1.0));
        rules.push(Arc::new(Rule {
            id,
            port,
            matcher,
            state: Mutex::new(RuleState {
                rng: FaultRng::new(seed),
                matched: 0,
                held: Vec::new(),
                batch: 0,
                tokens: burst,
                refilled: Instant::now(),
                settle: Default::default(),
            }),
            spec,
            matched: AtomicU64::new(0),
            acted: AtomicU64::new(0),
            overflow: AtomicU64::new(0),
        }));
        self.update_active(&rules);
        Ok(id)
    }

    /// Removes a rule; frames it holds for reordering are released at once.
    pub fn del(&self, id: u32) -> Result<(), FaultError> {
        let mut rules = self.rules.write().unwrap_or_else(|e| e.into_inner());
        let i = rules
            .iter()
            .position(|r| r.id == id)
            .ok_or(FaultError::NoRule(id))?;
        let r = rules.remove(i);
        self.update_active(&rules);
        drop(rules);
        let held = {
            let mut st = lock(&r.state);
            let mut v = std::mem::take(&mut st.held);
            v.extend(st.settle.drain());
            v
        };
        for (dir, frame) in held {
            self.held[r.port].fetch_sub(1, Relaxed);
            self.schedule_release(r.port, dir, id, frame, Instant::now());
        }
        Ok(())
    }

    /// Sets a port's link up or down.
    pub fn set_link(&self, port: &str, up: bool) -> Result<(), FaultError> {
        let i = self.port_index(port)?;
        self.links[i].down.store(!up, Relaxed);
        let rules = self.rules.read().unwrap_or_else(|e| e.into_inner());
        self.update_active(&rules);
        Ok(())
    }

    /// Whether a port's link is up (`link down` not in force).
    pub fn link_up(&self, port: usize) -> bool {
        !self.links.get(port).is_some_and(|l| l.down.load(Relaxed))
    }

    /// Rules with counters, and link states.
    pub fn status(&self) -> FaultsStatus {
        let rules = self.rules.read().unwrap_or_else(|e| e.into_inner());
        FaultsStatus {
            rules: rules
                .iter()
                .map(|r| FaultInfo {
                    id: r.id,
                    seed: r.spec.seed.unwrap_or(u64::from(r.id)),
                    description: r.spec.describe(),
                    rule: r.spec.clone(),
                    matched: r.matched.load(Relaxed),
                    acted: r.acted.load(Relaxed),
                    overflow: r.overflow.load(Relaxed),
                    held: lock(&r.state).held.len(),
                })
                .collect(),
            links: self
                .names
                .iter()
                .zip(&self.links)
                .map(|(n, l)| LinkInfo {
                    port: n.clone(),
                    up: !l.down.load(Relaxed),
                    drops: l.drops.load(Relaxed),
                })
                .collect(),
            delayed: lock(&self.timer).heap.len(),
        }
    }

    /// Runs a frame of `port` in direction `dir` (ingress or egress) through
    /// the link state and the port's rules; returns what passes now. `v` must
    /// be the view of `frame.data`. Rules read it instead of parsing, and each frame
    /// that passes comes back with its view, for the stages after faults:
    /// the same view, unless a `corrupt` rule changed the bytes or a
    /// reorder batch released frames of earlier calls (those are parsed
    /// again, once). `now` is the time rate limits, delays and reorder holds
    /// count from.
    pub fn apply_view(
        &self,
        port: usize,
        dir: Dir,
        v: &FrameView,
        frame: Frame,
        now: Instant,
    ) -> Vec<(Frame, FrameView)> {
        self.apply_at(port, dir, frame, Some(*v), now)
            .into_iter()
            .map(|(f, v)| {
                let v = v.unwrap_or_else(|| view(&f.data));
                (f, v)
            })
            .collect()
    }

    fn apply_at(
        &self,
        port: usize,
        dir: Dir,
        frame: Frame,
        v: Option<FrameView>,
        now: Instant,
    ) -> Vec<(Frame, Option<FrameView>)> {
        if !self.link_up(port) {
            self.links[port].drops.fetch_add(1, Relaxed);
            return Vec::new();
        }
        self.run(port, dir, 0, frame, v, now)
    }

    /// Continues a released frame through the rules after rule `after` (none
    /// if that rule is gone: the frame was past it already), at time `now`.
    pub fn apply_after_at(&self, r: Released, now: Instant) -> Vec<Frame> {
        if !self.link_up(r.port) {
            self.links[r.port].drops.fetch_add(1, Relaxed);
            return Vec::new();
        }
        self.run(r.port, r.dir, r.after, r.frame, None, now)
            .into_iter()
            .map(|(f, _)| f)
            .collect()
    }

    fn run(
        &self,
        port: usize,
        dir: Dir,
        after: u32,
        frame: Frame,
        v: Option<FrameView>,
        now: Instant,
    ) -> Vec<(Frame, Option<FrameView>)> {
        let rules: Vec<Arc<Rule>> = {
            let all = self.rules.read().unwrap_or_else(|e| e.into_inner());
            let start = if after == 0 {
                0
            } else {
                match all.iter().position(|r| r.id == after) {
                    Some(i) => i + 1,
                    None => all.len(),
                }
            };
            all[start..]
                .iter()
                .filter(|r| r.port == port && r.spec.dir.covers(dir))
                .cloned()
                .collect()
        };
        // Each frame with its view, parsed at most once (and again only
        // after a `corrupt` rule changed its bytes).
        let mut cur = vec![(frame, v)];
        for r in rules {
            let mut next = Vec::with_capacity(cur.len());
            for (f, v) in cur {
                self.run_rule(&r, dir, f, v, now, &mut next);
            }
            cur = next;
            if cur.is_empty() {
                break;
            }
        }
        cur
    }

    fn run_rule(
        &self,
        r: &Rule,
        dir: Dir,
        mut f: Frame,
        mut v: Option<FrameView>,
        now: Instant,
        out: &mut Vec<(Frame, Option<FrameView>)>,
    ) {
        if !r.matcher.matches(&f.data, &mut v) {
            out.push((f, v));
            return;
        }
        r.matched.fetch_add(1, Relaxed);
        let s = &r.spec;
        let mut st = lock(&r.state);
        st.matched += 1;
        if s.action == FaultAction::MpaSettle {
            drop(st);
            let w = *v.get_or_insert_with(|| view(&f.data));
            if let Some(f) = self.settle(r, dir, f, &w, now) {
                out.push((f, v));
            }
            return;
        }
        if s.action == FaultAction::Rate {
            let dt = now.duration_since(st.refilled).as_secs_f64();
            st.refilled = now;
            let rate = s.fps.or(s.bps).unwrap_or(1.0);
            let burst = s.burst.unwrap_or(rate.max(1.0));
            st.tokens = (st.tokens + dt * rate).min(burst);
            let cost = if s.fps.is_some() {
                1.0
            } else {
                f.data.len() as f64
            };
            if st.tokens >= cost {
                st.tokens -= cost;
                out.push((f, v));
            } else {
                r.acted.fetch_add(1, Relaxed);
            }
            return;
        }
        let go = match (s.every, s.prob) {
            (Some(n), _) => st.matched.is_multiple_of(n),
            (_, Some(p)) => st.rng.unit() < p,
            _ => true,
        };
        if !go {
            out.push((f, v));
            return;
        }
        match s.action {
            FaultAction::Drop
            | FaultAction::LinkDown
            | FaultAction::Rate
            | FaultAction::MpaSettle => {}
            FaultAction::Dup => {
                for _ in 0..s.copies.unwrap_or(1) {
                    out.push((f.clone(), v));
                }
                out.push((f, v));
            }
            FaultAction::Corrupt => {
                let x = s.xor.unwrap_or(0xff);
                let at = if s.icrc {
                    let v = v.get_or_insert_with(|| view(&f.data));
                    icrc_offset_view(v, &f.data).map(|o| (o, 4))
                } else if let Some(o) = s.offset {
                    (o < f.data.len()).then_some((o, 1))
                } else {
                    let len = f.data.len() as u64;
                    Some((st.rng.below(len) as usize, 1))
                };
                match at {
                    Some((o, n)) => {
                        for b in &mut f.data[o..o + n] {
                            *b ^= x;
                        }
                    }
                    None => {
                        // Nothing to corrupt (not RoCE, or short): passes.
                        out.push((f, v));
                        return;
                    }
                }
                // The bytes changed: later rules parse them again.
                out.push((f, None));
            }
            FaultAction::Delay => {
                let j = s.jitter_ms.unwrap_or(0);
                let ms = s.delay_ms.unwrap_or(0) + st.rng.below(j + 1);
                drop(st);
                if !self.reserve(r) {
                    return;
                }
                let job = Job::Release {
                    port: r.port,
                    dir,
                    after: r.id,
                    frame: f,
                    counted: true,
                };
                self.schedule(job, now + Duration::from_millis(ms));
            }
            FaultAction::Reorder => {
                if !self.reserve(r) {
                    return;
                }
                st.held.push((dir, f));
                if st.held.len() == 1 {
                    st.batch += 1;
                    let job = Job::Flush {
                        rule: r.id,
                        batch: st.batch,
                    };
                    let hold = Duration::from_millis(s.hold_ms.unwrap_or(100));
                    self.schedule(job, now + hold);
                }
                if st.held.len() >= s.window.unwrap_or(4) {
                    let batch = shuffle(&mut st);
                    drop(st);
                    for (d, f) in batch {
                        self.held[r.port].fetch_sub(1, Relaxed);
                        if d == dir {
                            out.push((f, None));
                        } else {
                            self.schedule_release(r.port, d, r.id, f, now);
                        }
                    }
                }
            }
        }
        r.acted.fetch_add(1, Relaxed);
    }

    /// `mpa-settle` (module [`crate::mpa_settle`]): lets an MPA Reply
    /// through and holds what follows it for a while, in order. Returns the
    /// frame if it passes now.
    fn settle(&self, r: &Rule, dir: Dir, f: Frame, v: &FrameView, now: Instant) -> Option<Frame> {
        use crate::mpa_settle::Offer;
        let delay = Duration::from_millis(r.spec.delay_ms.unwrap_or(0));
        let mut st = lock(&r.state);
        match st
            .settle
            .offer_view(dir, f, v, now, delay, || self.reserve(r))
        {
            Ok(Offer::Pass(f)) => Some(f),
            Ok(Offer::Untracked(f)) => {
                r.overflow.fetch_add(1, Relaxed);
                Some(f)
            }
            Ok(Offer::Held(job)) => {
                r.acted.fetch_add(1, Relaxed);
                if let Some((pair, at)) = job {
                    drop(st);
                    self.schedule(Job::Settle { rule: r.id, pair }, at.max(now));
                }
                None
            }
            // Beyond the held-frame bound: dropped (`reserve` counted it).
            Err(_) => None,
        }
    }

    /// Counts a frame held for `port`; false (dropped, counted) beyond the bound.
    fn reserve(&self, r: &Rule) -> bool {
        let port = r.port;
        if !self.timer_running.load(Relaxed) {
            // No timer thread (a bare fabric): nothing could release it.
            r.overflow.fetch_add(1, Relaxed);
            return false;
        }
        if self.held[port].fetch_add(1, Relaxed) >= MAX_HELD_PER_PORT {
            self.held[port].fetch_sub(1, Relaxed);
            r.overflow.fetch_add(1, Relaxed);
            return false;
        }
        true
    }

    /// Hands `frame` back to the fabric at `due` (now: at once).
    fn schedule_release(&self, port: usize, dir: Dir, after: u32, frame: Frame, due: Instant) {
        self.schedule(
            Job::Release {
                port,
                dir,
                after,
                frame,
                counted: false,
            },
            due,
        );
    }

    /// Queues `job` for the timer thread at `due`.
    fn schedule(&self, job: Job, due: Instant) {
        let mut q = lock(&self.timer);
        q.seq += 1;
        let seq = q.seq;
        let wake = q.heap.peek().is_none_or(|t| due < t.due);
        q.heap.push(Timed { due, seq, job });
        drop(q);
        if wake {
            self.timer_cv.notify_one();
        }
    }

    /// Marks the timer thread as started (before it runs, so that frames
    /// held right away are not refused).
    pub fn timer_started(&self) {
        self.stop.store(false, SeqCst);
        self.timer_running.store(true, SeqCst);
    }

    /// The installed rule `id`, if it still is.
    fn rule(&self, id: u32) -> Option<Arc<Rule>> {
        let rules = self.rules.read().unwrap_or_else(|e| e.into_inner());
        rules.iter().find(|r| r.id == id).cloned()
    }

    /// The timer thread's loop: hands due frames to `deliver` until
    /// [`stop_timer`](Self::stop_timer).
    pub fn run_timer(&self, deliver: impl Fn(Released, Instant)) {
        self.timer_running.store(true, SeqCst);
        while !self.stop.load(SeqCst) {
            let mut due = Vec::new();
            // One clock reading per round: what is due and what the
            // released jobs count from.
            let now = Instant::now();
            {
                let mut q = lock(&self.timer);
                while q.heap.peek().is_some_and(|t| t.due <= now) {
                    if let Some(t) = q.heap.pop() {
                        due.push(t.job);
                    }
                }
                if due.is_empty() {
                    let wait = q
                        .heap
                        .peek()
                        .map_or(Duration::from_millis(200), |t| t.due - now)
                        .min(Duration::from_millis(200));
                    let _ = self
                        .timer_cv
                        .wait_timeout(q, wait)
                        .unwrap_or_else(|e| e.into_inner());
                    continue;
                }
            }
            // A held frame, let go: it continues after the rule `after`, and
            // no longer counts as held on its port where it was counted.
            let release = |port: usize, dir, after, frame, counted: bool| {
                if counted {
                    self.held[port].fetch_sub(1, Relaxed);
                }
                deliver(
                    Released {
                        port,
                        dir,
                        after,
                        frame,
                    },
                    now,
                );
            };
            // A rule's held frames, let go: each was counted.
            let hand_on = |port: usize, after, frames: Vec<(Dir, Frame)>| {
                for (dir, frame) in frames {
                    release(port, dir, after, frame, true);
                }
            };
            for job in due {
                match job {
                    Job::Release {
                        port,
                        dir,
                        after,
                        frame,
                        counted,
                    } => release(port, dir, after, frame, counted),
                    Job::Settle { rule, pair } => {
                        let Some(r) = self.rule(rule) else { continue };
                        // Deliver under the rule's lock: a segment of this
                        // host pair arriving meanwhile waits, then follows.
                        let st = &mut *lock(&r.state);
                        let (frames, next) = st.settle.release(&pair, now);
                        hand_on(r.port, r.id, frames);
                        if let Some(at) = next {
                            self.schedule(Job::Settle { rule, pair }, at.max(now));
                        }
                    }
                    Job::Flush { rule, batch } => {
                        let Some(r) = self.rule(rule) else { continue };
                        let frames = {
                            let mut st = lock(&r.state);
                            if st.batch != batch || st.held.is_empty() {
                                continue;
                            }
                            shuffle(&mut st)
                        };
                        hand_on(r.port, r.id, frames);
                    }
                }
            }
        }
        self.timer_running.store(false, SeqCst);
    }

    /// Makes [`run_timer`](Self::run_timer) return.
    pub fn stop_timer(&self) {
        self.stop.store(true, SeqCst);
        self.timer_cv.notify_all();
    }
}

/// Takes a reorder batch in a seeded shuffled order that differs from the
/// arrival order (when it has two frames or more).
fn shuffle(st: &mut RuleState) -> Vec<(Dir, Frame)> {
    let v = std::mem::take(&mut st.held);
    let n = v.len();
    let mut idx: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = st.rng.below(i as u64 + 1) as usize;
        idx.swap(i, j);
    }
    if n >= 2 && idx.iter().enumerate().all(|(i, &x)| i == x) {
        idx.swap(0, 1);
    }
    let mut slots: Vec<Option<(Dir, Frame)>> = v.into_iter().map(Some).collect();
    idx.into_iter().filter_map(|i| slots[i].take()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::match_spec::MatchSpec;

    #[test]
    fn opcodes_and_psns_parse() {
        assert_eq!(parse_opcode("4"), Ok(4));
        assert_eq!(parse_opcode("0x11"), Ok(0x11));
        assert_eq!(parse_opcode("rc-send-only"), Ok(4));
        assert_eq!(parse_opcode("RC_ACKNOWLEDGE"), Ok(0x11));
        assert!(parse_opcode("RC_NOPE").is_err());
        assert_eq!(parse_psn("5"), Ok((5, 5)));
        assert_eq!(parse_psn("100-200"), Ok((100, 200)));
        assert!(parse_psn("1-16777216").is_err());
    }

    #[test]
    fn specs_are_checked() {
        let ok = |s: FaultSpec| s.check().map(|_| ());
        let base = FaultSpec {
            port: "a".into(),
            ..FaultSpec::default()
        };
        assert!(ok(base.clone()).is_ok());
        for bad in [
            FaultSpec {
                prob: Some(0.5),
                every: Some(2),
                ..base.clone()
            },
            FaultSpec {
                every: Some(0),
                ..base.clone()
            },
            FaultSpec {
                action: FaultAction::Delay,
                ..base.clone()
            },
            FaultSpec {
                action: FaultAction::Reorder,
                window: Some(1),
                ..base.clone()
            },
            FaultSpec {
                action: FaultAction::Rate,
                ..base.clone()
            },
            FaultSpec {
                action: FaultAction::Corrupt,
                icrc: true,
                offset: Some(3),
                ..base.clone()
            },
            FaultSpec {
                delay_ms: Some(3),
                ..base.clone()
            },
        ] {
            assert!(ok(bad.clone()).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn shuffles_are_seeded_and_never_identity() {
        let run = |seed| {
            let mut st = RuleState {
                rng: FaultRng::new(seed),
                matched: 0,
                held: (0..2u8)
                    .map(|i| {
                        (
                            Dir::Egress,
                            Frame {
                                data: vec![i],
                                ..Frame::default()
                            },
                        )
                    })
                    .collect(),
                batch: 0,
                tokens: 0.0,
                refilled: Instant::now(),
                settle: Default::default(),
            };
            shuffle(&mut st)
                .into_iter()
                .map(|(_, f)| f.data[0])
                .collect::<Vec<_>>()
        };
        for seed in 0..20 {
            assert_eq!(run(seed), vec![1, 0]);
        }
    }

    #[test]
    fn spec_spelling_is_unchanged_and_unknown_keys_are_refused() {
        let json = r#"{"id":2,"port":"p0","dir":"egress","src-mac":"02:00:00:00:00:01","dst-mac":"02:00:00:00:00:02","ethertype":2048,"src-ip":"10.0.0.1","dst-ip":"10.0.0.2/32","proto":"udp","src-port":1,"dst-port":4791,"opcode":"RC_SEND_ONLY","qpn":17,"psn":"1-9","action":"corrupt","prob":0.5,"every":3,"seed":7,"copies":1,"window":4,"hold-ms":5,"delay-ms":6,"jitter-ms":7,"offset":8,"icrc":true,"xor":9,"fps":1.5,"bps":2.5,"burst":3.5}"#;
        let r: FaultSpec = serde_json::from_str(json).unwrap();
        assert_eq!(r.fields.dst_port, Some(4791));
        assert_eq!(
            (r.dir, r.action, r.qpn),
            (Dir::Egress, FaultAction::Corrupt, Some(17))
        );
        assert_eq!(serde_json::to_string(&r).unwrap(), json);
        crate::match_spec::assert_fields_list_every_key(json, FAULT_FIELDS, "FAULT_FIELDS");
        let e = serde_json::from_str::<FaultSpec>(r#"{"port":"p0","action":"drop","queue":1}"#)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("unknown field `queue`, expected one of `id`, `port`, `dir`, `src-mac`"),
            "{e}"
        );
        let e = serde_json::from_str::<FaultSpec>(r#"{"action":"drop"}"#).unwrap_err();
        assert!(e.to_string().contains("missing field `port`"), "{e}");
        let t: FaultSpec =
            toml::from_str("port = \"p0\"\naction = \"rate\"\nfps = 100\nproto = \"udp\"\n")
                .unwrap();
        assert_eq!(t.describe(), "p0 both proto udp -> rate fps 100");
        assert!(
            toml::from_str::<FaultSpec>("port = \"p0\"\naction = \"drop\"\nbogus = 1\n")
                .unwrap_err()
                .to_string()
                .contains("unknown field `bogus`")
        );
    }

    #[test]
    fn errors_read_as_before() {
        let e = |r: Result<u32, FaultError>| r.unwrap_err().to_string();
        let f = Faults::new(vec!["p0".into()]);
        let spec = |action| FaultSpec {
            port: "p0".into(),
            action,
            ..FaultSpec::default()
        };
        let drop = spec(FaultAction::Drop);
        for (refused, message) in [
            (
                FaultSpec {
                    port: "px".into(),
                    ..drop.clone()
                },
                "no port named \"px\"",
            ),
            (
                FaultSpec {
                    copies: Some(2),
                    ..drop.clone()
                },
                "copies/window/delay/corrupt/rate options does not apply to action drop",
            ),
            (
                FaultSpec {
                    psn: Some("x".into()),
                    ..drop.clone()
                },
                "PSN \"x\": a number up to 16777215",
            ),
            (
                FaultSpec {
                    fields: MatchSpec {
                        proto: Some("sctpx".into()),
                        ..MatchSpec::default()
                    },
                    ..drop.clone()
                },
                "protocol \"sctpx\": use tcp, udp or a number",
            ),
            (
                FaultSpec {
                    id: Some(0),
                    ..drop.clone()
                },
                "rule id 0 is reserved",
            ),
        ] {
            assert_eq!(e(f.add(refused)), message);
        }
        assert_eq!(f.del(9).unwrap_err().to_string(), "no fault rule 9");
        assert_eq!(
            "nope".parse::<FaultAction>().unwrap_err().to_string(),
            "action \"nope\": use drop, dup, reorder, delay, corrupt, rate, link-down or mpa-settle"
        );
        assert_eq!(FaultError::Qpn.to_string(), "qpn is 24 bits");
    }

    fn roce(qpn: u32, psn: u32) -> Vec<u8> {
        use roce_model::{FrameBuilder, NetParams, PacketBuilder};
        FrameBuilder {
            dst_mac: [2, 0, 0, 0, 0, 2],
            src_mac: [2, 0, 0, 0, 0, 1],
            vlan_tci: None,
            net: NetParams::Ipv4 {
                src: [10, 0, 0, 1],
                dst: [10, 0, 0, 2],
                tos: 0,
                ttl: 64,
                ident: 1,
                udp_src_port: 49152,
            },
        }
        .build(&PacketBuilder::new(Opcode::RcSendOnly, qpn, psn).payload(b"data"))
        .unwrap()
    }

    #[test]
    fn rules_read_the_view_and_take_time_as_input() {
        let f = Faults::new(vec!["p0".into()]);
        f.add(FaultSpec {
            port: "p0".into(),
            qpn: Some(5),
            psn: Some("10-20".into()),
            opcode: Some("RC_SEND_ONLY".into()),
            action: FaultAction::Rate,
            fps: Some(10.0),
            burst: Some(1.0),
            ..FaultSpec::default()
        })
        .unwrap();
        let frame = |data: Vec<u8>| Frame {
            data,
            ..Frame::default()
        };
        let t0 = Instant::now();
        let run = |data: Vec<u8>, t: Instant| {
            f.apply_view(0, Dir::Ingress, &view(&data), frame(data.clone()), t)
                .len()
        };
        // Not matched (another QP, a PSN outside the range): never limited.
        for _ in 0..3 {
            assert_eq!(run(roce(6, 15), t0), 1);
            assert_eq!(run(roce(5, 21), t0), 1);
        }
        // Matched: one frame per 100 ms of the caller's clock.
        assert_eq!(run(roce(5, 15), t0), 1);
        assert_eq!(run(roce(5, 15), t0), 0);
        assert_eq!(run(roce(5, 10), t0 + Duration::from_millis(50)), 0);
        assert_eq!(run(roce(5, 20), t0 + Duration::from_millis(200)), 1);
        // What passes comes back with its view.
        let data = roce(5, 15);
        let out = f.apply_view(
            0,
            Dir::Egress,
            &view(&data),
            frame(data.clone()),
            t0 + Duration::from_secs(1),
        );
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].1, view(&out[0].0.data));
        let st = f.status();
        assert_eq!((st.rules[0].matched, st.rules[0].acted), (5, 2));
    }

    #[test]
    fn a_corrupted_frame_comes_back_with_a_fresh_view() {
        let f = Faults::new(vec!["p0".into()]);
        let base = FaultSpec {
            port: "p0".into(),
            ..FaultSpec::default()
        };
        // Flip the last byte of the IPv4 destination, then match on the new
        // destination: the second rule must see the changed bytes.
        f.add(FaultSpec {
            action: FaultAction::Corrupt,
            offset: Some(33),
            xor: Some(0x01),
            ..base.clone()
        })
        .unwrap();
        f.add(FaultSpec {
            action: FaultAction::Dup,
            fields: MatchSpec {
                dst_ip: Some("10.0.0.3".into()),
                ..MatchSpec::default()
            },
            ..base
        })
        .unwrap();
        let data = roce(5, 1);
        let v = view(&data);
        let fr = Frame {
            data,
            ..Frame::default()
        };
        let out = f.apply_view(0, Dir::Ingress, &v, fr, Instant::now());
        assert_eq!(out.len(), 2, "the dup rule saw the corrupted destination");
        for (f, w) in &out {
            assert_eq!(w.dst_ip(), Some("10.0.0.3".parse().unwrap()));
            assert_eq!(*w, view(&f.data));
        }
    }
}

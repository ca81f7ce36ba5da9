//! The live protocol checker on the fabric (issue 6): every frame a guest
//! sends is shown to a [`wire_checker::Checker`] *as the guest emitted it*,
//! at ingress, before fault rules act on it (the same tap point as an
//! ingress capture). So frames dropped, corrupted, duplicated or delayed by
//! fault injection are never taken for the sender's bugs: their effects
//! appear as what the endpoints do about them (retransmissions, NAKs, RNR
//! NAKs), which the checker counts per connection.
//!
//! Cost when idle: frames that are neither RoCE nor TCP are dismissed after
//! reading the Ethernet/IP headers, without a lock; TCP segments only take
//! the lock when they start an MPA or CLC exchange or when some TCP
//! connection is already followed.

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Instant;
use wire_checker::{Checker, CheckerConfig, CheckerStats, Finding, FlowsView, Interest};

/// `[checker]` settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", default, deny_unknown_fields)]
pub struct CheckerSettings {
    /// Whether frames are checked (default on).
    pub enabled: bool,
    /// RoCE connections and TCP sessions tracked (each kind).
    pub max_flows: usize,
    /// Findings kept.
    pub max_findings: usize,
}

impl Default for CheckerSettings {
    fn default() -> Self {
        let d = CheckerConfig::default();
        CheckerSettings {
            enabled: true,
            max_flows: d.max_flows,
            max_findings: d.max_findings,
        }
    }
}

/// Upper bound of `max-flows` and `max-findings`: keeps the state and a
/// control reply bounded.
pub const MAX_LIMIT: usize = 65536;

/// A checker limit out of its range ([`CheckerSettings::check`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckerLimitError {
    /// `max-flows` is 0 or above [`MAX_LIMIT`].
    #[error("checker max-flows must be between 1 and {MAX_LIMIT}")]
    MaxFlows,
    /// `max-findings` is above [`MAX_LIMIT`].
    #[error("checker max-findings must be at most {MAX_LIMIT}")]
    MaxFindings,
}

impl CheckerSettings {
    /// Checks the limits.
    pub fn check(&self) -> Result<(), CheckerLimitError> {
        if self.max_flows == 0 || self.max_flows > MAX_LIMIT {
            return Err(CheckerLimitError::MaxFlows);
        }
        if self.max_findings > MAX_LIMIT {
            return Err(CheckerLimitError::MaxFindings);
        }
        Ok(())
    }

    fn config(&self) -> CheckerConfig {
        CheckerConfig {
            max_flows: self.max_flows,
            max_findings: self.max_findings,
            ..CheckerConfig::default()
        }
    }
}

/// Checker state and counters for `status`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckerStatus {
    pub enabled: bool,
    pub max_flows: usize,
    pub max_findings: usize,
    #[serde(flatten)]
    pub stats: CheckerStats,
}

/// Reply body of `findings`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FindingsReply {
    pub findings: Vec<Finding>,
    /// Findings ever reported and dropped because the ring was full.
    pub total: u64,
    pub dropped: u64,
    /// Whether the findings were cleared after this reply was taken.
    pub cleared: bool,
}

/// The fabric's checker.
#[derive(Debug)]
pub struct FabricChecker {
    enabled: AtomicBool,
    tracks_tcp: AtomicBool,
    settings: Mutex<CheckerSettings>,
    inner: Mutex<Checker>,
}

impl Default for FabricChecker {
    fn default() -> Self {
        Self::new(CheckerSettings::default())
    }
}

impl FabricChecker {
    /// A checker with these settings.
    pub fn new(s: CheckerSettings) -> Self {
        FabricChecker {
            enabled: AtomicBool::new(s.enabled),
            tracks_tcp: AtomicBool::new(false),
            settings: Mutex::new(s),
            inner: Mutex::new(Checker::new(s.config())),
        }
    }

    /// Replaces the settings (limits take effect on a fresh checker).
    pub fn configure(&self, s: CheckerSettings) {
        self.enabled.store(s.enabled, Relaxed);
        *self.settings.lock().unwrap_or_else(|e| e.into_inner()) = s;
        *self.inner.lock().unwrap_or_else(|e| e.into_inner()) = Checker::new(s.config());
        self.tracks_tcp.store(false, Relaxed);
    }

    /// Turns checking on or off (state is kept).
    pub fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Relaxed);
        self.settings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .enabled = on;
    }

    /// Whether the checker is on.
    pub fn enabled(&self) -> bool {
        self.enabled.load(Relaxed)
    }

    /// Shows a frame a guest sent on `port` at `now` (the batch's time) to
    /// the checker.
    pub fn observe(&self, now: Instant, port: &str, frame: &[u8]) {
        if !self.enabled.load(Relaxed) {
            return;
        }
        match wire_checker::classify(frame) {
            Interest::None => return,
            Interest::Tcp if !self.tracks_tcp.load(Relaxed) => return,
            _ => {}
        }
        let mut c = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let ts_ns = crate::frame::ns_at(now);
        c.observe(ts_ns, port, frame);
        self.tracks_tcp.store(c.tracks_tcp(), Relaxed);
    }

    /// Settings and counters.
    pub fn status(&self) -> CheckerStatus {
        let s = *self.settings.lock().unwrap_or_else(|e| e.into_inner());
        CheckerStatus {
            enabled: s.enabled,
            max_flows: s.max_flows,
            max_findings: s.max_findings,
            stats: self.inner.lock().unwrap_or_else(|e| e.into_inner()).stats(),
        }
    }

    /// The flow table.
    pub fn flows(&self) -> FlowsView {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).flows()
    }

    /// The findings, optionally clearing them in the same step.
    pub fn findings(&self, clear: bool) -> FindingsReply {
        let mut c = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let s = c.stats();
        let r = FindingsReply {
            findings: c.findings(),
            total: s.findings,
            dropped: s.findings_dropped,
            cleared: clear,
        };
        if clear {
            c.clear_findings();
        }
        r
    }
}

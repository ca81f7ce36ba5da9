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

use crate::control::{Reply, Request};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock};
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

impl CheckerSettings {
    /// Checks the limits.
    pub fn check(&self) -> anyhow::Result<()> {
        if self.max_flows == 0 || self.max_flows > MAX_LIMIT {
            anyhow::bail!("checker max-flows must be between 1 and {MAX_LIMIT}");
        }
        if self.max_findings > MAX_LIMIT {
            anyhow::bail!("checker max-findings must be at most {MAX_LIMIT}");
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

fn now_ns() -> u64 {
    static T0: OnceLock<Instant> = OnceLock::new();
    T0.get_or_init(Instant::now).elapsed().as_nanos() as u64
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

    /// Shows a frame a guest sent on `port` to the checker.
    pub fn observe(&self, port: &str, frame: &[u8]) {
        if !self.enabled.load(Relaxed) {
            return;
        }
        match wire_checker::classify(frame) {
            Interest::None => return,
            Interest::Tcp if !self.tracks_tcp.load(Relaxed) => return,
            _ => {}
        }
        let mut c = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        c.observe(now_ns(), port, frame);
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

/// Control requests of the checker.
pub fn handle(fabric: &crate::fabric::Fabric, req: &Request) -> Reply {
    let ch = &fabric.checker;
    match req {
        Request::Flows => Reply {
            ok: true,
            flows: Some(ch.flows()),
            checker: Some(ch.status()),
            ..Reply::default()
        },
        Request::Findings { clear } => Reply {
            ok: true,
            findings: Some(ch.findings(*clear)),
            checker: Some(ch.status()),
            ..Reply::default()
        },
        Request::Checker { enabled } => {
            if let Some(on) = enabled {
                ch.set_enabled(*on);
            }
            Reply {
                ok: true,
                checker: Some(ch.status()),
                ..Reply::default()
            }
        }
        _ => Reply {
            ok: false,
            error: Some("not a checker request".into()),
            ..Reply::default()
        },
    }
}

/// `vhost-rdma ctl flows|findings|checker`.
pub mod cli {
    use super::*;
    use crate::control::request;
    use anyhow::{bail, Context};
    use std::path::Path;

    /// `ctl checker on|off`.
    #[derive(clap::ValueEnum, Clone, Copy, Debug)]
    pub enum OnOff {
        On,
        Off,
    }

    fn ask(control: &Path, req: &Request) -> anyhow::Result<Reply> {
        let r = request(control, req)?;
        if !r.ok {
            bail!("daemon refused: {}", r.error.unwrap_or_default());
        }
        Ok(r)
    }

    fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
        v.map_or("-".into(), |x| x.to_string())
    }

    fn hex(v: Option<u32>) -> String {
        v.map_or("-".into(), |x| format!("{x:#08x}"))
    }

    /// `ctl flows`.
    pub fn flows(control: &Path, json: bool) -> anyhow::Result<()> {
        let r = ask(control, &Request::Flows)?;
        let f = r.flows.context("reply without flows")?;
        if json {
            println!("{}", serde_json::to_string_pretty(&f)?);
            return Ok(());
        }
        if f.roce.is_empty() && f.iwarp.is_empty() && f.smc.is_empty() {
            println!("no RoCE, iWARP or SMC flows seen");
        }
        for c in &f.roce {
            println!(
                "{} [{}{}]",
                c.connection,
                c.transport,
                if c.paired { "" } else { ", unpaired" }
            );
            for h in &c.halves {
                println!(
                    "  {:<34} port {:<6} pkts {:>8} msgs {:>6} next-psn {:>8} retrans {:>4} reads-out {:>2} pmtu {:>4}",
                    h.direction,
                    h.port,
                    h.packets,
                    h.messages,
                    hex(h.next_psn),
                    h.retransmits,
                    h.outstanding_reads,
                    opt(h.pmtu)
                );
                if h.acks + h.naks_seq + h.naks_rnr + h.naks_other + h.read_responses > 0 {
                    println!(
                        "  {:<34} acks {} (dup {}) last-ack {} msn {} nak-seq {} rnr {} nak-other {} read-resp {}",
                        "",
                        h.acks,
                        h.dup_acks,
                        hex(h.last_ack_psn),
                        opt(h.msn),
                        h.naks_seq,
                        h.naks_rnr,
                        h.naks_other,
                        h.read_responses
                    );
                }
                if h.icrc_errors > 0 {
                    println!("  {:<34} ICRC errors {}", "", h.icrc_errors);
                }
                if let Some(s) = &h.smc {
                    println!(
                        "  {:<34} SMC-R llc {} (last {}) cdc {}",
                        "",
                        s.llc_messages,
                        s.last_llc.as_deref().unwrap_or("-"),
                        s.cdc_messages
                    );
                    for k in &s.cursors {
                        println!(
                            "  {:<34}   token {:#x} seq {} prod {}:{} cons {}:{}",
                            "",
                            k.token,
                            k.seqno,
                            k.producer.0,
                            k.producer.1,
                            k.consumer.0,
                            k.consumer.1
                        );
                    }
                }
            }
        }
        for c in &f.iwarp {
            println!(
                "{} [{}{}]",
                c.connection,
                c.state,
                match c.crc {
                    Some(true) => ", crc",
                    Some(false) => ", no crc",
                    None => "",
                }
            );
            for d in &c.dirs {
                println!(
                    "  {:<44} bytes {:>10} fpdus {:>8} msgs {:>6} next-msn send/read/term {}/{}/{} reads-out {}{}{}",
                    d.direction,
                    d.stream_offset,
                    d.fpdus,
                    d.messages,
                    d.next_msn[0],
                    d.next_msn[1],
                    d.next_msn[2],
                    d.outstanding_reads,
                    if d.parsed { "" } else { " UNPARSED" },
                    d.terminate
                        .as_ref()
                        .map(|t| format!(" terminate: {t}"))
                        .unwrap_or_default()
                );
            }
        }
        for s in &f.smc {
            println!(
                "{} [{} v{} {:?}] qpn server {} client {}{}{}",
                s.connection,
                s.kind,
                s.version,
                s.state,
                hex(s.server_qpn),
                hex(s.client_qpn),
                if s.first_contact {
                    " first-contact"
                } else {
                    ""
                },
                s.decline
                    .as_ref()
                    .map(|d| format!(" decline {d}"))
                    .unwrap_or_default()
            );
        }
        Ok(())
    }

    /// `ctl findings [--clear]`.
    pub fn findings(control: &Path, json: bool, clear: bool) -> anyhow::Result<()> {
        let r = ask(control, &Request::Findings { clear })?;
        let f = r.findings.context("reply without findings")?;
        if json {
            println!("{}", serde_json::to_string_pretty(&f)?);
            return Ok(());
        }
        for x in &f.findings {
            println!("{:>12.6}s {x}", x.ts_ns as f64 / 1e9);
        }
        println!(
            "{} finding(s) shown, {} reported in all, {} dropped (ring full){}",
            f.findings.len(),
            f.total,
            f.dropped,
            if f.cleared { "; cleared" } else { "" }
        );
        Ok(())
    }

    /// `ctl checker [on|off]`.
    pub fn checker(control: &Path, json: bool, enabled: Option<bool>) -> anyhow::Result<()> {
        let r = ask(control, &Request::Checker { enabled })?;
        let s = r.checker.context("reply without checker status")?;
        if json {
            println!("{}", serde_json::to_string_pretty(&s)?);
            return Ok(());
        }
        print_status(&s);
        Ok(())
    }

    /// One line of checker counters (also under `ctl status`).
    pub fn print_status(s: &CheckerStatus) {
        println!(
            "checker {}: frames {} roce {} tcp {} findings {} (dropped {}) flows-evicted {} streams-unparsed {}",
            if s.enabled { "on" } else { "off" },
            s.stats.frames,
            s.stats.roce_packets,
            s.stats.tcp_segments,
            s.stats.findings,
            s.stats.findings_dropped,
            s.stats.flows_evicted,
            s.stats.streams_unparsed
        );
    }
}

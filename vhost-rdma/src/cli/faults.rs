//! `vhost-rdma ctl faults|link|capture ...`.

use super::{parse_u32_any, parse_u8_any};
use anyhow::{bail, Context};
use std::path::{Path, PathBuf};
use vhost_rdma::capture::CaptureStatus;
use vhost_rdma::control::{request, Reply, Request};
use vhost_rdma::faults::{Dir, FaultAction, FaultSpec, FaultsStatus};
use vhost_rdma::match_spec::MatchSpec;

/// `ctl faults` subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum FaultsCmd {
    /// Add a rule: frames of PORT in DIR matching every given field get
    /// ACTION (on every matched frame, or with --prob / --every).
    Add(Box<FaultAddArgs>),
    /// Rules with matched/acted counters, and link states.
    List,
    /// Remove a rule by id.
    Del {
        /// The rule's id (`faults list`).
        id: u32,
    },
}

/// Options of `ctl faults add`.
#[derive(clap::Args, Debug)]
pub struct FaultAddArgs {
    /// The port whose frames the rule sees.
    #[arg(long)]
    pub port: String,
    /// ingress (frames the guest sent), egress (towards it) or both.
    #[arg(long, default_value = "both")]
    pub dir: Dir,
    /// What happens to an acted-on frame.
    #[arg(long, value_parser = fault_action_parser())]
    pub action: FaultAction,
    /// Rule id (default: the next free one).
    #[arg(long)]
    pub id: Option<u32>,
    /// The L2-L4 fields to match.
    #[command(flatten)]
    pub fields: MatchSpec,
    /// RoCEv2 BTH opcode (number or name, e.g. RC_SEND_ONLY).
    #[arg(long)]
    pub opcode: Option<String>,
    /// RoCEv2 destination QP (decimal or 0x hex).
    #[arg(long, value_parser = parse_u32_any)]
    pub qpn: Option<u32>,
    /// RoCEv2 PSN or inclusive range LO-HI.
    #[arg(long)]
    pub psn: Option<String>,
    /// Act with this probability.
    #[arg(long, conflicts_with = "every")]
    pub prob: Option<f64>,
    /// Act on every Nth matched frame.
    #[arg(long)]
    pub every: Option<u64>,
    /// PRNG seed (default: the rule id).
    #[arg(long)]
    pub seed: Option<u64>,
    /// dup: extra copies (default 1).
    #[arg(long)]
    pub copies: Option<u32>,
    /// reorder: frames per shuffled batch (default 4).
    #[arg(long)]
    pub window: Option<usize>,
    /// reorder: release a partial batch after this long (default 100).
    #[arg(long)]
    pub hold_ms: Option<u64>,
    /// delay: milliseconds; mpa-settle: how long data waits after an MPA Reply.
    #[arg(long)]
    pub delay_ms: Option<u64>,
    /// delay: extra uniform 0..=J milliseconds.
    #[arg(long)]
    pub jitter_ms: Option<u64>,
    /// corrupt: byte offset in the Ethernet frame (default: random).
    #[arg(long, conflicts_with = "icrc")]
    pub offset: Option<usize>,
    /// corrupt: the RoCEv2 ICRC.
    #[arg(long)]
    pub icrc: bool,
    /// corrupt: value XORed in (default 0xff).
    #[arg(long, value_parser = parse_u8_any)]
    pub xor: Option<u8>,
    /// rate: frames per second.
    #[arg(long, conflicts_with = "bps")]
    pub fps: Option<f64>,
    /// rate: bytes per second.
    #[arg(long)]
    pub bps: Option<f64>,
    /// rate: bucket depth (default one second's worth).
    #[arg(long)]
    pub burst: Option<f64>,
}

/// `ctl link down|up`.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum LinkState {
    /// Frames to and from the port are dropped (counted).
    Down,
    /// Frames flow again.
    Up,
}

/// `--action`'s values: every [`FaultAction`] with its summary (so `--help`
/// lists them all) and its other spellings.
pub fn fault_action_parser() -> impl clap::builder::TypedValueParser<Value = FaultAction> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new(FaultAction::ALL.iter().map(|a| {
        PossibleValue::new(a.to_string())
            .help(a.summary())
            .aliases(a.aliases().iter().copied())
    }))
    .try_map(|s| s.parse::<FaultAction>())
}

/// `ctl capture` subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum CaptureCmd {
    /// Start writing pcapng: one port, or every port (one interface each).
    Start {
        /// The new pcapng file, in the daemon's capture directory (a plain
        /// name is created there).
        #[arg(long)]
        file: PathBuf,
        /// Capture only this port (default: every port).
        #[arg(long)]
        port: Option<String>,
        /// Keep at most N bytes of each frame.
        #[arg(long)]
        snaplen: Option<u32>,
    },
    /// Stop and close the file.
    Stop,
    /// The running (or last) capture's counters.
    Status,
}

fn call(control: &Path, req: &Request) -> anyhow::Result<Reply> {
    let r = request(control, req)?;
    if !r.ok {
        bail!("daemon refused: {}", r.error.unwrap_or_default());
    }
    Ok(r)
}

fn print_faults(s: &FaultsStatus) {
    if s.rules.is_empty() {
        println!("no fault rules");
    } else {
        println!(
            "{:>4} {:>10} {:>10} {:>8} {:>5} {:>20}  rule",
            "id", "matched", "acted", "overflow", "held", "seed"
        );
        for r in &s.rules {
            println!(
                "{:>4} {:>10} {:>10} {:>8} {:>5} {:>20}  {}",
                r.id, r.matched, r.acted, r.overflow, r.held, r.seed, r.description
            );
        }
    }
    let links: Vec<String> = s
        .links
        .iter()
        .map(|l| {
            format!(
                "{} {}{}",
                l.port,
                if l.up { "up" } else { "DOWN" },
                if l.drops > 0 {
                    format!(" ({} dropped)", l.drops)
                } else {
                    String::new()
                }
            )
        })
        .collect();
    println!("links: {}", links.join(", "));
    if s.delayed > 0 {
        println!("frames waiting in the delay queue: {}", s.delayed);
    }
}

/// Runs `ctl faults ...`.
pub fn faults(control: &Path, json: bool, cmd: FaultsCmd) -> anyhow::Result<()> {
    let req = match cmd {
        FaultsCmd::Add(a) => {
            let a = *a;
            Request::FaultAdd {
                rule: Box::new(FaultSpec {
                    id: a.id,
                    port: a.port,
                    dir: a.dir,
                    fields: a.fields,
                    opcode: a.opcode,
                    qpn: a.qpn,
                    psn: a.psn,
                    action: a.action,
                    prob: a.prob,
                    every: a.every,
                    seed: a.seed,
                    copies: a.copies,
                    window: a.window,
                    hold_ms: a.hold_ms,
                    delay_ms: a.delay_ms,
                    jitter_ms: a.jitter_ms,
                    offset: a.offset,
                    icrc: a.icrc,
                    xor: a.xor,
                    fps: a.fps,
                    bps: a.bps,
                    burst: a.burst,
                }),
            }
        }
        FaultsCmd::List => Request::FaultList,
        FaultsCmd::Del { id } => Request::FaultDel { id },
    };
    let r = call(control, &req)?;
    let fault_id = r.fault_id();
    let s = r.into_faults().context("reply without faults")?;
    if json {
        let v = serde_json::json!({ "fault_id": fault_id, "faults": s });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    if let Some(id) = fault_id {
        println!("added fault rule {id}");
    }
    print_faults(&s);
    Ok(())
}

/// Runs `ctl link down|up --port P`.
pub fn link(control: &Path, json: bool, port: String, state: LinkState) -> anyhow::Result<()> {
    let up = matches!(state, LinkState::Up);
    let r = call(control, &Request::Link { port, up })?;
    let s = r.into_faults().context("reply without faults")?;
    if json {
        println!("{}", serde_json::to_string_pretty(&s.links)?);
        return Ok(());
    }
    print_faults(&s);
    Ok(())
}

fn print_capture(s: &CaptureStatus) {
    match &s.file {
        None => println!("no capture has run"),
        Some(f) => {
            println!(
                "capture {}: {} (ports {}, snaplen {})",
                if s.running { "running" } else { "stopped" },
                f,
                s.ports.join(","),
                s.snaplen
            );
            println!(
                "records {}, bytes {}, dropped {}",
                s.records, s.bytes, s.dropped
            );
            if let Some(e) = &s.error {
                println!("write error: {e}");
            }
        }
    }
}

/// Runs `ctl capture ...`.
pub fn capture(control: &Path, json: bool, cmd: CaptureCmd) -> anyhow::Result<()> {
    let req = match cmd {
        CaptureCmd::Start {
            file,
            port,
            snaplen,
        } => {
            // The daemon opens the file: make a relative path absolute.
            let file = if file.is_relative() {
                std::env::current_dir()?.join(file)
            } else {
                file
            };
            Request::CaptureStart {
                file,
                port,
                snaplen,
            }
        }
        CaptureCmd::Stop => Request::CaptureStop,
        CaptureCmd::Status => Request::CaptureStatus,
    };
    let r = call(control, &req)?;
    let s = r.into_capture().context("reply without capture")?;
    if json {
        println!("{}", serde_json::to_string_pretty(&s)?);
        return Ok(());
    }
    print_capture(&s);
    Ok(())
}

//! `vhost-rdma ctl device-fault|trace ...` (the driver bench, docs/driver-bench.md).

use anyhow::{bail, Context};
use std::io::Write;
use std::path::{Path, PathBuf};
use vhost_rdma::control::{follow_trace, request, Reply, Request};
use vhost_rdma::ports::device::bench::{
    parse_params, DeviceFaultRule, DeviceFaultSpec, DevicePortFaults,
};
use vhost_rdma::ports::device::trace::TraceStatus;

/// `ctl device-fault` subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum DeviceFaultCmd {
    /// Add a rule to a gve or erdma port: KIND with its KEY=VALUE
    /// parameters (`device-fault kinds --port P` lists them); fires once
    /// unless --count.
    Add(DeviceFaultAddArgs),
    /// Every device port's rules with matched/hits counters.
    List,
    /// Remove rule ID (no ID: every rule) of --port (no --port: of every
    /// device port; with ID, the port holding it). Lasting faults end.
    Clear {
        /// The rule's id (`device-fault list`).
        id: Option<u32>,
        /// Only this port.
        #[arg(long)]
        port: Option<String>,
    },
    /// The fault kinds a device port offers, with their parameters.
    Kinds {
        /// The device port.
        #[arg(long)]
        port: String,
    },
}

/// Options of `ctl device-fault add`.
#[derive(clap::Args, Debug)]
pub struct DeviceFaultAddArgs {
    /// The device port (kind=gve or kind=erdma).
    #[arg(long)]
    pub port: String,
    /// The fault kind (e.g. reset-request, tx-stall, cmdq-timeout).
    #[arg(long)]
    pub kind: String,
    /// The kind's parameters, KEY=VALUE each (e.g. queue=0 opcode=CREATE_QP).
    #[arg(value_name = "KEY=VALUE")]
    pub params: Vec<String>,
    /// Fire at most N times (default 1).
    #[arg(long)]
    pub count: Option<u64>,
    /// Fire with probability P when the condition is met (default 1).
    #[arg(long)]
    pub prob: Option<f64>,
    /// PRNG seed (default: the rule id).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Rule id (default: one more than the port's highest).
    #[arg(long)]
    pub id: Option<u32>,
}

/// `ctl trace`: a subcommand, or `--follow --port P`.
#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct TraceArgs {
    #[command(subcommand)]
    pub op: Option<TraceCmd>,
    /// Print the port's trace lines live (the ring's first) until ^C;
    /// turns the device's tracing on while it runs.
    #[arg(long, requires = "port")]
    pub follow: bool,
    /// The device port to follow.
    #[arg(long)]
    pub port: Option<String>,
}

/// `ctl trace` subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum TraceCmd {
    /// Start tracing a device port: into the in-memory ring (`trace show`,
    /// `trace --follow`) and, with --file, a new file in --capture-dir.
    Start {
        /// The device port.
        #[arg(long)]
        port: String,
        /// A new file name, created in the daemon's --capture-dir (never
        /// over an existing file), at most [limits] trace-max-bytes.
        #[arg(long)]
        file: Option<PathBuf>,
    },
    /// Stop the port's trace (the file is flushed and closed).
    Stop {
        /// The device port.
        #[arg(long)]
        port: String,
    },
    /// The lines the port's ring holds (the last 4096) and the counters.
    Show {
        /// The device port.
        #[arg(long)]
        port: String,
    },
}

fn call(control: &Path, req: &Request) -> anyhow::Result<Reply> {
    let r = request(control, req)?;
    if !r.ok {
        bail!("daemon refused: {}", r.error.unwrap_or_default());
    }
    Ok(r)
}

/// Prints one device port's rules (also `ctl status`).
pub fn print_rules(rules: &[DeviceFaultRule], indent: &str) {
    if rules.is_empty() {
        println!("{indent}no device fault rules");
        return;
    }
    println!(
        "{indent}{:>4} {:>10} {:>10} {:>6} {:>5} {:>20}  rule",
        "id", "matched", "hits", "count", "prob", "seed"
    );
    for r in rules {
        println!(
            "{indent}{:>4} {:>10} {:>10} {:>6} {:>5} {:>20}  {}{}{}",
            r.id,
            r.matched,
            r.hits,
            r.count,
            r.prob,
            r.seed,
            r.kind,
            if r.params.is_empty() {
                String::new()
            } else {
                format!(" {}", r.params)
            },
            if r.spent { " (spent)" } else { "" }
        );
    }
}

fn print_ports(ports: &[DevicePortFaults]) {
    if ports.is_empty() {
        println!("no device ports (kind=gve or kind=erdma)");
    }
    for p in ports {
        println!("port {} ({}):", p.port, p.kind);
        print_rules(&p.rules, "  ");
    }
}

/// Runs `ctl device-fault ...`.
pub fn device_fault(control: &Path, json: bool, cmd: DeviceFaultCmd) -> anyhow::Result<()> {
    let req = match cmd {
        DeviceFaultCmd::Add(a) => Request::DeviceFaultAdd {
            rule: Box::new(DeviceFaultSpec {
                port: a.port,
                kind: a.kind,
                params: parse_params(&a.params)?,
                count: a.count,
                prob: a.prob,
                seed: a.seed,
                id: a.id,
            }),
        },
        DeviceFaultCmd::List => Request::DeviceFaultList,
        DeviceFaultCmd::Clear { id, port } => Request::DeviceFaultClear { port, id },
        DeviceFaultCmd::Kinds { port } => Request::DeviceFaultKinds { port },
    };
    let r = call(control, &req)?;
    if let Some(vhost_rdma::control::ReplyBody::DeviceFaultKinds { fault_kinds }) = &r.body {
        if json {
            println!("{}", serde_json::to_string_pretty(fault_kinds)?);
            return Ok(());
        }
        if fault_kinds.is_empty() {
            println!("this device has no fault kinds");
        }
        for k in fault_kinds {
            println!("{:<16} {}", k.name, k.doc);
            for p in &k.params {
                println!("{:<16}   {p}", "");
            }
        }
        return Ok(());
    }
    let id = r.device_fault_id();
    let ports = r
        .into_device_faults()
        .context("reply without device_faults")?;
    if json {
        let v = serde_json::json!({ "device_fault_id": id, "device_faults": ports });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    if let Some(id) = id {
        println!("added device fault rule {id}");
    }
    print_ports(&ports);
    Ok(())
}

/// Prints a trace's status (also `ctl status`).
pub fn print_trace(t: &TraceStatus, indent: &str) {
    println!(
        "{indent}trace: {}{}, {} records, ring {} lines, {} followers ({} lines they lost)",
        if t.running { "running" } else { "stopped" },
        t.file
            .as_deref()
            .map(|f| format!(" into {f}"))
            .unwrap_or_default(),
        t.records,
        t.ring,
        t.followers,
        t.follower_dropped
    );
    if t.file.is_some() {
        println!(
            "{indent}  file: {} lines, {} bytes (at most {}), {} dropped (writer behind){}",
            t.written,
            t.bytes,
            t.max_bytes,
            t.dropped,
            if t.file_full {
                format!(
                    "; FULL ([limits] trace-max-bytes): {} lines not written",
                    t.limited
                )
            } else {
                String::new()
            }
        );
    }
    if let Some(e) = &t.error {
        println!("{indent}  write error: {e}");
    }
}

/// Runs `ctl trace ...`.
pub fn trace(control: &Path, json: bool, a: TraceArgs) -> anyhow::Result<()> {
    let req = match a.op {
        Some(TraceCmd::Start { port, file }) => Request::TraceStart { port, file },
        Some(TraceCmd::Stop { port }) => Request::TraceStop { port },
        Some(TraceCmd::Show { port }) => Request::TraceShow { port },
        None => {
            let (true, Some(port)) = (a.follow, a.port) else {
                bail!("ctl trace: give start, stop or show, or --follow --port NAME");
            };
            let mut out = std::io::stdout().lock();
            return follow_trace(control, &port, |l| {
                writeln!(out, "{l}").and_then(|()| out.flush()).is_ok()
            });
        }
    };
    let r = call(control, &req)?;
    let lines = match &r.body {
        Some(vhost_rdma::control::ReplyBody::TraceShown { trace_lines, .. }) => {
            Some(trace_lines.clone())
        }
        _ => None,
    };
    let t = r.into_trace().context("reply without trace")?;
    if json {
        let v = serde_json::json!({ "trace": t, "trace_lines": lines });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    for l in lines.iter().flatten() {
        println!("{l}");
    }
    print_trace(&t, "");
    Ok(())
}

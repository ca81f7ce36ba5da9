//! `vhost-rdma ctl flow-rule ...` and `vhost-rdma ctl rss ...`.

use anyhow::{bail, Context};
use std::path::Path;
use vhost_rdma::control::{request, Reply, Request};
use vhost_rdma::match_spec::MatchSpec;
use vhost_rdma::steering::{report_name, FlowRuleSpec, RssStatus, RuleInfo};

/// `ctl flow-rule` subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum FlowRuleCmd {
    /// Add a rule: frames towards PORT matching every given field go to
    /// --queue N (or are dropped with --drop), before RSS.
    Add(FlowRuleAddArgs),
    /// List a port's rules in evaluation order, with hit counts.
    List {
        /// The port.
        #[arg(long)]
        port: String,
    },
    /// Remove a rule by id.
    Del {
        /// The port.
        #[arg(long)]
        port: String,
        /// The rule's id (`flow-rule list`).
        id: u32,
    },
}

/// Options of `ctl flow-rule add`.
#[derive(clap::Args, Debug)]
pub struct FlowRuleAddArgs {
    /// The port whose incoming frames the rule steers.
    #[arg(long)]
    pub port: String,
    /// Rule id (default: the next free one).
    #[arg(long)]
    pub id: Option<u32>,
    /// Lower numbers are tried first (default 0; ties in insertion order).
    #[arg(long, default_value_t = 0)]
    pub priority: u32,
    /// The L2-L4 fields to match.
    #[command(flatten)]
    pub fields: MatchSpec,
    /// Deliver to this queue pair (0-based).
    #[arg(long, conflicts_with = "drop", required_unless_present = "drop")]
    pub queue: Option<u16>,
    /// Drop matching frames (counted).
    #[arg(long)]
    pub drop: bool,
}

/// Options of `ctl rss`.
#[derive(clap::Args, Debug)]
pub struct RssArgs {
    /// The port.
    #[arg(long)]
    pub port: String,
    /// Also show where the model sends a flow:
    /// SRC:SPORT-DST:DPORT/tcp|udp (repeatable; IPv6 as [ADDR]:PORT).
    #[arg(long, value_name = "FLOW")]
    pub predict: Vec<String>,
    /// Forget the flows seen so far (after printing nothing else changes).
    #[arg(long)]
    pub clear_flows: bool,
}

fn call(control: &Path, req: &Request) -> anyhow::Result<Reply> {
    let r = request(control, req)?;
    if !r.ok {
        bail!("daemon refused: {}", r.error.unwrap_or_default());
    }
    Ok(r)
}

fn print_rules(rules: &[RuleInfo]) {
    if rules.is_empty() {
        println!("no flow rules");
        return;
    }
    println!("{:>5} {:>8} {:>10}  rule", "id", "priority", "hits");
    for r in rules {
        println!(
            "{:>5} {:>8} {:>10}  {}",
            r.id, r.rule.priority, r.hits, r.description
        );
    }
}

/// Runs `ctl flow-rule ...`.
pub fn flow_rule(control: &Path, json: bool, cmd: FlowRuleCmd) -> anyhow::Result<()> {
    let req = match cmd {
        FlowRuleCmd::Add(a) => Request::FlowRuleAdd {
            port: a.port,
            rule: FlowRuleSpec {
                id: a.id,
                priority: a.priority,
                fields: a.fields,
                queue: a.queue,
                drop: a.drop,
            },
        },
        FlowRuleCmd::List { port } => Request::FlowRuleList { port },
        FlowRuleCmd::Del { port, id } => Request::FlowRuleDel { port, id },
    };
    let r = call(control, &req)?;
    let rule_id = r.rule_id();
    let rules = r.into_rules().context("reply without rules")?;
    if json {
        let v = serde_json::json!({ "rule_id": rule_id, "rules": rules });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    if let Some(id) = rule_id {
        println!("added rule {id}");
    }
    print_rules(&rules);
    Ok(())
}

/// Runs `ctl rss ...`.
pub fn rss(control: &Path, json: bool, a: RssArgs) -> anyhow::Result<()> {
    let r = call(
        control,
        &Request::Rss {
            port: a.port,
            predict: a.predict,
            clear_flows: a.clear_flows,
        },
    )?;
    let s = r.into_rss().context("reply without rss")?;
    if json {
        println!("{}", serde_json::to_string_pretty(&s)?);
        return Ok(());
    }
    print_status(&s);
    Ok(())
}

fn print_status(s: &RssStatus) {
    let yn = |b: bool| if b { "yes" } else { "no" };
    println!(
        "port {}: connected {}, RSS negotiated {}, hash report negotiated {}",
        s.port,
        yn(s.connected),
        yn(s.rss_negotiated),
        yn(s.hash_report_negotiated)
    );
    println!(
        "mode: {} (RSS configs received: {}), queue pairs in use {} (max_tx_vq {})",
        s.mode, s.rss_configs, s.active_queue_pairs, s.max_tx_vq
    );
    if s.mode != "off" {
        println!(
            "hash types: {:#x} ({})",
            s.hash_types,
            s.hash_type_names.join(" ")
        );
        println!("key ({} bytes): {}", s.key.len() / 2, s.key);
    }
    if !s.indirection_table.is_empty() {
        println!(
            "indirection table ({} entries), unclassified queue {}:",
            s.indirection_table.len(),
            s.unclassified_queue
        );
        for (i, row) in s.indirection_table.chunks(16).enumerate() {
            let v: Vec<String> = row.iter().map(|q| format!("{q:>2}")).collect();
            println!("  {:>4}: {}", i * 16, v.join(" "));
        }
    }
    println!(
        "{:>5} {:>12} {:>9} {:>10} {:>10} {:>12} {:>10} {:>13}",
        "queue",
        "rx_frames",
        "rx_drops",
        "rss",
        "rule",
        "unclassified",
        "flow_hash",
        "hash_reported"
    );
    for q in &s.queues {
        println!(
            "{:>5} {:>12} {:>9} {:>10} {:>10} {:>12} {:>10} {:>13}",
            q.queue,
            q.rx_frames,
            q.rx_drops,
            q.rss,
            q.rule,
            q.unclassified,
            q.flow_hash,
            q.hash_reported
        );
    }
    println!(
        "flow rules: {}, frames dropped by rules: {}",
        s.rules, s.rule_drops
    );
    if !s.flows.is_empty() {
        println!("flows seen (last decision):");
        for f in &s.flows {
            println!(
                "  {:<44} queue {:<4} {:<18} hash {:#010x} {:<8} frames {} (hash in header {})",
                f.flow,
                f.queue.map_or("drop".to_string(), |q| q.to_string()),
                f.how,
                f.hash_value,
                report_name(f.hash_report),
                f.frames,
                f.hash_reported
            );
        }
        if s.flows_untracked > 0 {
            println!(
                "  ({} frames of further flows not tracked)",
                s.flows_untracked
            );
        }
    }
    for p in &s.predictions {
        println!(
            "predict {} -> queue {} ({}) hash {:#010x} report {}",
            p.flow,
            p.queue.map_or("drop".to_string(), |q| q.to_string()),
            p.how,
            p.hash_value,
            p.hash_report_name
        );
    }
}

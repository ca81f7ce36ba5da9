//! `vhost-rdma ctl flows|findings|checker`.

use anyhow::{bail, Context};
use std::path::Path;
use vhost_rdma::checker::*;
use vhost_rdma::control::request;
use vhost_rdma::control::{Reply, Request};

/// `ctl checker on|off`.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum OnOff {
    /// Check every frame.
    On,
    /// Stop checking frames.
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
    let f = r.into_flows().context("reply without flows")?;
    if json {
        println!("{}", serde_json::to_string_pretty(&f)?);
        return Ok(());
    }
    print_flows(&f);
    Ok(())
}

/// The flow table as text (`ctl flows`, `check-capture`).
pub fn print_flows(f: &wire_checker::FlowsView) {
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
            if d.retransmitted > 0 {
                println!(
                    "  {:<44} bytes seen again {} (unchecked {}, differing sightings {})",
                    "", d.retransmitted, d.retransmit_unchecked, d.retransmit_differs
                );
            }
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
}

/// `ctl findings [--clear]`.
pub fn findings(control: &Path, json: bool, clear: bool) -> anyhow::Result<()> {
    let r = ask(control, &Request::Findings { clear })?;
    let f = r.into_findings().context("reply without findings")?;
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
    let s = r.into_checker().context("reply without checker status")?;
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

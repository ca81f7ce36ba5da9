//! The `status` request: every port's counters and the daemon's parts
//! beside the switch (checker, virtual hosts, device ports, uplinks).

use super::Answer;
use crate::control::{Context, ReplyBody, Status};
use std::sync::atomic::Ordering::Relaxed;

/// Serves `status`.
pub fn handle(ctx: &Context) -> Answer {
    let fabric = &ctx.fabric;
    // The daemon's edge reads the clock; the stuck-guest check takes it.
    let now = std::time::Instant::now();
    let status = Status {
        ports: fabric.ports.iter().map(|p| p.stats_at(now)).collect(),
        mac_table_full: fabric.mac_table_full.load(Relaxed),
        rdma_unresolved: fabric.rdma_unresolved.load(Relaxed),
        control_refused: fabric.control_refused.load(Relaxed),
        control_version_refused: ctx.version_refused.load(Relaxed),
        fault_rules_refused: fabric.faults.refused_at_limit.load(Relaxed),
        flow_rules_refused: fabric.flow_rules_refused.load(Relaxed),
        checker: Some(fabric.checker.status()),
        // A host whose thread does not answer is left out rather than
        // failing the whole status (`hosts` reports it).
        hosts: ctx.hosts.iter().filter_map(|h| h.status().ok()).collect(),
        devices: ctx.devices.iter().map(|d| d.status()).collect(),
        uplinks: ctx.uplinks.iter().map(|u| u.status()).collect(),
    };
    Ok(Some(ReplyBody::Status { status }))
}

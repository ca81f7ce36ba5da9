//! Flow rule and RSS requests.

use crate::control::{Reply, Request};
use crate::fabric::Fabric;
use crate::steering::*;
use std::sync::atomic::Ordering::Relaxed;

/// Serves the steering requests of the control socket.
pub fn handle(fabric: &Fabric, req: &Request) -> Reply {
    use crate::control::Request as R;
    let r = (|| -> Result<Reply, String> {
        let ok = Reply {
            ok: true,
            ..Reply::default()
        };
        Ok(match req {
            R::FlowRuleAdd { port, rule } => {
                let p = fabric.port_by_name(port)?;
                let max = fabric.limits.flow_rules;
                if p.steering.rules().len() >= max {
                    fabric.flow_rules_refused.fetch_add(1, Relaxed);
                    return Err(format!(
                        "too many flow rules on port {port} (at most {max}, [limits] flow-rules); delete some first"
                    ));
                }
                let id = p.steering.add_rule(rule.clone())?;
                tracing::info!(port = %port, id, rule = %rule.describe(), "flow rule added");
                Reply {
                    rule_id: Some(id),
                    rules: Some(p.steering.rules()),
                    ..ok
                }
            }
            R::FlowRuleDel { port, id } => {
                let p = fabric.port_by_name(port)?;
                p.steering.del_rule(*id)?;
                tracing::info!(port = %port, id, "flow rule removed");
                Reply {
                    rules: Some(p.steering.rules()),
                    ..ok
                }
            }
            R::FlowRuleList { port } => Reply {
                rules: Some(fabric.port_by_name(port)?.steering.rules()),
                ..ok
            },
            R::Rss {
                port,
                predict: flows,
                clear_flows,
            } => {
                let p = fabric.port_by_name(port)?;
                if *clear_flows {
                    p.steering.clear_flows();
                }
                let view = PortView {
                    name: &p.cfg.name,
                    connected: p.connected.load(Relaxed),
                    features: p.features.load(Relaxed),
                    active_queue_pairs: p.active_qps.load(Relaxed),
                    rx: p
                        .rxq
                        .iter()
                        .map(|q| {
                            let c = q.counters.snapshot();
                            (c.rx_frames, c.rx_drops)
                        })
                        .collect(),
                };
                let mut s = status(&p.steering, view);
                s.predictions = flows
                    .iter()
                    .map(|f| predict(f, |frame| p.steer(frame)))
                    .collect::<Result<_, _>>()?;
                Reply { rss: Some(s), ..ok }
            }
            _ => return Err("not a steering request".into()),
        })
    })();
    r.unwrap_or_else(err)
}

fn err(e: String) -> Reply {
    Reply {
        ok: false,
        error: Some(e),
        ..Reply::default()
    }
}

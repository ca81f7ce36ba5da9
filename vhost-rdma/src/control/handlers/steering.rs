//! Flow rule and RSS requests.

use super::{Answer, HandlerError};
use crate::control::{ReplyBody, Request};
use crate::fabric::Fabric;
use crate::steering::*;
use std::sync::atomic::Ordering::Relaxed;

/// Serves the steering requests of the control socket.
pub fn handle(fabric: &Fabric, req: &Request) -> Answer {
    let port_by_name = |name: &str| fabric.port_by_name(name);
    let body = match req {
        Request::FlowRuleAdd { port, rule } => {
            let p = port_by_name(port)?;
            let max = fabric.limits.flow_rules;
            if p.steering().rules().len() >= max {
                fabric.flow_rules_refused.fetch_add(1, Relaxed);
                return Err(HandlerError::FlowRuleLimit {
                    port: port.clone(),
                    max,
                });
            }
            let rule_id = p.steering().add_rule(rule.clone())?;
            tracing::info!(port = %port, id = rule_id, rule = %rule.describe(), "flow rule added");
            ReplyBody::RuleAdded {
                rules: p.steering().rules(),
                rule_id,
            }
        }
        Request::FlowRuleDel { port, id } => {
            let p = port_by_name(port)?;
            p.steering().del_rule(*id)?;
            tracing::info!(port = %port, id, "flow rule removed");
            ReplyBody::Rules {
                rules: p.steering().rules(),
            }
        }
        Request::FlowRuleList { port } => ReplyBody::Rules {
            rules: port_by_name(port)?.steering().rules(),
        },
        Request::Rss {
            port,
            predict: flows,
            clear_flows,
        } => {
            let p = port_by_name(port)?;
            if *clear_flows {
                p.steering().clear_flows();
            }
            let view = PortView {
                name: &p.cfg().name,
                connected: p.is_connected(),
                features: p.features(),
                active_queue_pairs: p.active_qps(),
                rx: p
                    .rx_queues()
                    .iter()
                    .map(|q| {
                        let c = q.counters.snapshot();
                        (c.rx_frames, c.rx_drops)
                    })
                    .collect(),
            };
            let mut s = status(p.steering(), view);
            s.predictions = flows
                .iter()
                .map(|f| predict(f, |frame| p.steer(frame)))
                .collect::<Result<_, _>>()?;
            ReplyBody::Rss { rss: s }
        }
        _ => return Err(HandlerError::Misrouted("steering")),
    };
    Ok(Some(body))
}

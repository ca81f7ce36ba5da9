//! Fault and link requests.

use super::{Answer, HandlerError};
use crate::control::{ReplyBody, Request};
use crate::fabric::Fabric;

/// Serves the fault and link requests of the control socket.
pub fn handle(fabric: &Fabric, req: &Request) -> Answer {
    let f = &fabric.faults;
    let body = match req {
        Request::FaultAdd { rule } => {
            let fault_id = f.add((**rule).clone())?;
            tracing::info!(id = fault_id, rule = %rule.describe(), "fault rule added");
            ReplyBody::FaultAdded {
                faults: f.status(),
                fault_id,
            }
        }
        Request::FaultDel { id } => {
            f.del(*id)?;
            tracing::info!(id, "fault rule removed");
            ReplyBody::Faults { faults: f.status() }
        }
        Request::FaultList => ReplyBody::Faults { faults: f.status() },
        Request::Link { port, up } => {
            f.set_link(port, *up)?;
            tracing::info!(port = %port, up, "link set");
            ReplyBody::Faults { faults: f.status() }
        }
        _ => return Err(HandlerError::Misrouted("fault or link")),
    };
    Ok(Some(body))
}

//! Protocol checker requests.

use super::{Answer, HandlerError};
use crate::control::{ReplyBody, Request};
use crate::fabric::Fabric;

/// Serves the checker requests of the control socket.
pub fn handle(fabric: &Fabric, req: &Request) -> Answer {
    let ch = &fabric.checker;
    let body = match req {
        Request::Flows => ReplyBody::Flows {
            flows: ch.flows(),
            checker: ch.status(),
        },
        Request::Findings { clear } => ReplyBody::Findings {
            findings: ch.findings(*clear),
            checker: ch.status(),
        },
        Request::Checker { enabled } => {
            if let Some(on) = enabled {
                ch.set_enabled(*on);
            }
            ReplyBody::Checker {
                checker: ch.status(),
            }
        }
        _ => return Err(HandlerError::Misrouted("checker")),
    };
    Ok(Some(body))
}

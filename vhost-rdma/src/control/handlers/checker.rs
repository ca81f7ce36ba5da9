//! Protocol checker requests.

use crate::control::{Reply, Request};
use crate::fabric::Fabric;

/// Control requests of the checker.
pub fn handle(fabric: &Fabric, req: &Request) -> Reply {
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

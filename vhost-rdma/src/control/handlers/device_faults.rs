//! Device fault requests (the driver bench) and the link of device ports.

use super::{Answer, HandlerError};
use crate::control::{Context, ReplyBody, Request};
use crate::ports::device::bench::{kind_name, BenchError};
use crate::ports::device::DeviceEntry;

/// The device port `port`: unknown ports and ports of another kind get a
/// clear refusal (`what` is what the request needs: "device faults").
pub fn device<'a>(
    ctx: &'a Context,
    port: &str,
    what: &'static str,
) -> Result<&'a DeviceEntry, HandlerError> {
    if let Some(d) = ctx.devices.iter().find(|d| d.port == port) {
        return Ok(d);
    }
    let p = ctx.fabric.port_by_name(port)?;
    let kind = if ctx.hosts.iter().any(|h| h.name == port) {
        "virtual host"
    } else {
        kind_name(p.cfg().kind())
    };
    Err(BenchError::NotADevice {
        port: port.to_string(),
        kind,
        what,
    }
    .into())
}

fn all(ctx: &Context) -> Vec<crate::ports::device::bench::DevicePortFaults> {
    ctx.devices.iter().map(|d| d.faults()).collect()
}

/// Serves `device-fault-add`, `-list`, `-clear` and `-kinds`.
pub fn handle(ctx: &Context, req: &Request) -> Answer {
    let body = match req {
        Request::DeviceFaultAdd { rule } => {
            let d = device(ctx, &rule.port, "device faults")?;
            let id = d.add_fault(rule)?;
            tracing::info!(port = %rule.port, id, rule = %rule.describe(), "device fault rule added");
            ReplyBody::DeviceFaultAdded {
                device_faults: all(ctx),
                device_fault_id: id,
            }
        }
        Request::DeviceFaultList => ReplyBody::DeviceFaults {
            device_faults: all(ctx),
        },
        Request::DeviceFaultClear { port, id } => {
            match (port, id) {
                (Some(p), id) => device(ctx, p, "device faults")?.clear_faults(*id)?,
                (None, None) => {
                    for d in ctx.devices.iter() {
                        d.clear_faults(None)?;
                    }
                }
                (None, Some(id)) => {
                    let holders: Vec<&DeviceEntry> =
                        ctx.devices.iter().filter(|d| d.has_fault(*id)).collect();
                    match holders[..] {
                        [] => return Err(BenchError::NoSuchRule(*id).into()),
                        [d] => d.clear_faults(Some(*id))?,
                        _ => {
                            let ports: Vec<&str> =
                                holders.iter().map(|d| d.port.as_str()).collect();
                            return Err(BenchError::AmbiguousId {
                                id: *id,
                                ports: ports.join(", "),
                            }
                            .into());
                        }
                    }
                }
            }
            tracing::info!(port = ?port, id = ?id, "device fault rules cleared");
            ReplyBody::DeviceFaults {
                device_faults: all(ctx),
            }
        }
        Request::DeviceFaultKinds { port } => ReplyBody::DeviceFaultKinds {
            fault_kinds: device(ctx, port, "device faults")?.fault_kinds(),
        },
        _ => return Err(HandlerError::Misrouted("device fault")),
    };
    Ok(Some(body))
}

/// Serves `link`: the fabric's link (frames to and from the port dropped
/// while down), and on a device port also the device's own link status
/// (the driver sees link down/up).
pub fn link(ctx: &Context, req: &Request) -> Answer {
    let answer = super::faults::handle(&ctx.fabric, req)?;
    if let Request::Link { port, up } = req {
        if let Some(d) = ctx.devices.iter().find(|d| &d.port == port) {
            let shown = d.set_link(*up)?;
            tracing::info!(port = %port, up, device_link = shown, "device link set");
        }
    }
    Ok(answer)
}

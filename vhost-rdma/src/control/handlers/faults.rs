//! Fault, link and capture requests.

use crate::control::{Reply, Request};
use crate::fabric::Fabric;

/// Serves the fault, link and capture requests of the control socket.
pub fn handle(fabric: &Fabric, req: &Request) -> Reply {
    use crate::control::Request as R;
    let r = (|| -> Result<Reply, String> {
        let ok = Reply {
            ok: true,
            ..Reply::default()
        };
        let f = &fabric.faults;
        Ok(match req {
            R::FaultAdd { rule } => {
                let id = f.add((**rule).clone())?;
                tracing::info!(id, rule = %rule.describe(), "fault rule added");
                Reply {
                    fault_id: Some(id),
                    faults: Some(f.status()),
                    ..ok
                }
            }
            R::FaultDel { id } => {
                f.del(*id)?;
                tracing::info!(id, "fault rule removed");
                Reply {
                    faults: Some(f.status()),
                    ..ok
                }
            }
            R::FaultList => Reply {
                faults: Some(f.status()),
                ..ok
            },
            R::Link { port, up } => {
                f.set_link(port, *up)?;
                tracing::info!(port = %port, up, "link set");
                Reply {
                    faults: Some(f.status()),
                    ..ok
                }
            }
            R::CaptureStart {
                file,
                port,
                snaplen,
            } => {
                let only = port
                    .as_deref()
                    .map(|p| fabric.port_by_name(p).map(|p| p.index))
                    .transpose()?;
                let names: Vec<String> = fabric.ports.iter().map(|p| p.cfg.name.clone()).collect();
                let st = fabric
                    .capture
                    .start(file, &names, only, *snaplen)
                    .map_err(|e| e.to_string())?;
                tracing::info!(file = %file.display(), ports = ?st.ports, "capture started");
                Reply {
                    capture: Some(st),
                    ..ok
                }
            }
            R::CaptureStop => {
                let st = fabric.capture.stop().map_err(|e| e.to_string())?;
                tracing::info!(
                    records = st.records,
                    dropped = st.dropped,
                    "capture stopped"
                );
                Reply {
                    capture: Some(st),
                    ..ok
                }
            }
            R::CaptureStatus => Reply {
                capture: Some(fabric.capture.status()),
                ..ok
            },
            _ => return Err("not a fault or capture request".into()),
        })
    })();
    r.unwrap_or_else(|e| Reply {
        ok: false,
        error: Some(e),
        ..Reply::default()
    })
}

//! Capture requests: start, stop and status of the fabric's pcapng capture.

use super::{Answer, HandlerError};
use crate::control::{ReplyBody, Request};
use crate::fabric::Fabric;

/// Serves the capture requests of the control socket.
pub fn handle(fabric: &Fabric, req: &Request) -> Answer {
    let capture = match req {
        Request::CaptureStart {
            file,
            port,
            snaplen,
        } => {
            let only = port
                .as_deref()
                .map(|p| fabric.port_by_name(p).map(|p| p.index()))
                .transpose()?;
            let names: Vec<String> = fabric.ports.iter().map(|p| p.cfg().name.clone()).collect();
            let st = fabric.capture.start(file, &names, only, *snaplen)?;
            tracing::info!(file = %file.display(), ports = ?st.ports, "capture started");
            st
        }
        Request::CaptureStop => {
            let st = fabric.capture.stop()?;
            tracing::info!(
                records = st.records,
                dropped = st.dropped,
                "capture stopped"
            );
            st
        }
        Request::CaptureStatus => fabric.capture.status(),
        _ => return Err(HandlerError::Misrouted("capture")),
    };
    Ok(Some(ReplyBody::Capture { capture }))
}

//! Virtual host requests: list the hosts, start and stop their services.

use super::{Answer, HandlerError};
use crate::control::{Hosts, ReplyBody, Request};
use crate::ports::host::HostHandle;

/// Serves the virtual host requests of the control socket.
pub fn handle(hosts: &Hosts, req: &Request) -> Answer {
    let find = |name: &str| -> Result<&HostHandle, HandlerError> {
        hosts
            .iter()
            .find(|h| h.name == name)
            .map(|h| &**h)
            .ok_or_else(|| HandlerError::NoSuchHost(name.to_string()))
    };
    match req {
        Request::Hosts => {
            let hosts = hosts.iter().map(|h| h.status()).collect::<Result<_, _>>()?;
            Ok(Some(ReplyBody::Hosts { hosts }))
        }
        Request::HostStart { host, service } => {
            let h = find(host)?;
            let service_id = h.start_service(service.spec()?)?;
            Ok(Some(ReplyBody::ServiceStarted { service_id }))
        }
        Request::HostStop { host, id } => {
            find(host)?.stop_service(*id)?;
            Ok(None)
        }
        _ => Err(HandlerError::Misrouted("host")),
    }
}

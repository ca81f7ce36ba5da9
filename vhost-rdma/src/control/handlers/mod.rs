//! One handler per feature: each turns its requests into calls on the
//! fabric's engines (or the daemon's parts beside the switch) and their
//! results into a reply body. The engines know nothing of the control
//! protocol; `control::serve` only parses, dispatches and writes replies.

pub mod capture;
pub mod checker;
pub mod device_faults;
pub mod faults;
pub mod hosts;
pub mod status;
pub mod steering;
pub mod trace;

use crate::control::ReplyBody;

/// What a handler answers: the reply's body (none: a bare `{"ok":true}`),
/// or why the request was refused.
pub type Answer = Result<Option<ReplyBody>, HandlerError>;

/// Why a handler refused a request. The text is the reply's `error`, word
/// for word what `ctl`, the tests and scripts have always seen.
#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    /// The request reached the handler of another feature (a dispatch bug).
    #[error("not a {0} request")]
    Misrouted(&'static str),
    /// No port has that name.
    #[error(transparent)]
    NoSuchPort(#[from] crate::fabric::NoSuchPort),
    /// The fault engine refused a rule, a removal or a link change.
    #[error(transparent)]
    Fault(#[from] crate::faults::FaultError),
    /// The steering engine refused a flow rule, a removal or a flow.
    #[error(transparent)]
    Steering(#[from] crate::steering::SteeringError),
    /// The port has `[limits] flow-rules` rules already.
    #[error(
        "too many flow rules on port {port} (at most {max}, [limits] flow-rules); delete some first"
    )]
    FlowRuleLimit {
        /// The port.
        port: String,
        /// The limit.
        max: usize,
    },
    /// No virtual host has that name.
    #[error("no virtual host named {0:?}")]
    NoSuchHost(String),
    /// The capture did not start or stop.
    #[error(transparent)]
    Capture(#[from] crate::capture::CaptureError),
    /// A virtual host's thread failed or refused the command.
    #[error(transparent)]
    Host(#[from] crate::ports::host::HostCommandError),
    /// The service parameters were refused.
    #[error(transparent)]
    Service(#[from] virtual_host::HostError),
    /// A device fault, device link or trace request was refused.
    #[error(transparent)]
    Bench(#[from] crate::ports::device::bench::BenchError),
    /// `trace-follow` after another request on the same connection.
    #[error("trace-follow streams: send it as a connection's first request")]
    FollowNotFirst,
}

//! Sans-IO iWARP (MPA / DDP / RDMAP) engine, modelled on Linux `siw`.
//!
//! * [`mpa`]: MPA Request/Reply frames (RFC 5044, RFC 6581 IRD/ORD), the
//!   negotiation rules, FPDU framing with CRC32c and an incremental deframer.
//! * [`ddp`]: DDP/RDMAP headers, opcodes, Read Request and Terminate.
//! * [`mem`]: STag-registered memory regions with access checks.
//! * [`conn`]: the connection engine (MPA setup + queue pair) in the
//!   quinn-proto style: bytes in, bytes out, events out.
//! * `tcp` (feature `tokio`): drives a [`Connection`] over a real
//!   `tokio::net::TcpStream`.

pub mod conn;
pub mod ddp;
pub mod mem;
pub mod mpa;
#[cfg(feature = "tokio")]
pub mod tcp;

pub use conn::{
    Completion, Config, ConnError, Connection, Event, PeerOps, PostError, Role, Sge, WcOpcode,
    WcStatus, WorkRequest,
};
pub use ddp::{Layer, TermError, Terminate};
pub use mem::{Access, AccessError};
pub use mpa::{MpaConfig, Negotiated, Rtr};

//! iWARP endpoints: the `siw` crate's sans-IO engine (MPA setup, DDP/RDMAP,
//! STag-registered memory) carried over one of the host's smoltcp TCP
//! sockets.
//!
//! rdma_cm over iWARP has no CM MADs: the active side connects TCP straight
//! to the rdma_cm port and the MPA Request/Reply private data is the
//! application's private data (the kernel's iWARP CM adds no CMA header).
//! Linux siw offers MPA revision 2 with the IRD/ORD block, CRC only when
//! `mpa_crc_required` is set, no markers and no peer-to-peer RTR by default;
//! [`engine_config`] mirrors that, with CRC requested when asked for.

use siw::{ConnError, Connection, Layer, MpaConfig};
use smoltcp::iface::{SocketHandle, SocketSet};
use smoltcp::socket::tcp::{Socket, State};
use std::time::{Duration, Instant};

/// Bytes read from the socket per call into the engine.
const RX_CHUNK: usize = 2048;
/// Rounds of socket reads per [`IwarpEndpoint::pump`].
const RX_ROUNDS: usize = 16;
/// Bytes the engine produces per call; nothing more is taken from it until
/// the socket has accepted them, so this bounds our transmit buffer.
const TX_BATCH: usize = 16 * 1024;
/// Largest FPDU we send: one TCP segment of a 1500-byte MTU (as siw).
const MAX_FPDU: usize = 1460;

/// Engine configuration for a host endpoint: Linux siw's defaults (MPA
/// revision 2 with IRD/ORD, no markers, no RTR), CRC requested if `crc`.
/// A peer that asks for CRC gets it either way (RFC 5044: on if either side
/// sets C).
pub fn engine_config(crc: bool, ird: u16, ord: u16) -> siw::Config {
    siw::Config {
        mpa: MpaConfig {
            crc_required: crc,
            crc_strict: false,
            revision: 2,
            ird,
            ord,
            peer_to_peer: false,
            gso_exp: false,
        },
        max_fpdu_len: MAX_FPDU,
        max_rx_ulpdu: u16::MAX as usize,
        sq_depth: 64,
        rq_depth: 64,
        tx_batch: TX_BATCH,
        setup_timeout: Some(Duration::from_secs(10)),
    }
}

/// iWARP error counters (summed over a service's connections). With the
/// `serde` feature they serialize with kebab-case names.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "kebab-case")
)]
pub struct IwarpCounters {
    /// Connections that reached RTS.
    pub connected: u64,
    /// Of those, connections with MPA CRC negotiated.
    pub connected_crc: u64,
    /// Malformed, unexpected or refused MPA Requests/Replies (markers, CRC
    /// policy, IRD, rejects).
    pub mpa_errors: u64,
    /// FPDUs with a bad CRC (we sent a Terminate).
    pub crc_errors: u64,
    /// Other protocol errors we answered with a Terminate.
    pub terminates_sent: u64,
    /// Terminates the peer sent.
    pub terminates_received: u64,
    /// MPA exchanges that timed out.
    pub setup_timeouts: u64,
    /// Streams that ended or were reset with work outstanding.
    pub streams_lost: u64,
}

impl IwarpCounters {
    /// Counts one connection error.
    pub fn count(&mut self, e: &ConnError) {
        match e {
            ConnError::Mpa(_) | ConnError::Negotiation(_) => self.mpa_errors += 1,
            ConnError::Timeout => self.setup_timeouts += 1,
            ConnError::LocalTerminate(t) => {
                if t.layer == Layer::Llp && t.ecode == siw::ddp::llp_ecode::RECEIVED_CRC {
                    self.crc_errors += 1;
                } else {
                    self.terminates_sent += 1;
                }
            }
            ConnError::RemoteTerminate(_) => self.terminates_received += 1,
            ConnError::StreamLost(_) => self.streams_lost += 1,
            ConnError::LocalProtection => self.terminates_sent += 1,
        }
    }

    /// Adds another set.
    pub fn add(&mut self, o: &IwarpCounters) {
        self.connected += o.connected;
        self.connected_crc += o.connected_crc;
        self.mpa_errors += o.mpa_errors;
        self.crc_errors += o.crc_errors;
        self.terminates_sent += o.terminates_sent;
        self.terminates_received += o.terminates_received;
        self.setup_timeouts += o.setup_timeouts;
        self.streams_lost += o.streams_lost;
    }
}

/// One iWARP connection on a TCP socket.
pub struct IwarpEndpoint {
    sock: SocketHandle,
    conn: Connection,
    tx: Vec<u8>,
    tx_off: usize,
    eof: bool,
    closed: bool,
}

impl IwarpEndpoint {
    /// Active side on an established socket: queues the MPA Request with
    /// `private_data`.
    pub fn initiator(
        sock: SocketHandle,
        cfg: siw::Config,
        private_data: &[u8],
        now: Instant,
    ) -> Result<Self, siw::mpa::MpaError> {
        Ok(Self::with(
            sock,
            Connection::initiator(cfg, private_data, now)?,
        ))
    }

    /// Passive side on an accepted socket.
    pub fn responder(sock: SocketHandle, cfg: siw::Config, now: Instant) -> Self {
        Self::with(sock, Connection::responder(cfg, now))
    }

    fn with(sock: SocketHandle, conn: Connection) -> Self {
        IwarpEndpoint {
            sock,
            conn,
            tx: Vec::new(),
            tx_off: 0,
            eof: false,
            closed: false,
        }
    }

    /// The socket.
    pub fn socket(&self) -> SocketHandle {
        self.sock
    }

    /// The engine (post work, register memory, poll events).
    pub fn conn(&mut self) -> &mut Connection {
        &mut self.conn
    }

    /// What the peer's RDMA Writes and Read Requests did here.
    pub fn peer_ops(&self) -> siw::PeerOps {
        self.conn.peer_ops()
    }

    /// The engine's setup deadline.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.conn.poll_timeout()
    }

    /// Fires the engine's setup deadline.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.conn.handle_timeout(now);
    }

    /// The engine is done and its last bytes (a Terminate, a reject) are in
    /// the socket: the socket is being closed.
    pub fn is_finished(&self) -> bool {
        self.closed
    }

    /// Moves bytes between the socket and the engine; returns whether
    /// anything moved.
    pub fn pump(&mut self, sockets: &mut SocketSet<'static>) -> bool {
        let sock = sockets.get_mut::<Socket>(self.sock);
        let mut moved = false;
        let mut buf = [0u8; RX_CHUNK];
        for _ in 0..RX_ROUNDS {
            if !sock.can_recv() {
                break;
            }
            match sock.recv_slice(&mut buf) {
                Ok(n) if n > 0 => {
                    self.conn.handle_bytes(&buf[..n]);
                    moved = true;
                }
                _ => break,
            }
        }
        if !self.eof && !sock.can_recv() {
            match sock.state() {
                State::Closed | State::TimeWait if !self.closed => {
                    self.eof = true;
                    self.conn.handle_transport_error("TCP connection reset");
                    moved = true;
                }
                State::CloseWait | State::LastAck | State::Closing => {
                    self.eof = true;
                    self.conn.handle_eof();
                    moved = true;
                }
                _ => {}
            }
        }
        loop {
            if self.tx_off >= self.tx.len() {
                self.tx.clear();
                self.tx_off = 0;
                if self.conn.poll_transmit_into(&mut self.tx) == 0 {
                    break;
                }
                moved = true;
            }
            if !sock.can_send() {
                break;
            }
            match sock.send_slice(&self.tx[self.tx_off..]) {
                Ok(n) if n > 0 => {
                    self.tx_off += n;
                    moved = true;
                }
                _ => break,
            }
        }
        if !self.closed && self.conn.is_finished() && self.tx_off >= self.tx.len() {
            self.closed = true;
            sock.close();
            moved = true;
        }
        moved
    }
}

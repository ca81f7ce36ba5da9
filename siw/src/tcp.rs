//! tokio adapter: drives a [`Connection`] over a `tokio::net::TcpStream`.
//!
//! Reading and writing run concurrently (readiness-based `try_read` /
//! `try_write`), so two endpoints that both push large transfers never
//! deadlock on full socket buffers.

use std::io;
use std::net::SocketAddr;
use std::time::Instant;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpStream, ToSocketAddrs};

use crate::conn::{Config, Connection, Event};

const READ_CHUNK: usize = 256 * 1024;

/// A [`Connection`] bound to a TCP stream.
#[derive(Debug)]
pub struct TcpEndpoint {
    conn: Connection,
    stream: TcpStream,
    rbuf: Vec<u8>,
    wbuf: Vec<u8>,
    wpos: usize,
    eof: bool,
    shut: bool,
}

impl TcpEndpoint {
    /// Connects to `addr` and starts the MPA exchange as initiator. Drive it
    /// with [`next_event`](Self::next_event) until [`Event::Connected`].
    pub async fn connect<A: ToSocketAddrs>(
        addr: A,
        cfg: Config,
        private_data: &[u8],
    ) -> io::Result<Self> {
        let stream = TcpStream::connect(addr).await?;
        let conn = Connection::initiator(cfg, private_data, Instant::now())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        Self::with_connection(stream, conn)
    }

    /// Wraps an accepted stream as MPA responder. The first event will be
    /// [`Event::ConnectRequest`]; answer with
    /// `conn_mut().accept(..)` or `conn_mut().reject(..)`.
    pub fn accept(stream: TcpStream, cfg: Config) -> io::Result<Self> {
        Self::with_connection(stream, Connection::responder(cfg, Instant::now()))
    }

    /// Wraps an existing stream and engine.
    pub fn with_connection(stream: TcpStream, conn: Connection) -> io::Result<Self> {
        // siw_tcp_nagle = false: FPDUs leave at once.
        stream.set_nodelay(true)?;
        Ok(Self {
            conn,
            stream,
            rbuf: vec![0; READ_CHUNK],
            wbuf: Vec::new(),
            wpos: 0,
            eof: false,
            shut: false,
        })
    }

    /// The engine (post work requests, register memory).
    pub fn conn(&self) -> &Connection {
        &self.conn
    }

    /// The engine, mutable.
    pub fn conn_mut(&mut self) -> &mut Connection {
        &mut self.conn
    }

    /// Peer address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.stream.peer_addr()
    }

    /// Drives I/O until the engine has an event. Returns `None` once the
    /// connection is over and every event was delivered (the socket is then
    /// shut down). Pending output is pushed to the socket (without waiting)
    /// before an event is returned, so e.g. an MPA Reply queued by
    /// `accept` leaves even if the caller then stops driving for a while.
    pub async fn next_event(&mut self) -> Option<Event> {
        self.drive(false).await
    }

    /// Drives I/O until everything the engine has to send was written to the
    /// socket. Events that occur meanwhile stay queued for
    /// [`next_event`](Self::next_event).
    pub async fn flush(&mut self) {
        self.drive(true).await;
    }

    fn refill(&mut self) {
        if self.wpos == self.wbuf.len() {
            self.wbuf.clear();
            self.wpos = 0;
            self.conn.poll_transmit_into(&mut self.wbuf);
        }
    }

    fn write_failed(&mut self, e: &io::Error) {
        self.conn.handle_transport_error(&e.to_string());
        self.wbuf.clear();
        self.wpos = 0;
    }

    /// Non-blocking write of as much pending output as the socket takes.
    fn try_flush(&mut self) {
        loop {
            self.refill();
            if self.wpos == self.wbuf.len() {
                return;
            }
            match self.stream.try_write(&self.wbuf[self.wpos..]) {
                Ok(n) => self.wpos += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    self.write_failed(&e);
                    return;
                }
            }
        }
    }

    async fn drive(&mut self, until_flushed: bool) -> Option<Event> {
        loop {
            self.try_flush();
            if !until_flushed {
                if let Some(ev) = self.conn.poll_event() {
                    return Some(ev);
                }
            }
            self.refill();
            let want_write = self.wpos < self.wbuf.len();
            if until_flushed && !want_write {
                return None;
            }
            if !want_write && self.conn.is_finished() {
                if !self.shut {
                    self.shut = true;
                    let _ = self.stream.shutdown().await;
                }
                return self.conn.poll_event();
            }
            let deadline = self.conn.poll_timeout();
            let want_read = !self.eof;
            if !want_read && !want_write && deadline.is_none() {
                // Nothing can make progress: report the stream as lost.
                self.conn.handle_transport_error("stream idle after EOF");
                continue;
            }
            tokio::select! {
                r = self.stream.readable(), if want_read => {
                    if let Err(e) = r {
                        self.conn.handle_transport_error(&e.to_string());
                        self.eof = true;
                        continue;
                    }
                    match self.stream.try_read(&mut self.rbuf) {
                        Ok(0) => {
                            self.eof = true;
                            self.conn.handle_eof();
                        }
                        Ok(n) => self.conn.handle_bytes(&self.rbuf[..n]),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        Err(e) => {
                            self.eof = true;
                            self.conn.handle_transport_error(&e.to_string());
                        }
                    }
                }
                w = self.stream.writable(), if want_write => {
                    match w {
                        Err(e) => self.write_failed(&e),
                        Ok(()) => match self.stream.try_write(&self.wbuf[self.wpos..]) {
                            Ok(n) => self.wpos += n,
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                            Err(e) => self.write_failed(&e),
                        },
                    }
                }
                _ = sleep_until_opt(deadline), if deadline.is_some() => {
                    self.conn.handle_timeout(Instant::now());
                }
            }
        }
    }
}

async fn sleep_until_opt(d: Option<Instant>) {
    if let Some(d) = d {
        tokio::time::sleep_until(tokio::time::Instant::from_std(d)).await;
    }
}

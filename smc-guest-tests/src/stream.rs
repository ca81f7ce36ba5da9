//! The data-verified stream test (`stream server|client`).
//!
//! Wire protocol per connection:
//! 1. client -> server: a 40-byte [`Header`] (magic, connection index, byte
//!    count, seed, direction, close order) so both sides key the same pattern
//!    and a misconfigured pair fails loudly;
//! 2. each sender writes exactly `bytes` pattern bytes while each receiver
//!    reads and verifies exactly `bytes` (both at once for `both`);
//! 3. each receiver answers with an 8-byte big-endian acknowledgement: the
//!    number of bytes it received *and verified* (the first mismatch offset on
//!    corruption), so a sender knows the peer checked its data;
//! 4. for `--proto smc` each side asks SMC sock_diag whether the socket really
//!    ran over SMC or fell back to TCP (and why);
//! 5. close: the first closer shuts its write side down as soon as it has
//!    nothing left to send (possibly before reading the ack: a real half-close),
//!    then both sides read to EOF (no trailing byte allowed) and close.

use crate::codes;
use crate::diag::{self, SmcMode, SmcSockInfo};
use crate::pattern::{Pattern, StreamSum, Way};
use crate::size::format_size;
use crate::sock::{self, Listener, Proto};
use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// Which side this process plays.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Role {
    /// Listen, accept `--conns` connections per round.
    Server,
    /// Connect `--conns` times in parallel.
    Client,
}

/// Data direction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Direction {
    /// Client sends, server receives.
    C2s,
    /// Server sends, client receives.
    S2c,
    /// Both send and receive at the same time.
    Both,
}

/// Which side shuts down its write half first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CloseOrder {
    /// The client half-closes first.
    ClientFirst,
    /// The server half-closes first.
    ServerFirst,
}

/// Which SMC mode a `--proto smc` run must end up in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ExpectMode {
    /// SMC-R or SMC-D (anything but TCP fallback).
    Any,
    /// SMC-R only.
    Smcr,
    /// SMC-D only.
    Smcd,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::Server => "server",
            Role::Client => "client",
        }
    }
}

impl Direction {
    fn name(self) -> &'static str {
        match self {
            Direction::C2s => "c2s",
            Direction::S2c => "s2c",
            Direction::Both => "both",
        }
    }
    fn code(self) -> u8 {
        match self {
            Direction::C2s => 1,
            Direction::S2c => 2,
            Direction::Both => 3,
        }
    }
}

impl CloseOrder {
    fn name(self) -> &'static str {
        match self {
            CloseOrder::ClientFirst => "client-first",
            CloseOrder::ServerFirst => "server-first",
        }
    }
    fn code(self) -> u8 {
        match self {
            CloseOrder::ClientFirst => 1,
            CloseOrder::ServerFirst => 2,
        }
    }
}

/// Everything a stream run needs.
#[derive(Clone, Debug)]
pub struct StreamConfig {
    /// tcp or smc.
    pub proto: Proto,
    /// Server: address to bind; client: address to connect to.
    pub addr: IpAddr,
    /// TCP port.
    pub port: u16,
    /// Bytes per connection and direction.
    pub bytes: u64,
    /// Parallel connections.
    pub conns: u32,
    /// Pattern seed.
    pub seed: u64,
    /// Write chunk size.
    pub msg_size: usize,
    /// Data direction.
    pub direction: Direction,
    /// Close order.
    pub close_order: CloseOrder,
    /// Client: keep retrying connect this long.
    pub connect_timeout: Duration,
    /// Per-operation socket timeout (None: wait forever).
    pub io_timeout: Option<Duration>,
    /// Server: give up waiting for connections after this long.
    pub accept_timeout: Option<Duration>,
    /// smc: a TCP fallback is reported but not an error.
    pub allow_fallback: bool,
    /// smc: required mode.
    pub expect_mode: ExpectMode,
    /// Testing aid: the sender of connection 0 flips one bit at this offset
    /// (after checksumming), as a corrupting fabric would.
    pub corrupt_at: Option<u64>,
}

impl Default for StreamConfig {
    fn default() -> Self {
        StreamConfig {
            proto: Proto::Tcp,
            addr: IpAddr::from([127, 0, 0, 1]),
            port: 7777,
            bytes: 64 << 20,
            conns: 1,
            seed: 1,
            msg_size: 128 << 10,
            direction: Direction::C2s,
            close_order: CloseOrder::ClientFirst,
            connect_timeout: Duration::from_secs(60),
            io_timeout: Some(Duration::from_secs(120)),
            accept_timeout: None,
            allow_fallback: false,
            expect_mode: ExpectMode::Any,
            corrupt_at: None,
        }
    }
}

impl StreamConfig {
    fn sends(&self, role: Role) -> bool {
        matches!(
            (role, self.direction),
            (Role::Client, Direction::C2s | Direction::Both)
                | (Role::Server, Direction::S2c | Direction::Both)
        )
    }
    fn receives(&self, role: Role) -> bool {
        matches!(
            (role, self.direction),
            (Role::Client, Direction::S2c | Direction::Both)
                | (Role::Server, Direction::C2s | Direction::Both)
        )
    }
    fn first_closer(&self, role: Role) -> bool {
        matches!(
            (role, self.close_order),
            (Role::Client, CloseOrder::ClientFirst) | (Role::Server, CloseOrder::ServerFirst)
        )
    }
    fn tx_way(role: Role) -> Way {
        match role {
            Role::Client => Way::ClientToServer,
            Role::Server => Way::ServerToClient,
        }
    }
    fn rx_way(role: Role) -> Way {
        match role {
            Role::Client => Way::ServerToClient,
            Role::Server => Way::ClientToServer,
        }
    }
}

/// Magic at the start of every connection.
pub const HEADER_MAGIC: [u8; 8] = *b"SMCGT\x00\x01\x00";
/// Header length on the wire.
pub const HEADER_LEN: usize = 40;

/// Why the server refused a connection's header.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// Not our magic: the peer is some other program.
    #[error("bad header magic {0:02x?} (not a smc-guest-tests client?)")]
    Magic([u8; 8]),
    /// The client runs another config than the server (or sent a
    /// connection index beyond it); one `what client=.. server=..` each.
    #[error("client and server disagree: {}", .0.join(", "))]
    Disagree(Vec<String>),
}

/// Connection header sent by the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Connection index (0..conns).
    pub conn: u32,
    /// Number of connections of the run.
    pub conns: u32,
    /// Bytes per direction.
    pub bytes: u64,
    /// Seed.
    pub seed: u64,
    /// Direction code.
    pub direction: u8,
    /// Close order code.
    pub close_order: u8,
}

impl Header {
    /// Big-endian wire encoding.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..8].copy_from_slice(&HEADER_MAGIC);
        b[8..12].copy_from_slice(&self.conn.to_be_bytes());
        b[12..16].copy_from_slice(&self.conns.to_be_bytes());
        b[16..24].copy_from_slice(&self.bytes.to_be_bytes());
        b[24..32].copy_from_slice(&self.seed.to_be_bytes());
        b[32] = self.direction;
        b[33] = self.close_order;
        b
    }

    /// Decodes, checking the magic.
    pub fn decode(b: &[u8; HEADER_LEN]) -> Result<Header, HeaderError> {
        if b[0..8] != HEADER_MAGIC {
            return Err(HeaderError::Magic(std::array::from_fn(|i| b[i])));
        }
        Ok(Header {
            conn: u32::from_be_bytes(b[8..12].try_into().unwrap()),
            conns: u32::from_be_bytes(b[12..16].try_into().unwrap()),
            bytes: u64::from_be_bytes(b[16..24].try_into().unwrap()),
            seed: u64::from_be_bytes(b[24..32].try_into().unwrap()),
            direction: b[32],
            close_order: b[33],
        })
    }

    fn for_conn(cfg: &StreamConfig, conn: u32) -> Header {
        Header {
            conn,
            conns: cfg.conns,
            bytes: cfg.bytes,
            seed: cfg.seed,
            direction: cfg.direction.code(),
            close_order: cfg.close_order.code(),
        }
    }

    fn check(&self, cfg: &StreamConfig) -> Result<(), HeaderError> {
        let mut diffs = Vec::new();
        if self.bytes != cfg.bytes {
            diffs.push(format!("bytes client={} server={}", self.bytes, cfg.bytes));
        }
        if self.seed != cfg.seed {
            diffs.push(format!("seed client={} server={}", self.seed, cfg.seed));
        }
        if self.conns != cfg.conns {
            diffs.push(format!("conns client={} server={}", self.conns, cfg.conns));
        }
        if self.direction != cfg.direction.code() {
            diffs.push(format!(
                "direction code client={} server={}",
                self.direction,
                cfg.direction.code()
            ));
        }
        if self.close_order != cfg.close_order.code() {
            diffs.push(format!(
                "close-order code client={} server={}",
                self.close_order,
                cfg.close_order.code()
            ));
        }
        if self.conn >= cfg.conns {
            diffs.push(format!(
                "connection index {} >= conns {}",
                self.conn, cfg.conns
            ));
        }
        if diffs.is_empty() {
            Ok(())
        } else {
            Err(HeaderError::Disagree(diffs))
        }
    }
}

/// Outcome of one connection.
#[derive(Clone, Debug, Default)]
pub struct ConnResult {
    /// Connection index.
    pub conn: u32,
    /// Peer address.
    pub peer: Option<SocketAddr>,
    /// This side sends data.
    pub sender: bool,
    /// This side receives data.
    pub receiver: bool,
    /// Pattern bytes written.
    pub sent: u64,
    /// Pattern bytes read.
    pub received: u64,
    /// Checksum of the bytes sent (as generated).
    pub tx_csum: Option<u64>,
    /// Checksum of the bytes received.
    pub rx_csum: Option<u64>,
    /// Absolute offset of the first wrong byte received.
    pub first_mismatch: Option<u64>,
    /// Peer's acknowledgement (bytes it received and verified).
    pub ack: Option<u64>,
    /// Data phase duration (seconds).
    pub secs: f64,
    /// SMC sock_diag result.
    pub smc: Option<SmcSockInfo>,
    /// Connect attempts (client).
    pub connect_attempts: u32,
    /// Every error seen.
    pub errors: Vec<String>,
    /// Non-fatal notes.
    pub warnings: Vec<String>,
    start: Option<Instant>,
    end: Option<Instant>,
}

impl ConnResult {
    /// Data fully transferred and verified in every direction this side handles.
    pub fn data_verified(&self, bytes: u64) -> bool {
        let rx_ok = !self.receiver || (self.received == bytes && self.first_mismatch.is_none());
        let tx_ok = !self.sender || (self.sent == bytes && self.ack == Some(bytes));
        rx_ok && tx_ok
    }

    /// Verified and no error at all (including SMC mode checks).
    pub fn ok(&self, bytes: u64) -> bool {
        self.errors.is_empty() && self.data_verified(bytes)
    }
}

/// User + system CPU seconds of this process so far.
pub(crate) fn cpu_seconds() -> f64 {
    // SAFETY: zeroed rusage is valid output storage.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn send_data(
    mut s: TcpStream,
    pat: Pattern,
    bytes: u64,
    msg_size: usize,
    corrupt_at: Option<u64>,
) -> (u64, u64, Option<String>) {
    let mut buf = vec![0u8; msg_size.max(1).min(bytes.max(1) as usize)];
    let mut sum = StreamSum::new();
    let mut off = 0u64;
    while off < bytes {
        let n = buf.len().min((bytes - off) as usize);
        let chunk = &mut buf[..n];
        pat.fill(off, chunk);
        sum.update(chunk);
        if let Some(c) = corrupt_at {
            if c >= off && c < off + n as u64 {
                chunk[(c - off) as usize] ^= 0x01;
            }
        }
        if let Err(e) = s.write_all(chunk) {
            return (
                off,
                sum.value(),
                Some(format!("write at offset {off}: {e}")),
            );
        }
        off += n as u64;
    }
    (off, sum.value(), None)
}

struct RecvOutcome {
    received: u64,
    csum: u64,
    first_mismatch: Option<u64>,
    error: Option<String>,
}

fn recv_data(s: &mut TcpStream, pat: Pattern, bytes: u64, msg_size: usize) -> RecvOutcome {
    let mut buf = vec![0u8; msg_size.clamp(64 << 10, 16 << 20)];
    let mut sum = StreamSum::new();
    let mut off = 0u64;
    let mut first_mismatch = None;
    let mut error = None;
    while off < bytes {
        let want = buf.len().min((bytes - off) as usize);
        match s.read(&mut buf[..want]) {
            Ok(0) => {
                error = Some(format!("peer closed after {off} of {bytes} bytes"));
                break;
            }
            Ok(n) => {
                let chunk = &buf[..n];
                sum.update(chunk);
                if first_mismatch.is_none() {
                    first_mismatch = pat.verify(off, chunk);
                }
                off += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                error = Some(format!("read at offset {off}: {e}"));
                break;
            }
        }
    }
    RecvOutcome {
        received: off,
        csum: sum.value(),
        first_mismatch,
        error,
    }
}

fn smc_check(cfg: &StreamConfig, s: &TcpStream, r: &mut ConnResult) {
    if cfg.proto != Proto::Smc {
        return;
    }
    let info = sock::socket_inode(s.as_raw_fd()).and_then(diag::query_by_inode);
    match info {
        Err(e) => {
            let msg = format!("cannot determine SMC mode: {e}");
            if cfg.allow_fallback {
                r.warnings.push(msg);
            } else {
                r.errors.push(msg);
            }
        }
        Ok(info) => {
            if info.mode == SmcMode::FallbackTcp {
                let mut msg = format!(
                    "fallback to TCP: reason {}",
                    codes::short(info.fallback_reason)
                );
                if info.peer_diagnosis != 0 {
                    let _ = write!(
                        msg,
                        ", peer diagnosis {}",
                        codes::short(info.peer_diagnosis)
                    );
                }
                if let Some((_, meaning)) = codes::lookup(info.fallback_reason) {
                    let _ = write!(msg, " [{meaning}]");
                }
                if cfg.allow_fallback {
                    r.warnings.push(msg);
                } else {
                    r.errors.push(msg);
                }
            } else {
                let want_ok = match cfg.expect_mode {
                    ExpectMode::Any => info.is_smc(),
                    ExpectMode::Smcr => info.mode == SmcMode::SmcR,
                    ExpectMode::Smcd => info.mode == SmcMode::SmcD,
                };
                if !want_ok {
                    r.errors.push(format!(
                        "SMC mode {} but {:?} was required",
                        info.mode.name(),
                        cfg.expect_mode
                    ));
                }
            }
            r.smc = Some(info);
        }
    }
}

/// Runs the data, ack, SMC check and close phases on a connected stream.
fn run_conn(mut s: TcpStream, role: Role, cfg: &StreamConfig, conn: u32, r: &mut ConnResult) {
    r.conn = conn;
    r.sender = cfg.sends(role);
    r.receiver = cfg.receives(role);
    let first_closer = cfg.first_closer(role);
    let start = Instant::now();
    r.start = Some(start);

    let writer = if r.sender {
        match s.try_clone() {
            Ok(w) => {
                let pat = Pattern::new(cfg.seed, conn, StreamConfig::tx_way(role));
                let (bytes, ms) = (cfg.bytes, cfg.msg_size);
                let corrupt = if conn == 0 { cfg.corrupt_at } else { None };
                Some(thread::spawn(move || send_data(w, pat, bytes, ms, corrupt)))
            }
            Err(e) => {
                r.errors.push(format!("dup socket: {e}"));
                return;
            }
        }
    } else {
        None
    };
    if r.receiver {
        let pat = Pattern::new(cfg.seed, conn, StreamConfig::rx_way(role));
        let o = recv_data(&mut s, pat, cfg.bytes, cfg.msg_size);
        r.received = o.received;
        r.rx_csum = Some(o.csum);
        r.first_mismatch = o.first_mismatch;
        if let Some(off) = o.first_mismatch {
            r.errors
                .push(format!("data mismatch: first wrong byte at offset {off}"));
        }
        if let Some(e) = o.error {
            r.errors.push(e);
            // Unblock our own writer if the connection is dead.
            let _ = s.shutdown(Shutdown::Both);
        }
    }
    if let Some(h) = writer {
        match h.join() {
            Ok((sent, csum, err)) => {
                r.sent = sent;
                r.tx_csum = Some(csum);
                if let Some(e) = err {
                    r.errors.push(e);
                }
            }
            Err(_) => r.errors.push("writer thread panicked".into()),
        }
    }
    r.end = Some(Instant::now());
    r.secs = start.elapsed().as_secs_f64();
    if r.receiver {
        let verified = r.first_mismatch.unwrap_or(r.received);
        if let Err(e) = s.write_all(&verified.to_be_bytes()) {
            r.errors.push(format!("sending ack: {e}"));
        }
    }
    if first_closer {
        if let Err(e) = s.shutdown(Shutdown::Write) {
            r.errors.push(format!("shutdown(SHUT_WR): {e}"));
        }
    }
    if r.sender {
        let mut ack = [0u8; 8];
        match s.read_exact(&mut ack) {
            Ok(()) => {
                let a = u64::from_be_bytes(ack);
                r.ack = Some(a);
                if a != cfg.bytes {
                    r.errors.push(format!(
                        "peer acknowledged {a} verified bytes of {} (first bad byte or short read at offset {a})",
                        cfg.bytes
                    ));
                }
            }
            Err(e) => r.errors.push(format!("reading ack: {e}")),
        }
    }
    smc_check(cfg, &s, r);

    let mut extra = 0u64;
    let mut tmp = [0u8; 4096];
    loop {
        match s.read(&mut tmp) {
            Ok(0) => break,
            Ok(n) => extra += n as u64,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                r.errors.push(format!("waiting for peer close: {e}"));
                break;
            }
        }
    }
    if extra > 0 {
        r.errors
            .push(format!("{extra} unexpected trailing bytes after the data"));
    }
    if !first_closer {
        let _ = s.shutdown(Shutdown::Write);
    }
}

fn apply_timeouts(s: &TcpStream, cfg: &StreamConfig) {
    let _ = s.set_read_timeout(cfg.io_timeout);
    let _ = s.set_write_timeout(cfg.io_timeout);
}

/// Results of one run (client) or one server round.
#[derive(Clone, Debug)]
pub struct RunReport {
    /// server or client.
    pub role: Role,
    /// The configuration used.
    pub cfg: StreamConfig,
    /// Per-connection results, by index.
    pub conns: Vec<ConnResult>,
    /// First data byte to last, over all connections.
    pub wall_secs: f64,
    /// Process CPU time (user + system) during the run.
    pub cpu_secs: f64,
    /// Errors not tied to one connection.
    pub errors: Vec<String>,
}

impl RunReport {
    /// Pattern bytes moved by this side (sent + received).
    pub fn total_bytes(&self) -> u64 {
        self.conns.iter().map(|c| c.sent + c.received).sum()
    }
    /// All connections present and verified.
    pub fn verified(&self) -> bool {
        self.conns.len() == self.cfg.conns as usize
            && self.conns.iter().all(|c| c.data_verified(self.cfg.bytes))
    }
    /// Verified and no error anywhere.
    pub fn ok(&self) -> bool {
        self.errors.is_empty() && self.verified() && self.conns.iter().all(|c| c.ok(self.cfg.bytes))
    }
    /// MiB/s over the wall time.
    pub fn mibps(&self) -> f64 {
        if self.wall_secs > 0.0 {
            self.total_bytes() as f64 / (1u64 << 20) as f64 / self.wall_secs
        } else {
            0.0
        }
    }
    /// Gbit/s over the wall time.
    pub fn gbps(&self) -> f64 {
        if self.wall_secs > 0.0 {
            self.total_bytes() as f64 * 8.0 / 1e9 / self.wall_secs
        } else {
            0.0
        }
    }
    /// CPU seconds per GiB moved.
    pub fn cpu_s_per_gib(&self) -> f64 {
        let gib = self.total_bytes() as f64 / (1u64 << 30) as f64;
        if gib > 0.0 {
            self.cpu_secs / gib
        } else {
            0.0
        }
    }
    /// Aggregate SMC mode: `-` (tcp), `smcr`, `smcd`, `fallback`, `mixed`, `unknown`.
    pub fn smc_mode(&self) -> String {
        if self.cfg.proto != Proto::Smc {
            return "-".into();
        }
        let mut modes: Vec<String> = self
            .conns
            .iter()
            .map(|c| {
                c.smc
                    .as_ref()
                    .map(|i| i.mode.name())
                    .unwrap_or_else(|| "unknown".into())
            })
            .collect();
        modes.sort();
        modes.dedup();
        match modes.len() {
            0 => "unknown".into(),
            1 => modes.remove(0),
            _ => "mixed".into(),
        }
    }
    fn first_fallback_reason(&self) -> Option<u32> {
        self.conns
            .iter()
            .filter_map(|c| c.smc.as_ref())
            .find(|i| i.mode == SmcMode::FallbackTcp)
            .map(|i| i.fallback_reason)
    }
    fn error_count(&self) -> usize {
        self.errors.len() + self.conns.iter().map(|c| c.errors.len()).sum::<usize>()
    }

    /// One line per connection.
    pub fn conn_lines(&self) -> Vec<String> {
        let hex = |v: Option<u64>| v.map(|x| format!("{x:016x}")).unwrap_or_else(|| "-".into());
        self.conns
            .iter()
            .map(|c| {
                let mibps = if c.secs > 0.0 {
                    (c.sent + c.received) as f64 / (1u64 << 20) as f64 / c.secs
                } else {
                    0.0
                };
                let mut l = format!(
                    "CONN role={} conn={} peer={} sent={} received={} verified={} tx_csum={} rx_csum={} ack={} secs={:.3} mibps={:.1}",
                    self.role.name(),
                    c.conn,
                    c.peer.map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
                    c.sent,
                    c.received,
                    u8::from(c.data_verified(self.cfg.bytes)),
                    hex(c.tx_csum),
                    hex(c.rx_csum),
                    c.ack.map(|a| a.to_string()).unwrap_or_else(|| "-".into()),
                    c.secs,
                    mibps,
                );
                if let Some(m) = c.first_mismatch {
                    let _ = write!(l, " first_mismatch={m}");
                }
                if c.connect_attempts > 1 {
                    let _ = write!(l, " connect_attempts={}", c.connect_attempts);
                }
                if let Some(i) = &c.smc {
                    let _ = write!(l, " smc_{}", i.to_string().replace(' ', " smc_"));
                }
                for w in &c.warnings {
                    let _ = write!(l, " warning={w:?}");
                }
                for e in &c.errors {
                    let _ = write!(l, " error={e:?}");
                }
                l
            })
            .collect()
    }

    /// The figures both report lines end with: wall seconds, MiB/s,
    /// Gbit/s, CPU seconds, CPU seconds per GiB, SMC mode.
    fn figures(&self) -> (f64, f64, f64, f64, f64, String) {
        (
            self.wall_secs,
            self.mibps(),
            self.gbps(),
            self.cpu_secs,
            self.cpu_s_per_gib(),
            self.smc_mode(),
        )
    }

    /// Human summary line.
    pub fn summary_line(&self) -> String {
        let (secs, mibps, gbps, cpu, cpu_per_gib, mode) = self.figures();
        format!(
            "summary: role={} proto={} conns={} direction={} moved {} in {secs:.3} s = {mibps:.1} MiB/s ({gbps:.3} Gbit/s), cpu {cpu:.3} s ({cpu_per_gib:.3} s/GiB), smc_mode={mode} -> {}",
            self.role.name(),
            self.cfg.proto.name(),
            self.conns.len(),
            self.cfg.direction.name(),
            format_size(self.total_bytes()),
            if self.ok() { "PASS" } else { "FAIL" }
        )
    }

    /// The final machine-readable `STREAM-RESULT ...` line.
    pub fn result_line(&self) -> String {
        let (secs, mibps, gbps, cpu, cpu_per_gib, mode) = self.figures();
        let mut l = format!(
            "STREAM-RESULT role={} proto={} conns={} bytes={} direction={} close_order={} verified={} status={} total_bytes={} secs={secs:.6} mibps={mibps:.2} gbps={gbps:.4} cpu_s={cpu:.4} cpu_s_per_gib={cpu_per_gib:.4} smc_mode={mode}",
            self.role.name(),
            self.cfg.proto.name(),
            self.cfg.conns,
            self.cfg.bytes,
            self.cfg.direction.name(),
            self.cfg.close_order.name(),
            u8::from(self.verified()),
            if self.ok() { "pass" } else { "fail" },
            self.total_bytes(),
        );
        if let Some(r) = self.first_fallback_reason() {
            let _ = write!(l, " fallback_reason=0x{r:08x}");
            if let Some((name, _)) = codes::lookup(r) {
                let _ = write!(l, " fallback_name={name}");
            }
        }
        let _ = write!(l, " errors={}", self.error_count());
        l
    }

    /// JSON object (one line).
    pub fn to_json(&self) -> String {
        let mut j = String::from("{");
        let _ = write!(
            j,
            "\"role\":{},\"proto\":{},\"conns\":{},\"bytes\":{},\"direction\":{},\"close_order\":{},\"seed\":{},\"msg_size\":{},\"verified\":{},\"status\":{},\"total_bytes\":{},\"secs\":{},\"mibps\":{},\"gbps\":{},\"cpu_s\":{},\"cpu_s_per_gib\":{},\"smc_mode\":{}",
            js(self.role.name()),
            js(self.cfg.proto.name()),
            self.cfg.conns,
            self.cfg.bytes,
            js(self.cfg.direction.name()),
            js(self.cfg.close_order.name()),
            self.cfg.seed,
            self.cfg.msg_size,
            self.verified(),
            js(if self.ok() { "pass" } else { "fail" }),
            self.total_bytes(),
            jf(self.wall_secs),
            jf(self.mibps()),
            jf(self.gbps()),
            jf(self.cpu_secs),
            jf(self.cpu_s_per_gib()),
            js(&self.smc_mode()),
        );
        let _ = write!(j, ",\"errors\":{}", jarr(&self.errors));
        j.push_str(",\"connections\":[");
        for (i, c) in self.conns.iter().enumerate() {
            if i > 0 {
                j.push(',');
            }
            let _ = write!(
                j,
                "{{\"conn\":{},\"peer\":{},\"sent\":{},\"received\":{},\"verified\":{},\"tx_csum\":{},\"rx_csum\":{},\"ack\":{},\"first_mismatch\":{},\"secs\":{},\"connect_attempts\":{}",
                c.conn,
                c.peer.map(|p| js(&p.to_string())).unwrap_or_else(|| "null".into()),
                c.sent,
                c.received,
                c.data_verified(self.cfg.bytes),
                c.tx_csum.map(|v| js(&format!("{v:016x}"))).unwrap_or_else(|| "null".into()),
                c.rx_csum.map(|v| js(&format!("{v:016x}"))).unwrap_or_else(|| "null".into()),
                c.ack.map(|v| v.to_string()).unwrap_or_else(|| "null".into()),
                c.first_mismatch.map(|v| v.to_string()).unwrap_or_else(|| "null".into()),
                jf(c.secs),
                c.connect_attempts,
            );
            match &c.smc {
                Some(i) => {
                    let _ = write!(
                        j,
                        ",\"smc\":{{\"mode\":{},\"fallback_reason\":{},\"fallback_name\":{},\"peer_diagnosis\":{},\"ib_dev\":{},\"ib_port\":{},\"gid\":{},\"peer_gid\":{}}}",
                        js(&i.mode.name()),
                        i.fallback_reason,
                        codes::lookup(i.fallback_reason).map(|(n, _)| js(n)).unwrap_or_else(|| "null".into()),
                        i.peer_diagnosis,
                        i.ib_dev.as_deref().map(js).unwrap_or_else(|| "null".into()),
                        i.ib_port.map(|p| p.to_string()).unwrap_or_else(|| "null".into()),
                        i.gid.as_deref().map(js).unwrap_or_else(|| "null".into()),
                        i.peer_gid.as_deref().map(js).unwrap_or_else(|| "null".into()),
                    );
                }
                None => j.push_str(",\"smc\":null"),
            }
            let _ = write!(
                j,
                ",\"warnings\":{},\"errors\":{}}}",
                jarr(&c.warnings),
                jarr(&c.errors)
            );
        }
        j.push_str("]}");
        j
    }
}

/// JSON string literal.
fn js(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for ch in s.chars() {
        match ch {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            '\r' => o.push_str("\\r"),
            '\t' => o.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// JSON number (finite) for an f64.
fn jf(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.6}")
    } else {
        "null".into()
    }
}

fn jarr(v: &[String]) -> String {
    format!(
        "[{}]",
        v.iter().map(|s| js(s)).collect::<Vec<_>>().join(",")
    )
}

fn finish(
    role: Role,
    cfg: &StreamConfig,
    mut conns: Vec<ConnResult>,
    cpu0: f64,
    mut errors: Vec<String>,
) -> RunReport {
    conns.sort_by_key(|c| c.conn);
    let start = conns.iter().filter_map(|c| c.start).min();
    let end = conns.iter().filter_map(|c| c.end).max();
    let wall_secs = match (start, end) {
        (Some(s), Some(e)) => e.saturating_duration_since(s).as_secs_f64(),
        _ => 0.0,
    };
    let mut seen = vec![0u32; cfg.conns as usize];
    for c in &conns {
        if let Some(n) = seen.get_mut(c.conn as usize) {
            *n += 1;
        }
    }
    for (i, n) in seen.iter().enumerate() {
        if *n > 1 {
            errors.push(format!("connection index {i} seen {n} times"));
        }
    }
    RunReport {
        role,
        cfg: cfg.clone(),
        conns,
        wall_secs,
        cpu_secs: cpu_seconds() - cpu0,
        errors,
    }
}

/// Client: connect `conns` times in parallel and run the test on each.
pub fn run_client(cfg: &StreamConfig) -> RunReport {
    let cfg = Arc::new(cfg.clone());
    let addr = SocketAddr::new(cfg.addr, cfg.port);
    let deadline = Instant::now() + cfg.connect_timeout;
    let cpu0 = cpu_seconds();
    let handles: Vec<_> = (0..cfg.conns)
        .map(|conn| {
            let cfg = Arc::clone(&cfg);
            thread::spawn(move || {
                let mut r = ConnResult {
                    conn,
                    sender: cfg.sends(Role::Client),
                    receiver: cfg.receives(Role::Client),
                    ..Default::default()
                };
                match sock::connect_retry(cfg.proto, addr, deadline) {
                    Ok((mut s, attempts)) => {
                        r.connect_attempts = attempts;
                        r.peer = s.peer_addr().ok();
                        apply_timeouts(&s, &cfg);
                        match s.write_all(&Header::for_conn(&cfg, conn).encode()) {
                            Ok(()) => run_conn(s, Role::Client, &cfg, conn, &mut r),
                            Err(e) => r.errors.push(format!("sending header: {e}")),
                        }
                    }
                    Err(e) => r.errors.push(e.to_string()),
                }
                r
            })
        })
        .collect();
    let mut conns = Vec::new();
    let mut errors = Vec::new();
    for h in handles {
        match h.join() {
            Ok(r) => conns.push(r),
            Err(_) => errors.push("connection thread panicked".into()),
        }
    }
    finish(Role::Client, &cfg, conns, cpu0, errors)
}

/// Server: binds the listening socket (`--addr`, `--port`).
pub fn bind_server(cfg: &StreamConfig) -> io::Result<Listener> {
    Listener::bind(
        cfg.proto,
        SocketAddr::new(cfg.addr, cfg.port),
        128.max(cfg.conns as i32),
    )
}

/// Server: accepts `conns` connections and runs the test on each.
pub fn serve_round(listener: &Listener, cfg: &StreamConfig) -> RunReport {
    let cfg = Arc::new(cfg.clone());
    let mut handles = Vec::new();
    let mut errors = Vec::new();
    let mut cpu0 = None;
    for i in 0..cfg.conns {
        // The accept timeout runs from the first accept onwards too, so a
        // missing client cannot hang a round forever when one is set.
        match listener.accept(cfg.accept_timeout) {
            Ok((s, peer)) => {
                cpu0.get_or_insert_with(cpu_seconds);
                let cfg = Arc::clone(&cfg);
                handles.push(thread::spawn(move || {
                    let mut r = ConnResult {
                        conn: u32::MAX,
                        peer,
                        sender: cfg.sends(Role::Server),
                        receiver: cfg.receives(Role::Server),
                        ..Default::default()
                    };
                    apply_timeouts(&s, &cfg);
                    let mut hb = [0u8; HEADER_LEN];
                    let mut s = s;
                    match s.read_exact(&mut hb) {
                        Err(e) => r.errors.push(format!("reading header: {e}")),
                        Ok(()) => {
                            match Header::decode(&hb).and_then(|h| h.check(&cfg).map(|_| h)) {
                                Err(e) => r.errors.push(e.to_string()),
                                Ok(h) => run_conn(s, Role::Server, &cfg, h.conn, &mut r),
                            }
                        }
                    }
                    r
                }));
            }
            Err(e) => {
                errors.push(format!(
                    "accept (connection {} of {}): {e}",
                    i + 1,
                    cfg.conns
                ));
                break;
            }
        }
    }
    let mut conns = Vec::new();
    for h in handles {
        match h.join() {
            Ok(r) => conns.push(r),
            Err(_) => errors.push("connection thread panicked".into()),
        }
    }
    if conns.len() < cfg.conns as usize {
        errors.push(format!(
            "only {} of {} connections accepted",
            conns.len(),
            cfg.conns
        ));
    }
    finish(
        Role::Server,
        &cfg,
        conns,
        cpu0.unwrap_or_else(cpu_seconds),
        errors,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(cfg: StreamConfig) -> (RunReport, RunReport) {
        let mut cfg = cfg;
        cfg.addr = IpAddr::from([127, 0, 0, 1]);
        cfg.port = 0;
        cfg.accept_timeout = Some(Duration::from_secs(20));
        cfg.io_timeout = Some(Duration::from_secs(20));
        cfg.connect_timeout = Duration::from_secs(5);
        let l = bind_server(&cfg).expect("bind");
        cfg.port = l.local_addr().port();
        let scfg = cfg.clone();
        let server = thread::spawn(move || serve_round(&l, &scfg));
        let client = run_client(&cfg);
        let server = server.join().unwrap();
        (server, client)
    }

    #[test]
    fn header_roundtrip() {
        let cfg = StreamConfig::default();
        let h = Header::for_conn(&cfg, 3);
        let d = Header::decode(&h.encode()).unwrap();
        assert_eq!(h, d);
        let mut bad = h.encode();
        bad[0] ^= 1;
        assert_eq!(
            Header::decode(&bad).unwrap_err().to_string(),
            "bad header magic [52, 4d, 43, 47, 54, 00, 01, 00] (not a smc-guest-tests client?)"
        );
        let mut other = cfg.clone();
        other.conns = 4;
        assert_eq!(
            Header::for_conn(&other, 3).check(&cfg).unwrap_err().to_string(),
            format!(
                "client and server disagree: conns client=4 server={}, connection index 3 >= conns {}",
                cfg.conns, cfg.conns
            )
        );
    }

    #[test]
    fn loopback_all_directions_and_close_orders() {
        for direction in [Direction::C2s, Direction::S2c, Direction::Both] {
            for close_order in [CloseOrder::ClientFirst, CloseOrder::ServerFirst] {
                let cfg = StreamConfig {
                    bytes: 300_001, // not a multiple of anything nice
                    conns: 3,
                    seed: 77,
                    msg_size: 4093,
                    direction,
                    close_order,
                    ..Default::default()
                };
                let (s, c) = pair(cfg);
                for r in [&s, &c] {
                    assert!(
                        r.ok(),
                        "{direction:?} {close_order:?}: {:#?}\n{}",
                        r.conn_lines(),
                        r.result_line()
                    );
                    assert!(r.verified());
                    assert!(
                        r.result_line().contains(" verified=1 "),
                        "{}",
                        r.result_line()
                    );
                    assert_eq!(r.conns.len(), 3);
                }
                let per_dir = 300_001u64 * 3;
                let mult = if direction == Direction::Both { 2 } else { 1 };
                assert_eq!(s.total_bytes(), per_dir * mult);
                assert_eq!(c.total_bytes(), per_dir * mult);
                // Sender and receiver checksums agree per connection.
                for (sc, cc) in s.conns.iter().zip(c.conns.iter()) {
                    assert_eq!(sc.conn, cc.conn);
                    if sc.receiver {
                        assert_eq!(sc.rx_csum, cc.tx_csum);
                    }
                    if cc.receiver {
                        assert_eq!(cc.rx_csum, sc.tx_csum);
                    }
                }
                // JSON is produced and mentions every connection.
                let j = c.to_json();
                assert!(j.starts_with('{') && j.ends_with('}'));
                assert_eq!(j.matches("\"conn\":").count(), 3);
            }
        }
    }

    #[test]
    fn loopback_detects_corruption() {
        let cfg = StreamConfig {
            bytes: 100_000,
            conns: 2,
            msg_size: 8192,
            corrupt_at: Some(54_321),
            ..Default::default()
        };
        let (s, c) = pair(cfg);
        assert!(!s.ok());
        assert!(!s.verified());
        assert!(s.result_line().contains(" verified=0 "));
        let bad = s.conns.iter().find(|r| r.conn == 0).unwrap();
        assert_eq!(bad.first_mismatch, Some(54_321));
        assert_eq!(bad.received, 100_000);
        assert_ne!(bad.rx_csum, c.conns[0].tx_csum);
        let good = s.conns.iter().find(|r| r.conn == 1).unwrap();
        assert!(good.ok(100_000));
        // The client learns through the ack where the damage is.
        assert!(!c.ok());
        assert_eq!(c.conns[0].ack, Some(54_321));
        assert!(c.conns[1].ok(100_000));
    }

    #[test]
    fn mismatched_config_is_reported() {
        let mut cfg = StreamConfig {
            bytes: 1000,
            ..Default::default()
        };
        cfg.addr = IpAddr::from([127, 0, 0, 1]);
        cfg.port = 0;
        cfg.accept_timeout = Some(Duration::from_secs(10));
        cfg.io_timeout = Some(Duration::from_secs(10));
        let l = bind_server(&cfg).unwrap();
        let mut ccfg = cfg.clone();
        ccfg.port = l.local_addr().port();
        ccfg.seed = 2;
        let scfg = cfg.clone();
        let server = thread::spawn(move || serve_round(&l, &scfg));
        let c = run_client(&ccfg);
        let s = server.join().unwrap();
        assert!(!s.ok() && !c.ok());
        assert!(
            s.conns[0]
                .errors
                .iter()
                .any(|e| e.contains("seed client=2 server=1")),
            "{:?}",
            s.conns[0].errors
        );
    }

    #[test]
    fn zero_bytes_and_connect_timeout() {
        let (s, c) = pair(StreamConfig {
            bytes: 0,
            direction: Direction::Both,
            ..Default::default()
        });
        assert!(
            s.ok() && c.ok(),
            "{:?} {:?}",
            s.conn_lines(),
            c.conn_lines()
        );
        // Nothing listens on this port: the client retries, then fails.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        drop(l);
        let t0 = Instant::now();
        let r = run_client(&StreamConfig {
            port,
            connect_timeout: Duration::from_millis(700),
            ..Default::default()
        });
        assert!(!r.ok());
        assert!(t0.elapsed() < Duration::from_secs(10));
        assert!(
            r.conns[0].errors[0].contains("attempt"),
            "{:?}",
            r.conns[0].errors
        );
    }
}

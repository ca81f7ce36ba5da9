//! Socket creation for TCP and AF_SMC with plain libc calls.
//!
//! An AF_SMC socket is a stream socket: once connected (or accepted) it is
//! wrapped in a [`std::net::TcpStream`], whose methods only use generic
//! syscalls (read, write, shutdown, setsockopt SOL_SOCKET).

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

/// `AF_SMC` address family (include/linux/socket.h).
pub const AF_SMC: libc::c_int = 43;
/// `SMCPROTO_SMC`: SMC over IPv4 (net/smc/smc.h, include/net/smc.h).
pub const SMCPROTO_SMC: libc::c_int = 0;
/// `SMCPROTO_SMC6`: SMC over IPv6.
pub const SMCPROTO_SMC6: libc::c_int = 1;

/// Transport used for a stream test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Proto {
    /// Plain kernel TCP.
    Tcp,
    /// AF_SMC (SMC-R / SMC-D with transparent TCP fallback).
    Smc,
}

impl Proto {
    /// Lower-case name as printed in result lines.
    pub fn name(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Smc => "smc",
        }
    }
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// bind(2) `fd` to `addr`.
pub fn bind_fd(fd: RawFd, addr: &SocketAddr) -> io::Result<()> {
    let (ss, len) = to_sockaddr(addr);
    // SAFETY: ss/len describe a valid sockaddr.
    cvt(unsafe { libc::bind(fd, &ss as *const _ as *const libc::sockaddr, len) }).map(drop)
}

/// connect(2) `fd` to `addr` (blocking, or as the socket's options say).
pub fn connect_fd(fd: RawFd, addr: &SocketAddr) -> io::Result<()> {
    let (ss, len) = to_sockaddr(addr);
    // SAFETY: ss/len describe a valid sockaddr.
    cvt(unsafe { libc::connect(fd, &ss as *const _ as *const libc::sockaddr, len) }).map(drop)
}

/// Creates an unconnected stream socket for `proto` and the family of `addr`.
pub fn new_socket(proto: Proto, addr: &SocketAddr) -> io::Result<OwnedFd> {
    let (family, protocol) = match (proto, addr) {
        (Proto::Tcp, SocketAddr::V4(_)) => (libc::AF_INET, 0),
        (Proto::Tcp, SocketAddr::V6(_)) => (libc::AF_INET6, 0),
        (Proto::Smc, SocketAddr::V4(_)) => (AF_SMC, SMCPROTO_SMC),
        (Proto::Smc, SocketAddr::V6(_)) => (AF_SMC, SMCPROTO_SMC6),
    };
    // SAFETY: plain syscall, no pointers.
    let fd = unsafe { libc::socket(family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, protocol) };
    if fd < 0 {
        let e = io::Error::last_os_error();
        if proto == Proto::Smc && e.raw_os_error() == Some(libc::EAFNOSUPPORT) {
            return Err(io::Error::new(
                e.kind(),
                format!("socket(AF_SMC): {e}: is the smc module loaded? (modprobe smc)"),
            ));
        }
        return Err(e);
    }
    // SAFETY: fd is a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Encodes a socket address for bind/connect.
pub fn to_sockaddr(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in.
            let sin = unsafe { &mut *(&mut ss as *mut _ as *mut libc::sockaddr_in) };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = a.port().to_be();
            sin.sin_addr.s_addr = u32::from_ne_bytes(a.ip().octets());
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6 = unsafe { &mut *(&mut ss as *mut _ as *mut libc::sockaddr_in6) };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = a.port().to_be();
            sin6.sin6_addr.s6_addr = a.ip().octets();
            sin6.sin6_flowinfo = a.flowinfo();
            sin6.sin6_scope_id = a.scope_id();
            size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

/// Decodes an AF_INET / AF_INET6 socket address.
pub fn from_sockaddr(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match ss.ss_family as libc::c_int {
        libc::AF_INET => {
            // SAFETY: family says this is a sockaddr_in.
            let sin = unsafe { &*(ss as *const _ as *const libc::sockaddr_in) };
            let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: family says this is a sockaddr_in6.
            let sin6 = unsafe { &*(ss as *const _ as *const libc::sockaddr_in6) };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(SocketAddr::V6(SocketAddrV6::new(
                ip,
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

fn set_int_opt(fd: RawFd, level: libc::c_int, name: libc::c_int, v: libc::c_int) -> io::Result<()> {
    // SAFETY: valid pointer/length to a c_int.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            &v as *const _ as *const libc::c_void,
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    })
    .map(|_| ())
}

fn set_timeval_opt(fd: RawFd, name: libc::c_int, d: Duration) -> io::Result<()> {
    let tv = libc::timeval {
        tv_sec: d.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_usec: d.subsec_micros() as libc::suseconds_t,
    };
    // SAFETY: valid pointer/length to a timeval.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            name,
            &tv as *const _ as *const libc::c_void,
            size_of::<libc::timeval>() as libc::socklen_t,
        )
    })
    .map(|_| ())
}

/// A listening socket of either protocol.
#[derive(Debug)]
pub struct Listener {
    fd: OwnedFd,
    local: SocketAddr,
    proto: Proto,
}

impl Listener {
    /// socket + SO_REUSEADDR + bind + listen.
    pub fn bind(proto: Proto, addr: SocketAddr, backlog: i32) -> io::Result<Listener> {
        let fd = new_socket(proto, &addr)?;
        set_int_opt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)?;
        bind_fd(fd.as_raw_fd(), &addr)
            .map_err(|e| io::Error::new(e.kind(), format!("bind {addr}: {e}")))?;
        // SAFETY: plain syscall.
        cvt(unsafe { libc::listen(fd.as_raw_fd(), backlog) })?;
        let local = local_addr(fd.as_raw_fd()).unwrap_or(addr);
        Ok(Listener { fd, local, proto })
    }

    /// The bound address (with the real port when 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Protocol of this listener.
    pub fn proto(&self) -> Proto {
        self.proto
    }

    /// Accepts one connection, waiting at most `timeout` (forever if `None`).
    pub fn accept(&self, timeout: Option<Duration>) -> io::Result<(TcpStream, Option<SocketAddr>)> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let wait_ms = match deadline {
                None => -1,
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(io::Error::new(io::ErrorKind::TimedOut, "accept timed out"));
                    }
                    left.as_millis().min(i32::MAX as u128) as i32
                }
            };
            let mut pfd = libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            let n = unsafe { libc::poll(&mut pfd, 1, wait_ms) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if n == 0 {
                continue;
            }
            // SAFETY: zeroed sockaddr_storage is valid; len matches its size.
            let mut ss: libc::sockaddr_storage = unsafe { zeroed() };
            let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            let fd = unsafe {
                libc::accept4(
                    self.fd.as_raw_fd(),
                    &mut ss as *mut _ as *mut libc::sockaddr,
                    &mut len,
                    libc::SOCK_CLOEXEC,
                )
            };
            if fd < 0 {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::ECONNABORTED) => continue,
                    _ => return Err(e),
                }
            }
            // SAFETY: fresh descriptor we own.
            let stream = unsafe { TcpStream::from_raw_fd(fd) };
            return Ok((stream, from_sockaddr(&ss)));
        }
    }
}

/// getsockname as a `SocketAddr`.
pub fn local_addr(fd: RawFd) -> Option<SocketAddr> {
    // SAFETY: zeroed storage, correct length.
    let mut ss: libc::sockaddr_storage = unsafe { zeroed() };
    let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    let r = unsafe { libc::getsockname(fd, &mut ss as *mut _ as *mut libc::sockaddr, &mut len) };
    if r < 0 {
        return None;
    }
    from_sockaddr(&ss)
}

/// One connect attempt, bounded by `timeout` (through SO_SNDTIMEO).
pub fn connect_once(proto: Proto, addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    let fd = new_socket(proto, &addr)?;
    if !timeout.is_zero() {
        set_timeval_opt(fd.as_raw_fd(), libc::SO_SNDTIMEO, timeout)?;
    }
    if let Err(e) = connect_fd(fd.as_raw_fd(), &addr) {
        // A timed-out blocking connect with SO_SNDTIMEO reports EINPROGRESS.
        if e.raw_os_error() == Some(libc::EINPROGRESS) {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "connect timed out"));
        }
        return Err(e);
    }
    // SAFETY: connected descriptor, ownership moves into the stream.
    let s = unsafe { TcpStream::from_raw_fd(fd.into_raw_fd()) };
    s.set_write_timeout(None)?;
    Ok(s)
}

/// True for connect errors worth retrying while the peer boots.
pub fn connect_retryable(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ECONNREFUSED)
            | Some(libc::ENETUNREACH)
            | Some(libc::EHOSTUNREACH)
            | Some(libc::EHOSTDOWN)
            | Some(libc::ETIMEDOUT)
            | Some(libc::ECONNRESET)
            | Some(libc::ECONNABORTED)
            | Some(libc::EADDRNOTAVAIL)
            | Some(libc::ENETDOWN)
            | Some(libc::EINTR)
            | Some(libc::EAGAIN)
    ) || e.kind() == io::ErrorKind::TimedOut
}

/// Connects, retrying retryable errors until `deadline` (the server guest may
/// boot later than the client). Returns the stream and the number of attempts.
pub fn connect_retry(
    proto: Proto,
    addr: SocketAddr,
    deadline: Instant,
) -> io::Result<(TcpStream, u32)> {
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let left = deadline.saturating_duration_since(Instant::now());
        let per_try = left.clamp(Duration::from_millis(100), Duration::from_secs(5));
        match connect_once(proto, addr, per_try) {
            Ok(s) => return Ok((s, attempts)),
            Err(e) if connect_retryable(&e) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(200).min(left));
            }
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!(
                        "connect to {addr} ({}) failed after {attempts} attempt(s): {e}",
                        proto.name()
                    ),
                ))
            }
        }
    }
}

/// Inode number of a socket descriptor (matches `diag_inode` in sock_diag).
pub fn socket_inode(fd: RawFd) -> io::Result<u64> {
    // SAFETY: zeroed stat is valid output storage.
    let mut st: libc::stat = unsafe { zeroed() };
    cvt(unsafe { libc::fstat(fd, &mut st) })?;
    Ok(st.st_ino)
}

/// An `--addr` that is no IP address.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad IP address {input:?}: {error}")]
pub struct IpAddrError {
    /// The text given.
    pub input: String,
    /// Why std refused it.
    pub error: std::net::AddrParseError,
}

/// Parses an IP address for `--addr` (brackets around IPv6 are accepted).
pub fn parse_ip(s: &str) -> Result<IpAddr, IpAddrError> {
    let t = s.trim().trim_start_matches('[').trim_end_matches(']');
    t.parse::<IpAddr>().map_err(|error| IpAddrError {
        input: s.to_string(),
        error,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ip_addresses_parse_with_or_without_brackets() {
        assert_eq!(
            parse_ip("[::1]").unwrap(),
            IpAddr::from(std::net::Ipv6Addr::LOCALHOST)
        );
        assert_eq!(parse_ip(" 10.0.0.1 ").unwrap(), IpAddr::from([10, 0, 0, 1]));
        assert_eq!(
            parse_ip("10.0.0.300").unwrap_err().to_string(),
            "bad IP address \"10.0.0.300\": invalid IP address syntax"
        );
    }
}

//! `devmem-send`: the sender side of the kernel's devmem TCP RX selftest
//! (`tools/testing/selftests/drivers/net/hw/ncdevmem.c`, server mode `-l`).
//!
//! The selftest pipes `yes $(echo -e \x01\x02\x03\x04\x05\x06) | head -c N`
//! into socat; the guests have no socat, so this sends the same bytes. With
//! `ncdevmem -v M` the receiver checks byte `k` of the stream against
//! `(k + 1) % M`, where a residue of 0 stands for `'\n'` (its
//! `validate_buffer`): for M = 7 that is exactly `yes`' 1..6 + newline.
//! ncdevmem's `-c CLIENT_IP` installs a 5-tuple flow rule whose source port
//! is the server port, so `--bind IP:PORT` binds the sending socket first
//! (socat's `bind=` in the selftest).

use std::io::{self, Read, Write};
use std::mem::size_of;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::time::{Duration, Instant};

use crate::sock::{bind_fd, connect_fd, connect_retryable};

/// The byte ncdevmem `-v modulus` expects at stream offset `off`.
#[inline]
pub fn pattern_byte(off: u64, modulus: u8) -> u8 {
    let r = ((off + 1) % u64::from(modulus)) as u8;
    if r == 0 {
        b'\n'
    } else {
        r
    }
}

/// Fills `buf` with the pattern starting at stream offset `off`.
pub fn fill(buf: &mut [u8], off: u64, modulus: u8) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = pattern_byte(off + i as u64, modulus);
    }
}

/// What to send and where.
#[derive(Clone, Debug)]
pub struct SendConfig {
    /// The ncdevmem server.
    pub to: SocketAddr,
    /// Local address to bind before connecting (source port for a 5-tuple rule).
    pub bind: Option<SocketAddr>,
    /// Payload bytes.
    pub bytes: u64,
    /// ncdevmem's `-v` value (2..=255).
    pub modulus: u8,
    /// write() size.
    pub msg_size: usize,
    /// Keep retrying refused connects until this long after the start.
    pub connect_timeout: Duration,
    /// SO_SNDTIMEO / SO_RCVTIMEO once connected (0: none).
    pub io_timeout: Duration,
    /// After the last byte: half-close and wait for the receiver's close.
    pub wait_close: bool,
}

/// What happened.
#[derive(Clone, Debug)]
pub struct SendReport {
    /// Connect attempts (refused ones while the server was not listening yet).
    pub attempts: u32,
    /// Seconds spent connecting.
    pub connect_secs: f64,
    /// Payload bytes written.
    pub sent: u64,
    /// Seconds from connected to last byte written.
    pub send_secs: f64,
    /// Seconds from connected to the receiver's close (if waited for).
    pub close_secs: Option<f64>,
    /// Bytes the receiver sent back (ncdevmem sends none).
    pub received_back: u64,
    /// Local address of the connection.
    pub local: Option<SocketAddr>,
}

fn setsockopt_int(fd: i32, level: i32, name: i32, v: i32) -> io::Result<()> {
    // SAFETY: pointer to a live c_int with its size.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            &v as *const i32 as *const libc::c_void,
            size_of::<i32>() as libc::socklen_t,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// One connect attempt, optionally bound to `bind` (SO_REUSEADDR set).
fn connect_once(to: SocketAddr, bind: Option<SocketAddr>) -> io::Result<TcpStream> {
    let family = match to {
        SocketAddr::V4(_) => libc::AF_INET,
        SocketAddr::V6(_) => libc::AF_INET6,
    };
    // SAFETY: plain syscall.
    let fd = unsafe { libc::socket(family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    if let Some(b) = bind {
        if b.is_ipv4() != to.is_ipv4() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("--bind {b} and --to {to} are different address families"),
            ));
        }
        setsockopt_int(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)?;
        bind_fd(fd.as_raw_fd(), &b)
            .map_err(|e| io::Error::new(e.kind(), format!("bind {b}: {e}")))?;
    }
    connect_fd(fd.as_raw_fd(), &to)?;
    // SAFETY: connected descriptor, ownership moves into the stream.
    Ok(unsafe { TcpStream::from_raw_fd(fd.into_raw_fd()) })
}

/// Connects (retrying while the server is not listening), sends the pattern,
/// half-closes and (with `wait_close`) waits for the receiver to close.
pub fn run(cfg: &SendConfig) -> io::Result<SendReport> {
    if cfg.modulus < 2 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "--pattern-mod must be 2..=255",
        ));
    }
    let t0 = Instant::now();
    let deadline = t0 + cfg.connect_timeout;
    let mut attempts = 0u32;
    let mut s = loop {
        attempts += 1;
        match connect_once(cfg.to, cfg.bind) {
            Ok(s) => break s,
            // EADDRINUSE: the previous attempt's port binding lingers briefly.
            Err(e)
                if (connect_retryable(&e) || e.raw_os_error() == Some(libc::EADDRINUSE))
                    && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(250));
            }
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!(
                        "connect to {} failed after {attempts} attempt(s): {e}",
                        cfg.to
                    ),
                ))
            }
        }
    };
    let connect_secs = t0.elapsed().as_secs_f64();
    let io_to = (!cfg.io_timeout.is_zero()).then_some(cfg.io_timeout);
    s.set_write_timeout(io_to)?;
    s.set_read_timeout(io_to)?;
    let local = s.local_addr().ok();

    // A buffer holding a whole number of pattern periods, so every write
    // starts at residue 0 of the period and the buffer can be reused.
    let period = usize::from(cfg.modulus);
    let len = (cfg.msg_size.max(period) / period) * period;
    let mut buf = vec![0u8; len];
    fill(&mut buf, 0, cfg.modulus);

    let t1 = Instant::now();
    let mut sent = 0u64;
    // `pos` = offset into buf, always sent % period == pos % period
    let mut pos = 0usize;
    while sent < cfg.bytes {
        let want = ((cfg.bytes - sent).min((len - pos) as u64)) as usize;
        let n = s
            .write(&buf[pos..pos + want])
            .map_err(|e| io::Error::new(e.kind(), format!("write at offset {sent}: {e}")))?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("write returned 0 at offset {sent}"),
            ));
        }
        sent += n as u64;
        pos = (pos + n) % len;
    }
    let send_secs = t1.elapsed().as_secs_f64();
    s.shutdown(Shutdown::Write)?;
    let mut received_back = 0u64;
    let mut close_secs = None;
    if cfg.wait_close {
        let mut rb = [0u8; 4096];
        loop {
            match s.read(&mut rb) {
                Ok(0) => break,
                Ok(n) => received_back += n as u64,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // ncdevmem closes with unread data-less socket: a reset is a close too
                Err(e) if e.raw_os_error() == Some(libc::ECONNRESET) => break,
                Err(e) => {
                    return Err(io::Error::new(
                        e.kind(),
                        format!("waiting for the receiver to close after {sent} bytes: {e}"),
                    ))
                }
            }
        }
        close_secs = Some(t1.elapsed().as_secs_f64());
    }
    Ok(SendReport {
        attempts,
        connect_secs,
        sent,
        send_secs,
        close_secs,
        received_back,
        local,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ncdevmem's validate_buffer(), transcribed: a static seed starting at 1,
    /// expected = seed ? seed : '\n', seed++, seed == M -> 0.
    fn ncdevmem_expect(n: usize, m: u8) -> Vec<u8> {
        let mut seed: u8 = 1;
        (0..n)
            .map(|_| {
                let e = if seed != 0 { seed } else { b'\n' };
                seed = seed.wrapping_add(1);
                if seed == m {
                    seed = 0;
                }
                e
            })
            .collect()
    }

    #[test]
    fn matches_ncdevmem_validation() {
        for m in [2u8, 7, 8, 255] {
            let mut b = vec![0u8; 3000];
            fill(&mut b, 0, m);
            assert_eq!(b, ncdevmem_expect(3000, m), "modulus {m}");
        }
        // the selftest's `yes $(echo -e \x01..\x06)`
        let mut b = vec![0u8; 14];
        fill(&mut b, 0, 7);
        assert_eq!(b, b"\x01\x02\x03\x04\x05\x06\n\x01\x02\x03\x04\x05\x06\n");
    }

    #[test]
    fn loopback_send_is_the_pattern_and_waits_for_close() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let to = l.local_addr().unwrap();
        let h = std::thread::spawn(move || {
            let (mut c, _) = l.accept().unwrap();
            let mut v = Vec::new();
            c.read_to_end(&mut v).unwrap();
            v
        });
        let r = run(&SendConfig {
            to,
            bind: None,
            bytes: 100_003,
            modulus: 7,
            msg_size: 1000,
            connect_timeout: Duration::from_secs(5),
            io_timeout: Duration::from_secs(5),
            wait_close: true,
        })
        .unwrap();
        let v = h.join().unwrap();
        assert_eq!(r.sent, 100_003);
        assert_eq!(v, ncdevmem_expect(100_003, 7));
        assert!(r.close_secs.is_some());
    }
}

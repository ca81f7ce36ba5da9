//! A thin vhost-user message relay between QEMU and the rust-vmm backend.
//!
//! QEMU's virtio-net sends `SET_VRING_ENABLE` while realizing the device,
//! before `SET_FEATURES` (it checks the *offered* PROTOCOL_FEATURES bit); the
//! `vhost` crate refuses that request until the bit is *acked* and drops the
//! connection. The relay answers such early requests itself, remembers the
//! enable state QEMU asked for, and replays it to the backend right after each
//! `SET_FEATURES` that acks PROTOCOL_FEATURES (QEMU does not send it again).
//! Everything else is forwarded unchanged, file descriptors included.

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use tracing::debug;
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

const HDR_LEN: usize = 12;
/// Larger than any vhost-user message QEMU sends (mem tables, config space).
const MAX_PAYLOAD: usize = 64 * 1024;
const MAX_FDS: usize = 32;
const SET_FEATURES: u32 = 2;
const SET_PROTOCOL_FEATURES: u32 = 16;
const SET_VRING_ENABLE: u32 = 18;
const FLAG_VERSION: u32 = 0x1;
const FLAG_REPLY: u32 = 0x4;
const FLAG_NEED_REPLY: u32 = 0x8;
const PROTOCOL_F_REPLY_ACK: u64 = 1 << 3;

/// One message with its file descriptors.
struct Msg {
    bytes: Vec<u8>,
    fds: Vec<OwnedFd>,
}

impl Msg {
    fn u32_at(&self, at: usize) -> u32 {
        self.bytes
            .get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .unwrap_or(0)
    }
    fn u64_payload(&self) -> u64 {
        self.bytes
            .get(HDR_LEN..HDR_LEN + 8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
            .unwrap_or(0)
    }
}

/// Reads one message; `Ok(None)` on a clean end of stream.
fn recv_msg(s: &UnixStream) -> io::Result<Option<Msg>> {
    let mut hdr = [0u8; HDR_LEN];
    let mut raw = [-1 as RawFd; MAX_FDS];
    let mut iov = [libc::iovec {
        iov_base: hdr.as_mut_ptr().cast(),
        iov_len: HDR_LEN,
    }];
    // SAFETY: the iovec points at `hdr`, which outlives the call.
    let (n, nfds) = unsafe { s.recv_with_fds(&mut iov, &mut raw) }.map_err(io::Error::from)?;
    // SAFETY: recv_with_fds returned `nfds` fresh descriptors that we now own.
    let fds: Vec<OwnedFd> = raw[..nfds]
        .iter()
        .map(|&fd| unsafe { OwnedFd::from_raw_fd(fd) })
        .collect();
    if n == 0 {
        return Ok(None);
    }
    let mut r = s;
    if n < HDR_LEN {
        r.read_exact(&mut hdr[n..])?;
    }
    let size = u32::from_le_bytes([hdr[8], hdr[9], hdr[10], hdr[11]]) as usize;
    if size > MAX_PAYLOAD {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("vhost-user message of {size} bytes"),
        ));
    }
    let mut bytes = Vec::with_capacity(HDR_LEN + size);
    bytes.extend_from_slice(&hdr);
    bytes.resize(HDR_LEN + size, 0);
    r.read_exact(&mut bytes[HDR_LEN..])?;
    Ok(Some(Msg { bytes, fds }))
}

fn send_msg(s: &UnixStream, m: &Msg) -> io::Result<()> {
    let fds: Vec<RawFd> = m.fds.iter().map(|f| f.as_raw_fd()).collect();
    let n = s
        .send_with_fds(&[&m.bytes[..]], &fds)
        .map_err(io::Error::from)?;
    if n < m.bytes.len() {
        let mut w = s;
        w.write_all(&m.bytes[n..])?;
    }
    Ok(())
}

/// Relays between `front` (QEMU) and `back` (the backend) until either side
/// closes. Blocks the calling thread.
pub fn relay(front: UnixStream, back: UnixStream, port: &str) -> io::Result<()> {
    let front_w = Arc::new(Mutex::new(front.try_clone()?));
    let back_r = back.try_clone()?;
    let fw = front_w.clone();
    let front_for_b = front.try_clone()?;
    let back_for_a = back.try_clone()?;
    // Backend to front end: replies, forwarded verbatim.
    let replies = std::thread::Builder::new()
        .name(format!("relay-{port}"))
        .spawn(move || {
            while let Ok(Some(m)) = recv_msg(&back_r) {
                let w = fw.lock().unwrap_or_else(|e| e.into_inner());
                if send_msg(&w, &m).is_err() {
                    break;
                }
            }
            let _ = front_for_b.shutdown(std::net::Shutdown::Both);
        })?;
    let mut features_acked = false;
    let mut reply_ack = false;
    // Last enable state QEMU asked for, per vring index (bounded by QEMU's
    // queue count, but cap it anyway: the index is peer input).
    let mut enables: std::collections::BTreeMap<u32, u32> = std::collections::BTreeMap::new();
    let result = loop {
        let m = match recv_msg(&front) {
            Ok(Some(m)) => m,
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        };
        let (req, flags) = (m.u32_at(0), m.u32_at(4));
        tracing::trace!(
            port,
            req,
            flags,
            size = m.bytes.len() - HDR_LEN,
            fds = m.fds.len(),
            "vhost-user request"
        );
        if req == SET_VRING_ENABLE && enables.len() < 1024 {
            enables.insert(m.u32_at(HDR_LEN), m.u32_at(HDR_LEN + 4));
        }
        match req {
            SET_FEATURES => {
                features_acked = m.u64_payload() & (1 << 30) != 0;
                if let Err(e) = send_msg(&back, &m) {
                    break Err(e);
                }
                if features_acked {
                    for (&index, &state) in &enables {
                        let mut b = Vec::with_capacity(HDR_LEN + 8);
                        b.extend_from_slice(&SET_VRING_ENABLE.to_le_bytes());
                        b.extend_from_slice(&FLAG_VERSION.to_le_bytes());
                        b.extend_from_slice(&8u32.to_le_bytes());
                        b.extend_from_slice(&index.to_le_bytes());
                        b.extend_from_slice(&state.to_le_bytes());
                        if let Err(e) = send_msg(
                            &back,
                            &Msg {
                                bytes: b,
                                fds: Vec::new(),
                            },
                        ) {
                            return finish(back_for_a, front, replies, Err(e));
                        }
                    }
                }
                continue;
            }
            SET_PROTOCOL_FEATURES => reply_ack = m.u64_payload() & PROTOCOL_F_REPLY_ACK != 0,
            SET_VRING_ENABLE if !features_acked => {
                debug!(
                    port,
                    "answering early SET_VRING_ENABLE (QEMU re-sends it after SET_FEATURES)"
                );
                if flags & FLAG_NEED_REPLY != 0 && reply_ack {
                    let mut ack = Vec::with_capacity(HDR_LEN + 8);
                    ack.extend_from_slice(&SET_VRING_ENABLE.to_le_bytes());
                    ack.extend_from_slice(&(FLAG_VERSION | FLAG_REPLY).to_le_bytes());
                    ack.extend_from_slice(&8u32.to_le_bytes());
                    ack.extend_from_slice(&0u64.to_le_bytes());
                    let w = front_w.lock().unwrap_or_else(|e| e.into_inner());
                    if let Err(e) = send_msg(
                        &w,
                        &Msg {
                            bytes: ack,
                            fds: Vec::new(),
                        },
                    ) {
                        break Err(e);
                    }
                }
                continue;
            }
            _ => {}
        }
        if let Err(e) = send_msg(&back, &m) {
            break Err(e);
        }
    };
    finish(back_for_a, front, replies, result)
}

fn finish(
    back: UnixStream,
    front: UnixStream,
    replies: std::thread::JoinHandle<()>,
    result: io::Result<()>,
) -> io::Result<()> {
    let _ = back.shutdown(std::net::Shutdown::Both);
    let _ = front.shutdown(std::net::Shutdown::Both);
    let _ = replies.join();
    result
}

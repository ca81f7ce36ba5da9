//! Minimal netlink plumbing written by hand with libc: message and attribute
//! encoding, a request/response loop, and generic netlink family lookup.

use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// `NETLINK_SOCK_DIAG` protocol number.
pub const NETLINK_SOCK_DIAG: libc::c_int = 4;
/// `NETLINK_GENERIC` protocol number.
pub const NETLINK_GENERIC: libc::c_int = 16;

/// Netlink message types and flags (include/uapi/linux/netlink.h).
pub const NLMSG_ERROR: u16 = 2;
/// End of a dump.
pub const NLMSG_DONE: u16 = 3;
/// Request flag.
pub const NLM_F_REQUEST: u16 = 0x1;
/// Part of a multi-part reply.
pub const NLM_F_MULTI: u16 = 0x2;
/// Ask for an acknowledgement.
pub const NLM_F_ACK: u16 = 0x4;
/// Dump request (`NLM_F_ROOT | NLM_F_MATCH`).
pub const NLM_F_DUMP: u16 = 0x300;
/// Attribute type bits (without NLA_F_NESTED / NLA_F_NET_BYTEORDER).
pub const NLA_TYPE_MASK: u16 = 0x3fff;
/// Attribute flag: the payload is itself a list of attributes.
pub const NLA_F_NESTED: u16 = 0x8000;
/// NLMSG_ERROR flag: only the request's header is echoed back.
const NLM_F_CAPPED: u16 = 0x100;
/// NLMSG_ERROR flag: extended-ack attributes follow.
const NLM_F_ACK_TLVS: u16 = 0x200;
/// `SOL_NETLINK` socket option level and `NETLINK_EXT_ACK`.
const SOL_NETLINK: libc::c_int = 270;
const NETLINK_EXT_ACK: libc::c_int = 11;
/// Extended-ack attribute: the kernel's error message (a string).
const NLMSGERR_ATTR_MSG: u16 = 1;

/// Size of `struct nlmsghdr`.
pub const NLMSG_HDRLEN: usize = 16;
/// Size of `struct genlmsghdr`.
pub const GENL_HDRLEN: usize = 4;

/// Generic netlink controller (`GENL_ID_CTRL`) and its bits.
pub const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;

/// Rounds up to the 4-byte netlink alignment.
pub const fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// Appends one attribute (header, payload, padding) to `buf`.
pub fn put_attr(buf: &mut Vec<u8>, ty: u16, payload: &[u8]) {
    let len = 4 + payload.len();
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&ty.to_ne_bytes());
    buf.extend_from_slice(payload);
    buf.resize(buf.len() + (align4(len) - len), 0);
}

/// Builds a netlink message: header + `body` (already aligned sections).
pub fn build_msg(ty: u16, flags: u16, seq: u32, body: &[u8]) -> Vec<u8> {
    let len = NLMSG_HDRLEN + body.len();
    let mut m = Vec::with_capacity(align4(len));
    m.extend_from_slice(&(len as u32).to_ne_bytes());
    m.extend_from_slice(&ty.to_ne_bytes());
    m.extend_from_slice(&flags.to_ne_bytes());
    m.extend_from_slice(&seq.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes()); // pid: kernel fills it in
    m.extend_from_slice(body);
    m.resize(align4(len), 0);
    m
}

/// Builds a generic netlink request: nlmsghdr + genlmsghdr + attributes.
pub fn build_genl(
    family: u16,
    flags: u16,
    seq: u32,
    cmd: u8,
    version: u8,
    attrs: &[(u16, &[u8])],
) -> Vec<u8> {
    let mut body = vec![cmd, version, 0, 0];
    for (ty, payload) in attrs {
        put_attr(&mut body, *ty, payload);
    }
    build_msg(family, flags, seq, &body)
}

/// Iterates over the attributes in `buf`: `(type & NLA_TYPE_MASK, payload)`.
pub fn attrs(buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    let mut rest = buf;
    std::iter::from_fn(move || {
        if rest.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([rest[0], rest[1]]) as usize;
        let ty = u16::from_ne_bytes([rest[2], rest[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > rest.len() {
            return None;
        }
        let payload = &rest[4..len];
        rest = &rest[align4(len).min(rest.len())..];
        Some((ty, payload))
    })
}

/// First attribute of type `ty`.
pub fn find_attr(buf: &[u8], ty: u16) -> Option<&[u8]> {
    attrs(buf).find(|(t, _)| *t == ty).map(|(_, p)| p)
}

/// Attribute payload as u8/u16/u32/u64 (native endian), if long enough.
pub fn attr_u8(p: &[u8]) -> Option<u8> {
    p.first().copied()
}
/// See [`attr_u8`].
pub fn attr_u16(p: &[u8]) -> Option<u16> {
    Some(u16::from_ne_bytes(p.get(..2)?.try_into().ok()?))
}
/// See [`attr_u8`].
pub fn attr_u32(p: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(p.get(..4)?.try_into().ok()?))
}
/// NUL-terminated string attribute.
pub fn attr_str(p: &[u8]) -> String {
    let end = p.iter().position(|&b| b == 0).unwrap_or(p.len());
    String::from_utf8_lossy(&p[..end]).into_owned()
}

/// One received netlink message.
#[derive(Debug, Clone)]
pub struct Msg {
    /// nlmsg_type.
    pub ty: u16,
    /// nlmsg_flags.
    pub flags: u16,
    /// Payload after the 16-byte header.
    pub payload: Vec<u8>,
}

/// A netlink socket bound to the kernel.
#[derive(Debug)]
pub struct NlSocket {
    fd: OwnedFd,
    seq: u32,
}

impl NlSocket {
    /// Opens a netlink socket of `protocol` (e.g. [`NETLINK_GENERIC`]).
    pub fn open(protocol: libc::c_int) -> io::Result<NlSocket> {
        // SAFETY: plain syscall.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                protocol,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: zeroed sockaddr_nl is valid (pid 0: kernel assigns).
        let mut sa: libc::sockaddr_nl = unsafe { zeroed() };
        sa.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                &sa as *const _ as *const libc::sockaddr,
                size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        let tv = libc::timeval {
            tv_sec: 10,
            tv_usec: 0,
        };
        // SAFETY: valid timeval pointer and length.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                &tv as *const _ as *const libc::c_void,
                size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        // The kernel's error message with an error (see `request_ext`); a
        // kernel without extended acks just refuses the option.
        let one: libc::c_int = 1;
        // SAFETY: valid int pointer and length.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                SOL_NETLINK,
                NETLINK_EXT_ACK,
                &one as *const _ as *const libc::c_void,
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        Ok(NlSocket { fd, seq: 1 })
    }

    /// Next sequence number.
    pub fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    /// Sends one message to the kernel.
    pub fn send(&self, msg: &[u8]) -> io::Result<()> {
        // SAFETY: zeroed sockaddr_nl addresses the kernel (pid 0).
        let mut sa: libc::sockaddr_nl = unsafe { zeroed() };
        sa.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        let r = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                msg.as_ptr() as *const libc::c_void,
                msg.len(),
                0,
                &sa as *const _ as *const libc::sockaddr,
                size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Sends `msg` (with sequence `seq`) and collects the replies: for a dump
    /// until NLMSG_DONE, otherwise until the ACK (NLMSG_ERROR with error 0).
    /// A non-zero NLMSG_ERROR becomes an `io::Error` with that errno.
    pub fn request(&self, msg: &[u8], seq: u32, dump: bool) -> io::Result<Vec<Msg>> {
        self.request_ext(msg, seq, dump).map_err(|e| e.error)
    }

    /// [`request`](Self::request), keeping the kernel's extended-ack
    /// message (e.g. "tcp-data-split is disabled") beside the errno.
    pub fn request_ext(&self, msg: &[u8], seq: u32, dump: bool) -> Result<Vec<Msg>, NlError> {
        let plain = |error| NlError {
            error,
            message: None,
        };
        self.send(msg).map_err(plain)?;
        let mut out = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            // SAFETY: buf is valid for its length.
            let n = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr() as *mut libc::c_void,
                    buf.len(),
                    0,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(plain(e));
            }
            let mut rest = &buf[..n as usize];
            while rest.len() >= NLMSG_HDRLEN {
                let len = u32::from_ne_bytes(rest[0..4].try_into().unwrap()) as usize;
                let ty = u16::from_ne_bytes(rest[4..6].try_into().unwrap());
                let flags = u16::from_ne_bytes(rest[6..8].try_into().unwrap());
                let mseq = u32::from_ne_bytes(rest[8..12].try_into().unwrap());
                if len < NLMSG_HDRLEN || len > rest.len() {
                    return Err(plain(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "truncated netlink message",
                    )));
                }
                let payload = &rest[NLMSG_HDRLEN..len];
                rest = &rest[align4(len).min(rest.len())..];
                if mseq != seq {
                    continue; // stale reply of an earlier request
                }
                match ty {
                    NLMSG_DONE => return Ok(out),
                    NLMSG_ERROR => {
                        let err = payload
                            .get(..4)
                            .map(|b| i32::from_ne_bytes(b.try_into().unwrap()))
                            .unwrap_or(-libc::EPROTO);
                        if err == 0 {
                            if !dump {
                                return Ok(out);
                            }
                            continue;
                        }
                        return Err(NlError {
                            error: io::Error::from_raw_os_error(-err),
                            message: extack_message(flags, payload),
                        });
                    }
                    _ => {
                        out.push(Msg {
                            ty,
                            flags,
                            payload: payload.to_vec(),
                        });
                        if !dump && flags & NLM_F_MULTI == 0 && !wants_ack(msg) {
                            return Ok(out);
                        }
                    }
                }
            }
        }
    }
}

/// A failed request: the errno (or I/O error) and, when the kernel gave
/// one, its extended-ack message (both in the message; no `source()`).
#[derive(Debug, thiserror::Error)]
#[error("{error}{}", message.as_deref().map(|m| format!(" ({m})")).unwrap_or_default())]
pub struct NlError {
    /// The errno of the NLMSG_ERROR, or the socket's error.
    pub error: io::Error,
    /// `NLMSGERR_ATTR_MSG` of the NLMSG_ERROR.
    pub message: Option<String>,
}

/// The `NLMSGERR_ATTR_MSG` string of an NLMSG_ERROR payload (`struct
/// nlmsgerr`: the errno, the echoed request, then the ack attributes).
pub fn extack_message(flags: u16, payload: &[u8]) -> Option<String> {
    if flags & NLM_F_ACK_TLVS == 0 {
        return None;
    }
    let echoed = if flags & NLM_F_CAPPED != 0 {
        NLMSG_HDRLEN
    } else {
        let len = payload.get(4..8)?;
        u32::from_ne_bytes(len.try_into().ok()?) as usize
    };
    let start = 4usize.checked_add(echoed)?.checked_add(3)? & !3;
    let tlvs = payload.get(start..)?;
    let m = attr_str(find_attr(tlvs, NLMSGERR_ATTR_MSG)?);
    (!m.is_empty()).then_some(m)
}

fn wants_ack(msg: &[u8]) -> bool {
    msg.len() >= 8 && u16::from_ne_bytes([msg[6], msg[7]]) & NLM_F_ACK != 0
}

/// Resolves a generic netlink family name to its id.
pub fn genl_family_id(sock: &mut NlSocket, name: &str) -> io::Result<u16> {
    let mut n = name.as_bytes().to_vec();
    n.push(0);
    let seq = sock.next_seq();
    let msg = build_genl(
        GENL_ID_CTRL,
        NLM_F_REQUEST,
        seq,
        CTRL_CMD_GETFAMILY,
        1,
        &[(CTRL_ATTR_FAMILY_NAME, &n)],
    );
    let replies = sock.request(&msg, seq, false).map_err(|e| {
        if e.raw_os_error() == Some(libc::ENOENT) {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("generic netlink family {name:?} not found (is the module loaded?)"),
            )
        } else {
            e
        }
    })?;
    for m in replies {
        if m.payload.len() < GENL_HDRLEN {
            continue;
        }
        if let Some(id) =
            find_attr(&m.payload[GENL_HDRLEN..], CTRL_ATTR_FAMILY_ID).and_then(attr_u16)
        {
            return Ok(id);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidData,
        "no family id in CTRL_CMD_GETFAMILY reply",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attr_roundtrip_and_padding() {
        let mut b = Vec::new();
        put_attr(&mut b, 1, &[0xaa]);
        put_attr(&mut b, 0x8000 | 2, &[1, 2, 3, 4]);
        assert_eq!(b.len(), 8 + 8);
        assert_eq!(&b[..5], &[5, 0, 1, 0, 0xaa]);
        let v: Vec<_> = attrs(&b).collect();
        assert_eq!(v, vec![(1u16, &[0xaa][..]), (2u16, &[1, 2, 3, 4][..])]);
    }

    #[test]
    fn extack_message_after_capped_or_full_echo() {
        let mut tlv = Vec::new();
        put_attr(&mut tlv, NLMSGERR_ATTR_MSG, b"tcp-data-split is disabled\0");
        // capped: errno + the request's 16-byte header
        let mut capped = (-22i32).to_ne_bytes().to_vec();
        capped.extend_from_slice(&build_msg(0x20, NLM_F_REQUEST, 5, &[]));
        capped.extend_from_slice(&tlv);
        assert_eq!(
            extack_message(NLM_F_CAPPED | NLM_F_ACK_TLVS, &capped).as_deref(),
            Some("tcp-data-split is disabled")
        );
        // the whole request echoed (24 bytes here)
        let mut full = (-22i32).to_ne_bytes().to_vec();
        full.extend_from_slice(&build_msg(
            0x20,
            NLM_F_REQUEST,
            5,
            &[1, 2, 3, 4, 5, 6, 7, 8],
        ));
        full.extend_from_slice(&tlv);
        assert_eq!(
            extack_message(NLM_F_ACK_TLVS, &full).as_deref(),
            Some("tcp-data-split is disabled")
        );
        // no TLV flag, or a hostile echo length: nothing, no panic
        assert_eq!(extack_message(0, &full), None);
        let mut bad = full.clone();
        bad[4..8].copy_from_slice(&u32::MAX.to_ne_bytes());
        assert_eq!(extack_message(NLM_F_ACK_TLVS, &bad), None);
        assert_eq!(extack_message(NLM_F_ACK_TLVS, &[0; 3]), None);
        let e = NlError {
            error: io::Error::from_raw_os_error(libc::EINVAL),
            message: Some("tcp-data-split is disabled".into()),
        };
        assert!(
            e.to_string().ends_with("(tcp-data-split is disabled)"),
            "{e}"
        );
    }

    #[test]
    fn genl_header_layout() {
        let m = build_genl(0x1234, NLM_F_REQUEST | NLM_F_ACK, 7, 9, 1, &[]);
        assert_eq!(m.len(), 20);
        assert_eq!(u32::from_ne_bytes(m[0..4].try_into().unwrap()), 20);
        assert_eq!(u16::from_ne_bytes(m[4..6].try_into().unwrap()), 0x1234);
        assert_eq!(u16::from_ne_bytes(m[6..8].try_into().unwrap()), 5);
        assert_eq!(u32::from_ne_bytes(m[8..12].try_into().unwrap()), 7);
        assert_eq!(&m[16..20], &[9, 1, 0, 0]);
    }
}

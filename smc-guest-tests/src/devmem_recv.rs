//! `devmem-recv`: the receiver side of devmem TCP RX, written from the
//! kernel's uAPI (`Documentation/networking/devmem.rst`, "RX Interface"):
//! the counterpart of `stream server` for devmem, so that a benchmark
//! compares the device paths and not two different receivers.
//!
//! 1. A udmabuf stands in for device memory: a sealed memfd (`F_SEAL_SHRINK`)
//!    wrapped by `/dev/udmabuf`'s `UDMABUF_CREATE`, mapped read-only here.
//! 2. `NETDEV_CMD_BIND_RX` of the `netdev` generic netlink family binds it to
//!    one RX queue of the interface and answers the dmabuf id. The binding
//!    lives as long as that netlink socket: [`Binding`] keeps it open.
//! 3. The NIC setup is the caller's (header split on, RSS away from the
//!    queue, an ntuple rule steering the flow to it): `ncdevmem` runs
//!    `ethtool` for that; here the bench's guest script does, in plain sight.
//! 4. One connection is accepted and read with `recvmsg(MSG_SOCK_DEVMEM)`.
//!    Every `SCM_DEVMEM_DMABUF` control message names a frag in the dmabuf
//!    (offset, size, token); `SCM_DEVMEM_LINEAR` says that many bytes of the
//!    stream were copied into the iov. Every byte is checked against the
//!    pattern `ncdevmem -v M` validates ([`crate::devmem_send`] generates
//!    it), straight from the mapping, inside one `DMA_BUF_IOCTL_SYNC`
//!    start/end pair per `recvmsg`. The frags' tokens go back with
//!    `SO_DEVMEM_DONTNEED` after each `recvmsg`, coalesced into ranges, as
//!    few calls as the kernel's limits (128 ranges, 1024 frags) allow.
//!
//! Nothing the kernel hands back is trusted: a frag outside the mapping, of
//! another dmabuf, a malformed control message or a byte count the control
//! messages do not account for is an error, never a panic.
//!
//! The socket option numbers are those of `asm-generic/socket.h` (x86,
//! arm64, riscv and most other architectures).

use std::io;
use std::mem::size_of;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use crate::devmem_send::fill;
use crate::netlink::{self, NlSocket, NETLINK_GENERIC, NLA_F_NESTED, NLM_F_ACK, NLM_F_REQUEST};
use crate::sock::{Listener, Proto};

/// `recvmsg` flag: this reader takes devmem frags as control messages.
pub const MSG_SOCK_DEVMEM: libc::c_int = 0x0200_0000;
/// Control message: bytes copied into the iov (`struct dmabuf_cmsg`'s
/// `frag_size`).
pub const SCM_DEVMEM_LINEAR: libc::c_int = 78;
/// Control message: a frag in the dmabuf.
pub const SCM_DEVMEM_DMABUF: libc::c_int = 79;
/// Socket option returning frags: an array of `struct dmabuf_token`.
pub const SO_DEVMEM_DONTNEED: libc::c_int = 80;
/// Most `struct dmabuf_token`s one `SO_DEVMEM_DONTNEED` takes.
pub const MAX_DONTNEED_TOKENS: usize = 128;
/// Most frags (summed `token_count`) one `SO_DEVMEM_DONTNEED` frees.
pub const MAX_DONTNEED_FRAGS: u32 = 1024;
/// ncdevmem's udmabuf: 16000 pages.
pub const DEFAULT_DMABUF_PAGES: usize = 16000;

const NETDEV_CMD_BIND_RX: u8 = 13;
const NETDEV_A_DMABUF_IFINDEX: u16 = 1;
const NETDEV_A_DMABUF_QUEUES: u16 = 2;
const NETDEV_A_DMABUF_FD: u16 = 3;
const NETDEV_A_DMABUF_ID: u16 = 4;
const NETDEV_A_QUEUE_ID: u16 = 1;
const NETDEV_A_QUEUE_TYPE: u16 = 3;
const NETDEV_QUEUE_TYPE_RX: u32 = 0;

/// `_IOW(ty, nr, size)` of `asm-generic/ioctl.h`.
const fn iow(ty: u8, nr: u8, size: usize) -> u32 {
    (1 << 30) | ((size as u32) << 16) | ((ty as u32) << 8) | nr as u32
}

/// `struct udmabuf_create` (`linux/udmabuf.h`).
#[repr(C)]
struct UdmabufCreate {
    memfd: u32,
    flags: u32,
    offset: u64,
    size: u64,
}
const UDMABUF_FLAGS_CLOEXEC: u32 = 0x01;
/// `UDMABUF_CREATE`.
pub const UDMABUF_CREATE: u32 = iow(b'u', 0x42, size_of::<UdmabufCreate>());
/// `DMA_BUF_IOCTL_SYNC` (`struct dma_buf_sync { __u64 flags; }`).
pub const DMA_BUF_IOCTL_SYNC: u32 = iow(b'b', 0, size_of::<u64>());
const DMA_BUF_SYNC_READ: u64 = 1;
const DMA_BUF_SYNC_START: u64 = 0;
const DMA_BUF_SYNC_END: u64 = 4;

/// `struct dmabuf_cmsg` (`linux/uio.h`): the payload of both devmem
/// control messages.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DmabufCmsg {
    /// Offset of the frag in the dmabuf.
    pub frag_offset: u64,
    /// Bytes of the frag (for `SCM_DEVMEM_LINEAR`: bytes in the iov).
    pub frag_size: u32,
    /// Token to return with `SO_DEVMEM_DONTNEED`.
    pub frag_token: u32,
    /// The binding the frag belongs to.
    pub dmabuf_id: u32,
    /// Reserved.
    pub flags: u32,
}

impl DmabufCmsg {
    /// Size of the struct in a control message.
    pub const SIZE: usize = size_of::<DmabufCmsg>();

    /// Decodes the native-endian struct from `b` (at least [`Self::SIZE`]).
    pub fn decode(b: &[u8]) -> Option<DmabufCmsg> {
        let u32_at = |o: usize| Some(u32::from_ne_bytes(b.get(o..o + 4)?.try_into().ok()?));
        Some(DmabufCmsg {
            frag_offset: u64::from_ne_bytes(b.get(0..8)?.try_into().ok()?),
            frag_size: u32_at(8)?,
            frag_token: u32_at(12)?,
            dmabuf_id: u32_at(16)?,
            flags: u32_at(20)?,
        })
    }

    /// The native-endian bytes (tests build control messages with it).
    pub fn encode(&self) -> [u8; Self::SIZE] {
        let mut b = [0u8; Self::SIZE];
        b[0..8].copy_from_slice(&self.frag_offset.to_ne_bytes());
        b[8..12].copy_from_slice(&self.frag_size.to_ne_bytes());
        b[12..16].copy_from_slice(&self.frag_token.to_ne_bytes());
        b[16..20].copy_from_slice(&self.dmabuf_id.to_ne_bytes());
        b[20..24].copy_from_slice(&self.flags.to_ne_bytes());
        b
    }
}

/// `struct dmabuf_token`: `token_count` frags from `token_start` on.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DmabufToken {
    /// First token.
    pub token_start: u32,
    /// Number of consecutive tokens.
    pub token_count: u32,
}

/// One devmem control message of a `recvmsg`, in stream order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DevmemCmsg {
    /// `size` bytes of the stream are the next bytes of the iov.
    Linear {
        /// Bytes copied into the iov.
        size: u32,
    },
    /// The next `frag_size` bytes of the stream are in the dmabuf.
    Dmabuf(DmabufCmsg),
}

/// Where a byte was read from (for mismatch messages).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// A dmabuf frag starting at this dmabuf offset.
    Dmabuf {
        /// The frag's offset in the dmabuf.
        frag_offset: u64,
    },
    /// The iov, announced by `SCM_DEVMEM_LINEAR`.
    Linear,
    /// The iov, without any devmem control message (not devmem at all).
    Ordinary,
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Place::Dmabuf { frag_offset } => write!(f, "dmabuf frag at offset {frag_offset}"),
            Place::Linear => f.write_str("linear bytes in the iov"),
            Place::Ordinary => f.write_str("ordinary data in the iov"),
        }
    }
}

/// What went wrong. Each message is complete (the underlying error is
/// part of it, not a separate `source()`, so a chain printer says it once).
#[derive(Debug, thiserror::Error)]
pub enum DevmemError {
    /// A system call failed.
    #[error("{what}: {error}")]
    Os {
        /// The step that failed.
        what: String,
        /// The error.
        error: io::Error,
    },
    /// The netlink bind failed.
    #[error("netdev bind-rx of the dmabuf to {ifname} rx queue(s) {queues:?}: {error}")]
    Bind {
        /// Interface.
        ifname: String,
        /// RX queues asked for.
        queues: Vec<u32>,
        /// The kernel's answer.
        error: netlink::NlError,
    },
    /// Bad arguments.
    #[error("{0}")]
    Config(String),
    /// A malformed or unexpected control message.
    #[error("bad control message from recvmsg: {0}")]
    BadCmsg(String),
    /// The kernel had more control messages than room (frags would leak).
    #[error("recvmsg control data truncated (MSG_CTRUNC)")]
    CmsgTruncated,
    /// A frag not inside the mapping.
    #[error("frag at dmabuf offset {offset} of {size} bytes lies outside the {len}-byte dmabuf")]
    FragOutOfBounds {
        /// frag_offset.
        offset: u64,
        /// frag_size.
        size: u32,
        /// The mapping's length.
        len: usize,
    },
    /// A frag of a dmabuf this receiver did not bind.
    #[error("frag of dmabuf id {got}, but the bound dmabuf is {want}: flow steering error")]
    WrongDmabuf {
        /// The frag's dmabuf_id.
        got: u32,
        /// Ours.
        want: u32,
    },
    /// Linear bytes beyond what recvmsg returned.
    #[error("SCM_DEVMEM_LINEAR of {size} bytes at iov offset {at} overruns the {ret} bytes recvmsg returned")]
    LinearOverrun {
        /// Iov bytes already accounted for.
        at: usize,
        /// The cmsg's frag_size.
        size: u32,
        /// recvmsg's return.
        ret: usize,
    },
    /// The control messages do not add up to recvmsg's return.
    #[error("recvmsg returned {ret} bytes but its control messages account for {accounted}")]
    Unaccounted {
        /// recvmsg's return.
        ret: usize,
        /// Sum of the frags' sizes.
        accounted: u64,
    },
    /// Plain TCP data where devmem frags were expected.
    #[error("{bytes} bytes at stream offset {offset} arrived as ordinary (non-devmem) data: the flow is not steered to the bound queue (--allow-ordinary accepts it)")]
    OrdinaryData {
        /// Stream offset.
        offset: u64,
        /// Bytes.
        bytes: usize,
    },
    /// A byte that is not the pattern's.
    #[error(
        "data mismatch at stream offset {offset} ({place}): expected {expected}, got {actual}"
    )]
    Mismatch {
        /// Stream offset of the first wrong byte.
        offset: u64,
        /// The pattern's byte.
        expected: u8,
        /// The received byte.
        actual: u8,
        /// Where it was read.
        place: Place,
    },
    /// SO_DEVMEM_DONTNEED freed fewer frags than asked.
    #[error("SO_DEVMEM_DONTNEED freed {freed} of {asked} frags (unknown or repeated tokens)")]
    TokensNotFreed {
        /// The kernel's return.
        freed: u32,
        /// Frags in the call.
        asked: u32,
    },
    /// EOF before the expected byte count.
    #[error("short read: the peer closed after {got} of {want} bytes")]
    Short {
        /// Bytes received.
        got: u64,
        /// Bytes expected.
        want: u64,
    },
    /// More bytes than expected.
    #[error("received {got} bytes, more than the {want} expected")]
    Excess {
        /// Bytes received so far.
        got: u64,
        /// Bytes expected.
        want: u64,
    },
}

fn os(what: impl Into<String>) -> impl FnOnce(io::Error) -> DevmemError {
    let what = what.into();
    move |error| DevmemError::Os { what, error }
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// The system's page size.
pub fn page_size() -> usize {
    // SAFETY: plain syscall.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

// ---------------------------------------------------------------------------
// validation

/// Checks a stream, in order, against the pattern `ncdevmem -v modulus`
/// validates. Compares against a precomputed window of the (periodic)
/// pattern, so a chunk costs a `memcmp`.
#[derive(Debug, Clone)]
pub struct Validator {
    modulus: u8,
    offset: u64,
    window: usize,
    pattern: Vec<u8>,
}

impl Validator {
    /// A validator at stream offset 0; `modulus` is 2..=255.
    pub fn new(modulus: u8) -> Validator {
        let m = usize::from(modulus.max(2));
        let window = ((64 << 10) / m).max(1) * m;
        // window + one period, so any phase has `window` bytes after it
        let mut pattern = vec![0u8; window + m];
        fill(&mut pattern, 0, m as u8);
        Validator {
            modulus: m as u8,
            offset: 0,
            window,
            pattern,
        }
    }

    /// Bytes validated so far (the stream offset of the next byte).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Checks the next `data.len()` bytes of the stream.
    pub fn check(&mut self, data: &[u8], place: Place) -> Result<(), DevmemError> {
        let m = u64::from(self.modulus);
        let mut rest = data;
        while !rest.is_empty() {
            let phase = (self.offset % m) as usize;
            let n = rest.len().min(self.window);
            let want = &self.pattern[phase..phase + n];
            let got = &rest[..n];
            if got != want {
                let i = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
                return Err(DevmemError::Mismatch {
                    offset: self.offset + i as u64,
                    expected: want[i],
                    actual: got[i],
                    place,
                });
            }
            self.offset += n as u64;
            rest = &rest[n..];
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// control messages

/// Alignment of control messages (`CMSG_ALIGN`: the size of `size_t`).
const CMSG_ALIGN: usize = size_of::<usize>();
const fn cmsg_align(n: usize) -> usize {
    (n + CMSG_ALIGN - 1) & !(CMSG_ALIGN - 1)
}
/// `CMSG_LEN(0)`: where a control message's data starts.
const CMSG_DATA_OFF: usize = cmsg_align(size_of::<libc::cmsghdr>());
/// `CMSG_SPACE(sizeof(struct dmabuf_cmsg))`: room one devmem cmsg takes.
pub const DEVMEM_CMSG_SPACE: usize = CMSG_DATA_OFF + cmsg_align(DmabufCmsg::SIZE);

/// Decodes the control data of one `recvmsg` (its first `msg_controllen`
/// bytes) into `out`, in order. Only `SOL_SOCKET` devmem messages are
/// expected: anything else, or a malformed header, is an error.
pub fn parse_cmsgs(ctrl: &[u8], out: &mut Vec<DevmemCmsg>) -> Result<(), DevmemError> {
    out.clear();
    let hdr = size_of::<libc::cmsghdr>();
    let mut off = 0usize;
    while off < ctrl.len() {
        let rest = &ctrl[off..];
        if rest.len() < hdr {
            return Err(DevmemError::BadCmsg(format!(
                "{} stray bytes after the last control message",
                rest.len()
            )));
        }
        // SAFETY: `rest` holds at least one cmsghdr; read_unaligned copes
        // with any alignment, and every bit pattern is a valid cmsghdr.
        let h: libc::cmsghdr = unsafe { std::ptr::read_unaligned(rest.as_ptr().cast()) };
        // size_t on glibc, socklen_t on musl
        #[allow(clippy::unnecessary_cast)]
        let len = h.cmsg_len as usize;
        if len < CMSG_DATA_OFF || len > rest.len() {
            return Err(DevmemError::BadCmsg(format!(
                "cmsg_len {len} at control offset {off} (header {CMSG_DATA_OFF}, {} bytes left)",
                rest.len()
            )));
        }
        let data = &rest[CMSG_DATA_OFF..len];
        if h.cmsg_level != libc::SOL_SOCKET
            || (h.cmsg_type != SCM_DEVMEM_LINEAR && h.cmsg_type != SCM_DEVMEM_DMABUF)
        {
            return Err(DevmemError::BadCmsg(format!(
                "unexpected level {} type {} (want SOL_SOCKET SCM_DEVMEM_LINEAR/DMABUF)",
                h.cmsg_level, h.cmsg_type
            )));
        }
        let c = DmabufCmsg::decode(data).ok_or_else(|| {
            DevmemError::BadCmsg(format!(
                "devmem cmsg of {} data bytes, want {}",
                data.len(),
                DmabufCmsg::SIZE
            ))
        })?;
        out.push(if h.cmsg_type == SCM_DEVMEM_LINEAR {
            DevmemCmsg::Linear { size: c.frag_size }
        } else {
            DevmemCmsg::Dmabuf(c)
        });
        // the last message's padding may be cut off
        off = off.saturating_add(cmsg_align(len));
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// tokens

/// Tokens of frags read and not yet returned, coalesced into ranges of
/// consecutive tokens.
#[derive(Debug, Default, Clone)]
pub struct TokenBatch {
    ranges: Vec<DmabufToken>,
    frags: u64,
    call: Vec<DmabufToken>,
}

impl TokenBatch {
    /// Frags pending.
    pub fn pending(&self) -> u64 {
        self.frags
    }

    /// The pending ranges.
    pub fn ranges(&self) -> &[DmabufToken] {
        &self.ranges
    }

    /// Adds one frag's token.
    pub fn push(&mut self, token: u32) {
        self.frags += 1;
        if let Some(last) = self.ranges.last_mut() {
            if last.token_count < MAX_DONTNEED_FRAGS
                && last.token_start.checked_add(last.token_count) == Some(token)
            {
                last.token_count += 1;
                return;
            }
        }
        self.ranges.push(DmabufToken {
            token_start: token,
            token_count: 1,
        });
    }

    /// Returns every pending token through `give` (one `SO_DEVMEM_DONTNEED`
    /// each: at most [`MAX_DONTNEED_TOKENS`] ranges and
    /// [`MAX_DONTNEED_FRAGS`] frags, a range split across calls where
    /// needed), which answers how many frags the kernel freed. Answers the
    /// number of calls; the batch is empty afterwards, even on error.
    pub fn flush(
        &mut self,
        mut give: impl FnMut(&[DmabufToken]) -> io::Result<u32>,
    ) -> Result<u32, DevmemError> {
        let mut calls = 0u32;
        let mut call = std::mem::take(&mut self.call);
        call.clear();
        let mut in_call = 0u32;
        let mut send = |call: &mut Vec<DmabufToken>, in_call: &mut u32| {
            calls += 1;
            let freed = give(call).map_err(os("setsockopt(SO_DEVMEM_DONTNEED)"))?;
            let asked = *in_call;
            call.clear();
            *in_call = 0;
            if freed != asked {
                return Err(DevmemError::TokensNotFreed { freed, asked });
            }
            Ok(())
        };
        let mut r = Ok(());
        'all: for range in &self.ranges {
            let mut range = *range;
            while range.token_count > 0 {
                let take = range.token_count.min(MAX_DONTNEED_FRAGS - in_call);
                call.push(DmabufToken {
                    token_start: range.token_start,
                    token_count: take,
                });
                in_call += take;
                range.token_start = range.token_start.wrapping_add(take);
                range.token_count -= take;
                if call.len() == MAX_DONTNEED_TOKENS || in_call == MAX_DONTNEED_FRAGS {
                    r = send(&mut call, &mut in_call);
                    if r.is_err() {
                        break 'all;
                    }
                }
            }
        }
        if r.is_ok() && !call.is_empty() {
            r = send(&mut call, &mut in_call);
        }
        call.clear();
        self.call = call;
        self.ranges.clear();
        self.frags = 0;
        r.map(|()| calls)
    }
}

/// `setsockopt(SO_DEVMEM_DONTNEED)` of `tokens` on `fd`: frags freed.
pub fn dontneed(fd: RawFd, tokens: &[DmabufToken]) -> io::Result<u32> {
    // SAFETY: `tokens` is a live array of repr(C) dmabuf_token of that length.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            SO_DEVMEM_DONTNEED,
            tokens.as_ptr().cast(),
            std::mem::size_of_val(tokens) as libc::socklen_t,
        )
    };
    cvt(r).map(|n| n as u32)
}

// ---------------------------------------------------------------------------
// the memory frags land in

/// Memory the bound queue's frags land in.
pub trait FragMemory {
    /// Bytes mapped.
    fn size(&self) -> usize;
    /// The bytes `[off, off + len)`, or `None` outside the mapping.
    fn bytes(&self, off: u64, len: u32) -> Option<&[u8]>;
    /// Before the CPU reads frags (`DMA_BUF_SYNC_START | DMA_BUF_SYNC_READ`).
    fn begin_read(&self) -> io::Result<()> {
        Ok(())
    }
    /// After the CPU read them (`DMA_BUF_SYNC_END | DMA_BUF_SYNC_READ`).
    fn end_read(&self) -> io::Result<()> {
        Ok(())
    }
}

impl FragMemory for [u8] {
    fn size(&self) -> usize {
        self.len()
    }
    fn bytes(&self, off: u64, len: u32) -> Option<&[u8]> {
        let start = usize::try_from(off).ok()?;
        self.get(start..start.checked_add(len as usize)?)
    }
}

/// A udmabuf over a sealed memfd, mapped read-only.
#[derive(Debug)]
pub struct Udmabuf {
    ptr: NonNull<u8>,
    len: usize,
    dmabuf: OwnedFd,
    _memfd: OwnedFd,
    _dev: OwnedFd,
}

impl Udmabuf {
    /// A udmabuf of `size` bytes (a multiple of the page size; the udmabuf
    /// module refuses more than its `size_limit_mb`: 64 by default on 6.12,
    /// unlimited on 7.3).
    pub fn create(size: usize) -> Result<Udmabuf, DevmemError> {
        let page = page_size();
        if size == 0 || !size.is_multiple_of(page) {
            return Err(DevmemError::Config(format!(
                "dmabuf size {size} is not a positive multiple of the page size {page}"
            )));
        }
        // SAFETY: plain syscall on a NUL-terminated path.
        let dev =
            cvt(unsafe { libc::open(c"/dev/udmabuf".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) })
                .map_err(os("open /dev/udmabuf (CONFIG_UDMABUF)"))?;
        // SAFETY: fresh descriptor we own.
        let dev = unsafe { OwnedFd::from_raw_fd(dev) };
        // SAFETY: plain syscall on a NUL-terminated name.
        let memfd = cvt(unsafe {
            libc::memfd_create(
                c"devmem-recv".as_ptr(),
                libc::MFD_ALLOW_SEALING | libc::MFD_CLOEXEC,
            )
        })
        .map_err(os("memfd_create"))?;
        // SAFETY: fresh descriptor we own.
        let memfd = unsafe { OwnedFd::from_raw_fd(memfd) };
        // SAFETY: plain syscalls on our descriptor.
        cvt(unsafe { libc::fcntl(memfd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) })
            .map_err(os("fcntl(F_ADD_SEALS, F_SEAL_SHRINK)"))?;
        let len = libc::off_t::try_from(size)
            .map_err(|_| DevmemError::Config(format!("dmabuf size {size} too large")))?;
        // SAFETY: plain syscall on our descriptor.
        cvt(unsafe { libc::ftruncate(memfd.as_raw_fd(), len) })
            .map_err(os(format!("ftruncate(memfd, {size})")))?;
        let create = UdmabufCreate {
            memfd: memfd.as_raw_fd() as u32,
            flags: UDMABUF_FLAGS_CLOEXEC,
            offset: 0,
            size: size as u64,
        };
        // SAFETY: the ioctl reads a live udmabuf_create of the size its
        // number encodes.
        let fd = cvt(unsafe {
            libc::ioctl(
                dev.as_raw_fd(),
                UDMABUF_CREATE as _,
                &create as *const UdmabufCreate,
            )
        })
        .map_err(os(format!(
            "UDMABUF_CREATE of {size} bytes (above /sys/module/udmabuf/parameters/size_limit_mb?)"
        )))?;
        // SAFETY: fresh descriptor we own.
        let dmabuf = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: a new shared read-only mapping of the dmabuf; nothing else
        // is mapped at the address the kernel picks.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ,
                libc::MAP_SHARED,
                dmabuf.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(os("mmap of the udmabuf")(io::Error::last_os_error()));
        }
        let ptr = NonNull::new(p.cast::<u8>())
            .ok_or_else(|| DevmemError::Config("mmap returned NULL".into()))?;
        Ok(Udmabuf {
            ptr,
            len: size,
            dmabuf,
            _memfd: memfd,
            _dev: dev,
        })
    }

    /// The dmabuf descriptor (for the netlink bind).
    pub fn fd(&self) -> RawFd {
        self.dmabuf.as_raw_fd()
    }

    fn sync(&self, flags: u64) -> io::Result<()> {
        // SAFETY: the ioctl reads a live `struct dma_buf_sync` (one u64).
        cvt(unsafe { libc::ioctl(self.fd(), DMA_BUF_IOCTL_SYNC as _, &flags as *const u64) })
            .map(drop)
    }
}

impl FragMemory for Udmabuf {
    fn size(&self) -> usize {
        self.len
    }
    fn bytes(&self, off: u64, len: u32) -> Option<&[u8]> {
        let start = usize::try_from(off).ok()?;
        let end = start.checked_add(len as usize)?;
        if end > self.len {
            return None;
        }
        // SAFETY: [start, end) lies inside the live mapping. The range is a
        // frag the kernel handed to this socket: the NIC does not write it
        // again until its token is returned, which happens after the slice
        // is dropped (the caller validates, then returns tokens).
        Some(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(start), len as usize) })
    }
    fn begin_read(&self) -> io::Result<()> {
        self.sync(DMA_BUF_SYNC_START | DMA_BUF_SYNC_READ)
    }
    fn end_read(&self) -> io::Result<()> {
        self.sync(DMA_BUF_SYNC_END | DMA_BUF_SYNC_READ)
    }
}

impl Drop for Udmabuf {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `create` made; no slice of it
        // outlives `self`.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

// ---------------------------------------------------------------------------
// netlink bind

/// The `NETDEV_CMD_BIND_RX` request: ifindex, the dmabuf fd, one nested
/// queue attribute (type rx, id) per queue.
pub fn bind_rx_request(family: u16, seq: u32, ifindex: u32, fd: u32, queues: &[u32]) -> Vec<u8> {
    let nests: Vec<Vec<u8>> = queues
        .iter()
        .map(|q| {
            let mut n = Vec::new();
            netlink::put_attr(&mut n, NETDEV_A_QUEUE_ID, &q.to_ne_bytes());
            netlink::put_attr(
                &mut n,
                NETDEV_A_QUEUE_TYPE,
                &NETDEV_QUEUE_TYPE_RX.to_ne_bytes(),
            );
            n
        })
        .collect();
    let ifindex = ifindex.to_ne_bytes();
    let fd = fd.to_ne_bytes();
    let mut attrs: Vec<(u16, &[u8])> = vec![(NETDEV_A_DMABUF_IFINDEX, &ifindex)];
    attrs.push((NETDEV_A_DMABUF_FD, &fd));
    for n in &nests {
        attrs.push((NETDEV_A_DMABUF_QUEUES | NLA_F_NESTED, n));
    }
    netlink::build_genl(
        family,
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
        NETDEV_CMD_BIND_RX,
        1,
        &attrs,
    )
}

/// The dmabuf id in a `NETDEV_CMD_BIND_RX` reply (genl header + attributes).
pub fn bind_rx_reply_id(payload: &[u8]) -> Option<u32> {
    netlink::find_attr(payload.get(netlink::GENL_HDRLEN..)?, NETDEV_A_DMABUF_ID)
        .and_then(netlink::attr_u32)
}

/// A dmabuf bound to RX queues; unbound when dropped (the kernel unbinds
/// when the netlink socket that bound it closes).
#[derive(Debug)]
pub struct Binding {
    _sock: NlSocket,
    /// The dmabuf id the kernel gave the binding.
    pub id: u32,
}

/// Binds the dmabuf `fd` to RX `queues` of interface `ifindex`.
pub fn bind_rx(
    ifname: &str,
    ifindex: u32,
    fd: RawFd,
    queues: &[u32],
) -> Result<Binding, DevmemError> {
    let mut sock = NlSocket::open(NETLINK_GENERIC).map_err(os("netlink socket"))?;
    let family = netlink::genl_family_id(&mut sock, "netdev").map_err(os("netdev family"))?;
    let seq = sock.next_seq();
    let req = bind_rx_request(family, seq, ifindex, fd as u32, queues);
    let replies = sock
        .request_ext(&req, seq, false)
        .map_err(|error| DevmemError::Bind {
            ifname: ifname.into(),
            queues: queues.to_vec(),
            error,
        })?;
    let id = replies
        .iter()
        .find_map(|m| bind_rx_reply_id(&m.payload))
        .ok_or_else(|| DevmemError::BadCmsg("NETDEV_CMD_BIND_RX reply without an id".into()))?;
    Ok(Binding { _sock: sock, id })
}

// ---------------------------------------------------------------------------
// receiving

/// Counters of one receive.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RxCounters {
    /// Stream bytes received and validated.
    pub bytes: u64,
    /// Of those, in dmabuf frags.
    pub dmabuf_bytes: u64,
    /// dmabuf frags.
    pub frags: u64,
    /// Bytes announced by SCM_DEVMEM_LINEAR (copied into the iov).
    pub linear_bytes: u64,
    /// Bytes without any devmem control message.
    pub ordinary_bytes: u64,
    /// recvmsg calls (the final EOF one included).
    pub recvmsgs: u64,
    /// SO_DEVMEM_DONTNEED calls.
    pub dontneed_calls: u64,
    /// DMA_BUF_IOCTL_SYNC start/end pairs.
    pub syncs: u64,
}

/// The receive state: validation position, pending tokens, counters.
#[derive(Debug)]
pub struct Rx {
    validator: Validator,
    tokens: TokenBatch,
    dmabuf_id: u32,
    allow_ordinary: bool,
    /// Reads with `MSG_SOCK_DEVMEM` (false: `--ordinary`, plain recvmsg).
    devmem: bool,
    /// What was received so far.
    pub counters: RxCounters,
}

impl Rx {
    /// State for the binding `dmabuf_id` and the pattern `-v modulus`.
    pub fn new(dmabuf_id: u32, modulus: u8, allow_ordinary: bool) -> Rx {
        Rx {
            validator: Validator::new(modulus),
            tokens: TokenBatch::default(),
            dmabuf_id,
            allow_ordinary,
            devmem: true,
            counters: RxCounters::default(),
        }
    }

    /// State for `--ordinary`: no dmabuf, plain `recvmsg` (no
    /// `MSG_SOCK_DEVMEM`), every byte must arrive as ordinary data and is
    /// validated as in devmem mode; a devmem control message is an error.
    pub fn ordinary(modulus: u8) -> Rx {
        Rx {
            devmem: false,
            ..Rx::new(0, modulus, true)
        }
    }

    /// Whether this receive reads with `MSG_SOCK_DEVMEM`.
    pub fn devmem(&self) -> bool {
        self.devmem
    }

    /// Tokens pending return.
    pub fn tokens(&self) -> &TokenBatch {
        &self.tokens
    }

    /// Accounts for and validates one `recvmsg` that returned `ret` bytes,
    /// the iov `iov` and the control messages `cmsgs`; queues its tokens.
    pub fn on_recv(
        &mut self,
        ret: usize,
        iov: &[u8],
        cmsgs: &[DevmemCmsg],
        mem: &(impl FragMemory + ?Sized),
    ) -> Result<(), DevmemError> {
        if ret > iov.len() {
            return Err(DevmemError::Unaccounted {
                ret,
                accounted: iov.len() as u64,
            });
        }
        if !self.devmem && !cmsgs.is_empty() {
            return Err(DevmemError::BadCmsg(format!(
                "{} devmem control message(s) on a recvmsg without MSG_SOCK_DEVMEM (--ordinary)",
                cmsgs.len()
            )));
        }
        if cmsgs.is_empty() {
            if !self.allow_ordinary {
                return Err(DevmemError::OrdinaryData {
                    offset: self.validator.offset(),
                    bytes: ret,
                });
            }
            self.validator.check(&iov[..ret], Place::Ordinary)?;
            self.counters.ordinary_bytes += ret as u64;
            self.counters.bytes += ret as u64;
            return Ok(());
        }
        let reads_dmabuf = cmsgs.iter().any(|c| matches!(c, DevmemCmsg::Dmabuf(_)));
        if reads_dmabuf {
            mem.begin_read()
                .map_err(os("DMA_BUF_IOCTL_SYNC(START|READ)"))?;
            self.counters.syncs += 1;
        }
        let r = self.walk(ret, iov, cmsgs, mem);
        if reads_dmabuf {
            let end = mem.end_read().map_err(os("DMA_BUF_IOCTL_SYNC(END|READ)"));
            r?;
            return end;
        }
        r
    }

    fn walk(
        &mut self,
        ret: usize,
        iov: &[u8],
        cmsgs: &[DevmemCmsg],
        mem: &(impl FragMemory + ?Sized),
    ) -> Result<(), DevmemError> {
        let mut at = 0usize;
        let mut accounted = 0u64;
        for c in cmsgs {
            match *c {
                DevmemCmsg::Linear { size } => {
                    let end = at
                        .checked_add(size as usize)
                        .filter(|&e| e <= ret)
                        .ok_or(DevmemError::LinearOverrun { at, size, ret })?;
                    self.validator.check(&iov[at..end], Place::Linear)?;
                    at = end;
                    self.counters.linear_bytes += u64::from(size);
                    accounted += u64::from(size);
                }
                DevmemCmsg::Dmabuf(d) => {
                    if d.dmabuf_id != self.dmabuf_id {
                        return Err(DevmemError::WrongDmabuf {
                            got: d.dmabuf_id,
                            want: self.dmabuf_id,
                        });
                    }
                    // The frag is ours from here on: return it even if it
                    // turns out bad (the error closes the socket anyway).
                    self.tokens.push(d.frag_token);
                    let data = mem.bytes(d.frag_offset, d.frag_size).ok_or(
                        DevmemError::FragOutOfBounds {
                            offset: d.frag_offset,
                            size: d.frag_size,
                            len: mem.size(),
                        },
                    )?;
                    self.validator.check(
                        data,
                        Place::Dmabuf {
                            frag_offset: d.frag_offset,
                        },
                    )?;
                    self.counters.frags += 1;
                    self.counters.dmabuf_bytes += u64::from(d.frag_size);
                    accounted += u64::from(d.frag_size);
                }
            }
        }
        if accounted != ret as u64 {
            return Err(DevmemError::Unaccounted { ret, accounted });
        }
        self.counters.bytes += ret as u64;
        Ok(())
    }

    /// Returns the pending tokens through `give` (see [`TokenBatch::flush`]).
    pub fn return_tokens(
        &mut self,
        give: impl FnMut(&[DmabufToken]) -> io::Result<u32>,
    ) -> Result<(), DevmemError> {
        if self.tokens.pending() == 0 {
            return Ok(());
        }
        let calls = self.tokens.flush(give)?;
        self.counters.dontneed_calls += u64::from(calls);
        Ok(())
    }
}

/// Control buffer size for an iov of `recv_size` bytes: room for a frag
/// every 512 bytes (if there are more, recvmsg returns fewer bytes).
pub fn ctrl_size(recv_size: usize) -> usize {
    (recv_size / 512 + 1)
        .saturating_mul(DEVMEM_CMSG_SPACE)
        .max(4096)
}

/// Reads `fd` until EOF with `recvmsg(MSG_SOCK_DEVMEM)` into `rx`, frags
/// from `mem`; returns each call's tokens before the next. `expect`: the
/// byte count the stream must have. For [`Rx::ordinary`] the same loop
/// without `MSG_SOCK_DEVMEM` (ordinary TCP into the iov, no frags).
pub fn receive(
    fd: RawFd,
    rx: &mut Rx,
    mem: &(impl FragMemory + ?Sized),
    recv_size: usize,
    expect: Option<u64>,
) -> Result<(), DevmemError> {
    let mut iov = vec![0u8; recv_size.max(1)];
    // u64s: a control buffer aligned for cmsghdr
    let mut ctrl = vec![0u64; ctrl_size(recv_size).div_ceil(8)];
    let ctrl_bytes = ctrl.len() * 8;
    let mut cmsgs = Vec::new();
    let flags = if rx.devmem { MSG_SOCK_DEVMEM } else { 0 };
    loop {
        let mut io = libc::iovec {
            iov_base: iov.as_mut_ptr().cast(),
            iov_len: iov.len(),
        };
        // SAFETY: zeroed msghdr is valid (no name, no iov yet).
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut io;
        msg.msg_iovlen = 1;
        msg.msg_control = ctrl.as_mut_ptr().cast();
        msg.msg_controllen = ctrl_bytes as _;
        // SAFETY: msg points at live buffers of the lengths it states.
        let n = unsafe { libc::recvmsg(fd, &mut msg, flags) };
        rx.counters.recvmsgs += 1;
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            let at = rx.counters.bytes;
            return Err(os(if e.kind() == io::ErrorKind::WouldBlock {
                format!("recvmsg after {at} bytes: no data within the I/O timeout")
            } else {
                format!("recvmsg after {at} bytes")
            })(e));
        }
        if n == 0 {
            break;
        }
        if msg.msg_flags & libc::MSG_CTRUNC != 0 {
            return Err(DevmemError::CmsgTruncated);
        }
        #[allow(clippy::unnecessary_cast)]
        let clen = (msg.msg_controllen as usize).min(ctrl_bytes);
        // SAFETY: the first ctrl_bytes bytes of the u64 buffer, as bytes.
        let cbytes = unsafe { std::slice::from_raw_parts(ctrl.as_ptr().cast::<u8>(), clen) };
        parse_cmsgs(cbytes, &mut cmsgs)?;
        let r = rx.on_recv(n as usize, &iov, &cmsgs, mem);
        // return what this call pinned, even when it was bad
        let t = rx.return_tokens(|t| dontneed(fd, t));
        r?;
        t?;
        if let Some(want) = expect {
            if rx.counters.bytes > want {
                return Err(DevmemError::Excess {
                    got: rx.counters.bytes,
                    want,
                });
            }
        }
    }
    match expect {
        Some(want) if rx.counters.bytes < want => Err(DevmemError::Short {
            got: rx.counters.bytes,
            want,
        }),
        _ => Ok(()),
    }
}

/// What to receive, and how.
#[derive(Debug, Clone)]
pub struct RecvConfig {
    /// Interface.
    pub ifname: String,
    /// RX queue to bind (`None`: the last one, as ncdevmem).
    pub queue: Option<u32>,
    /// Address to listen on.
    pub listen: SocketAddr,
    /// Bytes the stream must have (`None`: whatever comes before EOF).
    pub bytes: Option<u64>,
    /// ncdevmem's `-v` value.
    pub modulus: u8,
    /// udmabuf size (`None`: ncdevmem's 16000 pages).
    pub dmabuf_size: Option<usize>,
    /// iov size: most bytes one recvmsg returns.
    pub recv_size: usize,
    /// Give up if nobody connects in time.
    pub accept_timeout: Option<Duration>,
    /// SO_RCVTIMEO on the connection.
    pub io_timeout: Option<Duration>,
    /// Accept (and validate) data that did not come as devmem.
    pub allow_ordinary: bool,
    /// No dmabuf and no bind at all: plain `recvmsg` of ordinary TCP on
    /// any interface, validated the same (`ifname`, `queue`,
    /// `dmabuf_size` and `allow_ordinary` are not used).
    pub ordinary: bool,
}

/// The outcome of a receive that passed.
#[derive(Debug, Clone)]
pub struct RecvReport {
    /// Counters.
    pub counters: RxCounters,
    /// The interface's RX queue bound (`None`: `--ordinary`).
    pub queue: Option<u32>,
    /// The binding's id (`None`: `--ordinary`).
    pub dmabuf_id: Option<u32>,
    /// udmabuf bytes (0: `--ordinary`).
    pub dmabuf_size: usize,
    /// The sender.
    pub peer: Option<SocketAddr>,
    /// The address listened on.
    pub listen: SocketAddr,
    /// Accept to EOF.
    pub secs: f64,
    /// CPU seconds of this process over the same span.
    pub cpu_secs: f64,
}

impl RecvReport {
    /// MiB/s from accept to EOF.
    pub fn mibps(&self) -> f64 {
        if self.secs > 0.0 {
            self.counters.bytes as f64 / (1u64 << 20) as f64 / self.secs
        } else {
            0.0
        }
    }

    /// CPU seconds per GiB received.
    pub fn cpu_s_per_gib(&self) -> f64 {
        let gib = self.counters.bytes as f64 / (1u64 << 30) as f64;
        if gib > 0.0 {
            self.cpu_secs / gib
        } else {
            0.0
        }
    }

    /// The machine-readable line, in the style of `STREAM-RESULT`
    /// (`queue=-  dmabuf_id=-` and `mode=ordinary` for `--ordinary`).
    pub fn result_line(&self) -> String {
        let c = &self.counters;
        let opt = |v: Option<u32>| v.map_or_else(|| "-".to_string(), |v| v.to_string());
        format!(
            "DEVMEM-RESULT listen={} bytes={} frags={} dmabuf_bytes={} linear_bytes={} ordinary_bytes={} recvmsgs={} dontneed_calls={} syncs={} queue={} dmabuf_id={} dmabuf_size={} mode={} verified=1 status=pass secs={:.6} mibps={:.2} cpu_s={:.4} cpu_s_per_gib={:.4}",
            self.listen,
            c.bytes,
            c.frags,
            c.dmabuf_bytes,
            c.linear_bytes,
            c.ordinary_bytes,
            c.recvmsgs,
            c.dontneed_calls,
            c.syncs,
            opt(self.queue),
            opt(self.dmabuf_id),
            self.dmabuf_size,
            if self.dmabuf_id.is_some() {
                "devmem"
            } else {
                "ordinary"
            },
            self.secs,
            self.mibps(),
            self.cpu_secs,
            self.cpu_s_per_gib(),
        )
    }
}

/// RX queues of `ifname` (`/sys/class/net/IF/queues/rx-*`).
pub fn rx_queue_count(ifname: &str) -> io::Result<u32> {
    let dir = std::fs::read_dir(format!("/sys/class/net/{ifname}/queues"))?;
    let mut n = 0u32;
    for e in dir {
        if e?.file_name().to_string_lossy().starts_with("rx-") {
            n += 1;
        }
    }
    Ok(n)
}

/// Creates the udmabuf, binds it, accepts one connection on `cfg.listen`
/// and receives until EOF; `log` gets the human progress lines. With
/// `cfg.ordinary`: no udmabuf and no bind, plain `recvmsg` (any interface).
pub fn run(cfg: &RecvConfig, mut log: impl FnMut(String)) -> Result<RecvReport, DevmemError> {
    if cfg.modulus < 2 {
        return Err(DevmemError::Config("--pattern-mod must be 2..=255".into()));
    }
    if cfg.ordinary {
        log("devmem-recv: --ordinary: no dmabuf, plain recvmsg".into());
        let mut rx = Rx::ordinary(cfg.modulus);
        return accept_and_receive(cfg, &mut rx, &[0u8; 0][..], &mut log).map(
            |(peer, secs, cpu_secs)| RecvReport {
                counters: rx.counters,
                queue: None,
                dmabuf_id: None,
                dmabuf_size: 0,
                peer,
                listen: cfg.listen,
                secs,
                cpu_secs,
            },
        );
    }
    let name = std::ffi::CString::new(cfg.ifname.as_str())
        .map_err(|_| DevmemError::Config(format!("bad interface name {:?}", cfg.ifname)))?;
    // SAFETY: a valid NUL-terminated string.
    let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if ifindex == 0 {
        return Err(DevmemError::Config(format!("no interface {}", cfg.ifname)));
    }
    let queue = match cfg.queue {
        Some(q) => q,
        None => {
            let n = rx_queue_count(&cfg.ifname)
                .map_err(os(format!("counting the RX queues of {}", cfg.ifname)))?;
            if n < 2 {
                return Err(DevmemError::Config(format!(
                    "{} has {n} RX queue(s): devmem needs one for the dmabuf and one for the rest (or give --queue)",
                    cfg.ifname
                )));
            }
            n - 1
        }
    };
    let size = cfg
        .dmabuf_size
        .unwrap_or(DEFAULT_DMABUF_PAGES * page_size());
    let mem = Udmabuf::create(size)?;
    let binding = bind_rx(&cfg.ifname, ifindex, mem.fd(), &[queue])?;
    log(format!(
        "devmem-recv: udmabuf of {size} bytes bound to {} rx queue {queue} as dmabuf id {}",
        cfg.ifname, binding.id
    ));
    let mut rx = Rx::new(binding.id, cfg.modulus, cfg.allow_ordinary);
    let (peer, secs, cpu_secs) = accept_and_receive(cfg, &mut rx, &mem, &mut log)?;
    drop(binding);
    Ok(RecvReport {
        counters: rx.counters,
        queue: Some(queue),
        dmabuf_id: Some(rx.dmabuf_id),
        dmabuf_size: size,
        peer,
        listen: cfg.listen,
        secs,
        cpu_secs,
    })
}

/// Listens on `cfg.listen`, accepts one connection and [`receive`]s it
/// into `rx`; the peer, and seconds and CPU seconds from accept to EOF.
fn accept_and_receive(
    cfg: &RecvConfig,
    rx: &mut Rx,
    mem: &(impl FragMemory + ?Sized),
    log: &mut impl FnMut(String),
) -> Result<(Option<SocketAddr>, f64, f64), DevmemError> {
    let listener = Listener::bind(Proto::Tcp, cfg.listen, 1)
        .map_err(os(format!("listen on {}", cfg.listen)))?;
    log(format!(
        "devmem-recv: listening on {} bytes={} pattern_mod={}",
        listener.local_addr(),
        cfg.bytes
            .map(|b| b.to_string())
            .unwrap_or_else(|| "until-eof".into()),
        cfg.modulus
    ));
    let (stream, peer) = listener
        .accept(cfg.accept_timeout)
        .map_err(os(format!("accept on {}", cfg.listen)))?;
    drop(listener);
    let t0 = Instant::now();
    let cpu0 = crate::stream::cpu_seconds();
    stream
        .set_read_timeout(cfg.io_timeout)
        .map_err(os("SO_RCVTIMEO"))?;
    receive(stream.as_raw_fd(), rx, mem, cfg.recv_size, cfg.bytes)?;
    let secs = t0.elapsed().as_secs_f64();
    let cpu_secs = crate::stream::cpu_seconds() - cpu0;
    // the sender waits for this close
    drop(stream);
    Ok((peer, secs, cpu_secs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devmem_send::pattern_byte;

    fn pat(off: u64, n: usize, m: u8) -> Vec<u8> {
        let mut v = vec![0u8; n];
        fill(&mut v, off, m);
        v
    }

    /// Appends one control message the way the kernel lays it out.
    fn push_cmsg(buf: &mut Vec<u8>, level: i32, ty: i32, data: &[u8]) {
        // SAFETY: zeroed cmsghdr is valid.
        let mut h: libc::cmsghdr = unsafe { std::mem::zeroed() };
        h.cmsg_level = level;
        h.cmsg_type = ty;
        h.cmsg_len = (CMSG_DATA_OFF + data.len()) as _;
        let start = buf.len();
        // SAFETY: a plain-data struct viewed as its bytes.
        let hb = unsafe {
            std::slice::from_raw_parts(
                (&h as *const libc::cmsghdr).cast::<u8>(),
                size_of::<libc::cmsghdr>(),
            )
        };
        buf.extend_from_slice(hb);
        buf.resize(start + CMSG_DATA_OFF, 0);
        buf.extend_from_slice(data);
        buf.resize(start + cmsg_align(CMSG_DATA_OFF + data.len()), 0);
    }

    fn dmabuf(off: u64, size: u32, token: u32, id: u32) -> DmabufCmsg {
        DmabufCmsg {
            frag_offset: off,
            frag_size: size,
            frag_token: token,
            dmabuf_id: id,
            flags: 0,
        }
    }

    #[test]
    fn uapi_numbers() {
        assert_eq!(UDMABUF_CREATE, 0x4018_7542);
        assert_eq!(DMA_BUF_IOCTL_SYNC, 0x4008_6200);
        assert_eq!(DmabufCmsg::SIZE, 24);
        assert_eq!(size_of::<DmabufToken>(), 8);
        assert_eq!(size_of::<UdmabufCreate>(), 24);
        if cfg!(all(target_os = "linux", target_pointer_width = "64")) {
            assert_eq!(DEVMEM_CMSG_SPACE, 40); // CMSG_SPACE(24) on 64-bit Linux
        }
    }

    #[test]
    fn validator_matches_the_generator_across_every_split() {
        for m in [2u8, 7, 8, 255] {
            let stream = pat(0, 200_000, m);
            for split in [1usize, 6, 7, 4095, 65_536, 65_543, 131_071] {
                let mut v = Validator::new(m);
                for part in stream.chunks(split) {
                    v.check(part, Place::Linear).unwrap();
                }
                assert_eq!(v.offset(), 200_000, "m={m} split={split}");
            }
        }
    }

    #[test]
    fn validator_reports_the_exact_wrong_byte() {
        let mut stream = pat(0, 150_000, 7);
        stream[100_001] ^= 0x40;
        let mut v = Validator::new(7);
        v.check(&stream[..70_000], Place::Linear).unwrap();
        match v.check(
            &stream[70_000..],
            Place::Dmabuf {
                frag_offset: 12_288,
            },
        ) {
            Err(DevmemError::Mismatch {
                offset,
                expected,
                actual,
                place,
            }) => {
                assert_eq!(offset, 100_001);
                assert_eq!(expected, pattern_byte(100_001, 7));
                assert_eq!(actual, expected ^ 0x40);
                assert_eq!(
                    place,
                    Place::Dmabuf {
                        frag_offset: 12_288
                    }
                );
            }
            r => panic!("{r:?}"),
        }
    }

    #[test]
    fn cmsgs_parse_in_order() {
        let mut c = Vec::new();
        let lin = DmabufCmsg {
            frag_size: 66,
            ..Default::default()
        };
        push_cmsg(&mut c, libc::SOL_SOCKET, SCM_DEVMEM_LINEAR, &lin.encode());
        push_cmsg(
            &mut c,
            libc::SOL_SOCKET,
            SCM_DEVMEM_DMABUF,
            &dmabuf(8192, 1448, 7, 3).encode(),
        );
        push_cmsg(
            &mut c,
            libc::SOL_SOCKET,
            SCM_DEVMEM_DMABUF,
            &dmabuf(4096, 100, 8, 3).encode(),
        );
        let mut out = Vec::new();
        parse_cmsgs(&c, &mut out).unwrap();
        assert_eq!(
            out,
            vec![
                DevmemCmsg::Linear { size: 66 },
                DevmemCmsg::Dmabuf(dmabuf(8192, 1448, 7, 3)),
                DevmemCmsg::Dmabuf(dmabuf(4096, 100, 8, 3)),
            ]
        );
        // the last message's trailing padding may be missing
        let d = dmabuf(1, 2, 3, 4).encode();
        let mut c2 = Vec::new();
        push_cmsg(&mut c2, libc::SOL_SOCKET, SCM_DEVMEM_DMABUF, &d[..20]);
        c2.truncate(CMSG_DATA_OFF + 20);
        assert!(
            parse_cmsgs(&c2, &mut out).is_err(),
            "20 data bytes are too few"
        );
        parse_cmsgs(&[], &mut out).unwrap();
        assert!(out.is_empty());
    }

    #[test]
    fn bad_cmsgs_are_errors_not_panics() {
        let good = dmabuf(0, 10, 1, 1).encode();
        let mut out = Vec::new();
        // other level / type
        let mut c = Vec::new();
        push_cmsg(&mut c, libc::IPPROTO_TCP, SCM_DEVMEM_DMABUF, &good);
        assert!(matches!(
            parse_cmsgs(&c, &mut out),
            Err(DevmemError::BadCmsg(_))
        ));
        let mut c = Vec::new();
        push_cmsg(&mut c, libc::SOL_SOCKET, libc::SCM_RIGHTS, &good);
        assert!(matches!(
            parse_cmsgs(&c, &mut out),
            Err(DevmemError::BadCmsg(_))
        ));
        // cmsg_len beyond the buffer, below the header, or a stray tail
        let mut c = Vec::new();
        push_cmsg(&mut c, libc::SOL_SOCKET, SCM_DEVMEM_DMABUF, &good);
        for bad_len in [0usize, 3, CMSG_DATA_OFF - 1, c.len() + 1, usize::MAX] {
            let mut b = c.clone();
            let l = (bad_len as u64).to_ne_bytes();
            let w = size_of::<libc::cmsghdr>() - 8; // cmsg_len's width
            b[..w].copy_from_slice(&l[..w]);
            assert!(parse_cmsgs(&b, &mut out).is_err(), "cmsg_len {bad_len}");
        }
        let mut b = c.clone();
        b.extend_from_slice(&[0; 5]);
        assert!(parse_cmsgs(&b, &mut out).is_err());
        // every truncation of a valid buffer is refused or parsed, never a panic
        let mut two = c.clone();
        push_cmsg(&mut two, libc::SOL_SOCKET, SCM_DEVMEM_LINEAR, &good);
        for n in 0..two.len() {
            let _ = parse_cmsgs(&two[..n], &mut out);
        }
    }

    /// A fake dmabuf holding stream pieces at scattered offsets.
    struct Scatter {
        mem: Vec<u8>,
    }

    #[test]
    fn frags_and_linear_bytes_validate_across_recvmsgs() {
        let m = 7u8;
        let mut s = Scatter {
            mem: vec![0xee; 64 << 10],
        };
        let id = 5;
        // stream: [0,66) linear, [66,1514) frag at 8192, [1514,5610) frag at 0,
        // next recvmsg: [5610,5700) frag at 20000, [5700,5710) linear, [5710,9000) frag at 30001
        let mut place = |off: usize, stream_off: u64, n: usize| {
            s.mem[off..off + n].copy_from_slice(&pat(stream_off, n, m));
        };
        place(8192, 66, 1448);
        place(0, 1514, 4096);
        place(20000, 5610, 90);
        place(30001, 5710, 3290);
        let mut rx = Rx::new(id, m, false);
        // recvmsg never returns more than the iov's length, devmem or not
        let mut iov = vec![0u8; 8192];
        iov[..66].copy_from_slice(&pat(0, 66, m));
        let c1 = [
            DevmemCmsg::Linear { size: 66 },
            DevmemCmsg::Dmabuf(dmabuf(8192, 1448, 10, id)),
            DevmemCmsg::Dmabuf(dmabuf(0, 4096, 11, id)),
        ];
        rx.on_recv(5610, &iov, &c1, &s.mem[..]).unwrap();
        iov[..10].copy_from_slice(&pat(5700, 10, m));
        let c2 = [
            DevmemCmsg::Dmabuf(dmabuf(20000, 90, 12, id)),
            DevmemCmsg::Linear { size: 10 },
            DevmemCmsg::Dmabuf(dmabuf(30001, 3290, 40, id)),
        ];
        rx.on_recv(3390, &iov, &c2, &s.mem[..]).unwrap();
        let c = &rx.counters;
        assert_eq!(
            (c.bytes, c.frags, c.dmabuf_bytes, c.linear_bytes, c.syncs),
            (9000, 4, 9000 - 76, 76, 2)
        );
        assert_eq!(
            rx.tokens().ranges(),
            &[
                DmabufToken {
                    token_start: 10,
                    token_count: 3
                },
                DmabufToken {
                    token_start: 40,
                    token_count: 1
                }
            ]
        );
        let mut given = Vec::new();
        rx.return_tokens(|t| {
            given.extend_from_slice(t);
            Ok(t.iter().map(|t| t.token_count).sum())
        })
        .unwrap();
        assert_eq!(given.len(), 2);
        assert_eq!(rx.counters.dontneed_calls, 1);
        assert_eq!(rx.tokens().pending(), 0);

        // a spoilt byte inside a frag: the exact stream offset
        s.mem[30001 + 17] ^= 1;
        let mut rx = Rx::new(id, m, false);
        let all = [
            DevmemCmsg::Linear { size: 66 },
            DevmemCmsg::Dmabuf(dmabuf(8192, 1448, 10, id)),
            DevmemCmsg::Dmabuf(dmabuf(0, 4096, 11, id)),
        ];
        iov[..66].copy_from_slice(&pat(0, 66, m));
        rx.on_recv(5610, &iov, &all, &s.mem[..]).unwrap();
        iov[..10].copy_from_slice(&pat(5700, 10, m));
        match rx.on_recv(3390, &iov, &c2, &s.mem[..]) {
            Err(DevmemError::Mismatch { offset, place, .. }) => {
                assert_eq!(offset, 5710 + 17);
                assert_eq!(place, Place::Dmabuf { frag_offset: 30001 });
            }
            r => panic!("{r:?}"),
        }
    }

    #[test]
    fn hostile_recvmsg_results_are_errors() {
        let m = 7u8;
        let mem = pat(0, 8192, m);
        let iov = pat(0, 4096, m);
        let e = |ret: usize, c: &[DevmemCmsg], allow: bool| {
            Rx::new(1, m, allow)
                .on_recv(ret, &iov, c, &mem[..])
                .unwrap_err()
        };
        // outside the mapping, including u64 overflow
        for (off, size) in [
            (8192u64, 1u32),
            (8000, 193),
            (u64::MAX, 2),
            (u64::MAX - 1, u32::MAX),
        ] {
            let size_ret = size.min(4096) as usize;
            assert!(
                matches!(
                    e(
                        size_ret,
                        &[DevmemCmsg::Dmabuf(dmabuf(off, size, 1, 1))],
                        false
                    ),
                    DevmemError::FragOutOfBounds { .. } | DevmemError::Unaccounted { .. }
                ),
                "{off} {size}"
            );
        }
        assert!(matches!(
            e(100, &[DevmemCmsg::Dmabuf(dmabuf(0, 100, 1, 2))], false),
            DevmemError::WrongDmabuf { got: 2, want: 1 }
        ));
        assert!(matches!(
            e(10, &[DevmemCmsg::Linear { size: 11 }], false),
            DevmemError::LinearOverrun { .. }
        ));
        assert!(matches!(
            e(10, &[DevmemCmsg::Linear { size: u32::MAX }], false),
            DevmemError::LinearOverrun { .. }
        ));
        assert!(matches!(
            e(100, &[DevmemCmsg::Dmabuf(dmabuf(0, 99, 1, 1))], false),
            DevmemError::Unaccounted {
                ret: 100,
                accounted: 99
            }
        ));
        assert!(matches!(
            e(5000, &[], true),
            DevmemError::Unaccounted { .. }
        ));
        assert!(matches!(
            e(100, &[], false),
            DevmemError::OrdinaryData {
                offset: 0,
                bytes: 100
            }
        ));
        // ordinary data is validated when allowed
        let mut rx = Rx::new(1, m, true);
        rx.on_recv(4096, &iov, &[], &mem[..]).unwrap();
        assert_eq!(rx.counters.ordinary_bytes, 4096);
        assert!(
            rx.on_recv(10, &iov, &[], &mem[..]).is_err(),
            "offset 4096 != pattern at 0"
        );
    }

    #[test]
    fn sync_brackets_only_calls_with_frags_and_ends_on_error() {
        use std::cell::RefCell;
        struct Counting {
            mem: Vec<u8>,
            log: RefCell<Vec<&'static str>>,
        }
        impl FragMemory for Counting {
            fn size(&self) -> usize {
                self.mem.len()
            }
            fn bytes(&self, off: u64, len: u32) -> Option<&[u8]> {
                FragMemory::bytes(&self.mem[..], off, len)
            }
            fn begin_read(&self) -> io::Result<()> {
                self.log.borrow_mut().push("start");
                Ok(())
            }
            fn end_read(&self) -> io::Result<()> {
                self.log.borrow_mut().push("end");
                Ok(())
            }
        }
        let c = Counting {
            mem: pat(0, 4096, 7),
            log: RefCell::new(Vec::new()),
        };
        let iov = pat(0, 128, 7);
        let mut rx = Rx::new(9, 7, false);
        rx.on_recv(64, &iov, &[DevmemCmsg::Linear { size: 64 }], &c)
            .unwrap();
        assert!(c.log.borrow().is_empty());
        let mut rx = Rx::new(9, 7, false);
        rx.on_recv(
            100,
            &iov,
            &[
                DevmemCmsg::Dmabuf(dmabuf(0, 100, 0, 9)),
                DevmemCmsg::Dmabuf(dmabuf(8000, 100, 1, 9)),
            ],
            &c,
        )
        .unwrap_err();
        assert_eq!(*c.log.borrow(), vec!["start", "end"]);
        assert_eq!(
            rx.tokens().pending(),
            2,
            "the bad frag's token is returned too"
        );
    }

    #[test]
    fn tokens_coalesce_and_split_at_the_kernel_limits() {
        let run = |tokens: &[u32]| {
            let mut b = TokenBatch::default();
            for &t in tokens {
                b.push(t);
            }
            let mut calls: Vec<Vec<DmabufToken>> = Vec::new();
            let n = b
                .flush(|t| {
                    calls.push(t.to_vec());
                    Ok(t.iter().map(|t| t.token_count).sum())
                })
                .unwrap();
            assert_eq!(n as usize, calls.len());
            assert_eq!(b.pending(), 0);
            for c in &calls {
                assert!(c.len() <= MAX_DONTNEED_TOKENS);
                assert!(c.iter().map(|t| t.token_count).sum::<u32>() <= MAX_DONTNEED_FRAGS);
            }
            // every token exactly once, in order
            let back: Vec<u32> = calls
                .iter()
                .flatten()
                .flat_map(|t| (0..t.token_count).map(move |i| t.token_start + i))
                .collect();
            assert_eq!(back, tokens);
            calls
        };
        // consecutive: one range, one call
        let c = run(&(100..200).collect::<Vec<_>>());
        assert_eq!(
            c,
            vec![vec![DmabufToken {
                token_start: 100,
                token_count: 100
            }]]
        );
        // 3000 consecutive: three calls of at most 1024 frags
        let c = run(&(0..3000).collect::<Vec<_>>());
        assert_eq!(c.len(), 3);
        // 300 scattered: 128-range calls
        let scattered: Vec<u32> = (0..300).map(|i| i * 2).collect();
        let c = run(&scattered);
        assert_eq!(
            c.iter().map(Vec::len).collect::<Vec<_>>(),
            vec![128, 128, 44]
        );
        // a range split across the 1024-frag boundary
        let mut mixed: Vec<u32> = (0..100).map(|i| i * 3).collect();
        mixed.extend(1000..2100);
        let c = run(&mixed);
        assert_eq!(c.len(), 2);
        // tokens near u32::MAX do not overflow
        run(&[u32::MAX - 1, u32::MAX, 0, 1]);
        run(&[]);
    }

    #[test]
    fn tokens_the_kernel_did_not_free_are_an_error() {
        let mut b = TokenBatch::default();
        b.push(1);
        b.push(2);
        assert!(matches!(
            b.flush(|_| Ok(1)),
            Err(DevmemError::TokensNotFreed { freed: 1, asked: 2 })
        ));
        assert_eq!(b.pending(), 0);
        b.push(3);
        assert!(matches!(
            b.flush(|_| Err(io::Error::from_raw_os_error(libc::EINVAL))),
            Err(DevmemError::Os { .. })
        ));
    }

    #[test]
    fn bind_rx_request_layout() {
        let m = bind_rx_request(0x1f, 9, 2, 7, &[1, 3]);
        assert_eq!(
            u32::from_ne_bytes(m[0..4].try_into().unwrap()) as usize,
            m.len()
        );
        assert_eq!(u16::from_ne_bytes(m[4..6].try_into().unwrap()), 0x1f);
        assert_eq!(
            u16::from_ne_bytes(m[6..8].try_into().unwrap()),
            NLM_F_REQUEST | NLM_F_ACK
        );
        assert_eq!(&m[16..18], &[NETDEV_CMD_BIND_RX, 1]);
        let attrs: Vec<(u16, Vec<u8>)> = netlink::attrs(&m[20..])
            .map(|(t, p)| (t, p.to_vec()))
            .collect();
        assert_eq!(
            attrs[0],
            (NETDEV_A_DMABUF_IFINDEX, 2u32.to_ne_bytes().to_vec())
        );
        assert_eq!(attrs[1], (NETDEV_A_DMABUF_FD, 7u32.to_ne_bytes().to_vec()));
        // the nested flag is set on the wire, masked by attrs()
        assert_ne!(
            u16::from_ne_bytes(m[20 + 8 + 8 + 2..20 + 8 + 8 + 4].try_into().unwrap())
                & NLA_F_NESTED,
            0
        );
        let queues: Vec<(u32, u32)> = attrs[2..]
            .iter()
            .map(|(t, p)| {
                assert_eq!(*t, NETDEV_A_DMABUF_QUEUES);
                let id = netlink::find_attr(p, NETDEV_A_QUEUE_ID)
                    .and_then(netlink::attr_u32)
                    .unwrap();
                let ty = netlink::find_attr(p, NETDEV_A_QUEUE_TYPE)
                    .and_then(netlink::attr_u32)
                    .unwrap();
                (id, ty)
            })
            .collect();
        assert_eq!(
            queues,
            vec![(1, NETDEV_QUEUE_TYPE_RX), (3, NETDEV_QUEUE_TYPE_RX)]
        );
        // the reply's id
        let mut reply = vec![NETDEV_CMD_BIND_RX, 1, 0, 0];
        netlink::put_attr(&mut reply, NETDEV_A_DMABUF_ID, &42u32.to_ne_bytes());
        assert_eq!(bind_rx_reply_id(&reply), Some(42));
        assert_eq!(bind_rx_reply_id(&reply[..3]), None);
        assert_eq!(bind_rx_reply_id(&reply[..6]), None);
    }

    /// The receive loop over a real TCP connection: on loopback nothing is
    /// devmem, so with --allow-ordinary every byte comes through the iov
    /// and is validated; without it the first byte is an error.
    #[test]
    fn loopback_receive_of_the_sender() {
        use crate::devmem_send::{run as send, SendConfig};
        for (bytes, expect, allow) in [
            (300_007u64, Some(300_007u64), true),
            (1000, Some(2000), true),
            (1000, None, true),
            (5000, Some(5000), false),
        ] {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let to = l.local_addr().unwrap();
            let h = std::thread::spawn(move || {
                send(&SendConfig {
                    to,
                    bind: None,
                    bytes,
                    modulus: 7,
                    msg_size: 4000,
                    connect_timeout: Duration::from_secs(5),
                    io_timeout: Duration::from_secs(5),
                    wait_close: true,
                })
            });
            let (s, _) = l.accept().unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut rx = Rx::new(1, 7, allow);
            let r = receive(s.as_raw_fd(), &mut rx, &[0u8; 0][..], 64 << 10, expect);
            drop(s);
            let sent = h.join().unwrap();
            match (allow, expect) {
                (false, _) => {
                    assert!(
                        matches!(r, Err(DevmemError::OrdinaryData { offset: 0, .. })),
                        "{r:?}"
                    );
                    continue;
                }
                (true, Some(w)) if w != bytes => {
                    assert!(
                        matches!(
                            r,
                            Err(DevmemError::Short {
                                got: 1000,
                                want: 2000
                            })
                        ),
                        "{r:?}"
                    );
                }
                _ => {
                    r.unwrap();
                    sent.unwrap();
                    assert_eq!(rx.counters.bytes, bytes);
                    assert_eq!(rx.counters.ordinary_bytes, bytes);
                    assert_eq!((rx.counters.frags, rx.counters.dontneed_calls), (0, 0));
                }
            }
        }
    }

    #[test]
    fn report_line() {
        let r = RecvReport {
            counters: RxCounters {
                bytes: 1 << 30,
                frags: 10,
                ..Default::default()
            },
            queue: Some(1),
            dmabuf_id: Some(3),
            dmabuf_size: 65_536_000,
            peer: None,
            listen: "10.77.0.1:5302".parse().unwrap(),
            secs: 8.0,
            cpu_secs: 4.0,
        };
        let l = r.result_line();
        assert!(
            l.starts_with("DEVMEM-RESULT listen=10.77.0.1:5302 bytes=1073741824 frags=10 "),
            "{l}"
        );
        assert!(
            l.contains(" verified=1 ") && l.contains(" mibps=128.00 "),
            "{l}"
        );
        assert!(l.ends_with(" cpu_s_per_gib=4.0000"), "{l}");
        assert!(
            l.contains(" queue=1 dmabuf_id=3 dmabuf_size=65536000 mode=devmem "),
            "{l}"
        );
        let o = RecvReport {
            queue: None,
            dmabuf_id: None,
            dmabuf_size: 0,
            ..r
        }
        .result_line();
        assert!(
            o.contains(" queue=- dmabuf_id=- dmabuf_size=0 mode=ordinary verified=1 "),
            "{o}"
        );
    }

    /// `--ordinary` validates like devmem mode and refuses devmem control
    /// messages (it never asked for them).
    #[test]
    fn ordinary_mode_validates_and_refuses_devmem_cmsgs() {
        let mem = [0u8; 0];
        let mut rx = Rx::ordinary(7);
        assert!(!rx.devmem());
        let good = pat(0, 100, 7);
        rx.on_recv(100, &good, &[], &mem[..]).unwrap();
        assert_eq!((rx.counters.bytes, rx.counters.ordinary_bytes), (100, 100));
        let mut bad = pat(100, 50, 7);
        bad[17] ^= 0x40;
        let r = rx.on_recv(50, &bad, &[], &mem[..]);
        assert!(
            matches!(r, Err(DevmemError::Mismatch { offset: 117, .. })),
            "{r:?}"
        );
        let mut rx = Rx::ordinary(7);
        let r = rx.on_recv(
            10,
            &pat(0, 10, 7),
            &[DevmemCmsg::Linear { size: 10 }],
            &mem[..],
        );
        assert!(matches!(r, Err(DevmemError::BadCmsg(_))), "{r:?}");
        assert_eq!(rx.counters.bytes, 0);
        // devmem mode still takes the same bytes as linear data
        let mut rx = Rx::new(1, 7, false);
        assert!(rx.devmem());
        rx.on_recv(
            10,
            &pat(0, 10, 7),
            &[DevmemCmsg::Linear { size: 10 }],
            &mem[..],
        )
        .unwrap();
        assert_eq!(rx.counters.linear_bytes, 10);
    }

    /// `run` with `ordinary` end to end over loopback (no NIC, no dmabuf):
    /// devmem-send's stream passes, all of it ordinary; a shorter stream
    /// than --bytes fails.
    #[test]
    fn ordinary_run_over_loopback() {
        use crate::devmem_send::{run as send, SendConfig};
        for (sent, want) in [(300_007u64, 300_007u64), (1000, 2000)] {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let listen: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
            let h = std::thread::spawn(move || {
                send(&SendConfig {
                    to: listen,
                    bind: None,
                    bytes: sent,
                    modulus: 7,
                    msg_size: 4000,
                    connect_timeout: Duration::from_secs(10),
                    io_timeout: Duration::from_secs(5),
                    wait_close: true,
                })
            });
            let cfg = RecvConfig {
                ifname: "no-such-if".into(),
                queue: None,
                listen,
                bytes: Some(want),
                modulus: 7,
                dmabuf_size: None,
                recv_size: 64 << 10,
                accept_timeout: Some(Duration::from_secs(10)),
                io_timeout: Some(Duration::from_secs(5)),
                allow_ordinary: false,
                ordinary: true,
            };
            let mut lines = Vec::new();
            let r = run(&cfg, |l| lines.push(l));
            let s = h.join().unwrap();
            if sent == want {
                let r = r.unwrap();
                s.unwrap();
                assert_eq!(r.counters.bytes, sent);
                assert_eq!(r.counters.ordinary_bytes, sent);
                assert_eq!((r.counters.frags, r.counters.syncs), (0, 0));
                assert_eq!((r.queue, r.dmabuf_id, r.dmabuf_size), (None, None, 0));
                assert!(r.result_line().contains(" mode=ordinary "));
                assert!(lines.iter().any(|l| l.contains("--ordinary")), "{lines:?}");
            } else {
                assert!(
                    matches!(
                        r,
                        Err(DevmemError::Short {
                            got: 1000,
                            want: 2000
                        })
                    ),
                    "{r:?}"
                );
            }
        }
    }
}

//! Uplink ports (`kind=vxlan`, `kind=tap`): the fabric's way out of the
//! host. This is the edge: the UDP socket or TAP file descriptor and the one
//! thread per port that moves frames both ways. Encapsulation and its rules
//! are sans-IO in [`crate::vxlan`].
//!
//! An uplink attaches to the fabric like a device port: an always-connected
//! [`PortShared`] with one pending queue, so learning, flooding, counters,
//! faults, captures and the checker treat it as any other port. Its feature
//! set is empty, so the fabric segments TSO frames and finishes checksums
//! before they reach it (the wire wants plain frames).
//!
//! The thread sleeps in epoll on the port's wake eventfd (frames queued
//! towards the wire) and the socket or TAP fd (frames from the wire).
//!
//! Port counters: `tx_*` are frames from the wire into the fabric (as a
//! guest's TX), `rx_*` frames from the fabric to the wire, `rx_drops` frames
//! the wire could not take (too large for the underlay MTU, send errors),
//! `tx_errors` datagrams or frames from the wire refused (see the uplink's
//! own counters in `ctl status` for why).
//!
//! Fragmentation (`df=`) is the kernel's: the VXLAN socket's
//! `IP_MTU_DISCOVER` is `IP_PMTUDISC_DONT` with `df=unset` (no DF bit; the
//! kernel fragments a datagram larger than the route MTU, and the peer's
//! kernel reassembles before its socket sees it) and `IP_PMTUDISC_DO` with
//! `df=set` (DF on every packet; a datagram larger than the route MTU is
//! refused with `EMSGSIZE`, counted as a send error).

use crate::config::{PortSpec, TapSpec};
use crate::fabric::{Batch, Fabric, Frame, PortShared};
use crate::stats::QueueCounters;
use crate::virtio_net::NetHdr;
use crate::vxlan::{DontFragment, VxlanEndpoint, VxlanStats};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::Arc;
use std::thread::JoinHandle;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};

/// Frames read from the wire before the thread looks at the fabric's queue
/// again (fairness between the two directions).
const RX_BURST: usize = 256;
/// Receive buffer: the largest UDP payload; anything longer is truncated
/// and counted.
const RX_BUF: usize = 65536;
/// Socket buffer asked for, so that a burst from a fast peer waits in the
/// kernel rather than being lost while the thread forwards.
const SOCKET_BUFFER: libc::c_int = 4 << 20;

/// The uplink ports of a daemon, for the control socket.
pub type Uplinks = Arc<Vec<UplinkEntry>>;

/// Why an uplink could not start.
#[derive(Debug, thiserror::Error)]
pub enum UplinkError {
    /// The port has no uplink settings (a configuration bug).
    #[error("port {0} is not an uplink")]
    NotAnUplink(String),
    /// Binding the VXLAN socket failed.
    #[error("port {port}: cannot bind UDP {local}: {source}")]
    Bind {
        port: String,
        local: SocketAddr,
        source: std::io::Error,
    },
    /// Opening or attaching the TAP device failed.
    #[error("port {port}: TAP device {ifname}: {what}: {source}")]
    Tap {
        port: String,
        ifname: String,
        what: &'static str,
        source: std::io::Error,
    },
    /// Setting the VXLAN socket's fragmentation option failed.
    #[error("port {port}: setting {option} on the UDP socket: {source}")]
    SocketOption {
        port: String,
        option: &'static str,
        source: std::io::Error,
    },
    /// Creating the thread or its epoll failed.
    #[error("port {port}: {source}")]
    Io {
        port: String,
        source: std::io::Error,
    },
}

/// Counters of a TAP uplink (beyond the port's frame counters).
#[derive(Debug, Default)]
struct TapCounters {
    write_errors: AtomicU64,
    read_errors: AtomicU64,
    short: AtomicU64,
}

/// `ctl status` of a TAP uplink.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TapStatus {
    /// The TAP interface.
    pub ifname: String,
    /// Frames the TAP device refused (e.g. the interface is down).
    pub write_errors: u64,
    /// Failed reads from the TAP device.
    pub read_errors: u64,
    /// Frames read shorter than an Ethernet header.
    pub short: u64,
}

/// `ctl status` of a VXLAN uplink.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VxlanStatus {
    /// The bound UDP address.
    pub local: String,
    /// Remote VTEPs.
    pub remotes: Vec<String>,
    /// VXLAN network identifier.
    pub vni: u32,
    /// Underlay MTU (`mtu=`).
    pub underlay_mtu: u32,
    /// Whether outer packets may be fragmented (`df=`).
    #[serde(default)]
    pub df: DontFragment,
    /// Largest inner frame whose packet fits `mtu=` unfragmented
    /// (`mtu` + 14 - 50).
    #[serde(default)]
    pub unfragmented_inner_frame: usize,
    /// Largest inner frame sent or accepted: `unfragmented_inner_frame`
    /// with `df=set`, 65499 (one UDP datagram, fragmented) with `df=unset`.
    pub max_inner_frame: usize,
    /// Encapsulation counters.
    pub counters: VxlanStats,
}

/// `ctl status` of an uplink port.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UplinkStatus {
    /// Port name.
    pub port: String,
    /// `vxlan` or `tap`.
    pub kind: String,
    /// VXLAN settings and counters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vxlan: Option<VxlanStatus>,
    /// TAP settings and counters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tap: Option<TapStatus>,
}

/// What the wire of an uplink is.
enum Wire {
    Vxlan {
        sock: UdpSocket,
        ep: Arc<VxlanEndpoint>,
    },
    Tap {
        file: File,
        ifname: String,
        counters: Arc<TapCounters>,
    },
}

/// An uplink as the control socket sees it.
#[derive(Clone)]
pub struct UplinkEntry {
    port: String,
    state: EntryState,
}

#[derive(Clone)]
enum EntryState {
    Vxlan(Arc<VxlanEndpoint>),
    Tap(String, Arc<TapCounters>),
}

impl UplinkEntry {
    /// The uplink's status for `ctl status`.
    pub fn status(&self) -> UplinkStatus {
        match &self.state {
            EntryState::Vxlan(ep) => {
                let c = ep.config();
                UplinkStatus {
                    port: self.port.clone(),
                    kind: "vxlan".into(),
                    vxlan: Some(VxlanStatus {
                        local: c.local.to_string(),
                        remotes: c.remotes.iter().map(|r| r.to_string()).collect(),
                        vni: c.vni,
                        underlay_mtu: c.underlay_mtu,
                        df: c.df,
                        unfragmented_inner_frame: c.unfragmented_inner_frame(),
                        max_inner_frame: c.max_inner_frame(),
                        counters: ep.stats(),
                    }),
                    tap: None,
                }
            }
            EntryState::Tap(ifname, c) => UplinkStatus {
                port: self.port.clone(),
                kind: "tap".into(),
                vxlan: None,
                tap: Some(TapStatus {
                    ifname: ifname.clone(),
                    write_errors: c.write_errors.load(Relaxed),
                    read_errors: c.read_errors.load(Relaxed),
                    short: c.short.load(Relaxed),
                }),
            },
        }
    }
}

/// A running uplink port.
pub struct UplinkPort {
    port: Arc<PortShared>,
    entry: UplinkEntry,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// The port kind of uplinks (`kind=vxlan`, `kind=tap`).
pub struct UplinkDriver;

impl crate::ports::PortDriver for UplinkDriver {
    /// Attached like a device port (always there, one pending queue
    /// towards the wire); `ctl status` shows `vxlan` or `tap`.
    fn profile(&self, cfg: &crate::config::PortConfig) -> crate::fabric::PortProfile {
        crate::fabric::PortProfile {
            form: match cfg.kind() {
                crate::config::PortKind::Tap => "tap",
                _ => "vxlan",
            },
            always_attached: true,
            ..Default::default()
        }
    }

    fn start(
        &self,
        port: Arc<PortShared>,
        ctx: &crate::ports::StartContext<'_>,
    ) -> anyhow::Result<Box<dyn crate::ports::RunningPort>> {
        Ok(Box::new(UplinkPort::start(port, ctx.fabric.clone())?))
    }
}

impl crate::ports::RunningPort for UplinkPort {
    fn status(&self) -> crate::ports::PortStatus {
        crate::ports::PortStatus::Uplink(self.entry())
    }

    fn shutdown(&mut self) {
        UplinkPort::shutdown(self);
    }
}

impl UplinkPort {
    /// Opens the port's socket or TAP device and starts its thread.
    pub fn start(port: Arc<PortShared>, fabric: Arc<Fabric>) -> Result<UplinkPort, UplinkError> {
        let name = port.cfg().name.clone();
        let wire = match &port.cfg().spec {
            PortSpec::Vxlan(cfg) => {
                let sock = UdpSocket::bind(cfg.local).map_err(|source| UplinkError::Bind {
                    port: name.clone(),
                    local: cfg.local,
                    source,
                })?;
                set_buffers(sock.as_raw_fd());
                set_fragmentation(sock.as_raw_fd(), cfg.local.is_ipv4(), cfg.df).map_err(
                    |(option, source)| UplinkError::SocketOption {
                        port: name.clone(),
                        option,
                        source,
                    },
                )?;
                tracing::info!(port = %name, local = %cfg.local, remotes = ?cfg.remotes, vni = cfg.vni,
                    underlay_mtu = cfg.underlay_mtu, df = %cfg.df, max_inner_frame = cfg.max_inner_frame(), "VXLAN uplink");
                Wire::Vxlan {
                    sock,
                    ep: Arc::new(VxlanEndpoint::new(cfg.clone())),
                }
            }
            PortSpec::Tap(TapSpec { ifname }) => {
                let (file, created_name) =
                    open_tap(ifname).map_err(|(what, source)| UplinkError::Tap {
                        port: name.clone(),
                        ifname: ifname.clone(),
                        what,
                        source,
                    })?;
                tracing::info!(port = %name, ifname = %created_name, "TAP uplink");
                Wire::Tap {
                    file,
                    ifname: created_name,
                    counters: Arc::default(),
                }
            }
            _ => return Err(UplinkError::NotAnUplink(name)),
        };
        let entry = UplinkEntry {
            port: name.clone(),
            state: match &wire {
                Wire::Vxlan { ep, .. } => EntryState::Vxlan(ep.clone()),
                Wire::Tap {
                    ifname, counters, ..
                } => EntryState::Tap(ifname.clone(), counters.clone()),
            },
        };
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (port.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name(format!("uplink-{name}"))
            .spawn(move || {
                if let Err(e) = run(&p, &fabric, wire, &s) {
                    tracing::warn!(port = %p.cfg().name, "uplink stopped: {e}");
                }
            })
            .map_err(|source| UplinkError::Io { port: name, source })?;
        Ok(UplinkPort {
            port,
            entry,
            stop,
            thread: Some(thread),
        })
    }

    /// What the control socket needs of this port.
    pub fn entry(&self) -> UplinkEntry {
        self.entry.clone()
    }

    /// Stops the thread (closing the socket or TAP device).
    pub fn shutdown(&mut self) {
        self.stop.store(true, SeqCst);
        let _ = self.port.rx_queues()[0].wake.write(1);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for UplinkPort {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Best effort: the kernel caps the sizes at net.core.{r,w}mem_max, and a
/// smaller buffer only means bursts are lost sooner (counted by the peer).
fn set_buffers(fd: RawFd) {
    for opt in [libc::SO_RCVBUF, libc::SO_SNDBUF] {
        // SAFETY: setsockopt with a valid int option value and its size.
        unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                opt,
                (&SOCKET_BUFFER as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    }
}

/// Sets the socket's path-MTU discovery mode for `df` (see the module
/// comment). IPv6 has no DF bit and routers never fragment it; there
/// `IPV6_PMTUDISC_DONT` lets the sending kernel fragment to the path MTU it
/// knows, `IPV6_PMTUDISC_DO` refuses what exceeds it.
fn set_fragmentation(
    fd: RawFd,
    ipv4: bool,
    df: DontFragment,
) -> Result<(), (&'static str, std::io::Error)> {
    let (level, option, name, value) = match (ipv4, df) {
        (true, DontFragment::Unset) => (
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            "IP_MTU_DISCOVER=IP_PMTUDISC_DONT",
            libc::IP_PMTUDISC_DONT,
        ),
        (true, DontFragment::Set) => (
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            "IP_MTU_DISCOVER=IP_PMTUDISC_DO",
            libc::IP_PMTUDISC_DO,
        ),
        (false, DontFragment::Unset) => (
            libc::IPPROTO_IPV6,
            libc::IPV6_MTU_DISCOVER,
            "IPV6_MTU_DISCOVER=IPV6_PMTUDISC_DONT",
            libc::IPV6_PMTUDISC_DONT,
        ),
        (false, DontFragment::Set) => (
            libc::IPPROTO_IPV6,
            libc::IPV6_MTU_DISCOVER,
            "IPV6_MTU_DISCOVER=IPV6_PMTUDISC_DO",
            libc::IPV6_PMTUDISC_DO,
        ),
    };
    // SAFETY: setsockopt with a valid int option value and its size.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            option,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err((name, std::io::Error::last_os_error()));
    }
    Ok(())
}

/// `struct ifreq` with the flags member of its union (linux/if.h).
#[repr(C)]
struct IfReqFlags {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// `_IOW('T', 202, int)` (linux/if_tun.h).
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;

/// Opens `/dev/net/tun` as TAP `ifname` (attaching to an existing one or
/// creating it) without packet information, sets it up; returns the file
/// and the name the kernel gave.
fn open_tap(ifname: &str) -> Result<(File, String), (&'static str, std::io::Error)> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open("/dev/net/tun")
        .map_err(|e| ("opening /dev/net/tun", e))?;
    let mut req = IfReqFlags {
        name: [0; libc::IFNAMSIZ],
        flags: (libc::IFF_TAP | libc::IFF_NO_PI) as libc::c_short,
        _pad: [0; 22],
    };
    let n = ifname.len().min(libc::IFNAMSIZ - 1);
    req.name[..n].copy_from_slice(&ifname.as_bytes()[..n]);
    // SAFETY: TUNSETIFF reads and writes a struct ifreq, which `req` is
    // laid out as (40 bytes on 64-bit Linux).
    if unsafe { libc::ioctl(file.as_raw_fd(), TUNSETIFF as _, &mut req) } < 0 {
        return Err(("TUNSETIFF (IFF_TAP)", std::io::Error::last_os_error()));
    }
    let end = req
        .name
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(libc::IFNAMSIZ);
    let name = String::from_utf8_lossy(&req.name[..end]).into_owned();
    set_up(&req.name).map_err(|e| ("setting the interface up", e))?;
    Ok((file, name))
}

/// Sets an interface's IFF_UP flag (what `ip link set IF up` does).
fn set_up(name: &[u8; libc::IFNAMSIZ]) -> std::io::Result<()> {
    // SAFETY: a plain socket for the interface ioctls, closed below.
    let s = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if s < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut req = IfReqFlags {
        name: *name,
        flags: 0,
        _pad: [0; 22],
    };
    // SAFETY: SIOCGIFFLAGS/SIOCSIFFLAGS read and write a struct ifreq.
    let r = unsafe {
        if libc::ioctl(s, libc::SIOCGIFFLAGS as _, &mut req) < 0 {
            -1
        } else {
            req.flags |= libc::IFF_UP as libc::c_short;
            libc::ioctl(s, libc::SIOCSIFFLAGS as _, &mut req)
        }
    };
    let err = std::io::Error::last_os_error();
    // SAFETY: `s` is our socket.
    unsafe { libc::close(s) };
    if r < 0 {
        Err(err)
    } else {
        Ok(())
    }
}

/// Reads one datagram without blocking: its length (before truncation),
/// source, and whether it was truncated; `None` when nothing waits.
fn recv_from(fd: RawFd, buf: &mut [u8]) -> std::io::Result<Option<(usize, SocketAddr, bool)>> {
    // SAFETY: zeroed sockaddr_storage is a valid out buffer.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: buf and ss are valid for the lengths given. MSG_TRUNC makes
    // the kernel return the datagram's real length, so an oversized one is
    // recognised instead of passed on cut.
    let n = unsafe {
        libc::recvfrom(
            fd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT | libc::MSG_TRUNC,
            (&mut ss as *mut libc::sockaddr_storage).cast(),
            &mut len,
        )
    };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        return match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::Interrupted => Ok(None),
            _ => Err(e),
        };
    }
    let n = n as usize;
    let addr = match i32::from(ss.ss_family) {
        libc::AF_INET => {
            // SAFETY: the kernel wrote a sockaddr_in.
            let a = unsafe { *(&ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            SocketAddr::new(
                std::net::Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)).into(),
                u16::from_be(a.sin_port),
            )
        }
        libc::AF_INET6 => {
            // SAFETY: the kernel wrote a sockaddr_in6.
            let a = unsafe { *(&ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            SocketAddr::new(
                std::net::Ipv6Addr::from(a.sin6_addr.s6_addr).into(),
                u16::from_be(a.sin6_port),
            )
        }
        _ => return Ok(Some((0, SocketAddr::from(([0, 0, 0, 0], 0)), true))),
    };
    Ok(Some((n, addr, n > buf.len())))
}

/// What one read from the wire gave.
enum Rx {
    /// A frame for the fabric.
    Frame(Vec<u8>),
    /// Something refused (counted and logged already).
    Refused,
    /// Nothing waiting.
    Empty,
}

const FABRIC: u64 = 1;
const WIRE: u64 = 2;

fn run(
    port: &PortShared,
    fabric: &Fabric,
    mut wire: Wire,
    stop: &AtomicBool,
) -> std::io::Result<()> {
    let epoll = Epoll::new()?;
    let rxq = &port.rx_queues()[0];
    let wire_fd = match &wire {
        Wire::Vxlan { sock, .. } => sock.as_raw_fd(),
        Wire::Tap { file, .. } => file.as_raw_fd(),
    };
    epoll.ctl(
        ControlOperation::Add,
        rxq.wake.as_raw_fd(),
        EpollEvent::new(EventSet::IN, FABRIC),
    )?;
    epoll.ctl(
        ControlOperation::Add,
        wire_fd,
        EpollEvent::new(EventSet::IN, WIRE),
    )?;
    let mut events = [EpollEvent::default(); 2];
    let mut buf = vec![0u8; RX_BUF];
    while !stop.load(SeqCst) {
        // Fabric to wire.
        rxq.disarm();
        while let Some(f) = rxq.pop() {
            let c = &rxq.counters;
            if send(port, &mut wire, &f.data) {
                QueueCounters::add(&c.rx_frames, 1);
                QueueCounters::add(&c.rx_bytes, f.data.len() as u64);
            } else {
                QueueCounters::add(&c.rx_drops, 1);
            }
            rxq.mark_fed();
        }
        rxq.wake_waiters();
        // Wire to fabric.
        let mut more = false;
        // One batch per burst: receivers are woken once, after it.
        let mut batch = Batch::new(std::time::Instant::now());
        for i in 0..RX_BURST {
            match receive(port, &mut wire, &mut buf) {
                Ok(Rx::Frame(data)) => {
                    let c = &rxq.counters;
                    QueueCounters::add(&c.tx_frames, 1);
                    QueueCounters::add(&c.tx_bytes, data.len() as u64);
                    fabric.forward_in(
                        port.index(),
                        Frame::new(NetHdr::default(), data),
                        &mut batch,
                    );
                }
                Ok(Rx::Refused) => QueueCounters::add(&rxq.counters.tx_errors, 1),
                Ok(Rx::Empty) => break,
                Err(e) => {
                    crate::guest_warn!(port.log(), port = %port.cfg().name, "uplink receive failed: {e}");
                    // A wire that keeps failing (interface deleted) would
                    // wake epoll at once again: retry at a slow pace (after
                    // handing over what came before).
                    batch.flush();
                    std::thread::sleep(std::time::Duration::from_millis(100));
                    break;
                }
            }
            more = i + 1 == RX_BURST;
        }
        batch.flush();
        if more || !rxq.is_empty() {
            continue;
        }
        // At most a second, to notice a stop.
        match epoll.wait(1000, &mut events) {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Sends one frame from the fabric; false when it was dropped (counted
/// and logged, rate-limited).
fn send(port: &PortShared, wire: &mut Wire, frame: &[u8]) -> bool {
    match wire {
        Wire::Vxlan { sock, ep } => {
            let e = match ep.egress(frame) {
                Ok(e) => e,
                Err(why) => {
                    crate::guest_warn!(port.log(), port = %port.cfg().name, "VXLAN uplink drops a frame: {why}");
                    return false;
                }
            };
            let mut any = false;
            for r in e.remotes {
                let to = ep.config().remotes[r];
                // A blocking send: a full socket buffer slows the fabric
                // (back-pressure) rather than losing the frame.
                match sock.send_to(&e.datagram, to) {
                    Ok(_) => {
                        ep.sent(true);
                        any = true;
                    }
                    Err(err) => {
                        ep.sent(false);
                        crate::guest_warn!(port.log(), port = %port.cfg().name, "VXLAN send to {to} failed: {err}");
                    }
                }
            }
            any
        }
        Wire::Tap {
            file,
            ifname,
            counters,
        } => match file.write(frame) {
            Ok(_) => true,
            Err(err) => {
                counters.write_errors.fetch_add(1, Relaxed);
                crate::guest_warn!(port.log(), port = %port.cfg().name, "TAP {ifname} refused a frame: {err}");
                false
            }
        },
    }
}

/// Reads one frame from the wire without blocking.
fn receive(port: &PortShared, wire: &mut Wire, buf: &mut [u8]) -> std::io::Result<Rx> {
    match wire {
        Wire::Vxlan { sock, ep } => {
            let Some((n, from, truncated)) = recv_from(sock.as_raw_fd(), buf)? else {
                return Ok(Rx::Empty);
            };
            let got = &buf[..n.min(buf.len())];
            match ep.ingress(from, got, truncated) {
                Ok(inner) => Ok(Rx::Frame(inner.to_vec())),
                Err(why) => {
                    crate::guest_warn!(port.log(), port = %port.cfg().name, "VXLAN uplink drops a datagram: {why}");
                    Ok(Rx::Refused)
                }
            }
        }
        Wire::Tap { file, counters, .. } => match file.read(buf) {
            Ok(n) if n < 14 => {
                counters.short.fetch_add(1, Relaxed);
                Ok(Rx::Refused)
            }
            Ok(n) => Ok(Rx::Frame(buf[..n].to_vec())),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {
                Ok(Rx::Empty)
            }
            Err(e) => {
                counters.read_errors.fetch_add(1, Relaxed);
                Err(e)
            }
        },
    }
}

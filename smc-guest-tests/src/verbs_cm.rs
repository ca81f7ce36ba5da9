//! A minimal librdmacm binding, for connecting iWARP (siw) QPs.
//!
//! An iWARP RC QP reaches RTS only through the kernel's iw_cm: MPA over a TCP
//! connection that rdma_cm sets up. The QP itself is created with libibverbs
//! (`verbs_ib`) on our own context of the same device and handed to rdma_cm by
//! number (`rdma_conn_param.qp_num`): the kernel looks iWARP QPs up by number
//! device-wide (`iw_get_qp`), and moves the QP to RTS itself when the
//! connection is established. librdmacm never touches the QP (it is not
//! attached to the cm_id), so the QP is brought to INIT by the caller.
//!
//! Only the leading fields of `rdma_cm_id` and `rdma_cm_event` that are read
//! here are declared (the structs are allocated and owned by librdmacm);
//! `rdma_conn_param` is declared whole, with its size checked.

use anyhow::{anyhow, bail, Result};
use ibverbs_sys as ffi;
use std::ffi::CStr;
use std::io;
use std::marker::PhantomData;
use std::net::SocketAddrV4;
use std::os::raw::{c_char, c_int, c_void};
use std::ptr::{self, NonNull};
use std::time::{Duration, Instant};

#[repr(C)]
struct RawChannel {
    fd: c_int,
}

/// Leading fields of `struct rdma_cm_id` (rdma/rdma_cma.h).
#[repr(C)]
struct RawCmId {
    verbs: *mut ffi::ibv_context,
    channel: *mut RawChannel,
    context: *mut c_void,
    qp: *mut ffi::ibv_qp,
}

/// Leading fields of `struct rdma_cm_event`.
#[repr(C)]
struct RawEvent {
    id: *mut RawCmId,
    listen_id: *mut RawCmId,
    event: c_int,
    status: c_int,
}

/// `struct rdma_conn_param`.
#[repr(C)]
struct ConnParam {
    private_data: *const c_void,
    private_data_len: u8,
    responder_resources: u8,
    initiator_depth: u8,
    flow_control: u8,
    retry_count: u8,
    rnr_retry_count: u8,
    srq: u8,
    qp_num: u32,
}
const _: () = assert!(std::mem::size_of::<ConnParam>() == 24);
const _: () = assert!(std::mem::offset_of!(ConnParam, qp_num) == 16);

const RDMA_PS_TCP: c_int = 0x0106;

#[link(name = "rdmacm")]
extern "C" {
    fn rdma_create_event_channel() -> *mut RawChannel;
    fn rdma_destroy_event_channel(channel: *mut RawChannel);
    fn rdma_create_id(
        channel: *mut RawChannel,
        id: *mut *mut RawCmId,
        context: *mut c_void,
        ps: c_int,
    ) -> c_int;
    fn rdma_destroy_id(id: *mut RawCmId) -> c_int;
    fn rdma_bind_addr(id: *mut RawCmId, addr: *const libc::sockaddr) -> c_int;
    fn rdma_listen(id: *mut RawCmId, backlog: c_int) -> c_int;
    fn rdma_resolve_addr(
        id: *mut RawCmId,
        src: *const libc::sockaddr,
        dst: *const libc::sockaddr,
        timeout_ms: c_int,
    ) -> c_int;
    fn rdma_resolve_route(id: *mut RawCmId, timeout_ms: c_int) -> c_int;
    fn rdma_connect(id: *mut RawCmId, param: *mut ConnParam) -> c_int;
    fn rdma_accept(id: *mut RawCmId, param: *mut ConnParam) -> c_int;
    fn rdma_disconnect(id: *mut RawCmId) -> c_int;
    fn rdma_get_cm_event(channel: *mut RawChannel, event: *mut *mut RawEvent) -> c_int;
    fn rdma_ack_cm_event(event: *mut RawEvent) -> c_int;
    fn rdma_event_str(event: c_int) -> *const c_char;
}

/// `RDMA_CM_EVENT_ADDR_RESOLVED`.
pub const EV_ADDR_RESOLVED: i32 = 0;
/// `RDMA_CM_EVENT_ROUTE_RESOLVED`.
pub const EV_ROUTE_RESOLVED: i32 = 2;
/// `RDMA_CM_EVENT_CONNECT_REQUEST`.
pub const EV_CONNECT_REQUEST: i32 = 4;
/// `RDMA_CM_EVENT_ESTABLISHED`.
pub const EV_ESTABLISHED: i32 = 9;

/// Name of an rdma_cm event.
pub fn event_name(ev: i32) -> String {
    // SAFETY: rdma_event_str returns a static string for any value.
    unsafe { CStr::from_ptr(rdma_event_str(ev)) }
        .to_string_lossy()
        .into_owned()
}

fn check(rc: c_int, what: &str) -> Result<()> {
    if rc != 0 {
        bail!("{what}: {}", io::Error::last_os_error());
    }
    Ok(())
}

fn sockaddr(a: SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*a.ip()).to_be(),
        },
        sin_zero: [0; 8],
    }
}

/// An rdma_cm event channel.
pub struct Channel {
    ch: NonNull<RawChannel>,
}

/// A copied (and already acknowledged) rdma_cm event.
pub struct Event {
    /// `rdma_cm_event_type`.
    pub kind: i32,
    /// `status` (negative errno for errors, reject reason for REJECTED).
    pub status: i32,
    id: *mut RawCmId,
}

impl Channel {
    /// A new event channel.
    pub fn new() -> Result<Channel> {
        // SAFETY: plain constructor; NULL on failure.
        let ch = unsafe { rdma_create_event_channel() };
        Ok(Channel {
            ch: NonNull::new(ch).ok_or_else(|| {
                anyhow!(
                    "rdma_create_event_channel: {} (is the rdma_ucm module loaded?)",
                    io::Error::last_os_error()
                )
            })?,
        })
    }

    /// A new TCP port space cm_id on this channel.
    pub fn create_id(&self) -> Result<CmId<'_>> {
        let mut id = ptr::null_mut();
        // SAFETY: live channel; id is an out-pointer.
        check(
            unsafe { rdma_create_id(self.ch.as_ptr(), &mut id, ptr::null_mut(), RDMA_PS_TCP) },
            "rdma_create_id",
        )?;
        Ok(CmId {
            id: NonNull::new(id).ok_or_else(|| anyhow!("rdma_create_id returned no id"))?,
            connected: false,
            _c: PhantomData,
        })
    }

    /// The next event, waiting at most until `deadline`.
    pub fn next_event(&self, deadline: Instant) -> Result<Event> {
        // SAFETY: live channel; fd is its first field.
        let fd = unsafe { (*self.ch.as_ptr()).fd };
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!("no rdma_cm event within the timeout");
            }
            let mut pfd = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = left.min(Duration::from_secs(1)).as_millis().max(1) as c_int;
            // SAFETY: one valid pollfd.
            let n = unsafe { libc::poll(&mut pfd, 1, ms) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                bail!("poll(rdma_cm channel): {e}");
            }
            if n == 0 {
                continue;
            }
            let mut ev = ptr::null_mut();
            // SAFETY: live channel; the fd is readable so this does not block
            // for long; the event is copied and acknowledged right away.
            unsafe {
                check(
                    rdma_get_cm_event(self.ch.as_ptr(), &mut ev),
                    "rdma_get_cm_event",
                )?;
                let e = Event {
                    kind: (*ev).event,
                    status: (*ev).status,
                    id: (*ev).id,
                };
                rdma_ack_cm_event(ev);
                return Ok(e);
            }
        }
    }

    /// Waits for event `want`; any other event is an error naming it.
    pub fn expect(&self, want: i32, deadline: Instant) -> Result<Event> {
        let e = self
            .next_event(deadline)
            .map_err(|e| anyhow!("waiting for {}: {e}", event_name(want)))?;
        if e.kind != want {
            bail!(
                "expected rdma_cm event {}, got {} (status {}{})",
                event_name(want),
                event_name(e.kind),
                e.status,
                if e.status < 0 {
                    format!(": {}", io::Error::from_raw_os_error(-e.status))
                } else {
                    String::new()
                }
            );
        }
        Ok(e)
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        // SAFETY: every id on it is destroyed first (they borrow it) and every
        // event was acknowledged.
        unsafe { rdma_destroy_event_channel(self.ch.as_ptr()) };
    }
}

/// An rdma_cm id (listening or connected).
pub struct CmId<'c> {
    id: NonNull<RawCmId>,
    connected: bool,
    _c: PhantomData<&'c Channel>,
}

impl<'c> CmId<'c> {
    /// Takes ownership of the new id of a CONNECT_REQUEST event.
    pub fn from_request(_ch: &'c Channel, ev: &Event) -> Result<CmId<'c>> {
        if ev.kind != EV_CONNECT_REQUEST {
            bail!("not a connect request");
        }
        Ok(CmId {
            id: NonNull::new(ev.id).ok_or_else(|| anyhow!("connect request without an id"))?,
            connected: false,
            _c: PhantomData,
        })
    }

    /// Name of the RDMA device rdma_cm bound this id to (after bind to a
    /// local address, address resolution or a connect request).
    pub fn device_name(&self) -> Option<String> {
        // SAFETY: live id; verbs and its device are set by librdmacm once the
        // id is bound to a device, and live as long as the id.
        unsafe {
            let v = (*self.id.as_ptr()).verbs;
            if v.is_null() || (*v).device.is_null() {
                return None;
            }
            Some(
                CStr::from_ptr((*(*v).device).name.as_ptr())
                    .to_string_lossy()
                    .into_owned(),
            )
        }
    }

    /// Binds and listens on `addr`.
    pub fn listen(&self, addr: SocketAddrV4) -> Result<()> {
        let sa = sockaddr(addr);
        // SAFETY: live id; sa is a valid sockaddr_in for the call.
        check(
            unsafe { rdma_bind_addr(self.id.as_ptr(), (&sa as *const libc::sockaddr_in).cast()) },
            &format!("rdma_bind_addr({addr})"),
        )?;
        // SAFETY: live, bound id.
        check(unsafe { rdma_listen(self.id.as_ptr(), 4) }, "rdma_listen")
    }

    /// Resolves `dst` then its route (events on `ch`).
    pub fn resolve(&self, ch: &Channel, dst: SocketAddrV4, deadline: Instant) -> Result<()> {
        let sa = sockaddr(dst);
        // SAFETY: live id; sa valid for the call; no source address.
        check(
            unsafe {
                rdma_resolve_addr(
                    self.id.as_ptr(),
                    ptr::null(),
                    (&sa as *const libc::sockaddr_in).cast(),
                    5000,
                )
            },
            &format!("rdma_resolve_addr({dst})"),
        )?;
        ch.expect(EV_ADDR_RESOLVED, deadline)?;
        // SAFETY: live id with a resolved address.
        check(
            unsafe { rdma_resolve_route(self.id.as_ptr(), 5000) },
            "rdma_resolve_route",
        )?;
        ch.expect(EV_ROUTE_RESOLVED, deadline)?;
        Ok(())
    }

    fn param(qpn: u32, rd_atomic: u8) -> ConnParam {
        ConnParam {
            private_data: ptr::null(),
            private_data_len: 0,
            responder_resources: rd_atomic,
            initiator_depth: rd_atomic,
            flow_control: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            srq: 0,
            qp_num: qpn,
        }
    }

    /// Connects QP `qpn` (not attached to this id, in INIT).
    pub fn connect(&mut self, qpn: u32, rd_atomic: u8) -> Result<()> {
        let mut p = Self::param(qpn, rd_atomic);
        // SAFETY: live id with a resolved route; p valid for the call.
        check(
            unsafe { rdma_connect(self.id.as_ptr(), &mut p) },
            "rdma_connect",
        )?;
        self.connected = true;
        Ok(())
    }

    /// Accepts a connect request with QP `qpn` (not attached, in INIT).
    pub fn accept(&mut self, qpn: u32, rd_atomic: u8) -> Result<()> {
        let mut p = Self::param(qpn, rd_atomic);
        // SAFETY: live id from a CONNECT_REQUEST; p valid for the call.
        check(
            unsafe { rdma_accept(self.id.as_ptr(), &mut p) },
            "rdma_accept",
        )?;
        self.connected = true;
        Ok(())
    }
}

impl Drop for CmId<'_> {
    fn drop(&mut self) {
        // SAFETY: live id; its events were all acknowledged.
        unsafe {
            if self.connected {
                rdma_disconnect(self.id.as_ptr());
            }
            rdma_destroy_id(self.id.as_ptr());
        }
    }
}

//! Owned libibverbs objects on top of `ibverbs-sys`, the rdma-core bindings
//! the `ibverbs` crate is built on (device enumeration uses `ibverbs` itself).
//!
//! Why not the `ibverbs` crate's safe API: in 0.9.2 its `QueuePair` can only
//! post SEND / RECV, and neither the QP, the MR's lkey nor the context are
//! reachable, so RDMA WRITE (+imm), READ and atomics cannot be posted on its
//! objects, and `handshake()` hard-codes the send PSN and cannot connect an
//! iWARP QP (that needs rdma_cm). So every object here is created through
//! the bindings and freed by `Drop`; all `unsafe` of the verbs test is in
//! this file and `verbs_cm.rs`, each block with its reason.

use anyhow::{anyhow, bail, Context as _, Result};
use ibverbs_sys as ffi;
use std::ffi::CStr;
use std::io;
use std::marker::PhantomData;
use std::path::Path;
use std::ptr::{self, NonNull};
use std::time::{Duration, Instant};

use crate::verbs::Completion;

/// The one port the tests use.
pub const PORT: u8 = 1;

/// An open device (`ibv_context`) with its attributes.
pub struct Device {
    ctx: NonNull<ffi::ibv_context>,
    /// Device name (`rxe0`).
    pub name: String,
    /// `ibv_query_device`.
    pub attr: ffi::ibv_device_attr,
    /// `ibv_query_port` of [`PORT`].
    pub port: ffi::ibv_port_attr,
    /// iWARP transport (siw).
    pub iwarp: bool,
}

/// Names of the RDMA devices libibverbs sees (through the `ibverbs` crate).
pub fn device_names() -> Vec<String> {
    match ibverbs::devices() {
        Ok(list) => list
            .iter()
            .filter_map(|d| d.name().map(|n| n.to_string_lossy().into_owned()))
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// SAFETY: `d` must point to a live `ibv_device`.
unsafe fn dev_name(d: *const ffi::ibv_device) -> String {
    // SAFETY: `name` is a NUL-terminated char[64] inside a live ibv_device.
    unsafe { CStr::from_ptr((*d).name.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

impl Device {
    /// Opens device `name` and queries it and port 1; fails clearly if it is
    /// missing or its port is not ACTIVE.
    pub fn open(name: &str) -> Result<Device> {
        let mut n = 0i32;
        // SAFETY: as in device_names(); the list outlives ibv_open_device,
        // which keeps its own reference to the device.
        let ctx = unsafe {
            let list = ffi::ibv_get_device_list(&mut n);
            if list.is_null() {
                let e = io::Error::last_os_error();
                if !Path::new("/sys/class/infiniband").is_dir() {
                    bail!(
                        "no RDMA devices at all (ibv_get_device_list: {e}; /sys/class/infiniband is missing): \
                         add one with `rdma link add {name} type rxe|siw netdev eth0`"
                    );
                }
                bail!("ibv_get_device_list: {e} (are rdma-core / ibverbs-providers installed?)");
            }
            let found = (0..n.max(0) as usize)
                .map(|i| *list.add(i))
                .find(|&d| dev_name(d) == name);
            let ctx = found.map(|d| ffi::ibv_open_device(d));
            ffi::ibv_free_device_list(list);
            match ctx {
                None => {
                    let have = device_names();
                    bail!(
                        "no RDMA device {name} (have: {}); add one with `rdma link add {name} type {} netdev eth0`",
                        if have.is_empty() { "none".into() } else { have.join(", ") },
                        if name.starts_with("siw") { "siw" } else { "rxe" }
                    );
                }
                Some(c) => NonNull::new(c).ok_or_else(|| {
                    anyhow!("ibv_open_device({name}): {}", io::Error::last_os_error())
                })?,
            }
        };
        let mut dev = Device {
            ctx,
            name: name.to_string(),
            attr: Default::default(),
            port: Default::default(),
            iwarp: false,
        };
        // SAFETY: live context, out-structs sized by their types.
        let rc = unsafe { ffi::ibv_query_device(dev.ctx.as_ptr(), &mut dev.attr) };
        if rc != 0 {
            bail!(
                "ibv_query_device({name}): {}",
                io::Error::from_raw_os_error(rc)
            );
        }
        // SAFETY: as above (ibv_query_port is exported for the old ABI).
        let rc = unsafe {
            ffi::ibv_query_port(dev.ctx.as_ptr(), PORT, &mut dev.port as *mut _ as *mut _)
        };
        if rc != 0 {
            bail!(
                "ibv_query_port({name}, 1): {}",
                io::Error::from_raw_os_error(rc)
            );
        }
        if dev.port.state != ffi::ibv_port_state::IBV_PORT_ACTIVE {
            bail!(
                "{name} port 1 is not ACTIVE (state {}): is its netdev up?",
                dev.port.state
            );
        }
        // SAFETY: a context's device pointer stays valid while it is open.
        dev.iwarp =
            unsafe { (*dev.ctx.as_ref().device).transport_type } == ffi::IBV_TRANSPORT_IWARP;
        Ok(dev)
    }

    /// Raw context (for rdma_cm cross-checks).
    pub fn raw(&self) -> *mut ffi::ibv_context {
        self.ctx.as_ptr()
    }

    /// Whether the device does atomics.
    pub fn atomics(&self) -> bool {
        self.attr.atomic_cap != ffi::IBV_ATOMIC_NONE
    }

    /// GID at `index` of port 1.
    pub fn gid(&self, index: u32) -> Result<[u8; 16]> {
        let mut g = ffi::ibv_gid::default();
        // SAFETY: live context, out-union sized by its type.
        let rc = unsafe { ffi::ibv_query_gid(self.ctx.as_ptr(), PORT, index as i32, &mut g) };
        if rc != 0 {
            bail!(
                "ibv_query_gid({}, 1, {index}): {}",
                self.name,
                io::Error::last_os_error()
            );
        }
        // SAFETY: every bit pattern is a valid [u8; 16].
        Ok(unsafe { g.raw })
    }

    /// A protection domain.
    pub fn alloc_pd(&self) -> Result<Pd<'_>> {
        // SAFETY: live context.
        let pd = unsafe { ffi::ibv_alloc_pd(self.ctx.as_ptr()) };
        Ok(Pd {
            pd: NonNull::new(pd)
                .ok_or_else(|| anyhow!("ibv_alloc_pd: {}", io::Error::last_os_error()))?,
            _d: PhantomData,
        })
    }

    /// A completion queue with at least `entries` entries.
    pub fn create_cq(&self, entries: i32) -> Result<Cq<'_>> {
        // SAFETY: live context; no channel, no user context.
        let cq = unsafe {
            ffi::ibv_create_cq(
                self.ctx.as_ptr(),
                entries,
                ptr::null_mut(),
                ptr::null_mut(),
                0,
            )
        };
        Ok(Cq {
            cq: NonNull::new(cq).ok_or_else(|| {
                anyhow!("ibv_create_cq({entries}): {}", io::Error::last_os_error())
            })?,
            _d: PhantomData,
        })
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: opened in Device::open; every object borrowing it is gone.
        unsafe { ffi::ibv_close_device(self.ctx.as_ptr()) };
    }
}

/// `ibv_pd`.
pub struct Pd<'d> {
    pd: NonNull<ffi::ibv_pd>,
    _d: PhantomData<&'d Device>,
}

impl Drop for Pd<'_> {
    fn drop(&mut self) {
        // SAFETY: allocated in alloc_pd; MRs and QPs borrowing it are gone.
        unsafe { ffi::ibv_dealloc_pd(self.pd.as_ptr()) };
    }
}

/// Why [`Cq::wait`] returned before `n` completions (it hands back the ones
/// that did arrive beside it).
#[derive(Debug, thiserror::Error)]
pub enum CqWaitError {
    /// The deadline passed.
    #[error("timed out with {got} of {want} completions")]
    Timeout {
        /// Completions that arrived.
        got: usize,
        /// Completions waited for.
        want: usize,
    },
    /// `ibv_poll_cq` failed (its message, as the callers show it after
    /// theirs).
    #[error("{0}")]
    Poll(anyhow::Error),
}

/// `ibv_cq`.
pub struct Cq<'d> {
    cq: NonNull<ffi::ibv_cq>,
    _d: PhantomData<&'d Device>,
}

impl Drop for Cq<'_> {
    fn drop(&mut self) {
        // SAFETY: created in create_cq; QPs using it are destroyed first
        // (they borrow it).
        unsafe { ffi::ibv_destroy_cq(self.cq.as_ptr()) };
    }
}

impl Cq<'_> {
    /// Polls up to `max` completions without blocking.
    pub fn poll(&self, max: usize) -> Result<Vec<Completion>> {
        let mut wcs = vec![ffi::ibv_wc::default(); max.max(1)];
        // SAFETY: ibv_poll_cq is an inline in verbs.h calling the provider's
        // ops.poll_cq; the CQ and its context are live, wcs has room for
        // wcs.len() entries.
        let n = unsafe {
            let ctx = (*self.cq.as_ptr()).context;
            let poll = (*ctx)
                .ops
                .poll_cq
                .ok_or_else(|| anyhow!("provider has no poll_cq"))?;
            poll(self.cq.as_ptr(), wcs.len() as i32, wcs.as_mut_ptr())
        };
        if n < 0 {
            bail!("ibv_poll_cq failed ({n})");
        }
        Ok(wcs[..n as usize]
            .iter()
            .map(|w| Completion {
                wr_id: w.wr_id(),
                error: w.error(),
                opcode: w.opcode(),
                byte_len: w.len() as u32,
                imm: if (w.wc_flags & ffi::ibv_wc_flags::IBV_WC_WITH_IMM).0 != 0 {
                    // imm_data is in network order on the wire and in the WC
                    Some(u32::from_be(w.imm_data))
                } else {
                    None
                },
            })
            .collect())
    }

    /// Polls until `n` completions arrived or `deadline`; sleeps between
    /// empty polls (the guests have one vCPU, and rxe / siw run in the kernel
    /// on it: spinning would starve them).
    pub fn wait(
        &self,
        n: usize,
        deadline: Instant,
    ) -> Result<Vec<Completion>, (Vec<Completion>, CqWaitError)> {
        let mut got = Vec::with_capacity(n);
        let mut nap = Duration::from_micros(50);
        while got.len() < n {
            match self.poll(n - got.len()) {
                Err(e) => return Err((got, CqWaitError::Poll(e))),
                Ok(v) if v.is_empty() => {
                    if Instant::now() >= deadline {
                        let why = CqWaitError::Timeout {
                            got: got.len(),
                            want: n,
                        };
                        return Err((got, why));
                    }
                    std::thread::sleep(nap);
                    nap = (nap * 2).min(Duration::from_millis(5));
                }
                Ok(v) => {
                    nap = Duration::from_micros(50);
                    got.extend(v);
                }
            }
        }
        Ok(got)
    }
}

/// A page-aligned, zeroed buffer registered for local write, remote
/// read/write and (if `atomic`) remote atomics.
pub struct Mr<'p> {
    mr: NonNull<ffi::ibv_mr>,
    buf: NonNull<u8>,
    layout: std::alloc::Layout,
    _p: PhantomData<&'p ()>,
}

impl Pd<'_> {
    /// Allocates and registers `len` bytes.
    pub fn register(&self, len: usize, atomic: bool) -> Result<Mr<'_>> {
        let layout = std::alloc::Layout::from_size_align(len.max(1), 4096)?;
        // SAFETY: non-zero size.
        let buf = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) })
            .ok_or_else(|| anyhow!("out of memory for a {len}-byte buffer"))?;
        let mut access = ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ;
        if atomic {
            access |= ffi::ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC;
        }
        // SAFETY: buf is valid for layout.size() bytes and outlives the MR
        // (Drop deregisters before freeing).
        let mr = unsafe {
            ffi::ibv_reg_mr(
                self.pd.as_ptr(),
                buf.as_ptr().cast(),
                layout.size(),
                access.0 as i32,
            )
        };
        match NonNull::new(mr) {
            Some(mr) => Ok(Mr {
                mr,
                buf,
                layout,
                _p: PhantomData,
            }),
            None => {
                let e = io::Error::last_os_error();
                // SAFETY: allocated above with this layout, not registered.
                unsafe { std::alloc::dealloc(buf.as_ptr(), layout) };
                bail!("ibv_reg_mr({len} bytes): {e}")
            }
        }
    }
}

impl Mr<'_> {
    /// Buffer address (what the peer uses as remote address).
    pub fn addr(&self) -> u64 {
        self.buf.as_ptr() as u64
    }
    /// Length.
    pub fn len(&self) -> usize {
        self.layout.size()
    }
    /// Whether the buffer is empty (never: at least one byte).
    pub fn is_empty(&self) -> bool {
        false
    }
    /// Local key.
    pub fn lkey(&self) -> u32 {
        // SAFETY: live MR.
        unsafe { (*self.mr.as_ptr()).lkey }
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        // SAFETY: live MR.
        unsafe { (*self.mr.as_ptr()).rkey }
    }
    /// A copy of `range` (the device may write the buffer at any time, so the
    /// test reads copies, with volatile loads, rather than holding slices).
    pub fn read(&self, range: std::ops::Range<usize>) -> Vec<u8> {
        assert!(range.start <= range.end && range.end <= self.len());
        // SAFETY: in bounds (checked); volatile because the device writes
        // behind the compiler's back.
        range
            .map(|i| unsafe { ptr::read_volatile(self.buf.as_ptr().add(i)) })
            .collect()
    }
    /// Writes `data` at `off` (only while no operation targets that range).
    pub fn write(&self, off: usize, data: &[u8]) {
        assert!(off.checked_add(data.len()).is_some_and(|e| e <= self.len()));
        // SAFETY: in bounds (checked).
        unsafe { ptr::copy_nonoverlapping(data.as_ptr(), self.buf.as_ptr().add(off), data.len()) };
    }
    /// The 8-byte word at `off` (8-aligned), as the device left it.
    pub fn read_u64(&self, off: usize) -> u64 {
        assert!(off.is_multiple_of(8) && off + 8 <= self.len());
        // SAFETY: aligned (page-aligned buffer, 8-aligned offset), in bounds.
        unsafe { ptr::read_volatile(self.buf.as_ptr().add(off).cast::<u64>()) }
    }
    /// Stores an 8-byte word at `off` (8-aligned).
    pub fn write_u64(&self, off: usize, v: u64) {
        assert!(off.is_multiple_of(8) && off + 8 <= self.len());
        // SAFETY: as in read_u64.
        unsafe { ptr::write_volatile(self.buf.as_ptr().add(off).cast::<u64>(), v) };
    }
    /// Zeroes the whole buffer.
    pub fn clear(&self) {
        // SAFETY: in bounds by construction.
        unsafe { ptr::write_bytes(self.buf.as_ptr(), 0, self.len()) };
    }
}

impl Drop for Mr<'_> {
    fn drop(&mut self) {
        // SAFETY: registered in register(); the buffer is freed only after
        // deregistration.
        unsafe {
            ffi::ibv_dereg_mr(self.mr.as_ptr());
            std::alloc::dealloc(self.buf.as_ptr(), self.layout);
        }
    }
}

/// What a send work request does.
#[derive(Clone, Copy, Debug)]
pub enum Op {
    /// SEND (with immediate, host order).
    Send { imm: Option<u32> },
    /// RDMA WRITE (with immediate).
    Write {
        remote: u64,
        rkey: u32,
        imm: Option<u32>,
    },
    /// RDMA READ into the local range.
    Read { remote: u64, rkey: u32 },
    /// Compare-and-swap; the old value lands in the (8-byte) local range.
    Cas {
        remote: u64,
        rkey: u32,
        compare: u64,
        swap: u64,
    },
    /// Fetch-and-add; the old value lands in the local range.
    Faa { remote: u64, rkey: u32, add: u64 },
}

/// An RC queue pair (`ibv_qp`).
pub struct Qp<'p> {
    qp: NonNull<ffi::ibv_qp>,
    _p: PhantomData<&'p ()>,
}

impl Pd<'_> {
    /// An RC QP on `cq` (send and receive) with room for `send_wr` / `recv_wr`
    /// outstanding requests.
    pub fn create_rc_qp<'a>(
        &'a self,
        cq: &'a Cq<'_>,
        send_wr: u32,
        recv_wr: u32,
    ) -> Result<Qp<'a>> {
        let mut init = ffi::ibv_qp_init_attr {
            send_cq: cq.cq.as_ptr(),
            recv_cq: cq.cq.as_ptr(),
            cap: ffi::ibv_qp_cap {
                max_send_wr: send_wr,
                max_recv_wr: recv_wr,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: ffi::ibv_qp_type::IBV_QPT_RC,
            sq_sig_all: 0,
            ..Default::default()
        };
        // SAFETY: live PD and CQ; init fully initialised.
        let qp = unsafe { ffi::ibv_create_qp(self.pd.as_ptr(), &mut init) };
        Ok(Qp {
            qp: NonNull::new(qp).ok_or_else(|| {
                anyhow!(
                    "ibv_create_qp(RC, send_wr {send_wr}, recv_wr {recv_wr}): {}",
                    io::Error::last_os_error()
                )
            })?,
            _p: PhantomData,
        })
    }
}

/// RTR / RTS parameters of a RoCE RC connection.
#[derive(Clone, Copy, Debug)]
pub struct RoceConnect {
    /// Peer QP number.
    pub dest_qpn: u32,
    /// Peer's send PSN = our expected receive PSN.
    pub rq_psn: u32,
    /// Our send PSN.
    pub sq_psn: u32,
    /// Peer GID.
    pub dgid: [u8; 16],
    /// Our GID index.
    pub sgid_index: u8,
    /// Path MTU (`ibv_mtu`).
    pub mtu: u32,
    /// Incoming RDMA READ / atomic depth.
    pub max_dest_rd_atomic: u8,
    /// Outgoing RDMA READ / atomic depth.
    pub max_rd_atomic: u8,
}

impl Qp<'_> {
    /// QP number.
    pub fn qpn(&self) -> u32 {
        // SAFETY: live QP.
        unsafe { (*self.qp.as_ptr()).qp_num }
    }

    fn modify(
        &self,
        attr: &mut ffi::ibv_qp_attr,
        mask: ffi::ibv_qp_attr_mask,
        what: &str,
    ) -> Result<()> {
        // SAFETY: live QP, attr initialised for the bits in mask.
        let rc = unsafe { ffi::ibv_modify_qp(self.qp.as_ptr(), attr, mask.0 as i32) };
        if rc != 0 {
            bail!(
                "ibv_modify_qp to {what}: {}",
                io::Error::from_raw_os_error(rc)
            );
        }
        Ok(())
    }

    /// RESET -> INIT with remote read/write (+atomic) access. `iwarp`: only
    /// state and access (what rdma_cm's init attributes carry for iWARP).
    pub fn to_init(&self, atomic: bool, iwarp: bool) -> Result<()> {
        let mut access = ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ;
        if atomic {
            access |= ffi::ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC;
        }
        let mut attr = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_INIT,
            qp_access_flags: access.0,
            pkey_index: 0,
            port_num: PORT,
            ..Default::default()
        };
        let mut mask =
            ffi::ibv_qp_attr_mask::IBV_QP_STATE | ffi::ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS;
        if !iwarp {
            mask |= ffi::ibv_qp_attr_mask::IBV_QP_PKEY_INDEX | ffi::ibv_qp_attr_mask::IBV_QP_PORT;
        }
        self.modify(&mut attr, mask, "INIT")
    }

    /// INIT -> RTR -> RTS for RoCE (addressing by GID, RoCEv2).
    pub fn connect_roce(&self, c: &RoceConnect) -> Result<()> {
        let mut grh = ffi::ibv_global_route {
            sgid_index: c.sgid_index,
            hop_limit: 64,
            ..Default::default()
        };
        grh.dgid.raw = c.dgid;
        let mut attr = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_RTR,
            path_mtu: c.mtu,
            dest_qp_num: c.dest_qpn,
            rq_psn: c.rq_psn,
            max_dest_rd_atomic: c.max_dest_rd_atomic,
            min_rnr_timer: 12,
            ah_attr: ffi::ibv_ah_attr {
                grh,
                is_global: 1,
                port_num: PORT,
                ..Default::default()
            },
            ..Default::default()
        };
        use ffi::ibv_qp_attr_mask as M;
        self.modify(
            &mut attr,
            M::IBV_QP_STATE
                | M::IBV_QP_AV
                | M::IBV_QP_PATH_MTU
                | M::IBV_QP_DEST_QPN
                | M::IBV_QP_RQ_PSN
                | M::IBV_QP_MAX_DEST_RD_ATOMIC
                | M::IBV_QP_MIN_RNR_TIMER,
            "RTR",
        )?;
        let mut attr = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_RTS,
            sq_psn: c.sq_psn,
            // 4.096 us * 2^16 = 268 ms: TCG guests on a loaded host answer slowly
            timeout: 16,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: c.max_rd_atomic,
            ..Default::default()
        };
        self.modify(
            &mut attr,
            M::IBV_QP_STATE
                | M::IBV_QP_SQ_PSN
                | M::IBV_QP_TIMEOUT
                | M::IBV_QP_RETRY_CNT
                | M::IBV_QP_RNR_RETRY
                | M::IBV_QP_MAX_QP_RD_ATOMIC,
            "RTS",
        )
    }

    /// Posts one receive of `len` bytes at `off` of `mr` (`wr_id` echoed).
    pub fn post_recv(&self, mr: &Mr<'_>, off: usize, len: usize, wr_id: u64) -> Result<()> {
        assert!(off.checked_add(len).is_some_and(|e| e <= mr.len()));
        let mut sge = ffi::ibv_sge {
            addr: mr.addr() + off as u64,
            length: len as u32,
            lkey: mr.lkey(),
        };
        let mut wr = ffi::ibv_recv_wr {
            wr_id,
            next: ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let mut bad: *mut ffi::ibv_recv_wr = ptr::null_mut();
        // SAFETY: ibv_post_recv is an inline calling ops.post_recv; QP live,
        // sge inside a registered MR (asserted), wr/sge live for the call
        // (providers copy them).
        let rc = unsafe {
            let ctx = (*self.qp.as_ptr()).context;
            let post = (*ctx)
                .ops
                .post_recv
                .ok_or_else(|| anyhow!("provider has no post_recv"))?;
            post(self.qp.as_ptr(), &mut wr, &mut bad)
        };
        if rc != 0 {
            bail!("ibv_post_recv: {}", io::Error::from_raw_os_error(rc.abs()));
        }
        Ok(())
    }

    /// Posts one signaled send-queue request using `len` bytes at `off` of
    /// `mr` as its local buffer.
    pub fn post_send(&self, mr: &Mr<'_>, off: usize, len: usize, wr_id: u64, op: Op) -> Result<()> {
        assert!(off.checked_add(len).is_some_and(|e| e <= mr.len()));
        let mut sge = ffi::ibv_sge {
            addr: mr.addr() + off as u64,
            length: len as u32,
            lkey: mr.lkey(),
        };
        let mut wr = ffi::ibv_send_wr {
            wr_id,
            next: ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
            send_flags: ffi::ibv_send_flags::IBV_SEND_SIGNALED.0,
            ..Default::default()
        };
        use ffi::ibv_wr_opcode as O;
        match op {
            Op::Send { imm } => {
                wr.opcode = if imm.is_some() {
                    O::IBV_WR_SEND_WITH_IMM
                } else {
                    O::IBV_WR_SEND
                };
                wr.__bindgen_anon_1.imm_data = imm.unwrap_or(0).to_be();
            }
            Op::Write { remote, rkey, imm } => {
                wr.opcode = if imm.is_some() {
                    O::IBV_WR_RDMA_WRITE_WITH_IMM
                } else {
                    O::IBV_WR_RDMA_WRITE
                };
                wr.__bindgen_anon_1.imm_data = imm.unwrap_or(0).to_be();
                wr.wr.rdma = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
                    remote_addr: remote,
                    rkey,
                };
            }
            Op::Read { remote, rkey } => {
                wr.opcode = O::IBV_WR_RDMA_READ;
                wr.wr.rdma = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
                    remote_addr: remote,
                    rkey,
                };
            }
            Op::Cas {
                remote,
                rkey,
                compare,
                swap,
            } => {
                wr.opcode = O::IBV_WR_ATOMIC_CMP_AND_SWP;
                wr.wr.atomic = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
                    remote_addr: remote,
                    compare_add: compare,
                    swap,
                    rkey,
                };
            }
            Op::Faa { remote, rkey, add } => {
                wr.opcode = O::IBV_WR_ATOMIC_FETCH_AND_ADD;
                wr.wr.atomic = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
                    remote_addr: remote,
                    compare_add: add,
                    swap: 0,
                    rkey,
                };
            }
        }
        let mut bad: *mut ffi::ibv_send_wr = ptr::null_mut();
        // SAFETY: ibv_post_send is an inline calling ops.post_send; QP live,
        // sge inside a registered MR (asserted), wr/sge live for the call.
        let rc = unsafe {
            let ctx = (*self.qp.as_ptr()).context;
            let post = (*ctx)
                .ops
                .post_send
                .ok_or_else(|| anyhow!("provider has no post_send"))?;
            post(self.qp.as_ptr(), &mut wr, &mut bad)
        };
        if rc != 0 {
            // providers return an errno, some (libsiw) negated
            return Err(io::Error::from_raw_os_error(rc.abs()))
                .with_context(|| format!("ibv_post_send({op:?})"));
        }
        Ok(())
    }
}

impl Drop for Qp<'_> {
    fn drop(&mut self) {
        // SAFETY: created in create_rc_qp.
        unsafe { ffi::ibv_destroy_qp(self.qp.as_ptr()) };
    }
}

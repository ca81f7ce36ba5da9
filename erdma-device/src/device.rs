//! The device: register file, reset/init handshake, doorbell decoding and
//! the `PciDevice` implementation. Commands are in [`crate::cmdq`], the data
//! path in [`crate::datapath`].

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Instant;

use pci_model::{
    BarInfo, DeviceIo, FaultError, FaultKindInfo, FaultSpec, FaultStatus, MsixInfo, PciDevice,
    PciIdentity, RxRefusal, TraceKind,
};

use crate::config::ErdmaConfig;
use crate::counters::Counters;
use crate::cq::CompletionQueue;
use crate::eq::{EqPush, EventQueue};
use crate::mr::MrTable;
use crate::qp::{Av, Qp};
use crate::regs::{self, off};

/// Kind of a doorbell page in BAR 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DbKind {
    /// SQ doorbells (value: QPN 51:32, PI 15:0).
    Sq,
    /// RQ doorbells (value: first qword of the RQE).
    Rq,
    /// CQ doorbells (value: CQ doorbell format).
    Cq,
}

/// The command queue state latched at INIT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cmdq {
    /// SQ ring address.
    pub sq_base: u64,
    /// SQ depth in WQEBBs.
    pub sq_depth: u32,
    /// SQ consumer index (WQEBBs).
    pub sq_ci: u16,
    /// SQ producer index from the last doorbell.
    pub sq_pi: u16,
    /// CQ ring address.
    pub cq_base: u64,
    /// CQ depth (= SQ depth).
    pub cq_depth: u32,
    /// CQ producer index.
    pub cq_pi: u32,
    /// CQ consumer index from the last arm.
    pub cq_ci: u32,
    /// CQ armed (event mode).
    pub cq_armed: bool,
}

/// One global identifier entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gid {
    /// The GID.
    pub gid: [u8; 16],
    /// 0 IPv4 (v4-mapped), 1 IPv6.
    pub ntype: u8,
}

/// An address handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ah {
    /// PD number.
    pub pdn: u32,
    /// Address vector.
    pub av: Av,
}

/// Raw register values written by the driver.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RegFile {
    pub ctrl: u32,
    pub st: u32,
    pub cmdq_sq_addr: u64,
    pub cmdq_cq_addr: u64,
    pub cmdq_depth: u32,
    pub cmdq_eq_depth: u32,
    pub cmdq_eq_addr: u64,
    pub aeq_addr: u64,
    pub aeq_depth: u32,
    pub cmdq_sq_dbrec: u64,
    pub cmdq_cq_dbrec: u64,
    pub cmdq_eq_dbrec: u64,
    pub aeq_dbrec: u64,
}

/// A frame an RC engine refused: kept as is, formatted only when asked.
#[derive(Debug, Clone)]
pub(crate) struct RxRefusalNote {
    pub(crate) qpn: u32,
    pub(crate) opcode: roce_model::Opcode,
    /// `None`: the QP has no RC engine.
    pub(crate) error: Option<roce_model::QpError>,
}

/// The erdma device model (RoCEv2 flavour).
pub struct ErdmaDevice {
    pub(crate) cfg: ErdmaConfig,
    pub(crate) counters: Counters,
    /// Why the RC engine refused the last frame it refused.
    pub(crate) last_rx_refusal: Option<RxRefusalNote>,
    /// The first error completion (or the RC engine's last error reason).
    pub(crate) last_error_completion: Option<String>,
    pub(crate) regs: RegFile,
    /// Low half of a 64-bit register written as two dwords: (offset, value).
    pub(crate) latch: Option<(u64, u32)>,
    pub(crate) cmdq: Option<Cmdq>,
    pub(crate) cmdq_eq: Option<EventQueue>,
    pub(crate) aeq: Option<EventQueue>,
    pub(crate) ceqs: BTreeMap<u32, EventQueue>,
    pub(crate) cqs: BTreeMap<u32, CompletionQueue>,
    pub(crate) qps: BTreeMap<u32, Qp>,
    pub(crate) mrs: MrTable,
    pub(crate) ahs: BTreeMap<u32, Ah>,
    pub(crate) gids: Vec<Option<Gid>>,
    /// Netdev MTU from CONF_MTU (0 = never configured).
    pub(crate) mtu: u32,
    /// Guest page shift from CONF_DEVICE.
    pub(crate) page_shift: u32,
    /// Extended doorbell allocations: sdb page -> (rdb-field page, cdb-field page).
    pub(crate) db_allocs: BTreeMap<u16, (u16, u16)>,
    /// Kinds of pool doorbell pages (4 KiB page index in BAR 0).
    pub(crate) db_pages: BTreeMap<u64, DbKind>,
    /// QPs with SQ work noted by doorbells.
    pub(crate) sq_kicks: BTreeSet<u32>,
    /// QPs with RQ work noted by doorbells.
    pub(crate) rq_kicks: BTreeSet<u32>,
    /// Command-queue doorbell seen.
    pub(crate) cmdq_kick: bool,
    /// CQs armed with completions already pending (event due).
    pub(crate) pending_cq_events: BTreeSet<u32>,
    /// Work requests the RC engines hold for this device (send and
    /// receive), bounded by `ErdmaConfig::max_engine_wrs`.
    pub(crate) engine_wrs: usize,
    /// QPs whose SQ waits for room in the engines (re-kicked when a
    /// completion frees some).
    pub(crate) stalled_sq: BTreeSet<u32>,
    /// Likewise for RQs.
    pub(crate) stalled_rq: BTreeSet<u32>,
    /// A poll stopped at its frame budget with RC frames left to send.
    pub(crate) tx_more: bool,
    /// Frames a QP of this function sent to a QP of this function (the
    /// destination GID is one of its own): looped back inside the device,
    /// as an RDMA NIC does, and taken at the next `poll`. Bounded by twice
    /// `ErdmaConfig::max_tx_frames_per_poll`; past it they are dropped
    /// (counted; RC retransmits).
    pub(crate) loopback: VecDeque<Vec<u8>>,
    /// The edge's receivers were full at the last call
    /// (`DeviceIo::tx_paused`): frames wait in the engines and SQs until
    /// the edge polls again, which it does when the pause ends.
    pub(crate) tx_paused: bool,
    pub(crate) next_wr_id: u64,
    pub(crate) ip_ident: u16,
    /// Device-fault rules and the port state (kept over device resets:
    /// they belong to the bench, not to the driver).
    pub(crate) faults: crate::faults::Faults,
}

impl std::fmt::Debug for ErdmaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ErdmaDevice")
            .field("mac", &self.cfg.mac)
            .field("st", &self.regs.st)
            .field("qps", &self.qps.len())
            .field("cqs", &self.cqs.len())
            .field("mrs", &self.mrs.len())
            .finish()
    }
}

impl ErdmaDevice {
    /// A device with `cfg` (see [`ErdmaConfig::new`] for the defaults).
    pub fn new(cfg: ErdmaConfig) -> Self {
        let max_mr_index = cfg.qpn_space() * 2;
        let gids = vec![None; 1usize << cfg.max_gid_log2.min(8)];
        ErdmaDevice {
            mrs: MrTable::new(cfg.max_live_mrs, max_mr_index),
            counters: Counters::default(),
            last_rx_refusal: None,
            last_error_completion: None,
            regs: RegFile::default(),
            latch: None,
            cmdq: None,
            cmdq_eq: None,
            aeq: None,
            ceqs: BTreeMap::new(),
            cqs: BTreeMap::new(),
            qps: BTreeMap::new(),
            ahs: BTreeMap::new(),
            gids,
            mtu: 0,
            page_shift: 12,
            db_allocs: BTreeMap::new(),
            db_pages: BTreeMap::new(),
            sq_kicks: BTreeSet::new(),
            rq_kicks: BTreeSet::new(),
            cmdq_kick: false,
            pending_cq_events: BTreeSet::new(),
            engine_wrs: 0,
            stalled_sq: BTreeSet::new(),
            stalled_rq: BTreeSet::new(),
            tx_more: false,
            tx_paused: false,
            loopback: VecDeque::new(),
            // The only clock read: a fixed origin for the engines' Instant
            // API; all time comes from DeviceIo::now.
            next_wr_id: 1,
            ip_ident: 0,
            faults: crate::faults::Faults::default(),
            cfg,
        }
    }

    /// A device with the default configuration for `mac`.
    pub fn with_mac(mac: [u8; 6]) -> Self {
        Self::new(ErdmaConfig::new(mac))
    }

    /// The configuration.
    pub fn config(&self) -> &ErdmaConfig {
        &self.cfg
    }

    /// The counters (live-object gauges refreshed).
    pub fn counters(&self) -> Counters {
        let mut c = self.counters.clone();
        c.qps_live = self.qps.len() as u64;
        c.cqs_live = self.cqs.len() as u64;
        c.mrs_live = self.mrs.len() as u64;
        c.ceqs_live = self.ceqs.len() as u64;
        c.ahs_live = self.ahs.len() as u64;
        c.gids_live = self.gids.iter().flatten().count() as u64;
        c.db_allocs_live = self.db_allocs.len() as u64;
        c.engine_wrs_live = self.engine_wrs as u64;
        for e in self.qps.values().filter_map(|q| q.engine.as_ref()) {
            c.add_rc(e.stats());
        }
        c
    }

    /// Why a QP's RC engine refused the last frame it refused (state, PSN,
    /// key or length checks), for diagnosis.
    pub fn last_rx_refusal(&self) -> Option<String> {
        self.last_rx_refusal.as_ref().map(|n| match &n.error {
            Some(e) => format!("QP {} ({:?}): {e}", n.qpn, n.opcode),
            None => format!("QP {}: no RC engine", n.qpn),
        })
    }

    /// What the last error completion was (QP, opcode, status; the RC
    /// engine's reason when it came from there), for diagnosis.
    pub fn last_error_completion(&self) -> Option<&str> {
        self.last_error_completion.as_deref()
    }

    /// The `DEV_ST` register.
    pub fn status(&self) -> u32 {
        self.regs.st
    }

    /// State of QP `qpn` ([`crate::qp::qps`]), if it exists.
    pub fn qp_state(&self, qpn: u32) -> Option<u8> {
        self.qps.get(&qpn).map(|q| q.state)
    }

    /// The GID at `index`, if set.
    pub fn gid(&self, index: usize) -> Option<Gid> {
        self.gids.get(index).copied().flatten()
    }

    /// Path MTU in bytes the RC engines use.
    pub fn path_mtu(&self) -> u32 {
        self.engine_mtu().bytes()
    }

    pub(crate) fn engine_mtu(&self) -> roce_model::Mtu {
        let from_bytes = |b: u32| {
            let code = match b {
                0..=383 => 1,
                384..=767 => 2,
                768..=1535 => 3,
                1536..=3071 => 4,
                _ => 5,
            };
            roce_model::Mtu::from_code(code).unwrap_or(roce_model::Mtu::Mtu1024)
        };
        let mtu = if self.mtu == 0 {
            from_bytes(self.cfg.default_path_mtu)
        } else {
            roce_model::Mtu::for_netdev_mtu(self.mtu).unwrap_or(roce_model::Mtu::Mtu256)
        };
        let cap = from_bytes(self.cfg.max_path_mtu);
        if cap.bytes() < mtu.bytes() {
            cap
        } else {
            mtu
        }
    }

    /// Drops every object and queue (CTRL reset, FLR).
    pub(crate) fn reset_state(&mut self) {
        self.cmdq = None;
        self.cmdq_eq = None;
        self.aeq = None;
        self.ceqs.clear();
        self.cqs.clear();
        for q in std::mem::take(&mut self.qps).into_values() {
            if let Some(e) = q.engine.as_ref() {
                self.counters.add_rc(e.stats());
            }
        }
        self.mrs.clear();
        self.ahs.clear();
        for g in &mut self.gids {
            *g = None;
        }
        self.mtu = 0;
        self.page_shift = 12;
        self.db_allocs.clear();
        self.db_pages.clear();
        self.sq_kicks.clear();
        self.rq_kicks.clear();
        self.cmdq_kick = false;
        self.pending_cq_events.clear();
        self.engine_wrs = 0;
        self.stalled_sq.clear();
        self.stalled_rq.clear();
        self.tx_more = false;
        self.tx_paused = false;
        self.loopback.clear();
        self.latch = None;
        self.counters.resets += 1;
    }

    fn try_init(&mut self) -> bool {
        let r = &self.regs;
        let pow2 = |v: u32, max: u32| v != 0 && v.is_power_of_two() && v <= max;
        // EQ depths: see eq::MAX_EQ_DEPTH (the driver's u16 CI).
        if !pow2(r.cmdq_depth, 4096)
            || !pow2(r.cmdq_eq_depth, 4096)
            || !crate::eq::depth_ok(r.aeq_depth)
            || r.cmdq_sq_addr == 0
            || r.cmdq_cq_addr == 0
            || r.cmdq_eq_addr == 0
            || r.aeq_addr == 0
        {
            return false;
        }
        self.cmdq = Some(Cmdq {
            sq_base: r.cmdq_sq_addr,
            sq_depth: r.cmdq_depth,
            sq_ci: 0,
            sq_pi: 0,
            cq_base: r.cmdq_cq_addr,
            cq_depth: r.cmdq_depth,
            cq_pi: 0,
            cq_ci: 0,
            cq_armed: false,
        });
        self.cmdq_eq = Some(EventQueue::new(
            r.cmdq_eq_addr,
            r.cmdq_eq_depth,
            r.cmdq_eq_dbrec,
            regs::MSIX_VECTOR_CMDQ,
        ));
        self.aeq = Some(EventQueue::new(
            r.aeq_addr,
            r.aeq_depth,
            r.aeq_dbrec,
            regs::MSIX_VECTOR_CMDQ,
        ));
        true
    }

    pub(crate) fn raise(&mut self, io: &mut DeviceIo<'_>, vector: u16) {
        self.counters.irqs += 1;
        io.irqs.push(vector);
    }

    /// Pushes an EQE on the AEQ.
    pub(crate) fn async_event(&mut self, io: &mut DeviceIo<'_>, eqe: [u8; 16]) {
        io.trace(TraceKind::Event, || {
            format!(
                "AEQE {} data0={}{}",
                crate::names::ae_type(eqe[2]),
                u32::from_le_bytes([eqe[4], eqe[5], eqe[6], eqe[7]]),
                if self.aeq.is_none() {
                    " (no AEQ: lost)"
                } else {
                    ""
                }
            )
        });
        let r = match self.aeq.as_mut() {
            Some(eq) => eq.push(io.dma, eqe),
            None => EqPush::Full,
        };
        self.counters.async_events += 1;
        self.account_eq(io, r);
    }

    pub(crate) fn account_eq(&mut self, io: &mut DeviceIo<'_>, r: EqPush) {
        match r {
            EqPush::Irq(v) => {
                self.counters.eqes_written += 1;
                self.raise(io, v);
            }
            EqPush::Quiet => self.counters.eqes_written += 1,
            EqPush::Full => self.counters.eq_overflows += 1,
            EqPush::DmaError => {
                self.counters.eq_overflows += 1;
                self.counters.dma_errors += 1;
            }
        }
    }

    /// A CEQE for `cqn` on its EQ.
    pub(crate) fn cq_event(&mut self, io: &mut DeviceIo<'_>, cqn: u32) {
        let Some(eqn) = self.cqs.get(&cqn).map(|c| c.eqn) else {
            return;
        };
        io.trace(TraceKind::Event, || format!("CEQE eq={eqn} cqn={cqn}"));
        let r = match self.ceqs.get_mut(&eqn) {
            Some(eq) => eq.push(io.dma, crate::eq::ceqe(cqn)),
            None => EqPush::Full,
        };
        self.account_eq(io, r);
    }

    fn reg_read32(&self, o: u64) -> u32 {
        let r = &self.regs;
        let lo = |v: u64| v as u32;
        let hi = |v: u64| (v >> 32) as u32;
        let m = self.cfg.mac;
        match o {
            off::VERSION => self.cfg.version,
            off::DEV_PROTO => regs::PROTO_ROCEV2,
            off::DEV_CTRL => r.ctrl,
            off::DEV_ST => r.st,
            off::NETDEV_MAC_L => u32::from_be_bytes([m[2], m[3], m[4], m[5]]),
            off::NETDEV_MAC_H => u32::from(u16::from_be_bytes([m[0], m[1]])),
            off::CMDQ_SQ_ADDR_L => lo(r.cmdq_sq_addr),
            off::CMDQ_SQ_ADDR_H => hi(r.cmdq_sq_addr),
            off::CMDQ_CQ_ADDR_L => lo(r.cmdq_cq_addr),
            off::CMDQ_CQ_ADDR_H => hi(r.cmdq_cq_addr),
            off::CMDQ_DEPTH => r.cmdq_depth,
            off::CMDQ_EQ_DEPTH => r.cmdq_eq_depth,
            off::CMDQ_EQ_ADDR_L => lo(r.cmdq_eq_addr),
            off::CMDQ_EQ_ADDR_H => hi(r.cmdq_eq_addr),
            off::AEQ_ADDR_L => lo(r.aeq_addr),
            off::AEQ_ADDR_H => hi(r.aeq_addr),
            off::AEQ_DEPTH => r.aeq_depth,
            off::GRP_NUM => u32::from(self.cfg.max_ceqs),
            0x60 => lo(r.cmdq_sq_dbrec),
            0x64 => hi(r.cmdq_sq_dbrec),
            0x68 => lo(r.cmdq_cq_dbrec),
            0x6c => hi(r.cmdq_cq_dbrec),
            0x70 => lo(r.cmdq_eq_dbrec),
            0x74 => hi(r.cmdq_eq_dbrec),
            0x78 => lo(r.aeq_dbrec),
            0x7c => hi(r.aeq_dbrec),
            o if (off::STATS_FIRST..off::STATS_LAST + 8).contains(&o) => {
                let v = self.stat_reg(o & !7);
                if o & 4 == 0 {
                    lo(v)
                } else {
                    hi(v)
                }
            }
            _ => 0,
        }
    }

    fn stat_reg(&self, o: u64) -> u64 {
        let c = &self.counters;
        match o {
            0x80 => c.wqes_executed,
            0x88 => c.tx_frames,
            0x90 => c.tx_bytes,
            0xc0 => c.rx_frames,
            0xc8 => c.rx_bytes,
            0xd0 => c.rx_dropped,
            _ => 0,
        }
    }

    fn reg_write32(&mut self, o: u64, v: u32) {
        let set_lo = |r: &mut u64, v: u32| *r = (*r & !0xffff_ffff) | u64::from(v);
        let set_hi = |r: &mut u64, v: u32| *r = (*r & 0xffff_ffff) | (u64::from(v) << 32);
        let r = &mut self.regs;
        match o {
            off::DEV_CTRL => {
                r.ctrl = v;
                if v & regs::CTRL_RESET != 0 {
                    self.reset_state();
                    self.regs.st = regs::ST_RESET_DONE;
                }
                if v & regs::CTRL_INIT != 0 {
                    if self.try_init() {
                        self.regs.st |= regs::ST_INIT_DONE;
                        self.counters.inits += 1;
                    } else {
                        self.counters.init_failures += 1;
                    }
                }
            }
            off::CMDQ_SQ_ADDR_L => set_lo(&mut r.cmdq_sq_addr, v),
            off::CMDQ_SQ_ADDR_H => set_hi(&mut r.cmdq_sq_addr, v),
            off::CMDQ_CQ_ADDR_L => set_lo(&mut r.cmdq_cq_addr, v),
            off::CMDQ_CQ_ADDR_H => set_hi(&mut r.cmdq_cq_addr, v),
            off::CMDQ_DEPTH => r.cmdq_depth = v,
            off::CMDQ_EQ_DEPTH => r.cmdq_eq_depth = v,
            off::CMDQ_EQ_ADDR_L => set_lo(&mut r.cmdq_eq_addr, v),
            off::CMDQ_EQ_ADDR_H => set_hi(&mut r.cmdq_eq_addr, v),
            off::AEQ_ADDR_L => set_lo(&mut r.aeq_addr, v),
            off::AEQ_ADDR_H => set_hi(&mut r.aeq_addr, v),
            off::AEQ_DEPTH => r.aeq_depth = v,
            _ => self.counters.bad_bar_writes += 1,
        }
    }

    /// Is `o` the start of a 64-bit register or doorbell?
    fn is_reg64(o: u64) -> bool {
        matches!(
            o,
            off::AEQ_DB
                | off::CMDQ_SQ_DB_HOST_ADDR
                | off::CMDQ_CQ_DB_HOST_ADDR
                | off::CMDQ_EQ_DB_HOST_ADDR
                | off::AEQ_DB_HOST_ADDR
                | off::CMDQ_SQDB
                | off::CMDQ_CQDB
        ) || (off::CEQ_DB_BASE..off::CMDQ_SQDB).contains(&o)
            || o >= regs::DB_SPACE_BASE
    }

    fn reg_write64(&mut self, o: u64, v: u64, io: &mut DeviceIo<'_>) {
        match o {
            off::CMDQ_SQ_DB_HOST_ADDR => self.regs.cmdq_sq_dbrec = v,
            off::CMDQ_CQ_DB_HOST_ADDR => self.regs.cmdq_cq_dbrec = v,
            off::CMDQ_EQ_DB_HOST_ADDR => self.regs.cmdq_eq_dbrec = v,
            off::AEQ_DB_HOST_ADDR => self.regs.aeq_dbrec = v,
            off::AEQ_DB => {
                self.counters.doorbells += 1;
                io.trace(TraceKind::Doorbell, || {
                    format!(
                        "AEQ ci={} arm={}",
                        regs::eqdb::ci(v),
                        u8::from(regs::eqdb::arm(v))
                    )
                });
                let r = self
                    .aeq
                    .as_mut()
                    .and_then(|eq| eq.doorbell(regs::eqdb::ci(v), regs::eqdb::arm(v)));
                if self.aeq.is_none() {
                    self.counters.bad_doorbells += 1;
                }
                if let Some(vec) = r {
                    self.raise(io, vec);
                }
            }
            o if (off::CEQ_DB_BASE..off::CMDQ_SQDB).contains(&o) => {
                self.counters.doorbells += 1;
                if o & 7 != 0 {
                    self.counters.bad_doorbells += 1;
                    return;
                }
                let n = ((o - off::CEQ_DB_BASE) / 8) as u32;
                io.trace(TraceKind::Doorbell, || {
                    format!(
                        "{} ci={} arm={}",
                        if n == 0 {
                            "CMDQ EQ".to_owned()
                        } else {
                            format!("CEQ {n}")
                        },
                        regs::eqdb::ci(v),
                        u8::from(regs::eqdb::arm(v))
                    )
                });
                let eq = if n == 0 {
                    self.cmdq_eq.as_mut()
                } else {
                    self.ceqs.get_mut(&n)
                };
                match eq {
                    Some(eq) => {
                        if let Some(vec) = eq.doorbell(regs::eqdb::ci(v), regs::eqdb::arm(v)) {
                            self.raise(io, vec);
                        }
                    }
                    None => self.counters.bad_doorbells += 1,
                }
            }
            off::CMDQ_SQDB => {
                self.counters.cmdq_doorbells += 1;
                io.trace(TraceKind::Doorbell, || format!("CMDQ SQ pi={}", v as u16));
                match self.cmdq.as_mut() {
                    Some(q) => {
                        q.sq_pi = v as u16;
                        self.cmdq_kick = true;
                    }
                    None => self.counters.bad_doorbells += 1,
                }
            }
            off::CMDQ_CQDB => {
                self.counters.cmdq_doorbells += 1;
                io.trace(TraceKind::Doorbell, || {
                    format!(
                        "CMDQ CQ ci={} arm={}",
                        regs::cqdb::ci(v),
                        u8::from(regs::cqdb::arm(v))
                    )
                });
                let fire = match self.cmdq.as_mut() {
                    Some(q) => {
                        q.cq_ci = regs::cqdb::ci(v);
                        if regs::cqdb::arm(v) {
                            if (q.cq_pi & 0xff_ffff) != q.cq_ci {
                                true
                            } else {
                                q.cq_armed = true;
                                false
                            }
                        } else {
                            false
                        }
                    }
                    None => {
                        self.counters.bad_doorbells += 1;
                        false
                    }
                };
                if fire {
                    self.cmdq_event(io);
                }
            }
            o if o >= regs::DB_SPACE_BASE => self.data_doorbell(o, v, io),
            _ => self.counters.bad_bar_writes += 1,
        }
    }

    /// The command-queue EQE (the CQ had completions while armed).
    pub(crate) fn cmdq_event(&mut self, io: &mut DeviceIo<'_>) {
        if let Some(q) = self.cmdq.as_mut() {
            q.cq_armed = false;
        }
        let r = match self.cmdq_eq.as_mut() {
            Some(eq) => eq.push(io.dma, [0u8; 16]),
            None => EqPush::Full,
        };
        self.account_eq(io, r);
    }

    /// Kind of the doorbell page holding `o`.
    pub(crate) fn db_kind(&self, o: u64) -> Option<DbKind> {
        if o >= regs::DB_POOL_START {
            return self.db_pages.get(&(o >> 12)).copied();
        }
        if o >= regs::CQDB_SPACE {
            Some(DbKind::Cq)
        } else if o >= regs::RQDB_SPACE {
            Some(DbKind::Rq)
        } else if o >= regs::SQDB_SPACE {
            Some(DbKind::Sq)
        } else {
            None
        }
    }

    fn data_doorbell(&mut self, o: u64, v: u64, io: &mut DeviceIo<'_>) {
        self.counters.doorbells += 1;
        if self.regs.st & regs::ST_INIT_DONE == 0 {
            self.counters.bad_doorbells += 1;
            return;
        }
        match self.db_kind(o) {
            Some(DbKind::Sq) => {
                let qpn = regs::field(v, 51, 32) as u32;
                io.trace(TraceKind::Doorbell, || {
                    format!("SQ qpn={qpn} pi={}", v as u16)
                });
                match self.qps.get_mut(&qpn) {
                    Some(qp) => {
                        qp.sq_pi = v as u16;
                        self.sq_kicks.insert(qpn);
                    }
                    None => self.counters.bad_doorbells += 1,
                }
            }
            Some(DbKind::Rq) => {
                let qpn = (v >> 32) as u32 & 0xf_ffff;
                io.trace(TraceKind::Doorbell, || {
                    format!("RQ qpn={qpn} pi={}", v as u16)
                });
                match self.qps.get_mut(&qpn) {
                    Some(qp) => {
                        qp.rq_pi = v as u16;
                        self.rq_kicks.insert(qpn);
                    }
                    None => self.counters.bad_doorbells += 1,
                }
            }
            Some(DbKind::Cq) => {
                let cqn = regs::cqdb::cqn(v);
                io.trace(TraceKind::Doorbell, || {
                    format!(
                        "CQ cqn={cqn} ci={} arm={}{}",
                        regs::cqdb::ci(v),
                        u8::from(regs::cqdb::arm(v)),
                        if regs::cqdb::sol(v) { " sol" } else { "" }
                    )
                });
                let fire = match self.cqs.get_mut(&cqn) {
                    Some(cq) => {
                        cq.doorbell(regs::cqdb::ci(v), regs::cqdb::arm(v), regs::cqdb::sol(v))
                    }
                    None => {
                        self.counters.bad_doorbells += 1;
                        false
                    }
                };
                if fire {
                    // Deferred to poll: needs DeviceIo for the EQE.
                    self.pending_cq_events.insert(cqn);
                }
            }
            None => self.counters.bad_doorbells += 1,
        }
    }

    /// Runs the command queue.
    fn run_cmdq(&mut self, io: &mut DeviceIo<'_>) {
        for _ in 0..self.cfg.poll_budget {
            let Some(q) = self.cmdq.as_ref() else { return };
            if q.sq_ci == q.sq_pi || !self.process_one_command(io) {
                return;
            }
        }
    }
}

impl PciDevice for ErdmaDevice {
    fn identity(&self) -> PciIdentity {
        PciIdentity {
            vendor_id: regs::VENDOR_ID,
            device_id: regs::DEVICE_ID,
            subsystem_vendor_id: regs::VENDOR_ID,
            subsystem_id: regs::DEVICE_ID,
            class_code: regs::CLASS_CODE,
            revision: 1,
        }
    }

    fn bars(&self) -> Vec<BarInfo> {
        vec![
            BarInfo {
                index: regs::FUNC_BAR,
                size: regs::FUNC_BAR_SIZE,
                is_64bit: true,
                prefetchable: false,
            },
            BarInfo {
                index: regs::MSIX_BAR,
                size: regs::MSIX_BAR_SIZE,
                is_64bit: true,
                prefetchable: false,
            },
        ]
    }

    fn msix(&self) -> Option<MsixInfo> {
        Some(MsixInfo {
            vectors: regs::NUM_MSIX_VEC,
            table_bar: regs::MSIX_BAR,
            table_offset: regs::MSIX_TABLE_OFFSET,
            pba_bar: regs::MSIX_BAR,
            pba_offset: regs::MSIX_PBA_OFFSET,
        })
    }

    fn bar_read(&mut self, bar: u8, offset: u64, data: &mut [u8], _io: &mut DeviceIo<'_>) {
        data.fill(0);
        let len = data.len() as u64;
        if bar != regs::FUNC_BAR
            || !matches!(len, 1 | 2 | 4 | 8)
            || offset
                .checked_add(len)
                .is_none_or(|e| e > regs::FUNC_BAR_SIZE)
        {
            self.counters.bad_bar_reads += 1;
            return;
        }
        for (i, b) in data.iter_mut().enumerate() {
            let o = offset + i as u64;
            *b = (self.reg_read32(o & !3) >> (8 * (o & 3))) as u8;
        }
    }

    fn bar_write(&mut self, bar: u8, offset: u64, data: &[u8], io: &mut DeviceIo<'_>) {
        let len = data.len() as u64;
        if bar != regs::FUNC_BAR
            || offset
                .checked_add(len)
                .is_none_or(|e| e > regs::FUNC_BAR_SIZE)
        {
            self.counters.bad_bar_writes += 1;
            return;
        }
        match data.len() {
            8 if offset & 7 == 0 => {
                self.latch = None;
                let v = u64::from_le_bytes(regs::le::bytes_at::<8>(data, 0));
                if Self::is_reg64(offset) {
                    self.reg_write64(offset, v, io);
                } else {
                    self.reg_write32(offset, v as u32);
                    self.reg_write32(offset + 4, (v >> 32) as u32);
                }
            }
            4 if offset & 3 == 0 => {
                let v = regs::le::u32_at(data, 0);
                if Self::is_reg64(offset & !7) {
                    if offset & 4 == 0 {
                        self.latch = Some((offset, v));
                    } else if let Some((lo_off, lo)) = self.latch.take() {
                        if lo_off == offset - 4 {
                            let full = u64::from(lo) | (u64::from(v) << 32);
                            self.reg_write64(offset - 4, full, io);
                        } else {
                            self.counters.bad_bar_writes += 1;
                        }
                    } else {
                        self.counters.bad_bar_writes += 1;
                    }
                } else {
                    self.latch = None;
                    self.reg_write32(offset, v);
                }
            }
            _ => self.counters.bad_bar_writes += 1,
        }
    }

    fn poll(&mut self, io: &mut DeviceIo<'_>) {
        self.tx_paused = io.tx_paused;
        if self.regs.st & regs::ST_INIT_DONE == 0 {
            return;
        }
        if self.cmdq_kick {
            self.cmdq_kick = false;
            self.run_cmdq(io);
            if self.cmdq.as_ref().is_some_and(|q| q.sq_ci != q.sq_pi) {
                // Budget exhausted: continue on the next poll.
                self.cmdq_kick = true;
            }
        }
        let events: Vec<u32> = std::mem::take(&mut self.pending_cq_events)
            .into_iter()
            .collect();
        for cqn in events {
            self.cq_event(io, cqn);
        }
        self.run_datapath(io);
        self.run_loopback(io);
    }

    fn receive(
        &mut self,
        frame: &[u8],
        view: &pci_model::ParsedFrame,
        io: &mut DeviceIo<'_>,
    ) -> Result<(), RxRefusal> {
        self.tx_paused = io.tx_paused;
        if self.regs.st & regs::ST_INIT_DONE == 0 {
            return Err(RxRefusal::NotReady);
        }
        if self.port_is_down() {
            // port-down: nothing enters (frames this function sends to
            // itself are looped back inside and still arrive).
            self.counters.rx_dropped += 1;
            self.counters.port_down_drops += 1;
            return Err(RxRefusal::Dropped);
        }
        self.rx_frame(frame, Some(view), io)
    }

    fn next_timeout(&self, now: Instant) -> Option<Instant> {
        self.engine_timeout(now)
    }

    fn reset(&mut self) {
        self.reset_state();
        self.regs = RegFile::default();
    }

    fn register_name(&self, bar: u8, offset: u64) -> Option<&'static str> {
        match bar {
            regs::FUNC_BAR => crate::names::register(offset),
            regs::MSIX_BAR if offset < u64::from(regs::MSIX_PBA_OFFSET) => Some("MSI-X table"),
            regs::MSIX_BAR if offset < regs::MSIX_BAR_SIZE => Some("MSI-X PBA"),
            _ => None,
        }
    }

    fn fault_kinds(&self) -> &'static [FaultKindInfo] {
        crate::faults::FAULT_KINDS
    }

    fn add_fault(
        &mut self,
        id: u32,
        spec: &FaultSpec,
        io: &mut DeviceIo<'_>,
    ) -> Result<(), FaultError> {
        self.fault_add(id, spec, io)
    }

    fn clear_faults(&mut self, id: Option<u32>, io: &mut DeviceIo<'_>) -> Result<(), FaultError> {
        self.fault_clear(id, io)
    }

    fn faults(&self) -> Vec<FaultStatus> {
        self.fault_status()
    }

    /// The port follows the fabric's link: down, the device neither sends
    /// nor takes frames. The 7.3 driver has no device event for it (its
    /// port state is its netdev's), so the driver sees only the effect on
    /// traffic (RC retries, then RETRY_EXC_ERR).
    fn set_link(&mut self, up: bool, io: &mut DeviceIo<'_>) -> bool {
        self.port_set(up, None, io);
        true
    }
}

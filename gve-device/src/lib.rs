//! `gve-device`: a sans-IO model of Google's gVNIC (`gve`) in DQO RDA mode,
//! good enough for the unmodified Linux gve driver to probe, create queues,
//! send (TSO, checksum offload), receive with header split, and program RSS
//! and ntuple flow rules, so that devmem TCP RX works in a guest.
//!
//! The device is defined by what the driver does; `README.md` is its spec.
//! The model implements [`pci_model::PciDevice`]: the edge (vfio-user
//! server or a test) hands it BAR accesses, guest memory ([`pci_model::Dma`])
//! and frames; it answers with MSI-X vectors and frames in
//! [`pci_model::DeviceIo`].
//!
//! Modules: [`layout`] (PCI ids, BARs, doorbell map), [`regs`] (BAR0),
//! [`adminq`] (admin commands), [`adminq_codes`] (opcodes, statuses and
//! their names), [`describe`] (device descriptor, ptype map),
//! [`tx_dqo`], [`rx_dqo`], [`rsc`] (HW-GRO), [`offload`] (checksums, TSO),
//! [`rss`], [`flow`],
//! [`irq`] (notify blocks), [`counters`] (counters, status snapshot),
//! [`stats`] (the NIC stats report), [`faults`] (device faults for the
//! driver bench).
//!
//! Hostile drivers are expected: every guest address goes through `Dma`,
//! every failure is a status code or a counter, nothing grows with guest
//! input beyond the configured queue/rule limits.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod adminq;
pub mod adminq_codes;
pub mod counters;
pub mod describe;
pub mod faults;
pub mod flow;
pub mod irq;
pub mod layout;
pub mod offload;
pub mod regs;
pub mod rsc;
pub mod rss;
pub mod rx_dqo;
pub mod stats;
pub mod tx_dqo;

use pci_model::fault::{FaultError, FaultKindInfo, FaultSpec, FaultStatus};
use pci_model::{BarInfo, DeviceIo, MsixInfo, PciDevice, PciIdentity, RxRefusal, TraceKind};
use wire::parse::{ParsedFrame, L3};

pub use counters::{Counters, Status};

use counters::{add, inc, RssStatus, RxQueueStatus, TxQueueStatus};
use faults::{Faults, GveFault, RxFault};
use flow::FlowRules;
use irq::NotifyBlock;
use layout::Doorbell;
use rss::Rss;
use rx_dqo::{RxMeta, RxQueue, Split, MAX_BUFS_PER_FRAME};
use tx_dqo::TxQueue;

/// Default of [`GveConfig::tx_poll_bytes`]: 1 MiB.
pub const DEFAULT_TX_POLL_BYTES: u32 = 1 << 20;

/// Device parameters (what DESCRIBE_DEVICE and the registers advertise).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GveConfig {
    /// MAC address.
    pub mac: [u8; 6],
    /// Maximum MTU (`mtu` in the device descriptor).
    pub mtu: u16,
    /// `max_tx_queues` register (clamped to [`layout::MAX_QUEUES`]).
    pub max_tx_queues: u32,
    /// `max_rx_queues` register (clamped to [`layout::MAX_QUEUES`]).
    pub max_rx_queues: u32,
    /// Default TX ring size (power of two).
    pub tx_ring_size: u16,
    /// Default RX ring size (power of two).
    pub rx_ring_size: u16,
    /// MODIFY_RING option: smallest ring.
    pub min_ring_size: u16,
    /// MODIFY_RING option: largest ring.
    pub max_ring_size: u16,
    /// BUFFER_SIZES: largest RX data buffer (4096 lets the driver pick 2K or
    /// 4K).
    pub packet_buffer_size: u16,
    /// BUFFER_SIZES: header buffer size; non-zero enables header split.
    pub header_buffer_size: u16,
    /// FLOW_STEERING: rule slots (0 leaves the option out).
    pub max_flow_rules: u32,
    /// Offer the RSS_CONFIG option (then the driver never sends
    /// CONFIGURE_RSS by itself and queries the device's table).
    pub rss_option: bool,
    /// `default_num_queues` (0: the driver uses the maximum).
    pub default_num_queues: u16,
    /// `counters` (event counters; unused by DQO but must be non-zero for
    /// the driver's allocation).
    pub event_counters: u16,
    /// `max_registered_pages` (QPL only; informative).
    pub max_registered_pages: u64,
    /// REPORT_LINK_SPEED answer, in Mbps.
    pub link_speed_mbps: u64,
    /// HW-GRO: most bytes of one coalesced frame (Ethernet header to the
    /// end of the payload; the IP length field caps it too). 0 turns
    /// coalescing off whatever the driver asks.
    pub rsc_max_bytes: u32,
    /// HW-GRO: how long a chain waits for its next segment (device time);
    /// then a `poll` (asked for by `next_timeout`) writes it out. Zero: a chain lives only inside one
    /// burst of frames from the edge (`begin_rx_burst`..`end_rx_burst`).
    pub rsc_hold: std::time::Duration,
    /// Most bytes of frames one `poll` sends, over all TX queues (at least
    /// 1: a poll always sends a packet when one is ready; the packet that
    /// reaches the bound is sent whole). The rest stays in the rings and
    /// `next_timeout` asks for another poll at once: what one call hands
    /// the edge stays bounded whatever the driver queued.
    pub tx_poll_bytes: u32,
    /// Offer NIC timestamps (`GVE_DEV_OPT_ID_NIC_TIMESTAMP`): the driver
    /// reads the device clock with REPORT_NIC_TIMESTAMP every 250 ms and
    /// registers a PTP clock; RX completions carry the clock's low 32 bits.
    /// Off by default (a real gVNIC offers it on some machine types only).
    pub nic_timestamp: bool,
}

impl Default for GveConfig {
    fn default() -> Self {
        GveConfig {
            mac: [0x42, 0x01, 0x0a, 0x00, 0x00, 0x02],
            mtu: 1500,
            max_tx_queues: 4,
            max_rx_queues: 4,
            tx_ring_size: 512,
            rx_ring_size: 512,
            min_ring_size: 64,
            max_ring_size: 4096,
            packet_buffer_size: 4096,
            header_buffer_size: 128,
            max_flow_rules: 64,
            rss_option: true,
            default_num_queues: 0,
            event_counters: 64,
            max_registered_pages: 0x10000,
            link_speed_mbps: 100_000,
            rsc_max_bytes: rsc::DEFAULT_MAX_BYTES,
            rsc_hold: rsc::DEFAULT_HOLD,
            tx_poll_bytes: DEFAULT_TX_POLL_BYTES,
            nic_timestamp: false,
        }
    }
}

/// Resources from CONFIGURE_DEVICE_RESOURCES.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Resources {
    pub(crate) blocks: Vec<NotifyBlock>,
    pub(crate) msix_base: u32,
}

/// The device.
#[derive(Debug, Clone)]
pub struct GveDevice {
    pub(crate) cfg: GveConfig,
    pub(crate) device_status: u32,
    pub(crate) driver_status: u32,
    pub(crate) driver_version: Vec<u8>,
    pub(crate) version_done: bool,
    pub(crate) adminq_pfn: u32,
    pub(crate) adminq_base_hi: u32,
    pub(crate) adminq_base_lo: u32,
    pub(crate) adminq_length: u16,
    pub(crate) event_counter: u32,
    pub(crate) adminq_doorbell: Option<u32>,
    pub(crate) resources: Option<Resources>,
    pub(crate) tx: Vec<Option<TxQueue>>,
    /// Per TX queue: a doorbell (or the budget) left work in the ring.
    pub(crate) tx_kick: Vec<bool>,
    /// The TX queue the next poll starts with (round robin under the
    /// budget).
    pub(crate) tx_next: usize,
    /// The last poll found the edge paused (`DeviceIo::tx_paused`).
    pub(crate) tx_paused: bool,
    pub(crate) rx: Vec<Option<RxQueue>>,
    pub(crate) rss: Rss,
    pub(crate) rules: FlowRules,
    pub(crate) mtu: u16,
    pub(crate) stats_report: Option<stats::StatsReport>,
    /// `driver_capability_flags[0]` from VERIFY_DRIVER_COMPATIBILITY.
    pub(crate) driver_caps: u64,
    pub(crate) faults: Faults,
    pub(crate) last_admin_error: Option<(u32, String)>,
    pub(crate) counters: Counters,
    /// HW-GRO chains being built, one per RX queue id (each written out by
    /// its deadline at the latest).
    pub(crate) chains: Vec<rsc::Flows>,
    /// Between `begin_rx_burst` and `end_rx_burst`.
    pub(crate) in_burst: bool,
}

impl GveDevice {
    /// A device after power-on, link up.
    pub fn new(mut cfg: GveConfig) -> Self {
        cfg.max_tx_queues = cfg.max_tx_queues.clamp(1, layout::MAX_QUEUES);
        cfg.max_rx_queues = cfg.max_rx_queues.clamp(1, layout::MAX_QUEUES);
        cfg.header_buffer_size = cfg.header_buffer_size.min(rx_dqo::MAX_HDR_LEN as u16);
        cfg.packet_buffer_size = cfg.packet_buffer_size.clamp(1, rx_dqo::MAX_BUF_LEN as u16);
        cfg.event_counters = cfg.event_counters.max(1);
        // ETH_MIN_MTU (the driver refuses less) .. the hypervisor maximum
        // the driver assumes (gve_tx_add_skb_no_copy_dqo).
        cfg.mtu = cfg.mtu.clamp(68, 9216);
        let counters = Counters::new(cfg.max_tx_queues, cfg.max_rx_queues);
        let mut d = GveDevice {
            device_status: regs::device_status::LINK,
            driver_status: 0,
            driver_version: Vec::new(),
            version_done: false,
            adminq_pfn: 0,
            adminq_base_hi: 0,
            adminq_base_lo: 0,
            adminq_length: 0,
            event_counter: 0,
            adminq_doorbell: None,
            resources: None,
            tx: vec![None; cfg.max_tx_queues as usize],
            tx_kick: vec![false; cfg.max_tx_queues as usize],
            tx_next: 0,
            tx_paused: false,
            rx: vec![None; cfg.max_rx_queues as usize],
            chains: vec![rsc::Flows::default(); cfg.max_rx_queues as usize],
            in_burst: false,
            rss: Rss::default(),
            rules: FlowRules::default(),
            mtu: cfg.mtu,
            stats_report: None,
            driver_caps: 0,
            faults: Faults::default(),
            last_admin_error: None,
            counters,
            cfg,
        };
        d.clear_state();
        d
    }

    /// The configuration in effect (after clamping).
    pub fn config(&self) -> &GveConfig {
        &self.cfg
    }

    /// The counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Drops everything the driver set up (queues, rules, RSS, resources,
    /// admin queue); counters stay.
    fn clear_state(&mut self) {
        self.adminq_pfn = 0;
        self.adminq_base_hi = 0;
        self.adminq_base_lo = 0;
        self.adminq_length = 0;
        self.event_counter = 0;
        self.adminq_doorbell = None;
        self.resources = None;
        self.tx.iter_mut().for_each(|q| *q = None);
        self.tx_kick.iter_mut().for_each(|k| *k = false);
        self.tx_paused = false;
        self.rx.iter_mut().for_each(|q| *q = None);
        // Frames a chain held go with the queues (a reset drops them all).
        self.chains.iter_mut().for_each(rsc::Flows::clear);
        self.rss = Rss::default();
        self.rules = FlowRules::default();
        self.mtu = self.cfg.mtu;
        self.stats_report = None;
        // A reset is what unsticks an admin queue a timeout left stuck.
        self.faults.adminq_stuck = false;
    }

    /// The driver released the admin queue (`gve_adminq_release`): reset
    /// and report `DEVICE_IS_RESET`, which the driver polls for.
    fn driver_reset(&mut self) {
        self.clear_state();
        inc(&mut self.counters.resets);
        self.device_status |= regs::device_status::DEVICE_IS_RESET;
        self.device_status &= !regs::device_status::RESET;
    }

    /// Sets the link bit of `device_status` and raises the management
    /// vector so the driver's service task reads it (`PciDevice::set_link`
    /// and the `link-down`/`link-up` faults).
    fn link(&mut self, up: bool, io: &mut DeviceIo<'_>) {
        if up {
            self.device_status |= regs::device_status::LINK;
        } else {
            self.device_status &= !regs::device_status::LINK;
        }
        io.trace(TraceKind::Event, || {
            format!("device_status link {}", if up { "up" } else { "down" })
        });
        self.raise_mgmt(io);
    }

    /// Asks the driver to reset the device (`GVE_DEVICE_STATUS_RESET_MASK`):
    /// the `reset-request` fault.
    fn request_reset(&mut self, io: &mut DeviceIo<'_>) {
        self.device_status |= regs::device_status::RESET;
        io.trace(TraceKind::Event, || "device_status reset requested".into());
        self.raise_mgmt(io);
    }

    fn raise_mgmt(&mut self, io: &mut DeviceIo<'_>) {
        if let Some(r) = &self.resources {
            // With ntfy_blk_msix_base_idx 0 the management vector is last,
            // with 1 it is first (comment above GVE_NTFY_BLK_BASE_MSIX_IDX).
            let v = if r.msix_base == 0 { r.blocks.len() } else { 0 };
            if let Ok(v) = u16::try_from(v) {
                io.irqs.push(v);
                inc(&mut self.counters.irqs_raised);
            }
        }
    }

    /// Admin queue base address and slot count, if set up.
    pub(crate) fn adminq(&self) -> Option<(u64, u32)> {
        let len = u32::from(self.adminq_length);
        let base = (u64::from(self.adminq_base_hi) << 32) | u64::from(self.adminq_base_lo);
        if len >= 64 && len % 64 == 0 && (len / 64).is_power_of_two() && base != 0 {
            Some((base, len / 64))
        } else {
            None
        }
    }

    fn regs_image(&self) -> [u8; regs::REGS_END as usize] {
        let mut b = [0u8; regs::REGS_END as usize];
        let mut put = |off: u64, v: u32| {
            let o = off as usize;
            b[o..o + 4].copy_from_slice(&v.to_be_bytes());
        };
        put(regs::DEVICE_STATUS, self.device_status);
        put(regs::DRIVER_STATUS, self.driver_status);
        put(regs::MAX_TX_QUEUES, self.cfg.max_tx_queues);
        put(regs::MAX_RX_QUEUES, self.cfg.max_rx_queues);
        put(regs::ADMINQ_PFN, self.adminq_pfn);
        put(regs::ADMINQ_EVENT_COUNTER, self.event_counter);
        put(regs::ADMINQ_BASE_HI, self.adminq_base_hi);
        put(regs::ADMINQ_BASE_LO, self.adminq_base_lo);
        let o = regs::ADMINQ_LENGTH as usize;
        b[o..o + 2].copy_from_slice(&self.adminq_length.to_be_bytes());
        b
    }

    fn bar0_write(&mut self, offset: u64, data: &[u8], io: &mut DeviceIo<'_>) {
        let be32 = || -> Option<u32> { Some(u32::from_be_bytes(data.try_into().ok()?)) };
        match (offset, data.len()) {
            (regs::DRIVER_STATUS, 4) => {
                let v = be32().unwrap_or(0);
                self.driver_status = v;
                if v & regs::driver_status::RESET != 0 {
                    self.driver_reset();
                } else if v & regs::driver_status::RUN != 0 {
                    self.device_status &= !regs::device_status::DEVICE_IS_RESET;
                }
            }
            (regs::ADMINQ_PFN, 4) => {
                // Revision-0 drivers: the PFN both sets up (4 KiB ring) and,
                // written 0, releases the admin queue.
                let v = be32().unwrap_or(0);
                if v == 0 {
                    self.driver_reset();
                } else {
                    let base = u64::from(v) << 12;
                    self.adminq_pfn = v;
                    self.adminq_base_hi = (base >> 32) as u32;
                    self.adminq_base_lo = base as u32;
                    self.adminq_length = 4096;
                    self.device_status &= !regs::device_status::DEVICE_IS_RESET;
                }
            }
            (regs::ADMINQ_DOORBELL, 4) => {
                self.adminq_doorbell = be32();
                let ec = self.event_counter;
                io.trace(TraceKind::Doorbell, || {
                    format!(
                        "adminq_doorbell prod_cnt={} event_counter={ec}",
                        be32().unwrap_or(0)
                    )
                });
            }
            (regs::DRIVER_VERSION, 1) => {
                // One byte at a time, ending in '\n'; a later probe writes a
                // fresh string.
                if self.version_done {
                    self.driver_version.clear();
                    self.version_done = false;
                }
                if data[0] == b'\n' {
                    self.version_done = true;
                } else if self.driver_version.len() < regs::MAX_VERSION_LEN {
                    self.driver_version.push(data[0]);
                }
            }
            (regs::ADMINQ_BASE_HI, 4) => self.adminq_base_hi = be32().unwrap_or(0),
            (regs::ADMINQ_BASE_LO, 4) => self.adminq_base_lo = be32().unwrap_or(0),
            (regs::ADMINQ_LENGTH, 2) => self.adminq_length = u16::from_be_bytes([data[0], data[1]]),
            (regs::ADMINQ_LENGTH, 4) => self.adminq_length = u16::from_be_bytes([data[0], data[1]]),
            _ => inc(&mut self.counters.bad_register_accesses),
        }
    }

    fn bar2_write(&mut self, offset: u64, data: &[u8], io: &mut DeviceIo<'_>) {
        let (Ok(bytes), true) = (<[u8; 4]>::try_from(data), offset % 4 == 0) else {
            inc(&mut self.counters.bad_register_accesses);
            return;
        };
        let val = u32::from_le_bytes(bytes);
        let c = &mut self.counters;
        let db = layout::doorbell(offset / 4);
        io.trace(TraceKind::Doorbell, || match db {
            Some(Doorbell::Irq(n)) => format!("irq block={n} val={val:#x}"),
            Some(Doorbell::Tx(q)) => format!("tx queue={q} tail={val}"),
            Some(Doorbell::Rx(q)) => format!("rx queue={q} buf_tail={val}"),
            None => format!("unknown doorbell word={} val={val:#x}", offset / 4),
        });
        match db {
            Some(Doorbell::Irq(n)) => {
                match self
                    .resources
                    .as_mut()
                    .and_then(|r| r.blocks.get_mut(n as usize))
                {
                    Some(b) => b.doorbell(val, &mut io.irqs, c),
                    None => inc(&mut c.bad_doorbells),
                }
            }
            Some(Doorbell::Tx(q)) => match self.tx.get_mut(q as usize).and_then(|q| q.as_mut()) {
                Some(t) if val < t.ring_size => {
                    t.tail = val;
                    self.tx_kick[q as usize] = true;
                }
                _ => inc(&mut c.bad_doorbells),
            },
            Some(Doorbell::Rx(q)) => match self.rx.get_mut(q as usize).and_then(|q| q.as_mut()) {
                Some(r) if val < r.buf_size => r.buf_tail = val,
                _ => inc(&mut c.bad_doorbells),
            },
            None => inc(&mut c.bad_doorbells),
        }
    }

    fn block_event(&mut self, ntfy: u32, io: &mut DeviceIo<'_>) {
        if let Some(b) = self
            .resources
            .as_mut()
            .and_then(|r| r.blocks.get_mut(ntfy as usize))
        {
            b.event(&mut io.irqs, &mut self.counters);
        }
    }

    fn process_tx(&mut self, io: &mut DeviceIo<'_>) {
        self.tx_paused = io.tx_paused;
        if io.tx_paused {
            // Back-pressure: the descriptors stay in their rings (the
            // kicks too) until the edge polls without the pause; the
            // driver's rings fill and it stops its queues.
            return;
        }
        let budget = self.cfg.tx_poll_bytes.max(1) as usize;
        let mut sent = 0;
        let n = self.tx.len();
        // Round robin: the next poll starts after the last queue served,
        // so under the budget no queue starves the others.
        let first = self.tx_next % n.max(1);
        for qi in (first..n).chain(0..first) {
            if !self.tx_kick[qi] || sent >= budget {
                continue;
            }
            let Some(q) = self.tx[qi].as_mut() else {
                self.tx_kick[qi] = false;
                continue;
            };
            if self.faults.tx_stalled(q.id) {
                // tx-stall: the work stays in the ring (the kick too, for
                // when the rule is cleared); `next_timeout` leaves it out.
                if let Some(id) = self.faults.tx_stall_hit(q.id) {
                    inc(&mut self.counters.faults_fired);
                    let qid = q.id;
                    io.trace(TraceKind::Fault, || {
                        format!("tx-stall rule {id}: TX queue {qid} stops completing")
                    });
                }
                continue;
            }
            self.tx_kick[qi] = false;
            self.tx_next = qi + 1;
            let dma = io.dma;
            let alt_miss = self.driver_caps & faults::CAP_ALT_MISS_COMPL != 0;
            let faults = &mut self.faults;
            let mut fired = 0u64;
            let qid = q.id;
            let mut miss = || {
                let (id, reinject) = faults.tx_miss(qid)?;
                fired += 1;
                io.trace(TraceKind::Fault, || {
                    format!(
                        "tx-miss rule {id}: TX queue {qid} miss completion, {}",
                        if reinject {
                            "reinjected"
                        } else {
                            "no reinjection (dropped)"
                        }
                    )
                });
                Some(reinject)
            };
            let res = q.process(
                dma,
                self.cfg.mtu,
                &mut self.counters,
                budget - sent,
                alt_miss,
                &mut miss,
            );
            add(&mut self.counters.faults_fired, fired);
            let ntfy = q.ntfy;
            sent += res.bytes;
            self.tx_kick[qi] = res.more;
            io.tx.extend(res.frames);
            if res.completed {
                self.block_event(ntfy, io);
            }
        }
    }

    /// IDs of created RX queues, ascending.
    fn created_rx(&self) -> Vec<u32> {
        self.rx.iter().flatten().map(|q| q.id).collect()
    }

    /// A snapshot for `ctl status`.
    pub fn status(&self) -> Status {
        let created = self.created_rx();
        Status {
            device_status: self.device_status,
            driver_version: String::from_utf8_lossy(&self.driver_version).into_owned(),
            adminq_ready: self.adminq().is_some(),
            adminq_event_counter: self.event_counter,
            resources_configured: self.resources.is_some(),
            notify_blocks: self.resources.as_ref().map_or(0, |r| r.blocks.len() as u32),
            mtu: self.mtu,
            tx_queues: self
                .tx
                .iter()
                .flatten()
                .map(|q| TxQueueStatus {
                    id: q.id,
                    ring_size: q.ring_size,
                    head: q.head,
                    tail: q.tail,
                    ntfy_id: q.ntfy,
                    db_index: layout::TX_DB_BASE + q.id,
                })
                .collect(),
            rx_queues: self
                .rx
                .iter()
                .flatten()
                .map(|q| RxQueueStatus {
                    id: q.id,
                    buf_ring_size: q.buf_size,
                    compl_ring_size: q.compl_size,
                    buffers_available: q.available(),
                    packet_buffer_size: q.packet_buffer_size,
                    header_buffer_size: q.header_buffer_size,
                    rsc: q.rsc,
                    ntfy_id: q.ntfy,
                    db_index: layout::RX_DB_BASE + q.id,
                })
                .collect(),
            rss: RssStatus {
                hash_types: self.rss.hash_types,
                key: self.rss.key.to_vec(),
                indirection_table: self.rss.table(&created),
                table_configured: self.rss.lut.is_some(),
            },
            flow_rules: self
                .rules
                .rules
                .iter()
                .map(|(&location, r)| counters::FlowRuleStatus {
                    location,
                    description: r.describe(),
                    queue: r.queue,
                    hits: r.hits,
                })
                .collect(),
            last_admin_error: self.last_admin_error.clone(),
            counters: self.counters.clone(),
        }
    }

    /// The RX queue a parsed frame goes to (flow rules by location, else
    /// RSS, else 0), the location of the rule that matched, and the RSS
    /// hash. Changes nothing.
    fn steer(&self, frame: &[u8], p: &wire::ParsedFrame) -> (u32, Option<u32>, Option<u32>) {
        let hash = self.rss.hash(p);
        if let Some((&loc, r)) = self.rules.rules.iter().find(|(_, r)| r.matches(frame, p)) {
            return (u32::from(r.queue), Some(loc), hash);
        }
        match hash {
            Some(h) => (self.rss.queue(h, &self.created_rx()), None, hash),
            None => (0, None, hash),
        }
    }

    /// Whether frames can be received: resources configured, an RX queue
    /// created, the link up.
    fn rx_ready(&self) -> bool {
        self.resources.is_some()
            && self.rx.iter().any(Option::is_some)
            && self.device_status & regs::device_status::LINK != 0
    }

    /// Counts a frame taken as [`GveDevice::steer`] sent it: by flow rule
    /// `rule` (its hits), else by RSS `hash`.
    fn count_steering(&mut self, rule: Option<u32>, hash: Option<u32>) {
        match rule {
            Some(loc) => {
                if let Some(r) = self.rules.rules.get_mut(&loc) {
                    r.hits = r.hits.saturating_add(1);
                }
                inc(&mut self.counters.flow_rule_hits);
            }
            None if hash.is_some() => inc(&mut self.counters.rss_steered),
            None => {}
        }
    }

    /// Writes out open HW-GRO chain `slot` of RX queue `qid`, if there is one.
    fn flush_chain(&mut self, qid: usize, slot: usize, io: &mut DeviceIo<'_>) {
        let Some(mut chain) = self.chains.get_mut(qid).and_then(|f| f.take(slot)) else {
            return;
        };
        self.write_chain(qid, &mut chain, io);
        self.chains[qid].recycle(chain);
    }

    fn write_chain(&mut self, qid: usize, chain: &mut rsc::Chain, io: &mut DeviceIo<'_>) {
        chain.finish();
        let segments = chain.segments;
        let rsc = (segments > 1).then(|| rx_dqo::Rsc {
            seg_len: u16::try_from(chain.mss).unwrap_or(u16::MAX),
            segments,
        });
        let fault = if self.rx.get(qid).is_some_and(Option::is_some) {
            self.rx_fault(qid as u32, io)
        } else {
            None
        };
        let Some(q) = self.rx.get_mut(qid).and_then(Option::as_mut) else {
            // Cannot happen (queues change in `poll`, which writes every
            // chain out first, or with a reset, which drops them); counted
            // if it ever does.
            add(&mut self.counters.rx_drops, u64::from(segments));
            return;
        };
        // The queue's chains together were checked to fit the buffers
        // posted, which nothing else uses meanwhile (a frame placed
        // directly first writes out what would leave too few): this
        // placement does not fail for lack of them.
        match q.place(
            io.dma,
            &chain.buf,
            chain.split,
            &chain.meta,
            rsc,
            fault,
            &mut self.counters,
        ) {
            Ok(()) => {
                let ntfy = q.ntfy;
                self.block_event(ntfy, io);
            }
            Err(_) => {
                // (A descriptor read failure was counted by `place`.)
                add(&mut self.counters.rx_drops, u64::from(segments));
            }
        }
    }

    /// Writes out every open HW-GRO chain of RX queue `qid`, oldest first.
    fn flush_queue_chains(&mut self, qid: usize, io: &mut DeviceIo<'_>) {
        while self.chains.get(qid).is_some_and(|f| !f.is_empty()) {
            self.flush_chain(qid, 0, io);
        }
    }

    /// The RX fault hook for one frame on queue `qid` that will be placed.
    fn rx_fault(&mut self, qid: u32, io: &mut DeviceIo<'_>) -> Option<RxFault> {
        let (id, f) = self.faults.rx(qid)?;
        inc(&mut self.counters.faults_fired);
        io.trace(TraceKind::Fault, || {
            let what = match f {
                RxFault::Error => "rx_error",
                RxFault::BadCsum(_) => "checksum error bits",
                RxFault::BadBufId => "invalid buf_id",
            };
            format!("rx fault rule {id}: RX queue {qid} completion with {what}")
        });
        Some(f)
    }

    /// Writes out every open HW-GRO chain.
    fn flush_chains(&mut self, io: &mut DeviceIo<'_>) {
        for qid in 0..self.chains.len() {
            self.flush_queue_chains(qid, io);
        }
    }

    /// Writes out the HW-GRO chains whose deadline has come.
    fn flush_due_chains(&mut self, io: &mut DeviceIo<'_>) {
        for qid in 0..self.chains.len() {
            while let Some(slot) = self.chains[qid].first_due(io.now) {
                self.flush_chain(qid, slot, io);
            }
        }
    }

    /// A TSO frame placed as the one HW-GRO packet its `mss`-byte segments
    /// would have made (`rsc.rs`), when its queue coalesces and they would
    /// all have joined one chain; `None`, having changed nothing,
    /// otherwise: the edge offers the segments.
    fn tso_whole(
        &mut self,
        frame: &[u8],
        p: &ParsedFrame,
        mss: u16,
        io: &mut DeviceIo<'_>,
    ) -> Option<Result<(), RxRefusal>> {
        if !self.rx_ready() {
            return None;
        }
        let mss = usize::from(mss);
        let (qid, rule, hash) = self.steer(frame, p);
        let qi = qid as usize;
        let q = self.rx.get(qi)?.as_ref()?;
        // The IP length must cover the frame exactly (no BIG TCP length 0,
        // no padding) for the parsed view to bound the payload.
        if !q.rsc || mss == 0 || p.l3_end != frame.len() {
            return None;
        }
        // A TSO frame's TCP checksum is left partial: nothing to verify;
        // `Chain::finish` computes it and the IPv4 header checksum, as
        // for any chain.
        let unverified = offload::RxCsum {
            processed: true,
            ..Default::default()
        };
        let mut meta = self.rx_meta_with(p, hash, unverified);
        let seg = rsc::segment(frame, p, &meta)?;
        let mtu_frame = usize::from(self.mtu.max(self.cfg.mtu)) + 18;
        if seg.payload <= mss
            || frame.len() > self.rsc_max_len(p)
            || seg.header_end + mss > mtu_frame
        {
            return None;
        }
        let split = Self::split_for(q, frame, p);
        let need = q.buffers_needed(frame.len(), split);
        if need > MAX_BUFS_PER_FRAME || need >= q.buf_size as usize {
            return None;
        }
        if self.chains[qi].held_buffers() + need > q.available() as usize {
            return Some(Err(RxRefusal::NoBuffers));
        }
        self.count_steering(rule, hash);
        if self.cfg.nic_timestamp {
            meta.ts = Some(adminq::nic_clock_ns(io.device_time()) as u32);
        }
        // In order within the flow: what its chain holds goes first.
        if let Some(i) = self.chains[qi].find(frame, &seg) {
            self.flush_chain(qi, i, io);
        }
        let mut chain = self.chains[qi].vacant();
        chain.start_tso(frame, seg, meta, split, mss);
        chain.buffers = need;
        self.write_chain(qi, &mut chain, io);
        self.chains[qi].recycle(chain);
        inc(&mut self.counters.rx_tso_whole);
        Some(Ok(()))
    }

    /// Most bytes of a coalesced frame with these headers: the configured
    /// bound, and 64 KiB - 1 from the IP header on, IPv6's 40 bytes
    /// included (GRO's default `gro_max_size` counts them; 0: no
    /// coalescing).
    fn rsc_max_len(&self, p: &wire::ParsedFrame) -> usize {
        (self.cfg.rsc_max_bytes as usize).min(p.l3_offset + 0xffff)
    }

    /// How header split lays out a frame on queue `q`.
    fn split_for(q: &RxQueue, frame: &[u8], p: &wire::ParsedFrame) -> Split {
        let hs = q.header_buffer_size as usize;
        if hs == 0 {
            return Split::Off;
        }
        match p.l4_header_end() {
            // TCP/UDP without payload (a pure ACK, maybe with Ethernet
            // padding): all of it in the header buffer, no data bytes.
            Some(_) if p.l4_payload_len() == Some(0) && frame.len() <= hs => Split::At(frame.len()),
            // TCP/UDP: headers (L2..L4) to the header buffer.
            Some(end) if end <= hs => Split::At(end),
            Some(_) => Split::Unsplit { overflow: true },
            // Anything else (ARP, ICMP, fragments) goes whole into the header
            // buffer when it fits, so that the kernel can read it even when
            // the data buffers are unreadable devmem.
            None if frame.len() <= hs => Split::At(frame.len()),
            None => Split::Unsplit { overflow: false },
        }
    }

    /// Packet type, hash and checksum facts for the completion.
    fn rx_meta(&self, frame: &[u8], p: &wire::ParsedFrame, hash: Option<u32>) -> RxMeta {
        self.rx_meta_with(p, hash, offload::verify_rx(frame, p))
    }

    /// [`GveDevice::rx_meta`] with the checksum verdict `cs` given (a TSO
    /// frame's checksum is left to the device to write, not to verify).
    fn rx_meta_with(
        &self,
        p: &wire::ParsedFrame,
        hash: Option<u32>,
        cs: offload::RxCsum,
    ) -> RxMeta {
        use describe::{l3, l4};
        let (l3t, proto, ext) = match p.l3 {
            Some(L3::V4(ip)) => (l3::IPV4, Some(ip.protocol), false),
            Some(L3::V6(ip)) => (l3::IPV6, Some(ip.protocol), ip.has_ext_headers),
            None => (l3::UNKNOWN, None, false),
        };
        let fragment = p.l3.is_some_and(|l| l.is_fragment());
        let l4t = match proto {
            _ if fragment => l4::UNKNOWN,
            None => l4::UNKNOWN,
            Some(6) if p.l4.is_some() => l4::TCP,
            Some(17) if p.l4.is_some() => l4::UDP,
            Some(6 | 17) => l4::UNKNOWN,
            Some(1 | 58) => l4::ICMP,
            Some(132) => l4::SCTP,
            Some(_) => l4::OTHER,
        };
        RxMeta {
            ptype: describe::ptype(l3t, l4t),
            hash: hash.unwrap_or(0),
            l3_l4_processed: cs.processed,
            csum_ip_err: cs.ip_err,
            csum_l4_err: cs.l4_err,
            ipv6_ex_add: ext,
            ts: None,
        }
    }
}

impl PciDevice for GveDevice {
    fn identity(&self) -> PciIdentity {
        layout::identity()
    }

    fn bars(&self) -> Vec<BarInfo> {
        layout::bars()
    }

    fn msix(&self) -> Option<MsixInfo> {
        Some(layout::msix(self.cfg.max_tx_queues, self.cfg.max_rx_queues))
    }

    fn bar_read(&mut self, bar: u8, offset: u64, data: &mut [u8], _io: &mut DeviceIo<'_>) {
        data.fill(0);
        if bar != layout::BAR_REGS {
            if bar != layout::BAR_DOORBELLS
                || offset.saturating_add(data.len() as u64) > layout::BAR2_SIZE
            {
                inc(&mut self.counters.bad_register_accesses);
            }
            return;
        }
        let img = self.regs_image();
        let end = offset.saturating_add(data.len() as u64);
        if end > regs::REGS_END {
            inc(&mut self.counters.bad_register_accesses);
        }
        for (i, d) in data.iter_mut().enumerate() {
            if let Some(b) = usize::try_from(offset)
                .ok()
                .and_then(|o| o.checked_add(i))
                .and_then(|o| img.get(o))
            {
                *d = *b;
            }
        }
    }

    fn bar_write(&mut self, bar: u8, offset: u64, data: &[u8], io: &mut DeviceIo<'_>) {
        match bar {
            layout::BAR_REGS => self.bar0_write(offset, data, io),
            layout::BAR_DOORBELLS => self.bar2_write(offset, data, io),
            _ => inc(&mut self.counters.bad_register_accesses),
        }
    }

    fn poll(&mut self, io: &mut DeviceIo<'_>) {
        // Admin commands may destroy or restart queues: what a chain holds
        // goes first.
        if self.adminq_doorbell.is_some() {
            self.flush_chains(io);
        } else {
            self.flush_due_chains(io);
        }
        self.process_adminq(io);
        self.process_tx(io);
        self.write_nic_stats(io);
    }

    fn receive(
        &mut self,
        frame: &[u8],
        p: &ParsedFrame,
        io: &mut DeviceIo<'_>,
    ) -> Result<(), RxRefusal> {
        if !self.rx_ready() {
            return Err(RxRefusal::NotReady);
        }
        let max = usize::from(self.mtu.max(self.cfg.mtu)) + 18;
        if frame.len() < 14 || frame.len() > max {
            inc(&mut self.counters.rx_drops);
            inc(&mut self.counters.rx_oversize);
            if frame.len() >= 14 {
                // Counted on the queue it would have gone to (the NIC
                // stats report's RX_DROPS_PACKET_OVER_MRU).
                let qi = self.steer(frame, p).0 as usize;
                if let Some(q) = self.counters.rx_queues.get_mut(qi) {
                    inc(&mut q.oversize);
                }
            }
            return Err(RxRefusal::Dropped);
        }
        let (qid, rule, hash) = self.steer(frame, p);
        self.count_steering(rule, hash);
        let mut meta = self.rx_meta(frame, p, hash);
        if self.cfg.nic_timestamp {
            // The low 32 bits: the driver extends them from its last read
            // of the clock (`gve_rx_get_hwtstamp`).
            meta.ts = Some(adminq::nic_clock_ns(io.device_time()) as u32);
        }
        if meta.csum_ip_err || meta.csum_l4_err {
            inc(&mut self.counters.rx_csum_errors);
        }
        let qi = qid as usize;
        let Some(q) = self.rx.get(qi).and_then(Option::as_ref) else {
            inc(&mut self.counters.rx_drops);
            inc(&mut self.counters.rx_no_queue);
            return Err(RxRefusal::Dropped);
        };
        let split = Self::split_for(q, frame, p);
        // HW-GRO: inside a burst, or anywhere when a chain may outlive the
        // edge's call (its deadline asks for the poll that ends it).
        let max = self.rsc_max_len(p);
        let may_hold = self.in_burst || !self.cfg.rsc_hold.is_zero();
        let seg = if may_hold && q.rsc && max > 0 {
            rsc::segment(frame, p, &meta)
        } else {
            None
        };
        if let Some(seg) = seg {
            let room = q.available() as usize;
            let need_frame = q.buffers_needed(frame.len(), split);
            let flows = &mut self.chains[qi];
            let held = flows.held_buffers();
            if let Some(i) = flows.find(frame, &seg) {
                let chain = flows.get_mut(i).ok_or(RxRefusal::Dropped)?;
                let need = q.buffers_needed(chain.buf.len() + seg.payload, chain.split);
                if chain.continues(frame, &seg)
                    && chain.buf.len() + seg.payload <= max
                    && need <= MAX_BUFS_PER_FRAME
                    && held - chain.buffers + need <= room
                {
                    chain.append(frame, &seg);
                    chain.buffers = need;
                    // The hold time counts from the last segment: a stream
                    // that keeps coming keeps its chain (up to the bounds).
                    chain.deadline = io.now.checked_add(self.cfg.rsc_hold);
                    if chain.closed(&seg) {
                        self.flush_chain(qi, i, io);
                    }
                    return Ok(());
                }
                // In order within the flow: what its chain holds goes first.
                self.flush_chain(qi, i, io);
            }
            if !seg.ends_chain() && frame.len() <= max && need_frame <= MAX_BUFS_PER_FRAME {
                if self.chains[qi].len() >= rsc::MAX_FLOWS {
                    // Every flow slot in use: the oldest chain goes out.
                    self.flush_chain(qi, 0, io);
                }
                let q = self.rx[qi].as_ref().ok_or(RxRefusal::Dropped)?;
                let room = q.available() as usize;
                let flows = &mut self.chains[qi];
                if flows.held_buffers() + need_frame <= room {
                    let deadline = io.now.checked_add(self.cfg.rsc_hold);
                    let mut chain = flows.vacant();
                    chain.start(frame, seg, meta, split, max, deadline);
                    chain.buffers = need_frame;
                    flows.open(chain);
                    return Ok(());
                }
            }
            // Placed as it is: the chains must keep the buffers they need.
            let q = self.rx[qi].as_ref().ok_or(RxRefusal::Dropped)?;
            if self.chains[qi].held_buffers() + need_frame > q.available() as usize {
                self.flush_queue_chains(qi, io);
            }
        } else {
            // Not coalescable (another protocol, flags, a bad checksum):
            // whatever its flow, the queue's chains go first, in order.
            self.flush_queue_chains(qi, io);
        }
        let fits = self.rx[qi]
            .as_ref()
            .is_some_and(|q| q.fits(frame.len(), split));
        let fault = if fits { self.rx_fault(qid, io) } else { None };
        let q = self.rx[qi].as_mut().ok_or(RxRefusal::Dropped)?;
        q.place(io.dma, frame, split, &meta, None, fault, &mut self.counters)?;
        let ntfy = q.ntfy;
        self.block_event(ntfy, io);
        Ok(())
    }

    fn receive_tso(
        &mut self,
        frame: &[u8],
        p: &ParsedFrame,
        mss: u16,
        io: &mut DeviceIo<'_>,
    ) -> Result<(), RxRefusal> {
        self.tso_whole(frame, p, mss, io)
            .unwrap_or(Err(RxRefusal::Unsegmented))
    }

    /// TX work the budget left in the rings wants a poll at once (not
    /// while the edge is paused: its resume polls); an open HW-GRO chain
    /// wants one at its deadline.
    fn next_timeout(&self, now: std::time::Instant) -> Option<std::time::Instant> {
        let tx = (!self.tx_paused
            && self
                .tx_kick
                .iter()
                .enumerate()
                .any(|(q, &k)| k && !self.faults.tx_stalled(q as u32)))
        .then_some(now);
        let stats = self.nic_stats_due(now);
        let chain = self
            .chains
            .iter()
            .filter_map(rsc::Flows::next_deadline)
            .min();
        tx.into_iter().chain(chain).chain(stats).min()
    }

    fn rx_queue(&self, frame: &[u8], view: &ParsedFrame) -> usize {
        self.steer(frame, view).0 as usize
    }

    fn begin_rx_burst(&mut self) {
        self.in_burst = true;
    }

    fn end_rx_burst(&mut self, io: &mut DeviceIo<'_>) {
        self.in_burst = false;
        // Without a hold time every chain is due now; with one, a chain
        // waits for the next burst until its deadline.
        self.flush_due_chains(io);
    }

    fn reset(&mut self) {
        self.in_burst = false;
        self.clear_state();
        // The link is the port's, not the function's: it stays as it is.
        self.device_status &= regs::device_status::LINK;
        self.driver_status = 0;
        self.driver_version.clear();
        self.driver_caps = 0;
        self.last_admin_error = None;
        inc(&mut self.counters.resets);
    }

    fn register_name(&self, bar: u8, offset: u64) -> Option<&'static str> {
        match bar {
            layout::BAR_REGS => regs::name(offset),
            layout::BAR_DOORBELLS => match layout::doorbell(offset / 4)? {
                Doorbell::Irq(_) => Some("irq_doorbell"),
                Doorbell::Tx(_) => Some("tx_doorbell"),
                Doorbell::Rx(_) => Some("rx_doorbell"),
            },
            _ => None,
        }
    }

    /// BAR0 registers are big endian (`ioread32be`/`iowrite32be`); in DQO
    /// mode every BAR2 doorbell, the IRQ ones too, is little endian
    /// (`iowrite32` in `gve_dqo.h`).
    fn register_big_endian(&self, bar: u8, offset: u64) -> bool {
        let _ = offset;
        bar == layout::BAR_REGS
    }

    fn fault_kinds(&self) -> &'static [FaultKindInfo] {
        faults::KINDS
    }

    fn add_fault(
        &mut self,
        id: u32,
        spec: &FaultSpec,
        io: &mut DeviceIo<'_>,
    ) -> Result<(), FaultError> {
        let kind = GveFault::parse(spec)?;
        self.faults.rules.add(id, spec, kind)?;
        if !kind.immediate() {
            return Ok(());
        }
        // Immediate kinds act now, counting one hit (only `prob` can say
        // no: the rule then stays, unfired).
        if !self.faults.rules.fire_id(id) {
            return Ok(());
        }
        inc(&mut self.counters.faults_fired);
        io.trace(TraceKind::Fault, || format!("{} rule {id}", spec.kind));
        match kind {
            GveFault::ResetRequest => self.request_reset(io),
            GveFault::LinkDown => {
                self.faults.link_down_by = Some(id);
                self.link(false, io);
            }
            _ => {
                self.faults.link_down_by = None;
                self.link(true, io);
            }
        }
        Ok(())
    }

    fn clear_faults(&mut self, id: Option<u32>, io: &mut DeviceIo<'_>) -> Result<(), FaultError> {
        let removed = self.faults.rules.clear(id)?;
        let mut stalls = false;
        for r in &removed {
            match r.kind {
                GveFault::LinkDown if self.faults.link_down_by == Some(r.id) => {
                    self.faults.link_down_by = None;
                    self.link(true, io);
                }
                GveFault::TxStall { .. } => stalls = true,
                _ => {}
            }
        }
        if stalls {
            // The stalled queues' work was left in their rings: run it.
            self.process_tx(io);
        }
        Ok(())
    }

    fn faults(&self) -> Vec<FaultStatus> {
        self.faults.rules.status()
    }

    fn set_link(&mut self, up: bool, io: &mut DeviceIo<'_>) -> bool {
        self.faults.link_down_by = None;
        self.link(up, io);
        true
    }
}

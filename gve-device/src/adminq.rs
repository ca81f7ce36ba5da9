//! The admin queue (`gve_adminq.c`, `gve_adminq.h`).
//!
//! A ring of 64-byte commands (`union gve_adminq_command`: BE32 opcode, BE32
//! status, 56 bytes of payload) at the base the driver wrote to BAR0. The
//! driver writes its free-running producer count to `adminq_doorbell` and
//! polls `adminq_event_counter` until it equals that count, then reads each
//! command's status. The device executes commands in order from its event
//! counter, writes a status into each, and bumps the counter once per
//! command, whatever the outcome (the driver treats a command left at
//! `UNSET` as an error, never as "still running").

use pci_model::{DeviceIo, Dma, DmaError, TraceKind};

pub use crate::adminq_codes::{opcode, status};
use crate::adminq_codes::{opcode_name, status_name};
use crate::counters::inc;
use crate::faults::AdminCmd;
use crate::flow::{self, FlowRule};
use crate::irq::NotifyBlock;
use crate::rx_dqo::{self, RxQueue};
use crate::tx_dqo::TxQueue;
use crate::{describe, layout, rss, GveDevice, Resources};

/// Size of one command.
pub const CMD_LEN: u64 = 64;

/// Why a command failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdminError {
    /// A field is invalid.
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
    /// The device is not in the state the command needs.
    #[error("failed precondition: {0}")]
    FailedPrecondition(&'static str),
    /// The object exists.
    #[error("already exists: {0}")]
    AlreadyExists(&'static str),
    /// The object does not exist.
    #[error("not found: {0}")]
    NotFound(&'static str),
    /// An index is out of range.
    #[error("out of range: {0}")]
    OutOfRange(&'static str),
    /// The command is not implemented.
    #[error("unimplemented opcode {0:#x}")]
    Unimplemented(u32),
    /// A guest address in the command is outside guest memory.
    #[error(transparent)]
    Dma(#[from] DmaError),
}

impl AdminError {
    /// The status code written into the command.
    pub fn status(&self) -> u32 {
        match self {
            AdminError::InvalidArgument(_) | AdminError::Dma(_) => status::INVALID_ARGUMENT,
            AdminError::FailedPrecondition(_) => status::FAILED_PRECONDITION,
            AdminError::AlreadyExists(_) => status::ALREADY_EXISTS,
            AdminError::NotFound(_) => status::NOT_FOUND,
            AdminError::OutOfRange(_) => status::OUT_OF_RANGE,
            AdminError::Unimplemented(_) => status::UNIMPLEMENTED,
        }
    }
}

/// Big-endian field reader over a command payload.
struct P<'a>(&'a [u8]);

impl P<'_> {
    fn be16(&self, o: usize) -> u16 {
        u16::from_be_bytes([self.0[o], self.0[o + 1]])
    }
    fn be32(&self, o: usize) -> u32 {
        u32::from_be_bytes([self.0[o], self.0[o + 1], self.0[o + 2], self.0[o + 3]])
    }
    fn be64(&self, o: usize) -> u64 {
        (u64::from(self.be32(o)) << 32) | u64::from(self.be32(o + 4))
    }
}

type R = Result<(), AdminError>;

/// `GVE_RAW_ADDRESSING_QPL_ID`: the queue uses raw DMA addresses.
const RAW_ADDRESSING_QPL_ID: u32 = 0xffff_ffff;
/// `GVE_DQO_RDA_FORMAT`.
const QUEUE_FORMAT_DQO_RDA: u8 = 0x3;
/// `GVE_SET_PARAM_MTU`.
const SET_PARAM_MTU: u32 = 0x1;
/// `ETH_MIN_MTU`.
const MIN_MTU: u64 = 68;
/// `sizeof(struct gve_driver_info)`.
const DRIVER_INFO_LEN: u64 = 304;
/// `sizeof(struct gve_query_flow_rules_descriptor)`.
const QUERY_DESC_LEN: usize = 16;
/// Largest answer buffer the device fills (the driver gives 4096).
const MAX_QUERY_LEN: u64 = 1 << 20;

impl GveDevice {
    /// Runs the commands between the event counter and the doorbell.
    pub(crate) fn process_adminq(&mut self, io: &mut DeviceIo<'_>) {
        let Some(db) = self.adminq_doorbell.take() else {
            return;
        };
        if self.faults.adminq_stuck {
            // A command timed out (`adminq-timeout`): nothing runs until
            // the driver resets the device (the driver itself issues
            // nothing more: gve_adminq_execute_cmd sees tail != head).
            inc(&mut self.counters.admin_bad_doorbell);
            io.trace(TraceKind::Command, || {
                "adminq stuck after a timed-out command: doorbell ignored until reset".into()
            });
            return;
        }
        let Some((base, slots)) = self.adminq() else {
            inc(&mut self.counters.admin_bad_doorbell);
            return;
        };
        let pending = db.wrapping_sub(self.event_counter);
        if pending > slots {
            // More commands than the ring holds (or a count behind ours):
            // not something gve does; ignore it rather than run garbage.
            inc(&mut self.counters.admin_bad_doorbell);
            return;
        }
        for _ in 0..pending {
            // The base is whatever the driver wrote: wrap rather than
            // overflow; Dma refuses the address either way.
            let addr = base.wrapping_add(u64::from(self.event_counter % slots) * CMD_LEN);
            let mut cmd = [0u8; CMD_LEN as usize];
            if io.dma.read(addr, &mut cmd).is_err() {
                inc(&mut self.counters.dma_errors);
                inc(&mut self.counters.admin_failed);
            } else {
                let op = u32::from_be_bytes([cmd[0], cmd[1], cmd[2], cmd[3]]);
                let (st, why) = match self.admin_fault(op, &cmd[8..], io) {
                    Some((id, None)) => {
                        // adminq-timeout: no status, no event counter
                        // bump; the driver times out
                        // (gve_adminq_wait_for_cmd) and must reset.
                        inc(&mut self.counters.admin_timeouts);
                        self.faults.adminq_stuck = true;
                        io.trace(TraceKind::Command, || {
                            format!(
                                "{} -> no completion (adminq-timeout rule {id})",
                                describe_cmd(op, &cmd[8..])
                            )
                        });
                        break;
                    }
                    Some((id, Some(st))) => (st, Some(format!("adminq-status rule {id}"))),
                    None => match self.execute(op, &cmd[8..], io) {
                        Ok(()) => (status::PASSED, None),
                        Err(e) => {
                            if let AdminError::Dma(_) = e {
                                inc(&mut self.counters.dma_errors);
                            }
                            let why = e.to_string();
                            self.last_admin_error = Some((op, why.clone()));
                            (e.status(), Some(why))
                        }
                    },
                };
                if st == status::PASSED {
                    inc(&mut self.counters.admin_ok);
                } else {
                    inc(&mut self.counters.admin_failed);
                }
                io.trace(TraceKind::Command, || {
                    let name = status_name(st);
                    match &why {
                        Some(w) => format!("{} -> {name} ({w})", describe_cmd(op, &cmd[8..])),
                        None => format!("{} -> {name}", describe_cmd(op, &cmd[8..])),
                    }
                });
                if io
                    .dma
                    .write(addr.wrapping_add(4), &st.to_be_bytes())
                    .is_err()
                {
                    inc(&mut self.counters.dma_errors);
                }
            }
            self.event_counter = self.event_counter.wrapping_add(1);
        }
        let ec = self.event_counter;
        io.trace(TraceKind::Completion, || {
            format!("adminq_event_counter={ec}")
        });
    }

    /// The admin fault hook: `Some((rule, Some(status)))` completes the
    /// command with that status unexecuted, `Some((rule, None))` never
    /// completes it.
    fn admin_fault(
        &mut self,
        op: u32,
        payload: &[u8],
        io: &mut DeviceIo<'_>,
    ) -> Option<(u32, Option<u32>)> {
        if self.faults.rules.is_empty() {
            return None;
        }
        let p = P(payload);
        let inner = (op == opcode::EXTENDED_COMMAND).then(|| p.be32(0));
        let flow_op = (inner == Some(opcode::CONFIGURE_FLOW_RULE))
            .then(|| {
                let mut b = [0u8; 2];
                io.dma.read(p.be64(8), &mut b).ok()?;
                Some(u16::from_be_bytes(b))
            })
            .flatten();
        let c = AdminCmd {
            opcode: op,
            inner,
            flow_op,
        };
        let r = self.faults.admin(&c)?;
        inc(&mut self.counters.faults_fired);
        io.trace(TraceKind::Fault, || match r {
            (id, Some(st)) => format!(
                "adminq-status rule {id}: {} completes with {}",
                describe_cmd(op, payload),
                status_name(st)
            ),
            (id, None) => format!(
                "adminq-timeout rule {id}: {} never completes",
                describe_cmd(op, payload)
            ),
        });
        Some(r)
    }

    fn execute(&mut self, op: u32, payload: &[u8], io: &mut DeviceIo<'_>) -> R {
        let p = P(payload);
        let dma = io.dma;
        match op {
            opcode::DESCRIBE_DEVICE => self.describe_device(&p, dma),
            opcode::CONFIGURE_DEVICE_RESOURCES => self.configure_resources(&p, dma),
            opcode::DECONFIGURE_DEVICE_RESOURCES => self.deconfigure_resources(),
            opcode::CREATE_TX_QUEUE => self.create_tx(&p, dma),
            opcode::CREATE_RX_QUEUE => self.create_rx(&p, dma),
            opcode::DESTROY_TX_QUEUE => self.destroy_tx(&p),
            opcode::DESTROY_RX_QUEUE => self.destroy_rx(&p),
            opcode::CONFIGURE_RSS => self.configure_rss(&p, dma),
            opcode::QUERY_RSS => self.query_rss(&p, dma),
            opcode::GET_PTYPE_MAP => {
                let (len, addr) = (p.be64(0), p.be64(8));
                let map = describe::ptype_map();
                if len < map.len() as u64 {
                    return Err(AdminError::InvalidArgument("ptype map buffer too small"));
                }
                Ok(dma.write(addr, &map)?)
            }
            opcode::SET_DRIVER_PARAMETER => {
                let (ty, v) = (p.be32(0), p.be64(8));
                if ty != SET_PARAM_MTU {
                    return Err(AdminError::InvalidArgument("unknown driver parameter"));
                }
                if !(MIN_MTU..=u64::from(self.cfg.mtu)).contains(&v) {
                    return Err(AdminError::InvalidArgument("MTU out of range"));
                }
                self.mtu = v as u16;
                Ok(())
            }
            opcode::REPORT_STATS => {
                // Attach (or, length 0, detach) the stats region; the NIC
                // entries go at its end (`stats.rs`). Always passes: the
                // driver fails probe-time teardown if it does not.
                let (len, addr, interval) = (p.be64(0), p.be64(8), p.be64(16));
                self.stats_report = (len != 0 && addr != 0)
                    .then(|| crate::stats::StatsReport::new(addr, len, interval));
                Ok(())
            }
            opcode::REPORT_LINK_SPEED => {
                Ok(dma.write(p.be64(0), &self.cfg.link_speed_mbps.to_be_bytes())?)
            }
            opcode::VERIFY_DRIVER_COMPATIBILITY => {
                let (len, addr) = (p.be64(0), p.be64(8));
                if len < 48 {
                    return Err(AdminError::InvalidArgument("driver info too short"));
                }
                // Read it to prove it is there; any driver is compatible.
                // Kept: driver_capability_flags[0] (alt_miss_compl).
                let mut info = vec![0u8; len.min(DRIVER_INFO_LEN) as usize];
                dma.read(addr, &mut info)?;
                let mut caps = [0u8; 8];
                caps.copy_from_slice(&info[16..24]);
                self.driver_caps = u64::from_be_bytes(caps);
                Ok(())
            }
            opcode::QUERY_FLOW_RULES => self.query_flow_rules(&p, dma),
            opcode::EXTENDED_COMMAND => self.extended(&p, dma),
            opcode::REPORT_NIC_TIMESTAMP if self.cfg.nic_timestamp => {
                // `struct gve_nic_ts_report`: the NIC clock in ns (the
                // device's time), then reserved words.
                let (len, addr) = (p.be64(0), p.be64(8));
                if len < 8 {
                    return Err(AdminError::InvalidArgument(
                        "NIC timestamp report too short",
                    ));
                }
                let mut report = [0u8; NIC_TS_REPORT_LEN];
                report[..8].copy_from_slice(&nic_clock_ns(io.device_time()).to_be_bytes());
                let n =
                    usize::try_from(len).map_or(NIC_TS_REPORT_LEN, |l| l.min(NIC_TS_REPORT_LEN));
                Ok(io.dma.write(addr, &report[..n])?)
            }
            opcode::REGISTER_PAGE_LIST
            | opcode::UNREGISTER_PAGE_LIST
            | opcode::REPORT_NIC_TIMESTAMP => Err(AdminError::Unimplemented(op)),
            _ => {
                inc(&mut self.counters.admin_unknown_opcode);
                Err(AdminError::Unimplemented(op))
            }
        }
    }

    fn describe_device(&mut self, p: &P<'_>, dma: &dyn Dma) -> R {
        let (addr, version, avail) = (p.be64(0), p.be32(8), p.be32(12));
        if version != describe::DESCRIPTOR_VERSION {
            return Err(AdminError::InvalidArgument("descriptor version"));
        }
        let d = describe::device_descriptor(&self.cfg);
        if (avail as usize) < d.len() {
            return Err(AdminError::InvalidArgument("descriptor buffer too small"));
        }
        Ok(dma.write(addr, &d)?)
    }

    fn configure_resources(&mut self, p: &P<'_>, dma: &dyn Dma) -> R {
        let irq_db_addr = p.be64(8);
        let (num_dbs, stride, base) = (p.be32(20), p.be32(24), p.be32(28));
        let format = p.0[32];
        if self.resources.is_some() {
            return Err(AdminError::FailedPrecondition(
                "resources already configured",
            ));
        }
        if format != QUEUE_FORMAT_DQO_RDA {
            return Err(AdminError::InvalidArgument("queue format is not DQO RDA"));
        }
        let vectors =
            u32::from(layout::msix(self.cfg.max_tx_queues, self.cfg.max_rx_queues).vectors);
        if num_dbs == 0 || num_dbs >= vectors || num_dbs > layout::TX_DB_BASE {
            return Err(AdminError::InvalidArgument("number of notify blocks"));
        }
        if base > 1 {
            return Err(AdminError::InvalidArgument("ntfy_blk_msix_base_idx"));
        }
        if !(4..=4096).contains(&stride) {
            return Err(AdminError::InvalidArgument("irq_db_stride"));
        }
        // Hand out one interrupt doorbell per block: the driver reads the
        // index from its irq_db_indices array.
        let mut blocks = Vec::with_capacity(num_dbs as usize);
        for i in 0..num_dbs {
            let at = irq_db_addr
                .checked_add(u64::from(i) * u64::from(stride))
                .ok_or(AdminError::InvalidArgument("irq_db_addr"))?;
            dma.write(at, &(layout::IRQ_DB_BASE + i).to_be_bytes())?;
            blocks.push(NotifyBlock::new((base + i) as u16));
        }
        self.resources = Some(Resources {
            blocks,
            msix_base: base,
        });
        Ok(())
    }

    fn deconfigure_resources(&mut self) -> R {
        if self.resources.take().is_none() {
            return Err(AdminError::FailedPrecondition("resources not configured"));
        }
        self.tx.iter_mut().for_each(|q| *q = None);
        self.rx.iter_mut().for_each(|q| *q = None);
        Ok(())
    }

    fn check_ring(&self, size: u16, default: u16) -> Result<u32, AdminError> {
        let max = self.cfg.max_ring_size.max(default);
        if size < 2 || !size.is_power_of_two() || size > max {
            return Err(AdminError::InvalidArgument("ring size"));
        }
        Ok(u32::from(size))
    }

    fn check_ntfy(&self, ntfy: u32) -> R {
        match &self.resources {
            None => Err(AdminError::FailedPrecondition("resources not configured")),
            Some(r) if ntfy as usize >= r.blocks.len() => {
                Err(AdminError::InvalidArgument("ntfy_id"))
            }
            Some(_) => Ok(()),
        }
    }

    /// Writes `gve_queue_resources`: the doorbell index (BAR2 word) and a
    /// counter index (unused by DQO).
    fn write_queue_resources(dma: &dyn Dma, addr: u64, db: u32) -> R {
        let mut r = [0u8; 8];
        r[0..4].copy_from_slice(&db.to_be_bytes());
        Ok(dma.write(addr, &r)?)
    }

    fn create_tx(&mut self, p: &P<'_>, dma: &dyn Dma) -> R {
        let (id, res, ring, qpl, ntfy, compl) = (
            p.be32(0),
            p.be64(8),
            p.be64(16),
            p.be32(24),
            p.be32(28),
            p.be64(32),
        );
        self.check_ntfy(ntfy)?;
        let slot = self
            .tx
            .get(id as usize)
            .ok_or(AdminError::OutOfRange("TX queue id"))?;
        if slot.is_some() {
            return Err(AdminError::AlreadyExists("TX queue"));
        }
        if qpl != RAW_ADDRESSING_QPL_ID {
            return Err(AdminError::InvalidArgument("QPL mode not supported"));
        }
        let size = self.check_ring(p.be16(40), self.cfg.tx_ring_size)?;
        let csize = self.check_ring(p.be16(42), self.cfg.tx_ring_size)?;
        Self::write_queue_resources(dma, res, layout::TX_DB_BASE + id)?;
        self.tx[id as usize] = Some(TxQueue::new(id, ring, size, compl, csize, ntfy));
        self.tx_kick[id as usize] = false;
        Ok(())
    }

    fn create_rx(&mut self, p: &P<'_>, dma: &dyn Dma) -> R {
        let (id, ntfy, res, compl, bufs, qpl) = (
            p.be32(0),
            p.be32(12),
            p.be64(16),
            p.be64(24),
            p.be64(32),
            p.be32(40),
        );
        let (pbs, hbs) = (u32::from(p.be16(46)), u32::from(p.be16(52)));
        self.check_ntfy(ntfy)?;
        let slot = self
            .rx
            .get(id as usize)
            .ok_or(AdminError::OutOfRange("RX queue id"))?;
        if slot.is_some() {
            return Err(AdminError::AlreadyExists("RX queue"));
        }
        if qpl != RAW_ADDRESSING_QPL_ID {
            return Err(AdminError::InvalidArgument("QPL mode not supported"));
        }
        let csize = self.check_ring(p.be16(44), self.cfg.rx_ring_size)?;
        let bsize = self.check_ring(p.be16(48), self.cfg.rx_ring_size)?;
        // The driver uses 2048 unless BUFFER_SIZES offers more.
        let max_pbs = u32::from(self.cfg.packet_buffer_size).max(2048);
        if pbs == 0 || pbs > max_pbs || pbs > rx_dqo::MAX_BUF_LEN {
            return Err(AdminError::InvalidArgument("packet_buffer_size"));
        }
        if hbs > rx_dqo::MAX_HDR_LEN {
            return Err(AdminError::InvalidArgument("header_buffer_size"));
        }
        Self::write_queue_resources(dma, res, layout::RX_DB_BASE + id)?;
        self.rx[id as usize] = Some(RxQueue {
            id,
            compl_ring: compl,
            compl_size: csize,
            buf_ring: bufs,
            buf_size: bsize,
            packet_buffer_size: pbs,
            header_buffer_size: hbs,
            rsc: p.0[50] != 0,
            ntfy,
            buf_head: 0,
            buf_tail: 0,
            compl_tail: 0,
            compl_gen: true,
        });
        Ok(())
    }

    fn destroy_tx(&mut self, p: &P<'_>) -> R {
        let id = p.be32(0) as usize;
        match self.tx.get_mut(id).and_then(Option::take) {
            Some(_) => Ok(()),
            None => Err(AdminError::NotFound("TX queue")),
        }
    }

    fn destroy_rx(&mut self, p: &P<'_>) -> R {
        let id = p.be32(0) as usize;
        match self.rx.get_mut(id).and_then(Option::take) {
            Some(_) => Ok(()),
            None => Err(AdminError::NotFound("RX queue")),
        }
    }

    fn configure_rss(&mut self, p: &P<'_>, dma: &dyn Dma) -> R {
        let (types, alg) = (p.be16(0), p.0[2]);
        let (key_size, lut_size) = (usize::from(p.be16(4)), usize::from(p.be16(6)));
        let (key_addr, lut_addr) = (p.be64(8), p.be64(16));
        if alg > rss::HASH_ALG_TOP {
            return Err(AdminError::InvalidArgument("hash algorithm"));
        }
        if types & !rss::gve_hash::ALL != 0 {
            return Err(AdminError::InvalidArgument("hash types"));
        }
        // Zero sizes mean "leave as is" (gve_adminq_configure_rss).
        let key = match key_size {
            0 => None,
            rss::KEY_SIZE => {
                let mut k = [0u8; rss::KEY_SIZE];
                dma.read(key_addr, &mut k)?;
                Some(k)
            }
            _ => return Err(AdminError::InvalidArgument("hash key size")),
        };
        let lut = match lut_size {
            0 => None,
            rss::LUT_SIZE => {
                let mut raw = vec![0u8; 4 * rss::LUT_SIZE];
                dma.read(lut_addr, &mut raw)?;
                let l: Vec<u32> = raw
                    .chunks_exact(4)
                    .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]))
                    .collect();
                if l.iter().any(|&q| q >= self.cfg.max_rx_queues) {
                    return Err(AdminError::InvalidArgument("indirection table queue"));
                }
                Some(l)
            }
            _ => return Err(AdminError::InvalidArgument("indirection table size")),
        };
        if types != 0 {
            self.rss.hash_types = types;
        }
        if let Some(k) = key {
            self.rss.key = k;
        }
        if let Some(l) = lut {
            let created: Vec<u32> = self.rx.iter().flatten().map(|q| q.id).collect();
            if self.rss.set_table(l, &created) {
                inc(&mut self.counters.rss_default_tables);
            }
        }
        Ok(())
    }

    fn query_rss(&mut self, p: &P<'_>, dma: &dyn Dma) -> R {
        let (avail, addr) = (p.be64(0), p.be64(8));
        let created: Vec<u32> = self.rx.iter().flatten().map(|q| q.id).collect();
        let total = 8 + rss::KEY_SIZE + 4 * rss::LUT_SIZE;
        if avail < total as u64 {
            return Err(AdminError::InvalidArgument("RSS query buffer too small"));
        }
        let mut b = Vec::with_capacity(total);
        b.extend_from_slice(&(total as u32).to_be_bytes());
        b.extend_from_slice(&self.rss.hash_types.to_be_bytes());
        b.push(rss::HASH_ALG_TOP);
        b.push(0);
        b.extend_from_slice(&self.rss.key);
        for q in self.rss.table(&created) {
            b.extend_from_slice(&q.to_be_bytes());
        }
        Ok(dma.write(addr, &b)?)
    }

    fn query_flow_rules(&mut self, p: &P<'_>, dma: &dyn Dma) -> R {
        const RULES: u16 = 0;
        const IDS: u16 = 1;
        const STATS: u16 = 2;
        if self.cfg.max_flow_rules == 0 {
            return Err(AdminError::Unimplemented(opcode::QUERY_FLOW_RULES));
        }
        let (op, start, avail, addr) = (p.be16(0), p.be32(4), p.be64(8), p.be64(16));
        let avail = avail.min(MAX_QUERY_LEN) as usize;
        if avail < QUERY_DESC_LEN {
            return Err(AdminError::InvalidArgument("query buffer too small"));
        }
        let entry = match op {
            RULES => flow::QUERIED_LEN,
            IDS => 4,
            STATS => 0,
            _ => return Err(AdminError::InvalidArgument("query opcode")),
        };
        let mut body = Vec::new();
        let mut n = 0u32;
        if let Some(room) = (avail - QUERY_DESC_LEN).checked_div(entry) {
            for (&loc, rule) in self.rules.rules.range(start..).take(room) {
                body.extend_from_slice(&loc.to_be_bytes());
                if op == RULES {
                    rule.encode(&mut body);
                }
                n += 1;
            }
        }
        let mut b = Vec::with_capacity(QUERY_DESC_LEN + body.len());
        b.extend_from_slice(&(self.rules.rules.len() as u32).to_be_bytes());
        b.extend_from_slice(&self.cfg.max_flow_rules.to_be_bytes());
        b.extend_from_slice(&n.to_be_bytes());
        b.extend_from_slice(&((QUERY_DESC_LEN + body.len()) as u32).to_be_bytes());
        b.extend_from_slice(&body);
        Ok(dma.write(addr, &b)?)
    }

    fn extended(&mut self, p: &P<'_>, dma: &dyn Dma) -> R {
        let (inner, len, addr) = (p.be32(0), p.be32(4), p.be64(8));
        if inner != opcode::CONFIGURE_FLOW_RULE {
            inc(&mut self.counters.admin_unknown_opcode);
            return Err(AdminError::Unimplemented(inner));
        }
        if self.cfg.max_flow_rules == 0 {
            return Err(AdminError::Unimplemented(inner));
        }
        if len as usize != flow::CFG_LEN {
            return Err(AdminError::InvalidArgument("flow rule command length"));
        }
        let mut b = [0u8; flow::CFG_LEN];
        dma.read(addr, &mut b)?;
        const ADD: u16 = 0;
        const DEL: u16 = 1;
        const RESET: u16 = 2;
        let q = P(&b);
        let loc = q.be32(4 + flow::RULE_LEN);
        match q.be16(0) {
            ADD => {
                if loc >= self.cfg.max_flow_rules {
                    return Err(AdminError::OutOfRange("rule location"));
                }
                if self.rules.rules.contains_key(&loc) {
                    return Err(AdminError::AlreadyExists("rule location"));
                }
                let mut raw = [0u8; flow::RULE_LEN];
                raw.copy_from_slice(&b[4..4 + flow::RULE_LEN]);
                let rule =
                    FlowRule::decode(&raw).map_err(|_| AdminError::InvalidArgument("flow type"))?;
                if u32::from(rule.queue) >= self.cfg.max_rx_queues {
                    return Err(AdminError::InvalidArgument("rule queue"));
                }
                self.rules.rules.insert(loc, rule);
                Ok(())
            }
            DEL => match self.rules.rules.remove(&loc) {
                Some(_) => Ok(()),
                None => Err(AdminError::NotFound("rule location")),
            },
            RESET => {
                self.rules.rules.clear();
                Ok(())
            }
            _ => Err(AdminError::InvalidArgument("flow rule opcode")),
        }
    }
}

/// `sizeof(struct gve_nic_ts_report)`.
const NIC_TS_REPORT_LEN: usize = 40;

/// The NIC clock the timestamp option shows: the device's time in
/// nanoseconds (what REPORT_NIC_TIMESTAMP writes; RX completions carry its
/// low 32 bits).
pub fn nic_clock_ns(now: std::time::Duration) -> u64 {
    u64::try_from(now.as_nanos()).unwrap_or(u64::MAX)
}

/// One admin command decoded for the trace: the driver's opcode name and
/// its key fields.
pub fn describe_cmd(op: u32, payload: &[u8]) -> String {
    let p = P(payload);
    let name = opcode_name(op).map_or_else(|| format!("opcode {op:#x}"), str::to_owned);
    match op {
        opcode::DESCRIBE_DEVICE => format!("{name} version={} len={}", p.be32(8), p.be32(12)),
        opcode::CONFIGURE_DEVICE_RESOURCES => format!(
            "{name} num_counters={} num_irq_dbs={} irq_db_stride={} ntfy_blk_msix_base_idx={} queue_format={}",
            p.be32(16),
            p.be32(20),
            p.be32(24),
            p.be32(28),
            p.0[32]
        ),
        opcode::CREATE_TX_QUEUE => format!(
            "{name} queue_id={} ntfy_id={} tx_ring_size={} tx_comp_ring_size={}",
            p.be32(0),
            p.be32(28),
            p.be16(40),
            p.be16(42)
        ),
        opcode::CREATE_RX_QUEUE => format!(
            "{name} queue_id={} ntfy_id={} rx_ring_size={} rx_buff_ring_size={} packet_buffer_size={} header_buffer_size={} enable_rsc={}",
            p.be32(0),
            p.be32(12),
            p.be16(44),
            p.be16(48),
            p.be16(46),
            p.be16(52),
            p.0[50]
        ),
        opcode::DESTROY_TX_QUEUE | opcode::DESTROY_RX_QUEUE => {
            format!("{name} queue_id={}", p.be32(0))
        }
        opcode::CONFIGURE_RSS => format!(
            "{name} hash_types={:#x} hash_alg={} key_size={} lut_size={}",
            p.be16(0),
            p.0[2],
            p.be16(4),
            p.be16(6)
        ),
        opcode::SET_DRIVER_PARAMETER => format!(
            "{name} parameter_type={} parameter_value={}",
            p.be32(0),
            p.be64(8)
        ),
        opcode::REPORT_STATS => format!(
            "{name} stats_report_len={} interval={}",
            p.be64(0),
            p.be64(16)
        ),
        opcode::QUERY_FLOW_RULES => format!(
            "{name} opcode={} starting_rule_id={}",
            p.be16(0),
            p.be32(4)
        ),
        opcode::EXTENDED_COMMAND => {
            let inner = p.be32(0);
            let iname =
                opcode_name(inner).map_or_else(|| format!("opcode {inner:#x}"), str::to_owned);
            format!("{name} inner={iname} inner_length={}", p.be32(4))
        }
        _ => name,
    }
}

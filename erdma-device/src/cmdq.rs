//! The command queue (`erdma_cmdq.c`) and every command the driver sends
//! (`erdma_main.c`, `erdma_eq.c`, `erdma_verbs.c`, `erdma_qp.c`).
//!
//! A command is 128 bytes (4 WQEBBs) in the CMDQ SQ; its header qword holds
//! the WQEBB count - 1 (54:52), a context cookie (47:32), the submodule
//! (25:24), the opcode (23:16) and the producer index after it (15:0). The
//! completion is a 32-byte big-endian CQE: owner bit, qtype CMDQ, syndrome
//! = status, `qe_idx` = index of the command's first WQEBB, then 16 bytes
//! of response (`resp0` = words 2|3<<32, `resp1` = words 4|5<<32, each
//! word big-endian).

use pci_model::{DeviceIo, TraceKind};

use crate::cq::CompletionQueue;
use crate::device::{Ah, DbKind, ErdmaDevice, Gid};
use crate::eq::EventQueue;
use crate::mr::{acc, mr_type, MemRegion, Mtt, PagedBuf, TableError};
use crate::qp::{qpa, qps, qpt, Av, Qp};
use crate::regs::{self, field, field32, le, SQEBB_SIZE};

/// Submodules.
pub mod submod {
    /// RDMA verbs commands.
    pub const RDMA: u8 = 0;
    /// Common (device) commands.
    pub const COMMON: u8 = 1;
}

/// RDMA submodule opcodes (`enum CMDQ_RDMA_OPCODE`).
pub mod rdma_op {
    /// Query device capabilities.
    pub const QUERY_DEVICE: u8 = 0;
    /// Create QP.
    pub const CREATE_QP: u8 = 1;
    /// Destroy QP.
    pub const DESTROY_QP: u8 = 2;
    /// Modify QP.
    pub const MODIFY_QP: u8 = 3;
    /// Create CQ.
    pub const CREATE_CQ: u8 = 4;
    /// Destroy CQ.
    pub const DESTROY_CQ: u8 = 5;
    /// Flush a QP in error up to the given producer indices.
    pub const REFLUSH: u8 = 6;
    /// Register MR.
    pub const REG_MR: u8 = 8;
    /// Deregister MR.
    pub const DEREG_MR: u8 = 9;
    /// Add / delete a GID.
    pub const SET_GID: u8 = 14;
    /// Create AH.
    pub const CREATE_AH: u8 = 15;
    /// Destroy AH.
    pub const DESTROY_AH: u8 = 16;
    /// Query QP.
    pub const QUERY_QP: u8 = 17;
}

/// Common submodule opcodes (`enum CMDQ_COMMON_OPCODE`).
pub mod common_op {
    /// Create CEQ.
    pub const CREATE_EQ: u8 = 0;
    /// Destroy CEQ.
    pub const DESTROY_EQ: u8 = 1;
    /// Firmware version.
    pub const QUERY_FW_INFO: u8 = 2;
    /// Netdev MTU.
    pub const CONF_MTU: u8 = 3;
    /// Statistics into a DMA buffer.
    pub const GET_STATS: u8 = 4;
    /// Device configuration (page size for extended doorbells).
    pub const CONF_DEVICE: u8 = 5;
    /// Allocate per-context doorbell pages.
    pub const ALLOC_DB: u8 = 8;
    /// Free them.
    pub const FREE_DB: u8 = 9;
}

/// Command status codes this model returns (the driver only tests != 0).
pub mod status {
    /// Success.
    pub const OK: u8 = 0;
    /// Invalid argument (range, size, alignment).
    pub const INVALID: u8 = 1;
    /// A table is full.
    pub const NO_RESOURCE: u8 = 2;
    /// The object does not exist or already exists.
    pub const BAD_OBJECT: u8 = 3;
    /// Wrong state for this command.
    pub const BAD_STATE: u8 = 4;
    /// Guest memory named by the command is not accessible.
    pub const DMA_ERROR: u8 = 5;
    /// Unknown submodule / opcode.
    pub const UNSUPPORTED: u8 = 0x7f;
}

/// `GET_STATS` response magic.
pub const HW_RESP_MAGIC: u16 = 0x5566;
/// Default `ERDMA_NQP_PER_QBLOCK`.
pub const NQP_PER_QBLOCK: u32 = 1024;
/// Capability flags (`ERDMA_DEV_CAP_FLAGS_*`).
pub mod cap {
    /// Atomics.
    pub const ATOMIC: u8 = 1 << 7;
    /// Scattered (virtually contiguous) MTTs.
    pub const MTT_VA: u8 = 1 << 5;
    /// Extended doorbells.
    pub const EXTEND_DB: u8 = 1 << 3;
}

/// WQEBBs of one command (`ERDMA_CMDQ_SQE_SIZE` / `SQEBB_SIZE`).
const CMDQ_WQEBBS: usize = regs::CMDQ_SQE_SIZE / SQEBB_SIZE as usize;

/// Result of one command.
type CmdResult = Result<(u64, u64), u8>;

impl ErdmaDevice {
    /// Refuses the last CMDQ SQ doorbell: counted, its PI forgotten (as the
    /// data queues do), so nothing past the consumer index is executed and
    /// `poll` has no command work left. The driver's command times out.
    fn refuse_cmdq_doorbell(&mut self) {
        self.counters.bad_doorbells += 1;
        if let Some(q) = self.cmdq.as_mut() {
            q.sq_pi = q.sq_ci;
        }
    }

    /// Reads, executes and completes the command at the SQ consumer index.
    /// Returns false when the doorbell was refused (its PI is more than the
    /// ring ahead, or cuts the command at the consumer index): the queue is
    /// then idle until the next doorbell.
    pub(crate) fn process_one_command(&mut self, io: &mut DeviceIo<'_>) -> bool {
        let Some(q) = self.cmdq.clone() else {
            return false;
        };
        // The driver's commands are all CMDQ_SQE_SIZE (4 WQEBBs), so a PI
        // that is not a whole number of commands past the CI is bad.
        let Some(posted) = regs::ring_outstanding(q.sq_pi, q.sq_ci, q.sq_depth)
            .filter(|n| usize::from(*n) % CMDQ_WQEBBS == 0)
        else {
            self.refuse_cmdq_doorbell();
            return false;
        };
        let mask = q.sq_depth - 1;
        let ci = q.sq_ci;
        let slot = |i: u16| {
            q.sq_base
                .wrapping_add(u64::from(u32::from(i) & mask) * SQEBB_SIZE)
        };
        let mut buf = [0u8; 256];
        let res: CmdResult;
        let mut cnt: u16 = 1;
        match io.dma.read(slot(ci), &mut buf[..32]) {
            Err(_) => {
                self.counters.dma_errors += 1;
                res = Err(status::DMA_ERROR);
            }
            Ok(()) => {
                let hdr = le::u64_at(&buf, 0);
                cnt = field(hdr, 54, 52) as u16 + 1;
                if cnt > posted {
                    // The header's WQEBB count (garbage, or stale ring
                    // contents) runs past the PI: consuming `cnt` would
                    // step the CI over the PI, and it would chase it round
                    // the ring for ever, replaying stale commands.
                    self.refuse_cmdq_doorbell();
                    return false;
                }
                let sub = field(hdr, 25, 24) as u8;
                let opc = field(hdr, 23, 16) as u8;
                let fault = self.cmd_fault(sub, opc, io);
                if fault == Some(None) {
                    // cmdq-timeout: taken off the queue, never executed nor
                    // completed; the commands after it run as usual.
                    io.trace(TraceKind::Command, || {
                        format!(
                            "{} ci={ci} -> no completion (cmdq-timeout)",
                            crate::names::cmd_opcode(sub, opc)
                        )
                    });
                    if let Some(q) = self.cmdq.as_mut() {
                        q.sq_ci = ci.wrapping_add(cnt);
                    }
                    return true;
                }
                let mut ok = true;
                for i in 1..cnt {
                    let at = usize::from(i) * 32;
                    if io
                        .dma
                        .read(slot(ci.wrapping_add(i)), &mut buf[at..at + 32])
                        .is_err()
                    {
                        ok = false;
                    }
                }
                let len = (usize::from(cnt) * 32).min(buf.len());
                if let Some(Some(st)) = fault {
                    res = Err(st);
                } else if ok {
                    res = self.execute(hdr, &buf[..len], io);
                } else {
                    self.counters.dma_errors += 1;
                    res = Err(status::DMA_ERROR);
                }
                io.trace(TraceKind::Command, || {
                    format!(
                        "{}{} -> status {}{}",
                        crate::names::cmd_opcode(sub, opc),
                        cmd_fields(sub, opc, &buf[..len]),
                        match res {
                            Ok(_) => 0,
                            Err(e) => e,
                        },
                        match (&res, fault) {
                            (_, Some(_)) => " (cmd-status)".to_owned(),
                            (Ok((r0, r1)), _) if *r0 != 0 || *r1 != 0 => {
                                format!(" resp0={r0:#x} resp1={r1:#x}")
                            }
                            _ => String::new(),
                        }
                    )
                });
                let common = sub == submod::COMMON;
                let c = &mut self.counters;
                match (&res, common) {
                    (Ok(_), true) => c.cmd_common_ok += 1,
                    (Ok(_), false) => c.cmd_rdma_ok += 1,
                    (Err(_), true) => c.cmd_common_failed += 1,
                    (Err(_), false) => c.cmd_rdma_failed += 1,
                }
                if let (Err(e), None) = (res, fault) {
                    match e {
                        status::UNSUPPORTED => c.cmd_unknown += 1,
                        status::NO_RESOURCE => c.cmd_limit_hit += 1,
                        status::DMA_ERROR => {}
                        _ => c.cmd_malformed += 1,
                    }
                }
            }
        }
        // Completion.
        let (st, r0, r1) = match res {
            Ok((a, b)) => (status::OK, a, b),
            Err(e) => (e, 0, 0),
        };
        let Some(q) = self.cmdq.as_mut() else {
            return false;
        };
        q.sq_ci = ci.wrapping_add(cnt);
        let owner = u32::from(q.cq_pi & q.cq_depth == 0);
        let mut cqe = [0u8; 32];
        let hdr = (owner << 31) | (u32::from(crate::cq::qtype::CMDQ) << 8) | u32::from(st);
        cqe[0..4].copy_from_slice(&hdr.to_be_bytes());
        cqe[4..8].copy_from_slice(&u32::from(ci).to_be_bytes());
        cqe[8..12].copy_from_slice(&(r0 as u32).to_be_bytes());
        cqe[12..16].copy_from_slice(&((r0 >> 32) as u32).to_be_bytes());
        cqe[16..20].copy_from_slice(&(r1 as u32).to_be_bytes());
        cqe[20..24].copy_from_slice(&((r1 >> 32) as u32).to_be_bytes());
        let at = q
            .cq_base
            .wrapping_add(u64::from(q.cq_pi & (q.cq_depth - 1)) * 32);
        if io.dma.write(at.wrapping_add(4), &cqe[4..]).is_err()
            || io.dma.write(at, &cqe[..4]).is_err()
        {
            self.counters.dma_errors += 1;
            return true;
        }
        q.cq_pi = q.cq_pi.wrapping_add(1);
        let armed = q.cq_armed;
        self.counters.cmd_cqes_written += 1;
        if armed {
            self.cmdq_event(io);
        }
        true
    }

    fn execute(&mut self, hdr: u64, b: &[u8], io: &mut DeviceIo<'_>) -> CmdResult {
        let sub = field(hdr, 25, 24) as u8;
        let opc = field(hdr, 23, 16) as u8;
        match (sub, opc) {
            (submod::COMMON, common_op::CREATE_EQ) => self.cmd_create_eq(b),
            (submod::COMMON, common_op::DESTROY_EQ) => self.cmd_destroy_eq(b),
            (submod::COMMON, common_op::QUERY_FW_INFO) => Ok((u64::from(self.cfg.fw_version), 0)),
            (submod::COMMON, common_op::CONF_MTU) => {
                let mtu = le::u32_at(b, 8);
                if !(256..=65535).contains(&mtu) {
                    return Err(status::INVALID);
                }
                self.mtu = mtu;
                Ok((0, 0))
            }
            (submod::COMMON, common_op::GET_STATS) => self.cmd_get_stats(b, io),
            (submod::COMMON, common_op::CONF_DEVICE) => {
                let cfg = le::u32_at(b, 8);
                let shift = cfg & 0x1f;
                if cfg & (1 << 31) != 0 {
                    if !(12..=16).contains(&shift) {
                        return Err(status::INVALID);
                    }
                    self.page_shift = shift;
                }
                Ok((0, 0))
            }
            (submod::COMMON, common_op::ALLOC_DB) => self.cmd_alloc_db(b),
            (submod::COMMON, common_op::FREE_DB) => self.cmd_free_db(b),
            (submod::RDMA, rdma_op::QUERY_DEVICE) => Ok(self.query_device()),
            (submod::RDMA, rdma_op::CREATE_QP) => self.cmd_create_qp(b, io),
            (submod::RDMA, rdma_op::DESTROY_QP) => {
                let qpn = le::u32_at(b, 8);
                let qp = self.qps.remove(&qpn).ok_or(status::BAD_OBJECT)?;
                self.retire_qp(qp);
                self.sq_kicks.remove(&qpn);
                self.rq_kicks.remove(&qpn);
                Ok((0, 0))
            }
            (submod::RDMA, rdma_op::MODIFY_QP) => self.cmd_modify_qp(b),
            (submod::RDMA, rdma_op::QUERY_QP) => {
                let qpn = le::u32_at(b, 8);
                let qp = self.qps.get(&qpn).ok_or(status::BAD_OBJECT)?;
                let (sq_psn, rq_psn) = match qp.engine.as_ref() {
                    Some(e) if qp.state >= qps::RTR => {
                        (e.next_send_psn().value(), e.expected_psn().value())
                    }
                    _ => (qp.sq_psn, qp.rq_psn),
                };
                // SQD with work still inside the engine: the SQ drains.
                let draining = qp.state == qps::SQD && !qp.inflight.is_empty();
                let r0 = u64::from(sq_psn & 0xff_ffff)
                    | (u64::from(rq_psn & 0xff_ffff) << 24)
                    | (u64::from(qp.state) << 48)
                    | (u64::from(draining) << 56);
                Ok((r0, 0))
            }
            (submod::RDMA, rdma_op::CREATE_CQ) => self.cmd_create_cq(b, io),
            (submod::RDMA, rdma_op::DESTROY_CQ) => {
                let cqn = le::u32_at(b, 8);
                if self.qps.values().any(|q| q.scqn == cqn || q.rcqn == cqn) {
                    return Err(status::BAD_STATE);
                }
                self.cqs.remove(&cqn).ok_or(status::BAD_OBJECT)?;
                self.pending_cq_events.remove(&cqn);
                Ok((0, 0))
            }
            (submod::RDMA, rdma_op::REFLUSH) => {
                let qpn = le::u32_at(b, 8);
                let sq_pi = le::u32_at(b, 12) as u16;
                let rq_pi = le::u32_at(b, 16) as u16;
                let qp = self.qps.get_mut(&qpn).ok_or(status::BAD_OBJECT)?;
                qp.sq_pi = sq_pi;
                qp.rq_pi = rq_pi;
                self.sq_kicks.insert(qpn);
                self.rq_kicks.insert(qpn);
                Ok((0, 0))
            }
            (submod::RDMA, rdma_op::REG_MR) => self.cmd_reg_mr(b, io),
            (submod::RDMA, rdma_op::DEREG_MR) => {
                let cfg = le::u32_at(b, 8);
                self.mrs
                    .remove(cfg & 0xf_ffff)
                    .map_err(|_| status::BAD_OBJECT)?;
                Ok((0, 0))
            }
            (submod::RDMA, rdma_op::SET_GID) => {
                let cfg = le::u32_at(b, 8);
                let idx = (cfg & 0xffff) as usize;
                let slot = self.gids.get_mut(idx).ok_or(status::INVALID)?;
                if cfg & (1 << 31) != 0 {
                    *slot = None;
                } else {
                    *slot = Some(Gid {
                        gid: le::bytes_at::<16>(b, 12),
                        ntype: ((cfg >> 16) & 1) as u8,
                    });
                }
                Ok((0, 0))
            }
            (submod::RDMA, rdma_op::CREATE_AH) => {
                let pdn = le::u32_at(b, 8);
                let ahn = le::u32_at(b, 12);
                if ahn >= 1u32 << self.cfg.max_ah_log2.min(24) {
                    return Err(status::INVALID);
                }
                if self.ahs.contains_key(&ahn) {
                    return Err(status::BAD_OBJECT);
                }
                let av = Av::parse(b, 16);
                self.ahs.insert(ahn, Ah { pdn, av });
                Ok((0, 0))
            }
            (submod::RDMA, rdma_op::DESTROY_AH) => {
                let ahn = le::u32_at(b, 12);
                self.ahs.remove(&ahn).ok_or(status::BAD_OBJECT)?;
                Ok((0, 0))
            }
            _ => Err(status::UNSUPPORTED),
        }
    }

    /// The two capability qwords of `QUERY_DEVICE`.
    fn query_device(&self) -> (u64, u64) {
        let c = &self.cfg;
        let mut flags = 0u8;
        if c.cap_atomic {
            flags |= cap::ATOMIC;
        }
        if c.cap_mtt_va {
            flags |= cap::MTT_VA;
        }
        if c.cap_extend_db {
            flags |= cap::EXTEND_DB;
        }
        let cap0 = (u64::from(c.max_gid_log2 & 0xf) << 48)
            | (u64::from(c.max_cqe_log2) << 40)
            | (u64::from(flags) << 24)
            | (u64::from(c.max_recv_wr_log2) << 16)
            | (u64::from(c.max_ah_log2) << 8)
            | u64::from(c.max_mr_size_log2);
        let cap1 = (u64::from(c.local_dma_key) << 32)
            | (u64::from(c.default_cc & 0xf) << 28)
            | (u64::from(c.qblocks & 0xfff) << 16)
            | u64::from(c.max_mw_log2);
        (cap0, cap1)
    }

    fn cmd_create_eq(&mut self, b: &[u8]) -> CmdResult {
        let qbuf = le::u64_at(b, 8);
        let vector = b.get(16).copied().unwrap_or(0);
        let eqn = u32::from(b.get(17).copied().unwrap_or(0));
        let depth_log2 = b.get(18).copied().unwrap_or(0);
        let qtype = b.get(19).copied().unwrap_or(0);
        let dbrec = u64::from(le::u32_at(b, 20)) | (u64::from(le::u32_at(b, 24)) << 32);
        if qtype != 1
            || eqn == 0
            || eqn > u32::from(self.cfg.max_ceqs.min(31))
            || !crate::eq::depth_ok(1u32 << depth_log2.min(31))
            || u16::from(vector) >= regs::NUM_MSIX_VEC
            || qbuf == 0
        {
            return Err(status::INVALID);
        }
        if self.ceqs.contains_key(&eqn) {
            return Err(status::BAD_OBJECT);
        }
        self.ceqs.insert(
            eqn,
            EventQueue::new(qbuf, 1 << depth_log2, dbrec, u16::from(vector)),
        );
        Ok((0, 0))
    }

    fn cmd_destroy_eq(&mut self, b: &[u8]) -> CmdResult {
        let eqn = u32::from(b.get(17).copied().unwrap_or(0));
        if b.get(19).copied() != Some(1) {
            return Err(status::INVALID);
        }
        if self.cqs.values().any(|c| c.eqn == eqn) {
            return Err(status::BAD_STATE);
        }
        self.ceqs.remove(&eqn).ok_or(status::BAD_OBJECT)?;
        Ok((0, 0))
    }

    fn cmd_get_stats(&mut self, b: &[u8], io: &mut DeviceIo<'_>) -> CmdResult {
        let index = le::u32_at(b, 12);
        let target = le::u64_at(b, 16);
        let len = le::u32_at(b, 24) as usize;
        const RESP_LEN: usize = 16 + 11 * 8;
        if len < RESP_LEN {
            return Err(status::INVALID);
        }
        let c = &self.counters;
        let vals = [
            c.wqes_executed,
            c.tx_frames,
            c.tx_bytes,
            0,
            0,
            0,
            c.rx_frames,
            c.rx_bytes,
            c.rx_dropped,
            0,
            0,
        ];
        let mut out = [0u8; RESP_LEN];
        out[0..2].copy_from_slice(&HW_RESP_MAGIC.to_le_bytes());
        out[2] = 1;
        out[3] = RESP_LEN as u8;
        out[4..8].copy_from_slice(&index.to_le_bytes());
        for (i, v) in vals.iter().enumerate() {
            out[16 + 8 * i..24 + 8 * i].copy_from_slice(&v.to_le_bytes());
        }
        if io.dma.write(target, &out).is_err() {
            self.counters.dma_errors += 1;
            return Err(status::DMA_ERROR);
        }
        Ok((0, 0))
    }

    /// Byte offset in BAR 0 of doorbell page `idx` (guest page size).
    fn db_page_off(&self, idx: u16) -> u64 {
        u64::from(idx) << self.page_shift
    }

    fn cmd_alloc_db(&mut self, b: &[u8]) -> CmdResult {
        let cfg = le::u32_at(b, 8);
        if cfg & 7 != 7 {
            return Err(status::INVALID);
        }
        if self.db_allocs.len() >= self.cfg.max_db_allocs {
            return Err(status::NO_RESOURCE);
        }
        // Pool pages in units of the guest page; three per context.
        let psize = 1u64 << self.page_shift;
        let first = regs::DB_POOL_START / psize;
        let last = regs::FUNC_BAR_SIZE / psize;
        let used: std::collections::BTreeSet<u16> = self
            .db_allocs
            .iter()
            .flat_map(|(s, (r, c))| [*s, *r, *c])
            .collect();
        let mut free = (first..last)
            .filter_map(|p| u16::try_from(p).ok())
            .filter(|p| !used.contains(p));
        let (Some(sdb), Some(rdb_field), Some(cdb_field)) = (free.next(), free.next(), free.next())
        else {
            return Err(status::NO_RESOURCE);
        };
        // The driver swaps the RDB and CDB fields (alloc_db_resources maps
        // the RDB-field page as its CQ doorbell page and the CDB-field page
        // as its RQ doorbell page); kinds follow what it actually rings.
        self.mark_db_pages(sdb, DbKind::Sq);
        self.mark_db_pages(rdb_field, DbKind::Cq);
        self.mark_db_pages(cdb_field, DbKind::Rq);
        self.db_allocs.insert(sdb, (rdb_field, cdb_field));
        let r0 = (u64::from(rdb_field) << 48) | (u64::from(cdb_field) << 32) | u64::from(sdb);
        Ok((r0, 0))
    }

    fn mark_db_pages(&mut self, idx: u16, kind: DbKind) {
        let start = self.db_page_off(idx) >> 12;
        let n = 1u64 << (self.page_shift - 12);
        for p in start..start + n {
            self.db_pages.insert(p, kind);
        }
    }

    fn unmark_db_pages(&mut self, idx: u16) {
        let start = self.db_page_off(idx) >> 12;
        let n = 1u64 << (self.page_shift - 12);
        for p in start..start + n {
            self.db_pages.remove(&p);
        }
    }

    fn cmd_free_db(&mut self, b: &[u8]) -> CmdResult {
        let rdb = le::u16_at(b, 12);
        let sdb = le::u16_at(b, 14);
        let cdb = le::u16_at(b, 18);
        match self.db_allocs.get(&sdb) {
            Some(&(r, c)) if r == rdb && c == cdb => {}
            _ => return Err(status::BAD_OBJECT),
        }
        self.db_allocs.remove(&sdb);
        for p in [sdb, rdb, cdb] {
            self.unmark_db_pages(p);
        }
        Ok((0, 0))
    }

    /// Parses a queue's page list: level 0 = `addr0` + up to 3 more
    /// entries, level 1 = `addr0` is an MTT of `cnt` entries.
    fn queue_buf(
        &self,
        addr0: u64,
        extra: &[u64],
        level: u32,
        cnt: u32,
        page_shift: u32,
        offset: u64,
    ) -> Result<PagedBuf, u8> {
        if page_shift > 40 || cnt == 0 || offset >= (1u64 << page_shift) {
            return Err(status::INVALID);
        }
        let mtt = if level == 0 {
            if cnt as usize > 1 + extra.len() {
                return Err(status::INVALID);
            }
            let mut entries = [0u64; 4];
            entries[0] = addr0;
            for (i, e) in extra.iter().enumerate().take(3) {
                entries[i + 1] = *e;
            }
            Mtt::Inline {
                entries,
                count: cnt,
            }
        } else {
            if cnt > self.cfg.max_mtt_entries {
                return Err(status::INVALID);
            }
            Mtt::Table {
                root: addr0,
                level: 1,
                count: cnt,
                mtt_page_size: 4096,
            }
        };
        Ok(PagedBuf {
            mtt,
            page_shift,
            offset,
        })
    }

    fn cmd_create_cq(&mut self, b: &[u8], io: &mut DeviceIo<'_>) -> CmdResult {
        let cfg0 = le::u32_at(b, 8);
        let qbuf = u64::from(le::u32_at(b, 12)) | (u64::from(le::u32_at(b, 16)) << 32);
        let cfg1 = le::u32_at(b, 20);
        let dbrec = le::u64_at(b, 24);
        let first_page_offset = u64::from(le::u32_at(b, 32));
        let cqn = field32(cfg0, 19, 0);
        let depth_log2 = field32(cfg0, 31, 24);
        let page_shift = field32(cfg0, 23, 20) + regs::HW_PAGE_SHIFT;
        let mtt_cnt = field32(cfg1, 31, 16);
        let level = field32(cfg1, 15, 15);
        let eqn = field32(cfg1, 9, 0);
        // At most 2^23: the CQ doorbell carries 24 bits of CI, and a CQ of
        // 2^24 entries could never be seen as full (cq_overruns).
        if cqn == 0
            || cqn >= self.cfg.qpn_space() * 2
            || depth_log2 > u32::from(self.cfg.max_cqe_log2.min(23))
        {
            return Err(status::INVALID);
        }
        if self.cqs.contains_key(&cqn) {
            return Err(status::BAD_OBJECT);
        }
        if !self.ceqs.contains_key(&eqn) {
            return Err(status::INVALID);
        }
        if self.cqs.len() >= self.cfg.max_live_cqs {
            return Err(status::NO_RESOURCE);
        }
        let depth = 1u32 << depth_log2;
        let buf = self.queue_buf(qbuf, &[], level, mtt_cnt, page_shift, first_page_offset)?;
        let total = u64::from(depth) * regs::CQE_SIZE;
        self.check_queue(&buf, total, io)?;
        self.cqs
            .insert(cqn, CompletionQueue::new(cqn, buf, depth, eqn, dbrec));
        Ok((0, 0))
    }

    /// The queue's pages cover `total` bytes and its first and last
    /// elements are reachable.
    fn check_queue(&mut self, buf: &PagedBuf, total: u64, io: &mut DeviceIo<'_>) -> Result<(), u8> {
        let span = buf.offset + total;
        let pages = span.div_ceil(1u64 << buf.page_shift);
        if pages > buf.mtt.count() {
            return Err(status::INVALID);
        }
        let mut probe = [0u8; 8];
        for o in [0, total.saturating_sub(32)] {
            if buf.read(io.dma, o, &mut probe).is_err() {
                self.counters.dma_errors += 1;
                return Err(status::DMA_ERROR);
            }
        }
        Ok(())
    }

    fn cmd_create_qp(&mut self, b: &[u8], io: &mut DeviceIo<'_>) -> CmdResult {
        let cfg0 = le::u32_at(b, 8);
        let cfg1 = le::u32_at(b, 12);
        let sq_cqn_cfg = le::u32_at(b, 16);
        let rq_cqn_cfg = le::u32_at(b, 20);
        let sq_buf = le::u64_at(b, 24);
        let rq_buf = le::u64_at(b, 32);
        let sq_mtt_cfg = le::u32_at(b, 40);
        let rq_mtt_cfg = le::u32_at(b, 44);
        let sq_dbrec = le::u64_at(b, 48);
        let rq_dbrec = le::u64_at(b, 56);
        let sq_mtt: Vec<u64> = (0..3).map(|i| le::u64_at(b, 64 + 8 * i)).collect();
        let rq_mtt: Vec<u64> = (0..3).map(|i| le::u64_at(b, 88 + 8 * i)).collect();
        let cfg2 = le::u32_at(b, 116);

        let qpn = field32(cfg0, 19, 0);
        let sq_log2 = field32(cfg0, 31, 20);
        let rq_log2 = field32(cfg1, 31, 20);
        let pd = field32(cfg1, 19, 0);
        let qp_type = field32(cfg2, 3, 0) as u8;
        let scqn = field32(sq_cqn_cfg, 23, 0);
        let rcqn = field32(rq_cqn_cfg, 23, 0);
        if qpn == 0
            || qpn >= self.cfg.qpn_space()
            || sq_log2 > 15
            || rq_log2 > u32::from(self.cfg.max_recv_wr_log2.min(15))
            || (qp_type != qpt::RC && qp_type != qpt::UD)
        {
            return Err(status::INVALID);
        }
        if self.qps.contains_key(&qpn) {
            return Err(status::BAD_OBJECT);
        }
        if !self.cqs.contains_key(&scqn) || !self.cqs.contains_key(&rcqn) {
            return Err(status::INVALID);
        }
        if self.qps.len() >= self.cfg.max_live_qps {
            return Err(status::NO_RESOURCE);
        }
        let mk = |this: &Self, cqn_cfg: u32, addr: u64, extra: &[u64], mtt_cfg: u32| {
            let page_shift = field32(cqn_cfg, 31, 28) + regs::HW_PAGE_SHIFT;
            let offset = u64::from(mtt_cfg & 0xffff_f000);
            let cnt = field32(mtt_cfg, 11, 1);
            let level = mtt_cfg & 1;
            this.queue_buf(addr, extra, level, cnt, page_shift, offset)
        };
        let sq = mk(self, sq_cqn_cfg, sq_buf, &sq_mtt, sq_mtt_cfg)?;
        let rq = mk(self, rq_cqn_cfg, rq_buf, &rq_mtt, rq_mtt_cfg)?;
        let sq_depth = 1u32 << sq_log2;
        let rq_depth = 1u32 << rq_log2;
        self.check_queue(&sq, u64::from(sq_depth) * regs::SQEBB_SIZE, io)?;
        self.check_queue(&rq, u64::from(rq_depth) * regs::RQE_SIZE, io)?;
        let mut qp = Qp::new(
            qpn, pd, qp_type, sq, sq_depth, rq, rq_depth, scqn, rcqn, sq_dbrec, rq_dbrec,
        );
        if qp_type == qpt::RC {
            // The engine's PD is the driver's: the keys it meets are checked
            // against it by the device's memory store.
            let caps = roce_model::QpCaps {
                max_send_wr: (sq_depth as usize).clamp(1, self.cfg.max_wrs_per_qp),
                max_recv_wr: (rq_depth as usize).clamp(1, self.cfg.max_wrs_per_qp),
                max_sge: crate::wqe::MAX_SEND_SGE,
                max_inline_data: crate::wqe::MAX_INLINE,
            };
            let epd = roce_model::ProtectionDomain::new(pd);
            qp.engine = Some(roce_model::QueuePair::new(qpn, epd, caps));
        }
        self.qps.insert(qpn, qp);
        Ok((0, 0))
    }

    fn cmd_modify_qp(&mut self, b: &[u8]) -> CmdResult {
        let cfg0 = le::u32_at(b, 8);
        let cfg1 = le::u32_at(b, 12);
        let mask = le::u32_at(b, 16);
        let qkey = le::u32_at(b, 20);
        let rq_psn = le::u32_at(b, 24);
        let sq_psn = le::u32_at(b, 28);
        let qpn = field32(cfg0, 19, 0);
        let state = field32(cfg0, 31, 24) as u8;
        if mask & !0x3f != 0 {
            return Err(status::INVALID);
        }
        let mtu = self.engine_mtu();
        let cfg = self.cfg.clone();
        let qp = self.qps.get_mut(&qpn).ok_or(status::BAD_OBJECT)?;
        if mask & qpa::STATE != 0 && state > qps::ERROR {
            return Err(status::INVALID);
        }
        if mask & qpa::AV != 0 {
            let av = Av::parse(b, 32);
            if usize::from(av.sgid_index) >= self.gids.len() {
                return Err(status::INVALID);
            }
            qp.av = Some(av);
        }
        if mask & qpa::QKEY != 0 {
            qp.qkey = qkey;
        }
        if mask & qpa::DST_QPN != 0 {
            qp.dst_qpn = field32(cfg1, 19, 0);
        }
        if mask & qpa::SQ_PSN != 0 {
            qp.sq_psn = sq_psn & 0xff_ffff;
            qp.ud_psn = qp.sq_psn;
        }
        if mask & qpa::RQ_PSN != 0 {
            qp.rq_psn = rq_psn & 0xff_ffff;
        }
        if mask & qpa::STATE != 0 && state != qp.state {
            let from = qp.state;
            let legal = matches!(
                (from, state),
                (_, qps::RESET)
                    | (_, qps::ERROR)
                    | (qps::RESET, qps::INIT)
                    | (qps::INIT, qps::INIT)
                    | (qps::INIT, qps::RTR)
                    | (qps::RTR, qps::RTS)
                    | (qps::RTS, qps::RTS)
                    | (qps::RTS, qps::SQD)
                    | (qps::SQD, qps::RTS)
                    | (qps::SQE, qps::RTS)
            );
            if !legal {
                return Err(status::BAD_STATE);
            }
            if qp.qp_type == qpt::RC && state == qps::RTR && qp.av.is_none() {
                return Err(status::BAD_STATE);
            }
            let attr = roce_model::QpAttr {
                pmtu: mtu,
                sq_psn: qp.sq_psn,
                rq_psn: qp.rq_psn,
                dest_qpn: qp.dst_qpn,
                timeout: cfg.ack_timeout,
                retry_cnt: cfg.retry_cnt,
                rnr_retry: cfg.rnr_retry,
                min_rnr_timer: cfg.min_rnr_timer,
                max_rd_atomic: cfg.max_rd_atomic,
                max_dest_rd_atomic: cfg.max_rd_atomic,
                access: roce_model::Access::REMOTE_WRITE
                    | roce_model::Access::REMOTE_READ
                    | roce_model::Access::REMOTE_ATOMIC,
            };
            let target = match state {
                qps::RESET => Some(roce_model::QpState::Reset),
                qps::INIT => Some(roce_model::QpState::Init),
                qps::RTR => Some(roce_model::QpState::Rtr),
                qps::RTS => Some(roce_model::QpState::Rts),
                qps::ERROR => Some(roce_model::QpState::Error),
                _ => None,
            };
            if let (Some(e), Some(t)) = (qp.engine.as_mut(), target) {
                if e.state() != t && e.modify(t, &attr).is_err() {
                    return Err(status::BAD_STATE);
                }
            }
            qp.state = state;
            if state == qps::RESET {
                qp.sq_pi = 0;
                qp.sq_ci = 0;
                qp.rq_pi = 0;
                qp.rq_ci = 0;
                qp.sq_stopped = false;
                self.engine_wrs -= qp.engine_work().min(self.engine_wrs);
                qp.drop_engine_work();
            }
            // Work posted before the transition may now run (or flush).
            self.sq_kicks.insert(qpn);
            self.rq_kicks.insert(qpn);
        }
        Ok((0, 0))
    }

    fn cmd_reg_mr(&mut self, b: &[u8], io: &mut DeviceIo<'_>) -> CmdResult {
        let cfg0 = le::u32_at(b, 8);
        let cfg1 = le::u32_at(b, 12);
        let start_va = le::u64_at(b, 16);
        let size_l = le::u32_at(b, 24);
        let cfg2 = le::u32_at(b, 28);
        let valid = cfg0 & (1 << 31) != 0;
        let version = field32(cfg0, 30, 28);
        let key = field32(cfg0, 27, 20) as u8;
        let mpt_idx = field32(cfg0, 19, 0);
        let pd = field32(cfg1, 31, 12);
        let ty = field32(cfg1, 7, 6) as u8;
        let access = field32(cfg1, 5, 1) as u8;
        let page_log2 = field32(cfg2, 31, 27);
        let mtt_page_shift = field32(cfg2, 26, 24) + regs::HW_PAGE_SHIFT;
        let level = field32(cfg2, 21, 20) as u8;
        let mut mtt_cnt = field32(cfg2, 19, 0);
        let mut size = u64::from(size_l);
        if version >= 1 {
            size |= u64::from(le::u32_at(b, 40)) << 32;
            mtt_cnt |= le::u32_at(b, 44) << 20;
        } else if size == 0 && ty == mr_type::NORMAL {
            // The driver never registers an empty MR: a 4 GiB MR described
            // without the version-1 high word wraps the 32-bit size to 0.
            size = 1 << 32;
        }
        if ty > mr_type::DMA || self.mrs.get(mpt_idx).is_some() {
            return Err(if ty > mr_type::DMA {
                status::INVALID
            } else {
                status::BAD_OBJECT
            });
        }
        let mtt = if ty == mr_type::DMA {
            Mtt::Physical
        } else {
            if !(12..=31).contains(&page_log2) || mtt_cnt > self.cfg.max_mtt_entries {
                return Err(status::INVALID);
            }
            if level == 0 {
                if mtt_cnt > 4 {
                    return Err(status::INVALID);
                }
                let mut entries = [0u64; 4];
                for (i, e) in entries.iter_mut().enumerate() {
                    *e = le::u64_at(b, 32 + 8 * i);
                }
                Mtt::Inline {
                    entries,
                    count: mtt_cnt,
                }
            } else if level <= 3 {
                Mtt::Table {
                    root: le::u64_at(b, 32),
                    level,
                    count: mtt_cnt,
                    mtt_page_size: 1u64 << mtt_page_shift,
                }
            } else {
                return Err(status::INVALID);
            }
        };
        if ty == mr_type::NORMAL {
            if size == 0 || size > (1u64 << self.cfg.max_mr_size_log2) {
                return Err(status::INVALID);
            }
            // A range wrapping past 2^64 (the kernel never registers one)
            // would make every offset computed inside the MR overflow.
            if crate::mr::range_end(start_va, size).is_none() {
                return Err(status::INVALID);
            }
            let psize = 1u64 << page_log2;
            let span = (start_va & (psize - 1)) + size;
            if span.div_ceil(psize) > u64::from(mtt_cnt) {
                return Err(status::INVALID);
            }
            if let Mtt::Inline { entries, count } = mtt {
                for e in entries.iter().take(count as usize) {
                    let mut probe = [0u8; 1];
                    if io.dma.read(*e, &mut probe).is_err() {
                        self.counters.dma_errors += 1;
                        return Err(status::DMA_ERROR);
                    }
                }
            }
        }
        if let Mtt::Table { .. } = mtt {
            if ty == mr_type::NORMAL && mtt.probe(io.dma).is_err() {
                self.counters.dma_errors += 1;
                return Err(status::DMA_ERROR);
            }
        }
        let mr = MemRegion {
            mpt_idx,
            key,
            pd,
            mr_type: ty,
            access: access | acc::LR,
            va: if ty == mr_type::NORMAL { start_va } else { 0 },
            len: if ty == mr_type::NORMAL { size } else { 0 },
            page_shift: page_log2.max(12),
            mtt,
            valid: valid || ty == mr_type::DMA,
        };
        self.mrs.insert(mr).map_err(|e| match e {
            TableError::Full => status::NO_RESOURCE,
            TableError::BadIndex => status::INVALID,
            _ => status::BAD_OBJECT,
        })?;
        Ok((0, 0))
    }

    /// Keeps the counters of a QP being destroyed.
    pub(crate) fn retire_qp(&mut self, qp: Qp) {
        self.engine_wrs -= qp.engine_work().min(self.engine_wrs);
        self.stalled_sq.remove(&qp.qpn);
        self.stalled_rq.remove(&qp.qpn);
        // its recovery counters outlive it (Counters::rc_*)
        if let Some(e) = qp.engine.as_ref() {
            self.counters.add_rc(e.stats());
        }
    }
}

/// The key fields of a command, for the trace (` qpn=5 sq_depth=256 ...`).
fn cmd_fields(sub: u8, opc: u8, b: &[u8]) -> String {
    let w = |o: usize| {
        if b.len() >= o + 4 {
            le::u32_at(b, o)
        } else {
            0
        }
    };
    match (sub, opc) {
        (submod::RDMA, rdma_op::CREATE_QP) => format!(
            " qpn={} sq_depth={} rq_depth={} pd={} scqn={} rcqn={} type={}",
            field32(w(8), 19, 0),
            1u64 << field32(w(8), 31, 20).min(63),
            1u64 << field32(w(12), 31, 20).min(63),
            field32(w(12), 19, 0),
            field32(w(16), 23, 0),
            field32(w(20), 23, 0),
            if field32(w(116), 3, 0) == 0 {
                "RC"
            } else {
                "UD"
            }
        ),
        (submod::RDMA, rdma_op::DESTROY_QP | rdma_op::QUERY_QP) => format!(" qpn={}", w(8)),
        (submod::RDMA, rdma_op::MODIFY_QP) => format!(
            " qpn={} state={} mask={:#x} dqpn={} sq_psn={} rq_psn={}",
            field32(w(8), 19, 0),
            field32(w(8), 31, 24),
            w(16),
            field32(w(12), 19, 0),
            w(28),
            w(24)
        ),
        (submod::RDMA, rdma_op::CREATE_CQ) => format!(
            " cqn={} depth={} eqn={}",
            field32(w(8), 19, 0),
            1u64 << field32(w(8), 31, 24).min(63),
            field32(w(20), 9, 0)
        ),
        (submod::RDMA, rdma_op::DESTROY_CQ) => format!(" cqn={}", w(8)),
        (submod::RDMA, rdma_op::REFLUSH) => {
            format!(" qpn={} sq_pi={} rq_pi={}", w(8), w(12), w(16))
        }
        (submod::RDMA, rdma_op::REG_MR) => format!(
            " mpt={} key={} pd={} type={} access={:#x} size={}",
            field32(w(8), 19, 0),
            field32(w(8), 27, 20),
            field32(w(12), 31, 12),
            field32(w(12), 7, 6),
            field32(w(12), 5, 1),
            w(24)
        ),
        (submod::RDMA, rdma_op::DEREG_MR) => format!(" mpt={}", field32(w(8), 19, 0)),
        (submod::RDMA, rdma_op::SET_GID) => format!(
            " idx={} {}",
            w(8) & 0xffff,
            if w(8) & (1 << 31) != 0 { "del" } else { "add" }
        ),
        (submod::RDMA, rdma_op::CREATE_AH | rdma_op::DESTROY_AH) => {
            format!(" pdn={} ahn={}", w(8), w(12))
        }
        (submod::COMMON, common_op::CREATE_EQ | common_op::DESTROY_EQ) => format!(
            " eqn={} depth_log2={} vector={}",
            b.get(17).copied().unwrap_or(0),
            b.get(18).copied().unwrap_or(0),
            b.get(16).copied().unwrap_or(0)
        ),
        (submod::COMMON, common_op::CONF_MTU) => format!(" mtu={}", w(8)),
        (submod::COMMON, common_op::CONF_DEVICE) => format!(" cfg={:#x}", w(8)),
        _ => String::new(),
    }
}

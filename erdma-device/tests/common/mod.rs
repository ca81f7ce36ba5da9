//! A test driver that plays the Linux erdma driver against the model:
//! the same register writes, command layouts, doorbells and queue walking.

#![allow(dead_code, clippy::too_many_arguments)]

pub mod rc;
mod types;

pub use types::{v4_gid, Ring, Wc};

use std::time::Instant;

use erdma_device::regs::{self, off};
use erdma_device::{ErdmaConfig, ErdmaDevice};
use pci_model::{DeviceIo, Dma, PciDevice, VecMemory};

pub const MEM_BASE: u64 = 0x10_0000;
pub const MEM_SIZE: usize = 32 << 20;

pub const CMDQ_DEPTH: u32 = 512; // 128 outstanding x 4 WQEBBs
pub const CMDQ_EQ_DEPTH: u32 = 128;
pub const AEQ_DEPTH: u32 = 4096;
pub const CEQ_DEPTH: u32 = 256;

pub struct Completion {
    pub status: u8,
    pub r0: u64,
    pub r1: u64,
}

#[derive(Debug, Clone)]
pub struct KQp {
    pub qpn: u32,
    pub sq: Ring,
    pub rq: Ring,
    pub sq_pi: u16,
    pub rq_pi: u16,
}

pub struct Driver {
    pub dev: ErdmaDevice,
    pub mem: VecMemory,
    pub now: Instant,
    pub next_alloc: u64,
    pub irqs: Vec<u16>,
    pub tx: Vec<Vec<u8>>,
    pub aeq: Ring,
    pub sq: Ring,
    pub sq_pi: u16,
    pub cq: Ring,
    pub cmdsn: u32,
    pub eq: Ring,
    pub event_mode: bool,
    pub ceqs: Vec<Ring>,
    pub cqs: std::collections::BTreeMap<u32, Ring>,
    /// Run a device trace (`DeviceIo::tracing`) on every call.
    pub tracing: bool,
    /// The records of the calls made while tracing.
    pub trace: Vec<pci_model::TraceRecord>,
}

impl Driver {
    pub fn new(mac: [u8; 6]) -> Driver {
        Self::with_config(ErdmaConfig::new(mac))
    }

    pub fn with_config(cfg: ErdmaConfig) -> Driver {
        Self::with_memory(cfg, MEM_SIZE)
    }

    /// A driver whose guest has `mem_size` bytes (allocated lazily by the
    /// host: untouched pages cost nothing).
    pub fn with_memory(cfg: ErdmaConfig, mem_size: usize) -> Driver {
        Driver {
            dev: ErdmaDevice::new(cfg),
            mem: VecMemory::new(MEM_BASE, mem_size),
            // The edge's clock, read once: it moves only when a test says.
            now: Instant::now(),
            next_alloc: MEM_BASE + 0x1000,
            irqs: Vec::new(),
            tx: Vec::new(),
            aeq: Ring {
                addr: 0,
                depth: 0,
                ci: 0,
                dbrec: 0,
            },
            sq: Ring {
                addr: 0,
                depth: 0,
                ci: 0,
                dbrec: 0,
            },
            sq_pi: 0,
            cq: Ring {
                addr: 0,
                depth: 0,
                ci: 0,
                dbrec: 0,
            },
            cmdsn: 0,
            eq: Ring {
                addr: 0,
                depth: 0,
                ci: 0,
                dbrec: 0,
            },
            event_mode: false,
            ceqs: Vec::new(),
            cqs: Default::default(),
            tracing: false,
            trace: Vec::new(),
        }
    }

    /// dma_alloc_coherent: zeroed, aligned.
    pub fn alloc(&mut self, size: u64, align: u64) -> u64 {
        let a = (self.next_alloc + align - 1) & !(align - 1);
        self.next_alloc = a + size;
        assert!(
            self.next_alloc <= MEM_BASE + self.mem.bytes.lock().unwrap().len() as u64,
            "test memory exhausted"
        );
        a
    }

    pub fn with_io<R>(&mut self, f: impl FnOnce(&mut ErdmaDevice, &mut DeviceIo<'_>) -> R) -> R {
        let mem = self.mem.clone();
        let mut io = DeviceIo::new(&mem, self.now);
        io.tracing = self.tracing;
        let r = f(&mut self.dev, &mut io);
        self.trace.extend(io.trace);
        self.irqs.extend(io.irqs);
        self.tx.extend(io.tx);
        r
    }

    pub fn read32(&mut self, o: u64) -> u32 {
        let mut b = [0u8; 4];
        self.with_io(|d, io| d.bar_read(0, o, &mut b, io));
        u32::from_le_bytes(b)
    }
    pub fn write32(&mut self, o: u64, v: u32) {
        self.with_io(|d, io| d.bar_write(0, o, &v.to_le_bytes(), io));
    }
    pub fn write64(&mut self, o: u64, v: u64) {
        self.with_io(|d, io| d.bar_write(0, o, &v.to_le_bytes(), io));
    }
    pub fn poll(&mut self) {
        self.with_io(|d, io| d.poll(io));
    }
    /// A frame from the fabric, parsed once here as the edge does.
    pub fn receive(&mut self, frame: &[u8]) -> Result<(), pci_model::RxRefusal> {
        let view = wire::parse(frame);
        self.with_io(|d, io| d.receive(frame, &view, io))
    }

    pub fn mem_write(&self, a: u64, b: &[u8]) {
        self.mem.write(a, b).unwrap();
    }
    pub fn mem_read(&self, a: u64, n: usize) -> Vec<u8> {
        let mut v = vec![0; n];
        self.mem.read(a, &mut v).unwrap();
        v
    }
    pub fn mem_u64(&self, a: u64) -> u64 {
        self.mem.read_u64_le(a).unwrap()
    }

    fn eq_init(&mut self, depth: u32) -> Ring {
        let addr = self.alloc(u64::from(depth) * 16, 4096);
        let dbrec = self.alloc(8, 8);
        Ring::new(addr, depth, dbrec)
    }

    /// erdma_probe_dev up to erdma_finish_cmdq_init, then erdma_ib_device_add's
    /// QUERY_DEVICE / QUERY_FW_INFO / CONF_DEVICE. Returns (cap0, cap1).
    pub fn probe(&mut self, nceqs: u32) -> (u64, u64) {
        assert_ne!(self.read32(off::VERSION), 0);
        assert_eq!(self.read32(off::DEV_PROTO), regs::PROTO_ROCEV2);
        // erdma_aeq_init
        self.aeq = self.eq_init(AEQ_DEPTH);
        self.write32(off::AEQ_ADDR_H, (self.aeq.addr >> 32) as u32);
        self.write32(off::AEQ_ADDR_L, self.aeq.addr as u32);
        self.write32(off::AEQ_DEPTH, AEQ_DEPTH);
        self.write64(off::AEQ_DB_HOST_ADDR, self.aeq.dbrec);
        // erdma_cmdq_init
        let sq = self.alloc(u64::from(CMDQ_DEPTH) * 32, 4096);
        let sq_db = self.alloc(8, 8);
        self.sq = Ring {
            addr: sq,
            depth: CMDQ_DEPTH,
            ci: 0,
            dbrec: sq_db,
        };
        self.write32(off::CMDQ_SQ_ADDR_H, (sq >> 32) as u32);
        self.write32(off::CMDQ_SQ_ADDR_L, sq as u32);
        self.write32(off::CMDQ_DEPTH, CMDQ_DEPTH);
        self.write64(off::CMDQ_SQ_DB_HOST_ADDR, sq_db);
        let cq = self.alloc(u64::from(CMDQ_DEPTH) * 32, 4096);
        let cq_db = self.alloc(8, 8);
        self.cq = Ring {
            addr: cq,
            depth: CMDQ_DEPTH,
            ci: 0,
            dbrec: cq_db,
        };
        self.write32(off::CMDQ_CQ_ADDR_H, (cq >> 32) as u32);
        self.write32(off::CMDQ_CQ_ADDR_L, cq as u32);
        self.write64(off::CMDQ_CQ_DB_HOST_ADDR, cq_db);
        self.eq = self.eq_init(CMDQ_EQ_DEPTH);
        self.write32(off::CMDQ_EQ_ADDR_H, (self.eq.addr >> 32) as u32);
        self.write32(off::CMDQ_EQ_ADDR_L, self.eq.addr as u32);
        self.write32(off::CMDQ_EQ_DEPTH, CMDQ_EQ_DEPTH);
        self.write64(off::CMDQ_EQ_DB_HOST_ADDR, self.eq.dbrec);
        // erdma_wait_hw_init_done
        self.write32(off::DEV_CTRL, regs::CTRL_INIT);
        assert_ne!(
            self.read32(off::DEV_ST) & regs::ST_INIT_DONE,
            0,
            "init done"
        );
        // erdma_ceqs_init (poll mode)
        for i in 0..nceqs {
            let ring = self.eq_init(CEQ_DEPTH);
            let mut req = [0u8; 32];
            req[8..16].copy_from_slice(&ring.addr.to_le_bytes());
            req[16] = (i + 1) as u8; // vector
            req[17] = (i + 1) as u8; // eqn
            req[18] = CEQ_DEPTH.trailing_zeros() as u8;
            req[19] = 1; // CEQ
            req[20..24].copy_from_slice(&(ring.dbrec as u32).to_le_bytes());
            req[24..28].copy_from_slice(&((ring.dbrec >> 32) as u32).to_le_bytes());
            let c = self.cmd(1, 0, &req);
            assert_eq!(c.status, 0, "CREATE_EQ");
            self.ceqs.push(ring);
        }
        // erdma_finish_cmdq_init
        self.arm_cmdq_cq();
        self.event_mode = true;
        // erdma_dev_attrs_init
        let q = self.cmd(0, 0, &[0u8; 8]);
        assert_eq!(q.status, 0);
        let fw = self.cmd(1, 2, &[0u8; 8]);
        assert_eq!(fw.status, 0);
        assert_ne!(fw.r0 as u32, 0);
        // erdma_device_config (EXTEND_DB set)
        if (q.r0 >> 24) as u8 & (1 << 3) != 0 {
            let mut req = [0u8; 32];
            req[8..12].copy_from_slice(&((1u32 << 31) | 12).to_le_bytes());
            assert_eq!(self.cmd(1, 5, &req).status, 0);
        }
        (q.r0, q.r1)
    }

    pub fn arm_cmdq_cq(&mut self) {
        let v = u64::from(self.cq.ci & 0xff_ffff)
            | (1 << 31)
            | (u64::from(self.cmdsn & 3) << 28)
            | (u64::from(self.cmdsn & 0xff) << 56);
        self.mem_write(self.cq.dbrec, &v.to_le_bytes());
        self.write64(off::CMDQ_CQDB, v);
    }

    fn owner_ok(word_be: u32, ci: u32, depth: u32) -> bool {
        let owner = word_be >> 31;
        (owner ^ u32::from(ci & depth != 0)) == 1
    }

    /// get_next_valid_eqe
    pub fn eq_valid(&self, r: &Ring) -> bool {
        let a = r.addr + u64::from(r.ci & (r.depth - 1)) * 16;
        let w = self.mem_u64(a) as u32;
        ((w >> 31) ^ u32::from(r.ci & r.depth != 0)) == 1
    }

    fn poll_cmd_cq(&mut self) -> Option<Completion> {
        let a = self.cq.addr + u64::from(self.cq.ci & (self.cq.depth - 1)) * 32;
        let b = self.mem_read(a, 32);
        let hdr = u32::from_be_bytes(b[0..4].try_into().unwrap());
        if !Self::owner_ok(hdr, self.cq.ci, self.cq.depth) {
            return None;
        }
        self.cq.ci += 1;
        let w = |i: usize| u32::from_be_bytes(b[i * 4..i * 4 + 4].try_into().unwrap());
        Some(Completion {
            status: (hdr & 0xff) as u8,
            r0: u64::from(w(2)) | (u64::from(w(3)) << 32),
            r1: u64::from(w(4)) | (u64::from(w(5)) << 32),
        })
    }

    /// erdma_post_cmd_wait
    pub fn cmd(&mut self, submod: u64, opcode: u64, req: &[u8]) -> Completion {
        self.try_cmd(submod, opcode, req)
            .expect("command completion")
    }

    pub fn try_cmd(&mut self, submod: u64, opcode: u64, req: &[u8]) -> Option<Completion> {
        let mut slot = [0u8; 128];
        slot[..req.len().min(128)].copy_from_slice(&req[..req.len().min(128)]);
        let start = self.sq_pi;
        self.sq_pi = self.sq_pi.wrapping_add(4);
        let hdr =
            (submod << 24) | (opcode << 16) | u64::from(self.sq_pi) | (7u64 << 32) | (3u64 << 52);
        slot[..8].copy_from_slice(&hdr.to_le_bytes());
        let a = self.sq.addr + u64::from(u32::from(start) & (self.sq.depth - 1)) * 32;
        self.mem_write(a, &slot);
        let db = u64::from(self.sq_pi);
        self.mem_write(self.sq.dbrec, &db.to_le_bytes());
        self.irqs.clear();
        self.write64(off::CMDQ_SQDB, db);
        self.poll();
        if self.event_mode {
            if !self.irqs.contains(&0) {
                return None;
            }
            self.comm_irq()
        } else {
            self.poll_cmd_cq()
        }
    }

    /// erdma_comm_irq_handler: cmdq completion handler (+ AEQ notify).
    fn comm_irq(&mut self) -> Option<Completion> {
        let mut got = 0;
        while self.eq_valid(&self.eq.clone()) {
            self.eq.ci += 1;
            got += 1;
        }
        let mut c = None;
        if got > 0 {
            self.cmdsn += 1;
            c = self.poll_cmd_cq();
            self.arm_cmdq_cq();
        }
        let v = u64::from(self.eq.ci & 0xff_ffff) | (1 << 31);
        self.mem_write(self.eq.dbrec, &v.to_le_bytes());
        self.write64(off::CEQ_DB_BASE, v);
        c
    }

    /// Drains AEQEs: (type, data0).
    pub fn drain_aeq(&mut self) -> Vec<(u8, u32)> {
        let mut out = Vec::new();
        while self.eq_valid(&self.aeq.clone()) {
            let a = self.aeq.addr + u64::from(self.aeq.ci & (self.aeq.depth - 1)) * 16;
            let b = self.mem_read(a, 16);
            let hdr = u32::from_le_bytes(b[0..4].try_into().unwrap());
            out.push((
                ((hdr >> 16) & 0xff) as u8,
                u32::from_le_bytes(b[4..8].try_into().unwrap()),
            ));
            self.aeq.ci += 1;
        }
        let v = u64::from(self.aeq.ci & 0xff_ffff) | (1 << 31);
        self.write64(off::AEQ_DB, v);
        out
    }

    // ---- verbs ----

    /// erdma_create_cq (kernel CQ). Returns cqn.
    pub fn create_cq(&mut self, cqn: u32, depth: u32, eqn: u32) -> Completion {
        let buf = self.alloc(u64::from(depth) * 32, 4096);
        let dbrec = self.alloc(8, 8);
        let mut req = [0u8; 40];
        let cfg0 = cqn | ((25 - 12) << 20) | (depth.trailing_zeros() << 24);
        let cfg1 = eqn | (1 << 16);
        req[8..12].copy_from_slice(&cfg0.to_le_bytes());
        req[12..16].copy_from_slice(&(buf as u32).to_le_bytes());
        req[16..20].copy_from_slice(&((buf >> 32) as u32).to_le_bytes());
        req[20..24].copy_from_slice(&cfg1.to_le_bytes());
        req[24..32].copy_from_slice(&dbrec.to_le_bytes());
        let c = self.cmd(0, 4, &req);
        if c.status == 0 {
            self.cqs.insert(
                cqn,
                Ring {
                    addr: buf,
                    depth,
                    ci: 0,
                    dbrec,
                },
            );
        }
        c
    }

    /// Kernel CQ doorbell: notify_cq.
    pub fn arm_cq(&mut self, cqn: u32, solicited: bool) {
        let r = self.cqs[&cqn];
        let v = (u64::from(cqn) << 32)
            | (1 << 31)
            | (u64::from(solicited) << 30)
            | u64::from(r.ci & 0xff_ffff);
        self.mem_write(r.dbrec, &v.to_le_bytes());
        self.write64(regs::CQDB_SPACE, v);
    }

    /// erdma_poll_one_cqe
    pub fn poll_cq(&mut self, cqn: u32) -> Option<Wc> {
        let r = self.cqs.get_mut(&cqn).unwrap();
        let a = r.addr + u64::from(r.ci & (r.depth - 1)) * 32;
        let (ci, depth) = (r.ci, r.depth);
        let b = self.mem_read(a, 32);
        let hdr = u32::from_be_bytes(b[0..4].try_into().unwrap());
        if !Self::owner_ok(hdr, ci, depth) {
            return None;
        }
        self.cqs.get_mut(&cqn).unwrap().ci += 1;
        let w = |i: usize| u32::from_be_bytes(b[i * 4..i * 4 + 4].try_into().unwrap());
        Some(Wc {
            opcode: ((hdr >> 16) & 0xff) as u8,
            qtype: ((hdr >> 8) & 0xff) as u8,
            syndrome: (hdr & 0xff) as u8,
            qe_idx: w(1),
            qpn: w(2),
            imm: u32::from_le_bytes(b[12..16].try_into().unwrap()),
            size: w(4),
            ud_info: w(7),
        })
    }

    /// erdma_create_qp (kernel QP). sq_size in WQEBBs, rq_size in RQEs.
    pub fn create_qp(
        &mut self,
        qpn: u32,
        ud: bool,
        cqn: u32,
        sq_size: u32,
        rq_size: u32,
    ) -> (Completion, Option<KQp>) {
        let sq = self.alloc(u64::from(sq_size) * 32, 4096);
        let sq_db = self.alloc(8, 8);
        let rq = self.alloc(u64::from(rq_size) * 32, 4096);
        let rq_db = self.alloc(8, 8);
        let mut req = [0u8; 120];
        let cfg0 = qpn | (sq_size.trailing_zeros() << 20);
        let cfg1 = 1 | (rq_size.trailing_zeros() << 20); // pd 1
        let pgsz = (20 - 12) << 28;
        let mtt_cfg = 1 << 1; // cnt 1, level 0
        req[8..12].copy_from_slice(&cfg0.to_le_bytes());
        req[12..16].copy_from_slice(&cfg1.to_le_bytes());
        req[16..20].copy_from_slice(&(pgsz | cqn).to_le_bytes());
        req[20..24].copy_from_slice(&(pgsz | cqn).to_le_bytes());
        req[24..32].copy_from_slice(&sq.to_le_bytes());
        req[32..40].copy_from_slice(&rq.to_le_bytes());
        req[40..44].copy_from_slice(&(mtt_cfg as u32).to_le_bytes());
        req[44..48].copy_from_slice(&(mtt_cfg as u32).to_le_bytes());
        req[48..56].copy_from_slice(&sq_db.to_le_bytes());
        req[56..64].copy_from_slice(&rq_db.to_le_bytes());
        req[116..120].copy_from_slice(&u32::from(ud).to_le_bytes());
        let c = self.cmd(0, 1, &req);
        let ok = c.status == 0;
        (
            c,
            ok.then_some(KQp {
                qpn,
                sq: Ring {
                    addr: sq,
                    depth: sq_size,
                    ci: 0,
                    dbrec: sq_db,
                },
                rq: Ring {
                    addr: rq,
                    depth: rq_size,
                    ci: 0,
                    dbrec: rq_db,
                },
                sq_pi: 0,
                rq_pi: 0,
            }),
        )
    }

    /// SET_GID add.
    pub fn set_gid(&mut self, idx: u32, gid: [u8; 16]) -> Completion {
        let mut req = [0u8; 28];
        let v4 = gid[..10].iter().all(|&b| b == 0) && gid[10] == 0xff && gid[11] == 0xff;
        let cfg = idx | (u32::from(!v4) << 16);
        req[8..12].copy_from_slice(&cfg.to_le_bytes());
        req[12..28].copy_from_slice(&gid);
        self.cmd(0, 14, &req)
    }

    /// MODIFY_QP (RoCEv2 form).
    pub fn modify_qp(
        &mut self,
        qpn: u32,
        state: u8,
        mask: u32,
        av: Option<&AvSpec>,
        dqpn: u32,
        qkey: u32,
        sq_psn: u32,
        rq_psn: u32,
    ) -> Completion {
        let mut req = [0u8; 68];
        let cfg0 = qpn | (u32::from(state) << 24);
        req[8..12].copy_from_slice(&cfg0.to_le_bytes());
        req[12..16].copy_from_slice(&dqpn.to_le_bytes());
        req[16..20].copy_from_slice(&mask.to_le_bytes());
        req[20..24].copy_from_slice(&qkey.to_le_bytes());
        req[24..28].copy_from_slice(&rq_psn.to_le_bytes());
        req[28..32].copy_from_slice(&sq_psn.to_le_bytes());
        if let Some(av) = av {
            av.write(&mut req[32..68]);
        }
        self.cmd(0, 3, &req)
    }

    /// REG_MR with the given page list (level 0 if <= 4 and !force_l1).
    pub fn reg_mr(
        &mut self,
        stag: u32,
        pd: u32,
        va: u64,
        len: u64,
        pages: &[u64],
        access: u8,
        force_l1: bool,
    ) -> Completion {
        let mut req = [0u8; 64];
        let cfg0 = (1u32 << 31) | ((stag & 0xff) << 20) | (stag >> 8);
        let cfg1 = (pd << 12) | (u32::from(access) << 1);
        let level = if pages.len() > 4 || force_l1 { 1u32 } else { 0 };
        let cfg2 = (12u32 << 27) | (level << 20) | pages.len() as u32;
        req[8..12].copy_from_slice(&cfg0.to_le_bytes());
        req[12..16].copy_from_slice(&cfg1.to_le_bytes());
        req[16..24].copy_from_slice(&va.to_le_bytes());
        req[24..28].copy_from_slice(&(len as u32).to_le_bytes());
        req[28..32].copy_from_slice(&cfg2.to_le_bytes());
        if level == 0 {
            for (i, p) in pages.iter().enumerate() {
                req[32 + 8 * i..40 + 8 * i].copy_from_slice(&p.to_le_bytes());
            }
        } else {
            let tbl = self.alloc(8 * pages.len() as u64, 4096);
            for (i, p) in pages.iter().enumerate() {
                self.mem_write(tbl + 8 * i as u64, &p.to_le_bytes());
            }
            req[32..40].copy_from_slice(&tbl.to_le_bytes());
        }
        self.cmd(0, 8, &req)
    }

    /// Kernel SQ doorbell (shared page 95).
    pub fn kick_sq(&mut self, qp: &KQp) {
        let v = (u64::from(qp.qpn) << 32) | u64::from(qp.sq_pi);
        self.mem_write(qp.sq.dbrec, &v.to_le_bytes());
        self.write64(regs::SDB_SHARED_PAGE_INDEX << 12, v);
    }

    /// Writes an SQE (already formatted, header without index/count) and rings.
    pub fn post_sqe(&mut self, qp: &mut KQp, mut sqe: Vec<u8>) {
        let cnt = sqe.len().div_ceil(32).max(1);
        sqe.resize(cnt * 32, 0);
        let start = qp.sq_pi;
        qp.sq_pi = qp.sq_pi.wrapping_add(cnt as u16);
        let mut hdr = u64::from_le_bytes(sqe[..8].try_into().unwrap());
        hdr |= (u64::from(qp.qpn) << 32) | ((cnt as u64 - 1) << 52) | u64::from(qp.sq_pi);
        sqe[..8].copy_from_slice(&hdr.to_le_bytes());
        for i in 0..cnt {
            let idx = (u32::from(start) + i as u32) & (qp.sq.depth - 1);
            self.mem_write(qp.sq.addr + u64::from(idx) * 32, &sqe[i * 32..i * 32 + 32]);
        }
        self.kick_sq(qp);
    }

    /// erdma_post_recv_one (one SGE).
    pub fn post_recv(&mut self, qp: &mut KQp, addr: u64, len: u32, lkey: u32) {
        let mut rqe = [0u8; 32];
        rqe[0..2].copy_from_slice(&qp.rq_pi.wrapping_add(1).to_le_bytes());
        rqe[4..8].copy_from_slice(&qp.qpn.to_le_bytes());
        rqe[16..24].copy_from_slice(&addr.to_le_bytes());
        rqe[24..28].copy_from_slice(&len.to_le_bytes());
        rqe[28..32].copy_from_slice(&lkey.to_le_bytes());
        let idx = u32::from(qp.rq_pi) & (qp.rq.depth - 1);
        self.mem_write(qp.rq.addr + u64::from(idx) * 32, &rqe);
        self.mem_write(qp.rq.dbrec, &rqe[..8]);
        self.write64(
            regs::RQDB_SPACE,
            u64::from_le_bytes(rqe[..8].try_into().unwrap()),
        );
        qp.rq_pi = qp.rq_pi.wrapping_add(1);
    }
}

/// A RoCEv2 address vector as the driver builds it.
#[derive(Debug, Clone, Copy)]
pub struct AvSpec {
    pub flow_label: u32,
    pub tclass: u8,
    pub hop_limit: u8,
    pub sl: u8,
    pub udp_sport: u16,
    pub sgid_index: u16,
    pub dmac: [u8; 6],
    pub dgid: [u8; 16],
}

impl AvSpec {
    pub fn write(&self, b: &mut [u8]) {
        let v4 = self.dgid[..10].iter().all(|&x| x == 0) && self.dgid[10] == 0xff;
        let cfg0 = (self.flow_label & 0xf_ffff) | (u32::from(!v4) << 20);
        b[0..4].copy_from_slice(&cfg0.to_le_bytes());
        b[4] = self.tclass;
        b[5] = self.hop_limit;
        b[6] = self.sl;
        b[8..10].copy_from_slice(&self.udp_sport.to_le_bytes());
        b[10..12].copy_from_slice(&self.sgid_index.to_le_bytes());
        b[12..18].copy_from_slice(&self.dmac);
        b[20..36].copy_from_slice(&self.dgid);
    }
}

/// SQE header bits.
pub fn sqe_hdr(opcode: u8, sgl_len: u8, ce: bool, inline: bool) -> u64 {
    (u64::from(sgl_len) << 56)
        | (u64::from(opcode) << 27)
        | (u64::from(ce) << 22)
        | (u64::from(inline) << 25)
}

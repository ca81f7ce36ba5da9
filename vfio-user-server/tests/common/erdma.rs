//! The erdma driver's side over vfio-user, for the tests and the daemon's
//! fabric bench: registers and doorbells are region accesses on a
//! `vfio_user::Client`, guest RAM is a memfd the driver `DMA_MAP`s and maps
//! itself, interrupts arrive on eventfds. The layouts are the ones
//! `erdma-device/README.md` documents (learnt from
//! `drivers/infiniband/hw/erdma`), written out again on purpose rather
//! than shared with the model-level test driver.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::AsRawFd;

use super::{enable_bus_master, memfd, take_events, MappedMem};

// The plain types the in-process erdma test driver uses too.
#[path = "../../../erdma-device/tests/common/types.rs"]
mod types;
use erdma_device::cmdq::{common_op, rdma_op, status, submod};
use erdma_device::qp::{qpa, qps};
use erdma_device::regs::{self, off};
use erdma_device::wqe::op;
pub use types::{v4_gid, Ring, Wc};

pub const CONFIG: u32 = 7;
pub const BAR0: u32 = regs::FUNC_BAR as u32;
/// Guest RAM as the device sees it: above 4 GiB, so that every `_H`
/// address register and the high half of every 64-bit address matters.
pub const IOVA: u64 = 0x1_0000_0000;
pub const RAM: u64 = 4 << 20;
/// The memfd is longer than the mapping: these bytes right after guest RAM
/// hold a canary that no device access may touch.
pub const GUARD: u64 = 64 << 10;
pub const CANARY: u8 = 0xa5;

pub const MAC_A: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0a];
pub const MAC_B: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0b];
pub const IP_A: [u8; 4] = [10, 0, 0, 1];
pub const IP_B: [u8; 4] = [10, 0, 0, 2];

/// Queue sizes as `erdma_probe_dev` programs them.
pub const CMDQ_DEPTH: u32 = 512; // WQEBBs: 128 commands of 4 WQEBBs
pub const CMDQ_EQ_DEPTH: u32 = 128;
pub const AEQ_DEPTH: u32 = 4096;
pub const CEQ_DEPTH: u32 = 256;
/// CEQs 1..=NCEQS on vectors 1..=NCEQS; vector 0 is the CMDQ EQ + AEQ.
pub const NCEQS: u32 = 2;
pub const VECTORS: u32 = NCEQS + 1;

/// MODIFY_QP masks the driver sends on the way to RTS.
pub const TO_INIT: u32 = qpa::STATE;
pub const TO_RTR: u32 = qpa::STATE | qpa::AV | qpa::RQ_PSN | qpa::DST_QPN;
pub const TO_RTS: u32 = qpa::STATE | qpa::SQ_PSN;
pub const PSN: u32 = 500;
/// Memory-region access bits (RA 1, LR 2, LW 4, RR 8, RW 16).
pub const ACCESS_ALL: u8 = 0x1e;

pub fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}

pub fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

pub fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// Puts `v` little-endian at `at` (commands, SQEs, RQEs, AVs are LE).
pub fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

pub fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Valid-entry test of `get_next_valid_cqe` / `get_next_valid_eqe`: the
/// owner bit is 1 on the first pass and flips on every wrap.
pub fn owner_ok(owner: u32, ci: u32, depth: u32) -> bool {
    owner ^ u32::from(ci & depth != 0) == 1
}

/// A command completion (CMDQ CQE).
#[derive(Debug, Clone, Copy)]
pub struct Cmd {
    pub status: u8,
    pub r0: u64,
    pub r1: u64,
    /// Vector-0 interrupts seen while waiting for it.
    pub irqs: u64,
}

/// A kernel QP: rings and producer indices.
pub struct Qp {
    pub qpn: u32,
    pub sq: Ring,
    pub rq: Ring,
    pub sq_pi: u16,
    pub rq_pi: u16,
}

/// `struct erdma_av_cfg` (36 bytes), RoCEv2 over IPv4.
pub struct Av {
    pub dmac: [u8; 6],
    pub dip: [u8; 4],
    pub udp_sport: u16,
    pub hop_limit: u8,
}

impl Av {
    pub fn to(dmac: [u8; 6], dip: [u8; 4]) -> Self {
        Av {
            dmac,
            dip,
            udp_sport: 0xc001,
            hop_limit: 64,
        }
    }

    pub fn write(&self, b: &mut [u8]) {
        put32(b, 0, 0); // flow label 0, ntype 0 (IPv4)
        b[4] = 0; // traffic class
        b[5] = self.hop_limit;
        b[6] = 0; // SL
        b[8..10].copy_from_slice(&self.udp_sport.to_le_bytes());
        b[10..12].copy_from_slice(&0u16.to_le_bytes()); // SGID index 0
        b[12..18].copy_from_slice(&self.dmac);
        b[20..36].copy_from_slice(&v4_gid(self.dip));
    }
}

/// The erdma driver's side, over vfio-user: registers and doorbells are
/// BAR 0 region accesses, guest memory is the test's mmap of the memfd.
pub struct Driver {
    pub c: vfio_user::Client,
    pub _ram: File,
    pub mem: MappedMem,
    pub next: u64,
    /// One eventfd per MSI-X vector the driver uses.
    pub vectors: Vec<File>,
    pub aeq: Ring,
    pub cmd_sq: Ring,
    pub cmd_pi: u16,
    pub cmd_cq: Ring,
    pub cmd_eq: Ring,
    pub cmdsn: u32,
    /// The CMDQ CQ was armed: completions come with an EQE + vector 0.
    pub event_mode: bool,
    pub ceqs: Vec<Ring>,
    pub cqs: BTreeMap<u32, Ring>,
    /// From QUERY_DEVICE.
    pub local_dma_key: u32,
    /// Doorbells go as posted writes on this socket (as QEMU sends BAR
    /// writes) rather than as `vfio_user::Client`'s acknowledged ones.
    pub posted: Option<std::os::unix::net::UnixStream>,
}

impl Driver {
    /// Connects, maps guest RAM, turns bus mastering and MSI-X on and
    /// gives every vector the driver uses an eventfd (what QEMU and the PCI
    /// core do before and during `erdma_probe`).
    pub fn connect(mut c: vfio_user::Client) -> Self {
        let ram = memfd(RAM + GUARD);
        c.dma_map(0, IOVA, RAM, ram.as_raw_fd()).unwrap();
        enable_bus_master(&mut c);
        let mem = MappedMem::new(&ram, IOVA);
        mem.write(IOVA + RAM, &[CANARY; GUARD as usize]);
        let zero = Ring {
            addr: 0,
            depth: 0,
            ci: 0,
            dbrec: 0,
        };
        let mut d = Driver {
            c,
            _ram: ram,
            mem,
            next: IOVA + 0x1000,
            vectors: Vec::new(),
            aeq: zero,
            cmd_sq: zero,
            cmd_pi: 0,
            cmd_cq: zero,
            cmd_eq: zero,
            cmdsn: 0,
            event_mode: false,
            ceqs: Vec::new(),
            cqs: BTreeMap::new(),
            local_dma_key: 0,
            posted: None,
        };
        d.set_vectors();
        d
    }

    /// MSI-X on, an eventfd per vector ([`super::msix_eventfds`]).
    pub fn set_vectors(&mut self) {
        self.vectors = super::msix_eventfds(&mut self.c, VECTORS);
    }

    /// Interrupts on `vector` since the last call.
    pub fn irqs(&self, vector: usize) -> u64 {
        take_events(&self.vectors[vector])
    }

    // ---- guest memory ----

    /// `dma_alloc_coherent`: zeroed, aligned, inside the mapping.
    pub fn alloc(&mut self, size: u64, align: u64) -> u64 {
        self.mem
            .alloc_zeroed(&mut self.next, IOVA + RAM, size, align)
    }

    pub fn read(&self, addr: u64, len: usize) -> Vec<u8> {
        self.mem.read(addr, len)
    }

    pub fn write(&self, addr: u64, data: &[u8]) {
        self.mem.write(addr, data);
    }

    pub fn ring(&mut self, depth: u32, entry: u64) -> Ring {
        let addr = self.alloc(u64::from(depth) * entry, 4096);
        let dbrec = self.alloc(8, 8);
        Ring::new(addr, depth, dbrec)
    }

    /// The canary after guest RAM is intact.
    pub fn canary_intact(&self) -> bool {
        self.read(IOVA + RAM, GUARD as usize)
            .iter()
            .all(|&b| b == CANARY)
    }

    // ---- BAR 0 ----

    pub fn r32(&mut self, o: u64) -> u32 {
        let mut b = [0u8; 4];
        self.c.region_read(BAR0, o, &mut b).unwrap();
        u32::from_le_bytes(b)
    }

    pub fn w32(&mut self, o: u64, v: u32) {
        self.c.region_write(BAR0, o, &v.to_le_bytes()).unwrap();
    }

    /// `writeq`: one 8-byte region write (doorbells, 64-bit registers).
    pub fn w64(&mut self, o: u64, v: u64) {
        self.c.region_write(BAR0, o, &v.to_le_bytes()).unwrap();
    }

    /// A 64-bit doorbell, mirrored in its doorbell record first (as the
    /// driver does; the model does not read records).
    pub fn doorbell(&mut self, o: u64, v: u64, dbrec: u64) {
        self.write(dbrec, &v.to_le_bytes());
        match &mut self.posted {
            Some(s) => super::posted_write(s, BAR0, o, &v.to_le_bytes()),
            None => self.w64(o, v),
        }
    }

    /// From now on, doorbells are posted writes (QEMU's BAR writes)
    /// on the socket this driver's client opened to `path`.
    pub fn post_doorbells(&mut self, path: &std::path::Path) {
        self.posted = Some(super::client_socket(path));
    }

    pub fn mac(&mut self) -> [u8; 6] {
        // u64_to_ether_addr(H << 32 | L): byte 5 is bits 7:0.
        let v =
            u64::from(self.r32(off::NETDEV_MAC_L)) | (u64::from(self.r32(off::NETDEV_MAC_H)) << 32);
        std::array::from_fn(|i| (v >> (40 - 8 * i)) as u8)
    }

    // ---- probe ----

    /// `erdma_aeq_init` + `erdma_cmdq_init` + `erdma_wait_hw_init_done`:
    /// program the queues' registers, then CTRL = INIT and poll ST.
    pub fn init_queues(&mut self) {
        self.aeq = self.ring(AEQ_DEPTH, 16);
        let a = self.aeq;
        self.w32(off::AEQ_ADDR_H, (a.addr >> 32) as u32);
        self.w32(off::AEQ_ADDR_L, a.addr as u32);
        self.w32(off::AEQ_DEPTH, AEQ_DEPTH);
        self.w64(off::AEQ_DB_HOST_ADDR, a.dbrec);

        self.cmd_sq = self.ring(CMDQ_DEPTH, 32);
        let sq = self.cmd_sq;
        self.w32(off::CMDQ_SQ_ADDR_H, (sq.addr >> 32) as u32);
        self.w32(off::CMDQ_SQ_ADDR_L, sq.addr as u32);
        self.w32(off::CMDQ_DEPTH, CMDQ_DEPTH);
        self.w64(off::CMDQ_SQ_DB_HOST_ADDR, sq.dbrec);
        self.cmd_cq = self.ring(CMDQ_DEPTH, 32);
        let cq = self.cmd_cq;
        self.w32(off::CMDQ_CQ_ADDR_H, (cq.addr >> 32) as u32);
        self.w32(off::CMDQ_CQ_ADDR_L, cq.addr as u32);
        self.w64(off::CMDQ_CQ_DB_HOST_ADDR, cq.dbrec);
        self.cmd_eq = self.ring(CMDQ_EQ_DEPTH, 16);
        let eq = self.cmd_eq;
        self.w32(off::CMDQ_EQ_ADDR_H, (eq.addr >> 32) as u32);
        self.w32(off::CMDQ_EQ_ADDR_L, eq.addr as u32);
        self.w32(off::CMDQ_EQ_DEPTH, CMDQ_EQ_DEPTH);
        self.w64(off::CMDQ_EQ_DB_HOST_ADDR, eq.dbrec);

        self.w32(off::DEV_CTRL, regs::CTRL_INIT);
        assert_ne!(
            self.r32(off::DEV_ST) & regs::ST_INIT_DONE,
            0,
            "INIT_DONE after the queues are programmed"
        );
    }

    /// `erdma_ceqs_init`: CREATE_EQ per CEQ, in poll mode (the CMDQ CQ is
    /// not armed yet). CEQ n uses vector n.
    pub fn create_ceqs(&mut self) {
        for n in 1..=NCEQS {
            let r = self.ring(CEQ_DEPTH, 16);
            let mut req = [0u8; 28];
            put64(&mut req, 8, r.addr);
            req[16] = n as u8; // vector
            req[17] = n as u8; // eqn
            req[18] = CEQ_DEPTH.trailing_zeros() as u8;
            req[19] = 1; // CEQ
            put32(&mut req, 20, r.dbrec as u32);
            put32(&mut req, 24, (r.dbrec >> 32) as u32);
            let c = self.cmd(submod::COMMON, common_op::CREATE_EQ, &req);
            assert_eq!(c.status, status::OK, "CREATE_EQ {n}");
            self.ceqs.push(r);
        }
    }

    /// `erdma_finish_cmdq_init`: arm the CMDQ CQ; from now on every
    /// completion comes with a CMDQ EQE and vector 0.
    pub fn enter_event_mode(&mut self) {
        self.arm_cmdq_cq();
        self.event_mode = true;
    }

    /// CONF_MTU, as `erdma_set_mtu` sends the netdev's MTU.
    pub fn conf_mtu(&mut self, mtu: u32) -> u8 {
        let mut req = [0u8; 12];
        put32(&mut req, 8, mtu);
        self.cmd(submod::COMMON, common_op::CONF_MTU, &req).status
    }

    pub fn query_device(&mut self) -> Cmd {
        let c = self.cmd(submod::RDMA, rdma_op::QUERY_DEVICE, &[]);
        if c.status == status::OK {
            self.local_dma_key = (c.r1 >> 32) as u32;
        }
        c
    }

    /// The whole probe up to `erdma_ib_device_add`'s commands.
    pub fn probe(&mut self) -> Cmd {
        assert_ne!(self.r32(off::VERSION), 0);
        assert_eq!(self.r32(off::DEV_PROTO), regs::PROTO_ROCEV2);
        self.init_queues();
        self.create_ceqs();
        self.enter_event_mode();
        let q = self.query_device();
        assert_eq!(q.status, status::OK, "QUERY_DEVICE");
        let fw = self.cmd(submod::COMMON, common_op::QUERY_FW_INFO, &[]);
        assert_eq!(fw.status, status::OK, "QUERY_FW_INFO");
        // erdma_device_config: EXTEND_DB is reported, so CONF_DEVICE with
        // the page shift.
        let mut req = [0u8; 12];
        put32(&mut req, 8, (1 << 31) | 12);
        let c = self.cmd(submod::COMMON, common_op::CONF_DEVICE, &req);
        assert_eq!(c.status, status::OK, "CONF_DEVICE");
        q
    }

    // ---- command queue ----

    pub fn arm_cmdq_cq(&mut self) {
        let sn = u64::from(self.cmdsn);
        let v = u64::from(self.cmd_cq.ci & 0xff_ffff) | (1 << 31) | ((sn & 3) << 28) | (sn << 56);
        self.doorbell(off::CMDQ_CQDB, v, self.cmd_cq.dbrec);
    }

    /// Writes one 128-byte command (4 WQEBBs) at the SQ producer index and
    /// rings CMDQ_SQDB. Returns the index of its first WQEBB.
    pub fn post_cmd(&mut self, sub: u8, opcode: u8, req: &[u8]) -> u16 {
        let mut slot = [0u8; regs::CMDQ_SQE_SIZE];
        slot[..req.len()].copy_from_slice(req);
        let first = self.cmd_pi;
        self.cmd_pi = self.cmd_pi.wrapping_add(4);
        // The cookie is the driver's wait-context index; here the command
        // slot, checked when the completion comes back.
        let cookie = u64::from(first / 4);
        let hdr = (3u64 << 52)
            | (cookie << 32)
            | (u64::from(sub) << 24)
            | (u64::from(opcode) << 16)
            | u64::from(self.cmd_pi);
        put64(&mut slot, 0, hdr);
        let mask = self.cmd_sq.depth - 1;
        for i in 0..4u32 {
            let idx = (u32::from(first) + i) & mask;
            let at = 32 * i as usize;
            self.write(self.cmd_sq.addr + u64::from(idx) * 32, &slot[at..at + 32]);
        }
        self.doorbell(off::CMDQ_SQDB, u64::from(self.cmd_pi), self.cmd_sq.dbrec);
        first
    }

    /// The next CMDQ CQE, if valid: (status, first WQEBB index, resp0, resp1).
    pub fn poll_cmd_cq(&mut self) -> Option<(u8, u32, u64, u64)> {
        let r = self.cmd_cq;
        let b = self.read(r.addr + u64::from(r.ci & (r.depth - 1)) * 32, 32);
        let w0 = be32(&b, 0);
        if !owner_ok(w0 >> 31, r.ci, r.depth) {
            return None;
        }
        self.cmd_cq.ci += 1;
        assert_eq!((w0 >> 8) & 0xff, 2, "CQE qtype CMDQ");
        let w = |i: usize| u64::from(be32(&b, 4 * i));
        Some((
            (w0 & 0xff) as u8,
            be32(&b, 4),
            w(2) | w(3) << 32,
            w(4) | w(5) << 32,
        ))
    }

    /// Consumes the valid EQEs of `r` (advancing its CI) and returns them.
    pub fn consume_eqes(&self, r: &mut Ring) -> Vec<[u8; 16]> {
        let mut out = Vec::new();
        loop {
            let b = self.read(r.addr + u64::from(r.ci & (r.depth - 1)) * 16, 16);
            if !owner_ok(le32(&b, 0) >> 31, r.ci, r.depth) {
                return out;
            }
            r.ci += 1;
            out.push(b.try_into().unwrap());
        }
    }

    /// `erdma_cmdq_completion_handler` on vector 0: consume the CMDQ EQEs,
    /// poll the CQ, re-arm it, notify (re-arm) the EQ.
    pub fn cmdq_irq_handler(&mut self) -> Option<(u8, u32, u64, u64)> {
        let mut eq = self.cmd_eq;
        let eqes = self.consume_eqes(&mut eq);
        self.cmd_eq = eq;
        let mut c = None;
        if !eqes.is_empty() {
            self.cmdsn += 1;
            c = self.poll_cmd_cq();
            self.arm_cmdq_cq();
        }
        let v = u64::from(self.cmd_eq.ci & 0xff_ffff) | (1 << 31);
        self.doorbell(off::CEQ_DB_BASE, v, self.cmd_eq.dbrec);
        c
    }

    /// `erdma_post_cmd_wait`. The region write of the doorbell returns once
    /// the device has run the command, so the completion is there at once;
    /// after a posted doorbell, a register read (answered only after it)
    /// stands in for the driver's wait.
    pub fn cmd(&mut self, sub: u8, opcode: u8, req: &[u8]) -> Cmd {
        let first = self.post_cmd(sub, opcode, req);
        if self.posted.is_some() {
            self.r32(off::DEV_ST);
        }
        let (irqs, c) = if self.event_mode {
            let irqs = self.irqs(0);
            assert!(irqs >= 1, "vector 0 must fire for a completion");
            (irqs, self.cmdq_irq_handler())
        } else {
            (0, self.poll_cmd_cq())
        };
        let (st, idx, r0, r1) = c.expect("command completion");
        // The driver finds its wait context through the SQE at the index
        // the CQE names.
        assert_eq!(idx, u32::from(first), "CQE names the command's WQEBB");
        let at = self.cmd_sq.addr + u64::from(idx & (self.cmd_sq.depth - 1)) * 32;
        let hdr = le64(&self.read(at, 8), 0);
        assert_eq!((hdr >> 32) & 0xffff, u64::from(first / 4), "cookie");
        Cmd {
            status: st,
            r0,
            r1,
            irqs,
        }
    }

    pub fn rdma(&mut self, opcode: u8, req: &[u8]) -> u8 {
        self.cmd(submod::RDMA, opcode, req).status
    }

    // ---- verbs ----

    pub fn set_gid(&mut self, idx: u32, ip: [u8; 4]) -> u8 {
        let mut req = [0u8; 28];
        put32(&mut req, 8, idx); // ntype 0 (IPv4), op add
        req[12..28].copy_from_slice(&v4_gid(ip));
        self.rdma(rdma_op::SET_GID, &req)
    }

    /// CREATE_CQ for a kernel CQ whose ring is at `buf` (one 32 MiB
    /// "page", level 0, as `erdma_create_cq` describes a coherent buffer).
    pub fn create_cq_at(&mut self, cqn: u32, depth: u32, eqn: u32, buf: u64) -> u8 {
        let dbrec = self.alloc(8, 8);
        let mut req = [0u8; 40];
        put32(
            &mut req,
            8,
            cqn | ((25 - 12) << 20) | (depth.trailing_zeros() << 24),
        );
        put32(&mut req, 12, buf as u32);
        put32(&mut req, 16, (buf >> 32) as u32);
        put32(&mut req, 20, eqn | (1 << 16)); // 1 MTT entry, level 0
        put64(&mut req, 24, dbrec);
        let st = self.rdma(rdma_op::CREATE_CQ, &req);
        if st == status::OK {
            let r = Ring {
                addr: buf,
                depth,
                ci: 0,
                dbrec,
            };
            self.cqs.insert(cqn, r);
        }
        st
    }

    pub fn create_cq(&mut self, cqn: u32, depth: u32, eqn: u32) -> u8 {
        let buf = self.alloc(u64::from(depth) * 32, 4096);
        self.create_cq_at(cqn, depth, eqn, buf)
    }

    /// CREATE_QP for a kernel RC QP with its rings at `sq` / `rq` (each one
    /// 1 MiB "page", level 0), both queues completing on `cqn`.
    pub fn create_qp_at(&mut self, qpn: u32, cqn: u32, sq: Ring, rq: Ring) -> u8 {
        let mut req = [0u8; 120];
        put32(&mut req, 8, qpn | (sq.depth.trailing_zeros() << 20));
        put32(&mut req, 12, 1 | (rq.depth.trailing_zeros() << 20)); // PD 1
        let cqn_cfg = ((20 - 12) << 28) | cqn;
        put32(&mut req, 16, cqn_cfg);
        put32(&mut req, 20, cqn_cfg);
        put64(&mut req, 24, sq.addr);
        put64(&mut req, 32, rq.addr);
        put32(&mut req, 40, 1 << 1); // 1 MTT entry, level 0
        put32(&mut req, 44, 1 << 1);
        put64(&mut req, 48, sq.dbrec);
        put64(&mut req, 56, rq.dbrec);
        put32(&mut req, 116, 0); // RC
        self.rdma(rdma_op::CREATE_QP, &req)
    }

    pub fn create_qp(&mut self, qpn: u32, cqn: u32, sq_depth: u32, rq_depth: u32) -> Qp {
        let sq = self.ring(sq_depth, 32);
        let rq = self.ring(rq_depth, 32);
        assert_eq!(self.create_qp_at(qpn, cqn, sq, rq), status::OK, "CREATE_QP");
        Qp {
            qpn,
            sq,
            rq,
            sq_pi: 0,
            rq_pi: 0,
        }
    }

    pub fn modify_qp(&mut self, qpn: u32, state: u8, mask: u32, av: Option<&Av>, dqpn: u32) -> u8 {
        let mut req = [0u8; 68];
        put32(&mut req, 8, qpn | (u32::from(state) << 24));
        put32(&mut req, 12, dqpn);
        put32(&mut req, 16, mask);
        put32(&mut req, 24, PSN); // RQ PSN
        put32(&mut req, 28, PSN); // SQ PSN
        if let Some(av) = av {
            av.write(&mut req[32..68]);
        }
        self.rdma(rdma_op::MODIFY_QP, &req)
    }

    /// INIT → RTR (AV towards the peer) → RTS, as `erdma_modify_qp` does.
    pub fn qp_to_rts(&mut self, qpn: u32, av: &Av, dqpn: u32) {
        assert_eq!(self.modify_qp(qpn, qps::INIT, TO_INIT, None, 0), 0);
        assert_eq!(self.modify_qp(qpn, qps::RTR, TO_RTR, Some(av), dqpn), 0);
        assert_eq!(self.modify_qp(qpn, qps::RTS, TO_RTS, None, 0), 0);
    }

    /// QUERY_QP: (status, SQ PSN, RQ PSN, state).
    pub fn query_qp(&mut self, qpn: u32) -> (u8, u32, u32, u8) {
        let mut req = [0u8; 12];
        put32(&mut req, 8, qpn);
        let c = self.cmd(submod::RDMA, rdma_op::QUERY_QP, &req);
        let r = c.r0;
        (
            c.status,
            (r & 0xff_ffff) as u32,
            ((r >> 24) & 0xff_ffff) as u32,
            (r >> 48) as u8,
        )
    }

    pub fn destroy(&mut self, opcode: u8, n: u32) -> u8 {
        let mut req = [0u8; 12];
        put32(&mut req, 8, n);
        self.rdma(opcode, &req)
    }

    /// REG_MR of a normal MR with 4 KiB pages: level 0 (inline page list)
    /// for up to 4 pages unless `mtt` gives the address of a level-1 table.
    pub fn reg_mr(&mut self, stag: u32, va: u64, len: u32, pages: &[u64], mtt: Option<u64>) -> u8 {
        let mut req = [0u8; 64];
        put32(&mut req, 8, (1 << 31) | ((stag & 0xff) << 20) | (stag >> 8));
        put32(&mut req, 12, (1 << 12) | (u32::from(ACCESS_ALL) << 1)); // PD 1
        put64(&mut req, 16, va);
        put32(&mut req, 24, len);
        let level = u32::from(mtt.is_some());
        put32(
            &mut req,
            28,
            (12 << 27) | (level << 20) | pages.len() as u32,
        );
        match mtt {
            Some(table) => put64(&mut req, 32, table),
            None => {
                for (i, p) in pages.iter().enumerate() {
                    put64(&mut req, 32 + 8 * i, *p);
                }
            }
        }
        self.rdma(rdma_op::REG_MR, &req)
    }

    // ---- data path ----

    /// Writes an SQE (header without QPN/count/index) into the SQ ring and
    /// rings the kernel SQ doorbell (shared page 95).
    pub fn post_send(&mut self, qp: &mut Qp, mut sqe: Vec<u8>) {
        let n = sqe.len().div_ceil(32).max(1);
        sqe.resize(n * 32, 0);
        let first = qp.sq_pi;
        qp.sq_pi = qp.sq_pi.wrapping_add(n as u16);
        let hdr = le64(&sqe, 0)
            | (u64::from(qp.qpn) << 32)
            | ((n as u64 - 1) << 52)
            | u64::from(qp.sq_pi);
        put64(&mut sqe, 0, hdr);
        for i in 0..n {
            let idx = (u32::from(first) + i as u32) & (qp.sq.depth - 1);
            self.write(qp.sq.addr + u64::from(idx) * 32, &sqe[32 * i..32 * i + 32]);
        }
        let db = (u64::from(qp.qpn) << 32) | u64::from(qp.sq_pi);
        self.doorbell(regs::SDB_SHARED_PAGE_INDEX << 12, db, qp.sq.dbrec);
    }

    /// `erdma_post_recv_one` with one SGE; the RQ doorbell is the RQE's
    /// first qword.
    pub fn post_recv(&mut self, qp: &mut Qp, addr: u64, len: u32, key: u32) {
        let mut rqe = [0u8; 32];
        rqe[0..2].copy_from_slice(&qp.rq_pi.wrapping_add(1).to_le_bytes());
        put32(&mut rqe, 4, qp.qpn);
        put64(&mut rqe, 16, addr);
        put32(&mut rqe, 24, len);
        put32(&mut rqe, 28, key);
        let idx = u32::from(qp.rq_pi) & (qp.rq.depth - 1);
        self.write(qp.rq.addr + u64::from(idx) * 32, &rqe);
        qp.rq_pi = qp.rq_pi.wrapping_add(1);
        self.doorbell(regs::RQDB_SPACE, le64(&rqe, 0), qp.rq.dbrec);
    }

    /// Kernel CQ doorbell (`erdma_req_notify_cq`): CQN, arm, CI.
    pub fn arm_cq(&mut self, cqn: u32) {
        let r = self.cqs[&cqn];
        let v = (u64::from(cqn) << 32) | (1 << 31) | u64::from(r.ci & 0xff_ffff);
        self.doorbell(regs::CQDB_SPACE, v, r.dbrec);
    }

    /// `erdma_poll_one_cqe`: the next valid CQE (big-endian words).
    pub fn poll_cq(&mut self, cqn: u32) -> Option<Wc> {
        let r = self.cqs[&cqn];
        let b = self.read(r.addr + u64::from(r.ci & (r.depth - 1)) * 32, 32);
        let w0 = be32(&b, 0);
        if !owner_ok(w0 >> 31, r.ci, r.depth) {
            return None;
        }
        self.cqs.get_mut(&cqn).unwrap().ci += 1;
        Some(Wc {
            opcode: (w0 >> 16) as u8,
            qtype: (w0 >> 8) as u8,
            syndrome: w0 as u8,
            qe_idx: be32(&b, 4),
            qpn: be32(&b, 8),
            imm: u32::from_le_bytes(b[12..16].try_into().unwrap()),
            size: be32(&b, 16),
            ud_info: be32(&b, 28),
        })
    }

    /// `erdma_intr_ceq_task`: the CQNs named by new CEQEs on CEQ `n`; the
    /// CEQ is then notified and re-armed.
    pub fn ceq_events(&mut self, n: u32) -> Vec<u32> {
        let mut r = self.ceqs[n as usize - 1];
        let cqns = self
            .consume_eqes(&mut r)
            .iter()
            .map(|e| le32(e, 0) & 0xf_ffff)
            .collect();
        self.ceqs[n as usize - 1] = r;
        let v = u64::from(r.ci & 0xff_ffff) | (1 << 31);
        self.doorbell(off::CEQ_DB_BASE + 8 * u64::from(n), v, r.dbrec);
        cqns
    }

    /// `erdma_aeq_event_handler`: (type, QPN/CQN) of new AEQEs.
    pub fn aeq_events(&mut self) -> Vec<(u8, u32)> {
        let mut r = self.aeq;
        let ev = self
            .consume_eqes(&mut r)
            .iter()
            .map(|e| ((le32(e, 0) >> 16) as u8, le32(e, 4)))
            .collect();
        self.aeq = r;
        let v = u64::from(r.ci & 0xff_ffff) | (1 << 31);
        self.doorbell(off::AEQ_DB, v, r.dbrec);
        ev
    }
}

/// SQE header bits the caller chooses: SGE count (or inline length),
/// opcode, completion requested.
pub fn sqe_hdr(opcode: u8, sges: u8, signaled: bool) -> u64 {
    (u64::from(sges) << 56) | (u64::from(opcode) << 27) | (u64::from(signaled) << 22)
}

/// An RC WRITE of `len` bytes from `laddr` (key `lkey`) to `remote` (key
/// `rkey`): the 32-byte header block, then one SGE.
pub fn write_sqe(len: u32, laddr: u64, lkey: u32, remote: u64, rkey: u32) -> Vec<u8> {
    let mut s = vec![0u8; 48];
    put64(&mut s, 0, sqe_hdr(op::WRITE, 1, true));
    put32(&mut s, 12, len);
    put32(&mut s, 16, rkey);
    put64(&mut s, 20, remote);
    put64(&mut s, 32, laddr);
    put32(&mut s, 40, len);
    put32(&mut s, 44, lkey);
    s
}

/// An RC SEND of `len` bytes from one SGE.
pub fn send_sqe(len: u32, addr: u64, key: u32) -> Vec<u8> {
    let mut s = vec![0u8; 32];
    put64(&mut s, 0, sqe_hdr(op::SEND, 1, true));
    put32(&mut s, 12, len);
    put64(&mut s, 16, addr);
    put32(&mut s, 24, len);
    put32(&mut s, 28, key);
    s
}

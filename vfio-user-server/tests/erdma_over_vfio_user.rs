//! The emulated erdma (`erdma-device`) driven through the vfio-user edge
//! with no VM: `vfio_user::Client` in this process → UNIX socket →
//! `VfioUserServer` serving `ErdmaDevice`. Guest RAM is a memfd the test
//! `DMA_MAP`s and also maps itself, so it builds the command queue, event
//! queues, CQs, SQ/RQ rings and buffers in "guest memory" as the Linux
//! erdma driver does, while every register access and doorbell is a
//! vfio-user region access, interrupts arrive on eventfds and all device
//! DMA goes through the edge's `DmaTable`. Frames the device sends land in
//! the server's sink; frames from the "fabric" enter with
//! `DeviceHandle::receive` (the daemon's path).
//!
//! The layouts used here are the ones `erdma-device/README.md` documents
//! (learnt from `drivers/infiniband/hw/erdma`); they are written out again
//! on purpose rather than shared with the model-level test driver, so
//! this file is a second, independent reading of that specification.

mod common;

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::AsRawFd;

use common::{enable_bus_master, eventfd, memfd, take_events, MappedMem, TestServer};
use erdma_device::cmdq::{common_op, rdma_op, status, submod};
use erdma_device::qp::{qpa, qps};
use erdma_device::regs::{self, off};
use erdma_device::wqe::op;
use erdma_device::{Counters, ErdmaConfig, ErdmaDevice};
use vfio_bindings::bindings::vfio::{
    VFIO_IRQ_SET_ACTION_TRIGGER, VFIO_IRQ_SET_DATA_EVENTFD, VFIO_PCI_MSIX_IRQ_INDEX,
};
use vfio_user_server::Limits;

const CONFIG: u32 = 7;
const BAR0: u32 = regs::FUNC_BAR as u32;
/// Guest RAM as the device sees it: above 4 GiB, so that every `_H`
/// address register and the high half of every 64-bit address matters.
const IOVA: u64 = 0x1_0000_0000;
const RAM: u64 = 4 << 20;
/// The memfd is longer than the mapping: these bytes right after guest RAM
/// hold a canary that no device access may touch.
const GUARD: u64 = 64 << 10;
const CANARY: u8 = 0xa5;

const MAC_A: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0a];
const MAC_B: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0b];
const IP_A: [u8; 4] = [10, 0, 0, 1];
const IP_B: [u8; 4] = [10, 0, 0, 2];

/// Queue sizes as `erdma_probe_dev` programs them.
const CMDQ_DEPTH: u32 = 512; // WQEBBs: 128 commands of 4 WQEBBs
const CMDQ_EQ_DEPTH: u32 = 128;
const AEQ_DEPTH: u32 = 4096;
const CEQ_DEPTH: u32 = 256;
/// CEQs 1..=NCEQS on vectors 1..=NCEQS; vector 0 is the CMDQ EQ + AEQ.
const NCEQS: u32 = 2;
const VECTORS: u32 = NCEQS + 1;

/// MODIFY_QP masks the driver sends on the way to RTS.
const TO_INIT: u32 = qpa::STATE;
const TO_RTR: u32 = qpa::STATE | qpa::AV | qpa::RQ_PSN | qpa::DST_QPN;
const TO_RTS: u32 = qpa::STATE | qpa::SQ_PSN;
const PSN: u32 = 500;
/// Memory-region access bits (RA 1, LR 2, LW 4, RR 8, RW 16).
const ACCESS_ALL: u8 = 0x1e;

fn start(mac: [u8; 6]) -> TestServer<ErdmaDevice> {
    TestServer::start(ErdmaDevice::new(ErdmaConfig::new(mac)), Limits::default())
}

fn counters(s: &TestServer<ErdmaDevice>) -> Counters {
    s.handle.with_device(|d| d.counters())
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// Puts `v` little-endian at `at` (commands, SQEs, RQEs, AVs are LE).
fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// IPv4-mapped GID (erdma has RoCEv2 GIDs only).
fn v4_gid(ip: [u8; 4]) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&ip);
    g
}

/// Valid-entry test of `get_next_valid_cqe` / `get_next_valid_eqe`: the
/// owner bit is 1 on the first pass and flips on every wrap.
fn owner_ok(owner: u32, ci: u32, depth: u32) -> bool {
    owner ^ u32::from(ci & depth != 0) == 1
}

/// A ring in guest memory and the driver's consumer index on it.
#[derive(Debug, Clone, Copy)]
struct Ring {
    addr: u64,
    depth: u32,
    ci: u32,
    dbrec: u64,
}

/// A command completion (CMDQ CQE).
#[derive(Debug, Clone, Copy)]
struct Cmd {
    status: u8,
    r0: u64,
    r1: u64,
    /// Vector-0 interrupts seen while waiting for it.
    irqs: u64,
}

/// A decoded work CQE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Wc {
    opcode: u8,
    qtype: u8,
    syndrome: u8,
    qe_idx: u32,
    qpn: u32,
    size: u32,
}

/// A kernel QP: rings and producer indices.
struct Qp {
    qpn: u32,
    sq: Ring,
    rq: Ring,
    sq_pi: u16,
    rq_pi: u16,
}

/// `struct erdma_av_cfg` (36 bytes), RoCEv2 over IPv4.
struct Av {
    dmac: [u8; 6],
    dip: [u8; 4],
    udp_sport: u16,
    hop_limit: u8,
}

impl Av {
    fn to(dmac: [u8; 6], dip: [u8; 4]) -> Self {
        Av {
            dmac,
            dip,
            udp_sport: 0xc001,
            hop_limit: 64,
        }
    }

    fn write(&self, b: &mut [u8]) {
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
struct Driver {
    c: vfio_user::Client,
    _ram: File,
    mem: MappedMem,
    next: u64,
    /// One eventfd per MSI-X vector the driver uses.
    vectors: Vec<File>,
    aeq: Ring,
    cmd_sq: Ring,
    cmd_pi: u16,
    cmd_cq: Ring,
    cmd_eq: Ring,
    cmdsn: u32,
    /// The CMDQ CQ was armed: completions come with an EQE + vector 0.
    event_mode: bool,
    ceqs: Vec<Ring>,
    cqs: BTreeMap<u32, Ring>,
    /// From QUERY_DEVICE.
    local_dma_key: u32,
}

impl Driver {
    /// Connects, maps guest RAM, turns bus mastering and MSI-X on and
    /// gives every vector the driver uses an eventfd (what QEMU and the PCI
    /// core do before and during `erdma_probe`).
    fn connect(s: &TestServer<ErdmaDevice>) -> Self {
        let mut c = s.client();
        let ram = memfd(RAM + GUARD);
        c.dma_map(0, IOVA, RAM, ram.as_raw_fd()).unwrap();
        assert_eq!(s.handle.dma_regions(), 1);
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
        };
        d.set_vectors();
        d
    }

    /// MSI-X enable in the capability, then one `SET_IRQS` per vector.
    fn set_vectors(&mut self) {
        let mut cfg = [0u8; 256];
        self.c.region_read(CONFIG, 0, &mut cfg).unwrap();
        let mut at = usize::from(cfg[0x34]);
        while at != 0 && cfg[at] != 0x11 {
            at = usize::from(cfg[at + 1]);
        }
        assert_ne!(at, 0, "MSI-X capability");
        let ctl = u16::from_le_bytes([cfg[at + 2], cfg[at + 3]]) | 0x8000;
        self.c
            .region_write(CONFIG, at as u64 + 2, &ctl.to_le_bytes())
            .unwrap();
        for v in 0..VECTORS {
            let ev = eventfd();
            self.c
                .set_irqs(
                    VFIO_PCI_MSIX_IRQ_INDEX,
                    VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER,
                    v,
                    1,
                    &[ev.as_raw_fd()],
                )
                .unwrap();
            self.vectors.push(ev);
        }
    }

    /// Interrupts on `vector` since the last call.
    fn irqs(&self, vector: usize) -> u64 {
        take_events(&self.vectors[vector])
    }

    // ---- guest memory ----

    /// `dma_alloc_coherent`: zeroed, aligned, inside the mapping.
    fn alloc(&mut self, size: u64, align: u64) -> u64 {
        self.mem
            .alloc_zeroed(&mut self.next, IOVA + RAM, size, align)
    }

    fn read(&self, addr: u64, len: usize) -> Vec<u8> {
        self.mem.read(addr, len)
    }

    fn write(&self, addr: u64, data: &[u8]) {
        self.mem.write(addr, data);
    }

    fn ring(&mut self, depth: u32, entry: u64) -> Ring {
        let addr = self.alloc(u64::from(depth) * entry, 4096);
        let dbrec = self.alloc(8, 8);
        Ring {
            addr,
            depth,
            ci: 0,
            dbrec,
        }
    }

    /// The canary after guest RAM is intact.
    fn canary_intact(&self) -> bool {
        self.read(IOVA + RAM, GUARD as usize)
            .iter()
            .all(|&b| b == CANARY)
    }

    // ---- BAR 0 ----

    fn r32(&mut self, o: u64) -> u32 {
        let mut b = [0u8; 4];
        self.c.region_read(BAR0, o, &mut b).unwrap();
        u32::from_le_bytes(b)
    }

    fn w32(&mut self, o: u64, v: u32) {
        self.c.region_write(BAR0, o, &v.to_le_bytes()).unwrap();
    }

    /// `writeq`: one 8-byte region write (doorbells, 64-bit registers).
    fn w64(&mut self, o: u64, v: u64) {
        self.c.region_write(BAR0, o, &v.to_le_bytes()).unwrap();
    }

    /// A 64-bit doorbell, mirrored in its doorbell record first (as the
    /// driver does; the model does not read records).
    fn doorbell(&mut self, o: u64, v: u64, dbrec: u64) {
        self.write(dbrec, &v.to_le_bytes());
        self.w64(o, v);
    }

    fn mac(&mut self) -> [u8; 6] {
        // u64_to_ether_addr(H << 32 | L): byte 5 is bits 7:0.
        let v =
            u64::from(self.r32(off::NETDEV_MAC_L)) | (u64::from(self.r32(off::NETDEV_MAC_H)) << 32);
        std::array::from_fn(|i| (v >> (40 - 8 * i)) as u8)
    }

    // ---- probe ----

    /// `erdma_aeq_init` + `erdma_cmdq_init` + `erdma_wait_hw_init_done`:
    /// program the queues' registers, then CTRL = INIT and poll ST.
    fn init_queues(&mut self) {
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
    fn create_ceqs(&mut self) {
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
    fn enter_event_mode(&mut self) {
        self.arm_cmdq_cq();
        self.event_mode = true;
    }

    fn query_device(&mut self) -> Cmd {
        let c = self.cmd(submod::RDMA, rdma_op::QUERY_DEVICE, &[]);
        if c.status == status::OK {
            self.local_dma_key = (c.r1 >> 32) as u32;
        }
        c
    }

    /// The whole probe up to `erdma_ib_device_add`'s commands.
    fn probe(&mut self) -> Cmd {
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

    fn arm_cmdq_cq(&mut self) {
        let sn = u64::from(self.cmdsn);
        let v = u64::from(self.cmd_cq.ci & 0xff_ffff) | (1 << 31) | ((sn & 3) << 28) | (sn << 56);
        self.doorbell(off::CMDQ_CQDB, v, self.cmd_cq.dbrec);
    }

    /// Writes one 128-byte command (4 WQEBBs) at the SQ producer index and
    /// rings CMDQ_SQDB. Returns the index of its first WQEBB.
    fn post_cmd(&mut self, sub: u8, opcode: u8, req: &[u8]) -> u16 {
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
    fn poll_cmd_cq(&mut self) -> Option<(u8, u32, u64, u64)> {
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
    fn consume_eqes(&self, r: &mut Ring) -> Vec<[u8; 16]> {
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
    fn cmdq_irq_handler(&mut self) -> Option<(u8, u32, u64, u64)> {
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
    /// the device has run the command, so the completion is there at once.
    fn cmd(&mut self, sub: u8, opcode: u8, req: &[u8]) -> Cmd {
        let first = self.post_cmd(sub, opcode, req);
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

    fn rdma(&mut self, opcode: u8, req: &[u8]) -> u8 {
        self.cmd(submod::RDMA, opcode, req).status
    }

    // ---- verbs ----

    fn set_gid(&mut self, idx: u32, ip: [u8; 4]) -> u8 {
        let mut req = [0u8; 28];
        put32(&mut req, 8, idx); // ntype 0 (IPv4), op add
        req[12..28].copy_from_slice(&v4_gid(ip));
        self.rdma(rdma_op::SET_GID, &req)
    }

    /// CREATE_CQ for a kernel CQ whose ring is at `buf` (one 32 MiB
    /// "page", level 0, as `erdma_create_cq` describes a coherent buffer).
    fn create_cq_at(&mut self, cqn: u32, depth: u32, eqn: u32, buf: u64) -> u8 {
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

    fn create_cq(&mut self, cqn: u32, depth: u32, eqn: u32) -> u8 {
        let buf = self.alloc(u64::from(depth) * 32, 4096);
        self.create_cq_at(cqn, depth, eqn, buf)
    }

    /// CREATE_QP for a kernel RC QP with its rings at `sq` / `rq` (each one
    /// 1 MiB "page", level 0), both queues completing on `cqn`.
    fn create_qp_at(&mut self, qpn: u32, cqn: u32, sq: Ring, rq: Ring) -> u8 {
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

    fn create_qp(&mut self, qpn: u32, cqn: u32, sq_depth: u32, rq_depth: u32) -> Qp {
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

    fn modify_qp(&mut self, qpn: u32, state: u8, mask: u32, av: Option<&Av>, dqpn: u32) -> u8 {
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
    fn qp_to_rts(&mut self, qpn: u32, av: &Av, dqpn: u32) {
        assert_eq!(self.modify_qp(qpn, qps::INIT, TO_INIT, None, 0), 0);
        assert_eq!(self.modify_qp(qpn, qps::RTR, TO_RTR, Some(av), dqpn), 0);
        assert_eq!(self.modify_qp(qpn, qps::RTS, TO_RTS, None, 0), 0);
    }

    /// QUERY_QP: (status, SQ PSN, RQ PSN, state).
    fn query_qp(&mut self, qpn: u32) -> (u8, u32, u32, u8) {
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

    fn destroy(&mut self, opcode: u8, n: u32) -> u8 {
        let mut req = [0u8; 12];
        put32(&mut req, 8, n);
        self.rdma(opcode, &req)
    }

    /// REG_MR of a normal MR with 4 KiB pages: level 0 (inline page list)
    /// for up to 4 pages unless `mtt` gives the address of a level-1 table.
    fn reg_mr(&mut self, stag: u32, va: u64, len: u32, pages: &[u64], mtt: Option<u64>) -> u8 {
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
    fn post_send(&mut self, qp: &mut Qp, mut sqe: Vec<u8>) {
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
    fn post_recv(&mut self, qp: &mut Qp, addr: u64, len: u32, key: u32) {
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
    fn arm_cq(&mut self, cqn: u32) {
        let r = self.cqs[&cqn];
        let v = (u64::from(cqn) << 32) | (1 << 31) | u64::from(r.ci & 0xff_ffff);
        self.doorbell(regs::CQDB_SPACE, v, r.dbrec);
    }

    /// `erdma_poll_one_cqe`: the next valid CQE (big-endian words).
    fn poll_cq(&mut self, cqn: u32) -> Option<Wc> {
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
            size: be32(&b, 16),
        })
    }

    /// `erdma_intr_ceq_task`: the CQNs named by new CEQEs on CEQ `n`; the
    /// CEQ is then notified and re-armed.
    fn ceq_events(&mut self, n: u32) -> Vec<u32> {
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
    fn aeq_events(&mut self) -> Vec<(u8, u32)> {
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
fn sqe_hdr(opcode: u8, sges: u8, signaled: bool) -> u64 {
    (u64::from(sges) << 56) | (u64::from(opcode) << 27) | (u64::from(signaled) << 22)
}

/// An RC SEND of `len` bytes from one SGE.
fn send_sqe(len: u32, addr: u64, key: u32) -> Vec<u8> {
    let mut s = vec![0u8; 32];
    put64(&mut s, 0, sqe_hdr(op::SEND, 1, true));
    put32(&mut s, 12, len);
    put64(&mut s, 16, addr);
    put32(&mut s, 24, len);
    put32(&mut s, 28, key);
    s
}

/// The headers of a RoCEv2 (IPv4) frame, read field by field.
#[derive(Debug)]
struct Rocev2<'a> {
    dst: [u8; 6],
    src: [u8; 6],
    ethertype: u16,
    ip_src: [u8; 4],
    ip_dst: [u8; 4],
    ttl: u8,
    ip_checksum_ok: bool,
    udp_sport: u16,
    udp_dport: u16,
    opcode: u8,
    dest_qp: u32,
    ack_req: bool,
    psn: u32,
    /// After the BTH (and any extension header), before pad and ICRC.
    rest: &'a [u8],
}

fn parse_rocev2(f: &[u8]) -> Rocev2<'_> {
    assert!(f.len() >= 14 + 20 + 8 + 12 + 4, "frame too short");
    let ip = &f[14..34];
    assert_eq!(ip[0], 0x45, "IPv4, no options");
    assert_eq!(ip[9], 17, "UDP");
    assert_eq!(
        usize::from(u16::from_be_bytes([ip[2], ip[3]])),
        f.len() - 14,
        "IPv4 total length"
    );
    let sum: u32 = ip
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    let folded = (sum & 0xffff) + (sum >> 16);
    let udp = &f[34..42];
    assert_eq!(
        usize::from(u16::from_be_bytes([udp[4], udp[5]])),
        f.len() - 34,
        "UDP length"
    );
    let bth = &f[42..54];
    let pad = usize::from((bth[1] >> 4) & 3);
    Rocev2 {
        dst: f[0..6].try_into().unwrap(),
        src: f[6..12].try_into().unwrap(),
        ethertype: u16::from_be_bytes([f[12], f[13]]),
        ip_src: ip[12..16].try_into().unwrap(),
        ip_dst: ip[16..20].try_into().unwrap(),
        ttl: ip[8],
        ip_checksum_ok: folded == 0xffff,
        udp_sport: u16::from_be_bytes([udp[0], udp[1]]),
        udp_dport: u16::from_be_bytes([udp[2], udp[3]]),
        opcode: bth[0],
        dest_qp: be32(bth, 4) & 0xff_ffff,
        ack_req: bth[8] & 0x80 != 0,
        psn: be32(bth, 8) & 0xff_ffff,
        rest: &f[54..f.len() - 4 - pad],
    }
}

/// IB BTH opcodes (RC).
const BTH_RC_SEND_ONLY: u8 = 0x04;
const BTH_RC_ACK: u8 = 0x11;

/// Nothing panicked: the server thread runs and no connection was dropped.
fn server_alive(s: &TestServer<ErdmaDevice>) {
    let st = s.handle.stats();
    assert_eq!((st.protocol_panics, st.protocol_errors), (0, 0), "{st:?}");
    assert!(!s.thread.as_ref().unwrap().is_finished());
}

#[test]
fn probe_handshake_and_cmdq_over_vfio_user() {
    let s = start(MAC_A);
    let cfg = ErdmaConfig::new(MAC_A);

    // What lspci and erdma_probe see: IDs, BAR 0 + BAR 2 (64-bit), MSI-X.
    let mut c = s.client();
    let mut cs = [0u8; 64];
    c.region_read(CONFIG, 0, &mut cs).unwrap();
    assert_eq!(u16::from_le_bytes([cs[0], cs[1]]), regs::VENDOR_ID);
    assert_eq!(u16::from_le_bytes([cs[2], cs[3]]), regs::DEVICE_ID);
    assert_eq!(c.region(0).unwrap().size, regs::FUNC_BAR_SIZE);
    assert_eq!(c.region(1).unwrap().size, 0, "upper half of 64-bit BAR 0");
    assert_eq!(c.region(2).unwrap().size, regs::MSIX_BAR_SIZE);
    assert_eq!(cs[0x10] & 0x6, 0x4, "BAR 0 is 64-bit memory");
    let msix = c.get_irq_info(VFIO_PCI_MSIX_IRQ_INDEX).unwrap();
    assert_eq!(msix.count, u32::from(regs::NUM_MSIX_VEC));
    drop(c);
    s.wait_for("first client gone", |st| st.connections == 1);

    let mut d = Driver::connect(&s);
    // erdma_probe_dev's reads.
    assert_eq!(d.r32(off::VERSION), cfg.version);
    assert_eq!(d.r32(off::DEV_PROTO), regs::PROTO_ROCEV2);
    assert_eq!(d.r32(off::DEV_ST), 0);
    assert_eq!(d.mac(), MAC_A, "NETDEV_MAC_H/L");
    // INIT before the queues are programmed is refused (counted).
    d.w32(off::DEV_CTRL, regs::CTRL_INIT);
    assert_eq!(d.r32(off::DEV_ST) & regs::ST_INIT_DONE, 0);
    assert_eq!(counters(&s).init_failures, 1);

    d.init_queues();
    // The registers read back, both halves of the >4 GiB addresses.
    assert_eq!(d.r32(off::CMDQ_SQ_ADDR_H), (d.cmd_sq.addr >> 32) as u32);
    assert_eq!(d.r32(off::CMDQ_SQ_ADDR_L), d.cmd_sq.addr as u32);
    assert_eq!(d.r32(off::CMDQ_EQ_ADDR_H), 1);
    assert_eq!(d.r32(off::CMDQ_DEPTH), CMDQ_DEPTH);
    assert_eq!(d.r32(off::AEQ_DEPTH), AEQ_DEPTH);
    assert_eq!(counters(&s).inits, 1);

    // Poll mode: CREATE_EQ completions are found by polling the CQ, with
    // no EQE and no interrupt.
    d.create_ceqs();
    assert_eq!(d.irqs(0), 0, "no interrupt in poll mode");
    let mut eq = d.cmd_eq;
    assert!(d.consume_eqes(&mut eq).is_empty());
    assert_eq!(counters(&s).ceqs_live, u64::from(NCEQS));

    // Event mode.
    d.enter_event_mode();
    let q = d.query_device();
    assert_eq!(q.status, status::OK);
    assert_eq!(q.irqs, 1, "one vector-0 interrupt per completion");
    assert_eq!(d.cmd_eq.ci, 1, "one CMDQ EQE");
    // cap0/cap1 as erdma_dev_attrs_init decodes them, against the defaults.
    let (c0, c1) = (q.r0, q.r1);
    assert_eq!((c0 >> 48) & 0xf, u64::from(cfg.max_gid_log2), "max GID");
    assert_eq!((c0 >> 40) & 0xff, u64::from(cfg.max_cqe_log2), "max CQE");
    assert_eq!(
        (c0 >> 24) & 0xff,
        0x80 | 0x20 | 0x08,
        "ATOMIC|MTT_VA|EXT_DB"
    );
    assert_eq!((c0 >> 16) & 0xff, u64::from(cfg.max_recv_wr_log2));
    assert_eq!((c0 >> 8) & 0xff, u64::from(cfg.max_ah_log2));
    assert_eq!(c0 & 0xff, u64::from(cfg.max_mr_size_log2));
    assert_eq!((c1 >> 32) as u32, cfg.local_dma_key, "local DMA lkey");
    assert_eq!((c1 >> 28) & 0xf, u64::from(cfg.default_cc));
    assert_eq!((c1 >> 16) & 0xfff, u64::from(cfg.qblocks), "max_qp = 1024");
    assert_eq!(c1 & 0xff, u64::from(cfg.max_mw_log2));
    assert_eq!(q.r1 & 0x0000_0000_0000_ff00, 0, "reserved bits clear");

    let fw = d.cmd(submod::COMMON, common_op::QUERY_FW_INFO, &[]);
    assert_eq!(fw.status, status::OK);
    assert_eq!(fw.r0 as u32, cfg.fw_version);
    assert_eq!(fw.irqs, 1);

    // 520 more commands: the SQ (128 commands) wraps four times, the CQ
    // (512 CQEs) and the EQ (128 EQEs) wrap, so owner bits flip; each
    // completion raises vector 0 exactly once.
    for i in 0..520 {
        let c = d.cmd(submod::COMMON, common_op::QUERY_FW_INFO, &[]);
        assert_eq!(
            (c.status, c.r0 as u32, c.irqs),
            (0, cfg.fw_version, 1),
            "{i}"
        );
    }
    assert!(d.cmd_cq.ci > CMDQ_DEPTH && d.cmd_eq.ci > 4 * CMDQ_EQ_DEPTH);
    let q2 = d.query_device();
    assert_eq!((q2.r0, q2.r1), (q.r0, q.r1));

    let c = counters(&s);
    assert_eq!(c.cmd_common_ok, u64::from(NCEQS) + 521);
    assert_eq!(c.cmd_rdma_ok, 2);
    assert_eq!(c.cmd_common_failed + c.cmd_rdma_failed, 0);
    assert_eq!(c.cmd_cqes_written, u64::from(NCEQS) + 523);
    assert_eq!(c.irqs, 523, "event mode only");
    assert_eq!((c.eq_overflows, c.dma_errors), (0, 0));
    let st = s.handle.stats();
    assert_eq!(st.irqs_fired, 523, "every interrupt reached its eventfd");
    assert_eq!((st.irqs_pending, st.dma_refused), (0, 0));
    assert!(d.canary_intact());
    server_alive(&s);
}

#[test]
fn qp_lifecycle_through_the_command_queue() {
    let s = start(MAC_A);
    let mut d = Driver::connect(&s);
    d.probe();
    assert_eq!(d.set_gid(0, IP_A), status::OK);
    assert_eq!(d.create_cq(1, 256, 1), status::OK, "CREATE_CQ");
    assert_eq!(d.create_cq(1, 256, 1), status::BAD_OBJECT, "CQN taken");
    assert_eq!(d.create_cq(2, 256, 9), status::INVALID, "no CEQ 9");
    let qp = d.create_qp(2, 1, 256, 64);
    assert_eq!(counters(&s).qps_live, 1);

    // RESET, with the PSNs the QP was created with (0).
    assert_eq!(d.query_qp(2), (status::OK, 0, 0, qps::RESET));
    // RESET → RTS skips states: refused, nothing changes.
    assert_eq!(
        d.modify_qp(2, qps::RTS, qpa::STATE, None, 0),
        status::BAD_STATE
    );
    // RTR without an address vector cannot work for RC.
    assert_eq!(d.modify_qp(2, qps::INIT, TO_INIT, None, 0), status::OK);
    assert_eq!(d.query_qp(2).3, qps::INIT);
    assert_eq!(
        d.modify_qp(2, qps::RTR, qpa::STATE, None, 0),
        status::BAD_STATE
    );
    // RTR with a RoCEv2 AV, destination QPN and RQ PSN.
    let av = Av::to(MAC_B, IP_B);
    assert_eq!(d.modify_qp(2, qps::RTR, TO_RTR, Some(&av), 3), status::OK);
    let (st, _, rq_psn, state) = d.query_qp(2);
    assert_eq!((st, rq_psn, state), (status::OK, PSN, qps::RTR));
    assert_eq!(d.modify_qp(2, qps::RTS, TO_RTS, None, 0), status::OK);
    assert_eq!(d.query_qp(2), (status::OK, PSN, PSN, qps::RTS));
    assert_eq!(s.handle.with_device(|dev| dev.qp_state(2)), Some(qps::RTS));
    // A state past ERROR and an attribute bit that does not exist.
    assert_eq!(d.modify_qp(2, 9, qpa::STATE, None, 0), status::INVALID);
    assert_eq!(d.modify_qp(2, qps::RTS, 0x40, None, 0), status::INVALID);

    // Teardown in the driver's order; the CQ is busy while the QP lives.
    assert_eq!(d.destroy(rdma_op::DESTROY_CQ, 1), status::BAD_STATE);
    assert_eq!(d.destroy(rdma_op::DESTROY_QP, qp.qpn), status::OK);
    assert_eq!(d.destroy(rdma_op::DESTROY_QP, qp.qpn), status::BAD_OBJECT);
    assert_eq!(d.query_qp(2).0, status::BAD_OBJECT);
    assert_eq!(d.destroy(rdma_op::DESTROY_CQ, 1), status::OK);
    assert_eq!(d.destroy(rdma_op::DESTROY_CQ, 1), status::BAD_OBJECT);

    let c = counters(&s);
    assert_eq!((c.qps_live, c.cqs_live), (0, 0));
    // Failed: CQN taken, no CEQ, RESET→RTS, RTR w/o AV, state 9, mask,
    // destroy busy CQ, destroy twice, query gone, destroy CQ twice.
    assert_eq!(c.cmd_rdma_failed, 10);
    assert_eq!(c.cmd_malformed, 10);
    assert_eq!(c.dma_errors, 0);
    assert!(d.canary_intact());
    server_alive(&s);
}

/// A probed device with GID 0, CQ 1 on CEQ 1 (armed), and RC QP `qpn`
/// in RTS towards `peer`.
fn rc_side(s: &TestServer<ErdmaDevice>, ip: [u8; 4], qpn: u32, peer: (Av, u32)) -> (Driver, Qp) {
    let mut d = Driver::connect(s);
    d.probe();
    assert_eq!(d.set_gid(0, ip), status::OK);
    assert_eq!(d.create_cq(1, 256, 1), status::OK);
    let qp = d.create_qp(qpn, 1, 256, 64);
    d.qp_to_rts(qpn, &peer.0, peer.1);
    d.arm_cq(1);
    (d, qp)
}

#[test]
fn rc_send_between_two_served_devices() {
    // Two devices, each behind its own server; the test is the fabric,
    // carrying frames from one sink to the other's DeviceHandle::receive.
    let sa = start(MAC_A);
    let sb = start(MAC_B);
    let (mut a, mut qa) = rc_side(&sa, IP_A, 2, (Av::to(MAC_B, IP_B), 3));
    let (mut b, mut qb) = rc_side(&sb, IP_B, 3, (Av::to(MAC_A, IP_A), 2));
    assert_eq!((a.irqs(1), b.irqs(1)), (0, 0), "armed CQs, nothing yet");

    // B posts a receive with the local DMA key (a guest-physical buffer).
    let rbuf = b.alloc(4096, 4096);
    let key = b.local_dma_key;
    b.post_recv(&mut qb, rbuf, 4096, key);
    assert!(sb.frames.lock().unwrap().is_empty());

    // A registers an MR over one page and sends 100 bytes from it.
    let page = a.alloc(4096, 4096);
    const VA: u64 = 0x7000_0000;
    const STAG: u32 = 0x100;
    assert_eq!(a.reg_mr(STAG, VA, 4096, &[page], None), status::OK);
    let msg: Vec<u8> = (0..100u8).map(|i| i.wrapping_mul(7) ^ 0x5a).collect();
    a.write(page + 0x10, &msg);
    a.post_send(&mut qa, send_sqe(100, VA + 0x10, STAG));

    // The SQ doorbell's region write ran the SQ: one frame in A's sink.
    let frames = std::mem::take(&mut *sa.frames.lock().unwrap());
    assert_eq!(frames.len(), 1, "one RoCEv2 frame");
    let send = frames[0].clone();
    let f = parse_rocev2(&send);
    assert_eq!((f.dst, f.src, f.ethertype), (MAC_B, MAC_A, 0x0800));
    assert_eq!((f.ip_src, f.ip_dst, f.ttl), (IP_A, IP_B, 64));
    assert!(f.ip_checksum_ok, "IPv4 header checksum");
    assert_eq!((f.udp_sport, f.udp_dport), (0xc001, 4791));
    assert_eq!(f.opcode, BTH_RC_SEND_ONLY);
    assert_eq!((f.dest_qp, f.psn), (3, PSN));
    assert!(f.ack_req, "last packet of a message asks for an ACK");
    assert_eq!(f.rest, &msg[..], "payload");
    assert!(a.poll_cq(1).is_none(), "no send CQE before the ACK");

    // B takes it (its ICRC check passes), places the data, completes the
    // receive with a CQE + CEQ 1 interrupt, and answers with an ACK.
    sb.handle.receive(&send).unwrap();
    assert_eq!(b.read(rbuf, 100), msg);
    assert_eq!(b.read(rbuf + 100, 4), [0; 4], "nothing past the message");
    assert_eq!(b.irqs(1), 1, "CQ 1 → CEQ 1 → vector 1");
    assert_eq!(b.ceq_events(1), vec![1], "CEQE names CQ 1");
    let wc = b.poll_cq(1).expect("receive CQE");
    assert_eq!(
        wc,
        Wc {
            opcode: op::RECEIVE,
            qtype: 1,
            syndrome: 0,
            qe_idx: 0,
            qpn: 3,
            size: 100,
        }
    );
    assert!(b.poll_cq(1).is_none());
    let acks = std::mem::take(&mut *sb.frames.lock().unwrap());
    assert_eq!(acks.len(), 1, "one ACK");
    let ack = acks[0].clone();
    let f = parse_rocev2(&ack);
    assert_eq!((f.dst, f.src), (MAC_A, MAC_B));
    assert_eq!((f.ip_src, f.ip_dst, f.udp_dport), (IP_B, IP_A, 4791));
    assert_eq!((f.opcode, f.dest_qp, f.psn), (BTH_RC_ACK, 2, PSN));
    assert_eq!(f.rest.len(), 4, "AETH");
    assert_eq!(f.rest[0] >> 5, 0, "AETH syndrome: ACK");

    // The ACK completes A's SEND: CQE on CQ 1 and vector 1.
    sa.handle.receive(&ack).unwrap();
    assert_eq!(a.irqs(1), 1);
    assert_eq!(a.ceq_events(1), vec![1]);
    let wc = a.poll_cq(1).expect("send CQE");
    assert_eq!(
        (wc.opcode, wc.qtype, wc.syndrome, wc.qe_idx, wc.qpn),
        (op::SEND, 0, 0, 0, 2)
    );
    // The driver advances its SQ CI by the WQEBB count of the SQE at qe_idx.
    let hdr = le64(&a.read(qa.sq.addr, 8), 0);
    assert_eq!((hdr >> 52) & 7, 0, "one WQEBB");
    assert!(a.poll_cq(1).is_none());
    assert!(sa.frames.lock().unwrap().is_empty(), "nothing more to send");

    let (ca, cb) = (counters(&sa), counters(&sb));
    assert_eq!((ca.tx_frames, ca.rx_frames, ca.cqes_written), (1, 1, 1));
    assert_eq!((cb.tx_frames, cb.rx_frames, cb.cqes_written), (1, 1, 1));
    assert_eq!(
        (ca.rx_dropped, cb.rx_dropped, cb.rx_drop_bad_icrc),
        (0, 0, 0)
    );
    assert_eq!((ca.wqes_executed, cb.rqes_consumed), (1, 1));
    assert_eq!((ca.dma_errors, cb.dma_errors), (0, 0));
    assert_eq!(
        (sa.handle.stats().frames_out, sb.handle.stats().frames_out),
        (1, 1)
    );
    assert_eq!(a.query_qp(2), (status::OK, PSN + 1, PSN, qps::RTS));
    assert_eq!(b.query_qp(3), (status::OK, PSN, PSN + 1, qps::RTS));
    assert!(a.canary_intact() && b.canary_intact());
    server_alive(&sa);
    server_alive(&sb);
}

#[test]
fn hostile_doorbells_and_commands_get_errors_and_counters() {
    let s = start(MAC_A);
    let mut d = Driver::connect(&s);
    // Doorbells before INIT name nothing.
    d.w64(regs::SDB_SHARED_PAGE_INDEX << 12, (2 << 32) | 1);
    d.w64(off::CMDQ_SQDB, 4);
    assert_eq!(counters(&s).bad_doorbells, 2);

    d.probe();
    assert_eq!(d.set_gid(0, IP_A), status::OK);
    assert_eq!(d.create_cq(1, 64, 1), status::OK);
    let qp = d.create_qp(2, 1, 16, 16);
    assert_eq!(d.modify_qp(2, qps::INIT, TO_INIT, None, 0), status::OK);

    // Doorbells naming objects that do not exist or are out of range.
    let before = counters(&s);
    let sdb = regs::SDB_SHARED_PAGE_INDEX << 12;
    d.w64(sdb, (999 << 32) | 1); // QPN in range, no such QP
    d.w64(sdb, (0xf_ffff << 32) | 1); // QPN past the QPN space
    d.w64(regs::RQDB_SPACE, (0xf_ffff << 32) | 1);
    d.w64(regs::CQDB_SPACE, (0xff_ffff << 32) | (1 << 31)); // CQN past
    d.w64(regs::CQDB_SPACE, (7 << 32) | (1 << 31)); // CQ 7 never made
    d.w64(off::CEQ_DB_BASE + 8 * 30, 1 << 31); // CEQ 30 never made
                                               // Producer indices far past the rings of a live QP.
    d.w64(sdb, (u64::from(qp.qpn) << 32) | 1000);
    d.w64(regs::RQDB_SPACE, (u64::from(qp.qpn) << 32) | 1000);
    // Writes that are no register: the registers page, a 2-byte doorbell,
    // a misaligned 8-byte doorbell, a lone high half of a 64-bit register.
    d.w32(0x800, 1);
    d.c.region_write(BAR0, sdb, &[1, 0]).unwrap();
    d.w64(sdb + 4, 1);
    d.w32(off::CMDQ_SQDB + 4, 0);
    let c = counters(&s);
    assert_eq!(c.bad_doorbells, before.bad_doorbells + 8, "{c:?}");
    assert_eq!(c.bad_bar_writes, before.bad_bar_writes + 4, "{c:?}");
    assert_eq!(c.wqes_executed + c.rqes_consumed, 0);
    assert!(d.poll_cq(1).is_none(), "no CQE for a bogus doorbell");
    assert_eq!(d.irqs(1), 0);

    // Commands the device does not know: UNSUPPORTED, counted.
    let unknown = d.cmd(submod::RDMA, 0x7e, &[]);
    assert_eq!(unknown.status, status::UNSUPPORTED);
    assert_eq!((unknown.r0, unknown.r1), (0, 0));
    assert_eq!(d.cmd(submod::COMMON, 0x33, &[]).status, status::UNSUPPORTED);
    assert_eq!(d.cmd(3, 0, &[]).status, status::UNSUPPORTED, "submodule 3");
    // Known commands with arguments out of range: INVALID / BAD_OBJECT.
    let mut req = [0u8; 12];
    put32(&mut req, 8, 1 << 20); // QPN past the space, in DESTROY_QP
    assert_eq!(d.rdma(rdma_op::DESTROY_QP, &req), status::BAD_OBJECT);
    assert_eq!(
        d.modify_qp(0xf_ffff, qps::INIT, TO_INIT, None, 0),
        status::BAD_OBJECT
    );
    let r = d.ring(16, 32);
    assert_eq!(d.create_qp_at(1024, 1, r, r), status::INVALID, "QPN 1024");
    assert_eq!(d.create_qp_at(3, 77, r, r), status::INVALID, "no CQ 77");
    assert_eq!(d.create_cq(5000, 64, 1), status::INVALID, "CQN past");
    let c2 = counters(&s);
    assert_eq!(c2.cmd_unknown, c.cmd_unknown + 3);
    assert_eq!(c2.cmd_malformed, c.cmd_malformed + 5);
    assert_eq!(c2.qps_live, 1);

    // The queue and the QP still work.
    assert_eq!(d.query_device().status, status::OK);
    assert_eq!(d.query_qp(2), (status::OK, 0, 0, qps::INIT));
    assert!(d.canary_intact());
    server_alive(&s);
}

#[test]
fn hostile_addresses_stay_inside_guest_memory() {
    let s = start(MAC_A);
    let mut d = Driver::connect(&s);
    d.probe();
    assert_eq!(d.set_gid(0, IP_A), status::OK);
    assert_eq!(d.create_cq(1, 64, 1), status::OK);
    let refused = || s.handle.stats().dma_refused;
    let dma_errors = || counters(&s).dma_errors;
    assert_eq!((refused(), dma_errors()), (0, 0));

    // Rings outside the DMA mapping: past its end, in unmapped space below
    // it, straddling its end (the last element is outside).
    assert_eq!(d.create_cq_at(2, 64, 1, IOVA + RAM), status::DMA_ERROR);
    let ok = d.ring(64, 32);
    let past = Ring {
        addr: IOVA + RAM,
        ..ok
    };
    let below = Ring { addr: 0x1000, ..ok };
    let straddle = Ring {
        addr: IOVA + RAM - 4096,
        depth: 256, // 8 KiB from 4 KiB before the end
        ..ok
    };
    assert_eq!(d.create_qp_at(2, 1, past, ok), status::DMA_ERROR, "SQ past");
    assert_eq!(
        d.create_qp_at(2, 1, ok, below),
        status::DMA_ERROR,
        "RQ below"
    );
    assert_eq!(
        d.create_qp_at(2, 1, straddle, ok),
        status::DMA_ERROR,
        "SQ straddles"
    );
    let c = counters(&s);
    assert_eq!((c.qps_live, c.cqs_live), (0, 1));
    assert_eq!(c.dma_errors, 4);

    // REG_MR whose pages or MTT lie outside guest memory.
    let page = d.alloc(4096, 4096);
    assert_eq!(
        d.reg_mr(0x100, 0, 4096, &[IOVA + RAM], None),
        status::DMA_ERROR,
        "level-0 page past memory"
    );
    assert_eq!(
        d.reg_mr(0x200, 0, 8192, &[0, 0], Some(IOVA + RAM)),
        status::DMA_ERROR,
        "level-1 MTT past memory"
    );
    assert_eq!(
        d.reg_mr(0x300, 0, 8192, &[0, 0], Some(IOVA + RAM - 8)),
        status::DMA_ERROR,
        "level-1 MTT straddling the end of memory"
    );
    // GET_STATS into a target past memory.
    let mut req = [0u8; 28];
    put64(&mut req, 16, IOVA + RAM - 8);
    put32(&mut req, 24, 256);
    let st = d.cmd(submod::COMMON, common_op::GET_STATS, &req).status;
    assert_eq!(st, status::DMA_ERROR);
    assert_eq!(counters(&s).mrs_live, 0);

    // A level-1 MR whose second page is past memory registers (REG_MR
    // reads the table, not the pages it names)...
    let table = d.alloc(16, 4096);
    d.write(table, &page.to_le_bytes());
    d.write(table + 8, &(IOVA + RAM).to_le_bytes());
    const VA: u64 = 0x1000_0000;
    assert_eq!(d.reg_mr(0x400, VA, 8192, &[0, 0], Some(table)), status::OK);
    // ...and a SEND reaching into that page fails with an error CQE
    // (local address violation) and puts the QP in ERROR, which flushes the
    // SEND posted after it. Payload is read packet by packet, as hardware
    // does: what the first page holds may have gone out (path MTU 1024: 4
    // packets), nothing from the page past memory.
    let mut qp = d.create_qp(2, 1, 64, 64);
    d.qp_to_rts(2, &Av::to(MAC_B, IP_B), 3);
    d.arm_cq(1);
    let before = refused();
    d.post_send(&mut qp, send_sqe(8192, VA, 0x400));
    d.post_send(&mut qp, send_sqe(8, VA, 0x400));
    assert!(refused() > before, "the edge refused the read past memory");
    let sent = s.frames.lock().unwrap().len();
    assert!(sent <= 4, "{sent} frames sent");
    let wc = d.poll_cq(1).expect("error CQE");
    assert_eq!(
        (wc.opcode, wc.qtype, wc.qpn, wc.qe_idx),
        (op::SEND, 0, 2, 0)
    );
    assert_eq!(wc.syndrome, 11, "send address violation");
    let wc = d.poll_cq(1).expect("flush CQE");
    assert_eq!((wc.syndrome, wc.qe_idx), (15, 1), "flushed");
    assert!(d.poll_cq(1).is_none());
    assert_eq!(d.irqs(1), 1, "CQ interrupt for the error completion");
    assert_eq!(d.query_qp(2).3, qps::ERROR);

    // Every refused access was counted on both sides of the edge, and the
    // bytes right after guest RAM were never written.
    let c = counters(&s);
    assert!(c.dma_errors >= 9, "{c:?}");
    assert!(refused() >= c.dma_errors, "{:?}", s.handle.stats());
    assert!(d.canary_intact(), "no write outside guest memory");
    assert_eq!(d.query_device().status, status::OK);
    server_alive(&s);
}

#[test]
fn doorbell_flood_over_garbage_sqes_keeps_the_server_up() {
    let s = start(MAC_A);
    let mut d = Driver::connect(&s);
    let caps = d.probe();
    assert_eq!(d.set_gid(0, IP_A), status::OK);
    assert_eq!(d.create_cq(1, 64, 1), status::OK);
    let qp = d.create_qp(2, 1, 256, 64);
    d.qp_to_rts(2, &Av::to(MAC_B, IP_B), 3);
    d.arm_cq(1);

    // The whole SQ ring is garbage (xorshift, fixed seed).
    let mut x = 0x1234_5678_9abc_def0u64;
    let mut garbage = vec![0u8; 256 * 32];
    for q in garbage.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        q.copy_from_slice(&x.to_le_bytes());
    }
    d.write(qp.sq.addr, &garbage);

    // 10 000 doorbells: SQ doorbells with wandering producer indices, and
    // every tenth one for a QP that does not exist.
    let before = counters(&s);
    let sdb = regs::SDB_SHARED_PAGE_INDEX << 12;
    for i in 0..10_000u64 {
        let v = if i % 10 == 9 {
            (500 << 32) | i
        } else {
            (u64::from(qp.qpn) << 32) | (i * 37 % 200)
        };
        d.w64(sdb, v);
    }
    let c = counters(&s);
    assert_eq!(c.doorbells, before.doorbells + 10_000, "each one counted");
    assert!(c.bad_doorbells >= before.bad_doorbells + 1000, "{c:?}");
    assert!(c.bad_wqes >= 1, "garbage SQEs refused: {c:?}");
    assert_eq!(d.query_qp(2).3, qps::ERROR, "a bad SQE errors the QP");
    // The CQ holds what the driver needs to recover: one error completion
    // for the first garbage SQE, then a FLUSH completion for every SQE the
    // wandering doorbells exposed after it, all naming QP 2.
    let wcs: Vec<Wc> = std::iter::from_fn(|| d.poll_cq(1)).collect();
    assert_eq!(wcs.len() as u64, c.cqes_written, "{c:?}");
    assert_eq!(c.cq_overruns, 0);
    assert!(![0, 15].contains(&wcs[0].syndrome), "{:?}", wcs[0]);
    assert!(wcs[1..].iter().all(|w| w.syndrome == 15), "{wcs:?}");
    assert!(wcs.iter().all(|w| (w.qpn, w.qtype) == (2, 0)));
    assert_eq!(c.wqes_flushed, wcs.len() as u64 - 1);
    assert_eq!(d.aeq_events().len() as u64, c.async_events);

    // Still the same device behind a working queue.
    let q = d.query_device();
    assert_eq!((q.status, q.r0, q.r1), (status::OK, caps.r0, caps.r1));
    assert!(d.canary_intact());
    server_alive(&s);
}

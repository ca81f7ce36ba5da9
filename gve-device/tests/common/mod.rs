//! A test "driver" that plays gve's part against the model, step by step as
//! `gve_main.c` / `gve_adminq.c` / `gve_{tx,rx}_dqo.c` do it.

#![allow(dead_code)]

pub mod xorshift;

use std::time::{Duration, Instant};

use gve_device::adminq::{opcode, status};
use gve_device::{layout, regs, GveConfig, GveDevice};
use pci_model::fault::{FaultError, FaultSpec};
use pci_model::{DeviceIo, Dma, PciDevice, RxRefusal, TraceRecord, VecMemory};

pub const MEM_BASE: u64 = 0x1_0000_0000;
pub const MEM_SIZE: usize = 8 << 20;

/// Options the driver found in DESCRIBE_DEVICE.
#[derive(Debug, Default, Clone)]
pub struct Described {
    pub mtu: u16,
    pub mac: [u8; 6],
    pub tx_ring: u16,
    pub rx_ring: u16,
    pub counters: u16,
    pub dqo_rda_features: Option<u32>,
    pub buffer_sizes: Option<(u16, u16)>,
    pub modify_ring: Option<[u16; 4]>,
    pub max_flow_rules: Option<u32>,
    pub rss: Option<(u16, u16)>,
    /// The NIC timestamp option, taken (`priv->nic_timestamp_supported`).
    pub nic_timestamp: bool,
}

pub struct TxRing {
    pub ring: u64,
    pub compl: u64,
    pub res: u64,
    pub size: u32,
    pub tail: u32,
    pub compl_head: u32,
    pub cur_gen: bool,
    pub db: u32,
}

pub struct RxRing {
    pub compl: u64,
    pub bufq: u64,
    pub res: u64,
    pub hdr_bufs: u64,
    pub data: u64,
    pub size: u32,
    pub buf_len: u32,
    pub hdr_len: u32,
    pub tail: u32,
    pub compl_head: u32,
    pub cur_gen: bool,
    pub db: u32,
    pub next_buf_id: u16,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RxCompl {
    pub ptype: u16,
    pub packet_len: u16,
    pub header_len: u16,
    pub split_header: bool,
    pub eop: bool,
    pub hbo: bool,
    pub l3_l4_processed: bool,
    pub csum_ip_err: bool,
    pub csum_l4_err: bool,
    pub rx_error: bool,
    pub buf_id: u16,
    pub hash: u32,
    /// HW-GRO: the frame is coalesced; `rsc_seg_len` its segment size.
    pub rsc: bool,
    pub rsc_seg_len: u16,
    /// `ts` when `ts_sub_nsecs_low` has `GVE_DQO_RX_HWTSTAMP_VALID`.
    pub ts: Option<u32>,
}

pub struct Guest {
    pub mem: VecMemory,
    pub dev: GveDevice,
    pub next: u64,
    pub irqs: Vec<u16>,
    pub wire: Vec<Vec<u8>>,
    pub prod: u32,
    pub adminq: u64,
    pub described: Described,
    pub num_ntfy: u32,
    pub irq_db: Vec<u32>,
    pub ptype_map: Vec<u8>,
    pub tx: Vec<TxRing>,
    pub rx: Vec<RxRing>,
    /// What the edge says in `DeviceIo::tx_paused` (its receivers full).
    pub tx_paused: bool,
    /// The edge's clock (`DeviceIo::now`): moves only when a test says.
    pub now: Instant,
    /// The edge's epoch (`DeviceIo::epoch`): device time is `now - epoch`.
    pub epoch: Instant,
    /// A device trace runs (`DeviceIo::tracing`).
    pub tracing: bool,
    /// The records the device wrote while tracing.
    pub trace: Vec<TraceRecord>,
}

pub fn be16(b: &[u8], o: usize) -> u16 {
    u16::from_be_bytes([b[o], b[o + 1]])
}
pub fn be32(b: &[u8], o: usize) -> u32 {
    u32::from_be_bytes(b[o..o + 4].try_into().unwrap())
}

impl Guest {
    pub fn new(cfg: GveConfig) -> Self {
        let epoch = Instant::now();
        Guest {
            mem: VecMemory::new(MEM_BASE, MEM_SIZE),
            dev: GveDevice::new(cfg),
            next: MEM_BASE + 0x1000,
            irqs: Vec::new(),
            wire: Vec::new(),
            prod: 0,
            adminq: 0,
            described: Described::default(),
            num_ntfy: 0,
            irq_db: Vec::new(),
            ptype_map: Vec::new(),
            tx: Vec::new(),
            rx: Vec::new(),
            tx_paused: false,
            now: epoch,
            epoch,
            tracing: false,
            trace: Vec::new(),
        }
    }

    fn with_io<T>(&mut self, f: impl FnOnce(&mut GveDevice, &mut DeviceIo<'_>) -> T) -> T {
        let mem = self.mem.clone();
        let mut io = DeviceIo::new(&mem, self.now);
        io.epoch = self.epoch;
        io.tx_paused = self.tx_paused;
        io.tracing = self.tracing;
        let r = f(&mut self.dev, &mut io);
        self.irqs.extend(io.irqs);
        self.wire.extend(io.tx);
        self.trace.extend(io.trace);
        r
    }

    /// The edge's `ctl device-fault add`.
    pub fn add_fault(&mut self, id: u32, spec: &FaultSpec) -> Result<(), FaultError> {
        self.with_io(|d, io| d.add_fault(id, spec, io))
    }

    /// The edge's `ctl device-fault clear`.
    pub fn clear_faults(&mut self, id: Option<u32>) -> Result<(), FaultError> {
        self.with_io(|d, io| d.clear_faults(id, io))
    }

    /// The edge's `ctl link`.
    pub fn set_link(&mut self, up: bool) -> bool {
        self.with_io(|d, io| d.set_link(up, io))
    }

    pub fn bar_write(&mut self, bar: u8, off: u64, data: &[u8]) {
        self.with_io(|d, io| {
            d.bar_write(bar, off, data, io);
            d.poll(io);
        });
    }

    pub fn bar_read(&mut self, bar: u8, off: u64, len: usize) -> Vec<u8> {
        let mut b = vec![0; len];
        self.with_io(|d, io| d.bar_read(bar, off, &mut b, io));
        b
    }

    /// `iowrite32(val, &db_bar2[index])`.
    pub fn doorbell(&mut self, index: u32, val: u32) {
        self.bar_write(
            layout::BAR_DOORBELLS,
            u64::from(index) * 4,
            &val.to_le_bytes(),
        );
    }

    /// The edge's poll (after a TX pause ends, or at a timer).
    pub fn poll(&mut self) {
        self.with_io(|d, io| d.poll(io));
    }

    /// Time passes by `d` (no poll).
    pub fn advance(&mut self, d: Duration) {
        self.now += d;
    }

    /// The edge's timer when it is due now: polls if the device asked
    /// for a poll by now (`next_timeout`).
    pub fn run_timers_due(&mut self) {
        if self
            .dev
            .next_timeout(self.now)
            .is_some_and(|at| at <= self.now)
        {
            self.poll();
        }
    }

    /// The edge's timer: if the device asked for a poll
    /// (`next_timeout`), the clock moves there and it polls.
    pub fn run_timers(&mut self) {
        if let Some(at) = self.dev.next_timeout(self.now) {
            self.now = self.now.max(at);
            self.poll();
        }
    }

    /// A frame from the fabric, parsed once here as the edge does.
    pub fn receive(&mut self, frame: &[u8]) -> Result<(), RxRefusal> {
        let view = wire::parse(frame);
        self.with_io(|d, io| d.receive(frame, &view, io))
    }

    /// A TSO frame of `mss`-byte segments, offered whole as the pump does.
    pub fn receive_tso(&mut self, frame: &[u8], mss: u16) -> Result<(), RxRefusal> {
        let view = wire::parse(frame);
        self.with_io(|d, io| {
            let r = d.receive_tso(frame, &view, mss, io);
            d.poll(io);
            r
        })
    }

    /// The queue the device steers `frame` to now.
    pub fn rx_queue(&self, frame: &[u8]) -> usize {
        self.dev.rx_queue(frame, &wire::parse(frame))
    }

    /// Frames handed over as one burst, as the daemon's pump does.
    pub fn receive_burst(&mut self, frames: &[Vec<u8>]) -> Vec<Result<(), RxRefusal>> {
        self.with_io(|d, io| {
            d.begin_rx_burst();
            let r = frames
                .iter()
                .map(|f| d.receive(f, &wire::parse(f), io))
                .collect();
            d.end_rx_burst(io);
            d.poll(io);
            r
        })
    }

    /// The frame the driver builds from completions `c` (one packet, up to
    /// its `end_of_packet`): the header buffer (with header split) then the
    /// data buffers, as `gve_rx_dqo` chains them.
    pub fn assemble(&self, q: usize, c: &[RxCompl]) -> Vec<u8> {
        let mut f = Vec::new();
        for (i, d) in c.iter().enumerate() {
            if i == 0 && d.split_header && d.header_len > 0 {
                f.extend(self.read(self.hdr_addr(q, d.buf_id), usize::from(d.header_len)));
            }
            f.extend(self.read(self.buf_addr(q, d.buf_id), usize::from(d.packet_len)));
        }
        f
    }

    /// The completions of queue `q` as the driver groups them: one list per
    /// packet (up to `end_of_packet`).
    pub fn packets(&mut self, q: usize) -> Vec<Vec<RxCompl>> {
        let mut out = vec![];
        let mut cur = vec![];
        for c in self.rx_completions(q) {
            let eop = c.eop;
            cur.push(c);
            if eop {
                out.push(std::mem::take(&mut cur));
            }
        }
        assert!(cur.is_empty(), "a packet without end_of_packet");
        out
    }

    pub fn probe(&mut self) {
        for b in b"GVE-1.0.0\n" {
            self.bar_write(layout::BAR_REGS, regs::DRIVER_VERSION, &[*b]);
        }
        assert_eq!(
            self.reg_r32(regs::MAX_TX_QUEUES),
            self.dev.config().max_tx_queues
        );
        assert_eq!(
            self.reg_r32(regs::MAX_RX_QUEUES),
            self.dev.config().max_rx_queues
        );
        self.adminq_setup();
        // gve_verify_driver_compatibility
        let st = self.verify_driver_compatibility();
        assert!(st == status::PASSED || st == status::UNIMPLEMENTED);
        self.describe();
        let vectors = u32::from(self.dev.msix().unwrap().vectors);
        assert!(vectors >= 3, "GVE_MIN_MSIX");
        self.num_ntfy = (vectors - 1) & !1;
        self.configure_resources();
        self.get_ptype_map();
        if self.described.rss.is_none() {
            // gve_init_rss_config with the driver's cached config.
            let key: Vec<u8> = (0..40u8)
                .map(|i| i.wrapping_mul(37).wrapping_add(11))
                .collect();
            let nq = self.dev.config().max_rx_queues;
            let lut: Vec<u32> = (0..128).map(|i| i % nq).collect();
            assert_eq!(
                self.configure_rss(Some(&key), Some(&lut), 0x00d2),
                status::PASSED
            );
        }
        let report = self.alloc(4096, 64);
        let st = self.adminq_cmd(cmd(
            opcode::REPORT_STATS,
            &[
                &4096u64.to_be_bytes()[..],
                &report.to_be_bytes(),
                &20000u64.to_be_bytes(),
            ]
            .concat(),
        ));
        assert_eq!(st, status::PASSED);
    }

    pub fn describe(&mut self) {
        let desc = self.alloc(4096, 64);
        let st = self.adminq_cmd(describe_cmd(desc, 1, 4096));
        assert_eq!(st, status::PASSED);
        let d = self.read(desc, 4096);
        let mut out = Described {
            tx_ring: be16(&d, 10),
            rx_ring: be16(&d, 12),
            mtu: be16(&d, 16),
            counters: be16(&d, 18),
            ..Default::default()
        };
        out.mac.copy_from_slice(&d[24..30]);
        let num = be16(&d, 30);
        let total = usize::from(be16(&d, 32));
        // gve_process_device_options
        let mut at = 40usize;
        for _ in 0..num {
            let id = be16(&d, at);
            let len = usize::from(be16(&d, at + 2));
            let req = be32(&d, at + 4);
            let body = at + 8;
            assert!(body + len <= total, "options exceed total_length");
            assert_eq!(req, 0, "required_features_mask must be 0");
            match id {
                0x4 if len >= 8 => out.dqo_rda_features = Some(be32(&d, body)),
                0xa if len >= 8 => {
                    out.buffer_sizes = Some((be16(&d, body + 4), be16(&d, body + 6)))
                }
                0x6 if len >= 8 => {
                    out.modify_ring = Some([
                        be16(&d, body + 4),
                        be16(&d, body + 6),
                        be16(&d, body + 8),
                        be16(&d, body + 10),
                    ])
                }
                0xb if len >= 12 => out.max_flow_rules = Some(be32(&d, body + 8)),
                0xe if len >= 8 => out.rss = Some((be16(&d, body + 4), be16(&d, body + 6))),
                0xd if len >= 4 => out.nic_timestamp = true,
                _ => {}
            }
            at = body + len;
        }
        // gve_enable_supported_features: only with the DQO RDA mask bits.
        let f = out.dqo_rda_features.expect("DQO RDA option");
        if f & (1 << 4) == 0 {
            out.buffer_sizes = None;
        }
        if f & (1 << 5) == 0 {
            out.max_flow_rules = None;
        }
        if f & (1 << 7) == 0 {
            out.rss = None;
        }
        if f & (1 << 8) == 0 {
            out.nic_timestamp = false;
        }
        self.described = out;
    }

    pub fn configure_resources(&mut self) {
        let counters = self.alloc(u64::from(self.described.counters) * 4, 64);
        let irq_db = self.alloc(u64::from(self.num_ntfy) * 64, 64);
        let mut p = Vec::new();
        p.extend_from_slice(&counters.to_be_bytes());
        p.extend_from_slice(&irq_db.to_be_bytes());
        p.extend_from_slice(&u32::from(self.described.counters).to_be_bytes());
        p.extend_from_slice(&self.num_ntfy.to_be_bytes());
        p.extend_from_slice(&64u32.to_be_bytes());
        p.extend_from_slice(&0u32.to_be_bytes());
        p.push(3); // GVE_DQO_RDA_FORMAT
        assert_eq!(
            self.adminq_cmd(cmd(opcode::CONFIGURE_DEVICE_RESOURCES, &p)),
            status::PASSED
        );
        self.irq_db = (0..self.num_ntfy)
            .map(|i| be32(&self.read(irq_db + u64::from(i) * 64, 4), 0))
            .collect();
    }

    pub fn get_ptype_map(&mut self) {
        self.ptype_map = self.ptype_map_cmd();
    }

    pub fn configure_rss(&mut self, key: Option<&[u8]>, lut: Option<&[u32]>, types: u16) -> u32 {
        let key_addr = key.map_or(0, |k| {
            let a = self.alloc(k.len() as u64, 64);
            self.write(a, k);
            a
        });
        let lut_addr = lut.map_or(0, |l| {
            let a = self.alloc(l.len() as u64 * 4, 64);
            let raw: Vec<u8> = l.iter().flat_map(|v| v.to_be_bytes()).collect();
            self.write(a, &raw);
            a
        });
        let mut p = Vec::new();
        p.extend_from_slice(&types.to_be_bytes());
        p.push(1); // ETH_RSS_HASH_TOP
        p.push(0);
        p.extend_from_slice(&(key.map_or(0, |k| k.len()) as u16).to_be_bytes());
        p.extend_from_slice(&(lut.map_or(0, |l| l.len()) as u16).to_be_bytes());
        p.extend_from_slice(&key_addr.to_be_bytes());
        p.extend_from_slice(&lut_addr.to_be_bytes());
        self.adminq_cmd(cmd(opcode::CONFIGURE_RSS, &p))
    }

    pub fn tx_ntfy(&self, q: u32) -> u32 {
        q
    }

    pub fn rx_ntfy(&self, q: u32) -> u32 {
        self.num_ntfy / 2 + q
    }

    /// gve_open: allocate rings, create queues, post buffers, turn up.
    pub fn open(&mut self, nq: u32, ring: u32, buf_len: u32, hsplit: bool) {
        let mut cmds = Vec::new();
        for q in 0..nq {
            let r = self.alloc_tx_ring(ring);
            cmds.push(create_tx_cmd(q, &r, self.tx_ntfy(q)));
            self.tx.push(r);
        }
        assert!(self
            .adminq_batch(&cmds)
            .iter()
            .all(|&s| s == status::PASSED));
        for r in &mut self.tx {
            let res = {
                let mut b = [0u8; 4];
                self.mem.read(r.res, &mut b).unwrap();
                b
            };
            r.db = u32::from_be_bytes(res);
        }
        let hdr_len = if hsplit {
            u32::from(self.described.buffer_sizes.unwrap().1)
        } else {
            0
        };
        let mut cmds = Vec::new();
        for q in 0..nq {
            let r = self.alloc_rx_ring(ring, buf_len, hdr_len);
            cmds.push(create_rx_cmd(q, &r, self.rx_ntfy(q)));
            self.rx.push(r);
        }
        assert!(self
            .adminq_batch(&cmds)
            .iter()
            .all(|&s| s == status::PASSED));
        for q in 0..nq as usize {
            let db = be32(&self.read(self.rx[q].res, 4), 0);
            self.rx[q].db = db;
            self.post_buffers(q, ring - 1);
        }
        // gve_turnup: arm every block with its ITR.
        for q in 0..nq {
            let b = self.irq_db[self.tx_ntfy(q) as usize];
            self.doorbell(b, 1 | ((50 / 2) << 5));
            let b = self.irq_db[self.rx_ntfy(q) as usize];
            self.doorbell(b, 1 | ((20 / 2) << 5));
        }
    }

    /// gve_close as `gve_adjust_config` runs it for `ethtool -L` / `-G`:
    /// destroy every TX queue (one kick), then every RX queue (one kick);
    /// the rings are freed, so a later `open` allocates new ones, with the
    /// new count and size.
    pub fn close(&mut self) {
        let tx: Vec<_> = (0..self.tx.len() as u32)
            .map(|q| cmd(opcode::DESTROY_TX_QUEUE, &q.to_be_bytes()))
            .collect();
        assert!(self.adminq_batch(&tx).iter().all(|&s| s == status::PASSED));
        let rx: Vec<_> = (0..self.rx.len() as u32)
            .map(|q| cmd(opcode::DESTROY_RX_QUEUE, &q.to_be_bytes()))
            .collect();
        assert!(self.adminq_batch(&rx).iter().all(|&s| s == status::PASSED));
        self.tx.clear();
        self.rx.clear();
    }

    pub fn buf_addr(&self, q: usize, id: u16) -> u64 {
        self.rx[q].data + u64::from(id) * u64::from(self.rx[q].buf_len)
    }

    pub fn hdr_addr(&self, q: usize, id: u16) -> u64 {
        self.rx[q].hdr_bufs + u64::from(id) * u64::from(self.rx[q].hdr_len)
    }

    /// gve_rx_post_buffers_dqo (doorbell every 32 and at the end).
    pub fn post_buffers(&mut self, q: usize, n: u32) {
        for _ in 0..n {
            let r = &self.rx[q];
            let id = r.next_buf_id;
            let mut d = [0u8; 32];
            d[0..2].copy_from_slice(&id.to_le_bytes());
            d[8..16].copy_from_slice(&self.buf_addr(q, id).to_le_bytes());
            if r.hdr_len != 0 {
                d[16..24].copy_from_slice(&self.hdr_addr(q, id).to_le_bytes());
            }
            self.write(r.bufq + u64::from(r.tail) * 32, &d);
            let r = &mut self.rx[q];
            r.next_buf_id = ((u32::from(id) + 1) % r.size) as u16;
            r.tail = (r.tail + 1) & (r.size - 1);
            if r.tail % 32 == 0 {
                let (db, t) = (r.db, r.tail);
                self.doorbell(db, t);
            }
        }
        let (db, t) = (self.rx[q].db, self.rx[q].tail);
        self.doorbell(db, t);
    }

    /// Reads new RX completions (generation != cur_gen).
    pub fn rx_completions(&mut self, q: usize) -> Vec<RxCompl> {
        let mut out = Vec::new();
        loop {
            let r = &self.rx[q];
            let d = self.read(r.compl + u64::from(r.compl_head) * 32, 32);
            let w = u16::from_le_bytes([d[4], d[5]]);
            let gen = w & (1 << 14) != 0;
            if gen == r.cur_gen {
                break;
            }
            let h = u16::from_le_bytes([d[6], d[7]]);
            let t = u16::from_le_bytes([d[2], d[3]]);
            out.push(RxCompl {
                ptype: t & 0x3ff,
                packet_len: w & 0x3fff,
                header_len: h & 0x3ff,
                split_header: h & (1 << 11) != 0,
                eop: d[8] & 2 != 0,
                hbo: d[8] & 4 != 0,
                l3_l4_processed: d[8] & 8 != 0,
                csum_ip_err: d[8] & 16 != 0,
                csum_l4_err: d[8] & 32 != 0,
                rx_error: d[1] & 4 != 0,
                buf_id: u16::from_le_bytes([d[12], d[13]]),
                hash: u32::from_le_bytes(d[16..20].try_into().unwrap()),
                rsc: h & (1 << 10) != 0,
                rsc_seg_len: u16::from_le_bytes([d[14], d[15]]),
                ts: (d[11] & 1 != 0).then(|| u32::from_le_bytes(d[28..32].try_into().unwrap())),
            });
            let r = &mut self.rx[q];
            r.compl_head = (r.compl_head + 1) & (r.size - 1);
            if r.compl_head == 0 {
                r.cur_gen = !r.cur_gen;
            }
        }
        out
    }

    /// Writes a packet's descriptors (gve_tx_add_skb_dqo) and rings the
    /// doorbell. `tso`: (mss, header_len).
    pub fn send(
        &mut self,
        q: usize,
        frags: &[&[u8]],
        tso: Option<(u32, u32)>,
        csum: bool,
        tag: u16,
        report_event: bool,
    ) {
        let total: usize = frags.iter().map(|f| f.len()).sum();
        let mut idx = self.tx[q].tail;
        let mask = self.tx[q].size - 1;
        let ring = self.tx[q].ring;
        if let Some((mss, hl)) = tso {
            let mut d = [0u8; 16];
            let tl = (total as u32 - hl) & 0xff_ffff;
            d[0..4].copy_from_slice(&tl.to_le_bytes());
            d[4..6].copy_from_slice(&(mss as u16).to_le_bytes());
            d[6] = hl as u8;
            d[8] = 0x5 | 0x20;
            self.write(ring + u64::from(idx) * 16, &d);
            idx = (idx + 1) & mask;
        }
        let mut g = [0u8; 16];
        g[8] = 0x4;
        self.write(ring + u64::from(idx) * 16, &g);
        idx = (idx + 1) & mask;
        for (i, f) in frags.iter().enumerate() {
            let buf = self.alloc(f.len().max(1) as u64, 64);
            self.write(buf, f);
            let eop = i + 1 == frags.len();
            let d = tx_pkt_desc(buf, f.len() as u16, tag, eop, csum, eop && report_event);
            self.write(ring + u64::from(idx) * 16, &d);
            idx = (idx + 1) & mask;
        }
        self.tx[q].tail = idx;
        let db = self.tx[q].db;
        self.doorbell(db, idx);
    }

    /// Reads new TX completions: (type, tag or head, queue id).
    pub fn tx_completions(&mut self, q: usize) -> Vec<(u16, u16, u16)> {
        let mut out = Vec::new();
        loop {
            let r = &self.tx[q];
            let d = self.read(r.compl + u64::from(r.compl_head) * 8, 8);
            let w = u16::from_le_bytes([d[0], d[1]]);
            if (w >> 15 != 0) == r.cur_gen {
                break;
            }
            out.push(((w >> 11) & 7, u16::from_le_bytes([d[2], d[3]]), w & 0x7ff));
            let r = &mut self.tx[q];
            r.compl_head = (r.compl_head + 1) & (r.size - 1);
            if r.compl_head == 0 {
                r.cur_gen = !r.cur_gen;
            }
        }
        out
    }
}

/// The driver steps that need only guest memory and BAR0, shared by this
/// in-process driver ([`Guest`]) and the one over the vfio-user edge
/// (vfio-user-server/tests/gve_over_vfio_user.rs, which includes this file).
pub trait GveDriver {
    /// `dma_alloc_coherent`: zeroed, aligned.
    fn alloc(&mut self, size: u64, align: u64) -> u64;
    fn read(&self, addr: u64, len: usize) -> Vec<u8>;
    fn write(&self, addr: u64, data: &[u8]);
    /// A write of `data` to BAR0 at `off`.
    fn reg_write(&mut self, off: u64, data: &[u8]);
    /// `ioread32be` of a BAR0 register.
    fn reg_r32(&mut self, off: u64) -> u32;
    /// The admin queue's base and producer count.
    fn adminq_state(&mut self) -> (&mut u64, &mut u32);

    /// `iowrite32be` to a BAR0 register.
    fn reg_w32(&mut self, off: u64, v: u32) {
        self.reg_write(off, &v.to_be_bytes());
    }

    /// `gve_adminq_alloc` (revision 1) with the ring at `base`.
    fn adminq_setup_at(&mut self, base: u64) {
        let (adminq, prod) = self.adminq_state();
        (*adminq, *prod) = (base, 0);
        self.reg_write(regs::ADMINQ_LENGTH, &4096u16.to_be_bytes());
        self.reg_w32(regs::ADMINQ_BASE_HI, (base >> 32) as u32);
        self.reg_w32(regs::ADMINQ_BASE_LO, base as u32);
        self.reg_w32(regs::DRIVER_STATUS, regs::driver_status::RUN);
    }

    /// `gve_adminq_alloc` for revision 1.
    fn adminq_setup(&mut self) {
        let base = self.alloc(4096, 4096);
        self.adminq_setup_at(base);
    }

    /// Issues commands (`gve_adminq_issue_cmd` each), then kick and wait;
    /// checks the event counter caught up and returns every status.
    fn adminq_batch(&mut self, cmds: &[[u8; 64]]) -> Vec<u32> {
        let (adminq, first) = {
            let (a, p) = self.adminq_state();
            (*a, *p)
        };
        let mut prod = first;
        for c in cmds {
            self.write(adminq + u64::from(prod % 64) * 64, c);
            prod = prod.wrapping_add(1);
        }
        *self.adminq_state().1 = prod;
        self.reg_w32(regs::ADMINQ_DOORBELL, prod);
        assert_eq!(
            self.reg_r32(regs::ADMINQ_EVENT_COUNTER),
            prod,
            "event counter must reach the producer count"
        );
        (first..prod)
            .map(|i| be32(&self.read(adminq + u64::from(i % 64) * 64, 8), 4))
            .collect()
    }

    fn adminq_cmd(&mut self, c: [u8; 64]) -> u32 {
        self.adminq_batch(&[c])[0]
    }

    /// `gve_verify_driver_compatibility`; returns its status.
    fn verify_driver_compatibility(&mut self) -> u32 {
        let info = self.alloc(304, 64);
        self.write(info, &[1, 1, 0, 0]);
        self.adminq_cmd(cmd(
            opcode::VERIFY_DRIVER_COMPATIBILITY,
            &[&304u64.to_be_bytes()[..], &info.to_be_bytes()].concat(),
        ))
    }

    /// A TX ring of `size` descriptors with its completion ring and
    /// resources, in fresh memory.
    fn alloc_tx_ring(&mut self, size: u32) -> TxRing {
        TxRing {
            ring: self.alloc(u64::from(size) * 16, 4096),
            compl: self.alloc(u64::from(size) * 8, 4096),
            res: self.alloc(64, 64),
            size,
            tail: 0,
            compl_head: 0,
            cur_gen: false,
            db: 0,
        }
    }

    /// An RX ring of `size` buffers of `buf_len` bytes, with `hdr_len`-byte
    /// header buffers (none without header split, `hdr_len` 0), in fresh
    /// memory.
    fn alloc_rx_ring(&mut self, size: u32, buf_len: u32, hdr_len: u32) -> RxRing {
        RxRing {
            compl: self.alloc(u64::from(size) * 32, 4096),
            bufq: self.alloc(u64::from(size) * 32, 4096),
            res: self.alloc(64, 64),
            hdr_bufs: if hdr_len > 0 {
                self.alloc(u64::from(size) * u64::from(hdr_len), 64)
            } else {
                0
            },
            data: self.alloc(u64::from(size) * u64::from(buf_len), 4096),
            size,
            buf_len,
            hdr_len,
            tail: 0,
            compl_head: 0,
            cur_gen: false,
            db: 0,
            next_buf_id: 0,
        }
    }

    /// GET_PTYPE_MAP, which must pass; returns the map.
    fn ptype_map_cmd(&mut self) -> Vec<u8> {
        let map = self.alloc(2048, 64);
        let st = self.adminq_cmd(cmd(
            opcode::GET_PTYPE_MAP,
            &[&2048u64.to_be_bytes()[..], &map.to_be_bytes()].concat(),
        ));
        assert_eq!(st, status::PASSED);
        self.read(map, 2048)
    }
}

impl GveDriver for Guest {
    /// `dma_alloc_coherent`: zeroed, aligned.
    fn alloc(&mut self, size: u64, align: u64) -> u64 {
        let a = self.next.div_ceil(align) * align;
        self.next = a + size;
        assert!(
            self.next <= MEM_BASE + MEM_SIZE as u64,
            "guest memory exhausted"
        );
        self.mem.write(a, &vec![0; size as usize]).unwrap();
        a
    }

    fn read(&self, addr: u64, len: usize) -> Vec<u8> {
        let mut b = vec![0; len];
        self.mem.read(addr, &mut b).unwrap();
        b
    }

    fn write(&self, addr: u64, data: &[u8]) {
        self.mem.write(addr, data).unwrap();
    }

    fn reg_write(&mut self, off: u64, data: &[u8]) {
        self.bar_write(layout::BAR_REGS, off, data);
    }

    fn reg_r32(&mut self, off: u64) -> u32 {
        be32(&self.bar_read(layout::BAR_REGS, off, 4), 0)
    }

    fn adminq_state(&mut self) -> (&mut u64, &mut u32) {
        (&mut self.adminq, &mut self.prod)
    }
}

/// A 64-byte admin command.
pub fn cmd(op: u32, payload: &[u8]) -> [u8; 64] {
    let mut c = [0u8; 64];
    c[0..4].copy_from_slice(&op.to_be_bytes());
    c[8..8 + payload.len()].copy_from_slice(payload);
    c
}

/// An `EXTENDED_COMMAND` flow-rule command (`op` 0 add, 1 delete, 2
/// reset) at `loc`: TCPv4 to `dst`/32 (and, with `dport`, exactly that port)
/// steered to `queue`.
pub fn flow_rule_cmd(
    g: &mut Guest,
    op: u16,
    loc: u32,
    dst: [u8; 4],
    dport: Option<u16>,
    queue: u16,
) -> u32 {
    let mut b = vec![0u8; 92];
    b[0..2].copy_from_slice(&op.to_be_bytes());
    b[4..6].copy_from_slice(&0u16.to_be_bytes()); // GVE_FLOW_TYPE_TCPV4
    b[6..8].copy_from_slice(&queue.to_be_bytes());
    // key: dst ip, dst port; mask: dst ip /32, dst port exact.
    b[8 + 16..8 + 20].copy_from_slice(&dst);
    b[48 + 16..48 + 20].copy_from_slice(&[0xff; 4]);
    if let Some(dport) = dport {
        b[8 + 34..8 + 36].copy_from_slice(&dport.to_be_bytes());
        b[48 + 34..48 + 36].copy_from_slice(&[0xff; 2]);
    }
    b[88..92].copy_from_slice(&loc.to_be_bytes());
    let a = g.alloc(92, 64);
    g.write(a, &b);
    g.adminq_cmd(extended_cmd(0x101, 92, a))
}

/// A DQO TX packet descriptor (dtype 0xc) for `len` bytes at `addr`.
pub fn tx_pkt_desc(addr: u64, len: u16, tag: u16, eop: bool, csum: bool, report: bool) -> [u8; 16] {
    let mut d = [0u8; 16];
    d[0..8].copy_from_slice(&addr.to_le_bytes());
    d[8] = 0xc
        | if eop { 0x20 } else { 0 }
        | if csum { 0x40 } else { 0 }
        | if report { 0x80 } else { 0 };
    d[12..14].copy_from_slice(&tag.to_le_bytes());
    d[14..16].copy_from_slice(&len.to_le_bytes());
    d
}

/// DESCRIBE_DEVICE into `len` bytes at `addr`, descriptor version `ver`.
pub fn describe_cmd(addr: u64, ver: u32, len: u32) -> [u8; 64] {
    cmd(
        opcode::DESCRIBE_DEVICE,
        &[
            &addr.to_be_bytes()[..],
            &ver.to_be_bytes(),
            &len.to_be_bytes(),
        ]
        .concat(),
    )
}

/// EXTENDED_COMMAND: inner command `inner`, `len` bytes at `addr`.
pub fn extended_cmd(inner: u32, len: u32, addr: u64) -> [u8; 64] {
    cmd(
        opcode::EXTENDED_COMMAND,
        &[
            &inner.to_be_bytes()[..],
            &len.to_be_bytes(),
            &addr.to_be_bytes(),
        ]
        .concat(),
    )
}

pub fn create_tx_cmd(q: u32, r: &TxRing, ntfy: u32) -> [u8; 64] {
    let mut p = Vec::new();
    p.extend_from_slice(&q.to_be_bytes());
    p.extend_from_slice(&0u32.to_be_bytes());
    p.extend_from_slice(&r.res.to_be_bytes());
    p.extend_from_slice(&r.ring.to_be_bytes());
    p.extend_from_slice(&0xffff_ffffu32.to_be_bytes());
    p.extend_from_slice(&ntfy.to_be_bytes());
    p.extend_from_slice(&r.compl.to_be_bytes());
    p.extend_from_slice(&(r.size as u16).to_be_bytes());
    p.extend_from_slice(&(r.size as u16).to_be_bytes());
    cmd(opcode::CREATE_TX_QUEUE, &p)
}

pub fn create_rx_cmd(q: u32, r: &RxRing, ntfy: u32) -> [u8; 64] {
    let mut p = Vec::new();
    p.extend_from_slice(&q.to_be_bytes());
    p.extend_from_slice(&0u32.to_be_bytes());
    p.extend_from_slice(&0u32.to_be_bytes());
    p.extend_from_slice(&ntfy.to_be_bytes());
    p.extend_from_slice(&r.res.to_be_bytes());
    p.extend_from_slice(&r.compl.to_be_bytes());
    p.extend_from_slice(&r.bufq.to_be_bytes());
    p.extend_from_slice(&0xffff_ffffu32.to_be_bytes());
    p.extend_from_slice(&(r.size as u16).to_be_bytes());
    p.extend_from_slice(&(r.buf_len as u16).to_be_bytes());
    p.extend_from_slice(&(r.size as u16).to_be_bytes());
    p.push(1); // enable_rsc (NETIF_F_GRO_HW is on by default)
    p.push(0);
    p.extend_from_slice(&(r.hdr_len as u16).to_be_bytes());
    cmd(opcode::CREATE_RX_QUEUE, &p)
}

/// Internet checksum over data (folded, complemented).
pub fn csum(data: &[u8], mut acc: u64) -> u16 {
    for c in data.chunks(2) {
        acc += u64::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    while acc >> 16 != 0 {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    !(acc as u16)
}

/// An Ethernet + IPv4 + TCP frame.
pub fn tcp4(
    src: [u8; 4],
    dst: [u8; 4],
    sport: u16,
    dport: u16,
    seq: u32,
    flags: u8,
    payload: &[u8],
) -> Vec<u8> {
    let mut f = vec![0x42, 0x01, 0x0a, 0, 0, 2, 0x02, 0, 0, 0, 0, 1, 0x08, 0x00];
    let ip_len = 20 + 20 + payload.len();
    let mut ip = vec![0x45, 0, 0, 0, 0x12, 0x34, 0x40, 0, 64, 6, 0, 0];
    ip[2..4].copy_from_slice(&(ip_len as u16).to_be_bytes());
    ip.extend_from_slice(&src);
    ip.extend_from_slice(&dst);
    let c = csum(&ip, 0);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&ip);
    let mut tcp = Vec::new();
    tcp.extend_from_slice(&sport.to_be_bytes());
    tcp.extend_from_slice(&dport.to_be_bytes());
    tcp.extend_from_slice(&seq.to_be_bytes());
    tcp.extend_from_slice(&1u32.to_be_bytes());
    tcp.extend_from_slice(&[0x50, flags, 0xff, 0xff, 0, 0, 0, 0]);
    tcp.extend_from_slice(payload);
    let c = csum(&tcp, pseudo4(src, dst, 6, tcp.len()));
    tcp[16..18].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&tcp);
    f
}

pub fn pseudo4(src: [u8; 4], dst: [u8; 4], proto: u8, len: usize) -> u64 {
    let mut acc = 0u64;
    for c in src.chunks(2).chain(dst.chunks(2)) {
        acc += u64::from(u16::from_be_bytes([c[0], c[1]]));
    }
    acc + u64::from(proto) + len as u64
}

/// True if an IPv4/TCP-or-UDP frame's IP header and L4 checksums verify.
pub fn checksums_ok(f: &[u8]) -> bool {
    let ihl = usize::from(f[14] & 0xf) * 4;
    let ip = &f[14..14 + ihl];
    let tot = usize::from(be16(ip, 2));
    let l4 = &f[14 + ihl..14 + tot];
    let src: [u8; 4] = ip[12..16].try_into().unwrap();
    let dst: [u8; 4] = ip[16..20].try_into().unwrap();
    csum(ip, 0) == 0 && csum(l4, pseudo4(src, dst, ip[9], l4.len())) == 0
}

/// Reference Toeplitz hash, bit by bit (Microsoft RSS definition).
pub fn toeplitz(key: &[u8], input: &[u8]) -> u32 {
    let bit = |i: usize| -> u32 {
        let b = key.get(i / 8).copied().unwrap_or(0);
        u32::from((b >> (7 - (i % 8))) & 1)
    };
    let mut r = 0u32;
    for (n, byte) in input.iter().enumerate() {
        for j in 0..8 {
            if byte & (0x80 >> j) != 0 {
                let start = n * 8 + j;
                let mut w = 0u32;
                for k in 0..32 {
                    w = (w << 1) | bit(start + k);
                }
                r ^= w;
            }
        }
    }
    r
}

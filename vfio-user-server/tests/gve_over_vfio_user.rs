//! The emulated gVNIC (`gve-device`) driven through the vfio-user edge with
//! no VM: `vfio_user::Client` in this process → UNIX socket →
//! `VfioUserServer` serving `GveDevice`. Guest RAM is a memfd the test
//! `DMA_MAP`s and also maps itself, so it reads and writes "guest memory"
//! as the gve driver would (rings, admin commands, buffers), while BAR
//! accesses, interrupts (eventfds) and DMA all take the real edge path.
//! Frames from the "fabric" enter with `DeviceHandle::receive` (the
//! daemon's path); frames the device sends land in the server's sink.

mod common;

// The gve test driver's helpers (admin command builders, frame builders,
// checksum checks), shared rather than copied.
#[path = "../../gve-device/tests/common/mod.rs"]
mod gve_common;

use std::fs::File;
use std::os::fd::AsRawFd;

use common::{enable_bus_master, memfd, take_events, MappedMem, TestServer};
use gve_common::{
    be16, be32, checksums_ok, cmd, create_rx_cmd, create_tx_cmd, describe_cmd, tcp4, tx_pkt_desc,
};
use gve_common::{GveDriver, RxRing, TxRing};
use gve_device::adminq::{opcode, status};
use gve_device::{layout, regs, Counters, GveConfig, GveDevice};
use pci_model::RxRefusal;
use vfio_bindings::bindings::vfio::VFIO_PCI_MSIX_IRQ_INDEX;
use vfio_user_server::Limits;

const CONFIG: u32 = 7;
const BAR0: u32 = layout::BAR_REGS as u32;
const BAR2: u32 = layout::BAR_DOORBELLS as u32;
/// Guest RAM as the device sees it (IOVA) and its size.
const IOVA: u64 = 0x1_0000_0000;
const RAM: u64 = 2 << 20;
/// Ring sizes and buffer sizes the tests' driver uses.
const RING: u32 = 64;
const BUF_LEN: u32 = 2048;
const A: [u8; 4] = [10, 0, 0, 1];
const B: [u8; 4] = [10, 0, 0, 2];
/// Default config: 4 + 4 queues → 9 MSI-X vectors, 8 notify blocks.
const VECTORS: u32 = 9;
const NUM_NTFY: u32 = (VECTORS - 1) & !1;
const TX_NTFY: u32 = 0;
const RX_NTFY: u32 = NUM_NTFY / 2;

fn start() -> TestServer<GveDevice> {
    TestServer::start(GveDevice::new(GveConfig::default()), Limits::default())
}

fn counters(s: &TestServer<GveDevice>) -> Counters {
    s.handle.with_device(|d| d.counters().clone())
}

/// What DESCRIBE_DEVICE wrote, as the driver finds it.
struct Described {
    raw: Vec<u8>,
    /// `(id, length, body)` of every option.
    options: Vec<(u16, u16, Vec<u8>)>,
}

impl Described {
    fn option(&self, id: u16) -> &[u8] {
        &self
            .options
            .iter()
            .find(|o| o.0 == id)
            .unwrap_or_else(|| panic!("option {id:#x} missing"))
            .2
    }
}

/// The gve driver's side, over vfio-user: BAR accesses are region
/// reads/writes, guest memory is the test's mmap of the DMA-mapped memfd.
struct Driver {
    c: vfio_user::Client,
    ram: File,
    mem: MappedMem,
    next: u64,
    prod: u32,
    adminq: u64,
    irq_db: Vec<u32>,
    tx: Option<TxRing>,
    rx: Option<RxRing>,
    vectors: Vec<File>,
}

impl GveDriver for Driver {
    /// `dma_alloc_coherent`: zeroed, aligned, inside the mapped memfd.
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

    fn reg_write(&mut self, off: u64, data: &[u8]) {
        self.c.region_write(BAR0, off, data).unwrap();
    }

    /// `ioread32be` of a BAR0 register.
    fn reg_r32(&mut self, off: u64) -> u32 {
        let mut b = [0u8; 4];
        self.c.region_read(BAR0, off, &mut b).unwrap();
        u32::from_be_bytes(b)
    }

    fn adminq_state(&mut self) -> (&mut u64, &mut u32) {
        (&mut self.adminq, &mut self.prod)
    }
}

impl Driver {
    /// Connects, maps guest RAM (`DMA_MAP` of a memfd) and turns bus
    /// mastering on, as QEMU + the PCI core do before the driver probes.
    fn connect(s: &TestServer<GveDevice>) -> Self {
        let mut c = s.client();
        let ram = memfd(RAM);
        c.dma_map(0, IOVA, RAM, ram.as_raw_fd()).unwrap();
        assert_eq!(s.handle.dma_regions(), 1);
        enable_bus_master(&mut c);
        let mem = MappedMem::new(&ram, IOVA);
        Driver {
            c,
            ram,
            mem,
            next: IOVA + 0x1000,
            prod: 0,
            adminq: 0,
            irq_db: Vec::new(),
            tx: None,
            rx: None,
            vectors: Vec::new(),
        }
    }

    /// `iowrite32(val, &db_bar2[index])`.
    fn doorbell(&mut self, index: u32, val: u32) {
        self.c
            .region_write(BAR2, u64::from(index) * 4, &val.to_le_bytes())
            .unwrap();
    }

    fn describe(&mut self) -> Described {
        let desc = self.alloc(4096, 64);
        assert_eq!(self.adminq_cmd(describe_cmd(desc, 1, 4096)), status::PASSED);
        let raw = self.read(desc, 4096);
        let mut options = Vec::new();
        let mut at = 40;
        for _ in 0..be16(&raw, 30) {
            let (id, len) = (be16(&raw, at), be16(&raw, at + 2));
            assert_eq!(be32(&raw, at + 4), 0, "required_features_mask");
            let body = raw[at + 8..at + 8 + usize::from(len)].to_vec();
            options.push((id, len, body));
            at += 8 + usize::from(len);
        }
        assert_eq!(at, usize::from(be16(&raw, 32)), "total_length");
        Described { raw, options }
    }

    fn configure_resources_cmd(irq_db: u64, counters: u64) -> [u8; 64] {
        let mut p = Vec::new();
        p.extend_from_slice(&counters.to_be_bytes());
        p.extend_from_slice(&irq_db.to_be_bytes());
        p.extend_from_slice(&64u32.to_be_bytes());
        p.extend_from_slice(&NUM_NTFY.to_be_bytes());
        p.extend_from_slice(&64u32.to_be_bytes());
        p.extend_from_slice(&0u32.to_be_bytes());
        p.push(3); // GVE_DQO_RDA_FORMAT
        cmd(opcode::CONFIGURE_DEVICE_RESOURCES, &p)
    }

    fn configure_resources(&mut self) {
        let counters = self.alloc(64 * 4, 64);
        let irq_db = self.alloc(u64::from(NUM_NTFY) * 64, 64);
        assert_eq!(
            self.adminq_cmd(Self::configure_resources_cmd(irq_db, counters)),
            status::PASSED
        );
        self.irq_db = (0..NUM_NTFY)
            .map(|i| be32(&self.read(irq_db + u64::from(i) * 64, 4), 0))
            .collect();
    }

    /// `gve_probe` up to the end of `gve_init_priv`.
    fn probe(&mut self) -> Described {
        for b in b"GVE-1.0.0\n" {
            self.c
                .region_write(BAR0, regs::DRIVER_VERSION, &[*b])
                .unwrap();
        }
        assert_eq!(self.reg_r32(regs::MAX_TX_QUEUES), 4);
        assert_eq!(self.reg_r32(regs::MAX_RX_QUEUES), 4);
        self.adminq_setup();
        assert_eq!(self.verify_driver_compatibility(), status::PASSED);
        let d = self.describe();
        self.configure_resources();
        self.ptype_map_cmd();
        d
    }

    fn new_tx_ring(&mut self) -> TxRing {
        self.alloc_tx_ring(RING)
    }

    fn new_rx_ring(&mut self, hdr_len: u32) -> RxRing {
        self.alloc_rx_ring(RING, BUF_LEN, hdr_len)
    }

    /// `gve_open` for one queue pair: CREATE_TX_QUEUE, CREATE_RX_QUEUE
    /// (header split with `hdr_len`-byte header buffers), doorbell indices
    /// from the queue resources.
    fn open(&mut self, hdr_len: u32) {
        let mut tx = self.new_tx_ring();
        assert_eq!(
            self.adminq_cmd(create_tx_cmd(0, &tx, TX_NTFY)),
            status::PASSED
        );
        tx.db = be32(&self.read(tx.res, 8), 0);
        assert_eq!(be32(&self.read(tx.res, 8), 4), 0, "counter_index");
        let mut rx = self.new_rx_ring(hdr_len);
        assert_eq!(
            self.adminq_cmd(create_rx_cmd(0, &rx, RX_NTFY)),
            status::PASSED
        );
        rx.db = be32(&self.read(rx.res, 8), 0);
        self.tx = Some(tx);
        self.rx = Some(rx);
    }

    /// MSI-X on, an eventfd per vector (`common::msix_eventfds`).
    fn set_vectors(&mut self) {
        self.vectors = common::msix_eventfds(&mut self.c, VECTORS);
    }

    /// Event counts of every vector (reading resets them).
    fn take_irqs(&self) -> Vec<u64> {
        self.vectors.iter().map(take_events).collect()
    }

    /// Arms a notify block (`gve_turnup`; ITR index "no update").
    fn arm(&mut self, ntfy: u32) {
        let db = self.irq_db[ntfy as usize];
        self.doorbell(db, (3 << 3) | 1);
    }

    fn rx(&self) -> &RxRing {
        self.rx.as_ref().unwrap()
    }

    fn tx(&self) -> &TxRing {
        self.tx.as_ref().unwrap()
    }

    fn hdr_addr(&self, id: u16) -> u64 {
        self.rx().hdr_bufs + u64::from(id) * u64::from(self.rx().hdr_len)
    }

    fn buf_addr(&self, id: u16) -> u64 {
        self.rx().data + u64::from(id) * u64::from(self.rx().buf_len)
    }

    /// Posts `n` buffers (data + header buffer each) and rings the RX
    /// doorbell once.
    fn post_buffers(&mut self, n: u32) {
        for _ in 0..n {
            let id = self.rx().next_buf_id;
            let mut d = [0u8; 32];
            d[0..2].copy_from_slice(&id.to_le_bytes());
            d[8..16].copy_from_slice(&self.buf_addr(id).to_le_bytes());
            d[16..24].copy_from_slice(&self.hdr_addr(id).to_le_bytes());
            self.write(self.rx().bufq + u64::from(self.rx().tail) * 32, &d);
            let r = self.rx.as_mut().unwrap();
            r.next_buf_id = ((u32::from(id) + 1) % r.size) as u16;
            r.tail = (r.tail + 1) & (r.size - 1);
        }
        let (db, tail) = (self.rx().db, self.rx().tail);
        self.doorbell(db, tail);
    }

    /// The next RX completion, raw, if its generation says it is new.
    fn rx_completion(&mut self) -> Option<[u8; 32]> {
        let r = self.rx();
        let d: [u8; 32] = self
            .read(r.compl + u64::from(r.compl_head) * 32, 32)
            .try_into()
            .unwrap();
        let gen = u16::from_le_bytes([d[4], d[5]]) & (1 << 14) != 0;
        if gen == r.cur_gen {
            return None;
        }
        let r = self.rx.as_mut().unwrap();
        r.compl_head = (r.compl_head + 1) & (r.size - 1);
        if r.compl_head == 0 {
            r.cur_gen = !r.cur_gen;
        }
        Some(d)
    }

    /// The next TX completion, raw.
    fn tx_completion(&mut self) -> Option<[u8; 8]> {
        let r = self.tx();
        let d: [u8; 8] = self
            .read(r.compl + u64::from(r.compl_head) * 8, 8)
            .try_into()
            .unwrap();
        if (u16::from_le_bytes([d[0], d[1]]) >> 15 != 0) == r.cur_gen {
            return None;
        }
        let r = self.tx.as_mut().unwrap();
        r.compl_head = (r.compl_head + 1) & (r.size - 1);
        if r.compl_head == 0 {
            r.cur_gen = !r.cur_gen;
        }
        Some(d)
    }

    /// Writes a DQO packet (general context + one packet descriptor per
    /// buffer address) at the tail and rings the TX doorbell.
    fn send_descs(&mut self, bufs: &[(u64, u16)], tag: u16, csum: bool, report_event: bool) {
        let (ring, mask) = (self.tx().ring, self.tx().size - 1);
        let mut idx = self.tx().tail;
        let mut g = [0u8; 16];
        g[8] = 0x4; // general context
        self.write(ring + u64::from(idx) * 16, &g);
        idx = (idx + 1) & mask;
        for (i, &(addr, len)) in bufs.iter().enumerate() {
            let eop = i + 1 == bufs.len();
            let d = tx_pkt_desc(addr, len, tag, eop, csum, eop && report_event);
            self.write(ring + u64::from(idx) * 16, &d);
            idx = (idx + 1) & mask;
        }
        self.tx.as_mut().unwrap().tail = idx;
        let db = self.tx().db;
        self.doorbell(db, idx);
    }

    /// Copies `frags` into fresh buffers and sends them as one packet.
    fn send(&mut self, frags: &[&[u8]], tag: u16, csum: bool, report_event: bool) {
        let bufs: Vec<(u64, u16)> = frags
            .iter()
            .map(|f| {
                let a = self.alloc(f.len() as u64, 64);
                self.write(a, f);
                (a, f.len() as u16)
            })
            .collect();
        self.send_descs(&bufs, tag, csum, report_event);
    }
}

/// A probed device with one TX and one header-split RX queue, every MSI-X
/// vector on an eventfd and both queues' notify blocks armed.
fn up(s: &TestServer<GveDevice>) -> Driver {
    let mut d = Driver::connect(s);
    d.probe();
    d.open(128);
    d.set_vectors();
    d.arm(TX_NTFY);
    d.arm(RX_NTFY);
    assert_eq!(d.take_irqs(), vec![0; VECTORS as usize]);
    d
}

/// Decoded RX completion fields.
#[derive(Debug, PartialEq, Eq)]
struct RxC {
    rxdid: u8,
    rx_error: bool,
    packet_len: u16,
    generation: bool,
    header_len: u16,
    split_header: bool,
    done: bool,
    eop: bool,
    hbo: bool,
    l3_l4_processed: bool,
    csum_err: bool,
    buf_id: u16,
}

fn rxc(d: &[u8; 32]) -> RxC {
    let w = u16::from_le_bytes([d[4], d[5]]);
    let h = u16::from_le_bytes([d[6], d[7]]);
    RxC {
        rxdid: d[0] & 0xf,
        rx_error: d[1] & 4 != 0,
        packet_len: w & 0x3fff,
        generation: w & (1 << 14) != 0,
        header_len: h & 0x3ff,
        split_header: h & (1 << 11) != 0,
        done: d[8] & 1 != 0,
        eop: d[8] & 2 != 0,
        hbo: d[8] & 4 != 0,
        l3_l4_processed: d[8] & 8 != 0,
        csum_err: d[8] & 0x30 != 0,
        buf_id: u16::from_le_bytes([d[12], d[13]]),
    }
}

/// TX completion: (type, tag or head, queue id, generation).
fn txc(d: &[u8; 8]) -> (u16, u16, u16, bool) {
    let w = u16::from_le_bytes([d[0], d[1]]);
    (
        (w >> 11) & 7,
        u16::from_le_bytes([d[2], d[3]]),
        w & 0x7ff,
        w >> 15 != 0,
    )
}

fn payload(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + 3) as u8).collect()
}

#[test]
fn config_space_and_regions_identify_gvnic() {
    let s = start();
    let mut c = s.client();
    let mut cfg = [0u8; 256];
    c.region_read(CONFIG, 0, &mut cfg).unwrap();
    assert_eq!(u16::from_le_bytes([cfg[0], cfg[1]]), 0x1ae0, "vendor");
    assert_eq!(u16::from_le_bytes([cfg[2], cfg[3]]), 0x0042, "device");
    assert_eq!(cfg[8], layout::REVISION, "revision");
    assert_eq!(
        u32::from_le_bytes([cfg[9], cfg[10], cfg[11], 0]),
        0x02_00_00,
        "class: Ethernet"
    );
    assert_eq!(u16::from_le_bytes([cfg[0x2c], cfg[0x2d]]), 0x1ae0);
    assert_eq!(u16::from_le_bytes([cfg[0x2e], cfg[0x2f]]), 0x0058);
    assert_ne!(cfg[0x06] & 0x10, 0, "capability list");
    // Walk the capability list to MSI-X.
    let mut at = usize::from(cfg[0x34]);
    while at != 0 && cfg[at] != 0x11 {
        at = usize::from(cfg[at + 1]);
    }
    assert_ne!(at, 0, "MSI-X capability present");
    let ctl = u16::from_le_bytes([cfg[at + 2], cfg[at + 3]]);
    assert_eq!(u32::from(ctl & 0x7ff) + 1, VECTORS, "2 * 4 + 1 vectors");
    let le32 = |o: usize| u32::from_le_bytes(cfg[o..o + 4].try_into().unwrap());
    assert_eq!(le32(at + 4), 1, "table in BAR1 at 0");
    assert_eq!(le32(at + 8), layout::MSIX_PBA_OFFSET | 1, "PBA in BAR1");
    // Three 32-bit memory BARs, sized as the driver maps them.
    for (i, size) in [(0, 0x1000u64), (1, 0x4000), (2, 0x1000)] {
        assert_eq!(c.region(i).unwrap().size, size, "region {i}");
        assert_eq!(le32(0x10 + 4 * i as usize) & 0x7, 0, "BAR{i} 32-bit mem");
    }
    assert_eq!(c.region(3).unwrap().size, 0);
    let msix = c.get_irq_info(VFIO_PCI_MSIX_IRQ_INDEX).unwrap();
    assert_eq!(msix.count, VECTORS);
    // BAR0 is the big-endian register file: max queues read as 4.
    let mut b = [0u8; 4];
    c.region_read(BAR0, regs::MAX_TX_QUEUES, &mut b).unwrap();
    assert_eq!(u32::from_be_bytes(b), 4);
    c.region_read(BAR0, regs::DEVICE_STATUS, &mut b).unwrap();
    assert_eq!(u32::from_be_bytes(b), regs::device_status::LINK);
}

#[test]
fn probe_and_queue_creation_over_bar0() {
    let s = start();
    let mut d = Driver::connect(&s);
    let desc = d.probe();
    // Descriptor in guest memory (big endian).
    let r = &desc.raw;
    assert_eq!(be16(r, 10), 512, "tx_queue_entries");
    assert_eq!(be16(r, 12), 512, "rx_queue_entries");
    assert_eq!(be16(r, 16), 1500, "mtu");
    assert_eq!(be16(r, 18), 64, "counters");
    assert_eq!(&r[24..30], &GveConfig::default().mac, "mac");
    // Options: DQO RDA with every feature bit, buffer sizes (header split
    // possible), modify ring, flow steering, RSS config.
    assert_eq!(
        be32(desc.option(0x4), 0),
        1 | (1 << 4) | (1 << 5) | (1 << 7)
    );
    let bs = desc.option(0xa);
    assert_eq!((be16(bs, 4), be16(bs, 6)), (4096, 128), "buffer sizes");
    let mr = desc.option(0x6);
    assert_eq!((be16(mr, 4), be16(mr, 6)), (4096, 4096));
    assert_eq!(be32(desc.option(0xb), 8), 64, "max flow rules");
    let rss = desc.option(0xe);
    assert_eq!((be16(rss, 4), be16(rss, 6)), (40, 128));
    // CONFIGURE_DEVICE_RESOURCES handed out doorbell indices 0..8.
    assert_eq!(d.irq_db, (0..NUM_NTFY).collect::<Vec<_>>());
    let before = d.reg_r32(regs::ADMINQ_EVENT_COUNTER);
    assert_eq!(before, 4, "verify, describe, configure, ptype map");

    // gve_open: CREATE_TX_QUEUE, CREATE_RX_QUEUE with header split.
    d.open(128);
    assert_eq!(d.reg_r32(regs::ADMINQ_EVENT_COUNTER), before + 2);
    assert_eq!(d.tx().db, layout::TX_DB_BASE);
    assert_eq!(d.rx().db, layout::RX_DB_BASE);
    let st = s.handle.with_device(|dev| dev.status());
    assert_eq!(st.driver_version, "GVE-1.0.0");
    assert!(st.adminq_ready && st.resources_configured);
    assert_eq!(st.notify_blocks, NUM_NTFY);
    assert_eq!(st.adminq_event_counter, before + 2);
    assert_eq!(st.tx_queues.len(), 1);
    assert_eq!(st.tx_queues[0].ntfy_id, TX_NTFY);
    assert_eq!(st.rx_queues.len(), 1);
    let rq = &st.rx_queues[0];
    assert_eq!(
        (rq.header_buffer_size, rq.packet_buffer_size, rq.ntfy_id),
        (128, BUF_LEN, RX_NTFY)
    );
    assert_eq!(st.counters.admin_ok, 6);
    assert_eq!(st.counters.admin_failed, 0);
    assert_eq!(st.counters.dma_errors, 0);
    // Creating the same queue again: ALREADY_EXISTS in the status word.
    let tx2 = d.new_tx_ring();
    assert_eq!(
        d.adminq_cmd(create_tx_cmd(0, &tx2, TX_NTFY)),
        status::ALREADY_EXISTS
    );
    assert_eq!(s.handle.stats().dma_refused, 0);
}

#[test]
fn rx_header_split_completion_and_msix() {
    let s = start();
    let mut d = up(&s);
    let body = payload(1000);
    let f = tcp4(B, A, 5201, 40000, 1, 0x18, &body);
    // No buffers posted yet: back-pressure, nothing written.
    assert_eq!(s.handle.receive(&f), Err(RxRefusal::NoBuffers));
    d.post_buffers(4);
    assert_eq!(
        s.handle
            .with_device(|dev| dev.status().rx_queues[0].buffers_available),
        4
    );

    s.handle.receive(&f).unwrap();
    let mut want = vec![0; VECTORS as usize];
    want[RX_NTFY as usize] = 1;
    assert_eq!(d.take_irqs(), want, "RX queue 0's vector (block 4) fired");
    let c = rxc(&d.rx_completion().expect("a completion"));
    assert_eq!(
        c,
        RxC {
            rxdid: 1,
            rx_error: false,
            packet_len: 1000,
            generation: true,
            header_len: 54,
            split_header: true,
            done: true,
            eop: true,
            hbo: false,
            l3_l4_processed: true,
            csum_err: false,
            buf_id: 0,
        }
    );
    assert!(d.rx_completion().is_none(), "one completion per buffer");
    // Headers in the header buffer, payload in the data buffer.
    assert_eq!(d.read(d.hdr_addr(0), 54), &f[..54]);
    assert_eq!(d.read(d.hdr_addr(0) + 54, 128 - 54), vec![0; 128 - 54]);
    assert_eq!(d.read(d.buf_addr(0), 1000), body);
    assert_eq!(d.read(d.buf_addr(0) + 1000, 16), vec![0; 16]);

    // The block auto-masked: the next frame raises nothing until re-armed.
    let ack = tcp4(B, A, 5201, 40000, 1001, 0x10, b"");
    s.handle.receive(&ack).unwrap();
    assert_eq!(d.take_irqs(), vec![0; VECTORS as usize], "auto-masked");
    d.arm(RX_NTFY);
    assert_eq!(d.take_irqs(), want, "pending event fires on re-arm");
    // A pure ACK goes whole into the header buffer, packet_len 0.
    let c = rxc(&d.rx_completion().unwrap());
    assert_eq!(
        (c.buf_id, c.split_header, c.header_len, c.packet_len, c.eop),
        (1, true, ack.len() as u16, 0, true)
    );
    assert_eq!(d.read(d.hdr_addr(1), ack.len()), ack);

    let st = counters(&s);
    let q = st.rx_queues[0];
    assert_eq!((q.packets, q.hsplit_packets), (2, 2));
    assert_eq!(q.header_bytes, 54 + ack.len() as u64);
    assert_eq!(q.payload_bytes, 1000);
    let ss = s.handle.stats();
    assert_eq!(ss.irqs_fired, 2);
    assert_eq!(ss.dma_refused, 0);
}

#[test]
fn tx_frame_reaches_sink_with_completion() {
    let s = start();
    let mut d = up(&s);
    let mut f = tcp4(A, B, 40000, 80, 7, 0x18, b"hello over vfio-user");
    // CHECKSUM_PARTIAL: the stack leaves a seed, the device computes.
    f[14 + 20 + 16..14 + 20 + 18].copy_from_slice(&[0x12, 0x34]);
    d.send(&[&f[..54], &f[54..]], 0x123, true, true);

    let frames = s.frames.lock().unwrap().clone();
    assert_eq!(frames.len(), 1, "one frame in the server's sink");
    assert!(checksums_ok(&frames[0]), "TCP checksum filled in");
    assert_eq!(&frames[0][..50], &f[..50]);
    assert_eq!(&frames[0][54..], b"hello over vfio-user");
    assert_eq!(s.handle.stats().frames_out, 1);
    // Packet completion (type 2, tag, queue 0, generation 1) then a
    // descriptor completion (type 4) with the new head (3 descriptors).
    assert_eq!(txc(&d.tx_completion().unwrap()), (2, 0x123, 0, true));
    assert_eq!(txc(&d.tx_completion().unwrap()), (4, 3, 0, true));
    assert!(d.tx_completion().is_none());
    let mut want = vec![0; VECTORS as usize];
    want[TX_NTFY as usize] = 1;
    assert_eq!(d.take_irqs(), want, "TX queue 0's vector fired");
    let c = counters(&s);
    assert_eq!((c.tx_packets, c.tx_bytes), (1, f.len() as u64));
    assert_eq!(c.tx_queues[0].packets, 1);

    // A packet cut by the tail waits for the rest.
    let g = tcp4(A, B, 40000, 80, 27, 0x10, b"x");
    let buf = d.alloc(g.len() as u64, 64);
    d.write(buf, &g);
    let (ring, tail) = (d.tx().ring, d.tx().tail);
    let mut ctx = [0u8; 16];
    ctx[8] = 0x4;
    d.write(ring + u64::from(tail) * 16, &ctx);
    d.doorbell(layout::TX_DB_BASE, tail + 1);
    assert_eq!(s.frames.lock().unwrap().len(), 1, "incomplete packet waits");
    d.tx.as_mut().unwrap().tail = tail + 1;
    let pd = tx_pkt_desc(buf, g.len() as u16, 9, true, false, false);
    d.write(ring + u64::from(tail + 1) * 16, &pd);
    d.doorbell(layout::TX_DB_BASE, tail + 2);
    assert_eq!(s.frames.lock().unwrap().as_slice()[1], g);
    assert_eq!(txc(&d.tx_completion().unwrap()), (2, 9, 0, true));
}

#[test]
fn hostile_addresses_outside_the_dma_map() {
    let s = start();
    let mut d = Driver::connect(&s);
    let dma_refused = || s.handle.stats().dma_refused;

    // Admin queue past the end of the mapped memfd: both commands are
    // counted as executed (so a driver's wait ends) and failed.
    d.adminq_setup_at(IOVA + RAM);
    d.reg_w32(regs::ADMINQ_DOORBELL, 2);
    assert_eq!(d.reg_r32(regs::ADMINQ_EVENT_COUNTER), 2);
    let c = counters(&s);
    assert_eq!((c.admin_failed, c.dma_errors), (2, 2));
    assert_eq!(dma_refused(), 2, "refused by the edge's DmaTable");
    // ...and below it, in unmapped space (a reset, as the driver would).
    d.reg_w32(regs::DRIVER_STATUS, regs::driver_status::RESET);
    assert_ne!(
        d.reg_r32(regs::DEVICE_STATUS) & regs::device_status::DEVICE_IS_RESET,
        0
    );
    d.adminq_setup_at(0x1000);
    d.reg_w32(regs::ADMINQ_DOORBELL, 1);
    assert_eq!(d.reg_r32(regs::ADMINQ_EVENT_COUNTER), 1);
    assert_eq!(counters(&s).dma_errors, 3);

    // A proper admin queue; then DESCRIBE_DEVICE into places it may not go.
    d.reg_w32(regs::DRIVER_STATUS, regs::driver_status::RESET);
    d.adminq_setup();
    let outside = describe_cmd(IOVA + RAM, 1, 4096);
    assert_eq!(d.adminq_cmd(outside), status::INVALID_ARGUMENT);
    // Straddling the end of the mapping: refused whole, nothing written.
    let tail = IOVA + RAM - 16;
    d.write(tail, &[0xee; 16]);
    let straddle = describe_cmd(tail, 1, 4096);
    assert_eq!(d.adminq_cmd(straddle), status::INVALID_ARGUMENT);
    assert_eq!(d.read(tail, 16), vec![0xee; 16]);
    let wraps = describe_cmd(u64::MAX - 8, 1, 4096);
    assert_eq!(d.adminq_cmd(wraps), status::INVALID_ARGUMENT);
    // Notify-block doorbell array outside.
    let counters_addr = d.alloc(256, 64);
    let res = Driver::configure_resources_cmd(IOVA + RAM - 64, counters_addr);
    assert_eq!(d.adminq_cmd(res), status::INVALID_ARGUMENT);
    assert!(!s
        .handle
        .with_device(|dev| dev.status().resources_configured));
    let c = counters(&s);
    assert_eq!(c.dma_errors, 3 + 4);
    // The same queue still serves a well-behaved probe.
    d.describe();
    d.configure_resources();
    // Queue resources outside: the create fails.
    let mut bad_tx = d.new_tx_ring();
    bad_tx.res = IOVA + RAM;
    assert_eq!(
        d.adminq_cmd(create_tx_cmd(0, &bad_tx, TX_NTFY)),
        status::INVALID_ARGUMENT
    );
    d.open(128);
    d.set_vectors();
    d.arm(TX_NTFY);
    d.arm(RX_NTFY);

    // TX: a packet descriptor whose buffer is outside the mapping. The
    // packet is completed (the tag comes back) but not sent.
    let before = counters(&s);
    let refused = dma_refused();
    d.send_descs(&[(IOVA + RAM + 0x1000, 100)], 77, false, false);
    assert!(s.frames.lock().unwrap().is_empty(), "nothing sent");
    assert_eq!(txc(&d.tx_completion().unwrap()), (2, 77, 0, true));
    let c = counters(&s);
    assert_eq!(c.tx_drops, before.tx_drops + 1);
    assert_eq!(c.dma_errors, before.dma_errors + 1);
    assert_eq!(dma_refused(), refused + 1);

    // RX: a buffer whose data and header addresses are outside. The frame
    // is dropped with rx_error on its completion.
    let bufq = d.rx().bufq;
    let mut bd = [0u8; 32];
    bd[0..2].copy_from_slice(&5u16.to_le_bytes());
    bd[8..16].copy_from_slice(&(IOVA + RAM).to_le_bytes());
    bd[16..24].copy_from_slice(&(IOVA + RAM + 4096).to_le_bytes());
    d.write(bufq, &bd);
    d.rx.as_mut().unwrap().tail = 1;
    d.doorbell(layout::RX_DB_BASE, 1);
    let f = tcp4(B, A, 1, 2, 3, 0x18, &payload(300));
    assert_eq!(s.handle.receive(&f), Ok(()));
    let rc = rxc(&d.rx_completion().unwrap());
    assert!(rc.rx_error && rc.eop && rc.generation, "{rc:?}");
    assert_eq!(rc.buf_id, 5);
    let c = counters(&s);
    assert_eq!(c.rx_queues[0].drops, 1);
    assert_eq!(c.rx_packets, 0);
    // Bad doorbells: queue/ring index out of range, counted.
    let bad = c.bad_doorbells;
    d.doorbell(layout::TX_DB_BASE, RING);
    d.doorbell(layout::RX_DB_BASE + 3, 1);
    d.doorbell(1000, 1);
    assert_eq!(counters(&s).bad_doorbells, bad + 3);

    // Nothing panicked; the server and the device still answer.
    let st = s.handle.stats();
    assert_eq!((st.protocol_panics, st.protocol_errors), (0, 0));
    assert!(!s.thread.as_ref().unwrap().is_finished());
    assert_eq!(d.reg_r32(regs::MAX_RX_QUEUES), 4);
    d.post_buffers(2);
    let ok = tcp4(B, A, 1, 2, 3, 0x18, b"fine");
    s.handle.receive(&ok).unwrap();
    let rc = rxc(&d.rx_completion().unwrap());
    assert!(!rc.rx_error && rc.split_header);
    assert_eq!(d.read(d.buf_addr(rc.buf_id), 4), b"fine");
}

#[test]
fn dma_unmap_under_live_queues() {
    let s = start();
    let mut d = up(&s);
    d.post_buffers(8);
    let f = tcp4(B, A, 5201, 40000, 1, 0x18, &payload(200));
    s.handle.receive(&f).unwrap();
    assert!(d.rx_completion().is_some());
    d.take_irqs();

    // The client withdraws guest RAM while queues exist.
    d.c.dma_unmap(IOVA, RAM).unwrap();
    assert_eq!(s.handle.dma_regions(), 0);
    let before = counters(&s);
    let refused = s.handle.stats().dma_refused;

    // RX: the buffer descriptor cannot be read: dropped, nothing consumed.
    assert_eq!(s.handle.receive(&f), Err(RxRefusal::Dropped));
    // TX: the descriptor ring cannot be read: nothing sent or completed.
    let g = tcp4(A, B, 40000, 5201, 9, 0x18, b"after unmap");
    d.send(&[&g], 11, true, false);
    assert!(s.frames.lock().unwrap().is_empty());
    assert!(d.tx_completion().is_none());
    // Admin: the command cannot be read; the counter still advances (no
    // hang) and the status word stays UNSET.
    let slot = d.adminq + u64::from(d.prod % 64) * 64;
    let st = d.adminq_cmd(cmd(
        opcode::REPORT_LINK_SPEED,
        &(IOVA + 0x100).to_be_bytes(),
    ));
    assert_eq!(st, status::UNSET);
    assert_eq!(be32(&d.read(slot, 8), 4), status::UNSET);
    assert_eq!(d.take_irqs(), vec![0; VECTORS as usize], "no interrupts");

    let c = counters(&s);
    assert_eq!(c.dma_errors, before.dma_errors + 3);
    assert_eq!(c.rx_drops, before.rx_drops + 1);
    assert_eq!(c.admin_failed, before.admin_failed + 1);
    assert_eq!(s.handle.stats().dma_refused, refused + 3);

    // The server keeps serving: config space, registers, status.
    let st = s.handle.stats();
    assert_eq!((st.protocol_panics, st.protocol_errors), (0, 0));
    assert!(!s.thread.as_ref().unwrap().is_finished());
    let mut b = [0u8; 4];
    d.c.region_read(CONFIG, 0, &mut b).unwrap();
    assert_eq!(u32::from_le_bytes(b), 0x0042_1ae0);
    assert_eq!(d.reg_r32(regs::ADMINQ_EVENT_COUNTER), d.prod);

    // Mapping the memfd again: the queues resume where they stopped.
    d.c.dma_map(0, IOVA, RAM, d.ram.as_raw_fd()).unwrap();
    assert_eq!(s.handle.dma_regions(), 1);
    s.handle.receive(&f).unwrap();
    let rc = rxc(&d.rx_completion().unwrap());
    assert_eq!((rc.buf_id, rc.rx_error, rc.packet_len), (1, false, 200));
    let db = d.tx().db;
    let tail = d.tx().tail;
    d.doorbell(db, tail);
    assert_eq!(s.frames.lock().unwrap().len(), 1, "TX retried on doorbell");
    assert!(checksums_ok(&s.frames.lock().unwrap()[0]));
    assert_eq!(txc(&d.tx_completion().unwrap()), (2, 11, 0, true));
}

#[test]
fn function_reset_and_reconnect_with_live_queues() {
    let s = start();
    let mut d = up(&s);
    d.post_buffers(4);
    let f = tcp4(B, A, 5201, 40000, 1, 0x18, &payload(100));

    // DEVICE_RESET (FLR) with queues up: everything the driver set up is
    // gone, DMA mappings and eventfds stay, bus mastering is off again.
    d.c.reset().unwrap();
    let st = s.handle.with_device(|dev| dev.status());
    assert!(!st.adminq_ready && !st.resources_configured);
    assert!(st.tx_queues.is_empty() && st.rx_queues.is_empty());
    assert_eq!(st.device_status, regs::device_status::LINK);
    assert_eq!(st.counters.resets, 1, "counters survive");
    assert_eq!(s.handle.dma_regions(), 1);
    assert_eq!(s.handle.receive(&f), Err(RxRefusal::NotReady));
    let mut b = [0u8; 2];
    d.c.region_read(CONFIG, 4, &mut b).unwrap();
    assert_eq!(u16::from_le_bytes(b) & 0x6, 0, "command register cleared");

    // The driver probes again on the same mapping and eventfds.
    enable_bus_master(&mut d.c);
    d.probe();
    d.open(128);
    d.arm(RX_NTFY);
    d.post_buffers(4);
    s.handle.receive(&f).unwrap();
    let mut want = vec![0; VECTORS as usize];
    want[RX_NTFY as usize] = 1;
    assert_eq!(d.take_irqs(), want);
    let rc = rxc(&d.rx_completion().unwrap());
    assert_eq!((rc.buf_id, rc.packet_len, rc.header_len), (0, 100, 54));

    // The client goes away with queues up: reset, DMA and eventfds dropped.
    d.c.shutdown().unwrap();
    drop(d);
    s.wait_for("disconnect", |st| st.connections == 1);
    assert_eq!(s.handle.dma_regions(), 0);
    assert_eq!(s.handle.receive(&f), Err(RxRefusal::NotReady));
    let st = s.handle.with_device(|dev| dev.status());
    assert!(!st.adminq_ready && st.rx_queues.is_empty());
    assert_eq!(st.counters.resets, 2);

    // The next client gets a fresh device and a working datapath.
    let mut d = up(&s);
    d.post_buffers(1);
    s.handle.receive(&f).unwrap();
    assert_eq!(d.take_irqs(), want);
    let rc = rxc(&d.rx_completion().unwrap());
    assert!(rc.generation && !rc.rx_error, "fresh rings, generation 1");
    assert_eq!(d.read(d.hdr_addr(rc.buf_id), 54), &f[..54]);
    assert_eq!(s.handle.stats().protocol_panics, 0);
}

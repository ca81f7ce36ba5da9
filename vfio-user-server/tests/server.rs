//! End-to-end tests: `vfio_user::Client` (and a raw client) in this process
//! against the server on a thread, serving the probe device.

mod common;

use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use common::*;
use vfio_bindings::bindings::vfio::{
    VFIO_IRQ_SET_ACTION_MASK, VFIO_IRQ_SET_ACTION_TRIGGER, VFIO_IRQ_SET_ACTION_UNMASK,
    VFIO_IRQ_SET_DATA_BOOL, VFIO_IRQ_SET_DATA_EVENTFD, VFIO_IRQ_SET_DATA_NONE,
    VFIO_PCI_MSIX_IRQ_INDEX, VFIO_REGION_INFO_FLAG_READ, VFIO_REGION_INFO_FLAG_WRITE,
};
use vfio_user_server::probe::{self, reg, ProbeDevice};
use vfio_user_server::Limits;

const BAR0: u32 = 0;
const BAR2: u32 = 2;
const CONFIG: u32 = 7;
const IOVA: u64 = 0x1_0000_0000;
const RAM: u64 = 1 << 20;

fn start() -> TestServer<ProbeDevice> {
    TestServer::start(ProbeDevice::new(), Limits::default())
}

fn fill(c: &mut vfio_user::Client, addr: u64, len: u32, pattern: u8, vector: u32) -> u32 {
    write32(c, BAR0, reg::ADDR_LO, addr as u32);
    write32(c, BAR0, reg::ADDR_HI, (addr >> 32) as u32);
    write32(c, BAR0, reg::LEN, len);
    write32(c, BAR0, reg::PATTERN, u32::from(pattern));
    write32(c, BAR0, reg::VECTOR, vector);
    write32(c, BAR0, reg::DOORBELL, probe::CMD_FILL);
    read32(c, BAR0, reg::STATUS)
}

#[test]
fn region_and_irq_info() {
    let s = start();
    let mut c = s.client();
    let r0 = c.region(0).unwrap();
    assert_eq!(r0.size, 0x1000);
    assert_eq!(
        r0.flags,
        VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE
    );
    assert_eq!(c.region(1).unwrap().size, 0);
    assert_eq!(c.region(2).unwrap().size, 0x4000);
    assert_eq!(c.region(3).unwrap().size, 0, "upper half of a 64-bit BAR");
    assert_eq!(c.region(6).unwrap().size, 0, "no ROM");
    assert_eq!(c.region(7).unwrap().size, 256);
    assert_eq!(c.region(8).unwrap().size, 0, "no VGA");
    assert!(c.region(9).is_none());
    let msix = c.get_irq_info(VFIO_PCI_MSIX_IRQ_INDEX).unwrap();
    assert_eq!(msix.count, u32::from(probe::VECTORS));
    assert_eq!(c.get_irq_info(0).unwrap().count, 0, "no INTx");
    assert_eq!(c.get_irq_info(3).unwrap().count, 1, "ERR");
    assert_eq!(c.get_irq_info(4).unwrap().count, 1, "REQ");
}

#[test]
fn req_eventfd_asks_for_unplug() {
    let s = start();
    let mut c = s.client();
    assert!(!s.handle.request_unplug());
    let ev = eventfd();
    let flags = VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER;
    c.set_irqs(4, flags, 0, 1, &[ev.as_raw_fd()]).unwrap();
    c.set_irqs(3, flags, 0, 1, &[ev.as_raw_fd()]).unwrap();
    assert!(s.handle.request_unplug());
    assert_eq!(take_events(&ev), 1);
    // withdrawn: nothing to signal
    c.set_irqs(4, flags, 0, 1, &[]).unwrap();
    assert!(!s.handle.request_unplug());
    // only one REQ vector
    c.set_irqs(4, flags, 1, 1, &[ev.as_raw_fd()]).unwrap();
    assert_eq!(s.handle.stats().set_irqs_refused, 1);
}

#[test]
fn config_space_ids_bars_msix() {
    let s = start();
    let mut c = s.client();
    assert_eq!(
        read32(&mut c, CONFIG, 0),
        u32::from(probe::VENDOR_ID) | (u32::from(probe::DEVICE_ID) << 16)
    );
    assert_eq!(read32(&mut c, CONFIG, 0x08) >> 8, 0xff0000, "class");
    // the whole space in one read, as QEMU does at realize
    let mut all = [0u8; 256];
    c.region_read(CONFIG, 0, &mut all).unwrap();
    assert_eq!(all[0x34], 0x40, "capability pointer");
    assert_ne!(all[0x06] & 0x10, 0, "capability list");
    assert_eq!(all[0x40], 0x11, "MSI-X");
    assert_eq!(
        u16::from_le_bytes([all[0x42], all[0x43]]) & 0x7ff,
        probe::VECTORS - 1
    );
    assert_eq!(read32(&mut c, CONFIG, 0x44), 2, "table in BAR2 at 0");
    assert_eq!(read32(&mut c, CONFIG, 0x48), 0x2000 | 2, "PBA in BAR2");
    assert_eq!(all[0x3d], 0, "no interrupt pin");
    // BAR sizing
    write32(&mut c, CONFIG, 0x10, 0xffff_ffff);
    assert_eq!(read32(&mut c, CONFIG, 0x10), 0xffff_f000);
    write32(&mut c, CONFIG, 0x18, 0xffff_ffff);
    write32(&mut c, CONFIG, 0x1c, 0xffff_ffff);
    assert_eq!(read32(&mut c, CONFIG, 0x18), 0xffff_c004);
    assert_eq!(read32(&mut c, CONFIG, 0x1c), 0xffff_ffff);
    // IDs are read-only
    write32(&mut c, CONFIG, 0, 0);
    assert_eq!(
        read32(&mut c, CONFIG, 0) & 0xffff,
        u32::from(probe::VENDOR_ID)
    );
}

#[test]
fn bar_access_reaches_model() {
    let s = start();
    let mut c = s.client();
    assert_eq!(read32(&mut c, BAR0, reg::MAGIC), probe::MAGIC);
    write32(&mut c, BAR0, reg::SCRATCH, 0xdead_beef);
    assert_eq!(read32(&mut c, BAR0, reg::SCRATCH), 0xdead_beef);
    assert_eq!(s.handle.with_device(|d| d.bad_accesses), 0);
    // MSI-X table reads are served by the edge: vectors start masked
    assert_eq!(read32(&mut c, BAR2, 12), 1);
}

#[test]
fn dma_map_fill_irq_unmap() {
    let s = start();
    let mut c = s.client();
    let ram = memfd(RAM);
    c.dma_map(0, IOVA, RAM, ram.as_raw_fd()).unwrap();
    assert_eq!(s.handle.dma_regions(), 1);
    let ev = eventfd();
    set_vector(&mut c, 1, &ev);

    // bus mastering off: the device may not DMA
    assert_eq!(fill(&mut c, IOVA + 0x1000, 256, 0xab, 1), 2);
    assert_eq!(read_mem(&ram, 0x1000, 256), vec![0; 256]);
    assert_eq!(s.handle.stats().dma_refused, 1);

    enable_bus_master(&mut c);
    assert_eq!(fill(&mut c, IOVA + 0x1000, 256, 0xab, 1), 1);
    assert_eq!(read_mem(&ram, 0x1000, 256), vec![0xab; 256]);
    assert_eq!(take_events(&ev), 1);

    // outside the mapping: refused, counted, nothing written
    assert_eq!(fill(&mut c, IOVA + RAM - 16, 32, 0xcd, 1), 2);
    assert_eq!(read_mem(&ram, RAM - 16, 16), vec![0; 16]);
    assert_eq!(s.handle.stats().dma_refused, 2);

    c.dma_unmap(IOVA, RAM).unwrap();
    assert_eq!(s.handle.dma_regions(), 0);
    assert_eq!(fill(&mut c, IOVA + 0x1000, 256, 0x11, 1), 2);
    assert_eq!(read_mem(&ram, 0x1000, 256), vec![0xab; 256]);
    assert_eq!(read32(&mut c, BAR0, reg::DMA_ERRORS), 3);
    let st = s.handle.stats();
    assert_eq!(st.dma_refused, 3);
    assert_eq!(st.dma_maps, 1);
    assert_eq!(st.dma_unmaps, 1);
    assert_eq!(take_events(&ev), 0);
}

#[test]
fn dma_spanning_two_mappings() {
    let s = start();
    let mut c = s.client();
    let ram = memfd(RAM);
    c.dma_map(0, IOVA, RAM / 2, ram.as_raw_fd()).unwrap();
    c.dma_map(RAM / 2, IOVA + RAM / 2, RAM / 2, ram.as_raw_fd())
        .unwrap();
    enable_bus_master(&mut c);
    assert_eq!(fill(&mut c, IOVA + RAM / 2 - 8, 16, 0x5a, 0), 1);
    assert_eq!(read_mem(&ram, RAM / 2 - 8, 16), vec![0x5a; 16]);
}

#[test]
fn frames_out_and_in() {
    let s = start();
    let mut c = s.client();
    let ram = memfd(RAM);
    c.dma_map(0, IOVA, RAM, ram.as_raw_fd()).unwrap();
    enable_bus_master(&mut c);
    let ev = eventfd();
    set_vector(&mut c, 2, &ev);

    // device reads guest memory and sends it as a frame
    assert_eq!(fill(&mut c, IOVA, 64, 0x77, 2), 1);
    write32(&mut c, BAR0, reg::DOORBELL, probe::CMD_SEND);
    assert_eq!(read32(&mut c, BAR0, reg::STATUS), 1);
    assert_eq!(s.frames.lock().unwrap().as_slice(), &[vec![0x77u8; 64]]);
    assert_eq!(s.handle.stats().frames_out, 1);
    assert_eq!(take_events(&ev), 2);

    // a frame from the fabric lands in guest memory
    assert_eq!(
        s.handle.receive(&[1, 2, 3]),
        Err(pci_model::RxRefusal::NoBuffers)
    );
    write32(&mut c, BAR0, reg::ADDR_LO, (IOVA + 0x2000) as u32);
    write32(&mut c, BAR0, reg::DOORBELL, probe::CMD_RX_ARM);
    s.handle.receive(&[1, 2, 3]).unwrap();
    assert_eq!(read_mem(&ram, 0x2000, 4), vec![1, 2, 3, 0]);
    assert_eq!(read32(&mut c, BAR0, reg::RX_FRAMES), 1);
    assert_eq!(take_events(&ev), 1);
}

#[test]
fn timer_via_next_deadline_and_poll() {
    let s = start();
    let mut c = s.client();
    let ev = eventfd();
    set_vector(&mut c, 0, &ev);
    assert!(s.handle.next_deadline(Instant::now()).is_none());
    write32(&mut c, BAR0, reg::TIMER_US, 2000);
    write32(&mut c, BAR0, reg::DOORBELL, probe::CMD_TIMER);
    let at = s.handle.next_deadline(Instant::now()).unwrap();
    s.handle.poll();
    assert_eq!(read32(&mut c, BAR0, reg::TIMER_HITS), 0);
    std::thread::sleep(at.saturating_duration_since(Instant::now()));
    s.handle.poll();
    assert_eq!(read32(&mut c, BAR0, reg::TIMER_HITS), 1);
    assert_eq!(take_events(&ev), 1);
    assert!(s.handle.next_deadline(Instant::now()).is_none());
}

#[test]
fn pending_mask_unmask_and_pba() {
    let s = start();
    let mut c = s.client();
    let ram = memfd(RAM);
    c.dma_map(0, IOVA, RAM, ram.as_raw_fd()).unwrap();
    enable_bus_master(&mut c);

    // no eventfd for vector 3 yet: pending, visible in the PBA
    assert_eq!(fill(&mut c, IOVA, 4, 1, 3), 1);
    assert_eq!(read32(&mut c, BAR2, 0x2000), 1 << 3);
    let ev = eventfd();
    set_vector(&mut c, 3, &ev);
    assert_eq!(take_events(&ev), 1, "pending vector fires on assignment");
    assert_eq!(read32(&mut c, BAR2, 0x2000), 0);

    // masked: pending until unmasked
    c.set_irqs(
        VFIO_PCI_MSIX_IRQ_INDEX,
        VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_MASK,
        3,
        1,
        &[],
    )
    .unwrap();
    assert_eq!(fill(&mut c, IOVA, 4, 1, 3), 1);
    assert_eq!(take_events(&ev), 0);
    assert_eq!(read32(&mut c, BAR2, 0x2000), 1 << 3);
    c.set_irqs(
        VFIO_PCI_MSIX_IRQ_INDEX,
        VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_UNMASK,
        3,
        1,
        &[],
    )
    .unwrap();
    assert_eq!(take_events(&ev), 1);

    // loopback trigger
    c.set_irqs(
        VFIO_PCI_MSIX_IRQ_INDEX,
        VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_TRIGGER,
        3,
        1,
        &[],
    )
    .unwrap();
    assert_eq!(take_events(&ev), 1);

    // withdraw (fd -1 as QEMU sends it: DATA_EVENTFD without descriptors)
    c.set_irqs(
        VFIO_PCI_MSIX_IRQ_INDEX,
        VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER,
        3,
        1,
        &[],
    )
    .unwrap();
    assert_eq!(fill(&mut c, IOVA, 4, 1, 3), 1);
    assert_eq!(take_events(&ev), 0);

    // disable all (count 0), then a bad range is refused
    c.set_irqs(
        VFIO_PCI_MSIX_IRQ_INDEX,
        VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_TRIGGER,
        0,
        0,
        &[],
    )
    .unwrap();
    let before = s.handle.stats().set_irqs_refused;
    c.set_irqs(
        VFIO_PCI_MSIX_IRQ_INDEX,
        VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER,
        u32::MAX,
        1,
        &[ev.as_raw_fd()],
    )
    .unwrap(); // the crate's client does not report errors
               // not an eventfd: refused
    c.set_irqs(
        VFIO_PCI_MSIX_IRQ_INDEX,
        VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER,
        0,
        1,
        &[ram.as_raw_fd()],
    )
    .unwrap();
    assert_eq!(s.handle.stats().set_irqs_refused, before + 2);
    // DATA_BOOL is refused by the vfio_user crate itself
    c.set_irqs(
        VFIO_PCI_MSIX_IRQ_INDEX,
        VFIO_IRQ_SET_DATA_BOOL | VFIO_IRQ_SET_ACTION_TRIGGER,
        0,
        1,
        &[],
    )
    .unwrap();
    // a vector the device raises that does not exist is counted
    assert_eq!(fill(&mut c, IOVA, 4, 1, 99), 1);
    assert_eq!(s.handle.stats().bad_vector, 1);
}

#[test]
fn reset_and_reconnect() {
    let mut s = start();
    let ram = memfd(RAM);
    {
        let mut c = s.client();
        c.dma_map(0, IOVA, RAM, ram.as_raw_fd()).unwrap();
        enable_bus_master(&mut c);
        write32(&mut c, BAR0, reg::SCRATCH, 7);
        c.reset().unwrap();
        assert_eq!(read32(&mut c, BAR0, reg::SCRATCH), 0);
        assert_eq!(read32(&mut c, BAR0, reg::RESETS), 1);
        assert_eq!(read32(&mut c, CONFIG, 4) & 0x6, 0, "command cleared");
        assert_eq!(s.handle.dma_regions(), 1, "reset keeps DMA mappings");
        write32(&mut c, BAR0, reg::SCRATCH, 9);
        c.shutdown().unwrap();
    }
    s.wait_for("disconnect", |st| st.connections == 1);
    assert_eq!(s.handle.dma_regions(), 0);
    let mut c = s.client();
    assert_eq!(read32(&mut c, BAR0, reg::SCRATCH), 0);
    assert_eq!(read32(&mut c, BAR0, reg::RESETS), 2);
    assert_eq!(read32(&mut c, BAR0, reg::MAGIC), probe::MAGIC);
    // stop with a client connected: the server thread ends, socket removed
    s.stop();
    assert!(!s.path.exists());
    drop(c);
}

#[test]
fn stop_while_idle() {
    let mut s = start();
    std::thread::sleep(Duration::from_millis(20));
    s.stop();
    assert!(!s.path.exists());
    assert!(s.handle.is_stopped());
}

#[test]
fn bad_region_accesses_are_refused() {
    let s = start();
    let mut r = s.raw();
    // unknown region index: refused by the crate
    assert!(r.region_read(42, 0, 4).is_error());
    // absent BAR / ROM / VGA
    assert!(r.region_read(1, 0, 4).is_error());
    assert!(r.region_read(6, 0, 4).is_error());
    assert!(r.region_read(8, 0, 4).is_error());
    // past the end, odd sizes, offset overflow
    assert!(r.region_read(0, 0x1000, 4).is_error());
    assert!(r.region_read(0, 0xffe, 4).is_error());
    assert!(r.region_read(0, 0, 3).is_error());
    assert!(r.region_read(0, 0, 16).is_error());
    assert!(r.region_read(0, u64::MAX - 1, 4).is_error());
    assert!(r.region_read(7, 250, 8).is_error());
    assert!(r.region_write(0, 0x2000, &[0; 4]).is_error());
    assert!(r.region_write(7, 256, &[0; 1]).is_error());
    assert_eq!(s.handle.stats().bad_region_access, 11);
    // the connection still works
    let ok = r.region_read(0, reg::MAGIC, 4);
    assert!(!ok.is_error());
    assert_eq!(&ok.payload[16..20], &probe::MAGIC.to_le_bytes());
    assert_eq!(s.handle.with_device(|d| d.bad_accesses), 0);
}

#[test]
fn adversarial_dma_maps() {
    let s = TestServer::start(ProbeDevice::new(), Limits { max_dma_regions: 8 });
    let mut r = s.raw();
    let ram = memfd(RAM);
    let rw = 3;
    assert!(r.dma_map(rw, 0, 0x1000, 0, Some(&ram)).is_error(), "size 0");
    assert!(
        r.dma_map(rw, 0, u64::MAX - 0xfff, 0x2000, Some(&ram))
            .is_error(),
        "wraps"
    );
    assert!(
        r.dma_map(rw, 0, 0, u64::MAX, Some(&ram)).is_error(),
        "absurd size"
    );
    assert!(
        r.dma_map(rw, 0, 0, RAM + 0x1000, Some(&ram)).is_error(),
        "past EOF"
    );
    assert!(
        r.dma_map(rw, u64::MAX - 0xfff, 0, 0x1000, Some(&ram))
            .is_error(),
        "offset past EOF"
    );
    assert!(
        r.dma_map(rw, 0x10, 0, 0x1000, Some(&ram)).is_error(),
        "unaligned offset"
    );
    let ev = eventfd();
    assert!(
        r.dma_map(rw, 0, 0, 0x1000, Some(&ev)).is_error(),
        "not a regular file"
    );
    assert!(!r.dma_map(rw, 0, IOVA, RAM, Some(&ram)).is_error());
    assert!(
        r.dma_map(rw, 0, IOVA + RAM - 0x1000, 0x2000, Some(&ram))
            .is_error(),
        "overlap"
    );
    assert!(
        r.dma_map(rw, 0, IOVA - 0x1000, 0x2000, None).is_error(),
        "overlap, fd-less"
    );
    // fd-less maps are taken (QEMU sends them for ROMs) but unreachable
    for i in 0..7u64 {
        assert!(!r.dma_map(1, 0, i * 0x10000, 0x1000, None).is_error());
    }
    assert!(
        r.dma_map(1, 0, 0x100000, 0x1000, None).is_error(),
        "table full"
    );
    assert_eq!(s.handle.dma_regions(), 8);
    let st = s.handle.stats();
    assert_eq!(st.dma_maps, 8);
    assert_eq!(st.dma_maps_refused, 10);
    // unmaps that cut a mapping are refused; unmap-all clears
    assert!(r.dma_unmap(0, IOVA, 0x1000).is_error());
    assert!(r.dma_unmap(0, IOVA, 0).is_error());
    assert!(r.dma_unmap(0, u64::MAX, 2).is_error());
    assert!(r.dma_unmap(2, IOVA, RAM).is_error(), "dirty page tracking");
    assert!(!r.dma_unmap(4, 0, 0).is_error());
    assert_eq!(s.handle.dma_regions(), 0);
    assert_eq!(s.handle.stats().dma_unmaps_refused, 4);
}

#[test]
fn malformed_messages_drop_the_connection_not_the_server() {
    let s = start();
    {
        let mut r = s.raw();
        // VERSION with a size smaller than its own header: the vfio_user
        // crate panics on it; the server catches that and goes on.
        r.send(VFIO_USER_VERSION, 8, &[0; 4], &[]);
        let mut b = [0u8; 1];
        use std::io::Read;
        assert_eq!(r.stream.read(&mut b).unwrap_or(0), 0, "connection closed");
    }
    s.wait_for("panic caught", |st| st.protocol_panics == 1);
    {
        // a VERSION whose capabilities are not NUL-terminated JSON
        let mut r = s.raw();
        r.send(
            VFIO_USER_VERSION,
            16 + 4 + 3,
            &[0, 0, 1, 0, b'{', b'x', b'}'],
            &[],
        );
        let mut b = [0u8; 1];
        use std::io::Read;
        assert_eq!(r.stream.read(&mut b).unwrap_or(0), 0);
    }
    s.wait_for("second panic caught", |st| st.protocol_panics == 2);
    {
        // an unknown command gets an error reply
        let mut r = s.raw();
        assert!(r.call(0x77, &[], &[]).is_error());
    }
    let mut c = s.client();
    assert_eq!(read32(&mut c, BAR0, reg::MAGIC), probe::MAGIC);
}

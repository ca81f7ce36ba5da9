//! Device DMA from the daemon's thread racing with the client's
//! DMA_MAP/DMA_UNMAP on the vfio-user thread: every access either lands in
//! a live mapping or is refused; none touches unmapped memory.

mod common;

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use pci_model::{DeviceIo, PciDevice, RxRefusal};
use vfio_user_server::Limits;

const IOVA: u64 = 0x4000_0000;
const SIZE: u64 = 1 << 20;

/// Writes 64 KiB at IOVA on every poll, spanning the whole range it can.
#[derive(Default)]
struct Hammer {
    ok: u64,
    refused: u64,
}

impl PciDevice for Hammer {
    stub_pci_basics!(0x00f1, 0xff0000);
    fn bar_write(&mut self, _: u8, _: u64, _: &[u8], _: &mut DeviceIo<'_>) {}
    fn poll(&mut self, io: &mut DeviceIo<'_>) {
        let buf = vec![0xee; 64 * 1024];
        for i in 0..(SIZE / buf.len() as u64) {
            match io.dma.write(IOVA + i * buf.len() as u64, &buf) {
                Ok(()) => self.ok += 1,
                Err(_) => self.refused += 1,
            }
        }
        // interrupts requested with no MSI-X are counted, not fatal
        io.irqs.push(0);
    }
    fn receive(
        &mut self,
        _: &[u8],
        _view: &pci_model::ParsedFrame,
        _: &mut DeviceIo<'_>,
    ) -> Result<(), RxRefusal> {
        Err(RxRefusal::NotReady)
    }
    fn reset(&mut self) {}
}

#[test]
fn device_dma_racing_unmap() {
    let s = TestServer::start(Hammer::default(), Limits::default());
    let mut c = s.client();
    c.region_write(7, 4, &6u16.to_le_bytes()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let h = s.handle.clone();
    let st = stop.clone();
    let hammer = std::thread::spawn(move || {
        while !st.load(Ordering::Relaxed) {
            h.poll();
        }
    });
    // At least 500 ms and 20 rounds: on a loaded 2-CPU machine a round can
    // take far longer than its 200 us sleep (the cap keeps a wedged server
    // from hanging the test; the asserts below then say what happened).
    let start = Instant::now();
    let mut rounds = 0;
    while (start.elapsed() < Duration::from_millis(500) || rounds < 20)
        && start.elapsed() < Duration::from_secs(20)
    {
        // a fresh memfd each time, closed right after the unmap: any access
        // after the unmap would fault on the munmapped range
        let ram = memfd(SIZE);
        c.dma_map(0, IOVA, SIZE, ram.as_raw_fd()).unwrap();
        std::thread::sleep(Duration::from_micros(200));
        c.dma_unmap(IOVA, SIZE).unwrap();
        drop(ram);
        rounds += 1;
    }
    stop.store(true, Ordering::Relaxed);
    hammer.join().unwrap();
    let (ok, refused) = s.handle.with_device(|d| (d.ok, d.refused));
    assert!(rounds > 10, "rounds {rounds}");
    assert!(ok > 0, "no access landed");
    assert!(refused > 0, "no access refused");
    let stats = s.handle.stats();
    assert_eq!(stats.dma_refused, refused);
    assert!(stats.bad_vector > 0);
    assert_eq!(s.handle.dma_regions(), 0);
}

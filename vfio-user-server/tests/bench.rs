//! The driver bench's edge: device faults and the link reach the model
//! through the handle (and what they raise goes out), and the device trace
//! carries the edge's records (register accesses with names, interrupts,
//! DMA, resets) and the model's, only while it runs.

mod common;

use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};

use common::*;
use pci_model::{
    BarInfo, DeviceIo, FaultError, FaultSpec, FaultStatus, MsixInfo, PciDevice, PciIdentity,
    RxRefusal, TraceKind, TraceRecord,
};
use vfio_user_server::probe::{self, reg, ProbeDevice};
use vfio_user_server::{Limits, TraceSink};

const BAR0: u32 = 0;
const IOVA: u64 = 0x1_0000_0000;
const RAM: u64 = 1 << 20;

/// The probe device with a fault table: kind `irq` raises vector 2 at once
/// (an immediate fault), kind `later` waits; `set_link` raises vector 3.
struct Faulty {
    probe: ProbeDevice,
    rules: Vec<FaultStatus>,
    link_up: bool,
}

impl PciDevice for Faulty {
    fn identity(&self) -> PciIdentity {
        self.probe.identity()
    }
    fn bars(&self) -> Vec<BarInfo> {
        self.probe.bars()
    }
    fn msix(&self) -> Option<MsixInfo> {
        self.probe.msix()
    }
    fn bar_read(&mut self, bar: u8, offset: u64, data: &mut [u8], io: &mut DeviceIo<'_>) {
        self.probe.bar_read(bar, offset, data, io)
    }
    fn bar_write(&mut self, bar: u8, offset: u64, data: &[u8], io: &mut DeviceIo<'_>) {
        if offset == reg::DOORBELL {
            io.trace(TraceKind::Doorbell, || "probe doorbell".into());
        }
        self.probe.bar_write(bar, offset, data, io)
    }
    fn poll(&mut self, io: &mut DeviceIo<'_>) {
        self.probe.poll(io)
    }
    fn receive(
        &mut self,
        frame: &[u8],
        view: &pci_model::ParsedFrame,
        io: &mut DeviceIo<'_>,
    ) -> Result<(), RxRefusal> {
        self.probe.receive(frame, view, io)
    }
    fn reset(&mut self) {
        self.probe.reset()
    }
    fn register_name(&self, bar: u8, offset: u64) -> Option<&'static str> {
        self.probe.register_name(bar, offset)
    }
    fn add_fault(
        &mut self,
        id: u32,
        spec: &FaultSpec,
        io: &mut DeviceIo<'_>,
    ) -> Result<(), FaultError> {
        let hits = match spec.kind.as_str() {
            "irq" => {
                io.irqs.push(2);
                io.trace(TraceKind::Fault, || format!("rule {id} irq"));
                1
            }
            "later" => 0,
            k => {
                return Err(FaultError::UnknownKind {
                    kind: k.into(),
                    known: "irq, later".into(),
                })
            }
        };
        self.rules.push(FaultStatus {
            id,
            kind: spec.kind.clone(),
            hits,
            matched: hits,
            count: 1,
            params: String::new(),
            prob: 1.0,
            seed: u64::from(id),
            spent: hits == 1,
        });
        Ok(())
    }
    fn clear_faults(&mut self, id: Option<u32>, _: &mut DeviceIo<'_>) -> Result<(), FaultError> {
        match id {
            None => self.rules.clear(),
            Some(id) => {
                let before = self.rules.len();
                self.rules.retain(|r| r.id != id);
                if self.rules.len() == before {
                    return Err(FaultError::NoSuchRule(id));
                }
            }
        }
        Ok(())
    }
    fn faults(&self) -> Vec<FaultStatus> {
        self.rules.clone()
    }
    fn set_link(&mut self, up: bool, io: &mut DeviceIo<'_>) -> bool {
        self.link_up = up;
        io.irqs.push(3);
        true
    }
}

fn faulty() -> TestServer<Faulty> {
    TestServer::start(
        Faulty {
            probe: ProbeDevice::new(),
            rules: Vec::new(),
            link_up: true,
        },
        Limits::default(),
    )
}

#[derive(Default)]
struct Collect(Mutex<Vec<TraceRecord>>);

impl TraceSink for Collect {
    fn records(&self, records: Vec<TraceRecord>) {
        assert!(!records.is_empty(), "empty batch");
        self.0.lock().unwrap().extend(records);
    }
}

impl Collect {
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap())
            .iter()
            .map(|r| r.to_string())
            .collect()
    }
}

#[test]
fn faults_and_link_reach_the_model_and_raise_their_interrupts() {
    let s = faulty();
    let mut c = s.client();
    let (ev2, ev3) = (eventfd(), eventfd());
    set_vector(&mut c, 2, &ev2);
    set_vector(&mut c, 3, &ev3);
    s.handle.add_fault(1, &FaultSpec::new("irq")).unwrap();
    assert_eq!(take_events(&ev2), 1, "the immediate fault's interrupt");
    s.handle.add_fault(7, &FaultSpec::new("later")).unwrap();
    let e = s.handle.add_fault(8, &FaultSpec::new("nope")).unwrap_err();
    assert!(matches!(e, FaultError::UnknownKind { .. }), "{e}");
    let listed: Vec<(u32, u64)> = s.handle.faults().iter().map(|r| (r.id, r.hits)).collect();
    assert_eq!(listed, [(1, 1), (7, 0)]);
    s.handle.clear_faults(Some(1)).unwrap();
    assert_eq!(
        s.handle.clear_faults(Some(1)),
        Err(FaultError::NoSuchRule(1))
    );
    s.handle.clear_faults(None).unwrap();
    assert!(s.handle.faults().is_empty());
    assert!(s.handle.set_link(false));
    assert!(!s.handle.with_device(|d| d.link_up));
    assert_eq!(take_events(&ev3), 1, "the link change's interrupt");
}

/// A device without fault support answers with the trait's defaults.
#[test]
fn a_device_without_faults_says_so() {
    let s = TestServer::start(ProbeDevice::new(), Limits::default());
    assert_eq!(
        s.handle.add_fault(1, &FaultSpec::new("irq")),
        Err(FaultError::Unsupported)
    );
    assert!(s.handle.fault_kinds().is_empty());
    assert!(!s.handle.set_link(false));
}

#[test]
fn the_trace_has_registers_irqs_dma_resets_and_the_models_records() {
    let s = faulty();
    let mut c = s.client();
    let ram = memfd(RAM);
    let ev = eventfd();
    set_vector(&mut c, 1, &ev);
    // Untraced: nothing recorded, and the model is told so.
    let sink = Arc::new(Collect::default());
    assert_eq!(read32(&mut c, BAR0, reg::MAGIC), probe::MAGIC);
    assert!(!s.handle.is_tracing());
    s.handle.set_trace(Some(sink.clone()));
    assert!(s.handle.is_tracing());
    c.dma_map(0, IOVA, RAM, ram.as_raw_fd()).unwrap();
    enable_bus_master(&mut c);
    write32(&mut c, BAR0, reg::ADDR_LO, 0x1000);
    write32(&mut c, BAR0, reg::ADDR_HI, (IOVA >> 32) as u32);
    write32(&mut c, BAR0, reg::LEN, 16);
    write32(&mut c, BAR0, reg::VECTOR, 1);
    write32(&mut c, BAR0, reg::DOORBELL, probe::CMD_FILL);
    assert_eq!(read32(&mut c, BAR0, reg::STATUS), 1);
    assert_eq!(read32(&mut c, BAR0, 0x800), 0, "an unnamed register");
    s.handle.add_fault(3, &FaultSpec::new("irq")).unwrap();
    c.dma_unmap(IOVA, RAM).unwrap();
    s.handle.reset_device();
    let lines = sink.take();
    let has = |kind: &str, text: &str| {
        lines
            .iter()
            .any(|l| l.split_whitespace().nth(1) == Some(kind) && l.contains(text))
    };
    assert!(
        has("dma", &format!("map iova={IOVA:#x} size={RAM:#x} r w")),
        "{lines:#?}"
    );
    assert!(has("wr", "bar0+0x8 ADDR_LO = 0x00001000"), "{lines:#?}");
    assert!(has("wr", "bar0+0x1c DOORBELL = 0x00000001"), "{lines:#?}");
    assert!(has("db", "probe doorbell"), "{lines:#?}");
    assert!(has("irq", "msi-x vector 1"), "{lines:#?}");
    assert!(has("rd", "bar0+0x4 STATUS = 0x00000001"), "{lines:#?}");
    assert!(has("rd", "bar0+0x800 = 0x00000000"), "{lines:#?}");
    assert!(has("fault", "rule 3 irq"), "{lines:#?}");
    assert!(has("irq", "msi-x vector 2"), "{lines:#?}");
    assert!(has("dma", "unmap"), "{lines:#?}");
    assert!(has("reset", "device reset (daemon recovery)"), "{lines:#?}");
    assert!(
        !lines.iter().any(|l| l.contains("MAGIC")),
        "read before the trace"
    );
    // The write comes before the doorbell work it starts, which comes
    // before its interrupt.
    let pos = |t: &str| lines.iter().position(|l| l.contains(t)).unwrap();
    assert!(pos("DOORBELL") < pos("probe doorbell"));
    assert!(pos("probe doorbell") < pos("msi-x vector 1"));
    // Stopped: nothing more.
    s.handle.set_trace(None);
    assert_eq!(read32(&mut c, BAR0, reg::MAGIC), probe::MAGIC);
    s.handle.reset_device();
    assert!(sink.take().is_empty());
    assert!(!s.handle.is_tracing());
    let st = s.handle.stats();
    assert_eq!((st.irqs_fired, st.irqs_pending), (1, 1), "{st:?}");
    assert_eq!(take_events(&ev), 1);
}

//! The daemon's side of a device beyond single frames: a burst of frames
//! under one lock (`DeviceHandle::receive_burst`), a sink that takes each
//! call's frames at once and pauses the model's TX when full, and the
//! daemon's own reset of the model.

use std::os::unix::net::UnixListener;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use pci_model::{BarInfo, DeviceIo, Frame, MsixInfo, PciDevice, PciIdentity, RxRefusal};
use vfio_user_server::{FrameSink, Limits, SinkState, VfioUserServer};

type Log = Arc<Mutex<Vec<String>>>;

/// Records what the edge asks of it. Queue of a frame: its first byte;
/// queue 9 has no buffers. Each poll sends one frame unless paused; the
/// end of a burst sends one more.
struct Recorder {
    log: Log,
}

impl Recorder {
    fn note(&self, s: String) {
        self.log.lock().unwrap().push(s);
    }
}

impl PciDevice for Recorder {
    fn identity(&self) -> PciIdentity {
        PciIdentity {
            vendor_id: 0x1b36,
            device_id: 0x00f2,
            subsystem_vendor_id: 0,
            subsystem_id: 0,
            class_code: 0xff0000,
            revision: 0,
        }
    }
    fn bars(&self) -> Vec<BarInfo> {
        vec![BarInfo {
            index: 0,
            size: 0x1000,
            is_64bit: false,
            prefetchable: false,
        }]
    }
    fn msix(&self) -> Option<MsixInfo> {
        None
    }
    fn bar_read(&mut self, _: u8, _: u64, data: &mut [u8], _: &mut DeviceIo<'_>) {
        data.fill(0);
    }
    fn bar_write(&mut self, _: u8, _: u64, _: &[u8], _: &mut DeviceIo<'_>) {}
    fn poll(&mut self, io: &mut DeviceIo<'_>) {
        if io.tx_paused {
            self.note("poll paused".into());
        } else {
            self.note("poll".into());
            io.tx.push(b"tx".to_vec());
        }
    }
    fn receive(&mut self, frame: &[u8], _: &mut DeviceIo<'_>) -> Result<(), RxRefusal> {
        self.note(format!("rx {}", frame[0]));
        if frame[0] == 9 {
            return Err(RxRefusal::NoBuffers);
        }
        Ok(())
    }
    fn rx_queue(&self, frame: &[u8]) -> usize {
        usize::from(frame[0])
    }
    fn begin_rx_burst(&mut self) {
        self.note("begin".into());
    }
    fn end_rx_burst(&mut self, io: &mut DeviceIo<'_>) {
        self.note("end".into());
        io.tx.push(b"held".to_vec());
    }
    fn reset(&mut self) {
        self.note("reset".into());
    }
}

/// Keeps each call's frames together; full on its first call only.
struct Calls(Arc<Mutex<Vec<Vec<Frame>>>>);

impl FrameSink for Calls {
    fn send(&mut self, frames: Vec<Frame>) -> SinkState {
        let mut c = self.0.lock().unwrap();
        c.push(frames);
        if c.len() == 1 {
            SinkState::Full
        } else {
            SinkState::Ready
        }
    }
}

#[test]
fn burst_under_one_call_sink_pause_and_daemon_reset() {
    let dir = tempfile::tempdir().unwrap();
    let listener = UnixListener::bind(dir.path().join("d.sock")).unwrap();
    let log = Log::default();
    let calls = Arc::new(Mutex::new(Vec::new()));
    let server = VfioUserServer::from_listener_with_sink(
        listener,
        Recorder { log: log.clone() },
        Calls(calls.clone()),
        Limits::default(),
    )
    .unwrap();
    let h = server.handle();
    let taken = |l: &Log| std::mem::take(&mut *l.lock().unwrap());

    // One burst: begin, the frames, end, one poll; the frames of the whole
    // call reach the sink in one send, in order.
    let refused = h.receive_burst(Instant::now(), |b| {
        assert_eq!(b.rx_queue(&[3]), 3, "the model's steering answers");
        assert_eq!(b.receive(&[1]), Ok(()));
        b.receive(&[9])
    });
    assert_eq!(refused, Err(RxRefusal::NoBuffers));
    assert_eq!(taken(&log), ["begin", "rx 1", "rx 9", "end", "poll"]);
    assert_eq!(
        *calls.lock().unwrap(),
        vec![vec![b"held".to_vec(), b"tx".to_vec()]]
    );
    assert_eq!(h.stats().frames_out, 2);

    // The sink answered full: the next call tells the model, until the
    // daemon resumes TX.
    assert!(h.tx_paused());
    h.poll_at(Instant::now());
    assert_eq!(taken(&log), ["poll paused"]);
    h.resume_tx();
    assert!(!h.tx_paused());
    h.poll();
    assert_eq!(taken(&log), ["poll"]);
    assert!(!h.tx_paused(), "the sink said ready");

    // The daemon's reset reaches the model and is counted.
    h.reset_device();
    assert_eq!(taken(&log), ["reset"]);
    assert_eq!(h.stats().resets, 1);
}

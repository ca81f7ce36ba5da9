//! The daemon's side of a device beyond single frames: a burst of frames
//! under one lock (`DeviceHandle::receive_burst`), a sink that takes each
//! call's frames at once and pauses the model's TX when full, and the
//! daemon's own reset of the model.

mod common;

use std::os::unix::net::UnixListener;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use common::stub_pci_basics;
use pci_model::{DeviceIo, Frame, PciDevice, RxRefusal};
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
    stub_pci_basics!(0x00f2, 0xff0000);
    fn bar_write(&mut self, _: u8, _: u64, _: &[u8], _: &mut DeviceIo<'_>) {}
    fn poll(&mut self, io: &mut DeviceIo<'_>) {
        if io.tx_paused {
            self.note("poll paused".into());
        } else {
            self.note("poll".into());
            io.tx.push(b"tx".to_vec());
        }
    }
    fn receive(
        &mut self,
        frame: &[u8],
        _view: &pci_model::ParsedFrame,
        _: &mut DeviceIo<'_>,
    ) -> Result<(), RxRefusal> {
        self.note(format!("rx {}", frame[0]));
        if frame[0] == 9 {
            return Err(RxRefusal::NoBuffers);
        }
        Ok(())
    }
    fn rx_queue(&self, frame: &[u8], _view: &pci_model::ParsedFrame) -> usize {
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
        // (One-byte frames: their view is empty.)
        let v = pci_model::ParsedFrame::default();
        assert_eq!(b.rx_queue(&[3], &v), 3, "the model's steering answers");
        assert_eq!(b.receive(&[1], &v), Ok(()));
        b.receive(&[9], &v)
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

/// A model that arms a timer on a doorbell: whoever sleeps until the last
/// deadline it saw is told when a call brings it forward, not when it
/// stays or goes later.
#[test]
fn an_earlier_deadline_wakes_the_timer_thread() {
    /// The deadline, and the base a doorbell's seconds count from.
    struct Timer(Option<Instant>, Instant);
    impl PciDevice for Timer {
        stub_pci_basics!(0x00f2, 0xff0000);
        /// The value written is the deadline in seconds (0: none).
        fn bar_write(&mut self, _: u8, _: u64, d: &[u8], _: &mut DeviceIo<'_>) {
            self.0 = (d[0] > 0).then(|| self.1 + std::time::Duration::from_secs(u64::from(d[0])));
        }
        fn poll(&mut self, _: &mut DeviceIo<'_>) {}
        fn receive(
            &mut self,
            _: &[u8],
            _view: &pci_model::ParsedFrame,
            _: &mut DeviceIo<'_>,
        ) -> Result<(), RxRefusal> {
            Ok(())
        }
        fn next_timeout(&self, _now: Instant) -> Option<Instant> {
            self.0
        }
        fn reset(&mut self) {}
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.sock");
    let server = VfioUserServer::bind(
        &path,
        Timer(None, Instant::now()),
        |_| {},
        Limits::default(),
    )
    .unwrap();
    let h = server.handle();
    let wakes = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let w = wakes.clone();
    h.on_earlier_deadline(move || {
        w.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    });
    let thread = std::thread::spawn(move || server.run());
    let mut c = vfio_user::Client::new(&path).unwrap();
    let n = || wakes.load(std::sync::atomic::Ordering::SeqCst);
    // Armed at 9 s: a wake. Later (12 s) or the same: none. Earlier: one.
    for (secs, want) in [(9u8, 1), (12, 1), (12, 1), (3, 2), (0, 2), (5, 3)] {
        c.region_write(0, 0, &[secs, 0, 0, 0]).unwrap();
        assert_eq!(n(), want, "after a deadline of {secs} s");
    }
    // The daemon's own calls wake nobody (it looks at the deadline after
    // them) but keep the deadline it saw: one it polled away and a later
    // doorbell arms again is earlier than none.
    h.with_device(|d| d.0 = None);
    h.poll();
    assert_eq!(n(), 3);
    c.region_write(0, 0, &[5, 0, 0, 0]).unwrap();
    assert_eq!(n(), 4, "a timer armed after the daemon's poll cleared it");
    drop(c);
    h.stop();
    thread.join().unwrap().unwrap();
}

//! The device trace of a device port (`ctl trace`, issue 25): every
//! driver/device interaction the edge and the model record, one line each:
//! the port's name, then [`pci_model::TraceRecord`]'s text
//! (`g 12.000345 rd bar0+0x0 DEVICE_STATUS = 0x00000001`).
//!
//! Where the lines go, none of which ever blocks the device:
//! * a ring of the last [`RING_RECORDS`] lines (`ctl trace show`, and the
//!   backlog a follower gets first);
//! * with `--file`, a new file in the capture directory, through a bounded
//!   queue ([`WRITER_QUEUE`] lines) to a writer thread: lines that find the
//!   queue full are dropped, counted (`dropped`); the file stops at
//!   `[limits] trace-max-bytes` ([`DEFAULT_TRACE_MAX_BYTES`]), later lines
//!   counted in `limited` and `file_full` set;
//! * each `ctl trace --follow` client, through a queue of its own
//!   ([`FOLLOW_QUEUE`] lines): a slow follower loses lines, counted
//!   (`follower_dropped`).
//!
//! The model is told to trace (`DeviceIo::tracing`) while a trace was
//! started or a follower listens; otherwise tracing costs one atomic load
//! per device call.

use pci_model::TraceRecord;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;
use vfio_user_server::TraceSink;

/// Lines the in-memory ring keeps.
pub const RING_RECORDS: usize = 4096;
/// Lines queued towards one follower at most.
pub const FOLLOW_QUEUE: usize = 4096;
/// Lines queued towards the file writer at most.
pub const WRITER_QUEUE: usize = 16384;
pub use crate::config::DEFAULT_TRACE_MAX_BYTES;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A port's trace, as `ctl status` and `ctl trace` show it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceStatus {
    /// A trace was started (`ctl trace start`) and not stopped.
    pub running: bool,
    /// The trace file of the running (or last) trace, if it had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// Records the trace saw since it started.
    pub records: u64,
    /// Lines written to the file.
    pub written: u64,
    /// Bytes written to the file.
    pub bytes: u64,
    /// Lines not written because the writer fell behind (queue full).
    pub dropped: u64,
    /// Lines not written because the file reached `max_bytes`.
    pub limited: u64,
    /// The file reached `max_bytes` and takes no more lines.
    pub file_full: bool,
    /// The file's bound (`[limits] trace-max-bytes`).
    pub max_bytes: u64,
    /// `ctl trace --follow` clients now.
    pub followers: usize,
    /// Lines followers lost (their queue was full).
    pub follower_dropped: u64,
    /// Lines in the ring.
    pub ring: usize,
    /// The first write error, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Why a trace did not start or stop.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// One trace per port at a time.
    #[error("a trace of port {0} runs already; stop it first")]
    Running(String),
    /// `stop` without a trace.
    #[error("no trace of port {0} runs")]
    NotRunning(String),
    /// A trace file without `--capture-dir`.
    #[error("trace files need the daemon's --capture-dir (or capture-dir in its config file); without it use ctl trace start without --file and ctl trace show/--follow")]
    NoCaptureDir,
    /// An absolute (or otherwise not plain) trace file name.
    #[error("{0}: a trace file is a plain name, created in the capture directory")]
    NotRelative(PathBuf),
    /// The file was refused or could not be created.
    #[error(transparent)]
    File(#[from] crate::capture::CaptureFileError),
    /// The writer thread could not be started.
    #[error("trace writer thread: {0}")]
    Thread(std::io::Error),
}

#[derive(Default)]
struct FileCounters {
    written: AtomicU64,
    bytes: AtomicU64,
    limited: AtomicU64,
    full: AtomicBool,
    error: Mutex<Option<String>>,
}

struct TapInner {
    ring: VecDeque<String>,
    file: Option<SyncSender<String>>,
    followers: Vec<(u64, SyncSender<String>)>,
    next_follower: u64,
}

/// The sink the device's edge hands records to.
struct Tap {
    port: String,
    inner: Mutex<TapInner>,
    records: AtomicU64,
    dropped: AtomicU64,
    follower_dropped: AtomicU64,
}

impl TraceSink for Tap {
    fn records(&self, records: Vec<TraceRecord>) {
        let mut g = lock(&self.inner);
        let g = &mut *g;
        self.records.fetch_add(records.len() as u64, Relaxed);
        for r in records {
            let line = format!("{} {}", self.port, r);
            if let Some(tx) = &g.file {
                if let Err(TrySendError::Full(_)) = tx.try_send(line.clone()) {
                    self.dropped.fetch_add(1, Relaxed);
                }
            }
            g.followers.retain(|(_, f)| match f.try_send(line.clone()) {
                Ok(()) => true,
                Err(TrySendError::Full(_)) => {
                    self.follower_dropped.fetch_add(1, Relaxed);
                    true
                }
                Err(TrySendError::Disconnected(_)) => false,
            });
            if g.ring.len() >= RING_RECORDS {
                g.ring.pop_front();
            }
            g.ring.push_back(line);
        }
    }
}

struct Run {
    started: bool,
    file: Option<PathBuf>,
    writer: Option<JoinHandle<()>>,
    counters: Arc<FileCounters>,
    max_bytes: u64,
    followers: usize,
}

/// Turns the device's trace on (a sink) or off (`None`).
pub type SetTrace = Box<dyn Fn(Option<Arc<dyn TraceSink>>) + Send + Sync>;

/// The trace state of one device port.
pub struct PortTrace {
    tap: Arc<Tap>,
    run: Mutex<Run>,
    set: SetTrace,
}

/// A live `ctl trace --follow`: the lines the ring held when it began, then
/// the live ones. Dropping it ends the follow.
pub struct Follower<'a> {
    trace: &'a PortTrace,
    id: u64,
    /// The ring's lines when the follow began.
    pub backlog: Vec<String>,
    /// The live lines.
    pub rx: Receiver<String>,
}

impl Drop for Follower<'_> {
    fn drop(&mut self) {
        self.trace.unfollow(self.id);
    }
}

impl PortTrace {
    /// The trace of `port`; `set` turns the device's tracing on and off.
    pub fn new(port: &str, set: SetTrace) -> Self {
        PortTrace {
            tap: Arc::new(Tap {
                port: port.to_string(),
                inner: Mutex::new(TapInner {
                    ring: VecDeque::new(),
                    file: None,
                    followers: Vec::new(),
                    next_follower: 0,
                }),
                records: AtomicU64::new(0),
                dropped: AtomicU64::new(0),
                follower_dropped: AtomicU64::new(0),
            }),
            run: Mutex::new(Run {
                started: false,
                file: None,
                writer: None,
                counters: Arc::default(),
                max_bytes: DEFAULT_TRACE_MAX_BYTES,
                followers: 0,
            }),
            set,
        }
    }

    fn refresh(&self, run: &Run) {
        if run.started || run.followers > 0 {
            (self.set)(Some(self.tap.clone() as Arc<dyn TraceSink>));
        } else {
            (self.set)(None);
        }
    }

    /// Starts a trace: the ring is emptied, and the file `open` gives (if
    /// any) gets every line until `stop` or `max_bytes`.
    pub fn start(
        &self,
        open: impl FnOnce() -> Result<Option<(File, PathBuf)>, TraceError>,
        max_bytes: u64,
    ) -> Result<TraceStatus, TraceError> {
        let mut run = lock(&self.run);
        if run.started {
            return Err(TraceError::Running(self.tap.port.clone()));
        }
        let file = open()?;
        let counters = Arc::new(FileCounters::default());
        let (writer, tx, path) = match file {
            Some((f, path)) => {
                let (tx, rx) = sync_channel(WRITER_QUEUE);
                let c = counters.clone();
                let t = std::thread::Builder::new()
                    .name(format!("trace-{}", self.tap.port))
                    .spawn(move || write_lines(rx, f, &c, max_bytes))
                    .map_err(TraceError::Thread)?;
                (Some(t), Some(tx), Some(path))
            }
            None => (None, None, None),
        };
        {
            let mut g = lock(&self.tap.inner);
            g.ring.clear();
            g.file = tx;
        }
        self.tap.records.store(0, Relaxed);
        self.tap.dropped.store(0, Relaxed);
        run.started = true;
        run.file = path;
        run.writer = writer;
        run.counters = counters;
        run.max_bytes = max_bytes;
        self.refresh(&run);
        Ok(self.status_of(&run))
    }

    /// Stops the trace: the file is flushed and closed; the ring stays
    /// for `ctl trace show`.
    pub fn stop(&self) -> Result<TraceStatus, TraceError> {
        let mut run = lock(&self.run);
        if !run.started {
            return Err(TraceError::NotRunning(self.tap.port.clone()));
        }
        run.started = false;
        self.refresh(&run);
        lock(&self.tap.inner).file = None;
        if let Some(t) = run.writer.take() {
            let _ = t.join();
        }
        Ok(self.status_of(&run))
    }

    /// Starts following: the ring's lines, then every new line (tracing
    /// on while any follower listens).
    pub fn follow(&self) -> Follower<'_> {
        let mut run = lock(&self.run);
        let (tx, rx) = sync_channel(FOLLOW_QUEUE);
        let (id, backlog) = {
            let mut g = lock(&self.tap.inner);
            let id = g.next_follower;
            g.next_follower += 1;
            g.followers.push((id, tx));
            (id, g.ring.iter().cloned().collect())
        };
        run.followers += 1;
        self.refresh(&run);
        Follower {
            trace: self,
            id,
            backlog,
            rx,
        }
    }

    fn unfollow(&self, id: u64) {
        let mut run = lock(&self.run);
        lock(&self.tap.inner).followers.retain(|(i, _)| *i != id);
        run.followers = run.followers.saturating_sub(1);
        self.refresh(&run);
    }

    /// The ring's lines, oldest first.
    pub fn lines(&self) -> Vec<String> {
        lock(&self.tap.inner).ring.iter().cloned().collect()
    }

    /// The running (or last) trace's state and counters.
    pub fn status(&self) -> TraceStatus {
        self.status_of(&lock(&self.run))
    }

    fn status_of(&self, run: &Run) -> TraceStatus {
        let c = &run.counters;
        TraceStatus {
            running: run.started,
            file: run.file.as_ref().map(|p| p.display().to_string()),
            records: self.tap.records.load(Relaxed),
            written: c.written.load(Relaxed),
            bytes: c.bytes.load(Relaxed),
            dropped: self.tap.dropped.load(Relaxed),
            limited: c.limited.load(Relaxed),
            file_full: c.full.load(Relaxed),
            max_bytes: run.max_bytes,
            followers: run.followers,
            follower_dropped: self.tap.follower_dropped.load(Relaxed),
            ring: lock(&self.tap.inner).ring.len(),
            error: lock(&c.error).clone(),
        }
    }
}

impl Drop for PortTrace {
    fn drop(&mut self) {
        lock(&self.tap.inner).file = None;
        if let Some(t) = lock(&self.run).writer.take() {
            let _ = t.join();
        }
    }
}

/// The writer thread: lines until the trace stops, at most `max` bytes,
/// flushed at least every 200 ms.
fn write_lines(rx: Receiver<String>, f: File, c: &FileCounters, max: u64) {
    let mut w = BufWriter::new(f);
    let fail = |e: std::io::Error| {
        lock(&c.error).get_or_insert_with(|| e.to_string());
    };
    loop {
        let line = match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(l) => l,
            Err(RecvTimeoutError::Timeout) => {
                if let Err(e) = w.flush() {
                    fail(e);
                }
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => break,
        };
        let n = line.len() as u64 + 1;
        if c.full.load(Relaxed) || c.bytes.load(Relaxed) + n > max {
            if !c.full.swap(true, Relaxed) {
                tracing::warn!(
                    max,
                    "trace file full ([limits] trace-max-bytes); later lines not written"
                );
            }
            c.limited.fetch_add(1, Relaxed);
            continue;
        }
        if lock(&c.error).is_some() {
            continue;
        }
        match w
            .write_all(line.as_bytes())
            .and_then(|()| w.write_all(b"\n"))
        {
            Ok(()) => {
                c.bytes.fetch_add(n, Relaxed);
                c.written.fetch_add(1, Relaxed);
            }
            Err(e) => fail(e),
        }
    }
    if let Err(e) = w.flush() {
        fail(e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pci_model::TraceKind;

    fn rec(i: u64) -> TraceRecord {
        TraceRecord {
            at: Duration::from_micros(i),
            kind: TraceKind::RegRead,
            text: format!("bar0+0x0 X = {i:#x}"),
        }
    }

    type Installed = Arc<Mutex<Option<Arc<dyn TraceSink>>>>;

    fn trace() -> (PortTrace, Installed) {
        let sink: Installed = Arc::default();
        let s = sink.clone();
        (
            PortTrace::new("g", Box::new(move |t| *s.lock().unwrap() = t)),
            sink,
        )
    }

    fn feed(sink: &Mutex<Option<Arc<dyn TraceSink>>>, n: u64) {
        if let Some(s) = sink.lock().unwrap().as_ref() {
            for i in 0..n {
                s.records(vec![rec(i)]);
            }
        }
    }

    #[test]
    fn ring_file_bound_and_tracing_switch() {
        let dir = std::env::temp_dir().join(format!("vhost-rdma-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (t, sink) = trace();
        assert!(sink.lock().unwrap().is_none(), "no tracing before start");
        let path = dir.join("t.log");
        let _ = std::fs::remove_file(&path);
        let f = File::create(&path).unwrap();
        let st = t.start(|| Ok(Some((f, path.clone()))), 200).unwrap();
        assert!(st.running && sink.lock().unwrap().is_some());
        assert!(matches!(
            t.start(|| Ok(None), 200),
            Err(TraceError::Running(_))
        ));
        feed(&sink, 100);
        let st = t.stop().unwrap();
        assert!(sink.lock().unwrap().is_none(), "tracing off after stop");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.len() <= 200, "{}", text.len());
        let first: Vec<&str> = text.lines().next().unwrap().split_whitespace().collect();
        assert_eq!(
            first,
            ["g", "0.000000", "rd", "bar0+0x0", "X", "=", "0x0"],
            "{text}"
        );
        assert!(st.file_full);
        assert_eq!(st.records, 100);
        assert_eq!(st.written + st.limited + st.dropped, 100);
        assert_eq!(st.bytes, text.len() as u64);
        assert!(st.limited > 0);
        assert_eq!(t.lines().len(), 100, "the ring keeps them");
        assert!(matches!(t.stop(), Err(TraceError::NotRunning(_))));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_ring_is_bounded_and_followers_lose_what_they_do_not_take() {
        let (t, sink) = trace();
        t.start(|| Ok(None), 1 << 20).unwrap();
        feed(&sink, RING_RECORDS as u64 + 10);
        assert_eq!(t.lines().len(), RING_RECORDS);
        assert!(t.lines()[0].ends_with("0xa"), "oldest dropped first");
        t.stop().unwrap();
        // A follower alone turns tracing on, and off when it goes.
        let f = t.follow();
        assert_eq!(f.backlog.len(), RING_RECORDS);
        assert!(sink.lock().unwrap().is_some());
        feed(&sink, FOLLOW_QUEUE as u64 + 5);
        assert_eq!(f.rx.try_iter().count(), FOLLOW_QUEUE);
        assert_eq!(t.status().follower_dropped, 5);
        assert_eq!(t.status().followers, 1);
        drop(f);
        assert!(sink.lock().unwrap().is_none());
        assert_eq!(t.status().followers, 0);
    }
}

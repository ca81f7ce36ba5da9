//! Captures (issue 6): pcapng of one port or of the whole fabric, started
//! and stopped at runtime.
//!
//! One interface (IDB) per captured port, named after the port, link type
//! Ethernet, nanosecond timestamps. Each frame is an Enhanced Packet Block
//! whose `epb_flags` give the direction as the fabric's port sees it:
//! inbound = the guest sent it (fault *ingress*), outbound = towards the
//! guest (fault *egress*). Ingress frames are recorded as the guest sent them
//! (before faults), egress frames as the guest gets them (after faults and
//! offload finishing).
//!
//! The data path never blocks on the file: records go through a bounded
//! channel to a writer thread; when it is full the record is dropped and
//! counted.
//!
//! Files come from the control socket, so whoever reaches it could otherwise
//! make the daemon (often root) overwrite any file. Captures therefore go
//! only into the capture directory fixed at start (`--capture-dir`), as a new
//! file named directly in it: never an existing file, never through a
//! symlink, never elsewhere ([`open_new_capture_file`]).
//!
//! `wire::capture` reads captures back (`vhost-rdma check-capture`).

use crate::frame::Dir;
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::mpsc::{sync_channel, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use wire::capture::pcapng;

/// Records queued towards the writer thread at most.
pub const CHANNEL_RECORDS: usize = 4096;
/// Largest frame length a capture keeps (also the default snap length).
pub const MAX_SNAPLEN: u32 = 65535 + 14;

/// State and counters of the current (or last) capture.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureStatus {
    pub running: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// Captured ports (interface order).
    pub ports: Vec<String>,
    pub snaplen: u32,
    /// Frames written.
    pub records: u64,
    /// Bytes written to the file.
    pub bytes: u64,
    /// Records dropped because the writer fell behind (channel full).
    pub dropped: u64,
    /// Records dropped because the file reached `[limits] capture-max-bytes`.
    #[serde(default)]
    pub limited: u64,
    /// The first write error, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

struct Rec {
    iface: u32,
    ts_ns: u64,
    flags: u32,
    orig_len: u32,
    data: Vec<u8>,
}

#[derive(Debug, Default)]
struct Counters {
    records: AtomicU64,
    bytes: AtomicU64,
    dropped: AtomicU64,
    limited: AtomicU64,
    error: Mutex<Option<String>>,
}

struct Running {
    tx: SyncSender<Rec>,
    file: PathBuf,
    /// Port index -> interface id.
    ifaces: Vec<Option<u32>>,
    ports: Vec<String>,
    snaplen: u32,
    counters: Arc<Counters>,
    thread: JoinHandle<()>,
}

/// Default of `[limits] capture-max-bytes`: the largest capture file.
pub const DEFAULT_MAX_BYTES: u64 = 1 << 30;

/// Why a capture file was refused.
#[derive(Debug, thiserror::Error)]
pub enum CaptureFileError {
    /// The name is not a plain file name, nor a path directly in the directory.
    #[error("{file}: captures go only into the capture directory {dir} (--capture-dir); give a file name")]
    Outside {
        /// What was asked for.
        file: PathBuf,
        /// The capture directory.
        dir: PathBuf,
    },
    /// Something exists at that name (a file, a directory or a symlink).
    #[error("{0}: exists; a capture never replaces a file, choose a new name")]
    Exists(PathBuf),
    /// The capture directory cannot be created or read.
    #[error("capture directory {dir}: {source}")]
    Dir {
        /// The capture directory.
        dir: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// Creating the file failed for another reason.
    #[error("{file}: {source}")]
    Create {
        /// The file.
        file: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// Why a capture did not start or stop.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// The snapshot length is 0 or above [`MAX_SNAPLEN`].
    #[error("snaplen must be 1..={MAX_SNAPLEN}")]
    Snaplen,
    /// One capture at a time: this one writes into the given file.
    #[error("a capture into {0} runs already; stop it first")]
    Running(PathBuf),
    /// The file was refused or could not be created.
    #[error(transparent)]
    File(#[from] CaptureFileError),
    /// Writing the file's header failed.
    #[error("{file}: {source}")]
    Write {
        /// The capture file.
        file: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The writer thread could not be started.
    #[error("capture thread: {0}")]
    Thread(std::io::Error),
    /// `stop` without a running capture.
    #[error("no capture runs")]
    NotRunning,
}

/// The default capture directory: `captures/` under the daemon's runtime
/// directory (`$XDG_RUNTIME_DIR/vhost-rdma`, else `/run/vhost-rdma` for
/// root, else `/tmp/vhost-rdma-UID`).
pub fn default_capture_dir() -> PathBuf {
    runtime_dir().join("captures")
}

/// The daemon's runtime directory (see [`default_capture_dir`]).
pub fn runtime_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("vhost-rdma");
    }
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    if uid == 0 {
        PathBuf::from("/run/vhost-rdma")
    } else {
        PathBuf::from(format!("/tmp/vhost-rdma-{uid}"))
    }
}

/// Creates `file` as a new file in `dir`: `file` is a plain name, or a path
/// whose directory is `dir` itself (after resolving symlinks). The last
/// component is created with `O_CREAT | O_EXCL | O_NOFOLLOW`, so neither an
/// existing file nor a symlink (dangling or not) is ever opened. `dir` is
/// created (mode 0700) when missing.
pub fn open_new_capture_file(dir: &Path, file: &Path) -> Result<(File, PathBuf), CaptureFileError> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let dir_err = |source| CaptureFileError::Dir {
        dir: dir.to_path_buf(),
        source,
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(dir_err)?;
    let real_dir = dir.canonicalize().map_err(dir_err)?;
    let outside = || CaptureFileError::Outside {
        file: file.to_path_buf(),
        dir: dir.to_path_buf(),
    };
    let mut parts = file.components();
    let name = match parts.next_back() {
        Some(std::path::Component::Normal(n)) => n.to_os_string(),
        _ => return Err(outside()),
    };
    let parent = parts.as_path();
    if !parent.as_os_str().is_empty() {
        // Only a path into the capture directory itself, however spelt.
        let real_parent = if parent.is_absolute() {
            parent.canonicalize().map_err(|_| outside())?
        } else {
            return Err(outside());
        };
        if real_parent != real_dir {
            return Err(outside());
        }
    }
    let path = real_dir.join(&name);
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o640)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
    {
        Ok(f) => Ok((f, path)),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            Err(CaptureFileError::Exists(path))
        }
        Err(source) => Err(CaptureFileError::Create { file: path, source }),
    }
}

/// The fabric's capture point.
pub struct Capture {
    active: AtomicBool,
    run: RwLock<Option<Running>>,
    last: Mutex<Option<CaptureStatus>>,
    /// Largest capture file (`[limits] capture-max-bytes`).
    max_bytes: AtomicU64,
    /// Where capture files go (`--capture-dir`).
    dir: Mutex<PathBuf>,
    /// `--capture-dir` was given (device trace files need it).
    dir_given: AtomicBool,
}

impl Default for Capture {
    fn default() -> Self {
        Capture {
            active: AtomicBool::new(false),
            run: RwLock::new(None),
            last: Mutex::new(None),
            max_bytes: AtomicU64::new(DEFAULT_MAX_BYTES),
            dir: Mutex::new(default_capture_dir()),
            dir_given: AtomicBool::new(false),
        }
    }
}

impl std::fmt::Debug for Capture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Capture")
            .field("active", &self.active)
            .finish_non_exhaustive()
    }
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

impl Running {
    fn status(&self) -> CaptureStatus {
        status_of(&self.counters, true, &self.file, &self.ports, self.snaplen)
    }
}

fn status_of(
    c: &Counters,
    running: bool,
    file: &Path,
    ports: &[String],
    snaplen: u32,
) -> CaptureStatus {
    CaptureStatus {
        running,
        file: Some(file.display().to_string()),
        ports: ports.to_vec(),
        snaplen,
        records: c.records.load(Relaxed),
        bytes: c.bytes.load(Relaxed),
        limited: c.limited.load(Relaxed),
        dropped: c.dropped.load(Relaxed),
        error: c.error.lock().ok().and_then(|e| e.clone()),
    }
}

impl Capture {
    /// Sets the largest capture file (`[limits] capture-max-bytes`); records
    /// that would grow the file beyond it are dropped and counted.
    pub fn set_max_bytes(&self, n: u64) {
        self.max_bytes.store(n, Relaxed);
    }

    /// Sets the directory capture files go into (`--capture-dir`).
    pub fn set_dir(&self, dir: PathBuf) {
        *self.dir.lock().unwrap_or_else(|e| e.into_inner()) = dir;
        self.dir_given.store(true, SeqCst);
    }

    /// The capture directory if `--capture-dir` (or `capture-dir`) named
    /// it; device trace files go only there.
    pub fn given_dir(&self) -> Option<PathBuf> {
        self.dir_given.load(SeqCst).then(|| self.dir())
    }

    /// The directory capture files go into.
    pub fn dir(&self) -> PathBuf {
        self.dir.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Whether a capture runs.
    pub fn active(&self) -> bool {
        self.active.load(Relaxed)
    }

    /// Starts capturing `ports` (index, name) of the fabric with `names.len()`
    /// ports into `file`, a new file in the capture directory (see
    /// [`open_new_capture_file`]).
    pub fn start(
        &self,
        file: &Path,
        names: &[String],
        only: Option<usize>,
        snaplen: Option<u32>,
    ) -> Result<CaptureStatus, CaptureError> {
        let snaplen = snaplen.unwrap_or(MAX_SNAPLEN);
        if snaplen == 0 || snaplen > MAX_SNAPLEN {
            return Err(CaptureError::Snaplen);
        }
        let mut run = self.run.write().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = run.as_ref() {
            return Err(CaptureError::Running(r.file.clone()));
        }
        let (f, file) = open_new_capture_file(&self.dir(), file)?;
        let file = file.as_path();
        let mut w = BufWriter::new(f);
        let mut ifaces = vec![None; names.len()];
        let mut ports = Vec::new();
        let mut head = pcapng::shb(concat!("vhost-rdma ", env!("CARGO_PKG_VERSION")));
        for (i, n) in names.iter().enumerate() {
            if only.is_some_and(|o| o != i) {
                continue;
            }
            ifaces[i] = Some(ports.len() as u32);
            ports.push(n.clone());
            head.extend(pcapng::idb(n, snaplen));
        }
        w.write_all(&head)
            .and_then(|_| w.flush())
            .map_err(|source| CaptureError::Write {
                file: file.to_path_buf(),
                source,
            })?;
        let counters = Arc::new(Counters::default());
        counters.bytes.store(head.len() as u64, Relaxed);
        let (tx, rx) = sync_channel::<Rec>(CHANNEL_RECORDS);
        let c = counters.clone();
        let max_bytes = self.max_bytes.load(Relaxed);
        let thread = std::thread::Builder::new()
            .name("capture".into())
            .spawn(move || {
                let fail = |e: std::io::Error| {
                    let mut x = c.error.lock().unwrap_or_else(|e| e.into_inner());
                    if x.is_none() {
                        *x = Some(e.to_string());
                    }
                };
                loop {
                    match rx.recv_timeout(Duration::from_millis(200)) {
                        Ok(r) => {
                            let b = pcapng::epb(r.iface, r.ts_ns, &r.data, r.orig_len, r.flags);
                            if c.bytes.load(Relaxed) + b.len() as u64 > max_bytes {
                                if c.limited.fetch_add(1, Relaxed) == 0 {
                                    fail(std::io::Error::other(format!(
                                        "capture file reached [limits] capture-max-bytes = {max_bytes}; later records dropped"
                                    )));
                                }
                                continue;
                            }
                            match w.write_all(&b) {
                                Ok(()) => {
                                    c.records.fetch_add(1, Relaxed);
                                    c.bytes.fetch_add(b.len() as u64, Relaxed);
                                }
                                Err(e) => {
                                    c.dropped.fetch_add(1, Relaxed);
                                    fail(e);
                                }
                            }
                        }
                        Err(RecvTimeoutError::Timeout) => {
                            if let Err(e) = w.flush() {
                                fail(e);
                            }
                        }
                        Err(RecvTimeoutError::Disconnected) => break,
                    }
                }
                if let Err(e) = w.flush() {
                    fail(e);
                }
            })
            .map_err(CaptureError::Thread)?;
        let r = Running {
            tx,
            file: file.to_path_buf(),
            ifaces,
            ports,
            snaplen,
            counters,
            thread,
        };
        let st = r.status();
        *run = Some(r);
        self.active.store(true, SeqCst);
        Ok(st)
    }

    /// Stops the capture, writes what is queued and closes the file.
    pub fn stop(&self) -> Result<CaptureStatus, CaptureError> {
        let r = self
            .run
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or(CaptureError::NotRunning)?;
        self.active.store(false, SeqCst);
        let Running {
            tx,
            file,
            ports,
            snaplen,
            counters,
            thread,
            ..
        } = r;
        drop(tx);
        let _ = thread.join();
        let st = status_of(&counters, false, &file, &ports, snaplen);
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(st.clone());
        Ok(st)
    }

    /// The running capture, else the last one, else an empty status.
    pub fn status(&self) -> CaptureStatus {
        if let Some(r) = self.run.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
            return r.status();
        }
        self.last
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .unwrap_or_default()
    }

    /// Records a frame of `port` (cheap when no capture runs).
    pub fn record(&self, port: usize, dir: Dir, data: &[u8]) {
        if !self.active() {
            return;
        }
        let run = self.run.read().unwrap_or_else(|e| e.into_inner());
        let Some(r) = run.as_ref() else { return };
        let Some(iface) = r.ifaces.get(port).copied().flatten() else {
            return;
        };
        let keep = data.len().min(r.snaplen as usize);
        let rec = Rec {
            iface,
            ts_ns: now_ns(),
            flags: if dir == Dir::Egress {
                pcapng::FLAG_OUTBOUND
            } else {
                pcapng::FLAG_INBOUND
            },
            orig_len: data.len() as u32,
            data: data[..keep].to_vec(),
        };
        match r.tx.try_send(rec) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                r.counters.dropped.fetch_add(1, Relaxed);
            }
        }
    }
}

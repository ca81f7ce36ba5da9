//! Where a daemon's control socket is when nobody names one, and how `ctl`
//! finds it.
//!
//! A daemon started without a control path listens on a socket of its own,
//! `ctl/PID.sock` in the runtime directory ([`instance_socket`]), so any
//! number of daemons can start at the same moment without competing for
//! one path. `ctl` without a path connects to every socket there (and to
//! `ctl.sock`, the single default of earlier versions): with exactly one
//! daemon answering it talks to that one; with none or several it refuses
//! to guess and says how to choose ([`ChooseError`]).

use std::io;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::io::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

/// The directory of the per-daemon control sockets in runtime directory
/// `runtime`.
pub fn instance_dir(runtime: &Path) -> PathBuf {
    runtime.join("ctl")
}

/// The control socket of the daemon with process id `pid` when it was
/// given no control path.
pub fn instance_socket(runtime: &Path, pid: u32) -> PathBuf {
    instance_dir(runtime).join(format!("{pid}.sock"))
}

/// The single default control socket of earlier versions, still looked at
/// so `ctl` finds a daemon started before an upgrade.
pub fn legacy_socket(runtime: &Path) -> PathBuf {
    runtime.join("ctl.sock")
}

/// A control socket on which a daemon accepts connections.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveDaemon {
    /// The socket's path.
    pub socket: PathBuf,
    /// The process listening on it (its `SO_PEERCRED`), if the kernel said.
    pub pid: Option<u32>,
    /// The names of the ports it serves, when asked ([`LiveDaemon::ask_ports`])
    /// and it answered: what tells the daemons apart for a user.
    pub ports: Option<Vec<String>>,
}

impl LiveDaemon {
    /// Fills [`LiveDaemon::ports`] from the daemon's status, waiting at
    /// most a second: a daemon that does not answer is listed without.
    pub fn ask_ports(&mut self) {
        let reply = super::request_within(
            &self.socket,
            &super::Request::Status,
            std::time::Duration::from_secs(1),
        );
        self.ports = reply
            .ok()
            .and_then(super::Reply::into_status)
            .map(|s| s.ports.into_iter().map(|p| p.name).collect());
    }
}

impl std::fmt::Display for LiveDaemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.pid {
            Some(pid) => write!(f, "pid {pid}")?,
            None => write!(f, "pid unknown")?,
        }
        write!(f, " (--control {}", self.socket.display())?;
        match self.ports.as_deref() {
            Some([]) => write!(f, ", no ports)"),
            Some(names) => write!(f, ", ports {})", names.join(", ")),
            None => write!(f, ")"),
        }
    }
}

/// Why `ctl` did not pick a control socket by itself.
#[derive(Debug, thiserror::Error)]
pub enum ChooseError {
    /// No daemon answers in the runtime directory.
    #[error(
        "no vhost-rdma daemon serves a control socket in {}: none runs as this user, \
         or it was started with --control PATH (give ctl the same --control PATH)",
        .dir.display()
    )]
    NoDaemon {
        /// Where we looked.
        dir: PathBuf,
    },
    /// Several daemons answer; picking one would be a guess.
    #[error(
        "{} vhost-rdma daemons are running; choose one with --pid PID or --control PATH: {}",
        .daemons.len(),
        list(.daemons)
    )]
    Several {
        /// The daemons found.
        daemons: Vec<LiveDaemon>,
    },
    /// `--pid` names no daemon found.
    #[error(
        "no vhost-rdma daemon with pid {pid} serves a control socket in {}{}",
        .dir.display(),
        running(.daemons)
    )]
    NoSuchPid {
        /// The pid asked for.
        pid: u32,
        /// Where we looked.
        dir: PathBuf,
        /// The daemons that are there.
        daemons: Vec<LiveDaemon>,
    },
}

/// The daemons on one line, as every user error is.
fn list(daemons: &[LiveDaemon]) -> String {
    let each: Vec<String> = daemons.iter().map(ToString::to_string).collect();
    each.join("; ")
}

fn running(daemons: &[LiveDaemon]) -> String {
    if daemons.is_empty() {
        " (none is running)".into()
    } else {
        format!("; running: {}", list(daemons))
    }
}

/// The daemons accepting connections on a control socket in `runtime`'s
/// instance directory, on the legacy default and on `also` (e.g. the path
/// in `$VHOST_RDMA_CONTROL`), each socket once, in path order. Stale
/// sockets (nobody accepts) and sockets we may not connect to are left out.
pub fn live_daemons(runtime: &Path, also: Option<&Path>) -> Vec<LiveDaemon> {
    let mut candidates: Vec<PathBuf> = std::fs::read_dir(instance_dir(runtime))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_socket()))
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "sock"))
        .collect();
    candidates.push(legacy_socket(runtime));
    candidates.extend(also.map(Path::to_path_buf));
    candidates.sort();
    candidates.dedup();
    candidates
        .into_iter()
        .filter_map(|socket| {
            let c = UnixStream::connect(&socket).ok()?;
            let pid = peer_pid(&c).ok();
            Some(LiveDaemon {
                socket,
                pid,
                ports: None,
            })
        })
        .collect()
}

/// The process that listens on the other end of `c` (`SO_PEERCRED`: for a
/// connection to a listening socket, whoever called `listen`).
fn peer_pid(c: &UnixStream) -> io::Result<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`, a ucred.
    let r = unsafe {
        libc::getsockopt(
            c.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    u32::try_from(cred.pid).map_err(|_| io::Error::other("no peer pid"))
}

/// The control socket `ctl` talks to when given no path: the one daemon
/// running (see [`live_daemons`]), or the one with process id `pid`.
pub fn choose(
    runtime: &Path,
    also: Option<&Path>,
    pid: Option<u32>,
) -> Result<PathBuf, ChooseError> {
    let mut daemons = live_daemons(runtime, also);
    let dir = instance_dir(runtime);
    let chosen = match pid {
        Some(pid) => daemons.iter().position(|d| d.pid == Some(pid)),
        None if daemons.len() == 1 => Some(0),
        None => None,
    };
    if let Some(i) = chosen {
        return Ok(daemons.swap_remove(i).socket);
    }
    daemons.iter_mut().for_each(LiveDaemon::ask_ports);
    Err(match pid {
        Some(pid) => ChooseError::NoSuchPid { pid, dir, daemons },
        None if daemons.is_empty() => ChooseError::NoDaemon { dir },
        None => ChooseError::Several { daemons },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    /// Binds `path` and drops every connection at once, as a daemon too
    /// busy to answer would look (its ports are then not listed).
    fn mute_listener(path: &Path) {
        let l = UnixListener::bind(path).unwrap();
        std::thread::spawn(move || l.incoming().for_each(drop));
    }

    #[test]
    fn one_live_daemon_is_chosen_several_are_listed_stale_ones_ignored() {
        let runtime = std::env::temp_dir().join(format!("vhr-discovery-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&runtime);
        std::fs::create_dir_all(instance_dir(&runtime)).unwrap();
        let me = std::process::id();
        assert!(matches!(
            choose(&runtime, None, None),
            Err(ChooseError::NoDaemon { .. })
        ));
        // A stale socket (nobody listens) is no daemon.
        drop(UnixListener::bind(instance_socket(&runtime, 1)).unwrap());
        assert!(matches!(
            choose(&runtime, None, None),
            Err(ChooseError::NoDaemon { .. })
        ));
        let first = instance_socket(&runtime, 2);
        mute_listener(&first);
        assert_eq!(choose(&runtime, None, None).unwrap(), first);
        assert_eq!(choose(&runtime, None, Some(me)).unwrap(), first);
        let legacy = legacy_socket(&runtime);
        mute_listener(&legacy);
        match choose(&runtime, None, None) {
            Err(e @ ChooseError::Several { .. }) => {
                let msg = e.to_string();
                assert!(msg.starts_with("2 vhost-rdma daemons"), "{msg}");
                assert!(
                    msg.contains(&format!("pid {me} (--control {})", first.display())),
                    "{msg}"
                );
                assert!(msg.contains(&legacy.display().to_string()), "{msg}");
                assert!(msg.contains("--pid PID or --control PATH"), "{msg}");
            }
            other => panic!("two live sockets: {other:?}"),
        }
        match choose(&runtime, None, Some(u32::MAX)) {
            Err(e @ ChooseError::NoSuchPid { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains(&first.display().to_string()), "{msg}");
            }
            other => panic!("unknown pid: {other:?}"),
        }
        let _ = std::fs::remove_dir_all(&runtime);
    }
}

//! Listening sockets at user-given paths, owned safely: never take over a
//! socket a live process serves, never delete what is not a stale socket,
//! wake a blocked `accept` without going through the path (which someone may
//! have removed or replaced), and on exit remove the path only if it is
//! still ours. Also: sockets inherited already listening (`--fd`, systemd
//! socket activation), which are never removed, and the owner, group and
//! mode given to the sockets we bind.
//!
//! Binding holds an exclusive `flock` on the socket's directory from the
//! liveness check to `listen`: two daemons binding the same path at the
//! same moment would otherwise race (the second sees the first's socket
//! between its `bind` and `listen`, finds it refusing connections, takes it
//! for stale and removes it; or both find the path free and the second's
//! `bind` fails with a bare "address in use").

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::io::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

/// Why a socket path could not be bound.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// A live process accepts connections there.
    #[error("{0}: a running process serves this socket (another vhost-rdma?); not taking it over")]
    InUse(PathBuf),
    /// Something that is not a socket is there.
    #[error("{0}: exists and is not a socket; not replacing it")]
    NotASocket(PathBuf),
    /// An inherited descriptor is not a listening Unix stream socket.
    #[error("fd {fd}: {why}")]
    NotAListener {
        /// The descriptor.
        fd: RawFd,
        /// What it is instead.
        why: String,
    },
    /// Creating the directory, removing a stale socket or binding failed.
    #[error("{path}: {source}")]
    Io {
        /// The socket path.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
}

/// A listening socket bound at a path, with the identity of the inode it
/// created there.
#[derive(Debug)]
pub struct OwnedSocket {
    path: PathBuf,
    /// Device, inode and change time (ns): inode numbers alone are reused
    /// at once when a socket is removed and another is bound. `None` for an
    /// inherited socket: its path belongs to whoever bound it (QEMU,
    /// libvirt, systemd), so we never remove it.
    identity: Option<(u64, u64, i64, i64)>,
}

/// Owner, group and permission bits given to every port socket right after
/// it is bound (`--socket-user`, `--socket-group`, `--socket-mode`), so that
/// QEMU running as another user (e.g. group `kvm`) can connect.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SocketPerms {
    /// Permission bits (chmod).
    pub mode: Option<u32>,
    /// Owner user id (chown).
    pub uid: Option<u32>,
    /// Owner group id (chown).
    pub gid: Option<u32>,
}

impl SocketPerms {
    /// Owner-only: what the control socket gets.
    pub const OWNER_ONLY: SocketPerms = SocketPerms {
        mode: Some(0o600),
        uid: None,
        gid: None,
    };

    fn apply(&self, path: &Path) -> io::Result<()> {
        if self.uid.is_some() || self.gid.is_some() {
            std::os::unix::fs::lchown(path, self.uid, self.gid)?;
        }
        if let Some(mode) = self.mode {
            std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(mode))?;
        }
        Ok(())
    }
}

/// Why a user or group name could not be resolved.
#[derive(Debug, thiserror::Error)]
#[error("no such {what}: {name}")]
pub struct UnknownId {
    what: &'static str,
    name: String,
}

/// A user name or numeric uid.
pub fn resolve_user(name: &str) -> Result<u32, UnknownId> {
    resolve(name, "user", |c| {
        // SAFETY: getpwnam takes a valid C string; the uid is copied out of
        // its static entry at once (the CLI resolves names before it starts
        // any thread, so nothing else overwrites it meanwhile).
        unsafe { libc::getpwnam(c.as_ptr()).as_ref().map(|p| p.pw_uid) }
    })
}

/// A group name or numeric gid.
pub fn resolve_group(name: &str) -> Result<u32, UnknownId> {
    resolve(name, "group", |c| {
        // SAFETY: as in resolve_user.
        unsafe { libc::getgrnam(c.as_ptr()).as_ref().map(|g| g.gr_gid) }
    })
}

fn resolve(
    name: &str,
    what: &'static str,
    lookup: impl Fn(&std::ffi::CStr) -> Option<u32>,
) -> Result<u32, UnknownId> {
    let unknown = || UnknownId {
        what,
        name: name.to_string(),
    };
    if let Ok(id) = name.parse() {
        return Ok(id);
    }
    let c = std::ffi::CString::new(name).map_err(|_| unknown())?;
    lookup(&c).ok_or_else(unknown)
}

fn identity(m: &std::fs::Metadata) -> (u64, u64, i64, i64) {
    (m.dev(), m.ino(), m.ctime(), m.ctime_nsec())
}

/// Binds `path`: creates its directory, replaces a stale socket (nobody
/// accepts on it), refuses a live one or a non-socket.
pub fn bind(path: &Path) -> Result<(UnixListener, OwnedSocket), BindError> {
    bind_with_mode(path, None)
}

/// [`bind`], then sets the socket's permission bits to `mode`.
pub fn bind_with_mode(
    path: &Path,
    mode: Option<u32>,
) -> Result<(UnixListener, OwnedSocket), BindError> {
    bind_with(
        path,
        &SocketPerms {
            mode,
            ..SocketPerms::default()
        },
    )
}

/// [`bind`], then gives the socket `perms` (before its identity is
/// recorded: chmod and chown change the change time).
pub fn bind_with(
    path: &Path,
    perms: &SocketPerms,
) -> Result<(UnixListener, OwnedSocket), BindError> {
    let io_err = |source| BindError::Io {
        path: path.to_path_buf(),
        source,
    };
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io_err)?;
    // Held until this function returns: the socket then listens.
    let _lock = DirLock::acquire(dir);
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => match UnixStream::connect(path) {
            Ok(_) => return Err(BindError::InUse(path.to_path_buf())),
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                std::fs::remove_file(path).map_err(io_err)?;
            }
            // Not ours to judge (permissions, ...): let bind say why.
            Err(_) => {}
        },
        Ok(_) => return Err(BindError::NotASocket(path.to_path_buf())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err(e)),
    }
    let l = UnixListener::bind(path).map_err(io_err)?;
    if let Err(e) = perms.apply(path) {
        // Not left behind with the wrong owner or mode.
        let _ = std::fs::remove_file(path);
        return Err(io_err(e));
    }
    let m = std::fs::symlink_metadata(path).map_err(io_err)?;
    Ok((
        l,
        OwnedSocket {
            path: path.to_path_buf(),
            identity: Some(identity(&m)),
        },
    ))
}

/// An exclusive `flock` on a directory, released on drop. Only vhost-rdma
/// processes take it; it orders their binds in that directory.
struct DirLock {
    /// Closing the descriptor releases the lock.
    _dir: Option<std::fs::File>,
}

impl DirLock {
    /// Blocks until the lock is ours. A directory we cannot open or lock
    /// (no read permission, a file system without flock) is bound unlocked,
    /// as before there was a lock: the race is then possible again, but
    /// binding still works.
    fn acquire(dir: &Path) -> DirLock {
        let Ok(f) = std::fs::File::open(dir) else {
            return DirLock { _dir: None };
        };
        loop {
            // SAFETY: flock on a descriptor we own; no memory is involved.
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } == 0 {
                return DirLock { _dir: Some(f) };
            }
            if io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                tracing::debug!(dir = %dir.display(), "cannot lock the directory; binding unlocked");
                return DirLock { _dir: None };
            }
        }
    }
}

/// Removes every socket in `dir` whose name ends in `.sock` and on which
/// nobody accepts connections (left by a process that was killed), holding
/// the bind lock so a socket being bound is never mistaken for a stale one.
/// Sockets we may not connect to (another user's) are left alone. Returns
/// how many were removed; a missing directory has none.
pub fn remove_stale_sockets(dir: &Path) -> io::Result<usize> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let _lock = DirLock::acquire(dir);
    let mut removed = 0;
    for entry in entries.flatten() {
        let path = entry.path();
        let is_socket = entry.file_type().is_ok_and(|t| t.is_socket());
        if !is_socket || path.extension().is_none_or(|e| e != "sock") {
            continue;
        }
        if let Err(e) = UnixStream::connect(&path) {
            if e.kind() == io::ErrorKind::ConnectionRefused && std::fs::remove_file(&path).is_ok() {
                removed += 1;
            }
        }
    }
    Ok(removed)
}

/// What names an inherited socket in logs and status: the path it is bound
/// to, else `fd:N`. Leaves `fd` open.
pub fn display_path(fd: RawFd) -> PathBuf {
    // SAFETY: the listener only borrows `fd` to ask its address and is
    // never dropped (ManuallyDrop), so the descriptor stays open and ours to
    // adopt later; getsockname on a non-socket just fails.
    let l = std::mem::ManuallyDrop::new(unsafe { UnixListener::from_raw_fd(fd) });
    l.local_addr()
        .ok()
        .and_then(|a| a.as_pathname().map(Path::to_path_buf))
        .unwrap_or_else(|| PathBuf::from(format!("fd:{fd}")))
}

/// Takes over `fd`, a Unix stream socket the caller (QEMU, libvirt,
/// systemd) already bound and listens on. Its path (if it has one) is only
/// for display: it stays the caller's, so [`OwnedSocket::remove`] leaves it.
/// `fd` must not be used elsewhere in this process afterwards.
pub fn adopt(fd: RawFd) -> Result<(UnixListener, OwnedSocket), BindError> {
    let not = |why: &str| BindError::NotAListener {
        fd,
        why: why.to_string(),
    };
    let int_opt = |opt| {
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: getsockopt writes at most `len` bytes into `v`.
        let r = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                opt,
                (&mut v as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        (r == 0).then_some(v)
    };
    // SAFETY: F_GETFD only reads the descriptor's flags.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(not("not an open descriptor"));
    }
    match (
        int_opt(libc::SO_DOMAIN),
        int_opt(libc::SO_TYPE),
        int_opt(libc::SO_ACCEPTCONN),
    ) {
        (None, _, _) => return Err(not("not a socket")),
        (Some(d), _, _) if d != libc::AF_UNIX => return Err(not("not a Unix socket")),
        (_, Some(t), _) if t != libc::SOCK_STREAM => return Err(not("not a stream socket")),
        (_, _, Some(0)) => return Err(not("not listening")),
        _ => {}
    }
    // Inherited descriptors usually lack close-on-exec; nothing we start
    // should hold a guest's socket open.
    // SAFETY: sets a flag on a descriptor just checked to be open.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    // SAFETY: the caller hands us `fd` (an open listening Unix socket,
    // checked above) and does not use it again.
    let l = unsafe { UnixListener::from_raw_fd(fd) };
    let path = display_path(fd);
    Ok((
        l,
        OwnedSocket {
            path,
            identity: None,
        },
    ))
}

impl OwnedSocket {
    /// The path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the path still names the socket we created.
    pub fn still_ours(&self) -> bool {
        self.identity.is_some_and(|id| {
            std::fs::symlink_metadata(&self.path).is_ok_and(|m| identity(&m) == id)
        })
    }

    /// Removes the path if it still names our socket.
    pub fn remove(&self) {
        if self.still_ours() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Wakes threads blocked in `accept` on `l` (they get an error) without
/// connecting through the path: shutdown(2) on a listening socket.
pub fn unblock_accept(l: &UnixListener) {
    // SAFETY: shutdown on a valid descriptor we own; no memory is involved.
    unsafe {
        libc::shutdown(l.as_raw_fd(), libc::SHUT_RDWR);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_socket_is_not_taken_over_stale_one_is_replaced() {
        let dir = std::env::temp_dir().join(format!("vhr-sockpath-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let p = dir.join("s.sock");
        let (l, owned) = bind(&p).unwrap();
        assert!(matches!(bind(&p), Err(BindError::InUse(_))));
        assert!(owned.still_ours());
        drop(l); // the socket file stays, nobody listens: stale
        let (_l2, owned2) = bind(&p).unwrap();
        assert!(!owned.still_ours() && owned2.still_ours());
        owned.remove(); // not ours any more: left alone
        assert!(p.exists());
        owned2.remove();
        assert!(!p.exists());
        std::fs::write(&p, b"x").unwrap();
        assert!(matches!(bind(&p), Err(BindError::NotASocket(_))));
        assert_eq!(std::fs::read(&p).unwrap(), b"x");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn only_stale_sockets_are_swept() {
        let dir = std::env::temp_dir().join(format!("vhr-socksweep-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (_live, _) = bind(&dir.join("live.sock")).unwrap();
        drop(bind(&dir.join("stale.sock")).unwrap());
        drop(bind(&dir.join("stale.other")).unwrap());
        std::fs::write(dir.join("file.sock"), b"x").unwrap();
        assert_eq!(remove_stale_sockets(&dir).unwrap(), 1);
        assert!(!dir.join("stale.sock").exists());
        for kept in ["live.sock", "stale.other", "file.sock"] {
            assert!(dir.join(kept).exists(), "{kept} removed");
        }
        assert_eq!(remove_stale_sockets(&dir.join("missing")).unwrap(), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn bind_applies_mode_and_group() {
        let dir = std::env::temp_dir().join(format!("vhr-sockperm-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let p = dir.join("s.sock");
        // SAFETY: getgid cannot fail.
        let gid = unsafe { libc::getgid() };
        let perms = SocketPerms {
            mode: Some(0o660),
            uid: None,
            gid: Some(gid),
        };
        let (_l, owned) = bind_with(&p, &perms).unwrap();
        let m = std::fs::symlink_metadata(&p).unwrap();
        assert_eq!(m.mode() & 0o777, 0o660);
        assert_eq!(m.gid(), gid);
        // chmod happened before the identity was taken.
        assert!(owned.still_ours());
        owned.remove();
        assert!(!p.exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn names_and_numbers_resolve() {
        assert_eq!(resolve_user("root").unwrap(), 0);
        assert_eq!(resolve_group("0").unwrap(), 0);
        assert_eq!(resolve_user("4242").unwrap(), 4242);
        assert!(resolve_group("no-such-group-vhr").is_err());
    }

    #[test]
    fn adopt_takes_a_listening_socket_and_never_removes_its_path() {
        use std::os::unix::io::IntoRawFd;
        let dir = std::env::temp_dir().join(format!("vhr-sockadopt-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("s.sock");
        let fd = UnixListener::bind(&p).unwrap().into_raw_fd();
        let (l, owned) = adopt(fd).unwrap();
        assert_eq!(owned.path(), p);
        let _c = UnixStream::connect(&p).unwrap();
        assert!(l.accept().is_ok());
        owned.remove();
        assert!(p.exists(), "an inherited socket's path was removed");
        // Not a listening socket: refused with the reason.
        let (a, _b) = UnixStream::pair().unwrap();
        let e = adopt(a.as_raw_fd()).unwrap_err().to_string();
        assert!(e.contains("not listening"), "{e}");
        let f = std::fs::File::open("/dev/null").unwrap();
        let e = adopt(f.as_raw_fd()).unwrap_err().to_string();
        assert!(e.contains("not a socket"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn unblock_accept_wakes_a_blocked_accept() {
        let dir = std::env::temp_dir().join(format!("vhr-sockwake-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (l, owned) = bind(&dir.join("s.sock")).unwrap();
        let l2 = l.try_clone().unwrap();
        let t = std::thread::spawn(move || l2.accept().is_err());
        std::thread::sleep(std::time::Duration::from_millis(50));
        // The path is gone: waking must not depend on it.
        std::fs::remove_file(owned.path()).unwrap();
        unblock_accept(&l);
        assert!(t.join().unwrap(), "accept returned a connection");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

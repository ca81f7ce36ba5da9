//! Listening sockets at user-given paths, owned safely: never take over a
//! socket a live process serves, never delete what is not a stale socket,
//! wake a blocked `accept` without going through the path (which someone may
//! have removed or replaced), and on exit remove the path only if it is
//! still ours.

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::io::AsRawFd;
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
    /// at once when a socket is removed and another is bound.
    identity: (u64, u64, i64, i64),
}

fn identity(m: &std::fs::Metadata) -> (u64, u64, i64, i64) {
    (m.dev(), m.ino(), m.ctime(), m.ctime_nsec())
}

/// Binds `path`: creates its directory, replaces a stale socket (nobody
/// accepts on it), refuses a live one or a non-socket.
pub fn bind(path: &Path) -> Result<(UnixListener, OwnedSocket), BindError> {
    bind_with_mode(path, None)
}

/// [`bind`], then sets the socket's permission bits to `mode` (before its
/// identity is recorded: chmod changes the change time).
pub fn bind_with_mode(
    path: &Path,
    mode: Option<u32>,
) -> Result<(UnixListener, OwnedSocket), BindError> {
    let io_err = |source| BindError::Io {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io_err)?;
    }
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
    if let Some(mode) = mode {
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(mode))
            .map_err(io_err)?;
    }
    let m = std::fs::symlink_metadata(path).map_err(io_err)?;
    Ok((
        l,
        OwnedSocket {
            path: path.to_path_buf(),
            identity: identity(&m),
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
        std::fs::symlink_metadata(&self.path).is_ok_and(|m| identity(&m) == self.identity)
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

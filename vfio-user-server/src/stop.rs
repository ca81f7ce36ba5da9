//! Stopping a server whose `vfio_user::Server::run` blocks: shut down the
//! listener and the accepted connection (see [`Stopper`]).

use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

/// What [`DeviceHandle::stop`] needs to wake the server thread: a duplicate
/// of the listening socket (`shutdown(2)` on it makes a blocked `accept`
/// fail) and the socket's path (to find the accepted connection, which the
/// `vfio_user` crate keeps to itself).
pub(crate) struct Stopper {
    pub(crate) listener: UnixStream,
    pub(crate) path: Option<PathBuf>,
}

impl Stopper {
    pub(crate) fn stop(&self) {
        // A UnixStream over the listener's fd: only used for shutdown(2),
        // which is defined on any socket.
        let _ = self.listener.shutdown(std::net::Shutdown::Both);
        if let Some(path) = &self.path {
            shutdown_accepted(path);
        }
    }
}

/// Shuts down every socket in this process whose local address is `path`:
/// the connections accepted on our listener (their local address is the
/// listener's). `vfio_user::Server::run` owns the accepted stream and blocks
/// in `recvmsg` on it; this is the only way to make it return.
fn shutdown_accepted(path: &Path) {
    for sock in process_sockets() {
        let ours = sock
            .local_addr()
            .ok()
            .and_then(|a| a.as_pathname().map(|p| p == path))
            .unwrap_or(false);
        if ours {
            let _ = sock.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// A duplicate of every socket this process has open (from
/// `/proc/self/fd`), as a `UnixStream` to ask its addresses: how the
/// server finds the connection the `vfio_user` crate keeps to itself, and
/// how a test driver finds the socket a `vfio_user::Client` opened. A
/// descriptor closed or reused since the listing yields nothing or
/// another socket, which the caller's address check rejects.
pub fn process_sockets() -> impl Iterator<Item = UnixStream> {
    let entries = std::fs::read_dir("/proc/self/fd").into_iter().flatten();
    entries.flatten().filter_map(|entry| {
        let fd = entry.file_name().to_str()?.parse::<RawFd>().ok()?;
        let is_socket = std::fs::read_link(entry.path())
            .map(|t| t.to_string_lossy().starts_with("socket:"))
            .unwrap_or(false);
        if !is_socket {
            return None;
        }
        // SAFETY: F_DUPFD_CLOEXEC only creates a new descriptor; if `fd`
        // was closed (or reused) since the listing, we get EBADF or a
        // descriptor for another file. No memory is involved.
        let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            return None;
        }
        // SAFETY: `dup` is a descriptor we just created and own alone.
        Some(UnixStream::from(unsafe { OwnedFd::from_raw_fd(dup) }))
    })
}

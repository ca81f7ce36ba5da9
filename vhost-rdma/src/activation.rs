//! systemd socket activation (`sd_listen_fds(3)`): listening sockets handed
//! over as descriptors 3, 4, ... when `LISTEN_PID` is our pid, `LISTEN_FDS`
//! says how many, and `LISTEN_FDNAMES` (optional, colon-separated) names
//! them (`FileDescriptorName=` in the socket unit).

use std::os::unix::io::RawFd;

/// The first descriptor systemd passes (`SD_LISTEN_FDS_START`).
pub const LISTEN_FDS_START: RawFd = 3;

/// One inherited listening socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListenFd {
    /// The descriptor.
    pub fd: RawFd,
    /// Its `LISTEN_FDNAMES` entry, if any.
    pub name: Option<String>,
}

/// The descriptors passed to this process, from the environment given as
/// `var` (so tests need not touch the process environment). Empty when not
/// socket-activated or when the variables were meant for another process
/// (`LISTEN_PID` differs from `pid`).
pub fn listen_fds(var: impl Fn(&str) -> Option<String>, pid: u32) -> Vec<ListenFd> {
    let for_us = var("LISTEN_PID")
        .and_then(|p| p.trim().parse::<u32>().ok())
        .is_some_and(|p| p == pid);
    if !for_us {
        return Vec::new();
    }
    let n = var("LISTEN_FDS")
        .and_then(|n| n.trim().parse::<RawFd>().ok())
        .unwrap_or(0)
        .clamp(0, 1024);
    let names: Vec<String> = var("LISTEN_FDNAMES")
        .map(|s| s.split(':').map(str::to_string).collect())
        .unwrap_or_default();
    (0..n)
        .map(|i| ListenFd {
            fd: LISTEN_FDS_START + i,
            name: names
                .get(i as usize)
                .filter(|s| !s.is_empty() && s.as_str() != "unknown")
                .cloned(),
        })
        .collect()
}

/// [`listen_fds`] from the process environment, which it then clears (as
/// `sd_listen_fds(1)` does) so that no child takes the sockets for its own.
/// Call before any thread starts: it changes the environment.
pub fn take_from_env() -> Vec<ListenFd> {
    let fds = listen_fds(|k| std::env::var(k).ok(), std::process::id());
    for k in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] {
        std::env::remove_var(k);
    }
    fds
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(kv: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = kv
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn only_for_our_pid() {
        let e = env(&[("LISTEN_PID", "41"), ("LISTEN_FDS", "2")]);
        assert!(listen_fds(&e, 42).is_empty());
        let got = listen_fds(&e, 41);
        assert_eq!(
            got.iter().map(|l| l.fd).collect::<Vec<_>>(),
            vec![3, 4],
            "{got:?}"
        );
        assert!(got.iter().all(|l| l.name.is_none()));
        assert!(listen_fds(env(&[("LISTEN_FDS", "2")]), 41).is_empty());
    }

    #[test]
    fn names_from_listen_fdnames() {
        let e = env(&[
            ("LISTEN_PID", "7"),
            ("LISTEN_FDS", "3"),
            ("LISTEN_FDNAMES", "net0:unknown"),
        ]);
        let got = listen_fds(e, 7);
        assert_eq!(got[0].name.as_deref(), Some("net0"));
        assert_eq!(got[1].name, None);
        assert_eq!(got[2].name, None);
        assert_eq!(got[2].fd, 5);
    }
}

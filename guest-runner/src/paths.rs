//! Small host helpers: lexical absolute paths, `PATH` look-ups, a fresh
//! temporary directory, local time.

use std::path::Path;

/// `path` with `.`, `..` and repeated slashes resolved lexically (symlinks
/// are not followed), as Python's `os.path.normpath` does.
pub fn normpath(path: &str) -> String {
    if path.is_empty() {
        return ".".into();
    }
    let lead = path.bytes().take_while(|&b| b == b'/').count();
    let lead = match lead {
        0 => "",
        2 => "//",
        _ => "/",
    };
    let mut parts: Vec<&str> = vec![];
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." if parts.last().is_some_and(|l| *l != "..") => {
                parts.pop();
            }
            ".." if !lead.is_empty() => {}
            c => parts.push(c),
        }
    }
    let out = format!("{lead}{}", parts.join("/"));
    if out.is_empty() {
        ".".into()
    } else {
        out
    }
}

/// `path` made absolute against the current directory and normalised
/// ([`normpath`]).
pub fn abspath(path: &str) -> String {
    if path.starts_with('/') {
        return normpath(path);
    }
    let cwd = std::env::current_dir()
        .map(|d| d.to_string_lossy().into_owned())
        .unwrap_or_default();
    normpath(&format!("{cwd}/{path}"))
}

fn is_executable_file(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The program `name` would run: `name` itself when it has a slash, else the
/// first executable `DIR/name` of `$PATH`.
pub fn which(name: &str) -> Option<String> {
    if name.contains('/') {
        return is_executable_file(Path::new(name)).then(|| name.to_string());
    }
    if name.is_empty() {
        return None;
    }
    let path = std::env::var("PATH").unwrap_or_else(|_| "/bin:/usr/bin".into());
    path.split(':')
        .map(|d| format!("{}/{name}", if d.is_empty() { "." } else { d }))
        .find(|c| is_executable_file(Path::new(c)))
}

/// The reason of an I/O error without Rust's " (os error N)" suffix
/// ("Permission denied").
pub fn os_reason(e: &std::io::Error) -> String {
    let s = e.to_string();
    match s.find(" (os error ") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

/// A new directory `$TMPDIR/PREFIXxxxxxxxx` (mode 0700).
pub fn mkdtemp(prefix: &str) -> std::io::Result<String> {
    use std::os::unix::fs::DirBuilderExt;
    let base = std::env::temp_dir();
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as u64
        ^ ((std::process::id() as u64) << 32);
    for _ in 0..100 {
        let mut name = String::from(prefix);
        for _ in 0..8 {
            // xorshift: enough to avoid collisions, create_dir refuses the rest
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            name.push(b"abcdefghijklmnopqrstuvwxyz0123456789_"[(seed % 37) as usize] as char);
        }
        let dir = base.join(name);
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir.to_string_lossy().into_owned()),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::other("no free temporary directory name"))
}

/// Local time as `YYYY-MM-DD HH:MM:SS`.
pub fn local_time() -> String {
    // SAFETY: time, localtime_r and strftime write only into the buffers
    // given; strftime's result length bounds the bytes read back.
    unsafe {
        let t = libc::time(std::ptr::null_mut());
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&t, &mut tm).is_null() {
            return "?".into();
        }
        let mut buf = [0u8; 32];
        let n = libc::strftime(
            buf.as_mut_ptr().cast(),
            buf.len(),
            c"%Y-%m-%d %H:%M:%S".as_ptr(),
            &tm,
        );
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }
}

/// Whether this process runs as root (may make network namespaces).
pub fn is_root() -> bool {
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A temporary directory removed on drop.
    pub(crate) struct TempDir(pub String);

    impl TempDir {
        pub(crate) fn new() -> Self {
            TempDir(mkdtemp("guest-runner-test.").unwrap())
        }
        /// `DIR/rel` (`DIR` for an empty `rel`).
        pub(crate) fn path(&self, rel: &str) -> String {
            if rel.is_empty() {
                self.0.clone()
            } else {
                format!("{}/{rel}", self.0)
            }
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn normpath_is_lexical() {
        for (i, o) in [
            ("", "."),
            ("/", "/"),
            ("//a", "//a"),
            ("///a/./b//", "/a/b"),
            ("/../a/../../b", "/b"),
            ("a/../../b", "../b"),
            ("a/..", "."),
            ("/x/arch/x86/boot/../../../.config", "/x/.config"),
        ] {
            assert_eq!(normpath(i), o, "{i}");
        }
        assert!(abspath("x/../y").ends_with("/y"));
        assert!(abspath("x").starts_with('/'));
    }

    #[test]
    fn which_and_time() {
        assert_eq!(which("sh").map(|p| p.ends_with("/sh")), Some(true));
        assert_eq!(which("/nonexistent/qemu"), None);
        assert_eq!(which("definitely-not-a-program-here"), None);
        let t = local_time();
        assert_eq!(t.len(), 19, "{t}");
    }
}

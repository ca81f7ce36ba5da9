//! The guest side of the protocol, as the console shows it (scripts/guest/vr-init):
//! `VR-BOOTED name=NAME` when init starts, then exactly one
//! `VR-RESULT name=NAME rc=N` before it powers the guest off.

fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    hay.get(from..)?
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| p + from)
}

/// Where the first `MARK NAME` with a non-empty name starts, and the name's end.
fn marker<'a>(line: &'a [u8], mark: &'static [u8]) -> impl Iterator<Item = usize> + 'a {
    let mut from = 0;
    std::iter::from_fn(move || loop {
        let at = find(line, mark, from)?;
        from = at + 1;
        let name = at + mark.len();
        let len = line[name..]
            .iter()
            .take_while(|b| !b.is_ascii_whitespace() && **b != 0x0b)
            .count();
        if len > 0 {
            return Some(name + len);
        }
    })
}

/// Whether a console line carries `VR-BOOTED name=NAME`.
pub fn is_booted(line: &[u8]) -> bool {
    marker(line, b"VR-BOOTED name=").next().is_some()
}

/// The job's exit status in a `VR-RESULT name=NAME rc=N` console line.
pub fn result_rc(line: &[u8]) -> Option<i64> {
    marker(line, b"VR-RESULT name=").find_map(|end| {
        let rest = line[end..].strip_prefix(b" rc=")?;
        let sign = usize::from(rest.first() == Some(&b'-'));
        let digits = rest[sign..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        std::str::from_utf8(&rest[..sign + digits])
            .ok()?
            .parse()
            .ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers() {
        assert!(is_booted(b"VR-BOOTED name=a"));
        assert!(is_booted(b"[    1.0] junk VR-BOOTED name=guest-1 extra"));
        assert!(!is_booted(b"VR-BOOTED name= a"));
        assert!(!is_booted(b"VR-BOOTED"));
        assert_eq!(result_rc(b"VR-RESULT name=a rc=0"), Some(0));
        assert_eq!(result_rc(b"xxVR-RESULT name=b rc=-3 tail"), Some(-3));
        assert_eq!(result_rc(b"VR-RESULT name=b rc=127\r"), Some(127));
        assert_eq!(result_rc(b"VR-RESULT name=b rc="), None);
        assert_eq!(result_rc(b"VR-RESULT name=b  rc=1"), None);
        assert_eq!(result_rc(b"VR-RESULT name= rc=1"), None);
        // a broken first marker does not hide a later one
        assert_eq!(
            result_rc(b"VR-RESULT name=a rcVR-RESULT name=a rc=5"),
            Some(5)
        );
    }

    /// The marker lines of vr-init, run by a shell, are what this module reads.
    #[test]
    fn vr_init_prints_the_markers() {
        let init = include_str!("../../scripts/guest/vr-init");
        let echoes: Vec<&str> = init
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with("echo \"VR-"))
            .collect();
        assert_eq!(echoes.len(), 2, "{echoes:?}");
        let script = format!("VR_NAME=g-1; set -- 3; {}", echoes.join("; "));
        let out = std::process::Command::new("sh")
            .args(["-c", &script])
            .output()
            .unwrap();
        let lines: Vec<&[u8]> = out.stdout.split(|&b| b == b'\n').collect();
        assert!(is_booted(lines[0]), "{lines:?}");
        assert_eq!(result_rc(lines[1]), Some(3));
    }
}

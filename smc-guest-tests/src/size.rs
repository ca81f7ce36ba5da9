//! Byte-count parsing with binary suffixes (`4096`, `64K`, `256M`, `1G`, `2GiB`).

/// Parses a byte count. Suffixes are binary: K/KiB = 2^10, M/MiB = 2^20,
/// G/GiB = 2^30, T/TiB = 2^40; case-insensitive; a trailing `B` is optional.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    if t.is_empty() {
        return Err("empty size".into());
    }
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    if num.is_empty() {
        return Err(format!("size {s:?} does not start with a number"));
    }
    let n: u64 = num.parse().map_err(|e| format!("size {s:?}: {e}"))?;
    let shift = match suffix.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        other => {
            return Err(format!(
                "size {s:?}: unknown suffix {other:?} (use K, M, G or T)"
            ))
        }
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("size {s:?} overflows 64 bits"))
}

/// Formats a byte count compactly (`256M`, `1536K`, `1000`), exact when possible.
pub fn format_size(n: u64) -> String {
    for (shift, suf) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
        if n != 0 && n.trailing_zeros() >= shift {
            return format!("{}{}", n >> shift, suf);
        }
    }
    n.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(65536));
        assert_eq!(parse_size("64k"), Ok(65536));
        assert_eq!(parse_size("256M"), Ok(268_435_456));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("3MB"), Ok(3 << 20));
        assert_eq!(parse_size("1T"), Ok(1 << 40));
        assert_eq!(parse_size(" 7 "), Ok(7));
        assert_eq!(parse_size("10B"), Ok(10));
    }

    #[test]
    fn rejects() {
        assert!(parse_size("").is_err());
        assert!(parse_size("M").is_err());
        assert!(parse_size("12X").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("1.5G").is_err());
        assert!(parse_size("99999999999999999999").is_err());
        assert!(parse_size("17179869184G").is_err());
    }

    #[test]
    fn formats() {
        assert_eq!(format_size(268_435_456), "256M");
        assert_eq!(format_size(1536 * 1024), "1536K");
        assert_eq!(format_size(1000), "1000");
        assert_eq!(format_size(0), "0");
    }
}

//! Checks of a bring-your-own guest kernel image (`--kernel PATH`).
//!
//! A usable image is an x86 bzImage (`arch/x86/boot/bzImage` of a kernel
//! build): its boot sector ends in `0x55 0xAA` at offset 0x1FE and its setup
//! header starts with the magic `HdrS` at 0x202 (boot protocol 2.00 or later,
//! which also gives the offset of the kernel's version string;
//! Documentation/arch/x86/boot.rst). The guests boot it with the image's root
//! disk and no initramfs, so every driver the tests use must be built in:
//! when the kernel's configuration is found beside the image, the options in
//! [`REQUIRED`] that are not `=y` give warnings.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::paths::{abspath, os_reason};

const BOOT_FLAG: usize = 0x1FE;
const HEADER: usize = 0x202;
const PROTOCOL: usize = 0x206;
const KERNEL_VERSION: usize = 0x20E;

/// What the guests cannot boot or run the tests without, built in: the
/// image's init, root disk and 9p job share (as
/// scripts/build-guest-image.sh requires), and the drivers of the devices
/// the daemon serves.
pub const REQUIRED: &[&str] = &[
    "CONFIG_VIRTIO_PCI",
    "CONFIG_VIRTIO_BLK",
    "CONFIG_VIRTIO_NET",
    "CONFIG_EXT4_FS",
    "CONFIG_NET_9P_VIRTIO",
    "CONFIG_9P_FS",
    "CONFIG_DEVTMPFS",
    "CONFIG_SERIAL_8250_CONSOLE",
    "CONFIG_INFINIBAND",
    "CONFIG_INFINIBAND_USER_ACCESS",
    "CONFIG_RDMA_RXE",
    "CONFIG_RDMA_SIW",
    "CONFIG_SMC",
    "CONFIG_GVE",
    "CONFIG_INFINIBAND_ERDMA",
];

/// The image cannot be booted as a guest kernel; the message says why and
/// names the path.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct KernelImageError(pub String);

/// The kernel version string of bzImage `path` (`"7.3.4 (user@host) #1 SMP ..."`,
/// or `"unknown version"` when the header has none).
///
/// Fails for a missing or unreadable file, a directory, or a file that is not
/// an x86 bzImage (a vmlinux ELF file, a text file).
pub fn check_bzimage(path: &str) -> Result<String, KernelImageError> {
    let err = |s: String| Err(KernelImageError(s));
    if path.is_empty() {
        return err("--kernel needs a path to a bzImage".into());
    }
    let p = Path::new(path);
    if !p.exists() {
        return err(format!("kernel image {path} not found"));
    }
    if p.is_dir() {
        return err(format!(
            "kernel image {path} is a directory; give the bzImage file (a kernel tree's arch/x86/boot/bzImage)"
        ));
    }
    let mut head = Vec::with_capacity(0x8000);
    if let Err(e) = File::open(p).and_then(|f| f.take(0x8000).read_to_end(&mut head)) {
        return err(format!(
            "kernel image {path} cannot be read: {}",
            os_reason(&e)
        ));
    }
    if head.starts_with(b"\x7fELF") {
        return err(format!(
            "kernel image {path} is an ELF file (vmlinux?), not a bzImage: give arch/x86/boot/bzImage (make bzImage)"
        ));
    }
    if head.len() < 0x210
        || head[BOOT_FLAG..BOOT_FLAG + 2] != [0x55, 0xAA]
        || &head[HEADER..HEADER + 4] != b"HdrS"
    {
        return err(format!(
            "kernel image {path} is not a bzImage (no x86 boot sector with a 'HdrS' setup header): \
             give arch/x86/boot/bzImage (make bzImage)"
        ));
    }
    let u16_at = |o: usize| u16::from_le_bytes([head[o], head[o + 1]]);
    let proto = u16_at(PROTOCOL);
    if proto < 0x0200 {
        return err(format!(
            "kernel image {path} uses boot protocol {}.{}, older than 2.00",
            proto >> 8,
            proto & 0xff
        ));
    }
    let start = 0x200 + u16_at(KERNEL_VERSION) as usize;
    let text = head.get(start..).unwrap_or_default();
    let text = &text[..text.len().min(256)];
    let text = text.split(|&b| b == 0).next().unwrap_or_default();
    let version: String = text
        .iter()
        .map(|&b| if b.is_ascii() { b as char } else { '\u{fffd}' })
        .collect();
    let version = version.trim();
    Ok(if start == 0x200 || version.is_empty() {
        "unknown version".into()
    } else {
        version.into()
    })
}

/// The kernel configuration that goes with bzImage `path`: `config` beside
/// it, else the `.config` of the tree it was built in
/// (`TREE/arch/x86/boot/bzImage`).
pub fn find_config(path: &str) -> Option<PathBuf> {
    let dir = PathBuf::from(abspath(path)).parent()?.to_path_buf();
    let tree = dir.ancestors().nth(3).map(|t| t.join(".config"));
    [Some(dir.join("config")), tree]
        .into_iter()
        .flatten()
        .find(|c| c.is_file())
}

/// Warnings for a kernel configuration: one for each [`REQUIRED`] option
/// that is not `=y`.
pub fn config_warnings(config: &str) -> Vec<String> {
    let mut have = std::collections::HashMap::new();
    for line in config.lines() {
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        let v = &v[..v.find(char::is_whitespace).unwrap_or(v.len())];
        let is_word = k.len() > 7 && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if k.starts_with("CONFIG_") && is_word && !v.is_empty() {
            have.insert(k, v);
        }
    }
    REQUIRED
        .iter()
        .filter_map(|o| {
            let what = match have.get(o).copied() {
                Some("y") => return None,
                Some("m") => "a module (=m): never loaded, the guests have no modules",
                _ => "not set",
            };
            Some(format!(
                "{o} is {what}; build it in (=y, scripts/kernel/fragment.config)"
            ))
        })
        .collect()
}

/// [`config_warnings`] of the configuration found beside `path` (none when
/// none is found), each prefixed with the configuration's path.
pub fn warnings_for(path: &str) -> Vec<String> {
    let Some(cfg) = find_config(path) else {
        return vec![];
    };
    match std::fs::read(&cfg) {
        Ok(text) => config_warnings(&String::from_utf8_lossy(&text))
            .into_iter()
            .map(|w| format!("{}: {w}", cfg.display()))
            .collect(),
        Err(_) => vec![],
    }
}

/// The series (`"7.3"`) of a version string such as `"7.3.4 (...) ..."` or
/// `"7.3.0-rc1+ ..."`; `None` when it does not start with `N.N`.
pub fn series_of(version: &str) -> Option<String> {
    let num = |s: &str| s.bytes().take_while(u8::is_ascii_digit).count();
    let a = num(version);
    let rest = version[a..].strip_prefix('.')?;
    let b = num(rest);
    (a > 0 && b > 0).then(|| format!("{}.{}", &version[..a], &rest[..b]))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::paths::tests::TempDir;

    /// A file with what an x86 bzImage's setup header has: the boot flag,
    /// `HdrS`, boot protocol 2.15 and the offset of the version string.
    pub(crate) fn fake_bzimage(path: &Path, version: &str) {
        let mut img = vec![0u8; 0x1000];
        img[0x1FE..0x200].copy_from_slice(&[0x55, 0xAA]);
        img[0x202..0x206].copy_from_slice(b"HdrS");
        img[0x206..0x208].copy_from_slice(&0x020Fu16.to_le_bytes());
        img[0x20E..0x210].copy_from_slice(&(0x600u16 - 0x200).to_le_bytes());
        img[0x600..0x600 + version.len()].copy_from_slice(version.as_bytes());
        std::fs::write(path, img).unwrap();
    }

    const V: &str = "7.3.9-mydriver (dev@box) #3 SMP PREEMPT_DYNAMIC";

    #[test]
    fn the_image_check() {
        let t = TempDir::new();
        let good = t.path("bzImage");
        fake_bzimage(Path::new(&good), V);
        assert_eq!(check_bzimage(&good).unwrap(), V);
        let text = t.path("notes.txt");
        std::fs::write(&text, "not a kernel\n".repeat(100)).unwrap();
        let elf = t.path("vmlinux");
        std::fs::write(&elf, [b"\x7fELF".as_slice(), &[0; 0x1000]].concat()).unwrap();
        let none = t.path("none");
        for (path, why) in [
            (&none, "not found"),
            (&text, "is not a bzImage"),
            (&elf, "is an ELF file"),
            (&t.path(""), "is a directory"),
        ] {
            let e = check_bzimage(path).unwrap_err().to_string();
            assert!(e.contains(why) && e.contains(path.as_str()), "{path}: {e}");
        }
        assert!(check_bzimage("")
            .unwrap_err()
            .to_string()
            .contains("needs a path"));
        // boot protocol 1.x, and a header without a version string
        let mut img = std::fs::read(&good).unwrap();
        img[0x206..0x208].copy_from_slice(&0x0104u16.to_le_bytes());
        std::fs::write(&none, &img).unwrap();
        assert!(check_bzimage(&none)
            .unwrap_err()
            .to_string()
            .contains("boot protocol 1.4, older than 2.00"));
        img[0x206..0x208].copy_from_slice(&0x020Fu16.to_le_bytes());
        img[0x20E..0x210].copy_from_slice(&[0, 0]);
        std::fs::write(&none, &img).unwrap();
        assert_eq!(check_bzimage(&none).unwrap(), "unknown version");
    }

    #[test]
    fn series() {
        assert_eq!(series_of(V).as_deref(), Some("7.3"));
        assert_eq!(series_of("6.12.0-rc1+ #1").as_deref(), Some("6.12"));
        assert_eq!(series_of("unknown version"), None);
        assert_eq!(series_of("7."), None);
    }

    #[test]
    fn the_config_beside_the_image_is_checked() {
        let t = TempDir::new();
        let good = t.path("bzImage");
        fake_bzimage(Path::new(&good), V);
        assert!(
            warnings_for(&good).is_empty(),
            "no configuration found: nothing to say"
        );
        // a kernel tree: TREE/.config and TREE/arch/x86/boot/bzImage
        let boot = t.path("linux/arch/x86/boot");
        std::fs::create_dir_all(&boot).unwrap();
        let img = format!("{boot}/bzImage");
        fake_bzimage(Path::new(&img), V);
        let mut cfg: String = REQUIRED
            .iter()
            .filter(|o| !["CONFIG_GVE", "CONFIG_RDMA_SIW"].contains(o))
            .map(|o| format!("{o}=y\n"))
            .collect();
        cfg += "CONFIG_GVE=m\n# CONFIG_RDMA_SIW is not set\n";
        std::fs::write(t.path("linux/.config"), cfg).unwrap();
        let w = warnings_for(&img);
        assert_eq!(w.len(), 2, "{w:?}");
        let prefix = format!("{}: ", t.path("linux/.config"));
        assert!(w.iter().all(|x| x.starts_with(&prefix)), "{w:?}");
        assert!(
            w.iter()
                .any(|x| x.contains("CONFIG_GVE is a module (=m): never loaded")),
            "{w:?}"
        );
        assert!(
            w.iter().any(|x| x.contains("CONFIG_RDMA_SIW is not set")),
            "{w:?}"
        );
        // `config` beside the image wins
        std::fs::write(format!("{boot}/config"), "CONFIG_GVE=y\n").unwrap();
        assert_eq!(warnings_for(&img).len(), REQUIRED.len() - 1);
    }
}

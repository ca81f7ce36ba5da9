#!/usr/bin/env python3
"""guest_kernel: checks a bring-your-own guest kernel image (`--kernel PATH`
of scripts/run-guests, scripts/demo.sh, the e2e scripts and ci/matrix.sh).

    python3 scripts/guest_kernel.py PATH     # prints the kernel's version, exit 2 with the reason if unusable

When the kernel's configuration is found beside the image (`config` in the
same directory, as in an image or prebuilt-kernel folder, or the `.config`
of the kernel tree whose arch/x86/boot/bzImage it is), the options the
guests cannot do without are checked too, and those not built in (`=y`) are
printed as warnings (stderr): a modular driver is never loaded in these
guests.

A usable image is an x86 bzImage (arch/x86/boot/bzImage of a kernel build):
its boot sector ends in 0x55 0xAA at offset 0x1FE and its setup header
starts with the magic "HdrS" at 0x202 (boot protocol 2.00 or later, which
also gives the offset of the kernel's version string). The guests boot it
with the image's root disk and no initramfs, so every driver the tests use
(virtio, 9p, ext4, RDMA, gve, erdma, ...) must be built in: see
docs/guest-tests.md, "Bring your own kernel". Python 3 standard library only.
"""

import os
import re
import struct
import sys

# Offsets in the setup header (Documentation/arch/x86/boot.rst).
BOOT_FLAG = 0x1FE      # 2 bytes: 0x55 0xAA
HEADER = 0x202         # 4 bytes: "HdrS"
VERSION = 0x206        # u16 boot protocol version
KERNEL_VERSION = 0x20E  # u16: version string offset - 0x200


# What the guests cannot boot or run the tests without, built in: the
# image's init, root disk and 9p job share (as scripts/build-guest-image.sh
# requires), and the drivers of the devices the daemon serves.
REQUIRED = ["CONFIG_VIRTIO_PCI", "CONFIG_VIRTIO_BLK", "CONFIG_VIRTIO_NET", "CONFIG_EXT4_FS",
            "CONFIG_NET_9P_VIRTIO", "CONFIG_9P_FS", "CONFIG_DEVTMPFS", "CONFIG_SERIAL_8250_CONSOLE",
            "CONFIG_INFINIBAND", "CONFIG_INFINIBAND_USER_ACCESS", "CONFIG_RDMA_RXE", "CONFIG_RDMA_SIW",
            "CONFIG_SMC", "CONFIG_GVE", "CONFIG_INFINIBAND_ERDMA"]


class KernelImageError(ValueError):
    """The image cannot be booted as a guest kernel; the message says why."""


def check_bzimage(path):
    """The kernel version string of bzImage `path` ("7.3.4 (user@host) #1 SMP ...").

    Raises KernelImageError naming the path for a missing or unreadable
    file, a directory, or a file that is not an x86 bzImage (a vmlinux ELF
    file, a compressed module tree, a text file)."""
    if not path:
        raise KernelImageError("--kernel needs a path to a bzImage")
    if not os.path.exists(path):
        raise KernelImageError(f"kernel image {path} not found")
    if os.path.isdir(path):
        raise KernelImageError(f"kernel image {path} is a directory; give the bzImage file "
                               "(a kernel tree's arch/x86/boot/bzImage)")
    try:
        with open(path, "rb") as f:
            head = f.read(0x8000)
    except OSError as e:
        raise KernelImageError(f"kernel image {path} cannot be read: {e.strerror}") from None
    if head[:4] == b"\x7fELF":
        raise KernelImageError(f"kernel image {path} is an ELF file (vmlinux?), not a bzImage: "
                               "give arch/x86/boot/bzImage (make bzImage)")
    if len(head) < 0x210 or head[BOOT_FLAG:BOOT_FLAG + 2] != b"\x55\xaa" or head[HEADER:HEADER + 4] != b"HdrS":
        raise KernelImageError(f"kernel image {path} is not a bzImage (no x86 boot sector with a "
                               "'HdrS' setup header): give arch/x86/boot/bzImage (make bzImage)")
    proto = struct.unpack_from("<H", head, VERSION)[0]
    if proto < 0x0200:
        raise KernelImageError(f"kernel image {path} uses boot protocol {proto >> 8}.{proto & 0xff}, "
                               "older than 2.00")
    off = struct.unpack_from("<H", head, KERNEL_VERSION)[0]
    if off == 0:
        return "unknown version"
    start = 0x200 + off
    text = head[start:start + 256].split(b"\0", 1)[0]
    return text.decode("ascii", "replace").strip() or "unknown version"


def find_config(path):
    """The kernel configuration that goes with bzImage `path`, or None:
    `config` beside it, else the `.config` of the tree it was built in
    (PATH = TREE/arch/x86/boot/bzImage)."""
    d = os.path.dirname(os.path.abspath(path))
    for c in (os.path.join(d, "config"), os.path.join(d, "..", "..", "..", ".config")):
        if os.path.isfile(c):
            return os.path.normpath(c)
    return None


def config_warnings(config_text):
    """Warnings for a kernel configuration: each REQUIRED option not `=y`."""
    have = {}
    for line in config_text.splitlines():
        m = re.match(r"(CONFIG_\w+)=(\S+)", line)
        if m:
            have[m.group(1)] = m.group(2)
    out = []
    for o in REQUIRED:
        v = have.get(o)
        if v == "y":
            continue
        what = "a module (=m): never loaded, the guests have no modules" if v == "m" else "not set"
        out.append(f"{o} is {what}; build it in (=y, scripts/kernel/fragment.config)")
    return out


def series_of(version):
    """'7.3' for a version string '7.3.4 (...) ...' or '7.3.0-rc1+ ...'; None if unparsable."""
    m = re.match(r"(\d+)\.(\d+)", version or "")
    return f"{m.group(1)}.{m.group(2)}" if m else None


def main(argv):
    if len(argv) != 2 or argv[1] in ("-h", "--help"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    try:
        print(check_bzimage(argv[1]))
    except KernelImageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for w in warnings_for(argv[1]):
        print(f"warning: {w}", file=sys.stderr)
    return 0


def warnings_for(path):
    """config_warnings of the configuration found beside `path` (none if none is found)."""
    cfg = find_config(path)
    if not cfg:
        return []
    try:
        with open(cfg, errors="replace") as f:
            return [f"{cfg}: {w}" for w in config_warnings(f.read())]
    except OSError:
        return []


if __name__ == "__main__":
    sys.exit(main(sys.argv))

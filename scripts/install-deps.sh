#!/usr/bin/env bash
# Installs what the build, the tests and the guest harness need on a Debian
# host: apt packages (only those missing; apt-get update only when something
# is missing) and the Rust components. Idempotent; a warm machine does nothing.
set -euo pipefail
pkgs=(python3 e2fsprogs iproute2 util-linux xz-utils zstd cpio ca-certificates curl gnupg debian-archive-keyring qemu-system-x86 qemu-utils
      tshark   # tshark: vhost-rdma/tests/faults.rs decodes captures with it (skips loudly without)
      iputils-ping ethtool   # the matrix's uplinks cell pings from host network namespaces
      # smc-guest-tests `verbs` (ibverbs crate): ibverbs-sys runs cmake on its vendored
      # rdma-core (needs libnl) and bindgen (libclang) to make its bindings; the binary
      # links the system libibverbs and librdmacm (-dev for the .so link names)
      cmake pkg-config gcc libc6-dev libclang-dev libnl-3-dev libnl-route-3-dev libibverbs-dev librdmacm-dev
      # scripts/check-contrib.sh validates contrib/: systemd-analyze verify (systemd),
      # virt-xml-validate (libvirt-clients) which runs xmllint (libxml2-utils)
      systemd libvirt-clients libxml2-utils)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "install-deps: apt-get install ${missing[*]}" >&2
    SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
command -v cargo >/dev/null || { echo "install-deps: cargo not found: install a Rust toolchain (rustup) first" >&2; exit 1; }
for c in rustfmt clippy; do
    rustup component list --installed 2>/dev/null | grep -q "^$c" || rustup component add "$c" >&2 || true
done
echo "install-deps: ok" >&2

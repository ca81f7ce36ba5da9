#!/usr/bin/env bash
# The kernel's NIC driver selftests (tools/testing/selftests/drivers/net and
# drivers/net/hw, Python), unmodified, from the same Debian linux-source
# package as the guest kernel, as a tree a guest can run in place.
set -euo pipefail
VR_PROG=build-nic-selftests
. "$(dirname "$(readlink -f "$0")")/lib.sh"

RECIPE=2      # bump when the tree's layout or the build steps (not the inputs) change
# What the Python suites import or read, relative to the source root:
# their own lib/py, net/lib/py (ksft, ynl wrappers), the ynl library and
# the netlink specs it loads.
PARTS=(tools/testing/selftests/drivers/net tools/testing/selftests/net/lib
    tools/net/ynl Documentation/netlink/specs)
# The suites' helper programs, built with the selftests' own Makefiles (DIR:
# targets): C tools (ynl-based ones link the in-tree ynl library) and the
# XDP programs (clang -target bpf, libbpf headers from tools/lib/bpf).
# ncdevmem is scripts/build-ncdevmem.sh's (built once, shared with the gve cell).
HELPERS=("drivers/net/hw:toeplitz nk_forward.bpf.o nk_primary_rx_redirect.bpf.o"
    "drivers/net:napi_id_helper so_txtime psp_responder"
    "net/lib:gro csum xdp_helper xdp_dummy.bpf.o xdp_native.bpf.o xdp_metadata.bpf.o")
# Not in the tree the guests get (too big, not needed to build the above).
EXCLUDE_TOP=(drivers sound fs Documentation/devicetree Documentation/translations
    Documentation/arch Documentation/admin-guide rust samples security crypto block)

usage() {
    cat <<EOF
Usage: ${0##*/} [--kernel VERSION]

Extracts the kernel's NIC driver selftests (drivers/net/*.py and
drivers/net/hw/*.py with their Python libraries, tools/net/ynl and
Documentation/netlink/specs) from Debian's linux-source-VERSION (default
7.3; the package scripts/build-guest-image.sh uses, downloaded only if
absent) into \$VHOST_RDMA_CACHE/nic-selftests/<key>/src/ (the source
tree's layout, so the suites find ynl "in tree"), builds the helper
programs the suites run (toeplitz, napi_id_helper, so_txtime,
psp_responder, gro, csum, xdp_helper and the XDP objects) with the
selftests' own Makefiles after "make headers", adds ncdevmem from
scripts/build-ncdevmem.sh, and prints that directory
as the LAST line of stdout. A warm run builds and extracts nothing.

Nothing is patched. Not built: iou-zcrx (needs a liburing with the zcrx
API, newer than the host's). Host packages (installed if missing): make,
gcc, clang, llvm, libelf-dev, zlib1g-dev, python3-yaml, python3-jsonschema.
The guests need python3, python3-yaml, ethtool, iproute2 (ip, tc,
devlink), socat and iperf3 (scripts/build-guest-image.sh).
EOF
}

kver=7.3
while (($#)); do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --kernel) [[ $# -ge 2 ]] || die "--kernel needs a version"; kver="$2"; shift 2 ;;
        *) die "unknown argument $1 (see --help)" ;;
    esac
done
[[ "$kver" =~ ^[0-9]+\.[0-9]+$ ]] || die "bad kernel version '$kver' (want e.g. 7.3)"
need_cmd sha256sum flock tar dpkg-deb xz
T0=$(date +%s)
self_hash="$(sha256_file "$(readlink -f "$0")")"

# scripts/build-ncdevmem.sh: ncdevmem, and the source package when absent.
ncd="$("$VR_SCRIPTS/build-ncdevmem.sh" --kernel "$kver" | tail -n 1)"
[[ -x "$ncd/ncdevmem" ]] || die "scripts/build-ncdevmem.sh gave no ncdevmem ($ncd)"
srcdeb="$(ls "$VR_CACHE/kernels/src/linux-source-${kver}_"*.deb 2>/dev/null | sort -V | tail -n 1 || true)"
[[ -n "$srcdeb" ]] || die "no linux-source-$kver .deb in $VR_CACHE/kernels/src"
srcver="$(dpkg-deb -f "$srcdeb" Version)"
key="$(short_key "nic-selftests-v$RECIPE" "linux-source-$kver=$srcver" "script=$self_hash" \
    "gcc=$(gcc --version 2>/dev/null | head -1)" "ncdevmem=$(sha256_file "$ncd/ncdevmem")")"
out="$VR_CACHE/nic-selftests/$key"

extract() {
    [[ -e "$out/.complete" ]] && return 0
    local tarball p e h dir t ex=() t0
    t0=$(date +%s)
    host_apt_install make gcc libc6-dev clang llvm libelf-dev zlib1g-dev python3 python3-yaml \
        python3-jsonschema xz-utils
    need_cmd make gcc clang python3
    mkdir -p "$VR_CACHE/nic-selftests"
    # global, not local: the EXIT trap runs after extract() has returned
    NST_TMP="$(mktemp -d "$VR_CACHE/nic-selftests/.$key.XXXXXX")"
    trap 'rm -rf "${NST_TMP:-}"' EXIT
    tarball="$(dpkg-deb -c "$srcdeb" | awk '{print $NF}' | grep -E '^\./usr/src/linux-source-.*\.tar\.(xz|bz2|gz|zst)$' | head -1)"
    [[ -n "$tarball" ]] || die "no source tarball in $srcdeb"
    info "unpacking $(basename "$srcdeb")"
    for e in "${EXCLUDE_TOP[@]}"; do ex+=("--exclude=linux-source-$kver/$e"); done
    dpkg-deb --fsys-tarfile "$srcdeb" | tar -x -O "$tarball" | tar -xJ -C "$NST_TMP" "${ex[@]}"
    local src="$NST_TMP/linux-source-$kver"
    for p in "${PARTS[@]}"; do [[ -d "$src/$p" ]] || die "$p missing from $srcdeb"; done
    info "make headers"
    (cd "$src" && make -s headers) >"$NST_TMP/headers.log" 2>&1 \
        || { tail -30 "$NST_TMP/headers.log" >&2; die "make headers failed"; }
    for h in "${HELPERS[@]}"; do
        dir="$src/tools/testing/selftests/${h%%:*}"
        info "make in ${h%%:*}: ${h#*:}"
        for t in ${h#*:}; do
            (cd "$dir" && make "$PWD/$t") >>"$NST_TMP/build.log" 2>&1 \
                || { tail -30 "$NST_TMP/build.log" >&2; die "building ${h%%:*}/$t failed"; }
            [[ -e "$dir/$t" ]] || die "make produced no ${h%%:*}/$t"
        done
    done
    install -m 0755 "$ncd/ncdevmem" "$src/tools/testing/selftests/drivers/net/hw/ncdevmem"
    mkdir -p "$NST_TMP/src"
    for p in "${PARTS[@]}"; do
        mkdir -p "$NST_TMP/src/$(dirname "$p")"
        cp -a "$src/$p" "$NST_TMP/src/$p"
    done
    # build by-products the guests do not need
    rm -rf "$NST_TMP/src/tools/testing/selftests/net/lib/tools" \
        "$NST_TMP/src/tools/testing/selftests/drivers/net/hw/tools"
    find "$NST_TMP/src" -name '*.d' -delete
    {
        echo "source=linux-source-$kver $srcver ($(basename "$srcdeb"))"
        echo "parts=${PARTS[*]}"
        echo "helpers=${HELPERS[*]}"
        echo "compilers=$(gcc --version | head -1); $(clang --version | head -1)"
        echo "recipe=$RECIPE script_sha256=$self_hash"
        echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    } >"$NST_TMP/manifest"
    cp "$NST_TMP/build.log" "$NST_TMP/src.build.log"
    rm -rf "$src" "$NST_TMP/headers.log" "$NST_TMP/build.log"
    date -u +%Y-%m-%dT%H:%M:%SZ >"$NST_TMP/.complete"
    rm -rf "$out"
    mv "$NST_TMP" "$out"
    NST_TMP=""
    info "built in $(elapsed_since "$t0")"
}

with_lock "nic-selftests-$key" extract
info "NIC selftests: $out/src/tools/testing/selftests/drivers/net ($(elapsed_since "$T0"))"
echo "$out"

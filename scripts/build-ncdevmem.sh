#!/usr/bin/env bash
# Build (or find in the cache) the kernel's devmem TCP selftest tool
# `ncdevmem` (tools/testing/selftests/drivers/net/hw/ncdevmem.c), unmodified,
# from Debian's linux-source package, for use inside the guests.
set -euo pipefail
VR_PROG=build-ncdevmem
. "$(dirname "$(readlink -f "$0")")/lib.sh"

SUITES="$VR_DEBIAN_SUITES_DEFAULT"        # trixie,trixie-backports
RECIPE=1      # bump when the build steps (not the inputs) change
SELFTEST_DIR=tools/testing/selftests/drivers/net/hw
# Top-level trees `make headers` + the ynl generator do not need; left out of
# the extraction to save time and disk (tools/, include/, arch/x86/, scripts/,
# Documentation/netlink/specs and MAINTAINERS stay).
EXCLUDE_TOP=(drivers sound fs net Documentation/devicetree Documentation/translations
    Documentation/arch Documentation/admin-guide rust samples security crypto block io_uring)

usage() {
    cat <<EOF
Usage: ${0##*/} [--kernel VERSION] [--rebuild]

Builds ncdevmem (the devmem TCP selftest tool) from the unmodified Debian
package linux-source-VERSION (default 7.3, from $SUITES) and caches it in
\$VHOST_RDMA_CACHE/ncdevmem/<key>/ holding
    ncdevmem    the binary (dynamically linked against glibc only; built on
                the host, runs in the trixie guests)
    manifest    source package version, recipe, compiler, NEEDED libraries
and prints that directory as the LAST line of stdout. <key> hashes the
source package version and this script; a warm run builds and downloads
nothing.

The source package is the one scripts/build-guest-image.sh uses
(\$VHOST_RDMA_CACHE/kernels/src/linux-source-VERSION_*.deb); it is
downloaded only if absent. Build: unpack the tarball (without drivers/,
sound/, fs/, net/ ...), "make headers", then "make \$PWD/ncdevmem" in
$SELFTEST_DIR (the ynl code generator needs python3-yaml and
python3-jsonschema, installed on the host if missing).

Run in a guest (ncdevmem calls ethtool; enable ntuple filters first):
    ethtool -K eth0 ntuple on
    ncdevmem -f eth0                                   # devmem API self-check
    ncdevmem -l -f eth0 -s SERVER_IP -c CLIENT_IP -p 5201 -v 7   # receive

--kernel VERSION   linux-source series (default 7.3)
--rebuild          build even if the cache has this key (replaces it)
Environment: VHOST_RDMA_CACHE, VHOST_RDMA_KEEP_NCDEVMEM_BUILD=1 (keep the
unpacked tree under \$VHOST_RDMA_CACHE/ncdevmem/build/).
EOF
}

kver=7.3 rebuild=0
while (($#)); do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --kernel) [[ $# -ge 2 ]] || die "--kernel needs a version"; kver="$2"; shift 2 ;;
        --kernel=*) kver="${1#--kernel=}"; shift ;;
        --rebuild) rebuild=1; shift ;;
        *) die "unknown argument $1 (see --help)" ;;
    esac
done
[[ "$kver" =~ ^[0-9]+\.[0-9]+$ ]] || die "bad kernel version '$kver' (want e.g. 7.3)"
need_cmd sha256sum flock tar dpkg-deb xz
T0=$(date +%s)
pkg="linux-source-$kver"
self_hash="$(sha256_file "$(readlink -f "$0")")"

# The source .deb: the newest one already in the cache, else download it.
find_srcdeb() {
    local f
    f="$(ls "$VR_CACHE/kernels/src/${pkg}_"*.deb 2>/dev/null | sort -V | tail -n 1 || true)"
    [[ -n "$f" && -f "$f" ]] && printf '%s\n' "$f"
}
download_srcdeb() {
    local apt_dir
    apt_dir="$(vr_apt_dir "$SUITES")"
    mkdir -p "$VR_CACHE/kernels/src"
    _dl() {
        local uri fname size hash
        [[ -n "$(find_srcdeb)" ]] && return 0
        vr_apt_init "$SUITES"
        vr_apt_update "$SUITES"
        read -r uri fname size hash < <(vr_apt "$SUITES" --print-uris -qq download "$pkg") \
            || die "$pkg not found in $SUITES"
        info "downloading $fname ($((size / 1024 / 1024)) MiB)"
        (cd "$VR_CACHE/kernels/src" && vr_apt "$SUITES" download "$pkg" >&2) \
            || die "cannot download $pkg from $SUITES"
        [[ "SHA256:$(sha256_file "$VR_CACHE/kernels/src/$fname")" == "$hash" ]] \
            || die "$fname: checksum mismatch"
    }
    with_lock "apt-$(basename "$apt_dir")" _dl
}

srcdeb="$(find_srcdeb || true)"
if [[ -z "$srcdeb" ]]; then
    download_srcdeb
    srcdeb="$(find_srcdeb)" || die "no $pkg .deb in $VR_CACHE/kernels/src after download"
fi
srcver="$(dpkg-deb -f "$srcdeb" Version)"
key="$(short_key "ncdevmem-v$RECIPE" "$pkg=$srcver" "script=$self_hash")"
out="$VR_CACHE/ncdevmem/$key"

build() {
    if ((!rebuild)) && [[ -x "$out/ncdevmem" && -e "$out/.complete" ]]; then
        return 0
    fi
    local tarball src t0 ex=() e needed
    t0=$(date +%s)
    host_apt_install make gcc libc6-dev python3 python3-yaml python3-jsonschema xz-utils
    need_cmd make gcc python3 readelf
    mkdir -p "$VR_CACHE/ncdevmem/build"
    # global, not local: the EXIT trap runs after build() has returned
    NCD_WORK="$(mktemp -d "$VR_CACHE/ncdevmem/build/$key.XXXXXX")"
    trap 'rm -rf "${NCD_WORK:-}"' EXIT
    local work="$NCD_WORK"
    tarball="$(dpkg-deb -c "$srcdeb" | awk '{print $NF}' | grep -E '^\./usr/src/linux-source-.*\.tar\.(xz|bz2|gz|zst)$' | head -1)"
    [[ -n "$tarball" ]] || die "no source tarball in $srcdeb"
    info "unpacking $srcdeb ($srcver)"
    dpkg-deb --fsys-tarfile "$srcdeb" | tar -x -C "$work" "$tarball"
    for e in "${EXCLUDE_TOP[@]}"; do ex+=("--exclude=linux-source-$kver/$e"); done
    tar -xaf "$work/$tarball" -C "$work" "${ex[@]}"
    rm -rf "$work/usr"
    src="$work/linux-source-$kver"
    [[ -f "$src/Makefile" && -f "$src/MAINTAINERS" && -f "$src/$SELFTEST_DIR/ncdevmem.c" ]] \
        || die "unexpected source layout in $srcdeb (need Makefile, MAINTAINERS, $SELFTEST_DIR/ncdevmem.c)"
    info "make headers"
    (cd "$src" && make -s headers) >"$work/headers.log" 2>&1 \
        || { tail -30 "$work/headers.log" >&2; die "make headers failed"; }
    info "make ncdevmem (ynl: ethtool + netdev families)"
    # ynl's generator walks up to MAINTAINERS to find the tree root; the
    # io_uring test is skipped for lack of liburing (a warning only).
    (cd "$src/$SELFTEST_DIR" && make "$PWD/ncdevmem") >"$work/build.log" 2>&1 \
        || { tail -40 "$work/build.log" >&2; die "ncdevmem build failed"; }
    [[ -x "$src/$SELFTEST_DIR/ncdevmem" ]] || die "make produced no ncdevmem"
    needed="$(readelf -d "$src/$SELFTEST_DIR/ncdevmem" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')"
    [[ "${needed% }" == "libc.so.6" ]] \
        || die "ncdevmem needs libraries other than glibc ($needed); the guests may lack them"
    rm -rf "$out.tmp"; mkdir -p "$out.tmp"
    install -m 0755 "$src/$SELFTEST_DIR/ncdevmem" "$out.tmp/ncdevmem"
    {
        echo "source=$pkg $srcver ($(basename "$srcdeb"))"
        echo "path=$SELFTEST_DIR/ncdevmem.c sha256=$(sha256_file "$src/$SELFTEST_DIR/ncdevmem.c")"
        echo "recipe=$RECIPE script_sha256=$self_hash"
        echo "compiler=$(gcc --version | head -1)"
        echo "needed=${needed% }"
        echo "glibc_symbols_max=$(objdump -T "$out.tmp/ncdevmem" 2>/dev/null | grep -oE 'GLIBC_[0-9.]+' | sort -uV | tail -1)"
        echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    } >"$out.tmp/manifest"
    cp "$work/build.log" "$out.tmp/build.log"
    date -u +%Y-%m-%dT%H:%M:%SZ >"$out.tmp/.complete"
    rm -rf "$out"; mv "$out.tmp" "$out"
    if [[ "${VHOST_RDMA_KEEP_NCDEVMEM_BUILD:-0}" == 1 ]]; then
        trap - EXIT
        info "build tree kept: $src"
    fi
    info "ncdevmem built in $(elapsed_since "$t0")"
}

with_lock "ncdevmem-$key" build
info "ncdevmem: $out/ncdevmem ($pkg $srcver; $(elapsed_since "$T0"))"
echo "$out"

#!/usr/bin/env bash
# Provide QEMU 11.1 (Debian trixie-backports) on a bookworm host, as an
# extracted root in the cache plus wrapper scripts; or the host's stock QEMU.
set -euo pipefail
VR_PROG=setup-qemu
. "$(dirname "$(readlink -f "$0")")/lib.sh"

QEMU_SERIES="11.1"                        # upstream major.minor we require
QEMU_SUITES="trixie,trixie-backports"
QEMU_TARGET="trixie-backports"
QEMU_PKGS=(qemu-system-x86 qemu-utils)

usage() {
    cat <<EOF
Usage: ${0##*/} [--system] [--check]

Default: extract Debian's qemu-system-x86 + qemu-utils $QEMU_SERIES from
$QEMU_TARGET (full dependency closure, private apt, host dpkg untouched)
into \$VHOST_RDMA_CACHE/roots/, and write wrappers
    \$VHOST_RDMA_CACHE/qemu-$QEMU_SERIES/bin/{qemu-system-x86_64,qemu-img,...}
that run each binary through the root's own ld.so (--library-path) and pass
-L <root>/usr/share/qemu (+ seabios, ipxe dirs) so it works on bookworm.
Prints the qemu-system-x86_64 wrapper path. A warm run downloads nothing.

--system   instead use the host's stock qemu-system-x86 (apt-get install -y
           --no-install-recommends qemu-system-x86 if missing) and print
           /usr/bin/qemu-system-x86_64.
--check    also verify: --version is $QEMU_SERIES.x and -device help lists
           vhost-user-test-device-pci and virtio-net-pci (skipped for --system
           version check).
EOF
}

mode=cache check=0
while (($#)); do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --system) mode=system; shift ;;
        --check) check=1; shift ;;
        *) die "unknown argument $1 (see --help)" ;;
    esac
done

verify() {  # verify QEMU_BINARY [SERIES]
    local q="$1" series="${2:-}" ver devs
    ver="$("$q" --version | head -1)" || die "$q --version failed"
    info "$ver"
    if [[ -n "$series" && ! "$ver" =~ version\ ${series//./\\.}\. ]]; then
        die "$q is not QEMU $series.x: $ver"
    fi
    devs="$("$q" -nodefaults -machine none -device help 2>&1)" || die "$q -device help failed: $devs"
    grep -q '"virtio-net-pci"' <<<"$devs" || die "$q lacks virtio-net-pci"
    if grep -q '"vhost-user-test-device-pci"' <<<"$devs"; then
        info "devices ok: virtio-net-pci, vhost-user-test-device-pci"
    elif [[ -n "$series" ]]; then
        die "$q lacks vhost-user-test-device-pci"
    else
        warn "$q lacks vhost-user-test-device-pci (needs QEMU >= 10.2)"
    fi
}

if [[ $mode == system ]]; then
    if [[ ! -x /usr/bin/qemu-system-x86_64 ]]; then
        host_apt_install qemu-system-x86
    fi
    ((check)) && verify /usr/bin/qemu-system-x86_64
    echo /usr/bin/qemu-system-x86_64
    exit 0
fi

out="$VR_CACHE/qemu-$QEMU_SERIES"
wrapper="$out/bin/qemu-system-x86_64"
wrapper_version=4   # bump when the wrapper text changes

make_wrappers() {
    local root t0 ver tmp b name libpath
    t0=$(date +%s)
    root="$("$VR_SCRIPTS/debian-root.sh" -t "$QEMU_TARGET" "qemu-$QEMU_SERIES" "$QEMU_SUITES" "${QEMU_PKGS[@]}")"
    ver="$(awk '$1 == "qemu-system-x86" { print $2 }' "$root/.vr/packages")"
    [[ "$ver" =~ ^([0-9]+:)?${QEMU_SERIES//./\\.}\. ]] \
        || die "got qemu-system-x86 $ver from $QEMU_TARGET, expected $QEMU_SERIES.x"
    [[ -x "$root/usr/lib64/ld-linux-x86-64.so.2" ]] || die "no ld.so in $root"
    # QEMU resolves its module and firmware dirs relative to its executable
    # (here: the root's ld.so in usr/lib/x86_64-linux-gnu) when a "qemu-bundle"
    # dir sits beside it. Point it at the root so QEMU never falls back to the
    # host's /usr/lib/x86_64-linux-gnu/qemu (modules of another build abort it).
    ln -sfn ../../.. "$root/usr/lib/x86_64-linux-gnu/qemu-bundle"  # repo-paths: allow (inside the QEMU root)
    libpath="$root/usr/lib/x86_64-linux-gnu"
    for d in "$root"/usr/lib/x86_64-linux-gnu/*/ ; do
        # private library dirs some packages use (pulseaudio, ceph, ...)
        compgen -G "${d}lib*.so*" >/dev/null && libpath+=":${d%/}"
    done
    tmp="$(mktemp -d "$VR_CACHE/.qemu-$QEMU_SERIES.XXXXXX")"
    mkdir -p "$tmp/bin"
    for b in "$root"/usr/bin/qemu-*; do
        name="${b##*/}"
        [[ -f "$b" && -x "$b" ]] || continue
        {
            echo '#!/bin/sh'
            echo "# QEMU $ver from Debian $QEMU_TARGET, run via its own ld.so (written by scripts/setup-qemu.sh v$wrapper_version)"
            echo "R='$root'"
            echo 'QEMU_MODULE_DIR="$R/usr/lib/x86_64-linux-gnu/qemu"; export QEMU_MODULE_DIR'
            printf 'exec "$R/usr/lib64/ld-linux-x86-64.so.2" --inhibit-cache --library-path "%s" --argv0 "$0" "$R/usr/bin/%s"' \
                "${libpath//$root/\$R}" "$name"
            if [[ $name == qemu-system-* ]]; then
                printf ' -L "$R/usr/share/qemu" -L "$R/usr/share/seabios" -L "$R/usr/lib/ipxe/qemu"'
            fi
            printf ' "$@"\n'
        } >"$tmp/bin/$name"
        chmod 755 "$tmp/bin/$name"
    done
    [[ -x "$tmp/bin/qemu-system-x86_64" ]] || die "no qemu-system-x86_64 in $root"
    printf 'root=%s\nversion=%s\nwrapper_version=%s\n' "$root" "$ver" "$wrapper_version" >"$tmp/info"
    verify "$tmp/bin/qemu-system-x86_64" "$QEMU_SERIES"
    rm -rf "$out"
    mv "$tmp" "$out"
    info "QEMU $ver ready in $out ($(elapsed_since "$t0"))"
}

current() {
    [[ -x "$wrapper" && -r "$out/info" ]] || return 1
    grep -qx "wrapper_version=$wrapper_version" "$out/info" || return 1
    local root
    root="$(sed -n 's/^root=//p' "$out/info")"
    [[ -e "$root/.vr/complete" ]]
}

if ! current; then
    populate() { current || make_wrappers; }
    with_lock "qemu-$QEMU_SERIES" populate
fi
((check)) && verify "$wrapper" "$QEMU_SERIES"
echo "$wrapper"

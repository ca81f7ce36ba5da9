#!/usr/bin/env bash
# Build (or find in the cache) a guest image: a kernel (bzImage) with RDMA
# and SMC built in, and a read-only ext4 root (rootfs.ext4) from Debian trixie
# with rdma-core/perftest/iproute2/... and our PID 1 (scripts/guest/vr-init).
set -euo pipefail
VR_PROG=build-guest-image
. "$(dirname "$(readlink -f "$0")")/lib.sh"

SUITES="$VR_DEBIAN_SUITES_DEFAULT"        # trixie,trixie-backports
ROOTFS_PKGS=(
    busybox-static dash bash procps
    rdma-core ibverbs-providers ibverbs-utils rdmacm-utils perftest
    iproute2 ethtool iperf3
    python3-pyverbs python3-yaml socat iputils-ping
)
IMAGE_RECIPE=3       # bump when the image layout (not the inputs) changes
# allnoconfig rather than defconfig: the fragment names everything a guest
# needs, and the ~460 options defconfig adds besides (sound, USB, DRM, other
# NICs' drivers, ...) cost a third of the build (385 s instead of 571-598 s
# on 2 cores, ci/HISTORY.md "A leaner guest kernel").
KERNEL_RECIPE="allnoconfig; kvm_guest.config; merge_config.sh -m .config fragment.config; olddefconfig; bzImage"
# Options the guests cannot do without; checked in every built .config.
KERNEL_REQUIRED=(CONFIG_VIRTIO_PCI CONFIG_VIRTIO_BLK CONFIG_VIRTIO_NET CONFIG_EXT4_FS CONFIG_NET_9P_VIRTIO
    CONFIG_9P_FS CONFIG_DEVTMPFS CONFIG_SERIAL_8250_CONSOLE CONFIG_INFINIBAND CONFIG_INFINIBAND_USER_ACCESS
    CONFIG_RDMA_RXE CONFIG_RDMA_SIW CONFIG_SMC)

usage() {
    cat <<EOF
Usage: ${0##*/} [--kernel VERSION] [--rebuild-kernel] [--kernel-config-only]

Produces \$VHOST_RDMA_CACHE/images/<key>/ holding
    bzImage       guest kernel (RDMA rxe/siw, SMC, virtio, 9p, ext4 built in)
    config        its .config
    rootfs.ext4   Debian trixie root, label vrroot, init /sbin/vr-init
    manifest      kernel identity and package versions
and prints that directory as the LAST line of stdout. <key> hashes the
package list, scripts/guest/vr-init and the kernel identity; a warm run
downloads nothing.

Boot with: -kernel DIR/bzImage -drive file=DIR/rootfs.ext4,if=virtio,format=raw,snapshot=on
           -append "root=/dev/vda ro init=/sbin/vr-init console=ttyS0 vr.name=a vr.ip=10.0.0.1/24"

--kernel VERSION    kernel series, 7.3 (default) or 6.12: Debian package
                    linux-source-VERSION from $SUITES.
                    A prebuilt kernel from \$VHOST_RDMA_PREBUILT_KERNELS
                    (a directory of linux-VERSION.*-rdma*/ folders) is used
                    when its SHA256SUMS verify and its fragment.config equals
                    scripts/kernel/fragment.config; otherwise it is built.
--rebuild-kernel    build the kernel from source even if a prebuilt or cached
                    one exists (the result replaces the cached build).
--kernel-config-only  stop after "make olddefconfig" (checks the required
                    options) and print the .config path. For testing.

Kernel builds: \$VHOST_RDMA_CACHE/kernels/<srcversion>-<confighash>/bzImage
(recipe: $KERNEL_RECIPE); host build dependencies are apt-get installed only
when building. Environment: VHOST_RDMA_CACHE, VHOST_RDMA_PREBUILT_KERNELS (dir
holding linux-*-rdma*/ prebuilt kernels), VHOST_RDMA_KEEP_KERNEL_BUILD=1 (keep the build tree).
EOF
}

kver=7.3 rebuild=0 config_only=0
while (($#)); do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --kernel) [[ $# -ge 2 ]] || die "--kernel needs a version"; kver="$2"; shift 2 ;;
        --kernel=*) kver="${1#--kernel=}"; shift ;;
        --rebuild-kernel) rebuild=1; shift ;;
        --kernel-config-only) config_only=1; shift ;;
        *) die "unknown argument $1 (see --help)" ;;
    esac
done
[[ "$kver" =~ ^[0-9]+\.[0-9]+$ ]] || die "bad kernel version '$kver' (want e.g. 7.3 or 6.12)"

fragment="$VR_SCRIPTS/kernel/fragment.config"
initscript="$VR_SCRIPTS/guest/vr-init"
[[ -r "$fragment" ]] || die "missing $fragment"
[[ -r "$initscript" ]] || die "missing $initscript"
need_cmd sha256sum flock mke2fs tar dpkg-deb

T0=$(date +%s)

# ---------------------------------------------------------------------------
# Kernel. Sets KERNEL_IMAGE, KERNEL_CONFIG, KERNEL_ID.

check_kconfig() {  # check_kconfig .config
    local o missing=()
    for o in "${KERNEL_REQUIRED[@]}"; do
        grep -qx "$o=y" "$1" || missing+=("$o")
    done
    ((${#missing[@]} == 0)) || die "kernel config $1 lacks: ${missing[*]}"
}

use_prebuilt_kernel() {
    local base d found=""
    base="$(vr_prebuilt_kernels_dir)"
    [[ -n "$base" ]] || return 1
    [[ -d "$base" ]] || { warn "VHOST_RDMA_PREBUILT_KERNELS=$base is not a directory; building the kernel"; return 1; }
    # any linux-<kver>.<patch>-rdma[-N] whose fragment is ours; the newest wins
    for d in $(ls -d "$base/linux-$kver".*-rdma* 2>/dev/null | sort -rV); do
        [[ -r "$d/bzImage" && -r "$d/SHA256SUMS" && -r "$d/fragment.config" ]] || continue
        cmp -s "$d/fragment.config" "$fragment" || continue
        if ! (cd "$d" && sha256sum --quiet -c SHA256SUMS >/dev/null 2>&1); then
            warn "$d: SHA256SUMS do not verify; not using it"
            continue
        fi
        found="$d"; break
    done
    if [[ -z "$found" ]]; then
        info "no prebuilt kernel in $base has scripts/kernel/fragment.config; building our own"
        return 1
    fi
    KERNEL_IMAGE="$found/bzImage"
    KERNEL_CONFIG="$found/config"
    KERNEL_ID="prebuilt:${found##*/}:$(sha256_file "$found/bzImage")"
    info "kernel: prebuilt $found"
}

config_hash() {
    { cat "$fragment"; echo "$KERNEL_RECIPE"; gcc --version 2>/dev/null | head -1; } | sha256_stdin | cut -c1-16
}

build_kernel() {
    local pkg="linux-source-$kver" chash ptr t0
    chash="$(config_hash)"
    ptr="$VR_CACHE/kernels/linux-source-$kver-$chash.current"   # -> build dir name
    if ((!rebuild && !config_only)) && [[ -r "$ptr" ]] && [[ -r "$VR_CACHE/kernels/$(cat "$ptr")/bzImage" ]]; then
        _set_built "$VR_CACHE/kernels/$(cat "$ptr")"
        return
    fi
    t0=$(date +%s)
    _build() {
        if ((!rebuild && !config_only)) && [[ -r "$ptr" ]] && [[ -r "$VR_CACHE/kernels/$(cat "$ptr")/bzImage" ]]; then
            return 0
        fi
        local apt_dir srcdeb srcver work tarball out
        apt_dir="$(vr_apt_dir "$SUITES")"
        mkdir -p "$VR_CACHE/kernels/src"
        _dl() {
            local uri fname size hash
            vr_apt_init "$SUITES"
            vr_apt_update "$SUITES"
            read -r uri fname size hash < <(vr_apt "$SUITES" --print-uris -qq download "$pkg") \
                || die "$pkg not found in $SUITES"
            srcdeb="$VR_CACHE/kernels/src/$fname"
            if [[ -f "$srcdeb" ]] && [[ "SHA256:$(sha256_file "$srcdeb")" == "$hash" ]]; then
                info "have $fname"
            else
                info "downloading $fname ($((size / 1024 / 1024)) MiB)"
                (cd "$VR_CACHE/kernels/src" && vr_apt "$SUITES" download "$pkg" >&2) \
                    || die "cannot download $pkg from $SUITES"
            fi
            echo "$srcdeb" >"$VR_CACHE/kernels/src/.last-$pkg"
        }
        with_lock "apt-$(basename "$apt_dir")" _dl
        srcdeb="$(cat "$VR_CACHE/kernels/src/.last-$pkg")"
        [[ -f "$srcdeb" ]] || die "missing $srcdeb"
        srcver="$(dpkg-deb -f "$srcdeb" Version)"
        out="$VR_CACHE/kernels/$srcver-$chash"
        work="$VR_CACHE/kernels/build/$srcver-$chash"
        host_apt_install bc bison flex libelf-dev libssl-dev make gcc libc6-dev cpio xz-utils kmod
        info "unpacking $srcdeb"
        rm -rf "$work"; mkdir -p "$work"
        tarball="$(dpkg-deb -c "$srcdeb" | awk '{print $NF}' | grep -E '^\./usr/src/linux-source-.*\.tar\.(xz|bz2|gz|zst)$' | head -1)"
        [[ -n "$tarball" ]] || die "no source tarball in $srcdeb"
        dpkg-deb --fsys-tarfile "$srcdeb" | tar -x -C "$work" "$tarball"
        tar -xaf "$work/$tarball" -C "$work"
        rm -rf "$work/usr"
        local src
        src="$(ls -d "$work"/linux-source-*/ | head -1)"; src="${src%/}"
        [[ -n "$src" && -f "$src/Makefile" ]] || die "unexpected source layout in $srcdeb"
        info "configuring $srcver ($KERNEL_RECIPE)"
        (
            cd "$src"
            make -s allnoconfig
            make -s kvm_guest.config
            scripts/kconfig/merge_config.sh -m .config "$fragment" >merge_config.log 2>&1 \
                || { cat merge_config.log >&2; exit 1; }
            make -s olddefconfig
        ) >&2 || die "kernel configuration failed in $src"
        check_kconfig "$src/.config"
        if ((config_only)); then
            echo "$src/.config" >"$work/config-only"
            return 0
        fi
        info "building bzImage with $(nproc) jobs (takes a while)"
        (cd "$src" && make -j"$(nproc)" bzImage >"$work/build.log" 2>&1) \
            || { tail -40 "$work/build.log" >&2; die "kernel build failed; log: $work/build.log"; }
        rm -rf "$out.tmp"; mkdir -p "$out.tmp"
        cp "$src/arch/x86/boot/bzImage" "$out.tmp/bzImage"
        cp "$src/.config" "$out.tmp/config"
        cp "$fragment" "$out.tmp/fragment.config"
        printf 'source=%s %s\nrecipe=%s\ncompiler=%s\n' "$pkg" "$srcver" "$KERNEL_RECIPE" \
            "$(gcc --version | head -1)" >"$out.tmp/README"
        (cd "$out.tmp" && sha256sum bzImage config >SHA256SUMS)
        rm -rf "$out"; mv "$out.tmp" "$out"
        echo "${out##*/}" >"$ptr.tmp" && mv "$ptr.tmp" "$ptr"
        [[ "${VHOST_RDMA_KEEP_KERNEL_BUILD:-0}" == 1 ]] || rm -rf "$work"
        info "kernel $out built in $(elapsed_since "$t0")"
    }
    with_lock "kernel-$kver" _build
    if ((config_only)); then
        local w
        w="$(ls -td "$VR_CACHE"/kernels/build/*-"$chash"/config-only | head -1)"
        info "kernel config OK ($(elapsed_since "$t0")): required options present"
        cat "$w"
        exit 0
    fi
    _set_built "$VR_CACHE/kernels/$(cat "$ptr")"
}

_set_built() {
    KERNEL_IMAGE="$1/bzImage"
    KERNEL_CONFIG="$1/config"
    KERNEL_ID="built:${1##*/}:$(sha256_file "$1/bzImage")"
    info "kernel: $1"
}

if ((!rebuild && !config_only)) && use_prebuilt_kernel; then
    :
else
    build_kernel
fi

# ---------------------------------------------------------------------------
# Root file system.

mapfile -t pkgs_sorted < <(printf '%s\n' "${ROOTFS_PKGS[@]}" | sort -u)
key="$(short_key "image-v$IMAGE_RECIPE" "suites=$SUITES" "${pkgs_sorted[@]}" \
    "init=$(sha256_file "$initscript")" "kernel=$KERNEL_ID")"
img="$VR_CACHE/images/$key"

make_image() {
    [[ -e "$img/.complete" ]] && return 0
    local root tmp stage size_mb inodes t0
    t0=$(date +%s)
    root="$("$VR_SCRIPTS/debian-root.sh" rootfs "$SUITES" "${ROOTFS_PKGS[@]}")"
    mkdir -p "$VR_CACHE/images"
    tmp="$(mktemp -d "$VR_CACHE/images/.$key.XXXXXX")"
    trap 'rm -rf "${tmp:-}"' EXIT
    stage="$tmp/stage"
    cp -a "$root" "$stage"
    # rdma-core's own test suite (tests/ of the same rdma-core as the
    # guest's libraries; the matrix's upstream cell runs it) ships in
    # python3-pyverbs under /usr/share/doc, which the image drops, and Debian
    # compresses its larger files there: keep it, uncompressed, in
    # /opt/rdma-core-tests.
    if [[ -d "$stage/usr/share/doc/rdma-core/tests" ]]; then
        mkdir -p "$stage/opt"
        mv "$stage/usr/share/doc/rdma-core/tests" "$stage/opt/rdma-core-tests"
        find "$stage/opt/rdma-core-tests" -name '*.gz' -exec gunzip {} +
    fi
    rm -rf "$stage/.vr" "$stage"/usr/share/{doc,man,info,locale,lintian,bash-completion}
    # our init and the mount points it uses
    install -D -m 0755 "$initscript" "$stage/sbin/vr-init"
    mkdir -p "$stage"/{proc,sys,dev,tmp,run,root,home,mnt,job,opt/vr,var/tmp,var/log,var/lib,var/cache}
    chmod 1777 "$stage/tmp" "$stage/var/tmp"; chmod 0700 "$stage/root"
    # busybox applets where Debian packages left gaps (no maintainer scripts
    # ran, so e.g. /bin/sh does not exist yet)
    local a dir
    while read -r a; do
        [[ -n "$a" ]] || continue
        a="/${a#/}"
        dir="$(dirname "$a")"; dir="/usr${dir#/usr}"
        [[ -e "$stage$dir/${a##*/}" || -L "$stage$dir/${a##*/}" ]] && continue
        [[ -e "$stage/usr/bin/${a##*/}" || -L "$stage/usr/bin/${a##*/}" ]] && continue
        [[ -e "$stage/usr/sbin/${a##*/}" || -L "$stage/usr/sbin/${a##*/}" ]] && continue
        mkdir -p "$stage$dir"
        ln -s /usr/bin/busybox "$stage$dir/${a##*/}"
    done < <("$stage/usr/bin/busybox" --list-full)
    # /bin/sh is dash as on any Debian system (dash's postinst would make it)
    rm -f "$stage/usr/bin/sh"
    if [[ -x "$stage/usr/bin/dash" ]]; then ln -s dash "$stage/usr/bin/sh"; else ln -s busybox "$stage/usr/bin/sh"; fi
    # minimal /etc that maintainer scripts would have created
    [[ -e "$stage/etc/passwd" ]] || cp "$stage/usr/share/base-passwd/passwd.master" "$stage/etc/passwd"
    [[ -e "$stage/etc/group" ]] || cp "$stage/usr/share/base-passwd/group.master" "$stage/etc/group"
    printf '127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' >"$stage/etc/hosts"
    echo vr-guest >"$stage/etc/hostname"
    : >"$stage/etc/fstab"
    ln -sfn /proc/self/mounts "$stage/etc/mtab"
    ldconfig -r "$stage" 2>/dev/null || warn "ldconfig -r failed; guest uses default library paths"
    {
        echo "kernel=$KERNEL_ID"
        echo "kernel_image_source=$KERNEL_IMAGE"
        echo "init_sha256=$(sha256_file "$initscript")"
        echo "suites=$SUITES"
        echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
        echo "packages:"
        sed 's/^/  /' "$root/.vr/packages"
    } >"$tmp/manifest"
    cp "$tmp/manifest" "$stage/etc/vr-image"
    size_mb=$(( $(du -sm "$stage" | cut -f1) * 12 / 10 + 48 ))
    inodes=$(( $(find "$stage" | wc -l) * 3 / 2 + 2048 ))
    mke2fs -q -F -t ext4 -L vrroot -d "$stage" -E root_owner=0:0 -m 0 -N "$inodes" \
        "$tmp/rootfs.ext4" "${size_mb}M" >&2 || die "mke2fs failed"
    rm -rf "$stage"
    cp "$KERNEL_IMAGE" "$tmp/bzImage"
    cp "$KERNEL_CONFIG" "$tmp/config"
    chmod 0644 "$tmp/bzImage" "$tmp/config"
    date -u +%Y-%m-%dT%H:%M:%SZ >"$tmp/.complete"
    chmod 755 "$tmp"
    rm -rf "$img"
    mv "$tmp" "$img"
    info "image $img: rootfs ${size_mb} MiB, built in $(elapsed_since "$t0")"
}

if [[ ! -e "$img/.complete" ]]; then
    with_lock "image-$key" make_image
fi
info "done in $(elapsed_since "$T0")"
echo "$img"

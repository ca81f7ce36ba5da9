#!/usr/bin/env bash
# Make an extracted Debian root (full dependency closure, no maintainer
# scripts) for a package set, without touching the host's dpkg database.
set -euo pipefail
VR_PROG=debian-root
. "$(dirname "$(readlink -f "$0")")/lib.sh"

usage() {
    cat <<EOF
Usage: ${0##*/} [-t|--target-release SUITE] NAME SUITESPEC PKG...

Resolve PKG... and their whole dependency closure (no Recommends) from the
Debian suites in SUITESPEC (comma separated, e.g. trixie,trixie-backports;
component main, fetched from the same mirror the host's apt uses), download
the .debs with a private apt state (empty dpkg status; the host's dpkg is
never touched) and extract every one into a root directory. Maintainer
scripts are not run; the usrmerge symlinks (/bin /sbin /lib /lib64 -> usr/)
are created up front.

PKG may use apt syntax: pkg=version, pkg/suite.
--target-release SUITE  prefer SUITE (apt -t), e.g. trixie-backports.

The root is cached at \$VHOST_RDMA_CACHE/roots/NAME-<key> (key = hash of the
suites, target release and sorted package list); a present root is reused
without any network access. Prints the root path on stdout. The root holds
.vr/packages (name version arch of every extracted package).

Environment: VHOST_RDMA_CACHE (default ~/.cache/vhost-rdma),
VHOST_RDMA_DEBIAN_MIRROR (default: from the host's apt sources),
VHOST_RDMA_APT_MAX_AGE (seconds before private lists are refreshed, 21600).
EOF
}

target=""
while (($#)); do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        -t|--target-release) [[ $# -ge 2 ]] || die "$1 needs an argument"; target="$2"; shift 2 ;;
        --) shift; break ;;
        -*) die "unknown option $1 (see --help)" ;;
        *) break ;;
    esac
done
[[ $# -ge 3 ]] || { usage >&2; exit 2; }
name="$1" spec="$2"; shift 2
[[ "$name" =~ ^[A-Za-z0-9._+-]+$ ]] || die "bad root name '$name'"
mapfile -t pkgs < <(printf '%s\n' "$@" | sort -u)

key="$(short_key "debian-root-v1" "$spec" "target=$target" "${pkgs[@]}")"
root="$VR_CACHE/roots/$name-$key"

if [[ -e "$root/.vr/complete" ]]; then
    echo "$root"
    exit 0
fi

need_cmd apt-get dpkg-deb tar flock sha256sum

build_root() {
    if [[ -e "$root/.vr/complete" ]]; then return 0; fi   # raced: someone else built it
    local t0 apt_dir topt=() n v a f total=0
    t0=$(date +%s)
    [[ -n "$target" ]] && topt=(-t "$target")
    apt_dir="$(vr_apt_dir "$spec")"
    list="$(mktemp)"
    # Resolve and download under the private-apt lock.
    _resolve() {
        vr_apt_init "$spec"
        vr_apt_update "$spec"
        info "resolving ${pkgs[*]} (suites $spec${target:+, target $target})"
        vr_apt "$spec" "${topt[@]}" -s install "${pkgs[@]}" >"$list.sim" 2>&1 \
            || { cat "$list.sim" >&2; die "dependency resolution failed"; }
        # Inst NAME (VERSION SUITE [ARCH])
        awk '$1 == "Inst" && match($0, /\[[a-z0-9]+\]\)/) {
                v = $3; sub(/^\(/, "", v); a = substr($0, RSTART + 1, RLENGTH - 3); print $2, v, a }' \
            "$list.sim" | sort >"$list"
        [[ -s "$list" ]] || { cat "$list.sim" >&2; die "apt selected no packages"; }
        info "downloading $(wc -l <"$list") packages"
        vr_apt "$spec" "${topt[@]}" -y --download-only install "${pkgs[@]}" >&2 \
            || die "download failed"
    }
    with_lock "apt-$(basename "$apt_dir")" _resolve

    mkdir -p "$VR_CACHE/roots"
    tmp="$(mktemp -d "$VR_CACHE/roots/.$name-$key.XXXXXX")"
    trap 'rm -rf "${tmp:-}" "${list:-}" "${list:-}.sim"' EXIT
    # usrmerge layout first; --keep-directory-symlink keeps it while extracting.
    mkdir -p "$tmp"/usr/{bin,sbin,lib,lib64} "$tmp/.vr"
    ln -s usr/bin "$tmp/bin"; ln -s usr/sbin "$tmp/sbin"
    ln -s usr/lib "$tmp/lib"; ln -s usr/lib64 "$tmp/lib64"
    while read -r n v a; do
        f="$apt_dir/cache/archives/${n}_${v//:/%3a}_${a}.deb"
        [[ -f "$f" ]] || die "expected $f after download"
        dpkg-deb --fsys-tarfile "$f" | tar -x --keep-directory-symlink \
            --same-owner -C "$tmp" -f - || die "extracting $f failed"
        total=$((total + $(stat -c %s "$f")))
    done <"$list"
    cp "$list" "$tmp/.vr/packages"
    printf '%s\n' "${pkgs[@]}" >"$tmp/.vr/requested"
    printf 'suites=%s\ntarget=%s\n' "$spec" "$target" >"$tmp/.vr/source"
    date -u +%Y-%m-%dT%H:%M:%SZ >"$tmp/.vr/complete"
    chmod 755 "$tmp"
    rm -rf "$root"
    mv "$tmp" "$root"
    info "root $root: $(wc -l <"$list") packages, $((total / 1024 / 1024)) MiB of .debs, $(du -sm "$root" | cut -f1) MiB extracted, $(elapsed_since "$t0")"
}

with_lock "root-$name-$key" build_root
echo "$root"

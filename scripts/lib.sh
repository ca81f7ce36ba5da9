# shellcheck shell=bash
# Shared helpers for the vhost-rdma provisioning scripts. Source it:
#
#     . "$(dirname "$0")/lib.sh"
#
# Conventions:
#   - everything downloaded or built lives under $VR_CACHE, outside the checkout;
#   - log messages go to stderr, a script's result (a path) goes to stdout;
#   - cache entries are built in a temporary sibling and renamed into place, so
#     a present entry is always complete; population is serialised with flock.

# VR_SCRIPTS: directory holding this file (scripts/).
VR_SCRIPTS="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VR_CACHE="${VHOST_RDMA_CACHE:-${HOME:-/root}/.cache/vhost-rdma}"
# Debian suites the guest-side software comes from (same mirror as the host).
VR_DEBIAN_SUITES_DEFAULT="trixie,trixie-backports"
VR_DEBIAN_KEYRING="${VHOST_RDMA_KEYRING:-/usr/share/keyrings/debian-archive-keyring.gpg}"

info() { printf '[%s] %s\n' "${VR_PROG:-${0##*/}}" "$*" >&2; }
warn() { printf '[%s] warning: %s\n' "${VR_PROG:-${0##*/}}" "$*" >&2; }
die() { printf '[%s] error: %s\n' "${VR_PROG:-${0##*/}}" "$*" >&2; exit 1; }

need_cmd() {
    local c
    for c in "$@"; do
        command -v "$c" >/dev/null 2>&1 || die "required command '$c' not found in PATH"
    done
}

# sha256 of stdin, hex only.
sha256_stdin() { sha256sum | cut -d' ' -f1; }
# sha256 of a string (arguments joined by newlines).
sha256_str() { printf '%s\n' "$@" | sha256_stdin; }
# sha256 of one file.
sha256_file() { sha256sum "$1" | cut -d' ' -f1; }
# Short key (16 hex chars) of a string.
short_key() { sha256_str "$@" | cut -c1-16; }

# Human readable seconds since $1 (an epoch from `date +%s`).
elapsed_since() { echo "$(( $(date +%s) - $1 ))s"; }

# with_lock NAME CMD...: run CMD while holding $VR_CACHE/locks/NAME.lock.
with_lock() {
    local name="$1"; shift
    mkdir -p "$VR_CACHE/locks"
    (
        exec 9>"$VR_CACHE/locks/$name.lock"
        if ! flock -n 9; then
            info "waiting for lock $VR_CACHE/locks/$name.lock"
            flock 9
        fi
        "$@"
    )
}

# The Debian mirror URI the host's apt already uses (never hard-coded).
# Override with VHOST_RDMA_DEBIAN_MIRROR.
debian_mirror() {
    if [[ -n "${VHOST_RDMA_DEBIAN_MIRROR:-}" ]]; then
        printf '%s\n' "${VHOST_RDMA_DEBIAN_MIRROR%/}"
        return
    fi
    local uri="" f
    # deb822 sources: the first stanza of Types deb whose suites are not
    # security suites and which carries component main.
    for f in /etc/apt/sources.list.d/*.sources; do
        [[ -r "$f" ]] || continue
        uri="$(awk '
            function flush() {
                if (types ~ /(^| )deb( |$)/ && suites != "" && suites !~ /-security/ &&
                    comps ~ /(^| )main( |$)/ && uris != "" && enabled != "no" && out == "") {
                    split(uris, u, " "); out = u[1]
                }
                types = suites = comps = uris = enabled = ""
            }
            /^[ \t]*#/ { next }
            /^[ \t]*$/ { flush(); next }
            {
                key = tolower($1); sub(/:$/, "", key)
                val = $0; sub(/^[^:]*:[ \t]*/, "", val)
                if (key == "types") types = val
                else if (key == "suites") suites = val
                else if (key == "components") comps = val
                else if (key == "uris") uris = val
                else if (key == "enabled") enabled = tolower(val)
            }
            END { flush(); if (out != "") print out }
        ' "$f")"
        [[ -n "$uri" ]] && break
    done
    if [[ -z "$uri" ]]; then
        for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
            [[ -r "$f" ]] || continue
            uri="$(awk '
                $1 != "deb" { next }
                { i = 2; if ($2 ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ } }
                $(i+1) ~ /-security/ { next }
                { for (j = i + 2; j <= NF; j++) if ($j == "main") { print $i; exit } }
            ' "$f")"
            [[ -n "$uri" ]] && break
        done
    fi
    [[ -n "$uri" ]] || die "cannot find the Debian mirror in the host's apt sources (set VHOST_RDMA_DEBIAN_MIRROR)"
    printf '%s\n' "${uri%/}"
}

# ---------------------------------------------------------------------------
# Private apt: an apt state (lists, archives, empty dpkg status) under the
# cache that never touches the host's dpkg database. One per suite spec
# (comma separated suites, all from the host's mirror, component main).

# vr_apt_dir SUITESPEC -> prints the private apt directory.
vr_apt_dir() { echo "$VR_CACHE/apt/$(short_key "apt-v1" "$(debian_mirror)" "$1")"; }

# vr_apt_init SUITESPEC: create the private apt tree (no network).
vr_apt_init() {
    local spec="$1" dir mirror suite
    dir="$(vr_apt_dir "$spec")"
    mirror="$(debian_mirror)"
    [[ -r "$VR_DEBIAN_KEYRING" ]] || die "Debian archive keyring $VR_DEBIAN_KEYRING missing (apt-get install debian-archive-keyring)"
    mkdir -p "$dir"/{etc/apt.conf.d,etc/preferences.d,etc/sources.list.d,state/lists/partial,cache/archives/partial}
    [[ -e "$dir/state/status" ]] || : >"$dir/state/status"
    {
        IFS=',' read -r -a _suites <<<"$spec"
        for suite in "${_suites[@]}"; do
            [[ -n "$suite" ]] || continue
            echo "deb [arch=amd64 signed-by=$VR_DEBIAN_KEYRING] $mirror $suite main"
        done
    } >"$dir/etc/sources.list.new"
    mv "$dir/etc/sources.list.new" "$dir/etc/sources.list"
}

# vr_apt SUITESPEC ARGS...: run apt-get against the private state.
vr_apt() {
    local spec="$1" dir; shift
    dir="$(vr_apt_dir "$spec")"
    apt-get -q \
        -o Dir::State="$dir/state" \
        -o Dir::State::Lists="$dir/state/lists" \
        -o Dir::State::status="$dir/state/status" \
        -o Dir::Cache="$dir/cache" \
        -o Dir::Cache::Archives="$dir/cache/archives" \
        -o Dir::Cache::pkgcache="" -o Dir::Cache::srcpkgcache="" \
        -o Dir::Etc::SourceList="$dir/etc/sources.list" \
        -o Dir::Etc::SourceParts="$dir/etc/sources.list.d" \
        -o Dir::Etc::Preferences="$dir/etc/preferences" \
        -o Dir::Etc::PreferencesParts="$dir/etc/preferences.d" \
        -o APT::Architecture=amd64 -o APT::Architectures::=amd64 \
        -o APT::Install-Recommends=false -o APT::Install-Suggests=false \
        -o APT::Get::AllowUnauthenticated=false \
        -o Acquire::Languages=none -o APT::Sandbox::User=root \
        -o Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false \
        -o Acquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled=false \
        -o Acquire::IndexTargets::deb::DEP-11-icons-small::DefaultEnabled=false \
        -o Acquire::IndexTargets::deb::DEP-11-icons-hidpi::DefaultEnabled=false \
        -o Acquire::IndexTargets::deb::Contents-deb::DefaultEnabled=false \
        "$@"
}

# vr_apt_update SUITESPEC: refresh the private lists if absent or older than
# VHOST_RDMA_APT_MAX_AGE seconds (default 6 h). Only called on cache misses.
vr_apt_update() {
    local spec="$1" dir stamp max_age="${VHOST_RDMA_APT_MAX_AGE:-21600}"
    dir="$(vr_apt_dir "$spec")"
    stamp="$dir/state/updated.stamp"
    if [[ -e "$stamp" ]] && (( $(date +%s) - $(stat -c %Y "$stamp") < max_age )); then
        return 0
    fi
    info "apt-get update (private state $dir, suites $spec)"
    vr_apt "$spec" update >&2 || die "apt-get update failed for suites '$spec' from $(debian_mirror)"
    touch "$stamp"
}

# Host build/runtime tools: install with the host apt only if missing.
# host_apt_install PKG... (dpkg package names)
host_apt_install() {
    local missing=() p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    ((${#missing[@]})) || return 0
    [[ $(id -u) -eq 0 ]] || die "need root to apt-get install ${missing[*]}"
    info "installing host packages: ${missing[*]}"
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2; then
        apt-get update -q >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2 \
            || die "apt-get install ${missing[*]} failed"
    fi
}

# The directory holding prebuilt guest kernels (linux-<version>-rdma*/ with
# bzImage, config, fragment.config, SHA256SUMS), or nothing. Only from the
# environment: a user's checkout has nothing beside it, so without it the
# scripts build the kernel from Debian's linux-source package.
vr_prebuilt_kernels_dir() {
    echo "${VHOST_RDMA_PREBUILT_KERNELS:-}"
}

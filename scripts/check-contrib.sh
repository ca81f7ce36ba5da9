#!/usr/bin/env bash
# Validates contrib/: the systemd units with `systemd-analyze verify` and the
# libvirt domains with `virt-xml-validate` (Debian: systemd, libvirt-clients +
# libxml2-utils; scripts/install-deps.sh installs them). One line per file:
#   PASS|FAIL|SKIPPED FILE: detail
# then "N passed, M failed, K skipped" (the record format scripts/test.sh
# counts and `guest-results junit --records` reads). A missing validator is a loud SKIPPED line,
# never a silent pass. Each validator is also fed a broken copy first, which it
# must reject: a validator that accepts anything would pass everything.
#
#   scripts/check-contrib.sh
set -uo pipefail
ROOT="$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/check-contrib.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

passed=0 failed=0 skipped=0
record() {  # record PASS|FAIL|SKIP NAME TEXT
    case "$1" in
        PASS) passed=$((passed + 1)); echo "PASS $2: $3" ;;
        FAIL) failed=$((failed + 1)); echo "FAIL $2: $3" ;;
        SKIP) skipped=$((skipped + 1)); echo "SKIPPED $2: $3" ;;
    esac
}

# --- systemd units ---------------------------------------------------------
units=("$ROOT"/contrib/systemd/*.service "$ROOT"/contrib/systemd/*.socket)
# sd_verify DIR UNIT: verify one unit (its siblings are found in DIR); any
# output is a failure: verify only warns (exit 0) on unknown keys and bad values.
sd_verify() {
    local out rc
    out="$(cd "$1" && systemd-analyze verify --man=no "./$2" 2>&1)"
    rc=$?
    [[ $rc -eq 0 && -z $out ]] && return 0
    printf '%s\n' "${out:-exit $rc}" | sed 's/^/    /'
    return 1
}
if ! command -v systemd-analyze >/dev/null 2>&1; then
    for u in "${units[@]}"; do
        record SKIP "contrib/systemd/${u##*/}" "systemd-analyze not installed (Debian package systemd)"
    done
else
    mkdir -p "$tmp/sd" "$tmp/sd-bad"
    # verify insists that ExecStart= is executable; /usr/bin/vhost-rdma exists
    # only where the daemon is installed, so the check points it at /bin/true.
    for u in "${units[@]}"; do
        sed 's|^ExecStart=/usr/bin/vhost-rdma |ExecStart=/bin/true |' "$u" >"$tmp/sd/${u##*/}"
    done
    cp "$tmp"/sd/* "$tmp/sd-bad/"
    sed -i 's/^KillMode=.*/KillMode=sometimes/' "$tmp/sd-bad/vhost-rdma.service"
    if sd_verify "$tmp/sd-bad" vhost-rdma.service >/dev/null; then
        for u in "${units[@]}"; do
            record FAIL "contrib/systemd/${u##*/}" "systemd-analyze verify accepted a unit with KillMode=sometimes: it checks nothing here"
        done
    else
        for u in "${units[@]}"; do
            if sd_verify "$tmp/sd" "${u##*/}"; then
                record PASS "contrib/systemd/${u##*/}" "systemd-analyze verify: no warnings"
            else
                record FAIL "contrib/systemd/${u##*/}" "systemd-analyze verify complained (above)"
            fi
        done
    fi
fi

# --- libvirt domains ---------------------------------------------------------
domains=("$ROOT"/contrib/libvirt/*.xml)
if ! command -v virt-xml-validate >/dev/null 2>&1 || ! command -v xmllint >/dev/null 2>&1; then
    for x in "${domains[@]}"; do
        record SKIP "contrib/libvirt/${x##*/}" "virt-xml-validate or xmllint not installed (Debian packages libvirt-clients, libxml2-utils)"
    done
else
    sed 's|<vcpu>|<vcpus>2</vcpus><vcpu>|' "${domains[0]}" >"$tmp/bad.xml"
    if virt-xml-validate "$tmp/bad.xml" domain >/dev/null 2>&1; then
        for x in "${domains[@]}"; do
            record FAIL "contrib/libvirt/${x##*/}" "virt-xml-validate accepted a domain with an unknown element: it checks nothing here"
        done
    else
        for x in "${domains[@]}"; do
            # the schema is named: virt-xml-validate guesses it from the root element otherwise
            if out="$(virt-xml-validate "$x" domain 2>&1)"; then
                record PASS "contrib/libvirt/${x##*/}" "virt-xml-validate (libvirt $(virsh --version 2>/dev/null || echo '?') domain schema)"
            else
                printf '%s\n' "$out" | sed 's/^/    /'
                record FAIL "contrib/libvirt/${x##*/}" "virt-xml-validate rejected it (above)"
            fi
        done
    fi
fi

echo "$passed passed, $failed failed, $skipped skipped"
((failed == 0))

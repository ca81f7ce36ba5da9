#!/usr/bin/env bash
# The project's test command (what .ci/run runs). On a fresh machine it
# installs what it needs (apt, cargo), then runs, in order:
#   1. cargo fmt --check, cargo clippy -D warnings,
#      scripts/check-contrib.sh (systemd units: systemd-analyze verify;
#      libvirt domains: virt-xml-validate)
#   2. cargo test --workspace (unit, codec and no-VM vhost-user tests; among
#      them vhost-rdma/tests/doc_examples.rs: every `vhost-rdma` command
#      line in README.md and docs/*.md against a live daemon, no usage
#      errors; vhost-rdma/tests/repo_layout.rs: no import cycle between a
#      crate's modules, no path outside the checkout; guest-results/tests/:
#      the upstream suites' log parsers and judge, the matrix's verdicts and
#      reports, the JUnit writer, the bench plots, the daemon-CPU bursts;
#      guest-runner's: the matrix's selection, shards, side lane, stuck-guest
#      watch and bring-your-own kernel, the scripts' shared options),
#   3. the guest end-to-end tier, the quick tier of the guest matrix:
#      ci/matrix.sh --quick
#      (7.3: the switch between two guests, 256 MiB verified TCP with 1 and
#      2 queue pairs, both QEMU forms, QEMU 11.1 and the stock 7.2; RSS,
#      hash report and flow rules with 4 queue pairs; the emulated gVNIC as
#      the README starts it: 256 MiB TCP both ways, header split, ethtool
#      -l/-x/-X/-N with a steered flow, devmem TCP with ncdevmem; rxe tools and verbs
#      tests, SMC-R streams, tshark on captures;
#      one guest's rxe, siw and erdma function against virtual hosts, every
#      tool in both roles, judged by the guest and the host's session; the
#      erdma function against rxe, and two QPs through its loopback;
#      the upstream suites: rdma-core's tests/ on erdma vs rxe and the
#      kernel's NIC selftests on the gVNIC vs virtio-net, one row per case
#      judged against ci/upstream/*.expect; docs/upstream-suites.md;
#      the uplinks: a VXLAN and a TAP uplink against a Linux vxlan netdev
#      and bridge in network namespaces, and a guest through each; two
#      daemons joined only by default VXLAN uplinks, one guest each at MTU
#      1500, over a 1500-MTU underlay namespace when root)
# and ends with one line "N passed, M failed, K skipped" counting every
# step, test and case. A step that cannot run here prints SKIPPED and why.
#
#   scripts/test.sh [--no-e2e] [--junit FILE]
#
# --junit FILE also writes the results as JUnit XML (scripts/guest-results
# junit): one <testcase> per step, cargo test, script record and matrix test.
#
# Downloads and builds are cached under ${VHOST_RDMA_CACHE:-~/.cache/vhost-rdma}
# (cargo's target dir too, unless CARGO_TARGET_DIR is set); a warm run
# downloads nothing.
set -uo pipefail
ROOT="$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)"
cd "$ROOT"
CACHE="${VHOST_RDMA_CACHE:-$HOME/.cache/vhost-rdma}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE/target}"
# No incremental state: it doubles the debug target (9 GiB of it on a full
# run) and a run from a fresh checkout never reuses it.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
e2e=1 junit=""
while (($#)); do
    case "$1" in
        --no-e2e) e2e=0; shift ;;
        --junit) junit="$(realpath -m "$2")"; shift 2 ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) echo "test.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

passed=0 failed=0 skipped=0
# Every section's wall time, printed as a table at the end: a cold run shows
# where its minutes went (the wait for the background guest assets, ...).
STEP_TIMES=() step_name="" step_t0=$SECONDS T0=$SECONDS
step_end() {
    [[ -n $step_name ]] && STEP_TIMES+=("$(printf '%6d  %s' $((SECONDS - step_t0)) "$step_name")")
    step_name=""
}
say() { step_end; step_name="$*" step_t0=$SECONDS; printf '\n=== %s\n' "$*"; }
# Logs kept for --junit: test.sh's own records (one line per step:
# PASS|FAIL|SKIPPED NAME: detail) and each script's and cargo's output.
jdir="$(mktemp -d "${TMPDIR:-/tmp}/test.sh.XXXXXX")"
trap 'rm -rf "$jdir"' EXIT
junit_in=()
note() { printf '%s %s: %s\n' "$1" "$2" "$3" >>"$jdir/test.sh.log"; }  # note PASS|FAIL|SKIPPED NAME DETAIL
step() { # step NAME CMD...: run a step that counts as one test
    local name="$1" rc; shift
    say "$name"
    "$@"; rc=$?
    if ((rc == 0)); then
        passed=$((passed + 1)); echo "--- PASS $name"; note PASS "$name" "ok"
    else
        failed=$((failed + 1)); echo "--- FAIL $name"; note FAIL "$name" "exit status $rc (see the console log)"
    fi
}
# counted LABEL SUITE CMD...: run a script that prints result records and
# ends with "N passed, M failed, K skipped"; add its counts to the totals.
counted() {
    local label="$1" suite="$2" log rc line gp gf gs
    shift 2
    say "$label"
    log="$jdir/$((${#junit_in[@]} + 1)).log"
    "$@" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    junit_in+=(--records "$suite=$log")
    line="$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)"
    if [[ -n $line ]]; then
        read -r gp gf gs < <(sed -E 's/^([0-9]+) passed, ([0-9]+) failed(, ([0-9]+) skipped)?.*/\1 \2 \4/' <<<"$line")
        passed=$((passed + gp)); failed=$((failed + gf)); skipped=$((skipped + ${gs:-0}))
        if [[ $rc -ne 0 && $gf -eq 0 ]]; then
            failed=$((failed + 1)); echo "--- FAIL $suite exited $rc"; note FAIL "$suite" "exited $rc"
        fi
    else
        failed=$((failed + 1)); echo "--- FAIL $suite printed no summary (rc=$rc)"
        note FAIL "$suite" "printed no summary (rc=$rc)"
    fi
}

# --- prerequisites -----------------------------------------------------------
say "prerequisites"
"$ROOT/scripts/install-deps.sh" || { echo "install-deps failed"; exit 1; }
# A cold run writes ~4 GiB under the cache (cargo's target ~2.5 GiB, the
# guest image, QEMU and tools ~1.2 GiB); a full disk fails a build midway
# with "No space left on device", so say it up front.
mkdir -p "$CARGO_TARGET_DIR"
free_kib="$(df -Pk "$CARGO_TARGET_DIR" | awk 'NR == 2 { print $4 }')"
if [[ -n $free_kib ]] && ((free_kib < 4 * 1024 * 1024)); then
    echo "warning: $((free_kib / 1024)) MiB free under $CARGO_TARGET_DIR; a cold run needs about 4 GiB"
fi

# --- guest assets, in the background ---------------------------------------------
# The guest image (on a cold machine that is a kernel build, ~6 min of 2
# cores), QEMU and the tools the guests run are made from here on at the
# lowest CPU priority, in their own session: they take the cycles the
# static checks and cargo leave idle (downloads, linking, tests that wait)
# and the guest tier waits for them. The scripts lock their caches, so a
# guest script that starts first waits rather than building twice.
assets_pid=""
stop_assets() { [[ -n $assets_pid ]] && kill -TERM -- "-$assets_pid" 2>/dev/null; assets_pid=""; }
if [[ $e2e -eq 1 ]]; then
    # shellcheck disable=SC2016 # expanded by the inner bash
    setsid nice -n 19 bash -c 'set -e; s=$1/scripts
        "$s/build-guest-image.sh" --kernel 7.3 >/dev/null; "$s/setup-qemu.sh" >/dev/null
        "$s/build-ncdevmem.sh" >/dev/null; "$s/build-nic-selftests.sh" >/dev/null' _ "$ROOT" \
        >"$jdir/guest-assets.log" 2>&1 &
    assets_pid=$!
    trap 'stop_assets; rm -rf "$jdir"' EXIT
fi

# --- static checks -----------------------------------------------------------
step "cargo fmt --check" cargo fmt --all -- --check
step "cargo clippy -D warnings" cargo clippy --workspace --all-targets --all-features -- -D warnings
# contrib/: systemd units and libvirt domains through their validators
counted "scripts/check-contrib.sh (contrib/ validators)" contrib "$ROOT/scripts/check-contrib.sh"

# --- cargo tests ---------------------------------------------------------------
say "cargo test --workspace"
log="$jdir/cargo-test.log"
cargo test --workspace --all-features --no-fail-fast 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
junit_in+=(--libtest "cargo=$log")
# Count the libtest summaries ("test result: ok. 12 passed; 0 failed; 1 ignored").
read -r tp tf ti < <(awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i) ~ /^passed;?$/) p += $(i-1); if ($(i) ~ /^failed;?$/) f += $(i-1); if ($(i) ~ /^ignored;?$/) g += $(i-1) } } END { print p+0, f+0, g+0 }' "$log")
passed=$((passed + tp)); failed=$((failed + tf)); skipped=$((skipped + ti))
if [[ $rc -ne 0 && $tf -eq 0 ]]; then
    failed=$((failed + 1)); echo "--- FAIL cargo test exited $rc (build failure?)"
    note FAIL "cargo test" "exited $rc (build failure?)"
fi
[[ $ti -gt 0 ]] && echo "SKIPPED: $ti ignored cargo tests (see above)"

# --- guest end-to-end tier -----------------------------------------------------------
if [[ $e2e -eq 1 ]]; then
    say "guest image, QEMU, ncdevmem, NIC selftests (the background build; waiting for it)"
    if wait "$assets_pid"; then
        passed=$((passed + 1)); echo "--- PASS guest assets"; note PASS "guest assets" "ok"
    else
        tail -n 30 "$jdir/guest-assets.log"
        failed=$((failed + 1)); echo "--- FAIL guest assets (the matrix below tries again)"
        note FAIL "guest assets" "the background build failed: $(tail -n 1 "$jdir/guest-assets.log")"
    fi
    assets_pid=""
    # The quick tier of the guest matrix (the switch, RSS, the gVNIC, rxe
    # and SMC-R, virtual hosts, erdma, the upstream suites, the
    # device-fault cells, the uplinks and two daemons over VXLAN). The
    # whole matrix (6.12, siw, loss, failover, negative SMC cell) is the
    # second tier: ci/matrix.sh (ci/README.md, results in ci/RESULTS.md).
    # (its JUnit file is merged: its console repeats cell lines as records)
    # --jobs 2: the two device-fault cells, whose guests mostly wait for the
    # drivers' timeouts, run beside the other cells (~5 min less on 2 cores).
    jm="$jdir/matrix.xml"
    counted "guest end-to-end: ci/matrix.sh --quick --jobs 2" "ci/matrix.sh --quick" \
        "$ROOT/ci/matrix.sh" --quick --jobs 2 --junit "$jm"
    junit_in=("${junit_in[@]:0:${#junit_in[@]}-2}" --merge "$jm")
else
    skipped=$((skipped + 1))
    echo "SKIPPED guest end-to-end tier (ci/matrix.sh --quick): --no-e2e given"
    note SKIPPED "ci/matrix.sh --quick" "--no-e2e given"
fi

if [[ -n $junit ]]; then
    say "JUnit XML: $junit"
    touch "$jdir/test.sh.log"
    "$ROOT/scripts/guest-results" junit --out "$junit" --name scripts/test.sh --records "test.sh=$jdir/test.sh.log" "${junit_in[@]}" ||
        { failed=$((failed + 1)); echo "--- FAIL writing $junit"; }
fi

step_end
echo
echo "=== wall time per step (s)"
printf '%s\n' "${STEP_TIMES[@]}"
printf '%6d  total\n' $((SECONDS - T0))
echo
echo "$passed passed, $failed failed, $skipped skipped"
[[ $failed -eq 0 ]]

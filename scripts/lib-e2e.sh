# shellcheck shell=bash
# Shared by the host side of the guest benches not yet in the runner: logs,
# result bookkeeping, daemon lifetime, the build, the two-guest runner
# (e2e_run_pair), and the guest image / QEMU preparation. The caller sets
# E2E_NAME and the defaults of build, profile, image, qemu, accel, timeout,
# logdir and keep_logs (kernel_image, kernel_append: a bring-your-own
# kernel), sources this file, parses its options with e2e_opt's help, sets
# CASES and calls e2e_begin; DAEMON_PID is the daemon to stop at exit.
#
# One result format for every tier: a line per case, "PASS CASE: text",
# "FAIL CASE: text" or "SKIPPED CASE: reason", then a summary ending in
# "N passed, M failed, K skipped" (scripts/test.sh adds these up).

say() { printf '[%s] %s\n' "$E2E_NAME" "$*" >&2; }

# e2e_opt ARGS...: the options every guest tier takes, for the caller's
# option loop (`*) e2e_opt "$@" || unknown; shift "$E2E_SHIFT" ;;`):
# --no-build, --profile P, --image DIR, --qemu PATH, --accel A, --timeout
# SECS, --logdir DIR, --keep-logs. Sets the variable, puts the
# words it took in E2E_SHIFT; returns 1 for any other option.
e2e_opt() {
    E2E_SHIFT=1
    case "$1" in
        --no-build) build=0; return 0 ;;
        --keep-logs) keep_logs=1; return 0 ;;
        --profile | --image | --qemu | --accel | --timeout | --logdir) ;;
        *) return 1 ;;
    esac
    (($# >= 2)) || { echo "${E2E_NAME:-${0##*/}}: $1 needs a value" >&2; exit 2; }
    E2E_SHIFT=2
    case "$1" in
        --profile) profile=$2 ;;
        --image) image=$2 ;;
        --qemu) qemu=$2 ;;
        --accel) accel=$2 ;;
        --timeout) timeout=$2 ;;
        --logdir) logdir=$2 ;;
    esac
}

# e2e_opts_usage: the usage lines of e2e_opt's options.
e2e_opts_usage() {
    printf '%s\n' \
        "  --no-build         do not run cargo build (use existing binaries)" \
        "  --profile P        cargo profile of the binaries (default: $profile)" \
        "  --image DIR        guest image dir (bzImage + rootfs.ext4); default: scripts/build-guest-image.sh --kernel 7.3" \
        "  --qemu PATH        QEMU; default: scripts/setup-qemu.sh" \
        "  --accel A          auto (default), kvm or tcg (passed to run-guests)" \
        "  --timeout SECS     per guest, boot to result (default $timeout)" \
        "  --logdir DIR       where logs go (default: a new dir under \${TMPDIR:-/tmp})" \
        "  --keep-logs        keep the logs when the test passes"
}

# e2e_begin: after the options: the log dir (given or new), announced.
e2e_begin() {
    logdir="${logdir:-$(mktemp -d "${TMPDIR:-/tmp}/$E2E_NAME.XXXXXX")}"
    mkdir -p "$logdir"
    logdir="$(cd "$logdir" && pwd)"
    say "logs: $logdir"
}

passed=0 failed=0 skipped=0
results=()
record() {  # record STATUS CASE TEXT
    local line
    case "$1" in
        PASS) passed=$((passed + 1)); line="PASS $2: $3" ;;
        FAIL) failed=$((failed + 1)); line="FAIL $2: $3" ;;
        SKIP) skipped=$((skipped + 1)); line="SKIPPED $2: $3" ;;
    esac
    results+=("$line")
    # A skip stands out (blank lines around it); every line starts with
    # its status, for the callers that grep.
    if [[ $1 == SKIP ]]; then printf '\n%s\n\n' "$line"; else printf '%s\n' "$line"; fi
}
finish() {
    echo
    echo "== $E2E_NAME summary"
    local r
    for r in "${results[@]}"; do echo "$r"; done
    if ((failed)) || ((keep_logs)); then echo "logs kept in $logdir"; else rm -rf "$logdir"; fi
    echo "$passed passed, $failed failed, $skipped skipped"
    ((failed == 0))
    exit $?
}
fail_all() {  # fail_all REASON: every case fails (setup broke)
    local c
    for c in "${CASES[@]}"; do record FAIL "$c" "$1"; done
    finish
}

DAEMON_PID=""
# daemon_up SOCKET... -- SERVE_ARGS...: `$DAEMON serve SERVE_ARGS` in the
# background (NO_COLOR, log in $d/daemon.log, pid in DAEMON_PID, stopped by
# stop_daemon on exit); waits up to 10 s for every SOCKET. Returns 1, with
# the log's tail, when the daemon exits or leaves a socket missing.
daemon_up() {
    local socks=() s i ok
    while (($#)) && [[ $1 != -- ]]; do socks+=("$1"); shift; done
    (($#)) && shift
    NO_COLOR=1 "$DAEMON" serve "$@" >"$d/daemon.log" 2>&1 &
    DAEMON_PID=$!
    for ((i = 0; i < 100; i++)); do
        ok=1
        for s in "${socks[@]}"; do [[ -S $s ]] || ok=0; done
        ((ok)) && return 0
        kill -0 "$DAEMON_PID" 2>/dev/null || break
        sleep 0.1
    done
    stop_daemon
    echo "--- daemon log tail ($d/daemon.log):"
    tail -n 20 "$d/daemon.log" | sed 's/^/    /'
    return 1
}

# start_daemon SOCKET... -- SERVE_ARGS...: daemon_up, and a daemon that did
# not come up fails every case (fail_all).
start_daemon() {
    daemon_up "$@" || fail_all "the daemon did not start or create its sockets (log: $d/daemon.log)"
}

# stop_daemon: SIGTERM, then SIGKILL after 10 s. Returns 0 when the daemon
# exited 0 (or none ran), 1 when it exited non-zero (or had died), 2 when it
# had to be killed.
stop_daemon() {
    [[ -n $DAEMON_PID ]] || return 0
    local i st
    if kill -0 "$DAEMON_PID" 2>/dev/null; then
        kill -TERM "$DAEMON_PID" 2>/dev/null
        for ((i = 0; i < 100; i++)); do kill -0 "$DAEMON_PID" 2>/dev/null || break; sleep 0.1; done
        if kill -0 "$DAEMON_PID" 2>/dev/null; then
            kill -KILL "$DAEMON_PID" 2>/dev/null
            wait "$DAEMON_PID" 2>/dev/null
            DAEMON_PID=""
            return 2
        fi
    fi
    wait "$DAEMON_PID" 2>/dev/null
    st=$?
    DAEMON_PID=""
    return $((st == 0 ? 0 : 1))
}
trap 'stop_daemon; exit 130' INT TERM
trap 'stop_daemon' EXIT

# e2e_build [CRATE...]: `cargo build` of vhost-rdma and CRATEs for the
# profile (unless --no-build: build=0); sets DAEMON (and SGT, the guest
# tool, when smc-guest-tests is among them). A failed build or a missing
# binary fails every case.
e2e_build() {
    local crates=(-p vhost-rdma) c
    for c in "$@"; do crates+=(-p "$c"); done
    if ((build)); then
        say "cargo build ($profile) ${crates[*]}"
        local bflag=()
        [[ $profile == debug ]] || bflag=(--profile "$profile")
        if ! (cd "$ROOT" && nice -n 10 cargo build "${bflag[@]}" "${crates[@]}") >"$logdir/build.log" 2>&1; then
            tail -30 "$logdir/build.log" >&2
            fail_all "cargo build failed (see $logdir/build.log)"
        fi
    fi
    local tdir="${CARGO_TARGET_DIR:-$ROOT/target}/$profile"
    DAEMON="$tdir/vhost-rdma"
    [[ -x $DAEMON ]] || fail_all "no daemon binary $DAEMON"
    if [[ " $* " == *" smc-guest-tests "* ]]; then
        SGT="$tdir/smc-guest-tests"
        [[ -x $SGT ]] || fail_all "no guest tool $SGT"
    fi
}

# e2e_image: the guest image (scripts/build-guest-image.sh --kernel 7.3
# unless --image gave one); fails every case without it.
e2e_image() {
    if [[ -z $image ]]; then
        say "guest image: scripts/build-guest-image.sh --kernel 7.3"
        image="$("$HERE/build-guest-image.sh" --kernel 7.3 2>"$logdir/image.log" | tail -n 1)" || image=""
    fi
    [[ -n $image && -f $image/bzImage && -f $image/rootfs.ext4 ]] ||
        fail_all "no guest image (build-guest-image.sh gave '${image}', see $logdir/image.log)"
}

# The run-guests options of a bring-your-own kernel (kernel_image: a
# bzImage, kernel_append: kernel command-line additions), empty without.
e2e_kernel_args() {
    KERNEL_ARGS=()
    [[ -z ${kernel_image:-} ]] || KERNEL_ARGS+=(--kernel "$kernel_image")
    [[ -z ${kernel_append:-} ]] || KERNEL_ARGS+=(--append "$kernel_append")
}

# e2e_check_kernel: a --kernel PATH that is missing or not a bzImage fails
# the run at once, with the reason (scripts/guest-runner kernel-check).
e2e_check_kernel() {
    [[ -n ${kernel_image:-} ]] || return 0
    local out
    out="$("$HERE/guest-runner" kernel-check "$kernel_image" 2>&1)" ||
        fail_all "--kernel: $(sed -n 's/^error: //p' <<<"$out" | grep . || echo "$out")"
    kernel_image="$(readlink -f "$kernel_image")"
    say "guest kernel (--kernel): $kernel_image, Linux $(grep -v '^warning: \|^run-guests: ' <<<"$out" | tail -n 1)"
    grep '^warning: ' <<<"$out" >&2 || true
}

# e2e_prepare [CRATE...]: e2e_build (vhost-rdma and CRATEs), e2e_image and
# QEMU (scripts/setup-qemu.sh unless --qemu gave one); sets DAEMON, image,
# qemu. With kernel_image set, the guests boot that bzImage with the
# image's root disk.
e2e_prepare() {
    e2e_check_kernel
    e2e_build "$@"
    e2e_image
    if [[ -z $qemu ]]; then
        qemu="$("$HERE/setup-qemu.sh" 2>"$logdir/qemu.log" | tail -n 1)" || qemu=""
    fi
    [[ -n $qemu && -x $qemu ]] || fail_all "no QEMU (see $logdir/qemu.log)"
    say "image: $image, qemu: $qemu"
}

# e2e_run_pair: boots guest A (run-guests arguments in the array RG_A, logs
# in $d/ga) and guest B (RG_B, $d/gb) at once, both with the --guest-bin
# $vrbin; while they run, reports A's progress ("CASE" lines) every 15 s;
# sets ra and rb (the
# run-guests exits), then saves the daemon's status in $d/ctl-status.{txt,json}.
e2e_run_pair() {
    local t0=$SECONDS last=$SECONDS pa pb
    e2e_kernel_args
    local common=(--qemu "$qemu" --image "$image" "${KERNEL_ARGS[@]}" --accel "$accel" --timeout "$timeout" --guest-bin "$vrbin")
    "$ROOT/scripts/run-guests" "${common[@]}" --logdir "$d/ga" "${RG_A[@]}" >"$d/run-a.log" 2>&1 &
    pa=$!
    "$ROOT/scripts/run-guests" "${common[@]}" --logdir "$d/gb" "${RG_B[@]}" >"$d/run-b.log" 2>&1 &
    pb=$!
    while kill -0 "$pa" 2>/dev/null || kill -0 "$pb" 2>/dev/null; do
        sleep 1
        if ((SECONDS - last >= 15)); then
            last=$SECONDS
            say "guests running ($((SECONDS - t0)) s): A $(grep -c '^CASE' "$d/ga/a.job/out.log" 2>/dev/null) cases done"
        fi
    done
    wait "$pa"; ra=$?
    wait "$pb"; rb=$?
    say "guests finished in $((SECONDS - t0)) s (run-guests A exit $ra, B exit $rb)"
    "$DAEMON" ctl --control "$d/ctl.sock" status | tee "$d/ctl-status.txt" | sed 's/^/    /'
    "$DAEMON" ctl --control "$d/ctl.sock" status --json >"$d/ctl-status.json" 2>&1
}

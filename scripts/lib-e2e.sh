# shellcheck shell=bash
# Shared by the guest scripts (e2e-vhost.sh,
# e2e-vhost-iwarp.sh, e2e-gve.sh, e2e-erdma.sh): logs, result bookkeeping,
# daemon lifetime, the two-guest runner (e2e_run_pair), and the
# build / guest image / QEMU preparation. The caller sets E2E_NAME, CASES,
# ROOT, HERE, build, profile, image, qemu, logdir and keep_logs (and, for a
# bring-your-own kernel, kernel_image and kernel_append: e2e_kernel_option
# parses --kernel PATH and --append ARGS), then sources this file and calls
# e2e_prepare; DAEMON_PID is the daemon to stop at exit.

say() { printf '[%s] %s\n' "$E2E_NAME" "$*" >&2; }

logdir="${logdir:-$(mktemp -d "${TMPDIR:-/tmp}/$E2E_NAME.XXXXXX")}"
mkdir -p "$logdir"
logdir="$(cd "$logdir" && pwd)"
say "logs: $logdir"

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
    printf '%s\n' "$line"
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
# start_daemon SOCKET... -- SERVE_ARGS...: the one way the guest tiers start
# the daemon: `$DAEMON serve SERVE_ARGS` in the background (NO_COLOR, log in
# $d/daemon.log, pid in DAEMON_PID, stopped by stop_daemon on exit); waits up
# to 10 s for every SOCKET. A daemon that exits or leaves a socket missing
# fails every case (fail_all) with the log's tail.
start_daemon() {
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
    tail -n 20 "$d/daemon.log" >&2
    fail_all "the daemon did not start or create ${socks[*]} (log: $d/daemon.log)"
}

stop_daemon() {
    [[ -n $DAEMON_PID ]] || return 0
    kill -TERM "$DAEMON_PID" 2>/dev/null
    local i
    for ((i = 0; i < 100; i++)); do kill -0 "$DAEMON_PID" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$DAEMON_PID" 2>/dev/null && kill -KILL "$DAEMON_PID" 2>/dev/null
    wait "$DAEMON_PID" 2>/dev/null
    DAEMON_PID=""
}
trap 'stop_daemon; exit 130' INT TERM
trap 'stop_daemon' EXIT

# The run-guests options of a bring-your-own kernel (kernel_image: a
# bzImage, kernel_append: kernel command-line additions), empty without.
e2e_kernel_args() {
    KERNEL_ARGS=()
    [[ -z ${kernel_image:-} ]] || KERNEL_ARGS+=(--kernel "$kernel_image")
    [[ -z ${kernel_append:-} ]] || KERNEL_ARGS+=(--append "$kernel_append")
}

# e2e_check_kernel: a --kernel PATH that is missing or not a bzImage fails
# the run at once, with the reason (scripts/guest_kernel.py).
e2e_check_kernel() {
    [[ -n ${kernel_image:-} ]] || return 0
    local v
    v="$(python3 "$HERE/guest_kernel.py" "$kernel_image" 2>&1)" || fail_all "--kernel: ${v#error: }"
    kernel_image="$(readlink -f "$kernel_image")"
    say "guest kernel (--kernel): $kernel_image, Linux $v"
}

# e2e_prepare: build the daemon (unless --no-build), find the guest image and
# QEMU (building/fetching them if not given); sets DAEMON, image, qemu. With
# kernel_image set, the guests boot that bzImage with the image's root disk.
e2e_prepare() {
    e2e_check_kernel
    if ((build)); then
        say "cargo build ($profile) -p vhost-rdma"
        local bflag=()
        [[ $profile == debug ]] || bflag=(--profile "$profile")
        if ! (cd "$ROOT" && nice -n 10 cargo build "${bflag[@]}" -p vhost-rdma) >"$logdir/build.log" 2>&1; then
            tail -30 "$logdir/build.log" >&2
            fail_all "cargo build failed (see $logdir/build.log)"
        fi
    fi
    DAEMON="${CARGO_TARGET_DIR:-$ROOT/target}/$profile/vhost-rdma"
    [[ -x $DAEMON ]] || fail_all "no daemon binary $DAEMON"
    if [[ -z $image ]]; then
        say "guest image: scripts/build-guest-image.sh --kernel 7.3"
        image="$("$HERE/build-guest-image.sh" --kernel 7.3 2>"$logdir/image.log" | tail -n 1)" || image=""
    fi
    [[ -n $image && -f $image/bzImage && -f $image/rootfs.ext4 ]] ||
        fail_all "no guest image (build-guest-image.sh gave '${image}', see $logdir/image.log)"
    if [[ -z $qemu ]]; then
        qemu="$("$HERE/setup-qemu.sh" 2>"$logdir/qemu.log" | tail -n 1)" || qemu=""
    fi
    [[ -n $qemu && -x $qemu ]] || fail_all "no QEMU (see $logdir/qemu.log)"
    say "image: $image, qemu: $qemu"
}

# e2e_run_guest: boot the one guest (job $d/g.sh) on port socket $d/g.sock,
# then save the daemon's view of the hosts and stop the daemon; sets rg
# (run-guests exit) and wall (seconds).
e2e_run_guest() {
    local t0=$SECONDS
    e2e_kernel_args
    "$ROOT/scripts/run-guests" --qemu "$qemu" --image "$image" "${KERNEL_ARGS[@]}" --accel "$accel" --timeout "$timeout" \
        --net vhost-user --logdir "$d" \
        --guest "g,ip=$GUEST_IP/24,sock=$d/g.sock,${GUEST_EXTRA:-}mac=$GMAC,cmd=$d/g.sh" 2>&1 | tee "$d/run-guests.log"
    rg=${PIPESTATUS[0]}
    wall=$((SECONDS - t0))
    say "guest finished (run-guests exit $rg, ${wall}s)"
    "$DAEMON" ctl --control "$d/ctl.sock" hosts | tee "$d/hosts.txt"
    "$DAEMON" ctl --control "$d/ctl.sock" --json hosts >"$d/hosts.json" 2>&1
    stop_daemon
    if grep -Eq 'panicked' "$d/daemon.log"; then
        grep -E 'panicked' "$d/daemon.log" | tail -5
    fi
}

# e2e_run_pair: boots guest A (run-guests arguments in the array RG_A, logs
# in $d/ga) and guest B (RG_B, $d/gb) at once, both with the --guest-bin
# $vrbin; calls e2e_tick (if the script defines it) every second while they
# run, reports A's progress ("CASE" lines) every 15 s; sets ra and rb (the
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
        if declare -F e2e_tick >/dev/null; then e2e_tick; fi
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

#!/usr/bin/env bash
# End-to-end test "daemon + guests": the vhost-rdma daemon serves two ports,
# two Linux 7.3 guests A (10.77.0.1) and B (10.77.0.2) attach to them, ping
# each other and move 256 MiB of verified TCP data (smc-guest-tests stream).
#
# Cases (all by default, choose with --case NAME, repeatable or comma list):
#   pci-1q        QEMU 11.1, virtio-net-pci + -netdev vhost-user, 1 queue pair
#   pci-2q        QEMU 11.1, 2 queue pairs, ethtool -L eth0 combined 2, --conns 4
#   testdev-1q    QEMU 11.1, vhost-user-test-device-pci (daemon owns the device)
#   pci-1q-qemu7  Debian bookworm's stock QEMU 7.2, virtio-net-pci, 1 queue pair
#
# Prints PASS/FAIL per case (with STREAM-RESULT throughput), keeps the logs of
# failed cases, and ends with "N passed, M failed, K skipped". A case that
# cannot run here is printed as "SKIPPED <case>: <reason>". Exit status is
# non-zero when any case failed.
set -uo pipefail

HERE="$(cd "$(dirname "$(readlink -f "$0")")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
ALL_CASES=(pci-1q pci-2q testdev-1q pci-1q-qemu7)

usage() {
    cat <<EOF
Usage: ${0##*/} [options]
  --case NAME        run only this case (repeatable, or a comma list): ${ALL_CASES[*]}
$(e2e_opts_usage)
  --qemu7 PATH       QEMU 7.2 for pci-1q-qemu7; default: scripts/setup-qemu.sh --system
  --bytes SIZE       bytes per connection (default 256M)
  -h, --help
Environment: VHOST_RDMA_CACHE (cache dir), E2E_TESTDEV_CONFIG_SIZE (default 24),
E2E_TESTDEV_NUM_VQS (default 2*queues+1), RUST_LOG (daemon log filter).
EOF
}

cases=() build=1 profile=release image="" qemu="" qemu7="" accel=auto bytes=256M
timeout=900 logdir="" keep_logs=0
# shellcheck source=scripts/lib-e2e.sh
. "$HERE/lib-e2e.sh"
while (($#)); do
    case "$1" in
        --case) IFS=, read -r -a _c <<<"$2"; cases+=("${_c[@]}"); shift 2 ;;
        --qemu7) qemu7="$2"; shift 2 ;;
        --bytes) bytes="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) e2e_opt "$@" || { echo "e2e-fabric: unknown argument $1" >&2; usage >&2; exit 2; }; shift "$E2E_SHIFT" ;;
    esac
done
((${#cases[@]})) || cases=("${ALL_CASES[@]}")
for c in "${cases[@]}"; do
    [[ " ${ALL_CASES[*]} " == *" $c "* ]] || { echo "e2e-fabric: unknown case $c (have: ${ALL_CASES[*]})" >&2; exit 2; }
done

CASES=("${cases[@]}")
E2E_NAME=e2e-fabric
e2e_begin
qemu11=$qemu  # --qemu: the QEMU 11.1 of every case but pci-1q-qemu7
e2e_build smc-guest-tests

# guest binaries, exported read-only over 9p (tag vrbin -> /opt/vr, PATH has /opt/vr/bin)
vrbin="$logdir/vrbin"
mkdir -p "$vrbin/bin"
cp -f "$SGT" "$vrbin/bin/smc-guest-tests"

# ---- image
e2e_image
say "image: $image"

need11=0 need7=0
for c in "${cases[@]}"; do
    case "$c" in *-qemu7) need7=1 ;; *) need11=1 ;; esac
done
qemu11_err="" qemu7_err=""
if ((need11)) && [[ -z $qemu11 ]]; then
    say "QEMU 11.1: scripts/setup-qemu.sh"
    qemu11="$("$HERE/setup-qemu.sh" 2> >(tee "$logdir/qemu11.log" >&2) | tail -n 1)" || qemu11=""
    [[ -n $qemu11 && -x $qemu11 ]] || { qemu11_err="setup-qemu.sh failed (see $logdir/qemu11.log)"; qemu11=""; }
fi
if ((need7)) && [[ -z $qemu7 ]]; then
    say "QEMU 7.2: scripts/setup-qemu.sh --system"
    qemu7="$("$HERE/setup-qemu.sh" --system 2> >(tee "$logdir/qemu7.log" >&2) | tail -n 1)" || qemu7=""
    [[ -n $qemu7 && -x $qemu7 ]] || { qemu7_err="setup-qemu.sh --system failed (see $logdir/qemu7.log)"; qemu7=""; }
fi

has_ctl=0
"$DAEMON" ctl --help >/dev/null 2>&1 && has_ctl=1

# ---- guest job scripts
write_job() {  # write_job FILE ROLE SELF PEER QUEUES CONNS
    local f=$1 role=$2 self=$3 peer=$4 q=$5 conns=$6
    {
        echo 'echo "== $VR_NAME: kernel $(uname -r)"'
        echo 'ip addr show eth0'
        if ((q > 1)); then
            echo "ethtool -L eth0 combined $q || { echo 'E2E-FAIL ethtool -L'; exit 11; }"
            echo 'ethtool -l eth0'
        fi
        # link up? (vhost-user: no carrier means the backend is not connected)
        echo "i=0; while [ \"\$(cat /sys/class/net/eth0/carrier 2>/dev/null)\" != 1 ]; do i=\$((i + 1)); if [ \$i -ge 30 ]; then echo 'E2E-FAIL eth0 has no carrier after 30 s (backend not connected?)'; ip link show eth0; exit 10; fi; sleep 1; done"
        # wait (up to ~2 min) for the peer to come up, then the real check
        echo "i=0; until ping -c 1 -W 2 $peer >/dev/null 2>&1; do i=\$((i + 1)); [ \$i -ge 60 ] && break; sleep 1; done"
        echo "ping -c 3 -W 5 $peer || { echo 'E2E-FAIL ping $peer'; exit 12; }"
        if [[ $role == server ]]; then
            echo "smc-guest-tests stream server --proto tcp --addr $self --port 5201 --bytes $bytes --seed 77 --conns $conns --once --accept-timeout 300"
        else
            echo "smc-guest-tests stream client --proto tcp --addr $peer --port 5201 --bytes $bytes --seed 77 --conns $conns --connect-timeout 120"
        fi
        echo 'rc=$?'
        # per-queue counters (virtio_net: rx_queue_N_packets / tx_queue_N_packets)
        echo "ethtool -S eth0 2>/dev/null | grep -E '(rx|tx)_queue_[0-9]+_packets' | sed 's/^ */QSTAT /'"
        echo 'exit $rc'
    } >"$f"
}

# ---- one case
run_case() {  # run_case CASE QEMU FORM QUEUES CONNS
    local c=$1 qemu=$2 form=$3 q=$4 conns=$5
    local d="$logdir/$c"
    rm -rf "$d"; mkdir -p "$d"
    echo
    echo "== case $c: form=$form queues=$q conns=$conns qemu=$qemu"

    local qv
    qv="$("$qemu" --version 2>/dev/null | head -n 1)"
    if [[ $form == testdev ]]; then
        local maj min
        if [[ $qv =~ version\ ([0-9]+)\.([0-9]+) ]]; then maj=${BASH_REMATCH[1]} min=${BASH_REMATCH[2]}; else maj=0 min=0; fi
        if ((maj < 10 || (maj == 10 && min < 2))); then
            record SKIP "$c" "vhost-user-test-device-pci needs QEMU >= 10.2, have: $qv"; return
        fi
        if ! "$qemu" -machine none -device help 2>/dev/null | grep -q '"vhost-user-test-device-pci"'; then
            record SKIP "$c" "$qemu has no vhost-user-test-device-pci device ($qv)"; return
        fi
    fi

    local maca=52:54:00:77:00:0a macb=52:54:00:77:00:0b
    if ! daemon_up "$d/a.sock" "$d/b.sock" -- \
        --port "a=$d/a.sock,mac=$maca,queues=$q,form=$form" \
        --port "b=$d/b.sock,mac=$macb,queues=$q,form=$form" \
        --control "$d/ctl.sock"; then
        record FAIL "$c" "daemon did not create its sockets (log: $d/daemon.log)"; return
    fi

    write_job "$d/a.sh" server 10.77.0.1 10.77.0.2 "$q" "$conns"
    write_job "$d/b.sh" client 10.77.0.2 10.77.0.1 "$q" "$conns"
    local rgargs=(--qemu "$qemu" --image "$image" --accel "$accel" --timeout "$timeout"
        --guest-bin "$vrbin" --net vhost-user --form "$form" --queues "$q" --logdir "$d")
    if [[ $form == testdev ]]; then
        rgargs+=(--config-size "${E2E_TESTDEV_CONFIG_SIZE:-24}")
        [[ -n ${E2E_TESTDEV_NUM_VQS:-} ]] && rgargs+=(--testdev-num-vqs "$E2E_TESTDEV_NUM_VQS")
    fi
    local t0=$SECONDS rg=0
    "$ROOT/scripts/run-guests" "${rgargs[@]}" \
        --guest "a,ip=10.77.0.1/24,sock=$d/a.sock,mac=$maca,cmd=$d/a.sh" \
        --guest "b,ip=10.77.0.2/24,sock=$d/b.sock,mac=$macb,cmd=$d/b.sh" \
        2>&1 | tee "$d/run-guests.log"
    rg=${PIPESTATUS[0]}
    local wall=$((SECONDS - t0))

    local why=() alive=1
    kill -0 "$DAEMON_PID" 2>/dev/null || alive=0
    ((alive)) || why+=("daemon died during the run")
    if ((has_ctl && alive)); then
        echo "--- vhost-rdma ctl status:"
        "$DAEMON" ctl --control "$d/ctl.sock" status 2>&1 | tee "$d/ctl-status.txt" | sed 's/^/    /'
    elif ((!has_ctl)); then
        echo "--- (no 'vhost-rdma ctl' yet: counters skipped)"
    fi
    stop_daemon
    case $? in
        0) ;;
        1) ((alive)) && why+=("daemon exited non-zero on SIGTERM") ;;
        2) why+=("daemon did not stop within 10 s of SIGTERM") ;;
    esac
    if grep -Eiq 'panicked|ERROR' "$d/daemon.log"; then
        echo "--- daemon log errors:"
        grep -Ei 'panicked|ERROR' "$d/daemon.log" | tail -10 | sed 's/^/    /'
    fi

    ((rg == 0)) || why+=("run-guests exit $rg")
    local ra rb
    ra="$(grep -h '^STREAM-RESULT' "$d/a.job/out.log" 2>/dev/null | tail -n 1)"
    rb="$(grep -h '^STREAM-RESULT' "$d/b.job/out.log" 2>/dev/null | tail -n 1)"
    [[ $ra == *verified=1* ]] || why+=("server: ${ra:-no STREAM-RESULT}")
    [[ $rb == *verified=1* ]] || why+=("client: ${rb:-no STREAM-RESULT}")
    local mib_a mib_b boot
    mib_a="$(sed -n 's/.* mibps=\([0-9.]*\).*/\1/p' <<<"$ra")"
    mib_b="$(sed -n 's/.* mibps=\([0-9.]*\).*/\1/p' <<<"$rb")"
    boot="$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(" ".join("%s=%ss" % (g["name"], g["boot_s"]) for g in d["guests"]), d["accel"])' "$d/summary.json" 2>/dev/null)"

    if ((q > 1)); then
        # informational: did every queue pair carry packets? (flow hashing decides)
        local gname n
        for gname in a b; do
            for ((n = 0; n < q; n++)); do
                local tx rx
                tx="$(sed -n "s/^QSTAT tx_queue_${n}_packets: *\([0-9]*\).*/\1/p" "$d/$gname.job/out.log" 2>/dev/null | tail -n 1)"
                rx="$(sed -n "s/^QSTAT rx_queue_${n}_packets: *\([0-9]*\).*/\1/p" "$d/$gname.job/out.log" 2>/dev/null | tail -n 1)"
                echo "    guest $gname queue pair $n: tx_packets=${tx:-?} rx_packets=${rx:-?}"
                if [[ ${tx:-0} == 0 && ${rx:-0} == 0 ]]; then
                    echo "    WARNING: guest $gname queue pair $n carried no traffic"
                fi
            done
        done
    fi

    if ((${#why[@]} == 0)); then
        record PASS "$c" "client ${mib_b:-?} MiB/s, server ${mib_a:-?} MiB/s ($bytes x $conns conn), boot ${boot:-?}, wall ${wall}s"
        ((keep_logs)) || rm -rf "$d"
    else
        local joined
        printf -v joined '%s; ' "${why[@]}"
        record FAIL "$c" "${joined%; } (logs: $d)"
        local gname
        for gname in a b; do
            [[ -f $d/$gname.console.log ]] || continue
            echo "--- $gname console tail ($d/$gname.console.log):"
            tail -n 25 "$d/$gname.console.log" | sed 's/^/    /'
        done
        echo "--- daemon log tail ($d/daemon.log):"
        tail -n 15 "$d/daemon.log" | sed 's/^/    /'
    fi
}

for c in "${cases[@]}"; do
    case "$c" in
        pci-1q | pci-2q | testdev-1q)
            if [[ -z $qemu11 ]]; then record FAIL "$c" "no QEMU 11.1: $qemu11_err"; continue; fi ;;
        pci-1q-qemu7)
            if [[ -z $qemu7 ]]; then record FAIL "$c" "no QEMU 7.2: $qemu7_err"; continue; fi ;;
    esac
    case "$c" in
        pci-1q) run_case "$c" "$qemu11" pci 1 1 ;;
        pci-2q) run_case "$c" "$qemu11" pci 2 4 ;;
        testdev-1q) run_case "$c" "$qemu11" testdev 1 1 ;;
        pci-1q-qemu7) run_case "$c" "$qemu7" pci 1 1 ;;
    esac
done
rm -rf "$vrbin"
finish

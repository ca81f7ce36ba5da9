#!/usr/bin/env bash
# End-to-end test of issue 7 (multiqueue steering, RSS, hash report) with
# unmodified Linux 7.3 guests in the test-device form (the daemon owns the
# virtio-net device: config space and control queue).
#
#   guest A (10.77.0.1): 4 queue pairs, VIRTIO_NET_F_RSS + HASH_REPORT; the
#                        one under test
#   guest B (10.77.0.2): 4 queue pairs, iperf3 server (traffic source)
#
# A walks through steps; at each one the host (guest-results rss-host)
# compares the guest's view with the daemon's (`vhost-rdma ctl rss`):
#   default  `ethtool -x eth0`: 128-entry RETA and key == the daemon's table/key
#   equal2   `ethtool -X eth0 equal 2` -> daemon table 0,1,0,1,...
#   hkey     `ethtool -X eth0 equal 4 hkey K` -> daemon key K; the host asks
#            the model (`ctl rss --predict FLOW`) where each test flow goes
#   flows    6 TCP + 6 UDP flows (iperf3 -R --cport P: B:5201 -> A:P); the
#            guest's per-queue RX packet deltas (netdev netlink qstats via
#            `smc-guest-tests qstats`) must peak on the
#            predicted queue; the daemon's flow table must show the model's
#            queue, hash value and report, and every frame with the hash in a
#            20-byte RX header. Then the host adds two flow rules via ctl.
#   rules    a fresh TCP flow lands on the rule's queue (not RSS's); a drop
#            rule for TCP from B:5202 eats B's RSTs, so A's connect to
#            B:5202 times out instead of being refused; the drops are counted
#
# Prints CHECK-OK/CHECK-FAIL lines, then PASS/FAIL. Exit status non-zero on
# any failure. Logs are kept on failure (and with --keep-logs).
set -uo pipefail

HERE="$(cd "$(dirname "$(readlink -f "$0")")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"

usage() {
    cat <<EOF
Usage: ${0##*/} [options]
$(e2e_opts_usage)
  -h, --help
Environment: VHOST_RDMA_CACHE (cache dir), RUST_LOG / VHOST_RDMA_LOG (daemon log filter).
EOF
}

build=1 profile=release image="" qemu="" accel=auto timeout=1500 logdir="" keep_logs=0
# shellcheck source=scripts/lib-e2e.sh
. "$HERE/lib-e2e.sh"
E2E_NAME=e2e-rss
e2e_opts_only "$@"

CASES=(e2e-rss)
e2e_begin
HOST_PID=""
cleanup() {
    [[ -n $HOST_PID ]] && kill "$HOST_PID" 2>/dev/null
    HOST_PID=""
    stop_daemon
}
trap 'cleanup; exit 130' INT TERM
trap cleanup EXIT

e2e_prepare smc-guest-tests
# the host side (guest-results rss-host) is built now, not while guest A waits for it
"$HERE/guest-results" --version >/dev/null || fail_all "no guest-results (scripts/guest-results)"
# guest binaries over 9p (tag vrbin -> /opt/vr, PATH has /opt/vr/bin)
mkdir -p "$logdir/vrbin/bin"
cp -f "$SGT" "$logdir/vrbin/bin/smc-guest-tests"

if ! "$qemu" -machine none -device help 2>/dev/null | grep -q '"vhost-user-test-device-pci"'; then
    record SKIP e2e-rss "$qemu has no vhost-user-test-device-pci"
    finish
fi

# ---- test parameters
KEY=5a:7f:10:35:ce:e3:84:59:72:17:28:cd:e6:bb:5c:71:0a:2f:c0:e5:be:53:74:09:22:c7:98:bd:56:6b:0c:21:fa:9f:b0:55:6e:03:24:f9
# Guest ports of the test flows (B:5201 -> A:P). The model decides the queues;
# these were picked so that with KEY and `equal 4` they cover all 4 queues.
TCP_PORTS="41001 41004 41016 41020 41002 41017"
UDP_PORTS="42001 42004 42008 42012 42002 42009"
MOVE_PORT=41100
d="$logdir"
# the host side's flows.json: {"key": K, "flows": [["tcp", P]...], "move_sport": P}
flows=""
for p in $TCP_PORTS; do flows+="[\"tcp\", $p], "; done
for p in $UDP_PORTS; do flows+="[\"udp\", $p], "; done
printf '{"key": "%s", "flows": [%s], "move_sport": %s}\n' "$KEY" "${flows%, }" "$MOVE_PORT" >"$d/flows.json"

# ---- guest jobs (dash)
cat >"$d/a.sh" <<EOF
echo "== \$VR_NAME: kernel \$(uname -r)"
fail() { echo "E2E-FAIL \$*"; touch /job/abort; exit 1; }
sync_host() {
    echo "== step \$1"; touch /job/\$1.req; i=0
    while [ ! -f /job/\$1.ack ]; do
        i=\$((i + 1)); [ \$i -ge 3600 ] && fail "host did not ack step \$1"
        [ -f /job/abort ] && fail "host aborted at step \$1"
        sleep 0.5
    done
}
# per-queue RX packets: netdev netlink qstats (Linux 7.x virtio_net reports
# them only there), else ethtool -S rx_queue_N_packets (older kernels)
qstats() {
    { smc-guest-tests qstats --dev eth0 2>/dev/null | sed -n 's/^rx [0-9]* packets \([0-9]*\).*/\1/p'
      ethtool -S eth0 | sed -n 's/^ *rx_queue_[0-9]*_packets: *\([0-9]*\).*/\1/p'; } | tr '\n' ' '
}
run_flow() {
    name=\$1; shift; b=\$(qstats); "\$@" >/tmp/flow.log 2>&1; rc=\$?; sleep 0.5; a=\$(qstats)
    echo "FLOW \$name rc=\$rc before=[\$b] after=[\$a]"
    [ \$rc = 0 ] || tail -n 3 /tmp/flow.log
}
ethtool -L eth0 combined 4 || fail "ethtool -L eth0 combined 4"
smc-guest-tests qstats --dev eth0
[ -n "\$(qstats)" ] || fail "no per-queue RX packet counters (netdev qstats / ethtool -S)"
i=0; while [ "\$(cat /sys/class/net/eth0/carrier 2>/dev/null)" != 1 ]; do i=\$((i + 1)); [ \$i -ge 30 ] && fail "no carrier"; sleep 1; done
i=0; until ping -c 1 -W 2 10.77.0.2 >/dev/null 2>&1; do i=\$((i + 1)); [ \$i -ge 120 ] && fail "B unreachable"; sleep 1; done
i=0; until iperf3 -c 10.77.0.2 -p 5201 -t 1 >/dev/null 2>&1; do i=\$((i + 1)); [ \$i -ge 60 ] && fail "no iperf3 server on B"; sleep 2; done
dmesg | grep -i -E 'virtio.net|rss' | tail -n 5
ethtool -k eth0 | grep -E 'receive-hashing|ntuple'
ethtool -x eth0 | tee /job/x-default.txt
sync_host default
ethtool -X eth0 equal 2 || fail "ethtool -X eth0 equal 2"
ethtool -x eth0 | tee /job/x-equal2.txt
sync_host equal2
ethtool -X eth0 equal 4 hkey $KEY || fail "ethtool -X eth0 equal 4 hkey"
ethtool -x eth0 | tee /job/x-hkey.txt
sync_host hkey
for p in $TCP_PORTS; do
    run_flow 10.77.0.2:5201-10.77.0.1:\$p/tcp iperf3 -c 10.77.0.2 -p 5201 --cport \$p -R -t 2
done
for p in $UDP_PORTS; do
    run_flow 10.77.0.2:5201-10.77.0.1:\$p/udp iperf3 -c 10.77.0.2 -p 5201 --cport \$p -R -u -b 4M -l 1000 -t 2
done
sync_host flows
echo "rule target queue: \$(cat /job/flows.ack)"
run_flow 10.77.0.2:5201-10.77.0.1:$MOVE_PORT/tcp iperf3 -c 10.77.0.2 -p 5201 --cport $MOVE_PORT -R -t 2
# nothing listens on B:5202: B answers RST, which the drop rule eats, so the
# connect times out instead of being refused
run_flow drop busybox nc -w 4 10.77.0.2 5202 </dev/null
sync_host rules
smc-guest-tests qstats --dev eth0
exit 0
EOF
cat >"$d/b.sh" <<'EOF'
echo "== $VR_NAME: kernel $(uname -r)"
ethtool -L eth0 combined 4
iperf3 -s -p 5201 >/tmp/iperf3.log 2>&1 &
srv=$!
i=0; while [ ! -f /job/stop ]; do i=$((i + 1)); [ $i -ge 3000 ] && break; sleep 1; done
kill $srv 2>/dev/null
smc-guest-tests qstats --dev eth0
exit 0
EOF

# ---- daemon
maca=52:54:00:77:01:0a macb=52:54:00:77:01:0b
start_daemon "$d/a.sock" "$d/b.sock" "$d/ctl.sock" -- \
    --port "a=$d/a.sock,mac=$maca,queues=4,form=testdev" \
    --port "b=$d/b.sock,mac=$macb,queues=4,form=testdev" \
    --control "$d/ctl.sock"

# ---- host side (follows A's steps through $d/a.job)
"$HERE/guest-results" rss-host "$DAEMON" "$d/ctl.sock" "$d/a.job" "$d/b.job" "$d/flows.json" \
    >"$d/host.log" 2>&1 &
HOST_PID=$!

t0=$SECONDS
"$ROOT/scripts/run-guests" --qemu "$qemu" --image "$image" --accel "$accel" --timeout "$timeout" \
    --net vhost-user --form testdev --queues 4 --config-size 24 --logdir "$d" --no-fail-fast \
    --guest-bin "$d/vrbin" \
    --guest "a,ip=10.77.0.1/24,sock=$d/a.sock,mac=$maca,cmd=$d/a.sh" \
    --guest "b,ip=10.77.0.2/24,sock=$d/b.sock,mac=$macb,cmd=$d/b.sh" \
    2>&1 | tee "$d/run-guests.log"
rg=${PIPESTATUS[0]}
wall=$((SECONDS - t0))
for ((i = 0; i < 100; i++)); do kill -0 "$HOST_PID" 2>/dev/null || break; sleep 0.1; done
kill "$HOST_PID" 2>/dev/null
wait "$HOST_PID"
host_rc=$?
HOST_PID=""

echo "--- host checks ($d/host.log):"
cat "$d/host.log"
alive=1
kill -0 "$DAEMON_PID" 2>/dev/null || alive=0
why=()
((alive)) || why+=("daemon died")
((rg == 0)) || why+=("run-guests exit $rg")
((host_rc == 0)) || why+=("host checks failed ($(grep -c '^CHECK-FAIL' "$d/host.log") failed)")
grep -q 'panicked' "$d/daemon.log" && why+=("daemon panicked")
nok=$(grep -c '^CHECK-OK' "$d/host.log")
cleanup
if ((${#why[@]} == 0)); then
    record PASS e2e-rss "$nok checks, wall ${wall}s"
else
    printf -v joined '%s; ' "${why[@]}"
    record FAIL e2e-rss "${joined%; } (logs: $d)"
    for g in a b; do
        [[ -f $d/$g.console.log ]] || continue
        echo "--- $g console tail:"
        tail -n 25 "$d/$g.console.log" | sed 's/^/    /'
    done
fi
finish

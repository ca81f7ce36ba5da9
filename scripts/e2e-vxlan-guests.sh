#!/usr/bin/env bash
# End-to-end test of VXLAN uplinks between two daemons (issue 17, must-show 1
# and 3): daemon A serves guest A (10.77.0.1), daemon B serves guest B
# (10.77.0.2); the daemons share nothing but a `kind=vxlan` uplink each
# (VNI 77, UDP on loopback, 127.0.0.1 <-> 127.0.0.2). Underlay MTU is the
# default 1500, so both guests run with MTU 1450 (docs/uplinks.md).
#
# Cases (reported by guest A, or by the host for the last two):
#   ping         A pings B across both fabrics and the tunnel
#   tcp          256 MiB (--bytes) of TCP A -> B, every byte verified
#                (smc-guest-tests stream)
#   rc-pingpong  ibv_rc_pingpong over rxe (B server, A client), buffers
#                checked (-c)
#   smcr-v2      SMC-R v2 (UEID on both, rxe0): a verified stream each way,
#                proven SMC-R by sock_diag (--expect-mode smcr)
#   faults-rc    the host adds 2% loss and 5% reordering (window 4, hold
#                20 ms) of RoCEv2 (UDP 4791) both ways on daemon A's uplink
#                port (the matrix's lossy-cell rules); ibv_rc_pingpong -c
#                over rxe (200 iterations) still completes
#   capture      a daemon capture of the uplink port during the faults phase
#                decodes in tshark (RoCE inside), and the loopback underlay
#                captured by tshark decodes as VXLAN VNI 77
#
# Prints PASS/FAIL per case and ends with "N passed, M failed, K skipped".
set -uo pipefail

HERE="$(cd "$(dirname "$(readlink -f "$0")")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
CASES=(ping tcp rc-pingpong smcr-v2 faults-rc capture)

usage() {
    cat <<EOF
Usage: ${0##*/} [options]
  --no-build         do not run cargo build (use existing binaries)
  --profile P        release (default) or debug binaries
  --image DIR        guest image dir; default: scripts/build-guest-image.sh --kernel 7.3
  --qemu PATH        QEMU 11.1; default: scripts/setup-qemu.sh
  --accel A          auto (default), kvm or tcg
  --bytes SIZE       TCP bytes (default 256M)
  --timeout SECS     per guest, boot to result (default 1500)
  --logdir DIR       where logs go (default: a new dir under \${TMPDIR:-/tmp})
  --keep-logs        keep the logs when everything passed
  --faults-only      run only faults-rc and capture (the guests skip ping, tcp,
                     rc-pingpong and smcr-v2, reported SKIPPED)
EOF
}

build=1 profile=release image="" qemu="" timeout=1500 logdir="" keep_logs=0 accel=auto bytes=256M basic=1
while (($#)); do
    case "$1" in
        --no-build) build=0; shift ;;
        --profile) profile="$2"; shift 2 ;;
        --image) image="$2"; shift 2 ;;
        --qemu) qemu="$2"; shift 2 ;;
        --accel) accel="$2"; shift 2 ;;
        --bytes) bytes="$2"; shift 2 ;;
        --timeout) timeout="$2"; shift 2 ;;
        --logdir) logdir="$2"; shift 2 ;;
        --keep-logs) keep_logs=1; shift ;;
        --faults-only) basic=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "e2e-vxlan-guests: unknown argument $1" >&2; usage >&2; exit 2 ;;
    esac
done

E2E_NAME=e2e-vxlan-guests
# shellcheck source=scripts/lib-e2e.sh
. "$HERE/lib-e2e.sh"
if ((build)); then
    say "cargo build ($profile) -p smc-guest-tests"
    bflag=()
    [[ $profile == debug ]] || bflag=(--profile "$profile")
    (cd "$ROOT" && nice -n 10 cargo build "${bflag[@]}" -p smc-guest-tests) >"$logdir/build-sgt.log" 2>&1 ||
        fail_all "cargo build -p smc-guest-tests failed (see $logdir/build-sgt.log)"
fi
e2e_prepare
SGT="${CARGO_TARGET_DIR:-$ROOT/target}/$profile/smc-guest-tests"
[[ -x $SGT ]] || fail_all "no guest tool $SGT"
d="$logdir"
A=10.77.0.1 B=10.77.0.2 MACA=52:54:00:77:00:01 MACB=52:54:00:77:00:02
# Ports unlikely to meet another run's (or another user's 4789).
PA=$((20000 + $$ % 20000)) PB=$((40000 + $$ % 20000))
VNI=77

# the shared guest helpers (case_, gid_index, retry, ...), then this test's own
cp "$HERE/guest/e2e-guest-lib.sh" "$d/common.sh"
cat >>"$d/common.sh" <<'EOF'
# The tunnel takes 50 bytes of the 1500-byte underlay MTU.
setup() {
    ip link set eth0 mtu 1450
    rdma link add rxe0 type rxe netdev eth0
    smc-guest-tests smc ueid add VHOST-RDMA-CI
    smc-guest-tests smc info
}
EOF

stream() {  # stream ROLE PROTO ADDR PORT BYTES [EXTRA...]
    local role=$1 proto=$2 addr=$3 port=$4 n=$5
    shift 5
    if [[ $role == server ]]; then
        echo "smc-guest-tests stream server --proto $proto --addr $addr --port $port --bytes $n --seed 7 $* --once --accept-timeout 600"
    else
        echo "retry 5 smc-guest-tests stream client --proto $proto --addr $addr --port $port --bytes $n --seed 7 $* --connect-timeout 300"
    fi
}

cat >"$d/a.sh" <<EOF
. /opt/vr/common.sh
echo "== \$VR_NAME: kernel \$(uname -r)"
setup
i=0; until ping -c 1 -W 2 $B >/dev/null 2>&1; do i=\$((i+1)); [ \$i -ge 180 ] && break; sleep 1; done
g=\$(gid_index rxe0 $A)
if [ $basic = 1 ]; then
ping -c 5 -W 5 $B > /tmp/p.log 2>&1; rc=\$?; cat /tmp/p.log
case_ ping \$rc "\$(grep -E 'transmitted|rtt' /tmp/p.log | tr '\n' ' ')"
$(stream client tcp $B 5201 "$bytes") > /tmp/t.log 2>&1; rc=\$?; cat /tmp/t.log
grep -q 'verified=1' /tmp/t.log && grep -q 'status=pass' /tmp/t.log; case_ tcp \$((rc + \$?)) "\$(grep STREAM-RESULT /tmp/t.log | tail -1)"
retry 60 timeout 300 ibv_rc_pingpong -d rxe0 -g \$g -p 18515 -n 500 -c $B > /tmp/pp.log 2>&1; rc=\$?; cat /tmp/pp.log
case_ rc-pingpong \$rc "\$(grep iters /tmp/pp.log)"
$(stream client smc $B 7781 64M --direction c2s --expect-mode smcr --io-timeout 300) > /tmp/s1.log 2>&1; r1=\$?; cat /tmp/s1.log
$(stream server smc $A 7782 64M --direction c2s --expect-mode smcr --io-timeout 300) > /tmp/s2.log 2>&1; r2=\$?; cat /tmp/s2.log
ok=1
for f in /tmp/s1.log /tmp/s2.log; do
    grep STREAM-RESULT \$f | grep -q 'verified=1' && grep STREAM-RESULT \$f | grep -q 'smc_mode=smcr' || ok=0
done
[ \$r1 = 0 ] && [ \$r2 = 0 ] && [ \$ok = 1 ]; case_ smcr-v2 \$? "A->B: \$(grep STREAM-RESULT /tmp/s1.log | grep -o 'mibps=[^ ]*\|smc_mode=[^ ]*' | tr '\n' ' ') B->A: \$(grep STREAM-RESULT /tmp/s2.log | grep -o 'mibps=[^ ]*\|smc_mode=[^ ]*' | tr '\n' ' ')"
smc-guest-tests smc info
fi
# The host installs the faults when it sees this line.
echo "PHASE faults"
sleep 8
retry 3 timeout 420 ibv_rc_pingpong -d rxe0 -g \$g -p 18516 -n 200 -c $B > /tmp/pf.log 2>&1; rc=\$?; cat /tmp/pf.log
rdma statistic show link rxe0/1 | awk '{ for (i = 1; i < NF; i++) if (\$i ~ /duplicate_request|out_of_seq_request|rcvd_seq_err|retry/) print "RXE-STAT", \$i, \$(i + 1) }'
case_ faults-rc \$rc "\$(grep iters /tmp/pf.log)"
echo "PHASE done"
exit 0
EOF

cat >"$d/b.sh" <<EOF
. /opt/vr/common.sh
echo "== \$VR_NAME: kernel \$(uname -r)"
setup
i=0; until ping -c 1 -W 2 $A >/dev/null 2>&1; do i=\$((i+1)); [ \$i -ge 180 ] && break; sleep 1; done
g=\$(gid_index rxe0 $B)
if [ $basic = 1 ]; then
$(stream server tcp $B 5201 "$bytes"); echo "B tcp rc=\$?"
timeout 600 ibv_rc_pingpong -d rxe0 -g \$g -p 18515 -n 500 -c; echo "B pingpong rc=\$?"
$(stream server smc $B 7781 64M --direction c2s --expect-mode smcr --io-timeout 300); echo "B smc server rc=\$?"
$(stream client smc $A 7782 64M --direction c2s --expect-mode smcr --io-timeout 300); echo "B smc client rc=\$?"
fi
timeout 500 ibv_rc_pingpong -d rxe0 -g \$g -p 18516 -n 200 -c; echo "B pingpong under faults rc=\$?"
exit 0
EOF
vrbin="$d/vrbin"
mkdir -p "$vrbin/bin"
cp "$d/common.sh" "$vrbin/common.sh"
cp -f "$SGT" "$vrbin/bin/smc-guest-tests"

# Daemon B: the second one, stopped with the first.
DAEMON_B=""
stop_b() {
    [[ -n $DAEMON_B ]] || return 0
    kill -TERM "$DAEMON_B" 2>/dev/null
    wait "$DAEMON_B" 2>/dev/null
    DAEMON_B=""
}
TSHARK_PID=""
trap 'stop_daemon; stop_b; [[ -n $TSHARK_PID ]] && kill $TSHARK_PID 2>/dev/null; exit 130' INT TERM
trap 'stop_daemon; stop_b; [[ -n $TSHARK_PID ]] && kill $TSHARK_PID 2>/dev/null' EXIT

mkdir -p "$d/captures"
NO_COLOR=1 "$DAEMON" serve \
    --port "a=$d/a.sock,mac=$MACA" \
    --port "up,kind=vxlan,local=127.0.0.1:$PA,remote=127.0.0.2:$PB,vni=$VNI" \
    --control "$d/ctl.sock" --capture-dir "$d/captures" >"$d/daemon.log" 2>&1 &
DAEMON_PID=$!
NO_COLOR=1 "$DAEMON" serve \
    --port "b=$d/b.sock,mac=$MACB" \
    --port "up,kind=vxlan,local=127.0.0.2:$PB,remote=127.0.0.1:$PA,vni=$VNI" \
    --control "$d/ctl-b.sock" >"$d/daemon-b.log" 2>&1 &
DAEMON_B=$!
for ((i = 0; i < 100; i++)); do
    [[ -S $d/a.sock && -S $d/b.sock ]] && break
    sleep 0.1
done
[[ -S $d/a.sock && -S $d/b.sock ]] || fail_all "the daemons did not create their sockets (see $d/daemon*.log)"

ctl_a() { "$DAEMON" ctl --control "$d/ctl.sock" "$@"; }
faults_on=0
# Called every second while the guests run (lib-e2e.sh e2e_run_pair).
e2e_tick() {
    local out="$d/ga/a.job/out.log"
    if ((faults_on == 0)) && grep -q '^PHASE faults' "$out" 2>/dev/null; then
        faults_on=1
        say "faults phase: 2% loss and 5% reordering of RoCEv2 on daemon A's uplink; captures on"
        {
            ctl_a faults add --port up --dir both --proto udp --dst-port 4791 --action drop --prob 0.02 --seed 17
            ctl_a faults add --port up --dir both --proto udp --dst-port 4791 --action reorder --prob 0.05 \
                --window 4 --hold-ms 20 --seed 18
            ctl_a capture start --port up --file "$d/captures/up.pcapng" --snaplen 256
        } >>"$d/faults.log" 2>&1
        if command -v tshark >/dev/null; then
            tshark -q -i lo -f "udp port $PA or udp port $PB" -c 3000 -w "$d/underlay.pcapng" >"$d/tshark-live.log" 2>&1 &
            TSHARK_PID=$!
        fi
    fi
    if ((faults_on == 1)) && grep -q '^PHASE done' "$out" 2>/dev/null; then
        faults_on=2
        { ctl_a faults list; ctl_a capture stop; } >>"$d/faults.log" 2>&1
    fi
}
RG_A=(--net vhost-user --guest "a,ip=$A/24,sock=$d/a.sock,mac=$MACA,cmd=$d/a.sh")
RG_B=(--net vhost-user --guest "b,ip=$B/24,sock=$d/b.sock,mac=$MACB,cmd=$d/b.sh")
e2e_run_pair
((faults_on == 1)) && { ctl_a faults list; ctl_a capture stop; } >>"$d/faults.log" 2>&1
[[ -n $TSHARK_PID ]] && { kill -TERM "$TSHARK_PID" 2>/dev/null; wait "$TSHARK_PID" 2>/dev/null; TSHARK_PID=""; }
"$DAEMON" ctl --control "$d/ctl-b.sock" status >"$d/ctl-status-b.txt" 2>&1
sed 's/^/    B: /' "$d/ctl-status-b.txt"
stop_daemon
stop_b
grep -E 'panicked' "$d"/daemon*.log | tail -5

out="$d/ga/a.job/out.log"
[[ -f $out ]] || out=/dev/null
for c in "${CASES[@]}"; do
    [[ $c == capture ]] && continue
    if ((basic == 0)) && [[ $c != faults-rc ]]; then
        record SKIP "$c" "--faults-only"
        continue
    fi
    line="$(grep -E "^CASE $c rc=" "$out" | tail -n 1)"
    if [[ -z $line ]]; then
        record FAIL "$c" "guest A never reported it (run-guests A exit $ra, B exit $rb; $d/ga/a.console.log)"
    elif [[ $line == *" rc=0"* ]]; then
        extra=""
        # The last `faults list`: id, matched, acted, ... per rule.
        [[ $c == faults-rc ]] && extra="; fault rules (id matched acted ...): $(grep -- '->' "$d/faults.log" | tail -n 2 | tr -s ' ' | tr '\n' ';'); $(grep '^RXE-STAT' "$out" | cut -d' ' -f2- | tr -s ' \t' ' ' | tr '\n' ',')"
        record PASS "$c" "${line#* rc=0}$extra"
    else
        record FAIL "$c" "${line#CASE $c } (see $out)"
    fi
done
if ! command -v tshark >/dev/null; then
    record SKIP capture "no tshark"
elif [[ ! -s $d/captures/up.pcapng ]]; then
    record FAIL capture "no capture of the uplink (see $d/faults.log)"
else
    roce=$(tshark -r "$d/captures/up.pcapng" -Y infiniband 2>/dev/null | wc -l)
    vx=$(tshark -r "$d/underlay.pcapng" -d "udp.port==$PA,vxlan" -d "udp.port==$PB,vxlan" -Y "vxlan.vni == $VNI && infiniband" 2>/dev/null | wc -l)
    if ((roce > 0 && vx > 0)); then
        record PASS capture "uplink capture: $roce RoCE frames decoded; underlay: $vx VXLAN VNI $VNI datagrams with RoCE inside"
    else
        record FAIL capture "uplink capture RoCE frames $roce, underlay VXLAN+RoCE datagrams $vx (see $d/captures, $d/underlay.pcapng)"
    fi
fi
finish

#!/usr/bin/env bash
# End-to-end test of VXLAN uplinks between two daemons (issue 17, must-show 1
# and 3; issue 27 item 5): daemon A serves guest A (10.77.0.1), daemon B
# serves guest B (10.77.0.2); the daemons share nothing but a `kind=vxlan`
# uplink each with default settings (VNI 77, UDP on loopback, 127.0.0.1 <->
# 127.0.0.2; underlay mtu= 1500, df=unset). Both guests keep their default
# MTU 1500: full-size frames leave the uplink in 1550-byte outer packets,
# which the kernel fragments where the path MTU is smaller (docs/uplinks.md).
# With --underlay-mtu N (root) the daemons run in a network namespace of
# their own whose loopback MTU is N, so with 1500 every full-size frame
# really crosses as two IP fragments.
#
# Cases (reported by guest A, or by the host for the last three):
#   ping         A pings B across both fabrics and the tunnel
#   tcp          256 MiB (--bytes) of TCP A -> B, every byte verified
#                (smc-guest-tests stream)
#   rping-siw    siw on both guests: rping -V, 50 pings of B's server by
#                A's client, each verified (both sides print all 50); as
#                in the matrix's siw cells, daemon A's port a carries the
#                documented `mpa-settle` rule (300 ms): without it the guest
#                kernel's siw_accept() race left B's QP deaf to A's first
#                FPDU (docs/faults-and-captures.md, "Linux siw workaround")
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
#   uplink-mtu   the guests' full-size frames crossed: both uplinks sent
#                frames beyond mtu= (tx_over_mtu) and dropped none as
#                oversized; with --underlay-mtu, the namespace's IP counters
#                show the outer packets fragmented and reassembled
#
# Prints PASS/FAIL per case and ends with "N passed, M failed, K skipped".
set -uo pipefail

HERE="$(cd "$(dirname "$(readlink -f "$0")")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
ALL_CASES=(ping tcp rping-siw rc-pingpong smcr-v2 faults-rc capture uplink-mtu)

usage() {
    cat <<EOF
Usage: ${0##*/} [options]
$(e2e_opts_usage)
  --bytes SIZE       TCP bytes (default 256M)
  --case NAME        run only this case (repeatable, or a comma list):
                     ${ALL_CASES[*]}
  --faults-only      the same as --case faults-rc,capture
  --underlay-mtu N   run the daemons in a new network namespace whose
                     loopback MTU is N (576..65535; needs root)
EOF
}

build=1 profile=release image="" qemu="" timeout=1500 logdir="" keep_logs=0 accel=auto bytes=256M
cases=() underlay_mtu=""
# shellcheck source=scripts/lib-e2e.sh
. "$HERE/lib-e2e.sh"
while (($#)); do
    case "$1" in
        --bytes) bytes="$2"; shift 2 ;;
        --case) IFS=, read -ra c <<<"$2"; cases+=("${c[@]}"); shift 2 ;;
        --faults-only) cases+=(faults-rc capture); shift ;;
        --underlay-mtu) underlay_mtu="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) e2e_opt "$@" || { echo "e2e-vxlan-guests: unknown argument $1" >&2; usage >&2; exit 2; }; shift "$E2E_SHIFT" ;;
    esac
done

((${#cases[@]})) || cases=("${ALL_CASES[@]}")
for c in "${cases[@]}"; do
    [[ " ${ALL_CASES[*]} " == *" $c "* ]] || { echo "e2e-vxlan-guests: unknown case $c (${ALL_CASES[*]})" >&2; exit 2; }
done
if [[ -n $underlay_mtu ]] && { ! [[ $underlay_mtu =~ ^[0-9]+$ ]] || ((underlay_mtu < 576 || underlay_mtu > 65535)); }; then
    echo "e2e-vxlan-guests: --underlay-mtu $underlay_mtu must be 576..65535" >&2; exit 2
fi
CASES=("${cases[@]}")
want() { [[ " ${cases[*]} " == *" $1 "* ]]; }
E2E_NAME=e2e-vxlan-guests
e2e_begin
e2e_prepare smc-guest-tests
d="$logdir"
A=10.77.0.1 B=10.77.0.2 MACA=52:54:00:77:00:01 MACB=52:54:00:77:00:02
# Ports unlikely to meet another run's (or another user's 4789).
PA=$((20000 + $$ % 20000)) PB=$((40000 + $$ % 20000))
VNI=77

# the shared guest helpers (case_, roce_gid_index, retry, ...), then this test's own
cat "$HERE/guest/rdma-lib.sh" "$HERE/guest/e2e-guest-lib.sh" >"$d/common.sh"
cat >>"$d/common.sh" <<'EOF'
# eth0 keeps the default MTU 1500: the uplinks carry full-size frames
# (df=unset, the outer packets fragmented where the underlay needs it).
# rdma_cm picks the RDMA device by address, so eth0 has one at a time:
# siw for rping, then rxe for the rest.
siw_up() {
    rdma link add siw0 type siw netdev eth0 || return 1
    i=0; until rdma link show siw0/1 2>/dev/null | grep -q 'state ACTIVE'; do
        i=$((i + 1)); [ $i -ge 30 ] && return 1; sleep 1
    done
}
rxe_up() {
    rdma link add rxe0 type rxe netdev eth0
    smc-guest-tests smc ueid add VHOST-RDMA-CI
    smc-guest-tests smc info
}
EOF

# What each guest runs (1/0): the selected cases, rxe for any rxe case, the
# faults phase for faults-rc and capture.
w() { want "$1" && echo 1 || echo 0; }
W_PING=$(w ping) W_TCP=$(w tcp) W_RPING=$(w rping-siw) W_RC=$(w rc-pingpong) W_SMC=$(w smcr-v2)
W_FAULTS=0; { want faults-rc || want capture; } && W_FAULTS=1
W_RXE=0; ((W_RC || W_SMC || W_FAULTS)) && W_RXE=1
RPING_PINGS=50 RPING_SIZE=4096

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
echo "== \$VR_NAME: kernel \$(uname -r), eth0 mtu \$(cat /sys/class/net/eth0/mtu)"
i=0; until ping -c 1 -W 2 $B >/dev/null 2>&1; do i=\$((i+1)); [ \$i -ge 180 ] && break; sleep 1; done
if [ $W_PING = 1 ]; then
ping -c 5 -W 5 $B > /tmp/p.log 2>&1; rc=\$?; cat /tmp/p.log
case_ ping \$rc "\$(grep -E 'transmitted|rtt' /tmp/p.log | tr '\n' ' ')"
fi
# rping before the TCP stream: after 64 MiB of TCP, the 7.3 guest's siw
# stalled at its first RDMA READ (the server never sent the Read Request;
# the daemons had delivered every frame), twice in a row.
if [ $W_RPING = 1 ]; then
siw_up || echo "siw0 did not come up"
# rping exits 0 even when it never connected: retry until pings show, then count them.
retry 30 sh -c "timeout -k 10 240 rping -c -a $B -p 7174 -S $RPING_SIZE -C $RPING_PINGS -v -V > /tmp/rp.log 2>&1; grep -q 'ping data:' /tmp/rp.log"; rc=\$?
n=\$(grep -c '^ping data: rdma-ping-' /tmp/rp.log); tail -n 2 /tmp/rp.log | cut -c 1-120
[ \$rc = 0 ] && [ \$n -ge $RPING_PINGS ]; case_ rping-siw \$? "\$n of $RPING_PINGS pings verified by the client (rping -c -S $RPING_SIZE -V over siw)"
rdma link delete siw0
fi
if [ $W_TCP = 1 ]; then
$(stream client tcp $B 5201 "$bytes") > /tmp/t.log 2>&1; rc=\$?; cat /tmp/t.log
grep -q 'verified=1' /tmp/t.log && grep -q 'status=pass' /tmp/t.log; case_ tcp \$((rc + \$?)) "\$(grep STREAM-RESULT /tmp/t.log | tail -1)"
fi
if [ $W_RXE = 1 ]; then
rxe_up
g=\$(roce_gid_index rxe0 $A)
fi
if [ $W_RC = 1 ]; then
retry 60 timeout 300 ibv_rc_pingpong -d rxe0 -g \$g -p 18515 -n 500 -c $B > /tmp/pp.log 2>&1; rc=\$?; cat /tmp/pp.log
case_ rc-pingpong \$rc "\$(grep iters /tmp/pp.log)"
fi
if [ $W_SMC = 1 ]; then
$(stream client smc $B 7781 64M --direction c2s --expect-mode smcr --io-timeout 300) > /tmp/s1.log 2>&1; r1=\$?; cat /tmp/s1.log
$(stream server smc $A 7782 64M --direction c2s --expect-mode smcr --io-timeout 300) > /tmp/s2.log 2>&1; r2=\$?; cat /tmp/s2.log
ok=1
for f in /tmp/s1.log /tmp/s2.log; do
    grep STREAM-RESULT \$f | grep -q 'verified=1' && grep STREAM-RESULT \$f | grep -q 'smc_mode=smcr' || ok=0
done
[ \$r1 = 0 ] && [ \$r2 = 0 ] && [ \$ok = 1 ]; case_ smcr-v2 \$? "A->B: \$(grep STREAM-RESULT /tmp/s1.log | grep -o 'mibps=[^ ]*\|smc_mode=[^ ]*' | tr '\n' ' ') B->A: \$(grep STREAM-RESULT /tmp/s2.log | grep -o 'mibps=[^ ]*\|smc_mode=[^ ]*' | tr '\n' ' ')"
smc-guest-tests smc info
fi
if [ $W_FAULTS = 1 ]; then
# The host installs the faults when it sees this line.
echo "PHASE faults"
sleep 8
retry 3 timeout 420 ibv_rc_pingpong -d rxe0 -g \$g -p 18516 -n 200 -c $B > /tmp/pf.log 2>&1; rc=\$?; cat /tmp/pf.log
rdma statistic show link rxe0/1 | awk '{ for (i = 1; i < NF; i++) if (\$i ~ /duplicate_request|out_of_seq_request|rcvd_seq_err|retry/) print "RXE-STAT", \$i, \$(i + 1) }'
case_ faults-rc \$rc "\$(grep iters /tmp/pf.log)"
echo "PHASE done"
fi
exit 0
EOF

cat >"$d/b.sh" <<EOF
. /opt/vr/common.sh
echo "== \$VR_NAME: kernel \$(uname -r), eth0 mtu \$(cat /sys/class/net/eth0/mtu)"
i=0; until ping -c 1 -W 2 $A >/dev/null 2>&1; do i=\$((i+1)); [ \$i -ge 180 ] && break; sleep 1; done
if [ $W_RPING = 1 ]; then
siw_up || echo "siw0 did not come up"
timeout -k 10 600 rping -s -a $B -p 7174 -S $RPING_SIZE -C $RPING_PINGS -v -V > /tmp/rps.log 2>&1; echo "B rping rc=\$?"; tail -n 3 /tmp/rps.log | cut -c 1-160
echo "RPING-SERVER-PINGS \$(grep -c '^server ping data: rdma-ping-' /tmp/rps.log)"
rdma link delete siw0
fi
if [ $W_TCP = 1 ]; then
$(stream server tcp $B 5201 "$bytes"); echo "B tcp rc=\$?"
fi
if [ $W_RXE = 1 ]; then
rxe_up
g=\$(roce_gid_index rxe0 $B)
fi
if [ $W_RC = 1 ]; then
timeout 600 ibv_rc_pingpong -d rxe0 -g \$g -p 18515 -n 500 -c; echo "B pingpong rc=\$?"
fi
if [ $W_SMC = 1 ]; then
$(stream server smc $B 7781 64M --direction c2s --expect-mode smcr --io-timeout 300); echo "B smc server rc=\$?"
$(stream client smc $A 7782 64M --direction c2s --expect-mode smcr --io-timeout 300); echo "B smc client rc=\$?"
fi
if [ $W_FAULTS = 1 ]; then
timeout 500 ibv_rc_pingpong -d rxe0 -g \$g -p 18516 -n 200 -c; echo "B pingpong under faults rc=\$?"
fi
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
# --underlay-mtu: the daemons (and tshark) run in this namespace; QEMU
# reaches them through their vhost-user socket files from the host's.
NETNS="" IN_NS=()
cleanup() {
    stop_daemon; stop_b
    [[ -n $TSHARK_PID ]] && kill "$TSHARK_PID" 2>/dev/null
    [[ -n $NETNS ]] && ip netns del "$NETNS" 2>/dev/null
}
trap 'cleanup; exit 130' INT TERM
trap 'cleanup' EXIT

if [[ -n $underlay_mtu ]]; then
    [[ $(id -u) -eq 0 ]] || fail_all "--underlay-mtu needs root (a network namespace)"
    NETNS="vrx-$$"
    { ip netns add "$NETNS" && ip -n "$NETNS" link set lo mtu "$underlay_mtu" && ip -n "$NETNS" link set lo up; } \
        >"$d/netns.log" 2>&1 || fail_all "cannot make the underlay namespace: $(head -1 "$d/netns.log")"
    IN_NS=(ip netns exec "$NETNS")
    say "underlay: namespace $NETNS, loopback MTU $underlay_mtu"
fi
# The underlay's IPv4 counters (fragments made and reassembled).
ip_counters() {
    "${IN_NS[@]}" awk '/^Ip:/ { if (!h) { for (i = 2; i <= NF; i++) n[i] = $i; h = 1 } else for (i = 2; i <= NF; i++) print n[i], $i }' /proc/net/snmp
}
ip_counters >"$d/snmp-before.txt"

mkdir -p "$d/captures"
NO_COLOR=1 "${IN_NS[@]}" "$DAEMON" serve \
    --port "a=$d/a.sock,mac=$MACA" \
    --port "up,kind=vxlan,local=127.0.0.1:$PA,remote=127.0.0.2:$PB,vni=$VNI" \
    --control "$d/ctl.sock" --capture-dir "$d/captures" >"$d/daemon.log" 2>&1 &
DAEMON_PID=$!
NO_COLOR=1 "${IN_NS[@]}" "$DAEMON" serve \
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
if ((W_RPING)); then
    ctl_a faults add --port a --proto tcp --action mpa-settle --delay-ms 300 >>"$d/faults.log" 2>&1 ||
        fail_all "ctl faults add mpa-settle failed (see $d/faults.log)"
fi
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
            "${IN_NS[@]}" tshark -q -i lo -f "udp port $PA or udp port $PB" -c 3000 -w "$d/underlay.pcapng" >"$d/tshark-live.log" 2>&1 &
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
"$DAEMON" ctl --control "$d/ctl-b.sock" status --json >"$d/ctl-status-b.json" 2>&1
ip_counters >"$d/snmp-after.txt"
stop_daemon
stop_b
grep -E 'panicked' "$d"/daemon*.log | tail -5

out="$d/ga/a.job/out.log"
[[ -f $out ]] || out=/dev/null
for c in "${CASES[@]}"; do
    [[ $c == capture || $c == uplink-mtu ]] && continue
    line="$(grep -E "^CASE $c rc=" "$out" | tail -n 1)"
    if [[ -z $line ]]; then
        record FAIL "$c" "guest A never reported it (run-guests A exit $ra, B exit $rb; $d/ga/a.console.log)"
    elif [[ $line == *" rc=0"* ]]; then
        extra=""
        # The last `faults list`: id, matched, acted, ... per rule.
        [[ $c == faults-rc ]] && extra="; fault rules (id matched acted ...): $(grep -- '->' "$d/faults.log" | tail -n 2 | tr -s ' ' | tr '\n' ';'); $(grep '^RXE-STAT' "$out" | cut -d' ' -f2- | tr -s ' \t' ' ' | tr '\n' ',')"
        if [[ $c == rping-siw ]]; then
            # The server's own count: it verified and printed every ping too.
            sp="$(grep -E '^RPING-SERVER-PINGS [0-9]+' "$d/gb/b.job/out.log" 2>/dev/null | tail -n 1 | cut -d' ' -f2)"
            if ((${sp:-0} < RPING_PINGS)); then
                record FAIL "$c" "${line#* rc=0}; but the server printed ${sp:-no} pings (see $d/gb/b.job/out.log)"
                continue
            fi
            extra="; the server printed $sp"
        fi
        record PASS "$c" "${line#* rc=0}$extra"
    else
        record FAIL "$c" "${line#CASE $c } (see $out)"
    fi
done
if ! want capture; then
    :
elif ! command -v tshark >/dev/null; then
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
if want uplink-mtu; then
    # uplink_counters JSON: "tx_over_mtu tx_oversized rx_oversized tx_send_errors" of port up
    uplink_counters() {
        python3 -c '
import json, sys
u = [u for u in json.load(open(sys.argv[1]))["uplinks"] if u["port"] == "up"][0]["vxlan"]
c = u["counters"]
print(c["tx_over_mtu"], c["tx_oversized"], c["rx_oversized"], c["tx_send_errors"], u["df"])' "$1" 2>/dev/null
    }
    read -r a_over a_big a_rxbig a_err a_df < <(uplink_counters "$d/ctl-status.json")
    read -r b_over b_big b_rxbig b_err b_df < <(uplink_counters "$d/ctl-status-b.json")
    snmp() { awk -v k="$2" '$1 == k { print $2 }' "$1"; }
    frag=() fragged=1
    for k in FragOKs FragCreates ReasmOKs; do
        n=$(( $(snmp "$d/snmp-after.txt" $k) - $(snmp "$d/snmp-before.txt" $k) ))
        frag+=("$k +$n")
        [[ $k != FragCreates ]] && ((n == 0)) && fragged=0
    done
    where="host loopback (MTU $(cat /sys/class/net/lo/mtu))"
    [[ -n $underlay_mtu ]] && where="namespace loopback MTU $underlay_mtu"
    detail="df ${a_df:-?}/${b_df:-?}; frames beyond mtu= sent: A ${a_over:-?}, B ${b_over:-?}; dropped as oversized: A ${a_big:-?}+${a_rxbig:-?}, B ${b_big:-?}+${b_rxbig:-?}; send errors A ${a_err:-?}, B ${b_err:-?}; underlay ($where): ${frag[*]}"
    if [[ -z ${a_over:-} || -z ${b_over:-} ]]; then
        record FAIL uplink-mtu "no uplink counters (see $d/ctl-status.json, $d/ctl-status-b.json)"
    elif ((a_over > 0 && a_big + a_rxbig + b_big + b_rxbig + a_err + b_err == 0)) &&
        { [[ -z $underlay_mtu ]] || ((underlay_mtu >= 1550 || fragged)); }; then
        record PASS uplink-mtu "$detail"
    else
        record FAIL uplink-mtu "$detail"
    fi
fi
finish

#!/usr/bin/env bash
# End-to-end test "guest rxe against a virtual host": the vhost-rdma daemon
# serves one port and one virtual host vh (10.77.0.10/24, virtual-host crate);
# one Linux 7.3 guest (10.77.0.1) attaches, creates rxe0 on eth0 and runs the
# unmodified rdma-core tool against the host in both roles.
#
# --rdma erdma: the guest's RDMA device is instead the daemon's emulated erdma
# function (port r, kind=erdma,netdev=g; QEMU vfio-user-pci), erdma_0 on eth0:
# the same cases, with both RC ends run by the daemon.
#
# Cases (one guest boot runs all of them, in this order):
#   ping                 the guest pings the virtual host (ARP + ICMP)
#   pingpong-guest-server  ibv_rc_pingpong server in the guest (-p 18516); the
#                        host's pingpong-client service, started through the
#                        control socket before the guest boots, connects to it
#   pingpong-guest-client  ibv_rc_pingpong client in the guest towards the host's
#                        pingpong-server service (port 18515, from the config file)
#   write-bw-guest-client  perftest ib_write_bw client in the guest (-p 18517)
#                        towards the host's write-bw-server service
#   send-bw-guest-client   perftest ib_send_bw client in the guest (-p 18518)
#                        towards the host's send-bw-server service
#   read-bw-guest-client   ib_read_bw (-p 18519) towards read-bw-server
#   atomic-bw-guest-client ib_atomic_bw (-p 18520) towards atomic-bw-server
#   {write,send,read,atomic}-bw-guest-server  the tool as server in the guest
#                        (-p 18521..18524); the host's *-bw-client services,
#                        started through the control socket before the guest
#                        boots, connect to it
#   rping-guest-client   rping -c -a HOST -C N -v -V (rdma_cm: IB CM MADs on
#                        QP1) against the host's rping-server-roce (port 7174)
#   rping-guest-server   rping -s -a GUEST -v -V; the host's rping-client-roce
#                        (ctl, started before the boot) connects to it
#   ucmatose-guest-client  ucmatose -s HOST -C N against ucmatose-server-roce
#   ucmatose-guest-server  ucmatose -b GUEST -C N; ucmatose-client-roce connects
#   {write,send,read,atomic}-bw-R-guest-client  ib_*_bw -R (rdma_cm over RoCE: two
#                        CM connections, control and data) -d rxe0 -s S -n I
#                        towards a second virtual host vh2 (10.77.0.11), whose
#                        *-bw-server services have rdma-cm = true, roce = true
#                        (config file; ports 18531-18534; ib_atomic_bw runs
#                        8-byte FETCH AND ADDs, no -s)
#   {write,send,read,atomic}-bw-R-guest-server  ib_*_bw -R as server in the guest
#                        (ports 18541-18544); vh2's *-bw-client --rdma-cm
#                        --roce (ctl, started before the boot) connects to it
#   The perftest -R rows pass when the tool exits 0 and prints its BW row with
#   I iterations AND the host service reports a finished session, no failed
#   one, and at least I operations counted (WRITEs placed, READ requests
#   answered, atomics executed, receives completed; client: operations
#   completed).
#
# rping/ucmatose cases are judged by what was verified, not by exit codes:
# the guest client must print N "ping data:" lines (-V compared each echo),
# the guest server N "server ping data:" lines, and the host's service must
# report a finished session with N pings / messages it checked itself.
#
# A pingpong case passes only if the tool exits 0 and prints its throughput
# line, and the daemon's host service reports a finished session with every
# iteration (the host checks each echoed message; the client role reports
# how many it verified). Ends with "N passed, M failed, K skipped".
set -uo pipefail

HERE="$(cd "$(dirname "$(readlink -f "$0")")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
CASES=(ping pingpong-guest-server pingpong-guest-client write-bw-guest-client send-bw-guest-client
    read-bw-guest-client atomic-bw-guest-client write-bw-guest-server send-bw-guest-server
    read-bw-guest-server atomic-bw-guest-server rping-guest-client rping-guest-server
    ucmatose-guest-client ucmatose-guest-server write-bw-R-guest-client send-bw-R-guest-client
    read-bw-R-guest-client atomic-bw-R-guest-client write-bw-R-guest-server send-bw-R-guest-server
    read-bw-R-guest-server atomic-bw-R-guest-server)
# tool, port of the guest-server cases
BW_SERVERS=("write 18521" "send 18522" "read 18523" "atomic 18524")
# perftest -R over RoCE against vh2: guest-client and guest-server ports.
BW_R_VERBS=(write send read atomic)
declare -A RC_PORT=([write]=18531 [send]=18532 [read]=18533 [atomic]=18534)
declare -A RS_PORT=([write]=18541 [send]=18542 [read]=18543 [atomic]=18544)
r_size() { if [[ $1 == atomic ]]; then echo 8; else echo "$bw_size"; fi; }  # message size of a -R row

usage() {
    cat <<EOF
Usage: ${0##*/} [options]
$(e2e_opts_usage)
  --iters N          ibv_rc_pingpong iterations (default 1000, the tool's default)
  --bw-iters N       ib_write_bw / ib_send_bw iterations (default 200)
  --capture          record the fabric to LOGDIR/fabric.pcapng (ctl capture, 512-byte
                     snaplen: whole CM MADs for tshark)
  --cm-only          run only ping and the rdma_cm cases (rping, ucmatose,
                     perftest -R); same as --only cm,perftest-cm
  --only GROUPS      comma list of: verbs (pingpong, perftest), cm (rping,
                     ucmatose), perftest-cm (perftest -R over RoCE); default all
  --bw-size S        perftest -R message size (-s, default 65536)
  --count N          rping -C / ucmatose -C count (default 10)
  --rdma DEV         the guest's RDMA device: rxe (default; rdma link add) or
                     erdma (the daemon's erdma function, QEMU >= 10.1)
  -h, --help
EOF
}

build=1 profile=debug image="" qemu="" accel=auto iters=1000 bw_iters=200 timeout=900 logdir="" keep_logs=0 capture=0
only=verbs,cm,perftest-cm count=10 bw_size=65536 rdma=rxe
# shellcheck source=scripts/lib-e2e.sh
. "$HERE/lib-e2e.sh"
while (($#)); do
    case "$1" in
        --iters) iters="$2"; shift 2 ;;
        --bw-iters) bw_iters="$2"; shift 2 ;;
        --capture) capture=1; keep_logs=1; shift ;;
        --cm-only) only=cm,perftest-cm; shift ;;
        --only) only="$2"; shift 2 ;;
        --bw-size) bw_size="$2"; shift 2 ;;
        --count) count="$2"; shift 2 ;;
        --rdma) rdma="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) e2e_opt "$@" || { echo "e2e-vhost: unknown argument $1" >&2; usage >&2; exit 2; }; shift "$E2E_SHIFT" ;;
    esac
done

do_verbs=0 do_cm=0 do_perfcm=0
[[ ,$only, == *,verbs,* ]] && do_verbs=1
[[ ,$only, == *,cm,* ]] && do_cm=1
[[ ,$only, == *,perftest-cm,* ]] && do_perfcm=1
# The old name of "no verbs cases".
cm_only=$((1 - do_verbs))

case "$rdma" in
    rxe) E2E_NAME=e2e-vhost DEV=rxe0 ;;
    erdma) E2E_NAME=e2e-vhost-erdma DEV=erdma_0 ;;
    *) echo "e2e-vhost: --rdma wants rxe or erdma, not $rdma" >&2; exit 2 ;;
esac
e2e_begin
e2e_prepare

GUEST_IP=10.77.0.1 HOST_IP=10.77.0.10 HOST2_IP=10.77.0.11 GMAC=52:54:00:77:00:01
d="$logdir"

# ---- guest job (scripts/guest/rdma-lib.sh first)
cat "$HERE/guest/rdma-lib.sh" >"$d/g.sh"
cat >>"$d/g.sh" <<EOF
echo "== \$VR_NAME: kernel \$(uname -r)"
i=0; while [ "\$(cat /sys/class/net/eth0/carrier 2>/dev/null)" != 1 ]; do i=\$((i + 1)); [ \$i -ge 30 ] && { echo 'E2E-FAIL no carrier'; exit 10; }; sleep 1; done
i=0; until ping -c 1 -W 2 $HOST_IP >/dev/null 2>&1; do i=\$((i + 1)); [ \$i -ge 30 ] && break; sleep 1; done
ping -c 3 -W 5 $HOST_IP; echo "VH-RESULT case=ping rc=\$?"
ip neigh show $HOST_IP
if [ $DEV = rxe0 ]; then rdma link add rxe0 type rxe netdev eth0 || { echo 'E2E-FAIL rdma link add'; exit 11; }; fi
i=0; until rdma link show $DEV/1 2>/dev/null | grep -q 'state ACTIVE.* netdev eth0'; do i=\$((i + 1)); [ \$i -ge 30 ] && { echo 'E2E-FAIL $DEV not ACTIVE on eth0'; rdma link show; exit 12; }; sleep 1; done
rdma link show $DEV/1
# The RoCE v2 GID of our IPv4 address (rdma-lib.sh, at the top of this job).
gidx=\$(roce_gid_index $DEV $GUEST_IP) || { echo 'E2E-FAIL no RoCE v2 GID'; for f in /sys/class/infiniband/$DEV/ports/1/gids/*; do echo "\$f \$(cat \$f)"; done; exit 13; }
echo "RoCE v2 GID index: \$gidx"
if [ $cm_only = 0 ]; then
echo "== pingpong: guest server, virtual host client"
timeout 300 ibv_rc_pingpong -d $DEV -g \$gidx -p 18516 -n $iters; echo "VH-RESULT case=pingpong-guest-server rc=\$?"
echo "== pingpong: guest client, virtual host server"
timeout 300 ibv_rc_pingpong -d $DEV -g \$gidx -n $iters $HOST_IP; echo "VH-RESULT case=pingpong-guest-client rc=\$?"
echo "== ib_write_bw: guest client, virtual host server"
timeout 600 ib_write_bw -d $DEV -x \$gidx -p 18517 -n $bw_iters $HOST_IP; echo "VH-RESULT case=write-bw-guest-client rc=\$?"
echo "== ib_send_bw: guest client, virtual host server"
timeout 600 ib_send_bw -d $DEV -x \$gidx -p 18518 -n $bw_iters $HOST_IP; echo "VH-RESULT case=send-bw-guest-client rc=\$?"
echo "== ib_read_bw: guest client, virtual host server"
timeout 600 ib_read_bw -d $DEV -x \$gidx -p 18519 -n $bw_iters $HOST_IP; echo "VH-RESULT case=read-bw-guest-client rc=\$?"
echo "== ib_atomic_bw: guest client, virtual host server"
timeout 600 ib_atomic_bw -d $DEV -x \$gidx -p 18520 -n $bw_iters $HOST_IP; echo "VH-RESULT case=atomic-bw-guest-client rc=\$?"
for t in write:18521 send:18522 read:18523 atomic:18524; do
    v=\${t%%:*}; p=\${t##*:}
    echo "== ib_\${v}_bw: guest server, virtual host client"
    timeout 300 ib_\${v}_bw -d $DEV -x \$gidx -p \$p -n $bw_iters; echo "VH-RESULT case=\$v-bw-guest-server rc=\$?"
done
fi
if [ $do_cm = 1 ]; then
echo "== CASE rping-guest-client"
timeout 300 rping -c -a $HOST_IP -C $count -v -V; echo "VH-RESULT case=rping-guest-client rc=\$?"
echo "== CASE rping-guest-server"
timeout 300 rping -s -a $GUEST_IP -p 7174 -v -V; echo "VH-RESULT case=rping-guest-server rc=\$?"
echo "== CASE ucmatose-guest-client"
timeout 300 ucmatose -s $HOST_IP -C $count; echo "VH-RESULT case=ucmatose-guest-client rc=\$?"
echo "== CASE ucmatose-guest-server"
timeout 300 ucmatose -b $GUEST_IP -C $count; echo "VH-RESULT case=ucmatose-guest-server rc=\$?"
fi
if [ $do_perfcm = 1 ]; then
# ib_atomic_bw's operations are 8 bytes (no -s)
for t in write:${RC_PORT[write]} send:${RC_PORT[send]} read:${RC_PORT[read]} atomic:${RC_PORT[atomic]}; do
    v=\${t%%:*}; p=\${t##*:}; sz="-s $bw_size"; [ \$v = atomic ] && sz=
    echo "== CASE \$v-bw-R-guest-client"
    timeout 600 ib_\${v}_bw -R -d $DEV -p \$p -n $bw_iters \$sz $HOST2_IP
    echo "VH-RESULT case=\$v-bw-R-guest-client rc=\$?"
done
for t in write:${RS_PORT[write]} send:${RS_PORT[send]} read:${RS_PORT[read]} atomic:${RS_PORT[atomic]}; do
    v=\${t%%:*}; p=\${t##*:}; sz="-s $bw_size"; [ \$v = atomic ] && sz=
    echo "== CASE \$v-bw-R-guest-server"
    timeout 600 ib_\${v}_bw -R -d $DEV -p \$p -n $bw_iters \$sz
    echo "VH-RESULT case=\$v-bw-R-guest-server rc=\$?"
done
fi
echo "== CASE end"
rdma statistic show link $DEV/1 2>/dev/null | head -n 5
exit 0
EOF

# ---- daemon with one port and one virtual host; the host and its server
# service come from the config file (the iterations must match the tool's -n,
# which rc_pingpong does not exchange).
cat >"$d/vhost.toml" <<EOF
[[host]]
name = "vh"
address = "$HOST_IP/24"
[[host.service]]
kind = "pingpong-server"
iters = $iters
[[host.service]]
kind = "write-bw-server"
port = 18517
iters = $bw_iters
[[host.service]]
kind = "send-bw-server"
port = 18518
iters = $bw_iters
[[host.service]]
kind = "read-bw-server"
port = 18519
iters = $bw_iters
[[host.service]]
kind = "atomic-bw-server"
port = 18520
iters = $bw_iters
[[host.service]]
kind = "rping-server-roce"
[[host.service]]
kind = "ucmatose-server-roce"
iters = $count
EOF
# perftest -R over RoCE on a second host (a host runs at most 16 services).
cat >>"$d/vhost.toml" <<EOF
[[host]]
name = "vh2"
address = "$HOST2_IP/24"
EOF
for v in "${BW_R_VERBS[@]}"; do
    cat >>"$d/vhost.toml" <<EOF
[[host.service]]
kind = "$v-bw-server"
rdma-cm = true
roce = true
port = ${RC_PORT[$v]}
size = $(r_size "$v")
iters = $bw_iters
EOF
done
ERDMA_PORT=() GUEST_EXTRA=""
if [[ $rdma == erdma ]]; then
    "$qemu" -machine none -device help 2>/dev/null | grep -q '"vfio-user-pci"' ||
        fail_all "$qemu has no vfio-user-pci device (QEMU >= 10.1 needed for --rdma erdma)"
    ERDMA_PORT=(--port "r=$d/r.sock,kind=erdma,netdev=g")
    GUEST_EXTRA="vfio=$d/r.sock,"
fi
start_daemon "$d/g.sock" "$d/ctl.sock" -- \
    --config "$d/vhost.toml" \
    --port "g=$d/g.sock,mac=$GMAC" \
    "${ERDMA_PORT[@]}" \
    --control "$d/ctl.sock" --capture-dir "$d"
if ((capture)); then
    rm -f "$d/fabric.pcapng"  # captures never replace a file (a reused --logdir)
    "$DAEMON" ctl --control "$d/ctl.sock" capture start --file "$d/fabric.pcapng" --snaplen 512 ||
        say "capture did not start"
fi
# The host's client towards the guest's server: started now through the
# control socket; it retries until the guest's tool listens.
if ! "$DAEMON" ctl --control "$d/ctl.sock" host vh start pingpong-client --peer "$GUEST_IP" \
        --port 18516 --iters "$iters" --connect-timeout "$timeout" >"$d/ctl-start.txt" 2>&1; then
    cat "$d/ctl-start.txt" >&2
    fail_all "ctl host vh start pingpong-client failed"
fi
for t in "${BW_SERVERS[@]}"; do
    read -r v p <<<"$t"
    "$DAEMON" ctl --control "$d/ctl.sock" host vh start "$v-bw-client" --peer "$GUEST_IP" \
        --port "$p" --iters "$bw_iters" --connect-timeout "$timeout" >>"$d/ctl-start.txt" 2>&1 ||
        fail_all "ctl host vh start $v-bw-client failed: $(tail -n 1 "$d/ctl-start.txt")"
done
cm_specs=()
((do_cm)) && cm_specs=("rping-client-roce --port 7174 --iters $count" "ucmatose-client-roce --port 7471 --iters $count")
for spec in "${cm_specs[@]}"; do
    # shellcheck disable=SC2086
    "$DAEMON" ctl --control "$d/ctl.sock" host vh start $spec --peer "$GUEST_IP" \
        --connect-timeout "$timeout" >>"$d/ctl-start.txt" 2>&1 ||
        fail_all "ctl host vh start $spec failed: $(tail -n 1 "$d/ctl-start.txt")"
done
if ((do_perfcm)); then
    for v in "${BW_R_VERBS[@]}"; do
        "$DAEMON" ctl --control "$d/ctl.sock" host vh2 start "$v-bw-client" --rdma-cm --roce \
            --peer "$GUEST_IP" --port "${RS_PORT[$v]}" --size "$(r_size "$v")" --iters "$bw_iters" \
            --connect-timeout "$timeout" >>"$d/ctl-start.txt" 2>&1 ||
            fail_all "ctl host vh2 start $v-bw-client --rdma-cm --roce failed: $(tail -n 1 "$d/ctl-start.txt")"
    done
fi
cat "$d/ctl-start.txt"

e2e_run_guest

out="$d/g.job/out.log"
rc="$(guest_rc ping)"
if [[ $rc == 0 ]]; then
    record PASS ping "guest pinged $HOST_IP"
else
    record FAIL ping "ping rc=${rc:-none} (logs: $d)"
fi

check_pingpong() {  # check_pingpong CASE HOST_KIND ROLE_TEXT
    local c=$1 kind=$2 what=$3 why=()
    local rc tput hs ok it ver err
    rc="$(guest_rc "$c")"
    [[ $rc == 0 ]] || why+=("tool rc=${rc:-none}")
    # The tool's throughput line, from this role's section of the output.
    local role="guest server"; [[ $c == pingpong-guest-client ]] && role="guest client"
    tput="$(sed -n "/^== pingpong: $role/,/^VH-RESULT case=$c /p" "$out" 2>/dev/null |
        grep -E '^[0-9]+ bytes in [0-9.]+ seconds = [0-9.]+ Mbit/sec' | head -n 1)"
    [[ -n $tput ]] || why+=("no throughput line")
    sed -n "/^== pingpong: $role/,/^VH-RESULT case=$c /p" "$out" 2>/dev/null |
        grep -Eq "^$iters iters in " || why+=("no '$iters iters' line")
    read -r ok _ it ver err <<<"$(host_stats vh "$kind" -)"
    [[ ${ok:-0} -ge 1 ]] || why+=("host $kind: no finished session (${err:-no status})")
    [[ ${it:-0} == "$iters" ]] || why+=("host $kind: $it iterations, want $iters")
    if [[ $kind == pingpong-client ]]; then
        [[ ${ver:-0} == "$iters" ]] || why+=("host client verified ${ver:-0} of $iters echoes")
    else
        [[ ${ver:-0} == $((iters - 1)) ]] || why+=("host server verified ${ver:-0} of $((iters - 1)) echoes")
    fi
    verdict "$c" "$what: $tput; host $kind: $it iterations, $ver echoed messages verified"
}
if ((cm_only)); then
    for c in pingpong-guest-server pingpong-guest-client write-bw-guest-client send-bw-guest-client \
        read-bw-guest-client atomic-bw-guest-client write-bw-guest-server send-bw-guest-server \
        read-bw-guest-server atomic-bw-guest-server; do
        record SKIP "$c" "--only $only"
    done
else
check_pingpong pingpong-guest-server pingpong-client "guest server, host client"
check_pingpong pingpong-guest-client pingpong-server "guest client, host server"

# perftest: the tool's exit status and its result row (size, iterations,
# BW peak, BW average, message rate) from the tool's section of the output,
# and the host's finished session with at least as many messages as
# iterations (ib_write_bw's warm-up may add some).
check_bw() {  # check_bw CASE HOST_KIND TOOL ROLE ("guest client" or "guest server")
    local c=$1 kind=$2 tool=$3 role=$4 rc row ok it ver err why=()
    rc="$(guest_rc "$c")"
    row="$(sed -n "/^== $tool: $role/,/^VH-RESULT case=$c /p" "$out" 2>/dev/null |
        grep -E "^[[:space:]]*[0-9]+[[:space:]]+$bw_iters[[:space:]]+[0-9.]+[[:space:]]+[0-9.]+[[:space:]]+[0-9.]+" |
        tail -n 1 | tr -s ' \t' ' ')"
    read -r ok _ it ver err <<<"$(host_stats vh "$kind" -)"
    [[ $rc == 0 ]] || why+=("tool rc=${rc:-none}")
    [[ -n $row ]] || why+=("no result row")
    [[ ${ok:-0} -ge 1 ]] || why+=("host $kind: no finished session (${err:-no status})")
    [[ ${it:-0} -ge $bw_iters ]] || why+=("host $kind: ${it:-0} messages, want >= $bw_iters")
    verdict "$c" "guest $tool -n $bw_iters: row '$row'; host $kind accepted $it messages"
}
check_bw write-bw-guest-client write-bw-server ib_write_bw "guest client"
check_bw send-bw-guest-client send-bw-server ib_send_bw "guest client"
check_bw read-bw-guest-client read-bw-server ib_read_bw "guest client"
check_bw atomic-bw-guest-client atomic-bw-server ib_atomic_bw "guest client"
for t in "${BW_SERVERS[@]}"; do
    read -r v p <<<"$t"
    check_bw "$v-bw-guest-server" "$v-bw-client" "ib_${v}_bw" "guest server"
done
fi

# rdma_cm over RoCE.
check_cm() {  # check_cm CASE LINE_RE (or "") HOST_KIND WHAT
    local c=$1 re=$2 kind=$3 what=$4 why=() rc n="" seen="test complete" ok bad it ver err
    rc="$(guest_rc "$c")"
    if [[ -n $re ]]; then
        n="$(case_out "$c" | grep -Ec "$re")"
        [[ ${n:-0} -ge $count ]] || why+=("guest printed ${n:-0} of $count verified lines (rc=${rc:-none})")
        seen="$n verified lines"
        if case_out "$c" | grep -Eiq 'data mismatch'; then
            why+=("guest: $(case_out "$c" | grep -Ei 'data mismatch' | head -n 1)")
        fi
    else
        case_out "$c" | grep -q 'test complete' || why+=("no 'test complete' line (rc=${rc:-none})")
        [[ $rc == 0 ]] || why+=("ucmatose rc=${rc:-none}")
    fi
    read -r ok bad it ver err <<<"$(host_stats vh "$kind" -)"
    [[ ${ok:-0} -ge 1 ]] || why+=("host $kind: no finished session (${err:-no status})")
    [[ ${it:-0} == "$count" && ${ver:-0} == "$count" ]] ||
        why+=("host $kind: last session ${it:-0} iterations, ${ver:-0} verified, want $count")
    verdict "$c" "$what: guest $seen; host $kind: $it iterations, $ver verified, ${bad:-0} failed sessions"
}
if ((do_cm)); then
check_cm rping-guest-client '^ping data: rdma-ping-' rping-server-roce "guest rping -c, host server over RoCE"
check_cm rping-guest-server '^server ping data: rdma-ping-' rping-client-roce "guest rping -s, host client over RoCE"
check_cm ucmatose-guest-client "" ucmatose-server-roce "guest ucmatose client, host server over RoCE"
check_cm ucmatose-guest-server "" ucmatose-client-roce "guest ucmatose server, host client over RoCE"
else
    for c in rping-guest-client rping-guest-server ucmatose-guest-client ucmatose-guest-server; do
        record SKIP "$c" "--only $only"
    done
fi

# perftest -R over RoCE (host vh2).
for v in "${BW_R_VERBS[@]}"; do
    if ((do_perfcm)); then
        check_bw_cm "$v-bw-R-guest-client" vh2 "$v-bw-server" "${RC_PORT[$v]}" "$(r_size "$v")"
        check_bw_cm "$v-bw-R-guest-server" vh2 "$v-bw-client" "${RS_PORT[$v]}" "$(r_size "$v")"
    else
        record SKIP "$v-bw-R-guest-client" "--only $only"
        record SKIP "$v-bw-R-guest-server" "--only $only"
    fi
done
python3 -c 'import json,sys
for h in json.load(open(sys.argv[1])):
    print("host", h.get("name"), "cm:", json.dumps({k: v for k, v in h.items() if k in ("cm", "gsi")}))' "$d/hosts.json" 2>/dev/null
if ((failed)); then
    echo "--- guest console tail:"; tail -n 30 "$d/g.console.log" 2>/dev/null | sed 's/^/    /'
    echo "--- daemon log tail:"; tail -n 20 "$d/daemon.log" | sed 's/^/    /'
fi
finish

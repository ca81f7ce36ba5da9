#!/usr/bin/env bash
# End-to-end test "guest siw against a virtual host": the vhost-rdma daemon
# serves one port and one virtual host vh (10.77.0.10/24, virtual-host crate,
# iWARP on smoltcp TCP with the siw crate's engine); one Linux 7.3 guest
# (10.77.0.1) attaches, creates siw0 on eth0 and runs the unmodified rping
# (librdmacm) against the host in both roles.
#
# Cases (one guest boot runs all of them, in this order):
#   ping                    the guest pings the virtual host (ARP + ICMP)
#   rping-guest-client      rping -c -a HOST -C N -v -V in the guest against
#                           the host's rping-server service (port 7174, from
#                           the daemon's config file)
#   rping-guest-client-crc  the same against a second host server (port 7175,
#                           mpa-crc = true) that asks for MPA CRC (the 7.3
#                           guest's siw has no writable mpa_crc_required)
#   rping-guest-server      rping -s -v -V in the guest (port 7174); the host's
#                           rping-client service (ctl, started before the boot)
#                           connects to it and runs N pings
#   rping-guest-server-crc  the same on port 7175 with the host asking for
#                           MPA CRC (ctl --mpa-crc)
#   ucmatose-guest-client   ucmatose -s HOST -C N in the guest against the
#                           host's ucmatose-server (port 7471, iters = N)
#   ucmatose-guest-server   ucmatose -C N in the guest; the host's
#                           ucmatose-client (ctl) connects to it
#   {write,send,read}-bw-R-guest-client[-crc]
#                           ib_{write,send,read}_bw -R (rdma_cm) -d siw0 -n I
#                           -s S HOST in the guest against the host's
#                           *-bw-server services with rdma-cm = true (config
#                           file; ports 18521-18523, -crc: 18531-18533 with
#                           mpa-crc = true)
#   {write,send,read}-bw-R-guest-server[-crc]
#                           ib_*_bw -R -d siw0 as server in the guest (ports
#                           18541-18543, -crc: 18551-18553); the host's
#                           *-bw-client --rdma-cm [--mpa-crc] (ctl) connects
#   capture-check           with --capture: `vhost-rdma check-capture` on the
#                           fabric's capture finds nothing (MPA framing and
#                           CRC, DDP/RDMAP rules on every connection; every
#                           retransmission and the receiving port's copy of
#                           each frame equal to the first sighting)
#
# A perftest case passes if the tool exits 0 and prints its result row with
# I iterations AND the host's service reports a finished session, no failed
# one, and at least I operations counted (the server: WRITE messages placed,
# READ requests answered or receives completed; the client: completed ops).
#
# rping exits 0 even when it never connected, and ucmatose counts flushed
# receives as received, so an rping case passes only if the
# guest printed >= N verified ping lines (-V compares every echo) AND the
# daemon's host service reports finished sessions with N pings, N verified
# and no failed session (the host server checks each buffer it RDMA READs
# against rping's pattern; the host client checks its sink after each RDMA
# WRITE). Ends with "N passed, M failed, K skipped".
set -uo pipefail

HERE="$(cd "$(dirname "$(readlink -f "$0")")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
CASES=(ping rping-guest-client rping-guest-client-crc rping-guest-server rping-guest-server-crc
    mpa-crc-negotiated ucmatose-guest-client ucmatose-guest-server)
BW_VERBS=(write send read)
for v in "${BW_VERBS[@]}"; do
    for r in guest-client guest-client-crc guest-server guest-server-crc; do CASES+=("$v-bw-R-$r"); done
done

usage() {
    cat <<EOF
Usage: ${0##*/} [options]
$(e2e_opts_usage)
  --count N          rping -C count (default 10)
  --size N           rping -S size (default 64, the tool's default)
  --bw-iters N       perftest -n (default 200)
  --bw-size N        perftest -s (default 65536, the tool's default)
  --only LIST        run only these groups: rping (rping + ucmatose), perftest
                     (default: rping,perftest); the others are SKIPPED
  --capture          record the fabric to LOGDIR/fabric.pcapng (ctl capture, whole frames;
                     \$capture_snaplen cuts them) and check it (case capture-check:
                     vhost-rdma check-capture)
  -h, --help
EOF
}

build=1 profile=debug image="" qemu="" accel=auto count=10 size=64 timeout=900 logdir="" keep_logs=0 capture=0
bw_iters=200 bw_size=65536 only=rping,perftest
# shellcheck source=scripts/lib-e2e.sh
. "$HERE/lib-e2e.sh"
while (($#)); do
    case "$1" in
        --count) count="$2"; shift 2 ;;
        --size) size="$2"; shift 2 ;;
        --bw-iters) bw_iters="$2"; shift 2 ;;
        --bw-size) bw_size="$2"; shift 2 ;;
        --only) only="$2"; shift 2 ;;
        --capture) capture=1; keep_logs=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) e2e_opt "$@" || { echo "e2e-vhost-iwarp: unknown argument $1" >&2; usage >&2; exit 2; }; shift "$E2E_SHIFT" ;;
    esac
done

# the capture case exists only when a capture is taken (not a skip in every default run)
((capture)) && CASES+=(capture-check)
do_rping=0 do_perf=0
[[ ,$only, == *,rping,* ]] && do_rping=1
[[ ,$only, == *,perftest,* ]] && do_perf=1
# The guest-client ports (CRC off / on) and guest-server ports per verb.
declare -A GC_PORT=([write]=18521 [send]=18522 [read]=18523)
declare -A GS_PORT=([write]=18541 [send]=18542 [read]=18543)

E2E_NAME=e2e-vhost-iwarp
e2e_begin
e2e_prepare

GUEST_IP=10.77.0.1 HOST_IP=10.77.0.10 HOST2_IP=10.77.0.11 GMAC=52:54:00:77:00:01
d="$logdir"

# ---- guest job
cat >"$d/g.sh" <<EOF
echo "== \$VR_NAME: kernel \$(uname -r)"
i=0; while [ "\$(cat /sys/class/net/eth0/carrier 2>/dev/null)" != 1 ]; do i=\$((i + 1)); [ \$i -ge 30 ] && { echo 'E2E-FAIL no carrier'; exit 10; }; sleep 1; done
i=0; until ping -c 1 -W 2 $HOST_IP >/dev/null 2>&1; do i=\$((i + 1)); [ \$i -ge 30 ] && break; sleep 1; done
ping -c 3 -W 5 $HOST_IP; echo "VH-RESULT case=ping rc=\$?"
rdma link add siw0 type siw netdev eth0 || { echo 'E2E-FAIL rdma link add'; exit 11; }
i=0; until rdma link show siw0/1 2>/dev/null | grep -q 'state ACTIVE'; do i=\$((i + 1)); [ \$i -ge 30 ] && { echo 'E2E-FAIL siw0 not ACTIVE'; exit 12; }; sleep 1; done
if [ $do_rping = 1 ]; then
echo "== CASE rping-guest-client"
timeout 300 rping -c -a $HOST_IP -C $count -S $size -v -V; echo "VH-RESULT case=rping-guest-client rc=\$?"
echo "== CASE rping-guest-client-crc"
timeout 300 rping -c -a $HOST_IP -p 7175 -C $count -S $size -v -V; echo "VH-RESULT case=rping-guest-client-crc rc=\$?"
echo "== CASE rping-guest-server"
timeout 300 rping -s -a $GUEST_IP -p 7174 -S $size -v -V; echo "VH-RESULT case=rping-guest-server rc=\$?"
echo "== CASE rping-guest-server-crc"
timeout 300 rping -s -a $GUEST_IP -p 7175 -S $size -v -V; echo "VH-RESULT case=rping-guest-server-crc rc=\$?"
echo "== CASE ucmatose-guest-client"
timeout 300 ucmatose -s $HOST_IP -C $count; echo "VH-RESULT case=ucmatose-guest-client rc=\$?"
echo "== CASE ucmatose-guest-server"
timeout 300 ucmatose -b $GUEST_IP -C $count; echo "VH-RESULT case=ucmatose-guest-server rc=\$?"
fi
if [ $do_perf = 1 ]; then
for crc in '' -crc; do
    for v in ${BW_VERBS[*]}; do
        case \$v in write) p=${GC_PORT[write]} ;; send) p=${GC_PORT[send]} ;; *) p=${GC_PORT[read]} ;; esac
        [ -n "\$crc" ] && p=\$((p + 10))
        echo "== CASE \$v-bw-R-guest-client\$crc"
        timeout 600 ib_\${v}_bw -R -d siw0 -p \$p -n $bw_iters -s $bw_size $HOST_IP
        echo "VH-RESULT case=\$v-bw-R-guest-client\$crc rc=\$?"
    done
done
for crc in '' -crc; do
    for v in ${BW_VERBS[*]}; do
        case \$v in write) p=${GS_PORT[write]} ;; send) p=${GS_PORT[send]} ;; *) p=${GS_PORT[read]} ;; esac
        [ -n "\$crc" ] && p=\$((p + 10))
        echo "== CASE \$v-bw-R-guest-server\$crc"
        timeout 600 ib_\${v}_bw -R -d siw0 -p \$p -n $bw_iters -s $bw_size
        echo "VH-RESULT case=\$v-bw-R-guest-server\$crc rc=\$?"
    done
done
fi
echo "== CASE end"
rdma statistic show link siw0/1 2>/dev/null | head -n 5
exit 0
EOF

# ---- daemon with one port and one virtual host; the host and its servers
# come from the config file (rping's buffer size and ucmatose's count are
# not exchanged: the servers get the guest's), the clients from ctl.
cat >"$d/vhost.toml" <<EOF
[[host]]
name = "vh"
address = "$HOST_IP/24"
[[host.service]]
kind = "rping-server"
size = $size
[[host.service]]
kind = "rping-server"
port = 7175
size = $size
mpa-crc = true
[[host.service]]
kind = "ucmatose-server"
iters = $count
EOF
# perftest -R servers (rdma-cm = true), CRC off and asked for.
for v in "${BW_VERBS[@]}"; do
    for crc in false true; do
        p=${GC_PORT[$v]}
        [[ $crc == true ]] && p=$((p + 10))
        cat >>"$d/vhost.toml" <<EOF
[[host.service]]
kind = "$v-bw-server"
rdma-cm = true
port = $p
size = $bw_size
iters = $bw_iters
mpa-crc = $crc
EOF
    done
done
# The perftest -R clients run on a second host (a host runs at most 16
# services).
cat >>"$d/vhost.toml" <<EOF
[[host]]
name = "vh2"
address = "$HOST2_IP/24"
EOF
start_daemon "$d/g.sock" "$d/ctl.sock" -- \
    --config "$d/vhost.toml" \
    --port "g=$d/g.sock,mac=$GMAC" \
    --control "$d/ctl.sock" --capture-dir "$d"
if ((capture)); then
    rm -f "$d/fabric.pcapng"  # captures never replace a file (a reused --logdir)
    snap=()
    [[ -n ${capture_snaplen:-} ]] && snap=(--snaplen "$capture_snaplen")
    "$DAEMON" ctl --control "$d/ctl.sock" capture start --file "$d/fabric.pcapng" "${snap[@]}" ||
        say "capture did not start"
fi
# The host's clients towards the guest's servers: started now through the
# control socket; they retry every second until the guest's tool listens.
specs=()
if ((do_rping)); then
    specs+=("vh rping-client --port 7174 --size $size --iters $count" "vh rping-client --port 7175 --size $size --mpa-crc --iters $count"
        "vh ucmatose-client --port 7471 --iters $count")
fi
if ((do_perf)); then
    for v in "${BW_VERBS[@]}"; do
        specs+=("vh2 $v-bw-client --rdma-cm --port ${GS_PORT[$v]} --size $bw_size --iters $bw_iters"
            "vh2 $v-bw-client --rdma-cm --port $((GS_PORT[$v] + 10)) --size $bw_size --iters $bw_iters --mpa-crc")
    done
fi
for spec in "${specs[@]}"; do
    # shellcheck disable=SC2086
    # "HOST KIND OPTIONS..."
    if ! "$DAEMON" ctl --control "$d/ctl.sock" host "${spec%% *}" start ${spec#* } --peer "$GUEST_IP" \
            --connect-timeout "$timeout" >>"$d/ctl-start.txt" 2>&1; then
        cat "$d/ctl-start.txt" >&2
        fail_all "ctl host $spec failed"
    fi
done
cat "$d/ctl-start.txt"

e2e_run_guest

out="$d/g.job/out.log"
rc="$(guest_rc ping)"
if [[ $rc == 0 ]]; then
    record PASS ping "guest pinged $HOST_IP"
else
    record FAIL ping "ping rc=${rc:-none} (logs: $d)"
fi

# check_rping CASE LINE_RE HOST_KIND HOST_PORT WANT_SESSIONS_OK WHAT
check_rping() {
    local c=$1 re=$2 kind=$3 port=$4 want_ok=$5 what=$6 why=()
    local rc n hs ok bad it ver err
    rc="$(guest_rc "$c")"
    if [[ $rc == skip ]]; then
        record SKIP "$c" "$(sed -n "s/^VH-RESULT case=$c rc=skip //p" "$out" | tail -n 1)"
        return
    fi
    n="$(case_out "$c" | grep -Ec "$re")"
    [[ ${n:-0} -ge $count ]] || why+=("guest printed ${n:-0} of $count verified ping lines (rc=${rc:-none})")
    if case_out "$c" | grep -Eiq 'data mismatch'; then
        why+=("guest: $(case_out "$c" | grep -Ei 'data mismatch' | head -n 1)")
    fi
    read -r ok bad it ver err <<<"$(host_stats - "$kind" "$port")"
    [[ ${ok:-0} -ge $want_ok ]] || why+=("host $kind:$port: ${ok:-0} finished sessions, want $want_ok (${err:-no status})")
    [[ ${bad:-1} == 0 ]] || why+=("host $kind:$port: ${bad:-?} failed sessions (${err:-no status})")
    [[ ${it:-0} == "$count" && ${ver:-0} == "$count" ]] || why+=("host $kind:$port: last session ${it:-0} pings, ${ver:-0} verified, want $count")
    verdict "$c" "$what: guest $n verified ping lines; host $kind: $it pings, $ver verified"
}
# The guest client prints "ping data: rdma-ping-K: ..." after each compared
# echo; the guest server prints "server ping data: rdma-ping-K: ..." per ping.
if ((do_rping)); then
check_rping rping-guest-client '^ping data: rdma-ping-' rping-server 7174 1 "guest client, host server"
check_rping rping-guest-client-crc '^ping data: rdma-ping-' rping-server 7175 1 "guest client, host server asking for MPA CRC"
check_rping rping-guest-server '^server ping data: rdma-ping-' rping-client 7174 1 "guest server, host client"
check_rping rping-guest-server-crc '^server ping data: rdma-ping-' rping-client 7175 1 "guest server, host client with MPA CRC"
# check_ucmatose CASE HOST_KIND WHAT
check_ucmatose() {
    local c=$1 kind=$2 what=$3 why=() rc hs ok bad it ver err
    rc="$(guest_rc "$c")"
    [[ $rc == 0 ]] || why+=("ucmatose rc=${rc:-none}")
    case_out "$c" | grep -q 'test complete' || why+=("no 'test complete' line")
    read -r ok bad it ver err <<<"$(host_stats - "$kind" 7471)"
    [[ ${ok:-0} -ge 1 && ${bad:-1} == 0 ]] || why+=("host $kind: ${ok:-0} finished, ${bad:-?} failed sessions (${err:-no status})")
    [[ ${it:-0} == "$count" && ${ver:-0} == "$count" ]] || why+=("host $kind: ${it:-0} messages, ${ver:-0} of the right length, want $count")
    verdict "$c" "$what: test complete; host $kind: $it messages received each of the right length"
}
check_ucmatose ucmatose-guest-client ucmatose-server "guest client, host server"
check_ucmatose ucmatose-guest-server ucmatose-client "guest server, host client"
else
    for c in rping-guest-client rping-guest-client-crc rping-guest-server rping-guest-server-crc \
        ucmatose-guest-client ucmatose-guest-server; do
        record SKIP "$c" "--only $only"
    done
fi

for v in "${BW_VERBS[@]}"; do
    if ((do_perf)); then
        check_bw_cm "$v-bw-R-guest-client" - "$v-bw-server" "${GC_PORT[$v]}" "$bw_size"
        check_bw_cm "$v-bw-R-guest-client-crc" - "$v-bw-server" "$((GC_PORT[$v] + 10))" "$bw_size"
        check_bw_cm "$v-bw-R-guest-server" - "$v-bw-client" "${GS_PORT[$v]}" "$bw_size"
        check_bw_cm "$v-bw-R-guest-server-crc" - "$v-bw-client" "$((GS_PORT[$v] + 10))" "$bw_size"
    else
        for r in guest-client guest-client-crc guest-server guest-server-crc; do record SKIP "$v-bw-R-$r" "--only $only"; done
    fi
done

# The CRC cases must have negotiated CRC: the host counts its connections
# with CRC (nothing else asks for it): 1 per rping case, 2 (control and
# data) per perftest case.
want_crc=$((2 * do_rping + 12 * do_perf))
crc_conns="$(python3 -c 'import json,sys; print(sum(h.get("iwarp", {}).get("connected-crc", 0) for h in json.load(open(sys.argv[1]))))' "$d/hosts.json" 2>/dev/null)"
say "host iWARP connections with MPA CRC: ${crc_conns:-?} (want $want_crc)"
if [[ ${crc_conns:-0} != "$want_crc" ]]; then
    record FAIL mpa-crc-negotiated "host reports ${crc_conns:-no} iWARP connections with CRC, want $want_crc (logs: $d)"
else
    record PASS mpa-crc-negotiated "$want_crc of the host's iWARP connections ran with MPA CRC (the -crc cases)"
fi
# The wire itself: the product's checker over the capture (the daemon
# stopped, so the file is complete).
if ((capture)); then
    "$DAEMON" check-capture "$d/fabric.pcapng" >"$d/check-capture.txt" 2>&1
    rc=$?
    conns=$(grep -c '^iwarp#' "$d/check-capture.txt")
    if grep -q 'cut-by-snaplen' "$d/check-capture.txt"; then
        record SKIP capture-check "capture_snaplen=${capture_snaplen:-} cuts frames; streams not checkable (see $d/check-capture.txt)"
    elif [[ $rc == 0 && $conns -gt 0 ]]; then
        record PASS capture-check "check-capture: $conns iWARP connections, $(tail -n 1 "$d/check-capture.txt")"
    else
        record FAIL capture-check "check-capture exit $rc, $conns iWARP connections: $(grep -m 3 -E '^ +[0-9.]+s \[|^PROBLEM|error' "$d/check-capture.txt" | tr '\n' ' ') (see $d/check-capture.txt)"
    fi
fi
if ((failed)); then
    echo "--- guest console tail:"; tail -n 30 "$d/g.console.log" 2>/dev/null | sed 's/^/    /'
    echo "--- daemon log tail:"; tail -n 20 "$d/daemon.log" | sed 's/^/    /'
fi
finish

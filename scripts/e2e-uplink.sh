#!/usr/bin/env bash
# End-to-end test of the uplink ports (docs/uplinks.md) on the host, no VM:
# network namespaces stand in for the lab network. The daemon runs in its
# own namespace with a virtual host vh (10.77.0.10) and two uplinks:
#   up  kind=vxlan, VNI 42, to a Linux vxlan netdev (id 42 dstport 4789) in
#       namespace "vtep", bridged there to a veth whose far end is client A
#       (10.77.0.1/24, its own namespace);
#   tap kind=tap, a TAP device the daemon creates, enslaved to a Linux
#       bridge in the daemon's namespace with a veth to client B
#       (10.77.0.2/24, its own namespace).
#
# Cases (all by default; --case NAME, repeatable or a comma list):
#   vxlan-ping   A (behind Linux VXLAN) pings the virtual host
#   tap-ping     B (behind the TAP uplink and a Linux bridge) pings it
#   tcp          A and B ping each other and move --bytes (default 64M) of
#                TCP both ways, sha256-verified, across both uplinks
#   mtu          B with MTU 1500 sends 1472-byte pings towards A: the
#                VXLAN uplink drops them (underlay MTU 1500), counted in
#                tx_oversized; 1422-byte pings pass
#   capture      the underlay (tshark on the vtep veth) decodes as VXLAN
#                VNI 42 with ICMP inside; a daemon capture of port up
#                decodes in tshark -r
#
# Prints PASS/FAIL/SKIPPED per case and ends with "N passed, M failed,
# K skipped" (lib-e2e.sh). Needs root (namespaces, TAP); without it, or
# without the vxlan/bridge/veth link types, every case is SKIPPED with why.
set -uo pipefail

HERE="$(cd "$(dirname "$(readlink -f "$0")")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
ALL_CASES=(vxlan-ping tap-ping tcp mtu capture)

usage() {
    cat <<EOF
Usage: ${0##*/} [options]
  --case NAME     run only this case (repeatable, or a comma list): ${ALL_CASES[*]}
  --no-build      do not run cargo build (use the existing binary)
  --profile P     release (default) or debug binary from \$CARGO_TARGET_DIR/P
  --bytes SIZE    TCP bytes each way in the tcp case (default 64M)
  --logdir DIR    where logs go (default: a new dir under \${TMPDIR:-/tmp})
  --keep-logs     keep the logs of passed cases too
  -h, --help
EOF
}

cases=() build=1 profile=release bytes=64M logdir="" keep_logs=0
while (($#)); do
    case "$1" in
        --case) IFS=, read -r -a _c <<<"$2"; cases+=("${_c[@]}"); shift 2 ;;
        --no-build) build=0; shift ;;
        --profile) profile="$2"; shift 2 ;;
        --bytes) bytes="$2"; shift 2 ;;
        --logdir) logdir="$2"; shift 2 ;;
        --keep-logs) keep_logs=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "e2e-uplink: unknown argument $1" >&2; usage >&2; exit 2 ;;
    esac
done
((${#cases[@]})) || cases=("${ALL_CASES[@]}")
for c in "${cases[@]}"; do
    [[ " ${ALL_CASES[*]} " == *" $c "* ]] || { echo "e2e-uplink: unknown case $c" >&2; exit 2; }
done
CASES=("${cases[@]}")
E2E_NAME=e2e-uplink
# shellcheck source=lib-e2e.sh
source "$HERE/lib-e2e.sh"

want() { [[ " ${cases[*]} " == *" $1 "* ]]; }
skip_all() {
    local c
    for c in "${cases[@]}"; do record SKIP "$c" "$1"; done
    finish
}

to_bytes() {  # 64M -> 67108864
    local n="${1%[KkMmGg]}" u="${1: -1}"
    case "$u" in
        K|k) echo $((n << 10)) ;; M|m) echo $((n << 20)) ;; G|g) echo $((n << 30)) ;; *) echo "$1" ;;
    esac
}

# --- what the host must allow ---------------------------------------------------
[[ $(id -u) -eq 0 ]] || skip_all "needs root (network namespaces, TAP devices)"
for t in ip python3 ping ethtool; do command -v "$t" >/dev/null || skip_all "no $t (scripts/install-deps.sh installs it)"; done
[[ -c /dev/net/tun ]] || skip_all "no /dev/net/tun"

# Names: short (IFNAMSIZ 16), unique per run.
tag=$(($$ % 100000))
nsD="vru-d-$tag" nsV="vru-v-$tag" nsA="vru-a-$tag" nsB="vru-b-$tag"
TAP="vrtap$tag"
cleanup() {
    stop_daemon
    [[ -n ${TSHARK_PID:-} ]] && kill "$TSHARK_PID" 2>/dev/null
    local n
    for n in "$nsD" "$nsV" "$nsA" "$nsB"; do ip netns del "$n" 2>/dev/null; done
}
trap 'cleanup; exit 130' INT TERM
trap 'cleanup' EXIT

if ! ip netns add "$nsD" 2>"$logdir/netns.log"; then
    skip_all "ip netns add not permitted here: $(head -1 "$logdir/netns.log")"
fi
if ! ip -n "$nsD" link add vxprobe type vxlan id 1 dstport 4789 2>"$logdir/probe.log" ||
    ! ip -n "$nsD" link add brprobe type bridge 2>>"$logdir/probe.log"; then
    skip_all "cannot create vxlan/bridge links: $(head -1 "$logdir/probe.log")"
fi
ip -n "$nsD" link del vxprobe; ip -n "$nsD" link del brprobe

if ((build)); then
    say "cargo build ($profile) -p vhost-rdma"
    bflag=()
    [[ $profile == debug ]] || bflag=(--profile "$profile")
    if ! (cd "$ROOT" && nice -n 10 cargo build "${bflag[@]}" -p vhost-rdma) >"$logdir/build.log" 2>&1; then
        tail -30 "$logdir/build.log" >&2
        fail_all "cargo build failed (see $logdir/build.log)"
    fi
fi
DAEMON="${CARGO_TARGET_DIR:-$ROOT/target}/$profile/vhost-rdma"
[[ -x $DAEMON ]] || fail_all "no daemon binary $DAEMON"

# --- the topology -------------------------------------------------------------------
setup() {
    set -e
    local n
    for n in "$nsV" "$nsA" "$nsB"; do ip netns add "$n"; done
    for n in "$nsD" "$nsV" "$nsA" "$nsB"; do ip -n "$n" link set lo up; done
    # Underlay: daemon 10.99.0.1 <-> vtep 10.99.0.2.
    ip link add uD netns "$nsD" type veth peer name uV netns "$nsV"
    ip -n "$nsD" addr add 10.99.0.1/24 dev uD
    ip -n "$nsV" addr add 10.99.0.2/24 dev uV
    ip -n "$nsD" link set uD up
    ip -n "$nsV" link set uV up
    # Linux VTEP: the vxlan netdev bridged to client A's veth. Its MTU is
    # 1450 (1500 - 50), so is A's.
    ip -n "$nsV" link add vx42 type vxlan id 42 dstport 4789 local 10.99.0.2 remote 10.99.0.1 dev uV
    ip -n "$nsV" link add brV type bridge
    ip link add vA netns "$nsV" type veth peer name eth0 netns "$nsA"
    ip -n "$nsV" link set vx42 master brV
    ip -n "$nsV" link set vA master brV
    for n in vx42 vA brV; do ip -n "$nsV" link set "$n" up; done
    ip -n "$nsA" link set eth0 mtu 1450
    # A veth hands TCP/UDP on with the checksum left to "hardware" (partial);
    # across the vxlan netdev and the underlay veth it reaches the daemon's
    # UDP socket still unfinished. A real NIC would finish it: do it here.
    ip netns exec "$nsA" ethtool -K eth0 tx off >/dev/null
    ip -n "$nsA" addr add 10.77.0.1/24 dev eth0
    ip -n "$nsA" link set eth0 up
    # Client B behind a Linux bridge the daemon's TAP joins (below).
    ip -n "$nsD" link add brT type bridge
    ip link add tD netns "$nsD" type veth peer name eth0 netns "$nsB"
    ip -n "$nsD" link set tD master brT
    ip -n "$nsD" link set tD up
    ip -n "$nsD" link set brT up
    ip -n "$nsB" link set eth0 mtu 1450
    ip -n "$nsB" addr add 10.77.0.2/24 dev eth0
    ip -n "$nsB" link set eth0 up
    set +e
}
if ! (setup) >"$logdir/setup.log" 2>&1; then
    cat "$logdir/setup.log" >&2
    fail_all "namespace setup failed (see $logdir/setup.log)"
fi

CTL="$logdir/ctl.sock"
mkdir -p "$logdir/captures"
say "daemon in $nsD: vxlan uplink to 10.99.0.2:4789 VNI 42, TAP $TAP, virtual host 10.77.0.10"
ip netns exec "$nsD" env RUST_LOG="${RUST_LOG:-info}" VHOST_RDMA_LOG="${VHOST_RDMA_LOG:-info}" "$DAEMON" serve \
    --control "$CTL" --capture-dir "$logdir/captures" \
    --port "up,kind=vxlan,local=10.99.0.1:4789,remote=10.99.0.2:4789,vni=42" \
    --port "tap,kind=tap,ifname=$TAP" \
    --host "vh=10.77.0.10/24" >"$logdir/daemon.log" 2>&1 &
DAEMON_PID=$!
ctl() { "$DAEMON" ctl --control "$CTL" "$@"; }
for ((i = 0; i < 100; i++)); do ctl status >/dev/null 2>&1 && break; sleep 0.1; done
if ! ctl status >/dev/null 2>&1; then
    tail -20 "$logdir/daemon.log" >&2
    fail_all "the daemon did not start (see $logdir/daemon.log)"
fi
if ! ip -n "$nsD" link set "$TAP" master brT 2>"$logdir/tap.log"; then
    fail_all "cannot enslave $TAP to brT: $(head -1 "$logdir/tap.log")"
fi
ip -n "$nsD" link set "$TAP" up

in_ns() { local n="$1"; shift; ip netns exec "$n" "$@"; }
# uplink_counter PORT FIELD: a counter of the uplink's own status.
uplink_counter() {
    ctl --json status | python3 -c '
import json, sys
s = json.load(sys.stdin)
u = [u for u in s["uplinks"] if u["port"] == sys.argv[1]][0]
print(u["vxlan"]["counters"][sys.argv[2]])' "$1" "$2"
}
ping_case() {  # ping_case CASE NS TARGET
    local out
    # The first ping resolves ARP across the uplink; allow a few.
    if out="$(in_ns "$2" ping -c 5 -i 0.2 -W 2 "$3" 2>&1)" && grep -q ' 0% packet loss\| [1-4] received' <<<"$out"; then
        record PASS "$1" "$(grep -E 'packets transmitted|rtt' <<<"$out" | tr '\n' ' ')"
    else
        printf '%s\n' "$out" >"$logdir/$1.log"
        record FAIL "$1" "$(grep -E 'packets transmitted' <<<"$out" || echo "ping failed") (see $logdir/$1.log)"
    fi
}

want vxlan-ping && ping_case vxlan-ping "$nsA" 10.77.0.10
want tap-ping && ping_case tap-ping "$nsB" 10.77.0.10

# A TCP stream of N bytes of random data; sender and receiver print sha256.
TCP_PY='
import hashlib, os, socket, sys
role, addr, port, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
h = hashlib.sha256()
if role == "recv":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port)); s.listen(1); s.settimeout(60)
    c, _ = s.accept(); c.settimeout(60); got = 0
    while True:
        b = c.recv(1 << 20)
        if not b: break
        h.update(b); got += len(b)
    print(got, h.hexdigest())
else:
    c = socket.create_connection((addr, port), timeout=60); left = n
    while left:
        b = os.urandom(min(left, 1 << 20)); h.update(b); c.sendall(b); left -= len(b)
    c.shutdown(socket.SHUT_WR); c.recv(1); print(n, h.hexdigest())
'
tcp_one() {  # tcp_one FROM_NS TO_NS TO_IP PORT BYTES -> "ok SECONDS" or "fail WHY"
    local r s t0=$SECONDS
    in_ns "$2" python3 -c "$TCP_PY" recv "$3" "$4" 0 >"$logdir/tcp-recv-$4.txt" 2>&1 &
    local rp=$!
    sleep 0.5
    s="$(in_ns "$1" python3 -c "$TCP_PY" send "$3" "$4" "$5" 2>&1)"
    wait "$rp"
    r="$(cat "$logdir/tcp-recv-$4.txt")"
    if [[ -n $s && $s == "$r" ]]; then echo "ok $((SECONDS - t0))"; else echo "fail sent '$s' received '$r'"; fi
}
if want tcp; then
    n=$(to_bytes "$bytes")
    if ! in_ns "$nsA" ping -c 3 -i 0.2 -W 2 10.77.0.2 >"$logdir/tcp-ping.log" 2>&1; then
        record FAIL tcp "A cannot ping B (see $logdir/tcp-ping.log)"
    else
        ab="$(tcp_one "$nsA" "$nsB" 10.77.0.2 5001 "$n")"
        ba="$(tcp_one "$nsB" "$nsA" 10.77.0.1 5002 "$n")"
        if [[ $ab == ok* && $ba == ok* ]]; then
            record PASS tcp "ping A<->B; $bytes A->B in ${ab#ok }s, $bytes B->A in ${ba#ok }s, sha256 equal (VXLAN <-> TAP through the fabric)"
        else
            record FAIL tcp "A->B: $ab; B->A: $ba"
        fi
    fi
fi

if want mtu; then
    before=$(uplink_counter up tx_oversized)
    in_ns "$nsB" ip link set eth0 mtu 1500
    in_ns "$nsB" ping -c 3 -i 0.2 -W 1 -M do -s 1472 10.77.0.1 >"$logdir/mtu-big.log" 2>&1
    big=$?
    in_ns "$nsB" ping -c 3 -i 0.2 -W 2 -M do -s 1422 10.77.0.1 >"$logdir/mtu-fit.log" 2>&1
    fit=$?
    in_ns "$nsB" ip link set eth0 mtu 1450
    after=$(uplink_counter up tx_oversized)
    if ((big != 0 && fit == 0 && after - before >= 3)); then
        record PASS mtu "1500-byte packets dropped by the VXLAN uplink (tx_oversized +$((after - before))), 1450-byte packets pass"
    else
        record FAIL mtu "big ping exit $big (want failure), fitting ping exit $fit, tx_oversized $before -> $after"
    fi
fi

if want capture; then
    if ! command -v tshark >/dev/null; then
        record SKIP capture "no tshark"
    else
        under="$logdir/underlay.pcapng"
        in_ns "$nsV" tshark -q -i uV -f 'udp port 4789' -w "$under" >"$logdir/tshark-live.log" 2>&1 &
        TSHARK_PID=$!
        for ((i = 0; i < 100; i++)); do grep -q 'Capturing on' "$logdir/tshark-live.log" && break; sleep 0.1; done
        sleep 0.5
        ctl capture start --port up --file "$logdir/captures/up.pcapng" >"$logdir/capture.log" 2>&1
        in_ns "$nsA" ping -c 3 -i 0.2 -W 2 10.77.0.10 >"$logdir/capture-ping.log" 2>&1
        sleep 1
        ctl capture stop >>"$logdir/capture.log" 2>&1
        # TERM: a background job of a script ignores SIGINT.
        kill -TERM "$TSHARK_PID" 2>/dev/null; wait "$TSHARK_PID" 2>/dev/null; TSHARK_PID=""
        vx=$(tshark -r "$under" -Y 'vxlan.vni == 42 && icmp' 2>/dev/null | wc -l)
        inner=$(tshark -r "$logdir/captures/up.pcapng" -Y icmp 2>/dev/null | wc -l)
        tshark -r "$under" -Y vxlan -V 2>/dev/null | grep -m 1 -E 'VXLAN Network Identifier' >"$logdir/capture-decode.txt"
        if ((vx >= 6 && inner >= 6)); then
            record PASS capture "underlay: $vx VXLAN VNI 42 ICMP packets decoded; daemon capture of port up: $inner ICMP frames (tshark -V: $(tr '\n' ' ' <"$logdir/capture-decode.txt" | sed 's/  */ /g'))"
        else
            record FAIL capture "underlay VXLAN+ICMP packets $vx, daemon capture ICMP frames $inner (want >= 6 each; see $logdir)"
        fi
    fi
fi

ctl status >"$logdir/ctl-status.txt" 2>&1
sed 's/^/    /' "$logdir/ctl-status.txt" >&2
if grep -q panicked "$logdir/daemon.log"; then
    record FAIL daemon "the daemon panicked (see $logdir/daemon.log)"
fi
finish

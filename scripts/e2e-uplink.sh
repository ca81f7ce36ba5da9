#!/usr/bin/env bash
# End-to-end test of the uplink ports (docs/uplinks.md) on the host:
# network namespaces stand in for the lab network. The daemon runs in its
# own namespace with a virtual host vh (10.77.0.10), a vhost-user port g for
# one Linux 7.3 guest (10.77.0.3, MTU 1450) and two uplinks:
#   up  kind=vxlan, VNI 42, to a Linux vxlan netdev (id 42 dstport 4789) in
#       namespace "vtep", bridged there to a veth whose far end is client A
#       (10.77.0.1/24, its own namespace);
#   tap kind=tap, a TAP device the daemon creates, enslaved to a Linux
#       bridge in the daemon's namespace with a veth to client B
#       (10.77.0.2/24, its own namespace).
# A is reachable only through the VXLAN uplink, B only through the TAP one.
#
# Cases (all by default; --case NAME, repeatable or a comma list):
#   vxlan-ping   A (behind Linux VXLAN) pings the virtual host
#   tap-ping     B (behind the TAP uplink and a Linux bridge) pings it
#   tcp          A and B ping each other and move --bytes (default 64M) of
#                TCP both ways, sha256-verified, across both uplinks
#   mtu          A and B (and the Linux vxlan netdev) at MTU 1500 exchange
#                1472-byte pings with DF (-M do): full-size frames cross
#                the default (df=unset) VXLAN uplink, each outer packet
#                fragmented on the 1500-byte underlay veth, the daemon's
#                by its kernel and Linux vxlan's by its own, and each
#                reassembled by the other (IP counters of both namespaces;
#                the uplink's tx_over_mtu), nothing counted oversized
#   capture      the underlay (tshark on the vtep veth) decodes as VXLAN
#                VNI 42 with ICMP inside; a daemon capture of port up
#                decodes in tshark -r
# and, after those, one guest boot (scripts/run-guests, QEMU on port g's
# vhost-user socket; not with --no-guest) for:
#   guest-vxlan-ping  the guest pings A and A pings the guest (Linux vxlan
#                netdev + bridge <-> the daemon's VXLAN uplink <-> guest)
#   guest-vxlan-tcp   --guest-bytes (default 64M) of TCP guest -> A (the
#                guest connects) and A -> guest (A connects), every byte
#                verified at both ends (smc-guest-tests stream, the same
#                binary in the guest and in A's namespace)
#   guest-tap-ping    the same ping both ways between the guest and B
#                (Linux bridge + veth <-> the daemon's TAP uplink)
#   guest-tap-tcp     the same verified TCP both ways between the guest and B
#
# Prints PASS/FAIL/SKIPPED per case and ends with "N passed, M failed,
# K skipped" (lib-e2e.sh). Needs root (namespaces, TAP); without it, or
# without the vxlan/bridge/veth link types, every case is SKIPPED with why.
set -uo pipefail

HERE="$(cd "$(dirname "$(readlink -f "$0")")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
HOST_CASES=(vxlan-ping tap-ping tcp mtu capture)
GUEST_CASES=(guest-vxlan-ping guest-vxlan-tcp guest-tap-ping guest-tap-tcp)
ALL_CASES=("${HOST_CASES[@]}" "${GUEST_CASES[@]}")

usage() {
    cat <<EOF
Usage: ${0##*/} [options]
  --case NAME     run only this case (repeatable, or a comma list): ${ALL_CASES[*]}
$(e2e_opts_usage)
  --bytes SIZE    TCP bytes each way in the tcp case (default 64M)
  --no-guest      only the host cases (${HOST_CASES[*]}): no guest boot
  --guest-bytes SIZE  TCP bytes each way and path in the guest-*-tcp cases (default 64M)
  -h, --help
EOF
}

cases=() build=1 profile=release bytes=64M logdir="" keep_logs=0
guest=1 gbytes=64M image="" qemu="" accel=auto timeout=1500
# shellcheck source=lib-e2e.sh
source "$HERE/lib-e2e.sh"
while (($#)); do
    case "$1" in
        --case) IFS=, read -r -a _c <<<"$2"; cases+=("${_c[@]}"); shift 2 ;;
        --bytes) bytes="$2"; shift 2 ;;
        --no-guest) guest=0; shift ;;
        --guest-bytes) gbytes="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) e2e_opt "$@" || { echo "e2e-uplink: unknown argument $1" >&2; usage >&2; exit 2; }; shift "$E2E_SHIFT" ;;
    esac
done
if ((guest)); then
    ((${#cases[@]})) || cases=("${ALL_CASES[@]}")
else
    ((${#cases[@]})) || cases=("${HOST_CASES[@]}")
fi
for c in "${cases[@]}"; do
    [[ " ${ALL_CASES[*]} " == *" $c "* ]] || { echo "e2e-uplink: unknown case $c" >&2; exit 2; }
    if ((guest == 0)) && [[ " ${GUEST_CASES[*]} " == *" $c "* ]]; then
        echo "e2e-uplink: case $c needs a guest (drop --no-guest)" >&2; exit 2
    fi
done
CASES=("${cases[@]}")
E2E_NAME=e2e-uplink
e2e_begin

want() { [[ " ${cases[*]} " == *" $1 "* ]]; }
want_guest() {  # any guest case, or those of one path (vxlan, tap)
    local c
    for c in "${cases[@]}"; do [[ $c == guest-${1:-}* ]] && return 0; done
    return 1
}
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
# Guest phase processes: run-guests and the namespaces' stream servers.
RG_PID="" SRV_PIDS=()
cleanup() {
    local p
    # run-guests stops its QEMU on TERM.
    [[ -n $RG_PID ]] && { kill -TERM "$RG_PID" 2>/dev/null; wait "$RG_PID" 2>/dev/null; }
    for p in "${SRV_PIDS[@]}"; do kill "$p" 2>/dev/null; done
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

# The guest cases also need smc-guest-tests (in the guest and in the
# namespaces), a guest image and QEMU.
pkgs=(-p vhost-rdma)
want_guest && pkgs+=(-p smc-guest-tests)
if ((build)); then
    say "cargo build ($profile) ${pkgs[*]}"
    bflag=()
    [[ $profile == debug ]] || bflag=(--profile "$profile")
    if ! (cd "$ROOT" && nice -n 10 cargo build "${bflag[@]}" "${pkgs[@]}") >"$logdir/build.log" 2>&1; then
        tail -30 "$logdir/build.log" >&2
        fail_all "cargo build failed (see $logdir/build.log)"
    fi
fi
DAEMON="${CARGO_TARGET_DIR:-$ROOT/target}/$profile/vhost-rdma"
SGT="${CARGO_TARGET_DIR:-$ROOT/target}/$profile/smc-guest-tests"
[[ -x $DAEMON ]] || fail_all "no daemon binary $DAEMON"
# Why the guest cases cannot run (they FAIL with it); empty: they can.
guest_broken=""
if want_guest; then
    [[ -x $SGT ]] || guest_broken="no $SGT"
    image_from="--image"
    if [[ -z $guest_broken && -z $image ]]; then
        image_from="build-guest-image.sh"
        say "guest image: scripts/build-guest-image.sh --kernel 7.3"
        image="$("$HERE/build-guest-image.sh" --kernel 7.3 2>"$logdir/image.log" | tail -n 1)" || image=""
    fi
    if [[ -z $guest_broken && ! ( -n $image && -f $image/bzImage && -f $image/rootfs.ext4 ) ]]; then
        guest_broken="no guest image (no bzImage and rootfs.ext4 in '${image}' from $image_from; see $logdir/image.log)"
    fi
    if [[ -z $guest_broken && -z $qemu ]]; then
        say "QEMU: scripts/setup-qemu.sh"
        qemu="$("$HERE/setup-qemu.sh" 2>"$logdir/qemu.log" | tail -n 1)" || qemu=""
    fi
    if [[ -z $guest_broken && ! ( -n $qemu && -x $qemu ) ]]; then
        guest_broken="no QEMU (see $logdir/qemu.log)"
    fi
    [[ -z $guest_broken ]] && say "guest image: $image, qemu: $qemu"
fi

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
    # 1450 (1500 - 50), so is A's. No `dev uV`: bound to a device, Linux
    # caps the netdev's MTU at the device's less 50, and the mtu case
    # raises it to 1500 (df unset: Linux fragments the outer packets).
    ip -n "$nsV" link add vx42 type vxlan id 42 dstport 4789 local 10.99.0.2 remote 10.99.0.1
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
# The guest's port: a vhost-user socket (a file: QEMU in the host's
# namespace reaches the daemon in its own).
GIP=10.77.0.3 GMAC=52:54:00:77:00:03 GSOCK="$logdir/g.sock"
gport=()
want_guest && [[ -z $guest_broken ]] && gport=(--port "g=$GSOCK,mac=$GMAC")
say "daemon in $nsD: vxlan uplink to 10.99.0.2:4789 VNI 42, TAP $TAP, virtual host 10.77.0.10${gport:+, guest port g}"
ip netns exec "$nsD" env RUST_LOG="${RUST_LOG:-info}" VHOST_RDMA_LOG="${VHOST_RDMA_LOG:-info}" "$DAEMON" serve \
    --control "$CTL" --capture-dir "$logdir/captures" "${gport[@]}" \
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

# ip_counter NS NAME: an IPv4 counter (/proc/net/snmp "Ip:") of a namespace
ip_counter() {
    in_ns "$1" awk -v k="$2" '/^Ip:/ { if (!h) { for (i = 2; i <= NF; i++) if ($i == k) c = i; h = 1 } else print $c }' /proc/net/snmp
}
if want mtu; then
    over0=$(uplink_counter up tx_over_mtu) big0=$(uplink_counter up tx_oversized)
    declare -A f0
    for k in FragOKs ReasmOKs; do f0[D$k]=$(ip_counter "$nsD" $k); f0[V$k]=$(ip_counter "$nsV" $k); done
    in_ns "$nsB" ip link set eth0 mtu 1500
    in_ns "$nsA" ip link set eth0 mtu 1500
    ip -n "$nsV" link set vx42 mtu 1500
    in_ns "$nsB" ping -c 3 -i 0.2 -W 2 -M do -s 1472 10.77.0.1 >"$logdir/mtu-big.log" 2>&1
    big=$?
    in_ns "$nsB" ip link set eth0 mtu 1450
    in_ns "$nsA" ip link set eth0 mtu 1450
    ip -n "$nsV" link set vx42 mtu 1450
    over=$(($(uplink_counter up tx_over_mtu) - over0)) oversized=$(($(uplink_counter up tx_oversized) - big0))
    frag=""
    for k in FragOKs ReasmOKs; do
        frag+=" daemon $k +$(($(ip_counter "$nsD" $k) - f0[D$k])), vtep $k +$(($(ip_counter "$nsV" $k) - f0[V$k]));"
    done
    dfrag=$(($(ip_counter "$nsD" FragOKs) - f0[DFragOKs])) vreasm=$(($(ip_counter "$nsV" ReasmOKs) - f0[VReasmOKs]))
    dreasm=$(($(ip_counter "$nsD" ReasmOKs) - f0[DReasmOKs])) vfrag=$(($(ip_counter "$nsV" FragOKs) - f0[VFragOKs]))
    sum="$(grep -E 'transmitted' "$logdir/mtu-big.log")"
    if ((big == 0 && over >= 3 && oversized == 0 && dfrag >= 3 && vreasm >= 3 && vfrag >= 3 && dreasm >= 3)); then
        record PASS mtu "1500-byte pings with DF both ways through the VXLAN uplink (df=unset) and Linux vxlan: $sum; tx_over_mtu +$over, tx_oversized +0;$frag"
    else
        record FAIL mtu "ping exit $big ($sum), tx_over_mtu +$over, tx_oversized +$oversized;$frag (see $logdir/mtu-big.log)"
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

# --- the guest cases ------------------------------------------------------------------
# One guest on port g (10.77.0.3, MTU 1450: the VXLAN path leaves 50 bytes
# of the 1500-byte underlay to the tunnel; the TAP path keeps the same MTU).
# Per path (vxlan: peer A, tap: peer B) the guest job and the host take
# turns:
#   guest: waits until the peer answers, pings it (CASE PATH-ping-out), then
#          sends --guest-bytes to the peer's stream server, started in the
#          namespace before the boot (CASE PATH-tcp-out), prints
#          "PHASE PATH-in" and serves one stream, receiving (CASE PATH-tcp-in);
#   host:  on "PHASE PATH-in", pings the guest from the peer's namespace and
#          sends --guest-bytes from it to the guest's server, then creates
#          PATH-in.done in the guest's job dir (9p), which ends the guest's
#          turn.
# Every stream carries smc-guest-tests' seeded pattern: the receiver checks
# each byte, the sender checks the receiver's acknowledgement.
guest_phase() {
    local gd="$logdir/guest" n t0=$SECONDS last=$SECONDS
    local do_vxlan=0 do_tap=0 tcp_vxlan=0 tcp_tap=0
    want_guest vxlan && do_vxlan=1
    want_guest tap && do_tap=1
    want guest-vxlan-tcp && tcp_vxlan=1
    want guest-tap-tcp && tcp_tap=1
    n=$(to_bytes "$gbytes")
    mkdir -p "$gd/vrbin/bin" "$gd/run"
    cp -f "$SGT" "$gd/vrbin/bin/smc-guest-tests"
    local job="$gd/run/g.job"
    cat >"$gd/g.sh" <<EOF
echo "== \$VR_NAME: kernel \$(uname -r)"
case_() { echo "CASE \$1 rc=\$2 \$3"; }
ip link set eth0 mtu 1450
i=0; while [ "\$(cat /sys/class/net/eth0/carrier 2>/dev/null)" != 1 ]; do i=\$((i + 1)); [ \$i -ge 30 ] && { echo 'E2E-FAIL no carrier'; exit 10; }; sleep 1; done
ip -br addr show eth0
stream() {  # stream ROLE ADDR PORT: the pattern stream, tcp, one connection
    if [ \$1 = server ]; then
        smc-guest-tests stream server --proto tcp --addr \$2 --port \$3 --bytes $n --seed 17 --once --accept-timeout 600 --io-timeout 300
    else
        smc-guest-tests stream client --proto tcp --addr \$2 --port \$3 --bytes $n --seed 17 --connect-timeout 300 --io-timeout 300
    fi
}
path() {  # path NAME PEER_IP OUT_PORT IN_PORT TCP
    name=\$1 peer=\$2
    echo "== path \$name: peer \$peer"
    i=0; until ping -c 1 -W 2 \$peer >/dev/null 2>&1; do i=\$((i + 1)); [ \$i -ge 90 ] && break; sleep 1; done
    ping -c 5 -i 0.5 -W 5 \$peer >/tmp/\$name-ping.log 2>&1; rc=\$?; cat /tmp/\$name-ping.log
    case_ \$name-ping-out \$rc "\$(grep -E 'transmitted|rtt' /tmp/\$name-ping.log | tr '\n' ' ')"
    if [ \$5 = 1 ]; then
        stream client \$peer \$3 >/tmp/\$name-out.log 2>&1; rc=\$?; cat /tmp/\$name-out.log
        case_ \$name-tcp-out \$rc "\$(grep STREAM-RESULT /tmp/\$name-out.log | tail -n 1)"
    fi
    echo "PHASE \$name-in"
    if [ \$5 = 1 ]; then
        stream server $GIP \$4 >/tmp/\$name-in.log 2>&1; rc=\$?; cat /tmp/\$name-in.log
        case_ \$name-tcp-in \$rc "\$(grep STREAM-RESULT /tmp/\$name-in.log | tail -n 1)"
    fi
    i=0; while [ ! -e /job/\$name-in.done ]; do i=\$((i + 1)); [ \$i -ge 900 ] && { echo "no \$name-in.done from the host"; break; }; sleep 1; done
    ip neigh show \$peer
}
[ $do_vxlan = 1 ] && path vxlan 10.77.0.1 5311 5321 $tcp_vxlan
[ $do_tap = 1 ] && path tap 10.77.0.2 5312 5322 $tcp_tap
ip -s link show eth0
exit 0
EOF
    # The namespaces' servers for the guest -> peer streams.
    local t name ns ip port tcp i
    for t in "vxlan $nsA 10.77.0.1 5311 $tcp_vxlan" "tap $nsB 10.77.0.2 5312 $tcp_tap"; do
        read -r name ns ip port tcp <<<"$t"
        ((tcp)) || continue
        in_ns "$ns" "$SGT" stream server --proto tcp --addr "$ip" --port "$port" --bytes "$n" --seed 17 \
            --once --accept-timeout "$timeout" --io-timeout 300 >"$gd/$name-out-host.log" 2>&1 &
        SRV_PIDS+=($!)
    done
    say "booting the guest ($GIP on port g; $gbytes each way and path; logs in $gd)"
    "$ROOT/scripts/run-guests" --qemu "$qemu" --image "$image" --accel "$accel" --timeout "$timeout" \
        --guest-bin "$gd/vrbin" --net vhost-user --logdir "$gd/run" \
        --guest "g,ip=$GIP/24,sock=$GSOCK,mac=$GMAC,cmd=$gd/g.sh" >"$gd/run-guests.log" 2>&1 &
    RG_PID=$!
    local out="$job/out.log" done_vxlan=0 done_tap=0
    while kill -0 "$RG_PID" 2>/dev/null; do
        sleep 1
        for t in "vxlan $nsA $tcp_vxlan 5321" "tap $nsB $tcp_tap 5322"; do
            read -r name ns tcp port <<<"$t"
            local dv="done_$name"
            ((${!dv})) && continue
            grep -q "^PHASE $name-in" "$out" 2>/dev/null || continue
            printf -v "$dv" 1
            say "guest phase $name-in ($((SECONDS - t0)) s): the peer pings the guest$( ((tcp)) && echo " and streams to it")"
            for ((i = 0; i < 30; i++)); do in_ns "$ns" ping -c 1 -W 2 "$GIP" >/dev/null 2>&1 && break; sleep 1; done
            in_ns "$ns" ping -c 5 -i 0.5 -W 5 "$GIP" >"$gd/$name-ping-in.log" 2>&1
            echo $? >"$gd/$name-ping-in.rc"
            if ((tcp)); then
                in_ns "$ns" "$SGT" stream client --proto tcp --addr "$GIP" --port "$port" --bytes "$n" --seed 17 \
                    --connect-timeout 300 --io-timeout 300 >"$gd/$name-in-host.log" 2>&1
            fi
            touch "$job/$name-in.done"
        done
        if ((SECONDS - last >= 30)); then
            last=$SECONDS
            say "guest running ($((SECONDS - t0)) s): $(grep -c '^CASE' "$out" 2>/dev/null) guest results so far"
        fi
    done
    wait "$RG_PID"
    rg=$?
    RG_PID=""
    gwall=$((SECONDS - t0))
    say "guest finished (run-guests exit $rg, ${gwall}s)"
    # A server whose client never came: stop it (its log says so).
    local p
    for p in "${SRV_PIDS[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
    SRV_PIDS=()
    [[ -f $out ]] || out=/dev/null
    gout=$out
}
# guest_line NAME: the guest's last "CASE NAME rc=..." line, without "CASE ".
guest_line() { grep -E "^CASE $1 rc=" "$gout" | tail -n 1 | cut -d' ' -f2-; }
# stream_ok FILE: FILE's last STREAM-RESULT line reports every byte verified.
stream_ok() {
    local l
    l="$(grep STREAM-RESULT "$1" 2>/dev/null | tail -n 1)"
    [[ $l == *" verified=1 "* && $l == *" status=pass "* ]]
}
# stream_rate LINE: "SECONDS s, MIBPS MiB/s" of a STREAM-RESULT line.
stream_rate() {
    local secs mib
    secs="$(grep -o ' secs=[^ ]*' <<<"$1" | cut -d= -f2)"
    mib="$(grep -o ' mibps=[^ ]*' <<<"$1" | cut -d= -f2)"
    printf '%.1f s, %s MiB/s' "${secs:-0}" "${mib:-?}"
}
# port_bytes PORT: "TX_BYTES RX_BYTES" of a fabric port (tx: into the
# fabric, from the wire for an uplink; rx: out of it, to the wire).
port_bytes() {
    ctl --json status 2>/dev/null | python3 -c '
import json, sys
p = [p for p in json.load(sys.stdin)["ports"] if p["name"] == sys.argv[1]][0]
print(p["tx_bytes"], p["rx_bytes"])' "$1" 2>/dev/null || echo "0 0"
}
guest_cases() {
    local name peer pl line_out line_in gl hl why port b0 b1 dtx drx n
    n=$(to_bytes "$gbytes")
    for name in vxlan tap; do
        if [[ $name == vxlan ]]; then peer=A port=up b0=$up0 b1=$up1; else peer=B port=tap b0=$tap0 b1=$tap1; fi
        # What crossed this path's uplink during the guest's run.
        dtx=$(( ${b1% *} - ${b0% *} )) drx=$(( ${b1#* } - ${b0#* } ))
        if want "guest-$name-ping"; then
            gl="$(guest_line "$name-ping-out")"
            hl="$(grep -E 'transmitted' "$gd_/$name-ping-in.log" 2>/dev/null)"
            if [[ $gl == *" rc=0 "* && $(cat "$gd_/$name-ping-in.rc" 2>/dev/null) == 0 ]]; then
                pl='[0-9]+ packets transmitted, [0-9]+ (packets )?received'
                record PASS "guest-$name-ping" "guest -> $peer: $(grep -oE "$pl" <<<"$gl"); $peer -> guest: $(grep -oE "$pl" <<<"$hl") (rtt min/avg $(grep -oE '= [0-9.]+/[0-9.]+' "$gd_/$name-ping-in.log" | cut -c3-) ms); through uplink $port"
            else
                record FAIL "guest-$name-ping" "guest -> $peer: ${gl:-no result} ; $peer -> guest: ${hl:-no result} (run-guests exit $rg; $gd_)"
            fi
        fi
        if want "guest-$name-tcp"; then
            line_out="$(guest_line "$name-tcp-out")"
            line_in="$(guest_line "$name-tcp-in")"
            why=""
            [[ $line_out == *" rc=0 "* && $line_out == *" verified=1 "* && $line_out == *" status=pass "* ]] ||
                why+="guest -> $peer: guest sender says '${line_out:-nothing}'; "
            stream_ok "$gd_/$name-out-host.log" ||
                why+="guest -> $peer: $peer's receiver says '$(grep STREAM-RESULT "$gd_/$name-out-host.log" 2>/dev/null | tail -n 1)'; "
            [[ $line_in == *" rc=0 "* && $line_in == *" verified=1 "* && $line_in == *" status=pass "* ]] ||
                why+="$peer -> guest: guest receiver says '${line_in:-nothing}'; "
            stream_ok "$gd_/$name-in-host.log" ||
                why+="$peer -> guest: $peer's sender says '$(grep STREAM-RESULT "$gd_/$name-in-host.log" 2>/dev/null | tail -n 1)'; "
            # Both streams must have crossed this path's uplink, not another.
            ((dtx >= n && drx >= n)) ||
                why+="uplink $port moved only $dtx bytes from the wire and $drx to it during the guest's run (want >= $n each); "
            if [[ -z $why ]]; then
                record PASS "guest-$name-tcp" "$gbytes guest -> $peer in $(stream_rate "$line_out"), $gbytes $peer -> guest in $(stream_rate "$line_in"); every byte verified by the receiver, acknowledged to the sender; uplink $port: $((dtx >> 20)) MiB from the wire, $((drx >> 20)) MiB to it"
            else
                record FAIL "guest-$name-tcp" "${why%; } (run-guests exit $rg; $gd_)"
            fi
        fi
    done
}
if want_guest; then
    gd_="$logdir/guest" rg="" gout=/dev/null
    if [[ -n $guest_broken ]]; then
        for c in "${GUEST_CASES[@]}"; do want "$c" && record FAIL "$c" "$guest_broken"; done
    else
        up0=$(port_bytes up) tap0=$(port_bytes tap)
        guest_phase
        up1=$(port_bytes up) tap1=$(port_bytes tap)
        guest_cases
        # What crossed the uplinks during the guest's run (frames, ctl status).
        ctl status >"$gd_/ctl-status.txt" 2>&1
        if ((failed)); then
            say "guest console: $gd_/run/g.console.log, job output: $gout"
            tail -n 25 "$gd_/run-guests.log" >&2
        fi
    fi
fi

ctl status >"$logdir/ctl-status.txt" 2>&1
sed 's/^/    /' "$logdir/ctl-status.txt" >&2
if grep -q panicked "$logdir/daemon.log"; then
    record FAIL daemon "the daemon panicked (see $logdir/daemon.log)"
fi
finish

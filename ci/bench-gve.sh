#!/usr/bin/env bash
# Benchmark, one run: TCP receive in a Linux 7.3 guest through the emulated
# gVNIC (kind=gve, vfio-user) versus through virtio-net (vhost-user), between
# the same two guests (same image, kernel, vCPUs, sender), and on gve devmem
# receive (into a udmabuf) versus ordinary receive.
#
#   ci/bench-gve.sh [--bytes 128M] [--no-build] [--logdir DIR]
#
# Every receive is validated byte by byte, each by a receiver of the same
# kind: smc-guest-tests `stream server` (ordinary TCP) and `devmem-recv`
# (devmem TCP: frags validated straight from the udmabuf, tokens returned
# in batches). All rates are the receiver's own, accept to last byte.
# A control row runs devmem's receiver and sender on a flow that RSS puts
# on an ordinary queue: devmem against ordinary with nothing else changed
# (stream client/server compute and checksum a keyed pattern, which costs
# the 1-vCPU sender guest more than devmem-send's periodic pattern).
# Prints a table and ends with
#   bench-gve bytes=N gve_mibps=X virtio_mibps=Y devmem_mibps=Z gve_ordinary_mibps=W
# Guests run under TCG here: the guests' CPU is the limit, not the daemon.
# (ncdevmem, which logs every frag, is not measured here: scripts/e2e-gve.sh
# runs it as the upstream tool's check.)
set -uo pipefail
ROOT="$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)"
CASES=(gve virtio devmem)
bytes=128M build=1 profile=release image="" qemu="" accel=auto timeout=900 logdir="" keep_logs=1
# shellcheck source=scripts/lib-e2e.sh
. "$ROOT/scripts/lib-e2e.sh"
# the release build shared with scripts/test.sh's guest tiers
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-${VHOST_RDMA_CACHE:-$HOME/.cache/vhost-rdma}/target}"
while (($#)); do
    case "$1" in
        --bytes) bytes="$2"; shift 2 ;;
        -h|--help) sed -n '2,21p' "$0"; e2e_opts_usage; exit 0 ;;
        *) e2e_opt "$@" || { echo "bench-gve: unknown argument $1" >&2; exit 2; }; shift "$E2E_SHIFT" ;;
    esac
done
E2E_NAME=bench-gve
HERE="$ROOT/scripts"  # lib-e2e.sh finds build-guest-image.sh / setup-qemu.sh there
e2e_begin
e2e_prepare smc-guest-tests
vrbin="$logdir/vrbin"
mkdir -p "$vrbin/bin"
cp -f "$SGT" "$vrbin/bin/"
A=10.77.0.1 B=10.77.0.2 MACA=52:54:00:77:00:01 MACB=52:54:00:77:00:02

# run KIND: guest A on KIND (gve or virtio), B on virtio-net; B sends to A.
run() {
    local kind=$1 d="$logdir/$1" porta
    mkdir -p "$d"
    cat >"$d/a.sh" <<EOF
i=0; until ping -c 1 -W 2 $B >/dev/null 2>&1; do i=\$((i+1)); [ \$i -ge 120 ] && break; sleep 1; done
smc-guest-tests stream server --proto tcp --addr $A --port 5301 --bytes $bytes --seed 81 --once --accept-timeout 300
if [ $kind = gve ]; then
    # devmem NIC setup, what ncdevmem -l does before it binds (devmem.rst,
    # "NIC Setup"): header split on, RSS only onto queue 0, the flow (5-tuple:
    # the sender binds port 5302 too) onto queue 1, which gets the dmabuf
    ethtool -G eth0 tcp-data-split on &&
        ethtool -K eth0 ntuple on &&
        ethtool -X eth0 equal 1 &&
        ethtool -N eth0 flow-type tcp4 src-ip $B dst-ip $A src-port 5302 dst-port 5302 action 1 ||
        echo "DEVMEM-SETUP failed"
    sleep 1
    smc-guest-tests devmem-recv --dev eth0 --queue 1 --listen $A:5302 --bytes $bytes --pattern-mod 7 --accept-timeout 300
    echo "DEVMEM rc=\$?"
    # control: the same receiver, sender and bytes, but no rule for port
    # 5303: RSS puts the flow on queue 0, so it arrives as ordinary TCP
    smc-guest-tests devmem-recv --dev eth0 --queue 1 --listen $A:5303 --bytes $bytes --pattern-mod 7 --accept-timeout 300 --allow-ordinary
    echo "DEVMEM-CONTROL rc=\$?"
fi
EOF
    cat >"$d/b.sh" <<EOF
i=0; until ping -c 1 -W 2 $A >/dev/null 2>&1; do i=\$((i+1)); [ \$i -ge 120 ] && break; sleep 1; done
smc-guest-tests stream client --proto tcp --addr $A --port 5301 --bytes $bytes --seed 81 --connect-timeout 300
if [ $kind = gve ]; then
    smc-guest-tests devmem-send --to $A:5302 --bind $B:5302 --bytes $bytes --pattern-mod 7 --connect-timeout 300
    smc-guest-tests devmem-send --to $A:5303 --bind $B:5303 --bytes $bytes --pattern-mod 7 --connect-timeout 300
fi
exit 0
EOF
    if [[ $kind == gve ]]; then porta="g=$d/a.sock,kind=gve,queues=2,mac=$MACA"; else porta="a=$d/a.sock,queues=2,mac=$MACA"; fi
    daemon_up "$d/a.sock" "$d/v.sock" -- --port "$porta" --port "v=$d/v.sock,mac=$MACB" --control "$d/ctl.sock" ||
        fail_all "the daemon did not start ($d/daemon.log)"
    RG_A=(--smp 2 --net vhost-user --queues 2 --guest "a,ip=$A/24,sock=$d/a.sock,mac=$MACA,cmd=$d/a.sh")
    if [[ $kind == gve ]]; then
        RG_A=(--smp 2 --net none --qemu-arg=-device
            --qemu-arg="{\"driver\":\"vfio-user-pci\",\"socket\":{\"type\":\"unix\",\"path\":\"$d/a.sock\"}}"
            --guest "a,ip=$A/24,cmd=$d/a.sh")
    fi
    RG_B=(--net vhost-user --guest "b,ip=$B/24,sock=$d/v.sock,mac=$MACB,cmd=$d/b.sh")
    e2e_run_pair
    stop_daemon
}

field() { sed -n "s/.* $1=\([0-9.]*\).*/\1/p" <<<"$2"; }
say "gve run (logs $logdir/gve)"
run gve
say "virtio-net run (logs $logdir/virtio)"
run virtio

sg="$(grep -h '^STREAM-RESULT' "$logdir/gve/ga/a.job/out.log" 2>/dev/null | tail -n 1)"
sv="$(grep -h '^STREAM-RESULT' "$logdir/virtio/ga/a.job/out.log" 2>/dev/null | tail -n 1)"
dm="$(grep -h "^DEVMEM-RESULT listen=$A:5302 " "$logdir/gve/ga/a.job/out.log" 2>/dev/null | tail -n 1)"
dc="$(grep -h "^DEVMEM-RESULT listen=$A:5303 " "$logdir/gve/ga/a.job/out.log" 2>/dev/null | tail -n 1)"
control_mibps="$(field mibps "$dc")" control_cpu="$(field cpu_s_per_gib "$dc")"
gve_mibps="$(field mibps "$sg")" virtio_mibps="$(field mibps "$sv")" devmem_mibps="$(field mibps "$dm")"
gve_cpu="$(field cpu_s_per_gib "$sg")" virtio_cpu="$(field cpu_s_per_gib "$sv")" devmem_cpu="$(field cpu_s_per_gib "$dm")"
ok=1
# the devmem row all in the dmabuf, the control row none of it
[[ $sg == *verified=1* && $sv == *verified=1* && $dm == *verified=1* && $dm == *" ordinary_bytes=0 "* ]] || ok=0
[[ $dc == *verified=1* && $dc == *" frags=0 "* ]] || ok=0
echo
{
    echo "| receive path (guest A, 2 vCPUs, TCG) | MiB/s | receiver CPU s/GiB | validated |"
    echo "|---|---:|---:|---|"
    echo "| virtio-net (vhost-user), ordinary TCP | ${virtio_mibps:-?} | ${virtio_cpu:-?} | $([[ $sv == *verified=1* ]] && echo yes || echo NO) |"
    echo "| gve (vfio-user), ordinary TCP | ${gve_mibps:-?} | ${gve_cpu:-?} | $([[ $sg == *verified=1* ]] && echo yes || echo NO) |"
    echo "| gve, devmem TCP (devmem-recv, udmabuf) | ${devmem_mibps:-?} | ${devmem_cpu:-?} | $([[ $dm == *verified=1* ]] && echo yes || echo NO) |"
    echo "| gve, ordinary TCP, devmem's receiver and sender (control) | ${control_mibps:-?} | ${control_cpu:-?} | $([[ $dc == *verified=1* ]] && echo yes || echo NO) |"
} | tee "$logdir/bench.md"
# an SVG chart next to the table; a failed plot never fails the benchmark
"$ROOT/scripts/guest-results" plot "$logdir/bench.md" "$logdir/bench.svg" --title "TCP receive: gve vs virtio-net" >&2 || true
echo
echo "bench-gve bytes=$bytes gve_mibps=${gve_mibps:-0} virtio_mibps=${virtio_mibps:-0} devmem_mibps=${devmem_mibps:-0} gve_ordinary_mibps=${gve_mibps:-0}"
((ok)) || { say "a transfer was not validated (logs kept in $logdir)"; exit 1; }

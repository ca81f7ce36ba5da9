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
# in batches; `--ordinary`: the same receiver on plain TCP, no dmabuf).
# All rates are the receiver's own, accept to last byte.
# The first two rows are the NIC comparison: `devmem-send` into
# `devmem-recv --ordinary` on each NIC, before any devmem setup (the
# stream rows' `stream client` computes a keyed pattern and is bound by the
# 1-vCPU sender guest, not by the receive path). A control row runs devmem's
# receiver and sender on a flow that RSS puts on an ordinary queue after
# the devmem setup: devmem against ordinary with nothing else changed.
#   --virtio-first   boot the virtio-net pair before the gve pair (default:
#                    gve first; alternate over runs)
# Prints a table, a second one on the cheap rows' guests (bench-guests.md:
# each guest's busy vCPU seconds per GiB from /proc/stat around the
# transfer, its share of the guest's vCPUs at the row's rate, the
# receiver's interrupts per MiB, the sender's TCP retransmits: which side
# bounds the row), and ends with
#   bench-gve bytes=N gve_mibps=X virtio_mibps=Y devmem_mibps=Z gve_ordinary_mibps=W
#     (one line) gve_cheap_mibps=C virtio_cheap_mibps=D
# Guests run under TCG here: the guests' CPU is the limit, not the daemon.
# (ncdevmem, which logs every frag, is not measured here: the matrix's gve
# cell runs it as the upstream tool's check.)
set -uo pipefail
ROOT="$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)"
CASES=(gve virtio devmem)
bytes=128M virtio_first=0 build=1 profile=release image="" qemu="" accel=auto timeout=900 logdir="" keep_logs=1
# shellcheck source=scripts/lib-e2e.sh
. "$ROOT/scripts/lib-e2e.sh"
# the release build shared with scripts/test.sh's guest tiers
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-${VHOST_RDMA_CACHE:-$HOME/.cache/vhost-rdma}/target}"
while (($#)); do
    case "$1" in
        --bytes) bytes="$2"; shift 2 ;;
        --virtio-first) virtio_first=1; shift ;;
        -h|--help) sed -n '2,31p' "$0"; e2e_opts_usage; exit 0 ;;
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
# gcpu, in the guests: busy jiffies (USER_HZ, 100 on x86: user nice system
# irq softirq steal, all vCPUs), interrupts and TCP segments retransmitted
# so far, one line; the cheap rows take the difference around their transfer
GCPU_FN='gcpu() { awk '"'"'/^cpu /{b=$2+$3+$4+$7+$8+$9} /^intr /{i=$2} /^Tcp:/{if(!c){for(k=1;k<=NF;k++)if($k=="RetransSegs")c=k}else r=$c} END{print "GUEST-CPU busy=" b " intr=" i " retrans=" r}'"'"' /proc/stat /proc/net/snmp; }'

# run KIND: guest A on KIND (gve or virtio), B on virtio-net; B sends to A.
run() {
    local kind=$1 d="$logdir/$1" porta
    mkdir -p "$d"
    cat >"$d/a.sh" <<EOF
$GCPU_FN
i=0; until ping -c 1 -W 2 $B >/dev/null 2>&1; do i=\$((i+1)); [ \$i -ge 120 ] && break; sleep 1; done
# the NIC comparison: the cheap sender into the same receiver on either NIC;
# the guest's busy CPU (all vCPUs, softirq included) and interrupts around it
gcpu
smc-guest-tests devmem-recv --ordinary --listen $A:5304 --bytes $bytes --pattern-mod 7 --accept-timeout 300
echo "CHEAP rc=\$?"
gcpu
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
$GCPU_FN
i=0; until ping -c 1 -W 2 $A >/dev/null 2>&1; do i=\$((i+1)); [ \$i -ge 120 ] && break; sleep 1; done
gcpu
smc-guest-tests devmem-send --to $A:5304 --bytes $bytes --pattern-mod 7 --connect-timeout 300
gcpu
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
    # the daemon's CPU over the whole run (utime + stime ticks) and its
    # port counters (gve: HW-GRO, TSO frames taken whole)
    "$DAEMON" ctl --control "$d/ctl.sock" status >"$d/status.txt" 2>&1 || true
    awk '{print $14 + $15}' "/proc/$DAEMON_PID/stat" >"$d/daemon-ticks" 2>/dev/null || true
    stop_daemon
}

field() { sed -n "s/.* $1=\([0-9.]*\).*/\1/p" <<<"$2"; }
for k in $( ((virtio_first)) && echo virtio gve || echo gve virtio); do
    say "$k run (logs $logdir/$k)"
    run "$k"
done

sg="$(grep -h '^STREAM-RESULT' "$logdir/gve/ga/a.job/out.log" 2>/dev/null | tail -n 1)"
sv="$(grep -h '^STREAM-RESULT' "$logdir/virtio/ga/a.job/out.log" 2>/dev/null | tail -n 1)"
dm="$(grep -h "^DEVMEM-RESULT listen=$A:5302 " "$logdir/gve/ga/a.job/out.log" 2>/dev/null | tail -n 1)"
dc="$(grep -h "^DEVMEM-RESULT listen=$A:5303 " "$logdir/gve/ga/a.job/out.log" 2>/dev/null | tail -n 1)"
cg="$(grep -h "^DEVMEM-RESULT listen=$A:5304 " "$logdir/gve/ga/a.job/out.log" 2>/dev/null | tail -n 1)"
cv="$(grep -h "^DEVMEM-RESULT listen=$A:5304 " "$logdir/virtio/ga/a.job/out.log" 2>/dev/null | tail -n 1)"
gve_cheap_mibps="$(field mibps "$cg")" gve_cheap_cpu="$(field cpu_s_per_gib "$cg")"
virtio_cheap_mibps="$(field mibps "$cv")" virtio_cheap_cpu="$(field cpu_s_per_gib "$cv")"
control_mibps="$(field mibps "$dc")" control_cpu="$(field cpu_s_per_gib "$dc")"
gve_mibps="$(field mibps "$sg")" virtio_mibps="$(field mibps "$sv")" devmem_mibps="$(field mibps "$dm")"
gve_cpu="$(field cpu_s_per_gib "$sg")" virtio_cpu="$(field cpu_s_per_gib "$sv")" devmem_cpu="$(field cpu_s_per_gib "$dm")"
ok=1
# the devmem row all in the dmabuf, the control row none of it
[[ $sg == *verified=1* && $sv == *verified=1* && $dm == *verified=1* && $dm == *" ordinary_bytes=0 "* ]] || ok=0
[[ $dc == *verified=1* && $dc == *" frags=0 "* ]] || ok=0
# the cheap-sender rows: plain TCP, all of it ordinary
[[ $cg == *verified=1* && $cg == *" mode=ordinary "* && $cv == *verified=1* && $cv == *" mode=ordinary "* ]] || ok=0
v() { [[ $1 == *verified=1* ]] && echo yes || echo NO; }
echo
{
    echo "| receive path (guest A, 2 vCPUs, TCG) | MiB/s | receiver CPU s/GiB | validated |"
    echo "|---|---:|---:|---|"
    echo "| virtio-net (vhost-user), ordinary TCP (cheap sender) | ${virtio_cheap_mibps:-?} | ${virtio_cheap_cpu:-?} | $(v "$cv") |"
    echo "| gve (vfio-user), ordinary TCP (cheap sender) | ${gve_cheap_mibps:-?} | ${gve_cheap_cpu:-?} | $(v "$cg") |"
    echo "| virtio-net, ordinary TCP (stream client: sender-bound) | ${virtio_mibps:-?} | ${virtio_cpu:-?} | $(v "$sv") |"
    echo "| gve, ordinary TCP (stream client: sender-bound) | ${gve_mibps:-?} | ${gve_cpu:-?} | $(v "$sg") |"
    echo "| gve, devmem TCP (devmem-recv, udmabuf) | ${devmem_mibps:-?} | ${devmem_cpu:-?} | $(v "$dm") |"
    echo "| gve, ordinary TCP, devmem's receiver and sender (control) | ${control_mibps:-?} | ${control_cpu:-?} | $(v "$dc") |"
} | tee "$logdir/bench.md"
# an SVG chart next to the table; a failed plot never fails the benchmark
"$ROOT/scripts/guest-results" plot "$logdir/bench.md" "$logdir/bench.svg" --title "TCP receive: gve vs virtio-net" >&2 || true
# The cheap rows' guests: busy vCPU seconds per GiB of each guest (all its
# vCPUs, interrupts and softirq included) from its two GUEST-CPU lines
# around the transfer, that as a share of the guest's vCPUs at the row's
# rate (100 %: the guest is the limit), and A's interrupts per MiB.
# gdelta LOG FIELD: the second GUEST-CPU line's FIELD minus the first's.
gdelta() { grep -h '^GUEST-CPU ' "$1" 2>/dev/null | head -n 2 | sed -n "s/.* $2=\([0-9]*\).*/\1/p" | awk 'NR==1{a=$1} NR==2{print $1-a}'; }
# nic KIND RATE: one row of the second table
nic() {
    local ra rb ia tb
    ra="$(gdelta "$logdir/$1/ga/a.job/out.log" busy)" rb="$(gdelta "$logdir/$1/gb/b.job/out.log" busy)"
    ia="$(gdelta "$logdir/$1/ga/a.job/out.log" intr)" tb="$(gdelta "$logdir/$1/gb/b.job/out.log" retrans)"
    awk -v k="$1" -v m="${2:-0}" -v ra="${ra:-x}" -v rb="${rb:-x}" -v ia="${ia:-x}" -v tb="${tb:-?}" -v mib="$(($(numfmt --from=iec "$bytes") >> 20))" 'BEGIN {
        gib = mib / 1024
        if (ra == "x" || rb == "x" || gib == 0) { printf "| %s | %s | ? | ? | ? | ? | ? | ? |\n", k, m; exit }
        sa = ra / 100 / gib; sb = rb / 100 / gib
        printf "| %s | %s | %.2f | %.0f %% | %.0f | %.2f | %.0f %% | %s |\n", k, m, sa, sa * m / 1024 / 2 * 100, ia / mib, sb, sb * m / 1024 * 100, tb
    }'
}
echo
{
    echo "| cheap sender: NIC of guest A | MiB/s | A busy vCPU s/GiB | A busy (of 2 vCPUs) | A interrupts / MiB | B (sender) busy vCPU s/GiB | B busy (of 1 vCPU) | B retransmitted segments |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|"
    nic virtio "$virtio_cheap_mibps"
    nic gve "$gve_cheap_mibps"
} | tee "$logdir/bench-guests.md"
# The daemon's CPU per GiB over each whole run (every transfer of the run:
# virtio 2, gve 4 of --bytes each; setup and boot included).
echo
{
    echo "| NIC of guest A | daemon CPU s (whole run) | GiB received | daemon CPU s/GiB | TSO frames placed whole (gve) |"
    echo "|---|---:|---:|---:|---:|"
    for k in virtio gve; do
        n=2; [[ $k == gve ]] && n=4
        t="$(cat "$logdir/$k/daemon-ticks" 2>/dev/null)"
        w="$(sed -n 's/.* \([0-9]*\) of them TSO frames taken whole.*/\1/p' "$logdir/$k/status.txt" 2>/dev/null | head -n 1)"
        awk -v k="$k" -v t="${t:-x}" -v n="$n" -v hz="$(getconf CLK_TCK)" -v w="${w:--}" -v mib="$(($(numfmt --from=iec "$bytes") >> 20))" 'BEGIN {
            gib = n * mib / 1024
            if (t == "x" || gib == 0) { printf "| %s | ? | %.2f | ? | %s |\n", k, gib, w; exit }
            printf "| %s | %.2f | %.2f | %.2f | %s |\n", k, t / hz, gib, t / hz / gib, w
        }'
    done
} | tee "$logdir/bench-daemon.md"
echo
echo "bench-gve bytes=$bytes gve_mibps=${gve_mibps:-0} virtio_mibps=${virtio_mibps:-0} devmem_mibps=${devmem_mibps:-0} gve_ordinary_mibps=${gve_mibps:-0} gve_cheap_mibps=${gve_cheap_mibps:-0} virtio_cheap_mibps=${virtio_cheap_mibps:-0}"
((ok)) || { say "a transfer was not validated (logs kept in $logdir)"; exit 1; }

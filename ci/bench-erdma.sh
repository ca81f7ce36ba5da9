#!/usr/bin/env bash
# Benchmark, one run: ib_write_bw, then an SMC-Rv2 stream, between two Linux
# 7.3 guests (TCG, 1 vCPU each) with RDMA done by emulated erdma functions
# (the daemon runs the RC queue pairs) versus the guests' own rxe over
# virtio-net; same guests, image, sizes and iterations. Also the guests' CPU
# seconds per GiB moved (from /proc/stat around each transfer, both guests
# added). The SMC-R stream (smc-guest-tests, one connection, client to
# server, every byte verified, smc_mode=smcr required) uses the same UEID in
# both guests. And the daemon's CPU seconds per GiB over each transfer
# (scripts/guest-results daemon-cpu: its user + system time sampled every
# 0.5 s while the bytes its ports send grow).
#
#   ci/bench-erdma.sh [--size 65536] [--iters 2000] [--smc-mib 256] [--no-build] [--logdir DIR]
#
# Ends with two lines:
#   bench-erdma size=S iters=N erdma_mbps=X rxe_mbps=Y erdma_cpu_s_per_gib=A rxe_cpu_s_per_gib=B erdma_daemon_cpu_s_per_gib=C rxe_daemon_cpu_s_per_gib=D
#   bench-erdma-smc mib=M erdma_mibps=X rxe_mibps=Y erdma_cpu_s_per_gib=A rxe_cpu_s_per_gib=B erdma_daemon_cpu_s_per_gib=C rxe_daemon_cpu_s_per_gib=D
set -uo pipefail
ROOT="$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)"
CASES=(erdma rxe)
size=65536 iters=2000 smc_mib=256 build=1 profile=release image="" qemu="" accel=auto timeout=900 logdir="" keep_logs=1
# shellcheck source=scripts/lib-e2e.sh
. "$ROOT/scripts/lib-e2e.sh"
# the release build shared with scripts/test.sh's guest tiers
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-${VHOST_RDMA_CACHE:-$HOME/.cache/vhost-rdma}/target}"
while (($#)); do
    case "$1" in
        --size) size="$2"; shift 2 ;;
        --iters) iters="$2"; shift 2 ;;
        --smc-mib) smc_mib="$2"; shift 2 ;;
        -h|--help) sed -n '2,16p' "$0"; e2e_opts_usage; exit 0 ;;
        *) e2e_opt "$@" || { echo "bench-erdma: unknown argument $1" >&2; exit 2; }; shift "$E2E_SHIFT" ;;
    esac
done
E2E_NAME=bench-erdma
HERE="$ROOT/scripts"  # lib-e2e.sh finds build-guest-image.sh / setup-qemu.sh there
e2e_begin
e2e_prepare smc-guest-tests
A=10.77.0.1 B=10.77.0.2 MACA=52:54:00:77:00:01 MACB=52:54:00:77:00:02

# The guest job: DEV is erdma_0 or rxe0; ROLE server|client. Prints the
# perftest row and "CPU <busy jiffies> <HZ>" measured around the transfer.
cat >"$logdir/job.sh" <<'EOF'
DEV=$1 ROLE=$2 SELF=$3 PEER=$4 SIZE=$5 ITERS=$6 SMCB=$7
. /opt/vr/rdma-lib.sh  # roce_gid_index
[ $DEV = rxe0 ] && rdma link add rxe0 type rxe netdev eth0
i=0; until ping -c 1 -W 2 $PEER >/dev/null 2>&1; do i=$((i+1)); [ $i -ge 120 ] && break; sleep 1; done
g=$(roce_gid_index $DEV $SELF)
busy() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 }' /proc/stat; }
b0=$(busy)
if [ $ROLE = server ]; then
    timeout 600 ib_write_bw -d $DEV -x $g -s $SIZE -n $ITERS > /tmp/bw.log 2>&1
else
    for t in $(seq 60); do timeout 600 ib_write_bw -d $DEV -x $g -s $SIZE -n $ITERS $PEER > /tmp/bw.log 2>&1 && break; sleep 2; done
fi
rc=$?
b1=$(busy)
cat /tmp/bw.log
echo "CPU $((b1 - b0)) 100"  # /proc/stat counts USER_HZ = 100 ticks a second
echo "BW-RC $rc"
# SMC-Rv2: the same UEID on both sides; the client retries until the server listens
smc-guest-tests smc ueid add VHOST-RDMA-BENCH >/dev/null 2>&1
sleep 5
b0=$(busy)
if [ $ROLE = server ]; then
    timeout 900 smc-guest-tests stream server --addr $SELF --proto smc --port 7790 --bytes $SMCB --conns 1 \
        --direction c2s --expect-mode smcr --once --accept-timeout 300 > /tmp/smc.log 2>&1
else
    timeout 900 smc-guest-tests stream client --addr $PEER --proto smc --port 7790 --bytes $SMCB --conns 1 \
        --direction c2s --expect-mode smcr --connect-timeout 120 > /tmp/smc.log 2>&1
fi
rc=$?
b1=$(busy)
grep -E '^(summary|STREAM-RESULT)' /tmp/smc.log
echo "SMC-CPU $((b1 - b0)) 100"
echo "SMC-RC $rc"
EOF
# build guest-results now (its shim builds on first use): the sampler
# must start with the daemon, not after a build
"$ROOT/scripts/guest-results" --version >/dev/null || exit 2
vrbin="$logdir/vrbin"
mkdir -p "$vrbin/bin"
cp "$logdir/job.sh" "$vrbin/job.sh"
cp "$ROOT/scripts/guest/rdma-lib.sh" "$vrbin/rdma-lib.sh"
cp "$SGT" "$vrbin/bin/"

run() {  # run erdma|rxe
    local kind=$1 d="$logdir/$1"
    mkdir -p "$d"
    local dev=rxe0 ports=(--port "a=$d/a.sock,mac=$MACA" --port "b=$d/b.sock,mac=$MACB")
    if [[ $kind == erdma ]]; then
        dev=erdma_0
        ports+=(--port "ra=$d/ra.sock,kind=erdma,netdev=a" --port "rb=$d/rb.sock,kind=erdma,netdev=b")
    fi
    echo "sh /opt/vr/job.sh $dev server $A $B $size $iters ${smc_mib}M" >"$d/a.sh"
    echo "sh /opt/vr/job.sh $dev client $B $A $size $iters ${smc_mib}M" >"$d/b.sh"
    daemon_up "$d/a.sock" "$d/b.sock" "$d/ctl.sock" -- "${ports[@]}" --control "$d/ctl.sock" ||
        fail_all "the daemon did not start ($d/daemon.log)"
    "$ROOT/scripts/guest-results" daemon-cpu sample --pid "$DAEMON_PID" --daemon "$DAEMON" --control "$d/ctl.sock" \
        --out "$d/daemon-cpu.log" &
    local spid=$!
    RG_A=(--net vhost-user) RG_B=(--net vhost-user)
    if [[ $kind == erdma ]]; then
        RG_A+=(--qemu-arg=-device --qemu-arg="{\"driver\":\"vfio-user-pci\",\"socket\":{\"type\":\"unix\",\"path\":\"$d/ra.sock\"}}")
        RG_B+=(--qemu-arg=-device --qemu-arg="{\"driver\":\"vfio-user-pci\",\"socket\":{\"type\":\"unix\",\"path\":\"$d/rb.sock\"}}")
    fi
    RG_A+=(--guest "a,ip=$A/24,sock=$d/a.sock,mac=$MACA,cmd=$d/a.sh")
    RG_B+=(--guest "b,ip=$B/24,sock=$d/b.sock,mac=$MACB,cmd=$d/b.sh")
    e2e_run_pair
    stop_daemon
    wait "$spid" 2>/dev/null
}

say "erdma run (logs $logdir/erdma)"
run erdma
say "rxe run (logs $logdir/rxe)"
run rxe

# result KIND -> "MB/s cpu_s_per_gib ok"
result() {
    local d="$logdir/$1" bw cpu=0 hz=100 ok=1 g
    bw="$(awk -v s="$size" '$1 == s && NF >= 4 { print $4 }' "$d/gb/b.job/out.log" 2>/dev/null | tail -n 1)"
    for g in a b; do
        local line
        line="$(grep -h '^CPU ' "$d/g$g/$g.job/out.log" 2>/dev/null | tail -n 1)"
        [[ -n $line ]] || ok=0
        cpu=$((cpu + $(awk '{print $2}' <<<"${line:-CPU 0 100}")))
        hz="$(awk '{print $3}' <<<"${line:-CPU 0 100}")"
        grep -q '^BW-RC 0' "$d/g$g/$g.job/out.log" 2>/dev/null || ok=0
    done
    python3 -c "
import sys
bw, cpu, hz, size, iters, ok = sys.argv[1:]
gib = int(size) * int(iters) / 2**30
print(bw or '0', round(int(cpu) / int(hz) / gib, 2) if gib else 0, ok)" "$bw" "$cpu" "$hz" "$size" "$iters" "$ok"
}
# smc_result KIND -> "MiB/s cpu_s_per_gib ok" of the SMC-R stream (the client's mibps)
smc_result() {
    local d="$logdir/$1" bw cpu=0 ok=1 g line
    bw="$(sed -n 's/^STREAM-RESULT role=client .* mibps=\([0-9.]*\) .*smc_mode=smcr.*/\1/p' "$d/gb/b.job/out.log" 2>/dev/null | tail -n 1)"
    [[ -n $bw ]] || ok=0
    for g in a b; do
        line="$(grep -h '^SMC-CPU ' "$d/g$g/$g.job/out.log" 2>/dev/null | tail -n 1)"
        [[ -n $line ]] || ok=0
        cpu=$((cpu + $(awk '{print $2}' <<<"${line:-SMC-CPU 0 100}")))
        grep -q '^SMC-RC 0' "$d/g$g/$g.job/out.log" 2>/dev/null || ok=0
    done
    python3 -c "
import sys
bw, cpu, mib, ok = sys.argv[1:]
print(bw or '0', round(int(cpu) / 100 / (int(mib) / 1024), 2), ok)" "$bw" "$cpu" "$smc_mib" "$ok"
}
# daemon KIND -> "ib_write_bw_cpu_s_per_gib smc_cpu_s_per_gib": the two
# largest bursts of traffic, in order
daemon_cpu() {
    "$ROOT/scripts/guest-results" daemon-cpu bursts "$logdir/$1/daemon-cpu.log" \
        $((size * iters)) $((smc_mib << 20)) 2>/dev/null | awk '{ printf "%s ", $1 } END { print "" }'
}
read -r e_dcpu es_dcpu < <(daemon_cpu erdma)
read -r r_dcpu rs_dcpu < <(daemon_cpu rxe)
read -r e_bw e_cpu e_ok < <(result erdma)
read -r r_bw r_cpu r_ok < <(result rxe)
read -r es_bw es_cpu es_ok < <(smc_result erdma)
read -r rs_bw rs_cpu rs_ok < <(smc_result rxe)
echo
{
    echo "| ib_write_bw, $size B x $iters, TCG | MB/s | guest CPU s/GiB (both guests) | daemon CPU s/GiB |"
    echo "|---|---:|---:|---:|"
    echo "| erdma <-> erdma (QPs in the daemon) | $e_bw | $e_cpu | $e_dcpu |"
    echo "| rxe <-> rxe (QPs in the guests) | $r_bw | $r_cpu | $r_dcpu |"
    echo
    echo "| SMC-Rv2 stream, ${smc_mib} MiB, 1 conn, TCG | MiB/s | guest CPU s/GiB (both guests) | daemon CPU s/GiB |"
    echo "|---|---:|---:|---:|"
    echo "| erdma <-> erdma | $es_bw | $es_cpu | $es_dcpu |"
    echo "| rxe <-> rxe | $rs_bw | $rs_cpu | $rs_dcpu |"
} | tee "$logdir/bench.md"
# an SVG chart next to the table; a failed plot never fails the benchmark
"$ROOT/scripts/guest-results" plot "$logdir/bench.md" "$logdir/bench.svg" --title "erdma vs rxe, ib_write_bw" >&2 || true
echo
echo "bench-erdma size=$size iters=$iters erdma_mbps=$e_bw rxe_mbps=$r_bw erdma_cpu_s_per_gib=$e_cpu rxe_cpu_s_per_gib=$r_cpu erdma_daemon_cpu_s_per_gib=$e_dcpu rxe_daemon_cpu_s_per_gib=$r_dcpu"
echo "bench-erdma-smc mib=$smc_mib erdma_mibps=$es_bw rxe_mibps=$rs_bw erdma_cpu_s_per_gib=$es_cpu rxe_cpu_s_per_gib=$rs_cpu erdma_daemon_cpu_s_per_gib=$es_dcpu rxe_daemon_cpu_s_per_gib=$rs_dcpu"
[[ $e_ok == 1 && $r_ok == 1 && $es_ok == 1 && $rs_ok == 1 ]] || { say "a transfer failed (logs in $logdir)"; exit 1; }

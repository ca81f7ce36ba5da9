#!/usr/bin/env bash
# Benchmark, one run: the vhost-rdma daemon (`vhost-rdma serve`, two ports)
# against DPDK's dpdk-testpmd as a vhost-user switch (two net_vhost ports,
# io forwarding, one forwarding core), each a separate process, both driven
# by the same in-process vhost-user frontend with the same bursts, at 64 B
# and 1500 B, first as fast as each goes (saturation), then both at the same
# paced load (1 M frames/s at 64 B, 10 Gbit/s at 1500 B). Each switch is
# given the last CPU (testpmd -l, vhost-rdma --cpu-affinity; the daemon is
# also measured unpinned), the frontend CPU 0 (vhost-rdma/benches/fabric.rs,
# which also keeps the in-process TestGuest measurement).
#
#   ci/bench-fabric-dpdk.sh [--quick] [--secs N] [--no-install] [--perf] [--logdir DIR]
#
# Installs Debian's DPDK when dpdk-testpmd is missing (apt-get, quiet;
# Debian 12 ships dpdk-testpmd in dpdk-dev, not in dpdk), builds the
# benchmark and the daemon (bench profile, i.e. release), runs it and tees
# the output to DIR/bench.log. Per frame size it prints frames/s, Gbit/s
# and each switch's CPU ns per frame (user + system of the whole process,
# /proc/PID/stat, around the timed loop; testpmd's polling core counts).
# Ends with
#   fabric-bench size=64 ours_fps=N dpdk_fps=N ours_cpu_ns=N dpdk_cpu_ns=N
#   fabric-bench size=1500 ours_fps=N dpdk_fps=N ours_cpu_ns=N dpdk_cpu_ns=N
# (fps: the most each forwarded; cpu_ns: at the paced load, testpmd's idle
# polling between bursts counted; the fabric-bench-saturated and
# fabric-bench-paced lines above give both whole; dpdk_*=NA, after a loud
# SKIPPED line, when testpmd is missing or fails).
# --perf records `perf record -g` of each switch during its timed loops into
# DIR and prints the top symbols of each.
set -uo pipefail
HERE="$(cd "$(dirname "$(readlink -f "$0")")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
quick=0 secs="" install=1 perf=0 logdir=""
while (($#)); do
    case "$1" in
        --quick) quick=1; shift ;;
        --secs) secs="$2"; shift 2 ;;
        --no-install) install=0; shift ;;
        --perf) perf=1; shift ;;
        --logdir) logdir="$2"; shift 2 ;;
        -h|--help) sed -n '2,29p' "$0"; exit 0 ;;
        *) echo "bench-fabric-dpdk: unknown argument $1" >&2; exit 2 ;;
    esac
done
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-${VHOST_RDMA_CACHE:-$HOME/.cache/vhost-rdma}/target}"
logdir="${logdir:-$(mktemp -d "${TMPDIR:-/tmp}/bench-fabric-dpdk.XXXXXX")}"
mkdir -p "$logdir"
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"   # info: log lines "[bench-fabric-dpdk.sh] ..."

if ((install)) && ! command -v dpdk-testpmd >/dev/null 2>&1; then
    sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo -n"
    info "installing dpdk dpdk-dev (apt-get, log $logdir/apt.log)"
    if ! DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q dpdk dpdk-dev >"$logdir/apt.log" 2>&1; then
        DEBIAN_FRONTEND=noninteractive $sudo apt-get update -q >>"$logdir/apt.log" 2>&1
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q dpdk dpdk-dev >>"$logdir/apt.log" 2>&1 ||
            info "could not install DPDK; the benchmark will info SKIPPED for it"
    fi
fi

info "building (log $logdir/build.log)"
(cd "$ROOT" && nice cargo bench -p vhost-rdma --bench fabric --no-run) >"$logdir/build.log" 2>&1 ||
    { info "build failed ($logdir/build.log)"; tail -n 30 "$logdir/build.log" >&2; exit 1; }
# Run what was just built (the daemon path is compiled into it), rather than
# a second `cargo bench` that would rebuild whatever changed meanwhile.
bench="$(sed -n 's/^ *Executable benches\/fabric\.rs (\(.*\))$/\1/p' "$logdir/build.log" | tail -n 1)"
[ -x "$bench" ] || { info "no benchmark executable in $logdir/build.log"; exit 1; }

args=()
((quick)) && args+=(--quick)
[ -n "$secs" ] && export VHOST_RDMA_BENCH_SECS="$secs"
if ((perf)); then
    if command -v perf >/dev/null 2>&1; then
        export VHOST_RDMA_BENCH_PERF="$logdir/perf"
    else
        info "perf not installed; --perf ignored"
        perf=0
    fi
fi
info "machine: $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
(cd "$ROOT/vhost-rdma" && "$bench" --bench "${args[@]}") 2>"$logdir/bench.stderr" |
    tee "$logdir/bench.log"
rc=${PIPESTATUS[0]}
if ((rc != 0)); then
    info "benchmark failed (rc $rc); stderr tail:"
    tail -n 30 "$logdir/bench.stderr" >&2
fi
if ((perf)) && [ -d "$logdir/perf" ]; then
    for f in "$logdir"/perf/*.0.perf.data; do
        [ -e "$f" ] || continue
        echo
        echo "== perf: $(basename "$f" .0.perf.data), first round (self time, top symbols) =="
        perf report -i "$f" -g none --no-children --sort dso,sym --stdio 2>/dev/null |
            grep -v -e '^#' -e '^$' | grep '%' | head -n 20
    done | tee "$logdir/perf.txt"
fi
info "logs in $logdir"
exit "$rc"

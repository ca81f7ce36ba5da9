#!/usr/bin/env bash
# Benchmark, one run: ib_write_bw, then an SMC-Rv2 stream, between two Linux
# 7.3 guests with RDMA done by emulated erdma functions versus the guests'
# own rxe, with the guests' and the daemon's CPU per GiB.
#   ci/bench-erdma.sh [--size 65536] [--iters 2000] [--smc-mib 256] [--no-build] [--results DIR]
# The runner is `guest-runner bench-erdma` (guest-runner/src/bench_erdma.rs,
# one matrix cell per device); the guest side is ci/guest/bench.sh.
exec "$(dirname "$(readlink -f "$0")")/../scripts/guest-runner" bench-erdma "$@"

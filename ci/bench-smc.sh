#!/usr/bin/env bash
# SMC-R vs TCP throughput and CPU between two guests on the vhost-rdma daemon.
#   ci/bench-smc.sh                       # 7.3 guests, 128 MiB x {1, 4 conns}, smc and tcp
#   ci/bench-smc.sh --total 256 --conns 1,2,4 --no-build
# The runner is `guest-runner bench-smc` (guest-runner/src/bench_smc.rs, one
# matrix cell); the guest side is ci/guest/bench.sh.
exec "$(dirname "$(readlink -f "$0")")/../scripts/guest-runner" bench-smc "$@"

#!/usr/bin/env bash
# SMC-R vs TCP throughput and CPU between two guests on the vhost-rdma daemon.
#   ci/bench-smc.sh                       # 7.3 guests, 128 MiB x {1, 4 conns}, smc and tcp
#   ci/bench-smc.sh --total 256 --conns 1,2,4 --no-build
# Driver: ci/bench_smc.py (uses ci/matrix.py); guest side: ci/guest/bench-smc.sh.
set -euo pipefail
HERE="$(cd "$(dirname "$(readlink -f "$0")")" && pwd)"
exec python3 "$HERE/bench_smc.py" "$@"

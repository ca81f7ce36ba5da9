#!/usr/bin/env bash
# ib_write_bw guest -> guest vs guest -> virtual host, in one run, after the
# in-process RC engine benchmark (cargo bench -p roce-model --bench engine).
#   ci/bench-vhost.sh                       # release build, 7.3, 64 KiB x 1000
#   ci/bench-vhost.sh --no-build --size 4096 --iters 5000
# The runner is `guest-runner bench-vhost` (guest-runner/src/bench_vhost.rs,
# one matrix cell); the guest side is ci/guest/bench.sh.
exec "$(dirname "$(readlink -f "$0")")/../scripts/guest-runner" bench-vhost "$@"

#!/usr/bin/env bash
# Guest-to-guest TCP throughput (iperf3, 1 and 4 streams) between the same
# two guests, through the vhost-rdma daemon and through QEMU's own
# `-netdev stream` link (the baseline), as one Markdown table with the
# ratio; then the in-process fabric benchmark (cargo bench --bench fabric).
# The runner is `guest-runner bench-fabric` (guest-runner/src/bench_fabric.rs);
# the guests' side is ci/guest/ci-lib.sh's cell_iperf. --help lists the options.
exec "$(dirname "$(readlink -f "$0")")/guest-runner" bench-fabric "$@"

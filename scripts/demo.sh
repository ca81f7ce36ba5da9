#!/usr/bin/env bash
# The demo: what vhost-rdma is for, on one machine, with no RDMA hardware
# (the README's first command). The runner is `guest-runner demo`
# (guest-runner/src/demo.rs: the steps, their verdicts, the table); the
# guests' side is scripts/demo-guest.sh. `scripts/demo.sh --help` lists
# the options.
exec "$(dirname "$(readlink -f "$0")")/guest-runner" demo "$@"

#!/usr/bin/env bash
# The demo: what vhost-rdma is for, on one machine, with no RDMA hardware
# (the README's first command). The runner is `guest-runner demo`
# (guest-runner/src/demo.rs: the steps, their verdicts, the table); the
# guests' side is scripts/demo-guest.sh. `scripts/demo.sh --help` lists
# the options.
CACHE="${VHOST_RDMA_CACHE:-$HOME/.cache/vhost-rdma}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE/target}"
# No incremental state: it doubles the debug target and a run from a
# fresh checkout never reuses it.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
exec "$(dirname "$(readlink -f "$0")")/guest-runner" demo "$@"

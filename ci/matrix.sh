#!/usr/bin/env bash
# Guest RDMA / SMC-R / NIC test matrix: see ci/README.md, or --help.
#
#   ci/matrix.sh --quick                 # CI tier (scripts/test.sh runs it)
#   ci/matrix.sh --kernel 7.3            # every 7.3 cell
#   ci/matrix.sh                         # everything (7.3 and 6.12)
#   ci/matrix.sh --cells siw,smc-noueid --kernel 7.3
#   ci/matrix.sh --dry-run               # list the cells
#
# The runner is `guest-runner matrix` (guest-runner/src/matrix/, the cells
# in guest-runner/src/cells.rs); the guest side is ci/guest/ci-lib.sh.
exec "$(dirname "$(readlink -f "$0")")/../scripts/guest-runner" matrix "$@"

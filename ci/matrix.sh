#!/usr/bin/env bash
# Guest RDMA / SMC-R test matrix (issue 3): see ci/README.md, or --help.
#
#   ci/matrix.sh --quick                 # CI tier: 7.3/rxe, 7.3/smcr, 7.3/erdma-smcr, 7.3/upstream-rdma, 7.3/upstream-nic
#   ci/matrix.sh --kernel 7.3            # every 7.3 cell
#   ci/matrix.sh                         # everything (7.3 and 6.12)
#   ci/matrix.sh --cells siw,smc-noueid --kernel 7.3
#
# The driver is ci/matrix.py (Python 3 standard library); the guest side is
# ci/guest/ci-lib.sh.
set -euo pipefail
HERE="$(cd "$(dirname "$(readlink -f "$0")")" && pwd)"
command -v python3 >/dev/null 2>&1 || { echo "matrix.sh: python3 is required" >&2; exit 2; }
exec python3 "$HERE/matrix.py" "$@"

#!/usr/bin/env bash
# Soak test (issue 8): one daemon, four Linux 7.3 guests, N minutes of
# verified SMC-R / rxe / siw transfers under 0.5 % drop + 1 % reorder on the
# RoCE path, the daemon's own memory sampled against a post-warm-up baseline.
#
#   scripts/soak.sh                 # 10 minutes
#   scripts/soak.sh --minutes 3     # a short run
#   scripts/soak.sh --help
#
# Results (summary.md/.json/.svg, rss.csv, daemon and guest logs) go to
# ci/results/soak-<date>/ (gitignored) unless --results DIR. Exit 0 only if
# every transfer passed, the daemon stayed up and its own memory stayed
# within 10 %. The driver is `guest-runner soak` (guest-runner/src/soak.rs);
# the guest side is ci/guest/soak-lib.sh.
exec "$(dirname "$(readlink -f "$0")")/guest-runner" soak "$@"

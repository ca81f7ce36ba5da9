#!/usr/bin/env bash
# Coverage-guided fuzzing of the workspace's parsers and engines with
# cargo-fuzz (libFuzzer + AddressSanitizer). See fuzz/README.md.
#
#   scripts/fuzz.sh [--seconds-per-target N] [--target NAME]... [--sanitizer address|none]
#                   [--list]
#
# Installs cargo-fuzz (cargo install, cached in ~/.cargo/bin) if missing,
# builds every target once, runs each for N seconds (default 50; 14 targets
# -> ~12 minutes), and prints a table: target, runs, coverage (libFuzzer's
# "cov" edge count), corpus size (seeds + discovered), crashes.
# Exits 1 if any target crashed (reproducers in fuzz/artifacts/<target>/).
#
# Seeds come from fuzz/corpus/<target>/ (committed, read-only here); what
# libFuzzer discovers goes to fuzz/work/<target>/ (ignored by git), which is
# reused by the next run.
#
# Only a stable toolchain is needed: the sanitizer and libFuzzer flags are
# nightly-only (-Z), so the build runs with RUSTC_BOOTSTRAP=1 (the stable
# compiler ships the ASan runtime for x86_64-unknown-linux-gnu).
set -uo pipefail
ROOT="$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)"
cd "$ROOT"

secs=50 sanitizer=address list=0 targets=()
while (($#)); do
    case "$1" in
        --seconds-per-target) secs="$2"; shift 2 ;;
        --target) targets+=("$2"); shift 2 ;;
        --sanitizer) sanitizer="$2"; shift 2 ;;
        --list) list=1; shift ;;
        -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
        *) echo "fuzz.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

export RUSTC_BOOTSTRAP=1
export PATH="$HOME/.cargo/bin:$PATH"
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "[fuzz.sh] installing cargo-fuzz" >&2
    cargo install --locked cargo-fuzz >&2 || { echo "[fuzz.sh] cargo install cargo-fuzz failed" >&2; exit 2; }
fi
command -v c++ >/dev/null 2>&1 || { echo "[fuzz.sh] a C++ compiler is needed (libfuzzer-sys builds libFuzzer)" >&2; exit 2; }

all=()
while IFS= read -r t; do all+=("$t"); done < <(cargo fuzz list --fuzz-dir fuzz)
if ((list)); then printf '%s\n' "${all[@]}"; exit 0; fi
((${#targets[@]})) || targets=("${all[@]}")
for t in "${targets[@]}"; do
    printf '%s\n' "${all[@]}" | grep -qx "$t" || { echo "fuzz.sh: no target $t (see --list)" >&2; exit 2; }
done

# The sanitizer build instruments std too only with -Zbuild-std (needs the
# rust-src component and a nightly cargo); the default build instruments the
# workspace crates and their dependencies.
common=(--fuzz-dir fuzz --sanitizer "$sanitizer")
echo "[fuzz.sh] building ${#targets[@]} target(s) (sanitizer: $sanitizer)" >&2
for t in "${targets[@]}"; do
    cargo fuzz build "${common[@]}" "$t" >&2 || { echo "[fuzz.sh] build of $t failed" >&2; exit 2; }
done

logdir="fuzz/work/logs"
mkdir -p "$logdir"
rows=() failed=0
for t in "${targets[@]}"; do
    mkdir -p "fuzz/work/$t" "fuzz/corpus/$t" "fuzz/artifacts/$t"
    before=$(find "fuzz/artifacts/$t" -type f | wc -l)
    log="$logdir/$t.log"
    echo "[fuzz.sh] $t: ${secs}s" >&2
    cargo fuzz run "${common[@]}" "$t" "fuzz/work/$t" "fuzz/corpus/$t" -- \
        -max_total_time="$secs" -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 >"$log" 2>&1
    rc=$?
    runs=$(awk '/stat::number_of_executed_units/ {s += $2} END {print s + 0}' "$log")
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | awk '{print $2}')
    corpus=$(find "fuzz/work/$t" "fuzz/corpus/$t" -type f | wc -l)
    after=$(find "fuzz/artifacts/$t" -type f | wc -l)
    crashes=$((after - before))
    if ((rc != 0 && crashes == 0)); then crashes=1; fi
    ((crashes)) && { failed=1; echo "[fuzz.sh] $t FAILED (exit $rc), see $log and fuzz/artifacts/$t/" >&2; }
    rows+=("$(printf '%-16s %12s %8s %8s %8s' "$t" "$runs" "${cov:-?}" "$corpus" "$crashes")")
done

printf '\n%-16s %12s %8s %8s %8s\n' target runs cov corpus crashes
for r in "${rows[@]}"; do echo "$r"; done
exit "$failed"

#!/usr/bin/env bash
# Runs one cargo test many times in a row and stops at the first failure: for
# races that a single run rarely shows. Not part of scripts/test.sh.
#
#   scripts/stress.sh [--runs N] [-p CRATE] --test TARGET TEST_NAME
#   e.g. scripts/stress.sh --runs 200 -p vhost-rdma --test fabric slow_receiver_gets_back_pressure_not_drops
#
# Prints "N passed, M failed" at the end (M is 0 or 1: it stops at a failure).
set -uo pipefail
ROOT="$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)"
cd "$ROOT"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-${VHOST_RDMA_CACHE:-$HOME/.cache/vhost-rdma}/target}"
runs=200 pkg=vhost-rdma target="" name=""
while (($#)); do
    case "$1" in
        --runs) runs="$2"; shift 2 ;;
        -p) pkg="$2"; shift 2 ;;
        --test) target="$2"; shift 2 ;;
        -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
        *) name="$1"; shift ;;
    esac
done
[[ -n $target && -n $name ]] || { echo "stress.sh: need --test TARGET and a test name" >&2; exit 2; }
cargo test -p "$pkg" --test "$target" --no-run -q 2>/dev/null || { echo "stress.sh: build failed" >&2; exit 1; }
bin="$(cargo test -p "$pkg" --test "$target" --no-run --message-format=json 2>/dev/null \
    | python3 -c 'import sys,json
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["target"]["kind"]==["test"]: print(m["executable"])' | tail -1)"
[[ -x $bin ]] || { echo "stress.sh: no test binary for --test $target" >&2; exit 1; }
passed=0 failed=0 t0=$(date +%s)
for ((i = 1; i <= runs; i++)); do
    if out="$("$bin" --exact "$name" --test-threads 1 2>&1)" && grep -q "1 passed" <<<"$out"; then
        passed=$((passed + 1))
    else
        failed=1
        echo "run $i FAILED:"; echo "$out" | tail -20
        break
    fi
    ((i % 20 == 0)) && echo "$i runs, all passed ($(($(date +%s) - t0)) s)"
done
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]

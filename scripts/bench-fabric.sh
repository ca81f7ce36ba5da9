#!/usr/bin/env bash
# Guest-to-guest TCP throughput (iperf3, 1 and 4 streams) between the same two
# guests, through the vhost-rdma daemon and through QEMU's own
# `-netdev stream` link (the baseline), printed as one Markdown table with the
# ratio; then the in-process fabric benchmark (cargo bench --bench fabric) if
# the workspace has it.
set -uo pipefail

HERE="$(cd "$(dirname "$(readlink -f "$0")")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"

usage() {
    cat <<EOF
Usage: ${0##*/} [options]
  --no-build        do not build the daemon (use target/PROFILE/vhost-rdma)
  --profile P       release (default) or debug
  --image DIR       guest image (default: scripts/build-guest-image.sh --kernel 7.3)
  --qemu PATH       QEMU (default: scripts/setup-qemu.sh, i.e. 11.1)
  --accel A         auto (default), kvm, tcg
  --time SECS       iperf3 -t (default 10)
  --form F          pci (default) or testdev: device form on the daemon path
  --queues N        queue pairs on the daemon path (default 1)
  --smp N           vCPUs per guest (default 1)
  --paths LIST      which paths: daemon,stream (default both)
  --no-cargo-bench  skip the in-process fabric benchmark
  --logdir DIR      keep logs here (default: a new dir under \${TMPDIR:-/tmp})
EOF
}

build=1 profile=release image="" qemu="" accel=auto secs=10 form=pci queues=1 smp=1
paths="daemon,stream" cargo_bench=1 logdir=""
while (($#)); do
    case "$1" in
        --no-build) build=0; shift ;;
        --profile) profile="$2"; shift 2 ;;
        --image) image="$2"; shift 2 ;;
        --qemu) qemu="$2"; shift 2 ;;
        --accel) accel="$2"; shift 2 ;;
        --time) secs="$2"; shift 2 ;;
        --form) form="$2"; shift 2 ;;
        --queues) queues="$2"; shift 2 ;;
        --smp) smp="$2"; shift 2 ;;
        --paths) paths="$2"; shift 2 ;;
        --no-cargo-bench) cargo_bench=0; shift ;;
        --logdir) logdir="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "bench-fabric: unknown argument $1" >&2; usage >&2; exit 2 ;;
    esac
done
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"   # info: log lines "[bench-fabric.sh] ..."
# The daemon's lifetime and the log dir, as the guest tiers have them.
E2E_NAME=bench-fabric CASES=()
# shellcheck source=scripts/lib-e2e.sh
. "$ROOT/scripts/lib-e2e.sh"
e2e_begin

if [[ ,$paths, == *,daemon,* ]]; then
    if ((build)); then
        info "cargo build ($profile) -p vhost-rdma"
        bflag=(--release); [[ $profile == release ]] || bflag=(--profile "$profile")
        [[ $profile == debug ]] && bflag=()
        (cd "$ROOT" && cargo build "${bflag[@]}" -p vhost-rdma) >"$logdir/build.log" 2>&1 ||
            { tail -20 "$logdir/build.log" >&2; die "cargo build failed"; }
    fi
    DAEMON="${CARGO_TARGET_DIR:-$ROOT/target}/$profile/vhost-rdma"
    [[ -x $DAEMON ]] || die "no daemon binary $DAEMON"
fi
if [[ -z $image ]]; then
    image="$("$HERE/build-guest-image.sh" --kernel 7.3 | tail -n 1)" || die "build-guest-image.sh failed"
fi
[[ -f $image/bzImage && -f $image/rootfs.ext4 ]] || die "bad image dir '$image'"
if [[ -z $qemu ]]; then
    qemu="$("$HERE/setup-qemu.sh" | tail -n 1)" || die "setup-qemu.sh failed"
fi
qver="$("$qemu" --version | head -n 1)"

# ---- guest jobs: A serves twice (-1: one test each), B runs P1 then P4
cat >"$logdir/a.sh" <<'EOF'
command -v iperf3 >/dev/null || { echo "BENCH-FAIL no iperf3 in the guest"; exit 20; }
for p in 1 4; do iperf3 -s -1 >/job/iperf-server-P$p.log 2>&1 || { echo "iperf3 server (-P $p) failed"; exit 21; }; done
EOF
cat >"$logdir/b.sh" <<EOF
command -v iperf3 >/dev/null || { echo "BENCH-FAIL no iperf3 in the guest"; exit 20; }
i=0; while [ "\$(cat /sys/class/net/eth0/carrier 2>/dev/null)" != 1 ]; do i=\$((i + 1)); if [ \$i -ge 30 ]; then echo "BENCH-FAIL eth0 has no carrier after 30 s"; exit 10; fi; sleep 1; done
i=0; until ping -c 1 -W 2 10.77.0.1 >/dev/null 2>&1; do i=\$((i + 1)); [ \$i -ge 60 ] && break; sleep 1; done
ping -c 3 -W 5 10.77.0.1 || { echo "BENCH-FAIL ping"; exit 12; }
for p in 1 4; do
    ok=0
    for try in \$(seq 30); do
        # bounded: a stalled data path must not hang the whole benchmark
        timeout $((secs + 60)) iperf3 -c 10.77.0.1 -t $secs -P \$p -J >/job/iperf-P\$p.json 2>/job/iperf-P\$p.err
        r=\$?
        if [ \$r = 0 ]; then ok=1; break; fi
        if [ \$r = 124 ] || [ \$r = 143 ]; then echo "BENCH-FAIL iperf3 -P \$p stalled (killed after $((secs + 60)) s)"; exit 14; fi
        sleep 1   # the server restarts between the two tests
    done
    [ \$ok = 1 ] || { echo "BENCH-FAIL iperf3 -P \$p"; cat /job/iperf-P\$p.err /job/iperf-P\$p.json | tail -5; exit 13; }
    echo "iperf3 -P \$p done"
done
EOF

run_path() {  # run_path NAME -> logs in $logdir/NAME
    local p=$1 d="$logdir/$1" maca=52:54:00:77:00:0a macb=52:54:00:77:00:0b
    rm -rf "$d"; mkdir -p "$d"
    local args=(--qemu "$qemu" --image "$image" --accel "$accel" --smp "$smp" --timeout $((secs * 2 + 400))
        --logdir "$d")
    local ga="a,ip=10.77.0.1/24,mac=$maca,cmd=$logdir/a.sh" gb="b,ip=10.77.0.2/24,mac=$macb,cmd=$logdir/b.sh"
    if [[ $p == daemon ]]; then
        daemon_up "$d/a.sock" "$d/b.sock" -- --port "a=$d/a.sock,mac=$maca,queues=$queues,form=$form" \
            --port "b=$d/b.sock,mac=$macb,queues=$queues,form=$form" --control "$d/ctl.sock" ||
            { info "path $p: the daemon did not start (see $d/daemon.log)"; return 1; }
        args+=(--net vhost-user --form "$form" --queues "$queues")
        ga+=",sock=$d/a.sock" gb+=",sock=$d/b.sock"
    else
        args+=(--net stream)
    fi
    info "path $p: booting guests"
    "$ROOT/scripts/run-guests" "${args[@]}" --guest "$ga" --guest "$gb" >"$d/run-guests.log" 2>&1
    local rc=$?
    if [[ $p == daemon ]]; then
        kill -0 "$DAEMON_PID" 2>/dev/null || info "path $p: the daemon died (see $d/daemon.log)"
        "$DAEMON" ctl --control "$d/ctl.sock" status >"$d/ctl-status.txt" 2>&1 || true
        stop_daemon
    fi
    if ((rc != 0)); then
        info "path $p: run-guests failed (exit $rc), logs in $d:"
        sed 's/^/    /' "$d/run-guests.log" | tail -40 >&2
    fi
    return $rc
}

declare -A status
for p in ${paths//,/ }; do
    run_path "$p"; status[$p]=$?
done

python3 - "$logdir" "$paths" "$secs" "$form" "$queues" "$qver" "$smp" <<'EOF' | tee "$logdir/bench.md"
import json, os, sys
logdir, paths, secs, form, queues, qver, smp = sys.argv[1:]
paths = paths.split(",")
def gbps(path, p):
    f = os.path.join(logdir, path, "b.job", f"iperf-P{p}.json")
    try:
        d = json.load(open(f))
        e = d["end"]
        rx = e["sum_received"]["bits_per_second"] / 1e6
        rt = e.get("sum_sent", {}).get("retransmits")
        return rx, rt
    except Exception:
        return None, None
def meta(path):
    try:
        s = json.load(open(os.path.join(logdir, path, "summary.json")))
        return s["accel"], ", ".join(f"{g['name']} {g['boot_s']} s" for g in s["guests"])
    except Exception:
        return "?", "?"
label = {"daemon": f"vhost-rdma daemon ({form}, {queues}q)", "stream": "QEMU -netdev stream"}
print()
print(f"## Guest-to-guest TCP throughput (iperf3 -t {secs}, receiver Mbit/s)")
print()
print(f"QEMU: {qver}; guests: {smp} vCPU each; " +
      "; ".join(f"{label[p]}: accel {meta(p)[0]}, boot {meta(p)[1]}" for p in paths))
print()
hdr = ["streams"] + [label[p] + " Mbit/s (retr)" for p in paths]
if "daemon" in paths and "stream" in paths:
    hdr.append("ratio daemon/stream")
print("| " + " | ".join(hdr) + " |")
print("|" + "|".join("---" for _ in hdr) + "|")
for n in (1, 4):
    row = [f"{n} (-P {n})"]
    vals = {}
    for p in paths:
        v, rt = gbps(p, n)
        vals[p] = v
        row.append("FAILED" if v is None else f"{v:.0f} ({rt if rt is not None else '-'})")
    if "daemon" in paths and "stream" in paths:
        a, b = vals["daemon"], vals["stream"]
        row.append("-" if not a or not b else f"{a / b:.2f}")
    print("| " + " | ".join(row) + " |")
print()
EOF
# an SVG chart next to the table; a failed plot never fails the benchmark
"$ROOT/scripts/guest-results" plot "$logdir/bench.md" "$logdir/bench.svg" --title "guest-to-guest TCP (iperf3)" >&2 || true

bench_rc=0
if ((cargo_bench)); then
    if grep -qs 'name *= *"fabric"' "$ROOT/vhost-rdma/Cargo.toml" || [[ -f $ROOT/vhost-rdma/benches/fabric.rs ]]; then
        info "cargo bench -p vhost-rdma --bench fabric"
        echo "## In-process fabric (cargo bench -p vhost-rdma --bench fabric)"
        echo
        echo '```'
        (cd "$ROOT" && cargo bench -p vhost-rdma --bench fabric 2>&1) | tee "$logdir/cargo-bench.log" | grep -v '^ *\(Compiling\|Running\|Finished\)'
        bench_rc=${PIPESTATUS[0]}
        echo '```'
    else
        echo "In-process fabric benchmark: not present yet (no vhost-rdma/benches/fabric.rs); skipped."
    fi
fi

rc=0
for p in "${!status[@]}"; do ((status[$p] == 0)) || rc=1; done
((bench_rc == 0)) || rc=1
info "logs: $logdir"
exit $rc

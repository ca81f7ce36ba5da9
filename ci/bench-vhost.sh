#!/usr/bin/env bash
# ib_write_bw guest -> guest vs guest -> virtual host, in one run.
#
# One boot of two Linux guests (default 7.3) with rxe through the vhost-rdma
# daemon, plus a virtual host vh (10.77.0.10, virtual-host crate) on the same
# fabric with a write-bw-server service. Guest B (10.77.0.2, the client)
# runs the unmodified `ib_write_bw -d rxe0 -x GID -n N -s S` first against
# guest A's `ib_write_bw` server (10.77.0.1), then, with the same size and
# iterations, against the virtual host. Each guest samples its CPU around its
# runs (busy = elapsed - idle from /proc/uptime, 1 vCPU, so it includes
# softirq and kworkers, where rxe does its work). Prints a Markdown table
# (MiB/s as perftest's "BW average[MiB/sec]", msg/s, guest CPU s per GiB on
# the client and on the server side) and the messages the host counted.
#
# Before the guests boot (so that they do not share the CPU with it) it runs
# the in-process engine benchmark, `cargo bench -p roce-model --bench engine`
# (64 B SEND message rate, 64 KiB RDMA WRITE bandwidth engine to engine, and
# the machine's memcpy bandwidth in the same process), and prints its table
# beside the guest one (`--no-engine` skips it).
#
#   ci/bench-vhost.sh                       # release build, 7.3, 64 KiB x 1000
#   ci/bench-vhost.sh --no-build --size 4096 --iters 5000
set -uo pipefail

HERE="$(cd "$(dirname "$(readlink -f "$0")")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
CASES=(guest-guest guest-vhost)

usage() {
    cat <<EOF
Usage: ${0##*/} [options]
$(e2e_opts_usage)
  --no-engine        skip the in-process engine benchmark
  --size N           ib_write_bw -s (default 65536)
  --iters N          ib_write_bw -n (default 1000)
  --qp-timeout N     ib_write_bw -u, both runs (default 20, ~4 s: a TCG guest can
                     stall longer than the default 67 ms and rxe then fails the
                     run with RETRY_EXC_ERR)
  -h, --help
EOF
}

engine=1 qp_timeout=20 build=1 profile=release image="" qemu="" accel=auto size=65536 iters=1000 timeout=1800 logdir="" keep_logs=0
# shellcheck source=scripts/lib-e2e.sh
. "$ROOT/scripts/lib-e2e.sh"
while (($#)); do
    case "$1" in
        --no-engine) engine=0; shift ;;
        --size) size="$2"; shift 2 ;;
        --iters) iters="$2"; shift 2 ;;
        --qp-timeout) qp_timeout="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) e2e_opt "$@" || { echo "bench-vhost: unknown argument $1" >&2; usage >&2; exit 2; }; shift "$E2E_SHIFT" ;;
    esac
done

E2E_NAME=bench-vhost
HERE="$ROOT/scripts"  # lib-e2e.sh finds build-guest-image.sh / setup-qemu.sh there
e2e_begin
e2e_prepare

if ((engine)); then
    say "in-process engine benchmark (cargo bench -p roce-model --bench engine)"
    (cd "$ROOT" && cargo bench -q -p roce-model --bench engine) >"$logdir/engine.txt" 2>"$logdir/engine.err" ||
        say "engine benchmark failed (see $logdir/engine.err)"
fi

A_IP=10.77.0.1 B_IP=10.77.0.2 HOST_IP=10.77.0.10
A_MAC=52:54:00:77:02:0a B_MAC=52:54:00:77:02:0b
G_PORT=18601 H_PORT=18600
d="$logdir"

# ---- guest side, shared: rxe0, the RoCE v2 GID index of our address, CPU
# samples ("ticks... uptime idle").
cat "$ROOT/scripts/guest/rdma-lib.sh" >"$d/common.sh"  # roce_gid_index
cat >>"$d/common.sh" <<'EOF'
rxe_up() {  # rxe_up MY_IP: sets gidx
    i=0; while [ "$(cat /sys/class/net/eth0/carrier 2>/dev/null)" != 1 ]; do i=$((i + 1)); [ $i -ge 30 ] && { echo 'BENCH-FAIL no carrier'; exit 10; }; sleep 1; done
    rdma link add rxe0 type rxe netdev eth0 || { echo 'BENCH-FAIL rdma link add'; exit 11; }
    gidx=$(roce_gid_index rxe0 "$1") || { echo 'BENCH-FAIL no RoCE v2 GID'; exit 13; }
    echo "RoCE v2 GID index: $gidx"
}
cpu_sample() { cat /proc/uptime; }
# busy_s BEFORE AFTER: elapsed - idle between two /proc/uptime samples
busy_s() { echo "$1 $2" | awk '{ printf "%.2f", ($3 - $1) - ($4 - $2) }'; }
wall_s() { echo "$1 $2" | awk '{ printf "%.2f", $3 - $1 }'; }
EOF

# (the job dir is the guest's /job: each script carries the shared part)
cp "$d/common.sh" "$d/a.sh"
cp "$d/common.sh" "$d/b.sh"
cat >>"$d/a.sh" <<EOF
echo "== \$VR_NAME: kernel \$(uname -r)"
rxe_up $A_IP
s0=\$(cpu_sample)
timeout $timeout ib_write_bw -d rxe0 -x \$gidx -u $qp_timeout -p $G_PORT -n $iters -s $size
rc=\$?
s1=\$(cpu_sample)
echo "BENCH target=guest role=server rc=\$rc busy_s=\$(busy_s "\$s0" "\$s1") wall_s=\$(wall_s "\$s0" "\$s1")"
exit \$rc
EOF

cat >>"$d/b.sh" <<EOF
echo "== \$VR_NAME: kernel \$(uname -r)"
rxe_up $B_IP
i=0; until ping -c 1 -W 2 $A_IP >/dev/null 2>&1 && ping -c 1 -W 2 $HOST_IP >/dev/null 2>&1; do
    i=\$((i + 1)); [ \$i -ge 60 ] && { echo 'BENCH-FAIL no ping'; exit 14; }; sleep 1; done
run() {  # run TARGET PEER PORT
    echo "== BENCH-RUN \$1"
    n=0
    while :; do
        s0=\$(cpu_sample)
        timeout $timeout ib_write_bw -d rxe0 -x \$gidx -u $qp_timeout -p \$3 -n $iters -s $size \$2 >/tmp/bw.out 2>&1
        rc=\$?
        s1=\$(cpu_sample)
        cat /tmp/bw.out
        # The server may not listen yet: the tool cannot connect and says so.
        if [ \$rc != 0 ] && grep -q "Couldn't connect\|Unable to open file descriptor" /tmp/bw.out && [ \$n -lt 60 ]; then
            n=\$((n + 1)); sleep 2; continue
        fi
        break
    done
    row=\$(grep -E '^[[:space:]]*$size[[:space:]]+$iters[[:space:]]' /tmp/bw.out | tail -n 1)
    set -- \$1 \$row
    echo "BENCH target=\$1 role=client rc=\$rc busy_s=\$(busy_s "\$s0" "\$s1") wall_s=\$(wall_s "\$s0" "\$s1") bytes=\${2:-0} iters=\${3:-0} peak_mibps=\${4:-0} avg_mibps=\${5:-0} mpps=\${6:-0}"
    return \$rc
}
run guest $A_IP $G_PORT; r1=\$?
run vhost $HOST_IP $H_PORT; r2=\$?
[ \$r1 = 0 ] && [ \$r2 = 0 ]
EOF

cat >"$d/vhost.toml" <<EOF
[[host]]
name = "vh"
address = "$HOST_IP/24"
[[host.service]]
kind = "write-bw-server"
port = $H_PORT
size = $size
iters = $iters
EOF
start_daemon "$d/a.sock" "$d/b.sock" "$d/ctl.sock" -- --config "$d/vhost.toml" \
    --port "a=$d/a.sock,mac=$A_MAC" --port "b=$d/b.sock,mac=$B_MAC" --control "$d/ctl.sock"

t0=$SECONDS
"$ROOT/scripts/run-guests" --qemu "$qemu" --image "$image" --accel "$accel" --timeout "$timeout" \
    --net vhost-user --logdir "$d" --no-fail-fast \
    --guest "a,ip=$A_IP/24,sock=$d/a.sock,mac=$A_MAC,cmd=$d/a.sh" \
    --guest "b,ip=$B_IP/24,sock=$d/b.sock,mac=$B_MAC,cmd=$d/b.sh" 2>&1 | tee "$d/run-guests.log"
rg=${PIPESTATUS[0]}
say "guests finished (run-guests exit $rg, $((SECONDS - t0))s)"
"$DAEMON" ctl --control "$d/ctl.sock" --json hosts >"$d/hosts.json" 2>&1
stop_daemon

# The table: the client's perftest row per target, CPU per GiB moved.
python3 - "$d" "$size" "$iters" "$accel" "$qp_timeout" >"$d/bench.md" <<'PY'
import json, re, sys
d, size, iters, accel, qp = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
rows = {}
for g in ("a", "b"):
    try:
        for ln in open(f"{d}/{g}.job/out.log", errors="replace"):
            m = re.match(r"^BENCH (.*)$", ln.strip())
            if m:
                r = dict(kv.split("=", 1) for kv in m.group(1).split() if "=" in kv)
                rows[(r["target"], r["role"])] = r
    except OSError:
        pass
try:
    svc = [s for h in json.load(open(f"{d}/hosts.json")) for s in h["services"] if s["kind"] == "write-bw-server"]
    host_msgs = svc[0]["last_iterations"] if svc else None
except (OSError, ValueError, KeyError):
    host_msgs = None
gib = size * iters / 2**30
f = lambda v, p=2: "?" if v is None else f"{v:.{p}f}"  # noqa: E731
num = lambda r, k: float(r[k]) if r and r.get(k) not in (None, "") else None  # noqa: E731
print(f"ib_write_bw -s {size} -n {iters} -u {qp} (RC, rxe, RoCE v2), guest B -> target; accel {accel}; 1 vCPU guests.")
print("MiB/s and msg/s: the client's perftest row (BW average, MsgRate); CPU: guest busy seconds "
      "(elapsed - idle) over the run per GiB moved.")
print()
print("| target | tool rc | MiB/s | peak MiB/s | msg/s | client guest CPU s/GiB | server guest CPU s/GiB | host counted |")
print("|---|---|---|---|---|---|---|---|")
res = {}
for t, label in (("guest", "guest A (rxe)"), ("vhost", "virtual host")):
    c, s = rows.get((t, "client")), rows.get((t, "server"))
    mib, mpps = num(c, "avg_mibps"), num(c, "mpps")
    cb, sb = num(c, "busy_s"), num(s, "busy_s")
    res[t] = mib
    print(f"| {label} | {c.get('rc', '?') if c else '?'} | {f(mib)} | {f(num(c, 'peak_mibps'))} "
          f"| {f(mpps * 1e6 if mpps is not None else None, 0)} | {f(cb / gib if cb is not None else None)} "
          f"| {f(sb / gib if sb is not None else None) if t == 'guest' else 'n/a (daemon)'} "
          f"| {host_msgs if t == 'vhost' else '-'} |")
if res.get("guest") and res.get("vhost"):
    print(f"\nvirtual host / guest throughput: {res['vhost'] / res['guest']:.2f}")
PY
if ((engine)) && [[ -s $d/engine.txt ]]; then
    echo "## In-process RC engine, engine to engine (cargo bench -p roce-model --bench engine, same run)"
    echo
    echo '```'
    grep -E '^(workload|memcpy|SEND|RDMA)' "$d/engine.txt"
    echo '```'
    echo
    echo "## ib_write_bw from guest B: to guest A vs to the virtual host"
    echo
fi
cat "$d/bench.md"
# an SVG chart next to the table; a failed plot never fails the benchmark
"$ROOT/scripts/guest-results" plot "$d/bench.md" "$d/bench.svg" --title "ib_write_bw from guest B" >&2 || true
out_b="$d/b.job/out.log"
for t in guest vhost; do
    line="$(grep "^BENCH target=$t role=client" "$out_b" 2>/dev/null | tail -n 1)"
    hc="$(python3 -c 'import json,sys; print([s for h in json.load(open(sys.argv[1])) for s in h["services"]][0]["last_iterations"])' "$d/hosts.json" 2>/dev/null)"
    if [[ $t == vhost && ${hc:-0} -lt $iters ]]; then
        record FAIL "guest-$t" "host write-bw-server counted ${hc:-nothing}, want >= $iters (logs: $d)"
    elif [[ $line == *" rc=0 "* && $line != *"avg_mibps=0 "* ]]; then
        record PASS "guest-$t" "${line#BENCH }"
    else
        record FAIL "guest-$t" "${line:-no BENCH line} (logs: $d)"
    fi
done
finish

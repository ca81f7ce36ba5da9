#!/usr/bin/env bash
# The main job on a fresh machine: installs what is missing, builds the
# daemon and the guest tool, builds (or takes from the cache) a guest image
# with Linux 7.3 and QEMU 11.1 from Debian packages, starts the vhost-rdma
# daemon with two ports and a control socket, and boots two unmodified guests
# wired to it. The guests ping each other, stream 256 MiB of verified TCP data,
# run iperf3 for a few seconds and create an rxe device on eth0. At the end the
# daemon's counters are shown with `vhost-rdma ctl status`.
#
#   scripts/demo.sh [--queues N] [--form pci|testdev] [--bytes SIZE]
set -euo pipefail
ROOT="$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)"
CACHE="${VHOST_RDMA_CACHE:-$HOME/.cache/vhost-rdma}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE/target}"
queues=1 form=pci bytes=256M
while (($#)); do
    case "$1" in
        --queues) queues="$2"; shift 2 ;;
        --form) form="$2"; shift 2 ;;
        --bytes) bytes="$2"; shift 2 ;;
        -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
        *) echo "demo: unknown argument $1" >&2; exit 2 ;;
    esac
done
say() { printf '\n[demo] %s\n' "$*"; }

say "installing missing prerequisites"
"$ROOT/scripts/install-deps.sh"
say "building vhost-rdma and smc-guest-tests (release)"
(cd "$ROOT" && cargo build --release -p vhost-rdma -p smc-guest-tests)
BIN="$CARGO_TARGET_DIR/release"
say "guest image (Linux 7.3 + Debian trixie userland)"
image="$("$ROOT/scripts/build-guest-image.sh" --kernel 7.3 | tail -n 1)"
say "QEMU 11.1 (trixie-backports, extracted root)"
qemu="$("$ROOT/scripts/setup-qemu.sh" | tail -n 1)"

run="$(mktemp -d "${TMPDIR:-/tmp}/vhost-rdma-demo.XXXXXX")"
mkdir -p "$run/vrbin/bin"
cp "$BIN/smc-guest-tests" "$run/vrbin/bin/"
say "starting the daemon: two ports, control socket $run/ctl.sock"
"$BIN/vhost-rdma" serve \
    --port "a=$run/a.sock,mac=52:54:00:00:00:0a,queues=$queues,form=$form" \
    --port "b=$run/b.sock,mac=52:54:00:00:00:0b,queues=$queues,form=$form" \
    --control "$run/ctl.sock" 2>"$run/daemon.log" &
daemon=$!
trap 'kill $daemon 2>/dev/null; wait $daemon 2>/dev/null' EXIT
for _ in $(seq 50); do [[ -S $run/ctl.sock ]] && break; sleep 0.1; done

lq=""; ((queues > 1)) && lq="ethtool -L eth0 combined $queues"
cat >"$run/a.sh" <<JOB
$lq
ip -br addr show eth0
ping -c 3 -W 5 10.77.0.2 || exit 1
smc-guest-tests stream server --proto tcp --port 7777 --bytes $bytes --seed 1 --once --accept-timeout 300 || exit 2
timeout 120 iperf3 -s -1 || exit 3
rdma link add rxe0 type rxe netdev eth0 && rdma link show
JOB
cat >"$run/b.sh" <<JOB
$lq
i=0; until ping -c 1 -W 2 10.77.0.1 >/dev/null 2>&1; do i=\$((i+1)); [ \$i -ge 60 ] && break; sleep 1; done
ping -c 3 -W 5 10.77.0.1 || exit 1
smc-guest-tests stream client --proto tcp --addr 10.77.0.1 --port 7777 --bytes $bytes --seed 1 --connect-timeout 120 || exit 2
i=0; until iperf3 -c 10.77.0.1 -t 5; do i=\$((i+1)); [ \$i -ge 20 ] && exit 3; sleep 1; done
JOB
say "booting two guests (TCG unless KVM really boots them)"
rc=0
"$ROOT/scripts/run-guests" --qemu "$qemu" --image "$image" --form "$form" --queues "$queues" \
    --guest-bin "$run/vrbin" --logdir "$run/logs" --timeout 900 \
    --guest "a,ip=10.77.0.1/24,sock=$run/a.sock,mac=52:54:00:00:00:0a,cmd=$run/a.sh" \
    --guest "b,ip=10.77.0.2/24,sock=$run/b.sock,mac=52:54:00:00:00:0b,cmd=$run/b.sh" || rc=$?
say "what the guests measured"
grep -hE "STREAM-RESULT|sender|receiver" "$run"/logs/*.console.log || true
say "daemon counters (vhost-rdma ctl --control $run/ctl.sock status)"
"$BIN/vhost-rdma" ctl --control "$run/ctl.sock" status
say "logs: $run (daemon.log, logs/*.console.log)"
exit $rc

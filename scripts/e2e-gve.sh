#!/usr/bin/env bash
# End-to-end test of the emulated gVNIC: the daemon serves a `kind=gve` port
# over vfio-user and a virtio-net port; guest A (10.77.0.1) has the gve NIC
# (QEMU -device vfio-user-pci, the unmodified 7.3 gve driver, 2 vCPUs),
# guest B (10.77.0.2) a virtio-net NIC. The gve port is the README's
# `--port g=...,kind=gve` line as written there (only the socket directory
# changes): no queues=, so every case below runs on the defaults a new user
# gets, and ncdevmem picks its queue itself as the docs show it.
#
# Cases (guest A runs them in order; B serves and sends):
#   readme-port  the daemon runs the README's gve port line unchanged
#   probe        gve binds in DQO RDA mode (driver messages, ethtool -i)
#   ping         A pings B
#   tcp-a-to-b   256 MiB of verified TCP from A (gve TX: TSO, checksums)
#   tcp-b-to-a   256 MiB of verified TCP to A (gve RX: header split, RSS)
#   header-split ethtool -G tcp-data-split on: the stream to A arrives split
#                (guest rx_hsplit_pkt and the device's split packets grow)
#   channels     ethtool -l shows the default 2 queues (max and current, as
#                the driver brought them up); ethtool -L rx 2 tx 2
#   rss          ethtool -x shows a 128-entry table and a 40-byte key;
#                ethtool -X weight 2 1 reaches the device (ctl status;
#                not `equal 2`: on 2 queues that is the default table,
#                which the device keeps following the queue count)
#   ntuple       ethtool -N flow-type tcp4 dst-port 5203 action 1: that
#                flow's 16 MiB arrive on queue 1, per the guest's counters
#                and the device's (rule hits, queue 1 packets)
#   devmem-selfcheck  the unmodified 7.3 ncdevmem (scripts/build-ncdevmem.sh)
#                without -s/-c checks the devmem API on the gve queues
#   devmem-rx    ncdevmem, without -t/-q as in docs/gve-devmem.md, takes the
#                last queue (1) of the default two, binds a udmabuf to it and
#                receives 64 MiB from B (smc-guest-tests devmem-send), every
#                byte validated (-v 7); the device placed the headers in
#                header buffers
#   devmem-after once ncdevmem exits, ping and a verified 16 MiB stream work
#   devmem-hds-off with header split off, binding a dmabuf is refused
#
# Prints PASS/FAIL per case and ends with "N passed, M failed, K skipped".
set -uo pipefail

HERE="$(cd "$(dirname "$(readlink -f "$0")")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
CASES=(readme-port probe ping channels tcp-a-to-b tcp-b-to-a header-split rss ntuple
    devmem-selfcheck devmem-rx devmem-after devmem-hds-off)

usage() {
    cat <<EOF
Usage: ${0##*/} [options]
$(e2e_opts_usage)
  --bytes SIZE       bytes of each TCP stream (default 256M)
EOF
}

build=1 profile=release image="" qemu="" bytes=256M timeout=900 logdir="" keep_logs=0 accel=auto kernel_image="" kernel_append=""
E2E_KERNEL_OPT=1
# shellcheck source=scripts/lib-e2e.sh
. "$HERE/lib-e2e.sh"
while (($#)); do
    case "$1" in
        --bytes) bytes="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) e2e_opt "$@" || { echo "e2e-gve: unknown argument $1" >&2; usage >&2; exit 2; }; shift "$E2E_SHIFT" ;;
    esac
done

E2E_NAME=e2e-gve
e2e_begin
e2e_prepare smc-guest-tests
if ! "$qemu" -machine none -device help 2>/dev/null | grep -q '"vfio-user-pci"'; then
    fail_all "$qemu has no vfio-user-pci device (QEMU >= 10.1 needed)"
fi

d="$logdir"
vrbin="$d/vrbin"
mkdir -p "$vrbin/bin"
cp -f "$SGT" "$vrbin/bin/smc-guest-tests"
say "ncdevmem: scripts/build-ncdevmem.sh"
NCD_DIR="$("$HERE/build-ncdevmem.sh" 2>"$d/ncdevmem.log" | tail -n 1)" || NCD_DIR=""
[[ -n $NCD_DIR && -x $NCD_DIR/ncdevmem ]] || fail_all "scripts/build-ncdevmem.sh failed (see $d/ncdevmem.log)"
cp -f "$NCD_DIR/ncdevmem" "$vrbin/bin/ncdevmem"
A=10.77.0.1 B=10.77.0.2 MACB=52:54:00:77:00:02
# The README's gve port, unchanged but for where its socket lives: what a
# new user starts, so the cases test the defaults (issue 27).
readme_gve="$(grep -oE -- '--port g=/run/vhost-rdma/g\.sock,kind=gve[^ ]*' "$ROOT/README.md" | head -n 1)"
readme_gve="${readme_gve#--port }"
[[ -n $readme_gve ]] || fail_all "README.md shows no '--port g=/run/vhost-rdma/g.sock,kind=gve...' line"
GVE_PORT="${readme_gve//\/run\/vhost-rdma\//$d/}"

# ---- guest A (gve): every case prints "CASE <name> rc=<n> <detail>"
cat >"$d/a.sh" <<EOF
case_() { echo "CASE \$1 rc=\$2 \$3"; }
echo "== \$VR_NAME: kernel \$(uname -r)"
dmesg | grep -i ' gve ' | sed 's/^/DMESG /'
drv=\$(ethtool -i eth0 2>/dev/null | sed -n 's/^driver: //p')
dmesg | grep -q 'DQO RDA queue format' && [ "\$drv" = gve ]; case_ probe \$? "driver=\$drv"
i=0; while [ "\$(cat /sys/class/net/eth0/carrier 2>/dev/null)" != 1 ]; do i=\$((i+1)); [ \$i -ge 30 ] && break; sleep 1; done
i=0; until ping -c 1 -W 2 $B >/dev/null 2>&1; do i=\$((i+1)); [ \$i -ge 90 ] && break; sleep 1; done
ping -c 3 -W 5 $B; case_ ping \$? ""
ethtool -l eth0 | sed 's/^/CHAN /'
max_rx=\$(ethtool -l eth0 | awk '/Pre-set/{p=1} p && /^RX:/{print \$2; exit}')
boot_rx=\$(ethtool -l eth0 | awk '/Current/{p=1} p && /^RX:/{print \$2; exit}')
ethtool -L eth0 rx 2 tx 2; rc=\$?
cur_rx=\$(ethtool -l eth0 | awk '/Current/{p=1} p && /^RX:/{print \$2; exit}')
[ \$rc = 0 ] && [ "\$max_rx" = 2 ] && [ "\$boot_rx" = 2 ] && [ "\$cur_rx" = 2 ]
case_ channels \$? "max_rx=\$max_rx at_boot_rx=\$boot_rx current_rx=\$cur_rx"
ethtool -G eth0 tcp-data-split on; hs_rc=\$?
ethtool -g eth0 | sed 's/^/RING /'
hs0=\$(ethtool -S eth0 | sed -n 's/^ *rx_hsplit_pkt: //p')
smc-guest-tests stream client --proto tcp --addr $B --port 5201 --bytes $bytes --seed 71 --connect-timeout 180
case_ tcp-a-to-b \$? ""
smc-guest-tests stream server --proto tcp --addr $A --port 5202 --bytes $bytes --seed 72 --once --accept-timeout 300
case_ tcp-b-to-a \$? ""
hs1=\$(ethtool -S eth0 | sed -n 's/^ *rx_hsplit_pkt: //p')
[ \$hs_rc = 0 ] && [ \$((hs1 - hs0)) -gt 1000 ]; case_ header-split \$? "guest_rx_hsplit_pkt=\$((hs1 - hs0))"
ethtool -x eth0 | sed 's/^/RSS /'
n=\$(ethtool -x eth0 | grep -cE '^ *[0-9]+: ')
keylen=\$(ethtool -x eth0 | sed -n '/RSS hash key/{n;p}' | tr ':' '\n' | grep -c .)
ethtool -X eth0 weight 2 1; rc=\$?
[ \$rc = 0 ] && [ \$n -ge 16 ]; case_ rss \$? "table_rows=\$n key_bytes=\$keylen"
echo "RSSKEY \$keylen"
ethtool -K eth0 ntuple on
ethtool -N eth0 flow-type tcp4 dst-port 5203 action 1; rc=\$?
ethtool -n eth0 | sed 's/^/NTUPLE /'
b1=\$(ethtool -S eth0 | sed -n 's/^ *rx_bytes\[1\]: //p')
b0=\$(ethtool -S eth0 | sed -n 's/^ *rx_bytes\[0\]: //p')
echo "QBEFORE rx0=\$b0 rx1=\$b1 rule_rc=\$rc"
smc-guest-tests stream server --proto tcp --addr $A --port 5203 --bytes 16M --seed 73 --once --accept-timeout 300
src=\$?
a1=\$(ethtool -S eth0 | sed -n 's/^ *rx_bytes\[1\]: //p')
a0=\$(ethtool -S eth0 | sed -n 's/^ *rx_bytes\[0\]: //p')
echo "QAFTER rx0=\$a0 rx1=\$a1"
[ \$rc = 0 ] && [ \$src = 0 ] && [ \$((a1 - b1)) -ge 16000000 ]; case_ ntuple \$? "queue1_bytes=\$((a1 - b1)) queue0_bytes=\$((a0 - b0))"
ethtool -S eth0 | grep -E '^ *(rx_packets|rx_hsplit_pkt|tx_packets|rx_bytes\[|rx_hsplit_bytes\[)' | sed 's/^ */STAT /'
# hold the device's state (rules, RSS table) until the host has read it
touch /job/snapshot-ready
i=0; while [ ! -e /job/snapshot-done ] && [ \$i -lt 60 ]; do i=\$((i+1)); sleep 1; done
ethtool -N eth0 delete 63 2>/dev/null; ethtool -n eth0 | sed 's/^/RULES /'
# devmem-selfcheck: without -s/-c ncdevmem checks the devmem API (empty queue
# list refused, bind with header split off refused, bind with it on works,
# shrinking channels under a bound queue refused)
ncdevmem -f eth0 > /tmp/sc.log 2>&1; rc=\$?; sed 's/^/SELFCHECK /' /tmp/sc.log
case_ devmem-selfcheck \$rc "\$(grep -c 'got dmabuf id' /tmp/sc.log) bind(s)"
# devmem-rx: 64 MiB from B into a udmabuf bound to queue 1, validated (-v 7)
ncdevmem -l -f eth0 -s $A -c $B -p 5204 -v 7 > /tmp/rx.out 2> /tmp/rx.err; rc=\$?
grep -E 'using queues|too low' /tmp/rx.err | sed 's/^/DEVMEMQ /'
tot=\$(sed -n 's/^total_received=//p' /tmp/rx.err | tail -n 1)
bad=\$(grep -c 'Failed validation' /tmp/rx.err); frags=\$(grep -c 'Validated buffer' /tmp/rx.out)
grep -vE '^(recvmsg ret|received frag|total_received)' /tmp/rx.err | sed 's/^/DEVMEM /'
[ \$rc = 0 ] && [ "\$tot" = 67108864 ] && [ "\$bad" = 0 ]
case_ devmem-rx \$? "total_received=\$tot validated_frags=\$frags failed=\$bad"
# devmem-after: the queue takes ordinary pages again; plain TCP works
ethtool -g eth0 | grep -i 'split' | sed 's/^/AFTER /'
ping -c 3 -W 5 $B; r1=\$?
smc-guest-tests stream server --proto tcp --addr $A --port 5206 --bytes 16M --seed 74 --once --accept-timeout 300; r2=\$?
[ \$r1 = 0 ] && [ \$r2 = 0 ]; case_ devmem-after \$? "ping=\$r1 stream=\$r2"
# devmem-hds-off: with header split off, binding a dmabuf is refused
ethtool -G eth0 tcp-data-split off
ncdevmem -l -n -f eth0 -s $A -p 5205 -t 1 -q 1 > /tmp/off.log 2>&1; rc=\$?; sed 's/^/HDSOFF /' /tmp/off.log
[ \$rc != 0 ] && grep -q "tcp-data-split is disabled" /tmp/off.log
case_ devmem-hds-off \$? "\$(grep -o "Kernel error: .*" /tmp/off.log | head -n 1)"
exit 0
EOF

# ---- guest B (virtio-net): serves A's stream, then sends to A twice
cat >"$d/b.sh" <<EOF
echo "== \$VR_NAME: kernel \$(uname -r)"
i=0; until ping -c 1 -W 2 $A >/dev/null 2>&1; do i=\$((i+1)); [ \$i -ge 120 ] && break; sleep 1; done
smc-guest-tests stream server --proto tcp --addr $B --port 5201 --bytes $bytes --seed 71 --once --accept-timeout 300; r1=\$?
smc-guest-tests stream client --proto tcp --addr $A --port 5202 --bytes $bytes --seed 72 --connect-timeout 300; r2=\$?
smc-guest-tests stream client --proto tcp --addr $A --port 5203 --bytes 16M --seed 73 --connect-timeout 300; r3=\$?
smc-guest-tests devmem-send --to $A:5204 --bind $B:5204 --bytes 64M --pattern-mod 7 --connect-timeout 300; r4=\$?
smc-guest-tests stream client --proto tcp --addr $A --port 5206 --bytes 16M --seed 74 --connect-timeout 300; r5=\$?
echo "B-RESULT server=\$r1 client=\$r2 steered=\$r3 devmem-send=\$r4 after=\$r5"
exit \$((r1 + r2 + r3 + r4 + r5))
EOF

start_daemon "$d/g.sock" "$d/v.sock" "$d/ctl.sock" -- \
    --port "$GVE_PORT" \
    --port "v=$d/v.sock,mac=$MACB" \
    --control "$d/ctl.sock"

RG_A=(--net none --smp 2
    --qemu-arg=-device --qemu-arg="{\"driver\":\"vfio-user-pci\",\"socket\":{\"type\":\"unix\",\"path\":\"$d/g.sock\"}}"
    --guest "a,ip=$A/24,cmd=$d/a.sh")
RG_B=(--net vhost-user --guest "b,ip=$B/24,sock=$d/v.sock,mac=$MACB,cmd=$d/b.sh")
snap=0
e2e_tick() {  # once guest A is ready: the device as it left it (rules, RSS table, queues)
    ((!snap)) && [[ -e $d/ga/a.job/snapshot-ready ]] || return 0
    "$DAEMON" ctl --control "$d/ctl.sock" status | tee "$d/ctl-status-live.txt" | sed 's/^/    /'
    "$DAEMON" ctl --control "$d/ctl.sock" status --json >"$d/ctl-status-live.json" 2>&1
    touch "$d/ga/a.job/snapshot-done"
    snap=1
}
e2e_run_pair
stop_daemon
grep -E 'panicked' "$d/daemon.log" | tail -5

out="$d/ga/a.job/out.log"
[[ -f $out ]] || out=/dev/null
case_line() { grep -E "^CASE $1 rc=" "$out" | tail -n 1; }
dev() {  # dev PYTHON-EXPR [FILE]: over the gve status s (default: as guest A left its rules)
    python3 -c "import json,sys; s=json.load(open(sys.argv[1]))['devices'][0]['gve']; print($1)" "${2:-$d/ctl-status-live.json}" 2>/dev/null
}
for c in "${CASES[@]}"; do
    if [[ $c == readme-port ]]; then
        # the README's form is the default form: no queues= to lean on
        if [[ $readme_gve == *queues=* ]]; then
            record FAIL "$c" "README's gve line sets queues= ($readme_gve): no longer the defaults"
        else
            record PASS "$c" "--port $readme_gve (socket in $d)"
        fi
        continue
    fi
    line="$(case_line "$c")"
    if [[ -z $line ]]; then
        record FAIL "$c" "guest A never reported it (run-guests A exit $ra; $d/ga/a.console.log)"
        continue
    fi
    detail="${line#* rc=* }"
    [[ $detail == "$line" ]] && detail=""
    extra=""
    case "$c" in
        tcp-a-to-b|tcp-b-to-a)
            # A's first stream result is its client (A to B), the second its server
            n=1; [[ $c == tcp-b-to-a ]] && n=2
            sr="$(grep -h '^STREAM-RESULT' "$out" 2>/dev/null | sed -n "${n}p")"
            extra=" $(grep -oE 'verified=[0-9]+|mibps=[0-9.]+' <<<"$sr" | tr '\n' ' ')"
            [[ $sr == *verified=1* ]] || line="${line/rc=0/rc=1}" ;;
        rss)
            tab="$(dev "len(s['rss']['indirection_table']), s['rss']['table_configured'], len(s['rss']['key'])")"
            extra=" device table/configured/key: $tab"
            [[ $tab == "128 True 40" ]] || line="${line/rc=0/rc=1}" ;;
        header-split)
            hs="$(dev "sum(q['hsplit_packets'] for q in s['counters']['rx_queues'])")"
            hb="$(dev "sum(q['header_bytes'] for q in s['counters']['rx_queues']), sum(q['payload_bytes'] for q in s['counters']['rx_queues'])")"
            extra=" device: split packets ${hs:-?}, header/payload bytes ${hb:-?}"
            [[ ${hs:-0} -gt 1000 ]] || line="${line/rc=0/rc=1}" ;;
        devmem-rx)
            # counters survive the device reset at the guest's exit
            hs1="$(dev "s['counters']['rx_queues'][1]['hsplit_packets']" "$d/ctl-status.json")"
            hb="$(dev "s['counters']['rx_queues'][1]['header_bytes'], s['counters']['rx_queues'][1]['payload_bytes']" "$d/ctl-status.json")"
            extra=" device queue 1: split packets ${hs1:-?}, header/payload bytes ${hb:-?}"
            # 64 MiB / MSS 1448 = 46 347 segments, each split
            [[ ${hs1:-0} -ge 46000 ]] || line="${line/rc=0/rc=1}" ;;
        ntuple)
            hits="$(dev "sum(r['hits'] for r in s['flow_rules'])")"
            q1="$(dev "s['counters']['rx_queues'][1]['packets']")"
            extra=" device: rule hits ${hits:-?}, queue 1 packets ${q1:-?}"
            [[ ${hits:-0} -gt 0 && ${q1:-0} -gt 0 ]] || line="${line/rc=0/rc=1}" ;;
    esac
    if [[ $line == *" rc=0"* ]]; then
        record PASS "$c" "$detail$extra"
    else
        record FAIL "$c" "$detail$extra (see $out)"
    fi
done
finish

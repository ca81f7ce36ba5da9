#!/usr/bin/env bash
# End-to-end test of the emulated erdma function (RoCEv2 RC queue pairs run
# by the daemon): guest A (10.77.0.1) has a virtio-net port `a` and an erdma
# function `r` (`kind=erdma,netdev=a`, QEMU -device vfio-user-pci) bound to
# its eth0; guest B (10.77.0.2) runs rxe over virtio-net. The unmodified 7.3
# erdma driver and rdma-core's liberdma run against the daemon.
#
# Cases (A's role first):
#   rdma-link                 rdma link: erdma_0 on eth0, ACTIVE, RoCE v2 GID
#   pingpong-server/-client   ibv_rc_pingpong, 200 iterations
#   write-bw-server/-client   ib_write_bw, 200 iterations
#   read-bw-client/-server    ib_read_bw, 200 iterations
#   send-bw-client/-server    ib_send_bw, 200 iterations
#                             (a perftest case needs exit 0 and its 65536-byte row)
#   rping-server/-client      rping -V (rdma_cm over the GSI QP), 10 pings verified
#   ucmatose-server/-client   ucmatose (rdma_cm connect, send, disconnect)
#   pingpong-vhost            ibv_rc_pingpong (1000 iterations) against a
#                             virtual host (10.77.0.10): both RC ends run
#                             in the daemon, one behind the erdma function
#   loopback-pingpong         ibv_rc_pingpong, 200 iterations, both ends in
#                             guest A: two QPs of one erdma function, through
#                             the function's loopback
#   loopback-write-bw         ib_write_bw, 200 iterations, likewise
#
# Prints PASS/FAIL per case and ends with "N passed, M failed, K skipped".
set -uo pipefail

HERE="$(cd "$(dirname "$(readlink -f "$0")")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
CASES=(rdma-link pingpong-server pingpong-client write-bw-server write-bw-client
    read-bw-client send-bw-client read-bw-server send-bw-server rping-server rping-client ucmatose-server ucmatose-client
    pingpong-vhost loopback-pingpong loopback-write-bw)

usage() {
    cat <<EOF
Usage: ${0##*/} [options]
$(e2e_opts_usage)
EOF
}

build=1 profile=release image="" qemu="" timeout=900 logdir="" keep_logs=0 accel=auto kernel_image="" kernel_append=""
E2E_KERNEL_OPT=1
# shellcheck source=scripts/lib-e2e.sh
. "$HERE/lib-e2e.sh"
E2E_NAME=e2e-erdma
e2e_opts_only "$@"

e2e_begin
e2e_prepare
if ! "$qemu" -machine none -device help 2>/dev/null | grep -q '"vfio-user-pci"'; then
    fail_all "$qemu has no vfio-user-pci device (QEMU >= 10.1 needed)"
fi
d="$logdir"
A=10.77.0.1 B=10.77.0.2 MACA=52:54:00:77:00:01 MACB=52:54:00:77:00:02

# Shared by both guests: helpers and the RoCE v2 GID index of an address.
cat "$HERE/guest/rdma-lib.sh" "$HERE/guest/e2e-guest-lib.sh" >"$d/common.sh"

cat >"$d/a.sh" <<EOF
. /opt/vr/common.sh
echo "== \$VR_NAME (erdma): kernel \$(uname -r)"
dmesg | grep -i erdma | sed 's/^/DMESG /'
i=0; until ping -c 1 -W 2 $B >/dev/null 2>&1; do i=\$((i+1)); [ \$i -ge 120 ] && break; sleep 1; done
rdma link | sed 's/^/LINK /'
g=\$(roce_gid_index erdma_0 $A)
rdma link | grep -q 'erdma_0/1 state ACTIVE .*netdev eth0' && [ -n "\$g" ]; case_ rdma-link \$? "gid_index=\$g"
timeout 180 ibv_rc_pingpong -d erdma_0 -g \$g -p 18515 -n 200; case_ pingpong-server \$? ""
retry 60 timeout 180 ibv_rc_pingpong -d erdma_0 -g \$g -p 18516 -n 200 $B; case_ pingpong-client \$? ""
timeout 300 ib_write_bw -d erdma_0 -x \$g -p 18517 -n 200 > /tmp/w.log 2>&1; rc=\$?; cat /tmp/w.log
row_ok \$rc /tmp/w.log; case_ write-bw-server \$? "\$(awk '/^ *65536/ {print \$4 " MB/s"}' /tmp/w.log)"
retry 60 timeout 300 ib_write_bw -d erdma_0 -x \$g -p 18518 -n 200 $B > /tmp/w2.log 2>&1; rc=\$?; cat /tmp/w2.log
row_ok \$rc /tmp/w2.log; case_ write-bw-client \$? "\$(awk '/^ *65536/ {print \$4 " MB/s"}' /tmp/w2.log)"
retry 60 timeout 300 ib_read_bw -d erdma_0 -x \$g -p 18519 -n 200 $B > /tmp/r.log 2>&1; rc=\$?; cat /tmp/r.log
row_ok \$rc /tmp/r.log; case_ read-bw-client \$? "\$(awk '/^ *65536/ {print \$4 " MB/s"}' /tmp/r.log)"
retry 60 timeout 300 ib_send_bw -d erdma_0 -x \$g -p 18520 -n 200 $B > /tmp/s.log 2>&1; rc=\$?; cat /tmp/s.log
row_ok \$rc /tmp/s.log; case_ send-bw-client \$? "\$(awk '/^ *65536/ {print \$4 " MB/s"}' /tmp/s.log)"
timeout 300 ib_read_bw -d erdma_0 -x \$g -p 18521 -n 200 > /tmp/r3.log 2>&1; rc=\$?; cat /tmp/r3.log
row_ok \$rc /tmp/r3.log; case_ read-bw-server \$? "\$(awk '/^ *65536/ {print \$4 " MB/s"}' /tmp/r3.log)"
timeout 300 ib_send_bw -d erdma_0 -x \$g -p 18522 -n 200 > /tmp/s3.log 2>&1; rc=\$?; cat /tmp/s3.log
row_ok \$rc /tmp/s3.log; case_ send-bw-server \$? "\$(awk '/^ *65536/ {print \$4 " MB/s"}' /tmp/s3.log)"
timeout 180 rping -s -a $A -p 7174 -v -V -C 10 > /tmp/rp.log 2>&1; cat /tmp/rp.log | tail -3
rping_ok /tmp/rp.log; case_ rping-server \$? "\$(rping_pings /tmp/rp.log) pings"
sleep 3
retry 30 sh -c "timeout 120 rping -c -a $B -p 7175 -v -V -C 10 > /tmp/rp2.log 2>&1; grep -q 'ping data:' /tmp/rp2.log"
cat /tmp/rp2.log | tail -3
rping_ok /tmp/rp2.log; case_ rping-client \$? "\$(rping_pings /tmp/rp2.log) pings"
timeout 180 ucmatose -b $A -p 7471 -C 10 > /tmp/u.log 2>&1; rc=\$?; cat /tmp/u.log
case_ ucmatose-server \$rc ""
retry 30 timeout 120 ucmatose -s $B -p 7472 -C 10 > /tmp/u2.log 2>&1; rc=\$?; cat /tmp/u2.log
case_ ucmatose-client \$rc ""
retry 10 timeout 180 ibv_rc_pingpong -d erdma_0 -g \$g 10.77.0.10 > /tmp/vh.log 2>&1; rc=\$?; cat /tmp/vh.log
[ \$rc = 0 ] && grep -q '^1000 iters' /tmp/vh.log; case_ pingpong-vhost \$? "\$(grep iters /tmp/vh.log)"
# Both ends on this guest's erdma_0: two QPs of one function.
timeout 180 ibv_rc_pingpong -d erdma_0 -g \$g -p 18530 -n 200 > /tmp/lps.log 2>&1 &
retry 30 timeout 120 ibv_rc_pingpong -d erdma_0 -g \$g -p 18530 -n 200 $A > /tmp/lp.log 2>&1; rc=\$?; wait; cat /tmp/lp.log
[ \$rc = 0 ] && grep -q '^200 iters' /tmp/lp.log; case_ loopback-pingpong \$? "\$(grep iters /tmp/lp.log)"
timeout 300 ib_write_bw -d erdma_0 -x \$g -p 18531 -n 200 > /tmp/lws.log 2>&1 &
retry 30 timeout 300 ib_write_bw -d erdma_0 -x \$g -p 18531 -n 200 $A > /tmp/lw.log 2>&1; rc=\$?; wait; cat /tmp/lw.log
row_ok \$rc /tmp/lw.log; case_ loopback-write-bw \$? "\$(awk '/^ *65536/ {print \$4 " MB/s"}' /tmp/lw.log)"
exit 0
EOF

cat >"$d/b.sh" <<EOF
. /opt/vr/common.sh
echo "== \$VR_NAME (rxe): kernel \$(uname -r)"
rdma link add rxe0 type rxe netdev eth0
i=0; until ping -c 1 -W 2 $A >/dev/null 2>&1; do i=\$((i+1)); [ \$i -ge 120 ] && break; sleep 1; done
g=\$(roce_gid_index rxe0 $B)
retry 60 timeout 180 ibv_rc_pingpong -d rxe0 -g \$g -p 18515 -n 200 $A; echo "B pingpong-client rc=\$?"
timeout 180 ibv_rc_pingpong -d rxe0 -g \$g -p 18516 -n 200; echo "B pingpong-server rc=\$?"
retry 60 timeout 300 ib_write_bw -d rxe0 -x \$g -p 18517 -n 200 $A; echo "B write-bw-client rc=\$?"
timeout 300 ib_write_bw -d rxe0 -x \$g -p 18518 -n 200; echo "B write-bw-server rc=\$?"
timeout 300 ib_read_bw -d rxe0 -x \$g -p 18519 -n 200; echo "B read-bw-server rc=\$?"
timeout 300 ib_send_bw -d rxe0 -x \$g -p 18520 -n 200; echo "B send-bw-server rc=\$?"
retry 60 timeout 300 ib_read_bw -d rxe0 -x \$g -p 18521 -n 200 $A; echo "B read-bw-client rc=\$?"
retry 60 timeout 300 ib_send_bw -d rxe0 -x \$g -p 18522 -n 200 $A; echo "B send-bw-client rc=\$?"
sleep 3
retry 30 sh -c "timeout 120 rping -c -a $A -p 7174 -v -V -C 10 > /tmp/rp.log 2>&1; grep -q 'ping data:' /tmp/rp.log"
tail -3 /tmp/rp.log
timeout 180 rping -s -a $B -p 7175 -v -V -C 10 > /tmp/rp2.log 2>&1; tail -3 /tmp/rp2.log
retry 30 timeout 120 ucmatose -s $A -p 7471 -C 10; echo "B ucmatose-client rc=\$?"
timeout 180 ucmatose -b $B -p 7472 -C 10; echo "B ucmatose-server rc=\$?"
exit 0
EOF
vrbin="$d/vrbin"
mkdir -p "$vrbin/bin"
cp "$d/common.sh" "$vrbin/common.sh"

start_daemon "$d/a.sock" "$d/r.sock" "$d/b.sock" "$d/ctl.sock" -- \
    --port "a=$d/a.sock,mac=$MACA" \
    --port "r=$d/r.sock,kind=erdma,netdev=a" \
    --port "b=$d/b.sock,mac=$MACB" \
    --host "vh=10.77.0.10/24,service=pingpong-server" \
    --control "$d/ctl.sock"

RG_A=(--net vhost-user
    --qemu-arg=-device --qemu-arg="{\"driver\":\"vfio-user-pci\",\"socket\":{\"type\":\"unix\",\"path\":\"$d/r.sock\"}}"
    --guest "a,ip=$A/24,sock=$d/a.sock,mac=$MACA,cmd=$d/a.sh")
RG_B=(--net vhost-user --guest "b,ip=$B/24,sock=$d/b.sock,mac=$MACB,cmd=$d/b.sh")
e2e_run_pair
stop_daemon
grep -E 'panicked' "$d/daemon.log" | tail -5

out="$d/ga/a.job/out.log"
[[ -f $out ]] || out=/dev/null
for c in "${CASES[@]}"; do
    line="$(grep -E "^CASE $c rc=" "$out" | tail -n 1)"
    if [[ -z $line ]]; then
        record FAIL "$c" "guest A never reported it (run-guests A exit $ra; $d/ga/a.console.log)"
    elif [[ $line == *" rc=0"* ]]; then
        record PASS "$c" "${line#* rc=0}"
    else
        record FAIL "$c" "${line#CASE $c } (see $out)"
    fi
done
finish

#!/usr/bin/env bash
# Guest a (10.77.0.1) with virtio-net and an emulated erdma function (the
# daemon's kind=erdma port over vfio-user, paired with a's virtio-net port:
# same MAC; its RC queue pairs run in the daemon) and guest b (10.77.0.2)
# with rxe over virtio-net; ibv_rc_pingpong between erdma_0 and rxe0.
# Needs QEMU >= 10.1 (vfio-user-pci): QEMU=$(scripts/setup-qemu.sh | tail -n1).
#   IMAGE=... QEMU=... qemu-configs/erdma-2guests.sh    (PRINT=1 to only print)
FORM=pci
. "$(dirname "$0")/common.sh"
vr_daemon a:erdma b
gid='g=""; for t in $(seq 20); do for f in /sys/class/infiniband/$D/ports/1/gids/*; do [ "$(cat $f)" = "$W" ] && g=${f##*/}; done; [ -n "$g" ] && break; sleep 1; done'
vr_job a "$(cat <<J
rdma link
D=erdma_0 W=0000:0000:0000:0000:0000:ffff:0a4d:0001; $gid
echo "RoCE v2 GID index \$g"; timeout 120 ibv_rc_pingpong -d erdma_0 -g \$g -n 100
J
)"
vr_job b "$(cat <<J
rdma link add rxe0 type rxe netdev eth0
D=rxe0 W=0000:0000:0000:0000:0000:ffff:0a4d:0002; $gid
for t in \$(seq 30); do timeout 120 ibv_rc_pingpong -d rxe0 -g \$g -n 100 10.77.0.1 && break; sleep 2; done
J
)"
vr_guest_bg a 0 erdma
vr_guest_bg b 1
vr_wait_guests a b

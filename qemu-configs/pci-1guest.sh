#!/usr/bin/env bash
# One guest on the vhost-rdma daemon, virtio-net-pci form; console on this
# terminal (an interactive shell when run from a terminal; Ctrl-A X quits).
#   IMAGE=... qemu-configs/pci-1guest.sh          (PRINT=1 to only print)
FORM=${FORM:-pci}  # testdev-1guest.sh sets testdev
. "$(dirname "$0")/common.sh"
vr_daemon a
vr_job a "$(cat <<'J'
ip addr show eth0
if [ -c /dev/ttyS0 ]; then echo "shell on ttyS0; 'exit' powers off"; setsid sh -c 'exec sh -i </dev/ttyS0 >/dev/ttyS0 2>&1'; fi
J
)"
vr_guest_fg a 0

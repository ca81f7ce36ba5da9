#!/usr/bin/env bash
# One guest on the vhost-rdma daemon, vhost-user-test-device-pci form (QEMU >= 10.2); console on this
# terminal (an interactive shell when run from a terminal; Ctrl-A X quits).
#   IMAGE=... qemu-configs/testdev-1guest.sh          (PRINT=1 to only print)
FORM=testdev
. "$(dirname "$0")/common.sh"
vr_daemon a
vr_job a "$(cat <<'J'
ip addr show eth0
if [ -c /dev/ttyS0 ]; then echo "shell on ttyS0; 'exit' powers off"; setsid sh -c 'exec sh -i </dev/ttyS0 >/dev/ttyS0 2>&1'; fi
J
)"
vr_guest_fg a 0

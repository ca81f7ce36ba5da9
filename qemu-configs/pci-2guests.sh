#!/usr/bin/env bash
# Two guests a (10.77.0.1) and b (10.77.0.2) on one daemon, virtio-net-pci
# form; they ping each other and power off. QUEUES=2 for multiqueue.
#   IMAGE=... qemu-configs/pci-2guests.sh         (PRINT=1 to only print)
FORM=${FORM:-pci}  # testdev-2guests.sh sets testdev
. "$(dirname "$0")/common.sh"
vr_daemon a b
for n in a b; do vr_job $n "$(vr_ping_job 2)"; done
vr_guest_bg a 0
vr_guest_bg b 1
vr_wait_guests a b

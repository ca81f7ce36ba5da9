#!/usr/bin/env bash
# Guest a (10.77.0.1) with an emulated Google gVNIC (the daemon's kind=gve
# port over vfio-user; the guest's unmodified gve driver, DQO RDA) and guest
# b (10.77.0.2) on virtio-net; they ping each other and power off.
# Needs QEMU >= 10.1 (vfio-user-pci): QEMU=$(scripts/setup-qemu.sh | tail -n1).
#   IMAGE=... QEMU=... qemu-configs/gve-2guests.sh      (PRINT=1 to only print)
FORM=pci
. "$(dirname "$0")/common.sh"
vr_daemon a:gve b
vr_job a "$(printf '%s\n' 'ethtool -i eth0 | head -2; ethtool -l eth0' "$(vr_ping_job 2)")"
vr_job b "$(vr_ping_job 1)"
vr_guest_bg a 0 gve
vr_guest_bg b 1
vr_wait_guests a b

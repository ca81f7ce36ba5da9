#!/usr/bin/env bash
# N guests g0..g(N-1) (10.77.0.1 ...) on one daemon, one port each,
# virtio-net-pci form; every guest pings every other one.
#   N=4 IMAGE=... qemu-configs/pci-nguests.sh    (PRINT=1 to only print)
FORM=${FORM:-pci}  # testdev-nguests.sh sets testdev
. "$(dirname "$0")/common.sh"
N=${N:-3}
names=(); for ((i = 0; i < N; i++)); do names+=("g$i"); done
vr_daemon "${names[@]}"
for ((i = 0; i < N; i++)); do vr_job "g$i" "$(vr_ping_job "$N")"; vr_guest_bg "g$i" "$i"; done
vr_wait_guests "${names[@]}"

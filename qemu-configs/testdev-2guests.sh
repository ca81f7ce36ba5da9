#!/usr/bin/env bash
# pci-2guests.sh in the vhost-user-test-device-pci form (QEMU >= 10.2): the daemon
# owns the whole virtio-net device.
#   IMAGE=... qemu-configs/testdev-2guests.sh         (PRINT=1 to only print)
FORM=testdev exec "$(dirname "$0")/pci-2guests.sh" "$@"

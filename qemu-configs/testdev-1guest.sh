#!/usr/bin/env bash
# pci-1guest.sh in the vhost-user-test-device-pci form (QEMU >= 10.2): the daemon
# owns the whole virtio-net device.
#   IMAGE=... qemu-configs/testdev-1guest.sh         (PRINT=1 to only print)
FORM=testdev exec "$(dirname "$0")/pci-1guest.sh" "$@"

#!/usr/bin/env bash
# pci-nguests.sh in the vhost-user-test-device-pci form (QEMU >= 10.2): the daemon
# owns the whole virtio-net device.
#   IMAGE=... qemu-configs/testdev-nguests.sh         (PRINT=1 to only print)
FORM=testdev exec "$(dirname "$0")/pci-nguests.sh" "$@"

#!/bin/sh
# Runs in the guest: find the vfio-user probe device (1b36:00f0), poke it.
set -u
rc=0
for d in /sys/bus/pci/devices/*; do
  echo "$(basename $d) $(cat $d/vendor) $(cat $d/device) $(cat $d/class)"
done
dev=""
for d in /sys/bus/pci/devices/*; do
  if [ "$(cat $d/vendor)" = "0x1b36" ] && [ "$(cat $d/device)" = "0x00f0" ]; then dev=$d; fi
done
[ -n "$dev" ] || { echo "PROBE: device not found"; exit 1; }
echo "PROBE: found $dev"
cat $dev/resource | head -3
bar0=$(head -1 $dev/resource | cut -d' ' -f1)
bar2=$(sed -n 3p $dev/resource | cut -d' ' -f1)
echo 1 > $dev/enable
# command register: memory space + bus master
printf '\006' | dd of=$dev/config bs=1 seek=4 count=1 conv=notrunc 2>/dev/null
busybox hexdump -C $dev/config | head -6
dm() { busybox devmem "$@"; }
magic=$(dm $((bar0)) 32)
echo "PROBE: magic=$magic"
[ "$magic" = "0x424F5250" ] || rc=1
dm $((bar0 + 0x28)) 32 0x12345678
s=$(dm $((bar0 + 0x28)) 32); echo "PROBE: scratch=$s"; [ "$s" = "0x12345678" ] || rc=1
# DMA: fill reserved guest memory at 0x1f000000 (memmap=64K$0x1f000000)
dm $((bar0 + 0x08)) 32 0x1f000000
dm $((bar0 + 0x0c)) 32 0
dm $((bar0 + 0x10)) 32 64
dm $((bar0 + 0x14)) 32 0x5a
dm $((bar0 + 0x18)) 32 0
dm $((bar0 + 0x1c)) 32 1
st=$(dm $((bar0 + 0x04)) 32); echo "PROBE: status=$st"; [ "$st" = "0x00000001" ] || rc=1
m=$(dm 0x1f000000 32); echo "PROBE: guest memory=$m"; [ "$m" = "0x5A5A5A5A" ] || rc=1
m=$(dm 0x1f00003c 32); m2=$(dm 0x1f000040 32); echo "PROBE: last word=$m next=$m2"
# MSI-X not enabled by any driver: vector 0 pending in the PBA (QEMU forwards PBA reads)
p=$(dm $((bar2 + 0x2000)) 32); echo "PROBE: pba=$p"; [ "$p" = "0x00000001" ] || rc=1
# MSI-X through QEMU: program table entry 0 (QEMU emulates the table), unmask,
# enable MSI-X in config space; QEMU then hands the server an eventfd for vector 0.
dm $((bar2 + 0x0)) 32 0xfee00000
dm $((bar2 + 0x4)) 32 0
dm $((bar2 + 0x8)) 32 0xdf
dm $((bar2 + 0xc)) 32 0
printf '\200' | dd of=$dev/config bs=1 seek=67 count=1 conv=notrunc 2>/dev/null
busybox hexdump -C $dev/config | sed -n 5p
sleep 0.5
p=$(dm $((bar2 + 0x2000)) 32); echo "PROBE: pba after MSI-X enable=$p"; [ "$p" = "0x00000000" ] || rc=1
dm $((bar0 + 0x1c)) 32 1
st=$(dm $((bar0 + 0x04)) 32); echo "PROBE: status=$st"
sleep 0.5
dmesg | grep -i -E "irq handler|spurious|vector" | tail -5
echo "PROBE: rc=$rc"
exit $rc

//! A PCI type-0 configuration space built from a device's identity, BARs and
//! MSI-X capability, with the write masks a real function has (BAR sizing,
//! command register, MSI-X enable/mask bits).

use crate::{BarInfo, MsixInfo, PciIdentity};

/// Size of the conventional configuration space.
pub const CONFIG_SIZE: usize = 256;
/// Offset of the MSI-X capability this builder places.
pub const MSIX_CAP_OFFSET: usize = 0x40;
const CAP_ID_MSIX: u8 = 0x11;

/// A configuration space: bytes plus a per-byte write mask.
#[derive(Debug, Clone)]
pub struct ConfigSpace {
    bytes: [u8; CONFIG_SIZE],
    writable: [u8; CONFIG_SIZE],
    bar_sizes: [u64; 6],
}

impl ConfigSpace {
    /// The space of a function with these IDs, BARs and MSI-X capability.
    pub fn new(id: PciIdentity, bars: &[BarInfo], msix: Option<MsixInfo>) -> Self {
        let mut c = ConfigSpace {
            bytes: [0; CONFIG_SIZE],
            writable: [0; CONFIG_SIZE],
            bar_sizes: [0; 6],
        };
        c.put16(0x00, id.vendor_id);
        c.put16(0x02, id.device_id);
        c.bytes[0x08] = id.revision;
        c.bytes[0x09] = id.class_code as u8;
        c.bytes[0x0a] = (id.class_code >> 8) as u8;
        c.bytes[0x0b] = (id.class_code >> 16) as u8;
        c.put16(0x2c, id.subsystem_vendor_id);
        c.put16(0x2e, id.subsystem_id);
        // Command: memory space, bus master, INTx disable are the driver's.
        c.writable[0x04] = 0x06;
        c.writable[0x05] = 0x04;
        c.writable[0x3c] = 0xff; // interrupt line
        for b in bars {
            let i = usize::from(b.index);
            if i >= 6 || (b.is_64bit && i >= 5) {
                continue;
            }
            let size = b.size.max(16).next_power_of_two();
            let mut low = 0u32;
            if b.is_64bit {
                low |= 0x4;
            }
            if b.prefetchable {
                low |= 0x8;
            }
            c.put32(0x10 + 4 * i, low);
            c.bar_sizes[i] = size;
            let mask = !(size - 1);
            let lo_mask = (mask as u32) & !0xf;
            c.writable[0x10 + 4 * i..0x14 + 4 * i].copy_from_slice(&lo_mask.to_le_bytes());
            if b.is_64bit {
                let hi_mask = (mask >> 32) as u32;
                c.writable[0x14 + 4 * i..0x18 + 4 * i].copy_from_slice(&hi_mask.to_le_bytes());
            }
        }
        if let Some(m) = msix {
            c.bytes[0x06] |= 0x10; // status: capability list
            c.bytes[0x34] = MSIX_CAP_OFFSET as u8;
            let o = MSIX_CAP_OFFSET;
            c.bytes[o] = CAP_ID_MSIX;
            c.bytes[o + 1] = 0;
            c.put16(o + 2, m.vectors.saturating_sub(1) & 0x7ff);
            c.put32(o + 4, (m.table_offset & !7) | u32::from(m.table_bar & 7));
            c.put32(o + 8, (m.pba_offset & !7) | u32::from(m.pba_bar & 7));
            c.writable[o + 3] = 0xc0; // MSI-X enable, function mask
        }
        c
    }

    fn put16(&mut self, off: usize, v: u16) {
        self.bytes[off..off + 2].copy_from_slice(&v.to_le_bytes());
    }

    fn put32(&mut self, off: usize, v: u32) {
        self.bytes[off..off + 4].copy_from_slice(&v.to_le_bytes());
    }

    /// Reads at `offset`; bytes past the space read as zero.
    pub fn read(&self, offset: u64, data: &mut [u8]) {
        for (i, d) in data.iter_mut().enumerate() {
            *d = usize::try_from(offset)
                .ok()
                .and_then(|o| o.checked_add(i))
                .and_then(|o| self.bytes.get(o).copied())
                .unwrap_or(0);
        }
    }

    /// Writes at `offset` through the write mask; the rest is ignored.
    pub fn write(&mut self, offset: u64, data: &[u8]) {
        for (i, d) in data.iter().enumerate() {
            let Some(o) = usize::try_from(offset).ok().and_then(|o| o.checked_add(i)) else {
                return;
            };
            if o >= CONFIG_SIZE {
                return;
            }
            let m = self.writable[o];
            self.bytes[o] = (self.bytes[o] & !m) | (d & m);
        }
    }

    /// The size of BAR `index` (0 when absent).
    pub fn bar_size(&self, index: u8) -> u64 {
        self.bar_sizes.get(usize::from(index)).copied().unwrap_or(0)
    }

    /// Whether the driver enabled bus mastering (the device may DMA).
    pub fn bus_master(&self) -> bool {
        self.bytes[0x04] & 0x04 != 0
    }

    /// The raw bytes.
    pub fn bytes(&self) -> &[u8; CONFIG_SIZE] {
        &self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bar_sizing_and_msix_capability() {
        let id = PciIdentity {
            vendor_id: 0x1ae0,
            device_id: 0x0042,
            subsystem_vendor_id: 0x1ae0,
            subsystem_id: 0x0058,
            class_code: 0x020000,
            revision: 1,
        };
        let bars = [
            BarInfo {
                index: 0,
                size: 0x1000,
                is_64bit: true,
                prefetchable: false,
            },
            BarInfo {
                index: 2,
                size: 0x4000,
                is_64bit: false,
                prefetchable: false,
            },
        ];
        let msix = MsixInfo {
            vectors: 9,
            table_bar: 2,
            table_offset: 0,
            pba_bar: 2,
            pba_offset: 0x2000,
        };
        let mut c = ConfigSpace::new(id, &bars, Some(msix));
        let mut b = [0u8; 4];
        c.read(0, &mut b);
        assert_eq!(u32::from_le_bytes(b), 0x0042_1ae0);
        // sizing: write all ones, read back the size mask
        c.write(0x10, &[0xff; 4]);
        c.read(0x10, &mut b);
        assert_eq!(u32::from_le_bytes(b), 0xffff_f004);
        c.write(0x18, &[0xff; 4]);
        c.read(0x18, &mut b);
        assert_eq!(u32::from_le_bytes(b), 0xffff_c000);
        let mut cap = [0u8; 12];
        c.read(MSIX_CAP_OFFSET as u64, &mut cap);
        assert_eq!(cap[0], 0x11);
        assert_eq!(u16::from_le_bytes([cap[2], cap[3]]) & 0x7ff, 8);
        // read-only IDs
        c.write(0, &[0; 4]);
        c.read(0, &mut b);
        assert_eq!(u32::from_le_bytes(b), 0x0042_1ae0);
        assert_eq!(c.bar_size(2), 0x4000);
        c.read(0x1000, &mut b);
        assert_eq!(b, [0; 4]);
    }
}

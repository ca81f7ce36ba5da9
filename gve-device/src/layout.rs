//! PCI identity, BAR layout and the doorbell map (BAR2) of the device.
//!
//! The driver finds the device by vendor/device id (`gve.h`:
//! `PCI_VENDOR_ID_GOOGLE`, `PCI_DEV_ID_GVNIC`), maps BAR0 as registers and
//! BAR2 as doorbells (`GVE_REGISTER_BAR`, `GVE_DOORBELL_BAR`); it never
//! touches BAR1 itself, which holds the MSI-X table and PBA. Revision 1 makes
//! `gve_adminq_alloc` use the 64-bit admin-queue base/length registers
//! instead of the legacy PFN register.

use pci_model::{BarInfo, MsixInfo, PciIdentity};

/// Google's PCI vendor id.
pub const VENDOR_ID: u16 = 0x1ae0;
/// gVNIC device id.
pub const DEVICE_ID: u16 = 0x0042;
/// Subsystem id reported (the driver ignores it).
pub const SUBSYSTEM_ID: u16 = 0x0058;
/// Ethernet controller.
pub const CLASS_CODE: u32 = 0x02_00_00;
/// Revision 1: admin queue set up by base address + length registers.
pub const REVISION: u8 = 1;

/// BAR0: configuration registers, big endian.
pub const BAR_REGS: u8 = 0;
/// BAR1: MSI-X table and PBA (served by the edge).
pub const BAR_MSIX: u8 = 1;
/// BAR2: doorbells, 32-bit little endian, indices handed out by the device.
pub const BAR_DOORBELLS: u8 = 2;

/// Size of BAR0.
pub const BAR0_SIZE: u64 = 0x1000;
/// Size of BAR1.
pub const BAR1_SIZE: u64 = 0x4000;
/// Offset of the MSI-X PBA in BAR1 (the table starts at 0).
pub const MSIX_PBA_OFFSET: u32 = 0x2000;
/// Size of BAR2.
pub const BAR2_SIZE: u64 = 0x1000;

/// Largest queue count per direction this model offers. With the
/// management vector that is 2 * 128 + 1 = 257 MSI-X vectors, whose table
/// (16 bytes each) fits below [`MSIX_PBA_OFFSET`].
pub const MAX_QUEUES: u32 = 128;

/// BAR2 word index of notify block 0's interrupt doorbell.
pub const IRQ_DB_BASE: u32 = 0;
/// BAR2 word index of TX queue 0's tail doorbell.
pub const TX_DB_BASE: u32 = 256;
/// BAR2 word index of RX queue 0's buffer-queue tail doorbell.
pub const RX_DB_BASE: u32 = 384;

/// The device's PCI identity.
pub fn identity() -> PciIdentity {
    PciIdentity {
        vendor_id: VENDOR_ID,
        device_id: DEVICE_ID,
        subsystem_vendor_id: VENDOR_ID,
        subsystem_id: SUBSYSTEM_ID,
        class_code: CLASS_CODE,
        revision: REVISION,
    }
}

/// BAR0, BAR1, BAR2: all 32-bit memory BARs (a 64-bit BAR0 would consume
/// the BAR1 slot, and the driver needs BARs 0 and 2 by number).
pub fn bars() -> Vec<BarInfo> {
    [
        (BAR_REGS, BAR0_SIZE),
        (BAR_MSIX, BAR1_SIZE),
        (BAR_DOORBELLS, BAR2_SIZE),
    ]
    .into_iter()
    .map(|(index, size)| BarInfo {
        index,
        size,
        is_64bit: false,
        prefetchable: false,
    })
    .collect()
}

/// MSI-X: one vector per notify block plus the management vector.
/// `gve_set_num_ntfy_blks` makes `(vectors - 1) & !1` notify blocks and gives
/// half to TX and half to RX queues, so `2 * max(tx, rx) + 1` vectors let
/// every queue have its own block.
pub fn msix(max_tx: u32, max_rx: u32) -> MsixInfo {
    let vectors = 2 * max_tx.max(max_rx) + 1;
    MsixInfo {
        vectors: u16::try_from(vectors).unwrap_or(u16::MAX),
        table_bar: BAR_MSIX,
        table_offset: 0,
        pba_bar: BAR_MSIX,
        pba_offset: MSIX_PBA_OFFSET,
    }
}

/// What a BAR2 word is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Doorbell {
    /// Interrupt doorbell of notify block `n`.
    Irq(u32),
    /// Tail doorbell of TX queue `q`.
    Tx(u32),
    /// Buffer-queue tail doorbell of RX queue `q`.
    Rx(u32),
}

/// Decodes a BAR2 word index.
pub fn doorbell(word: u64) -> Option<Doorbell> {
    let w = u32::try_from(word).ok()?;
    match w {
        _ if w < TX_DB_BASE => Some(Doorbell::Irq(w - IRQ_DB_BASE)),
        _ if w < RX_DB_BASE => Some(Doorbell::Tx(w - TX_DB_BASE)),
        _ if w < RX_DB_BASE + MAX_QUEUES => Some(Doorbell::Rx(w - RX_DB_BASE)),
        _ => None,
    }
}

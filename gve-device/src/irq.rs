//! Notify blocks and their DQO interrupt doorbells (`gve_dqo.h`).
//!
//! The driver's DQO interrupt handler does not mask anything: "Interrupts
//! are automatically masked" (`gve_intr_dqo`). After NAPI it writes
//! `GVE_ITR_NO_UPDATE_DQO | GVE_ITR_ENABLE_BIT_DQO` and relies on the
//! device to fire again for events that came in meanwhile ("HW supports the
//! PCI MSI-X PBA feature", `gve_napi_poll_dqo`). So a block is either armed
//! (the next event fires and disarms it) or disarmed (events are remembered
//! as pending and fire on re-arm).

use crate::counters::{inc, Counters};

/// `GVE_ITR_ENABLE_BIT_DQO`: arm the interrupt.
pub const ITR_ENABLE: u32 = 1 << 0;
/// `GVE_ITR_CLEAR_PBA_BIT_DQO`: forget a pending event.
pub const ITR_CLEAR_PBA: u32 = 1 << 1;
/// Bits 3-4, the ITR index; `3` (`GVE_ITR_NO_UPDATE_DQO`) keeps the interval.
pub const ITR_INDEX_SHIFT: u32 = 3;
/// `GVE_ITR_INTERVAL_DQO_SHIFT`.
pub const ITR_INTERVAL_SHIFT: u32 = 5;
/// `GVE_ITR_INTERVAL_DQO_MASK` (2 us units).
pub const ITR_INTERVAL_MASK: u32 = (1 << 12) - 1;

/// One notify block: an MSI-X vector and its interrupt doorbell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotifyBlock {
    /// MSI-X vector raised.
    pub vector: u16,
    /// The next event raises the vector.
    pub armed: bool,
    /// An event arrived while disarmed.
    pub pending: bool,
    /// Coalescing interval the driver asked for, in microseconds (recorded;
    /// the model does not throttle).
    pub interval_us: u32,
}

impl NotifyBlock {
    /// A block on `vector`, disarmed until the driver's first doorbell write
    /// (`gve_turnup` arms every block).
    pub fn new(vector: u16) -> Self {
        NotifyBlock {
            vector,
            armed: false,
            pending: false,
            interval_us: 0,
        }
    }

    /// Something (a completion) happened on a queue of this block.
    pub fn event(&mut self, irqs: &mut Vec<u16>, c: &mut Counters) {
        if self.armed {
            self.fire(irqs, c);
        } else {
            if !self.pending {
                inc(&mut c.irqs_deferred);
            }
            self.pending = true;
        }
    }

    fn fire(&mut self, irqs: &mut Vec<u16>, c: &mut Counters) {
        self.armed = false;
        self.pending = false;
        irqs.push(self.vector);
        inc(&mut c.irqs_raised);
    }

    /// The driver wrote `val` to the block's doorbell.
    pub fn doorbell(&mut self, val: u32, irqs: &mut Vec<u16>, c: &mut Counters) {
        if val & ITR_CLEAR_PBA != 0 {
            self.pending = false;
        }
        if (val >> ITR_INDEX_SHIFT) & 3 != 3 {
            self.interval_us = ((val >> ITR_INTERVAL_SHIFT) & ITR_INTERVAL_MASK) * 2;
        }
        if val & ITR_ENABLE != 0 {
            self.armed = true;
            if self.pending {
                self.fire(irqs, c);
            }
        } else {
            self.armed = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_mask_pending_and_clear_pba() {
        let mut c = Counters::default();
        let mut irqs = Vec::new();
        let mut b = NotifyBlock::new(3);
        b.event(&mut irqs, &mut c);
        assert!(
            irqs.is_empty() && b.pending,
            "disarmed until the driver arms"
        );
        b.doorbell(ITR_ENABLE | (10 << ITR_INTERVAL_SHIFT), &mut irqs, &mut c);
        assert_eq!(
            (irqs.as_slice(), b.armed, b.interval_us),
            (&[3u16][..], false, 20)
        );
        b.doorbell(ITR_ENABLE | (3 << ITR_INDEX_SHIFT), &mut irqs, &mut c);
        assert_eq!(b.interval_us, 20, "NO_UPDATE keeps the interval");
        b.event(&mut irqs, &mut c);
        b.event(&mut irqs, &mut c);
        assert_eq!(irqs.len(), 2, "one interrupt, then masked");
        b.doorbell(ITR_CLEAR_PBA | ITR_ENABLE, &mut irqs, &mut c);
        assert_eq!(irqs.len(), 2);
        b.doorbell(0, &mut irqs, &mut c);
        assert!(!b.armed);
    }
}

//! Event queues: the CMDQ EQ and the AEQ (both on MSI-X vector 0) and the
//! CEQs created by `CREATE_EQ` (CEQ n on its `vector_idx`, which the driver
//! sets to n). 16-byte EQEs with an owner bit (bit 31 of the first dword)
//! that is 1 on the first pass and flips on every wrap (`get_next_valid_eqe`).

use pci_model::Dma;

use crate::regs::EQE_SIZE;

/// AEQE types (`ERDMA_AE_TYPE_*`).
pub mod ae_type {
    /// QP fatal.
    pub const QP_FATAL: u8 = 0;
    /// QP receive-queue error.
    pub const QP_ERQ_ERR: u8 = 1;
    /// Access error.
    pub const ACC_ERR: u8 = 2;
    /// CQ error (overflow).
    pub const CQ_ERR: u8 = 3;
    /// Other.
    pub const OTHER: u8 = 4;
}

/// Deepest EQ the device accepts (AEQ_DEPTH, CMDQ_EQ_DEPTH, CREATE_EQ).
/// The driver's EQ consumer index is a u16 (`struct erdma_eq`) and it finds
/// the owner phase as `!!(ci & depth)` (`get_next_valid_eqe`): at 65536
/// entries that is always 0, so the driver could never tell a new pass from
/// the last one, and the device (seeing only that u16 CI) could never tell
/// a full EQ from an empty one. 2^15 is the deepest ring a u16 index can
/// track; the driver itself uses 4096 (`ERDMA_DEFAULT_EQ_DEPTH`).
pub const MAX_EQ_DEPTH: u32 = 1 << 15;

/// An EQ depth the device accepts: a power of two, at most
/// [`MAX_EQ_DEPTH`].
pub fn depth_ok(depth: u32) -> bool {
    depth.is_power_of_two() && depth <= MAX_EQ_DEPTH
}

/// Outcome of writing an EQE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EqPush {
    /// Written; raise this vector.
    Irq(u16),
    /// Written; the EQ is not armed (the driver will see it when it next
    /// polls or re-arms).
    Quiet,
    /// Dropped: EQ full (the driver's CI is too far behind).
    Full,
    /// Dropped: DMA error writing it.
    DmaError,
}

/// One event queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventQueue {
    /// Guest address of the ring (physically contiguous).
    pub base: u64,
    /// Entries (power of two).
    pub depth: u32,
    /// Guest address of the doorbell record (informational).
    pub dbrec: u64,
    /// MSI-X vector.
    pub vector: u16,
    /// Producer index (entries written).
    pub pi: u32,
    /// Consumer index last reported by the driver (16 bits meaningful).
    pub ci: u32,
    /// Armed: the next EQE raises the vector.
    pub armed: bool,
}

impl EventQueue {
    /// A new EQ. It starts armed: the driver never notifies the CMDQ EQ
    /// before its first event.
    pub fn new(base: u64, depth: u32, dbrec: u64, vector: u16) -> Self {
        EventQueue {
            base,
            depth,
            dbrec,
            vector,
            pi: 0,
            ci: 0,
            armed: true,
        }
    }

    fn outstanding(&self) -> u32 {
        // The driver's EQ consumer index is a u16: the difference is only
        // meaningful modulo 2^16, which is why depths stop at MAX_EQ_DEPTH.
        (self.pi.wrapping_sub(self.ci)) & 0xffff
    }

    /// Writes one EQE (`words` = the 16 bytes minus the owner bit, which is
    /// set here in bit 31 of the first dword).
    pub fn push(&mut self, dma: &dyn Dma, mut eqe: [u8; 16]) -> EqPush {
        // A depth the checks above refuse never gets here; an EQ built
        // with one anyway takes nothing rather than overwrite entries.
        if !depth_ok(self.depth) || self.outstanding() >= self.depth {
            return EqPush::Full;
        }
        let owner = u32::from(self.pi & self.depth == 0);
        let mut d0 = u32::from_le_bytes([eqe[0], eqe[1], eqe[2], eqe[3]]);
        d0 = (d0 & !(1 << 31)) | (owner << 31);
        eqe[..4].copy_from_slice(&d0.to_le_bytes());
        let idx = u64::from(self.pi & (self.depth - 1));
        let Some(addr) = self.base.checked_add(idx * EQE_SIZE) else {
            return EqPush::DmaError;
        };
        // Write the body first and the owner dword last, as hardware would.
        if dma.write(addr.wrapping_add(4), &eqe[4..]).is_err()
            || dma.write(addr, &eqe[..4]).is_err()
        {
            return EqPush::DmaError;
        }
        self.pi = self.pi.wrapping_add(1);
        if self.armed {
            self.armed = false;
            EqPush::Irq(self.vector)
        } else {
            EqPush::Quiet
        }
    }

    /// The EQ doorbell (`notify_eq`): new CI, re-arm. Returns the vector to
    /// raise if events are already pending past the CI.
    pub fn doorbell(&mut self, ci: u32, arm: bool) -> Option<u16> {
        self.ci = ci & 0xff_ffff;
        if arm {
            if self.outstanding() != 0 {
                self.armed = false;
                return Some(self.vector);
            }
            self.armed = true;
        }
        None
    }
}

/// A CEQE: CQN in bits 19:0 of the first qword (owner bit added by
/// [`EventQueue::push`]).
pub fn ceqe(cqn: u32) -> [u8; 16] {
    let mut e = [0u8; 16];
    e[..8].copy_from_slice(&u64::from(cqn & 0xf_ffff).to_le_bytes());
    e
}

/// An AEQE: type in bits 23:16, subtype 7:0 of the header dword, then
/// `event_data0` (QPN or CQN) and `event_data1`.
pub fn aeqe(ty: u8, subtype: u8, data0: u32, data1: u32) -> [u8; 16] {
    let mut e = [0u8; 16];
    let hdr = (u32::from(ty) << 16) | u32::from(subtype);
    e[0..4].copy_from_slice(&hdr.to_le_bytes());
    e[4..8].copy_from_slice(&data0.to_le_bytes());
    e[8..12].copy_from_slice(&data1.to_le_bytes());
    e
}

#[cfg(test)]
mod tests {
    use super::*;
    use pci_model::VecMemory;

    /// The deepest EQ is seen full after exactly `depth` unconsumed EQEs
    /// (issue 24: at 65536 a 16-bit difference never reached the depth).
    #[test]
    fn deepest_eq_is_seen_full() {
        let depth = MAX_EQ_DEPTH;
        let mem = VecMemory::new(0x1000, depth as usize * 16);
        let mut eq = EventQueue::new(0x1000, depth, 0, 0);
        for i in 0..depth {
            assert_ne!(eq.push(&mem, [0; 16]), EqPush::Full, "EQE {i}");
        }
        assert_eq!(eq.push(&mem, [0; 16]), EqPush::Full);
        // The driver consumes one (CI as its u16) and there is room again.
        assert_eq!(eq.doorbell(1, false), None);
        assert_ne!(eq.push(&mem, [0; 16]), EqPush::Full);
        assert_eq!(eq.push(&mem, [0; 16]), EqPush::Full);
        // A depth a u16 CI cannot track takes nothing.
        assert!(!depth_ok(1 << 16));
        let mut big = EventQueue::new(0x1000, 1 << 16, 0, 0);
        assert_eq!(big.push(&mem, [0; 16]), EqPush::Full);
    }
}

//! PCI identity, BAR layout, register offsets and bit fields of the erdma
//! function, as the Linux driver uses them (`erdma_hw.h`, `erdma_main.c`).

/// PCI vendor ID (`PCI_VENDOR_ID_ALIBABA`).
pub const VENDOR_ID: u16 = 0x1ded;
/// PCI device ID (the only entry of `erdma_pci_tbl`; the protocol, iWARP or
/// RoCEv2, is read from [`DEV_PROTO`], not from the ID).
pub const DEVICE_ID: u16 = 0x107f;
/// Class code: network controller, "other" (0x0280). The driver does not
/// check it.
pub const CLASS_CODE: u32 = 0x02_80_00;

/// BAR of the registers and doorbell pages (`ERDMA_FUNC_BAR`).
pub const FUNC_BAR: u8 = 0;
/// BAR of the MSI-X table and PBA (`ERDMA_MISX_BAR`).
pub const MSIX_BAR: u8 = 2;
/// Size of BAR 0: registers page, the fixed SQ/RQ/CQ doorbell spaces and a
/// pool of pages handed out by `ALLOC_DB` (extended doorbells).
pub const FUNC_BAR_SIZE: u64 = 4 << 20;
/// Size of BAR 2.
pub const MSIX_BAR_SIZE: u64 = 0x4000;
/// Offset of the MSI-X table in BAR 2.
pub const MSIX_TABLE_OFFSET: u32 = 0;
/// Offset of the MSI-X PBA in BAR 2.
pub const MSIX_PBA_OFFSET: u32 = 0x2000;
/// MSI-X vectors (`ERDMA_NUM_MSIX_VEC`): 0 = CMDQ EQ + AEQ, n = CEQ n.
pub const NUM_MSIX_VEC: u16 = 32;
/// Vector of the command-queue EQ and the AEQ (`ERDMA_MSIX_VECTOR_CMDQ`).
pub const MSIX_VECTOR_CMDQ: u16 = 0;

/// Protocol value: iWARP.
pub const PROTO_IWARP: u32 = 0;
/// Protocol value: RoCEv2.
pub const PROTO_ROCEV2: u32 = 1;

/// Register offsets in BAR 0.
pub mod off {
    /// Hardware version; 0 means "non-functional function" (probe fails).
    pub const VERSION: u64 = 0x0;
    /// Protocol (`ERDMA_REGS_DEV_PROTO_REG`).
    pub const DEV_PROTO: u64 = 0xc;
    /// Control: bit 0 reset, bit 1 init.
    pub const DEV_CTRL: u64 = 0x10;
    /// Status: bit 0 reset done, bit 1 init done.
    pub const DEV_ST: u64 = 0x14;
    /// Paired netdev MAC, low 32 bits (bytes 2..6, big-endian order).
    pub const NETDEV_MAC_L: u64 = 0x18;
    /// Paired netdev MAC, high 16 bits (bytes 0..2).
    pub const NETDEV_MAC_H: u64 = 0x1c;
    /// CMDQ SQ base, low.
    pub const CMDQ_SQ_ADDR_L: u64 = 0x20;
    /// CMDQ SQ base, high.
    pub const CMDQ_SQ_ADDR_H: u64 = 0x24;
    /// CMDQ CQ base, low.
    pub const CMDQ_CQ_ADDR_L: u64 = 0x28;
    /// CMDQ CQ base, high.
    pub const CMDQ_CQ_ADDR_H: u64 = 0x2c;
    /// CMDQ SQ depth in 32-byte WQEBBs (the CQ has the same depth).
    pub const CMDQ_DEPTH: u64 = 0x30;
    /// CMDQ EQ depth in EQEs.
    pub const CMDQ_EQ_DEPTH: u64 = 0x34;
    /// CMDQ EQ base, low.
    pub const CMDQ_EQ_ADDR_L: u64 = 0x38;
    /// CMDQ EQ base, high.
    pub const CMDQ_EQ_ADDR_H: u64 = 0x3c;
    /// AEQ base, low.
    pub const AEQ_ADDR_L: u64 = 0x40;
    /// AEQ base, high.
    pub const AEQ_ADDR_H: u64 = 0x44;
    /// AEQ depth.
    pub const AEQ_DEPTH: u64 = 0x48;
    /// Number of CEQ groups (read-only here; the driver does not read it).
    pub const GRP_NUM: u64 = 0x4c;
    /// AEQ doorbell (64-bit: CI + arm).
    pub const AEQ_DB: u64 = 0x50;
    /// CMDQ SQ doorbell record address (64-bit).
    pub const CMDQ_SQ_DB_HOST_ADDR: u64 = 0x60;
    /// CMDQ CQ doorbell record address (64-bit).
    pub const CMDQ_CQ_DB_HOST_ADDR: u64 = 0x68;
    /// CMDQ EQ doorbell record address (64-bit).
    pub const CMDQ_EQ_DB_HOST_ADDR: u64 = 0x70;
    /// AEQ doorbell record address (64-bit).
    pub const AEQ_DB_HOST_ADDR: u64 = 0x78;
    /// First statistics register (64-bit each, 0x80..=0xe0).
    pub const STATS_FIRST: u64 = 0x80;
    /// Last statistics register.
    pub const STATS_LAST: u64 = 0xe0;
    /// EQ doorbells: `CEQ_DB_BASE + 8 * n`, n = 0 is the CMDQ EQ, n >= 1 CEQ n.
    pub const CEQ_DB_BASE: u64 = 0x100;
    /// CMDQ SQ doorbell (64-bit: producer index in WQEBBs).
    pub const CMDQ_SQDB: u64 = 0x200;
    /// CMDQ CQ doorbell (64-bit: CQ doorbell format with arm).
    pub const CMDQ_CQDB: u64 = 0x300;
}

/// `DEV_CTRL` reset bit.
pub const CTRL_RESET: u32 = 1;
/// `DEV_CTRL` init bit.
pub const CTRL_INIT: u32 = 2;
/// `DEV_ST` reset-done bit.
pub const ST_RESET_DONE: u32 = 1;
/// `DEV_ST` init-done bit.
pub const ST_INIT_DONE: u32 = 2;

/// Start of the doorbell spaces (`ERDMA_BAR_DB_SPACE_BASE`).
pub const DB_SPACE_BASE: u64 = 4096;
/// SQ doorbell space (`ERDMA_BAR_SQDB_SPACE_OFFSET`), 384 KiB.
pub const SQDB_SPACE: u64 = DB_SPACE_BASE;
/// RQ doorbell space (`ERDMA_BAR_RQDB_SPACE_OFFSET`), 96 KiB.
pub const RQDB_SPACE: u64 = SQDB_SPACE + 384 * 1024;
/// CQ doorbell space (`ERDMA_BAR_CQDB_SPACE_OFFSET`); this model ends it at
/// [`DB_POOL_START`].
pub const CQDB_SPACE: u64 = RQDB_SPACE + 96 * 1024;
/// Kernel SQ doorbell page index (`ERDMA_SDB_SHARED_PAGE_INDEX`), in pages
/// of `PAGE_SIZE` (4 KiB guests only).
pub const SDB_SHARED_PAGE_INDEX: u64 = 95;
/// Start of the pool of doorbell pages handed out by `ALLOC_DB` (model choice).
pub const DB_POOL_START: u64 = 1 << 20;

/// Doorbell size in bytes.
pub const DB_SIZE: u64 = 8;
/// Bytes of one send-queue element basic block.
pub const SQEBB_SIZE: u64 = 32;
/// Bytes of one receive-queue element.
pub const RQE_SIZE: u64 = 32;
/// Bytes of one CQE.
pub const CQE_SIZE: u64 = 32;
/// Bytes of one EQE.
pub const EQE_SIZE: u64 = 16;
/// Bytes of one command (4 WQEBBs, `ERDMA_CMDQ_SQE_SIZE`).
pub const CMDQ_SQE_SIZE: usize = 128;
/// Most WQEBBs of one SQE (`ERDMA_MAX_WQEBB_PER_SQE`).
pub const MAX_WQEBB_PER_SQE: u64 = 4;
/// Hardware page shift.
pub const HW_PAGE_SHIFT: u32 = 12;

/// WQEBBs a producer index announces past a consumer index on a ring of
/// `depth` entries: indices are free-running u16s, so the difference is
/// taken modulo 2^16. `None` when that is more than the ring holds: the
/// doorbell is bad (stale or hostile) and must be refused, or the device
/// would replay old ring contents (and, with a PI it can never land on,
/// never stop).
#[inline]
pub fn ring_outstanding(pi: u16, ci: u16, depth: u32) -> Option<u16> {
    let n = pi.wrapping_sub(ci);
    (u32::from(n) <= depth).then_some(n)
}

/// `GENMASK_ULL(h, l)` field extraction.
#[inline]
pub const fn field(v: u64, h: u32, l: u32) -> u64 {
    (v >> l) & (u64::MAX >> (63 - (h - l)))
}

/// 32-bit [`field`].
#[inline]
pub const fn field32(v: u32, h: u32, l: u32) -> u32 {
    (v >> l) & (u32::MAX >> (31 - (h - l)))
}

/// CQ doorbell fields (`ERDMA_CQDB_*`).
pub mod cqdb {
    /// CQN (bits 55:32).
    pub fn cqn(v: u64) -> u32 {
        super::field(v, 55, 32) as u32
    }
    /// Arm (bit 31).
    pub fn arm(v: u64) -> bool {
        v & (1 << 31) != 0
    }
    /// Solicited-only (bit 30).
    pub fn sol(v: u64) -> bool {
        v & (1 << 30) != 0
    }
    /// Consumer index (bits 23:0).
    pub fn ci(v: u64) -> u32 {
        super::field(v, 23, 0) as u32
    }
}

/// EQ doorbell fields (`ERDMA_EQDB_*`).
pub mod eqdb {
    /// Arm (bit 31).
    pub fn arm(v: u64) -> bool {
        v & (1 << 31) != 0
    }
    /// Consumer index (bits 23:0).
    pub fn ci(v: u64) -> u32 {
        super::field(v, 23, 0) as u32
    }
}

/// Little-endian readers over a byte slice that never panic (missing bytes
/// read as zero).
pub mod le {
    /// `u16` at `off`.
    pub fn u16_at(b: &[u8], off: usize) -> u16 {
        let mut a = [0u8; 2];
        if let Some(s) = b.get(off..off + 2) {
            a.copy_from_slice(s);
        }
        u16::from_le_bytes(a)
    }
    /// `u32` at `off`.
    pub fn u32_at(b: &[u8], off: usize) -> u32 {
        let mut a = [0u8; 4];
        if let Some(s) = b.get(off..off + 4) {
            a.copy_from_slice(s);
        }
        u32::from_le_bytes(a)
    }
    /// `u64` at `off`.
    pub fn u64_at(b: &[u8], off: usize) -> u64 {
        let mut a = [0u8; 8];
        if let Some(s) = b.get(off..off + 8) {
            a.copy_from_slice(s);
        }
        u64::from_le_bytes(a)
    }
    /// Big-endian `u32` at `off`.
    pub fn be32_at(b: &[u8], off: usize) -> u32 {
        let mut a = [0u8; 4];
        if let Some(s) = b.get(off..off + 4) {
            a.copy_from_slice(s);
        }
        u32::from_be_bytes(a)
    }
    /// `N` bytes at `off`.
    pub fn bytes_at<const N: usize>(b: &[u8], off: usize) -> [u8; N] {
        let mut a = [0u8; N];
        if let Some(s) = b.get(off..off + N) {
            a.copy_from_slice(s);
        }
        a
    }
}

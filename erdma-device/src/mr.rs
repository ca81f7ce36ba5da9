//! Memory translation tables (MTTs), memory regions and the MR table.
//!
//! Everything is translated lazily through [`Dma`]: an MR keeps only its
//! root (inline entries or the guest address of the top MTT page), so a
//! hostile driver cannot make the device allocate per page it registers.

use std::collections::BTreeMap;

use pci_model::{Dma, DmaError};

/// A translation failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum XlateError {
    /// The key names no MR, or the key byte does not match.
    #[error("invalid key {0:#x}")]
    InvalidKey(u32),
    /// The MR is invalid (FRMR not yet registered, or invalidated).
    #[error("MR {0:#x} not valid")]
    NotValid(u32),
    /// The range leaves the MR.
    #[error("range outside the MR")]
    OutOfRange,
    /// The protection domain differs.
    #[error("PD mismatch")]
    PdMismatch,
    /// The access right is missing.
    #[error("access denied")]
    Access,
    /// The MTT names a page index beyond its entry count.
    #[error("page index beyond the MTT")]
    BadMtt,
    /// A guest access failed.
    #[error(transparent)]
    Dma(#[from] DmaError),
}

/// erdma MR access bits (`ERDMA_MR_ACC_*`).
pub mod acc {
    /// Remote atomic.
    pub const RA: u8 = 1;
    /// Local read.
    pub const LR: u8 = 2;
    /// Local write.
    pub const LW: u8 = 4;
    /// Remote read.
    pub const RR: u8 = 8;
    /// Remote write.
    pub const RW: u8 = 16;
}

/// MR types (`ERDMA_MR_TYPE_*`).
pub mod mr_type {
    /// User / kernel MR with a page list.
    pub const NORMAL: u8 = 0;
    /// Fast-registration MR (page list given later by a REG_MR WQE).
    pub const FRMR: u8 = 1;
    /// DMA MR: addresses are guest-physical.
    pub const DMA: u8 = 2;
}

/// Where the page addresses of a buffer come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mtt {
    /// Identity: the "virtual" address is guest-physical (DMA MR, local DMA
    /// key).
    Physical,
    /// Level 0: up to four page addresses carried in the command or WQE.
    Inline {
        /// Page addresses.
        entries: [u64; 4],
        /// How many are valid.
        count: u32,
    },
    /// Levels 1..=3: `root` is the guest address of the top table. Level 1:
    /// `count` contiguous 8-byte entries at `root`. Level n > 1: `root` is a
    /// page of addresses of level n-1 pages, each of `mtt_page_size / 8`
    /// entries.
    Table {
        /// Top table address.
        root: u64,
        /// 1..=3.
        level: u8,
        /// Data pages described.
        count: u32,
        /// Bytes per MTT page (levels > 1).
        mtt_page_size: u64,
    },
}

impl Mtt {
    /// Entries described.
    pub fn count(&self) -> u64 {
        match *self {
            Mtt::Physical => u64::MAX,
            Mtt::Inline { count, .. } | Mtt::Table { count, .. } => u64::from(count),
        }
    }

    /// Guest address of data page `idx`.
    pub fn page(&self, dma: &dyn Dma, idx: u64) -> Result<u64, XlateError> {
        match *self {
            Mtt::Physical => Err(XlateError::BadMtt),
            Mtt::Inline { entries, count } => {
                if idx >= u64::from(count) {
                    return Err(XlateError::BadMtt);
                }
                entries.get(idx as usize).copied().ok_or(XlateError::BadMtt)
            }
            Mtt::Table {
                root,
                level,
                count,
                mtt_page_size,
            } => {
                if idx >= u64::from(count) {
                    return Err(XlateError::BadMtt);
                }
                let per = (mtt_page_size / 8).max(1);
                let mut table = root;
                let mut lvl = level;
                while lvl > 1 {
                    let span = per
                        .checked_pow(u32::from(lvl) - 1)
                        .ok_or(XlateError::BadMtt)?;
                    let i = (idx / span) % per;
                    let at = i
                        .checked_mul(8)
                        .and_then(|o| table.checked_add(o))
                        .ok_or(XlateError::BadMtt)?;
                    table = dma.read_u64_le(at)?;
                    lvl -= 1;
                }
                let i = if level > 1 { idx % per } else { idx };
                let at = i
                    .checked_mul(8)
                    .and_then(|o| table.checked_add(o))
                    .ok_or(XlateError::BadMtt)?;
                Ok(dma.read_u64_le(at)?)
            }
        }
    }

    /// Checks that the root table is readable (first and last top entry).
    pub fn probe(&self, dma: &dyn Dma) -> Result<(), XlateError> {
        if let Mtt::Table {
            root,
            level,
            count,
            mtt_page_size,
        } = *self
        {
            if count == 0 {
                return Ok(());
            }
            let per = (mtt_page_size / 8).max(1);
            let top_entries = if level == 1 {
                u64::from(count)
            } else {
                let span = per
                    .checked_pow(u32::from(level) - 1)
                    .ok_or(XlateError::BadMtt)?;
                u64::from(count).div_ceil(span)
            };
            if level > 1 && top_entries > per {
                return Err(XlateError::BadMtt);
            }
            dma.read_u64_le(root)?;
            let last = (top_entries - 1)
                .checked_mul(8)
                .and_then(|o| root.checked_add(o))
                .ok_or(XlateError::BadMtt)?;
            dma.read_u64_le(last)?;
            // And the first data page resolves and is guest memory (as a
            // level-0 MR's pages are checked).
            let first = self.page(dma, 0)?;
            dma.read(first, &mut [0u8; 1])?;
        }
        Ok(())
    }
}

/// End (exclusive) of the range `[va, va + len)`, or `None` when it wraps
/// past 2^64. No driver registers such a range (the kernel's
/// `ib_umem_get` refuses `addr + size < addr`), and every offset computed
/// inside an MR relies on its end being representable.
pub fn range_end(va: u64, len: u64) -> Option<u64> {
    va.checked_add(len)
}

/// A buffer (queue) described by an MTT, a page size and a first-page
/// offset: queues of QPs and CQs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PagedBuf {
    /// Page list.
    pub mtt: Mtt,
    /// log2 of the page size.
    pub page_shift: u32,
    /// Offset of byte 0 in the first page.
    pub offset: u64,
}

impl PagedBuf {
    /// Guest address of byte `off` of the buffer (the caller keeps accesses
    /// inside one page: queue elements are 16/32-byte aligned).
    pub fn addr(&self, dma: &dyn Dma, off: u64) -> Result<u64, XlateError> {
        let pos = self.offset.checked_add(off).ok_or(XlateError::OutOfRange)?;
        if let Mtt::Physical = self.mtt {
            return Ok(pos);
        }
        let psize = 1u64
            .checked_shl(self.page_shift)
            .ok_or(XlateError::BadMtt)?;
        let page = pos >> self.page_shift;
        let within = pos & (psize - 1);
        let base = self.mtt.page(dma, page)?;
        base.checked_add(within).ok_or(XlateError::OutOfRange)
    }

    /// Reads `buf.len()` bytes at byte `off`.
    pub fn read(&self, dma: &dyn Dma, off: u64, buf: &mut [u8]) -> Result<(), XlateError> {
        let a = self.addr(dma, off)?;
        Ok(dma.read(a, buf)?)
    }

    /// Writes `data` at byte `off`.
    pub fn write(&self, dma: &dyn Dma, off: u64, data: &[u8]) -> Result<(), XlateError> {
        let a = self.addr(dma, off)?;
        Ok(dma.write(a, data)?)
    }
}

/// One memory region (an MPT entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemRegion {
    /// MPT index (stag >> 8).
    pub mpt_idx: u32,
    /// Key byte (stag & 0xff).
    pub key: u8,
    /// Protection domain number.
    pub pd: u32,
    /// `mr_type::*`.
    pub mr_type: u8,
    /// `acc::*` bits.
    pub access: u8,
    /// First virtual address (iova).
    pub va: u64,
    /// Length in bytes.
    pub len: u64,
    /// log2 of the page size.
    pub page_shift: u32,
    /// Page list.
    pub mtt: Mtt,
    /// Valid (usable).
    pub valid: bool,
}

impl MemRegion {
    /// The stag (`mpt_idx << 8 | key`).
    pub fn stag(&self) -> u32 {
        (self.mpt_idx << 8) | u32::from(self.key)
    }

    /// Bounds check of `[va, va + len)` (DMA MRs cover everything). An MR
    /// whose own range wraps past 2^64 (REG_MR refuses one, a fast-register
    /// WQE might still describe one) allows no access at all.
    pub fn check(&self, va: u64, len: u64) -> Result<(), XlateError> {
        if self.mr_type == mr_type::DMA {
            return Ok(());
        }
        range_end(self.va, self.len).ok_or(XlateError::OutOfRange)?;
        let off = va.checked_sub(self.va).ok_or(XlateError::OutOfRange)?;
        let end = off.checked_add(len).ok_or(XlateError::OutOfRange)?;
        if end > self.len {
            return Err(XlateError::OutOfRange);
        }
        Ok(())
    }

    /// Visits the guest-physical pieces of `[va, va + len)` in order.
    pub fn for_each_piece(
        &self,
        dma: &dyn Dma,
        va: u64,
        len: u64,
        mut f: impl FnMut(u64, usize) -> Result<(), XlateError>,
    ) -> Result<(), XlateError> {
        self.check(va, len)?;
        if len == 0 {
            return Ok(());
        }
        if self.mr_type == mr_type::DMA || matches!(self.mtt, Mtt::Physical) {
            let n = usize::try_from(len).map_err(|_| XlateError::OutOfRange)?;
            return f(va, n);
        }
        // Checked arithmetic throughout: the fields are the driver's (the
        // page shift included), and `check` only bounds the range.
        let psize = 1u64
            .checked_shl(self.page_shift)
            .ok_or(XlateError::BadMtt)?;
        let first_page = self.va >> self.page_shift;
        let mut cur = va;
        let mut left = len;
        while left > 0 {
            let idx = (cur >> self.page_shift)
                .checked_sub(first_page)
                .ok_or(XlateError::OutOfRange)?;
            let within = cur & (psize - 1);
            let chunk = (psize - within).min(left);
            let base = self.mtt.page(dma, idx)?;
            // Entries are page-aligned block addresses.
            let pa = (base & !(psize - 1))
                .checked_add(within)
                .ok_or(XlateError::OutOfRange)?;
            let n = usize::try_from(chunk).map_err(|_| XlateError::OutOfRange)?;
            f(pa, n)?;
            left -= chunk;
            if left > 0 {
                cur = cur.checked_add(chunk).ok_or(XlateError::OutOfRange)?;
            }
        }
        Ok(())
    }

    /// Reads `buf.len()` bytes at `va`.
    pub fn read(&self, dma: &dyn Dma, va: u64, buf: &mut [u8]) -> Result<(), XlateError> {
        let mut at = 0usize;
        self.for_each_piece(dma, va, buf.len() as u64, |pa, n| {
            let end = at.checked_add(n).ok_or(XlateError::OutOfRange)?;
            let dst = buf.get_mut(at..end).ok_or(XlateError::OutOfRange)?;
            dma.read(pa, dst)?;
            at = end;
            Ok(())
        })
    }

    /// Writes `data` at `va`.
    pub fn write(&self, dma: &dyn Dma, va: u64, data: &[u8]) -> Result<(), XlateError> {
        let mut at = 0usize;
        self.for_each_piece(dma, va, data.len() as u64, |pa, n| {
            let end = at.checked_add(n).ok_or(XlateError::OutOfRange)?;
            let src = data.get(at..end).ok_or(XlateError::OutOfRange)?;
            dma.write(pa, src)?;
            at = end;
            Ok(())
        })
    }
}

/// The MR (MPT) table, bounded.
#[derive(Debug, Clone, Default)]
pub struct MrTable {
    mrs: BTreeMap<u32, MemRegion>,
    max_live: usize,
    max_index: u32,
}

/// Why a table insert failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableError {
    /// Index out of range.
    BadIndex,
    /// Already used.
    Exists,
    /// Table full.
    Full,
    /// No such entry.
    Missing,
}

impl MrTable {
    /// A table of at most `max_live` MRs with indices below `max_index`.
    pub fn new(max_live: usize, max_index: u32) -> Self {
        MrTable {
            mrs: BTreeMap::new(),
            max_live,
            max_index,
        }
    }

    /// Live MRs.
    pub fn len(&self) -> usize {
        self.mrs.len()
    }

    /// No MR live.
    pub fn is_empty(&self) -> bool {
        self.mrs.is_empty()
    }

    /// Inserts (REG_MR).
    pub fn insert(&mut self, mr: MemRegion) -> Result<(), TableError> {
        if mr.mpt_idx >= self.max_index {
            return Err(TableError::BadIndex);
        }
        if self.mrs.contains_key(&mr.mpt_idx) {
            return Err(TableError::Exists);
        }
        if self.mrs.len() >= self.max_live {
            return Err(TableError::Full);
        }
        self.mrs.insert(mr.mpt_idx, mr);
        Ok(())
    }

    /// Removes (DEREG_MR).
    pub fn remove(&mut self, mpt_idx: u32) -> Result<MemRegion, TableError> {
        self.mrs.remove(&mpt_idx).ok_or(TableError::Missing)
    }

    /// By MPT index, whatever the key byte.
    pub fn get_mut(&mut self, mpt_idx: u32) -> Option<&mut MemRegion> {
        self.mrs.get_mut(&mpt_idx)
    }

    /// By MPT index, whatever the key byte.
    pub fn get(&self, mpt_idx: u32) -> Option<&MemRegion> {
        self.mrs.get(&mpt_idx)
    }

    /// Resolves a stag for an access of `need` (`acc::*`, 0 = local read)
    /// from PD `pd` (`None` = any).
    pub fn lookup(&self, stag: u32, pd: Option<u32>, need: u8) -> Result<&MemRegion, XlateError> {
        let mr = self
            .mrs
            .get(&(stag >> 8))
            .filter(|m| m.key == (stag & 0xff) as u8)
            .ok_or(XlateError::InvalidKey(stag))?;
        if !mr.valid {
            return Err(XlateError::NotValid(stag));
        }
        if pd.is_some_and(|p| p != mr.pd) {
            return Err(XlateError::PdMismatch);
        }
        if mr.access & need != need {
            return Err(XlateError::Access);
        }
        Ok(mr)
    }

    /// Drops everything.
    pub fn clear(&mut self) {
        self.mrs.clear();
    }
}

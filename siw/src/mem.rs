//! STag-registered memory regions owned by the engine.
//!
//! A region is a byte buffer with a base address (`va`), access rights and a
//! validity flag. STags are `index << 8 | key` as in siw; the key changes on
//! every registration that reuses an index, so stale STags are detected.
//! Tagged offsets (TO) are addresses in `[va, va + len)`.

use crate::ddp::{ddp_ecode, rdmap_ecode, rdmap_etype, TermError};

/// Access rights of a memory region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Access(u8);

impl Access {
    /// Local write (receive and Read sink buffers).
    pub const LOCAL_WRITE: Access = Access(1);
    /// Remote write (RDMA Write sink).
    pub const REMOTE_WRITE: Access = Access(2);
    /// Remote read (RDMA Read source).
    pub const REMOTE_READ: Access = Access(4);
    /// Remote invalidation via Send with Invalidate allowed.
    pub const REMOTE_INVALIDATE: Access = Access(8);
    /// No rights beyond local read.
    pub const NONE: Access = Access(0);
    /// Every right.
    pub const ALL: Access = Access(15);

    /// Whether all rights of `other` are contained.
    pub fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

/// Why a memory access was refused (siw `enum siw_access_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessError {
    /// No such STag, stale key, or invalidated region.
    InvalidStag,
    /// Outside the region.
    BaseBounds,
    /// Insufficient access rights.
    AccessRights,
}

impl AccessError {
    /// DDP tagged-buffer error for inbound Write / Read Response placement
    /// (siw `siw_tagged_error`: rights violations map to "invalid STag").
    pub fn ddp(self) -> TermError {
        TermError::ddp_tagged(match self {
            Self::InvalidStag | Self::AccessRights => ddp_ecode::T_INVALID_STAG,
            Self::BaseBounds => ddp_ecode::T_BASE_BOUNDS,
        })
    }

    /// RDMAP remote protection error for Read Request sources
    /// (siw `siw_rdmap_error`).
    pub fn rdmap(self) -> TermError {
        TermError::rdmap(
            rdmap_etype::REMOTE_PROTECTION,
            match self {
                Self::InvalidStag => rdmap_ecode::INVALID_STAG,
                Self::BaseBounds => rdmap_ecode::BASE_BOUNDS,
                Self::AccessRights => rdmap_ecode::ACCESS_RIGHTS,
            },
        )
    }
}

#[derive(Debug)]
struct Region {
    stag: u32,
    va: u64,
    access: Access,
    valid: bool,
    data: Vec<u8>,
}

/// The table of registered regions.
#[derive(Debug, Default)]
pub struct MemTable {
    slots: Vec<Option<Region>>,
    keys: Vec<u8>,
    free: Vec<usize>,
}

impl MemTable {
    /// Registers `data` at base address `va`; returns the STag (never 0).
    pub fn register(&mut self, data: Vec<u8>, va: u64, access: Access) -> u32 {
        let idx = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(None);
                self.keys.push(0);
                self.slots.len() - 1
            }
        };
        self.keys[idx] = self.keys[idx].wrapping_add(1);
        // Index 0 is never handed out with key 0, so STag 0 stays unused.
        let stag = (((idx as u32) + 1) << 8) | self.keys[idx] as u32;
        self.slots[idx] = Some(Region {
            stag,
            va,
            access,
            valid: true,
            data,
        });
        stag
    }

    fn slot(&self, stag: u32) -> Option<&Region> {
        let idx = (stag >> 8).checked_sub(1)? as usize;
        self.slots.get(idx)?.as_ref().filter(|r| r.stag == stag)
    }

    fn slot_mut(&mut self, stag: u32) -> Option<&mut Region> {
        let idx = (stag >> 8).checked_sub(1)? as usize;
        self.slots.get_mut(idx)?.as_mut().filter(|r| r.stag == stag)
    }

    /// Removes a region and returns its buffer.
    pub fn deregister(&mut self, stag: u32) -> Option<Vec<u8>> {
        let idx = (stag >> 8).checked_sub(1)? as usize;
        let slot = self.slots.get_mut(idx)?;
        if slot.as_ref().map(|r| r.stag) != Some(stag) {
            return None;
        }
        self.free.push(idx);
        slot.take().map(|r| r.data)
    }

    /// Marks a region invalid (local or remote invalidate). Returns false if
    /// the STag is unknown.
    pub fn invalidate(&mut self, stag: u32) -> bool {
        match self.slot_mut(stag) {
            Some(r) => {
                r.valid = false;
                true
            }
            None => false,
        }
    }

    /// Remote invalidation (Send with Invalidate): needs a valid region with
    /// [`Access::REMOTE_INVALIDATE`].
    pub fn remote_invalidate(&mut self, stag: u32) -> bool {
        match self.slot_mut(stag) {
            Some(r) if r.valid && r.access.contains(Access::REMOTE_INVALIDATE) => {
                r.valid = false;
                true
            }
            _ => false,
        }
    }

    /// Makes a region valid again (fast re-registration).
    pub fn revalidate(&mut self, stag: u32) -> bool {
        match self.slot_mut(stag) {
            Some(r) => {
                r.valid = true;
                true
            }
            None => false,
        }
    }

    /// Whether the STag is registered and valid.
    pub fn is_valid(&self, stag: u32) -> bool {
        self.slot(stag).is_some_and(|r| r.valid)
    }

    /// Whole buffer of a region (valid or not).
    pub fn data(&self, stag: u32) -> Option<&[u8]> {
        self.slot(stag).map(|r| r.data.as_slice())
    }

    /// Whole mutable buffer of a region.
    pub fn data_mut(&mut self, stag: u32) -> Option<&mut [u8]> {
        self.slot_mut(stag).map(|r| r.data.as_mut_slice())
    }

    fn check(
        &self,
        stag: u32,
        addr: u64,
        len: usize,
        need: Access,
    ) -> Result<(&Region, usize), AccessError> {
        let r = self
            .slot(stag)
            .filter(|r| r.valid)
            .ok_or(AccessError::InvalidStag)?;
        if !r.access.contains(need) {
            return Err(AccessError::AccessRights);
        }
        let off = addr.checked_sub(r.va).ok_or(AccessError::BaseBounds)?;
        let end = off.checked_add(len as u64).ok_or(AccessError::BaseBounds)?;
        if end > r.data.len() as u64 {
            return Err(AccessError::BaseBounds);
        }
        Ok((r, off as usize))
    }

    /// Checks an access without touching data.
    pub fn check_access(
        &self,
        stag: u32,
        addr: u64,
        len: usize,
        need: Access,
    ) -> Result<(), AccessError> {
        self.check(stag, addr, len, need).map(|_| ())
    }

    /// Borrow `len` bytes at `addr` for reading with the `need` rights.
    pub fn read(
        &self,
        stag: u32,
        addr: u64,
        len: usize,
        need: Access,
    ) -> Result<&[u8], AccessError> {
        let (r, off) = self.check(stag, addr, len, need)?;
        Ok(&r.data[off..off + len])
    }

    /// Writes `src` at `addr` with the `need` rights.
    pub fn write(
        &mut self,
        stag: u32,
        addr: u64,
        src: &[u8],
        need: Access,
    ) -> Result<(), AccessError> {
        let off = self.check(stag, addr, src.len(), need)?.1;
        let r = self.slot_mut(stag).expect("checked");
        r.data[off..off + src.len()].copy_from_slice(src);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stag_reuse_detects_stale_key() {
        let mut t = MemTable::default();
        let a = t.register(vec![0; 16], 0x1000, Access::ALL);
        assert_ne!(a, 0);
        assert!(t.deregister(a).is_some());
        let b = t.register(vec![0; 16], 0, Access::ALL);
        assert_eq!(a >> 8, b >> 8);
        assert_ne!(a, b);
        assert_eq!(t.read(a, 0, 1, Access::NONE), Err(AccessError::InvalidStag));
        assert!(t.read(b, 15, 1, Access::NONE).is_ok());
        assert_eq!(t.read(b, 15, 2, Access::NONE), Err(AccessError::BaseBounds));
        assert_eq!(t.write(b, 0, &[1], Access::REMOTE_WRITE), Ok(()));
        let c = t.register(vec![0; 16], 0x1000, Access::LOCAL_WRITE);
        assert_eq!(
            t.write(c, 0x1000, &[1], Access::REMOTE_WRITE),
            Err(AccessError::AccessRights)
        );
        assert_eq!(
            t.write(c, 0xfff, &[1], Access::LOCAL_WRITE),
            Err(AccessError::BaseBounds)
        );
        assert!(t.invalidate(c));
        assert_eq!(
            t.write(c, 0x1000, &[1], Access::LOCAL_WRITE),
            Err(AccessError::InvalidStag)
        );
    }
}

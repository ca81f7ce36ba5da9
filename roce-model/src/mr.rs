//! Memory for the RC engine: protection domains, memory regions, keys and
//! access checks (rxe `rxe_mr.c` / `rxe_pool.c` in spirit).
//!
//! A [`Memory`] table owns every [`MemoryRegion`] of one device. Keys are
//! `slot index << 8 | key byte`, the key byte drawn from a seeded generator
//! so that a stale or guessed key is unlikely to hit a re-used slot. The
//! lkey and rkey of a region are equal (as in rxe).
//!
//! All bounds arithmetic is checked: a request for `[iova, iova + len)` that
//! overflows `u64` or leaves the region is an error, never a panic.

use std::fmt;
use std::ops::{BitOr, BitOrAssign};

use thiserror::Error;

/// Access rights of a memory region (`IB_ACCESS_*` values).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Access(u32);

impl Access {
    /// No rights beyond local read.
    pub const NONE: Access = Access(0);
    /// Local write (needed for receive buffers, READ and atomic results).
    pub const LOCAL_WRITE: Access = Access(1);
    /// Remote write (RDMA WRITE target).
    pub const REMOTE_WRITE: Access = Access(2);
    /// Remote read (RDMA READ source).
    pub const REMOTE_READ: Access = Access(4);
    /// Remote atomic (CMP_AND_SWP / FETCH_AND_ADD target).
    pub const REMOTE_ATOMIC: Access = Access(8);
    /// Every right.
    pub const ALL: Access = Access(0xf);

    /// Raw bits.
    pub const fn bits(self) -> u32 {
        self.0
    }
    /// Build from raw bits (unknown bits are dropped).
    pub const fn from_bits(v: u32) -> Access {
        Access(v & 0xf)
    }
    /// Are all rights of `other` present?
    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
}

impl BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

impl BitOrAssign for Access {
    fn bitor_assign(&mut self, rhs: Access) {
        self.0 |= rhs.0;
    }
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = [
            (Access::LOCAL_WRITE, "LOCAL_WRITE"),
            (Access::REMOTE_WRITE, "REMOTE_WRITE"),
            (Access::REMOTE_READ, "REMOTE_READ"),
            (Access::REMOTE_ATOMIC, "REMOTE_ATOMIC"),
        ];
        let set: Vec<&str> = names
            .iter()
            .filter(|(a, _)| self.contains(*a))
            .map(|(_, n)| *n)
            .collect();
        if set.is_empty() {
            f.write_str("Access(NONE)")
        } else {
            write!(f, "Access({})", set.join("|"))
        }
    }
}

/// A protection domain handle. Regions and queue pairs only interact within
/// the same domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProtectionDomain(u32);

impl ProtectionDomain {
    /// A domain numbered by its owner: a device whose driver chooses PD
    /// numbers hands them to the engine as they are.
    pub const fn new(id: u32) -> ProtectionDomain {
        ProtectionDomain(id)
    }
    /// The domain's number.
    pub const fn id(self) -> u32 {
        self.0
    }
}

/// Why a memory access was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum MemError {
    /// No region with this key (never registered, deregistered, or key byte mismatch).
    #[error("invalid key {0:#010x}")]
    InvalidKey(u32),
    /// The region belongs to another protection domain.
    #[error("key {0:#010x} belongs to another protection domain")]
    PdMismatch(u32),
    /// The region was invalidated.
    #[error("key {0:#010x} was invalidated")]
    Invalidated(u32),
    /// The region lacks a right the access needs.
    #[error("key {key:#010x} lacks {need:?}")]
    AccessDenied {
        /// Key used.
        key: u32,
        /// Rights required.
        need: Access,
    },
    /// `[iova, iova + len)` is not inside the region (or overflows).
    #[error("range {iova:#x}+{len} outside region of key {key:#010x}")]
    OutOfBounds {
        /// Key used.
        key: u32,
        /// Start address.
        iova: u64,
        /// Length.
        len: u64,
    },
    /// The region table is full.
    #[error("memory region table full")]
    TableFull,
    /// The backing store refused the access.
    #[error("backing store error: {0}")]
    Backing(&'static str),
}

/// Backing store of a memory region: an owned buffer, or host/guest memory
/// behind an adapter. Offsets are relative to the region start and are
/// bounds-checked by [`Memory`] before these are called.
pub trait MemoryAccess: Send {
    /// Size of the region in bytes.
    fn size(&self) -> usize;
    /// Copy `dst.len()` bytes starting at `offset` into `dst`.
    fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<(), MemError>;
    /// Copy `src` into the region starting at `offset`.
    fn write_at(&mut self, offset: usize, src: &[u8]) -> Result<(), MemError>;
}

impl MemoryAccess for Vec<u8> {
    fn size(&self) -> usize {
        self.len()
    }
    fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<(), MemError> {
        let end = offset
            .checked_add(dst.len())
            .ok_or(MemError::Backing("overflow"))?;
        let src = self
            .get(offset..end)
            .ok_or(MemError::Backing("out of range"))?;
        dst.copy_from_slice(src);
        Ok(())
    }
    fn write_at(&mut self, offset: usize, src: &[u8]) -> Result<(), MemError> {
        let end = offset
            .checked_add(src.len())
            .ok_or(MemError::Backing("overflow"))?;
        self.get_mut(offset..end)
            .ok_or(MemError::Backing("out of range"))?
            .copy_from_slice(src);
        Ok(())
    }
}

/// Keys of a registered region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MrKeys {
    /// Local key (used in SGEs).
    pub lkey: u32,
    /// Remote key (sent to the peer).
    pub rkey: u32,
}

/// One registered memory region.
pub struct MemoryRegion {
    pd: ProtectionDomain,
    iova: u64,
    len: u64,
    access: Access,
    key: u32,
    valid: bool,
    backing: Box<dyn MemoryAccess>,
}

impl fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("pd", &self.pd)
            .field("iova", &format_args!("{:#x}", self.iova))
            .field("len", &self.len)
            .field("access", &self.access)
            .field("key", &format_args!("{:#010x}", self.key))
            .field("valid", &self.valid)
            .finish()
    }
}

impl MemoryRegion {
    /// Protection domain.
    pub fn pd(&self) -> ProtectionDomain {
        self.pd
    }
    /// First virtual address covered.
    pub fn iova(&self) -> u64 {
        self.iova
    }
    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }
    /// Is the region empty?
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Access rights.
    pub fn access(&self) -> Access {
        self.access
    }
    /// Keys (lkey == rkey).
    pub fn keys(&self) -> MrKeys {
        MrKeys {
            lkey: self.key,
            rkey: self.key,
        }
    }
    /// Still valid (not invalidated)?
    pub fn is_valid(&self) -> bool {
        self.valid
    }
    /// The backing store.
    pub fn backing(&self) -> &dyn MemoryAccess {
        self.backing.as_ref()
    }

    /// Offset of `[iova, iova+len)` inside the region, or `None` if outside.
    fn offset_of(&self, iova: u64, len: u64) -> Option<usize> {
        let off = iova.checked_sub(self.iova)?;
        let end = off.checked_add(len)?;
        if end > self.len {
            return None;
        }
        usize::try_from(off).ok()
    }
}

/// A checked, resolved range inside one region (result of an access check):
/// the store's own name for the region (`handle`), where the range starts
/// in it (`offset`, in the store's terms: an offset into an owned buffer, or
/// a virtual address a device translates) and its length. The engine only
/// carries it from a check to the reads and writes of that range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    handle: u64,
    offset: u64,
    len: usize,
}

impl Span {
    /// A range a [`MemoryStore`] has checked.
    pub const fn new(handle: u64, offset: u64, len: usize) -> Span {
        Span {
            handle,
            offset,
            len,
        }
    }
    /// The store's name for the region.
    pub fn handle(&self) -> u64 {
        self.handle
    }
    /// Where the range starts, in the store's terms.
    pub fn offset(&self) -> u64 {
        self.offset
    }
    /// Length of the range.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Is the range empty?
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Where byte `at` of a `n`-byte access lies, or an error if the access
    /// leaves the span.
    pub fn locate(&self, at: usize, n: usize) -> Result<u64, MemError> {
        let end = at.checked_add(n);
        if end.is_none_or(|e| e > self.len) {
            return Err(MemError::Backing("access past span"));
        }
        self.offset
            .checked_add(at as u64)
            .ok_or(MemError::Backing("access past span"))
    }
}

/// The memory an RC engine works on, lent by the caller at each call that
/// touches memory ([`crate::QueuePair::poll_transmit`],
/// [`crate::QueuePair::handle_packet`]): keys, protection domains, rights
/// and bounds are the store's, so a device can resolve the keys its driver
/// chose through its own translation tables and move payload straight
/// between guest memory and frames. [`Memory`] is the engine's own store
/// (owned buffers, keys it chooses).
pub trait MemoryStore {
    /// Check a local access (SGE) through `lkey`; `need` is
    /// [`Access::LOCAL_WRITE`] for writes, [`Access::NONE`] for reads.
    fn check_local(
        &self,
        pd: ProtectionDomain,
        lkey: u32,
        iova: u64,
        len: u64,
        need: Access,
    ) -> Result<Span, MemError>;
    /// Check a remote access through `rkey` needing one of the REMOTE rights.
    fn check_remote(
        &self,
        pd: ProtectionDomain,
        rkey: u32,
        iova: u64,
        len: u64,
        need: Access,
    ) -> Result<Span, MemError>;
    /// Read `dst.len()` bytes at `at` bytes into a checked span.
    fn read_span(&self, span: &Span, at: usize, dst: &mut [u8]) -> Result<(), MemError>;
    /// Write `src` at `at` bytes into a checked span.
    fn write_span(&mut self, span: &Span, at: usize, src: &[u8]) -> Result<(), MemError>;
    /// Invalidate `key` on behalf of a queue pair in `pd` (SEND_WITH_INV).
    fn invalidate_in(&mut self, pd: ProtectionDomain, key: u32) -> Result<(), MemError>;
}

/// SplitMix64: a tiny seeded generator for key bytes (deterministic in
/// tests, seed from the OS in production).
#[derive(Debug, Clone)]
struct KeyGen(u64);

impl KeyGen {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// Maximum slot index representable in a key (24 bits).
const MAX_SLOTS: usize = 1 << 24;

/// The memory-region table of one device.
pub struct Memory {
    slots: Vec<Option<MemoryRegion>>,
    free: Vec<u32>,
    keygen: KeyGen,
    next_pd: u32,
    max_regions: usize,
}

impl fmt::Debug for Memory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Memory")
            .field("regions", &self.slots.iter().flatten().count())
            .finish()
    }
}

impl Memory {
    /// An empty table; `seed` drives key generation.
    pub fn new(seed: u64) -> Memory {
        Memory {
            // Slot 0 is reserved so that no key is ever 0x000000xx.
            slots: vec![None],
            free: Vec::new(),
            keygen: KeyGen(seed),
            next_pd: 1,
            max_regions: 1 << 16,
        }
    }

    /// Limit the number of live regions (default 65536, at most 2²⁴ - 1).
    pub fn with_max_regions(mut self, n: usize) -> Memory {
        self.max_regions = n.min(MAX_SLOTS - 1);
        self
    }

    /// Allocate a protection domain.
    pub fn alloc_pd(&mut self) -> ProtectionDomain {
        let pd = ProtectionDomain(self.next_pd);
        self.next_pd = self.next_pd.wrapping_add(1).max(1);
        pd
    }

    /// Register `backing` as a region covering `[iova, iova + backing.size())`.
    pub fn register(
        &mut self,
        pd: ProtectionDomain,
        iova: u64,
        backing: impl MemoryAccess + 'static,
        access: Access,
    ) -> Result<MrKeys, MemError> {
        let len = backing.size() as u64;
        if iova.checked_add(len).is_none() {
            return Err(MemError::OutOfBounds { key: 0, iova, len });
        }
        let live = self.slots.len() - 1 - self.free.len();
        if live >= self.max_regions {
            return Err(MemError::TableFull);
        }
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                if self.slots.len() >= MAX_SLOTS {
                    return Err(MemError::TableFull);
                }
                self.slots.push(None);
                (self.slots.len() - 1) as u32
            }
        };
        let key = (slot << 8) | (self.keygen.next() & 0xff) as u32;
        self.slots[slot as usize] = Some(MemoryRegion {
            pd,
            iova,
            len,
            access,
            key,
            valid: true,
            backing: Box::new(backing),
        });
        Ok(MrKeys {
            lkey: key,
            rkey: key,
        })
    }

    /// Deregister a region and hand its backing store back.
    pub fn deregister(&mut self, lkey: u32) -> Result<Box<dyn MemoryAccess>, MemError> {
        let slot = self.slot_of(lkey)?;
        let mr = self.slots[slot].take().ok_or(MemError::InvalidKey(lkey))?;
        self.free.push(slot as u32);
        Ok(mr.backing)
    }

    /// Invalidate a region (LOCAL_INV or SEND_WITH_INV): every later access
    /// through its keys fails until [`Memory::revalidate`].
    pub fn invalidate(&mut self, key: u32) -> Result<(), MemError> {
        let slot = self.slot_of(key)?;
        let mr = self.slots[slot].as_mut().ok_or(MemError::InvalidKey(key))?;
        mr.valid = false;
        Ok(())
    }

    /// Make an invalidated region valid again, with a fresh key byte
    /// (fast re-registration); returns the new keys.
    pub fn revalidate(&mut self, key: u32) -> Result<MrKeys, MemError> {
        let slot = self.slot_of(key)?;
        let new_byte = (self.keygen.next() & 0xff) as u32;
        let mr = self.slots[slot].as_mut().ok_or(MemError::InvalidKey(key))?;
        mr.key = (mr.key & !0xff) | new_byte;
        mr.valid = true;
        Ok(mr.keys())
    }

    /// The region a key names (key byte must match).
    pub fn region(&self, key: u32) -> Option<&MemoryRegion> {
        self.lookup(key).ok()
    }

    fn slot_of(&self, key: u32) -> Result<usize, MemError> {
        let slot = (key >> 8) as usize;
        match self.slots.get(slot) {
            Some(Some(mr)) if mr.key == key => Ok(slot),
            _ => Err(MemError::InvalidKey(key)),
        }
    }

    fn lookup(&self, key: u32) -> Result<&MemoryRegion, MemError> {
        let slot = self.slot_of(key)?;
        self.slots[slot].as_ref().ok_or(MemError::InvalidKey(key))
    }

    fn check(
        &self,
        pd: ProtectionDomain,
        key: u32,
        iova: u64,
        len: u64,
        need: Access,
    ) -> Result<Span, MemError> {
        let mr = self.lookup(key)?;
        if mr.pd != pd {
            return Err(MemError::PdMismatch(key));
        }
        if !mr.valid {
            return Err(MemError::Invalidated(key));
        }
        if !mr.access.contains(need) {
            return Err(MemError::AccessDenied { key, need });
        }
        let oob = MemError::OutOfBounds { key, iova, len };
        let offset = mr.offset_of(iova, len).ok_or(oob.clone())?;
        Ok(Span {
            handle: u64::from(key >> 8),
            offset: offset as u64,
            len: usize::try_from(len).map_err(|_| oob)?,
        })
    }

    /// The slot and the offset in its backing store of `n` bytes at `at`
    /// into `span`.
    fn place(span: &Span, at: usize, n: usize) -> Result<(usize, usize), MemError> {
        let off = span.locate(at, n)?;
        let not_ours = MemError::Backing("not a span of this memory");
        let slot = usize::try_from(span.handle).map_err(|_| not_ours.clone())?;
        Ok((slot, usize::try_from(off).map_err(|_| not_ours)?))
    }

    /// Convenience for applications and tests: read through a key with no
    /// access check beyond bounds (the owner reading its own memory).
    pub fn read(&self, key: u32, iova: u64, len: usize) -> Result<Vec<u8>, MemError> {
        let mr = self.lookup(key)?;
        let off = mr
            .offset_of(iova, len as u64)
            .ok_or(MemError::OutOfBounds {
                key,
                iova,
                len: len as u64,
            })?;
        let mut v = vec![0; len];
        mr.backing.read_at(off, &mut v)?;
        Ok(v)
    }

    /// Convenience for applications and tests: write through a key with no
    /// access check beyond bounds (the owner filling its own memory).
    pub fn write(&mut self, key: u32, iova: u64, data: &[u8]) -> Result<(), MemError> {
        let slot = self.slot_of(key)?;
        let mr = self.slots[slot].as_mut().ok_or(MemError::InvalidKey(key))?;
        let off = mr
            .offset_of(iova, data.len() as u64)
            .ok_or(MemError::OutOfBounds {
                key,
                iova,
                len: data.len() as u64,
            })?;
        mr.backing.write_at(off, data)
    }
}

impl MemoryStore for Memory {
    fn check_local(
        &self,
        pd: ProtectionDomain,
        lkey: u32,
        iova: u64,
        len: u64,
        need: Access,
    ) -> Result<Span, MemError> {
        self.check(pd, lkey, iova, len, need)
    }

    fn check_remote(
        &self,
        pd: ProtectionDomain,
        rkey: u32,
        iova: u64,
        len: u64,
        need: Access,
    ) -> Result<Span, MemError> {
        self.check(pd, rkey, iova, len, need)
    }

    fn read_span(&self, span: &Span, at: usize, dst: &mut [u8]) -> Result<(), MemError> {
        let (slot, off) = Self::place(span, at, dst.len())?;
        let gone = MemError::InvalidKey((slot as u32) << 8);
        let mr = self.slots.get(slot).and_then(Option::as_ref).ok_or(gone)?;
        mr.backing.read_at(off, dst)
    }

    fn write_span(&mut self, span: &Span, at: usize, src: &[u8]) -> Result<(), MemError> {
        let (slot, off) = Self::place(span, at, src.len())?;
        let gone = MemError::InvalidKey((slot as u32) << 8);
        let mr = self
            .slots
            .get_mut(slot)
            .and_then(Option::as_mut)
            .ok_or(gone)?;
        mr.backing.write_at(off, src)
    }

    fn invalidate_in(&mut self, pd: ProtectionDomain, key: u32) -> Result<(), MemError> {
        let mr = self.lookup(key)?;
        if mr.pd != pd {
            return Err(MemError::PdMismatch(key));
        }
        self.invalidate(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_checks_and_invalidate() {
        let mut m = Memory::new(42);
        let pd = m.alloc_pd();
        let other = m.alloc_pd();
        let k = m
            .register(pd, 0x1000, vec![0u8; 64], Access::REMOTE_READ)
            .unwrap();
        assert_eq!(k.lkey, k.rkey);
        assert_ne!(k.lkey >> 8, 0);
        let s = m
            .check_remote(pd, k.rkey, 0x1000, 64, Access::REMOTE_READ)
            .unwrap();
        assert_eq!(s.len(), 64);
        assert!(matches!(
            m.check_remote(pd, k.rkey, 0x1001, 64, Access::REMOTE_READ),
            Err(MemError::OutOfBounds { .. })
        ));
        assert!(matches!(
            m.check_remote(pd, k.rkey, u64::MAX, 2, Access::REMOTE_READ),
            Err(MemError::OutOfBounds { .. })
        ));
        assert!(matches!(
            m.check_remote(pd, k.rkey, 0xfff, 1, Access::REMOTE_READ),
            Err(MemError::OutOfBounds { .. })
        ));
        assert!(matches!(
            m.check_remote(pd, k.rkey, 0x1000, 8, Access::REMOTE_WRITE),
            Err(MemError::AccessDenied { .. })
        ));
        assert_eq!(
            m.check_remote(other, k.rkey, 0x1000, 8, Access::REMOTE_READ),
            Err(MemError::PdMismatch(k.rkey))
        );
        assert_eq!(
            m.check_remote(pd, k.rkey ^ 1, 0x1000, 8, Access::REMOTE_READ),
            Err(MemError::InvalidKey(k.rkey ^ 1))
        );
        m.invalidate(k.rkey).unwrap();
        assert_eq!(
            m.check_remote(pd, k.rkey, 0x1000, 8, Access::REMOTE_READ),
            Err(MemError::Invalidated(k.rkey))
        );
        let k2 = m.revalidate(k.rkey).unwrap();
        assert!(m
            .check_remote(pd, k2.rkey, 0x1000, 8, Access::REMOTE_READ)
            .is_ok());
        m.deregister(k2.lkey).unwrap();
        assert!(m.region(k2.lkey).is_none());
    }

    #[test]
    fn span_io() {
        let mut m = Memory::new(1);
        let pd = m.alloc_pd();
        let k = m.register(pd, 100, vec![0u8; 16], Access::ALL).unwrap();
        let s = m
            .check_local(pd, k.lkey, 104, 8, Access::LOCAL_WRITE)
            .unwrap();
        m.write_span(&s, 2, b"abc").unwrap();
        assert!(m.write_span(&s, 6, b"abc").is_err());
        let mut out = [0u8; 3];
        m.read_span(&s, 2, &mut out).unwrap();
        assert_eq!(&out, b"abc");
        assert_eq!(m.read(k.lkey, 106, 3).unwrap(), b"abc");
        assert!(m.read(k.lkey, 110, 7).is_err());
    }
}

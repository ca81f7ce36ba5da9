//! Guest memory as QEMU hands it over with `VFIO_USER_DMA_MAP`: a bounded,
//! sorted table of non-overlapping IOVA ranges, each either a shared mmap of
//! the file descriptor QEMU sent, or a placeholder for a range QEMU mapped
//! without a file descriptor (which the device cannot reach).
//!
//! The table is only ever used under the server's state lock, so a
//! `DMA_UNMAP` cannot run while a device call is touching memory: the unmap
//! waits for the call to finish, then drops the mapping (`munmap`).

use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};

use pci_model::{Dma, DmaError};
use vm_memory::mmap::MmapRegionError;
use vm_memory::{FileOffset, MmapRegion, VolatileMemory};

/// Default bound on the number of DMA mappings a client may hold.
///
/// QEMU maps one range per RAM block section (RAM below and above 4 GiB,
/// BIOS, option ROMs, ...), typically fewer than 16.
pub const DEFAULT_MAX_DMA_REGIONS: usize = 64;

/// Why a `DMA_MAP` or `DMA_UNMAP` was refused.
#[derive(Debug, thiserror::Error)]
pub enum MapError {
    /// Size 0.
    #[error("empty DMA range")]
    Empty,
    /// `iova + size` wraps, or the size does not fit this host's `usize`.
    #[error("DMA range {iova:#x}+{size:#x} wraps or is too large")]
    Overflow {
        /// First address.
        iova: u64,
        /// Size in bytes.
        size: u64,
    },
    /// The range overlaps a range already mapped.
    #[error("DMA range {iova:#x}+{size:#x} overlaps an existing mapping")]
    Overlap {
        /// First address.
        iova: u64,
        /// Size in bytes.
        size: u64,
    },
    /// The table is full.
    #[error("too many DMA mappings (limit {0})")]
    TooMany(usize),
    /// The file descriptor is not a regular file (memfd, tmpfs, hugetlbfs).
    #[error("DMA file descriptor is not a regular file")]
    NotRegularFile,
    /// `offset + size` is past the end of the file: touching it would SIGBUS.
    #[error("DMA range ends past the end of its file ({file_len:#x} bytes)")]
    PastEof {
        /// Length of the file.
        file_len: u64,
    },
    /// `fstat` of the file descriptor failed.
    #[error("fstat of DMA file descriptor: {0}")]
    Stat(#[source] std::io::Error),
    /// `mmap` failed (e.g. unaligned offset, read-only descriptor).
    #[error("mmap of DMA file descriptor: {0}")]
    Mmap(#[source] MmapRegionError),
    /// An unmap range cuts a mapping in two; nothing was unmapped.
    #[error("DMA unmap {iova:#x}+{size:#x} splits a mapping")]
    Split {
        /// First address.
        iova: u64,
        /// Size in bytes.
        size: u64,
    },
    /// Unmap flags this server does not implement (dirty page tracking).
    #[error("unsupported DMA unmap flags {0:#x}")]
    UnsupportedFlags(u32),
}

impl MapError {
    /// The errno a vfio-user reply would carry.
    pub fn errno(&self) -> i32 {
        match self {
            MapError::TooMany(_) => libc::ENOSPC,
            MapError::Stat(_) => libc::EBADF,
            MapError::Mmap(_) => libc::ENOMEM,
            MapError::UnsupportedFlags(_) => libc::ENOTSUP,
            _ => libc::EINVAL,
        }
    }
}

struct Mapping {
    iova: u64,
    /// Last address (inclusive), so that a range may end at `u64::MAX`.
    last: u64,
    writable: bool,
    /// `None`: mapped by the client without a file descriptor (or without
    /// read permission): the device cannot reach it.
    mem: Option<MmapRegion>,
}

/// The DMA mappings of one client connection.
pub struct DmaTable {
    maps: Vec<Mapping>,
    limit: usize,
    refused: AtomicU64,
}

impl std::fmt::Debug for DmaTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut l = f.debug_list();
        for m in &self.maps {
            l.entry(&format_args!(
                "{:#x}..={:#x} {}{}",
                m.iova,
                m.last,
                if m.mem.is_some() { "r" } else { "-" },
                if m.writable && m.mem.is_some() {
                    "w"
                } else {
                    "-"
                }
            ));
        }
        l.finish()
    }
}

impl DmaTable {
    /// An empty table holding at most `limit` mappings.
    pub fn new(limit: usize) -> Self {
        DmaTable {
            maps: Vec::new(),
            limit,
            refused: AtomicU64::new(0),
        }
    }

    /// Number of mappings.
    pub fn len(&self) -> usize {
        self.maps.len()
    }

    /// No mappings.
    pub fn is_empty(&self) -> bool {
        self.maps.is_empty()
    }

    /// Device accesses refused so far (outside any mapping, into a mapping
    /// without memory, or a write into a read-only mapping).
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Adds the range `iova..iova+size`, backed by `fd` at `offset` when
    /// given (a shared mapping, writable if `writable`), else recorded as
    /// unreachable. Refuses empty, wrapping, overlapping, past-EOF ranges
    /// and more than the limit of mappings.
    pub fn map(
        &mut self,
        readable: bool,
        writable: bool,
        offset: u64,
        iova: u64,
        size: u64,
        fd: Option<File>,
    ) -> Result<(), MapError> {
        if size == 0 {
            return Err(MapError::Empty);
        }
        let last = iova
            .checked_add(size - 1)
            .ok_or(MapError::Overflow { iova, size })?;
        let len = usize::try_from(size).map_err(|_| MapError::Overflow { iova, size })?;
        if self.maps.iter().any(|m| m.iova <= last && iova <= m.last) {
            return Err(MapError::Overlap { iova, size });
        }
        if self.maps.len() >= self.limit {
            return Err(MapError::TooMany(self.limit));
        }
        let mem = match fd {
            Some(file) if readable => {
                let meta = file.metadata().map_err(MapError::Stat)?;
                if !meta.file_type().is_file() {
                    return Err(MapError::NotRegularFile);
                }
                let end = offset
                    .checked_add(size)
                    .ok_or(MapError::Overflow { iova, size })?;
                if end > meta.len() {
                    return Err(MapError::PastEof {
                        file_len: meta.len(),
                    });
                }
                let prot = if writable {
                    libc::PROT_READ | libc::PROT_WRITE
                } else {
                    libc::PROT_READ
                };
                let region = MmapRegion::<()>::build(
                    Some(FileOffset::new(file, offset)),
                    len,
                    prot,
                    libc::MAP_SHARED | libc::MAP_NORESERVE,
                )
                .map_err(MapError::Mmap)?;
                Some(region)
            }
            _ => None,
        };
        let at = self.maps.partition_point(|m| m.iova < iova);
        self.maps.insert(
            at,
            Mapping {
                iova,
                last,
                writable,
                mem,
            },
        );
        Ok(())
    }

    /// Removes every mapping inside `iova..iova+size` (all of them with
    /// `all`). A range that cuts a mapping is refused and changes nothing.
    /// Returns the number of mappings removed.
    pub fn unmap(&mut self, iova: u64, size: u64, all: bool) -> Result<usize, MapError> {
        if all {
            let n = self.maps.len();
            self.maps.clear();
            return Ok(n);
        }
        if size == 0 {
            return Err(MapError::Empty);
        }
        let last = iova
            .checked_add(size - 1)
            .ok_or(MapError::Overflow { iova, size })?;
        let overlapping = |m: &Mapping| m.iova <= last && iova <= m.last;
        if self
            .maps
            .iter()
            .any(|m| overlapping(m) && (m.iova < iova || m.last > last))
        {
            return Err(MapError::Split { iova, size });
        }
        let before = self.maps.len();
        self.maps.retain(|m| !overlapping(m));
        Ok(before - self.maps.len())
    }

    /// Drops every mapping.
    pub fn clear(&mut self) {
        self.maps.clear();
    }

    fn find(&self, addr: u64) -> Option<&Mapping> {
        let i = self.maps.partition_point(|m| m.iova <= addr);
        let m = self.maps.get(i.checked_sub(1)?)?;
        (addr <= m.last).then_some(m)
    }

    /// Walks `len` bytes at `addr` through consecutive mappings, calling
    /// `visit(region, offset in region, offset in buffer, count)` for each
    /// piece, only after checking that every piece is reachable.
    fn walk(
        &self,
        addr: u64,
        len: usize,
        write: bool,
        mut visit: impl FnMut(&MmapRegion, usize, usize, usize),
    ) -> Result<(), DmaError> {
        let err = DmaError { addr, len };
        for pass in 0..2 {
            let mut done = 0usize;
            let mut cur = addr;
            while done < len {
                let m = self.find(cur).ok_or(err)?;
                let mem = m.mem.as_ref().ok_or(err)?;
                if write && !m.writable {
                    return Err(err);
                }
                let off = cur - m.iova;
                let avail = (m.last - cur).saturating_add(1);
                let n = usize::try_from(avail).unwrap_or(usize::MAX).min(len - done);
                let off = usize::try_from(off).map_err(|_| err)?;
                if pass == 1 {
                    visit(mem, off, done, n);
                }
                done += n;
                if done < len {
                    // n <= avail, so this only fails past u64::MAX.
                    cur = cur.checked_add(n as u64).ok_or(err)?;
                }
            }
        }
        Ok(())
    }

    fn count(&self, r: Result<(), DmaError>) -> Result<(), DmaError> {
        if r.is_err() {
            self.refused.fetch_add(1, Ordering::Relaxed);
        }
        r
    }
}

impl Dma for DmaTable {
    /// Reads guest memory; an access spanning adjacent mappings is served
    /// piecewise. Refused (and counted) if any byte is unreachable.
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), DmaError> {
        let mut failed = false;
        let r = self.walk(addr, buf.len(), false, |mem, off, at, n| {
            match mem.get_slice(off, n) {
                Ok(s) => {
                    s.copy_to(&mut buf[at..at + n]);
                }
                Err(_) => failed = true,
            }
        });
        let r = match r {
            Ok(()) if failed => Err(DmaError {
                addr,
                len: buf.len(),
            }),
            r => r,
        };
        self.count(r)
    }

    /// Writes guest memory; all or nothing across adjacent mappings (every
    /// piece is checked before the first byte is written).
    fn write(&self, addr: u64, data: &[u8]) -> Result<(), DmaError> {
        let mut failed = false;
        let r = self.walk(addr, data.len(), true, |mem, off, at, n| {
            match mem.get_slice(off, n) {
                Ok(s) => s.copy_from(&data[at..at + n]),
                Err(_) => failed = true,
            }
        });
        let r = match r {
            Ok(()) if failed => Err(DmaError {
                addr,
                len: data.len(),
            }),
            r => r,
        };
        self.count(r)
    }
}

/// A [`Dma`] view that refuses everything while the driver has bus
/// mastering off (as a real function cannot DMA then), counting refusals in
/// the table.
pub(crate) struct GatedDma<'a> {
    pub(crate) table: &'a DmaTable,
    pub(crate) bus_master: bool,
}

impl Dma for GatedDma<'_> {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), DmaError> {
        if !self.bus_master {
            return self.table.count(Err(DmaError {
                addr,
                len: buf.len(),
            }));
        }
        self.table.read(addr, buf)
    }
    fn write(&self, addr: u64, data: &[u8]) -> Result<(), DmaError> {
        if !self.bus_master {
            return self.table.count(Err(DmaError {
                addr,
                len: data.len(),
            }));
        }
        self.table.write(addr, data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file(len: usize) -> File {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&vec![0u8; len]).unwrap();
        f
    }

    #[test]
    fn map_read_write_span_unmap() {
        let mut t = DmaTable::new(4);
        let f = file(0x3000);
        t.map(true, true, 0, 0x10000, 0x1000, Some(f.try_clone().unwrap()))
            .unwrap();
        t.map(true, true, 0x1000, 0x11000, 0x2000, Some(f)).unwrap();
        // spanning write and read back
        t.write(0x10ffe, &[1, 2, 3, 4]).unwrap();
        let mut b = [0u8; 4];
        t.read(0x10ffe, &mut b).unwrap();
        assert_eq!(b, [1, 2, 3, 4]);
        // past the end
        assert!(t.read(0x12fff, &mut b).is_err());
        assert!(t.read(0xffff, &mut b).is_err());
        assert_eq!(t.refused(), 2);
        // split refused, exact unmap ok
        assert!(matches!(
            t.unmap(0x10000, 0x800, false),
            Err(MapError::Split { .. })
        ));
        assert_eq!(t.unmap(0x10000, 0x1000, false).unwrap(), 1);
        assert!(t.read(0x10000, &mut b).is_err());
        t.read(0x11000, &mut b).unwrap();
        assert_eq!(b, [3, 4, 0, 0]);
    }

    #[test]
    fn refuses_bad_maps() {
        let mut t = DmaTable::new(2);
        assert!(matches!(
            t.map(true, true, 0, 0, 0, None),
            Err(MapError::Empty)
        ));
        assert!(matches!(
            t.map(true, true, 0, u64::MAX, 2, None),
            Err(MapError::Overflow { .. })
        ));
        assert!(matches!(
            t.map(true, true, 0, 0, 0x2000, Some(file(0x1000))),
            Err(MapError::PastEof { .. })
        ));
        assert!(matches!(
            t.map(true, true, u64::MAX - 0x1000, 0, 0x2000, Some(file(0x1000))),
            Err(MapError::Overflow { .. })
        ));
        t.map(true, true, 0, 0x1000, 0x1000, None).unwrap();
        assert!(matches!(
            t.map(true, true, 0, 0x1800, 0x1000, None),
            Err(MapError::Overlap { .. })
        ));
        t.map(true, false, 0, 0x4000, 0x1000, Some(file(0x1000)))
            .unwrap();
        assert!(matches!(
            t.map(true, true, 0, 0x8000, 0x1000, None),
            Err(MapError::TooMany(2))
        ));
        // fd-less: unreachable; read-only: no writes
        let mut b = [0u8; 1];
        assert!(t.read(0x1000, &mut b).is_err());
        t.read(0x4000, &mut b).unwrap();
        assert!(t.write(0x4000, &b).is_err());
        assert_eq!(t.unmap(0, 0, true).unwrap(), 2);
        assert!(t.is_empty());
    }
}

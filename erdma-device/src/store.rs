//! The memory the RC engines work on: the driver's MRs (its stags, PDs and
//! rights, translated through their MTTs) and the local DMA key, over guest
//! memory. Lent to `roce_model` at each call that moves payload, so a send
//! gathers from guest memory straight into the frame and a received packet
//! lands straight in the guest buffer; nothing is staged in the daemon.

use std::cell::Cell;

use pci_model::Dma;
use roce_model::{Access, MemError, MemoryStore, ProtectionDomain, Span};

use crate::mr::{acc, MrTable, XlateError};

/// Span handle of the local DMA key: above every stag (stags are 32-bit).
const LOCAL_DMA_HANDLE: u64 = 1 << 32;

/// The driver's memory as the engines see it, for the length of one call.
pub(crate) struct GuestStore<'a> {
    mrs: &'a mut MrTable,
    dma: &'a dyn Dma,
    local_dma_key: u32,
    /// Guest accesses that failed (counted by the device after the call).
    dma_errors: Cell<u64>,
}

impl<'a> GuestStore<'a> {
    pub(crate) fn new(mrs: &'a mut MrTable, dma: &'a dyn Dma, local_dma_key: u32) -> Self {
        GuestStore {
            mrs,
            dma,
            local_dma_key,
            dma_errors: Cell::new(0),
        }
    }

    /// Guest accesses that failed during the call.
    pub(crate) fn dma_errors(&self) -> u64 {
        self.dma_errors.get()
    }

    fn check(
        &self,
        pd: ProtectionDomain,
        key: u32,
        iova: u64,
        len: u64,
        need: u8,
        remote: bool,
    ) -> Result<Span, MemError> {
        let span_len =
            usize::try_from(len).map_err(|_| MemError::OutOfBounds { key, iova, len })?;
        // The local DMA key names guest-physical memory for the kernel's own
        // SGEs; a peer may never use it.
        if key == self.local_dma_key && !remote {
            if iova.checked_add(len).is_none() {
                return Err(MemError::OutOfBounds { key, iova, len });
            }
            return Ok(Span::new(LOCAL_DMA_HANDLE, iova, span_len));
        }
        let mr = self
            .mrs
            .lookup(key, Some(pd.id()), need)
            .map_err(|e| mem_error(e, key, iova, len, need))?;
        mr.check(iova, len)
            .map_err(|e| mem_error(e, key, iova, len, need))?;
        Ok(Span::new(u64::from(key), iova, span_len))
    }

    fn count(&self, e: XlateError) -> MemError {
        if matches!(e, XlateError::Dma(_)) {
            self.dma_errors.set(self.dma_errors.get() + 1);
        }
        MemError::Backing("guest memory")
    }
}

/// roce-model access rights as erdma MR access bits.
fn rights(need: Access) -> u8 {
    let mut a = 0;
    if need.contains(Access::LOCAL_WRITE) {
        a |= acc::LW;
    }
    if need.contains(Access::REMOTE_WRITE) {
        a |= acc::RW;
    }
    if need.contains(Access::REMOTE_READ) {
        a |= acc::RR;
    }
    if need.contains(Access::REMOTE_ATOMIC) {
        a |= acc::RA;
    }
    a
}

fn mem_error(e: XlateError, key: u32, iova: u64, len: u64, need: u8) -> MemError {
    match e {
        XlateError::InvalidKey(k) => MemError::InvalidKey(k),
        XlateError::NotValid(k) => MemError::Invalidated(k),
        XlateError::PdMismatch => MemError::PdMismatch(key),
        XlateError::Access => MemError::AccessDenied {
            key,
            need: Access::from_bits(u32::from(need)),
        },
        XlateError::OutOfRange | XlateError::BadMtt | XlateError::Dma(_) => {
            MemError::OutOfBounds { key, iova, len }
        }
    }
}

impl MemoryStore for GuestStore<'_> {
    fn check_local(
        &self,
        pd: ProtectionDomain,
        lkey: u32,
        iova: u64,
        len: u64,
        need: Access,
    ) -> Result<Span, MemError> {
        self.check(pd, lkey, iova, len, rights(need), false)
    }

    fn check_remote(
        &self,
        pd: ProtectionDomain,
        rkey: u32,
        iova: u64,
        len: u64,
        need: Access,
    ) -> Result<Span, MemError> {
        self.check(pd, rkey, iova, len, rights(need), true)
    }

    fn read_span(&self, span: &Span, at: usize, dst: &mut [u8]) -> Result<(), MemError> {
        let va = span.locate(at, dst.len())?;
        if span.handle() == LOCAL_DMA_HANDLE {
            return self
                .dma
                .read(va, dst)
                .map_err(|e| self.count(XlateError::Dma(e)));
        }
        // Resolved again: the MR may have been deregistered or invalidated
        // since the check (a long READ response, a retransmission).
        let key = span.handle() as u32;
        let mr = self
            .mrs
            .lookup(key, None, 0)
            .map_err(|e| mem_error(e, key, va, dst.len() as u64, 0))?;
        mr.read(self.dma, va, dst).map_err(|e| self.count(e))
    }

    fn write_span(&mut self, span: &Span, at: usize, src: &[u8]) -> Result<(), MemError> {
        let va = span.locate(at, src.len())?;
        if span.handle() == LOCAL_DMA_HANDLE {
            return self
                .dma
                .write(va, src)
                .map_err(|e| self.count(XlateError::Dma(e)));
        }
        let key = span.handle() as u32;
        let mr = self
            .mrs
            .lookup(key, None, 0)
            .map_err(|e| mem_error(e, key, va, src.len() as u64, 0))?;
        mr.write(self.dma, va, src).map_err(|e| self.count(e))
    }

    fn invalidate_in(&mut self, pd: ProtectionDomain, key: u32) -> Result<(), MemError> {
        let mr = self
            .mrs
            .get_mut(key >> 8)
            .filter(|m| m.key == (key & 0xff) as u8)
            .ok_or(MemError::InvalidKey(key))?;
        if mr.pd != pd.id() {
            return Err(MemError::PdMismatch(key));
        }
        mr.valid = false;
        Ok(())
    }
}

//! Fixed-size receive buffers identified by ids (the device side of a
//! buffer ring, e.g. dmabuf-backed payload buffers or header buffers).
//!
//! The pool only tracks ownership; it never touches memory. A buffer is
//! *free* once posted, *held* once a frame was placed in it, and free again
//! after [`BufferPool::recycle`]. A held buffer is never handed out again, so
//! data the consumer still owns is never overwritten.

use std::collections::{HashSet, VecDeque};

use crate::error::NicError;

/// A buffer id, chosen by whoever posts the buffer.
pub type BufferId = u32;

/// A pool of equally sized buffers.
#[derive(Debug, Clone)]
pub struct BufferPool {
    buf_size: usize,
    free: VecDeque<BufferId>,
    free_set: HashSet<BufferId>,
    held: HashSet<BufferId>,
}

impl BufferPool {
    /// An empty pool of `buf_size`-byte buffers.
    pub fn new(buf_size: usize) -> Result<Self, NicError> {
        if buf_size == 0 {
            return Err(NicError::ZeroBufferSize);
        }
        Ok(BufferPool {
            buf_size,
            free: VecDeque::new(),
            free_set: HashSet::new(),
            held: HashSet::new(),
        })
    }

    /// Size of every buffer in bytes.
    pub fn buf_size(&self) -> usize {
        self.buf_size
    }

    /// Makes a new buffer available. Fails if the id is already free or held.
    pub fn post(&mut self, id: BufferId) -> Result<(), NicError> {
        if self.held.contains(&id) {
            return Err(NicError::InUse(id));
        }
        if !self.free_set.insert(id) {
            return Err(NicError::AlreadyPosted(id));
        }
        self.free.push_back(id);
        Ok(())
    }

    /// Returns a held buffer to the free list (the consumer is done with it,
    /// e.g. `SO_DEVMEM_DONTNEED`).
    pub fn recycle(&mut self, id: BufferId) -> Result<(), NicError> {
        if !self.held.remove(&id) {
            return Err(NicError::NotInUse(id));
        }
        self.free_set.insert(id);
        self.free.push_back(id);
        Ok(())
    }

    /// Number of free buffers.
    pub fn available(&self) -> usize {
        self.free.len()
    }

    /// Number of held buffers.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// True if `id` is held by a placed frame.
    pub fn is_held(&self, id: BufferId) -> bool {
        self.held.contains(&id)
    }

    /// Takes `n` buffers in FIFO order, or none if fewer are free.
    pub(crate) fn take(&mut self, n: usize) -> Option<Vec<BufferId>> {
        if self.free.len() < n {
            return None;
        }
        let ids: Vec<BufferId> = self.free.drain(..n).collect();
        for id in &ids {
            self.free_set.remove(id);
            self.held.insert(*id);
        }
        Some(ids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifecycle() {
        let mut p = BufferPool::new(4096).unwrap();
        assert_eq!(BufferPool::new(0).unwrap_err(), NicError::ZeroBufferSize);
        p.post(1).unwrap();
        p.post(2).unwrap();
        assert_eq!(p.post(1), Err(NicError::AlreadyPosted(1)));
        assert_eq!(p.take(3), None);
        assert_eq!(p.available(), 2, "a failed take consumes nothing");
        assert_eq!(p.take(1), Some(vec![1]));
        assert!(p.is_held(1));
        assert_eq!(p.post(1), Err(NicError::InUse(1)));
        assert_eq!(p.recycle(2), Err(NicError::NotInUse(2)));
        p.recycle(1).unwrap();
        assert_eq!(p.recycle(1), Err(NicError::NotInUse(1)));
        assert_eq!(p.take(2), Some(vec![2, 1]));
        assert_eq!(p.held(), 2);
        assert_eq!(p.available(), 0);
    }
}

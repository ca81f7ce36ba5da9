//! Shared receive queue.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use super::wr::{QpError, RecvWr};

#[derive(Debug)]
struct SrqInner {
    wqes: VecDeque<RecvWr>,
    max_wr: usize,
    max_sge: usize,
}

/// A receive queue shared by several QPs. Cloning gives another handle to
/// the same queue. WQEs are consumed in FIFO order by whichever QP needs one
/// first; they are not flushed when one of those QPs enters ERROR.
#[derive(Debug, Clone)]
pub struct SharedReceiveQueue {
    inner: Arc<Mutex<SrqInner>>,
}

impl SharedReceiveQueue {
    /// An SRQ holding at most `max_wr` WQEs of at most `max_sge` SGEs.
    pub fn new(max_wr: usize, max_sge: usize) -> SharedReceiveQueue {
        SharedReceiveQueue {
            inner: Arc::new(Mutex::new(SrqInner {
                wqes: VecDeque::new(),
                max_wr,
                max_sge,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, SrqInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Post a receive WQE.
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), QpError> {
        let mut g = self.lock();
        if g.wqes.len() >= g.max_wr {
            return Err(QpError::RecvQueueFull(g.max_wr));
        }
        if wr.sg_list.len() > g.max_sge {
            return Err(QpError::InvalidWr("too many SGEs"));
        }
        g.wqes.push_back(wr);
        Ok(())
    }

    /// WQEs posted and not consumed.
    pub fn len(&self) -> usize {
        self.lock().wqes.len()
    }

    /// Is the SRQ empty?
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(super) fn take(&self) -> Option<RecvWr> {
        self.lock().wqes.pop_front()
    }
}

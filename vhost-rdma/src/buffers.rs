//! Recycled frame buffers: the hot path takes a buffer when it reads a TX
//! chain and gives it back once the frame is written into an RX chain, so
//! switching a frame allocates nothing in the steady state.
//!
//! Two sizes are kept: [`BUF_CAP`] for frames up to a 1500-byte MTU's, and
//! [`BIG_CAP`] for the largest frame a TX chain may carry (a 64 KiB TSO
//! frame). Without the second, each TSO frame grew a fresh allocation
//! through several reallocations, zeroed it and faulted its pages in, then
//! freed it: an eighth of the daemon's CPU under a guest's TCP stream.
//!
//! Frames are read on one thread (a TX worker) and freed on another (an RX
//! worker or a device pump), so each thread keeps a small local stack per
//! size and trades with one shared stack a batch at a time: one lock per
//! batch of frames, not per frame. Memory stays bounded: at most
//! [`SHARED_MAX`] small and [`BIG_SHARED_MAX`] big buffers are shared, and
//! twice a batch of each per thread; buffers of other sizes (segments,
//! copies) are simply freed.

use crate::virtio_net::MAX_FRAME_LEN;
use std::cell::RefCell;
use std::sync::Mutex;

/// Capacity of a pooled buffer: any frame of a 1500-byte MTU, and the
/// 2 KiB buffers guests post.
pub const BUF_CAP: usize = 2048;
/// Buffers moved between a thread's stack and the shared one at a time.
pub const BATCH: usize = 64;
/// Most buffers a thread keeps for itself.
pub const LOCAL_MAX: usize = 2 * BATCH;
/// Most buffers kept in the shared stack (8 MiB).
pub const SHARED_MAX: usize = 4096;
/// Capacity of a big pooled buffer: the largest frame a TX chain may carry.
pub const BIG_CAP: usize = MAX_FRAME_LEN;
/// Big buffers moved between a thread's stack and the shared one at a time.
pub const BIG_BATCH: usize = 4;
/// Most big buffers kept in the shared stack (4 MiB).
pub const BIG_SHARED_MAX: usize = 64;

/// One size of pooled buffer.
struct Class {
    /// Which of a thread's stacks holds it.
    slot: usize,
    cap: usize,
    batch: usize,
    shared_max: usize,
    shared: Mutex<Vec<Vec<u8>>>,
}

static SMALL: Class = Class::new(0, BUF_CAP, BATCH, SHARED_MAX);
static BIG: Class = Class::new(1, BIG_CAP, BIG_BATCH, BIG_SHARED_MAX);

thread_local! {
    /// This thread's stacks: small buffers, big buffers.
    static LOCAL: RefCell<[Vec<Vec<u8>>; 2]> = const { RefCell::new([Vec::new(), Vec::new()]) };
}

impl Class {
    const fn new(slot: usize, cap: usize, batch: usize, shared_max: usize) -> Class {
        Class {
            slot,
            cap,
            batch,
            shared_max,
            shared: Mutex::new(Vec::new()),
        }
    }

    fn take(&'static self) -> Vec<u8> {
        LOCAL
            .try_with(|l| {
                let l = &mut l.borrow_mut()[self.slot];
                if l.is_empty() {
                    let mut s = self.shared.lock().unwrap_or_else(|e| e.into_inner());
                    let n = s.len().min(self.batch);
                    let at = s.len() - n;
                    l.extend(s.drain(at..));
                }
                l.pop()
            })
            .ok()
            .flatten()
            .unwrap_or_else(|| Vec::with_capacity(self.cap))
    }

    fn give(&'static self, b: Vec<u8>) {
        let _ = LOCAL.try_with(|l| {
            let l = &mut l.borrow_mut()[self.slot];
            l.push(b);
            if l.len() > 2 * self.batch {
                let mut s = self.shared.lock().unwrap_or_else(|e| e.into_inner());
                let room = self.shared_max.saturating_sub(s.len()).min(self.batch);
                let at = l.len() - self.batch;
                s.extend(l.drain(at..).take(room));
                // Whatever did not fit was dropped by `drain`: freed.
            }
        });
    }
}

/// A buffer of capacity [`BUF_CAP`], recycled when one is free. Its length
/// and contents are whatever its last frame left (stale bytes of this
/// process, never shown to anyone): the caller overwrites and truncates, so
/// that a reused buffer is not zeroed again for every frame.
pub fn take() -> Vec<u8> {
    SMALL.take()
}

/// A buffer of capacity [`BIG_CAP`], recycled when one is free; its length
/// and contents are stale as [`take`]'s are.
pub fn take_big() -> Vec<u8> {
    BIG.take()
}

/// Gives a frame's buffer back for reuse (buffers of another capacity are
/// freed).
pub fn give(b: Vec<u8>) {
    match b.capacity() {
        BUF_CAP => SMALL.give(b),
        BIG_CAP => BIG.give(b),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `take` gives buffers of `cap`, the same one again after `give` with
    /// its length kept, and buffers freed on another thread go to `shared`
    /// within its bound.
    fn pool_works(take: fn() -> Vec<u8>, cap: usize, shared: &Mutex<Vec<Vec<u8>>>, max: usize) {
        let mut v = take();
        assert_eq!(v.capacity(), cap);
        v.resize(cap, 7);
        let p = v.as_ptr();
        give(v);
        let w = take();
        assert_eq!(w.as_ptr(), p, "the same buffer is reused");
        assert_eq!(w.len(), cap, "its length is kept: no zeroing again");
        give(w);
        // Freed on one thread, taken on another: through the shared stack.
        let bufs: Vec<Vec<u8>> = (0..4 * max.min(LOCAL_MAX)).map(|_| take()).collect();
        std::thread::spawn(move || bufs.into_iter().for_each(give))
            .join()
            .unwrap();
        // (Other tests take from the shared stack concurrently: only the
        // bound is certain.)
        let n = shared.lock().unwrap().len();
        assert!(n <= max, "{n}");
    }

    #[test]
    fn buffers_come_back_and_stay_bounded() {
        pool_works(take, BUF_CAP, &SMALL.shared, SHARED_MAX);
        // Odd sizes are not kept.
        give(Vec::with_capacity(65536));
    }

    #[test]
    fn big_buffers_come_back_and_stay_bounded() {
        pool_works(take_big, BIG_CAP, &BIG.shared, BIG_SHARED_MAX);
    }
}

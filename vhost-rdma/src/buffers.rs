//! Recycled frame buffers: the hot path takes a buffer when it reads a TX
//! chain and gives it back once the frame is written into an RX chain, so
//! switching a frame allocates nothing in the steady state.
//!
//! Frames are read on one thread (a TX worker) and freed on another (an RX
//! worker), so each thread keeps a small local stack and trades with one
//! shared stack a batch at a time: one lock per [`BATCH`] frames, not per
//! frame. Memory stays bounded: at most [`SHARED_MAX`] buffers are shared and
//! [`LOCAL_MAX`] per thread; buffers of other sizes (TSO frames, segments)
//! are simply freed.

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

static SHARED: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

thread_local! {
    static LOCAL: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// A buffer of capacity [`BUF_CAP`], recycled when one is free. Its length
/// and contents are whatever its last frame left (stale bytes of this
/// process, never shown to anyone): the caller overwrites and truncates, so
/// that a reused buffer is not zeroed again for every frame.
pub fn take() -> Vec<u8> {
    LOCAL
        .try_with(|l| {
            let mut l = l.borrow_mut();
            if l.is_empty() {
                let mut s = SHARED.lock().unwrap_or_else(|e| e.into_inner());
                let n = s.len().min(BATCH);
                let at = s.len() - n;
                l.extend(s.drain(at..));
            }
            l.pop()
        })
        .ok()
        .flatten()
        .unwrap_or_else(|| Vec::with_capacity(BUF_CAP))
}

/// Gives a frame's buffer back for reuse (buffers of another capacity are
/// freed).
pub fn give(b: Vec<u8>) {
    if b.capacity() != BUF_CAP {
        return;
    }
    let _ = LOCAL.try_with(|l| {
        let mut l = l.borrow_mut();
        l.push(b);
        if l.len() > LOCAL_MAX {
            let mut s = SHARED.lock().unwrap_or_else(|e| e.into_inner());
            let room = SHARED_MAX.saturating_sub(s.len()).min(BATCH);
            let at = l.len() - BATCH;
            s.extend(l.drain(at..).take(room));
            // Whatever did not fit was dropped by `drain`: freed.
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_and_stay_bounded() {
        let mut v = take();
        assert_eq!(v.capacity(), BUF_CAP);
        v.extend_from_slice(&[1, 2, 3]);
        let p = v.as_ptr();
        give(v);
        let w = take();
        assert_eq!(w.as_ptr(), p, "the same buffer is reused");
        assert_eq!(w.capacity(), BUF_CAP);
        give(w);
        // Odd sizes are not kept.
        give(Vec::with_capacity(65536));
        // Freed on one thread, taken on another: through the shared stack.
        let bufs: Vec<Vec<u8>> = (0..4 * LOCAL_MAX).map(|_| take()).collect();
        std::thread::spawn(move || bufs.into_iter().for_each(give))
            .join()
            .unwrap();
        // (Other tests take from the shared stack concurrently: only the
        // bound is certain.)
        let shared = SHARED.lock().unwrap().len();
        assert!(shared <= SHARED_MAX, "{shared}");
    }
}

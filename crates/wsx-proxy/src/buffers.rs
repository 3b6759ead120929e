//! Relay buffers: taken while data flows, given back when a direction idles, within a budget.
//!
//! A session's relay holds, each way, a small buffer of [`SMALL`] bytes for as long as it
//! lives, and a large one (the configured `relay_buffer`) only while data flows: a read that
//! fills the small buffer asks for a large one, and a read that finds nothing waiting gives it
//! back. Idle sessions therefore cost their small buffers, not `2 × relay_buffer`.
//!
//! Large buffers come out of [`RelayBuffers`], whose budget bounds the bytes lent at once.
//! When it is spent, a session goes on with its small buffer: slower per system call,
//! never stopped (fail open). Given-back buffers wait in a short free list per thread, so
//! a busy relay reuses memory without a lock or a fresh allocation.

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// The buffer every relay direction keeps.
pub(crate) const SMALL: usize = 2048;

/// Large buffers kept for reuse per thread.
const FREE_PER_THREAD: usize = 32;

thread_local! {
    static FREE: RefCell<Vec<Box<[u8]>>> = const { RefCell::new(Vec::new()) };
}

/// The budget large relay buffers are lent from.
#[derive(Debug)]
pub(crate) struct RelayBuffers {
    budget: usize,
    lent: AtomicUsize,
    /// Of `lent`, the bytes taken for read-ahead ([`Self::take_bytes`]).
    read_ahead: AtomicUsize,
    /// Requests refused because the budget was spent.
    refused: AtomicU64,
}

impl RelayBuffers {
    /// Lends at most `budget` bytes at once.
    pub(crate) fn new(budget: usize) -> Arc<Self> {
        Arc::new(Self {
            budget,
            lent: AtomicUsize::new(0),
            read_ahead: AtomicUsize::new(0),
            refused: AtomicU64::new(0),
        })
    }

    /// A buffer of `size` bytes, unless the budget is spent.
    pub(crate) fn take(self: &Arc<Self>, size: usize) -> Option<Buffer> {
        let before = self.lent.fetch_add(size, Ordering::Relaxed);
        if before + size > self.budget {
            self.lent.fetch_sub(size, Ordering::Relaxed);
            self.refused.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let reused = FREE.with(|free| {
            let mut free = free.borrow_mut();
            let at = free.iter().rposition(|b| b.len() == size)?;
            Some(free.swap_remove(at))
        });
        let bytes = reused.unwrap_or_else(|| vec![0; size].into_boxed_slice());
        Some(Buffer {
            bytes,
            from: self.clone(),
        })
    }

    /// Up to `want` bytes of the budget for the SMB engine's read-ahead, as many as are
    /// left, and never more than half the budget for read-ahead in all: the buffers keep
    /// the other half. Give them back with [`Self::give_bytes`].
    pub(crate) fn take_bytes(&self, want: usize) -> usize {
        let take = |counter: &AtomicUsize, limit: usize, want: usize| {
            let mut granted = 0;
            let _ = counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                granted = want.min(limit.saturating_sub(used));
                (granted > 0).then_some(used + granted)
            });
            granted
        };
        let share = take(&self.read_ahead, self.budget / 2, want);
        let granted = take(&self.lent, self.budget, share);
        if granted < share {
            self.read_ahead
                .fetch_sub(share - granted, Ordering::Relaxed);
        }
        if granted < want {
            self.refused.fetch_add(1, Ordering::Relaxed);
        }
        granted
    }

    /// Gives back `bytes` taken with [`Self::take_bytes`].
    pub(crate) fn give_bytes(&self, bytes: usize) {
        self.read_ahead.fetch_sub(bytes, Ordering::Relaxed);
        self.lent.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// Bytes lent now.
    pub(crate) fn lent(&self) -> usize {
        self.lent.load(Ordering::Relaxed)
    }

    /// The most bytes lent at once.
    pub(crate) fn budget(&self) -> usize {
        self.budget
    }

    /// Requests refused so far for want of budget.
    pub(crate) fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

/// A large buffer on loan; dropping it gives it back.
#[derive(Debug)]
pub(crate) struct Buffer {
    bytes: Box<[u8]>,
    from: Arc<RelayBuffers>,
}

impl std::ops::Deref for Buffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

impl std::ops::DerefMut for Buffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.bytes
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        self.from
            .lent
            .fetch_sub(self.bytes.len(), Ordering::Relaxed);
        let bytes = std::mem::take(&mut self.bytes);
        // During thread teardown the list may be gone: the buffer is simply freed.
        let _ = FREE.try_with(|free| {
            let mut free = free.borrow_mut();
            if free.len() < FREE_PER_THREAD {
                free.push(bytes);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_bounds_what_is_lent_and_returns_with_each_buffer() {
        let pool = RelayBuffers::new(100);
        let a = pool.take(60);
        assert!(a.is_some());
        assert!(pool.take(60).is_none(), "over the budget");
        assert_eq!(pool.refused(), 1);
        let b = pool.take(40);
        assert!(b.is_some());
        assert_eq!(pool.lent(), 100);
        drop(a);
        assert_eq!(pool.lent(), 40);
        let c = pool.take(60).map(|c| c.len());
        assert_eq!(c, Some(60));
        drop(b);
        assert_eq!(pool.lent(), 0, "everything came back");
    }

    #[test]
    fn bytes_taken_for_read_ahead_share_the_budget_with_buffers() {
        let pool = RelayBuffers::new(100);
        let a = pool.take(60);
        assert_eq!(pool.take_bytes(70), 40, "what is left");
        assert_eq!(pool.refused(), 1);
        assert_eq!(pool.take_bytes(10), 0);
        assert!(pool.take(1).is_none(), "buffers wait for the bytes too");
        pool.give_bytes(40);
        drop(a);
        assert_eq!(pool.lent(), 0);
        // Read-ahead takes half the budget at most: the buffers keep the rest.
        assert_eq!(pool.take_bytes(100), 50);
        assert_eq!(pool.take_bytes(1), 0);
        assert!(pool.take(50).is_some());
        pool.give_bytes(50);
        assert_eq!(pool.lent(), 0);
    }

    #[test]
    fn a_given_back_buffer_is_reused() {
        let pool = RelayBuffers::new(1 << 20);
        let first = pool.take(4096).map(|b| b.as_ptr());
        let again = pool.take(4096).map(|b| b.as_ptr());
        assert_eq!(
            first, again,
            "the same memory, from this thread's free list"
        );
    }
}

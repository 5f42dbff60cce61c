//! A lock-free stack of chunk indices that any thread pushes to and only the
//! owner takes from, all at once.
//!
//! Invariants: `head` holds `index + 1` of the newest pushed chunk (0 =
//! empty); `next[i]` holds `index + 1` of the chunk pushed before `i`. Only
//! pushes use compare-exchange; the owner takes the whole list with one
//! `swap(0)`, so no node is ever popped from under a pusher and the stack
//! has no ABA problem (a pusher links to whatever the head is at its CAS).

use crate::sync::{AtomicU32, AtomicU64};
use std::sync::atomic::Ordering;

/// The cross-thread return path of an arena.
#[derive(Debug)]
pub(crate) struct ReturnStack {
    head: AtomicU64,
    next: Box<[AtomicU32]>,
}

impl ReturnStack {
    /// A stack for chunk indices `0..capacity`.
    pub fn new(capacity: u32) -> Self {
        Self {
            head: AtomicU64::new(0),
            next: (0..capacity).map(|_| AtomicU32::new(0)).collect(),
        }
    }

    /// Pushes chunk `index` (which the caller owns; it must not be in the
    /// stack already).
    pub fn push(&self, index: u32) {
        // Relaxed: the value is only a guess for the CAS below.
        let mut head = self.head.load(Ordering::Relaxed);
        loop {
            // Relaxed: published by the Release CAS that follows.
            self.next[index as usize].store(head as u32, Ordering::Relaxed);
            // Release pairs with the Acquire swap in `take_all`: the owner
            // sees our `next` link and every write we made to the chunk.
            match self.head.compare_exchange_weak(
                head,
                u64::from(index) + 1,
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(actual) => head = actual,
            }
        }
    }

    /// Takes every pushed index (newest first) into `out`.
    pub fn take_all(&self, out: &mut Vec<u32>) {
        // Acquire pairs with the Release CAS of every push in the release
        // sequence we read, making their `next` links visible.
        let mut cursor = self.head.swap(0, Ordering::Acquire) as u32;
        while cursor != 0 {
            let index = cursor - 1;
            out.push(index);
            // Relaxed: ordered by the Acquire swap above.
            cursor = self.next[index as usize].load(Ordering::Relaxed);
        }
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;

    #[test]
    fn loom_concurrent_returns_are_all_taken_once() {
        loom::model(|| {
            let stack = Arc::new(ReturnStack::new(4));
            let handles: Vec<_> = (0..2u32)
                .map(|i| {
                    let s = stack.clone();
                    loom::thread::spawn(move || s.push(i))
                })
                .collect();
            let mut got = Vec::new();
            stack.take_all(&mut got);
            for h in handles {
                h.join().unwrap();
            }
            stack.take_all(&mut got);
            got.sort_unstable();
            assert_eq!(got, vec![0, 1]);
        });
    }

    #[test]
    fn loom_push_after_take_relinks() {
        loom::model(|| {
            let stack = Arc::new(ReturnStack::new(4));
            stack.push(3);
            let s = stack.clone();
            let t = loom::thread::spawn(move || {
                s.push(1);
                s.push(2);
            });
            let mut got = Vec::new();
            stack.take_all(&mut got);
            t.join().unwrap();
            stack.take_all(&mut got);
            got.sort_unstable();
            assert_eq!(got, vec![1, 2, 3]);
        });
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn threads_return_every_index_exactly_once() {
        let stack = Arc::new(ReturnStack::new(4096));
        let threads: Vec<_> = (0..4u32)
            .map(|t| {
                let s = stack.clone();
                std::thread::spawn(move || (0..1024).for_each(|i| s.push(t * 1024 + i)))
            })
            .collect();
        let mut got = Vec::new();
        while got.len() < 4096 {
            stack.take_all(&mut got);
            std::hint::spin_loop();
        }
        for t in threads {
            t.join().expect("pusher panicked");
        }
        stack.take_all(&mut got);
        got.sort_unstable();
        assert_eq!(got, (0..4096).collect::<Vec<u32>>());
    }
}

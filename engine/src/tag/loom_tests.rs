//! `loom` model checks of the tag set: batch get against free, deferred
//! clear, batched wakeups, and no lost wakeup when waiters outnumber tags.
//!
//! Run with (their own target dir, as the loom cfg changes every crate):
//! `RUSTFLAGS="--cfg loom -C debug-assertions" CARGO_TARGET_DIR=target/loom cargo test --release -p plugio-executor -p plugio-device -p plugio-engine --lib loom`
//!
//! State space: each model keeps to two to four threads and one to four
//! words. The preemption bound defaults to 3, to 2 for the depth-32 wake
//! batch model (its waiters scan four words under swap locks; it also passes
//! at 3, in about 50 s) and to 1 for the four-thread wake-batch-2 model,
//! unless `LOOM_MAX_PREEMPTIONS` is set. A lost wakeup shows as a loom deadlock
//! (a `block_on` that can never finish).

use loom::future::block_on;
use loom::sync::Arc;
use loom::thread;

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use super::batch::MaskTags;
use super::{Tag, TagOptions, TagSet};

/// Runs `body` under loom with a default preemption bound of `bound`.
fn model(bound: usize, body: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(bound);
    }
    builder.check(body);
}

fn tag_set(depth: u32, options: TagOptions) -> Arc<TagSet> {
    Arc::new(
        TagSet::new(
            depth,
            TagOptions {
                nr_cores: 3,
                ..options
            },
        )
        .expect("valid tag set"),
    )
}

/// Takes every tag; returns them.
fn take_all(set: &TagSet) -> Vec<Tag> {
    let mut tags = Vec::new();
    assert_eq!(
        set.get_tags(0, set.depth() as usize, &mut tags),
        set.depth() as usize
    );
    tags
}

/// Asserts that the sets of tags are pairwise disjoint and that the bitmap
/// counts exactly their union as busy.
fn assert_exclusive(set: &TagSet, holders: &[Vec<Tag>]) {
    let mut all = HashSet::new();
    for tag in holders.iter().flatten() {
        assert!(tag.as_u32() < set.depth());
        assert!(all.insert(*tag), "{tag} held twice");
    }
    assert_eq!(set.busy() as usize, all.len());
}

#[test]
fn loom_batch_get_vs_free() {
    model(3, || {
        // One word of 4 bits; tags 0 and 1 held, 2 and 3 free.
        let set = tag_set(
            4,
            TagOptions {
                shift: Some(2),
                ..TagOptions::default()
            },
        );
        let first = set.get(0).expect("tag");
        let second = set.get(0).expect("tag");
        let freer = {
            let set = Arc::clone(&set);
            thread::spawn(move || {
                set.put_batch(0, &[first]);
                let mut held = vec![second];
                held.extend(set.get(0));
                held
            })
        };
        let batcher = {
            let set = Arc::clone(&set);
            thread::spawn(move || {
                set.get_batch(1, 2)
                    .map(|(offset, mask)| MaskTags { offset, mask }.collect::<Vec<_>>())
                    .unwrap_or_default()
            })
        };
        let held = [
            freer.join().expect("freer"),
            batcher.join().expect("batcher"),
        ];
        assert_exclusive(&set, &held);
        // Two tags were free and one more was freed: three were up for grabs.
        assert!(held[0].len() + held[1].len() >= 2);
    });
}

#[test]
fn loom_batch_get_vs_deferred_free() {
    model(3, || {
        // One full word of 4 bits; a holder frees two tags the deferred way
        // while a batch get finds the word full and moves `cleared` back.
        let set = tag_set(
            4,
            TagOptions {
                shift: Some(2),
                ..TagOptions::default()
            },
        );
        let tags = take_all(&set);
        let (freed, kept) = (tags[..2].to_vec(), tags[2..].to_vec());
        let freer = {
            let set = Arc::clone(&set);
            thread::spawn(move || {
                freed.iter().for_each(|tag| set.put(0, *tag));
                set.get(0).into_iter().collect::<Vec<_>>()
            })
        };
        let batch = set
            .get_batch(1, 2)
            .map(|(offset, mask)| MaskTags { offset, mask }.collect::<Vec<_>>())
            .unwrap_or_default();
        let regot = freer.join().expect("freer");
        let rest: Vec<Tag> = std::iter::from_fn(|| set.get(2)).collect();
        assert_eq!(batch.len() + regot.len() + rest.len(), 2);
        assert_exclusive(&set, &[kept, batch, regot, rest]);
    });
}

#[test]
fn loom_deferred_clear_frees_are_never_lost() {
    model(3, || {
        let set = tag_set(2, TagOptions::default()); // one word of 2 bits
        let tags = take_all(&set);
        let putters: Vec<_> = tags
            .iter()
            .enumerate()
            .map(|(core, &tag)| {
                let set = Arc::clone(&set);
                thread::spawn(move || set.put(core, tag))
            })
            .collect();
        let got: Vec<Tag> = std::iter::from_fn(|| set.get(2)).collect();
        putters.into_iter().for_each(|p| p.join().expect("putter"));
        // Whatever the interleaving, every freed tag can be taken again.
        let rest: Vec<Tag> = std::iter::from_fn(|| set.get(2)).collect();
        assert_eq!(got.len() + rest.len(), 2);
        assert_exclusive(&set, &[got, rest]);
    });
}

#[test]
fn loom_deferred_clear_move_is_atomic_for_waiters() {
    // The 2024 race: a mover has swapped `cleared` out but not yet cleared
    // it from `word`; a waiter that then sees a full word and an empty
    // `cleared` must not park, or with wake batch 2 and one free left it
    // is never woken.
    model(3, || {
        let options = TagOptions {
            shift: Some(6),
            wake_batch: Some(2),
            ..TagOptions::default()
        };
        let set = tag_set(3, options);
        let tags = take_all(&set);
        set.put(0, tags[0]);
        set.put(0, tags[1]); // two deferred frees; tags[2] stays held
        let mover = {
            let set = Arc::clone(&set);
            thread::spawn(move || {
                let tag = set.get(0).expect("two tags are free");
                set.put(0, tag);
            })
        };
        let waiter = {
            let set = Arc::clone(&set);
            thread::spawn(move || {
                let batch = block_on(set.acquire(1, 1));
                set.put_batch(1, &batch);
            })
        };
        mover.join().expect("mover");
        waiter.join().expect("waiter");
        assert_eq!(set.busy(), 1);
    });
}

#[test]
fn loom_wake_batch_of_8_wakes_every_waiter() {
    // Depth 32 (4 words of 8), wake batch 8: all tags held, one thread frees
    // 8 in a batch, two waiters must both get tags.
    model(2, || {
        let options = TagOptions {
            wake_batch: Some(8),
            wait_queues: 2,
            ..TagOptions::default()
        };
        let set = tag_set(32, options);
        let mut held = take_all(&set);
        held.sort();
        let freed: Vec<Tag> = held.drain(..8).collect();
        let waiters: Vec<_> = (1..3)
            .map(|core| {
                let set = Arc::clone(&set);
                thread::spawn(move || {
                    let batch = block_on(set.acquire(core, 1));
                    set.put_batch(core, &batch);
                })
            })
            .collect();
        set.put_batch(0, &freed);
        waiters.into_iter().for_each(|w| w.join().expect("waiter"));
        assert_eq!(set.busy(), 24);
    });
}

#[test]
fn loom_more_waiters_than_tags() {
    // Depth 1: two waiters, one tag, passed from hand to hand.
    model(3, || {
        let set = tag_set(1, TagOptions::default());
        let tag = set.get(0).expect("tag");
        let waiters: Vec<_> = (1..3)
            .map(|core| {
                let set = Arc::clone(&set);
                thread::spawn(move || {
                    let batch = block_on(set.acquire(core, 1));
                    assert_eq!(batch.len(), 1);
                    set.put_batch(core, &batch);
                })
            })
            .collect();
        set.put(0, tag);
        waiters.into_iter().for_each(|w| w.join().expect("waiter"));
        assert_eq!(set.busy(), 0);
    });
}

#[test]
fn loom_more_waiters_than_tags_with_wake_batch_2() {
    // Depth 2, wake batch 2: three waiters, both tags freed together; each
    // waiter takes one tag and frees it, so wakes come in pairs. Four
    // threads: preemption bound 1 (bound 2 runs for over ten minutes).
    model(1, || {
        let set = tag_set(
            2,
            TagOptions {
                wake_batch: Some(2),
                ..TagOptions::default()
            },
        );
        let tags = take_all(&set);
        let waiters: Vec<_> = (0..3)
            .map(|core| {
                let set = Arc::clone(&set);
                thread::spawn(move || {
                    let batch = block_on(set.acquire(core, 1));
                    set.put_batch(core, &batch);
                })
            })
            .collect();
        set.put_batch(0, &tags);
        waiters.into_iter().for_each(|w| w.join().expect("waiter"));
        assert_eq!(set.busy(), 0);
    });
}

#[test]
fn loom_dropped_waiter_never_strands_others() {
    model(3, || {
        let set = tag_set(
            1,
            TagOptions {
                wait_queues: 1,
                ..TagOptions::default()
            },
        );
        let tag = set.get(0).expect("tag");
        let quitter = {
            let set = Arc::clone(&set);
            thread::spawn(move || {
                let mut future = set.acquire(1, 1);
                let waker = futures::task::noop_waker();
                let poll = Pin::new(&mut future).poll(&mut Context::from_waker(&waker));
                if let Poll::Ready(batch) = poll {
                    set.put_batch(1, &batch);
                }
                // Dropped here: pending, maybe already woken.
            })
        };
        let waiter = {
            let set = Arc::clone(&set);
            thread::spawn(move || {
                let batch = block_on(set.acquire(2, 1));
                set.put_batch(2, &batch);
            })
        };
        set.put(0, tag);
        quitter.join().expect("quitter");
        waiter.join().expect("waiter");
        assert_eq!(set.busy(), 0);
    });
}

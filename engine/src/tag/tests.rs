//! Unit tests of the tag set: shapes, single and batch gets, frees, options,
//! multi-threaded ownership, and async exhaustion/wake.

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use proptest::prelude::*;

use super::batch::MaskTags;
use super::*;

const EDGE_DEPTHS: [u32; 7] = [1, 7, 32, 64, 65, 1023, 4096];

fn options(nr_cores: usize) -> TagOptions {
    TagOptions {
        nr_cores,
        ..TagOptions::default()
    }
}

fn set(depth: u32) -> TagSet {
    TagSet::new(depth, options(4)).expect("valid tag set")
}

/// Takes every tag with single gets; checks they are distinct and in range.
fn drain_single(set: &TagSet, core: usize) -> Vec<Tag> {
    let mut seen = HashSet::new();
    while let Some(tag) = set.get(core) {
        assert!(tag.as_u32() < set.depth(), "{tag} out of range");
        assert!(seen.insert(tag), "{tag} handed out twice");
    }
    assert_eq!(seen.len(), set.depth() as usize);
    seen.into_iter().collect()
}

#[test]
fn shift_rule_matches_the_kernel() {
    // (depth, bits per word, words): the worked values of the reference plus
    // the edge depths.
    let cases = [
        (1, 64, 1),
        (3, 64, 1),
        (4, 1, 4),
        (7, 1, 7),
        (32, 8, 4),
        (64, 16, 4),
        (65, 16, 5),
        (128, 32, 4),
        (256, 64, 4),
        (1023, 64, 16),
        (4096, 64, 64),
    ];
    for (depth, bits, words) in cases {
        let set = set(depth);
        assert_eq!(set.bits_per_word(), bits, "depth {depth}");
        assert_eq!(set.nr_words(), words, "depth {depth}");
    }
}

#[test]
fn wake_batch_is_clamped_depth_over_8() {
    for (depth, batch) in [(1, 1), (7, 1), (32, 4), (64, 8), (4096, 8)] {
        assert_eq!(set(depth).wake_batch(), batch, "depth {depth}");
    }
}

#[test]
fn bad_arguments_are_typed_errors() {
    assert_eq!(TagSet::new(0, options(1)).err(), Some(TagError::ZeroDepth));
    assert_eq!(
        TagSet::new(MAX_DEPTH + 1, options(1)).err(),
        Some(TagError::DepthTooLarge {
            depth: MAX_DEPTH + 1
        })
    );
    assert_eq!(TagSet::new(8, options(0)).err(), Some(TagError::ZeroCores));
    let bad_shift = TagOptions {
        shift: Some(7),
        ..options(1)
    };
    assert_eq!(
        TagSet::new(8, bad_shift).err(),
        Some(TagError::BadShift { shift: 7 })
    );
    let bad_batch = TagOptions {
        wake_batch: Some(9),
        ..options(1)
    };
    assert_eq!(
        TagSet::new(8, bad_batch).err(),
        Some(TagError::BadWakeBatch {
            wake_batch: 9,
            depth: 8
        })
    );
    let bad_queues = TagOptions {
        wait_queues: 9,
        ..options(1)
    };
    assert_eq!(
        TagSet::new(8, bad_queues).err(),
        Some(TagError::BadWaitQueues { wait_queues: 9 })
    );
    assert!(TagError::ZeroDepth.to_string().contains("at least 1"));
}

#[test]
fn edge_depths_single_get_put_cycles() {
    for depth in EDGE_DEPTHS {
        for deferred_clear in [true, false] {
            let set = TagSet::new(
                depth,
                TagOptions {
                    deferred_clear,
                    ..options(3)
                },
            )
            .expect("valid tag set");
            for round in 0..3 {
                let tags = drain_single(&set, round);
                assert_eq!(set.get(round), None, "depth {depth}: full set gave a tag");
                assert_eq!(set.busy(), depth);
                for tag in &tags {
                    set.put(round, *tag);
                }
                assert_eq!(set.busy(), 0, "depth {depth}");
            }
        }
    }
}

#[test]
fn edge_depths_batch_get_all() {
    for depth in EDGE_DEPTHS {
        let set = set(depth);
        for core in 0..4 {
            let mut tags = Vec::new();
            let got = set.get_tags(core, depth as usize, &mut tags);
            assert_eq!(got, depth as usize, "depth {depth}");
            let unique: HashSet<Tag> = tags.iter().copied().collect();
            assert_eq!(
                unique.len(),
                depth as usize,
                "depth {depth}: duplicate tags"
            );
            assert!(tags.iter().all(|tag| tag.as_u32() < depth));
            assert_eq!(set.get_tags(core, 1, &mut tags), 0);
            tags.sort();
            set.put_batch(core, &tags);
            assert_eq!(set.busy(), 0);
        }
    }
}

#[test]
fn batch_of_64_uses_the_shift_guard() {
    let set = set(4096);
    let (offset, mask) = set.get_batch(0, 64).expect("an empty word gives a batch");
    assert_eq!(mask, u64::MAX);
    assert_eq!(offset % 64, 0);
    let stats = set.stats();
    assert_eq!(
        (stats.batch_calls, stats.batch_tags, stats.partial_batches),
        (1, 64, 0)
    );
}

#[test]
fn batch_mask_holds_only_free_bits_of_the_window() {
    // One 64-bit word: take tags 0..8 singly, free 2 and 5, then ask for 8.
    let set = TagSet::new(
        64,
        TagOptions {
            shift: Some(6),
            ..options(1)
        },
    )
    .expect("valid");
    let tags: Vec<Tag> = (0..8).map(|_| set.get(0).expect("free tag")).collect();
    assert_eq!(
        tags.iter().map(|t| t.as_u32()).collect::<Vec<_>>(),
        (0..8).collect::<Vec<_>>()
    );
    set.put_batch(0, &[Tag::new(2), Tag::new(5)]);
    // The window starts at the first zero (bit 2) and spans 2..10: bits 2,
    // 5, 8 and 9 are free; 3, 4, 6, 7 stay with their holders.
    let (offset, mask) = set.get_batch(0, 8).expect("batch");
    assert_eq!(offset, 2);
    let got: Vec<u32> = MaskTags { offset, mask }.map(Tag::as_u32).collect();
    assert_eq!(got, vec![2, 5, 8, 9]);
    assert_eq!(set.stats().partial_batches, 1);
}

#[test]
fn window_that_does_not_fit_skips_the_word_and_singles_fill_in() {
    // depth 64 = 4 words of 16: hold bit 0 of every word, so a 16-wide
    // window never fits; get_tags falls back to single gets.
    let set = set(64);
    let all = drain_single(&set, 0);
    for tag in all.iter().filter(|tag| tag.as_u32() % 16 != 0) {
        set.put(0, *tag);
    }
    assert_eq!(set.get_batch(0, 16), None);
    assert_eq!(set.stats().empty_batches, 1);
    let mut tags = TagBatch::new();
    assert_eq!(set.get_tags(0, 20, &mut tags), 20);
    assert!(set.stats().single_calls >= 20);
}

#[test]
fn retry_loop_gathers_from_several_words() {
    let set = set(64); // 4 words of 16
    let mut tags = Vec::new();
    assert_eq!(set.get_batch_retry(0, 40, &mut tags), 40);
    let stats = set.stats();
    assert_eq!(stats.batch_calls, 3); // 16 + 16 + 8
    assert_eq!(stats.single_calls, 0);
    assert_eq!(stats.tags_per_batch(), 40.0 / 3.0);
}

#[test]
fn ablation_options_change_the_path_not_the_result() {
    let runs = [(true, true), (true, false), (false, true), (false, false)];
    for (batch, batch_retry) in runs {
        let set = TagSet::new(
            64,
            TagOptions {
                batch,
                batch_retry,
                ..options(1)
            },
        )
        .expect("valid");
        let mut tags = Vec::new();
        assert_eq!(set.get_tags(0, 40, &mut tags), 40);
        let stats = set.stats();
        match (batch, batch_retry) {
            (true, true) => assert_eq!((stats.batch_calls, stats.single_calls), (3, 0)),
            (true, false) => assert_eq!((stats.batch_calls, stats.single_calls), (1, 24)),
            _ => assert_eq!((stats.batch_calls, stats.single_calls), (0, 40)),
        }
    }
}

#[test]
fn round_robin_hands_tags_out_in_order() {
    let set = TagSet::new(
        16,
        TagOptions {
            round_robin: true,
            ..options(1)
        },
    )
    .expect("valid");
    let first: Vec<u32> = (0..6).map(|_| set.get(0).expect("tag").as_u32()).collect();
    assert_eq!(first, vec![0, 1, 2, 3, 4, 5]);
    set.put(0, Tag::new(1));
    assert_eq!(
        set.get(0).map(Tag::as_u32),
        Some(6),
        "cursor moves on, not back"
    );
    assert_eq!(set.get_batch(0, 4), None, "round robin never batches");
    // Drain: the freed tag 1 is found after the cursor wraps.
    let rest: HashSet<u32> = std::iter::from_fn(|| set.get(0)).map(Tag::as_u32).collect();
    assert!(rest.contains(&1));
    assert_eq!(rest.len(), 16 - 7 + 1);
}

#[test]
fn put_sets_the_hint_of_the_allocating_core() {
    let set = set(1023); // 16 words of 64
    let all = drain_single(&set, 0);
    let tag = *all.iter().find(|t| t.as_u32() == 700).expect("tag 700");
    set.put(2, tag);
    assert_eq!(set.get(2), Some(tag));
}

#[cfg(debug_assertions)]
#[test]
#[should_panic(expected = "not held")]
fn put_of_an_unowned_tag_is_a_debug_assertion() {
    let set = set(32);
    set.put(0, Tag::new(3));
}

#[cfg(debug_assertions)]
#[test]
#[should_panic(expected = "not held")]
fn double_put_is_a_debug_assertion() {
    let set = set(32);
    let tag = set.get(0).expect("tag");
    set.put(0, tag);
    set.put(0, tag);
}

#[cfg(debug_assertions)]
#[test]
#[should_panic(expected = "outside depth")]
fn put_out_of_range_is_a_debug_assertion() {
    set(32).put(0, Tag::new(32));
}

#[test]
#[should_panic(expected = "at most 64")]
fn tag_batch_refuses_overflow() {
    let mut batch = TagBatch::new();
    batch.extend((0..=MAX_BATCH_TAGS as u32).map(Tag::new));
}

/// Threads take and free tags with every path; a shared ownership table
/// catches any tag handed to two holders at once.
fn ownership_stress(depth: u32, deferred_clear: bool, threads: usize, rounds: usize) {
    let set = Arc::new(
        TagSet::new(
            depth,
            TagOptions {
                deferred_clear,
                ..options(threads)
            },
        )
        .expect("valid"),
    );
    let owned: Arc<Vec<AtomicBool>> =
        Arc::new((0..depth).map(|_| AtomicBool::new(false)).collect());
    let workers: Vec<_> = (0..threads)
        .map(|core| {
            let (set, owned) = (Arc::clone(&set), Arc::clone(&owned));
            std::thread::spawn(move || {
                let mut held = Vec::new();
                for round in 0..rounds {
                    let nr = 1 + (round * 7 + core) % 12;
                    match round % 3 {
                        0 => held.extend(set.get(core)),
                        1 => {
                            set.get_tags(core, nr, &mut held);
                        }
                        _ => {
                            let _ = set.get_batch_retry(core, nr, &mut held);
                        }
                    }
                    for tag in &held {
                        let was = owned[tag.index()].swap(true, Ordering::AcqRel);
                        assert!(!was, "{tag} held twice");
                    }
                    for tag in &held {
                        assert!(owned[tag.index()].swap(false, Ordering::AcqRel));
                    }
                    if round % 2 == 0 {
                        held.sort();
                        set.put_batch(core, &held);
                    } else {
                        held.iter().for_each(|tag| set.put(core, *tag));
                    }
                    held.clear();
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().expect("stress worker panicked");
    }
    assert_eq!(set.busy(), 0);
}

#[test]
fn stress_batch_masks_never_hand_out_a_tag_twice() {
    let rounds = if cfg!(debug_assertions) {
        20_000
    } else {
        200_000
    };
    for depth in [32, 65, 128] {
        ownership_stress(depth, true, 4, rounds);
        ownership_stress(depth, false, 4, rounds / 4);
    }
}

/// A waker that counts its wakes.
#[derive(Default)]
struct CountingWaker(AtomicUsize);

impl Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn counting_waker() -> (Arc<CountingWaker>, Waker) {
    let count = Arc::new(CountingWaker::default());
    (Arc::clone(&count), Waker::from(count))
}

fn poll_once(future: &mut Acquire<'_>, waker: &Waker) -> Poll<TagBatch> {
    Pin::new(future).poll(&mut Context::from_waker(waker))
}

#[test]
fn exhaustion_then_wake() {
    let set = set(4); // wake batch 1
    let held = drain_single(&set, 0);
    let (count, waker) = counting_waker();
    let mut future = set.acquire(1, 2);
    assert!(poll_once(&mut future, &waker).is_pending());
    assert_eq!(set.stats().waits, 1);
    assert_eq!(set.waiters_queued(), 1);
    set.put(0, held[0]);
    assert_eq!(count.0.load(Ordering::SeqCst), 1);
    match poll_once(&mut future, &waker) {
        Poll::Ready(batch) => assert_eq!(batch.as_slice(), &[held[0]]),
        Poll::Pending => panic!("woken waiter found no tag"),
    }
    assert_eq!(set.waiters_queued(), 0);
}

#[test]
fn waiters_are_woken_in_batches() {
    let set = set(64); // wake batch 8
    let mut held = Vec::new();
    assert_eq!(set.get_tags(0, 64, &mut held), 64);
    let wakers: Vec<_> = (0..3).map(|_| counting_waker()).collect();
    let mut futures: Vec<_> = (0..3).map(|core| set.acquire(core, 1)).collect();
    for (future, (_, waker)) in futures.iter_mut().zip(&wakers) {
        assert!(poll_once(future, waker).is_pending());
    }
    let woken = || {
        wakers
            .iter()
            .map(|(c, _)| c.0.load(Ordering::SeqCst))
            .sum::<usize>()
    };
    for tag in &held[..7] {
        set.put(0, *tag);
    }
    assert_eq!(woken(), 0, "seven frees are below the wake batch");
    set.put(0, held[7]);
    assert_eq!(woken(), 3, "the eighth free wakes the batch");
    for (future, (_, waker)) in futures.iter_mut().zip(&wakers) {
        assert!(poll_once(future, waker).is_ready());
    }
}

#[test]
fn dropped_woken_waiter_passes_its_wakeup_on() {
    let set = TagSet::new(
        1,
        TagOptions {
            wait_queues: 1,
            ..options(1)
        },
    )
    .expect("valid");
    let tag = set.get(0).expect("tag");
    let (first_count, first_waker) = counting_waker();
    let (second_count, second_waker) = counting_waker();
    let mut first = set.acquire(0, 1);
    let mut second = set.acquire(0, 1);
    assert!(poll_once(&mut first, &first_waker).is_pending());
    assert!(poll_once(&mut second, &second_waker).is_pending());
    set.put(0, tag);
    assert_eq!(first_count.0.load(Ordering::SeqCst), 1);
    assert_eq!(second_count.0.load(Ordering::SeqCst), 0);
    drop(first);
    assert_eq!(second_count.0.load(Ordering::SeqCst), 1, "wakeup handed on");
    assert!(poll_once(&mut second, &second_waker).is_ready());
}

#[test]
fn dropped_unwoken_waiter_leaves_the_queue() {
    let set = set(1);
    let tag = set.get(0).expect("tag");
    let (_, waker) = counting_waker();
    let mut future = set.acquire(0, 1);
    assert!(poll_once(&mut future, &waker).is_pending());
    drop(future);
    assert_eq!(set.waiters_queued(), 0);
    set.put(0, tag);
    assert_eq!(set.get(0), Some(tag));
}

#[test]
fn repoll_refreshes_the_waker_without_a_second_entry() {
    let set = set(1);
    let tag = set.get(0).expect("tag");
    let (old_count, old_waker) = counting_waker();
    let (new_count, new_waker) = counting_waker();
    let mut future = set.acquire(0, 1);
    assert!(poll_once(&mut future, &old_waker).is_pending());
    assert!(poll_once(&mut future, &new_waker).is_pending());
    assert_eq!(set.waiters_queued(), 1);
    set.put(0, tag);
    assert_eq!(old_count.0.load(Ordering::SeqCst), 0);
    assert_eq!(new_count.0.load(Ordering::SeqCst), 1);
}

#[test]
fn wake_all_wakes_every_waiter() {
    let set = set(1);
    let _tag = set.get(0).expect("tag");
    let wakers: Vec<_> = (0..5).map(|_| counting_waker()).collect();
    let mut futures: Vec<_> = (0..5).map(|core| set.acquire(core, 1)).collect();
    for (future, (_, waker)) in futures.iter_mut().zip(&wakers) {
        assert!(poll_once(future, waker).is_pending());
    }
    assert_eq!(set.wake_all(), 5);
    assert!(wakers.iter().all(|(c, _)| c.0.load(Ordering::SeqCst) == 1));
}

/// Many threads wait on few tags (depth 4, wake batch 1; and depth 32 with
/// wake batch 8): every acquisition must finish. A lost wakeup shows as no
/// acquisition at all for 60 s: the guard watches progress, not the total
/// time, so a loaded machine (the whole suite beside CPU hogs took minutes)
/// is not taken for a hang.
fn waiters_outnumber_tags(depth: u32, wake_batch: u32, threads: usize, rounds: usize) {
    let set = Arc::new(
        TagSet::new(
            depth,
            TagOptions {
                wake_batch: Some(wake_batch),
                ..options(threads)
            },
        )
        .expect("valid"),
    );
    let (done_tx, done_rx) = mpsc::channel();
    let acquired = Arc::new(AtomicUsize::new(0));
    for core in 0..threads {
        let (set, done_tx) = (Arc::clone(&set), done_tx.clone());
        let acquired = Arc::clone(&acquired);
        std::thread::spawn(move || {
            for round in 0..rounds {
                let batch = futures::executor::block_on(set.acquire(core, 1 + round % 5));
                assert!(!batch.is_empty());
                // Relaxed: a progress count read by the hang guard only.
                acquired.fetch_add(1, Ordering::Relaxed);
                std::thread::yield_now();
                set.put_batch(core, &batch);
            }
            let _ = done_tx.send(core);
        });
    }
    let mut finished = 0;
    // Relaxed: see above.
    let mut seen = acquired.load(Ordering::Relaxed);
    let mut idle = Duration::ZERO;
    while finished < threads {
        match done_rx.recv_timeout(Duration::from_secs(1)) {
            Ok(_) => finished += 1,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let now = acquired.load(Ordering::Relaxed);
                idle = if now == seen {
                    idle + Duration::from_secs(1)
                } else {
                    Duration::ZERO
                };
                seen = now;
                assert!(
                    idle < Duration::from_secs(60),
                    "no waiter acquired a tag for 60 s: lost wakeup"
                );
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => panic!("a waiter thread panicked"),
        }
    }
    assert_eq!(set.busy(), 0);
}

#[test]
fn more_waiters_than_tags_all_finish() {
    let rounds = if cfg!(debug_assertions) {
        2_000
    } else {
        20_000
    };
    waiters_outnumber_tags(4, 1, 8, rounds);
    waiters_outnumber_tags(32, 8, 40, rounds / 10);
}

#[derive(Debug, Clone)]
enum Op {
    Get(usize),
    Batch(usize, u32),
    Tags(usize, usize),
    Put(usize),
    PutBatch(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0usize..4).prop_map(Op::Get),
        (0usize..4, 1u32..70).prop_map(|(c, n)| Op::Batch(c, n)),
        (0usize..4, 1usize..40).prop_map(|(c, n)| Op::Tags(c, n)),
        (0usize..1000).prop_map(Op::Put),
        (0usize..1000).prop_map(Op::PutBatch),
    ]
}

proptest! {
    /// Against a plain set model: tags are never handed out twice, a single
    /// get or `get_tags` comes up short only when every tag is held, and
    /// `busy` equals the model's count.
    #[test]
    fn model_check(depth in prop::sample::select(EDGE_DEPTHS.to_vec()),
                   deferred_clear in any::<bool>(),
                   ops in prop::collection::vec(op(), 1..120)) {
        let set = TagSet::new(depth, TagOptions { deferred_clear, ..options(4) }).expect("valid");
        let mut held: Vec<Tag> = Vec::new();
        let mut model: HashSet<Tag> = HashSet::new();
        for op in ops {
            let mut new = Vec::new();
            let full_before = model.len() == depth as usize;
            match op {
                Op::Get(core) => {
                    let got = set.get(core);
                    prop_assert_eq!(got.is_none(), full_before);
                    new.extend(got);
                }
                Op::Batch(core, nr) => {
                    if let Some((offset, mask)) = set.get_batch(core, nr) {
                        prop_assert!(mask.count_ones() <= nr.min(set.bits_per_word()));
                        new.extend(MaskTags { offset, mask });
                    }
                }
                Op::Tags(core, nr) => {
                    let got = set.get_tags(core, nr, &mut new);
                    prop_assert_eq!(got, nr.min(depth as usize - model.len()));
                }
                Op::Put(pick) if !held.is_empty() => {
                    let tag = held.swap_remove(pick % held.len());
                    model.remove(&tag);
                    set.put(pick, tag);
                }
                Op::PutBatch(pick) if !held.is_empty() => {
                    let split = pick % held.len();
                    let mut tags = held.split_off(split);
                    tags.sort();
                    tags.iter().for_each(|tag| { model.remove(tag); });
                    set.put_batch(pick, &tags);
                }
                Op::Put(_) | Op::PutBatch(_) => {}
            }
            for tag in new {
                prop_assert!(tag.as_u32() < depth);
                prop_assert!(model.insert(tag), "{} handed out twice", tag);
                held.push(tag);
            }
            prop_assert_eq!(set.busy() as usize, model.len());
        }
    }
}

#[test]
fn tag_set_and_acquire_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<TagSet>();
    send::<Acquire<'static>>();
    send_sync::<TagBatch>();
}

#[test]
fn stats_count_the_paths() {
    let set = set(64); // 4 words of 16
    let mut tags = Vec::new();
    assert_eq!(set.get_tags(0, 70, &mut tags), 64); // short: the set ran dry
    let tag = set.get(1);
    assert_eq!(tag, None);
    set.put_batch(0, &tags[..10]);
    set.put(0, tags[10]);
    let stats = set.stats();
    assert_eq!(stats.batch_tags, 64);
    assert_eq!(stats.batch_calls, 5, "4 full words, then one empty try");
    assert_eq!(stats.empty_batches, 1);
    assert_eq!(stats.short_allocs, 1);
    assert_eq!((stats.single_calls, stats.single_tags), (2, 0));
    assert_eq!(stats.puts, 11);
    assert_eq!(set.busy(), 53);
}

/// Frees `tags` from a [`TagSet::gather_puts`] list, as the completion
/// path does.
fn put_gathered(set: &TagSet, core: usize, tags: &[Tag]) -> usize {
    let mut rest = vec![Tag::new(9)];
    let mut puts = set.gather_puts(&mut rest);
    assert!(puts.is_empty());
    for &tag in tags {
        puts.add(tag);
    }
    assert_eq!(puts.len(), tags.len());
    assert_eq!(puts.is_empty(), tags.is_empty());
    set.put_gathered(core, &puts, tags.len())
}

#[test]
fn gathered_puts_free_as_put_batch_does() {
    // Word shapes: a set of one chunk, of several words per chunk, of more
    // than PUT_BATCH_WORDS words (1 bit each; 64 bits each past 4096 tags).
    let shapes = [
        (7, None),
        (128, None),
        (1023, Some(3)),
        (300, Some(0)),
        (4096, None),
        (5000, None),
    ];
    for (depth, shift) in shapes {
        let make = || {
            TagSet::new(
                depth,
                TagOptions {
                    shift,
                    ..options(2)
                },
            )
            .expect("valid")
        };
        let (by_list, by_bits) = (make(), make());
        let mut held = Vec::new();
        assert_eq!(
            by_list.get_tags(0, depth as usize, &mut held),
            depth as usize
        );
        let mut held_bits = Vec::new();
        by_bits.get_tags(0, depth as usize, &mut held_bits);
        assert_eq!(held, held_bits, "depth {depth}: same tags");
        // Every third tag, in an order that is not increasing.
        let mut freed: Vec<Tag> = held.iter().copied().step_by(3).collect();
        freed.reverse();
        let mid = freed.len() / 2;
        freed.swap(0, mid);
        by_list.put_batch(1, &freed);
        assert_eq!(put_gathered(&by_bits, 1, &freed), freed.len());
        assert_eq!(by_list.busy(), by_bits.busy(), "depth {depth}");
        assert_eq!(by_list.stats(), by_bits.stats(), "depth {depth}");
        // The same tags come back, in the same order, from core 1's hint.
        let (mut again, mut again_bits) = (Vec::new(), Vec::new());
        by_list.get_tags(1, freed.len(), &mut again);
        by_bits.get_tags(1, freed.len(), &mut again_bits);
        assert_eq!(again, again_bits, "depth {depth}: same tags after");
        let mut sorted = freed.clone();
        sorted.sort();
        again.sort();
        assert_eq!(again, sorted, "depth {depth}");
        assert_eq!(by_bits.busy(), depth);
        assert_eq!(put_gathered(&by_bits, 0, &[]), 0);
        assert_eq!(
            by_bits.stats(),
            by_list.stats(),
            "an empty put counts nothing"
        );
    }
}

#[test]
#[cfg_attr(debug_assertions, ignore = "an out-of-range put is a debug assertion")]
fn gathered_puts_skip_out_of_range_tags() {
    for depth in [100, 5000] {
        let (by_list, by_bits) = (set(depth), set(depth));
        let mut held = Vec::new();
        by_list.get_tags(0, 3, &mut held);
        by_bits.get_tags(0, 3, &mut Vec::new());
        let tags = [held[0], held[1], Tag::new(depth), Tag::new(depth + 70)];
        by_list.put_batch(2, &tags);
        assert_eq!(put_gathered(&by_bits, 2, &tags), 2, "depth {depth}");
        assert_eq!(by_bits.busy(), 1);
        assert_eq!(by_bits.stats(), by_list.stats());
        assert_eq!(by_bits.stats().puts, 2);
        // Core 2's hint is the last tag in range (its word, not core 2's
        // own), as put_batch leaves it.
        let first = by_bits.get(2);
        assert_eq!(first, by_list.get(2));
        assert!(first.is_some_and(|t| t.as_u32() < 64), "{first:?}");
    }
}

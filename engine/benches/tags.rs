//! Tag allocation: single gets vs one batch get vs the 2025 batch-retry loop,
//! against a `Mutex<Vec<u32>>` free list, on one and two threads.
//!
//! One iteration = take the tags of one plug flush (32, the plug's default
//! `max_count`) from a depth-1023 set (an NVMe I/O queue), then free them all
//! with one batch free (one lock for the free list). "empty" starts from a
//! free set; "half" first holds a fixed random half of the tags for the whole
//! run, so batch windows come back partial and the retry loop matters.
//!
//! Run: `cargo bench -p plugio-engine --bench tags`

use std::hint::black_box;
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use criterion::{criterion_main, BenchmarkId, Criterion};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;

use plugio_engine::tag::{Tag, TagOptions, TagSet};

const DEPTH: u32 = 1023;
const FLUSH_TAGS: usize = 32;

/// What hands out the tags.
#[derive(Clone, Copy)]
enum Allocator {
    Single,
    Batch,
    BatchRetry,
    /// One lock per flush (the best case for a locked free list).
    MutexFreeList,
    /// One lock per tag taken (a per-IO allocator).
    MutexPerTag,
}

impl Allocator {
    const ALL: [Allocator; 5] = [
        Allocator::Single,
        Allocator::Batch,
        Allocator::BatchRetry,
        Allocator::MutexFreeList,
        Allocator::MutexPerTag,
    ];

    fn name(self) -> &'static str {
        match self {
            Allocator::Single => "single",
            Allocator::Batch => "batch",
            Allocator::BatchRetry => "batch_retry",
            Allocator::MutexFreeList => "mutex_vec",
            Allocator::MutexPerTag => "mutex_vec_per_tag",
        }
    }
}

/// A tag source shared by the benchmark threads.
enum Pool {
    Bitmap(TagSet),
    FreeList(Mutex<Vec<u32>>),
    FreeListPerTag(Mutex<Vec<u32>>),
}

impl Pool {
    fn new(allocator: Allocator, half_full: bool) -> Self {
        let (batch, batch_retry) = match allocator {
            Allocator::Single => (false, false),
            Allocator::Batch => (true, false),
            _ => (true, true),
        };
        let options = TagOptions {
            nr_cores: 2,
            batch,
            batch_retry,
            ..TagOptions::default()
        };
        let set = TagSet::new(DEPTH, options).expect("valid tag set");
        let mut free: Vec<u32> = (0..DEPTH).collect();
        if half_full {
            // Hold a fixed random half for the whole run.
            let mut rng = SmallRng::seed_from_u64(0x7a65);
            free.shuffle(&mut rng);
            let held: Vec<u32> = free.split_off(free.len() / 2);
            let mut all = Vec::new();
            set.get_tags(0, DEPTH as usize, &mut all);
            let mut back: Vec<Tag> = free.iter().map(|&n| Tag::new(n)).collect();
            back.sort();
            set.put_batch(0, &back);
            assert_eq!(set.busy() as usize, held.len());
        }
        match allocator {
            Allocator::MutexFreeList => Pool::FreeList(Mutex::new(free)),
            Allocator::MutexPerTag => Pool::FreeListPerTag(Mutex::new(free)),
            _ => Pool::Bitmap(set),
        }
    }

    /// Takes a flush's tags and frees them; returns how many were taken.
    fn flush(&self, core: usize, buffer: &mut Vec<Tag>) -> usize {
        buffer.clear();
        match self {
            Pool::Bitmap(set) => {
                let got = set.get_tags(core, FLUSH_TAGS, buffer);
                set.put_batch(core, black_box(buffer));
                got
            }
            Pool::FreeList(list) => {
                {
                    let mut free = list.lock().expect("free list lock");
                    let start = free.len().saturating_sub(FLUSH_TAGS);
                    buffer.extend(free.drain(start..).map(Tag::new));
                }
                black_box(&mut *buffer);
                let mut free = list.lock().expect("free list lock");
                free.extend(buffer.iter().map(|tag| tag.as_u32()));
                buffer.len()
            }
            Pool::FreeListPerTag(list) => {
                for _ in 0..FLUSH_TAGS {
                    let tag = list.lock().expect("free list lock").pop();
                    buffer.extend(tag.map(Tag::new));
                }
                black_box(&mut *buffer);
                let mut free = list.lock().expect("free list lock");
                free.extend(buffer.iter().map(|tag| tag.as_u32()));
                buffer.len()
            }
        }
    }
}

/// Runs `iters` flushes on `core`, checking each got all its tags.
fn run(pool: &Pool, core: usize, iters: u64) {
    let mut buffer = Vec::with_capacity(FLUSH_TAGS);
    for _ in 0..iters {
        assert_eq!(pool.flush(core, &mut buffer), FLUSH_TAGS);
    }
}

/// Time for `iters` flushes on each of `threads` threads running together.
fn timed(pool: &Arc<Pool>, threads: usize, iters: u64) -> Duration {
    let barrier = Arc::new(Barrier::new(threads));
    let helpers: Vec<_> = (1..threads)
        .map(|core| {
            let (pool, barrier) = (Arc::clone(pool), Arc::clone(&barrier));
            std::thread::spawn(move || {
                barrier.wait();
                run(&pool, core, iters);
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    run(pool, 0, iters);
    for helper in helpers {
        helper.join().expect("bench thread");
    }
    start.elapsed()
}

fn tags(c: &mut Criterion) {
    for threads in [1usize, 2] {
        for half_full in [false, true] {
            let fill = if half_full { "half" } else { "empty" };
            let mut group = c.benchmark_group(format!("tags/{threads}thr/{fill}"));
            group
                .warm_up_time(Duration::from_millis(500))
                .measurement_time(Duration::from_secs(2))
                .sample_size(20);
            for allocator in Allocator::ALL {
                let pool = Arc::new(Pool::new(allocator, half_full));
                group.bench_function(BenchmarkId::from_parameter(allocator.name()), |b| {
                    b.iter_custom(|iters| timed(&pool, threads, iters))
                });
            }
            group.finish();
        }
    }
}

/// The bench group; `criterion_group!` makes an undocumented `pub fn`.
#[allow(missing_docs)]
mod group {
    criterion::criterion_group!(benches, super::tags);
}

criterion_main!(group::benches);

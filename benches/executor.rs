//! Executor micro-benchmarks: plugio's `LocalExecutor` against tokio's
//! current-thread runtime and glommio's `LocalExecutor`, side by side.
//!
//! - `spawn_join`: spawn 1000 tasks that return at once, then await every
//!   handle (per element: one spawn + one join).
//! - `yield`: 10 tasks each yield 100 times (per element: one yield, i.e.
//!   one wake + one requeue + one poll).
//! - `remote_wake`: another thread wakes one task 20 000 times, at most 64
//!   wakes ahead of what the task has seen (per element: one cross-thread
//!   wake; wakes that land while the task is already queued coalesce).
//!
//! Run (about two minutes):
//! `cargo bench --bench executor -- --warm-up-time 1 --measurement-time 3`
//!
//! glommio may be unable to start in a container (io_uring or
//! RLIMIT_MEMLOCK); it is then skipped with a printed message.

// criterion_group! generates an undocumented `pub fn`.
#![allow(missing_docs)]

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use futures::task::AtomicWaker;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Poll;

const SPAWNS: u64 = 1000;
const YIELD_TASKS: u64 = 10;
const YIELDS_PER_TASK: u64 = 100;
const REMOTE_WAKES: u64 = 20_000;
const WINDOW: u64 = 64;

/// The three executors behind one interface: run a future to completion on
/// the calling thread.
enum Exec {
    Plugio(plugio_executor::LocalExecutor),
    Tokio(tokio::runtime::Runtime),
    Glommio(glommio::LocalExecutor),
}

impl Exec {
    fn name(&self) -> &'static str {
        match self {
            Exec::Plugio(_) => "plugio",
            Exec::Tokio(_) => "tokio_current_thread",
            Exec::Glommio(_) => "glommio",
        }
    }

    fn run<F: Future>(&self, f: F) -> F::Output {
        match self {
            Exec::Plugio(ex) => ex.run(f),
            Exec::Tokio(rt) => rt.block_on(f),
            Exec::Glommio(ex) => ex.run(f),
        }
    }

    /// Spawns a future on the running executor and awaits all of them.
    async fn spawn_all<T: 'static + Send>(
        &self,
        futures: impl Iterator<Item = impl Future<Output = T> + Send + 'static>,
    ) -> Vec<T> {
        let mut out = Vec::new();
        match self {
            Exec::Plugio(_) => {
                let hs: Vec<_> = futures.map(plugio_executor::spawn_local).collect();
                for h in hs {
                    out.push(h.await.expect("plugio join"));
                }
            }
            Exec::Tokio(_) => {
                let hs: Vec<_> = futures.map(tokio::spawn).collect();
                for h in hs {
                    out.push(h.await.expect("tokio join"));
                }
            }
            Exec::Glommio(_) => {
                let hs: Vec<_> = futures.map(glommio::spawn_local).collect();
                for h in hs {
                    out.push(h.await);
                }
            }
        }
        out
    }
}

/// glommio has no unconditional yield (`yield_if_needed` only yields when
/// the task's time slice is spent), so its tasks use this future, which
/// wakes itself once and returns `Pending`, the same thing plugio's and
/// tokio's `yield_now` do.
struct YieldOnce(bool);

impl Future for YieldOnce {
    type Output = ();
    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

fn executors() -> Vec<Exec> {
    let mut v = vec![
        Exec::Plugio(plugio_executor::LocalExecutor::new()),
        Exec::Tokio(
            tokio::runtime::Builder::new_current_thread()
                .build()
                .expect("tokio current-thread runtime"),
        ),
    ];
    match glommio::LocalExecutorBuilder::default().make() {
        Ok(ex) => v.push(Exec::Glommio(ex)),
        Err(e) => println!("glommio skipped: its LocalExecutor could not start here: {e}"),
    }
    v
}

fn spawn_join(c: &mut Criterion) {
    let mut g = c.benchmark_group("executor/spawn_join");
    g.throughput(Throughput::Elements(SPAWNS));
    for ex in executors() {
        g.bench_function(BenchmarkId::from_parameter(ex.name()), |b| {
            b.iter(|| {
                ex.run(async {
                    let out = ex.spawn_all((0..SPAWNS).map(|i| async move { i })).await;
                    assert_eq!(out.len() as u64, SPAWNS);
                })
            })
        });
    }
    g.finish();
}

fn yields(c: &mut Criterion) {
    let mut g = c.benchmark_group("executor/yield");
    g.throughput(Throughput::Elements(YIELD_TASKS * YIELDS_PER_TASK));
    for ex in executors() {
        g.bench_function(BenchmarkId::from_parameter(ex.name()), |b| {
            b.iter(|| {
                ex.run(async {
                    let kind = match &ex {
                        Exec::Plugio(_) => 0u8,
                        Exec::Tokio(_) => 1,
                        Exec::Glommio(_) => 2,
                    };
                    let out = ex
                        .spawn_all((0..YIELD_TASKS).map(move |_| async move {
                            for _ in 0..YIELDS_PER_TASK {
                                match kind {
                                    0 => plugio_executor::yield_now().await,
                                    1 => tokio::task::yield_now().await,
                                    _ => YieldOnce(false).await,
                                }
                            }
                        }))
                        .await;
                    assert_eq!(out.len() as u64, YIELD_TASKS);
                })
            })
        });
    }
    g.finish();
}

/// One task woken only from another thread; see the module docs.
fn remote_wake(c: &mut Criterion) {
    let mut g = c.benchmark_group("executor/remote_wake");
    // Each iteration is 20 000 wakes (milliseconds): fewer samples.
    g.sample_size(20);
    g.throughput(Throughput::Elements(REMOTE_WAKES));
    for ex in executors() {
        g.bench_function(BenchmarkId::from_parameter(ex.name()), |b| {
            b.iter(|| {
                let produced = Arc::new(AtomicU64::new(0));
                let seen = Arc::new(AtomicU64::new(0));
                let slot = Arc::new(AtomicWaker::new());
                let waker_thread = {
                    let (produced, seen, slot) = (produced.clone(), seen.clone(), slot.clone());
                    std::thread::spawn(move || {
                        for i in 1..=REMOTE_WAKES {
                            // Acquire: pairs with the task's Release store.
                            let mut spins = 0u32;
                            while i - seen.load(Ordering::Acquire) > WINDOW {
                                spins += 1;
                                // On a loaded machine, let the executor
                                // thread have the CPU.
                                if spins % 64 == 0 {
                                    std::thread::yield_now();
                                }
                                std::hint::spin_loop();
                            }
                            // Release: pairs with the task's Acquire load.
                            produced.store(i, Ordering::Release);
                            slot.wake();
                        }
                    })
                };
                let task = async move {
                    std::future::poll_fn(|cx| {
                        slot.register(cx.waker());
                        // Acquire/Release: pair with the waker thread (above).
                        let p = produced.load(Ordering::Acquire);
                        seen.store(p, Ordering::Release);
                        if p >= REMOTE_WAKES {
                            Poll::Ready(())
                        } else {
                            Poll::Pending
                        }
                    })
                    .await
                };
                ex.run(ex.spawn_all(std::iter::once(task)));
                waker_thread.join().expect("waker thread");
            })
        });
    }
    g.finish();
}

criterion_group!(benches, spawn_join, yields, remote_wake);
criterion_main!(benches);

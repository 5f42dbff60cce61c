//! The raw task: layout, state bits, reference counts, vtable, waker.
//!
//! # Local and remote references
//!
//! A task has two reference counts:
//!
//! - `refs` (atomic): one per *remote* reference ([`TaskRef`]: the
//!   `JoinHandle`, each node of the remote queue, each waker made off the
//!   owner thread), plus **one for the whole local group** while the local
//!   count is non-zero.
//! - `local.refs` (a plain `Cell`, owner thread only): one per *local*
//!   reference ([`LocalRef`]: the run queue, the owned slab, and every waker
//!   cloned on the owner thread, whose data pointer carries [`LOCAL_TAG`]).
//!   Going 0 → 1 takes the group's atomic reference and links the task into
//!   its core's group list; 1 → 0 unlinks it and gives that reference back.
//!   Both are rare: the owned slab holds a local reference for the task's
//!   whole life.
//!
//! "On the owner thread" means: the thread's current core uid (one
//! thread-local read, see `sync::current_uid`) equals the header's `owner`.
//! A core is one thread for its whole life and uids are never reused, so
//! this is exact. Local state is only ever touched when it holds, or by the
//! core itself (which lives on that thread).
//!
//! A local reference may travel to another thread inside a `Waker`. There
//! it cannot touch `local.refs`, so:
//!
//! - cloning it there makes a remote reference;
//! - dropping it there adds one `DROP_UNIT` to `state` (pending drops of
//!   local references) and makes sure the task is in the remote queue
//!   (`QUEUED`); the owner folds the units into `local.refs` when it takes
//!   the node (`adopt_remote`);
//! - when the owner core closes, it *detaches* every task of its group
//!   list (`detach_all`): it converts each remaining local reference into a
//!   remote one, folds the pending units, and sets `DETACHED`; from then on
//!   a local reference is dropped with a plain atomic decrement. The owner
//!   never touches local state of a detached task again (its core is never
//!   current again).
//!
//! # Local and remote wakes
//!
//! - A wake on the owner thread sets `local.notified` and pushes a
//!   [`LocalRef`] onto the core's local run queue: no atomic RMW at all.
//! - A wake from another thread sets `NOTIFIED | QUEUED` in `state` with one
//!   RMW; the thread that turned `QUEUED` on pushes the task onto the remote
//!   queue with a remote reference. The owner takes the node at the start
//!   of a tick (`adopt_remote`): clears `NOTIFIED | QUEUED`, and queues the
//!   task locally unless it already is (so a task woken locally and
//!   remotely in one tick runs once).
//! - Before a poll, the core clears `local.notified` (plain store) and loads
//!   `state` (Acquire, a plain load); only when it sees `NOTIFIED` does it
//!   clear it with an RMW (that remote wake is served by this poll; its node
//!   is then only dropped when taken).
//!
//! # The core's side
//!
//! The core's shared part ([`CoreShared`]: the local run queue, the group
//! list, the remote queue, the park gate, the shutdown request) is defined
//! at the end of this file, not in `crate::core`: a task's header holds it
//! and it holds task references, so the two types name each other and
//! live in one file. The core (`crate::core`) owns and drives it; its
//! invariants are the core module's.
//!
//! # Invariants
//!
//! - `local.notified` set ⇔ the task is in the local run queue, once.
//! - `QUEUED` set ⇔ the task is in the remote queue (or being pushed), once,
//!   and that node holds one remote reference.
//! - `NOTIFIED` set ⇒ `QUEUED` set (a remote wake sets both in one RMW;
//!   `start_run` clears `NOTIFIED` alone, `adopt_remote` both).
//! - `DROP_UNIT` counts and `local.refs`: the number of live local
//!   references is `local.refs - units`; units are only added while
//!   `DETACHED` is clear, and folded (cleared) only by the owner.
//! - `refs` never reaches zero while a reference exists: every remote
//!   reference counts one, and the local group counts one while
//!   `local.refs > 0` (pending units keep `local.refs > 0`).
//! - `COMPLETE` is set once, by the thread that dropped the future: the
//!   owner, or (for an unregistered `Send` task in a closed core's queue,
//!   which has no local references) whoever found it there.

use super::error::JoinError;
use super::state::{Completed, RemoteWake, Snapshot, State};
use crate::remote::{Linked, ParkGate, RemoteQueue};
use crate::stats::AtomicTickStats;
use crate::sync::{current_uid, fence, AtomicBool, AtomicPtr, AtomicUsize, AtomicWaker};
use crate::Unpark;
use std::cell::{Cell as StdCell, UnsafeCell};
use std::future::Future;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::ptr::{self, NonNull};
use std::sync::atomic::AtomicU8;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, RawWaker, RawWakerVTable, Waker};
use std::time::Instant;

/// Bit 0 of a waker's data pointer: its reference is a local one.
const LOCAL_TAG: usize = 1;

/// Slot index of a task its core has not registered yet.
pub(crate) const UNREGISTERED: usize = usize::MAX;

/// The type-independent start of every task allocation.
///
/// Laid out in order (`repr(C)`), so that what a local wake and poll of
/// the task touch (`state`, `vtable`, `owner`, `core`, the local count and
/// wake flag) lies in the header's first 41 bytes, one cache line or two
/// (the allocation is 16-byte aligned), not spread over the header's 120:
/// with a core's hundreds of IO tasks in flight, a task's lines have left
/// the L1 by the time its IO completes, and each is a miss per IO. The
/// fields after `local` are touched by cross-core wakes, joins and the
/// group list, not per IO on the owner core. Not aligned to a line: a
/// boxed over-aligned task takes glibc's `memalign` path, which made a
/// spawn 45 % slower (`benches/executor.rs`, `spawn_join`).
#[repr(C)]
pub(crate) struct Header {
    /// The state bits (see `state`): every transition goes through it.
    pub(crate) state: State,
    vtable: &'static Vtable,
    /// The uid of the core that owns (polls) this task.
    owner: u64,
    /// The core that owns (polls) this task.
    pub(crate) core: Arc<CoreShared>,
    /// Owner thread only.
    local: Local,
    /// Remote references plus one for the local group (module docs).
    refs: AtomicUsize,
    remote_next: AtomicPtr<Header>,
    pub(crate) join_waker: AtomicWaker,
}

// The per-IO fields stay within the first 64 bytes (see `Header`).
const _: () = assert!(std::mem::offset_of!(Header, local) + std::mem::size_of::<usize>() * 2 <= 64);

/// The owner-thread-only part of the header; `refs` and `notified` first
/// (per IO), the rest after (spawn, registration and the group list).
#[repr(C)]
struct Local {
    /// Local references (module docs), including pending drop units.
    refs: StdCell<usize>,
    /// In the local run queue.
    notified: StdCell<bool>,
    /// Index in the owner's slab of owned tasks.
    owned_slot: StdCell<usize>,
    /// Links of the core's group list (tasks with `refs > 0`).
    prev: StdCell<*const Header>,
    next: StdCell<*const Header>,
}

// SAFETY: `local` is only touched on the owner thread (see the module
// invariants), or by the single holder of an unregistered task of a closed
// core, which has no local state in use; everything else is atomic or
// immutable.
unsafe impl Send for Header {}
// SAFETY: as above.
unsafe impl Sync for Header {}

// SAFETY: `remote_next` is used by nothing but the remote queue.
unsafe impl Linked for Header {
    fn link(&self) -> &AtomicPtr<Header> {
        &self.remote_next
    }
}

struct Vtable {
    /// Polls the future once; returns true when the task completed. Only
    /// on a task whose `COMPLETE` is clear (its future is there).
    poll: unsafe fn(NonNull<Header>) -> bool,
    /// Drops the future and completes with `Cancelled`; false if already done.
    cancel: unsafe fn(NonNull<Header>) -> bool,
    /// Frees the allocation (the last reference is gone).
    dealloc: unsafe fn(NonNull<Header>),
}

/// The full allocation. `repr(C)` so that `header` is at offset 0 and
/// `output` sits where [`OutputPrefix`] says, whatever `F` is.
#[repr(C)]
struct Cell<F: Future> {
    header: Header,
    output: UnsafeCell<Option<Result<F::Output, JoinError>>>,
    future: UnsafeCell<Option<F>>,
}

/// The prefix of `Cell<F>` that a `JoinHandle<F::Output>` may see.
#[repr(C)]
pub(crate) struct OutputPrefix<T> {
    header: Header,
    pub(crate) output: UnsafeCell<Option<Result<T, JoinError>>>,
}

/// One remote (atomically counted) reference to a task.
pub(crate) struct TaskRef {
    ptr: NonNull<Header>,
}

// SAFETY: a remote reference only lets its holder do thread-safe things
// (atomics, wake) except through the `unsafe` owner-only methods.
unsafe impl Send for TaskRef {}
// SAFETY: as above.
unsafe impl Sync for TaskRef {}

/// One local reference to a task: owner thread only (`!Send`, since it
/// holds a `NonNull`).
pub(crate) struct LocalRef {
    ptr: NonNull<Header>,
}

/// Which reference a new task hands out for its first queue.
fn allocate<F: Future>(
    future: F,
    core: Arc<CoreShared>,
    state: State,
    refs: usize,
    local_refs: usize,
) -> NonNull<Header> {
    let owner = core.uid;
    let cell = Box::new(Cell {
        header: Header {
            state,
            refs: AtomicUsize::new(refs),
            remote_next: AtomicPtr::new(ptr::null_mut()),
            vtable: vtable::<F>(),
            owner,
            core,
            local: Local {
                refs: StdCell::new(local_refs),
                notified: StdCell::new(false),
                owned_slot: StdCell::new(UNREGISTERED),
                prev: StdCell::new(ptr::null()),
                next: StdCell::new(ptr::null()),
            },
            join_waker: AtomicWaker::new(),
        },
        output: UnsafeCell::new(None),
        future: UnsafeCell::new(Some(future)),
    });
    // The waker tag needs bit 0 of the header address.
    debug_assert!(std::mem::align_of::<Cell<F>>() > LOCAL_TAG);
    NonNull::from(Box::leak(cell)).cast::<Header>()
}

/// Allocates a task for `future`, owned by `core`, to be pushed onto the
/// core's remote queue by the caller (a cross-core spawn). Returns the
/// queue's reference and the `JoinHandle`'s; the state starts as
/// `NOTIFIED | QUEUED | JOIN_INTEREST` ([`State::new_remote_spawn`]).
pub(crate) fn new_task<F: Future>(
    future: F,
    core: Arc<CoreShared>,
) -> (TaskRef, JoinRef<F::Output>) {
    let ptr = allocate(future, core, State::new_remote_spawn(), 2, 0);
    let join = JoinRef {
        task: TaskRef { ptr },
        _output: PhantomData,
    };
    (TaskRef { ptr }, join)
}

/// Allocates a task for `future` on its owner core's thread. Returns a
/// local reference for the caller to push onto the local run queue
/// (`local.notified` starts set) and the `JoinHandle`'s reference.
///
/// # Safety
/// Called on the thread of `core`, before that core closed.
pub(crate) unsafe fn new_local_task<F: Future>(
    future: F,
    core: Arc<CoreShared>,
) -> (LocalRef, JoinRef<F::Output>) {
    // refs 2: the local group and the JoinHandle.
    let ptr = allocate(future, core, State::new_local_spawn(), 2, 1);
    // SAFETY: fresh task, owner thread (caller).
    let header = unsafe { ptr.as_ref() };
    header.local.notified.set(true);
    // SAFETY: owner thread; the task is not linked yet.
    unsafe { header.core.groups.insert(ptr) };
    let join = JoinRef {
        task: TaskRef { ptr },
        _output: PhantomData,
    };
    (LocalRef { ptr }, join)
}

/// The `JoinHandle`'s typed reference.
pub(crate) struct JoinRef<T> {
    pub(crate) task: TaskRef,
    _output: PhantomData<T>,
}

impl<T> JoinRef<T> {
    /// The output slot.
    ///
    /// # Safety
    /// Only the join-interest holder (after `COMPLETE`) or the last side of
    /// the join/complete race may access it; see the module invariants.
    pub(crate) unsafe fn output(&self) -> *mut Option<Result<T, JoinError>> {
        let prefix = self.task.ptr.cast::<OutputPrefix<T>>();
        // SAFETY: the allocation is a `Cell<F>` with `F::Output == T`, whose
        // `repr(C)` prefix is `OutputPrefix<T>`.
        unsafe { prefix.as_ref() }.output.get()
    }
}

fn vtable<F: Future>() -> &'static Vtable {
    // A promoted constant: one static vtable per future type.
    &Vtable {
        poll: poll::<F>,
        cancel: cancel::<F>,
        dealloc: dealloc::<F>,
    }
}

/// # Safety
/// `ptr` is a live `Cell<F>`.
unsafe fn cell<'a, F: Future>(ptr: NonNull<Header>) -> &'a Cell<F> {
    // SAFETY: header at offset 0 of a live `Cell<F>` (caller).
    unsafe { ptr.cast::<Cell<F>>().as_ref() }
}

#[cfg(all(test, loom))]
loom::lazy_static! {
    /// Frees, for the loom models.
    pub(crate) static ref DEALLOCS: loom::sync::atomic::AtomicUsize =
        loom::sync::atomic::AtomicUsize::new(0);
}

unsafe fn dealloc<F: Future>(ptr: NonNull<Header>) {
    #[cfg(all(test, loom))]
    // Relaxed: a test counter, read after the model's threads joined.
    DEALLOCS.fetch_add(1, Relaxed);
    // SAFETY: `ptr` came from `Box::leak` of a `Cell<F>` and the last
    // reference is gone (caller).
    drop(unsafe { Box::from_raw(ptr.cast::<Cell<F>>().as_ptr()) });
}

unsafe fn poll<F: Future>(ptr: NonNull<Header>) -> bool {
    // SAFETY: owner thread (caller), live task.
    let cell = unsafe { cell::<F>(ptr) };
    // SAFETY: only the owner thread touches the future.
    let slot = unsafe { &mut *cell.future.get() };
    debug_assert!(slot.is_some(), "a completed task polled");
    // SAFETY: the future is dropped (the slot set to `None`) only with
    // `COMPLETE` set after it (here or in `cancel`, on this thread), and
    // the core polls a task only after its state showed `COMPLETE` clear
    // (`Core::run_task`, the caller's contract).
    let future = unsafe { slot.as_mut().unwrap_unchecked() };
    // A local waker: the core polls on the owner thread, and the clones
    // made from it on this thread carry the same data, so `will_wake`
    // holds between them.
    let waker = ManuallyDrop::new(waker_from(ptr, true));
    let mut cx = Context::from_waker(&waker);
    // SAFETY: the future lives inside the task allocation and is never
    // moved: it is only dropped in place (by setting the slot to `None`).
    let future = unsafe { Pin::new_unchecked(future) };
    let result = match catch_unwind(AssertUnwindSafe(|| future.poll(&mut cx))) {
        Ok(Poll::Pending) => return false,
        Ok(Poll::Ready(out)) => Ok(out),
        Err(payload) => Err(JoinError::panic(payload)),
    };
    let result = match catch_unwind(AssertUnwindSafe(|| *slot = None)) {
        Ok(()) => result,
        Err(payload) => {
            // The output (or first panic's payload) is replaced by the
            // drop's panic; its own drop may panic too.
            drop_contained(result, "a task's output");
            Err(JoinError::panic(payload))
        }
    };
    // SAFETY: owner thread, future gone, output not written yet.
    unsafe { complete::<F>(cell, result) };
    true
}

unsafe fn cancel<F: Future>(ptr: NonNull<Header>) -> bool {
    // SAFETY: caller is the owner thread, or the only party that can reach
    // an unregistered `Send` task.
    let cell = unsafe { cell::<F>(ptr) };
    // SAFETY: as above.
    let slot = unsafe { &mut *cell.future.get() };
    if slot.is_none() {
        return false;
    }
    let result = match catch_unwind(AssertUnwindSafe(|| *slot = None)) {
        Ok(()) => Err(JoinError::Cancelled),
        Err(payload) => Err(JoinError::panic(payload)),
    };
    // SAFETY: as above; future gone, output not written yet.
    unsafe { complete::<F>(cell, result) };
    true
}

/// Stores the output and publishes `COMPLETE`.
///
/// # Safety
/// Called once, by the thread that dropped the future.
unsafe fn complete<F: Future>(cell: &Cell<F>, result: Result<F::Output, JoinError>) {
    // SAFETY: nobody reads the output before `COMPLETE` is set.
    unsafe { *cell.output.get() = Some(result) };
    match cell.header.state.transition_to_complete() {
        Completed::DropOutput => {
            // SAFETY: no handle; we are the last side of the race.
            let output = unsafe { (*cell.output.get()).take() };
            // A panic in its drop must not unwind into the core.
            drop_contained(output, "a task's output");
        }
        Completed::NotifyJoin => cell.header.join_waker.wake(),
    }
}

/// How many nested panics [`drop_contained`] catches (a panic payload whose
/// drop panics with a payload whose drop panics ...) before it leaks the
/// last payload instead of dropping it.
const MAX_NESTED_DROP_PANICS: usize = 8;

/// Drops `value` so that a panic in its `Drop` never unwinds into the
/// caller: neither a core (which would lose its thread and every task on
/// it) nor a thread dropping a `JoinHandle`. The panic is logged as
/// "`what` panicked when dropped" and its payload dropped in turn; a chain
/// of payloads that keep panicking is leaked after 8 of them. The executor
/// drops a task's output this way; the engine, a buffer it kept for an IO
/// whose future was dropped.
///
/// ```
/// struct Grumpy;
/// impl Drop for Grumpy {
///     fn drop(&mut self) {
///         panic!("dropped");
///     }
/// }
/// plugio::executor::drop_contained(Grumpy, "a Grumpy");
/// // Still running: the panic was caught and logged.
/// ```
pub fn drop_contained<T>(value: T, what: &'static str) {
    let mut outcome = catch_unwind(AssertUnwindSafe(move || drop(value)));
    let mut nested = 0;
    while let Err(payload) = outcome {
        let message = payload
            .downcast_ref::<&'static str>()
            .copied()
            .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("(not a string)");
        tracing::error!(
            what,
            message,
            "{what} panicked when dropped; the panic is contained (the core keeps running)"
        );
        nested += 1;
        if nested >= MAX_NESTED_DROP_PANICS {
            std::mem::forget(payload);
            return;
        }
        outcome = catch_unwind(AssertUnwindSafe(move || drop(payload)));
    }
}

// ---------------------------------------------------------------------
// Reference counting.

/// Takes one more remote reference.
fn atomic_inc(header: &Header) {
    // Relaxed: a new reference is made from one the caller holds, which
    // keeps the task alive; nothing is published (as `Arc::clone`).
    let old = header.refs.fetch_add(1, Relaxed);
    if old > isize::MAX as usize {
        std::process::abort();
    }
}

/// Gives back one remote reference; frees the task on the last one.
///
/// # Safety
/// The caller holds that reference and does not use `ptr` afterwards.
unsafe fn atomic_dec(ptr: NonNull<Header>) {
    // SAFETY: live until this decrement (caller).
    let header = unsafe { ptr.as_ref() };
    // Release: pairs with the Acquire fence below on whichever thread
    // frees, so every use of the task through this reference happens
    // before the free (as `Arc::drop`).
    if header.refs.fetch_sub(1, Release) != 1 {
        return;
    }
    fence(Acquire);
    // SAFETY: that was the last reference.
    unsafe { (header.vtable.dealloc)(ptr) }
}

/// Takes one more local reference.
///
/// # Safety
/// Owner thread, before the core closed; the task is alive.
#[inline]
unsafe fn local_inc(ptr: NonNull<Header>) {
    // SAFETY: alive (caller).
    let local = unsafe { &ptr.as_ref().local };
    let n = local.refs.get();
    if n == 0 {
        // SAFETY: forwarded. (A tail call, so the common path stays a
        // leaf.)
        return unsafe { group_acquire(ptr) };
    }
    local.refs.set(n + 1);
}

/// Gives back one local reference.
///
/// # Safety
/// Owner thread, before the core closed; the caller holds that reference
/// and does not use `ptr` afterwards.
#[inline]
unsafe fn local_dec(ptr: NonNull<Header>) {
    // SAFETY: alive until the group lets go (caller).
    let header = unsafe { ptr.as_ref() };
    // Relaxed: DETACHED is only set by this (the owner) thread.
    debug_assert!(!header.state.load_relaxed().is_detached());
    debug_assert!(
        header.local.refs.get() > 0,
        "local reference count underflow"
    );
    // Decremented first, then tested: one decrement of memory and a
    // branch on its result in the common case.
    let n = header.local.refs.get().wrapping_sub(1);
    header.local.refs.set(n);
    if n == 0 {
        // SAFETY: forwarded; that was the last local reference.
        unsafe { group_release(ptr) };
    }
}

/// The local count goes 0 → 1: the group takes its remote reference.
#[cold]
unsafe fn group_acquire(ptr: NonNull<Header>) {
    // SAFETY: alive (caller).
    let header = unsafe { ptr.as_ref() };
    // Relaxed: as in `local_dec`.
    debug_assert!(!header.state.load_relaxed().is_detached());
    debug_assert_eq!(header.local.refs.get(), 0);
    header.local.refs.set(1);
    atomic_inc(header);
    // SAFETY: owner thread, not linked (its local count was zero).
    unsafe { header.core.groups.insert(ptr) };
}

/// The local count went 1 → 0 (the caller set it): the group gives its
/// remote reference back.
#[cold]
unsafe fn group_release(ptr: NonNull<Header>) {
    // SAFETY: alive until the decrement below (caller).
    let header = unsafe { ptr.as_ref() };
    debug_assert_eq!(header.local.refs.get(), 0);
    // SAFETY: owner thread, linked (its local count was non-zero).
    unsafe { header.core.groups.remove(ptr) };
    // SAFETY: the group's reference.
    unsafe { atomic_dec(ptr) };
}

/// Drops a local reference from a thread that is not the owner; with
/// `wake`, wakes the task in the same RMW (a wake by value).
///
/// # Safety
/// The caller holds that reference and does not use `ptr` afterwards.
#[cold]
unsafe fn remote_drop_local(ptr: NonNull<Header>, wake: bool) {
    // SAFETY: alive: our unfolded unit keeps the local group (and its
    // remote reference) alive until the owner folds it.
    let header = unsafe { ptr.as_ref() };
    // Acquire: if it shows DETACHED, the owner's conversion of our
    // reference into a remote count happened before our decrement (pairs
    // with the Release of `detach_all`).
    let mut cur = header.state.load_acquire();
    let mut queue_ref = false;
    loop {
        if cur.is_detached() {
            if queue_ref {
                // SAFETY: the extra reference taken below; ours still
                // keeps the task alive.
                unsafe { atomic_dec(ptr) };
            }
            // Our reference counts in `refs` since the detach: it is a
            // remote one now.
            if wake {
                // SAFETY: see above; given up by the wake.
                unsafe { remote_wake(ptr, true) };
            } else {
                // SAFETY: see above.
                unsafe { atomic_dec(ptr) };
            }
            return;
        }
        let push = !cur.is_queued();
        if push && !queue_ref {
            // Taken before the unit is visible: once it is, the owner may
            // fold it and free the task before we push.
            atomic_inc(header);
            queue_ref = true;
        }
        // Orderings: see `State::try_add_drop_unit`.
        match header.state.try_add_drop_unit(cur, wake) {
            Ok(()) => {
                if push {
                    push_remote(TaskRef { ptr });
                } else if queue_ref {
                    // SAFETY: the extra reference, not needed after all.
                    unsafe { atomic_dec(ptr) };
                }
                return;
            }
            Err(now) => cur = now,
        }
    }
}

/// Wakes from a thread that is not the owner. With `consume`, the caller's
/// *remote* reference is given up (moved into the queue when it pushes).
///
/// # Safety
/// The caller holds a reference (remote when `consume`).
#[cold]
unsafe fn remote_wake(ptr: NonNull<Header>, consume: bool) {
    // SAFETY: alive (caller).
    let header = unsafe { ptr.as_ref() };
    // Orderings: see `State::transition_to_notified_remote`.
    match header.state.transition_to_notified_remote() {
        RemoteWake::Push => {
            if !consume {
                atomic_inc(header);
            }
            push_remote(TaskRef { ptr });
        }
        RemoteWake::AlreadyQueued => {
            if consume {
                // SAFETY: the caller's reference.
                unsafe { atomic_dec(ptr) };
            }
        }
    }
}

/// Pushes `task` (whose `QUEUED` the caller turned on) onto its core's
/// remote queue.
fn push_remote(task: TaskRef) {
    // Keep the core's shared part alive: once pushed, the task may be
    // freed by the core at any moment.
    let shared = task.header().core.clone();
    shared.push_remote(task);
}

/// Wakes on the owner thread; `local` says the caller's reference is a
/// local one to give up (moved into the run queue when it queues).
///
/// # Safety
/// Owner thread, before the core closed; the caller holds a reference.
#[inline]
unsafe fn local_wake(ptr: NonNull<Header>, consume_local: bool) {
    // SAFETY: alive (caller).
    let header = unsafe { ptr.as_ref() };
    // Relaxed: COMPLETE of a task with local state is only set on this
    // thread.
    if header.local.notified.get() || header.state.load_relaxed().is_complete() {
        if consume_local {
            // SAFETY: the caller's local reference.
            unsafe { local_dec(ptr) };
        }
        return;
    }
    header.local.notified.set(true);
    if !consume_local {
        // SAFETY: forwarded.
        unsafe { local_inc(ptr) };
    }
    // SAFETY: owner thread.
    unsafe { header.core.run_queue.push(LocalRef { ptr }) };
}

/// Wakes by reference from any thread.
///
/// # Safety
/// The caller holds a reference.
unsafe fn wake_by_ref(ptr: NonNull<Header>) {
    // SAFETY: alive (caller).
    if unsafe { ptr.as_ref() }.is_owner() {
        // SAFETY: owner thread (a current core is never closed).
        unsafe { local_wake(ptr, false) }
    } else {
        // SAFETY: forwarded.
        unsafe { remote_wake(ptr, false) }
    }
}

/// The owner takes a node out of its remote queue: clears `NOTIFIED` and
/// `QUEUED`, folds the pending drop units, queues the task locally when a
/// remote wake asked for it, and drops the node's reference. Returns
/// whether the node carried a wake.
///
/// # Safety
/// Owner thread, before the core closed; `node` came out of the core's
/// remote queue.
pub(crate) unsafe fn adopt_remote(node: NonNull<Header>) -> bool {
    // SAFETY: the node holds a reference.
    let header = unsafe { node.as_ref() };
    // Orderings: see `State::transition_to_adopted`.
    let adopted = header.state.transition_to_adopted();
    let woken = adopted.woken;
    if woken && !adopted.complete && !header.local.notified.get() {
        header.local.notified.set(true);
        // SAFETY: owner thread (caller); the node's reference keeps it alive.
        unsafe { local_inc(node) };
        // SAFETY: owner thread.
        unsafe { header.core.run_queue.push(LocalRef { ptr: node }) };
    }
    let units = adopted.drop_units;
    if units != 0 {
        let n = header.local.refs.get();
        debug_assert!(n >= units, "more remote drops than local references");
        header.local.refs.set(n - units);
        if n == units {
            // SAFETY: owner thread; that was the last local reference.
            unsafe { group_release(node) };
        }
    }
    // SAFETY: the node's reference.
    unsafe { atomic_dec(node) };
    woken
}

/// Converts every local reference of the tasks linked in `groups` into a
/// remote one and marks them `DETACHED` (the core is closing).
///
/// # Safety
/// Owner thread; afterwards nothing touches the local state of these tasks
/// (the caller leaves the core and never enters it again).
pub(crate) unsafe fn detach_all(groups: &LocalGroups) {
    let mut cur = groups.head.replace(ptr::null());
    while let Some(ptr) = NonNull::new(cur.cast_mut()) {
        // SAFETY: linked tasks are alive (their group holds a reference).
        let header = unsafe { ptr.as_ref() };
        cur = header.local.next.replace(ptr::null());
        header.local.prev.set(ptr::null());
        let n = header.local.refs.replace(0);
        debug_assert!(n > 0);
        // Relaxed: published by the Release RMW of the transition below.
        // One remote count per local reference (and per pending unit, given
        // back below).
        header.refs.fetch_add(n, Relaxed);
        // Orderings: see `State::transition_to_detached`.
        let units = header.state.transition_to_detached();
        if units != 0 {
            // Release: as in `atomic_dec`; cannot reach zero, the group's
            // own reference is still counted.
            header.refs.fetch_sub(units, Release);
        }
        // SAFETY: the group's reference.
        unsafe { atomic_dec(ptr) };
    }
}

/// A core's list of tasks with local references (the "groups"). Owner
/// thread only.
pub(crate) struct LocalGroups {
    head: StdCell<*const Header>,
}

// SAFETY: only the owner thread touches it (insert/remove/detach_all are
// `unsafe` with that contract); other threads merely hold the `CoreShared`.
unsafe impl Send for LocalGroups {}
// SAFETY: as above.
unsafe impl Sync for LocalGroups {}

impl LocalGroups {
    pub(crate) fn new() -> Self {
        Self {
            head: StdCell::new(ptr::null()),
        }
    }

    /// Whether no task has local references (a closed core's list).
    pub(crate) fn is_empty(&self) -> bool {
        self.head.get().is_null()
    }

    /// # Safety
    /// Owner thread; `ptr` is alive and not linked.
    unsafe fn insert(&self, ptr: NonNull<Header>) {
        // SAFETY: alive (caller).
        let local = unsafe { &ptr.as_ref().local };
        let head = self.head.get();
        local.prev.set(ptr::null());
        local.next.set(head);
        if let Some(h) = NonNull::new(head.cast_mut()) {
            // SAFETY: linked tasks are alive.
            unsafe { h.as_ref() }.local.prev.set(ptr.as_ptr());
        }
        self.head.set(ptr.as_ptr());
    }

    /// # Safety
    /// Owner thread; `ptr` is alive and linked here.
    unsafe fn remove(&self, ptr: NonNull<Header>) {
        // SAFETY: alive (caller).
        let local = unsafe { &ptr.as_ref().local };
        let (prev, next) = (
            local.prev.replace(ptr::null()),
            local.next.replace(ptr::null()),
        );
        match NonNull::new(prev.cast_mut()) {
            // SAFETY: linked tasks are alive.
            Some(p) => unsafe { p.as_ref() }.local.next.set(next),
            None => {
                debug_assert!(ptr::eq(self.head.get(), ptr.as_ptr()));
                self.head.set(next);
            }
        }
        if let Some(n) = NonNull::new(next.cast_mut()) {
            // SAFETY: linked tasks are alive.
            unsafe { n.as_ref() }.local.prev.set(prev);
        }
    }
}

pub(crate) const SHUTDOWN_NONE: u8 = 0;
pub(crate) const SHUTDOWN_DRAIN: u8 = 1;
pub(crate) const SHUTDOWN_CANCEL: u8 = 2;

// ---- The core's side: the queues a task schedules itself onto ----
//
// Defined here, with the task, because the two name each other: a task's
// header holds its core's shared part, and that part holds the queues of
// task references. The core (`crate::core`) owns and drives them.

/// The part of a core that other threads reach: the remote wake queue, the
/// park gate, the unparker, published statistics and the shutdown request.
pub(crate) struct CoreShared {
    pub(crate) index: usize,
    /// Unique for the life of the process (see [`crate::core_uid`]).
    pub(crate) uid: u64,
    /// The local run queue: core thread only (the core's module invariants).
    pub(crate) run_queue: LocalQueue,
    /// Tasks with local references: core thread only (module docs).
    pub(crate) groups: LocalGroups,
    pub(crate) remote: RemoteQueue<Header>,
    pub(crate) gate: ParkGate,
    pub(crate) unparker: Arc<dyn Unpark>,
    pub(crate) closed: AtomicBool,
    pub(crate) stats: AtomicTickStats,
    pub(crate) shutdown: AtomicU8,
    pub(crate) drain_deadline: Mutex<Option<Instant>>,
    /// The fork generation the core was built in ([`crate::fork`]): in a
    /// child (a newer generation) its thread does not exist.
    pub(crate) fork_generation: u64,
}

/// The local run queue: a FIFO of local task references, touched only by
/// the core's thread.
pub(crate) struct LocalQueue(UnsafeCell<LocalRing>);

// SAFETY: only the core's thread touches the queue (every method is
// `unsafe` with that contract); other threads only hold the `CoreShared`
// it sits in, and the queue is empty when the core closes (`close`), so it
// drops no `LocalRef` anywhere else.
unsafe impl Send for LocalQueue {}
// SAFETY: as above.
unsafe impl Sync for LocalQueue {}

impl LocalQueue {
    fn new() -> Self {
        Self(UnsafeCell::new(LocalRing::with_capacity(256)))
    }

    /// # Safety
    /// The core's thread. No reference into the queue outlives the call.
    #[inline]
    pub(crate) unsafe fn push(&self, task: LocalRef) {
        // SAFETY: core thread only, and the only live reference (caller).
        unsafe { (*self.0.get()).push(task) }
    }

    /// # Safety
    /// As for `push`.
    #[inline]
    pub(crate) unsafe fn pop(&self) -> Option<LocalRef> {
        // SAFETY: as in `push`.
        unsafe { (*self.0.get()).pop() }
    }

    /// # Safety
    /// As for `push`.
    #[inline]
    pub(crate) unsafe fn len(&self) -> usize {
        // SAFETY: as in `push`.
        unsafe { (*self.0.get()).len() }
    }

    /// Takes every queued task, in order (dropped by the caller, outside
    /// the queue).
    ///
    /// # Safety
    /// As for `push`.
    pub(crate) unsafe fn take(&self) -> Vec<LocalRef> {
        // SAFETY: as in `push`.
        let ring = unsafe { &mut *self.0.get() };
        std::iter::from_fn(|| ring.pop()).collect()
    }
}

/// The run queue's FIFO: a ring of a power-of-two number of slots, with
/// free-running head and tail counters, so a push and a pop are one mask
/// each (a `VecDeque` wraps its index with a compare and a select).
///
/// Invariant: the slots from `head` to `tail` (masked) are `Some`, the
/// others `None`; `tail - head` (wrapping) is at most the slot count.
struct LocalRing {
    slots: Box<[Option<LocalRef>]>,
    /// The slot count less one (the count is a power of two).
    mask: usize,
    head: usize,
    tail: usize,
}

impl LocalRing {
    fn with_capacity(capacity: usize) -> Self {
        let n = capacity.max(1).next_power_of_two();
        Self {
            slots: std::iter::repeat_with(|| None).take(n).collect(),
            mask: n - 1,
            head: 0,
            tail: 0,
        }
    }

    #[inline]
    fn len(&self) -> usize {
        self.tail.wrapping_sub(self.head)
    }

    /// Puts `task` at `tail`. The slot says whether the ring is full,
    /// without comparing `tail - head` with the slot count: by the
    /// invariant, the slot at `tail` is `Some` exactly when the ring is
    /// full (it is then the `head` slot, the oldest task's).
    #[inline]
    fn push(&mut self, task: LocalRef) {
        let i = self.tail & self.mask;
        debug_assert_eq!(self.slots[i].is_some(), self.len() > self.mask);
        // SAFETY: `mask` is the slot count less one, so `i` is in bounds.
        let slot = unsafe { self.slots.get_unchecked_mut(i) };
        if slot.is_some() {
            // A tail call: the common path saves no register for it.
            return self.grow_and_push(task);
        }
        // The slot is empty: nothing to drop.
        std::mem::forget(slot.replace(task));
        self.tail = self.tail.wrapping_add(1);
    }

    /// Takes the task at `head`. The slot says whether there is one,
    /// without comparing `head` with `tail`: by the invariant, the slot at
    /// `head` is `Some` exactly when the ring is not empty (a full ring's
    /// `head` slot is its oldest task's), and taking an empty slot leaves
    /// it `None`.
    #[inline]
    fn pop(&mut self) -> Option<LocalRef> {
        let i = self.head & self.mask;
        // SAFETY: `mask` is the slot count less one, so `i` is in bounds.
        let task = unsafe { self.slots.get_unchecked_mut(i) }.take();
        debug_assert_eq!(task.is_some(), self.head != self.tail);
        if task.is_some() {
            self.head = self.head.wrapping_add(1);
        }
        task
    }

    /// Doubles the slots of a full ring, keeping the order, and pushes
    /// `task`.
    #[cold]
    #[inline(never)]
    fn grow_and_push(&mut self, task: LocalRef) {
        let mut bigger = Self::with_capacity(self.slots.len() * 2);
        while let Some(queued) = self.pop() {
            bigger.push(queued);
        }
        bigger.push(task);
        *self = bigger;
    }
}

impl CoreShared {
    pub(crate) fn new(index: usize, uid: u64, unparker: Arc<dyn Unpark>) -> CoreShared {
        CoreShared {
            index,
            uid,
            run_queue: LocalQueue::new(),
            groups: LocalGroups::new(),
            remote: RemoteQueue::new(),
            gate: ParkGate::new(),
            unparker,
            closed: AtomicBool::new(false),
            stats: AtomicTickStats::default(),
            shutdown: AtomicU8::new(SHUTDOWN_NONE),
            drain_deadline: Mutex::new(None),
            fork_generation: {
                crate::fork::install();
                crate::fork::generation()
            },
        }
    }

    /// The core was built before a fork of the process (we are in the
    /// child, which has none of the parent's core threads but the one that
    /// forked).
    pub(crate) fn forked(&self) -> bool {
        self.fork_generation != crate::fork::generation()
    }

    /// Queues `task` from any thread and unparks the core if it may block.
    pub(crate) fn push_remote(&self, task: TaskRef) {
        let node = task.into_raw();
        // SAFETY: NOTIFIED (set by our caller's transition) keeps the task
        // out of every other queue, and the reference we hand over keeps it
        // alive until the core takes it.
        let was_empty = unsafe { self.remote.push(node) };
        // SeqCst fence: pairs with the fence in `close` (so either we see
        // `closed` or its final drain sees our node) and with the fence of
        // `ParkGate::prepare_park` (so either we see `parked` or the core
        // sees our node).
        fence(SeqCst);
        // Relaxed: ordered by the fence above.
        if self.closed.load(Relaxed) {
            self.cancel_remote();
            return;
        }
        if was_empty && self.gate.needs_unpark() {
            self.unparker.unpark();
        }
    }

    /// Cancels every task in the remote queue of a closed core.
    pub(crate) fn cancel_remote(&self) {
        for node in self.remote.take_all() {
            // SAFETY: the queue held one reference per node.
            let task = unsafe { TaskRef::from_raw(node) };
            // The node is out of the queue, so a later wake pushes again,
            // and is cancelled by its pusher. Orderings: see
            // `State::transition_out_of_closed_queue`.
            let prev = task.header().state.transition_out_of_closed_queue();
            if !prev.is_complete() {
                // SAFETY: the core is closed, so the only tasks that can be
                // incomplete here are unregistered `Send` ones (see `close`),
                // and taking the node made us their only holder.
                unsafe { task.cancel() };
            }
        }
    }

    /// Asks the core to stop (see `Runtime::shutdown`).
    pub(crate) fn request_shutdown(&self, mode: u8, deadline: Option<Instant>) {
        if let Ok(mut d) = self.drain_deadline.lock() {
            *d = deadline;
        }
        // Release: pairs with the Acquire load in `Core::should_stop`, which
        // then reads the deadline.
        self.shutdown.fetch_max(mode, Release);
        self.unparker.unpark();
    }
}

impl Header {
    /// Whether the calling thread is this task's owner core, entered.
    #[inline]
    fn is_owner(&self) -> bool {
        current_uid() == self.owner
    }
}

impl TaskRef {
    pub(crate) fn header(&self) -> &Header {
        // SAFETY: we hold a reference, so the task is alive.
        unsafe { self.ptr.as_ref() }
    }

    /// Gives up ownership of this reference as a raw node pointer.
    pub(crate) fn into_raw(self) -> NonNull<Header> {
        ManuallyDrop::new(self).ptr
    }

    /// # Safety
    /// `ptr` carries one remote reference (from `into_raw`).
    pub(crate) unsafe fn from_raw(ptr: NonNull<Header>) -> TaskRef {
        TaskRef { ptr }
    }

    /// Cancels the task (drops the future, completes with `Cancelled`);
    /// false when it had already completed.
    ///
    /// # Safety
    /// Owner core's thread, or any thread for an unregistered task found in
    /// a closed core's queue (only `Send` futures can be in that state).
    pub(crate) unsafe fn cancel(&self) -> bool {
        // SAFETY: forwarded from the caller.
        unsafe { (self.header().vtable.cancel)(self.ptr) }
    }

    /// Wakes the task (locally on its owner thread, remotely elsewhere).
    pub(crate) fn wake_by_ref(&self) {
        // SAFETY: we hold a reference.
        unsafe { wake_by_ref(self.ptr) }
    }

    /// Whether the task has completed.
    pub(crate) fn is_complete(&self) -> bool {
        // Acquire: pairs with the Release in `complete`.
        self.header().state.load_acquire().is_complete()
    }
}

impl Clone for TaskRef {
    fn clone(&self) -> Self {
        atomic_inc(self.header());
        TaskRef { ptr: self.ptr }
    }
}

impl Drop for TaskRef {
    fn drop(&mut self) {
        // SAFETY: gives back our reference.
        unsafe { atomic_dec(self.ptr) }
    }
}

impl LocalRef {
    pub(crate) fn header(&self) -> &Header {
        // SAFETY: we hold a reference, so the task is alive.
        unsafe { self.ptr.as_ref() }
    }

    /// Clears the local wake flag before a poll and returns the shared
    /// state to act on (`COMPLETE`, `CANCEL_REQUESTED`). A remote wake
    /// already visible is served by this poll: its `NOTIFIED` is cleared
    /// (the only RMW, and only then).
    ///
    /// # Safety
    /// Owner thread; the task was just popped from the local run queue.
    pub(crate) unsafe fn start_run(&self) -> Snapshot {
        let header = self.header();
        debug_assert!(header.local.notified.get());
        header.local.notified.set(false);
        // Orderings: see `State::start_run`.
        header.state.start_run()
    }

    /// `start_run` in two halves, for `Core::run_task`'s common case: this
    /// one clears the local wake flag and loads the shared state; when
    /// that shows `NOTIFIED`, `serve_remote_wake` must follow before the
    /// state is acted on (together they are `start_run`).
    ///
    /// # Safety
    /// As `start_run`.
    pub(crate) unsafe fn load_for_run(&self) -> Snapshot {
        let header = self.header();
        debug_assert!(header.local.notified.get());
        header.local.notified.set(false);
        // Orderings: see `State::load_for_run`.
        header.state.load_for_run()
    }

    /// The second half of `start_run`, after `load_for_run` returned a
    /// state with `NOTIFIED`.
    pub(crate) fn serve_remote_wake(&self) -> Snapshot {
        // Orderings: see `State::serve_remote_wake`.
        self.header().state.serve_remote_wake()
    }

    /// Polls the task; returns true when it completed.
    ///
    /// # Safety
    /// Owner core's thread only, and only after `start_run` (or
    /// `load_for_run`, and `serve_remote_wake` when it showed `NOTIFIED`)
    /// returned a state without `COMPLETE`.
    pub(crate) unsafe fn poll(&self) -> bool {
        // SAFETY: forwarded from the caller.
        unsafe { (self.header().vtable.poll)(self.ptr) }
    }

    /// Cancels the task; false when it had already completed.
    ///
    /// # Safety
    /// Owner core's thread only.
    pub(crate) unsafe fn cancel(&self) -> bool {
        // SAFETY: forwarded from the caller.
        unsafe { (self.header().vtable.cancel)(self.ptr) }
    }

    /// The owned-slab index (`UNREGISTERED` when not registered).
    pub(crate) fn owned_slot(&self) -> usize {
        self.header().local.owned_slot.get()
    }

    /// Records the owned-slab index.
    pub(crate) fn set_owned_slot(&self, slot: usize) {
        self.header().local.owned_slot.set(slot)
    }
}

impl Clone for LocalRef {
    fn clone(&self) -> Self {
        // SAFETY: a `LocalRef` only exists on the owner thread before the
        // core closed (it is `!Send`, and the core drops its own before
        // detaching).
        unsafe { local_inc(self.ptr) };
        LocalRef { ptr: self.ptr }
    }
}

impl Drop for LocalRef {
    fn drop(&mut self) {
        // SAFETY: as in `clone`; gives back our reference.
        unsafe { local_dec(self.ptr) }
    }
}

// ---------------------------------------------------------------------
// Wakers. The data pointer is the header, with `LOCAL_TAG` set when the
// waker's reference is a local one. Wakers of one task made on its owner
// thread are bit-identical, so `Waker::will_wake` holds between them.

static WAKER_VTABLE: RawWakerVTable =
    RawWakerVTable::new(waker_clone, waker_wake, waker_wake_by_ref, waker_drop);

#[inline]
fn raw_waker(ptr: NonNull<Header>, local: bool) -> RawWaker {
    // Bit 0 of a header address is clear (alignment), so adding sets it.
    let data = ptr
        .as_ptr()
        .cast::<()>()
        .cast_const()
        .wrapping_byte_add(usize::from(local) * LOCAL_TAG);
    RawWaker::new(data, &WAKER_VTABLE)
}

/// A waker over a reference of the given kind (the caller gives it up, or
/// wraps the waker in `ManuallyDrop`).
fn waker_from(ptr: NonNull<Header>, local: bool) -> Waker {
    // SAFETY: the vtable functions uphold the `RawWaker` contract: clone
    // takes a reference, wake/drop give one back.
    unsafe { Waker::from_raw(raw_waker(ptr, local)) }
}

/// Splits a waker's data into the header and whether its reference is
/// local.
///
/// # Safety
/// `data` came from `raw_waker`.
#[inline]
unsafe fn untag(data: *const ()) -> (NonNull<Header>, bool) {
    let tag = data.addr() & LOCAL_TAG;
    let ptr = data.wrapping_byte_sub(tag).cast::<Header>().cast_mut();
    let local = tag != 0;
    // SAFETY: a header address is never null.
    (unsafe { NonNull::new_unchecked(ptr) }, local)
}

unsafe fn waker_clone(data: *const ()) -> RawWaker {
    // SAFETY: from `raw_waker` (the vtable is ours).
    let (ptr, _) = unsafe { untag(data) };
    // SAFETY: the waker holds a reference.
    let header = unsafe { ptr.as_ref() };
    if header.is_owner() {
        // SAFETY: owner thread; a current core is not closed.
        unsafe { local_inc(ptr) };
        raw_waker(ptr, true)
    } else {
        atomic_inc(header);
        raw_waker(ptr, false)
    }
}

unsafe fn waker_wake(data: *const ()) {
    // SAFETY: from `raw_waker`.
    let (ptr, local) = unsafe { untag(data) };
    // SAFETY: the waker holds a reference.
    let owner = unsafe { ptr.as_ref() }.is_owner();
    // The waker's reference, of the kind `local` says, is given up exactly
    // once; owner-thread paths run only when `is_owner` holds (and a
    // current core is never closed).
    match (owner, local) {
        // SAFETY: see above.
        (true, true) => unsafe { local_wake(ptr, true) },
        // SAFETY: see above.
        (true, false) => unsafe { local_wake_remote_ref(ptr) },
        // SAFETY: see above.
        (false, true) => unsafe { remote_drop_local(ptr, true) },
        // SAFETY: see above.
        (false, false) => unsafe { remote_wake(ptr, true) },
    }
}

/// Wakes every waker of `wakers` in order and empties the list (keeping
/// its capacity): what calling [`Waker::wake`] on each does, with the
/// current core read once for the list rather than once per waker. A
/// local waker of a task of the current core (the common case: an IO
/// completion on the core that polls its task) is woken inline, without
/// the call through its vtable; any other waker (another core's, another
/// executor's) is woken through `wake`, after which the current core is
/// read again.
///
/// ```
/// let mut wakers = vec![std::task::Waker::noop().clone()];
/// plugio::executor::wake_all(&mut wakers);
/// assert!(wakers.is_empty());
/// ```
#[inline]
pub fn wake_all(wakers: &mut Vec<Waker>) {
    let mut uid = current_uid();
    for waker in wakers.drain(..) {
        let waker = ManuallyDrop::new(waker);
        let data = waker.data();
        // A waker of ours (`raw_waker`) with a local reference, of a task
        // owned by the current core: what `waker_wake` does on its
        // `(true, true)` path.
        if ptr::eq(waker.vtable(), &WAKER_VTABLE) && data.addr() & LOCAL_TAG != 0 {
            // SAFETY: made by `raw_waker` (its vtable is ours).
            let (ptr, local) = unsafe { untag(data) };
            debug_assert!(local);
            // SAFETY: the waker holds a reference.
            if unsafe { ptr.as_ref() }.owner == uid {
                // SAFETY: owner thread (its uid is current; a current
                // core is never closed); the waker's local reference is
                // given up here, as `wake` gives it up.
                unsafe { local_wake(ptr, true) };
                continue;
            }
        }
        ManuallyDrop::into_inner(waker).wake();
        // A foreign waker runs any code: read the current core again.
        uid = current_uid();
    }
}

/// Clones `waker`: what [`Waker::clone`] does, with the common case of an
/// IO issued from a task of the current core (a waker of ours with a
/// local reference, cloned on its owner thread) inline: one increment of
/// the task's local count, no call through the vtable. The clone has the
/// same data as `waker` (so [`Waker::will_wake`] holds between them). Any
/// other waker is cloned through its vtable.
///
/// ```
/// let waker = std::task::Waker::noop();
/// assert!(plugio::executor::clone_waker(waker).will_wake(waker));
/// ```
#[inline]
pub fn clone_waker(waker: &Waker) -> Waker {
    let data = waker.data();
    if ptr::eq(waker.vtable(), &WAKER_VTABLE) && data.addr() & LOCAL_TAG != 0 {
        // SAFETY: made by `raw_waker` (its vtable is ours).
        let (ptr, _) = unsafe { untag(data) };
        // SAFETY: the waker holds a reference.
        let header = unsafe { ptr.as_ref() };
        if header.is_owner() {
            // The waker's own local reference counts in `local.refs`, so
            // the count is not zero and the group is already linked: what
            // `local_inc` does, without its 0 -> 1 case. (On the owner
            // thread, before the core closed: a current core is never
            // closed.)
            let n = header.local.refs.get();
            debug_assert!(n > 0, "a local waker without a local reference");
            header.local.refs.set(n + 1);
            // SAFETY: the new local reference is the clone's; the data is
            // `waker`'s own (a local reference of this task, from
            // `raw_waker`).
            return unsafe { Waker::new(data, &WAKER_VTABLE) };
        }
    }
    waker.clone()
}

/// Wakes, where that runs no code but the current core's own, the wakers
/// of its tasks: what [`wake_all`] does inline for one waker, for a caller
/// that must not run other code yet (it holds borrows that a foreign
/// waker, or the drop of a task's last reference, could need again).
/// Made on the thread, with the current core read once.
///
/// ```
/// let local = plugio::executor::LocalWake::current();
/// // Not a waker of a task of the current core: given back.
/// assert!(local.try_wake(std::task::Waker::noop().clone()).is_err());
/// ```
#[derive(Clone, Copy, Debug)]
pub struct LocalWake {
    uid: u64,
    /// Not `Send`: the uid is this thread's current core.
    _not_send: PhantomData<*const ()>,
}

impl LocalWake {
    /// The current core of this thread (none: every waker is given back).
    #[inline]
    pub fn current() -> Self {
        Self {
            uid: current_uid(),
            _not_send: PhantomData,
        }
    }

    /// Wakes `waker` if it is a waker of ours with a local reference, of
    /// a task of this core that is neither queued nor complete: the task
    /// is queued on the core's run queue, which takes the waker's
    /// reference, and no other code runs. Any other waker is given back
    /// untouched, to be woken (or dropped) later.
    #[inline]
    pub fn try_wake(&self, waker: Waker) -> Result<(), Waker> {
        let data = waker.data();
        if !ptr::eq(waker.vtable(), &WAKER_VTABLE) || data.addr() & LOCAL_TAG == 0 {
            return Err(waker);
        }
        // SAFETY: made by `raw_waker` (its vtable is ours).
        let (ptr, _) = unsafe { untag(data) };
        // SAFETY: the waker holds a reference.
        let header = unsafe { ptr.as_ref() };
        // `self.uid` is not 0 (no core) when it matches: a task's owner is
        // a core's uid. Relaxed: COMPLETE of a task with local state is
        // only set on this thread.
        if header.owner != self.uid
            || header.local.notified.get()
            || header.state.load_relaxed().is_complete()
        {
            return Err(waker);
        }
        debug_assert!(header.is_owner());
        header.local.notified.set(true);
        // The waker's local reference moves into the run queue, as
        // `local_wake(ptr, true)` moves it: nothing is dropped.
        std::mem::forget(waker);
        // SAFETY: owner thread (its uid is current; a current core is
        // never closed).
        unsafe { header.core.run_queue.push(LocalRef { ptr }) };
        Ok(())
    }
}

/// `waker_wake` of a waker with a remote reference, on the owner thread:
/// out of line, so the local waker's path saves no register for its
/// calls.
///
/// # Safety
/// Owner thread, before the core closed; the caller gives up its remote
/// reference.
#[inline(never)]
unsafe fn local_wake_remote_ref(ptr: NonNull<Header>) {
    // SAFETY: forwarded (caller).
    unsafe {
        local_wake(ptr, false);
        atomic_dec(ptr);
    }
}

unsafe fn waker_wake_by_ref(data: *const ()) {
    // SAFETY: from `raw_waker`; the waker holds a reference.
    unsafe { wake_by_ref(untag(data).0) }
}

unsafe fn waker_drop(data: *const ()) {
    // SAFETY: from `raw_waker`.
    let (ptr, local) = unsafe { untag(data) };
    if !local {
        // SAFETY: the waker's remote reference.
        return unsafe { atomic_dec(ptr) };
    }
    // SAFETY: the waker holds a reference.
    if unsafe { ptr.as_ref() }.is_owner() {
        // SAFETY: owner thread; the waker's local reference.
        unsafe { local_dec(ptr) }
    } else {
        // SAFETY: the waker's local reference, dropped off the owner.
        unsafe { remote_drop_local(ptr, false) }
    }
}

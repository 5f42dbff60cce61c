//! The raw task: layout, state bits, vtable, waker.

use super::JoinError;
use crate::core::CoreShared;
use crate::remote::Linked;
use crate::sync::AtomicPtr;
use futures::task::AtomicWaker;
use std::cell::UnsafeCell;
use std::future::Future;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::ptr::{self, NonNull};
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::{AcqRel, Acquire};
use std::sync::Arc;
use std::task::{Context, Poll, RawWaker, RawWakerVTable, Waker};

/// Set while the task is queued (or being queued) to run.
pub(crate) const NOTIFIED: usize = 1;
/// Set once the output slot holds the result (or the task was cancelled).
pub(crate) const COMPLETE: usize = 1 << 1;
/// Set while a `JoinHandle` exists.
pub(crate) const JOIN_INTEREST: usize = 1 << 2;
/// Set by `JoinHandle::abort`.
pub(crate) const CANCEL_REQUESTED: usize = 1 << 3;

/// Slot index of a task its core has not registered yet.
pub(crate) const UNREGISTERED: usize = usize::MAX;

/// The type-independent start of every task allocation.
pub(crate) struct Header {
    pub(crate) state: AtomicUsize,
    remote_next: AtomicPtr<Header>,
    vtable: &'static Vtable,
    /// The core that owns (polls) this task.
    pub(crate) core: Arc<CoreShared>,
    /// Index in the owner's slab of owned tasks; owner thread only.
    owned_slot: UnsafeCell<usize>,
    pub(crate) join_waker: AtomicWaker,
}

// SAFETY: `owned_slot` is only touched by the owner core's thread (or, for
// an unregistered task, by nobody); everything else is atomic or immutable.
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
    /// Polls the future once; returns true when the task completed.
    poll: unsafe fn(NonNull<Header>) -> bool,
    /// Drops the future and completes with `Cancelled`; false if already done.
    cancel: unsafe fn(NonNull<Header>) -> bool,
    clone_ref: unsafe fn(NonNull<Header>),
    drop_ref: unsafe fn(NonNull<Header>),
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

/// One counted reference to a task.
pub(crate) struct TaskRef {
    ptr: NonNull<Header>,
}

// SAFETY: a reference only lets its holder do thread-safe things (atomics,
// wake) except through the `unsafe` owner-only methods.
unsafe impl Send for TaskRef {}
// SAFETY: as above.
unsafe impl Sync for TaskRef {}

/// Allocates a task for `future`, owned by `core`. Returns the reference
/// for the run queue and the one for the `JoinHandle`; the state starts as
/// `NOTIFIED | JOIN_INTEREST` (the caller queues it at once).
pub(crate) fn new_task<F: Future>(
    future: F,
    core: Arc<CoreShared>,
) -> (TaskRef, JoinRef<F::Output>) {
    let cell = Arc::new(Cell {
        header: Header {
            state: AtomicUsize::new(NOTIFIED | JOIN_INTEREST),
            remote_next: AtomicPtr::new(ptr::null_mut()),
            vtable: vtable::<F>(),
            core,
            owned_slot: UnsafeCell::new(UNREGISTERED),
            join_waker: AtomicWaker::new(),
        },
        output: UnsafeCell::new(None),
        future: UnsafeCell::new(Some(future)),
    });
    let raw = Arc::into_raw(cell).cast::<Header>().cast_mut();
    // SAFETY: `Arc::into_raw` never returns null; header is at offset 0.
    let ptr = unsafe { NonNull::new_unchecked(raw) };
    let task = TaskRef { ptr };
    let join = JoinRef {
        task: task.clone(),
        _output: PhantomData,
    };
    (task, join)
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
        clone_ref: clone_ref::<F>,
        drop_ref: drop_ref::<F>,
    }
}

/// # Safety
/// `ptr` is a live `Cell<F>`.
unsafe fn cell<'a, F: Future>(ptr: NonNull<Header>) -> &'a Cell<F> {
    // SAFETY: header at offset 0 of a live `Cell<F>` (caller).
    unsafe { ptr.cast::<Cell<F>>().as_ref() }
}

unsafe fn clone_ref<F: Future>(ptr: NonNull<Header>) {
    // SAFETY: `ptr` came from `Arc::into_raw` of a `Cell<F>` and a
    // reference is held by the caller.
    unsafe { Arc::increment_strong_count(ptr.cast::<Cell<F>>().as_ptr()) }
}

unsafe fn drop_ref<F: Future>(ptr: NonNull<Header>) {
    // SAFETY: gives back the reference the caller held.
    unsafe { drop(Arc::from_raw(ptr.cast::<Cell<F>>().as_ptr())) }
}

unsafe fn poll<F: Future>(ptr: NonNull<Header>) -> bool {
    // SAFETY: owner thread (caller), live task.
    let cell = unsafe { cell::<F>(ptr) };
    // SAFETY: only the owner thread touches the future.
    let slot = unsafe { &mut *cell.future.get() };
    let Some(future) = slot.as_mut() else {
        return true;
    };
    let waker = ManuallyDrop::new(borrowed_waker(ptr));
    let mut cx = Context::from_waker(&waker);
    // SAFETY: the future lives inside the task allocation and is never
    // moved: it is only dropped in place (by setting the slot to `None`).
    let future = unsafe { Pin::new_unchecked(future) };
    let result = match catch_unwind(AssertUnwindSafe(|| future.poll(&mut cx))) {
        Ok(Poll::Pending) => return false,
        Ok(Poll::Ready(out)) => Ok(out),
        Err(payload) => Err(JoinError::Panic(payload)),
    };
    let result = match catch_unwind(AssertUnwindSafe(|| *slot = None)) {
        Ok(()) => result,
        Err(payload) => Err(JoinError::Panic(payload)),
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
        Err(payload) => Err(JoinError::Panic(payload)),
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
    // AcqRel: Release publishes the output to the JoinHandle (pairs with
    // its Acquire loads); Acquire pairs with the handle's AcqRel drop so
    // that, if the handle is gone, we may drop the output ourselves.
    let prev = cell.header.state.fetch_or(COMPLETE, AcqRel);
    if prev & JOIN_INTEREST == 0 {
        // SAFETY: no handle; we are the last side of the race.
        drop(unsafe { (*cell.output.get()).take() });
    } else {
        cell.header.join_waker.wake();
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
    /// `ptr` carries one reference (from `into_raw` or a waker).
    pub(crate) unsafe fn from_raw(ptr: NonNull<Header>) -> TaskRef {
        TaskRef { ptr }
    }

    /// Polls the task; returns true when it completed.
    ///
    /// # Safety
    /// Owner core's thread only.
    pub(crate) unsafe fn poll(&self) -> bool {
        // SAFETY: forwarded from the caller.
        unsafe { (self.header().vtable.poll)(self.ptr) }
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

    /// The owned-slab index (`UNREGISTERED` when not registered).
    ///
    /// # Safety
    /// Owner core's thread only.
    pub(crate) unsafe fn owned_slot(&self) -> usize {
        // SAFETY: owner thread only (caller), so no concurrent write.
        unsafe { *self.header().owned_slot.get() }
    }

    /// Records the owned-slab index.
    ///
    /// # Safety
    /// Owner core's thread only.
    pub(crate) unsafe fn set_owned_slot(&self, slot: usize) {
        // SAFETY: owner thread only (caller), so no concurrent access.
        unsafe { *self.header().owned_slot.get() = slot }
    }

    /// Marks the task notified; true when the caller must queue it.
    pub(crate) fn notify(&self) -> bool {
        notify(self.header())
    }

    /// Whether the task has completed.
    pub(crate) fn is_complete(&self) -> bool {
        // Acquire: pairs with the Release in `complete`.
        self.header().state.load(Acquire) & COMPLETE != 0
    }
}

impl Clone for TaskRef {
    fn clone(&self) -> Self {
        // SAFETY: we hold a reference.
        unsafe { (self.header().vtable.clone_ref)(self.ptr) };
        TaskRef { ptr: self.ptr }
    }
}

impl Drop for TaskRef {
    fn drop(&mut self) {
        // SAFETY: gives back our reference.
        unsafe { (self.header().vtable.drop_ref)(self.ptr) }
    }
}

fn notify(header: &Header) -> bool {
    // AcqRel: Release makes what the waker wrote before waking visible to
    // the poll (pairs with the core's AcqRel clear of NOTIFIED); Acquire
    // sees that clear, so a wake after it queues the task again.
    let prev = header.state.fetch_or(NOTIFIED, AcqRel);
    prev & (NOTIFIED | COMPLETE) == 0
}

static WAKER_VTABLE: RawWakerVTable =
    RawWakerVTable::new(waker_clone, waker_wake, waker_wake_by_ref, waker_drop);

/// A waker over a reference the caller keeps (never dropped: wrap in
/// `ManuallyDrop`).
fn borrowed_waker(ptr: NonNull<Header>) -> Waker {
    // SAFETY: the vtable functions uphold the `RawWaker` contract: clone
    // takes a reference, wake/drop give one back.
    unsafe { Waker::from_raw(RawWaker::new(ptr.as_ptr().cast(), &WAKER_VTABLE)) }
}

unsafe fn waker_clone(data: *const ()) -> RawWaker {
    let ptr = NonNull::from(
        // SAFETY: `data` is a live header (the waker holds a reference).
        unsafe { &*data.cast::<Header>() },
    );
    // SAFETY: as above.
    unsafe { (ptr.as_ref().vtable.clone_ref)(ptr) };
    RawWaker::new(data, &WAKER_VTABLE)
}

unsafe fn waker_wake(data: *const ()) {
    // SAFETY: the waker's reference moves into `task`.
    let task = unsafe { TaskRef::from_raw(NonNull::new_unchecked(data.cast_mut().cast())) };
    if task.notify() {
        crate::core::schedule(task);
    }
}

unsafe fn waker_wake_by_ref(data: *const ()) {
    // SAFETY: live header, the waker holds a reference.
    let header = unsafe { &*data.cast::<Header>() };
    if notify(header) {
        let ptr = NonNull::from(header);
        // SAFETY: take one more reference for the queue.
        unsafe { (header.vtable.clone_ref)(ptr) };
        // SAFETY: that reference moves into the TaskRef.
        crate::core::schedule(unsafe { TaskRef::from_raw(ptr) });
    }
}

unsafe fn waker_drop(data: *const ()) {
    // SAFETY: gives back the waker's reference.
    drop(unsafe { TaskRef::from_raw(NonNull::new_unchecked(data.cast_mut().cast())) });
}

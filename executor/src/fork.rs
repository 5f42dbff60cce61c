//! The fork generation: a counter bumped in the child of every `fork()`
//! (a `pthread_atfork` handler). The lowest layer of fork safety: the
//! runtime's cores record it when they are built, and so do the device
//! layer's drivers and rings (`plugio_device::fork`), to tell state built
//! before a fork, whose threads and rings the child does not have.
//!
//! Also [`ForkLocal`]: a process-wide value (a registry and its lock)
//! of which every fork generation makes its own instance, so that a lock
//! another thread held at the fork cannot stop the child.
//!
//! Invariants: the counter only grows, by one per fork, in the child. A
//! `ForkLocal`'s instance, once published, is never freed or moved, and
//! it is only handed out in the generation it was made in.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU64, Ordering};

/// Forks this process came through (0 in the original process).
static GENERATION: AtomicU64 = AtomicU64::new(0);
/// Whether the child handler is registered in this process.
static INSTALLED: AtomicBool = AtomicBool::new(false);
/// The pid of the process one of whose threads registers the handler (0:
/// none yet). A child that inherits another pid here (its parent forked
/// while a thread was registering, before the registration: the child has
/// no handler) registers its own instead of waiting for a thread it does
/// not have (a `std::sync::Once` there hung such a child forever: found
/// by a break-it helper, 3 children in 2,500 tries).
static REGISTERING: AtomicI32 = AtomicI32::new(0);

extern "C" fn in_child() {
    // Relaxed: the child has one thread (the forking one) right now, and
    // every later reader is that thread or one it spawns (spawning
    // synchronizes). Atomic stores and adds are async-signal-safe, as a
    // pthread_atfork child handler must be.
    GENERATION.fetch_add(1, Ordering::Relaxed);
    // The handler runs, so it is registered here too (a registration
    // finished just before the fork, by a thread that had not yet said
    // so, counts for the child).
    INSTALLED.store(true, Ordering::Relaxed);
}

/// Installs the child handler (once per process; later calls do nothing:
/// one load). Called when the first core, device driver, ring or
/// [`ForkLocal`] instance is built; forks before that are not counted
/// (nothing of plugio's existed to go stale).
///
/// Never waits for a thread a forked child does not have: glibc runs a
/// registration and a `fork()` one after the other (both hold its atfork
/// lock), so a child has the handler exactly when the registration came
/// first, and then the handler itself marks it installed.
#[inline]
pub fn install() {
    // Acquire: pairs with the Release store of the registering thread.
    if !INSTALLED.load(Ordering::Acquire) {
        install_slow();
    }
}

#[cold]
fn install_slow() {
    let me = nix::unistd::getpid().as_raw();
    loop {
        // Acquire: as in `install`.
        if INSTALLED.load(Ordering::Acquire) {
            return;
        }
        // AcqRel/Acquire: the claim orders nothing else; it only picks
        // one registering thread per process.
        match REGISTERING.compare_exchange(0, me, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return register(),
            Err(pid) if pid != me => {
                // Claimed in an ancestor that forked before registering.
                if REGISTERING
                    .compare_exchange(pid, me, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    return register();
                }
            }
            // Another thread of this process registers now (a few µs).
            Err(_) => std::thread::yield_now(),
        }
    }
}

fn register() {
    // SAFETY: registers a handler that only does atomic stores; it stays
    // valid for the life of the process (a static function).
    let rc = unsafe { nix::libc::pthread_atfork(None, None, Some(in_child)) };
    if rc != 0 {
        tracing::warn!(
            rc,
            "pthread_atfork failed: use of a runtime in a forked child is not refused"
        );
    }
    // Release: pairs with the Acquire loads in `install`.
    INSTALLED.store(true, Ordering::Release);
}

/// The number of forks this process came through since [`install`]
/// first ran (0 in that process, 1 in its child, ...).
///
/// ```
/// plugio::executor::fork::install();
/// assert_eq!(plugio::executor::fork::generation(), 0);
/// ```
#[inline]
pub fn generation() -> u64 {
    // Relaxed: see `in_child`.
    GENERATION.load(Ordering::Relaxed)
}

/// A process-wide value made again in each forked child: every fork
/// generation gets its own instance, made by `init` at its first use in
/// that generation, so nothing a thread of the parent left behind
/// (typically a `Mutex` it held at the moment of the fork, whose owner
/// the child does not have) reaches the child.
///
/// A `static Mutex` shared by every thread is exactly what POSIX warns
/// about in `fork()` from a threaded process: the child inherits the lock
/// word but not the holder, and its first `lock()` waits forever. The
/// usual cure, `pthread_atfork` handlers that take every lock before the
/// fork, stalls each `fork()` behind whoever holds one; a fresh instance
/// per generation needs no handler and no ordering between locks.
///
/// Shape: a pointer to a boxed `(generation, T)`. [`get`](Self::get)
/// costs two loads and a compare once the instance exists. Instances of
/// older generations are leaked, never dropped (one per value per fork
/// in the child; the parent never makes a second): their lock may be held
/// by a thread the child does not have, and their contents describe the
/// parent's state. Also usable in a struct (a pool's state): dropping the
/// `ForkLocal` frees the current generation's instance.
///
/// ```
/// use std::sync::Mutex;
/// use plugio::executor::fork::ForkLocal;
///
/// static NAMES: ForkLocal<Mutex<Vec<String>>> = ForkLocal::new(|| Mutex::new(Vec::new()));
/// NAMES.get().lock().unwrap().push("a".into());
/// assert_eq!(NAMES.get().lock().unwrap().len(), 1);
/// ```
pub struct ForkLocal<T> {
    init: fn() -> T,
    current: AtomicPtr<Instance<T>>,
    /// Owns `T`s (for the drop check).
    _value: PhantomData<T>,
}

// SAFETY: moving a `ForkLocal` moves its instances (owned `T`s) with it.
unsafe impl<T: Send> Send for ForkLocal<T> {}
// SAFETY: shared, it hands out `&T` to every thread (T: Sync), and any
// thread may make an instance that another thread's drop frees (T: Send).
unsafe impl<T: Send + Sync> Sync for ForkLocal<T> {}

struct Instance<T> {
    generation: u64,
    value: T,
}

impl<T> ForkLocal<T> {
    /// A value whose instance in each fork generation is `init()`, made
    /// at its first [`get`](Self::get) there (not before).
    pub const fn new(init: fn() -> T) -> Self {
        Self {
            init,
            current: AtomicPtr::new(std::ptr::null_mut()),
            _value: PhantomData,
        }
    }

    /// This fork generation's instance, made now if there is none yet
    /// (two threads racing to make it keep the one published first and
    /// drop the other before returning). Installs the fork counter
    /// ([`install`]) first, so that a fork after this call is counted.
    pub fn get(&self) -> &T {
        self.get_or_renew(|_| {})
    }

    /// [`get`](Self::get), and when this call is the one that replaces an
    /// older generation's instance (a forked child's first use), calls
    /// `stale` with that instance first (once per generation, on the
    /// thread that made the new one): a chance to take what the parent
    /// left there (a queue of jobs its threads would have run), with
    /// `try_lock`, since a lock in it may be held by a thread the child
    /// does not have.
    pub fn get_or_renew(&self, stale: impl FnOnce(&T)) -> &T {
        install();
        let generation = generation();
        // Acquire: pairs with the AcqRel exchange below that published the
        // instance, so its contents (made before) are seen.
        let mut seen = self.current.load(Ordering::Acquire);
        loop {
            // SAFETY: a non-null pointer here came from `Box::into_raw`
            // below and is freed only by `drop` (which has `&mut self`,
            // so no reference handed out lives then).
            if let Some(instance) = unsafe { seen.as_ref() } {
                if instance.generation == generation {
                    return &instance.value;
                }
            }
            let fresh = Box::into_raw(Box::new(Instance {
                generation,
                value: (self.init)(),
            }));
            // AcqRel: Release publishes `fresh`'s contents to the Acquire
            // loads (above and on failure here); Acquire on failure reads
            // the contents of the instance another thread published.
            match self
                .current
                .compare_exchange(seen, fresh, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(old) => {
                    // SAFETY: an older generation's instance, never freed
                    // (leaked from now on, see the type's docs).
                    if let Some(old) = unsafe { old.as_ref() } {
                        stale(&old.value);
                    }
                    // SAFETY: just published; freed only by `drop`.
                    return unsafe { &(*fresh).value };
                }
                Err(now) => {
                    // SAFETY: `fresh` was never published: ours alone.
                    drop(unsafe { Box::from_raw(fresh) });
                    seen = now;
                }
            }
        }
    }
}

impl<T> Drop for ForkLocal<T> {
    /// Frees the instance of the generation that made the last one (older
    /// ones stay leaked). A `static` is never dropped.
    fn drop(&mut self) {
        let current = *self.current.get_mut();
        if !current.is_null() {
            // SAFETY: from `Box::into_raw` in `get_or_renew`; `&mut self`
            // means no reference to it is alive.
            drop(unsafe { Box::from_raw(current) });
        }
    }
}

impl<T> std::fmt::Debug for ForkLocal<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForkLocal").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{mpsc, Mutex};

    static HELD: ForkLocal<Mutex<u32>> = ForkLocal::new(|| Mutex::new(7));

    /// A child whose parent forked while one of its threads had claimed
    /// the registration but not yet registered (simulated: the child
    /// finds the claim of another pid and no handler): its `install`
    /// registers its own handler at once instead of waiting for that
    /// thread, which the child does not have (a `Once` waited forever).
    #[test]
    fn a_registration_claimed_in_the_parent_does_not_stop_the_childs() {
        install();
        let parent = nix::unistd::getpid().as_raw();
        // SAFETY: the child only runs the checks below and `_exit`s.
        let pid = unsafe { nix::libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            // SAFETY: a plain syscall (kills a hung child).
            unsafe { nix::libc::alarm(20) };
            INSTALLED.store(false, Ordering::SeqCst);
            REGISTERING.store(parent, Ordering::SeqCst);
            install();
            let me = nix::unistd::getpid().as_raw();
            let ok = INSTALLED.load(Ordering::SeqCst) && REGISTERING.load(Ordering::SeqCst) == me;
            // SAFETY: ends the child at once.
            unsafe { nix::libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waits for our own child.
        assert_eq!(unsafe { nix::libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(
            nix::libc::WIFEXITED(status) && nix::libc::WEXITSTATUS(status) == 0,
            "child status {status:#x} (exit 1: not installed; signalled: hung)"
        );
    }

    /// A lock another thread holds at the fork: the child gets its own
    /// instance (made fresh by `init`) and locks it at once; the parent
    /// keeps its instance, with the value written before the fork.
    #[test]
    fn a_lock_held_by_another_thread_at_the_fork_is_free_in_the_child() {
        *HELD.get().lock().unwrap() = 8;
        let (locked_tx, locked_rx) = mpsc::channel();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            let guard = HELD.get().lock().unwrap();
            locked_tx.send(()).unwrap();
            release_rx.recv().unwrap();
            drop(guard);
        });
        locked_rx.recv().unwrap();
        // SAFETY: the child only locks, compares and `_exit`s.
        let pid = unsafe { nix::libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            // SAFETY: plain syscalls (alarm kills a hung child; _exit ends
            // it without running the parent's destructors).
            unsafe {
                nix::libc::alarm(20);
                let fresh = *HELD.get().lock().unwrap() == 7 && generation() == 1;
                nix::libc::_exit(if fresh { 0 } else { 1 });
            }
        }
        let mut status = 0;
        // SAFETY: waits for our own child.
        assert_eq!(unsafe { nix::libc::waitpid(pid, &mut status, 0) }, pid);
        release_tx.send(()).unwrap();
        holder.join().unwrap();
        assert!(
            nix::libc::WIFEXITED(status) && nix::libc::WEXITSTATUS(status) == 0,
            "child status {status:#x}"
        );
        assert_eq!(*HELD.get().lock().unwrap(), 8);
    }
}

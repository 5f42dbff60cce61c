//! Bounded cross-core channels for sharded designs: send on one core (or
//! any thread), receive on another.
//!
//! # Mechanism and invariants
//!
//! A `Mutex<VecDeque<T>>` of at most `cap` items with waiter lists; the
//! lock is held only to move one item and a waker, and wakers are called
//! after it is released. (The channel is not on the executor's hot path;
//! a remote wake itself is lock-free, see `remote`.)
//!
//! - Many senders (`Sender` is `Clone`), one receiver.
//! - Items come out in the order they went in (per the lock's order).
//! - When every `Sender` is dropped the channel is closed for receiving:
//!   `recv` returns the queued items, then `None`.
//! - When the `Receiver` is dropped (or `close`d), sends fail with the value
//!   given back; queued items are dropped with the receiver.
//! - A sender waiting for room is woken once per freed slot, oldest first;
//!   a waiter that was woken but dropped without sending passes the wake on.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

struct State<T> {
    items: VecDeque<T>,
    cap: usize,
    senders: usize,
    receiver_alive: bool,
    recv_waker: Option<Waker>,
    send_waiters: VecDeque<(u64, Waker)>,
    next_waiter_id: u64,
}

struct Chan<T> {
    state: Mutex<State<T>>,
}

impl<T> Chan<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // A panic while holding the lock cannot leave the state half-made
        // (every critical section is a few field updates), so a poisoned
        // lock is still consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Makes a bounded channel holding at most `cap` items.
///
/// # Panics
/// If `cap` is 0.
pub fn bounded<T>(cap: usize) -> (Sender<T>, Receiver<T>) {
    assert!(cap > 0, "channel capacity must be at least 1");
    let chan = Arc::new(Chan {
        state: Mutex::new(State {
            items: VecDeque::with_capacity(cap.min(4096)),
            cap,
            senders: 1,
            receiver_alive: true,
            recv_waker: None,
            send_waiters: VecDeque::new(),
            next_waiter_id: 0,
        }),
    });
    (Sender { chan: chan.clone() }, Receiver { chan })
}

/// The error of a send on a channel whose receiver is gone; holds the value.
#[derive(PartialEq, Eq)]
pub struct SendError<T>(pub T);

impl<T> fmt::Debug for SendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SendError(..)")
    }
}

impl<T> fmt::Display for SendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("sending on a closed channel")
    }
}

impl<T> std::error::Error for SendError<T> {}

/// The error of [`Sender::try_send`]; holds the value.
#[derive(PartialEq, Eq)]
pub enum TrySendError<T> {
    /// The channel holds `cap` items.
    Full(T),
    /// The receiver is gone.
    Closed(T),
}

impl<T> fmt::Debug for TrySendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TrySendError::Full(_) => f.write_str("Full(..)"),
            TrySendError::Closed(_) => f.write_str("Closed(..)"),
        }
    }
}

impl<T> fmt::Display for TrySendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TrySendError::Full(_) => f.write_str("channel is full"),
            TrySendError::Closed(_) => f.write_str("sending on a closed channel"),
        }
    }
}

impl<T> std::error::Error for TrySendError<T> {}

/// The error of [`Receiver::try_recv`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TryRecvError {
    /// Nothing queued, senders still exist.
    Empty,
    /// Nothing queued and every sender is gone.
    Closed,
}

impl fmt::Display for TryRecvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TryRecvError::Empty => f.write_str("channel is empty"),
            TryRecvError::Closed => f.write_str("channel is closed and empty"),
        }
    }
}

impl std::error::Error for TryRecvError {}

/// The sending side. `Clone` for more senders; `Send` when `T` is.
pub struct Sender<T> {
    chan: Arc<Chan<T>>,
}

impl<T> Sender<T> {
    /// Sends `value`, waiting for room.
    ///
    /// # Errors
    /// [`SendError`] with the value when the receiver is gone.
    pub fn send(&self, value: T) -> SendFuture<'_, T> {
        SendFuture {
            sender: self,
            value: Some(value),
            waiter: None,
        }
    }

    /// Sends `value` if there is room now.
    ///
    /// # Errors
    /// [`TrySendError::Full`] or [`TrySendError::Closed`], with the value.
    pub fn try_send(&self, value: T) -> Result<(), TrySendError<T>> {
        let mut state = self.chan.lock();
        if !state.receiver_alive {
            return Err(TrySendError::Closed(value));
        }
        if state.items.len() >= state.cap {
            return Err(TrySendError::Full(value));
        }
        state.items.push_back(value);
        let waker = state.recv_waker.take();
        drop(state);
        if let Some(w) = waker {
            w.wake();
        }
        Ok(())
    }

    /// Whether the receiver is gone (sends would fail).
    pub fn is_closed(&self) -> bool {
        !self.chan.lock().receiver_alive
    }

    /// Items queued now.
    pub fn len(&self) -> usize {
        self.chan.lock().items.len()
    }

    /// Whether nothing is queued now.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The capacity.
    pub fn capacity(&self) -> usize {
        self.chan.lock().cap
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        self.chan.lock().senders += 1;
        Sender {
            chan: self.chan.clone(),
        }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let mut state = self.chan.lock();
        state.senders -= 1;
        let waker = if state.senders == 0 {
            state.recv_waker.take()
        } else {
            None
        };
        drop(state);
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl<T> fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sender").finish_non_exhaustive()
    }
}

/// The future of [`Sender::send`].
#[must_use = "futures do nothing unless polled"]
pub struct SendFuture<'a, T> {
    sender: &'a Sender<T>,
    value: Option<T>,
    /// Our id in `send_waiters` while we wait (or after we were woken).
    waiter: Option<u64>,
}

impl<T> Unpin for SendFuture<'_, T> {}

impl<T> Future for SendFuture<'_, T> {
    type Output = Result<(), SendError<T>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        assert!(
            this.value.is_some(),
            "SendFuture polled after it returned Ready"
        );
        if crate::coop::poll_proceed(cx).is_pending() {
            return Poll::Pending;
        }
        let mut state = this.sender.chan.lock();
        if !state.receiver_alive {
            this.forget_waiter(&mut state);
            return match this.value.take() {
                Some(value) => Poll::Ready(Err(SendError(value))),
                None => Poll::Pending,
            };
        }
        // Keep the line: a new sender goes behind waiting ones; a waiter
        // goes when it is first, or when a receive woke it (took it out).
        let my_turn = match this.waiter {
            None => state.send_waiters.is_empty(),
            Some(id) => {
                let in_line = state.send_waiters.iter().any(|(w, _)| *w == id);
                !in_line || state.send_waiters.front().is_some_and(|(w, _)| *w == id)
            }
        };
        if my_turn && state.items.len() < state.cap {
            if let Some(value) = this.value.take() {
                this.forget_waiter(&mut state);
                state.items.push_back(value);
                let waker = state.recv_waker.take();
                drop(state);
                if let Some(w) = waker {
                    w.wake();
                }
                return Poll::Ready(Ok(()));
            }
        }
        this.wait(&mut state, cx.waker());
        Poll::Pending
    }
}

impl<T> SendFuture<'_, T> {
    /// Registers (or refreshes) our place in line.
    fn wait(&mut self, state: &mut State<T>, waker: &Waker) {
        if let Some(id) = self.waiter {
            if let Some(entry) = state.send_waiters.iter_mut().find(|(w, _)| *w == id) {
                if !entry.1.will_wake(waker) {
                    entry.1 = waker.clone();
                }
                return;
            }
            // Woken, but the room was taken: go to the front again.
            state.send_waiters.push_front((id, waker.clone()));
            return;
        }
        let id = state.next_waiter_id;
        state.next_waiter_id += 1;
        state.send_waiters.push_back((id, waker.clone()));
        self.waiter = Some(id);
    }

    /// Leaves the line.
    fn forget_waiter(&mut self, state: &mut State<T>) {
        if let Some(id) = self.waiter.take() {
            state.send_waiters.retain(|(w, _)| *w != id);
        }
    }
}

impl<T> Drop for SendFuture<'_, T> {
    fn drop(&mut self) {
        let Some(id) = self.waiter.take() else {
            return;
        };
        let mut state = self.sender.chan.lock();
        let before = state.send_waiters.len();
        state.send_waiters.retain(|(w, _)| *w != id);
        let was_woken = state.send_waiters.len() == before;
        // We were woken for a free slot but will not use it: pass it on.
        let next = if was_woken && state.items.len() < state.cap {
            state.send_waiters.front().map(|(_, w)| w.clone())
        } else {
            None
        };
        drop(state);
        if let Some(w) = next {
            w.wake();
        }
    }
}

/// The receiving side; `Send` when `T` is.
pub struct Receiver<T> {
    chan: Arc<Chan<T>>,
}

impl<T> Receiver<T> {
    /// Receives the next item; `None` once every sender is gone and the
    /// queue is empty.
    pub fn recv(&mut self) -> RecvFuture<'_, T> {
        RecvFuture { receiver: self }
    }

    /// Receives an item if one is queued now.
    ///
    /// # Errors
    /// [`TryRecvError::Empty`] or [`TryRecvError::Closed`].
    pub fn try_recv(&mut self) -> Result<T, TryRecvError> {
        let mut state = self.chan.lock();
        match state.items.pop_front() {
            Some(item) => {
                let waker = state.send_waiters.pop_front().map(|(_, w)| w);
                drop(state);
                if let Some(w) = waker {
                    w.wake();
                }
                Ok(item)
            }
            None if state.senders == 0 => Err(TryRecvError::Closed),
            None => Err(TryRecvError::Empty),
        }
    }

    /// Closes the channel for sending: later sends fail; items already
    /// queued can still be received.
    pub fn close(&mut self) {
        let mut state = self.chan.lock();
        state.receiver_alive = false;
        let waiters: Vec<Waker> = state.send_waiters.drain(..).map(|(_, w)| w).collect();
        drop(state);
        waiters.into_iter().for_each(Waker::wake);
    }

    /// Items queued now.
    pub fn len(&self) -> usize {
        self.chan.lock().items.len()
    }

    /// Whether nothing is queued now.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<T>> {
        if crate::coop::poll_proceed(cx).is_pending() {
            return Poll::Pending;
        }
        let mut state = self.chan.lock();
        if let Some(item) = state.items.pop_front() {
            let waker = state.send_waiters.pop_front().map(|(_, w)| w);
            drop(state);
            if let Some(w) = waker {
                w.wake();
            }
            return Poll::Ready(Some(item));
        }
        if state.senders == 0 {
            return Poll::Ready(None);
        }
        match &state.recv_waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => state.recv_waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        self.close();
        let items = std::mem::take(&mut self.chan.lock().items);
        drop(items);
    }
}

impl<T> fmt::Debug for Receiver<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Receiver").finish_non_exhaustive()
    }
}

/// The future of [`Receiver::recv`].
#[must_use = "futures do nothing unless polled"]
pub struct RecvFuture<'a, T> {
    receiver: &'a mut Receiver<T>,
}

impl<T> Future for RecvFuture<'_, T> {
    type Output = Option<T>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        self.receiver.poll_recv(cx)
    }
}

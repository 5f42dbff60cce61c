//! Bounded cross-core channels for sharded designs: send on one core (or
//! any thread), receive on another.
//!
//! A thin layer over the `async-channel` crate (smol-rs): its lock-free
//! bounded queue and `event-listener` wake lists do the work; this module
//! adds the executor's cooperative budget ([`crate::coop`]: a ready send or
//! receive spends one unit, so a task looping on a busy channel cannot
//! starve its core) and keeps plugio's single-receiver API (`recv` gives
//! `None` at the end).
//!
//! # Contract (tokio's `mpsc`)
//!
//! - Many senders (`Sender` is `Clone`), one receiver; at most `cap` items
//!   queued.
//! - Items come out in the order they went in.
//! - When every `Sender` is dropped, `recv` returns the queued items, then
//!   `None`.
//! - [`Receiver::close`] closes the channel for sending, even while senders
//!   live: sends (waiting ones included) fail with the value given back,
//!   and `recv` still returns every item queued before, then `None`.
//! - Dropping the `Receiver` closes the channel and drops the queued items.
//! - A sender waiting for room is woken when a slot frees, oldest waiter
//!   first; a waiter that was woken but dropped without sending passes the
//!   wake on (`event-listener`'s notification hand-off).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// Makes a bounded channel holding at most `cap` items.
///
/// Its `cap` slots are allocated up front (async-channel's bounded queue):
/// about `cap × (size_of::<T>() + 8)` bytes even while empty, so a bound of
/// a million 8-byte items takes 16 MB at once: choose the bound from the
/// memory it takes, not as a large safety limit.
///
/// ```
/// use plugio::executor::{channel, LocalExecutor};
///
/// let (tx, mut rx) = channel::bounded::<u32>(8);
/// let got = LocalExecutor::new().run(async move {
///     tx.send(1).await.unwrap();
///     tx.send(2).await.unwrap();
///     drop(tx);
///     let mut got = Vec::new();
///     while let Some(v) = rx.recv().await {
///         got.push(v);
///     }
///     got
/// });
/// assert_eq!(got, [1, 2]);
/// ```
///
/// # Panics
/// If `cap` is 0, or if the slots' size overflows `isize` ("capacity
/// overflow"); an allocation of the slots that fails aborts the process,
/// as any allocation in Rust does.
pub fn bounded<T>(cap: usize) -> (Sender<T>, Receiver<T>) {
    assert!(cap > 0, "channel capacity must be at least 1");
    let (tx, rx) = async_channel::bounded(cap);
    let inner = Box::pin(rx);
    (Sender { inner: tx }, Receiver { inner })
}

/// The error of a send on a closed channel; holds the value.
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
    /// The channel is closed (receiver dropped or closed).
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
    /// Nothing queued and the channel is closed (every sender gone, or
    /// [`Receiver::close`]).
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
    inner: async_channel::Sender<T>,
}

impl<T> Sender<T> {
    /// Sends `value`, waiting for room.
    ///
    /// ```
    /// use plugio::executor::{channel, LocalExecutor};
    ///
    /// let (tx, mut rx) = channel::bounded(1);
    /// LocalExecutor::new().run(async move {
    ///     tx.send("a").await.unwrap();
    ///     rx.close();
    ///     assert_eq!(tx.send("b").await.unwrap_err().0, "b");
    /// });
    /// ```
    ///
    /// # Errors
    /// [`SendError`] with the value when the channel is closed (receiver
    /// dropped or [`Receiver::close`]d).
    pub fn send(&self, value: T) -> SendFuture<'_, T> {
        SendFuture {
            inner: self.inner.send(value),
        }
    }

    /// Sends `value` if there is room now.
    ///
    /// ```
    /// use plugio::executor::channel::{self, TrySendError};
    ///
    /// let (tx, _rx) = channel::bounded(1);
    /// tx.try_send(1).unwrap();
    /// assert_eq!(tx.try_send(2), Err(TrySendError::Full(2)));
    /// ```
    ///
    /// # Errors
    /// [`TrySendError::Full`] or [`TrySendError::Closed`], with the value.
    pub fn try_send(&self, value: T) -> Result<(), TrySendError<T>> {
        self.inner.try_send(value).map_err(|e| match e {
            async_channel::TrySendError::Full(v) => TrySendError::Full(v),
            async_channel::TrySendError::Closed(v) => TrySendError::Closed(v),
        })
    }

    /// Whether the channel is closed (sends would fail).
    ///
    /// ```
    /// let (tx, rx) = plugio::executor::channel::bounded::<()>(1);
    /// assert!(!tx.is_closed());
    /// drop(rx);
    /// assert!(tx.is_closed());
    /// ```
    pub fn is_closed(&self) -> bool {
        self.inner.is_closed()
    }

    /// Items queued now.
    ///
    /// ```
    /// let (tx, _rx) = plugio::executor::channel::bounded(4);
    /// tx.try_send(1).unwrap();
    /// assert_eq!(tx.len(), 1);
    /// ```
    pub fn len(&self) -> usize {
        self.inner.len()
    }

    /// Whether nothing is queued now.
    ///
    /// ```
    /// let (tx, _rx) = plugio::executor::channel::bounded::<u8>(4);
    /// assert!(tx.is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }

    /// The capacity.
    ///
    /// ```
    /// let (tx, _rx) = plugio::executor::channel::bounded::<u8>(4);
    /// assert_eq!(tx.capacity(), 4);
    /// ```
    pub fn capacity(&self) -> usize {
        // Always `Some`: every channel of this module is bounded.
        self.inner.capacity().unwrap_or(usize::MAX)
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        Sender {
            inner: self.inner.clone(),
        }
    }
}

impl<T> fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sender")
            .field("len", &self.len())
            .field("closed", &self.is_closed())
            .finish_non_exhaustive()
    }
}

/// `poll` as it is, with the budget unit its [`coop::poll_proceed`] spent
/// given back when it is `Pending` (only ready polls spend budget).
///
/// [`coop::poll_proceed`]: crate::coop::poll_proceed
#[inline]
fn spent_if_ready<T>(poll: Poll<T>) -> Poll<T> {
    if poll.is_pending() {
        crate::coop::refund();
    }
    poll
}

/// The future of [`Sender::send`].
#[must_use = "futures do nothing unless polled"]
pub struct SendFuture<'a, T> {
    inner: async_channel::Send<'a, T>,
}

impl<T> Future for SendFuture<'_, T> {
    type Output = Result<(), SendError<T>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if crate::coop::poll_proceed(cx).is_pending() {
            return Poll::Pending;
        }
        // SAFETY: structural pinning of `inner`: it is never moved out of
        // a pinned `SendFuture`, which has no `Drop` impl and is `Unpin`
        // only when `inner` is (auto trait).
        let inner = unsafe { self.map_unchecked_mut(|f| &mut f.inner) };
        spent_if_ready(inner.poll(cx))
            .map(|r| r.map_err(|async_channel::SendError(v)| SendError(v)))
    }
}

impl<T> fmt::Debug for SendFuture<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SendFuture").finish_non_exhaustive()
    }
}

/// The receiving side; `Send` when `T` is.
pub struct Receiver<T> {
    /// Pinned (boxed once, at creation): it holds the listener that
    /// [`Receiver::poll_recv`] registers between polls.
    inner: Pin<Box<async_channel::Receiver<T>>>,
}

impl<T> Receiver<T> {
    /// Receives the next item; `None` once the channel is closed (every
    /// sender dropped, or [`Receiver::close`]) and the queue is empty.
    ///
    /// ```
    /// use plugio::executor::{channel, LocalExecutor};
    ///
    /// let (tx, mut rx) = channel::bounded(2);
    /// tx.try_send(7).unwrap();
    /// drop(tx);
    /// LocalExecutor::new().run(async move {
    ///     assert_eq!(rx.recv().await, Some(7));
    ///     assert_eq!(rx.recv().await, None);
    /// });
    /// ```
    pub fn recv(&mut self) -> RecvFuture<'_, T> {
        RecvFuture {
            inner: self.inner.recv(),
        }
    }

    /// Polls for the next item, for a hand-written `poll` that cannot keep
    /// a [`RecvFuture`] alive between polls: `Ready(None)` once the channel
    /// is closed and empty, else `Pending` with `cx`'s waker registered. The
    /// registration is kept in the receiver itself, so a later send wakes
    /// the last task that polled (tokio's `Receiver::poll_recv`). Polling a
    /// fresh `recv()` and dropping it, instead, drops its registration with
    /// it: a send after that wakes nobody.
    ///
    /// ```
    /// use std::future::poll_fn;
    /// use plugio::executor::{channel, LocalExecutor};
    ///
    /// let (tx, mut rx) = channel::bounded(2);
    /// LocalExecutor::new().run(async move {
    ///     let sender = plugio::spawn_local(async move {
    ///         plugio::yield_now().await;
    ///         tx.send(5).await.unwrap();
    ///     });
    ///     assert_eq!(poll_fn(|cx| rx.poll_recv(cx)).await, Some(5));
    ///     sender.await.unwrap();
    ///     assert_eq!(poll_fn(|cx| rx.poll_recv(cx)).await, None);
    /// });
    /// ```
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<T>> {
        if crate::coop::poll_proceed(cx).is_pending() {
            return Poll::Pending;
        }
        spent_if_ready(futures::Stream::poll_next(self.inner.as_mut(), cx))
    }

    /// Receives an item if one is queued now.
    ///
    /// ```
    /// use plugio::executor::channel::{self, TryRecvError};
    ///
    /// let (tx, mut rx) = channel::bounded(2);
    /// assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    /// tx.try_send(1).unwrap();
    /// assert_eq!(rx.try_recv(), Ok(1));
    /// ```
    ///
    /// # Errors
    /// [`TryRecvError::Empty`], or [`TryRecvError::Closed`] once the
    /// channel is closed and empty.
    pub fn try_recv(&mut self) -> Result<T, TryRecvError> {
        self.inner.try_recv().map_err(|e| {
            if e.is_closed() {
                TryRecvError::Closed
            } else {
                TryRecvError::Empty
            }
        })
    }

    /// Closes the channel for sending, even while senders live: later and
    /// waiting sends fail with their value; items already queued are still
    /// received, then `recv` returns `None` (tokio's `Receiver::close`).
    ///
    /// ```
    /// use plugio::executor::{channel, LocalExecutor};
    ///
    /// let (tx, mut rx) = channel::bounded(4);
    /// tx.try_send(1).unwrap();
    /// rx.close();
    /// assert!(tx.try_send(2).is_err());
    /// LocalExecutor::new().run(async move {
    ///     assert_eq!(rx.recv().await, Some(1));
    ///     assert_eq!(rx.recv().await, None, "tx is alive, but the channel is closed");
    /// });
    /// ```
    pub fn close(&mut self) {
        self.inner.close();
    }

    /// Items queued now.
    ///
    /// ```
    /// let (tx, rx) = plugio::executor::channel::bounded(2);
    /// tx.try_send(()).unwrap();
    /// assert_eq!(rx.len(), 1);
    /// ```
    pub fn len(&self) -> usize {
        self.inner.len()
    }

    /// Whether nothing is queued now.
    ///
    /// ```
    /// let (_tx, rx) = plugio::executor::channel::bounded::<()>(2);
    /// assert!(rx.is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        self.inner.close();
        // The queued items go with the receiver, not with the last sender.
        while self.inner.try_recv().is_ok() {}
    }
}

impl<T> fmt::Debug for Receiver<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Receiver")
            .field("len", &self.len())
            .finish_non_exhaustive()
    }
}

/// The future of [`Receiver::recv`].
#[must_use = "futures do nothing unless polled"]
pub struct RecvFuture<'a, T> {
    inner: async_channel::Recv<'a, T>,
}

impl<T> Future for RecvFuture<'_, T> {
    type Output = Option<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        if crate::coop::poll_proceed(cx).is_pending() {
            return Poll::Pending;
        }
        // SAFETY: structural pinning of `inner`, as in `SendFuture::poll`.
        let inner = unsafe { self.map_unchecked_mut(|f| &mut f.inner) };
        spent_if_ready(inner.poll(cx)).map(Result::ok)
    }
}

impl<T> fmt::Debug for RecvFuture<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecvFuture").finish_non_exhaustive()
    }
}

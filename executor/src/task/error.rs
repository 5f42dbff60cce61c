//! `JoinError`: why a task produced no output. A leaf: the task code
//! (`raw`) builds it and the `JoinHandle` (`join`) hands it out.
//!
//! Invariant: `JoinError` is `Send + Sync`, so `?` moves it into
//! `Box<dyn Error + Send + Sync>` or `anyhow::Error`. The panic payload
//! (`Box<dyn Any + Send>`, not `Sync`) is therefore kept behind a mutex
//! that only the by-value accessors open; its message is read once, when
//! the task panics.

use std::any::Any;
use std::fmt;
use std::sync::Mutex;

/// Why a task produced no output.
///
/// `Send + Sync + 'static` (like tokio's `JoinError`), so `?` converts it
/// into `Box<dyn std::error::Error + Send + Sync>` or `anyhow::Error`.
///
/// ```
/// use plugio::executor::{JoinError, LocalExecutor, spawn_local};
///
/// fn join() -> Result<u32, Box<dyn std::error::Error + Send + Sync>> {
///     let ex = LocalExecutor::new();
///     let out = ex.run(async { spawn_local(async { 7 }).await })?;
///     Ok(out)
/// }
/// assert_eq!(join().unwrap(), 7);
///
/// let ex = LocalExecutor::new();
/// let err = ex.run(async { spawn_local(async { panic!("boom") }).await }).unwrap_err();
/// assert_eq!(err.panic_message(), Some("boom"));
/// let payload = err.into_panic();
/// assert_eq!(payload.downcast_ref::<&str>(), Some(&"boom"));
/// ```
pub enum JoinError {
    /// The task was aborted ([`JoinHandle::abort`](crate::JoinHandle::abort)) or its core shut down
    /// before it finished.
    Cancelled,
    /// The task panicked. The core kept running.
    Panic(TaskPanic),
}

/// A task's panic: what `panic!` was given (the payload of
/// `std::panic::catch_unwind`) and its message when that is a string.
pub struct TaskPanic {
    message: Option<String>,
    /// Only `into_payload` (by value) opens it, so `TaskPanic` is `Sync`
    /// without the payload being `Sync`.
    payload: Mutex<Box<dyn Any + Send + 'static>>,
}

impl TaskPanic {
    pub(crate) fn new(payload: Box<dyn Any + Send + 'static>) -> TaskPanic {
        let message = payload
            .downcast_ref::<&'static str>()
            .map(|s| (*s).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned());
        TaskPanic {
            message,
            payload: Mutex::new(payload),
        }
    }

    /// The panic message, when the payload is a `&str` or a `String`.
    pub fn message(&self) -> Option<&str> {
        self.message.as_deref()
    }

    /// The payload, as `catch_unwind` returned it: give it to
    /// `std::panic::resume_unwind` to go on panicking.
    pub fn into_payload(self) -> Box<dyn Any + Send + 'static> {
        // A poisoned lock still holds the payload; nothing panics while
        // holding it, since no method locks it.
        self.payload
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl JoinError {
    pub(crate) fn panic(payload: Box<dyn Any + Send + 'static>) -> JoinError {
        JoinError::Panic(TaskPanic::new(payload))
    }

    /// Whether the task was cancelled.
    pub fn is_cancelled(&self) -> bool {
        matches!(self, JoinError::Cancelled)
    }

    /// Whether the task panicked.
    pub fn is_panic(&self) -> bool {
        matches!(self, JoinError::Panic(_))
    }

    /// The panic message, when the task panicked with a `&str` or `String`.
    pub fn panic_message(&self) -> Option<&str> {
        match self {
            JoinError::Panic(p) => p.message(),
            JoinError::Cancelled => None,
        }
    }

    /// The panic payload, or the error itself when the task was cancelled.
    ///
    /// # Errors
    /// `Err(self)` when the task was cancelled.
    pub fn try_into_panic(self) -> Result<Box<dyn Any + Send + 'static>, JoinError> {
        match self {
            JoinError::Panic(p) => Ok(p.into_payload()),
            JoinError::Cancelled => Err(self),
        }
    }

    /// The panic payload (as tokio's `JoinError::into_panic`).
    ///
    /// # Panics
    /// If the task was cancelled rather than panicking; see
    /// [`try_into_panic`](Self::try_into_panic).
    pub fn into_panic(self) -> Box<dyn Any + Send + 'static> {
        self.try_into_panic().unwrap_or_else(|_| {
            panic!("JoinError::into_panic: the task was cancelled, it did not panic")
        })
    }
}

impl fmt::Debug for TaskPanic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TaskPanic({:?})", self.message)
    }
}

impl fmt::Debug for JoinError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JoinError::Cancelled => f.write_str("JoinError::Cancelled"),
            JoinError::Panic(_) => write!(f, "JoinError::Panic({:?})", self.panic_message()),
        }
    }
}

impl fmt::Display for JoinError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JoinError::Cancelled => f.write_str("task was cancelled"),
            JoinError::Panic(_) => match self.panic_message() {
                Some(m) => write!(f, "task panicked: {m}"),
                None => f.write_str("task panicked"),
            },
        }
    }
}

impl std::error::Error for JoinError {}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_send_sync<T: Send + Sync + 'static>() {}

    #[test]
    fn join_error_is_send_and_sync_and_keeps_the_payload() {
        is_send_sync::<JoinError>();
        let e = JoinError::panic(Box::new(String::from("bad page")));
        assert_eq!(e.panic_message(), Some("bad page"));
        let boxed: Box<dyn std::error::Error + Send + Sync> = Box::new(e);
        assert_eq!(boxed.to_string(), "task panicked: bad page");
        let e = JoinError::panic(Box::new(42_u32));
        assert_eq!(e.panic_message(), None);
        assert_eq!(e.into_panic().downcast_ref::<u32>(), Some(&42));
        assert!(JoinError::Cancelled
            .try_into_panic()
            .unwrap_err()
            .is_cancelled());
    }
}

//! `JoinError`: why a task produced no output. A leaf: the task code
//! (`raw`) builds it and the `JoinHandle` (`join`) hands it out.

use std::any::Any;
use std::fmt;

/// Why a task produced no output.
pub enum JoinError {
    /// The task was aborted ([`JoinHandle::abort`](crate::JoinHandle::abort)) or its core shut down
    /// before it finished.
    Cancelled,
    /// The task panicked; the payload is what `panic!` was given (as from
    /// `std::panic::catch_unwind`). The core kept running.
    Panic(Box<dyn Any + Send + 'static>),
}

impl JoinError {
    /// Whether the task was cancelled.
    pub fn is_cancelled(&self) -> bool {
        matches!(self, JoinError::Cancelled)
    }

    /// Whether the task panicked.
    pub fn is_panic(&self) -> bool {
        matches!(self, JoinError::Panic(_))
    }

    /// The panic message, when the payload is a string.
    pub fn panic_message(&self) -> Option<&str> {
        match self {
            JoinError::Panic(p) => p
                .downcast_ref::<&'static str>()
                .copied()
                .or_else(|| p.downcast_ref::<String>().map(String::as_str)),
            JoinError::Cancelled => None,
        }
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

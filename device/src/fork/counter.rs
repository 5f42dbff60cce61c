//! The fork generation (kept by the executor, the lowest layer:
//! [`plugio_executor::fork`]) and the error of IO through state built
//! before a fork.

use crate::error::{Error, ErrorKind};

/// The number of forks this process came through (0 in the process that
/// first created a driver or a runtime, 1 in its child, ...): see
/// [`plugio_executor::fork::generation`].
pub use plugio_executor::fork::generation;
pub(crate) use plugio_executor::fork::install;

/// The error for IO through state built before a fork.
pub fn forked_error() -> Error {
    Error::new(ErrorKind::Forked)
}

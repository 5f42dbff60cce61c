//! plugio-executor: a thread-per-core async runtime (skeleton; see issue 2).
#![cfg_attr(not(test), warn(missing_docs))]

pub mod driver;
pub use driver::{Driver, ThreadDriver, Unpark};

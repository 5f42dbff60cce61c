//! plugio: a thread-per-core async storage IO runtime for databases.
pub use plugio_device as device;
pub use plugio_engine as engine;
pub use plugio_executor as executor;

//! plugio-device: io_uring rings and storage backends.
//!
//! # The low-level interface (what the engine builds on)
//!
//! ```text
//! core thread:  DeviceDriver::new(&RingConfig)      // once per core, on its thread
//!               let h = register_handler(rc_handler) // once per core
//!               backend.check(&op)?                  // once, when the bio is made
//!               unsafe { backend.submit(&op, h, tag)? } // only queues (a full SQ
//!                                                    // is submitted by the ring)
//!               submit_now()?                        // optional: start IO early
//!               ... executor parks: Driver::park -> io_uring_enter(submit+wait)
//!               -> handler.complete_batch(&[(tag, result), ..]) // same thread,
//!                                                    // inside park, one call per reap
//! ```
//!
//! - [`IoOp`]: one op = one submission = one completion. Offsets and lengths
//!   in bytes; `segments` are `libc::iovec`s; `fixed_buf` names a
//!   registered buffer; [`IoFlags`] carry FUA, PREFLUSH, NOMERGE and ioprio.
//! - [`Backend`]: `geometry()`, `check(&op)`, `unsafe submit(&op, handler,
//!   token)`. Implementations: [`FileBackend`] (io_uring, O_DIRECT, fixed
//!   buffers/files; with `OpenOptions::backend(BackendKind::Sync)`, or on a
//!   thread whose driver has no ring, the `sync` thread pool),
//!   `MemDevice` (simulated, seeded, with fault injection and power cuts;
//!   behind the `test-util` feature) and [`NvmeBackend`] (NVMe
//!   passthrough on `/dev/ngXnY`, with its own SQE128/CQE32 ring per core
//!   driven by the same park; see [`backend::nvme`]).
//! - [`CompletionHandler::complete`]`(token, result)`: `result` is the byte
//!   count for `Read`/`Write` (`>= 0`; short at end of file, 0 at or past
//!   it), 0 for the other ops, or `-errno`; map errors with
//!   [`Error::from_errno`]. Called on the registering thread only, inside
//!   `park`/[`run_completions`]. Ring completions arrive through
//!   [`CompletionHandler::complete_batch`]`(&[(token, result)])`, one call
//!   per run of one handler's CQEs per reap (its default calls `complete`
//!   for each).
//! - [`DmaBuf`]: aligned buffers from a per-core arena registered with the
//!   ring; `DmaBuf::fixed_index()` gives the `IoOp::fixed_buf` to use.
//! - [`DeviceDriver`] implements the executor's `Driver`: one
//!   `io_uring_enter` per park submits everything queued and waits for up
//!   to `min(ceil(in_flight / 2), 32)` CQEs for a short adaptive time, then for any
//!   CQE, an unpark (eventfd read armed in the ring) or the timeout
//!   (shortened to the nearest simulated completion); none at all when
//!   completions are already there and nothing is queued (see
//!   [`ring`]'s wait policy).
//!
//! On top sits a high-level ownership-passing async API, [`File`], used by
//! direct users and this crate's tests; [`describe`] renders what
//! `plugio info PATH` prints; `testing` (behind the `test-util` feature,
//! as tokio's test helpers are) has a `block_on` that parks a driver, a
//! recording completion handler and an O_DIRECT-capable temp dir.
//!
//! # Invariants
//!
//! - A buffer belongs to the kernel (or the pool thread, or the simulated
//!   device) from submit until its completion is delivered; dropping a
//!   future moves the buffer into the in-flight slot, never frees it.
//! - Every successful submit completes exactly once, on the submitting
//!   thread. `EAGAIN`, `EBUSY`, `EINTR`, SQ full and CQ overflow are
//!   handled inside and never reach a handler.
//! - Bad input is refused by `check` before anything is queued; callers
//!   check once (the file backend's `submit` does not check again).

#![cfg_attr(not(test), warn(missing_docs))]

pub mod backend;
pub mod buf;
mod completion;
pub mod core;
pub mod driver;
pub mod error;
pub mod file_size_limit;
pub mod fork;
pub mod fs;
pub mod fs_ops;
pub mod geometry;
pub mod info;
pub mod op;
pub mod path_kind;
pub mod ring;
mod sync;
#[cfg(any(test, feature = "test-util"))]
pub mod testing;

pub use backend::file::{FileBackend, OpenOptions};
#[cfg(any(test, feature = "test-util"))]
pub use backend::mem::{Fault, FaultOn, Latency, MemClock, MemConfig, MemDevice, PowerCutMode};
pub use backend::nvme::{is_passthrough_name, is_passthrough_path, NvmeBackend, NvmeOptions};
pub use backend::{check_op, check_op_fast, Backend, BackendKind, SqSession, SqWriter};
pub use buf::DmaBuf;
pub use core::{
    core_waker, driver_installed, driver_serves, register_handler, run_completions, submit_now,
    unregister_handler, CompletionHandler, HandlerId,
};
pub use driver::DeviceDriver;
pub use error::{Error, ErrorKind, InvalidInput, Result};
pub use file_size_limit::{check_file_size_limit, check_set_len};
pub use fs::{File, IoFuture};
pub use geometry::{DeviceKind, Geometry};
pub use info::{describe, file_len_bytes, write_refusal, zram_name};
pub use op::{IoFlags, IoOp, OpKind, MAX_RW_BYTES};
pub use path_kind::{check_path_kind, PathKind};
pub use ring::{
    BatchWaitTimer, RingConfig, RingInfo, RingStats, BATCH_WAITS_BOUNDED, BATCH_WAIT_UNTIMED,
    MAX_BATCH_WAIT, MAX_CQ_ENTRIES, MAX_SQ_ENTRIES, MIN_SQPOLL_SQ_ENTRIES,
};

//! plugio-fio: a fio external ioengine backed by plugio.
//!
//! fio loads `libplugio_fio.so` with `ioengine=external:PATH`; its hooks
//! (`c/plugio_fio.c`, a C shim compiled against the headers of the fio that
//! runs it) call this crate through the C ABI in [`ffi`]. Each fio job
//! thread gets one plugio core ([`FioCore`]): a `LocalExecutor` with an
//! io_uring `DeviceDriver`, driven one tick at a time by the hooks:
//!
//! ```text
//! fio hook               FioCore                     plugio
//! init                   FioCore::new                arena sized for the io_u memory,
//!                                                    ring + executor (runtime::local)
//! iomem_alloc            FioCore::iomem_alloc        the registered arena chunk
//! open_file              FioCore::open               Device::open (direct=, read-only)
//! queue                  FioCore::queue              the IO joins the core's queue
//! commit                 FioCore::commit             the queued IOs' first polls, with the
//!                                                    core entered once (LocalExecutor::
//!                                                    enter): their bios join the plug; then
//!                                                    LocalExecutor::run_once: the tick hook
//!                                                    flushes the plug, one io_uring_enter
//!                                                    submits the batch and collects the
//!                                                    completions there
//! getevents(min,max,t)   FioCore::getevents          polls the woken IOs; run_once_timeout
//!                                                    only until `min` completions or the
//!                                                    timeout
//! event                  (C: the events array)       io_u->error / io_u->resid
//! close_file, cleanup    FioCore::close, drop        the device, then the executor
//! ```
//!
//! Built without fio's headers (no `FIO_SRC` at build time, as in
//! `cargo test --workspace`), the library has no C shim and exports no
//! `get_ioengine`: its Rust side is built and tested, but fio cannot load
//! it. `benches/fio-engine/build.sh` builds fio from Debian's source and
//! the engine against that tree.
//!
//! # Invariants
//!
//! - One [`FioCore`] per fio job thread; every call into it comes from that
//!   thread (fio's `FIO_NO_OFFLOAD`: hooks never run on another thread).
//! - An io_u's memory is the kernel's from the tick that issues its IO until
//!   `getevents` returns its completion; the core never touches it after
//!   that, and fio does not touch it before.
//! - Every queued IO completes exactly once, through `getevents`, with its
//!   byte count or a negative errno (plugio's error, mapped by
//!   `plugio::Error::errno`).
//! - The io_u memory is released only when nothing of this core is in
//!   flight (`iomem_free` and drop drive the executor until then).

pub mod config;
mod core;
pub mod ffi;
mod slots;

pub use crate::config::EngineConfig;
pub use crate::core::{Access, Completion, DevId, FioCore, NoSuchDevice, Op};

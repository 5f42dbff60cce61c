//! `plugio replay`: real database IO traces replayed through the engine and
//! compared.
//!
//! A trace (the shared traces' CSV, fio's iolog v2/v3, or blkparse text,
//! plain or zstd) is read by [`load`] with one parser per format into
//! [`TraceIo`]s (the model is [`trace`]), checked against the target ([`target`]), and
//! replayed by [`replay`] ([`dispatch`]) at its recorded times or as fast
//! as possible ([`timing`]). Writes carry bytes derived from (sector,
//! write index) ([`pattern`]) so [`verify`] can tell, for every sector,
//! whether it holds its last write. [`report`] holds the figures; [`cli`]
//! the command.
//!
//! ```no_run
//! use plugio_cli::replay::{self, ReplayOptions, Timing};
//! use plugio::{Device, DeviceOptions, RingConfig};
//!
//! let trace = replay::load::load("q.csv.zst".as_ref(), &Default::default())?;
//! let ex = plugio::runtime::local(RingConfig::default())?;
//! let report = ex.run(async {
//!     let dev = Device::open("scratch.img", DeviceOptions::default())?;
//!     let opts = ReplayOptions { timing: Timing::None, verify: true, ..Default::default() };
//!     Ok::<_, Box<dyn std::error::Error>>(replay::replay(&dev, &trace.ios, &opts).await?)
//! })?;
//! println!("{}", report.to_text());
//! # Ok::<_, Box<dyn std::error::Error>>(())
//! ```
//!
//! Invariants:
//! - A trace is parsed completely (up to `--limit`) before anything is
//!   replayed: a malformed line stops the command with its line number and
//!   no IO done.
//! - Every IO is checked against the target (extent, alignment) before the
//!   first is issued.
//! - Per sector, IOs take effect in trace order: an IO is never in flight
//!   with, nor issued ahead of, an earlier overlapping IO where either
//!   modifies data; flushes are barriers unless asked otherwise (see
//!   [`dispatch`]). So the result of a replay is deterministic and
//!   verifiable whatever the device's completion order.
//! - Every issued IO has completed when [`replay`] returns.

pub mod cli;
pub mod dispatch;
pub mod error;
pub mod latency;
pub mod load;
mod parse_blkparse;
mod parse_csv;
mod parse_iolog;
pub mod pattern;
pub mod report;
pub mod target;
pub mod timing;
pub mod trace;
pub mod verify;

pub use dispatch::{replay, ReplayOptions};
pub use error::ReplayError;
pub use report::ReplayReport;
pub use timing::Timing;
pub use trace::{BlkAction, Trace, TraceFormat, TraceIo, TraceOp};
pub use verify::Unwritten;

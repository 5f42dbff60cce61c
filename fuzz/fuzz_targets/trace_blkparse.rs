//! The blkparse trace parser never panics and keeps the trace invariants
//! (see `trace_common.rs`).

#![no_main]

mod trace_common;

use libfuzzer_sys::fuzz_target;
use plugio_cli::replay::trace::TraceFormat;

fuzz_target!(|data: &[u8]| trace_common::check(data, TraceFormat::Blkparse));

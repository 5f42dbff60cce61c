//! The library half of the `plugio` command (the unpublished `plugio-cli`
//! crate): [`replay`], IO traces replayed through the engine. The command
//! itself (`bench`, `info`, `replay`) is `src/main.rs`.
//!
//! Invariants: nothing here is part of the `plugio` library a database
//! depends on; `tests/deps.rs` checks that the library's dependency tree
//! names none of this crate's tools (clap, plotters, zstd, the peers).

pub mod replay;

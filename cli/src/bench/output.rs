//! What a run hands back to the report: the engine's output when its
//! workers stopped ([`EngineOutput`]) and why a run stopped early
//! ([`StopReason`]). Below every engine and the report, above only
//! `stats` (the latencies' type).
//!
//! Invariants: the latencies are of completed IOs only, in ns; a note says
//! what the engine could not do as asked, never a figure.

use super::stats::Latencies;

/// What an engine hands back when its workers have stopped.
#[derive(Debug)]
pub struct EngineOutput {
    /// Sampled IO latencies in ns by direction, all workers merged.
    pub latency: Latencies,
    /// Things the run could not do as asked (printed and put in the JSON).
    pub notes: Vec<String>,
    /// Final iostats (plugio engines).
    pub iostats: Option<plugio_engine::IoStats>,
}

/// Why a run stopped before its runtime or IO count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGALRM, SIGUSR1, SIGUSR2 or SIGXCPU.
    Signal(nix::sys::signal::Signal),
    /// A write to standard output failed: it was closed.
    StdoutClosed,
}

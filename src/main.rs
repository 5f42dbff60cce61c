//! The `plugio` command: `plugio bench` (the main job: an IO benchmark on
//! a temporary file by default, with fio's option names and baselines in
//! the same binary), `plugio info PATH` (device geometry and io_uring
//! features), and the hidden `plugio compare-report` used by
//! `benches/compare.sh`.
//!
//! Invariants: bad input exits with code 2 and a message that says what to
//! change; a failed run exits with 1; no path panics on user input.

mod bench;

#[global_allocator]
static GLOBAL: bench::alloc_count::CountingAlloc = bench::alloc_count::CountingAlloc;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// plugio: a thread-per-core async storage IO runtime with a userspace
/// block layer in front of io_uring.
#[derive(Debug, Parser)]
#[command(name = "plugio", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run an IO benchmark (default: 4 KiB O_DIRECT random reads at queue
    /// depth 128 on one core for 10 s, on a 1 GiB temporary file).
    /// A repeated option takes its last value.
    #[command(args_override_self = true)]
    Bench(bench::BenchArgs),
    /// Describe a file or block device (geometry, O_DIRECT, io_uring).
    Info {
        /// The file or block device.
        path: PathBuf,
    },
    /// Build the peer-comparison table and plots from JSON results
    /// (benches/compare.sh runs this).
    #[command(hide = true)]
    CompareReport(bench::compare::CompareArgs),
    /// Replay an IO trace (CSV, fio iolog, blkparse text; zstd or plain)
    /// onto a file or block device, with optional verification.
    Replay(plugio::replay::cli::ReplayArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let res = match cli.command {
        Command::Bench(args) => bench::main(args).map(|_| ()),
        Command::Info { path } => info(&path),
        Command::CompareReport(args) => bench::compare::main(&args),
        Command::Replay(args) => return plugio::replay::cli::main(args),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("plugio: error: {e}");
            ExitCode::from(e.exit_code() as u8)
        }
    }
}

fn info(path: &std::path::Path) -> Result<(), bench::BenchError> {
    if !path.exists() {
        return Err(bench::BenchError::MissingTarget {
            path: path.to_path_buf(),
        });
    }
    let text = plugio_device::describe(path)
        .map_err(|e| bench::BenchError::engine("info", format!("{}: {e}", path.display())))?;
    print!("{text}");
    if !text.ends_with('\n') {
        println!();
    }
    Ok(())
}

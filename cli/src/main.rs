//! The `plugio` command: `plugio bench` (the main job: an IO benchmark on
//! a temporary file by default, with fio's option names and baselines in
//! the same binary), `plugio info PATH` (device geometry and io_uring
//! features), and the hidden `plugio compare-report` used by
//! `benches/compare.sh`.
//!
//! Invariants: bad input exits with code 2 and a message that says what to
//! change; a failed run exits with 1; no path panics on user input; a
//! closed standard output, SIGINT or SIGTERM stops the work, removes what
//! the run created and ends the process by that signal (see [`signals`]).

mod bench;
mod signals;

#[global_allocator]
static GLOBAL: bench::alloc_count::CountingAlloc = bench::alloc_count::CountingAlloc;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use nix::sys::signal::Signal;
use plugio_cli::replay::ReplayError;
use plugio_device::ErrorKind;

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
    #[command(args_override_self = true, allow_negative_numbers = true)]
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
    #[command(allow_negative_numbers = true)]
    Replay(plugio_cli::replay::cli::ReplayArgs),
}

/// How a failed command ends: an exit code and its message, or the signal
/// that stopped it (raised again once the run has cleaned up).
enum Failure {
    Exit { code: u8, message: String },
    Signal(Signal),
}

impl From<bench::BenchError> for Failure {
    fn from(e: bench::BenchError) -> Self {
        match e {
            bench::BenchError::Interrupted(sig) => Failure::Signal(sig),
            bench::BenchError::StdoutClosed => Failure::Signal(Signal::SIGPIPE),
            e => Failure::Exit {
                code: e.exit_code() as u8,
                message: e.to_string(),
            },
        }
    }
}

impl From<ReplayError> for Failure {
    fn from(e: ReplayError) -> Self {
        match e {
            ReplayError::StdoutClosed => Failure::Signal(Signal::SIGPIPE),
            e => Failure::Exit {
                code: e.exit_code(),
                message: e.to_string(),
            },
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let res = match cli.command {
        Command::Bench(args) => bench::main(args).map(drop).map_err(Failure::from),
        Command::Info { path } => info(&path),
        Command::CompareReport(args) => bench::compare::main(&args).map_err(Failure::from),
        Command::Replay(args) => plugio_cli::replay::cli::main(args).map_err(Failure::from),
    };
    // Everything the command created (the bench's temporary file) was
    // dropped, so removed, by now.
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Exit { code, message }) => {
            eprintln!("plugio: error: {message}");
            ExitCode::from(code)
        }
        Err(Failure::Signal(sig)) => signals::die_of(sig),
    }
}

/// `plugio info PATH`.
fn info(path: &Path) -> Result<(), Failure> {
    let text = plugio_device::describe(path).map_err(|e| {
        let message = match e.kind() {
            ErrorKind::NotFound => format!(
                "{} does not exist: give the path of a file or block device",
                path.display()
            ),
            // The device error names the path once, at its end.
            _ => e.to_string(),
        };
        let code = match e.kind() {
            ErrorKind::NotFound | ErrorKind::InvalidInput(_) => 2,
            _ => 1,
        };
        Failure::Exit { code, message }
    })?;
    let mut out = std::io::stdout().lock();
    let written = out.write_all(text.as_bytes()).and_then(|()| {
        if text.ends_with('\n') {
            Ok(())
        } else {
            writeln!(out)
        }
    });
    match written.and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if signals::is_broken_pipe(&e) => Err(Failure::Signal(Signal::SIGPIPE)),
        Err(e) => Err(Failure::Exit {
            code: 1,
            message: format!("writing to standard output: {e}"),
        }),
    }
}

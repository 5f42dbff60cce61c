//! The `plugio` command: `plugio bench` (the main job: an IO benchmark on
//! a temporary file by default, with fio's option names and baselines in
//! the same binary), `plugio info PATH` (device geometry and io_uring
//! features), and the hidden `plugio compare-report` used by
//! `benches/compare.sh`.
//!
//! Invariants: bad input exits with code 2 and a message that says what to
//! change; a failed run exits with 1; no path panics on user input; a
//! closed standard output, SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGALRM, SIGUSR1, SIGUSR2 or SIGXCPU stops the work, removes what
//! the run created and ends the process by that signal (see [`signals`]).

mod bench;
mod info_json;
mod signals;

use info_json::info_json;

#[global_allocator]
static GLOBAL: bench::alloc_count::CountingAlloc = bench::alloc_count::CountingAlloc;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use nix::sys::signal::Signal;
use plugio_cli::json::{ErrorBody, ErrorDoc, RunMeta};
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
        /// Print one JSON object (the vocabulary of `bench --json`).
        #[arg(long)]
        json: bool,
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
    Exit {
        code: u8,
        message: String,
    },
    /// The process ends by the signal; `unreported` is the message of a
    /// run stopped before it printed anything (the `--json` error
    /// document carries it), `None` when its report was printed.
    Signal {
        sig: Signal,
        unreported: Option<String>,
    },
}

impl Failure {
    fn signal(sig: Signal) -> Self {
        Failure::Signal {
            sig,
            unreported: None,
        }
    }
}

impl From<bench::BenchError> for Failure {
    fn from(e: bench::BenchError) -> Self {
        match e {
            bench::BenchError::Interrupted(sig) => Failure::signal(sig),
            bench::BenchError::InterruptedBeforeRun(sig) => Failure::Signal {
                sig,
                unreported: Some(e.to_string()),
            },
            bench::BenchError::StdoutClosed => Failure::signal(Signal::SIGPIPE),
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
            ReplayError::StdoutClosed => Failure::signal(Signal::SIGPIPE),
            ReplayError::Interrupted => {
                Failure::signal(signals::interrupted().unwrap_or(Signal::SIGINT))
            }
            e => Failure::Exit {
                code: e.exit_code(),
                message: e.to_string(),
            },
        }
    }
}

fn main() -> ExitCode {
    init_tracing();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(&e),
    };
    let (name, json) = match &cli.command {
        Command::Bench(a) => ("bench", a.json),
        Command::Info { json, .. } => ("info", *json),
        Command::CompareReport(_) => ("compare-report", false),
        Command::Replay(a) => ("replay", a.json),
    };
    let res = match cli.command {
        Command::Bench(args) => bench::main(args).map(drop).map_err(Failure::from),
        Command::Info { path, json } => info(&path, json),
        Command::CompareReport(args) => bench::compare::main(&args).map_err(Failure::from),
        Command::Replay(mut args) => match signals::catch_interrupts() {
            Ok(()) => {
                args.stop = Some(|| signals::interrupted().is_some());
                args.created_target = Some(signals::remove_on_second_signal);
                plugio_cli::replay::cli::main(args).map_err(Failure::from)
            }
            Err(e) => Err(Failure::from(ReplayError::io(
                "catching SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGALRM, SIGUSR1, SIGUSR2 and SIGXCPU",
                e,
            ))),
        },
    };
    // Everything the command created (the bench's temporary file) was
    // dropped, so removed, by now.
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Exit { code, message }) => {
            eprintln!("plugio: error: {}", plugio_cli::shown::message(&message));
            if json {
                print_error_doc(name, code, &message);
            }
            ExitCode::from(code)
        }
        Err(Failure::Signal { sig, unreported }) => {
            // A signal before the run had figures (during the temporary
            // file's fill): a script reading standard output still gets
            // one object (it got none; found by a break-it helper).
            if let (true, Some(message)) = (json, unreported) {
                print_error_doc_of(name, "interrupted", 128 + sig as u8, &message);
            }
            signals::die_of(sig)
        }
    }
}

/// Installs a `tracing` subscriber on stderr: `RUST_LOG` when set, else
/// warnings and errors (the library's io_uring fallback and registration
/// warnings).
fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .try_init();
}

/// A command line clap refused: its message (and exit status 2), plus the
/// JSON error document when `--json` was on the line.
fn usage_error(e: &clap::Error) -> ExitCode {
    use clap::error::ErrorKind as K;
    let code = e.exit_code();
    if matches!(e.kind(), K::DisplayHelp | K::DisplayVersion) {
        let _ = e.print();
        return ExitCode::from(code as u8);
    }
    // Plain text with the offending value escaped (clap would write an
    // escape sequence in it to a terminal as it is, and strip it, with
    // any invisible character kept, elsewhere).
    eprint!("{}", plugio_cli::shown::message(&e.render().to_string()));
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--json") {
        let name = args.get(1).map_or("plugio", String::as_str);
        let rendered = e.render().to_string();
        let first = rendered.lines().next().unwrap_or("invalid command line");
        let message = first.trim_start_matches("error: ").to_owned();
        print_error_doc(name, code as u8, &message);
    }
    ExitCode::from(code as u8)
}

/// Prints the JSON document of a failed `--json` run on stdout (a closed
/// stdout is ignored: the exit status still tells).
fn print_error_doc(command: &str, code: u8, message: &str) {
    print_error_doc_of(
        command,
        if code == 2 { "usage" } else { "run" },
        code,
        message,
    );
}

/// [`print_error_doc`] with the error's `kind` given.
fn print_error_doc_of(command: &str, kind: &str, code: u8, message: &str) {
    let doc = ErrorDoc {
        meta: RunMeta::now(command),
        error: ErrorBody {
            kind: kind.to_owned(),
            message: message.to_owned(),
            exit_code: code,
        },
    };
    if let Ok(text) = serde_json::to_string(&doc) {
        let _ = writeln!(std::io::stdout(), "{text}");
    }
}

/// `plugio info PATH [--json]`.
fn info(path: &Path, json: bool) -> Result<(), Failure> {
    let described = if json {
        info_json(path).map(|doc| serde_json::to_string(&doc).unwrap_or_default())
    } else {
        plugio_device::describe(path)
    };
    let text = described.map_err(|e| {
        let message = match e.kind() {
            ErrorKind::NotFound => format!(
                "{} does not exist: give the path of a file or block device",
                plugio_cli::shown::path(path)
            ),
            ErrorKind::PermissionDenied => {
                format!(
                    "{e}: {}",
                    plugio_cli::permission_hint(nix::unistd::geteuid().is_root())
                )
            }
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
        Err(e) if signals::is_broken_pipe(&e) => Err(Failure::signal(Signal::SIGPIPE)),
        Err(e) => Err(Failure::Exit {
            code: 1,
            message: format!("writing to standard output: {e}"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use plugio_cli::permission_hint;

    #[test]
    fn a_refusal_of_root_does_not_say_to_run_as_root() {
        assert!(!permission_hint(true).contains("run as root"));
        assert!(permission_hint(true).contains("security module"));
        assert!(permission_hint(false).contains("run as root"));
    }
}

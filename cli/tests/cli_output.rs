//! Issue 15, "What users expect to see": the output of `bench`, `replay`
//! and `info` as a new user reads it. One JSON vocabulary (the common
//! fields, p90 beside p50/p99/p99.9, a JSON object even when the run
//! fails), `randrw` reported per direction as fio does, labelled
//! diskstats, `info --json`, and the io_uring fallback announced in text
//! and JSON (run under `book/tools/no-io-uring.py`'s seccomp filter).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn plugio(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_plugio"))
        .args(args)
        .output()
        .expect("the plugio binary runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn json(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("bad JSON ({e}): {}", text(&o.stdout)))
}

/// The fields every JSON document opens with.
fn check_meta(v: &Value, command: &str) {
    assert_eq!(v["schema_version"], 1, "{v}");
    assert_eq!(v["command"], command, "{v}");
    assert_eq!(v["plugio_version"], env!("CARGO_PKG_VERSION"));
    assert!(v["kernel"].as_str().is_some_and(|k| !k.is_empty()), "{v}");
    assert!(v["machine"]["cpus"].as_u64().is_some_and(|c| c >= 1), "{v}");
    assert!(v["machine"]["arch"].is_string(), "{v}");
}

/// p50 <= p90 <= p99 <= p99.9 <= max, all present.
fn check_latency(l: &Value) {
    let get = |k: &str| {
        l[k].as_u64()
            .unwrap_or_else(|| panic!("{k} missing in {l}"))
    };
    let order = ["p50_ns", "p90_ns", "p99_ns", "p999_ns", "max_ns"].map(get);
    assert!(order.windows(2).all(|w| w[0] <= w[1]), "{l}");
}

fn small_bench(extra: &[&str]) -> Output {
    let mut args = vec!["bench", "--runtime", "0.5", "--size", "16M", "--quiet"];
    args.extend_from_slice(extra);
    plugio(&args)
}

#[test]
fn randrw_reports_reads_and_writes_apart_in_json() {
    let o = small_bench(&["--rw", "randrw", "--json"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v = json(&o);
    check_meta(&v, "bench");
    let (r, w) = (&v["read"], &v["write"]);
    let ios = |d: &Value| d["ios"].as_u64().expect("ios");
    assert!(ios(r) > 0 && ios(w) > 0, "a 50/50 mix did both: {v}");
    assert_eq!(ios(r) + ios(w), v["ios"].as_u64().expect("ios"));
    let bytes = |d: &Value| d["bytes"].as_u64().expect("bytes");
    assert_eq!(bytes(r) + bytes(w), v["bytes"].as_u64().expect("bytes"));
    for d in [r, w, &v] {
        check_latency(&d["latency"]);
    }
    assert!(r["iops"].as_f64().is_some_and(|x| x > 0.0));
}

#[test]
fn json_splits_cpu_time_into_user_and_system() {
    let o = small_bench(&["--json"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v = json(&o);
    let f = |k: &str| {
        v[k].as_f64()
            .unwrap_or_else(|| panic!("{k} is not a number: {v}"))
    };
    let (total, user, system) = (
        f("cpu_ns_per_io"),
        f("cpu_user_ns_per_io"),
        f("cpu_system_ns_per_io"),
    );
    assert!(user >= 0.0 && system >= 0.0, "{v}");
    // One getrusage reading, split: the parts add up to the total (up to
    // the rounding of each division).
    assert!(
        (user + system - total).abs() <= 1.0 + total * 1e-9,
        "user {user} + system {system} != total {total}"
    );
}

#[test]
fn a_read_job_has_no_writes_and_text_shows_one_summary() {
    let o = small_bench(&["--rw", "randread", "--json"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v = json(&o);
    assert_eq!(v["write"]["ios"], 0);
    assert_eq!(v["read"]["ios"], v["ios"]);
    // Text: per-direction lines only for a mixed job.
    let o = small_bench(&[]);
    let out = text(&o.stdout);
    assert!(!out.contains("  read: "), "{out}");
    let o = small_bench(&["--rw", "randrw"]);
    let out = text(&o.stdout);
    for needle in ["  read: IOPS=", "  write: IOPS=", "p90="] {
        assert!(out.contains(needle), "{needle} missing in:\n{out}");
    }
}

#[test]
fn text_labels_diskstats_and_explains_ios_per_call() {
    let o = small_bench(&[]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    let disk = out
        .lines()
        .find(|l| l.trim_start().starts_with("diskstats:"))
        .unwrap_or_else(|| panic!("no diskstats line in:\n{out}"));
    assert!(
        disk.contains("reads=") && disk.contains("sectors_read="),
        "{disk}"
    );
    let ring = out
        .lines()
        .find(|l| l.contains("IOS/call="))
        .unwrap_or_else(|| panic!("no ring line in:\n{out}"));
    assert!(ring.contains("per io_uring_enter"), "{ring}");
}

#[test]
fn a_failed_json_run_still_prints_one_json_object() {
    // Bad input: exit 2, `usage`.
    let o = plugio(&["bench", "--json", "--bs", "3", "--size", "16M"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    let v = json(&o);
    check_meta(&v, "bench");
    assert_eq!(v["error"]["kind"], "usage");
    assert_eq!(v["error"]["exit_code"], 2);
    assert!(v["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("--bs")));
    // An option clap refuses.
    let o = plugio(&["replay", "--json", "--no-such-option"]);
    assert_eq!(o.status.code(), Some(2));
    let v = json(&o);
    check_meta(&v, "replay");
    assert!(v["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("--no-such-option")));
    // A run that fails: the target cannot be opened.
    let o = plugio(&["info", "--json", "/nonexistent/plugio"]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(json(&o)["error"]["exit_code"], 2);
}

#[test]
fn info_json_describes_geometry_and_ring() {
    let f = tempfile::NamedTempFile::new_in(std::env::temp_dir()).expect("tmp");
    std::fs::write(f.path(), vec![0u8; 65536]).expect("write");
    let o = plugio(&["info", "--json", f.path().to_str().expect("utf-8")]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v = json(&o);
    check_meta(&v, "info");
    // The shared fields first, in the order bench.md gives, as for bench
    // and replay.
    assert!(
        text(&o.stdout).starts_with(r#"{"schema_version":1,"command":"info","plugio_version":"#),
        "{}",
        text(&o.stdout)
    );
    assert_eq!(v["geometry"]["kind"], "file");
    assert_eq!(v["writable"], true, "{v}");
    assert!(v["write_refusal"].is_null(), "{v}");
    // A file's length (its capacity is "grows"): found missing by a
    // fresh user.
    assert_eq!(v["size_bytes"], 65536, "{v}");
    assert!(v["geometry"]["logical_block_bytes"]
        .as_u64()
        .is_some_and(|b| b >= 512));
    let ring = &v["io_uring"];
    assert!(ring["available"].is_boolean(), "{v}");
    if ring["available"] == true {
        assert!(ring["supported_ops"]
            .as_array()
            .is_some_and(|a| !a.is_empty()));
    }
}

/// `info` says why a target is not writable: here a file whose mode
/// refuses this user (run as nobody where setpriv can, since root passes
/// every mode check).
#[test]
fn info_says_a_file_this_user_may_not_write_is_not_writable() {
    use std::os::unix::fs::PermissionsExt;
    let f = tempfile::NamedTempFile::new_in(std::env::temp_dir()).expect("tmp");
    std::fs::write(f.path(), vec![0u8; 4096]).expect("write");
    std::fs::set_permissions(f.path(), std::fs::Permissions::from_mode(0o444)).expect("chmod");
    let path = f.path().to_str().expect("utf-8");
    let o = Command::new("setpriv")
        .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_plugio"))
        .args(["info", "--json", path])
        .output();
    match o {
        Ok(o) if o.status.code() != Some(127) && !text(&o.stderr).contains("setpriv:") => {
            assert!(o.status.success(), "{}", text(&o.stderr));
            let v = json(&o);
            assert_eq!(v["writable"], false, "{v}");
            assert_eq!(
                v["write_refusal"], "this user may not write it (its permission bits)",
                "{v}"
            );
        }
        _ => eprintln!("SKIP: setpriv cannot run plugio as nobody here"),
    }
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn replay_json_speaks_the_same_vocabulary() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("dir");
    let target = dir.path().join("t.img");
    let trace = repo().join("cli/tests/data/replay/small.csv");
    let o = plugio(&[
        "replay",
        trace.to_str().expect("utf-8"),
        "--filename",
        target.to_str().expect("utf-8"),
        "--json",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v = json(&o);
    check_meta(&v, "replay");
    let ops = v["ops"].as_array().expect("ops");
    for op in ops.iter().filter(|op| op["ios"].as_u64().unwrap_or(0) > 0) {
        check_latency(&op["latency"]);
        assert_eq!(op["latency"]["sample_every"], 1);
    }
    assert!(v["notes"].is_array());
}

/// Runs the command with io_uring_setup refused (EPERM), as a container's
/// seccomp profile does; `None` where the filter cannot be installed here.
fn without_io_uring(args: &[&str]) -> Option<Output> {
    let tool = repo().join("book/tools/no-io-uring.py");
    let o = Command::new("python3")
        .arg(&tool)
        .arg(env!("CARGO_BIN_EXE_plugio"))
        .args(args)
        .output()
        .ok()?;
    let err = text(&o.stderr);
    if err.contains("seccomp") && err.contains("not supported") {
        return None;
    }
    Some(o)
}

#[test]
fn the_io_uring_fallback_is_announced_in_text_and_json() {
    let Some(o) = without_io_uring(&["bench", "--runtime", "0.3", "--size", "16M", "--json"])
    else {
        eprintln!("skipped: seccomp filters cannot be installed here");
        return;
    };
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v = json(&o);
    let notes = v["notes"].as_array().expect("notes");
    assert!(
        notes
            .iter()
            .any(|n| n.as_str().is_some_and(|n| n.contains("sync thread pool"))),
        "no fallback note in {notes:?}"
    );
    let err = text(&o.stderr);
    assert!(err.contains("note: io_uring was refused"), "{err}");
    // The library's own warning reaches the user through the subscriber.
    assert!(err.contains("io_uring unavailable"), "{err}");
    // Replay too.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("dir");
    let target = dir.path().join("t.img");
    let trace = repo().join("cli/tests/data/replay/small.csv");
    let o = without_io_uring(&[
        "replay",
        trace.to_str().expect("utf-8"),
        "--filename",
        target.to_str().expect("utf-8"),
        "--json",
    ])
    .expect("the filter worked above");
    assert!(o.status.success(), "{}", text(&o.stderr));
    let notes = json(&o)["notes"].clone();
    assert!(notes.to_string().contains("sync thread pool"), "{notes}");
}

//! End-to-end tests of the io_uring runtimes the bench compares against
//! (`--engine monoio`, `tokio-uring`, `compio`; the `peers` feature, on by
//! default): each runs a 1-second job on a file and reports IOPS, writes
//! and buffered IO run too, and what a runtime cannot do as asked
//! (registered buffers or files) is named in its notes, on stderr and in
//! the JSON.

#![cfg(feature = "peers")]

use std::process::{Command, Output};

use serde_json::Value;

const PEERS: [&str; 3] = ["monoio", "tokio-uring", "compio"];

fn plugio(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_plugio"))
        .args(args)
        .output()
        .expect("the plugio binary runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs a JSON bench on a 16 MiB temporary file; returns the result and
/// stderr.
fn bench_json(extra: &[&str]) -> (Value, String) {
    let mut args = vec!["bench", "--size", "16M", "--json", "--quiet"];
    args.extend_from_slice(extra);
    let o = plugio(&args);
    assert!(o.status.success(), "plugio {args:?} failed: {}", stderr(&o));
    let v = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("bad JSON ({e}): {}", String::from_utf8_lossy(&o.stdout)));
    (v, stderr(&o))
}

fn u(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} missing in {v}"))
}

/// The checks every data run must pass.
fn check_data_run(v: &Value, engine: &str) {
    assert_eq!(v["engine"], engine);
    let (ios, bytes, bs) = (u(v, "ios"), u(v, "bytes"), u(v, "bs"));
    assert!(ios > 0, "{engine}: no IO completed: {v}");
    assert_eq!(bytes, ios * bs, "{engine}: bytes != ios * bs");
    assert!(v["iops"].as_f64().is_some_and(|x| x > 0.0), "{v}");
    let lat = &v["latency"];
    assert!(u(lat, "samples") > 0, "{engine}: no latency samples");
    assert!(u(lat, "p50_ns") <= u(lat, "p99_ns") && u(lat, "p99_ns") <= u(lat, "max_ns"));
}

fn notes(v: &Value) -> Vec<String> {
    v["notes"]
        .as_array()
        .unwrap_or_else(|| panic!("notes missing in {v}"))
        .iter()
        .map(|n| n.as_str().expect("a note is a string").to_owned())
        .collect()
}

#[test]
fn each_peer_runs_a_one_second_direct_job_and_reports_iops() {
    for engine in PEERS {
        let (v, _) = bench_json(&["--engine", engine, "--iodepth", "16", "--runtime", "1"]);
        check_data_run(&v, engine);
        assert_eq!(v["direct"], true, "{v}");
        assert_eq!(u(&v, "iodepth"), 16);
        assert!(
            v["runtime_s"].as_f64().is_some_and(|s| s >= 1.0),
            "{engine} ran the whole second: {v}"
        );
    }
}

#[test]
fn peers_say_which_registered_resources_they_cannot_use() {
    // The defaults ask for registered buffers and files.
    let (v, err) = bench_json(&["--engine", "monoio", "--iodepth", "4", "--runtime", "0.3"]);
    let n = notes(&v);
    assert_eq!(n.len(), 2, "{n:?}");
    assert!(n[0].contains("--fixedbufs 1 not honoured"), "{n:?}");
    assert!(n[1].contains("--registerfiles 1 not honoured"), "{n:?}");
    assert!(
        err.contains("note: monoio: no registered (fixed) buffers"),
        "{err}"
    );

    // tokio-uring has registered buffers (read_fixed_at), not files.
    let (v, _) = bench_json(&[
        "--engine",
        "tokio-uring",
        "--iodepth",
        "4",
        "--runtime",
        "0.3",
    ]);
    let n = notes(&v);
    assert_eq!(n.len(), 1, "{n:?}");
    assert!(n[0].contains("--registerfiles 1 not honoured"), "{n:?}");

    let (v, _) = bench_json(&["--engine", "compio", "--iodepth", "4", "--runtime", "0.3"]);
    assert_eq!(notes(&v).len(), 2, "{v}");

    // Asking for neither: nothing to say.
    for engine in PEERS {
        let (v, err) = bench_json(&[
            "--engine",
            engine,
            "--iodepth",
            "4",
            "--runtime",
            "0.3",
            "--fixedbufs",
            "0",
            "--registerfiles",
            "0",
        ]);
        check_data_run(&v, engine);
        assert!(notes(&v).is_empty(), "{engine}: {v}");
        assert!(!err.contains("note:"), "{engine}: {err}");
    }
}

#[test]
fn peers_write_and_run_buffered() {
    for engine in PEERS {
        let (v, _) = bench_json(&[
            "--engine",
            engine,
            "--rw",
            "randrw",
            "--iodepth",
            "8",
            "--runtime",
            "0.3",
        ]);
        check_data_run(&v, engine);
        let (v, _) = bench_json(&[
            "--engine",
            engine,
            "--rw",
            "read",
            "--direct",
            "0",
            "--iodepth",
            "8",
            "--runtime",
            "0.3",
        ]);
        check_data_run(&v, engine);
        assert_eq!(v["direct"], false);
    }
}

#[test]
fn number_ios_stops_each_peer_job_after_exactly_that_many() {
    for engine in PEERS {
        let (v, _) = bench_json(&[
            "--engine",
            engine,
            "--iodepth",
            "8",
            "--numjobs",
            "2",
            "--number_ios",
            "500",
            "--runtime",
            "30",
        ]);
        check_data_run(&v, engine);
        assert_eq!(u(&v, "ios"), 1000, "{engine}: {v}");
    }
}

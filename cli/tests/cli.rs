//! End-to-end tests of the `plugio` command: short benches with every
//! engine (JSON checked for consistency), bad input (exit code 2 and a
//! message that says what to change), `plugio info`, and the comparison
//! report. Each bench runs for a fraction of a second on a 16 MiB file.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

fn plugio(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_plugio"))
        .args(args)
        .output()
        .expect("the plugio binary runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs a short JSON bench and returns the parsed result.
fn bench_json(extra: &[&str]) -> Value {
    let mut args = vec!["bench", "--runtime", "0.5", "--json", "--quiet"];
    // A NOP job takes no --size.
    if !extra.iter().any(|a| *a == "nop" || *a == "--nop") {
        args.extend_from_slice(&["--size", "16M"]);
    }
    args.extend_from_slice(extra);
    let o = plugio(&args);
    assert!(o.status.success(), "plugio {args:?} failed: {}", stderr(&o));
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("bad JSON ({e}): {}", String::from_utf8_lossy(&o.stdout)))
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
    assert!(v["iops"].as_f64().is_some_and(|x| x > 0.0));
    let lat = &v["latency"];
    assert!(u(lat, "samples") > 0, "{engine}: no latency samples");
    assert!(u(lat, "p50_ns") <= u(lat, "p99_ns") && u(lat, "p99_ns") <= u(lat, "max_ns"));
}

#[test]
fn default_engine_short_run_gives_consistent_json() {
    let v = bench_json(&["--runtime", "1"]);
    check_data_run(&v, "plugio");
    assert_eq!(u(&v, "bs"), 4096);
    assert_eq!(u(&v, "iodepth"), 128);
    assert_eq!(u(&v, "size_bytes"), 16 << 20);
    assert_eq!(v["direct"], true);
    assert!(
        v["plug"]["reap_per_call"].as_f64().is_some(),
        "plugio reports IOS/call: {v}"
    );
    assert!(v["plug"]["tags_per_batch"].as_f64().is_some());
    assert!(v["plug"]["diskstats"].is_string());
}

#[test]
fn text_output_has_per_second_lines_and_percentiles() {
    let o = plugio(&[
        "bench",
        "--runtime",
        "1.2",
        "--size",
        "16M",
        "--iodepth",
        "16",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("[  1s] IOPS="), "{out}");
    assert!(out.contains("MiB/s, IOS/call="), "{out}");
    assert!(
        out.contains("p50=") && out.contains("p99=") && out.contains("p99.9="),
        "{out}"
    );
    assert!(out.contains("plug: merges="), "{out}");
}

#[test]
fn every_data_engine_runs_briefly() {
    for engine in ["raw", "tokio", "psync"] {
        let v = bench_json(&["--engine", engine, "--iodepth", "8"]);
        check_data_run(&v, engine);
    }
}

#[test]
fn glommio_runs_or_names_the_memlock_limit() {
    let args = [
        "bench",
        "--engine",
        "glommio",
        "--iodepth",
        "8",
        "--runtime",
        "0.5",
        "--size",
        "16M",
        "--json",
        "--quiet",
    ];
    let o = plugio(&args);
    if o.status.success() {
        let v: Value = serde_json::from_slice(&o.stdout).expect("JSON");
        check_data_run(&v, "glommio");
    } else {
        // Only an unraisable memlock limit may stop glommio, with exit 1
        // and a message saying what to do.
        assert_eq!(o.status.code(), Some(1));
        assert!(stderr(&o).contains("RLIMIT_MEMLOCK"), "{}", stderr(&o));
    }
}

#[test]
fn nop_engines_run_without_data() {
    let v = bench_json(&["--engine", "nop", "--iodepth", "32"]);
    assert_eq!(v["engine"], "nop");
    assert!(u(&v, "ios") > 0 && u(&v, "bytes") == 0);
    let v = bench_json(&["--engine", "raw", "--nop", "--iodepth", "32"]);
    assert_eq!(
        (v["engine"].as_str(), v["nop"].as_bool()),
        (Some("raw"), Some(true))
    );
    assert!(u(&v, "ios") > 0);
    assert_eq!(v["filename"], Value::Null);
}

#[test]
fn number_ios_stops_each_job_after_exactly_that_many_ios() {
    // A runtime far longer than the IOs take: the IO count ends the run.
    for extra in [&["--engine", "nop"][..], &["--engine", "raw", "--nop"][..]] {
        let mut args = vec!["--number_ios", "1000", "--runtime", "600"];
        args.extend_from_slice(extra);
        let v = bench_json(&args);
        assert_eq!(u(&v, "ios"), 1000, "{extra:?}: {v}");
        assert_eq!(u(&v, "number_ios"), 1000);
    }
    // Per job, for a data engine too (1000 is not a multiple of the depth).
    let v = bench_json(&[
        "--number_ios",
        "1000",
        "--runtime",
        "600",
        "--numjobs",
        "2",
        "--iodepth",
        "48",
    ]);
    check_data_run(&v, "plugio");
    assert_eq!(u(&v, "ios"), 2000, "{v}");
}

#[test]
fn idle_wait_futex_runs_the_same_job() {
    // The wait valgrind can follow: same IO count, and the run ends (the
    // core is woken out of its idle futex wait for the tasks and for
    // shutdown).
    for engine in ["nop", "plugio"] {
        let v = bench_json(&[
            "--engine",
            engine,
            "--idle-wait",
            "futex",
            "--number_ios",
            "500",
            "--runtime",
            "600",
        ]);
        assert_eq!(u(&v, "ios"), 500, "{engine}: {v}");
        assert_eq!(v["idle_wait"], "futex");
    }
    // `auto` (the default) is `ring`, and `futex` when valgrind's preload
    // library is in LD_PRELOAD (a missing one: ld.so warns and goes on).
    let v = bench_json(&["--engine", "nop", "--number_ios", "500"]);
    assert_eq!(v["idle_wait"], "ring");
    let o = Command::new(env!("CARGO_BIN_EXE_plugio"))
        .args([
            "bench",
            "--engine",
            "nop",
            "--number_ios",
            "500",
            "--json",
            "--quiet",
        ])
        .env("LD_PRELOAD", "/nonexistent/vgpreload_core-amd64-linux.so")
        .output()
        .expect("the plugio binary runs");
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).expect("JSON result");
    assert_eq!(v["idle_wait"], "futex", "{v}");
}

#[test]
fn writes_and_mixed_patterns_run() {
    let v = bench_json(&["--rw", "randrw", "--rwmixread", "70", "--iodepth", "16"]);
    check_data_run(&v, "plugio");
    assert_eq!(u(&v, "rwmixread"), 70);
    let v = bench_json(&["--rw", "write", "--iodepth", "16", "--engine", "raw"]);
    check_data_run(&v, "raw");
}

#[test]
fn sequential_reads_merge_unless_nomerges_2() {
    let merged = bench_json(&["--rw", "read", "--iodepth", "32"]);
    check_data_run(&merged, "plugio");
    assert!(
        u(&merged["plug"], "merges") > 0,
        "no merges: {}",
        merged["plug"]
    );
    let unmerged = bench_json(&["--rw", "read", "--iodepth", "32", "--nomerges", "2"]);
    check_data_run(&unmerged, "plugio");
    assert_eq!(u(&unmerged["plug"], "merges"), 0);
}

#[test]
fn ablations_switch_the_engine_mechanisms_off() {
    // A fixed IO count, not a runtime: the run's setup allocates a few
    // hundred times whatever the load, so over a fixed 20000 IOs the
    // figure is the same on an idle and on a loaded machine (over 0.5 s, a
    // loaded machine did fewer IOs and the setup weighed more per IO).
    let fixed = [
        "--number_ios",
        "20000",
        "--runtime",
        "600",
        "--iodepth",
        "16",
    ];
    let mut args = vec!["--ablate", "tag-batch", "--ablate", "bio-cache"];
    args.extend_from_slice(&fixed);
    let v = bench_json(&args);
    check_data_run(&v, "plugio");
    assert_eq!(u(&v, "ios"), 20000);
    assert_eq!(v["notes"], serde_json::json!([]), "every ablation applies");
    assert_eq!(v["ablate"], serde_json::json!(["tag-batch", "bio-cache"]));
    // Without the bio cache each IO allocates its bio.
    let allocs = v["allocs_per_io"].as_f64().expect("allocs_per_io");
    assert!(
        allocs >= 0.9,
        "allocations per IO without the bio cache: {allocs}"
    );
    let cached = bench_json(&fixed);
    assert_eq!(u(&cached, "ios"), 20000);
    let allocs = cached["allocs_per_io"].as_f64().expect("allocs_per_io");
    assert!(allocs < 0.1, "allocations per IO with the caches: {allocs}");
}

/// Asserts exit code 2, a message containing `needle`, and no panic.
fn assert_bad_input(args: &[&str], needle: &str) {
    let o = plugio(args);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
    assert!(
        err.contains(needle),
        "{args:?}: expected '{needle}' in: {err}"
    );
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
}

#[test]
fn bad_input_exits_2_with_a_hint() {
    assert_bad_input(
        &["bench", "--filename", "/nonexistent/plugio"],
        "does not exist",
    );
    assert_bad_input(&["bench", "--iodepth", "0"], "--iodepth 0 is out of range");
    assert_bad_input(&["bench", "--numjobs", "0"], "--numjobs (or --cpus) 0");
    assert_bad_input(
        &["bench", "--numjobs", "3", "--cpus", "0"],
        "--numjobs (or --cpus) 0",
    );
    // Refused by the target's checks: no warning about the job's --size
    // (a run that never happens) comes before the refusal.
    let args = ["bench", "--bs", "1000", "--size", "16M"];
    assert_bad_input(&args, "not a multiple of the target's logical block size");
    assert!(!stderr(&plugio(&args)).contains("warning"));
    assert_bad_input(&["bench", "--bs", "4q"], "unknown size suffix");
    assert_bad_input(&["bench", "--nop"], "--engine raw");
    // The options of plugio's own path with another engine (a raw run's
    // JSON claimed an ablation that did not happen).
    assert_bad_input(
        &["bench", "--engine", "raw", "--ablate", "plug"],
        "--ablate sets plugio's own path (--engine plugio or nop), which --engine raw",
    );
    assert_bad_input(
        &[
            "bench",
            "--engine",
            "psync",
            "--nomerges",
            "2",
            "--idle-wait",
            "futex",
        ],
        "--nomerges, --idle-wait set plugio's own path",
    );
    assert_bad_input(
        &["bench", "--rw", "randrw", "--rwmixread", "101"],
        "--rwmixread 101",
    );
    assert_bad_input(
        &["bench", "--rwmixread", "70"],
        "--rwmixread 70 applies only to --rw randrw",
    );
    assert_bad_input(&["bench", "--size", "1000"], "smaller than one block");
    assert_bad_input(
        &["bench", "--engine", "nop", "--size", "16M"],
        "NOPs move no data and touch no range of the target: drop --size",
    );
    assert_bad_input(
        &["bench", "--engine", "raw", "--nop", "--size", "16M"],
        "drop --size",
    );
    assert_bad_input(&["bench", "--runtime", "2x"], "use seconds");
    assert_bad_input(&["bench", "--direct", "2"], "--direct");
    assert_bad_input(&["bench", "--number_ios", "0"], "--number_ios 0");

    let dir = tempfile::tempdir().expect("tempdir");
    let small = dir.path().join("small");
    std::fs::write(&small, vec![7u8; 8192]).expect("write");
    let small = small.to_str().expect("utf-8 path");
    assert_bad_input(
        &["bench", "--filename", small, "--size", "1M"],
        "lower --size",
    );
    assert_bad_input(
        &["bench", "--filename", small, "--bs", "1000"],
        "not a multiple",
    );
}

/// True when `path` can be opened with O_DIRECT.
fn accepts_o_direct(path: &Path) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .is_ok()
}

#[test]
fn tmpfs_target_runs_buffered_and_direct_as_the_kernel_allows() {
    let shm = Path::new("/dev/shm");
    if !shm.is_dir() {
        eprintln!("no /dev/shm: nothing to check");
        return;
    }
    let f = tempfile::NamedTempFile::new_in(shm).expect("tmpfs file");
    std::fs::write(f.path(), vec![0u8; 1 << 20]).expect("write");
    let p = f.path().to_str().expect("utf-8 path");
    if accepts_o_direct(f.path()) {
        // tmpfs takes O_DIRECT since Linux 6.6: the direct run must work.
        let v = bench_json(&["--filename", p, "--size", "1M", "--iodepth", "4"]);
        check_data_run(&v, "plugio");
    } else {
        assert_bad_input(&["bench", "--filename", p], "--direct 0");
    }
    let v = bench_json(&[
        "--filename",
        p,
        "--direct",
        "0",
        "--size",
        "1M",
        "--iodepth",
        "4",
    ]);
    check_data_run(&v, "plugio");
    assert_eq!(v["direct"], false);
}

#[test]
fn info_describes_a_file() {
    let f = tempfile::NamedTempFile::new_in(std::env::temp_dir()).expect("tmp");
    std::fs::write(f.path(), vec![0u8; 65536]).expect("write");
    let o = plugio(&["info", f.path().to_str().expect("utf-8")]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    for needle in ["O_DIRECT", "logical_block_size", "io_uring"] {
        assert!(out.contains(needle), "{needle} missing in:\n{out}");
    }
    let o = plugio(&["info", "/nonexistent/plugio"]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn compare_report_writes_the_section_and_plots() {
    let dir = tempfile::tempdir().expect("tempdir");
    let results = dir.path().join("results");
    std::fs::create_dir(&results).expect("mkdir");
    for (engine, qd) in [("plugio", "1"), ("plugio", "8"), ("raw", "1"), ("raw", "8")] {
        let v = bench_json(&["--engine", engine, "--iodepth", qd, "--runtime", "0.3"]);
        let name = format!("tmp__{engine}__randread4k__qd{qd}__r1.json");
        std::fs::write(results.join(name), v.to_string()).expect("write result");
    }
    for (engine, rep) in [("plugio", 1), ("plugio", 2), ("raw", 1)] {
        let v = bench_json(&[
            "--engine",
            engine,
            "--rw",
            "read",
            "--iodepth",
            "32",
            "--runtime",
            "0.3",
        ]);
        let name = format!("tmp__{engine}__seqread4k__qd32__r{rep}.json");
        std::fs::write(results.join(name), v.to_string()).expect("write result");
    }
    let md = dir.path().join("RESULTS.md");
    std::fs::write(&md, "# Results\n\n## Other\nkept\n").expect("write md");
    let plots = dir.path().join("plots");
    let o = plugio(&[
        "compare-report",
        "--results",
        results.to_str().expect("utf-8"),
        "--markdown",
        md.to_str().expect("utf-8"),
        "--plots",
        plots.to_str().expect("utf-8"),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(&md).expect("read md");
    assert!(text.contains("## Other\nkept"), "{text}");
    assert!(
        text.contains("## Peer comparison") && text.contains("| tmp, 8 |"),
        "{text}"
    );
    let svg = std::fs::read_to_string(plots.join("iops_vs_qd_tmp.svg")).expect("plot written");
    assert!(svg.contains("<svg") && svg.contains("plugio"));
    let bars = std::fs::read_to_string(plots.join("seqread_tmp.svg")).expect("bar plot written");
    // Axis titles on both plots; one colour per engine across plots (plugio
    // is #1F77B4 in each); the bars carry their values (IOPS end in K or M
    // on a machine this fast, else a plain number) and min-max bars.
    assert!(
        svg.contains("queue depth (IOs in flight per core)"),
        "{svg}"
    );
    assert!(bars.contains("IOPS (median; bar: min-max)") && bars.contains("engine"));
    assert!(svg.contains("#1F77B4") && bars.contains("#1F77B4"));
    // Value labels: left-anchored texts beside the bars, one per engine.
    let value_labels = bars.matches(r#"text-anchor="start""#).count();
    assert_eq!(value_labels, 2, "one value label per engine: {bars}");
}

/// A job larger than the process's address-space limit (`ulimit -v`) is
/// refused before it starts (exit 2, naming the limit), where it aborted
/// at its first failed allocation with no JSON.
#[test]
fn bench_refuses_a_job_past_the_address_space_limit() {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_plugio"));
    cmd.args([
        "bench",
        "--json",
        "--bs",
        "16m",
        "--iodepth",
        "64",
        "--runtime",
        "1",
    ]);
    // SAFETY: the closure runs in the child between fork and exec and only
    // calls setrlimit, a system call that allocates nothing and takes no
    // lock.
    unsafe {
        cmd.pre_exec(|| {
            use nix::sys::resource::{setrlimit, Resource};
            let limit = 700 << 20;
            setrlimit(Resource::RLIMIT_AS, limit, limit).map_err(std::io::Error::from)
        });
    }
    let o = cmd.output().expect("the plugio binary runs");
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: Value = serde_json::from_slice(&o.stdout).expect("one JSON document");
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("address-space limit (ulimit -v)"),
        "{message}"
    );
    assert!(
        message.contains("lower --numjobs, --iodepth or --bs"),
        "{message}"
    );
}

/// A temporary file larger than its file system's free space (less a
/// 1 GiB margin) is refused before it is filled, and nothing is left
/// behind: the fill would otherwise write until the disk is full.
#[test]
fn bench_refuses_a_temporary_file_past_the_free_space() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("disk temp dir");
    let st = nix::sys::statvfs::statvfs(dir.path()).expect("statvfs");
    // The widths of fsblkcnt_t and c_ulong differ between platforms.
    #[allow(clippy::useless_conversion)]
    let free_bytes = u64::from(st.blocks_available()) * u64::from(st.fragment_size());
    if free_bytes < 2 << 30 {
        eprintln!("only {free_bytes} bytes free here: not tested");
        return;
    }
    // Just under the free space: refused by the margin, not by the disk.
    let size_mib = free_bytes.saturating_sub(512 << 20) >> 20;
    let size = format!("{size_mib}m");
    let o = Command::new(env!("CARGO_BIN_EXE_plugio"))
        .args(["bench", "--runtime", "1", "--size", &size])
        .env("TMPDIR", dir.path())
        .current_dir(dir.path())
        .output()
        .expect("the plugio binary runs");
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("free in") && err.contains("lower --size"),
        "{err}"
    );
    let left: Vec<_> = std::fs::read_dir(dir.path()).expect("read_dir").collect();
    assert!(left.is_empty(), "the temporary file is removed: {left:?}");
}

//! `plugio replay`: the replay function on the mem device (verification,
//! reordering latencies, several cores, flush ordering and power cuts),
//! and the command end to end (hand-written fixtures in
//! `tests/data/replay/`, malformed input, a target too small, and the
//! shared postgres and sqlite traces with `--limit 20000 --timing none
//! --verify`).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::Duration;

use plugio::device::backend::mem::{Latency, MemClock, MemConfig, MemDevice};
use plugio::{Device, DeviceOptions, RingConfig};
use plugio_cli::replay::pattern::{self, Found};
use plugio_cli::replay::{self, ReplayOptions, Timing, TraceIo, TraceOp, Unwritten};
use rand::{Rng, SeedableRng};
use serde_json::Value;

const MEM_BYTES: u64 = 1 << 20;

fn mem(seed: u64) -> MemDevice {
    MemDevice::new(MemConfig {
        capacity_bytes: MEM_BYTES,
        latency: Latency::Uniform {
            min: Duration::from_micros(1),
            max: Duration::from_micros(200),
        },
        clock: MemClock::Virtual,
        seed,
        ..Default::default()
    })
}

fn mem_dev(m: &MemDevice, queue_depth: u32) -> Device {
    let opts = DeviceOptions {
        queue_depth,
        ..Default::default()
    };
    Device::with_backend(Arc::new(m.clone()), None, opts).expect("mem device")
}

fn io(op: TraceOp, offset_bytes: u64, len_bytes: u64) -> TraceIo {
    TraceIo {
        time_ns: 0,
        op,
        offset_bytes,
        len_bytes,
        line: 0,
    }
}

/// A random trace over a small device: overlapping reads and writes,
/// sequential runs (mergeable), flushes and discards.
fn random_trace(seed: u64, n: usize) -> Vec<TraceIo> {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let blocks = MEM_BYTES / 4096;
    let mut next_seq = 0;
    (0..n)
        .map(|i| {
            let mut x = match rng.gen_range(0..100) {
                0..=39 => io(
                    TraceOp::Read,
                    rng.gen_range(0..blocks - 4) * 4096,
                    4096 * rng.gen_range(1..=4),
                ),
                40..=54 => {
                    // A sequential run of 4 KiB writes.
                    let off = next_seq;
                    next_seq = (next_seq + 4096) % (MEM_BYTES / 2);
                    io(TraceOp::Write, off, 4096)
                }
                55..=89 => io(
                    TraceOp::Write,
                    rng.gen_range(0..blocks - 2) * 4096,
                    4096 * rng.gen_range(1..=2),
                ),
                90..=95 => io(TraceOp::Flush, 0, 0),
                _ => io(TraceOp::Discard, rng.gen_range(0..blocks) * 4096, 4096),
            };
            x.line = i + 1;
            x.time_ns = i as u64 * 1000;
            x
        })
        .collect()
}

fn local() -> plugio::LocalExecutor {
    plugio::runtime::local(RingConfig::default()).expect("executor")
}

#[test]
fn a_random_trace_replays_on_the_mem_device_and_verifies_for_many_seeds() {
    for seed in 0..8 {
        let ios = random_trace(seed, 3000);
        let m = mem(seed);
        let dev = mem_dev(&m, 32);
        let opts = ReplayOptions {
            iodepth: 32,
            verify: true,
            unwritten: Unwritten::Zeros,
            ..Default::default()
        };
        let r = local()
            .run(replay::replay(&dev, &ios, &opts))
            .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        assert_eq!(r.ios, 3000);
        for op in TraceOp::ALL {
            let want = ios.iter().filter(|x| x.op == op).count() as u64;
            assert_eq!(r.op(op).ios, want, "seed {seed} {op:?}");
        }
        let v = r.verify.as_ref().expect("verify stats");
        assert_eq!(v.mismatched_sectors, 0);
        assert!(v.read_sectors_checked > 1000, "{v:?}");
        assert!(v.final_sectors_checked > 1000, "{v:?}");
        assert_eq!(r.engine.bios, 3000, "one bio per trace IO");
        assert!(r.engine.merges > 0, "sequential runs merge: {:?}", r.engine);
        assert_eq!(r.engine.requests + r.engine.merges, r.engine.bios);
        assert!(r.overlap_waits > 0 && r.flush_waits > 0, "{r:?}");
    }
}

/// `n` 4 KiB reads spread over the device: reads never conflict, so
/// nothing for the ordering rules to hold back (and, 8 KiB apart, nothing
/// adjacent to merge).
fn read_trace(n: usize) -> Vec<TraceIo> {
    (0..n)
        .map(|i| {
            let mut x = io(TraceOp::Read, (i as u64 * 8192) % MEM_BYTES, 4096);
            x.line = i + 1;
            x
        })
        .collect()
}

#[test]
fn a_trace_without_conflicts_keeps_the_queue_at_iodepth_without_a_task_per_io() {
    let ios = read_trace(2000);
    let n = ios.len() as u64;
    let m = mem(21);
    let dev = mem_dev(&m, 64);
    let iodepth = 8;
    let opts = ReplayOptions {
        iodepth,
        ..Default::default()
    };
    let (r, polled) = local().run(async {
        let before = plugio::executor::tick_stats().expect("on a core");
        let r = replay::replay(&dev, &ios, &opts).await.expect("replay");
        let after = plugio::executor::tick_stats().expect("on a core");
        (r, after.tasks_polled - before.tasks_polled)
    });
    assert_eq!(r.ios, n);
    assert_eq!((r.overlap_waits, r.flush_waits), (0, 0));
    let d = r.depth;
    assert_eq!(d.max_in_flight, u64::from(iodepth), "{d:?}");
    // Every wait but the last few (the trace running out) has the full
    // depth in flight; a wait follows at least one completion, so there
    // are at least n / iodepth of them.
    assert!(d.waits >= n / u64::from(iodepth), "{d:?}");
    let short: f64 = (1..iodepth).map(f64::from).sum();
    assert!(
        d.mean_in_flight >= f64::from(iodepth) - short / d.waits as f64,
        "{d:?}"
    );
    // The loop polls its IOs itself: no task spawned (and polled) per IO.
    assert!(polled < n / 4, "{polled} tasks polled for {n} IOs");
}

#[test]
fn queued_flushes_skip_the_barrier_and_still_verify() {
    let ios = random_trace(9, 3000);
    let m = mem(9);
    let dev = mem_dev(&m, 32);
    let opts = ReplayOptions {
        verify: true,
        flush_barrier: false,
        ..Default::default()
    };
    let r = local()
        .run(replay::replay(&dev, &ios, &opts))
        .expect("replay");
    assert_eq!(r.flush_waits, 0);
    assert!(!r.flush_barrier);
    assert!(r.op(TraceOp::Flush).ios > 0);
    assert_eq!(r.verify.expect("verify").mismatched_sectors, 0);
}

#[test]
fn unordered_overlaps_replay_every_io_and_refuse_verify() {
    let ios = random_trace(11, 2000);
    let m = mem(11);
    let dev = mem_dev(&m, 32);
    let opts = ReplayOptions {
        flush_barrier: false,
        overlap_order: false,
        ..Default::default()
    };
    let r = local()
        .run(replay::replay(&dev, &ios, &opts))
        .expect("replay");
    assert_eq!((r.ios, r.overlap_waits, r.flush_waits), (2000, 0, 0));
    let refused = ReplayOptions {
        verify: true,
        overlap_order: false,
        ..Default::default()
    };
    let e = local()
        .run(replay::replay(&dev, &ios, &refused))
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("--verify needs overlapping IOs kept in order"),
        "{e}"
    );
}

#[test]
fn verification_catches_a_write_that_did_not_land() {
    // Replay once, then overwrite one written sector behind the replay's
    // back and verify again with the same map: the read-back must fail.
    let m = mem(1);
    let dev = mem_dev(&m, 8);
    let ios = vec![io(TraceOp::Write, 0, 8192), io(TraceOp::Read, 0, 8192)];
    let opts = ReplayOptions {
        verify: true,
        ..Default::default()
    };
    local().run(async {
        replay::replay(&dev, &ios, &opts)
            .await
            .expect("clean replay");
        let mut buf = dev.alloc_buf(512);
        buf.as_mut_slice().fill(0x5a);
        dev.write_at(buf, 1024).await.0.expect("tamper");
        let mut map = replay::verify::BlockMap::new(Unwritten::Unchecked);
        map.record(0, &ios[0]);
        let mut stats = replay::verify::VerifyStats::default();
        replay::verify::verify_all(&dev, &map, &ios, 4, &mut stats)
            .await
            .expect("reads");
        assert_eq!(stats.final_sectors_checked, 16);
        assert_eq!(stats.mismatched_sectors, 1);
        assert!(
            stats.first_mismatches[0].contains("sector 2 (byte 1024) should hold write #0"),
            "{:?}",
            stats.first_mismatches
        );
        assert!(matches!(
            stats.into_result(),
            Err(replay::ReplayError::Verify {
                mismatched_sectors: 1,
                ..
            })
        ));
    });
}

#[test]
fn two_cores_replay_a_random_trace_and_verify() {
    let ios = Arc::new(random_trace(42, 4000));
    let m = mem(42);
    let dev = mem_dev(&m, 64);
    let rt = plugio::runtime::builder(RingConfig::default())
        .cores(2)
        .build()
        .expect("runtime");
    let task_ios = ios.clone();
    let task_dev = dev.clone();
    let r = futures::executor::block_on(rt.spawn_on(0, async move {
        let opts = ReplayOptions {
            iodepth: 64,
            cores: 2,
            verify: true,
            unwritten: Unwritten::Zeros,
            ..Default::default()
        };
        replay::replay(&task_dev, &task_ios, &opts).await
    }))
    .expect("task")
    .expect("replay");
    drop(dev);
    rt.shutdown(plugio::ShutdownMode::Wait).expect("shutdown");
    assert_eq!((r.ios, r.cores), (4000, 2));
    assert_eq!(r.verify.expect("verify").mismatched_sectors, 0);
}

#[test]
fn original_timing_issues_each_io_no_earlier_than_recorded_and_reports_lag() {
    let mut ios = random_trace(7, 200);
    for (i, x) in ios.iter_mut().enumerate() {
        // 100 us apart: 19.9 ms of recorded time.
        x.time_ns = 1_000_000 + i as u64 * 100_000;
    }
    let m = mem(7);
    let dev = mem_dev(&m, 16);
    let opts = ReplayOptions {
        timing: Timing::Original,
        iodepth: 16,
        verify: true,
        ..Default::default()
    };
    let t0 = std::time::Instant::now();
    let r = local()
        .run(replay::replay(&dev, &ios, &opts))
        .expect("replay");
    assert!(
        t0.elapsed() >= Duration::from_micros(19_900),
        "{:?}",
        t0.elapsed()
    );
    // The report's clock starts at the first IO's issue, a little after
    // the run began: allow a millisecond (as fast as possible would be
    // about 1 ms in all).
    assert!(r.elapsed_s >= 0.019, "{r:?}");
    let lag = r.lag.expect("lag under original timing");
    assert_eq!(lag.samples, 200);
    assert!(lag.p50_ns <= lag.p99_ns && lag.p99_ns <= lag.max_ns);
}

#[test]
fn asking_for_more_cores_than_the_runtime_has_is_a_clear_error() {
    let m = mem(0);
    let dev = mem_dev(&m, 8);
    let opts = ReplayOptions {
        cores: 2,
        ..Default::default()
    };
    let e = local()
        .run(replay::replay(&dev, &[io(TraceOp::Read, 0, 512)], &opts))
        .unwrap_err();
    assert!(e.to_string().contains("2 cores asked for"), "{e}");
}

#[test]
fn a_read_after_a_write_and_a_flush_sees_the_write() {
    for seed in 0..20 {
        let m = mem(seed);
        let dev = mem_dev(&m, 8);
        let ios = [
            io(TraceOp::Write, 0, 4096),
            io(TraceOp::Flush, 0, 0),
            io(TraceOp::Read, 0, 4096),
        ];
        let opts = ReplayOptions {
            iodepth: 8,
            verify: true,
            ..Default::default()
        };
        let r = local()
            .run(replay::replay(&dev, &ios, &opts))
            .expect("replay");
        let v = r.verify.expect("verify");
        assert_eq!(v.read_sectors_checked, 8, "the read was checked");
        assert_eq!(v.mismatched_sectors, 0);
        assert!(
            r.flush_waits >= 2,
            "flush waited for the write, read for the flush"
        );
    }
}

/// What each 512-byte sector of `range` holds on the durable image.
fn durable(m: &MemDevice, offset: u64, len: u64) -> Vec<Found> {
    m.durable_bytes(offset..offset + len)
        .chunks(512)
        .enumerate()
        .map(|(i, s)| pattern::decode(s, offset / 512 + i as u64))
        .collect()
}

#[test]
fn a_power_cut_after_the_flush_keeps_the_write_and_loses_the_one_after() {
    for seed in 0..20 {
        let m = mem(seed);
        let dev = mem_dev(&m, 8);
        let ios = [
            io(TraceOp::Write, 0, 4096),
            io(TraceOp::Flush, 0, 0),
            io(TraceOp::Write, 8192, 4096),
        ];
        let opts = ReplayOptions {
            iodepth: 8,
            ..Default::default()
        };
        local()
            .run(replay::replay(&dev, &ios, &opts))
            .expect("replay");
        m.power_cut();
        assert!(
            durable(&m, 0, 4096).iter().all(|f| *f == Found::Write(0)),
            "seed {seed}: the flushed write survives"
        );
        assert!(
            durable(&m, 8192, 4096).iter().all(|f| *f == Found::Zeros),
            "seed {seed}: the unflushed write is lost"
        );
    }
}

// ---- the command ----

fn plugio(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_plugio"))
        .args(args)
        .output()
        .expect("the plugio binary runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn data(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/replay")
        .join(name)
        .display()
        .to_string()
}

fn tmpdir() -> tempfile::TempDir {
    // The target dir is on a disk-backed file system (O_DIRECT works).
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir")
}

fn replay_json(trace: &str, target: &Path, extra: &[&str]) -> Value {
    let t = target.display().to_string();
    let mut args = vec!["replay", trace, "--filename", &t, "--json", "--quiet"];
    args.extend_from_slice(extra);
    let o = plugio(&args);
    assert!(o.status.success(), "plugio {args:?} failed: {}", stderr(&o));
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("bad JSON ({e}): {}", String::from_utf8_lossy(&o.stdout)))
}

fn u(v: &Value, path: &[&str]) -> u64 {
    let mut x = v;
    for k in path {
        x = &x[*k];
    }
    x.as_u64()
        .unwrap_or_else(|| panic!("{path:?} missing in {v}"))
}

fn op_ios(v: &Value, op: &str) -> u64 {
    let ops = v["ops"].as_array().expect("ops");
    let o = ops.iter().find(|o| o["op"] == op).expect("op entry");
    o["ios"].as_u64().expect("ios")
}

#[test]
fn cli_replays_the_csv_fixture_with_original_timing_and_verifies() {
    let dir = tmpdir();
    let target = dir.path().join("t.img");
    let v = replay_json(
        &data("small.csv"),
        &target,
        &["--verify", "--timing", "original"],
    );
    assert_eq!(v["created"], true);
    assert_eq!(
        std::fs::metadata(&target).unwrap().len(),
        69632,
        "sized at the extent"
    );
    assert_eq!(u(&v, &["ios"]), 9);
    assert_eq!((op_ios(&v, "read"), op_ios(&v, "write")), (3, 3));
    assert_eq!((op_ios(&v, "flush"), op_ios(&v, "discard")), (2, 1));
    assert_eq!(u(&v, &["verify", "mismatched_sectors"]), 0);
    assert!(u(&v, &["verify", "read_sectors_checked"]) >= 48);
    // The IOs are 1 ms apart: the replay takes at least 8 ms.
    assert!(v["elapsed_s"].as_f64().unwrap() >= 0.008, "{v}");
    assert!(u(&v, &["lag", "samples"]) == 9, "{v}");
    // Replaying again onto the existing target works too (not created).
    let again = replay_json(
        &data("small.csv"),
        &target,
        &["--verify", "--timing", "none"],
    );
    assert_eq!(again["created"], false);
    assert!(again["lag"].is_null());
}

#[test]
fn cli_replays_iolog_and_blkparse_fixtures() {
    let dir = tmpdir();
    let v = replay_json(
        &data("small.iolog"),
        &dir.path().join("a"),
        &["--verify", "--timing", "original"],
    );
    assert_eq!(v["format"], "iolog");
    assert_eq!(v["trace_ios"], serde_json::json!([2, 2, 1, 1]));
    assert_eq!(u(&v, &["verify", "mismatched_sectors"]), 0);
    assert!(
        v["elapsed_s"].as_f64().unwrap() >= 0.009,
        "10 ms of recorded time: {v}"
    );

    let q = replay_json(
        &data("small.blkparse.txt"),
        &dir.path().join("q"),
        &["--verify", "--timing", "none"],
    );
    assert_eq!(q["format"], "blkparse");
    assert_eq!(q["action"], "Q");
    assert_eq!(q["trace_ios"], serde_json::json!([1, 3, 3, 0]));
    let d = replay_json(
        &data("small.blkparse.txt"),
        &dir.path().join("d"),
        &["--action", "D", "--verify", "--timing", "none"],
    );
    assert_eq!(d["trace_ios"], serde_json::json!([1, 2, 3, 0]));
    assert_eq!(u(&d, &["verify", "mismatched_sectors"]), 0);
    assert_eq!(d["action"], "D");
}

/// `--action` on a trace without actions (CSV, fio iolog) is refused,
/// naming the format and what to drop; it was accepted and ignored.
/// Nothing is created.
#[test]
fn cli_action_on_a_trace_without_actions_is_refused() {
    let dir = tmpdir();
    let target = dir.path().join("never");
    let t = target.display().to_string();
    for (trace, what) in [("small.csv", "a CSV trace"), ("small.iolog", "a fio iolog")] {
        let o = plugio(&["replay", &data(trace), "--filename", &t, "--action", "D"]);
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        let err = stderr(&o);
        assert!(err.contains("--action applies to blkparse traces"), "{err}");
        assert!(err.contains(what) && err.contains("drop --action"), "{err}");
        assert!(!target.exists(), "nothing is created");
    }
    // With --format given, before the trace is read: a malformed trace
    // gets the --action refusal, not its parse error.
    let o = plugio(&[
        "replay",
        &data("bad.csv"),
        "--filename",
        &t,
        "--format",
        "csv",
        "--action",
        "Q",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--action applies to blkparse"),
        "{}",
        stderr(&o)
    );
    // A trace on standard input is named as other errors name it.
    let mut child = Command::new(env!("CARGO_BIN_EXE_plugio"))
        .args(["replay", "-", "--filename", &t, "--action", "D"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let trace = std::fs::read(data("small.csv")).expect("trace");
    std::io::Write::write_all(&mut child.stdin.take().expect("stdin"), &trace).expect("write");
    let o = child.wait_with_output().expect("wait");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("<stdin> is a CSV trace"),
        "{}",
        stderr(&o)
    );
    // A format given is what the trace is read as: the message says so,
    // not that the trace is that format (found by a break-it helper).
    let o = plugio(&[
        "replay",
        &data("small.blkparse.txt"),
        "--filename",
        &t,
        "--format",
        "csv",
        "--action",
        "D",
    ]);
    assert!(stderr(&o).contains("--format reads"), "{}", stderr(&o));
    // An empty trace on stdin is named <stdin> too.
    let mut child = Command::new(env!("CARGO_BIN_EXE_plugio"))
        .args(["replay", "-", "--filename", &t])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    std::io::Write::write_all(
        &mut child.stdin.take().expect("stdin"),
        b"time_ns,op,offset_bytes,len_bytes\n",
    )
    .expect("write");
    let o = child.wait_with_output().expect("wait");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("<stdin>: no IOs to replay"),
        "{}",
        stderr(&o)
    );
    // The JSON report's action is null where the format has none.
    let csv = replay_json(
        &data("small.csv"),
        &dir.path().join("csv"),
        &["--timing", "none"],
    );
    assert_eq!(csv["action"], serde_json::Value::Null);
}

#[test]
fn cli_malformed_trace_names_the_line_and_replays_nothing() {
    let dir = tmpdir();
    let target = dir.path().join("never");
    let t = target.display().to_string();
    let o = plugio(&["replay", &data("bad.csv"), "--filename", &t, "--quiet"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("bad.csv:4: expected 4 comma-separated fields"),
        "{}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("nothing was replayed"));
    assert!(!target.exists(), "the target was not even created");
}

#[test]
fn cli_refuses_a_target_too_small_naming_the_line() {
    let dir = tmpdir();
    let target = dir.path().join("small");
    std::fs::write(&target, vec![0u8; 16384]).unwrap();
    let t = target.display().to_string();
    let o = plugio(&["replay", &data("small.csv"), "--filename", &t, "--quiet"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("holds 16384 bytes but the trace reaches byte 69632"),
        "{e}"
    );
    assert!(e.contains("trace line 8"), "{e}");
    assert_eq!(
        std::fs::read(&target).unwrap(),
        vec![0u8; 16384],
        "untouched"
    );
}

/// A target that is the trace's own file, by its name, a hard link or a
/// redirect to standard input, is refused before anything is written
/// (the replay overwrote the trace: found by a break-it helper); a trace
/// of reads only may replay on it.
#[test]
fn cli_the_traces_own_file_as_target_is_refused_when_the_trace_writes() {
    let dir = tmpdir();
    let trace = dir.path().join("self.csv");
    let mut text = std::fs::read_to_string(data("small.csv")).unwrap();
    // Large enough to hold the trace's extent, so that only the new check
    // can refuse it.
    text.push_str(&"\n".repeat(80_000));
    std::fs::write(&trace, &text).unwrap();
    let link = dir.path().join("link.csv");
    std::fs::hard_link(&trace, &link).unwrap();
    let (tr, ln) = (trace.display().to_string(), link.display().to_string());
    for o in [
        plugio(&["replay", &tr, "--filename", &tr, "--quiet"]),
        plugio(&["replay", &tr, "--filename", &ln, "--quiet"]),
        Command::new(env!("CARGO_BIN_EXE_plugio"))
            .args(["replay", "-", "--filename", &ln, "--quiet"])
            .stdin(std::fs::File::open(&trace).unwrap())
            .output()
            .unwrap(),
    ] {
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(
            stderr(&o).contains("is the trace's own file"),
            "{}",
            stderr(&o)
        );
        assert_eq!(std::fs::read_to_string(&trace).unwrap(), text, "untouched");
    }
    let reads: String = text
        .lines()
        .filter(|l| l.contains(",R,") || l.starts_with("time_ns"))
        .map(|l| format!("{l}\n"))
        .collect::<String>()
        + &"\n".repeat(80_000);
    std::fs::write(&trace, &reads).unwrap();
    let o = plugio(&["replay", &tr, "--filename", &tr, "--quiet", "--direct", "0"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(&trace).unwrap(), reads);
}

#[test]
fn cli_a_dangling_symlink_as_target_is_named_as_such() {
    let dir = tmpdir();
    let target = dir.path().join("link");
    let missing = dir.path().join("missing");
    std::os::unix::fs::symlink(&missing, &target).unwrap();
    let t = target.display().to_string();
    let o = plugio(&["replay", &data("small.csv"), "--filename", &t, "--quiet"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("is a symbolic link to") && e.contains("which does not exist"),
        "{e}"
    );
    assert!(e.contains(&missing.display().to_string()), "{e}");
    assert!(!missing.exists(), "nothing was created through the link");
}

/// The message of a replay of `small.csv` onto `target`, which must be
/// refused as a usage error (exit status 2).
fn refused_target(target: &Path) -> String {
    let t = target.display().to_string();
    let o = plugio(&["replay", &data("small.csv"), "--filename", &t, "--quiet"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    stderr(&o)
}

#[test]
fn cli_a_chain_or_loop_of_symlinks_as_target_names_its_end() {
    let dir = tmpdir();
    let at = |name: &str| dir.path().join(name);
    let run = refused_target;
    // a -> b -> c (relative), c missing: the message names c, not b.
    std::os::unix::fs::symlink("b", at("a")).unwrap();
    std::os::unix::fs::symlink(at("c"), at("b")).unwrap();
    let e = run(&at("a"));
    assert!(e.contains("a chain of 2 symbolic links ending at"), "{e}");
    assert!(e.contains(&at("c").display().to_string()), "{e}");
    assert!(!at("c").exists(), "nothing was created through the chain");
    // A relative link in another directory is named by where it leads
    // from there.
    std::fs::create_dir(at("sub")).unwrap();
    std::os::unix::fs::symlink("x", at("sub/l")).unwrap();
    let e = run(&at("sub/l"));
    assert!(e.contains("is a symbolic link to"), "{e}");
    assert!(e.contains(&at("sub/x").display().to_string()), "{e}");
    // x -> y -> x, and s -> s.
    std::os::unix::fs::symlink("y", at("x")).unwrap();
    std::os::unix::fs::symlink("x", at("y")).unwrap();
    std::os::unix::fs::symlink("s", at("s")).unwrap();
    for looped in ["x", "s"] {
        let e = run(&at(looped));
        assert!(e.contains("a loop of symbolic links"), "{looped}: {e}");
    }
}

/// The target errors come from the kernel's own answer for the path:
/// exactly 40 links are followed and 41 are not, a loop spelled through
/// `..` is a loop, a name under a file or too long is named as such, and a
/// trailing '/' is dropped rather than called a directory.
#[test]
fn cli_target_errors_follow_the_kernels_resolution() {
    let dir = tmpdir();
    let at = |name: &str| dir.path().join(name);
    let run = refused_target;
    for n in [40, 41] {
        let name = |i: usize| format!("c{n}_{i}");
        for i in 0..n {
            std::os::unix::fs::symlink(name(i + 1), at(&name(i))).unwrap();
        }
        let e = run(&at(&name(0)));
        if n == 40 {
            assert!(e.contains("a chain of 40 symbolic links ending at"), "{e}");
            assert!(e.contains(&name(40)), "{e}");
        } else {
            assert!(e.contains("more than 40 symbolic links"), "{e}");
        }
    }
    std::fs::create_dir(at("d")).unwrap();
    std::os::unix::fs::symlink("d/../y", at("x")).unwrap();
    std::os::unix::fs::symlink("x", at("y")).unwrap();
    for looped in ["x", "x/"] {
        let e = run(&at(looped));
        assert!(e.contains("a loop of symbolic links"), "{looped}: {e}");
    }
    std::fs::write(at("file"), b"").unwrap();
    let e = run(&at("file/"));
    assert!(
        e.contains("ends in '/', but names a file") && e.contains("drop the '/'"),
        "{e}"
    );
    let e = run(&at("file/t"));
    assert!(
        e.contains("cannot be reached") && e.contains("is a file, not a directory"),
        "{e}"
    );
    let e = run(&at(&"n".repeat(300)));
    assert!(e.contains("is too long") && e.contains("shorten it"), "{e}");
    std::os::unix::fs::symlink("nowhere", at("broken")).unwrap();
    for slashed in ["new/", "broken/"] {
        let e = run(&at(slashed));
        assert!(
            e.contains("ends in '/'") && e.contains("drop the '/'"),
            "{slashed}: {e}"
        );
        assert!(!e.contains("Is a directory"), "{e}");
    }
    assert!(
        !at("new").exists() && !at("nowhere").exists(),
        "nothing was created"
    );
}

/// Names from outside (a link's target, the trace's file name) and long or
/// invisible trace fields reach the terminal escaped, and a long field
/// does not cut off the message's advice.
#[test]
fn cli_messages_escape_names_and_keep_their_advice() {
    let dir = tmpdir();
    let at = |name: &str| dir.path().join(name);
    let run = |trace: &std::path::Path, target: &std::path::Path| {
        let o = plugio(&[
            "replay",
            &trace.display().to_string(),
            "--filename",
            &target.display().to_string(),
            "--quiet",
        ]);
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        stderr(&o)
    };
    let small = std::path::PathBuf::from(data("small.csv"));
    std::os::unix::fs::symlink("esc\u{1b}[31m\nred", at("l")).unwrap();
    let e = run(&small, &at("l"));
    assert!(e.contains("esc\\u{1b}[31m\\nred"), "{e}");
    assert!(!e.trim_end().chars().any(char::is_control), "{e:?}");
    let named = at("t\u{1b}[2J.csv");
    std::fs::write(&named, "0,X,0,4096\n").unwrap();
    let e = run(&named, &at("target"));
    assert!(e.contains("t\\u{1b}[2J.csv:1: unknown op 'X'"), "{e}");
    assert!(!e.trim_end().chars().any(char::is_control), "{e:?}");
    let long = at("long.csv");
    std::fs::write(&long, format!("0,R,0,{}x\n", "9".repeat(500))).unwrap();
    let e = run(&long, &at("target"));
    assert!(e.contains("...' is not a whole number"), "{e}");
    assert!(e.len() < 400, "{} bytes: {e}", e.len());
    let header = at("zw.csv");
    std::fs::write(
        &header,
        "time_ns\u{200b},op,offset_bytes,len_bytes\n0,R,0,4096\n",
    )
    .unwrap();
    let e = run(&header, &at("target"));
    assert!(
        e.contains("looks like the header") && e.contains("\\u{200b}"),
        "{e}"
    );
    assert!(!e.contains('\u{200b}'), "{e:?}");
    // A newline in a missing trace's name cannot forge a second line.
    let forged = at("x\nplugio: all good");
    let o = plugio(&["replay", &forged.display().to_string(), "--filename", "t"]);
    let e = stderr(&o);
    assert_eq!(e.trim_end().lines().count(), 1, "{e}");
    assert!(e.contains("x\\nplugio: all good"), "{e}");
    // Nor an invisible character in a value the option parser refuses.
    let o = plugio(&[
        "replay",
        &data("small.csv"),
        "--filename",
        "t",
        "--limit",
        "1\u{200b}",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("1\\u{200b}"), "{}", stderr(&o));
    // A byte that is not UTF-8 in a missing trace's name is shown as its
    // hex escape, not as U+FFFD, which two such names would share.
    use std::os::unix::ffi::OsStrExt;
    let latin1 = dir.path().join(std::ffi::OsStr::from_bytes(b"caf\xe9.csv"));
    let o = Command::new(env!("CARGO_BIN_EXE_plugio"))
        .arg("replay")
        .arg(&latin1)
        .args(["--filename", "t"])
        .output()
        .expect("the plugio binary runs");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("caf\\xe9.csv"), "{}", stderr(&o));
}

#[test]
fn cli_text_output_has_ops_engine_figures_and_lag() {
    let dir = tmpdir();
    let t = dir.path().join("t").display().to_string();
    let o = plugio(&[
        "replay",
        &data("small.csv"),
        "--filename",
        &t,
        "--quiet",
        "--timing",
        "original",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    for want in [
        "replayed 9 IOs",
        "(timing original, iodepth",
        "read ",
        "write ",
        "flush ",
        "engine: 9 bios ->",
        "IOS/call",
        "behind schedule: p50",
    ] {
        assert!(out.contains(want), "missing '{want}' in:\n{out}");
    }
}

#[test]
fn cli_spreads_io_over_two_cores_and_limits_the_trace() {
    let dir = tmpdir();
    let target = dir.path().join("two");
    let v = replay_json(
        &data("small.csv"),
        &target,
        &[
            "--verify", "--timing", "none", "--cpus", "2", "--limit", "5",
        ],
    );
    assert_eq!((u(&v, &["ios"]), u(&v, &["cores"])), (5, 2));
    assert_eq!(v["trace_ios"], serde_json::json!([1, 3, 1, 0]));
    assert_eq!(u(&v, &["verify", "mismatched_sectors"]), 0);
    // The target was sized for the 5 IOs replayed, not the whole trace.
    assert_eq!(std::fs::metadata(&target).unwrap().len(), 16384);
}

/// Runs `plugio args`; a hang fails the test by name after `secs`.
fn plugio_within(args: &[&str], secs: u64) -> Output {
    let child = Command::new(env!("CARGO_BIN_EXE_plugio"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the plugio binary runs");
    common::output_guarded(child, secs, &format!("plugio {args:?}"))
}

#[test]
fn cli_ios_of_the_second_core_complete_without_one_of_the_first_to_wake_the_loop() {
    // Regions of 1 MiB go to the cores in turn: 0 is core 0's, 1 MiB core
    // 1's. One local IO, then two remote ones (the second overlaps the
    // first, so it waits for its completion), then remote alone: the
    // dispatch loop must be woken by the remote completions themselves.
    // (It hung when it polled a fresh `recv()` each time and dropped it,
    // and its wake registration with it.)
    let dir = tmpdir();
    for (name, rows) in [
        (
            "local-remote-remote.csv",
            "0,W,0,4096\n1,W,1048576,4096\n2,R,1048576,4096\n",
        ),
        ("remote-only.csv", "0,R,1048576,4096\n1,W,1052672,8192\n"),
    ] {
        let trace = dir.path().join(name);
        std::fs::write(&trace, format!("time_ns,op,offset_bytes,len_bytes\n{rows}")).unwrap();
        let target = dir.path().join(format!("{name}.img"));
        let (tr, t) = (trace.display().to_string(), target.display().to_string());
        let args = [
            "replay",
            &tr,
            "--filename",
            &t,
            "--json",
            "--quiet",
            "--timing",
            "none",
            "--cpus",
            "2",
            "--verify",
        ];
        let o = plugio_within(&args, 60);
        assert!(o.status.success(), "{name}: {}", stderr(&o));
        let v: Value = serde_json::from_slice(&o.stdout).expect("JSON");
        assert_eq!(u(&v, &["ios"]), rows.lines().count() as u64, "{name}");
        assert_eq!(u(&v, &["verify", "mismatched_sectors"]), 0, "{name}");
    }
}

/// Starts `plugio replay TRACE OPTION --filename TARGET` with stdout to
/// `stdout`, stderr piped, and the signals the tests send at their
/// default actions (caught, even where this test run inherited an
/// ignored SIGINT).
fn spawn_replay(
    trace: &Path,
    target: &Path,
    option: &str,
    stdout: std::process::Stdio,
) -> std::process::Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_plugio"));
    common::set_sigint(&mut cmd, nix::sys::signal::SigHandler::SigDfl);
    cmd.arg("replay")
        .arg(trace)
        .args([option, "--filename"])
        .arg(target)
        .stdout(stdout)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the plugio binary runs")
}

#[test]
fn cli_sigint_and_sigterm_stop_the_replay_print_the_report_so_far_and_remove_its_target() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    use std::os::unix::process::ExitStatusExt;
    let dir = tmpdir();
    // Two IOs at once, then one a minute later: the replay waits for it.
    let trace = dir.path().join("long.csv");
    std::fs::write(
        &trace,
        "time_ns,op,offset_bytes,len_bytes\n0,W,0,4096\n1000,R,0,4096\n60000000000,R,4096,4096\n",
    )
    .unwrap();
    for sig in [Signal::SIGINT, Signal::SIGTERM] {
        let target = dir.path().join(format!("{sig}.img"));
        let child = spawn_replay(&trace, &target, "--json", std::process::Stdio::piped());
        // The target exists once the handler is in place (it is installed
        // before the trace is read).
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !target.exists() {
            assert!(
                std::time::Instant::now() < deadline,
                "{sig}: no target made"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        kill(Pid::from_raw(child.id() as i32), sig).unwrap();
        let o = common::output_guarded(child, 60, &format!("replay after {sig}"));
        assert_eq!(o.status.signal(), Some(sig as i32), "{sig}: {}", stderr(&o));
        let v: Value = serde_json::from_slice(&o.stdout).expect("the report so far, as JSON");
        assert_eq!(v["interrupted"], true, "{sig}");
        assert!(
            u(&v, &["ios"]) <= 2,
            "{sig}: the IO a minute on was not issued"
        );
        assert!(
            !target.exists(),
            "{sig}: the target the run made is removed"
        );
    }
}

/// Two signals back to back: the second ends the replay at once, and the
/// target the run created is removed all the same (it was left behind:
/// found by a break-it helper). A target that existed is never removed.
#[test]
fn cli_two_signals_back_to_back_remove_the_target_the_replay_created() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    use std::os::unix::process::ExitStatusExt;
    let dir = tmpdir();
    // One write at once, then one read a minute later: the replay waits.
    let trace = dir.path().join("long.csv");
    std::fs::write(
        &trace,
        "time_ns,op,offset_bytes,len_bytes\n0,W,0,4096\n60000000000,R,4096,4096\n",
    )
    .unwrap();
    for existing in [false, true] {
        let target = dir.path().join(format!("existing-{existing}.img"));
        if existing {
            std::fs::write(&target, vec![0u8; 1 << 20]).unwrap();
        }
        let child = spawn_replay(&trace, &target, "--quiet", std::process::Stdio::null());
        // The write at time 0 landed (nonzero bytes): the replay runs, past
        // the point where it made the target.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !std::fs::read(&target).is_ok_and(|d| d.iter().any(|&b| b != 0)) {
            assert!(std::time::Instant::now() < deadline, "no write landed");
            std::thread::sleep(Duration::from_millis(10));
        }
        let pid = Pid::from_raw(child.id() as i32);
        kill(pid, Signal::SIGUSR1).unwrap();
        kill(pid, Signal::SIGUSR2).unwrap();
        let o = common::output_guarded(child, 60, "replay after two signals");
        let by = o.status.signal();
        assert!(
            by == Some(libc::SIGUSR1) || by == Some(libc::SIGUSR2),
            "{:?}: {}",
            o.status,
            stderr(&o)
        );
        assert_eq!(target.exists(), existing, "existing {existing}");
    }
}

#[test]
fn cli_limit_reads_an_endless_standard_input_only_as_far_as_it_needs() {
    use std::io::Write as _;
    let dir = tmpdir();
    let target = dir.path().join("t.img");
    let mut child = Command::new(env!("CARGO_BIN_EXE_plugio"))
        .args([
            "replay", "-", "--json", "--quiet", "--timing", "none", "--limit", "10",
        ])
        .arg("--filename")
        .arg(&target)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the plugio binary runs");
    // A producer that never ends on its own (as `yes 0,R,0,512`): it
    // stops when the replay closes its end, at most after 64 MiB.
    let mut stdin = child.stdin.take().unwrap();
    let producer = std::thread::spawn(move || {
        let chunk = "0,R,0,512\n".repeat(4096);
        let mut sent = 0usize;
        while sent < 64 << 20 && stdin.write_all(chunk.as_bytes()).is_ok() {
            sent += chunk.len();
        }
        sent
    });
    let o = child.wait_with_output().unwrap();
    let sent = producer.join().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert_eq!(u(&v, &["ios"]), 10);
    assert!(
        sent < 64 << 20,
        "the replay read all {sent} bytes the producer offered"
    );
}

#[test]
fn cli_a_replay_that_cannot_fit_in_memory_is_refused_before_the_target_is_made() {
    let dir = tmpdir();
    // 4,096 reads of 2 GiB - 4 KiB at --iodepth 4096 would hold 8 TiB of
    // buffers; 100,000 cores would take 800 GB beside them.
    let big = dir.path().join("big.csv");
    let mut text = String::from("time_ns,op,offset_bytes,len_bytes\n");
    for i in 0..4096u64 {
        text.push_str(&format!("{i},R,{},2147479552\n", i * 2147479552));
    }
    std::fs::write(&big, text).unwrap();
    let small = data("small.csv");
    for (trace, extra, want) in [
        (
            big.display().to_string(),
            "--iodepth=4096",
            "largest IOs in flight at --iodepth 4096",
        ),
        (small, "--cpus=100000", "for --cpus 100000"),
    ] {
        let target = dir.path().join("never");
        let t = target.display().to_string();
        let o = plugio(&[
            "replay",
            &trace,
            "--filename",
            &t,
            "--timing",
            "none",
            extra,
        ]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{extra}: {err}");
        assert!(
            err.contains(want) && err.contains("lower --iodepth or --cpus"),
            "{err}"
        );
        assert!(!target.exists(), "{extra}: the target was made");
    }
}

#[test]
fn cli_bad_options_exit_2_with_a_message() {
    let dir = tmpdir();
    let t = dir.path().join("x").display().to_string();
    let trace = data("small.csv");
    for (extra, want) in [
        (&["--iodepth", "0"][..], "--iodepth 0 is out of range"),
        (&["--cpus", "0"][..], "--cpus 0"),
        (&["--limit", "0"][..], "--limit 0"),
        (
            &["--verify", "--overlap-order", "0"][..],
            "--verify needs overlapping IOs",
        ),
    ] {
        let mut args = vec!["replay", &trace, "--filename", &t, "--quiet"];
        args.extend_from_slice(extra);
        let o = plugio(&args);
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(want), "{extra:?}: {}", stderr(&o));
    }
}

fn shared_trace(name: &str) -> String {
    let p: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/traces")
        .join(name)
        .join("q.csv.zst");
    assert!(
        p.exists(),
        "{} is missing: the shared traces must be at ../shared relative to the repository",
        p.display()
    );
    p.display().to_string()
}

fn shared_trace_replays_and_verifies(name: &str) {
    let dir = tmpdir();
    let target = dir.path().join(format!("{name}.img"));
    let v = replay_json(
        &shared_trace(name),
        &target,
        &[
            "--limit",
            "20000",
            "--timing",
            "none",
            "--verify",
            "--iodepth",
            "32",
        ],
    );
    assert_eq!(u(&v, &["ios"]), 20000, "{v}");
    assert_eq!(u(&v, &["engine", "bios"]), 20000);
    assert_eq!(u(&v, &["verify", "mismatched_sectors"]), 0);
    assert!(u(&v, &["verify", "final_sectors_checked"]) > 0);
    let e = &v["engine"];
    // Every bio ends in a request, merged or not; IOs above the request
    // limit (the 8 MiB writes) are split into several.
    assert!(u(e, &["requests"]) + u(e, &["merges"]) >= 20000, "{e}");
    assert!(e["ios_per_call"].as_f64().is_some(), "{e}");
}

#[test]
fn cli_replays_the_shared_postgres_trace_and_verifies() {
    shared_trace_replays_and_verifies("postgres");
}

#[test]
fn cli_replays_the_shared_sqlite_trace_and_verifies() {
    shared_trace_replays_and_verifies("sqlite");
}

/// A trace without writes replayed onto a target it created reads only
/// holes: the report says so (found by a break-it helper). A running
/// program's file (ETXTBSY) is an unwritable target like the others (exit
/// 2, it was 1).
#[test]
fn a_reads_only_trace_on_a_created_target_gets_a_note_and_a_busy_program_is_refused() {
    let dir = tmpdir();
    let trace = dir.path().join("reads.csv");
    std::fs::write(&trace, "time_ns,op,offset_bytes,len_bytes\n0,R,0,4096\n").expect("trace");
    let trace = trace.to_str().expect("utf-8");
    let v = replay_json(trace, &dir.path().join("created"), &["--timing", "none"]);
    assert_eq!(v["created"], true);
    let notes = v["notes"].to_string();
    assert!(
        notes.contains("never writes it: every read reads a hole"),
        "{notes}"
    );
    // Most reads before any write of their range (a database's trace
    // reads its old data): said with the count.
    let early = dir.path().join("early.csv");
    std::fs::write(
        &early,
        "time_ns,op,offset_bytes,len_bytes\n0,R,0,4096\n1,W,0,4096\n2,R,0,4096\n3,R,8192,4096\n\
         4,R,16384,4096\n",
    )
    .expect("trace");
    let v = replay_json(
        early.to_str().expect("utf-8"),
        &dir.path().join("early"),
        &["--timing", "none"],
    );
    let notes = v["notes"].to_string();
    assert!(
        notes.contains("3 of its 4 reads (75%) read ranges the trace had not written"),
        "{notes}"
    );
    // A trace that writes what it reads, but for 1 read in 3
    // (small.csv): no note.
    let v = replay_json(
        &data("small.csv"),
        &dir.path().join("written"),
        &["--timing", "none"],
    );
    assert!(!v["notes"].to_string().contains("hole"), "{}", v["notes"]);

    let prog = dir.path().join("busy");
    std::fs::copy("/bin/sleep", &prog).expect("copy sleep");
    let writes = dir.path().join("writes.csv");
    std::fs::write(&writes, "time_ns,op,offset_bytes,len_bytes\n0,W,0,4096\n").expect("trace");
    // Another test's fork may hold the copy's write descriptor for a
    // moment (the fork/exec race of a freshly written executable): exec
    // again until that fork has exec'd or exited.
    let mut running = loop {
        match Command::new(&prog).arg("30").spawn() {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            other => break other.expect("run it"),
        }
    };
    let o = plugio(&[
        "replay",
        writes.to_str().expect("utf-8"),
        "--filename",
        prog.to_str().expect("utf-8"),
        "--direct",
        "0",
        "--quiet",
    ]);
    let _ = running.kill();
    let _ = running.wait();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("a running program's file"),
        "{}",
        stderr(&o)
    );
}

/// A target the replay may not write is bad input (exit 2, saying what to
/// give), as bench's writing job on it is; it was an engine error (exit
/// 1). Made with `chattr +i` (root, a file system with the flag);
/// skipped where that cannot be set.
#[test]
fn an_unwritable_target_is_refused_as_bad_input() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("dir");
    let target = dir.path().join("immutable.img");
    std::fs::write(&target, vec![0u8; 1 << 20]).expect("target");
    let set = Command::new("chattr").arg("+i").arg(&target).status();
    if !matches!(set, Ok(s) if s.success()) {
        eprintln!("SKIP: chattr +i is not available here");
        return;
    }
    let o = plugio(&[
        "replay",
        &data("small.csv"),
        "--filename",
        target.to_str().expect("utf-8"),
        "--quiet",
    ]);
    let _ = Command::new("chattr").arg("-i").arg(&target).status();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("cannot be written"), "{err}");
    // A file on a read-only file system (EROFS): a tmpfs mounted, filled,
    // remounted read-only.
    let ro = dir.path().join("ro");
    std::fs::create_dir(&ro).expect("mount point");
    let mounted = |args: &[&str]| {
        Command::new("mount")
            .args(args)
            .arg(&ro)
            .status()
            .is_ok_and(|s| s.success())
    };
    if !mounted(&["-t", "tmpfs", "-o", "size=4m", "tmpfs"]) {
        eprintln!("SKIP: cannot mount a tmpfs here");
        return;
    }
    let img = ro.join("t.img");
    std::fs::write(&img, vec![0u8; 1 << 20]).expect("target");
    let o = if mounted(&["-o", "remount,ro"]) {
        Some(plugio(&[
            "replay",
            &data("small.csv"),
            "--filename",
            img.to_str().expect("utf-8"),
            "--direct",
            "0",
            "--quiet",
        ]))
    } else {
        None
    };
    let _ = Command::new("umount").arg(&ro).status();
    if let Some(o) = o {
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(err.contains("read-only"), "{err}");
    }
}

/// A read-only block device (`losetup -r`): Linux opens it for writing
/// and fails each write with EPERM, so a replay failed at its first write
/// (exit 1) and bench's writing job too. Both now refuse it as bad input
/// (exit 2) saying the device is read-only and how that is undone; a
/// read job, a `randrw` job with 100 % reads and a trace without writes
/// still run on it (the last two were refused by the first fix: found by
/// a break-it helper). Root only (skipped otherwise).
#[test]
fn a_read_only_block_device_is_refused_as_bad_input() {
    struct Detach(String);
    impl Drop for Detach {
        fn drop(&mut self) {
            let _ = Command::new("losetup").arg("-d").arg(&self.0).status();
        }
    }
    let backing = tempfile::NamedTempFile::new_in(env!("CARGO_TARGET_TMPDIR")).expect("backing");
    backing.as_file().set_len(4 << 20).expect("size");
    let made = Command::new("losetup")
        .args(["--find", "--show", "-r"])
        .arg(backing.path())
        .output();
    let dev = match made {
        Ok(o) if o.status.success() => Detach(String::from_utf8_lossy(&o.stdout).trim().to_owned()),
        _ => {
            eprintln!("SKIP: cannot make a loop device here (needs root)");
            return;
        }
    };
    let replay = plugio(&[
        "replay",
        &data("small.csv"),
        "--filename",
        &dev.0,
        "--quiet",
    ]);
    let err = String::from_utf8_lossy(&replay.stderr);
    assert_eq!(replay.status.code(), Some(2), "{err}");
    assert!(
        err.contains("block device is read-only") && err.contains("losetup -r"),
        "{err}"
    );
    let reads = backing.path().with_extension("reads.csv");
    std::fs::write(
        &reads,
        "time_ns,op,offset_bytes,len_bytes\n0,R,0,4096\n1000,R,4096,4096\n2000,F,0,0\n",
    )
    .expect("trace");
    let replay = plugio(&[
        "replay",
        reads.to_str().expect("utf-8"),
        "--filename",
        &dev.0,
        "--verify",
        "--json",
        "--quiet",
    ]);
    let _ = std::fs::remove_file(&reads);
    let out = String::from_utf8_lossy(&replay.stdout);
    assert!(
        replay.status.success(),
        "{}",
        String::from_utf8_lossy(&replay.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("json");
    assert_eq!(v["trace_ios"], serde_json::json!([2, 0, 1, 0]), "{out}");
    // A block device this user may not open at all is bad input too, for
    // replay and bench alike (replay measured it first and failed with
    // exit 1: found by a break-it helper). Run as nobody where setpriv is.
    let as_nobody = |args: &[&str]| {
        Command::new("setpriv")
            .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
            .arg(env!("CARGO_BIN_EXE_plugio"))
            .args(args)
            .output()
    };
    let small = data("small.csv");
    match as_nobody(&["replay", &small, "--filename", &dev.0, "--quiet"]) {
        Ok(o) if o.status.code() != Some(127) && !stderr(&o).contains("setpriv:") => {
            assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
            assert!(
                stderr(&o).contains("cannot be read (permission denied)"),
                "{}",
                stderr(&o)
            );
            let o = as_nobody(&["bench", "--filename", &dev.0, "--rw", "randread", "--quiet"])
                .expect("setpriv ran before");
            assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
            assert!(
                stderr(&o).contains("cannot be read (permission denied)"),
                "{}",
                stderr(&o)
            );
        }
        _ => eprintln!("SKIP: setpriv cannot run plugio as nobody here"),
    }
    let bench = |rw: &str| {
        plugio(&[
            "bench",
            "--filename",
            &dev.0,
            "--rw",
            rw,
            "--size",
            "1m",
            "--number_ios",
            "64",
            "--quiet",
        ])
    };
    let w = bench("randwrite");
    let err = String::from_utf8_lossy(&w.stderr);
    assert_eq!(w.status.code(), Some(2), "{err}");
    assert!(err.contains("block device is read-only"), "{err}");
    let r = bench("randread");
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let all_reads = plugio(&[
        "bench",
        "--filename",
        &dev.0,
        "--rw",
        "randrw",
        "--rwmixread",
        "100",
        "--size",
        "1m",
        "--number_ios",
        "64",
        "--quiet",
    ]);
    assert!(
        all_reads.status.success(),
        "{}",
        String::from_utf8_lossy(&all_reads.stderr)
    );
    nop_jobs_run_on(&dev.0);
}

/// NOPs touch no data: a writing pattern's NOP jobs run on the read-only
/// device `dev` (found by a break-it helper: refused as a write).
fn nop_jobs_run_on(dev: &str) {
    for engine in [&["--engine", "nop"][..], &["--engine", "raw", "--nop"][..]] {
        let nops = plugio(
            &[
                &["bench", "--filename", dev, "--rw", "randwrite"][..],
                engine,
                &["--number_ios", "64", "--quiet"][..],
            ]
            .concat(),
        );
        assert!(
            nops.status.success(),
            "{engine:?}: {}",
            String::from_utf8_lossy(&nops.stderr)
        );
    }
}

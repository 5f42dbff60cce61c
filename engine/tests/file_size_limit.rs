//! A write to a regular file that would end past the process's file size
//! limit (`RLIMIT_FSIZE`, `ulimit -f`) is refused before submission with
//! `InvalidInput::FileSizeLimit` (errno `EFBIG`), where the kernel would
//! have sent `SIGXFSZ` to the submitting thread and ended the process (an
//! `O_DIRECT` write runs inline in `io_uring_enter`, in that thread).
//! Writes below and up to the limit go, and a limit raised after the open
//! is seen (the refusal reads it again). Write zeroes, an allocating
//! `fallocate` and `set_len` past the limit are refused the same way; a
//! program that ignores SIGXFSZ gets the kernel's `EFBIG` instead. The
//! device crate's `File` API is held to it the same way.
//!
//! The limit is the whole process's, and the other tests of this binary
//! write files, so the checks run in a child: this test binary started
//! again with only this test selected, an environment variable set and the
//! limit lowered between fork and exec. Before the fix the child died of
//! SIGXFSZ at the first write past the limit.

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::Command;

use plugio_device::{ErrorKind, InvalidInput, OpKind};
use plugio_engine::FallocateMode;

mod common;
use common::{local, open_direct, tmpdir};

/// Set in the child run of the test.
const CHILD_ENV: &str = "PLUGIO_TEST_FILE_SIZE_LIMIT_CHILD";
/// The child's soft limit, bytes.
const LIMIT: u64 = 1 << 20;
/// What the child prints when every check passed (a filter that selected
/// no test would also exit 0).
const PASSED: &str = "file size limit checks passed";
const TEST: &str = "a_write_past_the_file_size_limit_is_refused_before_submission";

#[test]
fn a_write_past_the_file_size_limit_is_refused_before_submission() {
    if std::env::var_os(CHILD_ENV).is_some() {
        child_checks();
        println!("{PASSED}");
        return;
    }
    let mut cmd = Command::new(std::env::current_exe().expect("test binary"));
    cmd.args(["--exact", TEST, "--nocapture", "--test-threads", "1"])
        .env(CHILD_ENV, "1");
    // SAFETY: the closure runs in the child between fork and exec and only
    // calls setrlimit, a system call that allocates nothing and takes no
    // lock.
    unsafe {
        // The hard limit stays: the child raises its soft limit later.
        cmd.pre_exec(|| set_soft_limit(LIMIT));
    }
    let o = cmd.output().expect("the test binary runs again");
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success() && out.contains(PASSED),
        "child: {:?} (signal {:?})\nstdout: {out}\nstderr: {err}",
        o.status,
        o.status.signal()
    );
}

/// Sets the soft file size limit to `bytes`, the hard one to no limit
/// (which it is, unless the test runs under a lowered hard limit: then the
/// child fails and says so).
fn set_soft_limit(bytes: u64) -> std::io::Result<()> {
    let limit = libc::rlimit {
        rlim_cur: bytes,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: `limit` is a valid `rlimit` for the call's duration.
    if unsafe { libc::setrlimit(libc::RLIMIT_FSIZE, &limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The checks, in the child with the limit lowered.
fn child_checks() {
    let dir = tmpdir();
    let path = dir.path().join("limited.bin");
    std::fs::File::create(&path).expect("create an empty file");
    local().run(async {
        let dev = open_direct(&path, true);
        let block = |fill: u8| {
            let mut b = dev.alloc_buf(4096);
            b.as_mut_slice().fill(fill);
            b
        };
        // Below the limit, and up to it exactly: written.
        let (r, _) = dev.write_at(block(1), 0).await;
        assert_eq!(r.expect("a write below the limit"), 4096);
        let (r, _) = dev.write_at(block(2), LIMIT - 4096).await;
        assert_eq!(r.expect("a write that ends at the limit"), 4096);
        // Across it, and at it: refused, naming the write and the limit.
        for (offset_bytes, len_bytes) in [(LIMIT - 4096, 8192), (LIMIT, 4096)] {
            let (r, _) = dev
                .write_at(dev.alloc_buf(len_bytes as usize), offset_bytes)
                .await;
            let e = r.expect_err("a write past the limit is refused");
            assert_eq!(
                *e.kind(),
                ErrorKind::InvalidInput(InvalidInput::FileSizeLimit {
                    op: Some(OpKind::Write),
                    offset_bytes,
                    len_bytes,
                    limit_bytes: LIMIT,
                }),
                "{e}"
            );
            assert_eq!(e.errno(), libc::EFBIG);
            assert!(e.to_string().contains("RLIMIT_FSIZE"), "{e}");
        }
        // Nothing was sent: the file ends at the limit.
        assert_eq!(std::fs::metadata(&path).expect("stat").len(), LIMIT);
        // A read past the limit is no write: it goes (and finds the end).
        let (r, _) = dev.read_at(dev.alloc_buf(4096), LIMIT).await;
        assert_eq!(r.expect("a read past the limit"), 0);
        // Ops that grow the file are held to it too: write zeroes, an
        // allocating fallocate, set_len. Keeping the size, they go.
        let e = dev
            .write_zeroes(LIMIT, 4096)
            .await
            .expect_err("zeroes past it");
        assert_eq!(refused_op(e), Some(OpKind::WriteZeroes));
        let e = dev
            .fallocate(LIMIT - 4096, 8192, FallocateMode::Allocate)
            .await
            .expect_err("an allocation past it");
        assert_eq!(refused_op(e), Some(OpKind::Fallocate { mode: 0 }));
        dev.fallocate(LIMIT, 4096, FallocateMode::AllocateKeepSize)
            .await
            .expect("an allocation that keeps the size");
        let e = dev.set_len(LIMIT + 1).await.expect_err("set_len past it");
        assert_eq!(refused_op(e), None);
        dev.set_len(LIMIT).await.expect("set_len to the limit");
        assert_eq!(std::fs::metadata(&path).expect("stat").len(), LIMIT);
        // A program that ignores SIGXFSZ gets the kernel's answer, as from
        // pwrite(2): no refusal before submission.
        // SAFETY: setting a signal's action to SIG_IGN and back.
        unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
        let (r, _) = dev.write_at(block(4), LIMIT).await;
        match r {
            Err(e) => assert_eq!(e.errno(), libc::EFBIG, "{e}"),
            Ok(n) => panic!("a write past the limit wrote {n} bytes"),
        }
        // One that crosses it comes back short, with the bytes that landed
        // (the rest, issued again at the limit, got EFBIG), and a full
        // write says where it stopped.
        let mut two = dev.alloc_buf(8192);
        two.as_mut_slice().fill(4);
        let (r, _) = dev.write_at(two, LIMIT - 4096).await;
        assert_eq!(r.expect("a write across the limit is short"), 4096);
        let (r, _) = dev.write_all_at(vec![4u8; 8192], LIMIT - 4096).await;
        let e = r.expect_err("a full write across the limit");
        assert!(
            matches!(
                e.kind(),
                ErrorKind::WriteZero {
                    done_bytes: 4096,
                    ..
                }
            ),
            "{e}"
        );
        // SAFETY: as above.
        unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_DFL) };
        other_file_apis(&path).await;
        // The limit raised after the open: the same write goes.
        set_soft_limit(libc::RLIM_INFINITY).expect("raise the soft limit");
        let (r, _) = dev.write_at(block(3), LIMIT).await;
        assert_eq!(r.expect("a write once the limit is raised"), 4096);
        assert_eq!(std::fs::metadata(&path).expect("stat").len(), LIMIT + 4096);
        // A file already longer than the limit (grown while it was raised,
        // then the limit lowered again): what does not grow it goes, as
        // the kernel lets it (shrinking, allocating or zeroing inside);
        // a write past the limit is refused wherever it lands.
        dev.set_len(4 * LIMIT)
            .await
            .expect("grow while the limit is raised");
        set_soft_limit(LIMIT).expect("lower the soft limit again");
        dev.set_len(3 * LIMIT).await.expect("shrink past the limit");
        dev.fallocate(2 * LIMIT, 8192, FallocateMode::Allocate)
            .await
            .expect("allocate inside the file");
        dev.write_zeroes(2 * LIMIT, 8192)
            .await
            .expect("zeroes inside the file");
        let (r, _) = dev.write_at(block(6), 2 * LIMIT).await;
        assert_eq!(
            refused_op(r.expect_err("a write inside, past the limit")),
            Some(OpKind::Write)
        );
        let e = dev
            .set_len(3 * LIMIT + 4096)
            .await
            .expect_err("grow past the limit");
        assert_eq!(refused_op(e), None);
        assert!(e_text_says_grow(&dev, 3 * LIMIT + 4096).await);
        assert_eq!(std::fs::metadata(&path).expect("stat").len(), 3 * LIMIT);
    });
}

/// The op of a `FileSizeLimit` refusal (`None`: `set_len`).
fn refused_op(e: plugio_device::Error) -> Option<OpKind> {
    match e.kind() {
        ErrorKind::InvalidInput(InvalidInput::FileSizeLimit { op, .. }) => *op,
        other => panic!("expected FileSizeLimit, got {other:?}: {e}"),
    }
}

/// The blocking pool's backend and the device crate's own `File` API on
/// a second file beside `path`, under the lowered limit.
async fn other_file_apis(path: &std::path::Path) {
    // The blocking pool's backend, whose calls run in a thread of the
    // process (its threads block SIGXFSZ now, but the check comes first).
    let sync_path = path.with_extension("sync");
    std::fs::File::create(&sync_path).expect("create a second file");
    let sync = plugio_engine::Device::open(
        &sync_path,
        plugio_engine::DeviceOptions {
            backend: plugio_device::BackendKind::Sync,
            direct: false,
            ..plugio_engine::DeviceOptions::default()
        },
    )
    .expect("open on the blocking pool's backend");
    let e = sync
        .write_zeroes(LIMIT, 4096)
        .await
        .expect_err("zeroes past it");
    assert_eq!(refused_op(e), Some(OpKind::WriteZeroes));
    let (r, _) = sync.write_at(vec![5u8; 4096], LIMIT).await;
    assert_eq!(
        refused_op(r.expect_err("a write past it")),
        Some(OpKind::Write)
    );
    let (r, _) = sync.write_at(vec![5u8; 4096], LIMIT - 4096).await;
    assert_eq!(r.expect("a write below it"), 4096);
    // The device crate's own file API is held to it the same way.
    let file = plugio_device::File::open(path).expect("open as a device::File");
    let (r, _) = file.write_at(file.alloc_buf(4096), LIMIT).await;
    let e = r.expect_err("a device::File write past the limit is refused");
    assert!(
        matches!(
            e.kind(),
            ErrorKind::InvalidInput(InvalidInput::FileSizeLimit { .. })
        ),
        "{e}"
    );
    let (r, _) = file.write_at(file.alloc_buf(4096), 0).await;
    assert_eq!(r.expect("a device::File write below the limit"), 4096);
}

/// Whether `set_len(len_bytes)` of `dev` is refused saying it grows the file.
async fn e_text_says_grow(dev: &plugio_engine::Device, len_bytes: u64) -> bool {
    dev.set_len(len_bytes)
        .await
        .is_err_and(|e| e.to_string().contains("would grow the file past"))
}

//! Range ops longer than one request (`MAX_IO_BYTES`, 2 GiB less a page):
//! discard, write zeroes and fallocate over ranges of several GiB are
//! split into parts of `RANGE_PART_BYTES`, change exactly their range
//! (4 KiB marks written around every part boundary and just outside the
//! range say so), and are refused as a whole, naming the caller's range,
//! before any part is issued. On ext4 (a directory under the target dir)
//! and tmpfs (/dev/shm). The files are sparse: only the marks and the
//! ranges the ops allocate take space.

mod common;

use plugio_device::{ErrorKind, InvalidInput, RingConfig};
use plugio_engine::{
    Device, DeviceOptions, FallocateMode, MAX_IO_BYTES, MAX_RANGE_BYTES, RANGE_PART_BYTES,
};

const GIB: u64 = 1 << 30;
const MARK_BYTES: u64 = 4096;

/// The byte a mark at `offset` is filled with (never 0).
fn mark_byte(offset: u64) -> u8 {
    (offset / MARK_BYTES % 251) as u8 + 1
}

/// The offsets of the marks around `[start, start + len)`: the page just
/// before it, its first page, the pages on both sides of every part
/// boundary, its last page and the page just after it.
fn marks(start: u64, len: u64) -> Vec<u64> {
    let end = start + len;
    let mut v = vec![start - MARK_BYTES, start];
    let mut boundary = start + RANGE_PART_BYTES;
    while boundary < end {
        v.extend([boundary - MARK_BYTES, boundary]);
        boundary += RANGE_PART_BYTES;
    }
    v.extend([end - MARK_BYTES, end]);
    v
}

async fn write_marks(dev: &Device, at: &[u64]) {
    for &offset in at {
        let (r, _) = dev
            .write_all_at(vec![mark_byte(offset); MARK_BYTES as usize], offset)
            .await;
        r.expect("write a mark");
    }
}

/// Asserts the marks inside `[start, start + len)` read as zeroes and
/// those outside as written.
async fn check_marks(dev: &Device, at: &[u64], start: u64, len: u64, what: &str) {
    for &offset in at {
        let (r, buf) = dev
            .read_exact_at(vec![0xeeu8; MARK_BYTES as usize], offset)
            .await;
        r.expect("read a mark");
        let inside = offset >= start && offset < start + len;
        let want = if inside { 0 } else { mark_byte(offset) };
        assert!(
            buf.iter().all(|&b| b == want),
            "{what}: the page at {offset:#x} ({}) should read {want:#x}, reads {:#x}",
            if inside { "inside" } else { "outside" },
            buf[0]
        );
    }
}

#[test]
fn range_ops_longer_than_one_request_change_exactly_their_range() {
    const { assert!(RANGE_PART_BYTES <= MAX_IO_BYTES) };
    for (fs_name, dir) in common::fs_dirs() {
        let path = dir.path().join("long.db");
        std::fs::File::create(&path).expect("create");
        let ex = plugio_engine::runtime::local(RingConfig::default()).expect("runtime");
        ex.run(async {
            let dev = common::open_direct(&path, false);
            dev.set_len(8 * GIB).await.expect("a sparse 8 GiB file");

            // Discard: 4 GiB and a few pages, five parts.
            let (start, len) = (3 * MARK_BYTES, 4 * GIB + 2 * MARK_BYTES);
            let at = marks(start, len);
            write_marks(&dev, &at).await;
            let before = dev.iostats().discard.ios;
            dev.discard(start, len).await.expect("discard");
            check_marks(&dev, &at, start, len, &format!("{fs_name}: discard")).await;
            // One request per part: a file takes each part in one
            // fallocate (not one per 1 MiB read/write limit: 4,098).
            assert_eq!(dev.iostats().discard.ios - before, 5, "{fs_name}");

            // Punching a hole is a discard; a range ending at the file's
            // end, three parts.
            let (start, len) = (5 * GIB, 3 * GIB);
            let at = marks(start, len - MARK_BYTES);
            write_marks(&dev, &at[..at.len() - 1]).await;
            dev.fallocate(start, len, FallocateMode::PunchHole)
                .await
                .expect("punch a hole");
            for &offset in &at[1..at.len() - 1] {
                let (r, buf) = dev.read_exact_at(vec![1u8; 4096], offset).await;
                r.expect("read");
                assert!(
                    buf.iter().all(|&b| b == 0),
                    "{fs_name}: hole at {offset:#x}"
                );
            }

            // Write zeroes without the fallback over 2 GiB and two pages
            // (three parts). ext4 zeroes with FALLOC_FL_ZERO_RANGE (unwritten
            // extents: metadata, not 2 GiB of writes); tmpfs has no such
            // mode, so every part fails and nothing changes.
            let (start, len) = (GIB + MARK_BYTES, 2 * GIB + 2 * MARK_BYTES);
            let at = marks(start, len);
            write_marks(&dev, &at).await;
            match dev.write_zeroes_no_fallback(start, len).await {
                Ok(()) => {
                    assert_eq!(fs_name, "ext4");
                    check_marks(&dev, &at, start, len, "ext4: write zeroes").await;
                }
                Err(e) => {
                    assert_eq!(fs_name, "tmpfs", "{e}");
                    assert_eq!(*e.kind(), ErrorKind::Unsupported, "{e}");
                    check_marks(&dev, &at, 0, 0, "tmpfs: refused zeroes").await;
                }
            }

            // Allocate past the file's end, over 2 GiB (ext4 only: tmpfs
            // would take the pages from memory): the size moves to the
            // range's end, as one fallocate would move it.
            if fs_name == "ext4" {
                let (start, len) = (8 * GIB - MARK_BYTES, MAX_IO_BYTES + 2 * MARK_BYTES);
                dev.fallocate(start, len, FallocateMode::Allocate)
                    .await
                    .expect("allocate");
                assert_eq!(
                    dev.metadata().await.expect("metadata").len_bytes,
                    start + len
                );
            }
        });
    }
}

#[test]
fn a_long_range_is_refused_as_a_whole_before_any_part_is_issued() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("disk temp dir");
    let path = dir.path().join("refused.db");
    std::fs::File::create(&path).expect("create");
    let ex = plugio_engine::runtime::local(RingConfig::default()).expect("runtime");
    ex.run(async {
        let dev = common::open_direct(&path, true);
        dev.set_len(4 * GIB).await.expect("a sparse file");
        let at = [0, RANGE_PART_BYTES];
        write_marks(&dev, &at).await;
        // Its length is off the direct-IO alignment: only the last part
        // is, but the error names the whole length, and the first part
        // (valid alone) was not issued.
        let len = 2 * GIB + 100;
        for r in [
            dev.discard(0, len).await,
            dev.write_zeroes(0, len).await,
            dev.fallocate(0, len, FallocateMode::PunchHole).await,
        ] {
            let e = r.expect_err("an unaligned length is refused");
            assert!(
                matches!(e.kind(), ErrorKind::InvalidInput(InvalidInput::Alignment { what: "length", value, .. }) if *value == len),
                "{e}"
            );
        }
        check_marks(&dev, &at, 0, 0, "after refusals").await;
        // Longer than one op takes: refused before a part is counted (a
        // length near i64::MAX asked for billions of bios).
        for len in [MAX_RANGE_BYTES + 4096, (1u64 << 63) - 4096] {
            let e = dev.discard(0, len).await.expect_err("too long");
            assert!(
                matches!(e.kind(), ErrorKind::InvalidInput(InvalidInput::Length { max_bytes, .. }) if *max_bytes == MAX_RANGE_BYTES),
                "{e}"
            );
        }
        // Its end passes i64::MAX, the largest offset the kernel takes.
        let offset = (1u64 << 63) - GIB;
        let e = dev.discard(offset, 3 * GIB).await.expect_err("past i64::MAX");
        assert!(
            matches!(e.kind(), ErrorKind::InvalidInput(InvalidInput::Range { offset_bytes, len_bytes, .. }) if *offset_bytes == offset && *len_bytes == 3 * GIB),
            "{e}"
        );
        drop(dev);
        // A read-only device writes nothing.
        let ro = Device::open(
            &path,
            DeviceOptions {
                read_only: true,
                ..DeviceOptions::default()
            },
        )
        .expect("open read-only");
        let e = ro.discard(0, 3 * GIB).await.expect_err("read-only");
        assert_eq!(*e.kind(), ErrorKind::PermissionDenied, "{e}");
        check_marks(&ro, &at, 0, 0, "after the read-only refusal").await;
    });
}

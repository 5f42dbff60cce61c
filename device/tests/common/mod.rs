//! Shared helpers for the device integration tests.
#![allow(dead_code)]

use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

/// A directory whose file system accepts O_DIRECT: the system temp dir when
/// it does, else the target dir.
pub fn direct_dir() -> PathBuf {
    let candidates = [
        std::env::temp_dir(),
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")),
    ];
    for dir in candidates {
        let probe = dir.join(format!("plugio-direct-probe-{}", std::process::id()));
        let ok = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .custom_flags(libc::O_DIRECT)
            .open(&probe)
            .is_ok();
        let _ = std::fs::remove_file(&probe);
        if ok {
            return dir;
        }
    }
    panic!("no directory supporting O_DIRECT found");
}

/// A fresh temp file path in [`direct_dir`] (deleted with the returned
/// guard).
pub fn temp_file() -> tempfile::NamedTempFile {
    tempfile::NamedTempFile::new_in(direct_dir()).expect("temp file")
}

/// A deterministic pattern: byte i of block `seed` is (i * 7 + seed) mod 251.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u64 * 7 + seed) % 251) as u8)
        .collect()
}

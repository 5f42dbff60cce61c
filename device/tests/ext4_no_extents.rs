//! A file that ext4 maps without extents (made while the file system was
//! ext3) on an ext4 that now has the extent feature: ext4 refuses
//! `FALLOC_FL_ZERO_RANGE` on it while the file system's probe (a new file,
//! with extents) takes it. The open says such a file has no zeroing op,
//! so `write_zeroes` writes the zeroes in program order (taken for
//! supported, the refusal came after later IO; found by a break-it
//! helper). Needs root, `mkfs.ext3`, `tune2fs` and a loop mount; skipped
//! with a message otherwise.

use std::path::{Path, PathBuf};
use std::process::Command;

use plugio_device::{Backend, OpenOptions};

fn run(cmd: &str, args: &[&str]) -> bool {
    Command::new(cmd)
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A 32 MiB image file and an empty mount point in a directory of their
/// own; `None` (the test skipped, with a message) without root.
struct Scratch {
    _dir: tempfile::TempDir,
    image: PathBuf,
    mnt: PathBuf,
}

impl Scratch {
    fn new() -> Option<Scratch> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            println!("SKIPPED: a loop mount needs root");
            return None;
        }
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("dir");
        let image = dir.path().join("fs.img");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).expect("mount point");
        std::fs::File::create(&image)
            .and_then(|f| f.set_len(32 << 20))
            .expect("image");
        Some(Scratch {
            _dir: dir,
            image,
            mnt,
        })
    }

    fn image(&self) -> &str {
        self.image.to_str().expect("utf-8")
    }

    fn mount_point(&self) -> &str {
        self.mnt.to_str().expect("utf-8")
    }
}

/// Unmounts and removes the mount point when dropped.
struct Mounted<'a>(&'a Path);

impl Drop for Mounted<'_> {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0).status();
    }
}

#[test]
fn an_ext4_file_without_extents_has_no_zeroing_op() {
    let Some(scratch) = Scratch::new() else {
        return;
    };
    let (img, at, mnt) = (scratch.image(), scratch.mount_point(), &scratch.mnt);
    if !run("mkfs.ext3", &["-q", "-F", img]) {
        println!("SKIPPED: mkfs.ext3 failed or is missing");
        return;
    }
    {
        if !run("mount", &["-o", "loop", "-t", "ext4", img, at]) {
            println!("SKIPPED: the loop mount failed");
            return;
        }
        let _mounted = Mounted(mnt);
        std::fs::write(mnt.join("old"), vec![0xaa; 1 << 20]).expect("old file");
        std::fs::create_dir(mnt.join("sealed")).expect("dir");
        std::fs::write(mnt.join("sealed/old"), vec![0xaa; 1 << 20]).expect("old file");
    }
    if !run("tune2fs", &["-O", "extent", img]) {
        println!("SKIPPED: tune2fs failed or is missing");
        return;
    }
    if !run("mount", &["-o", "loop", "-t", "ext4", img, at]) {
        println!("SKIPPED: the second loop mount failed");
        return;
    }
    let _mounted = Mounted(mnt);
    std::fs::write(mnt.join("new"), vec![0xaa; 1 << 20]).expect("new file");
    let open = |name: &str| {
        OpenOptions::new()
            .direct(false)
            .open(mnt.join(name))
            .expect("open")
    };
    // In a directory where the file system's probe cannot make its file
    // (immutable), and before any other open there has kept the file
    // system's answer: still known from the file itself.
    let sealed = mnt.join("sealed");
    let sealed = sealed.to_str().expect("utf-8");
    if run("chattr", &["+i", sealed]) {
        let support = open("sealed/old").write_zeroes_support();
        run("chattr", &["-i", sealed]);
        assert_eq!(support, Some(false), "no extents, no probe: refused");
    } else {
        println!("SKIPPED (part): chattr +i failed");
    }
    let (old, new) = (open("old"), open("new"));
    assert_eq!(
        old.write_zeroes_support(),
        Some(false),
        "no extents: refused"
    );
    assert_eq!(new.write_zeroes_support(), Some(true), "extents: taken");
    drop((old, new));
}

/// A file whose data lives in its inode (ext4's `inline_data`) has no
/// extent flag, yet ext4 zeroes a range of it (it moves the data out
/// first): it keeps the file system's zeroing op. It was said to have
/// none, so `write_zeroes` wrote every zero and refused ranges over
/// 64 GiB (found by a reviewer). Needs root, `mkfs.ext4` with
/// `inline_data` and a loop mount; skipped with a message otherwise.
#[test]
fn an_ext4_file_with_inline_data_keeps_its_zeroing_op() {
    let Some(scratch) = Scratch::new() else {
        return;
    };
    let (img, at, mnt) = (scratch.image(), scratch.mount_point(), &scratch.mnt);
    if !run("mkfs.ext4", &["-q", "-F", "-O", "inline_data", img]) {
        println!("SKIPPED: mkfs.ext4 -O inline_data failed or is missing");
        return;
    }
    if !run("mount", &["-o", "loop", img, at]) {
        println!("SKIPPED: the loop mount failed");
        return;
    }
    let _mounted = Mounted(mnt);
    std::fs::write(mnt.join("tiny"), b"hello").expect("tiny file");
    let tiny = OpenOptions::new()
        .direct(false)
        .open(mnt.join("tiny"))
        .expect("open");
    assert_eq!(
        tiny.write_zeroes_support(),
        Some(true),
        "inline data: taken"
    );
    drop(tiny);
    // What the kernel does with it: the range is zeroed, and the file now
    // maps its blocks with extents.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(mnt.join("tiny"))
        .expect("reopen");
    // SAFETY: fallocate on a live descriptor.
    let rc = unsafe {
        libc::fallocate(
            std::os::fd::AsRawFd::as_raw_fd(&file),
            libc::FALLOC_FL_ZERO_RANGE,
            0,
            1 << 20,
        )
    };
    assert_eq!(rc, 0, "ext4 zeroes a range of an inline file");
    assert_eq!(
        std::fs::read(mnt.join("tiny")).expect("read").len(),
        1 << 20
    );
}

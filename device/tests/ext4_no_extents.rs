//! A file that ext4 maps without extents (made while the file system was
//! ext3) on an ext4 that now has the extent feature: ext4 refuses
//! `FALLOC_FL_ZERO_RANGE` on it while the file system's probe (a new file,
//! with extents) takes it. The open says such a file has no zeroing op,
//! so `write_zeroes` writes the zeroes in program order (taken for
//! supported, the refusal came after later IO; found by a break-it
//! helper). Needs root, `mkfs.ext3`, `tune2fs` and a loop mount; skipped
//! with a message otherwise.

use std::path::Path;
use std::process::Command;

use plugio_device::{Backend, OpenOptions};

fn run(cmd: &str, args: &[&str]) -> bool {
    Command::new(cmd)
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success())
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
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("SKIPPED: a loop mount needs root");
        return;
    }
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("dir");
    let image = dir.path().join("ext3.img");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).expect("mount point");
    std::fs::File::create(&image)
        .and_then(|f| f.set_len(32 << 20))
        .expect("image");
    let (img, at) = (image.to_str().expect("utf-8"), mnt.to_str().expect("utf-8"));
    if !run("mkfs.ext3", &["-q", "-F", img]) {
        println!("SKIPPED: mkfs.ext3 failed or is missing");
        return;
    }
    {
        if !run("mount", &["-o", "loop", "-t", "ext4", img, at]) {
            println!("SKIPPED: the loop mount failed");
            return;
        }
        let _mounted = Mounted(&mnt);
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
    let _mounted = Mounted(&mnt);
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

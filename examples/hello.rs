//! Hello, plugio: writes a few pages to a file and reads them back through
//! the whole path (bio, plug, tags, io_uring, completion), then prints the
//! device's iostats.
//!
//! Run: `cargo run --release --example hello [PATH]` (default: a file in
//! a temporary directory made in the current directory, where `O_DIRECT`
//! is likelier to work than on a tmpfs `/tmp`; removed at exit). A PATH
//! given is overwritten: its size set to 1 MiB and its first 32 KiB
//! written.

// ANCHOR: main
use plugio::{OpenOptions, RingConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A scratch directory only when no PATH is given (removed at exit).
    let (path, scratch) = match std::env::args().nth(1) {
        Some(p) => (std::path::PathBuf::from(p), None),
        None => {
            let dir = tempfile::tempdir_in(std::env::current_dir()?)?;
            (dir.path().join("hello.db"), Some(dir))
        }
    };

    let ex = plugio::runtime::local(RingConfig::default())?;
    ex.run(async {
        // Opened (O_DIRECT) and sized through io_uring, like all the IO.
        let dev = OpenOptions::new().create(true).open(&path).await?;
        dev.set_len(1 << 20).await?;
        // Eight 4 KiB writes issued in one tick: one plug, merged into one
        // request, one io_uring_enter.
        let writes = (0..8u8).map(|i| {
            let dev = dev.clone();
            async move {
                let mut page = dev.alloc_buf(4096);
                page.as_mut_slice().fill(b'a' + i);
                dev.write_at(page, u64::from(i) * 4096).await.0
            }
        });
        for w in futures::future::join_all(writes).await {
            w?;
        }
        dev.sync_all().await?; // fsync: the data and the file's size
        let back = dev.read_alloc_at(0, 8 * 4096).await?;
        for (i, page) in back.as_slice().chunks(4096).enumerate() {
            assert!(page.iter().all(|&b| b == b'a' + i as u8));
        }
        let s = dev.iostats();
        println!(
            "wrote and read back {} bytes of {}{}: {} bios became {} requests ({} merged writes)",
            back.len(),
            path.display(),
            if scratch.is_some() {
                " (removed at exit)"
            } else {
                ""
            },
            s.bios,
            s.requests,
            s.write.merges
        );
        let name = path
            .file_name()
            .map_or("hello.db".into(), |n| n.to_string_lossy());
        println!("{}", s.diskstats_line(&name));
        Ok::<_, plugio::Error>(())
    })?;
    Ok(())
}
// ANCHOR_END: main

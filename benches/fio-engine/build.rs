//! Builds the C shim (`c/plugio_fio.c`) against fio's source tree, and
//! sets `cfg(plugio_fio_shim)` so that the library exports `get_ioengine`.
//!
//! The tree is `FIO_SRC` when set (a configured fio: its `config-host.h`
//! must exist), else the newest `target/fio-src/fio-*` of the workspace
//! that holds a `config-host.h` (where `benches/fio-engine/build.sh` puts
//! Debian's fio source). With neither, nothing is compiled: the Rust side
//! builds and tests (as in `cargo test --workspace` on a machine without
//! fio's source), and fio cannot load the library.

use std::path::{Path, PathBuf};

/// The newest `fio-*` directory under `dir` that has a `config-host.h`.
fn find_fio_tree(dir: &Path) -> Option<PathBuf> {
    let mut trees: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("fio-"))
                && p.join("config-host.h").is_file()
        })
        .collect();
    trees.sort();
    trees.pop()
}

fn main() {
    println!("cargo::rustc-check-cfg=cfg(plugio_fio_shim)");
    println!("cargo::rerun-if-env-changed=FIO_SRC");
    println!("cargo::rerun-if-changed=c/plugio_fio.c");
    println!("cargo::rerun-if-changed=c/plugio_fio.h");
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let default_dir = manifest.join("../../target/fio-src");
    // Only when it exists: a missing path would rerun this script on every
    // build. (build.sh sets FIO_SRC, which reruns it when the tree is new.)
    if default_dir.is_dir() {
        println!("cargo::rerun-if-changed={}", default_dir.display());
    }
    let fio_src = match std::env::var_os("FIO_SRC") {
        Some(dir) => PathBuf::from(dir),
        None => match find_fio_tree(&default_dir) {
            Some(dir) => dir,
            None => return,
        },
    };
    let config_host = fio_src.join("config-host.h");
    if !config_host.is_file() {
        panic!(
            "FIO_SRC={} has no config-host.h: run `./configure && make` in fio's source tree first",
            fio_src.display()
        );
    }
    println!("cargo::rerun-if-changed={}", config_host.display());
    cc::Build::new()
        .file("c/plugio_fio.c")
        .include(&fio_src)
        .include("c")
        // As fio's own build and its skeleton_external.c: config-host.h
        // first, GNU extensions on.
        .flag("-include")
        .flag(config_host.to_str().expect("FIO_SRC is valid UTF-8"))
        .define("_GNU_SOURCE", None)
        .define("_LARGEFILE_SOURCE", None)
        .define("_FILE_OFFSET_BITS", "64")
        .flag("-std=gnu99")
        .warnings(true)
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-sign-compare")
        .flag_if_supported("-Wno-missing-field-initializers")
        .pic(true)
        .compile("plugio_fio_shim");
    println!("cargo::rustc-cfg=plugio_fio_shim");
}

//! Builds the C shim (`c/plugio_fio.c`) against fio's source tree when
//! `FIO_SRC` names one (a configured and built fio: its `config-host.h`
//! must exist), and sets `cfg(plugio_fio_shim)` so that the library
//! exports `get_ioengine`. Without `FIO_SRC` nothing is compiled: the Rust
//! side builds and tests, and fio cannot load the library (see
//! `benches/fio-engine/build.sh`, which always sets it).

use std::path::PathBuf;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(plugio_fio_shim)");
    println!("cargo::rerun-if-env-changed=FIO_SRC");
    println!("cargo::rerun-if-changed=c/plugio_fio.c");
    println!("cargo::rerun-if-changed=c/plugio_fio.h");
    let Some(fio_src) = std::env::var_os("FIO_SRC").map(PathBuf::from) else {
        return;
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

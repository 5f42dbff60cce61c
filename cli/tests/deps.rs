//! The `plugio` library's normal dependency tree names none of the tools
//! of the `plugio` command (issue 14): a database that depends on `plugio`
//! compiles the runtime crates and what they need at run time, not the
//! benchmark peers, plotting, CLI parsing or trace compression.

use std::path::Path;
use std::process::Command;

/// Crates only the CLI, the benchmark peers or the tests may pull in.
const NOT_IN_LIBRARY: &[&str] = &[
    "glommio",
    "tokio",
    "tokio-uring",
    "monoio",
    "compio",
    "plotters",
    "clap",
    "indicatif",
    "zstd",
    "hdrhistogram",
    "serde_json",
    "criterion",
    "proptest",
    "tempfile",
];

fn cargo_tree(package: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let run = |offline: bool| {
        let mut cmd = Command::new(env!("CARGO"));
        cmd.current_dir(&root)
            .args(["tree", "-p", package, "-e", "normal", "--prefix", "none"]);
        if offline {
            cmd.arg("--offline");
        }
        cmd.output().expect("run cargo tree")
    };
    // Offline first: the crates are on disk after the build this test
    // belongs to; online only when the offline index lacks something.
    let out = match run(true) {
        out if out.status.success() => out,
        _ => run(false),
    };
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

fn crate_names(tree: &str) -> Vec<String> {
    let mut names: Vec<String> = tree
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect();
    names.sort();
    names.dedup();
    names
}

#[test]
fn the_library_tree_names_no_cli_or_peer_crate() {
    let names = crate_names(&cargo_tree("plugio"));
    assert!(names.iter().any(|n| n == "plugio-engine"), "{names:?}");
    let found: Vec<&String> = names
        .iter()
        .filter(|n| NOT_IN_LIBRARY.contains(&n.as_str()))
        .collect();
    assert!(
        found.is_empty(),
        "plugio's normal dependency tree has CLI/peer crates {found:?}; move their use to cli/"
    );
}

#[test]
fn the_check_sees_the_cli_crates_where_they_are() {
    // The same check over the CLI crate finds them: the list above is not
    // silently empty because of a parsing mistake.
    let names = crate_names(&cargo_tree("plugio-cli"));
    for expected in [
        "clap",
        "glommio",
        "tokio",
        "plotters",
        "zstd",
        "hdrhistogram",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} missing from {names:?}"
        );
    }
}

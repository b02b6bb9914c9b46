//! Replays the fuzz corpora through the fuzz harness on stable Rust: the
//! seed corpus of every target (`tests/fuzz/corpus/<target>/`) and every
//! input that once crashed it (`tests/fuzz/regressions/<target>/`). Each
//! file must give a value or an error; a panic fails the test with the
//! file's name. Fuzzing itself needs nightly (`packaging/fuzz.sh`).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

#[allow(dead_code)]
#[path = "fuzz/harness.rs"]
mod harness;

fn files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

/// Runs every seed and regression file of `target` through its harness
/// function; returns how many files ran.
fn replay(target: &str) -> usize {
    let run = harness::TARGETS
        .iter()
        .find(|(name, _)| *name == target)
        .map(|(_, run)| *run)
        .expect("a fuzz target of that name");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz");
    let seeds = files(&root.join("corpus").join(target));
    assert!(
        seeds.len() >= 3,
        "tests/fuzz/corpus/{target} has {} seeds",
        seeds.len()
    );
    let regressions = files(&root.join("regressions").join(target));
    let mut panicked = Vec::new();
    for file in seeds.iter().chain(&regressions) {
        let data = std::fs::read(file).expect("read a corpus file");
        if catch_unwind(AssertUnwindSafe(|| run(&data))).is_err() {
            panicked.push(file.display().to_string());
        }
    }
    assert!(panicked.is_empty(), "{target} panicked on {panicked:?}");
    seeds.len() + regressions.len()
}

#[test]
fn fuzz_manifest_corpus_and_regressions_replay() {
    replay("manifest");
}

#[test]
fn fuzz_kubeconfig_corpus_and_regressions_replay() {
    replay("kubeconfig");
}

#[test]
fn fuzz_watch_stream_corpus_and_regressions_replay() {
    replay("watch_stream");
}

#[test]
fn fuzz_http_response_corpus_and_regressions_replay() {
    replay("http_response");
}

#[test]
fn fuzz_docker_config_glob_corpus_and_regressions_replay() {
    replay("docker_config_glob");
}

#[test]
fn fuzz_list_stream_corpus_and_regressions_replay() {
    replay("list_stream");
}

#[test]
fn every_fuzz_target_has_a_binary() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz");
    let cargo = std::fs::read_to_string(root.join("Cargo.toml")).expect("tests/fuzz/Cargo.toml");
    for (target, _) in harness::TARGETS {
        assert!(
            root.join("fuzz_targets")
                .join(format!("{target}.rs"))
                .is_file(),
            "no fuzz_targets/{target}.rs"
        );
        assert!(
            cargo.contains(&format!("name = \"{target}\"")),
            "{target} is not a [[bin]] of tests/fuzz/Cargo.toml"
        );
    }
}

//! Checks of the repository itself: module docs, the one way to spawn
//! threads, no ignored tests, no async runtime in the dependency tree.

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read source dir") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn sources(sub: &str) -> Vec<(PathBuf, String)> {
    let mut files = Vec::new();
    rust_files(&Path::new(env!("CARGO_MANIFEST_DIR")).join(sub), &mut files);
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).expect("read source");
            (p, text)
        })
        .collect()
}

#[test]
fn every_module_says_what_it_owns() {
    let missing: Vec<_> = sources("src")
        .into_iter()
        .chain(sources("tests"))
        .filter(|(_, t)| !t.trim_start().starts_with("//!"))
        .map(|(p, _)| p)
        .collect();
    assert!(
        missing.is_empty(),
        "files without a //! module doc: {missing:?}"
    );
}

#[test]
fn threads_are_started_only_through_the_thread_module() {
    let offenders: Vec<_> = sources("src")
        .into_iter()
        .filter(|(p, _)| !p.ends_with("src/thread.rs"))
        .filter(|(_, t)| t.contains("thread::spawn(") || t.contains("Builder::new().spawn("))
        .map(|(p, _)| p)
        .collect();
    assert!(
        offenders.is_empty(),
        "raw thread spawns in {offenders:?}; use crate::thread::spawn_named"
    );
}

#[test]
fn no_ignored_tests_or_stubs() {
    let needles = [
        concat!("#[", "ignore"),
        concat!("todo", "!("),
        concat!("unimplemented", "!("),
    ];
    let offenders: Vec<_> = sources("src")
        .into_iter()
        .chain(sources("tests"))
        .filter(|(_, t)| needles.iter().any(|n| t.contains(n)))
        .map(|(p, _)| p)
        .collect();
    assert!(
        offenders.is_empty(),
        "ignored tests or stubs in {offenders:?}"
    );
}

#[test]
fn no_async_runtime_in_the_dependency_tree() {
    let lock = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.lock"))
        .expect("Cargo.lock");
    for runtime in ["tokio", "async-std", "smol", "async-executor"] {
        let entry = format!("name = \"{runtime}\"");
        assert!(
            !lock.contains(&entry),
            "{runtime} is in Cargo.lock: tinylet has no async runtime by design"
        );
    }
}

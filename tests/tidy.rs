//! Checks of the repository itself: module docs, the one way to spawn
//! threads, grpcio kept inside `cri`, no ignored tests, no async runtime in
//! the dependency tree, and the packaged configuration file naming every
//! field tinylet reads.

use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir` (also read by `layers`).
pub(crate) fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
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

/// Whether `text` starts a thread other than through `crate::thread`:
/// `thread::spawn`, a `thread::Builder` (or a bare `Builder::new()`, as
/// after `use std::thread::Builder`), `spawn_scoped` or `thread::scope`.
fn starts_a_raw_thread(text: &str) -> bool {
    let bare_builder = text.match_indices("Builder::new()").any(|(i, _)| {
        // `DirBuilder::new()`, `env_logger::Builder::new()`: other builders.
        !text[..i]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':')
    });
    bare_builder
        || [
            "thread::spawn(",
            "thread::Builder",
            "spawn_scoped",
            "thread::scope(",
        ]
        .iter()
        .any(|n| text.contains(n))
}

#[test]
fn threads_are_started_only_through_the_thread_module() {
    let offenders: Vec<_> = sources("src")
        .into_iter()
        .filter(|(p, _)| !p.ends_with("src/thread.rs"))
        .filter(|(_, t)| starts_a_raw_thread(t))
        .map(|(p, _)| p)
        .collect();
    assert!(
        offenders.is_empty(),
        "raw thread starts in {offenders:?}; use crate::thread::spawn_named or scope_named"
    );
}

#[test]
fn every_way_to_start_a_raw_thread_is_caught() {
    for raw in [
        "std::thread::spawn(move || {})",
        "thread::Builder::new().name(n).spawn(f)",
        "use std::thread::Builder;\nBuilder::new().spawn(f)",
        "std::thread::Builder::new().stack_size(s).spawn_scoped(s, f)",
        "std::thread::scope(|s| {})",
        "thread::scope(|s| s.spawn(f))",
    ] {
        assert!(starts_a_raw_thread(raw), "missed: {raw}");
    }
    for fine in [
        "crate::thread::spawn_named(name, f)",
        "crate::thread::scope_named(|s| s.spawn(name, f))",
        "std::fs::DirBuilder::new().mode(0o755)",
        "env_logger::Builder::new().parse_default_env()",
    ] {
        assert!(!starts_a_raw_thread(fine), "flagged: {fine}");
    }
}

/// Whether `text` names the gRPC library in code (a path or a `use`);
/// comments and strings (the log filter's module name) do not count.
fn names_grpcio(text: &str) -> bool {
    text.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .any(|code| {
            code.match_indices("grpcio").any(|(i, _)| {
                let before = code[..i].chars().next_back();
                let after = code[i + "grpcio".len()..].chars().next();
                !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '"')
                    && matches!(after, Some(':' | ';' | ',' | '}' | ' ') | None)
            })
        })
}

#[test]
fn grpcio_is_named_only_inside_cri() {
    let cri = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/cri");
    let offenders: Vec<_> = sources("src")
        .into_iter()
        .filter(|(p, _)| !p.starts_with(&cri))
        .filter(|(_, t)| names_grpcio(t))
        .map(|(p, _)| p)
        .collect();
    assert!(
        offenders.is_empty(),
        "grpcio named outside src/cri in {offenders:?}; use cri::Code and CriError"
    );
}

#[test]
fn every_way_to_name_grpcio_is_caught() {
    for named in [
        "use grpcio::RpcStatusCode;",
        "use grpcio;",
        "    use grpcio::RpcStatusCode as C;",
        "if e.code() == Some(grpcio::RpcStatusCode::NOT_FOUND) {",
        "fn f(e: ::grpcio::Error) {}",
        "use {grpcio, log};",
    ] {
        assert!(names_grpcio(named), "missed: {named}");
    }
    for fine in [
        "// what grpcio answers",
        "//! the grpcio stubs live in cri",
        ".filter_module(\"grpcio\", log::LevelFilter::Warn)",
        "let not_grpcio_x = 1;",
        "e.code() == Some(cri::Code::NotFound)",
    ] {
        assert!(!names_grpcio(fine), "flagged: {fine}");
    }
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

/// The fuzz targets build the library without its `cri` feature: their
/// sanitizer build compiles no gRPC C core (minutes on a fresh machine).
/// Their lock file, as cargo resolves it, says what that build compiles.
#[test]
fn the_fuzz_build_compiles_no_grpc() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lock =
        std::fs::read_to_string(root.join("tests/fuzz/Cargo.lock")).expect("tests/fuzz/Cargo.lock");
    assert!(
        lock.contains("name = \"tinylet\""),
        "tests/fuzz/Cargo.lock does not name tinylet"
    );
    for package in ["grpcio", "grpcio-sys", "protobuf", "protobuf-codegen"] {
        let entry = format!("name = \"{package}\"\n");
        assert!(
            !lock.contains(&entry),
            "{package} is in tests/fuzz/Cargo.lock: the fuzz crate must depend on \
             tinylet with default-features = false (no `cri` feature)"
        );
    }
}

/// The configuration fields `apply_config_file` reads: the fields of the
/// settings table that have a setter.
fn config_fields_read() -> std::collections::BTreeSet<String> {
    // The file names the top-level fields (`authentication`, not its
    // `authentication.x509.clientCAFile`).
    tinylet::options::config_fields()
        .into_iter()
        .map(|f| f.split('.').next().unwrap_or(f).to_string())
        .collect()
}

#[test]
fn packaged_config_names_every_field_tinylet_reads() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let path = root.join("packaging/deb/config.yaml");
    let text = std::fs::read_to_string(&path).expect("packaging/deb/config.yaml");
    // Set fields are `name: value`; fields for the admin to fill in are
    // commented out as `#name: value`.
    let field = |line: &str| -> Option<(bool, String)> {
        let (set, rest) = match line.strip_prefix('#') {
            Some(rest) => (false, rest),
            None => (true, line),
        };
        let (name, _) = rest.split_once(':')?;
        (!name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric()))
            .then(|| (set, name.to_string()))
    };
    let in_file: std::collections::BTreeSet<String> = text
        .lines()
        .filter_map(field)
        .map(|(_, name)| name)
        .filter(|n| n != "apiVersion" && n != "kind")
        .collect();
    let read = config_fields_read();
    assert!(
        read.len() > 20,
        "too few fields in the settings table: {read:?}"
    );
    let missing: Vec<_> = read.difference(&in_file).collect();
    let unknown: Vec<_> = in_file.difference(&read).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "{}: fields tinylet reads but the file does not name: {missing:?}; \
         fields it names that tinylet does not read: {unknown:?}",
        path.display()
    );

    // As shipped, and with every commented-out field filled in, the file
    // is read whole: no error, no field ignored.
    let filled: String = text
        .lines()
        .map(|l| match field(l) {
            Some((false, _)) => &l[1..],
            _ => l,
        })
        .map(|l| format!("{l}\n"))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    for (name, content) in [("shipped.yaml", text.as_str()), ("filled.yaml", &filled)] {
        let file = dir.path().join(name);
        std::fs::write(&file, content).unwrap();
        let mut o = tinylet::options::Options::default();
        tinylet::options::apply_config_file(&mut o, &file)
            .unwrap_or_else(|e| panic!("{name} from {}: {e}", path.display()));
        assert!(
            o.ignored_config_fields.is_empty(),
            "{name}: ignored {:?}",
            o.ignored_config_fields
        );
        assert_eq!(
            o.pod_manifest_path.as_deref(),
            Some(Path::new("/etc/kubernetes/manifests"))
        );
        assert_eq!(
            o.container_runtime_endpoint,
            "unix:///run/containerd/containerd.sock"
        );
    }
}

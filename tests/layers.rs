//! The module graph, read from the code: every `use` line and every
//! `crate::`/`super::` path in `src/` is an arrow from one file to another.
//! No files import each other in a cycle, no top-level modules do, and no
//! arrow runs back up the layers that ARCHITECTURE.md lists under
//! "Layers" (that list is the one this test reads). Test code
//! (`#[cfg(test)]` modules and files) is left out: a test may use whatever
//! it needs. And no file grows past a thousand lines of non-test code.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One source file: its module path (`["runtime", "labels"]`) and the code
/// that is not a test, without comments and string contents.
struct File {
    /// The path under `src/`.
    rel: PathBuf,
    module: Vec<String>,
    code: String,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `src/a/b.rs` → `["a", "b"]`, `src/a/mod.rs` → `["a"]`, `src/lib.rs` and
/// `src/main.rs` → `[]`.
fn module_of(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap_or_default();
    let stem = last.trim_end_matches(".rs");
    if !matches!(stem, "mod" | "lib" | "main") {
        parts.push(stem.to_string());
    }
    parts
}

/// The text with comments removed and string and char literals emptied,
/// so that only code is left to read paths from.
fn strip(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == b'r'
            && (b.get(i + 1) == Some(&b'"') || b.get(i + 1) == Some(&b'#'))
            && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_'))
        {
            // A raw string: r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&b'"') {
                out.push(c as char);
                i += 1;
                continue;
            }
            j += 1;
            let close: Vec<u8> = std::iter::once(b'"')
                .chain(std::iter::repeat_n(b'#', hashes))
                .collect();
            while j < b.len() && !b[j..].starts_with(&close) {
                j += 1;
            }
            out.push_str("\"\"");
            i = j + close.len();
        } else if c == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == b'\'' && (b.get(i + 2) == Some(&b'\'') || b.get(i + 1) == Some(&b'\\')) {
            // A char literal ('x', '\n', '\''); a lifetime has no closing quote.
            i += 1;
            if b.get(i) == Some(&b'\\') {
                i += 1;
            }
            i += 1;
            while i < b.len() && b[i] != b'\'' {
                i += 1;
            }
            i += 1;
            out.push_str("' '");
        } else {
            // Multi-byte UTF-8 is copied byte-wise below.
            let len = utf8_len(c);
            out.push_str(std::str::from_utf8(&b[i..i + len]).unwrap_or(" "));
            i += len;
        }
    }
    out
}

fn utf8_len(first: u8) -> usize {
    match first {
        0xf0..=0xff => 4,
        0xe0..=0xef => 3,
        0xc0..=0xdf => 2,
        _ => 1,
    }
}

/// The code without its `#[cfg(test)]` items (a `mod tests { .. }` block,
/// a test-only `use`, fn or `mod x;`), and the names of the modules
/// declared test-only (`#[cfg(test)] mod x;`), whose files are left out.
fn without_tests(code: &str) -> (String, Vec<String>) {
    let mut out = String::new();
    let mut test_mods = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let item = &rest[at + "#[cfg(test)]".len()..];
        // The item ends at its `;` or at the `}` closing its first `{`.
        let bytes = item.as_bytes();
        let mut depth = 0usize;
        let mut end = item.len();
        for (i, &c) in bytes.iter().enumerate() {
            match c {
                b'{' => depth += 1,
                b'}' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        end = i + 1;
                        break;
                    }
                }
                b';' if depth == 0 => {
                    end = i + 1;
                    break;
                }
                _ => {}
            }
        }
        let decl = item[..end].trim();
        if let Some(name) = decl
            .strip_prefix("mod ")
            .or_else(|| decl.strip_prefix("pub mod "))
            .or_else(|| decl.strip_prefix("pub(crate) mod "))
            .and_then(|d| d.strip_suffix(';'))
        {
            test_mods.push(name.trim().to_string());
        }
        rest = &item[end..];
    }
    out.push_str(rest);
    (out, test_mods)
}

fn files() -> Vec<File> {
    let src = root().join("src");
    let mut paths = Vec::new();
    super::tidy::rust_files(&src, &mut paths);
    paths.sort();
    let mut files = Vec::new();
    let mut test_only: BTreeSet<Vec<String>> = BTreeSet::new();
    for path in paths {
        let rel = path.strip_prefix(&src).expect("under src").to_path_buf();
        let text = std::fs::read_to_string(&path).expect("read source");
        let (code, test_mods) = without_tests(&strip(&text));
        let module = module_of(&rel);
        for m in test_mods {
            let mut child = module.clone();
            child.push(m);
            test_only.insert(child);
        }
        // The binary names the library `tinylet::`, as the crate root.
        let code = if rel == Path::new("main.rs") {
            code.replace("tinylet::", "crate::")
        } else {
            code
        };
        files.push(File { rel, module, code });
    }
    files.retain(|f| !test_only.iter().any(|t| f.module.starts_with(t)));
    files
}

fn ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Expands a `use` tree (`crate::a::{b, c::{d, e as f}, self}`) into its
/// paths.
fn expand_use(tree: &str, prefix: &[String], out: &mut Vec<Vec<String>>) {
    let tree = tree.trim();
    let brace = tree.find('{');
    match brace {
        Some(open) => {
            let head = tree[..open].trim().trim_end_matches("::");
            let close = tree.rfind('}').unwrap_or(tree.len());
            let mut base = prefix.to_vec();
            base.extend(segments(head));
            let inner = &tree[open + 1..close];
            let mut depth = 0;
            let mut from = 0;
            for (i, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        expand_use(&inner[from..i], &base, out);
                        from = i + 1;
                    }
                    _ => {}
                }
            }
            expand_use(&inner[from..], &base, out);
        }
        None => {
            let path = tree.split(" as ").next().unwrap_or("").trim();
            if path.is_empty() {
                return;
            }
            let mut full = prefix.to_vec();
            full.extend(segments(path).filter(|s| s != "self" && s != "*"));
            out.push(full);
        }
    }
}

fn segments(path: &str) -> impl Iterator<Item = String> + '_ {
    path.split("::")
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

/// Every path the file's code names that starts at `crate`, `super`,
/// `self` or one of the file's own child modules.
fn paths_named(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    // `use` statements, trees expanded.
    let mut rest = code;
    let mut outside_use = String::new();
    while let Some(at) = find_word(rest, "use") {
        outside_use.push_str(&rest[..at]);
        let stmt = &rest[at + 3..];
        let end = stmt.find(';').unwrap_or(stmt.len());
        expand_use(&stmt[..end], &[], &mut out);
        rest = &stmt[end..];
    }
    outside_use.push_str(rest);
    // Paths in code: `crate::a::b`, `super::a`.
    for anchor in ["crate::", "super::"] {
        let mut from = 0;
        while let Some(i) = outside_use[from..].find(anchor) {
            let at = from + i;
            from = at + anchor.len();
            if outside_use[..at]
                .chars()
                .next_back()
                .is_some_and(|c| ident_char(c) || c == ':')
            {
                continue;
            }
            let tail = &outside_use[at..];
            let end = tail
                .find(|c: char| !(ident_char(c) || c == ':'))
                .unwrap_or(tail.len());
            out.push(segments(&tail[..end]).collect());
        }
    }
    out
}

/// Where `word` stands alone (not inside an identifier) in `text`.
fn find_word(text: &str, word: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(i) = text[from..].find(word) {
        let at = from + i;
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].chars().next();
        if !before.is_some_and(ident_char) && after.is_some_and(char::is_whitespace) {
            return Some(at);
        }
        from = at + word.len();
    }
    None
}

/// The module a path names, made absolute, cut to the longest prefix that
/// is a file of ours; None for paths outside the crate.
fn resolve(
    path: &[String],
    here: &[String],
    modules: &BTreeSet<Vec<String>>,
) -> Option<Vec<String>> {
    let first = path.first()?;
    let mut abs: Vec<String> = match first.as_str() {
        "crate" => path[1..].to_vec(),
        "super" | "self" => {
            // A file `a/b.rs` is module a::b; its `self` is a::b, its
            // `super` is a. In `a/mod.rs` (module a) the same holds.
            let mut base = here.to_vec();
            let mut rest = path;
            while let Some(s) = rest.first() {
                match s.as_str() {
                    "super" => {
                        base.pop()?;
                    }
                    "self" => {}
                    _ => break,
                }
                rest = &rest[1..];
            }
            base.extend(rest.iter().cloned());
            base
        }
        _ => {
            // A child module named without `self::` (2018 paths).
            let mut child = here.to_vec();
            child.push(first.clone());
            if !modules.contains(&child) {
                return None;
            }
            let mut base = here.to_vec();
            base.extend(path.iter().cloned());
            base
        }
    };
    while !abs.is_empty() && !modules.contains(&abs) {
        abs.pop();
    }
    (!abs.is_empty()).then_some(abs)
}

/// The file-to-file arrows, as module paths.
fn arrows(files: &[File]) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let modules: BTreeSet<Vec<String>> = files.iter().map(|f| f.module.clone()).collect();
    let mut graph: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for f in files {
        if f.module.is_empty() {
            continue; // lib.rs and main.rs: the roof
        }
        let to = graph.entry(f.module.clone()).or_default();
        for p in paths_named(&f.code) {
            if let Some(m) = resolve(&p, &f.module, &modules) {
                // A module's own children are part of it (`mod x;` is not an
                // import), and a child reaching its parent's face is not
                // either: only arrows between different files count.
                if m != f.module && !m.starts_with(&f.module) {
                    to.insert(m);
                }
            }
        }
    }
    graph
}

/// Strongly connected components with more than one member (Tarjan).
fn cycles<N: Ord + Clone>(graph: &BTreeMap<N, BTreeSet<N>>) -> Vec<Vec<N>> {
    struct State<N> {
        index: BTreeMap<N, usize>,
        low: BTreeMap<N, usize>,
        stack: Vec<N>,
        on: BTreeSet<N>,
        next: usize,
        out: Vec<Vec<N>>,
    }
    fn visit<N: Ord + Clone>(n: &N, g: &BTreeMap<N, BTreeSet<N>>, s: &mut State<N>) {
        s.index.insert(n.clone(), s.next);
        s.low.insert(n.clone(), s.next);
        s.next += 1;
        s.stack.push(n.clone());
        s.on.insert(n.clone());
        for m in g.get(n).into_iter().flatten() {
            if !s.index.contains_key(m) {
                visit(m, g, s);
                let l = s.low[m].min(s.low[n]);
                s.low.insert(n.clone(), l);
            } else if s.on.contains(m) {
                let l = s.index[m].min(s.low[n]);
                s.low.insert(n.clone(), l);
            }
        }
        if s.low[n] == s.index[n] {
            let mut comp = Vec::new();
            while let Some(m) = s.stack.pop() {
                s.on.remove(&m);
                let done = &m == n;
                comp.push(m);
                if done {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                s.out.push(comp);
            }
        }
    }
    let mut s = State {
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for n in graph.keys() {
        if !s.index.contains_key(n) {
            visit(n, graph, &mut s);
        }
    }
    s.out
}

/// ARCHITECTURE.md's "Layers" list: top-level module → layer (1 = ground).
fn layers() -> BTreeMap<String, usize> {
    let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let section = text
        .split("\n## Layers")
        .nth(1)
        .expect("ARCHITECTURE.md has a '## Layers' section");
    let section = section.split("\n## ").next().unwrap_or("");
    let mut out = BTreeMap::new();
    let mut layer = 0;
    for line in section.lines() {
        let t = line.trim_start();
        let numbered = t
            .split_once(". ")
            .and_then(|(n, _)| n.parse::<usize>().ok());
        if let Some(n) = numbered {
            layer = n;
        } else if t.is_empty() && layer > 0 {
            break; // the list ends at its first blank line
        } else if layer == 0 || !line.starts_with(' ') {
            continue; // before the list, or not a continued item
        }
        for name in line.split('`').skip(1).step_by(2) {
            out.insert(name.to_string(), layer);
        }
    }
    out
}

fn name(m: &[String]) -> String {
    m.join("::")
}

/// The most lines of non-test code a file may have: past it, a file is
/// split along its seams.
const MAX_LINES: usize = 1000;

#[test]
fn no_file_has_more_than_a_thousand_lines_of_non_test_code() {
    // Lines of code and line comments (doc comments included); what block
    // comments and multi-line strings span counts as one line.
    let long: Vec<String> = files()
        .iter()
        .map(|f| (f.rel.display().to_string(), f.code.lines().count()))
        .filter(|(_, n)| *n > MAX_LINES)
        .map(|(m, n)| format!("{m}: {n} lines"))
        .collect();
    assert!(long.is_empty(), "split these along their seams: {long:?}");
}

#[test]
fn no_file_imports_another_in_a_cycle() {
    let graph = arrows(&files());
    let found: Vec<String> = cycles(&graph)
        .into_iter()
        .map(|c| c.iter().map(|m| name(m)).collect::<Vec<_>>().join(" <-> "))
        .collect();
    assert!(found.is_empty(), "files importing each other: {found:#?}");
}

#[test]
fn no_top_level_modules_import_each_other_in_a_cycle() {
    let files = arrows(&files());
    let mut top: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, to) in &files {
        let entry = top.entry(from[0].clone()).or_default();
        entry.extend(to.iter().map(|m| m[0].clone()).filter(|m| *m != from[0]));
    }
    // Each cycle with the file arrows that make it, to know where to cut.
    let found: Vec<String> = cycles(&top)
        .into_iter()
        .map(|c| {
            let mut ties = Vec::new();
            for (from, to) in &files {
                for m in to {
                    if from[0] != m[0] && c.contains(&from[0]) && c.contains(&m[0]) {
                        ties.push(format!("  {} -> {}", name(from), name(m)));
                    }
                }
            }
            format!("{}:\n{}", c.join(", "), ties.join("\n"))
        })
        .collect();
    assert!(
        found.is_empty(),
        "top-level modules in a cycle: {}",
        found.join("\n")
    );
}

#[test]
fn no_import_runs_back_up_the_layers() {
    let layers = layers();
    assert!(
        layers.len() > 10,
        "ARCHITECTURE.md's layers list: {layers:?}"
    );
    let files = files();
    let mut unlisted = BTreeSet::new();
    for f in &files {
        if let Some(top) = f.module.first() {
            if !layers.contains_key(top) {
                unlisted.insert(top.clone());
            }
        }
    }
    assert!(
        unlisted.is_empty(),
        "top-level modules missing from ARCHITECTURE.md's layers: {unlisted:?}"
    );
    let mut up = Vec::new();
    for (from, to) in arrows(&files) {
        for m in to {
            let (a, b) = (layers[&from[0]], layers[&m[0]]);
            if b > a {
                up.push(format!(
                    "{} (layer {a}) -> {} (layer {b})",
                    name(&from),
                    name(&m)
                ));
            }
        }
    }
    assert!(up.is_empty(), "imports running back up: {up:#?}");
}

#[test]
fn the_reader_sees_the_arrows_it_should() {
    // The reader itself: a `use` tree, a `super` path, a child module named
    // bare, a path inside code, and neither comments nor strings.
    let code = strip(
        "use crate::a::{b::{C, d as e}, self};\nuse super::x::Y;\n\
         // crate::comment::Z\nfn f() { let s = \"crate::string\"; crate::p::q(); kid::go(); }\n\
         #[cfg(test)]\nmod tests { use crate::t::U; }\n",
    );
    let (code, _) = without_tests(&code);
    let paths: Vec<String> = paths_named(&code).iter().map(|p| name(p)).collect();
    assert!(paths.contains(&"crate::a::b::C".to_string()), "{paths:?}");
    assert!(paths.contains(&"crate::a::b::d".to_string()), "{paths:?}");
    assert!(paths.contains(&"crate::a".to_string()), "{paths:?}");
    assert!(paths.contains(&"super::x::Y".to_string()), "{paths:?}");
    assert!(paths.contains(&"crate::p::q".to_string()), "{paths:?}");
    assert!(
        !paths
            .iter()
            .any(|p| p.contains("comment") || p.contains("string") || p.contains("::t")),
        "{paths:?}"
    );
    let modules: BTreeSet<Vec<String>> = [
        vec!["m".to_string()],
        vec!["m".into(), "kid".into()],
        vec!["m".into(), "x".into()],
    ]
    .into_iter()
    .collect();
    let here = vec!["m".to_string()];
    let kid = resolve(&["kid".into(), "go".into()], &here, &modules);
    assert_eq!(kid, Some(vec!["m".to_string(), "kid".to_string()]));
    let sup = resolve(
        &["super".into(), "x".into(), "Y".into()],
        &["m".into(), "kid".into()],
        &modules,
    );
    assert_eq!(sup, Some(vec!["m".to_string(), "x".to_string()]));
    let mut g: BTreeMap<u8, BTreeSet<u8>> = BTreeMap::new();
    g.insert(1, [2].into());
    g.insert(2, [3].into());
    g.insert(3, [1].into());
    g.insert(4, [1].into());
    assert_eq!(cycles(&g), vec![vec![1, 2, 3]]);
}

//! What `tinylet --version` prints: the crate version, the git commit the
//! binary was built from, its target triple and whether it is linked
//! statically. `build.rs` finds the commit and the target. Also the
//! Kubernetes version tinylet speaks as: the one `kubelet --version` prints,
//! the Node's `kubeletVersion` and the probes' User-Agent. An operator sets
//! it with `TINYLET_KUBELET_VERSION`, in the environment or in the package's
//! defaults file, so that kubeadm's preflight and the cluster's controllers
//! see the version the cluster expects.

use std::path::Path;
use std::sync::OnceLock;

/// The Kubernetes version tinylet reports unless told otherwise: the API
/// level it implements (clients compare it like a kubelet's).
pub(crate) const DEFAULT_KUBELET_VERSION: &str = "v1.20.2";

/// The variable that sets the reported version, in the environment or in
/// [`DEFAULTS_FILE`].
pub const KUBELET_VERSION_VAR: &str = "TINYLET_KUBELET_VERSION";

/// The package's defaults file, which the units read as their environment
/// and tinylet reads for [`KUBELET_VERSION_VAR`] when it is not in its own
/// environment: kubeadm's preflight runs `kubelet --version` from a shell
/// that never read this file.
pub const DEFAULTS_FILE: &str = "/etc/default/tinylet";

static KUBELET_VERSION: OnceLock<String> = OnceLock::new();

/// The Kubernetes version tinylet reports, e.g. `v1.20.2`.
pub(crate) fn kubelet() -> &'static str {
    KUBELET_VERSION
        .get()
        .map(String::as_str)
        .unwrap_or(DEFAULT_KUBELET_VERSION)
}

/// Sets the version [`kubelet`] answers, once, at start; later calls are
/// ignored (the Node and the probes must not see it change).
pub fn set_kubelet(version: String) {
    let _ = KUBELET_VERSION.set(version);
}

/// What `kubelet --version` prints, the line kubeadm parses:
/// `Kubernetes v1.20.2`.
pub fn kubernetes_line() -> String {
    format!("Kubernetes {}", kubelet())
}

/// The version to report: `from_env` (the variable's value, if set), else
/// the variable's last assignment in the defaults file at `defaults`, else
/// [`DEFAULT_KUBELET_VERSION`]. An empty value counts as unset. A value that
/// is not a semantic version is an error naming where it came from.
pub fn resolve_kubelet(from_env: Option<String>, defaults: &Path) -> Result<String, String> {
    if let Some(v) = from_env.filter(|v| !v.trim().is_empty()) {
        return semantic(&v).map_err(|e| format!("{KUBELET_VERSION_VAR}={v:?}: {e}"));
    }
    let text = match std::fs::read_to_string(defaults) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(format!("{}: {e}", defaults.display())),
    };
    match assignment(&text, KUBELET_VERSION_VAR) {
        Some((line, v)) if !v.trim().is_empty() => semantic(&v).map_err(|e| {
            format!(
                "{}:{line}: {KUBELET_VERSION_VAR}={v:?}: {e}",
                defaults.display()
            )
        }),
        _ => Ok(DEFAULT_KUBELET_VERSION.to_string()),
    }
}

/// The last `NAME=value` (or `export NAME=value`) line of a shell-style
/// environment file, with its 1-based line number; one level of single or
/// double quotes is taken off. Comments and other lines are skipped.
fn assignment(text: &str, name: &str) -> Option<(usize, String)> {
    let mut found = None;
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        let line = line.strip_prefix("export ").unwrap_or(line).trim_start();
        let Some(value) = line
            .strip_prefix(name)
            .and_then(|rest| rest.strip_prefix('='))
        else {
            continue;
        };
        let value = value.trim();
        let unquoted = ['"', '\'']
            .iter()
            .find_map(|q| value.strip_prefix(*q).and_then(|v| v.strip_suffix(*q)))
            .unwrap_or(value);
        found = Some((i + 1, unquoted.to_string()));
    }
    found
}

/// `vMAJOR.MINOR.PATCH`, optionally with `-pre-release` and `+build` parts
/// (as Kubernetes versions are written); the leading `v` may be left out.
/// Returns the version with its `v`.
fn semantic(text: &str) -> Result<String, String> {
    let text = text.trim();
    let bare = text.strip_prefix('v').unwrap_or(text);
    let (core, build) = match bare.split_once('+') {
        Some((core, build)) => (core, Some(build)),
        None => (bare, None),
    };
    let (core, pre) = match core.split_once('-') {
        Some((core, pre)) => (core, Some(pre)),
        None => (core, None),
    };
    let numbers: Vec<&str> = core.split('.').collect();
    let number_ok = |n: &&str| {
        !n.is_empty()
            && n.bytes().all(|b| b.is_ascii_digit())
            && (n.len() == 1 || !n.starts_with('0'))
    };
    let ident_ok = |part: &str| {
        part.split('.')
            .all(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
    };
    if numbers.len() != 3 || !numbers.iter().all(number_ok) {
        return Err("not a version like v1.20.2 (MAJOR.MINOR.PATCH)".into());
    }
    if pre.is_some_and(|p| !ident_ok(p)) || build.is_some_and(|b| !ident_ok(b)) {
        return Err("not a version like v1.20.2 (bad -pre-release or +build part)".into());
    }
    Ok(format!("v{bare}"))
}

/// The short commit hash the binary was built from, with `-dirty` when the
/// tree had uncommitted changes, or `unknown` outside a git checkout.
pub(crate) const COMMIT: &str = env!("TINYLET_GIT_COMMIT");

/// The target triple the binary was built for.
pub(crate) const TARGET: &str = env!("TINYLET_TARGET");

/// Whether the C runtime is linked in (`crt-static`): one file that runs
/// without the system's libc.
pub(crate) const STATIC: bool = cfg!(target_feature = "crt-static");

/// The `--version` line, e.g.
/// `tinylet 0.1.0 (commit 1a2b3c4, x86_64-unknown-linux-gnu, static)`.
pub fn long() -> String {
    format(env!("CARGO_PKG_VERSION"), COMMIT, TARGET, STATIC)
}

fn format(version: &str, commit: &str, target: &str, is_static: bool) -> String {
    let linkage = if is_static { "static" } else { "dynamic" };
    format!("tinylet {version} (commit {commit}, {target}, {linkage})")
}

/// Writes `text` to stdout for `--help` and `--version`. A reader that went
/// away (`tinylet --version | grep -q ...`, `| head -1`) ends it quietly,
/// with success, where `println!` would panic on the broken pipe; another
/// write error is reported.
pub fn print_stdout(text: &str) -> std::process::ExitCode {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tinylet: writing to stdout: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reported_version_comes_from_the_environment_then_the_defaults_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tinylet");
        // No file, nothing set: the level tinylet implements.
        assert_eq!(resolve_kubelet(None, &file), Ok("v1.20.2".to_string()));
        assert_eq!(
            resolve_kubelet(Some(" ".into()), &file),
            Ok("v1.20.2".to_string())
        );

        // The last assignment in the file counts; comments do not.
        std::fs::write(
            &file,
            "#TINYLET_KUBELET_VERSION=v9.9.9\nTINYLET_ARGS=\"--v 2\"\n\
             TINYLET_KUBELET_VERSION=v1.21.0\nexport TINYLET_KUBELET_VERSION=\"1.22.3\"\n",
        )
        .unwrap();
        assert_eq!(resolve_kubelet(None, &file), Ok("v1.22.3".to_string()));
        // The environment wins over the file.
        assert_eq!(
            resolve_kubelet(Some("v1.20.15".into()), &file),
            Ok("v1.20.15".to_string())
        );
        assert_eq!(
            resolve_kubelet(Some("v1.23.0-rc.1+k3s.1".into()), &file),
            Ok("v1.23.0-rc.1+k3s.1".to_string())
        );

        // Errors name where the bad value came from.
        std::fs::write(&file, "\n\nTINYLET_KUBELET_VERSION='1.20'\n").unwrap();
        let e = resolve_kubelet(None, &file).unwrap_err();
        assert!(
            e.starts_with(&format!(
                "{}:3: TINYLET_KUBELET_VERSION=\"1.20\": not a version",
                file.display()
            )),
            "{e}"
        );
        let e = resolve_kubelet(Some("latest".into()), &file).unwrap_err();
        assert!(
            e.starts_with("TINYLET_KUBELET_VERSION=\"latest\": not a version"),
            "{e}"
        );
        // An empty assignment means the default.
        std::fs::write(&file, "TINYLET_KUBELET_VERSION=\n").unwrap();
        assert_eq!(resolve_kubelet(None, &file), Ok("v1.20.2".to_string()));
    }

    #[test]
    fn only_semantic_versions_are_taken() {
        for good in [
            "v1.20.2",
            "1.20.2",
            "v0.0.0",
            "v1.30.10-beta.0",
            "v1.2.3+abc-1",
        ] {
            assert!(semantic(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "v",
            "v1.20",
            "v1.20.2.1",
            "v01.20.2",
            "v1.x.2",
            "v1.20.2-",
            "v1.20.2+a..b",
            "v1.20.2 x",
        ] {
            assert!(semantic(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_kubernetes_line_is_what_kubeadm_parses() {
        // kubeadm matches the whole output of `kubelet --version`.
        let line = kubernetes_line();
        let v = line
            .strip_prefix("Kubernetes v")
            .unwrap_or_else(|| panic!("{line:?}"));
        assert!(semantic(v).is_ok(), "{line:?}");
    }

    #[test]
    fn version_line_names_version_commit_target_and_linkage() {
        assert_eq!(
            format("0.1.0", "1a2b3c4", "x86_64-unknown-linux-gnu", true),
            "tinylet 0.1.0 (commit 1a2b3c4, x86_64-unknown-linux-gnu, static)"
        );
        assert_eq!(
            format("1.2.3", "unknown", "aarch64-unknown-linux-gnu", false),
            "tinylet 1.2.3 (commit unknown, aarch64-unknown-linux-gnu, dynamic)"
        );

        // What this build says: the same shape, with what build.rs found.
        let line = long();
        let rest = line
            .strip_prefix(&format!("tinylet {} (commit ", env!("CARGO_PKG_VERSION")))
            .unwrap_or_else(|| panic!("{line:?}"));
        let inner = rest.strip_suffix(')').unwrap_or_else(|| panic!("{line:?}"));
        let parts: Vec<&str> = inner.split(", ").collect();
        assert_eq!(parts.len(), 3, "{line:?}");
        let commit = parts[0];
        let hash = commit.strip_suffix("-dirty").unwrap_or(commit);
        assert!(
            commit == "unknown" || (hash.len() >= 7 && hash.chars().all(|c| c.is_ascii_hexdigit())),
            "commit {commit:?} in {line:?}"
        );
        assert_eq!(parts[1], TARGET);
        // The target triple has at least arch-vendor-os.
        assert!(parts[1].split('-').count() >= 3, "{line:?}");
        assert_eq!(parts[1].split('-').next(), Some(std::env::consts::ARCH));
        assert_eq!(parts[2], if STATIC { "static" } else { "dynamic" });
    }
}

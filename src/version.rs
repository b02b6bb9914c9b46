//! What `tinylet --version` prints: the crate version, the git commit the
//! binary was built from, its target triple and whether it is linked
//! statically. `build.rs` finds the commit and the target. Also the
//! Kubernetes version tinylet speaks as.

/// The version tinylet reports as `kubeletVersion` (and in its probes'
/// User-Agent): the Kubernetes API level it implements (clients compare it
/// like a kubelet's).
pub(crate) const KUBELET_VERSION: &str = "v1.20.2";

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

#[cfg(test)]
mod tests {
    use super::*;

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

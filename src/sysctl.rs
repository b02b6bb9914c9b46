//! Sysctl admission (upstream `pkg/kubelet/sysctl`): which of a pod's
//! `securityContext.sysctls` this node lets it set.
//!
//! A sysctl is allowed when it is in the safe set or matches one of the
//! `--allowed-unsafe-sysctls` patterns (a whole name, or a prefix ending in
//! `*`), and when the namespace it lives in is the pod's own: a `net.*`
//! sysctl is refused for a hostNetwork pod and an IPC one (`kernel.shm*`,
//! `kernel.msg*`, `kernel.sem`, `fs.mqueue.*`) for a hostIPC pod, as it
//! would change the node's. Patterns that are not namespaced (node-level
//! sysctls such as `kernel.panic` or `vm.*`) are refused at start, so a pod
//! can never set a node-level sysctl. A refused pod fails admission with
//! reason `SysctlForbidden` and upstream's message.
//!
//! The safe set is upstream's from v1.22 to v1.26 (v1.22 added
//! `net.ipv4.ip_unprivileged_port_start`; v1.27 and later add sysctls that
//! need newer kernels, which tinylet does not check for).
//!
//! Matching is a map lookup and a scan of the prefixes with `starts_with`:
//! linear in the pod's sysctls and the patterns, never backtracking.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::Pod;

/// The admission reason of a pod with a sysctl this node refuses.
pub(crate) const SYSCTL_FORBIDDEN: &str = "SysctlForbidden";

/// Sysctls every pod may set (upstream's safe set, v1.22 to v1.26).
pub(crate) const SAFE_SYSCTLS: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start",
];

/// The longest sysctl name or pattern (upstream's `SysctlMaxLength`).
const MAX_LENGTH: usize = 253;

/// The kernel namespace a sysctl belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Namespace {
    Ipc,
    Net,
}

impl fmt::Display for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Namespace::Ipc => "ipc",
            Namespace::Net => "net",
        })
    }
}

/// The namespace of sysctl `name` (or of every sysctl starting with it),
/// `None` for a node-level one.
pub(crate) fn namespaced_by(name: &str) -> Option<Namespace> {
    if name == "kernel.sem" {
        return Some(Namespace::Ipc);
    }
    for (prefix, ns) in [
        ("kernel.shm", Namespace::Ipc),
        ("kernel.msg", Namespace::Ipc),
        ("fs.mqueue.", Namespace::Ipc),
        ("net.", Namespace::Net),
    ] {
        if name.starts_with(prefix) {
            return Some(ns);
        }
    }
    None
}

/// A sysctl name with `/` separators in its dotted form (`net/ipv4/x` is
/// `net.ipv4.x`; a dot in a `/`-separated name is part of one segment, as
/// in `net/ipv4/conf/eth0.100/...`, and becomes a `/`), as upstream
/// converts it.
fn dotted(name: &str) -> String {
    let Some(first_sep) = name.find(['.', '/']) else {
        return name.to_string();
    };
    if name.as_bytes()[first_sep] == b'.' {
        return name.to_string();
    }
    name.chars()
        .map(|c| match c {
            '/' => '.',
            '.' => '/',
            c => c,
        })
        .collect()
}

/// Whether `s` is a valid sysctl pattern: dot- or slash-separated segments
/// of lowercase letters, digits, `-` and `_` (not at a segment's ends),
/// optionally ending in `*`.
fn valid_pattern(s: &str) -> bool {
    if s.is_empty() || s.len() > MAX_LENGTH {
        return false;
    }
    let body = s.strip_suffix('*').unwrap_or(s);
    if body.is_empty() {
        return false;
    }
    let segments: Vec<&str> = body.split(['.', '/']).collect();
    let last = segments.len() - 1;
    segments.iter().enumerate().all(|(i, seg)| {
        if seg.is_empty() {
            // Only a trailing separator before the `*` (`net.*`).
            return i == last && body.len() < s.len();
        }
        let b = seg.as_bytes();
        let inner =
            |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-' || *c == b'_';
        let edge = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
        // A prefix may end anywhere in its last segment (`net.ab-*`).
        let open_end = i == last && body.len() < s.len();
        b.iter().all(inner) && edge(&b[0]) && (open_end || edge(&b[b.len() - 1]))
    })
}

/// The sysctls this node lets pods set: the safe set and
/// `--allowed-unsafe-sysctls`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allowlist {
    exact: BTreeMap<String, Namespace>,
    prefixes: Vec<(String, Namespace)>,
}

impl Default for Allowlist {
    /// The safe set alone.
    fn default() -> Self {
        Allowlist::new(&[]).unwrap_or(Allowlist {
            exact: BTreeMap::new(),
            prefixes: Vec::new(),
        })
    }
}

impl Allowlist {
    /// The safe set and the `unsafe_patterns` (`--allowed-unsafe-sysctls`);
    /// an invalid or not namespaced pattern is an error naming it.
    pub fn new(unsafe_patterns: &[String]) -> Result<Allowlist, String> {
        let mut list = Allowlist {
            exact: BTreeMap::new(),
            prefixes: Vec::new(),
        };
        let safe = SAFE_SYSCTLS.iter().map(|s| s.to_string());
        for pattern in safe.chain(unsafe_patterns.iter().cloned()) {
            if !valid_pattern(&pattern) {
                return Err(format!(
                    "sysctl {pattern:?} must have at most {MAX_LENGTH} characters and be \
                     dot-separated segments of lowercase letters, digits, '-' and '_', \
                     optionally ending in '*'"
                ));
            }
            let pattern = dotted(&pattern);
            let (name, prefixed) = match pattern.strip_suffix('*') {
                Some(p) => (p.to_string(), true),
                None => (pattern.clone(), false),
            };
            let ns = namespaced_by(&name)
                .ok_or_else(|| format!("the sysctls {name:?} are not known to be namespaced"))?;
            if prefixed {
                list.prefixes.push((name, ns));
            } else {
                list.exact.insert(name, ns);
            }
        }
        Ok(list)
    }

    /// Whether a pod with these host namespaces may set sysctl `name`;
    /// the error is upstream's text.
    pub(crate) fn validate(
        &self,
        name: &str,
        host_net: bool,
        host_ipc: bool,
    ) -> Result<(), String> {
        let name = dotted(name);
        let ns = match self.exact.get(&name) {
            Some(ns) => Some(*ns),
            None => self
                .prefixes
                .iter()
                .find(|(p, _)| name.starts_with(p.as_str()))
                .map(|(_, ns)| *ns),
        };
        match ns {
            None => Err(format!("{name:?} not allowed")),
            Some(ns @ Namespace::Ipc) if host_ipc => {
                Err(format!("{name:?} not allowed with host {ns} enabled"))
            }
            Some(ns @ Namespace::Net) if host_net => {
                Err(format!("{name:?} not allowed with host {ns} enabled"))
            }
            Some(_) => Ok(()),
        }
    }

    /// Admission of `pod`'s sysctls: the first refused one is the error,
    /// upstream's message (admission rejects the pod with reason
    /// `SysctlForbidden`).
    pub fn admit(&self, pod: &Pod) -> Result<(), String> {
        let Some(spec) = pod.spec.as_ref() else {
            return Ok(());
        };
        let Some(sysctls) = spec
            .security_context
            .as_ref()
            .and_then(|sc| sc.sysctls.as_ref())
        else {
            return Ok(());
        };
        let host_net = spec.host_network == Some(true);
        let host_ipc = spec.host_ipc == Some(true);
        for s in sysctls {
            if let Err(e) = self.validate(&s.name, host_net, host_ipc) {
                return Err(format!("forbidden sysctl: {e}"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn list(patterns: &[&str]) -> Allowlist {
        Allowlist::new(&patterns.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn the_safe_set_is_allowed_and_nothing_else_by_default() {
        let l = Allowlist::default();
        for s in SAFE_SYSCTLS {
            assert_eq!(l.validate(s, false, false), Ok(()), "{s}");
        }
        assert_eq!(
            l.validate("net.core.somaxconn", false, false),
            Err("\"net.core.somaxconn\" not allowed".into())
        );
        assert_eq!(
            l.validate("kernel.shm_rmid_forced_x", false, false),
            Err("\"kernel.shm_rmid_forced_x\" not allowed".into())
        );
        assert_eq!(
            l.validate("kernel.msgmax", false, false),
            Err("\"kernel.msgmax\" not allowed".into())
        );
    }

    #[test]
    fn unsafe_patterns_match_exactly_or_by_prefix() {
        let l = list(&["net.core.somaxconn", "kernel.msg*", "net.ipv6.*"]);
        assert_eq!(l.validate("net.core.somaxconn", false, false), Ok(()));
        assert!(l.validate("net.core.somaxconn2", false, false).is_err());
        assert!(l.validate("net.core", false, false).is_err());
        assert_eq!(l.validate("kernel.msgmax", false, false), Ok(()));
        assert_eq!(l.validate("kernel.msgmnb", false, false), Ok(()));
        assert_eq!(
            l.validate("net.ipv6.conf.all.forwarding", false, false),
            Ok(())
        );
        assert!(l.validate("net.ipv4.ip_forward", false, false).is_err());
        // Slash-separated names are read in their dotted form.
        assert_eq!(
            l.validate("net/ipv6/conf/all/forwarding", false, false),
            Ok(())
        );
        assert_eq!(l.validate("net/core/somaxconn", false, false), Ok(()));
    }

    #[test]
    fn host_namespaces_refuse_their_sysctls() {
        let l = list(&["kernel.sem", "fs.mqueue.*"]);
        assert_eq!(
            l.validate("net.ipv4.tcp_syncookies", true, false),
            Err("\"net.ipv4.tcp_syncookies\" not allowed with host net enabled".into())
        );
        assert_eq!(l.validate("net.ipv4.tcp_syncookies", false, true), Ok(()));
        assert_eq!(
            l.validate("kernel.shm_rmid_forced", false, true),
            Err("\"kernel.shm_rmid_forced\" not allowed with host ipc enabled".into())
        );
        assert_eq!(l.validate("kernel.shm_rmid_forced", true, false), Ok(()));
        assert!(l.validate("kernel.sem", false, true).is_err());
        assert!(l.validate("fs.mqueue.msg_max", false, true).is_err());
        assert_eq!(l.validate("fs.mqueue.msg_max", true, false), Ok(()));
    }

    #[test]
    fn node_level_and_malformed_patterns_are_refused() {
        for (p, want) in [
            (
                "kernel.panic",
                "the sysctls \"kernel.panic\" are not known to be namespaced",
            ),
            ("vm.*", "the sysctls \"vm.\" are not known to be namespaced"),
            (
                "kernel.*",
                "the sysctls \"kernel.\" are not known to be namespaced",
            ),
            ("*", "must have at most"),
            ("", "must have at most"),
            ("net..x", "must have at most"),
            ("Net.core.x", "must have at most"),
            ("net.core.x*y", "must have at most"),
            ("net.-x", "must have at most"),
        ] {
            let e = Allowlist::new(&[p.to_string()]).unwrap_err();
            assert!(e.contains(want), "{p:?}: {e}");
        }
        let long = format!("net.{}", "a".repeat(MAX_LENGTH));
        assert!(Allowlist::new(&[long]).is_err());
        assert!(
            Allowlist::new(&["net.*".into(), "kernel.shm*".into(), "kernel.sem".into()]).is_ok()
        );
    }

    #[test]
    fn pods_are_refused_with_sysctl_forbidden() {
        let pod = |spec: serde_json::Value| -> Pod {
            serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": spec})).unwrap()
        };
        let l = Allowlist::default();
        let plain = pod(json!({"containers": [{"name": "c"}]}));
        assert_eq!(l.admit(&plain), Ok(()));
        let safe = pod(
            json!({"containers": [{"name": "c"}], "securityContext": {"sysctls": [
            {"name": "net.ipv4.ip_local_port_range", "value": "1024 65000"}]}}),
        );
        assert_eq!(l.admit(&safe), Ok(()));
        let r = pod(
            json!({"containers": [{"name": "c"}], "securityContext": {"sysctls": [
            {"name": "kernel.shm_rmid_forced", "value": "1"},
            {"name": "net.core.somaxconn", "value": "1024"}]}}),
        );
        assert_eq!(
            l.admit(&r),
            Err("forbidden sysctl: \"net.core.somaxconn\" not allowed".to_string())
        );
        assert_eq!(list(&["net.core.somaxconn"]).admit(&r), Ok(()));
        let host = pod(json!({"hostNetwork": true, "containers": [{"name": "c"}],
            "securityContext": {"sysctls": [{"name": "net.ipv4.tcp_syncookies", "value": "1"}]}}));
        assert_eq!(
            l.admit(&host).unwrap_err(),
            "forbidden sysctl: \"net.ipv4.tcp_syncookies\" not allowed with host net enabled"
        );
    }
}

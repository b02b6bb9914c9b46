//! Kill points: named places in pod start, update, removal, termination,
//! status reporting and housekeeping where tinylet can be told to SIGKILL
//! itself, so that the crash tests can show a crash at any of them loses and
//! duplicates nothing once tinylet is back (RELIABILITY.md lists them).
//!
//! A point is armed only by the environment variable
//! `TINYLET_KILL_POINT=<point>` or `<point>@<context>`: the process kills
//! itself the first time it reaches `<point>` with a context (a pod's full
//! name, `namespace/name/container`, a UID or a file) that contains
//! `<context>`. Unset, as always outside tests, a point costs one load of an
//! initialised static and a branch.

use std::sync::OnceLock;

/// The environment variable that arms a kill point.
pub(crate) const ENV: &str = "TINYLET_KILL_POINT";

/// Every kill point, in the order a pod meets them; `point` refuses (in
/// debug builds) a name not listed, so the list stays the truth.
pub(crate) const POINTS: &[&str] = &[
    "manifest-read",
    "sync-begin",
    "volumes-set-up",
    "sandbox-create",
    "sandbox-created",
    "container-created",
    "container-started",
    "file-staged",
    "mirror-create",
    "status-patch",
    "container-kill",
    "pre-stop",
    "container-stopped",
    "pod-kill",
    "containers-stopped",
    "sandbox-stopped",
    "volumes-torn-down",
    "containers-removed",
    "sandboxes-removed",
    "api-delete",
    "pleg-relist",
    "housekeeping-orphan",
    "orphan-dir",
    "prune-dead",
];

struct Armed {
    point: String,
    context: String,
}

static ARMED: OnceLock<Option<Armed>> = OnceLock::new();

fn armed() -> Option<&'static Armed> {
    ARMED
        .get_or_init(|| {
            let value = std::env::var(ENV).ok()?;
            let (point, context) = value.split_once('@').unwrap_or((&value, ""));
            if !POINTS.contains(&point) {
                log::warn!("{ENV}={value}: no kill point {point:?}; known: {POINTS:?}");
                return None;
            }
            log::warn!("{ENV}={value}: tinylet kills itself when it reaches this point");
            Some(Armed {
                point: point.to_string(),
                context: context.to_string(),
            })
        })
        .as_ref()
}

/// Reads the environment once, so that the armed point is logged at start.
pub fn init() {
    let _ = armed();
}

/// Kill point `name`, reached for `context` (formatted only when `name` is
/// the armed point).
pub(crate) fn point(name: &str, context: impl std::fmt::Display) {
    debug_assert!(
        POINTS.contains(&name),
        "kill point {name:?} is not in POINTS"
    );
    let Some(a) = armed() else { return };
    if a.point != name {
        return;
    }
    let context = context.to_string();
    if context.contains(a.context.as_str()) {
        log::warn!("kill point {name} reached ({context}): SIGKILL");
        // SAFETY: getpid and kill have no preconditions; SIGKILL ends the
        // process here, as a power cut or the OOM killer would.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_are_unique_and_unarmed_points_return() {
        let mut seen = std::collections::HashSet::new();
        for p in POINTS {
            assert!(seen.insert(p), "{p} listed twice");
            assert!(!p.contains('@'), "{p}: '@' separates the context");
        }
        // The test process has no TINYLET_KILL_POINT: every point returns.
        assert!(std::env::var(ENV).is_err());
        for p in POINTS {
            point(p, "default/web-edge-1");
        }
    }
}

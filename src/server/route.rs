//! The node API's route table. A request's path, decoded once as Go's
//! `URL.Path` is, becomes a [`Route`]; dispatch, authorization (the verb
//! and the `nodes` subresource) and the `kubelet_http_requests_total` path
//! label all read the route, so none of them reads the path on its own,
//! and the label is one of a fixed set whatever a caller sends.

use super::head::{percent_decode, RequestHead};
use super::stream::StreamKind;
use crate::metrics::{HTTP_PATH_ROOTS, OTHER};

/// What a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// `/healthz`: every check.
    Healthz,
    /// `/healthz/ping`.
    HealthzPing,
    /// `/healthz/syncloop`.
    HealthzSyncLoop,
    /// `/pods`, `/pods/`.
    Pods,
    /// `/runningpods`, `/runningpods/`.
    RunningPods,
    /// `/configz`.
    Configz,
    /// `/metrics`.
    Metrics,
    /// `/metrics/probes`.
    ProbeMetrics,
    /// `/metrics/resource`.
    ResourceMetrics,
    /// `/stats/summary`.
    StatsSummary,
    /// `/run/<namespace>/<pod>[/<uid>]/<container>`.
    Run,
    /// `/containerLogs/<namespace>/<pod>/<container>`.
    ContainerLogs,
    /// `/exec/…`, `/attach/…`, `/portForward/…`.
    Stream(StreamKind),
    /// A path the node does not serve (404), authorized and counted as
    /// upstream's kubelet takes it.
    Unserved(Unserved),
}

/// How upstream takes a path tinylet does not serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unserved {
    subresource: &'static str,
    /// Under `/exec`, `/attach`, `/portForward` or `/run`: `create`,
    /// whatever the method.
    creates: bool,
    label: &'static str,
}

impl Route {
    /// The route of a request.
    pub(crate) fn of(head: &RequestHead) -> Route {
        Route::of_path(&percent_decode(head.path(), false))
    }

    /// The route of a decoded path.
    pub(crate) fn of_path(path: &str) -> Route {
        match path {
            "/healthz" => Route::Healthz,
            "/healthz/ping" => Route::HealthzPing,
            "/healthz/syncloop" => Route::HealthzSyncLoop,
            "/pods" | "/pods/" => Route::Pods,
            "/runningpods" | "/runningpods/" => Route::RunningPods,
            "/configz" => Route::Configz,
            "/metrics" => Route::Metrics,
            "/metrics/probes" => Route::ProbeMetrics,
            "/metrics/resource" => Route::ResourceMetrics,
            "/stats/summary" => Route::StatsSummary,
            p if p.starts_with("/run/") => Route::Run,
            p if p.starts_with("/containerLogs/") => Route::ContainerLogs,
            p if p.starts_with("/exec/") => Route::Stream(StreamKind::Exec),
            p if p.starts_with("/attach/") => Route::Stream(StreamKind::Attach),
            p if p.starts_with("/portForward/") => Route::Stream(StreamKind::PortForward),
            p => Route::Unserved(Unserved {
                subresource: subresource_of(p),
                creates: ["/exec", "/attach", "/portForward", "/run"]
                    .iter()
                    .any(|prefix| is_subpath(p, prefix)),
                label: label_of(p),
            }),
        }
    }

    /// One of the health checks.
    pub(crate) fn is_healthz(self) -> bool {
        matches!(
            self,
            Route::Healthz | Route::HealthzPing | Route::HealthzSyncLoop
        )
    }

    /// Metrics or statistics.
    pub(crate) fn is_stats(self) -> bool {
        matches!(
            self,
            Route::Metrics | Route::ProbeMetrics | Route::ResourceMetrics | Route::StatsSummary
        )
    }

    /// The `nodes` subresource it is authorized as, as upstream's kubelet
    /// maps paths (v1.20): `stats` under `/stats/`, `metrics` under
    /// `/metrics`, `log` under `/logs/`, `spec` under `/spec/`, `proxy` for
    /// the rest. `/spec` is v1.20's (v1.21 dropped it with the endpoint);
    /// later versions' fine-grained paths (`/pods`, `/healthz`, `/configz`)
    /// stay `proxy`, which their fallback also asks.
    pub(crate) fn subresource(self) -> &'static str {
        match self {
            Route::Metrics | Route::ProbeMetrics | Route::ResourceMetrics => "metrics",
            Route::StatsSummary => "stats",
            Route::Unserved(u) => u.subresource,
            _ => "proxy",
        }
    }

    /// Whether it is authorized as `create` whatever the method (see
    /// [`super::auth::attributes`]).
    pub(crate) fn always_creates(self) -> bool {
        match self {
            Route::Run | Route::Stream(_) => true,
            Route::Unserved(u) => u.creates,
            _ => false,
        }
    }

    /// The path label of `kubelet_http_requests_total`, as upstream cuts
    /// it (the first element, and the second too under `/metrics/`), or
    /// [`OTHER`] for a root that is not one of upstream's.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Route::Healthz | Route::HealthzPing | Route::HealthzSyncLoop => "healthz",
            Route::Pods => "pods",
            Route::RunningPods => "runningpods",
            Route::Configz => "configz",
            Route::Metrics => "metrics",
            Route::ProbeMetrics => "metrics/probes",
            Route::ResourceMetrics => "metrics/resource",
            Route::StatsSummary => "stats",
            Route::Run => "run",
            Route::ContainerLogs => "containerLogs",
            Route::Stream(StreamKind::Exec) => "exec",
            Route::Stream(StreamKind::Attach) => "attach",
            Route::Stream(StreamKind::PortForward) => "portForward",
            Route::Unserved(u) => u.label,
        }
    }

    /// Whether upstream's table counts it as long-running. Its lower-case
    /// "portforward" never matches the `/portForward/` path: kept, as the
    /// label's values are what dashboards read.
    pub(crate) fn long_running(self) -> bool {
        matches!(self.label(), "exec" | "attach" | "portforward" | "debug")
    }
}

fn subresource_of(path: &str) -> &'static str {
    if is_subpath(path, "/stats/") {
        "stats"
    } else if is_subpath(path, "/metrics") {
        "metrics"
    } else if is_subpath(path, "/logs/") {
        "log"
    } else if is_subpath(path, "/spec/") {
        "spec"
    } else {
        "proxy"
    }
}

fn label_of(path: &str) -> &'static str {
    let mut parts = path.strip_prefix('/').unwrap_or(path).splitn(3, '/');
    let first = parts.next().unwrap_or("");
    let find = |root: &str| HTTP_PATH_ROOTS.iter().find(|r| **r == root).copied();
    let label = match (first, parts.next()) {
        ("metrics", Some(second)) => find(&format!("metrics/{second}")),
        _ => find(first),
    };
    label.unwrap_or(OTHER)
}

/// `path` is `prefix` (without its trailing slash) or below it.
fn is_subpath(path: &str, prefix: &str) -> bool {
    let prefix = prefix.trim_end_matches('/');
    match path.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn served_paths_have_their_routes_and_others_are_unserved() {
        for (path, route) in [
            ("/healthz", Route::Healthz),
            ("/healthz/syncloop", Route::HealthzSyncLoop),
            ("/pods/", Route::Pods),
            ("/runningpods", Route::RunningPods),
            ("/metrics/probes", Route::ProbeMetrics),
            ("/stats/summary", Route::StatsSummary),
            ("/run/ns/pod/c", Route::Run),
            ("/containerLogs/ns/pod/c", Route::ContainerLogs),
            (
                "/portForward/ns/pod",
                Route::Stream(StreamKind::PortForward),
            ),
        ] {
            assert_eq!(Route::of_path(path), route, "{path}");
        }
        for path in [
            "/run",
            "/exec",
            "/stats/",
            "/healthz/log",
            "/podsx",
            "/",
            "",
        ] {
            assert!(matches!(Route::of_path(path), Route::Unserved(_)), "{path}");
        }
    }

    #[test]
    fn labels_come_from_a_fixed_set() {
        for (path, label) in [
            ("/pods", "pods"),
            ("/metrics/cadvisor", "metrics/cadvisor"),
            ("/metrics/other", OTHER),
            ("/exec/a/b/c", "exec"),
            ("/debug/pprof/heap", "debug"),
            ("/logs/syslog", "logs"),
            ("/x1", OTHER),
            ("/x2/y", OTHER),
            ("/", OTHER),
        ] {
            assert_eq!(Route::of_path(path).label(), label, "{path}");
        }
        for route in [
            Route::of_path("/exec/a/b/c"),
            Route::of_path("/attach/a/b/c"),
            Route::of_path("/debug/pprof/"),
            Route::of_path("/exec"),
        ] {
            assert!(route.long_running(), "{route:?}");
        }
        assert!(!Route::of_path("/portForward/a/b").long_running());
    }
}

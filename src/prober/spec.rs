//! Probe specs as the prober uses them: a container's `livenessProbe`,
//! `readinessProbe` or `startupProbe` with the API defaults applied (period
//! 10 s, timeout 1 s, thresholds 1 and 3) and its handler resolved against
//! the container (a named port becomes a number), so a bad spec is found
//! once, when the pod is added.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Probe};

/// Which of a container's three probes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum ProbeKind {
    Liveness,
    Readiness,
    Startup,
}

impl ProbeKind {
    pub(crate) const ALL: [ProbeKind; 3] = [
        ProbeKind::Liveness,
        ProbeKind::Readiness,
        ProbeKind::Startup,
    ];

    /// The name upstream's events and logs use: `Liveness probe failed: ...`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            ProbeKind::Liveness => "Liveness",
            ProbeKind::Readiness => "Readiness",
            ProbeKind::Startup => "Startup",
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }

    /// The container's probe of this kind, if it has one.
    pub(crate) fn of(self, c: &Container) -> Option<&Probe> {
        match self {
            ProbeKind::Liveness => c.liveness_probe.as_ref(),
            ProbeKind::Readiness => c.readiness_probe.as_ref(),
            ProbeKind::Startup => c.startup_probe.as_ref(),
        }
    }
}

/// What a probe does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    /// Run a command in the container (CRI ExecSync); exit code 0 passes.
    Exec(Vec<String>),
    /// GET a URL; 200-399 passes.
    Http(HttpGet),
    /// Open a TCP connection; connecting passes.
    Tcp { host: Option<String>, port: u16 },
    /// A probe tinylet cannot run (gRPC, or no handler, or a bad port): it
    /// errors every time, and an errored probe leaves its result alone.
    Unsupported(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpGet {
    /// `http` or `https`.
    pub scheme: String,
    /// The host to connect to; the pod's IP when unset.
    pub host: Option<String>,
    pub port: u16,
    pub path: String,
    pub headers: Vec<(String, String)>,
}

/// One probe with the API defaults applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProbeSpec {
    pub(crate) action: Action,
    pub(crate) initial_delay: Duration,
    pub(crate) period: Duration,
    pub(crate) timeout: Duration,
    pub(crate) success_threshold: u32,
    pub(crate) failure_threshold: u32,
    /// The probe's own grace period for the kill a failure causes.
    pub(crate) termination_grace: Option<i64>,
}

/// A positive count of seconds or `default` (the API rejects 0 and defaults
/// an unset field; static pods may carry either).
fn positive(v: Option<i32>, default: u32) -> u32 {
    match v {
        Some(n) if n > 0 => n.unsigned_abs(),
        _ => default,
    }
}

impl ProbeSpec {
    pub(crate) fn new(p: &Probe, c: &Container) -> ProbeSpec {
        ProbeSpec {
            action: action(p, c),
            initial_delay: Duration::from_secs(u64::from(
                p.initial_delay_seconds.unwrap_or(0).max(0).unsigned_abs(),
            )),
            period: Duration::from_secs(positive(p.period_seconds, 10).into()),
            timeout: Duration::from_secs(positive(p.timeout_seconds, 1).into()),
            success_threshold: positive(p.success_threshold, 1),
            failure_threshold: positive(p.failure_threshold, 3),
            termination_grace: p.termination_grace_period_seconds,
        }
    }
}

fn action(p: &Probe, c: &Container) -> Action {
    if let Some(e) = &p.exec {
        return Action::Exec(e.command.clone().unwrap_or_default());
    }
    if let Some(h) = &p.http_get {
        let port = match resolve_port(&h.port, c) {
            Ok(p) => p,
            Err(e) => return Action::Unsupported(e),
        };
        return Action::Http(HttpGet {
            scheme: h.scheme.as_deref().unwrap_or("HTTP").to_ascii_lowercase(),
            host: h.host.clone().filter(|h| !h.is_empty()),
            port,
            path: h.path.clone().unwrap_or_default(),
            headers: h
                .http_headers
                .iter()
                .flatten()
                .map(|h| (h.name.clone(), h.value.clone()))
                .collect(),
        });
    }
    if let Some(t) = &p.tcp_socket {
        return match resolve_port(&t.port, c) {
            Ok(port) => Action::Tcp {
                host: t.host.clone().filter(|h| !h.is_empty()),
                port,
            },
            Err(e) => Action::Unsupported(e),
        };
    }
    if p.grpc.is_some() {
        return Action::Unsupported("gRPC probes are not supported".into());
    }
    Action::Unsupported("the probe has no handler (exec, httpGet or tcpSocket)".into())
}

pub(crate) use crate::runtime::resolve_port;

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ContainerPort, HTTPGetAction, HTTPHeader, TCPSocketAction};
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

    fn container() -> Container {
        Container {
            name: "app".into(),
            ports: Some(vec![ContainerPort {
                name: Some("http".into()),
                container_port: 8080,
                ..Default::default()
            }]),
            ..Default::default()
        }
    }

    #[test]
    fn defaults_apply_to_unset_and_zero_fields() {
        let p = Probe {
            exec: Some(k8s_openapi::api::core::v1::ExecAction {
                command: Some(vec!["true".into()]),
            }),
            period_seconds: Some(0),
            ..Default::default()
        };
        let s = ProbeSpec::new(&p, &container());
        assert_eq!(s.action, Action::Exec(vec!["true".into()]));
        assert_eq!(s.period, Duration::from_secs(10));
        assert_eq!(s.timeout, Duration::from_secs(1));
        assert_eq!((s.success_threshold, s.failure_threshold), (1, 3));
        assert_eq!(s.initial_delay, Duration::ZERO);
    }

    #[test]
    fn ports_resolve_by_number_name_or_numeric_string() {
        let c = container();
        assert_eq!(resolve_port(&IntOrString::Int(80), &c), Ok(80));
        assert_eq!(
            resolve_port(&IntOrString::String("http".into()), &c),
            Ok(8080)
        );
        assert_eq!(
            resolve_port(&IntOrString::String("9090".into()), &c),
            Ok(9090)
        );
        assert_eq!(
            resolve_port(&IntOrString::String("metrics".into()), &c),
            Err("couldn't find port: metrics in container \"app\"".into())
        );
        assert_eq!(
            resolve_port(&IntOrString::Int(70000), &c),
            Err("invalid port number: 70000".into())
        );
    }

    #[test]
    fn http_and_tcp_handlers_are_resolved() {
        let p = Probe {
            http_get: Some(HTTPGetAction {
                port: IntOrString::String("http".into()),
                path: Some("/healthz".into()),
                scheme: Some("HTTPS".into()),
                http_headers: Some(vec![HTTPHeader {
                    name: "X-Probe".into(),
                    value: "1".into(),
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            ProbeSpec::new(&p, &container()).action,
            Action::Http(HttpGet {
                scheme: "https".into(),
                host: None,
                port: 8080,
                path: "/healthz".into(),
                headers: vec![("X-Probe".into(), "1".into())],
            })
        );
        let p = Probe {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::Int(6379),
                host: Some("10.0.0.1".into()),
            }),
            ..Default::default()
        };
        assert_eq!(
            ProbeSpec::new(&p, &container()).action,
            Action::Tcp {
                host: Some("10.0.0.1".into()),
                port: 6379
            }
        );
        let p = Probe::default();
        assert!(matches!(
            ProbeSpec::new(&p, &container()).action,
            Action::Unsupported(_)
        ));
    }
}

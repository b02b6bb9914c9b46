//! Service links (upstream `getServiceEnvVarMap` and `envvars`): the
//! `KUBERNETES_SERVICE_HOST`-style variables every container of a pod
//! gets, for the `kubernetes` Service of the `default` namespace and, when
//! the pod's `enableServiceLinks` is true (the default), for every Service
//! of its own namespace that has a cluster IP. A `reflector/services`
//! thread lists and watches `/api/v1/services`; of each Service only its
//! name, namespace, cluster IP and ports' name, number and protocol are
//! kept.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use parking_lot::Mutex;
use serde::Deserialize;

use crate::kube::{Client, ListWatch, Reflector};

/// The namespace and name of the Service whose variables every pod gets
/// (upstream: `--master-service-namespace`, default `default`).
const MASTER_NAMESPACE: &str = "default";
const MASTER_SERVICE: &str = "kubernetes";

/// What the variables need of one Service.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(from = "RawService")]
pub(crate) struct ServiceLink {
    /// Only the name and namespace are kept.
    metadata: ObjectMeta,
    cluster_ip: String,
    ports: Vec<LinkPort>,
}

#[derive(Debug, Clone, PartialEq)]
struct LinkPort {
    name: String,
    port: i32,
    /// As written; empty means TCP.
    protocol: String,
}

#[derive(Deserialize)]
struct RawService {
    metadata: ObjectMeta,
    #[serde(default)]
    spec: Option<RawSpec>,
}

#[derive(Deserialize)]
struct RawSpec {
    #[serde(rename = "clusterIP", default)]
    cluster_ip: Option<String>,
    #[serde(default)]
    ports: Option<Vec<RawPort>>,
}

#[derive(Deserialize)]
struct RawPort {
    #[serde(default)]
    name: Option<String>,
    port: i32,
    #[serde(default)]
    protocol: Option<String>,
}

impl From<RawService> for ServiceLink {
    fn from(raw: RawService) -> Self {
        let spec = raw.spec.unwrap_or(RawSpec {
            cluster_ip: None,
            ports: None,
        });
        ServiceLink {
            metadata: ObjectMeta {
                name: raw.metadata.name,
                namespace: raw.metadata.namespace,
                ..ObjectMeta::default()
            },
            cluster_ip: spec.cluster_ip.unwrap_or_default(),
            ports: spec
                .ports
                .unwrap_or_default()
                .into_iter()
                .map(|p| LinkPort {
                    name: p.name.unwrap_or_default(),
                    port: p.port,
                    protocol: p.protocol.unwrap_or_default(),
                })
                .collect(),
        }
    }
}

impl k8s_openapi::Resource for ServiceLink {
    const API_VERSION: &'static str = "v1";
    const GROUP: &'static str = "";
    const KIND: &'static str = "Service";
    const VERSION: &'static str = "v1";
    const URL_PATH_SEGMENT: &'static str = "services";
    type Scope = k8s_openapi::NamespaceResourceScope;
}

impl k8s_openapi::Metadata for ServiceLink {
    type Ty = ObjectMeta;
    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl ServiceLink {
    fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or("")
    }

    fn namespace(&self) -> &str {
        self.metadata.namespace.as_deref().unwrap_or("")
    }

    /// Upstream `IsServiceIPSet`: neither empty nor `None` (headless).
    fn has_cluster_ip(&self) -> bool {
        !self.cluster_ip.is_empty() && self.cluster_ip != "None"
    }

    /// Upstream `envvars.FromServices` for this one Service.
    fn push_vars(&self, out: &mut Vec<(String, String)>) {
        let prefix = var_name(self.name());
        out.push((format!("{prefix}_SERVICE_HOST"), self.cluster_ip.clone()));
        let Some(first) = self.ports.first() else {
            // The API requires ports of a Service with a cluster IP.
            return;
        };
        let port_var = format!("{prefix}_SERVICE_PORT");
        out.push((port_var.clone(), first.port.to_string()));
        for p in self.ports.iter().filter(|p| !p.name.is_empty()) {
            out.push((
                format!("{port_var}_{}", var_name(&p.name)),
                p.port.to_string(),
            ));
        }
        // Docker's link variables.
        let host = if self.cluster_ip.contains(':') {
            format!("[{}]", self.cluster_ip)
        } else {
            self.cluster_ip.clone()
        };
        for (i, p) in self.ports.iter().enumerate() {
            let protocol = if p.protocol.is_empty() {
                "TCP"
            } else {
                p.protocol.as_str()
            };
            let lower = protocol.to_lowercase();
            let url = format!("{lower}://{host}:{}", p.port);
            if i == 0 {
                out.push((format!("{prefix}_PORT"), url.clone()));
            }
            let pp = format!("{prefix}_PORT_{}_{}", p.port, protocol.to_uppercase());
            out.push((pp.clone(), url));
            out.push((format!("{pp}_PROTO"), lower));
            out.push((format!("{pp}_PORT"), p.port.to_string()));
            out.push((format!("{pp}_ADDR"), self.cluster_ip.clone()));
        }
    }
}

/// A Service or port name as a variable name: upper case, `-` as `_`.
fn var_name(name: &str) -> String {
    name.replace('-', "_").to_uppercase()
}

/// The Services the node knows, shared by the reflector (writer) and the
/// pod workers (readers); `None` until the first list was read.
#[derive(Default)]
pub(crate) struct Services {
    known: Mutex<Option<Vec<Arc<ServiceLink>>>>,
    /// UIDs of API pods restored from checkpoints, which need not wait for
    /// the first list.
    restored: Mutex<HashSet<String>>,
}

impl Services {
    /// Lets the pods of `uids`, restored from checkpoints at start, be
    /// started before the Services were read (without their variables).
    /// Upstream holds every API pod until then; restored pods exist so that
    /// a node rebooted during an apiserver outage runs its pods anyway, and
    /// an outage is when the list cannot come.
    pub(crate) fn restored(&self, uids: impl IntoIterator<Item = String>) {
        self.restored.lock().extend(uids);
    }

    /// Whether pod `uid` was restored from a checkpoint.
    pub(crate) fn is_restored(&self, uid: &str) -> bool {
        self.restored.lock().contains(uid)
    }

    /// Replaces the known Services (the reflector's complete set).
    pub(crate) fn set(&self, services: Vec<Arc<ServiceLink>>) {
        *self.known.lock() = Some(services);
    }

    /// The service variables of a pod in `namespace`, or `None` while the
    /// Services were never read: the master Service's always, the
    /// namespace's own when `enable_links`. A Service of the pod's
    /// namespace named like the master one takes its place, as upstream.
    pub(crate) fn env(&self, namespace: &str, enable_links: bool) -> Option<Vec<(String, String)>> {
        let known = self.known.lock();
        let mut chosen: BTreeMap<&str, &ServiceLink> = BTreeMap::new();
        for s in known.as_ref()?.iter().filter(|s| s.has_cluster_ip()) {
            if s.namespace() == namespace && enable_links {
                chosen.insert(s.name(), s);
            } else if s.namespace() == MASTER_NAMESPACE && s.name() == MASTER_SERVICE {
                chosen.entry(s.name()).or_insert(s);
            }
        }
        let mut out = Vec::new();
        for s in chosen.values() {
            s.push_vars(&mut out);
        }
        Some(out)
    }
}

/// Starts the `reflector/services` thread feeding `services`.
pub(crate) fn start(client: Client, services: Arc<Services>) -> std::io::Result<Reflector> {
    let lw = ListWatch {
        path: "/api/v1/services".into(),
        field_selector: None,
    };
    let sink = Box::new(move |list: Vec<Arc<ServiceLink>>| services.set(list));
    Reflector::start::<ServiceLink>("services", client, lw, sink)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn svc(ns: &str, name: &str, ip: &str, ports: serde_json::Value) -> Arc<ServiceLink> {
        let v = json!({
            "kind": "Service",
            "metadata": {"name": name, "namespace": ns, "labels": {"a": "b"}, "uid": "u"},
            "spec": {"clusterIP": ip, "ports": ports, "selector": {"app": "x"}, "type": "ClusterIP"},
            "status": {"loadBalancer": {}},
        });
        Arc::new(serde_json::from_value(v).unwrap())
    }

    fn get<'a>(env: &'a [(String, String)], k: &str) -> Option<&'a str> {
        env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
    }

    #[test]
    fn only_what_the_variables_need_is_kept() {
        let s = svc("ns", "web", "10.0.0.9", json!([{"port": 80}]));
        assert_eq!(s.metadata.labels, None);
        assert_eq!(s.metadata.uid, None);
        assert_eq!(s.name(), "web");
        assert_eq!(s.namespace(), "ns");
    }

    #[test]
    fn variables_as_upstream_names_them() {
        let services = Services::default();
        assert_eq!(services.env("default", true), None, "not synced yet");
        services.set(vec![
            svc(
                "default",
                "kubernetes",
                "10.96.0.1",
                json!([{"name": "https", "port": 443, "protocol": "TCP"}]),
            ),
            svc(
                "app",
                "my-db",
                "10.96.5.5",
                json!([{"port": 5432}, {"name": "metrics-http", "port": 9187, "protocol": "UDP"}]),
            ),
            svc("app", "headless", "None", json!([{"port": 1}])),
            svc("app", "pending", "", json!([{"port": 2}])),
            svc("other", "elsewhere", "10.96.7.7", json!([{"port": 3}])),
            svc("app", "v6", "fd00::1", json!([{"port": 8080}])),
        ]);
        let env = services.env("app", true).unwrap();
        let want = [
            ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
            ("KUBERNETES_SERVICE_PORT", "443"),
            ("KUBERNETES_SERVICE_PORT_HTTPS", "443"),
            ("KUBERNETES_PORT", "tcp://10.96.0.1:443"),
            ("KUBERNETES_PORT_443_TCP", "tcp://10.96.0.1:443"),
            ("KUBERNETES_PORT_443_TCP_PROTO", "tcp"),
            ("KUBERNETES_PORT_443_TCP_PORT", "443"),
            ("KUBERNETES_PORT_443_TCP_ADDR", "10.96.0.1"),
            ("MY_DB_SERVICE_HOST", "10.96.5.5"),
            ("MY_DB_SERVICE_PORT", "5432"),
            ("MY_DB_SERVICE_PORT_METRICS_HTTP", "9187"),
            ("MY_DB_PORT", "tcp://10.96.5.5:5432"),
            ("MY_DB_PORT_5432_TCP", "tcp://10.96.5.5:5432"),
            ("MY_DB_PORT_9187_UDP", "udp://10.96.5.5:9187"),
            ("MY_DB_PORT_9187_UDP_PROTO", "udp"),
            ("MY_DB_PORT_9187_UDP_ADDR", "10.96.5.5"),
            ("V6_PORT", "tcp://[fd00::1]:8080"),
            ("V6_PORT_8080_TCP_ADDR", "fd00::1"),
        ];
        for (k, v) in want {
            assert_eq!(get(&env, k), Some(v), "{k} in {env:?}");
        }
        for gone in [
            "HEADLESS_SERVICE_HOST",
            "PENDING_SERVICE_HOST",
            "ELSEWHERE_SERVICE_HOST",
        ] {
            assert_eq!(get(&env, gone), None, "{gone}");
        }
        let names: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
        let mut dedup = names.clone();
        dedup.sort();
        dedup.dedup();
        assert_eq!(dedup.len(), names.len(), "no name twice: {names:?}");

        // Links off: only the master service.
        let env = services.env("app", false).unwrap();
        assert_eq!(get(&env, "KUBERNETES_SERVICE_HOST"), Some("10.96.0.1"));
        assert_eq!(get(&env, "MY_DB_SERVICE_HOST"), None);
        assert_eq!(env.len(), 8);
        // Another namespace sees its own.
        let env = services.env("other", true).unwrap();
        assert_eq!(get(&env, "ELSEWHERE_SERVICE_PORT"), Some("3"));
        assert_eq!(get(&env, "MY_DB_SERVICE_HOST"), None);
    }

    #[test]
    fn restored_pods_are_remembered() {
        let services = Services::default();
        services.restored(["u1".to_string()]);
        assert!(services.is_restored("u1"));
        assert!(!services.is_restored("u2"));
    }

    #[test]
    fn a_namespace_service_named_kubernetes_wins_over_the_master_one() {
        let services = Services::default();
        services.set(vec![
            svc("app", "kubernetes", "10.1.1.1", json!([{"port": 8443}])),
            svc("default", "kubernetes", "10.96.0.1", json!([{"port": 443}])),
        ]);
        let env = services.env("app", true).unwrap();
        assert_eq!(get(&env, "KUBERNETES_SERVICE_HOST"), Some("10.1.1.1"));
        let env = services.env("app", false).unwrap();
        assert_eq!(get(&env, "KUBERNETES_SERVICE_HOST"), Some("10.96.0.1"));
        let env = services.env("default", false).unwrap();
        assert_eq!(get(&env, "KUBERNETES_SERVICE_HOST"), Some("10.96.0.1"));
    }
}

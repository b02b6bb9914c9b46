//! The downward API's values (upstream `pkg/fieldpath` and the resource
//! helpers): a pod field named by its path (`metadata.name`,
//! `metadata.labels['app']`, `status.podIP` ...) and a container's resource
//! limit or request scaled by a divisor, as strings.
//!
//! Pure functions: env vars (`valueFrom.fieldRef` / `resourceFieldRef`) and
//! downward API volumes both read their values here. Errors name the field
//! path or the resource.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::config::validation::dns1123_subdomain_error;
use crate::quantity::parse_quantity_wide;

/// A field path or resource that has no value here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FieldPathError {
    /// The field path (`metadata.labels['a']`) or resource (`limits.cpu`).
    pub(crate) path: String,
    pub(crate) message: String,
}

impl fmt::Display for FieldPathError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

impl std::error::Error for FieldPathError {}

fn error(path: &str, message: impl Into<String>) -> FieldPathError {
    FieldPathError {
        path: path.to_string(),
        message: message.into(),
    }
}

/// The node's allocatable resources that stand in for a container's missing
/// limits (upstream merges them in before reading `limits.*`): quantities as
/// the Node's `status.allocatable` has them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeAllocatable {
    pub(crate) cpu: Option<String>,
    pub(crate) memory: Option<String>,
    pub(crate) ephemeral_storage: Option<String>,
}

impl NodeAllocatable {
    /// From a `status.allocatable` map (resource name to quantity).
    pub(crate) fn from_map(allocatable: &BTreeMap<String, String>) -> Self {
        NodeAllocatable {
            cpu: allocatable.get("cpu").cloned(),
            memory: allocatable.get("memory").cloned(),
            ephemeral_storage: allocatable.get("ephemeral-storage").cloned(),
        }
    }

    fn get(&self, resource: &str) -> Option<&str> {
        match resource {
            "cpu" => self.cpu.as_deref(),
            "memory" => self.memory.as_deref(),
            "ephemeral-storage" => self.ephemeral_storage.as_deref(),
            _ => None,
        }
    }
}

/// Splits `metadata.labels['key']` into `("metadata.labels", "key")`; any
/// other path has no subscript.
pub(crate) fn split_subscript(path: &str) -> Option<(&str, &str)> {
    let inner = path.strip_suffix("']")?;
    let (base, key) = inner.split_once("['")?;
    (!base.is_empty()).then_some((base, key))
}

/// The value of the pod field at `path`, as the downward API gives it.
///
/// Supported: `metadata.name`, `metadata.namespace`, `metadata.uid`,
/// `metadata.labels` and `metadata.annotations` (the whole map as sorted
/// `key="value"` lines, or one key with `['key']`), `spec.nodeName`,
/// `spec.serviceAccountName`, `status.podIP`, `status.podIPs`,
/// `status.hostIP`, `status.hostIPs` (lists comma-separated). The status
/// fields come from `pod.status`; a caller that knows better (the runtime
/// at container creation) substitutes its own values.
pub(crate) fn field_value(pod: &Pod, path: &str) -> Result<String, FieldPathError> {
    let meta = &pod.metadata;
    if let Some((base, key)) = split_subscript(path) {
        return match base {
            "metadata.labels" => {
                check_subscript(path, key)?;
                Ok(lookup(meta.labels.as_ref(), key))
            }
            "metadata.annotations" => {
                // Annotation keys are checked case-insensitively, as upstream.
                check_subscript(path, &key.to_lowercase())?;
                Ok(lookup(meta.annotations.as_ref(), key))
            }
            _ => Err(error(path, "this field path does not support a subscript")),
        };
    }
    let spec = pod.spec.as_ref();
    let status = pod.status.as_ref();
    let text = |v: Option<&String>| v.cloned().unwrap_or_default();
    Ok(match path {
        "metadata.name" => text(meta.name.as_ref()),
        "metadata.namespace" => text(meta.namespace.as_ref()),
        "metadata.uid" => text(meta.uid.as_ref()),
        "metadata.labels" => format_map(meta.labels.as_ref()),
        "metadata.annotations" => format_map(meta.annotations.as_ref()),
        "spec.nodeName" => text(spec.and_then(|s| s.node_name.as_ref())),
        "spec.serviceAccountName" => text(spec.and_then(|s| s.service_account_name.as_ref())),
        "status.podIP" => text(status.and_then(|s| s.pod_ip.as_ref())),
        "status.podIPs" => status
            .and_then(|s| s.pod_ips.as_ref())
            .map(|ips| join(ips.iter().map(|i| i.ip.as_str())))
            .unwrap_or_default(),
        "status.hostIP" => text(status.and_then(|s| s.host_ip.as_ref())),
        "status.hostIPs" => status
            .and_then(|s| s.host_ips.as_ref())
            .map(|ips| join(ips.iter().map(|i| i.ip.as_str())))
            .unwrap_or_default(),
        _ => return Err(error(path, "unsupported field path")),
    })
}

fn join<'a>(items: impl Iterator<Item = &'a str>) -> String {
    items.collect::<Vec<_>>().join(",")
}

fn lookup(map: Option<&BTreeMap<String, String>>, key: &str) -> String {
    map.and_then(|m| m.get(key)).cloned().unwrap_or_default()
}

/// A subscript must be a qualified name: `[prefix/]name`, the prefix a DNS
/// subdomain, the name at most 63 alphanumerics, '-', '_' or '.', starting
/// and ending alphanumeric.
fn check_subscript(path: &str, key: &str) -> Result<(), FieldPathError> {
    let bad = |why: String| Err(error(path, format!("invalid key subscript: {why}")));
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        if p.is_empty() {
            return bad("prefix part must be non-empty".into());
        }
        if let Some(e) = dns1123_subdomain_error(p) {
            return bad(format!("prefix part {e}"));
        }
    }
    if name.is_empty() {
        return bad("name part must be non-empty".into());
    }
    if name.len() > 63 {
        return bad("name part must be no more than 63 characters".into());
    }
    let alnum = |c: char| c.is_ascii_alphanumeric();
    let ok = name.starts_with(alnum)
        && name.ends_with(alnum)
        && name
            .chars()
            .all(|c| alnum(c) || matches!(c, '-' | '_' | '.'));
    if !ok {
        return bad(format!(
            "name part {name:?} must consist of alphanumeric characters, '-', '_' or '.', \
             and must start and end with an alphanumeric character"
        ));
    }
    Ok(())
}

/// A label or annotation map the way the downward API writes it: one
/// `key="value"` line per key in key order, the value quoted as Go's `%q`
/// does, no newline after the last.
pub(crate) fn format_map(map: Option<&BTreeMap<String, String>>) -> String {
    let Some(map) = map else {
        return String::new();
    };
    let lines: Vec<String> = map
        .iter()
        .map(|(k, v)| format!("{k}={}", go_quote(v)))
        .collect();
    lines.join("\n")
}

/// A string quoted as Go's `strconv.Quote`: `"` and `\` escaped, the usual
/// C escapes, other non-printable characters as `\xNN`, `\uNNNN` or
/// `\UNNNNNNNN`.
pub(crate) fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if is_go_printable(c) => out.push(c),
            c if (c as u32) < 0x80 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if (c as u32) <= 0xffff => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push_str(&format!("\\U{:08x}", c as u32)),
        }
    }
    out.push('"');
    out
}

/// Go's `unicode.IsPrint`, closely enough: no control characters, no space
/// other than U+0020, and none of the invisible format characters.
fn is_go_printable(c: char) -> bool {
    if c == ' ' {
        return true;
    }
    !(c.is_control()
        || c.is_whitespace()
        || matches!(c, '\u{ad}' | '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}'
            | '\u{2060}'..='\u{2064}' | '\u{feff}' | '\u{fff9}'..='\u{fffb}')
        || ('\u{e000}'..='\u{f8ff}').contains(&c))
}

/// The value of `resource` (`limits.cpu`, `requests.memory`,
/// `limits.ephemeral-storage`, `requests.hugepages-2Mi` ...) of `container`,
/// divided by `divisor` (default and `0`: 1) and rounded up, as the
/// downward API gives it. A cpu, memory or ephemeral-storage limit that is
/// missing or zero is the node's allocatable amount, as upstream.
pub(crate) fn resource_value(
    container: &Container,
    resource: &str,
    divisor: Option<&str>,
    allocatable: &NodeAllocatable,
) -> Result<String, FieldPathError> {
    let (kind, name) = resource
        .split_once('.')
        .filter(|(kind, name)| {
            matches!(*kind, "limits" | "requests")
                && (matches!(*name, "cpu" | "memory" | "ephemeral-storage")
                    || name.starts_with("hugepages-"))
        })
        .ok_or_else(|| error(resource, "unsupported container resource"))?;
    // Nanounits: exact for every quantity but sub-nano fractions, which
    // round up (as the API's own conversions do).
    let nanos = |what: &str, q: &str| {
        parse_quantity_wide(q, 9)
            .ok_or_else(|| error(resource, format!("{what}: invalid quantity {q:?}")))
    };
    let resources = container.resources.as_ref();
    let list = match kind {
        "limits" => resources.and_then(|r| r.limits.as_ref()),
        _ => resources.and_then(|r| r.requests.as_ref()),
    };
    let mut value = match list.and_then(|l| l.get(name)) {
        Some(q) => nanos(&format!("{kind} of container {:?}", container.name), &q.0)?,
        None => 0,
    };
    if kind == "limits" && value == 0 {
        if let Some(q) = allocatable.get(name) {
            value = nanos("node allocatable", q)?;
        }
    }
    let divisor = match divisor {
        Some(d) => nanos("divisor", d)?,
        None => 0,
    };
    let divisor = if divisor == 0 { 1_000_000_000 } else { divisor };
    let ratio = value.div_ceil(divisor);
    Ok(i64::try_from(ratio).unwrap_or(i64::MAX).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{HostIP, PodIP, PodSpec, PodStatus, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pod() -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("shop".into()),
                uid: Some("u-1".into()),
                labels: Some(BTreeMap::from([
                    ("app".into(), "web".into()),
                    ("tier".into(), "front end".into()),
                ])),
                annotations: Some(BTreeMap::from([
                    ("example.com/Note".into(), "say \"hi\"\n\tand \\ go".into()),
                    ("a".into(), "é\u{0}\u{200b}".into()),
                ])),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some("edge-1".into()),
                service_account_name: Some("robot".into()),
                ..Default::default()
            }),
            status: Some(PodStatus {
                pod_ip: Some("10.1.0.5".into()),
                pod_ips: Some(vec![
                    PodIP {
                        ip: "10.1.0.5".into(),
                    },
                    PodIP {
                        ip: "fd00::5".into(),
                    },
                ]),
                host_ip: Some("192.168.1.2".into()),
                host_ips: Some(vec![HostIP {
                    ip: "192.168.1.2".into(),
                }]),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn plain_fields() {
        let p = pod();
        for (path, want) in [
            ("metadata.name", "web"),
            ("metadata.namespace", "shop"),
            ("metadata.uid", "u-1"),
            ("spec.nodeName", "edge-1"),
            ("spec.serviceAccountName", "robot"),
            ("status.podIP", "10.1.0.5"),
            ("status.podIPs", "10.1.0.5,fd00::5"),
            ("status.hostIP", "192.168.1.2"),
            ("status.hostIPs", "192.168.1.2"),
            ("metadata.labels['app']", "web"),
            ("metadata.labels['missing']", ""),
            (
                "metadata.annotations['example.com/Note']",
                "say \"hi\"\n\tand \\ go",
            ),
        ] {
            assert_eq!(field_value(&p, path).as_deref(), Ok(want), "{path}");
        }
        let empty = Pod::default();
        assert_eq!(field_value(&empty, "status.podIPs").as_deref(), Ok(""));
        assert_eq!(field_value(&empty, "metadata.labels").as_deref(), Ok(""));
    }

    #[test]
    fn whole_maps_are_sorted_quoted_lines() {
        let p = pod();
        assert_eq!(
            field_value(&p, "metadata.labels").unwrap(),
            "app=\"web\"\ntier=\"front end\""
        );
        assert_eq!(
            field_value(&p, "metadata.annotations").unwrap(),
            "a=\"é\\x00\\u200b\"\nexample.com/Note=\"say \\\"hi\\\"\\n\\tand \\\\ go\""
        );
        assert_eq!(
            go_quote("\u{7f}\u{1F600}\u{e000}"),
            "\"\\x7f\u{1F600}\\ue000\""
        );
    }

    #[test]
    fn bad_paths_are_named() {
        let p = pod();
        let e = field_value(&p, "spec.restartPolicy").unwrap_err();
        assert_eq!(e.path, "spec.restartPolicy");
        assert_eq!(e.to_string(), "spec.restartPolicy: unsupported field path");
        let e = field_value(&p, "metadata.name['x']").unwrap_err();
        assert!(e.message.contains("subscript"), "{e}");
        let e = field_value(&p, "metadata.labels['-x']").unwrap_err();
        assert_eq!(e.path, "metadata.labels['-x']");
        assert!(e.message.starts_with("invalid key subscript"), "{e}");
        assert!(field_value(&p, "metadata.labels['/x']").is_err());
        assert!(field_value(&p, "metadata.labels['Bad_Prefix/x']").is_err());
        // Annotation keys are lower-cased for the check, not for the lookup.
        assert!(field_value(&p, "metadata.annotations['Example.com/x']").is_ok());
        assert_eq!(
            split_subscript("metadata.labels['a']"),
            Some(("metadata.labels", "a"))
        );
        assert_eq!(split_subscript("['a']"), None);
        assert_eq!(split_subscript("metadata.labels"), None);
    }

    fn container(limits: &[(&str, &str)], requests: &[(&str, &str)]) -> Container {
        let list = |items: &[(&str, &str)]| {
            (!items.is_empty()).then(|| {
                items
                    .iter()
                    .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                    .collect()
            })
        };
        Container {
            name: "app".into(),
            resources: Some(ResourceRequirements {
                limits: list(limits),
                requests: list(requests),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn resources_with_divisors_round_up() {
        let node = NodeAllocatable {
            cpu: Some("4".into()),
            memory: Some("8Gi".into()),
            ephemeral_storage: Some("20G".into()),
        };
        let c = container(
            &[
                ("cpu", "1500m"),
                ("memory", "129Mi"),
                ("hugepages-2Mi", "4Mi"),
            ],
            &[
                ("cpu", "250m"),
                ("memory", "100M"),
                ("ephemeral-storage", "1Gi"),
            ],
        );
        let v = |r: &str, d: Option<&str>| resource_value(&c, r, d, &node).unwrap();
        assert_eq!(v("limits.cpu", None), "2");
        assert_eq!(v("limits.cpu", Some("1m")), "1500");
        assert_eq!(v("limits.cpu", Some("0")), "2");
        assert_eq!(v("requests.cpu", None), "1");
        assert_eq!(v("requests.cpu", Some("1m")), "250");
        assert_eq!(v("limits.memory", None), (129u64 << 20).to_string());
        assert_eq!(v("limits.memory", Some("1Mi")), "129");
        assert_eq!(v("limits.memory", Some("1Gi")), "1");
        assert_eq!(v("limits.memory", Some("1M")), "136"); // 135.27 rounded up
        assert_eq!(v("requests.memory", Some("1Mi")), "96"); // 95.37 rounded up
        assert_eq!(v("requests.ephemeral-storage", Some("1Mi")), "1024");
        assert_eq!(v("limits.hugepages-2Mi", Some("1Mi")), "4");
        assert_eq!(v("requests.hugepages-2Mi", None), "0");
        // No ephemeral-storage limit: the node's allocatable.
        assert_eq!(v("limits.ephemeral-storage", Some("1G")), "20");
    }

    #[test]
    fn missing_limits_fall_back_to_allocatable() {
        let node = NodeAllocatable {
            cpu: Some("3500m".into()),
            memory: Some("2Gi".into()),
            ephemeral_storage: None,
        };
        let c = container(&[("cpu", "0")], &[]);
        let v = |r: &str, d: Option<&str>| resource_value(&c, r, d, &node).unwrap();
        assert_eq!(v("limits.cpu", None), "4");
        assert_eq!(v("limits.cpu", Some("1m")), "3500");
        assert_eq!(v("limits.memory", Some("1Mi")), "2048");
        assert_eq!(v("limits.ephemeral-storage", None), "0");
        assert_eq!(v("requests.memory", None), "0");
        let bare = Container::default();
        assert_eq!(
            resource_value(&bare, "limits.memory", None, &node).unwrap(),
            (2u64 << 30).to_string()
        );
        assert_eq!(
            resource_value(&bare, "limits.memory", None, &NodeAllocatable::default()).unwrap(),
            "0"
        );
        let from_map = NodeAllocatable::from_map(&BTreeMap::from([
            ("cpu".to_string(), "2".to_string()),
            ("pods".to_string(), "110".to_string()),
        ]));
        assert_eq!(from_map.cpu.as_deref(), Some("2"));
        assert_eq!(from_map.memory, None);
    }

    #[test]
    fn bad_resources_are_named() {
        let node = NodeAllocatable::default();
        let c = container(&[("memory", "lots")], &[]);
        let e = resource_value(&c, "limits.gpu", None, &node).unwrap_err();
        assert_eq!(e.to_string(), "limits.gpu: unsupported container resource");
        assert!(resource_value(&c, "cpu", None, &node).is_err());
        let e = resource_value(&c, "limits.memory", None, &node).unwrap_err();
        assert_eq!(e.path, "limits.memory");
        assert!(e.message.contains("\"lots\""), "{e}");
        let e = resource_value(&c, "requests.cpu", Some("x"), &node).unwrap_err();
        assert!(e.message.contains("divisor"), "{e}");
        // Huge values saturate instead of wrapping.
        let big = container(&[("memory", "8Ei")], &[]);
        assert_eq!(
            resource_value(&big, "limits.memory", Some("1n"), &node).unwrap(),
            i64::MAX.to_string()
        );
    }
}

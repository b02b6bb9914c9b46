//! Turning a pod spec into CRI sandbox and container configs.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, Pod};
use protobuf::{EnumOrUnknown, MessageField};

use super::labels::{self, pod_name, pod_namespace, pod_uid};
use crate::cri::api;

/// Where a pod's container logs go: `<logs_root>/<namespace>_<name>_<uid>`,
/// the layout log collectors expect from the kubelet.
pub fn pod_log_dir(logs_root: &Path, pod: &Pod) -> PathBuf {
    logs_root.join(format!(
        "{}_{}_{}",
        pod_namespace(pod),
        pod_name(pod),
        pod_uid(pod)
    ))
}

/// The directory of a pod's volumes under tinylet's root dir.
pub fn pod_dir(root_dir: &Path, uid: &str) -> PathBuf {
    root_dir.join("pods").join(uid)
}

fn namespace_options(pod: &Pod) -> api::NamespaceOption {
    let spec = pod.spec.as_ref();
    let flag = |f: Option<bool>| f.unwrap_or(false);
    let mut o = api::NamespaceOption::new();
    o.network = EnumOrUnknown::new(if flag(spec.and_then(|s| s.host_network)) {
        api::NamespaceMode::NODE
    } else {
        api::NamespaceMode::POD
    });
    o.pid = EnumOrUnknown::new(if flag(spec.and_then(|s| s.host_pid)) {
        api::NamespaceMode::NODE
    } else if flag(spec.and_then(|s| s.share_process_namespace)) {
        api::NamespaceMode::POD
    } else {
        api::NamespaceMode::CONTAINER
    });
    o.ipc = EnumOrUnknown::new(if flag(spec.and_then(|s| s.host_ipc)) {
        api::NamespaceMode::NODE
    } else {
        api::NamespaceMode::POD
    });
    o
}

/// DNS settings for a pod on the pod network: the node's resolver
/// configuration (dnsPolicy Default; tinylet has no cluster DNS yet).
fn dns_config(resolv_conf: &str) -> api::DNSConfig {
    let mut dns = api::DNSConfig::new();
    for line in resolv_conf.lines() {
        let mut words = line.split_whitespace();
        match words.next() {
            Some("nameserver") => dns.servers.extend(words.next().map(String::from)),
            Some("search") | Some("domain") => {
                dns.searches = words.map(String::from).collect();
            }
            Some("options") => dns.options.extend(words.map(String::from)),
            _ => {}
        }
    }
    dns
}

/// The CRI sandbox config for a pod.
pub fn sandbox_config(pod: &Pod, attempt: u32, logs_root: &Path) -> api::PodSandboxConfig {
    let spec = pod.spec.as_ref();
    let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);

    let mut meta = api::PodSandboxMetadata::new();
    meta.name = pod_name(pod).into();
    meta.namespace = pod_namespace(pod).into();
    meta.uid = pod_uid(pod).into();
    meta.attempt = attempt;

    let mut cfg = api::PodSandboxConfig::new();
    cfg.metadata = MessageField::some(meta);
    // A pod on the host network shares the node's UTS namespace: the
    // runtime refuses to set a hostname there, so it stays empty.
    if !host_network {
        cfg.hostname = spec
            .and_then(|s| s.hostname.clone())
            .unwrap_or_else(|| pod_name(pod).to_string());
        // A hostname is at most 63 characters, as the kubelet truncates it.
        if cfg.hostname.len() > 63 {
            cfg.hostname.truncate(63);
            let trimmed = cfg.hostname.trim_end_matches(['-', '.']).len();
            cfg.hostname.truncate(trimmed);
        }
    }
    cfg.log_directory = pod_log_dir(logs_root, pod).to_string_lossy().into_owned();
    if !host_network {
        cfg.dns_config = MessageField::some(dns_config(
            &std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default(),
        ));
    }
    for c in spec.map(|s| &s.containers[..]).unwrap_or(&[]) {
        for p in c.ports.iter().flatten() {
            let Some(host_port) = p.host_port.filter(|hp| *hp > 0) else {
                continue;
            };
            let mut m = api::PortMapping::new();
            m.container_port = p.container_port;
            m.host_port = host_port;
            m.host_ip = p.host_ip.clone().unwrap_or_default();
            m.protocol = EnumOrUnknown::new(match p.protocol.as_deref() {
                Some("UDP") => api::Protocol::UDP,
                Some("SCTP") => api::Protocol::SCTP,
                _ => api::Protocol::TCP,
            });
            cfg.port_mappings.push(m);
        }
    }
    cfg.labels = labels::sandbox_labels(pod);
    cfg.annotations = labels::sandbox_annotations(pod);

    let mut sc = api::LinuxSandboxSecurityContext::new();
    sc.namespace_options = MessageField::some(namespace_options(pod));
    sc.privileged = spec
        .map(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
                .any(|c| {
                    c.security_context
                        .as_ref()
                        .and_then(|sc| sc.privileged)
                        .unwrap_or(false)
                })
        })
        .unwrap_or(false);
    let mut linux = api::LinuxPodSandboxConfig::new();
    linux.security_context = MessageField::some(sc);
    if let Some(sysctls) = spec
        .and_then(|s| s.security_context.as_ref())
        .and_then(|sc| sc.sysctls.as_ref())
    {
        linux.sysctls = sysctls
            .iter()
            .map(|s| (s.name.clone(), s.value.clone()))
            .collect();
    }
    cfg.linux = MessageField::some(linux);
    cfg
}

/// A container's CRI config. `volumes_dir` holds the pod's emptyDir volumes.
pub fn container_config(
    pod: &Pod,
    container: &Container,
    restart_count: u32,
    image_ref: &str,
    volumes_dir: &Path,
) -> Result<api::ContainerConfig, String> {
    let mut meta = api::ContainerMetadata::new();
    meta.name = container.name.clone();
    meta.attempt = restart_count;

    let mut image = api::ImageSpec::new();
    image.image = image_ref.to_string();

    let mut cfg = api::ContainerConfig::new();
    cfg.metadata = MessageField::some(meta);
    cfg.image = MessageField::some(image);
    cfg.command = container.command.clone().unwrap_or_default();
    cfg.args = container.args.clone().unwrap_or_default();
    cfg.working_dir = container.working_dir.clone().unwrap_or_default();
    for e in container.env.iter().flatten() {
        if e.value_from.is_some() {
            // Downward API and config references need the apiserver.
            log::warn!(
                "pod {}: container {:?}: env {:?}: valueFrom is not supported yet, skipped",
                labels::pod_full_name(pod),
                container.name,
                e.name
            );
            continue;
        }
        let mut kv = api::KeyValue::new();
        kv.key = e.name.clone();
        kv.value = e.value.clone().unwrap_or_default();
        cfg.envs.push(kv);
    }
    cfg.mounts = mounts(pod, container, volumes_dir)?;
    cfg.labels = labels::container_labels(pod, container);
    cfg.annotations = labels::container_annotations(pod, container, restart_count);
    cfg.log_path = format!("{}/{}.log", container.name, restart_count);
    cfg.stdin = container.stdin.unwrap_or(false);
    cfg.stdin_once = container.stdin_once.unwrap_or(false);
    cfg.tty = container.tty.unwrap_or(false);

    let mut linux = api::LinuxContainerConfig::new();
    linux.resources = MessageField::some(resources(container)?);
    let mut sc = api::LinuxContainerSecurityContext::new();
    sc.namespace_options = MessageField::some(namespace_options(pod));
    let pod_sc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    if let Some(csc) = container.security_context.as_ref() {
        sc.privileged = csc.privileged.unwrap_or(false);
        sc.readonly_rootfs = csc.read_only_root_filesystem.unwrap_or(false);
        if let Some(caps) = csc.capabilities.as_ref() {
            let mut c = api::Capability::new();
            c.add_capabilities = caps.add.clone().unwrap_or_default();
            c.drop_capabilities = caps.drop.clone().unwrap_or_default();
            sc.capabilities = MessageField::some(c);
        }
    }
    let run_as_user = container
        .security_context
        .as_ref()
        .and_then(|c| c.run_as_user)
        .or_else(|| pod_sc.and_then(|p| p.run_as_user));
    if let Some(uid) = run_as_user {
        let mut v = api::Int64Value::new();
        v.value = uid;
        sc.run_as_user = MessageField::some(v);
    }
    let run_as_group = container
        .security_context
        .as_ref()
        .and_then(|c| c.run_as_group)
        .or_else(|| pod_sc.and_then(|p| p.run_as_group));
    if let Some(gid) = run_as_group {
        let mut v = api::Int64Value::new();
        v.value = gid;
        sc.run_as_group = MessageField::some(v);
    }
    linux.security_context = MessageField::some(sc);
    cfg.linux = MessageField::some(linux);
    Ok(cfg)
}

fn mounts(pod: &Pod, container: &Container, volumes_dir: &Path) -> Result<Vec<api::Mount>, String> {
    let volumes = pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_deref())
        .unwrap_or(&[]);
    let mut out = Vec::new();
    for vm in container.volume_mounts.iter().flatten() {
        let Some(v) = volumes.iter().find(|v| v.name == vm.name) else {
            return Err(format!(
                "container {:?}: volumeMounts {:?}: no volume of that name in spec.volumes",
                container.name, vm.name
            ));
        };
        let host_path = if let Some(hp) = v.host_path.as_ref() {
            PathBuf::from(&hp.path)
        } else if v.empty_dir.is_some() {
            volumes_dir.join("kubernetes.io~empty-dir").join(&v.name)
        } else {
            return Err(format!(
                "volume {:?}: only hostPath and emptyDir volumes are supported",
                v.name
            ));
        };
        let mut m = api::Mount::new();
        m.container_path = vm.mount_path.clone();
        m.host_path = match vm.sub_path.as_deref() {
            Some(sub) if !sub.is_empty() => {
                if Path::new(sub)
                    .components()
                    .any(|c| !matches!(c, std::path::Component::Normal(_)))
                {
                    return Err(format!(
                        "container {:?}: volumeMounts {:?}: subPath {sub:?} must be a relative path without '..'",
                        container.name, vm.name
                    ));
                }
                host_path.join(sub).to_string_lossy().into_owned()
            }
            _ => host_path.to_string_lossy().into_owned(),
        };
        m.readonly = vm.read_only.unwrap_or(false);
        out.push(m);
    }
    Ok(out)
}

/// CPU and memory limits as cgroup settings (the kubelet's conversion).
fn resources(container: &Container) -> Result<api::LinuxContainerResources, String> {
    let mut r = api::LinuxContainerResources::new();
    let res = container.resources.as_ref();
    let get = |which: &str, key: &str| {
        let m = match which {
            "limits" => res.and_then(|r| r.limits.as_ref()),
            _ => res.and_then(|r| r.requests.as_ref()),
        };
        m.and_then(|m| m.get(key)).map(|q| q.0.clone())
    };
    let field =
        |which: &str, key: &str| format!("container {:?}: resources.{which}.{key}", container.name);

    let cpu_request = get("requests", "cpu")
        .or_else(|| get("limits", "cpu"))
        .map(|q| {
            parse_millis(&q)
                .ok_or_else(|| format!("{}: bad quantity {q:?}", field("requests", "cpu")))
        })
        .transpose()?;
    // Shares: 1024 per core, at least 2 (the kernel's minimum).
    r.cpu_shares = cpu_request.map(|m| (m * 1024 / 1000).max(2)).unwrap_or(2);
    if let Some(q) = get("limits", "cpu") {
        let m = parse_millis(&q)
            .ok_or_else(|| format!("{}: bad quantity {q:?}", field("limits", "cpu")))?;
        r.cpu_period = 100_000;
        r.cpu_quota = (m * 100_000 / 1000).max(1000);
    }
    if let Some(q) = get("limits", "memory") {
        r.memory_limit_in_bytes = parse_bytes(&q)
            .ok_or_else(|| format!("{}: bad quantity {q:?}", field("limits", "memory")))?;
    }
    Ok(r)
}

/// A Kubernetes quantity in thousandths ("500m" → 500, "2" → 2000), rounded
/// up like the API's `MilliValue`.
pub fn parse_millis(q: &str) -> Option<i64> {
    parse_quantity_scaled(q, 3)
}

/// A Kubernetes quantity in whole units, bytes for memory ("128Mi", "1G",
/// "1e6", "1000"), rounded up like the API's `Value`.
pub fn parse_bytes(q: &str) -> Option<i64> {
    parse_quantity_scaled(q, 0)
}

/// Parses a Kubernetes quantity exactly (decimal arithmetic, no floats) and
/// returns `ceil(value * 10^scale)`, saturating at `i64::MAX`.
///
/// The grammar is the API's: an optional `+`, digits with at most one `.`
/// (either side may be empty, not both), then one suffix: a binary one
/// (`Ki` .. `Ei`), a decimal one (`n`, `u`, `m`, none, `k`, `M`, `G`, `T`,
/// `P`, `E`) or a decimal exponent (`e3`, `E-2`). Negative quantities give
/// `None`: nothing here has a use for them.
pub fn parse_quantity_scaled(q: &str, scale: i32) -> Option<i64> {
    parse_quantity_wide(q, scale).map(|v| i64::try_from(v).unwrap_or(i64::MAX))
}

/// Like [`parse_quantity_scaled`], with `u128` room (saturating at
/// `u128::MAX`): for ratios of quantities that `i64` cannot hold at a fine
/// scale, such as gibibytes counted in nanounits.
pub fn parse_quantity_wide(q: &str, scale: i32) -> Option<u128> {
    let q = q.trim();
    let q = q.strip_prefix('+').unwrap_or(q);
    let num_len = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(q.len());
    let (number, suffix) = q.split_at(num_len);
    let (int_part, frac_part) = match number.split_once('.') {
        Some((i, f)) => (i, f),
        None => (number, ""),
    };
    if int_part.is_empty() && frac_part.is_empty() || frac_part.contains('.') {
        return None;
    }
    let (exp10, exp2): (i32, u32) = match suffix {
        "" => (0, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        s => {
            let e = s.strip_prefix(['e', 'E'])?;
            let digits = e.strip_prefix(['+', '-']).unwrap_or(e);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            (e.parse::<i32>().ok().filter(|e| e.abs() <= 1000)?, 0)
        }
    };
    // The digits without the point, and where the point was.
    let digits = format!("{int_part}{frac_part}");
    let digits = digits.trim_start_matches('0');
    if digits.is_empty() {
        return Some(0);
    }
    if digits.len() > 38 {
        // More significant digits than u128 holds: no real request is this big.
        return Some(u128::MAX);
    }
    let mantissa: u128 = digits.parse().ok()?;
    let exp = exp10 + scale - frac_part.len() as i32;
    let scaled = mantissa.checked_mul(1u128 << exp2);
    if exp >= 0 {
        let pow = 10u128.checked_pow(exp as u32);
        return Some(
            scaled
                .zip(pow)
                .and_then(|(m, p)| m.checked_mul(p))
                .unwrap_or(u128::MAX),
        );
    }
    let Some(scaled) = scaled else {
        return Some(u128::MAX);
    };
    match 10u128.checked_pow(exp.unsigned_abs()) {
        Some(den) => Some(scaled.div_ceil(den)),
        // A divisor beyond u128 and a non-zero mantissa: a tiny positive value.
        None => Some(1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        assert_eq!(parse_millis("500m"), Some(500));
        assert_eq!(parse_millis("2"), Some(2000));
        assert_eq!(parse_millis("0.25"), Some(250));
        assert_eq!(parse_millis("x"), None);
        assert_eq!(parse_bytes("128Mi"), Some(128 << 20));
        assert_eq!(parse_bytes("1G"), Some(1_000_000_000));
        assert_eq!(parse_bytes("1e6"), Some(1_000_000));
        assert_eq!(parse_bytes("4096"), Some(4096));
        assert_eq!(parse_bytes("-1"), None);
        assert_eq!(parse_bytes("lots"), None);
    }

    #[test]
    fn quantities_exact() {
        let cases: &[(&str, i32, Option<i64>)] = &[
            // Values a float would round up wrongly.
            ("1.1", 3, Some(1100)),
            ("0.3", 3, Some(300)),
            ("4.35", 3, Some(4350)),
            ("1.1Gi", 0, Some(1181116007)), // 1.1 * 2^30 = 1181116006.4, rounded up
            ("100m", 3, Some(100)),
            ("100m", 0, Some(1)),
            ("1500m", 0, Some(2)),
            ("1n", 3, Some(1)),
            ("0", 3, Some(0)),
            ("0.000", 0, Some(0)),
            ("1k", 3, Some(1_000_000)),
            ("2M", 0, Some(2_000_000)),
            ("1Ki", 0, Some(1024)),
            ("3Ei", 0, Some(3 << 60)),
            ("1E", 0, Some(1_000_000_000_000_000_000)),
            ("1E3", 0, Some(1000)),
            ("5e-1", 3, Some(500)),
            ("12e+2", 0, Some(1200)),
            ("+7", 0, Some(7)),
            (".5", 3, Some(500)),
            ("2.", 3, Some(2000)),
            ("1u", 0, Some(1)),
            // Saturates instead of wrapping.
            ("8Ei", 0, Some(i64::MAX)),
            ("100E", 3, Some(i64::MAX)),
            // Not quantities.
            ("", 0, None),
            (".", 0, None),
            ("1.2.3", 0, None),
            ("-5", 0, None),
            ("1Kb", 0, None),
            ("1e", 0, None),
            ("1e1.5", 0, None),
            ("1 Mi", 0, None),
            ("Mi", 0, None),
        ];
        for &(q, scale, want) in cases {
            assert_eq!(
                parse_quantity_scaled(q, scale),
                want,
                "{q:?} at scale {scale}"
            );
        }
    }

    #[test]
    fn dns_from_resolv_conf() {
        let d = dns_config(
            "# x\nnameserver 1.1.1.1\nnameserver 8.8.8.8\nsearch a.b c\noptions ndots:2\n",
        );
        assert_eq!(d.servers, vec!["1.1.1.1", "8.8.8.8"]);
        assert_eq!(d.searches, vec!["a.b", "c"]);
        assert_eq!(d.options, vec!["ndots:2"]);
    }
}

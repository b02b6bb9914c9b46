//! Validation of pods from local sources (manifest files and URLs): the
//! checks that must hold before a pod is handed to the merge, each failure
//! naming the field (`spec.containers[1].name`) and what is wrong with it.
//!
//! This is the subset of the API server's pod validation that protects the
//! node: identities that end up in CRI labels and on disk, names of the
//! objects a pod refers to (they end up in API requests), and containers
//! that can actually be created.

use std::collections::HashSet;
use std::fmt;

use super::Pod;
use crate::image_reference::parse_reference;
use k8s_openapi::api::core::v1::SeccompProfile;

/// One problem with one field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FieldError {
    /// JSON path of the field, e.g. `spec.containers[0].image`.
    pub(crate) field: String,
    pub(crate) message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// A pod that failed validation, with every problem found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidPod {
    pub(crate) errors: Vec<FieldError>,
}

impl InvalidPod {
    pub(crate) fn single(field: &str, message: impl Into<String>) -> InvalidPod {
        InvalidPod {
            errors: vec![FieldError {
                field: field.to_string(),
                message: message.into(),
            }],
        }
    }

    /// True when some error is about `field`.
    pub fn names_field(&self, field: &str) -> bool {
        self.errors.iter().any(|e| e.field == field)
    }
}

impl fmt::Display for InvalidPod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid pod: ")?;
        for (i, e) in self.errors.iter().enumerate() {
            if i > 0 {
                write!(f, "; ")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for InvalidPod {}

const DNS1123_LABEL_MAX: usize = 63;
const DNS1123_SUBDOMAIN_MAX: usize = 253;

/// Why `s` is not an RFC 1123 label (lower-case alphanumerics and '-',
/// starting and ending alphanumeric, at most 63 characters), if it is not.
pub(crate) fn dns1123_label_error(s: &str) -> Option<String> {
    if s.len() > DNS1123_LABEL_MAX {
        return Some(format!(
            "Invalid value: {s:?}: must be no more than {DNS1123_LABEL_MAX} characters"
        ));
    }
    if !is_label(s) {
        return Some(format!(
            "Invalid value: {s:?}: an RFC 1123 label must consist of lower case alphanumeric \
             characters or '-', and must start and end with an alphanumeric character"
        ));
    }
    None
}

/// Why `s` is not an RFC 1123 subdomain (labels joined by '.', at most 253
/// characters), if it is not.
pub(crate) fn dns1123_subdomain_error(s: &str) -> Option<String> {
    if s.len() > DNS1123_SUBDOMAIN_MAX {
        return Some(format!(
            "Invalid value: {s:?}: must be no more than {DNS1123_SUBDOMAIN_MAX} characters"
        ));
    }
    if !s.split('.').all(is_label) {
        return Some(format!(
            "Invalid value: {s:?}: an RFC 1123 subdomain must consist of lower case \
             alphanumeric characters, '-' or '.', and must start and end with an \
             alphanumeric character"
        ));
    }
    None
}

fn is_label(s: &str) -> bool {
    let b = s.as_bytes();
    let alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    match (b.first(), b.last()) {
        (Some(first), Some(last)) => {
            alnum(first) && alnum(last) && b.iter().all(|c| alnum(c) || *c == b'-')
        }
        _ => false,
    }
}

/// Why `image` is not a valid image reference (`[host[:port]/]path[:tag][@digest]`,
/// the grammar of container registries), if it is not.
pub(crate) fn image_reference_error(image: &str) -> Option<String> {
    let why = image_reference_problem(image)?;
    Some(format!(
        "Invalid value: {image:?}: not a valid image reference: {why}"
    ))
}

fn image_reference_problem(image: &str) -> Option<String> {
    if let Some(c) = image.chars().find(|c| c.is_whitespace() || c.is_control()) {
        return Some(format!("contains {c:?}"));
    }
    parse_reference(image).err().map(|e| e.to_string())
}

/// The most containers (and, apart, init containers) a pod from a local
/// source may have.
pub(crate) const MAX_CONTAINERS: usize = 250;

/// Validates a pod from a local source after the static-pod defaults were
/// applied: everything `validate_api_pod` checks, and containers that can
/// actually be created (images, at most `MAX_CONTAINERS`).
pub(crate) fn validate_pod(pod: &Pod) -> Result<(), InvalidPod> {
    validate(pod, true)
}

/// Validates a pod from the apiserver (or its checkpoint) before it is
/// admitted: the names that become paths on this node and labels in the
/// runtime. Its name and namespace (as `validate_pod`), its UID (required;
/// see `paths::uid_error`), its container names (DNS labels, unique across
/// init, regular and ephemeral containers) and its volume names (DNS
/// labels, unique),
/// as the API server's ValidatePodSpec requires. The API server has checked
/// these already; a node does not take its word for what it joins into
/// paths as root.
pub(crate) fn validate_api_pod(pod: &Pod) -> Result<(), InvalidPod> {
    validate(pod, false)
}

/// Whether the pod's name and namespace may be used to address it in the
/// API (a status patch, an event): both present and valid.
pub(crate) fn addressable(pod: &Pod) -> bool {
    let name = pod.metadata.name.as_deref().unwrap_or("");
    let ns = pod.metadata.namespace.as_deref().unwrap_or("");
    !name.is_empty()
        && !ns.is_empty()
        && dns1123_subdomain_error(name).is_none()
        && dns1123_label_error(ns).is_none()
}

fn validate(pod: &Pod, local: bool) -> Result<(), InvalidPod> {
    let mut errors = Vec::new();
    let mut push = |field: String, message: String| errors.push(FieldError { field, message });

    match pod.metadata.name.as_deref() {
        None | Some("") => push("metadata.name".into(), "Required value".into()),
        Some(name) => {
            if let Some(msg) = dns1123_subdomain_error(name) {
                push("metadata.name".into(), msg);
            }
        }
    }
    match pod.metadata.namespace.as_deref() {
        None | Some("") => push("metadata.namespace".into(), "Required value".into()),
        Some(ns) => {
            if let Some(msg) = dns1123_label_error(ns) {
                push("metadata.namespace".into(), msg);
            }
        }
    }
    // A local pod without a UID gets one made from its content before it
    // is used; an API pod always has one.
    match pod.metadata.uid.as_deref() {
        None | Some("") if local => {}
        None | Some("") => push("metadata.uid".into(), "Required value".into()),
        Some(uid) => {
            if let Some(why) = crate::paths::uid_error(uid) {
                push(
                    "metadata.uid".into(),
                    format!("Invalid value: {uid:?}: {why}"),
                );
            }
        }
    }

    let Some(spec) = pod.spec.as_ref() else {
        push("spec".into(), "Required value".into());
        return Err(InvalidPod { errors });
    };
    if spec.containers.is_empty() {
        push("spec.containers".into(), "Required value".into());
    }
    // A limit the API server does not have: a pod of thousands of
    // containers is a mistake or an attack on the node, and every container
    // costs memory, log lines and CRI calls on each sync.
    let init_count = spec.init_containers.as_ref().map_or(0, Vec::len);
    if local {
        for (field, count) in [
            ("spec.containers", spec.containers.len()),
            ("spec.initContainers", init_count),
        ] {
            if count > MAX_CONTAINERS {
                push(
                    field.into(),
                    format!("Too many: {count}: must have at most {MAX_CONTAINERS} items"),
                );
            }
        }
        if spec.containers.len() > MAX_CONTAINERS || init_count > MAX_CONTAINERS {
            return Err(InvalidPod { errors });
        }
    }

    let mut volumes = HashSet::new();
    for (i, v) in spec.volumes.iter().flatten().enumerate() {
        let field = format!("spec.volumes[{i}].name");
        if v.name.is_empty() {
            push(field, "Required value".into());
        } else if let Some(msg) = dns1123_label_error(&v.name) {
            push(field, msg);
        } else if !volumes.insert(v.name.as_str()) {
            push(field, format!("Duplicate value: {:?}", v.name));
        }
    }

    // A Localhost seccomp profile is a file below the node's seccomp root:
    // only a relative path that stays below it (upstream's
    // validateLocalDescendingPath), so a pod cannot name any host file.
    let mut profile = |field: String, sc: Option<&SeccompProfile>| {
        if let Some(file) = sc.and_then(|p| p.localhost_profile.as_deref()) {
            if let Some(why) = local_descending_path_error(file) {
                push(field, format!("Invalid value: {file:?}: {why}"));
            }
        }
    };
    profile(
        "spec.securityContext.seccompProfile.localhostProfile".into(),
        spec.security_context
            .as_ref()
            .and_then(|sc| sc.seccomp_profile.as_ref()),
    );
    for (list, cs) in [
        (
            "spec.initContainers",
            spec.init_containers.as_deref().unwrap_or(&[]),
        ),
        ("spec.containers", spec.containers.as_slice()),
    ] {
        for (i, c) in cs.iter().enumerate() {
            profile(
                format!("{list}[{i}].securityContext.seccompProfile.localhostProfile"),
                c.security_context
                    .as_ref()
                    .and_then(|sc| sc.seccomp_profile.as_ref()),
            );
        }
    }
    let ephemeral = spec.ephemeral_containers.as_deref().unwrap_or(&[]);
    for (i, c) in ephemeral.iter().enumerate() {
        profile(
            format!(
                "spec.ephemeralContainers[{i}].securityContext.seccompProfile.localhostProfile"
            ),
            c.security_context
                .as_ref()
                .and_then(|sc| sc.seccomp_profile.as_ref()),
        );
    }
    // As the API server on create: ephemeral containers are only ever
    // added to a running pod, which a manifest cannot do.
    if local && !ephemeral.is_empty() {
        push(
            "spec.ephemeralContainers".into(),
            "Forbidden: cannot be set on create".into(),
        );
    }

    let mut names = HashSet::new();
    let init = spec.init_containers.iter().flatten();
    let all = init
        .enumerate()
        .map(|(i, c)| ("spec.initContainers", i, c))
        .chain(
            spec.containers
                .iter()
                .enumerate()
                .map(|(i, c)| ("spec.containers", i, c)),
        );
    for (list, i, c) in all {
        let base = format!("{list}[{i}]");
        if c.name.is_empty() {
            push(format!("{base}.name"), "Required value".into());
        } else if let Some(msg) = dns1123_label_error(&c.name) {
            push(format!("{base}.name"), msg);
        } else if !names.insert(c.name.as_str()) {
            push(
                format!("{base}.name"),
                format!("Duplicate value: {:?}", c.name),
            );
        }
        if !local {
            continue;
        }
        match c.image.as_deref() {
            None | Some("") => push(format!("{base}.image"), "Required value".into()),
            Some(image) if image.trim() != image => push(
                format!("{base}.image"),
                format!("Invalid value: {image:?}: must not have leading or trailing whitespace"),
            ),
            Some(image) => {
                if let Some(msg) = image_reference_error(image) {
                    push(format!("{base}.image"), msg);
                }
            }
        }
    }
    if local {
        referenced_names(spec, &mut push);
    }
    // Ephemeral containers' names become labels and log paths too, and
    // are unique with the others' (upstream validateEphemeralContainers).
    for (i, c) in ephemeral.iter().enumerate() {
        let field = format!("spec.ephemeralContainers[{i}].name");
        if c.name.is_empty() {
            push(field, "Required value".into());
        } else if let Some(msg) = dns1123_label_error(&c.name) {
            push(field, msg);
        } else if !names.insert(c.name.as_str()) {
            push(field, format!("Duplicate value: {:?}", c.name));
        }
    }

    if errors.is_empty() {
        Ok(())
    } else {
        Err(InvalidPod { errors })
    }
}

/// The names of the objects a local pod refers to (Secrets, ConfigMaps,
/// pull secrets, its service account) become API URLs and thread names:
/// each must be a DNS subdomain, as the API server requires of pods it
/// stores, so that `../..` or `a?b` never reaches a request.
fn referenced_names(
    spec: &k8s_openapi::api::core::v1::PodSpec,
    push: &mut impl FnMut(String, String),
) {
    let mut check = |field: String, name: Option<&str>| match name {
        None | Some("") => push(field, "Required value".into()),
        Some(name) => {
            if let Some(msg) = dns1123_subdomain_error(name) {
                push(field, msg);
            }
        }
    };
    for (i, v) in spec.volumes.iter().flatten().enumerate() {
        let base = format!("spec.volumes[{i}]");
        if let Some(s) = &v.secret {
            check(
                format!("{base}.secret.secretName"),
                s.secret_name.as_deref(),
            );
        }
        if let Some(c) = &v.config_map {
            check(format!("{base}.configMap.name"), Some(c.name.as_str()));
        }
        let sources = v.projected.as_ref().and_then(|p| p.sources.as_ref());
        for (j, s) in sources.into_iter().flatten().enumerate() {
            let base = format!("{base}.projected.sources[{j}]");
            if let Some(s) = &s.secret {
                check(format!("{base}.secret.name"), Some(s.name.as_str()));
            }
            if let Some(c) = &s.config_map {
                check(format!("{base}.configMap.name"), Some(c.name.as_str()));
            }
        }
    }
    let containers = spec
        .init_containers
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, c)| (format!("spec.initContainers[{i}]"), c))
        .chain(
            spec.containers
                .iter()
                .enumerate()
                .map(|(i, c)| (format!("spec.containers[{i}]"), c)),
        );
    for (base, c) in containers {
        for (k, e) in c.env.iter().flatten().enumerate() {
            let Some(from) = &e.value_from else { continue };
            let at = format!("{base}.env[{k}].valueFrom");
            if let Some(r) = &from.config_map_key_ref {
                check(format!("{at}.configMapKeyRef.name"), Some(r.name.as_str()));
            }
            if let Some(r) = &from.secret_key_ref {
                check(format!("{at}.secretKeyRef.name"), Some(r.name.as_str()));
            }
        }
        for (k, e) in c.env_from.iter().flatten().enumerate() {
            let at = format!("{base}.envFrom[{k}]");
            if let Some(r) = &e.config_map_ref {
                check(format!("{at}.configMapRef.name"), Some(r.name.as_str()));
            }
            if let Some(r) = &e.secret_ref {
                check(format!("{at}.secretRef.name"), Some(r.name.as_str()));
            }
        }
    }
    for (i, s) in spec.image_pull_secrets.iter().flatten().enumerate() {
        check(
            format!("spec.imagePullSecrets[{i}].name"),
            Some(s.name.as_str()),
        );
    }
    for (field, name) in [
        (
            "spec.serviceAccountName",
            spec.service_account_name.as_deref(),
        ),
        ("spec.serviceAccount", spec.service_account.as_deref()),
    ] {
        if let Some(name) = name.filter(|n| !n.is_empty()) {
            check(field.into(), Some(name));
        }
    }
}

/// Why `path` does not stay below the directory it is joined to: absolute,
/// or with a `..` element.
pub(crate) fn local_descending_path_error(path: &str) -> Option<&'static str> {
    if path.starts_with('/') {
        return Some("must be a relative path");
    }
    if path.split('/').any(|e| e == "..") {
        return Some("must not contain '..'");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::decode_pod;

    #[test]
    fn localhost_seccomp_profiles_must_stay_below_the_seccomp_root() {
        let pod = |pod_level: &str, container_level: &str| {
            let json = format!(
                r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"p","namespace":"default","uid":"u"}},
"spec":{{"securityContext":{{"seccompProfile":{{"type":"Localhost","localhostProfile":"{pod_level}"}}}},
"containers":[{{"name":"c","image":"busybox","securityContext":{{"seccompProfile":{{"type":"Localhost","localhostProfile":"{container_level}"}}}}}}]}}}}"#
            );
            decode_pod(json.as_bytes()).unwrap()
        };
        assert!(validate_api_pod(&pod("profiles/a.json", "b.json")).is_ok());
        let err = validate_api_pod(&pod("/etc/shadow", "x/../../y")).unwrap_err();
        assert!(
            err.names_field("spec.securityContext.seccompProfile.localhostProfile"),
            "{err}"
        );
        assert!(
            err.names_field("spec.containers[0].securityContext.seccompProfile.localhostProfile"),
            "{err}"
        );
        assert!(err.to_string().contains("must be a relative path"), "{err}");
        assert!(err.to_string().contains("must not contain '..'"), "{err}");
        assert!(validate_pod(&pod("..", "ok.json")).is_err());
    }

    #[test]
    fn thousands_of_containers_are_refused_with_one_error_per_list() {
        let containers: Vec<String> = (0..5000)
            .map(|i| format!(r#"{{"name":"c{i}","image":"busybox"}}"#))
            .collect();
        let list = containers.join(",");
        let json = format!(
            r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"many","namespace":"default"}},
"spec":{{"initContainers":[{list}],"containers":[{list}]}}}}"#
        );
        let pod = decode_pod(json.as_bytes()).unwrap();
        let err = validate_pod(&pod).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid pod: spec.containers: Too many: 5000: must have at most 250 items; \
             spec.initContainers: Too many: 5000: must have at most 250 items"
        );
        // At the limit, a pod is fine.
        let list = containers[..MAX_CONTAINERS].join(",");
        let json = format!(
            r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"many","namespace":"default"}},
"spec":{{"containers":[{list}]}}}}"#
        );
        validate_pod(&decode_pod(json.as_bytes()).unwrap()).unwrap();
    }

    #[test]
    fn dns_names() {
        for ok in ["a", "a-b", "0", "web-1", &"a".repeat(63)] {
            assert_eq!(dns1123_label_error(ok), None, "{ok}");
        }
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", &"a".repeat(64)] {
            assert!(dns1123_label_error(bad).is_some(), "{bad}");
        }
        for ok in ["a.b", "web-node1", "a.b-c.d", &"a.".repeat(100)[..199]] {
            assert_eq!(dns1123_subdomain_error(ok), None, "{ok}");
        }
        for bad in ["", "a..b", ".a", "a.", "Web", &"a".repeat(254)] {
            assert!(dns1123_subdomain_error(bad).is_some(), "{bad}");
        }
    }

    #[test]
    fn image_references() {
        let digest = format!("sha256:{}", "a".repeat(64));
        let good = [
            "busybox".to_string(),
            "busybox:1.36".into(),
            "library/busybox:latest".into(),
            "docker.io/tinylet/busybox:1".into(),
            "registry.example.com:5000/team/app_v2:2024-01.3".into(),
            "localhost/app".into(),
            "localhost:5000/a/b/c".into(),
            "Registry.Example.com/app".into(),
            "[fe80::1]:5000/app:tag".into(),
            "my-app--x__y.z:TAG_1".into(),
            format!("nginx@{digest}"),
            format!("docker.io/library/nginx:1.25@{digest}"),
            digest.clone(),
        ];
        for image in &good {
            assert_eq!(image_reference_error(image), None, "{image}");
        }
        let bad = [
            "Nginx",
            "nginx:",
            "nginx:-1",
            "nginx:a b",
            "team/My-App",
            "app/",
            "/app",
            "a//b",
            "a/-b",
            "a.-b/app",
            "registry:port/app",
            "registry.io:/app",
            "[fe80::1/app",
            "nginx@sha256:abc",
            "nginx@:abcdef",
            "ngi\tnx",
        ];
        for image in bad {
            let err = image_reference_error(image);
            assert!(err.is_some(), "{image} accepted");
            assert!(
                err.as_deref()
                    .unwrap_or("")
                    .contains("not a valid image reference"),
                "{err:?}"
            );
        }
        let long = format!("a/{}", "b".repeat(300));
        assert!(image_reference_error(&long).is_some());
    }

    #[test]
    fn validation_errors_name_the_field() {
        let cases: &[(&str, &str, &str)] = &[
            (
                "missing name",
                "metadata: {namespace: default}\nspec: {containers: [{name: c, image: i}]}",
                "metadata.name",
            ),
            (
                "bad name",
                "metadata: {name: Web_1, namespace: default}\nspec: {containers: [{name: c, image: i}]}",
                "metadata.name",
            ),
            (
                "bad namespace",
                "metadata: {name: web, namespace: kube.system}\nspec: {containers: [{name: c, image: i}]}",
                "metadata.namespace",
            ),
            (
                "no spec",
                "metadata: {name: web, namespace: default}",
                "spec",
            ),
            (
                "no containers",
                "metadata: {name: web, namespace: default}\nspec: {containers: []}",
                "spec.containers",
            ),
            (
                "duplicate container names",
                "metadata: {name: web, namespace: default}\nspec: {containers: [{name: c, image: i}, {name: c, image: j}]}",
                "spec.containers[1].name",
            ),
            (
                "duplicate across init and regular containers",
                "metadata: {name: web, namespace: default}\nspec: {initContainers: [{name: c, image: i}], containers: [{name: c, image: j}]}",
                "spec.containers[0].name",
            ),
            (
                "empty image",
                "metadata: {name: web, namespace: default}\nspec: {containers: [{name: c, image: ''}]}",
                "spec.containers[0].image",
            ),
            (
                "missing init image",
                "metadata: {name: web, namespace: default}\nspec: {initContainers: [{name: i}], containers: [{name: c, image: x}]}",
                "spec.initContainers[0].image",
            ),
            (
                "invalid image",
                "metadata: {name: web, namespace: default}\nspec: {containers: [{name: c, image: 'Docker.io/Web:1'}]}",
                "spec.containers[0].image",
            ),
            (
                "invalid init image",
                "metadata: {name: web, namespace: default}\nspec: {initContainers: [{name: i, image: 'busybox:'}], containers: [{name: c, image: x}]}",
                "spec.initContainers[0].image",
            ),
            (
                "uid ..",
                "metadata: {name: web, namespace: default, uid: '..'}\nspec: {containers: [{name: c, image: i}]}",
                "metadata.uid",
            ),
            (
                "uid /",
                "metadata: {name: web, namespace: default, uid: /}\nspec: {containers: [{name: c, image: i}]}",
                "metadata.uid",
            ),
            (
                "uid a/b",
                "metadata: {name: web, namespace: default, uid: a/b}\nspec: {containers: [{name: c, image: i}]}",
                "metadata.uid",
            ),
            (
                "volume /etc",
                "metadata: {name: web, namespace: default}\nspec: {volumes: [{name: /etc, emptyDir: {}}], containers: [{name: c, image: i}]}",
                "spec.volumes[0].name",
            ),
            (
                "volume ../x",
                "metadata: {name: web, namespace: default}\nspec: {volumes: [{name: ok, emptyDir: {}}, {name: ../x, emptyDir: {}}], containers: [{name: c, image: i}]}",
                "spec.volumes[1].name",
            ),
            (
                "volume a/b",
                "metadata: {name: web, namespace: default}\nspec: {volumes: [{name: a/b, emptyDir: {}}], containers: [{name: c, image: i}]}",
                "spec.volumes[0].name",
            ),
            (
                "duplicate volume",
                "metadata: {name: web, namespace: default}\nspec: {volumes: [{name: v, emptyDir: {}}, {name: v, emptyDir: {}}], containers: [{name: c, image: i}]}",
                "spec.volumes[1].name",
            ),
            (
                "container name not a label",
                "metadata: {name: web, namespace: default}\nspec: {containers: [{name: My.App, image: i}]}",
                "spec.containers[0].name",
            ),
        ];
        for (name, yaml, field) in cases {
            let pod = decode_pod(yaml.as_bytes()).unwrap();
            let err = validate_pod(&pod).unwrap_err();
            assert!(err.names_field(field), "{name}: {err}");
            assert!(err.to_string().contains(field), "{name}: {err}");
        }
    }

    #[test]
    fn api_pods_are_checked_for_the_names_that_become_paths() {
        let ok = "metadata: {name: web, namespace: default, uid: 0b4c5e9a-1}\n\
                  spec: {volumes: [{name: data, emptyDir: {}}], containers: [{name: c}]}";
        assert_eq!(
            validate_api_pod(&decode_pod(ok.as_bytes()).unwrap()),
            Ok(())
        );
        let cases: &[(&str, &str)] = &[
            ("metadata: {name: web, namespace: default}", "metadata.uid"),
            (
                "metadata: {name: web, namespace: default, uid: '..'}",
                "metadata.uid",
            ),
            (
                "metadata: {name: web, namespace: default, uid: 'a/b'}",
                "metadata.uid",
            ),
            (
                "metadata: {name: 'a/b', namespace: default, uid: u}",
                "metadata.name",
            ),
            (
                "metadata: {name: web, namespace: '..', uid: u}",
                "metadata.namespace",
            ),
        ];
        let spec = "\nspec: {volumes: [{name: data, emptyDir: {}}], containers: [{name: c}]}";
        for (meta, field) in cases {
            let pod = decode_pod(format!("{meta}{spec}").as_bytes()).unwrap();
            let err = validate_api_pod(&pod).unwrap_err();
            assert!(err.names_field(field), "{meta}: {err}");
        }
        let meta = "metadata: {name: web, namespace: default, uid: u}\n";
        let specs: &[(&str, &str)] = &[
            (
                "spec: {volumes: [{name: /etc, emptyDir: {}}], containers: [{name: c}]}",
                "spec.volumes[0].name",
            ),
            (
                "spec: {volumes: [{name: data}, {name: data}], containers: [{name: c}]}",
                "spec.volumes[1].name",
            ),
            (
                "spec: {containers: [{name: ../c}]}",
                "spec.containers[0].name",
            ),
            (
                "spec: {initContainers: [{name: c}], containers: [{name: c}]}",
                "spec.containers[0].name",
            ),
            (
                "spec: {containers: [{name: c}], ephemeralContainers: [{name: ../d}]}",
                "spec.ephemeralContainers[0].name",
            ),
            (
                "spec: {containers: [{name: c}], ephemeralContainers: [{name: c}]}",
                "spec.ephemeralContainers[0].name",
            ),
            (
                "spec: {containers: [{name: c}], ephemeralContainers: [{name: d, \
                 securityContext: {seccompProfile: {type: Localhost, localhostProfile: /etc/shadow}}}]}",
                "spec.ephemeralContainers[0].securityContext.seccompProfile.localhostProfile",
            ),
        ];
        for (spec, field) in specs {
            let pod = decode_pod(format!("{meta}{spec}").as_bytes()).unwrap();
            let err = validate_api_pod(&pod).unwrap_err();
            assert!(err.names_field(field), "{spec}: {err}");
        }
        assert!(addressable(&decode_pod(ok.as_bytes()).unwrap()));
        let bad = decode_pod(b"metadata: {name: 'a/b', namespace: default}").unwrap();
        assert!(!addressable(&bad));
    }

    #[test]
    fn a_manifest_names_only_objects_the_api_can_address() {
        let meta = "metadata: {name: web, namespace: default}\n";
        let ok = "spec: {serviceAccountName: build-bot, imagePullSecrets: [{name: reg.cred}],\
                  volumes: [{name: a, secret: {secretName: s1}}, {name: b, configMap: {name: c1}},\
                  {name: p, projected: {sources: [{secret: {name: s2}}, {configMap: {name: c2}}]}}],\
                  containers: [{name: c, image: i, env: [{name: X, valueFrom: {secretKeyRef: {name: s3, key: k}}}],\
                  envFrom: [{configMapRef: {name: c3}}]}]}";
        let pod = decode_pod(format!("{meta}{ok}").as_bytes()).unwrap();
        assert_eq!(validate_pod(&pod), Ok(()));
        let specs: &[(&str, &str)] = &[
            (
                "spec: {volumes: [{name: a, secret: {secretName: ../../nodes}}], containers: [{name: c, image: i}]}",
                "spec.volumes[0].secret.secretName",
            ),
            (
                "spec: {volumes: [{name: a, secret: {}}], containers: [{name: c, image: i}]}",
                "spec.volumes[0].secret.secretName",
            ),
            (
                "spec: {volumes: [{name: a, configMap: {name: 'x?watch=1'}}], containers: [{name: c, image: i}]}",
                "spec.volumes[0].configMap.name",
            ),
            (
                "spec: {volumes: [{name: p, projected: {sources: [{configMap: {name: ok}}, {secret: {name: 'A B'}}]}}],\
                 containers: [{name: c, image: i}]}",
                "spec.volumes[0].projected.sources[1].secret.name",
            ),
            (
                "spec: {initContainers: [{name: i, image: i, env: [{name: X, valueFrom: {configMapKeyRef: {name: '', key: k}}}]}],\
                 containers: [{name: c, image: i}]}",
                "spec.initContainers[0].env[0].valueFrom.configMapKeyRef.name",
            ),
            (
                "spec: {containers: [{name: c, image: i, envFrom: [{secretRef: {name: a/b}}]}]}",
                "spec.containers[0].envFrom[0].secretRef.name",
            ),
            (
                "spec: {imagePullSecrets: [{name: '%2e%2e'}], containers: [{name: c, image: i}]}",
                "spec.imagePullSecrets[0].name",
            ),
            (
                "spec: {serviceAccountName: ../default, containers: [{name: c, image: i}]}",
                "spec.serviceAccountName",
            ),
        ];
        for (spec, field) in specs {
            let pod = decode_pod(format!("{meta}{spec}").as_bytes()).unwrap();
            let err = validate_pod(&pod).unwrap_err();
            assert!(err.names_field(field), "{spec}: {err}");
        }
    }

    #[test]
    fn a_manifest_cannot_bring_ephemeral_containers() {
        let pod = decode_pod(
            b"metadata: {name: web-node1, namespace: default}\nspec: {containers: [{name: c, image: i}], ephemeralContainers: [{name: d, image: i}]}",
        )
        .unwrap();
        let err = validate_pod(&pod).unwrap_err();
        assert!(err.names_field("spec.ephemeralContainers"), "{err}");
        let ok = "metadata: {name: web, namespace: default, uid: u}\n\
                  spec: {containers: [{name: c}], ephemeralContainers: [{name: d}]}";
        assert_eq!(
            validate_api_pod(&decode_pod(ok.as_bytes()).unwrap()),
            Ok(())
        );
    }

    #[test]
    fn valid_pod_passes() {
        let pod = decode_pod(
            b"metadata: {name: web-node1, namespace: default}\nspec: {initContainers: [{name: init, image: busybox}], containers: [{name: c, image: i}]}",
        )
        .unwrap();
        assert_eq!(validate_pod(&pod), Ok(()));
    }
}

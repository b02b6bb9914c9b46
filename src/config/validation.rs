//! Validation of pods from local sources (manifest files and URLs): the
//! checks that must hold before a pod is handed to the merge, each failure
//! naming the field (`spec.containers[1].name`) and what is wrong with it.
//!
//! This is the subset of the API server's pod validation that protects the
//! node: identities that end up in CRI labels and on disk, and containers
//! that can actually be created.

use std::collections::HashSet;
use std::fmt;

use super::Pod;

/// One problem with one field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// JSON path of the field, e.g. `spec.containers[0].image`.
    pub field: String,
    pub message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// A pod that failed validation, with every problem found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidPod {
    pub errors: Vec<FieldError>,
}

impl InvalidPod {
    pub fn single(field: &str, message: impl Into<String>) -> InvalidPod {
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
pub fn dns1123_label_error(s: &str) -> Option<String> {
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
pub fn dns1123_subdomain_error(s: &str) -> Option<String> {
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

/// Validates a pod after the static-pod defaults were applied.
pub fn validate_pod(pod: &Pod) -> Result<(), InvalidPod> {
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

    let Some(spec) = pod.spec.as_ref() else {
        push("spec".into(), "Required value".into());
        return Err(InvalidPod { errors });
    };
    if spec.containers.is_empty() {
        push("spec.containers".into(), "Required value".into());
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
        match c.image.as_deref() {
            None | Some("") => push(format!("{base}.image"), "Required value".into()),
            Some(image) if image.trim() != image => push(
                format!("{base}.image"),
                format!("Invalid value: {image:?}: must not have leading or trailing whitespace"),
            ),
            Some(_) => {}
        }
    }

    if errors.is_empty() {
        Ok(())
    } else {
        Err(InvalidPod { errors })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::decode_pod;

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
    fn valid_pod_passes() {
        let pod = decode_pod(
            b"metadata: {name: web-node1, namespace: default}\nspec: {initContainers: [{name: init, image: busybox}], containers: [{name: c, image: i}]}",
        )
        .unwrap();
        assert_eq!(validate_pod(&pod), Ok(()));
    }
}

//! Manifest decoding: YAML or JSON bytes into `Pod` (or a `PodList`).
//!
//! Both formats are first read into a `serde_json::Value` and only then
//! turned into a `Pod` with `serde_json::from_value`, so the large `Pod`
//! deserializer exists once in the binary. This also gives the kubelet's own
//! strictness (it converts YAML to JSON before decoding): a YAML number where
//! the API wants a string (`command: [sleep, 3600]`) is refused.

use std::fmt;

use serde::Deserialize;
use serde_json::Value;

use super::Pod;
use crate::document::{kind_of, DocumentError};

/// Why a manifest could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// The manifest holds nothing but whitespace or comments.
    Empty,
    /// The bytes are not valid JSON (when they look like JSON) nor YAML.
    Syntax {
        format: &'static str,
        message: String,
    },
    /// The document is valid but its top level is not a mapping.
    NotAnObject { found: &'static str },
    /// `kind` or `apiVersion` names something other than what was expected.
    WrongType {
        field: &'static str,
        expected: &'static str,
        found: String,
    },
    /// The object does not match the Pod schema. `path` names the offending
    /// field when it can be found (`spec.containers[0].command[1]`).
    Schema {
        path: Option<String>,
        message: String,
    },
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Empty => write!(f, "manifest is empty"),
            DecodeError::Syntax { format, message } => write!(f, "invalid {format}: {message}"),
            DecodeError::NotAnObject { found } => {
                write!(f, "manifest must be an object, found {found}")
            }
            DecodeError::WrongType {
                field,
                expected,
                found,
            } => write!(f, "{field}: expected {expected:?}, found {found:?}"),
            DecodeError::Schema {
                path: Some(path),
                message,
            } => write!(f, "{path}: {message}"),
            DecodeError::Schema {
                path: None,
                message,
            } => write!(f, "{message}"),
        }
    }
}

impl std::error::Error for DecodeError {}

impl From<DocumentError> for DecodeError {
    fn from(e: DocumentError) -> DecodeError {
        match e {
            DocumentError::Empty => DecodeError::Empty,
            DocumentError::Syntax { format, message } => DecodeError::Syntax { format, message },
            DocumentError::NotAnObject { found } => DecodeError::NotAnObject { found },
        }
    }
}

/// Decodes one pod from YAML or JSON.
pub fn decode_pod(bytes: &[u8]) -> Result<Pod, DecodeError> {
    let value = parse_document(bytes)?;
    pod_from_value(value, "", true)
}

/// Decodes a pod from an already parsed JSON value (checking `kind` and
/// `apiVersion` when present), through the same single `Pod` deserializer.
pub(crate) fn pod_from_json(value: Value) -> Result<Pod, DecodeError> {
    pod_from_value(value, "", true)
}

/// Reads YAML or JSON bytes into a JSON value whose top level is an object
/// (for configuration files that are not pods).
pub(crate) fn parse_object(bytes: &[u8]) -> Result<Value, DecodeError> {
    parse_document(bytes)
}

/// Decodes a single pod or a `PodList` (the shapes a manifest URL may serve).
pub fn decode_pod_or_list(bytes: &[u8]) -> Result<Vec<Pod>, DecodeError> {
    let value = parse_document(bytes)?;
    if value.get("kind").and_then(Value::as_str) != Some("PodList") {
        return pod_from_value(value, "", true).map(|pod| vec![pod]);
    }
    check_api_version(&value)?;
    let items = match value {
        Value::Object(mut map) => map.remove("items").unwrap_or(Value::Null),
        _ => Value::Null,
    };
    let items = match items {
        Value::Array(items) => items,
        Value::Null => Vec::new(),
        other => {
            return Err(DecodeError::Schema {
                path: Some("items".to_string()),
                message: format!("expected a list of pods, found {}", kind_of(&other)),
            })
        }
    };
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| pod_from_value(item, &format!("items[{i}]"), false))
        .collect()
}

/// Reads the bytes into a JSON object (see [`crate::document`]).
fn parse_document(bytes: &[u8]) -> Result<Value, DecodeError> {
    crate::document::parse_object(bytes).map_err(DecodeError::from)
}

fn check_api_version(value: &Value) -> Result<(), DecodeError> {
    match value.get("apiVersion") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(v)) if v == "v1" => Ok(()),
        Some(other) => Err(DecodeError::WrongType {
            field: "apiVersion",
            expected: "v1",
            found: display_scalar(other),
        }),
    }
}

/// Checks `kind`/`apiVersion` when present and deserializes the pod. `prefix`
/// is the path of `value` inside a larger document, for error messages.
fn pod_from_value(value: Value, prefix: &str, top_level: bool) -> Result<Pod, DecodeError> {
    if !value.is_object() {
        if top_level {
            return Err(DecodeError::NotAnObject {
                found: kind_of(&value),
            });
        }
        return Err(DecodeError::Schema {
            path: Some(prefix.to_string()),
            message: format!("expected a pod object, found {}", kind_of(&value)),
        });
    }
    match value.get("kind") {
        None | Some(Value::Null) => {}
        Some(Value::String(k)) if k == "Pod" => {}
        Some(other) => {
            return Err(DecodeError::WrongType {
                field: "kind",
                expected: "Pod",
                found: display_scalar(other),
            })
        }
    }
    check_api_version(&value)?;
    // Deserializing from `&Value` (and only ever from it) keeps one copy of
    // Pod's deserializer and leaves `value` for locating an error.
    match Pod::deserialize(&value) {
        Ok(pod) => Ok(pod),
        Err(e) => {
            let message = e.to_string();
            let path =
                crate::document::locate_error(&value, &message).map(|p| join_path(prefix, &p));
            Err(DecodeError::Schema {
                path: path.or_else(|| (!prefix.is_empty()).then(|| prefix.to_string())),
                message,
            })
        }
    }
}

fn join_path(prefix: &str, path: &str) -> String {
    match (prefix.is_empty(), path.starts_with('[')) {
        (true, _) => path.to_string(),
        (false, true) => format!("{prefix}{path}"),
        (false, false) => format!("{prefix}.{path}"),
    }
}

fn display_scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const YAML_POD: &str = "apiVersion: v1
kind: Pod
metadata:
  name: web
  namespace: edge
  labels: {app: web}
spec:
  containers:
  - name: nginx
    image: nginx:1.25
    command: [sleep, \"3600\"]
    ports:
    - containerPort: 80
";

    const JSON_POD: &str = r#"{"apiVersion":"v1","kind":"Pod",
        "metadata":{"name":"web","namespace":"edge","labels":{"app":"web"}},
        "spec":{"containers":[{"name":"nginx","image":"nginx:1.25",
        "command":["sleep","3600"],"ports":[{"containerPort":80}]}]}}"#;

    #[test]
    fn decodes_yaml_and_json_alike() {
        let from_yaml = decode_pod(YAML_POD.as_bytes()).unwrap();
        let from_json = decode_pod(JSON_POD.as_bytes()).unwrap();
        assert_eq!(from_yaml, from_json);
        assert_eq!(from_yaml.metadata.name.as_deref(), Some("web"));
        let spec = from_yaml.spec.as_ref().unwrap();
        assert_eq!(spec.containers[0].image.as_deref(), Some("nginx:1.25"));
        assert_eq!(
            spec.containers[0].command,
            Some(vec!["sleep".to_string(), "3600".to_string()])
        );
        let ports = spec.containers[0].ports.as_ref().unwrap();
        assert_eq!(ports[0].container_port, 80);
    }

    #[test]
    fn decode_cases() {
        struct Case {
            name: &'static str,
            input: &'static str,
            check: fn(&Result<Pod, DecodeError>) -> bool,
        }
        let cases = [
            Case {
                name: "no kind or apiVersion is accepted",
                input: "metadata: {name: a}\nspec: {containers: [{name: c, image: i}]}\n",
                check: |r| r.is_ok(),
            },
            Case {
                name: "leading document marker and comments",
                input: "# static pod\n---\nkind: Pod\nmetadata:\n  name: a\n",
                check: |r| r.is_ok(),
            },
            Case {
                name: "utf-8 byte order mark",
                input: "\u{feff}{\"kind\":\"Pod\",\"metadata\":{\"name\":\"a\"}}",
                check: |r| r.is_ok(),
            },
            Case {
                name: "yaml flow mapping that is not json",
                input: "{kind: Pod, metadata: {name: a}}",
                check: |r| r.is_ok(),
            },
            Case {
                name: "empty",
                input: "  \n\t\n",
                check: |r| matches!(r, Err(DecodeError::Empty)),
            },
            Case {
                name: "only comments",
                input: "# nothing here\n",
                check: |r| matches!(r, Err(DecodeError::Empty)),
            },
            Case {
                name: "bad yaml",
                input: "metadata:\n  name: [a\nspec: }\n",
                check: |r| matches!(r, Err(DecodeError::Syntax { format: "YAML", .. })),
            },
            Case {
                name: "bad json",
                input: "{\"kind\": \"Pod\", \"metadata\": {",
                check: |r| matches!(r, Err(DecodeError::Syntax { format: "JSON", .. })),
            },
            Case {
                name: "top level list",
                input: "- a\n- b\n",
                check: |r| matches!(r, Err(DecodeError::NotAnObject { found: "a list" })),
            },
            Case {
                name: "kind mismatch",
                input: "kind: Deployment\nmetadata: {name: a}\n",
                check: |r| {
                    matches!(r, Err(DecodeError::WrongType { field: "kind", found, .. }) if found == "Deployment")
                },
            },
            Case {
                name: "apiVersion mismatch",
                input: "apiVersion: apps/v1\nkind: Pod\n",
                check: |r| matches!(r, Err(DecodeError::WrongType { field: "apiVersion", .. })),
            },
            Case {
                name: "number where a string is wanted names the field",
                input: "kind: Pod\nmetadata: {name: a}\nspec:\n  containers:\n  - name: c\n    image: i\n    command: [sleep, 3600]\n",
                check: |r| {
                    matches!(r, Err(DecodeError::Schema { path: Some(p), message })
                        if p == "spec.containers[0].command[1]" && message.contains("expected a string"))
                },
            },
            Case {
                name: "string where an integer is wanted names the field",
                input: r#"{"spec":{"containers":[{"name":"c","ports":[{"containerPort":"80"}]}]}}"#,
                check: |r| {
                    matches!(r, Err(DecodeError::Schema { path: Some(p), .. })
                        if p == "spec.containers[0].ports[0].containerPort")
                },
            },
            Case {
                name: "map where a list is wanted",
                input: "spec:\n  containers: {name: c}\n",
                check: |r| matches!(r, Err(DecodeError::Schema { .. })),
            },
        ];
        for case in cases {
            let result = decode_pod(case.input.as_bytes());
            assert!((case.check)(&result), "{}: got {:?}", case.name, result);
        }
    }

    #[test]
    fn error_messages_name_the_field() {
        let err = decode_pod(b"spec:\n  containers:\n  - name: c\n    command: [sleep, 3600]\n")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("spec.containers[0].command[1]: "), "{err}");
        let err = decode_pod(b"kind: Service\n").unwrap_err().to_string();
        assert_eq!(err, "kind: expected \"Pod\", found \"Service\"");
    }

    #[test]
    fn decodes_pod_lists() {
        let list = r#"{"apiVersion":"v1","kind":"PodList","items":[
            {"metadata":{"name":"a"}},{"kind":"Pod","metadata":{"name":"b"}}]}"#;
        let pods = decode_pod_or_list(list.as_bytes()).unwrap();
        let names: Vec<_> = pods
            .iter()
            .map(|p| p.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, ["a", "b"]);

        let single = decode_pod_or_list(YAML_POD.as_bytes()).unwrap();
        assert_eq!(single.len(), 1);

        let empty = decode_pod_or_list(b"kind: PodList\nitems: []\n").unwrap();
        assert!(empty.is_empty());

        let bad = decode_pod_or_list(
            b"kind: PodList\nitems:\n- metadata: {name: a}\n- spec: {containers: [{name: 1}]}\n",
        )
        .unwrap_err();
        assert!(
            matches!(&bad, DecodeError::Schema { path: Some(p), .. } if p == "items[1].spec.containers[0].name"),
            "{bad:?}"
        );

        let wrong = decode_pod_or_list(b"kind: PodList\nitems:\n- kind: Node\n").unwrap_err();
        assert!(matches!(
            wrong,
            DecodeError::WrongType { field: "kind", .. }
        ));
    }
}

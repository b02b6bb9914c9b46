//! YAML or JSON documents (manifests, configuration files, kubeconfigs)
//! read into a `serde_json::Value` whose top level is an object. Decoding
//! every format into `Value` first keeps one copy of each typed
//! deserializer in the binary; the callers turn the value into what they
//! need.

use std::fmt;

use serde_json::Value;

/// Why bytes are not an object document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DocumentError {
    /// Nothing but whitespace or comments.
    Empty,
    /// The bytes are not valid JSON (when they look like JSON) nor YAML.
    Syntax {
        format: &'static str,
        message: String,
    },
    /// A valid document whose top level is not a mapping.
    NotAnObject { found: &'static str },
}

impl fmt::Display for DocumentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DocumentError::Empty => write!(f, "manifest is empty"),
            DocumentError::Syntax { format, message } => write!(f, "invalid {format}: {message}"),
            DocumentError::NotAnObject { found } => {
                write!(f, "manifest must be an object, found {found}")
            }
        }
    }
}

impl std::error::Error for DocumentError {}

/// Reads the bytes into a JSON object: JSON when they start with `{`, YAML
/// otherwise (and as a fallback, since a YAML flow mapping starts with `{` too).
pub fn parse_object(bytes: &[u8]) -> Result<Value, DocumentError> {
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    let value = match first {
        None => return Err(DocumentError::Empty),
        Some(b'{') => match serde_json::from_slice::<Value>(bytes) {
            Ok(v) => v,
            Err(json_err) => match parse_yaml(bytes) {
                Ok(v) => v,
                Err(_) => {
                    return Err(DocumentError::Syntax {
                        format: "JSON",
                        message: json_err.to_string(),
                    })
                }
            },
        },
        Some(_) => parse_yaml(bytes)?,
    };
    match value {
        Value::Object(_) => Ok(value),
        // A file of comments only is an empty YAML document.
        Value::Null => Err(DocumentError::Empty),
        other => Err(DocumentError::NotAnObject {
            found: kind_of(&other),
        }),
    }
}

fn parse_yaml(bytes: &[u8]) -> Result<Value, DocumentError> {
    let text = std::str::from_utf8(bytes).map_err(|e| DocumentError::Syntax {
        format: "YAML",
        message: format!("not UTF-8: {e}"),
    })?;
    // Kubernetes reads YAML as 1.1 (sigs.k8s.io/yaml): `defaultMode: 0644`
    // is octal 420, as the API documentation's examples mean it.
    let mut options = serde_saphyr::Options::default();
    options.legacy_octal_numbers = true;
    serde_saphyr::from_str_with_options::<Value>(text, options).map_err(|e| DocumentError::Syntax {
        format: "YAML",
        message: e.to_string(),
    })
}

/// What kind of JSON value `v` is, for error messages ("a list").
pub fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn yaml_numbers_with_a_leading_zero_are_octal_as_in_kubernetes() {
        let v = parse_object(b"mode: 0600\ndefaultMode: 0644\nport: 8080\nzero: 0\nhex: 0x1F\n")
            .unwrap();
        assert_eq!(
            v,
            json!({"mode": 384, "defaultMode": 420, "port": 8080, "zero": 0, "hex": 31})
        );
        // Quoted, it stays a string.
        let v = parse_object(b"tag: '0600'\n").unwrap();
        assert_eq!(v, json!({"tag": "0600"}));
    }
}

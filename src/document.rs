//! YAML or JSON documents (manifests, configuration files, kubeconfigs)
//! read into a `serde_json::Value` whose top level is an object. Decoding
//! every format into `Value` first keeps one copy of each typed
//! deserializer in the binary; the callers turn the value into what they
//! need.

use std::fmt;

use serde_json::Value;

/// Why bytes are not an object document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DocumentError {
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
pub(crate) fn parse_object(bytes: &[u8]) -> Result<Value, DocumentError> {
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
    // A syntax error is one line with its position, as upstream's
    // ("yaml: line 3: ..."), not serde-saphyr's default multi-line excerpt
    // of the source: the message goes into log lines and events, where a
    // manifest's text (its env values, say) has no place.
    options.with_snippet = false;
    serde_saphyr::from_str_with_options::<Value>(text, options).map_err(|e| DocumentError::Syntax {
        format: "YAML",
        message: e.render_with_options(serde_saphyr::render_options! {
            snippets: serde_saphyr::SnippetMode::Off,
        }),
    })
}

/// What kind of JSON value `v` is, for error messages ("a list").
pub(crate) fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// serde's type errors from a `Value` carry no position, only what was found
/// ("invalid type: integer `3600`, expected a string"). Finds the leaves of
/// the document that render the same way and names them when there are few.
pub(crate) fn locate_error(value: &Value, message: &str) -> Option<String> {
    let rest = message
        .strip_prefix("invalid type: ")
        .or_else(|| message.strip_prefix("invalid value: "))?;
    let unexpected = rest.split(", expected").next()?;
    let mut hits = Vec::new();
    collect_matches(value, unexpected, &mut String::new(), &mut hits);
    match hits.len() {
        0 => None,
        1 => hits.pop(),
        2..=3 => Some(format!("one of {}", hits.join(", "))),
        _ => None,
    }
}

fn collect_matches(value: &Value, unexpected: &str, path: &mut String, hits: &mut Vec<String>) {
    if describe(value) == unexpected && !path.is_empty() {
        hits.push(path.clone());
    }
    let len = path.len();
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(k);
                collect_matches(v, unexpected, path, hits);
                path.truncate(len);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                path.push_str(&format!("[{i}]"));
                collect_matches(v, unexpected, path, hits);
                path.truncate(len);
            }
        }
        _ => {}
    }
}

/// Renders a value the way serde's `Unexpected` does in error messages.
fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".to_string(),
        Value::Bool(b) => format!("boolean `{b}`"),
        Value::Number(n) if n.is_f64() => match n.as_f64() {
            Some(f) => format!("floating point `{}`", FloatRepr(f)),
            None => format!("floating point `{n}`"),
        },
        Value::Number(n) => format!("integer `{n}`"),
        Value::String(s) => format!("string {s:?}"),
        Value::Array(_) => "sequence".to_string(),
        Value::Object(_) => "map".to_string(),
    }
}

/// serde prints whole floats with a trailing `.0`.
struct FloatRepr(f64);

impl fmt::Display for FloatRepr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_finite() && self.0.fract() == 0.0 {
            write!(f, "{:.1}", self.0)
        } else {
            write!(f, "{}", self.0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_yaml_syntax_error_is_one_line_with_its_position() {
        let e = parse_object(b"kind: Pod\nmetadata: {name: x\nspec: {}\n")
            .expect_err("an unclosed flow mapping");
        let text = e.to_string();
        assert!(text.starts_with("invalid YAML: "), "{text}");
        assert!(!text.contains('\n'), "one line: {text:?}");
        assert!(text.contains("line "), "the position: {text}");
    }

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

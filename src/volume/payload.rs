//! What goes into a secret, configMap, downwardAPI or projected volume: a
//! pure function of the volume's spec, the pod and the API objects it names.
//! The files are written by `writer`; the objects are fetched by the caller.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{DownwardAPIVolumeFile, KeyToPath, Pod};

/// The mode of a volume's files when the spec gives none (API default 0644).
pub(crate) const DEFAULT_MODE: u32 = 0o644;

/// One file of a volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct File {
    pub(crate) data: Vec<u8>,
    pub(crate) mode: u32,
}

/// A volume's files by relative path.
pub(crate) type Payload = BTreeMap<String, File>;

/// The keys of a Secret (`data`, decoded) or ConfigMap (`data` and
/// `binaryData`) as bytes.
pub type Keys = BTreeMap<String, Vec<u8>>;

/// What a fetch found: the object's keys, or nothing (404).
pub type Fetched = Option<Keys>;

/// A service account token as the TokenRequest API returned it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    pub(crate) token: String,
    /// When the apiserver says the token expires.
    pub(crate) expires: std::time::SystemTime,
}

fn mode_of(mode: Option<i32>, default: u32) -> u32 {
    mode.map(|m| (m as u32) & 0o777).unwrap_or(default)
}

/// The files of a Secret or ConfigMap source. `kind` is "secret" or
/// "configmap" (for messages); `keys` is `None` when the object does not
/// exist, which only an optional source tolerates.
pub(crate) fn key_files(
    kind: &str,
    name: &str,
    keys: Option<&Keys>,
    items: Option<&[KeyToPath]>,
    optional: bool,
    default_mode: u32,
    out: &mut Payload,
) -> Result<(), String> {
    let Some(keys) = keys else {
        if optional {
            return Ok(());
        }
        return Err(format!("{kind} {name:?} not found"));
    };
    let put = |out: &mut Payload, path: &str, data: &[u8], mode: u32| {
        if out.contains_key(path) {
            return Err(format!("{kind} {name:?}: two files at path {path:?}"));
        }
        out.insert(
            path.to_string(),
            File {
                data: data.to_vec(),
                mode,
            },
        );
        Ok(())
    };
    match items {
        Some(items) if !items.is_empty() => {
            for item in items {
                match keys.get(&item.key) {
                    Some(data) => put(out, &item.path, data, mode_of(item.mode, default_mode))?,
                    None if optional => {}
                    None => {
                        return Err(format!(
                            "{kind} {name:?}: items: key {:?} does not exist",
                            item.key
                        ))
                    }
                }
            }
        }
        _ => {
            for (key, data) in keys {
                put(out, key, data, default_mode)?;
            }
        }
    }
    Ok(())
}

/// The downward API field paths a volume may use (the API's list for
/// volumes: metadata only).
fn volume_field_allowed(path: &str) -> bool {
    matches!(
        path,
        "metadata.name"
            | "metadata.namespace"
            | "metadata.uid"
            | "metadata.labels"
            | "metadata.annotations"
    ) || path.starts_with("metadata.labels[")
        || path.starts_with("metadata.annotations[")
}

/// The files of downwardAPI items.
pub(crate) fn downward_files(
    pod: &Pod,
    items: &[DownwardAPIVolumeFile],
    default_mode: u32,
    allocatable: &crate::fieldpath::NodeAllocatable,
    out: &mut Payload,
) -> Result<(), String> {
    for item in items {
        let value = match (&item.field_ref, &item.resource_field_ref) {
            (Some(f), None) => {
                if !volume_field_allowed(&f.field_path) {
                    return Err(format!(
                        "items[{:?}].fieldRef.fieldPath: {:?} is not supported in volumes",
                        item.path, f.field_path
                    ));
                }
                crate::fieldpath::field_value(pod, &f.field_path)
                    .map_err(|e| format!("items[{:?}].fieldRef: {e}", item.path))?
            }
            (None, Some(r)) => {
                let container_name = r.container_name.as_deref().unwrap_or("");
                let container = pod
                    .spec
                    .as_ref()
                    .into_iter()
                    .flat_map(|s| s.containers.iter().chain(s.init_containers.iter().flatten()))
                    .find(|c| c.name == container_name)
                    .ok_or_else(|| {
                        format!(
                            "items[{:?}].resourceFieldRef.containerName: no container {container_name:?}",
                            item.path
                        )
                    })?;
                crate::fieldpath::resource_value(
                    container,
                    &r.resource,
                    r.divisor.as_ref().map(|q| q.0.as_str()),
                    allocatable,
                )
                .map_err(|e| format!("items[{:?}].resourceFieldRef: {e}", item.path))?
            }
            _ => {
                return Err(format!(
                    "items[{:?}]: exactly one of fieldRef and resourceFieldRef must be set",
                    item.path
                ))
            }
        };
        if out.contains_key(&item.path) {
            return Err(format!("items: two files at path {:?}", item.path));
        }
        out.insert(
            item.path.clone(),
            File {
                data: value.into_bytes(),
                mode: mode_of(item.mode, default_mode),
            },
        );
    }
    Ok(())
}

/// Checks a payload's paths as the API does for volume items (relative,
/// no `..` element, not starting with `..`: the writer's own names do).
pub(crate) fn check_paths(payload: &Payload) -> Result<(), String> {
    for path in payload.keys() {
        if path.is_empty() {
            return Err("a file path is empty".into());
        }
        if path.starts_with('/') {
            return Err(format!("file path {path:?} must be relative"));
        }
        if path.starts_with("..") {
            return Err(format!("file path {path:?} must not start with '..'"));
        }
        if path
            .split('/')
            .any(|e| e == ".." || e.is_empty() || e == ".")
        {
            return Err(format!(
                "file path {path:?} must not contain '..', '.' or empty elements"
            ));
        }
        if path.len() > 4096 {
            return Err(format!("file path {:.40}...: longer than 4096 bytes", path));
        }
    }
    // A path may not be both a file and a directory ("a" and "a/b").
    for path in payload.keys() {
        for (i, _) in path.match_indices('/') {
            if payload.contains_key(&path[..i]) {
                return Err(format!(
                    "file path {:?} is also a directory of {path:?}",
                    &path[..i]
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(pairs: &[(&str, &str)]) -> Keys {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
            .collect()
    }

    fn item(key: &str, path: &str, mode: Option<i32>) -> KeyToPath {
        KeyToPath {
            key: key.into(),
            path: path.into(),
            mode,
        }
    }

    #[test]
    fn all_keys_without_items_and_selected_keys_with_them() {
        let k = keys(&[("a", "1"), ("b", "2")]);
        let mut out = Payload::new();
        key_files("secret", "s", Some(&k), None, false, 0o600, &mut out).unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!(out["a"].data, b"1");
        assert_eq!(out["b"].mode, 0o600);

        let mut out = Payload::new();
        let items = [item("b", "dir/bee", Some(0o400))];
        key_files(
            "secret",
            "s",
            Some(&k),
            Some(&items),
            false,
            0o644,
            &mut out,
        )
        .unwrap();
        assert_eq!(out.keys().collect::<Vec<_>>(), ["dir/bee"]);
        assert_eq!(out["dir/bee"].mode, 0o400);
    }

    #[test]
    fn a_missing_object_or_key_fails_unless_optional() {
        let mut out = Payload::new();
        let e = key_files("secret", "s", None, None, false, 0o644, &mut out).unwrap_err();
        assert_eq!(e, "secret \"s\" not found");
        key_files("secret", "s", None, None, true, 0o644, &mut out).unwrap();
        assert!(out.is_empty());

        let k = keys(&[("a", "1")]);
        let items = [item("nope", "x", None)];
        let e = key_files(
            "configmap",
            "c",
            Some(&k),
            Some(&items),
            false,
            0o644,
            &mut out,
        )
        .unwrap_err();
        assert!(e.contains("key \"nope\" does not exist"), "{e}");
        key_files(
            "configmap",
            "c",
            Some(&k),
            Some(&items),
            true,
            0o644,
            &mut out,
        )
        .unwrap();
        assert!(out.is_empty());
    }

    #[test]
    fn two_sources_writing_one_path_are_refused() {
        let k = keys(&[("ca.crt", "x")]);
        let mut out = Payload::new();
        key_files("configmap", "a", Some(&k), None, false, 0o644, &mut out).unwrap();
        let e = key_files("configmap", "b", Some(&k), None, false, 0o644, &mut out).unwrap_err();
        assert!(e.contains("two files at path \"ca.crt\""), "{e}");
    }

    #[test]
    fn paths_must_stay_inside_the_volume() {
        let file = File {
            data: vec![],
            mode: 0o644,
        };
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../../x",
            "..data",
            "a//b",
            "./a",
        ] {
            let p: Payload = [(bad.to_string(), file.clone())].into();
            assert!(check_paths(&p).is_err(), "{bad:?} accepted");
        }
        let p: Payload = [
            ("a".to_string(), file.clone()),
            ("a-x".to_string(), file.clone()),
            ("a/b".to_string(), file.clone()),
        ]
        .into();
        assert!(check_paths(&p).is_err());
        let p: Payload = [("a".to_string(), file.clone()), ("ab/c".to_string(), file)].into();
        check_paths(&p).unwrap();
    }
}

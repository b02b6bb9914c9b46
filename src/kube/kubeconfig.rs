//! Kubeconfig loading: reads a kubeconfig file (YAML or JSON), picks its
//! current context and resolves that context's cluster and user into a
//! [`KubeConfig`], with every referenced file read and every base64 field
//! decoded up front, so that a bad file is reported once, at start-up, with
//! the file and the field it concerns.

use std::io::Read;
use std::path::{Path, PathBuf};

use base64::Engine;
use serde_json::{Map, Value};

use super::KubeConfig;
use crate::document::kind_of;

/// The largest kubeconfig (and file it references) we read.
const MAX_FILE: u64 = 1024 * 1024;

/// Reads `path` and resolves its current context. Errors name the file and
/// the field (`users[0].user.client-certificate: ...`).
pub fn load_kubeconfig(path: &Path) -> Result<KubeConfig, String> {
    let file = path.display().to_string();
    let bytes = read_capped(path).map_err(|e| format!("{file}: {e}"))?;
    let doc = crate::document::parse_object(&bytes).map_err(|e| format!("{file}: {e}"))?;
    let base = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    resolve(&doc, path, &base).map_err(|e| format!("{file}: {e}"))
}

/// Reads a whole file of at most [`MAX_FILE`] bytes; the error has no path
/// (the caller puts it in context).
fn read_capped(path: &Path) -> Result<Vec<u8>, String> {
    let f = std::fs::File::open(path).map_err(|e| io_message(&e))?;
    let mut bytes = Vec::new();
    f.take(MAX_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| io_message(&e))?;
    if bytes.len() as u64 > MAX_FILE {
        return Err(format!("larger than {MAX_FILE} bytes"));
    }
    Ok(bytes)
}

/// An I/O error without the `(os error N)` suffix.
fn io_message(e: &std::io::Error) -> String {
    let s = e.to_string();
    match s.find(" (os error ") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

/// Resolves the current context of a parsed kubeconfig. Errors name the
/// field, not the file.
fn resolve(doc: &Value, path: &Path, base: &Path) -> Result<KubeConfig, String> {
    let current = match doc.get("current-context") {
        None | Some(Value::Null) => return Err("current-context: not set".into()),
        Some(Value::String(s)) if s.is_empty() => return Err("current-context: not set".into()),
        Some(Value::String(s)) => s.as_str(),
        Some(other) => return Err(format!("current-context: expected a string, found {other}")),
    };
    let (ci, context) = find_named(doc, "contexts", current)?
        .ok_or_else(|| format!("current-context {current:?} not found in contexts"))?;
    let context_field = format!("contexts[{ci}].context");
    let context = section(context, &context_field)?;

    let cluster_name = opt_str(&context, &context_field, "cluster")?.unwrap_or_default();
    if cluster_name.is_empty() {
        return Err(format!("{context_field}.cluster: not set"));
    }
    let (cli, cluster) = find_named(doc, "clusters", &cluster_name)?
        .ok_or_else(|| format!("{context_field}.cluster {cluster_name:?} not found in clusters"))?;
    let cf = format!("clusters[{cli}].cluster");
    let cluster = section(cluster, &cf)?;

    let server =
        opt_str(&cluster, &cf, "server")?.ok_or_else(|| format!("{cf}.server: not set"))?;
    let server = server.trim_end_matches('/').to_string();
    if !(server.starts_with("https://") || server.starts_with("http://")) {
        return Err(format!(
            "{cf}.server: {server:?} must start with https:// or http://"
        ));
    }
    let mut config = KubeConfig {
        file: path.to_path_buf(),
        server,
        ..KubeConfig::default()
    };
    config.ca_pem = data_or_file(
        &cluster,
        &cf,
        "certificate-authority-data",
        "certificate-authority",
        base,
    )?;
    config.insecure_skip_tls_verify = match cluster.get("insecure-skip-tls-verify") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => {
            return Err(format!(
                "{cf}.insecure-skip-tls-verify: expected true or false, found {other}"
            ))
        }
    };

    if config.insecure_skip_tls_verify && config.ca_pem.is_some() {
        return Err(format!(
            "{cf}: insecure-skip-tls-verify is set together with a certificate authority"
        ));
    }

    let user_name = opt_str(&context, &context_field, "user")?.unwrap_or_default();
    if user_name.is_empty() {
        return Ok(config);
    }
    let (ui, user) = find_named(doc, "users", &user_name)?
        .ok_or_else(|| format!("{context_field}.user {user_name:?} not found in users"))?;
    let uf = format!("users[{ui}].user");
    let user = section(user, &uf)?;
    for unsupported in ["exec", "auth-provider"] {
        if user.get(unsupported).is_some_and(|v| !v.is_null()) {
            return Err(format!("{uf}.{unsupported}: not supported"));
        }
    }
    config.client_cert_pem = data_or_file(
        &user,
        &uf,
        "client-certificate-data",
        "client-certificate",
        base,
    )?;
    config.client_key_pem = data_or_file(&user, &uf, "client-key-data", "client-key", base)?;
    match (&config.client_cert_pem, &config.client_key_pem) {
        (Some(_), None) => return Err(format!("{uf}: a client certificate without client-key")),
        (None, Some(_)) => return Err(format!("{uf}: a client-key without client-certificate")),
        _ => {}
    }
    config.token = opt_str(&user, &uf, "token")?.filter(|t| !t.is_empty());
    if let Some(token_file) = opt_str(&user, &uf, "tokenFile")?.filter(|t| !t.is_empty()) {
        let token_path = base.join(&token_file);
        // The file wins over an inline token, as it is the one that is kept
        // fresh by whoever rotates it.
        config.token =
            Some(read_token_file(&token_path).map_err(|e| format!("{uf}.tokenFile: {e}"))?);
        config.token_file = Some(token_path);
    }
    Ok(config)
}

/// Reads a bearer token file: its content without surrounding whitespace.
pub(super) fn read_token_file(path: &Path) -> Result<String, String> {
    let bytes = read_capped(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let text = String::from_utf8(bytes)
        .map_err(|_| format!("{}: the token is not UTF-8", path.display()))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(format!("{}: the token is empty", path.display()));
    }
    Ok(token.to_string())
}

/// Finds the entry `name` in the list `list` (`[{name, <kind>: {...}}]`):
/// its index and the whole entry.
fn find_named<'a>(
    doc: &'a Value,
    list: &str,
    name: &str,
) -> Result<Option<(usize, &'a Value)>, String> {
    let items = match doc.get(list) {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(items)) => items,
        Some(other) => return Err(format!("{list}: expected a list, found {}", kind_of(other))),
    };
    for (i, item) in items.iter().enumerate() {
        if item.get("name").and_then(Value::as_str) == Some(name) {
            return Ok(Some((i, item)));
        }
    }
    Ok(None)
}

/// The inner mapping of a named entry (`context`, `cluster` or `user`,
/// the last part of `field`); absent means empty.
fn section(entry: &Value, field: &str) -> Result<Map<String, Value>, String> {
    let key = field.rsplit('.').next().unwrap_or(field);
    match entry.get(key) {
        None | Some(Value::Null) => Ok(Map::new()),
        Some(Value::Object(m)) => Ok(m.clone()),
        Some(other) => Err(format!(
            "{field}: expected a mapping, found {}",
            kind_of(other)
        )),
    }
}

fn opt_str(map: &Map<String, Value>, field: &str, key: &str) -> Result<Option<String>, String> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(format!(
            "{field}.{key}: expected a string, found {}",
            kind_of(other)
        )),
    }
}

/// Reads a `<x>-data` (base64) field or a `<x>` file field; both set is an
/// error, as it is for kubectl.
fn data_or_file(
    map: &Map<String, Value>,
    field: &str,
    data_key: &str,
    file_key: &str,
    base: &Path,
) -> Result<Option<Vec<u8>>, String> {
    let data = opt_str(map, field, data_key)?.filter(|s| !s.is_empty());
    let file = opt_str(map, field, file_key)?.filter(|s| !s.is_empty());
    match (data, file) {
        (Some(_), Some(_)) => Err(format!("{field}: both {data_key} and {file_key} are set")),
        (Some(data), None) => {
            let compact: String = data.chars().filter(|c| !c.is_ascii_whitespace()).collect();
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(compact.as_bytes())
                .map_err(|_| format!("{field}.{data_key}: invalid base64"))?;
            Ok(Some(bytes))
        }
        (None, Some(file)) => {
            let path = base.join(&file);
            let bytes = read_capped(&path)
                .map_err(|e| format!("{field}.{file_key}: cannot read {}: {e}", path.display()))?;
            Ok(Some(bytes))
        }
        (None, None) => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    /// Writes `text` as `config` in a new temp dir and loads it.
    fn load(text: &str) -> (tempfile::TempDir, Result<KubeConfig, String>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config");
        fs::write(&path, text).unwrap();
        let r = load_kubeconfig(&path);
        (dir, r)
    }

    fn yaml(cluster: &str, user: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: main\ncontexts:\n- name: other\n  context: {{cluster: x, user: x}}\n- name: main\n  context:\n    cluster: c1\n    user: u1\nclusters:\n- name: c0\n  cluster: {{server: 'https://wrong:1'}}\n- name: c1\n  cluster:\n{cluster}\nusers:\n- name: u1\n  user:\n{user}\n"
        )
    }

    #[test]
    fn client_certificate_data_and_ca_data() {
        let cluster = format!(
            "    server: https://10.0.0.1:6443/\n    certificate-authority-data: {}",
            b64("CA PEM")
        );
        let user = format!(
            "    client-certificate-data: {}\n    client-key-data: {}",
            b64("CERT PEM"),
            b64("KEY PEM")
        );
        let (dir, r) = load(&yaml(&cluster, &user));
        let c = r.unwrap();
        assert_eq!(c.server, "https://10.0.0.1:6443");
        assert_eq!(c.file, dir.path().join("config"));
        assert_eq!(c.ca_pem.as_deref(), Some(&b"CA PEM"[..]));
        assert_eq!(c.client_cert_pem.as_deref(), Some(&b"CERT PEM"[..]));
        assert_eq!(c.client_key_pem.as_deref(), Some(&b"KEY PEM"[..]));
        assert!(!c.insecure_skip_tls_verify);
        assert_eq!(c.token, None);
    }

    #[test]
    fn relative_files_resolve_against_the_kubeconfig_directory() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("pki")).unwrap();
        fs::write(dir.path().join("pki/ca.crt"), "CA FILE").unwrap();
        fs::write(dir.path().join("pki/c.crt"), "CERT FILE").unwrap();
        fs::write(dir.path().join("pki/c.key"), "KEY FILE").unwrap();
        let text = yaml(
            "    server: https://h:6443\n    certificate-authority: pki/ca.crt",
            "    client-certificate: pki/c.crt\n    client-key: pki/c.key",
        );
        fs::write(dir.path().join("kubelet.conf"), text).unwrap();
        let c = load_kubeconfig(&dir.path().join("kubelet.conf")).unwrap();
        assert_eq!(c.ca_pem.as_deref(), Some(&b"CA FILE"[..]));
        assert_eq!(c.client_cert_pem.as_deref(), Some(&b"CERT FILE"[..]));
        assert_eq!(c.client_key_pem.as_deref(), Some(&b"KEY FILE"[..]));
    }

    #[test]
    fn inline_token_and_insecure() {
        let (_d, r) = load(&yaml(
            "    server: https://h:6443\n    insecure-skip-tls-verify: true",
            "    token: abc.def",
        ));
        let c = r.unwrap();
        assert!(c.insecure_skip_tls_verify);
        assert_eq!(c.ca_pem, None);
        assert_eq!(c.token.as_deref(), Some("abc.def"));
        assert_eq!(c.token_file, None);
    }

    #[test]
    fn token_file_is_read_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("token"), "  file-token\n").unwrap();
        let text = yaml("    server: http://127.0.0.1:8080", "    tokenFile: token");
        fs::write(dir.path().join("config"), text).unwrap();
        let c = load_kubeconfig(&dir.path().join("config")).unwrap();
        assert_eq!(c.token.as_deref(), Some("file-token"));
        assert_eq!(c.token_file, Some(dir.path().join("token")));
        assert_eq!(c.server, "http://127.0.0.1:8080");
    }

    #[test]
    fn json_kubeconfig_without_user() {
        let text = r#"{"apiVersion":"v1","kind":"Config","current-context":"a",
            "contexts":[{"name":"a","context":{"cluster":"k"}}],
            "clusters":[{"name":"k","cluster":{"server":"https://j:1"}}]}"#;
        let (_d, r) = load(text);
        let c = r.unwrap();
        assert_eq!(c.server, "https://j:1");
        assert_eq!(c.client_cert_pem, None);
        assert_eq!(c.token, None);
    }

    fn err_of(text: &str) -> (String, String) {
        let (dir, r) = load(text);
        let file = dir.path().join("config").display().to_string();
        (file, r.unwrap_err())
    }

    #[test]
    fn missing_key_file_names_file_field_and_path() {
        let (file, e) = err_of(&yaml(
            "    server: https://h:6443",
            "    client-certificate-data: Q0VSVA==\n    client-key: /nonexistent/key.pem",
        ));
        assert_eq!(
            e,
            format!(
                "{file}: users[0].user.client-key: cannot read /nonexistent/key.pem: No such file or directory"
            )
        );
    }

    #[test]
    fn unknown_current_context() {
        let text = yaml("    server: https://h:6443", "    token: t")
            .replace("current-context: main", "current-context: foo");
        let (file, e) = err_of(&text);
        assert_eq!(
            e,
            format!("{file}: current-context \"foo\" not found in contexts")
        );
    }

    #[test]
    fn missing_current_context() {
        let text = yaml("    server: https://h:6443", "    token: t")
            .replace("current-context: main\n", "");
        let (file, e) = err_of(&text);
        assert_eq!(e, format!("{file}: current-context: not set"));
    }

    #[test]
    fn invalid_base64_names_the_field() {
        let (file, e) = err_of(&yaml(
            "    server: https://h:6443\n    certificate-authority-data: '!!notbase64'",
            "    token: t",
        ));
        assert_eq!(
            e,
            format!("{file}: clusters[1].cluster.certificate-authority-data: invalid base64")
        );
    }

    #[test]
    fn unknown_cluster_and_user() {
        let text = yaml("    server: https://h:6443", "    token: t");
        let (file, e) = err_of(&text.replace("cluster: c1", "cluster: nope"));
        assert_eq!(
            e,
            format!("{file}: contexts[1].context.cluster \"nope\" not found in clusters")
        );
        let (file, e) = err_of(&text.replace("user: u1", "user: ghost"));
        assert_eq!(
            e,
            format!("{file}: contexts[1].context.user \"ghost\" not found in users")
        );
    }

    #[test]
    fn server_missing_or_wrong_scheme() {
        let (file, e) = err_of(&yaml("    insecure-skip-tls-verify: true", "    token: t"));
        assert_eq!(e, format!("{file}: clusters[1].cluster.server: not set"));
        let (file, e) = err_of(&yaml("    server: ftp://h", "    token: t"));
        assert_eq!(
            e,
            format!("{file}: clusters[1].cluster.server: \"ftp://h\" must start with https:// or http://")
        );
    }

    #[test]
    fn cert_without_key_and_both_data_and_file() {
        let (file, e) = err_of(&yaml(
            "    server: https://h:6443",
            "    client-certificate-data: Q0VSVA==",
        ));
        assert_eq!(
            e,
            format!("{file}: users[0].user: a client certificate without client-key")
        );
        let (file, e) = err_of(&yaml(
            "    server: https://h:6443\n    certificate-authority-data: Q0E=\n    certificate-authority: ca.crt",
            "    token: t",
        ));
        assert_eq!(
            e,
            format!("{file}: clusters[1].cluster: both certificate-authority-data and certificate-authority are set")
        );
    }

    #[test]
    fn insecure_with_a_ca_is_refused() {
        let (file, e) = err_of(&yaml(
            "    server: https://h:6443\n    insecure-skip-tls-verify: true\n    certificate-authority-data: Q0E=",
            "    token: t",
        ));
        assert_eq!(
            e,
            format!("{file}: clusters[1].cluster: insecure-skip-tls-verify is set together with a certificate authority")
        );
    }

    #[test]
    fn bad_types_and_exec_plugins() {
        let (file, e) = err_of(&yaml(
            "    server: https://h:6443\n    insecure-skip-tls-verify: 'yes'",
            "    token: t",
        ));
        assert_eq!(
            e,
            format!("{file}: clusters[1].cluster.insecure-skip-tls-verify: expected true or false, found \"yes\"")
        );
        let (file, e) = err_of(&yaml(
            "    server: https://h:6443",
            "    exec: {command: get-token}",
        ));
        assert_eq!(e, format!("{file}: users[0].user.exec: not supported"));
        let (file, e) = err_of(&yaml("    server: https://h:6443", "    token: [a]"));
        assert_eq!(
            e,
            format!("{file}: users[0].user.token: expected a string, found a list")
        );
    }

    #[test]
    fn empty_or_missing_token_file() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("token"), "\n").unwrap();
        let path = dir.path().join("config");
        fs::write(
            &path,
            yaml("    server: https://h:6443", "    tokenFile: token"),
        )
        .unwrap();
        let e = load_kubeconfig(&path).unwrap_err();
        let tp = dir.path().join("token").display().to_string();
        assert_eq!(
            e,
            format!(
                "{}: users[0].user.tokenFile: {tp}: the token is empty",
                path.display()
            )
        );
        fs::remove_file(dir.path().join("token")).unwrap();
        let e = load_kubeconfig(&path).unwrap_err();
        assert_eq!(
            e,
            format!(
                "{}: users[0].user.tokenFile: cannot read {tp}: No such file or directory",
                path.display()
            )
        );
    }

    #[test]
    fn missing_oversized_and_malformed_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("absent");
        assert_eq!(
            load_kubeconfig(&path).unwrap_err(),
            format!("{}: No such file or directory", path.display())
        );
        let big = dir.path().join("big");
        fs::write(&big, vec![b' '; MAX_FILE as usize + 1]).unwrap();
        assert_eq!(
            load_kubeconfig(&big).unwrap_err(),
            format!("{}: larger than 1048576 bytes", big.display())
        );
        let bad = dir.path().join("bad");
        fs::write(&bad, "clusters: [").unwrap();
        let e = load_kubeconfig(&bad).unwrap_err();
        assert!(
            e.starts_with(&format!("{}: invalid YAML", bad.display())),
            "{e}"
        );
    }
}

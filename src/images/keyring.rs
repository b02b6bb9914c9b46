//! The keyring (upstream `credentialprovider`'s `BasicDockerKeyring`): a
//! pod's imagePullSecrets, in either docker config format, turned into
//! registry logins matched against an image's repository by registry host
//! (wildcards, ports and paths as upstream), most specific first.

use std::collections::HashMap;

use base64::Engine;
use log::warn;
use serde_json::Value;

#[cfg(feature = "cri")]
use crate::cri::api;
use crate::image_reference::DEFAULT_REGISTRY_HOST;
use crate::volume::Keys;

/// The secret keys upstream reads pull credentials from.
pub const DOCKER_CONFIG_JSON_KEY: &str = ".dockerconfigjson";
pub const DOCKER_CFG_KEY: &str = ".dockercfg";

/// One registry login from a docker config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    pub(crate) username: String,
    pub(crate) password: String,
}

impl Credential {
    /// The CRI form. The server address stays empty, as upstream sends it:
    /// the runtime then uses the login for the host the image is on.
    #[cfg(feature = "cri")]
    pub(crate) fn auth_config(&self) -> api::AuthConfig {
        let mut a = api::AuthConfig::new();
        a.username = self.username.clone();
        a.password = self.password.clone();
        a
    }
}

/// Registry logins by registry key (a host, or a host and path), matched
/// against an image's repository most specific first (upstream
/// `BasicDockerKeyring`).
#[derive(Debug, Default)]
pub struct Keyring {
    /// Keys, deduplicated, in reverse lexical order: `quay.io/coreos`
    /// before `quay.io`.
    index: Vec<String>,
    creds: HashMap<String, Vec<Credential>>,
}

/// The registry key of a docker config location: any scheme dropped, a
/// `/v1/` or `/v2/` path prefix dropped, the host alone when no path is left.
pub(crate) fn registry_key(location: &str) -> Option<String> {
    let rest = location
        .strip_prefix("https://")
        .or_else(|| location.strip_prefix("http://"))
        .unwrap_or(location);
    let rest = rest.split(['?', '#']).next().unwrap_or(rest);
    let (host, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    if host.bytes().any(|c| c.is_ascii_control() || c == b' ') || split_host_port(host).is_none() {
        return None;
    }
    let path = if path.starts_with("/v1/") || path.starts_with("/v2/") {
        &path[3..]
    } else {
        path
    };
    if path.is_empty() || path == "/" {
        Some(host.to_string())
    } else {
        Some(format!("{host}{path}"))
    }
}

/// `host[:port]` into host and port ("" without one); None for a port that
/// is not a number.
fn split_host_port(hostport: &str) -> Option<(&str, &str)> {
    if let Some(rest) = hostport.strip_prefix('[') {
        let (h, after) = rest.split_once(']')?;
        return match after.strip_prefix(':') {
            Some(p) if p.bytes().all(|c| c.is_ascii_digit()) => Some((h, p)),
            None if after.is_empty() => Some((h, "")),
            _ => None,
        };
    }
    match hostport.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => p.bytes().all(|c| c.is_ascii_digit()).then_some((h, p)),
        Some(_) => Some((hostport, "")),
        None => Some((hostport, "")),
    }
}

/// One element of a parsed host-label pattern.
#[derive(Debug, PartialEq)]
enum GlobToken {
    /// `*`: any run of characters other than `/`.
    Star,
    /// `?`: any one character other than `/`.
    Any,
    /// A character, given as is or escaped with `\`.
    Char(char),
    /// `[...]` or `[^...]`: inclusive ranges (a lone character is lo == hi).
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
}

/// Parses a pattern with Go's `filepath.Match` syntax; None when it is
/// malformed (an unclosed or empty class, a `-` or `]` where a class
/// character belongs, a trailing `\`), which Go reports as ErrBadPattern.
fn parse_glob(pattern: &str) -> Option<Vec<GlobToken>> {
    /// A class character, `\` escapes included: Go's `getEsc`, which also
    /// wants something after it (the class's `]` at least).
    fn class_char(chars: &[char], i: &mut usize) -> Option<char> {
        let mut c = *chars.get(*i)?;
        if c == '-' || c == ']' {
            return None;
        }
        if c == '\\' {
            *i += 1;
            c = *chars.get(*i)?;
        }
        *i += 1;
        (*i < chars.len()).then_some(c)
    }
    let chars: Vec<char> = pattern.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while let Some(&c) = chars.get(i) {
        i += 1;
        let token = match c {
            '*' => GlobToken::Star,
            '?' => GlobToken::Any,
            '\\' => {
                let escaped = *chars.get(i)?;
                i += 1;
                GlobToken::Char(escaped)
            }
            '[' => {
                let negated = chars.get(i) == Some(&'^');
                if negated {
                    i += 1;
                }
                let mut ranges = Vec::new();
                loop {
                    if chars.get(i) == Some(&']') && !ranges.is_empty() {
                        i += 1;
                        break;
                    }
                    let lo = class_char(&chars, &mut i)?;
                    let hi = if chars.get(i) == Some(&'-') {
                        i += 1;
                        class_char(&chars, &mut i)?
                    } else {
                        lo
                    };
                    ranges.push((lo, hi));
                }
                GlobToken::Class { negated, ranges }
            }
            c => GlobToken::Char(c),
        };
        tokens.push(token);
    }
    Some(tokens)
}

/// Whether one (non-star) token takes the character `c`.
fn glob_token_matches(token: &GlobToken, c: char) -> bool {
    match token {
        GlobToken::Star => false,
        GlobToken::Any => c != '/',
        GlobToken::Char(p) => *p == c,
        GlobToken::Class { negated, ranges } => {
            ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi) != *negated
        }
    }
}

/// Matches one host label against a pattern with Go's `filepath.Match`
/// semantics (upstream's `URLsMatch` uses it): `*`, `?`, `[a-z]`, `[^a]`,
/// `\x`; a malformed pattern matches nothing. Iterative, with only the
/// last `*` ever re-tried, so the time is at most pattern length times
/// text length: a key of many `*`s cannot hold a pod's worker.
fn glob_match(pattern: &str, text: &str) -> bool {
    let Some(tokens) = parse_glob(pattern) else {
        return false;
    };
    let text: Vec<char> = text.chars().collect();
    let (mut p, mut t) = (0, 0);
    // The last `*` seen and the text position it currently stops at.
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match tokens.get(p) {
            Some(GlobToken::Star) => {
                star = Some((p, t));
                p += 1;
            }
            Some(token) if glob_token_matches(token, text[t]) => {
                p += 1;
                t += 1;
            }
            _ => {
                // Let the last `*` take one more character, if it may.
                let Some((star_p, star_t)) = star else {
                    return false;
                };
                if text[star_t] == '/' {
                    return false;
                }
                star = Some((star_p, star_t + 1));
                p = star_p + 1;
                t = star_t + 1;
            }
        }
    }
    tokens[p..].iter().all(|token| *token == GlobToken::Star)
}

/// Whether the registry key `glob` (host labels may hold wildcards) covers
/// the repository `target`: same port, same number of host labels, each
/// label matching, and the key's path a prefix of the target's.
pub fn urls_match(glob: &str, target: &str) -> bool {
    fn split(s: &str) -> Option<(Vec<&str>, &str, &str)> {
        let (hostport, path) = match s.find('/') {
            Some(i) => (&s[..i], &s[i..]),
            None => (s, ""),
        };
        let (host, port) = split_host_port(hostport)?;
        Some((host.split('.').collect(), port, path))
    }
    let (Some((g_parts, g_port, g_path)), Some((t_parts, t_port, t_path))) =
        (split(glob), split(target))
    else {
        return false;
    };
    g_port == t_port
        && g_parts.len() == t_parts.len()
        && t_path.starts_with(g_path)
        && g_parts.iter().zip(&t_parts).all(|(g, t)| glob_match(g, t))
}

/// Whether `repo` is on Docker Hub (whose logins may be stored under
/// `index.docker.io`).
fn is_default_registry_match(repo: &str) -> bool {
    match repo.split_once('/') {
        None => !repo.is_empty(),
        Some(("", _)) => false,
        Some((first, _)) => {
            first == "docker.io" || first == DEFAULT_REGISTRY_HOST || !first.contains(['.', ':'])
        }
    }
}

/// One docker config entry: `username`/`password`, or `auth`, which is
/// base64 of `username:password` and wins when present.
fn credential_of(entry: &Value, what: &str) -> Result<Credential, String> {
    let field = |k: &str| -> Result<String, String> {
        match entry.get(k) {
            None | Some(Value::Null) => Ok(String::new()),
            Some(Value::String(s)) => Ok(s.clone()),
            Some(other) => Err(format!("{what}: {k} is not a string: {other}")),
        }
    };
    let mut cred = Credential {
        username: field("username")?,
        password: field("password")?,
    };
    let auth = field("auth")?;
    if !auth.is_empty() {
        let trimmed = auth.trim();
        let decoded = if trimmed.ends_with('=') {
            base64::engine::general_purpose::STANDARD.decode(trimmed)
        } else {
            base64::engine::general_purpose::STANDARD_NO_PAD.decode(trimmed)
        }
        .map_err(|e| format!("{what}: auth is not base64: {e}"))?;
        let text = String::from_utf8_lossy(&decoded);
        let Some((u, p)) = text.split_once(':') else {
            return Err(format!(
                "{what}: auth must be formatted as base64(username:password)"
            ));
        };
        cred = Credential {
            username: u.to_string(),
            password: p.to_string(),
        };
    }
    Ok(cred)
}

impl Keyring {
    /// Adds the login for a docker config location; a location that is not
    /// a registry address is skipped with a warning, as upstream does.
    pub(crate) fn add(&mut self, location: &str, cred: Credential) {
        let Some(key) = registry_key(location) else {
            warn!("image pull secret entry {location:?} is not a registry address; ignoring it");
            return;
        };
        if !self.index.contains(&key) {
            self.index.push(key.clone());
            self.index.sort_by(|a, b| b.cmp(a));
        }
        self.creds.entry(key).or_default().push(cred);
    }

    /// Adds every entry of a docker config object (`{location: entry}`).
    pub(crate) fn add_config(&mut self, config: &Value, what: &str) -> Result<(), String> {
        let Some(map) = config.as_object() else {
            return Err(format!("{what}: not a JSON object"));
        };
        for (location, entry) in map {
            let cred = credential_of(entry, &format!("{what}: {location:?}"))?;
            self.add(location, cred);
        }
        Ok(())
    }

    /// The keyring of a pod's pull secrets, in the pod's order: each
    /// secret's `.dockerconfigjson` (`{"auths": {...}}`) or, lacking that,
    /// its `.dockercfg` (the bare map). Other secrets add nothing.
    pub fn from_secrets(secrets: &[(String, Keys)]) -> Result<Keyring, String> {
        let mut k = Keyring::default();
        for (name, data) in secrets {
            if let Some(bytes) = data.get(DOCKER_CONFIG_JSON_KEY).filter(|b| !b.is_empty()) {
                let what = format!("secret {name}: {DOCKER_CONFIG_JSON_KEY}");
                let v: Value = serde_json::from_slice(bytes).map_err(|e| format!("{what}: {e}"))?;
                match v.get("auths") {
                    None | Some(Value::Null) => {}
                    Some(auths) => k.add_config(auths, &format!("{what}: auths"))?,
                }
            } else if let Some(bytes) = data.get(DOCKER_CFG_KEY).filter(|b| !b.is_empty()) {
                let what = format!("secret {name}: {DOCKER_CFG_KEY}");
                let v: Value = serde_json::from_slice(bytes).map_err(|e| format!("{what}: {e}"))?;
                k.add_config(&v, &what)?;
            }
        }
        Ok(k)
    }

    /// Every login whose key covers `repo` (a normalized repository, e.g.
    /// `registry.example.com:5000/team/app`), most specific key first; when
    /// none does and the repository is on Docker Hub, the logins stored
    /// under `index.docker.io`.
    pub fn lookup(&self, repo: &str) -> Vec<Credential> {
        let mut out: Vec<Credential> = Vec::new();
        for key in &self.index {
            if urls_match(key, repo) {
                out.extend(self.creds[key].iter().cloned());
            }
        }
        if out.is_empty() && is_default_registry_match(repo) {
            if let Some(c) = self.creds.get(DEFAULT_REGISTRY_HOST) {
                out.extend(c.iter().cloned());
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cred(u: &str) -> Credential {
        Credential {
            username: u.into(),
            password: format!("{u}-pw"),
        }
    }

    fn users(v: Vec<Credential>) -> Vec<String> {
        v.into_iter().map(|c| c.username).collect()
    }

    #[test]
    fn registry_keys_drop_scheme_and_api_version() {
        let k = |s: &str| registry_key(s).unwrap();
        assert_eq!(k("https://index.docker.io/v1/"), "index.docker.io");
        assert_eq!(k("http://127.0.0.1:5000"), "127.0.0.1:5000");
        assert_eq!(k("registry.example.com/team"), "registry.example.com/team");
        assert_eq!(
            k("https://registry.example.com/v2/team"),
            "registry.example.com/team"
        );
        assert_eq!(k("*.example.com"), "*.example.com");
        assert_eq!(registry_key("host:port"), None);
    }

    #[test]
    fn url_matching_with_wildcards_ports_and_paths() {
        assert!(urls_match("example.com", "example.com/a/b"));
        assert!(urls_match("*.example.com", "registry.example.com/a"));
        assert!(
            !urls_match("*.example.com", "example.com/a"),
            "label count differs"
        );
        assert!(
            !urls_match("*.example.com", "a.b.example.com/a"),
            "label count differs"
        );
        assert!(urls_match("*.*.example.com", "a.b.example.com/x"));
        assert!(urls_match("reg?.example.com", "reg1.example.com/x"));
        assert!(urls_match("reg[0-9].example.com", "reg7.example.com/x"));
        assert!(!urls_match("reg[^0-9].example.com", "reg7.example.com/x"));
        assert!(
            !urls_match("reg[0-9.example.com", "reg7.example.com/x"),
            "malformed"
        );
        assert!(urls_match("127.0.0.1:5000", "127.0.0.1:5000/test/busybox"));
        assert!(!urls_match("127.0.0.1:5000", "127.0.0.1:5001/test/busybox"));
        assert!(
            !urls_match("127.0.0.1", "127.0.0.1:5000/test/busybox"),
            "ports must match"
        );
        assert!(urls_match("example.com/team", "example.com/team/app"));
        assert!(!urls_match("example.com/team", "example.com/other/app"));
        assert!(!urls_match("example.com", "example.org/a"));
    }

    #[test]
    fn glob_follows_go_filepath_match() {
        assert!(glob_match("", ""));
        assert!(!glob_match("", "a"));
        assert!(glob_match("*", ""));
        assert!(glob_match("a*", "abc"));
        assert!(glob_match("a*c", "abbbc"));
        assert!(glob_match("*c", "abc"));
        assert!(!glob_match("a*c", "abcd"));
        assert!(glob_match("a*b*c", "axxbyyc"));
        assert!(glob_match("a*b?c", "axbbyc"));
        assert!(!glob_match("a*", "a/b"), "a star stops at /");
        assert!(!glob_match("a?b", "a/b"), "? does not take /");
        assert!(glob_match("[a-c]x", "bx"));
        assert!(glob_match("[^a-c]x", "dx"));
        assert!(!glob_match("[^a-c]x", "ax"));
        assert!(glob_match("[ab0-9]", "7"));
        assert!(glob_match("[\\]]", "]"));
        assert!(glob_match("[\\-]", "-"));
        assert!(glob_match("\\*", "*"));
        assert!(!glob_match("\\*", "a"));
        assert!(glob_match("é?", "éa"), "? takes one character, not a byte");
        // Patterns Go's filepath.Match calls malformed never match, even
        // where the text would.
        for bad in [
            "[", "[]", "[]a]", "[^]", "[a-]", "[-a]", "a\\", "[a", "[a-\\", "*[",
        ] {
            assert!(parse_glob(bad).is_none(), "{bad:?} is malformed");
            assert!(!glob_match(bad, "a"), "{bad:?}");
            assert!(!glob_match(bad, ""), "{bad:?}");
        }
    }

    #[test]
    fn many_stars_against_a_long_host_finish() {
        // A backtracking matcher takes exponential time on these; this one
        // must simply return (no time is asserted).
        let host = "a".repeat(250);
        let stars = "*".repeat(20);
        assert!(!glob_match(&format!("{stars}b"), &host));
        assert!(!glob_match(&format!("{}b", "*a".repeat(20)), &host));
        assert!(glob_match(&format!("{stars}a"), &host));
        let key = format!("{stars}b.example.com");
        let target = format!("{host}.example.com/app");
        assert!(!urls_match(&key, &target));
        let mut k = Keyring::default();
        k.add(&key, cred("stars"));
        k.add(&format!("{stars}.example.com"), cred("match"));
        assert_eq!(users(k.lookup(&target)), ["match"]);
    }

    #[test]
    fn lookup_is_most_specific_first_then_docker_hub_fallback() {
        let mut k = Keyring::default();
        k.add("quay.io", cred("host"));
        k.add("https://quay.io/coreos", cred("path"));
        k.add("qua[xy].io", cred("wild"));
        k.add("https://index.docker.io/v1/", cred("hub"));
        k.add("quay.io", cred("host2"));
        assert_eq!(
            users(k.lookup("quay.io/coreos/etcd")),
            ["path", "host", "host2", "wild"]
        );
        assert_eq!(
            users(k.lookup("quay.io/other/app")),
            ["host", "host2", "wild"]
        );
        assert_eq!(users(k.lookup("docker.io/library/busybox")), ["hub"]);
        assert!(k.lookup("gcr.example.com/app").is_empty());
    }

    #[test]
    fn secrets_in_both_formats_and_the_auth_field() {
        let json_secret = json!({"auths": {
            "http://127.0.0.1:5000": {"auth": base64::engine::general_purpose::STANDARD.encode("alice:s3cr:et")},
            "other.example.com": {"username": "bob", "password": "pw"},
        }});
        let cfg_secret = json!({"127.0.0.1:5000": {"username": "carol", "password": "pw2"}});
        let mut a = Keys::new();
        a.insert(
            DOCKER_CONFIG_JSON_KEY.into(),
            json_secret.to_string().into_bytes(),
        );
        let mut b = Keys::new();
        b.insert(DOCKER_CFG_KEY.into(), cfg_secret.to_string().into_bytes());
        let mut opaque = Keys::new();
        opaque.insert("password".into(), b"x".to_vec());
        let k = Keyring::from_secrets(&[
            ("ns/a".into(), a),
            ("ns/opaque".into(), opaque),
            ("ns/b".into(), b),
        ])
        .unwrap();
        let found = k.lookup("127.0.0.1:5000/test/busybox");
        assert_eq!(
            found,
            [
                Credential {
                    username: "alice".into(),
                    password: "s3cr:et".into()
                },
                Credential {
                    username: "carol".into(),
                    password: "pw2".into()
                }
            ]
        );
        let a = found[0].auth_config();
        assert_eq!(
            (a.username.as_str(), a.server_address.as_str()),
            ("alice", "")
        );

        // Unpadded auth decodes too; a bad one names the secret and entry.
        let mut c = Keys::new();
        let unpadded = base64::engine::general_purpose::STANDARD_NO_PAD.encode("u:p1");
        c.insert(
            DOCKER_CFG_KEY.into(),
            json!({"r.example.com": {"auth": unpadded}})
                .to_string()
                .into_bytes(),
        );
        let k = Keyring::from_secrets(&[("ns/c".into(), c)]).unwrap();
        assert_eq!(k.lookup("r.example.com/x")[0].password, "p1");
        let mut d = Keys::new();
        d.insert(
            DOCKER_CFG_KEY.into(),
            json!({"r.example.com": {"auth": base64::engine::general_purpose::STANDARD.encode("nocolon")}})
                .to_string()
                .into_bytes(),
        );
        let e = Keyring::from_secrets(&[("ns/d".into(), d)]).unwrap_err();
        assert!(
            e.contains("secret ns/d: .dockercfg") && e.contains("base64(username:password)"),
            "{e}"
        );
        let mut bad = Keys::new();
        bad.insert(DOCKER_CONFIG_JSON_KEY.into(), b"{not json".to_vec());
        let e = Keyring::from_secrets(&[("ns/bad".into(), bad)]).unwrap_err();
        assert!(e.starts_with("secret ns/bad: .dockerconfigjson: "), "{e}");
    }
}

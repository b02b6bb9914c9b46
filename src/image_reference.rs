//! Image references (`[host[:port]/]path[:tag][@digest]`): the one grammar
//! and normalization the node applies to a container's `image`, as upstream
//! does through docker's `reference` package (`parsers.ParseImageName`).
//!
//! Pod validation (`config::validation`) and the image manager (`images`)
//! both parse with it, each printing the error in its own words. This file
//! is ground floor: it imports nothing but std, so any layer may use it.

use std::fmt;

/// The registry Docker Hub's legacy credentials and names are stored under;
/// a reference naming it is normalized to `docker.io`.
pub(crate) const DEFAULT_REGISTRY_HOST: &str = "index.docker.io";

/// Longest repository name (with its domain, normalized) a registry accepts.
const NAME_TOTAL_MAX: usize = 255;

/// A parsed image reference (upstream `parsers.ParseImageName`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ImageName {
    /// The normalized repository: `docker.io/library/busybox`.
    pub(crate) repo: String,
    /// The tag; `latest` when neither tag nor digest is given.
    pub(crate) tag: String,
    pub(crate) digest: String,
}

/// The first thing wrong with a reference, in the order docker checks:
/// digest, tag, an empty name, upper case in the repository path, the
/// registry host, each path component, the length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ReferenceError {
    /// The digest after `@`, and what is wrong with it.
    Digest {
        digest: String,
        why: &'static str,
    },
    Tag(String),
    EmptyName,
    /// The repository path (normalized: `library/Nginx`) has upper case
    /// letters; `component` is the first path component that has them.
    Uppercase {
        repository: String,
        component: String,
    },
    Domain(String),
    PathComponent(String),
    /// The normalized repository name is longer than 255 characters.
    NameTooLong,
}

impl fmt::Display for ReferenceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReferenceError::Digest { digest, why } => write!(f, "digest {digest:?} {why}"),
            ReferenceError::Tag(tag) => write!(
                f,
                "tag {tag:?} must be 1-128 letters, digits, '_', '.' or '-', not starting with '.' or '-'"
            ),
            ReferenceError::EmptyName => f.write_str("the name is empty"),
            ReferenceError::Uppercase { component, .. } | ReferenceError::PathComponent(component) => {
                write!(
                    f,
                    "path component {component:?} must be lower case letters and digits, \
                     separated by '.', '_', '__' or dashes"
                )
            }
            ReferenceError::Domain(registry) => write!(
                f,
                "registry host {registry:?} is not a host name with an optional port"
            ),
            ReferenceError::NameTooLong => write!(
                f,
                "the name is longer than {NAME_TOTAL_MAX} characters"
            ),
        }
    }
}

fn is_name_component(s: &str) -> bool {
    // [a-z0-9]+ separated by '.', '_', '__' or runs of '-'.
    let b = s.as_bytes();
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    if b.is_empty() || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if alnum(b[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && !alnum(b[i]) {
            i += 1;
        }
        let sep = &s[start..i];
        if !(sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|c| c == b'-')) {
            return false;
        }
    }
    true
}

fn is_domain(s: &str) -> bool {
    let (host, port) = match s.rsplit_once(':') {
        Some((h, p)) if !h.starts_with('[') || h.ends_with(']') => (h, Some(p)),
        _ => (s, None),
    };
    if port.is_some_and(|p| p.is_empty() || !p.bytes().all(|c| c.is_ascii_digit())) {
        return false;
    }
    if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        return !v6.is_empty() && v6.bytes().all(|c| c.is_ascii_hexdigit() || c == b':');
    }
    !host.is_empty()
        && host.split('.').all(|label| {
            let b = label.as_bytes();
            !b.is_empty()
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
        })
}

fn is_tag(s: &str) -> bool {
    let b = s.as_bytes();
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    !b.is_empty()
        && b.len() <= 128
        && word(b[0])
        && b.iter().all(|c| word(*c) || *c == b'.' || *c == b'-')
}

/// What is wrong with a digest (`ALGORITHM:HEX`), if anything: the
/// algorithm is `[A-Za-z][A-Za-z0-9]*` components joined by `+`, `.`, `-`
/// or `_`, the hex at least 32 digits.
fn digest_problem(digest: &str) -> Option<&'static str> {
    let Some((algorithm, hex)) = digest.split_once(':') else {
        return Some("must be ALGORITHM:HEX");
    };
    let component_ok = |c: &str| {
        c.chars().next().is_some_and(|f| f.is_ascii_alphabetic())
            && c.chars().all(|ch| ch.is_ascii_alphanumeric())
    };
    if !algorithm.split(['+', '.', '-', '_']).all(component_ok) {
        return Some("has an invalid algorithm");
    }
    if hex.len() < 32 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return Some("must have at least 32 hex digits");
    }
    None
}

/// Parses and normalizes an image reference the way Docker does: a first
/// component without `.` or `:` (and not `localhost`) is a Docker Hub path,
/// and Docker Hub names without a `/` live under `library/`.
pub(crate) fn parse_reference(image: &str) -> Result<ImageName, ReferenceError> {
    let (rest, digest) = match image.split_once('@') {
        Some((r, d)) => (r, Some(d)),
        None => (image, None),
    };
    if let Some(digest) = digest {
        if let Some(why) = digest_problem(digest) {
            return Err(ReferenceError::Digest {
                digest: digest.to_string(),
                why,
            });
        }
    }
    let (name, tag) = match rest.rsplit_once(':') {
        Some((n, t)) if !t.contains('/') => (n, Some(t)),
        _ => (rest, None),
    };
    if let Some(tag) = tag {
        if !is_tag(tag) {
            return Err(ReferenceError::Tag(tag.to_string()));
        }
    }
    if name.is_empty() {
        return Err(ReferenceError::EmptyName);
    }
    let (domain, remainder) = match name.split_once('/') {
        Some((d, r))
            if d.contains('.') || d.contains(':') || d == "localhost" || d.to_lowercase() != d =>
        {
            (d, r.to_string())
        }
        _ => ("docker.io", name.to_string()),
    };
    let domain = if domain == DEFAULT_REGISTRY_HOST {
        "docker.io"
    } else {
        domain
    };
    let remainder = if domain == "docker.io" && !remainder.contains('/') {
        format!("library/{remainder}")
    } else {
        remainder
    };
    if remainder.to_lowercase() != remainder {
        let component = remainder
            .split('/')
            .find(|c| c.to_lowercase() != *c)
            .unwrap_or_default()
            .to_string();
        return Err(ReferenceError::Uppercase {
            repository: remainder,
            component,
        });
    }
    if !is_domain(domain) {
        return Err(ReferenceError::Domain(domain.to_string()));
    }
    if let Some(c) = remainder.split('/').find(|c| !is_name_component(c)) {
        return Err(ReferenceError::PathComponent(c.to_string()));
    }
    let repo = format!("{domain}/{remainder}");
    if repo.len() > NAME_TOTAL_MAX {
        return Err(ReferenceError::NameTooLong);
    }
    let digest = digest.unwrap_or("");
    let tag = match tag {
        None if digest.is_empty() => "latest",
        t => t.unwrap_or(""),
    };
    Ok(ImageName {
        repo,
        tag: tag.to_string(),
        digest: digest.to_string(),
    })
}

/// `parse_reference` with the error as docker prints it (the image
/// manager's InvalidImageName message).
pub(crate) fn parse_image_name(image: &str) -> Result<ImageName, String> {
    parse_reference(image).map_err(|e| {
        let why = match e {
            ReferenceError::Uppercase { repository, .. } => {
                format!(": repository name ({repository}) must be lowercase")
            }
            ReferenceError::NameTooLong => {
                format!(": repository name must not be more than {NAME_TOTAL_MAX} characters")
            }
            _ => String::new(),
        };
        format!("couldn't parse image name {image:?}: invalid reference format{why}")
    })
}

/// The image as the runtime is asked for it: with `:latest` appended when
/// it names neither tag nor digest (the name itself stays short).
pub(crate) fn apply_default_tag(image: &str) -> Result<String, String> {
    let r = parse_image_name(image)?;
    if r.digest.is_empty() && !image.ends_with(&format!(":{}", r.tag)) {
        Ok(format!("{image}:{}", r.tag))
    } else {
        Ok(image.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_names_normalize_like_docker() {
        let p = |s: &str| parse_image_name(s).unwrap();
        assert_eq!(p("busybox").repo, "docker.io/library/busybox");
        assert_eq!(p("busybox").tag, "latest");
        assert_eq!(p("tinylet/busybox:1").repo, "docker.io/tinylet/busybox");
        assert_eq!(
            p("index.docker.io/busybox").repo,
            "docker.io/library/busybox"
        );
        assert_eq!(p("localhost/app").repo, "localhost/app");
        let r = p("127.0.0.1:5000/test/busybox:1");
        assert_eq!(
            (r.repo.as_str(), r.tag.as_str()),
            ("127.0.0.1:5000/test/busybox", "1")
        );
        let d = format!("quay.io/coreos/etcd@sha256:{}", "0".repeat(64));
        let r = p(&d);
        assert_eq!((r.tag.as_str(), r.digest.len()), ("", 71));
        for bad in [
            "",
            "upper/Case",
            "a b",
            "busybox:",
            "busybox@sha256:12",
            "-x",
        ] {
            assert!(parse_image_name(bad).is_err(), "{bad:?} parsed");
        }
        assert_eq!(apply_default_tag("busybox").unwrap(), "busybox:latest");
        assert_eq!(
            apply_default_tag("localhost:5000/a").unwrap(),
            "localhost:5000/a:latest"
        );
        assert_eq!(apply_default_tag("a/b:1").unwrap(), "a/b:1");
        assert_eq!(apply_default_tag(&d).unwrap(), d);
    }

    #[test]
    fn digest_algorithms_are_components_joined_by_separators() {
        let hex = "a".repeat(64);
        for alg in ["sha256", "sha256+b64u", "multihash+base58", "a.b-c_d"] {
            assert!(
                parse_reference(&format!("nginx@{alg}:{hex}")).is_ok(),
                "{alg}"
            );
        }
        // Docker's grammar: every component starts with a letter and none
        // is empty.
        for alg in ["sha256+", "a_1", "sha..256", "-sha256"] {
            let e = parse_reference(&format!("nginx@{alg}:{hex}")).unwrap_err();
            assert!(
                matches!(
                    e,
                    ReferenceError::Digest {
                        why: "has an invalid algorithm",
                        ..
                    }
                ),
                "{alg}: {e:?}"
            );
        }
    }

    #[test]
    fn the_length_limit_counts_the_normalized_name() {
        // 238 characters of path: 256 once under docker.io/library/.
        let hub = "b".repeat(238);
        assert_eq!(parse_reference(&hub), Err(ReferenceError::NameTooLong));
        let fits = "b".repeat(237);
        assert_eq!(parse_reference(&fits).map(|r| r.repo.len()), Ok(255));
        // index.docker.io is counted as docker.io.
        let legacy = format!("index.docker.io/team/{}", "b".repeat(240));
        assert_eq!(legacy.len(), 261);
        assert!(parse_reference(&legacy).is_ok());
        assert!(parse_image_name(&hub).unwrap_err().ends_with(
            "invalid reference format: repository name must not be more than 255 characters"
        ));
    }

    #[test]
    fn ipv6_registry_hosts_are_hex_digits_and_colons() {
        assert_eq!(
            parse_reference("[fe80::1]:5000/app:tag").map(|r| r.repo),
            Ok("[fe80::1]:5000/app".to_string())
        );
        assert!(parse_reference("[fe80::1]/app").is_ok());
        assert_eq!(
            parse_reference("[::ffff:10.0.0.1]:5000/app"),
            Err(ReferenceError::Domain("[::ffff:10.0.0.1]:5000".into()))
        );
    }

    #[test]
    fn errors_name_what_is_wrong() {
        let e = |s: &str| parse_reference(s).unwrap_err().to_string();
        assert_eq!(
            e("team/My-App"),
            "path component \"My-App\" must be lower case letters and digits, separated by '.', '_', '__' or dashes"
        );
        assert_eq!(
            e("@sha256:abc"),
            "digest \"sha256:abc\" must have at least 32 hex digits"
        );
        assert_eq!(e(":1"), "the name is empty");
        assert!(parse_image_name("team/My-App").unwrap_err().ends_with(
            "invalid reference format: repository name (team/My-App) must be lowercase"
        ));
        assert!(parse_image_name("a.-b/app")
            .unwrap_err()
            .ends_with("invalid reference format"));
    }
}

//! The redirect rule the kubelet applies to its own HTTP GETs (httpGet
//! probes and lifecycle hooks): a redirect is followed only to the host
//! name of the original URL, at most `MAX_REDIRECTS` times; one to another
//! host ends the request. Shared so that probes and hooks cannot drift
//! apart.

/// Redirects to the same host followed (Go's client stops after 10).
pub const MAX_REDIRECTS: usize = 10;

/// The host name of an absolute URL, without port or brackets.
fn url_hostname(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let authority = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if let Some(v6) = authority.strip_prefix('[') {
        return v6.split(']').next().unwrap_or("");
    }
    authority.split(':').next().unwrap_or("")
}

/// `location` resolved against `base` (absolute, or a path on the same origin).
fn resolve_location(base: &str, location: &str) -> String {
    if location.contains("://") {
        return location.to_string();
    }
    let (scheme, rest) = base.split_once("://").unwrap_or(("http", base));
    let origin = rest.split('/').next().unwrap_or(rest);
    if let Some(path) = location.strip_prefix('/') {
        if let Some(no_scheme) = path.strip_prefix('/') {
            return format!("{scheme}://{no_scheme}");
        }
        return format!("{scheme}://{origin}/{path}");
    }
    // Relative to the current path's directory.
    let path = &rest[origin.len()..];
    let path = path.split(['?', '#']).next().unwrap_or("");
    let dir = path.rsplit_once('/').map_or("", |(d, _)| d);
    format!("{scheme}://{origin}{dir}/{location}")
}

/// Where a redirect from `url` to `location` leads, when the kubelet's
/// redirect check lets it be followed: only to the host name of `first`,
/// the request's original URL (the port may differ, as Go compares host
/// names). `None`: a redirect to another host, not followed. Shared by
/// probes and lifecycle hooks.
pub fn same_host_redirect(first: &str, url: &str, location: &str) -> Option<String> {
    let next = resolve_location(url, location);
    (url_hostname(&next) == url_hostname(first)).then_some(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_and_locations() {
        assert_eq!(url_hostname("http://[fd00::1]:8080/x"), "fd00::1");
        assert_eq!(url_hostname("https://a.test:1/x"), "a.test");
        let base = "http://10.0.0.1:80/a/b";
        assert_eq!(resolve_location(base, "/c"), "http://10.0.0.1:80/c");
        assert_eq!(resolve_location(base, "c"), "http://10.0.0.1:80/a/c");
        assert_eq!(resolve_location(base, "//x.test/c"), "http://x.test/c");
        assert_eq!(resolve_location(base, "https://y/z"), "https://y/z");
    }
}

//! The kubelet's own HTTP GET client, shared by httpGet probes and
//! lifecycle hooks so that they cannot drift apart: the agent (no
//! certificate verification, as upstream; no kept connections), one request
//! with the handler's headers and a timeout, the redirect rule (a redirect
//! is followed only to the host name of the original URL, at most
//! `MAX_REDIRECTS` times; one to another host ends the request), and the
//! limit on the body read. What counts as success is the caller's.

use std::io::Read;
use std::time::Duration;

/// Redirects to the same host followed (Go's client stops after 10).
pub(crate) const MAX_REDIRECTS: usize = 10;

/// Upstream reads at most this much of a response body.
pub(crate) const MAX_BODY: u64 = 10 * 1024;

/// Whether the agent takes a proxy from the environment (`HTTP_PROXY` and
/// the like) or always connects directly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Proxy {
    Direct,
    FromEnv,
}

/// An agent for httpGet requests sending `user_agent`: HTTPS without
/// certificate verification, redirects left to [`get`], every status an
/// answer, no kept connections, `Accept: */*` unless the request sets one.
pub(crate) fn agent(user_agent: &str, proxy: Proxy) -> ureq::Agent {
    let tls = ureq::tls::TlsConfig::builder()
        .disable_verification(true)
        .build();
    let config = ureq::Agent::config_builder()
        .tls_config(tls)
        .max_redirects(0)
        .http_status_as_error(false)
        .max_idle_connections(0)
        .max_idle_connections_per_host(0)
        .user_agent(user_agent)
        .accept("*/*");
    match proxy {
        Proxy::Direct => config.proxy(None),
        Proxy::FromEnv => config,
    }
    .build()
    .into()
}

/// The answer an httpGet ends with.
#[derive(Debug)]
pub(crate) struct Response {
    /// The URL that answered (after the redirects followed).
    pub(crate) url: String,
    pub(crate) status: u16,
    /// The first [`MAX_BODY`] bytes of the body, or why it could not be read.
    pub(crate) body: std::io::Result<Vec<u8>>,
    /// The location of a redirect to another host, not followed: this
    /// response is then the redirect itself.
    pub(crate) refused_redirect: Option<String>,
}

/// Why an httpGet got no answer.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The request to `url` failed.
    Request { url: String, error: ureq::Error },
    /// More than [`MAX_REDIRECTS`] redirects to the same host: `Get "<url>":
    /// stopped after 10 redirects`, as Go's client says it.
    TooManyRedirects(String),
}

/// GETs `url` with `headers` (in order; they win over the agent's
/// User-Agent and Accept), each request bounded by `timeout`, following
/// redirects to the same host.
pub(crate) fn get(
    agent: &ureq::Agent,
    url: &str,
    headers: &[(&str, &str)],
    timeout: Duration,
) -> Result<Response, Failure> {
    let first = url.to_string();
    let mut url = first.clone();
    for hop in 0..=MAX_REDIRECTS {
        let mut req = agent
            .get(&url)
            .config()
            .timeout_global(Some(timeout))
            .build();
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let mut resp = match req.call() {
            Ok(r) => r,
            Err(error) => return Err(Failure::Request { url, error }),
        };
        let status = resp.status().as_u16();
        let mut refused_redirect = None;
        if (300..400).contains(&status) {
            let location = resp
                .headers()
                .get("location")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            if let Some(loc) = location {
                if let Some(next) = same_host_redirect(&first, &url, &loc) {
                    if hop == MAX_REDIRECTS {
                        return Err(Failure::TooManyRedirects(format!(
                            "Get {next:?}: stopped after {MAX_REDIRECTS} redirects"
                        )));
                    }
                    url = next;
                    continue;
                }
                refused_redirect = Some(loc);
            }
        }
        let mut body = Vec::new();
        let read = resp
            .body_mut()
            .as_reader()
            .take(MAX_BODY)
            .read_to_end(&mut body);
        return Ok(Response {
            url,
            status,
            body: read.map(|_| body),
            refused_redirect,
        });
    }
    Err(Failure::TooManyRedirects(format!(
        "Get {url:?}: stopped after {MAX_REDIRECTS} redirects"
    )))
}

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
pub(crate) fn same_host_redirect(first: &str, url: &str, location: &str) -> Option<String> {
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

    /// A server answering one request per answer; returns each request's
    /// first line and headers (lower-cased).
    fn server(answers: Vec<String>) -> (u16, crate::thread::JoinOnDrop<Vec<Vec<String>>>) {
        use std::io::{BufRead, BufReader, Write};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let t = crate::thread::spawn_named("test-httpget", move || {
            let mut seen = Vec::new();
            for answer in answers {
                let (mut s, _) = l.accept().unwrap();
                let mut r = BufReader::new(s.try_clone().unwrap());
                let mut request = Vec::new();
                loop {
                    let mut line = String::new();
                    r.read_line(&mut line).unwrap();
                    if line == "\r\n" || line.is_empty() {
                        break;
                    }
                    request.push(line.trim_end().to_ascii_lowercase());
                }
                seen.push(request);
                // A client that stops reading may close first: ignore it.
                let _ = s.write_all(answer.as_bytes());
            }
            seen
        })
        .unwrap();
        (port, t)
    }

    #[test]
    fn get_follows_same_host_redirects_sends_headers_and_bounds_the_body() {
        let big = "x".repeat(20 * 1024);
        let (port, server) = server(vec![
            "HTTP/1.1 302 Found\r\nLocation: /next\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".into(),
            format!(
                "HTTP/1.1 302 Found\r\nLocation: http://elsewhere.test/x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{big}",
                big.len()
            ),
        ]);
        let agent = agent("test-agent/1", Proxy::Direct);
        let url = format!("http://127.0.0.1:{port}/first");
        let resp = get(
            &agent,
            &url,
            &[("Accept", "text/plain"), ("X-Custom", "1")],
            Duration::from_secs(30),
        )
        .unwrap();
        assert_eq!(resp.url, format!("http://127.0.0.1:{port}/next"));
        assert_eq!(resp.status, 302);
        assert_eq!(
            resp.refused_redirect.as_deref(),
            Some("http://elsewhere.test/x")
        );
        assert_eq!(resp.body.unwrap().len() as u64, MAX_BODY);
        let seen = server.join().unwrap();
        assert_eq!(seen.len(), 2);
        assert_eq!(seen[0][0], "get /first http/1.1");
        assert_eq!(seen[1][0], "get /next http/1.1");
        for request in &seen {
            let has = |h: &str| request.iter().filter(|l| *l == h).count();
            assert_eq!(has("accept: text/plain"), 1, "{request:?}");
            assert_eq!(has("accept: */*"), 0, "{request:?}");
            assert_eq!(has("user-agent: test-agent/1"), 1, "{request:?}");
            assert_eq!(has("x-custom: 1"), 1, "{request:?}");
        }
    }
}

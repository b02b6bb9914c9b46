//! Container lifecycle hooks (upstream `lifecycle/handlers.go`): running a
//! postStart or preStop handler (exec through CRI ExecSync, httpGet, sleep)
//! and saying, in upstream's words, why it failed.
//!
//! The HTTP GET is the kubelet's one httpGet client (`crate::httpget`): one
//! blocking request, TLS without verification as upstream does for hooks,
//! the proxy from the environment, redirects checked
//! as for probes (same host only, up to 10: upstream's hooks use the
//! probes' redirect check since v1.26 with ConsistentHTTPGetHandlers, GA in
//! v1.28; before, they followed any redirect), the response status not
//! checked (upstream only fails a hook on a transport error).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, HTTPGetAction, LifecycleHandler, Pod};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use log::debug;

use crate::cri::RuntimeService;
use crate::httpget::{self, Failure, Proxy};
use crate::pod::{pod_name, pod_namespace, pod_uid};

/// The `User-Agent` of hook requests (upstream: `kube-lifecycle/<version>`).
const USER_AGENT: &str = concat!("kube-lifecycle/", env!("CARGO_PKG_VERSION"));

/// A pod as upstream's messages name it: `name_namespace(uid)`.
pub(crate) fn format_pod(pod: &Pod) -> String {
    format!("{}_{}({})", pod_name(pod), pod_namespace(pod), pod_uid(pod))
}

/// Go's `%v` of a string slice: `[a b c]`.
fn go_list(v: &[String]) -> String {
    format!("[{}]", v.join(" "))
}

/// Runs `handler` for container `c` (running as `container_id`) of `pod`,
/// reaching the pod at `pod_ip` for httpGet. `timeout` bounds an httpGet
/// and the runtime's own limit on an exec. Returns upstream's message on
/// failure.
pub(crate) fn run(
    runtime: &Arc<dyn RuntimeService>,
    pod: &Pod,
    c: &Container,
    container_id: &str,
    handler: &LifecycleHandler,
    pod_ip: Option<&str>,
    timeout: Duration,
) -> Result<(), String> {
    if let Some(exec) = &handler.exec {
        let cmd = exec.command.clone().unwrap_or_default();
        let fail = |err: String, output: &str| {
            format!(
                "Exec lifecycle hook ({}) for Container {:?} in Pod {:?} failed - error: {err}, message: {output:?}",
                go_list(&cmd),
                c.name,
                format_pod(pod)
            )
        };
        // No limit of the runtime's own for a hook, as upstream; the call's
        // deadline and the caller's wait bound it.
        return match runtime.exec_sync(container_id, &cmd, Duration::ZERO) {
            Ok(r) if r.exit_code == 0 => Ok(()),
            Ok(r) => {
                let mut output = String::from_utf8_lossy(&r.stdout).into_owned();
                output.push_str(&String::from_utf8_lossy(&r.stderr));
                Err(fail(
                    format!(
                        "command '{}' exited with {}: {}",
                        cmd.join(" "),
                        r.exit_code,
                        String::from_utf8_lossy(&r.stderr)
                    ),
                    &output,
                ))
            }
            Err(e) => Err(fail(e.to_string(), "")),
        };
    }
    if let Some(get) = &handler.http_get {
        let path = get.path.clone().unwrap_or_default();
        return http_get(get, c, pod_ip, timeout).map_err(|e| {
            format!(
                "HTTP lifecycle hook ({path}) for Container {:?} in Pod {:?} failed - error: {e}",
                c.name,
                format_pod(pod)
            )
        });
    }
    if let Some(sleep) = &handler.sleep {
        let secs = u64::try_from(sleep.seconds).unwrap_or(0);
        std::thread::sleep(Duration::from_secs(secs).min(timeout));
        return Ok(());
    }
    Err(format!(
        "invalid handler for Container {:?} in Pod {:?}: neither exec, httpGet nor sleep",
        c.name,
        format_pod(pod)
    ))
}

/// The port a hook or probe names, by number or by the container's port name.
pub(crate) fn resolve_port(port: &IntOrString, c: &Container) -> Result<u16, String> {
    let n = match port {
        IntOrString::Int(n) => i64::from(*n),
        IntOrString::String(s) => match s.parse::<i64>() {
            Ok(n) => n,
            Err(_) => c
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(s.as_str()))
                .map(|p| i64::from(p.container_port))
                .ok_or_else(|| format!("couldn't find port: {s} in container {:?}", c.name))?,
        },
    };
    u16::try_from(n)
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| format!("invalid port number: {n}"))
}

/// The URL an httpGet handler asks for.
fn hook_url(get: &HTTPGetAction, c: &Container, pod_ip: Option<&str>) -> Result<String, String> {
    let host = match get.host.as_deref().filter(|h| !h.is_empty()) {
        Some(h) => h.to_string(),
        None => pod_ip
            .filter(|ip| !ip.is_empty())
            .ok_or("the pod has no IP to send the request to")?
            .to_string(),
    };
    let host = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host
    };
    let port = resolve_port(&get.port, c)?;
    let scheme = get.scheme.as_deref().unwrap_or("HTTP").to_ascii_lowercase();
    let path = get.path.as_deref().unwrap_or("");
    let path = if path.starts_with('/') || path.is_empty() {
        path.to_string()
    } else {
        format!("/{path}")
    };
    Ok(format!("{scheme}://{host}:{port}{path}"))
}

fn http_get(
    get: &HTTPGetAction,
    c: &Container,
    pod_ip: Option<&str>,
    timeout: Duration,
) -> Result<(), String> {
    let url = hook_url(get, c, pod_ip)?;
    let agent = httpget::agent(USER_AGENT, Proxy::FromEnv);
    let mut headers = vec![("Accept", "*/*")];
    headers.extend(
        get.http_headers
            .iter()
            .flatten()
            .map(|h| (h.name.as_str(), h.value.as_str())),
    );
    // The status is not looked at: only a transport error fails a hook. A
    // redirect to another host is the answer, as upstream.
    match httpget::get(&agent, &url, &headers, timeout) {
        Ok(resp) => {
            if let Some(location) = resp.refused_redirect {
                debug!("lifecycle hook {url}: redirect to another host ({location}) not followed");
            }
            Ok(())
        }
        Err(Failure::Request { url, error }) => Err(format!("Get {url:?}: {error}")),
        Err(Failure::TooManyRedirects(message)) => Err(message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ContainerPort;

    fn web() -> Container {
        Container {
            name: "web".into(),
            ports: Some(vec![ContainerPort {
                name: Some("http".into()),
                container_port: 8080,
                ..Default::default()
            }]),
            ..Default::default()
        }
    }

    #[test]
    fn urls_from_handlers() {
        let get = HTTPGetAction {
            path: Some("hooks/start".into()),
            port: IntOrString::String("http".into()),
            ..Default::default()
        };
        assert_eq!(
            hook_url(&get, &web(), Some("10.88.0.5")).unwrap(),
            "http://10.88.0.5:8080/hooks/start"
        );
        let get = HTTPGetAction {
            host: Some("fd00::1".into()),
            port: IntOrString::Int(9000),
            scheme: Some("HTTPS".into()),
            ..Default::default()
        };
        assert_eq!(
            hook_url(&get, &web(), None).unwrap(),
            "https://[fd00::1]:9000"
        );
        let get = HTTPGetAction {
            port: IntOrString::String("metrics".into()),
            ..Default::default()
        };
        let err = hook_url(&get, &web(), Some("10.0.0.1")).unwrap_err();
        assert!(err.contains("couldn't find port: metrics"), "{err}");
        let get = HTTPGetAction {
            port: IntOrString::String("81".into()),
            ..Default::default()
        };
        assert!(
            hook_url(&get, &web(), None).is_err(),
            "no host and no pod IP"
        );
        assert_eq!(
            hook_url(&get, &web(), Some("10.0.0.1")).unwrap(),
            "http://10.0.0.1:81"
        );
    }

    #[test]
    fn http_hook_reaches_the_server_and_ignores_the_status() {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = crate::thread::spawn_named("test-hook-server", move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = [0u8; 2048];
            let n = s.read(&mut buf).unwrap();
            s.write_all(b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                .unwrap();
            String::from_utf8_lossy(&buf[..n]).into_owned()
        })
        .unwrap();
        let get = HTTPGetAction {
            path: Some("/stop".into()),
            port: IntOrString::Int(i32::from(port)),
            http_headers: Some(vec![k8s_openapi::api::core::v1::HTTPHeader {
                name: "X-Hook".into(),
                value: "pre".into(),
            }]),
            ..Default::default()
        };
        http_get(&get, &web(), Some("127.0.0.1"), Duration::from_secs(5)).unwrap();
        let request = server.join().unwrap();
        assert!(request.starts_with("GET /stop HTTP/1.1"), "{request}");
        assert!(
            request.to_ascii_lowercase().contains("x-hook: pre"),
            "{request}"
        );
        assert!(request.contains("kube-lifecycle/"), "{request}");

        // Nothing listens: a transport error fails the hook.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = closed.local_addr().unwrap().port();
        drop(closed);
        let get = HTTPGetAction {
            port: IntOrString::Int(i32::from(port)),
            ..Default::default()
        };
        assert!(http_get(&get, &web(), Some("127.0.0.1"), Duration::from_secs(5)).is_err());
    }

    /// A server on 127.0.0.1 answering each request with the next of
    /// `answers` (status line and headers); gives its port and the request
    /// lines it received.
    fn redirecting_server(answers: Vec<String>) -> (u16, crate::thread::JoinOnDrop<Vec<String>>) {
        use std::io::{BufRead, BufReader, Write};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let t = crate::thread::spawn_named("test-hook-redirects", move || {
            let mut seen = Vec::new();
            for answer in answers {
                let (mut s, _) = l.accept().unwrap();
                let mut r = BufReader::new(s.try_clone().unwrap());
                let mut first = String::new();
                r.read_line(&mut first).unwrap();
                loop {
                    let mut line = String::new();
                    r.read_line(&mut line).unwrap();
                    if line == "\r\n" || line.is_empty() {
                        break;
                    }
                }
                seen.push(first.trim_end().to_string());
                write!(
                    s,
                    "HTTP/1.1 {answer}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                )
                .unwrap();
            }
            seen
        })
        .unwrap();
        (port, t)
    }

    #[test]
    fn http_hook_follows_same_host_redirects_only() {
        // Another host (127.0.0.2 is another host name for the check) that
        // must never be asked: nothing accepts, so a request to it would
        // wait for its answer until the hook's timeout.
        let other = std::net::TcpListener::bind("127.0.0.2:0").unwrap();
        other.set_nonblocking(true).unwrap();
        let other_port = other.local_addr().unwrap().port();
        let (port, server) = redirecting_server(vec![
            "302 Found\r\nLocation: /next".into(),
            format!("302 Found\r\nLocation: http://127.0.0.2:{other_port}/stolen"),
        ]);
        let get = HTTPGetAction {
            path: Some("/start".into()),
            port: IntOrString::Int(i32::from(port)),
            ..Default::default()
        };
        let got = http_get(&get, &web(), Some("127.0.0.1"), Duration::from_secs(3));
        assert_eq!(got, Ok(()));
        assert_eq!(
            server.join().unwrap(),
            ["GET /start HTTP/1.1", "GET /next HTTP/1.1"]
        );
        assert_eq!(
            other.accept().map(|_| ()).map_err(|e| e.kind()),
            Err(std::io::ErrorKind::WouldBlock),
            "the redirect to another host was followed"
        );

        // Same-host redirects stop after 10, as Go's client.
        let (port, server) = redirecting_server(vec!["302 Found\r\nLocation: /again".into(); 11]);
        let get = HTTPGetAction {
            port: IntOrString::Int(i32::from(port)),
            ..Default::default()
        };
        let err = http_get(&get, &web(), Some("127.0.0.1"), Duration::from_secs(3)).unwrap_err();
        assert!(
            err.ends_with("/again\": stopped after 10 redirects"),
            "{err}"
        );
        assert_eq!(server.join().unwrap().len(), 11);
    }
}

//! The node API's authentication and authorization (`server::auth`)
//! against the fake apiserver's TokenReview and SubjectAccessReview: the
//! node's own API client asks, answers are cached (counted on the fake),
//! errors are not, and certificates from the fake's CA name their user.
//! Then the real binary's main port while TokenReviews fail.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use base64::Engine as _;
use serde_json::Value;
use tinylet::kube::{load_kubeconfig, Client, ClientOptions};
use tinylet::server::auth::{Auth, AuthConfig, AuthError, AuthorizationMode, User};
use tinylet::server::head::RequestHead;

use crate::cluster::Cluster;
use crate::server::free_port;
use crate::support::fake_apiserver::{FakeApiServer, KubeconfigAuth, TokenReviewFailure};
use crate::support::streams::tls_config;

const TOKEN_REVIEWS: &str = "/apis/authentication.k8s.io/v1/tokenreviews";
const ACCESS_REVIEWS: &str = "/apis/authorization.k8s.io/v1/subjectaccessreviews";

/// The node's API client, as `system:node:edge-1`.
fn node_client(fake: &FakeApiServer, dir: &tempfile::TempDir) -> Client {
    let path = fake.write_kubeconfig(dir.path(), "system:node:edge-1", KubeconfigAuth::token());
    let config = load_kubeconfig(&path).unwrap();
    let options = ClientOptions {
        qps: 0.0,
        burst: 10,
        timeout: Duration::from_secs(10),
        user_agent: "tinylet-test".into(),
    };
    Client::new(&config, options).unwrap()
}

fn config() -> AuthConfig {
    AuthConfig {
        node_name: "edge-1".into(),
        token_webhook: true,
        mode: Some(AuthorizationMode::Webhook),
        ..AuthConfig::default()
    }
}

fn request(method: &str, target: &str, token: Option<&str>) -> RequestHead {
    RequestHead {
        method: method.into(),
        target: target.into(),
        headers: token
            .map(|t| vec![("Authorization".to_string(), format!("Bearer {t}"))])
            .unwrap_or_default(),
    }
}

fn user(name: &str, groups: &[&str]) -> User {
    User {
        name: name.into(),
        groups: groups.iter().map(|g| g.to_string()).collect(),
        ..User::default()
    }
}

/// The bodies of the reviews the fake answered, as JSON.
fn review_bodies(fake: &FakeApiServer, path: &str) -> Vec<Value> {
    fake.requests()
        .iter()
        .filter(|r| r.path == path)
        .map(|r| serde_json::from_str(&r.body).unwrap())
        .collect()
}

#[test]
fn bearer_tokens_are_checked_by_token_review_and_cached() {
    let fake = FakeApiServer::start();
    let dir = tempfile::tempdir().unwrap();
    fake.add_token(
        "metrics-token",
        "system:serviceaccount:mon:prom",
        &["system:serviceaccounts"],
    );
    let auth = Auth::new(config(), Some(node_client(&fake, &dir)));

    let want = user(
        "system:serviceaccount:mon:prom",
        &["system:serviceaccounts", "system:authenticated"],
    );
    let head = request("GET", "/metrics", Some("metrics-token"));
    assert_eq!(auth.authenticate(None, &head), Ok(Some(want.clone())));
    let sent = review_bodies(&fake, TOKEN_REVIEWS);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0]["apiVersion"], "authentication.k8s.io/v1");
    assert_eq!(sent[0]["kind"], "TokenReview");
    assert_eq!(sent[0]["spec"]["token"], "metrics-token");
    // The second request is answered from the cache.
    assert_eq!(auth.authenticate(None, &head), Ok(Some(want)));
    assert_eq!(fake.count("POST", TOKEN_REVIEWS), 1);

    // A token the apiserver does not know: refused, and cached too.
    let bad = request("GET", "/metrics", Some("stolen"));
    assert_eq!(auth.authenticate(None, &bad), Err(AuthError::InvalidToken));
    assert_eq!(auth.authenticate(None, &bad), Err(AuthError::InvalidToken));
    assert_eq!(fake.count("POST", TOKEN_REVIEWS), 2);

    // A token in the WebSocket subprotocol is checked the same way (this
    // one from the cache), also after a refused Authorization header.
    let mut ws = request("GET", "/exec/ns/p/c", Some("stolen"));
    ws.headers.push((
        "Sec-WebSocket-Protocol".into(),
        "v4.channel.k8s.io, base64url.bearer.authorization.k8s.io.bWV0cmljcy10b2tlbg".into(),
    ));
    assert_eq!(
        auth.authenticate(None, &ws).unwrap().map(|u| u.name),
        Some("system:serviceaccount:mon:prom".to_string())
    );
    assert_eq!(fake.count("POST", TOKEN_REVIEWS), 2);

    // No credentials: nobody, and anonymous is off by default.
    assert_eq!(
        auth.authenticate(None, &request("GET", "/pods", None)),
        Ok(None)
    );
    assert_eq!(auth.anonymous(), None);
    assert_eq!(fake.count("POST", TOKEN_REVIEWS), 2);
}

#[test]
fn a_failed_token_review_refuses_the_request_and_is_not_cached() {
    let fake = FakeApiServer::start();
    let dir = tempfile::tempdir().unwrap();
    fake.add_token("t1", "alice", &[]);
    let auth = Auth::new(config(), Some(node_client(&fake, &dir)));
    let head = request("GET", "/pods", Some("t1"));

    fake.fail_next(
        "POST",
        "tokenreviews",
        500,
        "InternalError",
        "etcd is gone",
        1,
    );
    let e = auth.authenticate(None, &head).unwrap_err();
    assert!(matches!(e, AuthError::TokenReview(_)), "{e}");
    assert!(e.to_string().contains("etcd is gone"), "{e}");
    fake.fail_next("POST", "tokenreviews", 403, "Forbidden", "no", 1);
    assert!(matches!(
        auth.authenticate(None, &head),
        Err(AuthError::TokenReview(_))
    ));
    // The next request asks again and gets in.
    assert_eq!(
        auth.authenticate(None, &head),
        Ok(Some(user("alice", &["system:authenticated"])))
    );
    assert_eq!(fake.count("POST", TOKEN_REVIEWS), 3);

    // The apiserver unreachable: refused, never anonymous.
    let auth = Auth::new(
        AuthConfig {
            anonymous: true,
            ..config()
        },
        Some(node_client(&fake, &dir)),
    );
    fake.set_down(true);
    assert!(matches!(
        auth.authenticate(None, &head),
        Err(AuthError::TokenReview(_))
    ));
}

#[test]
fn requests_are_authorized_by_subject_access_review_and_cached() {
    let fake = FakeApiServer::start();
    let dir = tempfile::tempdir().unwrap();
    fake.allow_access("log-readers", "ops", "get", "nodes/log");
    fake.allow_access(
        "metrics-scrapers",
        "system:serviceaccount:mon:prom",
        "get",
        "nodes/metrics",
    );
    let auth = Auth::new(config(), Some(node_client(&fake, &dir)));
    let alice = user("alice", &["ops", "system:authenticated"]);

    let d = auth
        .authorize(&alice, &request("GET", "/logs/syslog", None))
        .unwrap();
    assert!(d.allowed);
    assert_eq!(
        (d.verb.as_str(), d.resource.as_str(), d.subresource.as_str()),
        ("get", "nodes", "log")
    );
    assert!(d.reason.contains("log-readers"), "{}", d.reason);
    let sent = review_bodies(&fake, ACCESS_REVIEWS);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0]["apiVersion"], "authorization.k8s.io/v1");
    assert_eq!(sent[0]["kind"], "SubjectAccessReview");
    assert_eq!(
        sent[0]["spec"],
        serde_json::json!({
            "resourceAttributes": {
                "verb": "get", "version": "v1", "resource": "nodes",
                "subresource": "log", "name": "edge-1",
            },
            "user": "alice",
            "groups": ["ops", "system:authenticated"],
        })
    );

    // exec is nodes/proxy with verb create: not granted.
    let exec = request("POST", "/exec/default/web/c?command=sh", None);
    let d = auth.authorize(&alice, &exec).unwrap();
    assert!(!d.allowed);
    assert_eq!(
        (d.verb.as_str(), d.subresource.as_str()),
        ("create", "proxy")
    );
    assert_eq!(fake.count("POST", ACCESS_REVIEWS), 2);

    // The same requests again: both answers come from the cache.
    assert!(
        auth.authorize(&alice, &request("GET", "/logs/", None))
            .unwrap()
            .allowed
    );
    assert!(!auth.authorize(&alice, &exec).unwrap().allowed);
    assert_eq!(fake.count("POST", ACCESS_REVIEWS), 2);

    // Another user is another question.
    let prom = user("system:serviceaccount:mon:prom", &["system:authenticated"]);
    assert!(
        auth.authorize(&prom, &request("GET", "/metrics/cadvisor", None))
            .unwrap()
            .allowed
    );
    assert!(
        !auth
            .authorize(&prom, &request("GET", "/stats/summary", None))
            .unwrap()
            .allowed
    );
    assert_eq!(fake.count("POST", ACCESS_REVIEWS), 4);

    // A failed review is an error, and the next request asks again.
    let bob = user("bob", &["ops"]);
    fake.fail_next(
        "POST",
        "subjectaccessreviews",
        500,
        "InternalError",
        "boom",
        1,
    );
    assert!(matches!(
        auth.authorize(&bob, &request("GET", "/logs/", None)),
        Err(AuthError::AccessReview(_))
    ));
    assert!(
        auth.authorize(&bob, &request("GET", "/logs/", None))
            .unwrap()
            .allowed
    );
    assert_eq!(fake.count("POST", ACCESS_REVIEWS), 6);
}

/// A bound service account token's `uid` and `extra` (its pod, its node)
/// go from the TokenReview into the SubjectAccessReview, as upstream's
/// authorizer sends them: an authorizer that scopes such tokens sees the
/// scope, and the same user with another scope is another question.
#[test]
fn the_access_review_carries_the_tokens_uid_and_extra() {
    let fake = FakeApiServer::start();
    let dir = tempfile::tempdir().unwrap();
    let pod_name = "authentication.kubernetes.io/pod-name";
    let node_name = "authentication.kubernetes.io/node-name";
    fake.add_scoped_token(
        "bound",
        "system:serviceaccount:mon:agent",
        &["system:serviceaccounts"],
        "5f0c-uid",
        &[(pod_name, &["agent-x"]), (node_name, &["edge-1"])],
    );
    fake.add_scoped_token(
        "bound-2",
        "system:serviceaccount:mon:agent",
        &["system:serviceaccounts"],
        "77aa-uid",
        &[(pod_name, &["agent-y"])],
    );
    fake.allow_access("agents", "system:serviceaccounts", "get", "nodes/metrics");
    let auth = Auth::new(config(), Some(node_client(&fake, &dir)));

    let head = request("GET", "/metrics", Some("bound"));
    let agent = auth.authenticate(None, &head).unwrap().unwrap();
    assert_eq!(agent.uid, "5f0c-uid");
    assert_eq!(agent.extra[pod_name], ["agent-x"]);
    assert!(auth.authorize(&agent, &head).unwrap().allowed);
    let sent = review_bodies(&fake, ACCESS_REVIEWS);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0]["spec"]["uid"], "5f0c-uid");
    assert_eq!(
        sent[0]["spec"]["extra"],
        serde_json::json!({pod_name: ["agent-x"], node_name: ["edge-1"]})
    );
    assert_eq!(sent[0]["spec"]["user"], "system:serviceaccount:mon:agent");

    // The same user by another token: asked again, with its own scope.
    let head2 = request("GET", "/metrics", Some("bound-2"));
    let other = auth.authenticate(None, &head2).unwrap().unwrap();
    assert!(auth.authorize(&other, &head2).unwrap().allowed);
    let sent = review_bodies(&fake, ACCESS_REVIEWS);
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[1]["spec"]["uid"], "77aa-uid");
    assert_eq!(
        sent[1]["spec"]["extra"],
        serde_json::json!({pod_name: ["agent-y"]})
    );

    // A certificate's user has neither: the fields are left out.
    let plain = user("alice", &["system:authenticated"]);
    assert!(!auth.authorize(&plain, &head).unwrap().allowed);
    let sent = review_bodies(&fake, ACCESS_REVIEWS);
    let spec = sent[2]["spec"].as_object().unwrap();
    assert!(
        !spec.contains_key("uid") && !spec.contains_key("extra"),
        "{spec:?}"
    );
}

#[test]
fn cached_answers_expire_after_their_ttl() {
    // TTLs far shorter than the pause between requests (the unit tests
    // check the deadlines themselves with given instants), so nothing here
    // depends on how fast the machine is.
    let fake = FakeApiServer::start();
    let dir = tempfile::tempdir().unwrap();
    fake.add_token("t", "alice", &[]);
    let auth = Auth::new(
        AuthConfig {
            token_cache_ttl: Duration::from_millis(1),
            authorized_ttl: Duration::from_millis(1),
            // Refused answers are not kept at all.
            unauthorized_ttl: Duration::ZERO,
            ..config()
        },
        Some(node_client(&fake, &dir)),
    );
    fake.allow_access("b", "alice", "*", "nodes/*");
    let alice = user("alice", &["system:authenticated"]);
    let head = request("GET", "/pods", Some("t"));
    let bob = user("bob", &[]);
    for round in 1..=2 {
        assert!(auth.authenticate(None, &head).unwrap().is_some());
        assert!(auth.authorize(&alice, &head).unwrap().allowed);
        assert!(!auth.authorize(&bob, &head).unwrap().allowed);
        assert_eq!(fake.count("POST", TOKEN_REVIEWS), round);
        assert_eq!(fake.count("POST", ACCESS_REVIEWS), 2 * round);
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// DER of the first certificate in a PEM text.
fn pem_to_der(pem: &str) -> Vec<u8> {
    let b64: String = pem
        .lines()
        .skip_while(|l| !l.starts_with("-----BEGIN CERTIFICATE"))
        .skip(1)
        .take_while(|l| !l.starts_with("-----END"))
        .collect();
    base64::engine::general_purpose::STANDARD
        .decode(b64)
        .unwrap()
}

#[test]
fn client_certificates_name_the_user_before_any_token() {
    let fake = FakeApiServer::start_tls();
    let dir = tempfile::tempdir().unwrap();
    let auth = Auth::new(config(), Some(node_client(&fake, &dir)));
    let (cert, _key) = fake.client_cert("kube-apiserver-kubelet-client", &["system:masters"]);
    let der = pem_to_der(&cert);

    let head = request("GET", "/containerLogs/ns/p/c", Some("whatever"));
    assert_eq!(
        auth.authenticate(Some(&der), &head),
        Ok(Some(user(
            "kube-apiserver-kubelet-client",
            &["system:masters", "system:authenticated"]
        )))
    );
    // The certificate decided: no TokenReview was made.
    assert_eq!(fake.count("POST", TOKEN_REVIEWS), 0);

    // A cut certificate without a token: refused with the reason.
    let e = auth
        .authenticate(Some(&der[..40]), &request("GET", "/pods", None))
        .unwrap_err();
    assert!(matches!(e, AuthError::Certificate(_)), "{e}");
}

/// `GET path` on the node's main port (TLS, any serving certificate), with
/// `token` as a bearer token: the status code and the body.
fn main_port_get(port: u16, path: &str, token: Option<&str>) -> (u16, String) {
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(tls_config(None), name).unwrap();
    let tcp = TcpStream::connect(("127.0.0.1", port)).expect("connect to the main port");
    tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let req = format!("GET {path} HTTP/1.1\r\nHost: node\r\n{auth}Connection: close\r\n\r\n");
    tls.write_all(req.as_bytes()).expect("send");
    let mut out = Vec::new();
    match tls.read_to_end(&mut out) {
        Ok(_) => {}
        // The server closes without close_notify after the answer.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !out.is_empty() => {}
        Err(e) => panic!("GET {path}: {e}"),
    }
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (status, body)
}

/// The real binary joined to the fake with `--authentication-token-webhook`
/// and anonymous requests allowed: while the apiserver's TokenReviews
/// fail (a 500, then an answer carrying the authenticator's error), a
/// request with a bearer token is 401 (neither let in nor taken as
/// anonymous, whom the rules let in) and every such request asks again;
/// once reviews work, the same token gets in, and from then on from the
/// cache.
#[test]
fn the_main_port_refuses_a_token_while_token_reviews_fail() {
    let port = free_port();
    let port_s = port.to_string();
    let mut c = Cluster::start(&[
        "--authentication-token-webhook=true",
        "--anonymous-auth=true",
        "--port",
        &port_s,
        "--address",
        "127.0.0.1",
    ]);
    c.api.add_token("reader-token", "reader", &["readers"]);
    c.api
        .allow_access("readers", "readers", "get", "nodes/proxy");
    c.api.allow_access(
        "anonymous-readers",
        "system:unauthenticated",
        "get",
        "nodes/proxy",
    );
    c.api
        .fail_token_reviews(Some(TokenReviewFailure::InternalError));
    c.agent.wait("the main port listens", || {
        TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    // Anonymous requests get in: a refused token is not one of them.
    c.agent.wait("an anonymous /pods is served", || {
        main_port_get(port, "/pods", None).0 == 200
    });
    let reviews = |c: &Cluster| c.api.count("POST", TOKEN_REVIEWS);
    assert_eq!(reviews(&c), 0);

    for round in 1..=2 {
        assert_eq!(
            main_port_get(port, "/pods", Some("reader-token")),
            (401, "Unauthorized".to_string()),
            "round {round}"
        );
        assert_eq!(reviews(&c), round, "a failed review is asked again");
    }
    let answered: Vec<u16> = c
        .api
        .requests()
        .iter()
        .filter(|r| r.path == TOKEN_REVIEWS)
        .map(|r| r.status)
        .collect();
    assert_eq!(answered, [500, 500]);

    c.api
        .fail_token_reviews(Some(TokenReviewFailure::AuthenticatorError));
    assert_eq!(
        main_port_get(port, "/pods", Some("reader-token")),
        (401, "Unauthorized".to_string())
    );
    assert_eq!(reviews(&c), 3);
    assert_eq!(c.api.requests().last().map(|r| r.status), Some(201));

    c.api.fail_token_reviews(None);
    for _ in 0..2 {
        let (status, body) = main_port_get(port, "/pods", Some("reader-token"));
        assert_eq!(status, 200, "{body}");
        let list: Value = serde_json::from_str(&body).expect("a PodList");
        assert_eq!(list["kind"], "PodList");
    }
    assert_eq!(reviews(&c), 4, "the answer that let it in is cached");
    let log = c.agent.log();
    assert!(
        log.contains("node API: authenticating GET /pods"),
        "the refusals are logged:\n{log}"
    );
}

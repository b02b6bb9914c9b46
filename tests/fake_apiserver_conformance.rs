//! Tests of the fake kube-apiserver (`support::fake_apiserver`) against the
//! real v1.20 traffic recorded in `shared/fixtures/apiserver`: the recorded
//! requests are replayed in order against the fake (after building the same
//! starting objects), and status codes, Status bodies (byte for byte, with
//! UIDs mapped), header names and object shapes are compared; volatile values
//! (UIDs, timestamps, RVs) are compared by format. Then each fault, TLS with
//! client certificates, and the kubeconfigs the fake writes.

use std::collections::BTreeSet;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::fake_apiserver::{
    Credential, FakeApiServer, KubeconfigAuth, ServerTrust, TokenReviewFailure,
};

const NODE_TOKEN: &str = "node-edge-1-token";
const ADMIN_TOKEN: &str = "admin-token";
const BAD_TOKEN: &str = "not-a-valid-token.fixture";

// ---------------------------------------------------------------------------
// Fixtures

fn fixtures_dir() -> PathBuf {
    let rel = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/fixtures/apiserver");
    if rel.is_dir() {
        rel
    } else {
        PathBuf::from("/work/shared/fixtures/apiserver")
    }
}

struct Fixture {
    name: String,
    method: String,
    target: String,
    req_headers: Vec<(String, String)>,
    req_body: String,
    code: u16,
    resp_headers: Vec<(String, String)>,
    resp_body: String,
}

impl Fixture {
    fn load(name: &str) -> Fixture {
        let dir = fixtures_dir();
        let read = |suffix: &str| {
            let p = dir.join(format!("{name}.{suffix}.txt"));
            std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        };
        let req = read("request");
        let req: String = req
            .split_inclusive('\n')
            .filter(|l| !l.starts_with("# "))
            .collect();
        let (head, req_body) = req.split_once("\r\n\r\n").expect("request head");
        let mut lines = head.split("\r\n");
        let mut first = lines.next().unwrap().split(' ');
        let method = first.next().unwrap().to_string();
        let target = first.next().unwrap().to_string();
        let req_headers = header_list(lines);
        let resp = read("response");
        let (head, resp_body) = resp.split_once("\r\n\r\n").expect("response head");
        let mut lines = head.split("\r\n");
        let code = lines
            .next()
            .unwrap()
            .split(' ')
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        Fixture {
            name: name.to_string(),
            method,
            target,
            req_headers,
            req_body: req_body.to_string(),
            code,
            resp_headers: header_list(lines),
            resp_body: resp_body.to_string(),
        }
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.resp_body).unwrap_or_else(|e| panic!("{}: {e}", self.name))
    }
}

fn header_list<'a>(lines: impl Iterator<Item = &'a str>) -> Vec<(String, String)> {
    lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect()
}

// ---------------------------------------------------------------------------
// A tiny HTTP/1.1 client

trait Stream: Read + Write + Send {}
impl<T: Read + Write + Send> Stream for T {}

struct Client {
    r: BufReader<Box<dyn Stream>>,
    token: Option<String>,
}

#[derive(Debug)]
struct Resp {
    code: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Resp {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&self.body)))
    }
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

impl Client {
    fn new(fake: &FakeApiServer, token: Option<&str>) -> Client {
        let tcp = TcpStream::connect(fake.addr()).expect("connect to the fake");
        tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        Client {
            r: BufReader::new(Box::new(tcp)),
            token: token.map(str::to_string),
        }
    }

    fn node(fake: &FakeApiServer) -> Client {
        Client::new(fake, Some(NODE_TOKEN))
    }

    fn admin(fake: &FakeApiServer) -> Client {
        Client::new(fake, Some(ADMIN_TOKEN))
    }

    fn write_request(
        &mut self,
        method: &str,
        target: &str,
        headers: &[(String, String)],
        body: &[u8],
    ) -> io::Result<()> {
        let mut head = format!("{method} {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n");
        if let Some(t) = &self.token {
            head += &format!("Authorization: Bearer {t}\r\n");
        }
        for (k, v) in headers {
            if k != "host" && k != "content-length" {
                head += &format!("{k}: {v}\r\n");
            }
        }
        if !body.is_empty() || matches!(method, "POST" | "PUT" | "PATCH") {
            head += &format!("Content-Length: {}\r\n", body.len());
        }
        head += "\r\n";
        let w = self.r.get_mut();
        w.write_all(head.as_bytes())?;
        w.write_all(body)?;
        w.flush()
    }

    fn read_head(&mut self) -> io::Result<(u16, Vec<(String, String)>)> {
        let mut line = String::new();
        if self.r.read_line(&mut line)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed",
            ));
        }
        let code = line
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, line.clone()))?;
        let mut headers = Vec::new();
        loop {
            let mut l = String::new();
            self.r.read_line(&mut l)?;
            let l = l.trim_end();
            if l.is_empty() {
                break;
            }
            let (k, v) = l.split_once(':').unwrap();
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
        Ok((code, headers))
    }

    /// One chunk's data; None for the terminating chunk.
    fn read_chunk(&mut self) -> io::Result<Option<Vec<u8>>> {
        let mut size = String::new();
        if self.r.read_line(&mut size)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "stream cut without terminating chunk",
            ));
        }
        let n = usize::from_str_radix(size.trim(), 16)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, size.clone()))?;
        if n == 0 {
            let mut crlf = String::new();
            self.r.read_line(&mut crlf)?;
            return Ok(None);
        }
        let mut data = vec![0; n + 2];
        self.r.read_exact(&mut data)?;
        data.truncate(n);
        Ok(Some(data))
    }

    fn try_send(
        &mut self,
        method: &str,
        target: &str,
        headers: &[(String, String)],
        body: &[u8],
    ) -> io::Result<Resp> {
        self.write_request(method, target, headers, body)?;
        let (code, headers) = self.read_head()?;
        let mut body = Vec::new();
        let chunked = headers
            .iter()
            .any(|(k, v)| k == "transfer-encoding" && v == "chunked");
        if chunked {
            while let Some(c) = self.read_chunk()? {
                body.extend(c);
            }
        } else if let Some((_, len)) = headers.iter().find(|(k, _)| k == "content-length") {
            body = vec![0; len.parse().unwrap()];
            self.r.read_exact(&mut body)?;
        }
        Ok(Resp {
            code,
            headers,
            body,
        })
    }

    fn send(
        &mut self,
        method: &str,
        target: &str,
        content_type: Option<&str>,
        body: &[u8],
    ) -> Resp {
        let headers: Vec<(String, String)> = content_type
            .map(|c| vec![("content-type".to_string(), c.to_string())])
            .unwrap_or_default();
        self.try_send(method, target, &headers, body)
            .unwrap_or_else(|e| panic!("{method} {target}: {e}"))
    }

    fn get(&mut self, target: &str) -> Resp {
        self.send("GET", target, None, b"")
    }

    fn patch(&mut self, target: &str, kind: &str, body: &Value) -> Resp {
        self.send("PATCH", target, Some(kind), body.to_string().as_bytes())
    }

    fn delete(&mut self, target: &str, body: &Value) -> Resp {
        self.send(
            "DELETE",
            target,
            Some("application/json"),
            body.to_string().as_bytes(),
        )
    }

    /// Starts a watch; the head is returned and events are read with `next_event`.
    fn watch(mut self, target: &str) -> Watch {
        self.write_request("GET", target, &[], b"").unwrap();
        let (code, headers) = self.read_head().unwrap();
        Watch {
            c: self,
            code,
            headers,
            buf: Vec::new(),
        }
    }

    /// Replays a fixture's request, with real UIDs replaced by the fake's.
    fn replay(&mut self, fx: &Fixture, uids: &Uids) -> Resp {
        let target = uids.to_fake(&fx.target);
        let body = uids.to_fake(&fx.req_body);
        self.try_send(&fx.method, &target, &fx.req_headers, body.as_bytes())
            .unwrap_or_else(|e| panic!("{}: {e}", fx.name))
    }
}

struct Watch {
    c: Client,
    code: u16,
    headers: Vec<(String, String)>,
    buf: Vec<u8>,
}

impl Watch {
    /// The next event; Ok(None) when the stream ended cleanly.
    fn next_event(&mut self) -> io::Result<Option<Value>> {
        loop {
            if let Some(i) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=i).collect();
                return Ok(Some(
                    serde_json::from_slice(&line).expect("watch event is JSON"),
                ));
            }
            match self.c.read_chunk()? {
                Some(data) => self.buf.extend(data),
                None => {
                    assert!(
                        self.buf.is_empty(),
                        "partial event at the end of the stream"
                    );
                    return Ok(None);
                }
            }
        }
    }

    /// Every event until the stream ends cleanly.
    fn all(&mut self) -> Vec<Value> {
        let mut out = Vec::new();
        while let Some(e) = self.next_event().expect("watch stream ends cleanly") {
            out.push(e);
        }
        out
    }
}

fn types(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| e["type"].as_str().unwrap().to_string())
        .collect()
}

// ---------------------------------------------------------------------------
// Comparison helpers

/// Real UID -> the fake's UID for the same object.
#[derive(Default)]
struct Uids(Vec<(String, String)>);

impl Uids {
    fn add(&mut self, real: &Value, fake: &Value) {
        let r = real["metadata"]["uid"].as_str().unwrap().to_string();
        let f = fake["metadata"]["uid"].as_str().unwrap().to_string();
        self.0.push((r, f));
    }
    /// A name the fake chose differently (a generated suffix).
    fn add_name(&mut self, real: &str, fake: &str) {
        self.0.push((real.to_string(), fake.to_string()));
    }
    fn to_fake(&self, s: &str) -> String {
        self.0
            .iter()
            .fold(s.to_string(), |s, (r, f)| s.replace(r, f))
    }
    fn to_real(&self, s: &str) -> String {
        self.0
            .iter()
            .fold(s.to_string(), |s, (r, f)| s.replace(f, r))
    }
}

fn is_uid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, c)| {
            if [8, 13, 18, 23].contains(&i) {
                *c == b'-'
            } else {
                c.is_ascii_hexdigit() && !c.is_ascii_uppercase()
            }
        })
}

fn is_time_secs(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 20
        && b[4] == b'-'
        && b[7] == b'-'
        && b[10] == b'T'
        && b[13] == b':'
        && b[16] == b':'
        && b[19] == b'Z'
        && s.parse::<k8s_openapi::jiff::Timestamp>().is_ok()
}

fn rv(v: &Value) -> u64 {
    v["metadata"]["resourceVersion"]
        .as_str()
        .expect("resourceVersion is a string")
        .parse()
        .expect("resourceVersion is decimal")
}

/// Every key path of a JSON value (list elements merged), without managedFields' fieldsV1.
fn shape(v: &Value) -> BTreeSet<String> {
    fn walk(v: &Value, prefix: &str, out: &mut BTreeSet<String>) {
        match v {
            Value::Object(m) => {
                for (k, x) in m {
                    let p = format!("{prefix}.{k}");
                    out.insert(p.clone());
                    if k != "fieldsV1" {
                        walk(x, &p, out);
                    }
                }
            }
            Value::Array(a) => {
                for x in a {
                    walk(x, &format!("{prefix}[]"), out);
                }
            }
            _ => {}
        }
    }
    let mut out = BTreeSet::new();
    walk(v, "", &mut out);
    out
}

fn assert_same_shape(name: &str, real: &Value, fake: &Value) {
    let (r, f) = (shape(real), shape(fake));
    let missing: Vec<_> = r.difference(&f).collect();
    let extra: Vec<_> = f.difference(&r).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "{name}: shape differs\nmissing: {missing:?}\nextra: {extra:?}\nfake: {fake}"
    );
}

fn header_names(h: &[(String, String)], with_length: bool) -> Vec<String> {
    h.iter()
        .map(|(k, _)| k.clone())
        .filter(|k| with_length || (k != "content-length" && k != "transfer-encoding"))
        .collect()
}

/// Replaces UUIDs by a placeholder.
fn no_uids(s: &str) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < s.len() {
        if s.len() - i >= 36 && s.is_char_boundary(i + 36) && is_uid(&s[i..i + 36]) {
            out += "<uid>";
            i += 36;
        } else {
            let c = s[i..].chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// A Status answer: the code, the header names in order, and the exact body
/// bytes (UIDs of known objects mapped back, unknown ones masked).
fn check_status(fx: &Fixture, resp: &Resp, uids: &Uids) {
    assert_eq!(
        resp.code,
        fx.code,
        "{}: status code; body {}",
        fx.name,
        resp.text()
    );
    assert_eq!(
        no_uids(&uids.to_real(&resp.text())),
        no_uids(&fx.resp_body),
        "{}: Status body",
        fx.name
    );
    assert_eq!(
        header_names(&resp.headers, true),
        header_names(&fx.resp_headers, true),
        "{}: header names",
        fx.name
    );
}

/// An object answer: the code, the header names, the object's shape, and the
/// formats of uid, creationTimestamp and resourceVersion.
fn check_object(fx: &Fixture, resp: &Resp) -> Value {
    assert_eq!(
        resp.code,
        fx.code,
        "{}: status code; body {}",
        fx.name,
        resp.text()
    );
    assert!(
        resp.body.ends_with(b"}\n"),
        "{}: JSON bodies end with a newline",
        fx.name
    );
    assert_eq!(
        header_names(&resp.headers, false),
        header_names(&fx.resp_headers, false),
        "{}: header names",
        fx.name
    );
    let chunked = resp.header("transfer-encoding") == Some("chunked");
    assert_eq!(
        chunked,
        resp.body.len() > 2048,
        "{}: chunked only above 2048 bytes",
        fx.name
    );
    let v = resp.json();
    assert_same_shape(&fx.name, &fx.json(), &v);
    check_meta_formats(&fx.name, &v);
    v
}

fn check_meta_formats(name: &str, v: &Value) {
    let m = &v["metadata"];
    assert!(
        is_uid(m["uid"].as_str().unwrap_or("")),
        "{name}: uid format {}",
        m["uid"]
    );
    assert!(
        is_time_secs(m["creationTimestamp"].as_str().unwrap_or("")),
        "{name}: creationTimestamp format {}",
        m["creationTimestamp"]
    );
    rv(v);
    assert!(m.get("selfLink").is_none(), "{name}: no selfLink");
    let mf = m["managedFields"]
        .as_array()
        .expect("managedFields on every object");
    for e in mf {
        for k in [
            "manager",
            "operation",
            "apiVersion",
            "time",
            "fieldsType",
            "fieldsV1",
        ] {
            assert!(
                e.get(k).is_some(),
                "{name}: managedFields entry without {k}: {e}"
            );
        }
    }
}

// ---------------------------------------------------------------------------
// Scenario setup

fn fake() -> FakeApiServer {
    let f = FakeApiServer::start();
    f.add_token(NODE_TOKEN, "system:node:edge-1", &["system:nodes"]);
    f.add_token(ADMIN_TOKEN, "admin", &["system:masters"]);
    f
}

/// Nodes edge-1 (as the node registers it, 01a) and edge-2 (admin, 04a).
fn with_nodes(f: &FakeApiServer, uids: &mut Uids) {
    for (name, admin) in [
        ("01a-node-create-201", false),
        ("04a-admin-node-edge-2-create", true),
    ] {
        let fx = Fixture::load(name);
        let mut c = if admin {
            Client::admin(f)
        } else {
            Client::node(f)
        };
        let resp = c.replay(&fx, uids);
        let v = check_object(&fx, &resp);
        uids.add(&fx.json(), &v);
    }
}

/// Pods app-1, app-2 (edge-1) and other-1 (edge-2), created by the admin.
fn with_pods(f: &FakeApiServer, uids: &mut Uids) {
    for name in [
        "04e-admin-pod-create-app-1",
        "04f-admin-pod-create-app-2",
        "04g-admin-pod-create-other-1",
    ] {
        let fx = Fixture::load(name);
        let resp = Client::admin(f).replay(&fx, uids);
        let v = check_object(&fx, &resp);
        uids.add(&fx.json(), &v);
    }
}

// ---------------------------------------------------------------------------
// Replays

#[test]
fn node_registration_and_node_restriction_match_the_fixtures() {
    let f = fake();
    let mut uids = Uids::default();
    with_nodes(&f, &mut uids);
    let mut node = Client::node(&f);

    let created = f.node("edge-1").unwrap();
    assert_eq!(
        created["spec"]["taints"],
        json!([{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]),
        "the not-ready taint is added on create"
    );
    assert_eq!(
        created["status"]["conditions"][3]["reason"], "KubeletNotReady",
        "status is kept on create"
    );

    let fx = Fixture::load("01b-node-create-again-409");
    check_status(&fx, &node.replay(&fx, &uids), &uids);

    for name in ["01c-node-get", "01d-node-get-rv0"] {
        let fx = Fixture::load(name);
        let v = check_object(&fx, &node.replay(&fx, &uids));
        assert_eq!(v["kind"], "Node");
        assert_eq!(rv(&v), rv(&created));
    }

    let fx = Fixture::load("01e-node-list-fieldselector-rv0");
    let resp = node.replay(&fx, &uids);
    assert_eq!(resp.code, 200);
    let list = resp.json();
    assert_same_shape(&fx.name, &fx.json(), &list);
    assert_eq!(list["kind"], "NodeList");
    assert!(
        list["items"][0].get("kind").is_none(),
        "list items carry no kind"
    );
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    assert_eq!(
        list["metadata"]["resourceVersion"],
        json!(f.resource_version().to_string())
    );

    let fx = Fixture::load("02a-node-status-patch-smp-ready");
    let before = f.resource_version();
    let v = check_object(&fx, &node.replay(&fx, &uids));
    assert_eq!(rv(&v), before + 1, "a write advances the global RV by one");
    let conditions: Vec<_> = v["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["type"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        conditions,
        ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"]
    );
    assert_eq!(v["status"]["conditions"][3]["reason"], "KubeletReady");
    assert_eq!(
        v["status"]["conditions"][0]["reason"], "KubeletHasSufficientMemory",
        "conditions are merged by type, untouched fields stay"
    );
    assert_eq!(v["status"]["conditions"], fx.json()["status"]["conditions"]);

    for name in [
        "02b-node-status-patch-other-node-403",
        "02c-node-patch-taints-403",
        "02d-node-patch-restricted-label-403",
    ] {
        let fx = Fixture::load(name);
        check_status(&fx, &node.replay(&fx, &uids), &uids);
    }
    assert_eq!(
        f.node("edge-1").unwrap()["spec"]["taints"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

#[test]
fn node_lease_matches_the_fixtures() {
    let f = fake();
    let mut uids = Uids::default();
    with_nodes(&f, &mut uids);
    let mut node = Client::node(&f);

    let fx = Fixture::load("03a-lease-get-404");
    check_status(&fx, &node.replay(&fx, &uids), &uids);

    let fx = Fixture::load("03b-lease-create-201");
    let created = check_object(&fx, &node.replay(&fx, &uids));
    assert_eq!(
        created["spec"]["renewTime"], "2026-11-22T00:45:16.681566Z",
        "MicroTime kept as sent"
    );
    uids.add(&fx.json(), &created);
    let real_rv = rv(&fx.json()).to_string();

    // 03c/03d send the RV the real server gave (393): use the fake's.
    let fx = Fixture::load("03c-lease-put-200");
    let mut body: Value = serde_json::from_str(&uids.to_fake(&fx.req_body)).unwrap();
    body["metadata"]["resourceVersion"] = created["metadata"]["resourceVersion"].clone();
    let put = node.send(
        "PUT",
        &fx.target,
        Some("application/json"),
        body.to_string().as_bytes(),
    );
    let updated = check_object(&fx, &put);
    assert_eq!(rv(&updated), rv(&created) + 1);
    assert_eq!(updated["spec"]["renewTime"], "2026-11-22T00:45:19.793457Z");
    assert_eq!(updated["metadata"]["uid"], created["metadata"]["uid"]);
    assert_eq!(real_rv, "393");

    let fx = Fixture::load("03d-lease-put-stale-rv-409");
    let put = node.send(
        "PUT",
        &fx.target,
        Some("application/json"),
        body.to_string().as_bytes(),
    );
    check_status(&fx, &put, &uids);

    let fx = Fixture::load("03e-lease-get-200");
    let got = check_object(&fx, &node.replay(&fx, &uids));
    assert_eq!(got, updated);
    assert_eq!(f.lease("edge-1").unwrap(), updated);

    let fx = Fixture::load("03f-lease-create-wrong-namespace-403");
    let resp = node.replay(&fx, &uids);
    check_status(&fx, &resp, &uids);
    assert_eq!(resp.header("x-content-type-options"), Some("nosniff"));
}

/// No lease PATCH was recorded; these follow the v1.20 source: the Node
/// authorizer's `authorizeLease` (patch allowed on the node's own lease in
/// kube-node-lease only), the patch handler (a merge patch applied to the
/// stored object, conditional on its version unless the patch names one,
/// 415 for other types), the Lease strategy (`ValidateLeaseSpec`; no
/// unconditional PUT) and the store (a patch that changes nothing writes
/// nothing).
#[test]
fn node_lease_merge_patches_follow_the_real_api() {
    const MERGE: &str = "application/merge-patch+json";
    const LEASE: &str = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/edge-1";
    let f = fake();
    let mut uids = Uids::default();
    with_nodes(&f, &mut uids);
    let mut node = Client::node(&f);
    let fx = Fixture::load("03b-lease-create-201");
    let created = check_object(&fx, &node.replay(&fx, &uids));

    // renewTime alone: the version moves, nothing else changes.
    let renew = json!({"spec": {"renewTime": "2026-11-22T00:45:26.000001Z"}});
    let resp = node.patch(LEASE, MERGE, &renew);
    assert_eq!(resp.code, 200, "{}", resp.text());
    let patched = resp.json();
    assert_eq!(rv(&patched), rv(&created) + 1);
    assert_eq!(patched["spec"]["renewTime"], "2026-11-22T00:45:26.000001Z");
    for field in [
        &["metadata", "uid"][..],
        &["metadata", "ownerReferences"],
        &["metadata", "creationTimestamp"],
        &["spec", "holderIdentity"],
        &["spec", "leaseDurationSeconds"],
    ] {
        let at = |v: &Value| field.iter().fold(v.clone(), |v, k| v[k].clone());
        assert_eq!(at(&patched), at(&created), "{field:?}");
    }
    assert_eq!(f.lease("edge-1").unwrap(), patched);

    // The same patch again changes nothing and writes nothing.
    let resp = node.patch(LEASE, MERGE, &renew);
    assert_eq!(resp.code, 200);
    assert_eq!(rv(&resp.json()), rv(&patched));

    // A version in the patch is a precondition.
    let stale = json!({"metadata": {"resourceVersion": created["metadata"]["resourceVersion"]},
                       "spec": {"renewTime": "2026-11-22T00:45:36.000001Z"}});
    let resp = node.patch(LEASE, MERGE, &stale);
    assert_eq!(resp.code, 409);
    assert_eq!(resp.json()["reason"], "Conflict");

    // Validation of the result.
    let resp = node.patch(LEASE, MERGE, &json!({"spec": {"leaseDurationSeconds": 0}}));
    assert_eq!(resp.code, 422, "{}", resp.text());
    assert_eq!(
        resp.json()["message"],
        "Lease.coordination.k8s.io \"edge-1\" is invalid: spec.leaseDurationSeconds: Invalid value: 0: must be greater than 0"
    );
    assert_eq!(
        resp.json()["details"],
        json!({"name": "edge-1", "group": "coordination.k8s.io", "kind": "Lease",
               "causes": [{"reason": "FieldValueInvalid",
                           "message": "Invalid value: 0: must be greater than 0",
                           "field": "spec.leaseDurationSeconds"}]})
    );

    // A PUT must carry the version (the strategy allows no unconditional
    // update); a patch need not.
    let mut put = patched.clone();
    put["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("resourceVersion");
    let resp = node.send(
        "PUT",
        LEASE,
        Some("application/json"),
        put.to_string().as_bytes(),
    );
    assert_eq!(resp.code, 422, "{}", resp.text());
    assert_eq!(
        resp.json()["message"],
        "leases.coordination.k8s.io \"edge-1\" is invalid: metadata.resourceVersion: Invalid value: 0x0: must be specified for an update"
    );
    assert_eq!(resp.json()["details"]["kind"], "leases");

    // Not a patch type: go-restful's refusal, as a v1.20.2 server sent it.
    let resp = node.patch(LEASE, "application/json", &renew);
    assert_eq!(resp.code, 415);
    assert_eq!(
        resp.text(),
        "{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{},\"status\":\"Failure\",\"message\":\"415: Unsupported Media Type\",\"reason\":\"UnsupportedMediaType\",\"details\":{},\"code\":415}\n"
    );

    // Another node's lease: the Node authorizer refuses, as for a GET.
    let resp = node.patch(
        "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/edge-2",
        MERGE,
        &renew,
    );
    assert_eq!(resp.code, 403);
    assert_eq!(
        resp.json()["message"],
        "leases.coordination.k8s.io \"edge-2\" is forbidden: User \"system:node:edge-1\" cannot patch resource \"leases\" in API group \"coordination.k8s.io\" in the namespace \"kube-node-lease\": can only access node lease with the same name as the requesting node"
    );
    assert_eq!(
        resp.json()["details"],
        json!({"name": "edge-2", "group": "coordination.k8s.io", "kind": "leases"})
    );
    assert_eq!(resp.header("x-content-type-options"), Some("nosniff"));
    // And a lease outside kube-node-lease.
    let resp = node.patch(
        "/apis/coordination.k8s.io/v1/namespaces/default/leases/edge-1",
        MERGE,
        &renew,
    );
    assert_eq!(resp.code, 403);
    assert_eq!(
        resp.json()["message"],
        "leases.coordination.k8s.io \"edge-1\" is forbidden: User \"system:node:edge-1\" cannot patch resource \"leases\" in API group \"coordination.k8s.io\" in the namespace \"default\": can only access leases in the \"kube-node-lease\" system namespace"
    );
    assert_eq!(
        f.lease("edge-1").unwrap(),
        patched,
        "nothing refused was written"
    );

    // A patch of a lease that is gone is 404, as the GET of 03a.
    let resp = node.delete(LEASE, &json!({}));
    assert_eq!(resp.code, 200, "{}", resp.text());
    let resp = node.patch(LEASE, MERGE, &renew);
    assert_eq!(resp.code, 404);
    assert_eq!(
        resp.json(),
        Fixture::load("03a-lease-get-404").json(),
        "the recorded NotFound"
    );
}

/// The layout of a protobuf message as (field number, wire type) pairs,
/// descending into the length-delimited fields `nested` names by path
/// (field numbers from the top): values aside, two answers of the same
/// kind have the same layout.
fn protobuf_layout(bytes: &[u8], nested: &[&[u32]]) -> Vec<String> {
    fn walk(bytes: &[u8], at: &[u32], nested: &[&[u32]], out: &mut Vec<String>) {
        let mut s = protobuf::CodedInputStream::from_bytes(bytes);
        while let Some(tag) = s.read_raw_tag_or_eof().unwrap() {
            let (n, w) = (tag >> 3, tag & 7);
            let mut path = at.to_vec();
            path.push(n);
            out.push(format!("{path:?}/{w}"));
            if w == 2 {
                let inner = s.read_bytes().unwrap();
                if nested.contains(&path.as_slice()) {
                    walk(&inner, &path, nested, out);
                }
            } else {
                protobuf::rt::skip_field_for_tag(tag, &mut s).unwrap();
            }
        }
    }
    let mut out = Vec::new();
    walk(
        bytes.strip_prefix(b"k8s\0").expect("a k8s envelope"),
        &[],
        nested,
        &mut out,
    );
    out
}

/// Recorded from the real v1.20.2 server (tests/fixtures/protobuf): a node
/// that asks for protobuf first gets its lease patch's answer in protobuf,
/// the Lease laid out field for field as the real one, and its refusals
/// as protobuf Statuses, byte for byte.
#[test]
fn lease_patches_answer_in_protobuf_as_the_real_api() {
    const ACCEPT: &str = "application/vnd.kubernetes.protobuf, application/json";
    const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases";
    let recorded = |name: &str| {
        std::fs::read(format!(
            "{}/tests/fixtures/protobuf/{name}.pb",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap()
    };
    let f = fake();
    let mut uids = Uids::default();
    with_nodes(&f, &mut uids);
    let mut node = Client::node(&f);
    let patch = |node: &mut Client, name: &str, accept: &str| {
        let headers = [
            (
                "content-type".to_string(),
                "application/merge-patch+json".to_string(),
            ),
            ("accept".to_string(), accept.to_string()),
        ];
        let body = json!({"spec": {"renewTime": "2026-12-02T07:00:10.123456Z"}}).to_string();
        node.try_send(
            "PATCH",
            &format!("{LEASES}/{name}"),
            &headers,
            body.as_bytes(),
        )
        .unwrap()
    };
    let content_type = |r: &Resp| {
        r.headers
            .iter()
            .find(|(k, _)| k == "content-type")
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };

    let missing = patch(&mut node, "edge-1", ACCEPT);
    assert_eq!(missing.code, 404);
    assert_eq!(
        content_type(&missing),
        "application/vnd.kubernetes.protobuf"
    );
    assert_eq!(
        missing.body,
        recorded("lease-patch-404"),
        "the recorded NotFound"
    );
    let other = patch(&mut node, "edge-2", ACCEPT);
    assert_eq!(other.code, 403);
    assert_eq!(
        other.body,
        recorded("lease-patch-403"),
        "the recorded Forbidden"
    );

    let created = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "edge-1", "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": "edge-1", "leaseDurationSeconds": 40,
                 "renewTime": "2026-12-02T07:00:00.000001Z"}});
    let resp = node.send(
        "POST",
        LEASES,
        Some("application/json"),
        created.to_string().as_bytes(),
    );
    assert_eq!(resp.code, 201, "{}", resp.text());
    let renewed = patch(&mut node, "edge-1", ACCEPT);
    assert_eq!(renewed.code, 200);
    assert_eq!(
        content_type(&renewed),
        "application/vnd.kubernetes.protobuf"
    );
    // Envelope 1 typeMeta, 2 raw; Lease 1 metadata, 2 spec; ObjectMeta 8
    // creationTimestamp, 17 managedFields (4 its time, 7 fieldsV1); spec
    // 4 renewTime.
    let nested: &[&[u32]] = &[
        &[1],
        &[2],
        &[2, 1],
        &[2, 2],
        &[2, 1, 8],
        &[2, 1, 17],
        &[2, 1, 17, 4],
        &[2, 1, 17, 7],
        &[2, 2, 4],
    ];
    assert_eq!(
        protobuf_layout(&renewed.body, nested),
        protobuf_layout(&recorded("lease-patch-200"), nested)
    );
    // A client that asks for JSON first, or only, gets JSON.
    for accept in [
        "application/json",
        "application/json, application/vnd.kubernetes.protobuf",
    ] {
        let r = patch(&mut node, "edge-1", accept);
        assert_eq!(
            (r.code, content_type(&r).as_str()),
            (200, "application/json")
        );
    }
}

#[test]
fn pods_list_watch_and_graceful_delete_match_the_fixtures() {
    let f = fake();
    f.set_bookmark_interval(Duration::from_millis(300));
    let mut uids = Uids::default();
    with_nodes(&f, &mut uids);
    with_pods(&f, &mut uids);
    let mut node = Client::node(&f);
    let mut admin = Client::admin(&f);

    let app1 = f.pod("default", "app-1").unwrap();
    assert_eq!(
        app1["status"],
        json!({"phase": "Pending", "qosClass": "BestEffort"})
    );
    assert!(app1["spec"]["volumes"][0]["name"]
        .as_str()
        .unwrap()
        .starts_with("default-token-"));
    assert_eq!(app1["spec"]["serviceAccountName"], "default");

    let mut list_rv = 0;
    for name in ["04h-pods-list-node-rv0", "04i-pods-list-node-quorum"] {
        let fx = Fixture::load(name);
        let resp = node.replay(&fx, &uids);
        assert_eq!(resp.code, 200);
        let list = resp.json();
        assert_same_shape(name, &fx.json(), &list);
        let names: Vec<_> = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["metadata"]["name"].clone())
            .collect();
        assert_eq!(names, [json!("app-1"), json!("app-2")]);
        assert!(list.get("continue").is_none() && list["metadata"].get("continue").is_none());
        list_rv = rv(&list);
        assert_eq!(
            list_rv,
            f.resource_version(),
            "{name}: list RV is the last write"
        );
    }

    // The three recorded watches, started from the list's RV.
    let target = |fx: &str| {
        Fixture::load(fx)
            .target
            .replace("resourceVersion=401", &format!("resourceVersion={list_rv}"))
    };
    let w30 =
        target("05a-pods-watch-node-timeout30").replace("timeoutSeconds=30", "timeoutSeconds=2");
    let w_nobm = target("05c-pods-watch-node-nobookmarks-timeout30")
        .replace("timeoutSeconds=30", "timeoutSeconds=2");
    let mut watch = Client::node(&f).watch(&w30);
    let mut watch_nobm = Client::node(&f).watch(&w_nobm);
    assert_eq!(watch.code, 200);
    let fx05a = Fixture::load("05a-pods-watch-node-timeout30");
    assert_eq!(
        header_names(&watch.headers, true),
        header_names(&fx05a.resp_headers, true)
    );

    let fx = Fixture::load("05d-admin-pod-create-app-3");
    let app3 = check_object(&fx, &admin.replay(&fx, &uids));
    uids.add(&fx.json(), &app3);
    let fx = Fixture::load("05e-admin-pod-label-patch-app-2");
    let app2 = check_object(&fx, &admin.replay(&fx, &uids));
    assert_eq!(app2["metadata"]["labels"]["tier"], "backend");
    let fx = Fixture::load("05f-admin-pod-delete-grace30-app-1");
    let terminating = check_object(&fx, &admin.replay(&fx, &uids));
    assert_eq!(terminating["metadata"]["deletionGracePeriodSeconds"], 30);
    let deletion_ts: k8s_openapi::jiff::Timestamp = terminating["metadata"]["deletionTimestamp"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let in_secs = deletion_ts.as_second() - k8s_openapi::jiff::Timestamp::now().as_second();
    assert!(
        (28..=31).contains(&in_secs),
        "deletionTimestamp is now + 30 s, got {in_secs}"
    );
    let fx = Fixture::load("05g-admin-pod-get-terminating-app-1");
    assert_eq!(
        check_object(&fx, &admin.replay(&fx, &uids)),
        terminating,
        "the pod stays while terminating"
    );
    let fx = Fixture::load("05h-admin-pod-delete-grace0-app-1");
    let last = check_object(&fx, &admin.replay(&fx, &uids));
    assert_eq!(last["metadata"]["deletionGracePeriodSeconds"], 0);
    assert_eq!(rv(&last), rv(&terminating) + 1);
    assert_eq!(
        add_secs(&terminating["metadata"]["deletionTimestamp"], -30),
        last["metadata"]["deletionTimestamp"],
        "shortening the grace period moves deletionTimestamp back by the difference"
    );
    assert!(f.pod("default", "app-1").is_none());

    let events = watch.all();
    let real: Vec<Value> = fx05a
        .resp_body
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let real_types: Vec<_> = types(&real)
        .into_iter()
        .filter(|t| t != "BOOKMARK")
        .collect();
    let fake_types: Vec<_> = types(&events)
        .into_iter()
        .filter(|t| t != "BOOKMARK")
        .collect();
    assert_eq!(
        fake_types, real_types,
        "ADDED app-3, MODIFIED app-2, MODIFIED/MODIFIED/DELETED app-1"
    );
    let rvs: Vec<u64> = events
        .iter()
        .filter(|e| e["type"] != "BOOKMARK")
        .map(|e| rv(&e["object"]))
        .collect();
    assert_eq!(
        rvs,
        (list_rv + 1..=list_rv + 5).collect::<Vec<_>>(),
        "one RV per write, in order"
    );
    for (e, r) in events.iter().zip(real.iter()) {
        assert_same_shape("05a event", r, e);
        assert_eq!(e["object"]["kind"], "Pod", "watch objects carry kind");
    }
    let bookmarks: Vec<&Value> = events.iter().filter(|e| e["type"] == "BOOKMARK").collect();
    assert!(
        !bookmarks.is_empty(),
        "bookmarks with allowWatchBookmarks: {events:?}"
    );
    for b in &bookmarks {
        let mut expect = real
            .iter()
            .find(|e| e["type"] == "BOOKMARK")
            .unwrap()
            .clone();
        expect["object"]["metadata"]["resourceVersion"] = json!((list_rv + 5).to_string());
        assert_eq!(**b, expect, "a bookmark is the empty Pod at the cache RV");
    }
    let events = watch_nobm.all();
    assert_eq!(
        types(&events),
        real_types,
        "no bookmarks without allowWatchBookmarks"
    );

    // Watches from RV 0 and without RV: synthetic ADDED, and no bookmark on a quiet type.
    for name in [
        "05i-pods-watch-node-rv0-timeout5",
        "05j-pods-watch-node-norv-timeout5",
    ] {
        let fx = Fixture::load(name);
        let mut w =
            Client::node(&f).watch(&fx.target.replace("timeoutSeconds=5", "timeoutSeconds=1"));
        let events = w.all();
        let real: Vec<Value> = fx
            .resp_body
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(types(&events), types(&real), "{name}");
        let mut names: Vec<_> = events
            .iter()
            .map(|e| {
                e["object"]["metadata"]["name"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect();
        names.sort();
        assert_eq!(names, ["app-2", "app-3"], "{name}");
    }
}

fn add_secs(ts: &Value, secs: i64) -> Value {
    let t: k8s_openapi::jiff::Timestamp = ts.as_str().unwrap().parse().unwrap();
    let t = k8s_openapi::jiff::Timestamp::from_second(t.as_second() + secs).unwrap();
    json!(t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
}

#[test]
fn resource_version_semantics_match_the_fixtures() {
    let f = fake();
    let mut uids = Uids::default();
    with_nodes(&f, &mut uids);
    let before_pods = f.resource_version();
    with_pods(&f, &mut uids);
    let mut node = Client::node(&f);

    // 06a: a watch from a compacted RV.
    let fx = Fixture::load("06a-pods-watch-rv1-too-old");
    let mut w = Client::node(&f).watch(&fx.target);
    assert_eq!(w.code, 200);
    assert_eq!(
        header_names(&w.headers, true),
        header_names(&fx.resp_headers, true)
    );
    let line = String::from_utf8(w.c.read_chunk().unwrap().unwrap()).unwrap();
    let oldest = crate::support::fake_apiserver::FIRST_RV;
    assert_eq!(line, fx.resp_body.replace("(388)", &format!("({oldest})")));
    assert!(
        w.c.read_chunk().unwrap().is_none(),
        "the stream closes after the ERROR"
    );

    // 06b: exact list at an RV before the pods existed.
    let fx = Fixture::load("06b-pods-list-rv1-exact-before-compaction");
    let exact = fx.target.replace(
        "resourceVersion=1&",
        &format!("resourceVersion={before_pods}&"),
    );
    let resp = node.get(&exact);
    assert_eq!(resp.code, 200);
    assert_eq!(
        resp.text(),
        fx.resp_body
            .replace(r#""1""#, &format!(r#""{before_pods}""#))
    );

    // 06e: exact list at the RV of app-2's creation: app-1 and app-2 only.
    let app2_rv = rv(&f.pod("default", "app-2").unwrap());
    let fx = Fixture::load("06e-pods-list-rv400-exact");
    let resp = node.get(
        &fx.target
            .replace("resourceVersion=400", &format!("resourceVersion={app2_rv}")),
    );
    assert_eq!(resp.code, 200);
    assert_same_shape(&fx.name, &fx.json(), &resp.json());
    assert_eq!(rv(&resp.json()), app2_rv);

    // 06c: NotOlderThan serves the current state.
    let fx = Fixture::load("06c-pods-list-rv1-notolderthan");
    let resp = node.replay(&fx, &uids);
    assert_eq!(resp.code, 200);
    assert_eq!(rv(&resp.json()), f.resource_version());

    // 06d: after compaction the exact list is gone.
    f.compact();
    let fx = Fixture::load("06d-pods-list-rv1-exact-after-compaction");
    check_status(&fx, &node.get(&exact), &uids);

    for name in [
        "06f-pods-list-rv-future-too-large",
        "06g-pods-list-rvmatch-without-rv-422",
        "06h-pods-list-rv0-exact-422",
    ] {
        let fx = Fixture::load(name);
        check_status(&fx, &node.replay(&fx, &uids), &uids);
    }

    // 06i: the cache waits about 3 s for a future RV, then 504.
    let fx = Fixture::load("06i-pods-list-rv-future-nolimit-cache");
    let start = Instant::now();
    let resp = node.replay(&fx, &uids);
    assert!(
        start.elapsed() >= Duration::from_millis(2900),
        "waited {:?}",
        start.elapsed()
    );
    let cache_rv = rv(&f.pod("default", "other-1").unwrap());
    let real = fx
        .resp_body
        .replace("current: 406", &format!("current: {cache_rv}"));
    let fx = Fixture {
        resp_body: real,
        ..fx
    };
    check_status(&fx, &resp, &uids);
    assert_eq!(resp.header("retry-after"), Some("1"));
}

#[test]
fn pod_status_patches_match_the_fixtures() {
    let f = fake();
    let mut uids = Uids::default();
    with_nodes(&f, &mut uids);
    with_pods(&f, &mut uids);
    let fx = Fixture::load("05d-admin-pod-create-app-3");
    let app3 = Client::admin(&f).replay(&fx, &uids).json();
    uids.add(&fx.json(), &app3);
    let fx = Fixture::load("05e-admin-pod-label-patch-app-2");
    check_object(&fx, &Client::admin(&f).replay(&fx, &uids));
    let mut node = Client::node(&f);

    let fx = Fixture::load("07a-pod-status-patch-smp-running");
    let v = check_object(&fx, &node.replay(&fx, &uids));
    assert_eq!(v["status"]["phase"], "Running");
    assert_eq!(v["status"]["conditions"], fx.json()["status"]["conditions"]);
    assert_eq!(v["status"]["podIPs"], json!([{"ip": "10.88.0.6"}]));
    assert_eq!(
        v["status"]["qosClass"], "BestEffort",
        "fields the patch does not name stay"
    );
    let managers: Vec<_> = v["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["manager"].clone())
        .collect();
    assert_eq!(managers, [json!("kubectl"), json!("kubelet")]);

    let fx = Fixture::load("07b-pod-status-patch-merge-running");
    let v = check_object(&fx, &node.replay(&fx, &uids));
    assert_eq!(
        v["status"]["containerStatuses"],
        fx.json()["status"]["containerStatuses"]
    );

    for name in [
        "07c-pod-status-patch-other-node-403",
        "07d-pod-status-patch-wrong-uid",
        "07e-pod-status-patch-labels-403",
        "07f-pod-status-patch-nonexistent-404",
    ] {
        let fx = Fixture::load(name);
        check_status(&fx, &node.replay(&fx, &uids), &uids);
    }
    let fx = Fixture::load("07g-pod-get");
    let v = check_object(&fx, &node.replay(&fx, &uids));
    assert_eq!(v["status"]["phase"], "Running");

    // 08b (after the graceful delete 08a): a later SMP merges conditions by
    // type and replaces containerStatuses.
    let fx = Fixture::load("08a-admin-pod-delete-grace30-app-3");
    check_object(&fx, &Client::admin(&f).replay(&fx, &uids));
    let fx = Fixture::load("08b-pod-status-patch-smp-terminated");
    let v = check_object(&fx, &node.replay(&fx, &uids));
    let real = fx.json();
    assert_eq!(
        v["status"]["containerStatuses"],
        real["status"]["containerStatuses"]
    );
    let types: Vec<_> = v["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["type"].clone(), c["status"].clone()))
        .collect();
    let real_types: Vec<_> = real["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["type"].clone(), c["status"].clone()))
        .collect();
    assert_eq!(types, real_types);
}

#[test]
fn deletes_and_mirror_pods_match_the_fixtures() {
    let f = fake();
    let mut uids = Uids::default();
    with_nodes(&f, &mut uids);
    with_pods(&f, &mut uids);
    let fx = Fixture::load("05d-admin-pod-create-app-3");
    let app3 = Client::admin(&f).replay(&fx, &uids).json();
    uids.add(&fx.json(), &app3);
    let mut node = Client::node(&f);
    let mut admin = Client::admin(&f);
    let mut watch = Client::node(&f).watch(&format!(
        "/api/v1/pods?fieldSelector=spec.nodeName%3Dedge-1&watch=true&resourceVersion={}&timeoutSeconds=2",
        f.resource_version()
    ));

    // The status app-3 had in the recording (07b), then the graceful delete
    // and the kubelet's status after the kill (08b).
    let fx = Fixture::load("07b-pod-status-patch-merge-running");
    check_object(&fx, &node.replay(&fx, &uids));
    let fx = Fixture::load("08a-admin-pod-delete-grace30-app-3");
    let v = check_object(&fx, &admin.replay(&fx, &uids));
    assert_eq!(v["metadata"]["deletionGracePeriodSeconds"], 30);
    let fx = Fixture::load("08b-pod-status-patch-smp-terminated");
    let v = check_object(&fx, &node.replay(&fx, &uids));
    assert!(
        v["metadata"]["deletionTimestamp"].is_string(),
        "a status patch keeps the deletion"
    );
    let fx = Fixture::load("08c-pod-delete-grace0-wrong-uid-409");
    check_status(&fx, &node.replay(&fx, &uids), &uids);
    let fx = Fixture::load("08d-pod-delete-grace0-uid-precondition-200");
    let v = check_object(&fx, &node.replay(&fx, &uids));
    assert_eq!(v["metadata"]["deletionGracePeriodSeconds"], 0);
    for name in [
        "08e-pod-get-after-delete-404",
        "08f-pod-delete-again-404",
        "08g-pod-delete-other-node-403",
    ] {
        let fx = Fixture::load(name);
        check_status(&fx, &node.replay(&fx, &uids), &uids);
    }
    assert!(f.pod("default", "other-1").is_some());

    let fx = Fixture::load("09a-mirror-pod-create");
    let mirror = check_object(&fx, &node.replay(&fx, &uids));
    uids.add(&fx.json(), &mirror);
    assert!(
        mirror["spec"].get("volumes").is_none(),
        "no token volume for mirror pods"
    );
    assert!(mirror["spec"].get("serviceAccountName").is_none());
    assert_eq!(
        mirror["status"],
        json!({"phase": "Pending", "qosClass": "BestEffort"})
    );
    for name in [
        "09b-nonmirror-pod-create-403",
        "09c-mirror-pod-with-secret-403",
        "09d-mirror-pod-blockownerdeletion-403",
    ] {
        let fx = Fixture::load(name);
        check_status(&fx, &node.replay(&fx, &uids), &uids);
    }
    let fx = Fixture::load("09e-mirror-pod-delete");
    let v = check_object(&fx, &node.replay(&fx, &uids));
    assert_eq!(v["metadata"]["deletionGracePeriodSeconds"], 0);
    assert_eq!(
        v["metadata"]["deletionTimestamp"]
            .as_str()
            .map(is_time_secs),
        Some(true)
    );

    let events = watch.all();
    let summary: Vec<(String, String)> = events
        .iter()
        .map(|e| {
            (
                e["type"].as_str().unwrap().into(),
                e["object"]["metadata"]["name"].as_str().unwrap().into(),
            )
        })
        .collect();
    let expect: Vec<(String, String)> = [
        ("MODIFIED", "app-3"),
        ("MODIFIED", "app-3"),
        ("MODIFIED", "app-3"),
        ("MODIFIED", "app-3"),
        ("DELETED", "app-3"),
        ("ADDED", "web-edge-1"),
        ("MODIFIED", "web-edge-1"),
        ("DELETED", "web-edge-1"),
    ]
    .iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    assert_eq!(
        summary, expect,
        "grace 0 gives MODIFIED then DELETED, even for a pod not terminating"
    );
    let deleted = &events[4]["object"];
    assert_eq!(
        rv(deleted),
        rv(&events[3]["object"]) + 1,
        "DELETED carries the final RV"
    );
}

#[test]
fn authentication_version_and_health_match_the_fixtures() {
    let f = fake();
    let uids = Uids::default();
    let fx = Fixture::load("10a-anonymous-pods-list");
    check_status(&fx, &Client::new(&f, None).replay(&fx, &uids), &uids);
    let fx = Fixture::load("10b-invalid-bearer-token-pods-list");
    check_status(
        &fx,
        &Client::new(&f, Some(BAD_TOKEN)).replay(&fx, &uids),
        &uids,
    );
    for (name, token) in [
        ("10c-anonymous-version", None),
        ("13a-version", Some(NODE_TOKEN)),
        ("13b-healthz", Some(NODE_TOKEN)),
        ("13c-healthz-anonymous", None),
        ("13d-healthz-verbose", Some(NODE_TOKEN)),
        ("13e-readyz", Some(NODE_TOKEN)),
        ("13f-livez-anonymous", None),
    ] {
        let fx = Fixture::load(name);
        let resp = Client::new(&f, token).replay(&fx, &uids);
        assert_eq!(resp.code, fx.code, "{name}");
        assert_eq!(resp.text(), fx.resp_body, "{name}: body");
        assert_eq!(
            header_names(&resp.headers, true),
            header_names(&fx.resp_headers, true),
            "{name}"
        );
        assert_eq!(
            resp.header("content-type"),
            fx.resp_headers
                .iter()
                .find(|(k, _)| k == "content-type")
                .map(|(_, v)| v.as_str())
        );
    }
    let fx = Fixture::load("13g-healthz-unknown-subpath-403");
    check_status(&fx, &Client::node(&f).replay(&fx, &uids), &uids);
    let reqs = f.requests();
    assert_eq!(reqs[0].user, "system:anonymous");
    assert_eq!(reqs[0].status, 403);
    assert_eq!(reqs[1].user, "");
    assert_eq!(reqs[1].status, 401);
    assert_eq!(
        reqs[0].query,
        "fieldSelector=spec.nodeName%3Dedge-1&limit=500&resourceVersion=0"
    );
}

/// The recorded watch events of a fixture, one per line.
fn strip_kind(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(m) = v.as_object_mut() {
        m.remove("kind");
        m.remove("apiVersion");
    }
    v
}

fn events_of(fx: &Fixture) -> Vec<Value> {
    fx.resp_body
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// ConfigMaps and Secrets as a node reads them (04b–04d, 11a–11k): the
/// Node authorizer's graph (refused until a pod bound to the node refers
/// to the object, by a volume, env or its service account token; lists
/// only by name), the cache's resourceVersion on a list at RV 0, and a
/// watch by name that sees the admin's patch and then bookmarks.
#[test]
fn config_maps_and_secrets_match_the_fixtures() {
    let f = fake();
    let mut uids = Uids::default();
    with_nodes(&f, &mut uids);
    let mut admin = Client::admin(&f);
    let mut node = Client::node(&f);
    let mut created = Vec::new();
    for name in [
        "04b-admin-configmap-create",
        "04c-admin-configmap-unreferenced-create",
        "04d-admin-secret-unreferenced-create",
    ] {
        let fx = Fixture::load(name);
        let v = check_object(&fx, &admin.replay(&fx, &uids));
        assert_eq!(v["data"], fx.json()["data"], "{name}");
        assert_eq!(
            v["metadata"]["managedFields"][0]["fieldsV1"],
            fx.json()["metadata"]["managedFields"][0]["fieldsV1"],
            "{name}"
        );
        uids.add(&fx.json(), &v);
        created.push(v);
    }
    // Nothing refers to them yet: app-config too is refused.
    let fx = Fixture::load("11d-node-configmap-get-referenced-200");
    assert_eq!(node.replay(&fx, &uids).code, 403);

    // app-1 refers to app-config by env, app-4 by a volume.
    with_pods(&f, &mut uids);
    let fx = Fixture::load("11a-admin-pod-create-app-4-mounts-configmap");
    let app4 = check_object(&fx, &admin.replay(&fx, &uids));
    uids.add(&fx.json(), &app4);
    let real = fx.json();
    assert_eq!(
        app4["spec"]["volumes"][0], real["spec"]["volumes"][0],
        "a configMap volume gets its defaultMode"
    );
    assert_eq!(
        app4["spec"]["containers"][0]["imagePullPolicy"], "Never",
        "a policy sent is kept"
    );
    let token_volume = app4["spec"]["volumes"][1]["name"].as_str().unwrap();
    assert!(token_volume.starts_with("default-token-"), "{token_volume}");
    uids.add_name("default-token-fgxgt", token_volume);

    for name in [
        "11b-node-configmap-get-unreferenced-403",
        "11c-node-secret-get-unreferenced-403",
        "11f-node-secret-list-all-403",
    ] {
        let fx = Fixture::load(name);
        let resp = node.replay(&fx, &uids);
        check_status(&fx, &resp, &uids);
        assert_eq!(resp.header("x-content-type-options"), Some("nosniff"));
    }

    let fx = Fixture::load("11d-node-configmap-get-referenced-200");
    let v = check_object(&fx, &node.replay(&fx, &uids));
    assert_eq!(v, created[0], "the ConfigMap as created");

    // 11e: the list at RV 0 carries the ConfigMap cache's RV: the last
    // ConfigMap written, below the global RV.
    let fx = Fixture::load("11e-node-configmap-list-by-name-rv0");
    let resp = node.replay(&fx, &uids);
    assert_eq!(resp.code, 200, "{}", resp.text());
    assert_eq!(
        header_names(&resp.headers, true),
        header_names(&fx.resp_headers, true)
    );
    let list = resp.json();
    assert_same_shape(&fx.name, &fx.json(), &list);
    assert_eq!(list["kind"], "ConfigMapList");
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    assert!(list["items"][0].get("kind").is_none());
    assert_eq!(list["items"][0], strip_kind(&created[0]));
    let all = admin.get("/api/v1/configmaps").json();
    let cache_rv = all["items"].as_array().unwrap().iter().map(rv).max();
    assert_eq!(Some(rv(&list)), cache_rv);
    assert!(rv(&list) < f.resource_version(), "pods were written since");

    // 11g: the service account token Secret every non-mirror pod mounts.
    let fx = Fixture::load("11g-node-secret-get-sa-token-referenced-200");
    let secret = check_object(&fx, &node.replay(&fx, &uids));
    let real = fx.json();
    assert_eq!(secret["type"], real["type"]);
    assert_eq!(secret["data"]["namespace"], real["data"]["namespace"]);
    assert_eq!(
        secret["metadata"]["annotations"]["kubernetes.io/service-account.name"],
        "default"
    );
    assert!(is_uid(
        secret["metadata"]["annotations"]["kubernetes.io/service-account.uid"]
            .as_str()
            .unwrap_or("")
    ));
    assert_eq!(
        secret["metadata"]["managedFields"][0]["manager"],
        "kube-controller-manager"
    );

    // 11h, 11i: the admin's reads of the unreferenced objects.
    for (name, i) in [("11h-admin-configmap-get", 1), ("11i-admin-secret-get", 2)] {
        let fx = Fixture::load(name);
        let v = check_object(&fx, &admin.replay(&fx, &uids));
        assert_eq!(v, created[i], "{name}");
        assert_eq!(v["data"], fx.json()["data"], "{name}");
    }

    // 11j: a watch by name from the list's RV sees the admin's patch (11k)
    // and, near its deadline (4 s as recorded), bookmarks at the cache RV.
    let fx = Fixture::load("11j-node-configmap-watch-by-name");
    let target = fx.target.replace(
        "resourceVersion=397",
        &format!("resourceVersion={}", rv(&list)),
    );
    let mut watch = Client::node(&f).watch(&target);
    assert_eq!(watch.code, 200);
    assert_eq!(
        header_names(&watch.headers, true),
        header_names(&fx.resp_headers, true)
    );
    // Past the second app-config was created in: its managedFields time
    // stays, as the patch sets no field kubectl did not own already.
    std::thread::sleep(Duration::from_millis(1100));
    let fx_patch = Fixture::load("11k-admin-configmap-patch");
    let patched = check_object(&fx_patch, &admin.replay(&fx_patch, &uids));
    assert_eq!(patched["data"], fx_patch.json()["data"]);
    assert_eq!(rv(&patched), f.resource_version());
    assert_eq!(
        patched["metadata"]["managedFields"], created[0]["metadata"]["managedFields"],
        "kubectl changed a field it already owned"
    );
    // A change to an object the watch does not select is not sent.
    f.update_config_map("default", "unreferenced-config", &[("key", "other")]);
    let events = watch.all();
    let real = events_of(&fx);
    let not_bookmarks = |e: &&Value| e["type"] != "BOOKMARK";
    assert_eq!(
        types(
            &events
                .iter()
                .filter(not_bookmarks)
                .cloned()
                .collect::<Vec<_>>()
        ),
        types(
            &real
                .iter()
                .filter(not_bookmarks)
                .cloned()
                .collect::<Vec<_>>()
        ),
        "{events:?}"
    );
    assert_eq!(events[0]["object"], patched, "MODIFIED carries the object");
    assert_same_shape(&fx.name, &real[0], &events[0]);
    let bookmarks: Vec<&Value> = events[1..].iter().collect();
    assert!(!bookmarks.is_empty(), "a bookmark before the deadline");
    for b in bookmarks {
        let mut expect = real[1].clone();
        // The cache RV: the last ConfigMap written, the unselected one.
        expect["object"]["metadata"]["resourceVersion"] = json!(f.resource_version().to_string());
        assert_eq!(*b, expect, "a bookmark is the empty ConfigMap");
    }
}

/// The node's Services list (14a) with the `kubernetes` Service as the
/// apiserver's bootstrap controller writes it: the API's defaults
/// (protocol, type, sessionAffinity, clusterIPs, a targetPort, an empty
/// load balancer status) and the Services cache's RV.
#[test]
fn services_list_matches_the_fixture() {
    let f = fake();
    let fx = Fixture::load("14a-services-list-rv0");
    let real = fx.json();
    let svc = &real["items"][0];
    let mut admin = Client::admin(&f);
    let sent = json!({
        "metadata": {"name": "kubernetes", "namespace": "default",
                     "labels": svc["metadata"]["labels"]},
        "spec": {"clusterIP": "10.0.0.1",
                 "ports": [{"name": "https", "port": 443, "targetPort": 6443}]},
    });
    let headers = [
        ("content-type", "application/json"),
        (
            "user-agent",
            "kube-apiserver/v1.20.2 (linux/amd64) kubernetes/faecb19",
        ),
    ]
    .map(|(k, v)| (k.to_string(), v.to_string()));
    let resp = admin
        .try_send(
            "POST",
            "/api/v1/namespaces/default/services",
            &headers,
            sent.to_string().as_bytes(),
        )
        .unwrap();
    assert_eq!(resp.code, 201, "{}", resp.text());
    let created = resp.json();
    assert_eq!(
        created["metadata"]["managedFields"][0]["manager"],
        svc["metadata"]["managedFields"][0]["manager"]
    );
    f.create_pod(pod("unrelated", "edge-1"));

    let resp = Client::node(&f).replay(&fx, &Uids::default());
    assert_eq!(resp.code, 200, "{}", resp.text());
    assert_eq!(
        header_names(&resp.headers, true),
        header_names(&fx.resp_headers, true)
    );
    let list = resp.json();
    assert_same_shape(&fx.name, &real, &list);
    assert_eq!(list["kind"], "ServiceList");
    assert_eq!(list["items"][0]["spec"], svc["spec"]);
    assert_eq!(list["items"][0]["status"], svc["status"]);
    assert_eq!(rv(&list), rv(&created), "the Services cache's RV");
    assert!(rv(&list) < f.resource_version());

    // Without a targetPort, it is the port; a headless Service's
    // clusterIPs is ["None"].
    let headless = f.create_service("default", "db", "None", json!([{"port": 5432}]));
    assert_eq!(
        headless["spec"]["ports"][0],
        json!({"port": 5432, "protocol": "TCP", "targetPort": 5432})
    );
    assert_eq!(headless["spec"]["clusterIPs"], json!(["None"]));
}

#[test]
fn events_match_the_fixtures() {
    let f = fake();
    let mut uids = Uids::default();
    with_nodes(&f, &mut uids);
    with_pods(&f, &mut uids);
    let mut node = Client::node(&f);
    let fx = Fixture::load("12a-event-create-started");
    let created = check_object(&fx, &node.replay(&fx, &uids));
    let fx = Fixture::load("12b-event-patch-count");
    let patched = check_object(&fx, &node.replay(&fx, &uids));
    assert_eq!(patched["count"], 2);
    assert_eq!(patched["lastTimestamp"], "2026-11-22T00:49:14Z");
    assert_eq!(patched["firstTimestamp"], created["firstTimestamp"]);
    let fx = Fixture::load("12c-event-create-node-ready");
    check_object(&fx, &node.replay(&fx, &uids));
    let fx = Fixture::load("12d-event-create-duplicate-409");
    check_status(&fx, &node.replay(&fx, &uids), &uids);
    assert_eq!(f.events().len(), 2);
    // Nodes may not read events back.
    let resp = node.get("/api/v1/namespaces/default/events/edge-1.18ea379e3471bcf2");
    assert_eq!(resp.code, 403);
    assert_eq!(
        resp.json()["message"],
        "events \"edge-1.18ea379e3471bcf2\" is forbidden: User \"system:node:edge-1\" cannot get resource \"events\" in API group \"\" in the namespace \"default\""
    );
}

// ---------------------------------------------------------------------------
// Behaviour beyond the fixtures

fn pod(name: &str, node: &str) -> Value {
    json!({"metadata": {"name": name, "namespace": "default"},
           "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}})
}

#[test]
fn pagination_field_selector_moves_and_handles() {
    let f = fake();
    for i in 0..5 {
        f.create_pod(pod(&format!("p{i}"), "edge-1"));
    }
    let p0 = f.pod("default", "p0").unwrap();
    assert_eq!(p0["spec"]["containers"][0]["imagePullPolicy"], "Always");
    let mut c = Client::admin(&f);
    let first = c.get("/api/v1/pods?limit=2").json();
    assert_eq!(first["items"].as_array().unwrap().len(), 2);
    assert_eq!(first["metadata"]["remainingItemCount"], 3);
    let token = first["metadata"]["continue"].as_str().unwrap().to_string();
    f.create_pod(pod("p9", "edge-1"));
    let second = c
        .get(&format!("/api/v1/pods?limit=10&continue={token}"))
        .json();
    assert_eq!(second["kind"], "PodList", "{second}");
    let names: Vec<_> = second["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        names,
        ["p2", "p3", "p4"],
        "a continued list is served at the first page's RV"
    );
    assert_eq!(
        second["metadata"]["resourceVersion"],
        first["metadata"]["resourceVersion"]
    );
    assert!(second["metadata"].get("continue").is_none());

    // A pod that stops matching the field selector is sent as DELETED.
    let start = f.resource_version();
    let mut w = Client::admin(&f).watch(&format!(
        "/api/v1/pods?fieldSelector=spec.nodeName%3Dedge-1&watch=true&resourceVersion={start}&timeoutSeconds=1"
    ));
    assert!(f.update_pod("default", "p1", |p| p["spec"]["nodeName"] = json!("edge-2")));
    f.update_pod("default", "p2", |p| {
        p["metadata"]["labels"] = json!({"a": "b"})
    });
    let gone = f.delete_pod("default", "p3", Some(0)).unwrap();
    assert_eq!(gone["metadata"]["deletionGracePeriodSeconds"], 0);
    let events = w.all();
    assert_eq!(
        types(&events),
        ["DELETED", "MODIFIED", "MODIFIED", "DELETED"]
    );
    assert_eq!(
        events[0]["object"]["spec"]["nodeName"], "edge-1",
        "the previous object"
    );
    assert_eq!(rv(&events[0]["object"]), start + 1, "with the event's RV");
    assert_eq!(f.pods().len(), 5);
    assert!(f.delete_pod("default", "nope", None).is_none());

    // An unbound pod is deleted at once even with a grace period.
    f.create_pod(json!({"metadata": {"name": "unbound", "namespace": "default"}, "spec": {"containers": [{"name": "c", "image": "busybox:1.36"}]}}));
    assert_eq!(
        f.pod("default", "unbound").unwrap()["spec"]["containers"][0]["imagePullPolicy"],
        "IfNotPresent"
    );
    f.delete_pod("default", "unbound", Some(30)).unwrap();
    assert!(f.pod("default", "unbound").is_none());
    assert!(f.count("GET", "/api/v1/pods") >= 2);
    f.clear_requests();
    assert!(f.requests().is_empty());
}

#[test]
fn status_put_node_rules_and_node_bookmarks() {
    let f = fake();
    let mut uids = Uids::default();
    with_nodes(&f, &mut uids);
    let mut node = Client::node(&f);
    let start = f.resource_version();
    let mut w = Client::node(&f).watch(&format!(
        "/api/v1/nodes?fieldSelector=metadata.name%3Dedge-1&watch=true&allowWatchBookmarks=true&resourceVersion={start}&timeoutSeconds=1"
    ));
    f.set_bookmark_interval(Duration::from_millis(200));

    // PUT of nodes/status takes the status only.
    let mut body = f.node("edge-1").unwrap();
    body["spec"]["taints"] = json!([]);
    body["status"]["capacity"]["pods"] = json!("50");
    let resp = node.send(
        "PUT",
        "/api/v1/nodes/edge-1/status",
        Some("application/json"),
        body.to_string().as_bytes(),
    );
    assert_eq!(resp.code, 200, "{}", resp.text());
    let v = resp.json();
    assert_eq!(v["status"]["capacity"]["pods"], "50");
    assert_eq!(
        v["spec"]["taints"].as_array().unwrap().len(),
        1,
        "spec is not changed through status"
    );
    // A stale RV in a PUT is a conflict.
    let resp = node.send(
        "PUT",
        "/api/v1/nodes/edge-1/status",
        Some("application/json"),
        body.to_string().as_bytes(),
    );
    assert_eq!(resp.code, 409);
    assert_eq!(
        resp.json()["details"],
        json!({"name": "edge-1", "kind": "nodes"})
    );

    // Nodes may not delete nodes, or create another node or another node's lease.
    let resp = node.delete("/api/v1/nodes/edge-1", &json!({}));
    assert_eq!(resp.code, 403);
    assert_eq!(
        resp.json()["message"],
        "nodes \"edge-1\" is forbidden: User \"system:node:edge-1\" cannot delete resource \"nodes\" in API group \"\" at the cluster scope"
    );
    let resp = node.send(
        "POST",
        "/api/v1/nodes",
        Some("application/json"),
        json!({"metadata": {"name": "edge-3"}})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(
        resp.json()["message"],
        "nodes \"edge-3\" is forbidden: node \"edge-1\" is not allowed to modify node \"edge-3\""
    );
    let lease = json!({"metadata": {"name": "edge-2"}, "spec": {"holderIdentity": "edge-2"}});
    let resp = node.send(
        "POST",
        "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
        Some("application/json"),
        lease.to_string().as_bytes(),
    );
    assert_eq!(
        resp.json()["message"],
        "leases.coordination.k8s.io \"edge-2\" is forbidden: can only access node lease with the same name as the requesting node"
    );
    let resp = node.get("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/edge-2");
    assert_eq!(
        resp.json()["message"],
        "leases.coordination.k8s.io \"edge-2\" is forbidden: User \"system:node:edge-1\" cannot get resource \"leases\" in API group \"coordination.k8s.io\" in the namespace \"kube-node-lease\": can only access node lease with the same name as the requesting node"
    );

    // The watch saw the status write, then bookmarks with the empty Node.
    let events = w.all();
    assert_eq!(events[0]["type"], "MODIFIED");
    let bookmark = events
        .iter()
        .find(|e| e["type"] == "BOOKMARK")
        .expect("a bookmark");
    assert_eq!(bookmark["object"]["kind"], "Node");
    assert_eq!(
        bookmark["object"]["metadata"]["resourceVersion"],
        json!((start + 1).to_string())
    );
    assert_eq!(
        bookmark["object"]["status"]["daemonEndpoints"],
        json!({"kubeletEndpoint": {"Port": 0}})
    );

    // generateName.
    let p = f.create_pod(json!({"metadata": {"generateName": "web-", "namespace": "default"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}));
    let name = p["metadata"]["name"].as_str().unwrap();
    assert!(name.starts_with("web-") && name.len() == 9, "{name}");
}

#[test]
fn fault_down_refuses_connections_and_comes_back_on_the_same_port() {
    let f = fake();
    let url = f.url();
    let mut c = Client::node(&f);
    assert_eq!(c.get("/version").code, 200);
    f.set_down(true);
    assert!(
        TcpStream::connect(f.addr()).is_err(),
        "connections are refused"
    );
    let mut buf = [0u8; 1];
    let cut = c.try_send("GET", "/version", &[], b"");
    assert!(cut.is_err(), "open connections are cut");
    let _ = &mut buf;
    f.set_down(false);
    assert_eq!(f.url(), url);
    assert_eq!(Client::node(&f).get("/version").code, 200);
}

/// A node client whose reads give up after `timeout`.
fn quick_client(f: &FakeApiServer, timeout: Duration) -> Client {
    let tcp = TcpStream::connect(f.addr()).expect("connect");
    tcp.set_read_timeout(Some(timeout)).unwrap();
    Client {
        r: BufReader::new(Box::new(tcp)),
        token: Some(NODE_TOKEN.into()),
    }
}

fn assert_timed_out(err: io::Error) {
    assert!(
        matches!(
            err.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ),
        "not a read timeout: {err}"
    );
}

#[test]
fn fault_black_hole_accepts_but_never_answers_even_after_it_ends() {
    let f = fake();
    f.create_pod(pod("a", "edge-1"));
    let mut w = quick_client(&f, Duration::from_millis(800))
        .watch("/api/v1/pods?watch=true&resourceVersion=0&timeoutSeconds=2");
    assert_eq!(w.next_event().unwrap().unwrap()["type"], "ADDED");
    // A keep-alive connection that stays idle throughout the hole.
    let mut idle = Client::node(&f);
    assert_eq!(idle.get("/version").code, 200);
    f.set_black_hole(true);
    let mut c = quick_client(&f, Duration::from_millis(500));
    assert_timed_out(c.try_send("GET", "/version", &[], b"").unwrap_err());
    f.create_pod(pod("b", "edge-1"));
    // The watch's deadline (2 s) passes without the stream ending.
    std::thread::sleep(Duration::from_millis(2300));
    let reqs = f.requests();
    assert_eq!(reqs.last().unwrap().status, 0, "recorded without an answer");
    f.set_black_hole(false);
    // New connections are served, and so is the one that was idle.
    assert_eq!(Client::node(&f).get("/version").code, 200);
    assert_eq!(idle.get("/version").code, 200);
    // The connection that sent a request into the hole, and the watch,
    // stay silent: only the client's own timeout ends them.
    assert_timed_out(c.try_send("GET", "/version", &[], b"").unwrap_err());
    assert_timed_out(w.next_event().unwrap_err());
}

#[test]
fn injected_bytes_reach_open_watches_of_that_resource_only() {
    let f = fake();
    f.create_pod(pod("a", "edge-1"));
    assert_eq!(f.open_watches("pods"), 0);
    let mut pods =
        Client::node(&f).watch("/api/v1/pods?watch=true&resourceVersion=0&timeoutSeconds=3");
    assert_eq!(pods.next_event().unwrap().unwrap()["type"], "ADDED");
    let mut nodes = Client::admin(&f).watch("/api/v1/nodes?watch=true&timeoutSeconds=3");
    let deadline = Instant::now() + Duration::from_secs(5);
    while f.open_watches("nodes") == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(f.open_watches("pods"), 1);
    assert_eq!(
        f.inject_watch("pods", b"{\"type\":\"SURPRISE\",\"object\":{}}\n"),
        1
    );
    // Events written after it come after it.
    f.create_pod(pod("b", "edge-1"));
    let e = pods.next_event().unwrap().unwrap();
    assert_eq!(e["type"], "SURPRISE");
    let e = pods.next_event().unwrap().unwrap();
    assert_eq!(
        (e["type"].as_str(), e["object"]["metadata"]["name"].as_str()),
        (Some("ADDED"), Some("b"))
    );
    assert!(pods.all().is_empty());
    assert!(nodes.all().is_empty(), "the node watch got the pods' bytes");
    let deadline = Instant::now() + Duration::from_secs(5);
    while f.open_watches("pods") != 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(f.open_watches("pods"), 0);
    assert_eq!(f.inject_watch("pods", b"x\n"), 0);
}

#[test]
fn the_node_lifecycle_controller_marks_conditions_unknown() {
    let f = fake();
    f.create_node(json!({"metadata": {"name": "edge-1"}, "status": {"conditions": [
        {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ready",
         "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"}
    ]}}));
    let rv = f.resource_version();
    assert!(f.mark_node_unknown("edge-1"));
    assert!(!f.mark_node_unknown("edge-9"));
    let node = f.node("edge-1").unwrap();
    assert_eq!(f.resource_version(), rv + 1);
    let conditions = node["status"]["conditions"].as_array().unwrap();
    assert_eq!(conditions.len(), 4, "{conditions:?}");
    for c in conditions {
        assert_eq!(c["status"], "Unknown", "{c}");
        assert_eq!(c["reason"], "NodeStatusUnknown", "{c}");
        assert_eq!(c["message"], "Kubelet stopped posting node status.", "{c}");
    }
    assert_eq!(conditions[0]["lastHeartbeatTime"], "2026-01-01T00:00:00Z");
    assert_ne!(conditions[0]["lastTransitionTime"], "2026-01-01T00:00:00Z");
}

#[test]
fn fault_drop_watches_cuts_streams_without_the_terminating_chunk() {
    let f = fake();
    f.create_pod(pod("a", "edge-1"));
    let mut w =
        Client::node(&f).watch("/api/v1/pods?watch=true&resourceVersion=0&timeoutSeconds=30");
    assert_eq!(w.next_event().unwrap().unwrap()["type"], "ADDED");
    f.drop_watches();
    let err = w.next_event().unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof, "{err}");
    // Plain requests are unaffected.
    assert_eq!(Client::node(&f).get("/api/v1/pods").code, 200);
}

#[test]
fn fault_compact_expires_older_watches_and_lists() {
    let f = fake();
    f.create_pod(pod("a", "edge-1"));
    let old = f.resource_version();
    f.create_pod(pod("b", "edge-1"));
    let mut w = Client::node(&f).watch(&format!(
        "/api/v1/pods?watch=true&resourceVersion={old}&timeoutSeconds=1"
    ));
    assert_eq!(types(&w.all()), ["ADDED"]);
    f.compact();
    let now = f.resource_version();
    let mut w = Client::node(&f).watch(&format!(
        "/api/v1/pods?watch=true&resourceVersion={old}&timeoutSeconds=1"
    ));
    let events = w.all();
    assert_eq!(types(&events), ["ERROR"]);
    assert_eq!(events[0]["object"]["code"], 410);
    assert_eq!(
        events[0]["object"]["message"],
        format!("too old resource version: {old} ({now})")
    );
    let mut c = Client::node(&f);
    let resp = c.get(&format!(
        "/api/v1/pods?resourceVersion={old}&resourceVersionMatch=Exact"
    ));
    assert_eq!(resp.code, 410);
    assert_eq!(resp.json()["reason"], "Expired");
    // Watching from the current RV still works.
    let mut w = Client::node(&f).watch(&format!(
        "/api/v1/pods?watch=true&resourceVersion={now}&timeoutSeconds=1"
    ));
    assert!(w.all().is_empty());
}

#[test]
fn fault_fail_next_answers_with_a_status_the_given_number_of_times() {
    let f = fake();
    f.fail_next("PATCH", "/status", 500, "InternalError", "boom", 2);
    f.create_pod(pod("a", "edge-1"));
    let mut c = Client::admin(&f);
    let path = "/api/v1/namespaces/default/pods/a/status";
    let body = json!({"status": {"phase": "Running"}});
    for _ in 0..2 {
        let resp = c.patch(path, "application/merge-patch+json", &body);
        assert_eq!(resp.code, 500);
        assert_eq!(
            resp.text(),
            "{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{},\"status\":\"Failure\",\"message\":\"boom\",\"reason\":\"InternalError\",\"code\":500}\n"
        );
    }
    assert_eq!(
        c.get("/api/v1/namespaces/default/pods/a").code,
        200,
        "other requests pass"
    );
    assert_eq!(
        c.patch(path, "application/merge-patch+json", &body).code,
        200
    );
    assert_eq!(f.pod("default", "a").unwrap()["status"]["phase"], "Running");
    assert_eq!(f.count("PATCH", path), 3);
}

#[test]
fn kubeconfigs_for_tokens_over_http() {
    let f = FakeApiServer::start();
    let dir = tempfile::tempdir().unwrap();
    let path = f.write_kubeconfig(dir.path(), "system:node:edge-1", KubeconfigAuth::token());
    let cfg: Value = serde_saphyr::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(cfg["clusters"][0]["cluster"]["server"], f.url());
    let token = cfg["users"][0]["user"]["token"]
        .as_str()
        .unwrap()
        .to_string();
    let mut c = Client::new(&f, Some(&token));
    let resp = c.get("/api/v1/nodes/edge-1");
    assert_eq!(
        resp.code, 404,
        "a node may get its node; it does not exist yet"
    );

    let sub = tempfile::tempdir().unwrap();
    let path = f.write_kubeconfig(sub.path(), "admin", KubeconfigAuth::token_file());
    let cfg: Value = serde_saphyr::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(
        cfg["users"][0]["user"]["tokenFile"], "token",
        "relative to the kubeconfig"
    );
    let token = std::fs::read_to_string(sub.path().join("token")).unwrap();
    let mut c = Client::new(&f, Some(token.trim()));
    assert_eq!(
        c.get("/api/v1/namespaces/default/events/x").code,
        404,
        "the admin may read events"
    );
    assert_eq!(f.requests().last().unwrap().user, "admin");
}

fn tls_client(
    f: &FakeApiServer,
    ca_pem: &str,
    cert: Option<(&str, &str)>,
    token: Option<&str>,
) -> Client {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
        .unwrap();
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = match cert {
        Some((cert, key)) => builder
            .with_client_auth_cert(
                vec![CertificateDer::from_pem_slice(cert.as_bytes()).unwrap()],
                PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    let conn = rustls::ClientConnection::new(
        Arc::new(config),
        ServerName::try_from("127.0.0.1").unwrap().to_owned(),
    )
    .unwrap();
    let tcp = TcpStream::connect(f.addr()).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    Client {
        r: BufReader::new(Box::new(rustls::StreamOwned::new(conn, tcp))),
        token: token.map(str::to_string),
    }
}

#[test]
fn tls_with_client_certificates_and_kubeconfigs() {
    let f = FakeApiServer::start_tls();
    assert!(f.url().starts_with("https://127.0.0.1:"));
    let ca = f.ca_pem().unwrap();
    let b64 = |s: &Value| {
        use base64::Engine as _;
        String::from_utf8(
            base64::engine::general_purpose::STANDARD
                .decode(s.as_str().unwrap())
                .unwrap(),
        )
        .unwrap()
    };

    // Client certificate files, CA file.
    let dir = tempfile::tempdir().unwrap();
    let path = f.write_kubeconfig(
        dir.path(),
        "system:node:edge-1",
        KubeconfigAuth::client_cert_files(),
    );
    let cfg: Value = serde_saphyr::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let user = &cfg["users"][0]["user"];
    assert_eq!(user["client-certificate"], "client.crt");
    assert_eq!(user["client-key"], "client.key");
    assert_eq!(
        cfg["clusters"][0]["cluster"]["certificate-authority"],
        "ca.crt"
    );
    let read = |f: &str| std::fs::read_to_string(dir.path().join(f)).unwrap();
    assert_eq!(read("ca.crt"), ca);
    let mut c = tls_client(
        &f,
        &read("ca.crt"),
        Some((&read("client.crt"), &read("client.key"))),
        None,
    );
    let fx = Fixture::load("01a-node-create-201");
    let resp = c.replay(&fx, &Uids::default());
    check_object(&fx, &resp);
    assert_eq!(f.requests().last().unwrap().user, "system:node:edge-1");
    // The node's certificate makes it a node: NodeRestriction applies.
    let fx = Fixture::load("02d-node-patch-restricted-label-403");
    check_status(&fx, &c.replay(&fx, &Uids::default()), &Uids::default());

    // Client certificate data, CA data: the admin.
    let dir2 = tempfile::tempdir().unwrap();
    let path = f.write_kubeconfig(dir2.path(), "admin", KubeconfigAuth::client_cert_data());
    let cfg: Value = serde_saphyr::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let user = &cfg["users"][0]["user"];
    assert_eq!(
        b64(&cfg["clusters"][0]["cluster"]["certificate-authority-data"]),
        ca
    );
    let (cert, key) = (
        b64(&user["client-certificate-data"]),
        b64(&user["client-key-data"]),
    );
    let mut c = tls_client(&f, &ca, Some((&cert, &key)), None);
    assert_eq!(
        c.delete("/api/v1/nodes/edge-1", &json!({})).code,
        200,
        "the admin may delete nodes"
    );
    assert!(f.node("edge-1").is_none());

    // No certificate: anonymous; a token over TLS.
    let mut c = tls_client(&f, &ca, None, None);
    let fx = Fixture::load("10a-anonymous-pods-list");
    check_status(&fx, &c.replay(&fx, &Uids::default()), &Uids::default());
    let dir3 = tempfile::tempdir().unwrap();
    let path = f.write_kubeconfig(
        dir3.path(),
        "system:node:edge-1",
        KubeconfigAuth::new(Credential::Token, ServerTrust::InsecureSkipVerify),
    );
    let cfg: Value = serde_saphyr::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(
        cfg["clusters"][0]["cluster"]["insecure-skip-tls-verify"],
        true
    );
    let token = cfg["users"][0]["user"]["token"].as_str().unwrap();
    let mut c = tls_client(&f, &ca, None, Some(token));
    assert_eq!(c.get("/api/v1/pods").code, 200);

    // A certificate from another CA is refused at the handshake.
    let other = FakeApiServer::start_tls();
    let (cert, key) = other.client_cert("admin", &["system:masters"]);
    let mut c = tls_client(&f, &ca, Some((&cert, &key)), None);
    assert!(c.try_send("GET", "/version", &[], b"").is_err());
}

#[test]
fn ureq_with_a_client_certificate_talks_to_the_tls_fake() {
    use ureq::tls::{Certificate, ClientCert, PrivateKey, RootCerts, TlsConfig};
    let f = FakeApiServer::start_tls();
    let (cert, key) = f.client_cert("system:node:edge-1", &["system:nodes"]);
    let ca = f.ca_pem().unwrap();
    let tls = TlsConfig::builder()
        .root_certs(RootCerts::new_with_certs(&[Certificate::from_pem(
            ca.as_bytes(),
        )
        .unwrap()]))
        .client_cert(Some(ClientCert::new_with_certs(
            &[Certificate::from_pem(cert.as_bytes()).unwrap()],
            PrivateKey::from_pem(key.as_bytes()).unwrap(),
        )))
        .build();
    let agent = ureq::Agent::config_builder()
        .tls_config(tls)
        .http_status_as_error(false)
        .build()
        .new_agent();
    for _ in 0..2 {
        let mut resp = agent
            .get(&format!("{}/api/v1/nodes/edge-1", f.url()))
            .call()
            .unwrap();
        assert_eq!(resp.status(), 404);
        let body: Value = serde_json::from_str(&resp.body_mut().read_to_string().unwrap()).unwrap();
        assert_eq!(body["message"], "nodes \"edge-1\" not found");
    }
    let users: Vec<_> = f.requests().iter().map(|r| r.user.clone()).collect();
    assert_eq!(users, ["system:node:edge-1", "system:node:edge-1"]);
}

#[test]
fn token_and_subject_access_reviews_answer_as_the_api_does() {
    let f = fake();
    f.add_token("viewer-token", "viewer", &["viewers"]);
    f.allow_access("node-logs", "viewers", "get", "nodes/log");
    let tokens = "/apis/authentication.k8s.io/v1/tokenreviews";
    let reviews = "/apis/authorization.k8s.io/v1/subjectaccessreviews";
    let post = |c: &mut Client, target: &str, body: Value| {
        c.send(
            "POST",
            target,
            Some("application/json"),
            body.to_string().as_bytes(),
        )
    };

    let review = |token: &str| {
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
               "spec": {"token": token}})
    };
    let r = post(&mut Client::node(&f), tokens, review("viewer-token"));
    assert_eq!(r.code, 201, "{}", r.text());
    let v = r.json();
    assert_eq!(
        (v["kind"].as_str(), v["apiVersion"].as_str()),
        (Some("TokenReview"), Some("authentication.k8s.io/v1"))
    );
    assert_eq!(v["spec"]["token"], "viewer-token");
    assert_eq!(v["status"]["authenticated"], true);
    assert_eq!(v["status"]["user"]["username"], "viewer");
    assert_eq!(
        v["status"]["user"]["groups"],
        json!(["viewers", "system:authenticated"])
    );
    let v = post(&mut Client::node(&f), tokens, review("nope")).json();
    assert_eq!(v["status"], json!({"user": {}}));
    let r = post(&mut Client::node(&f), tokens, review(""));
    assert_eq!(r.code, 400, "{}", r.text());

    let access = |user: &str, groups: &[&str], sub: &str| {
        json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
               "spec": {"user": user, "groups": groups, "resourceAttributes": {
                   "verb": "get", "version": "v1", "resource": "nodes",
                   "subresource": sub, "name": "edge-1"}}})
    };
    let r = post(
        &mut Client::admin(&f),
        reviews,
        access("viewer", &["viewers"], "log"),
    );
    assert_eq!(r.code, 201, "{}", r.text());
    let v = r.json();
    assert_eq!(v["spec"]["resourceAttributes"]["subresource"], "log");
    assert_eq!(v["status"]["allowed"], true);
    assert_eq!(
        v["status"]["reason"],
        "RBAC: allowed by ClusterRoleBinding \"node-logs\" of ClusterRole \"node-logs\" to Group \"viewers\""
    );
    let v = post(
        &mut Client::node(&f),
        reviews,
        access("viewer", &["viewers"], "proxy"),
    )
    .json();
    assert_eq!(v["status"], json!({"allowed": false}));
    let v = post(
        &mut Client::node(&f),
        reviews,
        access("root", &["system:masters"], "proxy"),
    )
    .json();
    assert_eq!(v["status"]["allowed"], true);
    let r = post(
        &mut Client::node(&f),
        reviews,
        json!({"spec": {"resourceAttributes": {}}}),
    );
    assert_eq!(r.code, 422, "{}", r.text());

    // Only create is served, and only to nodes and admins.
    assert_eq!(Client::node(&f).get(tokens).code, 405);
    let r = post(
        &mut Client::new(&f, Some("viewer-token")),
        reviews,
        access("x", &[], "log"),
    );
    assert_eq!(r.code, 403, "{}", r.text());
    assert_eq!(r.json()["reason"], "Forbidden");
    assert_eq!(f.count("POST", tokens), 3);
}

/// TokenReviews that fail until told otherwise: a 500 InternalError Status
/// (as `NewInternalError` writes it), or the 201 answer upstream's
/// TokenReview storage gives when its authenticator errs (`status.error`,
/// no `authenticated`); other requests are served meanwhile.
#[test]
fn fault_token_reviews_fail_until_cleared() {
    let f = fake();
    f.add_token("viewer-token", "viewer", &["viewers"]);
    let tokens = "/apis/authentication.k8s.io/v1/tokenreviews";
    let review = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                        "spec": {"token": "viewer-token"}});
    let post = || {
        Client::node(&f).send(
            "POST",
            tokens,
            Some("application/json"),
            review.to_string().as_bytes(),
        )
    };
    f.fail_token_reviews(Some(TokenReviewFailure::InternalError));
    for _ in 0..2 {
        let r = post();
        assert_eq!(r.code, 500);
        assert_eq!(
            r.text(),
            "{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{},\"status\":\"Failure\",\"message\":\"Internal error occurred: the token authenticator is unavailable\",\"reason\":\"InternalError\",\"details\":{\"causes\":[{\"message\":\"the token authenticator is unavailable\"}]},\"code\":500}\n"
        );
    }
    assert_eq!(Client::node(&f).get("/api/v1/pods").code, 200);
    f.fail_token_reviews(Some(TokenReviewFailure::AuthenticatorError));
    let r = post();
    assert_eq!(r.code, 201, "{}", r.text());
    let status = &r.json()["status"];
    assert_eq!(status["user"], json!({}));
    assert!(status.get("authenticated").is_none(), "{status}");
    assert!(
        status["error"]
            .as_str()
            .unwrap()
            .contains("connection refused"),
        "{status}"
    );
    f.fail_token_reviews(None);
    let v = post().json();
    assert_eq!(v["status"]["authenticated"], true);
    assert_eq!(v["status"]["user"]["username"], "viewer");
    assert_eq!(f.count("POST", tokens), 4);
}

/// A default v1.20 has the EphemeralContainers gate off: the subresource
/// is not installed (go-restful's 404 with empty details, after
/// authorization, so a node is refused first) and a pod's
/// `spec.ephemeralContainers` is dropped when it is written.
#[test]
fn ephemeral_containers_are_off_by_default() {
    let f = fake();
    let mut with = pod("dbg", "edge-1");
    with["spec"]["ephemeralContainers"] = json!([{"name": "e", "image": "busybox"}]);
    let created = f.create_pod(with);
    assert!(
        created["spec"].get("ephemeralContainers").is_none(),
        "{created}"
    );
    let path = "/api/v1/namespaces/default/pods/dbg/ephemeralcontainers";
    let resp = Client::admin(&f).get(path);
    assert_eq!(resp.code, 404);
    assert_eq!(
        resp.text(),
        "{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{},\"status\":\"Failure\",\"message\":\"the server could not find the requested resource\",\"reason\":\"NotFound\",\"details\":{},\"code\":404}\n"
    );
    let patch = json!({"ephemeralContainers": [{"name": "e", "image": "busybox"}]});
    let resp = Client::admin(&f).patch(path, "application/strategic-merge-patch+json", &patch);
    assert_eq!(resp.code, 404);
    let resp = Client::node(&f).get(path);
    assert_eq!(resp.code, 403);
    assert_eq!(
        resp.json()["message"],
        "pods \"dbg\" is forbidden: User \"system:node:edge-1\" cannot get resource \"pods/ephemeralcontainers\" in API group \"\" in the namespace \"default\""
    );
    // Through the pod itself: dropped as well.
    let resp = Client::admin(&f).patch(
        "/api/v1/namespaces/default/pods/dbg",
        "application/strategic-merge-patch+json",
        &json!({"spec": patch}),
    );
    assert_eq!(resp.code, 200, "{}", resp.text());
    assert!(resp.json()["spec"].get("ephemeralContainers").is_none());
    assert!(!f.add_ephemeral_container("default", "dbg", json!({"name": "e", "image": "x"})));
    assert!(f.pod("default", "dbg").unwrap()["spec"]
        .get("ephemeralContainers")
        .is_none());
}

/// `pods/<name>/ephemeralcontainers` (v1.20 with the EphemeralContainers
/// gate on, as `kubectl debug` uses it): GET gives an EphemeralContainers
/// object, a strategic merge patch adds a container and the pod's watchers
/// see the change, and removing or changing one that is there, or a
/// duplicate name, is 422 Invalid.
#[test]
fn ephemeral_containers_subresource_only_adds() {
    let f = fake();
    f.set_ephemeral_containers(true);
    f.create_pod(pod("dbg", "edge-1"));
    let mut c = Client::admin(&f);
    let path = "/api/v1/namespaces/default/pods/dbg/ephemeralcontainers";
    let view = c.get(path).json();
    assert_eq!(view["kind"], "EphemeralContainers", "{view}");
    assert_eq!(view["ephemeralContainers"], json!([]));

    let debugger = json!({"name": "debugger", "image": "busybox"});
    let r = c.patch(
        path,
        "application/strategic-merge-patch+json",
        &json!({"ephemeralContainers": [debugger]}),
    );
    assert_eq!(r.code, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["ephemeralContainers"][0]["name"], "debugger");
    let p = f.pod("default", "dbg").unwrap();
    assert_eq!(p["spec"]["ephemeralContainers"][0]["name"], "debugger");
    assert_eq!(p["spec"]["containers"][0]["name"], "c");

    let mut view = c.get(path).json();
    view["ephemeralContainers"] = json!([]);
    let r = c.send(
        "PUT",
        path,
        Some("application/json"),
        view.to_string().as_bytes(),
    );
    assert_eq!(r.code, 422, "removing one");
    view["ephemeralContainers"] = json!([{"name": "debugger", "image": "other"}]);
    let r = c.send(
        "PUT",
        path,
        Some("application/json"),
        view.to_string().as_bytes(),
    );
    assert_eq!(r.code, 422, "changing one");
    assert!(!f.add_ephemeral_container("default", "dbg", json!({"name": "c", "image": "x"})));
    assert!(f.add_ephemeral_container("default", "dbg", json!({"name": "d2", "image": "x"})));
    assert_eq!(
        f.pod("default", "dbg").unwrap()["spec"]["ephemeralContainers"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
}

// ---------------------------------------------------------------------------
// HTTP/2 (ALPN "h2" on the TLS fake), with curl and by hand

/// A TLS fake with the node and admin tokens, and its CA in a file.
fn tls_fake(http2: bool) -> (FakeApiServer, tempfile::TempDir) {
    let f = if http2 {
        FakeApiServer::start_tls()
    } else {
        FakeApiServer::start_tls_http1_only()
    };
    f.add_token(NODE_TOKEN, "system:node:edge-1", &["system:nodes"]);
    f.add_token(ADMIN_TOKEN, "admin", &["system:masters"]);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ca.crt"), f.ca_pem().unwrap()).unwrap();
    (f, dir)
}

/// What curl got: the HTTP version it spoke ("2", "1.1"), the status,
/// the response header names in order, and the body.
struct Curled {
    version: String,
    code: u16,
    header_names: Vec<String>,
    body: String,
}

/// Runs `curl <args> -H 'Authorization: Bearer <token>' <fake><target>`
/// against a TLS fake whose CA is `dir/ca.crt`.
fn curl(f: &FakeApiServer, dir: &Path, token: &str, args: &[&str], target: &str) -> Curled {
    let ca = dir.join("ca.crt");
    let out = std::process::Command::new("curl")
        .args(["-sS", "--max-time", "20", "--cacert"])
        .arg(&ca)
        .args(["-H", &format!("Authorization: Bearer {token}")])
        .args(["-D", "-", "-w", "\n%{http_version} %{http_code}"])
        .args(args)
        .arg(format!("{}{target}", f.url()))
        .output()
        .unwrap_or_else(|e| {
            panic!("the HTTP/2 tests of the fake apiserver run curl (apt-get install curl): {e}")
        });
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "curl {args:?} {target}: {}{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (rest, last) = text.rsplit_once('\n').unwrap();
    let (version, code) = last.split_once(' ').unwrap();
    let (head, body) = rest.split_once("\r\n\r\n").unwrap();
    Curled {
        version: version.to_string(),
        code: code.parse().unwrap(),
        header_names: header_list(head.split("\r\n").skip(1))
            .into_iter()
            .map(|(k, _)| k)
            .collect(),
        body: body.to_string(),
    }
}

#[test]
fn http2_version_lease_patches_and_watches_over_curl() {
    const LEASE: &str = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/edge-1";
    let (f, dir) = tls_fake(true);
    let d = dir.path();

    // (a) /version over h2, with the header names of fixture 14b in its order.
    let v = curl(&f, d, NODE_TOKEN, &["--http2"], "/version");
    assert_eq!((v.version.as_str(), v.code), ("2", 200), "{}", v.body);
    assert_eq!(
        v.header_names,
        header_names(&Fixture::load("14b-http2-version").resp_headers, true)
    );
    let version: Value = serde_json::from_str(&v.body).unwrap();
    assert_eq!(version["gitVersion"], "v1.20.2");
    let last = f.requests().pop().unwrap();
    assert_eq!(
        (last.verb.as_str(), last.path.as_str()),
        ("GET", "/version")
    );
    assert!(last.http2);
    assert_eq!(last.user, "system:node:edge-1");

    // (c) --http1.1 on the same fake stays HTTP/1.1.
    let v = curl(&f, d, NODE_TOKEN, &["--http1.1"], "/version");
    assert_eq!((v.version.as_str(), v.code), ("1.1", 200));
    assert!(!f.requests().pop().unwrap().http2);

    // (b) A node's lease merge patch: over h2 as over HTTP/1.1.
    let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "edge-1", "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": "edge-1", "leaseDurationSeconds": 40,
                 "renewTime": "2026-11-22T00:45:16.000001Z"}});
    let lease = lease.to_string();
    let create = [
        "--http2",
        "-X",
        "POST",
        "-H",
        "Content-Type: application/json",
        "--data-binary",
        &lease,
    ];
    let leases = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases";
    let c = curl(&f, d, NODE_TOKEN, &create, leases);
    assert_eq!(c.code, 201, "{}", c.body);
    let patch = |http: &str, renew: &str| {
        let body = json!({"spec": {"renewTime": renew}}).to_string();
        let args = [
            http,
            "-X",
            "PATCH",
            "-H",
            "Content-Type: application/merge-patch+json",
            "--data-binary",
            &body,
        ];
        let p = curl(&f, d, NODE_TOKEN, &args, LEASE);
        assert_eq!(p.code, 200, "{http}: {}", p.body);
        let stored = f.lease("edge-1").unwrap();
        assert_eq!(
            serde_json::from_str::<Value>(&p.body).unwrap(),
            stored,
            "{http}"
        );
        let last = f.requests().pop().unwrap();
        assert_eq!(last.verb, "PATCH");
        assert_eq!(last.content_type, "application/merge-patch+json");
        assert_eq!(last.body, body);
        (last.http2, stored)
    };
    let (h2_1, over_1) = patch("--http1.1", "2026-11-22T00:45:26.000001Z");
    let (h2_2, over_2) = patch("--http2", "2026-11-22T00:45:36.000001Z");
    assert_eq!((h2_1, h2_2), (false, true));
    assert_eq!(rv(&over_2), rv(&over_1) + 1);
    let mut expected = over_1.clone();
    expected["spec"]["renewTime"] = json!("2026-11-22T00:45:36.000001Z");
    expected["metadata"]["resourceVersion"] = over_2["metadata"]["resourceVersion"].clone();
    let no_times = |mut v: Value| {
        for e in v["metadata"]["managedFields"].as_array_mut().unwrap() {
            e["time"] = Value::Null;
        }
        v
    };
    assert_eq!(no_times(over_2), no_times(expected));

    // A watch streams over h2 as DATA frames and ends at its timeout.
    f.create_pod(pod("app-1", "edge-1"));
    let w = curl(
        &f,
        d,
        NODE_TOKEN,
        &["--http2"],
        "/api/v1/pods?fieldSelector=spec.nodeName%3Dedge-1&watch=true&timeoutSeconds=1",
    );
    assert_eq!((w.version.as_str(), w.code), ("2", 200));
    assert_eq!(w.header_names, ["cache-control", "content-type", "date"]);
    let events: Vec<Value> = w
        .body
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(types(&events), ["ADDED"]);
    assert!(f.requests().pop().unwrap().http2);

    // A request body above the 256 KiB stream window arrives whole.
    let big = format!(r#"{{"x":"{}"}}"#, "a".repeat(600_000));
    std::fs::write(d.join("big.json"), &big).unwrap();
    let file = format!("@{}", d.join("big.json").display());
    let args = [
        "--http2",
        "-X",
        "POST",
        "-H",
        "Content-Type: application/json",
        "--data-binary",
        &file,
    ];
    let e = curl(
        &f,
        d,
        ADMIN_TOKEN,
        &args,
        "/api/v1/namespaces/default/events",
    );
    assert_eq!(e.version, "2");
    let last = f.requests().pop().unwrap();
    assert!(last.http2);
    assert_eq!(last.body.len(), big.len(), "{}", e.body);

    // A body above Go's 4 KiB handler buffer goes without content-length.
    for i in 0..6 {
        f.create_pod(pod(&format!("app-{}", i + 2), "edge-1"));
    }
    let l = curl(&f, d, NODE_TOKEN, &["--http2"], "/api/v1/pods");
    assert_eq!((l.version.as_str(), l.code), ("2", 200));
    assert!(l.body.len() > 4096);
    assert!(
        !l.header_names.iter().any(|h| h == "content-length"),
        "{:?}",
        l.header_names
    );
    assert_eq!(
        serde_json::from_str::<Value>(&l.body).unwrap()["items"]
            .as_array()
            .unwrap()
            .len(),
        7
    );
}

#[test]
fn http1_only_tls_fake_makes_http2_clients_fall_back() {
    let (f, dir) = tls_fake(false);
    let v = curl(&f, dir.path(), NODE_TOKEN, &["--http2"], "/version");
    assert_eq!((v.version.as_str(), v.code), ("1.1", 200));
    let last = f.requests().pop().unwrap();
    assert!(!last.http2);
    assert_eq!(last.user, "system:node:edge-1");
}

type TlsStream = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// A TLS connection to the fake that negotiated "h2".
fn h2_connect(f: &FakeApiServer) -> TlsStream {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(f.ca_pem().unwrap().as_bytes()).unwrap())
        .unwrap();
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let conn = rustls::ClientConnection::new(
        Arc::new(config),
        ServerName::try_from("127.0.0.1").unwrap().to_owned(),
    )
    .unwrap();
    let tcp = TcpStream::connect(f.addr()).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut s = rustls::StreamOwned::new(conn, tcp);
    while s.conn.is_handshaking() {
        s.conn.complete_io(&mut s.sock).unwrap();
    }
    assert_eq!(s.conn.alpn_protocol(), Some(&b"h2"[..]));
    s
}

fn h2_frame(kind: u8, flags: u8, id: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

fn h2_read(s: &mut TlsStream) -> io::Result<(u8, u8, u32, Vec<u8>)> {
    let mut h = [0u8; 9];
    s.read_exact(&mut h)?;
    let len = u32::from_be_bytes([0, h[0], h[1], h[2]]) as usize;
    let mut p = vec![0; len];
    s.read_exact(&mut p)?;
    Ok((h[3], h[4], u32::from_be_bytes([h[5], h[6], h[7], h[8]]), p))
}

/// Sends `bytes` after the TLS handshake; the error code of the GOAWAY
/// that follows (the connection must then end), None if it closed without.
fn h2_goaway_after(f: &FakeApiServer, bytes: &[u8]) -> Option<u32> {
    let mut s = h2_connect(f);
    s.write_all(bytes).unwrap();
    s.flush().unwrap();
    let mut code = None;
    while let Ok((kind, _, _, p)) = h2_read(&mut s) {
        if kind == 7 {
            code = Some(u32::from_be_bytes([p[4], p[5], p[6], p[7]]));
        }
    }
    code
}

#[test]
fn http2_protocol_errors_end_the_connection_with_goaway() {
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let (f, _dir) = tls_fake(true);
    let settings = h2_frame(4, 0, 0, &[]);
    let after_preface = |rest: &[&[u8]]| [&[PREFACE, &settings[..]][..], rest].concat().concat();

    // HTTP/1.1 where the preface should be.
    assert_eq!(
        h2_goaway_after(&f, b"GET /version HTTP/1.1\r\nHost: x\r\n\r\n"),
        Some(1)
    );
    // Garbage after the preface: the first frame is not SETTINGS.
    let garbage = [PREFACE, &b"\0\0\x04\x09garbage!garbage!"[..]].concat();
    assert_eq!(h2_goaway_after(&f, &garbage), Some(1));
    // A frame above the 256 KiB SETTINGS_MAX_FRAME_SIZE advertised.
    assert_eq!(
        h2_goaway_after(&f, &after_preface(&[b"\x10\0\0\0\0\0\0\0\x01"])),
        Some(6)
    );
    // A header block HPACK cannot decode.
    let bad_block = h2_frame(1, 0x5, 1, &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]);
    assert_eq!(h2_goaway_after(&f, &after_preface(&[&bad_block])), Some(9));
    // Padding longer than the frame, DATA on stream 0, a PING of 3 bytes.
    let bad_pad = h2_frame(1, 0x8 | 0x5, 1, &[200, 0x82]);
    assert_eq!(h2_goaway_after(&f, &after_preface(&[&bad_pad])), Some(1));
    assert_eq!(
        h2_goaway_after(&f, &after_preface(&[&h2_frame(0, 0, 0, b"x")])),
        Some(1)
    );
    assert_eq!(
        h2_goaway_after(&f, &after_preface(&[&h2_frame(6, 0, 0, b"abc")])),
        Some(6)
    );
    // HEADERS interrupted by another stream's frame before its CONTINUATION.
    let mut enc = loona_hpack::Encoder::new();
    let block = enc.encode([(&b":method"[..], &b"GET"[..]), (b":path", b"/version")]);
    let open = h2_frame(1, 0x1, 1, &block);
    let other = h2_frame(2, 0, 3, &[0, 0, 0, 0, 16]);
    assert_eq!(
        h2_goaway_after(&f, &after_preface(&[&open, &other])),
        Some(1)
    );
    assert!(f.requests().is_empty(), "{:?}", f.requests());

    // After all that, a well-behaved connection is served: a PING, then
    // GET /version in a padded HEADERS with priority and a CONTINUATION.
    let mut s = h2_connect(&f);
    let mut enc = loona_hpack::Encoder::new();
    let auth = format!("Bearer {NODE_TOKEN}");
    let block = enc.encode([
        (&b":method"[..], &b"GET"[..]),
        (b":scheme", b"https"),
        (b":authority", b"127.0.0.1"),
        (b":path", b"/version?pretty=1"),
        (b"authorization", auth.as_bytes()),
    ]);
    let (first, rest) = block.split_at(10);
    let mut headers = vec![3u8, 0, 0, 0, 0, 15];
    headers.extend_from_slice(first);
    headers.extend_from_slice(&[0; 3]);
    let request = [
        PREFACE,
        &settings,
        &h2_frame(6, 0, 0, b"pingpong"),
        &h2_frame(1, 0x1 | 0x8 | 0x20, 1, &headers),
        &h2_frame(9, 0x4, 1, rest),
    ]
    .concat();
    s.write_all(&request).unwrap();
    s.flush().unwrap();
    let mut dec = loona_hpack::Decoder::new();
    let (mut status, mut body, mut seen) = (None, Vec::new(), Vec::new());
    loop {
        let (kind, flags, id, p) = h2_read(&mut s).expect("the answer");
        seen.push((kind, flags));
        match kind {
            1 => {
                let fields = dec.decode(&p).unwrap();
                assert_eq!(fields[0].0, b":status");
                status = Some(String::from_utf8(fields[0].1.clone()).unwrap());
            }
            0 => body.extend_from_slice(&p),
            _ => {}
        }
        if id == 1 && flags & 0x1 != 0 && kind <= 1 {
            break;
        }
    }
    assert!(
        seen.contains(&(6, 0x1)),
        "the PING is acknowledged: {seen:?}"
    );
    assert!(
        seen.contains(&(4, 0x1)),
        "our SETTINGS are acknowledged: {seen:?}"
    );
    assert_eq!(status.as_deref(), Some("200"));
    assert_eq!(
        serde_json::from_slice::<Value>(&body).unwrap()["major"],
        "1"
    );
    let last = f.requests().pop().unwrap();
    assert_eq!(
        (last.path.as_str(), last.query.as_str()),
        ("/version", "pretty=1")
    );
    assert!(last.http2);
    assert_eq!(last.user, "system:node:edge-1");

    // Flow control: with a 1000-byte stream window the answer stops there
    // until a WINDOW_UPDATE; a body above 4 KiB ends with an empty DATA.
    for i in 0..4 {
        f.create_pod(pod(&format!("app-{i}"), "edge-1"));
    }
    let block = enc.encode([
        (&b":method"[..], &b"GET"[..]),
        (b":scheme", b"https"),
        (b":authority", b"127.0.0.1"),
        (b":path", b"/api/v1/pods"),
        (b"authorization", auth.as_bytes()),
    ]);
    let small_window = h2_frame(4, 0, 0, &[0, 4, 0, 0, 0x03, 0xe8]);
    let request = [small_window, h2_frame(1, 0x5, 3, &block)].concat();
    s.write_all(&request).unwrap();
    s.flush().unwrap();
    let (mut body, mut fields, mut data_frames) = (Vec::new(), Vec::new(), Vec::new());
    let mut opened = false;
    loop {
        let (kind, flags, id, p) = h2_read(&mut s).expect("the answer");
        match (kind, id) {
            (1, 3) => fields = dec.decode(&p).unwrap(),
            (0, 3) => {
                body.extend_from_slice(&p);
                data_frames.push((p.len(), flags));
            }
            _ => {}
        }
        if body.len() == 1000 && !opened {
            opened = true;
            s.write_all(&h2_frame(8, 0, 3, &1_000_000u32.to_be_bytes()))
                .unwrap();
            s.flush().unwrap();
        }
        assert!(opened || body.len() <= 1000, "past the window");
        if id == 3 && flags & 0x1 != 0 {
            break;
        }
    }
    assert_eq!(data_frames[0], (1000, 0), "{data_frames:?}");
    assert_eq!(data_frames.last(), Some(&(0, 0x1)), "{data_frames:?}");
    assert!(body.len() > 4096);
    let names: Vec<&[u8]> = fields.iter().map(|(k, _)| &k[..]).collect();
    assert!(!names.contains(&&b"content-length"[..]), "{names:?}");
    let list: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(list["items"].as_array().unwrap().len(), 4);
}

#[test]
fn http2_requests_in_the_black_hole_are_recorded_and_never_answered() {
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let (f, _dir) = tls_fake(true);
    let mut s = h2_connect(&f);
    s.write_all(&[PREFACE, &h2_frame(4, 0, 0, &[])].concat())
        .unwrap();
    s.flush().unwrap();
    f.set_black_hole(true);
    let auth = format!("Bearer {NODE_TOKEN}");
    let block = loona_hpack::Encoder::new().encode([
        (&b":method"[..], &b"GET"[..]),
        (b":scheme", b"https"),
        (b":path", b"/version"),
        (b"authorization", auth.as_bytes()),
    ]);
    s.write_all(&h2_frame(1, 0x5, 1, &block)).unwrap();
    s.flush().unwrap();
    s.sock
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let err = loop {
        match h2_read(&mut s) {
            Ok((kind, _, id, _)) => assert!(id != 1, "an answer in the black hole: type {kind}"),
            Err(e) => break e,
        }
    };
    assert!(
        matches!(
            err.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ),
        "{err}"
    );
    let last = f.requests().pop().unwrap();
    assert_eq!(
        (last.path.as_str(), last.status, last.http2),
        ("/version", 0, true)
    );
}

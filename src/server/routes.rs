//! The node API's endpoints by path and port: health checks, `/pods`,
//! `/runningpods/` and `/configz` here, and the dispatch to what other
//! modules serve: metrics and statistics (`crate::metrics`), exec, attach,
//! port-forward and run (`stream`). The main port authenticates and
//! authorizes every request first; the read-only and healthz ports do
//! not, and serve only their few paths.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use log::{debug, error};
use serde_json::{json, Value};

use super::auth::{Auth, User};
use super::head::{query_pairs, RequestHead};
use super::http::{Client, Handler, Next, Port};
use super::route::Route;
use super::sessions::{IdleWriter, Sessions};
use super::stream::{self, StreamKind};
use crate::cri::{ImageService, RuntimeService};
use crate::health::Health;
use crate::kubelet::PodView;
use crate::logs::{self, LogError, LogOptions};
use crate::pleg::{PodCache, RunningPods};
use crate::runtime::ContainerState;
use crate::stats::NodeFacts;
use crate::status::manager::StatusReporter;

/// What the endpoints read: views other threads publish, never a lock
/// held across I/O.
pub(crate) struct State {
    pub(crate) health: Arc<Health>,
    pub(crate) pods: Arc<PodView>,
    pub(crate) statuses: StatusReporter,
    pub(crate) running: Arc<RunningPods>,
    pub(crate) cache: Arc<PodCache>,
    /// `/configz`'s answer, made once at start.
    pub(crate) configz: String,
    pub(crate) auth: Auth,
    pub(crate) runtime: Arc<dyn RuntimeService>,
    pub(crate) images: Arc<dyn ImageService>,
    /// What `/stats/summary` measures besides the runtime's answers.
    pub(crate) node_name: String,
    pub(crate) root_dir: PathBuf,
    pub(crate) logs_dir: PathBuf,
    /// Long sessions by caller, and their idle timeout.
    pub(crate) sessions: Arc<Sessions>,
}

impl Handler for State {
    fn handle(&self, c: &mut Client, head: &RequestHead) -> Next {
        let route = Route::of(head);
        if c.port != Port::Healthz {
            let server_type = if c.port == Port::Main {
                "readwrite"
            } else {
                "readonly"
            };
            crate::metrics::http_request(
                &head.method,
                route.label(),
                server_type,
                route.long_running(),
            );
        }
        // The main port authenticates and authorizes every request first;
        // the other two serve their few paths to anyone.
        let outcome = match (c.port, route) {
            (Port::Healthz, r) if r.is_healthz() => self.healthz(c, r),
            (Port::Healthz, _) => not_found(c),
            (Port::ReadOnly, r) if r.is_healthz() => self.healthz(c, r),
            (Port::ReadOnly, Route::Pods) => self.pods(c, head),
            (Port::ReadOnly, Route::RunningPods) => self.running_pods(c, head),
            (Port::ReadOnly, r) if r.is_stats() => self.stats(c, head, r),
            (Port::ReadOnly, _) => not_found(c),
            (Port::Main, route) => {
                let Some(user) = self.allowed(c, head, route) else {
                    return Next::Close;
                };
                match route {
                    r if r.is_healthz() => self.healthz(c, r),
                    Route::Pods => self.pods(c, head),
                    Route::RunningPods => self.running_pods(c, head),
                    Route::Configz => self.configz(c, head),
                    r if r.is_stats() => self.stats(c, head, r),
                    Route::Run => self.run(c, head),
                    Route::ContainerLogs => return self.container_logs(c, head, &user.name),
                    Route::Stream(kind) => return self.session(c, head, kind, &user.name),
                    _ => not_found(c),
                }
            }
        };
        match outcome {
            Ok(()) => Next::Done,
            Err(e) => {
                debug!(
                    "node API: {} {}: writing the answer: {e}",
                    head.method,
                    head.path()
                );
                Next::Close
            }
        }
    }
}

fn not_found(c: &mut Client) -> std::io::Result<()> {
    c.text(404, "404 page not found\n")
}

impl State {
    /// `/metrics`, `/metrics/probes`, `/metrics/resource` and
    /// `/stats/summary`, rendered when asked.
    fn stats(&self, c: &mut Client, head: &RequestHead, route: Route) -> std::io::Result<()> {
        if !get_only(c, head)? {
            return Ok(());
        }
        const TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";
        let mut out = String::new();
        let made = match route {
            Route::Metrics => {
                crate::metrics::render_metrics(&mut out);
                Ok(())
            }
            Route::ProbeMetrics => {
                crate::metrics::render_probe_metrics(&mut out);
                Ok(())
            }
            Route::ResourceMetrics => {
                crate::stats::render_resource_metrics(&*self.runtime, &mut out)
            }
            _ => {
                let mut facts = NodeFacts::new(&self.node_name, &self.root_dir);
                facts.images = Some(&*self.images);
                facts.logs_dir = &self.logs_dir;
                crate::stats::stats_summary(&*self.runtime, &facts).map(|json| out = json)
            }
        };
        match made {
            Ok(()) if route == Route::StatsSummary => {
                c.respond(200, "application/json", out.as_bytes())
            }
            Ok(()) => c.respond(200, TEXT, out.as_bytes()),
            Err(e) => {
                error!("node API: {}: {e}", head.path());
                c.text(500, "Internal Server Error\n")
            }
        }
    }

    /// `/run/<namespace>/<pod>[/<uid>]/<container>?cmd=...`: runs a
    /// command in the container and answers its output (upstream's older
    /// form of exec, without streams).
    fn run(&self, c: &mut Client, head: &RequestHead) -> std::io::Result<()> {
        if head.method != "POST" {
            return c.text(405, "405: Method Not Allowed");
        }
        match stream::run_in_container(head, &*self.runtime) {
            Ok(out) => c.respond(200, "text/plain", &out),
            Err((code, body)) => c.text(code, &body),
        }
    }

    /// `/containerLogs/<namespace>/<pod>/<container>`: the container's
    /// log as plain text, on a session thread of its own that counts as a
    /// session of `user` in the pod's namespace: a client that takes a
    /// long log just fast enough for the write deadline holds no worker.
    /// With `follow` it goes on until the container ends, the client goes
    /// or nothing was written for the idle timeout.
    fn container_logs(&self, c: &mut Client, head: &RequestHead, user: &str) -> Next {
        let done = |r: std::io::Result<()>| if r.is_ok() { Next::Done } else { Next::Close };
        if head.method != "GET" {
            return done(c.text(405, "405: Method Not Allowed"));
        }
        let segs = head.path_args();
        let (ns, pod, container) = match segs.as_slice() {
            [ns, pod, container] if !ns.is_empty() && !pod.is_empty() && !container.is_empty() => {
                (ns.clone(), pod.clone(), container.clone())
            }
            [_, _] | [_, _, _] => return done(c.text(400, "missing container name")),
            _ => return done(not_found(c)),
        };
        let opts = match LogOptions::from_query(query_pairs(head.query())) {
            Ok(o) => o,
            Err(e) => return done(c.text(400, &e)),
        };
        let follow = opts.follow;
        // Every log answer is a session, counted for its caller; a follow
        // is also closed when idle.
        let slot = match self.sessions.admit(user, &ns) {
            Ok(slot) => slot,
            Err(why) => return done(c.text(429, &why)),
        };
        let idle = if follow { self.sessions.idle() } else { None };
        let runtime = self.runtime.clone();
        let not_started = self.not_started(&ns, &pod, &container);
        let serve = move |c: &mut Client| -> std::io::Result<()> {
            let mut stream = match logs::open(&*runtime, &ns, &pod, &container, &opts) {
                Ok(s) => s,
                Err(LogError::NotFound(m)) => match not_started {
                    Some(why) => return c.text(400, &why),
                    None => return c.text(404, &m),
                },
                Err(LogError::BadRequest(m)) => return c.text(400, &m),
                Err(LogError::Runtime(m)) => {
                    error!("node API: logs of {ns}/{pod}/{container}: {m}");
                    return c.text(500, "Internal Server Error");
                }
            };
            let mut body = IdleWriter::new(c.chunked(200, "text/plain")?, idle);
            stream.copy_to(&mut body)?;
            body.into_inner().finish()
        };
        let what = head.path().to_string();
        Next::Session(Box::new(move |mut client: Client| {
            let _slot = slot;
            if let Err(e) = serve(&mut client) {
                debug!("node API: GET {what}: the log's answer ended: {e}");
            }
        }))
    }

    /// Why a container the node's pod declares has no log yet, in
    /// upstream's words (its `validateContainerLogStatus`), from the pod's
    /// latest status; `None` when the node has no such pod or the pod no
    /// such container (then the runtime's answer stands: 404).
    fn not_started(&self, ns: &str, name: &str, container: &str) -> Option<String> {
        let pods = self.pods.pods();
        let pod = pods.iter().find(|p| {
            p.metadata.name.as_deref() == Some(name)
                && p.metadata.namespace.as_deref().unwrap_or("default") == ns
        })?;
        let spec = pod.spec.as_ref()?;
        let declared = spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .any(|c| c.name == container)
            || spec
                .ephemeral_containers
                .iter()
                .flatten()
                .any(|c| c.name == container);
        if !declared {
            return None;
        }
        let at = format!("container {container:?} in pod {name:?}");
        let status = self
            .statuses
            .status(pod.metadata.uid.as_deref().unwrap_or(""))
            .and_then(|s| {
                s.container_statuses
                    .into_iter()
                    .flatten()
                    .chain(s.init_container_statuses.into_iter().flatten())
                    .chain(s.ephemeral_container_statuses.into_iter().flatten())
                    .find(|c| c.name == container)
            });
        let Some(status) = status else {
            return Some(format!("{at} is not available"));
        };
        let waiting = status.state.as_ref().and_then(|s| s.waiting.as_ref());
        Some(match waiting.and_then(|w| w.reason.as_deref()) {
            Some("ErrImagePull") => format!("{at} is waiting to start: image can't be pulled"),
            Some("ImagePullBackOff") => {
                format!("{at} is waiting to start: trying and failing to pull image")
            }
            Some(reason) => format!("{at} is waiting to start: {reason}"),
            None if waiting.is_some() => format!("{at} is waiting to start: "),
            None => format!("{at} is waiting to start - no logs yet"),
        })
    }

    /// Exec, attach and port-forward: the rest of the connection goes to
    /// a session thread that relays it to the runtime's streaming server.
    /// Each counts as a session of `user` on the pod's namespace (the
    /// path's first element after the kind), refused with 429 past the
    /// caller's share.
    fn session(&self, c: &mut Client, head: &RequestHead, kind: StreamKind, user: &str) -> Next {
        let mut head = head.clone();
        // A bearer token in the WebSocket protocol was for this node only.
        super::auth::strip_token_protocol(&mut head);
        let runtime = self.runtime.clone();
        c.keep_alive = false;
        let namespace = head.path_args().into_iter().next().unwrap_or_default();
        let slot = match self.sessions.admit(user, &namespace) {
            Ok(slot) => slot,
            Err(why) => {
                let _ = c.text(429, &why);
                return Next::Close;
            }
        };
        let idle = self.sessions.idle();
        Next::Session(Box::new(move |mut client: Client| {
            let _slot = slot;
            // What the client sent right after its request (a SPDY client
            // may open its streams before the answer) goes first.
            let early = client.take_read_ahead();
            if let Err(e) = stream::serve(kind, client.conn, &head, &early, &*runtime, idle) {
                debug!(
                    "node API: {} {}: session ended: {e}",
                    head.method,
                    head.path()
                );
            }
        }))
    }

    /// Authenticates and authorizes a main-port request: the user when it
    /// may go on. A refusal is answered (401, 403, or 500 for an
    /// authorization error), logged, with no more detail than upstream
    /// gives.
    fn allowed(&self, c: &mut Client, head: &RequestHead, route: Route) -> Option<User> {
        let cert = c.peer_cert();
        let refuse = |c: &mut Client, status: u16, body: &str| {
            c.keep_alive = false;
            let _ = c.text(status, body);
            None
        };
        let user = match self.auth.authenticate(cert.as_deref(), head) {
            Ok(Some(u)) => u,
            Ok(None) => match self.auth.anonymous() {
                Some(u) => u,
                None => return refuse(c, 401, "Unauthorized"),
            },
            // As upstream: a credential that fails (an unknown token, a
            // TokenReview that could not be made) is 401, never anonymous.
            Err(e) => {
                error!(
                    "node API: authenticating {} {}: {e}",
                    head.method,
                    head.path()
                );
                return refuse(c, 401, "Unauthorized");
            }
        };
        match self.auth.authorize_route(&user, &head.method, route) {
            Ok(d) if d.allowed => Some(user),
            Ok(d) => {
                debug!(
                    "node API: {} {} refused for {}: {}",
                    head.method,
                    head.path(),
                    user.name,
                    d.reason
                );
                let msg = format!(
                    "Forbidden (user={}, verb={}, resource={}, subresource={})",
                    user.name, d.verb, d.resource, d.subresource
                );
                refuse(c, 403, &msg)
            }
            // As upstream words it: who asked for what, not why it failed.
            Err(e) => {
                error!("node API: authorizing {} {}: {e}", head.method, head.path());
                let (verb, subresource) = super::auth::attributes(&head.method, route);
                let msg = format!(
                    "Authorization error (user={}, verb={verb}, resource=nodes, subresource={subresource})",
                    user.name
                );
                refuse(c, 500, &msg)
            }
        }
    }

    /// `/healthz` (ping, log, syncloop and pleg checks), `/healthz/ping`
    /// and `/healthz/syncloop`, as upstream's healthz handlers answer.
    fn healthz(&self, c: &mut Client, route: Route) -> std::io::Result<()> {
        let now = Instant::now();
        match route {
            Route::HealthzPing => c.text(200, "ok"),
            Route::HealthzSyncLoop => match self.health.check_sync_loop(now) {
                Ok(()) => c.text(200, "ok"),
                Err(e) => c.text(500, &format!("internal server error: {e}\n")),
            },
            _ => {
                let checks = [
                    ("ping", Ok(())),
                    ("log", Ok(())),
                    ("syncloop", self.health.check_sync_loop(now)),
                    ("pleg", self.health.check_pleg(now)),
                ];
                if checks.iter().all(|(_, r)| r.is_ok()) {
                    return c.text(200, "ok");
                }
                let mut body = String::new();
                for (name, r) in &checks {
                    match r {
                        Ok(()) => body.push_str(&format!("[+]{name} ok\n")),
                        Err(e) => body.push_str(&format!("[-]{name} failed: {e}\n")),
                    }
                }
                body.push_str("healthz check failed\n");
                c.text(500, &body)
            }
        }
    }

    /// `/pods`: the pods the node runs, each with its latest status.
    fn pods(&self, c: &mut Client, head: &RequestHead) -> std::io::Result<()> {
        if !get_only(c, head)? {
            return Ok(());
        }
        let pods = self.pods.pods();
        let mut items = Vec::with_capacity(pods.len());
        for pod in pods.iter() {
            let mut v = serde_json::to_value(&**pod).unwrap_or(Value::Null);
            let uid = pod.metadata.uid.as_deref().unwrap_or("");
            if let Some(status) = self.statuses.status(uid) {
                if let (Value::Object(m), Ok(s)) = (&mut v, serde_json::to_value(status)) {
                    m.insert("status".into(), s);
                }
            }
            items.push(v);
        }
        json_answer(c, &pod_list(items))
    }

    /// `/runningpods/`: the pods the runtime runs, by the last relist.
    fn running_pods(&self, c: &mut Client, head: &RequestHead) -> std::io::Result<()> {
        if !get_only(c, head)? {
            return Ok(());
        }
        let running = self.running.pods();
        let mut items = Vec::new();
        for pod in running.iter() {
            let live = pod
                .sandboxes
                .iter()
                .chain(&pod.containers)
                .any(|c| c.state == ContainerState::Running);
            if !live {
                continue;
            }
            let status = self.cache.get(&pod.uid).0;
            let containers: Vec<Value> = pod
                .containers
                .iter()
                .filter(|c| c.state == ContainerState::Running)
                .map(|rc| {
                    let image = status
                        .container_statuses
                        .iter()
                        .find(|s| s.id == rc.id)
                        .map_or("", |s| s.image.as_str());
                    json!({"name": rc.name, "image": image, "resources": {}})
                })
                .collect();
            items.push(json!({
                "metadata": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid,
                             "creationTimestamp": null},
                "spec": {"containers": containers},
                "status": {},
            }));
        }
        json_answer(c, &pod_list(items))
    }

    fn configz(&self, c: &mut Client, head: &RequestHead) -> std::io::Result<()> {
        if !get_only(c, head)? {
            return Ok(());
        }
        c.respond(200, "application/json", self.configz.as_bytes())
    }
}

/// Answers 405 to anything but GET; true when the request may go on.
fn get_only(c: &mut Client, head: &RequestHead) -> std::io::Result<bool> {
    if head.method == "GET" {
        return Ok(true);
    }
    c.text(405, "Method Not Allowed\n")?;
    Ok(false)
}

fn pod_list(items: Vec<Value>) -> Value {
    json!({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items})
}

fn json_answer(c: &mut Client, v: &Value) -> std::io::Result<()> {
    let body = serde_json::to_vec(v).unwrap_or_default();
    c.respond(200, "application/json", &body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::time::Duration;

    fn ask(state: &State, port: Port, path: &str) -> String {
        ask_with(state, port, "GET", path)
    }

    fn ask_with(state: &State, port: Port, method: &str, path: &str) -> String {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut peer = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (server_side, _) = l.accept().unwrap();
        let mut c = Client::detached(super::super::conn::Conn::Plain(server_side), port);
        let head = RequestHead {
            method: method.into(),
            target: path.into(),
            headers: Vec::new(),
        };
        state.handle(&mut c, &head);
        drop(c);
        let mut out = String::new();
        peer.read_to_string(&mut out).unwrap();
        out
    }

    fn state(health: Arc<Health>) -> State {
        let fake = Arc::new(crate::runtime::fake::FakeRuntime::default());
        State {
            health,
            pods: Arc::new(PodView::default()),
            statuses: StatusReporter::standalone(),
            running: Arc::new(RunningPods::default()),
            cache: PodCache::new(),
            configz: "{}".into(),
            auth: Auth::new(Default::default(), None),
            runtime: fake.clone(),
            images: fake,
            node_name: "edge-1".into(),
            root_dir: "/nonexistent".into(),
            logs_dir: "/nonexistent".into(),
            sessions: Sessions::new(Duration::from_secs(3600)),
        }
    }

    #[test]
    fn healthz_fails_with_the_reason_when_the_sync_loop_is_stuck() {
        let health = Arc::new(Health::new(Duration::from_secs(60)));
        let state = state(health.clone());
        let now = Instant::now();
        health.sync_loop_turned_at(now);
        health.relisted_at(now);
        let ok = ask(&state, Port::Healthz, "/healthz");
        assert!(
            ok.starts_with("HTTP/1.1 200 OK") && ok.ends_with("\r\n\r\nok"),
            "{ok}"
        );
        // The loop's last turn ten minutes ago (stamped as if now were later).
        let stale = now.checked_sub(Duration::from_secs(600));
        if let Some(stale) = stale {
            health.sync_loop_turned_at(stale);
            let bad = ask(&state, Port::Healthz, "/healthz");
            assert!(bad.starts_with("HTTP/1.1 500 "), "{bad}");
            assert!(
                bad.contains("[-]syncloop failed: sync Loop took longer than expected"),
                "{bad}"
            );
            assert!(bad.contains("[+]pleg ok"), "{bad}");
            let one = ask(&state, Port::Healthz, "/healthz/syncloop");
            assert!(one.starts_with("HTTP/1.1 500 "), "{one}");
            assert!(ask(&state, Port::Healthz, "/healthz/ping").ends_with("ok"));
        }
        assert!(ask(&state, Port::Healthz, "/pods").starts_with("HTTP/1.1 404 "));
        assert!(ask(&state, Port::Main, "/pods").starts_with("HTTP/1.1 401 "));
    }

    /// Each port serves its own paths, by their route (the path decoded as
    /// Go's URL.Path is): the main port answers nothing, not even health,
    /// before it has authenticated the caller.
    #[test]
    fn each_port_serves_its_routes_and_the_main_port_authenticates_all() {
        let health = Arc::new(Health::new(Duration::from_secs(60)));
        let state = state(health.clone());
        let now = Instant::now();
        health.sync_loop_turned_at(now);
        health.relisted_at(now);
        let code = |port, path: &str| ask(&state, port, path)[9..12].to_string();
        for path in ["/healthz", "/healthz/ping", "/%68ealthz"] {
            assert_eq!(code(Port::Healthz, path), "200", "{path}");
            assert_eq!(code(Port::ReadOnly, path), "200", "{path}");
        }
        for path in ["/pods", "/runningpods/", "/%70ods", "/metrics"] {
            assert_eq!(code(Port::Healthz, path), "404", "{path}");
            assert_eq!(code(Port::ReadOnly, path), "200", "{path}");
        }
        for path in ["/configz", "/exec/a/b/c", "/containerLogs/a/b/c", "/logs/"] {
            assert_eq!(code(Port::ReadOnly, path), "404", "{path}");
        }
        for path in [
            "/healthz",
            "/pods",
            "/configz",
            "/metrics",
            "/exec/a/b/c",
            "/nothing",
        ] {
            assert_eq!(code(Port::Main, path), "401", "{path}");
        }
    }

    /// Requests with made-up paths and methods, refused before anyone
    /// authenticated them, leave `kubelet_http_requests_total` with
    /// upstream's buckets only: a flood cannot grow the node's memory.
    #[test]
    fn unauthenticated_floods_count_as_other_in_bounded_series() {
        let state = state(Arc::new(Health::new(Duration::from_secs(60))));
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for i in 0..600 {
            let (a, b) = (next(), next());
            let method = match i % 4 {
                0 => "GET".to_string(),
                1 => format!("M{a:x}"),
                2 => "PATCH".to_string(),
                _ => format!("{b:X}"),
            };
            let path = match i % 3 {
                0 => format!("/{a:x}/{b:x}"),
                1 => format!("/metrics/{a:x}"),
                _ => format!("/pods{b:x}"),
            };
            let port = if i % 2 == 0 {
                Port::Main
            } else {
                Port::ReadOnly
            };
            let answer = ask_with(&state, port, &method, &path);
            assert!(answer.starts_with("HTTP/1.1 "), "{answer}");
        }
        let methods = [
            "OPTIONS", "GET", "HEAD", "POST", "PUT", "DELETE", "TRACE", "CONNECT", "other",
        ];
        let roots = [
            "healthz",
            "pods",
            "stats",
            "metrics",
            "metrics/cadvisor",
            "metrics/probes",
            "metrics/resource",
            "checkpoint",
            "run",
            "exec",
            "attach",
            "portForward",
            "containerLogs",
            "configz",
            "runningpods",
            "pprof",
            "logs",
            "debug",
            "other",
        ];
        let series = crate::metrics::http_request_series();
        for labels in &series {
            let [method, path, server_type, long] = labels.as_slice() else {
                panic!("{labels:?}");
            };
            assert!(methods.contains(&method.as_str()), "{labels:?}");
            assert!(roots.contains(&path.as_str()), "{labels:?}");
            assert!(["readonly", "readwrite"].contains(&server_type.as_str()));
            assert!(["true", "false"].contains(&long.as_str()));
        }
        // Methods by server type by long-running, and a few dozen roots.
        assert!(series.len() <= 9 * 2 * 2 * 19, "{} series", series.len());
        for (method, port) in [
            ("other", "readwrite"),
            ("other", "readonly"),
            ("GET", "readwrite"),
        ] {
            assert!(
                series
                    .iter()
                    .any(|l| l[0] == method && l[1] == "other" && l[2] == port),
                "no {method} other {port} series in {series:?}"
            );
        }
    }

    /// Exec, attach and port-forward count against the caller's share in
    /// the pod's namespace, as log follows do: past it the request is
    /// answered 429 before any session starts; another namespace is
    /// another share.
    #[test]
    fn streams_past_the_callers_share_are_refused_before_a_session_starts() {
        let mut state = state(Arc::new(Health::new(Duration::from_secs(60))));
        state.auth = Auth::new(
            crate::options::AuthConfig {
                anonymous: true,
                mode: Some(crate::options::AuthorizationMode::AlwaysAllow),
                ..Default::default()
            },
            None,
        );
        let kept = std::cell::RefCell::new(Vec::new());
        let ask = |target: &str| {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let mut peer = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let (server_side, _) = l.accept().unwrap();
            let mut c = Client::detached(super::super::conn::Conn::Plain(server_side), Port::Main);
            let head = RequestHead {
                method: "GET".into(),
                target: target.into(),
                headers: Vec::new(),
            };
            match state.handle(&mut c, &head) {
                Next::Session(run) => {
                    kept.borrow_mut().push((run, peer));
                    None
                }
                _ => {
                    drop(c);
                    let mut out = String::new();
                    peer.read_to_string(&mut out).unwrap();
                    Some(out)
                }
            }
        };
        // A plain log answer is a session too: a slow reader of a long log
        // holds a session thread of its caller's share, never a worker.
        let targets = [
            "/exec/team-a/web/app?command=sh",
            "/attach/team-a/web/app",
            "/portForward/team-a/web",
            "/containerLogs/team-a/web/app",
        ];
        for i in 0..crate::server::sessions::PER_NAMESPACE {
            assert_eq!(ask(targets[i % 4]), None, "session {i}");
        }
        let refused = ask("/containerLogs/team-a/web/app?tailLines=1").expect("a refusal");
        assert!(
            refused.starts_with("HTTP/1.1 429 Too Many Requests"),
            "{refused}"
        );
        let refused = ask("/exec/team-a/web/app?command=sh").expect("a refusal");
        assert!(
            refused.starts_with("HTTP/1.1 429 Too Many Requests"),
            "{refused}"
        );
        assert!(
            refused.contains("\"system:anonymous\"") && refused.contains("\"team-a\""),
            "{refused}"
        );
        assert_eq!(ask("/portForward/team-b/db"), None);
        // A session that never ran (the node had no thread for it) gives
        // its place back.
        drop(kept.borrow_mut().remove(0));
        assert_eq!(ask("/attach/team-a/web/app"), None);
    }
}

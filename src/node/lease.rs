//! The node lease (upstream `nodelease`): `kube-node-lease/<node>`, created
//! when missing and renewed every quarter of its duration by the
//! `node-lease` thread, with the Node as its owner once the Node's UID is
//! known. A renewal that fails is retried a few times with back-off and
//! then waits for the next interval; a 404 or a 409 Conflict reads the
//! lease anew (and a 404 there creates it).
//!
//! A renewal is a JSON merge patch of `spec.renewTime` alone, plus the
//! holder, the duration or the owner when the lease last returned lacks
//! them as the node wants them: the Node authorizer, the `system:node` role
//! and NodeRestriction all let a node patch its own lease (v1.20:
//! `authorizeLease`, `NodeRules`, `admitLease`). It carries no
//! resourceVersion: the lease is the node's alone, and the last renewal
//! wins. A server that refuses the patch (403, 405, 415) and takes the PUT
//! upstream's kubelet sends (the whole lease at the resourceVersion read) is
//! renewed by PUT from then on, said once in the log. Of each answer only
//! the holder, the duration and whether there is an owner are decoded; the
//! whole object is kept (without managedFields) only for PUTs. A patch's
//! answer is asked for in protobuf (the JSON one is the whole Lease with
//! its managedFields, three times the bytes, and renewals are most of an
//! idle node's traffic); a server that has none answers JSON.
//!
//! Heartbeats are how the node learns that the link to the apiserver is
//! broken: from the second failed attempt in a row on (upstream's
//! `onRepeatedHeartbeatFailure`), every connection of the client is closed,
//! so watches and requests stuck on a connection that went silent start
//! over instead of waiting minutes for their read deadlines. The first
//! renewal after failures tells the node status thread (a bounded(1)
//! channel: recoveries not yet seen coalesce into one), which answers by
//! comparing its status with the server's.

use std::time::{Duration, SystemTime};

use crossbeam_channel::{bounded, Receiver, Sender};
use log::{debug, info, warn};
use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::NodeStateReader;
use crate::apitime::micro_time;
use crate::kube::{ApiError, Client, ErrorKind, PatchKind};
use crate::thread::{spawn_named, JoinOnDrop};

pub(crate) const LEASE_NAMESPACE: &str = "kube-node-lease";
/// Attempts of one renewal before waiting for the next interval (upstream: 5).
const MAX_TRIES: u32 = 5;

/// Handle of the `node-lease` thread; dropping it stops and joins the thread.
pub(crate) struct LeaseController {
    _stop: Sender<()>,
    _thread: JoinOnDrop<()>,
}

impl LeaseController {
    pub(crate) fn start(
        client: Client,
        node: String,
        duration_secs: u32,
        state: NodeStateReader,
        recovered: Sender<()>,
    ) -> std::io::Result<LeaseController> {
        let (stop_tx, stop_rx) = bounded(0);
        let thread = spawn_named("node-lease", move || {
            let mut lease = Lease {
                client,
                node,
                duration_secs,
                state,
                recovered,
                current: None,
                by_put: false,
            };
            lease.run(stop_rx)
        })?;
        Ok(LeaseController {
            _stop: stop_tx,
            _thread: thread,
        })
    }
}

struct Lease {
    client: Client,
    node: String,
    duration_secs: u32,
    /// The node's UID, for the lease's owner.
    state: NodeStateReader,
    /// Told of each renewal that succeeds after failures.
    recovered: Sender<()>,
    /// The lease as the server last returned it; none until it is read or
    /// created, and again after a 404 or a 409.
    current: Option<Current>,
    /// Renewals go by PUT: a server refused the merge patch and took the PUT.
    by_put: bool,
}

pub(crate) fn lease_path(node: &str) -> String {
    format!("/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases/{node}")
}

impl Lease {
    fn run(&mut self, stop: Receiver<()>) {
        let interval = Duration::from_secs(u64::from(self.duration_secs.max(4)) / 4);
        let mut failing = false;
        // Whether connections were closed during this run of failures (it
        // is logged once).
        let mut closed = false;
        loop {
            let mut delay = Duration::from_millis(200);
            let mut ok = false;
            for attempt in 1..=MAX_TRIES {
                match self.renew() {
                    Ok(()) => {
                        ok = true;
                        break;
                    }
                    Err(e) => {
                        if !failing || attempt == MAX_TRIES {
                            warn!("node lease: {e} (attempt {attempt} of {MAX_TRIES})");
                        }
                        if attempt > 1 && e.is_transport() {
                            if !closed {
                                warn!(
                                    "node lease: renewals keep failing; closing every connection \
                                     to the API server so that hung requests and watches start over"
                                );
                            }
                            closed = true;
                            self.client.close_all_connections();
                        }
                        failing = true;
                        if e.is_conflict() || e.is_not_found() {
                            self.current = None;
                        }
                        if !sleep(&stop, delay) {
                            return;
                        }
                        delay = (delay * 2).min(Duration::from_secs(7));
                    }
                }
            }
            if ok && failing {
                info!("node lease: renewed again");
                failing = false;
                closed = false;
                // Full: a recovery not yet seen stands for this one too.
                let _ = self.recovered.try_send(());
            }
            if !sleep(&stop, interval) {
                return;
            }
        }
    }

    fn desired_owner(&self) -> Option<Value> {
        let uid = self.state.read().uid.clone()?;
        Some(json!([{"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": uid}]))
    }

    fn renew(&mut self) -> Result<(), ApiError> {
        if self.current.is_none() && self.read_or_create()? {
            return Ok(());
        }
        let Some(current) = &self.current else {
            return Ok(());
        };
        if self.by_put {
            return self.renew_by_put();
        }
        let patch = self.renewal_patch(&current.held);
        let path = lease_path(&self.node);
        let refusal = match self
            .client
            .patch_compact(&path, PatchKind::Merge, &patch)
            .and_then(|answer| Held::from_answer(&path, &answer))
        {
            Ok(held) => {
                debug!("node lease renewed");
                self.current = Some(Current { held, object: None });
                return Ok(());
            }
            Err(e) if refuses_patch(&e) => e,
            Err(e) => return Err(e),
        };
        // A server that does not take merge patches of leases (or a proxy
        // in front of it that refuses the method) may still take the PUT
        // every kubelet sends. Only when it does is the refusal about the
        // patch; otherwise the refusal is this renewal's error.
        match self.renew_by_put() {
            Ok(()) => {
                warn!(
                    "node lease: the API server refused a merge patch of the lease ({refusal}) \
                     but took a PUT; renewing it by PUT from now on"
                );
                self.by_put = true;
                Ok(())
            }
            Err(e) => {
                debug!("node lease: the PUT after the refused patch: {e}");
                if e.is_conflict() || e.is_not_found() {
                    self.current = None;
                }
                Err(refusal)
            }
        }
    }

    /// The merge patch of one renewal: `spec.renewTime`, and whatever else
    /// the lease last returned does not have as the node wants it.
    fn renewal_patch(&self, held: &Held) -> Value {
        let mut spec = Map::new();
        spec.insert("renewTime".into(), json!(micro_time(SystemTime::now())));
        if held.spec.holder_identity.as_deref() != Some(self.node.as_str()) {
            spec.insert("holderIdentity".into(), json!(self.node));
        }
        if held.spec.lease_duration_seconds != Some(i64::from(self.duration_secs)) {
            spec.insert("leaseDurationSeconds".into(), json!(self.duration_secs));
        }
        let mut patch = json!({ "spec": spec });
        if !held.has_owner() {
            if let Some(owner) = self.desired_owner() {
                patch["metadata"] = json!({ "ownerReferences": owner });
            }
        }
        patch
    }

    /// Reads the lease, or creates it when there is none (true: created,
    /// which renews it too).
    fn read_or_create(&mut self) -> Result<bool, ApiError> {
        let path = lease_path(&self.node);
        match self.client.get(&path) {
            Ok(lease) => {
                self.current = Some(Current::from_object("GET", &path, lease)?);
                Ok(false)
            }
            Err(e) if e.is_not_found() => {
                let mut meta = json!({"name": self.node, "namespace": LEASE_NAMESPACE});
                if let Some(owner) = self.desired_owner() {
                    meta["ownerReferences"] = owner;
                }
                let body = json!({
                    "kind": "Lease",
                    "apiVersion": "coordination.k8s.io/v1",
                    "metadata": meta,
                    "spec": {
                        "holderIdentity": self.node,
                        "leaseDurationSeconds": self.duration_secs,
                        "renewTime": micro_time(SystemTime::now()),
                    }
                });
                let leases =
                    format!("/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases");
                let created = self.client.create(&leases, &body)?;
                info!("node lease {LEASE_NAMESPACE}/{} created", self.node);
                self.current = Some(Current::from_object("POST", &leases, created)?);
                Ok(true)
            }
            Err(e) => Err(e),
        }
    }

    /// Renews by PUT of the whole lease, with the resourceVersion it was
    /// read at (what upstream's kubelet sends), reading it first when only
    /// a patch's answer is known.
    fn renew_by_put(&mut self) -> Result<(), ApiError> {
        let path = lease_path(&self.node);
        let mut lease = match self.current.as_ref().and_then(|c| c.object.clone()) {
            Some(object) => object,
            None => self.client.get(&path)?,
        };
        if let Some(meta) = lease.get_mut("metadata").and_then(Value::as_object_mut) {
            // Only what a renewal needs: no managedFields echoed back.
            meta.remove("managedFields");
            let has_owner = meta
                .get("ownerReferences")
                .and_then(Value::as_array)
                .is_some_and(|a| !a.is_empty());
            if !has_owner {
                if let Some(owner) = self.desired_owner() {
                    meta.insert("ownerReferences".into(), owner);
                }
            }
        }
        lease["kind"] = json!("Lease");
        lease["apiVersion"] = json!("coordination.k8s.io/v1");
        if !lease.get("spec").is_some_and(Value::is_object) {
            lease["spec"] = json!({});
        }
        lease["spec"]["holderIdentity"] = json!(self.node);
        lease["spec"]["leaseDurationSeconds"] = json!(self.duration_secs);
        lease["spec"]["renewTime"] = json!(micro_time(SystemTime::now()));
        let updated = self.client.replace(&path, &lease)?;
        debug!("node lease renewed");
        self.current = Some(Current::from_object("PUT", &path, updated)?);
        Ok(())
    }
}

/// A refusal of the PATCH itself rather than of this renewal: 403 (a
/// policy that allows the PUT only), 405 (the method), 415 (the patch type).
fn refuses_patch(e: &ApiError) -> bool {
    matches!(e.code(), Some(403 | 405 | 415))
}

/// The lease as the server last returned it.
struct Current {
    held: Held,
    /// The whole object without its managedFields, kept only for a PUT,
    /// whose body it is.
    object: Option<Value>,
}

impl Current {
    /// `object` as the answer to `verb` on `path`.
    fn from_object(verb: &'static str, path: &str, mut object: Value) -> Result<Current, ApiError> {
        let held = Held::deserialize(&object).map_err(|e| ApiError {
            verb,
            path: path.to_string(),
            kind: ErrorKind::Decode(format!("invalid lease: {e}")),
        })?;
        if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("managedFields");
        }
        Ok(Current {
            held,
            object: Some(object),
        })
    }
}

/// What a renewal compares with what it wants, decoded from the lease
/// (the rest of the object is not kept).
#[derive(Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
struct Held {
    metadata: HeldMeta,
    spec: HeldSpec,
}

#[derive(Debug, Default, Deserialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
struct HeldMeta {
    owner_references: Option<Vec<IgnoredAny>>,
}

#[derive(Debug, Default, Deserialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
struct HeldSpec {
    holder_identity: Option<String>,
    lease_duration_seconds: Option<i64>,
}

impl Held {
    /// A renewal's answer, in protobuf (asked for: a third of the JSON's
    /// bytes, where renewals are most of an idle node's traffic) or JSON.
    fn from_answer(path: &str, answer: &[u8]) -> Result<Held, ApiError> {
        use crate::kube::protobuf;
        let invalid = |e: String| ApiError {
            verb: "PATCH",
            path: path.to_string(),
            kind: ErrorKind::Decode(format!("invalid lease: {e}")),
        };
        if !protobuf::is_protobuf(answer) {
            return serde_json::from_slice(answer).map_err(|e| invalid(e.to_string()));
        }
        let object = protobuf::unwrap(answer).map_err(invalid)?;
        if object.kind != "Lease" {
            return Err(invalid(format!("the answer is a {:?}", object.kind)));
        }
        let fields = protobuf::lease(&object.raw).map_err(invalid)?;
        Ok(Held {
            metadata: HeldMeta {
                // Only whether there is one is kept.
                owner_references: fields.has_owner.then(|| vec![IgnoredAny]),
            },
            spec: HeldSpec {
                holder_identity: fields.holder_identity,
                lease_duration_seconds: fields.lease_duration_seconds,
            },
        })
    }

    fn has_owner(&self) -> bool {
        self.metadata
            .owner_references
            .as_ref()
            .is_some_and(|o| !o.is_empty())
    }
}

/// Waits `d`; false when the thread is told to stop meanwhile.
pub(crate) fn sleep(stop: &Receiver<()>, d: Duration) -> bool {
    matches!(
        stop.recv_timeout(d),
        Err(crossbeam_channel::RecvTimeoutError::Timeout)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::client_for;
    use crate::kube::testserver::{fixture_body, Recorded, Reply, TestServer};
    use crate::node::state::{publish, NodeState};

    const NODE_UID: &str = "27971c80-fa41-4ae5-a48c-9413c1840058";

    fn lease_for(server: &TestServer, duration_secs: u32) -> Lease {
        let (_writer, state) = publish(NodeState {
            name: "edge-1".into(),
            uid: Some(NODE_UID.into()),
            ..NodeState::default()
        });
        Lease {
            client: client_for(server),
            node: "edge-1".into(),
            duration_secs,
            state,
            recovered: bounded(1).0,
            current: None,
            by_put: false,
        }
    }

    fn status(code: u16, reason: &str, message: &str) -> Reply {
        Reply::json(
            code,
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                   "message": message, "reason": reason, "code": code})
            .to_string(),
        )
    }

    fn body(r: &Recorded) -> Value {
        serde_json::from_slice(&r.body).unwrap()
    }

    fn methods(server: &TestServer) -> Vec<String> {
        server.requests().into_iter().map(|r| r.method).collect()
    }

    /// The recorded lease (holder edge-1, 40 s, owned by the Node).
    fn recorded_lease() -> Reply {
        Reply::json(200, fixture_body("03e-lease-get-200"))
    }

    #[test]
    fn a_renewal_is_a_merge_patch_of_the_renew_time_alone() {
        let server = TestServer::start(|r| match r.method.as_str() {
            "GET" => recorded_lease(),
            "PATCH" => Reply::json(200, fixture_body("03c-lease-put-200")),
            _ => status(405, "MethodNotAllowed", "not here"),
        });
        let mut lease = lease_for(&server, 40);
        lease.renew().unwrap();
        lease.renew().unwrap();
        assert_eq!(methods(&server), ["GET", "PATCH", "PATCH"]);
        for r in &server.requests()[1..] {
            assert_eq!(r.target, lease_path("edge-1"));
            assert_eq!(
                r.header("content-type"),
                Some("application/merge-patch+json")
            );
            let patch = body(r);
            let spec = patch["spec"].as_object().unwrap();
            assert_eq!(spec.keys().collect::<Vec<_>>(), ["renewTime"], "{patch}");
            assert_eq!(patch.as_object().unwrap().len(), 1, "{patch}");
            // MicroTime: six fractional digits.
            let t = spec["renewTime"].as_str().unwrap();
            assert_eq!(t.len(), "2026-11-22T00:45:19.793457Z".len(), "{t}");
        }
        // Only what a renewal compares is kept of a patch's answer.
        let current = lease.current.as_ref().unwrap();
        assert!(current.object.is_none());
        assert!(current.held.has_owner());
        assert_eq!(current.held.spec.holder_identity.as_deref(), Some("edge-1"));
    }

    #[test]
    fn what_the_lease_lacks_goes_into_the_patch() {
        // Another holder, another duration, no owner: all three are set.
        let server = TestServer::start(|r| match r.method.as_str() {
            "GET" => Reply::json(
                200,
                json!({"kind": "Lease", "apiVersion": "coordination.k8s.io/v1",
                       "metadata": {"name": "edge-1", "namespace": "kube-node-lease",
                                    "resourceVersion": "7"},
                       "spec": {"holderIdentity": "someone", "leaseDurationSeconds": 15}})
                .to_string(),
            ),
            _ => Reply::json(200, fixture_body("03c-lease-put-200")),
        });
        let mut lease = lease_for(&server, 40);
        lease.renew().unwrap();
        let patch = body(&server.requests()[1]);
        assert_eq!(patch["spec"]["holderIdentity"], "edge-1");
        assert_eq!(patch["spec"]["leaseDurationSeconds"], 40);
        assert!(patch["spec"]["renewTime"].is_string());
        assert_eq!(
            patch["metadata"],
            json!({"ownerReferences": [{"apiVersion": "v1", "kind": "Node",
                                        "name": "edge-1", "uid": NODE_UID}]})
        );
        assert!(patch["metadata"].get("resourceVersion").is_none());
        // The answer has them all: the next patch is the renew time again.
        lease.renew().unwrap();
        let patch = body(&server.requests()[2]);
        assert_eq!(patch.as_object().unwrap().len(), 1, "{patch}");
        assert_eq!(patch["spec"].as_object().unwrap().len(), 1, "{patch}");
    }

    #[test]
    fn a_missing_lease_is_created_and_that_is_the_renewal() {
        let server = TestServer::start(|r| match r.method.as_str() {
            "GET" => Reply::json(404, fixture_body("03a-lease-get-404")),
            "POST" => Reply::json(201, fixture_body("03b-lease-create-201")),
            _ => Reply::json(200, fixture_body("03c-lease-put-200")),
        });
        let mut lease = lease_for(&server, 40);
        lease.renew().unwrap();
        assert_eq!(methods(&server), ["GET", "POST"]);
        let created = body(&server.requests()[1]);
        assert_eq!(created["spec"]["holderIdentity"], "edge-1");
        assert_eq!(created["metadata"]["ownerReferences"][0]["uid"], NODE_UID);
        lease.renew().unwrap();
        assert_eq!(methods(&server), ["GET", "POST", "PATCH"]);
    }

    #[test]
    fn a_server_that_refuses_the_patch_but_takes_the_put_gets_puts() {
        for code in [403, 405, 415] {
            let patches = std::sync::atomic::AtomicUsize::new(0);
            let server = TestServer::start(move |r| match r.method.as_str() {
                "GET" => recorded_lease(),
                "PATCH" if patches.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 => {
                    Reply::json(200, fixture_body("03c-lease-put-200"))
                }
                "PATCH" => status(code, "Refused", "the patch is not taken here"),
                _ => Reply::json(200, fixture_body("03c-lease-put-200")),
            });
            let mut lease = lease_for(&server, 40);
            lease.renew().unwrap();
            lease.renew().unwrap();
            // The refused patch, the lease read for its resourceVersion (a
            // patch's answer is not kept whole), the PUT.
            assert_eq!(
                methods(&server),
                ["GET", "PATCH", "PATCH", "GET", "PUT"],
                "{code}"
            );
            let put = body(&server.requests()[4]);
            assert_eq!(put["metadata"]["resourceVersion"], "394", "{code}");
            assert!(put["metadata"].get("managedFields").is_none(), "{put}");
            assert_eq!(put["spec"]["holderIdentity"], "edge-1");
            assert_eq!(put["spec"]["leaseDurationSeconds"], 40);
            // From then on PUTs of the answer kept, and no more patches.
            lease.renew().unwrap();
            lease.renew().unwrap();
            assert_eq!(
                methods(&server),
                ["GET", "PATCH", "PATCH", "GET", "PUT", "PUT", "PUT"],
                "{code}"
            );
            assert!(lease.by_put);
        }
    }

    #[test]
    fn a_refusal_the_put_shares_is_the_renewals_error() {
        let server = TestServer::start(|r| match r.method.as_str() {
            "GET" => recorded_lease(),
            _ => status(403, "Forbidden", "not this lease"),
        });
        let mut lease = lease_for(&server, 40);
        let e = lease.renew().unwrap_err();
        assert_eq!((e.verb, e.code()), ("PATCH", Some(403)), "{e}");
        assert!(!lease.by_put);
        // The next renewal patches again (the PUT goes from the lease read).
        let _ = lease.renew();
        assert_eq!(methods(&server), ["GET", "PATCH", "PUT", "PATCH", "PUT"]);
    }

    #[test]
    fn other_failures_of_the_patch_are_not_refusals() {
        let server = TestServer::start(|r| match r.method.as_str() {
            "GET" => recorded_lease(),
            "PATCH" => status(404, "NotFound", "leases \"edge-1\" not found"),
            _ => Reply::json(200, fixture_body("03c-lease-put-200")),
        });
        let mut lease = lease_for(&server, 40);
        let e = lease.renew().unwrap_err();
        assert!(e.is_not_found(), "{e}");
        assert_eq!(methods(&server), ["GET", "PATCH"]);
        assert!(!lease.by_put);
    }

    #[test]
    fn an_answer_that_is_not_a_lease_is_an_error() {
        let server = TestServer::start(|r| match r.method.as_str() {
            "GET" => recorded_lease(),
            _ => Reply::json(200, r#"{"spec": {"holderIdentity": 7}}"#),
        });
        let mut lease = lease_for(&server, 40);
        let e = lease.renew().unwrap_err();
        assert!(e.to_string().contains("invalid lease"), "{e}");
    }
}

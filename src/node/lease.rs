//! The node lease (upstream `nodelease`): `kube-node-lease/<node>`, created
//! when missing and renewed every quarter of its duration by the
//! `node-lease` thread, with the Node as its owner once the Node's UID is
//! known. A renewal that fails is retried a few times with back-off and
//! then waits for the next interval; a 409 Conflict fetches the lease anew.
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
use serde_json::{json, Value};

use super::NodeStateReader;
use crate::apitime::micro_time;
use crate::kube::{ApiError, Client};
use crate::thread::{spawn_named, JoinOnDrop};

pub(crate) const LEASE_NAMESPACE: &str = "kube-node-lease";
/// Attempts of one renewal before waiting for the next interval (upstream: 5).
const MAX_TRIES: u32 = 5;

/// Handle of the `node-lease` thread; dropping it stops and joins the thread.
pub struct LeaseController {
    _stop: Sender<()>,
    _thread: JoinOnDrop<()>,
}

impl LeaseController {
    pub fn start(
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
    /// The lease as the server last returned it.
    current: Option<Value>,
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
        let path = lease_path(&self.node);
        if self.current.is_none() {
            match self.client.get(&path) {
                Ok(l) => self.current = Some(l),
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
                    let created = self.client.create(
                        &format!(
                            "/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases"
                        ),
                        &body,
                    )?;
                    info!("node lease {LEASE_NAMESPACE}/{} created", self.node);
                    self.current = Some(created);
                    return Ok(());
                }
                Err(e) => return Err(e),
            }
        }
        let Some(mut lease) = self.current.clone() else {
            return Ok(());
        };
        // Only what a renewal needs: no managedFields or status echoed back.
        if let Some(meta) = lease.get_mut("metadata").and_then(Value::as_object_mut) {
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
        lease["spec"]["holderIdentity"] = json!(self.node);
        lease["spec"]["leaseDurationSeconds"] = json!(self.duration_secs);
        lease["spec"]["renewTime"] = json!(micro_time(SystemTime::now()));
        let updated = self.client.replace(&path, &lease)?;
        debug!("node lease renewed");
        self.current = Some(updated);
        Ok(())
    }
}

/// Waits `d`; false when the thread is told to stop meanwhile.
pub(crate) fn sleep(stop: &Receiver<()>, d: Duration) -> bool {
    matches!(
        stop.recv_timeout(d),
        Err(crossbeam_channel::RecvTimeoutError::Timeout)
    )
}

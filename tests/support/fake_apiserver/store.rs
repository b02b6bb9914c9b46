//! The object store: the resources served, their keys, field and label
//! selectors, and the state behind every answer (objects, the global
//! resourceVersion, the bounded watch history, faults, tokens, access
//! rules).

use super::*;

// ---------------------------------------------------------------------------
// Resources

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) enum Res {
    Pods,
    Nodes,
    Leases,
    Events,
    Secrets,
    ConfigMaps,
    /// Only its `token` subresource (TokenRequest) is served.
    ServiceAccounts,
    Services,
    /// certificates.k8s.io/v1, cluster-scoped.
    CertificateSigningRequests,
}

/// The resource of a plural name; panics on one the fake does not serve.
pub(super) fn res_named(resource: &str) -> Res {
    [
        Res::Pods,
        Res::Nodes,
        Res::Leases,
        Res::Events,
        Res::Secrets,
        Res::ConfigMaps,
        Res::ServiceAccounts,
        Res::Services,
        Res::CertificateSigningRequests,
    ]
    .into_iter()
    .find(|r| r.resource() == resource)
    .unwrap_or_else(|| panic!("the fake apiserver serves no resource {resource:?}"))
}

impl Res {
    pub(super) fn resource(self) -> &'static str {
        match self {
            Res::Pods => "pods",
            Res::Nodes => "nodes",
            Res::Leases => "leases",
            Res::Events => "events",
            Res::Secrets => "secrets",
            Res::ConfigMaps => "configmaps",
            Res::ServiceAccounts => "serviceaccounts",
            Res::Services => "services",
            Res::CertificateSigningRequests => "certificatesigningrequests",
        }
    }
    pub(super) fn group(self) -> &'static str {
        match self {
            Res::Leases => "coordination.k8s.io",
            Res::CertificateSigningRequests => "certificates.k8s.io",
            _ => "",
        }
    }
    pub(super) fn kind(self) -> &'static str {
        match self {
            Res::Pods => "Pod",
            Res::Nodes => "Node",
            Res::Leases => "Lease",
            Res::Events => "Event",
            Res::Secrets => "Secret",
            Res::ConfigMaps => "ConfigMap",
            Res::ServiceAccounts => "ServiceAccount",
            Res::Services => "Service",
            Res::CertificateSigningRequests => "CertificateSigningRequest",
        }
    }
    pub(super) fn api_version(self) -> &'static str {
        match self {
            Res::Leases => "coordination.k8s.io/v1",
            Res::CertificateSigningRequests => "certificates.k8s.io/v1",
            _ => "v1",
        }
    }
    pub(super) fn namespaced(self) -> bool {
        self != Res::Nodes && self != Res::CertificateSigningRequests
    }
    /// `pods`, `leases.coordination.k8s.io`: the GroupResource string.
    pub(super) fn qualified(self) -> String {
        if self.group().is_empty() {
            self.resource().to_string()
        } else {
            format!("{}.{}", self.resource(), self.group())
        }
    }
    fn field_labels(self) -> &'static [&'static str] {
        match self {
            Res::Pods => &[
                "metadata.name",
                "metadata.namespace",
                "spec.nodeName",
                "spec.restartPolicy",
                "spec.schedulerName",
                "spec.serviceAccountName",
                "status.phase",
                "status.podIP",
                "status.nominatedNodeName",
            ],
            Res::Nodes => &["metadata.name", "spec.unschedulable"],
            Res::CertificateSigningRequests => &["metadata.name", "spec.signerName"],
            Res::Leases | Res::ConfigMaps | Res::ServiceAccounts | Res::Services => {
                &["metadata.name", "metadata.namespace"]
            }
            Res::Secrets => &["metadata.name", "metadata.namespace", "type"],
            Res::Events => &[
                "metadata.name",
                "metadata.namespace",
                "involvedObject.kind",
                "involvedObject.namespace",
                "involvedObject.name",
                "involvedObject.uid",
                "involvedObject.apiVersion",
                "involvedObject.resourceVersion",
                "involvedObject.fieldPath",
                "reason",
                "reportingComponent",
                "source",
                "type",
            ],
        }
    }
    /// The object a 1.20 bookmark carries: the empty typed object with only
    /// the resourceVersion set.
    pub(super) fn bookmark(self, rv: u64) -> String {
        let meta = format!(r#""metadata":{{"resourceVersion":"{rv}","creationTimestamp":null}}"#);
        let head = format!(
            r#"{{"kind":"{}","apiVersion":"{}",{meta}"#,
            self.kind(),
            self.api_version()
        );
        match self {
            Res::Pods => format!(r#"{head},"spec":{{"containers":null}},"status":{{}}}}"#),
            Res::Nodes => format!(
                r#"{head},"spec":{{}},"status":{{"daemonEndpoints":{{"kubeletEndpoint":{{"Port":0}}}},"nodeInfo":{{"machineID":"","systemUUID":"","bootID":"","kernelVersion":"","osImage":"","containerRuntimeVersion":"","kubeletVersion":"","kubeProxyVersion":"","operatingSystem":"","architecture":""}}}}}}"#
            ),
            Res::Leases => format!(r#"{head},"spec":{{}}}}"#),
            Res::Secrets | Res::ConfigMaps | Res::ServiceAccounts => format!("{head}}}"),
            Res::Services => format!(r#"{head},"spec":{{}},"status":{{"loadBalancer":{{}}}}}}"#),
            Res::CertificateSigningRequests => {
                format!(r#"{head},"spec":{{"request":null,"signerName":""}},"status":{{}}}}"#)
            }
            Res::Events => format!(
                r#"{head},"involvedObject":{{}},"source":{{}},"firstTimestamp":null,"lastTimestamp":null,"eventTime":null,"reportingComponent":"","reportingInstance":""}}"#
            ),
        }
    }
}

pub(super) type Key = (Res, String, String);

// ---------------------------------------------------------------------------
// Selectors

#[derive(Clone, Debug, Default)]
pub(super) struct Filter {
    namespace: Option<String>,
    name: Option<String>,
    /// (field, equal?, value)
    fields: Vec<(String, bool, String)>,
    /// (key, op, value): op is "=", "!=", "exists", "!exists"
    labels: Vec<(String, String, String)>,
}

impl Filter {
    pub(super) fn parse(
        res: Res,
        namespace: Option<&str>,
        name: Option<&str>,
        fs: &str,
        ls: &str,
    ) -> Result<Filter, Status> {
        let mut f = Filter {
            namespace: namespace.map(str::to_string),
            name: name.map(str::to_string),
            ..Filter::default()
        };
        for term in fs.split(',').filter(|t| !t.is_empty()) {
            let (field, eq, value) = if let Some((a, b)) = term.split_once("!=") {
                (a, false, b)
            } else if let Some((a, b)) = term.split_once("==") {
                (a, true, b)
            } else if let Some((a, b)) = term.split_once('=') {
                (a, true, b)
            } else {
                return Err(bad_request(format!("invalid field selector: {term}")));
            };
            if !res.field_labels().contains(&field) {
                return Err(bad_request(format!("field label not supported: {field}")));
            }
            f.fields.push((field.to_string(), eq, value.to_string()));
        }
        for term in ls.split(',').filter(|t| !t.is_empty()) {
            let t = if let Some((a, b)) = term.split_once("!=") {
                (a, "!=", b)
            } else if let Some((a, b)) = term.split_once("==") {
                (a, "=", b)
            } else if let Some((a, b)) = term.split_once('=') {
                (a, "=", b)
            } else if let Some(a) = term.strip_prefix('!') {
                (a, "!exists", "")
            } else {
                (term, "exists", "")
            };
            f.labels.push((
                t.0.trim().to_string(),
                t.1.to_string(),
                t.2.trim().to_string(),
            ));
        }
        Ok(f)
    }

    pub(super) fn is_filtered(&self) -> bool {
        !self.fields.is_empty() || !self.labels.is_empty()
    }

    pub(super) fn matches(&self, obj: &Value) -> bool {
        if let Some(ns) = &self.namespace {
            if sv(obj, &["metadata", "namespace"]) != ns {
                return false;
            }
        }
        if let Some(n) = &self.name {
            if sv(obj, &["metadata", "name"]) != n {
                return false;
            }
        }
        for (field, eq, value) in &self.fields {
            let path: Vec<&str> = field.split('.').collect();
            let mut cur = obj;
            for p in &path {
                cur = &cur[*p];
            }
            let actual = match cur {
                Value::String(s) => s.clone(),
                Value::Bool(b) => b.to_string(),
                Value::Null => {
                    if field == "spec.unschedulable" {
                        "false".into()
                    } else {
                        String::new()
                    }
                }
                other => other.to_string(),
            };
            if (actual == *value) != *eq {
                return false;
            }
        }
        let labels = &obj["metadata"]["labels"];
        for (k, op, v) in &self.labels {
            let actual = labels.get(k).and_then(|x| x.as_str());
            let ok = match op.as_str() {
                "=" => actual == Some(v.as_str()),
                "!=" => actual != Some(v.as_str()),
                "exists" => actual.is_some(),
                _ => actual.is_none(),
            };
            if !ok {
                return false;
            }
        }
        true
    }
}

// ---------------------------------------------------------------------------
// The store

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum EventType {
    Added,
    Modified,
    Deleted,
}

#[derive(Clone, Debug)]
pub(super) struct Event {
    pub(super) rv: u64,
    pub(super) res: Res,
    pub(super) kind: EventType,
    key: Key,
    pub(super) obj: Value,
    pub(super) prev: Option<Value>,
}

pub(super) struct Fault {
    pub(super) verb: String,
    pub(super) path_contains: String,
    pub(super) status: Status,
    pub(super) remaining: usize,
}

pub(super) struct State {
    pub(super) rv: u64,
    pub(super) objects: BTreeMap<Key, Value>,
    /// The objects as of `compacted`.
    base: BTreeMap<Key, Value>,
    /// Writes after `compacted`, oldest first.
    pub(super) log: VecDeque<Event>,
    pub(super) compacted: u64,
    /// The last RV the watch cache of each type saw.
    type_rv: HashMap<Res, u64>,
    pub(super) tokens: HashMap<String, User>,
    /// A token's `uid` and `extra` in TokenReview answers, when it has them.
    pub(super) token_claims: HashMap<String, Value>,
    pub(super) requests: Vec<RecordedRequest>,
    pub(super) faults: Vec<Fault>,
    pub(super) bookmark_interval: Duration,
    pub(super) sa_suffix: String,
    /// TokenRequests answered so far (each token is distinct).
    pub(super) tokens_issued: u64,
    /// What SubjectAccessReviews allow (RBAC bindings, in effect).
    pub(super) access_rules: Vec<AccessRule>,
    /// The EphemeralContainers feature gate (off in a default v1.20).
    pub(super) ephemeral_containers: bool,
    /// How TokenReviews fail, while they do.
    pub(super) token_review_failure: Option<TokenReviewFailure>,
}

/// One grant a SubjectAccessReview finds: a ClusterRoleBinding of a role
/// with one rule, to a user or a group.
#[derive(Clone, Debug)]
pub(super) struct AccessRule {
    pub(super) binding: String,
    /// A user name, or a group the user is in.
    pub(super) subject: String,
    /// A verb or "*".
    pub(super) verb: String,
    /// `resource/subresource`, `resource/*` or "*".
    pub(super) resource: String,
}

impl State {
    pub(super) fn new() -> State {
        State {
            rv: FIRST_RV,
            objects: BTreeMap::new(),
            base: BTreeMap::new(),
            log: VecDeque::new(),
            compacted: FIRST_RV,
            type_rv: HashMap::new(),
            tokens: HashMap::new(),
            token_claims: HashMap::new(),
            requests: Vec::new(),
            faults: Vec::new(),
            bookmark_interval: Duration::from_secs(60),
            sa_suffix: name_suffix(),
            tokens_issued: 0,
            access_rules: Vec::new(),
            ephemeral_containers: false,
            token_review_failure: None,
        }
    }

    pub(super) fn type_rv(&self, res: Res) -> u64 {
        self.type_rv.get(&res).copied().unwrap_or(FIRST_RV)
    }

    /// The pods bound to `node`.
    pub(super) fn pods_on<'a>(&'a self, node: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
        self.objects
            .iter()
            .filter(|((res, _, _), _)| *res == Res::Pods)
            .map(|(_, p)| p)
            .filter(move |p| sv(p, &["spec", "nodeName"]) == node)
    }

    pub(super) fn get(&self, res: Res, ns: &str, name: &str) -> Option<&Value> {
        self.objects.get(&(res, ns.to_string(), name.to_string()))
    }

    /// Stores a write: the next RV, the history event, the type's cache RV.
    pub(super) fn write(&mut self, key: Key, kind: EventType, mut obj: Value) -> Value {
        self.rv += 1;
        let rv = self.rv;
        obj_mut(&mut obj, "metadata").insert("resourceVersion".into(), json!(rv.to_string()));
        let prev = match kind {
            EventType::Deleted => self.objects.remove(&key),
            _ => self.objects.insert(key.clone(), obj.clone()),
        };
        self.type_rv.insert(key.0, rv);
        self.log.push_back(Event {
            rv,
            res: key.0,
            kind,
            key,
            obj: obj.clone(),
            prev,
        });
        while self.log.len() > MAX_HISTORY {
            self.fold_oldest();
        }
        obj
    }

    fn fold_oldest(&mut self) {
        if let Some(e) = self.log.pop_front() {
            match e.kind {
                EventType::Deleted => {
                    self.base.remove(&e.key);
                }
                _ => {
                    self.base.insert(e.key, e.obj);
                }
            }
            self.compacted = e.rv;
        }
    }

    pub(super) fn compact(&mut self) {
        while !self.log.is_empty() {
            self.fold_oldest();
        }
        self.compacted = self.rv;
    }

    /// The objects as of `rv` (rv >= compacted).
    pub(super) fn objects_at(&self, rv: u64) -> BTreeMap<Key, Value> {
        let mut m = self.base.clone();
        for e in self.log.iter().take_while(|e| e.rv <= rv) {
            match e.kind {
                EventType::Deleted => {
                    m.remove(&e.key);
                }
                _ => {
                    m.insert(e.key.clone(), e.obj.clone());
                }
            }
        }
        m
    }
}

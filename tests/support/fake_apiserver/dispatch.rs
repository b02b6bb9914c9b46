//! From a request to an answer: the URL's target, authentication, the Node
//! authorizer and NodeRestriction refusals, scripted faults, and dispatch
//! to the verbs.

use super::*;

pub(super) enum Outcome {
    Reply(Resp),
    Watch(WatchPlan),
}

pub(super) struct Ctx {
    pub(super) user: User,
    pub(super) manager: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Target {
    pub(super) res: Res,
    pub(super) ns: String,
    pub(super) name: Option<String>,
    pub(super) sub: Option<String>,
}

fn parse_target(path: &str) -> Option<Target> {
    let segs: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
    let rest: &[&str] = match segs.as_slice() {
        ["api", "v1", rest @ ..] => rest,
        ["apis", "coordination.k8s.io", "v1", rest @ ..] => rest,
        ["apis", "certificates.k8s.io", "v1", rest @ ..] => rest,
        _ => return None,
    };
    let core = segs[0] == "api";
    let group = if core { "" } else { segs[1] };
    let (ns, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (ns.to_string(), rest),
        _ => (String::new(), rest),
    };
    let res = match (core, rest.first()?) {
        (true, &"pods") => Res::Pods,
        (true, &"nodes") => Res::Nodes,
        (true, &"events") => Res::Events,
        (true, &"secrets") => Res::Secrets,
        (true, &"configmaps") => Res::ConfigMaps,
        (true, &"serviceaccounts") => Res::ServiceAccounts,
        (true, &"services") => Res::Services,
        (false, &"leases") => Res::Leases,
        (false, &"certificatesigningrequests") => Res::CertificateSigningRequests,
        _ => return None,
    };
    if res.group() != group {
        return None;
    }
    if !res.namespaced() && !ns.is_empty() {
        return None;
    }
    let name = rest.get(1).map(|s| percent_decode(s));
    let sub = rest.get(2).map(|s| s.to_string());
    if rest.len() > 3 {
        return None;
    }
    match (res, sub.as_deref()) {
        (Res::ServiceAccounts, Some("token")) => {}
        (Res::ServiceAccounts, _) => return None,
        (_, None)
        | (Res::Pods | Res::Nodes, Some("status"))
        | (Res::Pods, Some("ephemeralcontainers")) => {}
        _ => return None,
    }
    Some(Target { res, ns, name, sub })
}

pub(super) fn authenticate(
    st: &State,
    req: &Request,
    cert_user: Result<Option<User>, ()>,
) -> Result<User, Resp> {
    if let Some(auth) = req.header("authorization") {
        let token = auth.strip_prefix("Bearer ").map(str::trim).unwrap_or("");
        return match st.tokens.get(token) {
            Some(u) => Ok(u.clone()),
            None => Err(Resp::status(&Status::new(
                401,
                "Unauthorized",
                "Unauthorized",
            ))),
        };
    }
    match cert_user {
        Ok(user) => Ok(user.unwrap_or_else(User::anonymous)),
        // "x509: certificate has expired or is not yet valid", and no
        // other credentials: Unauthorized.
        Err(()) => Err(Resp::status(&Status::new(
            401,
            "Unauthorized",
            "Unauthorized",
        ))),
    }
}

fn verb_of(req: &Request, t: &Target) -> &'static str {
    let watch = matches!(req.param("watch"), Some("true") | Some("1"));
    match (req.method.as_str(), t.name.is_some()) {
        ("GET", _) if watch => "watch",
        ("GET", true) => "get",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => "unknown",
    }
}

fn is_public_path(path: &str) -> bool {
    matches!(
        path,
        "/version" | "/version/" | "/healthz" | "/livez" | "/readyz"
    )
}

fn authz_forbidden(user: &User, verb: &str, t: &Target, reason: &str) -> Status {
    let mut resource = t.res.resource().to_string();
    if let Some(sub) = &t.sub {
        resource = format!("{resource}/{sub}");
    }
    let mut msg = if t.ns.is_empty() {
        format!(
            "User {} cannot {verb} resource {} in API group {} at the cluster scope",
            q(&user.name),
            q(&resource),
            q(t.res.group())
        )
    } else {
        format!(
            "User {} cannot {verb} resource {} in API group {} in the namespace {}",
            q(&user.name),
            q(&resource),
            q(t.res.group()),
            q(&t.ns)
        )
    };
    if !reason.is_empty() {
        msg = format!("{msg}: {reason}");
    }
    let name = t.name.clone().unwrap_or_default();
    let mut s = if name.is_empty() {
        Status::new(
            403,
            "Forbidden",
            format!("{} is forbidden: {msg}", t.res.qualified()),
        )
    } else {
        Status::new(
            403,
            "Forbidden",
            format!("{} {} is forbidden: {msg}", t.res.qualified(), q(&name)),
        )
    }
    .with_details(details(t.res, &name));
    s.nosniff = true;
    s
}

/// The Node authorizer (with the 1.20 system:node rules) and RBAC for
/// everyone else (who, without bindings, may only read the public paths).
fn authorize(st: &State, user: &User, verb: &str, t: &Target) -> Result<(), Status> {
    if user.is_admin() {
        return Ok(());
    }
    // RBAC's system:node-bootstrapper (bound to system:bootstrappers) and
    // system:node both allow these on CertificateSigningRequests; a
    // bootstrap token may do nothing else.
    let bootstrapper = user.groups.iter().any(|g| g == "system:bootstrappers");
    if t.res == Res::CertificateSigningRequests && (bootstrapper || user.node_name().is_some()) {
        if t.sub.is_none() && ["create", "get", "list", "watch"].contains(&verb) {
            return Ok(());
        }
        return Err(authz_forbidden(user, verb, t, ""));
    }
    let Some(node) = user.node_name() else {
        return Err(authz_forbidden(user, verb, t, ""));
    };
    let allowed: &[&str] = match (t.res, t.sub.as_deref()) {
        (Res::Secrets | Res::ConfigMaps, _) => {
            // The Node authorizer's graph: only objects that a pod bound
            // to this node references, and only by name.
            if !["get", "list", "watch"].contains(&verb) {
                return Err(authz_forbidden(
                    user,
                    verb,
                    t,
                    "can only read resources of this type",
                ));
            }
            let Some(name) = t.name.as_deref() else {
                return Err(authz_forbidden(user, verb, t, "No Object name found"));
            };
            let kind = if t.res == Res::Secrets {
                "secret"
            } else {
                "configmap"
            };
            let related = st.pods_on(node).any(|p| {
                sv(p, &["metadata", "namespace"]) == t.ns
                    && pod_refs(p, kind).iter().any(|n| n == name)
            });
            if !related {
                return Err(authz_forbidden(
                    user,
                    verb,
                    t,
                    &format!(
                        "no relationship found between node {} and this object",
                        sq(node)
                    ),
                ));
            }
            return Ok(());
        }
        (Res::ServiceAccounts, _) => {
            if verb != "create" || t.sub.as_deref() != Some("token") {
                return Err(authz_forbidden(
                    user,
                    verb,
                    t,
                    "can only create tokens for individual service accounts",
                ));
            }
            let Some(name) = t.name.as_deref() else {
                return Err(authz_forbidden(user, verb, t, "No Object name found"));
            };
            let related = st.pods_on(node).any(|p| {
                sv(p, &["metadata", "namespace"]) == t.ns
                    && sv(p, &["spec", "serviceAccountName"]) == name
            });
            if !related {
                return Err(authz_forbidden(
                    user,
                    verb,
                    t,
                    &format!(
                        "no relationship found between node {} and this object",
                        sq(node)
                    ),
                ));
            }
            return Ok(());
        }
        (Res::Nodes, None) => &["get", "list", "watch", "create", "update", "patch"],
        (Res::Nodes, Some(_)) => &["update", "patch"],
        (Res::Pods, None) => &["get", "list", "watch", "create", "delete"],
        (Res::Pods, Some("status")) => &["update", "patch"],
        // Not pods/ephemeralcontainers.
        (Res::Pods, Some(_)) => &[],
        (Res::Events, _) => &["create", "update", "patch"],
        // Handled above, for nodes and bootstrappers alike.
        (Res::CertificateSigningRequests, _) => &[],
        // system:node reads every Service, for pods' service variables.
        (Res::Services, _) => &["get", "list", "watch"],
        (Res::Leases, _) => {
            if !["get", "create", "update", "patch", "delete"].contains(&verb) {
                return Err(authz_forbidden(
                    user,
                    verb,
                    t,
                    "can only get, create, update, patch, or delete a node lease",
                ));
            }
            if t.ns != NODE_LEASE_NAMESPACE {
                return Err(authz_forbidden(
                    user,
                    verb,
                    t,
                    &format!(
                        "can only access leases in the {} system namespace",
                        q(NODE_LEASE_NAMESPACE)
                    ),
                ));
            }
            if verb != "create" && t.name.as_deref() != Some(node) {
                return Err(authz_forbidden(
                    user,
                    verb,
                    t,
                    "can only access node lease with the same name as the requesting node",
                ));
            }
            return Ok(());
        }
    };
    if allowed.contains(&verb) {
        Ok(())
    } else {
        Err(authz_forbidden(user, verb, t, ""))
    }
}

fn take_fault(st: &mut State, req: &Request) -> Option<Status> {
    let i = st.faults.iter().position(|f| {
        f.remaining > 0
            && (f.verb == "*" || f.verb.eq_ignore_ascii_case(&req.method))
            && req.path.contains(&f.path_contains)
    })?;
    let f = &mut st.faults[i];
    f.remaining -= 1;
    let s = f.status.clone();
    if f.remaining == 0 {
        st.faults.remove(i);
    }
    Some(s)
}

const VERSION_BODY: &str = "{\n  \"major\": \"1\",\n  \"minor\": \"20\",\n  \"gitVersion\": \"v1.20.2\",\n  \"gitCommit\": \"faecb196815e248d3ecfb03c680a4507229c2a56\",\n  \"gitTreeState\": \"archive\",\n  \"buildDate\": \"2026-11-21T23:52:21Z\",\n  \"goVersion\": \"go1.19.8\",\n  \"compiler\": \"gc\",\n  \"platform\": \"linux/amd64\"\n}";

const HEALTH_CHECKS: &[&str] = &[
    "ping",
    "log",
    "etcd",
    "poststarthook/start-kube-apiserver-admission-initializer",
    "poststarthook/generic-apiserver-start-informers",
    "poststarthook/priority-and-fairness-config-consumer",
    "poststarthook/priority-and-fairness-filter",
    "poststarthook/start-apiextensions-informers",
    "poststarthook/start-apiextensions-controllers",
    "poststarthook/crd-informer-synced",
    "poststarthook/bootstrap-controller",
    "poststarthook/rbac/bootstrap-roles",
    "poststarthook/scheduling/bootstrap-system-priority-classes",
    "poststarthook/priority-and-fairness-config-producer",
    "poststarthook/start-cluster-authentication-info-controller",
    "poststarthook/start-kube-aggregator-informers",
    "poststarthook/apiservice-registration-controller",
    "poststarthook/apiservice-status-available-controller",
    "poststarthook/kube-apiserver-autoregistration",
    "autoregister-completion",
    "poststarthook/apiservice-openapi-controller",
];

/// Acts on one request under the state lock, which the caller holds until
/// the request is recorded: a test that sees the request's effect also
/// sees it in the request log.
pub(super) fn dispatch(
    shared: &Arc<Shared>,
    st: &mut parking_lot::MutexGuard<'_, State>,
    req: &Request,
    cert_user: Result<Option<User>, ()>,
) -> (Option<User>, Outcome) {
    let user = match authenticate(st, req, cert_user) {
        Ok(u) => u,
        Err(resp) => return (None, Outcome::Reply(resp)),
    };
    let u = user.clone();
    let reply = move |r: Resp| (Some(u.clone()), Outcome::Reply(r));
    if let Some(s) = take_fault(st, req) {
        return reply(Resp::status(&s));
    }
    if let Some(review) = review_kind(&req.path) {
        return reply(create_review(st, &user, req, review).unwrap_or_else(|s| Resp::status(&s)));
    }
    let Some(t) = parse_target(&req.path) else {
        // Non-resource paths.
        if !is_public_path(&req.path) && !user.is_admin() {
            let mut s = Status::new(
                403,
                "Forbidden",
                format!(
                    "forbidden: User {} cannot {} path {}",
                    q(&user.name),
                    req.method.to_ascii_lowercase(),
                    q(&req.path)
                ),
            )
            .with_details(Details::default());
            s.nosniff = true;
            return reply(Resp::status(&s));
        }
        return reply(match req.path.as_str() {
            "/version" | "/version/" => Resp::json(200, VERSION_BODY.to_string()),
            "/healthz" | "/livez" | "/readyz" if req.param("verbose").is_some() => {
                let mut body: String = HEALTH_CHECKS
                    .iter()
                    .map(|c| format!("[+]{c} ok\n"))
                    .collect();
                body += &format!("{} check passed\n", req.path.trim_start_matches('/'));
                Resp::text(&body)
            }
            "/healthz" | "/livez" | "/readyz" => Resp::text("ok"),
            _ => Resp::status(
                &Status::new(
                    404,
                    "NotFound",
                    "the server could not find the requested resource",
                )
                .with_details(Details::default()),
            ),
        });
    };
    let verb = verb_of(req, &t);
    // As the apiserver's request info: a list or watch whose field
    // selector requires one metadata.name is authorized as a request for
    // that name (what lets a node watch a Secret it may read).
    let by_name = match (verb, &t.name) {
        ("list" | "watch", None) => req
            .param("fieldSelector")
            .unwrap_or("")
            .split(',')
            .find_map(|term| {
                term.strip_prefix("metadata.name==")
                    .or_else(|| term.strip_prefix("metadata.name="))
            })
            .map(|n| Target {
                name: Some(n.to_string()),
                ..t.clone()
            }),
        _ => None,
    };
    if let Err(s) = authorize(st, &user, verb, by_name.as_ref().unwrap_or(&t)) {
        return reply(Resp::status(&s));
    }
    let ctx = Ctx {
        user: user.clone(),
        manager: req.manager(),
    };
    if t.sub.as_deref() == Some("ephemeralcontainers") {
        if !st.ephemeral_containers {
            // Not installed without the gate: go-restful's 404, after
            // authorization as every request.
            return reply(Resp::status(
                &Status::new(
                    404,
                    "NotFound",
                    "the server could not find the requested resource",
                )
                .with_details(Details::default()),
            ));
        }
        return reply(
            ephemeral_containers(st, verb, &t, req)
                .map(|v| Resp::object(200, &v))
                .unwrap_or_else(|s| Resp::status(&s)),
        );
    }
    let result = match verb {
        "watch" => match watch_plan(st, req, &t) {
            Ok(plan) => return (Some(user), Outcome::Watch(plan)),
            Err(s) => Err(s),
        },
        "list" => {
            let r = list(st, shared, req, &t);
            return reply(r.unwrap_or_else(|s| Resp::status(&s)));
        }
        "get" => get(st, &t).map(|v| Resp::object(200, &v)),
        "create" => parse_body(req).and_then(|body| {
            if t.res == Res::ServiceAccounts {
                return create_token(st, &ctx, &t, &body).map(|v| Resp::object(201, &v));
            }
            if t.name.is_some() {
                return Err(Status::new(
                    405,
                    "MethodNotAllowed",
                    "the server does not allow this method on the requested resource",
                ));
            }
            create(st, &ctx, t.res, &t.ns, body).map(|v| Resp::object(201, &v))
        }),
        "update" => parse_body(req)
            .and_then(|body| update(st, &ctx, &t, body).map(|v| Resp::object(200, &v))),
        "patch" => patch(st, &ctx, &t, req).map(|v| Resp::object(200, &v)),
        "delete" => DeleteOptions::parse(req).and_then(|opts| {
            let name = t.name.clone().unwrap_or_default();
            delete(st, &ctx, t.res, &t.ns, &name, &opts).map(Deleted::into_resp)
        }),
        _ => Err(Status::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )),
    };
    reply(result.unwrap_or_else(|s| Resp::status(&s)))
}

pub(super) fn parse_body(req: &Request) -> Result<Value, Status> {
    let v: Value = serde_json::from_slice(&req.body)
        .map_err(|e| bad_request(format!("the body of the request could not be decoded: {e}")))?;
    if !v.is_object() {
        return Err(bad_request("the body of the request is not a JSON object"));
    }
    Ok(v)
}

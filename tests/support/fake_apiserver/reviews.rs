//! TokenReview and SubjectAccessReview (never stored: the request's spec
//! echoed with the status filled in) and TokenRequest for service account
//! tokens.

use super::*;

/// The lifetime of the fake's service account tokens when the request names
/// none (the API's default).
const TOKEN_SECONDS: i64 = 3600;

/// The review APIs the kubelet's webhooks call: (group, resource, kind).
pub(super) fn review_kind(path: &str) -> Option<(&'static str, &'static str, &'static str)> {
    match path.trim_end_matches('/') {
        "/apis/authentication.k8s.io/v1/tokenreviews" => {
            Some(("authentication.k8s.io", "tokenreviews", "TokenReview"))
        }
        "/apis/authorization.k8s.io/v1/subjectaccessreviews" => Some((
            "authorization.k8s.io",
            "subjectaccessreviews",
            "SubjectAccessReview",
        )),
        _ => None,
    }
}

/// A TokenReview or SubjectAccessReview: never stored, answered 201 with
/// the request's spec and the status filled in. Admins and nodes may
/// create them (the bootstrap policy's node rules), others get RBAC's 403.
pub(super) fn create_review(
    st: &State,
    user: &User,
    req: &Request,
    (group, resource, kind): (&str, &str, &str),
) -> Result<Resp, Status> {
    if req.method != "POST" {
        return Err(Status::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        ));
    }
    if !user.is_admin() && user.node_name().is_none() {
        let mut s = Status::new(
            403,
            "Forbidden",
            format!(
                "{resource}.{group} is forbidden: User {} cannot create resource {} in API group {} at the cluster scope",
                q(&user.name),
                q(resource),
                q(group)
            ),
        )
        .with_details(Details {
            group: group.to_string(),
            kind: resource.to_string(),
            ..Details::default()
        });
        s.nosniff = true;
        return Err(s);
    }
    let body = parse_body(req)?;
    let api_version = format!("{group}/v1");
    if body
        .get("kind")
        .and_then(Value::as_str)
        .is_some_and(|k| k != kind)
        || body
            .get("apiVersion")
            .and_then(Value::as_str)
            .is_some_and(|v| v != api_version)
    {
        return Err(bad_request(format!(
            "the API version in the data ({}) does not match the expected API version ({api_version})",
            sv(&body, &["apiVersion"])
        )));
    }
    let spec = body.get("spec").cloned().unwrap_or_else(|| json!({}));
    let status = if kind == "TokenReview" {
        let token = sv(&spec, &["token"]);
        if token.is_empty() {
            return Err(bad_request(
                "token is required for TokenReview in authentication",
            ));
        }
        match st.token_review_failure {
            Some(TokenReviewFailure::InternalError) => {
                let cause = "the token authenticator is unavailable";
                return Err(Status::new(
                    500,
                    "InternalError",
                    format!("Internal error occurred: {cause}"),
                )
                .with_details(Details {
                    causes: vec![(String::new(), cause.into(), String::new())],
                    ..Details::default()
                }));
            }
            Some(TokenReviewFailure::AuthenticatorError) => {
                return Ok(review_answer(
                    kind,
                    &api_version,
                    spec.clone(),
                    json!({"user": {}, "error": AUTHENTICATOR_ERROR}),
                ));
            }
            None => {}
        }
        match st.tokens.get(token) {
            Some(u) => {
                let mut user = json!({"username": u.name, "groups": u.groups});
                if let (Some(Value::Object(claims)), Value::Object(user)) =
                    (st.token_claims.get(token), &mut user)
                {
                    user.extend(claims.clone());
                }
                json!({
                    "authenticated": true,
                    "user": user,
                    "audiences": ["https://kubernetes.default.svc.cluster.local"],
                })
            }
            None => json!({"user": {}}),
        }
    } else {
        let name = sv(&spec, &["user"]);
        let groups: Vec<&str> = spec
            .get("groups")
            .and_then(Value::as_array)
            .map(|g| g.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if name.is_empty() && groups.is_empty() {
            return Err(invalid_review(
                "spec.user",
                "at least one of user or group must be specified",
            ));
        }
        let Some(attrs) = spec.get("resourceAttributes") else {
            return Err(invalid_review(
                "spec.resourceAttributes",
                "exactly one of nonResourceAttributes or resourceAttributes must be specified",
            ));
        };
        let verb = sv(attrs, &["verb"]);
        let mut res = sv(attrs, &["resource"]).to_string();
        if !sv(attrs, &["subresource"]).is_empty() {
            res = format!("{res}/{}", sv(attrs, &["subresource"]));
        }
        let base = res.split('/').next().unwrap_or_default().to_string();
        let grant = st.access_rules.iter().find(|r| {
            (r.subject == name || groups.contains(&r.subject.as_str()))
                && (r.verb == "*" || r.verb == verb)
                && (r.resource == "*" || r.resource == res || r.resource == format!("{base}/*"))
        });
        if groups.contains(&"system:masters") {
            json!({"allowed": true})
        } else if let Some(r) = grant {
            let to = match r.subject == name {
                true => format!("User {}", q(name)),
                false => format!("Group {}", q(&r.subject)),
            };
            json!({
                "allowed": true,
                "reason": format!(
                    "RBAC: allowed by ClusterRoleBinding {} of ClusterRole {} to {to}",
                    q(&r.binding),
                    q(&r.binding)
                ),
            })
        } else {
            json!({"allowed": false})
        }
    };
    Ok(review_answer(kind, &api_version, spec, status))
}

/// What `TokenReviewFailure::AuthenticatorError` puts in `status.error`:
/// the union of the apiserver's authenticators, its webhook unreachable.
const AUTHENTICATOR_ERROR: &str = "[invalid bearer token, Post \"https://authn.example:8443/authenticate\": dial tcp 10.0.0.9:8443: connect: connection refused]";

/// A review as created: 201, the spec echoed, the status filled in.
fn review_answer(kind: &str, api_version: &str, spec: Value, status: Value) -> Resp {
    let answer = json!({
        "kind": kind,
        "apiVersion": api_version,
        "metadata": {"creationTimestamp": null},
        "spec": spec,
        "status": status,
    });
    Resp::object(201, &answer)
}

fn invalid_review(field: &str, message: &str) -> Status {
    Status::new(
        422,
        "Invalid",
        format!("SubjectAccessReview.authorization.k8s.io \"\" is invalid: {field}: Invalid value: \"null\": {message}"),
    )
}

/// TokenRequest (`POST .../serviceaccounts/<name>/token`), with
/// NodeRestriction's rules for nodes: the token must be bound to a pod that
/// exists with that UID and runs on the node.
pub(super) fn create_token(
    st: &mut State,
    ctx: &Ctx,
    t: &Target,
    body: &Value,
) -> Result<Value, Status> {
    let sa = t.name.clone().unwrap_or_default();
    let spec = &body["spec"];
    let seconds = spec["expirationSeconds"].as_i64().unwrap_or(TOKEN_SECONDS);
    if seconds < 600 {
        return Err(invalid(
            Res::ServiceAccounts,
            &sa,
            vec![(
                "FieldValueInvalid".into(),
                format!(
                    "Invalid value: {seconds}: may not specify a duration less than 10 minutes"
                ),
                "spec.expirationSeconds".into(),
            )],
        ));
    }
    let bound = &spec["boundObjectRef"];
    let res = Res::ServiceAccounts;
    if let Some(node) = ctx.user.node_name() {
        if !bound.is_object() {
            return Err(admission_forbidden(
                res,
                &sa,
                "node requested token not bound to a pod",
            ));
        }
        if bound["kind"] != "Pod" {
            return Err(admission_forbidden(
                res,
                &sa,
                format!("node requested token bound to a {}", sv(bound, &["kind"])),
            ));
        }
        let pod = st.get(Res::Pods, &t.ns, sv(bound, &["name"]));
        let Some(pod) = pod else {
            return Err(admission_forbidden(
                res,
                &sa,
                format!("pods {} not found", q(sv(bound, &["name"]))),
            ));
        };
        if sv(pod, &["metadata", "uid"]) != sv(bound, &["uid"]) {
            return Err(admission_forbidden(
                res,
                &sa,
                format!(
                    "the UID in the bound object reference ({}) does not match the UID in record. The object might have been deleted and then recreated",
                    sv(bound, &["uid"])
                ),
            ));
        }
        if sv(pod, &["spec", "nodeName"]) != node {
            return Err(admission_forbidden(
                res,
                &sa,
                "node requested token bound to a pod scheduled on a different node",
            ));
        }
    }
    st.tokens_issued += 1;
    let audiences = match spec["audiences"].as_array() {
        Some(a) if !a.is_empty() => Value::Array(a.clone()),
        _ => json!([TOKEN_AUDIENCE]),
    };
    let token = format!(
        "fake-token.{}.{sa}.{}.{}",
        t.ns,
        sv(bound, &["name"]),
        st.tokens_issued
    );
    Ok(json!({
        "kind": "TokenRequest",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"name": sa, "namespace": t.ns, "creationTimestamp": null},
        "spec": {"audiences": audiences, "expirationSeconds": seconds, "boundObjectRef": bound},
        "status": {"token": token, "expirationTimestamp": add_secs(&now_secs(), seconds)},
    }))
}

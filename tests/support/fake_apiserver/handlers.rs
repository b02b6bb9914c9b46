//! The verbs on objects: get, list (with `resourceVersion` semantics and
//! `limit`/`continue`), create, update, patch, delete (graceful for pods),
//! and pods' `ephemeralcontainers`.

use super::*;

/// `pods/<name>/ephemeralcontainers` as v1.20 serves it (what `kubectl
/// debug` uses): GET, PUT and PATCH of an `EphemeralContainers` object, the
/// pod's metadata and its `spec.ephemeralContainers`. Only that list
/// changes, and only by additions (`ephemeral_update`).
pub(super) fn ephemeral_containers(
    st: &mut State,
    verb: &str,
    t: &Target,
    req: &Request,
) -> Result<Value, Status> {
    let name = t.name.clone().unwrap_or_default();
    let pod = get(st, t)?;
    let view = |pod: &Value| {
        json!({
            "kind": "EphemeralContainers",
            "apiVersion": "v1",
            "metadata": pod["metadata"].clone(),
            "ephemeralContainers": pod["spec"]
                .get("ephemeralContainers")
                .cloned()
                .unwrap_or_else(|| json!([])),
        })
    };
    let old = view(&pod);
    let new = match verb {
        "get" => return Ok(old),
        "update" => parse_body(req)?,
        "patch" => {
            let patch: Value = serde_json::from_slice(&req.body).map_err(|e| {
                bad_request(format!("the body of the request could not be decoded: {e}"))
            })?;
            match req.header("content-type").unwrap_or("").split(';').next() {
                Some("application/strategic-merge-patch+json") => {
                    smp(&old, &patch).map_err(bad_request)?
                }
                Some("application/merge-patch+json") => merge_patch(&old, &patch),
                _ => return Err(unsupported_patch_type()),
            }
        }
        _ => {
            return Err(Status::new(
                405,
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource",
            ))
        }
    };
    let sent_rv = sv(&new, &["metadata", "resourceVersion"]);
    if !sent_rv.is_empty() && sent_rv != sv(&pod, &["metadata", "resourceVersion"]) {
        return Err(conflict_modified(Res::Pods, &name));
    }
    let list = new["ephemeralContainers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let updated =
        ephemeral_update(&pod, list).map_err(|causes| invalid(Res::Pods, &name, causes))?;
    if updated == pod {
        return Ok(old);
    }
    let key = (Res::Pods, t.ns.clone(), name);
    Ok(view(&st.write(key, EventType::Modified, updated)))
}

/// The pod with `list` as its ephemeral containers, or the validation
/// causes (upstream's ValidateEphemeralContainersUpdate): each one that was
/// there stays, unchanged; a new one needs a name unique among all the
/// pod's containers and an image.
pub(super) fn ephemeral_update(
    pod: &Value,
    list: Vec<Value>,
) -> Result<Value, Vec<(String, String, String)>> {
    let old = pod["spec"]["ephemeralContainers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut causes = Vec::new();
    let mut cause = |field: String, reason: &str, message: String| {
        causes.push((reason.to_string(), message, field))
    };
    for (i, o) in old.iter().enumerate() {
        match list.iter().find(|n| n["name"] == o["name"]) {
            None => cause(
                format!("ephemeralContainers[{i}]"),
                "FieldValueForbidden",
                "Forbidden: existing ephemeral containers may not be removed".into(),
            ),
            Some(n) if n != o => cause(
                format!("ephemeralContainers[{i}]"),
                "FieldValueForbidden",
                "Forbidden: existing ephemeral containers may not be changed".into(),
            ),
            Some(_) => {}
        }
    }
    let mut names: Vec<&str> = ["initContainers", "containers"]
        .iter()
        .flat_map(|k| pod["spec"][k].as_array().into_iter().flatten())
        .map(|c| sv(c, &["name"]))
        .collect();
    for (i, c) in list.iter().enumerate() {
        let n = sv(c, &["name"]);
        if n.is_empty() {
            cause(
                format!("ephemeralContainers[{i}].name"),
                "FieldValueRequired",
                "Required value".into(),
            );
        } else if names.contains(&n) {
            cause(
                format!("ephemeralContainers[{i}].name"),
                "FieldValueDuplicate",
                format!("Duplicate value: {}", q(n)),
            );
        }
        names.push(n);
        if sv(c, &["image"]).is_empty() {
            cause(
                format!("ephemeralContainers[{i}].image"),
                "FieldValueRequired",
                "Required value".into(),
            );
        }
    }
    if !causes.is_empty() {
        return Err(causes);
    }
    let mut new = pod.clone();
    obj_mut(&mut new, "spec").insert("ephemeralContainers".into(), Value::Array(list));
    Ok(new)
}

pub(super) fn get(st: &State, t: &Target) -> Result<Value, Status> {
    let name = t.name.as_deref().unwrap_or("");
    st.get(t.res, &t.ns, name)
        .cloned()
        .ok_or_else(|| not_found(t.res, name))
}

fn list_json(res: Res, rv: u64, cont: Option<(String, Option<usize>)>, items: &[Value]) -> String {
    let mut meta = format!(r#""resourceVersion":"{rv}""#);
    if let Some((token, remaining)) = cont {
        meta += &format!(r#","continue":{}"#, js(&token));
        if let Some(n) = remaining {
            meta += &format!(r#","remainingItemCount":{n}"#);
        }
    }
    let items: Vec<String> = items.iter().map(|i| encode(&strip_kind(i))).collect();
    format!(
        r#"{{"kind":"{}List","apiVersion":"{}","metadata":{{{meta}}},"items":[{}]}}"#,
        res.kind(),
        res.api_version(),
        items.join(",")
    ) + "\n"
}

fn continue_token(rv: u64, after: &Key) -> String {
    let raw =
        json!({"v": "meta.k8s.io/v1", "rv": rv, "start": format!("{}/{}\u{0}", after.1, after.2)});
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw.to_string())
}

fn parse_continue(token: &str) -> Option<(u64, String, String)> {
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .ok()?;
    let v: Value = serde_json::from_slice(&raw).ok()?;
    let rv = v["rv"].as_u64()?;
    let start = v["start"].as_str()?.trim_end_matches('\u{0}');
    let (ns, name) = start.split_once('/')?;
    Some((rv, ns.to_string(), name.to_string()))
}

fn list_options_invalid(message: &str) -> Status {
    Status::new(
        422,
        "Invalid",
        format!(
            "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: {message}"
        ),
    )
    .with_details(Details {
        group: "meta.k8s.io".into(),
        kind: "ListOptions".into(),
        causes: vec![(
            "FieldValueForbidden".into(),
            format!("Forbidden: {message}"),
            "resourceVersionMatch".into(),
        )],
        ..Details::default()
    })
}

fn too_large(rv: u64, current: u64, retry: u64) -> Status {
    let mut s = Status::new(
        504,
        "Timeout",
        format!("Timeout: Too large resource version: {rv}, current: {current}"),
    )
    .with_details(Details {
        causes: vec![(
            "ResourceVersionTooLarge".into(),
            "Too large resource version".into(),
            String::new(),
        )],
        retry_after_seconds: retry,
        ..Details::default()
    });
    if retry > 0 {
        s.retry_after = Some(retry);
    }
    s
}

/// What a list is served from: the objects, the list's RV, whether it is
/// paginated, and the (namespace, name) a continued list starts after.
type ListSource = (BTreeMap<Key, Value>, u64, bool, Option<(String, String)>);

pub(super) fn list(
    st: &mut parking_lot::MutexGuard<'_, State>,
    shared: &Shared,
    req: &Request,
    t: &Target,
) -> Result<Resp, Status> {
    let ns = (!t.ns.is_empty()).then_some(t.ns.as_str());
    let filter = Filter::parse(
        t.res,
        ns,
        None,
        req.param("fieldSelector").unwrap_or(""),
        req.param("labelSelector").unwrap_or(""),
    )?;
    let rv_param = req.param("resourceVersion").unwrap_or("");
    let rv_match = req.param("resourceVersionMatch").unwrap_or("");
    let limit: usize = req.param("limit").and_then(|l| l.parse().ok()).unwrap_or(0);
    let cont = req.param("continue").unwrap_or("");
    if !rv_match.is_empty() && rv_param.is_empty() {
        return Err(list_options_invalid(
            "resourceVersionMatch is forbidden unless resourceVersion is provided",
        ));
    }
    if rv_match == "Exact" && rv_param == "0" {
        return Err(list_options_invalid(
            "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
        ));
    }
    let rv: Option<u64> = if rv_param.is_empty() {
        None
    } else {
        Some(rv_param.parse().map_err(|_| {
            bad_request(format!(
                "resourceVersion: Invalid value: {}: must be a number",
                q(rv_param)
            ))
        })?)
    };
    // (objects, list RV, paginate, start after)
    let (objects, list_rv, paginate, after): ListSource = if !cont.is_empty() {
        let Some((crv, cns, cname)) = parse_continue(cont) else {
            return Err(bad_request("continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)"));
        };
        if crv < st.compacted {
            return Err(expired("The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter."));
        }
        (st.objects_at(crv), crv, true, Some((cns, cname)))
    } else {
        match rv {
            None => (st.objects.clone(), st.rv, limit > 0, None),
            Some(0) => (st.objects.clone(), st.type_rv(t.res), false, None),
            Some(n) if rv_match == "Exact" || (limit > 0 && rv_match.is_empty()) => {
                if n > st.rv {
                    return Err(Status::new(
                        500,
                        "",
                        "etcdserver: mvcc: required revision is a future revision",
                    ));
                }
                if n < st.compacted {
                    return Err(expired(
                        "The resourceVersion for the provided list is too old.",
                    ));
                }
                (st.objects_at(n), n, limit > 0, None)
            }
            Some(n) if limit > 0 => {
                // NotOlderThan, from etcd.
                if n > st.rv {
                    return Err(too_large(n, st.rv, 0));
                }
                (st.objects.clone(), st.rv, true, None)
            }
            Some(n) => {
                // From the watch cache: wait for it to catch up.
                let deadline = Instant::now() + TOO_LARGE_RV_WAIT;
                while st.type_rv(t.res) < n {
                    if Instant::now() >= deadline || shared.stop.load(Ordering::SeqCst) {
                        let cur = st.type_rv(t.res);
                        return Err(too_large(n, cur, 1));
                    }
                    shared.changed.wait_for(st, POLL);
                }
                (st.objects.clone(), st.type_rv(t.res), false, None)
            }
        }
    };
    let mut items: Vec<(&Key, &Value)> = objects
        .iter()
        .filter(|(k, v)| k.0 == t.res && filter.matches(v))
        .filter(|(k, _)| match &after {
            Some((ans, aname)) => (&k.1, &k.2) > (ans, aname),
            None => true,
        })
        .collect();
    let mut cont_out = None;
    if paginate && limit > 0 && items.len() > limit {
        let remaining = items.len() - limit;
        items.truncate(limit);
        let last = items[limit - 1].0;
        cont_out = Some((
            continue_token(list_rv, last),
            (!filter.is_filtered()).then_some(remaining),
        ));
    }
    let values: Vec<Value> = items.into_iter().map(|(_, v)| v.clone()).collect();
    Ok(Resp::json(
        200,
        list_json(t.res, list_rv, cont_out, &values),
    ))
}

pub(super) fn finish_metadata(obj: &mut Value, res: Res) {
    let m = obj.as_object_mut().expect("objects are JSON objects");
    m.insert("kind".into(), json!(res.kind()));
    m.insert("apiVersion".into(), json!(res.api_version()));
}

pub(super) fn create(
    st: &mut State,
    ctx: &Ctx,
    res: Res,
    path_ns: &str,
    body: Value,
) -> Result<Value, Status> {
    let mut obj = body;
    let sent = obj.clone();
    {
        let meta = obj_mut(&mut obj, "metadata");
        for k in [
            "uid",
            "resourceVersion",
            "selfLink",
            "managedFields",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
        ] {
            meta.remove(k);
        }
        if res.namespaced() {
            let ns = meta
                .get("namespace")
                .and_then(|v| v.as_str())
                .unwrap_or("")
                .to_string();
            if ns.is_empty() {
                meta.insert("namespace".into(), json!(path_ns));
            } else if ns != path_ns {
                return Err(bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
        } else {
            meta.remove("namespace");
        }
        let name = meta
            .get("name")
            .and_then(|v| v.as_str())
            .unwrap_or("")
            .to_string();
        if name.is_empty() {
            let generate = meta
                .get("generateName")
                .and_then(|v| v.as_str())
                .unwrap_or("")
                .to_string();
            if generate.is_empty() {
                return Err(invalid(
                    res,
                    "",
                    vec![(
                        "FieldValueRequired".into(),
                        "Required value: name or generateName is required".into(),
                        "metadata.name".into(),
                    )],
                ));
            }
            meta.insert("name".into(), json!(format!("{generate}{}", name_suffix())));
        }
    }
    let name = st_name(&obj);
    let ns = if res.namespaced() {
        path_ns.to_string()
    } else {
        String::new()
    };
    let node = ctx.user.node_name().map(str::to_string);
    match res {
        Res::Pods => {
            drop_disabled_pod_fields(st, None, &mut obj);
            admit_pod_create(st, &mut obj, node.as_deref())?;
            let sa = sv(&obj, &["spec", "serviceAccountName"]).to_string();
            if !sa.is_empty() {
                publish_namespace_objects(st, path_ns, &sa);
            }
        }
        Res::Nodes => {
            if let Some(node) = &node {
                if name != *node {
                    return Err(admission_forbidden(
                        res,
                        &name,
                        format!(
                            "node {} is not allowed to modify node {}",
                            q(node),
                            q(&name)
                        ),
                    ));
                }
                let labels = label_keys(&obj);
                let bad = forbidden_labels(&labels);
                if !bad.is_empty() {
                    return Err(admission_forbidden(
                        res,
                        &name,
                        format!(
                            "node {} is not allowed to set the following labels: {}",
                            q(node),
                            bad.join(", ")
                        ),
                    ));
                }
            }
            default_node(&mut obj);
        }
        Res::Leases => {
            if let Some(node) = &node {
                if name != *node {
                    return Err(admission_forbidden(
                        res,
                        &name,
                        "can only access node lease with the same name as the requesting node",
                    ));
                }
            }
            validate_lease(&obj)?;
        }
        Res::Events => default_event(&mut obj),
        Res::Secrets | Res::ConfigMaps | Res::ServiceAccounts => {}
        Res::Services => default_service(&mut obj),
        Res::CertificateSigningRequests => admit_csr(&ctx.user, &mut obj)?,
    }
    let key = (res, ns, name.clone());
    if st.objects.contains_key(&key) {
        return Err(already_exists(res, &name));
    }
    finish_metadata(&mut obj, res);
    {
        let meta = obj_mut(&mut obj, "metadata");
        meta.insert("uid".into(), json!(new_uid()));
        meta.insert("creationTimestamp".into(), json!(now_secs()));
    }
    record_manager(&mut obj, &ctx.manager, res.api_version(), &sent, false);
    Ok(st.write(key, EventType::Added, obj))
}

pub(super) fn update(st: &mut State, ctx: &Ctx, t: &Target, body: Value) -> Result<Value, Status> {
    let name = t.name.clone().unwrap_or_default();
    let body_name = st_name(&body);
    if !body_name.is_empty() && body_name != name {
        return Err(bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    let old = get(st, t)?;
    let sent_rv = sv(&body, &["metadata", "resourceVersion"]).to_string();
    if sent_rv.is_empty() && t.res == Res::Leases {
        // The Lease strategy allows no unconditional update; the store
        // names the resource as the kind. (A PATCH is conditional on the
        // version it was applied to, so it needs none.)
        return Err(invalid_kind(
            t.res.resource(),
            t.res.group(),
            &name,
            vec![(
                "FieldValueInvalid".into(),
                "Invalid value: 0x0: must be specified for an update".into(),
                "metadata.resourceVersion".into(),
            )],
        ));
    }
    if !sent_rv.is_empty() && sent_rv != sv(&old, &["metadata", "resourceVersion"]) {
        return Err(conflict_modified(t.res, &name));
    }
    let mut new = body.clone();
    if sv(&new, &["metadata", "uid"]).is_empty() {
        obj_mut(&mut new, "metadata").insert("uid".into(), old["metadata"]["uid"].clone());
    }
    finish_update(st, ctx, t, old, new, &body)
}

/// A PATCH of a type the route does not consume: go-restful refuses it
/// before the handler sees it (v1.20, recorded with curl), so the message
/// is its own and names no accepted types. JSON patch is served by the
/// real server but not by this fake.
fn unsupported_patch_type() -> Status {
    Status::new(415, "UnsupportedMediaType", "415: Unsupported Media Type")
        .with_details(Details::default())
}

pub(super) fn patch(st: &mut State, ctx: &Ctx, t: &Target, req: &Request) -> Result<Value, Status> {
    let name = t.name.clone().unwrap_or_default();
    let ctype = req
        .header("content-type")
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_string();
    let patch: Value = serde_json::from_slice(&req.body)
        .map_err(|e| bad_request(format!("the body of the request could not be decoded: {e}")))?;
    let old = get(st, t)?;
    let patched = match ctype.as_str() {
        "application/strategic-merge-patch+json" => smp(&old, &patch).map_err(bad_request)?,
        "application/merge-patch+json" => merge_patch(&old, &patch),
        _ => return Err(unsupported_patch_type()),
    };
    let sent_rv = sv(&patch, &["metadata", "resourceVersion"]).to_string();
    if !sent_rv.is_empty() && sent_rv != sv(&old, &["metadata", "resourceVersion"]) {
        return Err(conflict_modified(t.res, &name));
    }
    if !patched.is_object() {
        return Err(bad_request("the patch removed the whole object"));
    }
    finish_update(st, ctx, t, old, patched, &patch)
}

fn finish_update(
    st: &mut State,
    ctx: &Ctx,
    t: &Target,
    old: Value,
    mut new: Value,
    sent: &Value,
) -> Result<Value, Status> {
    let name = t.name.clone().unwrap_or_default();
    apply_strategy(t.res, t.sub.as_deref(), &old, &mut new);
    if t.res == Res::Pods {
        drop_disabled_pod_fields(st, Some(&old), &mut new);
    }
    // Validation: the uid is immutable.
    let new_uid = sv(&new, &["metadata", "uid"]).to_string();
    let old_uid = sv(&old, &["metadata", "uid"]).to_string();
    if new_uid != old_uid {
        let cause = (
            "FieldValueInvalid".to_string(),
            format!("Invalid value: {}: field is immutable", q(&new_uid)),
            "metadata.uid".to_string(),
        );
        let causes = if t.res == Res::Pods {
            vec![cause.clone(), cause]
        } else {
            vec![cause]
        };
        return Err(invalid(t.res, &name, causes));
    }
    if t.res == Res::Leases {
        validate_lease(&new)?;
    }
    // NodeRestriction.
    if let Some(node) = ctx.user.node_name() {
        match t.res {
            Res::Nodes => {
                if name != node {
                    return Err(admission_forbidden(
                        t.res,
                        &name,
                        format!(
                            "node {} is not allowed to modify node {}",
                            q(node),
                            q(&name)
                        ),
                    ));
                }
                if old["spec"]["taints"] != new["spec"]["taints"] {
                    return Err(admission_forbidden(
                        t.res,
                        &name,
                        format!("node {} is not allowed to modify taints", q(node)),
                    ));
                }
                let old_labels = &old["metadata"]["labels"];
                let new_labels = &new["metadata"]["labels"];
                let mut changed: Vec<String> = label_keys(&new)
                    .into_iter()
                    .filter(|k| old_labels.get(k) != new_labels.get(k))
                    .collect();
                changed.extend(
                    label_keys(&old)
                        .into_iter()
                        .filter(|k| new_labels.get(k).is_none()),
                );
                let bad = forbidden_labels(&changed);
                if !bad.is_empty() {
                    return Err(admission_forbidden(
                        t.res,
                        &name,
                        format!("is not allowed to modify labels: {}", bad.join(", ")),
                    ));
                }
            }
            Res::Pods if t.sub.is_some() => {
                if sv(&old, &["spec", "nodeName"]) != node {
                    return Err(admission_forbidden(
                        t.res,
                        &name,
                        format!("node {} can only update pod status for pods with spec.nodeName set to itself", q(node)),
                    ));
                }
                if old["metadata"]["labels"] != new["metadata"]["labels"] {
                    return Err(admission_forbidden(
                        t.res,
                        &name,
                        format!("node {} cannot update labels through pod status", q(node)),
                    ));
                }
            }
            _ => {}
        }
    }
    let mut cmp_old = old.clone();
    let mut cmp_new = new.clone();
    for v in [&mut cmp_old, &mut cmp_new] {
        let meta = obj_mut(v, "metadata");
        meta.remove("managedFields");
        meta.remove("resourceVersion");
    }
    if cmp_old == cmp_new {
        return Ok(old);
    }
    record_manager(
        &mut new,
        &ctx.manager,
        t.res.api_version(),
        sent,
        t.sub.as_deref() == Some("status"),
    );
    let key = (t.res, t.ns.clone(), name);
    Ok(st.write(key, EventType::Modified, new))
}

#[derive(Clone, Debug, Default)]
pub(super) struct DeleteOptions {
    pub(super) grace: Option<i64>,
    pub(super) uid: Option<String>,
    pub(super) resource_version: Option<String>,
}

impl DeleteOptions {
    pub(super) fn parse(req: &Request) -> Result<DeleteOptions, Status> {
        let mut o = DeleteOptions::default();
        if !req.body.is_empty() {
            let v: Value = serde_json::from_slice(&req.body).map_err(|e| {
                bad_request(format!("the body of the request could not be decoded: {e}"))
            })?;
            o.grace = v["gracePeriodSeconds"].as_i64();
            o.uid = v["preconditions"]["uid"].as_str().map(str::to_string);
            o.resource_version = v["preconditions"]["resourceVersion"]
                .as_str()
                .map(str::to_string);
        }
        if let Some(g) = req.param("gracePeriodSeconds").and_then(|g| g.parse().ok()) {
            o.grace = Some(g);
        }
        Ok(o)
    }
}

/// What a DELETE answers: pods return the pod, other resources a success Status.
pub(super) enum Deleted {
    Object(Value),
    Status(Details),
}

impl Deleted {
    pub(super) fn into_resp(self) -> Resp {
        match self {
            Deleted::Object(v) => Resp::object(200, &v),
            Deleted::Status(d) => {
                let failure = Status::new(200, "", "").with_details(d).json();
                // Reuse the details rendering of Status::json.
                let start = failure.find(r#""details":"#).unwrap_or(0);
                let end = failure.rfind(r#","code":"#).unwrap_or(failure.len());
                Resp::json(
                    200,
                    format!(
                        r#"{{"kind":"Status","apiVersion":"v1","metadata":{{}},"status":"Success",{}}}"#,
                        &failure[start..end]
                    ) + "\n",
                )
            }
        }
    }

    pub(super) fn object(self) -> Option<Value> {
        match self {
            Deleted::Object(v) => Some(v),
            Deleted::Status(_) => None,
        }
    }
}

/// The API's Service defaults (type ClusterIP, sessionAffinity None, each
/// port's protocol TCP and targetPort its port), `clusterIPs` from
/// `clusterIP` as the 1.20 registry fills it, and the empty load balancer
/// status (14a).
fn default_service(obj: &mut Value) {
    let spec = obj_mut(obj, "spec");
    spec.entry("type").or_insert_with(|| json!("ClusterIP"));
    spec.entry("sessionAffinity")
        .or_insert_with(|| json!("None"));
    if let Some(Value::Array(ports)) = spec.get_mut("ports") {
        for p in ports.iter_mut().filter_map(Value::as_object_mut) {
            p.entry("protocol").or_insert_with(|| json!("TCP"));
            let port = p.get("port").cloned().unwrap_or(Value::Null);
            let unset = p
                .get("targetPort")
                .is_none_or(|t| t.is_null() || *t == json!(0) || *t == json!(""));
            if unset {
                p.insert("targetPort".into(), port);
            }
        }
    }
    let ip = spec
        .get("clusterIP")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if !ip.is_empty() {
        spec.entry("clusterIPs").or_insert_with(|| json!([ip]));
    }
    obj_mut(obj, "status")
        .entry("loadBalancer")
        .or_insert_with(|| json!({}));
}

pub(super) fn delete(
    st: &mut State,
    ctx: &Ctx,
    res: Res,
    ns: &str,
    name: &str,
    opts: &DeleteOptions,
) -> Result<Deleted, Status> {
    let key = (res, ns.to_string(), name.to_string());
    let Some(old) = st.objects.get(&key).cloned() else {
        return Err(not_found(res, name));
    };
    if let Some(node) = ctx.user.node_name() {
        if res == Res::Pods && sv(&old, &["spec", "nodeName"]) != node {
            return Err(admission_forbidden(
                res,
                name,
                format!(
                    "node {} can only delete pods with spec.nodeName set to itself",
                    q(node)
                ),
            ));
        }
    }
    let precondition = |what: &str, want: &str, have: &str, tail: &str| {
        Status::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} {}: the {what} in the precondition ({want}) does not match the {what} in record ({have}). {tail}",
                res.kind(),
                q(name)
            ),
        )
        .with_details(Details {
            name: name.to_string(),
            kind: res.kind().to_string(),
            ..Details::default()
        })
    };
    if let Some(uid) = &opts.uid {
        let have = sv(&old, &["metadata", "uid"]);
        if uid != have {
            return Err(precondition(
                "UID",
                uid,
                have,
                "The object might have been deleted and then recreated",
            ));
        }
    }
    if let Some(rv) = &opts.resource_version {
        let have = sv(&old, &["metadata", "resourceVersion"]);
        if rv != have {
            return Err(precondition(
                "ResourceVersion",
                rv,
                have,
                "The object might have been modified",
            ));
        }
    }
    if res != Res::Pods {
        let uid = sv(&old, &["metadata", "uid"]).to_string();
        st.write(key, EventType::Deleted, old);
        let mut d = details(res, name);
        d.uid = uid;
        return Ok(Deleted::Status(d));
    }
    // Pods: graceful deletion.
    let meta = &old["metadata"];
    let mut pod = old.clone();
    if meta.get("deletionTimestamp").is_some_and(|v| !v.is_null()) {
        let existing = meta["deletionGracePeriodSeconds"].as_i64();
        match (existing, opts.grace) {
            (None | Some(0), _) => {}
            (Some(cur), Some(g)) if g < cur => {
                let g = g.max(0);
                let ts = add_secs(sv(&old, &["metadata", "deletionTimestamp"]), g - cur);
                let m = obj_mut(&mut pod, "metadata");
                m.insert("deletionTimestamp".into(), json!(ts));
                m.insert("deletionGracePeriodSeconds".into(), json!(g));
                pod = st.write(key.clone(), EventType::Modified, pod);
                if g > 0 {
                    return Ok(Deleted::Object(pod));
                }
            }
            _ => return Ok(Deleted::Object(old)),
        }
    } else {
        let terminal = matches!(sv(&old, &["status", "phase"]), "Succeeded" | "Failed");
        let unscheduled = sv(&old, &["spec", "nodeName"]).is_empty();
        let mut g = opts
            .grace
            .or_else(|| old["spec"]["terminationGracePeriodSeconds"].as_i64())
            .unwrap_or(30);
        if terminal || unscheduled {
            g = 0;
        }
        if g < 0 {
            g = 1;
        }
        let ts = add_secs(&now_secs(), g);
        let m = obj_mut(&mut pod, "metadata");
        m.insert("deletionTimestamp".into(), json!(ts));
        m.insert("deletionGracePeriodSeconds".into(), json!(g));
        pod = st.write(key.clone(), EventType::Modified, pod);
        if g > 0 {
            return Ok(Deleted::Object(pod));
        }
    }
    let finalizers = pod["metadata"]["finalizers"]
        .as_array()
        .is_some_and(|f| !f.is_empty());
    if !finalizers {
        st.write(key, EventType::Deleted, pod.clone());
    }
    Ok(Deleted::Object(pod))
}

/// As the CSR registry's create: the request must be a PEM certificate
/// request, a signer and usages are required, the requester's identity is
/// recorded in the spec and any status sent is dropped.
fn admit_csr(user: &User, obj: &mut Value) -> Result<(), Status> {
    let name = st_name(obj);
    let field = |field: &str, detail: &str| {
        invalid(
            Res::CertificateSigningRequests,
            &name,
            vec![(
                "FieldValueInvalid".into(),
                format!("Invalid value: {detail}"),
                field.into(),
            )],
        )
    };
    let b64 = base64::engine::general_purpose::STANDARD;
    let request = b64
        .decode(sv(obj, &["spec", "request"]))
        .map_err(|_| field("spec.request", "not base64"))?;
    let text = String::from_utf8_lossy(&request);
    if !text.starts_with("-----BEGIN CERTIFICATE REQUEST-----") {
        return Err(field(
            "spec.request",
            "PEM block type must be CERTIFICATE REQUEST",
        ));
    }
    if sv(obj, &["spec", "signerName"]).is_empty() {
        return Err(field("spec.signerName", "signerName is required"));
    }
    if obj["spec"]["usages"]
        .as_array()
        .is_none_or(|u| u.is_empty())
    {
        return Err(field("spec.usages", "usages must be provided"));
    }
    let spec = obj_mut(obj, "spec");
    spec.insert("username".into(), json!(user.name));
    spec.insert("groups".into(), json!(user.groups));
    if let Some(m) = obj.as_object_mut() {
        m.insert("status".into(), json!({}));
    }
    Ok(())
}

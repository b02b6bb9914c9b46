//! What the controllers and admission plugins add: the namespace's token
//! Secret and root-CA ConfigMap, NodeRestriction's label checks, defaults
//! for nodes, events, pods and services, pod admission, the QoS class, and
//! what an update may change.

use super::*;

/// What the token and root-CA controllers publish in a namespace once it is
/// used: the `<sa>-token-<suffix>` Secret and the `kube-root-ca.crt` ConfigMap.
pub(super) fn publish_namespace_objects(st: &mut State, ns: &str, sa: &str) {
    let secret = format!("{sa}-token-{}", st.sa_suffix);
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    // Written by the controller manager's token and root-CA controllers.
    let controllers = Ctx {
        user: User::admin(),
        manager: "kube-controller-manager".into(),
    };
    if st.get(Res::Secrets, ns, &secret).is_none() {
        let obj = json!({
            "metadata": {
                "name": secret,
                "annotations": {
                    "kubernetes.io/service-account.name": sa,
                    // The ServiceAccount's; the fake stores none.
                    "kubernetes.io/service-account.uid": new_uid(),
                },
            },
            "type": "kubernetes.io/service-account-token",
            "data": {
                "ca.crt": b64(FAKE_ROOT_CA),
                "namespace": b64(ns),
                "token": b64(&format!("fake-secret-token.{ns}.{sa}")),
            },
        });
        let _ = create(st, &controllers, Res::Secrets, ns, obj);
    }
    if st.get(Res::ConfigMaps, ns, ROOT_CA_CONFIGMAP).is_none() {
        let obj = json!({
            "metadata": {"name": ROOT_CA_CONFIGMAP},
            "data": {"ca.crt": FAKE_ROOT_CA},
        });
        let _ = create(st, &controllers, Res::ConfigMaps, ns, obj);
    }
}

/// As the API's dropDisabledFields: without the EphemeralContainers gate a
/// pod's `spec.ephemeralContainers` is dropped, unless the pod as it was
/// (`old`) already had some.
pub(super) fn drop_disabled_pod_fields(st: &State, old: Option<&Value>, pod: &mut Value) {
    let in_use = old.is_some_and(|o| {
        o["spec"]["ephemeralContainers"]
            .as_array()
            .is_some_and(|l| !l.is_empty())
    });
    if st.ephemeral_containers || in_use {
        return;
    }
    if let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) {
        spec.remove("ephemeralContainers");
    }
}

pub(super) fn st_name(obj: &Value) -> String {
    sv(obj, &["metadata", "name"]).to_string()
}

pub(super) fn label_keys(obj: &Value) -> Vec<String> {
    obj["metadata"]["labels"]
        .as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

/// Labels a node may not set on itself (NodeRestriction).
pub(super) fn forbidden_labels(keys: &[String]) -> Vec<String> {
    const ALLOWED: &[&str] = &[
        "kubernetes.io/hostname",
        "kubernetes.io/arch",
        "kubernetes.io/os",
        "beta.kubernetes.io/instance-type",
        "node.kubernetes.io/instance-type",
        "failure-domain.beta.kubernetes.io/region",
        "failure-domain.beta.kubernetes.io/zone",
        "topology.kubernetes.io/region",
        "topology.kubernetes.io/zone",
        "beta.kubernetes.io/arch",
        "beta.kubernetes.io/os",
    ];
    let mut bad: Vec<String> = keys
        .iter()
        .filter(|k| {
            let Some((ns, _)) = k.split_once('/') else {
                return false;
            };
            if ns == "node-restriction.kubernetes.io"
                || ns.ends_with(".node-restriction.kubernetes.io")
            {
                return true;
            }
            let reserved = ns == "kubernetes.io"
                || ns.ends_with(".kubernetes.io")
                || ns == "k8s.io"
                || ns.ends_with(".k8s.io");
            let kubelet_ns = ["kubelet.kubernetes.io", "node.kubernetes.io"]
                .iter()
                .any(|a| ns == *a || ns.ends_with(&format!(".{a}")));
            reserved && !kubelet_ns && !ALLOWED.contains(&k.as_str())
        })
        .cloned()
        .collect();
    bad.sort();
    bad
}

pub(super) fn default_node(obj: &mut Value) {
    let spec = obj_mut(obj, "spec");
    let taint = json!({"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"});
    let taints = spec.entry("taints").or_insert_with(|| json!([]));
    if let Some(list) = taints.as_array_mut() {
        if !list
            .iter()
            .any(|t| t["key"] == "node.kubernetes.io/not-ready")
        {
            list.push(taint);
        }
    }
    let status = obj_mut(obj, "status");
    status
        .entry("daemonEndpoints")
        .or_insert_with(|| json!({"kubeletEndpoint": {"Port": 0}}));
    let info = status.entry("nodeInfo").or_insert_with(|| json!({}));
    if let Some(m) = info.as_object_mut() {
        for k in [
            "machineID",
            "systemUUID",
            "bootID",
            "kernelVersion",
            "osImage",
            "containerRuntimeVersion",
            "kubeletVersion",
            "kubeProxyVersion",
            "operatingSystem",
            "architecture",
        ] {
            m.entry(k).or_insert_with(|| json!(""));
        }
    }
}

pub(super) fn default_event(obj: &mut Value) {
    let m = obj.as_object_mut().expect("objects are JSON objects");
    m.entry("involvedObject").or_insert_with(|| json!({}));
    m.entry("source").or_insert_with(|| json!({}));
    for k in ["firstTimestamp", "lastTimestamp", "eventTime"] {
        m.entry(k).or_insert(Value::Null);
    }
    for k in ["reportingComponent", "reportingInstance"] {
        m.entry(k).or_insert_with(|| json!(""));
    }
}

/// Secret names a pod refers to (volumes, env, envFrom, image pull secrets).
pub(super) fn pod_refs(pod: &Value, kind: &str) -> Vec<String> {
    let spec = &pod["spec"];
    let mut out = Vec::new();
    let (vol_key, vol_name, env_key, envfrom_key) = match kind {
        "secret" => ("secret", "secretName", "secretKeyRef", "secretRef"),
        _ => ("configMap", "name", "configMapKeyRef", "configMapRef"),
    };
    for v in spec["volumes"].as_array().into_iter().flatten() {
        if let Some(n) = v[vol_key][vol_name].as_str() {
            out.push(n.to_string());
        }
        for s in v["projected"]["sources"].as_array().into_iter().flatten() {
            if let Some(n) = s[vol_key]["name"].as_str() {
                out.push(n.to_string());
            }
        }
    }
    for list in ["containers", "initContainers", "ephemeralContainers"] {
        for c in spec[list].as_array().into_iter().flatten() {
            for e in c["env"].as_array().into_iter().flatten() {
                if let Some(n) = e["valueFrom"][env_key]["name"].as_str() {
                    out.push(n.to_string());
                }
            }
            for e in c["envFrom"].as_array().into_iter().flatten() {
                if let Some(n) = e[envfrom_key]["name"].as_str() {
                    out.push(n.to_string());
                }
            }
        }
    }
    if kind == "secret" {
        for s in spec["imagePullSecrets"].as_array().into_iter().flatten() {
            if let Some(n) = s["name"].as_str() {
                out.push(n.to_string());
            }
        }
    }
    out
}

pub(super) fn admit_pod_create(
    st: &State,
    pod: &mut Value,
    node: Option<&str>,
) -> Result<(), Status> {
    let name = st_name(pod);
    let res = Res::Pods;
    let mirror = pod["metadata"]["annotations"]
        .get(MIRROR_ANNOTATION)
        .is_some();
    // ServiceAccount admission (mutating, so before NodeRestriction).
    if mirror {
        if !sv(pod, &["spec", "serviceAccountName"]).is_empty() {
            return Err(admission_forbidden(
                res,
                &name,
                "a mirror pod may not reference service accounts",
            ));
        }
        if !pod_refs(pod, "secret").is_empty() {
            return Err(admission_forbidden(
                res,
                &name,
                "a mirror pod may not reference secrets",
            ));
        }
        let projects_token = pod["spec"]["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|v| v["projected"]["sources"].as_array().into_iter().flatten())
            .any(|s| s.get("serviceAccountToken").is_some());
        if projects_token {
            return Err(admission_forbidden(
                res,
                &name,
                "a mirror pod may not use ServiceAccountToken volume projections",
            ));
        }
    } else if pod["spec"]["automountServiceAccountToken"] != json!(false) {
        let spec = obj_mut(pod, "spec");
        default_key(spec, "serviceAccountName", json!("default"));
        let sa = spec["serviceAccountName"]
            .as_str()
            .unwrap_or("default")
            .to_string();
        spec.insert("serviceAccount".into(), json!(sa));
        let vol = format!("{sa}-token-{}", st.sa_suffix);
        let volumes = spec.entry("volumes").or_insert_with(|| json!([]));
        if let Some(list) = volumes.as_array_mut() {
            if !list.iter().any(|v| v["name"] == vol.as_str()) {
                list.push(json!({"name": vol, "secret": {"secretName": vol, "defaultMode": 420}}));
            }
        }
        for key in ["initContainers", "containers"] {
            for c in spec
                .get_mut(key)
                .and_then(|v| v.as_array_mut())
                .into_iter()
                .flatten()
            {
                let mounts = obj_mut_list(c, "volumeMounts");
                if !mounts.iter().any(|m| m["mountPath"] == SA_MOUNT_PATH) {
                    mounts.push(json!({"name": vol, "readOnly": true, "mountPath": SA_MOUNT_PATH}));
                }
            }
        }
    } else {
        let spec = obj_mut(pod, "spec");
        default_key(spec, "serviceAccountName", json!("default"));
        let sa = spec["serviceAccountName"].clone();
        spec.insert("serviceAccount".into(), sa);
    }
    default_pod(pod);
    // NodeRestriction.
    if let Some(node) = node {
        if !mirror {
            return Err(admission_forbidden(
                res,
                &name,
                format!(
                    "pod does not have {} annotation, node {} can only create mirror pods",
                    q(MIRROR_ANNOTATION),
                    q(node)
                ),
            ));
        }
        if sv(pod, &["spec", "nodeName"]) != node {
            return Err(admission_forbidden(
                res,
                &name,
                format!(
                    "node {} can only create pods with spec.nodeName set to itself",
                    q(node)
                ),
            ));
        }
        let owners = pod["metadata"]["ownerReferences"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if owners.len() > 1 {
            return Err(admission_forbidden(
                res,
                &name,
                format!(
                    "node {} can only create pods with a single owner reference set to itself",
                    q(node)
                ),
            ));
        }
        let Some(owner) = owners.first() else {
            return Err(admission_forbidden(
                res,
                &name,
                format!(
                    "node {} can only create pods with an owner reference set to itself",
                    q(node)
                ),
            ));
        };
        if owner["apiVersion"] != "v1" || owner["kind"] != "Node" || owner["name"] != node {
            return Err(admission_forbidden(
                res,
                &name,
                format!(
                    "node {} can only create pods with an owner reference set to itself",
                    q(node)
                ),
            ));
        }
        if owner["controller"] != json!(true) {
            return Err(admission_forbidden(
                res,
                &name,
                format!(
                    "node {} can only create pods with a controller owner reference set to itself",
                    q(node)
                ),
            ));
        }
        if owner["blockOwnerDeletion"] == json!(true) {
            return Err(admission_forbidden(
                res,
                &name,
                format!(
                    "node {} must not set blockOwnerDeletion on an owner reference",
                    q(node)
                ),
            ));
        }
        let Some(node_obj) = st.get(Res::Nodes, "", node) else {
            return Err(not_found(Res::Nodes, node));
        };
        let node_uid = sv(node_obj, &["metadata", "uid"]);
        if sv(owner, &["uid"]) != node_uid {
            return Err(admission_forbidden(
                res,
                &name,
                format!(
                    "node {node} UID mismatch: expected {} got {}",
                    sv(owner, &["uid"]),
                    node_uid
                ),
            ));
        }
        if !pod_refs(pod, "configmap").is_empty() {
            return Err(admission_forbidden(
                res,
                &name,
                format!(
                    "node {} can not create pods that reference configmaps",
                    q(node)
                ),
            ));
        }
        let pvc = pod["spec"]["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|v| v.get("persistentVolumeClaim").is_some());
        if pvc {
            return Err(admission_forbidden(
                res,
                &name,
                format!(
                    "node {} can not create pods that reference persistentvolumeclaims",
                    q(node)
                ),
            ));
        }
    }
    // The pod strategy: a new pod is Pending with its QoS class.
    let qos = qos_class(&pod["spec"]);
    pod.as_object_mut()
        .expect("objects are JSON objects")
        .insert(
            "status".into(),
            json!({"phase": "Pending", "qosClass": qos}),
        );
    Ok(())
}

pub(super) fn obj_mut_list<'a>(v: &'a mut Value, key: &str) -> &'a mut Vec<Value> {
    if !v.is_object() {
        *v = json!({});
    }
    let m = v.as_object_mut().expect("made an object above");
    let e = m.entry(key.to_string()).or_insert_with(|| json!([]));
    if !e.is_array() {
        *e = json!([]);
    }
    e.as_array_mut().expect("made an array above")
}

fn default_pull_policy(image: &str) -> &'static str {
    if image.contains('@') {
        return "IfNotPresent";
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.split_once(':') {
        Some((_, "latest")) | None => "Always",
        Some(_) => "IfNotPresent",
    }
}

/// The API's volume defaults: file modes 0644 for the volumes that
/// project files, and an unset `type` for hostPath.
fn default_volumes(spec: &mut Map<String, Value>) {
    let Some(Value::Array(volumes)) = spec.get_mut("volumes") else {
        return;
    };
    for v in volumes.iter_mut().filter_map(Value::as_object_mut) {
        for kind in ["secret", "configMap", "downwardAPI", "projected"] {
            if let Some(Value::Object(source)) = v.get_mut(kind) {
                source.entry("defaultMode").or_insert_with(|| json!(420));
            }
        }
        if let Some(Value::Object(source)) = v.get_mut("hostPath") {
            source.entry("type").or_insert_with(|| json!(""));
        }
    }
}

/// API defaulting and the Priority and DefaultTolerationSeconds plugins.
fn default_pod(pod: &mut Value) {
    let spec = obj_mut(pod, "spec");
    default_volumes(spec);
    default_key(spec, "restartPolicy", json!("Always"));
    default_key(spec, "terminationGracePeriodSeconds", json!(30));
    default_key(spec, "dnsPolicy", json!("ClusterFirst"));
    default_key(spec, "securityContext", json!({}));
    default_key(spec, "schedulerName", json!("default-scheduler"));
    default_key(spec, "enableServiceLinks", json!(true));
    default_key(spec, "priority", json!(0));
    default_key(spec, "preemptionPolicy", json!("PreemptLowerPriority"));
    for key in ["initContainers", "containers"] {
        for c in spec
            .get_mut(key)
            .and_then(|v| v.as_array_mut())
            .into_iter()
            .flatten()
        {
            let Some(cm) = c.as_object_mut() else {
                continue;
            };
            let image = cm
                .get("image")
                .and_then(|v| v.as_str())
                .unwrap_or("")
                .to_string();
            default_key(cm, "resources", json!({}));
            default_key(cm, "terminationMessagePath", json!("/dev/termination-log"));
            default_key(cm, "terminationMessagePolicy", json!("File"));
            default_key(cm, "imagePullPolicy", json!(default_pull_policy(&image)));
            // Requests default to limits.
            if let Some(res) = cm.get_mut("resources").and_then(|r| r.as_object_mut()) {
                if let Some(limits) = res.get("limits").and_then(|l| l.as_object()).cloned() {
                    let req = res.entry("requests").or_insert_with(|| json!({}));
                    if let Some(rm) = req.as_object_mut() {
                        for (k, v) in limits {
                            rm.entry(k).or_insert(v);
                        }
                    }
                }
            }
        }
    }
    let list = spec.entry("tolerations").or_insert_with(|| json!([]));
    if let Some(list) = list.as_array_mut() {
        for taint in [
            "node.kubernetes.io/not-ready",
            "node.kubernetes.io/unreachable",
        ] {
            let tolerated = list.iter().any(|t| {
                let effect_ok = matches!(t["effect"].as_str(), None | Some("") | Some("NoExecute"));
                let key_ok = match t["key"].as_str() {
                    None | Some("") => t["operator"] == "Exists",
                    Some(k) => k == taint,
                };
                effect_ok && key_ok
            });
            if !tolerated {
                list.push(json!({"key": taint, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}));
            }
        }
    }
    if spec
        .get("tolerations")
        .and_then(|t| t.as_array())
        .is_some_and(|t| t.is_empty())
    {
        spec.remove("tolerations");
    }
}

fn qos_class(spec: &Value) -> &'static str {
    let mut any = false;
    let mut guaranteed = true;
    for key in ["initContainers", "containers"] {
        for c in spec[key].as_array().into_iter().flatten() {
            let req = &c["resources"]["requests"];
            let lim = &c["resources"]["limits"];
            for r in ["cpu", "memory"] {
                if req.get(r).is_some() || lim.get(r).is_some() {
                    any = true;
                }
                match (req.get(r), lim.get(r)) {
                    (_, None) => guaranteed = false,
                    (Some(a), Some(b)) if a != b => guaranteed = false,
                    _ => {}
                }
            }
        }
    }
    if !any {
        "BestEffort"
    } else if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

/// What an update may change: the status subresource takes only status,
/// the main resource keeps the old status (for pods and nodes).
pub(super) fn apply_strategy(res: Res, sub: Option<&str>, old: &Value, new: &mut Value) {
    let m = new.as_object_mut().expect("objects are JSON objects");
    match (res, sub) {
        (Res::Pods | Res::Nodes, Some("status")) => {
            m.insert("spec".into(), old["spec"].clone());
            if res == Res::Pods {
                let refs = old["metadata"]["ownerReferences"].clone();
                let meta = obj_mut(new, "metadata");
                if refs.is_null() {
                    meta.remove("ownerReferences");
                } else {
                    meta.insert("ownerReferences".into(), refs);
                }
            }
        }
        (Res::Pods | Res::Nodes, None) => {
            m.insert("status".into(), old["status"].clone());
        }
        _ => {}
    }
    finish_metadata(new, res);
    let meta = obj_mut(new, "metadata");
    for k in [
        "name",
        "namespace",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "managedFields",
    ] {
        match old["metadata"].get(k) {
            Some(v) => {
                meta.insert(k.into(), v.clone());
            }
            None => {
                meta.remove(k);
            }
        }
    }
    meta.remove("selfLink");
}

/// The Lease registry's validation (`ValidateLeaseSpec`): a duration, when
/// set, above 0, and transitions, when set, not negative (the message is
/// the real one, grammar and all).
pub(super) fn validate_lease(obj: &Value) -> Result<(), Status> {
    let spec = &obj["spec"];
    let mut causes = Vec::new();
    if let Some(d) = spec["leaseDurationSeconds"].as_i64().filter(|d| *d <= 0) {
        causes.push((
            "FieldValueInvalid".to_string(),
            format!("Invalid value: {d}: must be greater than 0"),
            "spec.leaseDurationSeconds".to_string(),
        ));
    }
    if let Some(n) = spec["leaseTransitions"].as_i64().filter(|n| *n < 0) {
        causes.push((
            "FieldValueInvalid".to_string(),
            format!("Invalid value: {n}: must to greater or equal than 0"),
            "spec.leaseTransitions".to_string(),
        ));
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(invalid(Res::Leases, &st_name(obj), causes))
    }
}

//! Patches (strategic merge and JSON merge) and `managedFields`,
//! approximated from the fields a request sent.

use super::*;

// ---------------------------------------------------------------------------
// Patches

/// The list fields a strategic merge patch merges by key; every other list
/// is replaced whole.
fn merge_key(field: &str) -> Option<&'static str> {
    Some(match field {
        "conditions" | "addresses" => "type",
        "podIPs" => "ip",
        "containers" | "initContainers" | "ephemeralContainers" | "volumes" | "env" => "name",
        "imagePullSecrets" => "name",
        "volumeMounts" => "mountPath",
        "ports" => "containerPort",
        "ownerReferences" => "uid",
        _ => return None,
    })
}

pub(super) fn merge_patch(orig: &Value, patch: &Value) -> Value {
    match (orig, patch) {
        (Value::Object(o), Value::Object(p)) => {
            let mut out = o.clone();
            for (k, v) in p {
                if v.is_null() {
                    out.remove(k);
                } else {
                    let merged = merge_patch(o.get(k).unwrap_or(&Value::Null), v);
                    out.insert(k.clone(), merged);
                }
            }
            Value::Object(out)
        }
        (_, Value::Object(p)) => merge_patch(&json!({}), &Value::Object(p.clone())),
        _ => patch.clone(),
    }
}

fn strip_directives(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), strip_directives(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(strip_directives).collect()),
        other => other.clone(),
    }
}

pub(super) fn smp(orig: &Value, patch: &Value) -> Result<Value, String> {
    let Some(p) = patch.as_object() else {
        return Ok(patch.clone());
    };
    match p.get("$patch").and_then(|v| v.as_str()) {
        Some("replace") => return Ok(strip_directives(patch)),
        Some("delete") => return Ok(Value::Null),
        Some(other) => return Err(format!("unknown patch type: {other}")),
        None => {}
    }
    let mut out = orig.as_object().cloned().unwrap_or_default();
    if let Some(keep) = p.get("$retainKeys").and_then(|v| v.as_array()) {
        let keep: Vec<&str> = keep.iter().filter_map(|k| k.as_str()).collect();
        out.retain(|k, _| keep.contains(&k.as_str()));
    }
    for (k, v) in p {
        if k.starts_with('$') {
            if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
                if let (Some(Value::Array(list)), Some(del)) = (out.get_mut(field), v.as_array()) {
                    list.retain(|x| !del.contains(x));
                }
            }
            continue;
        }
        if v.is_null() {
            out.remove(k);
            continue;
        }
        let cur = out.get(k).cloned().unwrap_or(Value::Null);
        let merged = match v {
            Value::Object(_) => {
                let base = if cur.is_object() { cur } else { json!({}) };
                smp(&base, v)?
            }
            Value::Array(items) => match merge_key(k) {
                Some(mk) if items.iter().all(|i| i.is_object()) => {
                    let order = p
                        .get(&format!("$setElementOrder/{k}"))
                        .and_then(|o| o.as_array());
                    merge_list(
                        cur.as_array().cloned().unwrap_or_default(),
                        items,
                        mk,
                        order,
                    )?
                }
                _ => strip_directives(v),
            },
            _ => v.clone(),
        };
        if merged.is_null() {
            out.remove(k);
        } else {
            out.insert(k.clone(), merged);
        }
    }
    Ok(Value::Object(out))
}

fn merge_list(
    mut list: Vec<Value>,
    patch: &[Value],
    mk: &str,
    order: Option<&Vec<Value>>,
) -> Result<Value, String> {
    for item in patch {
        let key = &item[mk];
        match item.get("$patch").and_then(|v| v.as_str()) {
            Some("delete") => list.retain(|e| &e[mk] != key),
            Some("replace") => {
                let rest: Vec<Value> = patch
                    .iter()
                    .filter(|i| i.get("$patch").is_none())
                    .map(strip_directives)
                    .collect();
                return Ok(Value::Array(rest));
            }
            Some(other) => return Err(format!("unknown patch type: {other}")),
            None => match list.iter().position(|e| &e[mk] == key) {
                Some(i) => list[i] = smp(&list[i], item)?,
                None => list.push(strip_directives(item)),
            },
        }
    }
    if let Some(order) = order {
        let keys: Vec<&Value> = order.iter().map(|o| &o[mk]).collect();
        let mut ordered: Vec<Value> = Vec::new();
        for k in &keys {
            if let Some(i) = list.iter().position(|e| &&e[mk] == k) {
                ordered.push(list.remove(i));
            }
        }
        ordered.extend(list);
        list = ordered;
    }
    Ok(Value::Array(list))
}

// ---------------------------------------------------------------------------
// managedFields (approximated from the fields a request sent)

fn fields_of(v: &Value, depth: usize) -> Value {
    let mut out = Map::new();
    if let Some(m) = v.as_object() {
        if depth > 1 && !m.is_empty() {
            out.insert(".".into(), json!({}));
        }
        for (k, child) in m {
            if k.starts_with('$') {
                continue;
            }
            let inner = match child {
                Value::Object(c) if !c.is_empty() => {
                    let mut inner = fields_of(child, depth + 1);
                    // Top-level maps (a ConfigMap's or Secret's data) are
                    // owned as a whole too, unlike metadata, spec, status.
                    if depth == 0 && matches!(k.as_str(), "data" | "binaryData") {
                        if let Some(m) = inner.as_object_mut() {
                            m.insert(".".into(), json!({}));
                        }
                    }
                    inner
                }
                Value::Array(items) => match merge_key(k) {
                    Some(mk) if !items.is_empty() && items.iter().all(|i| i.is_object()) => {
                        let mut lm = Map::new();
                        lm.insert(".".into(), json!({}));
                        for i in items {
                            let key = format!("k:{{{}:{}}}", js(mk), i[mk]);
                            lm.insert(key, fields_of(i, 2));
                        }
                        Value::Object(lm)
                    }
                    _ => json!({}),
                },
                _ => json!({}),
            };
            out.insert(format!("f:{k}"), inner);
        }
    }
    Value::Object(out)
}

fn union(a: &mut Value, b: &Value) {
    if let (Some(am), Some(bm)) = (a.as_object_mut(), b.as_object()) {
        for (k, v) in bm {
            match am.get_mut(k) {
                Some(x) => union(x, v),
                None => {
                    am.insert(k.clone(), v.clone());
                }
            }
        }
    }
}

/// The fields a request set, without identity metadata and directives.
fn owned_fields(sent: &Value) -> Value {
    let mut v = strip_directives(sent);
    if let Some(m) = v.as_object_mut() {
        m.remove("kind");
        m.remove("apiVersion");
        if let Some(meta) = m.get_mut("metadata").and_then(|x| x.as_object_mut()) {
            for k in [
                "name",
                "namespace",
                "uid",
                "resourceVersion",
                "creationTimestamp",
                "managedFields",
                "selfLink",
                "generateName",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
            ] {
                meta.remove(k);
            }
            if meta.is_empty() {
                m.remove("metadata");
            }
        }
    }
    v
}

pub(super) fn record_manager(
    obj: &mut Value,
    manager: &str,
    api_version: &str,
    sent: &Value,
    subresource_status: bool,
) {
    let mut fields = owned_fields(sent);
    if subresource_status {
        fields = json!({ "status": fields.get("status").cloned().unwrap_or(json!({})) });
    }
    let fields_v1 = fields_of(&fields, 0);
    if fields_v1.as_object().is_none_or(|m| m.is_empty()) {
        return;
    }
    let meta = obj_mut(obj, "metadata");
    let entries = meta.entry("managedFields").or_insert_with(|| json!([]));
    if !entries.is_array() {
        *entries = json!([]);
    }
    let list = entries.as_array_mut().expect("made an array above");
    let time = now_secs();
    if let Some(e) = list
        .iter_mut()
        .find(|e| e["manager"] == manager && e["operation"] == "Update")
    {
        // The time moves only when the manager's set of fields grows.
        let before = e["fieldsV1"].clone();
        union(&mut e["fieldsV1"], &fields_v1);
        if e["fieldsV1"] != before {
            e["time"] = json!(time);
        }
    } else {
        list.push(json!({
            "manager": manager,
            "operation": "Update",
            "apiVersion": api_version,
            "time": time,
            "fieldsType": "FieldsV1",
            "fieldsV1": fields_v1,
        }));
    }
}

//! `Status` bodies: the apiserver's error answers, written in the recorded
//! key order.

use super::*;

/// A failure answered as a `Status` body.
#[derive(Clone, Debug, Default)]
pub(super) struct Status {
    pub(super) code: u16,
    reason: Option<String>,
    message: String,
    details: Option<Box<Details>>,
    /// Authorization refusals carry `X-Content-Type-Options: nosniff`.
    pub(super) nosniff: bool,
    pub(super) retry_after: Option<u64>,
}

#[derive(Clone, Debug, Default)]
pub(super) struct Details {
    pub(super) name: String,
    pub(super) group: String,
    pub(super) kind: String,
    pub(super) uid: String,
    /// (reason, message, field)
    pub(super) causes: Vec<(String, String, String)>,
    pub(super) retry_after_seconds: u64,
}

/// Go's `'%s'`.
pub(super) fn sq(s: &str) -> String {
    format!("'{s}'")
}

pub(super) fn q(s: &str) -> String {
    // Go's %q for the plain strings used here.
    format!("{s:?}")
}

pub(super) fn js(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

impl Status {
    pub(super) fn new(code: u16, reason: &str, message: impl Into<String>) -> Status {
        Status {
            code,
            reason: (!reason.is_empty()).then(|| reason.to_string()),
            message: message.into(),
            ..Status::default()
        }
    }

    pub(super) fn with_details(mut self, d: Details) -> Status {
        self.details = Some(Box::new(d));
        self
    }

    /// The body, in the key order the apiserver writes.
    pub(super) fn json(&self) -> String {
        let mut s =
            String::from(r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure""#);
        s += &format!(r#","message":{}"#, js(&self.message));
        if let Some(r) = &self.reason {
            s += &format!(r#","reason":{}"#, js(r));
        }
        if let Some(d) = &self.details {
            let mut parts = Vec::new();
            if !d.name.is_empty() {
                parts.push(format!(r#""name":{}"#, js(&d.name)));
            }
            if !d.group.is_empty() {
                parts.push(format!(r#""group":{}"#, js(&d.group)));
            }
            if !d.kind.is_empty() {
                parts.push(format!(r#""kind":{}"#, js(&d.kind)));
            }
            if !d.uid.is_empty() {
                parts.push(format!(r#""uid":{}"#, js(&d.uid)));
            }
            if !d.causes.is_empty() {
                let causes: Vec<String> = d
                    .causes
                    .iter()
                    .map(|(r, m, f)| {
                        let mut c = Vec::new();
                        if !r.is_empty() {
                            c.push(format!(r#""reason":{}"#, js(r)));
                        }
                        if !m.is_empty() {
                            c.push(format!(r#""message":{}"#, js(m)));
                        }
                        if !f.is_empty() {
                            c.push(format!(r#""field":{}"#, js(f)));
                        }
                        format!("{{{}}}", c.join(","))
                    })
                    .collect();
                parts.push(format!(r#""causes":[{}]"#, causes.join(",")));
            }
            if d.retry_after_seconds > 0 {
                parts.push(format!(r#""retryAfterSeconds":{}"#, d.retry_after_seconds));
            }
            s += &format!(r#","details":{{{}}}"#, parts.join(","));
        }
        s += &format!(r#","code":{}}}"#, self.code);
        s
    }
}

pub(super) fn details(res: Res, name: &str) -> Details {
    Details {
        name: name.to_string(),
        group: res.group().to_string(),
        kind: res.resource().to_string(),
        ..Details::default()
    }
}

pub(super) fn not_found(res: Res, name: &str) -> Status {
    Status::new(
        404,
        "NotFound",
        format!("{} {} not found", res.qualified(), q(name)),
    )
    .with_details(details(res, name))
}

pub(super) fn already_exists(res: Res, name: &str) -> Status {
    Status::new(
        409,
        "AlreadyExists",
        format!("{} {} already exists", res.qualified(), q(name)),
    )
    .with_details(details(res, name))
}

pub(super) fn conflict_modified(res: Res, name: &str) -> Status {
    Status::new(
        409,
        "Conflict",
        format!(
            "Operation cannot be fulfilled on {} {}: the object has been modified; please apply your changes to the latest version and try again",
            res.qualified(),
            q(name)
        ),
    )
    .with_details(details(res, name))
}

/// A refusal by admission (NodeRestriction, ServiceAccount): no "User ... cannot" part.
pub(super) fn admission_forbidden(res: Res, name: &str, why: impl std::fmt::Display) -> Status {
    Status::new(
        403,
        "Forbidden",
        format!("{} {} is forbidden: {why}", res.qualified(), q(name)),
    )
    .with_details(details(res, name))
}

pub(super) fn bad_request(message: impl Into<String>) -> Status {
    Status::new(400, "BadRequest", message)
}

/// 422 Invalid with details.kind the Kind, as the apiserver writes it.
/// 422 Invalid for `res`'s kind (`Pod`, `Lease.coordination.k8s.io`).
pub(super) fn invalid(res: Res, name: &str, causes: Vec<(String, String, String)>) -> Status {
    invalid_kind(res.kind(), res.group(), name, causes)
}

/// 422 Invalid as `apierrors.NewInvalid` writes it for the GroupKind
/// `kind`.`group` (the store's own refusals name the resource as the kind).
pub(super) fn invalid_kind(
    kind: &str,
    group: &str,
    name: &str,
    causes: Vec<(String, String, String)>,
) -> Status {
    let mut msgs: Vec<String> = Vec::new();
    for (_, m, f) in &causes {
        let full = format!("{f}: {m}");
        if !msgs.contains(&full) {
            msgs.push(full);
        }
    }
    let summary = if msgs.len() == 1 {
        msgs[0].clone()
    } else {
        format!("[{}]", msgs.join(", "))
    };
    let group_kind = if group.is_empty() {
        kind.to_string()
    } else {
        format!("{kind}.{group}")
    };
    Status::new(
        422,
        "Invalid",
        format!("{group_kind} {} is invalid: {summary}", q(name)),
    )
    .with_details(Details {
        name: name.to_string(),
        group: group.to_string(),
        kind: kind.to_string(),
        causes,
        ..Details::default()
    })
}

pub(super) fn expired(message: &str) -> Status {
    Status::new(410, "Expired", message)
}

//! Node taints (`spec.taints` of the Node): the `Taint` the node registers
//! with, and the `key[=value]:Effect` text of `--register-with-taints` and
//! the configuration file's `registerWithTaints`.

/// A node taint: `key[=value]:Effect`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Taint {
    pub(crate) key: String,
    pub(crate) value: String,
    pub(crate) effect: String,
}

/// Parses `--register-with-taints`: `key=value:Effect` or `key:Effect`, with
/// Effect one of NoSchedule, PreferNoSchedule, NoExecute.
pub(crate) fn parse_taints(v: &str) -> Result<Vec<Taint>, String> {
    let mut out = Vec::new();
    for item in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let Some((kv, effect)) = item.rsplit_once(':') else {
            return Err(format!("taint {item:?}: want key=value:Effect"));
        };
        if !["NoSchedule", "PreferNoSchedule", "NoExecute"].contains(&effect) {
            return Err(format!(
                "taint {item:?}: effect {effect:?} is not NoSchedule, PreferNoSchedule or NoExecute"
            ));
        }
        let (key, value) = kv.split_once('=').unwrap_or((kv, ""));
        if key.is_empty() {
            return Err(format!("taint {item:?}: empty key"));
        }
        out.push(Taint {
            key: key.to_string(),
            value: value.to_string(),
            effect: effect.to_string(),
        });
    }
    Ok(out)
}

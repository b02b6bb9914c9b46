//! The settings table as a whole: the entries tinylet uses
//! (`table::SETTINGS`) and the ones it accepts and ignores
//! (`ignored::IGNORED`), looked up by flag and by field; the fields it
//! applies; `/configz`, read back from the options through the getters.

use serde_json::{Map, Value};

use super::settings::Setting;
use super::Options;

/// Every entry: the ones tinylet uses, then the ignored ones.
pub(super) fn all() -> impl Iterator<Item = &'static Setting> {
    super::table::SETTINGS.iter().chain(super::ignored::IGNORED)
}

pub(super) fn by_flag(name: &str) -> Option<&'static Setting> {
    all().find(|s| s.named(name))
}

pub(super) fn by_field(path: &str) -> Option<&'static Setting> {
    all().find(|s| s.field == Some(path))
}

/// Whether `path` holds fields of the table (`authentication`).
pub(super) fn is_section(path: &str) -> bool {
    all().any(|s| {
        s.field
            .and_then(|f| f.strip_prefix(path))
            .is_some_and(|rest| rest.starts_with('.'))
    })
}

/// The configuration file fields tinylet applies, as dotted paths.
#[doc(hidden)]
pub fn config_fields() -> Vec<&'static str> {
    all()
        .filter(|s| s.applied())
        .filter_map(|s| s.field)
        .collect()
}

/// `/configz`: the effective settings under upstream's KubeletConfiguration
/// field names, for the fields tinylet has.
pub(crate) fn configz(o: &Options) -> String {
    let mut root = Map::new();
    for s in all() {
        if let (Some(field), Some(get)) = (s.field, s.get) {
            insert(&mut root, field, get(o));
        }
    }
    let mut top = Map::new();
    top.insert("kubeletconfig".into(), Value::Object(root));
    Value::Object(top).to_string()
}

fn insert(map: &mut Map<String, Value>, path: &str, v: Value) {
    match path.split_once('.') {
        None => {
            map.insert(path.to_string(), v);
        }
        Some((head, rest)) => {
            let inner = map
                .entry(head.to_string())
                .or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(inner) = inner {
                insert(inner, rest, v);
            }
        }
    }
}

//! A strict line-grammar check of the Prometheus text format 0.0.4, for
//! tests: every page rendered is run through [`parse`].

use std::collections::{HashMap, HashSet};

/// One sample: name, labels in order, value.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Sample {
    pub(crate) name: String,
    pub(crate) labels: Vec<(String, String)>,
    pub(crate) value: f64,
}

fn valid_name(n: &str) -> bool {
    let mut c = n.chars();
    matches!(c.next(), Some(ch) if ch.is_ascii_alphabetic() || ch == '_' || ch == ':')
        && c.all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == ':')
}

fn value(v: &str) -> Result<f64, String> {
    match v {
        "+Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        v => v.parse().map_err(|_| format!("bad value {v:?}")),
    }
}

/// Parses a page; errors name the line. Checks: HELP then TYPE once per
/// family before its samples, valid names, label syntax and escapes,
/// samples of a family together, histogram buckets cumulative and ending
/// in `+Inf` equal to `_count`.
pub(crate) fn parse(page: &str) -> Result<Vec<Sample>, String> {
    let mut types: HashMap<String, String> = HashMap::new();
    let mut helped: HashSet<String> = HashSet::new();
    let mut closed: HashSet<String> = HashSet::new();
    let mut current: Option<String> = None;
    let mut samples = Vec::new();
    for (i, line) in page.lines().enumerate() {
        let err = |m: String| format!("line {}: {m}: {line:?}", i + 1);
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, _) = rest
                .split_once(' ')
                .ok_or_else(|| err("HELP without text".into()))?;
            if !valid_name(name) || !helped.insert(name.to_string()) {
                return Err(err("bad or repeated HELP".into()));
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest
                .split_once(' ')
                .ok_or_else(|| err("TYPE without kind".into()))?;
            if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind) {
                return Err(err("unknown type".into()));
            }
            if types.insert(name.to_string(), kind.to_string()).is_some() {
                return Err(err("second TYPE".into()));
            }
            if let Some(c) = current.replace(name.to_string()) {
                closed.insert(c);
            }
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            return Err(err("unexpected comment or empty line".into()));
        }
        // name{labels} value [timestamp]
        let name_end = line
            .find(['{', ' '])
            .ok_or_else(|| err("no value".into()))?;
        let name = &line[..name_end];
        if !valid_name(name) {
            return Err(err("bad name".into()));
        }
        let mut rest = &line[name_end..];
        let mut labels = Vec::new();
        if let Some(r) = rest.strip_prefix('{') {
            let bytes = r.as_bytes();
            let mut j = 0;
            loop {
                if bytes.get(j) == Some(&b'}') {
                    rest = &r[j + 1..];
                    break;
                }
                let eq = r[j..]
                    .find("=\"")
                    .ok_or_else(|| err("label without =\"".into()))?;
                let lname = &r[j..j + eq];
                if !valid_name(lname) || lname.starts_with("__") {
                    return Err(err(format!("bad label name {lname:?}")));
                }
                let mut val = String::new();
                j += eq + 2;
                loop {
                    match bytes.get(j) {
                        None => return Err(err("unterminated label value".into())),
                        Some(b'"') => break,
                        Some(b'\\') => {
                            match bytes.get(j + 1) {
                                Some(b'\\') => val.push('\\'),
                                Some(b'"') => val.push('"'),
                                Some(b'n') => val.push('\n'),
                                _ => return Err(err("bad escape".into())),
                            }
                            j += 2;
                        }
                        Some(_) => {
                            let ch = r[j..].chars().next().ok_or_else(|| err("utf8".into()))?;
                            if ch == '\n' {
                                return Err(err("raw newline".into()));
                            }
                            val.push(ch);
                            j += ch.len_utf8();
                        }
                    }
                }
                if labels.iter().any(|(n, _): &(String, String)| n == lname) {
                    return Err(err("repeated label".into()));
                }
                labels.push((lname.to_string(), val));
                j += 1;
                match bytes.get(j) {
                    Some(b',') => j += 1,
                    Some(b'}') => {}
                    _ => return Err(err("expected , or }".into())),
                }
            }
        }
        let rest = rest
            .strip_prefix(' ')
            .ok_or_else(|| err("no space before value".into()))?;
        let mut f = rest.split(' ');
        let v = value(f.next().unwrap_or(""))?;
        if let Some(ts) = f.next() {
            ts.parse::<i64>().map_err(|_| err("bad timestamp".into()))?;
        }
        if f.next().is_some() {
            return Err(err("trailing fields".into()));
        }
        let family = types
            .keys()
            .filter(|t| {
                *t == name
                    || (types[*t] == "histogram"
                        && [("_bucket"), ("_sum"), ("_count")]
                            .iter()
                            .any(|s| name.strip_suffix(s) == Some(t.as_str())))
            })
            .max_by_key(|t| t.len())
            .cloned()
            .ok_or_else(|| err("sample before its TYPE".into()))?;
        if current.as_deref() != Some(family.as_str()) || closed.contains(&family) {
            return Err(err("sample outside its family's block".into()));
        }
        if !helped.contains(&family) {
            return Err(err("no HELP".into()));
        }
        if types[&family] == "histogram"
            && name.ends_with("_bucket")
            && !labels.iter().any(|l| l.0 == "le")
        {
            return Err(err("bucket without le".into()));
        }
        samples.push(Sample {
            name: name.to_string(),
            labels,
            value: v,
        });
    }
    check_histograms(&samples, &types)?;
    Ok(samples)
}

type Labels = Vec<(String, String)>;

fn check_histograms(samples: &[Sample], types: &HashMap<String, String>) -> Result<(), String> {
    for (fam, _) in types.iter().filter(|(_, k)| *k == "histogram") {
        let bucket = format!("{fam}_bucket");
        let count = format!("{fam}_count");
        // Group by the labels other than le.
        let mut groups: HashMap<Labels, Vec<(f64, f64)>> = HashMap::new();
        for s in samples.iter().filter(|s| s.name == bucket) {
            let le = s
                .labels
                .iter()
                .find(|l| l.0 == "le")
                .map(|l| l.1.clone())
                .unwrap_or_default();
            let rest: Vec<_> = s.labels.iter().filter(|l| l.0 != "le").cloned().collect();
            groups.entry(rest).or_default().push((value(&le)?, s.value));
        }
        for (labels, buckets) in groups {
            let mut prev = (f64::NEG_INFINITY, 0.0);
            for b in &buckets {
                if b.0 <= prev.0 || b.1 < prev.1 {
                    return Err(format!("{fam}{labels:?}: buckets not increasing"));
                }
                prev = *b;
            }
            if prev.0 != f64::INFINITY {
                return Err(format!("{fam}{labels:?}: no +Inf bucket"));
            }
            let c = samples
                .iter()
                .find(|s| s.name == count && s.labels == labels)
                .ok_or_else(|| format!("{fam}{labels:?}: no _count"))?;
            if c.value != prev.1 {
                return Err(format!("{fam}{labels:?}: +Inf bucket is not _count"));
            }
        }
    }
    Ok(())
}

//! What a setting is: one entry of the table (`table::SETTINGS`, and
//! `ignored::IGNORED` for the upstream ones tinylet accepts and ignores)
//! names its flag, its KubeletConfiguration field (a dotted path such as
//! `authentication.webhook.cacheTTL`), its `Kind`, its line in `--help`
//! and how it is applied to `Options` and read back for `/configz`.
//!
//! A `Kind` turns a flag's text and a file's JSON value alike into one
//! `Val`, so that a setter does not know where its value came from; the
//! callers name the flag (`flag --x: ...`) or the file and field
//! (`--config f: x: ...`) in the errors.

use std::net::IpAddr;
use std::time::Duration;

use serde_json::Value;

use super::Options;
use crate::node::taint::Taint;

/// Sets a value that the kind has already checked.
pub(super) type Put = fn(&mut Options, Val);
/// Sets a value, with a check of its own; the error names neither flag
/// nor field.
pub(super) type Check = fn(&mut Options, Val) -> Result<(), String>;
/// The current value as `/configz` shows it (and `--help` its default).
pub(super) type Get = fn(&Options) -> Value;

#[derive(Clone, Copy)]
pub(super) enum Apply {
    Put(Put),
    Check(Check),
}

/// The part of `--help` an entry is listed in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Section {
    General,
    Cluster,
    Auth,
    Gc,
    Eviction,
    NodeApi,
    Logging,
    /// Not in `--help`: the configuration file's fields without a flag,
    /// aliases' targets elsewhere, the ignored flags.
    Hidden,
}

/// What `--help` shows as an entry's default.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Shown {
    /// Nothing.
    No,
    /// The getter's value on `Options::default()`.
    Getter,
    /// This text.
    Text(&'static str),
}

/// How a value is written, on the command line and in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    /// Alone on the command line it means true.
    Bool,
    Duration,
    Str,
    Path,
    Ip,
    /// A percentage: a `u8` flag, 0 to 100 in the file.
    Percent,
    Port,
    U32,
    U64,
    /// Above 0.
    PositiveU64,
    /// A signed count; the file's error wants this.
    I64(&'static str),
    /// Requests per second, 0 or more.
    Rate,
    /// `--v`.
    Level,
    /// A quantity (`10Mi`), checked by the setter.
    Quantity,
    /// Comma-separated IP addresses; a list in the file.
    IpList,
    /// Comma-separated names; a list in the file.
    Names,
    /// `key<sep>value,...`; a map of strings in the file. The first use
    /// on the command line replaces the map, later ones add to it.
    Map(char),
    /// `Name:value,...`; a map of lists in the file; added as `Map`.
    Headers,
    /// `resource=quantity,...`; a map of quantities in the file.
    Reserved,
    /// `--node-labels`.
    Labels,
    /// `key=value:Effect,...`; a list of taints in the file.
    Taints,
}

/// A value, wherever it came from.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Val {
    Bool(bool),
    Str(String),
    Dur(Duration),
    Ip(IpAddr),
    Uint(u64),
    Int(i64),
    Float(f32),
    Ips(Vec<IpAddr>),
    List(Vec<String>),
    /// `replace`: the pairs replace the setting's; else they are added.
    Pairs {
        pairs: Vec<(String, String)>,
        replace: bool,
    },
    Taints(Vec<Taint>),
}

impl Val {
    pub(super) fn bool(self) -> bool {
        matches!(self, Val::Bool(true))
    }

    pub(super) fn string(self) -> String {
        match self {
            Val::Str(s) => s,
            _ => String::new(),
        }
    }

    /// The string, `None` when empty.
    pub(super) fn nonempty(self) -> Option<String> {
        Some(self.string()).filter(|s| !s.is_empty())
    }

    pub(super) fn path(self) -> Option<std::path::PathBuf> {
        self.nonempty().map(std::path::PathBuf::from)
    }

    pub(super) fn dur(self) -> Duration {
        match self {
            Val::Dur(d) => d,
            _ => Duration::ZERO,
        }
    }

    pub(super) fn ip(self) -> IpAddr {
        match self {
            Val::Ip(ip) => ip,
            _ => IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
        }
    }

    pub(super) fn uint(self) -> u64 {
        match self {
            Val::Uint(n) => n,
            _ => 0,
        }
    }

    /// The kind checked the range; saturates otherwise.
    pub(super) fn u32(self) -> u32 {
        u32::try_from(self.uint()).unwrap_or(u32::MAX)
    }

    pub(super) fn u16(self) -> u16 {
        u16::try_from(self.uint()).unwrap_or(u16::MAX)
    }

    pub(super) fn u8(self) -> u8 {
        u8::try_from(self.uint()).unwrap_or(u8::MAX)
    }

    pub(super) fn int(self) -> i64 {
        match self {
            Val::Int(n) => n,
            _ => 0,
        }
    }

    pub(super) fn float(self) -> f32 {
        match self {
            Val::Float(f) => f,
            _ => 0.0,
        }
    }

    pub(super) fn ips(self) -> Vec<IpAddr> {
        match self {
            Val::Ips(v) => v,
            _ => Vec::new(),
        }
    }

    pub(super) fn list(self) -> Vec<String> {
        match self {
            Val::List(v) => v,
            _ => Vec::new(),
        }
    }

    /// Replaces or extends `into` with the pairs.
    pub(super) fn merge_into<C>(self, into: &mut C)
    where
        C: Default + Extend<(String, String)>,
    {
        if let Val::Pairs { pairs, replace } = self {
            if replace {
                *into = C::default();
            }
            into.extend(pairs);
        }
    }

    pub(super) fn taints(self) -> Vec<Taint> {
        match self {
            Val::Taints(t) => t,
            _ => Vec::new(),
        }
    }
}

impl Kind {
    /// The word after the flag in `--help`.
    pub(super) fn name(self) -> &'static str {
        match self {
            Kind::Bool => "bool",
            Kind::Duration => "duration",
            Kind::Str | Kind::Path => "string",
            Kind::Ip => "ip",
            Kind::Percent
            | Kind::Port
            | Kind::U32
            | Kind::U64
            | Kind::PositiveU64
            | Kind::I64(_)
            | Kind::Level => "int",
            Kind::Rate => "float",
            Kind::Quantity => "quantity",
            Kind::Headers => "'Name:value'",
            Kind::IpList
            | Kind::Names
            | Kind::Map(_)
            | Kind::Reserved
            | Kind::Labels
            | Kind::Taints => "list",
        }
    }

    /// A flag's later uses add to what its first one set.
    pub(super) fn additive(self) -> bool {
        matches!(self, Kind::Map(_) | Kind::Headers)
    }

    /// A flag's text as a value; the error is the flag's without its name.
    pub(super) fn parse_flag(self, v: &str) -> Result<Val, String> {
        let number = || format!("invalid number {v:?}");
        Ok(match self {
            Kind::Bool => Val::Bool(parse_bool(v).ok_or_else(|| format!("invalid boolean {v:?}"))?),
            Kind::Duration => Val::Dur(super::parse_duration(v)?),
            Kind::Str | Kind::Path | Kind::Quantity => Val::Str(v.to_string()),
            Kind::Ip => Val::Ip(ip(v)?),
            Kind::Percent => Val::Uint(v.parse::<u8>().map_err(|_| number())?.into()),
            Kind::Port => Val::Uint(v.parse::<u16>().map_err(|_| number())?.into()),
            Kind::U32 => Val::Uint(v.parse::<u32>().map_err(|_| number())?.into()),
            Kind::U64 => Val::Uint(v.parse::<u64>().map_err(|_| number())?),
            Kind::PositiveU64 => Val::Uint(
                v.parse::<u64>()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| format!("invalid number {v:?} (want one above 0)"))?,
            ),
            Kind::I64(_) => Val::Int(v.parse().map_err(|_| number())?),
            Kind::Rate => Val::Float(
                v.parse::<f32>()
                    .ok()
                    .filter(|q| q.is_finite() && *q >= 0.0)
                    .ok_or_else(|| format!("invalid rate {v:?} (want a number >= 0)"))?,
            ),
            Kind::Level => Val::Uint(
                v.parse::<u8>()
                    .map_err(|_| format!("invalid level {v:?} (want 0-10)"))?
                    .into(),
            ),
            Kind::IpList => Val::Ips(super::parse_ips(v)?),
            Kind::Names => Val::List(
                v.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect(),
            ),
            Kind::Map(sep) => pairs(crate::eviction::parse_map(v, sep)?),
            Kind::Headers => pairs(super::parse_header_pairs(v)?),
            Kind::Reserved => {
                pairs(crate::node::machine::parse_reserved(v).map_err(|e| e.to_string())?)
            }
            Kind::Labels => pairs(super::parse_node_labels(v)?),
            Kind::Taints => Val::Taints(crate::node::taint::parse_taints(v)?),
        })
    }

    /// A file's JSON value at `field` as a value; the error names where in
    /// the field (`clusterDNS[0]`) and what is wrong.
    pub(super) fn parse_json(self, field: &str, v: &Value) -> Result<Val, (String, String)> {
        let at = |msg: String| (field.to_string(), msg);
        let want = |what: &str| at(format!("expected {what}, found {v}"));
        Ok(match self {
            Kind::Bool => Val::Bool(v.as_bool().ok_or_else(|| want("true or false"))?),
            Kind::Duration => Val::Dur(super::parse_duration(&string(field, v)?).map_err(at)?),
            Kind::Str | Kind::Path | Kind::Quantity => Val::Str(string(field, v)?),
            Kind::Ip => Val::Ip(ip(&string(field, v)?).map_err(at)?),
            Kind::Percent => Val::Uint(
                v.as_u64()
                    .filter(|n| *n <= 100)
                    .ok_or_else(|| want("a percentage from 0 to 100"))?,
            ),
            Kind::Port => Val::Uint(
                v.as_u64()
                    .filter(|n| *n <= u64::from(u16::MAX))
                    .ok_or_else(|| want("a port from 0 to 65535"))?,
            ),
            Kind::U32 | Kind::Level => Val::Uint(
                v.as_u64()
                    .filter(|n| *n <= u64::from(u32::MAX))
                    .ok_or_else(|| want("a non-negative integer"))?,
            ),
            Kind::U64 => Val::Uint(v.as_u64().ok_or_else(|| want("a non-negative integer"))?),
            Kind::PositiveU64 => Val::Uint(
                v.as_u64()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| want("an integer above 0"))?,
            ),
            Kind::I64(what) => Val::Int(v.as_i64().ok_or_else(|| want(what))?),
            Kind::Rate => Val::Float(
                v.as_f64()
                    .filter(|q| *q >= 0.0)
                    .ok_or_else(|| want("a number >= 0"))? as f32,
            ),
            Kind::IpList => {
                let items = v.as_array().ok_or_else(|| want("a list of IP addresses"))?;
                let mut out = Vec::new();
                for (i, item) in items.iter().enumerate() {
                    let at = format!("{field}[{i}]");
                    let s = string(&at, item)?;
                    out.push(ip(&s).map_err(|e| (at, e))?);
                }
                Val::Ips(out)
            }
            Kind::Names => {
                let items = v
                    .as_array()
                    .ok_or_else(|| want("a list of sysctl names or patterns"))?;
                let mut out = Vec::new();
                for (i, item) in items.iter().enumerate() {
                    out.push(string(&format!("{field}[{i}]"), item)?);
                }
                Val::List(out)
            }
            Kind::Map(_) => {
                let map = v.as_object().ok_or_else(|| want("a map of strings"))?;
                let mut out = Vec::new();
                for (k, val) in map {
                    out.push((k.clone(), string(&format!("{field}.{k}"), val)?));
                }
                Val::Pairs {
                    pairs: out,
                    replace: true,
                }
            }
            Kind::Headers => {
                let map = v.as_object().ok_or_else(|| want("a map of lists"))?;
                let mut out = Vec::new();
                for (name, values) in map {
                    let at = format!("{field}.{name}");
                    let Value::Array(values) = values else {
                        return Err((at, format!("expected a list of strings, found {values}")));
                    };
                    for (i, value) in values.iter().enumerate() {
                        let at = format!("{at}[{i}]");
                        let value = string(&at, value)?;
                        crate::config::http::check_header(name, &value).map_err(|e| (at, e))?;
                        out.push((name.clone(), value));
                    }
                }
                Val::Pairs {
                    pairs: out,
                    replace: true,
                }
            }
            Kind::Reserved => {
                let map = v.as_object().ok_or_else(|| want("a map of quantities"))?;
                let mut out = Vec::new();
                for (name, q) in map {
                    let key = format!("{field}.{name}");
                    let q = string(&key, q)?;
                    crate::node::machine::check_reserved(name, &q).map_err(|e| (key, e))?;
                    out.push((name.clone(), q));
                }
                Val::Pairs {
                    pairs: out,
                    replace: true,
                }
            }
            Kind::Labels => pairs(super::parse_node_labels(&string(field, v)?).map_err(at)?),
            Kind::Taints => {
                let items = v.as_array().ok_or_else(|| want("a list of taints"))?;
                let mut out = Vec::new();
                for (i, t) in items.iter().enumerate() {
                    let at = format!("{field}[{i}]");
                    let get = |k: &str| t.get(k).and_then(Value::as_str).unwrap_or("");
                    let text = if get("value").is_empty() {
                        format!("{}:{}", get("key"), get("effect"))
                    } else {
                        format!("{}={}:{}", get("key"), get("value"), get("effect"))
                    };
                    let mut parsed =
                        crate::node::taint::parse_taints(&text).map_err(|e| (at.clone(), e))?;
                    if parsed.len() != 1 {
                        return Err((at, "expected one taint with key and effect".into()));
                    }
                    out.append(&mut parsed);
                }
                Val::Taints(out)
            }
        })
    }
}

/// Go's `strconv.ParseBool`.
pub(super) fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "true" | "1" | "t" | "T" | "TRUE" | "True" => Some(true),
        "false" | "0" | "f" | "F" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

fn ip(v: &str) -> Result<IpAddr, String> {
    v.parse().map_err(|_| format!("{v:?} is not an IP address"))
}

fn string(field: &str, v: &Value) -> Result<String, (String, String)> {
    v.as_str()
        .map(str::to_string)
        .ok_or_else(|| (field.to_string(), format!("expected a string, found {v}")))
}

fn pairs(p: impl IntoIterator<Item = (String, String)>) -> Val {
    Val::Pairs {
        pairs: p.into_iter().collect(),
        replace: true,
    }
}

/// One setting.
pub(super) struct Setting {
    /// The flag, without dashes; `None`: a configuration file field only.
    pub(super) flag: Option<&'static str>,
    /// Other names of the flag, not in `--help`.
    pub(super) aliases: &'static [&'static str],
    /// The KubeletConfiguration v1beta1 field, a dotted path.
    pub(super) field: Option<&'static str>,
    pub(super) kind: Kind,
    pub(super) section: Section,
    /// The word after the flag in `--help`, when not the kind's.
    pub(super) metavar: Option<&'static str>,
    /// `--help`'s text, lines split by `\n`; `{}` stands for the default,
    /// else the default (if shown) is added as ` (default ...)`.
    pub(super) doc: &'static str,
    pub(super) shown: Shown,
    /// The file's zero (`0`, `""`, `0s`) leaves the setting as it was, as
    /// upstream's v1beta1 defaulting of non-pointer fields does.
    pub(super) zero_is_default: bool,
    /// The file's `null` leaves the setting as it was.
    pub(super) null_is_absent: bool,
    /// `None`: accepted and ignored.
    pub(super) set: Option<Apply>,
    pub(super) get: Option<Get>,
}

/// A setting with a flag.
pub(super) const fn flag(
    name: &'static str,
    kind: Kind,
    section: Section,
    doc: &'static str,
) -> Setting {
    Setting {
        flag: Some(name),
        aliases: &[],
        field: None,
        kind,
        section,
        metavar: None,
        doc,
        shown: Shown::No,
        zero_is_default: false,
        null_is_absent: false,
        set: None,
        get: None,
    }
}

/// A configuration file field without a flag.
pub(super) const fn field(name: &'static str, kind: Kind, doc: &'static str) -> Setting {
    let mut s = flag("", kind, Section::Hidden, doc);
    s.flag = None;
    s.field = Some(name);
    s
}

impl Setting {
    pub(super) const fn field(mut self, name: &'static str) -> Setting {
        self.field = Some(name);
        self
    }

    pub(super) const fn aliases(mut self, names: &'static [&'static str]) -> Setting {
        self.aliases = names;
        self
    }

    pub(super) const fn metavar(mut self, word: &'static str) -> Setting {
        self.metavar = Some(word);
        self
    }

    pub(super) const fn zero(mut self) -> Setting {
        self.zero_is_default = true;
        self
    }

    pub(super) const fn null_is_absent(mut self) -> Setting {
        self.null_is_absent = true;
        self
    }

    pub(super) const fn put(mut self, f: Put) -> Setting {
        self.set = Some(Apply::Put(f));
        self
    }

    pub(super) const fn check(mut self, f: Check) -> Setting {
        self.set = Some(Apply::Check(f));
        self
    }

    pub(super) const fn get(mut self, f: Get) -> Setting {
        self.get = Some(f);
        self
    }

    /// `--help` shows the getter's default.
    pub(super) const fn shown(mut self) -> Setting {
        self.shown = Shown::Getter;
        self
    }

    pub(super) const fn default_text(mut self, text: &'static str) -> Setting {
        self.shown = Shown::Text(text);
        self
    }

    /// Whether tinylet uses it (else it is accepted and ignored).
    pub(super) fn applied(&self) -> bool {
        self.set.is_some()
    }

    pub(super) fn apply(&self, o: &mut Options, v: Val) -> Result<(), String> {
        match self.set {
            Some(Apply::Put(f)) => {
                f(o, v);
                Ok(())
            }
            Some(Apply::Check(f)) => f(o, v),
            None => Ok(()),
        }
    }

    /// Whether the flag is this one's (or an alias).
    pub(super) fn named(&self, name: &str) -> bool {
        self.flag == Some(name) || self.aliases.contains(&name)
    }
}

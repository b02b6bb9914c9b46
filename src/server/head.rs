//! A request head of the node's API, as the server parsed it: method,
//! target, headers, and the raw bytes (an upgraded session replays the
//! client's request to the runtime's streaming server).

/// One parsed HTTP/1.1 request head.
#[derive(Debug, Clone, Default)]
pub struct RequestHead {
    pub method: String,
    /// The request target as sent: path and query, still percent-encoded.
    pub target: String,
    /// Header names as sent; values that are not UTF-8 are kept lossily.
    pub headers: Vec<(String, String)>,
}

impl RequestHead {
    /// The path part of the target (before `?`), still percent-encoded.
    pub(crate) fn path(&self) -> &str {
        self.target.split_once('?').map_or(&self.target, |(p, _)| p)
    }

    /// The path's segments after its first (the route's own), each
    /// decoded: `/exec/ns/pod/c` gives `ns`, `pod`, `c` (an empty one
    /// stands for each doubled or trailing slash).
    pub(crate) fn path_args(&self) -> Vec<String> {
        self.path()
            .split('/')
            .skip(2)
            .map(|s| percent_decode(s, false))
            .collect()
    }

    /// The query part of the target (after `?`), or "".
    pub(crate) fn query(&self) -> &str {
        self.target.split_once('?').map_or("", |(_, q)| q)
    }

    /// The first value of a header, by case-insensitive name.
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Every value of a query parameter, decoded, in order.
    pub(crate) fn query_values(&self, name: &str) -> Vec<String> {
        query_pairs(self.query())
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v)
            .collect()
    }

    /// The first value of a query parameter, decoded.
    pub(crate) fn query_value(&self, name: &str) -> Option<String> {
        query_pairs(self.query())
            .find(|(k, _)| k == name)
            .map(|(_, v)| v)
    }
}

/// The decoded `key=value` pairs of a query string (`+` is a space, as
/// Go's url.ParseQuery reads it; a bad `%` escape is kept as written).
pub(crate) fn query_pairs(query: &str) -> impl Iterator<Item = (String, String)> + '_ {
    query.split('&').filter(|p| !p.is_empty()).map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (percent_decode(k, true), percent_decode(v, true))
    })
}

/// Percent-decodes one URL component; `plus` turns `+` into a space.
pub(crate) fn percent_decode(s: &str, plus: bool) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => match (hex(b[i + 1]), hex(b[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h << 4 | l);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' if plus => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_decoded_and_repeated_ones_kept_in_order() {
        let h = RequestHead {
            target: "/exec/ns/p/c?command=sh&command=-c&command=echo+a%20b&tty=1&x=%zz".into(),
            ..Default::default()
        };
        assert_eq!(h.path(), "/exec/ns/p/c");
        assert_eq!(h.query_values("command"), ["sh", "-c", "echo a b"]);
        assert_eq!(h.query_value("tty").as_deref(), Some("1"));
        assert_eq!(h.query_value("x").as_deref(), Some("%zz"));
        assert_eq!(h.query_value("missing"), None);
        assert_eq!(percent_decode("a%2", false), "a%2");
        assert_eq!(percent_decode("a+b%2F", false), "a+b/");
    }
}

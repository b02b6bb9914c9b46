//! Times in the API's wire formats: `metav1.Time` (RFC 3339, whole seconds)
//! and `metav1.MicroTime` (six fraction digits), always in UTC; and Go's
//! duration syntax (`1m30s`) that flags and configuration use.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::jiff::Timestamp;

fn split(t: SystemTime) -> (i64, u32) {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    (
        i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        d.subsec_nanos(),
    )
}

/// `2026-11-22T00:45:16Z`
pub(crate) fn rfc3339(t: SystemTime) -> String {
    let (secs, _) = split(t);
    match Timestamp::from_second(secs) {
        Ok(ts) => ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
        Err(_) => "1970-01-01T00:00:00Z".to_string(),
    }
}

/// `2026-11-22T00:45:16.681566Z`
pub(crate) fn micro_time(t: SystemTime) -> String {
    let (secs, nanos) = split(t);
    match Timestamp::from_second(secs) {
        Ok(ts) => format!("{}.{:06}Z", ts.strftime("%Y-%m-%dT%H:%M:%S"), nanos / 1000),
        Err(_) => "1970-01-01T00:00:00.000000Z".to_string(),
    }
}

/// A duration as Go prints it: `1m0s`, `20s`, `1h0m0s`, `500ms`.
pub(crate) fn go_duration(d: Duration) -> String {
    let total = d.as_secs();
    let ms = d.subsec_millis();
    if total == 0 {
        return if ms == 0 {
            "0s".into()
        } else {
            format!("{ms}ms")
        };
    }
    let (h, m, s) = (total / 3600, total / 60 % 60, total % 60);
    let secs = if ms == 0 {
        format!("{s}s")
    } else {
        format!("{s}.{}s", format!("{ms:03}").trim_end_matches('0'))
    };
    match (h, m) {
        (0, 0) => secs,
        (0, m) => format!("{m}m{secs}"),
        (h, m) => format!("{h}h{m}m{secs}"),
    }
}

/// Parses a Go-style duration: a sequence of number+unit (ns, us, ms, s, m, h).
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("invalid duration {s:?} (want e.g. 20s, 1m30s, 500ms)");
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let mut total = 0f64;
    let mut rest = s;
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let n: f64 = rest[..num_end].parse().map_err(|_| bad())?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let mult = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += n * mult;
        rest = &rest[unit_end..];
    }
    Ok(Duration::from_secs_f64(total))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn durations_print_as_go_does() {
        for (d, text) in [
            (Duration::from_secs(60), "1m0s"),
            (Duration::from_secs(20), "20s"),
            (Duration::from_secs(160), "2m40s"),
            (Duration::from_secs(300), "5m0s"),
            (Duration::from_secs(3600), "1h0m0s"),
            (Duration::from_millis(1500), "1.5s"),
            (Duration::from_millis(500), "500ms"),
            (Duration::ZERO, "0s"),
        ] {
            assert_eq!(go_duration(d), text);
            assert_eq!(parse_duration(text), Ok(d), "{text}");
        }
    }

    #[test]
    fn formats_match_the_api() {
        let t = UNIX_EPOCH + Duration::new(1_795_308_316, 681_566_123);
        assert_eq!(rfc3339(t), "2026-11-22T00:45:16Z");
        assert_eq!(micro_time(t), "2026-11-22T00:45:16.681566Z");
        assert_eq!(micro_time(UNIX_EPOCH), "1970-01-01T00:00:00.000000Z");
    }
}

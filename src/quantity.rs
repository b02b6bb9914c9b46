//! Kubernetes resource quantities ("500m", "128Mi", "1e6") as exact
//! integers at a chosen scale, without floats, rounded up as the API's
//! `Value` and `MilliValue` are. Used wherever a quantity meets arithmetic:
//! CRI resources, admission, the downward API, emptyDir size limits.

/// A Kubernetes quantity in thousandths ("500m" → 500, "2" → 2000), rounded
/// up like the API's `MilliValue`.
pub fn parse_millis(q: &str) -> Option<i64> {
    parse_quantity_scaled(q, 3)
}

/// A Kubernetes quantity in whole units, bytes for memory ("128Mi", "1G",
/// "1e6", "1000"), rounded up like the API's `Value`.
pub fn parse_bytes(q: &str) -> Option<i64> {
    parse_quantity_scaled(q, 0)
}

/// Parses a Kubernetes quantity exactly (decimal arithmetic, no floats) and
/// returns `ceil(value * 10^scale)`, saturating at `i64::MAX`.
///
/// The grammar is the API's: an optional `+`, digits with at most one `.`
/// (either side may be empty, not both), then one suffix: a binary one
/// (`Ki` .. `Ei`), a decimal one (`n`, `u`, `m`, none, `k`, `M`, `G`, `T`,
/// `P`, `E`) or a decimal exponent (`e3`, `E-2`). Negative quantities give
/// `None`: nothing here has a use for them.
pub fn parse_quantity_scaled(q: &str, scale: i32) -> Option<i64> {
    parse_quantity_wide(q, scale).map(|v| i64::try_from(v).unwrap_or(i64::MAX))
}

/// Like [`parse_quantity_scaled`], with `u128` room (saturating at
/// `u128::MAX`): for ratios of quantities that `i64` cannot hold at a fine
/// scale, such as gibibytes counted in nanounits.
pub fn parse_quantity_wide(q: &str, scale: i32) -> Option<u128> {
    let q = q.trim();
    let q = q.strip_prefix('+').unwrap_or(q);
    let num_len = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(q.len());
    let (number, suffix) = q.split_at(num_len);
    let (int_part, frac_part) = match number.split_once('.') {
        Some((i, f)) => (i, f),
        None => (number, ""),
    };
    if int_part.is_empty() && frac_part.is_empty() || frac_part.contains('.') {
        return None;
    }
    let (exp10, exp2): (i32, u32) = match suffix {
        "" => (0, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        s => {
            let e = s.strip_prefix(['e', 'E'])?;
            let digits = e.strip_prefix(['+', '-']).unwrap_or(e);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            (e.parse::<i32>().ok().filter(|e| e.abs() <= 1000)?, 0)
        }
    };
    // The digits without the point, and where the point was.
    let digits = format!("{int_part}{frac_part}");
    let digits = digits.trim_start_matches('0');
    if digits.is_empty() {
        return Some(0);
    }
    if digits.len() > 38 {
        // More significant digits than u128 holds: no real request is this big.
        return Some(u128::MAX);
    }
    let mantissa: u128 = digits.parse().ok()?;
    let exp = exp10 + scale - frac_part.len() as i32;
    let scaled = mantissa.checked_mul(1u128 << exp2);
    if exp >= 0 {
        let pow = 10u128.checked_pow(exp as u32);
        return Some(
            scaled
                .zip(pow)
                .and_then(|(m, p)| m.checked_mul(p))
                .unwrap_or(u128::MAX),
        );
    }
    let Some(scaled) = scaled else {
        return Some(u128::MAX);
    };
    match 10u128.checked_pow(exp.unsigned_abs()) {
        Some(den) => Some(scaled.div_ceil(den)),
        // A divisor beyond u128 and a non-zero mantissa: a tiny positive value.
        None => Some(1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        assert_eq!(parse_millis("500m"), Some(500));
        assert_eq!(parse_millis("2"), Some(2000));
        assert_eq!(parse_millis("0.25"), Some(250));
        assert_eq!(parse_millis("x"), None);
        assert_eq!(parse_bytes("128Mi"), Some(128 << 20));
        assert_eq!(parse_bytes("1G"), Some(1_000_000_000));
        assert_eq!(parse_bytes("1e6"), Some(1_000_000));
        assert_eq!(parse_bytes("4096"), Some(4096));
        assert_eq!(parse_bytes("-1"), None);
        assert_eq!(parse_bytes("lots"), None);
    }

    #[test]
    fn quantities_exact() {
        let cases: &[(&str, i32, Option<i64>)] = &[
            // Values a float would round up wrongly.
            ("1.1", 3, Some(1100)),
            ("0.3", 3, Some(300)),
            ("4.35", 3, Some(4350)),
            ("1.1Gi", 0, Some(1181116007)), // 1.1 * 2^30 = 1181116006.4, rounded up
            ("100m", 3, Some(100)),
            ("100m", 0, Some(1)),
            ("1500m", 0, Some(2)),
            ("1n", 3, Some(1)),
            ("0", 3, Some(0)),
            ("0.000", 0, Some(0)),
            ("1k", 3, Some(1_000_000)),
            ("2M", 0, Some(2_000_000)),
            ("1Ki", 0, Some(1024)),
            ("3Ei", 0, Some(3 << 60)),
            ("1E", 0, Some(1_000_000_000_000_000_000)),
            ("1E3", 0, Some(1000)),
            ("5e-1", 3, Some(500)),
            ("12e+2", 0, Some(1200)),
            ("+7", 0, Some(7)),
            (".5", 3, Some(500)),
            ("2.", 3, Some(2000)),
            ("1u", 0, Some(1)),
            // Saturates instead of wrapping.
            ("8Ei", 0, Some(i64::MAX)),
            ("100E", 3, Some(i64::MAX)),
            // Not quantities.
            ("", 0, None),
            (".", 0, None),
            ("1.2.3", 0, None),
            ("-5", 0, None),
            ("1Kb", 0, None),
            ("1e", 0, None),
            ("1e1.5", 0, None),
            ("1 Mi", 0, None),
            ("Mi", 0, None),
        ];
        for &(q, scale, want) in cases {
            assert_eq!(
                parse_quantity_scaled(q, scale),
                want,
                "{q:?} at scale {scale}"
            );
        }
    }
}

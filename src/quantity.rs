//! Kubernetes resource quantities ("500m", "128Mi", "1e6"): the one
//! grammar, read into exact values without floats, and the canonical text
//! apimachinery prints back.
//!
//! Two readings of a parse: [`parse_quantity_scaled`] and friends give
//! integers at a chosen scale, rounded up as the API's `Value` and
//! `MilliValue` are (CRI resources, admission, the downward API, emptyDir
//! size limits, QoS); [`parse_quantity`] gives the exact signed
//! [`Quantity`] with an error naming what is wrong (flags, eviction
//! thresholds, node capacity and allocatable). [`format_decimal_si`] and
//! [`format_binary_si`] print values the way the API does.

use std::fmt;

/// A Kubernetes quantity in thousandths ("500m" → 500, "2" → 2000), rounded
/// up like the API's `MilliValue`.
pub(crate) fn parse_millis(q: &str) -> Option<i64> {
    parse_quantity_scaled(q, 3)
}

/// A Kubernetes quantity in whole units, bytes for memory ("128Mi", "1G",
/// "1e6", "1000"), rounded up like the API's `Value`.
pub(crate) fn parse_bytes(q: &str) -> Option<i64> {
    parse_quantity_scaled(q, 0)
}

/// Parses a Kubernetes quantity exactly (decimal arithmetic, no floats) and
/// returns `ceil(value * 10^scale)`, saturating at `i64::MAX`.
///
/// The grammar is the API's (see `Parts`), after trimming surrounding
/// whitespace as the API's JSON decoding does. Negative quantities give
/// `None`: nothing here has a use for them.
pub(crate) fn parse_quantity_scaled(q: &str, scale: i32) -> Option<i64> {
    parse_quantity_wide(q, scale).map(|v| i64::try_from(v).unwrap_or(i64::MAX))
}

/// Like [`parse_quantity_scaled`], with `u128` room (saturating at
/// `u128::MAX`): for ratios of quantities that `i64` cannot hold at a fine
/// scale, such as gibibytes counted in nanounits.
pub(crate) fn parse_quantity_wide(q: &str, scale: i32) -> Option<u128> {
    let parts = Parts::split(q.trim()).ok()?;
    if parts.negative {
        return None;
    }
    let (int_part, frac_part) = (parts.int, parts.frac);
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
    let exp = parts.exp10 + scale - frac_part.len() as i32;
    let scaled = mantissa.checked_mul(1u128 << parts.exp2);
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

/// A quantity split along the API's grammar: an optional sign, digits with
/// at most one `.` (either side may be empty, not both), then one suffix: a
/// binary one (`Ki` .. `Ei`), a decimal one (`n`, `u`, `m`, none, `k`,
/// `M`, `G`, `T`, `P`, `E`) or a decimal exponent (`e3`, `E-2`, at most
/// 1000 either way). No whitespace anywhere.
struct Parts<'a> {
    negative: bool,
    /// The digits before the point.
    int: &'a str,
    /// The digits after the point.
    frac: &'a str,
    /// The suffix's power of ten.
    exp10: i32,
    /// The suffix's power of two.
    exp2: u32,
}

impl<'a> Parts<'a> {
    /// The parts of `q`, or what is wrong with it.
    fn split(q: &'a str) -> Result<Parts<'a>, String> {
        let negative = match q.as_bytes().first() {
            None => return Err("empty".into()),
            Some(b'-') => true,
            Some(_) => false,
        };
        let unsigned = q.strip_prefix(['-', '+']).unwrap_or(q);
        let int_len = unsigned
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(unsigned.len());
        let (int, rest) = unsigned.split_at(int_len);
        let (frac, suffix) = match rest.strip_prefix('.') {
            Some(after) => {
                let n = after
                    .find(|c: char| !c.is_ascii_digit())
                    .unwrap_or(after.len());
                after.split_at(n)
            }
            None => ("", rest),
        };
        if int.is_empty() && frac.is_empty() {
            return Err("expected a number".into());
        }
        let (exp10, exp2) = match suffix {
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
            s if s.starts_with(['e', 'E']) => {
                let e = &s[1..];
                let digits = e.strip_prefix(['+', '-']).unwrap_or(e);
                if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                    return Err("bad exponent".into());
                }
                let e = e
                    .parse::<i32>()
                    .ok()
                    .filter(|e| e.unsigned_abs() <= 1000)
                    .ok_or("exponent out of range")?;
                (e, 0)
            }
            s => return Err(format!("unknown suffix {s:?}")),
        };
        Ok(Parts {
            negative,
            int,
            frac,
            exp10,
            exp2,
        })
    }
}

/// A quantity that does not parse: the message names the quantity and
/// what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct QuantityError(String);

impl fmt::Display for QuantityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for QuantityError {}

/// A Kubernetes resource quantity, held exactly: `digits × 10^exp`.
///
/// Accepted forms (the apimachinery grammar): an optional sign, a decimal
/// number ("1", "1.5", ".5", "5."), and one suffix: none; decimal SI `n`
/// `u` `m` `k` `M` `G` `T` `P` `E`; binary SI `Ki` `Mi` `Gi` `Ti` `Pi`
/// `Ei`; or a decimal exponent `e<int>` / `E<int>` ("1e3"). No whitespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Quantity {
    pub(crate) digits: i128,
    pub(crate) exp: i32,
}

impl Quantity {
    /// The value rounded away from zero to an integer, as apimachinery's
    /// `Value()`; saturates at the i128 range.
    pub(crate) fn value(&self) -> i128 {
        self.scaled_away_from_zero(0)
    }

    /// The value in thousandths, rounded away from zero (`MilliValue()`).
    pub(crate) fn milli_value(&self) -> i128 {
        self.scaled_away_from_zero(3)
    }

    pub(crate) fn is_negative(&self) -> bool {
        self.digits < 0
    }

    fn scaled_away_from_zero(&self, shift: i32) -> i128 {
        if self.digits == 0 {
            return 0;
        }
        let e = self.exp.saturating_add(shift);
        let saturated = if self.digits > 0 {
            i128::MAX
        } else {
            i128::MIN
        };
        if e >= 0 {
            return pow10(e)
                .and_then(|p| self.digits.checked_mul(p))
                .unwrap_or(saturated);
        }
        match pow10(-e) {
            Some(p) => {
                let (q, r) = (self.digits / p, self.digits % p);
                q + r.signum()
            }
            // |digits| < 10^39 <= p: a nonzero fraction of one.
            None => self.digits.signum(),
        }
    }
}

fn pow10(e: i32) -> Option<i128> {
    u32::try_from(e).ok().and_then(|e| 10i128.checked_pow(e))
}

/// Parses a Kubernetes quantity ("100m", "1.5Gi", "1e3", "-2"). The error
/// names the quantity and what is wrong with it.
pub(crate) fn parse_quantity(q: &str) -> Result<Quantity, QuantityError> {
    let err = |why: &str| QuantityError(format!("quantity {q:?}: {why}"));
    let parts = Parts::split(q).map_err(|why| err(&why))?;
    let mut digits = 0i128;
    for c in parts.int.bytes().chain(parts.frac.bytes()) {
        digits = digits
            .checked_mul(10)
            .and_then(|d| d.checked_add(i128::from(c - b'0')))
            .ok_or_else(|| err("too many digits"))?;
    }
    let digits = digits
        .checked_mul(1i128 << parts.exp2)
        .ok_or_else(|| err("too large"))?;
    // At most 1000 from the suffix and fewer digits than a string holds bytes.
    let frac_len = i32::try_from(parts.frac.len()).map_err(|_| err("too many digits"))?;
    Ok(Quantity {
        digits: if parts.negative { -digits } else { digits },
        exp: parts.exp10 - frac_len,
    })
}

/// Canonical decimal-SI text of a value given in thousandths, as
/// apimachinery prints a DecimalSI quantity: "100m", "2", "110", "1k".
pub(crate) fn format_decimal_si(milli: i128) -> String {
    if milli % 1000 != 0 {
        return format!("{milli}m");
    }
    const SUFFIXES: [&str; 7] = ["", "k", "M", "G", "T", "P", "E"];
    let (mut v, mut i) = (milli / 1000, 0);
    while v != 0 && i < SUFFIXES.len() - 1 && v % 1000 == 0 {
        v /= 1000;
        i += 1;
    }
    format!("{v}{}", SUFFIXES[i])
}

/// Canonical binary-SI text of a value given in thousandths, as
/// apimachinery prints a BinarySI quantity: the largest power-of-1024
/// suffix that keeps it an integer ("24684092Ki", "243497856212", "2Mi");
/// fractions and values under 1024 in magnitude are printed decimal.
pub(crate) fn format_binary_si(milli: i128) -> String {
    if milli % 1000 != 0 {
        return format_decimal_si(milli);
    }
    let v = milli / 1000;
    if v > -1024 && v < 1024 {
        return format_decimal_si(milli);
    }
    const SUFFIXES: [&str; 7] = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    let (mut v, mut i) = (v, 0);
    while i < SUFFIXES.len() - 1 && v % 1024 == 0 {
        v /= 1024;
        i += 1;
    }
    format!("{v}{}", SUFFIXES[i])
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

    #[test]
    fn quantities_parse() {
        let ok: &[(&str, i128, i128)] = &[
            // (text, value rounded up, milli value)
            ("0", 0, 0),
            ("1", 1, 1000),
            ("100m", 1, 100),
            ("1500m", 2, 1500),
            ("0.25", 1, 250),
            (".5", 1, 500),
            ("5.", 5, 5000),
            ("+2", 2, 2000),
            ("-2", -2, -2000),
            ("-1.5", -2, -1500),
            ("1k", 1000, 1_000_000),
            ("1M", 1_000_000, 1_000_000_000),
            ("1G", 1_000_000_000, 1_000_000_000_000),
            ("2T", 2_000_000_000_000, 2_000_000_000_000_000),
            ("1P", 10i128.pow(15), 10i128.pow(18)),
            ("1E", 10i128.pow(18), 10i128.pow(21)),
            ("1Ki", 1024, 1_024_000),
            ("100Mi", 100 << 20, (100 << 20) * 1000),
            ("1.5Gi", 3 << 29, (3 << 29) * 1000),
            ("1Ti", 1 << 40, (1 << 40) * 1000),
            ("1Pi", 1 << 50, (1 << 50) * 1000),
            ("1Ei", 1 << 60, (1 << 60) * 1000),
            ("1e3", 1000, 1_000_000),
            ("1E3", 1000, 1_000_000),
            ("12e-1", 2, 1200),
            ("1e+2", 100, 100_000),
            ("1e-3", 1, 1),
            ("1e-4", 1, 1),
            ("1m", 1, 1),
        ];
        for &(text, value, milli) in ok {
            let q = parse_quantity(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!((q.value(), q.milli_value()), (value, milli), "{text}");
        }
        let bad = [
            ("", "empty"),
            ("lots", "expected a number"),
            ("Mi", "expected a number"),
            ("-", "expected a number"),
            (".", "expected a number"),
            ("1 Gi", "unknown suffix \" Gi\""),
            ("1Gi ", "unknown suffix \"Gi \""),
            ("1.2.3", "unknown suffix \".3\""),
            ("1KB", "unknown suffix \"KB\""),
            ("1ki", "unknown suffix \"ki\""),
            ("1e", "bad exponent"),
            ("1e1.5", "bad exponent"),
            ("1e99999", "exponent out of range"),
            (
                "1000000000000000000000000000000000000000",
                "too many digits",
            ),
            ("100000000000000000000000000Ei", "too large"),
        ];
        for (text, why) in bad {
            let e = parse_quantity(text).unwrap_err().to_string();
            assert_eq!(e, format!("quantity {text:?}: {why}"));
        }
        // Huge exponents saturate instead of wrapping.
        assert_eq!(parse_quantity("1e200").unwrap().value(), i128::MAX);
        assert_eq!(parse_quantity("-1e200").unwrap().value(), i128::MIN);
    }

    #[test]
    fn quantities_format_like_apimachinery() {
        assert_eq!(format_decimal_si(2000), "2");
        assert_eq!(format_decimal_si(1900), "1900m");
        assert_eq!(format_decimal_si(110_000), "110");
        assert_eq!(format_decimal_si(0), "0");
        assert_eq!(format_decimal_si(1_000_000), "1k");
        assert_eq!(format_decimal_si(1_500_000), "1500");
        assert_eq!(format_binary_si(24684092 * 1024 * 1000), "24684092Ki");
        assert_eq!(format_binary_si(243497856212 * 1000), "243497856212");
        assert_eq!(format_binary_si((2 << 20) * 1000), "2Mi");
        assert_eq!(format_binary_si((1 << 30) * 1000), "1Gi");
        assert_eq!(format_binary_si(0), "0");
        assert_eq!(format_binary_si(512_000), "512");
        assert_eq!(format_binary_si(1_000_000), "1k");
        assert_eq!(format_binary_si(1500), "1500m");
    }

    /// The status generator's own nanounit parser (for the QoS class) read
    /// these so; each now comes from [`parse_quantity_wide`] at scale 9.
    #[test]
    fn quantities_in_nanounits() {
        let cases = [
            ("1", Some(1_000_000_000)),
            ("100m", Some(100_000_000)),
            ("0.1", Some(100_000_000)),
            (".5", Some(500_000_000)),
            ("1Ki", Some(1024 * 1_000_000_000)),
            ("1Gi", Some((1u128 << 30) * 1_000_000_000)),
            ("1k", Some(1_000_000_000_000)),
            ("1e3", Some(1_000_000_000_000)),
            ("1E3", Some(1_000_000_000_000)),
            ("2E", Some(2_000_000_000_000_000_000_000_000_000)),
            ("5n", Some(5)),
            ("1.5n", Some(2)),
            ("250u", Some(250_000)),
            ("", None),
            ("abc", None),
            ("1Xi", None),
            ("1e", None),
        ];
        for (q, want) in cases {
            assert_eq!(parse_quantity_wide(q, 9), want, "{q:?}");
        }
    }

    /// Where the deleted parsers differed, the API's reading is kept: its
    /// grammar has `n` and `u` everywhere, a value below one nanounit
    /// rounds up to one, and a value of any size is a value (apimachinery
    /// holds quantities with arbitrary precision).
    #[test]
    fn quantities_where_the_old_copies_differed() {
        // The node's parser refused the `n` and `u` suffixes.
        let q = parse_quantity("250u").unwrap();
        assert_eq!((q.value(), q.milli_value()), (1, 1));
        let q = parse_quantity("5n").unwrap();
        assert_eq!(q, Quantity { digits: 5, exp: -9 });
        assert_eq!(parse_quantity("-1500n").unwrap().milli_value(), -1);
        // The status generator's gave nothing below 1e-38 nanounits, for
        // more than 30 digits, or beyond i128 (the QoS class then took
        // the resource as unset).
        assert_eq!(parse_quantity_wide("1e-50", 9), Some(1));
        assert_eq!(
            parse_quantity_wide("1000000000000000000000000000000000", 0),
            Some(10u128.pow(33))
        );
        assert_eq!(parse_quantity_wide("1e30", 9), Some(u128::MAX));
        // A negative quantity is no value at a scale (it read it negative),
        // while the exact reading keeps its sign.
        assert_eq!(parse_quantity_wide("-1", 9), None);
        assert!(parse_quantity("-1").unwrap().is_negative());
        // Whitespace around a quantity: the scaled readings take JSON's
        // trimmed text, the exact one takes a flag's text as it is.
        assert_eq!(parse_quantity_wide(" 1Ki ", 0), Some(1024));
        assert!(parse_quantity(" 1Ki").is_err());
    }
}

//! A small metrics registry: counters, gauges and duration histograms as
//! process-global statics on atomics, labelled families behind a short
//! lock, and the Prometheus text format 0.0.4 they render to.
//!
//! Recording is an atomic add (plus, for labelled families with free-form
//! label values, a lock and a linear scan; a series is allocated only the
//! first time its label values are seen). Rendering builds text only.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use parking_lot::Mutex;

/// Prometheus' default buckets (client_golang `DefBuckets`).
pub(crate) const DEF_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// `ExponentialBuckets(0.005, 2.5, 14)`, upstream's buckets for runtime
/// operations.
pub(crate) const RUNTIME_BUCKETS: &[f64] = &[
    0.005,
    0.0125,
    0.03125,
    0.078125,
    0.1953125,
    0.48828125,
    1.220703125,
    3.0517578125,
    7.62939453125,
    19.073486328125,
    47.6837158203125,
    119.20928955078125,
    298.0232238525391,
    745.0580596923828,
];

const MAX_BUCKETS: usize = 16;

/// Series a family with free-form label values keeps at most; later label
/// sets are not recorded (a bound on memory whatever callers pass).
const MAX_SERIES: usize = 4096;

/// Writes the `# HELP` and `# TYPE` lines of a family.
pub(crate) fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = write!(out, "# HELP {name} ");
    for c in help.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    let _ = writeln!(out, "\n# TYPE {name} {kind}");
}

/// Appends a label value, escaped as the text format wants.
pub(crate) fn escape_into(out: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// Writes one sample line: `name{k="v",...} value`. `labels` pairs names
/// with values; `extra` is one more pair (the histogram's `le`).
pub(crate) fn sample(out: &mut String, name: &str, labels: &[(&str, &str)], value: f64) {
    sample_at(out, name, labels, value, None);
}

/// As [`sample`], with a timestamp in milliseconds since the epoch.
pub(crate) fn sample_at(
    out: &mut String,
    name: &str,
    labels: &[(&str, &str)],
    value: f64,
    timestamp_ms: Option<i64>,
) {
    out.push_str(name);
    if !labels.is_empty() {
        out.push('{');
        for (i, (k, v)) in labels.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(k);
            out.push_str("=\"");
            escape_into(out, v);
            out.push('"');
        }
        out.push('}');
    }
    out.push(' ');
    push_value(out, value);
    if let Some(t) = timestamp_ms {
        let _ = write!(out, " {t}");
    }
    out.push('\n');
}

/// A float as the text format writes it (`+Inf`, `-Inf`, `NaN`).
pub(crate) fn push_value(out: &mut String, v: f64) {
    if v.is_nan() {
        out.push_str("NaN");
    } else if v.is_infinite() {
        out.push_str(if v > 0.0 { "+Inf" } else { "-Inf" });
    } else {
        let _ = write!(out, "{v}");
    }
}

/// A monotonically increasing count.
pub(crate) struct Counter(AtomicU64);

impl Counter {
    pub(crate) const fn new() -> Self {
        Counter(AtomicU64::new(0))
    }
    pub(crate) fn inc(&self) {
        self.0.fetch_add(1, Relaxed);
    }
    pub(crate) fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

impl Default for Counter {
    fn default() -> Self {
        Self::new()
    }
}

/// A value that goes up and down (whole numbers: counts of things).
pub(crate) struct Gauge(AtomicU64);

impl Gauge {
    pub(crate) const fn new() -> Self {
        Gauge(AtomicU64::new(0))
    }
    pub(crate) fn set(&self, v: u64) {
        self.0.store(v, Relaxed);
    }
    pub(crate) fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

impl Default for Gauge {
    fn default() -> Self {
        Self::new()
    }
}

/// A histogram of durations with fixed upper bounds (at most 16). Counts
/// are kept per bucket and made cumulative when rendered; the sum is kept
/// in nanoseconds.
pub(crate) struct Histogram {
    bounds: &'static [f64],
    buckets: [AtomicU64; MAX_BUCKETS],
    count: AtomicU64,
    sum_nanos: AtomicU64,
}

impl Histogram {
    pub(crate) const fn new(bounds: &'static [f64]) -> Self {
        assert!(bounds.len() <= MAX_BUCKETS);
        #[allow(clippy::declare_interior_mutable_const)]
        const ZERO: AtomicU64 = AtomicU64::new(0);
        Histogram {
            bounds,
            buckets: [ZERO; MAX_BUCKETS],
            count: AtomicU64::new(0),
            sum_nanos: AtomicU64::new(0),
        }
    }

    pub(crate) fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        if let Some(i) = self.bounds.iter().position(|b| secs <= *b) {
            self.buckets[i].fetch_add(1, Relaxed);
        }
        self.count.fetch_add(1, Relaxed);
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos.fetch_add(nanos, Relaxed);
    }

    pub(crate) fn count(&self) -> u64 {
        self.count.load(Relaxed)
    }

    /// Writes the `_bucket`, `_sum` and `_count` lines with `labels`.
    pub(crate) fn render(&self, out: &mut String, name: &str, labels: &[(&str, &str)]) {
        let mut with_le: Vec<(&str, &str)> = Vec::with_capacity(labels.len() + 1);
        with_le.extend_from_slice(labels);
        with_le.push(("le", ""));
        let last = with_le.len() - 1;
        let bucket = format!("{name}_bucket");
        // Read the total first: buckets recorded after it may make a
        // bucket exceed it, so each is capped at the total.
        let count = self.count.load(Relaxed);
        let les: Vec<String> = self
            .bounds
            .iter()
            .map(|b| {
                let mut le = String::new();
                push_value(&mut le, *b);
                le
            })
            .collect();
        let mut cumulative = 0u64;
        for (i, le) in les.iter().enumerate() {
            cumulative = cumulative.saturating_add(self.buckets[i].load(Relaxed));
            with_le[last].1 = le;
            sample(out, &bucket, &with_le, cumulative.min(count) as f64);
        }
        with_le[last].1 = "+Inf";
        sample(out, &bucket, &with_le, count as f64);
        let sum = self.sum_nanos.load(Relaxed) as f64 / 1e9;
        sample(out, &format!("{name}_sum"), labels, sum);
        sample(out, &format!("{name}_count"), labels, count as f64);
    }
}

/// Counters keyed by free-form label values (the label names are the
/// family's). At most [`MAX_SERIES`] series.
pub struct CounterFamily {
    series: Mutex<Vec<(Box<[String]>, u64)>>,
}

impl CounterFamily {
    pub(crate) const fn new() -> Self {
        CounterFamily {
            series: Mutex::new(Vec::new()),
        }
    }

    /// Adds one to the series with these label values.
    pub(crate) fn inc(&self, values: &[&str]) {
        let mut s = self.series.lock();
        if let Some(e) = s
            .iter_mut()
            .find(|(k, _)| k.len() == values.len() && k.iter().zip(values).all(|(a, b)| a == b))
        {
            e.1 += 1;
            return;
        }
        if s.len() < MAX_SERIES {
            s.push((values.iter().map(|v| v.to_string()).collect(), 1));
        }
    }

    /// Drops the series for which `f` (given the label values) is true.
    pub(crate) fn remove_where(&self, f: impl Fn(&[String]) -> bool) {
        let mut s = self.series.lock();
        s.retain(|(k, _)| !f(k));
        if s.capacity() > 2 * s.len() + 16 {
            s.shrink_to_fit();
        }
    }

    /// The label values of each series.
    #[cfg(test)]
    pub(crate) fn label_sets(&self) -> Vec<Vec<String>> {
        self.series.lock().iter().map(|(k, _)| k.to_vec()).collect()
    }

    /// The value of one series (0 when absent).
    pub fn get(&self, values: &[&str]) -> u64 {
        let s = self.series.lock();
        s.iter()
            .find(|(k, _)| k.len() == values.len() && k.iter().zip(values).all(|(a, b)| a == b))
            .map_or(0, |e| e.1)
    }

    /// Writes one sample per series; `names` are the label names.
    pub(crate) fn render(&self, out: &mut String, name: &str, names: &[&str]) {
        let snapshot: Vec<(Box<[String]>, u64)> = self.series.lock().clone();
        let mut labels: Vec<(&str, &str)> = Vec::with_capacity(names.len());
        for (values, v) in &snapshot {
            labels.clear();
            labels.extend(names.iter().copied().zip(values.iter().map(|s| s.as_str())));
            sample(out, name, &labels, *v as f64);
        }
    }
}

impl Default for CounterFamily {
    fn default() -> Self {
        Self::new()
    }
}

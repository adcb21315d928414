//! Metric families of one scrape: each family's series (labels and a value)
//! written as OpenMetrics text, byte for byte as prometheus-client encodes
//! them (its encoder is the reference in the tests), without building each
//! series' labels anew: a process row's labels are made and escaped once
//! and shared by every family that shows the row.
use std::{fmt::Write as _, sync::Arc};

use super::catalog::Metric;
use crate::analysis::distributions::Buckets;

/// Label names and values, in order.
pub type Pairs = Vec<(&'static str, String)>;

/// A series' labels: a set several families share (made, and escaped for
/// the text format, once per scrape) followed by the series' own.
#[derive(Clone, Debug, Default)]
pub struct Labels {
    shared: Option<Arc<Shared>>,
    own: Pairs,
}

#[derive(Debug)]
struct Shared {
    /// Shared in turn by the sets [`Labels::joined`] makes of this one.
    pairs: Arc<Pairs>,
    /// A set shared more widely, after `pairs` (a GPU's labels after a
    /// process's): kept once, not copied into each set that ends with it.
    then: Option<Arc<Shared>>,
    /// `name="value",...` as the text format writes them, `then`'s included.
    text: String,
}

impl Shared {
    fn pairs(&self) -> impl Iterator<Item = &(&'static str, String)> {
        self.pairs.iter().chain(self.then.iter().flat_map(|t| t.pairs.iter()))
    }
}

impl Labels {
    /// Labels several series will carry (cloning them shares them).
    pub fn shared(pairs: Pairs) -> Labels {
        Labels::shared_then(pairs, &Labels::default())
    }

    /// `pairs`, then the shared set of `then` (made once, for many: its text
    /// is copied, not escaped again). `then`'s own labels are not taken.
    pub fn shared_then(pairs: Pairs, then: &Labels) -> Labels {
        // Sized once: `name="value",` each (more only where values need escaping).
        let then_len = then.shared.as_ref().map_or(0, |t| t.text.len() + 1);
        let mut text = String::with_capacity(pairs.iter().map(|(k, v)| k.len() + v.len() + 4).sum::<usize>() + then_len);
        for (i, (k, v)) in pairs.iter().enumerate() {
            if i > 0 {
                text.push(',');
            }
            write_pair(&mut text, k, v);
        }
        let then = then.tail();
        append_set(&mut text, then.as_deref());
        Labels { shared: Some(Arc::new(Shared { pairs: Arc::new(pairs), then, text })), own: Vec::new() }
    }

    /// `head`'s shared set, then `then`'s, each made once for many (a
    /// process's labels before each of its GPUs'): their names and values
    /// are shared, not copied, and their texts joined as they are. A
    /// `head` that itself ends with a set is taken as [`Labels::shared_then`]
    /// would take its pairs.
    pub fn joined(head: &Labels, then: &Labels) -> Labels {
        let Some(h) = head.shared.as_ref().filter(|h| h.then.is_none()) else {
            let pairs = head.shared.iter().flat_map(|h| h.pairs()).cloned().collect();
            return Labels::shared_then(pairs, then);
        };
        let then = then.tail();
        let mut text = String::with_capacity(h.text.len() + 1 + then.as_ref().map_or(0, |t| t.text.len()));
        text.push_str(&h.text);
        append_set(&mut text, then.as_deref());
        Labels { shared: Some(Arc::new(Shared { pairs: h.pairs.clone(), then, text })), own: Vec::new() }
    }

    /// The shared set as the end of another: a set that already ends with
    /// another is taken whole, as pairs.
    fn tail(&self) -> Option<Arc<Shared>> {
        self.shared.as_ref().map(|t| match &t.then {
            None => t.clone(),
            Some(_) => Labels::shared(t.pairs().cloned().collect()).shared.expect("shared"),
        })
    }

    /// One more label, after those there are.
    pub fn push(&mut self, pair: (&'static str, String)) {
        self.own.push(pair);
    }

    /// Every label, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &str)> + '_ {
        let shared = self.shared.iter().flat_map(|s| s.pairs());
        shared.chain(&self.own).map(|(k, v)| (*k, v.as_str()))
    }

    /// The shared set's labels, with a key that is the same for every clone
    /// of it while it lives (encoders cache what they make of it by that key).
    pub fn shared_set(&self) -> Option<(usize, impl Iterator<Item = &(&'static str, String)>)> {
        self.shared.as_ref().map(|s| (Arc::as_ptr(s) as usize, s.pairs()))
    }

    /// The series' own labels, after the shared set.
    pub fn own(&self) -> &Pairs {
        &self.own
    }

    /// `{...}` (with `le` first where given, as prometheus-client places a
    /// bucket's bound), or nothing for no labels.
    fn write(&self, out: &mut String, le: Option<&str>) {
        let shared = self.shared.as_deref().map(|s| s.text.as_str()).filter(|t| !t.is_empty());
        if le.is_none() && shared.is_none() && self.own.is_empty() {
            return;
        }
        out.push('{');
        let mut first = true;
        let mut sep = |out: &mut String| {
            if !std::mem::take(&mut first) {
                out.push(',');
            }
        };
        if let Some(le) = le {
            sep(out);
            write_pair(out, "le", le);
        }
        if let Some(text) = shared {
            sep(out);
            out.push_str(text);
        }
        for (k, v) in &self.own {
            sep(out);
            write_pair(out, k, v);
        }
        out.push('}');
    }
}

impl From<Pairs> for Labels {
    fn from(own: Pairs) -> Self {
        Labels { shared: None, own }
    }
}

/// A set's text after the labels in `text`, comma-separated (nothing for
/// no set or an empty one).
fn append_set(text: &mut String, set: Option<&Shared>) {
    if let Some(t) = set.filter(|t| !t.text.is_empty()) {
        if !text.is_empty() {
            text.push(',');
        }
        text.push_str(&t.text);
    }
}

/// `name="value"`, the value escaped as the text format asks (backslash,
/// double quote, newline); names are the catalog's own.
fn write_pair(out: &mut String, name: &str, value: &str) {
    out.push_str(name);
    out.push_str("=\"");
    // Most values have nothing to escape: one vectorized search says so.
    if memchr::memchr3(b'\\', b'"', b'\n', value.as_bytes()).is_none() {
        out.push_str(value);
        out.push('"');
        return;
    }
    let mut last = 0;
    for (i, b) in value.bytes().enumerate() {
        let escaped = match b {
            b'\\' => "\\\\",
            b'"' => "\\\"",
            b'\n' => "\\n",
            _ => continue,
        };
        out.push_str(&value[last..i]);
        out.push_str(escaped);
        last = i + 1;
    }
    out.push_str(&value[last..]);
    out.push('"');
}

/// A sample's value.
#[derive(Clone, Debug)]
pub enum Value {
    Int(i64),
    Float(f64),
    Count(u64),
    /// A counter of fractional units (CPU seconds).
    FloatCount(f64),
    Histogram(Buckets),
}

impl Value {
    /// A byte count or other figure as a gauge (saturating: no GPU holds 8 EiB).
    pub fn int(v: u64) -> Value {
        Value::Int(i64::try_from(v).unwrap_or(i64::MAX))
    }

    pub fn flag(b: bool) -> Value {
        Value::Int(b as i64)
    }
}

#[derive(Debug)]
struct Family {
    metric: Metric,
    series: Vec<(Labels, Value)>,
}

/// The families of one scrape, in the order they are added.
#[derive(Debug, Default)]
pub struct Families(Vec<Family>);

/// A family's series, to add to: labels as a `Labels` or plain pairs.
pub struct SeriesOf<'a>(&'a mut Vec<(Labels, Value)>);

impl SeriesOf<'_> {
    pub fn push<L: Into<Labels>>(&mut self, (labels, v): (L, Value)) {
        self.0.push((labels.into(), v));
    }

    pub fn extend<L: Into<Labels>>(&mut self, series: impl IntoIterator<Item = (L, Value)>) {
        self.0.extend(series.into_iter().map(|(l, v)| (l.into(), v)));
    }
}

impl Families {
    /// A new family; its series are added to what this returns.
    pub fn add(&mut self, metric: Metric) -> SeriesOf<'_> {
        self.0.push(Family { metric, series: Vec::new() });
        SeriesOf(&mut self.0.last_mut().expect("pushed").series)
    }

    /// Each family's metric and series, in order (for other encoders: OTLP).
    pub fn iter(&self) -> impl Iterator<Item = (&Metric, &[(Labels, Value)])> {
        self.0.iter().map(|f| (&f.metric, f.series.as_slice()))
    }

    /// The whole exposition (OpenMetrics text), ending with `# EOF`.
    pub fn encode(self) -> String {
        // Sized once, from what each sample will take: a scrape of thousands
        // of rows is megabytes, which growing by doubling copies again and
        // faults in twice.
        let mut out = String::with_capacity(self.len_hint());
        for f in &self.0 {
            f.write(&mut out);
        }
        out.push_str("# EOF\n");
        out
    }

    /// About the bytes [`Families::encode`] writes (see [`Family::len_hint`]).
    pub(crate) fn len_hint(&self) -> usize {
        "# EOF\n".len() + self.0.iter().map(Family::len_hint).sum::<usize>()
    }
}

impl Family {
    /// About the bytes [`Family::write`] writes (at least, but for
    /// values to escape and numbers longer than 24 characters).
    fn len_hint(&self) -> usize {
        let head = 2 * self.metric.name.len() + self.metric.help.len() + 32;
        let sample = self.metric.name.len() + 8 + 24;
        let series = self.series.iter().map(|(labels, v)| {
            let own: usize = labels.own.iter().map(|(k, v)| k.len() + v.len() + 4).sum();
            let labels = labels.shared.as_ref().map_or(0, |s| s.text.len() + 1) + own + 2;
            let samples = match v {
                Value::Histogram(b) => 3 + b.bounds.len(),
                _ => 1,
            };
            // A bucket's `le="..."` too.
            samples * (sample + labels) + if samples > 1 { samples * 32 } else { 0 }
        });
        head + series.sum::<usize>()
    }

    fn write(&self, out: &mut String) {
        let name = self.metric.name;
        // Infallible: writing to a String.
        let _ = write!(out, "# HELP {name} {}\n# TYPE {name} {}\n", self.metric.help, self.metric.kind.as_str());
        let (mut ints, mut floats) = (itoa::Buffer::new(), dtoa::Buffer::new());
        for (labels, v) in &self.series {
            let mut sample = |suffix: &str, le: Option<&str>, value: &str| {
                out.push_str(name);
                out.push_str(suffix);
                labels.write(out, le);
                out.push(' ');
                out.push_str(value);
                out.push('\n');
            };
            match v {
                Value::Int(x) => sample("", None, ints.format(*x)),
                Value::Float(x) => sample("", None, floats.format(*x)),
                Value::Count(x) => sample("_total", None, ints.format(*x)),
                Value::FloatCount(x) => sample("_total", None, floats.format(*x)),
                Value::Histogram(b) => {
                    sample("_sum", None, floats.format(b.sum));
                    sample("_count", None, ints.format(b.count));
                    let mut cumulative = 0;
                    let bounds = b.bounds.iter().map(Some).chain([None]);
                    for (bound, n) in bounds.zip(&b.counts) {
                        cumulative += n;
                        let mut bound_text = dtoa::Buffer::new();
                        let le = bound.map_or("+Inf", |&x| bound_text.format(x));
                        sample("_bucket", Some(le), ints.format(cumulative));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use prometheus_client::{
        collector::Collector,
        encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder},
        metrics::{counter::ConstCounter, gauge::ConstGauge, MetricType},
    };

    use super::*;
    use crate::export::prometheus::catalog as m;

    /// The same families through prometheus-client's own encoder: the reference.
    struct Reference<'a>(&'a Families);

    struct ConstHistogram<'a>(&'a Buckets);

    impl std::fmt::Debug for Reference<'_> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("Reference")
        }
    }

    impl std::fmt::Debug for ConstHistogram<'_> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("ConstHistogram")
        }
    }

    impl EncodeMetric for ConstHistogram<'_> {
        fn encode(&self, mut encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
            let b = self.0;
            let buckets: Vec<(f64, u64)> = b.bounds.iter().copied().chain([f64::INFINITY]).zip(b.counts.iter().copied()).collect();
            encoder.encode_histogram::<prometheus_client::encoding::NoLabelSet>(b.sum, b.count, &buckets, None)
        }

        fn metric_type(&self) -> MetricType {
            MetricType::Histogram
        }
    }

    impl Collector for Reference<'static> {
        fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
            for f in &self.0 .0 {
                let mut family = encoder.encode_descriptor(f.metric.name, f.metric.help, None, f.metric.kind)?;
                for (labels, v) in &f.series {
                    let pairs: Vec<(&str, String)> = labels.iter().map(|(k, v)| (k, v.to_string())).collect();
                    let m = family.encode_family(&pairs)?;
                    match v {
                        Value::Int(x) => ConstGauge::new(*x).encode(m)?,
                        Value::Float(x) => ConstGauge::new(*x).encode(m)?,
                        Value::Count(x) => ConstCounter::new(*x).encode(m)?,
                        Value::FloatCount(x) => ConstCounter::new(*x).encode(m)?,
                        Value::Histogram(b) => ConstHistogram(b).encode(m)?,
                    }
                }
            }
            Ok(())
        }
    }

    /// What prometheus-client's encoder writes for `f`.
    pub(in crate::export::prometheus) fn reference(f: Families) -> String {
        let leaked: &'static Families = Box::leak(Box::new(f));
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(Reference(leaked)));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).expect("encodes");
        out
    }

    /// Every kind of value, shared and own labels, hostile label values.
    fn families() -> Families {
        let mut f = Families::default();
        let row = Labels::shared(vec![("pid", "7".into()), ("comm", "a\"b\\c\nd é".into()), ("container", String::new())]);
        f.add(m::PROCESS_MEMORY).extend([(row.clone(), Value::Int(-3)), (Labels::from(vec![]), Value::Int(i64::MAX))]);
        let mut owned = row.clone();
        owned.push(("owner", "lib\"x".into()));
        f.add(m::PROCESS_BY_OWNER).push((owned, Value::int(u64::MAX)));
        // A process's set ending with a GPU's (made once, for many rows), and
        // the corners: nothing before it, nothing in it, a chain ending in a chain.
        let gpu = Labels::shared(vec![("gpu", "0".into()), ("UUID", "GPU-\"1\"".into())]);
        let mut chained = Labels::shared_then(vec![("pid", "8".into()), ("comm", "x\ny".into())], &gpu);
        chained.push(("owner", "z".into()));
        f.add(m::PROCESS_ALLOCATIONS).extend([
            (chained.clone(), Value::Int(1)),
            (Labels::shared_then(vec![], &gpu), Value::Int(2)),
            (Labels::shared_then(vec![("pid", "9".into())], &Labels::shared(vec![])), Value::Int(3)),
            (Labels::shared_then(vec![("pid", "10".into())], &chained), Value::Int(4)),
            // A process's set made once and joined to each GPU's, and the corners:
            // an empty head, an empty tail, a head or a tail that ends in a set.
            (Labels::joined(&row, &gpu), Value::Int(5)),
            (Labels::joined(&Labels::shared(vec![]), &gpu), Value::Int(6)),
            (Labels::joined(&row, &Labels::shared(vec![])), Value::Int(7)),
            (Labels::joined(&row, &Labels::default()), Value::Int(8)),
            (Labels::joined(&chained, &gpu), Value::Int(9)),
            (Labels::joined(&row, &chained), Value::Int(10)),
        ]);
        f.add(m::PROCESS_GROWTH).extend([
            (row.clone(), Value::Float(1.5)),
            (row.clone(), Value::Float(f64::NAN)),
            (row.clone(), Value::Float(-0.0)),
            (row.clone(), Value::Float(1e-300)),
            (row.clone(), Value::Float(f64::INFINITY)),
        ]);
        f.add(m::API_CALLS).push((vec![("api", "cuMemAlloc_v2".to_string()), ("result", "success".to_string())], Value::Count(9)));
        f.add(m::AGENT_CPU).push((vec![], Value::FloatCount(0.25)));
        let mut b = Buckets::new(vec![1e-6, 0.25, 4.0]);
        for x in [1e-7, 0.1, 3.0, 9.0, 9.5] {
            b.observe(x);
        }
        f.add(m::API_LATENCY).extend([(row, Value::Histogram(b.clone())), (Labels::from(vec![]), Value::Histogram(b))]);
        f.add(m::UNKNOWN_EVENTS);
        f
    }

    #[test]
    fn the_text_is_byte_for_byte_what_prometheus_client_writes() {
        assert_eq!(families().encode(), reference(families()));
    }

    #[test]
    fn the_text_is_sized_once() {
        let f = families();
        let hint = f.len_hint();
        let text = f.encode();
        assert!(text.len() <= hint && hint <= 2 * text.len(), "{} bytes written, {hint} reserved", text.len());
    }

    #[test]
    fn shared_labels_come_first_and_iterate_in_order() {
        let mut l = Labels::shared(vec![("a", "1".into()), ("b", "2".into())]);
        l.push(("c", "3".into()));
        assert_eq!(l.iter().collect::<Vec<_>>(), [("a", "1"), ("b", "2"), ("c", "3")]);
        let mut then = Labels::shared_then(vec![("p", "0".into())], &l);
        then.push(("d", "4".into()));
        assert_eq!(
            then.iter().collect::<Vec<_>>(),
            [("p", "0"), ("a", "1"), ("b", "2"), ("d", "4")],
            "the other set's own labels are not taken"
        );
        let twice = Labels::shared_then(vec![("q", "9".into())], &then);
        assert_eq!(twice.iter().collect::<Vec<_>>(), [("q", "9"), ("p", "0"), ("a", "1"), ("b", "2")]);
        let joined = Labels::joined(&Labels::shared(vec![("q", "9".into())]), &then);
        assert_eq!(joined.iter().collect::<Vec<_>>(), twice.iter().collect::<Vec<_>>(), "joined as shared_then makes it");
        let head = Labels::shared(vec![("q", "9".into())]);
        let (a, b) = (Labels::joined(&head, &l), Labels::joined(&head, &then));
        assert!(Arc::ptr_eq(&a.shared.as_ref().unwrap().pairs, &head.shared.as_ref().unwrap().pairs), "the head's pairs shared");
        assert_ne!(a.shared_set().map(|s| s.0), b.shared_set().map(|s| s.0), "each joined set is a set of its own (encoders key by it)");
    }
}

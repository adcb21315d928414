//! Metric families as prometheus-client encodes them: a scrape builds each
//! family's series (labels and a value) and hands them to the encoder as one
//! `Collector`, so that the OpenMetrics text is prometheus-client's own.
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder},
    metrics::{counter::ConstCounter, gauge::ConstGauge, MetricType},
};

use super::catalog::Metric;
use crate::analysis::distributions::Buckets;

pub type Labels = Vec<(&'static str, String)>;

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

/// A histogram from counts kept elsewhere (analysis::distributions).
#[derive(Debug)]
struct ConstHistogram<'a>(&'a Buckets);

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

#[derive(Debug)]
struct Family {
    metric: Metric,
    series: Vec<(Labels, Value)>,
}

/// The families of one scrape, in the order they are added.
#[derive(Debug, Default)]
pub struct Families(Vec<Family>);

impl Families {
    /// A new family; its series are pushed to what this returns.
    pub fn add(&mut self, metric: Metric) -> &mut Vec<(Labels, Value)> {
        self.0.push(Family { metric, series: Vec::new() });
        &mut self.0.last_mut().expect("pushed").series
    }

    /// Each family's metric and series, in order (for other encoders: OTLP).
    pub fn iter(&self) -> impl Iterator<Item = (&Metric, &[(Labels, Value)])> {
        self.0.iter().map(|f| (&f.metric, f.series.as_slice()))
    }

    /// The whole exposition, ending with `# EOF`.
    pub fn encode(self) -> Result<String, std::fmt::Error> {
        let mut out = String::with_capacity(64 * 1024);
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(self));
        prometheus_client::encoding::text::encode(&mut out, &registry)?;
        Ok(out)
    }
}

impl Collector for Families {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for f in &self.0 {
            let mut family = encoder.encode_descriptor(f.metric.name, f.metric.help, None, f.metric.kind)?;
            for (labels, v) in &f.series {
                let m = family.encode_family(labels)?;
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

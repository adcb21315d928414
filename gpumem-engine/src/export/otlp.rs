//! The metrics of /metrics as an OTLP/HTTP protobuf request
//! (`ExportMetricsServiceRequest`, opentelemetry-proto's types): the same
//! families and series, gauges as gauges, counters as cumulative monotonic
//! sums (named with `_total`, as Prometheus exposes them, so that a store
//! fed by OTLP holds the series a scrape would), histograms as cumulative
//! explicit-bucket histograms.
#[cfg(test)]
use opentelemetry_proto::tonic::{
    collector::metrics::v1::ExportMetricsServiceRequest,
    metrics::v1::{
        metric::Data, number_data_point, Gauge, Histogram, Metric as OtlpMetric, NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum,
    },
};
use opentelemetry_proto::tonic::{
    common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue},
    metrics::v1::{AggregationTemporality, HistogramDataPoint},
    resource::v1::Resource,
};
use prometheus_client::metrics::MetricType;
use prost::encoding::{self, encode_key, encode_varint, encoded_len_varint, key_len, message, WireType};
use rustc_hash::FxHashMap;

use super::prometheus::{
    catalog::Metric,
    families::{Families, Labels, Value},
};

/// When the series were read, and since when counters count (Unix ns).
#[derive(Clone, Copy, Debug)]
pub struct Times {
    pub start_ns: u64,
    pub now_ns: u64,
}

fn kv(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue { value: Some(any_value::Value::StringValue(value.to_string())) }),
        ..Default::default()
    }
}

fn attributes(labels: &Labels) -> Vec<KeyValue> {
    labels.iter().map(|(k, v)| kv(k, v)).collect()
}

/// Field numbers of the messages written here by hand (opentelemetry-proto's
/// metrics.proto and common.proto; the tests decode what is written with
/// its generated types and compare it with the same request built of them).
mod field {
    pub const REQUEST_RESOURCE_METRICS: u32 = 1;
    pub const RESOURCE: u32 = 1;
    pub const SCOPE_METRICS: u32 = 2;
    pub const SCOPE: u32 = 1;
    pub const METRICS: u32 = 2;
    pub const NAME: u32 = 1;
    pub const DESCRIPTION: u32 = 2;
    pub const GAUGE: u32 = 5;
    pub const SUM: u32 = 7;
    pub const HISTOGRAM: u32 = 9;
    /// Of Gauge, Sum and Histogram.
    pub const DATA_POINTS: u32 = 1;
    pub const AGGREGATION_TEMPORALITY: u32 = 2;
    pub const IS_MONOTONIC: u32 = 3;
    pub const START_TIME: u32 = 2;
    pub const TIME: u32 = 3;
    pub const AS_DOUBLE: u32 = 4;
    pub const AS_INT: u32 = 6;
    pub const POINT_ATTRIBUTES: u32 = 7;
    pub const KEY: u32 = 1;
    pub const VALUE: u32 = 2;
    pub const STRING_VALUE: u32 = 1;
}

/// A length-delimited field whose body is written already.
fn nested(tag: u32, body: &[u8], out: &mut Vec<u8>) {
    encode_key(tag, WireType::LengthDelimited, out);
    encode_varint(body.len() as u64, out);
    out.extend_from_slice(body);
}

/// A string field, written even when empty (as prost writes a oneof's).
fn text(tag: u32, value: &str, out: &mut Vec<u8>) {
    nested(tag, value.as_bytes(), out);
}

/// A data point's attribute: a KeyValue holding a string AnyValue.
fn attribute(key: &str, value: &str, out: &mut Vec<u8>) {
    let any_len = key_len(field::STRING_VALUE) + encoded_len_varint(value.len() as u64) + value.len();
    let kv_len = key_len(field::KEY)
        + encoded_len_varint(key.len() as u64)
        + key.len()
        + key_len(field::VALUE)
        + encoded_len_varint(any_len as u64)
        + any_len;
    encode_key(field::POINT_ATTRIBUTES, WireType::LengthDelimited, out);
    encode_varint(kv_len as u64, out);
    text(field::KEY, key, out);
    encode_key(field::VALUE, WireType::LengthDelimited, out);
    encode_varint(any_len as u64, out);
    text(field::STRING_VALUE, value, out);
}

/// Writes the request without building it as messages first: a process
/// row's labels are shared by a dozen families, so their attributes are
/// encoded once per request (built as KeyValues for every data point and
/// measured again at every level of nesting, the push cost about 12 000
/// instructions a sample).
struct Encoder {
    t: Times,
    /// A shared label set's attributes, encoded, by `Labels::shared_set`'s key.
    shared: FxHashMap<usize, Vec<u8>>,
    point: Vec<u8>,
    points: Vec<u8>,
    metric: Vec<u8>,
}

impl Encoder {
    /// A NumberDataPoint into `self.points`; nothing for a histogram.
    fn number(&mut self, labels: &Labels, v: &Value, start: bool) {
        let point = &mut self.point;
        point.clear();
        attributes_into(&mut self.shared, labels, point);
        if start && self.t.start_ns != 0 {
            encoding::fixed64::encode(field::START_TIME, &self.t.start_ns, point);
        }
        if self.t.now_ns != 0 {
            encoding::fixed64::encode(field::TIME, &self.t.now_ns, point);
        }
        match v {
            Value::Int(x) => encoding::sfixed64::encode(field::AS_INT, x, point),
            Value::Count(x) => encoding::sfixed64::encode(field::AS_INT, &i64::try_from(*x).unwrap_or(i64::MAX), point),
            Value::Float(x) | Value::FloatCount(x) => encoding::double::encode(field::AS_DOUBLE, x, point),
            Value::Histogram(_) => return,
        }
        nested(field::DATA_POINTS, point, &mut self.points);
    }

    /// One family as a Metric, into `out`.
    fn metric(&mut self, m: &Metric, series: &[(Labels, Value)], out: &mut Vec<u8>) {
        let cumulative = AggregationTemporality::Cumulative as i32;
        self.points.clear();
        let data = match m.kind {
            MetricType::Counter => {
                series.iter().for_each(|(l, v)| self.number(l, v, true));
                encoding::int32::encode(field::AGGREGATION_TEMPORALITY, &cumulative, &mut self.points);
                encoding::bool::encode(field::IS_MONOTONIC, &true, &mut self.points);
                field::SUM
            }
            MetricType::Histogram => {
                // A few series a scrape: as opentelemetry-proto's messages.
                for (l, v) in series {
                    if let Value::Histogram(b) = v {
                        message::encode(field::DATA_POINTS, &histogram(l, b, self.t), &mut self.points);
                    }
                }
                encoding::int32::encode(field::AGGREGATION_TEMPORALITY, &cumulative, &mut self.points);
                field::HISTOGRAM
            }
            _ => {
                series.iter().for_each(|(l, v)| self.number(l, v, false));
                field::GAUGE
            }
        };
        let metric = &mut self.metric;
        metric.clear();
        match m.kind {
            MetricType::Counter => text(field::NAME, &format!("{}_total", m.name), metric),
            _ => text(field::NAME, m.name, metric),
        }
        if !m.help.is_empty() {
            text(field::DESCRIPTION, m.help, metric);
        }
        nested(data, &self.points, metric);
        nested(field::METRICS, metric, out);
    }
}

/// A series' attributes into `out`: its shared set's encoded once per
/// request (kept in `encoded` by `Labels::shared_set`'s key), then its own.
fn attributes_into(encoded: &mut FxHashMap<usize, Vec<u8>>, labels: &Labels, out: &mut Vec<u8>) {
    if let Some((key, pairs)) = labels.shared_set() {
        let shared = encoded.entry(key).or_insert_with(|| {
            let mut b = Vec::new();
            pairs.for_each(|(k, v)| attribute(k, v, &mut b));
            b
        });
        out.extend_from_slice(shared);
    }
    labels.own().iter().for_each(|(k, v)| attribute(k, v, out));
}

fn histogram(labels: &Labels, b: &crate::analysis::distributions::Buckets, t: Times) -> HistogramDataPoint {
    HistogramDataPoint {
        attributes: attributes(labels),
        start_time_unix_nano: t.start_ns,
        time_unix_nano: t.now_ns,
        count: b.count,
        sum: Some(b.sum),
        // One count per bucket, +Inf last: OTLP's layout too.
        bucket_counts: b.counts.clone(),
        explicit_bounds: b.bounds.clone(),
        ..Default::default()
    }
}

fn scope() -> InstrumentationScope {
    InstrumentationScope { name: "gpumem".into(), version: env!("CARGO_PKG_VERSION").into(), ..Default::default() }
}

fn resource(host: &str) -> Resource {
    Resource { attributes: vec![kv("service.name", "gpumem"), kv("host.name", host)], ..Default::default() }
}

/// The request body (`ExportMetricsServiceRequest`): every family with at
/// least one series, under one resource (`service.name` gpumem,
/// `host.name` this node).
pub fn request(fams: &Families, host: &str, t: Times) -> Vec<u8> {
    let mut e = Encoder { t, shared: FxHashMap::default(), point: Vec::new(), points: Vec::new(), metric: Vec::new() };
    // Megabytes at thousands of rows: sized once from the text's size (the
    // protobuf is about as long), not grown by doubling.
    let hint = fams.len_hint();
    let mut scope_metrics = Vec::with_capacity(hint + hint / 4);
    message::encode(field::SCOPE, &scope(), &mut scope_metrics);
    for (m, series) in fams.iter().filter(|(_, s)| !s.is_empty()) {
        e.metric(m, series, &mut scope_metrics);
    }
    // The two messages around it are written with their lengths, so that
    // the scope's bytes are copied once, into a body of the exact size.
    let mut resource_field = Vec::new();
    message::encode(field::RESOURCE, &resource(host), &mut resource_field);
    let scope_len = key_len(field::SCOPE_METRICS) + encoded_len_varint(scope_metrics.len() as u64) + scope_metrics.len();
    let resource_metrics_len = resource_field.len() + scope_len;
    let mut out = Vec::with_capacity(
        key_len(field::REQUEST_RESOURCE_METRICS) + encoded_len_varint(resource_metrics_len as u64) + resource_metrics_len,
    );
    encode_key(field::REQUEST_RESOURCE_METRICS, WireType::LengthDelimited, &mut out);
    encode_varint(resource_metrics_len as u64, &mut out);
    out.extend_from_slice(&resource_field);
    nested(field::SCOPE_METRICS, &scope_metrics, &mut out);
    debug_assert_eq!(out.len(), out.capacity());
    out
}

/// The same request built of opentelemetry-proto's messages: what
/// `request` must decode to.
#[cfg(test)]
pub(crate) fn reference(fams: &Families, host: &str, t: Times) -> ExportMetricsServiceRequest {
    let cumulative = AggregationTemporality::Cumulative as i32;
    let number = |labels: &Labels, v: &Value, start: bool| {
        let value = match v {
            Value::Int(x) => number_data_point::Value::AsInt(*x),
            Value::Count(x) => number_data_point::Value::AsInt(i64::try_from(*x).unwrap_or(i64::MAX)),
            Value::Float(x) | Value::FloatCount(x) => number_data_point::Value::AsDouble(*x),
            Value::Histogram(_) => return None,
        };
        Some(NumberDataPoint {
            attributes: attributes(labels),
            start_time_unix_nano: if start { t.start_ns } else { 0 },
            time_unix_nano: t.now_ns,
            value: Some(value),
            ..Default::default()
        })
    };
    let metric = |m: &Metric, series: &[(Labels, Value)]| {
        let (name, data) = match m.kind {
            MetricType::Counter => {
                let data_points = series.iter().filter_map(|(l, v)| number(l, v, true)).collect();
                (format!("{}_total", m.name), Data::Sum(Sum { data_points, aggregation_temporality: cumulative, is_monotonic: true }))
            }
            MetricType::Histogram => {
                let data_points = series
                    .iter()
                    .filter_map(|(l, v)| match v {
                        Value::Histogram(b) => Some(histogram(l, b, t)),
                        _ => None,
                    })
                    .collect();
                (m.name.to_string(), Data::Histogram(Histogram { data_points, aggregation_temporality: cumulative }))
            }
            _ => {
                let data_points = series.iter().filter_map(|(l, v)| number(l, v, false)).collect();
                (m.name.to_string(), Data::Gauge(Gauge { data_points }))
            }
        };
        OtlpMetric { name, description: m.help.to_string(), data: Some(data), ..Default::default() }
    };
    let metrics = fams.iter().filter(|(_, s)| !s.is_empty()).map(|(m, s)| metric(m, s)).collect();
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: Some(resource(host)),
            scope_metrics: vec![ScopeMetrics { scope: Some(scope()), metrics, ..Default::default() }],
            ..Default::default()
        }],
    }
}

#[cfg(test)]
mod tests {
    use prost::Message as _;

    use super::*;
    use crate::{analysis::distributions::Buckets, export::prometheus::catalog as m};

    fn decoded(f: &Families, t: Times) -> ExportMetricsServiceRequest {
        ExportMetricsServiceRequest::decode(request(f, "node-a", t).as_slice()).unwrap()
    }

    /// Hostile and edge values survive as they are: empty, quoted, multi-byte
    /// and long label values, a value of 0, a count past i64, no start time.
    #[test]
    fn what_is_written_by_hand_decodes_to_the_request_built_of_messages() {
        let mut f = Families::default();
        let mut shared = Labels::shared(vec![("pid", "7".into()), ("comm", "py\"thon\n\u{e9}".into()), ("pod", String::new())]);
        f.add(m::PROCESS_MEMORY).push((shared.clone(), Value::Int(0)));
        shared.push(("owner", "x".repeat(300)));
        f.add(m::PROCESS_MEMORY).push((shared.clone(), Value::Int(-5)));
        f.add(m::EVENTS_PROCESSED).push((vec![], Value::Count(u64::MAX)));
        f.add(m::AGENT_CPU).push((vec![("a", String::new())], Value::FloatCount(0.0)));
        f.add(m::AGENT_CPU).push((shared, Value::Float(f64::NAN)));
        f.add(m::ALLOCATION_SIZE).push((vec![("memory", "device".into())], Value::Histogram(Buckets::new(vec![1.0]))));
        f.add(m::PROCESS_HOST_SWAP);
        for t in [Times { start_ns: 1, now_ns: 2 }, Times { start_ns: 0, now_ns: 0 }] {
            let (got, want) = (decoded(&f, t), reference(&f, "node-a", t));
            // NaN is never equal to itself: compare the encodings of both.
            assert_eq!(got.encode_to_vec(), want.encode_to_vec(), "{got:#?}\n{want:#?}");
        }
    }

    #[test]
    fn counters_are_cumulative_sums_and_histograms_keep_their_buckets() {
        let mut f = Families::default();
        f.add(m::EVENTS_PROCESSED).push((vec![], Value::Count(42)));
        f.add(m::PROCESS_MEMORY).push((vec![("pid", "7".into())], Value::Int(1 << 20)));
        let mut b = Buckets::new(vec![1.0, 2.0]);
        b.counts = vec![1, 0, 2];
        b.count = 3;
        b.sum = 9.5;
        f.add(m::ALLOCATION_SIZE).push((vec![], Value::Histogram(b)));
        let t = Times { start_ns: 1, now_ns: 2 };
        let req = decoded(&f, t);
        let metrics = &req.resource_metrics[0].scope_metrics[0].metrics;
        let names: Vec<&str> = metrics.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, [format!("{}_total", m::EVENTS_PROCESSED.name).as_str(), m::PROCESS_MEMORY.name, m::ALLOCATION_SIZE.name]);
        let Some(Data::Sum(s)) = &metrics[0].data else { panic!("{:?}", metrics[0]) };
        assert!(s.is_monotonic && s.aggregation_temporality == AggregationTemporality::Cumulative as i32);
        assert_eq!((s.data_points[0].value, s.data_points[0].start_time_unix_nano), (Some(number_data_point::Value::AsInt(42)), 1));
        let Some(Data::Gauge(g)) = &metrics[1].data else { panic!() };
        assert_eq!(g.data_points[0].attributes, [kv("pid", "7")]);
        let Some(Data::Histogram(h)) = &metrics[2].data else { panic!() };
        assert_eq!(
            (h.data_points[0].bucket_counts.as_slice(), h.data_points[0].explicit_bounds.as_slice()),
            ([1, 0, 2].as_slice(), [1.0, 2.0].as_slice())
        );
    }
}

//! The metrics of /metrics as an OTLP/HTTP protobuf request
//! (`ExportMetricsServiceRequest`, opentelemetry-proto's types): the same
//! families and series, gauges as gauges, counters as cumulative monotonic
//! sums (named with `_total`, as Prometheus exposes them, so that a store
//! fed by OTLP holds the series a scrape would), histograms as cumulative
//! explicit-bucket histograms.
use opentelemetry_proto::tonic::{
    collector::metrics::v1::ExportMetricsServiceRequest,
    common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue},
    metrics::v1::{
        metric::Data, number_data_point, AggregationTemporality, Gauge, Histogram, HistogramDataPoint, Metric, NumberDataPoint,
        ResourceMetrics, ScopeMetrics, Sum,
    },
    resource::v1::Resource,
};
use prometheus_client::metrics::MetricType;
use prost::Message as _;

use super::prometheus::families::{Families, Labels, Value};

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

fn number(labels: &Labels, v: &Value, t: Times, start: bool) -> Option<NumberDataPoint> {
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
}

fn metric(name: &str, help: &str, kind: MetricType, series: &[(Labels, Value)], t: Times) -> Metric {
    let cumulative = AggregationTemporality::Cumulative as i32;
    let (name, data) = match kind {
        MetricType::Counter => {
            let data_points = series.iter().filter_map(|(l, v)| number(l, v, t, true)).collect();
            (format!("{name}_total"), Data::Sum(Sum { data_points, aggregation_temporality: cumulative, is_monotonic: true }))
        }
        MetricType::Histogram => {
            let data_points = series
                .iter()
                .filter_map(|(l, v)| match v {
                    Value::Histogram(b) => Some(HistogramDataPoint {
                        attributes: attributes(l),
                        start_time_unix_nano: t.start_ns,
                        time_unix_nano: t.now_ns,
                        count: b.count,
                        sum: Some(b.sum),
                        // One count per bucket, +Inf last: OTLP's layout too.
                        bucket_counts: b.counts.clone(),
                        explicit_bounds: b.bounds.clone(),
                        ..Default::default()
                    }),
                    _ => None,
                })
                .collect();
            (name.to_string(), Data::Histogram(Histogram { data_points, aggregation_temporality: cumulative }))
        }
        _ => {
            let data_points = series.iter().filter_map(|(l, v)| number(l, v, t, false)).collect();
            (name.to_string(), Data::Gauge(Gauge { data_points }))
        }
    };
    Metric { name, description: help.to_string(), data: Some(data), ..Default::default() }
}

/// The request body: every family with at least one series, under one
/// resource (`service.name` gpumem, `host.name` this node).
pub fn request(fams: &Families, host: &str, t: Times) -> Vec<u8> {
    let metrics = fams.iter().filter(|(_, s)| !s.is_empty()).map(|(m, s)| metric(m.name, m.help, m.kind, s, t)).collect();
    let scope = InstrumentationScope { name: "gpumem".into(), version: env!("CARGO_PKG_VERSION").into(), ..Default::default() };
    let resource = Resource { attributes: vec![kv("service.name", "gpumem"), kv("host.name", host)], ..Default::default() };
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: Some(resource),
            scope_metrics: vec![ScopeMetrics { scope: Some(scope), metrics, ..Default::default() }],
            ..Default::default()
        }],
    }
    .encode_to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{analysis::distributions::Buckets, export::prometheus::catalog as m};

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
        let req = ExportMetricsServiceRequest::decode(request(&f, "node-a", t).as_slice()).unwrap();
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

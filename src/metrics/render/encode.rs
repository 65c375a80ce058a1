//! The Prometheus text format (0.0.4, through `prometheus-client`) of the
//! families, histograms after the others. It must not decide which series
//! exist or with which values.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use super::Family;
use crate::telemetry::fields::Kind;

/// Encodes families in the Prometheus text format 0.0.4.
pub fn encode(families: Vec<Family>) -> String {
    encode_with_histograms(families, Vec::new())
}

/// One histogram family: cumulative buckets (upper bound, count), the sum
/// and the count of its observations.
#[derive(Clone, Debug, PartialEq)]
pub struct HistogramFamily {
    pub name: String,
    pub help: String,
    pub buckets: Vec<(f64, u64)>,
    pub sum: f64,
    pub count: u64,
}

/// [`encode`], with histogram families after the others.
pub fn encode_with_histograms(families: Vec<Family>, histograms: Vec<HistogramFamily>) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Families(families, histograms)));
    let mut text = String::new();
    // Writing into a String cannot fail; an error would only come from a
    // malformed descriptor, and a partial exposition is still served.
    if let Err(e) = prometheus_client::encoding::prometheus_text::encode(&mut text, &registry) {
        tracing::warn!(error = %e, "cannot encode metrics");
    }
    text
}

/// Content type of [`encode`]'s output.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

#[derive(Debug)]
struct Families(Vec<Family>, Vec<HistogramFamily>);

impl Collector for Families {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for family in &self.0 {
            // A counter's name is given without `_total`; the encoder adds it.
            let (name, metric_type) = match family.kind {
                Kind::Gauge => (family.name.as_str(), MetricType::Gauge),
                Kind::Counter => (
                    family.name.strip_suffix("_total").unwrap_or(&family.name),
                    MetricType::Counter,
                ),
            };
            let mut metric = encoder.encode_descriptor(name, &family.help, None, metric_type)?;
            for series in &family.series {
                let mut encoder = metric.encode_family(&series.labels)?;
                match family.kind {
                    Kind::Counter => {
                        encoder.encode_counter::<NoLabelSet, _, u64>(&series.value, None)?
                    }
                    Kind::Gauge => encoder.encode_gauge(&series.value)?,
                }
            }
        }
        for histogram in &self.1 {
            let mut metric = encoder.encode_descriptor(
                &histogram.name,
                &histogram.help,
                None,
                MetricType::Histogram,
            )?;
            metric.encode_histogram::<NoLabelSet>(
                histogram.sum,
                histogram.count,
                &histogram.buckets,
                None,
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::render::Series;

    #[test]
    fn encoding_declares_gauges_and_counters_by_their_full_name() {
        let families = vec![
            Family {
                name: "gpu_operator_restarts_total".into(),
                help: "Restarts".into(),
                kind: Kind::Counter,
                series: vec![Series {
                    labels: vec![("gpu_id".into(), "0".into())],
                    value: 2.0,
                }],
            },
            Family {
                name: "gpu_nodes_total".into(),
                help: "GPUs".into(),
                kind: Kind::Gauge,
                series: vec![Series {
                    labels: vec![("hostname".into(), "a\"b".into())],
                    value: 8.0,
                }],
            },
            Family {
                name: "gpu_edge_temperature".into(),
                help: "Edge".into(),
                kind: Kind::Gauge,
                series: vec![Series {
                    labels: vec![],
                    value: 41.5,
                }],
            },
        ];
        let text = encode(families);
        assert!(
            text.contains("# TYPE gpu_operator_restarts_total counter\n"),
            "{text}"
        );
        assert!(
            text.contains("gpu_operator_restarts_total{gpu_id=\"0\"} 2"),
            "{text}"
        );
        assert!(text.contains("# TYPE gpu_nodes_total gauge\n"), "{text}");
        assert!(
            text.contains("gpu_nodes_total{hostname=\"a\\\"b\"} 8"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE gpu_edge_temperature gauge\ngpu_edge_temperature 41.5\n"),
            "{text}"
        );
        assert!(!text.contains("# EOF"));
    }
}

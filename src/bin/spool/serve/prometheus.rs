//! `GET /metrics`: the figures of `Spool::metrics` in Prometheus's text format (encoded by
//! `prometheus-client`), the same the page shows:
//! - counters `spool_published_total{topic}` (the log's end: every record ever appended),
//!   and per group `spool_{delivered,redelivered,acked,nacked,expired}_total` (since the
//!   instance opened) and `spool_dead_lettered_total` (durable);
//! - gauges `spool_lag` and `spool_in_flight` per group;
//! - the histogram `spool_fsync_seconds` of segment, index and directory syncs.

use std::sync::Arc;

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

use super::App;
use super::api::ApiError;

type Labels = Vec<(&'static str, String)>;
/// A per-group figure: its name, help text, and how to read it from `GroupInfo`.
type Figure<T> = (&'static str, &'static str, fn(&spool::GroupInfo) -> T);

/// The text exposition of one `Spool::metrics` reading.
pub async fn metrics(State(app): State<Arc<App>>) -> Result<impl IntoResponse, ApiError> {
    let m = app.backend.metrics().await?;
    let text = encode(&m);
    Ok((
        [(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        text,
    ))
}

/// Encodes `m`; a fresh registry per reading, so gone topics and groups disappear.
pub fn encode(m: &spool::Metrics) -> String {
    let mut r = Registry::default();
    let published = Family::<Labels, Counter>::default();
    for t in &m.topics {
        published
            .get_or_create(&vec![("topic", t.topic.clone())])
            .inc_by(t.info.next);
    }
    r.register(
        "spool_published",
        "Records appended to the topic, ever",
        published,
    );
    register_groups(&mut r, m);
    let s = &m.syncs;
    let mut buckets = Vec::with_capacity(s.buckets.len() + 1);
    let mut below = 0;
    for &(le_us, cumulative) in &s.buckets {
        // Saturating: the figures may come from another process (the owner).
        buckets.push((le_us as f64 / 1e6, cumulative.saturating_sub(below)));
        below = below.max(cumulative);
    }
    buckets.push((f64::INFINITY, s.count.saturating_sub(below)));
    let fsync = SyncHistogram {
        sum: s.sum.as_secs_f64(),
        count: s.count,
        buckets,
    };
    r.register_with_unit(
        "spool_fsync",
        "Time each sync of a segment, index or directory file took (process-wide)",
        Unit::Seconds,
        fsync,
    );
    let mut text = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::prometheus_text::encode(&mut text, &r);
    text
}

fn register_groups(r: &mut Registry, m: &spool::Metrics) {
    let counters: [Figure<u64>; 6] = [
        ("spool_delivered", "Deliveries handed out since open", |i| {
            i.counts.delivered
        }),
        (
            "spool_redelivered",
            "Redeliveries handed out since open",
            |i| i.counts.redelivered,
        ),
        ("spool_acked", "Deliveries acked since open", |i| {
            i.counts.acked
        }),
        ("spool_nacked", "Nacks since open", |i| i.counts.nacked),
        (
            "spool_expired",
            "Deliveries whose ack deadline passed, since open",
            |i| i.counts.expired,
        ),
        (
            "spool_dead_lettered",
            "Messages moved to the dead-letter topic",
            |i| i.dead_lettered,
        ),
    ];
    for (name, help, value) in counters {
        let f = Family::<Labels, Counter>::default();
        for g in &m.groups {
            f.get_or_create(&labels(g)).inc_by(value(&g.info));
        }
        r.register(name, help, f);
    }
    let gauges: [Figure<i64>; 2] = [
        (
            "spool_lag",
            "Records from the group's cursor to the log end",
            |i| i64::try_from(i.lag).unwrap_or(i64::MAX),
        ),
        (
            "spool_in_flight",
            "Deliveries out, not yet acked or nacked",
            |i| i64::try_from(i.in_flight).unwrap_or(i64::MAX),
        ),
    ];
    for (name, help, value) in gauges {
        let f = Family::<Labels, Gauge>::default();
        for g in &m.groups {
            f.get_or_create(&labels(g)).set(value(&g.info));
        }
        r.register(name, help, f);
    }
}

fn labels(g: &spool::GroupMetrics) -> Labels {
    vec![("topic", g.topic.clone()), ("group", g.group.clone())]
}

/// A histogram read elsewhere (`spool::SyncLatency`): per-bucket counts, `+Inf` last.
#[derive(Debug)]
struct SyncHistogram {
    sum: f64,
    count: u64,
    buckets: Vec<(f64, u64)>,
}

impl EncodeMetric for SyncHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_histogram::<NoLabelSet>(self.sum, self.count, &self.buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

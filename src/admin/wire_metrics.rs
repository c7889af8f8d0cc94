//! `Metrics` on the wire: every topic's and group's figures and the owner's sync
//! latencies, in one answer (a dashboard asks once a second).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::protocol::{WireGroupInfo, WireTopicInfo};
use crate::error::Result;
use crate::io::sync_stats::SyncLatency;
use crate::queue::{GroupMetrics, Metrics, TopicMetrics};

/// [`Metrics`] as the owner sends it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireMetrics {
    pub topics: Vec<(String, WireTopicInfo)>,
    pub groups: Vec<(String, String, WireGroupInfo)>,
    /// Cumulative `(upper bound µs, count)` pairs.
    pub sync_buckets: Vec<(u64, u64)>,
    pub sync_count: u64,
    pub sync_sum_ns: u64,
}

impl From<&Metrics> for WireMetrics {
    fn from(m: &Metrics) -> WireMetrics {
        WireMetrics {
            topics: m
                .topics
                .iter()
                .map(|t| (t.topic.clone(), (&t.info).into()))
                .collect(),
            groups: m
                .groups
                .iter()
                .map(|g| (g.topic.clone(), g.group.clone(), (&g.info).into()))
                .collect(),
            sync_buckets: m.syncs.buckets.clone(),
            sync_count: m.syncs.count,
            sync_sum_ns: u64::try_from(m.syncs.sum.as_nanos()).unwrap_or(u64::MAX),
        }
    }
}

impl WireMetrics {
    /// The owner's metrics, rebuilt.
    pub fn into_metrics(self) -> Result<Metrics> {
        let mut m = Metrics::default();
        for (topic, info) in self.topics {
            let info = info.into_info()?;
            m.topics.push(TopicMetrics { topic, info });
        }
        for (topic, group, info) in self.groups {
            let info = info.into_info();
            m.groups.push(GroupMetrics { topic, group, info });
        }
        m.syncs = SyncLatency {
            buckets: self.sync_buckets,
            count: self.sync_count,
            sum: Duration::from_nanos(self.sync_sum_ns),
        };
        Ok(m)
    }
}

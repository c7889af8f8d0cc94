//! Per-topic overrides of the instance's retention settings (`set_topic_config`), and the
//! retention each topic ends up with.
//! **Invariant:** an override is durable (in the catalog) before it applies; a topic
//! without one follows the instance's `Options`.

use std::sync::Arc;

use super::engine::lock;
use super::{Engine, Topic};
use crate::catalog::{Op, TopicConfigRecord};
use crate::error::{Error, Result};
use crate::names;
use crate::options::{MAX_MS, RetentionPolicy};

/// A topic's overrides of the instance's settings. `None` leaves the instance's value
/// (the connection string's, or its default) in force.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TopicConfig {
    /// Overrides `Retention Bytes` for this topic.
    pub retention_bytes: Option<u64>,
    /// Overrides `Retention Ms` for this topic.
    pub retention_ms: Option<u64>,
    /// Overrides `Retention Policy` for this topic.
    pub retention_policy: Option<RetentionPolicy>,
}

impl TopicConfig {
    pub(super) fn from_record(r: &TopicConfigRecord) -> TopicConfig {
        TopicConfig {
            retention_bytes: r.retention_bytes,
            retention_ms: r.retention_ms,
            retention_policy: r.retention_policy.map(|p| match p {
                1 => RetentionPolicy::Acked,
                _ => RetentionPolicy::Limits,
            }),
        }
    }

    fn to_record(&self) -> TopicConfigRecord {
        TopicConfigRecord {
            retention_bytes: self.retention_bytes,
            retention_ms: self.retention_ms,
            retention_policy: self.retention_policy.map(|p| match p {
                RetentionPolicy::Limits => 0,
                RetentionPolicy::Acked => 1,
            }),
        }
    }

    /// The same ranges the connection string accepts.
    fn check(&self) -> Result<()> {
        let bad = |field: &str| Error::InvalidConnectionString {
            key: field.to_owned(),
            reason: "out of range".to_owned(),
        };
        if self.retention_bytes.is_some_and(|b| b > u64::MAX / 2) {
            return Err(bad("retention_bytes"));
        }
        if self.retention_ms.is_some_and(|ms| ms > MAX_MS) {
            return Err(bad("retention_ms"));
        }
        Ok(())
    }
}

/// The retention a topic ends up with: its overrides, else the instance's settings.
#[derive(Clone, Copy, Debug)]
pub(super) struct Retention {
    pub bytes: u64,
    pub ms: u64,
    pub policy: RetentionPolicy,
}

impl Retention {
    /// No limit and no work-queue policy: retention deletes nothing.
    pub fn keeps_everything(&self) -> bool {
        self.bytes == 0 && self.ms == 0 && self.policy == RetentionPolicy::Limits
    }
}

impl Engine {
    /// Sets `topic`'s overrides (creating the topic if new), durably; they replace the
    /// ones set before. Retention applies them from its next pass.
    pub fn set_topic_config(&self, topic: &str, config: TopicConfig, now_ms: u64) -> Result<()> {
        names::check(topic)?;
        config.check()?;
        let t = self.topic_or_create(topic, now_ms)?;
        let mut current = lock(&t.config);
        self.catalog
            .commit(&[Op::PutTopicConfig(topic.to_owned(), config.to_record())])?;
        *current = config;
        tracing::info!(topic, config = ?*current, "topic config set");
        Ok(())
    }

    /// The retention `t` ends up with.
    pub(super) fn retention_of(&self, t: &Topic) -> Retention {
        let c = lock(&t.config);
        Retention {
            bytes: c.retention_bytes.unwrap_or(self.opts.retention_bytes),
            ms: c.retention_ms.unwrap_or(self.opts.retention_ms),
            policy: c.retention_policy.unwrap_or(self.opts.retention_policy),
        }
    }

    /// Under `Acked`: the offset below which every group of `t` has finished (the lowest
    /// cursor); `None` for a topic with no group, which keeps its records. Read before the
    /// writer's lock is taken (a group's lock comes first).
    pub(super) fn finished_by_all(&self, t: &Arc<Topic>) -> Option<u64> {
        t.groups_snapshot()
            .iter()
            .map(|(_, g)| g.lock().cursor)
            .min()
    }
}

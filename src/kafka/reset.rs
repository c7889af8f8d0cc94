//! `reset_offset` and `groups` under `Mode=Kafka`.
//!
//! A reset commits the group's new offsets:
//! - `Earliest`, `Latest` and `Time` move every partition (`Time` through the broker's
//!   time index); `Explicit` moves partition 0, clamped to its watermarks.
//! - When this `Spool` has the group's member, the member's floors move and their
//!   deliveries are fenced (a late ack fails with `StaleDelivery`), and it seeks there.
//! - Otherwise the offsets are committed from outside the group. A group with members
//!   elsewhere refuses it, and so does spool: `GroupInUse`.

use std::sync::Arc;
use std::time::UNIX_EPOCH;

use rdkafka::consumer::{CommitMode, Consumer as _};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

use super::floor::Floor;
use super::group::{self, Group};
use super::{Kafka, blocking, clients, kafka_err, to_i64, to_u64};
use crate::error::{Error, Result};
use crate::queue::OffsetReset;

impl Kafka {
    /// Moves the group's cursor; returns the new cursor (summed over the partitions).
    pub(crate) async fn reset_offset(
        &self,
        topic: &str,
        group: &str,
        to: OffsetReset,
    ) -> Result<u64> {
        crate::names::check(topic)?;
        crate::names::check(group)?;
        self.check_open()?;
        let targets = {
            let (k, topic) = (self.clone(), topic.to_owned());
            blocking(move || k.targets(&topic, to)).await?
        };
        let cursor = targets.iter().map(|(_, o)| o).sum();
        if let Some(g) = self.live_group(topic, group) {
            let version = move_member(&g, &targets)?;
            g.shared.durable(version, None).await?;
            return Ok(cursor);
        }
        let (k, topic, group) = (self.clone(), topic.to_owned(), group.to_owned());
        blocking(move || k.commit_from_outside(&topic, &group, &targets)).await?;
        Ok(cursor)
    }

    /// The new offset of each partition `to` moves.
    fn targets(&self, topic: &str, to: OffsetReset) -> Result<Vec<(i32, u64)>> {
        let n = self.partitions(topic)?;
        let mut out = Vec::new();
        for p in 0..n {
            let (lo, hi) = self.watermarks(topic, p)?;
            let target = match to {
                OffsetReset::Earliest => lo,
                OffsetReset::Latest => hi,
                OffsetReset::Explicit(o) if p == 0 => o.clamp(lo, hi),
                OffsetReset::Explicit(_) => continue,
                OffsetReset::Time(t) => self.offset_at(topic, p, t)?.clamp(lo, hi),
            };
            out.push((p, target));
        }
        Ok(out)
    }

    /// The first offset of partition `p` with a timestamp at or after `t` (the end if
    /// none), from the broker's time index.
    fn offset_at(&self, topic: &str, p: i32, t: std::time::SystemTime) -> Result<u64> {
        let ms = t
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, p, Offset::Offset(ms))
            .map_err(|e| kafka_err("asking for an offset by time", e))?;
        let found = self
            .reader()
            .offsets_for_times(tpl, self.timeout())
            .map_err(|e| kafka_err("asking for an offset by time", e))?;
        let offset = found
            .elements()
            .first()
            .map(|e| e.offset())
            .unwrap_or(Offset::End);
        match offset {
            Offset::Offset(o) => Ok(to_u64(o)),
            _ => Ok(self.watermarks(topic, p)?.1),
        }
    }

    /// Commits `targets` for `group` without joining it. Blocking.
    fn commit_from_outside(&self, topic: &str, group: &str, targets: &[(i32, u64)]) -> Result<()> {
        let in_use = || Error::GroupInUse {
            topic: topic.to_owned(),
            group: group.to_owned(),
        };
        if self.group_members(group)? > 0 {
            return Err(in_use());
        }
        let c = clients::member(self.options(), group, group::context_for_check())?;
        let mut tpl = TopicPartitionList::with_capacity(targets.len());
        for (p, o) in targets {
            tpl.add_partition_offset(topic, *p, Offset::Offset(to_i64(*o)))
                .map_err(|e| kafka_err("preparing a reset", e))?;
        }
        let r = c.commit(&tpl, CommitMode::Sync);
        drop(tpl);
        drop(c);
        r.map_err(|e| match e.rdkafka_error_code() {
            // The group has (or just had) members: their generation owns the offsets.
            Some(
                RDKafkaErrorCode::UnknownMemberId
                | RDKafkaErrorCode::IllegalGeneration
                | RDKafkaErrorCode::RebalanceInProgress,
            ) => in_use(),
            _ => kafka_err("committing a reset", e),
        })
    }

    /// The members the broker lists for `group` (0 if it does not know it, or cannot
    /// say: then the commit's own refusal tells).
    fn group_members(&self, group: &str) -> Result<usize> {
        let list = match self.reader().fetch_group_list(Some(group), self.timeout()) {
            Ok(list) => list,
            // librdkafka's mock cluster has no DescribeGroups.
            Err(e) if e.rdkafka_error_code() == Some(RDKafkaErrorCode::UnsupportedFeature) => {
                return Ok(0);
            }
            Err(e) => return Err(kafka_err("describing the group", e)),
        };
        Ok(list
            .groups()
            .iter()
            .filter(|g| g.name() == group)
            .map(|g| g.members().len())
            .sum())
    }
}

/// Moves this process's member to `targets`: new floors, new epochs (so every delivery
/// out is stale), nothing held or buffered, a seek to each. Returns the version to wait
/// for. `GroupInUse` if a partition is not this member's (members run elsewhere).
fn move_member(g: &Arc<Group>, targets: &[(i32, u64)]) -> Result<u64> {
    let mut st = g.shared.lock();
    if targets.iter().any(|(p, _)| !st.parts.contains_key(p)) {
        return Err(Error::GroupInUse {
            topic: g.topic.clone(),
            group: g.name.clone(),
        });
    }
    for (p, o) in targets {
        let part = st.parts.get_mut(p).expect("checked above");
        let out = part.out.len();
        part.floor = Floor::from_commit(*o, "");
        part.epoch = group::new_epoch();
        part.out.clear();
        part.held.clear();
        st.in_flight = st.in_flight.saturating_sub(out);
        group::seek(&mut st, *p, *o, None);
    }
    let v = g.shared.changed(&mut st);
    drop(st);
    g.shared.room.notify_waiters();
    Ok(v)
}

impl Kafka {
    /// The groups with a committed offset on `topic`, or a member of it in this process,
    /// sorted.
    pub(crate) fn groups(&self, topic: &str) -> Result<Vec<String>> {
        crate::names::check(topic)?;
        self.check_open()?;
        let n = self.partitions(topic)?;
        if n == 0 {
            return Ok(Vec::new());
        }
        let list = self
            .reader()
            .fetch_group_list(None, self.timeout())
            .map_err(|e| kafka_err("listing the groups (ListGroups)", e))?;
        let mut out: Vec<String> = self.live_groups_of(topic);
        for g in list.groups() {
            if !out.iter().any(|o| o == g.name()) && self.has_commit(topic, g.name(), n)? {
                out.push(g.name().to_owned());
            }
        }
        out.sort();
        Ok(out)
    }

    /// Whether `group` committed an offset for a partition of `topic`.
    fn has_commit(&self, topic: &str, group: &str, partitions: i32) -> Result<bool> {
        let c = clients::member(self.options(), group, group::context_for_check())?;
        let mut tpl = TopicPartitionList::with_capacity(partitions as usize);
        for p in 0..partitions {
            tpl.add_partition(topic, p);
        }
        let committed = c
            .committed_offsets(tpl, self.timeout())
            .map_err(|e| kafka_err("reading a group's committed offsets", e))?;
        let any = committed
            .elements()
            .iter()
            .any(|e| matches!(e.offset(), Offset::Offset(_)));
        drop(committed);
        drop(c);
        Ok(any)
    }
}

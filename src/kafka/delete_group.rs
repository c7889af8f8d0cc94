//! `delete_group` under `Mode=Kafka`: forgets a group's cursor and attempts on one topic.
//!
//! Kafka's own ways do not fit, so a tombstone is committed instead:
//! - DeleteGroups deletes the group on every topic (a Kafka group name is global);
//! - OffsetDelete, per topic, is not in the rdkafka crate's admin client.
//!
//! The tombstone, for each partition the group committed on: the partition's earliest
//! retained offset, with the metadata [`DELETED`]. So:
//! - a consumer built later starts at the earliest, as a new group's does;
//! - the metadata holds no acks and no attempts: all are forgotten;
//! - `groups` leaves the group out, and `group_info` reads it as a new group.
//!
//! Kafka's own tools still list the group, with the tombstone's offsets.
//! The commit is made from outside the group: with members elsewhere, `GroupInUse`.

use rdkafka::Offset;

use super::floor::DELETED;
use super::group::{self};
use super::{Kafka, blocking, clients};
use crate::error::{Error, Result};

impl Kafka {
    /// Forgets `group` on `topic` (API.md, "Lifecycle"). `GroupInUse` while this process
    /// has a member of it, or members run elsewhere. A group never committed is `Ok`.
    pub(crate) async fn delete_group(&self, topic: &str, group: &str) -> Result<()> {
        crate::names::check(topic)?;
        crate::names::check(group)?;
        self.check_open()?;
        if self.live_group(topic, group).is_some() {
            return Err(Error::GroupInUse {
                topic: topic.to_owned(),
                group: group.to_owned(),
            });
        }
        let (k, topic, group) = (self.clone(), topic.to_owned(), group.to_owned());
        blocking(move || k.write_tombstones(&topic, &group)).await
    }

    /// Commits the tombstone on each partition of `topic` that `group` committed on.
    fn write_tombstones(&self, topic: &str, group: &str) -> Result<()> {
        let floors = self.tombstones(topic, group)?;
        if floors.is_empty() {
            return Ok(());
        }
        self.commit_from_outside(topic, group, &floors)
    }

    /// The commits that make `group` forget `topic`: (partition, earliest, `DELETED`) for
    /// each partition with a commit that is not a tombstone already.
    fn tombstones(&self, topic: &str, group: &str) -> Result<Vec<(i32, u64, String)>> {
        let n = self.partitions(topic)?;
        let parts: Vec<i32> = (0..n).collect();
        let c = clients::member(self.options(), group, group::context_for_check())?;
        let committed = group::committed(&c, topic, &parts, self.timeout());
        drop(c);
        let mut out = Vec::new();
        for (p, offset, metadata) in committed? {
            if is_state(offset, &metadata) {
                let (lo, _) = self.watermarks(topic, p)?;
                out.push((p, lo, DELETED.to_owned()));
            }
        }
        Ok(out)
    }
}

/// Whether a commit of `offset` with `metadata` is a group's durable state (not none,
/// not a tombstone): what `groups` lists.
pub(super) fn is_state(offset: Offset, metadata: &str) -> bool {
    matches!(offset, Offset::Offset(_)) && metadata != DELETED
}

#[cfg(test)]
mod tests {
    use rdkafka::Offset;

    use super::is_state;
    use crate::kafka::floor::{DELETED, Floor};

    #[test]
    fn a_tombstone_is_no_state_and_reads_as_an_empty_floor() {
        assert!(is_state(Offset::Offset(3), "spool1|a:1"));
        assert!(is_state(Offset::Offset(3), ""));
        assert!(!is_state(Offset::Offset(3), DELETED));
        assert!(!is_state(Offset::Invalid, ""));
        assert_eq!(
            Floor::from_commit(7, DELETED),
            Floor::from_commit(7, ""),
            "no acks, no attempts"
        );
    }
}

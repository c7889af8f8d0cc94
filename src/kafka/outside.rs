//! A group's commit read and written from outside the group, with no member joining:
//! what `reset_offset` and the low-level `ack`/`nack` do when this `Spool` has no member
//! of the group.
//!
//! Kafka takes such a commit only from a group with no members. A group with members
//! elsewhere refuses it, and so does spool: `GroupInUse`. The check runs twice:
//! - first through the broker's member list (DescribeGroups; the mock cluster has none);
//! - then through the commit's own refusal (the members' generation owns the offsets).

use rdkafka::consumer::Consumer as _;
use rdkafka::types::RDKafkaErrorCode;

use super::floor::Floor;
use super::group::{self};
use super::{Kafka, clients, kafka_err};
use crate::error::{Error, Result};

impl Kafka {
    /// The committed floor of `group` on partition `p` of `topic`. A partition never
    /// committed, or committed below what retention kept, starts at its earliest
    /// retained offset, as in embedded mode. Blocking.
    pub(super) fn floor_from_outside(&self, topic: &str, group: &str, p: i32) -> Result<Floor> {
        let c = clients::member(self.options(), group, group::context_for_check())?;
        let read = group::read_floors(&c, topic, &[p], self.timeout());
        drop(c);
        let floor = read?.into_iter().next().map(|(_, f)| f);
        let (lo, _) = self.watermarks(topic, p)?;
        Ok(match floor {
            Some(f) if f.cursor() >= lo => f,
            _ => Floor::from_commit(lo, ""),
        })
    }

    /// Commits `floors` (partition, cursor, metadata) for `group` without joining it.
    /// Blocking.
    pub(super) fn commit_from_outside(
        &self,
        topic: &str,
        group: &str,
        floors: &[(i32, u64, String)],
    ) -> Result<()> {
        let in_use = || Error::GroupInUse {
            topic: topic.to_owned(),
            group: group.to_owned(),
        };
        if self.group_members(group)? > 0 {
            return Err(in_use());
        }
        let c = clients::member(self.options(), group, group::context_for_check())?;
        let tpl = group::commit_list(topic, floors)?;
        let r = super::commit::commit_within(&c, &tpl, self.timeout());
        drop(tpl);
        drop(c);
        r.map_err(|e| match e.rdkafka_error_code() {
            // The group has (or just had) members: their generation owns the offsets.
            Some(
                RDKafkaErrorCode::UnknownMemberId
                | RDKafkaErrorCode::IllegalGeneration
                | RDKafkaErrorCode::RebalanceInProgress,
            ) => in_use(),
            _ => kafka_err("committing from outside the group", e),
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

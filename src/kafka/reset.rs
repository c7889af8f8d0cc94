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
use std::time::{SystemTime, UNIX_EPOCH};

use rdkafka::consumer::Consumer as _;
use rdkafka::{Offset, TopicPartitionList};

use super::floor::Floor;
use super::group::{self, Group};
use super::{Kafka, blocking, clients, kafka_err, to_u64};
use crate::error::{Error, Result};
use crate::queue::OffsetReset;
use crate::queue::key_order::KeyOrder;

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
        let floors: Vec<(i32, u64, String)> = targets
            .iter()
            .map(|(p, o)| (*p, *o, String::new()))
            .collect();
        blocking(move || k.commit_from_outside(&topic, &group, &floors)).await?;
        Ok(cursor)
    }

    /// The new offset of each partition `to` moves: `plan` over the broker's answers.
    fn targets(&self, topic: &str, to: OffsetReset) -> Result<Vec<(i32, u64)>> {
        plan(
            self.partitions(topic)?,
            to,
            |p| self.watermarks(topic, p),
            |p, t| self.offset_at(topic, p, t),
        )
    }

    /// The first offset of partition `p` with a timestamp at or after `t` (`None`: no
    /// record that late), from the broker's time index.
    fn offset_at(&self, topic: &str, p: i32, t: SystemTime) -> Result<Option<u64>> {
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
        let Some(answer) = found.elements().into_iter().next() else {
            return Ok(None);
        };
        // An error for the partition is the reset's failure, not "no record that late".
        answer
            .error()
            .map_err(|e| kafka_err("asking for an offset by time", e))?;
        match answer.offset() {
            Offset::Offset(o) => Ok(Some(to_u64(o))),
            _ => Ok(None),
        }
    }
}

/// The new offset of each of `partitions` partitions that `to` moves, from each one's
/// `watermarks` (low, high) and, for `Time`, `at_time`: the first offset at or after the
/// time, `None` when no record is that late (then the high watermark, as in embedded
/// mode). The seam for tests: librdkafka's mock cluster has no time index (it answers
/// the end for every time), so a unit test gives the answers here.
fn plan(
    partitions: i32,
    to: OffsetReset,
    mut watermarks: impl FnMut(i32) -> Result<(u64, u64)>,
    mut at_time: impl FnMut(i32, SystemTime) -> Result<Option<u64>>,
) -> Result<Vec<(i32, u64)>> {
    let mut out = Vec::new();
    for p in 0..partitions {
        let (lo, hi) = watermarks(p)?;
        let target = match to {
            OffsetReset::Earliest => lo,
            OffsetReset::Latest => hi,
            OffsetReset::Explicit(o) if p == 0 => o.clamp(lo, hi),
            OffsetReset::Explicit(_) => continue,
            OffsetReset::Time(t) => at_time(p, t)?.unwrap_or(hi).clamp(lo, hi),
        };
        out.push((p, target));
    }
    Ok(out)
}

/// The groups of a topic: those with a member here (`live`), and those the broker lists
/// that `has_commit` on it, each once, sorted. The seam for tests: librdkafka's mock
/// cluster has no ListGroups.
fn groups_of(
    live: Vec<String>,
    listed: impl IntoIterator<Item = String>,
    mut has_commit: impl FnMut(&str) -> Result<bool>,
) -> Result<Vec<String>> {
    let mut out = live;
    for g in listed {
        if !out.contains(&g) && has_commit(&g)? {
            out.push(g);
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
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
        part.keys = KeyOrder::default();
        // Known again once the poll thread made the seek.
        part.read_next = None;
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
        let listed = list.groups().iter().map(|g| g.name().to_owned());
        groups_of(self.live_groups_of(topic), listed, |g| {
            self.has_commit(topic, g, n)
        })
    }

    /// Whether `group` committed an offset for a partition of `topic` (a tombstone of
    /// `delete_group` is none).
    fn has_commit(&self, topic: &str, group: &str, partitions: i32) -> Result<bool> {
        let c = clients::member(self.options(), group, group::context_for_check())?;
        let parts: Vec<i32> = (0..partitions).collect();
        let committed = group::committed(&c, topic, &parts, self.timeout());
        drop(c);
        Ok(committed?
            .iter()
            .any(|(_, offset, metadata)| super::delete_group::is_state(*offset, metadata)))
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use super::{groups_of, plan};
    use crate::error::{Error, Result};
    use crate::queue::OffsetReset;

    /// Three partitions' watermarks: (low, high).
    const WATERMARKS: [(u64, u64); 3] = [(0, 10), (5, 20), (3, 3)];

    fn watermarks(p: i32) -> Result<(u64, u64)> {
        Ok(WATERMARKS[usize::try_from(p).expect("a partition")])
    }

    fn at(ms: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(ms)
    }

    #[test]
    fn a_time_reset_takes_each_partitions_offset_from_the_time_index() {
        let mut asked = Vec::new();
        let answers = [Some(4), Some(17), Some(3)];
        let targets = plan(3, OffsetReset::Time(at(1_000)), watermarks, |p, t| {
            asked.push((p, t));
            Ok(answers[usize::try_from(p).expect("a partition")])
        })
        .expect("plan");
        assert_eq!(targets, vec![(0, 4), (1, 17), (2, 3)]);
        assert_eq!(
            asked,
            vec![(0, at(1_000)), (1, at(1_000)), (2, at(1_000))],
            "every partition asked, for the reset's time"
        );
    }

    #[test]
    fn no_record_that_late_is_the_high_watermark() {
        // librdkafka's answer for "nothing at or after t" is offset -1 (End): `None`.
        let targets = plan(3, OffsetReset::Time(at(9_000)), watermarks, |p, _| {
            Ok((p == 0).then_some(2))
        })
        .expect("plan");
        assert_eq!(targets, vec![(0, 2), (1, 20), (2, 3)]);
    }

    #[test]
    fn an_offset_retention_has_deleted_is_clamped_to_the_low_watermark() {
        let targets =
            plan(2, OffsetReset::Time(at(0)), watermarks, |_, _| Ok(Some(1))).expect("plan");
        assert_eq!(targets, vec![(0, 1), (1, 5)]);
    }

    #[test]
    fn a_failed_lookup_fails_the_reset() {
        let r = plan(3, OffsetReset::Time(at(1)), watermarks, |p, _| {
            if p == 1 {
                return Err(Error::Kafka {
                    context: "asking for an offset by time".to_owned(),
                    detail: "broker down".to_owned(),
                });
            }
            Ok(Some(0))
        });
        match r {
            Err(Error::Kafka { context, detail }) => {
                assert_eq!(
                    (context.as_str(), detail.as_str()),
                    ("asking for an offset by time", "broker down")
                );
            }
            other => panic!("expected the lookup's error, got {other:?}"),
        }
        let r = plan(
            1,
            OffsetReset::Time(at(1)),
            |_| -> Result<(u64, u64)> {
                Err(Error::Kafka {
                    context: "reading a partition's watermarks".to_owned(),
                    detail: "broker down".to_owned(),
                })
            },
            |_, _| Ok(Some(0)),
        );
        assert!(matches!(r, Err(Error::Kafka { .. })), "{r:?}");
    }

    #[test]
    fn the_other_targets_need_no_time_index() {
        let no_lookup = |_: i32, _: SystemTime| -> Result<Option<u64>> {
            panic!("only Time asks the time index")
        };
        assert_eq!(
            plan(3, OffsetReset::Earliest, watermarks, no_lookup).expect("plan"),
            vec![(0, 0), (1, 5), (2, 3)]
        );
        assert_eq!(
            plan(3, OffsetReset::Latest, watermarks, no_lookup).expect("plan"),
            vec![(0, 10), (1, 20), (2, 3)]
        );
        assert_eq!(
            plan(3, OffsetReset::Explicit(12), watermarks, no_lookup).expect("plan"),
            vec![(0, 10)],
            "Explicit moves partition 0, clamped"
        );
    }

    #[test]
    fn the_groups_are_the_live_ones_and_the_listed_ones_with_a_commit_on_the_topic() {
        let live = vec!["here".to_owned()];
        let listed = ["other-topic", "committed", "here", "committed"].map(str::to_owned);
        let mut asked = Vec::new();
        let got = groups_of(live, listed, |g| {
            asked.push(g.to_owned());
            Ok(g == "committed")
        })
        .expect("groups");
        assert_eq!(got, ["committed", "here"]);
        assert!(
            !asked.contains(&"here".to_owned()),
            "a live group needs no lookup"
        );
    }

    #[test]
    fn a_failed_commit_lookup_fails_the_listing() {
        let failed = |_: &str| -> Result<bool> {
            Err(Error::Kafka {
                context: "x".to_owned(),
                detail: "y".to_owned(),
            })
        };
        assert!(groups_of(Vec::new(), ["g".to_owned()], failed).is_err());
    }
}

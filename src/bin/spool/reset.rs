//! `spool reset`: moves a group's cursor, or (without `--execute`) prints where it would
//! go. The dry run computes the new cursor from `topic_info`, `group_info` and `fetch`
//! with the clamps of `reset_offset`; a time target is found by binary search over the
//! record timestamps, which are monotonic within a topic.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;
use spool::OffsetReset;

use crate::args::{Output, ResetArgs};
use crate::backend::Backend;
use crate::failure::Failure;
use crate::output::{print_json, print_table, table};

/// A reset's answer, as `reset --output json` and `spool serve`'s `POST /api/reset` give it.
#[derive(Serialize)]
pub struct ResetRow {
    topic: String,
    group: String,
    old: u64,
    new: u64,
    executed: bool,
}

/// What a reset target asks for, once read from the flags.
enum Target {
    Reset(OffsetReset),
    Shift(i64),
}

fn target(a: &ResetArgs) -> Result<Target, Failure> {
    let back_from_now = |d| {
        SystemTime::now()
            .checked_sub(d)
            .ok_or_else(|| Failure::failed("--by-duration reaches before 1970"))
    };
    Ok(match a {
        a if a.to_earliest => Target::Reset(OffsetReset::Earliest),
        a if a.to_latest => Target::Reset(OffsetReset::Latest),
        ResetArgs {
            to_offset: Some(n), ..
        } => Target::Reset(OffsetReset::Explicit(*n)),
        ResetArgs {
            to_datetime: Some(t),
            ..
        } => Target::Reset(OffsetReset::Time(*t)),
        ResetArgs {
            by_duration: Some(d),
            ..
        } => Target::Reset(OffsetReset::Time(back_from_now(*d)?)),
        ResetArgs {
            shift_by: Some(n), ..
        } => Target::Shift(*n),
        // clap requires exactly one target.
        _ => return Err(Failure::failed("name a target, e.g. --to-earliest")),
    })
}

/// `spool reset --topic T --group G <TARGET> [--execute]`.
pub async fn run(b: &Backend, out: Output, a: ResetArgs) -> Result<(), Failure> {
    let row = reset(b, a).await?;
    if out == Output::Json {
        return print_json(&[row]);
    }
    let mut t = table(&["topic", "group", "old", "new", "executed"]);
    t.add_row(vec![
        row.topic.clone(),
        row.group.clone(),
        row.old.to_string(),
        row.new.to_string(),
        if row.executed {
            "yes"
        } else {
            "no (dry run: add --execute)"
        }
        .to_owned(),
    ]);
    print_table(&t)
}

/// The reset `a` asks for: made with `--execute`, else only computed.
pub async fn reset(b: &Backend, a: ResetArgs) -> Result<ResetRow, Failure> {
    let target = target(&a)?;
    let topic = b.topic_info(&a.topic).await?;
    let group = b.group_info(&a.topic, &a.group).await?;
    let clamp = |n: u64| n.clamp(topic.earliest, topic.next);
    let to = match target {
        Target::Reset(OffsetReset::Explicit(n)) => OffsetReset::Explicit(clamp(n)),
        Target::Reset(r) => r,
        Target::Shift(n) => {
            let moved = if n < 0 {
                group.cursor.saturating_sub(n.unsigned_abs())
            } else {
                group.cursor.saturating_add(n.unsigned_abs())
            };
            OffsetReset::Explicit(clamp(moved))
        }
    };
    let new = if a.execute {
        b.reset_offset(&a.topic, &a.group, to).await?
    } else {
        match to {
            OffsetReset::Earliest => topic.earliest,
            OffsetReset::Latest => topic.next,
            OffsetReset::Explicit(n) => n,
            OffsetReset::Time(t) => {
                first_at_or_after(b, &a.topic, topic.earliest, topic.next, t).await?
            }
        }
    };
    Ok(ResetRow {
        topic: a.topic,
        group: a.group,
        old: group.cursor,
        new,
        executed: a.execute,
    })
}

/// The first offset in `[lo, hi)` whose record's timestamp is at or after `t` (`hi` if
/// none): `OffsetReset::Time`'s answer, found with O(log n) one-record fetches.
async fn first_at_or_after(
    b: &Backend,
    topic: &str,
    mut lo: u64,
    mut hi: u64,
    t: SystemTime,
) -> Result<u64, Failure> {
    let t_ms = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis());
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        let at = b.fetch(topic, mid, 1).await?;
        match at.first() {
            Some(r) if r.offset() >= mid && u128::from(r.timestamp_ms()) < t_ms => {
                lo = r.offset() + 1
            }
            _ => hi = mid,
        }
    }
    Ok(lo)
}

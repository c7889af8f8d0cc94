//! `topics` and `groups`: what the instance holds, read-only.

use serde::Serialize;

use crate::args::Output;
use crate::backend::Backend;
use crate::failure::Failure;
use crate::output::{print_json, print_table, table};

/// A topic as `spool topics --output json` and `spool serve`'s `/api/` show it.
#[derive(Serialize)]
pub struct TopicRow {
    topic: String,
    earliest: u64,
    next: u64,
    messages: u64,
    bytes: u64,
    segments: usize,
}

impl TopicRow {
    pub fn new(topic: String, i: &spool::TopicInfo) -> TopicRow {
        TopicRow {
            topic,
            earliest: i.earliest,
            next: i.next,
            messages: i.messages,
            bytes: i.bytes,
            segments: i.segments,
        }
    }
}

/// `spool topics`.
pub async fn topics(b: &Backend, out: Output) -> Result<(), Failure> {
    let mut rows = Vec::new();
    for topic in b.topics().await? {
        let i = b.topic_info(&topic).await?;
        rows.push(TopicRow::new(topic, &i));
    }
    if out == Output::Json {
        return print_json(&rows);
    }
    let mut t = table(&["topic", "earliest", "next", "messages", "bytes", "segments"]);
    for r in &rows {
        t.add_row(vec![
            r.topic.clone(),
            r.earliest.to_string(),
            r.next.to_string(),
            r.messages.to_string(),
            r.bytes.to_string(),
            r.segments.to_string(),
        ]);
    }
    print_table(&t)
}

#[derive(Serialize)]
pub struct Pending {
    offset: u64,
    attempts: u32,
    last_reason: String,
}

/// A group as `spool groups --output json` and `spool serve`'s `/api/` show it (the
/// page's also carries `counts`, which the command line's JSON leaves out).
#[derive(Serialize)]
pub struct GroupRow {
    topic: String,
    group: String,
    cursor: u64,
    next: u64,
    lag: u64,
    in_flight: usize,
    pending: Vec<Pending>,
    dead_lettered: u64,
    skipped: u64,
}

impl GroupRow {
    pub fn new(topic: &str, group: String, i: &spool::GroupInfo) -> GroupRow {
        GroupRow {
            topic: topic.to_owned(),
            group,
            cursor: i.cursor,
            next: i.next,
            lag: i.lag,
            in_flight: i.in_flight,
            pending: i
                .pending
                .iter()
                .map(|p| Pending {
                    offset: p.offset,
                    attempts: p.attempts,
                    last_reason: p.last_reason.clone(),
                })
                .collect(),
            dead_lettered: i.dead_lettered,
            skipped: i.skipped,
        }
    }
}

/// `spool groups [--topic T] [--group G]`: a group named with its topic is shown even
/// before it has state (as a new group would start); otherwise groups with state.
pub async fn groups(
    b: &Backend,
    out: Output,
    topic: Option<String>,
    group: Option<String>,
) -> Result<(), Failure> {
    let topics = match &topic {
        Some(t) => vec![t.clone()],
        None => b.topics().await?,
    };
    let mut rows = Vec::new();
    for t in &topics {
        let names = match (&topic, &group) {
            (Some(_), Some(g)) => vec![g.clone()],
            (_, Some(g)) => b.groups(t).await?.into_iter().filter(|n| n == g).collect(),
            (_, None) => b.groups(t).await?,
        };
        for g in names {
            rows.push(group_row(b, t, g).await?);
        }
    }
    if out == Output::Json {
        return print_json(&rows);
    }
    print_groups(&rows)
}

async fn group_row(b: &Backend, topic: &str, group: String) -> Result<GroupRow, Failure> {
    let i = b.group_info(topic, &group).await?;
    Ok(GroupRow::new(topic, group, &i))
}

fn print_groups(rows: &[GroupRow]) -> Result<(), Failure> {
    let mut t = table(&[
        "topic",
        "group",
        "cursor",
        "next",
        "lag",
        "in-flight",
        "pending",
        "dead-lettered",
        "skipped",
        "last reason",
    ]);
    for r in rows {
        let pending = match r.pending.first() {
            Some(p) => format!("{} (offset {} x{})", r.pending.len(), p.offset, p.attempts),
            None => "0".to_owned(),
        };
        t.add_row(vec![
            r.topic.clone(),
            r.group.clone(),
            r.cursor.to_string(),
            r.next.to_string(),
            r.lag.to_string(),
            r.in_flight.to_string(),
            pending,
            r.dead_lettered.to_string(),
            r.skipped.to_string(),
            r.pending
                .first()
                .map_or("-", |p| p.last_reason.as_str())
                .to_owned(),
        ]);
    }
    print_table(&t)
}

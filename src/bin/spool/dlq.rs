//! `dlq list|show|replay`, built from `topic_info`, `fetch` and `publish_batch`.
//!
//! A dead-letter topic is a topic whose name ends with the dead-letter suffix (`.dlq`, or
//! `Dead Letter Suffix` of a connection string). A replayed copy keeps the payload and
//! every header of the dead-letter record, adds `x-replayed-from: <DLQ>:<offset>` and
//! carries `message-id: replay:<DLQ>:<offset>` (a former `message-id` moves to
//! `x-original-message-id`): the target's de-duplication window makes a second replay
//! append nothing. A copy is a duplicate when its publish returns an offset below the
//! target's end before the batch (the original's).

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use spool::consts::{
    MESSAGE_ID_HEADER, X_CONSUMER_GROUP, X_DEAD_LETTER_REASON, X_DELIVERY_ATTEMPTS,
};
use spool::{Headers, Options, Record};

use crate::args::{DlqCommand, Output, Select};
use crate::backend::Backend;
use crate::failure::Failure;
use crate::output::{self, print_json, print_line, print_table, table};
use crate::progress;

/// Header a replayed copy carries: `<DLQ>:<offset>`.
const X_REPLAYED_FROM: &str = "x-replayed-from";
/// Header keeping the dead-letter record's own `message-id` in its copy.
const X_ORIGINAL_MESSAGE_ID: &str = "x-original-message-id";
/// Records read at a time.
const BATCH: usize = 500;

pub async fn run(b: &Backend, out: Output, cmd: DlqCommand, opts: &Options) -> Result<(), Failure> {
    match cmd {
        DlqCommand::List => list(b, out, &opts.dead_letter_suffix).await,
        DlqCommand::Show { dlq, select } => show(b, out, &dlq, select).await,
        DlqCommand::Replay {
            dlq,
            to,
            select,
            execute,
        } => replay(b, out, &dlq, &to, select, execute, opts.dedup_window).await,
    }
}

/// Reads a topic forward in batches from `from`, keeping what a `Select` asks for.
struct Scan {
    topic: String,
    from: u64,
    left: u64,
    reason: Option<String>,
}

impl Scan {
    async fn new(b: &Backend, topic: &str, select: Select) -> Result<Scan, Failure> {
        let earliest = b.topic_info(topic).await?.earliest;
        Ok(Scan {
            topic: topic.to_owned(),
            from: select.from.unwrap_or(earliest),
            left: select.max.unwrap_or(u64::MAX),
            reason: select.reason,
        })
    }

    /// The next selected records; empty at the end.
    async fn next(&mut self, b: &Backend) -> Result<Vec<Record>, Failure> {
        while self.left > 0 {
            let records = b.fetch(&self.topic, self.from, BATCH).await?;
            let Some(last) = records.last() else {
                return Ok(Vec::new());
            };
            self.from = last.offset() + 1;
            let mut kept: Vec<Record> = records.into_iter().filter(|r| self.wanted(r)).collect();
            kept.truncate(usize::try_from(self.left).unwrap_or(usize::MAX));
            self.left -= kept.len() as u64;
            if !kept.is_empty() {
                return Ok(kept);
            }
        }
        Ok(Vec::new())
    }

    fn wanted(&self, r: &Record) -> bool {
        self.reason.as_deref().is_none_or(|text| {
            r.headers()
                .get(X_DEAD_LETTER_REASON)
                .is_some_and(|reason| reason.contains(text))
        })
    }
}

/// A dead-letter topic as `dlq list --output json` and `spool serve`'s `/api/dlq` show it.
#[derive(Serialize)]
pub struct DlqRow {
    topic: String,
    source: String,
    messages: u64,
    reasons: BTreeMap<String, u64>,
}

/// `spool dlq list`.
async fn list(b: &Backend, out: Output, suffix: &str) -> Result<(), Failure> {
    let rows = dlq_rows(b, suffix).await?;
    if out == Output::Json {
        return print_json(&rows);
    }
    let mut t = table(&["dlq", "source", "messages", "reasons"]);
    for r in &rows {
        let reasons: Vec<String> = r
            .reasons
            .iter()
            .map(|(k, n)| format!("{k} ({n})"))
            .collect();
        t.add_row(vec![
            r.topic.clone(),
            r.source.clone(),
            r.messages.to_string(),
            reasons.join(", "),
        ]);
    }
    print_table(&t)
}

/// Every dead-letter topic (named with `suffix`) with its source and counts by reason.
pub async fn dlq_rows(b: &Backend, suffix: &str) -> Result<Vec<DlqRow>, Failure> {
    let mut rows = Vec::new();
    for topic in b.topics().await? {
        let Some(base) = topic
            .strip_suffix(suffix)
            .filter(|s| !s.is_empty() && !suffix.is_empty())
        else {
            continue;
        };
        let messages = b.topic_info(&topic).await?.messages;
        let mut reasons = BTreeMap::new();
        let mut sources = BTreeSet::new();
        let select = Select {
            from: None,
            max: None,
            reason: None,
        };
        let mut scan = Scan::new(b, &topic, select).await?;
        loop {
            let records = scan.next(b).await?;
            if records.is_empty() {
                break;
            }
            for r in &records {
                let h = r.headers();
                let reason = h.get(X_DEAD_LETTER_REASON).cloned().unwrap_or_default();
                *reasons.entry(reason).or_insert(0) += 1;
                if let Some(s) = h.get(spool::consts::X_ORIGINAL_TOPIC) {
                    sources.insert(s.clone());
                }
            }
        }
        let source = if sources.is_empty() {
            base.to_owned()
        } else {
            sources.into_iter().collect::<Vec<_>>().join(",")
        };
        rows.push(DlqRow {
            topic,
            source,
            messages,
            reasons,
        });
    }
    Ok(rows)
}

/// The records of `dlq` a `Select` asks for, as `dlq show --output json` prints them.
pub async fn selected(b: &Backend, dlq: &str, select: Select) -> Result<Vec<Record>, Failure> {
    let mut scan = Scan::new(b, dlq, select).await?;
    let mut out = Vec::new();
    loop {
        let records = scan.next(b).await?;
        if records.is_empty() {
            return Ok(out);
        }
        out.extend(records);
    }
}

/// `spool dlq show DLQ [--from N] [--max N] [--reason TEXT]`.
async fn show(b: &Backend, out: Output, dlq: &str, select: Select) -> Result<(), Failure> {
    let mut scan = Scan::new(b, dlq, select).await?;
    let mut t = table(&[
        "offset", "original", "group", "attempts", "reason", "payload",
    ]);
    loop {
        let records = scan.next(b).await?;
        if records.is_empty() {
            break;
        }
        for r in &records {
            if out == Output::Json {
                print_line(&output::record_json(r))?;
                continue;
            }
            let h = |k: &str| {
                r.headers()
                    .get(k)
                    .cloned()
                    .unwrap_or_else(|| "-".to_owned())
            };
            t.add_row(vec![
                r.offset().to_string(),
                format!(
                    "{}:{}",
                    h(spool::consts::X_ORIGINAL_TOPIC),
                    h(spool::consts::X_ORIGINAL_OFFSET)
                ),
                h(X_CONSUMER_GROUP),
                h(X_DELIVERY_ATTEMPTS),
                h(X_DEAD_LETTER_REASON),
                output::payload_cell(r.payload()),
            ]);
        }
    }
    if out == Output::Table {
        print_table(&t)?;
    }
    Ok(())
}

/// The copy of dead-letter record `r` of `dlq` that a replay appends.
fn replay_copy(dlq: &str, r: &Record) -> (Vec<u8>, Headers) {
    let mut headers = r.headers().clone();
    if let Some(id) = headers.remove(MESSAGE_ID_HEADER) {
        headers.insert(X_ORIGINAL_MESSAGE_ID.to_owned(), id);
    }
    headers.insert(X_REPLAYED_FROM.to_owned(), format!("{dlq}:{}", r.offset()));
    headers.insert(MESSAGE_ID_HEADER.to_owned(), replay_id(dlq, r.offset()));
    (r.payload().to_vec(), headers)
}

fn replay_id(dlq: &str, offset: u64) -> String {
    format!("replay:{dlq}:{offset}")
}

/// `spool dlq replay DLQ --to TOPIC [..] [--execute]`.
async fn replay(
    b: &Backend,
    out: Output,
    dlq: &str,
    to: &str,
    select: Select,
    execute: bool,
    dedup_window: usize,
) -> Result<(), Failure> {
    let r = replayed(b, dlq, to, select, execute, dedup_window).await?;
    if out == Output::Json {
        return print_json(&r);
    }
    let mut t = table(&["dlq", "to", "replayed", "duplicates", "executed"]);
    let executed = if execute {
        "yes"
    } else {
        "no (dry run: add --execute)"
    };
    t.add_row(vec![
        dlq.to_owned(),
        to.to_owned(),
        r.replayed.to_string(),
        r.duplicates.to_string(),
        executed.to_owned(),
    ]);
    print_table(&t)
}

/// What a replay did (or, without `execute`, would do), as `dlq replay --output json`
/// and `spool serve`'s `POST /api/dlq/{dlq}/replay` give it.
#[derive(Serialize)]
pub struct Replayed {
    to: String,
    replayed: u64,
    duplicates: u64,
    executed: bool,
}

/// Replays what `select` picks of `dlq` into `to` (see the module's rules).
pub async fn replayed(
    b: &Backend,
    dlq: &str,
    to: &str,
    select: Select,
    execute: bool,
    dedup_window: usize,
) -> Result<Replayed, Failure> {
    if to == dlq {
        return Err(Failure::failed(format!(
            "--to {to} is the dead-letter topic itself: name the topic to replay into"
        )));
    }
    // A bad target name fails here, before anything is read or appended.
    let to_end = b.topic_info(to).await?.next;
    let held = if execute {
        BTreeSet::new()
    } else {
        ids_held(b, to, to_end, dedup_window).await?
    };
    let total = b.topic_info(dlq).await?.messages;
    let bar = progress::bar(Some(total), "replaying");
    let mut scan = Scan::new(b, dlq, select).await?;
    let (mut replayed, mut duplicates) = (0u64, 0u64);
    loop {
        let records = scan.next(b).await?;
        if records.is_empty() {
            break;
        }
        bar.inc(records.len() as u64);
        if !execute {
            let dup = records
                .iter()
                .filter(|r| held.contains(&replay_id(dlq, r.offset())))
                .count() as u64;
            duplicates += dup;
            replayed += records.len() as u64 - dup;
            continue;
        }
        let copies = records.iter().map(|r| replay_copy(dlq, r)).collect();
        for batch in b.batches(copies) {
            let end_before = b.topic_info(to).await?.next;
            let first = batch[0].1.get(X_REPLAYED_FROM).cloned().unwrap_or_default();
            let offsets = b.publish_batch(to, batch).await.map_err(|f| {
                f.after(format!(
                    "the replay stopped at {first}, after {replayed} copies appended and \
                     {duplicates} found already there; run it again to finish (the copies \
                     made are known by their message ids while {to}'s Dedup Window holds them)"
                ))
            })?;
            let dup = offsets.iter().filter(|&&o| o < end_before).count() as u64;
            duplicates += dup;
            replayed += offsets.len() as u64 - dup;
        }
    }
    bar.finish_and_clear();
    tracing::info!(dlq, to, replayed, duplicates, execute, "dead-letter replay");
    Ok(Replayed {
        to: to.to_owned(),
        replayed,
        duplicates,
        executed: execute,
    })
}

/// The replay ids (`replay:..`) among the last `window` message ids of `topic`: what its
/// de-duplication window holds of earlier replays (read backwards from `end`).
async fn ids_held(
    b: &Backend,
    topic: &str,
    end: u64,
    window: usize,
) -> Result<BTreeSet<String>, Failure> {
    let earliest = b.topic_info(topic).await?.earliest;
    let (mut held, mut ids, mut upto) = (BTreeSet::new(), 0usize, end);
    while upto > earliest && ids < window {
        let from = upto.saturating_sub(BATCH as u64).max(earliest);
        let records = b
            .fetch(topic, from, usize::try_from(upto - from).unwrap_or(BATCH))
            .await?;
        for r in records.iter().rev() {
            if let Some(id) = r.headers().get(MESSAGE_ID_HEADER) {
                ids += 1;
                if ids > window {
                    break;
                }
                if id.starts_with("replay:") {
                    held.insert(id.clone());
                }
            }
        }
        upto = from;
    }
    Ok(held)
}

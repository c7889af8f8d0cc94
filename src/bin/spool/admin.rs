//! `verify`, `snapshot`, `delete-records`, `delete-group` and `serve`.

use std::io::Write;
use std::path::PathBuf;

use serde::Serialize;
use serde_json::json;

use crate::args::Output;
use crate::backend::Backend;
use crate::failure::Failure;
use crate::output::{print_json, print_table, table};
use crate::progress;
use crate::target::Target;

#[derive(Serialize)]
struct Problem {
    file: String,
    position: Option<u64>,
    problem: String,
}

#[derive(Serialize)]
struct TopicCheck {
    topic: String,
    segments: usize,
    records: u64,
    problems: Vec<Problem>,
}

/// `spool verify`, first step: without an owner, the logs are read before the directory
/// is opened; damage found there is reported (exit 3) and the directory is not opened.
/// `Ok` when there is none, or an owner holds the directory (then it answers).
pub async fn verify_closed(target: &Target, out: Output) -> Result<(), Failure> {
    target.check(false)?;
    let bar = progress::bar(None, "verifying");
    // Every topic, also with `--topic`: the open that follows would cut a damaged active
    // tail of any topic back, unreported. Damage elsewhere is reported with the rest.
    let closed = spool::Spool::verify_closed(target.dir(), None);
    bar.finish_and_clear();
    match closed {
        Ok(report) if !report.ok() => print_report(&report, out),
        Ok(_) | Err(spool::Error::Locked { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// `spool verify [--topic T]`: exit 3 when anything is damaged.
pub async fn verify(b: &Backend, out: Output, topic: Option<String>) -> Result<(), Failure> {
    let bar = progress::bar(None, "verifying");
    let report = b.verify(topic.as_deref()).await?;
    bar.finish_and_clear();
    print_report(&report, out)
}

/// Prints what verify found; `Err` (exit 3) if anything is damaged.
fn print_report(report: &spool::VerifyReport, out: Output) -> Result<(), Failure> {
    let topics: Vec<TopicCheck> = report
        .topics
        .iter()
        .map(|t| TopicCheck {
            topic: t.topic.clone(),
            segments: t.segments,
            records: t.records,
            problems: t
                .problems
                .iter()
                .map(|p| Problem {
                    file: p.file.display().to_string(),
                    position: p.position,
                    problem: p.problem.clone(),
                })
                .collect(),
        })
        .collect();
    let problems: usize = topics.iter().map(|t| t.problems.len()).sum();
    if out == Output::Json {
        print_json(&json!({ "ok": problems == 0, "topics": topics }))?;
    } else {
        print_verify(&topics)?;
    }
    match problems {
        0 => Ok(()),
        n => Err(Failure::damaged(format!(
            "verify found {n} problem(s), listed above; restore from a snapshot or copy the data out before repairing"
        ))),
    }
}

fn print_verify(topics: &[TopicCheck]) -> Result<(), Failure> {
    let mut t = table(&["topic", "segments", "records", "problems"]);
    for c in topics {
        t.add_row(vec![
            c.topic.clone(),
            c.segments.to_string(),
            c.records.to_string(),
            c.problems.len().to_string(),
        ]);
    }
    print_table(&t)?;
    let damaged: Vec<&Problem> = topics.iter().flat_map(|c| &c.problems).collect();
    if damaged.is_empty() {
        return Ok(());
    }
    // Not `println!`: it panics on a closed pipe (`spool verify | head -1`).
    writeln!(std::io::stdout().lock())?;
    let mut t = table(&["file", "position", "problem"]);
    for p in damaged {
        let at = p.position.map_or("-".to_owned(), |n| n.to_string());
        t.add_row(vec![p.file.clone(), at, p.problem.clone()]);
    }
    print_table(&t)
}

/// `spool snapshot DEST`.
pub async fn snapshot(b: &Backend, out: Output, dest: PathBuf) -> Result<(), Failure> {
    let bar = progress::bar(None, "snapshot");
    let info = b.snapshot(&dest).await?;
    bar.finish_and_clear();
    let path = dest.display().to_string();
    if out == Output::Json {
        return print_json(&json!({ "path": path, "topics": info.topics, "bytes": info.bytes }));
    }
    let mut t = table(&["path", "topics", "bytes"]);
    t.add_row(vec![path, info.topics.to_string(), info.bytes.to_string()]);
    print_table(&t)
}

/// `spool delete-records T --before N [--execute]`.
pub async fn delete_records(
    b: &Backend,
    out: Output,
    topic: String,
    before: u64,
    execute: bool,
) -> Result<(), Failure> {
    let info = b.topic_info(&topic).await?;
    let new = if execute {
        b.delete_records_before(&topic, before).await?
    } else {
        before.min(info.next).max(info.earliest)
    };
    if out == Output::Json {
        return print_json(&json!({
            "topic": topic, "old_earliest": info.earliest, "new_earliest": new, "executed": execute,
        }));
    }
    let mut t = table(&[
        "topic",
        "old earliest",
        "new earliest",
        "deleted",
        "executed",
    ]);
    t.add_row(vec![
        topic,
        info.earliest.to_string(),
        new.to_string(),
        (new - info.earliest.min(new)).to_string(),
        executed_cell(execute),
    ]);
    print_table(&t)
}

/// `spool delete-group T G [--execute]`.
pub async fn delete_group(
    b: &Backend,
    out: Output,
    topic: String,
    group: String,
    execute: bool,
) -> Result<(), Failure> {
    // Checks both names (and reads what is about to go) before anything changes.
    let info = b.group_info(&topic, &group).await?;
    if execute {
        b.delete_group(&topic, &group).await?;
    }
    if out == Output::Json {
        return print_json(&json!({ "topic": topic, "group": group, "executed": execute }));
    }
    let mut t = table(&["topic", "group", "cursor", "lag", "executed"]);
    t.add_row(vec![
        topic,
        group,
        info.cursor.to_string(),
        info.lag.to_string(),
        executed_cell(execute),
    ]);
    print_table(&t)
}

fn executed_cell(execute: bool) -> String {
    if execute {
        "yes"
    } else {
        "no (dry run: add --execute)"
    }
    .to_owned()
}

//! Verifying the instance (`spool verify`): every log read back (`log/verify.rs`), and
//! the catalog's rows checked against the logs they refer to.
//!
//! **Invariant:** read-only. It commits nothing and repairs nothing; it holds a writer's
//! lock only to list a log's segments, and holds off retention while it reads (a segment
//! it reads is not deleted under it).

use std::path::{Path, PathBuf};

use super::Engine;
use super::engine::lock;
use crate::error::Result;
use crate::io::{DirLock, Fs};
use crate::log::{Damage, LogCheck, plan_closed};

/// What [`Spool::verify`](crate::Spool::verify) found. Serializable: the admin endpoint
/// sends it as it is.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct VerifyReport {
    /// One entry per topic verified, sorted by name.
    pub topics: Vec<TopicVerify>,
}

impl VerifyReport {
    /// Whether nothing is damaged.
    pub fn ok(&self) -> bool {
        self.topics.iter().all(|t| t.problems.is_empty())
    }
}

/// What verifying one topic found.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct TopicVerify {
    /// The topic's name.
    pub topic: String,
    /// Segment files read.
    pub segments: usize,
    /// Whole records read (up to the first damage in each segment).
    pub records: u64,
    /// Every problem found, in the order found.
    pub problems: Vec<VerifyProblem>,
}

/// One problem: the file, the byte position in it where it applies, and what is wrong.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct VerifyProblem {
    /// The damaged file (a segment, its index, or the catalog).
    pub file: PathBuf,
    /// Byte position in `file`; `None` for a catalog row (redb has no stable positions).
    pub position: Option<u64>,
    /// What is wrong.
    pub problem: String,
}

impl From<Damage> for VerifyProblem {
    fn from(d: Damage) -> Self {
        VerifyProblem {
            file: d.file,
            position: Some(d.position),
            problem: d.what,
        }
    }
}

/// Verifies the logs of the closed data directory `dir` (of `topic` only, if given)
/// without opening it: nothing is recovered, truncated or rebuilt first, so damage an
/// open would cut away as a torn tail is reported where it is. Holds the directory's
/// lock while it reads (`Error::Locked` if an instance has it). The catalog is not read:
/// `Engine::verify` checks it against the logs once the directory is open.
pub fn verify_closed(fs: &Fs, dir: &Path, topic: Option<&str>) -> Result<VerifyReport> {
    if let Some(t) = topic {
        crate::names::check(t)?;
    }
    let _lock = DirLock::acquire(fs, dir)?;
    let topics_dir = dir.join("topics");
    let mut names = match fs.is_dir(&topics_dir) {
        Some(true) => fs.list_dir(&topics_dir)?,
        _ => Vec::new(),
    };
    names.retain(|n| crate::names::check(n).is_ok() && topic.is_none_or(|t| t == n));
    names.sort();
    let mut report = VerifyReport::default();
    for name in names {
        let check = plan_closed(fs, &topics_dir.join(&name), super::topic::MAX_BODY)?.run();
        report.topics.push(TopicVerify {
            topic: name,
            segments: check.segments,
            records: check.records,
            problems: check
                .problems
                .into_iter()
                .map(VerifyProblem::from)
                .collect(),
        });
    }
    Ok(report)
}

impl Engine {
    /// Verifies `topic` (every topic if `None`): see the module docs. An unknown topic
    /// reports nothing (it has no files).
    pub fn verify(&self, topic: Option<&str>) -> Result<VerifyReport> {
        if let Some(t) = topic {
            crate::names::check(t)?;
        }
        // To write, as a snapshot does: retention and record deletion (which take it to
        // read) wait, so no segment goes away while it is read.
        let _files = self.deletions.write().unwrap_or_else(|e| e.into_inner());
        let catalog_topics = self.catalog.topics()?;
        let starts = self.catalog.topic_starts()?;
        let groups = self.catalog.groups()?;
        let catalog_path = self.opts.data_source.join("catalog.redb");
        let row = |what: String| VerifyProblem {
            file: catalog_path.clone(),
            position: None,
            problem: what,
        };
        let mut report = VerifyReport::default();
        for name in catalog_topics.keys() {
            if topic.is_some_and(|t| t != name) {
                continue;
            }
            let Some(t) = self.topic(name) else {
                report.topics.push(TopicVerify {
                    topic: name.clone(),
                    problems: vec![row(format!("topic {name} has no log"))],
                    ..TopicVerify::default()
                });
                continue;
            };
            // The log end first, then the segments' ends: records made visible in between
            // (a sync under `Always`) can only put the segments ahead of `next`.
            let (next, plan) = {
                let w = lock(&t.writer);
                (t.reader.next(), w.log.verify_plan())
            };
            let check: LogCheck = plan.run();
            let mut problems: Vec<VerifyProblem> = check
                .problems
                .into_iter()
                .map(VerifyProblem::from)
                .collect();
            if check.next < next && problems.is_empty() {
                problems.push(row(format!(
                    "topic {name}: the log reports its end at {next}, its records end at {}",
                    check.next
                )));
            }
            if let Some(&start) = starts.get(name)
                && start > next
            {
                problems.push(row(format!(
                    "topic {name}: first readable offset {start} is past the log end {next}"
                )));
            }
            for ((gt, group), g) in groups.range((name.clone(), String::new())..) {
                if gt != name {
                    break;
                }
                let past = g.in_flight.iter().chain(&g.done_above).any(|&o| o >= next);
                if g.cursor > next || past {
                    problems.push(row(format!(
                        "group {group} of topic {name}: cursor {} or an offset it holds is past the log end {next}",
                        g.cursor
                    )));
                }
            }
            report.topics.push(TopicVerify {
                topic: name.clone(),
                segments: check.segments,
                records: check.records,
                problems,
            });
        }
        Ok(report)
    }
}

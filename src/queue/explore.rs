//! A random exploration of consumer groups across stops (test only): three groups driven
//! through manual and auto-ack (lent) hand-outs, acks, nacks to and past the limit,
//! releases, low-level ack/nack, resets of every kind, retention, ticker commits, clean
//! closes, process kills and power cuts (also armed to land inside a later operation),
//! under `Always`, `None` and `Interval` by seed, checked against a reference model after
//! every reopen and every 20 steps: records are the ones published, no offset below a
//! cursor was neither acked nor dead-lettered, at most one dead-letter copy per message
//! and group, attempt counts never go back across a stop, an unclean stop charges what was
//! in flight, durable acks and resets survive. Written by a review (found no bug);
//! `SPOOL_GROUP_EXPLORE_SEEDS=<n> SPOOL_GROUP_EXPLORE_FIRST=<k> cargo test --release --lib
//! explore_groups -- --nocapture` runs more (100 seeds by default, ~5 s).
//!
//! This file holds the world (engine and reference model) and the checks of the engine
//! against the model; `explore/driver.rs` drives the operations and the stops.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::AtomicU64 as Counter;
use std::sync::atomic::Ordering;

use super::group::Group;
use super::{
    Engine, GroupRef, LentRecords, NackOutcome, Ticket, X_CONSUMER_GROUP, X_ORIGINAL_OFFSET,
};
use crate::catalog::{AttemptRecord, GroupRecord, Op};
use crate::format::record::Record;
use crate::io::sim::SimFs;
use crate::options::SyncPolicy;

mod driver;

static STATS: [Counter; 6] = [const { Counter::new(0) }; 6];
fn stat(k: usize) {
    STATS[k].fetch_add(1, Ordering::Relaxed);
}

const GROUPS: [&str; 3] = ["g0", "g1", "g2"];
const MAX_ATTEMPTS: u32 = 3;

/// What a group's model knew before an operation a power cut may land in: epoch, reset
/// base, DLQ mark, maybe-acked and durably acked offsets, durable nacks, dead-lettered pids.
type GroupFacts = (
    u64,
    u64,
    u64,
    BTreeSet<u64>,
    BTreeSet<u64>,
    BTreeMap<u64, u32>,
    Vec<String>,
);

#[derive(Default)]
struct GModel {
    epoch: u64,
    /// Offsets below this are exempt from the no-skip check (reset target).
    base: u64,
    /// DLQ offset at the last reset: copies from here on belong to this epoch.
    dlq_mark: u64,
    maybe_acked: BTreeSet<u64>,
    /// Acks made since the last open (a clean close makes them durable).
    acked_since_open: BTreeSet<u64>,
    durable_acked: BTreeSet<u64>,
    /// Nacks that returned Ok since the last reset (they are durable).
    nacks: BTreeMap<u64, u32>,
    /// pids whose nack said dead_lettered: true.
    dead_lettered: Vec<String>,
    held: Vec<(Ticket, u32)>,
    auto_prev: Option<Ticket>,
    lent: Option<(LentRecords, u64, u64)>,
    r: Option<GroupRef>,
}

struct World {
    seed: u64,
    sync: SyncPolicy,
    fs: SimFs,
    e: Option<Engine>,
    now: u64,
    /// pid of each offset of topic t.
    log: Vec<String>,
    /// Every DLQ record ever seen: offset -> (group, original offset, pid).
    dlq: BTreeMap<u64, (String, u64, String)>,
    g: Vec<GModel>,
    trace: Vec<String>,
    rng: u64,
    pid_seq: u64,
    armed: bool,
    retention: u64,
}

impl World {
    fn e(&self) -> &Engine {
        self.e.as_ref().expect("engine")
    }
    fn fail(&self, what: String) -> ! {
        let start = self.trace.len().saturating_sub(60);
        panic!(
            "seed {} ({:?}): {what}\ntrace (last 60):\n{}",
            self.seed,
            self.sync,
            self.trace[start..].join("\n")
        );
    }
    fn ref_(&self, i: usize) -> GroupRef {
        self.g[i].r.clone().expect("ref")
    }
    fn pid_of(rec: &Record) -> String {
        rec.headers.get("pid").cloned().unwrap_or_default()
    }

    /// Checks a hand-out of `rec` with `attempt` for group `i`.
    fn check_handout(&self, i: usize, rec: &Record, attempt: u32, lent: bool) {
        let o = rec.offset;
        if self.log.get(o as usize) != Some(&Self::pid_of(rec)) {
            self.fail(format!(
                "{}: offset {o} is not the record published there",
                GROUPS[i]
            ));
        }
        let n = self.g[i].nacks.get(&o).copied().unwrap_or(0);
        if attempt < n + 1 {
            self.fail(format!(
                "{}: offset {o} handed out with attempt {attempt} (lent {lent}) after {n} durable nacks",
                GROUPS[i]
            ));
        }
        if attempt > MAX_ATTEMPTS {
            self.fail(format!(
                "{}: offset {o} handed out with attempt {attempt} > max {MAX_ATTEMPTS}",
                GROUPS[i]
            ));
        }
    }

    fn scan_dlq(&mut self) {
        let known = self.dlq.last_key_value().map_or(0, |(k, _)| k + 1);
        let dlq_next = self.e().topic("t.dlq").map_or(0, |t| t.reader.next());
        if dlq_next < known {
            self.fail(format!(
                "the dead-letter topic lost copies: next {dlq_next}, {known} seen: {:?}",
                self.dlq
            ));
        }
        let recs = self.e().fetch("t.dlq", 0, usize::MAX).expect("fetch dlq");
        for r in recs {
            let g = r.headers.get(X_CONSUMER_GROUP).cloned().unwrap_or_default();
            let o: u64 = r.headers[X_ORIGINAL_OFFSET].parse().expect("offset");
            let v = (g, o, Self::pid_of(&r));
            if let Some(old) = self.dlq.get(&r.offset)
                && *old != v
            {
                self.fail(format!("dlq offset {} changed: {old:?} -> {v:?}", r.offset));
            }
            self.dlq.insert(r.offset, v);
        }
    }

    /// Model checks against the engine's memory (takes each group's lock).
    fn check_state(&mut self, what: &str) {
        self.scan_dlq();
        let e = self.e.as_ref().expect("engine");
        let t = e.topic("t");
        let (earliest, next) = t
            .as_ref()
            .map_or((0, 0), |t| (t.reader.earliest(), t.reader.next()));
        let recs = match e.fetch("t", earliest, usize::MAX) {
            Ok(recs) => recs,
            Err(err) => self.fail(format!("{what}: fetch: {err}")),
        };
        for (i, name) in GROUPS.iter().enumerate() {
            let gm = &self.g[i];
            let r = gm.r.as_ref().expect("ref");
            let g = r.group.lock();
            g.check();
            if g.epoch != gm.epoch {
                self.fail(format!(
                    "{what}: {} epoch {} expected {}",
                    *name, g.epoch, gm.epoch
                ));
            }
            if g.cursor > next {
                self.fail(format!(
                    "{what}: {} cursor {} past log end {next}",
                    *name, g.cursor
                ));
            }
            self.check_no_skip(what, i, &g, earliest, &recs);
            self.check_durable(what, i, &g, next);
            self.check_dead_letter_copies(what, i);
        }
    }

    /// No skipping: every offset the cursor passed since the reset was acked or has a
    /// dead-letter copy. `recs` are the log's records from `earliest` on.
    fn check_no_skip(&self, what: &str, i: usize, g: &Group, earliest: u64, recs: &[Record]) {
        let (gm, name) = (&self.g[i], GROUPS[i]);
        for o in gm.base.max(earliest)..g.cursor {
            if gm.maybe_acked.contains(&o) {
                continue;
            }
            let pid = Self::pid_of(&recs[(o - earliest) as usize]);
            let copied = self
                .dlq
                .range(gm.dlq_mark..)
                .any(|(_, (gg, oo, p))| gg == name && *oo == o && *p == pid);
            if !copied {
                self.fail(format!(
                    "{what}: {} cursor {} passed offset {o} (pid {pid}) neither acked nor dead-lettered; dlq_mark {} dlq {:?}; engine dead_lettered {} skipped {}",
                    name, g.cursor, gm.dlq_mark, self.dlq, g.dead_lettered, g.skipped
                ));
            }
        }
    }

    /// What the model knows to be durable (acks, nack counts) holds in the engine.
    fn check_durable(&self, what: &str, i: usize, g: &Group, next: u64) {
        let (gm, name) = (&self.g[i], GROUPS[i]);
        // Durable acks stay done.
        for &o in &gm.durable_acked {
            if o < next && g.unfinished(o) {
                self.fail(format!(
                    "{what}: {} durable ack of {o} lost (cursor {}, done_above {:?})",
                    name, g.cursor, g.done_above
                ));
            }
        }
        // Durable nack counts stay.
        for (&o, &n) in &gm.nacks {
            if o < next && g.unfinished(o) {
                let a = g.attempts.get(&o).map_or(0, |a| a.attempts);
                if a < n {
                    self.fail(format!(
                        "{what}: {} offset {o} has {a} attempts after {n} durable nacks",
                        name
                    ));
                }
            }
        }
    }

    /// Dead-letter copies: exactly one per (group, pid) in this epoch's window, and one
    /// for every nack that said it dead-lettered.
    fn check_dead_letter_copies(&self, what: &str, i: usize) {
        let (gm, name) = (&self.g[i], GROUPS[i]);
        let mut count: BTreeMap<&str, usize> = BTreeMap::new();
        for (_, (gg, _, p)) in self.dlq.range(gm.dlq_mark..) {
            if gg == name {
                *count.entry(p).or_default() += 1;
            }
        }
        for (p, c) in &count {
            if *c > 1 {
                self.fail(format!(
                    "{what}: {} has {c} dead-letter copies of pid {p}",
                    name
                ));
            }
        }
        for p in &gm.dead_lettered {
            if !self.dlq.values().any(|(gg, _, pp)| gg == name && pp == p) {
                self.fail(format!(
                    "{what}: {} dead-letter copy of pid {p} missing",
                    name
                ));
            }
        }
    }

    fn after_nack(&mut self, i: usize, o: u64, out: &NackOutcome, how: &str) {
        let n = self.g[i].nacks.get(&o).copied().unwrap_or(0);
        if out.delivery_attempt < n + 1 {
            self.fail(format!(
                "{how} of {o}: attempt {} after {n} nacks",
                out.delivery_attempt
            ));
        }
        let earliest = self.e().topic("t").expect("t").reader.earliest();
        if out.delivery_attempt >= MAX_ATTEMPTS && !out.dead_lettered && o >= earliest {
            self.fail(format!(
                "{how} of {o}: attempt {} not dead-lettered",
                out.delivery_attempt
            ));
        }
        if out.dead_lettered {
            stat(0);
            let pid = self.log[o as usize].clone();
            self.g[i].dead_lettered.push(pid);
            self.g[i].nacks.remove(&o);
        } else {
            self.g[i].nacks.insert(o, out.delivery_attempt);
        }
        self.trace
            .push(format!("{} {how} {o} -> {out:?}", GROUPS[i]));
        self.scan_dlq();
    }

    /// Catalog state before a stop: (image, attempt rows) per group.
    fn durable_before(&self) -> Vec<(GroupRecord, BTreeMap<u64, AttemptRecord>)> {
        let e = self.e();
        e.catalog.commit(&[Op::SetClean(false)]).expect("barrier");
        let groups = e.catalog.groups().expect("groups");
        GROUPS
            .iter()
            .map(|g| {
                (
                    groups
                        .get(&("t".to_owned(), (*g).to_owned()))
                        .cloned()
                        .unwrap_or_default(),
                    e.catalog.attempts("t", g).expect("attempts"),
                )
            })
            .collect()
    }

    fn after_reopen(
        &mut self,
        before: Option<Vec<(GroupRecord, BTreeMap<u64, AttemptRecord>)>>,
        power: bool,
    ) {
        let next = self.e().topic("t").map_or(0, |t| t.reader.next());
        if (next as usize) < self.log.len() {
            if !power || self.sync == SyncPolicy::Always {
                self.fail(format!(
                    "log lost records: next {next}, published {}",
                    self.log.len()
                ));
            }
            self.forget_lost_records(next);
        }
        // Attempts never go backwards, and an offset out at the last image is charged.
        if let Some(before) = before {
            for (i, (rec, rows)) in before.iter().enumerate() {
                let r = self.ref_(i);
                let g = r.group.lock();
                if g.epoch != rec.epoch {
                    continue;
                }
                let pending = |o: u64| o < next && g.unfinished(o);
                for (&o, a) in rows {
                    if pending(o) {
                        let now = g.attempts.get(&o).map_or(0, |a| a.attempts);
                        if now < a.attempts {
                            self.fail(format!(
                                "{} offset {o}: attempts {} -> {now} across the stop",
                                GROUPS[i], a.attempts
                            ));
                        }
                    }
                }
                for &o in &rec.in_flight {
                    if o >= rec.cursor && !rec.done_above.contains(&o) && pending(o) {
                        stat(2);
                        let was = rows.get(&o).map_or(0, |a| a.attempts);
                        let now = g.attempts.get(&o).map_or(0, |a| a.attempts);
                        if now < was + 1 {
                            self.fail(format!(
                                "{} offset {o} was in flight in the last image but not charged ({was} -> {now})",
                                GROUPS[i]
                            ));
                        }
                    }
                }
            }
        }
        self.check_state("after reopen");
    }

    /// The model's facts before an operation a power cut may land in.
    fn facts(&self) -> Vec<GroupFacts> {
        self.g
            .iter()
            .map(|g| {
                (
                    g.epoch,
                    g.base,
                    g.dlq_mark,
                    g.maybe_acked.clone(),
                    g.durable_acked.clone(),
                    g.nacks.clone(),
                    g.dead_lettered.clone(),
                )
            })
            .collect()
    }

    /// After a cut inside an operation: what the model knew before it stays true, unless
    /// the engine shows that the operation (a reset) became durable.
    fn restore_facts(&mut self, pre: Vec<GroupFacts>) {
        for (i, (epoch, base, mark, maybe, durable, nacks, dl)) in pre.into_iter().enumerate() {
            let engine_epoch = self.g[i].r.as_ref().expect("ref").group.lock().epoch;
            let gm = &mut self.g[i];
            if engine_epoch == epoch && gm.epoch != epoch {
                // The reset crossing the cut did not become durable.
                gm.epoch = epoch;
                gm.base = base;
                gm.dlq_mark = mark;
                gm.maybe_acked = maybe;
            } else {
                gm.maybe_acked.extend(maybe);
            }
            if gm.epoch == epoch {
                gm.durable_acked = durable;
                gm.nacks = nacks;
                gm.dead_lettered = dl;
            }
        }
    }

    /// A power cut took the log back to `next`: the model forgets what was past it.
    fn forget_lost_records(&mut self, next: u64) {
        self.log.truncate(next as usize);
        for gm in &mut self.g {
            gm.base = gm.base.min(next);
            gm.maybe_acked.retain(|&o| o < next);
            gm.durable_acked.retain(|&o| o < next);
            gm.nacks.retain(|&o, _| o < next);
        }
    }
}

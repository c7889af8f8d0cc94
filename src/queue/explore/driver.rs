//! The explorer's driver (test only): random operations on the engine, with the model
//! kept in step, stops of every kind, and power cuts armed to land inside a later
//! operation.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{GModel, GROUPS, MAX_ATTEMPTS, STATS, World, stat};
use crate::error::Error;
use crate::format::Headers;
use crate::io::Fs;
use crate::io::sim::SimFs;
use crate::options::{Options, SyncPolicy};
use crate::queue::test_support::wait_ticket;
use crate::queue::{Engine, OffsetReset, Ticket};

fn opts(sync: SyncPolicy, retention: u64) -> Options {
    let mut o = Options::new("/data");
    o.sync = sync;
    o.segment_bytes = 1024;
    o.retention_bytes = retention;
    o.max_delivery_attempts = MAX_ATTEMPTS;
    o
}

impl World {
    fn rand(&mut self, n: u64) -> u64 {
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }

    fn open(&mut self, fs: SimFs) {
        self.now += 10;
        let e = match Engine::open(
            Fs::new(Arc::new(fs.clone())),
            opts(self.sync, self.retention),
            self.now,
        ) {
            Ok(e) => e,
            Err(err) => self.fail(format!("reopen failed: {err}")),
        };
        self.fs = fs;
        for (i, name) in GROUPS.iter().enumerate() {
            let mif = 1 + self.rand(3) as usize;
            let r = e
                .register_consumer("t", name, mif, self.now)
                .expect("register");
            let gm = &mut self.g[i];
            gm.r = Some(r);
            gm.acked_since_open.clear();
            gm.held.clear();
            gm.auto_prev = None;
            gm.lent = None;
        }
        self.e = Some(e);
    }

    fn publish(&mut self) {
        let n = 1 + self.rand(4);
        let mut msgs = Vec::new();
        for _ in 0..n {
            self.pid_seq += 1;
            let pid = format!("p{}", self.pid_seq);
            let mut h = Headers::new();
            h.insert("pid".into(), pid.clone());
            msgs.push((bytes::Bytes::from(pid.clone().into_bytes()), h));
        }
        self.now += 1;
        let p = self.e().publish("t", &msgs, self.now).expect("publish");
        if self.sync == SyncPolicy::Always {
            // What the sync thread does: the held records written, then synced.
            if let Some(t) = &p.held {
                t.write_held();
            }
            p.segment
                .as_ref()
                .expect("Always publishes name their segment")
                .sync()
                .expect("sync");
        }
        let offs = p.offsets.into_vec();
        for (o, (_, h)) in offs.iter().zip(&msgs) {
            if *o as usize != self.log.len() {
                self.fail(format!(
                    "publish got offset {o}, expected {}",
                    self.log.len()
                ));
            }
            self.log.push(h["pid"].clone());
        }
        self.trace.push(format!("publish {offs:?}"));
    }

    fn manual_out(&mut self, i: usize) {
        let r = self.ref_(i);
        match self.e().next_delivery(&r, None, false) {
            Ok(Some(h)) => {
                self.check_handout(i, &h.record, h.attempt, false);
                let t = h.ticket();
                self.trace.push(format!(
                    "{} manual out {} attempt {}",
                    GROUPS[i], t.offset, h.attempt
                ));
                self.g[i].held.push((t, h.attempt));
            }
            Ok(None) => self.trace.push(format!("{} manual out: none", GROUPS[i])),
            Err(err) => self.fail(format!("manual hand-out: {err}")),
        }
    }

    fn auto_next(&mut self, i: usize) {
        let epoch = self.g[i].epoch;
        if let Some((l, le, tok)) = self.g[i].lent.as_mut() {
            let (le, tok) = (*le, *tok);
            if let Some(off) = l.records.front().map(|r| r.offset)
                && l.next
                    .compare_exchange(off, off + 1, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                let rec = l.records.pop_front().expect("rec");
                if let Some(p) = self.g[i].auto_prev.take()
                    && p.epoch == epoch
                {
                    self.g[i].maybe_acked.insert(p.offset);
                    self.g[i].acked_since_open.insert(p.offset);
                }
                self.check_handout(i, &rec, 1, true);
                self.g[i].auto_prev = Some(Ticket {
                    offset: off,
                    epoch: le,
                    token: tok,
                });
                self.trace
                    .push(format!("{} auto out {off} (lent)", GROUPS[i]));
                stat(1);
                return;
            }
            self.g[i].lent = None;
        }
        let prev = self.g[i].auto_prev.take();
        if let Some(p) = prev
            && p.epoch == epoch
        {
            self.g[i].maybe_acked.insert(p.offset);
            self.g[i].acked_since_open.insert(p.offset);
        }
        let r = self.ref_(i);
        match self.e().next_delivery(&r, prev, true) {
            Ok(Some(h)) => {
                self.check_handout(i, &h.record, h.attempt, false);
                let t = h.ticket();
                self.trace.push(format!(
                    "{} auto out {} attempt {} (acking {:?}) lent {}",
                    GROUPS[i],
                    t.offset,
                    h.attempt,
                    prev.map(|p| p.offset),
                    h.lent.as_ref().map_or(0, |l| l.records.len())
                ));
                self.g[i].auto_prev = Some(t);
                if let Some(l) = h.lent {
                    self.g[i].lent = Some((l, h.epoch, h.token));
                }
            }
            Ok(None) => self.trace.push(format!(
                "{} auto out: none (acking {:?})",
                GROUPS[i],
                prev.map(|p| p.offset)
            )),
            Err(err) => self.fail(format!("auto hand-out: {err}")),
        }
    }

    /// A delivery to finish: a held manual one or the auto consumer's current one.
    fn pick(&mut self, i: usize) -> Option<Ticket> {
        let n = self.g[i].held.len() as u64 + u64::from(self.g[i].auto_prev.is_some());
        if n == 0 {
            return None;
        }
        let k = self.rand(n) as usize;
        if k < self.g[i].held.len() {
            Some(self.g[i].held.remove(k).0)
        } else {
            // An explicit ack/nack of the auto delivery; the consumer's later auto-ack of
            // it is then stale (ignored).
            self.g[i].auto_prev.take()
        }
    }

    fn ack(&mut self, i: usize) {
        let Some(t) = self.pick(i) else { return };
        let wait = self.rand(4) != 0;
        let r = self.ref_(i);
        match self.e().ack_delivery(&r, t, true) {
            Ok(ticket) => {
                let mut durable = false;
                if wait && let Some(ticket) = ticket {
                    wait_ticket(self.e(), ticket).expect("ack committed");
                    durable = true;
                }
                if t.epoch == self.g[i].epoch {
                    self.g[i].maybe_acked.insert(t.offset);
                    self.g[i].acked_since_open.insert(t.offset);
                    if durable {
                        self.g[i].durable_acked.insert(t.offset);
                    }
                }
                self.trace
                    .push(format!("{} ack {} durable {durable}", GROUPS[i], t.offset));
            }
            Err(Error::StaleDelivery { .. }) => {
                self.trace
                    .push(format!("{} ack {} stale", GROUPS[i], t.offset));
            }
            Err(err) => self.fail(format!("ack: {err}")),
        }
    }

    fn nack(&mut self, i: usize) {
        let Some(t) = self.pick(i) else { return };
        let r = self.ref_(i);
        self.now += 1;
        match self.e().nack_delivery(&r, t, "bad", None, self.now) {
            Ok(out) => self.after_nack(i, t.offset, &out, "nack"),
            Err(Error::StaleDelivery { .. }) => {
                self.trace
                    .push(format!("{} nack {} stale", GROUPS[i], t.offset));
            }
            Err(err) => self.fail(format!("nack: {err}")),
        }
    }

    fn release(&mut self, i: usize) {
        if self.g[i].held.is_empty() {
            return;
        }
        let k = self.rand(self.g[i].held.len() as u64) as usize;
        let (t, _) = self.g[i].held.remove(k);
        let r = self.ref_(i);
        self.e().release_delivery(&r, t);
        self.trace
            .push(format!("{} release {}", GROUPS[i], t.offset));
    }

    /// A delivery (held, or the auto one) dropped by a panicking handler: one attempt
    /// charged without waiting for its commit; at the limit the next hand-out
    /// dead-letters it (checked: no hand-out past the limit, no skip, one copy).
    fn panic_drop(&mut self, i: usize) {
        let Some(t) = self.pick(i) else { return };
        let r = self.ref_(i);
        self.e().charge_panicked(&r, t);
        self.trace
            .push(format!("{} panic drop {}", GROUPS[i], t.offset));
    }

    fn low_level(&mut self, i: usize) {
        let cursor = self.e().group_info("t", GROUPS[i]).expect("info").cursor;
        // Whatever delivery holds the cursor is stale from now on.
        self.g[i].held.retain(|(t, _)| t.offset != cursor);
        if self.g[i].auto_prev.is_some_and(|t| t.offset == cursor) {
            self.g[i].auto_prev = None;
        }
        self.now += 1;
        if self.rand(2) == 0 {
            match self.e().ack_cursor("t", GROUPS[i], cursor) {
                Ok(()) => {
                    self.g[i].maybe_acked.insert(cursor);
                    self.g[i].durable_acked.insert(cursor);
                    self.trace
                        .push(format!("{} ack_cursor {cursor}", GROUPS[i]));
                }
                Err(Error::OffsetOutOfRange { .. }) => {}
                Err(err) => self.fail(format!("ack_cursor: {err}")),
            }
        } else {
            match self
                .e()
                .nack_cursor("t", GROUPS[i], cursor, "low", None, self.now)
            {
                Ok(out) => self.after_nack(i, cursor, &out, "nack_cursor"),
                Err(Error::OffsetOutOfRange { .. }) => {}
                Err(err) => self.fail(format!("nack_cursor: {err}")),
            }
        }
    }

    fn reset(&mut self, i: usize) {
        let next = self.log.len() as u64;
        let to = match self.rand(4) {
            0 => OffsetReset::Earliest,
            1 => OffsetReset::Latest,
            2 => OffsetReset::Explicit(self.rand(next + 2)),
            _ => OffsetReset::Time(
                std::time::UNIX_EPOCH + std::time::Duration::from_millis(self.now - self.rand(200)),
            ),
        };
        self.scan_dlq();
        match self.e().reset("t", GROUPS[i], to) {
            Ok(at) => {
                let dlq_next = self.dlq.last_key_value().map_or(0, |(k, _)| k + 1);
                let gm = &mut self.g[i];
                gm.epoch += 1;
                gm.base = at;
                gm.dlq_mark = dlq_next;
                gm.maybe_acked.clear();
                gm.acked_since_open.clear();
                gm.durable_acked.clear();
                gm.nacks.clear();
                gm.held.clear();
                self.trace
                    .push(format!("{} reset {to:?} -> {at}", GROUPS[i]));
            }
            Err(err) => self.fail(format!("reset: {err}")),
        }
    }

    /// One step, possibly with a power cut armed to land inside some later operation.
    fn step(&mut self) {
        if !self.armed && self.rand(12) == 0 {
            let at = self.fs.ops() + 1 + self.rand(60);
            self.fs.cut_at_op(at);
            self.armed = true;
            self.trace.push(format!("armed cut at op {at}"));
        }
        if !self.armed {
            return self.step_op(false);
        }
        let pre = self.facts();
        let pre_len = self.log.len();
        let pre_dlq = self.dlq.clone();
        self.step_op(true);
        if !self.fs.is_cut() {
            return;
        }
        self.armed = false;
        // Copies seen during the step that crossed the cut may be gone.
        self.dlq = pre_dlq;
        let img = self.fs.crash_image().expect("image");
        self.e = None;
        self.trace.push("(cut landed) power cut + reopen".into());
        stat(3);
        self.open(img);
        let next = self.e().topic("t").map_or(0, |t| t.reader.next()) as usize;
        if self.sync == SyncPolicy::Always && next < pre_len {
            self.fail(format!(
                "cut: log lost published records: next {next}, published before the step {pre_len}"
            ));
        }
        self.restore_facts(pre);
        if next < self.log.len() {
            self.forget_lost_records(next as u64);
        }
        self.after_reopen(None, true);
    }

    fn step_op(&mut self, armed: bool) {
        let mut op = self.rand(100);
        if armed && op >= 87 {
            op = self.rand(87);
        }
        let i = self.rand(GROUPS.len() as u64) as usize;
        self.now += 1;
        match op {
            0..=17 => self.publish(),
            18..=31 => self.manual_out(i),
            32..=47 => self.auto_next(i),
            48..=57 => self.ack(i),
            58..=69 => self.nack(i),
            70..=71 => self.release(i),
            72 => self.panic_drop(i),
            73..=76 => self.low_level(i),
            77..=79 => self.reset(i),
            80..=82 => {
                let wait = self.rand(2) == 0;
                self.e().apply_retention(self.now, wait).expect("retention");
                self.trace.push(format!("retention wait {wait}"));
            }
            83..=85 => {
                self.e().commit_groups(false).expect("commit_groups");
                self.trace.push("commit_groups".into());
            }
            86 => {
                self.e().sync_all().expect("sync_all");
                self.trace.push("sync_all".into());
            }
            87..=88 => {
                self.check_state("before close");
                self.e().close().expect("close");
                for gm in &mut self.g {
                    let acked = std::mem::take(&mut gm.acked_since_open);
                    gm.durable_acked.extend(acked);
                }
                self.e = None;
                self.trace.push("close + reopen".into());
                let fs = self.fs.clone();
                self.open(fs);
                self.after_reopen(None, false);
            }
            89..=94 => {
                self.check_state("before kill");
                let before = self.durable_before();
                let img = self.fs.process_crash_now();
                self.e = None;
                self.trace.push("kill + reopen".into());
                self.open(img);
                self.after_reopen(Some(before), false);
            }
            _ => {
                self.check_state("before power cut");
                let before = self.durable_before();
                let img = self.fs.crash_now();
                self.e = None;
                self.trace.push("power cut + reopen".into());
                self.open(img);
                self.after_reopen(Some(before), true);
            }
        }
    }
}

fn run_seed(seed: u64, steps: u64) {
    let sync = match seed % 3 {
        0 => SyncPolicy::Always,
        1 => SyncPolicy::None,
        _ => SyncPolicy::Interval(std::time::Duration::from_millis(100)),
    };
    let fs = SimFs::new(seed);
    let mut w = World {
        seed,
        sync,
        fs: fs.clone(),
        e: None,
        now: 1_000_000,
        log: Vec::new(),
        dlq: BTreeMap::new(),
        g: (0..GROUPS.len()).map(|_| GModel::default()).collect(),
        trace: Vec::new(),
        rng: seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1,
        pid_seq: 0,
        armed: false,
        retention: if seed.is_multiple_of(2) { 3000 } else { 0 },
    };
    w.open(fs);
    for s in 0..steps {
        w.step();
        if s % 20 == 19 {
            w.check_state("periodic");
        }
    }
    w.check_state("end");
    let (dl, sk): (u64, u64) =
        w.g.iter()
            .map(|g| {
                let g = g.r.as_ref().expect("r").group.lock();
                (g.dead_lettered, g.skipped)
            })
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    STATS[4].fetch_add(dl, Ordering::Relaxed);
    STATS[5].fetch_add(sk, Ordering::Relaxed);
}

#[test]
fn explore_groups_across_kills_and_power_cuts() {
    let seeds: u64 = std::env::var("SPOOL_GROUP_EXPLORE_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let first: u64 = std::env::var("SPOOL_GROUP_EXPLORE_FIRST")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    for seed in first..first + seeds {
        run_seed(seed, 400);
    }
    let s: Vec<u64> = STATS.iter().map(|c| c.load(Ordering::Relaxed)).collect();
    eprintln!(
        "nacks dead-lettering {}, lent hand-outs {}, in-flight-at-stop checks {}, cuts landed {}, dead_lettered (engine, final) {}, skipped {}",
        s[0], s[1], s[2], s[3], s[4], s[5]
    );
}

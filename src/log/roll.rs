//! Rolling to a new segment: trimming and sealing the old one (inline or in the
//! background), then starting the next from a spare, a recycled file or a new file.
//!
//! **Invariant:** a new segment is created only once every sealing older than the last
//! `MAX_SEALING - 1` has finished.

use super::eviction::close_files;
use super::sealing::seal;
use super::*;

impl TopicLog {
    /// Starts making the spare file for the next roll (`seal_in_background`): at a roll
    /// (it has a whole segment's time to get ready, measured better than starting later),
    /// and in a process's first segment once it is half full (topics that never roll
    /// never make one).
    pub(super) fn start_spare(&mut self) {
        if !self.cfg.seal_in_background || self.spare.is_some() {
            return;
        }
        let (fs, dir) = (self.fs.clone(), self.dir.clone());
        self.spare = std::thread::Builder::new()
            .name("spool-spare".into())
            .spawn(move || segment::make_spare(&fs, &dir))
            .ok();
    }

    /// Whether the spare file is ready now (never waits for it); it is used if so.
    fn take_spare(&mut self) -> bool {
        if !self.spare.as_ref().is_some_and(|h| h.is_finished()) {
            return false;
        }
        match self.spare.take().map(|h| h.join()) {
            Some(Ok(Ok(()))) => true,
            Some(Ok(Err(e))) => {
                tracing::warn!(error = %e, "could not make a spare segment file; the roll creates one");
                false
            }
            _ => false,
        }
    }
}

impl TopicLog {
    /// Seals the active segment (trimmed to its records, synced, index footer written;
    /// with `seal_in_background` the sync and index on a thread) and starts a new one.
    pub(super) fn roll(&mut self, now_ms: u64) -> Result<()> {
        self.wait_for_old_sealings()?;
        // The writer's end: records written and not yet synced are part of the segment.
        self.active.set_len(self.active.written().bytes)?;
        let background = self.cfg.seal_in_background;
        if !background {
            seal(
                &self.fs,
                &self.active,
                self.cfg.index_interval_bytes,
                &self.summaries,
            )?;
        }
        debug_assert!(
            background || self.active.written() == self.active.summary(),
            "sealed, so synced"
        );
        // Before the new segment takes a descriptor (a writer nobody reads behind leaves a
        // sealed file open at every roll).
        close_files(&read_lock(&self.reader.segments));
        let next = self.next_segment(now_ms)?;
        let from_spare = next.from_spare;
        let old = self.switch_to(next)?;
        if background {
            // A segment made from a spare has its header and name synced by the sealing
            // (first, so that recovery rarely meets a header that still says "spare").
            let fresh = from_spare.then(|| (self.active.clone(), self.dir.clone()));
            self.seal_in_background(old, fresh)?;
            self.start_spare();
        }
        Ok(())
    }

    /// Recovery checks only the `MAX_SEALING` segments before the active one, so none
    /// older may still be unsynced when the next is created: every sealing older than the
    /// last `MAX_SEALING - 1` before the active one is waited for. By position, not count:
    /// sealings finish out of order, and a reopened process may have one pending for an
    /// older segment than the sealed ones after it (a killed process's leftover).
    fn wait_for_old_sealings(&mut self) -> Result<()> {
        let keep_from = {
            let segs = read_lock(&self.reader.segments);
            segs[segs.len().saturating_sub(MAX_SEALING)].base
        };
        while let Some(&(oldest, _)) = self.sealing.front()
            && oldest < keep_from
        {
            self.finish_oldest_sealing()?;
        }
        // With the active one's about to be added: `MAX_SEALING` at most.
        debug_assert!(self.sealing.len() < MAX_SEALING);
        Ok(())
    }

    /// The segment that follows the active one: a kept file reused, the spare renamed, or
    /// a new file. A failure poisons the topic.
    fn next_segment(&mut self, now_ms: u64) -> Result<NextSegment> {
        let base = self.active.written().next;
        let background = self.cfg.seal_in_background;
        let from_spare = background && self.take_spare();
        // Only where nothing is zeroed ahead (`preallocate`, never with `background`).
        if !background
            && let Some(path) = self.recycled.pop()
            && let Some((seg, len)) = self.reuse_recycled(&path, base, now_ms)
        {
            return Ok(NextSegment {
                seg,
                allocated: len,
                stale_until: len,
                from_spare,
            });
        }
        let created = match from_spare {
            true => Segment::from_spare(
                &self.fs,
                &self.dir,
                base,
                now_ms,
                self.cfg.max_body,
                self.poison.clone(),
            ),
            false => Segment::create(
                &self.fs,
                &self.dir,
                base,
                now_ms,
                self.cfg.max_body,
                self.poison.clone(),
                if background { FLAG_FOLLOWS_UNSYNCED } else { 0 },
            ),
        };
        match created {
            Ok(seg) => Ok(NextSegment {
                seg,
                allocated: SEGMENT_HEADER_LEN as u64,
                stale_until: 0,
                from_spare,
            }),
            Err(e) => {
                let _ = self.poison.set(format!("could not start a segment: {e}"));
                Err(e)
            }
        }
    }

    /// The kept file at `path` renamed into the segment at `base`, with its length; `None`
    /// (and the file removed) if it cannot be reused.
    fn reuse_recycled(&self, path: &Path, base: u64, now_ms: u64) -> Option<(Segment, u64)> {
        let reused = Segment::from_recycled(
            &self.fs,
            &self.dir,
            path,
            base,
            now_ms,
            self.cfg.max_body,
            self.poison.clone(),
        );
        match reused {
            Ok(seg_len) => Some(seg_len),
            Err(e) => {
                // Nothing was renamed yet (or `create` finds the name taken).
                tracing::warn!(error = %e, file = %path.display(), "could not reuse a recycled segment file; creating one");
                let _ = self.fs.remove_file(path);
                None
            }
        }
    }

    /// Makes `next` the active segment and returns the old one. A failure to open its
    /// index poisons the topic.
    fn switch_to(&mut self, next: NextSegment) -> Result<Arc<Segment>> {
        let seg = next.seg.shared();
        // The new segment's file exists: records appended to the sealed one instead would
        // overlap its base.
        if let Err(e) = seg.open_index() {
            let _ = self
                .poison
                .set(format!("could not start a segment's index: {e}"));
            return Err(e);
        }
        self.last_entry = None;
        self.index_count = 0;
        self.allocated = next.allocated;
        self.stale_until = next.stale_until;
        // The old records start right after the new header.
        self.zeroed_to = SEGMENT_HEADER_LEN as u64;
        if let Some(v) = &self.visibility {
            seg.defer_visibility(v.clone());
        }
        write_lock(&self.reader.segments).push(seg.clone());
        Ok(std::mem::replace(&mut self.active, seg))
    }
}

/// The segment a roll starts, before it is the active one.
struct NextSegment {
    seg: Segment,
    /// Its file's length (zeros ahead, or a kept file's old bytes).
    allocated: u64,
    /// Where a kept file's old records end (`TopicLog::stale_until`; 0 for a new file).
    stale_until: u64,
    /// Renamed from the spare: its sealing makes its name durable.
    from_spare: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::test_support::*;

    /// A roll whose new segment's index file cannot be opened stops the topic: the
    /// segment file exists already, and records appended to the sealed one instead would
    /// overlap its base (open: "gap in the log"). Found by review.
    #[test]
    fn a_roll_that_cannot_open_the_new_index_poisons_the_topic() {
        use crate::io::sim::SimFs;
        let sim = SimFs::new(3);
        let fs = Fs::new(Arc::new(sim.clone()));
        let dir = Path::new("/t");
        let mut cfg = sim_cfg();
        cfg.seal_in_background = false;
        let mut log = TopicLog::open(&fs, dir, cfg, 0).expect("open");
        let failed = loop {
            // Fails only if this append rolls (its record starts the next segment).
            sim.fail_writes_to(Some(&dir.join(segment::index_file_name(log.next()))));
            let before = log.next();
            if let Err(e) = log.append(
                &[Append {
                    payload: &[7u8; 200],
                    headers: &Headers::new(),
                    headers_len: record::headers_len(&Headers::new()),
                }],
                0,
            ) {
                break (before, e);
            }
        };
        sim.fail_writes_to(None);
        assert!(matches!(failed.1, Error::Io { .. }), "{:?}", failed.1);
        let more = log.append(
            &[Append {
                payload: &[7u8; 10],
                headers: &Headers::new(),
                headers_len: record::headers_len(&Headers::new()),
            }],
            0,
        );
        assert!(matches!(more, Err(Error::Poisoned { .. })), "{more:?}");
        let killed = sim.process_crash_now();
        drop(log);
        let log = TopicLog::open(&Fs::new(Arc::new(killed)), dir, cfg, 0).expect("reopen");
        assert_eq!(log.next(), failed.0);
        assert_dense(&log, 0);
    }

    /// Sealing threads finish out of order: a killed process can leave segment B unsynced
    /// behind a sealed C. The reopened process then has one sealing (B's) pending, and
    /// rolling D and E must still wait for it: open after a power cut checks only the
    /// `MAX_SEALING` segments before the active one, so E beside an unsynced B is a gap
    /// it cannot repair (found as a rare `power_loss_none` failure: "gap in the log").
    #[test]
    fn a_roll_waits_for_an_older_sealing_a_killed_process_left_behind() {
        let (cfg, dir) = (sim_cfg(), Path::new("/t"));
        // B's sealing is slow: its sync of B is still in flight when the process is
        // killed, after C was sealed. (Held, not failed: a failure would poison the log
        // before the roll to D, depending on the threads' timing.)
        let (fs, mut log) = rolled_twice_with_syncs_held(3);
        let b = log.reader().snapshot()[1].path.clone();
        fs.hold_syncs_of(Some(&b));
        fs.hold_syncs(false);
        assert!(append_until_segments(&mut log, 4));
        let c = log.reader().snapshot()[2].clone();
        wait_for("C sealed", || c.is_sealed());
        let image = fs.process_crash_now();
        fs.hold_syncs_of(None);
        drop(log);

        // The same boot: B is found whole in the page cache and its sealing starts again,
        // slow again, then failing (nothing of B reaches the disk). The roll to E must
        // wait for it and get its error; rolling past it returns at once.
        image.hold_syncs_of(Some(&b));
        let mut log = TopicLog::open(&Fs::new(Arc::new(image.clone())), dir, cfg, 0)
            .expect("reopen in the same boot");
        let failing = image.clone();
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(100));
            failing.fail_writes_to(Some(&b));
            failing.hold_syncs_of(None);
        });
        let rolled_past = append_until_segments(&mut log, 5);
        releaser.join().expect("releaser");
        assert!(
            !rolled_past,
            "the roll to E waited for B's sealing and got its error"
        );
        every_power_cut_opens(&image, 20, dir);
        drop(log);
    }
}

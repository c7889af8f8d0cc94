//! Appending records to the active segment: encoding a batch, holding it for the sync
//! thread, writing it with zeros ahead (big payloads from where they lie, `pwritev`),
//! and the index entries that go with it.
//!
//! **Invariant:** records get dense offsets and timestamps that never go back; a record
//! over the body ceiling is refused before anything of its batch is written.

use super::*;

/// Background write-back granularity when appends are not synced one by one.
const WRITE_BACK_BYTES: u64 = 8 << 20;

/// The most bytes of records `append_held` keeps in memory: a bigger batch is written
/// by its publisher (its own write, as big as one cohort's).
pub(super) const HOLD_MAX_BYTES: usize = 256 << 10;

/// Payloads from this size up are not copied into the batch's buffer: the kernel copies
/// them into the page cache from where they lie (`pwritev`), once. Below it, copying
/// is cheaper than an iovec of their own: batches of 1,000 in the page cache, copied /
/// spliced, did 6.7 / 5.7 M msg/s at 256 B, 2.7 / 2.4 M at 1 KiB, 0.58-0.70 / 0.77-0.85 M
/// at 4 KiB, 19 k / 60-68 k at 64 KiB (docs/performance.md, "Big payloads").
pub(super) const SPLICE_MIN_BYTES: usize = 4096;

/// The most zeros written ahead of the records at a time.
pub(super) const PREALLOCATE_BYTES: u64 = 1 << 20;
/// The first zeros a topic's log writes ahead after it opens: 64 KiB. Each extension
/// doubles the next, up to [`PREALLOCATE_BYTES`], so the zeros ahead are at most about
/// what the topic has written since it opened (issue 31: 5,000 quiet topics under
/// `Sync=Always` held 5 GiB of zeros for 27 MB of records), while a busy topic reaches
/// the full run after 1 MiB of writes and pays the metadata commit once per MiB again.
pub(super) const PREALLOCATE_MIN_BYTES: u64 = 64 << 10;
/// Zeros past each write into a reused file (`stale_until`): a frame's length field and
/// crc, so that a scan stops there ("frame shorter than a record body").
const TERMINATOR_BYTES: u64 = record::FRAME_HEADER_LEN as u64;
/// What `write_zeros` writes, a chunk at a time (static: no allocation per chunk).
static ZEROS: [u8; PREALLOCATE_BYTES as usize] = [0; PREALLOCATE_BYTES as usize];
/// The page cache's unit: the zeros ahead of records into a reused file go to its end.
const PAGE_BYTES: u64 = 4096;

impl TopicLog {
    /// Appends `msgs` (already validated) with timestamps `max(now, previous)`. Returns
    /// the first offset; the rest follow densely. One `write` per segment touched.
    pub fn append(&mut self, msgs: &[Append<'_>], now_ms: u64) -> Result<u64> {
        self.append_inner(msgs, now_ms, false)
    }

    /// `append`, but the records stay in memory (`write_held`) unless they reach
    /// `HOLD_MAX_BYTES` or a roll: when every append is synced, the sync thread writes a
    /// cohort's records in one write just before its sync, so no write lands in the file
    /// while a sync runs (each cost the sync time, see benches/FINDINGS.md).
    pub fn append_held(&mut self, msgs: &[Append<'_>], now_ms: u64) -> Result<u64> {
        self.append_inner(msgs, now_ms, true)
    }

    /// Writes the records `append_held` left in memory (readers see them now, or under
    /// `visible_when_synced` after the sync that covers them). After a failure (which
    /// poisons the log) they are dropped.
    pub fn write_held(&mut self) -> Result<()> {
        let Some(mut p) = self.held.take() else {
            return Ok(());
        };
        let written = match self.check_poison() {
            Ok(()) => self.flush(&mut p, &[]),
            Err(e) => {
                self.buf.clear();
                self.index_buf.clear();
                Err(e)
            }
        };
        p.entries.clear();
        self.entries = p.entries;
        written
    }

    fn append_inner(&mut self, msgs: &[Append<'_>], now_ms: u64, hold: bool) -> Result<u64> {
        self.check_poison()?;
        let bytes = self.check_sizes(msgs)?;
        // Held only beside a sync of this segment that may be running (records of it not
        // durable yet), or with records held already: the first publish to a quiet topic
        // writes at once, from its own thread. With many topics, each has about one
        // record per round, and the sync thread writing them all one by one was the
        // bottleneck (issue 31 point 2).
        let hold = hold && (self.held.is_some() || self.active.pending_bytes() > 0);
        let mut pending = match self.held.take() {
            Some(p) => p,
            None => Pending::start(
                &self.active,
                std::mem::take(&mut self.entries),
                self.newest_ts,
            ),
        };
        // Records that will be held wait in `buf` for a later write, so their payloads are
        // copied there. Otherwise a big payload stays where it is: `buf` gets its frame's
        // head, and `splices` where in `buf` the payload goes.
        let splice = !hold || self.buf.len() + bytes >= HOLD_MAX_BYTES;
        let mut splices: Vec<(usize, &[u8])> = Vec::new();
        let first = pending.next;
        for m in msgs {
            let hlen = m.headers_len;
            debug_assert_eq!(hlen, record::headers_len(m.headers));
            let frame = (record::RECORD_OVERHEAD + hlen + m.payload.len()) as u64;
            if pending.next > self.active.base && pending.end + frame > self.cfg.segment_bytes {
                self.flush(&mut pending, &splices)?;
                splices.clear();
                self.roll(now_ms)?;
                let entries = std::mem::take(&mut pending.entries);
                pending = Pending::start(&self.active, entries, self.newest_ts);
            }
            let ts = now_ms.max(pending.last_ts);
            let position = pending.end;
            if wants_entry(self.last_entry, position, self.cfg.index_interval_bytes) {
                let e = IndexEntry {
                    offset: pending.next,
                    position,
                    timestamp_ms: ts,
                    ids_before: pending.ids,
                };
                encode_entry(&e, &mut self.index_buf);
                pending.entries.push(e);
                self.last_entry = Some(position);
            }
            let n = if splice && m.payload.len() >= SPLICE_MIN_BYTES {
                let head =
                    record::encode_head(&mut self.buf, pending.next, ts, m.headers, m.payload);
                splices.push((self.buf.len(), m.payload));
                head + m.payload.len()
            } else {
                record::encode(&mut self.buf, pending.next, ts, m.headers, m.payload)
            };
            debug_assert_eq!(n as u64, frame);
            if pending.next == self.active.base {
                pending.first_ts = ts;
            }
            pending.end += frame;
            pending.next += 1;
            pending.last_ts = ts;
            if m.headers.contains_key(MESSAGE_ID_HEADER) {
                pending.ids += 1;
            }
        }
        if hold && splices.is_empty() && self.buf.len() < HOLD_MAX_BYTES {
            self.held = Some(pending);
        } else {
            self.flush(&mut pending, &splices)?;
            self.entries = pending.entries;
        }
        Ok(first)
    }

    /// The bytes of `msgs`' frames. A record over the ceiling would be written but never
    /// read back (every read and recovery takes it for damage): the batch is refused
    /// before any of it is written.
    fn check_sizes(&self, msgs: &[Append<'_>]) -> Result<usize> {
        let mut bytes = 0;
        for m in msgs {
            let body = record::BODY_FIXED_LEN + m.headers_len + m.payload.len();
            if body > self.cfg.max_body {
                return Err(Error::MessageTooLarge {
                    size: body,
                    max: self.cfg.max_body,
                });
            }
            bytes += record::FRAME_HEADER_LEN + body;
        }
        Ok(bytes)
    }

    /// Writes the buffered records, with the payloads `splices` puts in their place (see
    /// `parts`), and their index entries; readers see them now, or under
    /// `visible_when_synced` after the sync that covers them.
    pub(super) fn flush(&mut self, p: &mut Pending, splices: &[(usize, &[u8])]) -> Result<()> {
        // A spliced payload follows its frame's head in `buf`.
        if self.buf.is_empty() {
            return Ok(());
        }
        let at = self.active.written().bytes;
        if let Err(e) = self.write_buf(at, splices) {
            let _ = self.poison.set(format!("write failed: {e}"));
            self.buf.clear();
            self.index_buf.clear();
            return Err(e);
        }
        self.buf.clear();
        self.write_index_entries(p.entries.len());
        let written = SegmentSummary {
            base: self.active.base,
            next: p.next,
            bytes: p.end,
            first_ts: p.first_ts,
            last_ts: p.last_ts,
            id_count: p.ids,
        };
        if self.active.written_to(written, &p.entries) {
            self.reader.bounds[1].store(p.next, Ordering::Release);
        }
        // Here, where every record is written: a batch whose roll failed after its first
        // part was written still sets the floor of what comes next.
        debug_assert!(p.last_ts >= self.newest_ts);
        self.newest_ts = p.last_ts;
        p.entries.clear();
        if p.end >= self.cfg.segment_bytes / 2 {
            self.start_spare();
        }
        self.write_back_if_due(at, p.end);
        Ok(())
    }

    /// Writes `buf` (with `splices`) at `at` in the active segment, with zeros ahead where
    /// they are due. One write, vectored when payloads are spliced: a kill inside it
    /// leaves a prefix of the records, as a kill inside one `pwrite` does.
    fn write_buf(&mut self, at: u64, splices: &[(usize, &[u8])]) -> Result<()> {
        let spliced: usize = splices.iter().map(|(_, p)| p.len()).sum();
        let need = at + (self.buf.len() + spliced) as u64;
        if self.cfg.preallocate && need > self.allocated {
            self.preallocate(need)?;
        }
        // Old bytes below `stale_until`: zeros first, over the records' range and a frame
        // header past it, then the records. A kill can cut a write short at any page (the
        // kernel stops copying at a fatal signal), so only zeros may follow the whole
        // records that such a write leaves (a power cut tearing the unsynced writes is
        // a known limit: docs/durability.md, "Known limits"). To the end of a page: that page is written back with the
        // records anyway, and the next records into it need no zeros of their own.
        debug_assert!(at >= self.stale_until || self.zeroed_to >= at);
        let want = (need + TERMINATOR_BYTES).min(self.stale_until);
        if want > self.zeroed_to {
            let to = want.next_multiple_of(PAGE_BYTES).min(self.stale_until);
            let from = std::mem::replace(&mut self.zeroed_to, to);
            write_zeros(&self.active, from, to)?;
        }
        if splices.is_empty() {
            self.active.write_at(&self.buf, at)
        } else {
            self.active
                .write_vectored_at(&parts(&self.buf, splices), at)
        }
    }

    /// Writes the batch's `count` encoded index entries. The index is a cache: if this
    /// write is lost, open rebuilds the tail.
    fn write_index_entries(&mut self, count: usize) {
        if self.index_buf.is_empty() {
            return;
        }
        let at = self.index_count * INDEX_ENTRY_LEN as u64;
        self.index_count += count as u64;
        let r = self.active.write_index(&self.index_buf, at);
        self.index_buf.clear();
        if let Err(e) = r {
            tracing::warn!(error = %e, "index write failed; it will be rebuilt on open");
        }
    }

    /// Under Sync=Interval (no sync per append, a sync in the roll), writes back in the
    /// background every few MiB, so that the sync at the roll finds little left and does
    /// not stall the writer for a whole segment's worth of dirty pages. Under Sync=None the
    /// roll does not sync (`seal_in_background`), and these syncs only competed with the
    /// writer (measured: 6.0-6.7 M msg/s with them, 7.2-7.5 M without).
    fn write_back_if_due(&self, from: u64, to: u64) {
        if self.cfg.preallocate
            || self.cfg.seal_in_background
            || to / WRITE_BACK_BYTES <= from / WRITE_BACK_BYTES
        {
            return;
        }
        let seg = self.active.clone();
        let spawned = std::thread::Builder::new()
            .name("spool-writeback".into())
            .spawn(move || {
                if let Err(e) = seg.sync() {
                    tracing::error!(error = %e, "background write-back failed");
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "could not start a write-back thread; the roll will sync");
        }
    }

    /// Extends the active segment with zeros past `need` (up to the segment size). An
    /// in-place overwrite with `fdatasync` skips the metadata journal commit that an
    /// append with `fdatasync` pays (measured on ext4: see benches/FINDINGS.md).
    /// Recovery treats a zero tail as free space, not damage.
    pub(super) fn preallocate(&mut self, need: u64) -> Result<()> {
        let step = self.preallocate_step;
        let target = need
            .max((need + step).min(self.cfg.segment_bytes))
            .max(self.allocated);
        write_zeros(&self.active, self.allocated, target)?;
        self.allocated = target;
        self.preallocate_step = (step * 2).min(PREALLOCATE_BYTES);
        Ok(())
    }
}

/// The active segment's state while a batch is being encoded.
#[derive(Debug)]
pub(super) struct Pending {
    pub(super) end: u64,
    pub(super) next: u64,
    first_ts: u64,
    last_ts: u64,
    ids: u64,
    entries: Vec<IndexEntry>,
}

impl Pending {
    /// `entries`: an empty list to fill (its capacity is reused). `newest_ts`: the log's
    /// newest timestamp (`TopicLog::newest_ts`), the floor of the records' stamps; it is
    /// not the segment's `last_ts` until a record of it is written.
    #[inline]
    pub(super) fn start(seg: &Segment, entries: Vec<IndexEntry>, newest_ts: u64) -> Pending {
        debug_assert!(entries.is_empty());
        let s = seg.written();
        Pending {
            end: s.bytes,
            next: s.next,
            first_ts: s.first_ts,
            last_ts: s.last_ts.max(newest_ts),
            ids: s.id_count,
            entries,
        }
    }
}

/// `buf` with each spliced payload in its place (`(where in buf, payload)`, in order):
/// the pieces of one contiguous write.
fn parts<'b>(buf: &'b [u8], splices: &[(usize, &'b [u8])]) -> Vec<&'b [u8]> {
    let mut out = Vec::with_capacity(2 * splices.len() + 1);
    let mut from = 0;
    for &(at, payload) in splices {
        out.push(&buf[from..at]);
        out.push(payload);
        from = at;
    }
    out.push(&buf[from..]);
    out
}

/// Writes zeros over `[from, to)` of `seg`'s file (not synced).
fn write_zeros(seg: &Segment, from: u64, to: u64) -> Result<()> {
    let mut at = from;
    while at < to {
        let n = (to - at).min(ZEROS.len() as u64) as usize;
        seg.write_at(&ZEROS[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::test_support::*;

    /// The zeros ahead of a quiet topic are small; a busy one soon gets the full run
    /// (issue 31: 5,000 quiet topics under `Sync=Always` held 1 MiB of zeros each).
    #[test]
    fn zeros_ahead_grow_with_what_the_topic_writes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = LogConfig {
            segment_bytes: 64 << 20,
            ..always_cfg()
        };
        let mut log = TopicLog::open(&Fs::real(), dir.path(), cfg, 0).expect("open");
        append_one(&mut log, b"one small record");
        let ahead = |log: &TopicLog| log.allocated - log.active().written().bytes;
        assert!(
            ahead(&log) <= PREALLOCATE_MIN_BYTES,
            "a quiet topic: {}",
            ahead(&log)
        );
        let file = std::fs::metadata(&log.active().path).expect("meta").len();
        assert!(file <= 2 * PREALLOCATE_MIN_BYTES, "its file: {file} bytes");
        // About 2 MiB of records later, the run is the full one.
        for _ in 0..64 {
            append_one(&mut log, &[5u8; 32 << 10]);
        }
        assert_eq!(log.preallocate_step, PREALLOCATE_BYTES);
        assert!(ahead(&log) <= PREALLOCATE_BYTES);
    }

    /// Payloads from `SPLICE_MIN_BYTES` up are written from where they lie (`pwritev`),
    /// smaller ones and held ones copied: batches mixing them, crossing rolls, read back
    /// whole and in order after a reopen, under `Always`'s layout and `None`'s.
    #[test]
    fn spliced_copied_and_held_payloads_read_back_whole_across_rolls() {
        let none_cfg = LogConfig {
            preallocate: false,
            visible_when_synced: false,
            seal_in_background: true,
            ..always_cfg()
        };
        for cfg in [always_cfg(), none_cfg] {
            let dir = tempfile::tempdir().expect("tempdir");
            let mut log = TopicLog::open(&Fs::real(), dir.path(), cfg, 0).expect("open");
            let mut headers = Headers::new();
            headers.insert("k".into(), "v".into());
            let sizes = [10, SPLICE_MIN_BYTES - 1, SPLICE_MIN_BYTES, 5000, 0, 20_000];
            let payloads: Vec<Vec<u8>> = (0..60)
                .map(|i| vec![i as u8; sizes[i % sizes.len()]])
                .collect();
            assert_eq!(log.append(&batch_of(&payloads, &headers), 0).expect("a"), 0);
            // Held: small enough to wait in memory, so copied (the caller's slices go).
            let held = vec![vec![99u8; 3000]];
            assert_eq!(
                log.append_held(&batch_of(&held, &headers), 0).expect("h"),
                60
            );
            assert!(log.holds());
            assert_eq!(
                log.append(&batch_of(&payloads, &headers), 0).expect("b"),
                61
            );
            assert!(
                log.reader().snapshot().len() > 3,
                "the batches crossed rolls"
            );
            log.sync().expect("sync");
            drop(log);
            let log = TopicLog::open(&Fs::real(), dir.path(), cfg, 0).expect("reopen");
            let read = log.reader().read(0, usize::MAX, usize::MAX).expect("read");
            let want: Vec<&Vec<u8>> = payloads.iter().chain(&held).chain(&payloads).collect();
            assert_eq!(read.len(), want.len());
            for ((r, w), offset) in read.iter().zip(want).zip(0..) {
                assert_eq!(r.offset, offset);
                assert_eq!(&r.payload[..], &w[..], "offset {offset}");
                assert_eq!(r.headers, headers);
            }
        }
    }

    /// `parts` puts each spliced payload where its frame's head ends.
    #[test]
    fn parts_interleave_the_buffer_and_the_payloads() {
        let buf = b"aaBBBcc";
        let got = parts(buf, &[(2, b"xy"), (5, b"z")]);
        assert_eq!(got, [&b"aa"[..], b"xy", b"BBB", b"z", b"cc"]);
        assert_eq!(got.concat(), b"aaxyBBBzcc");
        assert_eq!(parts(buf, &[(7, b"end")]).concat(), b"aaBBBccend");
    }

    /// The offset of the record an old payload forges in `ending_at_a_forged_frame`.
    const FORGED: u64 = 13;

    /// A record over `max_body` would be written and then taken for damage by every read
    /// and by recovery: the whole batch is refused before any of it is written.
    #[test]
    fn a_record_over_the_ceiling_is_refused_and_nothing_of_its_batch_is_written() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = always_cfg();
        let mut log = TopicLog::open(&Fs::real(), dir.path(), cfg, 0).expect("open");
        append_one(&mut log, b"before");
        let headers = Headers::new();
        let payloads = [vec![1u8; 10], vec![2u8; cfg.max_body]];
        let err = log
            .append(&batch_of(&payloads, &headers), 0)
            .expect_err("over the ceiling");
        assert!(matches!(err, Error::MessageTooLarge { .. }), "{err:?}");
        assert_eq!(log.next(), 1, "nothing of the batch appended");
        assert_eq!(append_one(&mut log, b"after"), 1);
        drop(log);
        let log = TopicLog::open(&Fs::real(), dir.path(), cfg, 0).expect("reopen");
        let read = log.reader().read(0, 10, usize::MAX).expect("read");
        let payloads: Vec<&[u8]> = read.iter().map(|r| &r.payload()[..]).collect();
        assert_eq!(payloads, [&b"before"[..], &b"after"[..]]);
    }

    /// Held records (`append_held`) have their offsets and count in `next`/`end`, but
    /// nothing reaches the file until `write_held` (or an append that is not held, or
    /// `sync`), nor a reader until a sync covers it (`visible_when_synced`); a batch of
    /// `HOLD_MAX_BYTES` or more is written at once.
    #[test]
    fn held_records_are_invisible_until_written_and_a_big_batch_is_not_held() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = LogConfig {
            segment_bytes: 4 * HOLD_MAX_BYTES as u64,
            ..always_cfg()
        };
        let mut log = TopicLog::open(&Fs::real(), dir.path(), cfg, 0).expect("open");
        let headers = Headers::new();
        let small = [b"a".to_vec(), b"b".to_vec()];
        assert_eq!(
            log.append_held(&batch_of(&small, &headers), 0)
                .expect("append held"),
            0
        );
        assert_eq!(
            log.append_held(&batch_of(&small[..1], &headers), 0)
                .expect("append held"),
            2
        );
        assert!(log.holds());
        assert_eq!(log.next(), 3, "held records have their offsets");
        assert!(
            log.end() > log.active().end(),
            "and their place in the segment"
        );
        assert_eq!(log.reader().next(), 0, "readers see none of them");
        assert_eq!(
            log.active().end(),
            SEGMENT_HEADER_LEN as u64,
            "nothing written"
        );
        log.write_held().expect("write held");
        assert!(!log.holds());
        assert_eq!(log.end(), log.active().written().bytes);
        assert_eq!(log.written_next(), 3);
        // `visible_when_synced`: written is not enough.
        assert_eq!(log.reader().next(), 0, "readers see them once synced");
        assert_eq!(log.reader().read(0, 10, usize::MAX).expect("read").len(), 0);
        log.active().sync().expect("sync");
        assert_eq!(log.reader().next(), 3);
        assert_eq!(log.active().end(), log.end());
        let read = log.reader().read(0, 10, usize::MAX).expect("read");
        let got: Vec<&[u8]> = read.iter().map(|r| &r.payload()[..]).collect();
        assert_eq!(got, [&b"a"[..], &b"b"[..], &b"a"[..]]);

        log.append_held(&batch_of(&small, &headers), 0)
            .expect("append held");
        log.sync().expect("sync writes what is held");
        assert_eq!(log.reader().next(), 5);
        assert!(log.active().is_synced_to(log.end()));

        let big = vec![vec![7u8; 32 << 10]; HOLD_MAX_BYTES / (32 << 10)];
        assert_eq!(
            log.append_held(&batch_of(&big, &headers), 0)
                .expect("append held"),
            5
        );
        assert!(
            !log.holds(),
            "a batch of HOLD_MAX_BYTES is written by its caller"
        );
        assert_eq!(log.written_next(), 5 + big.len() as u64);
        assert_eq!(log.reader().next(), 5);
        log.active().sync().expect("sync");
        assert_eq!(log.reader().next(), 5 + big.len() as u64);
    }

    /// A log in `dir` (`Always`'s layout, records up to 64 KiB) whose active segment is
    /// segment 0's file reused, its new records ending exactly where an old payload holds
    /// a valid frame numbered as the next record (`FORGED`), at the start of the file's
    /// sixth page (returned).
    fn ending_at_a_forged_frame(fs: &Fs, dir: &Path) -> (TopicLog, u64) {
        let cfg = LogConfig {
            max_body: 1 << 17,
            ..always_cfg()
        };
        let mut forged = Vec::new();
        record::encode(
            &mut forged,
            FORGED,
            0,
            &Headers::new(),
            b"FORGED: never appended",
        );
        let mut p0 = vec![b'x'; 40_000];
        let at = 5 * 4096 - SEGMENT_HEADER_LEN - record::RECORD_OVERHEAD - 1;
        p0[at..at + forged.len()].copy_from_slice(&forged);
        let mut log = TopicLog::open(fs, dir, cfg, 0).expect("open");
        assert_eq!(append_one(&mut log, &p0), 0);
        let old = log
            .active()
            .with_file(|f| f.read_all(u64::MAX))
            .expect("read")
            .expect("all");
        let pf = old
            .windows(forged.len())
            .position(|w| w == &forged[..])
            .expect("frame in file");
        assert_eq!(pf, 5 * 4096, "a page boundary");
        assert_eq!(
            append_one(&mut log, &[1u8; 30_000]),
            1,
            "rolls to segment 1"
        );
        assert_eq!(log.apply_retention(0, 1, 0, None).expect("retention"), 1);
        assert_eq!(log.recycled.len(), 1, "segment 0's file kept");
        assert_eq!(append_one(&mut log, &[2u8; 30_000]), 2);
        // Offset 3 rolls into the kept file; offsets 3..FORGED end exactly at the frame.
        let (small, overhead) = (1000usize, record::RECORD_OVERHEAD + 1);
        let first_len =
            pf - SEGMENT_HEADER_LEN - (FORGED as usize - 4) * (overhead + small) - overhead;
        assert_eq!(append_one(&mut log, &vec![3u8; first_len]), 3);
        assert!(log.recycled.is_empty(), "the roll reused it");
        for _ in 4..FORGED {
            append_one(&mut log, &[4u8; 1000]);
        }
        assert_eq!(log.next(), FORGED);
        assert_eq!(log.active().written().bytes as usize, pf);
        (log, pf as u64)
    }

    /// The bytes behind the records of a reused file are old payloads, which publishers
    /// chose: a frame inside one, numbered as the next record and lying exactly where the
    /// new records end, must not be taken for a record at the next open (zeros are written
    /// ahead of the records into a reused file). Found by review.
    #[test]
    fn a_frame_inside_an_old_payload_is_not_taken_for_a_record_after_a_reopen() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (log, _) = ending_at_a_forged_frame(&Fs::real(), tmp.path());
        let cfg = log.cfg;
        // Killed: nothing trims the active file.
        std::mem::forget(log);
        let mut log = TopicLog::open(&Fs::real(), tmp.path(), cfg, 0).expect("reopen");
        assert_eq!(log.next(), FORGED, "no record nobody appended");
        assert_eq!(append_one(&mut log, &[5u8; 10]), FORGED);
        log.active().sync().expect("sync");
        let last = log.reader().read(FORGED, 1, usize::MAX).expect("read");
        assert_eq!(&last[0].payload[..], &[5u8; 10][..]);
    }

    /// As above, with the process killed inside the write of the last records, after
    /// they were copied but before what was meant to follow them (the kernel copies a write
    /// page by page and stops at a fatal signal): the zeros are written before the records,
    /// so what a cut-short write leaves behind them is zeros, never old bytes. Found by
    /// review.
    #[test]
    fn a_kill_inside_a_write_into_a_reused_file_leaves_no_old_frame_behind_the_records() {
        use crate::io::sim::SimFs;
        let sim = SimFs::new(1);
        let dir = Path::new("/t");
        let (log, pf) = ending_at_a_forged_frame(&Fs::new(Arc::new(sim.clone())), dir);
        let (path, cfg) = (log.active().path.clone(), log.cfg);
        let killed = sim.process_crash_in_last_write(&path, pf);
        drop(log);
        let log = TopicLog::open(&Fs::new(Arc::new(killed)), dir, cfg, 0).expect("reopen");
        assert_eq!(log.next(), FORGED, "no record nobody appended");
    }
}

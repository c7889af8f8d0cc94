//! Reading a segment: its file opened on demand, batches of records from an offset, time
//! lookups, and the whole-segment check before sealing.
//!
//! **Invariant:** a read returns whole, crc-checked records in offset order, or an error
//! naming the file and position.

use super::*;

impl Segment {
    /// Whether the last read left bytes read ahead.
    #[cfg(test)]
    pub(crate) fn holds_read_ahead(&self) -> bool {
        !self
            .resume
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .ahead
            .is_empty()
    }

    /// Whether its summary was checked (a crc'd footer, the records, or a cache entry of
    /// one), not a damaged segment's footer kept as it was.
    pub(crate) fn summary_trusted(&self) -> bool {
        !self.doubtful.load(Ordering::Acquire)
    }

    /// Retention took the segment out of the log and deletes its files.
    pub(crate) fn mark_removed(&self) {
        self.removed.store(true, Ordering::Release);
    }

    pub(crate) fn is_removed(&self) -> bool {
        self.removed.load(Ordering::Acquire)
    }

    /// Before the sealing of a segment open took from its index's ends (`Known::Indexed`)
    /// writes a footer that vouches for every record: reads it whole, once. The boot mark
    /// said nothing written could be missing; if records are missing after all (an in-place
    /// snapshot rollback, a disk that dropped writes it had accepted), the log open exposed
    /// is not the one on disk (`distrust_boot_mark`).
    pub(crate) fn check_whole(&self, interval: u64) -> Result<()> {
        // Cleared only once checked: a read error (not damage) leaves it for the retry.
        if !self.unchecked.load(Ordering::Acquire) {
            return Ok(());
        }
        let scan =
            self.with_file(|file| scan_all(file, self.base, self.end(), interval, self.max_body))?;
        if scan.stop.is_some() || scan.end != self.end() || scan.next != self.next() {
            let why = format!(
                "records missing although the boot mark said nothing written could be: \
                 they end at offset {} (byte {}), not {}",
                scan.next,
                scan.end,
                self.next()
            );
            self.distrust_boot_mark(&why);
            return Err(Error::corrupt(&self.path, why));
        }
        // The index's ends gave these.
        self.adopt(scan);
        self.unchecked.store(false, Ordering::Release);
        Ok(())
    }

    /// Found damage open's boot mark ruled out: the topic takes no more appends (they would
    /// be cut away with the damage), and the next open checks the log in full, which cuts
    /// it back to the damage.
    fn distrust_boot_mark(&self, why: &str) {
        tracing::error!(segment = %self.path.display(), reason = why,
            "segment damaged since the last full check; reopen the topic to cut the log back");
        let _ = self.poison.set(format!(
            "{} is damaged ({why}); reopen to recover",
            self.path.display()
        ));
        if let Some(dir) = self.path.parent()
            && let Err(e) = self.fs.remove_file(&dir.join(crate::log::BOOT_MARK_FILE))
        {
            tracing::warn!(error = %e, "could not remove the boot mark");
        }
    }

    /// Appends the records with offsets in `[from, ..)` to `out`, up to `max_records`
    /// records and about `max_bytes` bytes. Reads in chunks; checks every crc and offset.
    pub(crate) fn read(
        &self,
        from: u64,
        max_records: usize,
        max_bytes: usize,
        interval: u64,
        out: &mut Vec<Record>,
    ) -> Result<()> {
        let end = self.end();
        let (mut pos, mut expected, mut ahead) = self.read_start(from, interval)?;
        let mut bytes_out = 0usize;
        // `out` may already hold records of earlier segments: the limits count only ours.
        let limit = out.len().saturating_add(max_records);
        let mut want = READ_CHUNK_BYTES;
        while pos < end && out.len() < limit && bytes_out < max_bytes {
            let chunk = if ahead.is_empty() {
                self.read_whole_chunk(pos, want.min((end - pos) as usize), end)?
            } else {
                std::mem::take(&mut ahead)
            };
            want = READ_CHUNK_BYTES;
            let mut cut_off = false;
            let mut cur = 0usize;
            while cur < chunk.len() && out.len() < limit && bytes_out < max_bytes {
                match record::decode_at(&chunk, cur, self.max_body) {
                    Frame::Complete { record, len } => {
                        if record.offset != expected {
                            return Err(Error::corrupt(
                                &self.path,
                                format!(
                                    "record at byte {} has offset {} where {} was expected",
                                    pos + cur as u64,
                                    record.offset,
                                    expected
                                ),
                            ));
                        }
                        expected += 1;
                        cur += len;
                        if record.offset >= from {
                            bytes_out += len;
                            out.push(record);
                        }
                    }
                    Frame::Incomplete { needed } => {
                        if pos + (cur + needed) as u64 > end {
                            return Err(Error::corrupt(
                                &self.path,
                                format!("record at byte {} runs past the end", pos + cur as u64),
                            ));
                        }
                        want = needed.max(READ_CHUNK_BYTES);
                        cut_off = true;
                        break;
                    }
                    Frame::Corrupt(why) => {
                        return Err(Error::corrupt(
                            &self.path,
                            format!("record at byte {}: {why}", pos + cur as u64),
                        ));
                    }
                }
            }
            pos += cur as u64;
            if !cut_off && cur < chunk.len() {
                // Stopped by a limit with whole records left in the chunk (a record cut off
                // at its end is read again from the file, whole).
                ahead = chunk.slice(cur..);
            }
        }
        *self.resume.lock().unwrap_or_else(|e| e.into_inner()) = Resume {
            offset: expected,
            position: pos,
            ahead,
        };
        Ok(())
    }

    /// Where a read from `from` starts: `(position, offset, bytes read ahead)`. Where the
    /// last read ended if it ended at `from` (a consumer reading on), else at the index
    /// entry at or before `from`.
    fn read_start(&self, from: u64, interval: u64) -> Result<(u64, u64, Bytes)> {
        let resumed = {
            let r = self.resume.lock().unwrap_or_else(|e| e.into_inner());
            (r.offset == from).then(|| (r.position, r.ahead.clone()))
        };
        Ok(match resumed {
            Some((position, ahead)) => (position, from, ahead),
            None => match self.entry_for_offset(from, interval)? {
                Some(e) => (e.position, e.offset, Bytes::new()),
                None => (SEGMENT_HEADER_LEN as u64, self.base, Bytes::new()),
            },
        })
    }

    /// `len` bytes from `pos` (records end at `end`), all of them: a file cut shorter since open (a sealed file is
    /// opened again by name) fails rather than reading the same short chunk forever.
    fn read_whole_chunk(&self, pos: u64, len: usize, end: u64) -> Result<Bytes> {
        let chunk = self.with_file(|file| read_chunk(file, pos, len))?;
        if chunk.len() < len {
            return Err(Error::corrupt(
                &self.path,
                format!(
                    "the file ends at byte {} but its records at {end}",
                    pos + chunk.len() as u64
                ),
            ));
        }
        Ok(chunk)
    }

    /// The first offset in this segment whose timestamp is `>= ts_ms`, if any.
    pub(crate) fn offset_for_time(&self, ts_ms: u64, interval: u64) -> Result<Option<u64>> {
        if self.is_empty() || self.last_ts.load(Ordering::Acquire) < ts_ms {
            return Ok(None);
        }
        let from = match self.entry_before_time(ts_ms, interval)? {
            Some(e) => e.offset,
            None => self.base,
        };
        let mut batch = Vec::new();
        let mut at = from;
        loop {
            batch.clear();
            self.read(at, 1024, usize::MAX, interval, &mut batch)?;
            let Some(last) = batch.last() else {
                return Ok(None);
            };
            if let Some(r) = batch.iter().find(|r| r.timestamp_ms >= ts_ms) {
                return Ok(Some(r.offset));
            }
            at = last.offset + 1;
        }
    }

    /// Visits every record from the index entry at or before `from` to the end, in order.
    pub(crate) fn for_each_from(
        &self,
        from: u64,
        interval: u64,
        mut f: impl FnMut(&Record),
    ) -> Result<()> {
        let mut batch = Vec::new();
        let mut at = from;
        loop {
            batch.clear();
            self.read(at, 4096, 16 << 20, interval, &mut batch)?;
            let Some(last) = batch.last() else {
                return Ok(());
            };
            at = last.offset + 1;
            batch.iter().for_each(&mut f);
        }
    }
}

pub(super) fn read_chunk(file: &DataFile, pos: u64, len: usize) -> Result<Bytes> {
    let mut buf = BytesMut::zeroed(len);
    let n = file.read_at(&mut buf, pos)?;
    buf.truncate(n);
    Ok(buf.freeze())
}

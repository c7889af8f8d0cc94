//! Records made durable through the shared journal (`journal/`) instead of a sync of the
//! segment's own file. Under `Sync=Always`, a sync round over several topics copies each
//! segment's bytes that no sync covered into one journal write, and syncs that once.
//!
//! **Invariant:** `journaled` says "durable", never "the file is synced": `synced` keeps
//! that meaning, so a roll, a seal or a close still syncs the file. A segment's bytes are
//! taken for the journal under its sync lock, held until the journal's sync returned.
//! So no other sync of the segment runs meanwhile, and index entries are shown in order.

use super::*;

/// A segment's bytes on their way into the journal: taken under its sync lock.
pub(crate) struct Journaling<'a> {
    seg: &'a Segment,
    one: std::sync::MutexGuard<'a, ()>,
    /// What no sync nor journal covered yet: `[from, end)` of the file.
    from: u64,
    end: u64,
    staged: Option<TakenStage>,
}

impl Segment {
    /// Takes what was written and is not durable yet, for the journal. `Ok(None)` if
    /// everything written is durable already; `Err` if the topic stopped (its waiters see
    /// why through `poisoned`).
    pub(crate) fn journaling(&self) -> Result<Option<Journaling<'_>>> {
        let one = self.sync_lock.lock().unwrap_or_else(|e| e.into_inner());
        self.check_poison()?;
        let staged = self.take_staged();
        let end = staged.as_ref().map_or(self.end(), |(w, _, _)| w.bytes);
        let from = self.durable_bytes();
        if from >= end {
            // Durable records are shown already; this only keeps the stage's entries.
            let shown = self.show(staged);
            drop(one);
            shown.wake();
            return Ok(None);
        }
        Ok(Some(Journaling {
            seg: self,
            one,
            from,
            end,
            staged,
        }))
    }

    /// Whether the journal made every write to the file durable (so it may be closed
    /// unsynced: the checkpoint's sync opens it again). Never waits for the writer.
    pub(super) fn journal_covers_writes(&self) -> bool {
        let Some(Ok(staged)) = self.staged.get().map(|s| s.try_lock()) else {
            return false;
        };
        self.journaled.load(Ordering::Acquire) >= staged.written.bytes
    }

    /// Bytes durable by a sync of the file or through the journal.
    pub(super) fn durable_bytes(&self) -> u64 {
        self.synced
            .load(Ordering::Acquire)
            .max(self.journaled.load(Ordering::Acquire))
    }

    /// How many bytes were written and are not durable yet (more may come meanwhile).
    pub(crate) fn pending_bytes(&self) -> u64 {
        self.written().bytes.saturating_sub(self.durable_bytes())
    }

    /// The topic's name: the segment's directory.
    fn topic_name(&self) -> &str {
        self.path
            .parent()
            .and_then(|d| d.file_name())
            .and_then(|n| n.to_str())
            .unwrap_or("")
    }
}

impl Journaling<'_> {
    /// How many bytes go into the journal.
    pub(crate) fn len(&self) -> usize {
        (self.end - self.from) as usize
    }

    pub(crate) fn from(&self) -> u64 {
        self.from
    }

    pub(crate) fn base(&self) -> u64 {
        self.seg.base
    }

    pub(crate) fn topic(&self) -> &str {
        self.seg.topic_name()
    }

    /// The crc the segment's header holds: names this file, not a later one of its name.
    /// Read once: a segment's header is written before it holds records, never after.
    pub(crate) fn header_crc(&self) -> Result<u32> {
        if let Some(crc) = self.seg.header_crc.get() {
            return Ok(*crc);
        }
        let mut h = [0u8; SEGMENT_HEADER_LEN];
        self.seg.with_file(|f| read_exact_at(f, &mut h, 0))?;
        let crc = u32::from_le_bytes([h[28], h[29], h[30], h[31]]);
        Ok(*self.seg.header_crc.get_or_init(|| crc))
    }

    /// Reads the bytes into `out` (`len` of them), from the page cache.
    pub(crate) fn read_into(&self, out: &mut [u8]) -> Result<()> {
        debug_assert_eq!(out.len(), self.len());
        self.seg.with_file(|f| read_exact_at(f, out, self.from))
    }

    /// The journal holding the bytes is synced: they are durable. Shows them to readers
    /// and lets their publishers return, unless the topic stopped meanwhile (a false
    /// failure is safe, a false success is not).
    /// Returns whom to wake (`None` if the topic stopped).
    pub(crate) fn durable(self) -> Option<Shown> {
        let seg = self.seg;
        seg.check_poison().ok()?;
        let shown = seg.show(self.staged);
        seg.journaled.fetch_max(self.end, Ordering::AcqRel);
        drop(self.one);
        Some(shown)
    }

    /// The journal could not take the bytes: syncs the segment's file instead (a failure
    /// poisons the topic, as `Segment::sync`'s does).
    pub(crate) fn sync_instead(self) -> Result<()> {
        self.seg.sync_taken(self.one, self.end, self.staged)
    }
}

/// Fills `buf` from `pos` of `f`; a short file is damage (`UnexpectedEof`).
fn read_exact_at(f: &DataFile, buf: &mut [u8], pos: u64) -> Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let n = f.read_at(&mut buf[done..], pos + done as u64)?;
        if n == 0 {
            return Err(Error::io(
                "reading a segment's bytes for the journal",
                std::io::Error::from(std::io::ErrorKind::UnexpectedEof),
            ));
        }
        done += n;
    }
    Ok(())
}

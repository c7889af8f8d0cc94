//! A segment's open files (its data file and, while active, its index): opened on
//! demand, counted against the instance's bound (`io::OpenFiles`), closed when the
//! log keeps too many sealed ones open or the instance is over its bound.
//!
//! **Invariant:** a file is closed only while nobody uses it (the slot's write lock,
//! taken without waiting). Under `Sync=Always` it is closed only once every write through
//! it is covered by a sync that succeeded (`writes` against `synced_writes`): the sync
//! thread's next sync makes it so. Under `Interval` and `None` the bound's sweep closes
//! it with unsynced writes, without syncing (a sync per eviction made each publish over
//! more topics than the bound cost an `fdatasync`). Closing a descriptor loses nothing
//! of the page cache, and the writes stay counted as unsynced: the next sync a promise
//! needs (the roll's sealing, the interval thread, close) opens the file again and syncs
//! it (`sync_file`). Linux reports a writeback error nobody has seen yet to the first
//! `fsync` through any descriptor, one opened later too (since 4.16); only an inode the
//! kernel evicted in between takes it along ("fsyncgate", a known limit).

use super::*;
use crate::io::Token;

/// An open file and the descriptor it counts against the bound.
#[derive(Debug)]
pub(crate) struct Held {
    file: DataFile,
    _token: Token,
}

impl Segment {
    /// Makes the segment shared, and known to the bound on open files if it holds one.
    pub(crate) fn shared(self) -> Arc<Segment> {
        let mut seg = self;
        let seg = Arc::new_cyclic(|me| {
            seg.me = me.clone();
            seg
        });
        if read_lock(&seg.file).is_some() {
            seg.registered();
        }
        seg
    }

    /// `file` counted against the bound (the caller registers once its lock is released).
    pub(super) fn held(fs: &Fs, file: DataFile) -> Held {
        Held {
            file,
            _token: fs.open_files().opened(),
        }
    }

    /// Lists the segment with the bound on open files, and closes the least recently used
    /// idle files if it is over. With no lock of the segment held.
    fn registered(&self) {
        let files = self.fs.open_files();
        let me: std::sync::Weak<dyn Holder> = self.me.clone();
        files.register(self.key, me);
        files.sweep_if_over(Some(self.key));
    }

    /// Runs `f` on the segment's file, opening it again if it was closed.
    pub(crate) fn with_file<R>(&self, f: impl FnOnce(&DataFile) -> Result<R>) -> Result<R> {
        // Only a sealed file is closed by its log: the writer's appends touch no shared clock.
        if self.is_sealed() {
            self.file_used.store(
                INDEX_CLOCK.fetch_add(1, Ordering::Relaxed),
                Ordering::Relaxed,
            );
        }
        let open = || {
            LOADS.fetch_add(1, Ordering::Relaxed);
            self.fs.open(&self.path)
        };
        self.with_slot(&self.file, open, f)
    }

    /// Runs `f` on the file in `slot`, opened by `open` if it is closed.
    fn with_slot<R>(
        &self,
        slot: &RwLock<Option<Held>>,
        open: impl FnOnce() -> Result<DataFile>,
        f: impl FnOnce(&DataFile) -> Result<R>,
    ) -> Result<R> {
        if !self.used.load(Ordering::Relaxed) {
            self.used.store(true, Ordering::Relaxed);
        }
        if let Some(held) = read_lock(slot).as_ref() {
            return f(&held.file);
        }
        let mut s = write_lock(slot);
        let (held, opened) = match s.take() {
            Some(held) => (held, false),
            None => (Segment::held(&self.fs, open()?), true),
        };
        let r = f(&s.insert(held).file);
        drop(s);
        if opened {
            self.registered();
        }
        r
    }

    /// Writes `buf` at `pos` of the segment's file (not synced).
    pub(crate) fn write_at(&self, buf: &[u8], pos: u64) -> Result<()> {
        self.with_file(|f| {
            let r = f.write_all_at(buf, pos);
            // Also after a failure: part of it may be in the page cache.
            self.writes.fetch_add(1, Ordering::AcqRel);
            r
        })
    }

    /// Writes `bufs` one after the other from `pos` (one `pwritev` per `IOV_MAX` of them).
    pub(crate) fn write_vectored_at(&self, bufs: &[&[u8]], pos: u64) -> Result<()> {
        self.with_file(|f| {
            let r = f.write_all_vectored_at(bufs, pos);
            // Also after a failure: part of it may be in the page cache.
            self.writes.fetch_add(1, Ordering::AcqRel);
            r
        })
    }

    /// Syncs the file, opening it again if the bound on open files closed it with writes
    /// no sync covered (`release`); a closed clean file has nothing to sync. Fails with
    /// `(e, true)` if the sync failed (its pages may be lost), `(e, false)` if the file
    /// could not be opened again for it (nothing lost: its pages are still cached).
    pub(super) fn sync_file(&self) -> std::result::Result<(), (Error, bool)> {
        if read_lock(&self.file).is_none() && !self.dirty() {
            return Ok(());
        }
        let mut ran = false;
        self.with_file(|f| {
            ran = true;
            f.sync_data()
        })
        .map_err(|e| (e, ran))
    }

    /// Cuts or extends the segment's file to `len` (not synced).
    pub(crate) fn set_len(&self, len: u64) -> Result<()> {
        self.with_file(|f| {
            let r = f.set_len(len);
            self.writes.fetch_add(1, Ordering::AcqRel);
            r
        })
    }

    /// A write to the file before the segment existed that no sync covered yet (a spare's
    /// new header, records a killed process left in the page cache).
    pub(super) fn note_unsynced_write(&self) {
        self.writes.fetch_add(1, Ordering::AcqRel);
    }

    /// Opens the active segment's index file (creating it) if it is not open.
    pub(crate) fn open_index(&self) -> Result<()> {
        self.write_index(&[], 0)
    }

    /// Writes `buf` at `pos` of the active segment's index file (never synced: a cache).
    pub(crate) fn write_index(&self, buf: &[u8], pos: u64) -> Result<()> {
        let open = || self.fs.open_or_create(&self.index_path);
        self.with_slot(&self.index_file, open, |f| {
            if buf.is_empty() {
                Ok(())
            } else {
                f.write_all_at(buf, pos)
            }
        })
    }

    /// Closes the active index file for good (the segment is sealed).
    pub(super) fn close_index(&self) {
        *write_lock(&self.index_file) = None;
    }

    /// Whether a write went through the file that no successful sync covered.
    fn dirty(&self) -> bool {
        self.writes.load(Ordering::Acquire) > self.synced_writes.load(Ordering::Acquire)
    }

    /// Called by a sync with its `sync_lock` held, before its `fdatasync`: what it covers.
    pub(super) fn writes_before_sync(&self) -> u64 {
        self.writes.load(Ordering::Acquire)
    }

    /// Called after that sync succeeded.
    pub(super) fn synced_writes(&self, before: u64) {
        self.synced_writes.fetch_max(before, Ordering::AcqRel);
    }

    /// When a sealed segment's open file was last used; `None` if it is closed, in use
    /// right now, or the segment is not sealed (its log does not close it).
    pub(crate) fn open_file_used(&self) -> Option<u64> {
        let slot = self.file.try_read().ok()?;
        (self.is_sealed() && slot.is_some()).then(|| self.file_used.load(Ordering::Relaxed))
    }

    /// Closes a sealed segment's file (opened again when next used). Never waits: a file
    /// in use right now was used recently.
    pub(crate) fn close_file(&self) {
        if self.is_sealed() {
            self.close_unused(false);
        }
    }

    /// Closes the file if nobody uses it, and unless `dirty_too` is unset and a write
    /// through it is not synced yet; and drops what the last read had read ahead (memory
    /// stays bounded like descriptors).
    fn close_unused(&self, dirty_too: bool) {
        if let Ok(mut slot) = self.file.try_write()
            && (dirty_too || !self.dirty())
        {
            *slot = None;
            if let Ok(mut r) = self.resume.try_lock() {
                r.ahead = Bytes::new();
            }
        }
    }

    /// Whether the segment holds a descriptor (for tests).
    #[cfg(test)]
    pub(crate) fn holds_files(&self) -> usize {
        usize::from(read_lock(&self.file).is_some())
            + usize::from(read_lock(&self.index_file).is_some())
    }
}

impl Holder for Segment {
    fn seen(&self) -> Seen {
        let (Ok(file), Ok(index)) = (self.file.try_read(), self.index_file.try_read()) else {
            return Seen::Used; // being opened or closed right now
        };
        let n = usize::from(file.is_some()) + usize::from(index.is_some());
        if n == 0 {
            Seen::Holds0
        } else if self.used.swap(false, Ordering::Relaxed) {
            Seen::Used
        } else {
            Seen::Idle(n)
        }
    }

    /// Closes what nobody uses. Under `Interval` and `None` with unsynced writes too: the
    /// sync a promise needs opens the file again (`sync_file`). Under `Always` (deferred
    /// visibility) a dirty file is the sync thread's, which makes it clean within one
    /// sync; it stays open meanwhile, unless the journal made its writes durable (its
    /// checkpoint opens it again to sync it).
    fn release(&self) {
        self.close_unused(self.staged.get().is_none() || self.journal_covers_writes());
        if let Ok(mut index) = self.index_file.try_write() {
            *index = None;
        }
    }
}

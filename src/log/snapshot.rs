//! One log's part of a snapshot: which files make a consistent copy of it, and writing
//! them into another directory.
//!
//! **Invariants:**
//! - Only files that never change again are hard-linked: the data files of sealed
//!   segments (synced, trimmed, index written; see `sealing.rs`). Retention never recycles
//!   a file with a second name (`delete_files`), so a link stays as it was made.
//! - Everything else is copied: index files (rewritten in place when rebuilt), segments
//!   still being sealed, and the active segment, up to the end readers see (whole
//!   records; under `Sync=Always` only synced ones).
//! - Caches and scratch files are left out: `boot.mark`, `sealed.sum`, the spare file and
//!   recycled files. The copy's first open rebuilds what it needs.
//! - Every file written is synced, then the directory.

use super::*;
use crate::io::UNSYNCED_FILE;

/// Bytes read and written at a time when copying a file.
const COPY_CHUNK: usize = 1 << 20;

/// The files of a log's copy, planned under the writer's lock and written after it.
#[derive(Debug)]
pub struct CopyPlan {
    files: Vec<PlannedFile>,
}

#[derive(Debug)]
struct PlannedFile {
    from: PathBuf,
    /// Bytes to copy (from the start of the file); for a link, the file's length.
    len: u64,
    /// Whole and never written again: linked (copied where a link cannot be made).
    link: bool,
    /// Held while the plan lives: a held segment is never recycled by retention.
    _seg: Arc<Segment>,
}

/// What writing a plan took.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CopyStats {
    pub linked_files: usize,
    pub linked_bytes: u64,
    pub copied_files: usize,
    pub copied_bytes: u64,
}

impl CopyStats {
    pub fn add(&mut self, other: CopyStats) {
        self.linked_files += other.linked_files;
        self.linked_bytes += other.linked_bytes;
        self.copied_files += other.copied_files;
        self.copied_bytes += other.copied_bytes;
    }
}

impl TopicLog {
    /// The files of a copy of this log as readers see it now. Cheap (no I/O but a stat
    /// per index): call it under the writer's lock, so that no roll moves the active
    /// segment in between, and write the plan after releasing the lock. Segment files
    /// must not be deleted until the plan is written (the caller holds off retention).
    pub fn copy_plan(&self) -> CopyPlan {
        // A file whose sync failed may have lost pages its readers still see: copied (the
        // copy is synced afresh), never linked.
        let noted = self.fs.is_dir(&self.dir.join(UNSYNCED_FILE)).is_some();
        let segs = read_lock(&self.reader.segments).clone();
        let mut files = Vec::with_capacity(segs.len() * 2);
        let last = segs.len().saturating_sub(1);
        for (i, seg) in segs.iter().enumerate() {
            let sealed = i < last && seg.is_sealed();
            files.push(PlannedFile {
                from: seg.path.clone(),
                len: seg.end(),
                link: sealed && !noted,
                _seg: seg.clone(),
            });
            // An unsealed segment's index may run past the copied end: left out, the
            // copy's open rebuilds it from the records.
            if sealed && let Ok(stat) = self.fs.file_stat(&seg.index_path) {
                files.push(PlannedFile {
                    from: seg.index_path.clone(),
                    len: stat.len,
                    link: false,
                    _seg: seg.clone(),
                });
            }
        }
        CopyPlan { files }
    }
}

impl CopyPlan {
    /// Links or copies every planned file into `dest` (an existing, empty directory),
    /// syncs each copy and then `dest`. A link that cannot be made (another file system,
    /// no hard links) is a copy.
    pub fn write(&self, fs: &Fs, dest: &Path) -> Result<CopyStats> {
        let mut stats = CopyStats::default();
        for f in &self.files {
            let Some(name) = f.from.file_name() else {
                continue;
            };
            let to = dest.join(name);
            if f.link && fs.hard_link(&f.from, &to).is_ok() {
                stats.linked_files += 1;
                stats.linked_bytes += f.len;
                continue;
            }
            // A failed link may have left nothing, or (never on Linux) the name: made anew.
            fs.remove_file(&to)?;
            copy_prefix(fs, &f.from, &to, f.len)?;
            stats.copied_files += 1;
            stats.copied_bytes += f.len;
        }
        fs.sync_dir(dest)?;
        Ok(stats)
    }
}

/// Copies the first `len` bytes of `from` into a new file `to`, and syncs it.
fn copy_prefix(fs: &Fs, from: &Path, to: &Path, len: u64) -> Result<()> {
    let src = fs.open(from)?;
    let dst = fs.create_new(to)?;
    let mut buf = vec![0u8; COPY_CHUNK.min(usize::try_from(len).unwrap_or(COPY_CHUNK))];
    let mut at = 0;
    while at < len {
        let want = buf
            .len()
            .min(usize::try_from(len - at).unwrap_or(buf.len()));
        let n = src.read_at(&mut buf[..want], at)?;
        if n == 0 {
            return Err(Error::corrupt(
                from,
                format!("ends at byte {at}, before the {len} bytes readers see"),
            ));
        }
        dst.write_all_at(&buf[..n], at)?;
        at += n as u64;
    }
    dst.sync_data()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::test_support::*;

    /// A sealed segment is linked, its index and the active segment copied; the copy opens
    /// as the same log, and retention in either never overwrites the shared file.
    #[test]
    fn a_copy_links_sealed_segments_and_opens_as_the_same_log() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (src, dst) = (tmp.path().join("src"), tmp.path().join("dst"));
        let fs = Fs::real();
        fs.create_dir_all(&src).expect("src");
        fs.create_dir_all(&dst).expect("dst");
        let mut log = TopicLog::open(&fs, &src, always_cfg(), 0).expect("open");
        assert!(append_until_segments(&mut log, 3));
        append(&mut log, 2);
        log.sync().expect("sync");
        let next = log.next();
        let plan = log.copy_plan();
        let stats = plan.write(&fs, &dst).expect("write");
        drop(plan);
        assert_eq!(stats.linked_files, 2, "{stats:?}");
        assert_eq!(stats.copied_files, 3, "two indexes and the active segment");
        let first = log.reader().snapshot()[0].path.clone();
        assert_eq!(
            ino(&first),
            ino(&dst.join(first.file_name().expect("name")))
        );
        // Retention in the source deletes the shared file instead of keeping it to reuse.
        assert_eq!(log.apply_retention(0, 1, 0, None).expect("retention"), 2);
        assert!(log.recycled.is_empty(), "a linked file is never recycled");
        let copy = TopicLog::open(&fs, &dst, always_cfg(), 0).expect("open copy");
        assert_eq!(copy.next(), next);
        assert_dense(&copy, 0);
    }
}

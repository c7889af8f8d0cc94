//! The sealed-summaries cache (`sealed.sum`): one entry per sealed segment, so an open
//! reads one file per topic instead of every segment's index footer.
//!
//! **Invariant:** an entry is believed only for the very file it describes (same length
//! and file identity); the cache is never synced and never needed.

use super::*;

/// `SUMMARIES_FILE`: per sealed segment, its index footer's 64 bytes and its data file's
/// identity (`FileStat::identity`), appended after the footer (so after the data was
/// synced: an entry vouches for a segment as its footer does). Open takes a sealed
/// segment's summary from here when the data file's length and identity are the entry's
/// (one read per topic, a `statx` per segment), instead of opening and reading each
/// segment's index. A file made anew (a cut-back's bases written again, by this build or
/// an older one, a restore, a repair) has another identity, so an older incarnation's
/// entry is never believed; open also deletes the file before it cuts the log back.
#[derive(Debug)]
pub(super) struct Summaries {
    pub(super) path: PathBuf,
    /// Two sealing threads may append at once.
    lock: Mutex<()>,
}

/// One entry of `SUMMARIES_FILE`.
pub(super) const SUMMARY_LEN: usize = FOOTER_LEN + 16;

/// Entries the cache may hold beyond the log's sealed segments (retention leaves them)
/// before open rewrites it.
pub(super) const SUMMARIES_STALE_MAX: usize = 64;

/// A sealed segment's summary as the cache holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Cached {
    pub(super) summary: SegmentSummary,
    pub(super) identity: [u64; 2],
}

impl Cached {
    pub(super) fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&encode_footer(&[], &self.summary));
        for v in self.identity {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }

    /// `None` unless the footer's crc holds (a torn identity only fails to match).
    fn decode(e: &[u8]) -> Option<Cached> {
        let footer = decode_footer(e.get(..FOOTER_LEN)?).filter(|f| f.summary_checked)?;
        let word = |i: usize| {
            let at = FOOTER_LEN + 8 * i;
            e.get(at..at + 8)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_le_bytes)
        };
        Some(Cached {
            summary: footer.summary,
            identity: [word(0)?, word(1)?],
        })
    }

    /// The summary, if `stat` is of the data file it describes (the same length and
    /// identity).
    pub(super) fn for_file(&self, stat: &FileStat) -> Option<SegmentSummary> {
        (stat.len == self.summary.bytes && stat.identity == self.identity).then_some(self.summary)
    }
}

impl Summaries {
    pub(super) fn new(dir: &Path) -> Summaries {
        Summaries {
            path: dir.join(SUMMARIES_FILE),
            lock: Mutex::new(()),
        }
    }

    /// The entries that hold up (crc), by base; the last one of a base wins. Missing,
    /// unreadable or oversized: none (the footers are read instead).
    pub(super) fn read(&self, fs: &Fs) -> std::collections::HashMap<u64, Cached> {
        let mut out = std::collections::HashMap::new();
        let Ok(f) = fs.open(&self.path) else {
            return out;
        };
        // Far more than any log's segments: a damaged length is not allocated.
        const MAX_BYTES: u64 = (SUMMARY_LEN as u64) << 20;
        let Ok(Some(bytes)) = f.read_all(MAX_BYTES) else {
            return out;
        };
        for c in bytes.chunks_exact(SUMMARY_LEN).filter_map(Cached::decode) {
            out.insert(c.summary.base, c);
        }
        out
    }

    /// Appends the summary of the sealed segment whose data file is `path` (over a torn
    /// last entry, if a crash left one). A failure only costs the next open the footer
    /// read.
    pub(super) fn append(&self, fs: &Fs, s: &SegmentSummary, path: &Path) {
        let _one = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let written = fs.file_stat(path).and_then(|stat| {
            let mut entry = Vec::with_capacity(SUMMARY_LEN);
            Cached {
                summary: *s,
                identity: stat.identity,
            }
            .encode(&mut entry);
            let f = fs.open_or_create(&self.path)?;
            let len = f.len()?;
            f.write_all_at(&entry, len - len % SUMMARY_LEN as u64)
        });
        if let Err(e) = written {
            tracing::warn!(error = %e, "could not append to the sealed summaries");
        }
    }

    /// Replaces the file with `all`.
    pub(super) fn rewrite(&self, fs: &Fs, all: &[Cached]) {
        let _one = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut bytes = Vec::with_capacity(all.len() * SUMMARY_LEN);
        for c in all {
            c.encode(&mut bytes);
        }
        let written = fs.open_or_create(&self.path).and_then(|f| {
            f.write_all_at(&bytes, 0)?;
            f.set_len(bytes.len() as u64)
        });
        if let Err(e) = written {
            tracing::warn!(error = %e, "could not rewrite the sealed summaries");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(base: u64) -> SegmentSummary {
        SegmentSummary {
            base,
            next: base + 3,
            bytes: 500,
            first_ts: 7,
            last_ts: 9,
            id_count: 1,
        }
    }

    /// The sealed-summaries cache: an append after a torn last entry writes over it,
    /// damaged entries are skipped, and an entry is believed only for the data file it was
    /// written for (the same length and identity: not for a file made anew).
    #[test]
    fn summary_entries_hold_only_for_their_own_file() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let fs = Fs::real();
        let data = tmp.path().join("data.log");
        std::fs::write(&data, [1u8; 500]).expect("data");
        let sums = Summaries::new(tmp.path());
        sums.append(&fs, &summary(0), &data);
        let mut b = std::fs::read(&sums.path).expect("read");
        b.extend_from_slice(&[0xAB; 30]);
        std::fs::write(&sums.path, &b).expect("write");
        sums.append(&fs, &summary(3), &data);
        let len = SUMMARY_LEN as u64;
        assert_eq!(std::fs::metadata(&sums.path).expect("meta").len(), 2 * len);
        let stat = fs.file_stat(&data).expect("stat");
        let got = sums.read(&fs);
        assert_eq!(got[&0].for_file(&stat), Some(summary(0)));
        assert_eq!(got[&3].for_file(&stat), Some(summary(3)));
        // The same path and length, made anew: another file.
        std::fs::remove_file(&data).expect("rm");
        std::thread::sleep(std::time::Duration::from_millis(20));
        let hold = tmp.path().join("hold");
        std::fs::write(&hold, b"keeps the old inode number from coming back").expect("hold");
        std::fs::write(&data, [2u8; 500]).expect("data again");
        let again = fs.file_stat(&data).expect("stat");
        assert_eq!(again.len, 500);
        assert_eq!(
            got[&0].for_file(&again),
            None,
            "an older incarnation's entry"
        );
        let mut b = std::fs::read(&sums.path).expect("read");
        b[SUMMARY_LEN + 20] ^= 1;
        std::fs::write(&sums.path, &b).expect("write");
        let got = sums.read(&fs);
        assert_eq!((got.len(), got.contains_key(&0)), (1, true));
    }
}

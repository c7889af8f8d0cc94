//! Copying the journal's entries back into their segment files at open, before any log
//! is opened: records a crash left durable only in the journal are in their logs again
//! when recovery scans them.
//!
//! Why copying an entry is safe:
//! - Segments are append-only, and an entry holds whole records from a record boundary.
//!   Into the file it was taken from, it writes the bytes that file held there.
//! - A file of the same name made later (retention reused a base's name, a topic made
//!   anew) has another header crc: its entries are skipped. So is a file that is gone.
//! - Copying twice (a crash during replay) writes the same bytes again.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::{FILE_NAMES, GENERATION_MAX};
use crate::error::{Error, Result};
use crate::format::journal::{self as fmt, Entry, JOURNAL_HEADER_LEN};
use crate::format::segment::SEGMENT_HEADER_LEN;
use crate::io::{DataFile, Fs};
use crate::log::segment::segment_file_name;

/// The largest journal file open reads (each is 32 MiB; a round may overrun it).
const READ_MAX: u64 = 1 << 30;

/// Copies the entries of `dir`'s journal files into their segments (the older
/// generation's first), syncs those, and empties the files. Returns the generation the
/// next header written gets: above every one the files held.
pub(crate) fn replay(fs: &Fs, dir: &Path) -> Result<u64> {
    let mut found = Vec::new();
    for name in FILE_NAMES {
        if let Some(journal) = read(fs, dir, name)? {
            found.push(journal);
        }
    }
    found.sort_by_key(|(generation, _, _)| *generation);
    // The headers written below take the generations after the newest.
    let newest = found.last().map_or(0, |(g, _, _)| *g);
    if newest > GENERATION_MAX {
        return Err(Error::corrupt(
            dir.join(FILE_NAMES[0]),
            format!("a journal of generation {newest} (at most {GENERATION_MAX})"),
        ));
    }
    // By segment file, in the journals' order within each (the older file's first): one
    // file open at a time, since a generation can name more files than the process may
    // hold descriptors (found by review).
    let mut by_file: BTreeMap<PathBuf, Vec<Entry<'_>>> = BTreeMap::new();
    for (generation, _, bytes) in &found {
        let mut at = JOURNAL_HEADER_LEN;
        while let Some((entry, n)) = fmt::decode_entry(&bytes[at..], *generation) {
            at += n;
            if let Some(path) = target_path(dir, &entry) {
                by_file.entry(path).or_default().push(entry);
            }
        }
    }
    let (mut copied, mut files) = (0usize, 0usize);
    for (path, entries) in &by_file {
        let n = copy_back(fs, path, entries)?;
        copied += n;
        files += usize::from(n > 0);
    }
    let mut next = newest + 1;
    for (_, file, _) in &found {
        file.write_all_at(&fmt::encode_header(next), 0)?;
        file.sync_data()?;
        next += 1;
    }
    if copied > 0 {
        tracing::info!(
            entries = copied,
            files,
            "copied the journal back into the topics"
        );
    }
    Ok(next)
}

/// The journal file `name`: its generation, the file and its bytes; `None` if there is
/// none, or its header is not whole (then it is removed).
fn read(fs: &Fs, dir: &Path, name: &str) -> Result<Option<(u64, DataFile, Vec<u8>)>> {
    let path = dir.join(name);
    if fs.is_dir(&path) != Some(false) {
        return Ok(None);
    }
    let file = fs.open(&path)?;
    let bytes = read_whole(&file)?;
    let Some(generation) = fmt::decode_header(&bytes) else {
        // The header is written only to empty the file, after every segment it covered
        // was synced: one torn there holds nothing needed. Made anew by a round.
        tracing::warn!(path = %path.display(), "a journal header is not whole: removing the file");
        fs.remove_file(&path)?;
        fs.sync_dir(dir)?;
        return Ok(None);
    };
    Ok(Some((generation, file, bytes)))
}

/// The segment file `entry` names; `None` if its name is no topic's.
fn target_path(dir: &Path, entry: &Entry<'_>) -> Option<PathBuf> {
    let t = entry.target;
    // A damaged journal must not name a file outside the topics (the crc makes that
    // unlikely; the name rule makes it impossible).
    if crate::names::check(t.topic).is_err() {
        tracing::warn!(topic = t.topic, "the journal names no topic: entry skipped");
        return None;
    }
    Some(
        dir.join("topics")
            .join(t.topic)
            .join(segment_file_name(t.base)),
    )
}

/// Writes the bytes of `entries` (all naming `path`) into that file, each only if the
/// file is the one it was taken from (its header's crc), then syncs it; how many it
/// wrote.
fn copy_back(fs: &Fs, path: &Path, entries: &[Entry<'_>]) -> Result<usize> {
    if fs.is_dir(path) != Some(false) {
        return Ok(0);
    }
    let file = fs.open(path)?;
    let mut h = [0u8; SEGMENT_HEADER_LEN];
    if file.read_at(&mut h, 0)? < SEGMENT_HEADER_LEN {
        return Ok(0);
    }
    let crc = u32::from_le_bytes([h[28], h[29], h[30], h[31]]);
    let mut copied = 0;
    for e in entries
        .iter()
        .filter(|e| e.target.segment_header_crc == crc)
    {
        file.write_all_at(e.data, e.target.position)?;
        copied += 1;
    }
    if copied > 0 {
        file.sync_data()?;
    }
    Ok(copied)
}

/// The journal file's bytes (bounded: a larger file is not one this code wrote).
fn read_whole(file: &DataFile) -> Result<Vec<u8>> {
    let len = file.len()?;
    if len > READ_MAX {
        return Err(Error::corrupt(
            file.path(),
            format!("a journal of {len} bytes (at most {READ_MAX})"),
        ));
    }
    let mut buf = vec![0u8; len as usize];
    let mut done = 0;
    while done < buf.len() {
        let n = file.read_at(&mut buf[done..], done as u64)?;
        if n == 0 {
            break;
        }
        done += n;
    }
    buf.truncate(done);
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::journal::Target;
    use crate::format::segment::encode_header;

    /// A segment file `topics/t/<base>.log` with a header of `created`; its header crc.
    fn segment(fs: &Fs, dir: &Path, base: u64, created: u64) -> u32 {
        let t = dir.join("topics").join("t");
        fs.create_dir_all(&t).expect("mkdir");
        let f = fs
            .open_or_create(&t.join(segment_file_name(base)))
            .expect("create");
        let h = encode_header(base, created, 0);
        f.write_all_at(&h, 0).expect("header");
        u32::from_le_bytes([h[28], h[29], h[30], h[31]])
    }

    fn entry(out: &mut Vec<u8>, generation: u64, topic: &str, crc: u32, pos: u64, data: &[u8]) {
        let target = Target {
            topic,
            base: 0,
            segment_header_crc: crc,
            position: pos,
        };
        fmt::append_entry::<()>(out, generation, target, data.len(), |d| {
            d.copy_from_slice(data);
            Ok(())
        })
        .expect("entry");
    }

    fn read(fs: &Fs, path: &Path, pos: u64, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        let n = fs
            .open(path)
            .expect("open")
            .read_at(&mut b, pos)
            .expect("read");
        b.truncate(n);
        b
    }

    /// Entries go back into the file they came from, and only there: not into a later
    /// file of the same name, a missing one, or a path a damaged name would point to.
    /// Entries of an older generation are not copied; the journal is emptied after.
    #[test]
    fn entries_go_back_into_their_own_file_only() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (fs, dir) = (Fs::real(), tmp.path());
        let crc = segment(&fs, dir, 0, 7);
        let other_life = crc ^ 1;
        let mut j = fmt::encode_header(5).to_vec();
        entry(&mut j, 5, "t", crc, 32, b"records");
        entry(
            &mut j,
            5,
            "t",
            other_life,
            100,
            b"from a file of the same name before",
        );
        entry(
            &mut j,
            5,
            "gone",
            crc,
            32,
            b"into a topic that is not there",
        );
        entry(&mut j, 5, "../escape", crc, 32, b"outside the topics");
        let older_at = j.len();
        entry(&mut j, 4, "t", crc, 200, b"an older generation's");
        entry(&mut j, 5, "t", crc, 300, b"after the journal's end");
        fs.open_or_create(&dir.join(FILE_NAMES[0]))
            .expect("journal")
            .write_all_at(&j, 0)
            .expect("write");

        assert_eq!(replay(&fs, dir).expect("replay"), 7);
        let seg = dir.join("topics/t").join(segment_file_name(0));
        assert_eq!(read(&fs, &seg, 32, 7), b"records");
        assert_eq!(read(&fs, &seg, 100, 8), b"", "another life's entry skipped");
        assert!(fs.is_dir(&dir.join("topics/gone")).is_none());
        assert!(fs.is_dir(&dir.join("escape")).is_none());
        assert!(older_at < j.len());
        assert_eq!(
            read(&fs, &seg, 200, 4),
            b"",
            "nothing past the first older entry"
        );
        // Emptied: a second replay copies nothing (the header's generation moved on).
        fs.open(&seg).expect("open").set_len(32).expect("cut");
        assert_eq!(replay(&fs, dir).expect("again"), 8);
        assert_eq!(read(&fs, &seg, 32, 7), b"");
    }

    /// Both files are copied back, whichever is older, and the generation handed on is
    /// above both (a header written later never revives an old entry).
    #[test]
    fn both_files_are_copied_back_and_the_next_generation_is_above_both() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (fs, dir) = (Fs::real(), tmp.path());
        let crc = segment(&fs, dir, 0, 7);
        for (name, generation, pos, data) in [
            (FILE_NAMES[0], 9, 37, &b"newer"[..]),
            (FILE_NAMES[1], 3, 32, &b"older"[..]),
        ] {
            let mut j = fmt::encode_header(generation).to_vec();
            entry(&mut j, generation, "t", crc, pos, data);
            fs.open_or_create(&dir.join(name))
                .expect("journal")
                .write_all_at(&j, 0)
                .expect("write");
        }
        assert_eq!(replay(&fs, dir).expect("replay"), 12);
        let seg = dir.join("topics/t").join(segment_file_name(0));
        assert_eq!(read(&fs, &seg, 32, 10), b"oldernewer");
    }

    /// A header naming a generation past `GENERATION_MAX` (damage, or forged) is an
    /// error at open, never an overflow when the next generations are handed out
    /// (found by review: `u64::MAX` panicked).
    #[test]
    fn a_journal_past_the_last_generation_is_an_error() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (fs, dir) = (Fs::real(), tmp.path());
        for generation in [GENERATION_MAX + 1, u64::MAX] {
            fs.open_or_create(&dir.join(FILE_NAMES[1]))
                .expect("journal")
                .write_all_at(&fmt::encode_header(generation), 0)
                .expect("write");
            let r = replay(&fs, dir);
            assert!(
                matches!(r, Err(Error::Corrupt { .. })),
                "{generation}: {r:?}"
            );
        }
        fs.open_or_create(&dir.join(FILE_NAMES[1]))
            .expect("journal")
            .write_all_at(&fmt::encode_header(GENERATION_MAX), 0)
            .expect("write");
        assert_eq!(replay(&fs, dir).expect("the last one"), GENERATION_MAX + 2);
    }

    /// A journal whose header is not whole is removed: it is only written to empty the
    /// journal, after every file it covered was synced.
    #[test]
    fn a_journal_with_a_torn_header_is_removed() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (fs, dir) = (Fs::real(), tmp.path());
        let path = dir.join(FILE_NAMES[1]);
        let mut h = fmt::encode_header(3);
        h[20] ^= 1;
        fs.open_or_create(&path)
            .expect("journal")
            .write_all_at(&h, 0)
            .expect("write");
        assert_eq!(replay(&fs, dir).expect("replay"), 1);
        assert!(fs.is_dir(&path).is_none());
        assert_eq!(replay(&fs, dir).expect("no journal"), 1);
    }
}

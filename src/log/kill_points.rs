//! Every kill point of every write into a segment file (test only). A backend over
//! `SimFs` records, after each write to a `.log` or `.recycled` file, the images a process
//! killed inside that write leaves (cut at its start, at each page boundary in it, and at
//! its end: the kernel stops copying at a fatal signal). The workload rolls into a file
//! retention kept (`Sync=Always`) whose old payload holds, wherever a new record could
//! end, a valid frame numbered as the next record; every image must reopen to records
//! that were all appended, and keep doing so after one more append and a kill. It fails at
//! once if the zeros ahead of the records are written after them. Written by a review.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use super::append::{PREALLOCATE_BYTES, PREALLOCATE_MIN_BYTES};
use super::test_support::{append_all, append_one};
use super::{LogConfig, TopicLog, segment};
use crate::format::Headers;
use crate::format::record;
use crate::format::segment::SEGMENT_HEADER_LEN;
use crate::io::{FileStat, Fs};

/// Forwards to a `SimFs`; after each write to a segment file (`.log` / `.recycled`),
/// records the images a process killed inside that write at each page boundary leaves
/// (also "before it" and "after it").
#[derive(Debug)]
struct CutEveryWrite {
    sim: crate::io::sim::SimFs,
    names: Arc<Mutex<Vec<Arc<Mutex<PathBuf>>>>>,
    on: Arc<std::sync::atomic::AtomicBool>,
    images: Arc<Mutex<Vec<(crate::io::sim::SimFs, String)>>>,
}

#[derive(Debug)]
struct CutHandle {
    inner: Arc<dyn crate::io::FileIo>,
    path: Arc<Mutex<PathBuf>>,
    sim: crate::io::sim::SimFs,
    on: Arc<std::sync::atomic::AtomicBool>,
    images: Arc<Mutex<Vec<(crate::io::sim::SimFs, String)>>>,
}

impl crate::io::FileIo for CutHandle {
    fn len(&self) -> std::io::Result<u64> {
        self.inner.len()
    }
    fn read_at(&self, buf: &mut [u8], pos: u64) -> std::io::Result<usize> {
        self.inner.read_at(buf, pos)
    }
    fn write_all_at(&self, buf: &[u8], pos: u64) -> std::io::Result<()> {
        self.inner.write_all_at(buf, pos)?;
        let path = self.path.lock().expect("lock").clone();
        let name = path.to_string_lossy().into_owned();
        if self.on.load(Ordering::SeqCst)
            && (name.ends_with(".log") || name.ends_with(segment::RECYCLED_SUFFIX))
        {
            let end = pos + buf.len() as u64;
            let mut cuts = vec![pos];
            let mut c = (pos / 4096 + 1) * 4096;
            while c < end {
                cuts.push(c);
                c += 4096;
            }
            cuts.push(end);
            let mut imgs = self.images.lock().expect("lock");
            for upto in cuts {
                imgs.push((
                    self.sim.process_crash_in_last_write(&path, upto),
                    format!("write [{pos}, {end}) to {name} cut at {upto}"),
                ));
            }
        }
        Ok(())
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.inner.sync_data()
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.inner.set_len(len)
    }
}

impl CutEveryWrite {
    fn wrap(&self, inner: Arc<dyn crate::io::FileIo>, path: &Path) -> Arc<dyn crate::io::FileIo> {
        let cell = Arc::new(Mutex::new(path.to_owned()));
        self.names.lock().expect("lock").push(cell.clone());
        Arc::new(CutHandle {
            inner,
            path: cell,
            sim: self.sim.clone(),
            on: self.on.clone(),
            images: self.images.clone(),
        })
    }
}

impl crate::io::Backend for CutEveryWrite {
    fn create_new(&self, path: &Path) -> std::io::Result<Arc<dyn crate::io::FileIo>> {
        Ok(self.wrap(self.sim.create_new(path)?, path))
    }
    fn open(&self, path: &Path) -> std::io::Result<Arc<dyn crate::io::FileIo>> {
        Ok(self.wrap(self.sim.open(path)?, path))
    }
    fn open_or_create(&self, path: &Path) -> std::io::Result<Arc<dyn crate::io::FileIo>> {
        Ok(self.wrap(self.sim.open_or_create(path)?, path))
    }
    fn remove_file(&self, path: &Path) -> std::io::Result<()> {
        self.sim.remove_file(path)
    }
    fn file_stat(&self, path: &Path) -> std::io::Result<FileStat> {
        self.sim.file_stat(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        self.sim.rename(from, to)?;
        for c in self.names.lock().expect("lock").iter() {
            let mut c = c.lock().expect("lock");
            if *c == from {
                *c = to.to_owned();
            }
        }
        Ok(())
    }
    fn list_dir(&self, dir: &Path) -> std::io::Result<Vec<String>> {
        self.sim.list_dir(dir)
    }
    fn create_dir_all(&self, dir: &Path) -> std::io::Result<()> {
        self.sim.create_dir_all(dir)
    }
    fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
        self.sim.sync_dir(dir)
    }
    fn remove_dir(&self, dir: &Path) -> std::io::Result<()> {
        self.sim.remove_dir(dir)
    }
    fn is_dir(&self, path: &Path) -> Option<bool> {
        self.sim.is_dir(path)
    }
    fn is_real(&self) -> bool {
        false
    }
    fn boot_mark(&self, dir: &Path) -> Option<String> {
        self.sim.boot_mark(dir)
    }
}

/// New records' payloads (by offset; never the forged one).
fn new_payload(offset: u64, len: usize) -> Vec<u8> {
    vec![(offset % 200) as u8 + 1; len]
}

/// Opens `image`, checks every record is one appended (payload by offset, at most
/// `appended`), then appends one more, kills, reopens and checks again.
fn check_image(
    image: &crate::io::sim::SimFs,
    what: &str,
    dir: &Path,
    cfg: LogConfig,
    payloads: &std::collections::HashMap<u64, Vec<u8>>,
    appended: u64,
    plen: usize,
) {
    let check = |log: &TopicLog, upto: u64, extra: Option<(u64, &[u8])>| {
        assert!(
            log.next() <= upto,
            "{what}: next {} > appended {upto}",
            log.next()
        );
        let from = log.reader().earliest();
        let recs = log
            .reader()
            .read(from, usize::MAX, usize::MAX)
            .unwrap_or_else(|e| panic!("{what}: read: {e}"));
        assert_eq!(recs.len() as u64, log.next() - from, "{what}");
        for r in &recs {
            let want: &[u8] = match extra {
                Some((o, p)) if o == r.offset => p,
                _ => payloads.get(&r.offset).map(|v| &v[..]).unwrap_or(b"?"),
            };
            assert!(
                &r.payload[..] == want,
                "{what}: record {} is not the one appended ({:?}...)",
                r.offset,
                &r.payload[..r.payload.len().min(24)]
            );
        }
    };
    let mut log = TopicLog::open(&Fs::new(Arc::new(image.clone())), dir, cfg, 0)
        .unwrap_or_else(|e| panic!("{what}: reopen: {e}"));
    check(&log, appended, None);
    let o = log.next();
    let p = new_payload(o + 1, plen);
    assert_eq!(append_one(&mut log, &p), o);
    let again = image.process_crash_now();
    drop(log);
    let log = TopicLog::open(&Fs::new(Arc::new(again)), dir, cfg, 0)
        .unwrap_or_else(|e| panic!("{what}: second reopen: {e}"));
    assert_eq!(log.next(), o + 1, "{what}: after reopen + append + kill");
    check(&log, o + 1, Some((o, &p)));
}

/// Segment size `s`, new records of frame size `f` appended `batch` at a time. The
/// file reused at base `b` holds, inside one old payload, a valid frame numbered
/// `b + j` at every `HDR + j * f`: wherever a scan stops at a new-record boundary on
/// old bytes, it finds a forged next record.
// Kept whole: the forged file's layout, the cut points and the checks after each cut
// all derive from `s`, `f` and `batch`; apart they would pass a dozen values around.
fn every_cut_into_a_reused_file(s: u64, f: usize, batch: usize) -> usize {
    let cfg = LogConfig {
        segment_bytes: s,
        index_interval_bytes: 4096,
        max_body: 2 * s as usize,
        preallocate: true,
        visible_when_synced: true,
        seal_in_background: false,
    };
    let sim = crate::io::sim::SimFs::new(7);
    let backend = Arc::new(CutEveryWrite {
        sim: sim.clone(),
        names: Arc::default(),
        on: Arc::default(),
        images: Arc::default(),
    });
    let fs = Fs::new(backend.clone());
    let dir = Path::new("/t");
    let hdr = SEGMENT_HEADER_LEN;
    let ov = record::RECORD_OVERHEAD + 1;
    let plen = f - ov;
    // Seg 1 leaves room for two new records: the reused file's base is 5.
    let b = 5u64;
    let old_len = s as usize - 100;
    let mut p0 = vec![b'x'; old_len - hdr - ov];
    let mut j = 1;
    while hdr + (j + 1) * f <= old_len {
        let mut fr = Vec::new();
        record::encode(&mut fr, b + j as u64, 0, &Headers::new(), &vec![b'F'; plen]);
        assert_eq!(fr.len(), f);
        let at = hdr + j * f - (hdr + ov);
        p0[at..at + f].copy_from_slice(&fr);
        j += 1;
    }
    let mut payloads = std::collections::HashMap::new();
    let mut log = TopicLog::open(&fs, dir, cfg, 0).expect("open");
    assert_eq!(append_one(&mut log, &p0), 0);
    payloads.insert(0, p0);
    let room = 2 * f + 10;
    let l1 = (s as usize - hdr - 2 * ov - room) / 2;
    let p1 = new_payload(1, l1);
    assert_eq!(append_one(&mut log, &p1), 1, "rolls");
    payloads.insert(1, p1);
    assert_eq!(log.apply_retention(0, 1, 0, None).expect("retention"), 1);
    assert_eq!(log.recycled.len(), 1);
    let p2 = new_payload(2, s as usize - hdr - 2 * ov - l1 - room);
    assert_eq!(append_one(&mut log, &p2), 2);
    payloads.insert(2, p2);
    backend.on.store(true, Ordering::SeqCst);
    let per_seg = (s as usize - hdr) / f;
    let target = b + per_seg as u64 + 6;
    let mut checked = 0;
    while log.next() < target {
        let first = log.next();
        let ps: Vec<Vec<u8>> = (first..first + batch as u64)
            .map(|o| new_payload(o, plen))
            .collect();
        for (o, p) in (first..).zip(&ps) {
            payloads.insert(o, p.clone());
        }
        assert_eq!(append_all(&mut log, &ps), first);
        let images = std::mem::take(&mut *backend.images.lock().expect("lock"));
        for (img, what) in images {
            check_image(
                &img,
                &format!(
                    "s={s} f={f} batch={batch} appending [{first}, {}): {what}",
                    first + batch as u64
                ),
                dir,
                cfg,
                &payloads,
                first + batch as u64,
                plen,
            );
            checked += 1;
        }
        // And killed after the append (as a clean drop leaves it too).
        check_image(
            &sim.process_crash_now(),
            &format!("s={s} f={f} batch={batch} after [{first}, ..)"),
            dir,
            cfg,
            &payloads,
            first + batch as u64,
            plen,
        );
    }
    assert!(
        log.reader().snapshot().len() >= 3,
        "rolled past the reused file"
    );
    checked
}

#[test]
fn every_kill_point_of_writes_into_a_reused_file_small_records() {
    let mut n = 0;
    for f in [64usize, 100, 1000, 4096, 4097] {
        for batch in [1usize, 3, 17] {
            n += every_cut_into_a_reused_file(64 * 1024, f, batch);
        }
    }
    eprintln!("{n} cut images checked");
}

#[test]
fn every_kill_point_of_writes_into_a_reused_file_large_records() {
    let mut n = 0;
    for f in [5000usize, 20_000, 70_000, 200_000] {
        for batch in [1usize, 2, 5] {
            n += every_cut_into_a_reused_file(512 * 1024, f, batch);
        }
    }
    eprintln!("{n} cut images checked");
}

/// Fresh files: zeros 1 MiB ahead of the records, capped at the segment size.
#[test]
fn fresh_files_are_zeroed_a_mib_ahead() {
    for s in [64 * 1024u64, 4 << 20] {
        let cfg = LogConfig {
            segment_bytes: s,
            index_interval_bytes: 4096,
            max_body: 4 << 20,
            preallocate: true,
            visible_when_synced: true,
            seal_in_background: false,
        };
        let sim = crate::io::sim::SimFs::new(1);
        let fs = Fs::new(Arc::new(sim.clone()));
        let dir = Path::new("/t");
        let mut log = TopicLog::open(&fs, dir, cfg, 0).expect("open");
        let mut prev: Option<(u64, u64)> = None;
        // The zeros ahead start small and double at each extension (`preallocate`).
        let mut step = PREALLOCATE_MIN_BYTES;
        for len in [
            100usize, 1_500_000, 10, 2_000_000, 10, 300_000, 300_000, 300_000,
        ] {
            append_one(&mut log, &vec![9u8; len]);
            let seg = log.active().clone();
            let flen = sim.read_file(&seg.path).expect("file").len() as u64;
            let bytes = sim.read_file(&seg.path).expect("file");
            let end = seg.written().bytes;
            let grew = prev.is_none_or(|(b, l)| b != seg.base || l != flen);
            if grew {
                assert_eq!(flen, end.max((end + step).min(s)), "s={s} len={len}");
                step = (step * 2).min(PREALLOCATE_BYTES);
            }
            assert!(
                bytes[end as usize..].iter().all(|&b| b == 0),
                "s={s}: zeros after the records"
            );
            prev = Some((seg.base, flen));
        }
    }
}

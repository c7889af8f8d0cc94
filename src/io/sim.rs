//! A simulated file system for power-loss tests (redb's crash-consistency idea).
//!
//! Every file has a *live* image (what reads see) and a *durable* one (what survives a
//! power cut). Writes land in live and are remembered as pending; `sync_data` makes them
//! durable. Directory entries (hard links too) are durable after `sync_dir` of their directory. At the cut
//! point (the N-th mutating operation) a crash image is taken: the durable data plus a
//! random prefix of each file's pending writes, the last of which may be torn at a
//! 512-byte sector boundary, and the durable directory entries (each undurable creation
//! or deletion survives or not at random). The live system keeps running, so a workload
//! can go on and record which calls returned before the cut.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{Backend, FileIo};

/// Sectors are written whole: a torn write keeps a prefix of whole sectors.
const SECTOR: u64 = 512;

#[derive(Clone, Debug)]
enum Pending {
    Write(u64, Vec<u8>),
    SetLen(u64),
}

#[derive(Clone, Debug, Default)]
struct SimFile {
    live: Vec<u8>,
    durable: Vec<u8>,
    pending: Vec<Pending>,
    /// A sync failed and dropped pending changes: `live` is no longer `durable` plus
    /// `pending` (what Linux's page cache does after a failed `fsync`).
    lost: bool,
}

/// The failure `fail_writes_to` or `fail_syncs_of` injects.
#[derive(Clone, Debug)]
struct Failing {
    path: PathBuf,
    /// Only syncs fail; writes and truncations land in the live image.
    syncs_only: bool,
    /// Only the next sync fails (`fail_one_sync_of`).
    once: bool,
}

#[derive(Debug, Default)]
struct State {
    next_id: u64,
    files: HashMap<u64, SimFile>,
    names: BTreeMap<PathBuf, u64>,
    durable_names: BTreeMap<PathBuf, u64>,
    dirs: BTreeSet<PathBuf>,
    ops: u64,
    /// Operation numbers of every `sync_data`/`sync_dir`.
    sync_ops: Vec<u64>,
    cut_at_op: Option<u64>,
    image: Option<Box<State>>,
    rng: u64,
    /// Which boot this is: a power cut starts the next one, a process crash does not.
    boot: u64,
    /// Syncs waiting in `hold_syncs`.
    syncs_waiting: usize,
}

/// The simulated file system. Clones share it.
#[derive(Clone, Debug, Default)]
pub struct SimFs {
    state: Arc<Mutex<State>>,
    /// While `true`, syncs wait (`hold_syncs`): a disk whose flush takes as long as a test
    /// needs. Not part of the state a crash image copies.
    held: Arc<(Mutex<bool>, std::sync::Condvar)>,
    /// Writes, syncs and truncations of the file at this path fail (`fail_writes_to`), or
    /// only its syncs (`fail_syncs_of`). Not part of the state a crash image copies either.
    failing: Arc<Mutex<Option<Failing>>>,
    /// Syncs of the file at this path wait while set (`hold_syncs_of`: a slow disk under
    /// one file). Not part of the state a crash image copies.
    held_file: Arc<Mutex<Option<PathBuf>>>,
    /// The bound on files kept open of an `Fs` made over this (0: the default), see
    /// `limit_open_files`. Not part of the state a crash image copies.
    open_files_max: Arc<std::sync::atomic::AtomicUsize>,
    /// Existing files opened again (`open`), for tests that show files were closed and
    /// reopened. Not part of the state a crash image copies.
    opens: Arc<std::sync::atomic::AtomicU64>,
    /// Opening an existing file at this path fails (`fail_opens_of`: out of descriptors).
    /// Not part of the state a crash image copies.
    failing_opens: Arc<Mutex<Option<PathBuf>>>,
}

/// See [`SimFs::faults_cleared_on_drop`].
#[derive(Debug)]
pub struct ClearFaults(SimFs);

impl Drop for ClearFaults {
    fn drop(&mut self) {
        self.0.set_failing(None, false, false);
        self.0.hold_syncs_of(None);
        self.0.hold_syncs(false);
    }
}

impl SimFs {
    /// An empty file system; `seed` drives every random choice of the crash image.
    pub fn new(seed: u64) -> SimFs {
        let fs = SimFs::default();
        fs.lock().rng = seed | 1;
        fs
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many times an existing file was opened (`open`): a reopen after a close, or at
    /// an instance's open.
    pub fn opens(&self) -> u64 {
        self.opens.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// An `Fs` made over this from now on keeps at most `max` files open (its
    /// `OpenFiles` bound): closes and reopens in a test of a few topics.
    pub fn limit_open_files(&self, max: usize) {
        self.open_files_max
            .store(max, std::sync::atomic::Ordering::Relaxed);
    }

    /// Makes every sync (`sync_data`, `sync_dir`) from now on wait until `hold_syncs(false)`,
    /// outside the file system's lock: a slow flush, to see what it holds up.
    pub fn hold_syncs(&self, hold: bool) {
        let (lock, cv) = &*self.held;
        *lock.lock().unwrap_or_else(|e| e.into_inner()) = hold;
        cv.notify_all();
    }

    /// From now on (until `None`), writes, syncs and truncations of the file named `path`
    /// fail with an I/O error, and so does creating it: a disk going bad under one file
    /// (a directory: creating or removing it, and its syncs).
    /// A failed sync of a file drops its changes since the last sync, as `fail_syncs_of`.
    pub fn fail_writes_to(&self, path: Option<&Path>) {
        self.set_failing(path, false, false);
    }

    /// From now on (until `None`), syncs of the file named `path` fail with an I/O error
    /// while its writes land. As Linux's page cache after a failed `fsync`, the changes
    /// since the last sync stay visible but are dropped: no later sync writes them, so a
    /// power cut loses them even behind later synced data (the "fsyncgate" behaviour).
    /// Stricter than Linux, where a later write to the same page dirties it again.
    pub fn fail_syncs_of(&self, path: Option<&Path>) {
        self.set_failing(path, true, false);
    }

    /// Makes every `open` of the existing file at `path` fail as if out of descriptors
    /// (`EMFILE`), until `fail_opens_of(None)`; its writes and syncs go on.
    pub fn fail_opens_of(&self, path: Option<&Path>) {
        *self.failing_opens.lock().unwrap_or_else(|e| e.into_inner()) = path.map(Path::to_owned);
    }

    /// A guard that, when dropped, lets every held sync go and fails nothing any more:
    /// however a test ends (a panic included), a log it drops then does not wait forever
    /// for a sealing held inside its sync.
    pub fn faults_cleared_on_drop(&self) -> ClearFaults {
        ClearFaults(self.clone())
    }

    /// The next sync of the file named `path` fails, later ones succeed: as Linux, which
    /// reports a file's writeback error to one `fsync` only (per descriptor), so another
    /// thread's sync of the same file a moment later returns success. The failed sync
    /// drops the file's pending changes, as `fail_syncs_of`.
    pub fn fail_one_sync_of(&self, path: &Path) {
        self.set_failing(Some(path), true, true);
    }

    fn set_failing(&self, path: Option<&Path>, syncs_only: bool, once: bool) {
        *self.failing.lock().unwrap_or_else(|e| e.into_inner()) = path.map(|p| Failing {
            path: p.to_path_buf(),
            syncs_only,
            once,
        });
    }

    /// The error injected into a write or truncation (`sync` false) or a sync of file
    /// `id`, if it is the failing one.
    fn injected(&self, s: &State, id: u64, sync: bool) -> std::io::Result<()> {
        self.injected_if(sync, |p| s.names.get(p) == Some(&id))
    }

    /// The error injected, if the failing path is one `is_it` names.
    fn injected_if(&self, sync: bool, is_it: impl FnOnce(&Path) -> bool) -> std::io::Result<()> {
        let mut failing = self.failing.lock().unwrap_or_else(|e| e.into_inner());
        match failing.as_ref() {
            Some(f) if (sync || !f.syncs_only) && is_it(&f.path) => {
                if f.once {
                    *failing = None;
                }
                Err(std::io::Error::other(
                    "injected I/O error (SimFs::fail_writes_to/fail_syncs_of)",
                ))
            }
            _ => Ok(()),
        }
    }

    /// Makes syncs of the file named `path` wait until `hold_syncs_of(None)` (a slow disk
    /// under one file).
    pub fn hold_syncs_of(&self, path: Option<&Path>) {
        let (lock, cv) = &*self.held;
        let _g = lock.lock().unwrap_or_else(|e| e.into_inner());
        *self.held_file.lock().unwrap_or_else(|e| e.into_inner()) = path.map(Path::to_path_buf);
        cv.notify_all();
    }

    fn wait_while_file_held(&self, id: u64) {
        let (lock, cv) = &*self.held;
        let mut g = lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut counted = false;
        loop {
            let held = self
                .held_file
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            let is_held = held.is_some_and(|p| self.lock().names.get(&p) == Some(&id));
            if !is_held {
                if counted {
                    self.lock().syncs_waiting -= 1;
                }
                return;
            }
            if !counted {
                self.lock().syncs_waiting += 1;
                counted = true;
            }
            g = cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Syncs waiting in `hold_syncs` or `hold_syncs_of` now.
    pub fn syncs_waiting(&self) -> usize {
        self.lock().syncs_waiting
    }

    fn wait_while_held(&self) {
        let (lock, cv) = &*self.held;
        let mut held = lock.lock().unwrap_or_else(|e| e.into_inner());
        if *held {
            self.lock().syncs_waiting += 1;
            while *held {
                held = cv.wait(held).unwrap_or_else(|e| e.into_inner());
            }
            self.lock().syncs_waiting -= 1;
        }
    }

    /// Cuts the power just before the `op`-th mutating operation (1-based).
    pub fn cut_at_op(&self, op: u64) {
        self.lock().cut_at_op = Some(op);
    }

    /// Mutating operations so far (writes, resizes, syncs, creations, deletions).
    pub fn ops(&self) -> u64 {
        self.lock().ops
    }

    /// The operation number of every sync so far (cut there: just before it lands).
    pub fn sync_points(&self) -> Vec<u64> {
        self.lock().sync_ops.clone()
    }

    /// Whether the cut has happened.
    pub fn is_cut(&self) -> bool {
        self.lock().image.is_some()
    }

    /// A file system on `state`, with no fault of this one's, and its bound on open files.
    fn image_fs(&self, state: State) -> SimFs {
        let max = self
            .open_files_max
            .load(std::sync::atomic::Ordering::Relaxed);
        SimFs {
            state: Arc::new(Mutex::new(state)),
            held: Arc::default(),
            failing: Arc::default(),
            held_file: Arc::default(),
            open_files_max: Arc::new(max.into()),
            opens: Arc::default(),
            failing_opens: Arc::default(),
        }
    }

    /// The file system as it is after the power cut (a fresh, uncut one), or `None` if
    /// the cut point was never reached.
    pub fn crash_image(&self) -> Option<SimFs> {
        let mut s = self.lock();
        let image = s.image.take()?;
        Some(self.image_fs(*image))
    }

    /// The file system as if the power were cut now.
    pub fn crash_now(&self) -> SimFs {
        let mut s = self.lock();
        let image = s.take_image();
        self.image_fs(image)
    }

    /// The file system as a process killed now leaves it: every write is there (the page
    /// cache survives a process), but what was not synced is still not durable, so a power
    /// cut later (`cut_at_op` on the copy) can still lose it. The copy counts operations
    /// from zero.
    pub fn process_crash_now(&self) -> SimFs {
        let s = self.lock();
        let copy = State {
            next_id: s.next_id,
            files: s.files.clone(),
            names: s.names.clone(),
            durable_names: s.durable_names.clone(),
            dirs: s.dirs.clone(),
            ops: 0,
            sync_ops: Vec::new(),
            cut_at_op: None,
            image: None,
            rng: s.rng,
            boot: s.boot,
            syncs_waiting: 0,
        };
        self.image_fs(copy)
    }

    /// As `process_crash_now`, killed inside its last write to `path` (not synced since):
    /// only the bytes of that write below `upto` are there. The kernel copies a write page
    /// by page and stops at a fatal signal, so `upto` should be a page boundary.
    pub fn process_crash_in_last_write(&self, path: &Path, upto: u64) -> SimFs {
        let image = self.process_crash_now();
        {
            let mut s = image.lock();
            let id = *s.names.get(path).expect("the file exists");
            let f = s.files.get_mut(&id).expect("the file");
            // `live` is rebuilt from `durable` and `pending` below.
            assert!(
                !f.lost,
                "a failed sync dropped changes to {}",
                path.display()
            );
            let Some(Pending::Write(pos, bytes)) = f.pending.pop() else {
                panic!(
                    "the last change to {} since its sync is not a write",
                    path.display()
                );
            };
            let keep = upto.clamp(pos, pos + bytes.len() as u64) - pos;
            let cut = bytes[..keep as usize].to_vec();
            let mut live = f.durable.clone();
            for p in &f.pending {
                match p {
                    Pending::SetLen(len) => live.resize(*len as usize, 0),
                    Pending::Write(at, b) => write_into(&mut live, *at, b),
                }
            }
            write_into(&mut live, pos, &cut);
            f.live = live;
            f.pending.push(Pending::Write(pos, cut));
        }
        image
    }

    /// Bytes of a file as currently visible (for tests that corrupt files on purpose).
    pub fn read_file(&self, path: &Path) -> Option<Vec<u8>> {
        let s = self.lock();
        let id = s.names.get(path)?;
        s.files.get(id).map(|f| f.live.clone())
    }
}

impl State {
    fn next_rand(&mut self) -> u64 {
        // xorshift64*: deterministic from the seed.
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_rand() % n }
    }

    /// Counts a mutating operation; takes the crash image at the cut point.
    fn tick(&mut self) {
        self.ops += 1;
        if self.cut_at_op == Some(self.ops) && self.image.is_none() {
            let image = self.take_image();
            self.image = Some(Box::new(image));
        }
    }

    fn take_image(&mut self) -> State {
        let mut names = self.durable_names.clone();
        // Entry changes not yet made durable by a directory sync may or may not survive.
        let live: Vec<(PathBuf, u64)> = self.names.iter().map(|(p, i)| (p.clone(), *i)).collect();
        for (p, id) in live {
            if names.get(&p) != Some(&id) && self.below(2) == 0 {
                names.insert(p, id);
            }
        }
        let durable: Vec<PathBuf> = names.keys().cloned().collect();
        for p in durable {
            if !self.names.contains_key(&p) && self.below(2) == 0 {
                names.remove(&p);
            }
        }
        let mut files = HashMap::new();
        let ids: Vec<u64> = names.values().copied().collect();
        for id in ids {
            let Some(f) = self.files.get(&id).cloned() else {
                continue;
            };
            let mut data = f.durable.clone();
            let k = self.below(f.pending.len() as u64 + 1) as usize;
            for (i, p) in f.pending.iter().take(k).enumerate() {
                match p {
                    Pending::SetLen(len) => data.resize(*len as usize, 0),
                    Pending::Write(pos, bytes) => {
                        let mut bytes = &bytes[..];
                        if i + 1 == k && self.below(2) == 0 {
                            // Torn: only the first whole sectors reached the disk.
                            let end = pos + bytes.len() as u64;
                            let mut cut =
                                (pos / SECTOR + 1 + self.below(end / SECTOR - pos / SECTOR + 1))
                                    * SECTOR;
                            cut = cut.clamp(*pos, end);
                            bytes = &bytes[..(cut - pos) as usize];
                        }
                        write_into(&mut data, *pos, bytes);
                    }
                }
            }
            files.insert(
                id,
                SimFile {
                    live: data.clone(),
                    durable: data,
                    pending: Vec::new(),
                    lost: false,
                },
            );
        }
        State {
            next_id: self.next_id,
            files,
            names: names.clone(),
            durable_names: names,
            dirs: self.dirs.clone(),
            rng: self.next_rand() | 1,
            boot: self.boot + 1,
            ..State::default()
        }
    }

    fn file(&mut self, id: u64) -> std::io::Result<&mut SimFile> {
        self.files
            .get_mut(&id)
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "file vanished"))
    }

    fn create(&mut self, path: &Path) -> std::io::Result<u64> {
        let parent = path.parent().map(Path::to_path_buf).unwrap_or_default();
        if !self.dirs.contains(&parent) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no such directory",
            ));
        }
        self.tick();
        self.next_id += 1;
        let id = self.next_id;
        self.files.insert(id, SimFile::default());
        self.names.insert(path.to_owned(), id);
        Ok(id)
    }
}

fn write_into(data: &mut Vec<u8>, pos: u64, bytes: &[u8]) {
    let end = pos as usize + bytes.len();
    if data.len() < end {
        data.resize(end, 0);
    }
    data[pos as usize..end].copy_from_slice(bytes);
}

#[derive(Debug)]
struct SimHandle {
    fs: SimFs,
    id: u64,
}

impl FileIo for SimHandle {
    fn len(&self) -> std::io::Result<u64> {
        let mut s = self.fs.lock();
        Ok(s.file(self.id)?.live.len() as u64)
    }

    fn read_at(&self, buf: &mut [u8], pos: u64) -> std::io::Result<usize> {
        let mut s = self.fs.lock();
        let f = s.file(self.id)?;
        let start = (pos as usize).min(f.live.len());
        let n = buf.len().min(f.live.len() - start);
        buf[..n].copy_from_slice(&f.live[start..start + n]);
        Ok(n)
    }

    fn write_all_at(&self, buf: &[u8], pos: u64) -> std::io::Result<()> {
        let mut s = self.fs.lock();
        self.fs.injected(&s, self.id, false)?;
        s.tick();
        let f = s.file(self.id)?;
        write_into(&mut f.live, pos, buf);
        f.pending.push(Pending::Write(pos, buf.to_vec()));
        Ok(())
    }

    fn sync_data(&self) -> std::io::Result<()> {
        self.fs.wait_while_held();
        self.fs.wait_while_file_held(self.id);
        let mut s = self.fs.lock();
        if let Err(e) = self.fs.injected(&s, self.id, true) {
            // The kernel marks the pages clean without writing them: dropped for good.
            let f = s.file(self.id)?;
            f.lost |= !f.pending.is_empty();
            f.pending.clear();
            return Err(e);
        }
        s.tick();
        let op = s.ops;
        s.sync_ops.push(op);
        let f = s.file(self.id)?;
        // Only what is pending: changes a failed sync dropped stay out of `durable`.
        for p in std::mem::take(&mut f.pending) {
            match p {
                Pending::SetLen(len) => f.durable.resize(len as usize, 0),
                Pending::Write(at, b) => write_into(&mut f.durable, at, &b),
            }
        }
        // A rewrite of the whole file (`Fs::rewrite_unsynced`) makes it whole again.
        if f.lost {
            f.lost = f.durable != f.live;
        }
        debug_assert!(
            f.lost || f.durable == f.live,
            "live is durable plus pending"
        );
        Ok(())
    }

    fn set_len(&self, len: u64) -> std::io::Result<()> {
        let mut s = self.fs.lock();
        self.fs.injected(&s, self.id, false)?;
        s.tick();
        let f = s.file(self.id)?;
        f.live.resize(len as usize, 0);
        f.pending.push(Pending::SetLen(len));
        Ok(())
    }
}

impl Backend for SimFs {
    fn create_new(&self, path: &Path) -> std::io::Result<Arc<dyn FileIo>> {
        self.injected_if(false, |p| p == path)?;
        let mut s = self.lock();
        if s.names.contains_key(path) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "file exists",
            ));
        }
        let id = s.create(path)?;
        Ok(Arc::new(SimHandle {
            fs: self.clone(),
            id,
        }))
    }

    fn open(&self, path: &Path) -> std::io::Result<Arc<dyn FileIo>> {
        let failing = self.failing_opens.lock().unwrap_or_else(|e| e.into_inner());
        if failing.as_deref() == Some(path) {
            return Err(std::io::Error::from_raw_os_error(24)); // EMFILE
        }
        drop(failing);
        self.opens
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let s = self.lock();
        let id = *s
            .names
            .get(path)
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"))?;
        Ok(Arc::new(SimHandle {
            fs: self.clone(),
            id,
        }))
    }

    fn open_or_create(&self, path: &Path) -> std::io::Result<Arc<dyn FileIo>> {
        self.injected_if(false, |p| p == path)?;
        let mut s = self.lock();
        let id = match s.names.get(path) {
            Some(id) => *id,
            None => s.create(path)?,
        };
        Ok(Arc::new(SimHandle {
            fs: self.clone(),
            id,
        }))
    }

    fn remove_file(&self, path: &Path) -> std::io::Result<()> {
        let mut s = self.lock();
        if s.names.contains_key(path) {
            s.tick();
            s.names.remove(path);
        }
        Ok(())
    }

    fn file_stat(&self, path: &Path) -> std::io::Result<super::FileStat> {
        let mut s = self.lock();
        let id = *s
            .names
            .get(path)
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"))?;
        // A file made anew has a new id. Sealed segments, the only files compared by
        // identity (in `sealed.sum`, by base), are not written again; a kept file that a
        // roll reuses keeps its id, but under a base above any it had before.
        Ok(super::FileStat {
            len: s.file(id)?.live.len() as u64,
            identity: [id, 0],
        })
    }

    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        let mut s = self.lock();
        let id = *s
            .names
            .get(from)
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"))?;
        s.tick();
        s.names.remove(from);
        s.names.insert(to.to_owned(), id);
        Ok(())
    }

    fn hard_link(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        let mut s = self.lock();
        let id = *s
            .names
            .get(from)
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"))?;
        if s.names.contains_key(to) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "file exists",
            ));
        }
        let parent = to.parent().map(Path::to_path_buf).unwrap_or_default();
        if !s.dirs.contains(&parent) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no such directory",
            ));
        }
        // A new entry for the same file: like a creation, durable once its directory is
        // synced (`take_image` keeps or drops an unsynced entry at random).
        s.tick();
        s.names.insert(to.to_owned(), id);
        Ok(())
    }

    fn link_count(&self, path: &Path) -> std::io::Result<u64> {
        let s = self.lock();
        let id = *s
            .names
            .get(path)
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"))?;
        Ok(s.names.values().filter(|&&i| i == id).count() as u64)
    }

    fn list_dir(&self, dir: &Path) -> std::io::Result<Vec<String>> {
        let s = self.lock();
        if !s.dirs.contains(dir) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no such directory",
            ));
        }
        let mut out: Vec<String> = s
            .names
            .keys()
            .chain(s.dirs.iter())
            .filter(|p| p.parent() == Some(dir))
            .filter_map(|p| p.file_name().and_then(|n| n.to_str()).map(str::to_owned))
            .collect();
        out.sort();
        out.dedup();
        Ok(out)
    }

    fn create_dir_all(&self, dir: &Path) -> std::io::Result<()> {
        if self.is_dir(dir).is_none() {
            // Making the failing path fails (`fail_writes_to`); an existing one is left be.
            self.injected_if(false, |p| p == dir)?;
        }
        let mut s = self.lock();
        // Directories are modelled as durable once made; only file entries need syncs.
        for a in dir.ancestors() {
            s.dirs.insert(a.to_owned());
        }
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
        self.wait_while_held();
        self.injected_if(true, |p| p == dir)?;
        let mut s = self.lock();
        s.tick();
        let op = s.ops;
        s.sync_ops.push(op);
        let live: Vec<(PathBuf, u64)> = s
            .names
            .iter()
            .filter(|(p, _)| p.parent() == Some(dir))
            .map(|(p, i)| (p.clone(), *i))
            .collect();
        s.durable_names.retain(|p, _| p.parent() != Some(dir));
        s.durable_names.extend(live);
        Ok(())
    }

    fn remove_dir(&self, dir: &Path) -> std::io::Result<()> {
        self.injected_if(false, |p| p == dir)?;
        let mut s = self.lock();
        if !s.dirs.contains(dir) {
            return Ok(());
        }
        let inside = |p: &PathBuf| p.parent() == Some(dir);
        if s.names.keys().any(inside) || s.dirs.iter().any(inside) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::DirectoryNotEmpty,
                "directory not empty",
            ));
        }
        // Modelled as durable at once, as a creation (`create_dir_all`).
        s.tick();
        s.dirs.remove(dir);
        Ok(())
    }

    /// Small: a test's few records fill it, so its checkpoints run in every test.
    fn journal_bytes(&self) -> Option<u64> {
        Some(4 << 10)
    }

    fn open_files_max(&self) -> Option<usize> {
        match self
            .open_files_max
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            0 => None,
            n => Some(n),
        }
    }

    fn boot_mark(&self, _dir: &Path) -> Option<String> {
        Some(format!("simulated boot {}", self.lock().boot))
    }

    fn is_dir(&self, path: &Path) -> Option<bool> {
        let s = self.lock();
        if s.dirs.contains(path) {
            Some(true)
        } else if s.names.contains_key(path) {
            Some(false)
        } else {
            None
        }
    }

    fn is_real(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsynced_data_and_entries_may_be_lost_synced_ones_never() {
        for seed in 1..50 {
            let fs = SimFs::new(seed);
            fs.create_dir_all(Path::new("/d")).expect("dir");
            let a = fs.create_new(Path::new("/d/a")).expect("create");
            a.write_all_at(b"durable", 0).expect("write");
            a.sync_data().expect("sync");
            fs.sync_dir(Path::new("/d")).expect("sync dir");
            a.write_all_at(&[7u8; 2000], 7).expect("write");
            let image = fs.crash_now();
            let got = image
                .read_file(Path::new("/d/a"))
                .expect("synced entry survives");
            assert_eq!(&got[..7], b"durable");
            assert!(
                got.len() == 7 || got.len().is_multiple_of(SECTOR as usize) || got.len() == 2007
            );
        }
    }

    #[test]
    fn a_power_cut_starts_another_boot_a_process_crash_does_not() {
        let fs = SimFs::new(1);
        let d = Path::new("/d");
        let mark = fs.boot_mark(d);
        assert!(mark.is_some());
        assert_eq!(fs.process_crash_now().boot_mark(d), mark);
        let cut = fs.crash_now();
        assert_ne!(cut.boot_mark(d), mark);
        assert_ne!(cut.crash_now().boot_mark(d), cut.boot_mark(d));
        fs.cut_at_op(1);
        fs.create_dir_all(d).expect("dir");
        fs.create_new(Path::new("/d/a")).expect("create");
        assert_ne!(fs.crash_image().expect("cut").boot_mark(d), mark);
    }

    /// As Linux after a failed `fsync`: the write stays readable, no later sync makes it
    /// durable, and writes after it are synced as usual.
    #[test]
    fn a_failed_sync_drops_the_writes_it_covered_for_good() {
        let fs = SimFs::new(3);
        let p = Path::new("/d/a");
        fs.create_dir_all(Path::new("/d")).expect("dir");
        let a = fs.create_new(p).expect("create");
        fs.sync_dir(Path::new("/d")).expect("sync dir");
        a.write_all_at(b"one", 0).expect("write");
        fs.fail_syncs_of(Some(p));
        assert!(a.sync_data().is_err(), "injected");
        fs.fail_syncs_of(None);
        a.write_all_at(b"two", 3).expect("write");
        a.sync_data().expect("sync");
        assert_eq!(fs.read_file(p).expect("live"), b"onetwo");
        assert_eq!(
            fs.process_crash_now().read_file(p).expect("same boot"),
            b"onetwo"
        );
        assert_eq!(
            fs.crash_now().read_file(p).expect("after a cut"),
            b"\0\0\0two"
        );
    }
}

//! Checkpoints: the segment files one journal file made durable are synced, then that
//! file is emptied (a header of a new generation). A checkpoint runs on a thread of its
//! own while the sync thread writes its rounds to the other file: with a thousand topics
//! it is a thousand `fdatasync`s, which no publisher should wait for.

use std::sync::Arc;
use std::thread::JoinHandle;

use super::half::empty;
use crate::io::DataFile;
use crate::log::segment::Segment;

/// A checkpoint under way.
pub(super) struct Running {
    run: Run,
    /// Which file, and the generation its header gets.
    pub(super) half: usize,
    pub(super) generation: u64,
}

/// Where a checkpoint runs.
enum Run {
    Thread(JoinHandle<Outcome>),
    /// Done already: the thread could not be started, so it ran on the caller's.
    Done(Outcome),
}

/// A checkpoint's end: the file back, and whether every sync and the emptying succeeded.
pub(super) struct Outcome {
    pub(super) file: DataFile,
    pub(super) ok: bool,
}

/// What a checkpoint works on: taken by whichever thread runs it.
type Job = std::sync::Mutex<Option<(DataFile, Vec<Arc<Segment>>)>>;

/// Starts the checkpoint of `file` (journal file `half`), whose entries made `segments`
/// durable; its header gets `generation`. Runs it here if no thread can be started.
pub(super) fn start(
    half: usize,
    file: DataFile,
    segments: Vec<Arc<Segment>>,
    generation: u64,
) -> Running {
    let job: Arc<Job> = Arc::new(std::sync::Mutex::new(Some((file, segments))));
    let spawned = {
        let job = job.clone();
        std::thread::Builder::new()
            .name("spool-checkpoint".into())
            .spawn(move || run(&job, generation))
    };
    let run = match spawned {
        Ok(join) => Run::Thread(join),
        // The thread never ran: the job is still there.
        Err(e) => {
            tracing::warn!(error = %e, "no thread for the journal's checkpoint: it runs on the sync thread");
            Run::Done(run(&job, generation))
        }
    };
    Running {
        run,
        half,
        generation,
    }
}

fn run(job: &Job, generation: u64) -> Outcome {
    let (file, segments) = job
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take()
        .expect("a checkpoint runs once");
    let ok = sync_all(&segments) && emptied(&file, generation);
    Outcome { file, ok }
}

impl Running {
    /// Waits for the checkpoint; `None` if its thread panicked.
    pub(super) fn finish(self) -> Option<Outcome> {
        match self.run {
            Run::Done(done) => Some(done),
            Run::Thread(join) => join.join().ok(),
        }
    }
}

/// Empties `file`; whether it could.
fn emptied(file: &DataFile, generation: u64) -> bool {
    match empty(file, generation) {
        Ok(()) => true,
        Err(e) => {
            tracing::error!(error = %e, "emptying a journal file failed");
            false
        }
    }
}

/// Syncs `segments` (several at once when there are many: each sync waits on the disk);
/// whether all succeeded. A failure poisons its topic (`Segment::sync`).
pub(super) fn sync_all(segments: &[Arc<Segment>]) -> bool {
    const THREADS: usize = 8;
    if segments.len() < 2 * THREADS {
        return segments.iter().all(|s| s.sync().is_ok());
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failed = std::sync::atomic::AtomicBool::new(false);
    let work = || {
        use std::sync::atomic::Ordering::Relaxed;
        while let Some(s) = segments.get(next.fetch_add(1, Relaxed)) {
            if s.sync().is_err() {
                failed.store(true, Relaxed);
            }
        }
    };
    std::thread::scope(|scope| {
        for _ in 1..THREADS {
            // A thread the system refuses is no error: fewer do the work.
            let _ = std::thread::Builder::new()
                .name("spool-checkpoint".into())
                .spawn_scoped(scope, work);
        }
        work();
    });
    !failed.into_inner()
}

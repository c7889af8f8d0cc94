//! Helpers the queue's unit tests share (test only): engines on a temporary directory or
//! the simulated file system, records to consume, and waits for the catalog.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::catalog::GroupRecord;
use crate::format::Headers;
use crate::io::Fs;
use crate::io::sim::SimFs;
use crate::options::{Options, SyncPolicy};

use super::{Engine, GroupRef, Ticket};

/// Syncs an hour apart: rolls seal inline, and no background sync runs in a test.
pub(super) const HOUR: SyncPolicy = SyncPolicy::Interval(Duration::from_secs(3600));

/// An engine under `Sync=None` on a real temporary directory (kept alive by the guard).
pub(super) fn engine_on_disk() -> (tempfile::TempDir, Engine) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut o = Options::new(dir.path());
    o.sync = SyncPolicy::None;
    let e = Engine::open(Fs::real(), o, 1).expect("open");
    (dir, e)
}

/// An engine on the simulated file system, `Sync=None` (unclean stops are copies of it).
pub(super) fn sim_engine(fs: &SimFs) -> Engine {
    let mut o = Options::new("/data");
    o.sync = SyncPolicy::None;
    Engine::open(Fs::new(Arc::new(fs.clone())), o, 1).expect("open")
}

/// `n` records of 8 bytes on topic `t`.
pub(super) fn publish_records(e: &Engine, n: u64) {
    let body = [1u8; 8];
    let h = Headers::new();
    let batch: Vec<(&[u8], &Headers)> = (0..n).map(|_| (&body[..], &h)).collect();
    e.publish("t", &batch, 1).expect("publish");
}

/// The next auto-ack hand-out (acking `previous`), which must exist.
pub(super) fn hand_out(e: &Engine, r: &GroupRef, previous: Option<Ticket>) -> Ticket {
    let h = e.next_delivery(r, previous, false).expect("hand-out");
    h.expect("a record").ticket()
}

/// The image of group `group` of topic `t` the catalog holds.
pub(super) fn catalog_group(e: &Engine, group: &str) -> GroupRecord {
    e.catalog.groups().expect("groups")[&("t".to_owned(), group.to_owned())].clone()
}

/// Waits until the catalog decides a durable ack's ticket; whether its commit succeeded.
pub(super) fn wait_ticket(e: &Engine, t: u64) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(o) = e.ack_watch().outcome(t) {
            return o;
        }
        assert!(Instant::now() < deadline, "ticket {t} never decided");
        std::thread::sleep(Duration::from_micros(200));
    }
}

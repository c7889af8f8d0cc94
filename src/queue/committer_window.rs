//! Consumer-group state across the catalog's committer, in forced interleavings (review 29).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::test_support::{catalog_group, publish_records, sim_engine, wait_ticket};
use super::{Engine, GroupRef, Ticket};
use crate::catalog::{Op, Snapshotter};
use crate::io::sim::SimFs;

const CATALOG: &str = "/data/catalog.redb";

/// Stands for other threads that run in the committer's window between draining its
/// queue and taking the queued group snapshot (`run_committer`: `msgs.extend(rx.try_iter())`
/// ... `s.try_ops()`): it is queued just before the group's snapshot, so the committer asks
/// it first, and what it does lands exactly in that window. It does what a handler that
/// panics, then the redelivery and its explicit ack, do.
#[derive(Debug)]
struct InTheWindow {
    work: Mutex<Option<(Arc<Engine>, GroupRef, Ticket)>>,
    acked: Mutex<Option<u64>>,
}

impl Snapshotter for InTheWindow {
    fn try_ops(&self) -> Option<Vec<Op>> {
        if let Some((e, r, held)) = self.work.lock().expect("work").take() {
            // A delivery dropped while its thread panics: PutAttempt queued, not waited.
            e.charge_panicked(&r, held);
            // Redelivered at once and acked explicitly (the group's snapshot is still
            // queued, so the ack only takes a ticket).
            let again = e
                .next_delivery(&r, None, false)
                .expect("hand-out")
                .expect("the charged record again");
            assert_eq!(again.record.offset, held.offset);
            assert_eq!(again.attempt, 2);
            let t = e
                .ack_delivery(&r, again.ticket(), true)
                .expect("ack")
                .expect("ticket");
            *self.acked.lock().expect("acked") = Some(t);
        }
        Some(Vec::new())
    }
    fn key(&self) -> usize {
        0x5eed
    }
}

/// The attempt row `charge_panicked` queues without waiting must not land after the
/// deletion that the ack of the redelivered offset put in the group's snapshot, when that
/// snapshot was queued before the charge and taken after it (`run_committer`'s second
/// drain): else the row of a finished offset stays in the catalog and
/// `group_info().pending` lists it below the cursor for good.
#[test]
fn a_panic_charge_queued_in_the_committers_window_leaves_no_row_for_an_acked_offset() {
    let fs = SimFs::new(29);
    let _clear = fs.faults_cleared_on_drop();
    let e = Arc::new(sim_engine(&fs));
    publish_records(&e, 10);
    let r = e.register_consumer("t", "g", 2, 1).expect("consumer");
    let d0 = e
        .next_delivery(&r, None, false)
        .expect("hand-out")
        .expect("a record")
        .ticket();
    let d1 = e
        .next_delivery(&r, None, false)
        .expect("hand-out")
        .expect("a record")
        .ticket();
    assert_eq!((d0.offset, d1.offset), (0, 1));

    // The committer busy with a commit (its sync held), so that what follows is queued
    // together and taken in one round.
    fs.hold_syncs_of(Some(std::path::Path::new(CATALOG)));
    e.catalog
        .commit_then(vec![Op::SetClean(false)], Box::new(|_| {}));
    let deadline = Instant::now() + Duration::from_secs(20);
    while fs.syncs_waiting() == 0 {
        assert!(
            Instant::now() < deadline,
            "the commit never reached its sync"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let window = Arc::new(InTheWindow {
        work: Mutex::new(Some((e.clone(), r.clone(), d1))),
        acked: Mutex::new(None),
    });
    let w: Arc<dyn Snapshotter> = window.clone();
    e.catalog.ack_ticket(&w, true).expect("queued");
    // An explicit ack of offset 0 queues the group's snapshot (after the window).
    let t0 = e.ack_delivery(&r, d0, true).expect("ack").expect("ticket");
    fs.hold_syncs_of(None);

    wait_ticket(&e, t0).expect("ack 0 durable");
    let t1 = window.acked.lock().expect("acked").expect("the window ran");
    wait_ticket(&e, t1).expect("ack 1 durable");
    // Everything queued so far has landed.
    e.catalog.commit(&[Op::SetClean(false)]).expect("barrier");

    let rec = catalog_group(&e, "g");
    let rows = e.catalog.attempts("t", "g").expect("attempts");
    assert_eq!(rec.cursor, 2, "0 and 1 acked durably");
    e.close().expect("close");
    drop(r);
    drop(e);

    // Nor after a clean reopen does the group report the finished offset as pending.
    let e = sim_engine(&fs);
    let info = e.group_info("t", "g").expect("info");
    assert!(
        rows.keys().all(|&o| o >= rec.cursor)
            && info.pending.iter().all(|p| p.offset >= info.cursor),
        "cursor {} (acked 0 and 1) but attempt rows {:?}, pending after reopen {:?}",
        info.cursor,
        rows,
        info.pending
    );
    e.close().expect("close");
}

/// As docs/delivery.md, "Unclean stops", says: a manual delivery released (dropped) and then a kill
/// before the group's next commit is charged, as a delivery out at the last commit; once
/// any commit carries the release (the ticker's here) nothing is.
#[test]
fn a_release_is_charged_only_by_a_kill_before_the_next_group_commit() {
    let fs = SimFs::new(30);
    let e = sim_engine(&fs);
    publish_records(&e, 5);
    let r = e.register_consumer("t", "g", 1, 1).expect("consumer");
    let d = e
        .next_delivery(&r, None, false)
        .expect("hand-out")
        .expect("a record")
        .ticket();
    // A commit while it is out (the ticker's), then the release.
    e.commit_groups(false).expect("ticker");
    e.release_delivery(&r, d);
    let killed = fs.process_crash_now();
    // The same, with the ticker's commit after the release.
    e.commit_groups(false).expect("ticker");
    let killed_after_commit = fs.process_crash_now();
    drop(r);
    drop(e);

    let e = sim_engine(&killed);
    let p = e.group_info("t", "g").expect("info").pending;
    assert_eq!(
        p.len(),
        1,
        "released, then killed within the commit interval: charged"
    );
    assert_eq!((p[0].offset, p[0].attempts), (0, 1));
    assert_eq!(p[0].last_reason, crate::queue::UNCLEAN_STOP_REASON);
    drop(e);
    let e = sim_engine(&killed_after_commit);
    assert!(e.group_info("t", "g").expect("info").pending.is_empty());
}

//! Guards issue 3 point 9: a poison message whose handling kills the process still ends in
//! the dead-letter topic. A child process consumes and aborts on the payload "poison"; the
//! parent restarts it. Each unclean stop charges the delivery that was out (after the first
//! unclean stop the group commits before each hand-out, so the blame is exact), the limit
//! reached that way dead-letters on open, and the messages after it are then delivered.
//! Innocent messages are never dead-lettered.

mod common_groups;

use std::io::Write;
use std::path::Path;

use common_groups::{all_records, open, recv};
use spool::consts::{
    UNCLEAN_STOP_REASON, X_DEAD_LETTER_REASON, X_DELIVERY_ATTEMPTS, X_ORIGINAL_OFFSET,
};
use spool::{Headers, Spool};

const TOPIC: &str = "crashy.events";
const DLQ: &str = "crashy.events.dlq";
const GROUP: &str = "workers";
const PAYLOADS: [&str; 6] = ["m0", "m1", "poison", "m3", "m4", "m5"];
const POISON_OFFSET: u64 = 2;

/// The file where children note the offsets they handled, one a line, and `poison` each
/// time they receive the poison (just before aborting).
fn handled_path(dir: &Path) -> std::path::PathBuf {
    dir.join("handled.txt")
}

/// Offsets the children handled, in order.
fn handled_offsets(dir: &Path) -> Vec<u64> {
    std::fs::read_to_string(handled_path(dir))
        .unwrap()
        .lines()
        .filter_map(|l| l.parse().ok())
        .collect()
}

/// How many times a child received the poison (and aborted).
fn poison_crashes(dir: &Path) -> u32 {
    std::fs::read_to_string(handled_path(dir))
        .unwrap()
        .lines()
        .filter(|l| *l == "poison")
        .count() as u32
}

fn conn(max_attempts: u32) -> String {
    format!("Max Delivery Attempts={max_attempts}")
}

/// Child role `<auto|manual>:<max attempts>`: consumes everything, aborting on "poison";
/// exits cleanly once nothing is left.
#[tokio::test]
async fn child_consumer_that_dies_on_poison() {
    let Some((role, dir)) = common_groups::child_role() else {
        return;
    };
    let (mode, max) = role.split_once(':').unwrap();
    let mq = open(&dir, &conn(max.parse().unwrap()));
    let mut b = mq.consumer(TOPIC, GROUP);
    if mode == "manual" {
        b = b.manual_ack();
    }
    let mut c = b.build().unwrap();
    let mut handled = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(handled_path(&dir))
        .unwrap();
    while let Some(d) = c.recv_timeout(common_groups::NOTHING).await.unwrap() {
        if &d.payload()[..] == b"poison" {
            writeln!(handled, "poison").unwrap();
            handled.sync_all().unwrap();
            std::process::abort();
        }
        writeln!(handled, "{}", d.offset()).unwrap();
        handled.sync_all().unwrap();
        if mode == "manual" {
            d.ack().await.unwrap();
        }
    }
    c.close().await.unwrap();
    mq.close().await.unwrap();
}

async fn publish_all(mq: &Spool) {
    for p in PAYLOADS {
        mq.publish(TOPIC, p.as_bytes().to_vec(), &Headers::new())
            .await
            .unwrap();
    }
}

/// Restarts the child until it exits cleanly; returns how many runs aborted.
fn restart_until_done(dir: &Path, mode: &str, max: u32) -> u32 {
    restart_until_done_with(dir, mode, max, &[])
}

/// `restart_until_done` with extra environment for every child run.
fn restart_until_done_with(dir: &Path, mode: &str, max: u32, env: &[(&str, &str)]) -> u32 {
    let role = format!("{mode}:{max}");
    let mut aborted = 0;
    for _ in 0..max + 5 {
        let status =
            common_groups::run_child("child_consumer_that_dies_on_poison", &role, dir, env);
        if status.success() {
            return aborted;
        }
        common_groups::assert_aborted(status);
        aborted += 1;
    }
    panic!("the poison message kept crashing the consumer after {aborted} restarts");
}

async fn poison_reaches_the_dead_letter_topic(mode: &str, max: u32) {
    let dir = tempfile::tempdir().unwrap();
    {
        let mq = open(dir.path(), &conn(max));
        publish_all(&mq).await;
        mq.close().await.unwrap();
    }
    let aborted = restart_until_done(dir.path(), mode, max);
    // The first crash may come before anything recorded the poison as out; from then on
    // each crash is charged to it.
    assert!(
        (max..=max + 1).contains(&aborted),
        "{aborted} crashes for Max Delivery Attempts={max}"
    );

    let mq = open(dir.path(), &conn(max));
    let copies = all_records(&mq, DLQ).await;
    assert_eq!(copies.len(), 1, "only the poison is dead-lettered, once");
    let copy = &copies[0];
    assert_eq!(&copy.payload()[..], b"poison");
    let h = copy.headers();
    assert_eq!(
        h.get(X_ORIGINAL_OFFSET).map(String::as_str),
        Some(POISON_OFFSET.to_string().as_str())
    );
    assert_eq!(
        h.get(X_DEAD_LETTER_REASON).map(String::as_str),
        Some(UNCLEAN_STOP_REASON)
    );
    assert_eq!(
        h.get(X_DELIVERY_ATTEMPTS).map(String::as_str),
        Some(max.to_string().as_str())
    );

    let info = mq.group_info(TOPIC, GROUP).unwrap();
    assert_eq!(
        info.cursor,
        PAYLOADS.len() as u64,
        "everything after it was consumed"
    );
    assert_eq!(info.dead_lettered, 1);
    assert!(info.pending.is_empty(), "{:?}", info.pending);

    let handled = handled_offsets(dir.path());
    assert_eq!(poison_crashes(dir.path()), aborted);
    for o in [0, 1, 3, 4, 5] {
        assert!(handled.contains(&o), "offset {o} was handled: {handled:?}");
    }
    assert!(!handled.contains(&POISON_OFFSET));
    let after: Vec<u64> = handled
        .iter()
        .copied()
        .skip_while(|&o| o < POISON_OFFSET)
        .collect();
    assert_eq!(
        after,
        vec![3, 4, 5],
        "the rest came once, in order, after the poison"
    );
}

#[tokio::test]
async fn a_manual_ack_consumer_killed_by_poison_dead_letters_it() {
    poison_reaches_the_dead_letter_topic("manual", 3).await;
}

#[tokio::test]
async fn an_auto_ack_consumer_killed_by_poison_dead_letters_it() {
    poison_reaches_the_dead_letter_topic("auto", 3).await;
}

#[tokio::test]
async fn with_the_default_limit_of_five() {
    poison_reaches_the_dead_letter_topic("auto", 5).await;
}

/// Child role: takes one delivery of offset 0 (manual ack) and aborts while it is out.
#[tokio::test]
async fn child_dies_holding_one_delivery() {
    let Some((role, dir)) = common_groups::child_role() else {
        return;
    };
    assert_eq!(role, "hold-one");
    let mq = open(&dir, &conn(3));
    let mut c = common_groups::manual(&mq, TOPIC, GROUP, 1);
    let d = recv(&mut c).await;
    assert_eq!(d.offset(), 0);
    // Make sure the hand-out is recorded as out (what a periodic commit would do).
    mq.commit().unwrap();
    std::process::abort();
}

#[tokio::test]
async fn one_unclean_stop_charges_one_attempt_to_what_was_out_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mq = open(dir.path(), &conn(3));
        publish_all(&mq).await;
        mq.close().await.unwrap();
    }
    let status = common_groups::run_child(
        "child_dies_holding_one_delivery",
        "hold-one",
        dir.path(),
        &[],
    );
    common_groups::assert_aborted(status);

    let mq = open(dir.path(), &conn(3));
    let info = mq.group_info(TOPIC, GROUP).unwrap();
    assert_eq!(info.cursor, 0);
    assert_eq!(info.pending.len(), 1, "{:?}", info.pending);
    assert_eq!(info.pending[0].offset, 0);
    assert_eq!(info.pending[0].attempts, 1);
    assert_eq!(info.pending[0].last_reason, UNCLEAN_STOP_REASON);
    let mut c = common_groups::manual(&mq, TOPIC, GROUP, 1);
    let d = recv(&mut c).await;
    assert_eq!((d.offset(), d.attempt()), (0, 2));
    d.ack().await.unwrap();
    let d = recv(&mut c).await;
    assert_eq!(
        (d.offset(), d.attempt()),
        (1, 1),
        "innocent offsets are not charged"
    );
    d.ack().await.unwrap();
    drop(c);
    mq.close().await.unwrap();

    // A clean stop charges nothing.
    let mq = open(dir.path(), &conn(3));
    let info = mq.group_info(TOPIC, GROUP).unwrap();
    assert_eq!(info.cursor, 2);
    assert!(info.pending.is_empty());
    assert!(all_records(&mq, DLQ).await.is_empty());
}

/// Every run has a crash point inside dead-lettering armed, so the run whose open reaches
/// the limit dies half-way through routing the poison; the next open must finish the job
/// without a second copy.
async fn poison_routing_interrupted_at(point: &str) {
    let dir = tempfile::tempdir().unwrap();
    {
        let mq = open(dir.path(), &conn(3));
        publish_all(&mq).await;
        mq.close().await.unwrap();
    }
    let aborted = restart_until_done_with(dir.path(), "manual", 3, &[("SPOOL_CRASH_AT", point)]);
    let on_poison = poison_crashes(dir.path());
    assert!(
        (3..=4).contains(&on_poison),
        "{on_poison} crashes on the poison"
    );
    assert_eq!(aborted, on_poison + 1, "and one at {point}");
    let mq = open(dir.path(), &conn(3));
    let copies = all_records(&mq, DLQ).await;
    assert_eq!(copies.len(), 1, "routed once");
    assert_eq!(&copies[0].payload()[..], b"poison");
    assert_eq!(
        copies[0]
            .headers()
            .get(X_DEAD_LETTER_REASON)
            .map(String::as_str),
        Some(UNCLEAN_STOP_REASON)
    );
    let info = mq.group_info(TOPIC, GROUP).unwrap();
    assert_eq!(
        (info.cursor, info.dead_lettered),
        (PAYLOADS.len() as u64, 1)
    );
    assert!(info.pending.is_empty(), "{:?}", info.pending);
}

#[tokio::test]
async fn a_crash_after_the_copy_while_dead_lettering_on_open_routes_once() {
    poison_routing_interrupted_at("dead_letter.after_copy").await;
}

#[tokio::test]
async fn a_crash_after_the_intent_while_dead_lettering_on_open_routes_once() {
    poison_routing_interrupted_at("dead_letter.after_intent").await;
}

//! Guards issue 27 point 4 (groups): `groups` lists the groups with state on a topic,
//! `delete_group` forgets one (cursor, attempts, epoch) durably, refuses while a consumer
//! of it is open, and fences its deliveries still out; a power cut after it returned
//! never brings the group back.

mod common_core;
mod common_groups;

use common_groups::{open, publish_n, recv};
use spool::testing::{SimFs, without_background_work};
use spool::{Error, Options, SyncPolicy};

const TOPIC: &str = "lifecycle.events";

#[tokio::test]
async fn groups_lists_the_groups_with_state_sorted() {
    let dir = tempfile::tempdir().expect("dir");
    let mq = open(dir.path(), "");
    assert!(
        mq.groups(TOPIC).expect("groups").is_empty(),
        "unknown topic"
    );
    publish_n(&mq, TOPIC, 3).await;
    assert!(mq.groups(TOPIC).expect("groups").is_empty(), "no group yet");
    drop(mq.consumer(TOPIC, "zeta").build().expect("consumer"));
    mq.reset_offset(TOPIC, "alpha", spool::OffsetReset::Latest)
        .await
        .expect("reset");
    mq.ack(TOPIC, "mid", 0).await.expect("ack at the cursor");
    assert_eq!(mq.groups(TOPIC).expect("groups"), ["alpha", "mid", "zeta"]);
    assert!(matches!(
        mq.groups("bad/name"),
        Err(Error::InvalidTopicName { .. })
    ));
    mq.close().await.expect("close");
    let mq = open(dir.path(), "");
    assert_eq!(
        mq.groups(TOPIC).expect("groups"),
        ["alpha", "mid", "zeta"],
        "durable"
    );
}

#[tokio::test]
async fn a_deleted_group_starts_over_like_a_new_one_and_stays_deleted() {
    let dir = tempfile::tempdir().expect("dir");
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 3).await;
    {
        let mut c = common_groups::manual(&mq, TOPIC, "g", 1);
        recv(&mut c).await.ack().await.expect("ack 0");
        recv(&mut c).await.nack("bad").await.expect("nack 1");
    }
    mq.reset_offset(TOPIC, "g", spool::OffsetReset::Explicit(1))
        .await
        .expect("reset");
    let before = mq.group_info(TOPIC, "g").expect("info");
    assert_eq!(before.cursor, 1);
    mq.delete_group(TOPIC, "g").await.expect("delete");
    assert!(mq.groups(TOPIC).expect("groups").is_empty());
    mq.delete_group(TOPIC, "g")
        .await
        .expect("deleting a missing group is Ok");
    mq.delete_group("no.such.topic", "g")
        .await
        .expect("a missing topic too");

    mq.close().await.expect("close");
    let mq = open(dir.path(), "");
    assert!(
        mq.groups(TOPIC).expect("groups").is_empty(),
        "the deletion is durable"
    );
    let mut c = common_groups::manual(&mq, TOPIC, "g", 1);
    let d = recv(&mut c).await;
    assert_eq!(
        (d.offset(), d.attempt()),
        (0, 1),
        "a new group: the earliest offset, no attempts remembered"
    );
    d.ack().await.expect("ack");
    let info = mq.group_info(TOPIC, "g").expect("info");
    assert_eq!((info.cursor, info.pending.len()), (1, 0));
}

#[tokio::test]
async fn a_group_with_an_open_consumer_is_in_use() {
    let dir = tempfile::tempdir().expect("dir");
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 1).await;
    let c = mq.consumer(TOPIC, "g").build().expect("consumer");
    let r = mq.delete_group(TOPIC, "g").await;
    assert!(
        matches!(&r, Err(Error::GroupInUse { topic, group }) if topic == TOPIC && group == "g"),
        "{r:?}"
    );
    assert_eq!(mq.groups(TOPIC).expect("groups"), ["g"], "nothing changed");
    drop(c);
    mq.delete_group(TOPIC, "g")
        .await
        .expect("no consumer open any more");
}

#[tokio::test]
async fn a_delivery_of_a_deleted_group_is_stale_and_does_not_bring_it_back() {
    let dir = tempfile::tempdir().expect("dir");
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 2).await;
    let mut c = common_groups::manual(&mq, TOPIC, "g", 2);
    let (d0, d1) = (recv(&mut c).await, recv(&mut c).await);
    drop(c);
    mq.delete_group(TOPIC, "g").await.expect("delete");
    assert!(matches!(
        d0.ack().await,
        Err(Error::StaleDelivery { offset: 0 })
    ));
    assert!(matches!(
        d1.nack("late").await,
        Err(Error::StaleDelivery { offset: 1 })
    ));
    mq.commit().expect("the ticker's commit");
    assert!(mq.groups(TOPIC).expect("groups").is_empty());
    mq.close().await.expect("close");
    let mq = open(dir.path(), "");
    assert!(
        mq.groups(TOPIC).expect("groups").is_empty(),
        "no late image brought it back"
    );
}

/// A power cut at any point after `delete_group` returned finds the group gone; a cut
/// before it finds the group as it was (cursor and attempts), never half-deleted.
#[test]
fn a_power_cut_keeps_a_returned_deletion_and_never_half_of_one() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    let opts = || Options {
        sync: SyncPolicy::Always,
        max_delivery_attempts: 5,
        ..without_background_work(Options::new("/data"))
    };
    let (mut returned, mut kept) = (0, 0);
    for seed in 0..24u64 {
        let fs = SimFs::new(100 + seed);
        let mq = spool::Spool::open_simulated(opts(), &fs).expect("open");
        rt.block_on(async {
            for i in 0..3u8 {
                mq.publish(TOPIC, vec![i], &spool::Headers::new())
                    .await
                    .expect("publish");
            }
            mq.ack(TOPIC, "g", 0).await.expect("ack 0");
            mq.nack(TOPIC, "g", 1, "bad").await.expect("nack 1");
        });
        // Cut the power just before one of the deletion's file operations, or (past its
        // last one) not at all: then the image is taken after it returned.
        let (deleted, image, cut_inside) =
            common_core::cut_during(&fs, 1 + seed, || rt.block_on(mq.delete_group(TOPIC, "g")));
        drop(mq);
        let mq = spool::Spool::open_simulated(opts(), &image).expect("reopen");
        let groups = mq.groups(TOPIC).expect("groups");
        if !cut_inside {
            deleted.expect("the deletion ran whole");
            assert!(
                groups.is_empty(),
                "seed {seed}: a returned deletion was lost"
            );
            returned += 1;
        } else if !groups.is_empty() {
            let info = mq.group_info(TOPIC, "g").expect("info");
            assert_eq!(
                (info.cursor, info.pending.len()),
                (1, 1),
                "seed {seed}: the group as it was before the deletion, whole"
            );
            kept += 1;
        }
        drop(mq);
    }
    // Both sides were reached: the cuts fell inside the deletion and after it.
    assert!(returned > 0 && kept > 0, "returned {returned}, kept {kept}");
}

/// A group deleted and built again in the same instance keeps the new group's progress:
/// its first images must not be taken for older ones of the deleted group (the catalog
/// skips an image older than one it wrote for the same name).
#[tokio::test]
async fn a_group_made_anew_after_a_deletion_persists_its_progress() {
    let dir = tempfile::tempdir().expect("dir");
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 4).await;
    {
        let mut c = common_groups::manual(&mq, TOPIC, "g", 1);
        for _ in 0..4 {
            recv(&mut c).await.ack().await.expect("ack");
        }
    }
    mq.delete_group(TOPIC, "g").await.expect("delete");
    {
        let mut c = common_groups::manual(&mq, TOPIC, "g", 1);
        let d = recv(&mut c).await;
        assert_eq!(d.offset(), 0, "a new group starts at the earliest offset");
        d.ack().await.expect("ack");
    }
    mq.close().await.expect("close");
    let mq = open(dir.path(), "");
    assert_eq!(mq.groups(TOPIC).expect("groups"), ["g"]);
    assert_eq!(mq.group_info(TOPIC, "g").expect("info").cursor, 1);
}

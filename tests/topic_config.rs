//! Guards issue 27 point 5: per-topic retention overrides (`set_topic_config`, shown in
//! `TopicInfo::config`, durable) and `Retention Policy=Acked` (work-queue retention:
//! sealed segments every group of the topic finished are deleted; a topic with no group
//! keeps them; the limits still apply).

mod common_groups;

use common_groups::{open, recv};
use spool::{Error, Headers, RetentionPolicy, Spool, TopicConfig};

/// Publishes `n` records of 100 bytes (with 1 KiB segments: about 7 a segment).
async fn publish(mq: &Spool, topic: &str, n: usize) {
    for i in 0..n {
        mq.publish(topic, vec![i as u8; 100], &Headers::new())
            .await
            .expect("publish");
    }
}

#[tokio::test]
async fn a_topic_override_applies_to_that_topic_only_and_is_durable() {
    let dir = tempfile::tempdir().expect("dir");
    let conn = "Segment Bytes=1024;Retention Check Ms=3600000";
    let mq = open(dir.path(), conn);
    publish(&mq, "small", 60).await;
    publish(&mq, "big", 60).await;
    let limited = TopicConfig {
        retention_bytes: Some(2048),
        ..Default::default()
    };
    mq.set_topic_config("small", limited.clone())
        .await
        .expect("set");
    assert_eq!(mq.topic_info("small").expect("info").config, limited);
    assert_eq!(
        mq.topic_info("big").expect("info").config,
        TopicConfig::default()
    );
    mq.apply_retention().expect("retention");
    let (small, big) = (
        mq.topic_info("small").expect("info"),
        mq.topic_info("big").expect("info"),
    );
    assert!(small.earliest > 0 && small.bytes < 4096, "{small:?}");
    assert_eq!(big.earliest, 0, "the instance keeps everything: {big:?}");

    mq.close().await.expect("close");
    let mq = open(dir.path(), conn);
    assert_eq!(
        mq.topic_info("small").expect("info").config,
        limited,
        "durable"
    );
    assert!(matches!(
        mq.set_topic_config(
            "small",
            TopicConfig {
                retention_ms: Some(u64::MAX),
                ..Default::default()
            }
        )
        .await,
        Err(Error::InvalidConnectionString { .. })
    ));
    // A later setting replaces the earlier one whole.
    mq.set_topic_config("small", TopicConfig::default())
        .await
        .expect("clear");
    assert_eq!(
        mq.topic_info("small").expect("info").config,
        TopicConfig::default()
    );
}

#[tokio::test]
async fn acked_retention_deletes_what_every_group_finished_and_keeps_the_rest() {
    let dir = tempfile::tempdir().expect("dir");
    let mq = open(
        dir.path(),
        "Segment Bytes=1024;Retention Policy=acked;Retention Check Ms=3600000",
    );
    publish(&mq, "jobs", 60).await;
    publish(&mq, "no.groups", 60).await;
    let mut fast = common_groups::manual(&mq, "jobs", "fast", 1);
    let mut slow = common_groups::manual(&mq, "jobs", "slow", 1);
    for _ in 0..50 {
        recv(&mut fast).await.ack().await.expect("ack");
    }
    for _ in 0..20 {
        recv(&mut slow).await.ack().await.expect("ack");
    }
    mq.apply_retention().expect("retention");
    let jobs = mq.topic_info("jobs").expect("info");
    assert!(
        jobs.earliest > 0 && jobs.earliest <= 20,
        "only what both groups finished: {jobs:?}"
    );
    assert_eq!(
        mq.topic_info("no.groups").expect("info").earliest,
        0,
        "a topic with no group keeps everything"
    );
    let (f, s) = (
        mq.group_info("jobs", "fast").expect("fast"),
        mq.group_info("jobs", "slow").expect("slow"),
    );
    assert_eq!(
        (f.skipped, s.skipped),
        (0, 0),
        "nothing unfinished was deleted"
    );
    // The slow group catches up: more can go.
    for _ in 20..50 {
        recv(&mut slow).await.ack().await.expect("ack");
    }
    mq.apply_retention().expect("retention");
    let later = mq.topic_info("jobs").expect("info").earliest;
    assert!(later > jobs.earliest && later <= 50, "{later}");
    // A per-topic override turns it off for one topic.
    mq.set_topic_config(
        "jobs",
        TopicConfig {
            retention_policy: Some(RetentionPolicy::Limits),
            ..Default::default()
        },
    )
    .await
    .expect("set");
    for _ in 50..60 {
        recv(&mut fast).await.ack().await.expect("ack");
        recv(&mut slow).await.ack().await.expect("ack");
    }
    mq.apply_retention().expect("retention");
    assert_eq!(mq.topic_info("jobs").expect("info").earliest, later);
}

#[test]
fn retention_policy_parses_case_insensitively_and_refuses_other_values() {
    let o = spool::Options::parse("Data Source=/x;Retention Policy=ACKED").expect("parse");
    assert_eq!(o.retention_policy, RetentionPolicy::Acked);
    let o = spool::Options::parse("Data Source=/x").expect("parse");
    assert_eq!(o.retention_policy, RetentionPolicy::Limits, "the default");
    assert!(matches!(
        spool::Options::parse("Data Source=/x;Retention Policy=all"),
        Err(Error::InvalidConnectionString { key, .. }) if key == "Retention Policy"
    ));
}

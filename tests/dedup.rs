//! Guards message-id de-duplication: a hit returns the original offset and appends nothing
//! (also inside one batch), the window counts ids first-in first-out and a hit does not
//! refresh, 0 disables it, ids are validated (1..=256 UTF-8 bytes), and the window is
//! rebuilt from the log's tail on reopen and forgets ids whose records retention deleted.

mod common_core;

use common_core::{fast_options, fetch_all, headers, open, payload, tiny_segments, with_id};
use spool::{Error, Headers, Options, Spool};

fn id_msg(id: &str, seed: u64) -> (Vec<u8>, Headers) {
    (payload(seed, 40), with_id(id))
}

async fn next(mq: &Spool, topic: &str) -> u64 {
    mq.topic_info(topic).expect("topic_info").next
}

#[tokio::test]
async fn a_hit_returns_the_original_offset_and_appends_nothing() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mq = open(&fast_options(tmp.path()));
    assert_eq!(
        mq.publish("t", b"first".to_vec(), &with_id("order-1"))
            .await
            .expect("publish"),
        0
    );
    assert_eq!(
        mq.publish("t", b"other".to_vec(), &Headers::new())
            .await
            .expect("publish"),
        1
    );
    // A retry with a different payload and extra headers is still the same message.
    let retry = headers(&[("message-id", "order-1"), ("retry", "1")]);
    assert_eq!(
        mq.publish("t", b"second".to_vec(), &retry)
            .await
            .expect("retry"),
        0
    );
    assert_eq!(next(&mq, "t").await, 2, "a hit appends nothing");
    let records = fetch_all(&mq, "t").await;
    assert_eq!(&records[0].payload()[..], b"first", "the original is kept");
    // Ids are per topic.
    assert_eq!(
        mq.publish("u", b"x".to_vec(), &with_id("order-1"))
            .await
            .expect("publish"),
        0
    );
    assert_eq!(next(&mq, "u").await, 1);
    // Ids compare exactly.
    assert_eq!(
        mq.publish("t", b"x".to_vec(), &with_id("ORDER-1"))
            .await
            .expect("publish"),
        2
    );
    assert_eq!(
        mq.publish("t", b"x".to_vec(), &with_id("order-1 "))
            .await
            .expect("publish"),
        3
    );
    mq.close().await.expect("close");
}

#[tokio::test]
async fn hits_inside_one_batch_and_against_the_log() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mq = open(&fast_options(tmp.path()));
    mq.publish("t", b"x".to_vec(), &with_id("old"))
        .await
        .expect("publish");
    let offsets = mq
        .publish_batch(
            "t",
            vec![
                id_msg("a", 1),
                id_msg("b", 2),
                id_msg("a", 3),
                (b"no id".to_vec(), Headers::new()),
                id_msg("old", 4),
                id_msg("c", 5),
                id_msg("b", 6),
            ],
        )
        .await
        .expect("batch");
    assert_eq!(offsets, vec![1, 2, 1, 3, 0, 4, 2]);
    assert_eq!(next(&mq, "t").await, 5);
    let records = fetch_all(&mq, "t").await;
    assert_eq!(
        &records[1].payload()[..],
        &payload(1, 40)[..],
        "the first of a batch's duplicates is kept"
    );
    // A batch that is all hits appends nothing.
    let offsets = mq
        .publish_batch("t", vec![id_msg("c", 9), id_msg("a", 9)])
        .await
        .expect("batch");
    assert_eq!(offsets, vec![4, 1]);
    assert_eq!(next(&mq, "t").await, 5);
    mq.close().await.expect("close");
}

#[tokio::test]
async fn the_window_counts_ids_first_in_first_out_and_a_hit_does_not_refresh() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mq = open(&Options {
        dedup_window: 3,
        ..fast_options(tmp.path())
    });
    for (i, id) in ["a", "b", "c"].into_iter().enumerate() {
        assert_eq!(
            mq.publish("t", b"x".to_vec(), &with_id(id))
                .await
                .expect("publish"),
            i as u64
        );
    }
    // A hit on "a" does not move it to the back of the window...
    assert_eq!(
        mq.publish("t", b"x".to_vec(), &with_id("a"))
            .await
            .expect("hit"),
        0
    );
    // ...so the 4th id evicts it.
    assert_eq!(
        mq.publish("t", b"x".to_vec(), &with_id("d"))
            .await
            .expect("publish"),
        3
    );
    assert_eq!(
        mq.publish("t", b"x".to_vec(), &with_id("b"))
            .await
            .expect("hit"),
        1
    );
    assert_eq!(
        mq.publish("t", b"x".to_vec(), &with_id("c"))
            .await
            .expect("hit"),
        2
    );
    assert_eq!(
        mq.publish("t", b"x".to_vec(), &with_id("a"))
            .await
            .expect("miss"),
        4,
        "an evicted id appends anew"
    );
    // Window now [c, d, a]: "b" was evicted by the new "a".
    assert_eq!(
        mq.publish("t", b"x".to_vec(), &with_id("b"))
            .await
            .expect("miss"),
        5
    );
    assert_eq!(
        mq.publish("t", b"x".to_vec(), &with_id("a"))
            .await
            .expect("hit"),
        4
    );
    // Messages without an id do not count towards the window.
    for _ in 0..10 {
        mq.publish("t", b"no id".to_vec(), &Headers::new())
            .await
            .expect("publish");
    }
    assert_eq!(
        mq.publish("t", b"x".to_vec(), &with_id("d"))
            .await
            .expect("hit"),
        3
    );
    mq.close().await.expect("close");
}

/// Regression: the ids a batch appended entered the window in hash order instead of log
/// order, so the next ids evicted the wrong ones (and live state disagreed with the state
/// rebuilt on reopen).
#[tokio::test]
async fn ids_appended_by_a_batch_are_evicted_in_log_order() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let opts = Options {
        dedup_window: 50,
        ..fast_options(tmp.path())
    };
    let mq = open(&opts);
    let batch: Vec<(Vec<u8>, Headers)> = (0..50).map(|i| id_msg(&format!("id-{i}"), i)).collect();
    assert_eq!(
        mq.publish_batch("t", batch).await.expect("batch"),
        (0..50).collect::<Vec<u64>>()
    );
    // Two new ids evict exactly the batch's first two.
    assert_eq!(
        mq.publish("t", b"x".to_vec(), &with_id("new-1"))
            .await
            .expect("publish"),
        50
    );
    assert_eq!(
        mq.publish("t", b"x".to_vec(), &with_id("new-2"))
            .await
            .expect("publish"),
        51
    );
    for i in 2..50u64 {
        assert_eq!(
            mq.publish("t", b"x".to_vec(), &with_id(&format!("id-{i}")))
                .await
                .expect("hit"),
            i,
            "id-{i} is still in the window"
        );
    }
    assert_eq!(next(&mq, "t").await, 52);
    assert_eq!(
        mq.publish("t", b"x".to_vec(), &with_id("id-0"))
            .await
            .expect("miss"),
        52
    );
    mq.close().await.expect("close");
}

/// A batch behaves like the same messages published one by one: an id appended earlier
/// in the batch and pushed out of the window by later ones appends anew.
#[tokio::test]
async fn a_batch_longer_than_the_window_behaves_like_single_publishes() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let opts = Options {
        dedup_window: 2,
        ..fast_options(tmp.path())
    };
    let batch = || {
        vec![
            id_msg("a", 0),
            id_msg("b", 1),
            id_msg("b", 2),
            id_msg("c", 3),
            id_msg("a", 4),
            id_msg("c", 5),
        ]
    };
    let one_by_one = {
        let mq = open(&Options {
            data_source: tmp.path().join("single"),
            ..opts.clone()
        });
        let mut v = Vec::new();
        for (p, h) in batch() {
            v.push(mq.publish("t", p, &h).await.expect("publish"));
        }
        mq.close().await.expect("close");
        v
    };
    assert_eq!(one_by_one, vec![0, 1, 1, 2, 3, 2]);
    let mq = open(&Options {
        data_source: tmp.path().join("batch"),
        ..opts.clone()
    });
    // A window entry from before the batch is pushed out by the batch's own ids, too.
    let offsets = mq.publish_batch("t", batch()).await.expect("batch");
    assert_eq!(offsets, one_by_one);
    let before: Vec<(Vec<u8>, Headers)> = vec![id_msg("x", 9), id_msg("y", 9)];
    assert_eq!(
        mq.publish_batch("t", before).await.expect("batch"),
        vec![4, 5]
    );
    let offsets = mq
        .publish_batch(
            "t",
            vec![
                id_msg("z", 9),
                id_msg("w", 9),
                id_msg("y", 9),
                id_msg("x", 9),
            ],
        )
        .await
        .expect("batch");
    assert_eq!(
        offsets,
        vec![6, 7, 8, 9],
        "x and y were pushed out by z and w"
    );
    mq.close().await.expect("close");
}

#[tokio::test]
async fn window_zero_disables_de_duplication() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mq = Spool::open(&format!(
        "Data Source={};Dedup Window=0;Sync=None",
        tmp.path().display()
    ))
    .expect("open");
    assert_eq!(
        mq.publish("t", b"x".to_vec(), &with_id("a"))
            .await
            .expect("publish"),
        0
    );
    assert_eq!(
        mq.publish("t", b"x".to_vec(), &with_id("a"))
            .await
            .expect("publish"),
        1
    );
    assert_eq!(
        mq.publish_batch("t", vec![id_msg("a", 0), id_msg("a", 1)])
            .await
            .expect("batch"),
        vec![2, 3]
    );
    // Ids are still validated.
    let r = mq.publish("t", b"x".to_vec(), &with_id("")).await;
    assert!(matches!(r, Err(Error::InvalidMessageId { .. })), "{r:?}");
    mq.close().await.expect("close");
}

#[tokio::test]
async fn message_ids_must_be_1_to_256_utf8_bytes() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mq = open(&fast_options(tmp.path()));
    let bad = [
        String::new(),
        "i".repeat(257),
        "é".repeat(128) + "a", // 257 bytes in 129 characters
        "日".repeat(86),       // 258 bytes in 86 characters
        "🚀".repeat(65),       // 260 bytes
    ];
    for id in &bad {
        let r = mq.publish("t", b"x".to_vec(), &with_id(id)).await;
        assert!(
            matches!(r, Err(Error::InvalidMessageId { .. })),
            "{} bytes: {r:?}",
            id.len()
        );
    }
    assert_eq!(next(&mq, "t").await, 0);
    let good = [
        "i".repeat(256),
        "é".repeat(128),       // 256 bytes
        "日".repeat(85) + "a", // 256 bytes
        "🚀".repeat(64),       // 256 bytes
        "x".to_owned(),
    ];
    for (i, id) in good.iter().enumerate() {
        assert_eq!(id.len().min(256), id.len());
        assert_eq!(
            mq.publish("t", b"x".to_vec(), &with_id(id))
                .await
                .expect("valid id"),
            i as u64
        );
        assert_eq!(
            mq.publish("t", b"y".to_vec(), &with_id(id))
                .await
                .expect("hit"),
            i as u64
        );
    }
    mq.close().await.expect("close");
}

#[tokio::test]
async fn a_retry_after_reopen_still_hits() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let opts = fast_options(tmp.path());
    let mq = open(&opts);
    for i in 0..10u64 {
        mq.publish("t", payload(i, 30), &with_id(&format!("m-{i}")))
            .await
            .expect("publish");
    }
    mq.close().await.expect("close");
    let mq = open(&opts);
    for i in 0..10u64 {
        assert_eq!(
            mq.publish("t", b"retry".to_vec(), &with_id(&format!("m-{i}")))
                .await
                .expect("hit"),
            i
        );
    }
    assert_eq!(next(&mq, "t").await, 10);
    // An unclean stop (drop without close) rebuilds the same way.
    drop(mq);
    let mq = open(&opts);
    assert_eq!(
        mq.publish("t", b"retry".to_vec(), &with_id("m-3"))
            .await
            .expect("hit"),
        3
    );
    assert_eq!(next(&mq, "t").await, 10);
    mq.close().await.expect("close");
}

/// Many segments, ids mixed with id-less records, a window smaller than the number of
/// ids: after reopen exactly the last `window` ids hit.
#[tokio::test]
async fn the_window_is_rebuilt_from_the_tail_across_segments() {
    let tmp = tempfile::tempdir().expect("tempdir");
    for (case, (window, interval)) in [(10usize, 4096u64), (10, 1), (37, 300), (1, 64), (500, 4096)]
        .into_iter()
        .enumerate()
    {
        let opts = Options {
            dedup_window: window,
            index_interval_bytes: interval,
            ..tiny_segments(&tmp.path().join(format!("case-{case}")), 1024)
        };
        let mq = open(&opts);
        let mut ids: Vec<(String, u64)> = Vec::new();
        for i in 0..80u64 {
            if i % 3 == 1 {
                mq.publish("t", payload(i, 60), &Headers::new())
                    .await
                    .expect("publish");
            } else {
                let id = format!("id-{i}");
                let o = mq
                    .publish("t", payload(i, 60), &with_id(&id))
                    .await
                    .expect("publish");
                ids.push((id, o));
            }
        }
        // Some ids again in a batch at the end, so the newest segment holds a mix.
        let batch: Vec<(Vec<u8>, Headers)> =
            (80..86).map(|i| id_msg(&format!("id-{i}"), i)).collect();
        for (id, o) in (80..86)
            .map(|i| format!("id-{i}"))
            .zip(mq.publish_batch("t", batch).await.expect("batch"))
        {
            ids.push((id, o));
        }
        assert!(mq.topic_info("t").expect("info").segments >= 5);
        mq.close().await.expect("close");

        let mq = open(&opts);
        let end = next(&mq, "t").await;
        let kept = ids.len().saturating_sub(window);
        for (id, o) in &ids[kept..] {
            assert_eq!(
                mq.publish("t", b"retry".to_vec(), &with_id(id))
                    .await
                    .expect("hit"),
                *o,
                "case {case}: {id} is among the last {window} ids"
            );
        }
        assert_eq!(
            next(&mq, "t").await,
            end,
            "case {case}: hits append nothing"
        );
        if let Some((id, _)) = ids[..kept].last() {
            assert_eq!(
                mq.publish("t", b"retry".to_vec(), &with_id(id))
                    .await
                    .expect("miss"),
                end,
                "case {case}: {id} fell out of the window before the reopen"
            );
        }
        mq.close().await.expect("close");
    }
}

#[tokio::test]
async fn ids_of_records_deleted_by_retention_no_longer_hit() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let opts = Options {
        retention_bytes: 3000,
        ..tiny_segments(tmp.path(), 1024)
    };
    let mq = open(&opts);
    let mut offsets = Vec::new();
    for i in 0..60u64 {
        offsets.push(
            mq.publish("t", payload(i, 80), &with_id(&format!("id-{i}")))
                .await
                .expect("publish"),
        );
    }
    mq.apply_retention().expect("retention");
    let earliest = mq.topic_info("t").expect("info").earliest;
    assert!(
        earliest > 5,
        "retention deleted some segments (earliest {earliest})"
    );
    let end = next(&mq, "t").await;
    // Retained ids still hit.
    for i in earliest..60 {
        assert_eq!(
            mq.publish("t", b"r".to_vec(), &with_id(&format!("id-{i}")))
                .await
                .expect("hit"),
            i
        );
    }
    assert_eq!(next(&mq, "t").await, end);
    // A deleted id appends anew.
    assert_eq!(
        mq.publish("t", b"again".to_vec(), &with_id("id-0"))
            .await
            .expect("miss"),
        end
    );
    assert_eq!(
        mq.publish("t", b"again".to_vec(), &with_id("id-0"))
            .await
            .expect("hit"),
        end
    );
    mq.close().await.expect("close");

    // After reopen the same holds (the window is rebuilt from the retained log only).
    let mq = open(&opts);
    let end = next(&mq, "t").await;
    let earliest = mq.topic_info("t").expect("info").earliest;
    assert_eq!(
        mq.publish("t", b"r".to_vec(), &with_id("id-59"))
            .await
            .expect("hit"),
        59
    );
    assert_eq!(
        mq.publish("t", b"r".to_vec(), &with_id("id-0"))
            .await
            .expect("hit"),
        end - 1
    );
    assert_eq!(
        mq.publish("t", b"r".to_vec(), &with_id("id-1"))
            .await
            .expect("miss"),
        end
    );
    assert!(earliest > 1);
    mq.close().await.expect("close");
}

/// Segment files a descriptor of this process has open under `dir`.
#[cfg(target_os = "linux")]
fn open_segment_files(dir: &std::path::Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("fd dir")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|p| p.starts_with(dir) && p.extension().is_some_and(|e| e == "log"))
        .count()
}

/// The rebuild at open reads the ids of as many segments as the window needs, but leaves at
/// most 8 sealed segment files open (plus the active one and the two being sealed under
/// `Sync=None`), as reads do: under a descriptor
/// limit a log of many segments would otherwise fail the rebuild (and miss duplicates).
#[cfg(target_os = "linux")]
#[tokio::test]
async fn the_rebuild_over_many_segments_keeps_few_files_open() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let opts = tiny_segments(tmp.path(), 1024);
    let mq = open(&opts);
    for i in 0..1200u64 {
        mq.publish("t", payload(i, 200), &with_id(&format!("m{i}")))
            .await
            .expect("publish");
    }
    let segments = mq.topic_info("t").expect("info").segments;
    assert!(segments > 200, "{segments}");
    let open_files = open_segment_files(tmp.path());
    assert!(
        open_files <= 8 + 3,
        "{open_files} segment files open while publishing"
    );
    mq.close().await.expect("close");

    let mq = open(&opts);
    let open_files = open_segment_files(tmp.path());
    assert!(
        open_files <= 8 + 3,
        "{open_files} segment files open after the rebuild"
    );
    assert_eq!(
        mq.publish("t", payload(5, 200), &with_id("m5"))
            .await
            .expect("publish"),
        5,
        "the oldest ids were rebuilt"
    );
    mq.close().await.expect("close");
}

/// A batch that fails at a segment roll after part of it reached the log (here the sealed
/// segment's index write fails): the ids of that part are remembered, so the producer's
/// retry appends each message once, and a reopen rebuilds the same window (found by
/// review: the retry appended the first part a second time).
#[tokio::test]
async fn a_batch_failing_at_its_roll_then_retried_appends_each_message_once() {
    use spool::testing::{SimFs, without_background_work};
    use spool::{Options, SyncPolicy};
    let with_id = |id: &str| {
        let mut h = Headers::new();
        h.insert("message-id".into(), id.into());
        h
    };
    let fs = SimFs::new(7);
    let mut o = Options::new("/data");
    o.sync = SyncPolicy::Always;
    o.segment_bytes = 1024;
    o.index_interval_bytes = 128;
    let o = without_background_work(o);
    let mq = Spool::open_simulated(o.clone(), &fs).expect("open");
    for i in 0..3 {
        let h = with_id(&format!("pre-{i}"));
        mq.publish("t", vec![b'x'; 200], &h).await.expect("publish");
    }
    // `a` fits in the first segment; `b` makes it roll.
    let batch = vec![
        (vec![b'a'; 10], with_id("a")),
        (vec![b'b'; 500], with_id("b")),
        (vec![b'c'; 10], with_id("c")),
    ];
    let idx = std::path::Path::new("/data/topics/t/00000000000000000000.idx");
    fs.fail_writes_to(Some(idx));
    assert!(mq.publish_batch("t", batch.clone()).await.is_err());
    fs.fail_writes_to(None);
    let offsets = mq.publish_batch("t", batch).await.expect("retry");
    assert_eq!(
        offsets,
        vec![3, 4, 5],
        "a kept its offset; b and c appended once"
    );
    let ids = |recs: Vec<spool::Record>| -> Vec<String> {
        recs.iter()
            .map(|r| r.headers().get("message-id").cloned().unwrap_or_default())
            .collect()
    };
    let log = ids(mq.fetch("t", 0, 100).await.expect("fetch"));
    assert_eq!(log, ["pre-0", "pre-1", "pre-2", "a", "b", "c"]);
    let info = mq.topic_info("t").expect("info");
    mq.close().await.expect("close");
    let mq = Spool::open_simulated(o, &fs).expect("reopen");
    assert_eq!(
        mq.topic_info("t").expect("info").dedup_ids,
        info.dedup_ids,
        "the window a reopen rebuilds is the one before"
    );
}

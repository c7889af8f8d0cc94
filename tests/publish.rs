//! Guards publishing: `publish`/`publish_batch` return dense offsets and are readable as
//! soon as they return, the `Max Message Bytes` limit (at the limit is fine, one byte more
//! is `MessageTooLarge`), batches are all-or-nothing, topic names are checked by every call,
//! every `Sync` policy works, and concurrent publishers get dense, unique offsets.

mod common_core;

use std::collections::BTreeSet;

use common_core::{fast_options, fetch_all, headers, open, payload, with_id};
use spool::{Error, Headers, Options, Spool, SyncPolicy};

#[tokio::test]
async fn publish_returns_offsets_readable_immediately() {
    let tmp = tempfile::tempdir().expect("tempdir");
    // Default options: Sync=Always.
    let mq = Spool::open(&format!("Data Source={}", tmp.path().display())).expect("open");
    for i in 0..5u64 {
        let h = headers(&[("seq", &i.to_string())]);
        let o = mq
            .publish("orders", payload(i, 32), &h)
            .await
            .expect("publish");
        assert_eq!(o, i);
        let got = mq.fetch("orders", o, 10).await.expect("fetch");
        assert_eq!(
            got.len(),
            1,
            "the record is visible as soon as publish returns"
        );
        assert_eq!(got[0].offset(), o);
        assert_eq!(&got[0].payload()[..], &payload(i, 32)[..]);
        assert_eq!(got[0].headers(), &h);
        assert_eq!(mq.topic_info("orders").expect("info").next, i + 1);
    }
    let offsets = mq
        .publish_batch(
            "orders",
            vec![
                (b"a".to_vec(), Headers::new()),
                (b"b".to_vec(), headers(&[("x", "y")])),
                (Vec::new(), Headers::new()),
            ],
        )
        .await
        .expect("publish_batch");
    assert_eq!(offsets, vec![5, 6, 7]);
    let got = mq.fetch("orders", 5, 10).await.expect("fetch");
    let payloads: Vec<&[u8]> = got.iter().map(|r| &r.payload()[..]).collect();
    assert_eq!(payloads, vec![&b"a"[..], b"b", b""]);
    assert_eq!(got[1].headers(), &headers(&[("x", "y")]));
    mq.close().await.expect("close");
}

#[tokio::test]
async fn payload_accepts_bytes_and_static_slices() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mq = open(&fast_options(tmp.path()));
    let h = Headers::new();
    assert_eq!(
        mq.publish("t", bytes::Bytes::from_static(b"x"), &h)
            .await
            .expect("bytes"),
        0
    );
    assert_eq!(mq.publish("t", &b"y"[..], &h).await.expect("slice"), 1);
    assert_eq!(
        mq.publish("t", "z".to_owned(), &h).await.expect("string"),
        2
    );
    let got: Vec<Vec<u8>> = fetch_all(&mq, "t")
        .await
        .iter()
        .map(|r| r.payload().to_vec())
        .collect();
    assert_eq!(got, vec![b"x".to_vec(), b"y".to_vec(), b"z".to_vec()]);
    mq.close().await.expect("close");
}

#[tokio::test]
async fn an_empty_batch_appends_nothing() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mq = open(&fast_options(tmp.path()));
    mq.publish("t", b"x".to_vec(), &Headers::new())
        .await
        .expect("publish");
    let offsets = mq
        .publish_batch("t", Vec::<(Vec<u8>, Headers)>::new())
        .await
        .expect("empty batch");
    assert!(offsets.is_empty());
    assert_eq!(mq.topic_info("t").expect("info").next, 1);
    mq.close().await.expect("close");
}

#[tokio::test]
async fn message_at_the_limit_is_accepted_and_one_byte_more_is_too_large() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mq = open(&Options {
        max_message_bytes: 1000,
        ..fast_options(tmp.path())
    });
    let h = Headers::new();
    assert_eq!(
        mq.publish("t", vec![7u8; 1000], &h)
            .await
            .expect("at the limit"),
        0
    );
    let r = mq.publish("t", vec![7u8; 1001], &h).await;
    assert!(
        matches!(
            r,
            Err(Error::MessageTooLarge {
                size: 1001,
                max: 1000
            })
        ),
        "{r:?}"
    );
    let r = mq.publish("t", vec![7u8; 100_000], &h).await;
    assert!(matches!(r, Err(Error::MessageTooLarge { .. })), "{r:?}");
    assert_eq!(
        mq.topic_info("t").expect("info").next,
        1,
        "nothing appended"
    );
    assert_eq!(
        mq.publish("t", b"next".to_vec(), &h)
            .await
            .expect("publish"),
        1
    );
    mq.close().await.expect("close");
}

#[tokio::test]
async fn default_limit_is_one_mebibyte() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mq = open(&fast_options(tmp.path()));
    let h = Headers::new();
    let mib = 1024 * 1024;
    assert_eq!(
        mq.publish("t", payload(1, mib), &h).await.expect("1 MiB"),
        0
    );
    let r = mq.publish("t", payload(1, mib + 1), &h).await;
    assert!(
        matches!(r, Err(Error::MessageTooLarge { size, max }) if size == mib + 1 && max == mib),
        "{r:?}"
    );
    let got = mq.fetch("t", 0, 10).await.expect("fetch");
    assert_eq!(got.len(), 1);
    assert_eq!(&got[0].payload()[..], &payload(1, mib)[..]);
    mq.close().await.expect("close");
}

#[tokio::test]
async fn a_batch_with_one_bad_message_appends_none_of_it() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let opts = Options {
        max_message_bytes: 100,
        segment_bytes: 1024,
        ..fast_options(tmp.path())
    };
    let mq = open(&opts);
    mq.publish("t", b"before".to_vec(), &Headers::new())
        .await
        .expect("publish");
    let good = |i: u64| (payload(i, 50), with_id(&format!("good-{i}")));
    type Batch = Vec<(Vec<u8>, Headers)>;
    let bad_batches: Vec<(&str, Batch)> = vec![
        (
            "too large last",
            vec![good(1), good(2), (vec![0u8; 101], Headers::new())],
        ),
        (
            "too large first",
            vec![(vec![0u8; 101], Headers::new()), good(1), good(2)],
        ),
        (
            "empty message-id",
            vec![good(1), (b"x".to_vec(), with_id("")), good(2)],
        ),
        (
            "long message-id",
            vec![good(1), good(2), (b"x".to_vec(), with_id(&"i".repeat(257)))],
        ),
        (
            // Many records that would cross segment boundaries if any were written.
            "across segments",
            (0..40)
                .map(good)
                .chain([(vec![0u8; 101], Headers::new())])
                .collect(),
        ),
    ];
    for (what, batch) in bad_batches {
        let r = mq.publish_batch("t", batch).await;
        assert!(
            matches!(
                r,
                Err(Error::MessageTooLarge { .. } | Error::InvalidMessageId { .. })
            ),
            "{what}: {r:?}"
        );
        let info = mq.topic_info("t").expect("info");
        assert_eq!(
            (info.next, info.segments),
            (1, 1),
            "{what}: nothing appended"
        );
    }
    // The ids of the refused batches were not remembered: they append now.
    let offsets = mq
        .publish_batch("t", vec![good(1), good(2)])
        .await
        .expect("publish_batch");
    assert_eq!(offsets, vec![1, 2]);
    let records = fetch_all(&mq, "t").await;
    assert_eq!(records.len(), 3);
    mq.close().await.expect("close");
    let mq = open(&opts);
    assert_eq!(
        fetch_all(&mq, "t").await.len(),
        3,
        "nothing half-written reappears"
    );
    mq.close().await.expect("close");
}

#[tokio::test]
async fn headers_over_the_limit_are_refused() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mq = open(&Options {
        max_header_bytes: 64,
        ..fast_options(tmp.path())
    });
    let big = headers(&[("k", &"v".repeat(100))]);
    let r = mq.publish("t", b"x".to_vec(), &big).await;
    assert!(matches!(r, Err(Error::HeadersTooLarge { .. })), "{r:?}");
    let r = mq
        .publish_batch(
            "t",
            vec![(b"ok".to_vec(), Headers::new()), (b"x".to_vec(), big)],
        )
        .await;
    assert!(matches!(r, Err(Error::HeadersTooLarge { .. })), "{r:?}");
    assert_eq!(mq.topic_info("t").expect("info").next, 0);
    mq.close().await.expect("close");
}

#[tokio::test]
async fn invalid_topic_names_are_refused_by_every_call() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mq = open(&fast_options(tmp.path()));
    let long = "x".repeat(250);
    let bad: Vec<&str> = vec![
        "",
        ".",
        "..",
        "a/b",
        "../escape",
        "a\\b",
        "a b",
        "tab\there",
        "nul\0",
        "é",
        "topic-ü",
        "日本",
        &long,
    ];
    for name in bad {
        let r = mq.publish(name, b"x".to_vec(), &Headers::new()).await;
        assert!(
            matches!(r, Err(Error::InvalidTopicName { .. })),
            "publish {name:?}: {r:?}"
        );
        let r = mq
            .publish_batch(name, vec![(b"x".to_vec(), Headers::new())])
            .await;
        assert!(
            matches!(r, Err(Error::InvalidTopicName { .. })),
            "batch {name:?}: {r:?}"
        );
        let r = mq.fetch(name, 0, 1).await;
        assert!(
            matches!(r, Err(Error::InvalidTopicName { .. })),
            "fetch {name:?}: {r:?}"
        );
        let r = mq.topic_info(name);
        assert!(
            matches!(r, Err(Error::InvalidTopicName { .. })),
            "topic_info {name:?}: {r:?}"
        );
        let r = mq.group_info(name, "g");
        assert!(
            matches!(r, Err(Error::InvalidTopicName { .. })),
            "group_info {name:?}: {r:?}"
        );
    }
    assert!(mq.topics().expect("topics").is_empty());
    assert!(
        !tmp.path().join("escape").exists() && !tmp.path().join("topics").join("a").exists(),
        "no directory was created for a refused name"
    );
    // The edges that are fine.
    let max = "y".repeat(249);
    for name in ["a", "...", "A-z_0.9", max.as_str()] {
        assert_eq!(
            mq.publish(name, b"x".to_vec(), &Headers::new())
                .await
                .expect(name),
            0
        );
    }
    assert_eq!(mq.topics().expect("topics").len(), 4);
    mq.close().await.expect("close");
}

#[tokio::test]
async fn every_sync_policy_publishes_and_survives_reopen() {
    let tmp = tempfile::tempdir().expect("tempdir");
    for (i, sync) in ["Always", "None", "Interval:5", "interval:1000"]
        .iter()
        .enumerate()
    {
        let dir = tmp.path().join(format!("d{i}"));
        let conn = format!(
            "Data Source={};Sync={sync};Segment Bytes=1024",
            dir.display()
        );
        let mq = Spool::open(&conn).expect("open");
        for j in 0..20u64 {
            assert_eq!(
                mq.publish("t", payload(j, 100), &Headers::new())
                    .await
                    .expect("publish"),
                j,
                "{sync}"
            );
        }
        let batch: Vec<(Vec<u8>, Headers)> = (20..40u64)
            .map(|j| (payload(j, 100), Headers::new()))
            .collect();
        assert_eq!(
            mq.publish_batch("t", batch).await.expect("batch"),
            (20..40).collect::<Vec<_>>()
        );
        assert_eq!(fetch_all(&mq, "t").await.len(), 40, "{sync}");
        mq.close().await.expect("close");
        let mq = Spool::open(&conn).expect("reopen");
        let records = fetch_all(&mq, "t").await;
        assert_eq!(records.len(), 40, "{sync}");
        for (j, r) in records.iter().enumerate() {
            assert_eq!(&r.payload()[..], &payload(j as u64, 100)[..], "{sync}");
        }
        mq.close().await.expect("close");
    }
    assert!(matches!(
        Options::parse("Data Source=x;Sync=Interval:5").expect("parse").sync,
        SyncPolicy::Interval(d) if d.as_millis() == 5
    ));
}

/// Many tasks publishing at once (Sync=Always, so they share group commits) get every
/// offset exactly once, each task's offsets increase, and each offset holds what its
/// publisher sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_publishers_get_dense_unique_offsets() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mq = Spool::open(&format!(
        "Data Source={};Segment Bytes=4096",
        tmp.path().display()
    ))
    .expect("open");
    const TASKS: u64 = 16;
    const EACH: u64 = 40;
    let mut handles = Vec::new();
    for task in 0..TASKS {
        let mq = mq.clone();
        handles.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            let mut seq = 0u64;
            while seq < EACH {
                let key = task * 1000 + seq;
                if seq % 5 == 4 {
                    // Mix in small batches.
                    let batch = vec![
                        (payload(key, 60), headers(&[("key", &key.to_string())])),
                        (
                            payload(key + 1, 60),
                            headers(&[("key", &(key + 1).to_string())]),
                        ),
                    ];
                    let offsets = mq.publish_batch("hot", batch).await.expect("batch");
                    assert_eq!(offsets[1], offsets[0] + 1, "a batch is contiguous");
                    mine.push((offsets[0], key));
                    mine.push((offsets[1], key + 1));
                    seq += 2;
                } else {
                    let h = headers(&[("key", &key.to_string())]);
                    let o = mq
                        .publish("hot", payload(key, 60), &h)
                        .await
                        .expect("publish");
                    mine.push((o, key));
                    seq += 1;
                }
            }
            mine
        }));
    }
    let mut all = Vec::new();
    for h in handles {
        let mine = h.await.expect("task");
        assert!(
            mine.windows(2).all(|w| w[0].0 < w[1].0),
            "a task's offsets increase"
        );
        all.extend(mine);
    }
    let offsets: BTreeSet<u64> = all.iter().map(|(o, _)| *o).collect();
    assert_eq!(offsets.len(), all.len(), "no offset handed out twice");
    let total = all.len() as u64;
    assert_eq!(
        offsets,
        (0..total).collect::<BTreeSet<u64>>(),
        "dense from 0"
    );
    assert_eq!(mq.topic_info("hot").expect("info").next, total);
    let records = fetch_all(&mq, "hot").await;
    all.sort_unstable();
    for ((o, key), r) in all.iter().zip(&records) {
        assert_eq!(r.offset(), *o);
        assert_eq!(r.headers().get("key"), Some(&key.to_string()));
        assert_eq!(&r.payload()[..], &payload(*key, 60)[..]);
    }
    mq.close().await.expect("close");
}

#[test]
fn publishing_works_without_an_ambient_runtime_at_open() {
    // `open` is sync and needs no runtime; the futures run on whatever runtime polls them.
    let tmp = tempfile::tempdir().expect("tempdir");
    let mq = Spool::open(&format!("Data Source={}", tmp.path().display())).expect("open");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        assert_eq!(
            mq.publish("t", b"x".to_vec(), &Headers::new())
                .await
                .expect("publish"),
            0
        );
        mq.close().await.expect("close");
    });
}

//! Guards the topic log's shape and reads: offsets dense from 0, segments rolled at
//! `Segment Bytes` and named by their 20-digit base offset, `topic_info` agreeing with the
//! files, and `fetch` returning every record exactly once across segment boundaries, with
//! `from` clamped, before and after a reopen (a matrix over message size x batch shape x
//! segment size x index interval, so every path crosses a segment boundary).

mod common_core;

use std::path::Path;

use common_core::{
    base_of, fast_options, fetch_all, fetch_all_from, headers, open, payload, segment_data_sizes,
    segment_files, tiny_segments,
};
use spool::{Headers, Options, Record, Spool};

/// What a test published: offset -> (payload, headers).
type Expected = Vec<(Vec<u8>, Headers)>;

fn assert_records(records: &[Record], expected: &Expected, from: u64, ctx: &str) {
    assert_eq!(
        records.len() as u64,
        expected.len() as u64 - from,
        "{ctx}: wrong record count from {from}"
    );
    for (i, r) in records.iter().enumerate() {
        let o = from + i as u64;
        assert_eq!(r.offset(), o, "{ctx}: offsets must be dense");
        let (p, h) = &expected[o as usize];
        assert_eq!(&r.payload()[..], &p[..], "{ctx}: payload of offset {o}");
        assert_eq!(r.headers(), h, "{ctx}: headers of offset {o}");
    }
}

/// Checks the on-disk segments of `topic` against `topic_info` and the records.
async fn assert_segments(mq: &Spool, data: &Path, topic: &str, segment_bytes: u64, ctx: &str) {
    let info = mq.topic_info(topic).expect("topic_info");
    let files = segment_files(data, topic);
    assert_eq!(info.segments, files.len(), "{ctx}: segments");
    // Sealed files are exactly their records; the active one may be preallocated.
    let sizes = segment_data_sizes(data, topic, info.bytes);
    assert_eq!(info.messages, info.next - info.earliest, "{ctx}: messages");
    let bases: Vec<u64> = files.iter().map(|f| base_of(f)).collect();
    assert_eq!(
        bases[0], info.earliest,
        "{ctx}: the first segment starts at earliest"
    );
    assert!(bases.windows(2).all(|w| w[0] < w[1]), "{ctx}: {bases:?}");
    // Each segment's base is the offset of its first record, so the record before a
    // base ends the previous segment; and a segment over the limit holds one record.
    for (i, &base) in bases.iter().enumerate() {
        let first = mq.fetch(topic, base, 1).await.expect("fetch");
        if i + 1 < bases.len() || base < info.next {
            assert_eq!(first[0].offset(), base, "{ctx}: segment base");
        }
        if sizes[i] > segment_bytes {
            let end = bases.get(i + 1).copied().unwrap_or(info.next);
            assert_eq!(
                end - base,
                1,
                "{ctx}: only a lone oversized record may exceed Segment Bytes"
            );
        }
    }
}

#[tokio::test]
async fn offsets_are_dense_from_zero_per_topic() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mq = open(&fast_options(tmp.path()));
    let h = Headers::new();
    for i in 0..20u64 {
        assert_eq!(
            mq.publish("a", payload(i, 10), &h).await.expect("publish"),
            i
        );
        if i % 2 == 0 {
            assert_eq!(
                mq.publish("b", payload(i, 10), &h).await.expect("publish"),
                i / 2,
                "offsets are per topic"
            );
        }
    }
    let info = mq.topic_info("a").expect("info");
    assert_eq!((info.earliest, info.next, info.messages), (0, 20, 20));
    assert_eq!(mq.topic_info("b").expect("info").next, 10);
    assert_eq!(
        mq.topics().expect("topics"),
        vec!["a".to_owned(), "b".to_owned()]
    );
    mq.close().await.expect("close");
}

#[tokio::test]
async fn unknown_topic_reads_as_empty() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mq = open(&fast_options(tmp.path()));
    let info = mq.topic_info("nothing-here").expect("info");
    assert_eq!(
        (info.earliest, info.next, info.messages, info.segments),
        (0, 0, 0, 0)
    );
    assert!(
        mq.fetch("nothing-here", 0, 10)
            .await
            .expect("fetch")
            .is_empty()
    );
    assert!(
        mq.topics().expect("topics").is_empty(),
        "reading creates no topic"
    );
    mq.close().await.expect("close");
}

#[tokio::test]
async fn segments_roll_at_segment_bytes_and_are_named_by_base_offset() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let opts = tiny_segments(tmp.path(), 1024);
    let mq = open(&opts);
    let mut expected = Expected::new();
    for i in 0..100u64 {
        let p = payload(i, 100);
        let h = headers(&[("n", &i.to_string())]);
        assert_eq!(mq.publish("roll", p.clone(), &h).await.expect("publish"), i);
        expected.push((p, h));
    }
    let files = segment_files(tmp.path(), "roll");
    assert!(
        files.len() >= 10,
        "100 x ~140-byte records in 1 KiB segments: {}",
        files.len()
    );
    for f in &files {
        assert!(
            std::fs::metadata(f).expect("metadata").len() <= 1024,
            "{}",
            f.display()
        );
    }
    assert_eq!(base_of(&files[0]), 0);
    assert_segments(&mq, tmp.path(), "roll", 1024, "live").await;
    assert_records(&fetch_all(&mq, "roll").await, &expected, 0, "live");
    mq.close().await.expect("close");

    let mq = open(&opts);
    assert_segments(&mq, tmp.path(), "roll", 1024, "reopened").await;
    assert_records(&fetch_all(&mq, "roll").await, &expected, 0, "reopened");
    // Appends continue in the last segment, densely.
    assert_eq!(
        mq.publish("roll", b"more".to_vec(), &Headers::new())
            .await
            .expect("publish"),
        100
    );
    mq.close().await.expect("close");
}

#[tokio::test]
async fn a_record_larger_than_a_segment_gets_a_segment_of_its_own() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let opts = Options {
        max_message_bytes: 10_000,
        ..tiny_segments(tmp.path(), 1024)
    };
    let mq = open(&opts);
    let mut expected = Expected::new();
    for (i, len) in [10usize, 5000, 10, 10, 3000, 3000, 10]
        .into_iter()
        .enumerate()
    {
        let p = payload(i as u64, len);
        mq.publish("big", p.clone(), &Headers::new())
            .await
            .expect("publish");
        expected.push((p, Headers::new()));
    }
    assert_segments(&mq, tmp.path(), "big", 1024, "oversized").await;
    assert_records(&fetch_all(&mq, "big").await, &expected, 0, "oversized");
    mq.close().await.expect("close");
    let mq = open(&opts);
    assert_records(
        &fetch_all(&mq, "big").await,
        &expected,
        0,
        "oversized, reopened",
    );
    mq.close().await.expect("close");
}

/// Regression: a fetch spanning segments used to stop early, because each segment compared
/// the whole result's length with the records still wanted (`fetch(0, 13)` returned 9).
#[tokio::test]
async fn fetch_respects_max_records_and_crosses_segment_boundaries() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mq = open(&tiny_segments(tmp.path(), 1024));
    let mut expected = Expected::new();
    let batch: Vec<(Vec<u8>, Headers)> = (0..60u64)
        .map(|i| (payload(i, 77), Headers::new()))
        .collect();
    expected.extend(batch.iter().cloned());
    let offsets = mq.publish_batch("t", batch).await.expect("publish_batch");
    assert_eq!(offsets, (0..60).collect::<Vec<u64>>());
    assert!(mq.topic_info("t").expect("info").segments > 3);
    for from in [0u64, 1, 9, 10, 11, 29, 58, 59] {
        for max in [1usize, 2, 7, 13, 60, 1000] {
            let got = mq.fetch("t", from, max).await.expect("fetch");
            let want = (60 - from as usize).min(max);
            assert_eq!(got.len(), want, "from {from} max {max}");
            let mut exp = expected.clone();
            exp.truncate(from as usize + want);
            assert_records(&got, &exp, from, &format!("from {from} max {max}"));
        }
    }
    assert!(
        mq.fetch("t", 60, 10)
            .await
            .expect("fetch at end")
            .is_empty()
    );
    assert!(
        mq.fetch("t", 1_000_000, 10)
            .await
            .expect("fetch past end")
            .is_empty()
    );
    assert!(
        mq.fetch("t", 0, 0)
            .await
            .expect("fetch of nothing")
            .is_empty()
    );
    mq.close().await.expect("close");
}

#[tokio::test]
async fn payloads_and_headers_round_trip_exactly() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let opts = fast_options(tmp.path());
    let mq = open(&opts);
    let cases: Expected = vec![
        (Vec::new(), Headers::new()),
        (vec![0u8; 1], headers(&[("", "")])),
        (
            (0..=255u8).collect(),
            headers(&[("content-type", "application/octet-stream")]),
        ),
        (
            "grüße, 世界 🚀".as_bytes().to_vec(),
            headers(&[
                ("ключ", "значение"),
                ("emoji", "🚀🚀"),
                ("empty", ""),
                ("a", "b=c;d"),
            ]),
        ),
        (payload(7, 100_000), headers(&[("message-id", "big-one")])),
    ];
    for (i, (p, h)) in cases.iter().enumerate() {
        assert_eq!(
            mq.publish("rt", p.clone(), h).await.expect("publish"),
            i as u64
        );
    }
    assert_records(&fetch_all(&mq, "rt").await, &cases, 0, "live");
    mq.close().await.expect("close");
    let mq = open(&opts);
    assert_records(&fetch_all(&mq, "rt").await, &cases, 0, "reopened");
    mq.close().await.expect("close");
}

#[tokio::test]
async fn timestamps_are_monotonic_and_close_to_now() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mq = open(&tiny_segments(tmp.path(), 1024));
    let before = std::time::SystemTime::now() - std::time::Duration::from_secs(1);
    for i in 0..50u64 {
        mq.publish("ts", payload(i, 50), &Headers::new())
            .await
            .expect("publish");
    }
    let after = std::time::SystemTime::now() + std::time::Duration::from_secs(1);
    let records = fetch_all(&mq, "ts").await;
    assert!(
        records
            .windows(2)
            .all(|w| w[0].timestamp() <= w[1].timestamp())
    );
    assert!(
        records
            .iter()
            .all(|r| r.timestamp() >= before && r.timestamp() <= after)
    );
    mq.close().await.expect("close");
}

#[derive(Clone, Copy, Debug)]
enum Shape {
    /// One `publish` per message.
    Single,
    /// `publish_batch` of this many messages.
    Batches(usize),
    /// Everything in one `publish_batch`.
    OneBatch,
}

async fn publish_shape(mq: &Spool, topic: &str, msgs: &Expected, shape: Shape) {
    match shape {
        Shape::Single => {
            for (i, (p, h)) in msgs.iter().enumerate() {
                assert_eq!(
                    mq.publish(topic, p.clone(), h).await.expect("publish"),
                    i as u64
                );
            }
        }
        Shape::Batches(n) => {
            let mut next = 0u64;
            for chunk in msgs.chunks(n) {
                let offsets = mq
                    .publish_batch(topic, chunk.to_vec())
                    .await
                    .expect("batch");
                assert_eq!(
                    offsets,
                    (next..next + chunk.len() as u64).collect::<Vec<_>>()
                );
                next += chunk.len() as u64;
            }
        }
        Shape::OneBatch => {
            let offsets = mq.publish_batch(topic, msgs.clone()).await.expect("batch");
            assert_eq!(offsets, (0..msgs.len() as u64).collect::<Vec<_>>());
        }
    }
}

/// One cell of the matrix: publish, check the files and every read path, reopen, check again.
async fn matrix_case(
    dir: std::path::PathBuf,
    case: u64,
    size: usize,
    shape: Shape,
    segment_bytes: u64,
    index_interval: u64,
) {
    let ctx = format!("size {size}, {shape:?}, segment {segment_bytes}, index {index_interval}");
    let opts = Options {
        index_interval_bytes: index_interval,
        ..tiny_segments(&dir, segment_bytes)
    };
    // Enough messages for at least four segments.
    let frame = size + 40;
    let count = ((4 * segment_bytes as usize) / frame).max(4) + 3;
    let msgs: Expected = (0..count as u64)
        .map(|i| {
            let h = if i % 3 == 0 {
                headers(&[("k", &format!("v{i}"))])
            } else {
                Headers::new()
            };
            (payload(i + 1000 * case, size), h)
        })
        .collect();
    let mq = open(&opts);
    publish_shape(&mq, "m", &msgs, shape).await;
    let info = mq.topic_info("m").expect("info");
    assert!(info.segments >= 4, "{ctx}: only {} segments", info.segments);
    assert_eq!(info.next, count as u64, "{ctx}");
    assert_segments(&mq, &dir, "m", segment_bytes, &ctx).await;
    for page in [1usize, 3, 1000] {
        assert_records(&fetch_all_from(&mq, "m", 0, page).await, &msgs, 0, &ctx);
    }
    // Start right before, at and after every boundary.
    for f in segment_files(&dir, "m") {
        let base = base_of(&f);
        for from in [base.saturating_sub(1), base, base + 1] {
            if from < count as u64 {
                let got = mq.fetch("m", from, 4).await.expect("fetch");
                let mut exp = msgs.clone();
                exp.truncate((from as usize + 4).min(count));
                assert_records(&got, &exp, from, &ctx);
            }
        }
    }
    mq.close().await.expect("close");

    let mq = open(&opts);
    let ctx = format!("{ctx}, reopened");
    assert_eq!(mq.topic_info("m").expect("info"), info, "{ctx}");
    assert_records(&fetch_all(&mq, "m").await, &msgs, 0, &ctx);
    let from = count as u64 / 2;
    assert_records(&fetch_all_from(&mq, "m", from, 2).await, &msgs, from, &ctx);
    assert_eq!(
        mq.publish("m", b"after".to_vec(), &Headers::new())
            .await
            .expect("publish"),
        count as u64,
        "{ctx}"
    );
    mq.close().await.expect("close");
}

/// iggy style: every combination crosses several segment boundaries. The cells run
/// concurrently (each in its own directory) because rolls and opens are fsync-bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn matrix_of_message_size_batch_shape_and_segment_size() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut cells = Vec::new();
    let mut case = 0u64;
    for &size in &[0usize, 1, 100, 1000, 3000] {
        for &shape in &[Shape::Single, Shape::Batches(7), Shape::OneBatch] {
            for &(segment_bytes, index_interval) in &[(1024u64, 1u64), (1500, 4096), (4096, 200)] {
                case += 1;
                let dir = tmp.path().join(format!("case-{case}"));
                cells.push(tokio::spawn(matrix_case(
                    dir,
                    case,
                    size,
                    shape,
                    segment_bytes,
                    index_interval,
                )));
            }
        }
    }
    for cell in cells {
        cell.await.expect("matrix cell panicked");
    }
}

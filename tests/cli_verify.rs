//! `spool verify` reads every record, crc and index of a closed data directory and exits 3
//! naming the file and byte position of damage; a whole directory verifies clean.

mod common_cli;

use std::path::{Path, PathBuf};

use common_cli::{expect_code, spool};
use spool::blocking::Spool;
use spool::{Headers, Options};

/// A closed directory whose topic `t` spans several segments.
fn several_segments(dir: &Path) {
    let mq = Spool::open_with(Options {
        segment_bytes: 1024,
        ..Options::new(dir)
    })
    .expect("open");
    for i in 0..60u32 {
        mq.publish("t", vec![b'x'; 40 + (i as usize % 7)], &Headers::new())
            .expect("publish");
    }
    mq.close().expect("close");
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir.join("topics").join("t"))
        .expect("topic dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    v.sort();
    v
}

#[test]
fn a_whole_directory_verifies_clean() {
    let dir = tempfile::tempdir().expect("tempdir");
    several_segments(dir.path());
    let run = spool(dir.path(), &["verify", "--output", "json"]);
    expect_code(&run, 0);
    let r = run.json();
    assert_eq!(r["ok"], true);
    assert_eq!(r["topics"][0]["topic"], "t");
    assert_eq!(r["topics"][0]["records"], 60);
    assert!(r["topics"][0]["segments"].as_u64().expect("segments") > 2);
    assert_eq!(r["topics"][0]["problems"], serde_json::json!([]));
    let table = spool(dir.path(), &["verify"]);
    expect_code(&table, 0);
    assert!(table.stdout.starts_with("TOPIC"), "{}", table.stdout);
}

#[test]
fn a_flipped_byte_in_a_sealed_segment_is_named_with_its_position() {
    let dir = tempfile::tempdir().expect("tempdir");
    several_segments(dir.path());
    let seg = segments(dir.path())[1].clone();
    let mut bytes = std::fs::read(&seg).expect("read");
    // Inside the second record (after the 32-byte header, records are 69 to 75 bytes).
    let at = 32 + 75 + 20;
    bytes[at] ^= 0x55;
    std::fs::write(&seg, &bytes).expect("write");

    let run = spool(dir.path(), &["verify", "--output", "json"]);
    expect_code(&run, 3);
    let r = run.json();
    assert_eq!(r["ok"], false);
    let p = &r["topics"][0]["problems"][0];
    assert_eq!(p["file"], seg.to_str().expect("utf-8"));
    // The damaged record's start: the second record's.
    let position = p["position"].as_u64().expect("position");
    assert!((32 + 69..=32 + 75).contains(&position), "{p}");
    assert!(
        p["problem"].as_str().expect("text").contains("checksum"),
        "{p}"
    );
    assert!(
        run.stderr.starts_with("spool: verify found"),
        "{}",
        run.stderr
    );

    let table = spool(dir.path(), &["verify"]);
    expect_code(&table, 3);
    assert!(
        table.stdout.contains(seg.to_str().expect("utf-8")),
        "{}",
        table.stdout
    );
    assert!(
        table.stdout.contains(&format!(" {position} ")),
        "{}",
        table.stdout
    );
}

#[test]
fn a_damaged_index_entry_is_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    several_segments(dir.path());
    let idx = segments(dir.path())[0].with_extension("idx");
    let mut bytes = std::fs::read(&idx).expect("read");
    bytes[8] ^= 0x01; // the first entry's position
    std::fs::write(&idx, &bytes).expect("write");
    let run = spool(dir.path(), &["verify", "--topic", "t", "--output", "json"]);
    expect_code(&run, 3);
    let p = &run.json()["topics"][0]["problems"][0];
    assert_eq!(p["file"], idx.to_str().expect("utf-8"));
}

#[test]
fn damage_in_the_active_segment_is_reported_and_left_in_place() {
    let dir = tempfile::tempdir().expect("tempdir");
    several_segments(dir.path());
    let seg = segments(dir.path()).pop().expect("active segment");
    let mut bytes = std::fs::read(&seg).expect("read");
    bytes[32 + 10] ^= 0x55; // the first record: an open would cut from here as a torn tail
    std::fs::write(&seg, &bytes).expect("write");
    let run = spool(dir.path(), &["verify", "--output", "json"]);
    expect_code(&run, 3);
    let p = &run.json()["topics"][0]["problems"][0];
    assert_eq!(p["file"], seg.to_str().expect("utf-8"));
    assert_eq!(p["position"], 32);
    assert_eq!(
        std::fs::read(&seg).expect("read"),
        bytes,
        "verify changed the file"
    );
}

#[test]
fn an_open_instance_verifies_clean_while_publishes_go_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mq = spool::Spool::open_with(Options {
            segment_bytes: 4096,
            ..Options::new(dir.path())
        })
        .expect("open");
        let writer = mq.clone();
        let publishing = tokio::spawn(async move {
            for i in 0..400u32 {
                let h = Headers::new();
                writer
                    .publish("t", vec![b'y'; 30 + (i as usize % 50)], &h)
                    .await
                    .expect("publish");
            }
        });
        for _ in 0..20 {
            let report = mq.verify(None).await.expect("verify");
            assert!(report.ok(), "{report:?}");
        }
        publishing.await.expect("publisher");
        let report = mq.verify(Some("t")).await.expect("verify");
        assert!(report.ok(), "{report:?}");
        assert_eq!(report.topics[0].records, 400);
        mq.close().await.expect("close");
    });
}

/// Found by review: under `Sync=Always` retention keeps deleted segments to reuse, and
/// a segment made from one holds the old records behind its new ones (after the zeroed
/// frame header the writer puts ahead of each write). Such a healthy directory verifies
/// clean, as it opens clean.
#[test]
fn a_directory_whose_segments_were_recycled_verifies_clean() {
    let dir = tempfile::tempdir().expect("tempdir");
    let opts = || Options {
        segment_bytes: 1024,
        retention_bytes: 2048,
        ..Options::new(dir.path())
    };
    let mq = Spool::open_with(opts()).expect("open");
    for round in 0..4u32 {
        for i in 0..40u32 {
            let body = vec![b'a' + (round as u8); 30 + (i as usize % 9)];
            mq.publish("t", body, &Headers::new()).expect("publish");
        }
        mq.apply_retention().expect("retention");
    }
    // A few records into the segment last made, which may be a recycled file.
    for _ in 0..3 {
        mq.publish("t", b"tail".to_vec(), &Headers::new())
            .expect("publish");
    }
    mq.close().expect("close");
    let run = spool(dir.path(), &["verify"]);
    expect_code(&run, 0);
    let mq = Spool::open_with(opts()).expect("reopen");
    assert_eq!(
        mq.topic_info("t").expect("info").next,
        163,
        "nothing cut at open"
    );
    mq.close().expect("close");
}

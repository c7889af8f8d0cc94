//! The `spool` binary driven as an operator would, on a prepared data directory: each
//! command's table and JSON, dry runs that change nothing, and `--execute` that does.

mod common_cli;

use common_cli::{expect_code, fingerprint, prepare, spool, spool_stdin};

fn prepared() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    prepare(dir.path());
    dir
}

#[test]
fn topics_and_groups_print_tables_and_json() {
    let dir = prepared();
    let d = dir.path();
    let run = spool(d, &["topics"]);
    expect_code(&run, 0);
    let header: Vec<&str> = run
        .stdout
        .lines()
        .next()
        .expect("header")
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        ["TOPIC", "EARLIEST", "NEXT", "MESSAGES", "BYTES", "SEGMENTS"]
    );
    let topics = spool(d, &["--output", "json", "topics"]).json();
    assert_eq!(topics[0]["topic"], "orders");
    assert_eq!(topics[0]["next"], 6);
    assert_eq!(topics[1]["topic"], "orders.dlq");
    assert_eq!(topics[1]["messages"], 2);
    for field in ["earliest", "bytes", "segments"] {
        assert!(topics[0][field].is_u64(), "{field}");
    }

    let run = spool(d, &["groups"]);
    expect_code(&run, 0);
    assert!(run.stdout.starts_with("TOPIC"), "{}", run.stdout);
    assert!(run.stdout.contains("workers"));
    let groups = spool(d, &["groups", "--topic", "orders", "--output", "json"]).json();
    let g = &groups[0];
    assert_eq!(
        (g["topic"].as_str(), g["group"].as_str()),
        (Some("orders"), Some("workers"))
    );
    assert_eq!(
        (g["cursor"].as_u64(), g["next"].as_u64(), g["lag"].as_u64()),
        (Some(3), Some(6), Some(3))
    );
    assert_eq!(g["in_flight"], 0);
    assert_eq!(g["dead_lettered"], 2);
    assert_eq!(g["skipped"], 0);
    assert_eq!(g["pending"][0]["offset"], 3);
    assert_eq!(g["pending"][0]["attempts"], 1);
    assert_eq!(g["pending"][0]["last_reason"], "timeout");
    let none = spool(d, &["groups", "--group", "nobody", "--output", "json"]).json();
    assert_eq!(none, serde_json::json!([]));
}

#[test]
fn tail_prints_the_last_records_and_publish_appends() {
    let dir = prepared();
    let d = dir.path();
    let lines = spool(d, &["tail", "orders", "--output", "json"]).json_lines();
    assert_eq!(lines.len(), 6);
    assert_eq!(lines[5]["payload"], "m5");
    assert_eq!(lines[5]["headers"]["message-id"], "id-5");
    assert!(lines[5]["timestamp_ms"].as_u64().expect("ts") > 0);
    let one = spool(
        d,
        &[
            "tail", "orders", "--from", "4", "--max", "1", "--output", "json",
        ],
    )
    .json_lines();
    assert_eq!(one.len(), 1);
    assert_eq!(one[0]["offset"], 4);
    let table = spool(d, &["tail", "orders", "--from", "1", "--max", "2"]);
    expect_code(&table, 0);
    assert_eq!(table.stdout.lines().count(), 3, "{}", table.stdout);
    assert!(table.stdout.starts_with("OFFSET"));

    let run = spool(
        d,
        &[
            "publish", "orders", "--key", "k1", "--header", "src=cli", "hello", "--output", "json",
        ],
    );
    expect_code(&run, 0);
    assert_eq!(run.json()["offsets"], serde_json::json!([6]));
    let run = spool_stdin(d, &["publish", "orders", "--output", "json"], "a\nb\n");
    assert_eq!(run.json()["offsets"], serde_json::json!([7, 8]));
    let last = spool(
        d,
        &[
            "tail", "orders", "--from", "6", "--max", "1", "--output", "json",
        ],
    )
    .json_lines();
    assert_eq!(last[0]["headers"]["message-key"], "k1");
    assert_eq!(last[0]["headers"]["src"], "cli");
    // The same id again appends nothing: the original offset comes back.
    let again = spool(
        d,
        &[
            "publish",
            "orders",
            "--message-id",
            "id-5",
            "x",
            "--output",
            "json",
        ],
    );
    assert_eq!(again.json()["offsets"], serde_json::json!([5]));
    // --message-id with several lines is refused, and nothing is appended.
    let before = fingerprint(d);
    let run = spool_stdin(d, &["publish", "orders", "--message-id", "x"], "a\nb\n");
    expect_code(&run, 1);
    assert!(run.stderr.starts_with("spool: "), "{}", run.stderr);
    assert_eq!(fingerprint(d), before);
}

#[test]
fn reset_is_a_dry_run_until_execute() {
    let dir = prepared();
    let d = dir.path();
    let before = fingerprint(d);
    let run = spool(
        d,
        &[
            "reset",
            "--topic",
            "orders",
            "--group",
            "workers",
            "--shift-by",
            "-2",
            "--output",
            "json",
        ],
    );
    expect_code(&run, 0);
    let row = &run.json()[0];
    assert_eq!(
        (row["old"].as_u64(), row["new"].as_u64()),
        (Some(3), Some(1))
    );
    assert_eq!(row["executed"], false);
    assert_eq!(row["topic"], "orders");
    assert_eq!(row["group"], "workers");
    assert_eq!(fingerprint(d), before, "a dry run changed something");
    for (flags, new) in [
        (&["--to-earliest"][..], 0),
        (&["--to-latest"][..], 6),
        (&["--to-offset", "99"][..], 6),
        (&["--to-datetime", "2000-01-01T00:00:00Z"][..], 0),
        (&["--to-datetime", "2999-01-01T00:00:00+01:00"][..], 6),
        (&["--by-duration", "1h30m"][..], 0),
        (&["--by-duration", "PT0S"][..], 6),
    ] {
        let args = [
            &[
                "reset", "--topic", "orders", "--group", "workers", "--output", "json",
            ][..],
            flags,
        ]
        .concat();
        let run = spool(d, &args);
        expect_code(&run, 0);
        assert_eq!(run.json()[0]["new"], new, "{flags:?}");
    }
    assert_eq!(fingerprint(d), before, "a dry run changed something");
    let args = [
        "reset",
        "--topic",
        "orders",
        "--group",
        "workers",
        "--to-offset",
        "1",
        "--execute",
        "--output",
        "json",
    ];
    let row = spool(d, &args).json();
    assert_eq!(row[0]["new"], 1);
    assert_eq!(row[0]["executed"], true);
    let g = spool(
        d,
        &[
            "groups", "--topic", "orders", "--group", "workers", "--output", "json",
        ],
    )
    .json();
    assert_eq!(g[0]["cursor"], 1);
    let table = spool(
        d,
        &[
            "reset",
            "--topic",
            "orders",
            "--group",
            "workers",
            "--to-latest",
        ],
    );
    assert!(table.stdout.starts_with("TOPIC"), "{}", table.stdout);
}

#[test]
fn dead_letters_list_show_and_replay_once() {
    let dir = prepared();
    let d = dir.path();
    let list = spool(d, &["dlq", "list", "--output", "json"]).json();
    assert_eq!(list[0]["topic"], "orders.dlq");
    assert_eq!(list[0]["source"], "orders");
    assert_eq!(list[0]["messages"], 2);
    assert_eq!(list[0]["reasons"]["validation failed"], 1);
    assert_eq!(list[0]["reasons"]["upstream 503"], 1);
    let shown = spool(
        d,
        &[
            "dlq",
            "show",
            "orders.dlq",
            "--reason",
            "503",
            "--output",
            "json",
        ],
    )
    .json_lines();
    assert_eq!(shown.len(), 1);
    assert_eq!(shown[0]["payload"], "m2");
    assert_eq!(shown[0]["headers"]["x-original-offset"], "2");
    assert!(
        spool(d, &["dlq", "show", "orders.dlq"])
            .stdout
            .starts_with("OFFSET")
    );

    let before = fingerprint(d);
    let dry = replay(d, false);
    assert_eq!(
        dry,
        serde_json::json!({"to": "orders.retry", "replayed": 2, "duplicates": 0, "executed": false})
    );
    assert_eq!(fingerprint(d), before, "a dry run changed something");
    let first = replay(d, true);
    assert_eq!(
        (first["replayed"].as_u64(), first["duplicates"].as_u64()),
        (Some(2), Some(0))
    );
    let copies = spool(d, &["tail", "orders.retry", "--output", "json"]).json_lines();
    assert_eq!(copies.len(), 2);
    let h = &copies[0]["headers"];
    assert_eq!(h["x-replayed-from"], "orders.dlq:0");
    assert_eq!(h["message-id"], "replay:orders.dlq:0");
    assert_eq!(h["x-original-topic"], "orders");
    assert_eq!(h["x-dead-letter-reason"], "validation failed");
    assert_eq!(copies[0]["payload"], "m1");
    // Run twice: each message appended once (the dry run says so first).
    for execute in [false, true] {
        let again = replay(d, execute);
        assert_eq!(
            (again["replayed"].as_u64(), again["duplicates"].as_u64()),
            (Some(0), Some(2))
        );
    }
    assert_eq!(
        spool(d, &["tail", "orders.retry", "--output", "json"])
            .json_lines()
            .len(),
        2
    );
    // Never into the dead-letter topic itself.
    expect_code(
        &spool(d, &["dlq", "replay", "orders.dlq", "--to", "orders.dlq"]),
        1,
    );
}

/// `dlq replay orders.dlq --to orders.retry` as JSON, a dry run unless `execute`.
fn replay(d: &std::path::Path, execute: bool) -> serde_json::Value {
    let mut args = vec![
        "--output",
        "json",
        "dlq",
        "replay",
        "orders.dlq",
        "--to",
        "orders.retry",
    ];
    if execute {
        args.push("--execute");
    }
    spool(d, &args).json()
}

#[test]
fn snapshot_opens_and_deletions_wait_for_execute() {
    let dir = prepared();
    let d = dir.path();
    let dest = tempfile::tempdir().expect("tempdir");
    let copy = dest.path().join("copy");
    let run = spool(
        d,
        &[
            "snapshot",
            copy.to_str().expect("utf-8"),
            "--output",
            "json",
        ],
    );
    expect_code(&run, 0);
    let s = run.json();
    assert_eq!(s["topics"], 2);
    assert!(s["bytes"].as_u64().expect("bytes") > 0);
    assert_eq!(s["path"], copy.to_str().expect("utf-8"));
    assert_eq!(fingerprint(&copy), fingerprint(d));
    // A second snapshot into the same place is refused.
    expect_code(&spool(d, &["snapshot", copy.to_str().expect("utf-8")]), 1);

    let before = fingerprint(d);
    let dry = spool(
        d,
        &[
            "delete-records",
            "orders",
            "--before",
            "2",
            "--output",
            "json",
        ],
    )
    .json();
    assert_eq!(
        dry,
        serde_json::json!({"topic": "orders", "old_earliest": 0, "new_earliest": 2, "executed": false})
    );
    let dry = spool(
        d,
        &["delete-group", "orders", "workers", "--output", "json"],
    )
    .json();
    assert_eq!(
        dry,
        serde_json::json!({"topic": "orders", "group": "workers", "executed": false})
    );
    assert_eq!(fingerprint(d), before, "a dry run changed something");
    let done = spool(
        d,
        &[
            "delete-records",
            "orders",
            "--before",
            "2",
            "--execute",
            "--output",
            "json",
        ],
    )
    .json();
    assert_eq!(done["new_earliest"], 2);
    assert_eq!(done["executed"], true);
    expect_code(
        &spool(d, &["delete-group", "orders", "workers", "--execute"]),
        0,
    );
    let groups = spool(d, &["groups", "--output", "json"]).json();
    assert_eq!(groups, serde_json::json!([]));
    let topics = spool(d, &["topics", "--output", "json"]).json();
    assert_eq!(topics[0]["earliest"], 2);
}

#[test]
fn binary_payloads_print_as_base64_and_follow_stops_at_max() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let mq = spool::blocking::Spool::open_with(spool::Options::new(d)).expect("open");
    mq.publish("bin", vec![0xff, 0xfe], &spool::Headers::new())
        .expect("publish");
    mq.publish("bin", b"text".to_vec(), &spool::Headers::new())
        .expect("publish");
    mq.close().expect("close");
    let run = spool(
        d,
        &[
            "tail", "bin", "--follow", "--from", "0", "--max", "2", "--output", "json",
        ],
    );
    expect_code(&run, 0);
    let lines = run.json_lines();
    assert_eq!(lines[0]["payload_base64"], "//4=");
    assert!(lines[0].get("payload").is_none());
    assert_eq!(lines[1]["payload"], "text");
    let table = spool(d, &["tail", "bin"]);
    assert!(
        table.stdout.contains("<2 bytes, not UTF-8>"),
        "{}",
        table.stdout
    );
}

#[test]
fn rust_log_shows_events_on_stderr_and_nothing_without_it() {
    let dir = prepared();
    let d = dir.path().to_str().expect("utf-8");
    let args = [
        "--data",
        d,
        "reset",
        "--topic",
        "orders",
        "--group",
        "workers",
        "--to-latest",
        "--execute",
    ];
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_spool"))
        .args(args)
        .env("RUST_LOG", "info")
        .output()
        .expect("run");
    let stderr = String::from_utf8(out.stderr).expect("utf-8");
    assert!(stderr.contains("group reset"), "{stderr}");
    assert!(
        !stderr.contains('\u{1b}'),
        "colours off a terminal: {stderr}"
    );
    let quiet = spool(
        dir.path(),
        &[
            "reset",
            "--topic",
            "orders",
            "--group",
            "workers",
            "--to-latest",
            "--execute",
        ],
    );
    assert_eq!(quiet.stderr, "");
}

/// A replayed copy of a message that had an id carries the replay's id, and the original
/// one under `x-original-message-id` (so the target de-duplicates replays, not the
/// application's own re-sends).
#[test]
fn a_replayed_copy_keeps_the_original_message_id_under_another_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    {
        let opts = spool::Options {
            max_delivery_attempts: 1,
            ..spool::Options::new(d)
        };
        let mq = spool::blocking::Spool::open_with(opts).expect("open");
        let mut h = spool::Headers::new();
        h.insert("message-id".into(), "order-7".into());
        mq.publish("pay", b"p".to_vec(), &h).expect("publish");
        let mut c = mq
            .consumer("pay", "g")
            .manual_ack()
            .build()
            .expect("consumer");
        c.recv().expect("recv").nack("bad card").expect("nack");
        c.close().expect("close consumer");
        mq.close().expect("close");
    }
    let args = ["dlq", "replay", "pay.dlq", "--to", "pay.retry", "--execute"];
    let run = spool(d, &[&["--output", "json"], &args[..]].concat());
    assert_eq!(run.json()["replayed"], 1, "{}", run.stderr);
    let copy = &spool(d, &["tail", "pay.retry", "--output", "json"]).json_lines()[0];
    assert_eq!(copy["headers"]["message-id"], "replay:pay.dlq:0");
    assert_eq!(copy["headers"]["x-original-message-id"], "order-7");
    assert_eq!(copy["headers"]["x-dead-letter-reason"], "bad card");
    // The application re-sending its own message is not taken for the replay.
    let again = spool(d, &["publish", "pay.retry", "--message-id", "order-7", "p"]);
    expect_code(&again, 0);
    assert_eq!(
        spool(d, &["tail", "pay.retry", "--output", "json"])
            .json_lines()
            .len(),
        2
    );
}

/// Lines from stdin go in as one batch when the directory is opened by the command: a
/// bad line anywhere (here the 1,001st, past `Max Message Bytes`) appends none of them.
#[test]
fn a_bad_line_on_stdin_publishes_nothing_however_many_came_before() {
    let dir = prepared();
    let d = dir.path();
    let before = fingerprint(d);
    let mut input = "ok\n".repeat(1000);
    input += "this line is longer than ten bytes\n";
    let conn = format!("Data Source={};Max Message Bytes=10", d.display());
    let run = spool_stdin(std::path::Path::new(&conn), &["publish", "orders"], &input);
    expect_code(&run, 1);
    assert!(run.stderr.contains("Max Message Bytes"), "{}", run.stderr);
    assert_eq!(fingerprint(d), before, "part of the lines went in");
}

/// An empty stdin publishes nothing and makes no topic.
#[test]
fn an_empty_stdin_publishes_nothing_and_makes_no_topic() {
    let dir = prepared();
    let d = dir.path();
    let before = fingerprint(d);
    let run = spool_stdin(d, &["--output", "json", "publish", "fresh"], "");
    expect_code(&run, 0);
    assert_eq!(run.json()["offsets"], serde_json::json!([]));
    assert_eq!(fingerprint(d), before, "a topic was made");
}

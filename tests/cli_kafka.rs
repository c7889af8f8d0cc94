//! The command line on `Mode=Kafka` (issue 30 point 5): `topics`, `groups`, `reset` (dry
//! run and execute), `tail`, `dlq list|show|replay` against librdkafka's mock cluster.
//! The mock's brokers listen on loopback, so the `spool` binary reaches the cluster this
//! test process holds.
#![cfg(feature = "kafka")]

use std::process::{Command, Stdio};

use common_kafka::{Cluster, recv};
use spool::Headers;

mod common_kafka;

fn spool(conn: &str, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_spool"))
        .args([&["--data", conn], args].concat())
        .env_remove("SPOOL_DATA")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("run spool");
    let text = |b: Vec<u8>| String::from_utf8(b).expect("utf-8");
    (
        out.status.code().expect("exited"),
        text(out.stdout),
        text(out.stderr),
    )
}

fn json(conn: &str, args: &[&str]) -> serde_json::Value {
    let (code, out, err) = spool(conn, &[&["--output", "json"], args].concat());
    assert_eq!(code, 0, "spool {args:?}: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

fn json_lines(conn: &str, args: &[&str]) -> Vec<serde_json::Value> {
    let (code, out, err) = spool(conn, &[&["--output", "json"], args].concat());
    assert_eq!(code, 0, "spool {args:?}: {err}");
    out.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// orders: m0 acked, m1 dead-lettered ("validation failed"), m2 acked, by group `g`.
async fn prepare(cluster: &Cluster) {
    let mq = cluster.open("Max Delivery Attempts=1");
    for i in 0..3 {
        let p = format!("m{i}").into_bytes();
        mq.publish("orders", p, &Headers::new())
            .await
            .expect("publish");
    }
    let mut c = mq
        .consumer("orders", "g")
        .manual_ack()
        .build()
        .expect("consumer");
    recv(&mut c).await.ack().await.expect("ack");
    let out = recv(&mut c)
        .await
        .nack("validation failed")
        .await
        .expect("nack");
    assert!(out.dead_lettered);
    recv(&mut c).await.ack().await.expect("ack");
    drop(c);
    mq.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_line_works_on_kafka() {
    let cluster = Cluster::new(&["orders", "orders.dlq", "orders.retry"]);
    prepare(&cluster).await;
    let conn = cluster.connection("Max Delivery Attempts=1");
    let conn = conn.as_str();
    tokio::task::spawn_blocking({
        let conn = conn.to_owned();
        move || commands(&conn)
    })
    .await
    .expect("commands");
}

fn commands(conn: &str) {
    let topics = json(conn, &["topics"]);
    let names: Vec<&str> = topics
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|t| t["topic"].as_str())
        .collect();
    assert!(
        names.contains(&"orders") && names.contains(&"orders.dlq"),
        "{topics}"
    );
    let g = json(conn, &["groups", "--topic", "orders", "--group", "g"]);
    assert_eq!(g[0]["cursor"], 3, "{g}");
    // A reset of a group nobody joined: a dry run changes nothing, --execute moves it.
    let reset = [
        "reset",
        "--topic",
        "orders",
        "--group",
        "fresh",
        "--to-offset",
        "1",
    ];
    let (code, _, err) = spool(conn, &reset);
    assert_eq!(code, 0, "{err}");
    let fresh = json(conn, &["groups", "--topic", "orders", "--group", "fresh"]);
    assert_eq!(fresh[0]["cursor"], 0, "a dry run: {fresh}");
    let (code, _, err) = spool(conn, &[&reset[..], &["--execute"]].concat());
    assert_eq!(code, 0, "{err}");
    let fresh = json(conn, &["groups", "--topic", "orders", "--group", "fresh"]);
    assert_eq!(fresh[0]["cursor"], 1, "{fresh}");
    let tail = json_lines(conn, &["tail", "orders"]);
    assert_eq!(tail.len(), 3);
    assert_eq!(tail[2]["payload"], "m2");
    let list = json(conn, &["dlq", "list"]);
    assert_eq!(list[0]["topic"], "orders.dlq", "{list}");
    assert_eq!(list[0]["messages"], 1);
    let shown = json_lines(conn, &["dlq", "show", "orders.dlq"]);
    assert_eq!(shown[0]["headers"]["x-original-offset"], "1");
    assert_eq!(
        shown[0]["headers"]["x-dead-letter-reason"],
        "validation failed"
    );
    let replay = [
        "dlq",
        "replay",
        "orders.dlq",
        "--to",
        "orders.retry",
        "--execute",
    ];
    let first = json(conn, &replay);
    assert_eq!(
        (first["replayed"].as_u64(), first["duplicates"].as_u64()),
        (Some(1), Some(0))
    );
    let again = json(conn, &replay);
    assert_eq!(
        (again["replayed"].as_u64(), again["duplicates"].as_u64()),
        (Some(0), Some(1))
    );
    assert_eq!(json_lines(conn, &["tail", "orders.retry"]).len(), 1);
}

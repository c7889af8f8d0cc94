//! The `spool` binary against a live instance (issue 28 point 2): with an application
//! holding the directory, every command goes through the owner's admin endpoint, and a
//! change made there is seen by the application's running consumer on its next `recv`.

mod common_cli;

use std::time::Duration;

use common_cli::{expect_code, spool};
use spool::{Headers, Spool};

const TOPIC: &str = "orders";
const GROUP: &str = "workers";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_go_through_a_running_owner() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path().to_owned();
    let mq = Spool::open(&format!("Data Source={}", d.display())).expect("open");
    for i in 0..4u8 {
        mq.publish(TOPIC, vec![b'0' + i], &Headers::new())
            .await
            .expect("publish");
    }
    let mut c = mq
        .consumer(TOPIC, GROUP)
        .manual_ack()
        .build()
        .expect("consumer");
    for _ in 0..3 {
        c.recv().await.expect("recv").ack().await.expect("ack");
    }
    // The binary blocks on its calls: run it off the runtime the owner serves from.
    let run = |args: &[&str]| {
        let (d, args): (_, Vec<String>) = (d.clone(), args.iter().map(|a| a.to_string()).collect());
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            spool(&d, &args)
        })
    };
    let groups = run(&["--output", "json", "groups"])
        .await
        .expect("join")
        .json();
    assert_eq!(
        groups[0]["cursor"], 3,
        "the owner's state, unflushed or not"
    );

    let published = run(&["--output", "json", "publish", TOPIC, "from the shell"])
        .await
        .expect("join")
        .json();
    assert_eq!(published["offsets"][0], 4);

    let reset = run(&[
        "--output",
        "json",
        "reset",
        "--topic",
        "orders",
        "--group",
        "workers",
        "--to-earliest",
        "--execute",
    ])
    .await
    .expect("join");
    expect_code(&reset, 0);
    assert_eq!(reset.json()[0]["new"], 0);
    // The running consumer sees the reset on its next recv.
    let d0 = tokio::time::timeout(Duration::from_secs(20), c.recv())
        .await
        .expect("a delivery")
        .expect("recv");
    assert_eq!(d0.offset(), 0);

    let verify = run(&["verify"]).await.expect("join");
    expect_code(&verify, 0);
    let backups = tempfile::tempdir().expect("tempdir");
    let snap = backups.path().join("snap");
    let snap_arg = snap.to_str().expect("utf-8 path");
    let taken = run(&["--output", "json", "snapshot", snap_arg])
        .await
        .expect("join");
    expect_code(&taken, 0);
    assert_eq!(taken.json()["topics"], 1);
    drop(d0);
    drop(c);
    mq.close().await.expect("close");
    let copy = Spool::open(&format!("Data Source={}", snap.display())).expect("the copy opens");
    assert_eq!(copy.topic_info(TOPIC).expect("info").next, 5);
    copy.close().await.expect("close");
}

/// More lines on stdin than one request to the owner carries go in as several requests,
/// in order; none is refused for its number.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_stdin_goes_through_the_owner_in_several_requests() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path().to_owned();
    let mq = Spool::open(&format!("Data Source={}", d.display())).expect("open");
    let lines = spool::admin::limits::MAX_BATCH_ITEMS + 5;
    let input: String = (0..lines).map(|i| format!("{i}\n")).collect();
    let run = tokio::task::spawn_blocking(move || {
        common_cli::spool_stdin(&d, &["--output", "json", "publish", TOPIC], &input)
    });
    let run = run.await.expect("join");
    expect_code(&run, 0);
    let offsets = run.json()["offsets"].as_array().expect("offsets").len();
    assert_eq!(offsets, lines);
    let info = mq.topic_info(TOPIC).expect("info");
    assert_eq!(info.next, lines as u64, "all of them, in the owner");
    let last = mq.fetch(TOPIC, info.next - 1, 1).await.expect("fetch");
    assert_eq!(&last[0].payload()[..], (lines - 1).to_string().as_bytes());
    mq.close().await.expect("close");
}

//! Issue 27 point 1 (nack with delay and backoff): a delayed message is not delivered
//! again before its time, also across a reopen; the cursor stays at it; with
//! `max_in_flight(1)` later messages wait behind it, with more they go on and the waiting
//! one comes first once due; `Nack Backoff` gives plain nacks their delay by attempt.
//! Timing: only lower bounds ("not before") are asserted; `WAIT` guards against hangs.

mod common_core;
mod common_groups;

use std::time::{Duration, Instant, SystemTime};

use common_groups::{assert_nothing, manual, open, publish_n, recv};
use spool::consts::UNCLEAN_STOP_REASON;
use spool::testing::{SimFs, without_background_work};
use spool::{Consumer, Error, Options, SyncPolicy};

const TOPIC: &str = "delay.events";
const GROUP: &str = "workers";

/// `redeliver_at` must be `delay` after a moment between `before` and `after` (whole ms).
fn assert_due(at: Option<SystemTime>, before: SystemTime, after: SystemTime, delay: Duration) {
    let at = at.expect("a delayed nack says when");
    let ms = Duration::from_millis(1);
    assert!(
        at + ms >= before + delay,
        "{at:?} is before {before:?} + {delay:?}"
    );
    assert!(
        at <= after + delay + ms,
        "{at:?} is after {after:?} + {delay:?}"
    );
}

#[tokio::test]
async fn a_delayed_message_waits_and_in_strict_order_so_does_everything_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 3).await;
    let mut c = manual(&mq, TOPIC, GROUP, 1);
    let d = recv(&mut c).await;
    let delay = Duration::from_secs(2);
    let (before, start) = (SystemTime::now(), Instant::now());
    let out = d.nack_with_delay("upstream 503", delay).await.unwrap();
    assert_due(out.redeliver_at, before, SystemTime::now(), delay);
    assert_eq!((out.delivery_attempt, out.next_offset), (1, 0));
    assert_nothing(&mut c).await;
    assert_eq!(
        mq.group_info(TOPIC, GROUP).unwrap().cursor,
        0,
        "the floor stays"
    );
    let again = recv(&mut c).await;
    assert!(start.elapsed() >= delay, "redelivered before its delay");
    assert_eq!((again.offset(), again.attempt()), (0, 2));
    again.ack().await.unwrap();
    assert_eq!(recv(&mut c).await.offset(), 1);
}

#[tokio::test]
async fn with_more_in_flight_later_messages_go_on_and_the_waiting_one_comes_first() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 20).await;
    let mut c = manual(&mq, TOPIC, GROUP, 2);
    let first = recv(&mut c).await;
    assert_eq!(first.offset(), 0);
    let out = first
        .nack_with_delay("later", Duration::from_secs(3))
        .await
        .unwrap();
    let at = out.redeliver_at.expect("delayed");
    // Later messages flow meanwhile (with a wide margin before it is due); the cursor
    // stays at the waiting one.
    let mut next = 1;
    while next < 5 && SystemTime::now() + Duration::from_millis(500) < at {
        let d = recv(&mut c).await;
        assert_eq!(d.offset(), next);
        d.ack().await.unwrap();
        next += 1;
    }
    assert!(next > 1, "nothing after the waiting message was delivered");
    assert_eq!(mq.group_info(TOPIC, GROUP).unwrap().cursor, 0);
    let wait = at.duration_since(SystemTime::now()).unwrap_or_default();
    tokio::time::sleep(wait).await;
    let d = recv(&mut c).await;
    assert_eq!((d.offset(), d.attempt()), (0, 2), "due: it comes first");
    d.ack().await.unwrap();
    assert_eq!(mq.group_info(TOPIC, GROUP).unwrap().cursor, next);
}

#[tokio::test]
async fn a_reopen_inside_the_delay_still_waits() {
    let dir = tempfile::tempdir().unwrap();
    let delay = Duration::from_secs(2);
    let start = Instant::now();
    {
        let mq = open(dir.path(), "");
        publish_n(&mq, TOPIC, 2).await;
        let mut c = manual(&mq, TOPIC, GROUP, 1);
        recv(&mut c)
            .await
            .nack_with_delay("wait", delay)
            .await
            .unwrap();
        drop(c);
        mq.close().await.unwrap();
    }
    let mq = open(dir.path(), "");
    let mut c = manual(&mq, TOPIC, GROUP, 1);
    let d = recv(&mut c).await;
    assert!(
        start.elapsed() >= delay,
        "redelivered before its delay after a reopen"
    );
    assert_eq!((d.offset(), d.attempt()), (0, 2));
}

/// Receives the next delivery, nacks it (with `delay` if given) and checks that it comes
/// due `expect` later; returns the delivery's attempt.
async fn nack_and_expect(c: &mut Consumer, delay: Option<Duration>, expect: Duration) -> u32 {
    let d = recv(c).await;
    let attempt = d.attempt();
    let before = SystemTime::now();
    let out = match delay {
        Some(delay) => d.nack_with_delay("again", delay).await,
        None => d.nack("again").await,
    };
    assert_due(out.unwrap().redeliver_at, before, SystemTime::now(), expect);
    attempt
}

#[tokio::test]
async fn the_backoff_gives_the_nth_failure_the_nth_delay() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(
        dir.path(),
        "Nack Backoff=20ms,50ms; Max Delivery Attempts=4",
    );
    publish_n(&mq, TOPIC, 1).await;
    let mut c = manual(&mq, TOPIC, GROUP, 1);
    for (n, ms) in [(1, 20), (2, 50), (3, 50)] {
        let attempt = nack_and_expect(&mut c, None, Duration::from_millis(ms)).await;
        assert_eq!(attempt, n);
    }
    // The fourth failure reaches the limit: dead-lettered, nothing to wait for.
    let out = recv(&mut c).await.nack("last").await.unwrap();
    assert!(out.dead_lettered && out.redeliver_at.is_none());
}

#[tokio::test]
async fn an_exponential_backoff_doubles_and_an_explicit_delay_wins() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(
        dir.path(),
        "Nack Backoff=exp:10ms..30ms; Max Delivery Attempts=0",
    );
    publish_n(&mq, TOPIC, 1).await;
    let mut c = manual(&mq, TOPIC, GROUP, 1);
    for ms in [10, 20, 30, 30] {
        nack_and_expect(&mut c, None, Duration::from_millis(ms)).await;
    }
    let mine = Duration::from_millis(70);
    nack_and_expect(&mut c, Some(mine), mine).await;
    // Zero is a plain nack: the backoff's delay (its sixth step, 30 ms).
    nack_and_expect(&mut c, Some(Duration::ZERO), Duration::from_millis(30)).await;
}

#[tokio::test]
async fn without_a_backoff_a_plain_nack_is_immediate() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "");
    publish_n(&mq, TOPIC, 1).await;
    let mut c = manual(&mq, TOPIC, GROUP, 1);
    let out = recv(&mut c).await.nack("now").await.unwrap();
    assert_eq!(out.redeliver_at, None);
    assert_eq!(recv(&mut c).await.attempt(), 2);
}

#[tokio::test]
async fn the_low_level_nack_waits_too() {
    let dir = tempfile::tempdir().unwrap();
    let mq = open(dir.path(), "Nack Backoff=1h");
    publish_n(&mq, TOPIC, 2).await;
    let before = SystemTime::now();
    let out = mq.nack(TOPIC, GROUP, 0, "plain").await.unwrap();
    assert_due(
        out.redeliver_at,
        before,
        SystemTime::now(),
        Duration::from_secs(3600),
    );
    let delay = Duration::from_millis(200);
    let start = Instant::now();
    let before = SystemTime::now();
    let out = mq
        .nack_with_delay(TOPIC, GROUP, 0, "sooner", delay)
        .await
        .unwrap();
    assert_due(out.redeliver_at, before, SystemTime::now(), delay);
    assert_eq!(out.delivery_attempt, 2);
    let mut c = manual(&mq, TOPIC, GROUP, 1);
    let d = recv(&mut c).await;
    assert!(start.elapsed() >= delay);
    assert_eq!((d.offset(), d.attempt()), (0, 3));
}

#[test]
fn a_malformed_backoff_is_refused_at_open() {
    for bad in ["500", "1s,", "exp:5s..1s", "soon"] {
        let e = spool::Options::parse(&format!("Data Source=x; Nack Backoff={bad}")).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidConnectionString { key, .. } if key == "Nack Backoff"),
            "{bad}: {e}"
        );
    }
}

/// The power-loss campaign's part for delays: a cut at every file operation of a
/// `nack_with_delay` finds either the nack (its attempt and its wait: nothing delivered,
/// strict order) or the delivery still out (charged for the unclean stop if its group's
/// last image had it out, and delivered again at once), never a lost wait after the nack
/// returned.
#[test]
fn a_power_cut_during_a_delayed_nack_keeps_the_wait_or_the_delivery() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    let opts = || Options {
        sync: SyncPolicy::Always,
        ..without_background_work(Options::new("/data"))
    };
    let (mut waited, mut not_nacked) = (0, 0);
    for k in 1..200u64 {
        let fs = SimFs::new(k);
        let mq = spool::Spool::open_simulated(opts(), &fs).expect("open");
        let mut c = manual(&mq, TOPIC, GROUP, 1);
        let d = rt.block_on(async {
            publish_n(&mq, TOPIC, 2).await;
            recv(&mut c).await
        });
        let hour = Duration::from_secs(3600);
        let (r, image, inside) =
            common_core::cut_during(&fs, k, || rt.block_on(d.nack_with_delay("later", hour)));
        drop((c, mq));
        let mq = spool::Spool::open_simulated(opts(), &image).expect("reopen");
        let pending = mq.group_info(TOPIC, GROUP).expect("info").pending;
        let mut c = manual(&mq, TOPIC, GROUP, 1);
        let next = rt
            .block_on(c.recv_timeout(Duration::from_millis(20)))
            .expect("recv");
        match pending.first().map(|p| p.last_reason.as_str()) {
            Some("later") => {
                assert!(next.is_none(), "cut {k}: the wait was lost");
                waited += 1;
            }
            // Not nacked: the delivery was out at the cut. It is charged one attempt if
            // the group's last durable image had it out, and comes again at once.
            reason => {
                assert!(inside, "cut {k}: a returned nack was lost: {r:?}");
                let charges = u32::from(reason == Some(UNCLEAN_STOP_REASON));
                assert_eq!(pending.len() as u32, charges, "cut {k}: {pending:?}");
                let d = next.expect("delivered again at once");
                assert_eq!((d.offset(), d.attempt()), (0, 1 + charges), "cut {k}");
                not_nacked += 1;
            }
        }
        if !inside {
            r.expect("ran whole");
            break;
        }
    }
    assert!(
        waited > 0 && not_nacked > 0,
        "waited {waited}, not nacked {not_nacked}"
    );
}

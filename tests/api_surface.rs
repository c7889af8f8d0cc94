//! Compile-time check of the public surface promised in ../API.md.
//!
//! Copy this file into the crate as `tests/api_surface.rs`. It only has to compile (and its
//! one test runs in milliseconds): every call below is spelled the way applications,
//! examples and tools will spell it. If a change to the crate breaks this file, the change
//! broke the contract.
#![allow(dead_code, unused_variables, unused_mut, clippy::all)]

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use spool::{Delivery, Error, Headers, NackOutcome, OffsetReset, Spool};

fn assert_send<T: Send>() {}
fn assert_sync<T: Sync>() {}
fn assert_clone<T: Clone>() {}
fn assert_error<T: std::error::Error + Send + Sync + 'static>() {}

async fn every_call(mq: Spool) -> Result<(), Error> {
    let mut headers = Headers::new();
    headers.insert("message-id".to_owned(), "order-1".to_owned());
    let offset: u64 = mq
        .publish("factory.events", b"order-created".to_vec(), &headers)
        .await?;
    let offset: u64 = mq
        .publish("factory.events", Bytes::from_static(b"x"), &Headers::new())
        .await?;
    let offsets: Vec<u64> = mq
        .publish_batch(
            "factory.events",
            vec![(Bytes::from_static(b"a"), Headers::new())],
        )
        .await?;

    let mut consumer = mq
        .consumer("factory.events", "quality-workers")
        .manual_ack()
        .max_in_flight(8)
        .build()?;
    let d: Delivery = consumer.recv().await?;
    let topic: &str = d.topic();
    let group: &str = d.group();
    let at: u64 = d.offset();
    let payload: &Bytes = d.payload();
    let h: &Headers = d.headers();
    let ts: SystemTime = d.timestamp();
    let attempt: u32 = d.attempt();
    d.ack().await?;
    if let Some(d) = consumer.recv_timeout(Duration::from_millis(5)).await? {
        let r: NackOutcome = d.nack("validation failed").await?;
        let (n, dead, next): (u32, bool, u64) =
            (r.delivery_attempt, r.dead_lettered, r.next_offset);
    }
    {
        use futures_util::StreamExt;
        let mut stream = std::pin::pin!(consumer.pull());
        if let Some(d) = stream.next().await {
            let d: Delivery = d?;
        }
    }
    drop(consumer);
    let auto = mq.consumer("factory.events", "auto").build()?;
    drop(auto);

    mq.ack("factory.events", "g", 0).await?;
    let r: NackOutcome = mq.nack("factory.events", "g", 0, "reason").await?;
    for to in [
        OffsetReset::Earliest,
        OffsetReset::Latest,
        OffsetReset::Time(SystemTime::now()),
        OffsetReset::Explicit(3),
    ] {
        let cursor: u64 = mq.reset_offset("factory.events", "g", to).await?;
    }

    for rec in mq.fetch("factory.events", 0, 100).await? {
        let (o, t, p, h): (u64, SystemTime, &Bytes, &Headers) =
            (rec.offset(), rec.timestamp(), rec.payload(), rec.headers());
    }
    let t = mq.topic_info("factory.events")?;
    let (e, n, m, b, s): (u64, u64, u64, u64, usize) =
        (t.earliest, t.next, t.messages, t.bytes, t.segments);
    let g = mq.group_info("factory.events", "g")?;
    let (c, n, l, f, dl, sk): (u64, u64, u64, usize, u64, u64) = (
        g.cursor,
        g.next,
        g.lag,
        g.in_flight,
        g.dead_lettered,
        g.skipped,
    );
    for p in &g.pending {
        let (o, a, why): (u64, u32, &String) = (p.offset, p.attempts, &p.last_reason);
    }
    let topics: Vec<String> = mq.topics()?;
    mq.close().await
}

fn errors(e: &Error) -> &'static str {
    match e {
        Error::InvalidConnectionString { .. } => "connection string",
        Error::InvalidTopicName { .. } => "topic",
        Error::InvalidMessageId { .. } => "message id",
        Error::MessageTooLarge { .. } => "too large",
        Error::NotAtCursor {
            expected, actual, ..
        } => "not at cursor",
        Error::Locked { .. } => "locked",
        Error::Unsupported { .. } => "unsupported",
        Error::Corrupt { .. } => "corrupt",
        Error::Closed { .. } => "closed",
        Error::Io { .. } => "io",
        _ => "other",
    }
}

#[test]
fn the_public_surface_has_the_promised_shape() {
    assert_clone::<Spool>();
    assert_send::<Spool>();
    assert_sync::<Spool>();
    assert_send::<Delivery>();
    assert_error::<Error>();
    let _open: fn(&str) -> Result<Spool, Error> = |cs| Spool::open(cs);
    let _check = every_call;
}

//! Compile-time check of the additions in ../API.md ("Additions (December 2026)").
//!
//! Copy this file into the crate as `tests/next_surface.rs` in the commit that makes all
//! of it compile. Like api_surface.rs it only has to compile; every call is spelled the
//! way applications will spell it.
#![allow(dead_code, unused_variables, unused_mut, clippy::all)]

use std::time::{Duration, Instant, SystemTime};

use spool::{Delivery, Error, Headers, NackOutcome, SnapshotInfo, Spool, TopicConfig};

async fn delivery_control(mq: Spool) -> Result<(), Error> {
    let mut c = mq
        .consumer("orders", "billing")
        .manual_ack()
        .max_in_flight(64)
        .key_ordered()
        .ack_deadline(Duration::from_secs(30))
        .build()?;
    let d: Delivery = c.recv().await?;
    let when: Option<Instant> = d.deadline();
    d.extend_deadline()?;
    let part: u32 = d.partition();
    let r: NackOutcome = d
        .nack_with_delay("upstream 503", Duration::from_secs(2))
        .await?;
    let at: Option<SystemTime> = r.redeliver_at;
    let r: NackOutcome = mq
        .nack_with_delay("orders", "billing", 0, "again", Duration::from_millis(10))
        .await?;
    let key: &str = spool::consts::MESSAGE_KEY_HEADER;
    let why: &str = spool::consts::ACK_DEADLINE_REASON;
    Ok(())
}

async fn lifecycle(mq: Spool) -> Result<(), Error> {
    let groups: Vec<String> = mq.groups("orders")?;
    mq.delete_group("orders", "old-group").await?;
    let earliest: u64 = mq.delete_records_before("orders", 1_000).await?;
    mq.set_topic_config(
        "orders",
        TopicConfig {
            retention_bytes: Some(1 << 30),
            ..Default::default()
        },
    )
    .await?;
    let cfg: &TopicConfig = &mq.topic_info("orders")?.config;
    let s: SnapshotInfo = mq.snapshot("./backups/spool-snapshot").await?;
    let (t, b): (usize, u64) = (s.topics, s.bytes);
    Ok(())
}

fn blocking() -> Result<(), Error> {
    let mq = spool::blocking::Spool::open("Data Source=./demo-data")?;
    let offset: u64 = mq.publish("orders", b"o-1".to_vec(), &Headers::new())?;
    let mut c = mq.consumer("orders", "billing").manual_ack().build()?;
    let d: spool::blocking::Delivery = c.recv()?;
    d.ack()?;
    if let Some(d) = c.recv_timeout(Duration::from_millis(5))? {
        let r: NackOutcome = d.nack("bad")?;
    }
    for d in c.iter().take(1) {
        d?.ack()?;
    }
    mq.close()
}

fn errors(e: &Error) -> &'static str {
    match e {
        Error::DeliveryExpired { .. } => "expired",
        Error::GroupInUse { .. } => "group in use",
        _ => "other",
    }
}

#[test]
fn the_additions_have_the_promised_shape() {
    let _a = delivery_control;
    let _b = lifecycle;
    let _c = blocking;
}

//! The whole story on a local data directory (`./demo-data`):
//! publish orders (one twice, de-duplicated), reopen and read them back, consume with
//! manual ack, nack a poison order until it lands in the dead-letter topic, inspect it,
//! replay the group from a point in time, retry a transient failure after a delay, take
//! back what a hung handler holds (ack deadline), and print the group's state.
//!
//! Run: `cargo run --release --example quickstart`

use std::time::{Duration, Instant, SystemTime};

use spool::{Headers, OffsetReset, Spool};

const TOPIC: &str = "factory.events";
const GROUP: &str = "quality-workers";

fn order(id: &str) -> Headers {
    let mut h = Headers::new();
    h.insert("message-id".into(), id.into());
    h.insert("content-type".into(), "text/plain".into());
    h
}

#[tokio::main]
async fn main() -> Result<(), spool::Error> {
    let dir = "./demo-data";
    // Start from an empty directory so every run tells the same story.
    let _ = std::fs::remove_dir_all(dir);
    let conn = format!("Data Source={dir};Mode=Embedded");

    println!(
        "1. Opening spool on {dir} (Sync=Always: every publish is on disk before it returns)."
    );
    let mq = Spool::open(&conn)?;

    println!("\n2. Publishing four orders to topic '{TOPIC}' (two now, two a moment later).");
    let mut second_wave = SystemTime::now();
    for (i, (id, body)) in [
        ("order-1", "order 1: 3 x gear"),
        ("order-2", "order 2: 1 x shaft"),
        (
            "order-3",
            "order 3: POISON (the quality check always rejects it)",
        ),
        ("order-4", "order 4: 7 x bolt"),
    ]
    .into_iter()
    .enumerate()
    {
        if i == 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            second_wave = SystemTime::now();
        }
        let offset = mq
            .publish(TOPIC, body.as_bytes().to_vec(), &order(id))
            .await?;
        println!("   published {id} at offset {offset}");
    }

    println!("\n3. A producer retries order-2 (same message-id). Nothing is appended twice:");
    let again = mq
        .publish(TOPIC, b"order 2: 1 x shaft".to_vec(), &order("order-2"))
        .await?;
    let info = mq.topic_info(TOPIC)?;
    println!(
        "   the retry returned the original offset {again}; the topic still holds {} messages",
        info.messages
    );

    println!("\n4. Closing and reopening: everything is read back from disk.");
    mq.close().await?;
    let mq = Spool::open(&conn)?;
    for r in mq.fetch(TOPIC, 0, 100).await? {
        println!(
            "   offset {} [{}]: {}",
            r.offset(),
            r.headers().get("message-id").map_or("-", String::as_str),
            String::from_utf8_lossy(r.payload())
        );
    }
    let again = mq
        .publish(TOPIC, b"order 2: 1 x shaft".to_vec(), &order("order-2"))
        .await?;
    println!("   a retry after the restart still de-duplicates: offset {again}");

    println!("\n5. Consuming as group '{GROUP}' with manual acks. The poison order is nacked;");
    println!("   it is delivered again, and after 5 attempts it goes to '{TOPIC}.dlq'.");
    let mut consumer = mq.consumer(TOPIC, GROUP).manual_ack().build()?;
    let mut finished = 0;
    while finished < 4 {
        let d = consumer.recv().await?;
        let body = String::from_utf8_lossy(d.payload()).into_owned();
        if body.contains("POISON") {
            let offset = d.offset();
            let r = d.nack("quality check failed: unknown part").await?;
            println!(
                "   offset {offset} attempt {}: nacked{}",
                r.delivery_attempt,
                if r.dead_lettered {
                    " -> dead-lettered"
                } else {
                    ""
                }
            );
            if r.dead_lettered {
                finished += 1;
            }
        } else {
            println!(
                "   offset {} attempt {}: '{body}' ok, acked",
                d.offset(),
                d.attempt()
            );
            d.ack().await?;
            finished += 1;
        }
    }

    println!("\n6. The dead-letter copy keeps the payload and says where it came from:");
    for r in mq.fetch(&format!("{TOPIC}.dlq"), 0, 10).await? {
        println!("   payload: {}", String::from_utf8_lossy(r.payload()));
        for (k, v) in r.headers() {
            println!("     {k}: {v}");
        }
    }

    println!("\n7. Replaying the group from the time the second wave of orders was published.");
    let cursor = mq
        .reset_offset(TOPIC, GROUP, OffsetReset::Time(second_wave))
        .await?;
    println!("   the cursor is back at offset {cursor}; the next delivery is:");
    let d = consumer.recv().await?;
    println!(
        "   offset {}: '{}' (attempt {})",
        d.offset(),
        String::from_utf8_lossy(d.payload()),
        d.attempt()
    );
    d.ack().await?;

    delayed_retry_and_deadline(&mq).await?;

    let g = mq.group_info(TOPIC, GROUP)?;
    println!(
        "\n9. Group '{GROUP}': cursor {}, log end {}, lag {}, in flight {}, dead-lettered {}.",
        g.cursor, g.next, g.lag, g.in_flight, g.dead_lettered
    );
    drop(consumer);
    mq.close().await?;
    println!("\nDone. The data is in {dir}; run again to start over.");
    Ok(())
}

/// Step 8: a second group retries a transient failure after a delay, and its ack
/// deadline takes back a delivery whose handler hung.
async fn delayed_retry_and_deadline(mq: &Spool) -> Result<(), spool::Error> {
    println!("\n8. Group 'billing' retries a transient failure later, and has an ack deadline.");
    let mut billing = mq
        .consumer(TOPIC, "billing")
        .manual_ack()
        .ack_deadline(Duration::from_millis(200))
        .build()?;
    let d = billing.recv().await?;
    let offset = d.offset();
    let started = Instant::now();
    d.nack_with_delay("payment service answered 503", Duration::from_millis(300))
        .await?;
    println!("   offset {offset}: nacked with a delay of 300 ms (the wait survives a restart)");
    let d = billing.recv().await?;
    println!(
        "   offset {} came again after {} ms, attempt {}",
        d.offset(),
        started.elapsed().as_millis(),
        d.attempt()
    );
    // The handler hangs: it neither acks nor nacks. The deadline takes the message back.
    let hung = d;
    let started = Instant::now();
    let d = billing.recv().await?;
    println!(
        "   the handler hung; {} ms later offset {} came again, attempt {}",
        started.elapsed().as_millis(),
        d.offset(),
        d.attempt()
    );
    if let Err(e) = hung.ack().await {
        println!("   the hung handler's late ack changes nothing: {e}");
    }
    d.ack().await?;
    Ok(())
}

//! The blocking facade: spool from a plain `fn main` and threads, with no async runtime.
//!
//! `cargo run --release --example blocking` publishes a few orders from the main thread
//! while a worker thread handles them: it acks the good ones and nacks a bad one until it
//! is dead-lettered.

use std::thread;

use spool::blocking::Spool;
use spool::{Error, Headers};

const TOPIC: &str = "blocking.orders";
const GROUP: &str = "blocking-workers";

fn main() -> Result<(), Error> {
    let dir = std::env::temp_dir().join(format!("spool-blocking-{}", std::process::id()));
    let mq = Spool::open(&format!(
        "Data Source={};Max Delivery Attempts=3",
        dir.display()
    ))?;

    // The worker: a consumer on its own thread, manual acks.
    let mut consumer = mq.consumer(TOPIC, GROUP).manual_ack().build()?;
    let worker = thread::spawn(move || -> Result<(), Error> {
        for d in consumer.iter() {
            let d = d?;
            let order = String::from_utf8_lossy(d.payload()).into_owned();
            if order == "stop" {
                d.ack()?;
                return Ok(());
            }
            if order.contains("bad") {
                let r = d.nack("cannot parse the order")?;
                println!(
                    "nacked {order} (attempt {}); dead-lettered: {}",
                    r.delivery_attempt, r.dead_lettered
                );
            } else {
                println!("handled {order} at offset {}", d.offset());
                d.ack()?;
            }
        }
        Ok(())
    });

    // The producer: the main thread, no runtime.
    for order in ["order-1", "order-2-bad", "order-3", "stop"] {
        mq.publish(TOPIC, order.as_bytes().to_vec(), &Headers::new())?;
    }
    worker.join().expect("the worker thread")?;

    let info = mq.group_info(TOPIC, GROUP)?;
    println!(
        "cursor {}, dead-lettered {}",
        info.cursor, info.dead_lettered
    );
    let dlq = mq.fetch(&format!("{TOPIC}.dlq"), 0, 10)?;
    for r in dlq {
        println!(
            "dead letter: {} ({})",
            String::from_utf8_lossy(r.payload()),
            r.headers()["x-dead-letter-reason"]
        );
    }
    mq.close()?;
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}

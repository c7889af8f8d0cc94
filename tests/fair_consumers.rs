//! Guards issue 31 point 6: consumers of one group on one runtime share it fairly. A
//! `recv` that is ready at once takes part in tokio's cooperative budget, as tokio's own
//! channels do, so one consumer task cannot take every record while the others wait.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use spool::{Headers, Spool};

const CONSUMERS: usize = 32;
const PER_CONSUMER: usize = 500;

#[test]
fn thirty_two_consumers_on_one_runtime_each_get_about_their_share() {
    let dir = tempfile::tempdir().expect("dir");
    let mq = Spool::open(&format!("Data Source={};Sync=None", dir.path().display())).expect("open");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    let total = CONSUMERS * PER_CONSUMER;
    rt.block_on(async {
        let batch: Vec<(Vec<u8>, Headers)> = (0..total)
            .map(|i| (i.to_le_bytes().to_vec(), Headers::new()))
            .collect();
        mq.publish_batch("t", batch).await.expect("publish");
    });
    let taken = Arc::new(AtomicU64::new(0));
    let counts: Vec<u64> = rt.block_on(async {
        let mut tasks = Vec::new();
        for _ in 0..CONSUMERS {
            let mut c = mq
                .consumer("t", "g")
                .manual_ack()
                .max_in_flight(2 * CONSUMERS)
                .build()
                .expect("consumer");
            let taken = taken.clone();
            tasks.push(tokio::spawn(async move {
                let mut mine = 0u64;
                while taken.load(Ordering::Relaxed) < total as u64 {
                    match c.recv_timeout(std::time::Duration::from_millis(50)).await {
                        Ok(Some(d)) => {
                            // The ack is made when called; its durability is not awaited.
                            drop(d.ack());
                            mine += 1;
                            taken.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(None) => {}
                        Err(e) => panic!("recv: {e}"),
                    }
                }
                mine
            }));
        }
        let mut counts = Vec::new();
        for t in tasks {
            counts.push(t.await.expect("task"));
        }
        counts
    });
    assert_eq!(counts.iter().sum::<u64>(), total as u64);
    let share = PER_CONSUMER as f64;
    for (i, &n) in counts.iter().enumerate() {
        let ratio = n as f64 / share;
        assert!(
            (0.5..=1.5).contains(&ratio),
            "consumer {i} got {n} of {total} ({ratio:.2} of its share): {counts:?}"
        );
    }
}

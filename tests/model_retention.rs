//! Model checks (review 30) of the interplay of retention with de-duplication and with a
//! group's cursor, resets and dead-lettering, across reopens: random histories on tiny
//! segments, each step checked against a plain model of what API.md promises.

use spool::{Headers, Spool};

/// Model check: after every publish, retention and reopen, a message id hits exactly when
/// it is among the last `window` ids appended whose records retention still holds.
#[tokio::test]
async fn dedup_window_model_across_retention_and_reopen() {
    for seed in 0..6u64 {
        for sync in ["None", "Always", "Interval:50"] {
            let dir = tempfile::tempdir().expect("tempdir");
            let window = 5 + (seed as usize % 4) * 7;
            let conn = format!(
                "Data Source={};Segment Bytes=1024;Index Interval Bytes=128;Retention Bytes=2500;Retention Check Ms=3600000;Dedup Window={window};Sync={sync}",
                dir.path().display()
            );
            let mut mq = Spool::open(&conn).expect("open");
            let mut rng = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let mut next_rand = move || {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng
            };
            // (id, offset) of every appended record carrying an id, in log order.
            let mut log: Vec<(String, u64)> = Vec::new();
            let mut next = 0u64;
            for step in 0..400 {
                let r = next_rand() % 100;
                if r < 3 {
                    mq.close().await.expect("close");
                    mq = Spool::open(&conn).expect("reopen");
                    continue;
                }
                if r < 8 {
                    mq.apply_retention().expect("retention");
                    continue;
                }
                let earliest = mq.topic_info("d").expect("info").earliest;
                let with_id = r < 85;
                let id = format!("id-{}", next_rand() % 40);
                let mut h = Headers::new();
                if with_id {
                    h.insert("message-id".into(), id.clone());
                }
                let size = (next_rand() % 150) as usize;
                let expect_hit = if with_id {
                    let live: Vec<&(String, u64)> =
                        log.iter().filter(|(_, o)| *o >= earliest).collect();
                    let start = live.len().saturating_sub(window);
                    live[start..]
                        .iter()
                        .rev()
                        .find(|(i, _)| *i == id)
                        .map(|(_, o)| *o)
                } else {
                    None
                };
                let got = mq
                    .publish("d", vec![b'p'; size], &h)
                    .await
                    .expect("publish");
                match expect_hit {
                    Some(o) => {
                        assert_eq!(got, o, "seed {seed} {sync} step {step}: {id} should hit")
                    }
                    None => {
                        assert_eq!(
                            got, next,
                            "seed {seed} {sync} step {step}: {id} should append"
                        );
                        if with_id {
                            log.push((id, got));
                        }
                        next += 1;
                    }
                }
            }
            mq.close().await.expect("close");
        }
    }
}

/// Model check of one group's cursor, `skipped`, `dead_lettered` and dead-letter copies
/// across low-level acks and nacks, retention, every reset mode and reopens.
#[tokio::test]
async fn group_model_across_retention_resets_and_reopen() {
    use spool::OffsetReset;
    for seed in 0..8u64 {
        for sync in ["None", "Always"] {
            let dir = tempfile::tempdir().expect("tempdir");
            let conn = format!(
                "Data Source={};Segment Bytes=1024;Index Interval Bytes=128;Retention Bytes=2500;Retention Check Ms=3600000;Max Delivery Attempts=3;Sync={sync}",
                dir.path().display()
            );
            let mut mq = Spool::open(&conn).expect("open");
            let mut rng = (seed + 1).wrapping_mul(6364136223846793005);
            let mut rnd = move || {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng
            };
            let (mut cursor, mut skipped, mut dl) = (0u64, 0u64, 0u64);
            let mut attempts: std::collections::BTreeMap<u64, u32> = Default::default();
            let mut copies = 0usize;
            let mut next = 0u64;
            for step in 0..300 {
                let ctx = format!("seed {seed} {sync} step {step}");
                let earliest = mq.topic_info("m").expect("info").earliest;
                // Lazy clamp, as every group operation but reset does.
                let clamp =
                    |cursor: &mut u64,
                     skipped: &mut u64,
                     attempts: &mut std::collections::BTreeMap<u64, u32>| {
                        if *cursor < earliest {
                            *skipped += earliest - *cursor;
                            *cursor = earliest;
                        }
                        attempts.retain(|o, _| *o >= earliest);
                    };
                let r = rnd() % 100;
                if r < 35 {
                    let n = 1 + rnd() % 4;
                    for _ in 0..n {
                        mq.publish("m", vec![b'x'; (rnd() % 120) as usize], &Headers::new())
                            .await
                            .expect("publish");
                        next += 1;
                    }
                } else if r < 55 {
                    clamp(&mut cursor, &mut skipped, &mut attempts);
                    let res = mq.ack("m", "g", cursor).await;
                    if cursor < next {
                        res.unwrap_or_else(|e| panic!("{ctx}: ack {cursor}: {e}"));
                        attempts.remove(&cursor);
                        cursor += 1;
                    } else {
                        assert!(res.is_err(), "{ctx}");
                    }
                } else if r < 72 {
                    clamp(&mut cursor, &mut skipped, &mut attempts);
                    let res = mq.nack("m", "g", cursor, "no").await;
                    if cursor < next {
                        let out = res.unwrap_or_else(|e| panic!("{ctx}: nack {cursor}: {e}"));
                        let a = attempts.entry(cursor).or_default();
                        *a += 1;
                        assert_eq!(out.delivery_attempt, *a, "{ctx}");
                        if *a >= 3 {
                            assert!(out.dead_lettered, "{ctx}");
                            attempts.remove(&cursor);
                            cursor += 1;
                            dl += 1;
                            copies += 1;
                        }
                        assert_eq!(out.next_offset, cursor, "{ctx}");
                    } else {
                        assert!(res.is_err(), "{ctx}");
                    }
                } else if r < 77 {
                    mq.apply_retention().expect("retention");
                } else if r < 80 {
                    mq.close().await.expect("close");
                    mq = Spool::open(&conn).expect("reopen");
                } else if r < 92 {
                    // A reset counts a skip retention made first, as every other operation.
                    clamp(&mut cursor, &mut skipped, &mut attempts);
                    let (to, want) = match rnd() % 4 {
                        0 => (OffsetReset::Earliest, earliest),
                        1 => (OffsetReset::Latest, next),
                        2 => {
                            let n = rnd() % (next + 5);
                            (OffsetReset::Explicit(n), n.clamp(earliest, next))
                        }
                        _ => {
                            let recs = mq.fetch("m", 0, 10_000).await.expect("fetch");
                            let ts: Vec<u64> = recs
                                .iter()
                                .map(|r| {
                                    r.timestamp()
                                        .duration_since(std::time::UNIX_EPOCH)
                                        .unwrap()
                                        .as_millis() as u64
                                })
                                .collect();
                            let pick = if ts.is_empty() {
                                0
                            } else {
                                ts[(rnd() % ts.len() as u64) as usize]
                            };
                            let t = pick + (rnd() % 3);
                            let want = recs
                                .iter()
                                .zip(&ts)
                                .find(|(_, s)| **s >= t)
                                .map_or(next, |(r, _)| r.offset());
                            (
                                OffsetReset::Time(
                                    std::time::UNIX_EPOCH + std::time::Duration::from_millis(t),
                                ),
                                want,
                            )
                        }
                    };
                    let got = mq.reset_offset("m", "g", to).await.expect("reset");
                    assert_eq!(got, want, "{ctx}: {to:?}");
                    cursor = got;
                    attempts.clear();
                } else {
                    let info = mq.group_info("m", "g").expect("info");
                    clamp(&mut cursor, &mut skipped, &mut attempts);
                    assert_eq!(
                        (info.cursor, info.skipped, info.dead_lettered),
                        (cursor, skipped, dl),
                        "{ctx}"
                    );
                    let pend: Vec<(u64, u32)> = info
                        .pending
                        .iter()
                        .map(|p| (p.offset, p.attempts))
                        .collect();
                    let want: Vec<(u64, u32)> = attempts.iter().map(|(o, a)| (*o, *a)).collect();
                    assert_eq!(pend, want, "{ctx}");
                }
            }
            let dlq = mq.fetch("m.dlq", 0, 10_000).await.expect("fetch");
            let dlq_earliest = mq.topic_info("m.dlq").expect("info").earliest;
            assert_eq!(
                dlq.len() as u64 + dlq_earliest,
                copies as u64,
                "seed {seed} {sync}: copies"
            );
            mq.close().await.expect("close");
        }
    }
}

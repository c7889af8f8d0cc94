//! A random exploration of one topic log under crashes (test only): appends (held in
//! memory or written), syncs,
//! retention (waiting for the sealings or not), process kills (often right after a roll),
//! power cuts, a switch between background and inline sealing (and, inline, between zeros
//! ahead with retention's files reused and neither) at each reopen, a slow sync
//! of one of the last segments and failing writes to one (a failed sync drops its writes
//! for good, as Linux's page cache does). After every reopen the log must
//! be dense, every record the one appended at its offset, a kill must lose nothing, and a
//! power cut must keep everything up to the last `sync` and every sealed segment. It found
//! the spare-header ordering bug fixed with
//! `a_segment_sealed_by_a_same_boot_reopen_has_its_successors_header_durable` (4 of 4 runs of
//! 3,000 seeds), and records a same-boot reopen took for durable after a failed sync
//! (within ten seeds without `Fs::rewrite_unsynced`). More seeds:
//! `SPOOL_LOG_EXPLORE_SEEDS=3000 cargo test --release --lib explore`.

use std::path::Path;
use std::sync::Arc;

use super::test_support::sim_cfg;
use super::{Append, LogConfig, TopicLog};
use crate::format::Headers;
use crate::format::record;
use crate::io::Fs;

/// Seeds of the default run (~8 s; the bug above showed at seed 211).
const DEFAULT_SEEDS: u64 = 300;

/// A reopen's layout: `Sync=None`'s (background sealing) mostly, else inline sealing with
/// `Always`'s zeros ahead and reused files or with `Interval`'s neither.
fn pick_layout(
    cfg: &mut LogConfig,
    next_rand: &mut impl FnMut(u64) -> u64,
    trace: &mut Vec<String>,
) {
    cfg.seal_in_background = next_rand(4) != 0;
    cfg.preallocate = !cfg.seal_in_background && next_rand(2) == 0;
    cfg.visible_when_synced = cfg.preallocate;
    trace.push(format!(
        "bg {} zeros {}",
        cfg.seal_in_background, cfg.preallocate
    ));
}

// Kept whole: a random walk whose steps share one model (records, durable prefix,
// arming, failure flags); each arm of its `match` is a few lines, and the walk reads
// best as one loop beside the model it checks.
#[test]
fn random_kills_power_cuts_retention_and_slow_or_failing_syncs_keep_the_log_a_prefix() {
    use crate::io::sim::SimFs;
    let seeds: u64 = std::env::var("SPOOL_LOG_EXPLORE_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_SEEDS);
    let dir = Path::new("/t");
    for seed in 1..=seeds {
        let mut cfg = sim_cfg();
        let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut next_rand = move |n: u64| {
            rng ^= rng >> 12;
            rng ^= rng << 25;
            rng ^= rng >> 27;
            rng.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
        };
        let mut fs = SimFs::new(seed);
        let mut model: Vec<Vec<u8>> = Vec::new();
        let mut durable = 0u64;
        let mut trace = Vec::new();
        let mut log = TopicLog::open(&Fs::new(Arc::new(fs.clone())), dir, cfg, 0).expect("open");
        let headers = Headers::new();
        let mut forced: Option<()> = None;
        // Writes were made to fail since the last reopen.
        let mut failing = false;
        for step in 0..300u64 {
            let mut op = next_rand(100);
            if (70..82).contains(&op) && next_rand(2) == 0 {
                op = 93;
            }
            if forced.take().is_some() {
                op = 82 + next_rand(11);
            }
            let check = |log: &TopicLog, model: &[Vec<u8>], what: &str, trace: &Vec<String>| {
                let recs = log
                    .reader()
                    .read(0, usize::MAX, usize::MAX)
                    .unwrap_or_else(|e| panic!("seed {seed} {what}: read {e}\n{trace:?}"));
                let earliest = log.reader().earliest();
                assert_eq!(
                    recs.len() as u64,
                    log.next() - earliest,
                    "seed {seed} {what}: dense\n{trace:?}"
                );
                assert!(
                    log.next() as usize <= model.len(),
                    "seed {seed} {what}: longer than appended\n{trace:?}"
                );
                for r in &recs {
                    assert_eq!(
                        &r.payload[..],
                        &model[r.offset as usize][..],
                        "seed {seed} {what}: offset {} not the one appended\n{trace:?}",
                        r.offset
                    );
                }
            };
            // Reopened after a kill or a clean drop: nothing appended may be lost.
            let reopen_whole = |fs: &SimFs,
                                cfg: LogConfig,
                                model: &[Vec<u8>],
                                what: &str,
                                trace: &mut Vec<String>,
                                resume: bool| {
                let mut log = TopicLog::open(&Fs::new(Arc::new(fs.clone())), dir, cfg, 0)
                    .unwrap_or_else(|e| panic!("seed {seed}: reopen {what}: {e}\n{trace:?}"));
                // Interrupted sealings found: started now (as the engine does after
                // its open) or left to whatever waits for them first.
                if resume {
                    log.resume_sealing();
                    trace.push("resume sealing".into());
                }
                assert_eq!(
                    log.next() as usize,
                    model.len(),
                    "seed {seed}: lost records {what}\n{trace:?}"
                );
                check(&log, model, what, trace);
                log
            };
            if op < 70 && !(82..93).contains(&op) {
                let payload = format!("{seed}-{step}-{}", model.len()).into_bytes();
                let mut p = payload.clone();
                p.resize(150 + (next_rand(100) as usize), b'x');
                let m = Append {
                    payload: &p,
                    headers: &headers,
                    headers_len: record::headers_len(&headers),
                };
                let before = log.reader().snapshot().len();
                // `Always`'s layout: half the appends held in memory (`Sync=Always`'s), for
                // a later append, sync, `write_held` or the kill to meet.
                let held = cfg.preallocate && next_rand(2) == 0;
                let appended = if held {
                    log.append_held(&[m], 0)
                } else {
                    log.append(&[m], 0)
                };
                match appended {
                    Ok(o) => {
                        if log.reader().snapshot().len() != before && next_rand(3) == 0 {
                            forced = Some(());
                        }
                        assert_eq!(o as usize, model.len());
                        model.push(p);
                        trace.push(if held { "h" } else { "a" }.into());
                    }
                    Err(e) => {
                        // Records held before it are dropped with it (the log is poisoned).
                        model.truncate(log.written_next() as usize);
                        trace.push(format!("append failed {e}"));
                    }
                }
            } else if op < 72 && log.holds() {
                match log.write_held() {
                    Ok(()) => trace.push("write held".into()),
                    Err(e) => {
                        model.truncate(log.written_next() as usize);
                        trace.push(format!("write held failed {e}"));
                    }
                }
            } else if op < 74 {
                match log.sync() {
                    Ok(()) => {
                        durable = log.next();
                        trace.push(format!("sync {durable}"));
                    }
                    // Held records it could not write are dropped.
                    Err(_) => model.truncate(log.written_next() as usize),
                }
            } else if op < 78 {
                let r = log
                    .finish_sealing()
                    .and_then(|_| log.apply_retention(0, 2500, 0, None));
                trace.push(format!("retention {r:?}"));
            } else if op < 82 {
                let r = log.apply_retention(0, 2500, 0, None);
                trace.push(format!("bg retention {r:?}"));
            } else if op < 88 {
                // Held records never reached the file: a kill loses them (their publishes
                // had not returned).
                model.truncate(log.written_next() as usize);
                if failing {
                    // A kill between a sealing's failed sync and its note of it would leave
                    // nothing for the reopen to rewrite (a known limit, see ARCHITECTURE):
                    // after an injected failure the sealings end first.
                    let r = log.finish_sealing();
                    trace.push(format!("sealings finished {}", r.is_ok()));
                }
                failing = false;
                let image = fs.process_crash_now();
                fs.fail_writes_to(None);
                drop(log);
                fs = image;
                trace.push(format!("kill at {}", model.len()));
                pick_layout(&mut cfg, &mut next_rand, &mut trace);
                let resume = next_rand(2) == 0;
                log = reopen_whole(&fs, cfg, &model, "after kill", &mut trace, resume);
            } else if op < 93 {
                let sealed_prefix = {
                    let segs = log.reader().snapshot();
                    let mut end = segs.first().map_or(0, |s| s.base);
                    for s in &segs {
                        if !s.is_sealed() {
                            break;
                        }
                        end = s.next();
                    }
                    end
                };
                durable = durable.max(sealed_prefix);
                let image = fs.crash_now();
                fs.fail_writes_to(None);
                drop(log);
                fs = image;
                trace.push("power cut".into());
                failing = false;
                pick_layout(&mut cfg, &mut next_rand, &mut trace);
                log = TopicLog::open(&Fs::new(Arc::new(fs.clone())), dir, cfg, 0).unwrap_or_else(
                    |e| panic!("seed {seed}: reopen after power cut: {e}\n{trace:?}"),
                );
                check(&log, &model, "after power cut", &trace);
                assert!(
                    log.next() >= durable,
                    "seed {seed}: synced records lost ({} < {durable})\n{trace:?}",
                    log.next()
                );
                model.truncate(log.next() as usize);
                durable = durable.min(log.next());
                trace.push(format!("reopened at {}", log.next()));
            } else if op < 94 {
                let segs = log.reader().snapshot();
                let pick = segs[segs.len() - 1 - next_rand(segs.len().min(3) as u64) as usize]
                    .path
                    .clone();
                fs.hold_syncs_of(Some(&pick));
                let f2 = fs.clone();
                std::thread::spawn(move || {
                    std::thread::sleep(std::time::Duration::from_millis(3));
                    f2.hold_syncs_of(None);
                });
                trace.push(format!("hold {}", pick.display()));
            } else if op < 96 {
                let segs = log.reader().snapshot();
                let pick = &segs[segs.len() - 1 - next_rand(segs.len().min(3) as u64) as usize];
                fs.fail_writes_to(Some(&pick.path));
                failing = true;
                trace.push(format!("fail {}", pick.base));
            } else {
                fs.fail_writes_to(None);
                if log.poison.get().is_some() || next_rand(2) == 0 {
                    // A clean stop writes what is held (`quiesce`).
                    if log.write_held().is_err() {
                        model.truncate(log.written_next() as usize);
                    }
                    drop(log);
                    failing = false;
                    trace.push("reopen".into());
                    let resume = next_rand(2) == 0;
                    log = reopen_whole(&fs, cfg, &model, "after reopen", &mut trace, resume);
                }
            }
        }
        drop(log);
    }
}

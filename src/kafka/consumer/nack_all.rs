//! `Consumer::nack_all` under `Mode=Kafka`: every delivery's nack, with the waits shared.
//!
//! 1. Each delivery's attempt is recorded and its record put back (`fail`, as one nack
//!    does), all before anything is awaited.
//! 2. The redelivered ones wait for the commit that carries their attempts: once per
//!    group, for the last version (a commit covers every version before it).
//! 3. Then those at the limit are dead-lettered in order, each by the three steps of
//!    `dead_letter.rs`.
//!
//! Errors follow the embedded rules: a stale or expired delivery changes nothing, every
//! other one is nacked, and the call returns the first error in the order given.

use std::sync::Arc;

use super::super::group::Group;
use super::{KafkaDelivery, Nacked, Then, dead_letter};
use crate::error::{Error, Result};
use crate::queue::NackOutcome;

/// One delivery's nack after step 1: its group, partition and epoch, and what `fail` did.
type Failed = (Arc<Group>, i32, u64, Nacked);

impl KafkaDelivery {
    /// [`crate::Consumer::nack_all`] for deliveries of `Mode=Kafka`.
    pub(crate) async fn nack_all(ds: Vec<KafkaDelivery>, reason: &str) -> Result<Vec<NackOutcome>> {
        let mut errors: Vec<(usize, Error)> = Vec::new();
        let mut failed: Vec<(usize, Failed)> = Vec::with_capacity(ds.len());
        for (i, mut d) in ds.into_iter().enumerate() {
            match d.fail(None) {
                Ok(n) => failed.push((i, (d.group.clone(), d.partition, d.epoch, n))),
                Err(e) => errors.push((i, e)),
            }
        }
        // Step 2: the redelivered ones' commits, one wait per group.
        let mut waits: Vec<(usize, Arc<Group>, u64)> = Vec::new();
        for (i, (g, _, _, n)) in &failed {
            if let Then::Wait(v) = n.then {
                match waits.iter_mut().find(|(_, w, _)| Arc::ptr_eq(w, g)) {
                    Some((_, _, max)) => *max = (*max).max(v),
                    None => waits.push((*i, g.clone(), v)),
                }
            }
        }
        for (i, g, v) in waits {
            if let Err(e) = g.shared.durable(v, None).await {
                errors.push((i, e));
            }
        }
        // Step 3, and the outcomes.
        let mut outcomes: Vec<(Arc<Group>, i32, NackOutcome)> = Vec::with_capacity(failed.len());
        for (i, (g, p, epoch, n)) in failed {
            let outcome = match n.then {
                Then::Wait(_) => n.redelivered(),
                Then::DeadLetter(dlq, back) => {
                    match dead_letter::dead_letter(back, epoch, n.attempts, reason, &dlq).await {
                        Ok(o) => o,
                        Err(e) => {
                            errors.push((i, e));
                            continue;
                        }
                    }
                }
            };
            outcomes.push((g, p, outcome));
        }
        if let Some((_, e)) = errors.into_iter().min_by_key(|(i, _)| *i) {
            return Err(e);
        }
        // Every next_offset is the cursor after the whole batch.
        Ok(outcomes
            .into_iter()
            .map(|(g, p, mut o)| {
                if let Some(part) = g.shared.lock().parts.get(&p) {
                    o.next_offset = part.floor.cursor();
                }
                o
            })
            .collect())
    }
}

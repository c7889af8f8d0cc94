//! `Nack Backoff`: how long a failed message waits before it is delivered again, by the
//! number of its failed attempt. Parsed from the connection string; read by `queue/nack.rs`.

use std::time::Duration;

use super::{MAX_MS, bad};
use crate::error::Result;

/// Most steps a `Nack Backoff` list may have: more is a typo, not a policy.
pub const MAX_BACKOFF_STEPS: usize = 64;

/// The delay before a failed message is delivered again (`Nack Backoff`).
///
/// The n-th failed attempt of a message (a nack, an expired ack deadline, an unclean
/// stop, a panicking handler) waits the n-th delay. An explicit
/// `nack_with_delay` with a non-zero delay wins over it.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum NackBackoff {
    /// Redelivered at once (the default).
    #[default]
    Immediate,
    /// `1s,5s,30s`: the n-th failure waits the n-th value; the last one repeats.
    Steps(Vec<Duration>),
    /// `exp:100ms..30s`: `first` after the first failure, doubling each time, at most `max`.
    Exponential {
        /// The delay after the first failure.
        first: Duration,
        /// The longest delay.
        max: Duration,
    },
}

impl NackBackoff {
    /// The delay after the message's `attempt`-th failed attempt (1 = the first).
    pub fn delay(&self, attempt: u32) -> Duration {
        let n = attempt.max(1) as usize;
        match self {
            NackBackoff::Immediate => Duration::ZERO,
            NackBackoff::Steps(steps) => steps
                .get(n - 1)
                .or(steps.last())
                .copied()
                .unwrap_or_default(),
            NackBackoff::Exponential { first, max } => {
                // 2^(n-1) times `first`, saturating long before it could overflow.
                let doublings = u32::try_from(n - 1).unwrap_or(u32::MAX).min(40);
                first.saturating_mul(1 << doublings.min(31)).min(*max)
            }
        }
    }

    /// Whether a plain nack waits at all.
    pub fn is_immediate(&self) -> bool {
        self == &NackBackoff::Immediate
    }
}

/// Parses a `Nack Backoff` value: empty, `1s,5s,30s` or `exp:100ms..30s`.
pub(super) fn parse_backoff(key: &str, value: &str) -> Result<NackBackoff> {
    if value.is_empty() {
        return Ok(NackBackoff::Immediate);
    }
    if let Some(range) = strip_prefix_ignore_case(value, "exp:") {
        let Some((a, b)) = range.split_once("..") else {
            return Err(bad(key, "expected exp:<first>..<max>, e.g. exp:100ms..30s"));
        };
        let (first, max) = (duration(key, a)?, duration(key, b)?);
        if first > max {
            return Err(bad(key, "exp:A..B needs A <= B"));
        }
        return Ok(NackBackoff::Exponential { first, max });
    }
    let steps: Vec<Duration> = value
        .split(',')
        .map(|s| duration(key, s))
        .collect::<Result<_>>()?;
    if steps.len() > MAX_BACKOFF_STEPS {
        return Err(bad(key, &format!("at most {MAX_BACKOFF_STEPS} steps")));
    }
    Ok(NackBackoff::Steps(steps))
}

fn strip_prefix_ignore_case<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &s[prefix.len()..])
}

/// `500ms`, `2s`, `1m`, `1h`: a whole number and its unit (the unit is required).
fn duration(key: &str, s: &str) -> Result<Duration> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| bad(key, &format!("`{s}` is not a duration such as 500ms or 2s")))?;
    let ms_per = match unit.trim().to_ascii_lowercase().as_str() {
        "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "" => return Err(bad(key, &format!("`{s}` needs a unit: ms, s, m or h"))),
        _ => return Err(bad(key, &format!("`{s}`: the unit must be ms, s, m or h"))),
    };
    let ms = n.saturating_mul(ms_per);
    if ms > MAX_MS {
        return Err(bad(key, &format!("`{s}` is longer than {MAX_MS} ms")));
    }
    Ok(Duration::from_millis(ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: &str) -> Result<NackBackoff> {
        parse_backoff("Nack Backoff", v)
    }

    #[test]
    fn steps_repeat_their_last_value() {
        let b = parse("1s, 5s,30s").expect("valid");
        let secs: Vec<u64> = (1..=5).map(|n| b.delay(n).as_secs()).collect();
        assert_eq!(secs, vec![1, 5, 30, 30, 30]);
    }

    #[test]
    fn exponential_doubles_up_to_its_max() {
        let b = parse("EXP:100ms..1s").expect("valid");
        let ms: Vec<u128> = (1..=6).map(|n| b.delay(n).as_millis()).collect();
        assert_eq!(ms, vec![100, 200, 400, 800, 1000, 1000]);
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(1), "no overflow");
    }

    #[test]
    fn empty_is_immediate() {
        assert!(parse("").expect("valid").is_immediate());
        assert_eq!(NackBackoff::default().delay(3), Duration::ZERO);
    }

    #[test]
    fn malformed_values_are_refused_with_the_reason() {
        for (v, why) in [
            ("500", "needs a unit"),
            ("5x", "unit must be"),
            ("exp:2s..1s", "A <= B"),
            ("exp:2s", "exp:<first>..<max>"),
            ("1s,,2s", "not a duration"),
            ("-1s", "not a duration"),
            ("99999999999h", "longer than"),
        ] {
            let e = parse(v).expect_err("malformed").to_string();
            assert!(e.contains(why), "{v}: {e}");
        }
    }
}

//! Flag values clap cannot parse alone, parsed by hand (no date crate for two formats):
//! - RFC 3339 times: `YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)`; `t` or a space for `T`,
//!   `z` for `Z`; no leap second. Converted with the civil-from-days algorithm.
//! - Durations: a sequence of `<integer><unit>` with units `ms`, `s`, `m`, `h`, `d`
//!   (`15m`, `1h30m`, `500ms`), or ISO 8601 `P[nD]T[nH][nM][n[.f]S]` (`PT15M`, `P1DT2H`),
//!   case-insensitive. A bare number has no unit and is refused.
//! - Headers: `KEY=VALUE`, the key non-empty.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `--to-datetime`.
pub fn rfc3339(s: &str) -> Result<SystemTime, String> {
    let bad = || format!("`{s}` is not an RFC 3339 time (like 2026-12-02T10:00:00Z)");
    let b = s.as_bytes();
    // ASCII only: the fields below are sliced by byte position.
    let shape = s.is_ascii() && b.len() >= 20 && matches!(b[10], b'T' | b't' | b' ');
    if !shape || [b[4], b[7], b[13], b[16]] != [b'-', b'-', b':', b':'] {
        return Err(bad());
    }
    let num = |r: std::ops::Range<usize>| -> Result<i64, String> {
        let part = &s[r];
        if part.bytes().all(|c| c.is_ascii_digit()) {
            part.parse().map_err(|_| bad())
        } else {
            Err(bad())
        }
    };
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, min, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let days_in = [
        31,
        if leap { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    if !(1..=12).contains(&month) || day < 1 || day > days_in[(month - 1) as usize] {
        return Err(bad());
    }
    if hour > 23 || min > 59 || sec > 59 {
        return Err(bad());
    }
    let mut rest = &s[19..];
    let mut nanos: u64 = 0;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(bad());
        }
        for (i, c) in frac[..digits].bytes().take(9).enumerate() {
            nanos += u64::from(c - b'0') * 10u64.pow(8 - i as u32);
        }
        rest = &frac[digits..];
    }
    let offset_s = match rest {
        "Z" | "z" => 0,
        _ if rest.len() == 6 && rest.as_bytes()[3] == b':' => {
            let sign = match rest.as_bytes()[0] {
                b'+' => 1,
                b'-' => -1,
                _ => return Err(bad()),
            };
            let (h, m) = (
                num_in(&rest[1..3]).ok_or_else(bad)?,
                num_in(&rest[4..6]).ok_or_else(bad)?,
            );
            if h > 23 || m > 59 {
                return Err(bad());
            }
            sign * (h * 3600 + m * 60)
        }
        _ => return Err(bad()),
    };
    let secs = days_from_civil(year, month, day) * 86_400 + hour * 3600 + min * 60 + sec - offset_s;
    let secs = u64::try_from(secs).map_err(|_| format!("`{s}` is before 1970"))?;
    Ok(UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_nanos(nanos))
}

fn num_in(s: &str) -> Option<i64> {
    s.bytes()
        .all(|c| c.is_ascii_digit())
        .then(|| s.parse().ok())?
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` of milliseconds since the Unix epoch.
pub fn format_ms(ms: u64) -> String {
    let secs = (ms / 1000) as i64;
    let (days, tod) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // The inverse of `days_from_civil`.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        tod / 3600,
        tod / 60 % 60,
        tod % 60,
        ms % 1000
    )
}

/// `--by-duration`.
pub fn duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("`{s}` is not a duration (like 15m, 1h30m, 500ms or PT15M)");
    let lower = s.trim().to_ascii_lowercase();
    let parsed = match lower.strip_prefix('p') {
        Some(iso) => iso8601(iso),
        None => suffixed(&lower),
    };
    parsed.ok_or_else(bad)
}

/// `15m`, `1h30m`, `500ms`, `2d`.
fn suffixed(s: &str) -> Option<Duration> {
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let n: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
        let ms_per = match &rest[..unit_len] {
            "ms" => 1,
            "s" => 1000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total = total.checked_add(Duration::from_millis(n.checked_mul(ms_per)?))?;
    }
    (!s.is_empty()).then_some(total)
}

/// ISO 8601 after its `P`: `[nD][T[nH][nM][n[.f]S]]`, lower-cased.
fn iso8601(s: &str) -> Option<Duration> {
    let (date, time) = match s.split_once('t') {
        Some((d, t)) if !t.is_empty() => (d, Some(t)),
        Some(_) => return None,
        None => (s, None),
    };
    let mut total = Duration::ZERO;
    if !date.is_empty() {
        let days: u64 = date.strip_suffix('d')?.parse().ok()?;
        total += Duration::from_secs(days.checked_mul(86_400)?);
    }
    let mut rest = time.unwrap_or("");
    for (unit, secs) in [('h', 3600.0), ('m', 60.0), ('s', 1.0)] {
        if let Some(i) = rest.find(unit) {
            let n: f64 = rest[..i]
                .parse()
                .ok()
                .filter(|n: &f64| *n >= 0.0 && n.is_finite())?;
            if unit != 's' && n.fract() != 0.0 {
                return None;
            }
            total = total.checked_add(Duration::try_from_secs_f64(n * secs).ok()?)?;
            rest = &rest[i + 1..];
        }
    }
    (rest.is_empty() && (!date.is_empty() || time.is_some())).then_some(total)
}

/// `--header KEY=VALUE`.
pub fn header(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("`{s}` is not KEY=VALUE")),
    }
}

/// Standard base64 with padding (`payload_base64` of a payload that is not UTF-8).
pub fn base64(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(ABC[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_parse_with_offsets_and_fractions() {
        let t =
            |s| rfc3339(s).map(|t| t.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis());
        assert_eq!(t("1970-01-01T00:00:00Z"), Ok(0));
        assert_eq!(t("2026-12-02T10:00:00Z"), Ok(1_796_205_600_000));
        assert_eq!(t("2026-12-02T11:00:00.250+01:00"), Ok(1_796_205_600_250));
        assert!(rfc3339("2026-02-30T10:00:00Z").is_err());
        assert!(rfc3339("yesterday").is_err());
        assert_eq!(format_ms(1_796_205_600_250), "2026-12-02T10:00:00.250Z");
    }

    #[test]
    fn durations_take_suffixes_and_iso() {
        assert_eq!(duration("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(duration("PT15M"), Ok(Duration::from_secs(900)));
        assert_eq!(duration("P1DT2H"), Ok(Duration::from_secs(93_600)));
        assert_eq!(duration("PT1.5S"), Ok(Duration::from_millis(1500)));
        for bad in ["15", "", "m", "1x", "P", "PT", "P1H", "-5m"] {
            assert!(duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn base64_pads() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(&[0xff, 0xfe]), "//4=");
    }
}

//! Printing: tables with a header row in capitals (comfy-table, no borders, as
//! `kafka-consumer-groups.sh --describe` prints them), JSON on stdout, and records as
//! JSON Lines (`tail`, `dlq show`).

use std::io::Write;

use comfy_table::{ContentArrangement, Table, presets};
use serde::Serialize;
use serde_json::{Map, Value, json};
use spool::Record;

use crate::failure::Failure;
use crate::parse;

/// A table with these column names (capitalised here).
pub fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_style(presets::NOTHING)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(header.iter().map(|h| h.to_uppercase()));
    t
}

/// Prints a table (each line's right padding trimmed).
pub fn print_table(t: &Table) -> Result<(), Failure> {
    print_rows(t, false)
}

/// Prints a table, without its header row if `skip_header` (a later piece of one).
pub fn print_rows(t: &Table, skip_header: bool) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    for line in t.lines().skip(usize::from(skip_header)) {
        // Without comfy-table's one-space left padding of the first column.
        let line = line.strip_prefix(' ').unwrap_or(&line);
        writeln!(out, "{}", line.trim_end())?;
    }
    Ok(())
}

/// Prints `value` as one JSON document.
pub fn print_json(value: &impl Serialize) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, value)?;
    writeln!(out)?;
    Ok(())
}

/// A record as CLI.md's JSON Lines object: `{offset, timestamp_ms, headers, payload}`,
/// `payload_base64` instead of `payload` when it is not UTF-8.
pub fn record_json(r: &Record) -> Value {
    let headers: Map<String, Value> = r
        .headers()
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    let mut o = json!({
        "offset": r.offset(),
        "timestamp_ms": r.timestamp_ms(),
        "headers": headers,
    });
    match std::str::from_utf8(r.payload()) {
        Ok(text) => o["payload"] = Value::String(text.to_owned()),
        Err(_) => o["payload_base64"] = Value::String(parse::base64(r.payload())),
    }
    o
}

/// Prints one JSON Lines object and flushes (a `--follow` reader sees it at once).
pub fn print_line(value: &Value) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, value)?;
    writeln!(out)?;
    out.flush()?;
    Ok(())
}

/// A payload for a table cell: its text, shortened, or its size when not UTF-8.
pub fn payload_cell(payload: &[u8]) -> String {
    const MAX: usize = 60;
    match std::str::from_utf8(payload) {
        Ok(text) if text.chars().count() > MAX => {
            format!("{}…", text.chars().take(MAX).collect::<String>())
        }
        Ok(text) => text.replace('\n', "\\n"),
        Err(_) => format!("<{} bytes, not UTF-8>", payload.len()),
    }
}

/// `k=v, k=v`, shortened (`--output json` has them whole).
pub fn headers_cell(r: &Record) -> String {
    const MAX: usize = 60;
    let all = r
        .headers()
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(", ");
    if all.chars().count() > MAX {
        format!("{}…", all.chars().take(MAX).collect::<String>())
    } else {
        all
    }
}

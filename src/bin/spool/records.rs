//! `tail` (records of a topic, `--follow` polls `fetch` for new ones) and `publish` (one
//! message, or each line of stdin).

use std::io::BufRead;
use std::time::Duration;

use serde_json::json;
use spool::{Headers, Record};

use crate::args::{Output, PublishArgs, TailArgs};
use crate::backend::Backend;
use crate::failure::Failure;
use crate::output::{self, print_json, print_line, print_table, table};
use crate::parse::format_ms;
use crate::progress;

/// Records fetched at a time.
const FETCH_BATCH: usize = 500;
/// Records `tail` shows without `--from`.
const TAIL_DEFAULT: u64 = 10;
/// How often `--follow` looks for new records.
const FOLLOW_POLL: Duration = Duration::from_millis(200);

/// `spool tail T [--from N] [--max N] [--follow]`.
pub async fn tail(b: &Backend, out: Output, a: TailArgs) -> Result<(), Failure> {
    let info = b.topic_info(&a.topic).await?;
    let mut from = match a.from {
        Some(n) => n,
        None => info.next.saturating_sub(TAIL_DEFAULT).max(info.earliest),
    };
    let mut left = a.max.unwrap_or(if a.from.is_none() && !a.follow {
        TAIL_DEFAULT
    } else {
        u64::MAX
    });
    let bar = progress::bar(Some(info.next.saturating_sub(from).min(left)), "reading");
    let mut printer = Printer::new(out);
    loop {
        let want = usize::try_from(left).unwrap_or(usize::MAX).min(FETCH_BATCH);
        let records = if want == 0 {
            Vec::new()
        } else {
            b.fetch(&a.topic, from, want).await?
        };
        if let Some(last) = records.last() {
            from = last.offset() + 1;
            left -= records.len() as u64;
            bar.inc(records.len() as u64);
            for r in &records {
                printer.record(r)?;
            }
            continue;
        }
        if !a.follow || left == 0 {
            break;
        }
        printer.flush()?;
        bar.finish_and_clear();
        tokio::select! {
            _ = tokio::time::sleep(FOLLOW_POLL) => {}
            _ = tokio::signal::ctrl_c() => break,
        }
    }
    bar.finish_and_clear();
    printer.flush()
}

/// Records printed as they come: JSON Lines at once, a table in pieces (each batch of
/// rows aligned on its own, so `--follow` shows them without waiting for the end).
pub struct Printer {
    out: Output,
    rows: Option<comfy_table::Table>,
    printed_header: bool,
}

impl Printer {
    pub fn new(out: Output) -> Printer {
        Printer {
            out,
            rows: None,
            printed_header: false,
        }
    }

    pub fn record(&mut self, r: &Record) -> Result<(), Failure> {
        if self.out == Output::Json {
            return print_line(&output::record_json(r));
        }
        let t = self
            .rows
            .get_or_insert_with(|| table(&["offset", "timestamp", "headers", "payload"]));
        t.add_row(vec![
            r.offset().to_string(),
            format_ms(r.timestamp_ms()),
            output::headers_cell(r),
            output::payload_cell(r.payload()),
        ]);
        Ok(())
    }

    /// Prints the rows gathered (the header row only the first time).
    pub fn flush(&mut self) -> Result<(), Failure> {
        let Some(t) = self.rows.take() else {
            if self.out == Output::Table && !self.printed_header {
                self.printed_header = true;
                print_table(&table(&["offset", "timestamp", "headers", "payload"]))?;
            }
            return Ok(());
        };
        let skip = self.printed_header;
        self.printed_header = true;
        output::print_rows(&t, skip)
    }
}

/// `spool publish T [--header K=V].. [--message-id ID] [--key KEY] [PAYLOAD]`.
pub async fn publish(b: &Backend, out: Output, a: PublishArgs) -> Result<(), Failure> {
    let mut headers: Headers = a.headers.into_iter().collect();
    if let Some(key) = a.key {
        headers.insert(spool::consts::MESSAGE_KEY_HEADER.to_owned(), key);
    }
    let payloads: Vec<Vec<u8>> = match a.payload {
        Some(p) => vec![p.into_bytes()],
        None => std::io::stdin()
            .lock()
            .lines()
            .map(|l| l.map(String::into_bytes))
            .collect::<Result<_, _>>()
            .map_err(|e| Failure::failed(format!("cannot read stdin: {e}")))?,
    };
    if let Some(id) = a.message_id {
        if payloads.len() != 1 {
            return Err(Failure::failed(format!(
                "--message-id names one message, and stdin gave {}: publish one line, or drop --message-id",
                payloads.len()
            )));
        }
        headers.insert(spool::consts::MESSAGE_ID_HEADER.to_owned(), id);
    }
    let total = payloads.len();
    let messages = payloads.into_iter().map(|p| (p, headers.clone())).collect();
    let mut offsets = Vec::with_capacity(total);
    for batch in b.batches(messages) {
        match b.publish_batch(&a.topic, batch).await {
            Ok(o) => offsets.extend(o),
            // Only through the owner, with more than one request carries, can a failure
            // come after some messages went in: say which.
            Err(f) if !offsets.is_empty() => {
                let (first, last) = (offsets[0], offsets[offsets.len() - 1]);
                return Err(f.after(format!(
                    "the first {} of {total} lines were published (first offset {first}, \
                     last {last}), the rest not",
                    offsets.len()
                )));
            }
            Err(f) => return Err(f),
        }
    }
    if out == Output::Json {
        return print_json(&json!({ "offsets": offsets }));
    }
    let mut t = table(&["topic", "offset"]);
    for o in &offsets {
        t.add_row(vec![a.topic.clone(), o.to_string()]);
    }
    print_table(&t)
}

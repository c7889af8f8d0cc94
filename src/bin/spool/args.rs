//! The commands and flags: names fixed by CLI.md, help text for each.

use std::path::PathBuf;

use clap::{ArgGroup, Args, Parser, Subcommand, ValueEnum};

use crate::parse;

/// Inspect and operate a spool data directory: topics, consumer groups, dead letters.
#[derive(Debug, Parser)]
#[command(name = "spool", version, about, long_about = None)]
pub struct Cli {
    /// The data directory, or a connection string (a value containing `=`,
    /// e.g. `Data Source=./data;Dead Letter Suffix=.dlq`).
    #[arg(
        long,
        global = true,
        env = "SPOOL_DATA",
        value_name = "DIR | CONNECTION STRING"
    )]
    pub data: Option<String>,
    /// `table`: aligned columns with a header row; `json`: JSON on stdout (JSON Lines
    /// for `tail` and `dlq show`).
    #[arg(long, global = true, value_enum, default_value_t = Output::Table)]
    pub output: Output,
    #[command(subcommand)]
    pub command: Command,
}

/// How results are printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Aligned columns with a header row.
    Table,
    /// JSON on stdout.
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Every topic with its offsets, size and segments.
    Topics,
    /// Consumer groups: cursor, lag, deliveries out, pending attempts, dead letters.
    Groups {
        /// Only this topic's groups.
        #[arg(long)]
        topic: Option<String>,
        /// Only groups of this name.
        #[arg(long)]
        group: Option<String>,
    },
    /// Moves a group's cursor (a dry run without --execute).
    Reset(ResetArgs),
    /// Prints records of a topic (the last 10 by default).
    Tail(TailArgs),
    /// Publishes one message, or every line of stdin as one message.
    Publish(PublishArgs),
    /// Dead-letter topics: list, show, replay.
    #[command(subcommand)]
    Dlq(DlqCommand),
    /// Reads every record, crc and index and checks the catalog against the logs;
    /// exit 3 if anything is damaged.
    Verify {
        /// Only this topic.
        #[arg(long)]
        topic: Option<String>,
    },
    /// Takes a consistent copy of the instance into DEST, which opens as a data directory.
    Snapshot {
        /// A directory that does not exist, or an empty one, outside the data directory.
        dest: PathBuf,
    },
    /// Deletes a topic's records before an offset (a dry run without --execute).
    DeleteRecords {
        /// The topic.
        topic: String,
        /// Records below this offset go (clamped to the log end).
        #[arg(long, value_name = "N")]
        before: u64,
        /// Delete them; without it, print what would be deleted.
        #[arg(long)]
        execute: bool,
    },
    /// Forgets a consumer group (a dry run without --execute).
    DeleteGroup {
        /// The topic.
        topic: String,
        /// The group.
        group: String,
        /// Delete it; without it, print what would be deleted.
        #[arg(long)]
        execute: bool,
    },
    /// The dashboard: topics, groups (with lag over time) and dead letters in a browser,
    /// and `/metrics` for Prometheus. Read-only unless --allow-writes. Serves until Ctrl-C.
    Serve {
        /// Address to listen on (port 0: one the system picks; the first line printed
        /// says which).
        #[arg(long, default_value = "127.0.0.1:8642")]
        listen: std::net::SocketAddr,
        /// Allow a non-loopback address (the page shows every payload to whoever
        /// reaches it).
        #[arg(long)]
        allow_remote: bool,
        /// Allow resets and dead-letter replays from the page (each guarded by a
        /// session token and a same-origin check).
        #[arg(long)]
        allow_writes: bool,
    },
}

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("target").required(true).multiple(false)))]
pub struct ResetArgs {
    /// The topic.
    #[arg(long)]
    pub topic: String,
    /// The group.
    #[arg(long)]
    pub group: String,
    /// To the earliest retained record.
    #[arg(long, group = "target")]
    pub to_earliest: bool,
    /// To the log end: only records published from now on.
    #[arg(long, group = "target")]
    pub to_latest: bool,
    /// To an offset (clamped to what the log holds).
    #[arg(long, group = "target", value_name = "N")]
    pub to_offset: Option<u64>,
    /// To the first record at or after a time, RFC 3339 (`2026-12-02T10:00:00Z`,
    /// `2026-12-02T11:00:00+01:00`).
    #[arg(long, group = "target", value_name = "RFC3339", value_parser = parse::rfc3339)]
    pub to_datetime: Option<std::time::SystemTime>,
    /// By N records from the current cursor (negative: back).
    #[arg(
        long,
        group = "target",
        value_name = "N",
        allow_negative_numbers = true
    )]
    pub shift_by: Option<i64>,
    /// To the first record at or after now minus DUR (`15m`, `1h30m`, `2d`, `PT15M`).
    #[arg(long, group = "target", value_name = "DUR", value_parser = parse::duration)]
    pub by_duration: Option<std::time::Duration>,
    /// Move the cursor; without it, print what would change.
    #[arg(long)]
    pub execute: bool,
}

#[derive(Debug, Args)]
pub struct TailArgs {
    /// The topic.
    pub topic: String,
    /// The first offset (default: the last 10 records).
    #[arg(long, value_name = "N")]
    pub from: Option<u64>,
    /// At most N records.
    #[arg(long, value_name = "N")]
    pub max: Option<u64>,
    /// Keep waiting for new records until interrupted.
    #[arg(long)]
    pub follow: bool,
}

#[derive(Debug, Args)]
pub struct PublishArgs {
    /// The topic.
    pub topic: String,
    /// A header, `KEY=VALUE` (repeatable).
    #[arg(long = "header", value_name = "K=V", value_parser = parse::header)]
    pub headers: Vec<(String, String)>,
    /// The `message-id` header (de-duplication); only with a single message.
    #[arg(long, value_name = "ID")]
    pub message_id: Option<String>,
    /// The `message-key` header (key-ordered consumers).
    #[arg(long, value_name = "KEY")]
    pub key: Option<String>,
    /// The payload; without it, every line of stdin is one message.
    pub payload: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// Every dead-letter topic with its source and counts by reason.
    List,
    /// Dead-lettered messages with their provenance headers.
    Show {
        /// The dead-letter topic.
        dlq: String,
        #[command(flatten)]
        select: Select,
    },
    /// Copies dead-lettered messages to a topic (a dry run without --execute); a replay
    /// run twice appends each message once.
    Replay {
        /// The dead-letter topic.
        dlq: String,
        /// The topic to append the copies to (required: never implicitly the source).
        #[arg(long, value_name = "TOPIC")]
        to: String,
        #[command(flatten)]
        select: Select,
        /// Append the copies; without it, print what would be appended.
        #[arg(long)]
        execute: bool,
    },
}

/// Which dead-lettered messages a command takes.
#[derive(Debug, Args)]
pub struct Select {
    /// The first offset (default: the earliest).
    #[arg(long, value_name = "N")]
    pub from: Option<u64>,
    /// At most N messages (after the --reason filter).
    #[arg(long, value_name = "N")]
    pub max: Option<u64>,
    /// Only messages whose `x-dead-letter-reason` contains TEXT.
    #[arg(long, value_name = "TEXT")]
    pub reason: Option<String>,
}

//! `spool`: the command line for operators (`../shared/CLI.md` is its contract).
//!
//! A thin layer over the library. Files, one concept each:
//! - `main.rs`: parse, start logging and a runtime, run, map the outcome to an exit code.
//! - `args.rs`: the commands and flags (clap derive); every `--help` text.
//! - `parse.rs`: flag values clap cannot parse alone: durations, RFC 3339 times, headers.
//! - `backend.rs`: the seam. Every command reaches the instance through `Backend`, whose
//!   methods are the library calls the commands need (today `Offline`: the directory
//!   opened by this process, closed after; next, the owner's admin endpoint).
//! - `target.rs`: what `--data` names, checked before anything is opened.
//! - `failure.rs`: `Failure` (exit 1 or 3, one `spool: ` line) and exit codes.
//! - `output.rs`: tables (comfy-table) and JSON (serde_json), records as JSON Lines.
//! - `progress.rs`: progress bars on stderr, only when it is a terminal.
//! - `inspect.rs`: `topics`, `groups`. `reset.rs`: `reset`. `records.rs`: `tail`,
//!   `publish`. `dlq.rs`: `dlq list|show|replay`. `admin.rs`: `verify`, `snapshot`,
//!   `delete-records`, `delete-group`, `serve`.
//!
//! **Invariants:** a command that changes state is a dry run without `--execute`
//! (publish excepted); bad input exits 1 or 2 before anything stored changes; composite
//! commands (dlq, reset's dry run, tail --follow) are built here from `Backend`'s
//! primitives, so a remote backend needs only those.

mod admin;
mod args;
mod backend;
mod dlq;
mod failure;
mod inspect;
mod output;
mod parse;
mod progress;
mod records;
mod reset;
mod serve;
mod target;

use std::process::ExitCode;

use clap::Parser;

use args::{Cli, Command};
use backend::Backend;
use failure::Failure;

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return Failure::failed(format!("cannot start a runtime: {e}")).report(),
    };
    match rt.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => f.report(),
    }
}

/// Log events go to stderr, and only when `RUST_LOG` asks for them.
fn init_logging() {
    if std::env::var_os("RUST_LOG").is_none() {
        return;
    }
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

async fn run(cli: Cli) -> Result<(), Failure> {
    let target = target::Target::from_flag(cli.data.as_deref())?;
    let creates = matches!(cli.command, Command::Publish(_));
    // Verify reads a closed directory's logs before opening it (an open would cut a
    // damaged active tail away), and reports damage that stops an open as damage.
    let verifying = matches!(cli.command, Command::Verify { .. });
    if verifying {
        admin::verify_closed(&target, cli.output).await?;
    }
    let backend = match Backend::connect(&target, creates).await {
        Err(f) if verifying => return Err(f.into_damage()),
        other => other?,
    };
    if let Command::Serve {
        listen,
        allow_remote,
        allow_writes,
    } = cli.command
    {
        let a = serve::ServeArgs {
            listen,
            allow_remote,
            allow_writes,
        };
        return serve::run(backend, &target.options, a).await;
    }
    let out = cli.output;
    let result = dispatch(&backend, out, cli.command, &target.options).await;
    let closed = backend.close().await;
    result.and(closed)
}

async fn dispatch(
    b: &Backend,
    out: args::Output,
    command: Command,
    opts: &spool::Options,
) -> Result<(), Failure> {
    match command {
        Command::Topics => inspect::topics(b, out).await,
        Command::Groups { topic, group } => inspect::groups(b, out, topic, group).await,
        Command::Reset(a) => reset::run(b, out, a).await,
        Command::Tail(a) => records::tail(b, out, a).await,
        Command::Publish(a) => records::publish(b, out, a).await,
        Command::Dlq(d) => dlq::run(b, out, d, opts).await,
        Command::Verify { topic } => admin::verify(b, out, topic).await,
        Command::Snapshot { dest } => admin::snapshot(b, out, dest).await,
        Command::DeleteRecords {
            topic,
            before,
            execute,
        } => admin::delete_records(b, out, topic, before, execute).await,
        Command::DeleteGroup {
            topic,
            group,
            execute,
        } => admin::delete_group(b, out, topic, group, execute).await,
        // `run` serves before it dispatches.
        Command::Serve { .. } => Err(Failure::failed("serve is not a one-shot command")),
    }
}

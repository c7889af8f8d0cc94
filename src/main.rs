//! `spool`: a thin command-line layer over the library, for operators.
//!
//! ```text
//! spool <connection string | data dir> topics
//! spool <conn> info <topic> [group]
//! spool <conn> fetch <topic> [from] [max]
//! spool <conn> publish <topic> <payload> [key=value ...]
//! spool <conn> reset <topic> <group> earliest|latest|<offset>|time:<ms since epoch>
//! ```

use std::process::ExitCode;
use std::time::{Duration, UNIX_EPOCH};

use spool::{Headers, OffsetReset, Spool};

const USAGE: &str = "usage: spool <connection string | data dir> <command>
commands:
  topics                                   list topics with their offsets and sizes
  info <topic> [group]                     show a topic (and a group's cursor, lag, attempts)
  fetch <topic> [from] [max]               print records (default from 0, max 20)
  publish <topic> <payload> [key=value..]  append one message
  reset <topic> <group> earliest|latest|<offset>|time:<ms>   move a group's cursor";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 2 || args.iter().any(|a| a == "-h" || a == "--help") {
        eprintln!("{USAGE}");
        return if args.iter().any(|a| a == "-h" || a == "--help") {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(2)
        };
    }
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("spool: cannot start a runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(&args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("spool: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    let conn = if args[0].contains('=') {
        args[0].clone()
    } else {
        format!("Data Source={}", args[0])
    };
    let mq = Spool::open(&conn)?;
    let rest = &args[1..];
    let result = command(&mq, rest).await;
    mq.close().await?;
    result
}

async fn command(mq: &Spool, rest: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    let arg = |i: usize| rest.get(i).map(String::as_str);
    match (arg(0), arg(1)) {
        (Some("topics"), _) => {
            for t in mq.topics()? {
                let i = mq.topic_info(&t)?;
                println!(
                    "{t}\tearliest={} next={} messages={} bytes={} segments={}",
                    i.earliest, i.next, i.messages, i.bytes, i.segments
                );
            }
        }
        (Some("info"), Some(topic)) => {
            let i = mq.topic_info(topic)?;
            println!("{i:#?}");
            if let Some(group) = arg(2) {
                println!("{:#?}", mq.group_info(topic, group)?);
            }
        }
        (Some("fetch"), Some(topic)) => {
            let from = arg(2).map(str::parse).transpose()?.unwrap_or(0);
            let max = arg(3).map(str::parse).transpose()?.unwrap_or(20);
            for r in mq.fetch(topic, from, max).await? {
                let ms = r
                    .timestamp()
                    .duration_since(UNIX_EPOCH)
                    .unwrap_or(Duration::ZERO)
                    .as_millis();
                println!(
                    "{}\t{ms}\t{:?}\t{}",
                    r.offset(),
                    r.headers(),
                    String::from_utf8_lossy(r.payload())
                );
            }
        }
        (Some("publish"), Some(topic)) => {
            let payload = arg(2).ok_or("publish needs a payload")?;
            let mut headers = Headers::new();
            for kv in rest.iter().skip(3) {
                let (k, v) = kv.split_once('=').ok_or("headers are key=value")?;
                headers.insert(k.to_owned(), v.to_owned());
            }
            let offset = mq
                .publish(topic, payload.as_bytes().to_vec(), &headers)
                .await?;
            println!("{offset}");
        }
        (Some("reset"), Some(topic)) => {
            let group = arg(2).ok_or("reset needs a group")?;
            let to = match arg(3).ok_or("reset needs a target")? {
                "earliest" => OffsetReset::Earliest,
                "latest" => OffsetReset::Latest,
                t => match t.strip_prefix("time:") {
                    Some(ms) => OffsetReset::Time(UNIX_EPOCH + Duration::from_millis(ms.parse()?)),
                    None => OffsetReset::Explicit(t.parse()?),
                },
            };
            println!("{}", mq.reset_offset(topic, group, to).await?);
        }
        _ => return Err(USAGE.into()),
    }
    Ok(())
}

//! `spool serve`: the dashboard. An HTTP server on the command's own tokio runtime (axum),
//! its page and assets compiled into the binary (`assets/`, no build step, no CDN).
//!
//! - Works through a live owner's admin endpoint, or on a directory no one holds (which
//!   it then holds until it stops).
//! - Read-only unless `--allow-writes`: then a reset (dry run first) and a dead-letter
//!   replay can be made from the page, guarded against other sites (`writes.rs`).
//! - Loopback only unless `--allow-remote`, which prints a warning (and is read-only).
//! - Every answer passes `guard.rs`: a foreign `Host` is refused, safety headers added.
//!
//! Files, by role: `mod.rs` (listen, routes, stop on Ctrl-C), `api.rs` (the JSON under
//! `/api/`, with CLI.md's field names), `writes.rs` (the changes), `guard.rs` (Host,
//! headers, the session),
//! `prometheus.rs` (`/metrics`), `page.rs` (the page and its assets).

mod api;
mod guard;
mod page;
mod prometheus;
mod writes;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::routing::{get, post};

use crate::backend::Backend;
use crate::failure::Failure;

/// What every request reads.
pub struct App {
    pub backend: Backend,
    /// The dead-letter suffix (`Dead Letter Suffix` of the connection string).
    pub suffix: String,
    /// `Dedup Window` of the connection string (a replay's dry run reads that far back).
    pub dedup_window: usize,
    /// The session token, with `--allow-writes`; `None`: read-only.
    pub token: Option<String>,
    /// The `Host` values answered (`None`: any, with `--allow-remote`).
    pub hosts: Option<Vec<String>>,
}

/// What `spool serve`'s flags ask for.
pub struct ServeArgs {
    pub listen: SocketAddr,
    pub allow_remote: bool,
    pub allow_writes: bool,
}

/// The routes, over `app`.
pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/", get(page::index))
        .route("/app.js", get(page::script))
        .route("/style.css", get(page::style))
        .route("/metrics", get(prometheus::metrics))
        .route("/api/overview", get(api::overview))
        .route("/api/topics", get(api::topics))
        .route("/api/topics/{topic}", get(api::topic))
        .route("/api/topics/{topic}/groups", get(api::groups))
        .route("/api/topics/{topic}/groups/{group}", get(api::group))
        .route("/api/dlq", get(api::dlq_list))
        .route("/api/dlq/{topic}", get(api::dlq_records))
        .route("/api/reset", post(writes::reset))
        .route("/api/dlq/{topic}/replay", post(writes::replay))
        .fallback(api::not_found)
        .layer(axum::middleware::from_fn_with_state(
            app.clone(),
            guard::checked,
        ))
        .with_state(app)
}

/// `spool serve [--listen ADDR] [--allow-remote] [--allow-writes]`: serves until Ctrl-C.
pub async fn run(backend: Backend, opts: &spool::Options, a: ServeArgs) -> Result<(), Failure> {
    let listen = a.listen;
    if !listen.ip().is_loopback() {
        if !a.allow_remote {
            return Err(Failure::failed(format!(
                "{listen} is not a loopback address: the dashboard shows every message's \
                 payload to whoever reaches it; add --allow-remote to serve it there anyway"
            )));
        }
        if a.allow_writes {
            return Err(Failure::failed(
                "--allow-writes is for a loopback address only: over the network the \
                 session's link and cookie travel in clear text",
            ));
        }
        eprintln!("spool: warning: serving on {listen}, reachable from other machines");
    }
    let token = match a.allow_writes {
        true => Some(writes::new_token()?),
        false => None,
    };
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| Failure::failed(format!("cannot listen on {listen}: {e}")))?;
    let bound = listener
        .local_addr()
        .map_err(|e| Failure::failed(format!("cannot read the bound address: {e}")))?;
    // The first line on stdout is the address (with port 0, the one the system chose);
    // with writes, the link that opens a session.
    match &token {
        Some(t) => println!(
            "spool serve: http://{bound}/?token={t} (open this link to reset and replay from \
             the page; Ctrl-C stops)"
        ),
        None => println!("spool serve: http://{bound}/ (read-only; Ctrl-C stops)"),
    }
    let app = Arc::new(App {
        backend,
        suffix: opts.dead_letter_suffix.clone(),
        dedup_window: opts.dedup_window,
        token,
        hosts: guard::allowed_hosts(bound, a.allow_remote),
    });
    let served = axum::serve(listener, router(app.clone()))
        .with_graceful_shutdown(stopped())
        .await;
    match Arc::into_inner(app) {
        Some(a) => a.backend.close().await?,
        None => tracing::warn!("serve: a request still holds the instance; not closed"),
    }
    served.map_err(|e| Failure::failed(format!("serving failed: {e}")))
}

/// Ctrl-C (SIGINT) or SIGTERM (`kill`, `systemctl stop`): either stops the server and
/// closes the directory cleanly.
async fn stopped() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

//! The page and its assets, compiled into the binary: it works on a machine with no
//! network, and there is nothing to build.

use std::sync::Arc;

use axum::extract::State;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::IntoResponse;

use super::App;

const INDEX: &str = include_str!("assets/index.html");
const SCRIPT: &str = include_str!("assets/app.js");
const STYLE: &str = include_str!("assets/style.css");

/// Served as they are; never cached, so a new binary's page is the one shown.
fn asset(kind: &'static str, body: &'static str) -> impl IntoResponse {
    ([(CONTENT_TYPE, kind), (CACHE_CONTROL, "no-store")], body)
}

/// Where the page carries the session token (with `--allow-writes`).
const TOKEN_SLOT: &str = "<!--spool-token-->";

/// The page; with writes allowed it carries the session token, which only a page of
/// this origin can read.
pub async fn index(State(app): State<Arc<App>>) -> impl IntoResponse {
    let page = match &app.token {
        Some(t) => INDEX.replace(
            TOKEN_SLOT,
            &format!("<meta name=\"spool-token\" content=\"{t}\">"),
        ),
        None => INDEX.to_owned(),
    };
    (
        [
            (CONTENT_TYPE, "text/html; charset=utf-8"),
            (CACHE_CONTROL, "no-store"),
        ],
        page,
    )
}

pub async fn script() -> impl IntoResponse {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

pub async fn style() -> impl IntoResponse {
    asset("text/css; charset=utf-8", STYLE)
}

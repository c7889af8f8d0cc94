//! The page and its assets, compiled into the binary: it works on a machine with no
//! network, and there is nothing to build.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE, LOCATION, SET_COOKIE};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::api::ApiError;
use super::{App, guard};

const INDEX: &str = include_str!("assets/index.html");
const SCRIPT: &str = include_str!("assets/app.js");
const STYLE: &str = include_str!("assets/style.css");

/// Served as they are; never cached, so a new binary's page is the one shown.
fn asset(kind: &'static str, body: &'static str) -> impl IntoResponse {
    ([(CONTENT_TYPE, kind), (CACHE_CONTROL, "no-store")], body)
}

/// Where the page says that it may make changes (this browser has the session).
const WRITES_SLOT: &str = "<!--spool-writes-->";

/// `?token=` of the link `spool serve` printed (with `--allow-writes`).
#[derive(Deserialize)]
pub struct Link {
    token: Option<String>,
}

/// The page. Opened through the printed link, it sets the session cookie and sends the
/// browser to `/` (so the token leaves the address bar and the history); with the
/// session, the page shows its change forms.
pub async fn index(
    State(app): State<Arc<App>>,
    Query(link): Query<Link>,
    headers: HeaderMap,
) -> Response {
    if let Some(shown) = link.token {
        let valid = app
            .token
            .as_ref()
            .is_some_and(|t| guard::same_bytes(shown.as_bytes(), t.as_bytes()));
        if !valid {
            let what = "this link's token is not this server's session".to_owned();
            return ApiError::new(StatusCode::FORBIDDEN, what).into_response();
        }
        let cookie = format!(
            "{}={shown}; HttpOnly; SameSite=Strict; Path=/",
            guard::SESSION_COOKIE
        );
        return (
            StatusCode::SEE_OTHER,
            [(LOCATION, "/".to_owned()), (SET_COOKIE, cookie)],
        )
            .into_response();
    }
    let page = match guard::has_session(&app, &headers) {
        true => INDEX.replace(WRITES_SLOT, "<meta name=\"spool-writes\" content=\"on\">"),
        false => INDEX.to_owned(),
    };
    let kind = "text/html; charset=utf-8";
    ([(CONTENT_TYPE, kind), (CACHE_CONTROL, "no-store")], page).into_response()
}

pub async fn script() -> impl IntoResponse {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

pub async fn style() -> impl IntoResponse {
    asset("text/css; charset=utf-8", STYLE)
}

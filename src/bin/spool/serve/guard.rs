//! What every answer of `spool serve` is checked for and carries:
//! - **Host:** only a name this server is reached by on loopback (`127.0.0.1:P`,
//!   `localhost:P`, `[::1]:P`) or its bound address. Another name is a DNS-rebinding
//!   page of another site talking to us as if it were its own origin: 403. With
//!   `--allow-remote` any Host is served (read-only: writes are refused there).
//! - **Headers:** the page may not be framed by another site (clickjacking), has no
//!   inline script (CSP), no sniffed types, and sends no referrer.
//! - **The session** (with `--allow-writes`): the link printed at start carries a secret
//!   token; opening it sets an HttpOnly, SameSite=Strict cookie and forgets the token
//!   from the address bar. A change needs that cookie, which no other site's request
//!   carries and no other local user can read from the terminal.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::App;
use super::api::ApiError;

/// The cookie the session token lives in.
pub const SESSION_COOKIE: &str = "spool-session";

/// The `Host` values this server answers (loopback names and the bound address); `None`:
/// any (`--allow-remote`).
pub fn allowed_hosts(bound: SocketAddr, allow_remote: bool) -> Option<Vec<String>> {
    if allow_remote {
        return None;
    }
    let p = bound.port();
    let mut hosts = vec![
        format!("127.0.0.1:{p}"),
        format!("localhost:{p}"),
        format!("[::1]:{p}"),
        bound.to_string(),
    ];
    hosts.dedup();
    Some(hosts)
}

/// Refuses a foreign `Host`, and adds the safety headers to every answer.
pub async fn checked(
    State(app): State<Arc<App>>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    if let Some(hosts) = &app.hosts {
        let host = request
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok());
        if !host.is_some_and(|h| hosts.iter().any(|a| a.eq_ignore_ascii_case(h))) {
            let what = "this dashboard answers only on its loopback address";
            return Err(ApiError::new(StatusCode::FORBIDDEN, what.into()));
        }
    }
    let mut answer = json_errors(next.run(request).await).await;
    let h = answer.headers_mut();
    let set = |h: &mut HeaderMap, k: &'static str, v: &'static str| {
        h.insert(k, HeaderValue::from_static(v));
    };
    set(
        h,
        "content-security-policy",
        "default-src 'self'; frame-ancestors 'none'",
    );
    set(h, "x-frame-options", "DENY");
    set(h, "x-content-type-options", "nosniff");
    set(h, "referrer-policy", "no-referrer");
    Ok(answer)
}

/// Whether the request carries this session's cookie.
pub fn has_session(app: &App, headers: &HeaderMap) -> bool {
    let Some(token) = &app.token else {
        return false;
    };
    let cookies = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'));
    cookies
        .filter_map(|c| c.trim().split_once('='))
        .any(|(k, v)| k == SESSION_COOKIE && same_bytes(v.as_bytes(), token.as_bytes()))
}

/// Compares in time independent of where they differ (a token is a secret).
pub fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// Whether a change request comes from this server's own page: no `Origin` other than
/// an allowed one, no `Sec-Fetch-Site` other than `same-origin`.
pub fn same_origin(app: &App, headers: &HeaderMap) -> bool {
    if let Some(origin) = headers.get(header::ORIGIN) {
        let ok = origin.to_str().ok().and_then(|o| o.strip_prefix("http://"));
        let known = app.hosts.as_ref().is_some_and(|hosts| {
            ok.is_some_and(|o| hosts.iter().any(|h| h.eq_ignore_ascii_case(o)))
        });
        if !known {
            return false;
        }
    }
    headers
        .get("sec-fetch-site")
        .is_none_or(|s| s.as_bytes() == b"same-origin")
}

/// axum's own refusals (a path that does not decode, a method not allowed) come as
/// plain text: every error of the API is `{error}` JSON, so they are rewritten.
async fn json_errors(answer: Response) -> Response {
    let plain = answer
        .headers()
        .get(header::CONTENT_TYPE)
        .is_none_or(|t| t.as_bytes().starts_with(b"text/plain"));
    let status = answer.status();
    if !(status.is_client_error() && plain) {
        return answer;
    }
    let (parts, body) = answer.into_parts();
    let text = axum::body::to_bytes(body, 64 << 10)
        .await
        .unwrap_or_default();
    let what = match text.is_empty() {
        true => status.canonical_reason().unwrap_or("refused").to_owned(),
        false => String::from_utf8_lossy(&text).into_owned(),
    };
    let mut json = ApiError::new(status, what).into_response();
    for (k, v) in &parts.headers {
        if k != header::CONTENT_TYPE && k != header::CONTENT_LENGTH {
            json.headers_mut().insert(k, v.clone());
        }
    }
    json
}

//! The two changes the page can make, with `--allow-writes` only: a group reset (its dry
//! run first) and a dead-letter replay. A change needs the session cookie of the link
//! `spool serve` printed, and must come from the page itself (`guard.rs`): any failure
//! is a 403 and changes nothing. The bodies use the command line's words: a reset names
//! its target as `reset`'s flags do, a replay as `dlq replay`'s.

use std::io::Read;
use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use serde::Deserialize;

use super::api::ApiError;
use super::{App, guard};
use crate::args::{ResetArgs, Select};
use crate::dlq::{self, Replayed};
use crate::failure::Failure;
use crate::parse;
use crate::reset::{self, ResetRow};

/// A fresh session token: 128 bits from the system's random source, in hex.
pub fn new_token() -> Result<String, Failure> {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| Failure::failed(format!("cannot make a session token: {e}")))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

fn forbidden(what: &str) -> ApiError {
    ApiError::new(StatusCode::FORBIDDEN, what.to_owned())
}

/// Lets a change through only with writes allowed, the session, and from the page.
fn guard(app: &App, headers: &HeaderMap) -> Result<(), ApiError> {
    if app.token.is_none() {
        return Err(forbidden(
            "read-only: start spool serve with --allow-writes",
        ));
    }
    if !guard::has_session(app, headers) {
        return Err(forbidden(
            "a change needs the session of the link spool serve printed: open it first",
        ));
    }
    if !guard::same_origin(app, headers) {
        return Err(forbidden(
            "a change must come from the dashboard's own page",
        ));
    }
    Ok(())
}

fn bad_body(e: JsonRejection) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, e.body_text())
}

/// `POST /api/reset`: `{topic, group, <one target>, execute}`, the target one of
/// `to_earliest: true`, `to_latest: true`, `to_offset: N`, `to_datetime: "RFC3339"`,
/// `shift_by: N`, `by_duration: "15m"`. Answers `reset --output json`'s row.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResetBody {
    topic: String,
    group: String,
    #[serde(default)]
    to_earliest: bool,
    #[serde(default)]
    to_latest: bool,
    to_offset: Option<u64>,
    to_datetime: Option<String>,
    shift_by: Option<i64>,
    by_duration: Option<String>,
    #[serde(default)]
    execute: bool,
}

impl ResetBody {
    /// The flags the command line would have parsed, or what is wrong with them.
    fn into_args(self) -> Result<ResetArgs, String> {
        let named = [
            self.to_earliest,
            self.to_latest,
            self.to_offset.is_some(),
            self.to_datetime.is_some(),
            self.shift_by.is_some(),
            self.by_duration.is_some(),
        ];
        if named.iter().filter(|&&n| n).count() != 1 {
            return Err(
                "name exactly one target (to_earliest, to_latest, to_offset, \
                        to_datetime, shift_by, by_duration)"
                    .into(),
            );
        }
        Ok(ResetArgs {
            topic: self.topic,
            group: self.group,
            to_earliest: self.to_earliest,
            to_latest: self.to_latest,
            to_offset: self.to_offset,
            to_datetime: self
                .to_datetime
                .as_deref()
                .map(parse::rfc3339)
                .transpose()?,
            shift_by: self.shift_by,
            by_duration: self
                .by_duration
                .as_deref()
                .map(parse::duration)
                .transpose()?,
            execute: self.execute,
        })
    }
}

pub async fn reset(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Result<Json<ResetBody>, JsonRejection>,
) -> Result<Json<Vec<ResetRow>>, ApiError> {
    guard(&app, &headers)?;
    let Json(body) = body.map_err(bad_body)?;
    let args = body
        .into_args()
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e))?;
    super::api::existing_group(&app, &args.topic, &args.group).await?;
    Ok(Json(vec![reset::reset(&app.backend, args).await?]))
}

/// `POST /api/dlq/{dlq}/replay`: `{to, reason?, from?, max?, execute}`. Answers
/// `dlq replay --output json`'s object.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayBody {
    to: String,
    reason: Option<String>,
    from: Option<u64>,
    max: Option<u64>,
    #[serde(default)]
    execute: bool,
}

pub async fn replay(
    State(app): State<Arc<App>>,
    Path(dlq): Path<String>,
    headers: HeaderMap,
    body: Result<Json<ReplayBody>, JsonRejection>,
) -> Result<Json<Replayed>, ApiError> {
    guard(&app, &headers)?;
    let Json(b) = body.map_err(bad_body)?;
    super::api::existing_dlq(&app, &dlq).await?;
    // A bad target name, or the dead-letter topic itself, is the request's fault.
    if let Err(f) = app.backend.topic_info(&b.to).await {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            f.message().to_owned(),
        ));
    }
    if b.to == dlq {
        let what = "`to` is the dead-letter topic itself: name the topic to replay into";
        return Err(ApiError::new(StatusCode::BAD_REQUEST, what.into()));
    }
    let select = Select {
        from: b.from,
        max: b.max,
        reason: b.reason.filter(|r| !r.is_empty()),
    };
    let r = dlq::replayed(
        &app.backend,
        &dlq,
        &b.to,
        select,
        b.execute,
        app.dedup_window,
    );
    Ok(Json(r.await?))
}

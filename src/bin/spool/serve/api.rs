//! The JSON under `/api/`, with the field names of CLI.md's JSON (`topics`, `groups`,
//! `dlq list`, `dlq show`). An unknown topic, group or path is a 404 with a JSON
//! `{error}`; a malformed query parameter a 400.

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::App;
use crate::args::Select;
use crate::failure::Failure;
use crate::inspect::{GroupRow, TopicRow};
use crate::{dlq, output};

/// Records a dead-letter page shows at most.
const DLQ_PAGE_MAX: u64 = 1000;

/// What a route answers when it cannot: a status and `{error}`.
pub struct ApiError(StatusCode, String);

impl ApiError {
    pub fn new(status: StatusCode, what: String) -> ApiError {
        ApiError(status, what)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(json!({ "error": self.1 }))).into_response()
    }
}

impl From<Failure> for ApiError {
    fn from(f: Failure) -> ApiError {
        ApiError(StatusCode::INTERNAL_SERVER_ERROR, f.message().to_owned())
    }
}

type ApiResult<T> = Result<Json<T>, ApiError>;

fn not_found_named(what: &str, name: &str) -> ApiError {
    ApiError(StatusCode::NOT_FOUND, format!("no {what} named {name:?}"))
}

/// Any path no route has.
pub async fn not_found() -> ApiError {
    ApiError(StatusCode::NOT_FOUND, "no such page".into())
}

/// `topic`, if it exists (a name that is not a topic name is not found either).
pub async fn existing_topic(app: &App, topic: &str) -> Result<(), ApiError> {
    match app.backend.topics().await?.iter().any(|t| t == topic) {
        true => Ok(()),
        false => Err(not_found_named("topic", topic)),
    }
}

/// `topic`, if it is a dead-letter topic that exists: the dead-letter browser shows and
/// replays no other topic's records.
pub async fn existing_dlq(app: &App, topic: &str) -> Result<(), ApiError> {
    let is_dlq = topic
        .strip_suffix(app.suffix.as_str())
        .is_some_and(|base| !base.is_empty() && !app.suffix.is_empty());
    if !is_dlq {
        return Err(not_found_named("dead-letter topic", topic));
    }
    existing_topic(app, topic).await
}

/// `group` of `topic`, if it has state.
pub async fn existing_group(app: &App, topic: &str, group: &str) -> Result<(), ApiError> {
    existing_topic(app, topic).await?;
    match app.backend.groups(topic).await?.iter().any(|g| g == group) {
        true => Ok(()),
        false => Err(not_found_named("group", group)),
    }
}

/// A group's row with what it did since the instance opened (the page's extra).
#[derive(Serialize)]
pub struct GroupFigures {
    #[serde(flatten)]
    row: GroupRow,
    counts: Counts,
}

#[derive(Serialize)]
struct Counts {
    delivered: u64,
    redelivered: u64,
    acked: u64,
    nacked: u64,
    expired: u64,
}

fn figures(topic: &str, group: String, i: &spool::GroupInfo) -> GroupFigures {
    let c = i.counts;
    GroupFigures {
        row: GroupRow::new(topic, group, i),
        counts: Counts {
            delivered: c.delivered,
            redelivered: c.redelivered,
            acked: c.acked,
            nacked: c.nacked,
            expired: c.expired,
        },
    }
}

/// `GET /api/overview`: every topic and group in one answer (what the page polls).
pub async fn overview(State(app): State<Arc<App>>) -> ApiResult<Value> {
    let m = app.backend.metrics().await?;
    let topics: Vec<TopicRow> = m
        .topics
        .iter()
        .map(|t| TopicRow::new(t.topic.clone(), &t.info))
        .collect();
    let groups: Vec<GroupFigures> = m
        .groups
        .iter()
        .map(|g| figures(&g.topic, g.group.clone(), &g.info))
        .collect();
    Ok(Json(json!({ "topics": topics, "groups": groups })))
}

/// `GET /api/topics`: as `spool topics --output json`.
pub async fn topics(State(app): State<Arc<App>>) -> ApiResult<Vec<TopicRow>> {
    let mut rows = Vec::new();
    for t in app.backend.topics().await? {
        let i = app.backend.topic_info(&t).await?;
        rows.push(TopicRow::new(t, &i));
    }
    Ok(Json(rows))
}

/// `GET /api/topics/{topic}`.
pub async fn topic(State(app): State<Arc<App>>, Path(topic): Path<String>) -> ApiResult<TopicRow> {
    existing_topic(&app, &topic).await?;
    let i = app.backend.topic_info(&topic).await?;
    Ok(Json(TopicRow::new(topic, &i)))
}

/// `GET /api/topics/{topic}/groups`: the topic's groups, as `spool groups --topic`.
pub async fn groups(
    State(app): State<Arc<App>>,
    Path(topic): Path<String>,
) -> ApiResult<Vec<GroupFigures>> {
    existing_topic(&app, &topic).await?;
    let mut rows = Vec::new();
    for g in app.backend.groups(&topic).await? {
        let i = app.backend.group_info(&topic, &g).await?;
        rows.push(figures(&topic, g, &i));
    }
    Ok(Json(rows))
}

/// `GET /api/topics/{topic}/groups/{group}`: a group with state (else 404).
pub async fn group(
    State(app): State<Arc<App>>,
    Path((topic, group)): Path<(String, String)>,
) -> ApiResult<GroupFigures> {
    existing_group(&app, &topic, &group).await?;
    let i = app.backend.group_info(&topic, &group).await?;
    Ok(Json(figures(&topic, group, &i)))
}

/// `GET /api/dlq`: as `spool dlq list --output json`.
pub async fn dlq_list(State(app): State<Arc<App>>) -> ApiResult<Vec<dlq::DlqRow>> {
    Ok(Json(dlq::dlq_rows(&app.backend, &app.suffix).await?))
}

/// The dead-letter browser's query: `?reason=TEXT&from=N&max=N`.
#[derive(Deserialize)]
pub struct DlqQuery {
    reason: Option<String>,
    from: Option<u64>,
    max: Option<u64>,
}

/// `GET /api/dlq/{topic}?reason=&from=&max=`: records as `dlq show --output json` prints
/// them (at most 1,000 a page; `max` above that is a 400).
pub async fn dlq_records(
    State(app): State<Arc<App>>,
    Path(topic): Path<String>,
    query: Result<Query<DlqQuery>, QueryRejection>,
) -> ApiResult<Vec<Value>> {
    let Query(q) = query.map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.body_text()))?;
    let max = q.max.unwrap_or(100);
    if max > DLQ_PAGE_MAX {
        let what = format!("max is at most {DLQ_PAGE_MAX} records a page, not {max}");
        return Err(ApiError(StatusCode::BAD_REQUEST, what));
    }
    existing_dlq(&app, &topic).await?;
    let select = Select {
        from: q.from,
        max: Some(max),
        reason: q.reason.filter(|r| !r.is_empty()),
    };
    let records = dlq::selected(&app.backend, &topic, select).await?;
    Ok(Json(records.iter().map(output::record_json).collect()))
}

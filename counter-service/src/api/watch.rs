//! `counts:watch` and `top:watch`: the totals of some owners, or a
//! ranking's first owners, as Server-Sent Events pushed as they change (the
//! work is `domain::watch`'s; this is the wire).
//!
//! ```text
//! event: snapshot          every watched total, first
//! id: 1
//! data: {"counts":{"7":{"likes":41}},"uniques":{"7":{"viewers":9}}}
//!
//! event: change            the totals that changed, at most one event per watch.min_interval_ms
//! id: 2
//! data: {"counts":{"7":{"likes":42}},"uniques":{}}
//!
//! event: closed            the last, when the service ends the stream
//! id: 3
//! data: {"reason":"slow_consumer"}
//! ```

use std::{convert::Infallible, sync::Arc};

use axum::{
    Extension,
    extract::State,
    http::{HeaderMap, HeaderValue, header::HeaderName},
    response::{
        IntoResponse, Response,
        sse::{Event as SseEvent, KeepAlive, Sse},
    },
};
use serde::Deserialize;
use utoipa::IntoParams;

use super::connections::Connection;
use super::extract::{Query, Reading, Target};
use super::read::split;
use crate::{
    domain::watch::{ClosedEvent, Event, Interest, Link},
    problem::{Problem, ProblemBody},
    state::AppState,
};

/// `counts:watch`'s query: comma-separated lists.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct WatchQuery {
    /// Owners, comma-separated (at most `watch.max_owners`, default 100).
    pub owners: String,
    /// Keys, comma-separated: counted keys (their totals in `counts`) and
    /// unique keys (their estimates in `uniques`).
    pub keys: String,
}

impl Link for Connection {
    fn written(&self) -> u64 {
        Connection::written(self)
    }

    fn close(&self) {
        Connection::close(self)
    }
}

/// Watches totals: a `text/event-stream` whose first event (`snapshot`)
/// holds every watched total and whose next ones (`change`) hold those that
/// changed, each as read after the change committed, whichever instance
/// took the write. A reconnect starts again with a snapshot: events carry
/// totals, not deltas, so nothing is missed (`Last-Event-ID` is accepted
/// and not needed). The service ends a stream with a `closed` event whose
/// `reason` is `slow_consumer` (its client did not take what it was sent)
/// or `draining` (the instance is stopping): reconnect. The token goes in
/// `Authorization`, so a browser reads it with `fetch`, not `EventSource`.
#[utoipa::path(
    operation_id = "countsWatch",
    get,
    path = "/v1/{ns}/counts:watch",
    tag = "counts",
    params(
        ("ns" = String, Path, description = "The namespace"),
        WatchQuery,
        ("Last-Event-ID" = Option<String>, Header, description = "Sent by a reconnecting client; the stream starts again with a snapshot either way"),
    ),
    responses(
        (status = 200, description = "Server-Sent Events: `snapshot` and `change` events whose data is a `WatchedValues`, a `closed` event whose data is a `ClosedEvent`; a comment line every `watch.keep_alive_ms` while quiet", content_type = "text/event-stream", body = String),
        (status = 400, description = "Bad input, or over a bound (owners, keys)", body = ProblemBody, content_type = "application/problem+json"),
        (status = 429, description = "The token's rate is used up, or it holds `watch.max_streams_per_token` streams here already", body = ProblemBody, content_type = "application/problem+json"),
        (status = 503, description = "The instance holds `watch.max_streams` streams already, or the first read failed", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn watch(
    State(state): State<AppState>,
    target: Target<Reading>,
    connection: Option<Extension<Connection>>,
    headers: HeaderMap,
    Query(query): Query<WatchQuery>,
) -> Result<Response, Problem> {
    let namespace = target.namespace(&state);
    let owners: Vec<String> = split(&query.owners).map(str::to_owned).collect();
    let keys: Vec<String> = split(&query.keys).map(str::to_owned).collect();
    let interest = state
        .watch
        .interest(namespace, &owners, &keys, state.server.max_batch_keys)?;
    stream(&state, &target, connection, &headers, interest).await
}

/// `top:watch`'s query.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct TopWatchQuery {
    /// The key ranked (a counted key).
    pub key: String,
    /// Owners ranked, 1 to `watch.max_owners` (default 10).
    pub limit: Option<usize>,
}

/// Watches a ranking's first owners: a `text/event-stream` whose first
/// event (`snapshot`) holds the ranking as `GET top` would answer it and
/// whose next ones (`change`) hold it again whenever it changed (an owner's
/// total, or the order), read after the change committed, whichever
/// instance took the write; at most one event per `watch.min_interval_ms`.
/// It ends as `counts:watch` does (`closed`).
#[utoipa::path(
    operation_id = "topWatch",
    get,
    path = "/v1/{ns}/top:watch",
    tag = "counts",
    params(
        ("ns" = String, Path, description = "The namespace"),
        TopWatchQuery,
        ("Last-Event-ID" = Option<String>, Header, description = "Sent by a reconnecting client; the stream starts again with a snapshot either way"),
    ),
    responses(
        (status = 200, description = "Server-Sent Events: `snapshot` and `change` events whose data is a `WatchedRanking`, a `closed` event whose data is a `ClosedEvent`", content_type = "text/event-stream", body = String),
        (status = 400, description = "Bad input, or a limit over `watch.max_owners`", body = ProblemBody, content_type = "application/problem+json"),
        (status = 429, description = "The token's rate is used up, or it holds `watch.max_streams_per_token` streams here already", body = ProblemBody, content_type = "application/problem+json"),
        (status = 503, description = "The instance holds `watch.max_streams` streams already, or the first read failed", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn top_watch(
    State(state): State<AppState>,
    target: Target<Reading>,
    connection: Option<Extension<Connection>>,
    headers: HeaderMap,
    Query(query): Query<TopWatchQuery>,
) -> Result<Response, Problem> {
    let namespace = target.namespace(&state);
    let interest = state.watch.ranking_interest(
        namespace,
        &query.key,
        query.limit.unwrap_or(10.min(state.watch.max_owners())),
    )?;
    stream(&state, &target, connection, &headers, interest).await
}

/// Opens the stream of `interest` and answers it as Server-Sent Events.
async fn stream(
    state: &AppState,
    target: &Target<Reading>,
    connection: Option<Extension<Connection>>,
    headers: &HeaderMap,
    interest: Interest,
) -> Result<Response, Problem> {
    // `text/event-stream; int64=string`: the events' integers as strings.
    let as_strings = super::int64::wanted(headers);
    let connection = connection.map(|Extension(c)| c);
    // The connection counts as busy while the stream is sent: never
    // closed as idle, never evicted for a newcomer.
    let busy = connection.as_ref().map(Connection::streaming);
    let link = connection.map(|c| Arc::new(c) as Arc<dyn Link>);
    let watch = state
        .watch
        .watch(target.caller.token(), interest, link)
        .await?;
    let events = futures_util::stream::unfold(
        (watch, busy, 0u64),
        move |(mut watch, busy, id)| async move {
            let event = watch.next().await?;
            let id = id + 1;
            let (name, data) = match &event {
                Event::Snapshot(payload) => ("snapshot", serde_json::to_value(payload)),
                Event::Change(payload) => ("change", serde_json::to_value(payload)),
                Event::Closed(reason) => (
                    "closed",
                    serde_json::to_value(ClosedEvent { reason: *reason }),
                ),
            };
            let mut data = data.unwrap_or_default();
            if as_strings {
                super::int64::stringify(&mut data);
            }
            let data = data.to_string();
            // What the client must take of it: `event:`, `id:`, `data:` lines.
            let id_text = id.to_string();
            watch.handed((name.len() + id_text.len() + data.len() + 21) as u64);
            let sse = SseEvent::default().event(name).id(id_text).data(data);
            Some((Ok::<_, Infallible>(sse), (watch, busy, id)))
        },
    );
    let mut response = Sse::new(events)
        .keep_alive(KeepAlive::new().interval(state.watch.keep_alive()))
        .into_response();
    // A proxy that buffers answers (nginx) would hold the events back.
    response.headers_mut().insert(
        HeaderName::from_static("x-accel-buffering"),
        HeaderValue::from_static("no"),
    );
    Ok(response)
}

//! axum's extractors with their rejections answered as problem details.

use std::{marker::PhantomData, time::Instant};

use axum::{
    extract::{FromRequest, FromRequestParts, Request},
    http::request::Parts,
};
use serde::de::DeserializeOwned;

use crate::{
    config::Scope,
    domain::{admission::Arrival, auth::Caller, namespace::Namespace},
    problem::Problem,
    state::AppState,
};

/// A JSON body; a malformed, oversized or mistyped one is a problem (an
/// oversized one with its `bound` and `max`, as every bound refusal).
pub(crate) struct Json<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for Json<T> {
    type Rejection = Problem;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, Problem> {
        match axum::Json::<T>::from_request(request, state).await {
            Ok(axum::Json(value)) => Ok(Self(value)),
            Err(rejection) => {
                let problem = Problem::from(rejection);
                Err(match problem.status() {
                    axum::http::StatusCode::PAYLOAD_TOO_LARGE => {
                        problem.with("max", state.server.max_body_bytes)
                    }
                    _ => problem,
                })
            }
        }
    }
}

/// When the service received the request, stamped by the outermost
/// per-request layer ([`super::scrape::track`]): a queue's time bound
/// counts from it, so the time a request spent being read, parsed and
/// waiting for a core is part of the wait it is admitted for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Received(pub Instant);

/// What a queue's admission knows of a request before its body is read:
/// when it was [`Received`] and its `Content-Length`.
fn arrival_of(parts: &Parts) -> Arrival {
    Arrival {
        received: parts
            .extensions
            .get::<Received>()
            .map_or_else(Instant::now, |received| received.0),
        body_bytes: parts
            .headers
            .get(axum::http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok()),
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Arrival {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(arrival_of(parts))
    }
}

/// A query string.
pub(crate) struct Query<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for Query<T> {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Problem> {
        let axum::extract::Query(value) =
            axum::extract::Query::<T>::from_request_parts(parts, state).await?;
        Ok(Self(value))
    }
}

/// The `{ns}` path segment.
pub(crate) struct Ns(pub String);

impl<S: Send + Sync> FromRequestParts<S> for Ns {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Problem> {
        // By name: a route may have more segments (`admin/jobs/{id}`).
        let axum::extract::Path(mut segments) = axum::extract::Path::<
            std::collections::HashMap<String, String>,
        >::from_request_parts(parts, state)
        .await?;
        segments
            .remove("ns")
            .map(Self)
            .ok_or_else(|| Problem::internal("a route without `{ns}`"))
    }
}

/// What a route needs of its caller: a scope, and for writes room in the
/// namespace's queue they go through.
pub(crate) trait Needs {
    const SCOPE: Scope;
    /// The queue the route's writes go through: refused at once when it
    /// is full.
    const QUEUE: Option<Queue> = None;
}

/// The namespace's write queues.
#[derive(PartialEq, Eq)]
pub(crate) enum Queue {
    Adds,
    Observes,
}

/// Reads: counts, rankings, series, keys.
pub(crate) struct Reading;
/// Observations (unique keys), through the namespace's observe queue.
pub(crate) struct Observing;
/// Adds, through the namespace's add queue.
pub(crate) struct Adding;
/// Maintenance: check, compact, clear.
pub(crate) struct Administering;

impl Needs for Reading {
    const SCOPE: Scope = Scope::Read;
}
impl Needs for Observing {
    const SCOPE: Scope = Scope::Write;
    const QUEUE: Option<Queue> = Some(Queue::Observes);
}
impl Needs for Adding {
    const SCOPE: Scope = Scope::Write;
    const QUEUE: Option<Queue> = Some(Queue::Adds);
}
impl Needs for Administering {
    const SCOPE: Scope = Scope::Admin;
}

/// The caller and the `{ns}` of the path, allowed what the route needs
/// (`N`): authorization in one place, before anything of the body is read.
/// No token or a wrong one (401), a token over its rate (429), an unknown
/// namespace (404), a missing scope (403) or a full add queue (503) never
/// costs a body's parsing. Every `/v1/` handler takes one.
pub(crate) struct Target<N> {
    pub caller: Caller,
    name: String,
    needs: PhantomData<N>,
}

impl<N> Target<N> {
    /// The namespace, allowed when this was extracted.
    pub fn namespace<'s>(&self, state: &'s AppState) -> &'s Namespace {
        &state.namespaces[&self.name]
    }
}

impl<N: Needs> FromRequestParts<AppState> for Target<N> {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Problem> {
        let Calling(caller) = Calling::from_request_parts(parts, state).await?;
        let Ns(name) = Ns::from_request_parts(parts, state).await?;
        let namespace = state.namespace(&caller, &name, N::SCOPE)?;
        // A body declared over the size bound is left to its 413.
        let arrival = || {
            let mut arrival = arrival_of(parts);
            arrival.body_bytes = arrival
                .body_bytes
                .filter(|bytes| *bytes <= state.server.max_body_bytes as u64);
            arrival
        };
        match N::QUEUE {
            Some(Queue::Adds) => namespace.room_for_adds(arrival())?,
            Some(Queue::Observes) => namespace.room_for_observes(arrival())?,
            None => {}
        }
        Ok(Self {
            caller,
            name,
            needs: PhantomData,
        })
    }
}

/// The caller, identified by its token (401, 429) and named in the
/// request's span: what [`Target`] starts with, and all a route without a
/// namespace (`GET /v1/namespaces`) takes, its handler then allowing each
/// namespace or not.
pub(crate) struct Calling(pub Caller);

impl FromRequestParts<AppState> for Calling {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Problem> {
        let presented = parts
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
            .map(str::trim);
        let caller = state.tokens.identify(presented)?;
        tracing::Span::current().record("caller", caller.name());
        Ok(Self(caller))
    }
}

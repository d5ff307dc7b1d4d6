//! Every error as RFC 9457 problem details (`application/problem+json`),
//! with the library's error kind as the extension member `kind`.
//!
//! ```json
//! {"type": "urn:counter-service:problem:invalid-input", "title": "Invalid input",
//!  "status": 400, "detail": "a string owner id is at most 255 characters long",
//!  "kind": "invalid_input"}
//! ```
//!
//! A client branches on `status` and `kind`; `detail` is for people. The
//! service's own failures (the database's, a bug) are logged with their
//! cause and answered with a fixed text.

use axum::{
    Json,
    extract::rejection::{JsonRejection, PathRejection, QueryRejection},
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use counter_core::{CounterError, ErrorKind};
use serde::Serialize;
use serde_json::{Map, Value};

/// The media type of every error body.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// One failed request: its status, its problem type and what to say.
#[derive(Debug, Clone)]
pub struct Problem {
    status: StatusCode,
    slug: &'static str,
    kind: &'static str,
    detail: String,
    extensions: Map<String, Value>,
    retry_after: Option<u64>,
}

/// The problem document: what `Problem` serializes to.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ProblemBody {
    /// `urn:counter-service:problem:<slug>`.
    #[serde(rename = "type")]
    pub kind_uri: String,
    /// A short summary of the problem type.
    pub title: String,
    /// The HTTP status.
    pub status: u16,
    /// What happened, for people.
    pub detail: String,
    /// The error kind: `invalid_input`, `overflow`, `transient`,
    /// `schema_missing`, `misuse`, `database` (the library's), or the
    /// service's `not_found`, `unauthorized`, `forbidden`, `rate_limited`,
    /// `conflict`, `too_large`, `timeout`, `overloaded`, `internal`.
    pub kind: String,
    /// Members that say more, by problem: `bound`, `max` and `min` (a
    /// bound exceeded), `expected_wait_ms`, `waited_ms` and `max_wait_ms`
    /// (a queue's wait bound), `item` (which batch item), `job` and `href`
    /// (the running job).
    #[serde(flatten)]
    #[schema(value_type = Object, additional_properties = true)]
    pub extensions: Map<String, Value>,
}

impl Problem {
    fn new(
        status: StatusCode,
        slug: &'static str,
        kind: &'static str,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            status,
            slug,
            kind,
            detail: detail.into(),
            extensions: Map::new(),
            retry_after: None,
        }
    }

    /// 400: a malformed or refused value.
    pub fn bad_request(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid-input",
            "invalid_input",
            detail,
        )
    }

    /// 400 for a value over one of the service's bounds, naming it.
    pub fn over_bound(bound: &'static str, max: usize, got: usize) -> Self {
        Self::bad_request(format!("{bound}: {got} is over the limit of {max}"))
            .with("bound", bound)
            .with("max", max)
    }

    /// 400 for a count outside `min..=max` (a list's length, a limit),
    /// naming the bound and saying which end it missed.
    pub fn out_of_range(bound: &'static str, min: usize, max: usize, got: usize) -> Self {
        if got < min {
            return Self::bad_request(format!("{bound}: {got} is under the minimum of {min}"))
                .with("bound", bound)
                .with("min", min)
                .with("max", max);
        }
        Self::over_bound(bound, max, got).with("min", min)
    }

    /// 404: no such namespace.
    pub fn unknown_namespace(name: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "unknown-namespace",
            "not_found",
            format!("no namespace `{}`", preview(name)),
        )
    }

    /// 404: no such route.
    pub fn no_route(path: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "not-found",
            "not_found",
            format!(
                "no route `{}`; the API is listed at /openapi.json",
                preview(path)
            ),
        )
    }

    /// 405: a route that exists, with a method it does not take.
    pub fn method_not_allowed() -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method-not-allowed",
            "invalid_input",
            "this route does not take this method; see /openapi.json",
        )
    }

    /// 401: no token, or none that matches.
    pub fn unauthorized(detail: &'static str) -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "unauthorized",
            detail,
        )
    }

    /// 403: a valid token outside its scopes or namespaces.
    pub fn forbidden(detail: String) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", "forbidden", detail)
    }

    /// 429, with `Retry-After` in whole seconds.
    pub fn rate_limited(retry_after_secs: u64) -> Self {
        let mut problem = Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate-limited",
            "rate_limited",
            format!("this token's request rate is used up; retry in {retry_after_secs} s"),
        );
        problem.retry_after = Some(retry_after_secs);
        problem
    }

    /// 429: the token holds `max` watch streams on this instance already.
    pub fn too_many_streams(max: usize) -> Self {
        let mut problem = Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "too-many-streams",
            "rate_limited",
            format!(
                "this token holds {max} watch streams here already (`watch.max_streams_per_token`); close one, or watch more owners per stream"
            ),
        )
        .with("bound", "watch streams per token")
        .with("max", max);
        problem.retry_after = Some(1);
        problem
    }

    /// 409: an `Idempotency-Key` (or item id) used before with another body.
    pub fn idempotency_conflict(key: &str) -> Self {
        Self::new(
            StatusCode::CONFLICT,
            "idempotency-key-reused",
            "conflict",
            format!(
                "the id `{}` was used before with another request; a retry must send the same request",
                preview(key)
            ),
        )
    }

    /// 409: a job of this kind runs in the namespace already.
    pub fn job_running(id: &str, namespace: &str) -> Self {
        Self::new(
            StatusCode::CONFLICT,
            "job-running",
            "conflict",
            format!("a job of this kind is running in `{namespace}`: {id}; follow it rather than start another"),
        )
        .with("job", id)
        .with("href", format!("/v1/{namespace}/admin/jobs/{id}"))
    }

    /// 404: no such job (finished long ago, or run by another instance).
    pub fn unknown_job(id: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "unknown-job",
            "not_found",
            format!(
                "no job `{}` here: jobs are kept by the instance that runs them, the last 16 per namespace",
                preview(id)
            ),
        )
    }

    /// 503: the request took longer than `server.request_timeout_ms`.
    pub fn timeout(millis: u64) -> Self {
        let mut problem = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "timeout",
            "timeout",
            format!(
                "the request took longer than {millis} ms; its outcome is unknown: \
                 retry with the same Idempotency-Key"
            ),
        );
        problem.retry_after = Some(1);
        problem
    }

    /// 503 at once: the service is at a bound of its own (`what`), so the
    /// request was refused before any work; nothing of it was applied.
    pub fn overloaded(what: &'static str) -> Self {
        let mut problem = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "overloaded",
            "overloaded",
            format!("the service is at its bound of {what}; nothing was applied: retry shortly"),
        )
        .with("bound", what);
        problem.retry_after = Some(1);
        problem
    }

    /// 500: a bug on the service's side; the cause goes to the log only.
    pub fn internal(cause: impl std::fmt::Display) -> Self {
        tracing::error!(%cause, "internal error");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "internal",
            "internal error",
        )
    }

    /// 500 without `Retry-After`: the database refused the request for a
    /// reason no retry changes (a missing table, a statement it rejects);
    /// the cause is logged, the kind says which.
    pub fn permanent(kind: &'static str, cause: impl std::fmt::Display) -> Self {
        tracing::error!(%cause, kind, "the database refused the request");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "database-refused",
            kind,
            "the database refused the request; a retry will not change that (the service's log has the cause)",
        )
    }

    /// 503: the database could not serve the request; the cause is logged.
    pub fn unavailable(kind: &'static str, cause: impl std::fmt::Display) -> Self {
        tracing::warn!(%cause, "database unavailable");
        let mut problem = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            kind,
            "the database is unavailable; retry later (with the same Idempotency-Key for an add)",
        );
        problem.retry_after = Some(1);
        problem
    }

    /// Adds an extension member.
    pub fn with(mut self, name: &str, value: impl Into<Value>) -> Self {
        self.extensions.insert(name.to_owned(), value.into());
        self
    }

    /// The same problem, its `Retry-After` `seconds` instead.
    pub fn retry_in(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds);
        self
    }

    /// Its `Retry-After`, in seconds, if it has one.
    #[cfg(test)]
    pub fn retry_after(&self) -> Option<u64> {
        self.retry_after
    }

    /// The status code.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    fn title(&self) -> &'static str {
        match self.slug {
            "invalid-input" => "Invalid input",
            "too-large" => "Payload too large",
            "unknown-namespace" => "Unknown namespace",
            "not-found" => "Not found",
            "method-not-allowed" => "Method not allowed",
            "unauthorized" => "Unauthorized",
            "forbidden" => "Forbidden",
            "rate-limited" => "Too many requests",
            "idempotency-key-reused" => "Idempotency key reused",
            "overflow" => "Counter overflow",
            "timeout" => "Request timed out",
            "overloaded" => "Service overloaded",
            "job-running" => "A job is running",
            "unknown-job" => "Unknown job",
            "unavailable" => "Service unavailable",
            "unsupported-media-type" => "Unsupported media type",
            "too-many-streams" => "Too many streams",
            "cross-region" => "Another region's rows",
            "database-refused" => "Database refused the request",
            _ => "Internal error",
        }
    }
}

impl Problem {
    /// The problem document, as the answer's body carries it: a
    /// [`ProblemBody`], the type the OpenAPI document describes.
    pub fn document(&self) -> Value {
        serde_json::to_value(self.body()).unwrap_or(Value::Null)
    }

    /// The problem document, typed.
    pub fn body(&self) -> ProblemBody {
        ProblemBody {
            kind_uri: format!("urn:counter-service:problem:{}", self.slug),
            title: self.title().to_owned(),
            status: self.status.as_u16(),
            detail: self.detail.clone(),
            kind: self.kind.to_owned(),
            extensions: self.extensions.clone(),
        }
    }
}

impl std::fmt::Display for ProblemBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.status, self.kind, self.detail)
    }
}

impl std::error::Error for ProblemBody {}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        metrics::counter!(crate::metrics::ERRORS, "kind" => self.kind).increment(1);
        let mut response = (self.status, Json(self.document())).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(seconds) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// The library's errors by kind: the caller's input is 400, an overflow
/// 409, the database's trouble 503, a misuse (a bug of ours) 500.
impl From<CounterError> for Problem {
    fn from(error: CounterError) -> Self {
        // Not a bug of ours: the operation needs every region's rows, and
        // this instance counts in one (`[region]`). A conflict with the
        // deployment, the same on every retry.
        if let CounterError::CrossRegion { .. } = error {
            return Self::new(
                StatusCode::CONFLICT,
                "cross-region",
                "cross_region",
                error.to_string(),
            );
        }
        match error.kind() {
            ErrorKind::InvalidInput => Self::bad_request(error.to_string()),
            ErrorKind::Overflow => Self::new(
                StatusCode::CONFLICT,
                "overflow",
                "overflow",
                error.to_string(),
            ),
            // Only what may pass on a retry says "retry" (Google's API
            // guide, gRPC's UNAVAILABLE against INTERNAL): a lost connection,
            // a deadlock, a busy database. A missing table or a statement the
            // database refuses fails the same way every time.
            ErrorKind::Transient => Self::unavailable("transient", &error),
            ErrorKind::SchemaMissing => Self::permanent("schema_missing", &error),
            ErrorKind::Database => Self::permanent("database", &error),
            ErrorKind::Misuse => Self::internal(&error),
            _ => Self::internal(&error),
        }
    }
}

impl From<sea_orm::DbErr> for Problem {
    fn from(error: sea_orm::DbErr) -> Self {
        CounterError::from(error).into()
    }
}

/// A JSON body axum refused: its status (400, 413, 415, 422 as 400) and
/// axum's text.
impl From<JsonRejection> for Problem {
    fn from(rejection: JsonRejection) -> Self {
        match rejection.status() {
            StatusCode::PAYLOAD_TOO_LARGE => Self::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too-large",
                "too_large",
                "the request body is over the service's limit (server.max_body_bytes)",
            )
            .with("bound", "max_body_bytes"),
            StatusCode::UNSUPPORTED_MEDIA_TYPE => Self::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported-media-type",
                "invalid_input",
                "the body must be JSON, sent with `Content-Type: application/json`",
            ),
            _ => Self::bad_request(rejection.body_text()),
        }
    }
}

impl From<QueryRejection> for Problem {
    fn from(rejection: QueryRejection) -> Self {
        Self::bad_request(rejection.body_text())
    }
}

impl From<PathRejection> for Problem {
    fn from(rejection: PathRejection) -> Self {
        Self::bad_request(rejection.body_text())
    }
}

/// At most 64 characters of `text`, for messages: a 10 kB owner id is not
/// echoed whole.
pub(crate) fn preview(text: &str) -> String {
    let mut shown: String = text.chars().take(64).collect();
    if shown.len() < text.len() {
        shown.push('…');
    }
    shown.escape_debug().to_string()
}

/// One problem of each constructor, for the tests of its title here and of
/// its kind in the OpenAPI document (`api::document`).
#[cfg(test)]
pub(crate) fn samples() -> Vec<Problem> {
    let region = counter_core::CounterError::CrossRegion {
        region: "a".into(),
        operation: "reset",
    };
    vec![
        Problem::bad_request("x"),
        Problem::unknown_namespace("x"),
        Problem::no_route("/x"),
        Problem::method_not_allowed(),
        Problem::unauthorized("x"),
        Problem::forbidden("x".into()),
        Problem::rate_limited(1),
        Problem::too_many_streams(1),
        Problem::idempotency_conflict("k"),
        Problem::job_running("j", "n"),
        Problem::unknown_job("j"),
        Problem::timeout(1),
        Problem::overloaded("x"),
        Problem::permanent("database", "x"),
        Problem::unavailable("database", "x"),
        Problem::from(region),
    ]
}

#[cfg(test)]
mod tests {
    use super::Problem;

    /// Every problem but a bug's has a title of its own: a slug missing
    /// from `title` would be titled "Internal error".
    #[test]
    fn every_problem_has_its_own_title() {
        for problem in super::samples() {
            assert_ne!(problem.title(), "Internal error", "{problem:?}");
        }
        assert_eq!(Problem::internal("x").title(), "Internal error");
    }

    /// An empty list is under the minimum, not "over the limit".
    #[test]
    fn a_count_out_of_range_names_the_end_it_missed() {
        let empty = Problem::out_of_range("observations", 1, 1_000, 0).document();
        assert_eq!(empty["detail"], "observations: 0 is under the minimum of 1");
        assert_eq!(
            (empty["min"].as_u64(), empty["max"].as_u64()),
            (Some(1), Some(1_000))
        );
        let over = Problem::out_of_range("observations", 1, 1_000, 1_001).document();
        assert_eq!(
            over["detail"],
            "observations: 1001 is over the limit of 1000"
        );
        assert_eq!(
            (over["bound"].as_str(), over["min"].as_u64()),
            (Some("observations"), Some(1))
        );
    }
}

//! Every failure as a status code and one JSON shape.

use std::fmt;

use axum::{
    Json,
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use counter_core::{CounterError, ErrorKind};
use sea_orm::DbErr;
use serde::Serialize;

/// Why a request failed. Its response is the status code and
/// `{"error": {"status": <code>, "message": <text>}}`, so a client parses one
/// shape for every error, whether it came from a handler, from a malformed
/// path or query, or from an unknown route.
#[derive(Debug)]
pub enum ApiError {
    /// 404: no such post or comment, or no such route.
    NotFound(String),
    /// 400: a malformed id, page, `days`, `limit`, ranking cursor or comment
    /// body.
    BadRequest(String),
    /// 415: a body not declared as `application/json`.
    UnsupportedMediaType(String),
    /// 413: a body over axum's size limit, refused before it is read whole.
    PayloadTooLarge(String),
    /// 405: a route that exists, with a method it does not take.
    MethodNotAllowed(String),
    /// 409: a counter would overflow `i64`. The request is well formed, but
    /// the counter's state does not allow it; counter-core refuses instead of
    /// wrapping or clamping.
    Conflict(String),
    /// 503: the database failed (unreachable, pool closed, table missing,
    /// write conflicts after every retry). The cause is logged, not sent:
    /// the client learns only that retrying later may work.
    Unavailable(String),
    /// 500: a bug on our side, such as a counter table definition that
    /// counter-core rejects. Logged, not sent, like [`ApiError::Unavailable`].
    Internal(String),
}

impl ApiError {
    /// The status code of the response.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The detail given at construction, causes included.
    fn detail(&self) -> &str {
        match self {
            ApiError::NotFound(m)
            | ApiError::BadRequest(m)
            | ApiError::UnsupportedMediaType(m)
            | ApiError::PayloadTooLarge(m)
            | ApiError::MethodNotAllowed(m)
            | ApiError::Conflict(m)
            | ApiError::Unavailable(m)
            | ApiError::Internal(m) => m,
        }
    }

    /// The message sent to the client: the detail for the client's own
    /// mistakes, a fixed text for ours (the detail goes to the log).
    fn public_message(&self) -> &str {
        match self {
            // Listed, not `_`: a new variant must choose what clients see.
            ApiError::NotFound(_)
            | ApiError::BadRequest(_)
            | ApiError::UnsupportedMediaType(_)
            | ApiError::PayloadTooLarge(_)
            | ApiError::MethodNotAllowed(_)
            | ApiError::Conflict(_) => self.detail(),
            ApiError::Unavailable(_) => "the database is unavailable; try again later",
            ApiError::Internal(_) => "internal server error",
        }
    }
}

impl fmt::Display for ApiError {
    /// The full detail, causes included: for logs, not for clients.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status(), self.detail())
    }
}

impl std::error::Error for ApiError {}

/// Any database error from SeaORM itself (finding posts) is 503: from the
/// client's side the database is down or misconfigured, and it cannot fix
/// either.
impl From<DbErr> for ApiError {
    fn from(err: DbErr) -> Self {
        ApiError::Unavailable(format!("database error: {err}"))
    }
}

/// Counter errors by their [`ErrorKind`]: the client's input (400), the
/// counter's state (409), the database's trouble (503) or ours (500). The
/// comment endpoints (`insert_counted`, `delete_counted`) fail the same way,
/// typed even when the failure happened inside a hook.
impl From<CounterError> for ApiError {
    fn from(err: CounterError) -> Self {
        let detail = err.to_string();
        match err.kind() {
            ErrorKind::InvalidInput => ApiError::BadRequest(detail),
            ErrorKind::Overflow => ApiError::Conflict(detail),
            ErrorKind::Transient | ErrorKind::SchemaMissing | ErrorKind::Database => {
                ApiError::Unavailable(detail)
            }
            // Misuse, and any kind added later: a deployment or code problem.
            _ => ApiError::Internal(detail),
        }
    }
}

/// The body of every error response.
#[derive(Serialize)]
struct ErrorBody<'a> {
    error: ErrorDetail<'a>,
}

#[derive(Serialize)]
struct ErrorDetail<'a> {
    status: u16,
    message: &'a str,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        match &self {
            ApiError::Unavailable(cause) => tracing::warn!(%status, "database trouble: {cause}"),
            ApiError::Internal(cause) => tracing::error!(%status, "{cause}"),
            _ => {}
        }
        let body = ErrorBody {
            error: ErrorDetail {
                status: status.as_u16(),
                message: self.public_message(),
            },
        };
        let mut response = (status, Json(body)).into_response();
        if status == StatusCode::SERVICE_UNAVAILABLE {
            // Most causes (a restarting database, a lost connection, lock
            // contention) pass: tell clients when to try again.
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

//! Where a read is served from, in HTTP: the request's `Counter-Read-From`
//! and the answer's `Counter-Read-Source` (and `Counter-Read-Lag-Ms`). The
//! choice itself is [`crate::domain::replicas`]'.

use axum::{
    extract::FromRequestParts,
    http::{HeaderName, HeaderValue, request::Parts},
    response::{IntoResponse, Response},
};
use serde::Serialize;

use crate::{domain::namespace::Namespace, domain::replicas::Source, problem::Problem};

/// The request header: `replica` (a lag-tolerant read, within
/// `database.replica_max_lag_ms`) or `primary`.
pub(crate) const READ_FROM: &str = "counter-read-from";
/// The answer header: `primary`, `replica` or `cache`.
pub(crate) const READ_SOURCE: HeaderName = HeaderName::from_static("counter-read-source");
/// With `replica`: how far behind the primary the standby was known to be
/// when the read began, in milliseconds (at most the bound).
pub(crate) const READ_LAG_MS: HeaderName = HeaderName::from_static("counter-read-lag-ms");

/// With `[region]`, on every API answer: the region that served it.
pub(crate) const REGION: HeaderName = HeaderName::from_static("counter-region");
/// With `[region]`, on every API answer: the age of the oldest of the other
/// regions' heartbeats here, in milliseconds (how stale another region's
/// share of a total may be); absent until every region has been heard
/// from, or while this instance cannot read the heartbeats.
pub(crate) const REGION_LAG_MS: HeaderName = HeaderName::from_static("counter-region-lag-ms");

/// The request's `Counter-Read-From`, if it has one.
pub(crate) struct ReadFrom(Option<bool>);

impl ReadFrom {
    /// Whether this read may go to a replica: the request's word, else the
    /// namespace's `replica_reads`.
    pub fn tolerates_lag(&self, namespace: &Namespace) -> bool {
        self.0.unwrap_or(namespace.replica_reads)
    }
}

impl<S: Send + Sync> FromRequestParts<S> for ReadFrom {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Problem> {
        let Some(value) = parts.headers.get(READ_FROM) else {
            return Ok(Self(None));
        };
        match value.to_str().map(str::trim) {
            Ok(v) if v.eq_ignore_ascii_case("replica") => Ok(Self(Some(true))),
            Ok(v) if v.eq_ignore_ascii_case("primary") => Ok(Self(Some(false))),
            _ => Err(Problem::bad_request(
                "`Counter-Read-From` is `replica` or `primary`",
            )),
        }
    }
}

/// A JSON answer and where it was read from.
pub(crate) struct Served<T>(pub T, pub Source);

impl<T> From<(T, Source)> for Served<T> {
    fn from((body, source): (T, Source)) -> Self {
        Self(body, source)
    }
}

impl<T: Serialize> IntoResponse for Served<T> {
    fn into_response(self) -> Response {
        let Served(body, source) = self;
        let mut response = axum::Json(body).into_response();
        let headers = response.headers_mut();
        headers.insert(READ_SOURCE, HeaderValue::from_static(source.as_str()));
        if let Source::Replica { lag } = source {
            headers.insert(READ_LAG_MS, HeaderValue::from(lag.as_millis() as u64));
        }
        response
    }
}

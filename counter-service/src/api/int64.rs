//! 64-bit integers as JSON strings, for clients whose numbers are doubles
//! (JavaScript's lose every integer past 2^53: `9223372036854775807` reads
//! back as `9223372036854776000`).
//!
//! A request that accepts `application/json; int64=string` gets its JSON
//! answer with every integer written as a decimal string, and says so in
//! its `Content-Type`; the OpenAPI document declares that media type with
//! string-typed schemas, so generated clients type them as strings. Deltas
//! in requests may be strings already (`domain::writes::int64`). A watch
//! stream asked for with `text/event-stream; int64=string` writes its
//! events' integers as strings the same way.

use axum::{
    body::{Body, to_bytes},
    extract::Request,
    http::{HeaderMap, HeaderValue, header},
    middleware::Next,
    response::{IntoResponse, Response},
};
use serde_json::Value;

/// The media type of JSON answers with integers as strings.
pub const JSON_INT64_STRING: &str = "application/json; int64=string";

/// Whether `headers`' `Accept` asks for integers as strings: any media
/// range with the parameter `int64=string`, unless its weight is `q=0`
/// ("not acceptable", RFC 9110 12.4.2).
pub(crate) fn wanted(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|range| {
            let parameters = || {
                range.split(';').skip(1).filter_map(|parameter| {
                    let (name, value) = parameter.split_once('=')?;
                    Some((name.trim(), value.trim().trim_matches('"')))
                })
            };
            let refused = parameters().any(|(name, value)| {
                name.eq_ignore_ascii_case("q") && value.parse::<f32>().is_ok_and(|q| q == 0.0)
            });
            !refused
                && parameters().any(|(name, value)| {
                    name.eq_ignore_ascii_case("int64") && value.eq_ignore_ascii_case("string")
                })
        })
}

/// Every integer of `value` as a decimal string.
pub(crate) fn stringify(value: &mut Value) {
    match value {
        Value::Number(n) if n.is_i64() || n.is_u64() => *value = Value::String(n.to_string()),
        Value::Array(items) => items.iter_mut().for_each(stringify),
        Value::Object(members) => members.values_mut().for_each(stringify),
        _ => {}
    }
}

/// The largest answer rewritten: far over any the API sends (1,000 owners
/// of 32 keys), so never reached by one.
const MAX_ANSWER: usize = 64 << 20;

/// Says that an API answer depends on `Accept`: a cache must not give the
/// strings to a client that asked for numbers.
fn vary(response: &mut Response) {
    response
        .headers_mut()
        .append(header::VARY, HeaderValue::from_static("accept"));
}

/// Rewrites a JSON answer's integers as strings when the request asked.
pub(crate) async fn rewrite(request: Request, next: Next) -> Response {
    // The API's answers only: `/openapi.json` and `/readyz` are what they are.
    let api = request.uri().path().starts_with("/v1/");
    if !api || !wanted(request.headers()) {
        let mut response = next.run(request).await;
        if api {
            vary(&mut response);
        }
        return response;
    }
    let mut response = next.run(request).await;
    vary(&mut response);
    let json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !json {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let Ok(bytes) = to_bytes(body, MAX_ANSWER).await else {
        return crate::problem::Problem::internal("an answer too large to rewrite").into_response();
    };
    let Ok(mut value) = serde_json::from_slice::<Value>(&bytes) else {
        return Response::from_parts(parts, Body::from(bytes));
    };
    stringify(&mut value);
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(JSON_INT64_STRING),
    );
    Response::from_parts(parts, Body::from(value.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parameter_is_found_in_any_range_and_integers_become_strings() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::ACCEPT,
            HeaderValue::from_static("text/html, application/json; q=0.9; int64=string"),
        );
        assert!(wanted(&headers));
        headers.insert(
            header::ACCEPT,
            HeaderValue::from_static("application/json; int64=\"STRING\""),
        );
        assert!(wanted(&headers));
        headers.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
        assert!(!wanted(&headers));
        // A range weighted 0 is one the client refuses.
        for refused in [
            "application/json; int64=string; q=0",
            "application/json; int64=string; q=0.000, application/json",
        ] {
            headers.insert(header::ACCEPT, HeaderValue::from_static(refused));
            assert!(!wanted(&headers), "{refused}");
        }
        headers.insert(
            header::ACCEPT,
            HeaderValue::from_static("application/json; int64=string; q=0.001"),
        );
        assert!(wanted(&headers));
        let mut value = serde_json::json!({"counts": {"1": {"likes": 9223372036854775807i64}}, "n": [-3, 1.5, "x"], "ok": true});
        stringify(&mut value);
        assert_eq!(
            value,
            serde_json::json!({"counts": {"1": {"likes": "9223372036854775807"}}, "n": ["-3", 1.5, "x"], "ok": true})
        );
    }
}

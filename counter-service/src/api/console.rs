//! The browser console at `/ui` (`server.console`, on by default): one
//! HTML page, one JavaScript module and one style sheet, embedded in the
//! binary and served as they are. The page calls the API of the same
//! origin with the token typed into it (kept in the tab's
//! `sessionStorage`), and builds every node of what it shows with
//! `textContent` and attributes, never markup from data: owners and keys
//! are user data.
//!
//! Every answer carries a strict `Content-Security-Policy` (scripts,
//! styles and requests of this origin only, no inline code, no framing),
//! `X-Content-Type-Options: nosniff` and `Referrer-Policy: no-referrer`.
//! These routes are not the API: they are not in the OpenAPI document,
//! take no token (the files are the same for everyone; the data they
//! fetch is the API's, with its tokens) and are never shed.

use axum::{
    Router,
    http::{HeaderName, HeaderValue, header},
    response::{IntoResponse, Response},
    routing::get,
};

/// The page.
const INDEX: &str = include_str!("console/index.html");
/// Its one script, an ES module.
const SCRIPT: &str = include_str!("console/console.js");
/// Its one style sheet.
const STYLE: &str = include_str!("console/console.css");

/// The console's content security policy: nothing but this origin's
/// script, style sheet and API, images only inline (`data:`, the icon).
pub(crate) const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
    style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; \
    form-action 'none'; frame-ancestors 'none'";

/// The console's files, as `(path, content type, body)`.
pub(crate) const ASSETS: [(&str, &str, &str); 4] = [
    ("/ui", "text/html; charset=utf-8", INDEX),
    ("/ui/", "text/html; charset=utf-8", INDEX),
    ("/ui/console.js", "text/javascript; charset=utf-8", SCRIPT),
    ("/ui/console.css", "text/css; charset=utf-8", STYLE),
];

/// The console's routes, for any router state.
pub(crate) fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    ASSETS
        .into_iter()
        .fold(Router::new(), |router, (path, content_type, body)| {
            router.route(path, get(move || async move { asset(content_type, body) }))
        })
}

/// One file with the console's headers. `no-cache`: a browser revalidates,
/// so an upgraded service serves its own console at once.
fn asset(content_type: &'static str, body: &'static str) -> Response {
    let headers: [(HeaderName, HeaderValue); 5] = [
        (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
        (
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CONTENT_SECURITY_POLICY),
        ),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
        (
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        ),
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
    ];
    (headers, body).into_response()
}

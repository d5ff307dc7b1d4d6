//! The counting service in process and a plain HTTP client to load it:
//! what service-bench and limits share.

use counter_service::{Config, Local, Service};
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, body::Bytes};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use tokio::net::TcpListener;

use crate::BoxError;

/// A pooled HTTP/1 client.
pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// A client keeping up to `idle` connections per host open.
pub fn client(idle: usize) -> HttpClient {
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(idle)
        .build_http()
}

/// A service configured by `text`, migrated and serving on a free
/// loopback port: its base URL.
pub async fn serve(text: &str, name: &str) -> Result<String, BoxError> {
    Ok(serve_local(text, name).await?.0)
}

/// [`serve`], and the service's write path in process beside it.
pub async fn serve_local(text: &str, name: &str) -> Result<(String, Local), BoxError> {
    let config = Config::from_text(text, name, std::iter::empty(), &[])?;
    Service::migrate(&config).await?;
    let service = Service::start(config).await?;
    let local = service.local();
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    tokio::spawn(service.serve(listener, std::future::pending()));
    Ok((base, local))
}

/// The sum and the count of the service's histogram `name` so far, from
/// its `/metrics`: their differences between two reads give the mean of
/// what was recorded in between.
pub async fn histogram(
    client: &HttpClient,
    base: &str,
    name: &str,
) -> Result<(f64, f64), BoxError> {
    let (_, text) = call(client, Method::GET, &format!("{base}/metrics"), None, None).await?;
    let text = String::from_utf8_lossy(&text);
    let figure = |suffix: &str| {
        let prefix = format!("{name}_{suffix} ");
        text.lines()
            .find_map(|line| line.strip_prefix(&prefix)?.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    Ok((figure("sum"), figure("count")))
}

/// One request: its status and body.
pub async fn call(
    client: &HttpClient,
    method: Method,
    url: &str,
    key: Option<&str>,
    body: Option<String>,
) -> Result<(u16, Bytes), BoxError> {
    let mut request = Request::builder().method(method).uri(url);
    if body.is_some() {
        request = request.header("content-type", "application/json");
    }
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    let response = client
        .request(request.body(Full::new(body.map(Bytes::from).unwrap_or_default()))?)
        .await
        .map_err(|e| match std::error::Error::source(&e) {
            // The client's own message ("client error (SendRequest)")
            // names no cause.
            Some(cause) => format!("{url}: {e}: {cause}"),
            None => format!("{url}: {e}"),
        })?;
    let status = response.status().as_u16();
    Ok((status, response.into_body().collect().await?.to_bytes()))
}

/// A POST of JSON `body` that must answer 200: its body, parsed.
pub async fn post_ok(
    client: &HttpClient,
    url: &str,
    body: String,
) -> Result<serde_json::Value, BoxError> {
    Ok(serde_json::from_slice(
        &post_bytes(client, url, body).await?,
    )?)
}

/// A POST of JSON `body` that must answer 200: its body as received (for
/// a timing that stops before the caller parses it).
pub async fn post_bytes(client: &HttpClient, url: &str, body: String) -> Result<Bytes, BoxError> {
    let (status, text) = call(client, Method::POST, url, None, Some(body)).await?;
    if status != 200 {
        return Err(format!("{url}: {status} {}", String::from_utf8_lossy(&text)).into());
    }
    Ok(text)
}

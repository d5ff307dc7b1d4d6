//! Serving connections so that no caller can lock the others out: a
//! request head must arrive within `header_read_timeout_ms` (nginx's
//! `client_header_timeout`), a connection with nothing in flight is closed
//! after `idle_timeout_ms` of silence (`keepalive_timeout`), and open
//! connections are capped below the process's open-files limit (raised to
//! its hard limit at start, as mini-redis caps with a semaphore). At the
//! cap, the connection that has sent the least of those with no request in
//! flight is closed to make room: a client holding a thousand idle or
//! half-sent requests cannot keep the next caller out, even where the file
//! limit is 1,024 and cannot be raised.
//!
//! axum's `serve` exposes none of these, so the service accepts and serves
//! each connection with hyper's HTTP/1 server itself (the one `serve` uses).

use std::{
    collections::HashMap,
    future::Future,
    io,
    pin::Pin,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    task::{Context, Poll},
    time::{Duration, Instant},
};

use axum::Router;
use hyper::{body::Incoming, server::conn::http1, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    sync::{Notify, watch},
    task::JoinSet,
};
use tower::ServiceExt;

use crate::config::ServerConfig;

/// File descriptors kept for what is not a caller's connection: the
/// database pool, the cache, the broker, logs.
const RESERVE: u64 = 128;

/// The bounds of [`serve`], from `[server]`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_connections: usize,
    pub shutdown_grace: Duration,
}

impl Limits {
    /// The configured bounds, the connection cap kept below `file_limit`
    /// (the open-files soft limit in force, if known).
    pub fn of(server: &ServerConfig, file_limit: Option<u64>) -> Self {
        let below_files = file_limit.map_or(usize::MAX, |n| n.saturating_sub(RESERVE) as usize);
        Self {
            header_read_timeout: Duration::from_millis(server.header_read_timeout_ms),
            idle_timeout: Duration::from_millis(server.idle_timeout_ms),
            max_connections: server.max_connections.min(below_files).max(16),
            shutdown_grace: Duration::from_millis(server.shutdown_grace_ms),
        }
    }
}

/// Raises the open-files soft limit to the hard one; the soft limit in
/// force afterwards (`None`: unlimited).
pub(crate) fn raise_file_limit() -> Option<u64> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        let raised = rustix::process::Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        match setrlimit(Resource::Nofile, raised) {
            Ok(()) => return limit.maximum,
            Err(e) => tracing::warn!(error = %e, "cannot raise the open-files limit"),
        }
    }
    limit.current
}

/// What a connection has done, for the idle timeout and for eviction.
struct Activity {
    bytes: AtomicU64,
    /// Bytes written to the client: what a stream's backlog is measured by.
    written: AtomicU64,
    /// Milliseconds since `epoch` of the last byte read or answer sent.
    last: AtomicU64,
    in_flight: AtomicUsize,
    close: Notify,
    epoch: Instant,
}

impl Activity {
    fn new(epoch: Instant) -> Self {
        let activity = Self {
            bytes: AtomicU64::new(0),
            written: AtomicU64::new(0),
            last: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            close: Notify::new(),
            epoch,
        };
        activity.touch();
        activity
    }

    fn touch(&self) {
        let now = self.epoch.elapsed().as_millis() as u64;
        self.last.store(now, Ordering::Relaxed);
    }

    fn idle_for(&self) -> Duration {
        let now = self.epoch.elapsed().as_millis() as u64;
        Duration::from_millis(now.saturating_sub(self.last.load(Ordering::Relaxed)))
    }

    fn busy(&self) -> bool {
        self.in_flight.load(Ordering::Relaxed) > 0
    }
}

/// The open connections.
#[derive(Default)]
struct Registry {
    open: Mutex<HashMap<u64, Arc<Activity>>>,
    next: AtomicU64,
}

impl Registry {
    fn open(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Activity>>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn add(&self, epoch: Instant) -> (u64, Arc<Activity>) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let activity = Arc::new(Activity::new(epoch));
        self.open().insert(id, activity.clone());
        (id, activity)
    }

    fn remove(&self, id: u64) {
        self.open().remove(&id);
    }

    fn len(&self) -> usize {
        self.open().len()
    }

    /// Closes the connection with no request in flight that has been silent
    /// the longest (the one that sent the least among equals): an idle or
    /// half-sent connection goes before a new one, whose first bytes have
    /// not arrived yet but whose silence has only just begun. `false` if
    /// every connection is serving a request.
    fn evict_one(&self) -> bool {
        let mut open = self.open();
        let victim = open
            .iter()
            .filter(|(_, a)| !a.busy())
            .min_by_key(|(_, a)| {
                (
                    a.last.load(Ordering::Relaxed),
                    a.bytes.load(Ordering::Relaxed),
                )
            })
            .map(|(id, _)| *id);
        match victim.and_then(|id| open.remove(&id)) {
            Some(activity) => {
                activity.close.notify_one();
                metrics::counter!(crate::metrics::CONNECTIONS_EVICTED).increment(1);
                true
            }
            None => false,
        }
    }
}

/// Serves `router` on `listener` until `shutdown` completes; then stops
/// accepting, lets requests in flight finish for at most
/// `limits.shutdown_grace`, and returns once every connection is closed.
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let registry = Arc::new(Registry::default());
    let epoch = Instant::now();
    let (stop, stopping) = watch::channel(false);
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors (or a connection reset before
                    // it was accepted): make room, pause, go on.
                    tracing::warn!(error = %e, "accept failed; closing the idlest connection");
                    registry.evict_one();
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        while registry.len() >= limits.max_connections && registry.evict_one() {}
        if registry.len() >= limits.max_connections {
            // Every connection is serving a request: this one waits its turn
            // as a refused connection, the cheapest answer there is.
            metrics::counter!(crate::metrics::CONNECTIONS_REFUSED).increment(1);
            continue;
        }
        let (id, activity) = registry.add(epoch);
        let registry = registry.clone();
        let (router, stopping) = (router.clone(), stopping.clone());
        connections.spawn(async move {
            connection(stream, router, activity.clone(), limits, stopping).await;
            registry.remove(id);
        });
        while connections.try_join_next().is_some() {}
        metrics::gauge!(crate::metrics::CONNECTIONS_OPEN).set(connections.len() as f64);
    }
    drop(listener);
    let _ = stop.send(true);
    while connections.join_next().await.is_some() {}
    Ok(())
}

/// One connection, served until it closes, is idle too long, is evicted,
/// or the service stops.
async fn connection(
    stream: TcpStream,
    router: Router,
    activity: Arc<Activity>,
    limits: Limits,
    mut stopping: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let io = TokioIo::new(Counted {
        inner: stream,
        activity: activity.clone(),
    });
    let requests = activity.clone();
    let service = service_fn(move |mut request: hyper::Request<Incoming>| {
        let flight = InFlight::start(requests.clone());
        request
            .extensions_mut()
            .insert(Connection(requests.clone()));
        let answer = router.clone().oneshot(request);
        async move {
            let response = answer.await;
            drop(flight);
            response
        }
    });
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(true);
    let served = http.serve_connection(io, service);
    tokio::pin!(served);
    let mut tick = tokio::time::interval((limits.idle_timeout / 4).max(Duration::from_millis(50)));
    loop {
        tokio::select! {
            result = served.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "connection closed");
                }
                return;
            }
            () = activity.close.notified() => return,
            _ = tick.tick() => {
                if !activity.busy() && activity.idle_for() >= limits.idle_timeout {
                    return;
                }
            }
            _ = stopping.changed() => {
                served.as_mut().graceful_shutdown();
                let _ = tokio::time::timeout(limits.shutdown_grace, served.as_mut()).await;
                return;
            }
        }
    }
}

/// A request being served on a connection, counted while its handler runs
/// (also when hyper drops the handler because the client went away).
struct InFlight(Arc<Activity>);

impl InFlight {
    fn start(activity: Arc<Activity>) -> Self {
        activity.in_flight.fetch_add(1, Ordering::Relaxed);
        activity.touch();
        Self(activity)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.0.touch();
    }
}

/// The connection a request came on, in the request's extensions: what a
/// response that streams (`counts:watch`) needs of it. Absent when the
/// router is served some other way (a test's `oneshot`).
#[derive(Clone)]
pub(crate) struct Connection(Arc<Activity>);

impl Connection {
    /// Keeps the connection counted busy (never closed as idle, never
    /// evicted) for as long as the guard lives: a stream's body is sent
    /// after its handler returned.
    pub fn streaming(&self) -> Streaming {
        Streaming {
            _busy: InFlight::start(self.0.clone()),
        }
    }

    /// Bytes written to the client so far.
    pub fn written(&self) -> u64 {
        self.0.written.load(Ordering::Relaxed)
    }

    /// Closes the connection now, whatever it is sending: a client that
    /// stopped reading cannot be told anything more, and what hyper holds
    /// for it is freed.
    pub fn close(&self) {
        self.0.close.notify_one();
    }
}

/// See [`Connection::streaming`].
pub(crate) struct Streaming {
    _busy: InFlight,
}

/// A TCP stream that counts what the client sends and what it is sent.
struct Counted {
    inner: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        let read = buf.filled().len() - before;
        if read > 0 {
            self.activity
                .bytes
                .fetch_add(read as u64, Ordering::Relaxed);
            self.activity.touch();
        }
        polled
    }
}

impl Counted {
    fn wrote(&self, polled: Poll<io::Result<usize>>) -> Poll<io::Result<usize>> {
        if let Poll::Ready(Ok(n)) = polled {
            self.activity.written.fetch_add(n as u64, Ordering::Relaxed);
        }
        polled
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.wrote(polled)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.wrote(polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

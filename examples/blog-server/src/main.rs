//! The blog server binary: `cargo run -p blog-server`, then
//! `curl -X POST localhost:3000/posts/1/likes` and `curl localhost:3000/posts`;
//! comments with `curl -X POST localhost:3000/posts/1/comments -H 'content-type:
//! application/json' -d '{"author_id": 1, "body": "Nice"}'` and
//! `curl -X DELETE localhost:3000/comments/1`; rankings and charts with
//! `curl 'localhost:3000/posts/most-liked?limit=3'` (then the `next` it
//! returns: `&after_likes=..&after_id=..`) and
//! `curl 'localhost:3000/posts/1/views/daily?days=7'`.
//!
//! * `DATABASE_URL`: an SQLite file, PostgreSQL or MySQL/MariaDB URL
//!   (default `sqlite://blog.db?mode=rwc`, a file created on first run).
//! * `BIND`: the address to listen on (default `127.0.0.1:3000`).
//! * `REDIS_URL` (optional, e.g. `redis://127.0.0.1:6379`): counts are read
//!   through a shared Redis cache (`counter-redis`, namespace `blog`);
//!   every write still goes to the database and deletes the post's cached
//!   counts after its commit. A Redis that is down only makes reads fall
//!   back to the database.
//!
//! It migrates the database, adds a few posts if there are none (so the
//! endpoints have something to count right away), and serves until ctrl-c
//! or SIGTERM, letting requests in flight finish.

use std::process::ExitCode;

use blog_server::CountReader;
use counter_redis::{CountCache, RedisTarget};
use sea_orm::{ConnectOptions, Database};
use tokio::net::TcpListener;

/// Used when `DATABASE_URL` is not set: an SQLite file beside the binary's
/// working directory, created if missing.
const DEFAULT_DATABASE_URL: &str = "sqlite://blog.db?mode=rwc";
/// Used when `BIND` is not set: loopback only, so trying the example does
/// not open a port to the network.
const DEFAULT_BIND: &str = "127.0.0.1:3000";
#[tokio::main]
async fn main() -> ExitCode {
    // Without a subscriber, the library's warnings (the causes of 503s)
    // would go nowhere. `try_init`: an error here must not be a panic.
    let _ = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .try_init();
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("blog-server: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), String> {
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_DATABASE_URL.into());
    let bind = std::env::var("BIND").unwrap_or_else(|_| DEFAULT_BIND.into());

    // The URL may hold a password: error messages name the variable instead.
    // sqlx would log every statement at INFO, burying the server's own lines.
    let mut options = ConnectOptions::new(url);
    options.sqlx_logging(false);
    let db = Database::connect(options)
        .await
        .map_err(|e| format!("cannot connect to DATABASE_URL: {e}"))?;
    let seeded = blog_server::prepare(&db)
        .await
        .map_err(|e| format!("cannot migrate the database or add the first posts: {e}"))?;
    if seeded > 0 {
        tracing::info!("added {seeded} posts to an empty database");
    }

    let listener = TcpListener::bind(&bind)
        .await
        .map_err(|e| format!("cannot listen on {bind}: {e}"))?;
    let address = listener
        .local_addr()
        .map_err(|e| format!("cannot read the listening address: {e}"))?;
    tracing::info!(
        "serving on http://{address} ({:?}); ctrl-c stops",
        db.get_database_backend()
    );
    let reader = match std::env::var("REDIS_URL") {
        Ok(redis) if !redis.is_empty() => {
            let cache = CountCache::builder(RedisTarget::standalone(redis))
                .namespace("blog")
                .build()
                .await
                .map_err(|e| format!("cannot set up the cache on REDIS_URL: {e}"))?;
            tracing::info!("counts are read through the Redis cache (REDIS_URL)");
            CountReader::cached(&cache)
        }
        _ => CountReader::Database,
    };
    axum::serve(listener, blog_server::router_with(db.clone(), reader))
        .with_graceful_shutdown(shutdown_signal())
        .await
        .map_err(|e| format!("server error: {e}"))?;

    tracing::info!("stopped");
    db.close()
        .await
        .map_err(|e| format!("cannot close the database pool: {e}"))
}

/// Resolves on ctrl-c, or SIGTERM on Unix (what `docker stop` and systemd
/// send). A signal that cannot be listened for is logged and never fires,
/// rather than stopping the server at once.
async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::warn!("cannot listen for ctrl-c: {e}");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut sigterm) => {
                sigterm.recv().await;
            }
            Err(e) => {
                tracing::warn!("cannot listen for SIGTERM: {e}");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
    tracing::info!("shutting down: finishing the requests in flight");
}

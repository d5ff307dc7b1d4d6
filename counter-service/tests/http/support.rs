//! The service under test: in process (its router on a loopback port) or
//! as the real binary, on the test's backend, and an HTTP client for it.

use std::{
    path::PathBuf,
    process::Stdio,
    sync::atomic::{AtomicU32, Ordering},
    time::Duration,
};

use counter_service::{Config, Service};
use counter_tests::{Backend, TestDb};
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, body::Bytes, header::CONTENT_TYPE};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use sea_orm::ConnectionTrait;
use serde_json::Value;
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    net::TcpListener,
    process::{Child, Command},
    sync::oneshot,
    task::JoinHandle,
};

/// Longer than any request here should take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// The namespaces every test serves: one per owner type.
pub const NAMESPACES: &str = r#"
[namespaces.posts]
table = "post_counters"
owner = "integer"
key_patterns = ["reaction:*"]

[namespaces.posts.keys.likes]
[namespaces.posts.keys.views]
window = "day"
[namespaces.posts.keys.comments.check]
table = "comments"
via = "post_id"
[namespaces.posts.keys.viewers]
unique = true
window = "day"

[namespaces.users]
table = "user_counters"
owner = "uuid"
keys.followers = {}

[namespaces.tags]
table = "tag_counters"
owner = "string"
keys.uses = { slots = "adaptive" }
keys.visitors = { unique = true }
"#;

/// The tokens of the auth tests.
pub const TOKENS: &str = r#"
[[tokens]]
name = "writer"
secret = "writer-secret-0123456789"
scopes = ["read", "write"]

[[tokens]]
name = "reader"
secret = "reader-secret-0123456789"
scopes = ["read"]

[[tokens]]
name = "admin"
secret = "admin-secret-0123456789"
scopes = ["read", "write", "admin"]

[[tokens]]
name = "posts-only"
secret = "posts-only-secret-0123456789"
scopes = ["read", "write"]
namespaces = ["posts"]

[[tokens]]
name = "slow"
secret = "slow-secret-0123456789"
scopes = ["read"]
rate_per_second = 1
burst = 2
"#;

pub const WRITER: &str = "writer-secret-0123456789";
pub const READER: &str = "reader-secret-0123456789";
pub const ADMIN: &str = "admin-secret-0123456789";
pub const POSTS_ONLY: &str = "posts-only-secret-0123456789";
pub const SLOW: &str = "slow-secret-0123456789";

/// The `[database]` section that points the service at `t`'s scratch
/// space: a file for SQLite (removed by [`Scratch`]'s drop), the scratch
/// schema on PostgreSQL, the scratch database on MySQL.
pub struct Scratch {
    pub database: String,
    file: Option<PathBuf>,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Some(file) = &self.file {
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
            }
        }
    }
}

impl Scratch {
    /// The test's database for the service, with the business table that
    /// [`NAMESPACES`]' checked key reads (`comments`, empty), as an app
    /// that configures a check has it.
    pub async fn of(t: &TestDb) -> Self {
        let scratch = Self::bare(t);
        let db = scratch.connect(t).await;
        db.execute_unprepared(
            "CREATE TABLE IF NOT EXISTS comments (id BIGINT PRIMARY KEY, post_id BIGINT NOT NULL)",
        )
        .await
        .unwrap();
        scratch
    }

    fn bare(t: &TestDb) -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        match t.backend {
            Backend::Sqlite => {
                let file = std::env::temp_dir().join(format!(
                    "counter-service-{}-{}-{}.db",
                    t.label(),
                    std::process::id(),
                    NEXT.fetch_add(1, Ordering::Relaxed)
                ));
                Self {
                    database: format!(
                        "[database]\nurl = \"sqlite://{}?mode=rwc\"\n",
                        file.display()
                    ),
                    file: Some(file),
                }
            }
            // A schema of its own, or (through a transaction pooler, which
            // keeps no session's search_path) a database of its own.
            Backend::Postgres => Self {
                database: match t.schema() {
                    Some(schema) => format!(
                        "[database]\nurl = \"{}\"\nschema = \"{schema}\"\n",
                        t.url().unwrap()
                    ),
                    None => format!(
                        "[database]\nurl = \"{}\"\npooler = \"transaction\"\n",
                        t.url().unwrap()
                    ),
                },
                file: None,
            },
            Backend::MySql => Self {
                database: format!("[database]\nurl = \"{}\"\n", t.url().unwrap()),
                file: None,
            },
        }
    }

    /// A connection of the test's own to the service's database (the SQLite
    /// file; `t.db` elsewhere).
    pub async fn connect(&self, t: &TestDb) -> sea_orm::DatabaseConnection {
        match &self.file {
            Some(file) => {
                sea_orm::Database::connect(format!("sqlite://{}?mode=rwc", file.display()))
                    .await
                    .unwrap()
            }
            None => t.db.clone(),
        }
    }
}

/// The `[cache]` section that puts `t`'s Redis namespace in front of the
/// service, or `None` when no Redis is configured for the tests.
pub fn cache_section(t: &TestDb) -> Option<String> {
    let redis = counter_tests::redis::shared_url(t.backend, t.label())?;
    Some(format!(
        "[cache]\nredis_url = \"{redis}\"\nnamespace = \"{}\"\n",
        counter_tests::redis::namespace(t.backend, t.label())
    ))
}

/// The configuration of a test: `server` settings, the scratch database,
/// then `rest` (namespaces, tokens).
pub fn config_text(server: &str, scratch: &Scratch, rest: &str) -> String {
    format!("[server]\n{server}\n{}\n{rest}", scratch.database)
}

/// The service in this process, on a free loopback port.
pub struct Running {
    pub api: Api,
    /// The same service's write path in process.
    pub local: counter_service::Local,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
}

impl std::ops::Deref for Running {
    type Target = Api;

    fn deref(&self) -> &Api {
        &self.api
    }
}

impl Running {
    /// Migrates, starts and serves `text`.
    pub async fn start(text: &str) -> Running {
        let config = Config::from_text(text, "the test's configuration", std::iter::empty(), &[])
            .unwrap_or_else(|e| panic!("{e}"));
        Service::migrate(&config)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        Self::serve(config).await
    }

    /// Starts and serves `config`, migrated already.
    pub async fn serve(config: Config) -> Running {
        let service = Service::start(config)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let local = service.local();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(service.serve(listener, async move {
            let _ = stopped.await;
        }));
        Running {
            api: Api::new(base),
            local,
            stop: Some(stop),
            task,
        }
    }

    /// Shuts down gracefully and waits for it, after checking that nothing
    /// the test sent took the service down.
    pub async fn stop(mut self) {
        assert!(!self.task.is_finished(), "the service stopped by itself");
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(Duration::from_secs(60), &mut self.task)
            .await
            .expect("a graceful shutdown within 60 s")
            .unwrap()
            .unwrap();
    }
}

/// A client of a service at `base`; cheap to clone.
#[derive(Clone)]
pub struct Api {
    pub base: String,
    client: Client<HttpConnector, Full<Bytes>>,
}

/// An answer.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: hyper::HeaderMap,
    pub text: String,
    pub json: Value,
}

impl Reply {
    /// The header `name`, if any, as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Asserts a problem+json answer with `status` and `kind`.
    #[track_caller]
    pub fn assert_problem(&self, status: u16, kind: &str) {
        assert_eq!(
            (self.status, self.header("content-type")),
            (status, Some("application/problem+json")),
            "{self:?}"
        );
        assert_eq!(self.json["status"], status, "{self:?}");
        assert_eq!(self.json["kind"], kind, "{self:?}");
        assert!(
            self.json["type"]
                .as_str()
                .is_some_and(|t| t.starts_with("urn:counter-service:problem:")),
            "{self:?}"
        );
        assert!(
            self.json["detail"].as_str().is_some_and(|d| !d.is_empty()),
            "{self:?}"
        );
    }

    /// Asserts a 200 and returns the JSON.
    #[track_caller]
    pub fn ok(self) -> Value {
        assert_eq!(self.status, 200, "{self:?}");
        self.json
    }
}

impl Api {
    pub fn new(base: String) -> Self {
        Self {
            base,
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    /// The sum of the `/metrics` samples of `series`: a name (every
    /// labelled sample of it), or a name with its first labels
    /// (`name{bound="queue_wait"`).
    pub async fn metric(&self, series: &str) -> u64 {
        let text = self.get("/metrics", None).await.text;
        text.lines()
            .filter_map(|line| line.strip_prefix(series))
            .filter(|rest| series.contains('{') || rest.starts_with([' ', '{']))
            .filter_map(|rest| rest.split_whitespace().last()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    }

    /// `method path` with `token`, `headers` and a JSON `body`.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        headers: &[(&str, &str)],
        body: Option<String>,
    ) -> Reply {
        match self
            .try_call(method.clone(), path, token, headers, body)
            .await
        {
            Ok(reply) => reply,
            Err(e) => panic!("{method} {path}: {e}"),
        }
    }

    /// [`Api::call`], with a transport failure as an error (a killed
    /// service).
    pub async fn try_call(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        headers: &[(&str, &str)],
        body: Option<String>,
    ) -> Result<Reply, String> {
        let mut request = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        if body.is_some() {
            request = request.header(CONTENT_TYPE, "application/json");
        }
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request
            .body(Full::new(body.map(Bytes::from).unwrap_or_default()))
            .map_err(|e| e.to_string())?;
        let response = tokio::time::timeout(REQUEST_TIMEOUT, self.client.request(request))
            .await
            .map_err(|_| "no answer within 60 s".to_owned())?
            .map_err(|e| e.to_string())?;
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let json = serde_json::from_str(&text).unwrap_or(Value::Null);
        Ok(Reply {
            status,
            headers,
            text,
            json,
        })
    }

    /// `POST path` with a JSON body.
    pub async fn post(&self, path: &str, token: Option<&str>, body: Value) -> Reply {
        self.call(Method::POST, path, token, &[], Some(body.to_string()))
            .await
    }

    /// `POST path` with an Idempotency-Key.
    pub async fn post_keyed(
        &self,
        path: &str,
        token: Option<&str>,
        key: &str,
        body: Value,
    ) -> Reply {
        self.call(
            Method::POST,
            path,
            token,
            &[("idempotency-key", key)],
            Some(body.to_string()),
        )
        .await
    }

    /// `GET path`.
    pub async fn get(&self, path: &str, token: Option<&str>) -> Reply {
        self.call(Method::GET, path, token, &[], None).await
    }

    /// Starts the maintenance job `path` (`/v1/posts/admin:compact`),
    /// follows it until it ends, and returns its report; it must be done.
    pub async fn run_job(&self, path: &str, token: Option<&str>) -> Value {
        let started = self.call(Method::POST, path, token, &[], None).await;
        assert_eq!(started.status, 202, "{started:?}");
        let location = started
            .header("location")
            .expect("a job's address")
            .to_owned();
        assert_eq!(
            location,
            format!(
                "{}/admin/jobs/{}",
                path.split("/admin:").next().unwrap(),
                started.json["id"].as_str().unwrap()
            ),
            "{started:?}"
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(600);
        loop {
            let job = self.get(&location, token).await.ok();
            match job["state"].as_str() {
                Some("running") => {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "{path} still running after 600 s"
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Some("done") => return job["report"].clone(),
                _ => panic!("{path}: {job}"),
            }
        }
    }

    /// The totals of `owners` × `keys` in `ns`, through `POST counts:batchGet`.
    pub async fn totals(&self, ns: &str, token: Option<&str>, owners: Value, keys: Value) -> Value {
        self.post(
            &format!("/v1/{ns}/counts:batchGet"),
            token,
            serde_json::json!({"owners": owners, "keys": keys}),
        )
        .await
        .ok()["counts"]
            .clone()
    }
}

/// The binary the tests run: the debug build cargo made for them, or the
/// one `COUNTER_TEST_SERVICE_BIN` names (a release build, to measure what
/// production runs: the overload test's figures in RELIABILITY.md).
pub fn service_binary() -> std::path::PathBuf {
    std::env::var_os("COUNTER_TEST_SERVICE_BIN")
        .map(Into::into)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_counter-service").into())
}

/// The real binary, started on `config` (a file) and `port`; returns once
/// it prints its address.
pub async fn spawn_binary(config: &std::path::Path, port: u16) -> Child {
    let mut command = Command::new(service_binary());
    command.args([
        "--config",
        config.to_str().unwrap(),
        "--listen",
        &format!("127.0.0.1:{port}"),
        "serve",
        "--migrate",
    ]);
    start_command(command, "the binary").await
}

/// Starts `command` (the binary, or a shell that `exec`s it) with warnings
/// logged; returns once it prints its address, and keeps reading its
/// output so that it never blocks on a full pipe. `what` names it in the
/// failure.
pub async fn start_command(mut command: Command, what: &str) -> Child {
    let mut child = command
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the counter-service binary");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let started = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.starts_with("counter-service listening on") {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(started, Ok(true), "{what} did not start");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    child
}

//! The `blog-server` example over real HTTP, on every configured backend: a
//! TCP listener on a free port, `axum::serve`, and hyper's client.

use std::{collections::HashSet, sync::Arc, time::Duration};

use blog_migration::Migrator;
use blog_server::{
    CountReader, DEFAULT_DAILY_DAYS, DEFAULT_MOST_LIKED, MAX_COMMENT_CHARS, MAX_DAILY_DAYS,
    MAX_MOST_LIKED, MAX_PAGE, PAGE_SIZE,
};
use chrono::{DateTime, Datelike, TimeDelta, Utc};
use counter_core::{SlottedCounter, Window};
use counter_tests::{TestDb, backend_test, sql};
use entity::{
    comment,
    post::{self, counters::Key},
};
use http_body_util::{BodyExt, Full};
use hyper::{
    HeaderMap, Method, Request, StatusCode,
    body::Bytes,
    header::{ALLOW, CONTENT_TYPE, LOCATION, RETRY_AFTER},
};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, EntityTrait, PaginatorTrait, QueryFilter, QueryOrder, Set,
};
use serde_json::{Value, json};
use tokio::{net::TcpListener, sync::Barrier, task::JoinHandle};

/// Longer than any request here should take: a hang fails the test instead
/// of stalling it.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// The HTTP client of the tests: plain HTTP.
type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// A request body, if any: its content type (if any) and text.
type Body<'a> = Option<(Option<&'a str>, &'a str)>;

/// A client of the blog server at `base`: cheap to clone, so that
/// concurrent requests each get one in a task of their own.
#[derive(Clone)]
struct Api {
    base: String,
    client: HttpClient,
    backend: counter_tests::Backend,
}

/// The blog server on a free local port, and a client for it (its methods
/// are [`Api`]'s).
struct Server {
    api: Api,
    task: JoinHandle<()>,
}

impl std::ops::Deref for Server {
    type Target = Api;

    fn deref(&self) -> &Api {
        &self.api
    }
}

/// A response: status, headers and the JSON body.
struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Value,
}

/// A JSON request body.
fn json_text(text: &str) -> Body<'_> {
    Some((Some("application/json"), text))
}

impl Server {
    /// Serves `blog_server::router` on the test's database.
    async fn start(t: &TestDb) -> Server {
        Self::start_with(t, CountReader::Database).await
    }

    /// Serves `blog_server::router_with(reader)` on the test's database.
    async fn start_with(t: &TestDb, reader: CountReader) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let router = blog_server::router_with(t.db.clone(), reader);
        let task = tokio::spawn(async move {
            axum::serve(listener, router).await.unwrap();
        });
        Server {
            api: Api {
                base,
                client: Client::builder(TokioExecutor::new()).build_http(),
                backend: t.backend,
            },
            task,
        }
    }

    /// Stops the server, after checking that it is still running: nothing
    /// the test sent took it down.
    async fn stop(self) {
        assert!(
            !self.task.is_finished(),
            "[{}] the server stopped",
            self.backend
        );
        self.task.abort();
        let _ = self.task.await;
    }
}

impl Api {
    /// Status and JSON body of `method path`, with `body` if any.
    async fn request(&self, method: Method, path: &str, body: Body<'_>) -> (StatusCode, Value) {
        let reply = self.send(method, path, body).await;
        (reply.status, reply.body)
    }

    /// The whole reply to `method path`, with `body` if any. Every response
    /// of the server with a body, errors included, must be JSON: a
    /// plain-text rejection fails here.
    async fn send(&self, method: Method, path: &str, body: Body<'_>) -> Reply {
        let (what, status, headers, bytes) = self.call(method, path, body).await;
        assert_eq!(
            headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()),
            Some("application/json"),
            "{what}: {status} {:?}",
            String::from_utf8_lossy(&bytes)
        );
        Reply {
            status,
            headers,
            body: json_body(&bytes, &what),
        }
    }

    /// `GET path`, which must be a 200; returns the body.
    async fn get_ok(&self, path: &str) -> Value {
        let (status, body) = self.request(Method::GET, path, None).await;
        assert_eq!(
            status,
            StatusCode::OK,
            "[{}] GET {path}: {body}",
            self.backend
        );
        body
    }

    /// `GET /posts/{id}` must be a 200 with the post's title and `counts`
    /// (see [`counts`]).
    async fn assert_post(&self, id: i64, title: &str, counts: Value) {
        let path = format!("/posts/{id}");
        assert_eq!(
            self.get_ok(&path).await,
            json!({"id": id, "title": title, "counts": counts}),
            "[{}] GET {path}",
            self.backend
        );
    }

    /// Checks the error shape, `{"error": {"status", "message"}}` and nothing
    /// else, with the status repeated in the body; returns the message.
    async fn expect_error(
        &self,
        method: Method,
        path: &str,
        body: Body<'_>,
        status: StatusCode,
    ) -> String {
        self.error_reply(method, path, body, status).await.1
    }

    /// [`Api::expect_error`], and the message must be `message`.
    async fn expect_message(
        &self,
        method: Method,
        path: &str,
        body: Body<'_>,
        status: StatusCode,
        message: &str,
    ) {
        let what = format!("[{}] {method} {path}", self.backend);
        let got = self.expect_error(method, path, body, status).await;
        assert_eq!(got, message, "{what}");
    }

    /// `method path` on a route that takes other methods: a 405 in the
    /// error shape, naming the method and the path, with the methods the
    /// route does take in `Allow`.
    async fn expect_405(&self, method: Method, path: &str, allow: &str) {
        let what = format!("[{}] {method} {path}", self.backend);
        let (reply, message) = self
            .error_reply(method.clone(), path, None, StatusCode::METHOD_NOT_ALLOWED)
            .await;
        assert_eq!(
            message,
            format!("{method} is not allowed on {path}"),
            "{what}"
        );
        assert_eq!(
            reply.headers.get(ALLOW).and_then(|v| v.to_str().ok()),
            Some(allow),
            "{what}"
        );
    }

    /// The reply of [`Api::expect_error`], and its message.
    async fn error_reply(
        &self,
        method: Method,
        path: &str,
        body: Body<'_>,
        status: StatusCode,
    ) -> (Reply, String) {
        let what = format!("[{}] {method} {path}", self.backend);
        let reply = self.send(method, path, body).await;
        assert_eq!(reply.status, status, "{what}: {}", reply.body);
        let message = reply.body["error"]["message"]
            .as_str()
            .unwrap_or_else(|| panic!("{what}: no message in {}", reply.body))
            .to_owned();
        assert_eq!(
            reply.body,
            json!({"error": {"status": status.as_u16(), "message": message}}),
            "{what}"
        );
        (reply, message)
    }

    /// Sends `method path` (with `body`, if any) and collects the whole
    /// answer, with the request's description for messages. A hang or a
    /// dropped connection fails the test.
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Body<'_>,
    ) -> (String, StatusCode, HeaderMap, Bytes) {
        let what = format!("[{}] {method} {path}", self.backend);
        let mut request = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        if let Some((Some(content_type), _)) = body {
            request = request.header(CONTENT_TYPE, content_type);
        }
        let bytes = body.map_or_else(Bytes::new, |(_, text)| Bytes::from(text.to_owned()));
        let request = request.body(Full::new(bytes)).unwrap();
        let response = tokio::time::timeout(REQUEST_TIMEOUT, self.client.request(request))
            .await
            .unwrap_or_else(|_| panic!("{what}: no answer"))
            // A handler that panicked would drop the connection: an error here.
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let (parts, body) = response.into_parts();
        let bytes = body.collect().await.unwrap().to_bytes();
        (what, parts.status, parts.headers, bytes)
    }
}

/// A body parsed as JSON; anything else fails the test, naming `what`.
fn json_body(bytes: &Bytes, what: &str) -> Value {
    serde_json::from_slice(bytes).unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {bytes:?}"))
}

/// Migrates the test's database and adds `n` posts titled `post 1`, ...;
/// returns their ids in order.
async fn blog_with_posts(t: &TestDb, n: usize) -> Vec<i64> {
    sql::migrate_up::<Migrator>(&t.db).await.unwrap();
    let mut ids = Vec::with_capacity(n);
    for i in 1..=n {
        let post = post::ActiveModel {
            title: Set(format!("post {i}")),
            ..Default::default()
        }
        .insert(&t.sql())
        .await
        .unwrap();
        ids.push(post.id);
    }
    ids
}

fn counts(likes: i64, comments: i64, views: i64) -> Value {
    json!({"likes": likes, "comments": comments, "views": views})
}

backend_test! {
    /// What the binary runs at start, on a new database and again on the
    /// same one (a restart): the schema, then the first posts once. Through
    /// PgBouncer in transaction pooling (CI's lane) it runs in one
    /// transaction; it failed there before.
    #[tokio::test(flavor = "multi_thread")]
    #[label = "blog_server_prepare"]
    async fn the_binarys_start_migrates_and_seeds_once(t: TestDb) {
        let b = t.backend;
        assert_eq!(blog_server::prepare(&t.db).await.unwrap(), blog_server::SEED_TITLES.len(), "[{b}]");
        assert_eq!(blog_server::prepare(&t.db).await.unwrap(), 0, "[{b}] a restart adds nothing");
        let posts = post::Entity::find()
            .order_by_asc(post::Column::Id)
            .all(&t.sql())
            .await
            .unwrap();
        let titles: Vec<&str> = posts.iter().map(|p| p.title.as_str()).collect();
        assert_eq!(titles, blog_server::SEED_TITLES, "[{b}]");
        let server = Server::start(&t).await;
        server.assert_post(posts[0].id, "Hello, world", counts(0, 0, 0)).await;
        server.stop().await;
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "blog_server_round_trip"]
    async fn likes_and_views_round_trip(t: TestDb) {
        let ids = blog_with_posts(&t, 2).await;
        let (a, b) = (ids[0], ids[1]);
        let server = Server::start(&t).await;
        let likes = format!("/posts/{a}/likes");

        for expected in [1, 2] {
            assert_eq!(
                server.request(Method::POST, &likes, None).await,
                (
                    StatusCode::OK,
                    json!({"id": a, "counts": counts(expected, 0, 0)})
                ),
                "[{}]",
                t.backend
            );
        }
        assert_eq!(
            server.request(Method::DELETE, &likes, None).await,
            (StatusCode::OK, json!({"id": a, "counts": counts(1, 0, 0)})),
            "[{}]",
            t.backend
        );
        assert_eq!(
            server
                .request(Method::POST, &format!("/posts/{a}/views"), None)
                .await,
            (StatusCode::OK, json!({"id": a, "counts": counts(1, 0, 1)})),
            "[{}]",
            t.backend
        );

        server.assert_post(a, "post 1", counts(1, 0, 1)).await;
        // The other post is untouched.
        server.assert_post(b, "post 2", counts(0, 0, 0)).await;
        // What the server wrote is what the library reads.
        let stored = post::Entity::counters().counts(&t.db, a).await.unwrap();
        assert_eq!(
            (stored.likes, stored.comments, stored.views),
            (1, 0, 1),
            "[{}]",
            t.backend
        );

        server.stop().await;
        t.finish().await;
    }
}

backend_test! {
    /// With `REDIS_URL` the binary reads counts through the cache: every
    /// answer after a write shows it, and repeated reads are Redis hits.
    #[tokio::test(flavor = "multi_thread")]
    #[label = "blog_server_cached"]
    async fn counts_are_served_through_the_redis_cache(t: TestDb) {
        let Some(cache) = counter_tests::redis::shared_cache(t.backend, t.label()).await else {
            return;
        };
        let ids = blog_with_posts(&t, 3).await;
        let a = ids[0];
        let server = Server::start_with(&t, CountReader::cached(&cache)).await;
        server.get_ok("/posts").await;
        for expected in [1, 2] {
            let (status, body) = server.request(Method::POST, &format!("/posts/{a}/likes"), None).await;
            assert_eq!((status, body), (StatusCode::OK, json!({"id": a, "counts": counts(expected, 0, 0)})));
        }
        server.request(Method::POST, &format!("/posts/{a}/views"), None).await;
        let (comment, comments) = server.comment(a, 1, "cached?").await;
        assert_eq!(comments, 1, "[{}] the comment's own answer", t.backend);
        assert_eq!(server.delete_comment(comment).await, StatusCode::NO_CONTENT);
        server.assert_post(a, "post 1", counts(2, 0, 1)).await;
        let page = server.get_ok("/posts").await;
        for post in page["posts"].as_array().unwrap() {
            let id = post["id"].as_i64().unwrap();
            let stored = post::Entity::counters().counts(&t.db, id).await.unwrap();
            assert_eq!(post["counts"], counts(stored.likes, stored.comments, stored.views), "[{}]", t.backend);
        }
        let stats = cache.stats();
        assert!(stats.hits > 0 && stats.fills > 0, "[{}] {stats:?}", t.backend);
        server.stop().await;
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[label = "blog_server_concurrent_likes"]
    async fn concurrent_likes_are_all_counted(t: TestDb) {
        const REQUESTS: i64 = 32;
        let id = blog_with_posts(&t, 1).await[0];
        let server = Server::start(&t).await;
        let path = format!("/posts/{id}/likes");

        // 32 requests in flight at once, each on a connection of its own.
        let requests: Vec<_> = (0..REQUESTS)
            .map(|_| {
                let (api, path) = (server.api.clone(), path.clone());
                tokio::spawn(async move { api.request(Method::POST, &path, None).await })
            })
            .collect();
        let mut seen = Vec::new();
        for request in requests {
            let (status, body) = request.await.unwrap();
            assert_eq!(status, StatusCode::OK, "[{}] {body}", t.backend);
            // The counts read back include the others' likes: at least ours.
            let likes = body["counts"]["likes"].as_i64().unwrap();
            assert!((1..=REQUESTS).contains(&likes), "[{}] {body}", t.backend);
            seen.push(likes);
        }
        // The last read started after every write had committed.
        assert_eq!(
            seen.iter().max(),
            Some(&REQUESTS),
            "[{}] {seen:?}",
            t.backend
        );

        server
            .assert_post(id, "post 1", counts(REQUESTS, 0, 0))
            .await;
        server.stop().await;
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "blog_server_pages"]
    async fn pages_list_posts_with_their_counts(t: TestDb) {
        // A full page and a partial one.
        let n = usize::try_from(PAGE_SIZE).unwrap() + 5;
        let ids = blog_with_posts(&t, n).await;
        // Post number i (from 1) has i likes, 2i views and i % 3 comments.
        let deltas = ids.iter().zip(1i64..).flat_map(|(&id, i)| {
            [
                (id, Key::Likes, i),
                (id, Key::Views, 2 * i),
                (id, Key::Comments, i % 3),
            ]
        });
        post::Entity::counters()
            .add_many(&t.db, deltas.collect::<Vec<_>>())
            .await
            .unwrap();
        let expected = |range: std::ops::Range<usize>| -> Vec<Value> {
            range
                .map(|index| {
                    let i = i64::try_from(index).unwrap() + 1;
                    json!({
                        "id": ids[index],
                        "title": format!("post {i}"),
                        "counts": counts(i, i % 3, 2 * i),
                    })
                })
                .collect()
        };
        let server = Server::start(&t).await;
        let page_size = usize::try_from(PAGE_SIZE).unwrap();

        let first = json!({"page": 1, "posts": expected(0..page_size)});
        assert_eq!(
            server.request(Method::GET, "/posts?page=1", None).await,
            (StatusCode::OK, first.clone()),
            "[{}]",
            t.backend
        );
        // No page is page 1; other parameters are ignored.
        for path in ["/posts", "/posts?sort=whatever"] {
            assert_eq!(
                server.request(Method::GET, path, None).await,
                (StatusCode::OK, first.clone()),
                "[{}] {path}",
                t.backend
            );
        }
        assert_eq!(
            server.request(Method::GET, "/posts?page=2", None).await,
            (
                StatusCode::OK,
                json!({"page": 2, "posts": expected(page_size..n)})
            ),
            "[{}]",
            t.backend
        );

        // A like over HTTP shows on the page.
        let liked = ids[3];
        let (status, _) = server
            .request(Method::POST, &format!("/posts/{liked}/likes"), None)
            .await;
        assert_eq!(status, StatusCode::OK, "[{}]", t.backend);
        let (_, page) = server.request(Method::GET, "/posts?page=1", None).await;
        assert_eq!(page["posts"][3]["id"], json!(liked), "[{}]", t.backend);
        assert_eq!(
            page["posts"][3]["counts"],
            counts(5, 1, 8),
            "[{}]",
            t.backend
        );

        // Past the end: an empty page, up to the largest page accepted,
        // whose offset is close to i64::MAX on every backend.
        for page in [3, 999, MAX_PAGE] {
            assert_eq!(
                server
                    .request(Method::GET, &format!("/posts?page={page}"), None)
                    .await,
                (StatusCode::OK, json!({"page": page, "posts": []})),
                "[{}]",
                t.backend
            );
        }

        server.stop().await;
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "blog_server_not_found"]
    async fn unknown_posts_and_routes_are_404(t: TestDb) {
        let id = blog_with_posts(&t, 1).await[0];
        let missing = id + 1000;
        let not_found = format!("post {missing} does not exist");
        let server = Server::start(&t).await;

        for (method, path) in [
            (Method::GET, format!("/posts/{missing}")),
            (Method::POST, format!("/posts/{missing}/likes")),
            (Method::DELETE, format!("/posts/{missing}/likes")),
            (Method::POST, format!("/posts/{missing}/views")),
        ] {
            server
                .expect_message(method, &path, None, StatusCode::NOT_FOUND, &not_found)
                .await;
        }
        // A well-formed id that no post can have.
        server
            .expect_message(
                Method::POST,
                "/posts/-1/likes",
                None,
                StatusCode::NOT_FOUND,
                "post -1 does not exist",
            )
            .await;
        // Nothing was counted for the posts that do not exist.
        for owner in [missing, -1] {
            let stored = post::Entity::counters().counts(&t.db, owner).await.unwrap();
            assert_eq!((stored.likes, stored.views), (0, 0), "[{}]", t.backend);
        }

        // Unknown routes and methods get the same JSON shape.
        for path in ["/nowhere".to_owned(), format!("/posts/{id}/shares")] {
            server
                .expect_message(
                    Method::GET,
                    &path,
                    None,
                    StatusCode::NOT_FOUND,
                    &format!("no route for {path}"),
                )
                .await;
        }
        server
            .expect_405(Method::PUT, &format!("/posts/{id}/likes"), "POST,DELETE")
            .await;

        server.stop().await;
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "blog_server_bad_request"]
    async fn malformed_ids_and_pages_are_400(t: TestDb) {
        let id = blog_with_posts(&t, 1).await[0];
        let server = Server::start(&t).await;

        for (method, path, raw) in [
            (Method::GET, "/posts/abc", "abc"),
            (Method::POST, "/posts/abc/likes", "abc"),
            (Method::DELETE, "/posts/1.5/likes", "1.5"),
            (Method::POST, "/posts/%20/views", " "),
            // Too large for an i64.
            (
                Method::GET,
                "/posts/99999999999999999999",
                "99999999999999999999",
            ),
        ] {
            server
                .expect_message(
                    method,
                    path,
                    None,
                    StatusCode::BAD_REQUEST,
                    &invalid_id("post", raw),
                )
                .await;
        }

        // Not UTF-8 once decoded: axum's own rejection, in the JSON shape.
        server
            .expect_error(Method::GET, "/posts/%FF", None, StatusCode::BAD_REQUEST)
            .await;

        let too_far = (MAX_PAGE + 1).to_string();
        for raw in [
            "abc",
            "0",
            "-1",
            "",
            "1.0",
            &too_far,
            "18446744073709551616",
        ] {
            server
                .expect_message(
                    Method::GET,
                    &format!("/posts?page={raw}"),
                    None,
                    StatusCode::BAD_REQUEST,
                    &format!("invalid page {raw:?}: expected a whole number from 1 to {MAX_PAGE}"),
                )
                .await;
        }
        server
            .expect_message(
                Method::GET,
                "/posts?page=1&page=2",
                None,
                StatusCode::BAD_REQUEST,
                "`page` is given more than once",
            )
            .await;

        // Nothing was written, and the server still answers.
        server.assert_post(id, "post 1", counts(0, 0, 0)).await;
        server.stop().await;
        t.finish().await;
    }
}

backend_test! {
    /// Two ways the database fails under a running server, both on every
    /// backend:
    ///
    /// 1. The counter table is dropped: the posts query works, the counter call
    ///    fails with counter-core's `MissingTable`. Creating the table again
    ///    heals the server without a restart.
    /// 2. The pool is closed: SeaORM's own queries fail (`DbErr` on acquiring a
    ///    connection), as when the database is down. The router shares the
    ///    test's pool (a clone of one `DatabaseConnection`), so closing `t.db`
    ///    closes it for the server too. A second connection would not do: on
    ///    SQLite in memory it would be another, empty database. `finish` closes
    ///    the pool again, which is harmless, and drops the scratch schema
    ///    through its own admin connection.
    ///
    /// Each failure must be a 503 with the JSON shape and `Retry-After`, without
    /// the database's message, and the server must keep answering. A comment
    /// whose counter cannot be written is not stored either: the row and its
    /// count are one transaction.
    #[tokio::test(flavor = "multi_thread")]
    #[label = "blog_server_unavailable"]
    async fn database_trouble_is_503_and_the_server_keeps_answering(t: TestDb) {
        let id = blog_with_posts(&t, 1).await[0];
        let server = Server::start(&t).await;
        let (comment, _) = server.comment(id, 1, "before the trouble").await;
        let comments = format!("/posts/{id}/comments");
        let new_comment = comment_json(1, "during the trouble");
        let comment_endpoints = [
            (Method::POST, comments.clone(), json_text(&new_comment)),
            (Method::DELETE, format!("/comments/{comment}"), None),
        ];
        let likes = format!("/posts/{id}/likes");
        let endpoints = [
            (Method::POST, likes.clone()),
            (Method::DELETE, likes.clone()),
            (Method::POST, format!("/posts/{id}/views")),
            (Method::GET, format!("/posts/{id}")),
            (Method::GET, "/posts?page=1".to_owned()),
        ];

        // 1. No counter table.
        post::Entity::counters().drop_table(&t.db).await.unwrap();
        server
            .expect_unavailable(&endpoints, &comment_endpoints)
            .await;
        // Neither comment write happened: the new one was rolled back with
        // its failed count, the old one is still there.
        assert_eq!(comment_ids(&t).await, [comment], "[{}]", t.backend);
        let (reply, _) = server
            .error_reply(Method::POST, &likes, None, StatusCode::SERVICE_UNAVAILABLE)
            .await;
        assert_eq!(
            reply.headers.get(RETRY_AFTER).and_then(|v| v.to_str().ok()),
            Some("1"),
            "[{}]",
            t.backend
        );
        // Bad input is still 400 and unknown posts 404: checked before the
        // counters are touched.
        server
            .expect_message(
                Method::POST,
                "/posts/abc/likes",
                None,
                StatusCode::BAD_REQUEST,
                &invalid_id("post", "abc"),
            )
            .await;
        server
            .expect_message(
                Method::POST,
                "/posts/0/likes",
                None,
                StatusCode::NOT_FOUND,
                "post 0 does not exist",
            )
            .await;

        post::Entity::counters().create_table(&t.db).await.unwrap();
        assert_eq!(
            server.request(Method::POST, &likes, None).await,
            (StatusCode::OK, json!({"id": id, "counts": counts(1, 0, 0)})),
            "[{}] after the table is back",
            t.backend
        );
        // The dropped table took the comment's count with it: a recount
        // from the rows gives it back.
        let report = comment::recount(&t.db, false).await.unwrap();
        assert_eq!(
            (report.owners_drifted, report.total_abs_drift),
            (1, 1),
            "[{}]",
            t.backend
        );
        assert_counters_agree(&t).await;
        server.assert_post(id, "post 1", counts(1, 1, 0)).await;

        // 2. The pool is closed under the server.
        t.db.close_by_ref().await.unwrap();
        server
            .expect_unavailable(&endpoints, &comment_endpoints)
            .await;
        server.expect_unavailable(&endpoints, &[]).await;
        // Input errors do not need the database.
        server
            .expect_message(
                Method::GET,
                "/posts?page=0",
                None,
                StatusCode::BAD_REQUEST,
                &format!("invalid page \"0\": expected a whole number from 1 to {MAX_PAGE}"),
            )
            .await;

        server.stop().await;
        t.finish().await;
    }
}

/// The 400 message of a malformed `what` id (`post`, `comment`) in a path.
fn invalid_id(what: &str, raw: &str) -> String {
    format!("invalid {what} id {raw:?}: expected an integer")
}

/// `{"author_id": author, "body": body}`, as a request body.
fn comment_json(author: i64, body: &str) -> String {
    json!({"author_id": author, "body": body}).to_string()
}

impl Api {
    /// Every one of `endpoints` (without a body) and `with_body` is a 503
    /// with the fixed message that gives nothing of the cause away.
    async fn expect_unavailable(
        &self,
        endpoints: &[(Method, String)],
        with_body: &[(Method, String, Body<'_>)],
    ) {
        let no_body = endpoints.iter().map(|(m, p)| (m, p, None));
        for (method, path, body) in no_body.chain(with_body.iter().map(|(m, p, b)| (m, p, *b))) {
            self.expect_message(
                method.clone(),
                path,
                body,
                StatusCode::SERVICE_UNAVAILABLE,
                "the database is unavailable; try again later",
            )
            .await;
        }
    }

    /// `POST /posts/{post}/comments`, which must be a 201 with the comment as
    /// sent and its URL in `Location`; returns the comment's id and the
    /// post's comments count in the reply.
    async fn comment(&self, post: i64, author: i64, body: &str) -> (i64, i64) {
        let path = format!("/posts/{post}/comments");
        let reply = self
            .send(Method::POST, &path, json_text(&comment_json(author, body)))
            .await;
        let (status, reply_body) = (reply.status, &reply.body);
        assert_eq!(
            status,
            StatusCode::CREATED,
            "[{}] {reply_body}",
            self.backend
        );
        let id = reply_body["comment"]["id"]
            .as_i64()
            .unwrap_or_else(|| panic!("[{}] no comment id in {reply_body}", self.backend));
        assert_eq!(
            reply_body["comment"],
            json!({"id": id, "post_id": post, "author_id": author, "body": body}),
            "[{}]",
            self.backend
        );
        assert_eq!(
            reply.headers.get(LOCATION).and_then(|v| v.to_str().ok()),
            Some(format!("/comments/{id}").as_str()),
            "[{}]",
            self.backend
        );
        (id, reply_body["counts"]["comments"].as_i64().unwrap())
    }

    /// `DELETE /comments/{id}`: its status, after checking the body: none
    /// for a 204; otherwise the JSON error shape, a 404 naming the comment.
    async fn delete_comment(&self, id: i64) -> StatusCode {
        let path = format!("/comments/{id}");
        let (what, status, _, bytes) = self.call(Method::DELETE, &path, None).await;
        if status == StatusCode::NO_CONTENT {
            assert!(bytes.is_empty(), "{what}: 204 with a body {bytes:?}");
        } else {
            let body = json_body(&bytes, &what);
            assert_eq!(
                body,
                json!({"error": {"status": status.as_u16(), "message": format!("comment {id} does not exist")}}),
                "{what}"
            );
        }
        status
    }
}

/// The comment rows of `post`, counted in the table itself.
async fn comment_rows(t: &TestDb, post: i64) -> u64 {
    comment::Entity::find()
        .filter(comment::Column::PostId.eq(post))
        .count(&t.sql())
        .await
        .unwrap()
}

/// The ids of every comment row, in id order.
async fn comment_ids(t: &TestDb) -> Vec<i64> {
    comment::Entity::find()
        .order_by_asc(comment::Column::Id)
        .all(&t.sql())
        .await
        .unwrap()
        .iter()
        .map(|c| c.id)
        .collect()
}

/// Every post's `comments` counter equals its comment rows: a dry-run
/// recount finds no drift.
async fn assert_counters_agree(t: &TestDb) {
    let report = comment::recount(&t.db, true).await.unwrap();
    assert_eq!(
        (report.owners_drifted, report.total_abs_drift),
        (0, 0),
        "[{}] {:?}",
        t.backend,
        report.drifted
    );
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "blog_server_comments"]
    async fn comments_are_rows_counted_on_their_post(t: TestDb) {
        let ids = blog_with_posts(&t, 2).await;
        let (a, b) = (ids[0], ids[1]);
        let server = Server::start(&t).await;

        let mut comments = Vec::new();
        for (n, body) in (1..).zip(["first", "second", "third"]) {
            let (id, count) = server.comment(a, 7, body).await;
            assert_eq!(count, n, "[{}] the count in the reply", t.backend);
            comments.push(id);
        }
        assert_eq!(
            server.delete_comment(comments[1]).await,
            StatusCode::NO_CONTENT,
            "[{}]",
            t.backend
        );

        server.assert_post(a, "post 1", counts(0, 2, 0)).await;
        let (_, page) = server.request(Method::GET, "/posts", None).await;
        assert_eq!(
            (&page["posts"][0]["counts"], &page["posts"][1]["counts"]),
            (&counts(0, 2, 0), &counts(0, 0, 0)),
            "[{}] {page}",
            t.backend
        );
        // The rows are there, and only the deleted one is gone.
        assert_eq!(
            (comment_rows(&t, a).await, comment_rows(&t, b).await),
            (2, 0),
            "[{}]",
            t.backend
        );
        assert_eq!(
            comment_ids(&t).await,
            [comments[0], comments[2]],
            "[{}]",
            t.backend
        );
        assert_counters_agree(&t).await;

        server.stop().await;
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "blog_server_delete_twice"]
    async fn deleting_a_comment_twice_decrements_once(t: TestDb) {
        let id = blog_with_posts(&t, 1).await[0];
        let server = Server::start(&t).await;
        let (keep, _) = server.comment(id, 1, "stays").await;
        let (gone, count) = server.comment(id, 2, "goes").await;
        assert_eq!(count, 2, "[{}]", t.backend);

        assert_eq!(
            server.delete_comment(gone).await,
            StatusCode::NO_CONTENT,
            "[{}]",
            t.backend
        );
        assert_eq!(
            server.delete_comment(gone).await,
            StatusCode::NOT_FOUND,
            "[{}] the second delete",
            t.backend
        );
        // A comment that never existed.
        assert_eq!(
            server.delete_comment(gone + 1000).await,
            StatusCode::NOT_FOUND,
            "[{}]",
            t.backend
        );
        let stored = post::Entity::counters().counts(&t.db, id).await.unwrap();
        assert_eq!(stored.comments, 1, "[{}] decremented once", t.backend);
        server.assert_post(id, "post 1", counts(0, 1, 0)).await;
        assert_eq!(comment_rows(&t, id).await, 1, "[{}]", t.backend);
        assert!(
            comment::Entity::find_by_id(keep)
                .one(&t.sql())
                .await
                .unwrap()
                .is_some(),
            "[{}]",
            t.backend
        );
        assert_counters_agree(&t).await;

        server.stop().await;
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[label = "blog_server_concurrent_comments"]
    async fn concurrent_comments_are_all_counted(t: TestDb) {
        const REQUESTS: i64 = 16;
        let id = blog_with_posts(&t, 1).await[0];
        let server = Server::start(&t).await;

        // 16 comments in flight at once, each on a connection of its own.
        let requests: Vec<_> = (0..REQUESTS)
            .map(|n| {
                let api = server.api.clone();
                tokio::spawn(async move { api.comment(id, n, &format!("comment {n}")).await })
            })
            .collect();
        let (mut comments, mut seen) = (Vec::new(), Vec::new());
        for request in requests {
            let (comment, count) = request.await.unwrap();
            // The count read back includes the others' comments: at least ours.
            assert!((1..=REQUESTS).contains(&count), "[{}] {count}", t.backend);
            comments.push(comment);
            seen.push(count);
        }
        // The last read started after every insert had committed; and each
        // request got a row of its own.
        assert_eq!(
            seen.iter().max(),
            Some(&REQUESTS),
            "[{}] {seen:?}",
            t.backend
        );
        let distinct: HashSet<i64> = comments.iter().copied().collect();
        assert_eq!(
            distinct.len(),
            comments.len(),
            "[{}] {comments:?}",
            t.backend
        );
        server
            .assert_post(id, "post 1", counts(0, REQUESTS, 0))
            .await;
        assert_eq!(comment_rows(&t, id).await, 16, "[{}]", t.backend);

        // Every comment deleted by two requests at once (a double click):
        // exactly one of each pair removes it and decrements. The two tasks
        // of a pair meet at a barrier first, so they are sent together, not
        // whenever the scheduler gets to the second.
        let pairs: Vec<_> = comments
            .iter()
            .map(|&comment| {
                let barrier = Arc::new(Barrier::new(2));
                let [first, second] = [(); 2].map(|()| {
                    let (api, barrier) = (server.api.clone(), barrier.clone());
                    tokio::spawn(async move {
                        barrier.wait().await;
                        api.delete_comment(comment).await
                    })
                });
                (comment, first, second)
            })
            .collect();
        for (comment, first, second) in pairs {
            let mut pair = [first.await.unwrap(), second.await.unwrap()];
            pair.sort();
            assert_eq!(
                pair,
                [StatusCode::NO_CONTENT, StatusCode::NOT_FOUND],
                "[{}] comment {comment}",
                t.backend
            );
        }
        let stored = post::Entity::counters().counts(&t.db, id).await.unwrap();
        assert_eq!(stored.comments, 0, "[{}]", t.backend);
        assert_eq!(comment_rows(&t, id).await, 0, "[{}]", t.backend);
        assert_counters_agree(&t).await;

        server.stop().await;
        t.finish().await;
    }
}

/// axum's default request body limit, in bytes: a larger body is 413.
const BODY_LIMIT: usize = 2 * 1024 * 1024;

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "blog_server_bad_comments"]
    async fn malformed_comments_are_refused(t: TestDb) {
        let id = blog_with_posts(&t, 1).await[0];
        let server = Server::start(&t).await;
        let path = format!("/posts/{id}/comments");
        let json = Some("application/json");
        let too_long = "x".repeat(MAX_COMMENT_CHARS + 1);
        let too_long = comment_json(1, &too_long);
        let empty = comment_json(1, "");
        let too_large = comment_json(1, &"x".repeat(BODY_LIMIT));
        let controls = [
            "\u{0}",
            "a\u{7}b",
            "\u{1b}[31mred",
            "\u{7f}",
            "\u{85}",
            "\u{b}",
        ]
        .map(|body| comment_json(1, body));
        let (bad, unsupported, too_big) = (
            StatusCode::BAD_REQUEST,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            StatusCode::PAYLOAD_TOO_LARGE,
        );

        for (content_type, body, status, mentions) in [
            (json, empty.as_str(), bad, "not 0"),
            (json, too_long.as_str(), bad, "not 2001"),
            // NUL, as a client writes it: PostgreSQL cannot store it, so it
            // must be refused before the database is asked.
            (
                json,
                r#"{"author_id": 1, "body": "a\u0000b"}"#,
                bad,
                "U+0000 at character 2",
            ),
            (json, &controls[0], bad, "U+0000 at character 1"),
            (json, &controls[1], bad, "U+0007 at character 2"),
            (json, &controls[2], bad, "U+001B"),
            (json, &controls[3], bad, "U+007F"),
            (json, &controls[4], bad, "U+0085"),
            (json, &controls[5], bad, "U+000B"),
            // Missing fields and wrong types: axum's 422, kept a 400 (see
            // `rejected` in the server).
            (json, r#"{"author_id": 1}"#, bad, "body"),
            (json, r#"{"body": "hi"}"#, bad, "author_id"),
            (
                json,
                r#"{"author_id": "1", "body": "hi"}"#,
                bad,
                "author_id",
            ),
            (json, r#"{"author_id": 1, "body": 5}"#, bad, "body"),
            (json, r#"{"author_id": 1, "body": "hi""#, bad, "JSON"),
            (json, "", bad, "JSON"),
            (json, "[1, 2]", bad, "JSON"),
            // Not declared as JSON at all: the client fixes a header.
            (
                None,
                r#"{"author_id": 1, "body": "hi"}"#,
                unsupported,
                "Content-Type",
            ),
            (
                Some("text/plain"),
                r#"{"author_id": 1, "body": "hi"}"#,
                unsupported,
                "Content-Type",
            ),
            // Over axum's body limit: refused before it is parsed.
            (json, too_large.as_str(), too_big, "length limit"),
        ] {
            let message = server
                .expect_error(Method::POST, &path, Some((content_type, body)), status)
                .await;
            assert!(
                message.contains(mentions),
                "[{}] {content_type:?} {body:.40}: {message}",
                t.backend
            );
        }
        // Malformed ids, in the path of either endpoint.
        server
            .expect_message(
                Method::POST,
                "/posts/abc/comments",
                json_text(&comment_json(1, "hi")),
                StatusCode::BAD_REQUEST,
                &invalid_id("post", "abc"),
            )
            .await;
        server
            .expect_message(
                Method::DELETE,
                "/comments/1.5",
                None,
                StatusCode::BAD_REQUEST,
                &invalid_id("comment", "1.5"),
            )
            .await;
        assert_eq!(
            comment_rows(&t, id).await,
            0,
            "[{}] nothing stored",
            t.backend
        );

        // The limits are characters, inclusive: 2,000 two-byte characters
        // fit, and so do 2,000 four-byte ones (utf8mb4 on MySQL).
        let longest = "é".repeat(MAX_COMMENT_CHARS);
        let (_, count) = server.comment(id, 1, &longest).await;
        let (_, count_after) = server.comment(id, 1, "x").await;
        assert_eq!((count, count_after), (1, 2), "[{}]", t.backend);
        // Emoji (outside the Basic Multilingual Plane: MySQL's utf8mb3
        // cannot store them) and the whitespace control characters are
        // stored and read back as sent, in the reply and in the table.
        for body in [
            "😀 ok",
            "line 1\nline 2\r\n\ttabbed",
            &"😀".repeat(MAX_COMMENT_CHARS),
        ] {
            let (comment, _) = server.comment(id, 1, body).await;
            let stored = comment::Entity::find_by_id(comment)
                .one(&t.sql())
                .await
                .unwrap()
                .unwrap_or_else(|| panic!("[{}] comment {comment} not stored", t.backend));
            assert_eq!(stored.body, body, "[{}]", t.backend);
        }
        assert_eq!(comment_rows(&t, id).await, 5, "[{}]", t.backend);
        assert_counters_agree(&t).await;

        server.stop().await;
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "blog_server_comment_not_found"]
    async fn comments_on_unknown_posts_are_404(t: TestDb) {
        let id = blog_with_posts(&t, 1).await[0];
        let missing = id + 1000;
        let server = Server::start(&t).await;

        server
            .expect_message(
                Method::POST,
                &format!("/posts/{missing}/comments"),
                json_text(&comment_json(1, "hello?")),
                StatusCode::NOT_FOUND,
                &format!("post {missing} does not exist"),
            )
            .await;
        // Nothing was stored or counted for it.
        assert_eq!(comment_rows(&t, missing).await, 0, "[{}]", t.backend);
        let stored = post::Entity::counters()
            .counts(&t.db, missing)
            .await
            .unwrap();
        assert_eq!(stored.comments, 0, "[{}]", t.backend);

        assert_eq!(
            server.delete_comment(1).await,
            StatusCode::NOT_FOUND,
            "[{}] no comment yet",
            t.backend
        );
        // The comment route takes only DELETE.
        server
            .expect_405(Method::GET, "/comments/1", "DELETE")
            .await;

        server.stop().await;
        t.finish().await;
    }
}

/// Views of `post` dated `at`, counted with `add_at` (in the all-time total
/// and in the daily bucket of `at`).
async fn views_at(t: &TestDb, post: i64, views: &[(DateTime<Utc>, i64)]) {
    for &(at, n) in views {
        post::Entity::counters()
            .add_at(&t.db, post, Key::Views, n, at)
            .await
            .unwrap();
    }
}

/// `GET path` (a daily views request), which must be 200, with the UTC day
/// it was answered on. Asked again if midnight UTC passed during the
/// request, so that expectations built from "today" cannot race the clock.
async fn daily_views(api: &Api, path: &str) -> (DateTime<Utc>, Value) {
    loop {
        let today = Window::Day.start_of(Utc::now());
        let body = api.get_ok(path).await;
        if Window::Day.start_of(Utc::now()) == today {
            return (today, body);
        }
    }
}

/// The body of `GET /posts/{post}/views/daily?days={days}` answered on
/// `today`: every day, oldest first, with the views of `views` dated in it.
/// Days are formatted here by hand, not with the server's code.
fn expected_days(
    post: i64,
    today: DateTime<Utc>,
    days: i64,
    views: &[(DateTime<Utc>, i64)],
) -> Value {
    let days: Vec<Value> = (0..days)
        .rev()
        .map(|back| {
            let day = today - TimeDelta::days(back);
            let next = day + TimeDelta::days(1);
            let n: i64 = views
                .iter()
                .filter(|&&(at, _)| day <= at && at < next)
                .map(|&(_, n)| n)
                .sum();
            let date = day.date_naive();
            json!({
                "day": format!("{:04}-{:02}-{:02}", date.year(), date.month(), date.day()),
                "views": n,
            })
        })
        .collect();
    json!({"post_id": post, "days": days})
}

/// `GET /posts/{post}/views/daily{query}` (see [`daily_views`]), which
/// must list `days` days with the post's dated `views` in them, as
/// [`expected_days`] builds it; returns the day it was answered on and the
/// body.
async fn assert_daily(
    api: &Api,
    post: i64,
    query: &str,
    days: impl Into<i64>,
    views: &[(DateTime<Utc>, i64)],
) -> (DateTime<Utc>, Value) {
    let path = format!("/posts/{post}/views/daily{query}");
    let (answered, body) = daily_views(api, &path).await;
    assert_eq!(
        body,
        expected_days(post, answered, days.into(), views),
        "[{}] GET {path}",
        api.backend
    );
    (answered, body)
}

/// The `views` of each day of a daily views body, oldest first.
fn views_of(body: &Value) -> Vec<i64> {
    body["days"]
        .as_array()
        .unwrap_or_else(|| panic!("no days in {body}"))
        .iter()
        .map(|day| day["views"].as_i64().unwrap())
        .collect()
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "blog_server_daily_views"]
    async fn daily_views_are_zero_filled_utc_days(t: TestDb) {
        let ids = blog_with_posts(&t, 3).await;
        let (a, b, quiet) = (ids[0], ids[1], ids[2]);
        let today = Window::Day.start_of(Utc::now());
        let day = |back: i64| today - TimeDelta::days(back);
        let second = TimeDelta::seconds(1);
        let views = [
            // The first of 7 days, from its first second; the second before
            // it is the day before, out of a 7-day answer.
            (day(6), 2),
            (day(6) - second, 100),
            (day(3) + TimeDelta::hours(12), 5),
            // Midnight UTC: the last second of yesterday, the first of today.
            (today - second, 1),
            (today, 3),
            // Tomorrow (a clock ahead, a backfill gone wrong): never in a
            // range ending today.
            (day(-1), 50),
        ];
        views_at(&t, a, &views).await;
        // Another post's views are not a's.
        let b_views = [(today, 7)];
        views_at(&t, b, &b_views).await;
        let server = Server::start(&t).await;

        let (answered, body) = assert_daily(&server, a, "?days=7", 7, &views).await;
        if answered == today {
            // The same, spelled out: zero-filled days between the views.
            assert_eq!(views_of(&body), [2, 0, 0, 5, 0, 1, 3], "[{}]", t.backend);
        }

        // Without `days`: the default, two weeks, the day before included.
        assert_daily(&server, a, "", DEFAULT_DAILY_DAYS, &views).await;
        for days in [1, 2, MAX_DAILY_DAYS] {
            assert_daily(&server, a, &format!("?days={days}"), days, &views).await;
        }
        // Other parameters are ignored.
        assert_daily(&server, b, "?days=3&page=9", 3, &b_views).await;
        let (_, body) = assert_daily(&server, quiet, "", 14, &[]).await;
        assert_eq!(views_of(&body), [0; 14], "[{}]", t.backend);

        // The all-time total has every view, those outside any range too.
        server.assert_post(a, "post 1", counts(0, 0, 161)).await;

        server.stop().await;
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "blog_server_daily_views_errors"]
    async fn daily_views_refuse_bad_days_and_unknown_posts(t: TestDb) {
        let id = blog_with_posts(&t, 1).await[0];
        let missing = id + 1000;
        let server = Server::start(&t).await;

        let too_many = MAX_DAILY_DAYS + 1;
        for days in [
            "0".to_owned(),
            too_many.to_string(),
            "-1".into(),
            "abc".into(),
            "1.5".into(),
            "".into(),
            "99999999999999999999".into(),
        ] {
            let message = format!(
                "invalid days {days:?}: expected a whole number from 1 to {MAX_DAILY_DAYS}"
            );
            let path = format!("/posts/{id}/views/daily?days={days}");
            server
                .expect_message(Method::GET, &path, None, StatusCode::BAD_REQUEST, &message)
                .await;
        }
        for (path, status, message) in [
            (
                format!("/posts/{id}/views/daily?days=3&days=4"),
                StatusCode::BAD_REQUEST,
                "`days` is given more than once".to_owned(),
            ),
            (
                "/posts/abc/views/daily".to_owned(),
                StatusCode::BAD_REQUEST,
                invalid_id("post", "abc"),
            ),
            (
                format!("/posts/{missing}/views/daily"),
                StatusCode::NOT_FOUND,
                format!("post {missing} does not exist"),
            ),
            (
                format!("/posts/{missing}/views/daily?days=1"),
                StatusCode::NOT_FOUND,
                format!("post {missing} does not exist"),
            ),
        ] {
            server
                .expect_message(Method::GET, &path, None, status, &message)
                .await;
        }
        server
            .expect_405(
                Method::POST,
                &format!("/posts/{id}/views/daily"),
                "GET,HEAD",
            )
            .await;

        server.stop().await;
        t.finish().await;
    }
}

/// `GET path` (a most-liked request), which must be 200: the posts as
/// `(id, title, likes)` and the `next` cursor.
async fn most_liked(api: &Api, path: &str) -> (Vec<(i64, String, i64)>, Value) {
    let body = api.get_ok(path).await;
    let object = body.as_object().unwrap();
    assert_eq!(object.len(), 2, "[{}] GET {path}: {body}", api.backend);
    let posts = body["posts"]
        .as_array()
        .unwrap_or_else(|| panic!("[{}] GET {path}: {body}", api.backend))
        .iter()
        .map(|post| {
            assert_eq!(post.as_object().unwrap().len(), 3, "{post}");
            (
                post["id"].as_i64().unwrap(),
                post["title"].as_str().unwrap().to_owned(),
                post["likes"].as_i64().unwrap(),
            )
        })
        .collect();
    (posts, body["next"].clone())
}

/// Every page of the most liked posts, `limit` at a time, following `next`
/// until it is null: the posts in order, and the number of pages.
async fn all_pages(api: &Api, limit: usize) -> (Vec<(i64, String, i64)>, usize) {
    let mut posts = Vec::new();
    let mut path = format!("/posts/most-liked?limit={limit}");
    for pages in 1..100 {
        let (page, next) = most_liked(api, &path).await;
        assert!(page.len() <= limit, "[{}] {path}", api.backend);
        if next.is_null() {
            posts.extend(page);
            return (posts, pages);
        }
        // A full page's cursor is its last post (a page missing a deleted
        // post is short, and its cursor is the deleted post's place).
        if let (true, Some((id, _, likes))) = (page.len() == limit, page.last()) {
            assert_eq!(
                next,
                json!({"after_likes": likes, "after_id": id}),
                "[{}] {path}",
                api.backend
            );
        }
        posts.extend(page);
        let (likes, id) = (&next["after_likes"], &next["after_id"]);
        assert!(
            likes.is_i64() && id.is_i64(),
            "[{}] {path}: {next}",
            api.backend
        );
        path = format!("/posts/most-liked?limit={limit}&after_likes={likes}&after_id={id}");
    }
    panic!(
        "[{}] limit {limit}: the cursor does not advance",
        api.backend
    )
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "blog_server_most_liked"]
    async fn most_liked_pages_cover_every_liked_post_once(t: TestDb) {
        let ids = blog_with_posts(&t, 7).await;
        let server = Server::start(&t).await;
        assert_eq!(
            server.request(Method::GET, "/posts/most-liked", None).await,
            (StatusCode::OK, json!({"posts": [], "next": null})),
            "[{}] nothing liked yet",
            t.backend
        );

        // Three posts tie at 5 likes; post 4 is never liked (only viewed),
        // post 7 is unliked below zero.
        for (i, likes) in [(0, 3), (1, 5), (2, 5), (4, 1), (5, 5)] {
            post::Entity::counters()
                .add(&t.db, ids[i], Key::Likes, likes)
                .await
                .unwrap();
        }
        post::Entity::counters()
            .add(&t.db, ids[3], Key::Views, 100)
            .await
            .unwrap();
        let (status, _) = server
            .request(Method::DELETE, &format!("/posts/{}/likes", ids[6]), None)
            .await;
        assert_eq!(status, StatusCode::OK, "[{}]", t.backend);
        // Most likes first, ties by id.
        let expected: Vec<(i64, String, i64)> = [(1, 5), (2, 5), (5, 5), (0, 3), (4, 1), (6, -1)]
            .into_iter()
            .map(|(i, likes)| (ids[i], format!("post {}", i + 1), likes))
            .collect();

        // One page, by default up to 10.
        let (posts, next) = most_liked(&server, "/posts/most-liked").await;
        assert_eq!(posts, expected, "[{}]", t.backend);
        assert_eq!(next, Value::Null, "[{}]", t.backend);
        assert!(DEFAULT_MOST_LIKED > expected.len());

        // Pages of every size: every liked post exactly once, in order, the
        // cursor crossing the tie at 5 likes.
        for limit in [1, 2, 3, 4, 6, 7, MAX_MOST_LIKED] {
            let (posts, pages) = all_pages(&server, limit).await;
            assert_eq!(posts, expected, "[{}] limit {limit}", t.backend);
            let listed: HashSet<i64> = posts.iter().map(|(id, _, _)| *id).collect();
            assert_eq!(listed.len(), expected.len(), "[{}]", t.backend);
            // A page shorter than the limit ends it; a full last page is
            // followed by an empty one.
            assert_eq!(
                pages,
                expected.len() / limit + 1,
                "[{}] limit {limit}",
                t.backend
            );
        }
        // The cursor after a page of two: the third post's place, in the tie.
        let after_third = json!({"after_likes": 5, "after_id": ids[2]});
        let (posts, next) = most_liked(&server, "/posts/most-liked?limit=2").await;
        assert_eq!(posts, expected[..2], "[{}]", t.backend);
        assert_eq!(next, after_third, "[{}]", t.backend);

        // A cursor needs no post at its place: after 4 likes comes post 1's 3.
        let (posts, _) = most_liked(
            &server,
            &format!("/posts/most-liked?after_likes=4&after_id={}", ids[6] + 1000),
        )
        .await;
        assert_eq!(posts, expected[3..], "[{}]", t.backend);

        // A deleted post keeps its counter rows, so its place in the
        // ranking: it is left out of its page, and the cursor steps over it.
        post::Entity::delete_by_id(ids[2])
            .exec(&t.sql())
            .await
            .unwrap();
        let (posts, next) = most_liked(&server, "/posts/most-liked?limit=2").await;
        assert_eq!(posts, expected[..1], "[{}]", t.backend);
        assert_eq!(next, after_third, "[{}]", t.backend);
        let (posts, _) = all_pages(&server, 2).await;
        let without: Vec<_> = expected
            .iter()
            .filter(|(id, _, _)| *id != ids[2])
            .cloned()
            .collect();
        assert_eq!(posts, without, "[{}]", t.backend);

        server.stop().await;
        t.finish().await;
    }
}

backend_test! {
    #[tokio::test(flavor = "multi_thread")]
    #[label = "blog_server_most_liked_errors"]
    async fn most_liked_refuses_bad_limits_and_cursors(t: TestDb) {
        blog_with_posts(&t, 1).await;
        let server = Server::start(&t).await;

        let limit = |raw: &str| {
            format!("invalid limit {raw:?}: expected a whole number from 1 to {MAX_MOST_LIKED}")
        };
        let pair = "`after_likes` and `after_id` go together: give both (the `next` of the \
                    page before) or neither (the first page)";
        let too_many = (MAX_MOST_LIKED + 1).to_string();
        for (query, expected) in [
            ("limit=0".to_owned(), limit("0")),
            (format!("limit={too_many}"), limit(&too_many)),
            ("limit=-1".into(), limit("-1")),
            ("limit=ten".into(), limit("ten")),
            ("limit=".into(), limit("")),
            (
                "limit=2&limit=3".into(),
                "`limit` is given more than once".into(),
            ),
            ("after_likes=5".into(), pair.into()),
            ("after_id=3".into(), pair.into()),
            ("limit=2&after_id=3".into(), pair.into()),
            (
                "after_likes=many&after_id=3".into(),
                "invalid after_likes \"many\": expected an integer".into(),
            ),
            (
                "after_likes=5&after_id=1.5".into(),
                "invalid after_id \"1.5\": expected an integer".into(),
            ),
            (
                "after_likes=5&after_id=1&after_id=2".into(),
                "`after_id` is given more than once".into(),
            ),
        ] {
            let path = format!("/posts/most-liked?{query}");
            server
                .expect_message(Method::GET, &path, None, StatusCode::BAD_REQUEST, &expected)
                .await;
        }
        // The ranking is a route of its own, not a post whose id would be
        // "most-liked": the messages above are the ranking's, none is an
        // "invalid post id". And it takes only GET.
        server
            .expect_405(Method::POST, "/posts/most-liked", "GET,HEAD")
            .await;

        server.stop().await;
        t.finish().await;
    }
}

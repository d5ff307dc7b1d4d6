//! Two regions, one service each (`[region]`), each on a PostgreSQL
//! cluster of its own, the clusters joined by logical replication (the
//! publications `migrate` makes, a subscription each way). Keyed adds and
//! observes go to both services while replication is cut and after it
//! heals; checked through the API:
//!
//! * no request refused because of the cut;
//! * `/readyz` stays 200 during the cut and names the region whose
//!   heartbeat stopped; `Counter-Region-Lag-Ms` grows, then falls back;
//! * after the heal both services answer every acknowledged add, once,
//!   and the union of the members observed in both, within a time printed;
//! * an `Idempotency-Key` replayed in the same region counts once; the
//!   same key sent to the other region counts again (keys are per region,
//!   measured and printed);
//! * a reset, which would need the other region's rows, is 409
//!   `cross_region`.
//!
//! The same runs on MariaDB, its servers replicating each other's row
//! binary logs (`counter_tests::regions::Link`): the idempotency ledger is
//! left out of replication there, as it is never published on PostgreSQL.
//!
//! The library's own regional test (cuts, a SIGKILLed region, every write
//! path) is `tests/tests/reliability/regions.rs`.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use counter_core::unique::Sketch;
use counter_service::{Config, Service};
use counter_tests::{
    figures,
    regions::Link,
    servers::{self, PrivateServer},
};
use serde_json::{Value, json};

use crate::support::{Api, Running};

const OWNERS: u64 = 20;

const NAMESPACE: &str = r#"
[namespaces.posts]
table = "post_counters"
owner = "integer"
[namespaces.posts.keys.likes]
[namespaces.posts.keys.viewers]
unique = true
"#;

/// One region: its server and its service.
struct Region {
    name: &'static str,
    link: Link,
    server: Arc<dyn PrivateServer>,
    service: Running,
}

/// A region's server with the service's tables: migrated, not serving
/// yet. Replication is set up between migrating and serving, in this
/// order, as MariaDB needs it: a replica starts from its source's binary
/// log as it is, so it must start before a row it will be sent an update
/// of exists (the service's heartbeat row, from its first beat), and after
/// the tables exist in both (their DDL is not replayed). PostgreSQL's
/// subscriptions copy existing rows and could be made at any point.
async fn migrated(name: &'static str, index: u16, link: Link) -> (Arc<dyn PrivateServer>, Config) {
    let server = link.launch(index).await;
    // MariaDB's replication is the servers' own: no publication to make.
    let publication = match link {
        Link::Logical => format!("publication = \"counters_{name}\"\n"),
        Link::Binlog => String::new(),
    };
    let text = format!(
        "[server]\nopen = true\n[database]\nurl = \"{}\"\nmax_connections = 8\n\
         [region]\nname = \"{name}\"\nindex = {index}\ncount = 2\n{publication}\
         beat_ms = 100\nstale_after_ms = 1000\n{NAMESPACE}",
        server.url()
    );
    let config = Config::from_text(&text, "the test's configuration", std::iter::empty(), &[])
        .unwrap_or_else(|e| panic!("{e}"));
    Service::migrate(&config)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    (server, config)
}

/// Two regions replicating each other by `link`, each serving.
async fn regions(link: Link) -> (Region, Region) {
    let ((a_server, a_config), (b_server, b_config)) =
        tokio::join!(migrated("a", 0, link), migrated("b", 1, link));
    replicate(link, &*a_server, &*b_server, "counters_b").await;
    replicate(link, &*b_server, &*a_server, "counters_a").await;
    let (a, b) = tokio::join!(Running::serve(a_config), Running::serve(b_config));
    (
        Region {
            name: "a",
            link,
            server: a_server,
            service: a,
        },
        Region {
            name: "b",
            link,
            server: b_server,
            service: b,
        },
    )
}

/// `into` replicates from `from` (its publication `publication`).
async fn replicate(
    link: Link,
    into: &dyn PrivateServer,
    from: &dyn PrivateServer,
    publication: &str,
) {
    let db = servers::pool(&into.url(), 1, Duration::from_secs(5)).await;
    link.replicate(&db, from, publication).await;
    db.close().await.expect("close");
}

impl Region {
    /// A connection of its own to the region's database, for `work`.
    async fn with_db<F, Fut>(&self, work: F)
    where
        F: FnOnce(sea_orm::DatabaseConnection) -> Fut,
        Fut: std::future::Future<Output = sea_orm::DatabaseConnection>,
    {
        let db = servers::pool(&self.server.url(), 1, Duration::from_secs(5)).await;
        work(db).await.close().await.expect("close");
    }

    async fn replication(&self, on: bool) {
        self.with_db(|db| async {
            self.link.replication(&db, on).await;
            db
        })
        .await;
    }

    /// `(likes per owner, viewers per owner)` as this region answers.
    async fn read(&self) -> (Vec<i64>, Vec<u64>) {
        let owners: Vec<u64> = (1..=OWNERS).collect();
        let counts = self
            .service
            .totals("posts", None, json!(owners), json!(["likes"]))
            .await;
        let uniques = self
            .service
            .post(
                "/v1/posts/uniques:batchGet",
                None,
                json!({"owners": owners, "keys": ["viewers"]}),
            )
            .await
            .ok();
        let likes = owners
            .iter()
            .map(|o| counts[o.to_string()]["likes"].as_i64().expect("a total"))
            .collect();
        let viewers = owners
            .iter()
            .map(|o| {
                uniques["uniques"][o.to_string()]["viewers"]
                    .as_u64()
                    .expect("an estimate")
            })
            .collect();
        (likes, viewers)
    }
}

/// What both regions acknowledged: likes per owner, members per owner.
#[derive(Default)]
struct Acked {
    likes: Vec<i64>,
    members: Vec<Vec<String>>,
    requests: u64,
}

impl Acked {
    fn new() -> Self {
        Self {
            likes: vec![0; OWNERS as usize],
            members: vec![Vec::new(); OWNERS as usize],
            requests: 0,
        }
    }

    fn viewers(&self) -> Vec<u64> {
        self.members
            .iter()
            .map(|members| {
                let mut sketch = Sketch::new();
                for member in members {
                    sketch.insert(member.as_str());
                }
                sketch.estimate()
            })
            .collect()
    }
}

/// Sends keyed adds and observes to `api` for `phase`, one at a time; what
/// was acknowledged. Every request must succeed.
async fn load(api: &Api, name: &str, round: &str, phase: Duration, acked: &mut Acked) {
    let began = Instant::now();
    let mut i = 0u64;
    while began.elapsed() < phase {
        i += 1;
        let owner = 1 + (i % OWNERS);
        let slot = (owner - 1) as usize;
        let key = format!("{name}-{round}-{i}");
        let reply = api
            .post_keyed(
                "/v1/posts/counters:add",
                None,
                &key,
                json!({"owner": owner, "key": "likes", "delta": 1}),
            )
            .await;
        assert_eq!(reply.status, 200, "region {name}, {round}: {reply:?}");
        acked.likes[slot] += 1;
        let member = format!("{name}-{round}-{i}");
        let reply = api
            .post(
                "/v1/posts/counters:observe",
                None,
                json!({"observations": [{"owner": owner, "key": "viewers", "member": member}]}),
            )
            .await;
        assert_eq!(reply.status, 200, "region {name}, {round}: {reply:?}");
        acked.members[slot].push(member);
        acked.requests += 2;
    }
}

/// Polls both regions until each answers `acked`; the time since `since`.
async fn converge(regions: &[&Region], acked: &Acked, since: Instant, what: &str) -> Duration {
    let expected = (acked.likes.clone(), acked.viewers());
    loop {
        let mut differs = None;
        for region in regions {
            let read = region.read().await;
            if read != expected {
                differs = Some(format!(
                    "region {}: {read:?}, expected {expected:?}",
                    region.name
                ));
            }
        }
        let Some(differs) = differs else {
            return since.elapsed();
        };
        assert!(
            since.elapsed() < Duration::from_secs(60),
            "{what}: not converged after 60 s: {differs}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The `Counter-Region-Lag-Ms` of an answer of `region`'s.
async fn lag_header(region: &Region) -> (String, Option<u64>) {
    let reply = region.service.get("/v1/posts/keys", None).await;
    assert_eq!(reply.status, 200, "{reply:?}");
    let name = reply
        .header("counter-region")
        .unwrap_or_default()
        .to_owned();
    let lag = reply
        .header("counter-region-lag-ms")
        .and_then(|v| v.parse().ok());
    (name, lag)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_regions_through_the_service_count_through_a_cut() {
    if servers::wanted(
        Link::Logical.url_var(),
        "two_regions_through_the_service_count_through_a_cut",
    ) {
        through_the_service(Link::Logical).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_mariadb_regions_through_the_service_count_through_a_cut() {
    if servers::wanted(
        Link::Binlog.url_var(),
        "two_mariadb_regions_through_the_service_count_through_a_cut",
    ) {
        through_the_service(Link::Binlog).await;
    }
}

/// Two regions replicating by `link`, one service each, a cut under keyed
/// adds and observes, then the heal; the figures `service_regions`.
async fn through_the_service(link: Link) {
    let began = Instant::now();
    let (a, b) = regions(link).await;
    let mut acked = Acked::new();

    // Connected: both regions' heartbeats arrive; answers say who served.
    load(
        &a.service,
        "a",
        "warm",
        Duration::from_millis(500),
        &mut acked,
    )
    .await;
    load(
        &b.service,
        "b",
        "warm",
        Duration::from_millis(500),
        &mut acked,
    )
    .await;
    let healed_wait = Instant::now();
    converge(&[&a, &b], &acked, healed_wait, "connected").await;
    let (name, lag) = lag_header(&a).await;
    assert_eq!(name, "a");
    let connected_lag = lag.expect("a lag once the other region is heard from");
    let ready = a.service.get("/readyz", None).await;
    assert_eq!(ready.status, 200, "{ready:?}");
    assert_eq!(ready.json["region"]["ok"], true, "{ready:?}");

    // Cut both ways: both keep counting.
    a.replication(false).await;
    b.replication(false).await;
    let cut = Instant::now();
    let (mut during_a, mut during_b) = (Acked::new(), Acked::new());
    let (ra, rb) = (a.service.api.clone(), b.service.api.clone());
    let (da, db) = tokio::join!(
        async move {
            load(&ra, "a", "cut", Duration::from_millis(1_800), &mut during_a).await;
            during_a
        },
        async move {
            load(&rb, "b", "cut", Duration::from_millis(1_800), &mut during_b).await;
            during_b
        }
    );
    let cut_requests = da.requests + db.requests;
    for during in [da, db] {
        for (slot, likes) in during.likes.iter().enumerate() {
            acked.likes[slot] += likes;
        }
        for (slot, members) in during.members.into_iter().enumerate() {
            acked.members[slot].extend(members);
        }
        acked.requests += during.requests;
    }
    let (_, lag_during) = lag_header(&b).await;
    let lag_during = lag_during.expect("a lag");
    assert!(
        lag_during >= 1_000,
        "the lag shows the cut: {lag_during} ms after {:?}",
        cut.elapsed()
    );
    let ready = b.service.get("/readyz", None).await;
    assert_eq!(ready.status, 200, "a cut region stays ready: {ready:?}");
    assert_eq!(ready.json["region"]["ok"], false, "{ready:?}");
    let detail = ready.json["region"]["detail"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(detail.contains("replication stopped? a "), "{detail}");

    // A key retried in its own region is replayed; in the other, counted again.
    let body = json!({"owner": 1, "key": "likes", "delta": 1});
    let first = a
        .service
        .post_keyed("/v1/posts/counters:add", None, "retry-me", body.clone())
        .await;
    assert_eq!(first.status, 200, "{first:?}");
    let same = a
        .service
        .post_keyed("/v1/posts/counters:add", None, "retry-me", body.clone())
        .await;
    assert_eq!(same.header("idempotent-replayed"), Some("true"), "{same:?}");
    let other = b
        .service
        .post_keyed("/v1/posts/counters:add", None, "retry-me", body)
        .await;
    assert_eq!(
        (other.status, other.header("idempotent-replayed")),
        (200, None),
        "{other:?}"
    );
    let before_retries = acked.likes[0];
    acked.likes[0] += 2;

    // Refused: a reset needs the other region's rows.
    let reset = a
        .service
        .post(
            "/v1/posts/counters:clear",
            None,
            json!({"owners": [1], "keys": ["likes"]}),
        )
        .await;
    reset.assert_problem(409, "cross_region");

    // Healed.
    let healed = Instant::now();
    a.replication(true).await;
    b.replication(true).await;
    let took = converge(&[&a, &b], &acked, healed, "after the heal").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_, lag_after) = lag_header(&b).await;
    let lag_after = lag_after.expect("a lag");
    assert!(lag_after < 1_000, "{lag_after} ms once healed");
    let ready = b.service.get("/readyz", None).await;
    assert_eq!(ready.json["region"]["ok"], true, "{ready:?}");
    let metrics = b.service.get("/metrics", None).await;
    assert!(
        metrics
            .text
            .contains("counter_service_region_lag_seconds{region=\"a\"}"),
        "the lag metric"
    );
    let totals: Value = a
        .service
        .totals("posts", None, json!([1]), json!(["likes"]))
        .await;
    figures(
        "service_regions",
        link.backend(),
        &[
            ("regions", 2),
            ("requests_acked", acked.requests),
            ("requests_during_cut", cut_requests),
            ("refused_during_cut", 0),
            ("lost", 0),
            ("doubled", 0),
            ("converge_ms", took.as_millis() as u64),
            ("lag_connected_ms", connected_lag),
            ("lag_during_cut_ms", lag_during),
            ("lag_healed_ms", lag_after),
            (
                "retry_other_region_counted",
                (totals["1"]["likes"].as_i64().unwrap_or(0) - before_retries) as u64,
            ),
            ("secs", began.elapsed().as_secs()),
        ],
    );
    a.service.stop().await;
    b.service.stop().await;
}

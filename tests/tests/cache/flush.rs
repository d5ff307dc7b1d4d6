//! The cache's promise made visible per write: after a write returned `Ok`,
//! `flush_invalidations` says whether its deletion reached Redis. With
//! Redis paused for writes (`CLIENT PAUSE .. WRITE`: reads are served,
//! deletions wait), a writer process counts and flushes, and a reader in
//! another process reads through its own cache: no read may miss a write
//! whose flush returned `Ok`. Reads that miss a write whose flush failed
//! are counted (the case the flush exists to tell).
//!
//! Two processes, because the cache's write observers are process-wide: a
//! reader in the writer's process would be told of every write and skip
//! the owners it owes, hiding exactly what this test looks for.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use counter_redis::RedisTarget;
use counter_tests::{
    Backend, backend_test, child, counters, env_number, figures,
    redis::{PrivateRedis, namespace, shared_url, test_cache},
    sql::Sql,
};
use sea_orm::{ConnectionTrait, DatabaseConnection, Statement};

/// The environment variable a writer child reads its spec from.
const WRITER: &str = "COUNTER_CACHE_FLUSH_WRITER";
/// Owners the writer counts, one `likes` each.
const OWNERS: i64 = 4;
/// The counter table.
const TABLE: &str = "flush_counters";

/// Where the writer child finds its database and Redis.
struct Spec {
    db_url: String,
    schema: Option<String>,
    redis_url: String,
    namespace: String,
    secs: u64,
}

impl Spec {
    fn encode(&self) -> String {
        [
            self.db_url.as_str(),
            self.schema.as_deref().unwrap_or(""),
            &self.redis_url,
            &self.namespace,
            &self.secs.to_string(),
        ]
        .join("\u{1f}")
    }

    fn decode(text: &str) -> Self {
        let p: Vec<&str> = text.split('\u{1f}').collect();
        Self {
            db_url: p[0].into(),
            schema: (!p[1].is_empty()).then(|| p[1].to_owned()),
            redis_url: p[2].into(),
            namespace: p[3].into(),
            secs: p[4].parse().expect("seconds"),
        }
    }
}

/// `flush_floors`: per owner, the total its writer acknowledged and the
/// total whose flush returned `Ok`; row 0 holds the writer's tallies
/// (writes, flushes `Ok`, flushes that ran out of time).
async fn floors_table(db: &DatabaseConnection) {
    db.execute_unprepared(
        "CREATE TABLE flush_floors (owner BIGINT PRIMARY KEY, acked BIGINT NOT NULL, \
         confirmed BIGINT NOT NULL, owed BIGINT NOT NULL)",
    )
    .await
    .expect("create flush_floors");
    for owner in 0..=OWNERS {
        db.execute_unprepared(&format!(
            "INSERT INTO flush_floors VALUES ({owner}, 0, 0, 0)"
        ))
        .await
        .expect("a floor row");
    }
}

/// Sets a floor row, retrying what a busy shared SQLite file refuses.
async fn set_floor(db: &DatabaseConnection, owner: i64, column: &str, value: i64) {
    let sql = format!("UPDATE flush_floors SET {column} = {value} WHERE owner = {owner}");
    for attempt in 1.. {
        match db.execute_unprepared(&sql).await {
            Ok(_) => return,
            Err(e) if attempt < 50 => {
                eprintln!("writer: {sql}: {e}; again");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("{sql}: {e}"),
        }
    }
}

/// The floor rows, by owner: (acked, confirmed, owed).
async fn floors(db: &DatabaseConnection) -> Vec<(i64, i64, i64)> {
    let backend = db.get_database_backend();
    let rows = Sql::new(db)
        .query_all_raw(Statement::from_string(
            backend,
            "SELECT owner, acked, confirmed, owed FROM flush_floors ORDER BY owner",
        ))
        .await
        .expect("read the floors");
    rows.iter()
        .map(|row| {
            let get = |c: &str| row.try_get::<i64>("", c).expect("a number");
            (get("acked"), get("confirmed"), get("owed"))
        })
        .collect()
}

/// The writer: runs only in a process started by the test below (with
/// `COUNTER_CACHE_FLUSH_WRITER` set). Increments the owners in turn
/// through its cache, records each acknowledged total, flushes the
/// deletion owed (at most 250 ms) and records the total as confirmed when
/// the flush returned `Ok`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flush_writer_process() {
    let Ok(spec) = std::env::var(WRITER) else {
        return;
    };
    let spec = Spec::decode(&spec);
    let db = child::connect(&spec.db_url, spec.schema.as_deref()).await;
    // A tight Redis timeout, so a deletion that meets the pause fails
    // (and is owed) rather than waits it out.
    let cache = test_cache(
        RedisTarget::standalone(spec.redis_url.clone()),
        &spec.namespace,
    )
    .timeout(Duration::from_millis(50))
    .build()
    .await
    .expect("the writer's cache");
    let posts = cache.table(&counters::<i64>(TABLE, 4));
    let mut acked = [0i64; OWNERS as usize + 1];
    let (mut writes, mut confirmed, mut owed) = (0i64, 0i64, 0i64);
    let stop = Instant::now() + Duration::from_secs(spec.secs);
    while Instant::now() < stop && writes < 20_000 {
        let owner = 1 + writes % OWNERS;
        posts
            .increment(&db, owner, "likes")
            .await
            .expect("a write never fails because of Redis");
        writes += 1;
        acked[owner as usize] += 1;
        set_floor(&db, owner, "acked", acked[owner as usize]).await;
        match cache.flush_invalidations(Duration::from_millis(250)).await {
            Ok(()) => {
                confirmed += 1;
                set_floor(&db, owner, "confirmed", acked[owner as usize]).await;
            }
            Err(e) => {
                owed += 1;
                eprintln!("writer: {e}");
            }
        }
    }
    set_floor(&db, 0, "acked", writes).await;
    set_floor(&db, 0, "confirmed", confirmed).await;
    set_floor(&db, 0, "owed", owed).await;
    eprintln!(
        "writer: {writes} writes, {confirmed} flushed, {owed} owed; {:?}",
        cache.stats()
    );
}

backend_test! {
    /// Redis paused for writes 350 ms in every 700 while a writer process
    /// counts and flushes, and this process reads through its own cache:
    /// every read includes every write whose flush returned `Ok` before
    /// the read began.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[label = "cache_paused_writes"]
    async fn a_flushed_write_is_read_by_every_process(b: Backend) {
        if shared_url(b, "cache_paused_writes").is_none() {
            return;
        }
        let Some(shared) = child::SharedDb::open(b, "cache_paused_writes").await else {
            return;
        };
        let db = shared.db.clone();
        counters::<i64>(TABLE, 4)
            .create_table(&db)
            .await
            .expect("create the counter table");
        floors_table(&db).await;
        let server = Arc::new(PrivateRedis::start());
        let ns = namespace(b, "cache_paused_writes");
        let reader = test_cache(RedisTarget::standalone(server.url()), &ns)
            .timeout(Duration::from_millis(50))
            .build()
            .await
            .expect("the reader's cache");
        // Registered like any handle; this process never writes the table,
        // so no write of the writer reaches it.
        let posts = reader.table(&counters::<i64>(TABLE, 4));
        let secs = env_number("COUNTER_SOAK_SECS").unwrap_or(15).clamp(4, 10);
        let spec = Spec {
            db_url: shared.url.clone(),
            schema: shared.schema.clone(),
            redis_url: server.url(),
            namespace: ns,
            secs,
        };
        let writer = tokio::spawn(child::run(
            "flush::flush_writer_process",
            WRITER,
            spec.encode(),
        ));
        let done = Arc::new(AtomicBool::new(false));
        let pauses = Arc::new(AtomicU64::new(0));
        let pauser = {
            let (server, done, pauses) = (server.clone(), done.clone(), pauses.clone());
            tokio::task::spawn_blocking(move || {
                while !done.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(350));
                    if server.cli(&["CLIENT", "PAUSE", "350", "WRITE"]).is_some() {
                        pauses.fetch_add(1, Ordering::Relaxed);
                    }
                    std::thread::sleep(Duration::from_millis(350));
                }
            })
        };
        let owners: Vec<i64> = (1..=OWNERS).collect();
        let (mut reads, mut stale, mut stale_unconfirmed, mut worst) = (0u64, 0u64, 0u64, 0i64);
        while !writer.is_finished() {
            let floors = floors(&db).await;
            let got = posts
                .get_many(&db, &owners, &["likes"])
                .await
                .expect("a read never fails because of Redis");
            for owner in &owners {
                let (acked, confirmed, _) = floors[*owner as usize];
                let value = got[owner]["likes"];
                reads += 1;
                if value < confirmed {
                    stale += 1;
                    eprintln!("[{b}] owner {owner}: read {value}, but {confirmed} was flushed");
                }
                if value < acked {
                    stale_unconfirmed += 1;
                    worst = worst.max(acked - value);
                }
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        done.store(true, Ordering::Relaxed);
        pauser.await.expect("the pauser");
        let status = writer.await.expect("the writer");
        assert!(status.success(), "[{b}] the writer process failed: {status:?}");
        let tallies = floors(&db).await[0];
        let (writes, flushed, owed) = (tallies.0 as u64, tallies.1 as u64, tallies.2 as u64);
        figures(
            "cache_paused_writes",
            b,
            &[
                ("writes", writes),
                ("flushed", flushed),
                ("flushes_owed", owed),
                ("pauses", pauses.load(Ordering::Relaxed)),
                ("reads", reads),
                ("stale_reads", stale),
                ("stale_unconfirmed_reads", stale_unconfirmed),
                ("worst_unconfirmed_behind", worst as u64),
            ],
        );
        assert!(writes > 0 && reads > 0, "[{b}] writes {writes}, reads {reads}");
        assert!(flushed > 0, "[{b}] no flush returned Ok");
        // The pauses met flushes: the case the flush tells apart happened.
        assert!(owed > 0, "[{b}] no flush ran out of time under the pauses");
        assert_eq!(stale, 0, "[{b}] a read missed a write whose flush returned Ok");
        drop(reader);
        shared.finish().await;
    }
}

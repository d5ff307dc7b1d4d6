//! Read-your-write through the cache under concurrent readers: two
//! instances (processes of the real binary: in one process the caches
//! would hear each other's writes) on one database and one Redis, four clients reading one owner
//! without pause (their misses fill the cache, racing every add's
//! deletion), and a writer that adds with a key on one instance and reads
//! on the other right after the 200. Every read is checked: the writer's
//! must equal the adds acknowledged so far, a reader's must include every
//! add acknowledged before the read was sent. RELIABILITY.md 51.
//!
//! `COUNTER_TEST_CACHE_READS` sets the checked reads per backend (default
//! 20,000; CI runs 8,000 and RELIABILITY.md reports a run of 100,000).

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use counter_tests::{TestDb, backend_test, figures};
use serde_json::json;

use counter_tests::servers::free_port;
use tokio::process::Child;

use crate::support::{Api, NAMESPACES, Scratch, cache_section, config_text, spawn_binary};

const READERS: usize = 4;

/// The real binary serving `text`; its handle and its API.
async fn instance(text: &str, name: &str) -> (Child, Api) {
    let file = std::env::temp_dir().join(format!(
        "counter-service-{name}-{}.toml",
        std::process::id()
    ));
    std::fs::write(&file, text).unwrap();
    let port = free_port();
    let child = spawn_binary(&file, port).await;
    let _ = std::fs::remove_file(&file);
    (child, Api::new(format!("http://127.0.0.1:{port}")))
}

fn checked_reads_wanted() -> u64 {
    std::env::var("COUNTER_TEST_CACHE_READS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000)
}

async fn likes(api: &Api) -> u64 {
    api.totals("posts", None, json!([1]), json!(["likes"]))
        .await["1"]["likes"]
        .as_u64()
        .unwrap()
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_fills_never_hide_an_acknowledged_add(t: TestDb) {
        let Some(cache) = cache_section(&t) else {
            return t.finish().await;
        };
        let b = t.backend;
        let scratch = Scratch::of(&t).await;
        let text = config_text("open = true", &scratch, &format!("{NAMESPACES}\n{cache}"));
        let (mut first, first_api) = instance(&text, &format!("rw-a-{b}")).await;
        let (mut second, second_api) = instance(&text, &format!("rw-b-{b}")).await;
        let apis = [first_api, second_api];
        let wanted = checked_reads_wanted();
        let acked = Arc::new(AtomicU64::new(0));
        let checked = Arc::new(AtomicU64::new(0));
        let stale = Arc::new(AtomicU64::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let deadline = Instant::now() + Duration::from_secs(600);

        let readers: Vec<_> = (0..READERS)
            .map(|r| {
                let (apis, acked, checked, stale, done) = (apis.clone(), acked.clone(), checked.clone(), stale.clone(), done.clone());
                tokio::spawn(async move {
                    let mut n = r;
                    while !done.load(Ordering::Relaxed) {
                        let before = acked.load(Ordering::SeqCst);
                        let seen = likes(&apis[n % 2]).await;
                        checked.fetch_add(1, Ordering::Relaxed);
                        if seen < before {
                            stale.fetch_add(1, Ordering::Relaxed);
                            eprintln!("[reader {r}] saw {seen} after {before} acknowledged adds");
                        }
                        n += 1;
                    }
                })
            })
            .collect();

        let mut adds = 0u64;
        while checked.load(Ordering::Relaxed) < wanted && Instant::now() < deadline {
            adds += 1;
            let (on, then) = (&apis[(adds % 2) as usize], &apis[1 - (adds % 2) as usize]);
            let reply = on.post_keyed("/v1/posts/counters:add", None, &format!("rw-{adds}"), json!({"owner": 1, "key": "likes"})).await;
            assert_eq!(reply.status, 200, "[{b}] {reply:?}");
            acked.store(adds, Ordering::SeqCst);
            let seen = likes(then).await;
            checked.fetch_add(1, Ordering::Relaxed);
            if seen != adds {
                stale.fetch_add(1, Ordering::Relaxed);
                eprintln!("[writer] read {seen} on the other instance after {adds} acknowledged adds");
            }
        }
        done.store(true, Ordering::Relaxed);
        for reader in readers {
            reader.await.unwrap();
        }
        let mut failures = 0;
        let mut hits = 0;
        for api in &apis {
            failures += api.metric("counter_service_cache_invalidation_failures").await;
            hits += api.metric("counter_service_cache_hits_total").await;
        }
        let (checked, stale) = (checked.load(Ordering::Relaxed), stale.load(Ordering::Relaxed));
        figures(
            "service_cache_read_your_write",
            b,
            &[
                ("adds", adds),
                ("checked_reads", checked),
                ("owner_hits", hits),
                ("invalidation_failures", failures),
                ("stale_reads", stale),
            ],
        );
        assert!(checked >= wanted, "[{b}] only {checked} reads checked in 600 s");
        assert_eq!(stale, 0, "[{b}] reads that missed an acknowledged add");
        assert!(hits > 0, "[{b}] the cache served nothing");
        for child in [&mut first, &mut second] {
            child.start_kill().unwrap();
            child.wait().await.unwrap();
        }
        t.finish().await;
    }
}

backend_test! {
    /// The stale read's cause, made certain: the writer's connection to
    /// Redis is cut just before an add, so the deletion after its commit
    /// fails at first. The add must not be answered until a deletion has
    /// reached Redis; the other instance, whose Redis connection is whole
    /// and whose cache holds the old total, must then read the new one.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn an_add_is_answered_only_once_its_deletion_reached_redis(t: TestDb) {
        let Some(redis) = counter_tests::redis::shared_url(t.backend, t.label()) else {
            return t.finish().await;
        };
        let b = t.backend;
        let upstream = redis.trim_start_matches("redis://").trim_end_matches('/').to_owned();
        let proxy = counter_tests::proxy::Proxy::start(&upstream).await.unwrap();
        let namespace = counter_tests::redis::namespace(t.backend, t.label());
        let scratch = Scratch::of(&t).await;
        let cache = |url: String| format!("[cache]\nredis_url = \"{url}\"\nnamespace = \"{namespace}\"\n");
        let (mut writer_process, writer) = instance(&config_text("open = true", &scratch, &format!("{NAMESPACES}\n{}", cache(format!("redis://{}", proxy.addr())))), &format!("cut-w-{b}")).await;
        let (mut reader_process, reader) = instance(&config_text("open = true", &scratch, &format!("{NAMESPACES}\n{}", cache(redis.clone()))), &format!("cut-r-{b}")).await;
        let mut stale = 0;
        for round in 1..=5u64 {
            // The reader's cache holds the total before the add.
            assert_eq!(likes(&reader).await, round - 1, "[{b}]");
            assert_eq!(likes(&reader).await, round - 1, "[{b}]");
            proxy.cut_all();
            writer.post_keyed("/v1/posts/counters:add", None, &format!("cut-{round}"), json!({"owner": 1, "key": "likes"})).await.ok();
            let seen = likes(&reader).await;
            if seen != round {
                stale += 1;
                eprintln!("[{b}] round {round}: read {seen} after the add was acknowledged");
            }
        }
        let failures = writer.metric("counter_service_cache_invalidation_failures").await;
        figures("service_cache_cut_writer", b, &[("adds", 5), ("invalidation_failures", failures), ("stale_reads", stale)]);
        assert!(failures > 0, "[{b}] no deletion failed: the cut did not reach the writer's connection");
        assert_eq!(stale, 0, "[{b}] reads that missed an acknowledged add");
        for child in [&mut writer_process, &mut reader_process] {
            child.start_kill().unwrap();
            child.wait().await.unwrap();
        }
        t.finish().await;
    }
}

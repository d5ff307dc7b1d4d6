//! `CountCache::publish` and `subscribe`: processes sharing a cache hear
//! each other on its channels, and only theirs.

use std::time::Duration;

use counter_redis::{CountCache, RedisTarget};
use counter_tests::{
    TestDb, backend_test,
    redis::{namespace, shared_url, test_cache},
};

/// Every message published on `cache` reaches a subscriber of the same
/// cache (on a cluster in any order: each goes through a node of its own),
/// and nothing else arrives.
pub async fn heard_through(cache: &CountCache, what: &str) {
    let mut heard = cache.subscribe("pubsub-test").await.unwrap();
    for n in 0..3u8 {
        cache.publish("pubsub-test", &[b'm', n]).await.unwrap();
    }
    let mut messages = Vec::new();
    for n in 0..3u8 {
        let message = tokio::time::timeout(Duration::from_secs(5), heard.next()).await;
        messages
            .push(message.unwrap_or_else(|_| panic!("{what}: message {n} not heard within 5 s")));
    }
    messages.sort();
    assert_eq!(
        messages,
        (0..3u8).map(|n| Some(vec![b'm', n])).collect::<Vec<_>>(),
        "{what}"
    );
    let more = tokio::time::timeout(Duration::from_millis(200), heard.next()).await;
    assert!(more.is_err(), "{what}: {more:?}");
}

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn processes_hear_each_other_on_their_namespace_s_channels(t: TestDb) {
        let Some(url) = shared_url(t.backend, t.label()) else {
            return;
        };
        let ours = namespace(t.backend, t.label());
        let cache = |ns: String| {
            let url = url.clone();
            async move { test_cache(RedisTarget::standalone(url), &ns).build().await.unwrap() }
        };
        let (a, b, other) = (cache(ours.clone()).await, cache(ours.clone()).await, cache(format!("{ours}-other")).await);
        heard_through(&a, "[standalone]").await;
        let mut heard = b.subscribe("changes").await.unwrap();
        let mut elsewhere = other.subscribe("changes").await.unwrap();
        // One subscriber in this namespace: `other`'s channel is another.
        assert_eq!(a.publish("changes", b"post 7").await.unwrap(), 1);
        let message = tokio::time::timeout(Duration::from_secs(5), heard.next()).await;
        assert_eq!(message, Ok(Some(b"post 7".to_vec())));
        let stray = tokio::time::timeout(Duration::from_millis(200), elsewhere.next()).await;
        assert!(stray.is_err(), "another namespace heard it: {stray:?}");
        t.finish().await;
    }
}

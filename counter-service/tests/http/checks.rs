//! Check and fix beside writers: a business write (its row, then its add)
//! racing a check is never lost, and the next check leaves every count
//! equal to its rows.

use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};

use counter_tests::{TestDb, backend_test, figures};
use sea_orm::ConnectionTrait;
use serde_json::{Value, json};

use crate::support::{NAMESPACES, Running, Scratch, config_text};

const OWNERS: i64 = 20;
const WRITERS: u64 = 8;
const WRITES_EACH: u64 = 40;

backend_test! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 8)]
    async fn check_and_fix_beside_writers(t: TestDb) {
        let scratch = Scratch::of(&t).await;
        let service = Running::start(&config_text("open = true", &scratch, NAMESPACES)).await;
        let b = t.backend;
        let db = scratch.connect(&t).await;
        // Three comments per post, and counts seeded wrong: too many, too few, none.
        let mut id = 0;
        for owner in 1..=OWNERS {
            for _ in 0..3 {
                id += 1;
                db.execute_unprepared(&format!("INSERT INTO comments (id, post_id) VALUES ({id}, {owner})")).await.unwrap();
            }
            let seeded = owner % 3 * 2; // 0, 2, 4: none, too few, too many
            if seeded > 0 {
                service.post("/v1/posts/counters:add", None, json!({"owner": owner, "key": "comments", "delta": seeded})).await.ok();
            }
        }
        let found = service.run_job("/v1/posts/admin:check?dry_run=true", None).await;
        let seeded_drifted = found["checks"][0]["owners_drifted"].as_u64().unwrap();
        assert_eq!(seeded_drifted, OWNERS as u64, "[{b}] every owner was seeded wrong: {found}");

        // Writers do what a business service does: insert the row, then add
        // (with a key), while checks with repairs run again and again; other
        // clients add `likes` to the same owners.
        let next_id = Arc::new(AtomicU64::new(10_000));
        let mut writers = Vec::new();
        for w in 0..WRITERS {
            let (api, db, next_id) = (service.api.clone(), db.clone(), next_id.clone());
            writers.push(tokio::spawn(async move {
                for n in 0..WRITES_EACH {
                    let owner = 1 + ((w * WRITES_EACH + n) as i64 % OWNERS);
                    let id = next_id.fetch_add(1, Ordering::Relaxed);
                    db.execute_unprepared(&format!("INSERT INTO comments (id, post_id) VALUES ({id}, {owner})")).await.unwrap();
                    api.post_keyed("/v1/posts/counters:add", None, &format!("c-{id}"), json!({"owner": owner, "key": "comments"})).await.ok();
                    api.post_keyed("/v1/posts/counters:add", None, &format!("l-{id}"), json!({"owner": owner, "key": "likes"})).await.ok();
                }
            }));
        }
        let mut checks = 0u64;
        let mut repaired_during = 0u64;
        while writers.iter().any(|w| !w.is_finished()) {
            let report = service.run_job("/v1/posts/admin:check", None).await;
            repaired_during += report["checks"][0]["total_abs_drift"].as_u64().unwrap();
            checks += 1;
        }
        for writer in writers {
            writer.await.unwrap();
        }
        let writes = WRITERS * WRITES_EACH;

        // No add was lost: every count is at least its rows (a check that
        // saw a row before its add counts that add twice until the next
        // check), and the likes, never checked, are exact.
        let owners: Vec<Value> = (1..=OWNERS).map(Value::from).collect();
        let counts = service.totals("posts", None, json!(owners), json!(["comments", "likes"])).await;
        let rows = |owner: i64| 3 + (0..writes).filter(|i| 1 + (*i as i64 % OWNERS) == owner).count() as i64;
        let (mut over, mut lost, mut likes) = (0, 0, 0);
        for owner in 1..=OWNERS {
            let stored = counts[owner.to_string()]["comments"].as_i64().unwrap();
            over += (stored - rows(owner)).max(0);
            lost += (rows(owner) - stored).max(0);
            likes += counts[owner.to_string()]["likes"].as_i64().unwrap();
        }
        assert_eq!(likes as u64, writes, "[{b}] the likes beside the checks");
        // The next check repairs what the race over-counted; then nothing.
        service.run_job("/v1/posts/admin:check", None).await;
        let last = service.run_job("/v1/posts/admin:check?dry_run=true", None).await;
        assert_eq!(last["checks"][0]["owners_drifted"], 0, "[{b}] {last}");
        figures(
            "service_check_and_fix",
            b,
            &[("seeded_drifted", seeded_drifted), ("checks", checks), ("writes", writes), ("repaired_during", repaired_during), ("over_counted_by_races", over as u64), ("lost", lost as u64)],
        );
        assert_eq!(lost, 0, "[{b}] adds below their rows: a check undid a concurrent add");
        service.stop().await;
        t.finish().await;
    }
}

//! The app's request tests, with Loco's testing support: each test boots
//! the app on a database of its own (SQLite by default; PostgreSQL when
//! `DATABASE_URL` names one), migrated by the app's `Migrator`.

use axum_test::TestServer;
use counter_core::{CounterCache, CounterError, ErrorKind, SlottedCounter};
use loco_rs::{
    app::Hooks,
    task::{Task, Vars},
    testing::prelude::*,
};
use notes_app::{
    app::App,
    models::{comments, notes},
    tasks::recount::Recount,
};
use sea_orm::{ActiveModelTrait, EntityTrait, Set};
use serde_json::{Value, json};

/// Loco drops a test's database before the app's pool (`BootResultWrapper`
/// cleans up in its own `Drop`, before its fields), and PostgreSQL will not
/// drop a database in use: every test ends by closing the pool.
async fn done(ctx: &loco_rs::app::AppContext) {
    ctx.db.close_by_ref().await.unwrap();
}

async fn note(request: &TestServer, id: i32) -> Value {
    let response = request.get(&format!("/api/notes/{id}")).await;
    response.assert_status_ok();
    response.json::<Value>()
}

#[tokio::test]
async fn likes_views_and_comments_are_counted() {
    request_with_create_db::<App, _, _>(|request, ctx| async move {
        seed::<App>(&ctx).await.unwrap();
        // The fixtures' two comments of note 1 went in by `insert_many`;
        // the seed's recount made the counter cache exact.
        let seeded = note(&request, 1).await;
        assert_eq!(
            seeded["counts"],
            json!({"likes": 0, "comments": 2, "views": 1})
        );

        for _ in 0..3 {
            request.post("/api/notes/1/like").await.assert_status_ok();
        }
        let added = request
            .post("/api/notes/1/comments")
            .json(&json!({"body": "third"}))
            .await;
        added.assert_status_ok();
        let comment_id = added.json::<Value>()["id"].as_i64().unwrap();
        assert_eq!(
            note(&request, 1).await["counts"],
            json!({"likes": 3, "comments": 3, "views": 2})
        );

        request
            .delete(&format!("/api/comments/{comment_id}"))
            .await
            .assert_status_ok();
        // A second delete of the same comment finds nothing to uncount.
        request
            .delete(&format!("/api/comments/{comment_id}"))
            .await
            .assert_status_not_found();
        assert_eq!(note(&request, 1).await["counts"]["comments"], 2);
        assert_eq!(comments::Entity::check_counters(&ctx.db).await.unwrap(), 0);
        done(&ctx).await;
    })
    .await;
}

#[tokio::test]
async fn a_new_note_created_over_the_api_starts_at_zero() {
    request_with_create_db::<App, _, _>(|request, ctx| async move {
        let created = request
            .post("/api/notes")
            .json(&json!({"title": "fresh"}))
            .await;
        created.assert_status_ok();
        let id = created.json::<Value>()["id"].as_i64().unwrap();
        assert_eq!(
            note(&request, id as i32).await["counts"],
            json!({"likes": 0, "comments": 0, "views": 1})
        );
        // Likes for a note that does not exist: the counter table
        // references `notes` (`cascade`), so the write is refused, not kept.
        let missing = request.post("/api/notes/999/like").await;
        assert!(
            missing.status_code().is_server_error(),
            "{}",
            missing.status_code()
        );
        done(&ctx).await;
    })
    .await;
}

#[tokio::test]
async fn truncate_and_seed_never_leave_counts_behind() {
    request_with_create_db::<App, _, _>(|request, ctx| async move {
        seed::<App>(&ctx).await.unwrap();
        for _ in 0..5 {
            request.post("/api/notes/2/like").await.assert_status_ok();
        }
        // What Loco's test boot does: truncate (`delete_many`), seed again
        // with the same ids.
        App::truncate(&ctx).await.unwrap();
        seed::<App>(&ctx).await.unwrap();
        assert_eq!(
            note(&request, 2).await["counts"],
            json!({"likes": 0, "comments": 1, "views": 1})
        );
        done(&ctx).await;
    })
    .await;
}

#[tokio::test]
async fn a_plain_insert_meets_the_counter_cache() {
    request_with_create_db::<App, _, _>(|_request, ctx| async move {
        seed::<App>(&ctx).await.unwrap();
        let row = comments::ActiveModel {
            note_id: Set(1),
            body: Set("on the pool".into()),
            ..Default::default()
        };
        let refused = CounterError::from(row.insert(&ctx.db).await.unwrap_err());
        println!("a plain insert on the pool: {refused}");
        assert_eq!(refused.kind(), ErrorKind::Misuse);
        assert!(refused.to_string().contains("requests.rs:"), "{refused}");
        // Nothing was written.
        assert_eq!(
            comments::Entity::find().all(&ctx.db).await.unwrap().len(),
            3
        );
        assert_eq!(comments::Entity::check_counters(&ctx.db).await.unwrap(), 0);
        done(&ctx).await;
    })
    .await;
}

#[tokio::test]
async fn the_recount_task_repairs_writes_that_bypassed_the_hooks() {
    request_with_create_db::<App, _, _>(|request, ctx| async move {
        seed::<App>(&ctx).await.unwrap();
        // An import behind the hooks' back.
        let imported = (0..4).map(|i| comments::ActiveModel {
            note_id: Set(2),
            body: Set(format!("imported {i}")),
            ..Default::default()
        });
        comments::Entity::insert_many(imported)
            .exec(&ctx.db)
            .await
            .unwrap();
        assert_eq!(comments::Entity::check_counters(&ctx.db).await.unwrap(), 1);

        let dry = Vars::from_cli_args(vec![("dry_run".into(), "true".into())]);
        Recount.run(&ctx, &dry).await.unwrap();
        assert_eq!(
            notes::Entity::counters()
                .counts(&ctx.db, 2)
                .await
                .unwrap()
                .comments,
            1
        );
        Recount.run(&ctx, &Vars::default()).await.unwrap();
        assert_eq!(note(&request, 2).await["counts"]["comments"], 5);
        done(&ctx).await;
    })
    .await;
}

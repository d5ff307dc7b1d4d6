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
use sea_orm::{ActiveModelTrait, EntityTrait, IntoActiveModel, Set};
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

/// The `comments` counts of notes 1 and 2 (each read counts a view).
async fn comment_counts(request: &TestServer) -> (i64, i64) {
    let of = |note: Value| note["counts"]["comments"].as_i64().unwrap();
    (of(note(request, 1).await), of(note(request, 2).await))
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
        // The refusal names this file's line that wrote the row, through
        // the model's own behaviour impl.
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

#[tokio::test]
async fn the_models_own_behaviour_stamps_updated_at_and_keeps_the_counts() {
    request_with_create_db::<App, _, _>(|request, ctx| async move {
        seed::<App>(&ctx).await.unwrap();

        // Insert: both timestamps are the database's default (Loco's
        // `before_save` leaves an insert alone), and the note counts it.
        let added = request
            .post("/api/notes/1/comments")
            .json(&json!({"body": "draft"}))
            .await;
        added.assert_status_ok();
        let added = added.json::<comments::Model>();
        assert_eq!(added.updated_at, added.created_at);
        assert_eq!(comment_counts(&request).await, (3, 1));

        // Update that moves it to note 2, in `update_counted`'s
        // transaction: `updated_at` stamped, the count moved.
        let moved = request
            .patch(&format!("/api/comments/{}", added.id))
            .json(&json!({"note_id": 2, "body": "moved"}))
            .await;
        moved.assert_status_ok();
        let moved = moved.json::<comments::Model>();
        assert_eq!((moved.note_id, moved.body.as_str()), (2, "moved"));
        assert_eq!(moved.created_at, added.created_at);
        assert!(
            moved.updated_at > added.updated_at,
            "{moved:?} after {added:?}"
        );
        assert_eq!(comment_counts(&request).await, (2, 2));

        // An update that sets no counted column changes no counter, so it
        // may run on the pool: `updated_at` stamped again, counts alone.
        let mut edit = comments::Entity::find_by_id(added.id)
            .one(&ctx.db)
            .await
            .unwrap()
            .unwrap()
            .into_active_model();
        edit.body = Set("edited".into());
        let edited = edit.update(&ctx.db).await.unwrap();
        assert!(
            edited.updated_at > moved.updated_at,
            "{edited:?} after {moved:?}"
        );
        assert_eq!(comment_counts(&request).await, (2, 2));

        // Delete: uncounted from the note it was moved to.
        request
            .delete(&format!("/api/comments/{}", added.id))
            .await
            .assert_status_ok();
        assert_eq!(comment_counts(&request).await, (2, 1));
        assert_eq!(comments::Entity::check_counters(&ctx.db).await.unwrap(), 0);
        done(&ctx).await;
    })
    .await;
}

#[tokio::test]
async fn the_doctor_check_finds_a_table_that_differs_from_its_declaration() {
    request_with_create_db::<App, _, _>(|_request, ctx| async move {
        use loco_rs::{app::Initializer, doctor::CheckStatus};
        use notes_app::initializers::counter_tables::CounterTables;
        use sea_orm::ConnectionTrait;

        // Migrated by the app's `Migrator`: as declared.
        let check = CounterTables.check(&ctx).await.unwrap().unwrap();
        assert_eq!(check.status, CheckStatus::Ok, "{check:?}");

        // A table that lost its key index (or never got one).
        ctx.db
            .execute_unprepared("DROP INDEX notes_counters_by_key")
            .await
            .unwrap();
        let check = CounterTables.check(&ctx).await.unwrap().unwrap();
        assert_eq!(check.status, CheckStatus::NotOk, "{check:?}");
        let found = check.description.unwrap_or_default();
        println!("cargo loco doctor: {}: {found}", check.message);
        assert!(
            found.contains("notes_counters") && found.contains("key index"),
            "{found}"
        );
        done(&ctx).await;
    })
    .await;
}

//! `/api/notes`: notes, likes, views and comments (added, edited or moved
//! to another note, deleted). Every counter call's `?` turns a
//! `CounterError` into Loco's error by its kind (counter-core's `loco`
//! feature): bad input 400, transient 503, the rest 500.

use counter_core::{CounterCache, SlottedCounter};
use loco_rs::prelude::*;
use sea_orm::Set;
use serde::{Deserialize, Serialize};

use crate::models::{comments, notes};

#[derive(Deserialize)]
pub struct NewNote {
    pub title: String,
}

#[derive(Deserialize)]
pub struct NewComment {
    pub body: String,
}

#[derive(Deserialize)]
pub struct CommentChanges {
    pub body: Option<String>,
    /// Moves the comment to another note.
    pub note_id: Option<i32>,
}

#[derive(Serialize)]
pub struct NoteView {
    pub id: i32,
    pub title: String,
    pub counts: notes::counters::Counts,
}

async fn create(State(ctx): State<AppContext>, Json(new): Json<NewNote>) -> Result<Response> {
    let note = notes::ActiveModel {
        title: Set(new.title),
        ..Default::default()
    }
    .insert(&ctx.db)
    .await?;
    format::json(note)
}

async fn show(State(ctx): State<AppContext>, Path(id): Path<i32>) -> Result<Response> {
    let Some(note) = notes::Entity::find_by_id(id).one(&ctx.db).await? else {
        return not_found();
    };
    // A view counts before the read, so the reader sees its own view.
    let counters = notes::Entity::counters();
    counters
        .increment(&ctx.db, id, notes::counters::Key::Views)
        .await?;
    let counts = counters.counts(&ctx.db, id).await?;
    format::json(NoteView {
        id: note.id,
        title: note.title,
        counts,
    })
}

async fn like(State(ctx): State<AppContext>, Path(id): Path<i32>) -> Result<Response> {
    let counters = notes::Entity::counters();
    counters
        .increment(&ctx.db, id, notes::counters::Key::Likes)
        .await?;
    format::json(counters.counts(&ctx.db, id).await?)
}

async fn comment(
    State(ctx): State<AppContext>,
    Path(id): Path<i32>,
    Json(new): Json<NewComment>,
) -> Result<Response> {
    // `insert_counted` writes the row and its count in one transaction; a
    // plain `.insert(&ctx.db)` would be refused (see the request tests).
    let row = comments::ActiveModel {
        note_id: Set(id),
        body: Set(new.body),
        ..Default::default()
    };
    let comment = comments::Entity::insert_counted(&ctx.db, row).await?;
    format::json(comment)
}

async fn edit_comment(
    State(ctx): State<AppContext>,
    Path(id): Path<i32>,
    Json(changes): Json<CommentChanges>,
) -> Result<Response> {
    let Some(row) = comments::Entity::find_by_id(id).one(&ctx.db).await? else {
        return not_found();
    };
    let mut am = row.into_active_model();
    if let Some(body) = changes.body {
        am.body = Set(body);
    }
    if let Some(note_id) = changes.note_id {
        am.note_id = Set(note_id);
    }
    // The model's `before_save` stamps `updated_at`, then moves the count
    // from the old note to the new one; `update_counted` runs it all in
    // one transaction.
    let comment = comments::Entity::update_counted(&ctx.db, am).await?;
    format::json(comment)
}

async fn uncomment(State(ctx): State<AppContext>, Path(id): Path<i32>) -> Result<Response> {
    let Some(row) = comments::Entity::find_by_id(id).one(&ctx.db).await? else {
        return not_found();
    };
    comments::Entity::delete_counted(&ctx.db, row.into()).await?;
    format::empty()
}

pub fn routes() -> Routes {
    Routes::new()
        .prefix("/api")
        .add("/notes", post(create))
        .add("/notes/{id}", get(show))
        .add("/notes/{id}/like", post(like))
        .add("/notes/{id}/comments", post(comment))
        .add("/comments/{id}", patch(edit_comment).delete(uncomment))
}

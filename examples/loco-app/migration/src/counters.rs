//! The app's counters, declared where the migrations and the app both
//! see them. The app binds them to its generated entities in
//! `src/models/notes.rs` with `counter_core::slotted_counter!`.

counter_core::counter_table! {
    /// A note's counters: likes and views written directly, `comments`
    /// kept by the counter cache of `src/models/comments.rs`. `cascade`:
    /// deleting a note (or truncating `notes`, as Loco's test boot does)
    /// deletes its counts, so a new note with the same id starts at zero.
    #[counter(
        owner = "notes",
        owner_id = i32,
        keys(likes, comments, views(slots = 64, window = day)),
        cascade
    )]
    pub mod note_counters;
}

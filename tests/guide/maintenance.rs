// docs/guide/maintenance.md: the blog's posts (views counted per day).
include!("blog.rs");

pub struct World {
    pub db: DatabaseConnection,
    pub id: i64,
    pub ids: Vec<i64>,
    pub at: DateTime<Utc>,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub now: DateTime<Utc>,
    pub last: counter_core::Ranked<i64>,
}

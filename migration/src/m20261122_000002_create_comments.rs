//! The child table of the `comments` counter cache: `comments`, indexed by
//! post.

use sea_orm_migration::{prelude::*, sea_orm::DbBackend};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Comments {
    Table,
    Id,
    PostId,
    AuthorId,
    Body,
}

/// The index the recount (`GROUP BY post_id`) and a post's comment list use.
const POST_INDEX: &str = "idx_comments_post_id";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // No foreign key to `posts`, on purpose: every comment insert would
        // check it with a shared lock on the post's row (InnoDB), so the
        // comments of a hot post would queue behind any writer of that row,
        // the queue the slotted counters exist to avoid. The application
        // checks that the post exists before inserting.
        //
        // No `if_not_exists` on the table or the index: a migration runs
        // once (the migrator records it), and sea-query's MySQL builder
        // drops `IF NOT EXISTS` from `CREATE INDEX`, so tolerating an
        // existing table there would fail on its index anyway. A leftover
        // `comments` table is an error on every backend alike.
        let mut table = Table::create();
        table
            .table(Comments::Table)
            .col(
                ColumnDef::new(Comments::Id)
                    .big_integer()
                    .not_null()
                    .auto_increment()
                    .primary_key(),
            )
            .col(ColumnDef::new(Comments::PostId).big_integer().not_null())
            .col(ColumnDef::new(Comments::AuthorId).big_integer().not_null())
            // TEXT: bodies up to 2,000 characters (blog-server checks),
            // which is past VARCHAR(255) and, in utf8mb4, too many bytes for
            // a comfortable VARCHAR.
            .col(ColumnDef::new(Comments::Body).text().not_null());
        // Bodies are user text: emoji and other characters outside the
        // Basic Multilingual Plane included. MySQL's `utf8` (utf8mb3) and
        // latin1 cannot store them (error 1366), and a table takes its
        // database's default, so it is set here. Only on MySQL/MariaDB:
        // sea-query renders these options as `DEFAULT CHARSET=... COLLATE=...`
        // on every backend, which PostgreSQL and SQLite reject, and both
        // store any UTF-8 as it is. `utf8mb4_unicode_ci` exists on MySQL 5.7,
        // 8 and MariaDB alike.
        if manager.get_database_backend() == DbBackend::MySql {
            table.character_set("utf8mb4").collate("utf8mb4_unicode_ci");
        }
        manager.create_table(table).await?;
        manager
            .create_index(
                Index::create()
                    .name(POST_INDEX)
                    .table(Comments::Table)
                    .col(Comments::PostId)
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // The index goes with the table on every backend.
        manager
            .drop_table(Table::drop().table(Comments::Table).to_owned())
            .await
    }
}

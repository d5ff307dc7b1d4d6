//! The child table of the `comments` counter cache: `comments`, indexed by
//! post.

use sea_orm_migration::prelude::*;

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
        manager
            .create_table(
                Table::create()
                    .table(Comments::Table)
                    .if_not_exists()
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
                    // which is past VARCHAR(255) and, on MySQL with utf8mb4,
                    // too many bytes for a comfortable VARCHAR.
                    .col(ColumnDef::new(Comments::Body).text().not_null())
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name(POST_INDEX)
                    .table(Comments::Table)
                    .col(Comments::PostId)
                    .if_not_exists()
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

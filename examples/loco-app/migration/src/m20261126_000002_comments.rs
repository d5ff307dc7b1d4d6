use loco_rs::schema::table_auto_tz;
use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Comments {
    Table,
    Id,
    NoteId,
    Body,
}

#[derive(DeriveIden)]
enum Notes {
    Table,
    Id,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                // Loco's table: `created_at` and `updated_at` (timestamp with
                // time zone, default now), as `loco_rs::schema::create_table`
                // makes them.
                table_auto_tz(Comments::Table)
                    .col(pk_auto(Comments::Id))
                    .col(integer(Comments::NoteId))
                    .col(string(Comments::Body))
                    .foreign_key(
                        ForeignKey::create()
                            .name("fk-comments-note_id")
                            .from(Comments::Table, Comments::NoteId)
                            .to(Notes::Table, Notes::Id)
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .to_owned(),
            )
            .await?;
        // The recount of the counter cache groups by it.
        manager
            .create_index(
                Index::create()
                    .name("idx-comments-note_id")
                    .table(Comments::Table)
                    .col(Comments::NoteId)
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(Comments::Table).to_owned())
            .await
    }
}

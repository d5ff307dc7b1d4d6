// docs/guide/adoption.md: the entities sea-orm-cli generated for a Loco
// app (from PostgreSQL) and the migration crate's declaration.
include!("common.rs");

pub mod _entities {
    pub mod notes {
        use sea_orm::entity::prelude::*;

        #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
        #[sea_orm(table_name = "notes")]
        pub struct Model {
            pub created_at: DateTimeWithTimeZone,
            pub updated_at: DateTimeWithTimeZone,
            #[sea_orm(primary_key)]
            pub id: i32,
            pub title: String,
        }

        #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
        pub enum Relation {}
    }

    pub mod comments {
        use sea_orm::entity::prelude::*;

        #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
        #[sea_orm(table_name = "comments")]
        pub struct Model {
            pub created_at: DateTimeWithTimeZone,
            pub updated_at: DateTimeWithTimeZone,
            #[sea_orm(primary_key)]
            pub id: i32,
            pub note_id: i32,
            pub body: String,
        }

        #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
        pub enum Relation {}
    }
}

/// The migration crate (`migration::counters`).
pub mod migration {
    pub mod counters {
        counter_core::counter_table! {
            #[counter(owner = "notes", owner_id = i32, keys(likes, comments, views(slots = 64, window = day)), cascade)]
            pub mod note_counters;
        }
    }
}

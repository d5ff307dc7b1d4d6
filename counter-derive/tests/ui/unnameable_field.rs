// A field named `_1` has no `Column` variant (in UpperCamelCase it is `1`):
// an error at the field, from either derive, where `Ident::new` would panic.
// (sea-orm's own DeriveEntityModel panics on it, so it is not used here.)
mod post {
    use sea_orm::FromQueryResult;

    #[derive(FromQueryResult, counter_core::SlottedCounter)]
    #[sea_orm(table_name = "posts")]
    #[counter(keys(likes))]
    pub struct Model {
        #[sea_orm(primary_key)]
        pub _1: i64,
    }
}

mod comment {
    #[derive(counter_derive::CounterCache)]
    #[counter_cache(parent = super::post::Entity, key = likes, via = _1)]
    pub struct Model {
        pub id: i64,
        pub _1: i64,
    }
}

fn main() {}

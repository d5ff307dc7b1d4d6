use counter_core::SlottedCounter;

// Not a `Model`.
#[derive(SlottedCounter)]
#[counter(keys(likes))]
pub struct Post {
    pub id: i64,
}

// Not a struct.
#[derive(SlottedCounter)]
#[counter(keys(likes))]
pub enum Model {
    A,
}

mod no_table {
    use counter_core::SlottedCounter;

    // A `Model` without `#[sea_orm(table_name = "...")]`.
    #[derive(SlottedCounter)]
    #[counter(keys(likes))]
    pub struct Model {
        pub id: i64,
    }
}

fn main() {}

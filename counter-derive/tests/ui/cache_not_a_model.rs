// Not a struct.
#[derive(counter_derive::CounterCache)]
#[counter_cache(parent = super::post::Entity, key = comments, via = post_id)]
pub enum Model {
    A,
}

// Not a struct with named fields.
mod tuple {
    #[derive(counter_derive::CounterCache)]
    #[counter_cache(parent = super::post::Entity, key = comments, via = post_id)]
    pub struct Model(i64);
}

// Not named `Model`, and without an attribute: a cache would not help, so
// only the place is reported.
mod named {
    #[derive(counter_derive::CounterCache)]
    pub struct Comment {
        pub id: i64,
    }
}

fn main() {}

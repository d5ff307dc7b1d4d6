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

fn main() {}

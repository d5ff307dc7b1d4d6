// docs/guide/scale.md: counter tables built by hand, Galera nodes.
include!("common.rs");

pub struct World {
    pub node_index: u16,
    pub node_count: u16,
    pub table: CounterTable,
    pub post_table: CounterTable,
}

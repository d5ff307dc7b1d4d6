// The crates' common names and nothing else: for blocks that declare their
// own entities or tables.
include!("common.rs");

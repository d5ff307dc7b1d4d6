pub mod recount;

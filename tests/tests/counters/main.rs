//! The counters on every backend: reads, owner key types, the example's
//! entity, the derive, errors, transactions, concurrency, windows, rankings,
//! compaction and migrations. One test binary, one module per area; each
//! test is registered per backend (`reads::…::postgres`).

mod adaptive;
mod adoption;
mod compaction;
mod concurrency;
mod derive;
mod entity;
mod errors;
mod logs;
mod migrations;
mod overflow;
mod owners;
mod ranking;
mod reads;
mod regions;
mod resets;
mod round_trips;
mod transactions;
mod unique;
mod windows;

//! The write-behind buffer on every backend: flushes under concurrent
//! producers, the flush ledger, and a restart of the server behind it. One
//! test binary, one module per area; each test is registered per backend.

mod buffer;
mod buffer_ledger;
mod buffer_restart;
mod buffer_unique;

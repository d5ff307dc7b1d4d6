//! The reliability suite (RELIABILITY.md) on every backend: faults, the
//! soak, the model-based property tests, hostile input, dropped calls and
//! the private Galera cluster's suite.
//! One test binary, one module per area; each test is registered per
//! backend. Each test reports its figures with `counter_tests::figures`.

mod cancellation;
mod fault_kinds;
mod faults;
mod galera;
mod hostile;
mod model;
mod pooler;
mod regions;
mod soak;

//! What the service does, without HTTP: namespaces and their owners, adds
//! and observes through group-committing queues, the idempotency ledger,
//! tokens and their rates, maintenance jobs, checks against the business
//! tables, the queue feed, read-your-write through the cache, reads from
//! standbys, and the totals pushed to watch streams. Nothing here imports
//! `api`, `state` or `service`, or axum: a module here returns a
//! [`Problem`](crate::problem::Problem) and the HTTP layer renders it.

pub(crate) mod adds;
pub(crate) mod admission;
pub(crate) mod auth;
pub(crate) mod check;
pub(crate) mod feed;
pub(crate) mod freshness;
pub(crate) mod health;
pub(crate) mod idempotency;
pub mod jobs;
pub(crate) mod namespace;
pub(crate) mod observes;
pub(crate) mod owner;
pub(crate) mod rate;
pub(crate) mod regions;
pub(crate) mod replicas;
pub(crate) mod schema;
pub(crate) mod watch;
pub(crate) mod writes;

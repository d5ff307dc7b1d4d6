//! The service over real HTTP, on every configured backend: each test
//! starts it (in process, or the real binary) on a scratch database of its
//! own and calls it as a client in any language would.

mod auth;
mod browser;
mod cache_reads;
mod checks;
mod connections;
mod console;
mod cors;
mod dashboards;
mod endpoints;
mod failover;
mod fleet;
mod guide;
mod hostile;
mod idempotency;
mod int64;
mod jobs;
mod lifecycle;
mod load;
mod logs;
mod metrics;
mod overload;
mod patroni;
mod regions;
mod replicas;
mod support;
mod topology;
mod unique;
mod watch;
mod watchers;

//! The counting service: slotted counters behind an HTTP API and a queue,
//! for services in any language.
//!
//! Business services stop computing counts. They call the service (an add
//! with an `Idempotency-Key` is applied exactly once, a retry gets the
//! first answer) or publish to a queue it consumes (`counter-mq`); a page
//! fetches many owners' counts in one batch get, served through a Redis
//! cache when one is configured (`counter-redis`); keys declared `unique`
//! count distinct members (observes are retry-safe as they are: a member
//! merged twice counts once); the service checks its
//! counts against the business tables and repairs them (the library's
//! recount). Namespaces, tokens and bounds come from one TOML file
//! ([`config`]).
//!
//! The crate is the binary `counter-service` and the library it is built
//! from, for tests and for embedding the router in a process of your own:
//!
//! ```no_run
//! # async fn f() -> Result<(), Box<dyn std::error::Error>> {
//! use counter_service::{Config, Service};
//!
//! let config = Config::demo(&[])?;
//! let service = Service::start(config).await?;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! service.serve(listener, async { tokio::signal::ctrl_c().await.ok(); }).await?;
//! # Ok(()) }
//! ```
//!
//! The guide's `service` chapter (`docs/guide/service.md`) has the API,
//! the guarantees and the deployment notes.

#![warn(missing_docs)]

// The layers, bottom up (ARCHITECTURE.md): `config`, `problem` and
// `metrics` import nothing above them; `domain` (counting, idempotency,
// tokens, jobs, checks, the feed, replicas) imports no HTTP; `state` wires
// the domain together; `api` is the HTTP layer on top; `service` and
// `local` are the entry points.
pub mod api;
pub mod config;
mod domain;
mod local;
mod metrics;
mod preflight;
mod problem;
mod service;
mod state;

pub use config::{Config, ConfigError};
pub use domain::jobs;
pub use local::Local;
pub use problem::ProblemBody;
pub use service::{Service, StartError, pool_options};

use domain::namespace::dispatch;

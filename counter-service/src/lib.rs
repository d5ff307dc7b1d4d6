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

mod adds;
pub mod api;
mod auth;
mod check;
pub mod config;
mod connections;
mod console;
mod feed;
mod freshness;
mod idempotency;
pub mod jobs;
mod local;
mod metrics;
mod namespace;
mod observes;
mod owner;
mod problem;
mod rate;
mod replicas;
mod service;
mod state;

pub use config::{Config, ConfigError};
pub use local::Local;
pub use problem::ProblemBody;
pub use service::{Service, StartError};

use namespace::dispatch;

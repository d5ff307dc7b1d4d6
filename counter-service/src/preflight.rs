//! Every rule `serve` applies before it connects to anything: the file's
//! own ([`Config::check_own`]), then what building the namespaces and the
//! tokens refuses. Above both `config` and `domain`, so that `config`
//! imports nothing of the crate.

use crate::{
    config::{Config, ConfigError},
    domain::{auth::Tokens, namespace::Namespace},
};

impl Config {
    /// Every rule `serve` applies before it connects to anything, with all
    /// the refusals at once ([`ConfigError::Several`] when there are more
    /// than one): the server's bounds, the namespaces and their keys, the
    /// tokens (their secrets read from the environment), the database pool,
    /// the idempotency retention, the cache's and the broker's settings.
    /// `check-config` runs it; `serve` runs it first.
    pub fn check(&self) -> Result<(), ConfigError> {
        let mut errors = Vec::new();
        errors.extend(self.server.check().err());
        errors.extend(Namespace::build_all(self).err());
        errors.extend(
            Tokens::build(self.server.open, &self.tokens, &self.namespaces, |var| {
                std::env::var(var).ok()
            })
            .err(),
        );
        errors.extend(self.check_own());
        ConfigError::all(errors)
    }
}

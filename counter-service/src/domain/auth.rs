//! Bearer tokens: who may call, with which scopes, on which namespaces.
//!
//! A request's token is compared with every configured secret in constant
//! time (`subtle`), all of them, so neither a match's position nor a
//! prefix shows in the answer's timing. Secrets never reach a log line:
//! the token's `name` does.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Instant,
};

use subtle::ConstantTimeEq;

use crate::{
    config::{ConfigError, Scope, TokenConfig},
    domain::rate::RateLimit,
    problem::Problem,
};

/// The shortest secret accepted.
const MIN_SECRET_LEN: usize = 16;

/// The configured tokens, or none at all when the service is open.
#[derive(Debug)]
pub(crate) struct Tokens {
    open: bool,
    tokens: Vec<Arc<Token>>,
}

/// One token, as the service keeps it.
#[derive(Debug)]
pub(crate) struct Token {
    pub name: String,
    secret: Secret,
    scopes: BTreeSet<Scope>,
    /// `None`: every namespace.
    namespaces: Option<BTreeSet<String>>,
    limit: Option<RateLimit>,
}

struct Secret(Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Who is calling: found by [`Tokens::identify`], once per API request.
#[derive(Debug, Clone)]
pub(crate) enum Caller {
    /// An open service: everything is allowed.
    Open,
    /// A token holder.
    Token(Arc<Token>),
}

impl Caller {
    /// `Ok` if the caller may act with `scope` on `namespace`; 403 naming
    /// what is missing otherwise.
    pub fn allow(&self, namespace: &str, scope: Scope) -> Result<(), Problem> {
        let Caller::Token(token) = self else {
            return Ok(());
        };
        if !token.scopes.contains(&scope) {
            return Err(Problem::forbidden(format!(
                "the token `{}` lacks the `{scope}` scope",
                token.name
            )));
        }
        if token
            .namespaces
            .as_ref()
            .is_some_and(|n| !n.contains(namespace))
        {
            return Err(Problem::forbidden(format!(
                "the token `{}` may not touch this namespace",
                token.name
            )));
        }
        Ok(())
    }

    /// Whether the caller may act with `scope` on `namespace`: what
    /// [`Caller::allow`] answers, without the problem.
    pub fn may(&self, namespace: &str, scope: Scope) -> bool {
        self.allow(namespace, scope).is_ok()
    }

    /// The caller's scopes: all of them on an open service.
    pub fn scopes(&self) -> Vec<Scope> {
        match self {
            Caller::Open => vec![Scope::Read, Scope::Write, Scope::Admin],
            Caller::Token(token) => token.scopes.iter().copied().collect(),
        }
    }

    /// The name logs and metrics use.
    pub fn name(&self) -> &str {
        match self {
            Caller::Open => "open",
            Caller::Token(token) => &token.name,
        }
    }

    /// The token's name; `None` for an open service.
    pub fn token(&self) -> Option<&str> {
        match self {
            Caller::Open => None,
            Caller::Token(token) => Some(&token.name),
        }
    }
}

impl Tokens {
    /// The configured tokens' names (none for an open service).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tokens.iter().map(|t| t.name.as_str())
    }

    /// The tokens of the configuration, their secrets read from the
    /// environment where they say so; `namespaces` are the declared ones.
    /// Every refusal of every token at once ([`ConfigError::Several`]),
    /// as `check-config` lists them.
    pub fn build(
        open: bool,
        configs: &[TokenConfig],
        namespaces: &BTreeMap<String, impl Sized>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        if !open && configs.is_empty() {
            return Err(ConfigError::invalid(
                "tokens",
                "no tokens are configured: add `[[tokens]]` (or set `server.open = true` for a service only local callers reach)",
            ));
        }
        let mut names = BTreeSet::new();
        let mut tokens = Vec::new();
        let mut errors = Vec::new();
        for (i, config) in configs.iter().enumerate() {
            let at = format!("tokens.{i}");
            let before = errors.len();
            if config.name.is_empty() || !names.insert(config.name.clone()) {
                errors.push(ConfigError::invalid(
                    format!("{at}.name"),
                    "each token has a name of its own",
                ));
            }
            let secret = match (&config.secret, &config.secret_env) {
                (Some(secret), None) => Some(secret.clone()),
                (None, Some(var)) => {
                    let value = env(var);
                    if value.is_none() {
                        errors.push(ConfigError::invalid(
                            format!("{at}.secret_env"),
                            format!(
                                "the environment variable `{var}` is not set (in the environment, or in `env_file`)"
                            ),
                        ));
                    }
                    value
                }
                _ => {
                    errors.push(ConfigError::invalid(
                        at.clone(),
                        "a token has exactly one of `secret` and `secret_env`",
                    ));
                    None
                }
            };
            if let Some(secret) = &secret
                && (secret.chars().count() < MIN_SECRET_LEN
                    || secret.chars().any(|c| c.is_whitespace() || c.is_control()))
            {
                errors.push(ConfigError::invalid(
                    format!("{at}.secret"),
                    format!("a secret is at least {MIN_SECRET_LEN} characters, without spaces"),
                ));
            }
            if config.scopes.is_empty() {
                errors.push(ConfigError::invalid(
                    format!("{at}.scopes"),
                    "name at least one of read, write, admin",
                ));
            }
            let all = config.namespaces.iter().any(|n| n == "*");
            for namespace in config.namespaces.iter().filter(|n| *n != "*") {
                if !namespaces.contains_key(namespace) {
                    errors.push(ConfigError::invalid(
                        format!("{at}.namespaces"),
                        format!("no namespace `{namespace}`"),
                    ));
                }
            }
            let limit = match config.rate_per_second {
                None => None,
                Some(rate) if rate > 0.0 && rate.is_finite() => {
                    let burst = config.burst.unwrap_or(rate.max(1.0));
                    if burst >= 1.0 && burst.is_finite() {
                        Some(RateLimit::new(rate, burst))
                    } else {
                        errors.push(ConfigError::invalid(format!("{at}.burst"), "at least 1"));
                        None
                    }
                }
                Some(_) => {
                    errors.push(ConfigError::invalid(
                        format!("{at}.rate_per_second"),
                        "a positive number",
                    ));
                    None
                }
            };
            let Some(secret) = secret else { continue };
            if errors.len() > before {
                continue;
            }
            tokens.push(Arc::new(Token {
                name: config.name.clone(),
                secret: Secret(secret.into_bytes()),
                scopes: config.scopes.iter().copied().collect(),
                namespaces: (!all).then(|| config.namespaces.iter().cloned().collect()),
                limit,
            }));
        }
        ConfigError::all(errors)?;
        Ok(Self {
            open: open && tokens.is_empty(),
            tokens,
        })
    }

    /// Whether no token is needed.
    pub fn is_open(&self) -> bool {
        self.open
    }

    /// The token whose secret is `presented`, comparing it with all of them.
    fn find(&self, presented: &[u8]) -> Option<Arc<Token>> {
        let mut found = None;
        for token in &self.tokens {
            if bool::from(token.secret.0.ct_eq(presented)) {
                found = Some(token.clone());
            }
        }
        found
    }
}

impl Tokens {
    /// The caller presenting the bearer token `presented` (the HTTP layer
    /// reads it from `Authorization`): 401 without a valid token, 429 over
    /// its rate. Run once per API request, by the extractor that also
    /// checks its scope and namespace (`api::extract::Target`), before
    /// anything of the body is read; the probes, `/metrics` and
    /// `/openapi.json` take no token.
    pub(crate) fn identify(&self, presented: Option<&str>) -> Result<Caller, Problem> {
        if self.is_open() {
            return Ok(Caller::Open);
        }
        let presented = presented
            .ok_or_else(|| Problem::unauthorized("send `Authorization: Bearer <token>`"))?;
        let token = self
            .find(presented.as_bytes())
            .ok_or_else(|| Problem::unauthorized("the bearer token is not valid"))?;
        if let Some(limit) = &token.limit
            && let Err(wait) = limit.take(Instant::now())
        {
            metrics::counter!("counter_service_rate_limited_total", "token" => token.name.clone())
                .increment(1);
            return Err(Problem::rate_limited(
                wait.as_secs_f64().ceil().max(1.0) as u64
            ));
        }
        Ok(Caller::Token(token))
    }
}

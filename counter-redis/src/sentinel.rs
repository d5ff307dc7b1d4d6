//! A master that Redis Sentinel names, followed across its failovers, and
//! never read stale after one.
//!
//! Redis replicates asynchronously: a master can acknowledge the deletion
//! that follows an add and die before any replica has it. The replica
//! Sentinel promotes then still holds the old total, and a cache that kept
//! its keys would serve it until the TTL. So every key sent through this
//! link is prefixed with an epoch, the master's replication id
//! (`master_replid`): a replica draws a new one when it is promoted, and a
//! restarted server (which kept nothing) another. After a failover every
//! process reads and writes keys the old master never held; what it had is
//! never read again and expires with its TTL. The first reads after a
//! failover miss and fill from the database: the cost is a cold cache,
//! never a stale value.
//!
//! A process learns of the new master when a call on the old one fails (a
//! refused connection, a `READONLY` write). The old master can come back
//! as a replica of the new one, holding the new master's keys under the old
//! epoch; so every read is sent after `ROLE` in the same pipeline and is
//! thrown away unless the server still answers `master`.
//!
//! `redis::aio::ConnectionManager` reconnects to the address it was given,
//! which after a failover is a replica: this link keeps one multiplexed
//! connection to the master the Sentinels named, and drops it on a failure
//! so that the next call asks them again.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use redis::{
    AsyncConnectionConfig, ErrorKind, RedisError, RedisResult, Value,
    aio::MultiplexedConnection,
    sentinel::{SentinelClient, SentinelServerType},
};

/// The master the Sentinels named last, and its epoch.
#[derive(Clone)]
pub(crate) struct Master {
    pub(crate) con: MultiplexedConnection,
    /// `e<16 hex digits of master_replid>|`, before every key.
    pub(crate) prefix: Arc<[u8]>,
}

impl Master {
    /// `key` in this master's epoch.
    pub(crate) fn key(&self, key: &[u8]) -> Vec<u8> {
        let mut prefixed = Vec::with_capacity(self.prefix.len() + key.len());
        prefixed.extend_from_slice(&self.prefix);
        prefixed.extend_from_slice(key);
        prefixed
    }

    /// `key` (found by `SCAN` in this epoch) without its epoch.
    pub(crate) fn unprefixed(&self, key: Vec<u8>) -> Vec<u8> {
        match key.strip_prefix(&*self.prefix) {
            Some(rest) => rest.to_vec(),
            None => key,
        }
    }
}

/// The Sentinels to ask, and the master they named last.
pub(crate) struct Followed {
    sentinels: tokio::sync::Mutex<SentinelClient>,
    current: RwLock<Option<Master>>,
    connection: AsyncConnectionConfig,
}

impl Followed {
    /// Follows the master `name` of the Sentinels at `sentinels`
    /// (`redis://host:port` each); nothing is connected until the first
    /// call.
    pub(crate) fn new(sentinels: Vec<String>, name: &str, timeout: Duration) -> RedisResult<Self> {
        let client =
            SentinelClient::build(sentinels, name.to_owned(), None, SentinelServerType::Master)?;
        Ok(Self {
            sentinels: tokio::sync::Mutex::new(client),
            current: RwLock::new(None),
            connection: AsyncConnectionConfig::new()
                .set_response_timeout(Some(timeout))
                .set_connection_timeout(Some(timeout.max(Duration::from_millis(250)))),
        })
    }

    /// The master, asking the Sentinels if none is known.
    pub(crate) async fn master(&self) -> RedisResult<Master> {
        if let Some(master) = self.known() {
            return Ok(master);
        }
        let mut sentinels = self.sentinels.lock().await;
        // Another call may have found it while this one waited.
        if let Some(master) = self.known() {
            return Ok(master);
        }
        let client = sentinels.async_get_client().await?;
        let mut con = client
            .get_multiplexed_async_connection_with_config(&self.connection)
            .await?;
        let (role, info): (Value, String) = redis::pipe()
            .cmd("ROLE")
            .cmd("INFO")
            .arg("replication")
            .query_async(&mut con)
            .await?;
        ensure_master(&role)?;
        let replid = info
            .lines()
            .find_map(|line| line.strip_prefix("master_replid:"))
            .map(str::trim)
            .filter(|id| id.len() >= 16)
            .ok_or_else(|| {
                RedisError::from((ErrorKind::Parse, "no master_replid in INFO replication"))
            })?;
        let master = Master {
            con,
            prefix: format!("e{}|", &replid[..16]).into_bytes().into(),
        };
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Some(master.clone());
        Ok(master)
    }

    /// A client of the master the Sentinels name now (for a connection
    /// of its own: a subscription).
    pub(crate) async fn master_client(&self) -> RedisResult<redis::Client> {
        self.sentinels.lock().await.async_get_client().await
    }

    fn known(&self) -> Option<Master> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Passes `result` on; a failure (other than a script the server has
    /// not loaded) forgets the master, so the next call asks the Sentinels.
    pub(crate) fn settle<T>(&self, result: RedisResult<T>) -> RedisResult<T> {
        if let Err(e) = &result
            && !super::link::is_no_script(e)
        {
            *self.current.write().unwrap_or_else(|e| e.into_inner()) = None;
        }
        result
    }
}

/// `Ok` if `role` (a `ROLE` reply) is a master's.
pub(crate) fn ensure_master(role: &Value) -> RedisResult<()> {
    let first = match role {
        Value::Array(items) => items.first(),
        _ => None,
    };
    match first {
        Some(Value::BulkString(name)) if name.as_slice() == b"master" => Ok(()),
        Some(Value::SimpleString(name)) if name == "master" => Ok(()),
        _ => Err(RedisError::from((
            ErrorKind::Client,
            "the server is no longer the master (a failover): asking the Sentinels again",
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_master_role_passes() {
        let role =
            |name: &[u8]| Value::Array(vec![Value::BulkString(name.to_vec()), Value::Int(0)]);
        assert!(ensure_master(&role(b"master")).is_ok());
        assert!(ensure_master(&role(b"slave")).is_err());
        assert!(ensure_master(&Value::Nil).is_err());
    }
}

//! The connection to Redis, standalone or cluster, and the few batched
//! operations the cache needs. Every batch is one pipeline on a standalone
//! server; on a cluster the commands go out concurrently on the multiplexed
//! connection, which writes them to each node's socket together (about one
//! round trip per node). Async cluster pipelines must stay in one slot, and
//! one owner per command keeps CROSSSLOT from ever surfacing.

use std::collections::HashMap;

use futures_util::future::try_join_all;
use redis::{
    Cmd, RedisError, RedisResult, Script, aio::ConnectionManager, cluster_async::ClusterConnection,
};

use crate::{
    keys::{COMPLETE, LEASE},
    scripts,
};

/// What one owner's hash held.
#[derive(Debug, Default, Clone)]
pub(crate) struct Entry {
    /// `!c`: the hash holds every count of the owner.
    pub(crate) complete: bool,
    /// `!l`: a fill is in progress.
    pub(crate) leased: bool,
    /// The count fields read (all of them, or those asked for and present).
    pub(crate) counts: HashMap<String, i64>,
}

/// One owner's complete hash, to store if its lease still holds.
#[derive(Debug)]
pub(crate) struct Fill {
    pub(crate) key: Vec<u8>,
    pub(crate) ttl_secs: u64,
    pub(crate) counts: Vec<(String, i64)>,
}

/// Which fields a read asks for.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Fields<'a> {
    /// These count keys (`HMGET`).
    Only(&'a [String]),
    /// Every field (`HGETALL`): for keys not known in advance.
    All,
}

#[derive(Clone)]
pub(crate) enum Link {
    Standalone(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Link {
    /// Each owner's hash, in order.
    pub(crate) async fn read(
        &self,
        keys: &[Vec<u8>],
        fields: Fields<'_>,
    ) -> RedisResult<Vec<Entry>> {
        let command = |key: &Vec<u8>| match fields {
            Fields::Only(names) => {
                let mut cmd = redis::cmd("HMGET");
                cmd.arg(key).arg(COMPLETE).arg(LEASE).arg(names);
                cmd
            }
            Fields::All => {
                let mut cmd = redis::cmd("HGETALL");
                cmd.arg(key);
                cmd
            }
        };
        let commands: Vec<Cmd> = keys.iter().map(command).collect();
        match fields {
            Fields::Only(names) => {
                let rows: Vec<Vec<Option<String>>> = self.run_all(commands).await?;
                Ok(rows
                    .into_iter()
                    .map(|row| entry_of_fields(names, row))
                    .collect())
            }
            Fields::All => {
                let rows: Vec<HashMap<String, String>> = self.run_all(commands).await?;
                Ok(rows.into_iter().map(entry_of_hash).collect())
            }
        }
    }

    /// Takes the lease of each owner's hash that does not exist; whether
    /// each was taken, in order.
    pub(crate) async fn lease(
        &self,
        keys: &[Vec<u8>],
        token: &str,
        lease_ms: u64,
    ) -> RedisResult<Vec<bool>> {
        let args = [token.to_owned(), lease_ms.to_string()];
        let calls = keys
            .iter()
            .map(|key| (key.clone(), args.to_vec()))
            .collect();
        let taken: Vec<i64> = self.run_script(&scripts::LEASE, calls).await?;
        Ok(taken.into_iter().map(|n| n == 1).collect())
    }

    /// Stores each owner's complete hash if its lease is still `token`'s;
    /// whether each landed, in order.
    pub(crate) async fn fill(&self, fills: Vec<Fill>, token: &str) -> RedisResult<Vec<bool>> {
        let calls = fills
            .into_iter()
            .map(
                |Fill {
                     key,
                     ttl_secs,
                     counts,
                 }| {
                    let mut args = Vec::with_capacity(2 + counts.len() * 2);
                    args.push(token.to_owned());
                    args.push(ttl_secs.to_string());
                    for (field, value) in counts {
                        args.push(field);
                        args.push(value.to_string());
                    }
                    (key, args)
                },
            )
            .collect();
        let landed: Vec<i64> = self.run_script(&scripts::FILL, calls).await?;
        Ok(landed.into_iter().map(|n| n == 1).collect())
    }

    /// Deletes the hashes (`UNLINK`: freed off the main thread).
    pub(crate) async fn unlink(&self, keys: &[Vec<u8>]) -> RedisResult<()> {
        if keys.is_empty() {
            return Ok(());
        }
        let commands = keys
            .chunks(500)
            .map(|chunk| {
                let mut cmd = redis::cmd("UNLINK");
                cmd.arg(chunk);
                cmd
            })
            .collect();
        // A multi-key UNLINK is split per slot by the cluster client.
        let _: Vec<i64> = self.run_all(commands).await?;
        Ok(())
    }

    /// Deletes every key matching `pattern` (a table's keys). A standalone
    /// server is scanned; on a cluster this is left to the TTL, since a
    /// scan would have to visit every master.
    pub(crate) async fn delete_matching(&self, pattern: &str) -> RedisResult<u64> {
        let Link::Standalone(con) = self else {
            return Ok(0);
        };
        let mut con = con.clone();
        let mut cursor: u64 = 0;
        let mut deleted = 0;
        loop {
            let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1_000)
                .query_async(&mut con)
                .await?;
            deleted += keys.len() as u64;
            self.unlink(&keys).await?;
            if next == 0 {
                return Ok(deleted);
            }
            cursor = next;
        }
    }

    /// Runs `commands`, returning their replies in order: one pipeline on a
    /// standalone server, concurrent commands on a cluster.
    async fn run_all<T: redis::FromRedisValue + Send>(
        &self,
        commands: Vec<Cmd>,
    ) -> RedisResult<Vec<T>> {
        if commands.is_empty() {
            return Ok(Vec::new());
        }
        match self {
            Link::Standalone(con) => {
                let mut pipe = redis::pipe();
                for cmd in commands {
                    pipe.add_command(cmd);
                }
                pipe.query_async(&mut con.clone()).await
            }
            Link::Cluster(con) => {
                try_join_all(commands.into_iter().map(|cmd| {
                    let mut con = con.clone();
                    async move { cmd.query_async::<T>(&mut con).await }
                }))
                .await
            }
        }
    }

    /// `script` once per (key, args), replies in order. A standalone
    /// pipeline of `EVALSHA`s loads the script and goes again once if the
    /// server does not know it (after a restart or `SCRIPT FLUSH`); the
    /// cluster client does that per command.
    async fn run_script<T: redis::FromRedisValue + Send>(
        &self,
        script: &Script,
        calls: Vec<(Vec<u8>, Vec<String>)>,
    ) -> RedisResult<Vec<T>> {
        match self {
            Link::Standalone(con) => {
                let commands: Vec<Cmd> = calls
                    .iter()
                    .map(|(key, args)| {
                        let mut cmd = redis::cmd("EVALSHA");
                        cmd.arg(script.get_hash()).arg(1).arg(key).arg(args);
                        cmd
                    })
                    .collect();
                match self.run_all(commands.clone()).await {
                    Err(e) if is_no_script(&e) => {
                        script.prepare_invoke().load_async(&mut con.clone()).await?;
                        self.run_all(commands).await
                    }
                    done => done,
                }
            }
            Link::Cluster(con) => {
                try_join_all(calls.into_iter().map(|(key, args)| {
                    let mut con = con.clone();
                    async move { script.key(key).arg(args).invoke_async::<T>(&mut con).await }
                }))
                .await
            }
        }
    }
}

fn is_no_script(error: &RedisError) -> bool {
    error.code() == Some("NOSCRIPT") || error.to_string().contains("NOSCRIPT")
}

fn entry_of_fields(names: &[String], row: Vec<Option<String>>) -> Entry {
    let mut values = row.into_iter();
    let complete = values.next().flatten().is_some();
    let leased = values.next().flatten().is_some();
    let mut counts = HashMap::new();
    for (name, value) in names.iter().zip(values) {
        if let Some(value) = value {
            match value.parse::<i64>() {
                Ok(n) => {
                    counts.insert(name.clone(), n);
                }
                // Not ours: treated as a miss, and the fill replaces it.
                Err(_) => return Entry::default(),
            }
        }
    }
    Entry {
        complete,
        leased,
        counts,
    }
}

fn entry_of_hash(hash: HashMap<String, String>) -> Entry {
    let mut entry = Entry::default();
    for (field, value) in hash {
        match field.as_str() {
            COMPLETE => entry.complete = true,
            LEASE => entry.leased = true,
            _ => match value.parse::<i64>() {
                Ok(n) => {
                    entry.counts.insert(field, n);
                }
                Err(_) => return Entry::default(),
            },
        }
    }
    entry
}

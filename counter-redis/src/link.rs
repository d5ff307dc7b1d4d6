//! The connection to Redis, standalone, a master followed through its
//! Sentinels (`sentinel.rs`: every key in the master's epoch) or a cluster,
//! and the few batched operations the cache needs.
//!
//! On a standalone server every batch is one round trip: one `MGET`, or one
//! pipeline. On a cluster, keys are grouped by the node that serves their
//! slot (from `CLUSTER SLOTS`, refreshed after any failure), and each group
//! goes to its node as one pipeline, all nodes at once: about one round
//! trip per node. (Async cluster pipelines routed by key must stay in one
//! slot, and `MGET` is split per slot, about a command per owner.)

use std::{
    collections::HashMap,
    sync::{Arc, RwLock},
};

use futures_util::future::{join_all, try_join_all};
use redis::{
    Cmd, FromRedisValue, RedisError, RedisResult, Script, Value,
    aio::ConnectionManager,
    cluster_async::ClusterConnection,
    cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr},
};

use crate::{scripts, sentinel::Followed, value};

/// One owner's complete value, to store if its lease still holds.
#[derive(Debug)]
pub(crate) struct Fill {
    pub(crate) key: Vec<u8>,
    pub(crate) ttl_secs: u64,
    pub(crate) value: String,
}

#[derive(Clone)]
pub(crate) enum Link {
    Standalone(ConnectionManager),
    Sentinel(Arc<Followed>),
    Cluster(Arc<Cluster>),
}

/// Slot ranges and the master serving each (`host:port`), sorted by first
/// slot; shared by the calls that route with it.
type SlotMap = Vec<(u16, u16, String)>;

pub(crate) struct Cluster {
    con: ClusterConnection,
    /// Empty until fetched, and again after a failure.
    slots: RwLock<Arc<SlotMap>>,
}

impl Link {
    pub(crate) fn cluster(con: ClusterConnection) -> Self {
        Link::Cluster(Arc::new(Cluster {
            con,
            slots: RwLock::default(),
        }))
    }

    /// Each owner's value, in order (decoded by the caller: `value.rs`).
    pub(crate) async fn read(&self, keys: &[&[u8]]) -> RedisResult<Vec<Option<Vec<u8>>>> {
        let values: Vec<Option<Vec<u8>>> = match self {
            Link::Standalone(con) => {
                let mut values = Vec::with_capacity(keys.len());
                for chunk in keys.chunks(5_000) {
                    let part: Vec<Option<Vec<u8>>> = redis::cmd("MGET")
                        .arg(chunk)
                        .query_async(&mut con.clone())
                        .await?;
                    values.extend(part);
                }
                values
            }
            Link::Sentinel(followed) => {
                let master = followed.master().await?;
                let mut con = master.con.clone();
                let read = async {
                    let mut values = Vec::with_capacity(keys.len());
                    for chunk in keys.chunks(5_000) {
                        let chunk: Vec<Vec<u8>> = chunk.iter().map(|key| master.key(key)).collect();
                        // Read only from a server that is still the master.
                        let (role, part): (Value, Vec<Option<Vec<u8>>>) = redis::pipe()
                            .cmd("ROLE")
                            .cmd("MGET")
                            .arg(chunk)
                            .query_async(&mut con)
                            .await?;
                        crate::sentinel::ensure_master(&role)?;
                        values.extend(part);
                    }
                    Ok(values)
                };
                followed.settle(read.await)?
            }
            Link::Cluster(cluster) => {
                let commands = keys
                    .iter()
                    .map(|key| {
                        let mut cmd = redis::cmd("GET");
                        cmd.arg(*key);
                        cmd
                    })
                    .collect();
                cluster.run(keys, commands).await?
            }
        };
        Ok(values)
    }

    /// Takes the lease of each owner whose key does not exist (`SET NX`);
    /// whether each was taken, in order.
    pub(crate) async fn lease(
        &self,
        keys: &[Vec<u8>],
        token: &str,
        lease_ms: u64,
    ) -> RedisResult<Vec<bool>> {
        let lease = value::lease(token);
        let taken: Vec<Option<String>> = self
            .run_each(keys, |_, key| {
                let mut cmd = redis::cmd("SET");
                cmd.arg(key).arg(&lease).arg("NX").arg("PX").arg(lease_ms);
                cmd
            })
            .await?;
        Ok(taken.into_iter().map(|reply| reply.is_some()).collect())
    }

    /// Stores each owner's complete value if its lease is still `token`'s;
    /// whether each landed, in order.
    pub(crate) async fn fill(&self, fills: Vec<Fill>, token: &str) -> RedisResult<Vec<bool>> {
        let lease = value::lease(token);
        let keys: Vec<&[u8]> = fills.iter().map(|f| f.key.as_slice()).collect();
        let command = |i: usize, key: &[u8]| {
            let fill = &fills[i];
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(scripts::FILL.get_hash())
                .arg(1)
                .arg(key)
                .arg(&lease)
                .arg(&fill.value)
                .arg(fill.ttl_secs);
            cmd
        };
        let landed: Vec<i64> = match self.run_each(&keys, command).await {
            Err(e) if is_no_script(&e) => {
                self.load(&scripts::FILL).await?;
                self.run_each(&keys, command).await?
            }
            done => done?,
        };
        Ok(landed.into_iter().map(|n| n == 1).collect())
    }

    /// `PING`: the server, or on a cluster every master, answers.
    pub(crate) async fn ping(&self) -> RedisResult<()> {
        match self {
            Link::Standalone(con) => redis::cmd("PING")
                .query_async::<String>(&mut con.clone())
                .await
                .map(drop),
            Link::Sentinel(followed) => {
                let master = followed.master().await?;
                let role = redis::cmd("ROLE")
                    .query_async::<Value>(&mut master.con.clone())
                    .await;
                followed.settle(role.and_then(|role| crate::sentinel::ensure_master(&role)))
            }
            Link::Cluster(cluster) => cluster.ping_masters().await,
        }
    }

    /// Deletes the keys (`UNLINK`: freed off Redis's main thread).
    pub(crate) async fn unlink(&self, keys: &[Vec<u8>]) -> RedisResult<()> {
        match self {
            Link::Standalone(con) => {
                if !keys.is_empty() {
                    let _: i64 = redis::cmd("UNLINK")
                        .arg(keys)
                        .query_async(&mut con.clone())
                        .await?;
                }
                Ok(())
            }
            Link::Sentinel(followed) => {
                if keys.is_empty() {
                    return Ok(());
                }
                let master = followed.master().await?;
                let keys: Vec<Vec<u8>> = keys.iter().map(|key| master.key(key)).collect();
                let unlinked = redis::cmd("UNLINK")
                    .arg(keys)
                    .query_async::<i64>(&mut master.con.clone())
                    .await;
                followed.settle(unlinked).map(drop)
            }
            Link::Cluster(cluster) => {
                // One command per key, each routed (and redirected through
                // a slot migration's ASK) by the client itself: a delete
                // must not fail because a neighbour's slot is moving.
                let deletes = keys.iter().map(|key| {
                    let mut con = cluster.con.clone();
                    async move {
                        redis::cmd("UNLINK")
                            .arg(key)
                            .query_async::<i64>(&mut con)
                            .await
                    }
                });
                try_join_all(deletes).await.map(drop)
            }
        }
    }

    /// One `SCAN` step over the keys matching `pattern`: the next cursor
    /// (0 at the end) and the keys found. A cluster scans nothing (a scan
    /// would have to visit every master).
    pub(crate) async fn scan(
        &self,
        pattern: &str,
        cursor: u64,
    ) -> RedisResult<(u64, Vec<Vec<u8>>)> {
        let scan = |pattern: &[u8]| {
            let mut cmd = redis::cmd("SCAN");
            cmd.arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1_000);
            cmd
        };
        match self {
            Link::Standalone(con) => scan(pattern.as_bytes()).query_async(&mut con.clone()).await,
            Link::Sentinel(followed) => {
                let master = followed.master().await?;
                let found = scan(&master.key(pattern.as_bytes()))
                    .query_async::<(u64, Vec<Vec<u8>>)>(&mut master.con.clone())
                    .await;
                let (next, keys) = followed.settle(found)?;
                Ok((
                    next,
                    keys.into_iter().map(|key| master.unprefixed(key)).collect(),
                ))
            }
            Link::Cluster(_) => Ok((0, Vec::new())),
        }
    }

    /// Loads `script` (on every master of a cluster).
    async fn load(&self, script: &Script) -> RedisResult<()> {
        match self {
            Link::Standalone(con) => script
                .prepare_invoke()
                .load_async(&mut con.clone())
                .await
                .map(drop),
            Link::Sentinel(followed) => {
                let master = followed.master().await?;
                let loaded = script
                    .prepare_invoke()
                    .load_async(&mut master.con.clone())
                    .await;
                followed.settle(loaded).map(drop)
            }
            Link::Cluster(cluster) => script
                .prepare_invoke()
                .load_async(&mut cluster.con.clone())
                .await
                .map(drop),
        }
    }

    /// `command(i, key)` for each key of `keys` (the key as sent: in the
    /// master's epoch under Sentinel), replies in order: one pipeline on a
    /// standalone server or a Sentinel's master, one per node on a cluster.
    async fn run_each<T: FromRedisValue, K: AsRef<[u8]>>(
        &self,
        keys: &[K],
        command: impl Fn(usize, &[u8]) -> Cmd,
    ) -> RedisResult<Vec<T>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let pipeline = |commands: Vec<Cmd>| {
            let mut pipe = redis::pipe();
            for cmd in commands {
                pipe.add_command(cmd);
            }
            pipe
        };
        let each = |key: &dyn Fn(&[u8]) -> Vec<u8>| -> Vec<Cmd> {
            keys.iter()
                .enumerate()
                .map(|(i, k)| command(i, &key(k.as_ref())))
                .collect()
        };
        match self {
            Link::Standalone(con) => {
                pipeline(each(&|k| k.to_vec()))
                    .query_async(&mut con.clone())
                    .await
            }
            Link::Sentinel(followed) => {
                let master = followed.master().await?;
                let replies = pipeline(each(&|k| master.key(k)))
                    .query_async(&mut master.con.clone())
                    .await;
                followed.settle(replies)
            }
            Link::Cluster(cluster) => cluster.run(keys, each(&|k| k.to_vec())).await,
        }
    }
}

impl Cluster {
    /// `commands[i]` on the node serving `keys[i]`, one pipeline per node,
    /// all nodes at once. Any failure (a node down, a slot moved) fails the
    /// whole call and refreshes the slot map for the next one.
    async fn run<T: FromRedisValue, K: AsRef<[u8]>>(
        &self,
        keys: &[K],
        commands: Vec<Cmd>,
    ) -> RedisResult<Vec<T>> {
        let groups = self.groups(keys).await?;
        let mut commands: Vec<Option<Cmd>> = commands.into_iter().map(Some).collect();
        let sends = groups.iter().map(|(slot, members)| {
            let mut pipe = redis::pipe();
            for &i in members {
                if let Some(cmd) = commands[i].take() {
                    pipe.add_command(cmd);
                }
            }
            let route = Route::new(*slot, SlotAddr::Master);
            let mut con = self.con.clone();
            let count = members.len();
            async move {
                con.route_pipeline(pipe, 0, count, SingleNodeRoutingInfo::SpecificNode(route))
                    .await
            }
        });
        let answers = join_all(sends).await;
        let mut replies: Vec<Option<Value>> = vec![None; keys.len()];
        for ((_, members), answer) in groups.iter().zip(answers) {
            let values = match answer {
                Ok(values) if values.len() == members.len() => values,
                Ok(_) => return Err(self.stale("a pipeline answered the wrong number of replies")),
                Err(e) => {
                    self.forget_slots();
                    return Err(e);
                }
            };
            for (&i, value) in members.iter().zip(values) {
                if let Value::ServerError(e) = &value {
                    self.forget_slots();
                    return Err(RedisError::from(e.clone()));
                }
                replies[i] = Some(value);
            }
        }
        replies
            .into_iter()
            .map(|v| T::from_redis_value(v.unwrap_or(Value::Nil)).map_err(RedisError::from))
            .collect()
    }

    /// The indexes of `keys` grouped by the master serving them, each group
    /// with one of its slots (to route by).
    async fn groups<K: AsRef<[u8]>>(&self, keys: &[K]) -> RedisResult<Vec<(u16, Vec<usize>)>> {
        let known = Arc::clone(&self.slots.read().unwrap_or_else(|e| e.into_inner()));
        // A map forgotten by a concurrent failure is fetched again here,
        // and this call uses what it fetched.
        let slots = match known.is_empty() {
            true => self.refresh_slots().await?,
            false => known,
        };
        let mut by_node: HashMap<&str, (u16, Vec<usize>)> = HashMap::new();
        for (i, key) in keys.iter().enumerate() {
            let slot = slot_of(key.as_ref());
            let at = slots.partition_point(|(start, _, _)| *start <= slot);
            let node = match at.checked_sub(1).map(|j| &slots[j]) {
                Some((_, end, node)) if slot <= *end => node.as_str(),
                _ => "",
            };
            by_node
                .entry(node)
                .or_insert_with(|| (slot, Vec::new()))
                .1
                .push(i);
        }
        Ok(by_node.into_values().collect())
    }

    async fn refresh_slots(&self) -> RedisResult<Arc<SlotMap>> {
        let reply: Value = self
            .con
            .clone()
            .route_command(
                redis::cmd("CLUSTER").arg("SLOTS").to_owned(),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
            )
            .await?;
        let mut slots = Vec::new();
        if let Value::Array(ranges) = reply {
            for range in ranges {
                let Value::Array(parts) = range else { continue };
                let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(master))) =
                    (parts.first(), parts.get(1), parts.get(2))
                else {
                    continue;
                };
                let host = match master.first() {
                    Some(Value::BulkString(host)) => String::from_utf8_lossy(host).into_owned(),
                    _ => continue,
                };
                let port = match master.get(1) {
                    Some(Value::Int(port)) => *port,
                    _ => continue,
                };
                let (Ok(start), Ok(end)) = (u16::try_from(*start), u16::try_from(*end)) else {
                    continue;
                };
                slots.push((start, end, format!("{host}:{port}")));
            }
        }
        slots.sort();
        let slots = Arc::new(slots);
        *self.slots.write().unwrap_or_else(|e| e.into_inner()) = Arc::clone(&slots);
        Ok(slots)
    }

    /// `PUBLISH` through any node (a cluster carries it to every node).
    pub(crate) async fn publish(&self, command: &Cmd) -> RedisResult<u64> {
        let mut con = self.con.clone();
        let answer = con
            .route_command(
                command.clone(),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
            )
            .await?;
        u64::from_redis_value(answer).map_err(Into::into)
    }

    /// `PING` to every master of a fresh slot map, by its address. (The
    /// client's own all-masters routing skips a master it has no connection
    /// to, and a slot's route falls back to another node, so a dead master
    /// would pass either way.)
    async fn ping_masters(&self) -> RedisResult<()> {
        let slots = self.refresh_slots().await?;
        let mut masters: Vec<&str> = slots.iter().map(|(_, _, node)| node.as_str()).collect();
        masters.sort_unstable();
        masters.dedup();
        let pings = masters.into_iter().map(|node| {
            let (host, port) = node.rsplit_once(':').unwrap_or((node, ""));
            let route = SingleNodeRoutingInfo::ByAddress {
                host: host.to_owned(),
                port: port.parse().unwrap_or(0),
            };
            let mut con = self.con.clone();
            async move {
                con.route_command(redis::cmd("PING"), RoutingInfo::SingleNode(route))
                    .await
            }
        });
        try_join_all(pings).await.map(drop)
    }

    fn forget_slots(&self) {
        *self.slots.write().unwrap_or_else(|e| e.into_inner()) = Arc::default();
    }

    fn stale(&self, what: &'static str) -> RedisError {
        self.forget_slots();
        RedisError::from((redis::ErrorKind::Client, what))
    }
}

pub(crate) fn is_no_script(error: &RedisError) -> bool {
    error.code() == Some("NOSCRIPT") || error.to_string().contains("NOSCRIPT")
}

/// The cluster slot of `key`: CRC16 (XMODEM) of its hash tag (the bytes
/// between the first `{` and the next `}`, if not empty) or of the key,
/// modulo 16384, as Redis computes it.
fn slot_of(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    crc16(tagged) % 16_384
}

fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_redis_slots() {
        // Redis: CLUSTER KEYSLOT foo = 12182, {user1000}.following = 3443.
        assert_eq!(slot_of(b"foo"), 12_182);
        assert_eq!(slot_of(b"{user1000}.following"), slot_of(b"user1000"));
        assert_eq!(slot_of(b"{user1000}.following"), 3_443);
        assert_eq!(slot_of(b"foo{}{bar}"), slot_of(b"foo{}{bar}"));
        assert_eq!(crc16(b"123456789"), 0x31c3);
    }
}

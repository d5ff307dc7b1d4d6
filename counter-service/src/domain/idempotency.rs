//! Exactly-once adds: the `counter-mq` dedup ledger, and the first answer
//! to each key kept beside it so that a retry gets it again.
//!
//! An add with an `Idempotency-Key` (and each `batchAdd` item with an `id`)
//! is one transaction: record the id in `counter_applied_messages` (source
//! `http:<namespace>`), and only if it was new apply the deltas and store
//! the request and its answer in `counter_service_replies`; then commit. A
//! concurrent request with the same id waits on the ledger row's lock and
//! then finds it recorded, with its answer committed beside it: 16 clients
//! sending one key at once get one add and 16 equal answers. The same id
//! with another request is 409.
//!
//! ```sql
//! CREATE TABLE counter_service_replies (
//!     source     VARCHAR(64)  NOT NULL,  -- ascii_bin on MySQL, like the ledger
//!     msg_id     VARCHAR(128) NOT NULL,
//!     request    TEXT         NOT NULL,  -- the canonical request, compared on a retry
//!     reply      TEXT,                   -- the first answer (NULL for batch items)
//!     created_at BIGINT       NOT NULL,  -- Unix seconds, the database's clock
//!     PRIMARY KEY (source, msg_id));
//! ```

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    time::Duration,
};

use counter_mq::ledger;
use sea_orm::{ConnectionTrait, DbBackend, DbErr, Statement, Value};

/// The table of stored answers.
pub(crate) const REPLIES: &str = "counter_service_replies";

/// The longest id: the ledger's column.
pub(crate) const MAX_ID_LEN: usize = counter_mq::message::MAX_ID_LEN;

/// Creates the ledger and the replies table if missing.
pub(crate) async fn create_tables<C: ConnectionTrait>(db: &C) -> Result<(), DbErr> {
    counter_mq::create_table(db).await?;
    let backend = db.get_database_backend();
    let id = |len| match backend {
        DbBackend::MySql => format!("VARCHAR({len}) CHARACTER SET ascii COLLATE ascii_bin"),
        _ => format!("VARCHAR({len})"),
    };
    db.execute_unprepared(&format!(
        "CREATE TABLE IF NOT EXISTS {REPLIES} (source {} NOT NULL, msg_id {} NOT NULL, \
         request TEXT NOT NULL, reply TEXT, created_at BIGINT NOT NULL, PRIMARY KEY (source, msg_id))",
        id(64),
        id(128)
    ))
    .await?;
    db.execute_unprepared(&format!(
        "CREATE INDEX IF NOT EXISTS {REPLIES}_created_at ON {REPLIES} (created_at)"
    ))
    .await?;
    Ok(())
}

/// Fails unless both tables exist (a cheap read of each).
pub(crate) async fn check_tables<C: ConnectionTrait>(db: &C) -> Result<(), DbErr> {
    let backend = db.get_database_backend();
    for table in [counter_mq::APPLIED_MESSAGES, REPLIES] {
        counter_core::pooling::query_all(
            db,
            Statement::from_string(backend, format!("SELECT source FROM {table} WHERE 1 = 0")),
        )
        .await?;
    }
    Ok(())
}

/// An id checked by the ledger's rule ([`counter_mq::message::is_valid_id`]):
/// a 400 that names the bound (`bound`, `max`) when the id is only too
/// long, as every bound refusal does.
pub(crate) fn check_id(id: &str) -> Result<(), crate::problem::Problem> {
    if counter_mq::message::is_valid_id(id) {
        return Ok(());
    }
    if id.len() > MAX_ID_LEN {
        return Err(crate::problem::Problem::over_bound(
            "idempotency key length",
            MAX_ID_LEN,
            id.len(),
        ));
    }
    Err(crate::problem::Problem::bad_request(format!(
        "an idempotency key or item id is 1 to {MAX_ID_LEN} printable ASCII characters without spaces"
    )))
}

/// Records `ids` of `source` on `txn` and returns the new ones.
pub(crate) async fn record<C: ConnectionTrait>(
    txn: &C,
    source: &str,
    ids: &[&str],
) -> Result<HashSet<String>, DbErr> {
    ledger::record_new(txn, source, ids).await
}

/// `(source, id)` pairs of several sources, by source.
fn by_source<'a>(pairs: &[(&'a str, &'a str)]) -> BTreeMap<&'a str, Vec<&'a str>> {
    let mut by_source: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (source, id) in pairs {
        by_source.entry(source).or_default().push(id);
    }
    by_source
}

/// [`record`] of ids from several sources (an add group's callers): the
/// new `(source, id)` pairs.
pub(crate) async fn record_of<C: ConnectionTrait>(
    txn: &C,
    pairs: &[(&str, &str)],
) -> Result<HashSet<(String, String)>, DbErr> {
    let mut new = HashSet::new();
    for (source, ids) in by_source(pairs) {
        for id in record(txn, source, &ids).await? {
            new.insert((source.to_owned(), id));
        }
    }
    Ok(new)
}

/// [`stored`] of ids from several sources, by `(source, id)`.
pub(crate) async fn stored_of<C: ConnectionTrait>(
    db: &C,
    pairs: &[(&str, &str)],
) -> Result<HashMap<(String, String), Stored>, DbErr> {
    let mut found = HashMap::new();
    for (source, ids) in by_source(pairs) {
        for (id, stored) in stored(db, source, &ids).await? {
            found.insert((source.to_owned(), id), stored);
        }
    }
    Ok(found)
}

/// One answer of a source to store: `(id, request, reply)`.
type Answer<'a> = (&'a str, &'a str, Option<&'a str>);

/// One row to store: `(source, id, request, reply)`.
pub(crate) type StoredRow<'a> = (&'a str, &'a str, &'a str, Option<&'a str>);

/// [`store`] of rows from several sources, at most 500 rows a statement.
pub(crate) async fn store_of<C: ConnectionTrait>(
    txn: &C,
    rows: &[StoredRow<'_>],
) -> Result<(), DbErr> {
    let mut by_source: BTreeMap<&str, Vec<Answer<'_>>> = BTreeMap::new();
    for (source, id, request, reply) in rows {
        by_source
            .entry(source)
            .or_default()
            .push((id, request, *reply));
    }
    for (source, rows) in by_source {
        for chunk in rows.chunks(500) {
            store(txn, source, chunk).await?;
        }
    }
    Ok(())
}

/// A stored request and its answer.
#[derive(Debug, Clone)]
pub(crate) struct Stored {
    pub request: String,
    pub reply: Option<String>,
}

/// The stored requests of `ids`, by id.
pub(crate) async fn stored<C: ConnectionTrait>(
    db: &C,
    source: &str,
    ids: &[&str],
) -> Result<HashMap<String, Stored>, DbErr> {
    if ids.is_empty() {
        return Ok(HashMap::new());
    }
    let backend = db.get_database_backend();
    let mut values = vec![Value::from(source)];
    let marks: Vec<String> = ids
        .iter()
        .map(|id| {
            values.push(Value::from(*id));
            placeholder(backend, values.len())
        })
        .collect();
    let sql = format!(
        "SELECT msg_id, request, reply FROM {REPLIES} WHERE source = {} AND msg_id IN ({})",
        placeholder(backend, 1),
        marks.join(",")
    );
    let rows =
        counter_core::pooling::query_all(db, Statement::from_sql_and_values(backend, sql, values))
            .await?;
    rows.iter()
        .map(|row| {
            Ok((
                row.try_get_by_index::<String>(0)?,
                Stored {
                    request: row.try_get_by_index(1)?,
                    reply: row.try_get_by_index(2)?,
                },
            ))
        })
        .collect()
}

/// Stores `(id, request, reply)` rows of `source` on `txn`.
pub(crate) async fn store<C: ConnectionTrait>(
    txn: &C,
    source: &str,
    rows: &[Answer<'_>],
) -> Result<(), DbErr> {
    if rows.is_empty() {
        return Ok(());
    }
    let backend = txn.get_database_backend();
    let clock = ledger::database_clock(backend);
    let mut values = Vec::with_capacity(rows.len() * 4);
    let mut tuples = Vec::with_capacity(rows.len());
    for (id, request, reply) in rows {
        let n = values.len();
        values.push(Value::from(source));
        values.push(Value::from(*id));
        values.push(Value::from(*request));
        values.push(Value::from(reply.map(str::to_owned)));
        tuples.push(format!(
            "({},{},{},{},{clock})",
            placeholder(backend, n + 1),
            placeholder(backend, n + 2),
            placeholder(backend, n + 3),
            placeholder(backend, n + 4)
        ));
    }
    let sql = format!(
        "INSERT INTO {REPLIES} (source, msg_id, request, reply, created_at) VALUES {}",
        tuples.join(",")
    );
    txn.execute_raw(Statement::from_sql_and_values(backend, sql, values))
        .await
        .map(drop)
}

/// Forgets the ids of `source` older than `retention`, ledger first (a
/// ledger row without its answer would be a key that can only be refused),
/// in bounded batches; returns the ledger rows deleted.
pub(crate) async fn prune<C: ConnectionTrait>(
    db: &C,
    source: &str,
    retention: Duration,
) -> Result<u64, DbErr> {
    let mut pruned = 0;
    loop {
        let n = ledger::prune(db, source, retention).await?;
        pruned += n;
        if n < ledger::PRUNE_BATCH {
            break;
        }
    }
    let backend = db.get_database_backend();
    let cutoff = format!(
        "{} - {}",
        ledger::database_clock(backend),
        retention.as_secs()
    );
    let sql = match backend {
        DbBackend::MySql => format!(
            "DELETE FROM {REPLIES} WHERE source = ? AND created_at < {cutoff} ORDER BY created_at LIMIT 10000"
        ),
        _ => format!(
            "DELETE FROM {REPLIES} WHERE source = {p1} AND msg_id IN (SELECT msg_id FROM {REPLIES} \
             WHERE source = {p1} AND created_at < {cutoff} ORDER BY created_at LIMIT 10000)",
            p1 = placeholder(backend, 1)
        ),
    };
    // `$1` twice on PostgreSQL; SQLite's `?` twice takes the value twice.
    let values: Vec<Value> = match backend {
        DbBackend::Sqlite => vec![source.into(), source.into()],
        _ => vec![source.into()],
    };
    loop {
        let done = counter_core::pooling::execute(
            db,
            Statement::from_sql_and_values(backend, sql.clone(), values.clone()),
        )
        .await?;
        if done.rows_affected() < 10_000 {
            break;
        }
    }
    Ok(pruned)
}

fn placeholder(backend: DbBackend, n: usize) -> String {
    match backend {
        DbBackend::Postgres => format!("${n}"),
        _ => "?".to_owned(),
    }
}

//! What a MariaDB Galera node says about itself: whether it is one (for the
//! operations refused there) and the writer share of the node a pool
//! writes to. Every Galera question the crate asks is here.

use sea_orm::{ConnectionTrait, Statement};

use crate::{
    error::{CounterError, Result},
    sql::Dialect,
    strategy::Writer,
};

/// Whether `db` is a Galera node (`wsrep_on` is `ON`). Not on MySQL or on
/// MariaDB without a cluster, and never on the other backends.
pub(crate) async fn is_galera_node<C: ConnectionTrait>(db: &C) -> Result<bool> {
    let rows = show(db, "SHOW VARIABLES LIKE 'wsrep_on'").await?;
    Ok(rows.iter().any(|(_, on)| on.eq_ignore_ascii_case("ON")))
}

impl Writer {
    /// The share of the Galera node `db` is connected to: writer
    /// `wsrep_local_index` of `wsrep_cluster_size`; `None` on anything
    /// that is not a ready Galera node (another backend, or MariaDB
    /// without a cluster).
    ///
    /// One pool per node, each with the table of its node's share
    /// ([`CounterTable::with_writer`](crate::CounterTable::with_writer)),
    /// keeps the nodes off each other's rows; a process that writes to one
    /// node can [`install`](Writer::install) it. The index is the node's
    /// place in the cluster's current membership: after a node leaves or
    /// joins, ask again (a stale share costs speed, never a count).
    pub async fn of_galera_node<C: ConnectionTrait>(db: &C) -> Result<Option<Writer>> {
        let rows = show(
            db,
            "SHOW GLOBAL STATUS WHERE Variable_name IN \
             ('wsrep_ready', 'wsrep_local_index', 'wsrep_cluster_size')",
        )
        .await?;
        let status = |name: &str| {
            rows.iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, value)| value.trim())
        };
        if !status("wsrep_ready").is_some_and(|on| on.eq_ignore_ascii_case("ON")) {
            return Ok(None);
        }
        let number = |name| status(name).and_then(|v| v.parse::<u16>().ok());
        match (number("wsrep_local_index"), number("wsrep_cluster_size")) {
            (Some(index), Some(size)) if index < size => Writer::new(index, size).map(Some),
            _ => Ok(None),
        }
    }
}

/// The `(name, value)` rows of a MySQL `SHOW` statement; none on the other
/// backends, which have no Galera.
async fn show<C: ConnectionTrait>(db: &C, sql: &str) -> Result<Vec<(String, String)>> {
    if Dialect::of(db)? != Dialect::MySql {
        return Ok(Vec::new());
    }
    let statement = Statement::from_string(Dialect::MySql.backend(), sql);
    let rows = db
        .query_all_raw(statement)
        .await
        .map_err(CounterError::Database)?;
    rows.iter()
        .map(|row| Ok((row.try_get_by_index(0)?, row.try_get_by_index(1)?)))
        .collect::<Result<_, sea_orm::DbErr>>()
        .map_err(CounterError::Database)
}

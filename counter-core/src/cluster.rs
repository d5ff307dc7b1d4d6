//! What a MariaDB Galera node says about its cluster: the writer share of
//! the node a pool writes to.

use sea_orm::{ConnectionTrait, Statement};

use crate::{
    error::{CounterError, Result},
    sql::Dialect,
    strategy::Writer,
};

impl Writer {
    /// The share of the Galera node `db` is connected to: writer
    /// `wsrep_local_index` of `wsrep_cluster_size`; `None` on anything
    /// that is not a Galera node (another backend, or MariaDB with
    /// `wsrep_on` off).
    ///
    /// One pool per node, each with the table of its node's share
    /// ([`CounterTable::with_writer`](crate::CounterTable::with_writer)),
    /// keeps the nodes off each other's rows; a process that writes to one
    /// node can [`install`](Writer::install) it. The index is the node's
    /// place in the cluster's current membership: after a node leaves or
    /// joins, ask again (a stale share costs speed, never a count).
    pub async fn of_galera_node<C: ConnectionTrait>(db: &C) -> Result<Option<Writer>> {
        if Dialect::of(db)? != Dialect::MySql {
            return Ok(None);
        }
        let status = |name: &'static str| {
            Statement::from_string(
                Dialect::MySql.backend(),
                format!("SHOW GLOBAL STATUS LIKE '{name}'"),
            )
        };
        let value = |row: Option<sea_orm::QueryResult>| -> Result<Option<u16>> {
            let Some(row) = row else { return Ok(None) };
            let text: String = row.try_get_by_index(1).map_err(CounterError::Database)?;
            Ok(text.trim().parse().ok())
        };
        let ready = db
            .query_one_raw(status("wsrep_ready"))
            .await
            .map_err(CounterError::Database)?;
        let ready: Option<String> = match ready {
            Some(row) => Some(row.try_get_by_index(1).map_err(CounterError::Database)?),
            None => None,
        };
        if !ready.is_some_and(|on| on.eq_ignore_ascii_case("ON")) {
            return Ok(None);
        }
        let index = value(
            db.query_one_raw(status("wsrep_local_index"))
                .await
                .map_err(CounterError::Database)?,
        )?;
        let size = value(
            db.query_one_raw(status("wsrep_cluster_size"))
                .await
                .map_err(CounterError::Database)?,
        )?;
        match (index, size) {
            (Some(index), Some(size)) if index < size => Writer::new(index, size).map(Some),
            _ => Ok(None),
        }
    }
}

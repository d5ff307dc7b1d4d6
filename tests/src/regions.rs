//! Regions' replication between private servers (the guide's "Regions"):
//! one server per region, each replicating the other's rows, on either
//! backend that can.
//!
//! * [`Link::Logical`]: PostgreSQL logical replication. Each region
//!   publishes its own rows (`Region::publish`, or the service's `migrate`
//!   with `[region] publication`) and subscribes to the other's.
//! * [`Link::Binlog`]: MariaDB's row binary log. Each region's server is a
//!   replica of the other's from its current GTID position, a GTID domain
//!   per region, what it applies not logged again (nothing comes back), and
//!   the per-region ledgers left out (`replicate_wild_ignore_table`).
//!
//! A cut is [`Link::replication`] `false` in both regions (`ALTER
//! SUBSCRIPTION .. DISABLE`, `STOP SLAVE`), a heal `true`.

use std::{sync::Arc, time::Duration};

use sea_orm::{ConnectionTrait, DatabaseConnection, Statement};

use crate::{
    MYSQL_URL_VAR, POSTGRES_URL_VAR,
    servers::{self, PrivateMariaDb, PrivatePostgres, PrivateServer},
};

/// How the regions' databases carry each other's rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    /// PostgreSQL logical replication.
    Logical,
    /// MariaDB replication of row binary logs.
    Binlog,
}

/// The tables a region keeps to itself, whatever its replication (the
/// guide's "What is replicated, and what is not"), as
/// `replicate_wild_ignore_table` patterns.
const LEDGERS: [&str; 3] = [
    "%.counter\\_service\\_%",
    "%.counter\\_applied\\_messages",
    "%.counter\\_flush\\_ledger",
];

impl Link {
    /// The backend's name in the figures.
    pub fn backend(self) -> &'static str {
        match self {
            Link::Logical => "postgres",
            Link::Binlog => "mysql",
        }
    }

    /// The URL variable whose presence says this backend's servers can be
    /// started here ([`servers::wanted`]).
    pub fn url_var(self) -> &'static str {
        match self {
            Link::Logical => POSTGRES_URL_VAR,
            Link::Binlog => MYSQL_URL_VAR,
        }
    }

    /// Starts the private server of region `index`, ready to replicate.
    pub async fn launch(self, index: u16) -> Arc<dyn PrivateServer> {
        match self {
            Link::Logical => servers::launch(PrivatePostgres::start_logical).await,
            Link::Binlog => {
                let id = u32::from(index) + 1;
                servers::launch(move || {
                    let mut options = vec![
                        format!("--server-id={id}"),
                        format!("--gtid-domain-id={id}"),
                        "--log-bin=binlog".to_owned(),
                        "--binlog-format=ROW".to_owned(),
                        // Applied from another region, not logged again:
                        // nothing comes back.
                        "--log-slave-updates=0".to_owned(),
                    ];
                    options.extend(
                        LEDGERS.map(|table| format!("--replicate-wild-ignore-table={table}")),
                    );
                    let options: Vec<&str> = options.iter().map(String::as_str).collect();
                    PrivateMariaDb::start_with(&options)
                })
                .await
            }
        }
    }

    /// `db` (a region's database) starts replicating from `other`'s
    /// server: subscribes to its publication `publication` (PostgreSQL),
    /// or becomes its replica from its binary log's current position
    /// (MariaDB; the tables already exist in both, their DDL is not
    /// replayed).
    pub async fn replicate(
        self,
        db: &DatabaseConnection,
        other: &dyn PrivateServer,
        publication: &str,
    ) {
        match self {
            Link::Logical => {
                execute(
                    db,
                    &format!(
                        "CREATE SUBSCRIPTION from_other CONNECTION 'host=127.0.0.1 port={} \
                         user=postgres dbname=postgres' PUBLICATION {publication}",
                        other.port()
                    ),
                )
                .await
            }
            Link::Binlog => {
                let other_db = servers::pool(&other.url(), 1, Duration::from_secs(5)).await;
                let position = text(&other_db, "SELECT @@gtid_binlog_pos").await;
                other_db.close().await.expect("close");
                execute(db, &format!("SET GLOBAL gtid_slave_pos = '{position}'")).await;
                execute(
                    db,
                    &format!(
                        "CHANGE MASTER TO MASTER_HOST = '127.0.0.1', MASTER_PORT = {}, \
                         MASTER_USER = 'root', MASTER_CONNECT_RETRY = 1, \
                         MASTER_USE_GTID = slave_pos",
                        other.port()
                    ),
                )
                .await;
                execute(db, "START SLAVE").await;
            }
        }
    }

    /// Replication into `db`'s region: on (a heal) or off (a cut).
    pub async fn replication(self, db: &DatabaseConnection, on: bool) {
        let sql = match (self, on) {
            (Link::Logical, true) => "ALTER SUBSCRIPTION from_other ENABLE",
            (Link::Logical, false) => "ALTER SUBSCRIPTION from_other DISABLE",
            (Link::Binlog, true) => "START SLAVE",
            (Link::Binlog, false) => "STOP SLAVE",
        };
        execute(db, sql).await;
    }

    /// Conflicts and errors replication into `db` met: its subscription's
    /// `apply_error_count + sync_error_count` (PostgreSQL), or the error
    /// its replica's SQL thread stopped on, `Last_SQL_Errno` (MariaDB: it
    /// stops at a conflict and applies nothing more).
    pub async fn errors(self, db: &DatabaseConnection) -> i64 {
        match self {
            Link::Logical => text(
                db,
                "SELECT CAST(COALESCE(SUM(apply_error_count + sync_error_count), 0) AS TEXT) \
                 FROM pg_stat_subscription_stats",
            )
            .await
            .parse()
            .expect("a count"),
            Link::Binlog => {
                let status = db
                    .query_one_raw(Statement::from_string(
                        db.get_database_backend(),
                        "SHOW SLAVE STATUS",
                    ))
                    .await
                    .expect("SHOW SLAVE STATUS")
                    .expect("a replica");
                let errno = status
                    .try_get::<i64>("", "Last_SQL_Errno")
                    .or_else(|_| status.try_get::<u32>("", "Last_SQL_Errno").map(i64::from))
                    .expect("Last_SQL_Errno");
                if errno != 0 {
                    let error: String = status.try_get("", "Last_SQL_Error").unwrap_or_default();
                    eprintln!("the replica stopped on error {errno}: {error}");
                }
                errno
            }
        }
    }

    /// What a conflict leaves in the server's log: a region wrote a row
    /// another region owns.
    pub fn conflicts_in_log(self) -> &'static [&'static str] {
        match self {
            Link::Logical => &["duplicate key"],
            Link::Binlog => &["Duplicate entry", "Can't find record"],
        }
    }
}

async fn execute(db: &DatabaseConnection, sql: &str) {
    db.execute_unprepared(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// The first column of the one row `sql` returns, as text.
async fn text(db: &DatabaseConnection, sql: &str) -> String {
    db.query_one_raw(Statement::from_string(db.get_database_backend(), sql))
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .unwrap_or_else(|| panic!("{sql}: no row"))
        .try_get_by_index(0)
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

//! One fault, one kind: a connection cut while a call waits on the server
//! is `ErrorKind::Transient` whichever call met it (an autocommit upsert,
//! a batch in its own transaction, a compaction's locking read, a batch
//! read), so a caller's retry policy need not know which call it made.
//! (A dead Galera node's reset connections are the same fault: the Galera
//! suite asserts the same of its killed node.)

use std::time::Duration;

use counter_core::{Compact, Counters, DeltaBatch, ErrorKind};
use counter_tests::{Backend, TestDb, backend_test, counters, figures, proxy::Proxy};
use sea_orm::{ConnectOptions, ConnectionTrait, Database, DatabaseConnection};

/// The calls that meet the fault.
const CALLS: [&str; 4] = ["increment", "batch", "compact", "read"];

async fn call(
    name: &str,
    c: &Counters<i64>,
    db: &DatabaseConnection,
) -> Result<(), counter_core::CounterError> {
    match name {
        "increment" => c.increment(db, 1, "likes").await,
        "batch" => {
            let mut batch = DeltaBatch::new();
            batch.add(c, 1, "likes", 1)?;
            batch.add(c, 2, "likes", 1)?;
            batch.apply(db).await.map(drop)
        }
        "compact" => c.compact(db, &Compact::new()).await.map(drop),
        _ => c.get_many(db, &[1, 2], &["likes"]).await.map(drop),
    }
}

/// Options for a pool of `max` of the test's own to its scratch space.
fn scratch_options(t: &TestDb, max: u32) -> ConnectOptions {
    let mut options = ConnectOptions::new(t.url().expect("a server"));
    options.max_connections(max).sqlx_logging(false);
    if let Some(schema) = t.schema() {
        options.set_schema_search_path(schema);
    }
    options
}

/// One connection of its own that holds `table` locked against readers
/// and writers until [`release`].
async fn lock_table(t: &TestDb, table: &str) -> DatabaseConnection {
    let mut options = scratch_options(t, 1);
    options.min_connections(1);
    let holder = Database::connect(options)
        .await
        .expect("the lock's connection");
    let statements = match t.backend {
        Backend::Postgres => vec![
            "BEGIN".to_owned(),
            format!("LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"),
        ],
        _ => vec![format!("LOCK TABLES {table} WRITE")],
    };
    for sql in statements {
        holder
            .execute_unprepared(&sql)
            .await
            .expect("lock the table");
    }
    holder
}

async fn release(t: &TestDb, holder: DatabaseConnection) {
    let sql = match t.backend {
        Backend::Postgres => "ROLLBACK",
        _ => "UNLOCK TABLES",
    };
    holder.execute_unprepared(sql).await.expect("unlock");
    let _ = holder.close().await;
}

backend_test! {
    #[backends(postgres, mysql)]
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[label = "fault_kinds"]
    /// Each call waits on a locked table through a proxy that then cuts
    /// every connection: each returns an error of kind `Transient`.
    async fn a_lost_connection_is_transient_on_every_path(t: TestDb) {
        let table = "kind_counters";
        let c = counters::<i64>(table, 4);
        c.create_table(&t.db).await.expect("create the table");
        c.add(&t.db, 1, "likes", 5).await.expect("a row");
        c.add(&t.db, 1, "likes", 5).await.expect("a second row");
        let upstream = t.server_addr().expect("a server address");
        let proxy = Proxy::start(&upstream).await.expect("start the proxy");
        let via = t
            .connect_via(&proxy.addr().to_string(), 2)
            .await
            .expect("connect through the proxy");
        let mut transient = 0u64;
        for name in CALLS {
            let holder = lock_table(&t, table).await;
            let (c2, via2) = (c.clone(), via.clone());
            let waiting = tokio::spawn(async move { call(name, &c2, &via2).await });
            tokio::time::sleep(Duration::from_millis(400)).await;
            assert!(!waiting.is_finished(), "[{}] {name} did not wait on the lock", t.backend);
            proxy.cut_all();
            let outcome = tokio::time::timeout(Duration::from_secs(30), waiting)
                .await
                .expect("the call ends once its connection is cut")
                .expect("the call's task");
            release(&t, holder).await;
            let error = outcome.expect_err("a call whose connection was cut");
            assert_eq!(
                error.kind(),
                ErrorKind::Transient,
                "[{}] {name}: {error} ({error:?})",
                t.backend
            );
            transient += 1;
        }
        // A cut write's outcome is unknown (the server may run it once the
        // lock is gone: the doc of `Transient` says so): the increment and
        // the batch each added 1 to owner 1, or did not.
        let total = c.get(&t.db, 1, "likes").await.expect("read");
        assert!((10..=12).contains(&total), "[{}] {total}", t.backend);
        figures("fault_kinds", t.backend, &[("calls", CALLS.len() as u64), ("transient", transient)]);
        t.finish().await;
    }
}

/// A PostgreSQL pool whose every session refuses writes, as a standby (or
/// a primary Patroni just demoted, which HAProxy still routes to) does.
async fn read_only_pool(t: &TestDb) -> DatabaseConnection {
    let mut options = scratch_options(t, 2);
    options.map_sqlx_postgres_opts(|o| o.options([("default_transaction_read_only", "on")]));
    Database::connect(options).await.expect("a read-only pool")
}

backend_test! {
    // A hot standby's sessions are read-only transactions that refuse every
    // write with 25006, as here. (MariaDB's session access mode is no such
    // model: a transaction the crate opens is not refused by it, and its
    // server-wide `read_only` spares the privileged users tests run as.)
    #[backends(postgres)]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[label = "read_only_kinds"]
    /// Every write refused by a server that takes no writes (PostgreSQL's
    /// 25006) is `Transient`, as a
    /// failover's demoted primary is: the same write succeeds on the new
    /// primary. Reads still answer, and nothing was written.
    async fn a_read_only_server_is_transient_on_every_write(t: TestDb) {
        if counter_core::pooling::is_transaction_pooled(&t.db) {
            // PgBouncer refuses a startup `options` parameter, and a session
            // setting would not outlive a transaction behind it.
            eprintln!("skipped {}: a read-only session needs a direct connection", t.label());
            t.finish().await;
            return;
        }
        let table = "read_only_counters";
        let c = counters::<i64>(table, 4);
        c.create_table(&t.db).await.expect("create the table");
        // Rows in several slots (4^-39 that 40 adds share one): work for
        // the compaction to refuse.
        for _ in 0..40 {
            c.add(&t.db, 1, "likes", 1).await.expect("a row");
        }
        let standby = read_only_pool(&t).await;
        let mut transient = 0u64;
        for name in ["increment", "batch", "compact"] {
            let Err(error) = call(name, &c, &standby).await else {
                panic!("[{}] {name} wrote on a read-only server", t.backend);
            };
            assert_eq!(
                error.kind(),
                ErrorKind::Transient,
                "[{}] {name}: {error} ({error:?})",
                t.backend
            );
            transient += 1;
        }
        call("read", &c, &standby).await.expect("a read on a read-only server");
        assert_eq!(c.get(&t.db, 1, "likes").await.expect("read"), 40, "[{}]", t.backend);
        let _ = standby.close().await;
        figures("read_only_kinds", t.backend, &[("writes", 3), ("transient", transient)]);
        t.finish().await;
    }
}

//! Where the bench writes: one database, or every node of a multi-primary
//! cluster (`--database-url a,b,c`).
//!
//! Client `i` of a cell writes through node `i % n`, each node with a pool
//! of its own sized for its clients. Tables are created and dropped, and
//! totals read, on the first node. On a cluster, a node applies the other
//! nodes' commits a moment after they returned to their clients (Galera's
//! replication is synchronous only up to certification), so before a
//! cell's totals are checked [`Nodes::agree`] reads them on every node
//! until all nodes read the same, for at most [`AGREEMENT_WAIT`].

use std::time::{Duration, Instant};

use sea_orm::{ConnectOptions, Database, DatabaseConnection};

use crate::writes::BoxError;

/// How long a multi-node run waits for every node to read the same totals.
pub const AGREEMENT_WAIT: Duration = Duration::from_secs(20);
/// How often it reads them meanwhile.
const AGREEMENT_POLL: Duration = Duration::from_millis(100);
/// At most as many nodes as a `Writer` can have (`Slots::MAX`), so that
/// every node can get a share of the slots.
const MAX_NODES: usize = 1024;

/// `--database-url`: one URL per node, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UrlList(pub Vec<String>);

impl UrlList {
    /// Splits a comma-separated list, trimming blanks around each URL; an
    /// empty entry (`a,,b`, a trailing comma) is refused rather than
    /// skipped, since it is most likely a typo in a node list.
    pub fn parse(text: &str) -> Result<Self, String> {
        let urls: Vec<String> = text.split(',').map(|u| u.trim().to_owned()).collect();
        if let Some(at) = urls.iter().position(String::is_empty) {
            return Err(format!("URL {} of the list is empty", at + 1));
        }
        if urls.len() > MAX_NODES {
            return Err(format!("at most {MAX_NODES} URLs, not {}", urls.len()));
        }
        Ok(Self(urls))
    }
}

/// How many of `clients` clients write through node `node` of `nodes`
/// (client `i` uses node `i % nodes`).
pub fn clients_on(node: usize, nodes: usize, clients: usize) -> usize {
    (clients + nodes - 1 - node) / nodes
}

/// One pool per node.
pub struct Nodes {
    pools: Vec<DatabaseConnection>,
}

/// The node a client writes through.
#[derive(Clone, Copy)]
pub struct Node<'a> {
    /// Its position in `--database-url`.
    pub index: usize,
    /// How many nodes there are.
    pub count: usize,
    pub db: &'a DatabaseConnection,
}

impl Nodes {
    /// Connects to every node, each pool sized for the most clients a cell
    /// puts on it plus two (setup, checks, the lag probe). All nodes must
    /// be the same kind of database.
    pub async fn connect(urls: &[String], max_clients: usize) -> Result<Self, BoxError> {
        let mut pools = Vec::with_capacity(urls.len());
        for (node, url) in urls.iter().enumerate() {
            let clients = clients_on(node, urls.len(), max_clients);
            let mut options = ConnectOptions::new(url);
            options
                .max_connections(u32::try_from(clients)? + 2)
                .min_connections(1)
                .acquire_timeout(Duration::from_secs(60))
                .sqlx_logging(false);
            let pool = Database::connect(options)
                .await
                .map_err(|e| format!("node {} of --database-url: {e}", node + 1))?;
            pools.push(pool);
        }
        let Some(first) = pools.first() else {
            return Err("--database-url names no database".into());
        };
        let backend = first.get_database_backend();
        if pools.iter().any(|p| p.get_database_backend() != backend) {
            return Err("every URL of --database-url must be the same kind of database".into());
        }
        Ok(Self { pools })
    }

    /// The first node: setup, checks, history, reads.
    pub fn first(&self) -> &DatabaseConnection {
        &self.pools[0]
    }

    pub fn len(&self) -> usize {
        self.pools.len()
    }

    /// The node client `client` writes through.
    pub fn for_client(&self, client: usize) -> Node<'_> {
        let index = client % self.pools.len();
        Node {
            index,
            count: self.pools.len(),
            db: &self.pools[index],
        }
    }

    /// `observe` on the first node and, on a multi-node run, whether every
    /// node read the same: read on all nodes (first node last, so its
    /// reading is the latest) until they agree or [`AGREEMENT_WAIT`] has
    /// passed. `None` on a single node.
    pub async fn agree<T, F>(&self, observe: F) -> Result<(T, Option<bool>), BoxError>
    where
        T: PartialEq,
        F: AsyncFn(&DatabaseConnection) -> Result<T, BoxError>,
    {
        let (first, others) = (self.first(), &self.pools[1..]);
        if others.is_empty() {
            return Ok((observe(first).await?, None));
        }
        let deadline = Instant::now() + AGREEMENT_WAIT;
        loop {
            let mut readings = Vec::with_capacity(others.len());
            for node in others {
                readings.push(observe(node).await?);
            }
            let reading = observe(first).await?;
            let agreed = readings.iter().all(|r| *r == reading);
            if agreed || Instant::now() >= deadline {
                return Ok((reading, Some(agreed)));
            }
            tokio::time::sleep(AGREEMENT_POLL).await;
        }
    }

    pub async fn close(self) -> Result<(), BoxError> {
        for pool in self.pools {
            pool.close().await?;
        }
        Ok(())
    }
}

/// The databases to measure: the given URLs, or a temporary SQLite file
/// that is removed (with its journal files) when the run ends.
pub struct TempDatabase {
    urls: Vec<String>,
    file: Option<std::path::PathBuf>,
}

impl TempDatabase {
    pub fn new(urls: Option<UrlList>) -> Self {
        match urls {
            Some(UrlList(urls)) => Self { urls, file: None },
            None => {
                let file =
                    std::env::temp_dir().join(format!("counter-bench-{}.db", std::process::id()));
                Self {
                    urls: vec![format!("sqlite://{}?mode=rwc", file.display())],
                    file: Some(file),
                }
            }
        }
    }

    /// One URL per node; never empty.
    pub fn urls(&self) -> &[String] {
        &self.urls
    }
}

impl Drop for TempDatabase {
    fn drop(&mut self) {
        if let Some(file) = &self.file {
            for suffix in ["", "-wal", "-shm", "-journal"] {
                let mut path = file.clone().into_os_string();
                path.push(suffix);
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_lists_split_on_commas() {
        let one = UrlList::parse("postgres://postgres@127.0.0.1:5432/bench").unwrap();
        assert_eq!(one.0, ["postgres://postgres@127.0.0.1:5432/bench"]);
        let three = UrlList::parse("mysql://a:3306/b, mysql://c:3306/b ,mysql://d:3306/b").unwrap();
        assert_eq!(
            three.0,
            ["mysql://a:3306/b", "mysql://c:3306/b", "mysql://d:3306/b"]
        );
        for bad in ["", "a,,b", "a,", " , a"] {
            assert!(UrlList::parse(bad).is_err(), "{bad:?}");
        }
        assert!(UrlList::parse(&vec!["x"; 1025].join(",")).is_err());
    }

    #[test]
    fn clients_are_spread_round_robin() {
        assert_eq!(clients_on(0, 1, 64), 64);
        let spread: Vec<usize> = (0..3).map(|node| clients_on(node, 3, 64)).collect();
        assert_eq!(spread, [22, 21, 21]);
        assert_eq!(spread.iter().sum::<usize>(), 64);
        // Fewer clients than nodes: the last nodes get none.
        assert_eq!((0..3).map(|n| clients_on(n, 3, 1)).sum::<usize>(), 1);
        assert_eq!(clients_on(2, 3, 1), 0);
    }

    #[test]
    fn without_a_url_the_bench_gets_a_temporary_sqlite_file() {
        let temp = TempDatabase::new(None);
        assert_eq!(temp.urls().len(), 1);
        assert!(temp.urls()[0].starts_with("sqlite://"));
        let given = TempDatabase::new(Some(UrlList(vec!["a".into(), "b".into()])));
        assert_eq!(given.urls(), ["a", "b"]);
    }
}

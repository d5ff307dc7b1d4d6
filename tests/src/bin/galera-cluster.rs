//! Starts the private three-node Galera cluster of the tests
//! ([`GaleraCluster`]), prints its nodes' URLs (comma-separated, as
//! `counter-bench --database-url` takes them), and stops and deletes it
//! when its standard input closes or a line is entered:
//!
//! ```text
//! COUNTER_TEST_GALERA_PROVIDER=/usr/lib/galera/libgalera_smm.so \
//!     cargo run -p counter-tests --bin galera-cluster
//! ```

use std::io::BufRead;

use counter_tests::galera::{self, GaleraCluster};

fn main() {
    let Some(provider) = galera::provider("galera-cluster") else {
        std::process::exit(2);
    };
    let cluster = GaleraCluster::start(provider);
    println!("{}", cluster.urls().join(","));
    eprintln!(
        "cluster in {:?}; press Enter (or close stdin) to stop it",
        cluster.dir()
    );
    let _ = std::io::stdin().lock().lines().next();
    drop(cluster);
}

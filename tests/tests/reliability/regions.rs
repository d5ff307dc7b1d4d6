//! Two regions on PostgreSQL logical replication (RELIABILITY.md, issue
//! 51): two private PostgreSQL clusters, each the database of one region,
//! each publishing its own slot rows (counters, buckets, sketches, its
//! heartbeat) and subscribed to the other's. Writers count in both regions
//! at once (increments, windowed adds, unique observes) while replication
//! is cut (both subscriptions disabled) and healed, several times, and
//! while one region's PostgreSQL is SIGKILLed and restarted. Checked:
//!
//! * no write is refused because of a cut (0 failed in either region);
//! * after each heal, both regions read every acknowledged add, once:
//!   totals, bucket ranges and rankings equal on both and equal to the
//!   writers' tally; unique estimates equal the estimate of the union of
//!   every acknowledged member (the merge of sketches is a union);
//! * the time from heal to equal totals (p50 and max printed), and the
//!   other region's heartbeat age during a cut (it grows) and after;
//! * after the kill, the killed region catches up the same way, timed from
//!   its restart (writes in doubt, cut by the kill, are bounded:
//!   acknowledged <= total <= acknowledged + in doubt);
//! * neither subscription ever met a conflict (`pg_stat_subscription_stats`).
//!
//! The same runs on MariaDB's own replication (the guide's "Regions",
//! "MariaDB"): two private servers with row binary logs, each a replica of
//! the other (GTID, one domain per region), the ledgers left out by
//! `replicate_wild_ignore_table`; a cut is `STOP SLAVE` in both, a heal
//! `START SLAVE`, and neither replica's SQL thread may ever stop on an
//! error.

use std::{
    collections::{BTreeSet, HashMap},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering::SeqCst},
    },
    time::{Duration, Instant},
};

use chrono::{DateTime, TimeZone, Utc};
use counter_core::{
    CounterError, CounterTable, Counters, Reconcile, Region, Truth, Window, unique::Sketch,
};
use counter_tests::{
    figures,
    regions::Link,
    servers::{self, PrivateServer, Stop},
};
use sea_orm::DatabaseConnection;

const TABLE: &str = "post_counters";
const OWNERS: i64 = 40;
const WRITERS: u64 = 3;
/// Cut-and-heal rounds: each gives one convergence time per region pair.
const ROUNDS: usize = 4;
/// How long writers run connected, then cut, in each round.
const CONNECTED: Duration = Duration::from_millis(700);
const CUT: Duration = Duration::from_millis(1_500);
/// The most a convergence may take before the test fails.
const CONVERGE_WITHIN: Duration = Duration::from_secs(60);

fn counters() -> Counters<i64> {
    let table = CounterTable::new(TABLE)
        .and_then(|t| t.with_slots(8))
        .and_then(|t| t.with_key_window("views", Window::Hour))
        .and_then(|t| t.with_unique_key("viewers"))
        .expect("a valid table");
    Counters::new(table)
}

/// The hours windowed adds land in.
fn hour(n: i64) -> DateTime<Utc> {
    Utc.timestamp_opt(1_790_000_000 / 3600 * 3600 + n * 3600, 0)
        .unwrap()
}

/// One region: its server, a pool to it, its counters.
struct Side {
    name: &'static str,
    link: Link,
    server: Arc<dyn PrivateServer>,
    db: DatabaseConnection,
    region: Region,
    counters: Counters<i64>,
}

impl Side {
    /// Replication into this region from the other: on or off.
    async fn subscription(&self, on: bool) {
        self.link.replication(&self.db, on).await;
    }
}

/// What the writers of one region had acknowledged, and what is in doubt.
#[derive(Default)]
struct Tally {
    likes: HashMap<i64, i64>,
    views: HashMap<(i64, i64), i64>,
    members: HashMap<i64, BTreeSet<String>>,
    /// Writes cut by a fault with their outcome unknown, per owner.
    doubt_likes: HashMap<i64, i64>,
    doubt_views: HashMap<(i64, i64), i64>,
    doubt_members: HashMap<i64, BTreeSet<String>>,
    acked: u64,
    failed: u64,
}

impl Tally {
    fn absorb(&mut self, other: Tally) {
        for (k, v) in other.likes {
            *self.likes.entry(k).or_default() += v;
        }
        for (k, v) in other.views {
            *self.views.entry(k).or_default() += v;
        }
        for (k, v) in other.members {
            self.members.entry(k).or_default().extend(v);
        }
        for (k, v) in other.doubt_likes {
            *self.doubt_likes.entry(k).or_default() += v;
        }
        for (k, v) in other.doubt_views {
            *self.doubt_views.entry(k).or_default() += v;
        }
        for (k, v) in other.doubt_members {
            self.doubt_members.entry(k).or_default().extend(v);
        }
        self.acked += other.acked;
        self.failed += other.failed;
    }
}

/// Counts in `side` until `stop`: increments, windowed adds and observes in
/// turn, on owners in turn from a start of its own.
async fn writer(
    side: Arc<Side>,
    task: u64,
    round: usize,
    stop: Arc<AtomicBool>,
    limit: Duration,
) -> Tally {
    let mut tally = Tally::default();
    let began = Instant::now();
    let mut i: u64 = 0;
    while !stop.load(SeqCst) && began.elapsed() < limit {
        i += 1;
        let owner = 1 + ((i * 7 + task * 13) % OWNERS as u64) as i64;
        let counters = &side.counters;
        let db = &side.db;
        match i % 3 {
            0 => match counters.increment(db, owner, "likes").await {
                Ok(()) => *tally.likes.entry(owner).or_default() += 1,
                Err(e) => note_failure(&mut tally, &e, |t| {
                    *t.doubt_likes.entry(owner).or_default() += 1
                }),
            },
            1 => {
                let h = (i % 3) as i64;
                match counters
                    .add_at(
                        db,
                        owner,
                        "views",
                        2,
                        hour(h) + chrono::Duration::minutes(5),
                    )
                    .await
                {
                    Ok(()) => *tally.views.entry((owner, h)).or_default() += 2,
                    Err(e) => note_failure(&mut tally, &e, |t| {
                        *t.doubt_views.entry((owner, h)).or_default() += 2
                    }),
                }
            }
            _ => {
                let member = format!("{}-{round}-{task}-{i}", side.name);
                match counters
                    .observe(db, owner, "viewers", member.as_str())
                    .await
                {
                    Ok(()) => {
                        tally.members.entry(owner).or_default().insert(member);
                    }
                    Err(e) => note_failure(&mut tally, &e, |t| {
                        t.doubt_members
                            .entry(owner)
                            .or_default()
                            .insert(member.clone());
                    }),
                }
            }
        }
        if tally.failed + tally.doubt_count() > 0 {
            // Its region is down: do not spin.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    tally.acked = (tally.likes.values().sum::<i64>()
        + tally.views.values().sum::<i64>() / 2
        + tally.members.values().map(|m| m.len() as i64).sum::<i64>()) as u64;
    tally
}

impl Tally {
    fn doubt_count(&self) -> u64 {
        (self.doubt_likes.values().sum::<i64>()
            + self.doubt_views.values().sum::<i64>() / 2
            + self
                .doubt_members
                .values()
                .map(|m| m.len() as i64)
                .sum::<i64>()) as u64
    }
}

/// A failed write: in doubt if its outcome is unknown (`doubt`), else
/// failed, nothing written.
fn note_failure(tally: &mut Tally, err: &CounterError, doubt: impl FnOnce(&mut Tally)) {
    if err.outcome_unknown() {
        doubt(tally);
    } else {
        tally.failed += 1;
    }
}

/// Runs `WRITERS` writers in each of `sides` for `phase` (calling `during`
/// once they run) and returns each region's tally.
async fn write_while<F, Fut>(
    sides: &[Arc<Side>],
    round: usize,
    phase: Duration,
    during: F,
) -> Vec<Tally>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let stop = Arc::new(AtomicBool::new(false));
    let limit = phase + Duration::from_secs(120);
    let tasks: Vec<Vec<_>> = sides
        .iter()
        .map(|side| {
            (0..WRITERS)
                .map(|task| tokio::spawn(writer(side.clone(), task, round, stop.clone(), limit)))
                .collect()
        })
        .collect();
    let began = Instant::now();
    during().await;
    tokio::time::sleep(phase.saturating_sub(began.elapsed())).await;
    stop.store(true, SeqCst);
    let mut tallies = Vec::new();
    for region in tasks {
        let mut tally = Tally::default();
        for task in region {
            tally.absorb(task.await.expect("a writer task"));
        }
        tallies.push(tally);
    }
    tallies
}

/// What one region reads: likes and views totals, bucket ranges, unique
/// estimates, the top ten by likes.
#[derive(Debug, PartialEq)]
struct Reading {
    likes: Vec<i64>,
    views: Vec<i64>,
    hours: Vec<Vec<i64>>,
    viewers: Vec<u64>,
    top: Vec<(i64, i64)>,
}

async fn read(side: &Side) -> Result<Reading, CounterError> {
    let owners: Vec<i64> = (1..=OWNERS).collect();
    let c = &side.counters;
    let totals = c.get_many(&side.db, &owners, &["likes", "views"]).await?;
    let mut hours = Vec::new();
    for h in 0..3 {
        let range = c
            .range_many(&side.db, &owners, "views", hour(h), hour(h + 1))
            .await?;
        hours.push(owners.iter().map(|o| range[o]).collect());
    }
    let viewers = c.unique_many(&side.db, &owners, &["viewers"]).await?;
    let top = c.top(&side.db, "likes", 10).await?;
    Ok(Reading {
        likes: owners.iter().map(|o| totals[o]["likes"]).collect(),
        views: owners.iter().map(|o| totals[o]["views"]).collect(),
        hours,
        viewers: owners.iter().map(|o| viewers[o]["viewers"]).collect(),
        top: top.into_iter().map(|r| (r.owner, r.total)).collect(),
    })
}

/// Whether `reading` holds exactly what `tally` acknowledged (writes in
/// doubt: at least what was acknowledged, at most that plus the doubtful);
/// the first difference otherwise.
fn check(reading: &Reading, tally: &Tally) -> Result<(), String> {
    for owner in 1..=OWNERS {
        let i = (owner - 1) as usize;
        let likes = tally.likes.get(&owner).copied().unwrap_or(0);
        let doubt = tally.doubt_likes.get(&owner).copied().unwrap_or(0);
        if !(likes..=likes + doubt).contains(&reading.likes[i]) {
            return Err(format!(
                "owner {owner}: likes {} not in {likes}..={}",
                reading.likes[i],
                likes + doubt
            ));
        }
        let mut views = 0;
        for h in 0..3 {
            let acked = tally.views.get(&(owner, h)).copied().unwrap_or(0);
            let doubt = tally.doubt_views.get(&(owner, h)).copied().unwrap_or(0);
            views += acked;
            let got = reading.hours[h as usize][i];
            if !(acked..=acked + doubt).contains(&got) {
                return Err(format!(
                    "owner {owner}: hour {h} views {got} not in {acked}..={}",
                    acked + doubt
                ));
            }
        }
        let doubt_views: i64 = (0..3)
            .map(|h| tally.doubt_views.get(&(owner, h)).copied().unwrap_or(0))
            .sum();
        if !(views..=views + doubt_views).contains(&reading.views[i]) {
            return Err(format!(
                "owner {owner}: views total {} not in {views}..",
                reading.views[i]
            ));
        }
        let mut sketch = Sketch::new();
        for member in tally.members.get(&owner).into_iter().flatten() {
            sketch.insert(member.as_str());
        }
        let low = sketch.estimate();
        for member in tally.doubt_members.get(&owner).into_iter().flatten() {
            sketch.insert(member.as_str());
        }
        let high = sketch.estimate();
        if !(low..=high).contains(&reading.viewers[i]) {
            return Err(format!(
                "owner {owner}: viewers {} not in {low}..={high}",
                reading.viewers[i]
            ));
        }
    }
    Ok(())
}

/// Polls both regions until each reads what `tally` holds and both read
/// the same; the time since `since` (the heal) when they do.
async fn converge(sides: &[Arc<Side>], tally: &Tally, since: Instant, what: &str) -> Duration {
    let began = since;
    loop {
        let mut last = String::new();
        let mut readings = Vec::new();
        for side in sides {
            match read(side).await {
                Ok(reading) => {
                    if let Err(e) = check(&reading, tally) {
                        last = format!("region {}: {e}", side.name);
                    }
                    readings.push(reading);
                }
                Err(e) => last = format!("region {}: read failed: {e}", side.name),
            }
        }
        if last.is_empty() && readings.windows(2).all(|w| w[0] == w[1]) {
            return began.elapsed();
        }
        if last.is_empty() {
            last = "the regions read different totals".to_owned();
        }
        assert!(
            began.elapsed() < CONVERGE_WITHIN,
            "{what}: not converged after {CONVERGE_WITHIN:?}: {last}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Starts a region: its server (logical WAL, or a row binary log), its
/// tables, on PostgreSQL its publication.
async fn region(name: &'static str, index: u16, link: Link) -> Side {
    let server = link.launch(index).await;
    eprintln!(
        "region {name}: private {} on port {}",
        link.backend(),
        server.port()
    );
    let db = servers::pool(&server.url(), 12, Duration::from_secs(2)).await;
    let region = Region::new(name, index, 2).expect("a valid region");
    let counters = counters().in_region(region.clone());
    counters.create_table(&db).await.expect("create the tables");
    Region::create_beat_table(&db)
        .await
        .expect("create the heartbeat table");
    if link == Link::Logical {
        region
            .publish(&db, &format!("counters_{name}"), &[counters.table()])
            .await
            .expect("publish the region's rows");
    }
    Side {
        name,
        link,
        server,
        db,
        region,
        counters,
    }
}

/// `side` replicates from `other`.
async fn subscribe(side: &Side, other: &Side) {
    side.link
        .replicate(
            &side.db,
            &*other.server,
            &format!("counters_{}", other.name),
        )
        .await;
}

/// Beats every 100 ms in each region until `stop`.
fn heartbeats(sides: &[Arc<Side>], stop: Arc<AtomicBool>) -> Vec<tokio::task::JoinHandle<()>> {
    sides
        .iter()
        .map(|side| {
            let (side, stop) = (side.clone(), stop.clone());
            tokio::spawn(async move {
                while !stop.load(SeqCst) {
                    // A region down cannot beat; it beats again when back.
                    let _ = side.region.beat(&side.db).await;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
        })
        .collect()
}

/// The age of the other region's heartbeat in `side`.
async fn lag(side: &Side) -> Duration {
    let lags = side
        .region
        .lags(&side.db)
        .await
        .expect("read the heartbeats");
    assert_eq!(lags.len(), 1, "region {}: {lags:?}", side.name);
    lags[0].age
}

/// Conflicts and errors replication met in both regions.
async fn replication_errors(sides: &[Arc<Side>]) -> i64 {
    let mut errors = 0;
    for side in sides {
        errors += side.link.errors(&side.db).await;
    }
    errors
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_regions_count_through_cuts_and_a_kill_and_converge_exactly() {
    if servers::wanted(
        Link::Logical.url_var(),
        "two_regions_count_through_cuts_and_a_kill_and_converge_exactly",
    ) {
        cut_heal_kill(Link::Logical).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_mariadb_regions_count_through_cuts_and_a_kill_and_converge_exactly() {
    if servers::wanted(
        Link::Binlog.url_var(),
        "two_mariadb_regions_count_through_cuts_and_a_kill_and_converge_exactly",
    ) {
        cut_heal_kill(Link::Binlog).await;
    }
}

/// Two regions replicating by `link`: cut and healed `ROUNDS` times under
/// writers, then one region's server SIGKILLed and restarted; the figures
/// `regions_cut_heal_kill`.
async fn cut_heal_kill(link: Link) {
    let began = Instant::now();
    let (a, b) = tokio::join!(region("a", 0, link), region("b", 1, link));
    subscribe(&a, &b).await;
    subscribe(&b, &a).await;
    let sides = [Arc::new(a), Arc::new(b)];
    let beating = Arc::new(AtomicBool::new(false));
    let beats = heartbeats(&sides, beating.clone());

    // A repair needs every region's rows at once: refused, typed.
    let refused = sides[0]
        .counters
        .reconcile(
            &sides[0].db,
            "likes",
            Truth::rows_of("likes_src", "post_id"),
            &Reconcile::new(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, CounterError::CrossRegion { region, .. } if region == "a"),
        "{refused}"
    );

    let mut expected = Tally::default();
    let mut convergence = Vec::new();
    let mut cut_lags = Vec::new();
    // The most writes one region made during one cut: the backlog a heal
    // sends the other.
    let mut cut_backlog = 0;
    for round in 0..ROUNDS {
        // Connected, then cut (both ways) while the writers go on.
        for (i, tally) in write_while(&sides, round, CONNECTED, || async {})
            .await
            .into_iter()
            .enumerate()
        {
            assert_eq!(
                (tally.failed, tally.doubt_count()),
                (0, 0),
                "region {i} connected, round {round}"
            );
            expected.absorb(tally);
        }
        for side in &sides {
            side.subscription(false).await;
        }
        let tallies = write_while(&sides, round, CUT, || async {}).await;
        for (i, tally) in tallies.into_iter().enumerate() {
            // Nothing refused because of the cut.
            assert_eq!(
                (tally.failed, tally.doubt_count()),
                (0, 0),
                "region {i} during the cut, round {round}"
            );
            assert!(tally.acked > 0, "region {i} wrote during the cut");
            cut_backlog = cut_backlog.max(tally.acked);
            expected.absorb(tally);
        }
        cut_lags.push(lag(&sides[0]).await.min(lag(&sides[1]).await));
        // Healed: from here to both regions reading every add.
        let healed = Instant::now();
        for side in &sides {
            side.subscription(true).await;
        }
        convergence.push(converge(&sides, &expected, healed, &format!("round {round}")).await);
    }
    // Cuts are not errors: no apply worker has failed yet.
    assert_eq!(
        replication_errors(&sides).await,
        0,
        "a subscription failed during the rounds"
    );
    let settled_lag = {
        tokio::time::sleep(Duration::from_millis(300)).await;
        lag(&sides[0]).await.max(lag(&sides[1]).await)
    };

    // Region b's PostgreSQL SIGKILLed while both write, restarted a second
    // later; a's writers never notice.
    // The writers stop as soon as b takes connections again: what b missed
    // of a's writes while down, and what a missed of b's before the kill,
    // must then cross; the catch-up is timed from the restart.
    let killed = sides[1].server.clone();
    let restarted = Arc::new(std::sync::Mutex::new(None));
    let restart_time = restarted.clone();
    let tallies = write_while(&sides, ROUNDS, Duration::ZERO, || async move {
        tokio::time::sleep(Duration::from_millis(800)).await;
        servers::stop(&killed, Stop::Kill).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        servers::start(&killed).await;
        *restart_time.lock().expect("not poisoned") = Some(Instant::now());
    })
    .await;
    let (a_tally, b_tally) = (&tallies[0], &tallies[1]);
    assert_eq!(
        (a_tally.failed, a_tally.doubt_count()),
        (0, 0),
        "region a while b was killed"
    );
    let b_lost_writes = b_tally.failed + b_tally.doubt_count();
    let b_doubt = b_tally.doubt_count();
    for tally in tallies {
        expected.absorb(tally);
    }
    let restarted = restarted
        .lock()
        .expect("not poisoned")
        .expect("b restarted");
    let catch_up = converge(&sides, &expected, restarted, "after the kill").await;
    // And b counts again, its writes reaching a.
    let after = write_while(&sides, ROUNDS + 1, CONNECTED, || async {}).await;
    assert!(
        after[1].acked > 0,
        "region b wrote nothing after its restart"
    );
    let b_after = after[1].acked;
    for tally in after {
        expected.absorb(tally);
    }
    converge(&sides, &expected, Instant::now(), "after b's restart").await;

    beating.store(true, SeqCst);
    for beat in beats {
        beat.await.expect("a heartbeat task");
    }
    // The kill cut b's walsender and a's apply worker (errors they count),
    // but no change ever met a conflict: a duplicate key (or, MariaDB, a
    // row to update not found) stops a subscription or a replica, and
    // every total above would be short.
    if link == Link::Binlog {
        assert_eq!(
            replication_errors(&sides).await,
            0,
            "a replica stopped on an error"
        );
    }
    for side in &sides {
        let log = std::fs::read_to_string(side.server.log_file())
            .unwrap_or_else(|e| panic!("region {}: read the server's log: {e}", side.name));
        for conflict in link.conflicts_in_log() {
            assert!(
                !log.contains(conflict),
                "region {}: a conflict in the log ({conflict})",
                side.name
            );
        }
    }

    convergence.sort();
    let ms = |d: Duration| d.as_millis() as u64;
    let min_cut_lag = cut_lags.iter().min().copied().unwrap_or_default();
    // The heartbeat shows the cut: the other region's beat stops arriving.
    assert!(min_cut_lag >= CUT, "lag seen during a cut: {cut_lags:?}");
    assert!(
        settled_lag < Duration::from_secs(2),
        "lag once healed: {settled_lag:?}"
    );
    figures(
        "regions_cut_heal_kill",
        link.backend(),
        &[
            ("regions", 2),
            ("rounds", ROUNDS as u64),
            ("acked_writes", expected.acked),
            ("lost", 0),
            ("doubled", 0),
            ("refused_during_cuts", 0),
            ("converge_p50_ms", ms(percentile(&convergence, 0.5))),
            ("converge_max_ms", ms(*convergence.last().expect("rounds"))),
            ("lag_during_cut_min_ms", ms(min_cut_lag)),
            ("cut_backlog_max_writes", cut_backlog),
            ("lag_healed_ms", ms(settled_lag)),
            ("kill_failed_writes_b", b_lost_writes),
            ("kill_in_doubt_b", b_doubt),
            ("kill_catch_up_ms", ms(catch_up)),
            ("b_writes_after_restart", b_after),
            ("secs", began.elapsed().as_secs()),
        ],
    );
}

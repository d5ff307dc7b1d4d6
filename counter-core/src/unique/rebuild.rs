//! Rebuilding unique counts from the application's own record of members
//! (a `post_views (post_id, user_id)` table): for a unique key added to an
//! app that already has data, or sketches lost with a restore.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, NaiveDateTime, Utc};
use sea_orm::{DatabaseConnection, DbErr, QueryResult, Value};

use super::{Sketch, merge::Merges, observe::cell};
use crate::{
    CounterError, Counters, detach,
    error::Result,
    owner::OwnerId,
    retry,
    sql::{
        Dialect,
        sketches::{self, ALL_TIME, MEMBER, SEEN_AT},
    },
    table::validate_table_name,
    typed::{KeySpace, UniqueKeyOf},
};

/// Owners a rebuild reads the members of per query.
const OWNERS_PER_CHUNK: u64 = 1_000;
/// Sketch rows a rebuild merges into per transaction: 1,000 owners' days
/// of a year are 365,000 rows, too many for one.
const CELLS_PER_TRANSACTION: usize = 5_000;

/// Where a rebuild reads members: a table with one row per (owner,
/// member), named by table and columns, such as a `post_views (post_id,
/// user_id)` join table. Identifiers follow the rules of table names and
/// are quoted.
#[derive(Debug, Clone)]
pub struct Members {
    table: String,
    owner: String,
    member: String,
    at: Option<String>,
}

impl Members {
    /// The members `member` of owners `owner` in `table`. A member is
    /// hashed as the text the database casts it to (`CAST(.. AS TEXT)`,
    /// `AS CHAR` on MySQL): integers and strings as
    /// [`Member`](super::Member) hashes them, so observing `42_i64` and
    /// rebuilding from a `BIGINT` column agree.
    pub fn of(
        table: impl Into<String>,
        owner: impl Into<String>,
        member: impl Into<String>,
    ) -> Result<Self> {
        let members = Self {
            table: table.into(),
            owner: owner.into(),
            member: member.into(),
            at: None,
        };
        for name in [&members.table, &members.owner, &members.member] {
            validate_table_name(name)?;
        }
        Ok(members)
    }

    /// The column that says when each row's member was seen (a
    /// `viewed_at` timestamp), for a windowed key: the rebuild then merges
    /// each member into the bucket of its time too, so unions over days
    /// (`unique_over`) are rebuilt with the all-time sketch. A row whose
    /// time is `NULL` counts in the all-time sketch only. The column may be
    /// a timestamp with or without a time zone (read as UTC), a MySQL
    /// `DATETIME` or `TIMESTAMP`, or SQLite text or Unix seconds.
    pub fn at(mut self, column: impl Into<String>) -> Result<Self> {
        let column = column.into();
        validate_table_name(&column)?;
        self.at = Some(column);
        Ok(self)
    }
}

/// When a member row was seen: the column named by [`Members::at`], read
/// as whichever time type the database returns for it. `naive` remembers
/// the answer once a row had a time (`true`: a timestamp without a time
/// zone), so the other rows are decoded once, not tried twice.
fn seen_at(
    row: &QueryResult,
    members: &Members,
    naive: &mut Option<bool>,
) -> Result<Option<DateTime<Utc>>> {
    if *naive != Some(true)
        && let Ok(at) = row.try_get::<Option<DateTime<Utc>>>("", SEEN_AT)
    {
        if at.is_some() {
            *naive = Some(false);
        }
        return Ok(at);
    }
    match row.try_get::<Option<NaiveDateTime>>("", SEEN_AT) {
        Ok(at) => {
            if at.is_some() {
                *naive = Some(true);
            }
            Ok(at.map(|at| at.and_utc()))
        }
        Err(error) => Err(CounterError::Database(DbErr::Type(format!(
            "rebuild: `{}`.`{}` is not a time the database returns as a timestamp: {error}",
            members.table,
            members.at.as_deref().unwrap_or_default()
        )))),
    }
}

/// What [`Counters::rebuild`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RebuildReport {
    /// Owners whose sketches were merged into.
    pub owners: u64,
    /// Member rows read.
    pub members: u64,
    /// Time buckets merged into (with [`Members::at`]), counted per owner.
    pub buckets: u64,
}

impl<I: OwnerId, S: KeySpace> Counters<I, S> {
    /// Merges every member of `members` into the all-time sketch of the
    /// unique key `key` of its owner, 1,000 owners at a time (one query
    /// for their members, one transaction for their sketches); with
    /// [`Members::at`], into the bucket of each row's time too (a windowed
    /// key; one without a window is [`CounterError::NotWindowed`]).
    ///
    /// It merges, never replaces: a sketch only misses members, never
    /// counts one that was not observed, so merging the truth in repairs it
    /// and is exact while the application observes (a member observed
    /// during the rebuild is in the sketch either way). Without
    /// [`Members::at`], the buckets of a windowed key are left as they are:
    /// a members table without time cannot say which day a member belongs
    /// to.
    ///
    /// Memory holds one chunk's member rows: 1,000 owners' members, all of
    /// them for an owner with millions. Members are hashed as the database's
    /// text of them: observe the same text (PostgreSQL's `inet` reads
    /// `10.0.0.1/32` where `IpAddr` writes `10.0.0.1`; MySQL's `BINARY(16)`
    /// UUIDs are bytes, not the hyphenated text). String owners are walked in
    /// the column's own collation: give them a binary one (as the companion
    /// table's) so that owners differing only in case stay apart.
    pub async fn rebuild<K: UniqueKeyOf<S>>(
        &self,
        db: &DatabaseConnection,
        key: K,
        members: &Members,
    ) -> Result<RebuildReport> {
        let key = key.as_key_str();
        self.check_unique_key(key, "rebuild")?;
        if members.at.is_some() && self.table().window_for(key).is_none() {
            return Err(CounterError::NotWindowed {
                table: self.table().name().to_owned(),
                key: key.to_owned(),
            });
        }
        let dialect = Dialect::of(db)?;
        let source = members.table.as_str();
        let mut report = RebuildReport::default();
        let mut after: Option<I> = None;
        let mut naive = None;
        loop {
            let next = sketches::member_owners(
                dialect,
                source,
                &members.owner,
                after.clone().map(Into::into),
                OWNERS_PER_CHUNK,
            );
            let rows =
                retry::run_transaction(db, source, || detach::query_all(db, next.clone())).await?;
            let owners = rows
                .iter()
                .map(|row| row.try_get::<I>("", crate::sql::col::OWNER_ID))
                .collect::<std::result::Result<Vec<I>, _>>()?;
            let Some(last) = owners.last().cloned() else {
                break;
            };
            // The database orders owners in its own collation, which need
            // not be Rust's: only a page that does not move is an error.
            if after.as_ref() == Some(&last) {
                return Err(CounterError::WalkStalled {
                    walk: "rebuild",
                    table: source.to_owned(),
                    owner: format!("{last:?}"),
                    reason: "the members table returned the same owners again",
                });
            }
            let ids: Vec<Value> = owners.iter().cloned().map(Into::into).collect();
            let query = sketches::members_of(
                dialect,
                source,
                &members.owner,
                &members.member,
                members.at.as_deref(),
                ids,
            );
            let rows =
                retry::run_transaction(db, source, || detach::query_all(db, query.clone())).await?;
            let table = self.table();
            // Each owner's sketch per bucket: the all-time one, and with a
            // time column the bucket of each row's time.
            let mut by_cell: HashMap<(I, i64), Sketch> = HashMap::with_capacity(owners.len());
            let mut merged_owners = HashSet::with_capacity(owners.len());
            for row in &rows {
                let owner = row.try_get::<I>("", crate::sql::col::OWNER_ID)?;
                let Some(member) = row.try_get::<Option<String>>("", MEMBER)? else {
                    continue;
                };
                let bucket = match members.at {
                    Some(_) => seen_at(row, members, &mut naive)?
                        .and_then(|at| table.sketch_buckets(key, at).find(|b| *b != ALL_TIME)),
                    None => None,
                };
                for bucket in std::iter::once(ALL_TIME).chain(bucket) {
                    by_cell
                        .entry((owner.clone(), bucket))
                        .or_default()
                        .insert(member.as_str());
                }
                merged_owners.insert(owner);
            }
            report.members += rows.len() as u64;
            report.owners += merged_owners.len() as u64;
            report.buckets += by_cell.keys().filter(|(_, b)| *b != ALL_TIME).count() as u64;
            // One transaction per bounded group of rows: merges are
            // idempotent, so a rebuild cut between groups is finished by
            // running it again.
            let mut cells: Vec<_> = by_cell
                .into_iter()
                .map(|((owner, bucket), sketch)| {
                    (
                        table,
                        cell(table, dialect, owner.into(), key, bucket),
                        sketch,
                    )
                })
                .collect();
            while !cells.is_empty() {
                let rest = cells.split_off(cells.len().saturating_sub(CELLS_PER_TRANSACTION));
                Merges::new(dialect, rest).write(db).await?;
            }
            let done = (owners.len() as u64) < OWNERS_PER_CHUNK;
            after = Some(last);
            if done {
                break;
            }
        }
        Ok(report)
    }
}

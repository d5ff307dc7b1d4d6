//! Rebuilding unique counts from the application's own record of members
//! (a `post_views (post_id, user_id)` table): for a unique key added to an
//! app that already has data, or sketches lost with a restore.

use std::collections::HashMap;

use sea_orm::{DatabaseConnection, Value};

use super::{Sketch, merge::Merges, observe::cell};
use crate::{
    CounterError, Counters, detach,
    error::Result,
    owner::OwnerId,
    retry,
    sql::{
        Dialect,
        sketches::{self, ALL_TIME, MEMBER},
    },
    table::validate_table_name,
    typed::{KeySpace, UniqueKeyOf},
};

/// Owners a rebuild reads the members of per query.
const OWNERS_PER_CHUNK: u64 = 1_000;

/// Where a rebuild reads members: a table with one row per (owner,
/// member), named by table and columns, such as a `post_views (post_id,
/// user_id)` join table. Identifiers follow the rules of table names and
/// are quoted.
#[derive(Debug, Clone)]
pub struct Members {
    table: String,
    owner: String,
    member: String,
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
        };
        for name in [&members.table, &members.owner, &members.member] {
            validate_table_name(name)?;
        }
        Ok(members)
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
}

impl<I: OwnerId, S: KeySpace> Counters<I, S> {
    /// Merges every member of `members` into the all-time sketch of the
    /// unique key `key` of its owner, 1,000 owners at a time (one query
    /// for their members, one transaction for their sketches).
    ///
    /// It merges, never replaces: a sketch only misses members, never
    /// counts one that was not observed, so merging the truth in repairs it
    /// and is exact while the application observes (a member observed
    /// during the rebuild is in the sketch either way). Buckets of a
    /// windowed key are not rebuilt: the members table has no time.
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
        let dialect = Dialect::of(db)?;
        let source = members.table.as_str();
        let mut report = RebuildReport::default();
        let mut after: Option<I> = None;
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
            let query = sketches::members_of(dialect, source, &members.owner, &members.member, ids);
            let rows =
                retry::run_transaction(db, source, || detach::query_all(db, query.clone())).await?;
            let mut by_owner: HashMap<I, Sketch> = HashMap::with_capacity(owners.len());
            for row in &rows {
                let owner = row.try_get::<I>("", crate::sql::col::OWNER_ID)?;
                let member = row.try_get::<Option<String>>("", MEMBER)?;
                if let Some(member) = member {
                    by_owner.entry(owner).or_default().insert(member.as_str());
                }
            }
            report.members += rows.len() as u64;
            report.owners += by_owner.len() as u64;
            let table = self.table();
            let cells = by_owner
                .into_iter()
                .map(|(owner, sketch)| {
                    (
                        table,
                        cell(table, dialect, owner.into(), key, ALL_TIME),
                        sketch,
                    )
                })
                .collect();
            Merges::new(dialect, cells).write(db).await?;
            let done = (owners.len() as u64) < OWNERS_PER_CHUNK;
            after = Some(last);
            if done {
                break;
            }
        }
        Ok(report)
    }
}

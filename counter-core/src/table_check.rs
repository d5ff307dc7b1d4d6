//! Checking a companion table in the database against its declaration:
//! what a changed declaration whose migration never ran, or a table made by
//! schema sync, leaves behind. Nothing here writes.

use std::fmt;

use sea_orm::ConnectionTrait;

use crate::{
    Counters, detach,
    error::Result,
    owner::OwnerId,
    sql::{self, Dialect, Layout, align, col},
    typed::KeySpace,
};

/// One way a companion table in the database differs from its declaration,
/// found by [`Counters::check_table`]. Its `Display` says what to run.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TableDrift {
    /// The counter table, or the bucket table a windowed key needs, is not
    /// in the database.
    Missing {
        /// The table.
        table: String,
    },
    /// A column compares by a collation other than the byte-wise one
    /// counting needs (a table made by schema sync, on MySQL: keys or
    /// string owners differing only in case would share a count).
    NotByteWise {
        /// The table.
        table: String,
        /// The column.
        column: &'static str,
        /// Its collation (`None`: the database's default).
        found: Option<String>,
    },
    /// The key index that rankings read through is missing.
    NoKeyIndex {
        /// The table.
        table: String,
    },
    /// The declaration has `cascade`, the table no `ON DELETE CASCADE`
    /// reference to its owner: deleting an owner leaves its counts, and a
    /// new owner with the same id inherits them.
    CascadeMissing {
        /// The table.
        table: String,
    },
    /// The table references its owner but the declaration has no
    /// `cascade`.
    CascadeUndeclared {
        /// The table.
        table: String,
    },
    /// The declared owner table has no such column (or does not exist): a
    /// wrong `owner` or `owner_column`, which recounts, `purge_orphans`
    /// and `cascade` would use.
    OwnerNotFound {
        /// The owner table as declared (`schema.table`).
        table: String,
        /// Its key column as declared.
        column: String,
    },
}

impl fmt::Display for TableDrift {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Missing { table } => write!(
                f,
                "`{table}` does not exist: run `migration()` (a bucket table added later: `upgrade_migration()`; a sketch table: `sketch_migration()`)"
            ),
            Self::NotByteWise {
                table,
                column,
                found,
            } => write!(
                f,
                "`{table}`.`{column}` compares as {}, not byte-wise: run `create_table`, which changes it",
                found.as_deref().unwrap_or("the database's default")
            ),
            Self::NoKeyIndex { table } => write!(
                f,
                "`{table}` has no key index: run `upgrade_migration()` (or `create_table`)"
            ),
            Self::CascadeMissing { table } => write!(
                f,
                "`{table}` is declared with `cascade` but does not reference its owner: run `cascade_migration(true)`"
            ),
            Self::CascadeUndeclared { table } => write!(
                f,
                "`{table}` references its owner but is declared without `cascade`: run `cascade_migration(false)` or declare `cascade`"
            ),
            Self::OwnerNotFound { table, column } => write!(
                f,
                "the declared owner `{table}`.`{column}` is not in the database: check `owner` and `owner_column`"
            ),
        }
    }
}

impl<I: OwnerId, S: KeySpace> Counters<I, S> {
    /// Compares the tables in the database with this declaration and
    /// returns every difference, empty when they agree: the table and the
    /// bucket table a windowed key needs exist, their key and string owner
    /// columns compare byte-wise, the key index is there, and the reference
    /// to the owner is there exactly when `cascade` is declared, and the
    /// declared owner table has the declared key column.
    ///
    /// Migrations are built from the declaration, but one that already
    /// ran does not change with it: turning `cascade` on or making a key
    /// windowed needs the matching migration, and this says which. Call it
    /// in a test, or at start-up (the Loco example's initializer reports it
    /// to `cargo loco doctor`). Only reads the database's catalog.
    pub async fn check_table<C: ConnectionTrait>(&self, db: &C) -> Result<Vec<TableDrift>> {
        let dialect = Dialect::of(db)?;
        let mut drifts = Vec::new();
        if let Some(owner) = self.table().owner() {
            let found = detach::query_one(db, align::owner_column_exists(dialect, owner)).await?;
            if found.is_none() {
                let table = match &owner.schema {
                    Some(schema) => format!("{schema}.{}", owner.table),
                    None => owner.table.to_string(),
                };
                drifts.push(TableDrift::OwnerNotFound {
                    table,
                    column: owner.column.to_string(),
                });
            }
        }
        for (table, layout) in sql::tables(self.table()) {
            let exists = detach::query_one(db, align::table_exists(dialect, &table)).await?;
            if exists.is_none() {
                drifts.push(TableDrift::Missing { table });
                continue;
            }
            if let Some(query) = align::collations(dialect, &table) {
                for row in detach::query_all(db, query).await? {
                    let (column, found) = align::collation_row(&row)?;
                    let Some(column) = [col::OWNER_ID, col::COUNT_KEY]
                        .into_iter()
                        .find(|c| *c == column)
                    else {
                        continue;
                    };
                    let wanted = align::wanted_collation(dialect, column, I::COLUMN);
                    if wanted.is_some_and(|w| found.as_deref() != Some(w)) {
                        drifts.push(TableDrift::NotByteWise {
                            table: table.clone(),
                            column,
                            found,
                        });
                    }
                }
            }
            if layout == Layout::Totals
                && detach::query_one(db, align::has_key_index(dialect, &table))
                    .await?
                    .is_none()
            {
                drifts.push(TableDrift::NoKeyIndex {
                    table: table.clone(),
                });
            }
            let references = detach::query_all(db, sql::owner_keys(dialect, &table)).await?;
            let cascades = references
                .iter()
                .map(sql::owner_key)
                .collect::<std::result::Result<Vec<_>, _>>()?;
            match (self.table().cascade().is_some(), cascades.is_empty()) {
                (true, _) if !cascades.iter().any(|k| k.cascades) => {
                    drifts.push(TableDrift::CascadeMissing { table });
                }
                (false, false) => drifts.push(TableDrift::CascadeUndeclared { table }),
                _ => {}
            }
        }
        Ok(drifts)
    }
}

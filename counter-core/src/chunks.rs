//! A batch's upserts, sent under the slot cap's guard, and the settlement
//! of the rows the guard refuses.
//!
//! Every upsert keeps each slot row within ±`SLOT_CAP` (`crate::settle`
//! says why), and an add far from the cap costs its one statement on every
//! backend, alone or inside any transaction:
//!
//! - alone (autocommit, on a pool), a statement that would take a slot past
//!   the cap fails with the backend's overflow error and writes nothing
//!   ([`Guard::Raise`], [`send_alone`]);
//! - inside a transaction on MySQL and SQLite, likewise: they undo the
//!   failed statement alone and keep the transaction going;
//! - inside a transaction on PostgreSQL, which any failed statement aborts
//!   whole, the upsert leaves such a row as it is and returns its position
//!   ([`Guard::Skip`]): nothing raises, so the common add needs no savepoint
//!   against the rare one.
//!
//! [`settle`] then settles the refused rows in a transaction ([`write`]:
//! the same one; `DeltaBatch::apply` in the caller's: a savepoint of its
//! own, which only this rare case pays for). When a settlement is refused
//! (the total would leave `i64`), what the write had added is taken back by
//! one more upsert of the opposite deltas, to rows its transaction holds
//! locked: the transaction stays usable and holds nothing of the refused
//! write, on every backend, with no savepoint needed for it. After
//! a database error nothing is taken back: the database undid the statement,
//! or the whole transaction (PostgreSQL aborts it, MySQL rolls it back on a
//! deadlock), and the caller rolls back (see `CounterError::Conflict`).

use std::collections::BTreeMap;

use sea_orm::{ConnectionTrait, DbErr, TransactionSession, TransactionTrait};

use crate::{
    detach,
    error::{CounterError, Result},
    observe::Touched,
    owner::SortOwner,
    retry, settle,
    sql::{self, Classified, Dialect, Guard, UpsertRow},
};

/// One statement of a batch: its table and the rows it adds to, sorted by
/// primary key, no counter twice.
#[derive(Debug, Clone)]
pub(crate) struct Chunk {
    pub table: String,
    pub rows: Vec<UpsertRow>,
    /// The region of the table's writes: a row there is never settled
    /// (a settlement spreads a total over slots other regions own).
    pub region: Option<crate::Region>,
}

impl Chunk {
    /// Whether no delta alone is beyond the cap, so the whole chunk can go
    /// the fast way.
    fn fits(&self) -> bool {
        !self.rows.iter().any(|r| settle::beyond_cap(r.delta))
    }
}

/// How a batch's rows are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// One guarded upsert per chunk; a row whose delta alone is beyond the
    /// cap, or that the guard refused, is settled.
    Fast,
    /// Every row settled: its add was already refused at the cap.
    Settle,
}

/// Sends `chunk` alone, in autocommit, where its statement is atomic by
/// itself: `true` once written, `false` if a slot met the cap or a delta is
/// beyond it (nothing written: settle it in a transaction).
pub(crate) async fn send_alone<C: ConnectionTrait>(
    db: &C,
    dialect: Dialect,
    chunk: &Chunk,
    touched: &Touched,
) -> Result<bool> {
    if !chunk.fits() {
        return Ok(false);
    }
    let statement = sql::add_rows(dialect, &chunk.table, chunk.rows.clone());
    let sent = retry::run(db, &chunk.table, || {
        detach::execute_observed(db, statement.clone(), touched)
    })
    .await;
    match sent {
        Ok(_) => Ok(true),
        Err(e) if settle::met_cap_typed(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Writes `chunks` on `txn`, a connection inside a transaction (the
/// crate's own or the caller's): [`send`], then [`settle`] on the same
/// connection.
pub(crate) async fn write<C: ConnectionTrait>(
    txn: &C,
    dialect: Dialect,
    chunks: &[Chunk],
    mode: Mode,
) -> Result<(), DbErr> {
    let sent = send(txn, dialect, chunks, mode).await?;
    settle(txn, dialect, sent).await
}

/// What [`send`] did: the rows it wrote, and those left to settle.
#[derive(Debug, Default)]
pub(crate) struct Sent {
    written: Written,
    unsettled: Vec<(String, UpsertRow)>,
    /// The region of the first unsettled row's table, if any.
    region: Option<crate::Region>,
}

impl Sent {
    /// Whether every row was written: nothing to settle.
    pub(crate) fn is_done(&self) -> bool {
        self.unsettled.is_empty()
    }
}

/// Sends one guarded upsert per chunk on `txn` (a transaction, or a
/// connection where a refused row is not written either): what it wrote,
/// and the rows the guard refused, or whose delta alone is beyond the cap
/// (in [`Mode::Settle`], every row), for [`settle`].
pub(crate) async fn send<C: ConnectionTrait>(
    txn: &C,
    dialect: Dialect,
    chunks: &[Chunk],
    mode: Mode,
) -> Result<Sent, DbErr> {
    let mut sent = Sent::default();
    for chunk in chunks {
        let table = chunk.table.as_str();
        let (fast, beyond): (Vec<&UpsertRow>, Vec<&UpsertRow>) = match mode {
            Mode::Fast => chunk
                .rows
                .iter()
                .partition(|r| !settle::beyond_cap(r.delta)),
            Mode::Settle => (Vec::new(), chunk.rows.iter().collect()),
        };
        if !beyond.is_empty() && sent.region.is_none() {
            sent.region.clone_from(&chunk.region);
        }
        sent.unsettled
            .extend(beyond.into_iter().map(|r| (table.to_owned(), r.clone())));
        if fast.is_empty() {
            continue;
        }
        let fast: Vec<UpsertRow> = fast.into_iter().cloned().collect();
        let refused = send_guarded(txn, dialect, table, &fast).await?;
        for (row, refused) in fast.into_iter().zip(refused) {
            match refused {
                true => {
                    if sent.region.is_none() {
                        sent.region.clone_from(&chunk.region);
                    }
                    sent.unsettled.push((table.to_owned(), row));
                }
                false => sent.written.add(table, row),
            }
        }
    }
    Ok(sent)
}

/// Settles the rows `sent` left, on `txn`, an open transaction (where the
/// settlement's locking reads hold): all or nothing for the crate's own
/// refusals, which take back what the write had added, [`send`]'s rows
/// and the settlement's (see the module's documentation).
pub(crate) async fn settle<C: ConnectionTrait>(
    txn: &C,
    dialect: Dialect,
    sent: Sent,
) -> Result<(), DbErr> {
    let Sent {
        mut written,
        unsettled,
        region,
    } = sent;
    // A region settles nothing: refused before anything more is written.
    let mut settled = match (&region, unsettled.is_empty()) {
        (Some(_), false) => {
            crate::Region::refuse(region.as_ref(), "settling an add at the slot cap")
                .map_err(CounterError::carry)
        }
        _ => Ok(()),
    };
    for (table, row) in unsettled.iter().filter(|_| region.is_none()) {
        settled = settle::row(txn, dialect, table, row, written.rows_of(table)).await;
        if settled.is_err() {
            break;
        }
    }
    match settled {
        // Decided before the database was asked to write anything more: the
        // transaction is sound, so what this write added can be taken back
        // in it.
        Err(refused) if is_refusal(&refused) => {
            if let Err(e) = written.take_back(txn, dialect).await {
                tracing::warn!(
                    error = %e,
                    refused = %refused,
                    "a refused counter write could not be taken back; roll the transaction back"
                );
                return Err(e);
            }
            Err(refused)
        }
        settled => settled,
    }
}

/// [`settle`] in a transaction of its own on `db`, the caller's
/// connection that [`send`] wrote on: a savepoint inside the caller's
/// transaction (a real transaction on a connection outside one), so the
/// settlement's locking reads hold. A refusal's take-back is committed with
/// it: it undoes [`send`]'s rows, which the caller's connection holds.
pub(crate) async fn settle_apart<C: TransactionTrait>(
    db: &C,
    dialect: Dialect,
    sent: Sent,
) -> Result<(), DbErr> {
    let own = db.begin().await?;
    match settle(&own, dialect, sent).await {
        Ok(()) => own.commit().await,
        Err(refused) if is_refusal(&refused) => {
            own.commit().await?;
            Err(refused)
        }
        Err(e) => {
            let _ = own.rollback().await;
            Err(e)
        }
    }
}

/// Whether `err` is the crate's own refusal (carried in the `DbErr`: a
/// total that would leave `i64`, a counter that kept growing), rather than
/// the database's error.
fn is_refusal(err: &DbErr) -> bool {
    CounterError::from_hook_error(err).is_some()
}

/// Sends `rows` of `table` in one upsert guarded as a transaction allows
/// ([`Guard::for_add`]): for each row, whether it was refused at the cap
/// (and not written).
async fn send_guarded<C: ConnectionTrait>(
    txn: &C,
    dialect: Dialect,
    table: &str,
    rows: &[UpsertRow],
) -> Result<Vec<bool>, DbErr> {
    let guard = Guard::for_add(dialect, true);
    let statement = sql::add_rows_with(dialect, table, rows.to_vec(), guard);
    if guard != Guard::Skip {
        return match txn.execute_raw(statement).await {
            Ok(_) => Ok(vec![false; rows.len()]),
            // MySQL and SQLite undid the statement: every row is refused.
            Err(e) if sql::classify(&e) == Classified::Overflow => Ok(vec![true; rows.len()]),
            Err(e) => Err(e),
        };
    }
    // PostgreSQL: the statement returns the 1-based position of each row
    // it left.
    let mut refused = vec![false; rows.len()];
    for found in txn.query_all_raw(statement).await? {
        let position: i64 = found.try_get_by_index(0)?;
        let at = usize::try_from(position)
            .ok()
            .and_then(|p| p.checked_sub(1))
            .and_then(|i| refused.get_mut(i))
            .ok_or_else(|| {
                DbErr::Type(format!(
                    "`{table}`: the upsert of {} rows refused row {position}",
                    rows.len()
                ))
            })?;
        *at = true;
    }
    Ok(refused)
}

/// The rows one write added to, by table: what it takes back when a later
/// part of it is refused.
#[derive(Debug, Default)]
struct Written(BTreeMap<String, Vec<UpsertRow>>);

impl Written {
    fn add(&mut self, table: &str, row: UpsertRow) {
        self.rows_of(table).push(row);
    }

    fn rows_of(&mut self, table: &str) -> &mut Vec<UpsertRow> {
        self.0.entry(table.to_owned()).or_default()
    }

    /// Adds the opposite of every recorded delta, folded per slot row and in
    /// primary-key order, unguarded: each row holds its value before this
    /// write plus the delta, under this transaction's lock, so the sum is
    /// exactly that value again.
    async fn take_back<C: ConnectionTrait>(self, txn: &C, dialect: Dialect) -> Result<(), DbErr> {
        for (table, rows) in self.0 {
            let mut folded: BTreeMap<(SortOwner, String, Option<i64>, i16), UpsertRow> =
                BTreeMap::new();
            for row in rows {
                let at = (
                    SortOwner::of(&row.owner),
                    row.key.clone(),
                    row.bucket,
                    row.slot,
                );
                let opposite = row.delta.checked_neg();
                let entry = folded.entry(at).or_insert(UpsertRow { delta: 0, ..row });
                entry.delta = opposite
                    .and_then(|d| entry.delta.checked_add(d))
                    .ok_or_else(|| {
                        CounterError::Overflow {
                            context: format!("the deltas taken back from `{table}`"),
                        }
                        .into_db_err()
                    })?;
            }
            let rows: Vec<UpsertRow> = folded.into_values().filter(|r| r.delta != 0).collect();
            for rows in rows.chunks(sql::UPSERT_ROWS_PER_STATEMENT) {
                let statement =
                    sql::add_rows_with(dialect, &table, rows.to_vec(), Guard::Unguarded);
                txn.execute_raw(statement).await?;
            }
        }
        Ok(())
    }
}

//! Settling an add that would take a slot past [`SLOT_CAP`]: the one place
//! where a counter's total is checked against `i64`.
//!
//! Every slot row of a counter stays within ±`SLOT_CAP` (2^53 - 1) through
//! ordinary adds, whose upsert refuses to take it further
//! (`sql::add_rows`), so no sum of a counter's at most
//! [`Slots::MAX`](crate::Slots::MAX) rows can leave `i64` and an add far
//! from the limit costs one upsert, as before. An add that meets the cap,
//! or whose delta alone is beyond it, is settled instead, in a transaction:
//!
//! 1. the counter's rows are read under lock and summed (in `i128`);
//! 2. a total that would leave `i64` is refused with
//!    [`CounterError::Overflow`] naming the owner and key, nothing written;
//! 3. else the delta goes to an existing slot it fits in, or the total is
//!    spread evenly over as many slots as keep each within half the cap
//!    (the slots created at zero first, then locked and summed again, so a
//!    concurrent add into a new slot cannot slip past the sum).
//!
//! The spread keeps the bound that makes the fast path exact: with at most
//! one slot above the cap (slot 0, by less than `Slots::MAX`, only at the
//! very edge of `i64`), no mix of later ordinary adds can take the sum out
//! of `i64`. Settling is rare by construction: it takes a slot holding
//! about 9 × 10^15.

use sea_orm::{ConnectionTrait, DbErr, Value};

use crate::{
    Slots,
    error::CounterError,
    sql::{self, Cell, Dialect, Guard, SLOT_CAP, UpsertRow},
};

/// Whether `delta` cannot go the fast way: a new slot row holding it alone
/// would be beyond the cap.
pub(crate) fn beyond_cap(delta: i64) -> bool {
    delta.unsigned_abs() > SLOT_CAP.unsigned_abs()
}

/// Whether `err`, from a fast write, is a [`CounterError::Overflow`] that
/// a settlement may resolve (the guard's, not a folded delta's).
pub(crate) fn met_cap_typed(err: &CounterError) -> bool {
    matches!(err, CounterError::Overflow { context } if context.starts_with(FAST_WRITE))
}

/// How `retry` names the overflow of a statement on a counter table, which
/// is what a fast write meeting the cap raises (see `met_cap_typed`).
pub(crate) const FAST_WRITE: &str = "a slot value or total";

/// Settles `row` of `table` on `txn`, an open transaction, recording in
/// `written` the rows it adds to. Every refusal (a total that would leave
/// `i64`, a counter that kept growing) comes before its write, as the
/// crate's own error (carried in the `DbErr`), so a caller can take back
/// what it wrote before (see `crate::chunks`).
pub(crate) async fn row<C: ConnectionTrait>(
    txn: &C,
    dialect: Dialect,
    table: &str,
    row: &UpsertRow,
    written: &mut Vec<UpsertRow>,
) -> Result<(), DbErr> {
    let deltas = plan(txn, dialect, table, row).await?;
    write(txn, dialect, table, row, deltas, written).await
}

/// Rounds of "create the slots, lock and sum again" before giving up (more
/// than one only if concurrent adds grew the total meanwhile).
const ROUNDS: usize = 3;

/// The `(slot, delta)` writes that settle `row`, its counter's rows locked.
async fn plan<C: ConnectionTrait>(
    txn: &C,
    dialect: Dialect,
    table: &str,
    row: &UpsertRow,
) -> Result<Vec<(i16, i64)>, DbErr> {
    let cell = Cell {
        table,
        owner: &row.owner,
        key: &row.key,
        bucket: row.bucket,
    };
    let slots = read(txn, dialect, &cell).await?;
    let total = new_total(&slots, row.delta, &cell)?;
    let room = |value: i64| {
        value
            .checked_add(row.delta)
            .is_some_and(|new| !beyond_cap(new))
    };
    let fit = slots
        .iter()
        .find(|(slot, value)| *slot == row.slot && room(*value))
        .or_else(|| slots.iter().find(|(_, value)| room(*value)));
    if let Some(&(slot, _)) = fit {
        return Ok(vec![(slot, row.delta)]);
    }
    let mut spread = slots_for(total);
    for _ in 0..ROUNDS {
        txn.execute_raw(sql::create_slots(dialect, &cell, spread))
            .await?;
        let slots = read(txn, dialect, &cell).await?;
        let total = new_total(&slots, row.delta, &cell)?;
        let needed = slots_for(total);
        if needed <= spread {
            return layout(total, spread, &slots).ok_or_else(|| overflow(&cell));
        }
        spread = needed;
    }
    Err(CounterError::Conflict {
        table: table.to_owned(),
        attempts: ROUNDS as u32,
        in_transaction: true,
        source: DbErr::Custom(format!(
            "counter `{}` of owner {} kept growing while it was settled; try again",
            row.key,
            owner_text(&row.owner)
        )),
    }
    .carry())
}

/// The cell's `(slot, value)` rows, locked.
async fn read<C: ConnectionTrait>(
    txn: &C,
    dialect: Dialect,
    cell: &Cell<'_>,
) -> Result<Vec<(i16, i64)>, DbErr> {
    txn.query_all_raw(sql::lock_cell(dialect, cell))
        .await?
        .iter()
        .map(|r| Ok((r.try_get_by_index(0)?, r.try_get_by_index(1)?)))
        .collect()
}

/// The sum of `slots` and `delta`, refused if it leaves `i64`.
fn new_total(slots: &[(i16, i64)], delta: i64, cell: &Cell<'_>) -> Result<i128, DbErr> {
    let total: i128 = slots.iter().map(|(_, v)| i128::from(*v)).sum::<i128>() + i128::from(delta);
    if i64::try_from(total).is_err() {
        return Err(overflow(cell));
    }
    Ok(total)
}

fn overflow(cell: &Cell<'_>) -> DbErr {
    CounterError::Overflow {
        context: sql::total_context(cell.key, cell.owner, cell.table),
    }
    .into_db_err()
}

/// How many slots `total` is spread over: enough to leave each at most half
/// the cap (room for ordinary adds after it), at most `Slots::MAX`.
fn slots_for(total: i128) -> i16 {
    let half = i128::from(SLOT_CAP / 2);
    let needed = (total.abs() + half - 1) / half;
    needed.clamp(1, i128::from(Slots::MAX)) as i16
}

/// The deltas that turn `slots` (locked, `0..spread` among them) into
/// `total` spread over `0..spread`: each the same share, slot 0 also the
/// remainder, every other slot zero. `None` if a delta leaves `i64`.
fn layout(total: i128, spread: i16, slots: &[(i16, i64)]) -> Option<Vec<(i16, i64)>> {
    let share = total / i128::from(spread);
    let remainder = total - share * i128::from(spread);
    slots
        .iter()
        .map(|&(slot, value)| {
            let target = match slot {
                0 => share + remainder,
                s if s < spread => share,
                _ => 0,
            };
            i64::try_from(target - i128::from(value))
                .ok()
                .map(|delta| (slot, delta))
        })
        .filter(|d| d.is_none_or(|(_, delta)| delta != 0))
        .collect()
}

/// Adds `deltas` (to locked rows, by slot) in one statement, recorded in
/// `written`.
async fn write<C: ConnectionTrait>(
    txn: &C,
    dialect: Dialect,
    table: &str,
    row: &UpsertRow,
    deltas: Vec<(i16, i64)>,
    written: &mut Vec<UpsertRow>,
) -> Result<(), DbErr> {
    let rows: Vec<UpsertRow> = deltas
        .into_iter()
        .map(|(slot, delta)| UpsertRow {
            slot,
            delta,
            ..row.clone()
        })
        .collect();
    if rows.is_empty() {
        return Ok(());
    }
    txn.execute_raw(sql::add_rows_with(
        dialect,
        table,
        rows.clone(),
        Guard::Unguarded,
    ))
    .await?;
    written.extend(rows);
    Ok(())
}

/// An owner as a person reads it in an error.
pub(crate) fn owner_text(owner: &Value) -> String {
    match owner {
        Value::Int(Some(v)) => v.to_string(),
        Value::BigInt(Some(v)) => v.to_string(),
        Value::String(Some(v)) => format!("{v:?}"),
        Value::Uuid(Some(v)) => v.to_string(),
        other => format!("{other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_bounds_every_sum_of_slots() {
        assert_eq!(SLOT_CAP, (1 << 53) - 1);
        assert!(i128::from(SLOT_CAP) * i128::from(Slots::MAX) <= i128::from(i64::MAX));
    }

    #[test]
    fn spreads_keep_within_bounds_and_sum_exactly() {
        for total in [
            i128::from(i64::MAX),
            i128::from(i64::MIN),
            i128::from(SLOT_CAP) + 1,
            -i128::from(SLOT_CAP) * 3,
            i128::from(i64::MAX) / 2,
        ] {
            let spread = slots_for(total);
            let existing: Vec<(i16, i64)> = (0..spread.max(20)).map(|s| (s, 5)).collect();
            let deltas = layout(total, spread, &existing).unwrap();
            let mut values: Vec<i128> = existing.iter().map(|(_, v)| i128::from(*v)).collect();
            for (slot, delta) in deltas {
                values[slot as usize] += i128::from(delta);
            }
            assert_eq!(values.iter().sum::<i128>(), total);
            // The bound that keeps ordinary adds exact: sums of each slot's
            // reach (its value or the cap, whichever is further) stay in i64.
            let cap = i128::from(SLOT_CAP);
            let reach_up: i128 = values.iter().map(|v| (*v).max(cap)).sum::<i128>()
                + cap * (i128::from(Slots::MAX) - values.len() as i128);
            let reach_down: i128 = values.iter().map(|v| (*v).min(-cap)).sum::<i128>()
                - cap * (i128::from(Slots::MAX) - values.len() as i128);
            assert!(reach_up <= i128::from(i64::MAX), "{total}: {reach_up}");
            assert!(reach_down >= i128::from(i64::MIN), "{total}: {reach_down}");
        }
    }
}

//! The statements of a settlement ([`crate::settle`]): one counter's slot
//! rows read under lock, and the slot rows it is about to spread a total
//! over created (at zero) so that they can be locked too.

use sea_orm::{
    Statement, Value,
    sea_query::{Alias, Expr, ExprTrait, LockType, OnConflict, Order, Query},
};

use super::{Dialect, Layout, col};

/// One counter: a total's slot rows, or one bucket's.
#[derive(Debug, Clone)]
pub(crate) struct Cell<'a> {
    pub table: &'a str,
    pub owner: &'a Value,
    pub key: &'a str,
    pub bucket: Option<i64>,
}

impl Cell<'_> {
    fn layout(&self) -> Layout {
        match self.bucket {
            Some(_) => Layout::Buckets,
            None => Layout::Totals,
        }
    }
}

/// `SELECT slot, value FROM t WHERE <the cell> ORDER BY slot FOR UPDATE`
/// (SQLite has no row locks: its one writer holds the database).
pub(crate) fn lock_cell(dialect: Dialect, cell: &Cell<'_>) -> Statement {
    let mut select = Query::select();
    select
        .columns([Alias::new(col::SLOT), Alias::new(col::VALUE)])
        .from(Alias::new(cell.table))
        .and_where(Expr::col(Alias::new(col::OWNER_ID)).eq(cell.owner.clone()))
        .and_where(Expr::col(Alias::new(col::COUNT_KEY)).eq(cell.key));
    if let Some(bucket) = cell.bucket {
        select.and_where(Expr::col(Alias::new(col::BUCKET)).eq(bucket));
    }
    select.order_by(Alias::new(col::SLOT), Order::Asc);
    if dialect != Dialect::Sqlite {
        select.lock(LockType::Update);
    }
    dialect.backend().build(&select)
}

/// Inserts the cell's slots `0..slots` at zero where missing, changing no
/// existing row (`ON CONFLICT .. SET value = value`, which also locks it
/// where the backend locks rows).
pub(crate) fn create_slots(dialect: Dialect, cell: &Cell<'_>, slots: i16) -> Statement {
    let layout = cell.layout();
    let mut insert = Query::insert();
    insert.into_table(Alias::new(cell.table)).columns(
        layout
            .primary_key()
            .iter()
            .chain([&col::VALUE])
            .map(|c| Alias::new(*c)),
    );
    for slot in 0..Ord::max(slots, 1) {
        let mut row: Vec<Expr> = vec![Expr::val(cell.owner.clone()), Expr::val(cell.key)];
        if let Some(bucket) = cell.bucket {
            row.push(Expr::val(bucket));
        }
        row.extend([Expr::val(slot), Expr::val(0i64)]);
        insert.values_panic(row);
    }
    insert.on_conflict(
        OnConflict::columns(layout.primary_key().iter().map(|c| Alias::new(*c)))
            .value(
                Alias::new(col::VALUE),
                Expr::col((Alias::new(cell.table), Alias::new(col::VALUE))),
            )
            .to_owned(),
    );
    dialect.backend().build(&insert)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_and_create_per_backend() {
        let owner = Value::from(7i64);
        let cell = Cell {
            table: "c",
            owner: &owner,
            key: "likes",
            bucket: None,
        };
        assert_eq!(
            lock_cell(Dialect::Postgres, &cell).sql,
            r#"SELECT "slot", "value" FROM "c" WHERE "owner_id" = $1 AND "count_key" = $2 ORDER BY "slot" ASC FOR UPDATE"#
        );
        assert!(!lock_cell(Dialect::Sqlite, &cell).sql.contains("FOR UPDATE"));
        let my = create_slots(Dialect::MySql, &cell, 2);
        assert_eq!(
            my.sql,
            "INSERT INTO `c` (`owner_id`, `count_key`, `slot`, `value`) VALUES (?, ?, ?, ?), (?, ?, ?, ?) ON DUPLICATE KEY UPDATE `value` = `c`.`value`"
        );
        let bucketed = Cell {
            bucket: Some(86_400),
            ..cell
        };
        assert!(
            lock_cell(Dialect::MySql, &bucketed)
                .sql
                .contains("AND `bucket` = ?")
        );
    }
}

//! Finding and locking the child rows a counter cache reads.

use sea_orm::{
    ActiveModelTrait, ActiveValue, ColumnTrait, Condition, ConnectionTrait, DbErr, EntityTrait,
    IntoActiveModel, Iterable, ModelTrait, PrimaryKeyToColumn, PrimaryKeyTrait, QueryFilter,
    QueryOrder, QuerySelect, TryIntoModel, Value,
};

use super::CounterCache;

/// Primary keys per `IN (...)` list: few binds, short statements.
pub(crate) const KEYS_PER_STATEMENT: usize = 1_000;

/// The child table's name, for errors.
pub(crate) fn table_name<E: EntityTrait>() -> String {
    E::default().table_name().to_owned()
}

fn key_columns<E: EntityTrait>() -> Vec<E::Column> {
    E::PrimaryKey::iter().map(|k| k.into_column()).collect()
}

/// `pk = <the active model's key>`, or `None` when the key is not set (the
/// write then fails in sea-orm, with its own error, before counting matters).
pub(crate) fn key_of_active<A: ActiveModelTrait>(am: &A) -> Option<Condition> {
    let mut cond = Condition::all();
    for col in key_columns::<A::Entity>() {
        cond = cond.add(col.eq(am.get(col).into_value()?));
    }
    Some(cond)
}

/// The primary key values an active model has set, column by column, or
/// `None` when one is not set.
pub(crate) fn key_values_of_active<A: ActiveModelTrait>(am: &A) -> Option<Vec<Value>> {
    key_columns::<A::Entity>()
        .into_iter()
        .map(|col| am.get(col).into_value())
        .collect()
}

/// Whether the entity's key is chosen by the application (a natural key,
/// such as a join table's `(article_id, user_id)`), so that a row deleted
/// and one inserted concurrently can carry the same key.
pub(crate) fn natural_key<E: EntityTrait>() -> bool {
    !<E::PrimaryKey as PrimaryKeyTrait>::auto_increment()
}

/// The primary key of a model, column by column.
pub(crate) fn key_of<E: EntityTrait>(model: &E::Model) -> Vec<Value> {
    key_columns::<E>()
        .into_iter()
        .map(|col| model.get(col))
        .collect()
}

/// `pk IN (...)` for the keys of `models`, [`KEYS_PER_STATEMENT`] at a
/// time (an `OR` of `AND`s for a composite key).
pub(crate) fn key_chunks<E: EntityTrait>(
    models: &[E::Model],
) -> impl Iterator<Item = Condition> + '_ {
    let cols = key_columns::<E>();
    models.chunks(KEYS_PER_STATEMENT).map(move |chunk| {
        if let [col] = cols.as_slice() {
            return Condition::all().add(col.is_in(chunk.iter().map(|m| m.get(*col))));
        }
        chunk
            .iter()
            .map(key_of::<E>)
            .fold(Condition::any(), |any, key| {
                let row = cols
                    .iter()
                    .zip(key)
                    .fold(Condition::all(), |all, (col, v)| all.add(col.eq(v)));
                any.add(row)
            })
    })
}

/// Whether `changes` sets a column a contribution depends on: if not, the
/// write moves no counter.
pub(crate) fn sets_counted<E: CounterCache>(changes: &E::ActiveModel) -> bool {
    E::counted_columns()
        .into_iter()
        .any(|col| changes.get(col).is_set())
}

/// The row `old` becomes once the `Set` columns of `changes` are written:
/// computed, not read back, so a reader's older snapshot (MySQL's
/// REPEATABLE READ in a caller's transaction) cannot make it stale.
pub(crate) fn merged<E: CounterCache>(
    old: &E::Model,
    changes: &E::ActiveModel,
) -> Result<E::Model, DbErr> {
    let mut new = old.clone().into_active_model();
    for col in E::Column::iter() {
        if let ActiveValue::Set(value) = changes.get(col) {
            new.try_set(col, value)?;
        }
    }
    new.try_into_model()
}

/// The rows matching `cond`, locked until the transaction ends
/// (`FOR UPDATE` on PostgreSQL and MySQL; SQLite locks the whole database
/// for a writing transaction and has no row locks to take). Sorted by key,
/// which orders the locks on PostgreSQL; MySQL locks in the order its index
/// scan meets the rows, so two bulk writes with different filters can still
/// deadlock there (and are retried on a pool).
pub(crate) async fn lock<E, C>(db: &C, cond: Condition) -> Result<Vec<E::Model>, DbErr>
where
    E: EntityTrait,
    C: ConnectionTrait,
{
    let mut find = E::find().filter(cond);
    for col in key_columns::<E>() {
        find = find.order_by_asc(col);
    }
    find.lock_exclusive().all(db).await
}

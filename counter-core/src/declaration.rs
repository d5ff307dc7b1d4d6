//! Counters declared apart from their entity ([`counter_table!`]) and bound
//! to it later ([`slotted_counter!`]): the form for apps whose entity files
//! are generated and whose migration crate cannot see the entities.
//!
//! One declaration feeds both sides, so they cannot diverge: the migration
//! crate builds the table from the declared module's `counters()`, and the
//! app's `Entity::counters()` is built from the same [`Declaration`].
//!
//! [`counter_table!`]: crate::counter_table
//! [`slotted_counter!`]: crate::slotted_counter

use std::borrow::Cow;

use sea_orm::{
    EntityTrait, IdenStatic, Iterable, ModelTrait, PrimaryKeyToColumn, PrimaryKeyTrait,
    RelationDef, RelationType,
    sea_query::{Alias, ConditionType, ForeignKeyAction, IntoIden, IntoTableRef, ValueType},
};

use crate::{
    CounterTable, Counters, EntityCounters, OwnerTable, SlotPolicy, SlotStrategy, Slots,
    SlottedCounter, Window,
};

/// What a `counter_table!` declared, checked at compile time. Not public API:
/// the generated module's `DECLARATION`.
#[doc(hidden)]
#[derive(Debug)]
pub struct Declaration {
    pub table: &'static str,
    pub owner_table: &'static str,
    pub owner_column: &'static str,
    pub slots: DeclaredSlots,
    pub key_slots: &'static [(&'static str, DeclaredSlots)],
    pub key_windows: &'static [(&'static str, Window)],
    pub unique_keys: &'static [&'static str],
    pub cascade: bool,
    pub slot_strategy: Option<SlotStrategy>,
}

impl Declaration {
    /// The companion table declared. The macro has checked every name and
    /// slot count, so this cannot fail.
    pub fn table(&self) -> CounterTable {
        self.table_in(None)
    }

    /// [`Declaration::table`] with the owner table in `schema` (an
    /// entity's `schema_name`).
    pub(crate) fn table_in(&self, schema: Option<Cow<'static, str>>) -> CounterTable {
        let build = || -> crate::Result<CounterTable> {
            let mut table = CounterTable::new(self.table)?.with_slot_policy(self.slots.policy()?);
            for &(key, slots) in self.key_slots {
                table = table.with_key_slot_policy(key, slots.policy()?)?;
            }
            for &(key, window) in self.key_windows {
                table = table.with_key_window(key, window)?;
            }
            for &key in self.unique_keys {
                table = table.with_unique_key(key)?;
            }
            let owner = OwnerTable {
                schema,
                table: self.owner_table.into(),
                column: self.owner_column.into(),
            };
            table = if self.cascade {
                table.with_cascade(owner)
            } else {
                table.with_owner(owner)
            };
            if let Some(strategy) = self.slot_strategy {
                table = table.with_slot_strategy(strategy);
            }
            Ok(table)
        };
        match build() {
            Ok(table) => table,
            Err(e) => unreachable!("the macros checked `{}` at compile time: {e}", self.table),
        }
    }
}

/// The typed handle of `E` bound to a declaration, for `slotted_counter!`.
///
/// The declaration names the owner table and column in strings (the
/// migration crate has no entity); an entity with other names is reported
/// here, once, as an error in the log: its counters work, but the
/// declaration's `cascade` references another table than the entity's.
/// A `slots` option as the macros checked it: `slots = 64` or
/// `slots = adaptive(1..=256)`.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub enum DeclaredSlots {
    Fixed(u16),
    Adaptive(u16, u16),
}

impl DeclaredSlots {
    fn policy(self) -> crate::Result<SlotPolicy> {
        match self {
            Self::Fixed(n) => Ok(SlotPolicy::Fixed(Slots::new(n)?)),
            Self::Adaptive(min, max) => SlotPolicy::adaptive(min..=max),
        }
    }
}

#[doc(hidden)]
pub fn declared_counters<E: SlottedCounter>(declaration: &Declaration) -> EntityCounters<E> {
    let entity = E::default();
    let column = E::PrimaryKey::iter()
        .next()
        .map(|key| key.into_column().as_str().to_owned());
    if entity.table_name() != declaration.owner_table
        || column.as_deref() != Some(declaration.owner_column)
    {
        tracing::error!(
            counters = declaration.table,
            declared_owner = %format!("{}.{}", declaration.owner_table, declaration.owner_column),
            entity_owner = %format!("{}.{}", entity.table_name(), column.as_deref().unwrap_or("?")),
            "counter_table! names another owner than the entity slotted_counter! binds it to; \
             fix `owner` or `owner_column` in the declaration"
        );
    }
    Counters::for_entity(declaration.table())
}

/// A model's single primary key as `I`, for `slotted_counter!`'s
/// `owner_id`. The bound is the compile-time check that the declared
/// `owner_id` type is the entity's primary-key type.
#[doc(hidden)]
pub fn primary_key_of<E, I>(model: &E::Model) -> I
where
    E: EntityTrait,
    E::PrimaryKey: PrimaryKeyTrait<ValueType = I>,
    I: ValueType,
{
    let column = E::PrimaryKey::iter()
        .next()
        .map(PrimaryKeyToColumn::into_column);
    let value = column.map(|column| model.get(column));
    match value.map(I::try_from) {
        Some(Ok(id)) => id,
        // A primary key of type `I` holds an `I`.
        _ => unreachable!(
            "the primary key of `{}` is not its ValueType",
            E::default().table_name()
        ),
    }
}

/// The companion entity's relation to an owner table known by name only
/// (a declaration's `cascade`): the foreign key the migration creates, so
/// that schema sync and `Schema::create_table_from_entity` make the same.
#[doc(hidden)]
pub fn owner_relation<E: EntityTrait>(
    from: E::Column,
    owner_table: &'static str,
    owner_column: &'static str,
) -> RelationDef {
    let entity = E::default();
    let fk_name = crate::sql::owner_fk_name(entity.table_name());
    RelationDef {
        rel_type: RelationType::HasOne,
        from_tbl: entity.table_ref(),
        to_tbl: Alias::new(owner_table).into_table_ref(),
        from_col: sea_orm::Identity::Unary(from.into_iden()),
        to_col: sea_orm::Identity::Unary(Alias::new(owner_column).into_iden()),
        // sea-orm's `belongs_to`: the side holding the foreign key is not the owner.
        is_owner: false,
        skip_fk: false,
        on_delete: Some(ForeignKeyAction::Cascade),
        on_update: None,
        on_condition: None,
        fk_name: Some(fk_name),
        condition_type: ConditionType::All,
    }
}

/// Binds the counters a [`counter_table!`](crate::counter_table) declared to
/// the owner entity: `impl SlottedCounter for Entity`, and `pub use` of the
/// declared module as `counters`, so the app reads exactly as with
/// `#[derive(SlottedCounter)]` (`notes::Entity::counters()`,
/// `notes::counters::Key::Likes`).
///
/// Write it in a hand-written module beside the generated entity (Loco's
/// `models/notes.rs`), never in the generated file:
///
/// ```text
/// pub use super::_entities::notes::{ActiveModel, Entity, Model};
/// counter_core::slotted_counter!(Entity, migration::note_counters);
/// ```
///
/// The declared `owner_id` type must be the entity's primary-key type (a
/// compile error otherwise: "type mismatch resolving `<PrimaryKey as
/// PrimaryKeyTrait>::ValueType == ...`"); the declared `owner` and
/// `owner_column` are compared with the entity's when the handle is first
/// built, and a difference is logged as an error.
#[macro_export]
macro_rules! slotted_counter {
    ($entity:ty, $declaration:path) => {
        pub use $declaration as counters;

        #[automatically_derived]
        impl $crate::SlottedCounter for $entity {
            type OwnerId = counters::OwnerId;
            type Key = counters::Key;
            type Counts = counters::Counts;
            type UniqueKey = counters::UniqueKey;

            fn counters() -> &'static $crate::EntityCounters<Self> {
                static COUNTERS: ::std::sync::LazyLock<$crate::EntityCounters<$entity>> =
                    ::std::sync::LazyLock::new(|| {
                        $crate::__private_0_1_0::declared_counters::<$entity>(
                            &counters::DECLARATION,
                        )
                    });
                &COUNTERS
            }

            fn owner_id(
                model: &<$entity as $crate::__private_0_1_0::sea_orm::EntityTrait>::Model,
            ) -> counters::OwnerId {
                $crate::__private_0_1_0::primary_key_of::<$entity, counters::OwnerId>(model)
            }
        }
    };
}

//! Every attribute and option name the derives read, named once: the
//! parsers match on these, and their error messages print them, so an option
//! cannot be spelt one way in the grammar and another in its errors.

use std::fmt::{self, Display};

use syn::{Ident, Path};

/// An attribute or option name. Constants of it are patterns:
/// `Some(KEYS) => ...`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Symbol(&'static str);

// The attributes of the two derives.
/// `#[counter(...)]`, on an owner's `Model`.
pub(crate) const COUNTER: Symbol = Symbol("counter");
/// `#[counter_cache(...)]`, on a child's `Model`.
pub(crate) const COUNTER_CACHE: Symbol = Symbol("counter_cache");

// Options of both attributes.
/// `crate = "path"`: the path counter-core is reached by.
pub(crate) const CRATE: Symbol = Symbol("crate");

// The options of `#[counter(...)]`.
/// `keys(likes, views(slots = 64))`.
pub(crate) const KEYS: Symbol = Symbol("keys");
/// `slots = N`, also a key option: `views(slots = 64)`.
pub(crate) const SLOTS: Symbol = Symbol("slots");
/// `slots = adaptive(1..=256)`: a slot count that grows with contention.
pub(crate) const ADAPTIVE: Symbol = Symbol("adaptive");
/// `table = "name"`.
pub(crate) const TABLE: Symbol = Symbol("table");
/// `slot_strategy = "random"`.
pub(crate) const SLOT_STRATEGY: Symbol = Symbol("slot_strategy");
/// `cascade`, a flag.
pub(crate) const CASCADE: Symbol = Symbol("cascade");
/// The key flag `unique`: `viewers(unique)` counts distinct members.
pub(crate) const UNIQUE: Symbol = Symbol("unique");
/// The key option `window = day`.
pub(crate) const WINDOW: Symbol = Symbol("window");
/// `owner = "notes"`: the owner table, in `counter_table!` only.
pub(crate) const OWNER: Symbol = Symbol("owner");
/// `owner_column = "id"`: its primary-key column, in `counter_table!` only.
pub(crate) const OWNER_COLUMN: Symbol = Symbol("owner_column");
/// `owner_id = i32`: the primary key's type, in `counter_table!` only.
pub(crate) const OWNER_ID: Symbol = Symbol("owner_id");

// The options of `#[counter_cache(...)]`.
/// `parent = super::post::Entity`.
pub(crate) const PARENT: Symbol = Symbol("parent");
/// `key = comments`.
pub(crate) const KEY: Symbol = Symbol("key");
/// `via = post_id`.
pub(crate) const VIA: Symbol = Symbol("via");
/// `sum = amount`.
pub(crate) const SUM: Symbol = Symbol("sum");
/// `when = published`, `when = !published`.
pub(crate) const WHEN: Symbol = Symbol("when");

// sea-orm's, which the derives read.
/// `#[sea_orm(...)]`.
pub(crate) const SEA_ORM: Symbol = Symbol("sea_orm");
/// `#[sea_orm(table_name = "posts")]`.
pub(crate) const TABLE_NAME: Symbol = Symbol("table_name");
/// `#[sea_orm(primary_key)]`.
pub(crate) const PRIMARY_KEY: Symbol = Symbol("primary_key");
/// `#[sea_orm(enum_name = "Slug")]`.
pub(crate) const ENUM_NAME: Symbol = Symbol("enum_name");
/// `#[sea_orm(ignore)]`.
pub(crate) const IGNORE: Symbol = Symbol("ignore");

impl Symbol {
    pub(crate) const fn as_str(self) -> &'static str {
        self.0
    }
}

impl Display for Symbol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl PartialEq<Symbol> for Ident {
    fn eq(&self, word: &Symbol) -> bool {
        self == word.0
    }
}

impl PartialEq<Symbol> for Path {
    fn eq(&self, word: &Symbol) -> bool {
        self.is_ident(word.0)
    }
}

/// The names of `symbols`, for the "did you mean" of an unknown one.
pub(crate) fn names(symbols: &[Symbol]) -> Vec<&'static str> {
    symbols.iter().map(|s| s.0).collect()
}

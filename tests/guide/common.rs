// What every page's prose takes as known: the crates' common names. Each
// page's context includes this file, then declares its `World`: the values
// its snippets use (a pool, an owner id, a handle).
pub use std::{sync::Arc, time::Duration};

pub use chrono::{DateTime, Utc};
pub use counter_core::{
    Compact, CounterBuffer, CounterTable, DeltaBatch, Reconcile, SlotPolicy, Truth, Writer,
    prelude::*,
};
pub use sea_orm::{
    ActiveModelTrait, ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbErr, EntityTrait,
    IntoActiveModel, Set, TransactionTrait,
};

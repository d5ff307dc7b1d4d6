//! `#[derive(CounterCache)]`: a child entity's rows kept counted in its
//! parents' slotted counters. The same pipeline as the `SlottedCounter`
//! derive, with its shared helpers: `attr` parses each
//! `#[counter_cache(...)]`, `model` resolves and checks it against `Model`,
//! `expand` generates the `impl counter_core::CounterCache`.

mod attr;
mod expand;
mod model;

pub(crate) use expand::derive;

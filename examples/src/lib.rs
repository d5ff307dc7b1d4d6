//! The example application: a small blog whose posts have counters.

pub mod entities;

//! The app's initializers (Loco keeps them in `src/initializers/`).

pub mod counter_tables;

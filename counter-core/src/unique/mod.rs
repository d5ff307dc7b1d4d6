//! Unique counts: how many *distinct* members (viewers, visitors,
//! reactors) an owner has, in bounded memory, with HyperLogLog sketches.
//!
//! This is the sketch itself and its one format ([`Sketch`]); a sketch's
//! estimate has a standard error of 0.81 %
//! ([`STANDARD_ERROR`](sketch::STANDARD_ERROR)), at most 12,289 bytes
//! however many members, 31 bytes for ten. Sketches merge by taking each
//! register's maximum, so the merge of any parts, in any order, any number
//! of times, is the sketch of their union.
//!
//! ```
//! use counter_core::unique::Sketch;
//!
//! let (mut monday, mut tuesday) = (Sketch::new(), Sketch::new());
//! for user in ["ann", "bob", "cy"] {
//!     monday.insert(user);
//! }
//! for user in ["bob", "cy", "dee"] {
//!     tuesday.insert(user);
//! }
//! let mut week = monday.clone();
//! week.merge(&tuesday);
//! assert_eq!(week.estimate(), 4); // distinct viewers, not 6 views
//! assert_eq!(Sketch::from_bytes(&week.to_bytes())?, week);
//! # Ok::<(), counter_core::unique::SketchFormatError>(())
//! ```

mod hash;
mod maintain;
mod member;
mod merge;
mod observe;
mod read;
mod rebuild;
pub mod sketch;

pub use hash::murmur64a;
pub use member::Member;
pub(crate) use merge::Merges;
pub(crate) use observe::cell;
pub use read::UniqueMap;
pub use rebuild::{Members, RebuildReport};
pub use sketch::{Sketch, SketchFormatError};

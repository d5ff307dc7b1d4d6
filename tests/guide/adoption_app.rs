// docs/guide/adoption.md, a file of a Loco app: `crate::models` is the
// guide test's (tests/guide.rs).
include!("common.rs");

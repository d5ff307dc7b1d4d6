//! Compile errors as a user of the published crates sees them, in a fresh
//! crate: each file under `ui/` (beside this crate's `Cargo.toml`) must fail
//! to compile with exactly its `.stderr`. `TRYBUILD=overwrite cargo test -p
//! counter-tests --test ui` rewrites the expected output after a deliberate
//! change; review the diff. (counter-derive's own `tests/ui` covers each
//! error of the derives.)

/// A typo'd option is one error, at the typo, not one more at each use of
/// the derived items: the derive generates stand-ins beside its error.
#[test]
fn a_typo_is_one_error() {
    trybuild::TestCases::new().compile_fail("ui/*.rs");
}

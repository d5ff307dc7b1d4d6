//! Compile errors of `#[derive(SlottedCounter)]` and `#[derive(CounterCache)]`
//! (`cache_*`): each file under `ui/` is a mistake a user can make, and its
//! `.stderr` is what they see, spans and all.
//! `TRYBUILD=overwrite cargo test -p counter-derive --test ui` updates the
//! expected output after a deliberate change; review the diff. The files
//! under `pass/` are expansions that must compile and run: test targets of
//! their own (`pass_*` in Cargo.toml), so that trybuild only checks.

#[test]
fn derive_errors() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}

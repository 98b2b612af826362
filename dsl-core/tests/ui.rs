//! Compile-time behaviour of `#[kernel]`: what it rejects (with spans and messages pinned in
//! `ui/fail/*.stderr`) and what it accepts (`ui/pass/*.rs`, which also run).
//!
//! Regenerate the expected output after an intended message change with
//! `TRYBUILD=overwrite cargo test -p dsl-core --test ui`, then read the diff.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/fail/*.rs");
    t.pass("tests/ui/pass/*.rs");
}

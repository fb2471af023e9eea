//! What the crate's tests share (compiled for tests only).

/// How many cases a property test runs: `PROPTEST_CASES` when set (a long run:
/// `PROPTEST_CASES=1000000 cargo test -p uvm_core gpujoin::`), else the test's own count, sized
/// for CI. Every property test of the crate asks here (`make lint` checks), so the variable
/// reaches them all: proptest itself reads it only for tests that keep its default
/// configuration.
pub(crate) fn proptest_cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

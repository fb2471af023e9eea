//! Allocations whose size follows the data, made fallible.
//!
//! Rust's `Vec` calls `abort()` when an allocation fails, and an aborted backend makes the
//! postmaster restart the whole cluster. Under strict overcommit (`vm.overcommit_memory = 2`,
//! the setting PostgreSQL's documentation recommends) a large join's buffers can fail to
//! allocate, so every buffer of the plan node whose size follows the data (the inner side's
//! (key, payload) pairs, each batch's matches) grows through [`try_reserve`]: a failure is
//! ERROR 53200 (`out_of_memory`), the query ends, the server stays up, and the memory already
//! held is freed as the ERROR unwinds.
//!
//! Buffers bounded by constants (a batch's keys, [`super::gpujoin::BATCH_TUPLES`] of them) and
//! memory from PostgreSQL's allocators (palloc, DSA: they raise the ERROR themselves) are not
//! routed here.
//!
//! The test-only setting `pg_uvm_share.test_alloc_limit` makes these allocations fail above a
//! size, so that the regression suite can check the path without exhausting the machine.

use crate::error::{Code, Result, UvmError};

/// Reserves room for `additional` more elements in `v` (as `Vec::try_reserve`, which grows the
/// capacity geometrically), or fails with 53200 naming `what`.
pub fn try_reserve<T>(v: &mut Vec<T>, additional: usize, what: &str) -> Result<()> {
    let want = v.len().saturating_add(additional);
    if want <= v.capacity() {
        return Ok(());
    }
    let bytes = want.saturating_mul(std::mem::size_of::<T>());
    let limited = crate::guc::test_alloc_limit().is_some_and(|limit| bytes as u64 > limit);
    if limited || v.try_reserve(additional).is_err() {
        return Err(UvmError::new(Code::OutOfMemory, "out of memory")
            .detail(format!("GpuJoin could not allocate {bytes} bytes for {what}.")));
    }
    Ok(())
}

/// Appends `x` to `v`, growing it through [`try_reserve`].
pub fn try_push<T>(v: &mut Vec<T>, x: T, what: &str) -> Result<()> {
    if v.len() == v.capacity() {
        // At least double (as push does), so that appending stays amortized O(1).
        try_reserve(v, v.len().max(1024), what)?;
    }
    v.push(x);
    Ok(())
}

/// Resizes `v` to `n` elements, new ones `fill`, growing it through [`try_reserve`].
pub fn try_resize<T: Clone>(v: &mut Vec<T>, n: usize, fill: T, what: &str) -> Result<()> {
    try_reserve(v, n.saturating_sub(v.len()), what)?;
    v.resize(n, fill);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_impossible_allocation_is_an_error_not_an_abort() {
        let mut v: Vec<[i64; 2]> = Vec::new();
        let e = try_reserve(&mut v, usize::MAX / 4, "the test").unwrap_err();
        assert_eq!(e.code, Code::OutOfMemory);
        assert!(v.is_empty());
        let e = try_resize(&mut v, usize::MAX / 32, [0, 0], "the test").unwrap_err();
        assert_eq!(e.code, Code::OutOfMemory);
    }

    #[test]
    fn pushes_grow_geometrically() {
        let mut v = Vec::new();
        for i in 0..5000u64 {
            try_push(&mut v, i, "the test").unwrap();
        }
        assert_eq!(v.len(), 5000);
        assert!(v.capacity() < 16384);
        try_resize(&mut v, 10, 0, "the test").unwrap();
        assert_eq!(v.len(), 10);
    }
}

//! Reading a child plan's rows a chunk at a time: the node's per-row loop over its children.

use super::*;

// utils/datum.h's datumCopy, which pgrx's bindings leave out, and executor/tuptable.h's
// slot_getsomeattrs_int, both declared without pgrx's per-call guard (the same signatures on
// PostgreSQL 14 to 18): the loops that read a child's rows call them inside one guard per
// chunk (`fetch_chunk`); and the calls that return a joined row, inside one guard per row.
unsafe extern "C-unwind" {
    #[link_name = "datumCopy"]
    pub(super) fn datum_copy_raw(value: pg_sys::Datum, typ_by_val: bool, typ_len: std::ffi::c_int) -> pg_sys::Datum;
    #[link_name = "slot_getsomeattrs_int"]
    pub(super) fn slot_getsomeattrs_raw(slot: *mut pg_sys::TupleTableSlot, attnum: std::ffi::c_int);
    // A joined row's calls (`GpuJoinScan::emit_row`): the exported function, or pgrx's C shim
    // of the static inline one, each as pgrx's bindings declare it.
    #[link_name = "MemoryContextReset"]
    pub(super) fn memory_context_reset_raw(context: pg_sys::MemoryContext);
    #[link_name = "ExecClearTuple__pgrx_cshim"]
    pub(super) fn exec_clear_tuple_raw(slot: *mut pg_sys::TupleTableSlot) -> *mut pg_sys::TupleTableSlot;
    #[link_name = "ExecStoreVirtualTuple"]
    pub(super) fn exec_store_virtual_tuple_raw(slot: *mut pg_sys::TupleTableSlot) -> *mut pg_sys::TupleTableSlot;
    #[link_name = "ExecQual__pgrx_cshim"]
    pub(super) fn exec_qual_raw(state: *mut pg_sys::ExprState, econtext: *mut pg_sys::ExprContext) -> bool;
    #[link_name = "ExecProject__pgrx_cshim"]
    pub(super) fn exec_project_raw(proj: *mut pg_sys::ProjectionInfo) -> *mut pg_sys::TupleTableSlot;
}

/// What the executor's static inline `ExecProcNode` does before it calls the node's method: a
/// node whose parameters changed is rescanned first. [`fetch_chunk`], which calls the method
/// directly, calls this before each chunk: parameters change only between
/// scans, and the rescan clears `chgParam`. (Without it, a child with new parameters was not
/// rescanned and returned nothing: PostgreSQL 17 and 18's battery caught it.)
///
/// # Safety
/// `node` is an initialized plan state.
pub(super) unsafe fn rescan_if_changed(node: *mut pg_sys::PlanState) {
    // SAFETY: forwarded contract.
    unsafe {
        if !(*node).chgParam.is_null() {
            pg_sys::ExecReScan(node);
        }
    }
}

/// Rows of a child plan with a non-NULL key, as [`fetch_chunk`] reads them: their keys, and per
/// row the values and NULL flags of some columns (`n` per row, none for the probe mode's keys),
/// by-reference values copied. With `keep_null_keys` (the outer side of a left or anti join,
/// whose rows without a match are returned) rows with a NULL key are kept too, their key 0 and
/// `keyless` set.
#[derive(Default)]
pub(super) struct Chunk {
    pub(super) keys: Vec<i64>,
    pub(super) vals: Vec<pg_sys::Datum>,
    pub(super) nulls: Vec<bool>,
    /// Rows with a NULL key skipped (or kept).
    pub(super) null_keys: u64,
    pub(super) keep_null_keys: bool,
    /// Per row, with `keep_null_keys`: whether its key is NULL (empty otherwise).
    pub(super) keyless: Vec<bool>,
}

/// Rows per chunk of the inner side (its by-reference values are copied into a scratch context
/// reset between chunks).
pub(super) const CHUNK_ROWS: usize = 1024;

/// Reads the next chunk of `node`'s rows with a non-NULL key (every key column of `key`
/// non-NULL) into `chunk`: the key, and the columns `resnos` (of `cols`: by-reference values
/// copied into `ctx` with `datumCopy`, which the caller keeps until it has used them). At most
/// `cap` rows; true when the child ended.
///
/// This is the node's per-row loop over its children, the work it adds to their scans, so it
/// calls PostgreSQL without pgrx's per-call guard (a `sigsetjmp` per call, two or three per
/// row): ExecProcNode, slot_getsomeattrs_int and datumCopy are called directly inside one
/// guard per chunk, which turns an ERROR raised inside into a Rust panic at its boundary;
/// nothing in the frames the ERROR jumps over needs dropping (the buffers are written through
/// raw pointers into room reserved before).
///
/// # Safety
/// `node` is an initialized plan state whose rows have the key's attributes (of their types)
/// and `resnos` (of the types `cols` describe), all ≤ `upto`; `ctx` is a live memory context.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn fetch_chunk(
    node: *mut pg_sys::PlanState,
    key: &KeyCols,
    upto: i32,
    resnos: &[i32],
    cols: &[Col],
    ctx: pg_sys::MemoryContext,
    chunk: &mut Chunk,
    cap: usize,
) -> bool {
    let n = resnos.len();
    chunk.keys.clear();
    chunk.vals.clear();
    chunk.nulls.clear();
    chunk.keyless.clear();
    chunk.keys.reserve(cap);
    chunk.vals.reserve(cap * n);
    chunk.nulls.reserve(cap * n);
    let keep = chunk.keep_null_keys;
    if keep {
        chunk.keyless.reserve(cap);
    }
    let (kp, vp, np, lp) =
        (chunk.keys.as_mut_ptr(), chunk.vals.as_mut_ptr(), chunk.nulls.as_mut_ptr(), chunk.keyless.as_mut_ptr());
    let (mut got, mut null_keys) = (0usize, 0u64);
    // SAFETY: forwarded contract.
    unsafe { rescan_if_changed(node) };
    // SAFETY: forwarded contract; every write is below `cap` rows of the room reserved above;
    // datumCopy allocates in `ctx` (CurrentMemoryContext is restored after each copy, and by
    // the abort after an ERROR).
    let ended = unsafe {
        pg_sys::ffi::pg_guard_ffi_boundary(|| {
            let Some(next) = (*node).ExecProcNode else { return true };
            let mut ended = false;
            while got < cap {
                let slot = next(node);
                if tup_is_null(slot) {
                    ended = true;
                    break;
                }
                if ((*slot).tts_nvalid as i32) < upto {
                    slot_getsomeattrs_raw(slot, upto);
                }
                let at = |att: i32| {
                    let i = (att - 1) as usize;
                    (*(*slot).tts_values.add(i), *(*slot).tts_isnull.add(i))
                };
                let mut k = key.composer.start();
                let mut null = false;
                for (i, (&att, &oid)) in key.atts.iter().zip(&key.oids).enumerate() {
                    let (d, isnull) = at(att);
                    if isnull {
                        null = true;
                        break;
                    }
                    k = key.composer.add(k, i, key_of(d, oid));
                }
                if null {
                    null_keys += 1;
                    if !keep {
                        continue;
                    }
                    k = key.composer.start();
                }
                *kp.add(got) = k as i64;
                if keep {
                    *lp.add(got) = null;
                }
                for (i, (&r, c)) in resnos.iter().zip(cols).enumerate() {
                    let (mut v, isnull) = at(r);
                    if !isnull && !c.byval {
                        // Only the copy goes to `ctx`: the child runs in the caller's context
                        // (a scan allocates what it keeps there at its first call).
                        let old = pg_sys::MemoryContextSwitchTo(ctx);
                        v = datum_copy_raw(v, false, c.len as std::ffi::c_int);
                        pg_sys::MemoryContextSwitchTo(old);
                    }
                    *vp.add(got * n + i) = v;
                    *np.add(got * n + i) = isnull;
                }
                got += 1;
            }
            ended
        })
    };
    // SAFETY: the first `got` rows were written above.
    unsafe {
        chunk.keys.set_len(got);
        chunk.vals.set_len(got * n);
        chunk.nulls.set_len(got * n);
        if keep {
            chunk.keyless.set_len(got);
        }
    }
    chunk.null_keys = null_keys;
    ended
}

pub(super) fn tup_is_null(slot: *mut pg_sys::TupleTableSlot) -> bool {
    // SAFETY: reads the flags of a live slot.
    slot.is_null() || unsafe { (*slot).tts_flags } & pg_sys::TTS_FLAG_EMPTY as u16 != 0
}

//! Building a cache's blocks by a parallel heap scan (`uvm.cache_table` of a cache without text
//! columns).
//!
//! The serial build reads its rows through an SPI cursor, a tuple at a time through the
//! executor; here the table's own parallel scan (`table_beginscan_parallel`, the one a Parallel
//! Seq Scan uses) hands heap blocks to a leader and `max_parallel_maintenance_workers` parallel
//! workers (as `CREATE INDEX` sizes its workers: one from `min_parallel_table_scan_size`, one
//! more for every tripling of the table), each decoding its tuples' chosen attributes straight
//! from the slot into cache blocks of its own memory (`BlockBuilder`).
//!
//! - **Blocks.** A participant that fills a block takes the next block number from a counter in
//!   the parallel context's shared memory, grows the segment to cover it if needed, and writes
//!   it whole through its own executor (its own mapping in process mode; a request in service
//!   mode). Every participant's last block is partly full: the format counts rows per block.
//!   The leader, after every worker has finished, reads the counters (blocks, rows) and writes
//!   the header, as the serial build does.
//! - **Snapshot.** The scan's snapshot is the build's (the active one the builder pushed, taken
//!   under its lock), serialized into the parallel scan: every participant sees the same rows.
//! - **Locks.** Workers open the table with `AccessShareLock` in the leader's lock group, so the
//!   builder's `ShareRowExclusiveLock` does not block them.
//! - **Errors and cancels.** A worker's ERROR is raised again in the leader (PostgreSQL's
//!   parallel messages). On any error the leader's guard here destroys the parallel context,
//!   which terminates and waits for the workers, before the build's guard drops the segment:
//!   no worker still writes a segment being dropped.
//! - **Numeric columns** are scaled as the serial build's SQL scales them (`decode.rs`):
//!   PostgreSQL's own `numeric_mul` by 10^scale and `numeric_int8`, so NaN and infinity are
//!   the same ERROR.
//! - **What stays serial.** Dictionary-coded text (one dictionary, codes in first-seen order)
//!   goes through the serial build; so does a build inside parallel mode.

use std::sync::atomic::AtomicU64;

use super::*;

/// Keys of the parallel context's table of contents.
const KEY_SHARED: u64 = 0x5556_4d43_4143_0001;
const KEY_SCAN: u64 = 0x5556_4d43_4143_0002;
/// Columns a parallel build carries (more go through the serial build).
const MAX_COLUMNS: usize = 256;
/// Bytes of the cache segment's name.
const NAME_BYTES: usize = 128;
/// The worker's entry point, as PostgreSQL looks it up in our library.
const ENTRY: &std::ffi::CStr = c"pg_uvm_share_cache_build_worker";
const LIBRARY: &std::ffi::CStr = c"$libdir/pg_uvm_share";

/// What the leader tells the workers, and the counters they share, in the parallel context's
/// shared memory.
#[repr(C)]
struct Shared {
    relid: pg_sys::Oid,
    block_rows: u64,
    ncols: u32,
    /// (encoding, attnum, scale) of each column.
    specs: [[i16; 3]; MAX_COLUMNS],
    name_len: u32,
    name: [u8; NAME_BYTES],
    /// The next block number to fill.
    next_block: AtomicU64,
    /// Rows written, by every participant.
    rows: AtomicU64,
}

impl Shared {
    fn columns(&self) -> Result<Vec<ColumnSpec>> {
        let n = (self.ncols as usize).min(MAX_COLUMNS);
        self.specs[..n]
            .iter()
            .map(|&[e, attnum, scale]| {
                let encoding = Encoding::from_repr(e as u16)
                    .ok_or_else(|| UvmError::new(Code::SystemError, format!("unknown encoding {e} in a cache build")))?;
                Ok(ColumnSpec { encoding, attnum, scale })
            })
            .collect()
    }

    fn name(&self) -> Result<&str> {
        std::str::from_utf8(&self.name[..(self.name_len as usize).min(NAME_BYTES)])
            .map_err(|_| UvmError::new(Code::SystemError, "a cache build's segment name is not UTF-8"))
    }
}

/// Whether the parallel build can fill a cache of `columns` (see the module essay).
pub(super) fn suits(columns: &[ColumnSpec], segment: &str) -> bool {
    columns.len() <= MAX_COLUMNS
        && segment.len() <= NAME_BYTES
        && columns.iter().all(|c| c.encoding != Encoding::DictCode)
        // SAFETY: reads a flag of this backend.
        && !unsafe { pg_sys::IsInParallelMode() }
}

/// Parallel workers for a table of `pages` heap pages: none below
/// `min_parallel_table_scan_size`, then one more for every tripling, at most
/// `max_parallel_maintenance_workers` (PostgreSQL's rule for a parallel scan's workers).
pub(super) fn workers_for(pages: u64) -> i32 {
    // SAFETY: reads two GUC variables of this backend.
    let (threshold, cap) =
        unsafe { (pg_sys::min_parallel_table_scan_size.max(1) as u64, pg_sys::max_parallel_maintenance_workers) };
    if pages < threshold || cap <= 0 {
        return 0;
    }
    let (mut workers, mut t) = (1, threshold);
    while pages >= t.saturating_mul(3) && workers < cap {
        workers += 1;
        t = t.saturating_mul(3);
    }
    workers.min(cap)
}

/// A parallel context of this module, destroyed (its workers terminated and waited for) and
/// parallel mode left when it goes, also while an ERROR unwinds.
struct Context(*mut pg_sys::ParallelContext);

impl Drop for Context {
    fn drop(&mut self) {
        crate::runtime::held_off(|| {
            // SAFETY: a context this module created and has not destroyed; destroying it
            // terminates its workers and waits for them to exit.
            unsafe {
                pg_sys::DestroyParallelContext(self.0);
                pg_sys::ExitParallelMode();
            }
        });
    }
}

/// Fills `seg` with the rows of `relid` visible to the active snapshot, in blocks of
/// `block_rows` rows of `columns`, with up to `workers` parallel workers beside this process;
/// returns (blocks, rows, the workers launched).
pub(super) fn fill(
    relid: pg_sys::Oid,
    seg: &SegRef,
    columns: &[ColumnSpec],
    block_rows: u64,
    workers: i32,
) -> Result<(u64, u64, u32)> {
    // SAFETY: the caller holds ShareRowExclusiveLock on the table; it is closed below (or by the
    // transaction's abort after an ERROR).
    let rel = unsafe { pg_sys::table_open(relid, pg_sys::NoLock as i32) };
    // SAFETY: entering parallel mode in a backend that is not in it (`suits`); left by
    // `Context`'s drop.
    let pcxt = unsafe {
        pg_sys::EnterParallelMode();
        Context(pg_sys::CreateParallelContext(LIBRARY.as_ptr(), ENTRY.as_ptr(), workers))
    };
    // SAFETY: the context is fresh; the estimates cover the two chunks inserted below; the
    // shared struct and the scan descriptor live in its memory until it is destroyed, after
    // every participant has finished with them.
    let shared: &Shared = unsafe {
        let snapshot = pg_sys::GetActiveSnapshot();
        let scan_bytes = pg_sys::table_parallelscan_estimate(rel, snapshot);
        let est = &mut (*pcxt.0).estimator;
        est.space_for_chunks += buffer_align(std::mem::size_of::<Shared>()) + buffer_align(scan_bytes);
        est.number_of_keys += 2;
        pg_sys::InitializeParallelDSM(pcxt.0);
        let toc = (*pcxt.0).toc;
        let sh = pg_sys::shm_toc_allocate(toc, std::mem::size_of::<Shared>()) as *mut Shared;
        std::ptr::write_bytes(sh as *mut u8, 0, std::mem::size_of::<Shared>());
        let w = &mut *sh;
        w.relid = relid;
        w.block_rows = block_rows;
        w.ncols = columns.len() as u32;
        for (i, c) in columns.iter().enumerate() {
            w.specs[i] = [c.encoding as u16 as i16, c.attnum, c.scale];
        }
        w.name_len = seg.name().len() as u32;
        w.name[..seg.name().len()].copy_from_slice(seg.name().as_bytes());
        pg_sys::shm_toc_insert(toc, KEY_SHARED, sh as *mut std::ffi::c_void);
        let pscan = pg_sys::shm_toc_allocate(toc, scan_bytes) as pg_sys::ParallelTableScanDesc;
        pg_sys::table_parallelscan_initialize(rel, pscan, snapshot);
        pg_sys::shm_toc_insert(toc, KEY_SCAN, pscan as *mut std::ffi::c_void);
        pg_sys::LaunchParallelWorkers(pcxt.0);
        &*sh
    };
    // The leader scans too; then waits for the workers (re-raising a worker's ERROR).
    // SAFETY: the scan descriptor was inserted above.
    let pscan = unsafe { pg_sys::shm_toc_lookup((*pcxt.0).toc, KEY_SCAN, false) as pg_sys::ParallelTableScanDesc };
    scan_part(shared, rel, pscan)?;
    // SAFETY: the context's workers were launched above.
    unsafe { pg_sys::WaitForParallelWorkersToFinish(pcxt.0) };
    let (blocks, rows) = (shared.next_block.load(Ordering::Acquire), shared.rows.load(Ordering::Acquire));
    // SAFETY: the context is live until dropped below.
    let launched = unsafe { (*pcxt.0).nworkers_launched.max(0) as u32 };
    drop(pcxt);
    // SAFETY: opened above.
    unsafe { pg_sys::table_close(rel, pg_sys::NoLock as i32) };
    Ok((blocks, rows, launched))
}

fn buffer_align(n: usize) -> usize {
    n.div_ceil(64) * 64
}

/// A table scan and its slot, ended when it goes on a normal return or a Rust error (an
/// ERROR's abort releases them itself).
struct Scan {
    scan: pg_sys::TableScanDesc,
    slot: *mut pg_sys::TupleTableSlot,
}

impl Drop for Scan {
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        // SAFETY: begun and created by `scan_part`, ended once.
        unsafe {
            pg_sys::table_endscan(self.scan);
            pg_sys::ExecDropSingleTupleTableSlot(self.slot);
        }
    }
}

/// One participant's share: scans heap blocks from the parallel scan until none is left,
/// filling cache blocks and writing each one whole at the next free block number.
fn scan_part(shared: &Shared, rel: pg_sys::Relation, pscan: pg_sys::ParallelTableScanDesc) -> Result<()> {
    let columns = shared.columns()?;
    let layout = Layout::plan(u32::from(shared.relid), &columns, shared.block_rows)?;
    let (seg, _) = lookup_own(shared.name()?)?;
    let (data_offset, block_bytes) = (layout.header().data_offset, layout.header().block_bytes);
    let flush = |b: BlockBuilder| -> Result<()> {
        let too_many = || UvmError::new(Code::ProgramLimitExceeded, "the cache outgrows a segment");
        let n = shared.next_block.fetch_add(1, Ordering::AcqRel);
        let at = n.checked_mul(block_bytes).and_then(|x| x.checked_add(data_offset)).ok_or_else(too_many)?;
        let end = at.checked_add(block_bytes).ok_or_else(too_many)?;
        try_executor(|ex| exec::grow_at_least(ex, &seg, end))?;
        let bytes = b.finish();
        try_executor(|ex| exec::write(ex, &seg, at as i64, &bytes))
    };
    // SAFETY: the relation is open; the scan and slot are ended by `Scan`'s drop.
    let scan = unsafe {
        Scan { scan: pg_sys::table_beginscan_parallel(rel, pscan), slot: pg_sys::table_slot_create(rel, std::ptr::null_mut()) }
    };
    let mut decoder = super::decode::Decoder::new(&columns);
    let mut block = BlockBuilder::new(&layout);
    let mut row: Vec<Option<u64>> = vec![None; columns.len()];
    let mut rows = 0u64;
    // SAFETY: the scan and slot are live (ended by `Scan`'s drop only).
    while unsafe { pg_sys::table_scan_getnextslot(scan.scan, pg_sys::ScanDirection::ForwardScanDirection, scan.slot) } {
        // SAFETY: the slot holds a tuple of the table; `suits` kept text columns out.
        unsafe { decoder.decode(scan.slot, &mut row, true) };
        block.push(&row)?;
        rows += 1;
        if block.is_full() {
            flush(std::mem::replace(&mut block, BlockBuilder::new(&layout)))?;
        }
    }
    if block.rows() > 0 {
        flush(block)?;
    }
    shared.rows.fetch_add(rows, Ordering::AcqRel);
    drop(scan);
    Ok(())
}

/// A parallel worker's entry point (PostgreSQL calls it by name from our library).
///
/// # Safety
///
/// Called by PostgreSQL's `ParallelWorkerMain` with the leader's parallel context's segment and
/// table of contents.
#[no_mangle]
#[pgrx::pg_guard]
pub unsafe extern "C-unwind" fn pg_uvm_share_cache_build_worker(_seg: *mut pg_sys::dsm_segment, toc: *mut pg_sys::shm_toc) {
    // SAFETY: the leader inserted both keys before launching its workers; the memory lives
    // until the leader destroys the context, after this worker has exited.
    let (shared, pscan) = unsafe {
        (
            &*(pg_sys::shm_toc_lookup(toc, KEY_SHARED, false) as *const Shared),
            pg_sys::shm_toc_lookup(toc, KEY_SCAN, false) as pg_sys::ParallelTableScanDesc,
        )
    };
    // SAFETY: the table is locked by the leader, whose lock group this worker joined; the
    // worker's AccessShareLock does not conflict with it and is held to the worker's end.
    let rel = unsafe { pg_sys::table_open(shared.relid, pg_sys::AccessShareLock as i32) };
    if let Err(e) = scan_part(shared, rel, pscan) {
        crate::runtime::report(e);
    }
    // SAFETY: opened above.
    unsafe { pg_sys::table_close(rel, pg_sys::AccessShareLock as i32) };
}

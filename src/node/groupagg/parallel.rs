//! GpuGroupAgg over the heap in parallel: the workers lay their share of the fact's rows out in
//! column batches and hand each to one process, the runner, which alone runs the program into
//! its one group table and returns the groups (see the module essay, "Over the heap").
//!
//! # Why one runner
//!
//! A group table per participant would need a merge of tables and a format for partial
//! aggregate states (PG-Strom's GpuPreAgg has both), and in the `process` execution mode a CUDA
//! context per worker (150-170 ms each, serialised by the driver). The program is not what takes
//! the time over a heap: reading and laying out the rows is. So the workers scan and lay out,
//! and the runner runs every batch's program between its own (GpuJoin's leader probes,
//! `crate::node::handoff`, do the same with keys).
//!
//! # The exchange
//!
//! [`Exchange`], in the parallel query's DSM: a [`Handoff`] whose entries are batches (a block's
//! bytes, in the query's DSA area, as 8-byte words: a block's size is a multiple of the cache's
//! 256-byte alignment), at most [`IN_FLIGHT`] of them at once, and which process runs: the
//! leader where it runs the plan below the Gather (`parallel_leader_participation`, read when
//! the leader sets the DSM up), else worker 0, the first one launched (PostgreSQL's leader
//! then only reads the Gather's queues). A leader that launched no worker runs the plan itself,
//! and runs it as the runner: it finds no producer. A runner that answers from its child
//! (`Mode::Child`) still takes and frees every batch, so that no worker waits for room forever.
//!
//! Every producer registers before it reads a row; the runner closes the exchange once its own
//! share is read and no producer is registered: a worker that starts after that finds the
//! exchange closed and returns at once (the scan handed every page out already).

use super::*;
use crate::node::handoff::Handoff;

/// Batches handed over and not yet taken, at most (each at most a block: `work_mem`, within
/// `HEAP_BATCH_BYTES`).
pub(super) const IN_FLIGHT: usize = 4;

/// Rows the runner reads of its own share between two looks at the exchange (a few ms of
/// reading and laying out): a worker's batch waits no longer than that to be taken. With a
/// look per block, the exchange's [`IN_FLIGHT`] batches could fill while the runner filled a
/// block of its own (up to 1 Mi rows, about 0.1 s), and up to 8 workers then waited on it.
pub(super) const POLL_ROWS: usize = 1 << 16;

/// Which process runs the program.
const LEADER: u32 = 0;
const WORKER0: u32 = 1;

/// The node's state in the parallel query's DSM.
#[repr(C)]
pub(super) struct Exchange {
    handoff: Handoff,
    runner: u32,
}

/// Bytes of the DSM the node asks for.
pub(super) fn exchange_bytes() -> usize {
    std::mem::size_of::<Exchange>()
}

impl Exchange {
    /// Sets up `x` (the leader, before workers start): batches of at most `block_bytes`.
    ///
    /// # Safety
    /// `x` points at [`exchange_bytes`] writable bytes of the DSM.
    pub(super) unsafe fn init(x: *mut Exchange, block_bytes: u64) {
        // SAFETY: forwarded contract; zeroed, then set up in place.
        unsafe {
            std::ptr::write_bytes(x as *mut u8, 0, exchange_bytes());
            Handoff::init(&raw mut (*x).handoff, true, IN_FLIGHT, (block_bytes / 8) as usize);
            (*x).runner = if pg_sys::parallel_leader_participation { LEADER } else { WORKER0 };
        }
    }

    /// Sets `x` back for a rescan (no participant runs), freeing any batch left.
    ///
    /// # Safety
    /// As for [`Exchange::init`], set up before; `area` is the query's DSA area or null.
    pub(super) unsafe fn reset(x: *mut Exchange, area: *mut pg_sys::dsa_area) {
        // SAFETY: forwarded contract.
        unsafe {
            Handoff::reset(&raw mut (*x).handoff, area);
            (*x).runner = if pg_sys::parallel_leader_participation { LEADER } else { WORKER0 };
        }
    }

    /// The exchange's handoff.
    ///
    /// # Safety
    /// `x` was set up by [`Exchange::init`].
    pub(super) unsafe fn handoff(x: *mut Exchange) -> *mut Handoff {
        // SAFETY: forwarded contract.
        unsafe { &raw mut (*x).handoff }
    }

    /// Whether this process runs the program: the runner the leader chose; the leader too
    /// wherever it runs the plan (it does so as a producer only where a worker runs).
    ///
    /// # Safety
    /// As for [`Exchange::handoff`].
    pub(super) unsafe fn runs_here(x: *const Exchange) -> bool {
        // SAFETY: forwarded contract; written before any worker started.
        let runner = unsafe { (*x).runner };
        // SAFETY: this process's worker number (-1 in the leader).
        let worker = unsafe { pg_sys::ParallelWorkerNumber };
        match worker {
            -1 => true,
            0 => runner == WORKER0,
            _ => false,
        }
    }
}

/// A producer's work: every row of its share of the fact's scan `fact`, laid out in blocks of
/// `layout` and handed to the runner; nothing where the exchange is closed already.
///
/// # Safety
/// `fact` is the node's initialized heap scan (the program's columns, in `layout`'s order); `h`
/// the query's exchange, `area` its DSA area; a parallel worker.
pub(super) unsafe fn hand_batches(
    fact: *mut pg_sys::PlanState,
    layout: &crate::cache::Layout,
    h: *mut Handoff,
    area: *mut pg_sys::dsa_area,
) {
    // SAFETY: forwarded contract.
    unsafe {
        if !Handoff::register(h) {
            return;
        }
        let mut rows = RowReader::new(layout);
        loop {
            let (block, more) = rows.fill(fact).unwrap_or_else(|e| report(e));
            if block.rows() > 0 {
                let bytes = block.finish();
                Handoff::push(h, area, &words_of(&bytes)).unwrap_or_else(|e| report(e));
            }
            if !more {
                break;
            }
            pg_sys::check_for_interrupts!();
        }
        Handoff::finish(h);
    }
}

/// A block's bytes as the 8-byte words the exchange carries (a block's size is a multiple of 8):
/// the bytes themselves where they are aligned as words (an allocation of a block's size is),
/// a copy otherwise.
fn words_of(bytes: &[u8]) -> std::borrow::Cow<'_, [i64]> {
    // SAFETY: any 8 bytes are a valid i64; `align_to` splits off whatever is not aligned.
    match unsafe { bytes.align_to::<i64>() } {
        ([], words, []) => std::borrow::Cow::Borrowed(words),
        _ => bytes
            .chunks(8)
            .map(|c| {
                let mut w = [0u8; 8];
                w[..c.len()].copy_from_slice(c);
                i64::from_ne_bytes(w)
            })
            .collect(),
    }
}

/// The bytes of a batch's words (as [`words_of`] made them).
pub(super) fn bytes_of(words: &[i64]) -> &[u8] {
    // SAFETY: the words' own memory, read as bytes (any byte is a valid u8; the length is the
    // words' size).
    unsafe { std::slice::from_raw_parts(words.as_ptr() as *const u8, std::mem::size_of_val(words)) }
}

/// Reads a heap scan's rows into blocks of a layout.
pub(super) struct RowReader<'a> {
    layout: &'a crate::cache::Layout,
    /// The block being filled, between [`RowReader::fill_some`]'s calls.
    block: Option<crate::cache::BlockBuilder>,
}

// A slot's values are read as the raw words a by-value datum is (`BlockBuilder::push_raw`).
const _: () = assert!(std::mem::size_of::<pg_sys::Datum>() == std::mem::size_of::<u64>());

impl<'a> RowReader<'a> {
    pub(super) fn new(layout: &'a crate::cache::Layout) -> RowReader<'a> {
        RowReader { layout, block: None }
    }

    /// The next block of the scan's rows, and whether rows may follow it (false: the scan
    /// ended within it).
    ///
    /// # Safety
    /// As [`RowReader::fill_some`].
    pub(super) unsafe fn fill(&mut self, fact: *mut pg_sys::PlanState) -> Result<(crate::cache::BlockBuilder, bool)> {
        loop {
            // SAFETY: forwarded contract.
            if let Some(done) = unsafe { self.fill_some(fact, usize::MAX) }? {
                return Ok(done);
            }
        }
    }

    /// Reads up to `most` more of the scan's rows into the block being filled: the block,
    /// and whether rows may follow it, once it is full or the scan ended within it; `None`
    /// while it has room (a runner that reads its own share takes the workers' batches
    /// between such calls, so that they do not wait on a full exchange while it fills a
    /// block).
    ///
    /// # Safety
    /// `fact` is an initialized scan whose rows are the layout's columns, in order, each of a
    /// by-value type whose datum is its cache word's low bytes (`plan`'s `heap_columns`).
    pub(super) unsafe fn fill_some(
        &mut self,
        fact: *mut pg_sys::PlanState,
        most: usize,
    ) -> Result<Option<(crate::cache::BlockBuilder, bool)>> {
        let ncols = self.layout.columns().len();
        let block = self.block.get_or_insert_with(|| crate::cache::BlockBuilder::new(self.layout));
        for _ in 0..most {
            if block.is_full() {
                break;
            }
            // SAFETY: forwarded contract; the slot's first `ncols` attributes are the columns
            // (checked against its descriptor), deformed before they are read; a Datum is a
            // word (asserted above), and its arrays hold at least `ncols` entries.
            unsafe {
                let slot = pg_sys::ExecProcNode(fact);
                if slot.is_null() || (*slot).tts_flags & pg_sys::TTS_FLAG_EMPTY as u16 != 0 {
                    return Ok(self.block.take().map(|b| (b, false)));
                }
                if (*(*slot).tts_tupleDescriptor).natts as usize != ncols {
                    return Err(UvmError::new(Code::SystemError, "GpuGroupAgg: the fact's scan returns other columns"));
                }
                if ((*slot).tts_nvalid as usize) < ncols {
                    pg_sys::slot_getsomeattrs_int(slot, ncols as i32);
                }
                let values = std::slice::from_raw_parts((*slot).tts_values as *const u64, ncols);
                let nulls = std::slice::from_raw_parts((*slot).tts_isnull as *const bool, ncols);
                block.push_raw(values, nulls)?;
            }
        }
        Ok(if block.is_full() { self.block.take().map(|b| (b, true)) } else { None })
    }
}

/// Takes and frees every batch until no producer may hand one any more (a runner that answers
/// from its child: the producers must not wait for room forever).
///
/// # Safety
/// `h` the query's exchange, `area` its DSA area; the runner.
pub(super) unsafe fn drain(h: *mut Handoff, area: *mut pg_sys::dsa_area) {
    // SAFETY: forwarded contract; every taken batch is released before the next take.
    unsafe {
        loop {
            let closed = Handoff::try_close(h);
            while let Some(t) = Handoff::take(h) {
                Handoff::release(h, area, t);
            }
            if closed {
                break;
            }
            Handoff::wait(h);
        }
        crate::pgwait::cancel_sleep();
    }
}

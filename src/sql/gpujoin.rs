//! The GpuJoin SQL surface:
//!
//! - `uvm.gpujoin_build` puts an inner hash table into a segment (built by a kernel under the
//!   CUDA provider, on the CPU under the host provider), reading its query twice through a
//!   scrollable cursor (count, then insert a batch at a time), writing the header last and
//!   dropping the segment if the build fails or is cancelled;
//! - the aggregate `uvm.gpujoin_probe(segment, key)` probes it from every parallel worker and
//!   returns `(matches, payload_sum)`, as `count(*), sum(payload)` of the equivalent join would;
//! - `uvm.gpujoin_pairs_create` makes a result buffer, the aggregate
//!   `uvm.gpujoin_materialize(segment, result, key)` appends every matched (key, payload) pair to
//!   it from every worker (growing it on demand, `gpujoin::pairs`), and the set-returning
//!   `uvm.gpujoin_pairs(result)` reads them back.
//!
//! The aggregates' support functions are tied together by `CREATE AGGREGATE` in SQL (pgrx
//! 0.18's `#[pg_aggregate]` gets the `internal` deserial signature wrong). The transition
//! functions, called once per row, are plain V1 C functions: no argument conversion, the segment
//! names checked once when they are constants (on every row otherwise), a push. Their state
//! lives in the aggregate memory context;
//! keys are probed a batch at a time, by one kernel launch per batch under the CUDA provider.
//! Under that provider the first row also starts CUDA on a helper thread
//! (`gpu::warm_up_in_background`), and keys gather (up to `work_mem`, at least
//! [`MIN_DEFER_KEYS`]) until it is up, so that a parallel worker's CUDA start-up overlaps its
//! scan.

use pgrx::datum::Internal;
use pgrx::prelude::*;
use pgrx::{AllocatedByRust, AnyNumeric, PgMemoryContexts};

use crate::error::{Code, Result, UvmError};
use crate::exec::{self, SegRef};
use crate::gpujoin::pairs;
use crate::gpujoin::probe::{ProbeState, BATCH};
use crate::gpujoin::table::{self, KeyType};
use crate::registry::TierPref;
use crate::runtime::{current_user, now, report, resolve, with_executor};

pgrx::extension_sql!(
    "CREATE TYPE gpujoin_result AS (matches bigint, payload_sum numeric);",
    name = "gpujoin_result_type",
    bootstrap
);

fn key_type_of(oid: pg_sys::Oid) -> Option<KeyType> {
    match oid {
        pg_sys::INT4OID => Some(KeyType::Int4),
        pg_sys::INT8OID => Some(KeyType::Int8),
        _ => None,
    }
}

/// Rows fetched from the build query's cursor at a time: the only host memory a build uses
/// besides the segment, whatever the query returns.
const FETCH_ROWS: usize = 1 << 14;

/// The build query as a scrollable SPI cursor, read twice: once to count the rows (the
/// table's size), once to insert them. PostgreSQL re-reads what it can (a backward scan) and
/// keeps the rest in a tuplestore, which spills to disk past `work_mem`, so no user-sized
/// allocation happens outside PostgreSQL's memory contexts or the segment.
///
/// The portal is closed by [`BuildCursor::close`] on success; after an error the transaction's
/// abort drops it (closing it while unwinding could raise a second error).
struct BuildCursor {
    portal: pg_sys::Portal,
    key: KeyType,
    payload: KeyType,
}

impl BuildCursor {
    /// Opens `query` (within an SPI connection) and checks its columns: exactly two, key and
    /// payload, each `integer` or `bigint` (42804 otherwise).
    fn open(query: &str) -> Result<BuildCursor> {
        let q = std::ffi::CString::new(query)
            .map_err(|_| UvmError::new(Code::InvalidParameterValue, "gpujoin_build query must not contain NUL bytes"))?;
        // SAFETY: SPI is connected (Spi::connect); the query string is NUL-terminated and lives
        // for the call; no parameters. An error in the query raises an ERROR (a Rust unwind).
        let portal = unsafe {
            pg_sys::SPI_cursor_open_with_args(
                std::ptr::null(),
                q.as_ptr(),
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null(),
                false,
                pg_sys::CURSOR_OPT_SCROLL as i32,
            )
        };
        if portal.is_null() {
            return Err(UvmError::new(Code::InvalidParameterValue, "gpujoin_build query opened no cursor"));
        }
        // SAFETY: the portal was just opened; its tuple descriptor describes the query's result.
        let (natts, key_oid, payload_oid) = unsafe {
            let desc = (*portal).tupDesc;
            if desc.is_null() {
                (0, pg_sys::InvalidOid, pg_sys::InvalidOid)
            } else {
                let n = (*desc).natts;
                let t = |i: i32| if n >= i { pg_sys::SPI_gettypeid(desc, i) } else { pg_sys::InvalidOid };
                (n, t(1), t(2))
            }
        };
        if natts != 2 {
            return Err(UvmError::new(Code::DatatypeMismatch, "gpujoin_build needs a query of two columns: key, payload")
                .detail(format!("The query returns {natts} columns.")));
        }
        let key = key_type_of(key_oid)
            .ok_or_else(|| UvmError::new(Code::DatatypeMismatch, "gpujoin_build keys must be integer or bigint"))?;
        let payload = key_type_of(payload_oid)
            .ok_or_else(|| UvmError::new(Code::DatatypeMismatch, "gpujoin_build payloads must be integer or bigint"))?;
        Ok(BuildCursor { portal, key, payload })
    }

    /// Fetches the next batch into `out` (cleared first; at most FETCH_ROWS rows): (key, payload),
    /// a NULL payload as 0. Returns the rows fetched (0 at the end).
    fn fetch(&mut self, out: &mut Vec<(Option<i64>, i64)>) -> usize {
        out.clear();
        let value = |d: pg_sys::Datum, t: KeyType| match t {
            KeyType::Int4 => d.value() as i32 as i64,
            KeyType::Int8 => d.value() as i64,
        };
        // SAFETY: an open portal of this SPI connection; SPI_tuptable holds SPI_processed rows
        // of two int4/int8 columns (checked in `open`), freed before returning.
        unsafe {
            pg_sys::SPI_cursor_fetch(self.portal, true, FETCH_ROWS as std::ffi::c_long);
            let tt = pg_sys::SPI_tuptable;
            if tt.is_null() {
                return 0;
            }
            let n = (pg_sys::SPI_processed as usize).min(FETCH_ROWS);
            for i in 0..n {
                let tuple = *(*tt).vals.add(i);
                let (mut kn, mut pn) = (false, false);
                let k = pg_sys::SPI_getbinval(tuple, (*tt).tupdesc, 1, &mut kn);
                let p = pg_sys::SPI_getbinval(tuple, (*tt).tupdesc, 2, &mut pn);
                out.push(((!kn).then(|| value(k, self.key)), if pn { 0 } else { value(p, self.payload) }));
            }
            pg_sys::SPI_freetuptable(tt);
        }
        out.len()
    }

    /// Back to before the first row.
    fn rewind(&mut self) {
        // SAFETY: an open, scrollable portal of this SPI connection.
        unsafe { pg_sys::SPI_scroll_cursor_move(self.portal, pg_sys::FetchDirection::FETCH_ABSOLUTE, 0) };
    }

    fn close(self) {
        // SAFETY: an open portal of this SPI connection, closed once.
        unsafe { pg_sys::SPI_cursor_close(self.portal) };
    }
}

/// A segment being built: dropped unless [`HalfBuilt::done`] is called, so that an error or a
/// cancel in the middle of a build leaves no segment behind. Its header is written last
/// anyway, so a segment that could not be dropped (another process pinned it meanwhile) never
/// passes for a table.
struct HalfBuilt {
    seg: Option<SegRef>,
}

impl HalfBuilt {
    fn done(mut self) {
        self.seg = None;
    }
}

impl Drop for HalfBuilt {
    fn drop(&mut self) {
        if let Some(seg) = self.seg.take() {
            // Runs while an ERROR unwinds (pgrx has flushed PostgreSQL's error state, so taking
            // the registry lock and waiting for the service are allowed). Interrupts are held
            // off, so that a second cancel cannot raise an ERROR inside this drop; the drop's
            // own error (another process pinned the segment) is ignored.
            crate::runtime::held_off(|| {
                let _ = std::panic::catch_unwind(|| crate::runtime::try_with_executor(|ex| exec::drop(ex, &seg)));
            });
        }
    }
}

/// Rows a build sends per request at most (16 MiB of rows in process mode; the service's
/// staging bounds it further), whatever the query returns.
const BUILD_ROWS: usize = 1 << 20;

/// Builds the inner hash table of `query`'s (key, payload) rows into a new segment named
/// `segment` (tier as for `create_segment`). Returns the rows read, NULL keys included.
///
/// The query is read twice through a scrollable cursor ([`BuildCursor`]): first to count the
/// rows, which sizes the segment, then to insert them a batch at a time (on the CPU, or by a
/// kernel launch per batch under the CUDA provider, wherever the cluster runs its work). The
/// header is written last; an error or a cancel at any point drops the half-made segment
/// ([`HalfBuilt`]).
#[pg_extern(volatile, parallel_unsafe)]
fn gpujoin_build(segment: &str, query: &str, tier: default!(&str, "'auto'")) -> i64 {
    let pref = TierPref::parse(tier).unwrap_or_else(|e| report(e));
    crate::registry::validate_name(segment).unwrap_or_else(|e| report(e));
    crate::registry::check_not_reserved(segment).unwrap_or_else(|e| report(e));
    Spi::connect(|_client| {
        let mut cur = BuildCursor::open(query).unwrap_or_else(|e| report(e));
        let mut batch = Vec::with_capacity(FETCH_ROWS);
        let mut stored = 0u64;
        while cur.fetch(&mut batch) > 0 {
            stored += batch.iter().filter(|r| r.0.is_some()).count() as u64;
            crate::interrupt::check().unwrap_or_else(|e| report(e));
        }
        cur.rewind();
        let bytes = table::table_bytes(stored).min(i64::MAX as u64) as i64;
        with_executor(|ex| exec::create(ex, segment, bytes, Some(bytes), pref, current_user(), now()));
        let (seg, _) = resolve(segment, "write").unwrap_or_else(|e| report(e));
        let half = HalfBuilt { seg: Some(seg) };
        let rows = insert_rows(&seg, &mut cur, &mut batch, stored).unwrap_or_else(|e| report(e));
        cur.close();
        half.done();
        rows as i64
    })
}

/// Pass two: zeroes the table, inserts the cursor's rows [`BUILD_ROWS`] per request, and
/// writes the header last; returns the rows read.
fn insert_rows(seg: &SegRef, cur: &mut BuildCursor, batch: &mut Vec<(Option<i64>, i64)>, stored: u64) -> Result<u64> {
    let kt = cur.key;
    let n = table::slot_count(stored);
    with_executor(|ex| exec::build_begin(ex, seg, n));
    let mut rows_buf: Vec<[i64; 2]> = Vec::with_capacity(BUILD_ROWS.min(stored as usize + 1));
    let (mut rows, mut inserted) = (0u64, 0u64);
    loop {
        let got = cur.fetch(batch);
        for (k, p) in batch.iter() {
            if let Some(k) = k {
                rows_buf.push([*k, *p]);
                inserted += 1;
            }
        }
        rows += got as u64;
        if inserted > stored {
            return Err(UvmError::new(
                Code::InvalidParameterValue,
                format!("the gpujoin_build query returned more than the {stored} rows it counted first"),
            )
            .hint("The query must return the same rows when it is read twice; avoid volatile functions in it."));
        }
        // One request per BUILD_ROWS rows (the next fetch could overflow the buffer), and one
        // for the rest.
        if rows_buf.len() + FETCH_ROWS > BUILD_ROWS || (got == 0 && !rows_buf.is_empty()) {
            with_executor(|ex| exec::build_insert(ex, seg, kt, n, &rows_buf));
            rows_buf.clear();
        }
        if got == 0 {
            break;
        }
    }
    with_executor(|ex| exec::build_finish(ex, seg, kt, n, inserted, rows - inserted));
    Ok(rows)
}

/// Keys a state gathers at least (32 MiB) while CUDA starts on the helper thread.
pub const MIN_DEFER_KEYS: usize = 1 << 22;

/// Keys a state may gather while CUDA starts: `work_mem` of them (the memory a hash join of
/// this query could use per process), at least `MIN_DEFER_KEYS`.
fn defer_limit() -> usize {
    // SAFETY: reads the work_mem setting (kB) of this process.
    let work_mem_kb = unsafe { pg_sys::work_mem }.max(0) as usize;
    (work_mem_kb * 1024 / 8).max(MIN_DEFER_KEYS)
}

/// The state behind an `internal` aggregate argument, created in the aggregate memory context.
///
/// # Safety
/// `fcinfo` must be the aggregate support function's call info; `state` must be null or a
/// pointer made by this function.
unsafe fn state(state: &mut Internal, fcinfo: pg_sys::FunctionCallInfo) -> &mut AggState {
    // SAFETY: forwarded contract.
    unsafe {
        if !state.initialized() {
            *state = Internal::from(Some(pg_sys::Datum::from(new_state(fcinfo))));
        }
        state.get_mut::<AggState>().expect("initialized above")
    }
}

/// A new state in the aggregate memory context.
///
/// # Safety
/// `fcinfo` must be an aggregate support function's call info.
unsafe fn new_state(fcinfo: pg_sys::FunctionCallInfo) -> *mut AggState {
    let mut ctx: pg_sys::MemoryContext = std::ptr::null_mut();
    // SAFETY: forwarded contract; AggCheckCallContext only inspects fcinfo.
    if unsafe { pg_sys::AggCheckCallContext(fcinfo, &mut ctx) } == 0 {
        report(UvmError::new(Code::FeatureNotSupported, "GpuJoin support functions are for the aggregates only"));
    }
    PgMemoryContexts::For(ctx).leak_and_drop_on_delete(AggState::default())
}

fn key_type_of_width(width: u32) -> KeyType {
    if width == 4 {
        KeyType::Int4
    } else {
        KeyType::Int8
    }
}

/// An aggregate's state: the plain-Rust [`ProbeState`] and the probe request in flight, if
/// any. Probes are double-buffered: a full batch is started (its keys copied into the
/// service's staging) and the scan goes on gathering the next while the service probes it;
/// the next full batch first collects the previous one's result. Materializing runs one batch
/// at a time (its grow-and-resume protocol needs the result before the next). A state dropped
/// with a request in flight (an ERROR or a cancel deletes the aggregate's memory context)
/// gives the request up.
#[derive(Default)]
struct AggState {
    st: ProbeState,
    pending: Option<exec::Pending<exec::request::Probed>>,
    /// Keys per batch: [`BATCH`] in process mode; in service mode as many as one request's
    /// staging holds (fewer, larger requests; the service's kernels take any size). Set at the
    /// first row.
    batch: usize,
    /// The key count at which the next batch is handed on (a comparison per row, not a
    /// division).
    next_flush: usize,
}

/// Keys per batch for this process (see [`AggState::batch`]).
fn batch_keys() -> usize {
    match crate::runtime::request_staging_bytes() {
        Some(staging) => (staging as usize / 8).max(BATCH),
        None => BATCH,
    }
}

impl std::ops::Deref for AggState {
    type Target = ProbeState;
    fn deref(&self) -> &ProbeState {
        &self.st
    }
}

impl std::ops::DerefMut for AggState {
    fn deref_mut(&mut self) -> &mut ProbeState {
        &mut self.st
    }
}

/// Collects the result of the probe in flight, if any.
fn collect(st: &mut AggState) {
    if let Some(p) = st.pending.take() {
        let p = p.wait().map(exec::ProbeSum::from).unwrap_or_else(|e| report(e));
        st.st.add(p.matches, p.sum);
    }
}

/// Hands the gathered keys on: probes are started (after collecting the one in flight),
/// materializing runs now. The keys buffer is free again on return.
fn flush_batch(st: &mut AggState) {
    if st.keys.is_empty() {
        return;
    }
    let kt = key_type_of_width(st.key_width);
    if !st.result.is_empty() {
        let (name, result, keys) = (st.segment.as_str(), st.result.as_str(), st.keys.as_slice());
        let p = with_executor(|ex| {
            let (inner, _) = resolve(name, "read")?;
            let (out, _) = resolve(result, "write")?;
            exec::materialize(ex, &inner, &out, kt, keys, false)
        });
        st.st.absorb(p.matches, p.sum);
        return;
    }
    collect(st);
    let (name, keys) = (st.st.segment.as_str(), st.st.keys.as_slice());
    let started = with_executor(|ex| {
        let (inner, _) = resolve(name, "read")?;
        exec::probe_start(ex, &inner, kt, keys)
    });
    st.pending = Some(started);
    st.st.keys.clear();
}

/// Probes (or materializes) every key gathered and collects every result.
fn flush(st: &mut AggState) {
    flush_batch(st);
    collect(st);
}

/// Whether the aggregate's first `n` arguments are constants (the Aggref, not the transition
/// function's expression, says so: PostgreSQL passes aggregate arguments as placeholders).
///
/// # Safety
/// `fcinfo` is an aggregate transition function's call info.
unsafe fn names_are_constants(fcinfo: pg_sys::FunctionCallInfo, n: usize) -> bool {
    // SAFETY: AggGetAggref inspects fcinfo's context; the Aggref and its argument list belong to
    // the running plan.
    unsafe {
        let aggref = pg_sys::AggGetAggref(fcinfo);
        if aggref.is_null() {
            return false;
        }
        let args = pgrx::PgList::<pg_sys::TargetEntry>::from_pg((*aggref).args);
        (0..n).all(|i| args.get_ptr(i).is_some_and(|te| !(*te).expr.is_null() && (*(*te).expr).type_ == pg_sys::NodeTag::T_Const))
    }
}

/// The transition functions: `(state internal, segment text, [result text,] key int4|int8)`.
///
/// # Safety
/// `fcinfo` is the call info of a V1 function declared with these arguments.
unsafe fn transition(fcinfo: pg_sys::FunctionCallInfo, materialize: bool, key_width: u32) -> pg_sys::Datum {
    // SAFETY: forwarded contract: the arguments have the declared types.
    unsafe {
        let st: *mut AggState = if pgrx::fcinfo::pg_arg_is_null(fcinfo, 0) {
            crate::runtime::warm_up_gpu();
            new_state(fcinfo)
        } else {
            pgrx::fcinfo::pg_getarg_datum_raw(fcinfo, 0).cast_mut_ptr()
        };
        let st = &mut *st;
        let key_arg = if materialize { 3 } else { 2 };
        if !st.names_fixed {
            let name = |i: usize| -> &[u8] {
                if pgrx::fcinfo::pg_arg_is_null(fcinfo, i) {
                    report(UvmError::new(Code::NullValueNotAllowed, "GpuJoin segment names must not be NULL"));
                }
                let t = pg_sys::pg_detoast_datum_packed(pgrx::fcinfo::pg_getarg_datum_raw(fcinfo, i).cast_mut_ptr());
                std::slice::from_raw_parts(pgrx::varlena::vardata_any(t) as *const u8, pgrx::varlena::varsize_any_exhdr(t))
            };
            let result: &[u8] = if materialize { name(2) } else { b"" };
            st.bind(name(1), result, key_width).unwrap_or_else(|e| report(e));
            // Constant names cannot change between rows: later rows skip the check.
            st.names_fixed = names_are_constants(fcinfo, if materialize { 2 } else { 1 });
        }
        if !pgrx::fcinfo::pg_arg_is_null(fcinfo, key_arg) {
            let d = pgrx::fcinfo::pg_getarg_datum_raw(fcinfo, key_arg);
            st.keys.push(if key_width == 4 { i64::from(d.value() as i32) } else { d.value() as i64 });
            if st.batch == 0 {
                st.batch = batch_keys();
                st.next_flush = st.batch;
            }
            if st.keys.len() >= st.next_flush {
                // While CUDA starts in this process, keys keep gathering (up to defer_limit).
                if !(crate::gpu::warming() && st.keys.len() < defer_limit()) {
                    flush_batch(st);
                }
                st.next_flush = st.keys.len() + st.batch;
            }
        }
        pg_sys::Datum::from(st as *mut AggState)
    }
}

/// Declares a V1 C transition function (its `pg_finfo_` record and a guarded body).
macro_rules! transition_fn {
    ($name:ident, $finfo:ident, $materialize:expr, $width:expr) => {
        #[unsafe(no_mangle)]
        #[doc(hidden)]
        pub extern "C" fn $finfo() -> &'static pg_sys::Pg_finfo_record {
            const V1: pg_sys::Pg_finfo_record = pg_sys::Pg_finfo_record { api_version: 1 };
            &V1
        }

        #[unsafe(no_mangle)]
        #[pg_guard]
        pub unsafe extern "C-unwind" fn $name(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
            // SAFETY: PostgreSQL calls it as declared in the CREATE FUNCTION below.
            unsafe { transition(fcinfo, $materialize, $width) }
        }
    };
}

transition_fn!(uvm_gpujoin_probe_trans8, pg_finfo_uvm_gpujoin_probe_trans8, false, 8);
transition_fn!(uvm_gpujoin_probe_trans4, pg_finfo_uvm_gpujoin_probe_trans4, false, 4);
transition_fn!(uvm_gpujoin_materialize_trans8, pg_finfo_uvm_gpujoin_materialize_trans8, true, 8);
transition_fn!(uvm_gpujoin_materialize_trans4, pg_finfo_uvm_gpujoin_materialize_trans4, true, 4);

#[pg_extern(volatile, parallel_safe)]
fn gpujoin_probe_combine(mut a: Internal, mut b: Internal, fcinfo: pg_sys::FunctionCallInfo) -> Internal {
    // SAFETY: called as the aggregate's combine function; both states are ours or null.
    unsafe {
        if let Some(other) = b.get_mut::<AggState>() {
            flush(other);
            let other = other.st.clone();
            let st = state(&mut a, fcinfo);
            flush(st);
            st.merge(&other).unwrap_or_else(|e| report(e));
        }
    }
    a
}

// STRICT, as PostgreSQL requires of serialization functions: a NULL state (a worker that saw
// no rows) is passed on as NULL without a call.
#[pg_extern(volatile, parallel_safe, strict)]
fn gpujoin_probe_serial(mut internal: Internal) -> Vec<u8> {
    // SAFETY: the aggregate's state, or null.
    match unsafe { internal.get_mut::<AggState>() } {
        Some(st) => {
            flush(st);
            st.serialize()
        }
        None => ProbeState::default().serialize(),
    }
}

// STRICT, as PostgreSQL requires of deserialization functions (it passes a non-NULL dummy as
// the second argument).
#[pg_extern(volatile, parallel_safe, strict)]
fn gpujoin_probe_deserial(bytes: &[u8], _unused: Internal, fcinfo: pg_sys::FunctionCallInfo) -> Internal {
    let value = ProbeState::deserialize(bytes).unwrap_or_else(|e| report(e));
    let mut internal = Internal::default();
    // SAFETY: called as the aggregate's deserial function.
    unsafe { state(&mut internal, fcinfo) }.st = value;
    internal
}

#[pg_extern(volatile, parallel_safe)]
fn gpujoin_probe_final(mut internal: Internal) -> pgrx::composite_type!('static, "gpujoin_result") {
    let mut result = PgHeapTuple::<AllocatedByRust>::new_composite_type("uvm.gpujoin_result")
        .unwrap_or_else(|e| report(UvmError::new(Code::SystemError, format!("gpujoin_result type: {e}"))));
    // SAFETY: the aggregate's state, or null (no rows).
    let (matches, sum) = match unsafe { internal.get_mut::<AggState>() } {
        Some(st) => {
            flush(st);
            (st.matches, st.sum)
        }
        None => (0, 0),
    };
    result.set_by_name("matches", matches as i64).unwrap_or_else(|e| report(UvmError::new(Code::SystemError, e.to_string())));
    let sum = (matches > 0).then(|| AnyNumeric::from(sum));
    result.set_by_name("payload_sum", sum).unwrap_or_else(|e| report(UvmError::new(Code::SystemError, e.to_string())));
    result
}

/// Creates a result buffer for `uvm.gpujoin_materialize`: a segment named `segment` with room
/// for `initial_pairs` pairs, growing on demand up to `max_pairs` (default: as far as
/// `pg_uvm_share.max_segment_size` allows). Returns the pairs it holds now.
#[pg_extern(volatile, parallel_unsafe)]
fn gpujoin_pairs_create(
    segment: &str,
    initial_pairs: default!(i64, 65536),
    max_pairs: default!(Option<i64>, "NULL"),
    tier: default!(&str, "'auto'"),
) -> i64 {
    let pref = TierPref::parse(tier).unwrap_or_else(|e| report(e));
    if initial_pairs < 0 {
        report(UvmError::new(Code::InvalidParameterValue, format!("initial_pairs must not be negative: {initial_pairs}")));
    }
    if let Some(m) = max_pairs.filter(|&m| m < initial_pairs) {
        report(UvmError::new(
            Code::InvalidParameterValue,
            format!("max_pairs {m} is smaller than initial_pairs {initial_pairs}"),
        ));
    }
    let size = pairs::bytes_for(initial_pairs as u64).min(i64::MAX as u64) as i64;
    let max_size = max_pairs.map(|m| pairs::bytes_for(m as u64).min(i64::MAX as u64) as i64);
    with_executor(|ex| {
        crate::registry::check_not_reserved(segment)?;
        exec::create(ex, segment, size, max_size, pref, current_user(), now())?;
        let (seg, info) = resolve(segment, "write")?;
        exec::pairs_reset(ex, &seg)?;
        Ok(pairs::capacity(info.size) as i64)
    })
}

/// Pairs read from the buffer per segment access while `uvm.gpujoin_pairs` streams them.
const READ_BLOCK: usize = 1 << 16;

/// Streams a complete result buffer's pairs, a block per segment pin.
struct PairsIter {
    segment: String,
    total: u64,
    at: u64,
    block: Vec<[i64; 2]>,
    pos: usize,
}

impl Iterator for PairsIter {
    type Item = (i64, i64);

    fn next(&mut self) -> Option<(i64, i64)> {
        if self.pos == self.block.len() {
            if self.at >= self.total {
                return None;
            }
            let n = (self.total - self.at).min(READ_BLOCK as u64) as usize;
            self.block.resize(n, [0, 0]);
            let name = self.segment.as_str();
            let (at, block) = (self.at, &mut self.block);
            with_executor(|ex| {
                let (seg, _) = resolve(name, "read")?;
                // SAFETY: viewing our own [i64; 2] buffer as bytes.
                let raw = unsafe {
                    std::slice::from_raw_parts_mut(block.as_mut_ptr() as *mut u8, block.len() * pairs::PAIR_BYTES as usize)
                };
                let offset = at.saturating_mul(pairs::PAIR_BYTES).saturating_add(pairs::HEADER_BYTES).min(i64::MAX as u64);
                exec::read(ex, &seg, offset as i64, raw)
            });
            self.at += n as u64;
            self.pos = 0;
        }
        let [k, p] = self.block[self.pos];
        self.pos += 1;
        Some((k, p))
    }
}

/// The (key, payload) pairs of a result buffer that `uvm.gpujoin_materialize` filled, in no
/// particular order.
#[pg_extern(volatile, parallel_safe)]
fn gpujoin_pairs(segment: &str) -> TableIterator<'static, (name!(key, i64), name!(payload, i64))> {
    let total = with_executor(|ex| {
        let (seg, info) = resolve(segment, "read")?;
        if info.size < pairs::HEADER_BYTES {
            return pairs::parse_header(segment, &[], info.size).map(|_| 0);
        }
        let mut raw = [0u8; pairs::HEADER_BYTES as usize];
        exec::read(ex, &seg, 0, &mut raw)?;
        pairs::check_complete(segment, info.size, &pairs::parse_header(segment, &raw, info.size)?)
    });
    TableIterator::new(PairsIter { segment: segment.to_string(), total, at: 0, block: Vec::new(), pos: 0 })
}

pgrx::extension_sql!(
    r#"
CREATE FUNCTION gpujoin_probe_trans(internal, text, bigint) RETURNS internal
    LANGUAGE c PARALLEL SAFE AS 'MODULE_PATHNAME', 'uvm_gpujoin_probe_trans8';
CREATE FUNCTION gpujoin_probe_trans(internal, text, integer) RETURNS internal
    LANGUAGE c PARALLEL SAFE AS 'MODULE_PATHNAME', 'uvm_gpujoin_probe_trans4';
CREATE FUNCTION gpujoin_materialize_trans(internal, text, text, bigint) RETURNS internal
    LANGUAGE c PARALLEL SAFE AS 'MODULE_PATHNAME', 'uvm_gpujoin_materialize_trans8';
CREATE FUNCTION gpujoin_materialize_trans(internal, text, text, integer) RETURNS internal
    LANGUAGE c PARALLEL SAFE AS 'MODULE_PATHNAME', 'uvm_gpujoin_materialize_trans4';
CREATE AGGREGATE gpujoin_probe(segment text, key bigint) (
    SFUNC = gpujoin_probe_trans, STYPE = internal,
    FINALFUNC = gpujoin_probe_final, FINALFUNC_MODIFY = READ_WRITE,
    COMBINEFUNC = gpujoin_probe_combine, SERIALFUNC = gpujoin_probe_serial, DESERIALFUNC = gpujoin_probe_deserial,
    PARALLEL = SAFE
);
CREATE AGGREGATE gpujoin_probe(segment text, key integer) (
    SFUNC = gpujoin_probe_trans, STYPE = internal,
    FINALFUNC = gpujoin_probe_final, FINALFUNC_MODIFY = READ_WRITE,
    COMBINEFUNC = gpujoin_probe_combine, SERIALFUNC = gpujoin_probe_serial, DESERIALFUNC = gpujoin_probe_deserial,
    PARALLEL = SAFE
);
CREATE AGGREGATE gpujoin_materialize(segment text, result text, key bigint) (
    SFUNC = gpujoin_materialize_trans, STYPE = internal,
    FINALFUNC = gpujoin_probe_final, FINALFUNC_MODIFY = READ_WRITE,
    COMBINEFUNC = gpujoin_probe_combine, SERIALFUNC = gpujoin_probe_serial, DESERIALFUNC = gpujoin_probe_deserial,
    PARALLEL = SAFE
);
CREATE AGGREGATE gpujoin_materialize(segment text, result text, key integer) (
    SFUNC = gpujoin_materialize_trans, STYPE = internal,
    FINALFUNC = gpujoin_probe_final, FINALFUNC_MODIFY = READ_WRITE,
    COMBINEFUNC = gpujoin_probe_combine, SERIALFUNC = gpujoin_probe_serial, DESERIALFUNC = gpujoin_probe_deserial,
    PARALLEL = SAFE
);
REVOKE EXECUTE ON FUNCTION gpujoin_build(text, text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION gpujoin_pairs_create(text, bigint, bigint, text) FROM PUBLIC;
"#,
    name = "gpujoin_aggregates",
    requires = [
        "gpujoin_result_type",
        gpujoin_probe_combine,
        gpujoin_probe_serial,
        gpujoin_probe_deserial,
        gpujoin_probe_final,
        gpujoin_build,
        gpujoin_pairs_create
    ]
);

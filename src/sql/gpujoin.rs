//! The GpuJoin SQL surface:
//!
//! - `uvm.gpujoin_build` puts an inner hash table into a segment (built by a kernel under the
//!   CUDA provider, on the CPU under the host provider);
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

use super::{authorize, current_user, now, report, with_segments};
use crate::error::{Code, Result, UvmError};
use crate::gpujoin::pairs::{self, CpuAppender, PairsHeader};
use crate::gpujoin::probe::{ProbeState, BATCH};
use crate::gpujoin::table::{self, KeyType, Table};
use crate::provider::ProviderKind;
use crate::registry::TierPref;

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

/// Runs `query` and collects its (key, payload) rows: key int4 or int8 (NULL allowed), payload
/// int4 or int8 (NULL counts as 0 in sums).
fn collect_rows(query: &str) -> Result<(KeyType, Vec<(Option<i64>, i64)>)> {
    let spi = |e: pgrx::spi::Error| UvmError::new(Code::InvalidParameterValue, format!("gpujoin_build query: {e}"));
    Spi::connect(|client| {
        let table = client.select(query, None, &[]).map_err(spi)?;
        if table.columns().map_err(spi)? < 2 {
            return Err(UvmError::new(Code::DatatypeMismatch, "gpujoin_build needs a query of two columns: key, payload"));
        }
        let key_oid = table.column_type_oid(1).map_err(spi)?.value();
        let payload_oid = table.column_type_oid(2).map_err(spi)?.value();
        let kt = key_type_of(key_oid)
            .ok_or_else(|| UvmError::new(Code::DatatypeMismatch, "gpujoin_build keys must be integer or bigint"))?;
        let pt = key_type_of(payload_oid)
            .ok_or_else(|| UvmError::new(Code::DatatypeMismatch, "gpujoin_build payloads must be integer or bigint"))?;
        let get = |row: &pgrx::spi::SpiHeapTupleData, i: usize, t: KeyType| -> Result<Option<i64>> {
            Ok(match t {
                KeyType::Int4 => row.get::<i32>(i).map_err(spi)?.map(i64::from),
                KeyType::Int8 => row.get::<i64>(i).map_err(spi)?,
            })
        };
        let mut rows = Vec::with_capacity(table.len());
        for row in table {
            rows.push((get(&row, 1, kt)?, get(&row, 2, pt)?.unwrap_or(0)));
        }
        Ok((kt, rows))
    })
}

/// Builds the inner hash table of `query`'s (key, payload) rows into a new segment named
/// `segment` (tier as for `create_segment`). Returns the rows read, NULL keys included.
#[pg_extern(volatile, parallel_unsafe)]
fn gpujoin_build(segment: &str, query: &str, tier: default!(&str, "'auto'")) -> i64 {
    let pref = TierPref::parse(tier).unwrap_or_else(|e| report(e));
    crate::registry::validate_name(segment).unwrap_or_else(|e| report(e));
    let (kt, rows) = collect_rows(query).unwrap_or_else(|e| report(e));
    let stored = rows.iter().filter(|r| r.0.is_some()).count() as u64;
    let bytes = table::table_bytes(stored);
    with_segments(|s| {
        let gpu = s.provider().kind() == ProviderKind::Cuda;
        s.create(segment, bytes as i64, Some(bytes as i64), pref, current_user(), now())?;
        let mut pin = s.pin(segment, |o| authorize(o, segment, "write"))?;
        if gpu {
            // On the GPU: header from the CPU, slots zeroed and filled by kernels.
            let header = table::header_for(kt, stored, rows.len() as u64 - stored, 0);
            pin.write_from(0, &header.as_bytes())?;
            let slots = pin.addr(table::HEADER_BYTES as i64, (header.slot_count * table::SLOT_BYTES) as i64)?;
            let (keys, payloads): (Vec<i64>, Vec<i64>) = rows.iter().filter_map(|(k, p)| k.map(|k| (k, *p))).unzip();
            crate::gpu::gpu()?.with_kernels(|k| {
                k.zero(slots, header.slot_count * table::SLOT_BYTES / 8)?;
                k.join_build(slots, header.slot_count - 1, header.seed, &keys, &payloads)
            })?;
        } else {
            let mut buf = vec![0u64; (bytes as usize).div_ceil(8)];
            // SAFETY: viewing our own u64 buffer as bytes.
            let raw = unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr() as *mut u8, bytes as usize) };
            table::build(raw, kt, &rows, 0)?;
            pin.write_from(0, raw)?;
        }
        Ok(rows.len() as i64)
    })
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
unsafe fn state<'a>(state: &'a mut Internal, fcinfo: pg_sys::FunctionCallInfo) -> &'a mut ProbeState {
    // SAFETY: forwarded contract.
    unsafe {
        if !state.initialized() {
            *state = Internal::from(Some(pg_sys::Datum::from(new_state(fcinfo))));
        }
        state.get_mut::<ProbeState>().expect("initialized above")
    }
}

/// A new state in the aggregate memory context.
///
/// # Safety
/// `fcinfo` must be an aggregate support function's call info.
unsafe fn new_state(fcinfo: pg_sys::FunctionCallInfo) -> *mut ProbeState {
    let mut ctx: pg_sys::MemoryContext = std::ptr::null_mut();
    // SAFETY: forwarded contract; AggCheckCallContext only inspects fcinfo.
    if unsafe { pg_sys::AggCheckCallContext(fcinfo, &mut ctx) } == 0 {
        report(UvmError::new(Code::FeatureNotSupported, "GpuJoin support functions are for the aggregates only"));
    }
    PgMemoryContexts::For(ctx).leak_and_drop_on_delete(ProbeState::default())
}

fn key_type_of_width(width: u32) -> KeyType {
    if width == 4 {
        KeyType::Int4
    } else {
        KeyType::Int8
    }
}

/// Probes (or materializes) the pending keys against the segment's table.
fn flush(st: &mut ProbeState) {
    if st.keys.is_empty() {
        return;
    }
    let kt = key_type_of_width(st.key_width);
    let (name, result, keys) = (st.segment.as_str(), st.result.as_str(), st.keys.as_slice());
    let (m, sum) = with_segments(|s| {
        let gpu = s.provider().kind() == ProviderKind::Cuda;
        if !result.is_empty() {
            let authz = |o: u32, seg: &str, action: &str| authorize(o, seg, action);
            if gpu {
                return crate::gpu::gpu()?.with_kernels(|k| {
                    let mut a = crate::gpu::KernelAppender::new(k, keys);
                    pairs::append_batch(s, name, result, kt, &authz, &mut a)?;
                    Ok((a.matches, a.sum))
                });
            }
            let mut a = CpuAppender::new(keys);
            pairs::append_batch(s, name, result, kt, &authz, &mut a)?;
            return Ok((a.matches, a.sum));
        }
        let pin = s.pin(name, |o| authorize(o, name, "read"))?;
        let (h, slots) = table::locate(&pin, kt)?;
        if gpu {
            // On the GPU: kernels over the table where it lies (device or host tier).
            return crate::gpu::gpu()?.with_kernels(|k| k.join_probe(slots, h.slot_count - 1, h.seed, keys));
        }
        Ok(Table::view(pin.bytes(0, pin.info().size as i64)?)?.probe(keys))
    });
    st.absorb(m, sum);
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
        let st: *mut ProbeState = if pgrx::fcinfo::pg_arg_is_null(fcinfo, 0) {
            super::warm_up_gpu();
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
            if st.keys.len() % BATCH == 0 && !(crate::gpu::warming() && st.keys.len() < defer_limit()) {
                flush(st);
            }
        }
        pg_sys::Datum::from(st as *mut ProbeState)
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
        if let Some(other) = b.get_mut::<ProbeState>() {
            flush(other);
            let other = other.clone();
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
    match unsafe { internal.get_mut::<ProbeState>() } {
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
    *unsafe { state(&mut internal, fcinfo) } = value;
    internal
}

#[pg_extern(volatile, parallel_safe)]
fn gpujoin_probe_final(mut internal: Internal) -> pgrx::composite_type!('static, "gpujoin_result") {
    let mut result = PgHeapTuple::<AllocatedByRust>::new_composite_type("uvm.gpujoin_result")
        .unwrap_or_else(|e| report(UvmError::new(Code::SystemError, format!("gpujoin_result type: {e}"))));
    // SAFETY: the aggregate's state, or null (no rows).
    let (matches, sum) = match unsafe { internal.get_mut::<ProbeState>() } {
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
    with_segments(|s| {
        s.create(segment, size, max_size, pref, current_user(), now())?;
        let mut pin = s.pin(segment, |o| authorize(o, segment, "write"))?;
        pin.write_from(0, &PairsHeader::new().as_bytes())?;
        Ok(pairs::capacity(pin.info().size) as i64)
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
            with_segments(|s| {
                let pin = s.pin(name, |o| authorize(o, name, "read"))?;
                pairs::read_pairs(&pin, at, block)
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
    let total = with_segments(|s| {
        let pin = s.pin(segment, |o| authorize(o, segment, "read"))?;
        pairs::complete_pairs(&pin)
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

//! The GpuJoin SQL surface: `uvm.gpujoin_build` puts an inner hash table into a segment (built
//! by a kernel under the CUDA provider, on the CPU under the host provider); the aggregate `uvm.gpujoin_probe(segment, key)` probes it from every
//! parallel worker and returns `(matches, payload_sum)`, as `count(*), sum(payload)` of the
//! equivalent join would.
//!
//! The aggregate's support functions are plain `#[pg_extern]`s tied together by `CREATE
//! AGGREGATE` in SQL (pgrx 0.18's `#[pg_aggregate]` gets the `internal` deserial signature
//! wrong). Its state lives in the aggregate memory context; keys are probed a batch at a time,
//! by one kernel launch per batch under the CUDA provider.

use pgrx::datum::Internal;
use pgrx::prelude::*;
use pgrx::{AllocatedByRust, AnyNumeric, PgMemoryContexts};

use super::{authorize, current_user, now, report, with_segments};
use crate::error::{Code, Result, UvmError};
use crate::gpujoin::probe::ProbeState;
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
        let kt = key_type_of(key_oid).ok_or_else(|| {
            UvmError::new(Code::DatatypeMismatch, "gpujoin_build keys must be integer or bigint")
        })?;
        let pt = key_type_of(payload_oid).ok_or_else(|| {
            UvmError::new(Code::DatatypeMismatch, "gpujoin_build payloads must be integer or bigint")
        })?;
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

/// The state behind an `internal` aggregate argument, created in the aggregate memory context.
///
/// # Safety
/// `fcinfo` must be the aggregate support function's call info; `state` must be null or a
/// pointer made by this function.
unsafe fn state<'a>(state: &'a mut Internal, fcinfo: pg_sys::FunctionCallInfo) -> &'a mut ProbeState {
    // SAFETY: forwarded contract.
    unsafe {
        if !state.initialized() {
            let mut ctx: pg_sys::MemoryContext = std::ptr::null_mut();
            if pg_sys::AggCheckCallContext(fcinfo, &mut ctx) == 0 {
                report(UvmError::new(Code::FeatureNotSupported, "gpujoin_probe support functions are for the aggregate only"));
            }
            let p = PgMemoryContexts::For(ctx).leak_and_drop_on_delete(ProbeState::default());
            *state = Internal::from(Some(pg_sys::Datum::from(p)));
        }
        state.get_mut::<ProbeState>().expect("initialized above")
    }
}

/// Probes the pending keys against the segment's table (checking that the probe keys' type is
/// the table's).
fn flush(st: &mut ProbeState) {
    if st.keys.is_empty() {
        return;
    }
    let key_type = match st.key_width {
        4 => Some(KeyType::Int4),
        8 => Some(KeyType::Int8),
        _ => None,
    };
    let name = st.segment.clone();
    let (m, sum) = with_segments(|s| {
        let gpu = s.provider().kind() == ProviderKind::Cuda;
        let pin = s.pin(&name, |o| authorize(o, &name, "read"))?;
        let size = pin.info.size as i64;
        let check_type = |t: KeyType| -> Result<()> {
            match key_type {
                Some(kt) if kt != t => Err(UvmError::new(
                    Code::DatatypeMismatch,
                    format!("segment \"{name}\" holds {} keys, not {}", t.sql_name(), kt.sql_name()),
                )),
                _ => Ok(()),
            }
        };
        if gpu {
            // On the GPU: one kernel per batch over the table where it lies (device or host tier).
            let mut raw = [0u8; table::HEADER_BYTES as usize];
            pin.read_into(0, &mut raw)?;
            let h = table::parse_header(&raw, size as u64)?;
            check_type(h.key_type())?;
            let slots = pin.addr(table::HEADER_BYTES as i64, (h.slot_count * table::SLOT_BYTES) as i64)?;
            let keys: Vec<i64> = st.keys.iter().flatten().copied().collect();
            let (m, sum) = crate::gpu::gpu()?.with_kernels(|k| k.join_probe(slots, h.slot_count - 1, h.seed, &keys))?;
            return Ok((m, sum as i128));
        }
        let t = Table::view(pin.bytes(0, size)?)?;
        check_type(t.key_type())?;
        Ok(t.probe(&st.keys))
    });
    st.absorb(m, sum);
}

fn trans(mut internal: Internal, segment: Option<&str>, key: Option<i64>, kt: KeyType, fcinfo: pg_sys::FunctionCallInfo) -> Internal {
    // SAFETY: called as the aggregate's transition function.
    let st = unsafe { state(&mut internal, fcinfo) };
    let segment = segment.unwrap_or_else(|| report(UvmError::new(Code::NullValueNotAllowed, "gpujoin_probe segment must not be NULL")));
    if st.push(segment, key, kt as u32).unwrap_or_else(|e| report(e)) {
        flush(st);
    }
    internal
}

#[pg_extern(volatile, parallel_safe)]
fn gpujoin_probe_trans(state: Internal, segment: Option<&str>, key: Option<i64>, fcinfo: pg_sys::FunctionCallInfo) -> Internal {
    trans(state, segment, key, KeyType::Int8, fcinfo)
}

#[pg_extern(volatile, parallel_safe)]
fn gpujoin_probe_trans4(state: Internal, segment: Option<&str>, key: Option<i32>, fcinfo: pg_sys::FunctionCallInfo) -> Internal {
    trans(state, segment, key.map(i64::from), KeyType::Int4, fcinfo)
}

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

#[pg_extern(volatile, parallel_safe)]
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

#[pg_extern(volatile, parallel_safe)]
fn gpujoin_probe_deserial(bytes: &[u8], _unused: Internal, fcinfo: pg_sys::FunctionCallInfo) -> Internal {
    let value = ProbeState::deserialize(bytes).unwrap_or_else(|e| report(e));
    let mut internal = Internal::default();
    // SAFETY: called as the aggregate's deserial function.
    *unsafe { state(&mut internal, fcinfo) } = value;
    internal
}

#[pg_extern(volatile, parallel_safe)]
fn gpujoin_probe_final(mut internal: Internal) -> pgrx::composite_type!('static, "gpujoin_result") {
    let mut result = PgHeapTuple::<AllocatedByRust>::new_composite_type("uvm.gpujoin_result").unwrap_or_else(|e| {
        report(UvmError::new(Code::SystemError, format!("gpujoin_result type: {e}")))
    });
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

pgrx::extension_sql!(
    r#"
CREATE AGGREGATE gpujoin_probe(segment text, key bigint) (
    SFUNC = gpujoin_probe_trans,
    STYPE = internal,
    FINALFUNC = gpujoin_probe_final,
    FINALFUNC_MODIFY = READ_WRITE,
    COMBINEFUNC = gpujoin_probe_combine,
    SERIALFUNC = gpujoin_probe_serial,
    DESERIALFUNC = gpujoin_probe_deserial,
    PARALLEL = SAFE
);
CREATE AGGREGATE gpujoin_probe(segment text, key integer) (
    SFUNC = gpujoin_probe_trans4,
    STYPE = internal,
    FINALFUNC = gpujoin_probe_final,
    FINALFUNC_MODIFY = READ_WRITE,
    COMBINEFUNC = gpujoin_probe_combine,
    SERIALFUNC = gpujoin_probe_serial,
    DESERIALFUNC = gpujoin_probe_deserial,
    PARALLEL = SAFE
);
REVOKE EXECUTE ON FUNCTION gpujoin_build(text, text, text) FROM PUBLIC;
"#,
    name = "gpujoin_probe_aggregate",
    requires = [
        gpujoin_probe_trans,
        gpujoin_probe_trans4,
        gpujoin_probe_combine,
        gpujoin_probe_serial,
        gpujoin_probe_deserial,
        gpujoin_probe_final,
        gpujoin_build
    ]
);

//! Column caches (issue 26; the logic is `crate::caches`): build, drop, list, and the first
//! reader. Executable by every role: each checks `SELECT` on the table, the privilege a cache
//! stands in for.

use pgrx::iter::TableIterator;
use pgrx::prelude::*;

use crate::error::{Code, UvmError};
use crate::runtime::report;

/// Builds the column cache of `rel` (its `columns`, or every column of a cached type when
/// NULL), replacing the cache it has; returns the rows cached. (SQL: `rel` is a `regclass`,
/// binary-compatible with the `oid` the wrapper reads.)
#[pg_extern(sql = r#"
CREATE FUNCTION cache_table(rel regclass, columns text[] DEFAULT NULL) RETURNS bigint
VOLATILE PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'cache_table_wrapper';
"#)]
fn cache_table(rel: Option<pg_sys::Oid>, columns: default!(Option<Vec<String>>, "NULL")) -> i64 {
    // Not STRICT, because columns may be NULL; the table may not.
    let Some(rel) = rel else { report(UvmError::new(Code::NullValueNotAllowed, "the table must not be NULL")) };
    crate::caches::build(rel, columns).unwrap_or_else(|e| report(e))
}

/// Drops the column cache of `rel`; false if it has none.
#[pg_extern(sql = r#"
CREATE FUNCTION cache_drop(rel regclass) RETURNS boolean
STRICT VOLATILE PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'cache_drop_wrapper';
"#)]
fn cache_drop(rel: pg_sys::Oid) -> bool {
    crate::caches::drop_cache(rel).unwrap_or_else(|e| report(e))
}

/// Rows, non-NULL values and sum (integer and numeric columns) of `column` of `rel`, read from
/// its cache where the cache is current for this query's snapshot and from the table otherwise;
/// `source` says which.
#[pg_extern(sql = r#"
CREATE FUNCTION cache_fold(rel regclass, "column" text)
RETURNS TABLE (source text, rows bigint, non_null bigint, sum numeric)
STRICT VOLATILE PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'cache_fold_wrapper';
"#)]
fn cache_fold(
    rel: pg_sys::Oid,
    column: &str,
) -> TableIterator<'static, (name!(source, String), name!(rows, i64), name!(non_null, i64), name!(sum, Option<AnyNumeric>))> {
    let f = crate::caches::fold(rel, column).unwrap_or_else(|e| report(e));
    let sum = f.sum.map(|s| {
        AnyNumeric::try_from(s.as_str()).unwrap_or_else(|_| report(UvmError::new(Code::SystemError, format!("bad sum {s}"))))
    });
    TableIterator::once((f.source.to_string(), f.rows, f.non_null, sum))
}

/// The rows of `uvm.caches`. PARALLEL UNSAFE: listing also removes dropped tables' caches.
#[allow(clippy::type_complexity)]
#[pg_extern(volatile, parallel_unsafe)]
fn caches_internal() -> TableIterator<
    'static,
    (
        name!(relation, pg_sys::Oid),
        name!(state, String),
        name!(columns, Option<Vec<String>>),
        name!(rows, i64),
        name!(appended_rows, i64),
        name!(append_capacity, i64),
        name!(device_bytes, i64),
        name!(host_bytes, i64),
        name!(build_workers, i32),
        name!(built_at, Option<TimestampWithTimeZone>),
        name!(last_used, Option<TimestampWithTimeZone>),
        name!(segment, String),
    ),
> {
    let ts = |t: Option<i64>| t.and_then(|t| TimestampWithTimeZone::try_from(t).ok());
    let rows: Vec<_> = crate::caches::list()
        .unwrap_or_else(|e| report(e))
        .into_iter()
        .map(|c| {
            (
                pg_sys::Oid::from(c.relation),
                c.state.to_string(),
                c.columns,
                c.rows,
                c.appended_rows,
                c.append_capacity,
                c.device_bytes,
                c.host_bytes,
                c.build_workers,
                ts(c.built_at),
                ts(c.last_used),
                c.segment,
            )
        })
        .collect();
    TableIterator::new(rows)
}

pgrx::extension_sql!(
    r#"
CREATE VIEW caches AS
SELECT c.relation::regclass AS relation, c.state, c.columns, c.rows, c.appended_rows, c.append_capacity,
       c.device_bytes, c.host_bytes, c.build_workers, c.built_at, c.last_used, c.segment
  FROM caches_internal() c;
COMMENT ON VIEW caches IS 'The column caches of this database (uvm.cache_table): table, cached columns, rows built, rows inserts appended since (of the append tail''s capacity), bytes per tier, parallel workers that built it beside the builder, state (ready: read where current; stale: a write changed the table since the build, readers use the heap until uvm.cache_table rebuilds it; building; dropping), when built and last read, its segment.';
GRANT SELECT ON caches TO PUBLIC;
"#,
    name = "cache_views",
    requires = [caches_internal]
);

// The trigger function of the append trigger `cache_table` gives a cached table
// (`crate::caches::append`): a V1 C function of its own (`uvm_cache_append`), since it reads
// the trigger's transition table.
pgrx::extension_sql!(
    r#"
CREATE FUNCTION cache_append() RETURNS trigger
VOLATILE PARALLEL UNSAFE LANGUAGE c AS 'MODULE_PATHNAME', 'uvm_cache_append';
COMMENT ON FUNCTION cache_append() IS 'The function of the statement-level AFTER INSERT trigger pg_uvm_share_cache_append that uvm.cache_table gives a cached table: appends each statement''s new rows to the table''s column cache, so that INSERT and COPY keep it current.';
"#,
    name = "cache_append"
);

//! The statistics views (`uvm.stat_segments`, `uvm.stat_service`, `uvm.stat_gpujoin`,
//! `uvm.stat_gpujoin_declined`) and `uvm.stat_reset()`: the cumulative counters of
//! `crate::stats`, read from shared memory as they are (the registry's and the GPU service
//! channel's blocks), in the style of PostgreSQL's `pg_stat_*` views; and `uvm.progress`, the
//! long operations running now, in the style of `pg_stat_progress_*`.

use pgrx::iter::TableIterator;
use pgrx::prelude::*;

use crate::exec::request::Op;
use crate::runtime::report;
use crate::stats::SegmentStats;

/// Microseconds between the Unix epoch and PostgreSQL's (2000-01-01).
const PG_EPOCH_US: i64 = 946_684_800_000_000;

/// A Unix time in microseconds as `timestamptz` (`None` for 0: never).
fn unix_us_to_timestamptz(us: i64) -> Option<TimestampWithTimeZone> {
    (us > 0).then(|| TimestampWithTimeZone::try_from(us - PG_EPOCH_US).ok()).flatten()
}

/// An operation's name as the views show it: `Materialize` → `materialize`, `BuildInsert` →
/// `build_insert` (its number where it has none).
fn op_name(op: u32) -> String {
    let Some(op) = Op::from_repr(op) else { return format!("op {op}") };
    let mut out = String::new();
    for (i, ch) in format!("{op:?}").chars().enumerate() {
        if ch.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(ch.to_ascii_lowercase());
    }
    out
}

/// Rows of the `uvm.stat_segments` view.
#[allow(clippy::type_complexity)]
#[pg_extern(volatile, parallel_safe)]
fn stat_segments_internal() -> TableIterator<
    'static,
    (
        name!(name, String),
        name!(id, i64),
        name!(pins, i64),
        name!(bytes_read, i64),
        name!(bytes_written, i64),
        name!(migrations, i64),
        name!(bytes_migrated, i64),
        name!(last_used, Option<TimestampWithTimeZone>),
    ),
> {
    let reg = crate::registry::shmem::shared().unwrap_or_else(|e| report(e));
    let rows: Vec<_> = reg
        .segments()
        .into_iter()
        .map(|i| {
            let s: SegmentStats = reg.segment_stats(i.slot);
            let n = |v: u64| v.min(i64::MAX as u64) as i64;
            (
                i.name,
                i.id as i64,
                n(s.pins),
                n(s.bytes_read),
                n(s.bytes_written),
                n(s.migrations),
                n(s.bytes_migrated),
                unix_us_to_timestamptz(s.last_used_us),
            )
        })
        .collect();
    TableIterator::new(rows)
}

/// Rows of the `uvm.stat_service` view: per GPU (NULL: the service's main thread) and
/// operation, what the GPU service completed.
#[allow(clippy::type_complexity)]
#[pg_extern(volatile, parallel_safe)]
fn stat_service_internal() -> TableIterator<
    'static,
    (
        name!(gpu, Option<i32>),
        name!(operation, String),
        name!(requests, i64),
        name!(errors, i64),
        name!(abandoned, i64),
        name!(queue_ms, f64),
        name!(run_ms, f64),
    ),
> {
    let ch = crate::service::shmem::channel().unwrap_or_else(|e| report(e));
    let n = |v: u64| v.min(i64::MAX as u64) as i64;
    let rows: Vec<_> = ch
        .op_stats()
        .into_iter()
        .map(|(gpu, op, s)| {
            (
                gpu.map(|g| g as i32),
                op_name(op),
                n(s.requests),
                n(s.errors),
                n(s.abandoned),
                s.wait_ns as f64 / 1e6,
                s.run_ns as f64 / 1e6,
            )
        })
        .collect();
    TableIterator::new(rows)
}

/// The one row of the `uvm.stat_gpujoin` view.
#[allow(clippy::type_complexity)]
#[pg_extern(volatile, parallel_safe)]
fn stat_gpujoin_internal() -> TableIterator<
    'static,
    (
        name!(queries, i64),
        name!(rows, i64),
        name!(batches, i64),
        name!(gpu_ms, f64),
        name!(inner_rows, i64),
        name!(paths_offered, i64),
        name!(plans, i64),
        name!(paths_declined, i64),
    ),
> {
    let reg = crate::registry::shmem::shared().unwrap_or_else(|e| report(e));
    let s = reg.node_counters().snapshot();
    let n = |v: u64| v.min(i64::MAX as u64) as i64;
    TableIterator::once((
        n(s.queries),
        n(s.rows),
        n(s.batches),
        s.gpu_ns as f64 / 1e6,
        n(s.inner_rows),
        n(s.paths_offered),
        n(s.plans),
        n(s.declined.iter().map(|(_, c)| c).sum()),
    ))
}

/// Rows of the `uvm.stat_gpujoin_declined` view: the join paths the node declined, per reason
/// (every reason, 0 included).
#[pg_extern(volatile, parallel_safe)]
fn stat_gpujoin_declined_internal() -> TableIterator<'static, (name!(reason, String), name!(paths, i64))> {
    let reg = crate::registry::shmem::shared().unwrap_or_else(|e| report(e));
    let rows: Vec<_> = reg
        .node_counters()
        .snapshot()
        .declined
        .into_iter()
        .map(|(d, c)| (d.name().to_string(), c.min(i64::MAX as u64) as i64))
        .collect();
    TableIterator::new(rows)
}

/// Rows of the `uvm.progress` view: the long operations running now.
#[allow(clippy::type_complexity)]
#[pg_extern(volatile, parallel_safe)]
fn progress_internal() -> TableIterator<
    'static,
    (
        name!(pid, i32),
        name!(kind, String),
        name!(phase, String),
        name!(segment, Option<String>),
        name!(done, i64),
        name!(total, i64),
        name!(unit, String),
        name!(started, Option<TimestampWithTimeZone>),
    ),
> {
    let reg = crate::registry::shmem::shared().unwrap_or_else(|e| report(e));
    let segs = reg.segments();
    let n = |v: u64| v.min(i64::MAX as u64) as i64;
    let rows: Vec<_> = reg
        .progress()
        .into_iter()
        .map(|p| {
            let segment = segs.iter().find(|s| s.id == p.segment_id && p.segment_id != 0).map(|s| s.name.clone());
            (
                p.pid,
                p.kind.name().to_string(),
                p.phase.name().to_string(),
                segment,
                n(p.done),
                n(p.total),
                p.kind.unit(p.phase).to_string(),
                unix_us_to_timestamptz(p.started_us),
            )
        })
        .collect();
    TableIterator::new(rows)
}

/// Zeroes every cumulative counter of the extension (segments, the GPU service, the GpuJoin
/// node), as `pg_stat_reset()` does PostgreSQL's.
#[pg_extern(volatile, parallel_unsafe)]
fn stat_reset() {
    crate::registry::shmem::shared().unwrap_or_else(|e| report(e)).reset_stats();
    crate::service::shmem::channel().unwrap_or_else(|e| report(e)).reset_stats();
}

pgrx::extension_sql!(
    r#"
CREATE VIEW stat_segments AS
SELECT s.name, s.id, s.pins, s.bytes_read, s.bytes_written, s.migrations, s.bytes_migrated, s.last_used
  FROM stat_segments_internal() s;
COMMENT ON VIEW stat_segments IS 'Cumulative counters per segment since its creation or uvm.stat_reset(): pins, bytes read (read_segment, checksum_segment) and written (write_segment, fill_segment), migrations and bytes moved, last use.';

CREATE VIEW stat_service AS
SELECT s.gpu, s.operation, s.requests, s.errors, s.abandoned, s.queue_ms, s.run_ms
  FROM stat_service_internal() s;
COMMENT ON VIEW stat_service IS 'Cumulative counters of the GPU service per GPU (NULL: its main thread) and operation: requests completed, errors, requests their clients abandoned, milliseconds queued and run.';

CREATE VIEW stat_gpujoin AS
SELECT s.queries, s.rows, s.batches, s.gpu_ms, s.inner_rows, s.paths_offered, s.plans, s.paths_declined
  FROM stat_gpujoin_internal() s;
COMMENT ON VIEW stat_gpujoin IS 'Cumulative counters of the GpuJoin plan node: queries, rows returned, batches, GPU milliseconds, inner rows, join paths offered to the planner, plans made with it, paths declined (why: uvm.stat_gpujoin_declined).';

CREATE VIEW stat_gpujoin_declined AS
SELECT s.reason, s.paths FROM stat_gpujoin_declined_internal() s;
COMMENT ON VIEW stat_gpujoin_declined IS 'Join paths the GpuJoin plan node declined, per reason (cumulative).';

CREATE VIEW progress AS
SELECT s.pid, s.kind, s.phase, s.segment, s.done, s.total, s.unit, s.started
  FROM progress_internal() s;
COMMENT ON VIEW progress IS 'Long operations running now, in the style of pg_stat_progress_*: migrations (bytes) and the GpuJoin plan node''s inner-side builds (rows read against the estimate, then pairs inserted), with their phase.';

GRANT SELECT ON stat_segments, stat_service, stat_gpujoin, stat_gpujoin_declined, progress TO PUBLIC;
REVOKE EXECUTE ON FUNCTION stat_reset() FROM PUBLIC;
"#,
    name = "stat_views",
    requires = [stat_segments_internal, stat_service_internal, stat_gpujoin_internal, stat_gpujoin_declined_internal, stat_reset]
);

//! The background refresher (`pg_uvm_share.cache_refresh_delay`): a stale cache rebuilt without
//! anyone calling `uvm.cache_table`.
//!
//! - **Who starts it.** The writer whose mark makes a cache stale (`marks.rs`), when the delay
//!   is set (≥ 0), claims the database's refresher in the directory and registers a dynamic
//!   background worker for it (`pg_uvm_share cache refresh`). One runs per database at most; a
//!   claim whose worker never started (10 s), or whose worker is gone, is taken over by the
//!   next writer. Off (the default, -1), nothing starts and a stale cache waits for
//!   `cache_table`.
//! - **What it does.** Connected to the database as the bootstrap superuser, it rebuilds every
//!   cache that went stale at least the delay ago (its first mark; later writes do not push it
//!   back), one transaction each, with the privileges of the role that built it
//!   (`SetUserIdAndSecContext`, as autovacuum runs a table owner's code): the same columns
//!   (as they are named now; dropped ones left out), the same rule for its snapshot. Before each
//!   attempt it puts the cache off by the delay, so a rebuild that fails (an ERROR ends the
//!   worker; the next writer starts another) is tried at most once per delay. It takes the
//!   table's lock only if it is free (`ConditionalLockRelationOid`): a busy table is tried
//!   again a second later, and the refresher never queues in front of the table's writers.
//!   A cache whose table or building role is gone, or whose role lost `SELECT`, or whose table
//!   can no longer be cached (a partition now, or with inheritance children), is dropped.
//! - **When it stops.** With no stale cache left in its database (or the delay set to -1) it
//!   releases its claim and exits; a stale cache that appeared meanwhile makes it claim again
//!   and go on, so a mark is never left without a refresher. SIGTERM ends it as it ends a
//!   backend (`die`), wherever it waits.

use std::time::Duration;

use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime, SignalWakeFlags};

use super::*;

unsafe extern "C-unwind" {
    /// PostgreSQL's SIGTERM handler for backends (postgres.c), itself: pgrx's binding wraps it
    /// in a Rust function, which is no signal handler.
    fn die(postgres_signal_arg: std::ffi::c_int);
}

/// How long a claimed refresher may take to start before the next writer replaces it (µs).
const START_WITHIN_US: i64 = 10_000_000;
/// How soon a refresher tries a busy table again (µs).
const BUSY_RETRY_US: i64 = 1_000_000;
/// The longest a refresher sleeps between looks at the directory.
const NAP_MS: i64 = 1_000;

/// The delay in microseconds, `None` when refreshing is off.
fn delay_us() -> Option<i64> {
    let ms = crate::guc::CACHE_REFRESH_DELAY_MS.get();
    (ms >= 0).then(|| i64::from(ms) * 1000)
}

/// Whether process `pid` is alive.
fn alive(pid: u32) -> bool {
    // SAFETY: kill with signal 0 only checks that the process exists.
    pid != 0
        && (unsafe { libc::kill(pid as libc::pid_t, 0) } == 0
            || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM))
}

/// Whether refreshing is on and `database` has a stale cache (which a refresher should be
/// working on).
pub(super) fn wanted(d: &Directory, database: u32) -> bool {
    delay_us().is_some() && d.next_due(database).is_some()
}

/// Starts `database`'s refresher where [`wanted`], unless one runs (a writer's statement, after
/// its marks: a cache also goes stale when its build's transaction aborts, where nothing may be
/// started, so every write looks). Never raises: a refresher that cannot start leaves the cache
/// to `cache_table`.
pub(super) fn launch_if_due(d: &Directory, database: u32) {
    if !wanted(d, database) || !d.claim_refresher(database, now(), START_WITHIN_US, alive) {
        return;
    }
    let started = BackgroundWorkerBuilder::new("pg_uvm_share cache refresh")
        .set_type("pg_uvm_share cache refresh")
        .set_library("pg_uvm_share")
        .set_function("pg_uvm_share_cache_refresh_main")
        .set_argument(Some(pg_sys::Datum::from(database)))
        .enable_spi_access()
        .set_start_time(BgWorkerStartTime::RecoveryFinished)
        .set_restart_time(None)
        .load_dynamic();
    if started.is_err() {
        d.release_refresher(database);
        pgrx::debug1!("pg_uvm_share: no background worker slot for the cache refresher of database {database}");
    }
}

/// Releases the refresher's claim at its exit, however it ends.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn release_at_exit(_code: std::ffi::c_int, arg: pg_sys::Datum) {
    if let Ok(d) = directory() {
        d.release_refresher(arg.value() as u32);
    }
}

/// The refresher's entry point (a dynamic background worker; its argument is the database).
///
/// # Safety
///
/// Called by PostgreSQL as a background worker's main function.
#[pgrx::pg_guard]
#[no_mangle]
pub unsafe extern "C-unwind" fn pg_uvm_share_cache_refresh_main(arg: pg_sys::Datum) {
    let db = arg.value() as u32;
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP);
    // SIGTERM as PostgreSQL's backends take it (`die`): the next CHECK_FOR_INTERRUPTS ends the
    // worker wherever it waits, inside a build's request to the GPU service too. (pgrx's
    // handler only sets a flag this loop looks at: a worker waiting on a service that had
    // already exited at shutdown never left, and `pg_ctl stop -m fast` hung.)
    // SAFETY: installs PostgreSQL's own handler in this single-threaded process.
    unsafe {
        #[cfg(not(feature = "pg18"))]
        pg_sys::pqsignal(pg_sys::SIGTERM as i32, Some(die));
        #[cfg(feature = "pg18")]
        pg_sys::pqsignal_be(pg_sys::SIGTERM as i32, Some(die));
    }
    // SAFETY: registers a callback PostgreSQL runs at exit; it is pg_guard'ed.
    unsafe { pg_sys::before_shmem_exit(Some(release_at_exit), arg) };
    let Ok(d) = directory() else { return };
    // SAFETY: MyProcPid is set at process start.
    d.refresher_started(db, unsafe { pg_sys::MyProcPid } as u32);
    BackgroundWorker::connect_worker_to_spi_by_oid(Some(pg_sys::Oid::from(db)), None);
    loop {
        pg_sys::check_for_interrupts!();
        if BackgroundWorker::sighup_received() {
            // SAFETY: reloads postgresql.conf in the main thread, as any process does on SIGHUP.
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
        }
        let Some(delay) = delay_us() else { break };
        let t = now();
        for e in d.due(db, t.saturating_sub(delay)) {
            // Not again before the delay, whatever happens (an ERROR ends this worker).
            d.postpone(e.slot, e.generation, t);
            let busy = BackgroundWorker::transaction(std::panic::AssertUnwindSafe(|| refresh(d, &e)));
            if busy {
                d.postpone(e.slot, e.generation, t.saturating_sub(delay).saturating_add(BUSY_RETRY_US));
            }
        }
        let Some(next) = d.next_due(db) else {
            // Nothing stale: leave, unless a cache went stale after the look (its writer saw
            // this claim and started nobody).
            d.release_refresher(db);
            if d.next_due(db).is_some() && d.claim_refresher(db, now(), START_WITHIN_US, alive) {
                // SAFETY: as above.
                d.refresher_started(db, unsafe { pg_sys::MyProcPid } as u32);
                continue;
            }
            break;
        };
        let wait_ms = (next.saturating_add(delay).saturating_sub(now()) / 1000).clamp(1, NAP_MS);
        BackgroundWorker::wait_latch(Some(Duration::from_millis(wait_ms as u64)));
    }
}

/// Rebuilds the stale cache `e` (in a transaction); true where its table was busy.
fn refresh(d: &Directory, e: &Entry) -> bool {
    let relid = pg_sys::Oid::from(e.relation);
    let role = pg_sys::Oid::from(e.builder);
    let columns = stale_columns(e);
    // SAFETY: syscache probes and an ACL check of existing objects.
    let usable = unsafe {
        let exists = |cache: pg_sys::SysCacheIdentifier::Type, oid: pg_sys::Oid| {
            pg_sys::SearchSysCacheExists(cache as i32, pg_sys::Datum::from(oid), 0.into(), 0.into(), 0.into())
        };
        exists(pg_sys::SysCacheIdentifier::RELOID, relid)
            && exists(pg_sys::SysCacheIdentifier::AUTHOID, role)
            && pg_sys::pg_class_aclcheck(relid, role, pg_sys::ACL_SELECT as pg_sys::AclMode) == pg_sys::AclResult::ACLCHECK_OK
    };
    let Some(columns) = columns.filter(|c| usable && !c.is_empty()) else {
        pgrx::log!(
            "pg_uvm_share: the stale cache of table {} is dropped: its table, columns or role are gone, or the role lost SELECT",
            e.relation
        );
        let _ = drop_entry(d, e);
        return false;
    };
    let mut saved_user = pg_sys::Oid::INVALID;
    let mut saved_context = 0;
    // SAFETY: the security context is saved here and restored below; an ERROR in between ends
    // the transaction (which restores it) and this worker.
    unsafe {
        pg_sys::GetUserIdAndSecContext(&mut saved_user, &mut saved_context);
        pg_sys::SetUserIdAndSecContext(
            role,
            saved_context | pg_sys::SECURITY_LOCAL_USERID_CHANGE as i32 | pg_sys::SECURITY_RESTRICTED_OPERATION as i32,
        );
    }
    let r = rebuild_as_builder(relid, columns);
    // SAFETY: restores what was saved above.
    unsafe { pg_sys::SetUserIdAndSecContext(saved_user, saved_context) };
    match r {
        Ok(Some(rows)) => {
            pgrx::debug1!("pg_uvm_share: the background refresher rebuilt the cache of table {} ({rows} rows)", e.relation);
            false
        }
        Ok(None) => true,
        // A table that can no longer be cached (made a partition, given inheritance children,
        // a column's type changed to one no cache holds): no later attempt would do better, so
        // the cache goes, as for a table that is gone, rather than be tried once per delay.
        Err(err) if matches!(err.code, Code::FeatureNotSupported | Code::UndefinedColumn) => {
            pgrx::log!(
                "pg_uvm_share: the stale cache of table {} is dropped: its table can no longer be cached: {}",
                e.relation,
                err.message
            );
            let _ = drop_entry(d, e);
            false
        }
        Err(err) => {
            pgrx::log!(
                "pg_uvm_share: the background refresher could not rebuild the cache of table {}: {}",
                e.relation,
                err.message
            );
            false
        }
    }
}

fn rebuild_as_builder(relid: pg_sys::Oid, columns: Vec<String>) -> Result<Option<i64>> {
    super::builder::rebuild(relid, columns)
}

/// The names the stale cache's columns have now (dropped ones left out), from its segment's
/// layout; `None` where the segment cannot be read.
fn stale_columns(e: &Entry) -> Option<Vec<String>> {
    let name = segment_name(e.database, e.relation, e.generation);
    let (seg, info) = lookup_own(&name).ok()?;
    let layout = read_layout(&seg, &name, info.size).ok()?;
    Some(
        layout
            .columns()
            .iter()
            // SAFETY: a syscache lookup of the attribute, released after its name is copied.
            .filter_map(|c| unsafe {
                let tup = pg_sys::SearchSysCacheAttNum(pg_sys::Oid::from(e.relation), c.attnum);
                if tup.is_null() {
                    return None;
                }
                let att = pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_attribute>(tup);
                let name = (!(*att).attisdropped)
                    .then(|| std::ffi::CStr::from_ptr((*att).attname.data.as_ptr()).to_string_lossy().into_owned());
                pg_sys::ReleaseSysCache(tup);
                name
            })
            .collect(),
    )
}

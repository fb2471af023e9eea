//! The writers' marks: before a statement changes a cached table, its cache goes stale (the
//! module essay, "Staying correct"). Called from the C trampolines of `hooks.c`.

use std::cell::RefCell;

use super::*;

unsafe extern "C" {
    /// src/caches/hooks.c: installs the C trampolines that call the two markers below.
    fn uvm_caches_install_hooks();
}

/// Installs the writers' hooks (from `_PG_init`).
pub fn init_hooks() {
    // SAFETY: _PG_init runs single-threaded, before any hook can fire; the C side keeps the
    // previous hooks and calls them. The callbacks are pg_guard'ed and live as long as the
    // process.
    unsafe {
        uvm_caches_install_hooks();
        pg_sys::RegisterXactCallback(Some(on_xact), std::ptr::null_mut());
        pg_sys::RegisterSubXactCallback(Some(on_subxact), std::ptr::null_mut());
    }
}

/// A statement of this backend that may write tables and has not ended: an executor (by its
/// `QueryDesc`) with the tables it writes, or a utility statement that marks (by its
/// `PlannedStmt`) with the number of cache builds this backend had made when it began; and the
/// subtransaction it began in.
struct Writer {
    key: usize,
    subxact: pg_sys::SubTransactionId,
    what: Writes,
}

enum Writes {
    Tables(Vec<u32>),
    /// A utility statement (or an executor filling a new table): the cache builds this backend
    /// had made when it began, and the tables it locks and changes (0: every table of the
    /// database), marked again when it ends.
    Utility {
        builds: u64,
        remark: Vec<u32>,
    },
}

thread_local! {
    /// The writing statements under way in this backend, innermost last.
    static WRITERS: RefCell<Vec<Writer>> = const { RefCell::new(Vec::new()) };
    /// The caches this backend has built (`build_started`).
    static BUILDS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

fn begin_writing(key: usize, what: Writes) {
    // SAFETY: reads this backend's current subtransaction id.
    let subxact = unsafe { pg_sys::GetCurrentSubTransactionId() };
    WRITERS.with(|w| w.borrow_mut().push(Writer { key, subxact, what }));
}

/// Takes back the note of statement `key`, returning it.
fn end_writing(key: usize) -> Option<Writes> {
    WRITERS.with(|w| {
        let mut w = w.borrow_mut();
        let i = w.iter().rposition(|x| x.key == key)?;
        Some(w.remove(i).what)
    })
}

/// Whether an executor of this backend that has not ended writes `relation`. A cache built
/// inside it (`cache_table` in a subquery of an `UPDATE` of the table, or in one of its
/// triggers) would miss the writes it makes after the build, which its mark, made when it
/// began, does not cover: the builder refuses.
pub(super) fn being_written(relation: u32) -> bool {
    WRITERS.with(|w| w.borrow().iter().any(|x| matches!(&x.what, Writes::Tables(t) if t.contains(&relation))))
}

/// A cache build begins in this backend. A utility statement that marks (an `ALTER TABLE`, a
/// `COPY FROM`) or an executor that fills a new table (`CREATE TABLE AS`, `SELECT INTO`) and
/// has a build inside it (an event trigger's, a trigger's, a function's in its query) marks
/// again when it ends, since what it wrote after the build is not in that cache.
pub(super) fn build_started() {
    BUILDS.with(|b| b.set(b.get() + 1));
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn on_xact(event: pg_sys::XactEvent::Type, _arg: *mut std::ffi::c_void) {
    use pg_sys::XactEvent::*;
    if matches!(
        event,
        XACT_EVENT_COMMIT | XACT_EVENT_PARALLEL_COMMIT | XACT_EVENT_ABORT | XACT_EVENT_PARALLEL_ABORT | XACT_EVENT_PREPARE
    ) {
        WRITERS.with(|w| w.borrow_mut().clear());
    }
}

/// A subtransaction's abort ends the statements begun in it (and in its children, whose ids
/// are larger) without their `ExecutorEnd`.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn on_subxact(
    event: pg_sys::SubXactEvent::Type,
    my_subid: pg_sys::SubTransactionId,
    _parent: pg_sys::SubTransactionId,
    _arg: *mut std::ffi::c_void,
) {
    if event == pg_sys::SubXactEvent::SUBXACT_EVENT_ABORT_SUB {
        WRITERS.with(|w| w.borrow_mut().retain(|x| x.subxact < my_subid));
    }
}

/// Marks the caches of `relation` (0: all of this database) stale, where there are any, and
/// starts the database's background refresher where one is wanted.
fn mark(relation: u32) {
    if let Ok(d) = directory() {
        let db = database();
        if d.any_live(db) {
            d.mark_stale(db, relation, now());
        }
        super::refresh::launch_if_due(d, db);
    }
}

thread_local! {
    /// Set while the extension runs DDL of its own that changes no rows (`quietly`).
    static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f`, the extension's own DDL (its append trigger), with the mark of its one utility
/// statement off: it changes no table's rows and must not make every cache of the database
/// stale. Only that statement's: what runs inside it (a user's event trigger that writes a
/// cached table) is marked as always.
pub(super) fn quietly<T>(f: impl FnOnce() -> T) -> T {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            QUIET.with(|q| q.set(self.0));
        }
    }
    let _restore = Restore(QUIET.with(|q| q.replace(true)));
    f()
}

/// Whether a statement of this database may have a cache to mark, or a stale one to refresh.
fn worth_marking() -> bool {
    directory().is_ok_and(|d| {
        let db = database();
        d.any_live(db) || super::refresh::wanted(d, db)
    })
}

/// The OIDs of `pstmt`'s result relations.
///
/// # Safety
/// `pstmt` is a valid planned statement.
unsafe fn result_relations(pstmt: *const pg_sys::PlannedStmt) -> Vec<u32> {
    let mut out = Vec::new();
    // SAFETY: PostgreSQL's lists: `resultRelations` holds RT indexes (ints) into `rtable`
    // (pointers to RangeTblEntry), 1-based; both are read within their lengths.
    unsafe {
        let rr = (*pstmt).resultRelations;
        let rt = (*pstmt).rtable;
        if rr.is_null() || rt.is_null() {
            return out;
        }
        for i in 0..(*rr).length as usize {
            let idx = (*(*rr).elements.add(i)).int_value;
            if idx >= 1 && idx <= (*rt).length {
                let rte = (*(*rt).elements.add(idx as usize - 1)).ptr_value as *const pg_sys::RangeTblEntry;
                if !rte.is_null() {
                    out.push(u32::from((*rte).relid));
                }
            }
        }
    }
    out
}

/// Whether `pstmt` only inserts, into one table, so that the append trigger sees every row it
/// adds: an `INSERT` without `ON CONFLICT DO UPDATE` and without data-modifying CTEs.
///
/// # Safety
/// `pstmt` is a valid planned statement.
unsafe fn plain_insert(pstmt: *const pg_sys::PlannedStmt) -> bool {
    // SAFETY: forwarded contract; the top plan node is read by its tag.
    unsafe {
        let top = (*pstmt).planTree;
        if (*pstmt).commandType != pg_sys::CmdType::CMD_INSERT
            || (*pstmt).hasModifyingCTE
            || top.is_null()
            || (*top).type_ != pg_sys::NodeTag::T_ModifyTable
        {
            return false;
        }
        let mt = top as *const pg_sys::ModifyTable;
        (*mt).operation == pg_sys::CmdType::CMD_INSERT && (*mt).onConflictAction != pg_sys::OnConflictAction::ONCONFLICT_UPDATE
    }
}

/// Before `ExecutorStart` (src/caches/hooks.c): marks the caches of the plan's result
/// relations stale, unless the plan is only explained.
///
/// # Safety
/// PostgreSQL's query descriptor, valid for the call.
#[pgrx::pg_guard]
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn uvm_caches_before_executor_start(query_desc: *mut pg_sys::QueryDesc, eflags: std::ffi::c_int) {
    // SAFETY: PostgreSQL hands a valid QueryDesc; its planned statement lives as long.
    unsafe {
        if eflags & pg_sys::EXEC_FLAG_EXPLAIN_ONLY as std::ffi::c_int != 0 {
            return;
        }
        let pstmt = (*query_desc).plannedstmt;
        if pstmt.is_null() {
            return;
        }
        // An executor that fills a new table (`CREATE TABLE AS`, `SELECT INTO`, either under
        // `EXPLAIN ANALYZE` or from a function) marks nothing, its table being new; but its rows
        // go in through its receiver, not a result relation, so a cache of that table built
        // inside it (by a function of its query) misses the rows after the build: noted as a
        // utility statement's, it marks every cache again when it ends.
        let dest = (*query_desc).dest;
        if !dest.is_null() && (*dest).mydest == pg_sys::CommandDest::DestIntoRel {
            begin_writing(query_desc as usize, Writes::Utility { builds: BUILDS.with(|b| b.get()), remark: Vec::new() });
        }
        let written = result_relations(pstmt);
        if written.is_empty() {
            return;
        }
        if worth_marking() {
            let appends = plain_insert(pstmt);
            for &rel in &written {
                // (the plan's locks are held: the trigger stays as it is checked)
                if !(appends && super::trigger::insert_appends(rel)) {
                    mark(rel);
                }
            }
        }
        begin_writing(query_desc as usize, Writes::Tables(written));
    }
}

/// Before `ExecutorEnd` (src/caches/hooks.c): the statement writes no more.
///
/// # Safety
/// None beyond the call's: the descriptor is only compared.
#[pgrx::pg_guard]
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn uvm_caches_before_executor_end(query_desc: *mut pg_sys::QueryDesc) {
    // (an executor filling a new table has two notes: its receiver's, and its result relations'
    // if its query writes tables too)
    while let Some(w) = end_writing(query_desc as usize) {
        ended(w);
    }
}

/// After a utility statement (src/caches/hooks.c): it writes no more; one that marks and had a
/// cache built inside it marks every cache of the database again (`build_started`).
///
/// # Safety
/// None beyond the call's: the statement is only compared.
#[pgrx::pg_guard]
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn uvm_caches_after_utility(pstmt: *mut pg_sys::PlannedStmt) {
    if let Some(w) = end_writing(pstmt as usize) {
        ended(w);
    }
}

/// A writing statement ended: one noted as a utility statement's that had a cache built
/// inside it marks every cache of the database again; otherwise it marks again the tables it
/// locks and changes (`remark`). A statement marks before it takes its table's lock
/// (`uvm_caches_before_utility` runs before `ProcessUtility`), so a build that held the lock
/// then (waiting for a writer, say) may publish a cache of the table as it was, which only a
/// mark after the statement, under its lock, makes stale (an `ALTER TABLE ... TYPE` queued
/// behind such a build left a ready cache of the old type).
fn ended(w: Writes) {
    if let Writes::Utility { builds, remark } = w {
        if BUILDS.with(|b| b.get()) != builds {
            mark(0);
        } else {
            remark.into_iter().for_each(mark);
        }
    }
}

/// Whether a utility statement of this tag leaves every table's rows as they are.
fn keeps_rows(tag: pg_sys::NodeTag) -> bool {
    use pg_sys::NodeTag::*;
    matches!(
        tag,
        T_TransactionStmt
            | T_VariableSetStmt
            | T_VariableShowStmt
            | T_ExplainStmt
            | T_PrepareStmt
            | T_ExecuteStmt
            | T_DeallocateStmt
            | T_DeclareCursorStmt
            | T_FetchStmt
            | T_ClosePortalStmt
            | T_NotifyStmt
            | T_ListenStmt
            | T_UnlistenStmt
            | T_LockStmt
            | T_CheckPointStmt
            | T_DiscardStmt
            | T_VacuumStmt
            | T_ClusterStmt
            | T_ReindexStmt
            | T_IndexStmt
            | T_CreateStmt
            | T_CreateTableAsStmt
            | T_ViewStmt
            | T_CreateFunctionStmt
            // (CREATE OPERATOR, AGGREGATE, TYPE, COLLATION, TEXT SEARCH ...: new objects)
            | T_DefineStmt
            | T_CreateSeqStmt
            | T_AlterSeqStmt
            | T_DoStmt
            | T_CallStmt
            | T_CommentStmt
            | T_GrantStmt
            | T_GrantRoleStmt
            | T_CreateRoleStmt
            | T_AlterRoleStmt
            | T_CreateSchemaStmt
            | T_CreateExtensionStmt
            | T_RefreshMatViewStmt
            | T_LoadStmt
            | T_CreatedbStmt
            | T_CreateStatsStmt
            | T_AlterStatsStmt
            | T_AlterSystemStmt
            | T_CreateTrigStmt
    )
}

/// The tables a `DROP TABLE ... RESTRICT` names (those that exist): the only rows it removes
/// are theirs (with `CASCADE` it may drop other tables' columns of their row types, and other
/// drops are not looked into: `None`).
///
/// # Safety
/// `stmt` is a valid DropStmt.
unsafe fn dropped_tables(stmt: *const pg_sys::DropStmt) -> Option<Vec<u32>> {
    // SAFETY: forwarded contract: `objects` is a List of name Lists for a table drop; name
    // lookups without a lock, missing names skipped (DROP reports them itself).
    unsafe {
        if (*stmt).removeType != pg_sys::ObjectType::OBJECT_TABLE || (*stmt).behavior != pg_sys::DropBehavior::DROP_RESTRICT {
            return None;
        }
        let objects = pgrx::PgList::<pg_sys::List>::from_pg((*stmt).objects);
        Some(
            objects
                .iter_ptr()
                .map(|names| {
                    let rv = pg_sys::makeRangeVarFromNameList(names);
                    u32::from(pg_sys::RangeVarGetRelidExtended(
                        rv,
                        pg_sys::NoLock as i32,
                        pg_sys::RVROption::RVR_MISSING_OK,
                        None,
                        std::ptr::null_mut(),
                    ))
                })
                .filter(|&r| r != 0)
                .collect(),
        )
    }
}

/// Whether a `COPY FROM` into `relid` appends to its cache (the trigger fires for it). The
/// table is locked as COPY will lock it (`RowExclusiveLock`) before the trigger is looked at, so
/// that nothing disables it in between; only for a caller who may insert into it (COPY checks
/// that itself, later).
fn copy_appends(relid: u32) -> bool {
    let oid = pg_sys::Oid::from(relid);
    // SAFETY: an ACL check of the current user, then a lock held to the end of the transaction.
    unsafe {
        let may = pg_sys::pg_class_aclcheck(oid, pg_sys::GetUserId(), pg_sys::ACL_INSERT as pg_sys::AclMode)
            == pg_sys::AclResult::ACLCHECK_OK;
        if !may || !super::trigger::has_tail(relid) {
            return false;
        }
        pg_sys::LockRelationOid(oid, pg_sys::RowExclusiveLock as i32);
    }
    super::trigger::insert_appends(relid)
}

/// Before `ProcessUtility` (src/caches/hooks.c): `COPY ... FROM` marks its table's cache
/// stale, `DROP TABLE ... RESTRICT` its tables' caches; any statement not known to keep every
/// table's rows marks every cache of the database.
///
/// # Safety
/// PostgreSQL's planned utility statement, valid for the call.
#[pgrx::pg_guard]
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn uvm_caches_before_utility(pstmt: *mut pg_sys::PlannedStmt) {
    // SAFETY: PostgreSQL hands a valid planned utility statement; nodes are read by their tags.
    unsafe {
        let stmt = (*pstmt).utilityStmt;
        // (the extension's own DDL: this statement unmarked, and the flag taken, so that the
        // statements it runs, an event trigger's, are marked)
        if stmt.is_null() || QUIET.with(|q| q.replace(false)) {
            return;
        }
        let tag = (*stmt).type_;
        let copy_from = tag == pg_sys::NodeTag::T_CopyStmt && (*(stmt as *const pg_sys::CopyStmt)).is_from;
        // (`CREATE TABLE AS` and `SELECT INTO` mark nothing, their table being new: their
        // executor notes a build inside them, `uvm_caches_before_executor_start`)
        let writes = copy_from || (tag != pg_sys::NodeTag::T_CopyStmt && !keeps_rows(tag));
        let noted = |remark: Vec<u32>| {
            if writes {
                begin_writing(pstmt as usize, Writes::Utility { builds: BUILDS.with(|b| b.get()), remark });
            }
        };
        // (no cache in the database: nothing to mark now; a build that publishes one of a table
        // the statement locks before it ends is marked when it does)
        let worth = worth_marking();
        let targets = if tag == pg_sys::NodeTag::T_CopyStmt {
            let copy = stmt as *const pg_sys::CopyStmt;
            if (*copy).is_from {
                let rel = if (*copy).relation.is_null() {
                    0
                } else {
                    u32::from(pg_sys::RangeVarGetRelidExtended(
                        (*copy).relation,
                        pg_sys::NoLock as i32,
                        pg_sys::RVROption::RVR_MISSING_OK,
                        None,
                        std::ptr::null_mut(),
                    ))
                };
                // an unknown table marks every cache: COPY fails on it anyway
                if rel != 0 && worth && copy_appends(rel) {
                    Vec::new()
                } else {
                    vec![rel]
                }
            } else {
                Vec::new()
            }
        } else if tag == pg_sys::NodeTag::T_DropStmt {
            dropped_tables(stmt as *const pg_sys::DropStmt).unwrap_or_else(|| vec![0])
        } else if !keeps_rows(tag) {
            vec![0]
        } else {
            Vec::new()
        };
        if worth {
            targets.iter().copied().for_each(mark);
        }
        // Marked again at the end: the tables the statement locks and changes (COPY's, those
        // DROP TABLE names, ALTER TABLE's, TRUNCATE's), where a build that held the lock first
        // can publish a cache of the table as it was. Not every cache of the database: a long
        // statement would make stale, and abort, the builds of other tables meanwhile.
        let remark = match tag {
            pg_sys::NodeTag::T_CopyStmt => targets,
            pg_sys::NodeTag::T_DropStmt if !targets.contains(&0) => targets,
            _ => locked_tables(stmt),
        };
        noted(remark);
    }
}

/// The tables an `ALTER TABLE` or `TRUNCATE` names (found without a lock; missing ones left
/// out), for the mark at its end; none for other statements.
///
/// # Safety
/// `stmt` is a valid utility statement node.
unsafe fn locked_tables(stmt: *mut pg_sys::Node) -> Vec<u32> {
    let oid_of = |rv: *mut pg_sys::RangeVar| -> u32 {
        // SAFETY: a name lookup without a lock, a missing name 0.
        u32::from(unsafe {
            pg_sys::RangeVarGetRelidExtended(
                rv,
                pg_sys::NoLock as i32,
                pg_sys::RVROption::RVR_MISSING_OK,
                None,
                std::ptr::null_mut(),
            )
        })
    };
    // SAFETY: the node's tag says its type; its RangeVars and lists are PostgreSQL's.
    let found = unsafe {
        match (*stmt).type_ {
            pg_sys::NodeTag::T_AlterTableStmt => vec![oid_of((*(stmt as *mut pg_sys::AlterTableStmt)).relation)],
            pg_sys::NodeTag::T_TruncateStmt => {
                pgrx::PgList::<pg_sys::RangeVar>::from_pg((*(stmt as *mut pg_sys::TruncateStmt)).relations)
                    .iter_ptr()
                    .map(oid_of)
                    .collect()
            }
            _ => Vec::new(),
        }
    };
    found.into_iter().filter(|&r| r != 0).collect()
}

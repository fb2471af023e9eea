//! Column caches (issue 26): chosen columns of a table copied into one shared segment, in the
//! columnar format of `uvm_core::cache`, listed in a directory in shared memory
//! (`uvm_core::cache::directory`), and used by a reader only where the cache answers exactly
//! what the heap would under the reader's snapshot.
//!
//! # Building
//!
//! `uvm.cache_table(rel, columns)` checks that the caller may read the table, takes
//! `ShareRowExclusiveLock` on it (writers wait until the build's transaction ends; a second
//! builder of the same table too; readers do not), claims a directory slot, and reads the
//! columns with a snapshot taken after the lock (`GetLatestSnapshot`), so that every writer of
//! the table has ended and the cache holds its committed state. Rows go a block at a time
//! (`BlockBuilder`, 64 Ki rows) into a segment named by the slot's generation in the reserved
//! namespace, placed by the tiers (`auto`: device first, then the host tier under the device
//! budget); the header goes last, then the slot becomes `Ready` with the snapshot's `xmax` and
//! the builder's transaction id. An error or a cancel drops the half-made segment and frees the
//! slot. A table that has a cache is rebuilt by calling `cache_table` again (the old cache is
//! dropped first). Text and varchar columns of a deterministic collation are dictionary codes;
//! each column's distinct strings go into a segment of its own (`<cache>_d<attnum>`, its
//! `ColumnDesc::dictionary` the attnum), built in the builder's memory up to 1 GiB.
//!
//! # Staying correct
//!
//! Every statement that may change a cached table marks its cache stale before it changes
//! anything; a stale cache is never read (readers go to the heap) until it is rebuilt:
//!
//! - `ExecutorStart` (every INSERT, UPDATE, DELETE, MERGE and data-modifying CTE, also from
//!   functions and SPI): each of the plan's result relations. `EXPLAIN` without `ANALYZE` writes
//!   nothing and marks nothing.
//! - `ProcessUtility`: `COPY ... FROM` marks its table; every other utility statement except a
//!   list of ones that change no table's rows (transaction control, `SET`, `VACUUM` and
//!   `CLUSTER`, which keep the rows, `CREATE` of new objects, `GRANT`, ...) marks every cache
//!   of the database: `TRUNCATE`, `ALTER TABLE`, `DROP`, and whatever a later PostgreSQL adds.
//!
//! The two hooks are C trampolines (`hooks.c`) around the markers here, so that an ERROR of the
//! statement itself passes through them as PostgreSQL raised it (a Rust hook would convert it
//! through pgrx's FFI guard and lose its position, context and object names).
//!
//! The mark is an atomic store, not transactional: an aborted writer leaves the cache stale.
//! A reader may use a cache only when, with its snapshot already taken, the slot is `Ready`,
//! the snapshot's `xmin` follows or equals the build's `xmax`, and the builder's transaction,
//! if it had an id, committed (its commit callback clears the id; its abort callback marks the
//! cache stale; the commit log is never asked); then no write the snapshot sees is missing from the cache and
//! none it does not see is in it (`uvm_core::cache::directory` says why). Under
//! `SERIALIZABLE` a reader goes to the heap (the cache takes no predicate locks), as it does
//! with `pg_uvm_share.enable_cache = off`.
//!
//! What no hook sees is refused instead: a standby (its writes are WAL replay) cannot build,
//! and a table that a subscription writes (logical replication's apply worker writes without
//! the executor's hooks) is neither built nor read from its cache. Caches live in shared
//! memory: a restart, or a crash and the restart after it, leaves none.
//!
//! # Reading
//!
//! `uvm.cache_fold(rel, column)` is the first reader: the row count, the column's non-NULL
//! count and its sum, from the cache where it is current and from the heap otherwise, saying
//! which. It reads one block at a time through the executor (any tier, either execution mode)
//! and parses every byte it reads as untrusted (`Layout::parse`), and it checks the header's
//! table and generation against the slot's. The plan nodes will read caches the same way.

use std::sync::atomic::{AtomicPtr, Ordering};

use pgrx::pg_sys;

use crate::cache::dict::DictBuilder;
use crate::cache::directory::{segment_name, Built, Directory, Entry, State};
use crate::cache::{BlockBuilder, ColumnSpec, Encoding, Layout, HEADER_BYTES, MAX_NUMERIC_SCALE};
use crate::error::{Code, Result, UvmError};
use crate::exec::{self, SegRef};
use crate::registry::shmem::Block;
use crate::registry::TierPref;
use crate::runtime::{lookup_own, now};

/// Rows per block of a cache this module builds: 64 Ki, 256 KiB of an `int4` column, so that a
/// reader fetches a block in one request and a small table does not take a 1 Mi-row block.
const BLOCK_ROWS: u64 = 1 << 16;
/// Rows fetched from the build's cursor at a time.
const FETCH_ROWS: i64 = 4096;
/// PostgreSQL's bootstrap superuser: the owner of every cache segment (no role a user can drop).
const BOOTSTRAP_SUPERUSER: u32 = 10;

static BASE: AtomicPtr<u8> = AtomicPtr::new(std::ptr::null_mut());

/// The directory's block of main shared memory, for `registry::shmem::install`.
pub fn block() -> Block {
    Block { name: c"pg_uvm_share column caches", size: Directory::size(), init, base: &BASE }
}

/// # Safety
/// `base` points to `Directory::size()` fresh bytes of shared memory, 8-aligned (the block's).
unsafe fn init(base: *mut u8) {
    // SAFETY: the bytes are ours to format (contract); zeroed, they are a valid Directory (every
    // field an atomic integer), which `reset` then empties explicitly.
    unsafe {
        std::ptr::write_bytes(base, 0, Directory::size());
        (*(base as *const Directory)).reset();
    }
}

/// The cluster's cache directory (55000 before shared memory is set up).
pub fn directory() -> Result<&'static Directory> {
    let base = BASE.load(Ordering::Acquire);
    if base.is_null() {
        return Err(UvmError::new(Code::ObjectNotInPrerequisiteState, "the column cache directory is not set up")
            .hint("pg_uvm_share must be loaded via shared_preload_libraries."));
    }
    // SAFETY: `init` formatted the block before any backend started; main shared memory stays
    // mapped for the life of the process; a Directory is only ever used through atomics.
    Ok(unsafe { &*(base as *const Directory) })
}

fn database() -> u32 {
    // SAFETY: a plain global, set at backend start.
    u32::from(unsafe { pg_sys::MyDatabaseId })
}

// --- writers' marks ------------------------------------------------------------------------

unsafe extern "C" {
    /// src/caches/hooks.c: installs the C trampolines that call the two markers below.
    fn uvm_caches_install_hooks();
}

/// Installs the writers' hooks (from `_PG_init`).
pub fn init_hooks() {
    // SAFETY: _PG_init runs single-threaded, before any hook can fire; the C side keeps the
    // previous hooks and calls them.
    unsafe { uvm_caches_install_hooks() };
}

/// Marks the caches of `relation` (0: all of this database) stale, where there are any.
fn mark(relation: u32) {
    if let Ok(d) = directory() {
        let db = database();
        if d.any_live(db) {
            d.mark_stale(db, relation);
        }
    }
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
        if !pstmt.is_null() && directory().map(|d| d.any_live(database())).unwrap_or(false) {
            for rel in result_relations(pstmt) {
                mark(rel);
            }
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
    )
}

/// Before `ProcessUtility` (src/caches/hooks.c): `COPY ... FROM` marks its table's cache
/// stale; any statement not known to keep every table's rows marks every cache of the database.
///
/// # Safety
/// PostgreSQL's planned utility statement, valid for the call.
#[pgrx::pg_guard]
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn uvm_caches_before_utility(pstmt: *mut pg_sys::PlannedStmt) {
    // SAFETY: PostgreSQL hands a valid planned utility statement; nodes are read by their tags.
    unsafe {
        let stmt = (*pstmt).utilityStmt;
        if stmt.is_null() || !directory().map(|d| d.any_live(database())).unwrap_or(false) {
            return;
        }
        let tag = (*stmt).type_;
        if tag == pg_sys::NodeTag::T_CopyStmt {
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
                mark(rel);
            }
        } else if !keeps_rows(tag) {
            mark(0);
        }
    }
}

// --- building ------------------------------------------------------------------------------

/// A column chosen for the cache: its number, name, encoding and the SQL that reads it.
struct Chosen {
    spec: ColumnSpec,
    /// The select-list expression: the column itself, or a `numeric(p, s)` scaled to `int8`.
    expr: String,
}

fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// The encoding of a column of type `typid` with `typmod`, and a numeric's scale; `Err` says
/// why the type cannot be cached.
fn encoding_of(typid: pg_sys::Oid, typmod: i32) -> std::result::Result<(Encoding, i16), String> {
    Ok(match typid {
        pg_sys::BOOLOID => (Encoding::Bool, 0),
        pg_sys::INT2OID => (Encoding::Int2, 0),
        pg_sys::INT4OID => (Encoding::Int4, 0),
        pg_sys::INT8OID => (Encoding::Int8, 0),
        pg_sys::FLOAT4OID => (Encoding::Float4, 0),
        pg_sys::FLOAT8OID => (Encoding::Float8, 0),
        pg_sys::DATEOID => (Encoding::Date, 0),
        pg_sys::TIMESTAMPOID => (Encoding::Timestamp, 0),
        pg_sys::TIMESTAMPTZOID => (Encoding::TimestampTz, 0),
        pg_sys::NUMERICOID => {
            let vh = pg_sys::VARHDRSZ as i32;
            if typmod < vh {
                return Err("numeric without a precision has no fixed scale".into());
            }
            let precision = ((typmod - vh) >> 16) & 0xffff;
            // the scale's 11 bits, sign-extended (PostgreSQL 15 allows negative scales)
            let scale = ((((typmod - vh) & 0x7ff) ^ 1024) - 1024) as i16;
            if precision > 18 || !(0..=MAX_NUMERIC_SCALE).contains(&scale) || i32::from(scale) > precision {
                return Err(format!("numeric({precision}, {scale}) does not fit an int8 scaled by 10^scale"));
            }
            (Encoding::Numeric, scale)
        }
        pg_sys::TEXTOID | pg_sys::VARCHAROID => (Encoding::DictCode, 0),
        pg_sys::BPCHAROID => return Err("character(n) is not cached (its padding makes equal values unequal bytes)".into()),
        _ => return Err("the type has no column encoding".into()),
    })
}

/// [`encoding_of`], and for text a deterministic collation (a dictionary code stands for equal
/// bytes; a nondeterministic collation calls other bytes equal).
fn cacheable(typid: pg_sys::Oid, typmod: i32, collation: pg_sys::Oid) -> std::result::Result<(Encoding, i16), String> {
    let e = encoding_of(typid, typmod)?;
    if e.0 == Encoding::DictCode && collation != pg_sys::InvalidOid {
        // SAFETY: a catalog lookup of an existing collation (the column's).
        let deterministic = unsafe { pg_sys::get_collation_isdeterministic(collation) };
        if !deterministic {
            return Err("its collation is nondeterministic".into());
        }
    }
    Ok(e)
}

/// What `cache_table` checked of the table, under its lock.
struct Target {
    /// The planner's estimate of the rows (`pg_class.reltuples`; 0 when never analyzed).
    estimated_rows: u64,
    /// The schema-qualified, quoted name, for the build's query.
    qualified: String,
    columns: Vec<Chosen>,
}

fn check_select(relid: pg_sys::Oid) -> Result<()> {
    // SAFETY: an ACL check of this backend's current user; a missing relation reads as no
    // privilege (the caller's regclass argument named an existing one).
    let ok = unsafe { pg_sys::pg_class_aclcheck(relid, pg_sys::GetUserId(), pg_sys::ACL_SELECT as pg_sys::AclMode) }
        == pg_sys::AclResult::ACLCHECK_OK;
    if ok {
        Ok(())
    } else {
        Err(UvmError::new(Code::InsufficientPrivilege, format!("permission denied for table {}", rel_name(relid))))
    }
}

fn rel_name(relid: pg_sys::Oid) -> String {
    // SAFETY: get_rel_name returns a palloc'd copy or NULL.
    unsafe {
        let p = pg_sys::get_rel_name(relid);
        if p.is_null() {
            format!("{}", u32::from(relid))
        } else {
            std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    }
}

/// Whether a subscription writes `relid` (logical replication's apply worker writes without
/// the executor's hooks, so such a table is never built or read from a cache).
fn subscribed(relid: pg_sys::Oid) -> bool {
    let q = format!("SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_subscription_rel WHERE srrelid = {})", u32::from(relid));
    pgrx::spi::Spi::get_one::<bool>(&q).ok().flatten().unwrap_or(true)
}

/// Checks the table and picks its columns (`names`: all cacheable ones when `None`).
fn target(relid: pg_sys::Oid, names: Option<Vec<String>>) -> Result<Target> {
    let refuse = |why: String| Err(UvmError::new(Code::FeatureNotSupported, why));
    // SAFETY: the relation is locked by the caller; it is opened without a further lock and
    // closed before returning; its descriptor is read within natts.
    unsafe {
        let rel = pg_sys::relation_open(relid, pg_sys::NoLock as i32);
        let form = &*(*rel).rd_rel;
        let kind = form.relkind as u8;
        let persistence = form.relpersistence as u8;
        let partition = form.relispartition;
        let has_children = form.relhassubclass;
        let estimated_rows = if form.reltuples > 0.0 { form.reltuples as u64 } else { 0 };
        let nsp = pg_sys::get_namespace_name(form.relnamespace);
        let qualified = std::ffi::CStr::from_ptr(pg_sys::quote_qualified_identifier(nsp, form.relname.data.as_ptr()))
            .to_string_lossy()
            .into_owned();
        let desc = pgrx::PgTupleDesc::from_pg_unchecked((*rel).rd_att);
        let mut all = Vec::new();
        for att in desc.iter() {
            if att.attisdropped {
                continue;
            }
            let name = std::ffi::CStr::from_ptr(att.attname.data.as_ptr()).to_string_lossy().into_owned();
            all.push((name, att.attnum, att.atttypid, att.atttypmod, att.attcollation));
        }
        drop(desc);
        pg_sys::relation_close(rel, pg_sys::NoLock as i32);
        let name = rel_name(relid);
        if kind != pg_sys::RELKIND_RELATION {
            return refuse(format!("\"{name}\" is not a table: only plain tables are cached"));
        }
        if partition || has_children {
            return refuse(format!("\"{name}\" is a partition or has inheritance children: such tables are not cached"));
        }
        if persistence == pg_sys::RELPERSISTENCE_TEMP {
            return refuse(format!("\"{name}\" is a temporary table: only tables every session sees are cached"));
        }
        let mut columns = Vec::new();
        let wanted: Vec<String> = match names {
            Some(v) => v,
            None => all.iter().filter(|c| cacheable(c.2, c.3, c.4).is_ok()).map(|c| c.0.clone()).collect(),
        };
        if wanted.is_empty() {
            return refuse(format!("\"{name}\" has no column of a type a cache holds"));
        }
        for w in &wanted {
            let Some(&(ref n, attnum, typid, typmod, collation)) = all.iter().find(|c| &c.0 == w) else {
                return Err(UvmError::new(Code::UndefinedColumn, format!("column \"{w}\" of \"{name}\" does not exist")));
            };
            if columns.iter().any(|c: &Chosen| c.spec.attnum == attnum) {
                return Err(UvmError::new(Code::DuplicateObject, format!("column \"{w}\" is named twice")));
            }
            let (encoding, scale) = cacheable(typid, typmod, collation).map_err(|why| {
                UvmError::new(Code::FeatureNotSupported, format!("column \"{w}\" of \"{name}\" cannot be cached: {why}")).hint(
                    "Cached types: bool, int2, int4, int8, float4, float8, date, timestamp, timestamptz, numeric(p, s) with p <= 18, text and varchar of a deterministic collation.",
                )
            })?;
            let q = quote_ident(n);
            let expr = if encoding == Encoding::Numeric { format!("(({q}) * 1e{scale})::int8") } else { q };
            columns.push(Chosen { spec: ColumnSpec { encoding, attnum, scale }, expr });
        }
        Ok(Target { estimated_rows, qualified, columns })
    }
}

/// A build in progress: its directory slot and segment, dropped and freed unless
/// [`Building::done`] is called (an error or a cancel leaves nothing).
struct Building {
    entry: Entry,
    seg: Option<SegRef>,
    dicts: Vec<SegRef>,
}

impl Building {
    fn done(mut self) {
        self.seg = None;
        self.dicts.clear();
        self.entry.slot = usize::MAX;
    }
}

impl Drop for Building {
    fn drop(&mut self) {
        if self.entry.slot == usize::MAX {
            return;
        }
        let (entry, seg, dicts) = (self.entry, self.seg.take(), std::mem::take(&mut self.dicts));
        crate::runtime::held_off(|| {
            let _ = std::panic::catch_unwind(|| {
                if let Ok(d) = directory() {
                    if d.retire(entry.slot, entry.generation) {
                        for seg in seg.iter().chain(&dicts) {
                            let _ = crate::runtime::try_with_executor(|ex| exec::drop(ex, seg));
                        }
                        d.free(entry.slot, entry.generation);
                    }
                }
            });
        });
    }
}

/// Drops the cache of `entry` (its segment, then its slot); false if another process retired
/// it first. 55006 while a reader still holds its segment (the slot stays `Dropping` and the
/// next `cache_drop` or build retries).
fn drop_entry(d: &Directory, e: &Entry) -> Result<bool> {
    if !d.retire(e.slot, e.generation) && d.state_of(e.slot, e.generation) != Some(State::Dropping) {
        return Ok(false);
    }
    let name = segment_name(e.database, e.relation, e.generation);
    let dicts: Vec<String> = crate::registry::shmem::shared()?
        .segments()
        .into_iter()
        .map(|i| i.name)
        .filter(|n| n.strip_prefix(name.as_str()).is_some_and(|rest| rest.starts_with("_d")))
        .collect();
    for n in dicts.iter().chain(std::iter::once(&name)) {
        match lookup_own(n) {
            Ok((seg, _)) => with_executor_result(|ex| exec::drop(ex, &seg))?,
            Err(err) if err.code == Code::UndefinedObject => {}
            Err(err) => return Err(err),
        }
    }
    d.free(e.slot, e.generation);
    Ok(true)
}

/// The name of the dictionary segment of column `attnum` of the cache in segment `cache`.
fn dictionary_name(cache: &str, attnum: i16) -> String {
    format!("{cache}_d{attnum}")
}

/// Bytes the dictionaries of one build may hold in the builder's memory (54000 past it).
const MAX_DICT_MEMORY: u64 = 1 << 30;

fn with_executor_result<R>(f: impl FnOnce(&mut dyn exec::Executor) -> Result<R>) -> Result<R> {
    crate::runtime::try_with_executor(f)
}

/// `uvm.cache_table`: builds (or rebuilds) the cache of `relid`'s `names` columns; returns the
/// rows cached.
pub fn build(relid: pg_sys::Oid, names: Option<Vec<String>>) -> Result<i64> {
    // SAFETY: reads a flag of this process.
    if unsafe { pg_sys::RecoveryInProgress() } {
        return Err(UvmError::new(Code::ObjectNotInPrerequisiteState, "column caches cannot be built during recovery")
            .detail("A standby's tables change by WAL replay, which no cache follows."));
    }
    check_select(relid)?;
    // SAFETY: takes a heavyweight lock held to the end of the transaction.
    unsafe { pg_sys::LockRelationOid(relid, pg_sys::ShareRowExclusiveLock as i32) };
    // SAFETY: a syscache probe.
    if !unsafe {
        pg_sys::SearchSysCacheExists(
            pg_sys::SysCacheIdentifier::RELOID as i32,
            pg_sys::Datum::from(relid),
            0.into(),
            0.into(),
            0.into(),
        )
    } {
        return Err(UvmError::new(Code::UndefinedObject, format!("table {} was dropped", u32::from(relid))));
    }
    let t = target(relid, names)?;
    if subscribed(relid) {
        return Err(UvmError::new(
            Code::FeatureNotSupported,
            format!("\"{}\" is written by a subscription: such tables are not cached", rel_name(relid)),
        )
        .detail("Logical replication's apply worker writes without the hooks that keep a cache current."));
    }
    let d = directory()?;
    let db = database();
    reclaim(d);
    if let Some(old) = d.find(db, u32::from(relid)) {
        drop_entry(d, &old)?;
    }
    // SAFETY: GetUserId reads this backend's current user.
    let entry = d.claim(db, u32::from(relid), u32::from(unsafe { pg_sys::GetUserId() }))?;
    let mut building = Building { entry, seg: None, dicts: Vec::new() };
    let specs: Vec<ColumnSpec> = t.columns.iter().map(|c| c.spec).collect();
    let mut layout = Layout::plan(u32::from(relid), &specs, BLOCK_ROWS)?;
    let name = segment_name(db, u32::from(relid), entry.generation);
    // Sized for the estimated rows at once (one chunk where the estimate holds; growth
    // otherwise), so the segment does not end in a half-empty doubled chunk.
    let first =
        layout.bytes_for(t.estimated_rows.div_ceil(BLOCK_ROWS).max(1)).min(crate::guc::max_segment_size()).min(i64::MAX as u64)
            as i64;
    with_executor_result(|ex| exec::create(ex, &name, first, None, TierPref::Auto, BOOTSTRAP_SUPERUSER, now()))?;
    let (seg, _) = lookup_own(&name)?;
    building.seg = Some(seg);

    // The build's snapshot: the latest, taken under the lock, so every writer has ended.
    // SAFETY: GetLatestSnapshot returns a static snapshot that PushActiveSnapshot copies; it is
    // popped below, or by the transaction's abort after an error.
    let (xmax, builder_xid) = unsafe {
        let snap = pg_sys::GetLatestSnapshot();
        pg_sys::PushActiveSnapshot(snap);
        let s = pg_sys::GetActiveSnapshot();
        (u64::from((*s).xmax.into_inner()), u64::from(pg_sys::GetTopTransactionIdIfAny().into_inner()))
    };
    let select: Vec<&str> = t.columns.iter().map(|c| c.expr.as_str()).collect();
    let query = format!("SELECT {} FROM ONLY {}", select.join(", "), t.qualified);
    let mut dicts: Vec<Option<DictBuilder>> =
        t.columns.iter().map(|c| (c.spec.encoding == Encoding::DictCode).then(DictBuilder::default)).collect();
    let (blocks, rows) = pgrx::spi::Spi::connect(|_| fill(&seg, &layout, &query, &mut dicts))?;
    // SAFETY: pops the snapshot pushed above (the SPI connection is closed).
    unsafe { pg_sys::PopActiveSnapshot() };
    // Each text column's dictionary, a segment of its own, named from the cache's.
    for (col, dict) in dicts.iter().enumerate() {
        let Some(dict) = dict else { continue };
        let attnum = t.columns[col].spec.attnum;
        let dname = dictionary_name(&name, attnum);
        let bytes = dict.to_bytes();
        with_executor_result(|ex| {
            exec::create(ex, &dname, bytes.len() as i64, None, TierPref::Auto, BOOTSTRAP_SUPERUSER, now())
        })?;
        let (dseg, _) = lookup_own(&dname)?;
        building.dicts.push(dseg);
        with_executor_result(|ex| exec::write(ex, &dseg, 0, &bytes))?;
        layout.set_dictionary(col, attnum as u64);
    }
    layout.set_extent(blocks, rows)?;
    layout.stamp(u32::from(relid), xmax, entry.generation);
    with_executor_result(|ex| exec::write(ex, &seg, 0, &layout.prefix()))?;
    let dict_bytes: u64 = building.dicts.iter().filter_map(|d| lookup_own(d.name()).ok()).map(|(_, i)| i.committed).sum();
    let bytes = lookup_own(&name).map(|(_, i)| i.committed).unwrap_or(0) + dict_bytes;
    let built = Built { columns: t.columns.len() as u32, built_xmax: xmax, builder_xid, built_at: now(), rows, bytes };
    d.publish(&entry, &built);
    building.done();
    if builder_xid != 0 {
        // The builder's transaction decides whether the rows it wrote (and the cache holds) are
        // real: its end settles the slot (commit: forget the xid; abort: stale). A prepared
        // transaction settles nothing here: its cache stays unused until rebuilt.
        let (slot, generation) = (entry.slot, entry.generation);
        pgrx::register_xact_callback(pgrx::PgXactCallbackEvent::Commit, move || {
            if let Ok(d) = directory() {
                d.settle_builder(slot, generation, true);
            }
        });
        pgrx::register_xact_callback(pgrx::PgXactCallbackEvent::Abort, move || {
            if let Ok(d) = directory() {
                d.settle_builder(slot, generation, false);
            }
        });
    }
    Ok(rows as i64)
}

/// Reads `query` through a cursor into blocks of `seg`; returns (blocks, rows).
fn fill(seg: &SegRef, layout: &Layout, query: &str, dicts: &mut [Option<DictBuilder>]) -> Result<(u64, u64)> {
    let ncols = dicts.len();
    let q = std::ffi::CString::new(query).map_err(|_| UvmError::new(Code::InvalidParameterValue, "NUL in a name"))?;
    // SAFETY: SPI is connected; read-only, so the cursor runs with the active snapshot (the
    // build's); an error raises an ERROR (a Rust unwind), and the abort closes the portal.
    let portal = unsafe {
        pg_sys::SPI_cursor_open_with_args(
            std::ptr::null(),
            q.as_ptr(),
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null(),
            true,
            0,
        )
    };
    if portal.is_null() {
        return Err(UvmError::new(Code::SystemError, "the cache build opened no cursor"));
    }
    let encodings: Vec<Encoding> = (0..ncols).map(|c| layout.encoding(c).expect("planned column")).collect();
    let (data_offset, block_bytes) = (layout.header().data_offset, layout.header().block_bytes);
    // Block `b` goes at data_offset + b * block_bytes (the layout's extent is set at the end).
    let flush = |b: BlockBuilder, blocks: &mut u64| -> Result<()> {
        let too_many = || UvmError::new(Code::ProgramLimitExceeded, "the cache outgrows a segment");
        let at = blocks.checked_mul(block_bytes).and_then(|x| x.checked_add(data_offset)).ok_or_else(too_many)?;
        let end = at.checked_add(block_bytes).ok_or_else(too_many)?;
        with_executor_result(|ex| exec::grow_at_least(ex, seg, end))?;
        let bytes = b.finish();
        with_executor_result(|ex| exec::write(ex, seg, at as i64, &bytes))?;
        *blocks += 1;
        Ok(())
    };
    let mut block = BlockBuilder::new(layout);
    let (mut blocks, mut rows) = (0u64, 0u64);
    let mut row: Vec<Option<u64>> = vec![None; ncols];
    // Detoasted text lives in a context reset after each batch, not in SPI's for the whole build.
    let mut batch_cx = pgrx::PgMemoryContexts::new("pg_uvm_share cache build");
    loop {
        // SAFETY: an open portal of this SPI connection; SPI_tuptable holds SPI_processed rows
        // of `ncols` by-value columns (the query's), freed after use.
        let n = unsafe {
            pg_sys::SPI_cursor_fetch(portal, true, FETCH_ROWS as std::ffi::c_long);
            let tt = pg_sys::SPI_tuptable;
            if tt.is_null() {
                0
            } else {
                let n = pg_sys::SPI_processed as usize;
                let r: Result<()> = batch_cx.switch_to(|_| {
                    for i in 0..n {
                        let tuple = *(*tt).vals.add(i);
                        for (c, slot) in row.iter_mut().enumerate() {
                            let mut isnull = false;
                            let v = pg_sys::SPI_getbinval(tuple, (*tt).tupdesc, c as i32 + 1, &mut isnull);
                            *slot = match (isnull, &mut dicts[c]) {
                                (true, _) => None,
                                (false, None) => Some(encodings[c].word_of_raw(v.value() as u64)),
                                (false, Some(dict)) => {
                                    // a text datum: its bytes, detoasted into the batch's context
                                    let p = pg_sys::pg_detoast_datum_packed(v.cast_mut_ptr());
                                    let bytes = std::slice::from_raw_parts(
                                        pgrx::varlena::vardata_any(p) as *const u8,
                                        pgrx::varlena::varsize_any_exhdr(p),
                                    );
                                    Some(u64::from(dict.intern(bytes)?))
                                }
                            };
                        }
                        block.push(&row)?;
                        rows += 1;
                        if block.is_full() {
                            flush(std::mem::replace(&mut block, BlockBuilder::new(layout)), &mut blocks)?;
                        }
                    }
                    Ok(())
                });
                batch_cx.reset();
                r?;
                let memory: u64 = dicts.iter().flatten().map(|d| d.memory()).sum();
                if memory > MAX_DICT_MEMORY {
                    return Err(UvmError::new(
                        Code::ProgramLimitExceeded,
                        format!("the text columns' dictionaries outgrow {} MiB", MAX_DICT_MEMORY >> 20),
                    )
                    .hint("Cache text columns of fewer distinct values, or leave them out."));
                }
                pg_sys::SPI_freetuptable(tt);
                n
            }
        };
        crate::interrupt::check()?;
        if n == 0 {
            break;
        }
    }
    if block.rows() > 0 {
        flush(block, &mut blocks)?;
    }
    // SAFETY: the portal is open and closed once.
    unsafe { pg_sys::SPI_cursor_close(portal) };
    Ok((blocks, rows))
}

/// Drops this database's caches whose table no longer exists (a `DROP TABLE` marked them
/// stale; nothing could drop their segments inside the dropping transaction, which might
/// abort), and finishes drops that an error or a reader's pin interrupted (`Dropping`). Best
/// effort: a cache still in use stays for the next call.
fn reclaim(d: &Directory) {
    let db = database();
    for e in d.list() {
        if e.database != db {
            continue;
        }
        if e.state == State::Dropping {
            let _ = drop_entry(d, &e);
            continue;
        }
        if e.state != State::Stale {
            continue;
        }
        // SAFETY: a syscache probe.
        let exists = unsafe {
            pg_sys::SearchSysCacheExists(
                pg_sys::SysCacheIdentifier::RELOID as i32,
                pg_sys::Datum::from(pg_sys::Oid::from(e.relation)),
                0.into(),
                0.into(),
                0.into(),
            )
        };
        if !exists {
            let _ = drop_entry(d, &e);
        }
    }
}

/// `uvm.cache_drop`: drops the cache of `relid`; false if it has none.
pub fn drop_cache(relid: pg_sys::Oid) -> Result<bool> {
    check_select(relid)?;
    let d = directory()?;
    reclaim(d);
    match d.find(database(), u32::from(relid)) {
        Some(e) => drop_entry(d, &e),
        None => Ok(false),
    }
}

/// One row of `uvm.caches`.
pub struct Listed {
    pub relation: u32,
    pub state: &'static str,
    pub columns: Option<Vec<String>>,
    pub rows: i64,
    pub device_bytes: i64,
    pub host_bytes: i64,
    pub built_at: Option<i64>,
    pub last_used: Option<i64>,
    pub segment: String,
}

/// The caches of this database.
pub fn list() -> Result<Vec<Listed>> {
    let d = directory()?;
    reclaim(d);
    let db = database();
    let mut out = Vec::new();
    for e in d.list().into_iter().filter(|e| e.database == db) {
        let name = segment_name(e.database, e.relation, e.generation);
        let (mut device, mut host, mut columns) = (0, 0, None);
        if let Ok((seg, info)) = lookup_own(&name) {
            device = info.bytes_in(crate::registry::Tier::Device) as i64;
            host = info.bytes_in(crate::registry::Tier::Host) as i64;
            if matches!(e.state, State::Ready | State::Stale) {
                columns = read_layout(&seg, &name, info.size)
                    .ok()
                    .map(|l| l.columns().iter().map(|c| attname(e.relation, c.attnum)).collect::<Vec<_>>());
            }
        }
        out.push(Listed {
            relation: e.relation,
            state: e.state.name(),
            columns,
            rows: e.rows as i64,
            device_bytes: device,
            host_bytes: host,
            built_at: (e.built_at != 0).then_some(e.built_at),
            last_used: (e.last_used != 0).then_some(e.last_used),
            segment: name,
        });
    }
    Ok(out)
}

fn attname(relation: u32, attnum: i16) -> String {
    // SAFETY: get_attname with missing_ok returns a palloc'd copy or NULL.
    unsafe {
        let p = pg_sys::get_attname(pg_sys::Oid::from(relation), attnum, true);
        if p.is_null() {
            format!("#{attnum}")
        } else {
            std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    }
}

/// Reads and validates a cache segment's header and column directory.
fn read_layout(seg: &SegRef, name: &str, size: u64) -> Result<Layout> {
    let mut head = vec![0u8; HEADER_BYTES as usize];
    with_executor_result(|ex| exec::read(ex, seg, 0, &mut head))?;
    let mut prefix = vec![0u8; Layout::prefix_len(name, &head)?.min(size) as usize];
    with_executor_result(|ex| exec::read(ex, seg, 0, &mut prefix))?;
    Layout::parse(name, &prefix, size)
}

// --- reading -------------------------------------------------------------------------------

/// Where `cache_fold`'s answer came from, and the answer.
pub struct Folded {
    pub source: &'static str,
    pub rows: i64,
    pub non_null: i64,
    /// The sum as numeric text (integer and numeric columns), else `None`.
    pub sum: Option<String>,
}

/// The cache of `relid` if this query's snapshot may read it, with its layout.
fn usable(relid: pg_sys::Oid) -> Result<Option<(Entry, SegRef, Layout)>> {
    if !crate::guc::ENABLE_CACHE.get() {
        return Ok(None);
    }
    let d = directory()?;
    let Some(e) = d.find(database(), u32::from(relid)) else { return Ok(None) };
    if e.state != State::Ready {
        return Ok(None);
    }
    // SAFETY: reads this transaction's isolation level and active snapshot (a query runs with
    // one); the transaction id functions read the commit log.
    let current = unsafe {
        if pg_sys::XactIsoLevel == pg_sys::XACT_SERIALIZABLE as i32 || !pg_sys::ActiveSnapshotSet() {
            false
        } else {
            let snap = pg_sys::GetActiveSnapshot();
            let xmin = (*snap).xmin;
            // (a builder with an xid clears it when it commits: until then, the heap)
            pg_sys::TransactionIdFollowsOrEquals(xmin, pg_sys::TransactionId::from_inner(e.built_xmax as u32))
                && e.builder_xid == 0
        }
    };
    // The state is read again after the snapshot checks: a writer marks it before it writes.
    if !current || d.state_of(e.slot, e.generation) != Some(State::Ready) || subscribed(relid) {
        return Ok(None);
    }
    let name = segment_name(e.database, e.relation, e.generation);
    let Ok((seg, info)) = lookup_own(&name) else { return Ok(None) };
    // (a segment dropped meanwhile, by a rebuild or cache_drop: the heap answers)
    let layout = match read_layout(&seg, &name, info.size) {
        Err(e) if e.code == Code::UndefinedObject => return Ok(None),
        r => r?,
    };
    let h = layout.header();
    if h.relid != e.relation || h.generation != e.generation {
        return Err(UvmError::new(Code::InvalidParameterValue, format!("segment \"{name}\" holds another cache"))
            .hint("Drop the cache with uvm.cache_drop and build it again."));
    }
    d.touch(e.slot, e.generation, now());
    Ok(Some((e, seg, layout)))
}

/// `uvm.cache_fold`: (rows, non-NULL values, sum) of `column`, from the cache where this
/// snapshot may read it, else from the heap.
pub fn fold(relid: pg_sys::Oid, column: &str) -> Result<Folded> {
    check_select(relid)?;
    let t = target_column(relid, column)?;
    if let Some((_, seg, layout)) = usable(relid)? {
        if let Some(col) = layout.columns().iter().position(|c| c.attnum == t.0) {
            // A rebuild or cache_drop may drop the segment while its blocks are read; the
            // heap, under the same snapshot, answers then.
            match fold_cache(&seg, &layout, col, t.1) {
                Err(e) if e.code == Code::UndefinedObject => {}
                r => return r,
            }
        }
    }
    let q = quote_ident(column);
    let sum = if t.1.is_some() { format!("sum({q})::text") } else { "NULL::text".into() };
    let query = format!("SELECT count(*), count({q}), {sum} FROM ONLY {}", qualified(relid));
    heap_fold(&query)
}

/// Runs the heap's fold read-only, so with the query's own snapshot (the one the cache was
/// refused for), never a newer one.
fn heap_fold(query: &str) -> Result<Folded> {
    let q = std::ffi::CString::new(query).map_err(|_| UvmError::new(Code::InvalidParameterValue, "NUL in a name"))?;
    pgrx::spi::Spi::connect(|_| {
        // SAFETY: SPI is connected; a read-only SELECT of one row of (int8, int8, text); its
        // values are read before the connection closes (the text copied out).
        unsafe {
            let rc = pg_sys::SPI_execute(q.as_ptr(), true, 1);
            let tt = pg_sys::SPI_tuptable;
            if rc != pg_sys::SPI_OK_SELECT as i32 || tt.is_null() || pg_sys::SPI_processed != 1 {
                return Err(UvmError::new(Code::SystemError, format!("the heap's fold returned no row ({rc})")));
            }
            let tuple = *(*tt).vals;
            let desc = (*tt).tupdesc;
            let mut null = false;
            let rows = pg_sys::SPI_getbinval(tuple, desc, 1, &mut null).value() as i64;
            let non_null = pg_sys::SPI_getbinval(tuple, desc, 2, &mut null).value() as i64;
            let text = pg_sys::SPI_getvalue(tuple, desc, 3);
            let sum = (!text.is_null()).then(|| std::ffi::CStr::from_ptr(text).to_string_lossy().into_owned());
            Ok(Folded { source: "heap", rows, non_null, sum })
        }
    })
}

fn qualified(relid: pg_sys::Oid) -> String {
    // SAFETY: catalog lookups of an existing relation (the caller's regclass).
    unsafe {
        let nsp = pg_sys::get_namespace_name(pg_sys::get_rel_namespace(relid));
        let rel = pg_sys::get_rel_name(relid);
        if nsp.is_null() || rel.is_null() {
            return format!("pg_catalog.pg_class WHERE false AND oid = {}", u32::from(relid));
        }
        std::ffi::CStr::from_ptr(pg_sys::quote_qualified_identifier(nsp, rel)).to_string_lossy().into_owned()
    }
}

/// The column's number, and the decimal scale of its sum where it has one (integers: 0).
fn target_column(relid: pg_sys::Oid, column: &str) -> Result<(i16, Option<i16>)> {
    let c = std::ffi::CString::new(column).map_err(|_| UvmError::new(Code::InvalidParameterValue, "NUL in a name"))?;
    // SAFETY: catalog lookups by name.
    let (attnum, typid, typmod) = unsafe {
        let attnum = pg_sys::get_attnum(relid, c.as_ptr());
        if attnum <= 0 {
            return Err(UvmError::new(
                Code::UndefinedColumn,
                format!("column \"{column}\" of \"{}\" does not exist", rel_name(relid)),
            ));
        }
        let mut typid = pg_sys::InvalidOid;
        let mut typmod = -1;
        let mut coll = pg_sys::InvalidOid;
        pg_sys::get_atttypetypmodcoll(relid, attnum, &mut typid, &mut typmod, &mut coll);
        (attnum, typid, typmod)
    };
    let scale = match encoding_of(typid, typmod) {
        Ok((Encoding::Int2 | Encoding::Int4 | Encoding::Int8, _)) => Some(0),
        Ok((Encoding::Numeric, s)) => Some(s),
        _ => None,
    };
    Ok((attnum, scale))
}

fn fold_cache(seg: &SegRef, layout: &Layout, col: usize, scale: Option<i16>) -> Result<Folded> {
    let h = *layout.header();
    let one = layout.one_block();
    let enc = layout.encoding(col).expect("a parsed column");
    let (mut rows, mut non_null, mut sum) = (0u64, 0u64, 0i128);
    let mut buf = vec![0u8; h.block_bytes as usize];
    for b in 0..h.blocks {
        let (at, _) =
            layout.block_at(b).ok_or_else(|| UvmError::new(Code::InvalidParameterValue, "a block past the cache's end"))?;
        with_executor_result(|ex| exec::read(ex, seg, at as i64, &mut buf))?;
        let n = one.block_rows(&buf, 0)?;
        rows += n;
        let (nn, s) = match enc {
            Encoding::Float4 | Encoding::Float8 | Encoding::DictCode => (count_non_null(&one, &buf, col, n)?, 0),
            _ => one.fold_ints(&buf, col)?,
        };
        non_null += nn;
        sum += s;
        crate::interrupt::check()?;
    }
    let sum = scale.map(|s| decimal(sum, s));
    // (as SQL's sum: NULL over no value)
    Ok(Folded { source: "cache", rows: rows as i64, non_null: non_null as i64, sum: sum.filter(|_| non_null > 0) })
}

fn count_non_null(one: &Layout, block: &[u8], col: usize, rows: u64) -> Result<u64> {
    let mut n = 0;
    for r in 0..rows {
        match one.get(block, col, 0, rows, r) {
            Some(Some(_)) => n += 1,
            Some(None) => {}
            None => return Err(UvmError::new(Code::InvalidParameterValue, "the cache's bytes end inside a block")),
        }
    }
    Ok(n)
}

/// `v / 10^scale` as decimal text.
fn decimal(v: i128, scale: i16) -> String {
    if scale <= 0 {
        return v.to_string();
    }
    let s = v.unsigned_abs().to_string();
    let scale = scale as usize;
    let s = if s.len() <= scale { format!("{}{s}", "0".repeat(scale + 1 - s.len())) } else { s };
    let (int, frac) = s.split_at(s.len() - scale);
    format!("{}{int}.{frac}", if v < 0 { "-" } else { "" })
}

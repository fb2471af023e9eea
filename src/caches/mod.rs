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
//! dropped first). A cache without text columns is filled by a parallel heap scan, the
//! builder and parallel workers each writing whole blocks of their own (`parallel.rs`); one with
//! a text or varchar column through a read-only SPI cursor, serially. Text and varchar columns of a deterministic collation are dictionary codes;
//! each column's distinct strings go into a segment of its own (`<cache>_d<attnum>`, its
//! `ColumnDesc::dictionary` the attnum), built in the builder's memory up to 1 GiB.
//!
//! # Staying correct
//!
//! Every statement that may change a cached table marks its cache stale before it changes
//! anything; a stale cache is never read (readers go to the heap) until it is rebuilt (by
//! `cache_table`, or by the background refresher, `refresh.rs`):
//!
//! - `ExecutorStart` (every INSERT, UPDATE, DELETE, MERGE and data-modifying CTE, also from
//!   functions and SPI): each of the plan's result relations. `EXPLAIN` without `ANALYZE` writes
//!   nothing and marks nothing.
//! - `ProcessUtility`: `COPY ... FROM` marks its table; every other utility statement except a
//!   list of ones that change no table's rows (transaction control, `SET`, `VACUUM` and
//!   `CLUSTER`, which keep the rows, `CREATE` of new objects: tables, functions, operators,
//!   types, ...; `GRANT`, ...) marks every cache of the database: `TRUNCATE`, `ALTER TABLE`,
//!   `DROP`, and whatever a later PostgreSQL adds.
//!
//! A mark is made when a statement begins, so a cache built inside a writing statement would
//! miss what the statement writes after the build. `ExecutorStart` and `ExecutorEnd` keep
//! the tables this backend's executors are writing (`marks::being_written`), and the builder
//! refuses those (55006); a utility statement that marks, or an executor that fills a new table
//! (`CREATE TABLE AS`, `SELECT INTO`, under `EXPLAIN ANALYZE` too: its rows go in through a
//! receiver, not a result relation), and had a build inside it (an event trigger's, a
//! function's) marks again when it ends.
//!
//! The hooks are C trampolines (`hooks.c`) around the markers here, so that an ERROR of the
//! statement itself passes through them as PostgreSQL raised it (a Rust hook would convert it
//! through pgrx's FFI guard and lose its position, context and object names).
//!
//! Inserts are the exception (`append.rs`): `cache_table` gives the table a statement-level
//! `AFTER INSERT` trigger with a transition table, and an `INSERT` (without `ON CONFLICT DO
//! UPDATE` or data-modifying CTEs) or `COPY FROM` whose trigger will fire marks nothing: the
//! trigger appends the statement's rows to the cache's tail, each stamped with its transaction,
//! and readers take the tail rows their snapshot sees.
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
//! and parses every byte it reads as untrusted (`Layout::parse`). Every reader (the fold, the
//! plan nodes, the C API) gets a ready cache's layout through `ready_layout`, which checks it
//! once per process against the directory entry (`check_layout`: table, generation, rows; a
//! mismatch is 22023) and the catalog (each column's attribute, encoding and scale; a mismatch
//! makes the cache stale, the heap answering); a reader that counts the
//! blocks' rows compares them with the build's (`Usable::check_rows_read`), and the tail's rows
//! are checked against their columns' types as they are taken (`TailRows::check`).
//!
//! # Files
//!
//! `marks.rs` the writers' marks (with `hooks.c`, their C trampolines), `builder.rs` building
//! (`parallel.rs` its parallel scan, `decode.rs` tuples into words), `append.rs` inserts kept
//! in the tail (`trigger.rs` its trigger in the catalog), `refresh.rs` the background refresher
//! of stale caches, `reader.rs` reading;
//! this file the directory's shared memory, the checks every surface makes (privilege, types,
//! subscriptions), dropping, reclaiming and listing.

use std::sync::atomic::{AtomicPtr, Ordering};

use pgrx::pg_sys;

use crate::cache::dict::DictBuilder;
use crate::cache::directory::{segment_name, Built, Directory, Entry, State};
use crate::cache::{BlockBuilder, ColumnSpec, Encoding, Layout, HEADER_BYTES, MAX_NUMERIC_SCALE};
use crate::error::{Code, Result, UvmError};
use crate::exec::{self, SegRef};
use crate::registry::shmem::Block;
use crate::registry::TierPref;
use crate::runtime::{lookup_own, now, try_executor};

mod append;
mod builder;
mod decode;
mod marks;
mod parallel;
mod reader;
mod refresh;
mod trigger;

pub use append::visible as visible_tail;
pub use builder::build;
pub use marks::init_hooks;
pub use reader::{fold, ready_columns, usable_for, usable_in_query, Folded, Usable};

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

// --- shared by building, reading and listing -------------------------------------------

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
/// the executor's hooks, so such a table is never built or read from a cache); a lookup that
/// fails says yes.
fn subscribed(relid: pg_sys::Oid) -> bool {
    let q = format!("SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_subscription_rel WHERE srrelid = {})", u32::from(relid));
    read_only_bool(&q).ok().flatten().unwrap_or(true)
}

/// The one boolean `query` (a catalog lookup) returns, through a read-only SPI query: a plan
/// node may ask inside a parallel query, where a read-write one (pgrx's `Spi::get_one`) fails
/// ("cannot assign XIDs during a parallel operation").
fn read_only_bool(query: &str) -> pgrx::spi::SpiResult<Option<bool>> {
    pgrx::spi::Spi::connect(|client| client.select(query, Some(1), &[])?.first().get_one::<bool>())
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
        .filter(|n| n.strip_prefix(name.as_str()).is_some_and(|rest| rest.starts_with("_d") || rest == "_tail"))
        .collect();
    // (another process finishing the same drop, a reader's reclaim, may drop a segment
    // between the lookup and the drop: gone is what both want)
    for n in dicts.iter().chain(std::iter::once(&name)) {
        match lookup_own(n).and_then(|(seg, _)| try_executor(|ex| exec::drop(ex, &seg))) {
            Ok(()) => {}
            Err(err) if err.code == Code::UndefinedObject => {}
            Err(err) => return Err(err),
        }
    }
    d.free(e.slot, e.generation);
    Ok(true)
}

/// The name of the segment of strings appends added to the dictionary of column `attnum` of
/// the cache in segment `cache` (`append::MORE`; `_d` like the dictionary's, so the cache's
/// segments are dropped together).
fn more_name(cache: &str, attnum: i16) -> String {
    format!("{}_more", dictionary_name(cache, attnum))
}

/// The strings in use in a dictionary with room reserved (the `more_name` segment `seg` of
/// `size` bytes), as far as its header counts them: the header read first, then the offsets and
/// strings it counts (an appender writes those before the header that counts them, so they are
/// whole), not the unused room; `None` where it holds none. The bytes are for `Dict::parse`.
fn read_added_strings(seg: &SegRef, size: u64) -> Result<Option<Vec<u8>>> {
    use crate::cache::dict::{in_use_len, DICT_HEADER_BYTES};
    let mut bytes = vec![0u8; DICT_HEADER_BYTES.min(size) as usize];
    try_executor(|ex| exec::read(ex, seg, 0, &mut bytes))?;
    let Some(len) = in_use_len(seg.name(), &bytes)? else { return Ok(None) };
    let len = len.min(size);
    bytes
        .try_reserve_exact((len - DICT_HEADER_BYTES) as usize)
        .map_err(|_| UvmError::new(Code::OutOfMemory, "out of memory for a column dictionary"))?;
    bytes.resize(len as usize, 0);
    try_executor(|ex| exec::read(ex, seg, DICT_HEADER_BYTES as i64, &mut bytes[DICT_HEADER_BYTES as usize..]))?;
    Ok(Some(bytes))
}

/// The name of the dictionary segment of column `attnum` of the cache in segment `cache`.
fn dictionary_name(cache: &str, attnum: i16) -> String {
    format!("{cache}_d{attnum}")
}

// --- dropping and listing ------------------------------------------------------------------

/// Drops this database's caches whose table no longer exists (a `DROP TABLE` marked them
/// stale, or a build published after its mark; nothing could drop their segments inside the
/// dropping transaction, which might abort) and every cache of a database that no longer
/// exists, and finishes drops that an error or a reader's pin interrupted (`Dropping`). Best
/// effort: a cache still in use stays for the next call.
fn reclaim(d: &Directory) {
    let db = database();
    for e in d.list() {
        if e.database != db {
            // A cache of a dropped database: no backend of its own will ever reclaim it, and
            // none can be reading it (`DROP DATABASE` waits for its sessions to end).
            if !database_exists(e.database) {
                let _ = drop_entry(d, &e);
            }
            continue;
        }
        if e.state == State::Dropping {
            let _ = drop_entry(d, &e);
            continue;
        }
        // (a `Ready` one too: `DROP TABLE` marks before it waits for the table's lock, so a build
        // that held the lock publishes after the mark; one whose builder has not settled may be
        // of a table created in a transaction still open, which we cannot see)
        if !(e.state == State::Stale || e.state == State::Ready && e.builder_xid == 0) {
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

/// Whether database `oid` exists (by the catalog snapshot: a `DROP DATABASE` not yet committed
/// leaves it).
fn database_exists(oid: u32) -> bool {
    // SAFETY: a syscache probe.
    unsafe {
        pg_sys::SearchSysCacheExists(
            pg_sys::SysCacheIdentifier::DATABASEOID as i32,
            pg_sys::Datum::from(pg_sys::Oid::from(oid)),
            0.into(),
            0.into(),
            0.into(),
        )
    }
}

/// `uvm.cache_drop`: drops the cache of `relid`; false if it has none.
pub fn drop_cache(relid: pg_sys::Oid) -> Result<bool> {
    check_select(relid)?;
    let d = directory()?;
    reclaim(d);
    let dropped = match d.find(database(), u32::from(relid)) {
        Some(e) => drop_entry(d, &e)?,
        None => false,
    };
    // The append trigger goes with the cache (it would keep copying every insert's rows).
    trigger::drop_trigger(relid, &reader::qualified(relid))?;
    Ok(dropped)
}

/// One row of `uvm.caches`.
pub struct Listed {
    pub relation: u32,
    pub state: &'static str,
    pub columns: Option<Vec<String>>,
    pub rows: i64,
    /// Rows inserts appended to its tail since the build (those of aborted transactions too),
    /// and the rows the tail holds at most.
    pub appended_rows: i64,
    pub append_capacity: i64,
    pub device_bytes: i64,
    pub host_bytes: i64,
    /// Parallel workers that built it beside the builder.
    pub build_workers: i32,
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
        // (the append tail's bytes count as the cache's)
        if let Ok((_, info)) = lookup_own(&append::tail_name(&name)) {
            device += info.bytes_in(crate::registry::Tier::Device) as i64;
            host += info.bytes_in(crate::registry::Tier::Host) as i64;
        }
        out.push(Listed {
            relation: e.relation,
            state: e.state.name(),
            columns,
            rows: e.rows as i64,
            appended_rows: e.tail_rows.min(e.tail_capacity) as i64,
            append_capacity: e.tail_capacity as i64,
            device_bytes: device,
            host_bytes: host,
            built_at: (e.built_at != 0).then_some(e.built_at),
            last_used: (e.last_used != 0).then_some(e.last_used),
            segment: name,
            build_workers: e.workers as i32,
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
    // The first read takes as much as most directories need (a cache of nine columns: 416
    // bytes), so that one request usually reads the whole prefix (in service mode each read
    // is a round trip to the service); a longer directory is read again whole.
    let mut prefix = vec![0u8; HEADER_BYTES.max(LAYOUT_FIRST_READ.min(size)) as usize];
    try_executor(|ex| exec::read(ex, seg, 0, &mut prefix))?;
    let len = Layout::prefix_len(name, &prefix[..HEADER_BYTES as usize])?.min(size) as usize;
    if len <= prefix.len() {
        prefix.truncate(len);
    } else {
        prefix = vec![0u8; len];
        try_executor(|ex| exec::read(ex, seg, 0, &mut prefix))?;
    }
    Layout::parse(name, &prefix, size)
}

/// Bytes of a cache segment's first read for its layout ([`read_layout`]).
const LAYOUT_FIRST_READ: u64 = 4096;

/// Layouts of ready caches this process has read, by segment id (with the name and size they
/// were read under): at most [`LAYOUTS_KEPT`], forgotten all at once when full.
struct KnownLayout {
    name: String,
    size: u64,
    layout: Layout,
}

thread_local! {
    static LAYOUTS: std::cell::RefCell<std::collections::HashMap<u64, KnownLayout>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
}

const LAYOUTS_KEPT: usize = 64;

/// [`read_layout`] of a cache published ready as directory entry `e`, read and checked
/// ([`check_layout`]) once per process. A cache's header and column directory are written
/// before it is published and never after (appended rows go to its tail segment, added strings
/// to its dictionaries'), and the registry never gives a segment id to a second segment while
/// the cluster runs, so the layout a process read under an id stays that segment's. The
/// planner and every query over a cache read it: in service mode each read is a request to the
/// GPU service (two per layout), which the SSB at SF 10 showed as most of a query's requests.
///
/// `None` where the layout's columns are not the table's as the catalog has them now: a cache
/// of the table as it was (a build that took the table's lock before an `ALTER TABLE` that had
/// marked the caches: `marks::ended` marks again after such a statement, but a cache published
/// before this release is found here), made stale here so that it is rebuilt, the heap answering
/// meanwhile.
fn ready_layout(seg: &SegRef, name: &str, size: u64, e: &Entry) -> Result<Option<Layout>> {
    let known = LAYOUTS.with(|m| m.borrow().get(&seg.id).filter(|k| k.name == name && k.size == size).map(|k| k.layout.clone()));
    if let Some(layout) = known {
        return Ok(Some(layout));
    }
    let layout = read_layout(seg, name, size)?;
    let mut fits = check_layout(e, name, &layout)?;
    if !fits {
        // A reader holding no lock on the table (`uvm.cache_fold`, the C API) may not have
        // seen the catalog's last change yet: it looks again after taking the invalidations.
        // SAFETY: processes this backend's pending catalog invalidations.
        unsafe { pg_sys::AcceptInvalidationMessages() };
        fits = check_layout(e, name, &layout)?;
    }
    if !fits {
        if let Ok(d) = directory() {
            if d.state_of(e.slot, e.generation) == Some(State::Ready) {
                d.mark_stale(e.database, e.relation, now());
                refresh::launch_if_due(d, e.database);
            }
        }
        return Ok(None);
    }
    LAYOUTS.with(|m| {
        let mut m = m.borrow_mut();
        if m.len() >= LAYOUTS_KEPT {
            m.clear();
        }
        m.insert(seg.id, KnownLayout { name: name.to_string(), size, layout: layout.clone() });
    });
    Ok(Some(layout))
}

/// Checks a ready cache's layout (read from its segment, which any process with the segment
/// owner's privileges can overwrite) against what the cluster itself knows of it: its directory
/// entry `e` (in PostgreSQL's shared memory, which only the extension's code writes) and the
/// table's catalog. `Layout::parse` has bounded every offset; this catches a layout that is
/// well formed but not this cache's, which would answer wrongly rather than fail:
///
/// - the header's table, generation, column count and `rows` are the entry's (`rows` sizes the
///   GpuJoin node's table from a cached inner side and bounds a dimension's groups: a smaller
///   one made the join empty or failed with a hint about full tables);
/// - each column is a live column of the table, none twice, its encoding and scale those its
///   type is cached with today (`cacheable`), and a text column's dictionary reference is its
///   number (the builder's), another column's 0. A change of type makes the cache stale, but a
///   cache can be of the table as it was (see [`ready_layout`]), so a column that disagrees
///   with the catalog answers `Ok(false)`: a cache to rebuild, whatever made it so.
///
/// O(columns) syscache lookups, once per process per cache ([`ready_layout`]). What it cannot
/// see (a block's count changed within its bound, a value changed) the readers bound, and
/// catch where they count.
fn check_layout(e: &Entry, name: &str, layout: &Layout) -> Result<bool> {
    let corrupted = |why: String| {
        Err(crate::cache::overwritten(format!(
            "segment \"{name}\" does not hold the cache of {}: {why}",
            rel_name(pg_sys::Oid::from(e.relation))
        )))
    };
    let h = layout.header();
    if h.relid != e.relation || h.generation != e.generation {
        return corrupted(format!(
            "it holds table {} at generation {}, the cluster's cache is at generation {}",
            h.relid, h.generation, e.generation
        ));
    }
    if h.rows != e.rows || h.columns != e.columns {
        return corrupted(format!(
            "its header counts {} rows in {} columns, its build published {} rows in {}",
            h.rows, h.columns, e.rows, e.columns
        ));
    }
    let mut seen = std::collections::HashSet::new();
    for (i, c) in layout.columns().iter().enumerate() {
        let enc = layout.encoding(i);
        // SAFETY: a syscache lookup of one attribute of the table, released before the return;
        // `cacheable` reads the collation's catalog row.
        let want = unsafe {
            let tup = pg_sys::SearchSysCacheAttNum(pg_sys::Oid::from(e.relation), c.attnum);
            if tup.is_null() {
                None
            } else {
                let att = pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_attribute>(tup);
                let want = (!(*att).attisdropped).then(|| cacheable((*att).atttypid, (*att).atttypmod, (*att).attcollation));
                pg_sys::ReleaseSysCache(tup);
                want
            }
        };
        let reference = if enc == Some(Encoding::DictCode) { c.attnum as u64 } else { 0 };
        let ok = c.attnum >= 1
            && seen.insert(c.attnum)
            && matches!(&want, Some(Ok(w)) if Some(w.0) == enc && w.1 == c.scale)
            && c.dictionary == reference;
        if !ok {
            return Ok(false);
        }
    }
    Ok(true)
}

//! Appends: `INSERT` and `COPY` keep a cached table's cache current (the module essay, "Staying
//! correct"; the tail's format is `uvm_core::cache::tail`).
//!
//! - **Capture.** `cache_table` gives the table a statement-level `AFTER INSERT` trigger with a
//!   transition table ([`TRIGGER`], created as the table's owner by `trigger.rs`; `COPY FROM`
//!   fires it too), so the rows of a statement arrive at once, after the statement inserted them
//!   and before its transaction can commit. The writers' marker (`marks.rs`) leaves such an insert's cache
//!   alone where the trigger will fire (present, enabled for this session's
//!   `session_replication_role`, the cache has a tail); any other write marks it stale as before.
//! - **Append.** The trigger decodes the transition table's rows (`decode.rs`), registers the
//!   top transaction id in the slot's pending list, takes a range of tail rows from the
//!   directory, and writes the records, then the stamps. A text value's word is its code in
//!   its column's dictionary ([`Codes`], read once per backend and build), or for a string the
//!   dictionary lacks a code past it among the column's added strings ([`add_strings`], under
//!   a lock, written before the records). A tail too small, a full pending list, a numeric NaN,
//!   added strings past their room, or any error of the cache's own machinery marks the cache
//!   stale instead: the insert itself never fails for the cache's sake (a cancel still cancels
//!   it).
//! - **Settle.** At its end the transaction settles: a commit takes its id off the pending
//!   list; an abort, a rollback to a savepoint that appended, or a `PREPARE TRANSACTION` marks
//!   the cache stale first (its rows stay in the tail, unreachable). So a reader never asks the
//!   commit log about a tail row.
//! - **Read** ([`visible`]): a reader takes a tail row when its transaction is not running for
//!   the reader's snapshot (`XidInMVCCSnapshot`) and is not pending; it declines the cache (the
//!   heap answers) when the tail holds its own transaction's rows (their command ids are not
//!   kept), or a row of a transaction that ended but has not settled yet (microseconds), or when
//!   the transaction ids have aged past a billion (wraparound would make them look running).

use std::cell::RefCell;
use std::collections::HashMap;

use super::trigger::TRIGGER;
use super::*;
use crate::cache::tail::{Tail, TailRows, MAX_TAIL_COLUMNS, TAIL_HEADER_BYTES};

/// Transaction ids this old (from the next one) make a tail unreadable: a rebuild is due.
const MAX_XID_AGE: u32 = 1 << 30;

/// The tail segment of the cache in segment `cache`.
pub(super) fn tail_name(cache: &str) -> String {
    format!("{cache}_tail")
}

/// Rows the tail of a cache built now holds (`pg_uvm_share.cache_append_rows`).
pub(super) fn capacity() -> u64 {
    crate::guc::CACHE_APPEND_ROWS.get().max(0) as u64
}

/// Whether a cache of `specs` can take appends: at most the tail's columns. (A dictionary
/// column's rows append where their strings are in its dictionary: see [`Codes`].)
pub(super) fn appendable(specs: &[ColumnSpec]) -> bool {
    specs.len() <= MAX_TAIL_COLUMNS as usize
}

/// A dictionary this large (its segment's bytes) is not loaded by an appender: its table's
/// inserts of a text value make the cache stale instead (the backend's map would hold every
/// string again).
const MAX_LOOKUP_BYTES: u64 = 64 << 20;

/// How an appender finds a text column's code: the strings of its dictionary, by their bytes
/// (`len` of them). A dictionary is never changed after its build (kernels read its codes in
/// place), so a string it lacks gets a code past them in the column's segment of added strings
/// ([`MORE`], [`add_strings`]), under a lock that gives equal strings one code (as `GROUP BY`
/// needs); where that is full, the insert makes the cache stale and the next build takes the
/// strings in.
enum Codes {
    /// Not a dictionary column.
    None,
    Map {
        map: HashMap<Vec<u8>, u32>,
        len: u32,
    },
    /// Past [`MAX_LOOKUP_BYTES`]: no string is looked up.
    TooLarge,
}

/// The room for strings appends add to a text column's dictionary (each column's segment,
/// `more_name`, made with the cache when it takes appends, in the cpu tier: only CPU code reads it): 4,096 strings of
/// 256 KiB in all, about 290 KiB a column.
pub(super) const MORE: crate::cache::dict::Reserved = crate::cache::dict::Reserved { entries: 4096, bytes: 256 << 10 };

/// A row's word for a string its dictionary lacks, before [`add_strings`] gave it its code:
/// this bit and the string's index among the statement's new strings of its column.
const PENDING: u64 = 1 << 63;

// --- appending -------------------------------------------------------------------------------

/// A cache this transaction appended to, and the deepest subtransaction level it appended at
/// that has not committed into its parent.
#[derive(Clone, Copy)]
struct Appended {
    slot: usize,
    generation: u64,
    relation: u32,
    xid: u32,
    level: i32,
}

thread_local! {
    static APPENDED: RefCell<Vec<Appended>> = const { RefCell::new(Vec::new()) };
    static CALLBACKS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn stale(relation: u32) {
    if let Ok(d) = directory() {
        d.mark_stale(database(), relation, now());
        super::refresh::launch_if_due(d, database());
    }
}

/// The trigger's work: appends the transition table's rows to the cache of `rel`.
///
/// # Safety
/// `rel` is the trigger's open relation and `rows` its transition table of new rows.
unsafe fn append(rel: pg_sys::Relation, rows: *mut pg_sys::Tuplestorestate) -> Result<()> {
    // SAFETY: forwarded contract.
    let relid = u32::from(unsafe { (*rel).rd_id });
    let d = directory()?;
    let Some(e) = d.find(database(), relid).filter(|e| e.state == State::Ready) else { return Ok(()) };
    if e.tail_capacity == 0 {
        stale(relid);
        return Ok(());
    }
    let Some(t) = target(&e)? else {
        stale(relid);
        return Ok(());
    };
    let (tail, tseg) = (t.tail, &t.tseg);
    // SAFETY: forwarded contract.
    let Some(new) = (unsafe { read_rows(rel, rows, &t, e.tail_capacity)? }) else {
        stale(relid);
        return Ok(());
    };
    if new.is_empty() {
        return Ok(());
    }
    // SAFETY: assigns (or returns) this transaction's top id; the insert already has one.
    let xid = unsafe { pg_sys::GetTopTransactionId() }.into_inner();
    if !remember(d, &e, xid) {
        stale(relid);
        return Ok(());
    }
    let Some(start) = d.reserve_tail(e.slot, e.generation, new.len() as u64) else {
        stale(relid);
        return Ok(());
    };
    // The records, then the stamps that make them rows (the format's order).
    let records = tail.encode(&new)?;
    try_executor(|ex| exec::write(ex, tseg, tail.record_at(start) as i64, &records))?;
    try_executor(|ex| exec::write(ex, tseg, tail.stamp_at(start) as i64, &Tail::stamps(xid, new.len())))?;
    Ok(())
}

/// What an appender needs of a cache: its columns, its tail's geometry and segment, and per
/// column how its strings' codes are found.
struct Target {
    /// The cache's segment name.
    name: String,
    specs: Vec<ColumnSpec>,
    tail: Tail,
    tseg: SegRef,
    codes: Vec<Codes>,
}

thread_local! {
    /// The targets this backend appended to, by (slot, generation): a generation names one
    /// build, whose layout and tail never change, so each is read from its segments once.
    static TARGETS: RefCell<HashMap<(usize, u64), std::rc::Rc<Target>>> = RefCell::new(HashMap::new());
}

/// The append target of the cache `e` (`None`: it cannot take appends).
fn target(e: &Entry) -> Result<Option<std::rc::Rc<Target>>> {
    if let Some(t) = TARGETS.with(|m| m.borrow().get(&(e.slot, e.generation)).cloned()) {
        return Ok(Some(t));
    }
    let name = segment_name(e.database, e.relation, e.generation);
    let (seg, info) = lookup_own(&name)?;
    let layout = read_layout(&seg, &name, info.size)?;
    let specs: Vec<ColumnSpec> = layout
        .columns()
        .iter()
        .enumerate()
        .map(|(i, c)| ColumnSpec { encoding: layout.encoding(i).expect("parsed"), attnum: c.attnum, scale: c.scale })
        .collect();
    if !appendable(&specs) || specs.iter().any(|c| c.attnum <= 0) {
        return Ok(None);
    }
    let tname = tail_name(&name);
    let (tseg, tinfo) = lookup_own(&tname)?;
    let mut head = [0u8; TAIL_HEADER_BYTES as usize];
    try_executor(|ex| exec::read(ex, &tseg, 0, &mut head))?;
    let tail = Tail::parse(&tname, &head, tinfo.size, e.relation, e.generation, specs.len() as u32, e.tail_capacity)?;
    let mut codes = Vec::with_capacity(specs.len());
    for c in &specs {
        codes.push(if c.encoding == Encoding::DictCode { dictionary_codes(&name, c.attnum)? } else { Codes::None });
    }
    let t = std::rc::Rc::new(Target { name, specs, tail, tseg, codes });
    TARGETS.with(|m| {
        let mut m = m.borrow_mut();
        // (at most 64 caches, and their dictionaries' maps within MAX_LOOKUP_BYTES together:
        // the targets are read again when needed)
        let held: u64 = m.values().chain(std::iter::once(&t)).map(|t| t.lookup_bytes()).sum();
        if m.len() >= 64 || held > MAX_LOOKUP_BYTES {
            m.clear();
        }
        m.insert((e.slot, e.generation), t.clone());
    });
    Ok(Some(t))
}

impl Target {
    /// About what its dictionaries' maps hold: each string's bytes and an entry's overhead.
    fn lookup_bytes(&self) -> u64 {
        let map = |c: &Codes| match c {
            Codes::Map { map, .. } => map.keys().map(|k| k.len() as u64 + 48).sum(),
            _ => 0,
        };
        self.codes.iter().map(map).sum()
    }
}

/// The codes of the dictionary of column `attnum` of the cache in segment `cache`, read whole
/// (once per backend and build: [`TARGETS`]).
fn dictionary_codes(cache: &str, attnum: i16) -> Result<Codes> {
    let (seg, info) = lookup_own(&super::dictionary_name(cache, attnum))?;
    if info.size > MAX_LOOKUP_BYTES {
        return Ok(Codes::TooLarge);
    }
    let mut bytes = Vec::new();
    bytes
        .try_reserve_exact(info.size as usize)
        .map_err(|_| UvmError::new(Code::OutOfMemory, "out of memory for a column dictionary"))?;
    bytes.resize(info.size as usize, 0u8);
    try_executor(|ex| exec::read(ex, &seg, 0, &mut bytes))?;
    let dict = crate::cache::dict::Dict::parse(seg.name(), &bytes)?;
    let mut map = HashMap::new();
    map.try_reserve(dict.len() as usize)
        .map_err(|_| UvmError::new(Code::OutOfMemory, "out of memory for a column dictionary's codes"))?;
    for (code, s) in dict.iter() {
        map.insert(s.to_vec(), code);
    }
    Ok(Codes::Map { map, len: dict.len() as u32 })
}

/// The transition table's rows as words; `None` where one cannot be cached (a numeric NaN or
/// infinity, a text column's strings past its room for added ones, or any string of a column
/// whose dictionary is too large to look up) or there are more than `limit`.
///
/// # Safety
/// As [`append`].
unsafe fn read_rows(
    rel: pg_sys::Relation,
    store: *mut pg_sys::Tuplestorestate,
    t: &Target,
    limit: u64,
) -> Result<Option<Vec<Vec<Option<u64>>>>> {
    let (specs, codes) = (&t.specs, &t.codes);
    let mut decoder = super::decode::Decoder::new(specs);
    let mut out = Vec::new();
    // per column, the statement's strings its dictionary lacks (in first-seen order)
    let mut new: Vec<NewStrings> = specs.iter().map(|_| Default::default()).collect();
    let mut row = vec![None; specs.len()];
    // SAFETY: forwarded contract: a read pointer of our own over the transition table (others'
    // readers select theirs before they read), a slot of the table's row type dropped below.
    unsafe {
        let slot = pg_sys::MakeSingleTupleTableSlot((*rel).rd_att, &pg_sys::TTSOpsMinimalTuple);
        // (REWIND: the new pointer starts where pointer 0 is, and is rewound to the start)
        let ptr = pg_sys::tuplestore_alloc_read_pointer(store, pg_sys::EXEC_FLAG_REWIND as i32);
        pg_sys::tuplestore_select_read_pointer(store, ptr);
        pg_sys::tuplestore_rescan(store);
        let mut representable = true;
        while pg_sys::tuplestore_gettupleslot(store, true, false, slot) {
            if out.len() as u64 >= limit {
                representable = false;
                break;
            }
            if decoder.decode(slot, &mut row, false) == super::decode::Decoded::Unrepresentable {
                representable = false;
                break;
            }
            // a text value's word: its code in the column's dictionary (the decoder read the
            // slot's attributes up to every column's)
            for (c, spec) in specs.iter().enumerate() {
                let (Codes::Map { .. } | Codes::TooLarge) = &codes[c] else { continue };
                let a = spec.attnum.max(1) as usize - 1;
                if *(*slot).tts_isnull.add(a) {
                    row[c] = None;
                    continue;
                }
                let Codes::Map { map, .. } = &codes[c] else {
                    representable = false;
                    break;
                };
                let p = pg_sys::pg_detoast_datum_packed((*(*slot).tts_values.add(a)).cast_mut_ptr());
                let bytes =
                    std::slice::from_raw_parts(pgrx::varlena::vardata_any(p) as *const u8, pgrx::varlena::varsize_any_exhdr(p));
                row[c] = Some(match map.get(bytes) {
                    Some(&code) => u64::from(code),
                    None => {
                        let (list, index) = &mut new[c];
                        match index.get(bytes) {
                            Some(&i) => PENDING | i,
                            None => {
                                let i = list.len() as u64;
                                list.push(bytes.to_vec());
                                index.insert(bytes.to_vec(), i);
                                PENDING | i
                            }
                        }
                    }
                });
                if p as *mut std::ffi::c_void != (*(*slot).tts_values.add(a)).cast_mut_ptr() {
                    pg_sys::pfree(p as *mut std::ffi::c_void);
                }
            }
            if !representable {
                break;
            }
            out.push(row.clone());
        }
        pg_sys::ExecDropSingleTupleTableSlot(slot);
        if !representable {
            return Ok(None);
        }
        // The new strings' codes, then the rows' words that wait for them.
        for (c, (list, _)) in new.iter().enumerate() {
            let Codes::Map { len, .. } = &codes[c] else { continue };
            if list.is_empty() {
                continue;
            }
            let Some(given) = add_strings(&t.name, (*rel).rd_id, specs[c].attnum, *len, list)? else { return Ok(None) };
            for row in &mut out {
                if let Some(w) = row[c].as_mut().filter(|w| **w & PENDING != 0) {
                    *w = u64::from(given[(*w & !PENDING) as usize]);
                }
            }
        }
        Ok(Some(out))
    }
}

/// A statement's strings of one column that its dictionary lacks, in first-seen order, and
/// each one's index among them.
type NewStrings = (Vec<Vec<u8>>, HashMap<Vec<u8>, u64>);

/// Holds the lock on a column's added strings (a lock on an object of our own, so no other
/// lock waits on it) until dropped; an ERROR's abort releases it instead.
struct StringsLock {
    relid: pg_sys::Oid,
    sub: u16,
}

impl StringsLock {
    fn take(relid: pg_sys::Oid, attnum: i16) -> StringsLock {
        // (past the attribute numbers, so no object a catalog lock names)
        let sub = 0x8000 | (attnum.max(0) as u16);
        // SAFETY: a heavyweight lock of this backend's transaction, on an object no catalog
        // operation locks; it waits (answering cancel) while another appender holds it.
        unsafe { pg_sys::LockDatabaseObject(pg_sys::RelationRelationId, relid, sub, pg_sys::ExclusiveLock as i32) };
        StringsLock { relid, sub }
    }
}

impl Drop for StringsLock {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            // SAFETY: the lock this guard took, still held.
            unsafe {
                pg_sys::UnlockDatabaseObject(pg_sys::RelationRelationId, self.relid, self.sub, pg_sys::ExclusiveLock as i32)
            };
        }
    }
}

/// The codes of `strings` (distinct, none in the column's dictionary of `base` strings) among
/// the strings appends added to column `attnum` of the cache in segment `cache` of table
/// `relid`: those added before keep theirs, the others are added under the column's lock;
/// `None` where they do not fit [`MORE`].
fn add_strings(cache: &str, relid: pg_sys::Oid, attnum: i16, base: u32, strings: &[Vec<u8>]) -> Result<Option<Vec<u32>>> {
    let (seg, info) = lookup_own(&super::more_name(cache, attnum))?;
    if info.size < MORE.size() {
        return Ok(None);
    }
    let _lock = StringsLock::take(relid, attnum);
    let bytes = match read_added_strings(&seg, MORE.size())? {
        Some(bytes) => bytes,
        None => MORE.empty_parsable(),
    };
    let more = crate::cache::dict::Dict::parse(seg.name(), &bytes)?;
    let known: HashMap<&[u8], u32> = more.iter().map(|(c, s)| (s, c)).collect();
    let mut codes = Vec::with_capacity(strings.len());
    let mut added: Vec<&[u8]> = Vec::new();
    for s in strings {
        let i = match known.get(s.as_slice()) {
            Some(&i) => i,
            None => {
                added.push(s);
                more.len() as u32 + added.len() as u32 - 1
            }
        };
        let Some(code) = base.checked_add(i).filter(|&c| u64::from(c) < crate::cache::dict::MAX_ENTRIES) else { return Ok(None) };
        codes.push(code);
    }
    if !added.is_empty() {
        let Some(a) = MORE.append(&more, &added) else { return Ok(None) };
        // the strings and their offsets, then the header that counts them
        for (at, b) in [a.strings, a.offsets, (0, a.header)] {
            try_executor(|ex| exec::write(ex, &seg, at as i64, &b))?;
        }
    }
    Ok(Some(codes))
}

/// Puts `xid` on the slot's pending list once per transaction and cache, with the callbacks
/// that settle it, and notes the subtransaction level; false where the list is full.
fn remember(d: &Directory, e: &Entry, xid: u32) -> bool {
    // SAFETY: reads this backend's subtransaction depth.
    let level = unsafe { pg_sys::GetCurrentTransactionNestLevel() };
    // (the deepest level an append is still open at: a rollback to any savepoint at or above
    // it undoes rows of the tail)
    let known = APPENDED.with(|a| {
        let mut a = a.borrow_mut();
        let found = a.iter_mut().find(|x| x.slot == e.slot && x.generation == e.generation);
        found.map(|x| x.level = x.level.max(level)).is_some()
    });
    if known {
        return true;
    }
    if !d.add_pending(e.slot, e.generation, xid) {
        return false;
    }
    APPENDED.with(|a| a.borrow_mut().push(Appended { slot: e.slot, generation: e.generation, relation: e.relation, xid, level }));
    ensure_callbacks();
    true
}

fn ensure_callbacks() {
    if !CALLBACKS.with(|c| c.replace(true)) {
        // SAFETY: registered once per backend; the callbacks only touch this module's lists
        // and the directory's atomics.
        unsafe {
            pg_sys::RegisterXactCallback(Some(on_xact), std::ptr::null_mut());
            pg_sys::RegisterSubXactCallback(Some(on_subxact), std::ptr::null_mut());
        }
    }
}

thread_local! {
    /// The caches (slot, generation) this transaction built with an xid, which its end settles.
    static SETTLE: RefCell<Vec<(usize, u64)>> = const { RefCell::new(Vec::new()) };
}

/// The cache built in `slot` at `generation` by this transaction (which has an xid) is settled
/// when it ends: a commit lets readers in, an abort or a `PREPARE TRANSACTION` makes it stale.
/// (Not pgrx's transaction callbacks: they fire for neither end of a prepared transaction and
/// stay registered until the backend's next commit, which then settled the build as
/// committed, rolled back or not, and readers saw the prepared transaction's writes.)
pub(super) fn settle_at_end(slot: usize, generation: u64) {
    SETTLE.with(|s| s.borrow_mut().push((slot, generation)));
    ensure_callbacks();
}

thread_local! {
    /// The tables whose caches this transaction built inside a subtransaction, each with the
    /// deepest subtransaction level the build belongs to that has not committed into its
    /// parent.
    static BUILT: RefCell<Vec<(u32, i32)>> = const { RefCell::new(Vec::new()) };
}

/// A build of `relation`'s cache published it: where it ran inside a subtransaction, the abort
/// of that subtransaction (or of one it committed into) makes the cache stale. The build read
/// the table with a snapshot that sees the subtransaction's own writes, which the abort undoes
/// while the top transaction, whose end settles the build (`builder.rs`), may still commit.
pub(super) fn built(relation: u32) {
    // SAFETY: reads this backend's subtransaction depth.
    let level = unsafe { pg_sys::GetCurrentTransactionNestLevel() };
    if level > 1 {
        BUILT.with(|b| b.borrow_mut().push((relation, level)));
        ensure_callbacks();
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn on_xact(event: pg_sys::XactEvent::Type, _arg: *mut std::ffi::c_void) {
    use pg_sys::XactEvent::*;
    let abort = match event {
        XACT_EVENT_COMMIT | XACT_EVENT_PARALLEL_COMMIT => false,
        // (a prepared transaction's rows would wait for a COMMIT PREPARED nobody here sees)
        XACT_EVENT_ABORT | XACT_EVENT_PARALLEL_ABORT | XACT_EVENT_PRE_PREPARE => true,
        _ => return,
    };
    BUILT.with(|b| b.borrow_mut().clear());
    let builds = SETTLE.with(|s| std::mem::take(&mut *s.borrow_mut()));
    let all = APPENDED.with(|a| std::mem::take(&mut *a.borrow_mut()));
    let Ok(d) = directory() else { return };
    for (slot, generation) in builds {
        d.settle_builder(slot, generation, !abort, now());
    }
    for x in all {
        if abort {
            d.mark_stale(database(), x.relation, now());
        }
        d.remove_pending(x.slot, x.xid);
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn on_subxact(
    event: pg_sys::SubXactEvent::Type,
    _my: pg_sys::SubTransactionId,
    _parent: pg_sys::SubTransactionId,
    _arg: *mut std::ffi::c_void,
) {
    // SAFETY: reads this backend's subtransaction depth (the ending subtransaction's).
    let level = unsafe { pg_sys::GetCurrentTransactionNestLevel() };
    match event {
        pg_sys::SubXactEvent::SUBXACT_EVENT_ABORT_SUB => {
            let undone: Vec<u32> = BUILT.with(|b| {
                let mut b = b.borrow_mut();
                let undone = b.iter().filter(|x| x.1 >= level).map(|x| x.0).collect();
                b.retain(|x| x.1 < level);
                undone
            });
            let Ok(d) = directory() else { return };
            for relation in undone {
                d.mark_stale(database(), relation, now());
            }
            APPENDED.with(|a| {
                for x in a.borrow().iter().filter(|x| x.level >= level) {
                    d.mark_stale(database(), x.relation, now());
                }
            });
        }
        pg_sys::SubXactEvent::SUBXACT_EVENT_COMMIT_SUB => {
            BUILT.with(|b| {
                for x in b.borrow_mut().iter_mut().filter(|x| x.1 >= level) {
                    x.1 = level - 1;
                }
            });
            APPENDED.with(|a| {
                for x in a.borrow_mut().iter_mut().filter(|x| x.level >= level) {
                    x.level = level - 1;
                }
            })
        }
        _ => {}
    }
}

/// The trigger function `uvm.cache_append()` (V1 calling convention).
///
/// # Safety
/// Called by PostgreSQL's trigger manager as declared in `src/sql/cache.rs`.
#[pgrx::pg_guard]
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn uvm_cache_append(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: PostgreSQL hands a valid call; a trigger's context is its TriggerData.
    unsafe {
        let cx = (*fcinfo).context;
        if cx.is_null() || (*cx).type_ != pg_sys::NodeTag::T_TriggerData {
            crate::runtime::report(UvmError::new(
                Code::FeatureNotSupported,
                "uvm.cache_append() is a trigger function: pg_uvm_share creates the trigger that calls it",
            ));
        }
        let td = cx as *mut pg_sys::TriggerData;
        let ev = (*td).tg_event;
        let statement_insert = ev & pg_sys::TRIGGER_EVENT_OPMASK == pg_sys::TRIGGER_EVENT_INSERT
            && ev & pg_sys::TRIGGER_EVENT_ROW == 0
            && ev & pg_sys::TRIGGER_EVENT_TIMINGMASK == pg_sys::TRIGGER_EVENT_AFTER
            && !(*td).tg_newtable.is_null();
        let rel = (*td).tg_relation;
        if !statement_insert {
            // Not the trigger we create: the marker did not count on it, nothing to keep.
            return pg_sys::Datum::from(0);
        }
        let trigger = (*td).tg_trigger;
        if trigger.is_null() || std::ffi::CStr::from_ptr((*trigger).tgname).to_bytes() != TRIGGER.as_bytes() {
            // Fired by a trigger of another name (ours renamed, or one a user made): the marker
            // counts only on ours, which may fire for this statement too, so appending here
            // could add its rows twice. The cache goes stale instead.
            stale(u32::from((*rel).rd_id));
            return pg_sys::Datum::from(0);
        }
        if let Err(e) = append(rel, (*td).tg_newtable) {
            if e.code == Code::QueryCanceled {
                crate::runtime::report(e);
            }
            // The cache's trouble is not the insert's: the cache goes stale, the rows go in.
            pgrx::debug1!("pg_uvm_share: an insert made the cache of table {} stale: {}", u32::from((*rel).rd_id), e.message);
            stale(u32::from((*rel).rd_id));
        }
        pg_sys::Datum::from(0)
    }
}

#[unsafe(no_mangle)]
#[doc(hidden)]
pub extern "C" fn pg_finfo_uvm_cache_append() -> &'static pg_sys::Pg_finfo_record {
    const V1: pg_sys::Pg_finfo_record = pg_sys::Pg_finfo_record { api_version: 1 };
    &V1
}

// --- reading -----------------------------------------------------------------------------------

/// The tail rows of the cache `u` that `snap` sees (`Some(vec![])` for an empty tail), or
/// `None` where the reader must use the heap instead (the module comment, "Read").
///
/// # Safety
/// `snap` is a live MVCC snapshot (the one `u` was found usable for), valid for the call.
pub unsafe fn visible(u: &Usable, snap: pg_sys::Snapshot) -> Result<Option<TailRows>> {
    let d = directory()?;
    let e = &u.entry;
    let Some(n) = d.tail_rows(e.slot, e.generation) else { return Ok(None) };
    if n == 0 || e.tail_capacity == 0 {
        return Ok(Some(TailRows::none()));
    }
    let ncols = u.layout.columns().len() as u32;
    let tname = tail_name(u.seg.name());
    let (tseg, tinfo) = match lookup_own(&tname) {
        Ok(x) => x,
        Err(err) if err.code == Code::UndefinedObject => return Ok(None),
        Err(err) => return Err(err),
    };
    let mut head = [0u8; TAIL_HEADER_BYTES as usize];
    try_executor(|ex| exec::read(ex, &tseg, 0, &mut head))?;
    let tail = Tail::parse(&tname, &head, tinfo.size, e.relation, e.generation, ncols, e.tail_capacity)?;
    // The stamps first, the records after (the format's order).
    let mut stamps = vec![0u8; 4 * n as usize];
    try_executor(|ex| exec::read(ex, &tseg, tail.stamp_at(0) as i64, &mut stamps))?;
    let mut records = vec![0u8; (tail.record_bytes() * n) as usize];
    try_executor(|ex| exec::read(ex, &tseg, tail.record_at(0) as i64, &mut records))?;
    let mut rows = tail.rows(stamps, records);
    crate::interrupt::check()?;
    // SAFETY: reads the next transaction id (a shared counter, under its own lock).
    let next = unsafe { pg_sys::ReadNextFullTransactionId() }.value as u32;
    // Each transaction's verdict once (its rows lie together, so the last one answers most).
    let mut seen: HashMap<u32, bool> = HashMap::new();
    let mut last: Option<(u32, bool)> = None;
    let (mut decline, mut counted) = (false, 0u32);
    rows.retain(|xid| {
        counted = counted.wrapping_add(1);
        if counted.is_multiple_of(1 << 16) {
            pg_sys::check_for_interrupts!();
        }
        if decline {
            return false;
        }
        if let Some((_, t)) = last.filter(|l| l.0 == xid) {
            return t;
        }
        let t = match seen.get(&xid) {
            Some(&t) => t,
            None => {
                let x = pg_sys::TransactionId::from_inner(xid);
                // SAFETY: transaction id tests against this backend's state and the reader's
                // live MVCC snapshot (the contract).
                let (mine, running) =
                    unsafe { (pg_sys::TransactionIdIsCurrentTransactionId(x), pg_sys::XidInMVCCSnapshot(x, snap)) };
                if next.wrapping_sub(xid) > MAX_XID_AGE || mine {
                    // too old to compare, or this transaction's own rows (no command ids kept)
                    decline = true;
                    return false;
                }
                let t = if running {
                    false
                } else if d.is_pending(e.slot, xid) {
                    // ended, not settled: committed or aborted a moment ago
                    decline = true;
                    return false;
                } else {
                    true
                };
                seen.insert(xid, t);
                t
            }
        };
        last = Some((xid, t));
        t
    });
    // An abort marks the cache stale before it leaves the pending list.
    if decline || d.state_of(e.slot, e.generation) != Some(State::Ready) {
        return Ok(None);
    }
    // (the rows' words as any reader takes them: a word its type cannot hold is no value)
    let encodings: Vec<Encoding> = (0..ncols as usize).filter_map(|i| u.layout.encoding(i)).collect();
    rows.check(&tname, &encodings)?;
    Ok(Some(rows))
}

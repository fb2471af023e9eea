//! The append trigger in the catalog (`append.rs` is what it does): `cache_table` gives a
//! cached table a statement-level `AFTER INSERT` trigger with a transition table, named
//! [`TRIGGER`] and calling the extension's [`FUNCTION`]. It is the table's, made and dropped
//! with the owner's rights whoever builds or drops the cache ([`ensure_trigger`],
//! [`drop_trigger`]). The writers' marker (`marks.rs`) asks [`insert_appends`] whether an
//! insert will reach it (present, enabled for the session's `session_replication_role`, of that
//! shape, calling our function), and leaves the cache alone only then.

use super::*;

/// The trigger `cache_table` creates (our prefix, so no user's trigger is taken for it).
pub(super) const TRIGGER: &str = "pg_uvm_share_cache_append";
/// Its function, in the extension's schema.
const FUNCTION: &str = "cache_append";

/// Runs `f` as the owner of `relid` (our trigger is the table's, made and dropped with the
/// owner's rights whoever builds the cache), with the writers' marks off: the DDL changes no
/// rows.
fn as_owner<T>(relid: pg_sys::Oid, f: impl FnOnce() -> Result<T>) -> Result<T> {
    // SAFETY: a syscache lookup of an existing, locked relation; the security context is saved
    // and restored (an ERROR in between aborts the transaction, which restores it).
    unsafe {
        let rel = pg_sys::relation_open(relid, pg_sys::NoLock as i32);
        let owner = (*(*rel).rd_rel).relowner;
        pg_sys::relation_close(rel, pg_sys::NoLock as i32);
        let (mut user, mut context) = (pg_sys::InvalidOid, 0);
        pg_sys::GetUserIdAndSecContext(&mut user, &mut context);
        pg_sys::SetUserIdAndSecContext(owner, context | pg_sys::SECURITY_LOCAL_USERID_CHANGE as i32);
        let r = super::marks::quietly(f);
        pg_sys::SetUserIdAndSecContext(user, context);
        r
    }
}

/// The names of `relid`'s triggers that call the append function: the one `cache_table`
/// creates, or one a user renamed or made.
fn our_triggers(relid: pg_sys::Oid) -> Result<Vec<String>> {
    let q = format!(
        "SELECT tgname::text FROM pg_catalog.pg_trigger WHERE tgrelid = {} \
         AND tgfoid = '{}.{FUNCTION}()'::pg_catalog.regprocedure ORDER BY tgname",
        u32::from(relid),
        extension_schema()
    );
    pgrx::spi::Spi::connect(|client| {
        let mut names = Vec::new();
        for row in client.select(&q, None, &[])? {
            if let Some(n) = row.get::<String>(1)? {
                names.push(n);
            }
        }
        Ok(names)
    })
    .map_err(|e: pgrx::spi::SpiError| UvmError::new(Code::SystemError, format!("looking up the cache's trigger: {e}")))
}

fn run_ddl(sql: &str) -> Result<()> {
    pgrx::spi::Spi::run(sql).map_err(|e| UvmError::new(Code::SystemError, format!("{sql}: {e}")))
}

/// Gives `relid` (locked by the build) the append trigger, unless a trigger calls the append
/// function already. (One under another name, renamed by a user, is left as it is: a rebuild
/// must not add a second, and the function appends only when [`TRIGGER`] fires it, so such a
/// table's inserts make its cache stale until the trigger is named back.)
pub(super) fn ensure_trigger(relid: pg_sys::Oid, qualified: &str) -> Result<()> {
    if !our_triggers(relid)?.is_empty() {
        return Ok(());
    }
    owner_may_create_trigger(relid, qualified)?;
    as_owner(relid, || {
        run_ddl(&format!(
            "CREATE TRIGGER {TRIGGER} AFTER INSERT ON {qualified} REFERENCING NEW TABLE AS pg_uvm_share_new \
             FOR EACH STATEMENT EXECUTE FUNCTION {}.{FUNCTION}()",
            quote_ident(&extension_schema())
        ))
    })
}

/// 42501, saying whose privilege is missing, where the table's owner (who creates the trigger)
/// may not use the table's schema or the extension's: `CREATE TRIGGER` would fail with a
/// message that names neither the owner nor why the owner acts.
fn owner_may_create_trigger(relid: pg_sys::Oid, qualified: &str) -> Result<()> {
    let q = format!(
        "SELECT c.relowner::pg_catalog.regrole::text, n.nspname::text, \
                pg_catalog.has_schema_privilege(c.relowner, c.relnamespace, 'USAGE'), \
                pg_catalog.has_schema_privilege(c.relowner, '{schema}', 'USAGE') \
           FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
          WHERE c.oid = {relid}",
        schema = extension_schema(),
        relid = u32::from(relid)
    );
    let row = pgrx::spi::Spi::connect(|client| {
        let t = client.select(&q, Some(1), &[])?.first();
        Ok::<_, pgrx::spi::SpiError>((
            t.get::<String>(1)?,
            t.get::<String>(2)?,
            t.get::<bool>(3)?.unwrap_or(false),
            t.get::<bool>(4)?.unwrap_or(false),
        ))
    })
    .map_err(|e| UvmError::new(Code::SystemError, format!("looking up the owner of {qualified}: {e}")))?;
    let (owner, nsp, table_schema, our_schema) = row;
    let owner = owner.unwrap_or_default();
    let missing = match (table_schema, our_schema) {
        (true, true) => return Ok(()),
        (false, _) => nsp.unwrap_or_default(),
        (true, false) => extension_schema(),
    };
    Err(UvmError::new(
        Code::InsufficientPrivilege,
        format!(
            "the owner of table {qualified}, role {owner}, has no USAGE on schema {missing}: uvm.cache_table \
             creates the table's append trigger as its owner"
        ),
    )
    .hint(format!(
        "GRANT USAGE ON SCHEMA {missing} TO {owner}, or set pg_uvm_share.cache_append_rows = 0 to \
         cache the table without appends (its inserts then make the cache stale)."
    )))
}

/// Drops the append trigger of `relid`, and any other trigger calling the append function, if
/// it has one (taking `DROP TRIGGER`'s `AccessExclusiveLock` on the table only then).
pub(super) fn drop_trigger(relid: pg_sys::Oid, qualified: &str) -> Result<()> {
    let names = our_triggers(relid)?;
    if names.is_empty() {
        return Ok(());
    }
    // SAFETY: takes a heavyweight lock held to the end of the transaction.
    unsafe { pg_sys::LockRelationOid(relid, pg_sys::AccessExclusiveLock as i32) };
    // (one statement per `as_owner`: the marks are off for one utility statement at a time)
    for n in &names {
        as_owner(relid, || run_ddl(&format!("DROP TRIGGER IF EXISTS {} ON {qualified}", quote_ident(n))))?;
    }
    Ok(())
}

/// The extension's schema (fixed by its control file: it is not relocatable).
const SCHEMA: &std::ffi::CStr = c"uvm";

fn extension_schema() -> String {
    SCHEMA.to_string_lossy().into_owned()
}

/// Whether the append trigger of `rel` (open, locked by the writer) fires in this session.
///
/// # Safety
/// `rel` is an open relation.
unsafe fn trigger_fires(rel: pg_sys::Relation) -> bool {
    // SAFETY: forwarded contract: the relation's trigger descriptor, read within its count;
    // catalog lookups of a trigger's function.
    unsafe {
        let td = (*rel).trigdesc;
        if td.is_null() {
            return false;
        }
        let role = pg_sys::SessionReplicationRole;
        let replica = role == pg_sys::SESSION_REPLICATION_ROLE_REPLICA as i32;
        (0..(*td).numtriggers as usize).map(|i| &*(*td).triggers.add(i)).any(|t| {
            let name = std::ffi::CStr::from_ptr(t.tgname);
            let enabled = match t.tgenabled as u8 {
                b'O' => !replica,
                b'A' => true,
                b'R' => replica,
                _ => false,
            };
            let ty = t.tgtype as u32;
            let shape = ty & pg_sys::TRIGGER_TYPE_ROW == 0
                && ty & pg_sys::TRIGGER_TYPE_TIMING_MASK == 0 // AFTER
                && ty & pg_sys::TRIGGER_TYPE_INSERT != 0
                && !t.tgnewtable.is_null()
                && t.tgqual.is_null();
            enabled && shape && name.to_bytes() == TRIGGER.as_bytes() && is_our_function(t.tgfoid)
        })
    }
}

thread_local! {
    /// The OID `is_our_function` last said yes to (every insert asks; the answer is two catalog
    /// lookups).
    static OUR_FUNCTION: std::cell::Cell<pg_sys::Oid> = const { std::cell::Cell::new(pg_sys::InvalidOid) };
}

fn is_our_function(f: pg_sys::Oid) -> bool {
    if f != pg_sys::InvalidOid && OUR_FUNCTION.with(|o| o.get()) == f {
        return true;
    }
    // SAFETY: catalog lookups (NULL for a missing function).
    let ours = unsafe {
        let name = pg_sys::get_func_name(f);
        if name.is_null() || std::ffi::CStr::from_ptr(name).to_bytes() != FUNCTION.as_bytes() {
            return false;
        }
        let nsp = pg_sys::get_namespace_oid(SCHEMA.as_ptr(), true);
        nsp != pg_sys::InvalidOid && pg_sys::get_func_namespace(f) == nsp
    };
    if ours {
        OUR_FUNCTION.with(|o| o.set(f));
    }
    ours
}

/// Whether `relid` has a ready cache with a tail (the directory alone: no lock needed).
pub(super) fn has_tail(relid: u32) -> bool {
    directory().is_ok_and(|d| d.find(database(), relid).is_some_and(|e| e.state == State::Ready && e.tail_capacity > 0))
}

/// Whether an insert into `relid` by this session appends to its cache instead of making it
/// stale: the cache is ready with a tail and the trigger fires. The caller holds a lock on the
/// table that keeps the trigger as it is (`RowExclusiveLock`: `ALTER TABLE` and `DROP TRIGGER`
/// conflict with it).
pub(super) fn insert_appends(relid: u32) -> bool {
    if !has_tail(relid) {
        return false;
    }
    // SAFETY: the caller holds a lock on the table (contract); the relcache entry is released.
    unsafe {
        let rel = pg_sys::RelationIdGetRelation(pg_sys::Oid::from(relid));
        if rel.is_null() {
            return false;
        }
        let fires = trigger_fires(rel);
        pg_sys::RelationClose(rel);
        fires
    }
}

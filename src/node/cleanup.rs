//! The temporary segments of plan nodes, dropped whatever ends the query.
//!
//! A GpuJoin node creates two segments per execution (its inner table and its result buffer)
//! and drops them in its End. A query that fails or is cancelled never reaches End, so every
//! temporary segment is also listed here, with the subtransaction that created it:
//!
//! - a transaction abort drops them all, a subtransaction abort those its subtransaction (or a
//!   child of it) created;
//! - a commit drops any still listed (a portal closed without End; none is expected);
//! - process exit (`before_shmem_exit`) drops what is left (a FATAL error, `pg_terminate_backend`).
//!
//! A parallel worker terminated inside one of its segment operations cannot drop its own (see
//! [`sweep_orphans`]): its leader drops them at abort, by the creator's pid in the name.
//!
//! A backend killed by SIGKILL takes the cluster through a restart, which wipes every segment.
//! Drops run with interrupts held off. A segment still pinned by a request this process gave up
//! on (the GPU service finishes it) is tried again for up to `IN_USE_WAIT`; any other error
//! is written to the server log and ignored (nothing else can be done about it in a callback).

use std::cell::RefCell;

use pgrx::pg_sys;

use std::time::{Duration, Instant};

use crate::error::Code;
use crate::exec::{self, SegRef};

struct Entry {
    seg: SegRef,
    subxact: pg_sys::SubTransactionId,
}

thread_local! {
    static LIST: RefCell<Vec<Entry>> = const { RefCell::new(Vec::new()) };
    static COUNTER: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// A fresh name for a temporary segment of this process (`pg_temp_gpujoin_<pid>_<n>_<what>`).
fn temp_name(what: &str) -> String {
    let n = COUNTER.with(|c| {
        let v = c.get() + 1;
        c.set(v);
        v
    });
    // SAFETY: MyProcPid is set at process start.
    format!("{}gpujoin_{}_{n}_{what}", crate::registry::RESERVED_PREFIX, unsafe { pg_sys::MyProcPid })
}

/// How long the cleanup waits, in all, for segments still pinned by an abandoned request.
const IN_USE_WAIT: Duration = Duration::from_secs(5);

/// Creates a temporary segment of this process named for `what`: `make` creates a segment of
/// the name it is given and returns its id. The segment is listed (by name) before `make`
/// runs, so that an ERROR, a cancel or a terminate while the request runs (in the GPU service,
/// which finishes it anyway) cannot leave it unlisted; then it is listed with its id.
pub fn create(what: &str, make: impl FnOnce(&str) -> u64) -> SegRef {
    let name = temp_name(what);
    let pending = SegRef::new(&name, 0).unwrap_or_else(|e| crate::runtime::report(e));
    track(pending);
    install_exit_once();
    let seg = SegRef::new(&name, make(&name)).unwrap_or_else(|e| crate::runtime::report(e));
    listed_as(&pending, seg);
    seg
}

/// [`create`], returning the creation's error instead of raising it (nothing stays listed).
pub fn try_create(what: &str, make: impl FnOnce(&str) -> crate::error::Result<u64>) -> crate::error::Result<SegRef> {
    let name = temp_name(what);
    let pending = SegRef::new(&name, 0)?;
    track(pending);
    install_exit_once();
    match make(&name).and_then(|id| SegRef::new(&name, id)) {
        Ok(seg) => {
            listed_as(&pending, seg);
            Ok(seg)
        }
        Err(e) => {
            // A creation interrupted in the GPU service may still complete: dropped by name at
            // the abort the error leads to.
            Err(e)
        }
    }
}

/// Stops dropping `seg` at this process's abort, commit or exit: another process drops it (a
/// parallel query's spill segment, created by a worker for the leader).
pub fn disown(seg: &SegRef) {
    forget(seg);
}

/// Drops `seg` with this process's temporary segments from now on (a parallel query's leader,
/// of a segment a worker created for it).
pub fn adopt(seg: SegRef) {
    if !LIST.with(|l| l.borrow().iter().any(|e| e.seg == seg)) {
        track(seg);
        install_exit_once();
    }
}

/// Lists a temporary segment about to be created (id 0: by name).
fn track(seg: SegRef) {
    // SAFETY: reads the current subtransaction's id.
    let subxact = unsafe { pg_sys::GetCurrentSubTransactionId() };
    LIST.with(|l| l.borrow_mut().push(Entry { seg, subxact }));
}

/// Drops a temporary segment now and forgets it (a node's End or rebuild). An error is raised,
/// and the segment stays listed for the abort callback to try again.
pub fn drop_now(seg: &SegRef) {
    crate::runtime::with_executor(|ex| exec::drop(ex, seg));
    forget(seg);
}

/// Drops these temporary segments now, in one request (`exec::drop_all`), and forgets them
/// (a node's End: the segments it retired during the execution). Where that fails part way,
/// each left is dropped as [`drop_now`] drops it (one already gone counts as dropped), so an
/// error is raised for the segment that fails, which stays listed.
pub fn drop_all_now(segs: &[SegRef]) {
    if segs.is_empty() {
        return;
    }
    if crate::runtime::try_with_executor(|ex| exec::drop_all(ex, segs)).is_ok() {
        for seg in segs {
            forget(seg);
        }
        return;
    }
    for seg in segs {
        match crate::runtime::try_with_executor(|ex| exec::drop(ex, seg)) {
            Ok(()) => forget(seg),
            Err(e) if e.code == Code::UndefinedObject => forget(seg),
            Err(e) => crate::runtime::report(e),
        }
    }
}

/// Gives the listed `pending` entry (made by [`track`] before the creation) its segment's id.
fn listed_as(pending: &SegRef, seg: SegRef) {
    LIST.with(|l| {
        for e in l.borrow_mut().iter_mut().filter(|e| e.seg == *pending) {
            e.seg = seg;
        }
    });
}

fn forget(seg: &SegRef) {
    LIST.with(|l| l.borrow_mut().retain(|e| e.seg != *seg));
}

/// Temporary segments listed now (for tests and EXPLAIN).
pub fn listed() -> usize {
    LIST.with(|l| l.borrow().len())
}

/// Drops, ignoring errors, the listed segments `which` selects.
fn drop_where(which: impl Fn(&Entry) -> bool) {
    let victims: Vec<SegRef> = LIST.with(|l| {
        let mut l = l.borrow_mut();
        let (gone, keep): (Vec<Entry>, Vec<Entry>) = l.drain(..).partition(&which);
        *l = keep;
        gone.into_iter().map(|e| e.seg).collect()
    });
    if victims.is_empty() {
        return;
    }
    crate::runtime::held_off(|| {
        let deadline = Instant::now() + IN_USE_WAIT;
        for seg in victims {
            drop_quietly(&seg, deadline);
        }
    });
}

/// Drops `seg`, trying again until `deadline` while a request this process gave up on still
/// pins it; other failures go to the server log. Called with interrupts held off.
fn drop_quietly(seg: &SegRef, deadline: Instant) {
    loop {
        let r = std::panic::catch_unwind(|| crate::runtime::try_with_executor(|ex| exec::drop(ex, seg)));
        let why = match r {
            Ok(Ok(())) => return,
            // Listed before its creation, which failed or was interrupted: nothing to drop.
            Ok(Err(e)) if e.code == Code::UndefinedObject => return,
            // A request this process gave up on (a cancel, a terminate) still runs in the GPU
            // service with the segment pinned; it ends soon.
            Ok(Err(e)) if e.code == Code::ObjectInUse && Instant::now() < deadline => {
                // SAFETY: a plain sleep of the main thread.
                unsafe { pg_sys::pg_usleep(2_000) };
                continue;
            }
            Ok(Err(e)) => e.to_string(),
            // This process's segment manager is unusable (a FATAL exit inside one of its
            // operations): another process's `sweep_orphans` drops the segment.
            Err(_) => "the segment manager is busy (an exit inside an operation)".to_string(),
        };
        pgrx::log!("pg_uvm_share: temporary segment \"{}\" was not dropped: {why}", seg.name());
        return;
    }
}

/// The pid in a temporary segment's name (`pg_temp_gpujoin_<pid>_<n>_<what>`).
fn creator_pid(name: &str) -> Option<i32> {
    name.strip_prefix("pg_temp_gpujoin_")?.split('_').next()?.parse().ok()
}

/// Drops this user's temporary segments whose creating process is gone. A parallel worker
/// terminated inside one of its segment operations exits without its own cleanup (a FATAL
/// exit does not unwind the operation, so the process's segment manager stays busy); its
/// leader runs this at abort, after the workers have exited. A pid used again by a live
/// process keeps its segments (they may be that process's).
pub fn sweep_orphans() {
    // SAFETY: reads this process's pid.
    let me = unsafe { pg_sys::MyProcPid };
    let user = crate::runtime::current_user();
    let Ok(orphans) = crate::registry::shmem::shared().map(|reg| {
        reg.segments()
            .into_iter()
            .filter(|i| i.owner == user)
            .filter(|i| creator_pid(&i.name).is_some_and(|pid| pid != me && pid > 0 && !alive(pid)))
            .filter_map(|i| SegRef::new(&i.name, i.id).ok())
            .collect::<Vec<_>>()
    }) else {
        return;
    };
    let deadline = Instant::now() + IN_USE_WAIT;
    for seg in orphans {
        drop_quietly(&seg, deadline);
    }
}

/// Whether process `pid` exists.
fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists and may be signalled.
    unsafe { libc::kill(pid, 0) == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM) }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn xact_callback(event: pg_sys::XactEvent::Type, _arg: *mut std::ffi::c_void) {
    match event {
        pg_sys::XactEvent::XACT_EVENT_ABORT => {
            // A spill segment's pin first: a pinned segment cannot be dropped.
            super::spill::release_from(0);
            drop_where(|_| true);
            sweep_orphans_quietly();
        }
        pg_sys::XactEvent::XACT_EVENT_PARALLEL_ABORT
        | pg_sys::XactEvent::XACT_EVENT_COMMIT
        | pg_sys::XactEvent::XACT_EVENT_PARALLEL_COMMIT
        | pg_sys::XactEvent::XACT_EVENT_PREPARE => {
            super::spill::release_from(0);
            drop_where(|_| true)
        }
        _ => {}
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn subxact_callback(
    event: pg_sys::SubXactEvent::Type,
    my_subid: pg_sys::SubTransactionId,
    _parent: pg_sys::SubTransactionId,
    _arg: *mut std::ffi::c_void,
) {
    if event == pg_sys::SubXactEvent::SUBXACT_EVENT_ABORT_SUB {
        // Subtransaction ids grow: the aborted one's children have larger ids.
        super::spill::release_from(my_subid);
        drop_where(|e| e.subxact >= my_subid);
        sweep_orphans_quietly();
    }
}

/// [`sweep_orphans`] from a callback: interrupts held off, nothing raised.
fn sweep_orphans_quietly() {
    crate::runtime::held_off(|| {
        let _ = std::panic::catch_unwind(sweep_orphans);
    });
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn on_exit(_code: i32, _arg: pg_sys::Datum) {
    super::spill::release_from(0);
    drop_where(|_| true);
}

/// Installs the callbacks (once per process, from `_PG_init`).
pub fn install() {
    // SAFETY: registers pg_guard'ed callbacks for the life of the process.
    unsafe {
        pg_sys::RegisterXactCallback(Some(xact_callback), std::ptr::null_mut());
        pg_sys::RegisterSubXactCallback(Some(subxact_callback), std::ptr::null_mut());
    }
}

/// Registers the exit callback; called when this process creates its first temporary segment
/// (before_shmem_exit callbacks run in reverse order of registration, so this runs before the
/// segment manager's own exit callback, which is registered earlier).
fn install_exit_once() {
    thread_local! {
        static DONE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    if !DONE.with(|d| d.replace(true)) {
        // SAFETY: registers a pg_guard'ed callback PostgreSQL runs at process exit.
        unsafe { pg_sys::before_shmem_exit(Some(on_exit), pg_sys::Datum::from(0)) };
    }
}

#[cfg(test)]
mod tests {
    use super::creator_pid;

    #[test]
    fn the_creator_pid_comes_from_the_temporary_name_only() {
        assert_eq!(creator_pid("pg_temp_gpujoin_4242_7_pairs"), Some(4242));
        assert_eq!(creator_pid("pg_temp_gpujoin_17_1_inner"), Some(17));
        assert_eq!(creator_pid("pg_temp_gpujoin_x_1_inner"), None);
        assert_eq!(creator_pid("gpujoin_4242_7_pairs"), None);
        assert_eq!(creator_pid("pg_temp_gpujoin_"), None);
    }
}

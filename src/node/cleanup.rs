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
//! A backend killed by SIGKILL takes the cluster through a restart, which wipes every segment.
//! Drops run with interrupts held off. A segment still pinned by a request this process gave up
//! on (the GPU service finishes it) is tried again for up to [`IN_USE_WAIT`]; any other error
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
pub fn temp_name(what: &str) -> String {
    let n = COUNTER.with(|c| {
        let v = c.get() + 1;
        c.set(v);
        v
    });
    // SAFETY: MyProcPid is set at process start.
    format!("pg_temp_gpujoin_{}_{n}_{what}", unsafe { pg_sys::MyProcPid })
}

/// How long the cleanup waits, in all, for segments still pinned by an abandoned request.
const IN_USE_WAIT: Duration = Duration::from_secs(5);

/// Lists a temporary segment about to be created (id 0: by name) or just created. A segment is
/// listed before the request that creates it, so that an ERROR, a cancel or a terminate while
/// the request runs (in the GPU service, which finishes it anyway) cannot leave it unlisted;
/// [`listed_as`] then gives it its id.
pub fn track(seg: SegRef) {
    // SAFETY: reads the current subtransaction's id.
    let subxact = unsafe { pg_sys::GetCurrentSubTransactionId() };
    LIST.with(|l| l.borrow_mut().push(Entry { seg, subxact }));
}

/// Drops a temporary segment now and forgets it (a node's End or rebuild). An error is raised,
/// and the segment stays listed for the abort callback to try again.
pub fn drop_now(seg: &SegRef) {
    crate::sql::with_executor(|ex| exec::drop(ex, seg));
    forget(seg);
}

/// Gives the listed `pending` entry (made by [`track`] before the creation) its segment's id.
pub fn listed_as(pending: &SegRef, seg: SegRef) {
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
    // SAFETY: a process-local counter of the main thread, restored below.
    unsafe { pg_sys::InterruptHoldoffCount += 1 };
    let deadline = Instant::now() + IN_USE_WAIT;
    for seg in victims {
        loop {
            let r = std::panic::catch_unwind(|| crate::sql::try_with_executor(|ex| exec::drop(ex, &seg)));
            let why = match r {
                Ok(Ok(())) => break,
                // Listed before its creation, which failed or was interrupted: nothing to drop.
                Ok(Err(e)) if e.code == Code::UndefinedObject => break,
                // A request this process gave up on (a cancel, a terminate) still runs in the GPU
                // service with the segment pinned; it ends soon.
                Ok(Err(e)) if e.code == Code::ObjectInUse && Instant::now() < deadline => {
                    // SAFETY: a plain sleep of the main thread.
                    unsafe { pg_sys::pg_usleep(2_000) };
                    continue;
                }
                Ok(Err(e)) => e.to_string(),
                Err(_) => "a panic".to_string(),
            };
            // Nothing can be raised here: the server log says which segment stayed, and why.
            pgrx::log!("pg_uvm_share: temporary segment \"{}\" was not dropped: {why}", seg.name());
            break;
        }
    }
    // SAFETY: as above.
    unsafe { pg_sys::InterruptHoldoffCount -= 1 };
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn xact_callback(event: pg_sys::XactEvent::Type, _arg: *mut std::ffi::c_void) {
    match event {
        pg_sys::XactEvent::XACT_EVENT_ABORT
        | pg_sys::XactEvent::XACT_EVENT_PARALLEL_ABORT
        | pg_sys::XactEvent::XACT_EVENT_COMMIT
        | pg_sys::XactEvent::XACT_EVENT_PARALLEL_COMMIT
        | pg_sys::XactEvent::XACT_EVENT_PREPARE => drop_where(|_| true),
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
        drop_where(|e| e.subxact >= my_subid);
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn on_exit(_code: i32, _arg: pg_sys::Datum) {
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
pub fn install_exit_once() {
    thread_local! {
        static DONE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    if !DONE.with(|d| d.replace(true)) {
        // SAFETY: registers a pg_guard'ed callback PostgreSQL runs at process exit.
        unsafe { pg_sys::before_shmem_exit(Some(on_exit), pg_sys::Datum::from(0)) };
    }
}

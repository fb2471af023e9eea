//! PostgreSQL waits shared by the background workers (the broker and the GPU service): one wait
//! set for a worker's whole life, on its latch, postmaster death and one file descriptor; and
//! the end of a condition-variable sleep, which the plan nodes' parallel participants share.

use pgrx::pg_sys;

/// A wait set on this process's latch, postmaster death (the process exits) and `fd` becoming
/// readable, allocated for the life of the process.
///
/// # Safety
/// Main thread only; `fd` must stay open as long as the set is waited on.
pub unsafe fn latch_and_fd(fd: i32) -> *mut pg_sys::WaitEventSet {
    // SAFETY: the set is allocated in TopMemoryContext (14-16 take the context; 17 and later a
    // resource owner: none, so it lives in TopMemoryContext too) and lives as long as the
    // process; MyLatch is this process's latch; the caller keeps `fd` open.
    unsafe {
        #[cfg(any(feature = "pg14", feature = "pg15", feature = "pg16"))]
        let set = pg_sys::CreateWaitEventSet(pg_sys::TopMemoryContext, 3);
        #[cfg(not(any(feature = "pg14", feature = "pg15", feature = "pg16")))]
        let set = pg_sys::CreateWaitEventSet(std::ptr::null_mut(), 3);
        pg_sys::AddWaitEventToSet(set, pg_sys::WL_LATCH_SET, pg_sys::PGINVALID_SOCKET, pg_sys::MyLatch, std::ptr::null_mut());
        pg_sys::AddWaitEventToSet(
            set,
            pg_sys::WL_EXIT_ON_PM_DEATH,
            pg_sys::PGINVALID_SOCKET,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        );
        pg_sys::AddWaitEventToSet(set, pg_sys::WL_SOCKET_READABLE, fd, std::ptr::null_mut(), std::ptr::null_mut());
        set
    }
}

/// Ends this process's condition-variable sleep (`ConditionVariableSleep`'s loop, on any
/// variable); a no-op where it prepared none.
pub fn cancel_sleep() {
    // SAFETY: PostgreSQL's; it touches only this process's sleep, if one was prepared.
    #[allow(clippy::let_unit_value)]
    let _ = unsafe { pg_sys::ConditionVariableCancelSleep() };
}

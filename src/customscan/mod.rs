//! Custom scan plan nodes, written once: the method tables PostgreSQL calls and their
//! `extern "C-unwind"` trampolines, over one Rust trait ([`JoinScan`]) that a node implements.
//!
//! # Design
//!
//! PostgreSQL knows a custom plan node by three method tables: `CustomPathMethods` (the planner
//! turns the chosen path into a `CustomScan` plan), `CustomScanMethods` (the executor creates
//! the node's state) and `CustomExecMethods` (begin, exec, rescan, end, explain). [`methods`]
//! builds the three for a type `T: JoinScan` as constants, so a node declares one `static`
//! and never writes a trampoline; each trampoline runs its body under pgrx's guard (a Rust
//! panic becomes an ERROR, an ERROR unwinds through Rust frames).
//!
//! The executor state is a [`ScanState`]: PostgreSQL's `CustomScanState` first (so that the
//! executor can treat it as one), allocated with `palloc0` in the query's memory context, then
//! a pointer to the node's Rust state in a `Box`. `EndCustomScan` drops the box. When a query
//! fails, End never runs: a reset callback on the same memory context drops the box when
//! PostgreSQL deletes the context, so no Rust memory leaks. A node's Rust destructor must
//! therefore never be needed for correctness after an ERROR (it only frees memory); resources
//! outside the process (segments) are cleaned up by transaction callbacks (see
//! `crate::node::cleanup`).
//!
//! A node that runs in parallel workers (its plan marked `parallel_aware`) also implements the
//! parallel methods: PostgreSQL gives it a piece of the parallel query's dynamic shared memory
//! (sized by `estimate_dsm`, set up by the leader in `initialize_dsm`, found by each worker in
//! `initialize_worker`, reset for a rescan in `reinitialize_dsm`) and calls `shutdown` before
//! that memory goes away. The defaults do nothing, for nodes that never run in parallel.
//!
//! Only the pieces that differ between PostgreSQL 14 and 18 are behind `#[cfg(feature)]`, in
//! the node modules (CustomPath's `custom_restrictinfo` in 17, `disabled_nodes` in 18).

use std::ffi::{c_void, CStr};

use pgrx::pg_sys;
use pgrx::pg_sys::panic::pgrx_extern_c_guard;

/// A join implemented as a custom scan: planning of its chosen path and execution. Every method
/// runs on the backend's main thread, inside a pgrx guard.
pub trait JoinScan: Sized + 'static {
    /// `CustomName`: what EXPLAIN shows in `Custom Scan (...)`.
    const NAME: &'static CStr;

    /// The node's method tables (a `static` built by [`methods`]).
    fn methods() -> &'static Methods;

    /// `PlanCustomPath`: the `CustomScan` for `path` (its `methods` are set by the caller).
    ///
    /// # Safety
    /// Called by PostgreSQL's planner with its arguments.
    unsafe fn plan(
        root: *mut pg_sys::PlannerInfo,
        rel: *mut pg_sys::RelOptInfo,
        path: *mut pg_sys::CustomPath,
        tlist: *mut pg_sys::List,
        clauses: *mut pg_sys::List,
        custom_plans: *mut pg_sys::List,
    ) -> *mut pg_sys::CustomScan;

    /// The node's Rust state for `cscan` (`CreateCustomScanState`).
    ///
    /// # Safety
    /// `cscan` is this node's plan.
    unsafe fn create(cscan: *mut pg_sys::CustomScan) -> Self;

    /// # Safety
    /// `node` is this node's executor state; as for PostgreSQL's `BeginCustomScan`.
    unsafe fn begin(&mut self, node: *mut pg_sys::CustomScanState, estate: *mut pg_sys::EState, eflags: i32);

    /// The next tuple, or a null pointer (or an empty slot) at the end.
    ///
    /// # Safety
    /// As for `ExecCustomScan`.
    unsafe fn exec(&mut self, node: *mut pg_sys::CustomScanState) -> *mut pg_sys::TupleTableSlot;

    /// # Safety
    /// As for `ReScanCustomScan`.
    unsafe fn rescan(&mut self, node: *mut pg_sys::CustomScanState);

    /// Releases what the node holds (its Rust state is dropped right after).
    ///
    /// # Safety
    /// As for `EndCustomScan`.
    unsafe fn end(&mut self, node: *mut pg_sys::CustomScanState);

    /// # Safety
    /// As for `ExplainCustomScan`.
    unsafe fn explain(&mut self, node: *mut pg_sys::CustomScanState, ancestors: *mut pg_sys::List, es: *mut pg_sys::ExplainState);

    /// Bytes of dynamic shared memory the node needs in a parallel query (`EstimateDSMCustomScan`;
    /// PostgreSQL calls the parallel methods only for a plan marked `parallel_aware`).
    ///
    /// # Safety
    /// As for `EstimateDSMCustomScan`.
    unsafe fn estimate_dsm(&mut self, _node: *mut pg_sys::CustomScanState, _pcxt: *mut pg_sys::ParallelContext) -> usize {
        0
    }

    /// Initializes `coordinate` (the bytes [`JoinScan::estimate_dsm`] asked for), in the leader,
    /// before the workers start (`InitializeDSMCustomScan`).
    ///
    /// # Safety
    /// As for `InitializeDSMCustomScan`.
    unsafe fn initialize_dsm(
        &mut self,
        _node: *mut pg_sys::CustomScanState,
        _pcxt: *mut pg_sys::ParallelContext,
        _coordinate: *mut c_void,
    ) {
    }

    /// Resets the shared state for a rescan, in the leader, before the workers start again
    /// (`ReInitializeDSMCustomScan`; the node's `rescan` resets its local state).
    ///
    /// # Safety
    /// As for `ReInitializeDSMCustomScan`.
    unsafe fn reinitialize_dsm(
        &mut self,
        _node: *mut pg_sys::CustomScanState,
        _pcxt: *mut pg_sys::ParallelContext,
        _coordinate: *mut c_void,
    ) {
    }

    /// Attaches a worker's node to the shared state the leader initialized
    /// (`InitializeWorkerCustomScan`).
    ///
    /// # Safety
    /// As for `InitializeWorkerCustomScan`.
    unsafe fn initialize_worker(
        &mut self,
        _node: *mut pg_sys::CustomScanState,
        _toc: *mut pg_sys::shm_toc,
        _coordinate: *mut c_void,
    ) {
    }

    /// The last moment the shared state is mapped (`ShutdownCustomScan`, before the Gather above
    /// destroys the parallel context).
    ///
    /// # Safety
    /// As for `ShutdownCustomScan`.
    unsafe fn shutdown(&mut self, _node: *mut pg_sys::CustomScanState) {}
}

/// The three method tables of a node.
pub struct Methods {
    pub path: pg_sys::CustomPathMethods,
    pub scan: pg_sys::CustomScanMethods,
    pub exec: pg_sys::CustomExecMethods,
}

// SAFETY: the tables are immutable after construction (constants holding a 'static C string
// and function pointers); PostgreSQL only reads them.
unsafe impl Sync for Methods {}

/// The method tables of `T` (for a `static`).
pub const fn methods<T: JoinScan>() -> Methods {
    let name = T::NAME.as_ptr();
    Methods {
        path: pg_sys::CustomPathMethods {
            CustomName: name,
            PlanCustomPath: Some(plan_custom_path::<T>),
            ReparameterizeCustomPathByChild: None,
        },
        scan: pg_sys::CustomScanMethods { CustomName: name, CreateCustomScanState: Some(create_state::<T>) },
        exec: pg_sys::CustomExecMethods {
            CustomName: name,
            BeginCustomScan: Some(begin::<T>),
            ExecCustomScan: Some(exec::<T>),
            EndCustomScan: Some(end::<T>),
            ReScanCustomScan: Some(rescan::<T>),
            MarkPosCustomScan: None,
            RestrPosCustomScan: None,
            EstimateDSMCustomScan: Some(estimate_dsm::<T>),
            InitializeDSMCustomScan: Some(initialize_dsm::<T>),
            ReInitializeDSMCustomScan: Some(reinitialize_dsm::<T>),
            InitializeWorkerCustomScan: Some(initialize_worker::<T>),
            ShutdownCustomScan: Some(shutdown::<T>),
            ExplainCustomScan: Some(explain::<T>),
        },
    }
}

/// Registers `T`'s scan methods by name (for plans copied through their text form, as parallel
/// workers receive them). Called once from `_PG_init`.
pub fn register<T: JoinScan>() {
    // SAFETY: a pointer to a 'static table; PostgreSQL keeps it in a process-local hash.
    unsafe { pg_sys::RegisterCustomScanMethods(&T::methods().scan) };
}

/// A serial, parallel-unsafe custom path of the upper relation `rel` (its target), over the
/// paths `children`, of `rows` rows at `cost` (startup and total), with `methods`: the shape of
/// the nodes above a grouping (GpuJoinAgg, GpuGroupAgg). `disabled_nodes` counts only on
/// PostgreSQL 18.
///
/// # Safety
/// Planner structures, allocated in the planner's memory context.
pub unsafe fn upper_path(
    rel: *mut pg_sys::RelOptInfo,
    children: &[*mut pg_sys::Path],
    rows: f64,
    cost: f64,
    disabled_nodes: i32,
    methods: &'static pg_sys::CustomPathMethods,
) -> *mut pg_sys::CustomPath {
    // SAFETY: forwarded contract; a zeroed CustomPath filled as PostgreSQL's own are.
    unsafe {
        let cp = pg_sys::palloc0(std::mem::size_of::<pg_sys::CustomPath>()) as *mut pg_sys::CustomPath;
        let p = &mut (*cp).path;
        p.type_ = pg_sys::NodeTag::T_CustomPath;
        p.pathtype = pg_sys::NodeTag::T_CustomScan;
        p.parent = rel;
        p.pathtarget = (*rel).reltarget;
        p.param_info = std::ptr::null_mut();
        p.parallel_aware = false;
        p.parallel_safe = false;
        p.parallel_workers = 0;
        p.rows = rows;
        #[cfg(feature = "pg18")]
        {
            p.disabled_nodes = disabled_nodes;
        }
        #[cfg(not(feature = "pg18"))]
        let _ = disabled_nodes;
        p.startup_cost = cost;
        p.total_cost = cost;
        let mut list = pgrx::PgList::<pg_sys::Path>::new();
        for &c in children {
            list.push(c);
        }
        (*cp).custom_paths = list.into_pg();
        (*cp).methods = methods;
        cp
    }
}

/// The custom scan of `path` over no relation of its own (`scanrelid` 0): the target list
/// `tlist` over the scan tuple `scan_tlist`, the children `custom_plans`, the plan's `qual`
/// and `private` list.
///
/// # Safety
/// PlanCustomPath's arguments, and lists allocated in the planner's memory context.
pub unsafe fn upper_scan(
    path: *mut pg_sys::CustomPath,
    tlist: *mut pg_sys::List,
    qual: *mut pg_sys::List,
    custom_plans: *mut pg_sys::List,
    scan_tlist: *mut pg_sys::List,
    private: *mut pg_sys::List,
) -> *mut pg_sys::CustomScan {
    // SAFETY: forwarded contract; a zeroed CustomScan filled as PostgreSQL's own are.
    unsafe {
        let cscan = pg_sys::palloc0(std::mem::size_of::<pg_sys::CustomScan>()) as *mut pg_sys::CustomScan;
        (*cscan).scan.plan.type_ = pg_sys::NodeTag::T_CustomScan;
        (*cscan).scan.plan.targetlist = tlist;
        (*cscan).scan.plan.qual = qual;
        (*cscan).scan.scanrelid = 0;
        (*cscan).flags = (*path).flags;
        (*cscan).custom_plans = custom_plans;
        (*cscan).custom_scan_tlist = scan_tlist;
        (*cscan).custom_private = private;
        cscan
    }
}

/// The executor state of a custom scan: PostgreSQL's part first, then the node's Rust state.
#[repr(C)]
pub struct ScanState {
    pub css: pg_sys::CustomScanState,
    /// `Box<T>` as a raw pointer; null once dropped.
    rust: *mut c_void,
    drop_rust: unsafe fn(*mut c_void),
}

/// Drops a `Box<T>` made by `create_state::<T>`.
unsafe fn drop_box<T>(p: *mut c_void) {
    // SAFETY: `p` came from Box::<T>::into_raw and is dropped once (the caller nulls it).
    drop(unsafe { Box::from_raw(p as *mut T) });
}

/// The Rust state of `node`.
///
/// # Safety
/// `node` is a [`ScanState`] made by `create_state::<T>` whose state is not dropped yet.
unsafe fn state<'a, T>(node: *mut pg_sys::CustomScanState) -> &'a mut T {
    // SAFETY: forwarded contract; ScanState starts with the CustomScanState.
    unsafe {
        let s = node as *mut ScanState;
        assert!(!(*s).rust.is_null(), "custom scan state used after its end");
        &mut *((*s).rust as *mut T)
    }
}

/// Drops the Rust state of a [`ScanState`] if it is still there (End, or the memory context's
/// deletion after an ERROR).
///
/// # Safety
/// `s` is a live [`ScanState`].
unsafe fn drop_state(s: *mut ScanState) {
    // SAFETY: forwarded contract; the pointer is nulled before the drop runs, so a drop that
    // panics cannot run twice.
    unsafe {
        let p = std::mem::replace(&mut (*s).rust, std::ptr::null_mut());
        if !p.is_null() {
            ((*s).drop_rust)(p);
        }
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn reset_callback(arg: *mut c_void) {
    // SAFETY: registered on the memory context that holds the ScanState `arg`; PostgreSQL calls
    // it before freeing that memory.
    unsafe { drop_state(arg as *mut ScanState) };
}

unsafe extern "C-unwind" fn plan_custom_path<T: JoinScan>(
    root: *mut pg_sys::PlannerInfo,
    rel: *mut pg_sys::RelOptInfo,
    best_path: *mut pg_sys::CustomPath,
    tlist: *mut pg_sys::List,
    clauses: *mut pg_sys::List,
    custom_plans: *mut pg_sys::List,
) -> *mut pg_sys::Plan {
    // SAFETY: the top frame of a callback; PostgreSQL passes valid planner structures.
    unsafe {
        pgrx_extern_c_guard(|| {
            let cscan = T::plan(root, rel, best_path, tlist, clauses, custom_plans);
            (*cscan).methods = &T::methods().scan;
            cscan as *mut pg_sys::Plan
        })
    }
}

unsafe extern "C-unwind" fn create_state<T: JoinScan>(cscan: *mut pg_sys::CustomScan) -> *mut pg_sys::Node {
    // SAFETY: the top frame of a callback; `cscan` is our plan; the state is allocated in the
    // current (query) memory context, zeroed, with the node tag PostgreSQL expects.
    unsafe {
        pgrx_extern_c_guard(|| {
            let s = pg_sys::palloc0(std::mem::size_of::<ScanState>()) as *mut ScanState;
            (*s).css.ss.ps.type_ = pg_sys::NodeTag::T_CustomScanState;
            (*s).css.methods = &T::methods().exec;
            (*s).drop_rust = drop_box::<T>;
            (*s).rust = Box::into_raw(Box::new(T::create(cscan))) as *mut c_void;
            let cb = pg_sys::palloc0(std::mem::size_of::<pg_sys::MemoryContextCallback>()) as *mut pg_sys::MemoryContextCallback;
            (*cb).func = Some(reset_callback);
            (*cb).arg = s as *mut c_void;
            pg_sys::MemoryContextRegisterResetCallback(pg_sys::CurrentMemoryContext, cb);
            s as *mut pg_sys::Node
        })
    }
}

unsafe extern "C-unwind" fn begin<T: JoinScan>(node: *mut pg_sys::CustomScanState, estate: *mut pg_sys::EState, eflags: i32) {
    // SAFETY: the top frame of a callback; `node` was made by create_state::<T>.
    unsafe { pgrx_extern_c_guard(|| state::<T>(node).begin(node, estate, eflags)) }
}

unsafe extern "C-unwind" fn exec<T: JoinScan>(node: *mut pg_sys::CustomScanState) -> *mut pg_sys::TupleTableSlot {
    // SAFETY: as for begin.
    unsafe { pgrx_extern_c_guard(|| state::<T>(node).exec(node)) }
}

unsafe extern "C-unwind" fn rescan<T: JoinScan>(node: *mut pg_sys::CustomScanState) {
    // SAFETY: as for begin.
    unsafe { pgrx_extern_c_guard(|| state::<T>(node).rescan(node)) }
}

unsafe extern "C-unwind" fn end<T: JoinScan>(node: *mut pg_sys::CustomScanState) {
    // SAFETY: as for begin; the Rust state is dropped after the node's end, once.
    unsafe {
        pgrx_extern_c_guard(|| {
            state::<T>(node).end(node);
            drop_state(node as *mut ScanState);
        })
    }
}

unsafe extern "C-unwind" fn explain<T: JoinScan>(
    node: *mut pg_sys::CustomScanState,
    ancestors: *mut pg_sys::List,
    es: *mut pg_sys::ExplainState,
) {
    // SAFETY: as for begin.
    unsafe { pgrx_extern_c_guard(|| state::<T>(node).explain(node, ancestors, es)) }
}

unsafe extern "C-unwind" fn estimate_dsm<T: JoinScan>(
    node: *mut pg_sys::CustomScanState,
    pcxt: *mut pg_sys::ParallelContext,
) -> usize {
    // SAFETY: as for begin.
    unsafe { pgrx_extern_c_guard(|| state::<T>(node).estimate_dsm(node, pcxt)) }
}

unsafe extern "C-unwind" fn initialize_dsm<T: JoinScan>(
    node: *mut pg_sys::CustomScanState,
    pcxt: *mut pg_sys::ParallelContext,
    coordinate: *mut c_void,
) {
    // SAFETY: as for begin; `coordinate` holds the bytes estimate_dsm asked for.
    unsafe { pgrx_extern_c_guard(|| state::<T>(node).initialize_dsm(node, pcxt, coordinate)) }
}

unsafe extern "C-unwind" fn reinitialize_dsm<T: JoinScan>(
    node: *mut pg_sys::CustomScanState,
    pcxt: *mut pg_sys::ParallelContext,
    coordinate: *mut c_void,
) {
    // SAFETY: as for initialize_dsm.
    unsafe { pgrx_extern_c_guard(|| state::<T>(node).reinitialize_dsm(node, pcxt, coordinate)) }
}

unsafe extern "C-unwind" fn initialize_worker<T: JoinScan>(
    node: *mut pg_sys::CustomScanState,
    toc: *mut pg_sys::shm_toc,
    coordinate: *mut c_void,
) {
    // SAFETY: as for initialize_dsm, in a worker.
    unsafe { pgrx_extern_c_guard(|| state::<T>(node).initialize_worker(node, toc, coordinate)) }
}

unsafe extern "C-unwind" fn shutdown<T: JoinScan>(node: *mut pg_sys::CustomScanState) {
    // SAFETY: as for begin.
    unsafe { pgrx_extern_c_guard(|| state::<T>(node).shutdown(node)) }
}

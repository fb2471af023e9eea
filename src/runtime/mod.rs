//! The backend runtime: what every PostgreSQL surface of the extension (the SQL functions, the
//! C API, the plan nodes) and the GPU service's worker share in a process: this process's
//! segment manager, the provider and executor choice, error reporting, authorisation against
//! the owner role, and PostgreSQL's process conventions (exit callbacks, interrupts held off).
//!
//! It sits below the surfaces and above the execution seam (`crate::exec`): a surface asks it
//! for the cluster's executor ([`with_executor`]) and never which one it got. `crate::init`
//! (`_PG_init`) sets the process up.
//!
//! # What runs where
//!
//! - postmaster: `_PG_init` defines the GUCs, reserves the address arena, installs the shared
//!   memory hooks and registers the broker. It never creates, maps or opens a chunk.
//! - broker (background worker): holds chunk fds (`broker::worker`).
//! - GPU service (background worker, `crate::service`): in service mode, runs every operation
//!   on segment memory, with the cluster's provider; not registered under
//!   `gpu_execution = process`.
//! - backends, parallel workers, other background workers: a [`Segments`] manager created on
//!   first use, whose attachments are undone by a `before_shmem_exit` callback. Its provider
//!   maps chunks in process mode; in service mode it maps the host tier (memfds under every
//!   provider there) and never a device chunk (`provider::remote`).
//!
//! # Two ways to memory, and which to use
//!
//! - [`with_executor`] (and [`try_executor`]): every operation on segment *contents* and every
//!   registry change (create, grow, drop, migrate, read, write, the GpuJoin work). It hands the
//!   cluster's executor (this process's manager, or the GPU service); the caller never asks
//!   which.
//! - [`with_segments`] (and [`try_with_segments`], [`if_segments`]): only what belongs to this
//!   process whatever the mode: its pins and session pins, its mappings (`attach_segment`, the
//!   C API's pins and addresses) and forgetting a dropped segment's attachment.
//!
//! Where a surface's behaviour depends on the mode or the provider, it asks a question here
//! phrased as what it needs ([`maps_segment_memory`], [`check_device_addresses`],
//! [`request_staging_bytes`], [`gpu_does_the_work`], [`per_process_cuda`]), never "service or
//! process", "CUDA or host".

use std::cell::RefCell;
use std::path::PathBuf;

use pgrx::pg_sys;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::{PgLogLevel, PgSqlErrorCode};

use crate::error::{Code, Result, UvmError};
use crate::exec::local::Local;
use crate::exec::{Call, Done, Executor, Io, Mode, Request, SegRef, Started};
use crate::guc;
use crate::provider::cuda::CudaProvider;
use crate::provider::host::HostProvider;
use crate::provider::remote::RemoteProvider;
use crate::provider::{Provider, ProviderKind};
use crate::registry::shmem::{self, ExclusiveGuard, SharedGuard};
use crate::registry::SegmentInfo;
use crate::segment::{Env, ExitDuties, Limits, Segments};
use crate::service::client::Client;
use crate::service::shmem::channel;

/// How long a cleanup waits for the GPU service ([`try_with_executor`]).
const CLEANUP_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Whether this process is the GPU service (set once at its start).
static IS_SERVICE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Marks this process as the GPU service: its segment manager gets the real provider whatever
/// the mode.
pub fn set_service_process() {
    IS_SERVICE.store(true, std::sync::atomic::Ordering::Release);
}

/// The cluster's execution mode (waiting, serving interrupts, while the service decides it).
pub fn execution_mode() -> Result<Mode> {
    crate::service::client::mode(&channel()?)
}

/// Runs `f` with the cluster's executor: this process's segment manager in process mode, the
/// GPU service in service mode. An error is raised as a PostgreSQL ERROR.
pub fn with_executor<R>(f: impl FnOnce(&mut dyn Executor) -> Result<R>) -> R {
    try_executor(f).unwrap_or_else(|e| report(e))
}

/// [`with_executor`], returning the error instead of raising it.
pub fn try_executor<R>(f: impl FnOnce(&mut dyn Executor) -> Result<R>) -> Result<R> {
    match execution_mode()? {
        Mode::Service => f(&mut ServiceExecutor { client: Client::new(channel()?) }),
        _ => try_with_segments(|s| f(&mut Local { segs: s })),
    }
}

/// Service mode's executor in a client process: what this process can do on its own mappings
/// (`exec::local::run_here`: reads, writes, checksums and fills of bytes in the host tier, which
/// it maps, unless `pg_uvm_share.map_host_tier` is off) runs here; everything else goes to the
/// GPU service.
struct ServiceExecutor {
    client: Client,
}

impl ServiceExecutor {
    /// `req` run on this process's mappings, or `None` where the service must run it. Not while
    /// this process's segment manager is in use further up the stack (the request then goes to
    /// the service, as it always did).
    fn here(req: &Request, io: &mut Io<'_>) -> Result<Option<Done>> {
        if IS_SERVICE.load(std::sync::atomic::Ordering::Acquire)
            || !guc::MAP_HOST_TIER.get()
            || SEGMENTS.with(|c| c.try_borrow_mut().is_err())
        {
            return Ok(None);
        }
        let call = Call::decode(req)?;
        // Only these may run here (the GpuJoin operations and the rest never do): no segment
        // manager is made for the others.
        if !matches!(call, Call::Read(_) | Call::Write(_) | Call::Checksum(_) | Call::Fill(_)) {
            return Ok(None);
        }
        try_with_segments(|s| crate::exec::local::run_here(s, &call, io))
    }
}

impl Executor for ServiceExecutor {
    fn mode(&self) -> Mode {
        Mode::Service
    }

    fn max_io(&self) -> usize {
        self.client.max_io()
    }

    fn run(&mut self, req: &Request, mut io: Io<'_>) -> Result<Done> {
        match Self::here(req, &mut io)? {
            Some(done) => Ok(done),
            None => self.client.run(req, io),
        }
    }

    fn start(&mut self, req: &Request, input: &[u8]) -> Result<Started> {
        match Self::here(req, &mut Io::In(input))? {
            Some(done) => Ok(Started::Ready(Ok(done))),
            None => self.client.start(req, input),
        }
    }
}

/// Runs `f` with interrupts held off (`HOLD_INTERRUPTS`), so that a cancel arriving meanwhile
/// cannot raise an ERROR inside it: for cleanups in drop guards and callbacks. The hold ends
/// when `f` returns or unwinds.
pub fn held_off<R>(f: impl FnOnce() -> R) -> R {
    struct Hold;
    impl Drop for Hold {
        fn drop(&mut self) {
            // SAFETY: a process-local counter of the main thread, raised by `held_off` below.
            unsafe { pg_sys::InterruptHoldoffCount -= 1 };
        }
    }
    // SAFETY: as above; lowered again by Hold's drop.
    unsafe { pg_sys::InterruptHoldoffCount += 1 };
    let _hold = Hold;
    f()
}

/// [`with_executor`], returning the error instead of raising it, and waiting for the service at
/// most 10 s: for cleanups in drop guards, which run with interrupts held off.
pub fn try_with_executor<R>(f: impl FnOnce(&mut dyn Executor) -> Result<R>) -> Result<R> {
    match execution_mode()? {
        Mode::Service => f(&mut ServiceExecutor {
            client: Client { ch: channel()?, deadline: Some(std::time::Instant::now() + CLEANUP_WAIT) },
        }),
        _ => try_with_segments(|s| f(&mut Local { segs: s })),
    }
}

/// Finds segment `name` in the registry and checks the current user may `action` it (42501
/// otherwise; 42939 for a name in the plan nodes' reserved namespace, whether or not such a
/// segment exists): the reference a request carries, and the snapshot it was resolved from.
pub fn resolve(name: &str, action: &str) -> Result<(SegRef, SegmentInfo)> {
    crate::registry::validate_name(name)?;
    crate::registry::check_not_reserved(name)?;
    let info = {
        let reg = shmem::shared()?;
        let slot = reg.lookup(name)?;
        reg.info(slot)
    };
    authorize(info.owner, name, action)?;
    Ok((SegRef::new(name, info.id)?, info))
}

/// Finds segment `name` without checking privileges or the reserved namespace: for the
/// extension's own segments (column caches), whose users it authorizes itself.
pub fn lookup_own(name: &str) -> Result<(SegRef, SegmentInfo)> {
    let info = {
        let reg = shmem::shared()?;
        let slot = reg.lookup(name)?;
        reg.info(slot)
    };
    Ok((SegRef::new(name, info.id)?, info))
}

/// Raises `e` as a PostgreSQL ERROR with its SQLSTATE. Does not return.
pub fn report(e: UvmError) -> ! {
    let mut r = ErrorReport::new(sqlstate(e.code), e.message, "pg_uvm_share");
    if let Some(d) = e.detail {
        r = r.set_detail(d);
    }
    if let Some(h) = e.hint {
        r = r.set_hint(h);
    }
    r.report(PgLogLevel::ERROR);
    unreachable!("ereport(ERROR) returned")
}

fn sqlstate(c: Code) -> PgSqlErrorCode {
    use PgSqlErrorCode::*;
    match c {
        Code::InvalidParameterValue => ERRCODE_INVALID_PARAMETER_VALUE,
        Code::NullValueNotAllowed => ERRCODE_NULL_VALUE_NOT_ALLOWED,
        Code::OutOfRange => ERRCODE_ARRAY_ELEMENT_ERROR, // 2202E, alias of ARRAY_SUBSCRIPT_ERROR
        Code::InvalidName => ERRCODE_INVALID_NAME,
        Code::NameTooLong => ERRCODE_NAME_TOO_LONG,
        Code::DatatypeMismatch => ERRCODE_DATATYPE_MISMATCH,
        Code::UndefinedObject => ERRCODE_UNDEFINED_OBJECT,
        Code::DuplicateObject => ERRCODE_DUPLICATE_OBJECT,
        Code::InsufficientPrivilege => ERRCODE_INSUFFICIENT_PRIVILEGE,
        Code::ProgramLimitExceeded => ERRCODE_PROGRAM_LIMIT_EXCEEDED,
        Code::ConfigurationLimitExceeded => ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
        Code::OutOfMemory => ERRCODE_OUT_OF_MEMORY,
        Code::ObjectInUse => ERRCODE_OBJECT_IN_USE,
        Code::ObjectNotInPrerequisiteState => ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        Code::FeatureNotSupported => ERRCODE_FEATURE_NOT_SUPPORTED,
        Code::LockNotAvailable => ERRCODE_LOCK_NOT_AVAILABLE,
        Code::SystemError => ERRCODE_SYSTEM_ERROR,
        Code::ProtocolViolation => ERRCODE_PROTOCOL_VIOLATION,
        Code::NumericValueOutOfRange => ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE,
        Code::QueryCanceled => ERRCODE_QUERY_CANCELED,
        Code::ReservedName => ERRCODE_RESERVED_NAME,
        Code::UndefinedColumn => ERRCODE_UNDEFINED_COLUMN,
        Code::DivisionByZero => ERRCODE_DIVISION_BY_ZERO,
        Code::InvalidTransactionState => ERRCODE_INVALID_TRANSACTION_STATE,
        Code::AdminShutdown => ERRCODE_ADMIN_SHUTDOWN,
    }
}

/// The interrupt hook of the plain-Rust loops (`crate::interrupt`): a pending cancel or
/// timeout raises its ERROR here, which unwinds through the loop's guards. A pending exit
/// (`pg_terminate_backend`, a fast shutdown) would exit the process from inside the operation
/// (a FATAL does not unwind), with the segment manager still in use, so that the exit
/// callbacks could not drop this process's temporary segments: it ends the operation with an
/// error instead (57P01), and stays pending for PostgreSQL's next check, outside it, after the
/// abort has dropped them.
pub(crate) fn check_for_interrupts() -> Result<()> {
    // SAFETY: reads this process's interrupt flags (the main thread: the hook's).
    let exiting = unsafe { pg_sys::ProcDiePending != 0 && pg_sys::InterruptHoldoffCount == 0 && pg_sys::CritSectionCount == 0 };
    if exiting {
        return Err(UvmError::new(Code::AdminShutdown, "terminating connection due to administrator command"));
    }
    pg_sys::check_for_interrupts!();
    Ok(())
}

/// The registry through PostgreSQL's LWLock, for the segment layer.
#[derive(Clone)]
pub struct PgEnv;

impl Env for PgEnv {
    type Shared = SharedGuard;
    type Exclusive = ExclusiveGuard;
    fn shared(&self) -> Result<SharedGuard> {
        shmem::shared()
    }
    fn exclusive(&self) -> Result<ExclusiveGuard> {
        shmem::exclusive()
    }
    fn pid(&self) -> i32 {
        // SAFETY: MyProcPid is set at process start and never changes.
        unsafe { pg_sys::MyProcPid }
    }
    fn broker_path(&self) -> PathBuf {
        // Every PostgreSQL process runs in the data directory.
        PathBuf::from(crate::broker::SOCKET_NAME)
    }
}

thread_local! {
    /// This process's segment manager, created on first use. PostgreSQL backends are
    /// single-threaded; no other thread ever touches it.
    static SEGMENTS: RefCell<Option<Segments<PgEnv>>> = const { RefCell::new(None) };
    /// What the manager's migrations hold in the registry, reachable at exit where the manager
    /// is not (see `on_exit`).
    static EXIT_DUTIES: RefCell<Option<ExitDuties>> = const { RefCell::new(None) };
}

fn limits() -> Limits {
    Limits {
        min_chunk: guc::min_chunk_size(),
        max_segment_size: guc::max_segment_size(),
        device_limit: guc::device_memory_limit(),
        pin_wait: std::time::Duration::from_millis(guc::PIN_WAIT_TIMEOUT_MS.get().max(0) as u64),
        pool_size: guc::host_pool().0,
        pool_piece: guc::host_pool().1,
    }
}

/// The provider of this process: the one recorded in the registry for the whole cluster, or,
/// for the first process, the one `pg_uvm_share.provider` picks (`auto`: CUDA when the driver
/// loads and the GPU can share VMM memory through POSIX fds, else host).
fn make_provider() -> Result<Box<dyn Provider>> {
    if !IS_SERVICE.load(std::sync::atomic::Ordering::Acquire) && execution_mode()? == Mode::Service {
        let recorded = shmem::shared()?.provider();
        return Ok(Box::new(RemoteProvider::new(ProviderKind::from_code(recorded).unwrap_or(ProviderKind::Host))));
    }
    let choice = guc::PROVIDER.get();
    let (recorded, arena) = {
        let reg = shmem::shared()?;
        (reg.provider(), reg.arena())
    };
    crate::gpu::set_arena(arena);
    crate::gpu::set_devices_wanted(guc::cuda_devices());
    let wanted = match (ProviderKind::from_code(recorded), choice) {
        (Some(k), _) => k,
        (None, guc::ProviderChoice::Host) => ProviderKind::Host,
        (None, guc::ProviderChoice::Cuda) => ProviderKind::Cuda,
        (None, guc::ProviderChoice::Auto) => {
            if !crate::gpu::driver_present() {
                ProviderKind::Host
            } else {
                match CudaProvider::new() {
                    Ok(_) => ProviderKind::Cuda,
                    // A driver that cannot run the CUDA provider (too old, no VMM): say why,
                    // once per process that decides, and run the host provider.
                    Err(e) => {
                        let why = format!("{}{}", e.message, e.hint.as_deref().map(|h| format!(" ({h})")).unwrap_or_default());
                        pgrx::log!("pg_uvm_share: a CUDA driver is installed, but the CUDA provider cannot run: {why}; using the host provider");
                        shmem::exclusive()?.set_provider_note(&why);
                        ProviderKind::Host
                    }
                }
            }
        }
    };
    let kind = ProviderKind::from_code(shmem::exclusive()?.claim_provider(wanted.code())).expect("valid code");
    match (kind, choice) {
        (ProviderKind::Host, guc::ProviderChoice::Cuda) | (ProviderKind::Cuda, guc::ProviderChoice::Host) => {
            return Err(UvmError::new(
                Code::ObjectNotInPrerequisiteState,
                format!("this cluster already uses provider \"{}\", not \"{}\"", kind.name(), wanted.name()),
            )
            .hint("pg_uvm_share.provider takes effect at server start."))
        }
        _ => {}
    }
    let provider: Box<dyn Provider> = match kind {
        ProviderKind::Host => Box::new(HostProvider::simulating(guc::simulated_devices())),
        ProviderKind::Cuda => {
            let p = CudaProvider::new()
                .map_err(|e| e.hint("The cluster's provider is cuda; this process could not initialise CUDA."))?;
            // In service mode the backends map the host tier without CUDA: its chunks are
            // memfds, which the service registers with CUDA (`uvm_core::provider::cuda`).
            Box::new(if IS_SERVICE.load(std::sync::atomic::Ordering::Acquire) { p.with_memfd_host() } else { p })
        }
    };
    shmem::exclusive()?.record_devices(provider.devices());
    Ok(provider)
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn on_exit(_code: i32, _arg: pg_sys::Datum) {
    // A FATAL error may have been raised while the registry lock was held. (One raised while
    // this process waited for the GPU service is the client's exit callback's business.)
    shmem::release_if_held();
    SEGMENTS.with(|cell| match cell.try_borrow_mut() {
        Ok(mut segs) => {
            if let Some(s) = segs.as_mut() {
                s.detach_all();
            }
        }
        // A FATAL error (pg_terminate_backend, for one) was raised inside a call that borrows
        // the manager: PostgreSQL exits without unwinding, so the manager cannot be used. Its
        // mappings and broker connection end with the process; its attachment slots, the pins
        // counted on them, a migration's place in a pin queue or its migration flag (which
        // would hold every new pin of the segment back for good), and the chunks a migration or
        // a growth had pending (counted in their tier, kept by the broker) are in shared memory
        // and must be given back here.
        Err(_) => {
            if let Ok(mut reg) = PgEnv.exclusive() {
                EXIT_DUTIES.with(|d| {
                    if let Some(d) = d.try_borrow().ok().as_ref().and_then(|d| d.as_ref()) {
                        d.undo(&mut reg);
                    }
                });
                reg.detach_process(PgEnv.pid());
            }
        }
    });
}

/// The provider this cluster uses, once a process has claimed it (the GPU service does at
/// start-up; in process mode, the first process that uses a segment), or the one
/// `pg_uvm_share.provider` names; `None` while `auto` has not been resolved yet. For the
/// planner (`crate::node::gpujoin`'s `enable_gpujoin = auto`), which must not start a provider.
pub fn cluster_provider() -> Option<ProviderKind> {
    let recorded = shmem::shared().ok().and_then(|r| ProviderKind::from_code(r.provider()));
    recorded.or(match guc::PROVIDER.get() {
        guc::ProviderChoice::Host => Some(ProviderKind::Host),
        guc::ProviderChoice::Cuda => Some(ProviderKind::Cuda),
        guc::ProviderChoice::Auto => None,
    })
}

/// Whether a GPU does this cluster's work (its provider is CUDA; unknown yet: false): the
/// planner's `enable_gpujoin = auto`, which must not start a provider.
pub fn gpu_does_the_work() -> bool {
    cluster_provider() == Some(ProviderKind::Cuda)
}

/// Whether this process maps segment memory itself, so that CPU code may read it by address
/// (false where the GPU service runs every operation and maps the segments).
pub fn maps_segment_memory() -> Result<bool> {
    Ok(IS_SERVICE.load(std::sync::atomic::Ordering::Acquire) || execution_mode()? != Mode::Service)
}

/// Whether this process maps `cpu` segments (`TierPref::Cpu`: memfds under every provider): every
/// process in process mode; in service mode a backend with `pg_uvm_share.map_host_tier` on,
/// under either provider (`crate::provider::remote`).
pub fn maps_cpu_segments() -> bool {
    match maps_segment_memory() {
        Ok(true) => true,
        Ok(false) => guc::MAP_HOST_TIER.get(),
        Err(_) => false,
    }
}

/// Ok when this process can hand out device addresses of segment memory (it maps the
/// segments, with the CUDA provider); else the error that says why not.
pub fn check_device_addresses() -> Result<()> {
    if !maps_segment_memory()? {
        return Err(UvmError::new(Code::FeatureNotSupported, "no device address in this process: the GPU service maps segments")
            .hint("pg_uvm_share.gpu_execution is service: launch kernels through the API's launch functions."));
    }
    if try_with_segments(|s| Ok(s.provider().kind()))? != ProviderKind::Cuda {
        return Err(crate::gpu::user::needs_cuda());
    }
    Ok(())
}

/// The bytes of bulk data (keys, bytes read or written) one request carries at most, where
/// requests travel to another process through a staging area; `None` where this process runs
/// them on its own mappings, without a limit.
pub fn request_staging_bytes() -> Option<u64> {
    match channel().map(|c| (c.mode(), c.staging_bytes())) {
        Ok((Mode::Service, staging)) => Some(staging as u64),
        _ => None,
    }
}

/// The cluster's execution, as `uvm.device_info()` reports it: the mode, the GPU service's pid
/// and its request counters.
pub fn execution_report() -> Result<Vec<(String, String)>> {
    let mode = execution_mode()?;
    let ch = channel()?;
    let (submitted, completed, abandoned) = ch.counters();
    let mut rows = vec![
        ("execution".to_string(), mode.name().to_string()),
        ("service_pid".into(), ch.service_pid().to_string()),
        ("service_requests".into(), format!("{submitted} submitted, {completed} completed, {abandoned} abandoned")),
    ];
    // Why a driver that is installed does not run the CUDA provider (provider = auto).
    if let Some(note) = shmem::shared()?.provider_note() {
        rows.push(("cuda_unavailable".into(), note));
    }
    Ok(rows)
}

/// Requests the GPU service routed to GPU `n` (0 in process mode).
pub fn routed_to(n: u32) -> u64 {
    channel().map(|c| c.routed(n)).unwrap_or(0)
}

/// Whether every process of the cluster runs its kernels itself with CUDA (the `process`
/// execution mode on the CUDA provider): each parallel worker then creates a CUDA context of
/// its own. Asked by the planner, so it does not wait for the service to decide the mode (not
/// decided yet: false).
pub fn per_process_cuda() -> bool {
    cluster_provider() == Some(ProviderKind::Cuda) && channel().map(|c| c.mode()) == Ok(Mode::Process)
}

/// Starts CUDA on a helper thread (`gpu::warm_up_in_background`) when this cluster's provider is
/// CUDA and this process has no segment manager yet: the GpuJoin aggregates call it at their
/// first row, so that a parallel worker's CUDA start-up overlaps its scan. The helper is joined
/// at process exit.
pub fn warm_up_gpu() {
    thread_local! {
        static ASKED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    if ASKED.with(|a| a.replace(true)) || SEGMENTS.with(|c| c.borrow().is_some()) {
        return;
    }
    if channel().map(|c| c.mode()) != Ok(Mode::Process) {
        return; // the service (or nobody yet) runs the kernels
    }
    let Ok((recorded, arena)) = shmem::shared().map(|r| (r.provider(), r.arena())) else { return };
    if ProviderKind::from_code(recorded) != Some(ProviderKind::Cuda) {
        return;
    }
    crate::gpu::set_arena(arena);
    crate::gpu::set_devices_wanted(guc::cuda_devices());
    // SAFETY: registers a callback PostgreSQL runs at process exit; it is pg_guard'ed.
    unsafe { pg_sys::on_proc_exit(Some(join_warm_up), pg_sys::Datum::from(0)) };
    crate::gpu::warm_up_in_background();
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn join_warm_up(_code: i32, _arg: pg_sys::Datum) {
    crate::gpu::join_warm_up();
}

/// Runs `f` with this process's segment manager, creating it on first use; an error is raised
/// as a PostgreSQL ERROR.
pub fn with_segments<R>(f: impl FnOnce(&mut Segments<PgEnv>) -> Result<R>) -> R {
    try_with_segments(f).unwrap_or_else(|e| report(e))
}

/// Runs `f` with this process's segment manager if it has one (an error is raised).
pub fn if_segments(f: impl FnOnce(&mut Segments<PgEnv>) -> Result<()>) {
    let r = SEGMENTS.with(|cell| match cell.borrow_mut().as_mut() {
        Some(s) => f(s),
        None => Ok(()),
    });
    r.unwrap_or_else(|e| report(e))
}

/// [`with_segments`], returning the error (the GPU service answers it to its client).
pub fn try_with_segments<R>(f: impl FnOnce(&mut Segments<PgEnv>) -> Result<R>) -> Result<R> {
    SEGMENTS.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            if !shmem::available() {
                return Err(UvmError::new(
                    Code::ObjectNotInPrerequisiteState,
                    "pg_uvm_share is not loaded through shared_preload_libraries",
                ));
            }
            let provider = make_provider()?;
            // SAFETY: registers a callback PostgreSQL runs at process exit; `on_exit` is a
            // pg_guard'ed C-unwind function.
            unsafe { pg_sys::before_shmem_exit(Some(on_exit), pg_sys::Datum::from(0)) };
            let segs = Segments::new(PgEnv, provider, limits());
            EXIT_DUTIES.with(|d| *d.borrow_mut() = Some(segs.exit_duties()));
            *slot = Some(segs);
        }
        let segs = slot.as_mut().expect("created above");
        segs.limits = limits(); // the SIGHUP-reloadable settings may have changed
        f(segs)
    })
}

/// The current user, for ownership of new segments.
pub fn current_user() -> u32 {
    // SAFETY: GetUserId reads the session's current user id.
    unsafe { pg_sys::GetUserId() }.to_u32()
}

/// Fails with 42501 unless the current user has the privileges of role `owner` (is it, is a
/// member of it, or is a superuser), as for a table's owner; with 42939 for a name in the plan
/// nodes' reserved namespace, which no user touches (the nodes' own operations do not come
/// here).
pub fn authorize(owner: u32, name: &str, action: &str) -> Result<()> {
    crate::registry::check_not_reserved(name)?;
    // SAFETY: has_privs_of_role reads the role membership cache of this backend.
    let ok = unsafe { pg_sys::has_privs_of_role(pg_sys::GetUserId(), pg_sys::Oid::from(owner)) };
    if ok {
        Ok(())
    } else {
        Err(UvmError::new(Code::InsufficientPrivilege, format!("permission denied to {action} segment \"{name}\""))
            .detail("Only roles with the privileges of the segment's owner may use it."))
    }
}

/// Now, as a PostgreSQL timestamptz.
pub fn now() -> i64 {
    // SAFETY: GetCurrentTimestamp reads the clock.
    unsafe { pg_sys::GetCurrentTimestamp() }
}

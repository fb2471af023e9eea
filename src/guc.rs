//! Configuration: every setting lives under the reserved prefix `pg_uvm_share.`.
//!
//! Capacities and the provider are fixed at postmaster start (`PGC_POSTMASTER`), because they
//! size shared memory and the inherited address arena. Chunk sizing, the maximum segment size
//! and the device budget may change on reload (`PGC_SIGHUP`); they apply to later operations.

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting, PostgresGucEnum};
use pgrx::pg_sys;

pub const MIB: u64 = 1 << 20;

/// Which provider backs new chunks.
#[derive(PostgresGucEnum, Clone, Copy, PartialEq, Eq, Debug)]
pub enum ProviderChoice {
    /// CUDA when libcuda loads and the device can share VMM memory; else host.
    #[name = c"auto"]
    Auto,
    /// memfd chunks, CPU only.
    #[name = c"host"]
    Host,
    /// CUDA VMM chunks; an error where CUDA is unusable.
    #[name = c"cuda"]
    Cuda,
}

/// Where segment operations and GPU work run (see `crate::service`).
#[derive(PostgresGucEnum, Clone, Copy, PartialEq, Eq, Debug)]
pub enum ExecutionChoice {
    /// The service under the CUDA provider, each process under the host provider.
    #[name = c"auto"]
    Auto,
    /// Every operation on segment memory in the GPU service (one CUDA context per GPU).
    #[name = c"service"]
    Service,
    /// Every process on its own (its own CUDA context under the CUDA provider).
    #[name = c"process"]
    Process,
}

/// Whether the planner may use the GpuJoin plan node (`crate::node::gpujoin`).
#[derive(PostgresGucEnum, Clone, Copy, PartialEq, Eq, Debug)]
pub enum GpuJoinChoice {
    /// On when the cluster's provider is CUDA (the CPU path is never faster than PostgreSQL's
    /// own joins).
    #[name = c"auto"]
    Auto,
    #[name = c"on"]
    On,
    #[name = c"off"]
    Off,
}

pub static ENABLE_GPUJOIN: GucSetting<GpuJoinChoice> = GucSetting::<GpuJoinChoice>::new(GpuJoinChoice::Auto);
pub static GPUJOIN_LEADER_PROBES: GucSetting<GpuJoinChoice> = GucSetting::<GpuJoinChoice>::new(GpuJoinChoice::Auto);
pub static GPUGROUPAGG_HEAP: GucSetting<GpuJoinChoice> = GucSetting::<GpuJoinChoice>::new(GpuJoinChoice::Off);
pub static GPU_EXECUTION: GucSetting<ExecutionChoice> = GucSetting::<ExecutionChoice>::new(ExecutionChoice::Auto);
pub static SERVICE_SLOTS: GucSetting<i32> = GucSetting::<i32>::new(32);
pub static SERVICE_STAGING_MB: GucSetting<i32> = GucSetting::<i32>::new(4);
pub static SERVICE_THREADS: GucSetting<i32> = GucSetting::<i32>::new(4);
pub static SERVICE_GPUS: GucSetting<i32> = GucSetting::<i32>::new(0);
pub static MAX_SEGMENTS: GucSetting<i32> = GucSetting::<i32>::new(256);
pub static SIMULATED_DEVICES: GucSetting<i32> = GucSetting::<i32>::new(0);
pub static CUDA_DEVICES: GucSetting<i32> = GucSetting::<i32>::new(1);
pub static HOST_POOL_SIZE_MB: GucSetting<i32> = GucSetting::<i32>::new(0);
pub static HOST_POOL_PIECE_MB: GucSetting<i32> = GucSetting::<i32>::new(256);
pub static MAX_CHUNKS: GucSetting<i32> = GucSetting::<i32>::new(4096);
pub static MAX_ATTACHMENTS: GucSetting<i32> = GucSetting::<i32>::new(4096);
pub static MIN_CHUNK_SIZE_MB: GucSetting<i32> = GucSetting::<i32>::new(2);
pub static MAX_SEGMENT_SIZE_MB: GucSetting<i32> = GucSetting::<i32>::new(64 * 1024);
pub static DEVICE_MEMORY_LIMIT_MB: GucSetting<i32> = GucSetting::<i32>::new(-1);
pub static PIN_WAIT_TIMEOUT_MS: GucSetting<i32> = GucSetting::<i32>::new(10_000);
pub static MAP_HOST_TIER: GucSetting<bool> = GucSetting::<bool>::new(true);
pub static ENABLE_CACHE: GucSetting<bool> = GucSetting::<bool>::new(true);
pub static ENABLE_GPUGROUPAGG: GucSetting<bool> = GucSetting::<bool>::new(true);
pub static ENABLE_ASYNC_DIMENSIONS: GucSetting<bool> = GucSetting::<bool>::new(true);
pub static CACHE_REFRESH_DELAY_MS: GucSetting<i32> = GucSetting::<i32>::new(-1);
pub static CACHE_APPEND_ROWS: GucSetting<i32> = GucSetting::<i32>::new(1 << 20);
pub static TEST_ALLOC_LIMIT_KB: GucSetting<i32> = GucSetting::<i32>::new(-1);
pub static PROVIDER: GucSetting<ProviderChoice> = GucSetting::<ProviderChoice>::new(ProviderChoice::Auto);

/// Registers every GUC and reserves the prefix. Called once from `_PG_init`.
pub fn define() {
    GucRegistry::define_int_guc(
        c"pg_uvm_share.max_segments",
        c"Maximum number of shared segments in the cluster.",
        c"Sizes the registry in shared memory.",
        &MAX_SEGMENTS,
        1,
        65536,
        GucContext::Postmaster,
        GucFlags::empty(),
    );
    GucRegistry::define_int_guc(
        c"pg_uvm_share.max_chunks",
        c"Maximum number of chunks over all shared segments.",
        c"Sizes the registry's chunk table in shared memory.",
        &MAX_CHUNKS,
        1,
        1 << 20,
        GucContext::Postmaster,
        GucFlags::empty(),
    );
    GucRegistry::define_int_guc(
        c"pg_uvm_share.max_attachments",
        c"Maximum number of (process, segment) attachments shown in uvm.attachments.",
        c"Each process that maps a segment takes one slot until it detaches or exits.",
        &MAX_ATTACHMENTS,
        16,
        1 << 20,
        GucContext::Postmaster,
        GucFlags::empty(),
    );
    GucRegistry::define_int_guc(
        c"pg_uvm_share.min_chunk_size",
        c"Size of a segment's first growth chunk; later chunks double every two chunks.",
        c"Rounded up to the provider's granularity (2 MB).",
        &MIN_CHUNK_SIZE_MB,
        2,
        1024,
        GucContext::Sighup,
        GucFlags::UNIT_MB,
    );
    GucRegistry::define_int_guc(
        c"pg_uvm_share.max_segment_size",
        c"Largest maximum size a segment may have.",
        c"Each segment reserves address space for its maximum size; the arena reserved at \
          start-up is max_segments times this, up to 64 TB.",
        &MAX_SEGMENT_SIZE_MB,
        2,
        i32::MAX,
        GucContext::Postmaster,
        GucFlags::UNIT_MB,
    );
    GucRegistry::define_int_guc(
        c"pg_uvm_share.device_memory_limit",
        c"Device-tier bytes all segments together may commit on each GPU; -1 means the GPU's memory.",
        c"Chunks of tier auto go to the GPU with the most room and spill to the host tier once every GPU is at its limit.",
        &DEVICE_MEMORY_LIMIT_MB,
        -1,
        i32::MAX,
        GucContext::Sighup,
        GucFlags::UNIT_MB,
    );
    GucRegistry::define_int_guc(
        c"pg_uvm_share.host_pool_size",
        c"Pinned host memory the GPU service keeps ready for migrations to the host tier.",
        c"In pieces of pg_uvm_share.host_pool_piece; a migration to the host tier takes pieces instead of pinning new memory, and one to the device gives pieces back. 0 (the default): no pool.",
        &HOST_POOL_SIZE_MB,
        0,
        i32::MAX,
        GucContext::Sighup,
        GucFlags::UNIT_MB,
    );
    GucRegistry::define_int_guc(
        c"pg_uvm_share.host_pool_piece",
        c"Size of each piece of the host pool.",
        c"A chunk migrated to the host tier becomes one chunk per piece (at most 64 chunks per segment), so larger pieces suit larger chunks.",
        &HOST_POOL_PIECE_MB,
        2,
        1 << 20,
        GucContext::Sighup,
        GucFlags::UNIT_MB,
    );
    GucRegistry::define_int_guc(
        c"pg_uvm_share.cuda_devices",
        c"CUDA provider: how many GPUs device chunks may be placed on.",
        c"Device 0 and the next GPUs that can share VMM memory and have peer access with it. Kernels run on device 0, reading chunks on the others over the interconnect; 1 (the default) keeps everything on device 0.",
        &CUDA_DEVICES,
        1,
        crate::vocab::MAX_DEVICES as i32,
        GucContext::Postmaster,
        GucFlags::empty(),
    );
    GucRegistry::define_int_guc(
        c"pg_uvm_share.simulated_devices",
        c"Host provider only: simulate this many GPUs, whose device-tier chunks are memfds.",
        c"For testing placement, per-GPU budgets, migration between GPUs and the service's routing without a GPU; 0 (the default) gives the host provider no device tier.",
        &SIMULATED_DEVICES,
        0,
        crate::vocab::MAX_DEVICES as i32,
        GucContext::Postmaster,
        GucFlags::empty(),
    );
    GucRegistry::define_enum_guc(
        c"pg_uvm_share.provider",
        c"Memory provider: auto, host (memfd) or cuda (CUDA VMM).",
        c"auto picks cuda when libcuda loads and supports VMM with POSIX fds.",
        &PROVIDER,
        GucContext::Postmaster,
        GucFlags::empty(),
    );
    GucRegistry::define_int_guc(
        c"pg_uvm_share.pin_wait_timeout",
        c"How long a migration waits for pins on a segment to drain (and a pin for a migration to end).",
        c"After it, prefetch_segment (or the access) fails with SQLSTATE 55P03.",
        &PIN_WAIT_TIMEOUT_MS,
        0,
        i32::MAX,
        GucContext::Userset,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_bool_guc(
        c"pg_uvm_share.enable_cache",
        c"Whether queries read a table's column cache (uvm.cache_table) where it is current.",
        c"on (the default): a reader whose snapshot the cache answers exactly reads it; off: every reader reads the heap.",
        &ENABLE_CACHE,
        GucContext::Userset,
        GucFlags::empty(),
    );
    GucRegistry::define_bool_guc(
        c"pg_uvm_share.enable_gpugroupagg",
        c"Whether the planner may compute GROUP BY and aggregates of a table from its column cache (the UvmGpuGroupAgg node).",
        c"on (the default): offered where a ready cache holds every column the query level reads and the query is one the node computes; off: never.",
        &ENABLE_GPUGROUPAGG,
        GucContext::Userset,
        GucFlags::empty(),
    );
    GucRegistry::define_bool_guc(
        c"pg_uvm_share.enable_async_dimensions",
        c"Whether UvmGpuGroupAgg begins its cached dimensions' programs together (as enable_async_append lets an Append's children run at once).",
        c"on (the default): every cached dimension's scan is started before the first one's rows are gathered, so that in the GPU service they run at once; off: one after another.",
        &ENABLE_ASYNC_DIMENSIONS,
        GucContext::Userset,
        GucFlags::empty(),
    );
    GucRegistry::define_int_guc(
        c"pg_uvm_share.cache_refresh_delay",
        c"How long after a column cache goes stale a background worker rebuilds it (-1: never; uvm.cache_table rebuilds).",
        c"A background worker per database rebuilds each stale cache this long after the first write that made it stale, with the privileges of the role that built it, when it can take the table's lock without waiting; at most once per this delay per table.",
        &CACHE_REFRESH_DELAY_MS,
        -1,
        i32::MAX,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"pg_uvm_share.cache_append_rows",
        c"Rows that INSERT and COPY may append to a column cache before it goes stale (0: every insert makes it stale).",
        c"Read when a cache is built: its append tail, in the host tier, holds this many rows (8 bytes per column and 12 more each); an insert that does not fit makes the cache stale until it is rebuilt.",
        &CACHE_APPEND_ROWS,
        0,
        1 << 26,
        GucContext::Userset,
        GucFlags::empty(),
    );
    GucRegistry::define_bool_guc(
        c"pg_uvm_share.map_host_tier",
        c"Service mode: whether this session reads, writes, checksums and fills host-tier bytes through its own mapping.",
        c"on (the default): requests whose bytes all lie in host-tier chunks (memfds in service mode, under every provider) or in segments of the cpu tier run in this process and never wait for the GPU service; off: every request goes to the service. Device memory is always the service's.",
        &MAP_HOST_TIER,
        GucContext::Userset,
        GucFlags::empty(),
    );
    GucRegistry::define_enum_guc(
        c"pg_uvm_share.enable_gpujoin",
        c"Whether the planner may run inner equi-joins as a GpuJoin plan node: auto, on or off.",
        c"auto (the default): on when the cluster's provider is cuda (the planner then picks it by cost), off on the host provider, whose CPU path is never faster than PostgreSQL's own joins; on: offer it on any provider (for tests); off: never.",
        &ENABLE_GPUJOIN,
        GucContext::Userset,
        GucFlags::empty(),
    );
    GucRegistry::define_enum_guc(
        c"pg_uvm_share.gpujoin_leader_probes",
        c"Whether a parallel GpuJoin that computes count(*) and count or sum of one inner column has its workers hand their keys to the leader, which probes them: auto, on or off.",
        c"auto (the default): where each process runs its kernels with a CUDA context of its own (gpu_execution = process under CUDA), so that the workers start none; on: always (for tests); off: every participant probes its own keys. Only where parallel_leader_participation is on.",
        &GPUJOIN_LEADER_PROBES,
        GucContext::Userset,
        GucFlags::empty(),
    );
    GucRegistry::define_enum_guc(
        c"pg_uvm_share.gpugroupagg_heap",
        c"Whether the planner may run UvmGpuGroupAgg over a fact table without a ready column cache, reading its heap: auto, on or off.",
        c"off (the default): only over column caches (over SSB's heap on an H100 about as fast as PostgreSQL's parallel plans, 0.62x-1.59x their time, and its cost as close to theirs); auto: when the cluster's provider is cuda, the planner then picking it by cost; on: on any provider (for tests). The node reads the heap (in parallel where planned) and lays the rows out in column batches for its program.",
        &GPUGROUPAGG_HEAP,
        GucContext::Userset,
        GucFlags::empty(),
    );
    GucRegistry::define_int_guc(
        c"pg_uvm_share.test_alloc_limit",
        c"For tests only: the plan node's allocations whose size follows the data fail above this size.",
        c"They then end the query with SQLSTATE 53200 (out_of_memory), as a real allocation failure does; -1 (the default) turns it off.",
        &TEST_ALLOC_LIMIT_KB,
        -1,
        i32::MAX,
        GucContext::Suset,
        GucFlags::UNIT_KB | GucFlags::NO_SHOW_ALL,
    );
    GucRegistry::define_enum_guc(
        c"pg_uvm_share.gpu_execution",
        c"Where segment operations and GPU kernels run: auto, service or process.",
        c"service: in one GPU service process (one CUDA context per GPU for the cluster); process: in \
          each backend and parallel worker; auto: service under the CUDA provider, process otherwise.",
        &GPU_EXECUTION,
        GucContext::Postmaster,
        GucFlags::empty(),
    );
    GucRegistry::define_int_guc(
        c"pg_uvm_share.service_slots",
        c"Request slots of the GPU service channel (requests in flight at once).",
        c"Submitters wait for a free slot, in order, when all are taken.",
        &SERVICE_SLOTS,
        2,
        4096,
        GucContext::Postmaster,
        GucFlags::empty(),
    );
    GucRegistry::define_int_guc(
        c"pg_uvm_share.service_staging",
        c"Staging memory of each GPU service request slot.",
        c"Bulk input and output of one request (probe keys, bytes read or written); larger data \
          travels in several requests. Shared memory holds service_slots times this.",
        &SERVICE_STAGING_MB,
        1,
        1024,
        GucContext::Postmaster,
        GucFlags::UNIT_MB,
    );
    GucRegistry::define_int_guc(
        c"pg_uvm_share.service_threads",
        c"Executor threads of the GPU service, per GPU.",
        c"Each runs one request at a time; registry changes run on the service's main thread.",
        &SERVICE_THREADS,
        1,
        256,
        GucContext::Postmaster,
        GucFlags::empty(),
    );
    GucRegistry::define_int_guc(
        c"pg_uvm_share.service_gpus",
        c"How many GPUs the GPU service runs requests on: the first N placement GPUs; 0 means all.",
        c"Requests whose data lies on the others are run on these, reading it over the interconnect. For keeping GPUs free of the service's kernels, and for measuring what each added GPU brings.",
        &SERVICE_GPUS,
        0,
        crate::vocab::MAX_DEVICES as i32,
        GucContext::Sighup,
        GucFlags::empty(),
    );
    // SAFETY: called from _PG_init in the main thread, with a static C string.
    #[cfg(not(feature = "pg14"))]
    unsafe {
        pg_sys::MarkGUCPrefixReserved(c"pg_uvm_share".as_ptr())
    };
    // PostgreSQL 14's name for it (renamed in 15).
    // SAFETY: as above.
    #[cfg(feature = "pg14")]
    unsafe {
        pg_sys::EmitWarningsOnPlaceholders(c"pg_uvm_share".as_ptr())
    };
}

pub fn min_chunk_size() -> u64 {
    MIN_CHUNK_SIZE_MB.get().max(1) as u64 * MIB
}

pub fn max_segment_size() -> u64 {
    MAX_SEGMENT_SIZE_MB.get().max(1) as u64 * MIB
}

/// The host pool's size and piece size in bytes (the piece rounded down to the 2 MB granularity).
pub fn host_pool() -> (u64, u64) {
    let piece = HOST_POOL_PIECE_MB.get().max(2) as u64 * MIB / (2 * MIB) * (2 * MIB);
    (HOST_POOL_SIZE_MB.get().max(0) as u64 * MIB, piece)
}

/// The test-only allocation limit of the plan node in bytes (`None`: off), see
/// `crate::node::fallible`.
pub fn test_alloc_limit() -> Option<u64> {
    let v = TEST_ALLOC_LIMIT_KB.get();
    (v >= 0).then(|| v as u64 * 1024)
}

/// How many GPUs the GPU service runs requests on (`None`: all).
pub fn service_gpus() -> Option<usize> {
    let n = SERVICE_GPUS.get();
    (n > 0).then_some(n as usize)
}

/// GPUs the CUDA provider may place chunks on (at least 1).
pub fn cuda_devices() -> u32 {
    CUDA_DEVICES.get().clamp(1, crate::vocab::MAX_DEVICES as i32) as u32
}

/// GPUs the host provider simulates (0: none, no device tier).
pub fn simulated_devices() -> u32 {
    SIMULATED_DEVICES.get().clamp(0, crate::vocab::MAX_DEVICES as i32) as u32
}

/// The device budget of each GPU in bytes, `None` for "whatever the GPU has".
pub fn device_memory_limit() -> Option<u64> {
    let v = DEVICE_MEMORY_LIMIT_MB.get();
    (v >= 0).then(|| v as u64 * MIB)
}

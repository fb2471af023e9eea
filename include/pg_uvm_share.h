/*
 * pg_uvm_share.h — the C API of pg_uvm_share: shared managed segments and GPU work, for other
 * PostgreSQL extensions written in C.
 *
 * Installed by `make install` (and documented for `cargo pgrx install` users, docs/C-API.md) as
 *     $(pg_config --includedir-server)/extension/pg_uvm_share/pg_uvm_share.h
 * so that a PGXS module includes it as
 *     #include "extension/pg_uvm_share/pg_uvm_share.h"
 *
 * How it is reached: pg_uvm_share's _PG_init (in the postmaster: the library must be in
 * shared_preload_libraries) publishes one PgUvmShareApi through
 * find_rendezvous_variable("pg_uvm_share_api"). A consumer never links against pg_uvm_share;
 * it calls pg_uvm_share_api(), which finds the table (loading the library if this process
 * has not), checks the ABI version and the table's size, and caches the pointer.
 *
 * Rules (docs/C-API.md says more):
 *  - Every function is called from PostgreSQL's main thread of a backend, parallel worker or
 *    background worker, inside a transaction (pins belong to CurrentResourceOwner). None may be
 *    called from another thread.
 *  - Every failure is an ereport(ERROR) with the SQLSTATE the SQL surface uses for the same
 *    failure (22023 bad value, 2202E offset or length out of range, 42704 no such segment,
 *    55006 segment in use, 0A000 not possible with this provider or mode, 57014 cancelled,
 *    ...). A bad handle, a released pin, a dropped segment or a stale generation is an ERROR,
 *    never undefined behaviour. Only lookup() reports "no such segment" by its return value.
 *  - A pin belongs to the resource owner current when it was taken (normally the statement's
 *    portal). An ERROR anywhere releases the pins of the aborted owners; a pin still held when
 *    its owner is released at commit is released with a WARNING, as PostgreSQL does for buffer
 *    pins. To keep a pin for the whole transaction, take it with CurrentResourceOwner set to
 *    CurTransactionResourceOwner.
 *  - Addresses: pin->base is where this process addresses the segment (the same address in
 *    every process where pin->same_address is true), or NULL where this process maps no chunk
 *    of it (gpu_execution = service: only the GPU service maps device memory, and the host
 *    tier where it is not memfds). Dereference only chunks marked cpu_mapped.
 *    Offsets are valid everywhere; read() and write() work in every mode and tier.
 *
 * Versioning: PG_UVM_SHARE_ABI_MAJOR changes when an existing member changes meaning or place;
 * a minor version only appends members at the end of PgUvmShareApi. A module built against
 * major M runs with any library of major M whose table is at least as large as the module's
 * PgUvmShareApi; anything else is an ERROR from pg_uvm_share_api(), never a crash.
 */
#ifndef PG_UVM_SHARE_H
#define PG_UVM_SHARE_H

#include "postgres.h"
#include "fmgr.h"
#include "utils/snapshot.h"

#define PG_UVM_SHARE_ABI_MAJOR 1
#define PG_UVM_SHARE_ABI_MINOR 1
#define PG_UVM_SHARE_ABI_VERSION ((PG_UVM_SHARE_ABI_MAJOR << 16) | PG_UVM_SHARE_ABI_MINOR)

/* The name of the rendezvous variable that holds the table. */
#define PG_UVM_SHARE_RENDEZVOUS "pg_uvm_share_api"

/* Tiers, as uvm.segments shows them. */
#define UVM_TIER_HOST 1   /* pinned host memory (memfd without a GPU): the CPU addresses it;
						   * a `cpu` segment's chunks are host memory no GPU maps */
#define UVM_TIER_DEVICE 2 /* GPU memory */

/* A pin, by handle. 0 is never a valid handle; handles are never reused within a process. */
typedef uint64 UvmPinHandle;
/* A kernel launch in flight (launch_start). 0 is never a valid handle. */
typedef uint64 UvmLaunchHandle;

/* A segment as the registry describes it. */
typedef struct UvmSegmentInfo
{
	uint64		id;				/* unique for the cluster's life; a recreated name gets a new id */
	uint64		size;			/* bytes usable now */
	uint64		max_size;		/* bytes it may grow to */
	uint64		generation;		/* moves whenever its chunks change (growth, migration) */
	uint64		host_bytes;		/* committed bytes per tier */
	uint64		device_bytes;
	Oid			owner;			/* the role that owns it */
	uint32		nchunks;
} UvmSegmentInfo;

/* One chunk of a pinned segment. */
typedef struct UvmChunk
{
	uint64		offset;			/* from the segment's start */
	uint64		size;
	uint32		tier;			/* UVM_TIER_HOST or UVM_TIER_DEVICE */
	uint32		cpu_mapped;		/* 1: this process reads and writes it at base + offset */
} UvmChunk;

/* A pin: what pin() fills in. Everything but handle is a snapshot that the pin protects: the
 * chunks stay where they are (no migration, no drop) until the pin is released. */
typedef struct UvmPin
{
	UvmPinHandle handle;
	UvmSegmentInfo info;
	void	   *base;			/* NULL where this process maps no chunk of it */
	bool		same_address;	/* base is the segment's address in every process */
	const UvmChunk *chunks;		/* info.nchunks entries, valid until the pin is released */
} UvmPin;

/* A kernel, given as CUDA C (its entry declared extern "C" __global__) or as PTX. The service
 * (or, in process mode, this process) compiles it once per distinct text and keeps the module. */
typedef struct UvmKernel
{
	const char *source;			/* CUDA C or PTX text */
	uint32		source_len;		/* bytes of source; 0: NUL-terminated */
	uint32		is_ptx;			/* 0: CUDA C (NVRTC), 1: PTX */
	const char *entry;			/* the __global__ function's name, NUL-terminated */
	uint32		grid[3];		/* blocks per grid, each at least 1 */
	uint32		block[3];		/* threads per block, each at least 1 */
	uint32		shared_mem_bytes; /* dynamic shared memory per block */
} UvmKernel;

#define UVM_ARG_SCALAR 1		/* value holds the parameter's bits (size bytes: 1, 2, 4 or 8) */
#define UVM_ARG_SEGMENT 2		/* a pointer parameter: the device address of byte `value` of the
								 * segment of `pin` */

typedef struct UvmKernelArg
{
	uint32		kind;			/* UVM_ARG_SCALAR or UVM_ARG_SEGMENT */
	uint32		size;			/* scalar: its size in bytes; segment: 0 */
	uint64		value;			/* scalar: its bits (little-endian); segment: the offset */
	UvmPinHandle pin;			/* segment: a pin of this process on it; scalar: 0 */
} UvmKernelArg;

/* The most arguments one launch takes. */
#define UVM_MAX_KERNEL_ARGS 32

/* Column caches (1.1): how a cache's values are stored (crates/uvm_core/src/cache: the format's
 * numbers, fixed). Values are little-endian, `width` bytes each. */
#define UVM_ENC_BOOL 1			/* 1 byte, 0 or 1 */
#define UVM_ENC_INT2 2
#define UVM_ENC_INT4 3
#define UVM_ENC_INT8 4
#define UVM_ENC_FLOAT4 5		/* IEEE 754 bits */
#define UVM_ENC_FLOAT8 6
#define UVM_ENC_DATE 7			/* int4: PostgreSQL's DateADT, days from 2000-01-01 */
#define UVM_ENC_TIMESTAMP 8		/* int8: PostgreSQL's Timestamp, microseconds from 2000-01-01 */
#define UVM_ENC_TIMESTAMPTZ 9	/* int8: PostgreSQL's TimestampTz */
#define UVM_ENC_NUMERIC 10		/* int8: the number x 10^scale */
#define UVM_ENC_DICT_CODE 11	/* uint4: a code of the column's dictionary */

/* One cached column. In block b (at data_offset + b * block_bytes from the segment's start),
 * row r's value is at values_at + r * width and its NULL flag is bit (r % 8) of the byte at
 * nulls_at + r / 8 (1: NULL; the value bytes are then 0), for r below the block's own row
 * count (the uint64 at the block's start). */
typedef struct UvmCacheColumn
{
	int16		attnum;			/* the table's column number */
	uint16		encoding;		/* UVM_ENC_* */
	uint16		width;			/* bytes per value */
	int16		scale;			/* UVM_ENC_NUMERIC: the stored integer is the number x 10^scale */
	uint64		values_at;		/* from the block's start */
	uint64		nulls_at;		/* from the block's start */
	UvmPinHandle dictionary;	/* UVM_ENC_DICT_CODE: a pin of the dictionary's segment (its
								 * layout: docs/C-API.md); 0 for the other encodings */
} UvmCacheColumn;

/* A table's column cache, pinned: what cache_pin() fills in. */
typedef struct UvmCache
{
	UvmPin		pin;			/* the cache's segment: read through it (read(), or base where
								 * cpu_mapped); unpin() it, and each column's dictionary, when done
								 * (or let the resource owner release them) */
	uint64		rows;			/* rows in all blocks */
	uint64		blocks;
	uint64		block_rows;		/* rows a block holds at most; each block's own count (a uint64
								 * at its start) may be less, in any block (parallel builds) */
	uint64		block_bytes;
	uint64		data_offset;	/* where block 0 starts */
	uint64		block_header_bytes; /* bytes of a block's header (its row count first) */
	uint32		ncolumns;
	const UvmCacheColumn *columns; /* ncolumns entries, valid as long as the pin */
} UvmCache;

typedef struct PgUvmShareApi
{
	uint32		abi_version;	/* PG_UVM_SHARE_ABI_VERSION of the library */
	uint32		struct_size;	/* sizeof(PgUvmShareApi) of the library */
	const char *library_version; /* the extension's version, e.g. "0.3.0" */

	/* "process" or "service": who maps segment memory and runs kernels (uvm.device_info()). */
	const char *(*execution_mode) (void);

	/* Segments. Names follow the SQL surface (1 to 63 bytes); the current user needs the owner
	 * role's privileges, as for the SQL functions. */
	bool		(*lookup) (const char *name, UvmSegmentInfo *info); /* false: no such segment */
	/* tier: "auto", "device", "device:N" (GPU N) or "host"; max_size < 0: pg_uvm_share.max_segment_size. */
	uint64		(*create) (const char *name, int64 size, int64 max_size, const char *tier);
	void		(*drop) (const char *name); /* 55006 while any process pins it */
	int64		(*grow) (const char *name, int64 new_size); /* returns the new size */
	/* Maps the segment into this process now (a no-op in service mode) and describes it. */
	void		(*attach) (const char *name, UvmSegmentInfo *info);

	/* Pins: expect, if not NULL, must match the segment's id (else 42704: dropped and created
	 * again) and, if expect->generation is not 0, its generation (else 55000: its chunks changed
	 * since the caller looked). */
	void		(*pin) (const char *name, const UvmSegmentInfo *expect, UvmPin *pin);
	void		(*unpin) (UvmPinHandle pin);

	/* Copies through the pin, in any tier and mode, bounded by the pinned size. */
	void		(*read) (UvmPinHandle pin, int64 offset, void *dst, int64 len);
	void		(*write) (UvmPinHandle pin, int64 offset, const void *src, int64 len);

	/* Process mode under CUDA: the device address of [offset, offset + len) for this process's
	 * own kernels (its primary context). 0A000 in service mode and without a GPU. */
	uint64		(*device_address) (UvmPinHandle pin, int64 offset, int64 len);

	/* Runs a kernel where the cluster runs its GPU work (the service, or this process), and
	 * waits for it. 0A000 without a GPU. */
	void		(*launch) (const UvmKernel *kernel, const UvmKernelArg *args, int nargs);
	/* Starts it and returns at once; launch_wait waits for it and raises its error, if any. A
	 * launch never waited for is given up when its resource owner is released. */
	UvmLaunchHandle (*launch_start) (const UvmKernel *kernel, const UvmKernelArg *args, int nargs);
	void		(*launch_wait) (UvmLaunchHandle launch);

	/* 1.1: column caches. The cache of table `relid` if it answers exactly what the heap would
	 * under `snapshot` (an MVCC snapshot the caller holds, e.g. the query's; the extension's
	 * reader's rule, docs/C-API.md): pins it (and each dictionary) for CurrentResourceOwner,
	 * fills *cache and returns true. false where no cache may be read instead of the heap: none,
	 * stale, being built or dropped, a snapshot that may not see it, SERIALIZABLE,
	 * pg_uvm_share.enable_cache off. 42501 without SELECT on the table. */
	bool		(*cache_pin) (Oid relid, Snapshot snapshot, UvmCache *cache);
} PgUvmShareApi;

/* The table, checked against the ABI major version and size a module was built for. */
static inline const PgUvmShareApi *
pg_uvm_share_api_for(uint32 abi_major, uint32 min_size)
{
	const PgUvmShareApi **slot;
	const PgUvmShareApi *api;

	slot = (const PgUvmShareApi **) find_rendezvous_variable(PG_UVM_SHARE_RENDEZVOUS);
	if (*slot == NULL)
		load_file("pg_uvm_share", false);	/* ERRORs unless it is preloaded */
	api = *slot;
	if (api == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("pg_uvm_share's C API is not available in this process"),
				 errhint("Add pg_uvm_share to shared_preload_libraries and restart the server.")));
	if ((api->abi_version >> 16) != abi_major)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("pg_uvm_share's C API has ABI version %u.%u, but this module was built for version %u.x",
						api->abi_version >> 16, api->abi_version & 0xffff, abi_major),
				 errhint("Rebuild the module against the installed pg_uvm_share.h.")));
	if (api->struct_size < min_size)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("pg_uvm_share's C API (version %u.%u, library %s) is older than this module needs",
						api->abi_version >> 16, api->abi_version & 0xffff, api->library_version),
				 errhint("Install the pg_uvm_share the module was built against, or rebuild the module.")));
	return api;
}

/* The table for the version this module is compiled against; cached per translation unit. */
static inline const PgUvmShareApi *
pg_uvm_share_api(void)
{
	static const PgUvmShareApi *cached = NULL;

	if (cached == NULL)
		cached = pg_uvm_share_api_for(PG_UVM_SHARE_ABI_MAJOR, (uint32) sizeof(PgUvmShareApi));
	return cached;
}

#endif							/* PG_UVM_SHARE_H */

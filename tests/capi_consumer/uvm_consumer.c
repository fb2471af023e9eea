/*
 * uvm_consumer — a small extension that uses pg_uvm_share only through its C API, the way a GPU
 * extension written in C would (docs/C-API.md). It is built with PGXS against the INSTALLED
 * header and tested by pg_regress (sql/uvm_capi.sql), so it checks the header, the function
 * table and the install step together.
 *
 * The segment is treated as an array of uint64 words; write_part() fills word i with i + 1, so
 * read_sum() over the first n words must return n (n + 1) / 2.
 *
 * Pins: every function either unpins before it returns or relies on the resource owner. No
 * function catches an ERROR to unpin: an ERROR aborts the (sub)transaction, whose resource owners
 * release every pin taken under them (that is what pin_and_fail() shows). Only pin_under() (for
 * pin_for_transaction()) uses PG_TRY, to put CurrentResourceOwner back.
 */
#include "postgres.h"

#include "access/xact.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/lsyscache.h"
#include "utils/resowner.h"
#include "utils/snapmgr.h"

#include "extension/pg_uvm_share/pg_uvm_share.h"

#ifdef PG_MODULE_MAGIC_EXT
PG_MODULE_MAGIC_EXT(.name = "uvm_consumer", .version = "1.0");
#else
PG_MODULE_MAGIC;
#endif

PGDLLEXPORT void _PG_init(void);

/* Bytes copied per read() or write() call. */
#define BLOCK_BYTES (64 * 1024)
#define BLOCK_WORDS (BLOCK_BYTES / sizeof(uint64))

/* A grid-stride loop adding v to n words: bounded by n, so it always terminates. */
static const char add_kernel_source[] =
	"extern \"C\" __global__ void uvm_consumer_add(unsigned long long *words,\n"
	"                                              unsigned long long n, unsigned long long v)\n"
	"{\n"
	"    unsigned long long stride = (unsigned long long) gridDim.x * blockDim.x;\n"
	"    for (unsigned long long i = (unsigned long long) blockIdx.x * blockDim.x + threadIdx.x;\n"
	"         i < n; i += stride)\n"
	"        words[i] += v;\n"
	"}\n";

/*
 * Pins taken by pin_for_transaction(): they belong to CurTransactionResourceOwner, so they live
 * until unpin_all() or the end of the (sub)transaction that took them, when the resource owner
 * releases them (with a WARNING at commit). The xact callbacks below forget them then.
 */
#define MAX_TX_PINS 16
typedef struct TxPin
{
	UvmPinHandle handle;
	SubTransactionId subid;
	int64		size;
	char		name[NAMEDATALEN];
} TxPin;
static TxPin tx_pins[MAX_TX_PINS];
static int	n_tx_pins = 0;

static void
forget_tx_pins(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_PARALLEL_ABORT:
		case XACT_EVENT_PREPARE:
			n_tx_pins = 0;
			break;
		default:
			break;
	}
}

static void
forget_subxact_pins(SubXactEvent event, SubTransactionId mySubid, SubTransactionId parentSubid,
					void *arg)
{
	int			i,
				kept = 0;

	if (event != SUBXACT_EVENT_COMMIT_SUB && event != SUBXACT_EVENT_ABORT_SUB)
		return;
	/* the subtransaction's resource owner is released, and its pins with it */
	for (i = 0; i < n_tx_pins; i++)
		if (tx_pins[i].subid != mySubid)
			tx_pins[kept++] = tx_pins[i];
	n_tx_pins = kept;
}

void
_PG_init(void)
{
	/* Only callbacks here: the C API is used inside transactions, by the functions below. */
	RegisterXactCallback(forget_tx_pins, NULL);
	RegisterSubXactCallback(forget_subxact_pins, NULL);
}

/* Argument i as a C string; NULL is an ERROR (the functions are not STRICT, to say so). */
static char *
text_arg(FunctionCallInfo fcinfo, int i, const char *what)
{
	if (PG_ARGISNULL(i))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be NULL", what)));
	return text_to_cstring(PG_GETARG_TEXT_PP(i));
}

#define name_arg(fcinfo, i) text_arg(fcinfo, i, "segment name")

static int64
int64_arg(FunctionCallInfo fcinfo, int i, const char *what)
{
	if (PG_ARGISNULL(i))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be NULL", what)));
	return PG_GETARG_INT64(i);
}

static int32
int32_arg(FunctionCallInfo fcinfo, int i, const char *what)
{
	if (PG_ARGISNULL(i))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be NULL", what)));
	return PG_GETARG_INT32(i);
}

/* A byte range of whole words. */
static void
check_words(int64 offset, int64 len)
{
	if (offset < 0 || len < 0 || offset % 8 != 0 || len % 8 != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("offset and length must be non-negative multiples of 8 (got %lld and %lld)",
						(long long) offset, (long long) len)));
}

/*
 * Where this process maps the pinned segment (pin->base not NULL: process mode), checks that
 * the bytes just written through api->write() read the same through the pointer, chunk by chunk
 * (only chunks marked cpu_mapped may be dereferenced).
 */
static void
verify_mapped(const UvmPin *pin, uint64 offset, const char *buf, uint64 len)
{
	uint32		c;

	if (pin->base == NULL)
		return;
	for (c = 0; c < pin->info.nchunks; c++)
	{
		const UvmChunk *ch = &pin->chunks[c];
		uint64		lo = Max(offset, ch->offset);
		uint64		hi = Min(offset + len, ch->offset + ch->size);

		if (!ch->cpu_mapped || lo >= hi)
			continue;
		if (memcmp((const char *) pin->base + lo, buf + (lo - offset), hi - lo) != 0)
			ereport(ERROR,
					(errcode(ERRCODE_DATA_CORRUPTED),
					 errmsg("bytes [%llu, %llu) of the segment read differently through its mapping",
							(unsigned long long) lo, (unsigned long long) hi)));
	}
}

PG_FUNCTION_INFO_V1(uvm_consumer_create);
Datum
uvm_consumer_create(PG_FUNCTION_ARGS)
{
	const PgUvmShareApi *api = pg_uvm_share_api();
	char	   *name = name_arg(fcinfo, 0);
	int64		size = int64_arg(fcinfo, 1, "size");
	int64		max_size = PG_ARGISNULL(2) ? -1 : PG_GETARG_INT64(2);
	char	   *tier = text_arg(fcinfo, 3, "tier");

	PG_RETURN_INT64((int64) api->create(name, size, max_size, tier));
}

PG_FUNCTION_INFO_V1(uvm_consumer_drop);
Datum
uvm_consumer_drop(PG_FUNCTION_ARGS)
{
	pg_uvm_share_api()->drop(name_arg(fcinfo, 0));
	PG_RETURN_VOID();
}

PG_FUNCTION_INFO_V1(uvm_consumer_grow);
Datum
uvm_consumer_grow(PG_FUNCTION_ARGS)
{
	const PgUvmShareApi *api = pg_uvm_share_api();
	char	   *name = name_arg(fcinfo, 0);

	PG_RETURN_INT64(api->grow(name, int64_arg(fcinfo, 1, "new_size")));
}

/* The segment's size, or NULL where there is no such segment (lookup() says so, no ERROR). */
PG_FUNCTION_INFO_V1(uvm_consumer_lookup);
Datum
uvm_consumer_lookup(PG_FUNCTION_ARGS)
{
	UvmSegmentInfo info;

	if (!pg_uvm_share_api()->lookup(name_arg(fcinfo, 0), &info))
		PG_RETURN_NULL();
	PG_RETURN_INT64((int64) info.size);
}

/*
 * Part `part` of `nparts` of the segment's words, word i set to i + 1; returns this process's
 * pid. PARALLEL SAFE: each parallel worker pins the segment on its own. The pin is given back
 * before returning; on an ERROR the statement's resource owner gives it back.
 */
PG_FUNCTION_INFO_V1(uvm_consumer_write_part);
Datum
uvm_consumer_write_part(PG_FUNCTION_ARGS)
{
	const PgUvmShareApi *api = pg_uvm_share_api();
	char	   *name = name_arg(fcinfo, 0);
	int32		part = int32_arg(fcinfo, 1, "part");
	int32		nparts = int32_arg(fcinfo, 2, "nparts");
	UvmPin		pin;
	uint64		words,
				lo,
				hi,
				i;
	uint64	   *buf;

	if (nparts < 1 || nparts > 1024 || part < 0 || part >= nparts)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("part %d of %d is not a part (nparts must be 1 to 1024)", part, nparts)));
	api->pin(name, NULL, &pin);
	words = pin.info.size / sizeof(uint64);
	/* words < 2^34 (64 GB) and nparts <= 2^10: no overflow */
	lo = words * (uint64) part / (uint64) nparts;
	hi = words * (uint64) (part + 1) / (uint64) nparts;
	buf = palloc(BLOCK_BYTES);
	for (i = lo; i < hi; i += BLOCK_WORDS)
	{
		uint64		n = Min(BLOCK_WORDS, hi - i);
		uint64		k;

		CHECK_FOR_INTERRUPTS();
		for (k = 0; k < n; k++)
			buf[k] = i + k + 1;
		api->write(pin.handle, (int64) (i * sizeof(uint64)), buf, (int64) (n * sizeof(uint64)));
		verify_mapped(&pin, i * sizeof(uint64), (const char *) buf, n * sizeof(uint64));
	}
	api->unpin(pin.handle);
	pfree(buf);
	PG_RETURN_INT32(MyProcPid);
}

static TxPin *
find_tx_pin(const char *name)
{
	int			i;

	for (i = 0; i < n_tx_pins; i++)
		if (strcmp(tx_pins[i].name, name) == 0)
			return &tx_pins[i];
	return NULL;
}

/*
 * The wrapping sum of the words in [offset, offset + len), read with api->read() through a pin
 * of its own, or through this transaction's pin_for_transaction() pin (which sees the segment
 * as it was pinned: reads past the pinned size are 2202E even after another session grew it).
 */
PG_FUNCTION_INFO_V1(uvm_consumer_read_sum);
Datum
uvm_consumer_read_sum(PG_FUNCTION_ARGS)
{
	const PgUvmShareApi *api = pg_uvm_share_api();
	char	   *name = name_arg(fcinfo, 0);
	int64		offset = int64_arg(fcinfo, 1, "offset");
	int64		len = int64_arg(fcinfo, 2, "length");
	bool		through_tx_pin = !PG_ARGISNULL(3) && PG_GETARG_BOOL(3);
	UvmPin		pin;
	UvmPinHandle handle;
	uint64	   *buf;
	uint64		sum = 0;
	int64		done = 0;

	check_words(offset, len);
	if (through_tx_pin)
	{
		TxPin	   *tp = find_tx_pin(name);

		if (tp == NULL)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("this transaction holds no pin on segment \"%s\"", name)));
		handle = tp->handle;
	}
	else
	{
		api->pin(name, NULL, &pin);
		handle = pin.handle;
	}
	buf = palloc(BLOCK_BYTES);
	/* at least one read(), so that even an empty range is checked against the size */
	do
	{
		int64		n = Min((int64) BLOCK_BYTES, len - done);
		int64		k;

		CHECK_FOR_INTERRUPTS();
		api->read(handle, offset + done, buf, n);
		for (k = 0; k < n / 8; k++)
			sum += buf[k];
		done += n;
	} while (done < len);
	if (!through_tx_pin)
		api->unpin(handle);
	pfree(buf);
	PG_RETURN_INT64((int64) sum);
}

/* pin() under resource owner `owner`: PG_FINALLY puts the current one back, also on an ERROR. */
static void
pin_under(const PgUvmShareApi *api, ResourceOwner owner, const char *name, UvmPin *pin)
{
	ResourceOwner saved = CurrentResourceOwner;

	CurrentResourceOwner = owner;
	PG_TRY();
	{
		api->pin(name, NULL, pin);
	}
	PG_FINALLY();
	{
		CurrentResourceOwner = saved;
	}
	PG_END_TRY();
}

/*
 * Where this process addresses a pinned segment, in words that hold in every mode: whether
 * base is set, whether it is the segment's address in every process, and how many chunks the
 * CPU may dereference there. Bytes mapped are checked against api->read().
 */
PG_FUNCTION_INFO_V1(uvm_consumer_mapping);
Datum
uvm_consumer_mapping(PG_FUNCTION_ARGS)
{
	const PgUvmShareApi *api = pg_uvm_share_api();
	char	   *name = name_arg(fcinfo, 0);
	UvmPin		pin;
	uint32		c,
				mapped = 0;
	char	   *buf;
	char	   *result;

	api->pin(name, NULL, &pin);
	buf = palloc(BLOCK_BYTES);
	for (c = 0; c < pin.info.nchunks; c++)
	{
		const UvmChunk *ch = &pin.chunks[c];
		uint64		n = Min((uint64) BLOCK_BYTES, ch->size);

		if (!ch->cpu_mapped)
			continue;
		mapped++;
		api->read(pin.handle, ch->offset, buf, n);
		verify_mapped(&pin, ch->offset, buf, n);
	}
	result = psprintf("base %s, %s, %u of %u chunks mapped",
					  pin.base != NULL ? "set" : "NULL",
					  pin.base != NULL && pin.same_address ? "same address" : "not the same address",
					  mapped, pin.info.nchunks);
	api->unpin(pin.handle);
	pfree(buf);
	PG_RETURN_TEXT_P(cstring_to_text(result));
}

/*
 * A pin that lasts to the end of the transaction: taken with CurrentResourceOwner switched to
 * CurTransactionResourceOwner. Returns the pinned size.
 */
PG_FUNCTION_INFO_V1(uvm_consumer_pin_for_transaction);
Datum
uvm_consumer_pin_for_transaction(PG_FUNCTION_ARGS)
{
	const PgUvmShareApi *api = pg_uvm_share_api();
	char	   *name = name_arg(fcinfo, 0);
	UvmPin		pin;
	TxPin	   *tp;

	if (n_tx_pins >= MAX_TX_PINS)
		ereport(ERROR,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("at most %d transaction pins", MAX_TX_PINS)));
	if (strlen(name) >= NAMEDATALEN)
		ereport(ERROR,
				(errcode(ERRCODE_NAME_TOO_LONG),
				 errmsg("segment name is too long")));
	pin_under(api, CurTransactionResourceOwner, name, &pin);
	tp = &tx_pins[n_tx_pins++];
	tp->handle = pin.handle;
	tp->subid = GetCurrentSubTransactionId();
	tp->size = (int64) pin.info.size;
	strlcpy(tp->name, name, NAMEDATALEN);
	PG_RETURN_INT64(tp->size);
}

/* Gives back every pin_for_transaction() pin; returns how many. */
PG_FUNCTION_INFO_V1(uvm_consumer_unpin_all);
Datum
uvm_consumer_unpin_all(PG_FUNCTION_ARGS)
{
	const PgUvmShareApi *api = pg_uvm_share_api();
	int			n = 0;

	while (n_tx_pins > 0)
	{
		/* forget it first: an ERROR in unpin() must not leave a handle to unpin again */
		UvmPinHandle h = tx_pins[--n_tx_pins].handle;

		api->unpin(h);
		n++;
	}
	PG_RETURN_INT32(n);
}

/* Pins, then fails: no cleanup here on purpose, the aborted owner releases the pin. */
PG_FUNCTION_INFO_V1(uvm_consumer_pin_and_fail);
Datum
uvm_consumer_pin_and_fail(PG_FUNCTION_ARGS)
{
	char	   *name = name_arg(fcinfo, 0);
	UvmPin		pin;

	pg_uvm_share_api()->pin(name, NULL, &pin);
	ereport(ERROR,
			(errcode(ERRCODE_RAISE_EXCEPTION),
			 errmsg("failing on purpose while holding a pin on segment \"%s\"", name)));
	PG_RETURN_VOID();
}

/* Pins and returns without unpinning: the statement's owner releases the pin with a WARNING. */
PG_FUNCTION_INFO_V1(uvm_consumer_leak_pin);
Datum
uvm_consumer_leak_pin(PG_FUNCTION_ARGS)
{
	UvmPin		pin;

	pg_uvm_share_api()->pin(name_arg(fcinfo, 0), NULL, &pin);
	PG_RETURN_INT64((int64) pin.info.size);
}

/* A released pin's handle must be refused, not dereferenced. */
PG_FUNCTION_INFO_V1(uvm_consumer_read_after_unpin);
Datum
uvm_consumer_read_after_unpin(PG_FUNCTION_ARGS)
{
	const PgUvmShareApi *api = pg_uvm_share_api();
	UvmPin		pin;
	uint64		word = 0;

	api->pin(name_arg(fcinfo, 0), NULL, &pin);
	api->unpin(pin.handle);
	api->read(pin.handle, 0, &word, sizeof(word));	/* must ERROR */
	PG_RETURN_INT64((int64) word);
}

/* unpin() of any handle, valid or not. */
PG_FUNCTION_INFO_V1(uvm_consumer_unpin_handle);
Datum
uvm_consumer_unpin_handle(PG_FUNCTION_ARGS)
{
	pg_uvm_share_api()->unpin((UvmPinHandle) int64_arg(fcinfo, 0, "handle"));
	PG_RETURN_VOID();
}

/* Pins with expectations (id, and generation unless 0); returns the generation pinned. */
PG_FUNCTION_INFO_V1(uvm_consumer_pin_expect);
Datum
uvm_consumer_pin_expect(PG_FUNCTION_ARGS)
{
	const PgUvmShareApi *api = pg_uvm_share_api();
	char	   *name = name_arg(fcinfo, 0);
	UvmSegmentInfo expect;
	UvmPin		pin;

	memset(&expect, 0, sizeof(expect));
	expect.id = (uint64) int64_arg(fcinfo, 1, "id");
	expect.generation = (uint64) int64_arg(fcinfo, 2, "generation");
	api->pin(name, &expect, &pin);
	api->unpin(pin.handle);
	PG_RETURN_INT64((int64) pin.info.generation);
}

/*
 * The table checked for ABI major `major` and a struct `extra` bytes larger than this module's:
 * anything but this module's major (or a table too small) is a clear ERROR. Returns the
 * library's major.
 */
PG_FUNCTION_INFO_V1(uvm_consumer_abi_check);
Datum
uvm_consumer_abi_check(PG_FUNCTION_ARGS)
{
	int32		major = int32_arg(fcinfo, 0, "major");
	int32		extra = PG_ARGISNULL(1) ? 0 : PG_GETARG_INT32(1);
	const PgUvmShareApi *api;

	if (major < 0 || major > 0xffff || extra < 0 || extra > 65536)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("major must be 0 to 65535 and extra 0 to 65536")));
	api = pg_uvm_share_api_for((uint32) major, (uint32) (sizeof(PgUvmShareApi) + extra));
	PG_RETURN_INT32((int32) (api->abi_version >> 16));
}

/* Blocks of 256 threads for n words: at least 1, at most 1024 (the loop strides over the rest). */
static uint32
blocks_for(int64 n)
{
	return (uint32) Min(Max((n + 255) / 256, 1), 1024);
}

/*
 * Runs `kernel` with the parameters (word pointer, n, v) where the cluster runs its GPU work:
 * synchronously (launch) or started and then waited for (launch_start, launch_wait). The
 * pointer is a pin and a byte offset, which the library turns into a device address. On an
 * ERROR (0A000 without a GPU) the resource owner releases the pin and gives up a launch never
 * waited for: no cleanup here.
 */
static void
run_kernel(const PgUvmShareApi *api, UvmKernel *kernel, UvmPinHandle pin, int64 byte_offset,
		   int64 n, int64 v, bool async)
{
	UvmKernelArg args[3];

	memset(args, 0, sizeof(args));
	args[0].kind = UVM_ARG_SEGMENT;	/* unsigned long long *words */
	args[0].value = (uint64) byte_offset;
	args[0].pin = pin;
	args[1].kind = UVM_ARG_SCALAR;	/* unsigned long long n */
	args[1].size = sizeof(uint64);
	args[1].value = (uint64) n;
	args[2].kind = UVM_ARG_SCALAR;	/* unsigned long long v */
	args[2].size = sizeof(uint64);
	args[2].value = (uint64) v;

	if (async)
	{
		UvmLaunchHandle h = api->launch_start(kernel, args, lengthof(args));

		/* (a consumer would do other work here) */
		api->launch_wait(h);
	}
	else
		api->launch(kernel, args, lengthof(args));
}

/* The add kernel over n words from `first`, pinned: 2202E unless they lie in the pinned size. */
static void
launch_add_words(const char *name, int64 first, int64 n, int64 v, bool async)
{
	const PgUvmShareApi *api = pg_uvm_share_api();
	UvmPin		pin;
	UvmKernel	kernel;

	if (first < 0 || n < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("the first word and the word count must not be negative")));
	api->pin(name, NULL, &pin);
	/* the kernel writes words [first, first + n): the library cannot know, so check here */
	if ((uint64) first > pin.info.size / sizeof(uint64) ||
		(uint64) n > pin.info.size / sizeof(uint64) - (uint64) first)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("words [%lld, %lld + %lld) do not fit in segment \"%s\" of %llu bytes",
						(long long) first, (long long) first, (long long) n, name,
						(unsigned long long) pin.info.size)));

	memset(&kernel, 0, sizeof(kernel));
	kernel.source = add_kernel_source;
	kernel.source_len = 0;		/* NUL-terminated */
	kernel.is_ptx = 0;			/* CUDA C, compiled by NVRTC once per text */
	kernel.entry = "uvm_consumer_add";
	kernel.grid[0] = blocks_for(n);
	kernel.grid[1] = kernel.grid[2] = 1;
	kernel.block[0] = 256;
	kernel.block[1] = kernel.block[2] = 1;
	kernel.shared_mem_bytes = 0;
	run_kernel(api, &kernel, pin.handle, first * (int64) sizeof(uint64), n, v, async);
	api->unpin(pin.handle);
}

/* Adds v to the first n words: synchronously, or started and waited for. */
PG_FUNCTION_INFO_V1(uvm_consumer_launch_add);
Datum
uvm_consumer_launch_add(PG_FUNCTION_ARGS)
{
	char	   *name = name_arg(fcinfo, 0);
	int64		n = int64_arg(fcinfo, 1, "n");
	int64		v = int64_arg(fcinfo, 2, "v");
	bool		async = !PG_ARGISNULL(3) && PG_GETARG_BOOL(3);

	launch_add_words(name, 0, n, v, async);
	PG_RETURN_VOID();
}

/* Adds v to words [first, first + n): a segment argument at an offset. */
PG_FUNCTION_INFO_V1(uvm_consumer_launch_range);
Datum
uvm_consumer_launch_range(PG_FUNCTION_ARGS)
{
	char	   *name = name_arg(fcinfo, 0);
	int64		first = int64_arg(fcinfo, 1, "first");
	int64		n = int64_arg(fcinfo, 2, "n");
	int64		v = int64_arg(fcinfo, 3, "v");

	launch_add_words(name, first, n, v, false);
	PG_RETURN_VOID();
}

/*
 * Runs a caller's kernel (CUDA C, or PTX) over the segment with the parameters (pointer to its
 * byte 0, n, v), synchronously: for the GPU suite's compile errors and PTX. The kernel is
 * arbitrary code on the cluster's GPU, so the SQL function is revoked from PUBLIC.
 */
PG_FUNCTION_INFO_V1(uvm_consumer_launch_source);
Datum
uvm_consumer_launch_source(PG_FUNCTION_ARGS)
{
	const PgUvmShareApi *api = pg_uvm_share_api();
	char	   *name = name_arg(fcinfo, 0);
	char	   *source = text_arg(fcinfo, 1, "source");
	char	   *entry = text_arg(fcinfo, 2, "entry");
	bool		is_ptx = !PG_ARGISNULL(3) && PG_GETARG_BOOL(3);
	int32		grid = int32_arg(fcinfo, 4, "grid");
	int32		block = int32_arg(fcinfo, 5, "block");
	int64		n = int64_arg(fcinfo, 6, "n");
	int64		v = int64_arg(fcinfo, 7, "v");
	UvmPin		pin;
	UvmKernel	kernel;

	if (grid < 0 || block < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("grid and block must not be negative")));
	api->pin(name, NULL, &pin);
	memset(&kernel, 0, sizeof(kernel));
	kernel.source = source;
	kernel.source_len = (uint32) strlen(source);
	kernel.is_ptx = is_ptx ? 1 : 0;
	kernel.entry = entry;
	kernel.grid[0] = (uint32) grid;	/* 0 is the library's to refuse (22023) */
	kernel.grid[1] = kernel.grid[2] = 1;
	kernel.block[0] = (uint32) block;
	kernel.block[1] = kernel.block[2] = 1;
	run_kernel(api, &kernel, pin.handle, 0, n, v, false);
	api->unpin(pin.handle);
	PG_RETURN_VOID();
}

/* Process mode under CUDA: where this process's own kernels address the segment. */
PG_FUNCTION_INFO_V1(uvm_consumer_device_address);
Datum
uvm_consumer_device_address(PG_FUNCTION_ARGS)
{
	const PgUvmShareApi *api = pg_uvm_share_api();
	UvmPin		pin;
	uint64		addr;

	api->pin(name_arg(fcinfo, 0), NULL, &pin);
	addr = api->device_address(pin.handle, 0, (int64) pin.info.size);
	api->unpin(pin.handle);
	PG_RETURN_INT64((int64) addr);
}

/*
 * cache_fold(rel, column): the rows, the column's non-NULL count and a sum, read from the
 * table's column cache through cache_pin() (NULL where no cache may be read under the query's
 * snapshot): integers and dates sum their values, a dictionary-coded text column the bytes of
 * its strings (read from the dictionary through its pin: the layout of docs/C-API.md). Every
 * read goes through api->read(), bounded by the pinned size; every count and offset read from
 * the segment is checked against the cache's own bounds before use.
 */
PG_FUNCTION_INFO_V1(uvm_consumer_cache_fold);
Datum
uvm_consumer_cache_fold(PG_FUNCTION_ARGS)
{
	const PgUvmShareApi *api = pg_uvm_share_api();
	Oid			relid = PG_GETARG_OID(0);
	char	   *colname = text_to_cstring(PG_GETARG_TEXT_PP(1));
	AttrNumber	attnum = get_attnum(relid, colname);
	UvmCache	cache;
	const UvmCacheColumn *col = NULL;
	uint64		rows = 0,
				non_null = 0,
				b;
	int64		sum = 0;
	uint64	   *offsets = NULL;
	uint64		entries = 0;
	uint32		k;
	char	   *block;

	if (!api->cache_pin(relid, GetActiveSnapshot(), &cache))
		PG_RETURN_NULL();
	for (k = 0; k < cache.ncolumns; k++)
		if (cache.columns[k].attnum == attnum)
			col = &cache.columns[k];
	if (col == NULL)
		ereport(ERROR, (errcode(ERRCODE_UNDEFINED_COLUMN), errmsg("column \"%s\" is not cached", colname)));
	if (col->encoding == UVM_ENC_DICT_CODE)
	{
		uint64		header[8];	/* magic, version, entries, bytes, offsets_at, strings_at, ...:
								 * the strings' lengths are their offsets' differences */

		api->read(col->dictionary, 0, header, sizeof(header));
		entries = header[2];
		if (entries > 100000000)
			ereport(ERROR, (errcode(ERRCODE_DATA_CORRUPTED), errmsg("a dictionary of %llu entries", (unsigned long long) entries)));
		offsets = palloc((entries + 1) * sizeof(uint64));
		api->read(col->dictionary, (int64) header[4], offsets, (int64) ((entries + 1) * sizeof(uint64)));
	}
	if (cache.block_bytes == 0 || cache.block_bytes > (uint64) 1 << 30)
		ereport(ERROR, (errcode(ERRCODE_DATA_CORRUPTED), errmsg("a block of %llu bytes", (unsigned long long) cache.block_bytes)));
	block = palloc(cache.block_bytes);
	for (b = 0; b < cache.blocks; b++)
	{
		uint64		n,
					r;

		CHECK_FOR_INTERRUPTS();
		api->read(cache.pin.handle, (int64) (cache.data_offset + b * cache.block_bytes), block, (int64) cache.block_bytes);
		memcpy(&n, block, sizeof(n));
		if (n > cache.block_rows)
			ereport(ERROR, (errcode(ERRCODE_DATA_CORRUPTED), errmsg("block %llu holds %llu rows", (unsigned long long) b, (unsigned long long) n)));
		rows += n;
		for (r = 0; r < n; r++)
		{
			const char *v = block + col->values_at + r * col->width;
			int64		x = 0;

			if (block[col->nulls_at + r / 8] & (1 << (r % 8)))
				continue;
			non_null++;
			switch (col->encoding)
			{
				case UVM_ENC_INT2:
					{
						int16		i;

						memcpy(&i, v, 2);
						x = i;
						break;
					}
				case UVM_ENC_INT4:
				case UVM_ENC_DATE:
					{
						int32		i;

						memcpy(&i, v, 4);
						x = i;
						break;
					}
				case UVM_ENC_INT8:
					memcpy(&x, v, 8);
					break;
				case UVM_ENC_DICT_CODE:
					{
						uint32		c;

						memcpy(&c, v, 4);
						if (c >= entries || offsets[c + 1] < offsets[c])
							ereport(ERROR, (errcode(ERRCODE_DATA_CORRUPTED), errmsg("code %u of a dictionary of %llu", c, (unsigned long long) entries)));
						x = (int64) (offsets[c + 1] - offsets[c]);
						break;
					}
				default:
					break;
			}
			sum += x;
		}
	}
	if (rows != cache.rows)
		ereport(ERROR, (errcode(ERRCODE_DATA_CORRUPTED), errmsg("the blocks hold %llu rows, the cache says %llu", (unsigned long long) rows, (unsigned long long) cache.rows)));
	for (k = 0; k < cache.ncolumns; k++)
		if (cache.columns[k].dictionary != 0)
			api->unpin(cache.columns[k].dictionary);
	api->unpin(cache.pin.handle);
	PG_RETURN_TEXT_P(cstring_to_text(psprintf("rows=%llu non_null=%llu sum=%lld", (unsigned long long) rows,
											 (unsigned long long) non_null, (long long) sum)));
}

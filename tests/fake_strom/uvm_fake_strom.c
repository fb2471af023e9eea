/*
 * uvm_fake_strom — a stand-in for PG-Strom in pg_uvm_share's regression tests (issue 22).
 *
 * PG-Strom 6.1 registers a custom scan named "GpuJoin" (RegisterCustomScanMethods) and
 * extensible nodes. pg_uvm_share's plan node used to register custom scan methods named
 * "GpuJoin" and "GpuJoinAgg" too, and PostgreSQL keeps one table of custom scan names per
 * process: a cluster that preloaded both extensions did not start (FATAL: extensible node type
 * "GpuJoin" already exists, from whichever library registered second). pg_uvm_share's nodes are
 * now "UvmGpuJoin" and "UvmGpuJoinAgg".
 *
 * This module registers what PG-Strom's would clash on, and nothing else:
 *
 *   - CustomScanMethods with CustomName "GpuJoin";
 *   - ExtensibleNodeMethods with extnodename "GpuJoin".
 *
 * It defines no SQL objects and is never planned: it is only preloaded, before and after
 * pg_uvm_share (scripts/regress.sh, suites strom_first and strom_last), so that a name of
 * pg_uvm_share's that clashes again stops those clusters at start-up. Built and installed with
 * PGXS by the top-level `make fake-strom`, which `make regress` runs first.
 */
#include "postgres.h"

#include "fmgr.h"
#include "nodes/extensible.h"

#ifdef PG_MODULE_MAGIC_EXT
PG_MODULE_MAGIC_EXT(.name = "uvm_fake_strom", .version = "1.0");
#else
PG_MODULE_MAGIC;
#endif

PGDLLEXPORT void _PG_init(void);

/* The name PG-Strom 6.1 registers for both its custom scan and its extensible node. */
#define STROM_NAME "GpuJoin"

/* The plan node is never planned: nothing here creates a CustomPath. */
static Node *
fake_create_scan_state(CustomScan *cscan)
{
	elog(ERROR, "uvm_fake_strom: custom scan \"%s\" is a stand-in that cannot run",
		 STROM_NAME);
	pg_unreachable();
}

static const CustomScanMethods fake_scan_methods = {
	.CustomName = STROM_NAME,
	.CreateCustomScanState = fake_create_scan_state,
};

/*
 * The extensible node has no fields beyond ExtensibleNode's own (type and extnodename, which
 * the core copies, compares, writes and reads itself): each callback has nothing to do.
 */
static void
fake_node_copy(ExtensibleNode *newnode, const ExtensibleNode *oldnode)
{
}

static bool
fake_node_equal(const ExtensibleNode *a, const ExtensibleNode *b)
{
	return true;
}

static void
fake_node_out(StringInfo str, const ExtensibleNode *node)
{
}

static void
fake_node_read(ExtensibleNode *node)
{
}

static const ExtensibleNodeMethods fake_node_methods = {
	.extnodename = STROM_NAME,
	.node_size = sizeof(ExtensibleNode),
	.nodeCopy = fake_node_copy,
	.nodeEqual = fake_node_equal,
	.nodeOut = fake_node_out,
	.nodeRead = fake_node_read,
};

void
_PG_init(void)
{
	/* Both keep the pointer: the tables are static. */
	RegisterCustomScanMethods(&fake_scan_methods);
	RegisterExtensibleNodeMethods(&fake_node_methods);
}

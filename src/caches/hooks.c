/*
 * The column caches' executor and utility hooks, as C trampolines (src/caches/mod.rs says what
 * they mark). Each calls the Rust marker first (a #[pg_guard] function: a Rust panic there
 * becomes a PostgreSQL ERROR), then the next hook or the standard function directly, so that an
 * ERROR raised by any statement passes through unchanged: every field of its report (position,
 * context, schema, table and constraint names) reaches the client as PostgreSQL made it. Hooks
 * written in Rust would turn each such ERROR into a Rust panic and back (pgrx's FFI guard), which
 * keeps only the message, detail and hint. ExecutorEnd and the end of a utility statement call
 * Rust too, to take back the note that the statement writes (marks.rs, `being_written`).
 */
#include "postgres.h"

#include "executor/executor.h"
#include "tcop/utility.h"

/* Rust (src/caches/marks.rs) */
extern void uvm_caches_before_executor_start(QueryDesc *queryDesc, int eflags);
extern void uvm_caches_before_executor_end(QueryDesc *queryDesc);
extern void uvm_caches_before_utility(PlannedStmt *pstmt);
extern void uvm_caches_after_utility(PlannedStmt *pstmt);
void uvm_caches_install_hooks(void);

static ExecutorStart_hook_type prev_executor_start = NULL;
static ExecutorEnd_hook_type prev_executor_end = NULL;
static ProcessUtility_hook_type prev_process_utility = NULL;

static void
uvm_executor_start(QueryDesc *queryDesc, int eflags)
{
	uvm_caches_before_executor_start(queryDesc, eflags);
	if (prev_executor_start)
		prev_executor_start(queryDesc, eflags);
	else
		standard_ExecutorStart(queryDesc, eflags);
}

static void
uvm_executor_end(QueryDesc *queryDesc)
{
	uvm_caches_before_executor_end(queryDesc);
	if (prev_executor_end)
		prev_executor_end(queryDesc);
	else
		standard_ExecutorEnd(queryDesc);
}

/*
 * The utility marker runs before the statement, and its note that the statement writes is
 * taken back after it; a statement that raises an ERROR ends its (sub)transaction, whose
 * callback takes the note back instead.
 */
static void
uvm_process_utility(PlannedStmt *pstmt, const char *queryString, bool readOnlyTree,
					ProcessUtilityContext context, ParamListInfo params,
					QueryEnvironment *queryEnv, DestReceiver *dest, QueryCompletion *qc)
{
	uvm_caches_before_utility(pstmt);
	if (prev_process_utility)
		prev_process_utility(pstmt, queryString, readOnlyTree, context, params, queryEnv, dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString, readOnlyTree, context, params, queryEnv, dest, qc);
	uvm_caches_after_utility(pstmt);
}

/* Called once from _PG_init. */
void
uvm_caches_install_hooks(void)
{
	prev_executor_start = ExecutorStart_hook;
	ExecutorStart_hook = uvm_executor_start;
	prev_executor_end = ExecutorEnd_hook;
	ExecutorEnd_hook = uvm_executor_end;
	prev_process_utility = ProcessUtility_hook;
	ProcessUtility_hook = uvm_process_utility;
}

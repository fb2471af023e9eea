//! EXPLAIN: the key clauses, the key's form, the inner relation and aggregates, and with
//! ANALYZE the inner side's and the batches' figures.

use super::*;

/// `ExplainCustomScan` for the GpuJoin node.
///
/// # Safety
/// ExplainCustomScan's arguments.
pub(super) unsafe fn explain(
    scan: &mut GpuJoinScan,
    node: *mut pg_sys::CustomScanState,
    ancestors: *mut pg_sys::List,
    es: *mut pg_sys::ExplainState,
) {
    // SAFETY: ExplainCustomScan's arguments; custom_exprs holds the join clause with Vars
    // rewritten to the scan tuple, which ruleutils resolves through custom_scan_tlist.
    unsafe {
        let plan = (*node).ss.ps.plan;
        let cscan = plan as *mut pg_sys::CustomScan;
        let ctx = pg_sys::set_deparse_context_plan((*es).deparse_cxt, plan, ancestors);
        let clause = PgList::<pg_sys::Node>::from_pg((*cscan).custom_exprs).get_ptr(0).expect("join clause");
        let text = pg_sys::deparse_expression(clause, ctx, true, false);
        // deparse_expression puts an operator clause in parentheses already.
        let cond = CStr::from_ptr(text).to_string_lossy().into_owned();
        let prop = |label: &CStr, value: &str| {
            let v = std::ffi::CString::new(value.replace('\0', "")).expect("no NUL");
            pg_sys::ExplainPropertyText(label.as_ptr(), v.as_ptr(), es);
        };
        prop(c"GpuJoin Cond", &cond);
        if scan.p.keys.len() > 1 {
            let form = scan.outer_key.composer.form().label();
            prop(c"GpuJoin Key", &format!("{} columns, {form}", scan.p.keys.len()));
        }
        prop(c"Inner Relation", &scan.p.inner_names);
        if scan.p.join != JoinKind::Inner {
            prop(c"Join Type", scan.p.join.name());
        }
        if !scan.aggs.is_empty() {
            let tl = PgList::<pg_sys::TargetEntry>::from_pg((*cscan).custom_scan_tlist);
            let names: Vec<String> = tl
                .iter_ptr()
                .take(scan.aggs.len())
                .map(|te| {
                    let t = pg_sys::deparse_expression((*te).expr as *mut pg_sys::Node, ctx, true, false);
                    CStr::from_ptr(t).to_string_lossy().into_owned()
                })
                .collect();
            prop(c"Aggregates", &names.join(", "));
        }
        scan.explain_caches(es);
        if (*es).analyze {
            let int = |label: &CStr, unit: Option<&CStr>, v: u64| {
                pg_sys::ExplainPropertyInteger(label.as_ptr(), unit.map_or(std::ptr::null(), |u| u.as_ptr()), v as i64, es)
            };
            int(c"Inner Rows", None, scan.stats.inner_rows);
            if !scan.aggs.is_empty() {
                // Probe mode: the aggregates came from the probes' match counts and payload sums.
                prop(c"Aggregated", if scan.payload_values { "in the probe" } else { "per match" });
            } else if scan.row_payload.is_some() {
                // The joined rows' inner columns came from the pairs (`row_payload`), or from
                // the stored rows (a NULL among the kept column's values).
                prop(c"Inner Columns", if scan.payload_values { "in the table" } else { "in the rows" });
            }
            // The inner side in the node's own memory, and past its hash memory in the host tier
            // (`super::super::spill`).
            int(c"Memory Usage", Some(c"kB"), scan.stats.held.div_ceil(1024));
            if scan.stats.spilled > 0 {
                int(c"Spilled to Host Tier", Some(c"kB"), scan.stats.spilled.div_ceil(1024));
            }
            int(c"Inner Table", Some(c"bytes"), scan.stats.table_bytes);
            if !scan.stats.tier.is_empty() {
                prop(c"Inner Table Tier", &scan.stats.tier);
            }
            int(c"Batches", None, scan.stats.batches);
            if let Some(n) = scan.stats.handed {
                // The workers handed their keys to the leader, which probed them
                // (`crate::node::handoff`); how many depends on how the scan was shared.
                if (*es).timing {
                    int(c"Batches Probed for Workers", None, n);
                } else {
                    prop(c"Probed By", "the leader");
                }
            }
            // Whether this process probed every outer tuple's key or, past a batch with
            // more pairs than tuples, each batch's distinct keys (`materialize_batch`). In
            // parallel that depends on which batches this process read: shown with the timings.
            if scan.aggs.is_empty() && scan.stats.batches > 0 && (!scan.parallel_aware || (*es).timing) {
                prop(c"Outer Keys", if scan.batch.positional() { "every tuple's" } else { "distinct" });
            }
            if (*es).timing {
                pg_sys::ExplainPropertyFloat(c"GPU Time".as_ptr(), c"ms".as_ptr(), scan.stats.gpu.as_secs_f64() * 1e3, 3, es);
                let build = scan.stats.build.as_secs_f64() * 1e3;
                pg_sys::ExplainPropertyFloat(c"Inner Ready".as_ptr(), c"ms".as_ptr(), build, 3, es);
                let table = scan.stats.table_build.as_secs_f64() * 1e3;
                pg_sys::ExplainPropertyFloat(c"Inner Table Build".as_ptr(), c"ms".as_ptr(), table, 3, es);
                if let Some(p) = scan.stats.cache_probe.filter(|_| scan.read_from == Some(ReadFrom::Caches)) {
                    pg_sys::ExplainPropertyFloat(c"Cache Probe".as_ptr(), c"ms".as_ptr(), p.as_secs_f64() * 1e3, 3, es);
                    let k = scan.stats.cache_kernels.unwrap_or_default().as_secs_f64() * 1e3;
                    pg_sys::ExplainPropertyFloat(c"Probe Kernels".as_ptr(), c"ms".as_ptr(), k, 3, es);
                }
                // How many batches were read ahead depends on timing: shown with the timings.
                let by_value = scan.outer_cols.iter().all(|c| c.byval);
                if scan.parallel_aware && (scan.probe.is_some() || scan.aggs.is_empty() && by_value) {
                    int(c"Batches Read Ahead", None, scan.stats.ahead);
                }
            }
        }
    }
}

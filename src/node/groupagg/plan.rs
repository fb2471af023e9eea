//! The planner's side of GpuGroupAgg: which query levels the node computes, its path, and
//! its plan (see the module essay).

use super::*;

/// A by-value constant of an integer-like type as its value, if the node reads the type.
///
/// # Safety
/// `c` is a Const.
unsafe fn const_value(c: *const pg_sys::Const) -> Option<i64> {
    // SAFETY: forwarded contract; by-value datums of the listed types.
    unsafe {
        if (*c).constisnull {
            return None;
        }
        let d = (*c).constvalue.value();
        Some(match (*c).consttype {
            pg_sys::INT2OID => d as i16 as i64,
            pg_sys::INT4OID | pg_sys::DATEOID => d as i32 as i64,
            pg_sys::INT8OID | pg_sys::TIMESTAMPOID | pg_sys::TIMESTAMPTZOID => d as i64,
            _ => return None,
        })
    }
}

fn is_integer(t: pg_sys::Oid) -> bool {
    matches!(t, pg_sys::INT2OID | pg_sys::INT4OID | pg_sys::INT8OID)
}

/// The plain column `n` of relation `relid` (range table index `varno`) as a cached column of a
/// type the node reads, if it is one.
///
/// # Safety
/// `n` is null or a node.
unsafe fn column(n: *mut pg_sys::Node, varno: u32, cached: &[(i16, Encoding)]) -> Option<(Col, pg_sys::Oid)> {
    // SAFETY: forwarded contract.
    unsafe {
        let v = gpujoin::as_var(n)?;
        if (*v).varno as u32 != varno || (*v).varattno <= 0 {
            return None;
        }
        let encoding = encoding_of_type((*v).vartype)?;
        let att = (*v).varattno;
        cached.iter().any(|&(a, e)| a == att && e == encoding).then_some((Col { attnum: att, encoding }, (*v).vartype))
    }
}

/// A `WHERE` conjunct as a range, if it is one the node evaluates.
///
/// # Safety
/// `clause` is a planner expression.
unsafe fn range_of(clause: *mut pg_sys::Node, varno: u32, cached: &[(i16, Encoding)]) -> Option<Range> {
    // SAFETY: forwarded contract; nodes are read by their tags.
    unsafe {
        if (*clause).type_ == pg_sys::NodeTag::T_NullTest {
            let t = clause as *mut pg_sys::NullTest;
            if (*t).nulltesttype != pg_sys::NullTestType::IS_NOT_NULL || (*t).argisrow {
                return None;
            }
            let (col, _) = column((*t).arg as *mut pg_sys::Node, varno, cached)?;
            return Some(Range { col, lo: i64::MIN, hi: i64::MAX });
        }
        if (*clause).type_ != pg_sys::NodeTag::T_OpExpr {
            return None;
        }
        let op = clause as *mut pg_sys::OpExpr;
        let args = PgList::<pg_sys::Node>::from_pg((*op).args);
        if args.len() != 2 {
            return None;
        }
        let (a, b) = (args.get_ptr(0)?, args.get_ptr(1)?);
        // column op constant, or constant op column (the strategy commuted)
        let (var, konst, commuted) = if (*b).type_ == pg_sys::NodeTag::T_Const {
            (a, b as *const pg_sys::Const, false)
        } else if (*a).type_ == pg_sys::NodeTag::T_Const {
            (b, a as *const pg_sys::Const, true)
        } else {
            return None;
        };
        let (col, vtype) = column(var, varno, cached)?;
        if col.encoding == Encoding::Bool {
            return None;
        }
        let ctype = (*konst).consttype;
        // Integers compare exactly across widths (one operator family); other types with
        // their own type only (date against timestamp converts).
        if !(ctype == vtype || is_integer(ctype) && is_integer(vtype)) {
            return None;
        }
        let value = const_value(konst)?;
        let opclass = pg_sys::GetDefaultOpClass(vtype, pg_sys::BTREE_AM_OID);
        if opclass == pg_sys::InvalidOid {
            return None;
        }
        let family = pg_sys::get_opclass_family(opclass);
        let mut strategy = pg_sys::get_op_opfamily_strategy((*op).opno, family);
        if commuted {
            strategy = 6 - strategy; // < and >, <= and >= trade places; = stays
        }
        let (lo, hi) = match strategy {
            1 => (i64::MIN, value.checked_sub(1)?),
            2 => (i64::MIN, value),
            3 => (value, value),
            4 => (value, i64::MAX),
            5 => (value.checked_add(1)?, i64::MAX),
            _ => return None,
        };
        Some(Range { col, lo, hi })
    }
}

/// An aggregate the node computes, if `a` is one.
///
/// # Safety
/// `a` is an Aggref.
unsafe fn agg_of(a: *mut pg_sys::Aggref, varno: u32, cached: &[(i16, Encoding)]) -> Option<AggOf> {
    // SAFETY: forwarded contract.
    unsafe {
        let (kind, arg) = agg::spec_of(u32::from((*a).aggfnoid))?;
        let plain = (*a).agglevelsup == 0
            && (*a).aggfilter.is_null()
            && (*a).aggdistinct.is_null()
            && (*a).aggorder.is_null()
            && (*a).aggkind as u8 == b'n' // AGGKIND_NORMAL
            && !(*a).aggvariadic
            && (*a).aggsplit == pg_sys::AggSplit::AGGSPLIT_SIMPLE;
        if !plain {
            return None;
        }
        let args = PgList::<pg_sys::TargetEntry>::from_pg((*a).args);
        if kind == Kind::CountStar {
            return args.is_empty().then_some(AggOf { kind, arg, col: None });
        }
        let te = args.get_ptr(0).filter(|_| args.len() == 1)?;
        let n = (*te).expr as *mut pg_sys::Node;
        let col = if kind == Kind::Count {
            // count(x) looks at NULLs alone: any cached column of the relation
            let v = gpujoin::as_var(n)?;
            if (*v).varno as u32 != varno || (*v).varattno <= 0 {
                return None;
            }
            let &(attnum, encoding) = cached.iter().find(|c| c.0 == (*v).varattno)?;
            Col { attnum, encoding }
        } else {
            let (col, _) = column(n, varno, cached)?;
            let fits = matches!(
                (arg, col.encoding),
                (Arg::Int2, Encoding::Int2) | (Arg::Int4, Encoding::Int4) | (Arg::Int8, Encoding::Int8)
            );
            if !fits {
                return None;
            }
            col
        };
        Some(AggOf { kind, arg, col: Some(col) })
    }
}

impl Shape {
    /// What the node computes for this query level, if it can (the module comment's rules).
    ///
    /// # Safety
    /// The hook's arguments.
    unsafe fn of(
        root: *mut pg_sys::PlannerInfo,
        input_rel: *mut pg_sys::RelOptInfo,
        output_rel: *mut pg_sys::RelOptInfo,
    ) -> Option<Shape> {
        // SAFETY: forwarded contract; every node is read by its tag.
        unsafe {
            let parse = (*root).parse;
            if !(*parse).groupingSets.is_null()
                || (*root).hasHavingQual
                || (*parse).hasTargetSRFs
                || (*input_rel).reloptkind != pg_sys::RelOptKind::RELOPT_BASEREL
            {
                return None;
            }
            let varno = (*input_rel).relid;
            let rte = *(*root).simple_rte_array.add(varno as usize);
            if (*rte).rtekind != pg_sys::RTEKind::RTE_RELATION
                || (*rte).inh
                || (*rte).relkind as u8 != pg_sys::RELKIND_RELATION
                || !(*rte).tablesample.is_null()
            {
                return None;
            }
            let relid = (*rte).relid;
            let cached = caches::ready_columns(relid)?;
            let mut filters = Vec::new();
            for ri in PgList::<pg_sys::RestrictInfo>::from_pg((*input_rel).baserestrictinfo).iter_ptr() {
                if (*ri).pseudoconstant {
                    return None;
                }
                filters.push(range_of((*ri).clause as *mut pg_sys::Node, varno, &cached)?);
            }
            if filters.len() > exec::scan::MAX_FILTERS {
                return None;
            }
            // The grouping columns, as GROUP BY lists them.
            let group_exprs =
                PgList::<pg_sys::Node>::from_pg(pg_sys::get_sortgrouplist_exprs((*parse).groupClause, (*root).processed_tlist));
            let mut keys: Vec<(Col, *mut pg_sys::Var)> = Vec::new();
            for e in group_exprs.iter_ptr() {
                let (col, _) = column(e, varno, &cached)?;
                if !keyable(col.encoding) {
                    return None;
                }
                if !keys.iter().any(|k| k.0 == col) {
                    keys.push((col, e as *mut pg_sys::Var));
                }
            }
            if keys.len() > exec::scan::MAX_KEYS {
                return None;
            }
            // The target: aggregates, and columns only where they are grouping columns.
            let flags = pg_sys::PVC_INCLUDE_AGGREGATES | pg_sys::PVC_INCLUDE_WINDOWFUNCS | pg_sys::PVC_INCLUDE_PLACEHOLDERS;
            let found = PgList::<pg_sys::Node>::from_pg(pg_sys::pull_var_clause(
                (*(*output_rel).reltarget).exprs as *mut pg_sys::Node,
                flags as i32,
            ));
            let mut aggs = Vec::new();
            for n in found.iter_ptr() {
                match (*n).type_ {
                    pg_sys::NodeTag::T_Var => {
                        let (col, _) = column(n, varno, &cached)?;
                        if !keys.iter().any(|k| k.0 == col) {
                            return None;
                        }
                    }
                    pg_sys::NodeTag::T_Aggref => {
                        let a = agg_of(n as *mut pg_sys::Aggref, varno, &cached)?;
                        if !aggs.contains(&a) {
                            aggs.push(a);
                        }
                    }
                    _ => return None,
                }
            }
            // (each sum has a count beside it in the group table: NULL over no value)
            if aggs.len() * 2 > exec::scan::MAX_AGGS {
                return None;
            }
            Some(Shape { relid, varno, keys: keys.into_iter().map(|k| k.0).collect(), filters, aggs, groups: 0 })
        }
    }
}

/// The path's cost: see the module comment.
fn cost(rows: f64, columns: usize, groups: f64) -> f64 {
    // SAFETY: reads planner GUCs of this process.
    let (op, tuple) = unsafe { (pg_sys::cpu_operator_cost, pg_sys::cpu_tuple_cost) };
    SETUP_COST + rows * ROW_FACTOR * op * columns.max(1) as f64 + groups * tuple
}

/// Adds the GpuGroupAgg path to `output_rel` where the query qualifies.
///
/// Its child is an aggregation of its own over the input's cheapest path (hashed, or plain
/// without GROUP BY), not one of `output_rel`'s paths: `add_path` frees the paths a new one
/// dominates, and the node's path dominates PostgreSQL's serial ones.
///
/// # Safety
/// The hook's arguments (`extra`: the grouping's `GroupPathExtraData`).
pub(super) unsafe fn add_path(
    root: *mut pg_sys::PlannerInfo,
    input_rel: *mut pg_sys::RelOptInfo,
    output_rel: *mut pg_sys::RelOptInfo,
    extra: *mut pg_sys::GroupPathExtraData,
) {
    // SAFETY: forwarded contract; every node is allocated in the planner's memory context.
    unsafe {
        let subpath = (*input_rel).cheapest_total_path;
        if subpath.is_null() || extra.is_null() {
            return;
        }
        let Some(mut shape) = Shape::of(root, input_rel, output_rel) else { return };
        // PostgreSQL's estimate of the groups, from its own cheapest path so far.
        let estimate = PgList::<pg_sys::Path>::from_pg((*output_rel).pathlist).get_ptr(0).map_or(1.0, |p| (*p).rows).max(1.0);
        shape.groups = estimate as u64;
        #[cfg(any(feature = "pg14", feature = "pg15"))]
        let group_clause = (*(*root).parse).groupClause;
        #[cfg(not(any(feature = "pg14", feature = "pg15")))]
        let group_clause = (*root).processed_groupClause;
        let strategy = if group_clause.is_null() { pg_sys::AggStrategy::AGG_PLAIN } else { pg_sys::AggStrategy::AGG_HASHED };
        let child = pg_sys::create_agg_path(
            root,
            output_rel,
            subpath,
            (*output_rel).reltarget,
            strategy,
            pg_sys::AggSplit::AGGSPLIT_SIMPLE,
            group_clause,
            std::ptr::null_mut(),
            &(*extra).agg_final_costs,
            estimate,
        ) as *mut pg_sys::Path;
        let cp = pg_sys::palloc0(std::mem::size_of::<pg_sys::CustomPath>()) as *mut pg_sys::CustomPath;
        let p = &mut (*cp).path;
        p.type_ = pg_sys::NodeTag::T_CustomPath;
        p.pathtype = pg_sys::NodeTag::T_CustomScan;
        p.parent = output_rel;
        p.pathtarget = (*output_rel).reltarget;
        p.param_info = std::ptr::null_mut();
        p.parallel_aware = false;
        p.parallel_safe = false;
        p.parallel_workers = 0;
        p.rows = estimate;
        #[cfg(feature = "pg18")]
        {
            p.disabled_nodes = 0;
        }
        let c = cost((*input_rel).tuples, shape.columns().len(), estimate);
        p.startup_cost = c;
        p.total_cost = c;
        let mut children = PgList::<pg_sys::Path>::new();
        children.push(child);
        (*cp).custom_paths = children.into_pg();
        (*cp).custom_private = shape.to_private();
        (*cp).methods = &METHODS.path;
        pg_sys::add_path(output_rel, cp as *mut pg_sys::Path);
    }
}

//! The plan's serialised form: the `CustomScan` made from a GpuJoin path (`PlanCustomPath`),
//! and its private list, which parallel workers read back from the plan PostgreSQL sends them
//! (so it holds only Consts: copyable and printable on every major).

use super::*;

/// An int8 constant (custom_private holds only Consts: copyable and printable on every major).
pub fn int_node(v: i64) -> *mut pg_sys::Node {
    // SAFETY: makeConst allocates a Const in the current memory context.
    unsafe {
        pg_sys::makeConst(pg_sys::INT8OID, -1, pg_sys::InvalidOid, 8, pg_sys::Datum::from(v), false, true) as *mut pg_sys::Node
    }
}

pub(super) fn text_node(s: &str) -> *mut pg_sys::Node {
    let c = std::ffi::CString::new(s.replace('\0', "")).expect("no NUL");
    // SAFETY: cstring_to_text copies the string into a palloc'd text.
    unsafe {
        let t = pg_sys::cstring_to_text(c.as_ptr());
        pg_sys::makeConst(pg_sys::TEXTOID, -1, pg_sys::DEFAULT_COLLATION_OID, -1, pg_sys::Datum::from(t), false, false)
            as *mut pg_sys::Node
    }
}

/// # Safety
/// `n` is an int8 Const made by [`int_node`].
pub(super) unsafe fn int_of(n: *mut pg_sys::Node) -> i64 {
    // SAFETY: forwarded contract.
    unsafe { (*(n as *mut pg_sys::Const)).constvalue.value() as i64 }
}

/// # Safety
/// `n` is a text Const made by [`text_node`].
pub(super) unsafe fn text_of(n: *mut pg_sys::Node) -> String {
    // SAFETY: forwarded contract.
    unsafe {
        let c = pg_sys::text_to_cstring((*(n as *mut pg_sys::Const)).constvalue.cast_mut_ptr());
        CStr::from_ptr(c).to_string_lossy().into_owned()
    }
}

/// The resno of `var` in `tlist` (a child plan's target list), matched by relation and column.
///
/// # Safety
/// Planner structures.
pub(super) unsafe fn resno_in(tlist: *mut pg_sys::List, var: *mut pg_sys::Var) -> Option<i64> {
    // SAFETY: forwarded contract.
    unsafe {
        PgList::<pg_sys::TargetEntry>::from_pg(tlist).iter_ptr().find_map(|te| {
            let v = as_var((*te).expr as *mut pg_sys::Node)?;
            ((*v).varno == (*var).varno && (*v).varattno == (*var).varattno).then_some((*te).resno as i64)
        })
    }
}

/// "relname alias" of every base relation in `relids`.
///
/// # Safety
/// Planner structures.
pub(super) unsafe fn relation_names(root: *mut pg_sys::PlannerInfo, relids: *mut pg_sys::Bitmapset) -> String {
    // SAFETY: forwarded contract; simple_rte_array has an entry for every relid.
    unsafe {
        let mut names = Vec::new();
        let mut i = pg_sys::bms_next_member(relids, -1);
        while i >= 0 {
            let rte = *(*root).simple_rte_array.add(i as usize);
            if !rte.is_null() && (*rte).rtekind == pg_sys::RTEKind::RTE_RELATION {
                let rel = pg_sys::get_rel_name((*rte).relid);
                let rel = if rel.is_null() { String::from("?") } else { CStr::from_ptr(rel).to_string_lossy().into_owned() };
                let alias = if (*rte).eref.is_null() {
                    rel.clone()
                } else {
                    CStr::from_ptr((*(*rte).eref).aliasname).to_string_lossy().into_owned()
                };
                names.push(if alias == rel { rel } else { format!("{rel} {alias}") });
            }
            i = pg_sys::bms_next_member(relids, i);
        }
        names.join(", ")
    }
}

/// The plan's private list: [the number of key columns, (outer type oid, inner type oid, outer
/// resno, inner resno) per key column, inner relation names, whether the inner plan is
/// partial, the join kind, the number of aggregates, (function OID, column) per aggregate,
/// then (side, resno) per column kept].
pub(super) struct Private {
    /// Per key clause (`super::joinkey`, in the clauses' order): the outer and inner columns'
    /// types and their resnos in the outer and inner child's rows.
    pub(super) keys: Vec<(pg_sys::Oid, pg_sys::Oid, i32, i32)>,
    pub(super) inner_names: String,
    /// The inner plan is partial (a parallel query's participants each scan a share of it).
    pub(super) inner_partial: bool,
    /// Inner, left, semi or anti (`super::plan::JoinKind`).
    pub(super) join: JoinKind,
    /// (0 outer / 1 inner, resno) per column of the join the node keeps: per scan tuple
    /// column, or in the aggregate mode per scan tuple column after the aggregates'.
    pub(super) map: Vec<(u8, i32)>,
    /// The aggregate mode (empty: the join mode): per aggregate, its function's OID and the
    /// index in `map` of its argument (-1 for `count(*)`).
    pub(super) aggs: Vec<(u32, i32)>,
}

impl Private {
    pub(super) fn to_list(&self) -> *mut pg_sys::List {
        let mut l = PgList::<pg_sys::Node>::new();
        l.push(int_node(self.keys.len() as i64));
        for &(outer_oid, inner_oid, outer, inner) in &self.keys {
            l.push(int_node(u32::from(outer_oid) as i64));
            l.push(int_node(u32::from(inner_oid) as i64));
            l.push(int_node(outer as i64));
            l.push(int_node(inner as i64));
        }
        l.push(text_node(&self.inner_names));
        l.push(int_node(self.inner_partial as i64));
        l.push(int_node(self.join as i64));
        l.push(int_node(self.aggs.len() as i64));
        for &(fnoid, col) in &self.aggs {
            l.push(int_node(fnoid as i64));
            l.push(int_node(col as i64));
        }
        for &(side, resno) in &self.map {
            l.push(int_node(side as i64));
            l.push(int_node(resno as i64));
        }
        l.into_pg()
    }

    /// # Safety
    /// A list made by [`Private::to_list`].
    pub(super) unsafe fn from_list(list: *mut pg_sys::List) -> Private {
        // SAFETY: forwarded contract.
        unsafe {
            let l = PgList::<pg_sys::Node>::from_pg(list);
            let node = |i: usize| l.get_ptr(i).expect("GpuJoin plan private data");
            let at = |i: usize| int_of(node(i));
            let nkeys = at(0).max(0) as usize;
            let oid = |i: usize| pg_sys::Oid::from(at(i) as u32);
            let keys = (0..nkeys).map(|j| (oid(1 + 4 * j), oid(2 + 4 * j), at(3 + 4 * j) as i32, at(4 + 4 * j) as i32));
            let keys: Vec<_> = keys.collect();
            let rest = 1 + 4 * nkeys;
            let naggs = at(rest + 3).max(0) as usize;
            let aggs = (0..naggs).map(|j| (at(rest + 4 + 2 * j) as u32, at(rest + 5 + 2 * j) as i32)).collect();
            let mut map = Vec::new();
            let mut i = rest + 4 + 2 * naggs;
            while i + 1 < l.len() {
                map.push((at(i) as u8, at(i + 1) as i32));
                i += 2;
            }
            let join = JoinKind::from_i64(at(rest + 2));
            Private { keys, inner_names: text_of(node(rest)), inner_partial: at(rest + 1) != 0, join, map, aggs }
        }
    }

    /// The key's composer (`super::joinkey`), checked: every key column of a type the node
    /// takes.
    pub(super) fn composer(&self) -> Composer {
        let bad = |k: &(pg_sys::Oid, pg_sys::Oid, i32, i32)| key_type_of(k.0).is_none() || key_type_of(k.1).is_none();
        if self.keys.is_empty() || self.keys.iter().any(bad) {
            report(UvmError::new(Code::SystemError, "GpuJoin: bad key type in plan"));
        }
        Composer::new(self.keys.iter().map(|k| clause_bits(k.0, k.1)).collect())
    }

    /// The key columns of one side (0 outer, 1 inner).
    pub(super) fn key_cols(&self, side: u8) -> KeyCols {
        let pick = |k: &(pg_sys::Oid, pg_sys::Oid, i32, i32)| if side == 0 { (k.0, k.2) } else { (k.1, k.3) };
        KeyCols {
            atts: self.keys.iter().map(|k| pick(k).1).collect(),
            oids: self.keys.iter().map(|k| pick(k).0).collect(),
            composer: self.composer(),
        }
    }
}

/// The key columns of one side of the join as [`fetch_chunk`] reads them: their attribute
/// numbers in the child's rows, their types, and how they form the key.
pub(super) struct KeyCols {
    pub(super) atts: Vec<i32>,
    pub(super) oids: Vec<pg_sys::Oid>,
    pub(super) composer: Composer,
}

impl KeyCols {
    /// The highest attribute number among them.
    pub(super) fn max_att(&self) -> i32 {
        self.atts.iter().copied().max().unwrap_or(0)
    }
}

/// `PlanCustomPath`: the `CustomScan` of a GpuJoin path (see the module comment of `super`).
///
/// # Safety
/// PlanCustomPath's arguments, for a path made by `super::plan`.
pub(super) unsafe fn plan_custom_path(
    root: *mut pg_sys::PlannerInfo,
    rel: *mut pg_sys::RelOptInfo,
    path: *mut pg_sys::CustomPath,
    tlist: *mut pg_sys::List,
    _clauses: *mut pg_sys::List,
    custom_plans: *mut pg_sys::List,
) -> *mut pg_sys::CustomScan {
    super::count(|c| c.planned());
    // SAFETY: PlanCustomPath's arguments; the path is ours (custom_private: the key clauses
    // first, then the other restrict clauses; custom_paths: outer, inner).
    unsafe {
        let plans = PgList::<pg_sys::Plan>::from_pg(custom_plans);
        let (outer_plan, inner_plan) = (plans.get_ptr(0).expect("outer plan"), plans.get_ptr(1).expect("inner plan"));
        let paths = PgList::<pg_sys::Path>::from_pg((*path).custom_paths);
        let (outer_rel, inner_rel) = ((*paths.get_ptr(0).expect("outer")).parent, (*paths.get_ptr(1).expect("inner")).parent);
        let clauses = Clauses::of((*path).custom_private, outer_rel, inner_rel);
        if clauses.keys.is_empty() {
            report(UvmError::new(Code::SystemError, "GpuJoin: a path without a key clause"));
        }
        let mut qual_rinfos = PgList::<pg_sys::RestrictInfo>::new();
        for r in clauses.qual() {
            qual_rinfos.push(r);
        }
        let quals = pg_sys::extract_actual_clauses(qual_rinfos.into_pg(), false);
        // Every Var the join's output, the qual and the join clause use, once. The output is
        // the path's target, not only `tlist`: PostgreSQL 14 plans a projection above a
        // custom scan by asking for no target list (CP_IGNORE_TLIST) and then putting the
        // projection's own, made of the path target's Vars, in its place.
        //
        // In the aggregate mode (`with_aggregates`: the target is a list of Aggrefs) the scan
        // tuple is the aggregates' results, then the columns (the Aggrefs' arguments and the
        // keys, which the join clause in custom_exprs names): setrefs turns the target list's
        // Aggrefs into references to the first ones, as for postgres_fdw's pushed-down
        // aggregates.
        let target = (*(*path).path.pathtarget).exprs as *mut pg_sys::Node;
        let aggrefs: Vec<*mut pg_sys::Aggref> = PgList::<pg_sys::Node>::from_pg(target as *mut pg_sys::List)
            .iter_ptr()
            .filter(|n| (**n).type_ == pg_sys::NodeTag::T_Aggref)
            .map(|n| n as *mut pg_sys::Aggref)
            .collect();
        if !aggrefs.is_empty() && !PgList::<pg_sys::Node>::from_pg(quals).is_empty() {
            report(UvmError::new(Code::SystemError, "GpuJoin: aggregates over a join with other clauses"));
        }
        let same = |a: *mut pg_sys::Var, b: *mut pg_sys::Var| (*a).varno == (*b).varno && (*a).varattno == (*b).varattno;
        let mut vars: Vec<*mut pg_sys::Var> = Vec::new();
        let mut add = |v: *mut pg_sys::Var| {
            if !vars.iter().any(|w| same(*w, v)) {
                vars.push(v);
            }
        };
        // The output's Vars first: above a left join they carry the join's nulling (PostgreSQL
        // 16 and later), which setrefs checks against the scan tuple's Var of that column; the
        // key clause's Vars, below the nulling, are made to match it (`custom_exprs` below).
        for n in [target, tlist as *mut pg_sys::Node, quals as *mut pg_sys::Node] {
            let found = pg_sys::pull_var_clause(n, pg_sys::PVC_RECURSE_AGGREGATES as i32);
            for v in PgList::<pg_sys::Node>::from_pg(found).iter_ptr() {
                add(as_var(v).expect("plain Vars only (checked by the path)"));
            }
        }
        for &(_, ov, iv) in &clauses.keys {
            add(ov);
            add(iv);
        }
        let mut scan_tlist = PgList::<pg_sys::TargetEntry>::new();
        let mut aggs = Vec::with_capacity(aggrefs.len());
        for (i, &a) in aggrefs.iter().enumerate() {
            let args = PgList::<pg_sys::TargetEntry>::from_pg((*a).args);
            let col = match args.get_ptr(0) {
                None => -1,
                Some(te) => {
                    let v = as_var((*te).expr as *mut pg_sys::Node).expect("a plain Var (checked by the path)");
                    let at = vars.iter().position(|w| (**w).varno == (*v).varno && (**w).varattno == (*v).varattno);
                    at.expect("pulled above") as i32
                }
            };
            aggs.push((u32::from((*a).aggfnoid), col));
            let copy = pg_sys::copyObjectImpl(a as *const std::ffi::c_void) as *mut pg_sys::Expr;
            scan_tlist.push(pg_sys::makeTargetEntry(copy, (i + 1) as i16, std::ptr::null_mut(), false));
        }
        let naggs = aggrefs.len();
        let mut map = Vec::with_capacity(vars.len());
        for (i, v) in vars.iter().enumerate() {
            let side = if let Some(r) = resno_in((*outer_plan).targetlist, *v) {
                (0u8, r as i32)
            } else if let Some(r) = resno_in((*inner_plan).targetlist, *v) {
                (1u8, r as i32)
            } else {
                report(UvmError::new(Code::SystemError, "GpuJoin: a column of the join is in neither child's target list"))
            };
            map.push(side);
            let copy = pg_sys::copyObjectImpl(*v as *const std::ffi::c_void) as *mut pg_sys::Expr;
            scan_tlist.push(pg_sys::makeTargetEntry(copy, (naggs + i + 1) as i16, std::ptr::null_mut(), false));
        }
        let resno_of = |v: *mut pg_sys::Var| map[vars.iter().position(|w| same(*w, v)).expect("a key column")].1;
        let keys = clauses.keys.iter().map(|&(_, ov, iv)| ((*ov).vartype, (*iv).vartype, resno_of(ov), resno_of(iv)));
        let keys = keys.collect();
        let p = Private {
            keys,
            inner_names: relation_names(root, (*inner_rel).relids),
            // From the path: a partial inner path here is a parallel-aware scan (add_path
            // takes no other), whatever the planner puts above it in the plan.
            inner_partial: (*path).path.parallel_aware && (*paths.get_ptr(1).expect("inner")).parallel_aware,
            join: path_join_kind((*path).custom_private),
            map,
            aggs,
        };
        let cscan = pg_sys::palloc0(std::mem::size_of::<pg_sys::CustomScan>()) as *mut pg_sys::CustomScan;
        (*cscan).scan.plan.type_ = pg_sys::NodeTag::T_CustomScan;
        (*cscan).scan.plan.targetlist = tlist;
        (*cscan).scan.plan.qual = quals;
        (*cscan).scan.scanrelid = 0;
        (*cscan).flags = (*path).flags;
        (*cscan).custom_plans = custom_plans;
        (*cscan).custom_scan_tlist = scan_tlist.into_pg();
        // The key clauses, for EXPLAIN: one clause, or their AND.
        let mut key_exprs = PgList::<pg_sys::Node>::new();
        for &(r, _, _) in &clauses.keys {
            key_exprs.push(pg_sys::copyObjectImpl((*r).clause as *const std::ffi::c_void) as *mut pg_sys::Node);
        }
        let cond = match key_exprs.len() {
            1 => key_exprs.get_ptr(0).expect("one clause"),
            _ => pg_sys::make_andclause(key_exprs.into_pg()) as *mut pg_sys::Node,
        };
        // The clause is shown by EXPLAIN only: its Vars take the scan tuple's nulling of their
        // column (a left join's inner key in the output is nulled by the join; in the clause it
        // is not), so that setrefs (which compares them) finds its column.
        #[cfg(any(feature = "pg16", feature = "pg17", feature = "pg18"))]
        for v in PgList::<pg_sys::Node>::from_pg(pg_sys::pull_var_clause(cond, 0)).iter_ptr() {
            let v = v as *mut pg_sys::Var;
            if let Some(w) = vars.iter().find(|w| same(**w, v)) {
                (*v).varnullingrels = pg_sys::bms_copy((**w).varnullingrels);
            }
        }
        let mut exprs = PgList::<pg_sys::Node>::new();
        exprs.push(cond);
        (*cscan).custom_exprs = exprs.into_pg();
        (*cscan).custom_private = p.to_list();
        (*cscan).custom_relids = (*rel).relids;
        cscan
    }
}

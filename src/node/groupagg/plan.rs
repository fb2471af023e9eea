//! The planner's side of GpuGroupAgg: which query levels the node computes, its path, and
//! its plan (see the module essay).

use super::clauses::{column, int_clauses, is_integer, text_clause};
use super::*;

/// An aggregate the node computes, if `a` is one.
///
/// # Safety
/// `a` is an Aggref.
pub(super) unsafe fn agg_of(a: *mut pg_sys::Aggref, varno: u32, cached: &[(i16, Encoding)]) -> Option<AggOf> {
    // SAFETY: forwarded contract.
    unsafe {
        // avg of integers and floats, sum, min and max of floats (pg_proc's fixed OIDs; an avg
        // is a sum and its count; sum(float4) is not here: PostgreSQL adds in float4)
        let (kind, arg, avg, num) = match u32::from((*a).aggfnoid) {
            2100 => (Kind::Sum, Arg::Int8, true, Num::Int),
            2101 => (Kind::Sum, Arg::Int4, true, Num::Int),
            2102 => (Kind::Sum, Arg::Int2, true, Num::Int),
            2104 => (Kind::Sum, Arg::Any, true, Num::Float4),
            2105 => (Kind::Sum, Arg::Any, true, Num::Float8),
            2111 => (Kind::Sum, Arg::Any, false, Num::Float8),
            2103 => (Kind::Sum, Arg::Any, true, Num::Numeric),
            2114 => (Kind::Sum, Arg::Any, false, Num::Numeric),
            2130 => (Kind::Max, Arg::Any, false, Num::Numeric),
            2146 => (Kind::Min, Arg::Any, false, Num::Numeric),
            2119 => (Kind::Max, Arg::Any, false, Num::Float4),
            2120 => (Kind::Max, Arg::Any, false, Num::Float8),
            2135 => (Kind::Min, Arg::Any, false, Num::Float4),
            2136 => (Kind::Min, Arg::Any, false, Num::Float8),
            f => {
                let (kind, arg) = agg::spec_of(f)?;
                (kind, arg, false, Num::Int)
            }
        };
        if !agg::plain(a) {
            return None;
        }
        let args = PgList::<pg_sys::TargetEntry>::from_pg((*a).args);
        if kind == Kind::CountStar {
            return args.is_empty().then_some(AggOf { kind, arg, input: AggInput::Star, avg, num });
        }
        let te = args.get_ptr(0).filter(|_| args.len() == 1)?;
        let n = (*te).expr as *mut pg_sys::Node;
        if kind == Kind::Count {
            // count(x) looks at NULLs alone: any cached column of the relation
            let v = gpujoin::as_var(n)?;
            if (*v).varno as u32 != varno || (*v).varattno <= 0 {
                return None;
            }
            let &(attnum, encoding) = cached.iter().find(|c| c.0 == (*v).varattno)?;
            let scale = if encoding == Encoding::Numeric { numeric_scale((*v).vartypmod)? } else { 0 };
            return Some(AggOf { kind, arg, input: AggInput::Col(Col { attnum, encoding, scale }), avg, num });
        }
        if num == Num::Numeric {
            // a numeric(p, s) column: its scaled words
            let (col, _) = column(n, varno, cached)?;
            return (col.encoding == Encoding::Numeric).then_some(AggOf { kind, arg, input: AggInput::Col(col), avg, num });
        }
        if num != Num::Int {
            // a float column of the aggregate's own type
            let v = gpujoin::as_var(n)?;
            let (typ, encoding) =
                if num == Num::Float4 { (pg_sys::FLOAT4OID, Encoding::Float4) } else { (pg_sys::FLOAT8OID, Encoding::Float8) };
            if (*v).varno as u32 != varno || (*v).varattno <= 0 || (*v).vartype != typ {
                return None;
            }
            let attnum = (*v).varattno;
            cached.iter().find(|c| c.0 == attnum && c.1 == encoding)?;
            return Some(AggOf { kind, arg, input: AggInput::Col(Col::new(attnum, encoding)), avg, num });
        }
        if (*n).type_ == pg_sys::NodeTag::T_OpExpr {
            // a difference or a product of two integer columns, as int8 arithmetic
            let op = n as *mut pg_sys::OpExpr;
            let opargs = PgList::<pg_sys::Node>::from_pg((*op).args);
            if arg != Arg::Int8 || opargs.len() != 2 || (*op).opresulttype != pg_sys::INT8OID {
                return None;
            }
            let (x, _) = column(opargs.get_ptr(0)?, varno, cached)?;
            let (y, _) = column(opargs.get_ptr(1)?, varno, cached)?;
            let wide = |c: Col| matches!(c.encoding, Encoding::Int4 | Encoding::Int8);
            if !wide(x) || !wide(y) {
                return None;
            }
            let input = match u32::from(pg_sys::get_opcode((*op).opno)) {
                pg_sys::F_INT8MI | pg_sys::F_INT84MI | pg_sys::F_INT48MI => AggInput::Sub(x, y),
                pg_sys::F_INT8MUL | pg_sys::F_INT84MUL | pg_sys::F_INT48MUL => AggInput::Mul(x, y),
                _ => return None,
            };
            return Some(AggOf { kind, arg, input, avg, num });
        }
        let (col, _) = column(n, varno, cached)?;
        let fits = matches!(
            (arg, col.encoding),
            (Arg::Int2, Encoding::Int2) | (Arg::Int4, Encoding::Int4) | (Arg::Int8, Encoding::Int8)
        );
        fits.then_some(AggOf { kind, arg, input: AggInput::Col(col), avg, num })
    }
}

/// A base relation of the level's `FROM`: a plain table without inheritance children or a
/// sample, none of whose join clauses lies outside the equivalence classes.
///
/// # Safety
/// The planner's structures.
unsafe fn plain_table(root: *mut pg_sys::PlannerInfo, varno: u32) -> Option<pg_sys::Oid> {
    // SAFETY: forwarded contract; `varno` is a member of a relation of this level.
    unsafe {
        let rte = *(*root).simple_rte_array.add(varno as usize);
        let rel = *(*root).simple_rel_array.add(varno as usize);
        let plain = !rte.is_null()
            && !rel.is_null()
            && (*rte).rtekind == pg_sys::RTEKind::RTE_RELATION
            && !(*rte).inh
            && (*rte).relkind as u8 == pg_sys::RELKIND_RELATION
            && (*rte).tablesample.is_null()
            && (*rel).reloptkind == pg_sys::RelOptKind::RELOPT_BASEREL
            && (*rel).joininfo.is_null()
            && (*rel).lateral_relids.is_null();
        plain.then_some((*rte).relid)
    }
}

/// The join equalities among `members`: per equivalence class without a constant that holds
/// columns of two or more of them, its members as (range table index, column); `None` where a class joins them by
/// something else than plain columns, or is volatile.
///
/// # Safety
/// The planner's structures.
unsafe fn join_classes(root: *mut pg_sys::PlannerInfo, members: &[u32]) -> Option<Vec<Vec<(u32, *mut pg_sys::Var)>>> {
    // SAFETY: forwarded contract; nodes read by their tags.
    unsafe {
        let mut out = Vec::new();
        for ec in PgList::<pg_sys::EquivalenceClass>::from_pg((*root).eq_classes).iter_ptr() {
            // (a class with a constant holds by each member's own restriction, `x = const`,
            // which the relations' conditions carry: no join to run)
            if !(*ec).ec_merged.is_null() || (*ec).ec_has_const {
                continue;
            }
            // (a class of one relation's expressions, a sort key such as an aggregate, joins
            // nothing)
            let mut found: Vec<(u32, *mut pg_sys::Var)> = Vec::new();
            let (mut rels, mut opaque) = (Vec::new(), false);
            for em in PgList::<pg_sys::EquivalenceMember>::from_pg((*ec).ec_members).iter_ptr() {
                if (*em).em_is_child || (*em).em_is_const {
                    continue;
                }
                for &m in members.iter().filter(|&&m| pg_sys::bms_is_member(m as i32, (*em).em_relids)) {
                    if !rels.contains(&m) {
                        rels.push(m);
                    }
                }
                match gpujoin::as_var((*em).em_expr as *mut pg_sys::Node) {
                    Some(v) if members.contains(&((*v).varno as u32)) => found.push(((*v).varno as u32, v)),
                    _ => opaque = true,
                }
            }
            if rels.len() >= 2 {
                if opaque || (*ec).ec_has_volatile || (*ec).ec_broken {
                    return None;
                }
                out.push(found);
            }
        }
        Some(out)
    }
}

/// Whether a dimension's column of type `typid` (collation `coll`) can be grouped by its bytes:
/// equal values are equal bytes (integer-like types, text with a deterministic collation).
///
/// # Safety
/// A catalog lookup.
unsafe fn groupable(typid: pg_sys::Oid, coll: pg_sys::Oid) -> bool {
    match typid {
        pg_sys::INT2OID
        | pg_sys::INT4OID
        | pg_sys::INT8OID
        | pg_sys::BOOLOID
        | pg_sys::DATEOID
        | pg_sys::TIMESTAMPOID
        | pg_sys::TIMESTAMPTZOID => true,
        pg_sys::TEXTOID | pg_sys::VARCHAROID => {
            // SAFETY: a lookup of an existing collation (the column's).
            coll == pg_sys::InvalidOid || unsafe { pg_sys::get_collation_isdeterministic(coll) }
        }
        _ => false,
    }
}

/// The conditions of relation `varno` (`rel`) as the program's clauses over its cached columns
/// (`None` where one is not a clause of the program's): text conditions appended to `texts`,
/// comparisons to `compares`; at most `exec::scan::MAX_FILTERS` tests in all, `reserved` of them
/// taken already; clauses holding a comparison last.
///
/// # Safety
/// The planner's structures.
unsafe fn clauses_of(
    rel: *mut pg_sys::RelOptInfo,
    varno: u32,
    cached: &[(i16, Encoding)],
    texts: &mut Vec<*mut pg_sys::Node>,
    compares: &mut Vec<PlanCompare>,
    reserved: usize,
) -> Option<Vec<Vec<Atom>>> {
    // SAFETY: forwarded contract; every node is read by its tag.
    unsafe {
        let mut filters = Vec::new();
        for ri in PgList::<pg_sys::RestrictInfo>::from_pg((*rel).baserestrictinfo).iter_ptr() {
            if (*ri).pseudoconstant {
                return None;
            }
            let clause = (*ri).clause as *mut pg_sys::Node;
            let mark = compares.len();
            match int_clauses(clause, varno, cached, compares) {
                Some(c) => filters.extend(c),
                None => {
                    compares.truncate(mark);
                    let (col, expr) = text_clause(clause, varno, cached)?;
                    filters.push(vec![Atom { col, check: Check::Text(texts.len()) }]);
                    texts.push(expr);
                }
            }
        }
        // (a clause of no alternative is never true: PostgreSQL answers)
        if filters.iter().any(|c: &Vec<Atom>| c.is_empty()) {
            return None;
        }
        // (a text condition may take two: its codes, and IS NULL where NULL passes it)
        let tests: usize = filters.iter().flatten().map(|a| if matches!(a.check, Check::Text(_)) { 2 } else { 1 }).sum();
        if tests + reserved > exec::scan::MAX_FILTERS {
            return None;
        }
        // Clauses with a comparison last: their arithmetic may raise an ERROR, which the
        // other clauses should have the chance to spare a row (as PostgreSQL orders its
        // cheaper conditions first).
        filters.sort_by_key(|c: &Vec<Atom>| c.iter().any(|a| matches!(a.check, Check::Compare(_))));
        Some(filters)
    }
}

/// Dimension `d`'s program over its own cache, where it has a ready one holding its key, its
/// grouping columns and every column its conditions read, and each condition is a clause of
/// the program's: its text conditions go to the plan's `texts` (left as they were otherwise).
///
/// # Safety
/// The planner's structures; `d` a dimension of this level.
unsafe fn dim_cache(root: *mut pg_sys::PlannerInfo, d: &Dim, texts: &mut Vec<*mut pg_sys::Node>) -> Option<DimCache> {
    // SAFETY: forwarded contract.
    unsafe {
        // (its program's key: the dimension's key and grouping columns)
        if 1 + d.groups.len() > exec::scan::MAX_KEYS {
            return None;
        }
        let cached = caches::ready_columns(d.relid)?;
        let has = |attnum: i16, e: Encoding| cached.contains(&(attnum, e)).then_some(Col::new(attnum, e));
        let key = has(d.key.0, encoding_of_type(d.key.1)?)?;
        let mut groups = Vec::new();
        for g in &d.groups {
            let e = match g.typid {
                pg_sys::TEXTOID | pg_sys::VARCHAROID => Encoding::DictCode,
                t => encoding_of_type(t)?,
            };
            groups.push(has(g.attnum, e)?);
        }
        let rel = *(*root).simple_rel_array.add(d.varno as usize);
        let (mut own, mut compares) = (Vec::new(), Vec::new());
        // (one test taken by the key's IS NOT NULL)
        let mut filters = clauses_of(rel, d.varno, &cached, &mut own, &mut compares, 1)?;
        for a in filters.iter_mut().flatten() {
            if let Check::Text(n) = &mut a.check {
                *n += texts.len();
            }
        }
        texts.extend(own);
        Some(DimCache { key, groups, filters, compares })
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
            if !(*parse).groupingSets.is_null() || (*root).hasHavingQual || (*parse).hasTargetSRFs {
                return None;
            }
            let members: Vec<u32> = match (*input_rel).reloptkind {
                pg_sys::RelOptKind::RELOPT_BASEREL => vec![(*input_rel).relid],
                // inner joins only: no outer, semi or anti join anywhere in the level
                pg_sys::RelOptKind::RELOPT_JOINREL if (*root).join_info_list.is_null() => {
                    let mut m = Vec::new();
                    let mut x = pg_sys::bms_next_member((*input_rel).relids, -1);
                    while x >= 0 {
                        m.push(x as u32);
                        x = pg_sys::bms_next_member((*input_rel).relids, x);
                    }
                    m
                }
                _ => return None,
            };
            if members.len() > 1 + exec::scan::MAX_JOINS {
                return None;
            }
            let mut relids = Vec::new();
            for &m in &members {
                relids.push(plain_table(root, m)?);
            }
            let classes = if members.len() > 1 { join_classes(root, &members)? } else { Vec::new() };
            let with = |fact: u32, relid: pg_sys::Oid, heap: bool| {
                let others: Vec<(u32, pg_sys::Oid)> =
                    members.iter().zip(&relids).filter(|m| *m.0 != fact).map(|(&m, &r)| (m, r)).collect();
                Self::with_fact(root, output_rel, fact, relid, &others, &classes, heap)
            };
            // The fact: the first member whose cache holds what the level reads of it; else,
            // where the heap may be read, the largest member whose columns the program reads.
            let cached = members.iter().zip(&relids).find_map(|(&fact, &relid)| with(fact, relid, false));
            if cached.is_some() || !heap_enabled() {
                return cached;
            }
            let mut by_size: Vec<(u32, pg_sys::Oid)> = members.iter().copied().zip(relids.iter().copied()).collect();
            by_size.sort_by(|a, b| {
                let tuples = |m: u32| (**(*root).simple_rel_array.add(m as usize)).tuples;
                tuples(b.0).total_cmp(&tuples(a.0))
            });
            by_size.into_iter().find_map(|(fact, relid)| with(fact, relid, true))
        }
    }

    /// [`Shape::of`] with `fact` as the fact table and `others` as its dimensions.
    ///
    /// # Safety
    /// The hook's arguments.
    unsafe fn with_fact(
        root: *mut pg_sys::PlannerInfo,
        output_rel: *mut pg_sys::RelOptInfo,
        varno: u32,
        relid: pg_sys::Oid,
        others: &[(u32, pg_sys::Oid)],
        classes: &[Vec<(u32, *mut pg_sys::Var)>],
        heap: bool,
    ) -> Option<Shape> {
        // SAFETY: forwarded contract; every node is read by its tag.
        unsafe {
            let parse = (*root).parse;
            let rel = *(*root).simple_rel_array.add(varno as usize);
            // (the columns the program may read, with their encodings: the cache's, or those
            // of the heap's columns that a batch lays out)
            let cached = if heap { heap_columns(rel, relid) } else { caches::ready_columns(relid)? };
            // Over the heap, no row-level security or security-barrier condition: the program
            // tests its clauses in its own order, where PostgreSQL tests those first and keeps
            // a query's own conditions, which may raise an ERROR, from rows they hide. (A
            // cache is never built of a table with row-level security.)
            if heap
                && PgList::<pg_sys::RestrictInfo>::from_pg((*rel).baserestrictinfo).iter_ptr().any(|ri| (*ri).security_level > 0)
            {
                return None;
            }
            let (mut texts, mut compares) = (Vec::new(), Vec::new());
            let filters = clauses_of(rel, varno, &cached, &mut texts, &mut compares, 0)?;
            // Each class joins the fact's one column with dimensions' columns; each dimension
            // is in one class, by one column.
            let mut dims: Vec<Dim> = Vec::new();
            for class in classes {
                let facts: Vec<*mut pg_sys::Var> = class.iter().filter(|m| m.0 == varno).map(|m| m.1).collect();
                let [fv] = facts[..] else { return None };
                let (fact_col, ftype) = column(fv as *mut pg_sys::Node, varno, &cached)?;
                for &(m, v) in class.iter().filter(|m| m.0 != varno) {
                    let (&(_, drelid), vtype) = (others.iter().find(|o| o.0 == m)?, (*v).vartype);
                    let ints = is_integer(ftype) && is_integer(vtype);
                    let dates = ftype == pg_sys::DATEOID && vtype == pg_sys::DATEOID;
                    if !(ints || dates) || (*v).varattno <= 0 || dims.iter().any(|d| d.varno == m) {
                        return None;
                    }
                    dims.push(Dim {
                        relid: drelid,
                        varno: m,
                        fact_col,
                        key: ((*v).varattno, vtype),
                        key_pos: 0,
                        groups: Vec::new(),
                        cached: None,
                    });
                }
            }
            if dims.len() != others.len() || dims.len() > exec::scan::MAX_JOINS {
                return None; // a table joined by no equality with the fact
            }
            // The grouping columns, as GROUP BY lists them.
            let group_exprs =
                PgList::<pg_sys::Node>::from_pg(pg_sys::get_sortgrouplist_exprs((*parse).groupClause, (*root).processed_tlist));
            let mut keys: Vec<Key> = Vec::new();
            for e in group_exprs.iter_ptr() {
                let key = Self::key_of(e, varno, &cached, &mut dims)?;
                if !keys.contains(&key) {
                    keys.push(key);
                }
            }
            let words =
                keys.iter().filter(|k| matches!(k, Key::Fact(_))).count() + dims.iter().filter(|d| !d.groups.is_empty()).count();
            if words > exec::scan::MAX_KEYS {
                return None;
            }
            // The target: aggregates of the fact's columns, and columns only where they are
            // grouping columns.
            let flags = pg_sys::PVC_INCLUDE_AGGREGATES | pg_sys::PVC_INCLUDE_WINDOWFUNCS | pg_sys::PVC_INCLUDE_PLACEHOLDERS;
            let found = PgList::<pg_sys::Node>::from_pg(pg_sys::pull_var_clause(
                (*(*output_rel).reltarget).exprs as *mut pg_sys::Node,
                flags as i32,
            ));
            let mut aggs = Vec::new();
            for n in found.iter_ptr() {
                match (*n).type_ {
                    pg_sys::NodeTag::T_Var => {
                        let mut probe = dims.clone();
                        let k = Self::key_of(n, varno, &cached, &mut probe)?;
                        if !keys.contains(&k) || probe != dims {
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
            // The dimensions whose caches can stand in for their plans.
            for d in &mut dims {
                d.cached = dim_cache(root, d, &mut texts);
            }
            Some(Shape { relid, varno, keys, filters, texts, compares, aggs, dims, groups: 0, heap })
        }
    }

    /// The grouping column `e` is: a keyable cached column of the fact, or a groupable column
    /// of a dimension (added to its grouping columns).
    ///
    /// # Safety
    /// `e` is a planner expression.
    unsafe fn key_of(e: *mut pg_sys::Node, varno: u32, cached: &[(i16, Encoding)], dims: &mut [Dim]) -> Option<Key> {
        // SAFETY: forwarded contract.
        unsafe {
            let v = gpujoin::as_var(e)?;
            if (*v).varno as u32 == varno {
                // a dictionary-encoded text column groups by its codes: one per distinct
                // string (the cache holds text of deterministic collations only)
                if matches!((*v).vartype, pg_sys::TEXTOID | pg_sys::VARCHAROID) && (*v).varattno > 0 {
                    let attnum = (*v).varattno;
                    cached.iter().find(|c| c.0 == attnum && c.1 == Encoding::DictCode)?;
                    return Some(Key::Fact(Col::new(attnum, Encoding::DictCode)));
                }
                let (col, _) = column(e, varno, cached)?;
                return keyable(col.encoding).then_some(Key::Fact(col));
            }
            let dim = dims.iter().position(|d| d.varno == (*v).varno as u32)?;
            if (*v).varattno <= 0 || !groupable((*v).vartype, (*v).varcollid) {
                return None;
            }
            let d = &mut dims[dim];
            let idx = match d.groups.iter().position(|g| g.attnum == (*v).varattno) {
                Some(i) => i,
                None => {
                    let c = DimCol {
                        attnum: (*v).varattno,
                        pos: 0,
                        typid: (*v).vartype,
                        typmod: (*v).vartypmod,
                        collation: (*v).varcollid,
                    };
                    d.groups.push(c);
                    d.groups.len() - 1
                }
            };
            Some(Key::Dim { dim, idx })
        }
    }
}

/// Whether the planner may read a fact table's heap (`pg_uvm_share.gpugroupagg_heap`, off by
/// default: the module essay's "Measured over the heap").
fn heap_enabled() -> bool {
    match crate::guc::GPUGROUPAGG_HEAP.get() {
        crate::guc::GpuJoinChoice::On => true,
        crate::guc::GpuJoinChoice::Off => false,
        // Where a GPU runs the program (the cluster's provider is CUDA): on the host provider
        // the CPU's loop over the batches does what PostgreSQL's aggregation does, and more.
        crate::guc::GpuJoinChoice::Auto => crate::runtime::gpu_does_the_work(),
    }
}

/// The columns of table `relid` (its base relation `rel`) that a heap batch lays out, with
/// their encodings: fixed-width types whose datum is the cache's word (no `numeric`, whose
/// words are scaled, and no text, which would need a dictionary per batch).
///
/// # Safety
/// The planner's structures; the table is locked by the planner.
unsafe fn heap_columns(rel: *mut pg_sys::RelOptInfo, relid: pg_sys::Oid) -> Vec<(i16, Encoding)> {
    // SAFETY: forwarded contract; catalog lookups of an open table's columns.
    unsafe {
        let mut out = Vec::new();
        for attnum in 1..=(*rel).max_attr {
            let (mut typid, mut typmod, mut coll) = (pg_sys::InvalidOid, 0, pg_sys::InvalidOid);
            pg_sys::get_atttypetypmodcoll(relid, attnum, &mut typid, &mut typmod, &mut coll);
            let e = match typid {
                pg_sys::FLOAT4OID => Encoding::Float4,
                pg_sys::FLOAT8OID => Encoding::Float8,
                pg_sys::NUMERICOID => continue,
                t => match encoding_of_type(t) {
                    Some(e) => e,
                    None => continue,
                },
            };
            out.push((attnum, e));
        }
        out
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
pub(in crate::node) unsafe fn add_path(
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
        // The strategy as PostgreSQL picks it: a query with GROUP BY is grouped even where every
        // key is fixed to a constant by WHERE (`WHERE t = 'x' GROUP BY t`: PostgreSQL 16 leaves
        // such keys out of `processed_groupClause`), sorted then, with no key to sort by. A
        // plain aggregate there would return a row for no input, its key read from no tuple.
        let strategy = if (*(*root).parse).groupClause.is_null() {
            pg_sys::AggStrategy::AGG_PLAIN
        } else if group_clause.is_null() {
            pg_sys::AggStrategy::AGG_SORTED
        } else {
            pg_sys::AggStrategy::AGG_HASHED
        };
        let agg_over = |subpath: *mut pg_sys::Path| {
            pg_sys::create_agg_path(
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
            ) as *mut pg_sys::Path
        };
        let child = agg_over(subpath);
        // The fact's rows through the program, and each dimension's own plan.
        let fact = *(*root).simple_rel_array.add(shape.varno as usize);
        let mut c = cost((*fact).tuples, shape.columns().len() + shape.dims.len(), estimate);
        let mut children = vec![child];
        // Over the heap: the fact's serial scan, its rows laid out in batches (the last child),
        // in place of the program's own per-row cost: the program runs over one batch (on the
        // GPU) while the backend lays out the next.
        let deform = (*fact).tuples * DEFORM_FACTOR * pg_sys::cpu_operator_cost * shape.columns().len() as f64;
        let heap_scan = if shape.heap {
            let Some(scan) = heap_scan_path(root, fact, &shape, 0) else { return };
            c = cost(0.0, 0, estimate) + (*scan).total_cost + deform;
            Some(scan)
        } else {
            None
        };
        // Each dimension's plan: its cheapest, and for the plan in parallel its cheapest
        // parallel-safe one (its cheapest may be a Gather of its own, which no worker can run;
        // `None` where it has none, or one whose rows are laid out otherwise).
        let mut dims_cost = 0.0;
        let mut parallel_dims: Option<(Vec<*mut pg_sys::Path>, f64)> = Some((Vec::new(), 0.0));
        for d in &mut shape.dims {
            let rel = *(*root).simple_rel_array.add(d.varno as usize);
            let dp = (*rel).cheapest_total_path;
            if dp.is_null() || !(*dp).param_info.is_null() {
                return;
            }
            let Some(places) = dim_places(dp, d) else { return };
            d.key_pos = places[0];
            for (g, &p) in d.groups.iter_mut().zip(&places[1..]) {
                g.pos = p;
            }
            // (a dimension read from its cache: its own program's cost; its plan stays, for an
            // execution where the cache is not current)
            let dim_cost = |p: *mut pg_sys::Path| {
                let own = match &d.cached {
                    Some(dc) => cost((*rel).tuples, dc.columns().len(), (*p).rows),
                    None => (*p).total_cost,
                };
                own + (*p).rows * pg_sys::cpu_tuple_cost
            };
            dims_cost += dim_cost(dp);
            children.push(dp);
            // (the pathlist is in order of total cost)
            let safe = PgList::<pg_sys::Path>::from_pg((*rel).pathlist)
                .iter_ptr()
                .find(|&p| (*p).parallel_safe && (*p).param_info.is_null())
                .filter(|&p| dim_places(p, d).as_deref() == Some(&places[..]));
            parallel_dims = parallel_dims.zip(safe).map(|((mut paths, c), p)| {
                paths.push(p);
                (paths, c + dim_cost(p))
            });
        }
        // In parallel, under a Gather: the fallback over the input's cheapest parallel-safe
        // path (its cheapest may be a Gather of its own), the dimensions' likewise.
        let safe = PgList::<pg_sys::Path>::from_pg((*input_rel).pathlist).iter_ptr().find(|&p| (*p).parallel_safe);
        if let (Some(safe), Some((dim_paths, dims_cost)), true) = (safe, parallel_dims, shape.heap) {
            // (before the serial path is added: add_path may free the paths it dominates)
            let base = cost(0.0, 0, estimate) + dims_cost;
            let mut parallel_children = vec![agg_over(safe)];
            parallel_children.extend(dim_paths);
            add_gather_path(root, output_rel, &shape, &parallel_children, estimate, base, deform);
        }
        children.extend(heap_scan);
        let cp = customscan::upper_path(output_rel, &children, estimate, c + dims_cost, 0, &METHODS.path);
        (*cp).custom_private = shape.to_private();
        pg_sys::add_path(output_rel, cp as *mut pg_sys::Path);
    }
}

/// Where a dimension's key and its grouping columns lie in the rows of its path `p` (its plan's
/// target list is its path's target, in order): the key's place, then each grouping column's.
///
/// # Safety
/// `p` is a path of `d`'s relation.
unsafe fn dim_places(p: *mut pg_sys::Path, d: &Dim) -> Option<Vec<usize>> {
    // SAFETY: forwarded contract.
    unsafe {
        let exprs = PgList::<pg_sys::Node>::from_pg((*(*p).pathtarget).exprs);
        let place = |att: i16| {
            exprs
                .iter_ptr()
                .position(|e| gpujoin::as_var(e).is_some_and(|v| (*v).varno as u32 == d.varno && (*v).varattno == att))
        };
        std::iter::once(d.key.0).chain(d.groups.iter().map(|g| g.attnum)).map(place).collect()
    }
}

/// PostgreSQL's share of a partial path's rows for each participant with `workers` workers
/// (`costsize.c`'s `get_parallel_divisor`: the leader takes a share where it participates, less
/// as there are more workers).
fn parallel_divisor(workers: i32) -> f64 {
    let mut d = f64::from(workers);
    // SAFETY: reads a GUC of this process.
    if unsafe { pg_sys::parallel_leader_participation } {
        let leader = 1.0 - 0.3 * f64::from(workers);
        if leader > 0.0 {
            d += leader;
        }
    }
    d.max(1.0)
}

/// Adds the node over the heap in parallel, under a Gather, where the fact has a partial scan
/// and every child is parallel-safe: every participant reads its share of the fact and lays it
/// out (one of them, the runner, runs the program over every batch: `super::parallel`); priced
/// at `base` (the program's setup and the dimensions), the partial scan, and `deform` shared by
/// the participants. `children`: the fallback and the dimensions' paths.
///
/// # Safety
/// The hook's arguments; `shape` this level's.
unsafe fn add_gather_path(
    root: *mut pg_sys::PlannerInfo,
    output_rel: *mut pg_sys::RelOptInfo,
    shape: &Shape,
    children: &[*mut pg_sys::Path],
    estimate: f64,
    base: f64,
    deform: f64,
) {
    // SAFETY: forwarded contract; paths made in the planner's memory context.
    unsafe {
        let fact = *(*root).simple_rel_array.add(shape.varno as usize);
        let Some(partial) = PgList::<pg_sys::Path>::from_pg((*fact).partial_pathlist).get_ptr(0) else { return };
        let workers = (*partial).parallel_workers;
        if workers <= 0 || !(*output_rel).consider_parallel || children.iter().any(|&p| !(*p).parallel_safe) {
            return;
        }
        let Some(scan) = heap_scan_path(root, fact, shape, workers) else { return };
        let c = base + (*scan).total_cost + deform / parallel_divisor(workers);
        let mut all = children.to_vec();
        all.push(scan);
        let cp = customscan::upper_path(output_rel, &all, estimate, c, 0, &METHODS.path);
        (*cp).path.parallel_aware = true;
        (*cp).path.parallel_safe = true;
        (*cp).path.parallel_workers = workers;
        (*cp).custom_private = shape.to_private();
        let mut rows = estimate;
        let gather = pg_sys::create_gather_path(
            root,
            output_rel,
            cp as *mut pg_sys::Path,
            (*output_rel).reltarget,
            std::ptr::null_mut(),
            &mut rows,
        );
        pg_sys::add_path(output_rel, gather as *mut pg_sys::Path);
    }
}

/// A scan of the fact `fact` whose rows are the program's columns in [`Shape::columns`]' order
/// (its plan's conditions are taken off in [`super::run`]'s `plan`: the program tests them):
/// serial, or with `workers` a partial scan. `None` where the table's columns cannot be looked
/// up.
///
/// # Safety
/// The planner's structures; `fact` is the shape's fact relation.
unsafe fn heap_scan_path(
    root: *mut pg_sys::PlannerInfo,
    fact: *mut pg_sys::RelOptInfo,
    shape: &Shape,
    workers: i32,
) -> Option<*mut pg_sys::Path> {
    // SAFETY: forwarded contract; nodes made in the planner's memory context.
    unsafe {
        if shape.columns().is_empty() {
            return None; // (count(*) of a table alone: nothing for a program to read)
        }
        let path = pg_sys::create_seqscan_path(root, fact, std::ptr::null_mut(), workers);
        let target = pg_sys::create_empty_pathtarget();
        for c in shape.columns() {
            let (mut typid, mut typmod, mut coll) = (pg_sys::InvalidOid, 0, pg_sys::InvalidOid);
            pg_sys::get_atttypetypmodcoll(shape.relid, c.attnum, &mut typid, &mut typmod, &mut coll);
            if typid == pg_sys::InvalidOid {
                return None;
            }
            let v = pg_sys::makeVar(shape.varno as _, c.attnum, typid, typmod, coll, 0);
            pg_sys::add_column_to_pathtarget(target, v as *mut pg_sys::Expr, 0);
        }
        (*target).cost = (*(*path).pathtarget).cost;
        (*target).width = (*(*path).pathtarget).width;
        (*path).pathtarget = target;
        // Every row (a participant's share of them), and no condition's cost: the conditions
        // are the program's.
        let share = if workers > 0 { parallel_divisor(workers) } else { 1.0 };
        let quals = (*fact).baserestrictcost.startup + (*fact).tuples * (*fact).baserestrictcost.per_tuple / share;
        (*path).startup_cost -= (*fact).baserestrictcost.startup;
        (*path).total_cost = ((*path).total_cost - quals).max((*path).startup_cost);
        (*path).rows = ((*fact).tuples / share).max(1.0);
        Some(path)
    }
}

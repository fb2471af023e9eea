//! GpuGroupAgg's `EXPLAIN`: what the node reads (a cache or the heap), its columns, dimensions,
//! keys and filters, and with `ANALYZE` where an execution read from and its figures; each
//! clause's alternatives, the ranges' bounds in their columns' types (by the types' output
//! functions, a bound no output function prints shown by its neighbour), a text condition as
//! PostgreSQL deparses it.

use super::*;

impl GpuGroupAggScan {
    /// The node's `EXPLAIN` properties: what it reads (a cache or the heap), its columns,
    /// dimensions, keys and filters, and with `ANALYZE` where it read from and its figures.
    ///
    /// # Safety
    /// `es` is ExplainCustomScan's state.
    pub(super) unsafe fn explain_node(&self, es: *mut pg_sys::ExplainState) {
        // SAFETY: ExplainCustomScan's state; the strings are copied by EXPLAIN.
        unsafe {
            let prop = |label: &CStr, value: &str| {
                let v = std::ffi::CString::new(value.replace('\0', "")).expect("no NUL");
                pg_sys::ExplainPropertyText(label.as_ptr(), v.as_ptr(), es);
            };
            let heap = self.shape.heap;
            prop(if heap { c"Fact Heap" } else { c"Column Cache" }, &self.relname);
            let cols: Vec<String> = self.shape.columns().iter().map(|c| self.name_of(c)).collect();
            if !cols.is_empty() {
                prop(if heap { c"Batch Columns" } else { c"Cached Columns" }, &cols.join(", "));
            }
            if !self.shape.dims.is_empty() {
                let dims: Vec<String> = self
                    .shape
                    .dims
                    .iter()
                    .zip(&self.dim_names)
                    .map(|(d, (rel, key, _))| format!("{rel} ON {} = {rel}.{key}", self.name_of(&d.fact_col)))
                    .collect();
                prop(c"Dimensions", &dims.join(", "));
                let cached: Vec<&str> = self
                    .shape
                    .dims
                    .iter()
                    .zip(&self.dim_names)
                    .filter(|(d, _)| d.cached.is_some())
                    .map(|(_, (rel, _, _))| rel.as_str())
                    .collect();
                if !cached.is_empty() {
                    prop(c"Cached Dimensions", &cached.join(", "));
                }
            }
            if !self.shape.keys.is_empty() {
                let keys: Vec<String> = self
                    .shape
                    .keys
                    .iter()
                    .map(|k| match *k {
                        Key::Fact(c) => self.name_of(&c),
                        Key::Dim { dim, idx } => self.dim_names[dim].2[idx].clone(),
                    })
                    .collect();
                prop(c"Group Keys", &keys.join(", "));
            }
            if !self.shape.filters.is_empty() {
                let f: Vec<String> = self.shape.filters.iter().map(|c| self.describe_clause(c)).collect();
                prop(if heap { c"Program Filters" } else { c"Cache Filters" }, &f.join(" AND "));
            }
            if (*es).analyze {
                match self.read_from {
                    Some(from @ (ReadFrom::Cache | ReadFrom::Heap)) => {
                        prop(c"Read From", if from == ReadFrom::Heap { "heap" } else { "cache" });
                        if !self.stats.dims_from.is_empty() {
                            let from: Vec<String> = self
                                .stats
                                .dims_from
                                .iter()
                                .zip(&self.dim_names)
                                .map(|(f, (rel, _, _))| match f {
                                    DimFrom::Cache => format!("{rel}: cache"),
                                    DimFrom::Plan(None) => format!("{rel}: plan"),
                                    DimFrom::Plan(Some(why)) => format!("{rel}: plan ({why})"),
                                })
                                .collect();
                            prop(c"Dimensions Read From", &from.join(", "));
                        }
                        if self.stats.join_order.len() > 1 {
                            let order: Vec<&str> = self
                                .stats
                                .join_order
                                .iter()
                                .filter_map(|&j| self.dim_names.get(j).map(|d| d.0.as_str()))
                                .collect();
                            prop(c"Join Order", &order.join(", "));
                        }
                        let int =
                            |label: &CStr, v: u64| pg_sys::ExplainPropertyInteger(label.as_ptr(), std::ptr::null(), v as i64, es);
                        if from == ReadFrom::Heap {
                            int(c"Heap Rows", self.stats.heap_rows);
                            int(c"Batches", self.stats.batches);
                            if self.parallel {
                                int(c"Batches From Workers", self.stats.handed);
                            }
                        }
                        int(c"Groups", self.stats.groups);
                        if self.stats.appended > 0 {
                            int(c"Appended Rows", self.stats.appended);
                        }
                        if self.stats.grown > 0 {
                            int(c"Group Table Grown", u64::from(self.stats.grown));
                        }
                        if (*es).timing {
                            let ms = |label: &CStr, d: std::time::Duration| {
                                pg_sys::ExplainPropertyFloat(label.as_ptr(), c"ms".as_ptr(), d.as_secs_f64() * 1e3, 3, es)
                            };
                            ms(c"Dimensions Time", self.stats.dims);
                            if from == ReadFrom::Heap {
                                ms(c"Batching Time", self.stats.batching);
                            }
                            ms(c"Setup Time", self.stats.setup);
                            ms(c"Scan Time", self.stats.scan);
                            ms(c"Scanning Time", self.stats.scanning);
                            ms(c"Read Time", self.stats.read);
                        }
                    }
                    Some(ReadFrom::Child(why)) => prop(c"Read From", &format!("child: {why}")),
                    None => {}
                }
            }
        }
    }

    /// A clause as EXPLAIN shows it: its alternatives, the ranges' bounds in the column's type,
    /// a text condition as PostgreSQL prints it.
    pub(super) fn describe_clause(&self, clause: &[Atom]) -> String {
        let alts: Vec<String> = clause
            .iter()
            .map(|a| {
                let name = self.name_of(&a.col);
                match a.check {
                    Check::Range { lo: 1, hi: 1 } if a.col.encoding == Encoding::Bool => name,
                    Check::Range { lo: 0, hi: 0 } if a.col.encoding == Encoding::Bool => format!("NOT {name}"),
                    Check::Range { lo, hi } => describe_range(&name, a.col, lo, hi),
                    Check::Null => format!("{name} IS NULL"),
                    Check::Compare(n) => {
                        let c = &self.shape.compares[n];
                        let side = |steps: &[Step]| {
                            let mut stack: Vec<String> = Vec::new();
                            for s in steps {
                                let v = match *s {
                                    Step::Col(i) => self.name_of(&c.cols[i]),
                                    Step::Const(k) => k.to_string(),
                                    Step::Neg(_) => format!("-{}", stack.pop().unwrap_or_default()),
                                    Step::Bin(op, _) => {
                                        let (b, a) = (stack.pop().unwrap_or_default(), stack.pop().unwrap_or_default());
                                        let sym = ["+", "-", "*", "/", "%"][op as usize];
                                        format!("({a} {sym} {b})")
                                    }
                                };
                                stack.push(v);
                            }
                            stack.pop().unwrap_or_default()
                        };
                        format!("{} {} {}", side(&c.expr.lhs), c.expr.cmp.symbol(), side(&c.expr.rhs))
                    }
                    // SAFETY: a text condition of the plan; the fact table exists (the query
                    // holds its lock); the deparsed string is palloc'd.
                    Check::Text(n) => unsafe {
                        let rel = std::ffi::CString::new(self.relname.replace('\0', "")).expect("no NUL");
                        let cxt = pg_sys::deparse_context_for(rel.as_ptr(), self.shape.relid);
                        let p = pg_sys::deparse_expression(self.shape.texts[n], cxt, false, false);
                        CStr::from_ptr(p).to_string_lossy().into_owned()
                    },
                }
            })
            .collect();
        if alts.len() == 1 {
            alts.into_iter().next().unwrap_or_default()
        } else {
            format!("({})", alts.join(" OR "))
        }
    }

    pub(super) fn name_of(&self, c: &Col) -> String {
        self.names.iter().find(|n| n.0 == c.attnum).map_or_else(|| format!("#{}", c.attnum), |n| n.1.clone())
    }
}

/// A range as EXPLAIN shows it, its bounds in the column's type (a float column's run of
/// words as the values it holds: `crate::scan::floats`).
fn describe_range(name: &str, col: Col, lo: i64, hi: i64) -> String {
    let v = |x: i64| text_of(x as u64, col);
    if matches!(col.encoding, Encoding::Float4 | Encoding::Float8) && (lo, hi) != (i64::MIN, i64::MAX) {
        let value = |w: i64| match col.encoding {
            Encoding::Float8 => f64::from_bits(w as u64),
            _ => f64::from(f32::from_bits(w as u32)),
        };
        let (a, b) = (value(lo), value(hi));
        if a.is_nan() || b.is_nan() {
            return format!("{name} = 'NaN'");
        }
        let (a, b) = if a <= b { (lo, hi) } else { (hi, lo) };
        return if a == b { format!("{name} = {}", v(a)) } else { format!("{name} BETWEEN {} AND {}", v(a), v(b)) };
    }
    // A bound past its type's finite values (`d > '-infinity'` is `d >= -infinity + 1`, which
    // no date is) is shown by its neighbour, strictly: the output function would raise an ERROR
    // for it (timestamps) or print nonsense (dates).
    let shown = |w: i64| printable(w, col.encoding);
    let lower = |lo: i64| match (shown(lo), lo.checked_sub(1)) {
        (false, Some(p)) if shown(p) => format!("> {}", v(p)),
        (false, _) => format!(">= {lo}"),
        (true, _) => format!(">= {}", v(lo)),
    };
    let upper = |hi: i64| match (shown(hi), hi.checked_add(1)) {
        (false, Some(n)) if shown(n) => format!("< {}", v(n)),
        (false, _) => format!("<= {hi}"),
        (true, _) => format!("<= {}", v(hi)),
    };
    match (lo, hi) {
        (i64::MIN, i64::MAX) => format!("{name} IS NOT NULL"),
        (lo, hi) if lo == hi && shown(lo) => format!("{name} = {}", v(lo)),
        (lo, hi) if lo == hi => format!("{name} = {lo}"),
        (i64::MIN, hi) => format!("{name} {}", upper(hi)),
        (lo, i64::MAX) => format!("{name} {}", lower(lo)),
        (lo, hi) if shown(lo) && shown(hi) => format!("{name} BETWEEN {} AND {}", v(lo), v(hi)),
        (lo, hi) => format!("{name} {} AND {name} {}", lower(lo), upper(hi)),
    }
}

/// Whether a word of `encoding` is a value its type's output function prints: a finite date
/// or timestamp within PostgreSQL's range, or an infinity (any word of the other encodings).
fn printable(w: i64, encoding: Encoding) -> bool {
    // PostgreSQL's datatype/timestamp.h: dates from Julian day 0 up to DATE_END_JULIAN, and
    // timestamps from MIN_TIMESTAMP up to END_TIMESTAMP, counted from 2000-01-01
    const POSTGRES_EPOCH_JDATE: i64 = 2_451_545;
    const DATE_END_JULIAN: i64 = 2_147_483_494;
    const MIN_TIMESTAMP: i64 = -211_813_488_000_000_000;
    const END_TIMESTAMP: i64 = 9_223_371_331_200_000_000;
    match encoding {
        Encoding::Date => {
            w == i64::from(i32::MIN)
                || w == i64::from(i32::MAX)
                || (-POSTGRES_EPOCH_JDATE..DATE_END_JULIAN - POSTGRES_EPOCH_JDATE).contains(&w)
        }
        Encoding::Timestamp | Encoding::TimestampTz => {
            w == i64::MIN || w == i64::MAX || (MIN_TIMESTAMP..END_TIMESTAMP).contains(&w)
        }
        _ => true,
    }
}

/// A word of `encoding` as its type's text (its output function).
fn text_of(w: u64, col: Col) -> String {
    let (typ, _) = type_of(col.encoding);
    // SAFETY: a catalog lookup and a call of a built-in type's output function on a by-value
    // datum of that type; the result is a palloc'd C string.
    unsafe {
        let (mut func, mut varlena) = (pg_sys::InvalidOid, false);
        pg_sys::getTypeOutputInfo(typ, &mut func, &mut varlena);
        let p = pg_sys::OidOutputFunctionCall(func, datum_of_word(w, col));
        CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

//! Decoding a table's tuples into cache words: the parallel build's scan and the append
//! trigger's transition table both hand slots of the table's row type.
//!
//! By-value types are their datum's low bytes (`Encoding::word_of_raw`). A `numeric(p, s)` is
//! scaled as the serial build's SQL scales it: PostgreSQL's own `numeric_mul` by 10^s and
//! `numeric_int8`, so it is exact and a value no word holds is PostgreSQL's ERROR; products are
//! made in a memory context reset every [`RESET_ROWS`] rows.

use super::*;

/// Rows between resets of the numeric products' memory context (and interrupt checks).
const RESET_ROWS: u64 = 4096;

pub(super) struct Decoder {
    encodings: Vec<Encoding>,
    /// Each column's attribute number, 1-based.
    attnums: Vec<usize>,
    natts: i32,
    /// 10^scale of each numeric column, as a numeric datum (for numeric_mul).
    pow10: Vec<pg_sys::Datum>,
    /// Where numeric products are made (none without a numeric column: an insert of one row
    /// should not create a memory context).
    scratch: Option<pgrx::PgMemoryContexts>,
    rows: u64,
}

/// What [`Decoder::decode`] made of a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Decoded {
    Row,
    /// A numeric NaN or infinity, which no scaled integer holds (only where the caller asked
    /// not to raise PostgreSQL's ERROR for it).
    Unrepresentable,
}

impl Decoder {
    /// A decoder of `columns` (their attribute numbers are the table's, all positive). The
    /// numeric powers live in the caller's current memory context.
    pub(super) fn new(columns: &[ColumnSpec]) -> Decoder {
        let pow10 = columns
            .iter()
            .map(|c| match c.encoding {
                // SAFETY: int64_to_numeric pallocs the numeric of a value that fits (scale <= 18).
                Encoding::Numeric => unsafe {
                    pg_sys::Datum::from(pg_sys::int64_to_numeric(10i64.pow(c.scale.clamp(0, 18) as u32)))
                },
                _ => pg_sys::Datum::from(0),
            })
            .collect();
        let attnums: Vec<usize> = columns.iter().map(|c| c.attnum.max(1) as usize).collect();
        Decoder {
            encodings: columns.iter().map(|c| c.encoding).collect(),
            natts: attnums.iter().copied().max().unwrap_or(1) as i32,
            attnums,
            pow10,
            scratch: columns
                .iter()
                .any(|c| c.encoding == Encoding::Numeric)
                .then(|| pgrx::PgMemoryContexts::new("pg_uvm_share cache numerics")),
            rows: 0,
        }
    }

    /// Decodes the tuple in `slot` into `row` (one word or NULL per column). With `strict`, a
    /// numeric NaN or infinity is PostgreSQL's ERROR (as in a build); without, it is
    /// [`Decoded::Unrepresentable`]. Every [`RESET_ROWS`] rows it frees the products and checks
    /// for interrupts.
    ///
    /// # Safety
    /// `slot` holds a tuple of the table whose columns these are (a by-value type's datum is
    /// its bits; a numeric's a varlena). A dictionary column's word is its datum's bits, which
    /// mean nothing: the caller puts its code there (the appender) or has none (the parallel
    /// build takes no text column).
    pub(super) unsafe fn decode(&mut self, slot: *mut pg_sys::TupleTableSlot, row: &mut [Option<u64>], strict: bool) -> Decoded {
        let mut out = Decoded::Row;
        // SAFETY: forwarded contract; after slot_getsomeattrs the first `natts` values and NULL
        // flags are valid, and every attnum is 1..=natts.
        unsafe {
            pg_sys::slot_getsomeattrs(slot, self.natts);
            let (values, nulls) = ((*slot).tts_values, (*slot).tts_isnull);
            for (c, w) in row.iter_mut().enumerate() {
                let a = self.attnums[c] - 1;
                let v = *values.add(a);
                *w = if *nulls.add(a) {
                    None
                } else if self.encodings[c] == Encoding::Numeric {
                    let pow = self.pow10[c];
                    let scratch = self.scratch.as_mut().expect("made for a numeric column");
                    let scaled = scratch.switch_to(|_| {
                        if !strict {
                            let n = pg_sys::pg_detoast_datum(v.cast_mut_ptr()) as pg_sys::Numeric;
                            if pg_sys::numeric_is_nan(n) || pg_sys::numeric_is_inf(n) {
                                return None;
                            }
                        }
                        let product = pgrx::direct_function_call_as_datum(pg_sys::numeric_mul, &[Some(v), Some(pow)]);
                        pgrx::direct_function_call::<i64>(pg_sys::numeric_int8, &[product])
                    });
                    if scaled.is_none() {
                        out = Decoded::Unrepresentable;
                    }
                    scaled.map(|i| self.encodings[c].word_of_raw(i as u64))
                } else {
                    Some(self.encodings[c].word_of_raw(v.value() as u64))
                };
            }
        }
        self.rows += 1;
        if self.rows.is_multiple_of(RESET_ROWS) {
            if let Some(s) = self.scratch.as_mut() {
                // SAFETY: nothing made in `scratch` outlives its row (products are copied out as
                // integers at once).
                unsafe { s.reset() };
            }
            pg_sys::check_for_interrupts!();
        }
        out
    }
}

//! Batch matching for the GpuJoin plan node, in plain Rust.
//!
//! The node probes a batch of outer tuples at a time. The result buffer that
//! `exec::materialize` fills holds (outer key, inner row id) pairs but not which outer tuple a
//! pair came from, so the node probes each *distinct* key of the batch once and joins every
//! pair of key `k` with every outer tuple of the batch whose key is `k`: duplicates on both
//! sides give the cross product per key, as a hash join does; outer tuples with a NULL key are
//! never probed and never match.
//!
//! [`Batch`] gathers the keys (bounded by the batch size the node picks), [`Batch::distinct`]
//! gives the keys to probe, and [`Emitter`] walks (pair, outer position) combinations one at a
//! time, so a skewed key yields its cross product without materializing it.

use std::collections::HashMap;

/// The keys of one outer batch: positions of the tuples (in the batch) per distinct key.
#[derive(Default, Debug)]
pub struct Batch {
    /// Distinct keys in first-seen order (the keys probed).
    keys: Vec<i64>,
    /// Key -> positions of the outer tuples with that key, in batch order.
    positions: HashMap<i64, Vec<u32>>,
    /// Tuples in the batch, NULL keys included.
    tuples: u32,
}

impl Batch {
    pub fn clear(&mut self) {
        self.keys.clear();
        self.positions.clear();
        self.tuples = 0;
    }

    /// Adds the next outer tuple of the batch (its key, `None` for NULL); returns its position.
    pub fn push(&mut self, key: Option<i64>) -> u32 {
        let pos = self.tuples;
        self.tuples += 1;
        if let Some(k) = key {
            let v = self.positions.entry(k).or_default();
            if v.is_empty() {
                self.keys.push(k);
            }
            v.push(pos);
        }
        pos
    }

    /// Tuples in the batch, NULL keys included.
    pub fn len(&self) -> usize {
        self.tuples as usize
    }

    pub fn is_empty(&self) -> bool {
        self.tuples == 0
    }

    /// The distinct non-NULL keys, each once: what the batch probes.
    pub fn distinct(&self) -> &[i64] {
        &self.keys
    }

    /// Positions of the outer tuples whose key is `key` (empty for a key not in the batch,
    /// which a pair from an overwritten result buffer could carry).
    pub fn positions(&self, key: i64) -> &[u32] {
        self.positions.get(&key).map(Vec::as_slice).unwrap_or(&[])
    }
}

/// Walks the joined (outer position, inner row id) combinations of a batch's pairs.
#[derive(Default, Debug)]
pub struct Emitter {
    pairs: Vec<[i64; 2]>,
    pair: usize,
    pos: usize,
}

impl Emitter {
    /// Starts over with `pairs` (key, inner row id), as read from the result buffer.
    pub fn reset(&mut self, pairs: Vec<[i64; 2]>) {
        self.pairs = pairs;
        self.pair = 0;
        self.pos = 0;
    }

    /// The pairs' buffer, emptied, to read the next batch's pairs into (no reallocation).
    pub fn take_buffer(&mut self) -> Vec<[i64; 2]> {
        let mut v = std::mem::take(&mut self.pairs);
        v.clear();
        self.pair = 0;
        self.pos = 0;
        v
    }

    /// The next (outer position, inner row id), or `None` when the batch is done.
    pub fn next(&mut self, batch: &Batch) -> Option<(u32, i64)> {
        while self.pair < self.pairs.len() {
            let [key, row] = self.pairs[self.pair];
            let ps = batch.positions(key);
            if self.pos < ps.len() {
                let p = ps[self.pos];
                self.pos += 1;
                return Some((p, row));
            }
            self.pair += 1;
            self.pos = 0;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The join by nested loops, as the reference.
    fn reference(outer: &[Option<i64>], inner: &[Option<i64>]) -> Vec<(u32, i64)> {
        let mut out = Vec::new();
        for (i, o) in outer.iter().enumerate() {
            for (j, n) in inner.iter().enumerate() {
                if o.is_some() && o == n {
                    out.push((i as u32, j as i64));
                }
            }
        }
        out.sort();
        out
    }

    /// The node's way: distinct keys probed against the inner side, pairs expanded.
    fn by_batch(outer: &[Option<i64>], inner: &[Option<i64>]) -> Vec<(u32, i64)> {
        let mut b = Batch::default();
        for k in outer {
            b.push(*k);
        }
        let mut pairs = Vec::new();
        for &k in b.distinct() {
            for (j, n) in inner.iter().enumerate() {
                if *n == Some(k) {
                    pairs.push([k, j as i64]);
                }
            }
        }
        let mut e = Emitter::default();
        e.reset(pairs);
        let mut out = Vec::new();
        while let Some(x) = e.next(&b) {
            out.push(x);
        }
        out.sort();
        out
    }

    #[test]
    fn duplicates_give_the_cross_product_and_nulls_never_match() {
        let outer = [Some(1), None, Some(2), Some(1), Some(3), None, Some(1)];
        let inner = [Some(1), Some(1), None, Some(2), Some(4)];
        let got = by_batch(&outer, &inner);
        assert_eq!(got, reference(&outer, &inner));
        assert_eq!(got.len(), 3 * 2 + 1);
    }

    #[test]
    fn distinct_keys_are_probed_once_in_first_seen_order() {
        let mut b = Batch::default();
        for k in [Some(5), Some(3), Some(5), None, Some(3), Some(7)] {
            b.push(k);
        }
        assert_eq!(b.distinct(), &[5, 3, 7]);
        assert_eq!(b.positions(5), &[0, 2]);
        assert_eq!(b.positions(9), &[] as &[u32]);
        assert_eq!(b.len(), 6);
        b.clear();
        assert!(b.is_empty() && b.distinct().is_empty());
    }

    #[test]
    fn a_pair_whose_key_is_not_in_the_batch_yields_nothing() {
        let mut b = Batch::default();
        b.push(Some(1));
        let mut e = Emitter::default();
        e.reset(vec![[42, 0], [1, 7], [43, 1]]);
        assert_eq!(e.next(&b), Some((0, 7)));
        assert_eq!(e.next(&b), None);
        assert!(e.take_buffer().is_empty());
    }

    #[test]
    fn matches_the_reference_on_pseudo_random_data() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for round in 0..50 {
            let range = 1 + round % 17;
            let outer: Vec<Option<i64>> =
                (0..(next() % 60)).map(|_| if next() % 7 == 0 { None } else { Some((next() % range) as i64 - 3) }).collect();
            let inner: Vec<Option<i64>> =
                (0..(next() % 40)).map(|_| if next() % 5 == 0 { None } else { Some((next() % range) as i64 - 3) }).collect();
            assert_eq!(by_batch(&outer, &inner), reference(&outer, &inner), "round {round}");
        }
    }
}

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
//!
//! # Layout (this runs once per outer row: tens of nanoseconds in all is the budget)
//!
//! - An open-addressing table of our own: a power-of-two number of [`Slot`]s, each the key, the
//!   key's index in `distinct` and a *generation*; the splitmix64 finalizer spreads the key and
//!   linear probing resolves collisions. A slot belongs to the current batch only when its
//!   generation is the batch's, so [`Batch::clear`] empties the table by bumping one counter
//!   (every 2^32 - 1 batches it wipes the slots once, when the counter wraps). The table doubles
//!   whenever a new key would take it past half full, so a probe meets an empty slot within a few
//!   steps; its capacity follows the distinct keys, not the tuples (a batch of one key keeps a
//!   small table), and stays at the largest size seen.
//! - The positions of a key form a chain in batch order: `head[i]` and `tail[i]` are the first
//!   and last positions of distinct key `i`, `next[p]` the position after `p` with the same key
//!   ([`NONE`] at the end, and for a NULL key). A chain's positions strictly increase, so every
//!   walk ends within the batch's length.
//! - Every buffer is cleared, never freed, between batches: in steady state a batch allocates
//!   nothing, whatever its keys.
//! - [`Emitter`] looks each pair's key up once and then follows the chain with a cursor, so a
//!   yielded row costs O(1) whatever the duplicates. The pairs come from a segment another
//!   process could overwrite: a key not in the batch finds no slot and yields nothing, and no
//!   loop depends on their contents for its bound.

/// End of a chain; also the `next` of a NULL key's position. Never a position (a batch holds at
/// most `NONE` tuples, positions `0..NONE`).
const NONE: u32 = u32::MAX;

/// The smallest table, in slots.
const MIN_SLOTS: usize = 16;

/// One slot of the key table: `key`'s index in `distinct`, when `generation` is the batch's.
#[derive(Clone, Copy, Default, Debug)]
struct Slot {
    key: i64,
    generation: u32,
    index: u32,
}

/// The splitmix64 finalizer: every key bit reaches every hash bit, so consecutive or strided
/// keys (the usual ids) spread over the table's low bits.
#[inline]
fn mix(key: i64) -> u64 {
    let mut z = key as u64;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The keys of one outer batch: positions of the tuples (in the batch) per distinct key.
#[derive(Debug)]
pub struct Batch {
    /// Distinct keys in first-seen order (the keys probed).
    keys: Vec<i64>,
    /// Per distinct key (same index as `keys`): its first and last position.
    head: Vec<u32>,
    tail: Vec<u32>,
    /// Per position: the next position with the same key, or [`NONE`]. Its length is the
    /// number of tuples in the batch, NULL keys included.
    next: Vec<u32>,
    /// The key table; its length is a power of two, at least twice `keys.len()`.
    slots: Vec<Slot>,
    /// The generation of the current batch's slots; never 0 (the generation of a slot never
    /// written).
    generation: u32,
}

impl Default for Batch {
    fn default() -> Self {
        Batch { keys: Vec::new(), head: Vec::new(), tail: Vec::new(), next: Vec::new(), slots: Vec::new(), generation: 1 }
    }
}

impl Batch {
    /// Empties the batch, keeping every buffer's capacity.
    pub fn clear(&mut self) {
        self.keys.clear();
        self.head.clear();
        self.tail.clear();
        self.next.clear();
        self.generation = self.generation.wrapping_add(1);
        if self.generation == 0 {
            self.slots.fill(Slot::default());
            self.generation = 1;
        }
    }

    /// Where `key` is in the table: `Ok(distinct index)`, or `Err(empty slot)` where it would go.
    /// The table has an empty slot (it is at most half full), so the probe stops at one; the
    /// bound of the loop is the table's size all the same.
    #[inline]
    fn find(&self, key: i64) -> Result<u32, usize> {
        let mask = self.slots.len().wrapping_sub(1);
        let mut i = mix(key) as usize & mask;
        for _ in 0..self.slots.len() {
            let s = &self.slots[i];
            if s.generation != self.generation {
                return Err(i);
            }
            if s.key == key {
                return Ok(s.index);
            }
            i = (i + 1) & mask;
        }
        Err(usize::MAX) // unreachable while the table is at most half full
    }

    /// Doubles the table (or makes the first one) and puts the batch's keys back in.
    #[cold]
    fn grow(&mut self) {
        let size = (self.slots.len() * 2).max(MIN_SLOTS);
        self.slots.clear();
        self.slots.resize(size, Slot::default());
        for (index, &key) in self.keys.iter().enumerate() {
            if let Err(at) = self.find(key) {
                self.slots[at] = Slot { key, generation: self.generation, index: index as u32 };
            }
        }
    }

    /// Adds the next outer tuple of the batch (its key, `None` for NULL); returns its position.
    ///
    /// # Panics
    /// When the batch already holds `u32::MAX` tuples (the node's batches hold 65,536).
    pub fn push(&mut self, key: Option<i64>) -> u32 {
        let pos = self.next.len() as u32;
        assert!(self.next.len() < NONE as usize, "a matching batch holds fewer than 2^32 - 1 tuples");
        self.next.push(NONE);
        let Some(key) = key else { return pos };
        if self.slots.is_empty() {
            self.grow();
        }
        match self.find(key) {
            Ok(index) => {
                let index = index as usize;
                let last = self.tail[index];
                self.next[last as usize] = pos;
                self.tail[index] = pos;
            }
            Err(mut at) => {
                if (self.keys.len() + 1) * 2 > self.slots.len() {
                    self.grow();
                    at = self.find(key).expect_err("a new key");
                }
                self.slots[at] = Slot { key, generation: self.generation, index: self.keys.len() as u32 };
                self.keys.push(key);
                self.head.push(pos);
                self.tail.push(pos);
            }
        }
        pos
    }

    /// Tuples in the batch, NULL keys included.
    pub fn len(&self) -> usize {
        self.next.len()
    }

    pub fn is_empty(&self) -> bool {
        self.next.is_empty()
    }

    /// The distinct non-NULL keys, each once, in first-seen order: what the batch probes.
    pub fn distinct(&self) -> &[i64] {
        &self.keys
    }

    /// The first position of the outer tuples whose key is `key` (the head of its chain), or
    /// [`NONE`] for a key not in the batch.
    #[inline]
    fn first(&self, key: i64) -> u32 {
        if self.slots.is_empty() {
            return NONE;
        }
        match self.find(key) {
            Ok(index) => self.head[index as usize],
            Err(_) => NONE,
        }
    }

    /// Positions of the outer tuples whose key is `key`, in batch order (none for a key not in
    /// the batch, which a pair from an overwritten result buffer could carry).
    pub fn positions(&self, key: i64) -> Positions<'_> {
        Positions { next: &self.next, at: self.first(key) }
    }
}

/// The positions of one key of a [`Batch`], in batch order ([`Batch::positions`]).
#[derive(Debug)]
pub struct Positions<'a> {
    next: &'a [u32],
    at: u32,
}

impl Iterator for Positions<'_> {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        let p = self.at;
        self.at = *self.next.get(p as usize)?;
        Some(p)
    }
}

/// Walks the joined (outer position, inner row id) combinations of a batch's pairs.
#[derive(Debug)]
pub struct Emitter {
    pairs: Vec<[i64; 2]>,
    /// The next pair to look up.
    pair: usize,
    /// The current pair's row and the next outer position to join it with ([`NONE`]: look the
    /// next pair up).
    row: i64,
    at: u32,
}

impl Default for Emitter {
    fn default() -> Self {
        Emitter { pairs: Vec::new(), pair: 0, row: 0, at: NONE }
    }
}

impl Emitter {
    /// Starts over with `pairs` (key, inner row id), as read from the result buffer.
    pub fn reset(&mut self, pairs: Vec<[i64; 2]>) {
        self.pairs = pairs;
        self.pair = 0;
        self.at = NONE;
    }

    /// The pairs' buffer, emptied, to read the next batch's pairs into (no reallocation).
    pub fn take_buffer(&mut self) -> Vec<[i64; 2]> {
        let mut v = std::mem::take(&mut self.pairs);
        v.clear();
        self.pair = 0;
        self.at = NONE;
        v
    }

    /// The next (outer position, inner row id), or `None` when the batch is done.
    ///
    /// One table lookup per pair, then one step along the key's chain per row. `batch` must be
    /// the batch the pairs were probed for; with another one the positions are meaningless but
    /// stay within it (and the walk still ends).
    #[inline]
    pub fn next(&mut self, batch: &Batch) -> Option<(u32, i64)> {
        loop {
            if let Some(&after) = batch.next.get(self.at as usize) {
                let p = self.at;
                self.at = after;
                return Some((p, self.row));
            }
            let &[key, row] = self.pairs.get(self.pair)?;
            self.pair += 1;
            self.row = row;
            self.at = batch.first(key);
        }
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

    /// The node's way, with the caller's (reused) batch and emitter: distinct keys probed
    /// against the inner side, pairs expanded.
    fn by_batch_with(b: &mut Batch, e: &mut Emitter, outer: &[Option<i64>], inner: &[Option<i64>]) -> Vec<(u32, i64)> {
        b.clear();
        for (i, k) in outer.iter().enumerate() {
            assert_eq!(b.push(*k), i as u32);
        }
        assert_eq!(b.len(), outer.len());
        let mut pairs = e.take_buffer();
        for &k in b.distinct() {
            for (j, n) in inner.iter().enumerate() {
                if *n == Some(k) {
                    pairs.push([k, j as i64]);
                }
            }
        }
        e.reset(pairs);
        let mut out = Vec::new();
        while let Some(x) = e.next(b) {
            out.push(x);
        }
        assert_eq!(e.next(b), None, "an emitter stays done");
        out.sort();
        out
    }

    fn by_batch(outer: &[Option<i64>], inner: &[Option<i64>]) -> Vec<(u32, i64)> {
        by_batch_with(&mut Batch::default(), &mut Emitter::default(), outer, inner)
    }

    /// xorshift64: deterministic pseudo-random numbers for the tests.
    fn rng(mut x: u64) -> impl FnMut() -> u64 {
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        }
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
        assert_eq!(b.positions(5).collect::<Vec<_>>(), [0, 2]);
        assert_eq!(b.positions(3).collect::<Vec<_>>(), [1, 4]);
        assert_eq!(b.positions(7).collect::<Vec<_>>(), [5]);
        assert_eq!(b.positions(9).count(), 0);
        assert_eq!(b.len(), 6);
        b.clear();
        assert!(b.is_empty() && b.distinct().is_empty());
        assert_eq!(b.positions(5).count(), 0, "a cleared batch forgets its keys");
    }

    #[test]
    fn a_pair_whose_key_is_not_in_the_batch_yields_nothing() {
        let mut b = Batch::default();
        let mut e = Emitter::default();
        e.reset(vec![[1, 7]]);
        assert_eq!(e.next(&b), None, "an empty batch (no table yet) matches nothing");
        b.push(Some(1));
        e.reset(vec![[42, 0], [1, 7], [43, 1], [i64::MIN, 2], [i64::MAX, 3]]);
        assert_eq!(e.next(&b), Some((0, 7)));
        assert_eq!(e.next(&b), None);
        assert!(e.take_buffer().is_empty());
    }

    #[test]
    fn matches_the_reference_on_pseudo_random_data() {
        let mut next = rng(0x9e37_79b9_7f4a_7c15);
        for round in 0..50 {
            let range = 1 + round % 17;
            let outer: Vec<Option<i64>> =
                (0..(next() % 60)).map(|_| if next() % 7 == 0 { None } else { Some((next() % range) as i64 - 3) }).collect();
            let inner: Vec<Option<i64>> =
                (0..(next() % 40)).map(|_| if next() % 5 == 0 { None } else { Some((next() % range) as i64 - 3) }).collect();
            assert_eq!(by_batch(&outer, &inner), reference(&outer, &inner), "round {round}");
        }
    }

    #[test]
    fn one_key_for_the_whole_batch_yields_its_cross_product_in_order() {
        const N: usize = 1 << 16;
        let mut b = Batch::default();
        for _ in 0..N {
            b.push(Some(-7));
        }
        assert_eq!(b.distinct(), &[-7]);
        assert!(b.positions(-7).eq(0..N as u32));
        let mut e = Emitter::default();
        e.reset(vec![[-7, 10], [8, 99], [-7, 11], [-7, 12]]);
        let mut n = 0usize;
        while let Some((p, row)) = e.next(&b) {
            // Pair by pair, each pair's positions in batch order.
            assert_eq!((p as usize, row), (n % N, 10 + (n / N) as i64), "yield {n}");
            n += 1;
        }
        assert_eq!(n, 3 * N);
        assert_eq!(n, 196_608);
    }

    #[test]
    fn one_batch_reused_across_batches_of_many_sizes() {
        let mut next = rng(0x2545_f491_4f6c_dd1d);
        let (mut b, mut e) = (Batch::default(), Emitter::default());
        // Sizes that grow the table, shrink back to nothing and grow again; key ranges from all
        // duplicates to all distinct.
        let sizes = [0, 1, 2, 15, 16, 17, 300, 0, 5, 2000, 64, 1, 4097, 3, 1000];
        for (round, &n) in sizes.iter().cycle().take(45).enumerate() {
            let range = [1, 3, 50, 1 << 40][round % 4];
            let outer: Vec<Option<i64>> =
                (0..n).map(|_| if next() % 9 == 0 { None } else { Some((next() % range) as i64 - (range / 2) as i64) }).collect();
            let inner: Vec<Option<i64>> = outer.iter().step_by(3).map(|k| k.map(|k| k ^ (next() % 2) as i64)).collect();
            assert_eq!(by_batch_with(&mut b, &mut e, &outer, &inner), reference(&outer, &inner), "round {round}, {n} tuples");
            let mut seen = std::collections::HashSet::new();
            let firsts: Vec<i64> = outer.iter().flatten().copied().filter(|k| seen.insert(*k)).collect();
            assert_eq!(b.distinct(), firsts, "round {round}");
        }
    }

    #[test]
    fn a_batch_no_larger_than_the_largest_seen_allocates_nothing() {
        let mut b = Batch::default();
        let fill = |b: &mut Batch, n: i64, stride: i64| {
            b.clear();
            for k in 0..n {
                b.push(if k % 10 == 9 { None } else { Some(k * stride) });
            }
        };
        fill(&mut b, 5000, 1);
        let buffers = |b: &Batch| {
            [b.keys.as_ptr() as usize, b.head.as_ptr() as usize, b.tail.as_ptr() as usize, b.next.as_ptr() as usize]
                .into_iter()
                .chain([b.slots.as_ptr() as usize, b.slots.len()])
                .collect::<Vec<_>>()
        };
        let before = buffers(&b);
        for (n, stride) in [(5000, 7), (10, 1), (0, 1), (4999, -3), (5000, 1 << 33)] {
            fill(&mut b, n, stride);
            assert_eq!(buffers(&b), before, "{n} tuples, stride {stride}");
            assert_eq!(b.distinct().len(), (n - n / 10) as usize);
        }
    }

    #[test]
    fn the_generation_wraps_without_resurrecting_old_keys() {
        let mut b = Batch::default();
        b.push(Some(1));
        b.generation = u32::MAX - 1;
        b.clear();
        b.push(Some(2)); // a slot of generation u32::MAX
        b.clear(); // wraps: every slot wiped, generation 1 again
        assert_eq!(b.generation, 1);
        assert_eq!(b.positions(1).count(), 0);
        assert_eq!(b.positions(2).count(), 0);
        b.push(Some(2));
        assert_eq!(b.distinct(), &[2]);
        assert_eq!(b.positions(2).collect::<Vec<_>>(), [0]);
    }
}

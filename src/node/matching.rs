//! Batch matching for the GpuJoin plan node, in plain Rust.
//!
//! The node probes a batch of outer tuples at a time. It probes each *distinct* key of the batch
//! once, and the result buffer that `exec::materialize` fills (indexed) holds (the key's index
//! among the distinct keys, inner row id) pairs; the node joins every pair of distinct key `i`
//! with every outer tuple of the batch whose key is key `i`: duplicates on both sides give the
//! cross product per key, as a hash join does; outer tuples with a NULL key are never probed and
//! never match. (A pair carries the index, not the key, so that emitting it needs no lookup in
//! the key table: one read of the key's last position, whatever the batch's size.)
//!
//! [`Batch`] gathers the keys (bounded by the batch size the node picks), [`Batch::distinct`]
//! gives the keys to probe, and [`Emitter`] walks (pair, outer position) combinations one at a
//! time, so a skewed key yields its cross product without materializing it.
//!
//! # Layout (this runs once per outer row: tens of nanoseconds in all is the budget)
//!
//! - An open-addressing table of our own: a power-of-two number of 16-byte `Slot`s, each a
//!   key, the key's index among the distinct keys and a *generation*; the splitmix64 finalizer
//!   spreads the key and linear probing resolves collisions. A slot belongs to the current batch
//!   only when its generation is the batch's, so [`Batch::clear`] empties the table by bumping
//!   one counter (when the counter wraps, every 2^32 - 1 batches, it wipes the slots once). The
//!   table doubles whenever a new key would take it past half full, so a probe meets an empty
//!   slot within a few steps; its capacity follows the distinct keys rather than the tuples (a
//!   batch of one key keeps a small table) and stays at the largest size seen.
//! - The positions of a key form a *circular* chain through `next` (one `u32` per position):
//!   in batch order, and the last position's `next` is the first. `last` holds each distinct
//!   key's last position, so appending a duplicate is two writes and the chain's start is one
//!   read away;
//!   a walk from the first position ends where `next` stops increasing (the wrap, or a key's
//!   only position pointing at itself), so it is bounded by the batch's length whatever it is
//!   given. No array per distinct key but the keys themselves (`distinct`, first-seen order).
//! - Every buffer is cleared, never freed, between batches: in steady state a batch allocates
//!   nothing, whatever its keys.
//! - [`Emitter`] reads each pair's key index once (`last`, then `next`) and then follows the
//!   chain with a cursor, so a yielded row costs O(1) whatever the duplicates. The pairs come
//!   from a segment another process could overwrite: an index that is no distinct key's yields
//!   nothing, and no loop depends on their contents for its bound.

/// Not a position: the `next` of a NULL key's position, and the cursor of a walk that is done.
/// A batch holds at most `NONE` tuples, positions `0..NONE`.
const NONE: u32 = u32::MAX;

/// The smallest table, in slots.
const MIN_SLOTS: usize = 16;

/// One slot of the key table: `key`'s index among the batch's distinct keys, when `generation`
/// is the batch's (otherwise the slot is empty).
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
    /// Distinct keys in first-seen order (the keys probed), and each one's last position.
    keys: Vec<i64>,
    last: Vec<u32>,
    /// Per position: the next position with the same key, the first one after the last (a
    /// circular chain), [`NONE`] for a NULL key. Its length is the batch's, NULL keys included.
    next: Vec<u32>,
    /// The key table; its length is 0 or a power of two at least twice `keys.len()`.
    slots: Vec<Slot>,
    /// The generation of the current batch's slots; never 0 (the generation of a slot never
    /// written).
    generation: u32,
    /// Every non-NULL key is its own entry of `keys`, duplicates included, and the table is not
    /// used ([`Batch::set_positional`]).
    positional: bool,
}

impl Default for Batch {
    fn default() -> Self {
        Batch { keys: Vec::new(), last: Vec::new(), next: Vec::new(), slots: Vec::new(), generation: 1, positional: false }
    }
}

impl Batch {
    /// Empties the batch, keeping every buffer's capacity.
    pub fn clear(&mut self) {
        self.keys.clear();
        self.last.clear();
        self.next.clear();
        self.generation = self.generation.wrapping_add(1);
        if self.generation == 0 {
            self.slots.fill(Slot::default());
            self.generation = 1;
        }
    }

    /// Where `key` is in the table: `Ok(its slot)`, or `Err(the empty slot where it would go)`.
    /// A non-empty table is at most half full, so the probe stops at an empty slot within a few
    /// steps; the loop's bound is the table's size all the same. `Err(0)` for the empty table.
    #[inline]
    fn find(&self, key: i64) -> Result<usize, usize> {
        let mask = self.slots.len().wrapping_sub(1);
        let mut i = mix(key) as usize & mask;
        for _ in 0..self.slots.len() {
            let s = &self.slots[i];
            if s.generation != self.generation {
                return Err(i);
            }
            if s.key == key {
                return Ok(i);
            }
            i = (i + 1) & mask;
        }
        Err(0) // the empty table (a full one cannot be)
    }

    /// Doubles the table (or makes the first one) and moves the batch's slots over.
    #[cold]
    fn grow(&mut self) {
        let size = (self.slots.len() * 2).max(MIN_SLOTS);
        let old = std::mem::replace(&mut self.slots, vec![Slot::default(); size]);
        for s in old.into_iter().filter(|s| s.generation == self.generation) {
            if let Err(at) = self.find(s.key) {
                self.slots[at] = s;
            }
        }
    }

    /// Whether each key is probed once per outer tuple (no key table: a pair's index is then
    /// the tuple's place among the batch's non-NULL keys) rather than once per distinct key.
    /// Against an inner side whose keys are unique, a pair is then a joined row, and the batch
    /// costs no hashing; against duplicates on both sides, the pairs multiply (the node turns it
    /// off then: [`Batch::deduplicate`]). Set between batches: the current one is cleared.
    pub fn set_positional(&mut self, on: bool) {
        self.clear();
        self.positional = on;
    }

    pub fn positional(&self) -> bool {
        self.positional
    }

    /// Turns a positional batch into one of distinct keys, the same tuples in the same positions
    /// (the pairs a positional batch formed are to be formed again), and leaves positional mode.
    pub fn deduplicate(&mut self) {
        if !self.positional {
            return;
        }
        let keys = std::mem::take(&mut self.keys);
        let nulls: Vec<bool> = self.next.iter().map(|&n| n == NONE).collect();
        self.set_positional(false);
        let mut at = keys.iter();
        for null in nulls {
            let key = if null { None } else { at.next().copied() };
            self.push(key);
        }
    }

    /// Adds the next outer tuple of the batch (its key, `None` for NULL); returns its position.
    ///
    /// # Panics
    /// When the batch already holds `u32::MAX` tuples (the node's batches hold 65,536).
    #[inline]
    pub fn push(&mut self, key: Option<i64>) -> u32 {
        assert!(self.next.len() < NONE as usize, "a matching batch holds fewer than 2^32 - 1 tuples");
        let pos = self.next.len() as u32;
        let Some(key) = key else {
            self.next.push(NONE);
            return pos;
        };
        if self.positional {
            self.keys.push(key);
            self.last.push(pos);
            self.next.push(pos); // a chain of one
            return pos;
        }
        match self.find(key) {
            Ok(s) => {
                // Append to the circular chain: the last position now leads here, and this one
                // back to the first.
                let index = self.slots[s].index as usize;
                let last = self.last[index] as usize;
                let first = self.next[last];
                self.next[last] = pos;
                self.next.push(first);
                self.last[index] = pos;
            }
            Err(mut at) => {
                if (self.keys.len() + 1) * 2 > self.slots.len() {
                    self.grow();
                    at = self.find(key).expect_err("a new key");
                }
                self.slots[at] = Slot { key, generation: self.generation, index: self.keys.len() as u32 };
                self.keys.push(key);
                self.last.push(pos);
                self.next.push(pos); // a chain of one
            }
        }
        pos
    }

    /// Adds outer tuples in order: `keys`, and where `keyless` is not empty, whether each
    /// tuple's key is NULL (as [`Batch::push`] with `None`). The slot of the key a few places
    /// ahead is prefetched, so the table's cache misses overlap (a batch's table is larger than
    /// the L2 cache).
    pub fn extend(&mut self, keys: &[i64], keyless: &[bool]) {
        const AHEAD: usize = 8;
        if self.positional {
            for (i, &k) in keys.iter().enumerate() {
                self.push((!keyless.get(i).copied().unwrap_or(false)).then_some(k));
            }
            return;
        }
        for (i, &k) in keys.iter().enumerate() {
            if let Some(&ahead) = keys.get(i + AHEAD) {
                self.prefetch(ahead);
            }
            self.push((!keyless.get(i).copied().unwrap_or(false)).then_some(k));
        }
    }

    /// Starts loading the slot where `key`'s probe starts into the cache.
    #[inline]
    fn prefetch(&self, key: i64) {
        let mask = self.slots.len().wrapping_sub(1);
        if let Some(s) = self.slots.get(mix(key) as usize & mask) {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: a prefetch is a hint, valid for any address; this one is a live slot.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(s as *const Slot as *const i8)
            };
            #[cfg(not(target_arch = "x86_64"))]
            let _ = s;
        }
    }

    /// Tuples in the batch, NULL keys included.
    pub fn len(&self) -> usize {
        self.next.len()
    }

    pub fn is_empty(&self) -> bool {
        self.next.is_empty()
    }

    /// The distinct non-NULL keys, each once, in first-seen order (positional: every non-NULL
    /// key, in batch order): what the batch probes (a pair's key index is an index into these).
    pub fn distinct(&self) -> &[i64] {
        &self.keys
    }

    /// The first position of the outer tuples whose key is `key`, or [`NONE`] for a key not in
    /// the batch.
    #[inline]
    fn first(&self, key: i64) -> u32 {
        match self.find(key) {
            Ok(s) => self.first_of(self.slots[s].index as i64),
            Err(_) => NONE,
        }
    }

    /// The first position of the outer tuples whose key is distinct key `index`, or [`NONE`]
    /// for an index that is none (a pair from an overwritten result buffer).
    #[inline]
    fn first_of(&self, index: i64) -> u32 {
        match usize::try_from(index).ok().and_then(|i| self.last.get(i)) {
            Some(&last) => self.next[last as usize],
            None => NONE,
        }
    }

    /// The position after `p` in its chain, [`NONE`] after the last (or for `p` not a position).
    #[inline]
    fn after(&self, p: u32) -> u32 {
        match self.next.get(p as usize) {
            Some(&n) if n > p => n,
            _ => NONE,
        }
    }

    /// Positions of the outer tuples whose key is `key`, in batch order (none for a key not in
    /// the batch, which a pair from an overwritten result buffer could carry). For a batch of
    /// distinct keys: a positional one has no key table (none, then).
    pub fn positions(&self, key: i64) -> Positions<'_> {
        Positions { batch: self, at: self.first(key) }
    }
}

/// The positions of one key of a [`Batch`], in batch order ([`Batch::positions`]).
#[derive(Debug)]
pub struct Positions<'a> {
    batch: &'a Batch,
    at: u32,
}

impl Iterator for Positions<'_> {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        let p = self.at;
        (p != NONE).then(|| {
            self.at = self.batch.after(p);
            p
        })
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
    /// Starts over with `pairs` (distinct key index, inner row id), as read from the result
    /// buffer.
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
    /// Two reads per pair (the key's last position, and the first after it), then one step
    /// along the key's chain per row. `batch` must be the batch the pairs were probed for; with
    /// another one the positions are meaningless but stay within it, and the walk still ends.
    #[inline]
    pub fn next(&mut self, batch: &Batch) -> Option<(u32, i64)> {
        loop {
            if (self.at as usize) < batch.len() {
                let p = self.at;
                self.at = batch.after(p);
                return Some((p, self.row));
            }
            let &[index, row] = self.pairs.get(self.pair)?;
            self.pair += 1;
            self.row = row;
            self.at = batch.first_of(index);
        }
    }
}

/// xorshift64: deterministic pseudo-random numbers for the tests and the measurement.
#[cfg(test)]
fn tests_rng(mut x: u64) -> impl FnMut() -> u64 {
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

#[cfg(test)]
mod tests {
    use super::tests_rng as rng;
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
        expand(b, e, inner)
    }

    /// The batch's keys probed against the inner side as the node's materialize does (a pair
    /// per match: the key's index among the batch's keys, the inner position), and the pairs
    /// expanded by the emitter: the joined (outer, inner) positions, sorted.
    fn expand(b: &Batch, e: &mut Emitter, inner: &[Option<i64>]) -> Vec<(u32, i64)> {
        let mut pairs = e.take_buffer();
        for (i, &k) in b.distinct().iter().enumerate() {
            for (j, n) in inner.iter().enumerate() {
                if *n == Some(k) {
                    pairs.push([i as i64, j as i64]);
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

    #[test]
    fn duplicates_give_the_cross_product_and_nulls_never_match() {
        let outer = [Some(1), None, Some(2), Some(1), Some(3), None, Some(1)];
        let inner = [Some(1), Some(1), None, Some(2), Some(4)];
        let got = by_batch(&outer, &inner);
        assert_eq!(got, reference(&outer, &inner));
        assert_eq!(got.len(), 3 * 2 + 1);
    }

    #[test]
    fn positional_batches_probe_every_key_and_join_as_the_reference() {
        let mut next = rng(0x51_7cc1_b727_220a);
        let (mut b, mut e) = (Batch::default(), Emitter::default());
        for round in 0..60 {
            // Flipped every few rounds, and a positional batch deduplicated in place every third.
            b.set_positional(round % 4 < 2);
            let range = [1, 4, 50, 1 << 40][round % 4];
            let outer: Vec<Option<i64>> =
                (0..(next() % 80)).map(|_| if next().is_multiple_of(6) { None } else { Some((next() % range) as i64) }).collect();
            let inner: Vec<Option<i64>> =
                (0..(next() % 50)).map(|_| if next().is_multiple_of(5) { None } else { Some((next() % range) as i64) }).collect();
            if b.positional() {
                b.clear();
                for k in &outer {
                    b.push(*k);
                }
                assert_eq!(b.distinct(), outer.iter().flatten().copied().collect::<Vec<_>>(), "every key, in order");
                if round % 3 == 0 {
                    b.deduplicate();
                    assert!(!b.positional());
                    let mut seen = std::collections::HashSet::new();
                    let firsts: Vec<i64> = outer.iter().flatten().copied().filter(|k| seen.insert(*k)).collect();
                    assert_eq!(b.distinct(), firsts, "distinct keys after deduplicate");
                    assert_eq!(b.len(), outer.len());
                }
                assert_eq!(expand(&b, &mut e, &inner), reference(&outer, &inner), "round {round}");
            } else {
                assert_eq!(by_batch_with(&mut b, &mut e, &outer, &inner), reference(&outer, &inner), "round {round}");
            }
        }
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
    fn a_pair_whose_index_is_no_key_of_the_batch_yields_nothing() {
        let mut b = Batch::default();
        let mut e = Emitter::default();
        e.reset(vec![[0, 7]]);
        assert_eq!(e.next(&b), None, "an empty batch (no table yet) matches nothing");
        b.push(Some(1));
        e.reset(vec![[42, 0], [0, 7], [1, 1], [-1, 1], [i64::MIN, 2], [i64::MAX, 3]]);
        assert_eq!(e.next(&b), Some((0, 7)));
        assert_eq!(e.next(&b), None);
        assert!(e.take_buffer().is_empty());
    }

    #[test]
    fn matches_the_reference_on_pseudo_random_data() {
        let mut next = rng(0x9e37_79b9_7f4a_7c15);
        for round in 0..50 {
            let range = 1 + round % 17;
            let outer: Vec<Option<i64>> = (0..(next() % 60))
                .map(|_| if next().is_multiple_of(7) { None } else { Some((next() % range) as i64 - 3) })
                .collect();
            let inner: Vec<Option<i64>> = (0..(next() % 40))
                .map(|_| if next().is_multiple_of(5) { None } else { Some((next() % range) as i64 - 3) })
                .collect();
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
        e.reset(vec![[0, 10], [8, 99], [0, 11], [0, 12]]);
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
            let outer: Vec<Option<i64>> = (0..n)
                .map(|_| if next().is_multiple_of(9) { None } else { Some((next() % range) as i64 - (range / 2) as i64) })
                .collect();
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
            [b.keys.as_ptr() as usize, b.last.as_ptr() as usize, b.next.as_ptr() as usize]
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
    fn an_emitter_walked_against_another_batch_stays_in_it_and_ends() {
        let mut b = Batch::default();
        for k in [1, 2, 1, 1, 3, 1, 2, 1] {
            b.push(Some(k));
        }
        let mut e = Emitter::default();
        e.reset(vec![[0, 10], [1, 20], [0, 11]]);
        assert_eq!(e.next(&b), Some((0, 10)));
        assert_eq!(e.next(&b), Some((2, 10)));
        // The batch changes under the walk (a caller's bug): the cursor (position 3) is past the
        // new batch, so the pair ends; the rest are looked up in the new batch (index 1 is now
        // key 1, at position 1; index 0 key 2, at 0).
        b.clear();
        for k in [2, 1] {
            b.push(Some(k));
        }
        let rest: Vec<_> = std::iter::from_fn(|| e.next(&b)).collect();
        assert_eq!(rest, [(1, 20), (0, 11)]);
        assert_eq!(e.next(&b), None);
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

#[cfg(test)]
mod bench {
    use super::Batch;
    use std::time::Instant;

    #[test]
    #[ignore = "a measurement: cargo test --release --lib matching::bench -- --ignored --nocapture"]
    fn push_ns_per_tuple() {
        let mut next = super::tests_rng(0x6a09_e667_f3bc_c908);
        let keys: Vec<i64> = (0..crate::node::gpujoin::BATCH_TUPLES).map(|_| (next() % 5_000_000) as i64).collect();
        let mut b = Batch::default();
        let mut best = f64::MAX;
        for _ in 0..5 {
            let t = Instant::now();
            for _ in 0..50 {
                b.clear();
                for &k in &keys {
                    b.push(Some(k));
                }
                std::hint::black_box(b.distinct().len());
            }
            best = best.min(t.elapsed().as_nanos() as f64 / (50 * keys.len()) as f64);
        }
        let mut ext = f64::MAX;
        for _ in 0..5 {
            let t = Instant::now();
            for _ in 0..50 {
                b.clear();
                b.extend(&keys, &[]);
                std::hint::black_box(b.distinct().len());
            }
            ext = ext.min(t.elapsed().as_nanos() as f64 / (50 * keys.len()) as f64);
        }
        println!("push: {best:.1} ns per tuple, extend {ext:.1}");
    }
}

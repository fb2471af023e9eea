//! The kernels of `segment.cu`, each declared once: its name, and its parameters with their
//! names and Rust types in the order of the C declaration (see `crates/uvm_core/src/gpu/launch.rs`). Launches
//! take the generated parameter structs, so a launch with other arguments does not compile;
//! `crates/uvm_core/src/gpu/kernels.rs` tests that this table and the source declare the same functions and
//! parameters. Change both together.
//!
//! `Ptr<T>` is `const T *`, `MutPtr<T>` is `T *` (device addresses), `u64` is `u64`. What each
//! kernel reads and writes through its pointers is said at its definition in `segment.cu`.

use crate::gpu::launch::{kernels, CType, MutPtr, Ptr};

/// The CUDA source, compiled by NVRTC at run time (`crates/uvm_core/src/gpu/kernels.rs`).
pub const SOURCE: &str = include_str!("segment.cu");

/// `Slot` of the source: a GpuJoin table slot, 24 bytes (tag u64, key long long, payload long
/// long; `crates/uvm_core/src/gpujoin/table.rs` has the layout). Only pointed to.
pub enum Slot {}

impl CType for Slot {
    const C: &'static str = "Slot";
}

/// CUDA's `ulonglong2`: two u64, 16 bytes, 16-byte aligned. Only pointed to.
pub enum ULongLong2 {}

impl CType for ULongLong2 {
    const C: &'static str = "ulonglong2";
}

kernels! {
    /// The functions of the loaded `segment.cu` module (which it owns).
    pub struct Segment {
        /// Adds the checksum of `[p, p + len)` to `*out`.
        uvm_checksum => Checksum(p: Ptr<u8>, len: u64, out: MutPtr<u64>);
        /// Writes the fill pattern of `seed` over `[p, p + len)`.
        uvm_fill => Fill(p: MutPtr<u8>, len: u64, seed: u64);
        /// Reads `n` 16-byte vectors at `p` (a bandwidth probe); `*out` is practically never
        /// written.
        uvm_read_bw => ReadBw(p: Ptr<ULongLong2>, n: u64, out: MutPtr<u64>);
        /// Inserts the rows of a column of keys and one of payloads (`blocks` blocks of up to
        /// `n` rows, `block_stride` bytes apart, each value of `key_width` or `payload_width`
        /// bytes with a NULL bitmap or a null pointer; `payload_width` 0: no payloads; each
        /// block's row count at `headers` where not null) into `mask + 1` slots; counts the
        /// rows left out for want of a slot in `out[0]`, NULL payloads in `out[2]`, NULL keys
        /// (left out) in `out[3]` and rows placed in `out[5]`, sets `out[1]` when a walk ran
        /// out of budget (`resume`: 3 words per thread of the grid; launch again with `fresh`
        /// 0) and `out[4]` when a block's count exceeded `n`.
        uvm_join_build => JoinBuild(
            slots: MutPtr<Slot>,
            mask: u64,
            seed: u64,
            keys: Ptr<u8>,
            key_width: u64,
            key_nulls: Ptr<u8>,
            payloads: Ptr<u8>,
            payload_width: u64,
            payload_nulls: Ptr<u8>,
            n: u64,
            blocks: u64,
            block_stride: u64,
            headers: Ptr<u8>,
            resume: MutPtr<u64>,
            fresh: u64,
            out: MutPtr<u64>,
        );
        /// Probes the keys of a column (as for `uvm_join_build`) against `mask + 1` slots;
        /// adds matches, payload lo and hi, and corrupted chains to `out[0..4]`; sets `out[4]`
        /// when a walk ran out of budget (`resume`: 3 words per thread; launch again with
        /// `fresh` 0), `out[5]` when a block's count exceeded `n`, and `out[6]` when the
        /// launch's blocks were not whole warps of at most 8 (nothing probed). A warp probes
        /// tiles of 256 rows copied into shared memory (`cp.async`, the next tile's copies in
        /// flight while it probes one).
        uvm_join_probe => JoinProbe(
            slots: Ptr<Slot>,
            mask: u64,
            seed: u64,
            keys: Ptr<u8>,
            key_width: u64,
            key_nulls: Ptr<u8>,
            n: u64,
            blocks: u64,
            block_stride: u64,
            headers: Ptr<u8>,
            resume: MutPtr<u64>,
            fresh: u64,
            out: MutPtr<u64>,
        );
        /// Appends the matches of `n` keys to a pair buffer, under the grow-and-resume protocol
        /// and the walk budget (`resume`: 8 words per thread of the grid; `ctl`: 7 words); with
        /// `indexed` set a pair starts with the key's index plus `index_base`, not the key.
        uvm_join_materialize => JoinMaterialize(
            slots: Ptr<Slot>,
            mask: u64,
            seed: u64,
            keys: Ptr<i64>,
            n: u64,
            pairs: MutPtr<i64>,
            next: MutPtr<u64>,
            written: MutPtr<u64>,
            cap: u64,
            resume: MutPtr<u64>,
            fresh: u64,
            ctl: MutPtr<u64>,
            indexed: u64,
            index_base: u64,
        );
        /// Zeroes `words` 8-byte words at `p`.
        uvm_zero => Zero(p: MutPtr<u64>, words: u64);
        /// One pass (`mode`: 0 the keys, 1 the fold, 2 both) of a scan program (`prog`, the words of
        /// `crate::scan::gpu`) over `blocks` blocks of a column cache from `base`, `stride`
        /// bytes apart, of up to `n` rows (the first block's rows below `first_row` skipped),
        /// into a group table's `mask + 1` slots of `slot_words` words at `slots`, `groups` its
        /// count of groups, at most `limit`; the outcome in `out[0..6]`.
        uvm_scan_groups => ScanGroupsPass(
            prog: Ptr<u64>,
            base: Ptr<u8>,
            n: u64,
            blocks: u64,
            stride: u64,
            first_row: u64,
            slots: MutPtr<u64>,
            mask: u64,
            seed: u64,
            key_words: u64,
            slot_words: u64,
            groups: MutPtr<u64>,
            limit: u64,
            mode: u64,
            out: MutPtr<u64>,
        );
        /// A dimension's join table from its cache (`crate::scan::build`): the pairs (key of
        /// column `key_col`, index of the row's group slot in the group table at `slots`) of
        /// the rows of `blocks` blocks (as `uvm_scan_groups` reads them) that pass the
        /// program's filters, inserted into the GpuJoin table's `tmask + 1` slots at `tslots`,
        /// at most `limit`; the outcome in `out[0..6]` (`out[1]` the pairs, `out[4]` one past
        /// the limit or a table without room).
        uvm_scan_build => ScanBuildPass(
            prog: Ptr<u64>,
            base: Ptr<u8>,
            n: u64,
            blocks: u64,
            stride: u64,
            slots: MutPtr<u64>,
            mask: u64,
            seed: u64,
            key_words: u64,
            slot_words: u64,
            key_col: u64,
            tslots: MutPtr<Slot>,
            tmask: u64,
            tseed: u64,
            limit: u64,
            out: MutPtr<u64>,
        );
        /// The longest run of occupied slots of a GpuJoin table's `mask + 1` slots (at most
        /// `cap + 1`) into `out[0]`, its empty slots into `out[1]`.
        uvm_longest_run => LongestRun(slots: Ptr<Slot>, mask: u64, cap: u64, out: MutPtr<u64>);
    }
}

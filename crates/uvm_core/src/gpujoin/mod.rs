//! GpuJoin: an inner hash table built once in a shared segment and probed by every parallel
//! worker. This module holds what the CPU and GPU paths share: the table layout with the CPU
//! build and probe (`table.rs`; the kernels in `kernels/segment.cu` follow the same layout),
//! the probe aggregate's batching state (`probe.rs`), the materializing mode's shared result
//! buffer with its grow-and-resume protocol (`pairs.rs`), and the host side of the join kernels
//! (`gpu.rs`: staging, typed launches through `crates/uvm_core/src/gpu`, decoding their results). The SQL
//! surface is `sql/gpujoin.rs`; requests reach this module through `crates/uvm_core/src/exec`.
//!
//! # Layout
//!
//! Offsets, never pointers: the table is read at whatever address a process maps the segment.
//!
//! ```text
//! offset 0   Header (64 bytes): magic "UVMHASH1", version, key type (4 = int4, 8 = int8),
//!            slot count (a power of two), rows stored, rows with NULL keys (never match),
//!            hash function id, seed, offset of the slots
//! offset 64  Slot[slot_count], 24 bytes each: tag u64 (0 = empty, else hash | 1),
//!            key i64 (int4 keys widened), payload i64
//! ```
//!
//! Open addressing with linear probing; duplicate keys take a slot each, so a probe walks from
//! the key's home slot to the first empty one and counts every slot whose tag and key match.
//! The slot count is at least twice the rows, so probe chains stay short. The tag (the hash
//! with its low bit set) makes empty slots unambiguous for every key value, `i64::MIN`
//! included, and rejects most non-matching slots without comparing keys.
//!
//! The hash is `checksum::mix(key ^ seed)`: the same function the GPU kernels use.
//!
//! # Untrusted contents
//!
//! Segments are shared memory that other processes may overwrite at any time, so nothing read
//! from one is trusted: headers are validated completely against the segment's size
//! (`table::parse_header`, `pairs::parse_header`), slots are read with volatile loads through
//! raw pointers bounded by the validated slot count, every walk along a probe chain stops after
//! `slot_count` steps (a valid table always has an empty slot; only a corrupted one reaches the
//! bound, which is an ERROR), and writers stay inside their own reservation. The kernels do the
//! same and report a bounded walk through a counter the host reads back. Long CPU loops call
//! `crate::interrupt::check_every`; GPU paths check between launches.
//!
//! A table becomes valid only once whole: builds zero the header first, insert, and write the
//! header last, and the SQL layer drops the segment of a build that fails or is cancelled.
//! The addresses kernels get come only from `pairs::Inner::of` and `pairs::Target::of`, which
//! validate a pinned segment and borrow its pin.

pub mod gpu;
pub mod pairs;
pub mod probe;
pub mod table;

//! Scan programs on the GPU: the host side of `uvm_scan_groups` (`kernels/segment.cu`), the
//! kernel that runs a program ([`super`]) over a column cache's blocks in place, one thread per
//! row, folding into a group table in a segment with atomics.
//!
//! # Design
//!
//! The program goes to the device as words (`segment.cu` has their layout): the cache's column
//! directory (where each column's values and NULL bitmap lie in a block, its width and whether
//! it is signed), the filters, the comparisons' steps, the joins (each dimension table's slots,
//! mask, seed and walk bound), the keys and the aggregates, then the filters' code bitmaps.
//! The host validates everything first, as the CPU engine does ([`super::check_parts`], the
//! cache's layout, the group table's header and shape, each dimension table's header), so the
//! kernel meets only programs that fit the segments; it still bounds every index it reads.
//!
//! **The group table with atomics.** A thread claims an empty slot by moving its tag from 0 to
//! a busy mark, writes the key words and the identities of `min`/`max` (so that a value folds
//! in with one `atomicMin`/`atomicMax` or a compare-and-swap, whatever the order), then
//! publishes the tag; a thread meeting the busy mark reads again, a bounded number of times.
//! Counts and integer sums are `atomicAdd`s (a 128-bit sum as two words, the carry added to the
//! high one), float sums `atomicAdd(double)` with the overflow flag set where two finite values
//! gave an infinity (as `float8pl` raises), float `min`/`max` a compare-and-swap loop in
//! PostgreSQL's order (NaN above every number). The states are then exactly the CPU's
//! (`groups`): a reader cannot tell which engine folded them, except for the last digits of a
//! float sum, added in another order.
//!
//! **Full tables, without losing or doubling a row.** The CPU engine stops at a row boundary
//! when the table is at its load limit; thousands of threads cannot. So each launch is two
//! passes over the same rows: the key pass inserts the key of every combination a row folds
//! into, and nothing else; the fold pass finds them and folds. Where the key pass meets the
//! limit, it is refused for those keys and the request answers `Full` at the launch's first
//! row: the client grows the table (`GroupsGrow`, which carries the keys inserted so far) and
//! asks again from there; the key pass runs again (the keys already in are found), then the
//! fold pass, which folds every row of the launch once. The keys inserted before a refusal are
//! folded by that later fold pass, so no group is left without its rows. Where the client knows
//! how many distinct keys the program can make at most (a product of the keys' cardinalities:
//! a star query's dimensions' distinct grouping values) and the table takes them all, no key
//! can be refused, and each launch is one pass that inserts and folds (half the reading; a
//! refusal there is an ERROR, never a lost row). [`grow`] is
//! `GroupsGrow` where the tables lie in device memory: the groups move on the CPU, through
//! copies, and the new table is primed with the `min`/`max` identities the kernels fold into.
//!
//! **A dimension's join table** ([`build`], `uvm_scan_build`): one pass per launch, a thread per
//! row: the filters, then the row's group found (never claimed) in the program's group table,
//! then the pair (key, slot index) claimed into the join table as `uvm_join_build` claims, at
//! most the pairs the table was sized for (a count past it, or a walk without an empty slot,
//! is an ERROR). The group table ran over the same rows first, so every group is there.
//!
//! **Bounded.** A launch reads at most [`LAUNCH_ROWS`] rows; the host checks for interrupts
//! between launches. A walk along a dimension table's chain is bounded by the table's longest
//! run of occupied slots, measured by `uvm_longest_run` before the scan (a healthy table's
//! runs are short; beyond [`MAX_RUN`] the scan refuses the table, 54000); the group table's
//! walks by its slot count, and every walk gives up once another thread has found the table
//! corrupted. A walk past its bound, a key the fold pass does not find, or a slot busy for
//! too long is an ERROR, never a wrong answer or a hang.

use super::{check_parts, Filter, Input, Progress, Source, Test};
use crate::cache::{Layout, HEADER_BYTES as CACHE_HEADER_BYTES};
use crate::error::{Code, Result, UvmError};
use crate::gpu::launch::{MutPtr, Ptr};
use crate::gpu::segment::{LongestRun, ScanBuildPass, ScanGroupsPass};
use crate::gpu::Kernels;
use crate::gpujoin::table;
use crate::groups::{self, AggKind, Head};
use crate::scan::expr::Step;

/// Rows one launch reads at most (its two passes each): 16 Mi, a few milliseconds on the H200.
pub const LAUNCH_ROWS: u64 = 1 << 24;
/// The longest run of occupied slots a dimension table may have: the bound of every walk
/// along its chains. A healthy table at half load has runs of tens of slots; long runs come
/// from many rows of one key (a dimension that is not one row per key).
pub const MAX_RUN: u64 = 1 << 16;

/// The kernel's limits (`SCAN_MAX_JOINS`, `SCAN_MAX_KEY_WORDS` less the NULL bits' word,
/// `SCAN_MAX_AGGS` in `segment.cu`; the request's own are the same: `exec::scan`).
pub const MAX_JOINS: usize = 8;
pub const MAX_KEYS: usize = 31;
pub const MAX_AGGS: usize = 64;

/// A pinned segment as the kernels see it: its name (for messages), its address and size.
#[derive(Clone, Copy, Debug)]
pub struct DeviceSeg<'a> {
    pub name: &'a str,
    pub addr: u64,
    pub len: u64,
}

/// A program whose joins name their dimension tables' segments.
pub struct DeviceProgram<'a> {
    pub filters: &'a [Filter],
    /// (fact column, dimension table) per join.
    pub joins: Vec<(usize, DeviceSeg<'a>)>,
    pub keys: &'a [Source],
    pub aggs: &'a [(AggKind, Input)],
}

/// Copies `len` bytes at device address `src` to the host.
///
/// # Safety
/// `[src, src + len)` lies in a pinned, mapped segment.
unsafe fn read(src: u64, len: usize) -> Result<Vec<u8>> {
    let mut out = vec![0u8; len];
    // SAFETY: the caller's range; `out` is ours.
    unsafe { crate::gpu::copy(out.as_mut_ptr() as u64, src, len) }?;
    Ok(out)
}

/// The cache's layout, read from the device and parsed against its size.
///
/// # Safety
/// `cache` is a pinned, mapped segment.
unsafe fn layout(cache: &DeviceSeg<'_>) -> Result<Layout> {
    // SAFETY: inside the segment (the min with its size).
    let head = unsafe { read(cache.addr, CACHE_HEADER_BYTES.min(cache.len) as usize) }?;
    let prefix = Layout::prefix_len(cache.name, &head)?.min(cache.len);
    // SAFETY: as above.
    let prefix = unsafe { read(cache.addr, prefix as usize) }?;
    Layout::parse(cache.name, &prefix, cache.len)
}

/// A dimension table's slots: (address, mask, seed, walk bound).
///
/// # Safety
/// `dim` is a pinned, mapped segment.
unsafe fn dimension(k: &Kernels, dim: &DeviceSeg<'_>) -> Result<[u64; 4]> {
    // SAFETY: inside the segment (the min with its size).
    let raw = unsafe { read(dim.addr, table::HEADER_BYTES.min(dim.len) as usize) }?;
    let h = table::parse_header(dim.name, &raw, dim.len)?;
    let slots = dim.addr + h.slots_offset;
    k.result().set_bytes(0, 16)?;
    let params = LongestRun { slots: Ptr::new(slots), mask: h.slot_count - 1, cap: MAX_RUN, out: k.result_ptr() };
    // SAFETY: parse_header bounded the slot_count slots inside the segment; the kernel reads
    // only those (each run's walk at most MAX_RUN + 1 slots) and writes 2 words of our result.
    unsafe { k.launch(k.segment().uvm_longest_run(), params) }?;
    let mut r = [0u64; 2];
    k.result().read(&mut r)?;
    if r[1] == 0 {
        return Err(table::corrupted(dim.name, &format!("a probe found no empty slot in {} slots", h.slot_count)));
    }
    if r[0] > MAX_RUN {
        return Err(UvmError::new(
            Code::ProgramLimitExceeded,
            format!("GpuJoin table \"{}\" has runs of more than {MAX_RUN} occupied slots: a GPU scan does not probe it", dim.name),
        )
        .hint("Many rows of one dimension key make long runs; SET pg_uvm_share.enable_gpugroupagg = off runs the query on PostgreSQL's plan."));
    }
    Ok([slots, h.slot_count - 1, h.seed, r[0] + 1])
}

/// The program's words (`segment.cu`'s layout).
fn words(layout: &Layout, p: &DeviceProgram<'_>, dims: &[[u64; 4]]) -> Vec<u64> {
    let mut cols = Vec::new();
    for (c, d) in layout.columns().iter().enumerate() {
        let signed = layout.encoding(c).is_some_and(|e| e.signed());
        cols.extend_from_slice(&[d.values_at, d.nulls_at, u64::from(d.width), u64::from(signed)]);
    }
    let (mut filters, mut steps, mut data) = (Vec::new(), Vec::new(), Vec::<u8>::new());
    for f in p.filters {
        let head = |kind: u64| f.col as u64 | kind << 32 | u64::from(f.or) << 40;
        match &f.test {
            Test::Range { lo, hi } => filters.extend_from_slice(&[head(1), *lo as u64, *hi as u64, 0]),
            Test::Codes(bits) => {
                filters.extend_from_slice(&[head(2), data.len() as u64, bits.len() as u64, 0]);
                data.extend_from_slice(bits);
            }
            Test::Null => filters.extend_from_slice(&[head(3), 0, 0, 0]),
            Test::Compare(c) => {
                let at = steps.len() as u64 / 2;
                for s in c.lhs.iter().chain(&c.rhs) {
                    steps.extend_from_slice(&match *s {
                        Step::Col(c) => [1, c as u64],
                        Step::Const(v) => [2, v as u64],
                        Step::Bin(op, w) => [3 | (op as u64 + 1) << 8 | u64::from(w.code()) << 16, 0],
                        Step::Neg(w) => [4 | u64::from(w.code()) << 16, 0],
                    });
                }
                let sides = c.lhs.len() as u64 | (c.rhs.len() as u64) << 16 | u64::from(c.cmp.code()) << 32;
                filters.extend_from_slice(&[head(4), at, sides, 0]);
            }
        }
    }
    let mut joins = Vec::new();
    for ((col, _), d) in p.joins.iter().zip(dims) {
        joins.extend_from_slice(&[*col as u64, d[0], d[1], d[2], d[3]]);
    }
    let keys: Vec<u64> = p
        .keys
        .iter()
        .map(|s| match *s {
            Source::Col(c) => 1 << 32 | c as u64,
            Source::Payload(j) => 2 << 32 | j as u64,
        })
        .collect();
    let mut aggs = Vec::new();
    for &(kind, input) in p.aggs {
        let (ik, a, b) = input.code();
        aggs.extend_from_slice(&[kind as u64 | u64::from(ik) << 16, a as u64 | (b as u64) << 32]);
    }
    const HEAD: usize = 14;
    let at_cols = HEAD;
    let at_filters = at_cols + cols.len();
    let at_steps = at_filters + filters.len();
    let at_joins = at_steps + steps.len();
    let at_keys = at_joins + joins.len();
    let at_aggs = at_keys + keys.len();
    let at_data = at_aggs + aggs.len();
    let mut w = vec![
        p.filters.len() as u64,
        p.joins.len() as u64,
        p.keys.len() as u64,
        p.aggs.len() as u64,
        layout.columns().len() as u64,
        steps.len() as u64 / 2,
        data.len() as u64,
        at_cols as u64,
        at_filters as u64,
        at_steps as u64,
        at_joins as u64,
        at_keys as u64,
        at_aggs as u64,
        at_data as u64,
    ];
    for part in [cols, filters, steps, joins, keys, aggs] {
        w.extend_from_slice(&part);
    }
    w.extend(data.chunks(8).map(|c| {
        let mut b = [0u8; 8];
        b[..c.len()].copy_from_slice(c);
        u64::from_le_bytes(b)
    }));
    w
}

/// The ERROR a launch's outcome words stand for, if any (`segment.cu`: `out`).
fn outcome(out: &[u64; 6], groups_name: &str) -> Result<()> {
    let int = |name: &str| UvmError::new(Code::NumericValueOutOfRange, format!("{name} out of range"));
    match out[2] {
        0 => {}
        1 => return Err(int("smallint")),
        2 => return Err(int("integer")),
        3 => return Err(int("bigint")),
        4 => return Err(UvmError::new(Code::DivisionByZero, "division by zero")),
        5 => return Err(int("bigint").detail("In a difference of two columns.")),
        6 => return Err(int("bigint").detail("In a product of two columns.")),
        c => return Err(UvmError::new(Code::SystemError, format!("a scan kernel found its program malformed (code {c})"))),
    }
    if out[3] != 0 {
        return Err(crate::gpujoin::gpu::overcounted_block());
    }
    if out[5] != 0 {
        return Err(UvmError::new(
            Code::InvalidParameterValue,
            "a GpuJoin hash table of the scan is corrupted: a probe found no empty slot within its longest run",
        )
        .hint("The segment was overwritten during the scan; run the query again."));
    }
    if out[0] != 0 {
        return Err(UvmError::new(
            Code::InvalidParameterValue,
            format!("group table in segment \"{groups_name}\" is corrupted: a walk found neither its key nor an empty slot"),
        ));
    }
    Ok(())
}

/// The header of the group table `groups` of the program `p`, checked against the kernels'
/// limits and the program's keys and aggregates (22023 otherwise).
///
/// # Safety
/// `groups` is pinned and mapped for the call.
unsafe fn program_table(p: &DeviceProgram<'_>, groups: &DeviceSeg<'_>) -> Result<groups::Header> {
    if p.joins.len() > MAX_JOINS || p.keys.len() > MAX_KEYS || p.aggs.len() > MAX_AGGS {
        return Err(UvmError::new(
            Code::InvalidParameterValue,
            format!("a GPU scan program has at most {MAX_JOINS} joins, {MAX_KEYS} group keys and {MAX_AGGS} aggregates"),
        ));
    }
    // SAFETY: forwarded contract (the min with its size).
    let prefix = unsafe { read(groups.addr, Head::PREFIX_BYTES.min(groups.len) as usize) }?;
    let head = Head::parse(groups.name, &prefix, groups.len)?;
    let kinds: Vec<AggKind> = p.aggs.iter().map(|a| a.0).collect();
    if u64::from(head.header().key_words) != p.keys.len() as u64 + 1 || head.aggs() != kinds.as_slice() {
        return Err(UvmError::new(
            Code::InvalidParameterValue,
            "the group table does not have the program's keys and aggregates",
        ));
    }
    Ok(*head.header())
}

/// Runs the program `p` over the cache `cache` from row `start.1` of block `start.0` on,
/// folding into the group table `groups` (as `super::run` does on the CPU; see the module's
/// essay for how a full table resumes). `max_groups`: the most distinct keys the program can
/// make (0: unknown); where the table takes them all, each launch is one pass.
///
/// Adds the nanoseconds of the scan's launches to `*launch_ns`.
///
/// # Safety
/// Every segment (the cache, the group table, each dimension table) is pinned and mapped for
/// the call, `addr` and `len` its whole range in device-accessible memory; the group table is
/// none of the others.
pub unsafe fn run(
    k: &Kernels,
    p: &DeviceProgram<'_>,
    cache: &DeviceSeg<'_>,
    groups: &DeviceSeg<'_>,
    start: (u64, u64),
    max_groups: u64,
    launch_ns: &mut u64,
) -> Result<Progress> {
    // SAFETY: forwarded contract.
    let layout = unsafe { layout(cache) }?;
    let join_cols: Vec<usize> = p.joins.iter().map(|j| j.0).collect();
    check_parts(&layout, p.filters, &join_cols, p.keys, p.aggs)?;
    // SAFETY: forwarded contract.
    let h = unsafe { program_table(p, groups) }?;
    // SAFETY: forwarded contract.
    let dims = p.joins.iter().map(|(_, d)| unsafe { dimension(k, d) }).collect::<Result<Vec<_>>>()?;
    let prog: Vec<i64> = words(&layout, p, &dims).into_iter().map(|w| w as i64).collect();
    let staged = k.staging(prog.len() * 8)?;
    k.stage(0, &prog)?;
    let c = layout.header();
    let per = (LAUNCH_ROWS / c.block_rows.max(1)).max(1);
    let mut params = ScanGroupsPass {
        prog: Ptr::new(staged),
        base: Ptr::new(0),
        n: c.block_rows,
        blocks: 0,
        stride: c.block_bytes,
        first_row: 0,
        slots: MutPtr::new(groups.addr + h.slots_at),
        mask: h.slot_count - 1,
        seed: h.seed,
        key_words: u64::from(h.key_words),
        slot_words: h.slot_bytes / 8,
        groups: MutPtr::new(groups.addr + std::mem::offset_of!(groups::Header, groups) as u64),
        limit: h.slot_count / 2,
        mode: 0,
        out: k.result_ptr(),
    };
    // One pass per launch where the table cannot refuse a key: the program's distinct keys,
    // all of them, fit under its load limit (the module's essay).
    let passes: &[u64] = if max_groups != 0 && max_groups <= params.limit { &[2] } else { &[0, 1] };
    let mut first = start.0;
    while first < c.blocks {
        crate::interrupt::check()?;
        let count = per.min(c.blocks - first);
        params.base = Ptr::new(cache.addr + c.data_offset + first * c.block_bytes);
        params.blocks = count;
        params.first_row = if first == start.0 { start.1 } else { 0 };
        for &mode in passes {
            params.mode = mode;
            k.result().set_bytes(0, 48)?;
            let t = std::time::Instant::now();
            // SAFETY: the kernel reads the program's words (staged above: nothing else stages
            // during the call), the launch's blocks (inside the cache: Layout::parse bounded
            // them), each dimension table's slots (parse_header bounded them; every walk at most
            // its longest run plus one), and reads and writes the group table's slots and its
            // count (Head::parse bounded the slot_count slots inside the segment; every walk at
            // most slot_count slots) and 6 words of our result buffer.
            unsafe { k.launch(k.segment().uvm_scan_groups(), params) }?;
            *launch_ns += t.elapsed().as_nanos() as u64;
            let mut out = [0u64; 6];
            k.result().read(&mut out)?;
            outcome(&out, groups.name)?;
            if mode == 2 && out[1] != 0 {
                return Err(UvmError::new(
                    Code::SystemError,
                    format!(
                        "group table in segment \"{}\" refused a key of a program said to make at most {max_groups}",
                        groups.name
                    ),
                ));
            }
            if mode == 0 && out[1] != 0 {
                // Refused for want of room: the table's groups now, and room for at least as
                // many again (or for those refused, where fewer).
                // SAFETY: the count's word lies in the group table's header (checked above).
                let now = unsafe { read(params.groups.addr(), 8) }?;
                let now = u64::from_le_bytes(now.try_into().expect("8 bytes")).min(h.slot_count / 2);
                let want = now.saturating_add(out[1].min(now.max(1024)));
                let slots = groups::Shape::slots_for(want).max(h.slot_count.saturating_mul(2));
                return Ok(Progress::Full { block: first, row: params.first_row, slots });
            }
        }
        first += count;
    }
    Ok(Progress::Done)
}

/// Inserts the pairs of `crate::scan::build` into the GpuJoin table whose first byte is at
/// `table.0`, of `table.1` slots (begun by `BuildBegin`, seed 0), from the rows of the cache
/// `cache` that pass the program `p` (no joins) and the group table `groups` of the same
/// program run before; returns the pairs inserted. Adds the launches' nanoseconds to
/// `*launch_ns`.
///
/// # Safety
/// As for [`run`], and the table's `HEADER_BYTES + slot_count` slots lie in a pinned segment
/// none of the others.
pub unsafe fn build(
    k: &Kernels,
    p: &DeviceProgram<'_>,
    key_col: usize,
    cache: &DeviceSeg<'_>,
    groups: &DeviceSeg<'_>,
    table: (u64, u64),
    launch_ns: &mut u64,
) -> Result<u64> {
    // SAFETY: forwarded contract.
    let layout = unsafe { layout(cache) }?;
    if !p.joins.is_empty() {
        return Err(UvmError::new(Code::InvalidParameterValue, "a dimension's build program has no joins"));
    }
    super::check_build(&layout, p.filters, p.keys, p.aggs, key_col)?;
    // SAFETY: forwarded contract.
    let h = unsafe { program_table(p, groups) }?;
    let prog: Vec<i64> = words(&layout, p, &[]).into_iter().map(|w| w as i64).collect();
    let staged = k.staging(prog.len() * 8)?;
    k.stage(0, &prog)?;
    let c = layout.header();
    let per = (LAUNCH_ROWS / c.block_rows.max(1)).max(1);
    let capacity = table.1 / 2;
    let mut params = ScanBuildPass {
        prog: Ptr::new(staged),
        base: Ptr::new(0),
        n: c.block_rows,
        blocks: 0,
        stride: c.block_bytes,
        slots: MutPtr::new(groups.addr + h.slots_at),
        mask: h.slot_count - 1,
        seed: h.seed,
        key_words: u64::from(h.key_words),
        slot_words: h.slot_bytes / 8,
        key_col: key_col as u64,
        tslots: MutPtr::new(table.0 + table::HEADER_BYTES),
        tmask: table.1 - 1,
        tseed: 0,
        limit: 0,
        out: k.result_ptr(),
    };
    let mut inserted = 0u64;
    let mut first = 0;
    while first < c.blocks {
        crate::interrupt::check()?;
        let count = per.min(c.blocks - first);
        params.base = Ptr::new(cache.addr + c.data_offset + first * c.block_bytes);
        params.blocks = count;
        params.limit = capacity - inserted;
        k.result().set_bytes(0, 48)?;
        let t = std::time::Instant::now();
        // SAFETY: the kernel reads the program's words (staged above), the launch's blocks
        // (inside the cache: Layout::parse bounded them) and the group table's slots (Head::parse
        // bounded them; every walk at most slot_count slots), writes the join table's slots
        // (inside its segment: contract; every walk at most tmask + 1 slots) and 6 words of our
        // result buffer.
        unsafe { k.launch(k.segment().uvm_scan_build(), params) }?;
        *launch_ns += t.elapsed().as_nanos() as u64;
        let mut out = [0u64; 6];
        k.result().read(&mut out)?;
        outcome(&out, groups.name)?;
        if out[4] != 0 {
            return Err(if out[1] > params.limit {
                super::built_past(capacity)
            } else {
                table::corrupted("a dimension's join table", &format!("a build found no empty slot in {} slots", table.1))
            });
        }
        inserted += out[1];
        first += count;
    }
    Ok(inserted)
}

/// `n` zeroed bytes of host memory for a copy of group table `name`: 53200 where they cannot be
/// had (a failed allocation must not abort the GPU service).
fn host_bytes(n: u64, name: &str) -> Result<Vec<u8>> {
    let mut v = Vec::new();
    usize::try_from(n)
        .ok()
        .and_then(|n| v.try_reserve_exact(n).ok().map(|_| n))
        .map(|n| v.resize(n, 0))
        .ok_or_else(|| UvmError::new(Code::OutOfMemory, format!("no {n} bytes of host memory to grow group table \"{name}\"")))?;
    Ok(v)
}

/// Moves the groups of the table in `from` into `to`, made a table of `slot_count` slots
/// (`groups::grow`), where both lie in device memory: through copies, the groups moved on the
/// CPU (a table is a few bytes a group), the new table primed for the kernels
/// (`groups::Table::prime`). Returns the groups moved.
///
/// # Safety
/// Both segments are pinned and mapped for the call, `addr` and `len` their whole ranges, and
/// this thread's CUDA context is current.
pub unsafe fn grow(from: &DeviceSeg<'_>, to: &DeviceSeg<'_>, slot_count: u64) -> Result<u64> {
    // SAFETY: inside the pinned `from` (the min with its size).
    let prefix = unsafe { read(from.addr, Head::PREFIX_BYTES.min(from.len) as usize) }?;
    let head = Head::parse(from.name, &prefix, from.len)?;
    let shape =
        groups::Shape { key_words: head.header().key_words, aggs: head.aggs().to_vec(), slot_count: head.header().slot_count };
    let mut old = host_bytes(shape.bytes(), from.name)?;
    // SAFETY: Head::parse checked that the table's bytes lie inside the segment.
    unsafe { crate::gpu::copy(old.as_mut_ptr() as u64, from.addr, old.len()) }?;
    let bigger = shape.with_slots(slot_count).bytes();
    if bigger > to.len {
        return Err(UvmError::new(
            Code::InvalidParameterValue,
            format!("a group table of {slot_count} slots needs {bigger} bytes, segment \"{}\" has {}", to.name, to.len),
        ));
    }
    let mut new = host_bytes(bigger, to.name)?;
    let mut from_table = groups::Table::parse(from.name, &mut old)?;
    groups::grow(&mut from_table, &mut new, slot_count)?;
    let moved = from_table.header().groups;
    groups::Table::parse(to.name, &mut new)?.prime()?;
    // SAFETY: `new` fits the pinned `to` (checked above).
    unsafe { crate::gpu::copy(to.addr, new.as_ptr() as u64, new.len()) }?;
    Ok(moved)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::{ColumnSpec, Encoding};
    use crate::scan::expr::{Cmp, Compare, Op, Width};

    /// The words a program becomes are the layout `segment.cu` reads: counts, then offsets that
    /// tile the words in order, each part as documented there.
    #[test]
    fn program_words_are_the_kernels_layout() {
        let spec = |encoding| ColumnSpec { encoding, attnum: 1, scale: 0 };
        let layout = Layout::plan(1, &[spec(Encoding::Int4), spec(Encoding::Int8), spec(Encoding::DictCode)], 1024).unwrap();
        let cmp = Compare {
            lhs: vec![Step::Col(0), Step::Const(5), Step::Bin(Op::Add, Width::Int4)],
            cmp: Cmp::Lt,
            rhs: vec![Step::Col(1)],
        };
        let filters = vec![
            Filter::and(0, Test::Range { lo: -3, hi: 9 }),
            Filter::and(2, Test::Codes(vec![0b101, 0, 0x80])),
            Filter::or(2, Test::Null),
            Filter::and(0, Test::Compare(cmp)),
        ];
        let keys = [Source::Col(2), Source::Payload(0)];
        let aggs =
            [(AggKind::CountStar, Input::Star), (AggKind::SumInt, Input::Mul(0, 1)), (AggKind::MinFloat, Input::Float4(2))];
        let p = DeviceProgram {
            filters: &filters,
            joins: vec![(1, DeviceSeg { name: "d", addr: 0, len: 0 })],
            keys: &keys,
            aggs: &aggs,
        };
        let w = words(&layout, &p, &[[0x1000, 63, 77, 5]]);
        assert_eq!(&w[..7], &[4, 1, 2, 3, 3, 4, 3]);
        let at: Vec<usize> = w[7..14].iter().map(|&x| x as usize).collect();
        assert_eq!(at[0], 14);
        // columns, filters, steps, joins, keys, aggregates: each part right after the one before
        assert_eq!(
            [at[1] - at[0], at[2] - at[1], at[3] - at[2], at[4] - at[3], at[5] - at[4], at[6] - at[5]],
            [12, 16, 8, 5, 2, 6]
        );
        assert_eq!(w.len(), at[6] + 1, "the 3 bitmap bytes in one word");
        let col = |c: usize| &w[at[0] + 4 * c..at[0] + 4 * c + 4];
        assert_eq!((col(0)[2], col(0)[3], col(1)[2], col(2)[2], col(2)[3]), (4, 1, 8, 4, 0), "widths, signed");
        assert_eq!(col(1)[0], layout.columns()[1].values_at);
        let f = |i: usize| &w[at[1] + 4 * i..at[1] + 4 * i + 4];
        assert_eq!(f(0), &[1 << 32, -3i64 as u64, 9, 0]);
        assert_eq!(f(1), &[2 | 2 << 32, 0, 3, 0]);
        assert_eq!(f(2)[0], 2 | 3 << 32 | 1 << 40, "an alternative of the one before");
        assert_eq!(f(3), &[4 << 32, 0, 3 | 1 << 16, 0], "steps from 0: 3 on the left, 1 on the right, <");
        assert_eq!(&w[at[2]..at[3]], &[1, 0, 2, 5, 3 | 1 << 8 | 4 << 16, 0, 1, 1]);
        assert_eq!(&w[at[3]..at[4]], &[1, 0x1000, 63, 77, 5]);
        assert_eq!(&w[at[4]..at[5]], &[1 << 32 | 2, 2 << 32]);
        assert_eq!(&w[at[5]..at[6]], &[1, 0, 3 | 3 << 16, 1 << 32, 7 | 4 << 16, 2]);
        assert_eq!(w[at[6]], 0x80_00_05);
    }
}

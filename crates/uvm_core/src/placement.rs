//! Placement: which GPU a device chunk lives on, and which GPU runs a request.
//!
//! # Design
//!
//! A device chunk lives on one GPU (`Place::Device(n)`); a segment's chunks may lie on several.
//! The device budget (`pg_uvm_share.device_memory_limit`) applies to each GPU on its own, and
//! the registry keeps the committed bytes of every GPU, so every decision here is a pure
//! function of those numbers, the request and the budget. This module is plain Rust: it knows
//! nothing of PostgreSQL, the registry's layout or CUDA, so its rules are unit- and
//! property-tested on any machine, and the same code decides under the host provider's
//! simulated GPUs (CI) and under CUDA.
//!
//! The rules (README, "Several GPUs"):
//!
//! - **`auto`**: the GPU with the most room left in its budget (ties: the one with fewer bytes,
//!   then the lower ordinal). A chunk that does not fit whole is cut at that GPU's budget; once no
//!   GPU has room, chunks go to the host tier.
//! - **`device`**: the same GPU choice, chunk by chunk, so a segment larger than one GPU's budget
//!   spreads over several: a chunk is cut at the chosen GPU's room and the rest goes on the next
//!   chunk, to the next GPU. A chunk that would not fit in the room of all GPUs together is
//!   refused (53400).
//! - **`device:N`**: GPU N only; a chunk past its budget is refused (53400), and a GPU the
//!   provider does not have is 22023.
//! - **`host`**: the host tier.
//! - **Migration** (`prefetch_segment`) moves whole chunks: each goes to the GPU the target
//!   names, or for `device` to the GPU with the most room that holds it whole. The whole move is
//!   planned before any chunk moves, so a migration refused for budget moves nothing.
//! - **Routing a request**: to the GPU that holds most of the bytes it reads (its kernel then
//!   reads locally, not over the interconnect), else to the least loaded GPU; but when that
//!   GPU has [`ROUTE_MARGIN`] more requests queued or running than the least loaded one, to the
//!   least loaded, which reads the data over the interconnect (many sessions probing one inner
//!   table spread over the GPUs instead of queueing on one).
//!
//! "Room" is the budget minus the GPU's committed bytes, in whole granules; with no budget a
//! GPU's room is unbounded (the provider's own out-of-memory then decides, and an `auto` chunk
//! spills to the host tier).

use crate::error::{Code, Result};
use crate::uvm_err;
use crate::vocab::{Place, TierPref};

/// One GPU as placement sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gpu {
    /// Device bytes on this GPU, all segments together (committed or being allocated).
    pub used: u64,
    /// The device budget of this GPU (None: unbounded).
    pub budget: Option<u64>,
}

impl Gpu {
    /// Bytes that still fit under the budget, in whole granules (None: unbounded).
    fn room(&self, granularity: u64) -> Option<u64> {
        self.budget.map(|b| b.saturating_sub(self.used) / granularity * granularity)
    }
    fn fits(&self, size: u64, granularity: u64) -> bool {
        self.room(granularity).is_none_or(|r| r >= size)
    }
}

/// The GPU with the most room (unbounded first), then the fewest bytes, then the lowest ordinal.
fn roomiest(gpus: &[Gpu], granularity: u64) -> Option<usize> {
    (0..gpus.len()).max_by(|&a, &b| {
        let key = |i: usize| {
            (gpus[i].room(granularity).map_or(u128::MAX, u128::from), std::cmp::Reverse(gpus[i].used), std::cmp::Reverse(i))
        };
        key(a).cmp(&key(b))
    })
}

fn over_budget(what: String, gpus: &[Gpu], granularity: u64) -> crate::error::UvmError {
    let budget = gpus.first().and_then(|g| g.budget).unwrap_or(0);
    let free: u64 = gpus.iter().map(|g| g.room(granularity).unwrap_or(0)).sum();
    uvm_err!(
        Code::ConfigurationLimitExceeded,
        "{what} would exceed pg_uvm_share.device_memory_limit ({budget} bytes per GPU, {free} bytes free on {} GPU(s))",
        gpus.len()
    )
    .hint("Use tier \"auto\" to spill to the host tier, or raise pg_uvm_share.device_memory_limit.")
}

fn no_such_gpu(n: u32, gpus: &[Gpu]) -> crate::error::UvmError {
    uvm_err!(Code::InvalidParameterValue, "tier \"device:{n}\" names a GPU the cluster does not have")
        .detail(format!("The provider has {} GPU(s), numbered from 0.", gpus.len()))
}

/// Where a new chunk of `size` bytes goes under `pref`, and how many of its bytes (a chunk may
/// be cut at a GPU's budget; the caller adds the rest as further chunks). `gpus` are the
/// provider's GPUs in ordinal order; a preference for the device tier with no GPU is the
/// caller's to refuse (it knows the provider), and here falls back on nothing: 0A000 is not
/// placement's word.
pub fn place_chunk(pref: TierPref, size: u64, gpus: &[Gpu], granularity: u64) -> Result<(Place, u64)> {
    let best = roomiest(gpus, granularity);
    let room = |i: usize| gpus[i].room(granularity).unwrap_or(u64::MAX);
    match pref {
        TierPref::Host | TierPref::Cpu => Ok((Place::Host, size)),
        TierPref::Auto => Ok(match best {
            None => (Place::Host, size),
            Some(g) if room(g) >= size => (Place::Device(g as u32), size),
            Some(g) if room(g) > 0 => (Place::Device(g as u32), room(g)),
            Some(_) => (Place::Host, size),
        }),
        TierPref::Device => {
            let Some(g) = best else { return Err(no_such_gpu(0, gpus)) };
            if room(g) >= size {
                return Ok((Place::Device(g as u32), size));
            }
            let total = gpus.iter().map(|x| x.room(granularity).unwrap_or(u64::MAX)).fold(0u64, u64::saturating_add);
            if total >= size && room(g) > 0 {
                Ok((Place::Device(g as u32), room(g)))
            } else {
                Err(over_budget(format!("a {size}-byte device chunk"), gpus, granularity))
            }
        }
        TierPref::DeviceOn(n) => {
            let Some(gpu) = gpus.get(n as usize) else { return Err(no_such_gpu(n, gpus)) };
            if gpu.fits(size, granularity) {
                Ok((Place::Device(n), size))
            } else {
                Err(over_budget(format!("a {size}-byte chunk on GPU {n}"), gpus, granularity))
            }
        }
    }
}

/// Whether a chunk of `size` bytes fits GPU `n`'s budget now (a migration checks each chunk
/// again as it reserves it: see `plan_moves`).
pub fn fits(gpus: &[Gpu], n: u32, size: u64, granularity: u64) -> bool {
    gpus.get(n as usize).is_some_and(|g| g.fits(size, granularity))
}

/// Plans a migration to `target` (not `auto`) of chunks at `from` of `sizes`: where each goes.
/// Chunks move whole. A chunk already where `target` wants it stays (`None`); the budget counts
/// the bytes each move adds to a GPU and those it frees on another, in order. All or nothing:
/// a move that does not fit refuses the whole plan. (The migration checks each chunk's room
/// again as it reserves it, with `fits`: room other sessions took meanwhile stops it at that
/// chunk, the chunks before it moved.)
pub fn plan_moves(target: TierPref, chunks: &[(Place, u64)], gpus: &[Gpu], granularity: u64) -> Result<Vec<Option<Place>>> {
    let mut gpus = gpus.to_vec();
    let mut plan = Vec::with_capacity(chunks.len());
    for &(from, size) in chunks {
        if target.holds(from) {
            plan.push(None);
            continue;
        }
        let to = match target {
            TierPref::Host | TierPref::Auto | TierPref::Cpu => Place::Host,
            TierPref::DeviceOn(n) => {
                let Some(gpu) = gpus.get(n as usize) else { return Err(no_such_gpu(n, &gpus)) };
                if !gpu.fits(size, granularity) {
                    return Err(over_budget(format!("moving a {size}-byte chunk to GPU {n}"), &gpus, granularity));
                }
                Place::Device(n)
            }
            TierPref::Device => match roomiest(&gpus, granularity) {
                Some(g) if gpus[g].fits(size, granularity) => Place::Device(g as u32),
                Some(_) => return Err(over_budget(format!("moving a {size}-byte chunk to the device tier"), &gpus, granularity)),
                None => return Err(no_such_gpu(0, &gpus)),
            },
        };
        if let Place::Device(n) = from {
            if let Some(g) = gpus.get_mut(n as usize) {
                g.used = g.used.saturating_sub(size);
            }
        }
        if let Place::Device(n) = to {
            gpus[n as usize].used += size;
        }
        plan.push(Some(to));
    }
    Ok(plan)
}

/// How many more requests (queued or running) the GPU holding a request's data may have than
/// the least loaded GPU before the request goes to the least loaded one instead. A first guess,
/// to be measured on two GPUs (NVLink reads against queueing).
pub const ROUTE_MARGIN: u32 = 2;

/// The GPU a request runs on: the one holding most of the bytes it reads (`bytes[g]`), else
/// (it reads nothing on any GPU) the least loaded (`load[g]`: requests running or queued there),
/// ties to the lower ordinal; the least loaded one, too, when the first has `margin` more
/// requests than it. `bytes` and `load` have one entry per GPU; there is at least one.
pub fn route(bytes: &[u64], load: &[u32], margin: u32) -> usize {
    debug_assert_eq!(bytes.len(), load.len());
    let n = bytes.len().min(load.len()).max(1);
    let load_of = |g: usize| load.get(g).copied().unwrap_or(0);
    let idlest = (0..n).min_by_key(|&g| (load_of(g), g)).unwrap_or(0);
    if !bytes.iter().any(|&b| b > 0) {
        return idlest;
    }
    let home = (0..n)
        .max_by_key(|&g| (bytes.get(g).copied().unwrap_or(0), std::cmp::Reverse(load_of(g)), std::cmp::Reverse(g)))
        .unwrap_or(0);
    if load_of(home) >= load_of(idlest).saturating_add(margin) {
        idlest
    } else {
        home
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const G: u64 = 2 << 20;

    fn gpus(used: &[u64], budget: Option<u64>) -> Vec<Gpu> {
        used.iter().map(|&u| Gpu { used: u, budget }).collect()
    }

    #[test]
    fn auto_takes_the_roomiest_gpu_cuts_at_its_budget_then_spills() {
        let g = gpus(&[4 * G, 2 * G], Some(8 * G));
        assert_eq!(place_chunk(TierPref::Auto, 2 * G, &g, G).unwrap(), (Place::Device(1), 2 * G));
        assert_eq!(place_chunk(TierPref::Auto, 10 * G, &g, G).unwrap(), (Place::Device(1), 6 * G));
        let full = gpus(&[8 * G, 8 * G], Some(8 * G));
        assert_eq!(place_chunk(TierPref::Auto, G, &full, G).unwrap(), (Place::Host, G));
        // no GPU: the host tier
        assert_eq!(place_chunk(TierPref::Auto, G, &[], G).unwrap(), (Place::Host, G));
        // no budget: the GPU with fewer bytes, ties to the lower ordinal
        assert_eq!(place_chunk(TierPref::Auto, G, &gpus(&[4 * G, 2 * G], None), G).unwrap(), (Place::Device(1), G));
        assert_eq!(place_chunk(TierPref::Auto, G, &gpus(&[0, 0], None), G).unwrap(), (Place::Device(0), G));
    }

    #[test]
    fn device_spreads_a_chunk_over_gpus_and_refuses_what_no_gpu_holds() {
        let g = gpus(&[0, 0], Some(8 * G));
        // 12 granules: 8 on GPU 0 now, the rest on the next chunk
        assert_eq!(place_chunk(TierPref::Device, 12 * G, &g, G).unwrap(), (Place::Device(0), 8 * G));
        let g = gpus(&[8 * G, 0], Some(8 * G));
        assert_eq!(place_chunk(TierPref::Device, 4 * G, &g, G).unwrap(), (Place::Device(1), 4 * G));
        let e = place_chunk(TierPref::Device, 17 * G, &gpus(&[0, 0], Some(8 * G)), G).unwrap_err();
        assert_eq!(e.code, Code::ConfigurationLimitExceeded);
        assert!(e.message.contains("2 GPU(s)"), "{}", e.message);
    }

    #[test]
    fn device_n_is_that_gpu_or_an_error() {
        let g = gpus(&[0, 6 * G], Some(8 * G));
        assert_eq!(place_chunk(TierPref::DeviceOn(1), 2 * G, &g, G).unwrap(), (Place::Device(1), 2 * G));
        assert_eq!(place_chunk(TierPref::DeviceOn(1), 4 * G, &g, G).unwrap_err().code, Code::ConfigurationLimitExceeded);
        assert_eq!(place_chunk(TierPref::DeviceOn(2), G, &g, G).unwrap_err().code, Code::InvalidParameterValue);
        assert_eq!(place_chunk(TierPref::Host, G, &g, G).unwrap(), (Place::Host, G));
    }

    #[test]
    fn migration_plans_are_all_or_nothing_and_count_freed_bytes() {
        let g = gpus(&[6 * G, 0], Some(8 * G));
        // moving GPU 0's chunks to GPU 1 frees GPU 0 as it goes
        let chunks = [(Place::Device(0), 4 * G), (Place::Device(0), 2 * G), (Place::Host, 2 * G)];
        let plan = plan_moves(TierPref::DeviceOn(1), &chunks, &g, G).unwrap();
        assert_eq!(plan, vec![Some(Place::Device(1)), Some(Place::Device(1)), Some(Place::Device(1))]);
        // one more granule than GPU 1 holds: nothing moves
        let chunks = [(Place::Host, 4 * G), (Place::Host, 5 * G)];
        assert_eq!(plan_moves(TierPref::DeviceOn(1), &chunks, &g, G).unwrap_err().code, Code::ConfigurationLimitExceeded);
        // `device`: chunks already on a GPU stay; the others go where they fit whole
        let chunks = [(Place::Device(0), 4 * G), (Place::Host, 4 * G), (Place::Host, 4 * G)];
        let plan = plan_moves(TierPref::Device, &chunks, &g, G).unwrap();
        assert_eq!(plan, vec![None, Some(Place::Device(1)), Some(Place::Device(1))]);
        let plan = plan_moves(TierPref::Host, &chunks, &g, G).unwrap();
        assert_eq!(plan, vec![Some(Place::Host), None, None]);
        assert_eq!(plan_moves(TierPref::DeviceOn(3), &chunks, &g, G).unwrap_err().code, Code::InvalidParameterValue);
    }

    #[test]
    fn requests_go_where_their_data_is_else_to_the_idlest_gpu() {
        assert_eq!(route(&[0, 5], &[0, 1], 2), 1);
        assert_eq!(route(&[3, 3], &[2, 1], 2), 1);
        assert_eq!(route(&[0, 0, 0], &[2, 0, 0], 2), 1);
        assert_eq!(route(&[0], &[7], 2), 0);
        // the data's GPU is busy: two more requests than the idlest, which takes this one
        assert_eq!(route(&[0, 5], &[0, 2], 2), 0);
        assert_eq!(route(&[0, 5], &[1, 2], 2), 1);
        // a margin of u32::MAX never gives a request away
        assert_eq!(route(&[0, 5], &[0, 90], u32::MAX), 1);
    }

    proptest! {
        /// Whatever the GPUs' state and the request, a placement never passes a GPU's budget,
        /// never names a GPU that does not exist, and never places more bytes than asked.
        #[test]
        fn placements_respect_every_budget(
            used in prop::collection::vec(0u64..20, 1..5),
            budget in prop::option::of(1u64..24),
            size in 1u64..40,
            pref in 0u32..5,
        ) {
            let g: Vec<Gpu> = used.iter().map(|&u| Gpu { used: u * G, budget: budget.map(|b| b * G) }).collect();
            let pref = match pref { 0 => TierPref::Auto, 1 => TierPref::Host, 2 => TierPref::Device, n => TierPref::DeviceOn(n - 3) };
            match place_chunk(pref, size * G, &g, G) {
                Ok((place, bytes)) => {
                    prop_assert!(bytes > 0 && bytes <= size * G);
                    if let Place::Device(n) = place {
                        let gpu = g[n as usize];
                        prop_assert!(gpu.budget.is_none_or(|b| gpu.used + bytes <= b));
                        if !matches!(pref, TierPref::DeviceOn(_)) {
                            // the roomiest GPU (unbounded rooms are all equal)
                            prop_assert!(gpu.room(G).is_none_or(|r| g.iter().all(|o| o.room(G).is_some_and(|x| x <= r))));
                        }
                    } else {
                        prop_assert!(matches!(pref, TierPref::Auto | TierPref::Host));
                    }
                    if pref != TierPref::Auto && pref != TierPref::Device {
                        prop_assert_eq!(bytes, size * G);
                    }
                }
                Err(e) => prop_assert!(matches!(e.code, Code::ConfigurationLimitExceeded | Code::InvalidParameterValue)),
            }
        }
    }
}

//! A property test of the segment system against a simple model of the registry (issue 8,
//! point 6): random sequences of create / grow / grow_at_least / pin / unpin / pin_session /
//! unpin_session / drop / prefetch (migration) / process exit, run by several managers standing
//! in for processes over one registry and one real broker, as `tests.rs` does.
//!
//! The provider is the host provider simulating two GPUs: memfds in both tiers, each named after
//! its place (host, device:0, device:1), so that a migration really moves a chunk to a new memfd
//! of its new place and the invariants can ask the broker's fd itself where a chunk is.
//!
//! After every step:
//! - the registry, the broker and the model agree on the chunks: every chunk of every segment has
//!   a distinct id, the broker holds exactly one fd per registry chunk (none lost, none left over,
//!   none doubled), and that fd is a memfd of the chunk's size and tier;
//! - per-tier and per-GPU byte totals are exact (the registry's totals equal the sums over the
//!   chunks), and no GPU passes its budget;
//! - the chunks tile each segment, which covers its size;
//! - pin counts are never negative and equal the model's, per segment and per process;
//! - sizes and generations never go down; the names and sizes are the model's;
//! - a drop is refused (55006) exactly when the segment is pinned, a migration (55P03) too;
//! - bytes written through pins read back the same in every process, across growth and
//!   migration, and through a pin held across its process's exit.
//!
//! CI runs 64 cases of at most 40 steps (a few seconds). For a long run:
//! `PROPTEST_CASES=5000 cargo test -p pg_uvm_share --lib segment::model_tests`.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;

use super::tests::{ok, TestEnv, World};
use super::*;
use crate::provider::host::HostProvider;
use crate::registry::{Arena, Capacity};

const MIB: u64 = 1 << 20;
const PROCESSES: usize = 3;
const NAMES: [&str; 3] = ["s0", "s1", "s2"];
/// Device-tier budget of each GPU: small, so that `auto` segments spread and spill and
/// prefetches hit it.
const DEVICE_LIMIT: u64 = 12 * MIB;

/// The host pool: four pieces of one granule, so that migrations to the host tier take pieces
/// (and cut chunks into them) and migrations to a GPU give them back.
const POOL_SIZE: u64 = 8 * MIB;
const POOL_PIECE: u64 = 2 * MIB;

/// GPUs of the simulated provider: two, so that placement and migration between GPUs are part
/// of every run.
const GPUS: u32 = 2;

/// The place and size of a chunk fd, from its memfd name (the host provider names each after
/// its place) and its size.
fn fd_place_and_size(fd: &OwnedFd) -> (Place, u64) {
    let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap();
    let link = link.to_string_lossy();
    let place = if link.contains("pg_uvm_share host chunk") {
        Place::Host
    } else {
        let n = (0..GPUS).find(|n| link.contains(&format!("pg_uvm_share device:{n} chunk")));
        Place::Device(n.unwrap_or_else(|| panic!("not a chunk memfd: {link}")))
    };
    // SAFETY: all-zero is a valid stat; fstat fills it for a live fd.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    assert_eq!(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) }, 0);
    (place, st.st_size as u64)
}

#[derive(Clone, Debug)]
enum Op {
    /// `pref`: 0 auto, 1 host, 2 device (any GPU), 3 + n device:n.
    Create {
        p: usize,
        seg: usize,
        size_kib: u64,
        extra_mib: u64,
        pref: u32,
    },
    Grow {
        p: usize,
        seg: usize,
        by_kib: u64,
    },
    GrowAtLeast {
        p: usize,
        seg: usize,
        to_kib: u64,
    },
    Pin {
        p: usize,
        seg: usize,
        at: u16,
        value: u8,
    },
    Unpin {
        p: usize,
        which: usize,
    },
    PinSession {
        p: usize,
        seg: usize,
    },
    UnpinSession {
        p: usize,
        seg: usize,
    },
    Drop {
        p: usize,
        seg: usize,
    },
    /// `to`: 0 host, 1 device (any GPU), 2 + n device:n.
    Prefetch {
        p: usize,
        seg: usize,
        from: u16,
        len: u16,
        to: u32,
    },
    Exit {
        p: usize,
    },
    /// One step of the GPU service's host pool filler (`Segments::pool_step`).
    PoolStep {
        p: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let p = 0..PROCESSES;
    let seg = 0..NAMES.len();
    prop_oneof![
        4 => (p.clone(), seg.clone(), 1..12_000u64, 0..24u64, 0..3 + GPUS)
            .prop_map(|(p, seg, size_kib, extra_mib, pref)| Op::Create { p, seg, size_kib, extra_mib, pref }),
        2 => (p.clone(), seg.clone(), 0..9_000u64).prop_map(|(p, seg, by_kib)| Op::Grow { p, seg, by_kib }),
        1 => (p.clone(), seg.clone(), 0..30_000u64).prop_map(|(p, seg, to_kib)| Op::GrowAtLeast { p, seg, to_kib }),
        3 => (p.clone(), seg.clone(), any::<u16>(), any::<u8>()).prop_map(|(p, seg, at, value)| Op::Pin { p, seg, at, value }),
        2 => (p.clone(), any::<usize>()).prop_map(|(p, which)| Op::Unpin { p, which }),
        1 => (p.clone(), seg.clone()).prop_map(|(p, seg)| Op::PinSession { p, seg }),
        1 => (p.clone(), seg.clone()).prop_map(|(p, seg)| Op::UnpinSession { p, seg }),
        2 => (p.clone(), seg.clone()).prop_map(|(p, seg)| Op::Drop { p, seg }),
        3 => (p.clone(), seg.clone(), any::<u16>(), any::<u16>(), 0..2 + GPUS)
            .prop_map(|(p, seg, from, len, to)| Op::Prefetch { p, seg, from, len, to }),
        1 => p.prop_map(|p| Op::Exit { p }),
        2 => (0..PROCESSES).prop_map(|p| Op::PoolStep { p }),
    ]
}

/// What the model knows about one segment.
#[derive(Debug)]
struct ModelSeg {
    id: u64,
    size: u64,
    max_size: u64,
    /// The highest generation seen (generations never go down).
    generation: u64,
    /// Bytes written through pins: offset -> value.
    bytes: BTreeMap<u64, u8>,
    /// Created for the device tier only (`device`, `device:N`): growth past the GPUs' budgets
    /// is refused (53400) rather than spilled.
    device_only: bool,
}

fn pref_of(code: u32) -> TierPref {
    match code {
        0 => TierPref::Auto,
        1 => TierPref::Host,
        2 => TierPref::Device,
        n => TierPref::DeviceOn(n - 3),
    }
}

/// One process: its manager, the pin guards it holds, and its session pins per segment name.
struct Proc {
    segs: Segments<TestEnv>,
    pins: Vec<(String, Pin<TestEnv>)>,
    sessions: HashMap<String, u32>,
    pid: i32,
}

struct Harness {
    world: Arc<World>,
    procs: Vec<Proc>,
    model: BTreeMap<String, ModelSeg>,
}

fn limits() -> Limits {
    Limits {
        min_chunk: 2 * MIB,
        max_segment_size: 64 * MIB,
        device_limit: Some(DEVICE_LIMIT),
        // A pinned segment's migration gives up after this: short, for a quick test.
        pin_wait: Duration::from_millis(3),
        pool_size: POOL_SIZE,
        pool_piece: POOL_PIECE,
    }
}

impl Harness {
    fn new() -> Harness {
        let cap = Capacity { max_segments: 8, max_chunks: 128, max_attachments: 64 };
        let world = World::with_capacity("model", Arena::default(), cap);
        let procs = (0..PROCESSES)
            .map(|i| {
                let pid = 100 + i as i32;
                let segs = Segments::new(TestEnv::new(&world, pid), Box::new(HostProvider::simulating(GPUS)), limits());
                Proc { segs, pins: Vec::new(), sessions: HashMap::new(), pid }
            })
            .collect();
        Harness { world, procs, model: BTreeMap::new() }
    }

    /// Pins of segment `name` in the model, per process.
    fn pins_of(&self, name: &str) -> Vec<u32> {
        self.procs
            .iter()
            .map(|p| p.pins.iter().filter(|(n, _)| n == name).count() as u32 + p.sessions.get(name).copied().unwrap_or(0))
            .collect()
    }

    fn step(&mut self, op: &Op) {
        match *op {
            Op::Create { p, seg, size_kib, extra_mib, pref } => {
                let name = NAMES[seg];
                let size = size_kib * 1024;
                let max_size = size + extra_mib * MIB;
                let pref = pref_of(pref);
                let device_only = matches!(pref, TierPref::Device | TierPref::DeviceOn(_));
                let r = self.procs[p].segs.create(name, size as i64, Some(max_size as i64), pref, 10, 0);
                if self.model.contains_key(name) {
                    assert_eq!(r.unwrap_err().code, Code::DuplicateObject);
                } else if device_only && r.as_ref().is_err_and(|e| e.code == Code::ConfigurationLimitExceeded) {
                    // Past the budget of its GPU(s): refused, and nothing is left behind.
                    assert!(self.procs[p].segs.lookup(name).is_err(), "a refused create left {name}");
                } else {
                    let id = r.unwrap();
                    let bytes = BTreeMap::new();
                    self.model.insert(name.into(), ModelSeg { id, size, max_size, generation: 0, bytes, device_only });
                }
            }
            Op::Grow { p, seg, by_kib } => {
                let name = NAMES[seg];
                let Some(m) = self.model.get(name) else {
                    let e = self.procs[p].segs.grow(name, 1, ok).unwrap_err();
                    assert_eq!(e.code, Code::UndefinedObject);
                    return;
                };
                let to = m.size + by_kib * 1024;
                let r = self.procs[p].segs.grow(name, to as i64, ok);
                if to > m.max_size {
                    assert_eq!(r.unwrap_err().code, Code::ProgramLimitExceeded);
                } else if m.device_only && r.as_ref().is_err_and(|e| e.code == Code::ConfigurationLimitExceeded) {
                    // The size stays (chunks committed on the way stay too, and count).
                } else {
                    assert_eq!(r.unwrap(), to);
                    self.model.get_mut(name).unwrap().size = to;
                }
            }
            Op::GrowAtLeast { p, seg, to_kib } => {
                let name = NAMES[seg];
                let to = to_kib * 1024;
                let r = self.procs[p].segs.grow_at_least(name, to, ok);
                match self.model.get_mut(name) {
                    None => assert_eq!(r.unwrap_err().code, Code::UndefinedObject),
                    Some(m) if to <= m.size => assert_eq!(r.unwrap(), m.size),
                    Some(m) if to > m.max_size => assert_eq!(r.unwrap_err().code, Code::ProgramLimitExceeded),
                    Some(m) if m.device_only && r.as_ref().is_err_and(|e| e.code == Code::ConfigurationLimitExceeded) => {}
                    Some(m) => {
                        assert_eq!(r.unwrap(), to);
                        m.size = to;
                    }
                }
            }
            Op::Pin { p, seg, at, value } => {
                let name = NAMES[seg];
                let r = self.procs[p].segs.pin(name, ok);
                let Some(m) = self.model.get_mut(name) else {
                    assert_eq!(r.err().unwrap().code, Code::UndefinedObject);
                    return;
                };
                let mut pin = r.unwrap();
                assert_eq!(pin.info().id, m.id);
                assert_eq!(pin.info().size, m.size);
                // Everything written before reads back, then one more byte is written.
                for (&o, &v) in &m.bytes {
                    assert_eq!(pin.bytes(o as i64, 1).unwrap()[0], v, "byte {o} of {name}");
                }
                let o = at as u64 * m.size / (u16::MAX as u64 + 1);
                pin.bytes_mut(o as i64, 1).unwrap()[0] = value;
                m.bytes.insert(o, value);
                assert_eq!(pin.bytes(m.size as i64, 1).unwrap_err().code, Code::OutOfRange);
                self.procs[p].pins.push((name.into(), pin));
            }
            Op::Unpin { p, which } => {
                let pins = &mut self.procs[p].pins;
                if !pins.is_empty() {
                    let i = which % pins.len();
                    pins.swap_remove(i);
                }
            }
            Op::PinSession { p, seg } => {
                let name = NAMES[seg];
                let r = self.procs[p].segs.pin_session(name, ok);
                if self.model.contains_key(name) {
                    r.unwrap();
                    *self.procs[p].sessions.entry(name.into()).or_insert(0) += 1;
                } else {
                    assert_eq!(r.unwrap_err().code, Code::UndefinedObject);
                }
            }
            Op::UnpinSession { p, seg } => {
                let name = NAMES[seg];
                let r = self.procs[p].segs.unpin_session(name);
                if !self.model.contains_key(name) {
                    assert_eq!(r.unwrap_err().code, Code::UndefinedObject);
                    return;
                }
                let held = self.procs[p].sessions.get(name).copied().unwrap_or(0);
                assert_eq!(r.unwrap(), held > 0);
                if held > 1 {
                    self.procs[p].sessions.insert(name.into(), held - 1);
                } else {
                    self.procs[p].sessions.remove(name);
                }
            }
            Op::Drop { p, seg } => {
                let name = NAMES[seg];
                let r = self.procs[p].segs.drop_segment(name, ok);
                if !self.model.contains_key(name) {
                    assert_eq!(r.unwrap_err().code, Code::UndefinedObject);
                } else if self.pins_of(name).iter().sum::<u32>() > 0 {
                    assert_eq!(r.unwrap_err().code, Code::ObjectInUse, "drop of a pinned segment");
                } else {
                    r.unwrap();
                    self.model.remove(name);
                }
            }
            Op::Prefetch { p, seg, from, len, to } => {
                let name = NAMES[seg];
                let target = match to {
                    0 => TierPref::Host,
                    1 => TierPref::Device,
                    n => TierPref::DeviceOn(n - 2),
                };
                let Some(m) = self.model.get(name) else {
                    let e = self.procs[p].segs.prefetch(name, 0, 0, target, ok).unwrap_err();
                    assert_eq!(e.code, Code::UndefinedObject);
                    return;
                };
                let off = from as u64 * m.size / (u16::MAX as u64 + 1);
                let len = len as u64 * (m.size - off) / (u16::MAX as u64 + 1);
                // What must move: the chunks under the range that are not where the target wants.
                let before = self.procs[p].segs.lookup(name).unwrap();
                let under = |c: &&ChunkInfo| c.offset < off + len && off < c.offset + c.size;
                let moving: Vec<ChunkInfo> =
                    before.chunks.iter().filter(under).filter(|c| !target.holds(c.place())).copied().collect();
                let moving_bytes: u64 = moving.iter().map(|c| c.size).sum();
                let used: Vec<u64> = {
                    let reg = self.procs[p].segs.env.shared().unwrap();
                    (0..GPUS).map(|n| reg.gpu_bytes(n)).collect()
                };
                // Past the budget: to GPU n, everything moving lands there; to any GPU, the
                // moving bytes exceed the room of all GPUs together (a sufficient condition).
                let over = match target {
                    TierPref::DeviceOn(n) => used[n as usize] + moving_bytes > DEVICE_LIMIT,
                    TierPref::Device => moving_bytes > used.iter().map(|u| DEVICE_LIMIT - u).sum::<u64>(),
                    _ => false,
                };
                let pinned = self.pins_of(name).iter().sum::<u32>() > 0;
                let r = self.procs[p].segs.prefetch(name, off as i64, len as i64, target, ok);
                if moving.is_empty() {
                    assert_eq!(r.unwrap(), 0);
                } else if over {
                    assert_eq!(r.unwrap_err().code, Code::ConfigurationLimitExceeded);
                    assert_eq!(self.procs[p].segs.lookup(name).unwrap().chunks, before.chunks, "a refused move moved something");
                } else if let Err(e) = &r {
                    // Chunks that each fit some GPU but not all at once refuse `device` too
                    // (whole chunks do not pack); a pinned segment waits, then gives up.
                    let budget = e.code == Code::ConfigurationLimitExceeded && target == TierPref::Device;
                    assert!(budget || (pinned && e.code == Code::LockNotAvailable), "prefetch to {target:?}: {e:?}");
                } else {
                    assert!(!pinned, "migration of a pinned segment");
                    assert_eq!(r.unwrap(), moving_bytes);
                    let after = self.procs[p].segs.lookup(name).unwrap();
                    for c in after.chunks.iter().filter(under) {
                        assert!(target.holds(c.place()), "chunk at {} of {name} did not move to {target:?}", c.offset);
                    }
                }
            }
            Op::PoolStep { p } => {
                let before = self.procs[p].segs.env.shared().unwrap().pool_bytes();
                match self.procs[p].segs.pool_step() {
                    Ok(true) => {
                        let after = self.procs[p].segs.env.shared().unwrap().pool_bytes();
                        assert!(after == before + POOL_PIECE || after + POOL_PIECE == before, "pool {before} -> {after}");
                    }
                    Ok(false) => assert!(before + POOL_PIECE > POOL_SIZE, "a pool of {before} bytes did not grow"),
                    // the registry's chunk slots are all taken
                    Err(e) => assert_eq!(e.code, Code::ConfigurationLimitExceeded, "{e:?}"),
                }
            }
            Op::Exit { p } => {
                let proc = &mut self.procs[p];
                proc.segs.detach_all();
                proc.sessions.clear();
                // Guards held across the exit: their pins were given back, their memory is
                // still mapped (reading it must not fault), and dropping them later gives
                // nothing back twice.
                for (name, pin) in &proc.pins {
                    let m = &self.model[name.as_str()];
                    for (&o, &v) in &m.bytes {
                        if o < pin.info().size {
                            assert_eq!(pin.bytes(o as i64, 1).unwrap()[0], v);
                        }
                    }
                }
                let held = std::mem::take(&mut proc.pins);
                let reg = proc.segs.env.shared().unwrap();
                assert!(reg.attachments().iter().all(|a| a.pid != proc.pid));
                drop(reg);
                drop(held);
            }
        }
    }

    /// The invariants of the module documentation.
    fn check(&mut self) {
        let env = self.procs[0].segs.env.clone();
        let (segments, attachments, host_total, gpu_totals, known, epoch, pool, pool_bytes) = {
            let reg = env.shared().unwrap();
            (
                reg.segments(),
                reg.attachments(),
                reg.tier_bytes(Tier::Host),
                (0..GPUS).map(|n| reg.gpu_bytes(n)).collect::<Vec<_>>(),
                reg.known_chunk_ids(),
                reg.epoch(),
                reg.pool_chunks(),
                reg.pool_bytes(),
            )
        };
        // The model's segments, sizes, pins; monotone generations.
        let names: Vec<&str> = segments.iter().map(|s| s.name.as_str()).collect();
        let model_names: Vec<&str> = self.model.keys().map(|k| k.as_str()).collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(sorted, model_names);
        let mut ids = Vec::new();
        let (mut host, mut gpus) = (0, vec![0u64; GPUS as usize]);
        let broker = crate::broker::client::Client::connect(&env.broker_path()).unwrap();
        for s in &segments {
            let pins = self.pins_of(&s.name);
            let m = self.model.get_mut(&s.name).unwrap();
            assert_eq!((s.id, s.size, s.max_size), (m.id, m.size, m.max_size), "segment {}", s.name);
            assert!(s.generation >= m.generation, "generation of {} went down", s.name);
            m.generation = s.generation;
            assert_eq!(s.pins, pins.iter().sum::<u32>(), "pins of {}", s.name);
            for (i, proc) in self.procs.iter().enumerate() {
                let counted: u32 = attachments.iter().filter(|a| a.pid == proc.pid && a.segment_id == s.id).map(|a| a.pins).sum();
                assert_eq!(counted, pins[i], "pins of process {i} on {}", s.name);
            }
            assert!(pins.iter().all(|&n| n < 1 << 20), "a pin count went below zero");
            // The chunks tile the segment, and the broker holds each as a memfd of its tier.
            let mut end = 0;
            for c in &s.chunks {
                assert_eq!(c.offset, end, "chunks of {} do not tile it", s.name);
                end += c.size;
                ids.push(c.id);
                let fd = broker.get(epoch, c.id).unwrap();
                assert_eq!(fd_place_and_size(&fd), (c.place(), c.size), "chunk {} of {}", c.id, s.name);
                match c.place() {
                    Place::Host => host += c.size,
                    Place::Device(n) => gpus[n as usize] += c.size,
                }
            }
            assert_eq!(end, s.committed);
            assert!(s.size <= s.committed && s.committed <= s.reserve);
            assert!(!env.shared().unwrap().migrating(s.slot));
        }
        // The host pool: pieces of its piece size, host memfds at the broker, counted exactly,
        // never past its size.
        for &(id, size) in &pool {
            assert_eq!(size, POOL_PIECE);
            assert_eq!(fd_place_and_size(&broker.get(epoch, id).unwrap()), (Place::Host, size), "pool piece {id}");
            ids.push(id);
        }
        assert_eq!(pool_bytes, pool.iter().map(|p| p.1).sum::<u64>());
        assert!(pool_bytes <= POOL_SIZE);
        // No chunk id lost or doubled: the registry's table, the segments, the pool and the
        // broker agree.
        let n = ids.len();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), n, "a chunk id is doubled");
        let mut known = known;
        known.sort_unstable();
        assert_eq!(known, ids, "the chunk table and the segments disagree");
        assert_eq!(broker.stats(epoch).unwrap(), n as u64, "the broker holds other fds than the registry's");
        // Exact per-tier and per-GPU totals, each GPU within its budget.
        assert_eq!((host_total, &gpu_totals), (host, &gpus));
        assert!(gpus.iter().all(|&g| g <= DEVICE_LIMIT), "a GPU passed its budget: {gpus:?}");
        // No attachment of a process that holds no pin counts one.
        assert!(attachments.iter().all(|a| a.pins < 1 << 20));
    }

    /// Ends the case: every process exits, every segment is dropped, the pool is emptied (a
    /// size of 0 trims it piece by piece), the broker is left empty.
    fn finish(mut self) {
        for p in &mut self.procs {
            p.pins.clear();
            p.segs.detach_all();
        }
        let names: Vec<String> = self.model.keys().cloned().collect();
        for name in names {
            self.procs[0].segs.drop_segment(&name, ok).unwrap();
        }
        self.procs[0].segs.limits.pool_size = 0;
        while self.procs[0].segs.pool_step().unwrap() {}
        assert_eq!(self.procs[0].segs.env.shared().unwrap().pool_bytes(), 0);
        self.procs[0].segs.detach_all();
        drop(self.procs);
        assert_eq!(self.world.finish(), 0, "the broker still holds fds");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: crate::testing::proptest_cases(64), max_shrink_iters: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_operations_keep_the_registry_consistent(ops in proptest::collection::vec(op(), 1..=40)) {
        let mut h = Harness::new();
        for op in &ops {
            h.step(op);
            h.check();
        }
        h.finish();
    }
}

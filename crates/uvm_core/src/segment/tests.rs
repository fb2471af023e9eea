//! The segment layer end to end, without PostgreSQL: a registry on the heap behind an RwLock, a
//! real broker on a thread, and several managers standing in for several processes (each with
//! its own reservations, so they map the same chunks at different addresses, as processes
//! outside the arena would).

use crate::stats::{ProgressKind, ProgressPhase};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use super::*;
use crate::broker::server::Server;
use crate::provider::host::HostProvider;
use crate::registry::{Arena, Capacity};

const MIB: u64 = 1 << 20;

pub(crate) struct World {
    lock: &'static RwLock<()>,
    base: *mut u8,
    path: PathBuf,
    stop: Arc<AtomicBool>,
    /// Ids for the broker's thread to keep at its next turn, closing every other fd it holds:
    /// its sweep, at a moment a test picks ([`World::sweep_now`]).
    sweep: Arc<std::sync::Mutex<Option<std::collections::HashSet<u64>>>>,
    broker: Option<std::thread::JoinHandle<usize>>,
}

// SAFETY: test-only; the registry buffer is leaked and lives for the whole test run, and every
// access to it goes through the world's RwLock (or a HeldPin's atomics).
unsafe impl Send for World {}
// SAFETY: as for Send.
unsafe impl Sync for World {}

impl World {
    pub(crate) fn new(tag: &str, arena: Arena) -> Arc<World> {
        Self::with_capacity(tag, arena, Capacity { max_segments: 8, max_chunks: 64, max_attachments: 16 })
    }

    pub(crate) fn with_capacity(tag: &str, arena: Arena, cap: Capacity) -> Arc<World> {
        let buf: &'static mut [u64] = Box::leak(vec![0u64; Registry::size_for(cap) / 8 + 1].into_boxed_slice());
        let base = buf.as_mut_ptr() as *mut u8;
        // SAFETY: the leaked buffer is large enough and used only through this world.
        let reg = unsafe { Registry::init(base, cap, 7, arena) };
        let dir = std::env::temp_dir().join(format!("uvm-seg-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("broker.sock");
        let mut server = Server::bind(&path, reg.epoch()).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let sweep: Arc<std::sync::Mutex<Option<std::collections::HashSet<u64>>>> = Arc::default();
        let sweep2 = sweep.clone();
        let broker = std::thread::spawn(move || {
            while !stop2.load(Ordering::Relaxed) {
                let keep = sweep2.lock().unwrap().take();
                if let Some(keep) = keep {
                    server.broker.retain(&keep);
                }
                server.poll_once(10).unwrap();
            }
            server.broker.held()
        });
        Arc::new(World { lock: Box::leak(Box::new(RwLock::new(()))), base, path, stop, sweep, broker: Some(broker) })
    }

    /// Stops the broker; returns how many fds it still held.
    pub(crate) fn finish(self: Arc<World>) -> usize {
        let mut w = Arc::try_unwrap(self).ok().expect("world still shared");
        w.stop.store(true, Ordering::Relaxed);
        w.broker.take().unwrap().join().unwrap()
    }
}

impl Drop for World {
    fn drop(&mut self) {
        // A test that failed before `finish`: stop the broker's thread all the same.
        self.stop.store(true, Ordering::Relaxed);
        // The broker's socket directory (a test's only file): leave nothing behind in /tmp.
        if let Some(dir) = self.path.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

#[derive(Clone)]
pub(crate) struct TestEnv {
    world: Arc<World>,
    pid: i32,
}

impl TestEnv {
    pub(crate) fn new(world: &Arc<World>, pid: i32) -> TestEnv {
        TestEnv { world: world.clone(), pid }
    }
}

pub(crate) struct Shared(#[allow(dead_code)] RwLockReadGuard<'static, ()>, Registry);
pub(crate) struct Excl(#[allow(dead_code)] RwLockWriteGuard<'static, ()>, Registry);
impl Deref for Shared {
    type Target = Registry;
    fn deref(&self) -> &Registry {
        &self.1
    }
}
impl Deref for Excl {
    type Target = Registry;
    fn deref(&self) -> &Registry {
        &self.1
    }
}
impl DerefMut for Excl {
    fn deref_mut(&mut self) -> &mut Registry {
        &mut self.1
    }
}

impl Env for TestEnv {
    type Shared = Shared;
    type Exclusive = Excl;
    fn shared(&self) -> Result<Shared> {
        // SAFETY: the buffer was initialized by World::new.
        Ok(Shared(self.world.lock.read().unwrap(), unsafe { Registry::from_raw(self.world.base) }))
    }
    fn exclusive(&self) -> Result<Excl> {
        // SAFETY: as above.
        Ok(Excl(self.world.lock.write().unwrap(), unsafe { Registry::from_raw(self.world.base) }))
    }
    fn pid(&self) -> i32 {
        self.pid
    }
    fn broker_path(&self) -> PathBuf {
        self.world.path.clone()
    }
}

pub(crate) fn limits() -> Limits {
    Limits {
        min_chunk: 2 * MIB,
        max_segment_size: 1 << 30,
        device_limit: None,
        pin_wait: Duration::from_millis(300),
        pool_size: 0,
        pool_piece: 0,
    }
}

pub(crate) fn process(world: &Arc<World>, pid: i32) -> Segments<TestEnv> {
    Segments::new(TestEnv { world: world.clone(), pid }, Box::new(HostProvider::default()), limits())
}

pub(crate) fn ok(_: u32) -> Result<()> {
    Ok(())
}

#[test]
fn two_processes_share_bytes_and_growth() {
    let world = World::new("share", Arena::default());
    let mut a = process(&world, 1);
    let mut b = process(&world, 2);
    a.create("s", 3 * MIB as i64, None, TierPref::Auto, 10, 0).unwrap();
    {
        let mut p = a.pin("s", ok).unwrap();
        p.bytes_mut(100, 5).unwrap().copy_from_slice(b"hello");
        assert!(p.map_ms() > 0.0);
    }
    {
        let p = b.pin("s", ok).unwrap();
        assert_eq!(p.bytes(100, 5).unwrap(), b"hello");
        assert_eq!(p.info().size, 3 * MIB);
    }
    // a grows; b, still attached at the old generation, maps the new chunk on its next pin
    assert_eq!(a.grow("s", 9 * MIB as i64, ok).unwrap(), 9 * MIB);
    {
        let mut p = a.pin("s", ok).unwrap();
        p.bytes_mut(8 * MIB as i64, 3).unwrap().copy_from_slice(b"new");
    }
    {
        let p = b.pin("s", ok).unwrap();
        assert_eq!(p.info().chunks.len(), 2);
        assert_eq!(p.bytes(8 * MIB as i64, 3).unwrap(), b"new");
        assert_eq!(p.bytes(100, 5).unwrap(), b"hello");
        // a read across the chunk boundary is contiguous
        assert_eq!(p.bytes(4 * MIB as i64 - 2, 4).unwrap().len(), 4);
        let generation = p.info().generation;
        let reg = a.env.shared().unwrap();
        let atts = reg.attachments();
        assert_eq!(atts.len(), 2);
        assert!(atts.iter().all(|x| x.mapped_generation == generation));
        assert!(atts.iter().any(|x| x.pid == 2 && x.pins == 1));
    }
    b.detach_all();
    a.drop_segment("s", ok).unwrap();
    drop((a, b));
    assert_eq!(world.finish(), 0);
}

#[test]
fn ranges_sizes_and_names_are_checked() {
    let world = World::new("errors", Arena::default());
    let mut a = process(&world, 1);
    let code = |r: Result<u64>| r.unwrap_err().code;
    assert_eq!(code(a.create("", 1, None, TierPref::Auto, 1, 0)), Code::InvalidName);
    assert_eq!(code(a.create(&"n".repeat(64), 1, None, TierPref::Auto, 1, 0)), Code::NameTooLong);
    assert_eq!(code(a.create("z", 0, None, TierPref::Auto, 1, 0)), Code::InvalidParameterValue);
    assert_eq!(code(a.create("z", -5, None, TierPref::Auto, 1, 0)), Code::InvalidParameterValue);
    assert_eq!(code(a.create("z", 2 << 30, None, TierPref::Auto, 1, 0)), Code::ProgramLimitExceeded);
    assert_eq!(code(a.create("z", 10, Some(5), TierPref::Auto, 1, 0)), Code::InvalidParameterValue);
    assert_eq!(code(a.create("z", 10, None, TierPref::Device, 1, 0)), Code::FeatureNotSupported);
    a.create("s", 1000, Some(4 * MIB as i64), TierPref::Host, 1, 0).unwrap();
    assert_eq!(code(a.create("s", 1000, None, TierPref::Auto, 1, 0)), Code::DuplicateObject);
    {
        let p = a.pin("s", ok).unwrap();
        assert_eq!(p.bytes(0, 1000).unwrap().len(), 1000);
        assert_eq!(p.bytes(1000, 0).unwrap().len(), 0);
        assert_eq!(p.bytes(1, 1000).unwrap_err().code, Code::OutOfRange);
        assert_eq!(p.bytes(-1, 1).unwrap_err().code, Code::InvalidParameterValue);
        assert_eq!(p.bytes(0, -1).unwrap_err().code, Code::InvalidParameterValue);
        assert_eq!(p.bytes(i64::MAX, i64::MAX).unwrap_err().code, Code::OutOfRange);
    }
    assert_eq!(code(a.grow("s", 999, ok)), Code::InvalidParameterValue);
    assert_eq!(code(a.grow("s", 4 * MIB as i64 + 1, ok)), Code::ProgramLimitExceeded);
    assert_eq!(a.grow("s", 1000, ok).unwrap(), 1000);
    assert_eq!(a.pin("nope", ok).err().unwrap().code, Code::UndefinedObject);
    let denied = |_| Err(UvmError::new(Code::InsufficientPrivilege, "no"));
    assert_eq!(a.pin("s", denied).err().unwrap().code, Code::InsufficientPrivilege);
    assert_eq!(a.drop_segment("s", denied).unwrap_err().code, Code::InsufficientPrivilege);
    // nothing above leaked a pin
    assert_eq!(a.lookup("s").unwrap().pins, 0);
    a.drop_segment("s", ok).unwrap();
    drop(a);
    assert_eq!(world.finish(), 0);
}

#[test]
fn pins_block_drop_until_released_or_exit() {
    let world = World::new("pins", Arena::default());
    let mut a = process(&world, 1);
    let mut b = process(&world, 2);
    a.create("s", 4096, None, TierPref::Auto, 1, 0).unwrap();
    b.pin_session("s", ok).unwrap();
    b.pin_session("s", ok).unwrap();
    assert_eq!(a.drop_segment("s", ok).unwrap_err().code, Code::ObjectInUse);
    assert!(b.unpin_session("s").unwrap());
    assert_eq!(a.drop_segment("s", ok).unwrap_err().code, Code::ObjectInUse);
    assert!(a.pin("s", ok).is_ok()); // data still there
                                     // b "exits" holding a pin: the pin is given back
    b.detach_all();
    assert!(!b.unpin_session("s").unwrap());
    a.drop_segment("s", ok).unwrap();
    drop((a, b));
    assert_eq!(world.finish(), 0);
}

#[test]
fn dropped_segments_are_swept_by_other_processes() {
    let world = World::new("sweep", Arena::default());
    let mut a = process(&world, 1);
    let mut b = process(&world, 2);
    a.create("s", 4096, None, TierPref::Auto, 1, 0).unwrap();
    a.create("t", 4096, None, TierPref::Auto, 1, 0).unwrap();
    drop(b.pin("s", ok).unwrap());
    a.drop_segment("s", ok).unwrap();
    assert_eq!(b.attachments().count(), 1);
    drop(b.pin("t", ok).unwrap()); // any access sweeps
    assert_eq!(b.attachments().map(|x| x.segment_id()).collect::<Vec<_>>(), vec![a.lookup("t").unwrap().id]);
    a.drop_segment("t", ok).unwrap();
    b.detach_all();
    drop((a, b));
    assert_eq!(world.finish(), 0);
}

#[test]
fn concurrent_growth_converges() {
    let world = World::new("race", Arena::default());
    let mut a = process(&world, 1);
    a.create("g", 2 * MIB as i64, None, TierPref::Auto, 1, 0).unwrap();
    let threads: Vec<_> = (0..4)
        .map(|i| {
            let w = world.clone();
            std::thread::spawn(move || {
                let mut p = process(&w, 10 + i);
                for step in 1..=8 {
                    let target = (2 + step * 4 + i as i64) * MIB as i64;
                    let _ = p.grow("g", target, ok);
                }
                p.detach_all();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let info = a.lookup("g").unwrap();
    // chunks tile [0, committed) without gaps or overlaps
    let mut end = 0;
    for c in &info.chunks {
        assert_eq!(c.offset, end);
        end += c.size;
    }
    assert_eq!(end, info.committed);
    assert!(info.size >= 34 * MIB && info.size <= info.committed);
    let ids: Vec<u64> = info.chunks.iter().map(|c| c.id).collect();
    assert_eq!(world.shared_known(), ids.len());
    a.drop_segment("g", ok).unwrap();
    drop(a);
    assert_eq!(world.finish(), 0);
}

impl World {
    /// Has the broker close every fd but those of `keep` now, as its sweep closes the fds of
    /// chunks the registry no longer knows; returns once it has.
    fn sweep_now(&self, keep: std::collections::HashSet<u64>) {
        *self.sweep.lock().unwrap() = Some(keep);
        while self.sweep.lock().unwrap().is_some() {
            std::thread::sleep(Duration::from_millis(1));
        }
        // (taken at the top of a turn; the retain follows before the thread polls again)
        std::thread::sleep(Duration::from_millis(20));
    }

    fn shared_known(&self) -> usize {
        let _g = self.lock.read().unwrap();
        // SAFETY: initialized in World::new.
        unsafe { Registry::from_raw(self.base) }.known_chunk_ids().len()
    }
}

#[test]
fn arena_segments_map_at_their_hint() {
    let arena = crate::provider::reserve_arena(64 * GRANULARITY);
    let world = World::new("arena", arena);
    let mut a = process(&world, 1);
    a.create("s", 4096, Some(8 * MIB as i64), TierPref::Auto, 1, 0).unwrap();
    {
        let p = a.pin("s", ok).unwrap();
        assert_eq!(p.base() as u64, arena.base);
        assert_eq!(p.info().base_hint, arena.base);
    }
    assert!(a.attachments().all(|x| x.same_address()));
    a.drop_segment("s", ok).unwrap();
    drop(a);
    assert_eq!(world.finish(), 0);
}

pub(crate) fn two_tier(world: &Arc<World>, pid: i32, device_limit: Option<u64>) -> Segments<TestEnv> {
    let mut l = limits();
    l.device_limit = device_limit;
    // One simulated GPU: the CUDA provider's two tiers, with memfds in both, so that the tests
    // exercise the tier logic and the migration protocol on any machine.
    Segments::new(TestEnv { world: world.clone(), pid }, Box::new(HostProvider::simulating(1)), l)
}

fn tiers_of(s: &Segments<TestEnv>, name: &str) -> Vec<Tier> {
    s.lookup(name).unwrap().chunks.iter().map(|c| c.tier).collect()
}

#[test]
fn migration_moves_chunks_both_ways_and_other_processes_follow() {
    let world = World::new("migrate", Arena::default());
    let mut a = two_tier(&world, 1, None);
    let mut b = two_tier(&world, 2, None);
    a.create("m", 3 * MIB as i64, None, TierPref::Host, 1, 0).unwrap();
    a.grow("m", 7 * MIB as i64, ok).unwrap();
    let data: Vec<u8> = (0..7 * MIB as usize).map(|i| (i * 31 % 251) as u8).collect();
    a.pin("m", ok).unwrap().bytes_mut(0, data.len() as i64).unwrap().copy_from_slice(&data);
    assert_eq!(b.pin("m", ok).unwrap().bytes(0, data.len() as i64).unwrap(), &data[..]);
    assert_eq!(tiers_of(&a, "m"), vec![Tier::Host, Tier::Host]);
    let gen_before = a.lookup("m").unwrap().generation;

    // only the chunk covering [5 MiB, 6 MiB) moves
    let moved = a.prefetch("m", 5 * MIB as i64, MIB as i64, TierPref::Device, ok).unwrap();
    assert_eq!(tiers_of(&a, "m"), vec![Tier::Host, Tier::Device]);
    assert_eq!(moved, a.lookup("m").unwrap().chunks[1].size);
    assert!(a.lookup("m").unwrap().generation > gen_before);
    // b still maps the old chunk; its next pin remaps and reads the same bytes
    assert_eq!(b.pin("m", ok).unwrap().bytes(0, data.len() as i64).unwrap(), &data[..]);
    // everything to the device, then everything back
    a.prefetch("m", 0, data.len() as i64, TierPref::Device, ok).unwrap();
    assert_eq!(tiers_of(&a, "m"), vec![Tier::Device, Tier::Device]);
    assert_eq!(a.prefetch("m", 0, data.len() as i64, TierPref::Device, ok).unwrap(), 0);
    {
        let reg = a.env.shared().unwrap();
        assert_eq!(reg.tier_bytes(Tier::Host), 0);
        assert_eq!(reg.tier_bytes(Tier::Device), a.lookup("m").unwrap().committed);
    }
    a.prefetch("m", 0, data.len() as i64, TierPref::Host, ok).unwrap();
    assert_eq!(tiers_of(&a, "m"), vec![Tier::Host, Tier::Host]);
    assert_eq!(b.pin("m", ok).unwrap().bytes(0, data.len() as i64).unwrap(), &data[..]);
    assert_eq!(a.pin("m", ok).unwrap().bytes(0, data.len() as i64).unwrap(), &data[..]);
    // replaced chunks were released at the broker: it holds exactly the live ones
    assert_eq!(world.shared_known(), 2);
    b.detach_all();
    a.drop_segment("m", ok).unwrap();
    drop((a, b));
    assert_eq!(world.finish(), 0);
}

/// The broker's sweep closes the fds of chunks the registry no longer knows (every 2 s in the
/// cluster). A migration frees the old chunk in the registry, then asks the broker to release
/// it: a sweep in between made the release fail as "unknown to the broker", and with it the
/// migration, whose swap had committed (5 of 50 moves of a 768 MiB chunk in process mode; a
/// segment of several chunks was left half moved). Here the broker has closed the old chunk's
/// fd before the migration (this process copies from its own mapping, so it never asks for it).
#[test]
fn a_migration_whose_old_chunk_the_broker_swept_still_succeeds() {
    let world = World::new("swept", Arena::default());
    let mut a = two_tier(&world, 1, None);
    a.create("m", 2 * MIB as i64, None, TierPref::Host, 1, 0).unwrap();
    let data: Vec<u8> = (0..2 * MIB as usize).map(|i| (i * 7 % 253) as u8).collect();
    a.pin("m", ok).unwrap().bytes_mut(0, data.len() as i64).unwrap().copy_from_slice(&data);
    let old = a.lookup("m").unwrap().chunks.iter().map(|c| c.id).collect::<Vec<_>>();
    assert_eq!(old.len(), 1);
    world.sweep_now(std::collections::HashSet::new());
    let moved = a.prefetch("m", 0, data.len() as i64, TierPref::Device, ok).unwrap();
    assert_eq!(moved, 2 * MIB);
    assert_eq!(tiers_of(&a, "m"), vec![Tier::Device]);
    assert_eq!(a.pin("m", ok).unwrap().bytes(0, data.len() as i64).unwrap(), &data[..]);
    assert_eq!(world.shared_known(), 1);
    a.drop_segment("m", ok).unwrap();
    drop(a);
    assert_eq!(world.finish(), 0);
}

#[test]
fn migration_waits_for_pins_and_times_out_cleanly() {
    let world = World::new("migwait", Arena::default());
    let mut a = two_tier(&world, 1, None);
    let mut b = two_tier(&world, 2, None);
    a.create("w", MIB as i64, None, TierPref::Host, 1, 0).unwrap();
    b.pin_session("w", ok).unwrap();
    let started = std::time::Instant::now();
    let e = a.prefetch("w", 0, 1, TierPref::Device, ok).unwrap_err();
    assert_eq!(e.code, Code::LockNotAvailable, "{e}");
    assert!(started.elapsed() >= Duration::from_millis(300));
    // nothing moved, nothing left behind, and the segment is usable
    assert_eq!(tiers_of(&a, "w"), vec![Tier::Host]);
    assert!(!a.env.shared().unwrap().migrating(a.lookup("w").unwrap().slot));
    assert_eq!(world.shared_known(), 1);
    b.detach_all();
    // a pin that goes away while the migration waits: the migration proceeds
    let (tx, rx) = std::sync::mpsc::channel();
    let w = world.clone();
    let t = std::thread::spawn(move || {
        let mut c = two_tier(&w, 3, None);
        c.pin_session("w", ok).unwrap();
        tx.send(()).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        assert!(c.unpin_session("w").unwrap());
        c.detach_all();
    });
    rx.recv().unwrap();
    assert_eq!(a.prefetch("w", 0, 1, TierPref::Device, ok).unwrap(), 2 * MIB);
    t.join().unwrap();
    a.drop_segment("w", ok).unwrap();
    drop((a, b));
    assert_eq!(world.finish(), 0);
}

/// Readers that take turns, each pinning before the last one let go, keep the segment pinned
/// at every instant: a migration must still get through (it queues, and new pins wait behind
/// it), every time, both ways.
#[test]
fn readers_taking_turns_do_not_starve_a_migration() {
    let world = World::new("migstarve", Arena::default());
    let mut a = two_tier(&world, 1, None);
    a.create("w", 4 * MIB as i64, None, TierPref::Host, 1, 0).unwrap();
    a.pin("w", ok).unwrap().bytes_mut(0, 4).unwrap().copy_from_slice(&[7; 4]);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Pins held now by the readers; each reader pins only once the count shows another
    // reader's pin, so the pins overlap and never all drain by themselves.
    let holding = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let readers: Vec<_> = (0..3)
        .map(|i| {
            let (w, stop, holding) = (world.clone(), stop.clone(), holding.clone());
            std::thread::spawn(move || {
                use std::sync::atomic::Ordering::SeqCst;
                let mut r = two_tier(&w, 10 + i, None);
                let mut pins = 0u32;
                while !stop.load(SeqCst) {
                    let p = r.pin("w", ok).unwrap();
                    holding.fetch_add(1, SeqCst);
                    assert_eq!(p.bytes(0, 4).unwrap(), &[7, 7, 7, 7]);
                    std::thread::sleep(Duration::from_millis(15));
                    // Let go only while another reader holds a pin (or nobody else is left).
                    let t = std::time::Instant::now();
                    while holding.load(SeqCst) < 2 && t.elapsed() < Duration::from_millis(20) {
                        std::thread::sleep(Duration::from_micros(200));
                    }
                    holding.fetch_sub(1, SeqCst);
                    drop(p);
                    pins += 1;
                }
                r.detach_all();
                pins
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(50));
    for round in 0..6 {
        let to = if round % 2 == 0 { TierPref::Device } else { TierPref::Host };
        let moved = a.prefetch("w", 0, 4 * MIB as i64, to, ok).unwrap_or_else(|e| panic!("migration {round}: {e}"));
        assert_eq!(moved, 4 * MIB, "migration {round}");
        std::thread::sleep(Duration::from_millis(30));
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let pins: Vec<u32> = readers.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(pins.iter().all(|&n| n >= 3), "every reader kept reading: {pins:?}");
    // Nothing queued is left behind.
    let reg = a.env.shared().unwrap();
    let slot = reg.lookup("w").unwrap();
    assert_eq!((reg.migrations_waiting(slot), reg.migrating(slot)), (0, false));
    drop(reg);
    a.drop_segment("w", ok).unwrap();
    drop(a);
    assert_eq!(world.finish(), 0);
}

/// Who passes a queued migration: a process already holding a pin, and the process that
/// queued it; anyone else waits, and is let through when the migration gives up or its queued
/// place is withdrawn at process exit.
#[test]
fn a_queued_migration_holds_new_pins_back_but_not_its_holders() {
    let world = World::new("migqueue", Arena::default());
    let mut a = two_tier(&world, 1, None);
    let mut b = two_tier(&world, 2, None);
    let mut c = two_tier(&world, 3, None);
    a.create("w", MIB as i64, None, TierPref::Host, 1, 0).unwrap();
    let id = a.lookup("w").unwrap().id;
    // b holds a pin; a's migration queues behind it and gives up after pin_wait (300 ms).
    let held = b.pin("w", ok).unwrap();
    let w = world.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    // (The migrating "process" has this test's real pid: uvm.progress leaves out rows of
    // processes that do not exist.)
    let me = std::process::id() as i32;
    let migration = std::thread::spawn(move || {
        let mut m = two_tier(&w, me, None);
        tx.send(()).unwrap();
        let r = m.prefetch("w", 0, 1, TierPref::Device, ok).map_err(|e| e.code);
        m.detach_all();
        r
    });
    rx.recv().unwrap();
    assert!(wait_until(|| {
        let reg = c.env.shared().unwrap();
        reg.migrations_waiting(reg.lookup("w").unwrap()) == 1
    }));
    // uvm.progress shows the waiting migration.
    {
        let reg = c.env.shared().unwrap();
        let rows = reg.progress();
        assert_eq!(rows.len(), 1, "{rows:?}");
        let p = rows[0];
        assert_eq!(
            (p.pid, p.kind, p.phase, p.segment_id, p.done, p.total),
            (me, ProgressKind::Migration, ProgressPhase::WaitingForPins, id, 0, 2 * MIB)
        );
    }
    // b, which holds a pin, pins again at once.
    let t = std::time::Instant::now();
    drop(b.pin("w", ok).unwrap());
    assert!(t.elapsed() < Duration::from_millis(100), "a holder waited {:?}", t.elapsed());
    // c waits behind the queued migration; when it gives up (b never lets go), c gets in
    // (c's own wait is longer than the migration's).
    c.limits.pin_wait = Duration::from_secs(5);
    let t = std::time::Instant::now();
    drop(c.pin("w", ok).unwrap());
    assert!(t.elapsed() >= Duration::from_millis(150), "c did not wait: {:?}", t.elapsed());
    assert_eq!(migration.join().unwrap(), Err(Code::LockNotAvailable));
    assert!(c.env.shared().unwrap().progress().is_empty(), "the progress row went with the migration");
    drop(held);
    // The service's kind of wait: queued by hand, passed by its own process, withdrawn at exit.
    let queued = a.wait_to_migrate(id).unwrap();
    drop(a.pin("w", ok).unwrap());
    c.limits.pin_wait = Duration::from_millis(50);
    assert_eq!(c.pin("w", ok).err().map(|e| e.code), Some(Code::LockNotAvailable));
    a.detach_all();
    drop(c.pin("w", ok).unwrap());
    drop(queued); // withdrawn already: no second withdrawal
    {
        let reg = c.env.shared().unwrap();
        assert_eq!(reg.migrations_waiting(reg.lookup("w").unwrap()), 0);
    }
    // An exit that cannot reach its manager (a FATAL error inside a call that borrows it) gives
    // the same back through the manager's exit duties.
    let queued = a.wait_to_migrate(id).unwrap();
    assert_eq!(c.pin("w", ok).err().map(|e| e.code), Some(Code::LockNotAvailable));
    let duties = a.exit_duties();
    {
        let mut reg = a.env.exclusive().unwrap();
        duties.undo(&mut reg);
    }
    drop(c.pin("w", ok).unwrap());
    drop(queued); // withdrawn already
    {
        let reg = c.env.shared().unwrap();
        assert_eq!(reg.migrations_waiting(reg.lookup("w").unwrap()), 0);
    }
    b.detach_all();
    c.drop_segment("w", ok).unwrap();
    drop((a, b, c));
    assert_eq!(world.finish(), 0);
}

fn wait_until(mut cond: impl FnMut() -> bool) -> bool {
    let t = std::time::Instant::now();
    while t.elapsed() < Duration::from_secs(5) {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    false
}

#[test]
fn device_budget_spills_auto_chunks_and_refuses_device_ones() {
    let world = World::new("budget", Arena::default());
    let mut a = two_tier(&world, 1, Some(4 * MIB));
    a.create("d", 3 * MIB as i64, None, TierPref::Auto, 1, 0).unwrap();
    assert_eq!(tiers_of(&a, "d"), vec![Tier::Device]);
    // the next auto chunk would pass the 4 MiB budget: it goes to the host tier
    a.grow("d", 9 * MIB as i64, ok).unwrap();
    assert_eq!(tiers_of(&a, "d"), vec![Tier::Device, Tier::Host]);
    // a segment larger than the budget, created at once, fills the device and spills the rest
    a.drop_segment("d", ok).unwrap();
    a.create("d", 9 * MIB as i64, None, TierPref::Auto, 1, 0).unwrap();
    let info = a.lookup("d").unwrap();
    assert_eq!(tiers_of(&a, "d"), vec![Tier::Device, Tier::Host]);
    assert_eq!((info.bytes_in(Tier::Device), info.size), (4 * MIB, 9 * MIB));
    let e = a.create("e", 4 * MIB as i64, None, TierPref::Device, 1, 0).unwrap_err();
    assert_eq!(e.code, Code::ConfigurationLimitExceeded);
    assert!(a.lookup("e").is_err(), "a failed create leaves no segment");
    let e = a.prefetch("d", 0, 9 * MIB as i64, TierPref::Device, ok).unwrap_err();
    assert_eq!(e.code, Code::ConfigurationLimitExceeded);
    a.create("h", MIB as i64, None, TierPref::Host, 1, 0).unwrap();
    assert_eq!(tiers_of(&a, "h"), vec![Tier::Host]);
    for n in ["d", "h"] {
        a.drop_segment(n, ok).unwrap();
    }
    drop(a);
    assert_eq!(world.finish(), 0);
}

fn gpus_of(s: &Segments<TestEnv>, name: &str) -> Vec<Place> {
    s.lookup(name).unwrap().chunks.iter().map(|c| c.place()).collect()
}

/// Two simulated GPUs with a 4 MiB budget each: `device` spreads a segment larger than one
/// GPU's budget over both, `device:N` stays on GPU N, `auto` takes the roomiest GPU, then the
/// host tier; migration moves chunks between GPUs and counts each GPU's bytes; a move past a
/// budget moves nothing; bytes read back the same in another process throughout.
#[test]
fn segments_spread_over_gpus_and_move_between_them() {
    let world = World::new("gpus", Arena::default());
    let mut l = limits();
    l.device_limit = Some(4 * MIB);
    let mk = |pid| Segments::new(TestEnv { world: world.clone(), pid }, Box::new(HostProvider::simulating(2)), l);
    let (mut a, mut b) = (mk(1), mk(2));
    let used = |s: &Segments<TestEnv>| {
        let reg = s.env.shared().unwrap();
        (reg.gpu_bytes(0), reg.gpu_bytes(1), reg.tier_bytes(Tier::Host))
    };
    // 6 MiB on the device tier: 4 on GPU 0 (cut at its budget), the rest on GPU 1
    a.create("wide", 6 * MIB as i64, None, TierPref::Device, 1, 0).unwrap();
    assert_eq!(gpus_of(&a, "wide"), vec![Place::Device(0), Place::Device(1)]);
    assert_eq!(used(&a), (4 * MIB, 2 * MIB, 0));
    let data: Vec<u8> = (0..6 * MIB as usize).map(|i| (i * 7 % 253) as u8).collect();
    a.pin("wide", ok).unwrap().bytes_mut(0, data.len() as i64).unwrap().copy_from_slice(&data);
    assert_eq!(b.pin("wide", ok).unwrap().bytes(0, data.len() as i64).unwrap(), &data[..]);
    // GPU 1 has 2 MiB left: device:1 takes 2 MiB, refuses more (and leaves nothing behind)
    let e = a.create("one", 4 * MIB as i64, None, TierPref::DeviceOn(1), 1, 0).unwrap_err();
    assert_eq!(e.code, Code::ConfigurationLimitExceeded);
    assert!(a.lookup("one").is_err());
    let e = a.create("one", MIB as i64, None, TierPref::DeviceOn(2), 1, 0).unwrap_err();
    assert_eq!(e.code, Code::InvalidParameterValue);
    // auto: the last 2 MiB of GPU 1, then the host tier
    a.create("spill", 4 * MIB as i64, None, TierPref::Auto, 1, 0).unwrap();
    assert_eq!(gpus_of(&a, "spill"), vec![Place::Device(1), Place::Host]);
    assert_eq!(used(&a), (4 * MIB, 4 * MIB, 2 * MIB));
    // every GPU is full: a device chunk is refused, whole
    let e = a.prefetch("spill", 0, 4 * MIB as i64, TierPref::Device, ok).unwrap_err();
    assert_eq!(e.code, Code::ConfigurationLimitExceeded);
    // moving wide's GPU 1 chunk to the host frees GPU 1; then spill's host chunk fits there
    assert_eq!(a.prefetch("wide", 4 * MIB as i64, 2 * MIB as i64, TierPref::Host, ok).unwrap(), 2 * MIB);
    assert_eq!(a.prefetch("spill", 0, 4 * MIB as i64, TierPref::DeviceOn(1), ok).unwrap(), 2 * MIB);
    assert_eq!(gpus_of(&a, "spill"), vec![Place::Device(1), Place::Device(1)]);
    assert_eq!(used(&a), (4 * MIB, 4 * MIB, 2 * MIB));
    // a move to a full GPU moves nothing (all or nothing, planned first)
    let before = a.lookup("wide").unwrap().chunks;
    let e = a.prefetch("wide", 0, 6 * MIB as i64, TierPref::DeviceOn(1), ok).unwrap_err();
    assert_eq!(e.code, Code::ConfigurationLimitExceeded);
    assert_eq!(a.lookup("wide").unwrap().chunks, before);
    // GPU to GPU: drop spill, then wide's 4 MiB moves from GPU 0 to GPU 1
    a.drop_segment("spill", ok).unwrap();
    assert_eq!(a.prefetch("wide", 0, MIB as i64, TierPref::DeviceOn(1), ok).unwrap(), 4 * MIB);
    assert_eq!(gpus_of(&a, "wide"), vec![Place::Device(1), Place::Host]);
    assert_eq!(used(&a), (0, 4 * MIB, 2 * MIB));
    // `device`: chunks already on a GPU stay; the host chunk goes to the roomiest GPU
    assert_eq!(a.prefetch("wide", 0, 6 * MIB as i64, TierPref::Device, ok).unwrap(), 2 * MIB);
    assert_eq!(gpus_of(&a, "wide"), vec![Place::Device(1), Place::Device(0)]);
    assert_eq!(b.pin("wide", ok).unwrap().bytes(0, data.len() as i64).unwrap(), &data[..]);
    assert_eq!(a.lookup("wide").unwrap().bytes_per_gpu(2), vec![2 * MIB, 4 * MIB]);
    a.drop_segment("wide", ok).unwrap();
    assert_eq!(used(&a), (0, 0, 0));
    drop((a, b));
    assert_eq!(world.finish(), 0);
}

/// A GPU's budget holds against concurrent growth: a chunk counts from the moment it is
/// reserved, not when it is committed, so eight processes creating 2 MiB segments on a GPU with
/// an 8 MiB budget at once get exactly four.
#[test]
fn a_budget_holds_against_concurrent_creates() {
    let world = World::new("budgetrace", Arena::default());
    let mut l = limits();
    l.device_limit = Some(8 * MIB);
    let start = Arc::new(std::sync::Barrier::new(8));
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let (w, start) = (world.clone(), start.clone());
            std::thread::spawn(move || {
                let mut s = Segments::new(TestEnv::new(&w, 10 + i), Box::new(HostProvider::simulating(1)), l);
                start.wait();
                let r = s.create(&format!("c{i}"), 2 * MIB as i64, None, TierPref::DeviceOn(0), 1, 0);
                s.detach_all();
                r.map(|_| ()).map_err(|e| e.code)
            })
        })
        .collect();
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 4, "{results:?}");
    assert!(results.iter().all(|r| *r == Ok(()) || *r == Err(Code::ConfigurationLimitExceeded)), "{results:?}");
    let mut a = two_tier(&world, 1, None);
    assert_eq!(a.env.shared().unwrap().gpu_bytes(0), 8 * MIB);
    for i in 0..8 {
        let _ = a.drop_segment(&format!("c{i}"), ok);
    }
    assert_eq!(a.env.shared().unwrap().gpu_bytes(0), 0);
    drop(a);
    assert_eq!(world.finish(), 0);
}

/// With releases deferred (the GPU service), a migration's replaced chunk and a dropped
/// segment's chunks stay at the broker until `release_deferred`, and then go: none is lost.
#[test]
fn deferred_releases_reach_the_broker_later() {
    let world = World::new("defer", Arena::default());
    let mut a = two_tier(&world, 1, None);
    a.defer_releases(true);
    let held = |s: &mut Segments<TestEnv>| {
        let epoch = s.env.shared().unwrap().epoch();
        s.with_broker(|b| b.stats(epoch)).unwrap()
    };
    a.create("d", 3 * MIB as i64, None, TierPref::Host, 1, 0).unwrap();
    assert_eq!(held(&mut a), 1);
    assert_eq!(a.prefetch("d", 0, 1, TierPref::Device, ok).unwrap(), 4 * MIB);
    assert_eq!(held(&mut a), 2, "the replaced host chunk is kept until the deferred release");
    // The copy's temporary mappings (of the old chunk and of the new one) go with it.
    assert_eq!(a.deferred_maps.len(), 2, "the migration's temporary mappings are unmapped later");
    a.release_deferred();
    assert_eq!(held(&mut a), 1);
    assert!(a.deferred_maps.is_empty());
    a.drop_segment("d", ok).unwrap();
    assert_eq!(held(&mut a), 1, "the dropped segment's chunk is kept until the deferred release");
    a.release_deferred();
    assert_eq!(held(&mut a), 0);
    // what is still deferred at exit is released there
    a.create("e", MIB as i64, None, TierPref::Host, 1, 0).unwrap();
    a.drop_segment("e", ok).unwrap();
    a.detach_all();
    drop(a);
    assert_eq!(world.finish(), 0);
}

#[test]
fn broker_calls_are_retried_by_kind_never_by_message() {
    let world = World::new("retry", Arena::default());
    let mut a = process(&world, 1);
    let calls = std::cell::Cell::new(0);
    // An answer whose text happens to say "could not": not a connection failure, no retry.
    let e = a
        .with_broker(|_| -> Result<()> {
            calls.set(calls.get() + 1);
            Err(UvmError::new(Code::SystemError, "could not find chunk 7"))
        })
        .unwrap_err();
    assert_eq!((e.code, calls.get()), (Code::SystemError, 1));
    // A failed connection, whatever its text: one retry on a fresh connection, which succeeds.
    calls.set(0);
    let epoch = a.env.shared().unwrap().epoch();
    let n = a
        .with_broker(|b| {
            calls.set(calls.get() + 1);
            if calls.get() == 1 {
                Err(UvmError::new(Code::SystemError, "broker went away").with_kind(crate::error::Kind::BrokerConnection))
            } else {
                b.stats(epoch)
            }
        })
        .unwrap();
    assert_eq!((n, calls.get()), (0, 2));
    drop(a);
    assert_eq!(world.finish(), 0);
}

#[test]
fn a_pin_keeps_its_memory_mapped_across_its_process_exit() {
    let world = World::new("exitpin", Arena::default());
    let mut a = process(&world, 1);
    a.create("s", 3 * MIB as i64, None, TierPref::Auto, 1, 0).unwrap();
    let mut p = a.pin("s", ok).unwrap();
    p.bytes_mut(3 * MIB as i64 - 4, 4).unwrap().copy_from_slice(b"kept");
    // The process "exits" while the guard is alive: its pins are given back at once...
    a.detach_all();
    assert_eq!(a.lookup("s").unwrap().pins, 0);
    assert_eq!(a.attachments().count(), 0);
    // ...but the guard's memory stays mapped until the guard goes (this read faulted when
    // detaching unmapped the reservation under it).
    assert_eq!(p.bytes(3 * MIB as i64 - 4, 4).unwrap(), b"kept");
    // The segment can be dropped meanwhile (its pins are gone); dropping the guard afterwards
    // gives nothing back twice.
    a.drop_segment("s", ok).unwrap();
    assert_eq!(p.bytes(0, 1).unwrap(), &[0]);
    drop(p);
    a.create("t", 4096, None, TierPref::Auto, 1, 0).unwrap();
    assert_eq!(a.lookup("t").unwrap().pins, 0);
    a.drop_segment("t", ok).unwrap();
    drop(a);
    assert_eq!(world.finish(), 0);
}

#[test]
fn chunks_a_live_pin_uses_are_never_unmapped_under_it() {
    let world = World::new("underpin", Arena::default());
    let mut a = two_tier(&world, 1, None);
    let mut b = two_tier(&world, 2, None);
    a.create("m", MIB as i64, None, TierPref::Host, 1, 0).unwrap();
    let mut p = a.pin("m", ok).unwrap();
    p.bytes_mut(0, 4).unwrap().copy_from_slice(b"mine");
    drop(b.pin("m", ok).unwrap()); // b attaches
                                   // Safe code with the exclusive lock frees a's attachment slot, which gives a's pin back
                                   // although a still uses the memory, and then migrates the chunk away.
    {
        let mut reg = b.env.exclusive().unwrap();
        let att = reg.attachments().iter().position(|x| x.pid == 1).unwrap();
        reg.detach(att as u32);
    }
    assert_eq!(b.prefetch("m", 0, 1, TierPref::Device, ok).unwrap(), 2 * MIB);
    // a's next pin would have to unmap the replaced chunk under `p`: refused, and `p` reads on.
    assert_eq!(a.pin("m", ok).err().unwrap().code, Code::ObjectInUse);
    assert_eq!(p.bytes(0, 4).unwrap(), b"mine");
    drop(p);
    // With the guard gone, a remaps and sees the migrated bytes.
    assert_eq!(a.pin("m", ok).unwrap().bytes(0, 4).unwrap(), b"mine");
    a.detach_all();
    b.drop_segment("m", ok).unwrap();
    drop((a, b));
    assert_eq!(world.finish(), 0);
}

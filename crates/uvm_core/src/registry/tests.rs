use super::*;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// A registry over a heap buffer, standing in for shared memory.
struct TestReg {
    _buf: Vec<u64>,
    reg: Registry,
}

fn reg(cap: Capacity, arena: Arena) -> TestReg {
    let mut buf = vec![0u64; Registry::size_for(cap) / 8 + 1];
    // SAFETY: the buffer is large enough, aligned, and owned by the returned value.
    let reg = unsafe { Registry::init(buf.as_mut_ptr() as *mut u8, cap, 42, arena) };
    TestReg { _buf: buf, reg }
}

fn small() -> TestReg {
    reg(Capacity { max_segments: 4, max_chunks: 8, max_attachments: 4 }, Arena { base: 1 << 40, size: 64 * GIB })
}

fn spec(name: &str, reserve: u64) -> NewSegment<'_> {
    NewSegment { name, owner: 10, max_size: reserve, reserve, tier_pref: TierPref::Auto, created_at: 7, align: 2 * MIB }
}

fn add_chunk(r: &mut Registry, slot: u32, size: u64, new_size: u64) -> PendingChunk {
    let off = r.info(slot).committed;
    let p = r.reserve_chunk(slot, off, size, Place::Host).unwrap();
    r.commit_chunk(&p, new_size).unwrap();
    p
}

#[test]
fn names_are_validated() {
    assert_eq!(validate_name("").unwrap_err().code, Code::InvalidName);
    assert_eq!(validate_name(&"x".repeat(64)).unwrap_err().code, Code::NameTooLong);
    assert!(validate_name(&"x".repeat(63)).is_ok());
    assert_eq!(validate_name("a\0b").unwrap_err().code, Code::InvalidName);
}

#[test]
fn the_plan_nodes_namespace_is_reserved() {
    for name in ["pg_temp_gpujoin_4242_1_inner", "pg_temp_x", "pg_temp_"] {
        assert_eq!(check_not_reserved(name).unwrap_err().code, Code::ReservedName, "{name}");
    }
    for name in ["my_pg_temp_gpujoin_1_1_inner", "pg_tem", "PG_TEMP_x", "t"] {
        assert!(check_not_reserved(name).is_ok(), "{name}");
    }
}

#[test]
fn only_the_first_broker_of_a_registry_starts_clean() {
    let mut t = small();
    assert!(t.reg.start_broker());
    assert!(!t.reg.start_broker());
    assert!(!t.reg.start_broker());
}

#[test]
fn tiers_parse() {
    assert_eq!(TierPref::parse("auto").unwrap(), TierPref::Auto);
    assert_eq!(TierPref::parse("device").unwrap(), TierPref::Device);
    assert_eq!(TierPref::parse("host").unwrap(), TierPref::Host);
    assert_eq!(TierPref::parse("gpu").unwrap_err().code, Code::InvalidParameterValue);
}

#[test]
fn rounding() {
    assert_eq!(round_up(0, 2 * MIB), Some(0));
    assert_eq!(round_up(1, 2 * MIB), Some(2 * MIB));
    assert_eq!(round_up(2 * MIB, 2 * MIB), Some(2 * MIB));
    assert_eq!(round_up(u64::MAX, 2 * MIB), None);
}

#[test]
fn chunk_sizes_double_every_two_chunks() {
    let (min, gran, reserve) = (2 * MIB, 2 * MIB, 1 << 40);
    let mut committed = 0;
    let mut sizes = vec![];
    for n in 0..8 {
        let s = next_chunk_size(committed, n, committed + 1, reserve, min, gran);
        sizes.push(s / MIB);
        committed += s;
    }
    assert_eq!(sizes, vec![2, 2, 4, 4, 8, 8, 16, 16]);
}

#[test]
fn large_growth_gets_one_exact_chunk() {
    let s = next_chunk_size(0, 0, 16 * GIB, 64 * GIB, 2 * MIB, 2 * MIB);
    assert_eq!(s, 16 * GIB);
    // capped at the reservation
    let s = next_chunk_size(60 * GIB, 30, 61 * GIB, 62 * GIB, 2 * MIB, 2 * MIB);
    assert_eq!(s, 2 * GIB);
}

#[test]
fn many_small_growths_stay_few_chunks() {
    // Grow a segment 1 MiB at a time up to 1 GiB: DSA-style doubling keeps it at ~18 chunks.
    let (mut committed, mut n, mut size) = (0u64, 0u32, 0u64);
    while size < GIB {
        size += MIB;
        if size > committed {
            committed += next_chunk_size(committed, n, size, 64 * GIB, 2 * MIB, 2 * MIB);
            n += 1;
        }
    }
    assert!(n <= 20, "{n} chunks");
}

#[test]
fn min_chunk_is_rounded_to_granularity() {
    assert_eq!(next_chunk_size(0, 0, 1, GIB, 3 * MIB, 2 * MIB), 4 * MIB);
}

#[test]
fn create_find_drop() {
    let mut t = small();
    let r = &mut t.reg;
    let slot = r.create_segment(&spec("a", 8 * MIB)).unwrap();
    assert_eq!(r.find("a"), Some(slot));
    assert_eq!(r.lookup("b").unwrap_err().code, Code::UndefinedObject);
    assert_eq!(r.create_segment(&spec("a", 8 * MIB)).unwrap_err().code, Code::DuplicateObject);
    let p = add_chunk(r, slot, 4 * MIB, 3 * MIB);
    let info = r.info(slot);
    assert_eq!((info.size, info.committed, info.generation), (3 * MIB, 4 * MIB, 2));
    assert_eq!(info.chunks, vec![ChunkInfo { id: p.id, offset: 0, size: 4 * MIB, tier: Tier::Host, device: 0 }]);
    assert_eq!(r.tier_bytes(Tier::Host), 4 * MIB);
    assert_eq!(r.known_chunk_ids(), vec![p.id]);
    assert_eq!(r.drop_segment(slot).unwrap(), vec![p.id]);
    assert_eq!(r.find("a"), None);
    assert_eq!(r.tier_bytes(Tier::Host), 0);
    assert!(r.known_chunk_ids().is_empty());
}

#[test]
fn capacity_errors() {
    let mut t = small();
    let r = &mut t.reg;
    for i in 0..4 {
        r.create_segment(&spec(&format!("s{i}"), 2 * MIB)).unwrap();
    }
    let e = r.create_segment(&spec("s4", 2 * MIB)).unwrap_err();
    assert_eq!(e.code, Code::ConfigurationLimitExceeded);
    assert!(e.hint.unwrap().contains("max_segments"));
    let slot = r.find("s0").unwrap();
    for _ in 0..8 {
        let off = r.info(slot).committed;
        let p = r.reserve_chunk(slot, off, 2 * MIB, Place::Host).unwrap();
        r.commit_chunk(&p, off + 1).unwrap();
    }
    assert_eq!(r.reserve_chunk(slot, 16 * MIB, 2 * MIB, Place::Host).unwrap_err().code, Code::ConfigurationLimitExceeded);
}

#[test]
fn pins_block_drop_and_attachments_give_them_back() {
    let mut t = small();
    let r = &mut t.reg;
    let slot = r.create_segment(&spec("a", 8 * MIB)).unwrap();
    add_chunk(r, slot, 2 * MIB, MIB);
    let id = r.info(slot).id;
    let att = r.attach(1234, id, 0x1000, true, 2).unwrap();
    let p1 = r.pin_attached(slot, att);
    let p2 = r.pin_attached(slot, att);
    assert_eq!((p1.slot(), p1.att()), (slot, att));
    assert_eq!(r.drop_segment(slot).unwrap_err().code, Code::ObjectInUse);
    drop(p1);
    assert_eq!(r.attachments()[0].pins, 1);
    assert_eq!(r.info(slot).pins, 1);
    assert_eq!(r.drop_segment(slot).unwrap_err().code, Code::ObjectInUse);
    // the process exits holding a pin: its pins are given back
    r.detach_process(1234);
    assert!(r.attachments().is_empty());
    assert_eq!(r.info(slot).pins, 0);
    // the pin's guard, dropped after that, gives nothing back twice: no count goes below zero
    drop(p2);
    assert_eq!(r.info(slot).pins, 0);
    assert!(r.drop_segment(slot).is_ok());
}

#[test]
fn a_stale_held_pin_never_releases_a_later_attachments_pin() {
    let mut t = small();
    let r = &mut t.reg;
    let slot = r.create_segment(&spec("a", 8 * MIB)).unwrap();
    add_chunk(r, slot, 2 * MIB, MIB);
    let id = r.info(slot).id;
    let att = r.attach(1, id, 0x1000, true, 2).unwrap();
    let stale = r.pin_attached(slot, att);
    r.detach(att); // gives the pin back (process exit, say)
                   // another process gets the same attachment slot and pins
    let att2 = r.attach(2, id, 0x2000, true, 2).unwrap();
    assert_eq!(att2, att);
    let live = r.pin_attached(slot, att2);
    drop(stale);
    assert_eq!(r.info(slot).pins, 1, "the stale guard released the live pin");
    assert_eq!(r.attachments()[0].pins, 1);
    assert_eq!(r.drop_segment(slot).unwrap_err().code, Code::ObjectInUse);
    drop(live);
    assert_eq!(r.info(slot).pins, 0);
    assert!(r.drop_segment(slot).is_ok());
}

#[test]
fn attachment_capacity() {
    let mut t = small();
    let r = &mut t.reg;
    for i in 0..4 {
        r.attach(100 + i, 1, 0, false, 1).unwrap();
    }
    assert_eq!(r.attach(200, 1, 0, false, 1).unwrap_err().code, Code::ConfigurationLimitExceeded);
    r.detach_process(101);
    assert!(r.attach(200, 1, 0, false, 1).is_ok());
}

#[test]
fn pending_chunks_are_known_until_aborted_and_commits_detect_races() {
    let mut t = small();
    let r = &mut t.reg;
    let slot = r.create_segment(&spec("a", 8 * MIB)).unwrap();
    let p1 = r.reserve_chunk(slot, 0, 2 * MIB, Place::Host).unwrap();
    let p2 = r.reserve_chunk(slot, 0, 2 * MIB, Place::Host).unwrap();
    assert_eq!(r.known_chunk_ids(), vec![p1.id, p2.id]);
    r.commit_chunk(&p1, MIB).unwrap();
    // p2 planned to cover offset 0 too: it lost the race
    assert_eq!(r.commit_chunk(&p2, MIB).unwrap_err().code, Code::ObjectInUse);
    r.abort_chunk(&p2);
    assert_eq!(r.known_chunk_ids(), vec![p1.id]);
    // committing into a dropped segment fails
    let p3 = r.reserve_chunk(slot, 2 * MIB, 2 * MIB, Place::Host).unwrap();
    let ids = r.drop_segment(slot).unwrap();
    assert!(ids.contains(&p3.id) && ids.contains(&p1.id));
    assert_eq!(r.commit_chunk(&p3, 3 * MIB).unwrap_err().code, Code::UndefinedObject);
}

#[test]
fn arena_ranges_are_disjoint_aligned_and_reused() {
    let mut t = small();
    let r = &mut t.reg;
    let a = r.create_segment(&spec("a", 3 * MIB)).unwrap();
    let b = r.create_segment(&spec("b", 8 * MIB)).unwrap();
    let (ia, ib) = (r.info(a), r.info(b));
    assert_eq!(ia.base_hint, 1 << 40);
    assert_eq!(ib.base_hint, (1 << 40) + 4 * MIB);
    assert!(r.in_arena(a) && r.in_arena(b));
    r.drop_segment(a).unwrap();
    let c = r.create_segment(&spec("c", 2 * MIB)).unwrap();
    assert_eq!(r.info(c).base_hint, 1 << 40);
    // does not fit in the arena: no hint, the creator records its own address
    let d = r.create_segment(&spec("d", 128 * GIB)).unwrap();
    assert!(!r.in_arena(d));
    assert_eq!(r.info(d).base_hint, 0);
    r.set_base_hint(d, 0x7000_0000_0000);
    assert_eq!(r.info(d).base_hint, 0x7000_0000_0000);
}

#[test]
fn no_arena_means_no_hint() {
    let mut t = reg(Capacity { max_segments: 2, max_chunks: 2, max_attachments: 2 }, Arena::default());
    let s = t.reg.create_segment(&spec("a", 2 * MIB)).unwrap();
    assert_eq!(t.reg.info(s).base_hint, 0);
}

#[test]
fn reattach_sees_same_contents() {
    let cap = Capacity { max_segments: 2, max_chunks: 2, max_attachments: 2 };
    let mut buf = vec![0u64; Registry::size_for(cap) / 8 + 1];
    // SAFETY: buffer owned by the test and large enough.
    let mut r = unsafe { Registry::init(buf.as_mut_ptr() as *mut u8, cap, 99, Arena::default()) };
    r.create_segment(&spec("x", 2 * MIB)).unwrap();
    // SAFETY: same buffer, initialized above.
    let r2 = unsafe { Registry::from_raw(buf.as_mut_ptr() as *mut u8) };
    assert_eq!(r2.epoch(), 99);
    assert_eq!(r2.capacity(), cap);
    assert!(r2.find("x").is_some());
}

#[test]
fn the_provider_note_is_kept_and_cut_at_a_character() {
    let mut t = small();
    assert_eq!(t.reg.provider_note(), None);
    t.reg.set_provider_note("the CUDA 12.1 driver predates shareable host-NUMA memory");
    assert_eq!(t.reg.provider_note().as_deref(), Some("the CUDA 12.1 driver predates shareable host-NUMA memory"));
    // 399 bytes then a two-byte character: cut before it, never inside
    let long = format!("{}é and more", "x".repeat(399));
    t.reg.set_provider_note(&long);
    assert_eq!(t.reg.provider_note(), Some("x".repeat(399)));
}

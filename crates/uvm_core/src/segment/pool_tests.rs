//! The host pool (`pool.rs`) against the registry and a real broker, as `tests.rs` runs the
//! rest of the segment system: migrations taking and giving back pieces, pieces made on
//! another thread, the GPU service's kept mappings, and the chunk table's room.

use super::tests::{limits, ok, two_tier, TestEnv, World};
use super::*;
use crate::provider::host::HostProvider;
use crate::registry::{Arena, Capacity, MAX_CHUNKS_PER_SEGMENT};

const MIB: u64 = 1 << 20;

/// The host pool: a migration to the host tier takes the pool's pieces (one chunk becomes one
/// chunk per piece, plus a fresh one for the rest), pins nothing new for them, and keeps the
/// bytes; a migration back to the device gives pieces back while the pool is short, and
/// releases the rest; a smaller pool size trims it.
#[test]
fn migrations_to_the_host_take_pool_pieces_and_give_them_back() {
    let world = World::new("pool", Arena::default());
    let mut l = limits();
    (l.pool_size, l.pool_piece) = (6 * MIB, 2 * MIB);
    let mut a = Segments::new(TestEnv::new(&world, 1), Box::new(HostProvider::simulating(1)), l);
    let mut b = two_tier(&world, 2, None);
    let pool = |s: &Segments<TestEnv>| s.env.shared().unwrap().pool_bytes();
    while a.pool_step().unwrap() {}
    assert_eq!(pool(&a), 6 * MIB);
    assert_eq!(a.kept_mappings(), 0, "only the GPU service keeps pieces mapped");
    let pieces: Vec<u64> = a.env.shared().unwrap().pool_chunks().iter().map(|p| p.0).collect();
    a.create("p", 8 * MIB as i64, None, TierPref::Device, 1, 0).unwrap();
    let data: Vec<u8> = (0..8 * MIB as usize).map(|i| (i * 13 % 241) as u8).collect();
    a.pin("p", ok).unwrap().bytes_mut(0, data.len() as i64).unwrap().copy_from_slice(&data);
    // to the host: three pieces of 2 MiB and one fresh chunk for the last 2 MiB
    assert_eq!(a.prefetch("p", 0, 1, TierPref::Host, ok).unwrap(), 8 * MIB);
    let info = a.lookup("p").unwrap();
    let sizes: Vec<u64> = info.chunks.iter().map(|c| c.size).collect();
    assert_eq!(sizes, vec![2 * MIB; 4]);
    assert!(info.chunks.iter().all(|c| c.place() == Place::Host));
    assert_eq!(info.chunks[..3].iter().map(|c| c.id).collect::<Vec<_>>(), pieces, "the pool's pieces, in order");
    assert_eq!((pool(&a), info.bytes_in(Tier::Host)), (0, 8 * MIB));
    assert_eq!(b.pin("p", ok).unwrap().bytes(0, data.len() as i64).unwrap(), &data[..]);
    // back to the device: each host chunk of a piece's size refills the pool until it is full
    assert_eq!(a.prefetch("p", 0, 8 * MIB as i64, TierPref::Device, ok).unwrap(), 8 * MIB);
    assert_eq!(pool(&a), 6 * MIB);
    assert_eq!(a.lookup("p").unwrap().bytes_in(Tier::Device), 8 * MIB);
    assert_eq!(b.pin("p", ok).unwrap().bytes(0, data.len() as i64).unwrap(), &data[..]);
    a.drop_segment("p", ok).unwrap();
    // a smaller pool is trimmed, one piece per step
    a.limits.pool_size = 2 * MIB;
    while a.pool_step().unwrap() {}
    assert_eq!(pool(&a), 2 * MIB);
    a.limits.pool_size = 0;
    while a.pool_step().unwrap() {}
    drop((a, b));
    assert_eq!(world.finish(), 0);
}

/// The GPU service's way to grow the pool: `pool_begin` records a pending piece, another
/// thread makes its chunk (`chunk_maker`), `pool_finish` adds it. Meanwhile the process goes on
/// (a migration to the host takes only finished pieces); a piece whose making failed leaves
/// nothing behind, and the pool does not grow past its size while a piece is pending.
#[test]
fn pool_pieces_made_on_another_thread() {
    let world = World::new("poolthread", Arena::default());
    let mut l = limits();
    (l.pool_size, l.pool_piece) = (4 * MIB, 2 * MIB);
    let mut a = Segments::new(TestEnv::new(&world, 1), Box::new(HostProvider::simulating(1)), l);
    let pool = |s: &Segments<TestEnv>| s.env.shared().unwrap().pool_bytes();
    let PoolTurn::Make(first) = a.pool_begin().unwrap() else { panic!("an empty pool grows") };
    let maker = first.maker();
    let thread = std::thread::spawn(move || maker.make());
    // while the piece is made: a migration to the host finds no piece and pins a chunk
    a.create("m", 2 * MIB as i64, None, TierPref::Device, 1, 0).unwrap();
    assert_eq!(a.prefetch("m", 0, 1, TierPref::Host, ok).unwrap(), 2 * MIB);
    assert_eq!(pool(&a), 0);
    a.pool_finish(first, thread.join().unwrap()).unwrap();
    assert_eq!(pool(&a), 2 * MIB);
    // a piece that could not be made is withdrawn: nothing pending, nothing at the broker
    let PoolTurn::Make(second) = a.pool_begin().unwrap() else { panic!("the pool is short of a piece") };
    let e = a.pool_finish(second, Err(UvmError::new(Code::OutOfMemory, "no pinnable memory"))).unwrap_err();
    assert_eq!(e.code, Code::OutOfMemory);
    assert_eq!(pool(&a), 2 * MIB);
    while a.pool_step().unwrap() {}
    assert_eq!(pool(&a), 4 * MIB);
    assert!(matches!(a.pool_begin().unwrap(), PoolTurn::Idle));
    a.drop_segment("m", ok).unwrap();
    a.limits.pool_size = 0;
    while a.pool_step().unwrap() {}
    drop(a);
    assert_eq!(world.finish(), 0);
}

/// The GPU service keeps pool-sized host chunks mapped for copies: every piece from the moment
/// it joins the pool, through a migration to the host tier (copied into) and back (read from),
/// until the chunk is released; the bytes survive both ways, and a piece released behind this
/// process's back loses its mapping at the next sweep.
#[test]
fn the_service_keeps_pool_pieces_mapped_for_copies() {
    let world = World::new("poolkept", Arena::default());
    let mut l = limits();
    (l.pool_size, l.pool_piece) = (6 * MIB, 2 * MIB);
    let mut a = Segments::new(TestEnv::new(&world, 1), Box::new(HostProvider::simulating(1)), l);
    a.keep_pool_mappings(true);
    a.defer_releases(true);
    let mut b = two_tier(&world, 2, None);
    while a.pool_step().unwrap() {}
    assert_eq!(a.kept_mappings(), 3, "each piece mapped as it joined the pool");
    a.create("k", 6 * MIB as i64, None, TierPref::Device, 1, 0).unwrap();
    let data: Vec<u8> = (0..6 * MIB as usize).map(|i| (i * 31 % 251) as u8).collect();
    a.pin("k", ok).unwrap().bytes_mut(0, data.len() as i64).unwrap().copy_from_slice(&data);
    let m = |s: &Segments<TestEnv>| s.last_migration.unwrap();
    // to the host: copied into the three pieces' kept mappings, none mapped on the way
    assert_eq!(a.prefetch("k", 0, 1, TierPref::Host, ok).unwrap(), 6 * MIB);
    assert_eq!(a.lookup("k").unwrap().bytes_in(Tier::Host), 6 * MIB);
    assert_eq!((a.kept_mappings(), m(&a).kept_copies), (3, 3));
    assert_eq!(b.pin("k", ok).unwrap().bytes(0, data.len() as i64).unwrap(), &data[..]);
    // back to the device: read from the kept mappings; the pieces go back to the pool, mapped
    a.release_deferred();
    assert_eq!(a.prefetch("k", 0, 6 * MIB as i64, TierPref::Device, ok).unwrap(), 6 * MIB);
    assert_eq!(m(&a).kept_copies, 3, "each piece read where it is kept mapped");
    assert_eq!((a.env.shared().unwrap().pool_bytes(), a.kept_mappings()), (6 * MIB, 3));
    assert_eq!(b.pin("k", ok).unwrap().bytes(0, data.len() as i64).unwrap(), &data[..]);
    // a piece released elsewhere: the sweep drops its mapping
    b.limits.pool_size = 4 * MIB;
    assert!(b.pool_step().unwrap(), "b trims one piece");
    a.sweep_kept_maps().unwrap();
    assert_eq!(a.kept_mappings(), 2);
    // released pieces take their mappings with them (deferred: after release_deferred)
    a.drop_segment("k", ok).unwrap();
    a.limits.pool_size = 0;
    while a.pool_step().unwrap() {}
    a.release_deferred();
    assert_eq!(a.kept_mappings(), 0);
    drop((a, b));
    assert_eq!(world.finish(), 0);
}

/// A chunk cut into pool pieces never overflows the segment's chunk table: 130 MiB in pieces of
/// 2 MiB would be 65 chunks, so 63 pieces and one fresh chunk for the rest make 64.
#[test]
fn pool_pieces_leave_room_in_the_chunk_table() {
    let world =
        World::with_capacity("poolcap", Arena::default(), Capacity { max_segments: 8, max_chunks: 256, max_attachments: 16 });
    let mut l = limits();
    (l.pool_size, l.pool_piece) = (128 * MIB, 2 * MIB);
    let mut a = Segments::new(TestEnv::new(&world, 1), Box::new(HostProvider::simulating(1)), l);
    while a.pool_step().unwrap() {}
    a.create("q", 130 * MIB as i64, None, TierPref::Device, 1, 0).unwrap();
    let marks = [0u64, 2 * MIB + 5, 126 * MIB, 130 * MIB - 1];
    for (i, &o) in marks.iter().enumerate() {
        a.pin("q", ok).unwrap().bytes_mut(o as i64, 1).unwrap()[0] = i as u8 + 1;
    }
    assert_eq!(a.prefetch("q", 0, 1, TierPref::Host, ok).unwrap(), 130 * MIB);
    let sizes: Vec<u64> = a.lookup("q").unwrap().chunks.iter().map(|c| c.size).collect();
    assert_eq!(sizes.len(), MAX_CHUNKS_PER_SEGMENT);
    assert_eq!((sizes[..63].iter().all(|&s| s == 2 * MIB), sizes[63]), (true, 4 * MIB));
    // chunk by chunk to the device and back: the pieces come and go, the table stays full
    assert_eq!(a.prefetch("q", 0, 130 * MIB as i64, TierPref::Device, ok).unwrap(), 130 * MIB);
    assert_eq!(a.env.shared().unwrap().pool_bytes(), 128 * MIB);
    assert_eq!(a.prefetch("q", 0, 130 * MIB as i64, TierPref::Host, ok).unwrap(), 130 * MIB);
    assert_eq!(a.lookup("q").unwrap().chunks.len(), MAX_CHUNKS_PER_SEGMENT);
    for (i, &o) in marks.iter().enumerate() {
        assert_eq!(a.pin("q", ok).unwrap().bytes(o as i64, 1).unwrap()[0], i as u8 + 1, "byte {o}");
    }
    a.drop_segment("q", ok).unwrap();
    a.limits.pool_size = 0;
    while a.pool_step().unwrap() {}
    drop(a);
    assert_eq!(world.finish(), 0);
}

/// A segment's host chunk of the piece's size that a migration gives back to the pool is not
/// kept mapped: the service's pool replaces it by a piece that is, so that no migration maps a
/// piece on its path.
#[test]
fn a_piece_the_service_does_not_keep_mapped_is_replaced() {
    let world = World::new("poolunkept", Arena::default());
    let mut l = limits();
    (l.pool_size, l.pool_piece) = (4 * MIB, 2 * MIB);
    let mut a = Segments::new(TestEnv::new(&world, 1), Box::new(HostProvider::simulating(1)), l);
    a.keep_pool_mappings(true);
    while a.pool_step().unwrap() {}
    // One piece short, then a fresh host chunk of the piece's size joins the pool.
    a.limits.pool_size = 2 * MIB;
    assert!(a.pool_step().unwrap());
    a.limits.pool_size = 4 * MIB;
    a.create("h", 2 * MIB as i64, None, TierPref::Host, 1, 0).unwrap();
    assert_eq!(a.prefetch("h", 0, 1, TierPref::Device, ok).unwrap(), 2 * MIB);
    assert_eq!((a.env.shared().unwrap().pool_bytes(), a.kept_mappings()), (4 * MIB, 1), "the pool took the chunk, unmapped");
    // The next steps trim it and make a kept piece in its place.
    while a.pool_step().unwrap() {}
    assert_eq!((a.env.shared().unwrap().pool_bytes(), a.kept_mappings()), (4 * MIB, 2));
    let pieces = a.env.shared().unwrap().pool_chunks();
    assert!(pieces.iter().all(|(id, _)| a.kept.addr(*id).is_some()), "every piece kept mapped: {pieces:?}");
    a.drop_segment("h", ok).unwrap();
    a.limits.pool_size = 0;
    while a.pool_step().unwrap() {}
    drop(a);
    assert_eq!(world.finish(), 0);
}

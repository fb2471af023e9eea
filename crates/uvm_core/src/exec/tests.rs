//! The execution seam without PostgreSQL: requests run by [`Local`] over the segment layer's
//! test world (a heap registry, a real broker thread, memfd chunks), the way a process-mode
//! backend and the GPU service run them; and the typed helpers' splitting of large data over
//! requests, through an executor whose requests carry little (as the service's staging does).

use super::local::Local;
use super::*;
use crate::error::Code;
use crate::gpujoin::pairs::{self, PairsHeader};
use crate::gpujoin::table;
use crate::registry::{Arena, TierPref};
use crate::segment::tests::{limits, ok, process, two_tier, TestEnv, World};
use crate::uvm_err;
use crate::vocab::Tier;

const MIB: u64 = 1 << 20;

/// A process-mode executor that pretends each request carries at most `max` bytes, so that the
/// helpers must split as they do for the service.
struct Small<'a> {
    inner: Local<'a, crate::segment::tests::TestEnv>,
    max: usize,
    requests: usize,
}

impl Executor for Small<'_> {
    fn mode(&self) -> Mode {
        Mode::Service
    }
    fn max_io(&self) -> usize {
        self.max
    }
    fn run(&mut self, req: &Request, io: Io<'_>) -> Result<Done> {
        let n = match &io {
            Io::In(b) => b.len(),
            Io::Out(b) => b.len(),
            Io::None => 0,
        };
        assert!(n <= self.max, "a request of {n} bytes exceeds {}", self.max);
        self.requests += 1;
        self.inner.run(req, io)
    }
}

fn seg_ref(segs: &crate::segment::Segments<crate::segment::tests::TestEnv>, name: &str) -> SegRef {
    SegRef::new(name, segs.lookup(name).unwrap().id).unwrap()
}

#[test]
fn requests_run_locally_and_split_over_small_requests() {
    let world = World::new("exec-split", Arena::default());
    let mut segs = process(&world, 1);
    {
        let mut ex = Small { inner: Local { segs: &mut segs }, max: 4096, requests: 0 };
        create(&mut ex, "e", 3 << 20, None, TierPref::Host, 10, 0).unwrap();
        let seg = SegRef::new("e", ex.inner.segs.lookup("e").unwrap().id).unwrap();
        let data: Vec<u8> = (0..3 << 20).map(|i| (i * 7 % 251) as u8).collect();
        write(&mut ex, &seg, 0, &data).unwrap();
        assert_eq!(ex.requests - 1, (3 << 20) / 4096, "one request per 4 KiB written");
        let mut back = vec![0u8; data.len() - 5];
        read(&mut ex, &seg, 5, &mut back).unwrap();
        assert_eq!(&back[..], &data[5..]);
        assert_eq!(checksum(&mut ex, &seg, 0, data.len() as i64).unwrap(), crate::checksum::checksum(&data, 0));
        fill(&mut ex, &seg, 1, 1000, 9).unwrap();
        read(&mut ex, &seg, 0, &mut back[..1001]).unwrap();
        let mut expect = vec![0u8; 1000];
        crate::checksum::fill(&mut expect, 9);
        assert_eq!(&back[1..1001], &expect[..], "the fill pattern, at its offset");
        // errors carry their codes through the seam
        assert_eq!(read(&mut ex, &seg, (3 << 20) - 1, &mut [0u8; 2]).unwrap_err().code, Code::OutOfRange);
        assert_eq!(ping(&mut ex).map(|_| ex.requests > 0), Ok(true));
        drop(&mut ex, &seg).unwrap();
    }
    std::mem::drop(segs);
    assert_eq!(world.finish(), 0, "every chunk released");
}

#[test]
fn a_stale_reference_is_refused() {
    let world = World::new("exec-stale", Arena::default());
    let mut segs = process(&world, 1);
    let mut ex = Local { segs: &mut segs };
    create(&mut ex, "s", 4096, None, TierPref::Host, 10, 0).unwrap();
    let old = SegRef::new("s", ex.segs.lookup("s").unwrap().id).unwrap();
    drop(&mut ex, &old).unwrap();
    create(&mut ex, "s", 4096, None, TierPref::Host, 10, 0).unwrap();
    // the name now denotes another segment: every operation refuses the old reference
    assert_eq!(checksum(&mut ex, &old, 0, 16).unwrap_err().code, Code::UndefinedObject);
    assert_eq!(drop(&mut ex, &old).unwrap_err().code, Code::UndefinedObject);
    assert_eq!(grow(&mut ex, &old, 8192).unwrap_err().code, Code::UndefinedObject);
    let new = SegRef::new("s", ex.segs.lookup("s").unwrap().id).unwrap();
    drop(&mut ex, &new).unwrap();
    std::mem::drop(segs);
    assert_eq!(world.finish(), 0);
}

#[test]
fn gpujoin_build_probe_and_materialize_through_requests() {
    let world = World::new("exec-join", Arena::default());
    let mut segs = process(&world, 1);
    {
        let mut ex = Small { inner: Local { segs: &mut segs }, max: 64 << 10, requests: 0 };
        let rows: Vec<[i64; 2]> = (0..20_000i64).map(|k| [k % 7000, k]).collect(); // duplicates
        let bytes = table::table_bytes(rows.len() as u64) as i64;
        create(&mut ex, "t", bytes, Some(bytes), TierPref::Host, 10, 0).unwrap();
        let t = seg_ref(ex.inner.segs, "t");
        let n = table::slot_count(rows.len() as u64);
        build_begin(&mut ex, &t, n).unwrap();
        build_insert(&mut ex, &t, KeyType::Int8, n, &rows).unwrap();
        let header = table::Header { slot_count: n, ..table::header_for(KeyType::Int8, rows.len() as u64, 0, 0) };
        write(&mut ex, &t, 0, &header.as_bytes()).unwrap();
        let keys: Vec<i64> = (-100..10_000).collect();
        let ProbeSum { matches, sum } = probe(&mut ex, &t, KeyType::Int8, &keys).unwrap();
        let expect: Vec<&[i64; 2]> = rows.iter().filter(|r| keys.contains(&r[0])).collect();
        assert_eq!(matches, expect.len() as u64);
        assert_eq!(sum, expect.iter().map(|r| r[1] as i128).sum::<i128>());
        // started (double-buffered) probes give the same
        let started = ProbeSum::from(probe_start(&mut ex, &t, KeyType::Int8, &keys[..4000]).unwrap().wait().unwrap());
        assert_eq!(started, probe(&mut ex, &t, KeyType::Int8, &keys[..4000]).unwrap());
        // materialize into a buffer that must grow
        create(&mut ex, "r", pairs::bytes_for(4) as i64, None, TierPref::Host, 10, 0).unwrap();
        let r = seg_ref(ex.inner.segs, "r");
        write(&mut ex, &r, 0, &PairsHeader::new().as_bytes()).unwrap();
        assert_eq!(materialize(&mut ex, &t, &r, KeyType::Int8, &keys, false).unwrap(), ProbeSum { matches, sum });
        let size = ex.inner.segs.lookup("r").unwrap().size;
        let mut raw = [0u8; pairs::HEADER_BYTES as usize];
        read(&mut ex, &r, 0, &mut raw).unwrap();
        assert_eq!(pairs::check_complete("r", size, &pairs::parse_header("r", &raw, size).unwrap()).unwrap(), matches);
        // indexed: each pair starts with its key's index in `keys`, across the requests that
        // the keys are split into (64 KiB of keys each here)
        write(&mut ex, &r, 0, &PairsHeader::new().as_bytes()).unwrap();
        assert!(keys.len() * 8 > ex.max);
        assert_eq!(materialize(&mut ex, &t, &r, KeyType::Int8, &keys, true).unwrap(), ProbeSum { matches, sum });
        let mut got = vec![0u8; (matches * pairs::PAIR_BYTES) as usize];
        read(&mut ex, &r, pairs::HEADER_BYTES as i64, &mut got).unwrap();
        let mut seen: Vec<[i64; 2]> = got
            .chunks_exact(16)
            .map(|p| [i64::from_ne_bytes(p[..8].try_into().unwrap()), i64::from_ne_bytes(p[8..].try_into().unwrap())])
            .map(|[i, row]| [keys[i as usize], row])
            .collect();
        seen.sort_unstable();
        let mut want: Vec<[i64; 2]> = expect.iter().map(|r| **r).collect();
        want.sort_unstable();
        assert_eq!(seen, want);
        // within the buffer's size (an executor thread's work): the same pairs where they fit;
        // where they do not, the pairs needed, the buffer's size unchanged, and after a reset
        // the main-thread form as before
        let read_pairs = |ex: &mut Small<'_>, n: u64| {
            let mut got = vec![0u8; (n * pairs::PAIR_BYTES) as usize];
            read(ex, &r, pairs::HEADER_BYTES as i64, &mut got).unwrap();
            let mut v: Vec<[i64; 2]> = got
                .chunks_exact(16)
                .map(|p| [i64::from_ne_bytes(p[..8].try_into().unwrap()), i64::from_ne_bytes(p[8..].try_into().unwrap())])
                .map(|[i, row]| [keys[i as usize], row])
                .collect();
            v.sort_unstable();
            v
        };
        write(&mut ex, &r, 0, &PairsHeader::new().as_bytes()).unwrap();
        let fit = materialize_within(&mut ex, &t, &r, KeyType::Int8, &keys, true).unwrap();
        assert_eq!(fit, Ok(ProbeSum { matches, sum }), "the buffer grew to hold them all above");
        assert_eq!(read_pairs(&mut ex, matches), want);
        // it resets the buffer itself (its first request), so a second batch needs no reset
        let again = materialize_within(&mut ex, &t, &r, KeyType::Int8, &keys[..5000], true).unwrap();
        let few: Vec<&[i64; 2]> = rows.iter().filter(|x| keys[..5000].contains(&x[0])).collect();
        assert_eq!(again.unwrap().matches, few.len() as u64);
        // started and waited for later: the same answer, in one request where the keys fit
        // one request's staging, and by the call itself where they do not
        let before = ex.requests;
        let started = materialize_within_start(&mut ex, &t, &r, KeyType::Int8, &keys[..5000], true).unwrap();
        assert_eq!(ex.requests, before + 1);
        assert_eq!(started.wait().unwrap(), again);
        assert!(keys.len() * 8 > ex.max);
        let started = materialize_within_start(&mut ex, &t, &r, KeyType::Int8, &keys, true).unwrap();
        assert_eq!(started.wait().unwrap(), fit);
        assert_eq!(read_pairs(&mut ex, matches), want);
        create(&mut ex, "r2", pairs::bytes_for(8) as i64, None, TierPref::Host, 10, 0).unwrap();
        let r2 = seg_ref(ex.inner.segs, "r2");
        // (never reset: a fresh segment's zeroes are no header, which the first request writes)
        let need = materialize_within(&mut ex, &t, &r2, KeyType::Int8, &keys, true).unwrap().unwrap_err();
        assert!(need > 8, "{need} pairs needed");
        assert_eq!(ex.inner.segs.lookup("r2").unwrap().size, pairs::bytes_for(8), "not grown");
        // (the buffer as the refused request left it: the main-thread form resets it itself)
        assert_eq!(materialize_reset(&mut ex, &t, &r2, KeyType::Int8, &keys, true).unwrap(), ProbeSum { matches, sum });
        drop(&mut ex, &r2).unwrap();
        // a segment that is no table: an error, not a crash
        assert_eq!(probe(&mut ex, &r, KeyType::Int8, &keys).unwrap_err().code, Code::InvalidParameterValue);
        for s in [&t, &r] {
            drop(&mut ex, s).unwrap();
        }
    }
    std::mem::drop(segs);
    assert_eq!(world.finish(), 0);
}

/// A client process of the GPU service (`crate::provider::remote`), as an executor that runs
/// only what `run_here` takes, and says so for the rest.
struct Here<'a>(&'a mut crate::segment::Segments<TestEnv>);

impl Executor for Here<'_> {
    fn mode(&self) -> Mode {
        Mode::Service
    }
    fn max_io(&self) -> usize {
        usize::MAX
    }
    fn run(&mut self, req: &Request, mut io: Io<'_>) -> Result<Done> {
        let call = Call::decode(req)?;
        local::run_here(self.0, &call, &mut io)?.ok_or_else(|| uvm_err!(Code::FeatureNotSupported, "not here"))
    }
}

#[test]
fn a_service_client_maps_the_host_tier_and_never_the_device() {
    use crate::exec;
    use crate::provider::remote::RemoteProvider;
    let world = World::new("client", Arena::default());
    let mut service = two_tier(&world, 1, None);
    let mut client = crate::segment::Segments::new(
        TestEnv::new(&world, 2),
        Box::new(RemoteProvider::new(crate::provider::ProviderKind::Host)),
        limits(),
    );
    let size = 4 * MIB as i64;
    let h = SegRef::new("h", service.create("h", size, None, TierPref::Host, 1, 0).unwrap()).unwrap();
    let d = SegRef::new("d", service.create("d", size, None, TierPref::Device, 1, 0).unwrap()).unwrap();
    let data: Vec<u8> = (0..size as usize).map(|i| (i * 7 % 251) as u8).collect();
    service.pin("h", ok).unwrap().write_from(0, &data).unwrap();
    service.pin("d", ok).unwrap().write_from(0, &data).unwrap();
    let not_here = |r: Result<()>| assert_eq!(r.unwrap_err().message, "not here");

    // The host tier: read, checksum, write and fill run on the client's own mapping.
    let mut out = vec![0u8; data.len()];
    exec::read(&mut Here(&mut client), &h, 0, &mut out).unwrap();
    assert!(out == data, "the client read other bytes than the service wrote");
    assert_eq!(exec::checksum(&mut Here(&mut client), &h, 0, size).unwrap(), crate::checksum::checksum(&data, 0));
    exec::write(&mut Here(&mut client), &h, 3, b"client").unwrap();
    assert_eq!(service.pin("h", ok).unwrap().bytes(3, 6).unwrap(), b"client");
    exec::fill(&mut Here(&mut client), &h, 2 * MIB as i64, MIB as i64, 5).unwrap();
    // Bounds are checked here as the service checks them.
    assert_eq!(exec::read(&mut Here(&mut client), &h, size, &mut [0u8; 1]).unwrap_err().code, Code::OutOfRange);
    {
        let p = client.pin("h", ok).unwrap();
        assert!(p.cpu_mapped(Tier::Host) && !p.cpu_mapped(Tier::Device));
        assert_eq!(p.bytes(MIB as i64, 4).unwrap(), &data[MIB as usize..MIB as usize + 4]);
    }

    // The device tier: nothing runs here, nothing is mapped.
    not_here(exec::read(&mut Here(&mut client), &d, 0, &mut out));
    not_here(exec::fill(&mut Here(&mut client), &d, 0, 8, 1));
    assert_eq!(client.pin("d", ok).unwrap().bytes(0, 1).unwrap_err().code, Code::FeatureNotSupported);

    // A migration to the device takes the chunk from the client at its next pin; back on the
    // host tier, the client maps the new chunk and reads what moved.
    service.prefetch("h", 0, size, TierPref::Device, ok).unwrap();
    not_here(exec::checksum(&mut Here(&mut client), &h, 0, size).map(|_| ()));
    service.prefetch("h", 0, size, TierPref::Host, ok).unwrap();
    exec::read(&mut Here(&mut client), &h, 3, &mut out[..6]).unwrap();
    assert_eq!(&out[..6], b"client");
    let moved = service.pin("h", ok).unwrap().bytes(0, size).unwrap().to_vec();
    assert_eq!(exec::checksum(&mut Here(&mut client), &h, 0, size).unwrap(), crate::checksum::checksum(&moved, 0));

    // A client of a CUDA cluster maps the host tier the same way (the GPU service's host chunks
    // are memfds there too), and still no device chunk.
    let mut cuda_client = crate::segment::Segments::new(
        TestEnv::new(&world, 3),
        Box::new(RemoteProvider::new(crate::provider::ProviderKind::Cuda)),
        limits(),
    );
    exec::read(&mut Here(&mut cuda_client), &h, 0, &mut out).unwrap();
    assert!(out == moved, "a CUDA cluster's client read other bytes than the service holds");
    exec::write(&mut Here(&mut cuda_client), &h, 9, b"cuda client").unwrap();
    assert_eq!(service.pin("h", ok).unwrap().bytes(9, 11).unwrap(), b"cuda client");
    not_here(exec::read(&mut Here(&mut cuda_client), &d, 0, &mut out));
    cuda_client.detach_all();
    client.detach_all();
    service.drop_segment("h", ok).unwrap();
    service.drop_segment("d", ok).unwrap();
    std::mem::drop((service, client, cuda_client));
    assert_eq!(world.finish(), 0);
}

#[test]
fn a_cpu_segment_is_mapped_by_every_client_and_given_to_no_kernel() {
    use crate::exec;
    use crate::provider::remote::RemoteProvider;
    let world = World::new("cpu-tier", Arena::default());
    let mut service = two_tier(&world, 1, None);
    // A client of a CUDA cluster: it maps `cpu` segments' memfds, and the host tier's.
    let mut client = crate::segment::Segments::new(
        TestEnv::new(&world, 2),
        Box::new(RemoteProvider::new(crate::provider::ProviderKind::Cuda)),
        limits(),
    );
    let size = 4 * MIB as i64;
    let c = SegRef::new("c", service.create("c", size, Some(4 * size), TierPref::Cpu, 1, 0).unwrap()).unwrap();
    let h = SegRef::new("h", service.create("h", size, None, TierPref::Host, 1, 0).unwrap()).unwrap();
    let info = service.lookup("c").unwrap();
    assert_eq!(info.tier_pref, TierPref::Cpu);
    assert!(info.chunks.iter().all(|k| k.tier == Tier::Host), "a cpu segment's chunks are in the host tier: {info:?}");
    let data: Vec<u8> = (0..size as usize).map(|i| (i * 11 % 253) as u8).collect();
    service.pin("c", ok).unwrap().write_from(0, &data).unwrap();

    // Read, write, checksum and fill run on the client's own mapping, both ways.
    let mut out = vec![0u8; data.len()];
    exec::read(&mut Here(&mut client), &c, 0, &mut out).unwrap();
    assert!(out == data, "the client read other bytes than the service wrote");
    exec::write(&mut Here(&mut client), &c, 5, b"cpu tier").unwrap();
    assert_eq!(service.pin("c", ok).unwrap().bytes(5, 8).unwrap(), b"cpu tier");
    exec::fill(&mut Here(&mut client), &c, MIB as i64, MIB as i64, 9).unwrap();
    let now = service.pin("c", ok).unwrap().bytes(0, size).unwrap().to_vec();
    assert_eq!(exec::checksum(&mut Here(&mut client), &c, 0, size).unwrap(), crate::checksum::checksum(&now, 0));
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    assert!(maps.contains("memfd:pg_uvm_share cpu chunk"), "no cpu chunk is mapped:\n{maps}");
    // The service checksums and fills it on the CPU (no kernel reads it).
    exec::fill(&mut Local { segs: &mut service }, &c, 0, 64, 3).unwrap();
    let now = service.pin("c", ok).unwrap().bytes(0, size).unwrap().to_vec();
    assert_eq!(exec::checksum(&mut Local { segs: &mut service }, &c, 0, size).unwrap(), crate::checksum::checksum(&now, 0));
    assert_eq!(exec::checksum(&mut Here(&mut client), &c, 0, size).unwrap(), crate::checksum::checksum(&now, 0));
    // The host tier of that cluster is mapped here too (memfds in service mode).
    exec::read(&mut Here(&mut client), &h, 0, &mut out[..1]).unwrap();

    // Growth adds memfd chunks, which the client maps at its next pin.
    service.grow("c", 3 * size, ok).unwrap();
    exec::write(&mut Here(&mut client), &c, 2 * size + 7, b"grown").unwrap();
    assert_eq!(service.pin("c", ok).unwrap().bytes(2 * size + 7, 5).unwrap(), b"grown");
    assert!(service.lookup("c").unwrap().chunks.len() > 1);

    // No process gives a kernel its address; it never moves to a GPU ("cpu" is no prefetch
    // target, and on the host tier there is nothing to move).
    for segs in [&mut service, &mut client] {
        let p = segs.pin("c", ok).unwrap();
        assert!(p.cpu_mapped(Tier::Host) && p.cpu_mapped(Tier::Device));
        let e = p.addr(0, 1).unwrap_err();
        assert_eq!(e.code, Code::FeatureNotSupported, "{e:?}");
        assert!(e.message.contains("\"cpu\" tier"), "{e:?}");
    }
    let e = service.prefetch("c", 0, size, TierPref::Device, ok).unwrap_err();
    assert_eq!(e.code, Code::FeatureNotSupported, "{e:?}");
    assert_eq!(service.prefetch("c", 0, size, TierPref::DeviceOn(0), ok).unwrap_err().code, Code::FeatureNotSupported);
    assert_eq!(service.prefetch("c", 0, size, TierPref::Cpu, ok).unwrap_err().code, Code::InvalidParameterValue);
    assert_eq!(service.prefetch("c", 0, size, TierPref::Host, ok).unwrap(), 0);
    assert_eq!(service.prefetch("h", 0, size, TierPref::Cpu, ok).unwrap_err().code, Code::InvalidParameterValue);
    // The CPU engine refuses what the kernels would: a GpuJoin table in it.
    assert_eq!(build_begin(&mut Local { segs: &mut service }, &c, 1024).unwrap_err().code, Code::FeatureNotSupported);
    let e = create(&mut Local { segs: &mut client }, "x", size, None, TierPref::Cpu, 1, 0).unwrap_err();
    assert_eq!(e.code, Code::FeatureNotSupported, "a client creates no chunk: {e:?}");

    client.detach_all();
    service.drop_segment("c", ok).unwrap();
    service.drop_segment("h", ok).unwrap();
    std::mem::drop((service, client));
    assert_eq!(world.finish(), 0);
}

/// A cache of `rows` (key, payload, text) rows in blocks of `MIN_BLOCK_ROWS` (the last one
/// partly full), written into a new segment `name` of the host tier.
fn cache_segment(ex: &mut dyn Executor, name: &str, key: crate::cache::Encoding, rows: &[(Option<i64>, Option<i64>)]) -> SegRef {
    use crate::cache::{BlockBuilder, ColumnSpec, Encoding, Layout, MIN_BLOCK_ROWS};
    let specs = [
        ColumnSpec { encoding: key, attnum: 1, scale: 0 },
        ColumnSpec { encoding: Encoding::Int4, attnum: 2, scale: 0 },
        ColumnSpec { encoding: Encoding::Float8, attnum: 3, scale: 0 },
    ];
    let mut layout = Layout::plan(7, &specs, MIN_BLOCK_ROWS).unwrap();
    let blocks = (rows.len() as u64).div_ceil(MIN_BLOCK_ROWS);
    layout.set_extent(blocks, rows.len() as u64).unwrap();
    let bytes = layout.bytes_for(blocks.max(1)) as i64;
    create(ex, name, bytes, None, TierPref::Host, 10, 0).unwrap();
    let seg = SegRef::new(name, 0).unwrap();
    write(ex, &seg, 0, &layout.prefix()).unwrap();
    for (b, part) in rows.chunks(MIN_BLOCK_ROWS as usize).enumerate() {
        let mut block = BlockBuilder::new(&layout);
        for &(k, p) in part {
            block.push(&[k.map(|k| k as u64), p.map(|p| p as i32 as i64 as u64), Some(1.5f64.to_bits())]).unwrap();
        }
        write(ex, &seg, layout.block_at(b as u64).unwrap().0 as i64, &block.finish()).unwrap();
    }
    seg
}

#[test]
fn gpujoin_over_column_caches_reads_them_in_place() {
    use crate::cache::Encoding;
    let world = World::new("exec-cached", Arena::default());
    let mut segs = process(&world, 1);
    let mut ex = Local { segs: &mut segs };
    // the inner side: repeated keys, NULL keys and NULL payloads; the outer: NULL keys
    let inner: Vec<(Option<i64>, Option<i64>)> =
        (0..3000i64).map(|i| ((i % 17 != 0).then_some(i % 2500 - 40), (i % 13 != 0).then_some(i * 3 - 700))).collect();
    let outer: Vec<(Option<i64>, Option<i64>)> = (0..5000i64).map(|i| ((i % 11 != 0).then_some(i % 2700 - 90), None)).collect();
    let ci = cache_segment(&mut ex, "ci", Encoding::Int8, &inner);
    let co = cache_segment(&mut ex, "co", Encoding::Int4, &outer);
    let stored = inner.len() as u64;
    let bytes = table::table_bytes(stored) as i64;
    create(&mut ex, "t", bytes, Some(bytes), TierPref::Host, 10, 0).unwrap();
    let t = seg_ref(ex.segs, "t");
    let n = table::slot_count(stored);
    build_begin(&mut ex, &t, n).unwrap();
    let built = cache_build(&mut ex, &t, KeyType::Int8, n, &ci, 0, Some(1)).unwrap();
    let with_key: Vec<&(Option<i64>, Option<i64>)> = inner.iter().filter(|r| r.0.is_some()).collect();
    assert_eq!(built.inserted, with_key.len() as u64);
    assert_eq!(built.null_keys, (inner.len() - with_key.len()) as u64);
    assert_eq!(built.null_payloads, with_key.iter().filter(|r| r.1.is_none()).count() as u64);
    build_finish(&mut ex, &t, KeyType::Int8, n, built.inserted, built.null_keys).unwrap();
    let (p, rows, _) = cache_probe(&mut ex, &t, KeyType::Int8, &co, 0).unwrap();
    assert_eq!(rows, outer.len() as u64);
    let (mut matches, mut sum) = (0u64, 0i128);
    for k in outer.iter().filter_map(|r| r.0) {
        for r in with_key.iter().filter(|r| r.0 == Some(k)) {
            matches += 1;
            sum += r.1.unwrap_or(0) as i128;
        }
    }
    assert_eq!((p.matches, p.sum), (matches, sum));
    // the same keys staged give the same
    let staged: Vec<i64> = outer.iter().filter_map(|r| r.0).collect();
    assert_eq!(probe(&mut ex, &t, KeyType::Int8, &staged).unwrap(), p);
    // columns the join cannot read: a float, one past the columns; another key type than the
    // table's
    for col in [2, 9] {
        let e = cache_probe(&mut ex, &t, KeyType::Int8, &ci, col).unwrap_err();
        assert_eq!(e.code, Code::InvalidParameterValue, "{e}");
    }
    assert_eq!(cache_probe(&mut ex, &t, KeyType::Int4, &ci, 0).unwrap_err().code, Code::DatatypeMismatch);
    // int8 keys into an int4 table: refused before any is read
    create(&mut ex, "t4", bytes, Some(bytes), TierPref::Host, 10, 0).unwrap();
    let t4 = seg_ref(ex.segs, "t4");
    build_begin(&mut ex, &t4, n).unwrap();
    assert_eq!(cache_build(&mut ex, &t4, KeyType::Int4, n, &ci, 0, None).unwrap_err().code, Code::InvalidParameterValue);
    let b4 = cache_build(&mut ex, &t4, KeyType::Int4, n, &co, 0, None).unwrap();
    assert_eq!(b4.inserted, outer.iter().filter(|r| r.0.is_some()).count() as u64);
    // an overwritten block count is refused, not followed
    let prefix = read_prefix(&mut ex, &co);
    let second = crate::cache::Layout::parse("co", &prefix, 1 << 30).unwrap().block_at(1).unwrap().0;
    write(&mut ex, &co, second as i64, &u64::MAX.to_le_bytes()).unwrap();
    let e = cache_probe(&mut ex, &t, KeyType::Int8, &co, 0).unwrap_err();
    assert_eq!(e.code, Code::InvalidParameterValue, "{e}");
    // not a cache at all: the table's own segment
    assert_eq!(cache_probe(&mut ex, &t, KeyType::Int8, &t, 0).unwrap_err().code, Code::InvalidParameterValue);
}

/// A cache segment's header and column directory.
fn read_prefix(ex: &mut dyn Executor, seg: &SegRef) -> Vec<u8> {
    let mut head = vec![0u8; crate::cache::HEADER_BYTES as usize];
    read(ex, seg, 0, &mut head).unwrap();
    let mut p = vec![0u8; crate::cache::Layout::prefix_len(seg.name(), &head).unwrap() as usize];
    read(ex, seg, 0, &mut p).unwrap();
    p
}

/// A scan program as a request (`ScanGroups`): a filter, a join with a dimension table and a
/// grouped aggregate over a cache, run where the segments are, the group table grown through
/// `GroupsGrow` whenever the scan stops for room; the answer is nested loops'. What the request
/// refuses: the group table among the segments read, and bytes that are not a program.
#[test]
fn scan_programs_run_as_requests_and_grow_their_group_table() {
    use crate::cache::Encoding;
    use crate::groups::{self, AggKind, Shape};
    use crate::scan::{Filter, Input, Progress, Source, Test};
    use std::collections::BTreeMap;
    let world = World::new("exec-scan", Arena::default());
    let mut segs = process(&world, 1);
    let mut ex = Local { segs: &mut segs };
    // the fact: (key, value) with NULLs in both; the dimension: keys 0 to 199, payload key / 10
    let fact: Vec<(Option<i64>, Option<i64>)> =
        (0..5000i64).map(|i| ((i % 13 != 0).then_some(i % 300), (i % 7 != 0).then_some(i % 50 - 10))).collect();
    let cache = cache_segment(&mut ex, "fact", Encoding::Int8, &fact);
    let dim: Vec<[i64; 2]> = (0..200).map(|k| [k, k / 10]).collect();
    let dbytes = table::table_bytes(dim.len() as u64) as i64;
    create(&mut ex, "dim", dbytes, Some(dbytes), TierPref::Host, 10, 0).unwrap();
    let d = seg_ref(ex.segs, "dim");
    let n = table::slot_count(dim.len() as u64);
    build_begin(&mut ex, &d, n).unwrap();
    build_insert(&mut ex, &d, KeyType::Int8, n, &dim).unwrap();
    build_finish(&mut ex, &d, KeyType::Int8, n, dim.len() as u64, 0).unwrap();
    // value between -5 and 30, joined on the key, grouped by the dimension's payload:
    // count(*), sum(value), max(value)
    let aggs = vec![(AggKind::CountStar, Input::Star), (AggKind::SumInt, Input::Col(1)), (AggKind::MaxInt, Input::Col(1))];
    let spec = scan::Spec {
        dims: vec![d],
        filters: vec![Filter::and(1, Test::Range { lo: -5, hi: 30 })],
        joins: vec![(0, 0)],
        keys: vec![Source::Payload(0)],
        aggs: aggs.clone(),
    };
    let shape = Shape { key_words: 2, aggs: aggs.iter().map(|a| a.0).collect(), slot_count: 16 };
    let table_of = |ex: &mut Local<'_, TestEnv>, name: &str, slots: u64| -> SegRef {
        let b = shape.with_slots(slots).bytes() as i64;
        create(ex, name, b, Some(b), TierPref::Host, 10, 0).unwrap();
        seg_ref(ex.segs, name)
    };
    let mut cur = table_of(&mut ex, "g0", 16);
    let mut init = vec![0u8; shape.bytes() as usize];
    groups::init(&mut init, &shape, 9).unwrap();
    write(&mut ex, &cur, 0, &init).unwrap();
    let (mut start, mut grown, mut slot_count) = ((0, 0), 0, 16);
    loop {
        match scan_groups(&mut ex, &cache, &cur, &spec, start, 0).unwrap().0 {
            Progress::Done => break,
            Progress::Full { block, row, slots } => {
                grown += 1;
                let next = table_of(&mut ex, &format!("g{grown}"), slots);
                assert!(groups_grow(&mut ex, &cur, &next, slots).unwrap() > 0);
                (cur, start, slot_count) = (next, (block, row), slots);
            }
        }
    }
    assert!(grown > 0, "16 slots hold 8 of the 20 groups: the table must have grown");
    let mut out = vec![0u8; shape.with_slots(slot_count).bytes() as usize];
    read(&mut ex, &cur, 0, &mut out).unwrap();
    let got: BTreeMap<u64, (u64, i128, i64)> = groups::Table::parse("g", &mut out)
        .unwrap()
        .groups()
        .unwrap()
        .into_iter()
        .map(|(k, s)| (k[0], (s[0].0, groups::sum_int(s[1]), s[2].0 as i64)))
        .collect();
    let mut want: BTreeMap<u64, (u64, i128, i64)> = BTreeMap::new();
    for &(k, v) in &fact {
        let (Some(k), Some(v)) = (k, v) else { continue };
        if !(-5..=30).contains(&v) || !(0..200).contains(&k) {
            continue;
        }
        let e = want.entry((k / 10) as u64).or_insert((0, 0, i64::MIN));
        e.0 += 1;
        e.1 += i128::from(v);
        e.2 = e.2.max(v);
    }
    assert_eq!(got, want);
    // the group table among the segments read: refused before anything is written
    let e = scan_groups(&mut ex, &cur, &cur, &spec, (0, 0), 0).unwrap_err();
    assert_eq!(e.code, Code::InvalidParameterValue, "{e}");
    let e = scan_groups(&mut ex, &cache, &cur, &scan::Spec { dims: vec![cur], ..spec.clone() }, (0, 0), 0).unwrap_err();
    assert_eq!(e.code, Code::InvalidParameterValue, "{e}");
    assert_eq!(groups_grow(&mut ex, &cur, &cur, 64).unwrap_err().code, Code::InvalidParameterValue);
    // bytes that are not a program
    let o = ops::ScanGroups { cache, groups: cur, start_block: 0, start_row: 0, max_groups: 0 };
    let e = call(&mut ex, &o, Io::In(&[7u8; 40])).unwrap_err();
    assert_eq!(e.code, Code::ProtocolViolation, "{e}");
    // a dimension table that is not a table (the cache)
    let e = scan_groups(&mut ex, &cache, &cur, &scan::Spec { dims: vec![cache], ..spec.clone() }, (0, 0), 0).unwrap_err();
    assert_eq!(e.code, Code::InvalidParameterValue, "{e}");
}

/// A dimension's join table from its cache (`ScanBuild`): the program grouped by the grouping
/// column first (`ScanGroups`), then a pair per row that passes (duplicate keys twice, NULL
/// keys never) naming the slot of its group; every pair read back is a row of the dimension.
/// What the request refuses: a group table that lacks a row's group, more rows than the join
/// table was sized for, one segment in two roles, a program with joins.
#[test]
fn dimension_join_tables_are_built_from_programs_over_their_caches() {
    use crate::cache::Encoding;
    use crate::groups::{self, AggKind, Shape};
    use crate::scan::{Filter, Input, Progress, Source, Test};
    let world = World::new("exec-scan-build", Arena::default());
    let mut segs = process(&world, 1);
    let mut ex = Local { segs: &mut segs };
    // (key, value): keys 0..600 with a duplicate every 50th row and a NULL key every 31st,
    // values NULL every 17th; the filter keeps values -5..=20 and NULLs
    let dim: Vec<(Option<i64>, Option<i64>)> = (0..3000i64)
        .map(|i| ((i % 31 != 0).then_some(if i % 50 == 0 { 7 } else { i % 600 }), (i % 17 != 0).then_some(i % 40 - 10)))
        .collect();
    let cache = cache_segment(&mut ex, "dimc", Encoding::Int8, &dim);
    let filters = vec![Filter::and(1, Test::Range { lo: -5, hi: 20 }), Filter::or(1, Test::Null)];
    let spec = scan::Spec {
        dims: vec![],
        filters: filters.clone(),
        joins: vec![],
        keys: vec![Source::Col(1)],
        aggs: vec![(AggKind::CountStar, Input::Star)],
    };
    let shape = Shape { key_words: 2, aggs: vec![AggKind::CountStar], slot_count: 128 };
    let groups_of = |ex: &mut Local<'_, TestEnv>, name: &str, spec: &scan::Spec| -> SegRef {
        let b = shape.bytes() as i64;
        create(ex, name, b, Some(b), TierPref::Host, 10, 0).unwrap();
        let g = seg_ref(ex.segs, name);
        let mut init = vec![0u8; shape.bytes() as usize];
        groups::init(&mut init, &shape, 3).unwrap();
        write(ex, &g, 0, &init).unwrap();
        assert_eq!(scan_groups(ex, &cache, &g, spec, (0, 0), 0).unwrap().0, Progress::Done);
        g
    };
    let g = groups_of(&mut ex, "bg", &spec);
    let mut gbytes = vec![0u8; shape.bytes() as usize];
    read(&mut ex, &g, 0, &mut gbytes).unwrap();
    let rows: u64 = groups::Table::parse("bg", &mut gbytes).unwrap().groups().unwrap().iter().map(|(_, s)| s[0].0).sum();
    let passes = |k: Option<i64>, v: Option<i64>| k.is_some() && v.is_none_or(|v| (-5..=20).contains(&v));
    let want_all = dim.iter().filter(|(_, v)| v.is_none_or(|v| (-5..=20).contains(&v))).count() as u64;
    assert_eq!(rows, want_all, "the groups count every row that passes, NULL keys too");
    let n = table::slot_count(rows);
    let tb = table::table_bytes(rows) as i64;
    create(&mut ex, "bt", tb, Some(tb), TierPref::Host, 10, 0).unwrap();
    let t = seg_ref(ex.segs, "bt");
    build_begin(&mut ex, &t, n).unwrap();
    let (inserted, _) = scan_build(&mut ex, &cache, &g, &t, &spec, 0, n).unwrap();
    let mut want: Vec<(i64, Option<i64>)> = dim.iter().filter(|(k, v)| passes(*k, *v)).map(|&(k, v)| (k.unwrap(), v)).collect();
    assert_eq!(inserted, want.len() as u64);
    build_finish(&mut ex, &t, KeyType::Int8, n, inserted, 0).unwrap();
    // every pair: its key and the value its payload's slot holds
    let mut words = vec![0u64; tb as usize / 8];
    read(&mut ex, &t, 0, words.as_mut_bytes()).unwrap();
    let jt = table::Table::view_words("bt", &words).unwrap();
    let slot_value = |slot: i64| -> Option<i64> {
        let h = groups::Head::parse("bg", &gbytes[..groups::Head::PREFIX_BYTES as usize], gbytes.len() as u64).unwrap();
        let hd = h.header();
        let at = (hd.slots_at + slot as u64 * hd.slot_bytes) as usize;
        let word = |i: usize| u64::from_le_bytes(gbytes[at + 8 * i..at + 8 * i + 8].try_into().unwrap());
        assert_ne!(word(0), 0, "a payload names an occupied slot");
        (word(2) & 1 == 0).then_some(word(1) as i64)
    };
    let mut got = Vec::new();
    for k in 0..600i64 {
        jt.for_each_match(k, |p| got.push((k, slot_value(p)))).unwrap();
    }
    got.sort();
    want.sort();
    assert_eq!(got, want);
    // the same table in one request (`ScanBuildTable`), over a table full of garbage: zeroed,
    // built, its header written: the same bytes
    create(&mut ex, "bt1", tb, Some(tb), TierPref::Host, 10, 0).unwrap();
    let t1 = seg_ref(ex.segs, "bt1");
    fill(&mut ex, &t1, 0, tb, 99).unwrap();
    scan_build_table(&mut ex, &cache, &g, &t1, &spec, 0, n, inserted).unwrap();
    let mut words1 = vec![0u64; tb as usize / 8];
    read(&mut ex, &t1, 0, words1.as_mut_bytes()).unwrap();
    assert!(words1 == words, "ScanBuildTable's table is BuildBegin, ScanBuild and build_finish's");
    // told another count of rows: an ERROR, and the table left without a header
    let e = scan_build_table(&mut ex, &cache, &g, &t1, &spec, 0, n, inserted + 1).unwrap_err();
    assert!(e.message.contains("inserted"), "{e}");
    read(&mut ex, &t1, 0, words1.as_mut_bytes()).unwrap();
    assert!(table::Table::view_words("bt1", &words1).is_err());
    let e = scan_build_table(&mut ex, &cache, &t1, &t1, &spec, 0, n, inserted).unwrap_err();
    assert_eq!(e.code, Code::InvalidParameterValue, "{e}");
    // a group table of another filter lacks groups of these rows
    let other = scan::Spec { filters: vec![Filter::and(1, Test::Range { lo: 0, hi: 0 })], ..spec.clone() };
    let g2 = groups_of(&mut ex, "bg2", &other);
    build_begin(&mut ex, &t, n).unwrap();
    let e = scan_build(&mut ex, &cache, &g2, &t, &spec, 0, n).unwrap_err();
    assert_eq!(e.code, Code::InvalidParameterValue, "{e}");
    // a join table sized for fewer rows
    build_begin(&mut ex, &t, 64).unwrap();
    let e = scan_build(&mut ex, &cache, &g, &t, &spec, 0, 64).unwrap_err();
    assert!(e.message.contains("sized for"), "{e}");
    // one segment in two roles; a program with joins; a key column that is not integer-like
    assert_eq!(scan_build(&mut ex, &cache, &t, &t, &spec, 0, n).unwrap_err().code, Code::InvalidParameterValue);
    assert_eq!(scan_build(&mut ex, &cache, &cache, &t, &spec, 0, n).unwrap_err().code, Code::InvalidParameterValue);
    let joined = scan::Spec { dims: vec![t], joins: vec![(0, 0)], ..spec.clone() };
    assert_eq!(scan_build(&mut ex, &cache, &g, &t, &joined, 0, n).unwrap_err().code, Code::InvalidParameterValue);
    assert_eq!(scan_build(&mut ex, &cache, &g, &t, &spec, 2, n).unwrap_err().code, Code::InvalidParameterValue);
}

/// A segment made with its first bytes in one request (`CreateWith`), in staging's size or
/// past it (a creation, then writes); bytes past the size refused with the segment dropped
/// again; and several segments dropped in one request (`DropSegments`), in order, the first
/// failure ending it with those before it dropped.
#[test]
fn segments_are_made_with_their_bytes_and_dropped_together() {
    let world = World::new("exec-create-with", Arena::default());
    let mut segs = process(&world, 1);
    {
        let mut ex = Small { inner: Local { segs: &mut segs }, max: 4096, requests: 0 };
        for (name, len, requests) in [("cw_small", 1000usize, 1), ("cw_large", 4096 * 2 + 3, 4)] {
            let data: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            let size = (len + 100) as i64;
            let before = ex.requests;
            let id = create_with(&mut ex, name, size, Some(size), TierPref::Auto, 10, 0, &data).unwrap();
            assert_eq!(ex.requests - before, requests, "{name}: one request where the bytes fit");
            let seg = seg_ref(ex.inner.segs, name);
            assert_eq!(seg.id, id);
            let mut back = vec![0u8; len];
            read(&mut ex, &seg, 0, &mut back).unwrap();
            assert!(back == data, "{name}: the bytes read back");
        }
        // more bytes than the segment holds: the write's error, and no segment left
        let e = create_with(&mut ex, "cw_short", 64, Some(64), TierPref::Auto, 10, 0, &[1u8; 65]).unwrap_err();
        assert_eq!(e.code, Code::OutOfRange, "{e}");
        assert_eq!(ex.inner.segs.lookup("cw_short").unwrap_err().code, Code::UndefinedObject);
        // a name taken: the creation's error, the segment as it was
        let e = create_with(&mut ex, "cw_small", 64, Some(64), TierPref::Auto, 10, 0, &[1u8; 8]).unwrap_err();
        assert_eq!(e.code, Code::DuplicateObject, "{e}");
        assert_eq!(ex.inner.segs.lookup("cw_small").unwrap().size, 1100);
        // dropped together in one request; then a list whose second is gone: the first
        // dropped, the third kept
        let (a, b) = (seg_ref(ex.inner.segs, "cw_small"), seg_ref(ex.inner.segs, "cw_large"));
        let before = ex.requests;
        drop_all(&mut ex, &[a, b]).unwrap();
        assert_eq!(ex.requests - before, 1);
        assert!(ex.inner.segs.lookup("cw_small").is_err() && ex.inner.segs.lookup("cw_large").is_err());
        for n in ["d1", "d3"] {
            create(&mut ex, n, 64, Some(64), TierPref::Auto, 10, 0).unwrap();
        }
        let (d1, d3) = (seg_ref(ex.inner.segs, "d1"), seg_ref(ex.inner.segs, "d3"));
        let e = drop_all(&mut ex, &[d1, a, d3]).unwrap_err();
        assert_eq!(e.code, Code::UndefinedObject, "{e}");
        assert!(ex.inner.segs.lookup("d1").is_err());
        assert!(ex.inner.segs.lookup("d3").is_ok());
        // bytes that are not whole segment references
        let e = call(&mut ex, &ops::DropSegments {}, Io::In(&[0u8; 13])).unwrap_err();
        assert_eq!(e.code, Code::ProtocolViolation, "{e}");
        // more than one request's worth of names (three a request here): split
        ex.max = 256;
        let many: Vec<String> = (0..6).map(|i| format!("m{i}")).collect();
        for n in &many {
            create(&mut ex, n, 64, Some(64), TierPref::Auto, 10, 0).unwrap();
        }
        let refs: Vec<SegRef> = many.iter().map(|n| seg_ref(ex.inner.segs, n)).chain([d3]).collect();
        let before = ex.requests;
        drop_all(&mut ex, &refs).unwrap();
        assert_eq!(ex.requests - before, 3);
        assert!(many.iter().all(|n| ex.inner.segs.lookup(n).is_err()));
        drop_all(&mut ex, &[]).unwrap();
    }
    std::mem::drop(segs);
    assert_eq!(world.finish(), 0, "every chunk released");
}

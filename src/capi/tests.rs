//! The header and the library must agree on every struct's layout: a C compiler reads
//! `include/pg_uvm_share.h` and prints each member's offset and each struct's size, which must
//! equal the Rust `repr(C)` mirrors'. (Runs where PostgreSQL's server headers are: `PG_CONFIG`,
//! as `make unit` exports it, or Debian's PostgreSQL 15.)

use std::mem::{offset_of, size_of};
use std::process::Command;

use super::*;

/// `(name, value)` of every size and offset the C side prints.
fn rust_layout() -> Vec<(&'static str, usize)> {
    vec![
        ("UvmSegmentInfo", size_of::<UvmSegmentInfo>()),
        ("UvmSegmentInfo.generation", offset_of!(UvmSegmentInfo, generation)),
        ("UvmSegmentInfo.owner", offset_of!(UvmSegmentInfo, owner)),
        ("UvmSegmentInfo.nchunks", offset_of!(UvmSegmentInfo, nchunks)),
        ("UvmChunk", size_of::<UvmChunk>()),
        ("UvmChunk.tier", offset_of!(UvmChunk, tier)),
        ("UvmChunk.cpu_mapped", offset_of!(UvmChunk, cpu_mapped)),
        ("UvmPin", size_of::<UvmPin>()),
        ("UvmPin.info", offset_of!(UvmPin, info)),
        ("UvmPin.base", offset_of!(UvmPin, base)),
        ("UvmPin.same_address", offset_of!(UvmPin, same_address)),
        ("UvmPin.chunks", offset_of!(UvmPin, chunks)),
        ("UvmKernel", size_of::<UvmKernel>()),
        ("UvmKernel.entry", offset_of!(UvmKernel, entry)),
        ("UvmKernel.grid", offset_of!(UvmKernel, grid)),
        ("UvmKernel.block", offset_of!(UvmKernel, block)),
        ("UvmKernel.shared_mem_bytes", offset_of!(UvmKernel, shared_mem_bytes)),
        ("UvmKernelArg", size_of::<UvmKernelArg>()),
        ("UvmKernelArg.value", offset_of!(UvmKernelArg, value)),
        ("UvmKernelArg.pin", offset_of!(UvmKernelArg, pin)),
        ("PgUvmShareApi", size_of::<PgUvmShareApi>()),
        ("PgUvmShareApi.library_version", offset_of!(PgUvmShareApi, library_version)),
        ("PgUvmShareApi.execution_mode", offset_of!(PgUvmShareApi, execution_mode)),
        ("PgUvmShareApi.lookup", offset_of!(PgUvmShareApi, lookup)),
        ("PgUvmShareApi.attach", offset_of!(PgUvmShareApi, attach)),
        ("PgUvmShareApi.pin", offset_of!(PgUvmShareApi, pin)),
        ("PgUvmShareApi.device_address", offset_of!(PgUvmShareApi, device_address)),
        ("PgUvmShareApi.launch", offset_of!(PgUvmShareApi, launch)),
        ("PgUvmShareApi.launch_wait", offset_of!(PgUvmShareApi, launch_wait)),
        ("PgUvmShareApi.cache_pin", offset_of!(PgUvmShareApi, cache_pin)),
        ("UvmCacheColumn", size_of::<UvmCacheColumn>()),
        ("UvmCacheColumn.encoding", offset_of!(UvmCacheColumn, encoding)),
        ("UvmCacheColumn.width", offset_of!(UvmCacheColumn, width)),
        ("UvmCacheColumn.scale", offset_of!(UvmCacheColumn, scale)),
        ("UvmCacheColumn.values_at", offset_of!(UvmCacheColumn, values_at)),
        ("UvmCacheColumn.nulls_at", offset_of!(UvmCacheColumn, nulls_at)),
        ("UvmCacheColumn.dictionary", offset_of!(UvmCacheColumn, dictionary)),
        ("UvmCache", size_of::<UvmCache>()),
        ("UvmCache.rows", offset_of!(UvmCache, rows)),
        ("UvmCache.data_offset", offset_of!(UvmCache, data_offset)),
        ("UvmCache.block_header_bytes", offset_of!(UvmCache, block_header_bytes)),
        ("UvmCache.ncolumns", offset_of!(UvmCache, ncolumns)),
        ("UvmCache.columns", offset_of!(UvmCache, columns)),
        ("PG_UVM_SHARE_ABI_VERSION", ((ABI_MAJOR << 16) | ABI_MINOR) as usize),
        ("UVM_TIER_HOST", Tier::Host as usize),
        ("UVM_TIER_DEVICE", Tier::Device as usize),
        ("UVM_ARG_SCALAR", ARG_SCALAR as usize),
        ("UVM_ARG_SEGMENT", ARG_SEGMENT as usize),
        ("UVM_MAX_KERNEL_ARGS", crate::gpu::user::MAX_PARAMS),
        ("UVM_ENC_BOOL", crate::cache::Encoding::Bool as usize),
        ("UVM_ENC_INT2", crate::cache::Encoding::Int2 as usize),
        ("UVM_ENC_INT4", crate::cache::Encoding::Int4 as usize),
        ("UVM_ENC_INT8", crate::cache::Encoding::Int8 as usize),
        ("UVM_ENC_FLOAT4", crate::cache::Encoding::Float4 as usize),
        ("UVM_ENC_FLOAT8", crate::cache::Encoding::Float8 as usize),
        ("UVM_ENC_DATE", crate::cache::Encoding::Date as usize),
        ("UVM_ENC_TIMESTAMP", crate::cache::Encoding::Timestamp as usize),
        ("UVM_ENC_TIMESTAMPTZ", crate::cache::Encoding::TimestampTz as usize),
        ("UVM_ENC_NUMERIC", crate::cache::Encoding::Numeric as usize),
        ("UVM_ENC_DICT_CODE", crate::cache::Encoding::DictCode as usize),
    ]
}

fn pg_config() -> String {
    std::env::var("PG_CONFIG").unwrap_or_else(|_| "/usr/lib/postgresql/15/bin/pg_config".into())
}

#[test]
fn header_layout_matches_the_library() {
    let include = Command::new(pg_config()).arg("--includedir-server").output().expect("run pg_config");
    assert!(include.status.success(), "pg_config --includedir-server failed");
    let include = String::from_utf8(include.stdout).unwrap().trim().to_string();
    let dir = std::env::temp_dir().join(format!("uvm-capi-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut c = String::from(
        "#include \"postgres.h\"\n#include \"pg_uvm_share.h\"\n#include <stdio.h>\n#include <stddef.h>\n#undef printf\nint main(void) {\n",
    );
    for (name, _) in rust_layout() {
        let expr = match name.split_once('.') {
            Some((t, m)) => format!("offsetof({t}, {m})"),
            None if name.starts_with("Uvm") || name.starts_with("Pg") => format!("sizeof({name})"),
            None => name.to_string(),
        };
        c.push_str(&format!("printf(\"{name} %zu\\n\", (size_t) ({expr}));\n"));
    }
    c.push_str("return 0; }\n");
    std::fs::write(dir.join("layout.c"), c).unwrap();
    let header_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/include");
    let built = Command::new("cc")
        .args(["-o", dir.join("layout").to_str().unwrap(), dir.join("layout.c").to_str().unwrap()])
        .args(["-I", header_dir, "-I", &include])
        .status()
        .expect("run cc (a C compiler is a prerequisite: scripts/install-prereqs.sh)");
    assert!(built.success(), "the header does not compile");
    let out = Command::new(dir.join("layout")).output().unwrap();
    let printed = String::from_utf8(out.stdout).unwrap();
    let c_side: Vec<(String, usize)> = printed
        .lines()
        .map(|l| {
            let (n, v) = l.rsplit_once(' ').unwrap();
            (n.to_string(), v.parse().unwrap())
        })
        .collect();
    let rust: Vec<(String, usize)> = rust_layout().into_iter().map(|(n, v)| (n.to_string(), v)).collect();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(c_side, rust, "include/pg_uvm_share.h and src/capi disagree");
}

#[test]
fn offsets_outside_the_pin_are_2202e_and_negative_ones_22023() {
    assert!(check_pinned(100, 0, 100).is_ok());
    assert!(check_pinned(100, 100, 0).is_ok());
    assert_eq!(check_pinned(100, 1, 100).unwrap_err().code, Code::OutOfRange);
    assert_eq!(check_pinned(100, i64::MAX, i64::MAX).unwrap_err().code, Code::OutOfRange);
    assert_eq!(check_pinned(100, -1, 1).unwrap_err().code, Code::InvalidParameterValue);
    assert_eq!(check_pinned(100, 0, -1).unwrap_err().code, Code::InvalidParameterValue);
}

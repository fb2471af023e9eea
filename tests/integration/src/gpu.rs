//! GPU helpers: `nvidia-smi`'s view of memory and processes, which libraries a process maps,
//! and segments placed in a tier.

use crate::*;

/// Device memory in use on GPU 0, in MiB, as `nvidia-smi` reports it (all processes).
pub fn gpu_memory_used_mib() -> u64 {
    try_gpu_memory_used_mib().unwrap_or_else(|e| panic!("{e}"))
}

/// `gpu_memory_used_mib`, or why nvidia-smi could not tell.
pub fn try_gpu_memory_used_mib() -> Result<u64, String> {
    let out = std::process::Command::new("nvidia-smi")
        .args(["--query-gpu=memory.used", "--format=csv,noheader,nounits"])
        .output()
        .map_err(|e| format!("cannot run nvidia-smi: {e}"))?;
    if !out.status.success() {
        return Err(format!("nvidia-smi --query-gpu=memory.used failed: {}", String::from_utf8_lossy(&out.stderr).trim()));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines().next().and_then(|l| l.trim().parse().ok()).ok_or_else(|| format!("unexpected nvidia-smi output: {text:?}"))
}

/// Device memory (MiB) that `nvidia-smi` attributes to process `pid`, if it lists it (it does
/// not when the process runs in another pid namespace than nvidia-smi sees).
pub fn gpu_process_memory_mib(pid: i32) -> Option<u64> {
    let out = std::process::Command::new("nvidia-smi")
        .args(["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
        let mut it = l.split(',').map(str::trim);
        let p: i32 = it.next()?.parse().ok()?;
        let m: u64 = it.next()?.parse().ok()?;
        (p == pid).then_some(m)
    })
}

/// Every process `nvidia-smi` lists as using GPU memory, as (pid, MiB); the MiB is `None` where
/// nvidia-smi cannot tell (`[N/A]`). An empty list when no process uses the GPU.
pub fn gpu_compute_apps() -> Result<Vec<(i32, Option<u64>)>, String> {
    let out = std::process::Command::new("nvidia-smi")
        .args(["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"])
        .output()
        .map_err(|e| format!("cannot run nvidia-smi: {e}"))?;
    if !out.status.success() {
        return Err(format!("nvidia-smi --query-compute-apps failed: {}", String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut it = l.split(',').map(str::trim);
            let pid: i32 = it.next()?.parse().ok()?;
            Some((pid, it.next().and_then(|m| m.parse().ok())))
        })
        .collect())
}

/// The CUDA driver and NVRTC libraries (`libcuda.so*`, `libnvrtc*`) process `pid` maps, read
/// from `/proc/<pid>/maps`: `Ok(None)` once the process is gone, an error when its maps cannot
/// be read (another user's process needs root).
pub fn cuda_libraries_mapped(pid: i32) -> Result<Option<Vec<String>>, String> {
    let Some(maps) = process_maps(pid)? else { return Ok(None) };
    let mut libs: Vec<String> = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|path| {
            let file = path.rsplit('/').next().unwrap_or(path);
            file.starts_with("libcuda.so") || file.starts_with("libnvrtc")
        })
        .map(str::to_string)
        .collect();
    libs.sort();
    libs.dedup();
    Ok(Some(libs))
}

/// `/proc/<pid>/maps`: `Ok(None)` once the process is gone, an error when it cannot be read
/// (another user's process needs root).
pub fn process_maps(pid: i32) -> Result<Option<String>, String> {
    let maps = match fs::read_to_string(format!("/proc/{pid}/maps")) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH) => return Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => match read_maps_as_owner(pid)? {
            Some(m) => m,
            None => return Ok(None),
        },
        Err(e) => return Err(format!("cannot read /proc/{pid}/maps: {e}")),
    };
    if maps.is_empty() && !process_alive(pid) {
        return Ok(None); // exited between open and read
    }
    Ok(Some(maps))
}

/// `/proc/<pid>/maps` read as the process's owner, through `setpriv`: root without
/// CAP_SYS_PTRACE (a container's) may not read another user's maps, but may become that user.
fn read_maps_as_owner(pid: i32) -> Result<Option<String>, String> {
    let Ok(status) = fs::read_to_string(format!("/proc/{pid}/status")) else { return Ok(None) };
    let id = |key: &str| status.lines().find_map(|l| l.strip_prefix(key)).and_then(|r| r.split_whitespace().next());
    let (Some(uid), Some(gid)) = (id("Uid:"), id("Gid:")) else {
        return Err(format!("/proc/{pid}/status has no Uid or Gid line"));
    };
    let out = std::process::Command::new("setpriv")
        .args(["--reuid", uid, "--regid", gid, "--clear-groups", "cat", &format!("/proc/{pid}/maps")])
        .output()
        .map_err(|e| format!("cannot read /proc/{pid}/maps (permission denied) nor run setpriv: {e}"))?;
    if out.status.success() {
        Ok(Some(String::from_utf8_lossy(&out.stdout).into_owned()))
    } else if !process_alive(pid) {
        Ok(None)
    } else {
        Err(format!(
            "cannot read /proc/{pid}/maps, neither as this user nor as uid {uid}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Whether a list from [`cuda_libraries_mapped`] holds the CUDA driver (libcuda).
pub fn maps_libcuda(libs: &[String]) -> bool {
    libs.iter().any(|p| p.rsplit('/').next().unwrap_or(p).starts_with("libcuda.so"))
}

/// The live children of process `parent` (every process of a cluster is a child of its
/// postmaster), from `/proc/*/stat`.
pub fn child_pids(parent: i32) -> Vec<i32> {
    let Ok(dir) = fs::read_dir("/proc") else { return Vec::new() };
    let mut pids: Vec<i32> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            fs::read_to_string(format!("/proc/{pid}/stat")).ok().is_some_and(|stat| {
                // state and ppid are the two fields after the parenthesised command name
                let mut rest = stat.rsplit(')').next().unwrap_or("").split_whitespace();
                let state = rest.next();
                let ppid = rest.next().and_then(|p| p.parse::<i32>().ok());
                ppid == Some(parent) && state != Some("Z") && state != Some("X")
            })
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// `value` of `uvm.device_info()` for `property`, if the provider reports it.
pub fn device_info_value(c: &mut Client, property: &str) -> Option<String> {
    c.query_opt("SELECT value FROM uvm.device_info() WHERE property = $1", &[&property])
        .unwrap_or_else(|e| panic!("uvm.device_info(): {}", describe(&e)))
        .map(|r| r.get(0))
}

/// Asserts that the cluster runs the CUDA provider (`uvm.device_info()` property `provider`).
#[track_caller]
pub fn assert_cuda_provider(c: &mut Client) {
    let p = device_info_value(c, "provider");
    assert_eq!(p.as_deref(), Some("cuda"), "the GPU suite needs the CUDA provider (uvm.device_info() says provider = {p:?})");
}

/// `uvm.create_segment(name, size, max_size, tier)`, or the error.
pub fn try_create_segment_tier(
    c: &mut Client,
    name: &str,
    size: i64,
    max_size: Option<i64>,
    tier: &str,
) -> Result<i64, postgres::Error> {
    c.query_one("SELECT uvm.create_segment($1, $2, $3, $4)::bigint", &[&name, &size, &max_size, &tier]).map(|r| r.get(0))
}

/// `uvm.create_segment(name, size, max_size, tier)`, returns the id.
pub fn create_segment_tier(c: &mut Client, name: &str, size: i64, max_size: Option<i64>, tier: &str) -> i64 {
    try_create_segment_tier(c, name, size, max_size, tier)
        .unwrap_or_else(|e| panic!("create_segment({name}, {size}, {max_size:?}, {tier}): {}", describe(&e)))
}

/// `uvm.fill_segment(name, offset, length, seed)` (the GPU fill kernel with the CUDA provider).
pub fn fill_segment(c: &mut Client, name: &str, offset: i64, len: i64, seed: i64) -> i64 {
    c.query_one("SELECT uvm.fill_segment($1, $2, $3, $4)::bigint", &[&name, &offset, &len, &seed])
        .unwrap_or_else(|e| panic!("fill_segment({name}, {offset}, {len}, {seed}): {}", describe(&e)))
        .get(0)
}

/// `uvm.prefetch_segment(name, offset, length, tier)`, returns the bytes moved.
pub fn prefetch_segment(c: &mut Client, name: &str, offset: i64, len: i64, tier: &str) -> i64 {
    c.query_one("SELECT uvm.prefetch_segment($1, $2, $3, $4)::bigint", &[&name, &offset, &len, &tier])
        .unwrap_or_else(|e| panic!("prefetch_segment({name}, {offset}, {len}, {tier}): {}", describe(&e)))
        .get(0)
}

/// `(device_bytes, host_bytes)` of a segment from `uvm.segments`.
pub fn tier_bytes(c: &mut Client, name: &str) -> (i64, i64) {
    c.query_opt("SELECT device_bytes::bigint, host_bytes::bigint FROM uvm.segments WHERE name = $1", &[&name])
        .unwrap_or_else(|e| panic!("uvm.segments for {name}: {}", describe(&e)))
        .map(|r| (r.get(0), r.get(1)))
        .unwrap_or_else(|| panic!("segment {name} is not in uvm.segments"))
}

/// Reads `[offset, offset + len)` in `read_segment` calls of at most 64 MiB.
pub fn read_segment_all(c: &mut Client, name: &str, offset: i64, len: i64) -> Vec<u8> {
    const PIECE: i64 = 64 << 20;
    let mut out = Vec::with_capacity(len as usize);
    let mut at = 0;
    while at < len {
        let n = PIECE.min(len - at);
        out.extend_from_slice(&read_segment(c, name, offset + at, n as i32));
        at += n;
    }
    out
}

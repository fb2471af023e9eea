//! On a machine without the CUDA driver, `provider = auto` picks the host provider and nothing
//! CUDA-related is touched: no process of the cluster maps libcuda or opens an NVIDIA device.
//! (On a machine with a driver this test asserts the opposite choice instead, so it never
//! passes vacuously.)

use pg_uvm_share_tests::*;

fn has_cuda_driver() -> bool {
    std::process::Command::new("ldconfig")
        .arg("-p")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("libcuda.so.1 "))
        .unwrap_or(false)
}

fn touches_cuda(pid: i32) -> Vec<String> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    let mut hits: Vec<String> = maps
        .lines()
        .filter(|l| l.contains("libcuda") || l.contains("libnvrtc") || l.contains("/dev/nvidia"))
        .map(String::from)
        .collect();
    if let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
        for e in dir.flatten() {
            if let Ok(t) = std::fs::read_link(e.path()) {
                if t.to_string_lossy().starts_with("/dev/nvidia") {
                    hits.push(t.to_string_lossy().into_owned());
                }
            }
        }
    }
    hits
}

#[test]
fn auto_picks_host_without_a_driver_and_touches_no_cuda() {
    let mut c = connect();
    let name = unique_name("hostprov");
    create_segment(&mut c, &name, 1 << 20);
    let provider: String = c.query_one("SELECT value FROM uvm.device_info() WHERE property = 'provider'", &[]).unwrap().get(0);
    if has_cuda_driver() {
        assert_eq!(provider, "cuda", "auto did not pick CUDA on a machine with a driver");
    } else {
        assert_eq!(provider, "host");
        let backend = backend_pid(&mut c);
        for (what, pid) in [
            ("backend", backend),
            ("broker", broker_pid(&mut c).expect("the broker is running")),
            ("postmaster", postmaster_pid()),
        ] {
            let hits = touches_cuda(pid);
            assert!(hits.is_empty(), "the {what} ({pid}) touched CUDA: {hits:?}");
        }
    }
    c.execute("SELECT uvm.drop_segment($1)", &[&name]).unwrap();
}

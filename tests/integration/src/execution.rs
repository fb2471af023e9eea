//! Execution mode: each process, or the GPU service.

use crate::*;

/// The backend_type the GPU service shows in pg_stat_activity.
pub const SERVICE_BACKEND_TYPE: &str = "pg_uvm_share gpu service";

/// Where the cluster under test runs operations on segment memory
/// (`pg_uvm_share.gpu_execution`, shown by `uvm.device_info()` as `execution`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Execution {
    /// Every backend and parallel worker maps segments and runs its own work.
    Process,
    /// One background worker, the GPU service, maps segments and runs the work of everyone.
    Service,
}

/// The mode this run expects: `UVM_EXPECT_EXECUTION`, `process` or `service` (set by
/// `make integration` and `make integration-service`). Missing or anything else: a hard failure.
pub fn expected_execution() -> Execution {
    match env_var("UVM_EXPECT_EXECUTION").as_str() {
        "process" => Execution::Process,
        "service" => Execution::Service,
        other => panic!("UVM_EXPECT_EXECUTION must be 'process' or 'service', not {other:?}"),
    }
}

/// The cluster's execution mode, checked against [`expected_execution`]: a suite run against a
/// cluster of the other mode fails here instead of testing the wrong thing.
#[track_caller]
pub fn execution(c: &mut Client) -> Execution {
    let want = expected_execution();
    let got = device_info_value(c, "execution");
    let want_name = match want {
        Execution::Process => "process",
        Execution::Service => "service",
    };
    assert_eq!(got.as_deref(), Some(want_name), "uvm.device_info() execution (UVM_EXPECT_EXECUTION={want_name})");
    want
}

/// The GPU service's request counters (`uvm.device_info()`, row `service_requests`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServiceRequests {
    pub submitted: i64,
    pub completed: i64,
    pub abandoned: i64,
}

/// The service's request counters now ("N submitted, N completed, N abandoned"). Reading them
/// is itself a request in service mode (`device_info` asks the service for the provider's rows),
/// counted before the counters are read or after, depending on the moment: compare with slack.
pub fn service_requests(c: &mut Client) -> ServiceRequests {
    let v = device_info_value(c, "service_requests").expect("uvm.device_info() has no service_requests row");
    let n: Vec<i64> = v.split(',').filter_map(|p| p.split_whitespace().next()).filter_map(|x| x.parse().ok()).collect();
    assert_eq!(n.len(), 3, "service_requests {v:?}: want 'N submitted, N completed, N abandoned'");
    ServiceRequests { submitted: n[0], completed: n[1], abandoned: n[2] }
}

/// The GPU service's pid as `uvm.device_info()` reports it (0: none running).
pub fn service_pid(c: &mut Client) -> i32 {
    let v = device_info_value(c, "service_pid").expect("uvm.device_info() has no service_pid row");
    v.parse().unwrap_or_else(|_| panic!("service_pid {v:?} is not a pid"))
}

/// The GPU service's pid from pg_stat_activity, if it is running.
pub fn service_pid_in_activity(c: &mut Client) -> Option<i32> {
    c.query_opt(
        "SELECT pid FROM pg_stat_activity WHERE backend_type = $1 ORDER BY backend_start DESC LIMIT 1",
        &[&SERVICE_BACKEND_TYPE],
    )
    .expect("query pg_stat_activity for the GPU service")
    .map(|r| r.get::<_, i32>(0))
}

/// The process that maps segments, and pins them while it works, for the requests of backend
/// `backend` that need the device or the service (the GpuJoin operations, device-tier bytes): the
/// backend itself in process mode, the GPU service in service mode. For host-tier bytes see
/// [`host_tier_pid`].
pub fn mapping_pid(c: &mut Client, backend: i32) -> i32 {
    match execution(c) {
        Execution::Process => backend,
        Execution::Service => {
            let pid = service_pid(c);
            assert!(pid > 0, "service mode, but uvm.device_info() shows no service_pid");
            pid
        }
    }
}

/// Pins held on segment `name` once an interrupted statement's work has stopped. In process
/// mode the work stopped before the statement returned: the pins are read at once. In service
/// mode the client returns at once and the service stops the abandoned work at its next
/// interrupt check (microseconds of CPU work later, a busy 2-core machine permitting): the
/// pins are given up to 5 s to go to zero, and how long they took is printed.
#[track_caller]
pub fn pins_after_interrupt(c: &mut Client, name: &str) -> i64 {
    if execution(c) == Execution::Process {
        return pins_held(c, name);
    }
    let t = Instant::now();
    let mut last = pins_held(c, name);
    wait_until(Duration::from_secs(5), || {
        last = pins_held(c, name);
        last == 0
    });
    eprintln!("service mode: the service's pins on {name} went to {last} in {} ms", t.elapsed().as_millis());
    last
}

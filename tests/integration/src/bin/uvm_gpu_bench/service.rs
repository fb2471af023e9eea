//! The measurements of the GPU service and of the per-process cost: CUDA contexts, the first
//! GPU call, round trips alone and under load, GPU memory per session.

use super::*;

/// Process mode: context creation time and device memory per process, in fresh backends. Service
/// mode: the service's own figures (its context was made once, at its start).
pub(crate) fn bench_contexts(b: &mut Bench, admin: &mut Client) {
    const K: &str = "ctx";
    const M: &str = "CUDA context creation (ms)";
    const K_MEM: &str = "ctx_mem";
    const M_MEM: &str = "device memory of a process with a CUDA context (MiB)";
    if !b.has_time(&[(K, M), (K_MEM, M_MEM)]) {
        return;
    }
    if b.mode == Mode::Service {
        let r = (|| -> R<(f64, f64, Option<u64>)> {
            let ctx = info_number(admin, "context_ms")?;
            let init = info_number(admin, "cuinit_ms")?;
            let apps = gpu_compute_apps()?;
            Ok((ctx, init, apps.iter().find(|(p, _)| *p == b.service_pid).and_then(|(_, m)| *m)))
        })();
        match r {
            Ok((ctx, init, mem)) => {
                b.row(
                    K,
                    M,
                    format!("{ctx:.0} ms once"),
                    format!("{ctx:.1} (the service's, once at its start; cuInit {init:.1}); backends create none"),
                    "140 (probe: bare context)".into(),
                    Some(ctx / 140.0),
                    Target::info(),
                );
                let value = match mem {
                    Some(m) => format!("{m} (nvidia-smi, the service's pid {})", b.service_pid),
                    None => format!("– (nvidia-smi does not list the service's pid {})", b.service_pid),
                };
                b.row(
                    K_MEM,
                    M_MEM,
                    mem.map(|m| format!("{m} MiB, one process")).unwrap_or_else(|| "–".into()),
                    value,
                    "527 (probe: bare context)".into(),
                    mem.map(|m| m as f64 / 527.0),
                    Target::info(),
                );
            }
            Err(e) => {
                b.error(K, M, e.clone());
                b.error(K_MEM, M_MEM, e);
            }
        }
        return;
    }
    let mut ms = Vec::new();
    let mut mem_note = None;
    for i in 0..FRESH_BACKENDS {
        let r = (|| -> R<()> {
            let used_before = try_gpu_memory_used_mib()?;
            let mut c = fresh()?;
            let pid = pid_of(&mut c)?;
            ms.push(info_number(&mut c, "context_ms")?);
            if i == 0 {
                std::thread::sleep(Duration::from_millis(300));
                let used_after = try_gpu_memory_used_mib()?;
                mem_note = Some((gpu_process_memory_mib(pid), used_after as i64 - used_before as i64));
            }
            Ok(())
        })();
        if let Err(e) = r {
            b.error(K, M, e.clone());
            b.error(K_MEM, M_MEM, e);
            return;
        }
    }
    let m = median(&ms);
    b.row(
        K,
        M,
        format!("{m:.0} ms per process"),
        format!("{m:.1} (fresh backend, median of {FRESH_BACKENDS}: {})", list(&ms, 1)),
        "140 (probe: bare context)".into(),
        Some(m / 140.0),
        Target::info(),
    );
    let (per_pid, delta) = mem_note.unwrap_or((None, 0));
    let value = match per_pid {
        Some(m) => format!("{m} (nvidia-smi, a fresh backend's pid); {delta} total delta"),
        None => format!("{delta} (delta of memory.used; the pid is not in nvidia-smi's list)"),
    };
    let base = per_pid.map(|m| m as f64).unwrap_or(delta as f64);
    b.row(
        K_MEM,
        M_MEM,
        format!("{base:.0} MiB per process"),
        value,
        "527 (probe: bare context)".into(),
        Some(base / 527.0),
        Target::info(),
    );
}

/// The first GPU call of a brand-new connection: `checksum_segment` of 1 MiB of a device segment,
/// timed by the client around the query (one simple-protocol round trip, the connection's first
/// query), median over fresh connections.
pub(crate) const K_FIRST: &str = "first_call";
pub(crate) const M_FIRST: &str =
    "first GPU call in a fresh connection: checksum_segment of 1 MiB of a device segment, client-side (ms)";
pub(crate) const K_MEM64: &str = "mem64";
pub(crate) const M_MEM64: &str = "GPU memory with 64 open sessions that each ran a GPU function (MiB)";

pub(crate) fn bench_first_call(b: &mut Bench, seg: &str, want: i64) {
    const K: &str = K_FIRST;
    const M: &str = M_FIRST;
    if !b.has_time(&[(K, M)]) {
        return;
    }
    let n = match b.mode {
        Mode::Service => FIRST_CALL_CONNS_SERVICE,
        Mode::Process => FIRST_CALL_CONNS_PROCESS,
    };
    let sql = format!("SELECT uvm.checksum_segment({}, 0, {FIRST_CALL_BYTES})", quote_literal(seg));
    let r = (|| -> R<(Vec<f64>, Vec<f64>, Vec<f64>)> {
        let (mut first, mut second, mut plain) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..n {
            let mut c = fresh()?;
            let t = Instant::now();
            let v = simple_value(&mut c, &sql)?;
            first.push(ms_since(t));
            if v != want.to_string() {
                return Err(format!("checksum of 1 MiB: {v}, expected {want}"));
            }
            let t = Instant::now();
            simple_value(&mut c, &sql)?;
            second.push(ms_since(t));
        }
        // What any first query of a fresh connection costs (catalog caches are cold).
        for _ in 0..3 {
            let mut c = fresh()?;
            let t = Instant::now();
            simple_value(&mut c, "SELECT 1")?;
            plain.push(ms_since(t));
        }
        Ok((first, second, plain))
    })();
    match r {
        Ok((first, second, plain)) => {
            let m = median(&first);
            b.row(
                K,
                M,
                format!("{m:.2} ms"),
                format!("{m:.2} (median of {n} fresh connections: {})", list(&first, 2)),
                format!("{FIRST_CALL_BUDGET_MS:.0} ms budget"),
                Some(m / FIRST_CALL_BUDGET_MS),
                Target::service(Goal::AtMost(1.0)).saying("≤ 2 ms"),
            );
            b.note(format!(
                "first GPU call: the same query again on the same connection {:.2} ms (median); a fresh connection's first `SELECT 1` {:.2} ms (median of 3: what any first query costs)",
                median(&second),
                median(&plain)
            ));
        }
        Err(e) => b.error(K, M, e),
    }
}

pub(crate) fn roundtrip(c: &mut Client, n: i32) -> R<(f64, f64)> {
    let r = c.query_one("SELECT median_us, p99_us FROM uvm.bench_roundtrip($1)", &[&n]).map_err(err("bench_roundtrip"))?;
    Ok((r.try_get(0).map_err(err("median_us"))?, r.try_get(1).map_err(err("p99_us"))?))
}

/// Round trips of an empty request (`uvm.bench_roundtrip`: each request timed in the backend),
/// in one session, then in 32 sessions at once.
pub(crate) fn bench_roundtrips(b: &mut Bench) {
    const K1M: &str = "rt1_median";
    const M1M: &str = "round trip of an empty request, 1 session: median (µs)";
    const K1P: &str = "rt1_p99";
    const M1P: &str = "round trip of an empty request, 1 session: p99 (µs)";
    const K32M: &str = "rt32_median";
    const M32M: &str = "round trip of an empty request, 32 concurrent sessions: median (µs)";
    const K32P: &str = "rt32_p99";
    const M32P: &str = "round trip of an empty request, 32 concurrent sessions: p99 (µs)";
    if !b.has_time(&[(K1M, M1M), (K1P, M1P), (K32M, M32M), (K32P, M32P)]) {
        return;
    }
    let t_med = Target::service(Goal::AtMost(1.0)).saying("≤ 30 µs");
    let t_p99 = Target::service(Goal::AtMost(1.0)).saying("≤ 200 µs");
    let one = (|| -> R<(f64, f64)> {
        let mut c = fresh()?;
        roundtrip(&mut c, 100)?; // warm-up (in process mode: this backend's CUDA context)
        roundtrip(&mut c, RT_REQUESTS_ONE)
    })();
    match one {
        Ok((m, p)) => {
            b.row(
                K1M,
                M1M,
                format!("{m:.1} µs"),
                format!("{m:.2} ({RT_REQUESTS_ONE} requests)"),
                format!("{RT_MEDIAN_US:.0} µs budget"),
                Some(m / RT_MEDIAN_US),
                t_med.clone(),
            );
            b.row(
                K1P,
                M1P,
                format!("{p:.1} µs"),
                format!("{p:.2} ({RT_REQUESTS_ONE} requests)"),
                format!("{RT_P99_US:.0} µs budget"),
                Some(p / RT_P99_US),
                t_p99.clone(),
            );
        }
        Err(e) => {
            b.error(K1M, M1M, e.clone());
            b.error(K1P, M1P, e);
        }
    }

    // 32 sessions, connected and warmed up first, start together at a barrier. Every thread
    // reaches the barrier, whatever happened before it.
    let barrier = Arc::new(Barrier::new(RT_SESSIONS));
    let handles: Vec<_> = (0..RT_SESSIONS)
        .map(|_| {
            let barrier = barrier.clone();
            std::thread::spawn(move || -> R<(f64, f64)> {
                let ready = fresh().and_then(|mut c| roundtrip(&mut c, 100).map(|_| c));
                barrier.wait();
                roundtrip(&mut ready?, RT_REQUESTS_EACH)
            })
        })
        .collect();
    let results: R<Vec<(f64, f64)>> =
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("a session's thread panicked".into()))).collect();
    match results {
        Ok(v) => {
            let meds: Vec<f64> = v.iter().map(|x| x.0).collect();
            let p99s: Vec<f64> = v.iter().map(|x| x.1).collect();
            // Each session reports its own median and p99. The median (p99) of all requests
            // together is at most the largest session's: that bound is the value judged.
            let (mm, pm) = (max_of(&meds), max_of(&p99s));
            b.row(
                K32M,
                M32M,
                format!("≤ {mm:.1} µs"),
                format!(
                    "≤ {mm:.2}: the largest of the sessions' medians (median of them {:.2}, smallest {:.2}; {RT_REQUESTS_EACH} requests each)",
                    median(&meds),
                    min_of(&meds)
                ),
                format!("{RT_MEDIAN_US:.0} µs budget"),
                Some(mm / RT_MEDIAN_US),
                t_med,
            );
            b.row(
                K32P,
                M32P,
                format!("≤ {pm:.1} µs"),
                format!("≤ {pm:.2}: the largest of the sessions' p99s (median of them {:.2})", median(&p99s)),
                format!("{RT_P99_US:.0} µs budget"),
                Some(pm / RT_P99_US),
                t_p99,
            );
        }
        Err(e) => {
            b.error(K32M, M32M, e.clone());
            b.error(K32P, M32P, e);
        }
    }
}

/// GPU memory with 64 sessions open, each having run a GPU function (a checksum of 1 MiB of a
/// device segment): nvidia-smi's memory.used before they connect and with all 64 still open,
/// which processes nvidia-smi lists, and which of the 64 backends map libcuda.
pub(crate) fn bench_sessions_memory(b: &mut Bench, admin: &mut Client, seg: &str, want: i64) {
    const K: &str = K_MEM64;
    const M: &str = M_MEM64;
    if !b.has_time(&[(K, M)]) {
        return;
    }
    struct Seen {
        base: u64,
        after: u64,
        took_ms: f64,
        listed: usize,
        listed_mib: u64,
        service_mib: Option<u64>,
        with_cuda: usize,
        released_s: Option<f64>,
    }
    let sql = format!("SELECT uvm.checksum_segment({}, 0, {FIRST_CALL_BYTES})", quote_literal(seg));
    let r = (|| -> R<Seen> {
        wait_quiet(admin, Duration::from_secs(30))?;
        let base = settled_gpu_memory_mib()?;
        let mut clients = Vec::with_capacity(MEM_SESSIONS);
        let mut pids = Vec::with_capacity(MEM_SESSIONS);
        for _ in 0..MEM_SESSIONS {
            let mut c = fresh()?;
            pids.push(pid_of(&mut c)?);
            clients.push(c);
        }
        // All 64 GPU calls at once; each thread hands its connection back, still open.
        let t = Instant::now();
        let handles: Vec<_> = clients
            .into_iter()
            .map(|mut c| {
                let sql = sql.clone();
                std::thread::spawn(move || {
                    let r = simple_value(&mut c, &sql);
                    (c, r)
                })
            })
            .collect();
        let mut clients = Vec::with_capacity(MEM_SESSIONS);
        let mut failure = None;
        for h in handles {
            match h.join() {
                Ok((c, r)) => {
                    clients.push(c);
                    match r {
                        Ok(v) if v == want.to_string() => {}
                        Ok(v) => failure = Some(format!("a session's checksum: {v}, expected {want}")),
                        Err(e) => failure = Some(e),
                    }
                }
                Err(_) => failure = Some("a session's thread panicked".into()),
            }
        }
        if let Some(e) = failure {
            return Err(e);
        }
        let took_ms = ms_since(t);
        let after = settled_gpu_memory_mib()?;
        let apps = gpu_compute_apps()?;
        let listed: Vec<&(i32, Option<u64>)> = apps.iter().filter(|(p, _)| pids.contains(p)).collect();
        let listed_mib = listed.iter().filter_map(|(_, m)| *m).sum();
        let service_mib = apps.iter().find(|(p, _)| *p == b.service_pid).and_then(|(_, m)| *m);
        let mut with_cuda = 0;
        for &pid in &pids {
            if cuda_libraries_mapped(pid)?.is_some_and(|l| maps_libcuda(&l)) {
                with_cuda += 1;
            }
        }
        drop(clients);
        let t = Instant::now();
        let released = wait_until(Duration::from_secs(30), || try_gpu_memory_used_mib().is_ok_and(|m| m <= base + 64));
        Ok(Seen {
            base,
            after,
            took_ms,
            listed: listed.len(),
            listed_mib,
            service_mib,
            with_cuda,
            released_s: released.then(|| t.elapsed().as_secs_f64()),
        })
    })();
    let s = match r {
        Ok(s) => s,
        Err(e) => {
            b.error(K, M, e);
            return;
        }
    };
    let delta = s.after as f64 - s.base as f64;
    let ok = delta <= MEM_ALLOWANCE_MIB && s.listed == 0 && s.with_cuda == 0;
    let service = match (b.mode, s.service_mib) {
        (Mode::Process, _) => String::new(),
        (Mode::Service, Some(m)) => format!("; the GPU service's process {m} MiB"),
        (Mode::Service, None) => "; the GPU service's process not listed".into(),
    };
    b.row_judged(
        K,
        M,
        format!("{} MiB in use, {delta:+.0} MiB", s.after),
        format!(
            "{} MiB in use with the 64 sessions open, {} before they connected ({delta:+.0} MiB, {:+.0} MiB per session); \
             nvidia-smi lists {} of the 64 backends ({} MiB){service}; libcuda mapped in {} of the 64 backends",
            s.after,
            s.base,
            delta / MEM_SESSIONS as f64,
            s.listed,
            s.listed_mib,
            s.with_cuda
        ),
        format!("{MEM_ALLOWANCE_MIB:.0} MiB allowance: only the service's context and the segments"),
        Some(delta.max(0.0) / MEM_ALLOWANCE_MIB),
        Target::service(Goal::AtMost(1.0)).saying("only the service's context + segments"),
        ok,
    );
    b.note(format!(
        "64 sessions: their 64 GPU calls (run at once) took {:.0} ms; GPU memory back to {} MiB (+64) {} after they closed",
        s.took_ms,
        s.base,
        match s.released_s {
            Some(t) => format!("{t:.1} s"),
            None => "not within 30 s".into(),
        }
    ));
}

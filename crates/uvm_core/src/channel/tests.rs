//! The channel's unit tests: slots, tickets, abandonment, the dead incarnation's requests, and
//! how long a client spins for its reply.

use super::*;
use std::sync::Arc;

struct Block {
    mem: Vec<u64>,
    ch: Channel,
}

fn block(n: u32, staging: u32) -> Block {
    let mut mem = vec![0u64; Channel::size_for(n, staging) / 8 + 1];
    // SAFETY: the vector is large enough and outlives the channel (kept in the Block).
    let ch = unsafe { Channel::init(mem.as_mut_ptr() as *mut u8, n, staging, Mode::Service) };
    Block { mem, ch }
}

#[test]
fn layout_is_page_aligned_and_inside_the_block() {
    let b = block(3, 5000);
    assert_eq!(b.ch.staging_bytes(), 8192);
    let (addr, len) = b.ch.staging_range();
    assert_eq!(addr % 4096, 0);
    let start = b.mem.as_ptr() as u64;
    assert!(addr + len as u64 <= start + (b.mem.len() * 8) as u64);
    assert_eq!(b.ch.staging_addr(2), addr + 2 * 8192);
}

#[test]
fn a_waiting_client_spins_while_its_request_is_queued_and_briefly_once_taken() {
    let b = block(2, 4096);
    let ch = b.ch;
    let i = ch.try_claim_free(7, 0x1000).unwrap();
    ch.submit(i);
    // Queued and never taken: spins for SPIN_QUEUED, then it is time to sleep.
    let t = Instant::now();
    assert!(!ch.spin_for_reply(i, t));
    assert!(t.elapsed() >= SPIN_QUEUED);
    // Taken: SPIN from the moment the client sees it taken, however long it was queued.
    assert!(ch.take(i, 1));
    let t = Instant::now();
    assert!(!ch.spin_for_reply(i, t - 10 * SPIN_QUEUED));
    assert!(t.elapsed() >= SPIN);
    // Done: at once.
    ch.complete(i);
    assert!(ch.spin_for_reply(i, Instant::now() - 10 * SPIN_QUEUED));
    ch.release(i);
    // Nothing submitted: the service's look for requests gives up after its time...
    let t = Instant::now();
    assert!(!ch.submission_within(Duration::from_micros(200)));
    assert!(t.elapsed() >= Duration::from_micros(200));
    // ... and finds one at once.
    let j = ch.try_claim_free(7, 0x1000).unwrap();
    ch.submit(j);
    assert!(ch.submission_within(Duration::ZERO));
}

#[test]
fn a_client_that_spins_sees_the_reply_of_a_service_serving_the_queue() {
    let b = Arc::new(block(4, 4096));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let service = {
        let (b, stop) = (b.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let taken: Vec<u32> = b.ch.submitted().filter(|&i| b.ch.take(i, 1)).collect();
                taken.into_iter().for_each(|i| {
                    b.ch.complete(i);
                });
                std::hint::spin_loop();
            }
        })
    };
    // Most replies come within the spin (a loaded machine may deschedule the "service"
    // thread past it now and then: then the client would sleep, which is also right).
    let caught = (0..200)
        .filter(|_| {
            let i = b.ch.try_claim_free(7, 0x1000).unwrap();
            b.ch.submit(i);
            let start = Instant::now();
            let caught = b.ch.spin_for_reply(i, start);
            while !b.ch.is_done(i) {
                std::thread::yield_now();
            }
            b.ch.release(i);
            caught
        })
        .count();
    stop.store(true, Ordering::Relaxed);
    service.join().unwrap();
    assert!(caught > 0, "no reply caught while spinning");
}

#[test]
fn a_request_goes_round_and_the_slot_comes_back() {
    let b = block(2, 4096);
    let ch = b.ch;
    let t = ch.ticket();
    let i = ch.try_claim(t, 7, 0x1000).unwrap();
    assert_eq!(ch.state(i), CLAIMED);
    ch.submit(i);
    assert_eq!(ch.submitted().collect::<Vec<_>>(), vec![i]);
    assert!(ch.take(i, 1));
    assert!(!ch.take(i, 1), "taken once");
    assert_eq!(ch.complete(i), 0x1000);
    assert!(ch.is_done(i));
    ch.release(i);
    assert_eq!(ch.state(i), FREE);
    assert_eq!(ch.counters(), (1, 1, 0));
}

#[test]
fn a_guard_of_a_claim_abandoned_at_exit_leaves_the_slots_next_claim_alone() {
    let b = block(1, 4096);
    let ch = b.ch;
    let mut mine = Holdings::new();
    // A request started and left in flight (a read-ahead), which the service answers.
    let i = ch.try_claim_free(7, 1).unwrap();
    let old = mine.hold(i);
    ch.submit(i);
    assert!(ch.take(i, 1));
    ch.complete(i);
    // The process is terminated: its exit callback abandons what it holds.
    for s in mine.take_all() {
        ch.abandon(s);
    }
    assert_eq!(ch.state(i), FREE);
    // A cleanup later in the exit (or another process) claims the same slot and waits.
    let j = ch.try_claim_free(7, 1).unwrap();
    assert_eq!(j, i);
    let new = mine.hold(j);
    ch.submit(j);
    assert!(ch.take(j, 1));
    // The old claim's guard goes with the transaction's memory: it holds nothing.
    assert!(!mine.holds(old) && !mine.let_go(old));
    assert_eq!(ch.state(j), RUNNING, "the new claim's request was left alone");
    ch.complete(j);
    assert!(ch.is_done(j), "the new claim's client gets its reply");
    assert!(mine.holds(new) && mine.let_go(new));
    ch.release(j);
    assert!(mine.take_all().is_empty());
}

#[test]
fn completed_requests_are_counted_per_gpu_and_operation() {
    let b = block(2, 4096);
    let ch = b.ch;
    let run = |op: u32, gpu: Option<usize>, error: bool, abandon: bool| {
        let i = ch.try_claim(ch.ticket(), 7, 1).unwrap();
        // SAFETY: claimed: ours until submitted.
        unsafe { ch.slot_mut(i).request.op = op };
        ch.submit(i);
        assert!(ch.take(i, 1));
        if let Some(g) = gpu {
            ch.set_gpu(i, g);
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
        // (The service always writes the reply before it completes.)
        // SAFETY: taken: the service's until completed.
        unsafe { ch.slot_mut(i).reply.status = if error { 3 } else { 0 } };
        if abandon {
            ch.abandon(i);
        }
        ch.complete(i);
        if !abandon {
            ch.release(i);
        }
    };
    run(2, Some(1), false, false);
    run(2, Some(1), true, false);
    run(5, None, false, true);
    run(99, None, false, false); // past OP_NUMBERS: not counted, nothing overflows
    let st = ch.op_stats();
    assert_eq!(st.len(), 2, "{st:?}");
    let (gpu, op, c) = st[0];
    assert_eq!((gpu, op, c.requests, c.errors, c.abandoned), (Some(1), 2, 2, 1, 0));
    assert!(c.run_ns >= 2_000_000, "two runs of 1 ms or more: {c:?}");
    let (gpu, op, c) = st[1];
    assert_eq!((gpu, op, c.requests, c.errors, c.abandoned), (None, 5, 1, 0, 1));
    ch.reset_stats();
    assert!(ch.op_stats().is_empty());
}

#[test]
fn an_abandoned_request_is_freed_only_by_the_service() {
    let b = block(1, 4096);
    let ch = b.ch;
    let i = ch.try_claim(ch.ticket(), 7, 1).unwrap();
    ch.submit(i);
    assert!(ch.take(i, 1));
    ch.abandon(i);
    assert_eq!(ch.state(i), ABANDONED);
    assert!(ch.abandoned(i));
    // a new client cannot have it while the service runs it
    assert_eq!(ch.try_claim(ch.ticket(), 8, 1), None);
    assert_eq!(ch.complete(i), 0, "nobody to wake");
    assert_eq!(ch.state(i), FREE);
    // abandoned before the service took it: free at once, and the service cannot take it
    let t = ch.ticket();
    // the ticket of the failed claim above was never given up: give it up now
    ch.abandon_ticket(t - 1);
    let i = ch.try_claim(t, 8, 1).unwrap();
    ch.submit(i);
    let waiter = ch.ticket();
    ch.wait_with(waiter, 99);
    assert_eq!(ch.abandon(i), 99, "freed: the waiter whose turn it is is woken");
    assert_eq!(ch.state(i), FREE);
    assert!(!ch.take(i, 1));
    assert_eq!(ch.counters().2, 2, "both abandons counted");
}

#[test]
fn a_dead_incarnations_requests_are_failed_by_the_next() {
    let b = block(1, 4096);
    let ch = b.ch;
    let i = ch.try_claim(ch.ticket(), 7, 42).unwrap();
    ch.submit(i);
    assert!(ch.take(i, 1));
    let mut failed = 0;
    assert!(ch.sweep(1, |_| false, |_| failed += 1).is_empty(), "its own incarnation's slot is left alone");
    assert_eq!(ch.sweep(2, |_| false, |_| failed += 1), vec![42]);
    assert_eq!(failed, 1);
    assert!(ch.is_done(i));
}

#[test]
fn tickets_are_served_in_order_and_given_up_tickets_are_skipped() {
    let b = block(1, 4096);
    let ch = b.ch;
    let t0 = ch.ticket();
    let i = ch.try_claim(t0, 1, 1).unwrap(); // the only slot
    let (t1, t2, t3) = (ch.ticket(), ch.ticket(), ch.ticket());
    ch.submit(i);
    ch.take(i, 1);
    ch.complete(i);
    ch.release(i);
    assert_eq!(ch.try_claim(t2, 3, 1), None, "not t2's turn");
    ch.abandon_ticket(t2); // t2 gives up before its turn
    ch.abandon_ticket(t1); // t1 gives up at its turn: the turn skips t1 and t2
    let i = ch.try_claim(t3, 4, 1).expect("t3's turn");
    assert_eq!(ch.slot(i).client_pid.load(Ordering::Relaxed), 4);
}

#[test]
fn claims_skip_the_queue_only_while_nobody_waits_and_freeing_names_whom_to_wake() {
    let b = block(1, 4096);
    let ch = b.ch;
    let i = ch.try_claim_free(1, 11).expect("nobody waits: any free slot");
    assert_eq!(ch.try_claim_free(2, 22), None, "no free slot");
    assert_eq!(ch.turn_latch(), 0, "nobody waits yet");
    let t = ch.ticket();
    ch.wait_with(t, 22);
    assert_eq!(ch.try_claim(t, 2, 22), None);
    ch.submit(i);
    ch.take(i, 1);
    assert_eq!(ch.complete(i), 11, "the client's latch");
    assert_eq!(ch.release(i), 22, "the slot is free: wake the waiter whose turn it is");
    assert_eq!(ch.try_claim_free(3, 33), None, "somebody waits: no queue-jumping");
    let j = ch.try_claim(t, 2, 22).expect("its turn");
    assert_eq!(ch.turn_latch(), 0, "the queue is empty again");
    // an abandoned request freed by the service wakes the next waiter too
    let t2 = ch.ticket();
    ch.wait_with(t2, 44);
    ch.submit(j);
    ch.take(j, 1);
    ch.abandon(j);
    assert_eq!(ch.complete(j), 44);
}

#[test]
fn a_late_completion_of_an_abandoned_slot_leaves_its_next_request_alone() {
    let b = block(1, 4096);
    let ch = b.ch;
    let i = ch.try_claim_free(1, 11).unwrap();
    ch.submit(i);
    assert!(ch.take(i, 1));
    ch.abandon(i); // the client gives up while an executor works on it
                   // The executor reports its job finished; the sweep, no longer counting the slot as
                   // running, still leaves it alone: only its completion frees it (see `sweep`).
    ch.sweep(1, |_| false, |_| {});
    assert_eq!(ch.state(i), ABANDONED, "the slot waits for its completion");
    assert_eq!(ch.try_claim_free(2, 22), None, "nobody claims it meanwhile");
    assert_eq!(ch.complete(i), 0, "nobody to wake");
    assert_eq!(ch.state(i), FREE);
    // A completion that finds its slot claimed and submitted anew leaves it alone.
    let j = ch.try_claim_free(2, 22).unwrap();
    assert_eq!(j, i);
    ch.submit(j);
    assert_eq!(ch.complete(i), 0);
    assert_eq!(ch.state(j), SUBMITTED, "the new request is still there for the service");
    // Taken by a dead incarnation and abandoned: the next incarnation's sweep frees it.
    assert!(ch.take(j, 1));
    ch.abandon(j);
    ch.sweep(2, |_| false, |_| {});
    assert_eq!(ch.state(j), FREE);
}

#[test]
fn many_threads_share_few_slots_without_loss() {
    let b = Arc::new(block(3, 4096));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // the "service": takes, doubles the request's first word into the reply's, completes
    let svc = {
        let (b, stop) = (b.clone(), stop.clone());
        std::thread::spawn(move || {
            let ch = b.ch;
            while !stop.load(Ordering::Acquire) {
                for i in 0..ch.nslots() {
                    if ch.take(i, 1) {
                        // SAFETY: taken: the service owns the slot until complete.
                        let s = unsafe { ch.slot_mut(i) };
                        let n = i64::from_ne_bytes(s.request.body[..8].try_into().unwrap());
                        s.reply.body[..8].copy_from_slice(&(n * 2).to_ne_bytes());
                        ch.complete(i);
                    }
                }
                ch.sweep(1, |_| false, |_| {});
                std::thread::yield_now();
            }
        })
    };
    let clients: Vec<_> = (0..8)
        .map(|c| {
            let b = b.clone();
            std::thread::spawn(move || {
                let ch = b.ch;
                for n in 0..300i64 {
                    let t = ch.ticket();
                    let i = loop {
                        if let Some(i) = ch.try_claim(t, c, 1) {
                            break i;
                        }
                        std::thread::yield_now();
                    };
                    // SAFETY: claimed: ours until submit.
                    unsafe { ch.slot_mut(i) }.request.body[..8].copy_from_slice(&(n * 100 + c as i64).to_ne_bytes());
                    ch.submit(i);
                    if n % 7 == 3 {
                        ch.abandon(i); // a cancel
                        continue;
                    }
                    while !ch.is_done(i) {
                        std::thread::yield_now();
                    }
                    let got = i64::from_ne_bytes(ch.slot(i).reply.body[..8].try_into().unwrap());
                    assert_eq!(got, (n * 100 + c as i64) * 2);
                    ch.release(i);
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    // let the service free what was abandoned
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while (0..b.ch.nslots()).any(|i| b.ch.state(i) != FREE) && std::time::Instant::now() < deadline {
        std::thread::yield_now();
    }
    stop.store(true, Ordering::Release);
    svc.join().unwrap();
    assert!((0..b.ch.nslots()).all(|i| b.ch.state(i) == FREE), "every slot came back");
    let (sub, done, abandoned) = b.ch.counters();
    assert_eq!(sub, 8 * 300);
    // every request not abandoned before the service took it was completed
    assert!(done <= sub && done + abandoned >= sub, "{sub} submitted, {done} completed, {abandoned} abandoned");
}

/// Round trips of empty requests between a client thread and a "service" thread on two cores,
/// through the channel's own calls (claim, the request written, submit, take, the reply
/// written, complete, the client spinning, the reply read, release): what the slot's layout
/// costs in cache-line transfers, without PostgreSQL. Not a test (nothing to assert on a timing):
/// `cargo test -p uvm_core --release channel_roundtrip_between_two_cores -- --ignored --nocapture`
/// prints the median and p99 in ns of `UVM_RT_REQUESTS` (default 200,000) round trips, the
/// service thread on CPU 1 and the client on CPU 0 where the machine has them.
#[test]
#[ignore]
fn channel_roundtrip_between_two_cores() {
    use crate::exec::request::{Done, Pong};
    fn pin_to(cpu: usize) {
        // SAFETY: a cpu_set_t on the stack, filled by the libc macros; affinity of this thread.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        }
    }
    let n: usize = std::env::var("UVM_RT_REQUESTS").ok().and_then(|v| v.parse().ok()).unwrap_or(200_000);
    let b = Arc::new(block(8, 4096));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let service = {
        let (b, stop) = (Arc::clone(&b), Arc::clone(&stop));
        std::thread::spawn(move || {
            pin_to(1);
            let ch = b.ch;
            let pong = Reply::ok(&Done::of(&Pong {}, 0));
            while !stop.load(Ordering::Relaxed) {
                for i in ch.submitted().collect::<Vec<u32>>() {
                    if ch.take(i, 1) {
                        // SAFETY: taken: ours until complete.
                        let req = unsafe { ch.slot_mut(i).request };
                        assert_eq!(req.op, crate::exec::request::Op::Ping as u32);
                        // SAFETY: as above.
                        unsafe { pong.write_to(&mut ch.slot_mut(i).reply) };
                        ch.complete(i);
                    }
                }
            }
        })
    };
    pin_to(0);
    let ch = b.ch;
    let ping = Request::of(&crate::exec::request::Ping {}, 0);
    let mut times = Vec::with_capacity(n);
    for k in 0..n + n / 10 {
        let t = Instant::now();
        let i = ch.try_claim_free(1, 0).expect("a free slot");
        // SAFETY: claimed: ours until submitted.
        unsafe { ping.write_to(&mut ch.slot_mut(i).request, 0) };
        ch.submit(i);
        while !ch.is_done(i) {
            std::hint::spin_loop();
        }
        // SAFETY: DONE: ours again.
        let r = Reply::read_from(unsafe { &ch.slot_mut(i).reply });
        assert_eq!(r.status, 0);
        ch.release(i);
        if k >= n / 10 {
            times.push(t.elapsed().as_nanos() as u64); // after a tenth as warm-up
        }
    }
    stop.store(true, Ordering::Relaxed);
    service.join().unwrap();
    times.sort_unstable();
    println!(
        "channel round trip, 2 threads: median {} ns, p99 {} ns ({} requests)",
        times[times.len() / 2],
        times[times.len() * 99 / 100],
        times.len()
    );
}

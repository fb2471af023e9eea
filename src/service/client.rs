//! The client side of the GPU service, in a backend or parallel worker: claim a slot, submit,
//! wait on the process's own latch serving interrupts, read the reply.
//!
//! Submitting costs no system call but the `SetLatch` of the service (a `kill(SIGURG)` when it
//! sleeps). Waiting spins on the slot's state, then sleeps on the latch with
//! `CHECK_FOR_INTERRUPTS()` between wake-ups, so a cancel or `statement_timeout` raises its
//! ERROR at once; the guards below abandon the slot (or the ticket) on the way out.
//!
//! How long to spin decides what a reply costs the service: see
//! [`Channel::spin_for_reply`].

use std::cell::RefCell;
use std::rc::{Rc, Weak};
use std::time::{Duration, Instant};

use pgrx::pg_sys;

use super::channel::{Channel, Claim, Holdings};
use crate::error::{Code, Result, UvmError};
use crate::exec::request::{self, Reply, Request};
use crate::exec::Mode;
use crate::exec::{Done, Executor, InFlight, Io, Started};

/// How long one latch wait lasts at most (then the service's state is looked at again).
const WAIT_MS: i64 = 100;

/// This process's latch, as the address the service sets.
fn my_latch() -> u64 {
    // SAFETY: MyLatch is set at process start; in a backend it points into its PGPROC, in
    // shared memory.
    unsafe { pg_sys::MyLatch as u64 }
}

fn my_pid() -> i32 {
    // SAFETY: set at process start.
    unsafe { pg_sys::MyProcPid }
}

/// Sets another process's latch (0: nobody to wake).
fn set_latch(latch: u64) {
    if latch != 0 {
        // SAFETY: a latch address published in the channel: a PGPROC's latch, in shared memory.
        unsafe { pg_sys::SetLatch(latch as *mut pg_sys::Latch) };
    }
}

/// Sleeps on this process's latch for up to `ms`, then serves interrupts.
fn sleep_on_latch(ms: i64) {
    // SAFETY: MyLatch is this process's latch; WaitLatch and ResetLatch are called from the
    // main thread; CHECK_FOR_INTERRUPTS may raise an ERROR, which unwinds through our guards.
    unsafe {
        pg_sys::WaitLatch(
            pg_sys::MyLatch,
            (pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH) as i32,
            ms as _,
            pg_sys::PG_WAIT_EXTENSION,
        );
        pg_sys::ResetLatch(pg_sys::MyLatch);
    }
    pg_sys::check_for_interrupts!();
}

thread_local! {
    /// The ticket this process waits with, if any: a FATAL error (`pg_terminate_backend`)
    /// raised while it waits ends the process without unwinding, so [`TicketGuard`] does not
    /// run; the exit callback gives the ticket up instead. Left unused, the ticket would be the
    /// turn forever and no process could claim a slot again.
    static WAITING: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
    /// Whether this process registered [`on_exit`].
    static EXIT_HOOKED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// The slots this process holds (claimed, and neither released nor abandoned yet), by
    /// claim: what the exit callback abandons. Recorded here, not found in the channel by pid:
    /// a slot keeps the pid of its last client after its release, so a scan by pid at exit
    /// would abandon slots that other processes have claimed since (their requests then never
    /// come back). By claim, not by index: see [`Holdings`].
    static HELD: RefCell<Holdings> = const { RefCell::new(Holdings::new()) };
}

/// Registers [`on_exit`] once per process, before its first request: a client may have no
/// segment manager (and so none of the SQL layer's exit callbacks) at all.
fn hook_exit() {
    if !EXIT_HOOKED.with(|h| h.replace(true)) {
        // SAFETY: registers a callback PostgreSQL runs at process exit; it is pg_guard'ed.
        unsafe { pg_sys::before_shmem_exit(Some(on_exit), pg_sys::Datum::from(0)) };
    }
}

/// At exit, normal or FATAL: gives up this process's ticket and slots ([`abandon_mine`]).
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn on_exit(_code: i32, _arg: pg_sys::Datum) {
    abandon_mine();
}

/// A ticket in the claim queue, given up unless a slot was claimed with it.
struct TicketGuard {
    ch: Channel,
    ticket: u64,
    used: bool,
}

impl TicketGuard {
    fn new(ch: Channel) -> TicketGuard {
        let ticket = ch.ticket();
        WAITING.with(|w| w.set(Some(ticket)));
        TicketGuard { ch, ticket, used: false }
    }
}

impl Drop for TicketGuard {
    fn drop(&mut self) {
        WAITING.with(|w| w.set(None));
        if !self.used {
            self.ch.abandon_ticket(self.ticket);
            if self.ch.any_free() {
                set_latch(self.ch.turn_latch());
            }
        }
    }
}

/// A slot this process claimed, abandoned unless released after its reply was read.
struct SlotGuard {
    ch: Channel,
    slot: u32,
    claim: Claim,
    released: bool,
}

impl SlotGuard {
    fn new(ch: Channel, slot: u32) -> SlotGuard {
        let claim = HELD.with(|h| h.borrow_mut().hold(slot));
        SlotGuard { ch, slot, claim, released: false }
    }

    /// Whether the slot is still this guard's: not abandoned by the exit callback (which may
    /// have run before the guard goes; the slot may be another claim's since).
    fn owned(&self) -> bool {
        HELD.with(|h| h.try_borrow().is_ok_and(|h| h.holds(self.claim)))
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        let owned = HELD.with(|h| h.try_borrow_mut().is_ok_and(|mut h| h.let_go(self.claim)));
        if owned && !self.released {
            set_latch(self.ch.abandon(self.slot));
        }
    }
}

/// The cluster's execution mode, waiting (serving interrupts) while the service decides it.
pub fn mode(ch: &Channel) -> Result<Mode> {
    let start = Instant::now();
    loop {
        match ch.mode() {
            Mode::Undecided => {}
            m => return Ok(m),
        }
        if let Some((code, msg)) = ch.error() {
            return Err(UvmError::new(request::code_of(code), msg));
        }
        if start.elapsed() > Duration::from_secs(60) {
            return Err(UvmError::new(Code::ObjectNotInPrerequisiteState, "the pg_uvm_share GPU service has not started")
                .hint("Check the server log for the service's start-up."));
        }
        sleep_on_latch(10);
    }
}

/// Sends requests to the service.
pub struct Client {
    pub ch: Channel,
    /// Give up waiting after this (for cleanups that run with interrupts held off, which no
    /// cancel could end); `None`: wait as long as the service lives.
    pub deadline: Option<Instant>,
}

impl Client {
    pub fn new(ch: Channel) -> Client {
        Client { ch, deadline: None }
    }
}

impl Client {
    fn claim(&self) -> Result<SlotGuard> {
        hook_exit();
        // While nobody queues, any free slot will do.
        if let Some(slot) = self.ch.try_claim_free(my_pid(), my_latch()) {
            return Ok(SlotGuard::new(self.ch, slot));
        }
        let mut t = TicketGuard::new(self.ch);
        let mut settled = false;
        loop {
            // Leave our latch for whoever frees a slot or moves the turn to us, then look.
            self.ch.wait_with(t.ticket, my_latch());
            if let Some(slot) = self.ch.try_claim(t.ticket, my_pid(), my_latch()) {
                t.used = true;
                // The turn moved on: if a slot is still free, its holder need not wait.
                if self.ch.any_free() {
                    set_latch(self.ch.turn_latch());
                }
                return Ok(SlotGuard::new(self.ch, slot));
            }
            if let Some((code, msg)) = self.ch.error() {
                return Err(UvmError::new(request::code_of(code), msg));
            }
            if !settled {
                // No slot now: free the ones this process holds before waiting for others'.
                self.settle_mine()?;
                settled = true;
                continue;
            }
            // Woken when a slot frees or the turn comes to us; the timeout is a safety net.
            sleep_on_latch(10);
        }
    }

    fn wait(&self, slot: u32) -> Result<()> {
        if self.ch.spin_for_reply(slot, Instant::now()) {
            return Ok(());
        }
        loop {
            if self.ch.is_done(slot) {
                return Ok(());
            }
            if self.ch.service_pid() == 0 {
                if let Some((code, msg)) = self.ch.error() {
                    return Err(UvmError::new(request::code_of(code), msg));
                }
            }
            if self.deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(UvmError::new(Code::SystemError, "the pg_uvm_share GPU service did not answer in time"));
            }
            sleep_on_latch(WAIT_MS);
        }
    }
}

impl Executor for Client {
    fn mode(&self) -> Mode {
        Mode::Service
    }

    fn max_io(&self) -> usize {
        self.ch.staging_bytes()
    }

    fn run(&mut self, req: &Request, mut io: Io<'_>) -> Result<Done> {
        let t = Instant::now();
        let input = match &io {
            Io::In(b) => *b,
            _ => &[],
        };
        let mut g = self.submit(req, input)?;
        self.wait(g.slot)?;
        let done = self.take_reply(&mut g, |staging, n| {
            if let Io::Out(buf) = &mut io {
                let n = n.min(buf.len());
                buf[..n].copy_from_slice(&staging[..n]);
            }
        });
        trace(req, t);
        done
    }

    fn start(&mut self, req: &Request, input: &[u8]) -> Result<Started> {
        let g = self.submit(req, input)?;
        let flight = Rc::new(RefCell::new(Flight::Slot(g)));
        FLIGHTS.with(|f| {
            let mut f = f.borrow_mut();
            f.retain(|w| w.strong_count() > 0);
            f.push(Rc::downgrade(&flight));
        });
        Ok(Started::InFlight(Box::new(Submitted { client: Client { ch: self.ch, deadline: self.deadline }, flight })))
    }
}

/// Where DEBUG2 messages are wanted (`client_min_messages` or `log_min_messages`), a request's
/// operation and round trip, submission to reply read (`bench/ssb/run` sums them per operation
/// for a query, to show where the time outside the kernels goes).
fn trace(req: &Request, t: Instant) {
    // SAFETY: a PostgreSQL function of the process's own thread (clients run on no other).
    if unsafe { pg_sys::message_level_is_interesting(pg_sys::DEBUG2 as i32) } {
        let us = t.elapsed().as_micros();
        let op = request::Op::from_repr(req.op).map_or_else(|| format!("op {}", req.op), |o| format!("{o:?}"));
        // The segments it names, and a read's or write's bytes: what a count of requests
        // does not say (which tables a query reads back, and how often).
        let what = match request::Call::decode(req) {
            Ok(call) if !call.segments().is_empty() => {
                let names: Vec<String> = call.segments().iter().map(|s| format!("\"{}\"", s.name())).collect();
                let bytes = match call {
                    request::Call::Read(r) => format!(", {} bytes at {}", r.length, r.offset),
                    request::Call::Write(w) => format!(", {} bytes at {}", req.input, w.offset),
                    _ => String::new(),
                };
                format!(" (segment {}{bytes})", names.join(", "))
            }
            _ => String::new(),
        };
        pgrx::debug2!("pg_uvm_share service request {op}: {us} us{what}");
    }
}

/// A started request: its slot, or (once settled) its result.
enum Flight {
    Slot(SlotGuard),
    Settled(Result<Done>),
}

thread_local! {
    /// This process's started requests, so that a process never waits for a free slot while it
    /// holds one whose reply it has not read (with every slot held so, no one would move).
    static FLIGHTS: RefCell<Vec<Weak<RefCell<Flight>>>> = const { RefCell::new(Vec::new()) };
}

impl Client {
    /// Claims a slot, writes the request and its input, and hands it to the service.
    fn submit(&self, req: &Request, input: &[u8]) -> Result<SlotGuard> {
        if input.len() > self.ch.staging_bytes() {
            return Err(UvmError::new(Code::ProgramLimitExceeded, "a request's input exceeds its staging area"));
        }
        let g = self.claim()?;
        let slot = g.slot;
        // SAFETY: claimed: this process owns the slot and its staging until it submits.
        unsafe {
            // (The reply is not reset: the service writes one before it marks the slot DONE.)
            req.write_to(&mut self.ch.slot_mut(slot).request, input.len() as u64);
            self.ch.staging(slot)[..input.len()].copy_from_slice(input);
        }
        self.ch.submit(slot);
        set_latch(self.ch.service_latch());
        Ok(g)
    }

    /// Reads a DONE slot's reply (and lets `output` copy the staging bytes it reports), then
    /// frees the slot.
    fn take_reply(&self, g: &mut SlotGuard, output: impl FnOnce(&[u8], usize)) -> Result<Done> {
        // SAFETY: DONE: the slot is ours again until we release it.
        let reply = Reply::read_from(unsafe { &self.ch.slot_mut(g.slot).reply });
        let r = reply.result();
        if let Ok(done) = &r {
            let n = (done.output as usize).min(self.ch.staging_bytes());
            // SAFETY: as above.
            output(unsafe { &self.ch.staging(g.slot)[..n] }, n);
        }
        set_latch(self.ch.release(g.slot));
        g.released = true;
        r
    }
}

/// A request submitted by [`Executor::start`]; abandoned if dropped unwaited.
struct Submitted {
    client: Client,
    flight: Rc<RefCell<Flight>>,
}

impl Client {
    /// Waits for a started request and reads its reply into process memory, freeing its slot.
    fn settle(&self, flight: &RefCell<Flight>) -> Result<()> {
        let slot = match &*flight.borrow() {
            Flight::Slot(g) => g.owned().then_some(g.slot),
            Flight::Settled(_) => return Ok(()),
        };
        let Some(slot) = slot else {
            // Abandoned by the exit callback: the slot may be another request's now.
            *flight.borrow_mut() =
                Flight::Settled(Err(UvmError::new(Code::QueryCanceled, "a started request was abandoned at exit")));
            return Ok(());
        };
        self.wait(slot)?;
        let mut f = flight.borrow_mut();
        if let Flight::Slot(g) = &mut *f {
            let r = self.take_reply(g, |_, _| {});
            *f = Flight::Settled(r);
        }
        Ok(())
    }

    /// Settles every request this process started (before it waits for a free slot).
    fn settle_mine(&self) -> Result<()> {
        let flights: Vec<Rc<RefCell<Flight>>> = FLIGHTS.with(|f| f.borrow().iter().filter_map(Weak::upgrade).collect());
        for f in flights {
            self.settle(&f)?;
        }
        Ok(())
    }
}

impl InFlight for Submitted {
    fn wait(self: Box<Self>) -> Result<Done> {
        self.client.settle(&self.flight)?;
        let gone = || Err(UvmError::new(Code::SystemError, "a started request was read twice"));
        match std::mem::replace(&mut *self.flight.borrow_mut(), Flight::Settled(gone())) {
            Flight::Settled(r) => r,
            Flight::Slot(_) => Err(UvmError::new(Code::SystemError, "a started request was not settled")),
        }
    }
}

/// Gives up this process's ticket and abandons the slots it holds (at exit: an ERROR path has
/// no guard left, but a FATAL raised inside a wait leaves the guards unrun).
pub fn abandon_mine() {
    if let Ok(ch) = super::shmem::channel() {
        if let Some(t) = WAITING.with(|w| w.take()) {
            ch.abandon_ticket(t);
        }
        let held = HELD.with(|h| h.try_borrow_mut().map(|mut v| v.take_all()).unwrap_or_default());
        for slot in held {
            set_latch(ch.abandon(slot));
        }
    }
}

//! The request channel between client processes and the GPU service, in shared memory.
//!
//! # Layout
//!
//! ```text
//! Header | Slot 0 | Slot 1 | ... | Slot n-1 | (padding to 4 KiB) | staging 0 | staging 1 | ...
//! ```
//!
//! Every slot has a staging area of `staging_bytes` (a multiple of 4 KiB) that carries the
//! request's bulk input (probe keys, bytes to write) and output (bytes read): the service reads
//! and writes it in place, so nothing bulk is copied through the channel itself. The service
//! registers the whole staging array with CUDA once (`cuMemHostRegister`), so its kernels and
//! copies read it at host-memory bandwidth.
//!
//! # A slot's life
//!
//! ```text
//!  FREE ─claim─▶ CLAIMED ─submit─▶ SUBMITTED ─take─▶ RUNNING ─complete─▶ DONE ─release─▶ FREE
//!                   │                  │                 │                  │
//!                   └─ abandon ─▶ FREE ┘                 │                  └─ abandon ─▶ FREE
//!                      (client: cancel, error, exit)     └─ abandon ─▶ ABANDONED ─▶ FREE (the
//!                                                           service, when it has finished with
//!                                                           the slot)
//! ```
//!
//! - The client owns a slot from `claim` until it submits, and again once it sees `DONE`.
//! - The service owns it from `take` until `complete`. A client that gives up (a cancel, a
//!   `statement_timeout`, an ERROR, its exit) frees a slot the service has not taken, and marks
//!   a taken one `ABANDONED` and leaves: the service goes
//!   on until the request's work is finished or stopped (it polls [`Channel::abandoned`]), and
//!   only then frees the slot. So a slot's staging memory is never reused while the service may
//!   still read or write it.
//! - Every transition is one compare-and-swap on the slot's state, so exactly one side makes
//!   each of them: a client cannot abandon a slot the service completes at the same moment
//!   without one of them seeing the other's state and acting on it.
//!
//! # Fairness when slots run out
//!
//! While nobody waits, a client claims any free slot at once ([`Channel::try_claim_free`]).
//! A client that finds none takes a ticket and waits for its turn: only the holder of the
//! ticket `now_serving` may claim, and claiming moves the turn on. A waiter that gives up (a
//! cancel) marks its ticket abandoned in a ring, and whoever moves the turn skips marked
//! tickets, so one cancelled waiter never stalls the others. Each waiter leaves its latch in a
//! second ring, and whoever frees a slot or moves the turn returns the latch of the turn's
//! holder to set ([`Channel::turn_latch`]), so the queue moves at the speed of the slots, not
//! of a polling interval. Waiting is the caller's (the SQL layer sleeps on its latch, serving
//! interrupts); this module only answers "may I claim now" and "whom to wake".
//!
//! This module does not call PostgreSQL: the SQL layer and the service worker put the channel
//! in shared memory and do the waking (latches).

use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::exec::request::{Mode, Reply, Request};
use crate::stats::{OpCounters, OpStats};

/// How long a client spins on its slot once the service has taken its request, before sleeping
/// on its latch ([`Channel::spin_for_reply`]).
pub const SPIN: Duration = Duration::from_micros(30);
/// How long, at most, it spins while its request still waits in the queue.
pub const SPIN_QUEUED: Duration = Duration::from_micros(500);
/// How long it spins without yielding the CPU once the service has taken its request (a short
/// request comes back within this).
pub const SPIN_HOT: Duration = Duration::from_micros(10);
/// How long it spins without yielding the CPU while its request waits to be taken (on an idle
/// service a request is taken within about a microsecond; past that, others are served first).
pub const SPIN_HOT_QUEUED: Duration = Duration::from_micros(2);

/// Slot states (see the module documentation).
pub const FREE: u32 = 0;
pub const CLAIMED: u32 = 1;
pub const SUBMITTED: u32 = 2;
pub const RUNNING: u32 = 3;
pub const DONE: u32 = 4;
pub const ABANDONED: u32 = 5;

const MAGIC: u64 = 0x5556_4d53_4552_5633; // "UVMSERV3" (the slot's layout of 2026-12)
/// Operation numbers the statistics keep apart (`exec::request::Op`: 1 to 31 today).
pub const OP_NUMBERS: usize = 32;
/// A request that ran on no GPU (the service's main thread).
const NO_GPU: u32 = u32::MAX;
/// Tickets a ring can mark abandoned at once (more cancelled waiters than this at the same
/// moment would be more than any cluster has processes).
const SKIP_RING: u64 = 4096;
/// Bytes of a start-up error message kept in the header.
const ERROR_BYTES: usize = 512;

#[repr(C)]
struct Header {
    magic: u64,
    nslots: u32,
    staging_bytes: u32,
    mode: AtomicU32,
    service_pid: AtomicI32,
    /// Address of the service's latch (in PostgreSQL shared memory, the same in every process).
    service_latch: AtomicU64,
    /// Incremented every time a service starts (a request taken by one incarnation and never
    /// completed is failed by the next).
    incarnation: AtomicU64,
    next_ticket: AtomicU64,
    now_serving: AtomicU64,
    skipped: [AtomicU64; (SKIP_RING / 64) as usize],
    /// The latch of the waiter holding ticket t, at t % SKIP_RING (set before it sleeps): who
    /// frees a slot or moves the turn wakes the new turn's holder at once.
    turn_latch: [AtomicU64; SKIP_RING as usize],
    /// Written by the service (its main thread and executors; a client that abandons a request
    /// adds to the second, rarely), on a cache line of their own (the block is page-aligned):
    /// the count of submissions is per slot ([`Slot::submissions`]), since one counter
    /// that every client adds to at every submission would make the service's every completion
    /// wait for that line (32 sessions of empty requests: the service's cost per request is the
    /// round trip's bound, 30 µs / 32).
    counters: CacheLine<[AtomicU64; 2]>,
    /// The service's cumulative counters per GPU and operation number (`crate::stats`); the
    /// last row is the main thread's (operations that run on no GPU).
    ops: [[OpCounters; OP_NUMBERS]; crate::vocab::MAX_DEVICES as usize + 1],
    /// Requests the service's executors ran, per GPU they were routed to (`crate::placement::
    /// route`); all on entry 0 without a device tier.
    routed: [AtomicU64; crate::vocab::MAX_DEVICES as usize],
    /// Why the service could not start (a UTF-8 message), `error_len` bytes; 0: no error.
    error_len: AtomicU32,
    error_code: AtomicU32,
    error: [u8; ERROR_BYTES],
}

/// A value alone on its cache line (and the next: Intel's adjacent-line prefetcher pairs them).
#[repr(C, align(128))]
struct CacheLine<T>(T);

/// The header's service-written counters: completed requests, abandoned ones.
const COMPLETED: usize = 0;
const ABANDONED_COUNT: usize = 1;

/// One request slot, laid out by who writes what. A cache line that one side writes and the
/// other reads must be fetched from the writer's core, a trip of its own, and the service's main
/// thread makes these trips for every request of every client in turn (32 sessions of empty
/// requests: the round trip's median is about 32 times the service's cost per request). So:
///
/// - the first line is the client's: its claim, its submission and the request's head (the
///   operation, the length of its fields and of its input) with the first 16 bytes of its
///   fields; the service reads it, and the client spins on `state` in it;
/// - the request's further fields follow, read only as far as `body_len` (an empty request
///   touches none of them);
/// - a line the service alone writes and reads (which incarnation took the request, when, on
///   which GPU), which therefore never travels;
/// - the reply's status, output and fields in one line, which the client reads once it sees
///   DONE; the error texts after it, written and read only for an error.
///
/// Before (2026-12), the service's fields shared the line the client spins on and the request
/// and the reply each straddled two lines: about seven line transfers per empty request on the
/// service's side, against four now.
#[repr(C, align(64))]
pub struct Slot {
    state: AtomicU32,
    client_pid: AtomicI32,
    /// The client's latch (set by whoever completes the request).
    client_latch: AtomicU64,
    /// When the client submitted it (`stats::monotonic_ns`), for the statistics.
    submitted_ns: AtomicU64,
    /// Requests submitted through this slot (summed for `counters`; per slot, see the header's).
    submissions: AtomicU64,
    pub request: Request,
    service: ServiceSide,
    pub reply: Reply,
}

/// A slot's fields that only the service touches.
#[repr(C, align(64))]
struct ServiceSide {
    /// Which service incarnation took the request now in the slot (set by `take`; 0: none ever).
    /// A slot is ABANDONED only after it was taken, so the sweep knows from this whether the
    /// incarnation that took it is gone.
    taken_by: AtomicU64,
    /// When the service took it (`stats::monotonic_ns`), and the GPU it was routed to
    /// (`NO_GPU`: run on the service's main thread), for the statistics.
    taken_ns: AtomicU64,
    gpu: AtomicU32,
}

// The layout above, checked: the request's head in the client's line, the service's line and
// the reply's head each a line of their own.
const _: () = {
    assert!(std::mem::offset_of!(Slot, request) + 16 <= 64);
    assert!(std::mem::offset_of!(Slot, service) % 64 == 0);
    assert!(std::mem::offset_of!(Slot, reply) % 64 == 0);
    assert!(std::mem::offset_of!(Reply, text) <= 72);
};

/// The channel over a block of shared memory. A view: copying it copies two pointers.
#[derive(Clone, Copy)]
pub struct Channel {
    base: *mut u8,
}

// SAFETY: every field the processes and threads share is an atomic, and the plain fields of a
// slot (request, reply, staging) are written only by its owner of the moment (see the state
// machine), the handover being a Release store or CAS matched by an Acquire load.
unsafe impl Send for Channel {}
// SAFETY: as for Send.
unsafe impl Sync for Channel {}

fn slots_offset() -> usize {
    std::mem::size_of::<Header>().next_multiple_of(64)
}

fn slot_bytes() -> usize {
    std::mem::size_of::<Slot>().next_multiple_of(64)
}

fn staging_offset(nslots: u32) -> usize {
    (slots_offset() + nslots as usize * slot_bytes()).next_multiple_of(4096)
}

impl Channel {
    /// Bytes of shared memory for `nslots` slots of `staging_bytes` each (rounded to 4 KiB),
    /// plus 4 KiB so that the block can be aligned to a page.
    pub fn size_for(nslots: u32, staging_bytes: u32) -> usize {
        staging_offset(nslots) + nslots as usize * (staging_bytes as usize).next_multiple_of(4096) + 4096
    }

    /// Formats a channel in `base` (at the next 4 KiB boundary).
    ///
    /// # Safety
    /// `base` must point to `size_for(nslots, staging_bytes)` writable bytes that live as long as
    /// every `Channel` made from them, and nobody else may use them during the call.
    pub unsafe fn init(base: *mut u8, nslots: u32, staging_bytes: u32, mode: Mode) -> Channel {
        let base = (base as usize).next_multiple_of(4096) as *mut u8;
        let staging_bytes = (staging_bytes as usize).next_multiple_of(4096) as u32;
        // SAFETY: the caller gives us the block; all-zero is a valid Header and Slot (atomics,
        // integers and byte arrays), and FREE is 0.
        unsafe {
            std::ptr::write_bytes(base, 0, staging_offset(nslots));
            let h = base as *mut Header;
            (*h).magic = MAGIC;
            (*h).nslots = nslots;
            (*h).staging_bytes = staging_bytes;
            (*h).mode.store(mode as u32, Ordering::Release);
        }
        Channel { base }
    }

    /// A channel that `init` formatted at (the 4 KiB boundary after) `base`.
    ///
    /// # Safety
    /// `base` must be the pointer given to `init`, and the block must outlive the `Channel`.
    pub unsafe fn from_raw(base: *mut u8) -> Channel {
        let base = (base as usize).next_multiple_of(4096) as *mut u8;
        // SAFETY: formatted by init (the caller's promise).
        debug_assert_eq!(unsafe { (*(base as *const Header)).magic }, MAGIC);
        Channel { base }
    }

    fn header(&self) -> &Header {
        // SAFETY: the block holds a formatted header for the life of `self` (init/from_raw).
        unsafe { &*(self.base as *const Header) }
    }

    pub fn nslots(&self) -> u32 {
        self.header().nslots
    }

    pub fn staging_bytes(&self) -> usize {
        self.header().staging_bytes as usize
    }

    /// The staging array (every slot's): its address and length, for the service to register.
    pub fn staging_range(&self) -> (u64, usize) {
        let n = self.nslots();
        (self.base as u64 + staging_offset(n) as u64, n as usize * self.staging_bytes())
    }

    /// Slot `i` (panics if out of range: indexes come from this module).
    pub fn slot(&self, i: u32) -> &Slot {
        assert!(i < self.nslots());
        // SAFETY: in range (checked); formatted by init; lives with the block.
        unsafe { &*(self.base.add(slots_offset() + i as usize * slot_bytes()) as *const Slot) }
    }

    /// Slot `i`'s plain fields, for its owner of the moment.
    ///
    /// # Safety
    /// The caller must own slot `i` in the sense of the state machine (a client between claim
    /// and submit or after DONE; the service between take and complete), and not hold another
    /// reference to it.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slot_mut(&self, i: u32) -> &mut Slot {
        assert!(i < self.nslots());
        // SAFETY: in range; exclusive by the caller's ownership of the slot.
        unsafe { &mut *(self.base.add(slots_offset() + i as usize * slot_bytes()) as *mut Slot) }
    }

    /// Address of slot `i`'s staging area (`staging_bytes` long, 4 KiB aligned).
    pub fn staging_addr(&self, i: u32) -> u64 {
        assert!(i < self.nslots());
        self.staging_range().0 + i as u64 * self.staging_bytes() as u64
    }

    /// Slot `i`'s staging area.
    ///
    /// # Safety
    /// As for [`Channel::slot_mut`]: only the slot's owner of the moment touches its staging.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn staging(&self, i: u32) -> &mut [u8] {
        // SAFETY: inside the block (staging_addr checks i); exclusive by the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.staging_addr(i) as *mut u8, self.staging_bytes()) }
    }

    pub fn mode(&self) -> Mode {
        Mode::from_u32(self.header().mode.load(Ordering::Acquire))
    }

    pub fn set_mode(&self, m: Mode) {
        self.header().mode.store(m as u32, Ordering::Release);
    }

    pub fn service_pid(&self) -> i32 {
        self.header().service_pid.load(Ordering::Acquire)
    }

    pub fn service_latch(&self) -> u64 {
        self.header().service_latch.load(Ordering::Acquire)
    }

    pub fn incarnation(&self) -> u64 {
        self.header().incarnation.load(Ordering::Acquire)
    }

    /// A service announces itself; returns its incarnation number.
    pub fn service_started(&self, pid: i32, latch: u64) -> u64 {
        let h = self.header();
        h.error_len.store(0, Ordering::Release);
        h.service_latch.store(latch, Ordering::Release);
        h.service_pid.store(pid, Ordering::Release);
        h.incarnation.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// The service leaves (its requests were failed first, see `fail_all`).
    pub fn service_stopped(&self) {
        let h = self.header();
        h.service_pid.store(0, Ordering::Release);
        h.service_latch.store(0, Ordering::Release);
    }

    /// Records why the service cannot run requests (clients report it).
    pub fn set_error(&self, code: u32, message: &str) {
        let h = self.header();
        let n = message.len().min(ERROR_BYTES);
        // SAFETY: only the service writes the message, before publishing its length (Release);
        // readers read at most `error_len` bytes after an Acquire load of it.
        unsafe {
            let dst = std::ptr::addr_of!(h.error) as *mut u8;
            std::ptr::copy_nonoverlapping(message.as_ptr(), dst, n);
        }
        h.error_code.store(code, Ordering::Release);
        h.error_len.store(n as u32, Ordering::Release);
    }

    /// The service's start-up error, if any: (error code, message).
    pub fn error(&self) -> Option<(u32, String)> {
        let h = self.header();
        let n = h.error_len.load(Ordering::Acquire) as usize;
        if n == 0 {
            return None;
        }
        Some((h.error_code.load(Ordering::Acquire), String::from_utf8_lossy(&h.error[..n.min(ERROR_BYTES)]).into_owned()))
    }

    /// Counters: (submitted, completed, abandoned).
    pub fn counters(&self) -> (u64, u64, u64) {
        let h = self.header();
        let submitted = (0..self.nslots()).map(|i| self.slot(i).submissions.load(Ordering::Relaxed)).sum();
        (submitted, h.counters.0[COMPLETED].load(Ordering::Relaxed), h.counters.0[ABANDONED_COUNT].load(Ordering::Relaxed))
    }

    /// Records that slot `i`'s request runs on GPU `gpu` (its statistics row).
    pub fn set_gpu(&self, i: u32, gpu: usize) {
        self.slot(i).service.gpu.store(gpu.min(NO_GPU as usize) as u32, Ordering::Relaxed);
    }

    /// Counts slot `i`'s request as completed (by the service, which wrote its reply).
    fn count_completed(&self, i: u32, now: u64) {
        let s = self.slot(i);
        let (submitted, taken) = (s.submitted_ns.load(Ordering::Relaxed), s.service.taken_ns.load(Ordering::Relaxed));
        // SAFETY: RUNNING or ABANDONED: the service owns the slot's plain fields until it
        // completes it, which is now.
        let (op, status) = unsafe { (self.slot_mut(i).request.op, self.slot_mut(i).reply.status) };
        let gpu = s.service.gpu.load(Ordering::Relaxed);
        let row = if gpu == NO_GPU { None } else { Some(gpu as usize) };
        let ops = &self.header().ops;
        let row = &ops[row.filter(|&g| g < ops.len() - 1).unwrap_or(ops.len() - 1)];
        if let Some(c) = row.get(op as usize) {
            let abandoned = s.state.load(Ordering::Acquire) == ABANDONED;
            c.completed(status != 0, abandoned, taken.saturating_sub(submitted), now.saturating_sub(taken));
        }
    }

    /// The service's counters: (GPU, or `None` for the main thread; operation number; counts)
    /// of every pair that has counted anything.
    pub fn op_stats(&self) -> Vec<(Option<u32>, u32, OpStats)> {
        let ops = &self.header().ops;
        let mut out = Vec::new();
        for (g, row) in ops.iter().enumerate() {
            for (op, c) in row.iter().enumerate() {
                let st = c.snapshot();
                if st.requests > 0 {
                    out.push(((g < ops.len() - 1).then_some(g as u32), op as u32, st));
                }
            }
        }
        out
    }

    /// Zeroes the service's counters (`uvm.stat_reset()`).
    pub fn reset_stats(&self) {
        self.header().ops.iter().flatten().for_each(OpCounters::reset);
    }

    /// Counts a request routed to GPU `gpu` (ignored past [`crate::vocab::MAX_DEVICES`]).
    pub fn count_routed(&self, gpu: usize) {
        if let Some(c) = self.header().routed.get(gpu) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Requests routed to GPU `gpu` since the cluster started (0 past [`crate::vocab::MAX_DEVICES`]).
    pub fn routed(&self, gpu: u32) -> u64 {
        self.header().routed.get(gpu as usize).map_or(0, |c| c.load(Ordering::Relaxed))
    }

    /// Slot `i`'s state word (the service watches it for ABANDONED while it works on `i`).
    pub fn state_flag(&self, i: u32) -> &AtomicU32 {
        &self.slot(i).state
    }

    pub fn state(&self, i: u32) -> u32 {
        self.slot(i).state.load(Ordering::Acquire)
    }

    // ---- clients ----------------------------------------------------------------------------

    /// Takes a ticket for the queue of claimers.
    pub fn ticket(&self) -> u64 {
        self.header().next_ticket.fetch_add(1, Ordering::AcqRel)
    }

    /// Claims any free slot when nobody waits for one (no ticket needed).
    pub fn try_claim_free(&self, pid: i32, latch: u64) -> Option<u32> {
        let h = self.header();
        if h.next_ticket.load(Ordering::SeqCst) != h.now_serving.load(Ordering::SeqCst) {
            return None; // others wait: take a ticket and queue behind them
        }
        self.claim_any(pid, latch)
    }

    /// Claims a free slot, looking first at the one this process claimed last (a session that
    /// sends request after request keeps its slot, and its cache lines), then on from there.
    /// A slot is read before it is compared-and-swapped: a CAS that fails still takes the slot's
    /// line from whoever works on it, the service among them.
    fn claim_any(&self, pid: i32, latch: u64) -> Option<u32> {
        let n = self.nslots();
        let first = LAST_CLAIMED.with(|c| c.get()) % n.max(1);
        for i in (first..n).chain(0..first) {
            let s = self.slot(i);
            if s.state.load(Ordering::Relaxed) == FREE
                && s.state.compare_exchange(FREE, CLAIMED, Ordering::AcqRel, Ordering::Relaxed).is_ok()
            {
                s.client_pid.store(pid, Ordering::Relaxed);
                s.client_latch.store(latch, Ordering::Relaxed);
                LAST_CLAIMED.with(|c| c.set(i));
                return Some(i);
            }
        }
        None
    }

    /// Records the latch of the holder of `ticket` (before it checks its turn and sleeps).
    pub fn wait_with(&self, ticket: u64, latch: u64) {
        self.header().turn_latch[(ticket % SKIP_RING) as usize].store(latch, Ordering::SeqCst);
    }

    /// The latch of the waiter whose turn it is, if anybody waits (0: nobody): to set after
    /// freeing a slot or moving the turn.
    pub fn turn_latch(&self) -> u64 {
        let h = self.header();
        let t = h.now_serving.load(Ordering::SeqCst);
        if h.next_ticket.load(Ordering::SeqCst) == t {
            return 0;
        }
        h.turn_latch[(t % SKIP_RING) as usize].load(Ordering::SeqCst)
    }

    /// Claims a free slot for the holder of `ticket` if it is its turn and a slot is free.
    pub fn try_claim(&self, ticket: u64, pid: i32, latch: u64) -> Option<u32> {
        let h = self.header();
        if h.now_serving.load(Ordering::SeqCst) != ticket {
            return None;
        }
        let i = self.claim_any(pid, latch)?;
        self.advance_turn(ticket);
        Some(i)
    }

    /// Whether any slot is free (waiters check it before sleeping again).
    pub fn any_free(&self) -> bool {
        (0..self.nslots()).any(|i| self.state(i) == FREE)
    }

    /// Gives up `ticket` (its holder stops waiting). If it is the turn now, the turn moves on;
    /// otherwise it is marked so that whoever moves the turn to it skips it.
    pub fn abandon_ticket(&self, ticket: u64) {
        let h = self.header();
        let (word, bit) = (((ticket % SKIP_RING) / 64) as usize, 1u64 << (ticket % 64));
        h.skipped[word].fetch_or(bit, Ordering::AcqRel);
        // If the turn reached us before the mark, nobody will skip us: do it ourselves. If it
        // reaches us after, the mover sees the mark. advance_turn clears marks as it skips.
        if h.now_serving.load(Ordering::Acquire) == ticket {
            self.advance_turn_from(ticket);
        }
    }

    /// Moves the turn past `ticket` (its holder claimed), and past abandoned tickets after it.
    fn advance_turn(&self, ticket: u64) {
        let h = self.header();
        if h.now_serving.compare_exchange(ticket, ticket + 1, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            self.skip_marked(ticket + 1);
        }
    }

    /// The turn is `ticket`, whose holder left (marked): move past it and further marks.
    fn advance_turn_from(&self, ticket: u64) {
        self.skip_marked(ticket);
    }

    /// While the turn is a marked ticket, clear the mark and move the turn on.
    fn skip_marked(&self, mut t: u64) {
        let h = self.header();
        let issued = h.next_ticket.load(Ordering::Acquire);
        while t < issued {
            let (word, bit) = (((t % SKIP_RING) / 64) as usize, 1u64 << (t % 64));
            if h.skipped[word].load(Ordering::Acquire) & bit == 0 {
                return;
            }
            if h.now_serving.compare_exchange(t, t + 1, Ordering::AcqRel, Ordering::Acquire).is_err() {
                return; // somebody else moved it
            }
            h.skipped[word].fetch_and(!bit, Ordering::AcqRel);
            t += 1;
        }
    }

    /// Publishes a claimed slot's request to the service.
    pub fn submit(&self, i: u32) {
        self.slot(i).submissions.fetch_add(1, Ordering::Relaxed);
        self.slot(i).submitted_ns.store(crate::stats::monotonic_ns(), Ordering::Relaxed);
        let r = self.slot(i).state.compare_exchange(CLAIMED, SUBMITTED, Ordering::AcqRel, Ordering::Relaxed);
        debug_assert!(r.is_ok(), "submit of a slot not claimed");
    }

    /// Whether slot `i`'s reply is ready (the client may then read it and `release`).
    pub fn is_done(&self, i: u32) -> bool {
        self.state(i) == DONE
    }

    /// Spins while slot `i`, submitted at `start`, will soon be done; true once it is DONE,
    /// false when it is time to sleep on the latch (the service's `SetLatch` will wake us).
    ///
    /// How long to spin is not a matter of taste: it decides what a reply costs the service. A
    /// client that spins sees its slot turn DONE by itself, and the service's `SetLatch` on its
    /// latch is a store; a client that sleeps must be woken with `kill(SIGURG)`, a system call
    /// of a few microseconds on the service's main thread, which serves every client in turn.
    /// With a fixed 30 µs spin, 32 sessions sending empty requests had two steady states on
    /// the H200: replies within the spin (a session's median 10-20 µs), or a queue longer than
    /// the spin, every client asleep and every reply a `kill` (about 3 µs each, 32 a turn:
    /// medians of 90-104 µs, the same for every session), and each run fell into one of them.
    /// So a client keeps spinning while its request waits in the queue (SUBMITTED: the service
    /// is serving the others first and comes to it within a turn), up to [`SPIN_QUEUED`], and
    /// for [`SPIN`] once the service has taken it (a longer request, a kernel or a copy, is worth
    /// a wake-up). It spins without yielding only where the reply is near: for [`SPIN_HOT`]
    /// once the service has taken the request, and for [`SPIN_HOT_QUEUED`] while it is still
    /// queued; otherwise it yields the CPU between looks, so that on a machine with more clients
    /// than cores the service's threads, not the spinners, get the cores. (Until 2026-12 it
    /// spun hot for the first 10 µs from submission, queued or not: once the service answered
    /// 32 sessions within about 10 µs, the queued clients spun hot beside it, and a service
    /// thread preempted by one for a scheduler slice made p99s of 0.6-1 ms on the H100.)
    pub fn spin_for_reply(&self, i: u32, start: Instant) -> bool {
        // When the service was first seen working on the request.
        let mut taken: Option<Instant> = None;
        loop {
            let s = self.state(i);
            if s == DONE {
                return true;
            }
            let now = Instant::now();
            let go_on = if s == SUBMITTED {
                now.duration_since(start) < SPIN_QUEUED
            } else {
                now.duration_since(*taken.get_or_insert(now)) < SPIN
            };
            if !go_on {
                return false;
            }
            let hot = match taken {
                Some(t) => now.duration_since(t) < SPIN_HOT,
                None => now.duration_since(start) < SPIN_HOT_QUEUED,
            };
            if hot {
                std::hint::spin_loop();
            } else {
                yield_cpu();
            }
        }
    }

    /// Frees a slot whose reply the client has read. Returns the latch of the waiter whose
    /// turn it is (0: nobody waits), to set.
    pub fn release(&self, i: u32) -> u64 {
        let r = self.slot(i).state.compare_exchange(DONE, FREE, Ordering::SeqCst, Ordering::Relaxed);
        debug_assert!(r.is_ok(), "release of a slot not done");
        self.turn_latch()
    }

    /// The client gives up on slot `i` (whatever its state): frees it if the service is not
    /// (or no longer) involved, else leaves it ABANDONED for the service to free. Returns the
    /// latch of the waiter whose turn it is when it freed the slot (0: none to wake).
    ///
    /// A request the service has not taken is freed at once: the compare-and-swap decides
    /// between this and the service's `take`, and the service reads nothing of a slot before
    /// its take succeeded. So a slot is ABANDONED only once taken, and its `taken_by` names the
    /// incarnation that took it (the sweep relies on that).
    pub fn abandon(&self, i: u32) -> u64 {
        let s = &self.slot(i).state;
        loop {
            let cur = s.load(Ordering::Acquire);
            let next = match cur {
                CLAIMED | DONE | SUBMITTED => FREE,
                RUNNING => ABANDONED,
                _ => return 0, // FREE or already ABANDONED
            };
            if s.compare_exchange(cur, next, Ordering::SeqCst, Ordering::Relaxed).is_ok() {
                if matches!(cur, SUBMITTED | RUNNING) {
                    // (Release: the service that sees the count sweeps, and finds the state.)
                    self.header().counters.0[ABANDONED_COUNT].fetch_add(1, Ordering::Release);
                }
                return if next == FREE { self.turn_latch() } else { 0 };
            }
        }
    }

    // ---- the service ------------------------------------------------------------------------

    /// Takes slot `i` if a request waits in it (SUBMITTED → RUNNING) for `incarnation`.
    pub fn take(&self, i: u32, incarnation: u64) -> bool {
        self.take_at(i, incarnation, crate::stats::monotonic_ns())
    }

    /// [`Channel::take`] at `now_ns` (`stats::monotonic_ns`), a clock read the caller already
    /// has: the service's main thread takes a request at the moment it completed the one before
    /// ([`Channel::complete_at`]), one read of the clock per request instead of two.
    pub fn take_at(&self, i: u32, incarnation: u64, now_ns: u64) -> bool {
        let s = self.slot(i);
        if s.state.compare_exchange(SUBMITTED, RUNNING, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            s.service.taken_by.store(incarnation, Ordering::Release);
            s.service.taken_ns.store(now_ns, Ordering::Relaxed);
            s.service.gpu.store(NO_GPU, Ordering::Relaxed);
            true
        } else {
            false
        }
    }

    /// Whether the client of a slot the service runs has given up on it (a long request polls
    /// this to stop early).
    pub fn abandoned(&self, i: u32) -> bool {
        self.state(i) == ABANDONED
    }

    /// The pid of the client that claimed slot `i` (0: none).
    pub fn client_pid(&self, i: u32) -> i32 {
        self.slot(i).client_pid.load(Ordering::Relaxed)
    }

    /// The service has finished slot `i` (its reply written): DONE, or FREE if the client left.
    /// Returns the latch to set: the client's, or (the slot freed) the waiting turn's (0: none).
    pub fn complete(&self, i: u32) -> u64 {
        self.complete_at(i, crate::stats::monotonic_ns())
    }

    /// [`Channel::complete`] at `now_ns` (`stats::monotonic_ns`, read by the caller).
    pub fn complete_at(&self, i: u32, now_ns: u64) -> u64 {
        let s = self.slot(i);
        self.header().counters.0[COMPLETED].fetch_add(1, Ordering::Relaxed);
        self.count_completed(i, now_ns);
        match s.state.compare_exchange(RUNNING, DONE, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => s.client_latch.load(Ordering::Acquire),
            // ABANDONED: nobody waits for the reply; the slot is free again.
            Err(ABANDONED) if s.state.compare_exchange(ABANDONED, FREE, Ordering::SeqCst, Ordering::Relaxed).is_ok() => {
                self.turn_latch()
            }
            // Not RUNNING nor ABANDONED: not ours any more (this cannot happen while only the
            // completion frees a slot this incarnation took, see `sweep`; were it freed early
            // and claimed anew, a RUNNING state would not even be ours): leave it alone.
            Err(_) => 0,
        }
    }

    /// Frees slots that an earlier incarnation of the service took and their clients abandoned,
    /// and fails the ones it took and never completed (it died) with `fail` and completes them,
    /// so that their clients stop waiting. (A request abandoned before any service took it is
    /// freed by its client, [`Channel::abandon`].) `running(i)` says
    /// whether this incarnation is still working on slot `i`. Returns the latches to set.
    ///
    /// A slot this incarnation took is never freed here, abandoned or not: whoever runs its
    /// work frees it by completing it ([`Channel::complete`]). The service's bookkeeping cannot
    /// tell exactly when that happens (an executor reports its job finished, so that its pins
    /// go, a moment before it completes the slot), and a slot freed here in that moment could be
    /// claimed and submitted anew before the late completion marked the new request done with
    /// the old reply, or freed it under its new client, which then waited forever.
    pub fn sweep(&self, incarnation: u64, running: impl Fn(u32) -> bool, mut fail: impl FnMut(&mut Reply)) -> Vec<u64> {
        let mut wake = Vec::new();
        for i in 0..self.nslots() {
            let s = self.slot(i);
            match s.state.load(Ordering::Acquire) {
                ABANDONED
                    if s.service.taken_by.load(Ordering::Acquire) != incarnation
                        && s.state.compare_exchange(ABANDONED, FREE, Ordering::SeqCst, Ordering::Relaxed).is_ok() =>
                {
                    let l = self.turn_latch();
                    if l != 0 {
                        wake.push(l);
                    }
                }
                RUNNING if s.service.taken_by.load(Ordering::Acquire) != incarnation && !running(i) => {
                    // SAFETY: RUNNING belongs to the service, and the incarnation that took it
                    // is gone: this incarnation owns it now.
                    fail(unsafe { &mut self.slot_mut(i).reply });
                    let l = self.complete(i);
                    if l != 0 {
                        wake.push(l);
                    }
                }
                _ => {}
            }
        }
        wake
    }

    /// Requests that clients have abandoned so far (a change tells the service to sweep).
    pub fn abandoned_count(&self) -> u64 {
        self.header().counters.0[ABANDONED_COUNT].load(Ordering::Acquire)
    }

    /// Indexes of slots waiting for the service.
    pub fn submitted(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.nslots()).filter(move |&i| self.state(i) == SUBMITTED)
    }

    /// Whether a request is submitted within `d`, looked for without sleeping (yielding the CPU
    /// between looks): the service's main thread asks after a turn that served requests, since
    /// a client that sends its next one within it then wakes nobody ([`Channel::spin_for_reply`]
    /// says what a wake-up costs a busy service).
    pub fn submission_within(&self, d: Duration) -> bool {
        let until = Instant::now() + d;
        loop {
            if self.submitted().next().is_some() {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            yield_cpu();
        }
    }
}

thread_local! {
    /// The slot this thread (a backend's main thread) claimed last.
    static LAST_CLAIMED: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Lets another thread of this CPU run (a spinning waiter's courtesy).
fn yield_cpu() {
    // SAFETY: a system call without arguments or memory effects.
    unsafe { libc::sched_yield() };
}

/// One claim of a slot by a client process: the slot and the claim's number in that process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Claim {
    pub slot: u32,
    number: u64,
}

/// The slots one client process holds (claimed, and neither released nor abandoned yet), each
/// by the claim that got it: what its exit abandons ([`Holdings::take_all`]).
///
/// A slot's index does not name a claim. Once an exit callback has abandoned the process's
/// slots, the same index is claimed again (by a cleanup of this process, or by another
/// process) while the guard of the old claim may still live: a FATAL exit runs the exit
/// callbacks before the transaction's memory, and the guards in it, go. A guard that then
/// abandoned by index would abandon the new claim, whose client waits for a reply that never
/// comes (the GpuJoin node's read-ahead left in flight by a terminated leader did this to a
/// worker's last drop). So a guard keeps its [`Claim`] and abandons only while it is held.
#[derive(Debug, Default)]
pub struct Holdings {
    held: Vec<Claim>,
    claims: u64,
}

impl Holdings {
    pub const fn new() -> Holdings {
        Holdings { held: Vec::new(), claims: 0 }
    }

    /// Records that this process claimed `slot`.
    pub fn hold(&mut self, slot: u32) -> Claim {
        self.claims += 1;
        let c = Claim { slot, number: self.claims };
        self.held.push(c);
        c
    }

    /// Whether `c` is still held (not let go, nor taken by [`Holdings::take_all`]).
    pub fn holds(&self, c: Claim) -> bool {
        self.held.contains(&c)
    }

    /// Forgets `c`; whether it was still held (only then may its holder release or abandon
    /// the slot).
    pub fn let_go(&mut self, c: Claim) -> bool {
        let before = self.held.len();
        self.held.retain(|h| *h != c);
        self.held.len() != before
    }

    /// Forgets every claim and returns their slots (to abandon at exit).
    pub fn take_all(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.held).into_iter().map(|c| c.slot).collect()
    }
}

#[cfg(test)]
mod tests;

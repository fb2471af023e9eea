//! The execution seam's vocabulary: the cluster's execution [`Mode`], and every operation as
//! a typed request with a typed reply, declared once in [`operations!`].
//!
//! # Design
//!
//! An operation is a struct of named fields (the segments it names, then its scalars) with a
//! reply struct of its own, both plain `repr(C)` data that `zerocopy`'s derive lays out as
//! bytes: the derive refuses padding and types with invalid bit patterns at compile time, so
//! any bytes decode to *some* value of the type, never to undefined behaviour. A [`Request`]
//! on the wire is the operation's number, its bulk input length and the struct's bytes; a
//! [`Reply`] is a status, the reply struct's bytes (or an error's texts) and the bulk output
//! length. Bulk data never travels in either: it lies in the slot's staging area (service
//! mode) or in the caller's buffer ([`super::Io`]), or in the segments themselves.
//!
//! Both live in a GPU service channel slot, in shared memory, so they mean the same in every
//! process: no pointers, fixed sizes, and total decoding: an unknown operation number is an
//! error, a reply's garbage an error or values, never a crash.
//!
//! Adding an operation touches one line group in [`operations!`] below (its number, how it
//! uses staging, which thread of the service runs it, its request and reply fields), the code
//! that runs it (`super::local`), and the typed helper its callers use (`super`). The numbers
//! are fixed and only ever appended to: they are what a slot carries.

use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

use crate::error::{Code, UvmError};

crate::wire_enum! {
    /// How the cluster executes GPU work (`pg_uvm_share.gpu_execution`, decided once).
    pub enum Mode: u32 {
        /// Not decided yet: the service has not started (clients wait for it).
        Undecided = 0,
        /// Every process runs its own work (and, with CUDA, its own context).
        Process = 1,
        /// Every segment operation runs in the service; clients submit requests.
        Service = 2,
    }
}

impl Mode {
    /// The mode numbered `v`; any other number is `Undecided`.
    pub fn from_u32(v: u32) -> Mode {
        Mode::from_repr(v).unwrap_or(Mode::Undecided)
    }
    pub fn name(self) -> &'static str {
        match self {
            Mode::Undecided => "undecided",
            Mode::Process => "process",
            Mode::Service => "service",
        }
    }
}

/// Longest segment name (NAMEDATALEN - 1).
pub const NAME_BYTES: usize = 64;
/// Bytes of error text (message, detail, hint) a reply carries.
pub const TEXT_BYTES: usize = 1024;
/// Bytes an operation's request fields may take in a [`Request`].
pub const BODY_BYTES: usize = 192;
/// Bytes an operation's reply fields may take in a [`Reply`].
pub const REPLY_BYTES: usize = 48;

/// A segment named by a request: the name and the id the client resolved it to (and
/// authorized). The executor refuses it if the name now denotes another segment; id 0 (a
/// segment about to be created) matches any.
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct SegRef {
    pub id: u64,
    pub name_len: u32,
    pub _pad: u32,
    pub name: [u8; NAME_BYTES],
}

impl Default for SegRef {
    fn default() -> Self {
        SegRef::new_zeroed()
    }
}

impl SegRef {
    pub fn new(name: &str, id: u64) -> Result<SegRef, UvmError> {
        crate::registry::validate_name(name)?;
        if name.len() >= NAME_BYTES {
            return Err(UvmError::new(Code::NameTooLong, format!("segment name \"{name}\" is too long")));
        }
        let mut r = SegRef { id, name_len: name.len() as u32, ..Default::default() };
        r.name[..name.len()].copy_from_slice(name.as_bytes());
        Ok(r)
    }

    /// The name (empty if the bytes are not a valid name: a later lookup then fails cleanly).
    pub fn name(&self) -> &str {
        let n = (self.name_len as usize).min(NAME_BYTES);
        std::str::from_utf8(&self.name[..n]).unwrap_or("")
    }
}

/// A signed 128-bit sum as two words (an `i128` field would align the reply to 16 bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct Sum128 {
    pub lo: u64,
    pub hi: i64,
}

impl From<i128> for Sum128 {
    fn from(v: i128) -> Sum128 {
        Sum128 { lo: v as u64, hi: (v >> 64) as i64 }
    }
}

impl Sum128 {
    pub fn get(self) -> i128 {
        ((self.hi as i128) << 64) | self.lo as i128
    }
}

/// How an operation uses its slot's staging area (or, in process mode, the caller's buffer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bulk {
    /// Neither.
    None,
    /// It reads its input there ([`Request::input`] bytes).
    In,
    /// It writes its output there ([`Reply::output`] bytes).
    Out,
}

/// Which thread of the GPU service runs an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Thread {
    /// The main thread: the operation changes the registry, or needs the segment manager
    /// throughout; or, for `Ping`, there is nothing to hand over (a trip to an executor would
    /// only add two thread wake-ups).
    Main,
    /// An executor thread, with the segments pinned by the main thread.
    Pool,
}

/// A typed request: its number and its reply's type. Implemented by [`operations!`] only.
pub trait Operation: Copy + FromBytes + IntoBytes + Immutable + KnownLayout {
    const OP: Op;
    type Reply: Copy + Default + FromBytes + IntoBytes + Immutable + KnownLayout;
}

/// Reads a `T` from the start of `b`; zeroes if `b` is short (never: every type is checked
/// against its field's size at compile time).
fn read<T: FromBytes + KnownLayout>(b: &[u8]) -> T {
    T::read_from_prefix(b).map(|(t, _)| t).unwrap_or_else(|_| T::new_zeroed())
}

/// Declares every operation: its number, its staging use and service thread, its request
/// fields (segments first, each a [`SegRef`], then scalars) and its reply fields. Generates the
/// [`Op`] numbers, one request and one reply struct per operation (`repr(C)`, laid out by
/// `zerocopy`: a struct with padding does not compile, hence the explicit `_pad` fields),
/// their [`Operation`] impls, and [`Call`], the decoded form executors match on.
macro_rules! operations {
    ($(
        $(#[$doc:meta])*
        $variant:ident = $num:literal, $bulk:ident, $thread:ident:
            $args:ident [$($seg:ident),*] { $($f:ident: $t:ty),* $(,)? }
            -> $reply:ident { $($rf:ident: $rt:ty),* $(,)? };
    )+) => {
        crate::wire_enum! {
            /// The operations of the execution seam, by the number a request carries.
            pub enum Op: u32 {
                $($(#[$doc])* $variant = $num),+
            }
        }

        impl Op {
            /// How the operation uses staging.
            pub fn bulk(self) -> Bulk {
                match self { $(Op::$variant => Bulk::$bulk),+ }
            }
            /// Which service thread runs it.
            pub fn thread(self) -> Thread {
                match self { $(Op::$variant => Thread::$thread),+ }
            }
        }

        $(
            #[doc = concat!("The request of [`Op::", stringify!($variant), "`].")]
            #[derive(Clone, Copy, Debug, PartialEq, FromBytes, IntoBytes, Immutable, KnownLayout)]
            #[repr(C)]
            pub struct $args {
                $(pub $seg: SegRef,)*
                $(pub $f: $t,)*
            }

            #[doc = concat!("The reply of [`Op::", stringify!($variant), "`].")]
            #[derive(Clone, Copy, Debug, Default, PartialEq, FromBytes, IntoBytes, Immutable, KnownLayout)]
            #[repr(C)]
            pub struct $reply {
                $(pub $rf: $rt,)*
            }

            impl Operation for $args {
                const OP: Op = Op::$variant;
                type Reply = $reply;
            }

            const _: () = assert!(std::mem::size_of::<$args>() <= BODY_BYTES);
            const _: () = assert!(std::mem::size_of::<$reply>() <= REPLY_BYTES);
        )+

        /// A decoded request: what executors match on.
        #[derive(Clone, Copy, Debug, PartialEq)]
        pub enum Call {
            $($variant($args)),+
        }

        impl Call {
            /// The request in `req`: an error for an unknown operation number; otherwise some
            /// value of its type, whatever the bytes.
            pub fn decode(req: &Request) -> Result<Call, UvmError> {
                let op = Op::from_repr(req.op).ok_or_else(|| {
                    UvmError::new(Code::ProtocolViolation, format!("unknown request operation {}", req.op))
                })?;
                Ok(match op { $(Op::$variant => Call::$variant(read(&req.body))),+ })
            }

            pub fn op(&self) -> Op {
                match self { $(Call::$variant(_) => Op::$variant),+ }
            }

            /// The segments it names, in declaration order.
            pub fn segments(&self) -> Vec<SegRef> {
                match self { $(Call::$variant(_a) => vec![$(_a.$seg),*]),+ }
            }
        }
    };
}

operations! {
    /// Nothing: the round trip alone.
    Ping = 1, None, Main: Ping [] {} -> Pong {};
    /// The provider's `uvm.device_info()` rows, as `key\tvalue` lines in staging.
    Info = 2, Out, Main: Info [] {} -> InfoText {};
    /// Creates a segment (`seg.id` 0); `max_size` counts only with `has_max_size`; `pref` is a
    /// `TierPref` code; `now` the creation time (PostgreSQL's timestamp).
    Create = 3, None, Main: Create [seg] {
        size: i64, max_size: i64, has_max_size: u32, pref: u32, owner: u32, _pad: u32, now: i64,
    } -> Created { id: u64 };
    /// Grows a segment to `new_size` bytes; replies its size.
    Grow = 4, None, Main: Grow [seg] { new_size: i64 } -> Grown { size: u64 };
    Drop = 5, None, Main: DropSegment [seg] {} -> Dropped {};
    /// Moves `[offset, offset + length)` to the tier `target` (a `TierPref` code), waiting up to
    /// `pin_wait_ms` for pins to drain; replies the bytes moved.
    Prefetch = 6, None, Main: Prefetch [seg] {
        offset: i64, length: i64, target: u32, _pad: u32, pin_wait_ms: u64,
    } -> Moved { bytes: u64 };
    /// Copies `[offset, offset + length)` of the segment into staging.
    Read = 7, Out, Pool: ReadBytes [seg] { offset: i64, length: i64 } -> ReadDone {};
    /// Copies the staging bytes to the segment at `offset`.
    Write = 8, In, Pool: WriteBytes [seg] { offset: i64 } -> Written {};
    Checksum = 9, None, Pool: Checksum [seg] { offset: i64, length: i64 } -> Summed { checksum: u64 };
    Fill = 10, None, Pool: Fill [seg] { offset: i64, length: i64, seed: i64 } -> Filled {};
    /// Probes the keys in staging against a GpuJoin table (`key_type`: 4 or 8 bytes).
    Probe = 11, In, Pool: Probe [inner] { key_type: u32, _pad: u32 } -> Probed { matches: u64, sum: Sum128 };
    /// Probes the keys in staging and appends matched pairs to a result buffer: (key, payload),
    /// or with `indexed` 1 (key's index in staging + `index_base`, payload).
    Materialize = 12, In, Main: Materialize [inner, result] { key_type: u32, indexed: u32, index_base: u64 }
        -> Materialized { matches: u64, sum: Sum128 };
    /// Zeroes a table's header and `slot_count` slots.
    BuildBegin = 13, None, Pool: BuildBegin [table] { slot_count: u64 } -> Begun {};
    /// Inserts (key, payload) pairs from staging into a table of `slot_count` slots.
    BuildInsert = 14, In, Pool: BuildInsert [table] { key_type: u32, _pad: u32, slot_count: u64 } -> Inserted {};
    /// Grows a segment to at least `min_size` bytes; replies its size.
    GrowAtLeast = 15, None, Main: GrowAtLeast [seg] { min_size: u64 } -> GrownTo { size: u64 };
    /// GB/s of a kernel reading all of the segment.
    BenchSegmentRead = 16, None, Pool: BenchSegmentRead [seg] { iterations: u32, _pad: u32 }
        -> SegmentReadRate { gbps: f64 };
    /// GB/s of a kernel reading a private allocation of `bytes`.
    BenchPrivateRead = 17, None, Pool: BenchPrivateRead [] { bytes: i64, iterations: u32, _pad: u32, seed: i64 }
        -> PrivateReadRate { gbps: f64 };
    /// GB/s of `cuMemcpy` each way.
    BenchCopyCeiling = 18, None, Pool: BenchCopyCeiling [] { bytes: i64, iterations: u32, _pad: u32 }
        -> CopyRates { host_to_device: f64, device_to_host: f64 };
    /// Keys per second of the probe kernel alone over `keys` generated keys.
    BenchJoinProbe = 19, None, Pool: BenchJoinProbe [table] { keys: i64, key_range: i64 }
        -> ProbeRate { keys_per_s: f64 };
    /// Milliseconds to register `bytes` of host memory with CUDA.
    BenchHostRegister = 20, None, Pool: BenchHostRegister [] { bytes: i64 } -> RegisterTime { ms: f64 };
    /// GPU memory in use now, for the benchmarks: (0, 0) without a GPU.
    MemInfo = 21, None, Pool: MemInfo [] {} -> GpuMemory { free: u64, total: u64 };
    /// Runs a caller's kernel, described in staging (`exec::kernel::Launch`).
    Launch = 22, In, Pool: LaunchKernel [] {} -> Launched {};
    /// `Materialize` within the result buffer's present size, on an executor thread rather than
    /// the main one (which a growth needs); with `fresh` 1 the buffer's header is reset first.
    /// `need` is 0, or the pairs the buffer must hold, in which case nothing it wrote counts
    /// (the caller resets the buffer and asks again); `next` and `written` are the header's
    /// counters after the work.
    MaterializeWithin = 23, In, Pool: MaterializeWithin [inner, result] {
        key_type: u32, indexed: u32, index_base: u64, fresh: u32, _pad: u32,
    } -> MaterializedWithin { matches: u64, sum: Sum128, need: u64, next: u64, written: u64 };
    /// Inserts the rows of the column cache `cache` into the GpuJoin table `table` of
    /// `slot_count` slots (zeroed by `BuildBegin`), its columns read in place: keys from column
    /// `key_col`, payloads from `payload_col` (`NO_COLUMN`: payloads 0). Rows with a NULL key are
    /// left out, NULL payloads stored as 0; the reply counts each (`exec::cached`).
    CacheBuild = 24, None, Pool: CacheBuild [table, cache] {
        key_type: u32, key_col: u32, payload_col: u32, _pad: u32, slot_count: u64,
    } -> CacheBuilt { inserted: u64, null_keys: u64, null_payloads: u64 };
    /// Probes the non-NULL keys of column `key_col` of the column cache `cache`, read in place,
    /// against the GpuJoin table `inner`: matches and payload sum, as `Probe`, the cache's rows
    /// read, and the nanoseconds the probing itself took (the kernels' launches, or the CPU's
    /// loop).
    CacheProbe = 25, None, Pool: CacheProbe [inner, cache] { key_type: u32, key_col: u32 }
        -> CacheProbed { matches: u64, sum: Sum128, rows: u64, probe_ns: u64 };
    /// Runs a scan program (`exec::scan`, in staging with its dimension tables) over the column
    /// cache `cache`, folding into the group table `groups` from row `start_row` of block
    /// `start_block`: `full` 0 once every row is folded, else 1 with the row to resume at and
    /// the slots the table needs (`GroupsGrow`); and the nanoseconds the scanning itself took
    /// (the kernels' launches, or the CPU's loop). `max_groups`: the most distinct keys the
    /// program can make, where the client knows (0: unknown), which lets the kernels fold in
    /// one pass (`scan::gpu`).
    ScanGroups = 26, In, Pool: ScanGroups [cache, groups] { start_block: u64, start_row: u64, max_groups: u64 }
        -> ScannedGroups { full: u32, _pad: u32, block: u64, row: u64, slots: u64, scan_ns: u64 };
    /// Moves the groups of the group table `from` into `to`, made a table of `slot_count` slots
    /// with the same keys and aggregates (`groups::grow`).
    GroupsGrow = 27, None, Pool: GroupsGrow [from, to] { slot_count: u64 } -> GroupsGrown { groups: u64 };
    /// Inserts into the GpuJoin table `table` of `slot_count` slots (`int8` keys, zeroed by
    /// `BuildBegin`) a pair per row of the column cache `cache` that passes the program's
    /// filters (in the bulk bytes, as `ScanGroups`; no joins) with a key in column `key_col`:
    /// the key, and the index of the slot of the row's group in the program's one segment
    /// (`dims[0]`), the group table of the same program run before (`scan::build`). Replies
    /// the pairs inserted and the nanoseconds the scanning took.
    ScanBuild = 28, In, Pool: ScanBuild [cache, table] { key_col: u32, _pad: u32, slot_count: u64 }
        -> ScanBuilt { inserted: u64, scan_ns: u64 };
    /// `Create`, then the staging bytes written at the segment's start as `Write` writes
    /// them: a temporary table made with its contents in one request (a failed write drops
    /// the segment again).
    CreateWith = 29, In, Main: CreateWith [seg] {
        size: i64, max_size: i64, has_max_size: u32, pref: u32, owner: u32, _pad: u32, now: i64,
    } -> CreatedWith { id: u64 };
    /// A whole `ScanBuild`: the table's header and `slot_count` slots zeroed first (as
    /// `BuildBegin`), then the build, which must insert `rows` pairs (else an ERROR, the table
    /// left without a header), then the header written (`exec::build_finish`'s): one request
    /// where three were.
    ScanBuildTable = 30, In, Pool: ScanBuildTable [cache, table] { key_col: u32, _pad: u32, slot_count: u64, rows: u64 }
        -> ScanBuiltTable { inserted: u64, scan_ns: u64 };
    /// Drops the segments whose `SegRef`s lie one after another in staging, in order, as
    /// `Drop` drops each; the first failure ends the request (its error the reply: those
    /// before it are dropped). A statement's temporary segments in one request at its end.
    DropSegments = 31, In, Main: DropSegments [] {} -> DroppedSegments { dropped: u64 };
}

/// A request as it lies in a slot: the operation's number, its input bytes in staging, and its
/// fields' bytes.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct Request {
    pub op: u32,
    /// Bytes of `body` the operation's fields take (the rest is not read).
    pub body_len: u32,
    /// Input bytes in staging.
    pub input: u64,
    pub body: [u8; BODY_BYTES],
}

impl Request {
    /// The request for `o`, with `input` bytes of bulk input.
    pub fn of<O: Operation>(o: &O, input: u64) -> Request {
        let mut r = Request::new_zeroed();
        r.op = O::OP as u32;
        r.input = input;
        let b = o.as_bytes();
        r.body[..b.len()].copy_from_slice(b);
        r.body_len = b.len() as u32;
        r
    }

    /// Writes the request into a slot's `dst` with `input` bytes of input: the header and the
    /// body's `body_len` bytes, not the rest. A slot lives in memory that the client and the
    /// service take turns writing, and every cache line one writes the other must fetch back
    /// from the writer's core: the empty request of the round-trip benchmark is 16 bytes, where
    /// the whole struct is four lines.
    pub fn write_to(&self, dst: &mut Request, input: u64) {
        let n = (self.body_len as usize).min(BODY_BYTES);
        dst.op = self.op;
        dst.body_len = n as u32;
        dst.input = input;
        dst.body[..n].copy_from_slice(&self.body[..n]);
    }
}

impl Default for Request {
    fn default() -> Self {
        Request::new_zeroed()
    }
}

/// A successful reply, not yet read as its operation's type: the reply fields' bytes and the
/// bulk output bytes written.
#[derive(Clone, Copy, Debug)]
pub struct Done {
    pub body: [u8; REPLY_BYTES],
    pub output: u64,
}

impl Done {
    /// The reply `r`, with `output` bytes of bulk output.
    pub fn of<R: IntoBytes + Immutable>(r: &R, output: u64) -> Done {
        let mut body = [0u8; REPLY_BYTES];
        let b = r.as_bytes();
        body[..b.len()].copy_from_slice(b);
        Done { body, output }
    }

    /// The reply fields as `R`.
    pub fn get<R: FromBytes + KnownLayout>(&self) -> R {
        read(&self.body)
    }
}

/// A reply as it lies in a slot: success with the reply's fields and output bytes, or an
/// error with its SQLSTATE and texts.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct Reply {
    /// 0: success; otherwise 1 + the error's `Code` number.
    pub status: u32,
    pub _pad: u32,
    /// Output bytes in staging.
    pub output: u64,
    pub body: [u8; REPLY_BYTES],
    pub message_len: u16,
    pub detail_len: u16,
    pub hint_len: u16,
    pub _pad2: u16,
    pub text: [u8; TEXT_BYTES],
}

impl Default for Reply {
    fn default() -> Self {
        Reply::new_zeroed()
    }
}

/// The number a reply carries for `c` (`Code`'s own, written once with it).
pub fn code_index(c: Code) -> u32 {
    c as u32
}

/// The code a reply's number names (58000 for a number no code has).
pub fn code_of(i: u32) -> Code {
    Code::from_repr(i).unwrap_or(Code::SystemError)
}

/// Cuts `s` to at most `max` bytes at a character boundary.
fn cut(s: &str, max: usize) -> &str {
    let mut n = s.len().min(max);
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    &s[..n]
}

impl Reply {
    /// A successful reply.
    pub fn ok(done: &Done) -> Reply {
        Reply { body: done.body, output: done.output, ..Default::default() }
    }

    /// Bytes of `text` the error's texts take.
    fn text_len(&self) -> usize {
        (self.message_len as usize + self.detail_len as usize + self.hint_len as usize).min(TEXT_BYTES)
    }

    /// Writes the reply into a slot's `dst`: its status, output and fields (64 bytes), and the
    /// texts only for an error, as far as they go. The whole struct is 18 cache lines that the
    /// service would take from the client's core, and the client back, at every request (see
    /// [`Request::write_to`]).
    pub fn write_to(&self, dst: &mut Reply) {
        dst.status = self.status;
        dst.output = self.output;
        dst.body = self.body;
        if self.status != 0 {
            let n = self.text_len();
            (dst.message_len, dst.detail_len, dst.hint_len) = (self.message_len, self.detail_len, self.hint_len);
            dst.text[..n].copy_from_slice(&self.text[..n]);
        }
    }

    /// A copy of the reply in a slot (written by [`Reply::write_to`]): its texts only for an
    /// error.
    pub fn read_from(src: &Reply) -> Reply {
        let mut r = Reply { status: src.status, output: src.output, body: src.body, ..Default::default() };
        if r.status != 0 {
            (r.message_len, r.detail_len, r.hint_len) = (src.message_len, src.detail_len, src.hint_len);
            let n = r.text_len();
            r.text[..n].copy_from_slice(&src.text[..n]);
        }
        r
    }

    /// The reply for an error (texts cut to fit).
    pub fn error(e: &UvmError) -> Reply {
        let mut r = Reply { status: 1 + code_index(e.code), ..Default::default() };
        let mut at = 0usize;
        let mut put = |s: &str, room: usize| -> u16 {
            let s = cut(s, room.min(TEXT_BYTES - at));
            r.text[at..at + s.len()].copy_from_slice(s.as_bytes());
            at += s.len();
            s.len() as u16
        };
        let m = put(&e.message, 512);
        let d = put(e.detail.as_deref().unwrap_or(""), 256);
        let h = put(e.hint.as_deref().unwrap_or(""), 256);
        r.message_len = m;
        r.detail_len = d;
        r.hint_len = h;
        r
    }

    /// The reply as a result: its fields and output, or the error it carries.
    pub fn result(&self) -> Result<Done, UvmError> {
        if self.status == 0 {
            return Ok(Done { body: self.body, output: self.output });
        }
        let (m, d, h) = (self.message_len as usize, self.detail_len as usize, self.hint_len as usize);
        let text = |from: usize, n: usize| {
            let end = (from + n).min(TEXT_BYTES);
            String::from_utf8_lossy(&self.text[from.min(end)..end]).into_owned()
        };
        let mut e = UvmError::new(code_of(self.status - 1), text(0, m));
        if d > 0 {
            e = e.detail(text(m, d));
        }
        if h > 0 {
            e = e.hint(text(m + d, h));
        }
        Err(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_survive_the_round_trip() {
        for &c in Code::ALL {
            let e = UvmError::new(c, "m").detail("d").hint("h");
            assert_eq!(Reply::error(&e).result().unwrap_err(), e);
        }
        let long = "é".repeat(2000);
        let e = Reply::error(&UvmError::new(Code::SystemError, long.clone()).hint(long)).result().unwrap_err();
        assert!(e.message.len() <= 512 && e.message.chars().all(|c| c == 'é'));
        let done = Reply::ok(&Done::of(&Probed { matches: 3, sum: Sum128::from(-5i128 << 70) }, 9)).result().unwrap();
        assert_eq!(done.output, 9);
        let p: Probed = done.get();
        assert_eq!((p.matches, p.sum.get()), (3, -5i128 << 70));
    }

    /// A slot is reused: what a request or a reply writes there covers only what it uses, and
    /// what an earlier one left beyond it is never read back.
    #[test]
    fn slots_reused_read_back_only_what_was_written() {
        let (mut req_slot, mut reply_slot) = (Request::new_zeroed(), Reply::new_zeroed());
        // An earlier request with a long body, and an error with long texts.
        let big = Request::of(&MaterializeWithin::new_zeroed(), 7);
        big.write_to(&mut req_slot, 7);
        let long = "x".repeat(900);
        Reply::error(&UvmError::new(Code::OutOfMemory, long.clone()).detail("d").hint("h")).write_to(&mut reply_slot);
        // Then a short request: it decodes as itself, whatever lies past its body.
        req_slot.body[..].fill(0xee);
        let p = Prefetch { offset: 3, length: 4, ..Prefetch::new_zeroed() };
        Request::of(&p, 0).write_to(&mut req_slot, 5);
        assert_eq!((req_slot.input, req_slot.body_len as usize), (5, p.as_bytes().len()));
        assert_eq!(Call::decode(&req_slot).unwrap(), Call::Prefetch(p));
        assert!(req_slot.body[p.as_bytes().len()..].iter().all(|&b| b == 0xee), "the tail is not written");
        // A success after the error: read back without the old texts.
        let done = Done::of(&Probed { matches: 1, sum: Sum128::from(2) }, 3);
        Reply::ok(&done).write_to(&mut reply_slot);
        let back = Reply::read_from(&reply_slot);
        assert_eq!((back.status, back.message_len, back.text[0]), (0, 0, 0));
        assert_eq!(back.result().unwrap().output, 3);
        // A shorter error after the long one: its own texts only.
        let e = UvmError::new(Code::QueryCanceled, "short").hint("hint");
        Reply::error(&e).write_to(&mut reply_slot);
        assert_eq!(Reply::read_from(&reply_slot).result().unwrap_err(), e);
    }

    #[test]
    fn every_operation_and_mode_round_trips_through_its_number() {
        for &op in Op::ALL {
            assert_eq!(Op::from_repr(op as u32), Some(op));
        }
        for &m in Mode::ALL {
            assert_eq!(Mode::from_u32(m as u32), m);
        }
        assert_eq!(Op::ALL.len(), 31);
        assert_eq!(Mode::from_u32(77), Mode::Undecided);
        // The numbers are what a slot carries: fixed forever.
        assert_eq!((Op::Ping as u32, Op::Materialize as u32, Op::Launch as u32, Op::CacheProbe as u32), (1, 12, 22, 25));
        assert_eq!((Op::ScanGroups as u32, Op::GroupsGrow as u32, Op::ScanBuild as u32), (26, 27, 28));
        assert_eq!((Op::CreateWith as u32, Op::ScanBuildTable as u32, Op::DropSegments as u32), (29, 30, 31));
    }

    #[test]
    fn typed_requests_round_trip_through_the_slot_form() {
        let seg = SegRef::new("s", 7).unwrap();
        let result = SegRef::new("r", 8).unwrap();
        let m = Materialize { inner: seg, result, key_type: 8, indexed: 1, index_base: 65_536 };
        let req = Request::of(&m, 4096);
        assert_eq!((req.op, req.input), (12, 4096));
        let call = Call::decode(&req).unwrap();
        assert_eq!(call, Call::Materialize(m));
        assert_eq!(call.op(), Op::Materialize);
        assert_eq!(call.segments(), vec![seg, result]);
        assert_eq!((call.op().bulk(), call.op().thread()), (Bulk::In, Thread::Main));
        let p = Prefetch { seg, offset: -1, length: i64::MAX, target: 2, _pad: 0, pin_wait_ms: 10_000 };
        assert_eq!(Call::decode(&Request::of(&p, 0)).unwrap(), Call::Prefetch(p));
        assert!(Call::decode(&Request::of(&Ping {}, 0)).unwrap().segments().is_empty());
        assert_eq!(Sum128::from(i128::MIN).get(), i128::MIN);
        assert_eq!(Sum128::from(i128::MAX).get(), i128::MAX);
    }

    #[test]
    fn garbage_decodes_to_an_error_or_values() {
        let r = Reply { status: 999, message_len: 60000, detail_len: 60000, hint_len: 60000, ..Default::default() };
        assert_eq!(r.result().unwrap_err().code, Code::SystemError);
        let mut req = Request { op: 0, ..Default::default() };
        assert_eq!(Call::decode(&req).unwrap_err().code, Code::ProtocolViolation);
        // Any bytes are some request of the operation's type.
        req.body = [0xff; BODY_BYTES];
        for &op in Op::ALL {
            req.op = op as u32;
            let call = Call::decode(&req).unwrap();
            assert_eq!(call.op(), op);
            for s in call.segments() {
                assert_eq!(s.name(), "", "a garbage name reads as no name");
            }
        }
        let s = SegRef { name_len: 9999, name: [0xff; NAME_BYTES], ..Default::default() };
        assert_eq!(s.name(), "");
        assert!(SegRef::new(&"x".repeat(64), 1).is_err());
    }
}

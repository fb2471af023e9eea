//! The execution seam's vocabulary, and what travels through a GPU service channel slot: the
//! cluster's execution [`Mode`], a fixed-size request (an operation, references into
//! segments, scalars) and a fixed-size reply (values, or an error with its SQLSTATE). Bulk
//! data never does: it lies in the slot's staging area, or in the segments themselves.
//!
//! Both are plain `repr(C)` data with no pointers, so a slot means the same in every process.
//! Decoding is total: a reply written by a service of another build (there is none: the
//! library is the same file in every process) or garbage would decode to an error, never to
//! undefined behaviour.

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

crate::wire_enum! {
    /// The operations of the service.
    pub enum Op: u32 {
        /// Nothing: the round trip alone.
        Ping = 1,
        /// The provider's `uvm.device_info()` rows, as text in staging.
        Info = 2,
        Create = 3,
        Grow = 4,
        Drop = 5,
        Prefetch = 6,
        /// Copies segment bytes into staging.
        Read = 7,
        /// Copies staging bytes into the segment.
        Write = 8,
        Checksum = 9,
        Fill = 10,
        /// Probes the keys in staging against a GpuJoin table.
        Probe = 11,
        /// Probes and appends matched pairs to a result buffer.
        Materialize = 12,
        /// Zeroes a table's header and slots.
        BuildBegin = 13,
        /// Inserts (key, payload) pairs from staging into a table's slots.
        BuildInsert = 14,
        GrowAtLeast = 15,
        BenchSegmentRead = 16,
        BenchPrivateRead = 17,
        BenchCopyCeiling = 18,
        BenchJoinProbe = 19,
        BenchHostRegister = 20,
        /// GPU memory in use now (free, total), for the benchmarks.
        MemInfo = 21,
        /// Runs a caller's kernel, described in staging (`exec::kernel::Launch`).
        Launch = 22,
    }
}

impl Op {
    /// Whether the service runs it on its main thread (it changes the registry, or needs the
    /// segment manager throughout; or, for `Ping`, there is nothing to hand over: a trip to an
    /// executor would only add two thread wake-ups) rather than on an executor thread.
    pub fn on_main_thread(self) -> bool {
        use Op::*;
        matches!(self, Ping | Info | Create | Grow | Drop | Prefetch | GrowAtLeast | Materialize)
    }
}

/// A segment named by a request: the name and the id the client resolved it to (and
/// authorized). The service refuses it if the name now denotes another segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct SegRef {
    pub id: u64,
    pub name_len: u32,
    pub _pad: u32,
    pub name: [u8; NAME_BYTES],
}

impl Default for SegRef {
    fn default() -> Self {
        SegRef { id: 0, name_len: 0, _pad: 0, name: [0; NAME_BYTES] }
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

/// A request: the operation, up to two segments, scalars, and how many staging bytes it uses.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
pub struct Request {
    pub op: u32,
    pub _pad: u32,
    pub segs: [SegRef; 2],
    pub args: [i64; 8],
    /// Input bytes in staging.
    pub input: u64,
}

impl Request {
    pub fn new(op: Op) -> Request {
        Request { op: op as u32, ..Default::default() }
    }
}

/// A reply: values, output bytes in staging, or an error.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct Reply {
    /// 0: success; otherwise 1 + the error's `Code` index.
    pub status: u32,
    pub _pad: u32,
    pub values: [i64; 6],
    /// Output bytes in staging.
    pub output: u64,
    pub message_len: u16,
    pub detail_len: u16,
    pub hint_len: u16,
    pub _pad2: u16,
    pub text: [u8; TEXT_BYTES],
}

impl Default for Reply {
    fn default() -> Self {
        Reply {
            status: 0,
            _pad: 0,
            values: [0; 6],
            output: 0,
            message_len: 0,
            detail_len: 0,
            hint_len: 0,
            _pad2: 0,
            text: [0; TEXT_BYTES],
        }
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
    /// A successful reply with these values and output bytes.
    pub fn ok(values: [i64; 6], output: u64) -> Reply {
        Reply { values, output, ..Default::default() }
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

    /// The reply as a result: its values, or the error it carries.
    pub fn result(&self) -> Result<([i64; 6], u64), UvmError> {
        if self.status == 0 {
            return Ok((self.values, self.output));
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
        assert_eq!(Reply::ok([1, 2, 3, 4, 5, 6], 9).result().unwrap(), ([1, 2, 3, 4, 5, 6], 9));
    }

    #[test]
    fn every_operation_and_mode_round_trips_through_its_number() {
        for &op in Op::ALL {
            assert_eq!(Op::from_repr(op as u32), Some(op));
        }
        for &m in Mode::ALL {
            assert_eq!(Mode::from_u32(m as u32), m);
        }
        assert_eq!(Op::ALL.len(), 22);
        assert_eq!(Mode::from_u32(77), Mode::Undecided);
    }

    #[test]
    fn garbage_decodes_to_an_error_or_values() {
        let r = Reply { status: 999, message_len: 60000, detail_len: 60000, hint_len: 60000, ..Default::default() };
        assert_eq!(r.result().unwrap_err().code, Code::SystemError);
        assert_eq!(Op::from_repr(0), None);
        let s = SegRef { name_len: 9999, name: [0xff; NAME_BYTES], ..Default::default() };
        assert_eq!(s.name(), "");
        assert!(SegRef::new(&"x".repeat(64), 1).is_err());
    }
}

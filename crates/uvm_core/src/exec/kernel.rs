//! A caller's kernel launch as a request carries it: the kernel's text, its entry, the launch
//! shape, the segments it addresses and its parameters, encoded into the request's bulk bytes
//! (the staging area in service mode), because a launch may name more segments than a request's
//! two references.
//!
//! The encoding is plain little-endian data with no pointers: a header of 16 words (`u32`), the
//! segment references (`SegRef`, as requests carry them), the parameters (24 bytes each: kind,
//! size, value, segment index), the entry's name and the text. Decoding is total: bytes that
//! are not a valid launch give a 08P01 or 22023 error, never a panic, because the staging area
//! is shared memory that a broken client could have written anything into.

use std::ffi::CString;

use super::SegRef;
use crate::error::{Code, Result, UvmError};
use crate::gpu::user::{Shape, Source, MAX_PARAMS};
use crate::uvm_err;

const MAGIC: u32 = 0x4b4d_5655; // "UVMK"
const HEADER_WORDS: usize = 16;
const ARG_BYTES: usize = 24;
const SEG_BYTES: usize = std::mem::size_of::<SegRef>();
/// Longest entry name.
pub const MAX_ENTRY: usize = 1024;

/// One kernel parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arg {
    /// A scalar of `size` bytes (1, 2, 4 or 8): the low bytes of `bits`.
    Scalar { bits: u64, size: u32 },
    /// The device address of byte `offset` of segment `segs[seg]`.
    Segment { seg: usize, offset: i64 },
}

/// A launch: what the kernel is, how wide it runs, and its parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    pub source: Source,
    pub shape: Shape,
    pub segs: Vec<SegRef>,
    pub args: Vec<Arg>,
}

fn invalid(what: impl Into<String>) -> UvmError {
    UvmError::new(Code::InvalidParameterValue, what)
}

impl Launch {
    /// Checks what a caller can get wrong (22023), before anything is encoded or run.
    pub fn validate(&self) -> Result<()> {
        self.shape.check()?;
        if self.args.len() > MAX_PARAMS {
            return Err(invalid(format!("a kernel takes at most {MAX_PARAMS} parameters, not {}", self.args.len())));
        }
        let entry = self.source.entry.as_bytes();
        if entry.is_empty() || entry.len() > MAX_ENTRY {
            return Err(invalid(format!("a kernel's entry name must have 1 to {MAX_ENTRY} bytes")));
        }
        if self.source.text.is_empty() {
            return Err(invalid("a kernel's source must not be empty"));
        }
        for (i, a) in self.args.iter().enumerate() {
            match *a {
                Arg::Scalar { size, .. } if ![1, 2, 4, 8].contains(&size) => {
                    return Err(invalid(format!("kernel parameter {i}: a scalar has 1, 2, 4 or 8 bytes, not {size}")))
                }
                Arg::Segment { seg, .. } if seg >= self.segs.len() => {
                    return Err(invalid(format!("kernel parameter {i} names no segment")))
                }
                Arg::Segment { offset, .. } if offset < 0 => {
                    return Err(invalid(format!("kernel parameter {i}: offset must not be negative: {offset}")))
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The bytes a request carries.
    pub fn encode(&self) -> Vec<u8> {
        let entry = self.source.entry.as_bytes();
        let mut out = Vec::with_capacity(
            HEADER_WORDS * 4 + self.segs.len() * SEG_BYTES + self.args.len() * ARG_BYTES + entry.len() + self.source.text.len(),
        );
        let s = &self.shape;
        let header: [u32; HEADER_WORDS] = [
            MAGIC,
            self.source.ptx as u32,
            entry.len() as u32,
            self.source.text.len() as u32,
            self.segs.len() as u32,
            self.args.len() as u32,
            s.grid[0],
            s.grid[1],
            s.grid[2],
            s.block[0],
            s.block[1],
            s.block[2],
            s.shared_mem,
            0,
            0,
            0,
        ];
        header.iter().for_each(|w| out.extend_from_slice(&w.to_le_bytes()));
        for seg in &self.segs {
            // SAFETY: SegRef is plain repr(C) data (integers and a byte array, explicit
            // padding), so all of its bytes are initialised.
            out.extend_from_slice(unsafe { std::slice::from_raw_parts(seg as *const SegRef as *const u8, SEG_BYTES) });
        }
        for a in &self.args {
            let (kind, size, value, seg) = match *a {
                Arg::Scalar { bits, size } => (1u32, size, bits, 0u64),
                Arg::Segment { seg, offset } => (2, 0, offset as u64, seg as u64),
            };
            out.extend_from_slice(&kind.to_le_bytes());
            out.extend_from_slice(&size.to_le_bytes());
            out.extend_from_slice(&value.to_le_bytes());
            out.extend_from_slice(&seg.to_le_bytes());
        }
        out.extend_from_slice(entry);
        out.extend_from_slice(&self.source.text);
        out
    }

    /// Reads the bytes of [`Launch::encode`] back, checking everything.
    pub fn decode(b: &[u8]) -> Result<Launch> {
        let mut at = 0usize;
        let mut take = |n: usize| -> Result<&[u8]> {
            let s = b.get(at..at.checked_add(n).ok_or_else(cut)?).ok_or_else(cut)?;
            at += n;
            Ok(s)
        };
        let mut h = [0u32; HEADER_WORDS];
        for (i, w) in take(HEADER_WORDS * 4)?.chunks_exact(4).enumerate() {
            h[i] = u32::from_le_bytes(w.try_into().expect("4 bytes"));
        }
        if h[0] != MAGIC || h[1] > 1 {
            return Err(uvm_err!(Code::ProtocolViolation, "a kernel launch request is not one"));
        }
        let (entry_len, text_len, nsegs, nargs) = (h[2] as usize, h[3] as usize, h[4] as usize, h[5] as usize);
        if nargs > MAX_PARAMS || nsegs > MAX_PARAMS || entry_len > MAX_ENTRY {
            return Err(uvm_err!(Code::ProtocolViolation, "a kernel launch request names too many parameters"));
        }
        let mut segs = Vec::with_capacity(nsegs);
        for _ in 0..nsegs {
            let raw = take(SEG_BYTES)?;
            // SAFETY: `raw` holds SEG_BYTES bytes; SegRef is plain data for which every bit
            // pattern is a value (its name is checked when it is used); read_unaligned copes
            // with any alignment.
            segs.push(unsafe { std::ptr::read_unaligned(raw.as_ptr() as *const SegRef) });
        }
        let mut args = Vec::with_capacity(nargs);
        for _ in 0..nargs {
            let a = take(ARG_BYTES)?;
            let kind = u32::from_le_bytes(a[0..4].try_into().expect("4"));
            let size = u32::from_le_bytes(a[4..8].try_into().expect("4"));
            let value = u64::from_le_bytes(a[8..16].try_into().expect("8"));
            let seg = u64::from_le_bytes(a[16..24].try_into().expect("8"));
            args.push(match kind {
                1 => Arg::Scalar { bits: value, size },
                2 => Arg::Segment { seg: seg.min(usize::MAX as u64) as usize, offset: value as i64 },
                _ => return Err(uvm_err!(Code::ProtocolViolation, "kernel parameter of unknown kind {kind}")),
            });
        }
        let entry = CString::new(take(entry_len)?.to_vec()).map_err(|_| invalid("a kernel's entry name contains a NUL byte"))?;
        let text = take(text_len)?.to_vec();
        let launch = Launch {
            source: Source { text, ptx: h[1] == 1, entry },
            shape: Shape { grid: [h[6], h[7], h[8]], block: [h[9], h[10], h[11]], shared_mem: h[12] },
            segs,
            args,
        };
        launch.validate()?;
        Ok(launch)
    }
}

fn cut() -> UvmError {
    uvm_err!(Code::ProtocolViolation, "a kernel launch request is cut short")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Launch {
        Launch {
            source: Source { text: b"extern \"C\" __global__ void k(int *p) {}".to_vec(), ptx: false, entry: c"k".into() },
            shape: Shape { grid: [4, 1, 1], block: [128, 2, 1], shared_mem: 64 },
            segs: vec![SegRef::new("a", 7).unwrap(), SegRef::new("bb", 9).unwrap()],
            args: vec![
                Arg::Segment { seg: 1, offset: 4096 },
                Arg::Scalar { bits: u64::MAX, size: 8 },
                Arg::Scalar { bits: 3, size: 4 },
            ],
        }
    }

    #[test]
    fn launches_round_trip() {
        let l = sample();
        l.validate().unwrap();
        assert_eq!(Launch::decode(&l.encode()).unwrap(), l);
    }

    #[test]
    fn every_cut_or_corruption_is_an_error_never_a_panic() {
        let bytes = sample().encode();
        for n in 0..bytes.len() {
            assert!(Launch::decode(&bytes[..n]).is_err(), "cut at {n}");
        }
        // Flip each byte of the header and the parameters: decoding returns, whatever it says.
        for i in 0..(HEADER_WORDS * 4 + 2 * SEG_BYTES + 3 * ARG_BYTES) {
            let mut b = bytes.clone();
            b[i] ^= 0xff;
            let _ = Launch::decode(&b);
        }
    }

    #[test]
    fn caller_mistakes_are_22023() {
        let mut l = sample();
        l.args.push(Arg::Segment { seg: 5, offset: 0 });
        assert_eq!(l.validate().unwrap_err().code, Code::InvalidParameterValue);
        let mut l = sample();
        l.args[1] = Arg::Scalar { bits: 0, size: 3 };
        assert_eq!(l.validate().unwrap_err().code, Code::InvalidParameterValue);
        let mut l = sample();
        l.shape.block = [0, 1, 1];
        assert_eq!(l.validate().unwrap_err().code, Code::InvalidParameterValue);
        let mut l = sample();
        l.args = vec![Arg::Scalar { bits: 0, size: 8 }; MAX_PARAMS + 1];
        assert_eq!(l.validate().unwrap_err().code, Code::InvalidParameterValue);
    }
}
